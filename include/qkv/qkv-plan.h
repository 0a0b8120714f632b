/* qkv-plan.h: compiled graphs.
 *
 * Compiling fixes the execution order, drops nodes that no requested output
 * needs, and lays every intermediate into one arena by liveness. Running a plan
 * allocates nothing. Parameter gradients (if qkv_graph_backward() was called)
 * are written into the QkvParams store on every run: they overwrite the
 * gradient buffers, like zero_grad() followed by backward() in PyTorch.
 *
 * Threads (docs/threads.md, "What may run concurrently"): a plan is used by
 * one thread at a time. qkv_plan_bind() and qkv_plan_run() called while
 * another thread binds or runs the same plan fail at once with
 * QKV_ERROR_BUSY and change nothing. A run of a plan that writes parameter
 * gradients also holds its store's gradient buffers: a run of another plan
 * writing gradients into the same store, from another thread, fails with
 * QKV_ERROR_BUSY while it lasts (plans that only read the store, for
 * evaluation or decoding, run alongside). Used one after the other, from
 * one thread or several, plans work as always. The other functions here
 * (outputs, setters, profiling, qkv_plan_free) take no such guard: call
 * them from the thread that binds and runs, or with no bind or run in
 * flight. Different plans may run in different threads at the same time.
 */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/**
 * QkvPlan:
 *
 * An opaque plan.
 */
typedef struct _QkvPlan QkvPlan;

/**
 * QkvPrecision:
 * @QKV_PRECISION_FP32: fp32
 * @QKV_PRECISION_BF16: bf16
 *
 * The arithmetic of a plan's matrix products, as PyTorch's autocast.
 *
 * FP32: float32 throughout (the default; the numbers of every earlier
 * release, bit for bit).
 * BF16: every product that goes through qkv_sgemm() (linear layers, the
 * FFN, the attention projections and the attention products, flash
 * attention's blocks included, and plugins' products) rounds its two
 * operands to bfloat16 (round to nearest even; float32 subnormals become
 * zero, as the CPU's bf16 instructions do) and sums the exact products in
 * float32. Everything else stays float32: softmax, layer norm, losses,
 * reductions, bias gradients, the optimizer, and the master weights and
 * optimizer state (only the operands' copies are bf16). On a CPU with
 * AVX512_BF16 or AMX (and qkv built with oneDNN) the products run on those
 * instructions; elsewhere, or with QKV_VEC_ISA=avx2|scalar or
 * QKV_GEMM=openblas, qkv rounds the operands itself and multiplies in
 * float32 (the same rounding, so results agree across machines to within
 * float32 summation error; one message says so on first use).
 * qkv_bf16_native() tells which. The first bf16 run grows per-thread
 * conversion buffers and builds the oneDNN kernels for its shapes; later
 * runs at those shapes allocate nothing of qkv's.
 */
typedef enum {
  QKV_PRECISION_FP32,
  QKV_PRECISION_BF16,
} QkvPrecision;

/**
 * QkvPlanOptions:
 *
 * A plan options.
 */
typedef struct {
  /* TRUE: dropout and other training-only behaviour is on. */
  gboolean training;
  /* Worker threads; 0 takes qkv_get_num_threads(). */
  gint n_threads;
  /* Seed of the counter-based generator behind dropout masks. */
  guint64 seed;
  /* TRUE: do not compute parameter gradients even if the graph has them. */
  gboolean skip_param_grads;
  /* TRUE: give every intermediate its own buffer and run nothing in place
   * (for debugging and for checking the planner). */
  gboolean no_memory_reuse;
  /* The precision of matrix products (QKV_PRECISION_FP32 by default). */
  QkvPrecision precision;
  /* TRUE (with precision QKV_PRECISION_BF16 only): activations that only
   * feed matrix products are stored as bfloat16 where their ops allow it
   * (QkvOpDef.bf16_outputs; built in: the FFN's hidden layer and multi-head
   * attention's projections q, k, v), which halves
   * their memory and gives the same numbers, since the products round them
   * to bf16 anyway (except that a float32 subnormal, flushed to zero, no
   * longer passes the FFN's ReLU in the backward). Such a plan refuses to
   * switch to fp32 (qkv_plan_try_set_precision()). This field sits where
   * earlier releases had padding: start from qkv_plan_options_default() or
   * a zero-initialised struct, as always. */
  gboolean bf16_activations;
  gpointer reserved[3];
} QkvPlanOptions;

/**
 * qkv_plan_options_default: (skip)
 *
 * The defaults: evaluation, global thread count, seed 0, fp32.
 *
 * Returns: the #QkvPlanOptions
 */
QKV_API
QkvPlanOptions qkv_plan_options_default(void);

/**
 * qkv_graph_compile:
 * @graph: a #QkvGraph
 * @outputs: (array length=n_outputs): the outputs, @n_outputs of them
 * @n_outputs: the number of @outputs
 * @options: (nullable): a #QkvPlanOptions
 * @error: return location for a #GError, or %NULL
 *
 * Compile graph for the outputs given (values of this graph). All memory a run
 * needs is allocated here (runs allocate nothing); if it cannot be had, or
 * the layout would exceed the address space (huge shapes, a plugin's huge
 * scratch_size), NULL with QKV_ERROR_MEMORY naming the largest request.
 *
 * Returns: (transfer full) (nullable): a new #QkvPlan, or %NULL with @error set
 */
QKV_API
QkvPlan *qkv_graph_compile(QkvGraph *graph, QkvValue *const *outputs, guint n_outputs,
                           const QkvPlanOptions *options, GError **error);
/**
 * qkv_plan_free:
 * @plan: a #QkvPlan
 *
 * See qkv_graph_compile().
 */
QKV_API
void qkv_plan_free(QkvPlan *plan);
/**
 * qkv_plan_ref:
 * @plan: a plan
 *
 * Take a reference on @plan; qkv_plan_free() drops one.
 *
 * Returns: (transfer full): @plan
 */
QKV_API
QkvPlan *qkv_plan_ref(QkvPlan *plan);

/**
 * qkv_plan_bind:
 * @plan: a #QkvPlan
 * @input_name: the input name
 * @tensor: a #QkvTensor
 * @error: return location for a #GError, or %NULL
 *
 * Bind a tensor to the graph input of that name. The plan takes a
 * reference (qkv_tensor_ref()) and drops it when another tensor is bound to
 * that input or the plan is freed, so the caller may free its own at once.
 * The plan reads the tensor's data where it is at every run: do not change
 * its shape (rebind instead), and a tensor over borrowed memory
 * (qkv_tensor_new_borrowed()) needs that memory alive until the last run.
 *
 * Variable shapes: the tensor must have the input's dtype and rank, and each
 * dim at most the one the graph was built with (a partial last batch, a
 * shorter sentence); a bigger dim is refused here. On the first run after a
 * bound shape changed, every node's shape rule is re-run on the bound shapes
 * and kernels see the smaller views in the same arena (nothing is allocated;
 * a run at unchanged shapes costs nothing extra). Outputs take the bound
 * shapes. That run fails with a GError naming the node when:
 *  - a shape rule rejects the bound shapes (inputs that disagree, or a reshape
 *    whose fixed target no longer fits: use -1 for a dim that varies);
 *  - a value or a node's scratch memory would be bigger than compiled;
 *  - the node's op has QKV_OP_STATIC_SHAPE (broadcast_to: the output shape
 *    is an attribute) and one of its inputs changed shape;
 *  - a parameter gradient would change shape.
 * Reductions (mean, cross_entropy's "mean") divide by the bound sizes.
 * Numbers a builder computed from shapes at build time and stored as
 * attributes (a scale by 1/T, an expand to a fixed size) stay as built.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_bind(QkvPlan *plan, const gchar *input_name, QkvTensor *tensor, GError **error);
/**
 * qkv_plan_run:
 * @plan: a #QkvPlan
 * @error: return location for a #GError, or %NULL
 *
 * Run once. Every input the plan needs must be bound. A kernel that finds
 * its inputs unusable (QKV_ERROR_INDEX: a cross_entropy target, an embedding
 * id, a gather or index_select index out of range) stops the run after its
 * node, which the GError names with the position and the value; the later
 * nodes do not run, so parameter gradients are incomplete, the step counter
 * stays, and the plan can run again.
 *
 * QKV_ERROR_BUSY (and nothing done) while another thread binds or runs this
 * plan, or runs a plan writing gradients into a store this one writes (see
 * the top of this file). A thread binding its own tensors then running can
 * still find another thread's tensors bound in between: share a plan between
 * threads only under a lock of your own, or give each thread its own plan.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_run(QkvPlan *plan, GError **error);
/**
 * qkv_plan_output:
 * @plan: a #QkvPlan
 * @index: the index
 *
 * Requested output i, valid until the next run (from any thread) or
 * qkv_plan_free(). NULL, without a message, for an index past the
 * requested outputs.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor
 */
QKV_API
const QkvTensor *qkv_plan_output(QkvPlan *plan, guint index);
/**
 * qkv_plan_state:
 * @plan: a #QkvPlan
 * @name: the name
 *
 * The plan's buffer of the state called name (qkv_graph_state()), borrowed:
 * valid until qkv_plan_free(); its contents change with each run. NULL when
 * the graph has no such state.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor
 */
QKV_API
const QkvTensor *qkv_plan_state(QkvPlan *plan, const gchar *name);
/**
 * qkv_plan_reset_state:
 * @plan: a #QkvPlan
 * @name: (nullable): the name
 * @error: return location for a #GError, or %NULL
 *
 * Zero the state called name, or every state when name is NULL; FALSE with
 * QKV_ERROR_NOT_FOUND for an unknown name, QKV_ERROR_BUSY while it runs.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_reset_state(QkvPlan *plan, const gchar *name, GError **error);
/**
 * qkv_plan_reorder_states:
 * @plan: a #QkvPlan
 * @parents: (array length=n_rows): the parents, @n_rows of them
 * @n_rows: the number of @parents
 * @error: return location for a #GError, or %NULL
 *
 * Beam search's reordering of the states' rows (axis 0, a batch row each):
 * row r of every state becomes what row parents[r] held, for r < n_rows;
 * rows from n_rows on stay. The first call allocates room for the largest
 * state; later ones allocate nothing. QKV_ERROR_INVALID_ARGUMENT for a
 * parent outside [0, n_rows) or a state with fewer rows (nothing moves
 * then), QKV_ERROR_BUSY while the plan runs.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_reorder_states(QkvPlan *plan, const gint32 *parents, gint n_rows, GError **error);
/**
 * qkv_plan_output_scalar:
 * @plan: a #QkvPlan
 * @index: the index
 *
 * Requested output i as a float (element 0); NaN, without a message, for
 * an index past the requested outputs or an empty output.
 *
 * Returns: the float
 */
QKV_API
float qkv_plan_output_scalar(QkvPlan *plan, guint index);

/**
 * qkv_graph_eval: (skip)
 * @graph: a #QkvGraph
 * @input_names: (array zero-terminated=1): the input names, %NULL-terminated
 * @inputs: (array length=n_inputs): the inputs, @n_inputs of them
 * @n_inputs: the number of @inputs
 * @outputs: (nullable): a #QkvValue
 * @results: (array length=n_outputs) (nullable): the results, @n_outputs of them
 * @n_outputs: the number of @results
 * @error: return location for a #GError, or %NULL
 *
 * One-shot evaluation, for looking at values: compile graph for outputs in
 * evaluation mode (no dropout, no parameter gradients), bind inputs[i] to
 * the input named input_names[i], run once, and give each results[i] a new
 * tensor (free with qkv_tensor_free()) holding a copy of outputs[i]; the plan
 * is freed before returning. Inputs the outputs do not need may be given or
 * left out; a name the graph lacks is QKV_ERROR_NOT_FOUND. On failure every
 * results[i] is NULL. A NULL among outputs (an earlier call failed) returns
 * FALSE and keeps the error already set, as typed ops do.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_graph_eval(QkvGraph *graph, const gchar *const *input_names, QkvTensor *const *inputs,
                        guint n_inputs, QkvValue *const *outputs, QkvTensor **results,
                        guint n_outputs, GError **error);

/**
 * qkv_plan_arena_size:
 * @plan: a #QkvPlan
 *
 * Bytes of the arena that holds all intermediates.
 *
 * Returns: the gsize
 */
QKV_API
gsize qkv_plan_arena_size(const QkvPlan *plan);
/**
 * qkv_plan_intermediates_size:
 * @plan: a #QkvPlan
 *
 * Sum of the bytes of every intermediate, as if none shared memory.
 *
 * Returns: the gsize
 */
QKV_API
gsize qkv_plan_intermediates_size(const QkvPlan *plan);
/**
 * qkv_plan_n_steps:
 * @plan: a #QkvPlan
 *
 * Number of nodes the plan runs.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_plan_n_steps(const QkvPlan *plan);

/**
 * qkv_plan_set_profiling:
 * @plan: a #QkvPlan
 * @enable: the enable
 *
 * Profiling: while enabled, each run adds the wall time of every node's
 * kernel to a per-node total (two clock reads per node). The report sums them
 * by op and lists ms per run and share, largest first; free it with g_free.
 */
QKV_API
void qkv_plan_set_profiling(QkvPlan *plan, gboolean enable);
/**
 * qkv_plan_profile_reset:
 * @plan: a #QkvPlan
 *
 * See qkv_plan_set_profiling().
 */
QKV_API
void qkv_plan_profile_reset(QkvPlan *plan);
/**
 * qkv_plan_profile_report:
 * @plan: a #QkvPlan
 *
 * See qkv_plan_set_profiling().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_plan_profile_report(const QkvPlan *plan);

/**
 * qkv_plan_set_n_threads:
 * @plan: a #QkvPlan
 * @n_threads: the n threads
 *
 * Threads for later runs; capped at the larger of the compile-time count and
 * the number of cores, which kernels' scratch memory was sized for.
 */
QKV_API
void qkv_plan_set_n_threads(QkvPlan *plan, gint n_threads);
/**
 * qkv_plan_get_n_threads:
 * @plan: a #QkvPlan
 *
 * See qkv_plan_set_n_threads().
 *
 * Returns: the gint
 */
QKV_API
gint qkv_plan_get_n_threads(const QkvPlan *plan);
/**
 * qkv_plan_set_precision:
 * @plan: a #QkvPlan
 * @precision: the precision
 *
 * The precision of later runs' matrix products (see QkvPrecision). A value
 * that is not a QkvPrecision, or fp32 for a plan compiled with
 * bf16_activations, leaves the precision unchanged and logs a critical: a
 * value a user gives goes to qkv_plan_try_set_precision().
 */
QKV_API
void qkv_plan_set_precision(QkvPlan *plan, QkvPrecision precision);
/**
 * qkv_plan_try_set_precision:
 * @plan: a #QkvPlan
 * @precision: the precision
 * @error: return location for a #GError, or %NULL
 *
 * qkv_plan_set_precision() that refuses a value that is not a QkvPrecision
 * (QKV_PRECISION_FP32 or QKV_PRECISION_BF16) with QKV_ERROR_INVALID_ARGUMENT
 * naming it, and fp32 for a plan compiled with bf16_activations (its stored
 * activations are rounded) with QKV_ERROR_INVALID_ARGUMENT too (the
 * precision unchanged).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_try_set_precision(QkvPlan *plan, QkvPrecision precision, GError **error);
/**
 * qkv_plan_get_precision:
 * @plan: a #QkvPlan
 *
 * See qkv_plan_set_precision().
 *
 * Returns: the #QkvPrecision
 */
QKV_API
QkvPrecision qkv_plan_get_precision(const QkvPlan *plan);
/**
 * qkv_plan_set_seed:
 * @plan: a #QkvPlan
 * @seed: the seed
 *
 * The dropout generator draws from (seed, step, node); step counts runs and
 * goes up by one after each run.
 */
QKV_API
void qkv_plan_set_seed(QkvPlan *plan, guint64 seed);
/**
 * qkv_plan_set_step:
 * @plan: a #QkvPlan
 * @step: the step
 *
 * See qkv_plan_set_seed().
 */
QKV_API
void qkv_plan_set_step(QkvPlan *plan, guint64 step);
/**
 * qkv_plan_get_step:
 * @plan: a #QkvPlan
 *
 * See qkv_plan_set_seed().
 *
 * Returns: the guint64
 */
QKV_API
guint64 qkv_plan_get_step(const QkvPlan *plan);

/**
 * qkv_set_num_threads:
 * @n_threads: the n threads
 *
 * Global default thread count for new plans (initially the OpenMP maximum).
 */
QKV_API
void qkv_set_num_threads(gint n_threads);
/**
 * qkv_get_num_threads:
 *
 * See qkv_set_num_threads().
 *
 * Returns: the gint
 */
QKV_API
gint qkv_get_num_threads(void);

/**
 * qkv_alloc_count:
 *
 * Allocations made by qkv's tensor and arena allocator since start; a test
 * can check that running a plan makes none.
 *
 * Returns: the guint64
 */
QKV_API
guint64 qkv_alloc_count(void);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvPlan, qkv_plan_free)

G_END_DECLS
