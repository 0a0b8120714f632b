/* execute.c: what a compiled plan does after compile: take the tensors
 * bound to its inputs, re-derive the steps' shapes when a bound tensor is
 * smaller than compiled, run the steps' kernels in order, and report where
 * the time went. Nothing here allocates on the way to a kernel. */
#include "plan/plan-private.h"

#include <math.h>
#include <string.h>
#include "error-private.h"

/* Every dim of got is at most the one of max, same rank. */
static gboolean
shape_fits(const QkvShape *got, const QkvShape *max)
{
  if (got->rank != max->rank)
    return FALSE;
  for (gint d = 0; d < got->rank; d++)
    if (got->dims[d] > max->dims[d])
      return FALSE;
  return TRUE;
}

/* Take the plan for one bind or run in this thread, or refuse at once: a
 * plan has one set of kernel contexts, views and arena, which two threads
 * would overwrite under each other's kernels. */
static gboolean
plan_acquire(QkvPlan *plan, const gchar *what, GError **error)
{
  if (g_atomic_int_compare_and_exchange(&plan->busy, 0, 1))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_BUSY,
              "%s: the plan is being bound or run in another thread (a plan is used by one "
              "thread at a time; compile one plan per thread)",
              what);
  return FALSE;
}

static void
plan_release(QkvPlan *plan)
{
  g_atomic_int_set(&plan->busy, 0);
}

/* The gradient buffers of every store the run writes, all or none. */
static gboolean
grad_stores_acquire(QkvPlan *plan, GError **error)
{
  for (guint i = 0; i < plan->n_grad_stores; i++) {
    if (!qkv_params_grads_acquire(plan->grad_stores[i])) {
      while (i-- > 0)
        qkv_params_grads_release(plan->grad_stores[i]);
      g_set_error(error, QKV_ERROR, QKV_ERROR_BUSY,
                  "run: another plan's run in another thread is writing the gradient buffers of "
                  "the parameter store this plan writes its gradients to (plans over one store "
                  "that compute gradients run one at a time)");
      return FALSE;
    }
  }
  return TRUE;
}

static void
grad_stores_release(QkvPlan *plan)
{
  for (guint i = 0; i < plan->n_grad_stores; i++)
    qkv_params_grads_release(plan->grad_stores[i]);
}

static gboolean
bind_input(QkvPlan *plan, const gchar *input_name, QkvTensor *tensor, GError **error)
{
  Binding *b = NULL;
  for (guint i = 0; i < plan->n_bindings; i++)
    if (g_str_equal(plan->bindings[i].value->name, input_name))
      b = &plan->bindings[i];
  if (b == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "bind: the graph has no input '%s'",
                input_name);
    return FALSE;
  }
  QkvValue *v = b->value;
  if (tensor->dtype != v->dtype || !shape_fits(&tensor->shape, &v->shape)) {
    g_autofree gchar *want = qkv_shape_to_string(&v->shape);
    g_autofree gchar *got = qkv_shape_to_string(&tensor->shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "bind: input '%s' is %s%s, the tensor given is %s%s (a bound tensor may be "
                "smaller in any dim, never bigger, and must have the same rank and dtype)",
                input_name, qkv_dtype_name(v->dtype), want, qkv_dtype_name(tensor->dtype), got);
    return FALSE;
  }
  if (b->bound != tensor) { /* the plan's own reference: freeing the caller's is safe */
    qkv_tensor_ref(tensor);
    qkv_tensor_free(b->bound);
    b->bound = tensor;
  }
  if (!qkv_shape_equal(&tensor->shape, &b->shape)) {
    b->shape = tensor->shape;
    plan->shapes_dirty = TRUE;
  }
  for (guint i = 0; i < b->patches->len; i++) {
    Patch *p = &g_array_index(b->patches, Patch, i);
    plan->steps[p->step].in[p->slot].data = tensor->data;
  }
  for (guint i = 0; i < plan->n_outputs; i++)
    if (plan->output_values[i] == v)
      plan->outputs[i]->data = tensor->data;
  return TRUE;
}

gboolean
qkv_plan_bind(QkvPlan *plan, const gchar *input_name, QkvTensor *tensor, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(plan != NULL && input_name != NULL && tensor != NULL, FALSE);
  if (!plan_acquire(plan, "bind", error))
    return FALSE;
  gboolean ok = bind_input(plan, input_name, tensor, error);
  plan_release(plan);
  return ok;
}

/* Re-run every step's shape rule on the bound shapes, so that kernels see the
 * smaller views. Memory was laid out for the compiled shapes: each value must
 * fit in its buffer and each scratch request in what compile reserved, else
 * the run is refused. Allocates nothing (except for an error message). */
static gboolean
reshape_steps(QkvPlan *plan, GError **error)
{
  gboolean varied = FALSE;
  for (guint i = 0; i < plan->n_bindings; i++) {
    Binding *b = &plan->bindings[i];
    plan->value_shape[b->value->id] = b->shape;
    varied |= !qkv_shape_equal(&b->shape, &b->value->shape);
  }
  if (!varied && !plan->shapes_varied) {
    plan->shapes_dirty = FALSE;
    return TRUE;
  }
  /* until this pass completes, the views may be half updated */
  plan->shapes_varied = TRUE;
  for (guint s = 0; s < plan->n_steps; s++) {
    Step *st = &plan->steps[s];
    QkvNode *node = st->node;
    QkvShapeCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    gboolean changed = FALSE;
    for (guint i = 0; i < node->n_inputs; i++) {
      QkvValue *in = node->inputs[i];
      plan->rule_in_shapes[i] = plan->value_shape[in->id];
      plan->rule_in_dtypes[i] = in->dtype;
      changed |= !qkv_shape_equal(&plan->rule_in_shapes[i], &in->shape);
    }
    if (changed && (node->op->flags & QKV_OP_STATIC_SHAPE)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "run: node '%s' (op '%s') fixes its output shape when the graph is built, so "
                  "the plan cannot run it on inputs smaller than compiled",
                  node->name, node->op->name);
      return FALSE;
    }
    ctx.op_name = node->op->name;
    ctx.node_name = node->name;
    ctx.n_inputs = node->n_inputs;
    ctx.in_shapes = plan->rule_in_shapes;
    ctx.in_dtypes = plan->rule_in_dtypes;
    ctx.attrs = node->attrs;
    ctx.n_outputs = 1;
    if (!changed) {
      for (guint o = 0; o < node->n_outputs; o++)
        ctx.out_shapes[o] = node->outputs[o]->shape;
    } else {
      GError *rule_error = NULL;
      if (!node->op->shape(&ctx, &rule_error)) {
        if (rule_error == NULL)
          qkv_shape_error(&ctx, &rule_error, QKV_ERROR_SHAPE, "the shape rule rejected the inputs");
        g_propagate_prefixed_error(error, rule_error, "run: with the bound shapes: ");
        return FALSE;
      }
      if (ctx.n_outputs != node->n_outputs)
        return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                               "run: with the bound shapes the node has %u outputs, compiled %u",
                               ctx.n_outputs, node->n_outputs);
      for (guint o = 0; o < node->n_outputs; o++) {
        QkvValue *out = node->outputs[o];
        if (!qkv_shape_is_valid(&ctx.out_shapes[o]) || ctx.out_dtypes[o] != out->dtype ||
            ctx.out_shapes[o].rank != out->shape.rank ||
            qkv_shape_numel(&ctx.out_shapes[o]) > qkv_shape_numel(&out->shape)) {
          g_autofree gchar *want = qkv_shape_to_string(&out->shape);
          g_autofree gchar *got = qkv_shape_to_string(&ctx.out_shapes[o]);
          return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                                 "run: with the bound shapes output %u would be %s%s, which does "
                                 "not fit the %s%s compiled",
                                 o, qkv_dtype_name(ctx.out_dtypes[o]), got,
                                 qkv_dtype_name(out->dtype), want);
        }
      }
      if (node->op->scratch_size != NULL) {
        for (guint o = 0; o < node->n_outputs; o++)
          ctx.out_dtypes[o] = qkv_plan_value_dtype(plan, node->outputs[o]);
        gsize need = qkv_arena_round_up(node->op->scratch_size(&ctx, plan->max_threads));
        if (need > plan->step_scratch[s])
          return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                                 "run: with the bound shapes the node needs %" G_GSIZE_FORMAT
                                 " bytes of scratch memory, more than the %" G_GSIZE_FORMAT
                                 " compiled",
                                 need, plan->step_scratch[s]);
      }
    }
    for (guint i = 0; i < node->n_inputs; i++)
      st->in[i].shape = plan->rule_in_shapes[i];
    for (guint o = 0; o < node->n_outputs; o++) {
      st->out[o].shape = ctx.out_shapes[o];
      plan->value_shape[node->outputs[o]->id] = ctx.out_shapes[o];
    }
  }
  /* parameter gradients are copied whole into the store: their shapes must
   * not have moved (a gradient of a fixed-shape parameter never does) */
  for (guint i = 0; i < plan->n_param_grads; i++) {
    QkvValue *g = plan->param_grads[i].grad;
    if (!qkv_shape_equal(&plan->value_shape[g->id], &g->shape)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "run: with the bound shapes the gradient '%s' of parameter '%s' changes shape",
                  g->name, qkv_param_name(plan->param_grads[i].param));
      return FALSE;
    }
  }
  for (guint i = 0; i < plan->n_outputs; i++)
    plan->outputs[i]->shape = plan->value_shape[plan->output_values[i]->id];
  plan->shapes_varied = varied;
  plan->shapes_dirty = FALSE;
  return TRUE;
}

/* A kernel of node failed the run (qkv_kernel_fail()): hand its error on,
 * naming the node, and leave the plan ready for the next run. The steps
 * after the node did not run, the parameter gradients are not copied to the
 * store (those computed in place there may be partial) and the step counter
 * stays. */
static gboolean
stop_on_kernel_failure(QkvPlan *plan, const QkvNode *node, GError **error)
{
  GError *failure = plan->kernel_failure;
  plan->kernel_failure = NULL;
  g_propagate_prefixed_error(error, failure, "run: node '%s' (%s): ", node->name, node->op->name);
  return FALSE;
}

static gboolean
run_steps(QkvPlan *plan, GError **error)
{
  for (guint i = 0; i < plan->n_bindings; i++) {
    Binding *b = &plan->bindings[i];
    gboolean is_output = FALSE;
    for (guint j = 0; j < plan->n_outputs; j++)
      is_output |= plan->output_values[j] == b->value;
    if ((b->needed || is_output) && b->bound == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_UNBOUND,
                  "run: graph input '%s' has no tensor bound (qkv_plan_bind)", b->value->name);
      return FALSE;
    }
  }
  if (plan->shapes_dirty && !reshape_steps(plan, error))
    return FALSE;
  if (plan->n_states > 0 && !qkv_plan_check_state_writes(plan, error))
    return FALSE;
  qkv_set_running_plan_threads(plan->n_threads);
  qkv_set_running_precision(plan->options.precision);
  guint s;
  for (s = 0; s < plan->n_steps; s++) {
    Step *st = &plan->steps[s];
    st->ctx.n_threads = plan->n_threads;
    st->ctx.seed = plan->seed;
    st->ctx.step = plan->step;
    qkv_set_running_step(&st->ctx);
    if (G_UNLIKELY(plan->profiling)) {
      gint64 t0 = g_get_monotonic_time();
      st->node->op->forward(&st->ctx);
      st->seconds += (double)(g_get_monotonic_time() - t0) * 1e-6;
    } else {
      st->node->op->forward(&st->ctx);
    }
    if (G_UNLIKELY(g_atomic_pointer_get(&plan->kernel_failure) != NULL))
      break;
  }
  qkv_set_running_step(NULL);
  qkv_set_running_plan_threads(0);
  qkv_set_running_precision(QKV_PRECISION_FP32);
  if (G_UNLIKELY(s < plan->n_steps))
    return stop_on_kernel_failure(plan, plan->steps[s].node, error);
  if (plan->profiling)
    plan->profiled_runs++;
  for (guint i = 0; i < plan->n_param_grads; i++) {
    ParamGrad *pg = &plan->param_grads[i];
    QkvTensor *dst = qkv_param_grad(pg->param);
    gconstpointer src = qkv_plan_value_pointer(plan, pg->grad);
    if (src != qkv_tensor_data(dst))
      memcpy(qkv_tensor_data(dst), src, qkv_tensor_nbytes(dst));
  }
  plan->step++;
  return TRUE;
}

gboolean
qkv_plan_run(QkvPlan *plan, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(plan != NULL, FALSE);
  if (!plan_acquire(plan, "run", error))
    return FALSE;
  gboolean ok = grad_stores_acquire(plan, error);
  if (ok) {
    ok = run_steps(plan, error);
    grad_stores_release(plan);
  }
  plan_release(plan);
  return ok;
}

void
qkv_plan_set_profiling(QkvPlan *plan, gboolean enable)
{
  g_return_if_fail(plan != NULL);
  plan->profiling = enable;
}

void
qkv_plan_profile_reset(QkvPlan *plan)
{
  g_return_if_fail(plan != NULL);
  for (guint s = 0; s < plan->n_steps; s++)
    plan->steps[s].seconds = 0;
  plan->profiled_runs = 0;
}

typedef struct {
  const gchar *op;
  double seconds;
  guint nodes;
} OpTime;

static gint
compare_op_time(gconstpointer a, gconstpointer b)
{
  double x = ((const OpTime *)a)->seconds, y = ((const OpTime *)b)->seconds;
  return (x < y) - (x > y);
}

gchar *
qkv_plan_profile_report(const QkvPlan *plan)
{
  g_return_val_if_fail(plan != NULL, NULL);
  g_autoptr(GHashTable) index = g_hash_table_new(g_str_hash, g_str_equal);
  g_autoptr(GArray) ops = g_array_new(FALSE, FALSE, sizeof(OpTime));
  double total = 0;
  for (guint s = 0; s < plan->n_steps; s++) {
    const Step *st = &plan->steps[s];
    const gchar *name = st->node->op->name;
    gpointer found;
    if (!g_hash_table_lookup_extended(index, name, NULL, &found)) {
      OpTime t = {name, 0, 0};
      found = GUINT_TO_POINTER(ops->len);
      g_array_append_val(ops, t);
      g_hash_table_insert(index, (gpointer)name, found);
    }
    OpTime *t = &g_array_index(ops, OpTime, GPOINTER_TO_UINT(found));
    t->seconds += st->seconds;
    t->nodes++;
    total += st->seconds;
  }
  g_array_sort(ops, compare_op_time);
  double runs = (double)MAX(plan->profiled_runs, 1);
  GString *out = g_string_new(NULL);
  g_string_append_printf(out, "%-32s %6s %12s %7s\n", "op", "nodes", "ms/run", "share");
  for (guint i = 0; i < ops->len; i++) {
    const OpTime *t = &g_array_index(ops, OpTime, i);
    g_string_append_printf(out, "%-32s %6u %12.3f %6.1f%%\n", t->op, t->nodes,
                           1e3 * t->seconds / runs, total > 0 ? 100 * t->seconds / total : 0.0);
  }
  g_string_append_printf(out, "%-32s %6u %12.3f   (%" G_GUINT64_FORMAT " runs)\n", "total",
                         plan->n_steps, 1e3 * total / runs, plan->profiled_runs);
  return g_string_free(out, FALSE);
}

const QkvTensor *
qkv_plan_output(QkvPlan *plan, guint index)
{
  g_return_val_if_fail(plan != NULL, NULL);
  /* an index past the end is a value a user can pass: quiet, as documented */
  if (index >= plan->n_outputs)
    return NULL;
  return plan->outputs[index];
}

float
qkv_plan_output_scalar(QkvPlan *plan, guint index)
{
  g_return_val_if_fail(plan != NULL, NAN);
  const QkvTensor *t = qkv_plan_output(plan, index);
  if (t == NULL || qkv_tensor_numel(t) == 0)
    return NAN;
  return (float)qkv_tensor_get(t, 0);
}

gsize
qkv_plan_arena_size(const QkvPlan *plan)
{
  return plan->arena_size;
}

gsize
qkv_plan_intermediates_size(const QkvPlan *plan)
{
  return plan->intermediates_size;
}

guint
qkv_plan_n_steps(const QkvPlan *plan)
{
  return plan->n_steps;
}

void
qkv_plan_set_n_threads(QkvPlan *plan, gint n_threads)
{
  plan->n_threads = n_threads > 0 ? n_threads : qkv_get_num_threads();
  /* kernels' scratch memory was sized for max_threads at compile time */
  plan->n_threads = MIN(plan->n_threads, plan->max_threads);
}

gint
qkv_plan_get_n_threads(const QkvPlan *plan)
{
  return plan->n_threads;
}

void
qkv_plan_set_seed(QkvPlan *plan, guint64 seed)
{
  plan->seed = seed;
}

void
qkv_plan_set_step(QkvPlan *plan, guint64 step)
{
  plan->step = step;
}

guint64
qkv_plan_get_step(const QkvPlan *plan)
{
  return plan->step;
}
