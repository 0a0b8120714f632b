/* qkv-plugin.h: the op ABI, shared by built-in ops and plugins.
 *
 * An op is a QkvOpDef: its name, inputs, outputs, attribute schema, a shape
 * rule run when a node is added, a forward kernel run by plans, and a gradient
 * rule that adds gradient nodes to the graph (or, failing that, a
 * decomposition into existing ops that autodiff differentiates through). The
 * struct is versioned and append-only: a definition compiled against an older
 * header (smaller struct_size, or an older minor version, same major) keeps
 * registering, with the newer fields zeroed.
 *
 * A plugin is a shared module that registers ops through the same QkvOpDef.
 * It describes itself with QKV_PLUGIN_DEFINE() (at the end of this header) and
 * is loaded by qkv_plugin_load() or found at initialisation in the
 * directories of QKV_PLUGIN_PATH and in the installed plugin directory.
 *
 * ABI history: 1.0 first version; 1.1 QkvOpDef.decompose; 1.2 qkv_kernel_fail()
 * (a kernel fails the run; QkvKernelCtx.reserved[0] became the executor's).
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include <gmodule.h>
#include "qkv-tensor.h"
#include "qkv-error.h"
#include "qkv-graph.h"

G_BEGIN_DECLS

/**
 * QKV_OP_ABI_MAJOR:
 *
 * Op abi major.
 */
#define QKV_OP_ABI_MAJOR 1
/**
 * QKV_OP_ABI_MINOR:
 *
 * Op abi minor.
 */
#define QKV_OP_ABI_MINOR 2

/**
 * QKV_MAX_OUTPUTS:
 *
 * The most outputs one node may have.
 */
#define QKV_MAX_OUTPUTS 16

/**
 * QkvAttrType:
 * @QKV_ATTR_INT: GVariant "i" or "x"
 * @QKV_ATTR_FLOAT: GVariant "d" (an "i" or "x" is accepted and converted)
 * @QKV_ATTR_BOOL: GVariant "b"
 * @QKV_ATTR_INTS: GVariant "ai" or "ax"
 * @QKV_ATTR_STRING: GVariant "s"
 *
 * The attr type values.
 */
typedef enum {
  QKV_ATTR_INT,    /* GVariant "i" or "x" */
  QKV_ATTR_FLOAT,  /* GVariant "d" (an "i" or "x" is accepted and converted) */
  QKV_ATTR_BOOL,   /* GVariant "b" */
  QKV_ATTR_INTS,   /* GVariant "ai" or "ax" */
  QKV_ATTR_STRING, /* GVariant "s" */
} QkvAttrType;

/**
 * QkvAttrSpec:
 *
 * One attribute of an op's schema. Attributes not given take the default.
 */
typedef struct {
  const gchar *name;
  QkvAttrType type;
  gboolean required;
  gint64 default_int;          /* INT and BOOL */
  double default_float;        /* FLOAT */
  const gchar *default_string; /* STRING */
  const gchar *doc;
} QkvAttrSpec;

/**
 * QkvAttrs:
 *
 * A node's attributes, validated against the schema when the node was added.
 * Lookups are by name and allocate nothing.
 */
typedef struct _QkvAttrs QkvAttrs;

/**
 * qkv_attrs_get_int: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * Attrs get int.
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_attrs_get_int(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_float: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_int().
 *
 * Returns: the double
 */
QKV_API
double qkv_attrs_get_float(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_bool: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_int().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_attrs_get_bool(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_ints: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 * @n: (out) (optional): where to store the n, or %NULL
 *
 * The array and its length; the array is owned by attrs.
 *
 * Returns: (transfer none): the result
 */
QKV_API
const gint64 *qkv_attrs_get_ints(const QkvAttrs *attrs, const gchar *name, guint *n);
/**
 * qkv_attrs_get_string: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_ints().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_attrs_get_string(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_has: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * TRUE if the attribute was given explicitly when the node was added.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_attrs_has(const QkvAttrs *attrs, const gchar *name);

/**
 * QkvShapeCtx:
 *
 * What a shape rule sees and fills in.
 */
typedef struct {
  const gchar *op_name;
  const gchar *node_name;
  guint n_inputs;
  const QkvShape *in_shapes;
  const QkvDType *in_dtypes;
  const QkvAttrs *attrs;
  /* Filled in by the rule: number of outputs (1 by default), shapes, dtypes
   * (QKV_F32 by default). */
  guint n_outputs;
  QkvShape out_shapes[QKV_MAX_OUTPUTS];
  QkvDType out_dtypes[QKV_MAX_OUTPUTS];
  gpointer reserved[4];
} QkvShapeCtx;

/**
 * qkv_shape_error: (skip)
 * @ctx: a #QkvShapeCtx
 * @error: return location for a #GError, or %NULL
 * @code: the code
 * @format: the format
 * @...: the format's arguments
 *
 * Report a shape-rule failure: the message is prefixed with the op and node
 * names and suffixed with the input shapes. Always returns FALSE.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_shape_error(const QkvShapeCtx *ctx, GError **error, QkvError code, const gchar *format,
                         ...) G_GNUC_PRINTF(4, 5);

/**
 * QkvView:
 *
 * A tensor as a kernel sees it: contiguous, row-major.
 */
typedef struct {
  gpointer data;
  QkvShape shape;
  QkvDType dtype;
} QkvView;

/**
 * QkvKernelCtx:
 *
 * What a kernel sees. The kernel is called once per node run; it may use up to
 * n_threads threads, through qkv_kernel_parallel_for() (an OpenMP team of
 * its own would spin beside qkv's pool).
 */
typedef struct {
  const gchar *op_name;
  const gchar *node_name;
  guint n_inputs;
  guint n_outputs;
  const QkvView *in;
  QkvView *out;
  const QkvAttrs *attrs;
  /* Per-node scratch memory of the size the op's scratch_size asked for. */
  gpointer scratch;
  gsize scratch_size;
  gint n_threads;
  /* Plan compiled for training: dropout and friends are active. */
  gboolean training;
  /* Counter-based randomness: a kernel draws from (seed, step, node_id). */
  guint64 seed;
  guint64 step;
  guint32 node_id;
  /* The library's: reserved[0] is where qkv_kernel_fail() records a failure
   * (ABI 1.2). A kernel never touches them. */
  gpointer reserved[4];
} QkvKernelCtx;

/**
 * qkv_kernel_fail: (skip)
 * @ctx: a #QkvKernelCtx
 * @code: the code
 * @format: the format
 * @...: the format's arguments
 *
 * Fail the run (ABI 1.2): a kernel that finds its inputs unusable (an index
 * outside its range, say) reports it here and returns normally, leaving its
 * outputs in any state but without reading or writing out of bounds. When
 * the node's kernel returns, the plan stops the run: qkv_plan_run() fails
 * with a GError of code in the QKV_ERROR domain, whose message is the
 * formatted one prefixed with "run: node 'NAME' (OP): ". Kernels may call it
 * from any thread of their parallel loops, as often as they like; the first
 * call of a run wins and the later ones are dropped.
 */
QKV_API
void qkv_kernel_fail(const QkvKernelCtx *ctx, QkvError code, const gchar *format, ...)
    G_GNUC_PRINTF(3, 4);

/**
 * QkvGradCtx:
 *
 * What a gradient rule sees. The rule adds nodes to graph (with the typed op
 * functions or qkv_graph_add_node()) and stores d loss / d input i in
 * in_grads[i] for each input with needs_grad[i]; it may leave a gradient NULL
 * when it is zero. out_grads[j] is NULL where no gradient reaches output j.
 */
typedef struct {
  QkvGraph *graph;
  QkvNode *node;
  const QkvAttrs *attrs;
  guint n_inputs;
  guint n_outputs;
  QkvValue *const *inputs;
  QkvValue *const *outputs;
  QkvValue *const *out_grads;
  const gboolean *needs_grad;
  QkvValue **in_grads;
  gpointer reserved[4];
} QkvGradCtx;

/**
 * QkvDecomposeCtx:
 *
 * What a decomposition sees (ABI 1.1). The function adds to graph, with the
 * typed op functions or qkv_graph_add_node(), nodes of existing ops that
 * compute the same function as the node, built from inputs (and constants)
 * only, and stores in outputs[j] the value equal to output j of the node.
 * Autodiff uses it for an op without a gradient rule: it builds the
 * decomposition next to the node and differentiates through it.
 */
typedef struct {
  QkvGraph *graph;
  QkvNode *node;
  const QkvAttrs *attrs;
  guint n_inputs;
  guint n_outputs;
  QkvValue *const *inputs;
  QkvValue **outputs;
  gpointer reserved[4];
} QkvDecomposeCtx;

/**
 * QkvShapeFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a shape func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvShapeFunc)(QkvShapeCtx *ctx, GError **error);
/**
 * QkvKernelFunc:
 * @ctx: the ctx
 *
 * The signature of a kernel func.
 */
typedef void (*QkvKernelFunc)(const QkvKernelCtx *ctx);
/**
 * QkvGradFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a grad func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvGradFunc)(QkvGradCtx *ctx, GError **error);
/**
 * QkvScratchFunc:
 * @ctx: the ctx
 * @n_threads: the n threads
 *
 * Scratch bytes a node needs, given its shapes and the thread count.
 *
 * Returns: as described above
 */
typedef gsize (*QkvScratchFunc)(const QkvShapeCtx *ctx, gint n_threads);
/**
 * QkvDecomposeFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a decompose func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvDecomposeFunc)(QkvDecomposeCtx *ctx, GError **error);

/**
 * QkvOpFlags:
 * @QKV_OP_INPLACE: Output 0 may share input 0's buffer (same byte size) when input 0 is an
 *   intermediate read by no later node. The kernel must then cope with out[0].data == in[0].data.
 * @QKV_OP_RANDOM: The kernel draws random numbers (from ctx->seed, step, node_id).
 * @QKV_OP_STATIC_SHAPE: The output shape comes from an attribute fixed when the graph was built
 *   (broadcast_to's target, for instance): a plan refuses to run the node on inputs smaller than
 *   those it was compiled for.
 *
 * The op flags values.
 */
typedef enum {
  /* Output 0 may share input 0's buffer (same byte size) when input 0 is an
   * intermediate read by no later node. The kernel must then cope with
   * out[0].data == in[0].data. */
  QKV_OP_INPLACE = 1 << 0,
  /* The kernel draws random numbers (from ctx->seed, step, node_id). */
  QKV_OP_RANDOM = 1 << 1,
  /* The output shape comes from an attribute fixed when the graph was built
   * (broadcast_to's target, for instance): a plan refuses to run the node on
   * inputs smaller than those it was compiled for. */
  QKV_OP_STATIC_SHAPE = 1 << 2,
} QkvOpFlags;

/**
 * QkvOpDef:
 *
 * A op def.
 */
typedef struct _QkvOpDef {
  /* sizeof(QkvOpDef) as the author compiled it, and the ABI version. */
  guint32 struct_size;
  guint16 abi_major;
  guint16 abi_minor;

  const gchar *name;
  const gchar *doc;
  /* Input count: min_inputs to max_inputs (-1: no upper bound). */
  guint min_inputs;
  gint max_inputs;
  /* Names of the inputs and outputs, NULL-terminated (for messages and tools). */
  const gchar *const *input_names;
  const gchar *const *output_names;
  /* Attribute schema: n_attrs entries. */
  const QkvAttrSpec *attrs;
  guint n_attrs;
  /* Bit i set: input i never takes a gradient (indices, lengths, targets).
   * i32 inputs never take one in any case. */
  guint64 no_grad_inputs;
  guint32 flags; /* QkvOpFlags */

  QkvShapeFunc shape;
  QkvKernelFunc forward;
  /* NULL: the op is not differentiable (autodiff reports it by name). */
  QkvGradFunc gradient;
  /* NULL: no scratch memory. */
  QkvScratchFunc scratch_size;

  /* ABI 1.1. For an op without a gradient rule: build the same function from
   * existing ops, so autodiff can differentiate through it. NULL: none. */
  QkvDecomposeFunc decompose;

  /* Zero. New fields are taken from here, so the struct keeps its size. */
  gpointer reserved[11];
} QkvOpDef;

/**
 * QKV_OP_DEF_INIT:
 *
 * Initialise a QkvOpDef for the header the caller compiles against.
 */
#define QKV_OP_DEF_INIT                                                                            \
  .struct_size = sizeof(QkvOpDef), .abi_major = QKV_OP_ABI_MAJOR, .abi_minor = QKV_OP_ABI_MINOR

/**
 * qkv_op_register: (skip)
 * @def: a #QkvOpDef
 * @error: return location for a #GError, or %NULL
 *
 * Register an op; the registry keeps a copy of def (strings and arrays it
 * points to must stay valid while the op is registered). Fails with
 * QKV_ERROR_EXISTS for a taken name and QKV_ERROR_INVALID_ARGUMENT for an
 * incomplete or incompatible definition.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_op_register(const QkvOpDef *def, GError **error);
/**
 * qkv_op_lookup: (skip)
 * @name: (nullable): the name
 *
 * The op of that name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvOpDef
 */
QKV_API
const QkvOpDef *qkv_op_lookup(const gchar *name);
/**
 * qkv_op_origin:
 * @name: the name
 *
 * Where the op came from: "built-in" or the plugin file path.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_op_origin(const gchar *name);
/**
 * qkv_op_list:
 *
 * Names of every registered op, sorted; free with g_strfreev().
 *
 * Returns: (transfer full) (array zero-terminated=1): the result
 */
QKV_API
gchar **qkv_op_list(void);

/**
 * QkvRangeFunc:
 * @begin: the begin
 * @end: the end
 * @thread_index: the thread index
 * @user_data: data given with the callback
 *
 * Run body(begin, end, thread_index, user_data) over [0, n) split into
 * contiguous chunks, one per thread (up to ctx->n_threads), on qkv's thread
 * pool. Chunk i is [n·i/t, n·(i+1)/t) for t chunks, so results that depend on
 * the split depend only on the thread count.
 */
typedef void (*QkvRangeFunc)(gint64 begin, gint64 end, gint thread_index, gpointer user_data);
/**
 * qkv_kernel_parallel_for: (skip)
 * @ctx: a #QkvKernelCtx
 * @n: the n
 * @body: the body
 * @user_data: (closure): data for the callback
 *
 * Kernel parallel for.
 */
QKV_API
void qkv_kernel_parallel_for(const QkvKernelCtx *ctx, gint64 n, QkvRangeFunc body,
                             gpointer user_data);
/**
 * qkv_parallel_for: (skip)
 * @n_threads: the n threads
 * @n: the n
 * @body: the body
 * @user_data: (closure): data for the callback
 *
 * The same with an explicit thread count (≤ 1: on the calling thread). Loops
 * started from inside a pool chunk, or while another thread's loop holds the
 * pool, run on the calling thread. Idle pool threads spin for at most
 * QKV_SPIN_US microseconds (default 50) and then sleep.
 */
QKV_API
void qkv_parallel_for(gint n_threads, gint64 n, QkvRangeFunc body, gpointer user_data);
/**
 * qkv_kernel_threads: (skip)
 * @ctx: a #QkvKernelCtx
 * @work: the work
 *
 * How many of ctx->n_threads a loop of work units (about one simple float
 * operation each) should use: 1 below the size where waking a thread costs
 * more than it saves, so that small kernels never fork.
 *
 * Returns: the gint
 */
QKV_API
gint qkv_kernel_threads(const QkvKernelCtx *ctx, gint64 work);
/**
 * qkv_work_threads:
 * @n_threads: the n threads
 * @work: the work
 *
 * The same for a thread budget of n_threads.
 *
 * Returns: the gint
 */
QKV_API
gint qkv_work_threads(gint n_threads, gint64 work);

/**
 * qkv_sgemm: (skip)
 * @transpose_a: the transpose a
 * @transpose_b: the transpose b
 * @m: the m
 * @n: the n
 * @k: the k
 * @alpha: the alpha
 * @a: the a
 * @lda: the lda
 * @b: the b
 * @ldb: the ldb
 * @beta: the beta
 * @c: (out) (optional): where to store the c, or %NULL
 * @ldc: the ldc
 * @n_threads: the n threads
 *
 * c = alpha·op(a)·op(b) + beta·c, row-major, through the GEMM backend below
 * (small products through qkv's own AVX-512 kernel). Products below
 * about 4 M multiply-adds run on one thread (splitting them costs more than it
 * saves); larger ones use up to n_threads (≤ 0: the thread count of the plan
 * running on this thread, else qkv_get_num_threads()). Inside a parallel
 * region it always runs on the calling thread. lda, ldb, ldc are the stored
 * rows' lengths.
 */
QKV_API
void qkv_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
               float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
               float *c, gint64 ldc, gint n_threads);

/**
 * qkv_gemm_backend:
 *
 * The GEMM library behind qkv_sgemm(): "onednn" (its JIT kernels follow the
 * CPU's features; the default where qkv was built with it and picked AVX-512;
 * products under 64×64×64 multiply-adds, where its per-call cost dominates,
 * still go to OpenBLAS) or "openblas" (the fallback; QKV_GEMM=openblas forces
 * it).
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_gemm_backend(void);
/**
 * qkv_gemm_kernel:
 *
 * The kernels that backend runs: "jit avx512_core" and the like for oneDNN,
 * OpenBLAS's core type (e.g. "Haswell") for OpenBLAS.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_gemm_kernel(void);
/**
 * qkv_bf16_native:
 * @why: (out) (optional) (transfer none): the why
 *
 * Whether bf16 products (QKV_PRECISION_BF16, qkv-plan.h) run on the CPU's
 * bf16 instructions: TRUE where qkv was built with oneDNN, the GEMM backend
 * is oneDNN and the CPU has AVX512_BF16 (or AMX); FALSE where qkv emulates
 * them (rounds the operands to bf16 and multiplies in float32). *why (if
 * why is not NULL) gets a static phrase saying what decided it, e.g.
 * "oneDNN avx512_core_amx" or "the CPU has no AVX512_BF16".
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_bf16_native(const gchar **why);
/**
 * qkv_set_gemm_backend:
 * @name: the name
 * @error: return location for a #GError, or %NULL
 *
 * Picks the backend by name, as QKV_GEMM does: "auto", "openblas" or
 * "onednn". FALSE with QKV_ERROR_INVALID_ARGUMENT for an unknown name or one
 * this build lacks. Call it while no product runs (benchmarks, tests).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_set_gemm_backend(const gchar *name, GError **error);

/**
 * qkv_vec_exp: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * Vector math over n floats (dst may equal src), through SLEEF's widest
 * vector functions the CPU supports, with a scalar fallback.
 */
QKV_API
void qkv_vec_exp(float *dst, const float *src, gsize n);
/**
 * qkv_vec_tanh: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * See qkv_vec_exp().
 */
QKV_API
void qkv_vec_tanh(float *dst, const float *src, gsize n);
/**
 * qkv_vec_erf: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * See qkv_vec_exp().
 */
QKV_API
void qkv_vec_erf(float *dst, const float *src, gsize n);
/**
 * qkv_vec_isa:
 *
 * The ISA picked at run time: "avx512f", "avx2" or "scalar".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_vec_isa(void);

/**
 * QkvSparseBackward:
 * @QKV_SPARSE_BACKWARD_OFF: off
 * @QKV_SPARSE_BACKWARD_AUTO: auto
 * @QKV_SPARSE_BACKWARD_ALWAYS: always
 *
 * Sparse backward: whether backward kernels may run their products over the
 * rows of a gradient that are not all zero (padded positions under a masked
 * loss) instead of over every row. The result is the same up to the order of
 * float sums. AUTO (the default) does it where the product is large enough
 * to pay for gathering the rows; ALWAYS wherever a row is zero (for tests);
 * OFF never. The environment variable QKV_SPARSE_BACKWARD=0 starts it OFF.
 * Process-wide; change it between runs, not during one.
 */
typedef enum {
  QKV_SPARSE_BACKWARD_OFF,
  QKV_SPARSE_BACKWARD_AUTO,
  QKV_SPARSE_BACKWARD_ALWAYS,
} QkvSparseBackward;
/**
 * qkv_set_sparse_backward:
 * @mode: the mode
 *
 * Set sparse backward. A value that is not a QkvSparseBackward leaves the
 * mode unchanged and logs a critical: a value a user gives goes to
 * qkv_try_set_sparse_backward().
 */
QKV_API
void qkv_set_sparse_backward(QkvSparseBackward mode);
/**
 * qkv_try_set_sparse_backward:
 * @mode: the mode
 * @error: return location for a #GError, or %NULL
 *
 * qkv_set_sparse_backward() that refuses a value that is not a
 * QkvSparseBackward (QKV_SPARSE_BACKWARD_OFF, QKV_SPARSE_BACKWARD_AUTO or
 * QKV_SPARSE_BACKWARD_ALWAYS) with QKV_ERROR_INVALID_ARGUMENT naming it (the
 * mode unchanged).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_try_set_sparse_backward(QkvSparseBackward mode, GError **error);
/**
 * qkv_get_sparse_backward:
 *
 * See qkv_set_sparse_backward().
 *
 * Returns: the #QkvSparseBackward
 */
QKV_API
QkvSparseBackward qkv_get_sparse_backward(void);

/**
 * qkv_random_uniform:
 * @key: the key
 * @counter: the counter
 *
 * Counter-based random numbers: a uniform float in [0, 1) for (key, counter).
 *
 * Returns: the float
 */
QKV_API
float qkv_random_uniform(guint64 key, guint64 counter);
/**
 * qkv_random_dropout_mask: (skip)
 * @key: the key
 * @first: the first
 * @n: the n
 * @p: the p
 * @mask: (out) (optional): where to store the mask, or %NULL
 *
 * A dropout mask for counters first .. first + n - 1: mask[j] is 0 where
 * qkv_random_uniform(key, first + j) < p, else 1/(1-p). Vectorised; the same
 * numbers as the scalar draws.
 */
QKV_API
void qkv_random_dropout_mask(guint64 key, guint64 first, gsize n, float p, float *mask);
/**
 * qkv_random_key:
 * @seed: the seed
 * @step: the step
 * @node_id: the node id
 *
 * Mix seed, step and node id into one key.
 *
 * Returns: the guint64
 */
QKV_API
guint64 qkv_random_key(guint64 seed, guint64 step, guint32 node_id);

/* ---------------------------------------------------------------------------
 * Plugins
 * ------------------------------------------------------------------------- */

/**
 * QkvPluginInfo:
 *
 * What a plugin says about itself. abi_major/abi_minor are the op ABI of the
 * header the plugin was compiled against (QKV_OP_ABI_MAJOR/MINOR): the loader
 * refuses a different major or a newer minor. Strings must stay valid while
 * the module is loaded (string literals are right).
 */
typedef struct {
  guint32 struct_size; /* sizeof(QkvPluginInfo) as the author compiled it */
  guint16 abi_major;
  guint16 abi_minor;
  const gchar *name;        /* "gelu": letters, digits, '_', '-', '.' */
  const gchar *version;     /* "1.0.0" */
  const gchar *license;     /* "MIT" */
  const gchar *description; /* one line */
  /* Registers the plugin's ops with qkv_op_register(); on failure returns
   * FALSE (with error set), and every op it registered is removed again. */
  gboolean (*register_ops)(GError **error);
  /* Zero. New fields are taken from here, so the struct keeps its size. */
  gpointer reserved[8];
} QkvPluginInfo;

/**
 * QKV_PLUGIN_DESCRIBE_SYMBOL:
 *
 * The one symbol the loader looks up in a module.
 */
#define QKV_PLUGIN_DESCRIBE_SYMBOL "qkv_plugin_describe"
/**
 * QkvPluginDescribeFunc:
 *
 * The signature of a plugin describe func.
 *
 * Returns: as described above
 */
typedef const QkvPluginInfo *(*QkvPluginDescribeFunc)(void);

/**
 * QKV_PLUGIN_DEFINE:
 * @name_: the name
 * @version_: the version
 * @license_: the license
 * @description_: the description
 * @register_func_: the register func
 *
 * Define the plugin's descriptor; use once, at file scope, in one source file
 * of the module:
 *
 *   QKV_PLUGIN_DEFINE("gelu", "1.0.0", "MIT", "GELU activation", register_gelu);
 */
#define QKV_PLUGIN_DEFINE(name_, version_, license_, description_, register_func_)                 \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void);                                  \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void)                                   \
  {                                                                                                \
    static const QkvPluginInfo info = {                                                            \
        .struct_size = sizeof(QkvPluginInfo),                                                      \
        .abi_major = QKV_OP_ABI_MAJOR,                                                             \
        .abi_minor = QKV_OP_ABI_MINOR,                                                             \
        .name = (name_),                                                                           \
        .version = (version_),                                                                     \
        .license = (license_),                                                                     \
        .description = (description_),                                                             \
        .register_ops = (register_func_),                                                          \
    };                                                                                             \
    return &info;                                                                                  \
  }                                                                                                \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void)

/**
 * QkvPlugin:
 *
 * A loaded plugin; owned by the library, valid until the process ends
 * (plugins are never unloaded).
 */
typedef struct _QkvPlugin QkvPlugin;

/**
 * qkv_plugin_load:
 * @path: the path
 * @error: return location for a #GError, or %NULL
 *
 * Load the plugin module at path and register its ops, whose origin
 * (qkv_op_origin()) becomes the module's absolute path. Before the module is
 * opened its ELF headers are checked against the file: a truncated or
 * damaged file, or one built for another machine, is refused instead of
 * being handed to the dynamic loader. On any failure (file missing, truncated
 * or not a module, no descriptor, an incompatible ABI, a descriptor too
 * small, an op name already taken, a failing register function, a register
 * function that loads its own module again: that inner load fails) returns
 * NULL with a QKV_ERROR_PLUGIN error naming the file and the reason; the
 * plugin then registers nothing and the library is unchanged. Loading a file
 * that is already loaded (the same file, by its resolved path) does nothing
 * and returns the plugin loaded before; a different file with the name of a
 * loaded plugin is an error.
 *
 * Returns: (transfer none) (nullable): a #QkvPlugin, or %NULL with @error set
 */
QKV_API
const QkvPlugin *qkv_plugin_load(const gchar *path, GError **error);
/**
 * qkv_plugin_count:
 *
 * The loaded plugins in load order, those found at initialisation first.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_plugin_count(void);
/**
 * qkv_plugin_nth:
 * @index: the index
 *
 * See qkv_plugin_count().
 *
 * Returns: (transfer none): a #QkvPlugin
 */
QKV_API
const QkvPlugin *qkv_plugin_nth(guint index);
/**
 * qkv_plugin_lookup:
 * @name: (nullable): the name
 *
 * The loaded plugin of that name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvPlugin
 */
QKV_API
const QkvPlugin *qkv_plugin_lookup(const gchar *name);
/**
 * qkv_plugin_get_name:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_name(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_version:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_version(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_license:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_license(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_description:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_description(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_path:
 * @plugin: a #QkvPlugin
 *
 * The module's absolute path.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_path(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_ops:
 * @plugin: a #QkvPlugin
 *
 * The names of the ops it registered, sorted, NULL-terminated.
 *
 * Returns: (transfer none) (array zero-terminated=1): the strings
 */
QKV_API
const gchar *const *qkv_plugin_get_ops(const QkvPlugin *plugin);
/**
 * qkv_plugin_search_path:
 *
 * The directories searched at initialisation, in order, NULL-terminated:
 * those of QKV_PLUGIN_PATH (colon-separated), then the installed plugin
 * directory (QKV_PLUGIN_SYSTEM_PATH replaces it; set it empty for none).
 *
 * Returns: (transfer none) (array zero-terminated=1): the strings
 */
QKV_API
const gchar *const *qkv_plugin_search_path(void);

G_END_DECLS
