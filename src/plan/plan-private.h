/* plan-private.h: the compiled plan's structure, shared by the files of
 * src/plan/ (not installed): compile.c builds a plan, arena.c lays out its
 * memory, execute.c binds inputs to it and runs it. */
#pragma once

#include "core/core-private.h"

typedef struct {
  QkvNode *node;
  QkvKernelCtx ctx;
  QkvView *in;
  QkvView *out;
  gsize scratch_offset;
  double seconds; /* profiling: time spent in this step's kernel */
} Step;

typedef struct {
  guint step;
  guint slot;
} Patch;

typedef struct {
  QkvValue *value;
  QkvTensor *bound; /* a reference, dropped on rebinding and by qkv_plan_free() */
  gboolean needed;
  GArray *patches; /* Patch: ctx.in[slot] of step */
  QkvShape shape;  /* the bound tensor's shape when it was bound */
} Binding;

typedef struct {
  QkvParam *param;
  QkvValue *grad;
} ParamGrad;

struct _QkvPlan {
  QkvGraph *graph; /* a reference */
  gint ref_count;  /* qkv_plan_ref(); qkv_plan_free() drops one */
  QkvPlanOptions options;
  gint n_threads;
  gint max_threads; /* scratch memory is sized for this many */
  guint64 seed;
  guint64 step;
  Step *steps;
  guint n_steps;
  guint8 *arena;
  gsize arena_size;
  gsize intermediates_size;
  gsize *value_offset;      /* per value id: arena offset, or G_MAXSIZE if not in the arena */
  gpointer *value_external; /* per value id: memory outside the arena (a param's gradient) */
  gboolean *value_bf16;     /* per value id: stored as bfloat16 (bf16_activations) */
  Binding *bindings;        /* one per graph input */
  guint n_bindings;
  QkvValue **output_values;
  QkvTensor **outputs;
  guint n_outputs;
  ParamGrad *param_grads;
  guint n_param_grads;
  gboolean profiling;
  guint64 profiled_runs;
  /* Variable shapes: the shape every value has in the current run (graph
   * inputs: as bound), the scratch sizes compile reserved, and buffers for
   * re-running shape rules, all allocated at compile time. */
  QkvShape *value_shape;
  gsize *step_scratch;
  QkvShape *rule_in_shapes;
  QkvDType *rule_in_dtypes;
  gboolean shapes_dirty;  /* a bound shape changed since the last shape pass */
  gboolean shapes_varied; /* the current shapes are not the compiled ones */
  /* Concurrency (docs/threads.md): 1 while a thread binds or runs the plan,
   * taken with a compare-and-swap so that a second thread is refused at
   * once; and the stores whose gradient buffers a run writes (distinct,
   * usually one), each taken for the run with qkv_params_grads_acquire(). */
  gint busy;
  QkvParams **grad_stores;
  guint n_grad_stores;
  /* What a kernel reported with qkv_kernel_fail() during the current run
   * (every step's ctx.reserved points here); NULL otherwise. */
  GError *kernel_failure;
  /* the QkvPlanDecoder feeding this plan (plan-decoder.c), NULL if none: its
   * caches are the plan's states, so one decoder at a time */
  gconstpointer decoder;
  /* The graph's states (state.c): their buffers (plan->value_external,
   * owned) and borrowed tensor views of them, one per state. */
  QkvValue **state_values;
  QkvTensor **state_views;
  guint n_states;
  /* room for one state's rows while qkv_plan_reorder_states() moves them;
   * allocated by its first call */
  gpointer state_scratch;
};

/* arena.c */

/* n rounded up to the arena alignment; G_MAXSIZE if that does not fit. */
gsize qkv_arena_round_up(gsize n);
/* Lay out the arena for plan->steps in execution order and allocate it:
 * fills plan->value_offset, each step's scratch_offset and
 * plan->step_scratch, plan->intermediates_size, arena_size and arena.
 * last_use (per value id: the last step that reads it, G_MAXINT for values
 * that must outlive the run) is raised for values written and never read.
 * FALSE with a QKV_ERROR_MEMORY when the arena cannot be had. */
gboolean qkv_arena_lay_out(QkvPlan *plan, gint *last_use, GError **error);
/* How the plan stores value v: QKV_BF16 where it keeps it in bfloat16,
 * else its dtype. */
QkvDType qkv_plan_value_dtype(const QkvPlan *plan, const QkvValue *v);
/* Where value v lives while the plan runs: the arena, the parameter store,
 * the constant, or the tensor bound to an input (NULL while unbound). */
gpointer qkv_plan_value_pointer(QkvPlan *plan, QkvValue *v);

/* state.c */

/* Allocate a zeroed buffer for each of the graph's states (into
 * plan->value_external); FALSE with QKV_ERROR_MEMORY. */
gboolean qkv_plan_states_alloc(QkvPlan *plan, GError **error);
/* Reorder plan->steps so that each node writing a state in place runs after
 * every reader of that state that does not depend on it, and point each
 * writer's output 0 at its state's buffer (no copy of the state); FALSE with
 * QKV_ERROR_INVALID_ARGUMENT when a writer's input 0 is not a state or a
 * state has two writers. */
gboolean qkv_plan_order_state_writers(QkvPlan *plan, GError **error);
/* Before a run: refuse cache positions (bound inputs or constants) that
 * would write past a state's end. */
gboolean qkv_plan_check_state_writes(QkvPlan *plan, GError **error);
void qkv_plan_states_free(QkvPlan *plan);
