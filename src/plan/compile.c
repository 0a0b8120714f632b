/* compile.c: compiling a graph into a plan. The phases, in order: mark the
 * roots (requested outputs, parameter gradients), prune and order the nodes
 * they need, find each value's last use, lay out the arena (arena.c), then
 * build the input bindings, each step's kernel context and the output
 * tensors. Running (execute.c) allocates nothing: every pointer a kernel
 * sees is fixed here, except graph inputs, which are patched in on bind. */
#include "plan/plan-private.h"
#include "error-private.h"

QkvPlanOptions
qkv_plan_options_default(void)
{
  QkvPlanOptions o = {0};
  return o;
}

/* What the phases of qkv_graph_compile() share while they build the plan. */
typedef struct {
  QkvGraph *graph;
  QkvValue *const *outputs;
  guint n_outputs;
  guint n_values, n_nodes;
  QkvPlan *plan;
  gint *last_use;        /* per value id: the last step that reads it; G_MAXINT: kept */
  gboolean *needed;      /* per value id: a root depends on it */
  gboolean *node_needed; /* per node id: the node computes a needed value */
} CompileState;

static gboolean
check_outputs(QkvGraph *graph, QkvValue *const *outputs, guint n_outputs, GError **error)
{
  for (guint i = 0; i < n_outputs; i++) {
    if (outputs[i] == NULL) {
      if (error == NULL || *error == NULL) /* else an earlier failure said why */
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "compile: output %u is NULL", i);
      return FALSE;
    }
    if (outputs[i]->graph != graph) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_GRAPH_MISMATCH,
                  "compile: output %u ('%s') belongs to another graph", i, outputs[i]->name);
      return FALSE;
    }
    if (qkv_value_is_retired(graph, outputs[i])) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "compile: output %u ('%s') was removed from the graph by a rollback", i,
                  outputs[i]->name);
      return FALSE;
    }
  }
  return TRUE;
}

static void
compile_state_init(CompileState *cs, QkvGraph *graph, QkvValue *const *outputs, guint n_outputs,
                   const QkvPlanOptions *opts)
{
  cs->graph = graph;
  cs->outputs = outputs;
  cs->n_outputs = n_outputs;
  cs->n_values = graph->values->len;
  cs->n_nodes = graph->nodes->len;

  QkvPlan *plan = cs->plan = g_new0(QkvPlan, 1);
  /* a plan reads its graph's nodes when it binds and runs */
  plan->graph = qkv_graph_ref(graph);
  plan->ref_count = 1;
  plan->options = *opts;
  plan->n_threads = opts->n_threads > 0 ? opts->n_threads : qkv_get_num_threads();
  /* room for a later qkv_plan_set_n_threads() up to the machine's cores */
  plan->max_threads = MAX(plan->n_threads, (gint)g_get_num_processors());
  plan->seed = opts->seed;

  cs->last_use = g_new(gint, cs->n_values);
  for (guint i = 0; i < cs->n_values; i++)
    cs->last_use[i] = -1;
  cs->needed = g_new0(gboolean, cs->n_values);
  cs->node_needed = g_new0(gboolean, cs->n_nodes);
}

/* Frees what the phases shared; the plan is the caller's. */
static void
compile_state_clear(CompileState *cs)
{
  g_free(cs->node_needed);
  g_free(cs->needed);
  g_free(cs->last_use);
}

static void
keep_to_the_end(CompileState *cs, const QkvValue *v)
{
  cs->needed[v->id] = TRUE;
  cs->last_use[v->id] = G_MAXINT;
}

/* The roots: the requested outputs and, unless the options skip them, the
 * parameters' gradients. */
static void
mark_roots(CompileState *cs)
{
  QkvGraph *graph = cs->graph;
  QkvPlan *plan = cs->plan;
  for (guint i = 0; i < cs->n_outputs; i++)
    keep_to_the_end(cs, cs->outputs[i]);
  if (plan->options.skip_param_grads || graph->param_grads->len == 0)
    return;
  plan->n_param_grads = graph->param_grads->len;
  plan->param_grads = g_new0(ParamGrad, plan->n_param_grads);
  plan->grad_stores = g_new0(QkvParams *, plan->n_param_grads);
  for (guint i = 0; i < graph->param_grads->len; i++) {
    QkvValue *pv = g_ptr_array_index(graph->param_grads, i);
    QkvValue *gv = g_hash_table_lookup(graph->grads, pv);
    plan->param_grads[i].param = pv->param;
    plan->param_grads[i].grad = gv;
    keep_to_the_end(cs, gv);
    gboolean seen = FALSE;
    for (guint j = 0; j < plan->n_grad_stores; j++)
      seen |= plan->grad_stores[j] == pv->params;
    if (!seen)
      plan->grad_stores[plan->n_grad_stores++] = pv->params;
  }
}

/* A node that computes a parameter's gradient writes it straight into the
 * store: no arena space, no copy after the run. (A value that is the
 * gradient of two parameters goes to the first; the other gets a copy.) */
static void
route_grads_to_store(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  plan->value_external = g_new0(gpointer, cs->n_values);
  for (guint i = 0; i < plan->n_param_grads && !plan->options.no_memory_reuse; i++) {
    QkvValue *gv = plan->param_grads[i].grad;
    if (gv->kind == QKV_VALUE_OP && plan->value_external[gv->id] == NULL)
      plan->value_external[gv->id] = qkv_tensor_data(qkv_param_grad(plan->param_grads[i].param));
  }
}

/* Walk back from the roots to the nodes they need; those become the steps,
 * in the graph's creation order (which is topological). */
static void
prune_and_order(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  guint n_steps = 0;
  for (guint n = cs->n_nodes; n-- > 0;) {
    QkvNode *node = g_ptr_array_index(cs->graph->nodes, n);
    gboolean any = FALSE;
    for (guint o = 0; o < node->n_outputs; o++)
      any |= cs->needed[node->outputs[o]->id];
    if (!any)
      continue;
    cs->node_needed[n] = TRUE;
    n_steps++;
    for (guint i = 0; i < node->n_inputs; i++)
      cs->needed[node->inputs[i]->id] = TRUE;
  }
  plan->n_steps = n_steps;
  plan->steps = g_new0(Step, MAX(n_steps, 1));
  guint s = 0;
  for (guint n = 0; n < cs->n_nodes; n++)
    if (cs->node_needed[n])
      plan->steps[s++].node = g_ptr_array_index(cs->graph->nodes, n);
}

/* bf16_activations: the values kept as bfloat16. Output o of a step whose
 * op allows it (bf16_outputs), when every step that reads the value allows
 * it at that input (bf16_inputs), the value is f32 and in the arena, and no
 * caller sees it (a requested output, a parameter's gradient, which is
 * copied into the store when it is not written there). */
static void
choose_bf16_values(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  plan->value_bf16 = g_new0(gboolean, MAX(cs->n_values, 1));
  if (!plan->options.bf16_activations)
    return;
  for (guint s = 0; s < plan->n_steps; s++) {
    const QkvNode *node = plan->steps[s].node;
    for (guint o = 0; o < node->n_outputs && o < 32; o++) {
      const QkvValue *v = node->outputs[o];
      if ((node->op->bf16_outputs >> o & 1) && v->dtype == QKV_F32 &&
          plan->value_external[v->id] == NULL)
        plan->value_bf16[v->id] = TRUE;
    }
  }
  for (guint i = 0; i < cs->n_outputs; i++)
    plan->value_bf16[cs->outputs[i]->id] = FALSE;
  for (guint i = 0; i < plan->n_param_grads; i++)
    plan->value_bf16[plan->param_grads[i].grad->id] = FALSE;
  for (guint s = 0; s < plan->n_steps; s++) {
    const QkvNode *node = plan->steps[s].node;
    for (guint i = 0; i < node->n_inputs; i++)
      if (i >= 32 || !(node->op->bf16_inputs >> i & 1))
        plan->value_bf16[node->inputs[i]->id] = FALSE;
  }
}

QkvDType
qkv_plan_value_dtype(const QkvPlan *plan, const QkvValue *v)
{
  return plan->value_bf16 != NULL && plan->value_bf16[v->id] ? QKV_BF16 : v->dtype;
}

/* Liveness: the last step that reads each value (without memory reuse,
 * every value lives to the end). */
static void
find_last_uses(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  for (guint s = 0; s < plan->n_steps; s++) {
    QkvNode *node = plan->steps[s].node;
    for (guint i = 0; i < node->n_inputs; i++) {
      QkvValue *in = node->inputs[i];
      if (cs->last_use[in->id] != G_MAXINT)
        cs->last_use[in->id] = MAX(cs->last_use[in->id], (gint)s);
    }
  }
  if (plan->options.no_memory_reuse)
    for (guint i = 0; i < cs->n_values; i++)
      cs->last_use[i] = G_MAXINT;
}

/* One binding per graph input; steps that read it register a patch. */
static void
make_bindings(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  plan->n_bindings = cs->graph->inputs->len;
  plan->bindings = g_new0(Binding, MAX(plan->n_bindings, 1));
  for (guint i = 0; i < plan->n_bindings; i++) {
    plan->bindings[i].value = g_ptr_array_index(cs->graph->inputs, i);
    plan->bindings[i].needed = cs->needed[plan->bindings[i].value->id];
    plan->bindings[i].patches = g_array_new(FALSE, FALSE, sizeof(Patch));
  }
}

static gint
binding_index(QkvPlan *plan, QkvValue *v)
{
  for (guint i = 0; i < plan->n_bindings; i++)
    if (plan->bindings[i].value == v)
      return (gint)i;
  return -1;
}

/* Step s's kernel context: views of its inputs and outputs at their final
 * addresses, its scratch memory, its attributes. */
static void
build_step(QkvPlan *plan, guint s)
{
  Step *st = &plan->steps[s];
  QkvNode *node = st->node;
  st->in = g_new0(QkvView, MAX(node->n_inputs, 1));
  st->out = g_new0(QkvView, node->n_outputs);
  for (guint i = 0; i < node->n_inputs; i++) {
    QkvValue *in = node->inputs[i];
    st->in[i].shape = in->shape;
    st->in[i].dtype = qkv_plan_value_dtype(plan, in);
    st->in[i].data = qkv_plan_value_pointer(plan, in);
    if (in->kind == QKV_VALUE_INPUT) {
      Patch p = {s, i};
      g_array_append_val(plan->bindings[binding_index(plan, in)].patches, p);
    }
  }
  for (guint o = 0; o < node->n_outputs; o++) {
    st->out[o].shape = node->outputs[o]->shape;
    st->out[o].dtype = qkv_plan_value_dtype(plan, node->outputs[o]);
    st->out[o].data = qkv_plan_value_pointer(plan, node->outputs[o]);
  }
  st->ctx.op_name = node->op->name;
  st->ctx.node_name = node->name;
  st->ctx.n_inputs = node->n_inputs;
  st->ctx.n_outputs = node->n_outputs;
  st->ctx.in = st->in;
  st->ctx.out = st->out;
  st->ctx.attrs = node->attrs;
  st->ctx.scratch = plan->step_scratch[s] ? plan->arena + st->scratch_offset : NULL;
  st->ctx.scratch_size = plan->step_scratch[s];
  st->ctx.training = plan->options.training;
  st->ctx.node_id = node->id;
  st->ctx.reserved[QKV_KERNEL_CTX_FAILURE_SLOT] = &plan->kernel_failure;
}

/* The buffers that variable shapes need (see reshape_steps in execute.c),
 * starting from the compiled shapes. */
static void
prepare_shapes(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  guint max_inputs = 1;
  plan->value_shape = g_new(QkvShape, MAX(cs->n_values, 1));
  for (guint i = 0; i < cs->n_values; i++)
    plan->value_shape[i] = ((QkvValue *)g_ptr_array_index(cs->graph->values, i))->shape;
  for (guint s = 0; s < plan->n_steps; s++)
    max_inputs = MAX(max_inputs, plan->steps[s].node->n_inputs);
  plan->rule_in_shapes = g_new0(QkvShape, max_inputs);
  plan->rule_in_dtypes = g_new0(QkvDType, max_inputs);
  for (guint i = 0; i < plan->n_bindings; i++)
    plan->bindings[i].shape = plan->bindings[i].value->shape;
}

/* The requested outputs as tensors that borrow plan memory. */
static void
bind_outputs(CompileState *cs)
{
  QkvPlan *plan = cs->plan;
  plan->n_outputs = cs->n_outputs;
  plan->output_values = g_new0(QkvValue *, MAX(cs->n_outputs, 1));
  plan->outputs = g_new0(QkvTensor *, MAX(cs->n_outputs, 1));
  for (guint i = 0; i < cs->n_outputs; i++) {
    QkvValue *v = cs->outputs[i];
    plan->output_values[i] = v;
    plan->outputs[i] = qkv_tensor_new_view(v->dtype, &v->shape, qkv_plan_value_pointer(plan, v));
  }
}

QkvPlan *
qkv_graph_compile(QkvGraph *graph, QkvValue *const *outputs, guint n_outputs,
                  const QkvPlanOptions *options, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL, NULL);
  g_return_val_if_fail(n_outputs == 0 || outputs != NULL, NULL);
  if (!check_outputs(graph, outputs, n_outputs, error))
    return NULL;
  QkvPlanOptions opts = options ? *options : qkv_plan_options_default();
  if (opts.precision != QKV_PRECISION_FP32 && opts.precision != QKV_PRECISION_BF16) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "compile: unknown precision %d (QKV_PRECISION_FP32 or QKV_PRECISION_BF16)",
                (gint)opts.precision);
    return NULL;
  }
  if (opts.bf16_activations && opts.precision != QKV_PRECISION_BF16) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "compile: bf16_activations needs precision QKV_PRECISION_BF16 (fp32 plans keep "
                "every activation in float32)");
    return NULL;
  }
  CompileState cs;
  compile_state_init(&cs, graph, outputs, n_outputs, &opts);
  mark_roots(&cs);
  route_grads_to_store(&cs);
  prune_and_order(&cs);
  gboolean ok =
      qkv_plan_states_alloc(cs.plan, error) && qkv_plan_order_state_writers(cs.plan, error);
  choose_bf16_values(&cs);
  find_last_uses(&cs);
  if (ok && qkv_arena_lay_out(cs.plan, cs.last_use, error)) {
    make_bindings(&cs);
    for (guint s = 0; s < cs.plan->n_steps; s++)
      build_step(cs.plan, s);
    prepare_shapes(&cs);
    bind_outputs(&cs);
  } else {
    g_clear_pointer(&cs.plan, qkv_plan_free);
  }
  QkvPlan *plan = cs.plan;
  compile_state_clear(&cs);
  return plan;
}

gboolean
qkv_plan_try_set_precision(QkvPlan *plan, QkvPrecision precision, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(plan != NULL, FALSE);
  /* a value a user passes (a --precision option): refused, never a critical */
  if (precision != QKV_PRECISION_FP32 && precision != QKV_PRECISION_BF16) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_plan_try_set_precision: precision %d is not a QkvPrecision "
                "(QKV_PRECISION_FP32 = %d or QKV_PRECISION_BF16 = %d)",
                (int)precision, (int)QKV_PRECISION_FP32, (int)QKV_PRECISION_BF16);
    return FALSE;
  }
  if (plan->options.bf16_activations && precision != QKV_PRECISION_BF16) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_plan_try_set_precision: the plan was compiled with bf16_activations (some "
                "activations are stored as bfloat16), so it runs in bf16 only; compile the graph "
                "again for fp32");
    return FALSE;
  }
  plan->options.precision = precision;
  return TRUE;
}

void
qkv_plan_set_precision(QkvPlan *plan, QkvPrecision precision)
{
  g_return_if_fail(plan != NULL);
  /* a bad value is a caller's bug here: loud, as g_return_if_fail was */
  g_autoptr(GError) error = NULL;
  if (!qkv_plan_try_set_precision(plan, precision, &error))
    g_critical("%s", error->message);
}

QkvPrecision
qkv_plan_get_precision(const QkvPlan *plan)
{
  g_return_val_if_fail(plan != NULL, QKV_PRECISION_FP32);
  return plan->options.precision;
}

void
qkv_plan_free(QkvPlan *plan)
{
  if (plan == NULL)
    return;
  /* a boxed reference (qkv_plan_ref()) may still hold it */
  if (!g_atomic_int_dec_and_test(&plan->ref_count))
    return;
  for (guint s = 0; s < plan->n_steps; s++) {
    g_free(plan->steps[s].in);
    g_free(plan->steps[s].out);
  }
  g_free(plan->steps);
  for (guint i = 0; i < plan->n_bindings; i++) {
    g_array_unref(plan->bindings[i].patches);
    qkv_tensor_free(plan->bindings[i].bound);
  }
  g_free(plan->bindings);
  for (guint i = 0; i < plan->n_outputs; i++)
    qkv_tensor_free(plan->outputs[i]);
  g_free(plan->outputs);
  g_free(plan->output_values);
  g_free(plan->param_grads);
  g_free(plan->grad_stores);
  qkv_plan_states_free(plan);
  g_free(plan->value_offset);
  g_free(plan->value_external);
  g_free(plan->value_bf16);
  g_free(plan->value_shape);
  g_free(plan->step_scratch);
  g_free(plan->rule_in_shapes);
  g_free(plan->rule_in_dtypes);
  qkv_aligned_free(plan->arena);
  g_clear_error(&plan->kernel_failure);
  qkv_graph_free(plan->graph);
  g_free(plan);
}
