/* autodiff.c: symbolic reverse mode. The gradient nodes are appended to the
 * same graph, so one plan holds forward and backward. */
#include "core/core-private.h"

#include <string.h>
#include "error-private.h"

static gboolean
is_grad_source(const QkvValue *v)
{
  if (v->dtype != QKV_F32)
    return FALSE;
  if (v->kind == QKV_VALUE_PARAM)
    return !qkv_param_get_frozen(v->param);
  if (v->kind == QKV_VALUE_INPUT)
    return v->requires_grad;
  return FALSE;
}

static gboolean
input_differentiable(const QkvNode *node, guint i)
{
  if (node->inputs[i]->dtype != QKV_F32)
    return FALSE;
  return i >= 64 || !(node->op->no_grad_inputs & (G_GUINT64_CONSTANT(1) << i));
}

/* Sum the contributions collected for one value; NULL if there are none.
 * The sum is the registered op "add", called by name so that the core does
 * not link against ops/. */
static QkvValue *
sum_contributions(GPtrArray *list, GError **error)
{
  if (list == NULL || list->len == 0)
    return NULL;
  QkvValue *total = g_ptr_array_index(list, 0);
  for (guint i = 1; i < list->len && total != NULL; i++) {
    QkvValue *terms[] = {total, g_ptr_array_index(list, i)};
    total = qkv_graph_op(total->graph, "add", terms, 2, NULL, error);
  }
  return total;
}

static void
append_gradient(GPtrArray **slot, QkvValue *grad)
{
  if (*slot == NULL)
    *slot = g_ptr_array_new();
  g_ptr_array_add(*slot, grad);
}

/* A gradient rule (or a decomposition) must give input i an f32 gradient of
 * the input's shape, in this graph. */
static gboolean
check_input_gradient(QkvGraph *graph, const QkvNode *node, guint i, const QkvValue *grad,
                     GError **error)
{
  const QkvValue *in = node->inputs[i];
  if (grad->graph == graph && qkv_shape_equal(&grad->shape, &in->shape) && grad->dtype == QKV_F32)
    return TRUE;
  g_autofree gchar *want = qkv_shape_to_string(&in->shape);
  g_autofree gchar *got = qkv_shape_to_string(&grad->shape);
  g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
              "backward: the gradient rule of op '%s' (node %s) gave input %u a gradient "
              "of shape %s, expected f32%s",
              node->op->name, node->name, i, got, want);
  return FALSE;
}

/* Decompositions may use ops that decompose in turn; this bounds a
 * decomposition that (directly or not) uses its own op. */
#define MAX_DECOMPOSE_DEPTH 8

static gboolean node_gradient(QkvGraph *graph, QkvNode *node, QkvValue *const *out_grads,
                              const gboolean *needs, QkvValue **in_grads, guint depth,
                              GError **error);

/* One reverse-mode sweep over the nodes [n0, n1) of a graph. Gradients that
 * reach a value of [v0, v1) which needs one are collected as contributions,
 * summed when the sweep gets to the node that produced the value, and pushed
 * through that node's gradient rule (or decomposition) to its inputs.
 *
 * qkv_graph_backward() sweeps the whole graph, from the loss. The gradient
 * of a decomposed node sweeps the nodes its decomposition added: there a
 * gradient that reaches one of the decomposed node's inputs (which lie
 * before v0) goes to to_input, if that input needs one; anything else
 * outside [v0, v1) (constants) takes none. */
typedef struct {
  QkvGraph *graph;
  guint v0, v1, n0, n1;
  guint depth;          /* passed to node_gradient: decompositions nested so far */
  gboolean *wanted;     /* index v->id - v0: needs a gradient */
  GPtrArray **contrib;  /* index v->id - v0 */
  const QkvValue *loss; /* the whole graph's sweep: named when a rule is missing */
  /* a decomposition's sweep: the decomposed node, and its inputs' share */
  const QkvNode *node;
  const gboolean *needs;
  GPtrArray **to_input; /* index i */
} Sweep;

static void
sweep_init(Sweep *sw, QkvGraph *graph, guint v0, guint n0, guint depth)
{
  memset(sw, 0, sizeof *sw);
  sw->graph = graph;
  sw->v0 = v0;
  sw->v1 = graph->values->len;
  sw->n0 = n0;
  sw->n1 = graph->nodes->len;
  sw->depth = depth;
  sw->wanted = g_new0(gboolean, MAX(sw->v1 - v0, 1));
  sw->contrib = g_new0(GPtrArray *, MAX(sw->v1 - v0, 1));
}

static void
sweep_clear(Sweep *sw)
{
  for (guint k = 0; k < sw->v1 - sw->v0; k++)
    if (sw->contrib[k] != NULL)
      g_ptr_array_unref(sw->contrib[k]);
  for (guint i = 0; sw->to_input != NULL && i < sw->node->n_inputs; i++)
    if (sw->to_input[i] != NULL)
      g_ptr_array_unref(sw->to_input[i]);
  g_free(sw->to_input);
  g_free(sw->contrib);
  g_free(sw->wanted);
}

static gboolean
sweep_wants(const Sweep *sw, const QkvValue *v)
{
  if (v->id >= sw->v0 && v->id < sw->v1)
    return sw->wanted[v->id - sw->v0];
  for (guint i = 0; sw->node != NULL && i < sw->node->n_inputs; i++)
    if (sw->node->inputs[i] == v && sw->needs[i])
      return TRUE;
  return FALSE;
}

static void
sweep_route(Sweep *sw, QkvValue *v, QkvValue *grad)
{
  if (v->id >= sw->v0 && v->id < sw->v1) {
    if (sw->wanted[v->id - sw->v0])
      append_gradient(&sw->contrib[v->id - sw->v0], grad);
    return;
  }
  /* An input used twice by the decomposed node: its whole gradient goes to
   * the first slot, which sums the same in the caller. */
  for (guint i = 0; sw->node != NULL && i < sw->node->n_inputs; i++) {
    if (sw->node->inputs[i] == v && sw->needs[i]) {
      append_gradient(&sw->to_input[i], grad);
      return;
    }
  }
}

/* Forward over the swept nodes: an f32 output needs a gradient when a
 * differentiable input does (the sources are marked before). */
static void
sweep_mark_wanted(Sweep *sw)
{
  for (guint n = sw->n0; n < sw->n1; n++) {
    QkvNode *node = g_ptr_array_index(sw->graph->nodes, n);
    gboolean any = FALSE;
    for (guint i = 0; i < node->n_inputs; i++)
      any |= sweep_wants(sw, node->inputs[i]) && input_differentiable(node, i);
    for (guint o = 0; o < node->n_outputs; o++)
      sw->wanted[node->outputs[o]->id - sw->v0] = any && node->outputs[o]->dtype == QKV_F32;
  }
}

static void
sweep_no_rule_error(const Sweep *sw, const QkvNode *node, GError **error)
{
  if (sw->node == NULL)
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "backward: op '%s' (node %s) has no gradient rule, but the loss '%s' depends "
                "on it",
                node->op->name, node->name, sw->loss->name);
  else
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "backward: op '%s' (node %s, in the decomposition of op '%s' node %s) has "
                "no gradient rule",
                node->op->name, node->name, sw->node->op->name, sw->node->name);
}

/* One node of the sweep: sum its outputs' contributions, and if any input
 * needs a gradient, get them from the node's rule and route them on. */
static gboolean
sweep_node(Sweep *sw, QkvNode *node, GError **error)
{
  QkvValue *out_grads[QKV_MAX_OUTPUTS] = {NULL};
  gboolean any_out = FALSE;
  for (guint o = 0; o < node->n_outputs; o++) {
    guint k = node->outputs[o]->id - sw->v0;
    if (!sw->wanted[k] || sw->contrib[k] == NULL)
      continue;
    out_grads[o] = sum_contributions(sw->contrib[k], error);
    if (out_grads[o] == NULL)
      return FALSE;
    any_out = TRUE;
  }
  if (!any_out)
    return TRUE;
  /* heap, not alloca: this runs once per node of graphs of any size */
  g_autofree gboolean *needs = g_new0(gboolean, MAX(node->n_inputs, 1));
  gboolean any_in = FALSE;
  for (guint i = 0; i < node->n_inputs; i++) {
    needs[i] = sweep_wants(sw, node->inputs[i]) && input_differentiable(node, i);
    any_in |= needs[i];
  }
  if (!any_in)
    return TRUE;
  if (node->op->gradient == NULL && node->op->decompose == NULL) {
    sweep_no_rule_error(sw, node, error);
    return FALSE;
  }
  g_autofree QkvValue **in_grads = g_new0(QkvValue *, MAX(node->n_inputs, 1));
  if (!node_gradient(sw->graph, node, out_grads, needs, in_grads, sw->depth, error))
    return FALSE;
  for (guint i = 0; i < node->n_inputs; i++) {
    if (!needs[i] || in_grads[i] == NULL)
      continue;
    if (!check_input_gradient(sw->graph, node, i, in_grads[i], error))
      return FALSE;
    sweep_route(sw, node->inputs[i], in_grads[i]);
  }
  return TRUE;
}

/* The sweep proper: the nodes in reverse creation order. */
static gboolean
reverse_sweep(Sweep *sw, GError **error)
{
  for (guint n = sw->n1; n-- > sw->n0;)
    if (!sweep_node(sw, g_ptr_array_index(sw->graph->nodes, n), error))
      return FALSE;
  return TRUE;
}

/* Run the node's decomposition, which adds its nodes to the graph and
 * gives the values standing for the node's outputs; check those that carry
 * a gradient against the outputs they stand for. */
static gboolean
decompose_node(QkvGraph *graph, QkvNode *node, QkvValue *const *out_grads, QkvValue **outs,
               GError **error)
{
  QkvDecomposeCtx ctx = {
      .graph = graph,
      .node = node,
      .attrs = node->attrs,
      .n_inputs = node->n_inputs,
      .n_outputs = node->n_outputs,
      .inputs = node->inputs,
      .outputs = outs,
  };
  GError *rule_error = NULL;
  if (!node->op->decompose(&ctx, &rule_error)) {
    if (rule_error == NULL)
      g_set_error(&rule_error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                  "backward: the decomposition of op '%s' (node %s) failed", node->op->name,
                  node->name);
    else
      g_prefix_error(&rule_error, "backward: decomposing op '%s' (node %s): ", node->op->name,
                     node->name);
    g_propagate_error(error, rule_error);
    return FALSE;
  }
  for (guint o = 0; o < node->n_outputs; o++) {
    if (out_grads[o] == NULL)
      continue;
    const QkvValue *out = node->outputs[o];
    if (outs[o] == NULL || outs[o]->graph != graph || outs[o]->dtype != out->dtype ||
        !qkv_shape_equal(&outs[o]->shape, &out->shape)) {
      g_autofree gchar *want = qkv_shape_to_string(&out->shape);
      g_autofree gchar *got = outs[o] ? qkv_shape_to_string(&outs[o]->shape) : NULL;
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "backward: the decomposition of op '%s' (node %s) gave output %u %s%s, "
                  "expected %s%s",
                  node->op->name, node->name, o, outs[o] ? "a value of shape " : "no value",
                  got ? got : "", qkv_dtype_name(out->dtype), want);
      return FALSE;
    }
  }
  return TRUE;
}

/* The gradient of a node whose op has no gradient rule but a decomposition:
 * build the decomposition in the graph, seed its outputs with the node's
 * output gradients, and sweep back over the nodes it added. What reaches
 * the node's inputs is their gradient. */
static gboolean
decomposition_gradient(QkvGraph *graph, QkvNode *node, QkvValue *const *out_grads,
                       const gboolean *needs, QkvValue **in_grads, guint depth, GError **error)
{
  if (depth >= MAX_DECOMPOSE_DEPTH) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "backward: the decomposition of op '%s' (node %s) nests more than %d deep",
                node->op->name, node->name, MAX_DECOMPOSE_DEPTH);
    return FALSE;
  }
  const guint v0 = graph->values->len, n0 = graph->nodes->len;
  QkvValue *outs[QKV_MAX_OUTPUTS] = {NULL};
  if (!decompose_node(graph, node, out_grads, outs, error))
    return FALSE;

  Sweep sw;
  sweep_init(&sw, graph, v0, n0, depth + 1);
  sw.node = node;
  sw.needs = needs;
  sw.to_input = g_new0(GPtrArray *, MAX(node->n_inputs, 1));
  sweep_mark_wanted(&sw);
  for (guint o = 0; o < node->n_outputs; o++)
    if (out_grads[o] != NULL)
      sweep_route(&sw, outs[o], out_grads[o]);
  gboolean ok = reverse_sweep(&sw, error);
  for (guint i = 0; ok && i < node->n_inputs; i++) {
    in_grads[i] = sum_contributions(sw.to_input[i], error);
    ok = sw.to_input[i] == NULL || in_grads[i] != NULL;
  }
  sweep_clear(&sw);
  return ok;
}

/* Fill in_grads for the inputs with needs[i], from the op's gradient rule or,
 * when it has none, its decomposition. */
static gboolean
node_gradient(QkvGraph *graph, QkvNode *node, QkvValue *const *out_grads, const gboolean *needs,
              QkvValue **in_grads, guint depth, GError **error)
{
  if (node->op->gradient == NULL)
    return decomposition_gradient(graph, node, out_grads, needs, in_grads, depth, error);
  QkvGradCtx ctx = {
      .graph = graph,
      .node = node,
      .attrs = node->attrs,
      .n_inputs = node->n_inputs,
      .n_outputs = node->n_outputs,
      .inputs = node->inputs,
      .outputs = node->outputs,
      .out_grads = out_grads,
      .needs_grad = needs,
      .in_grads = in_grads,
  };
  GError *rule_error = NULL;
  if (!node->op->gradient(&ctx, &rule_error)) {
    if (rule_error == NULL)
      g_set_error(&rule_error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                  "backward: the gradient rule of op '%s' (node %s) failed", node->op->name,
                  node->name);
    else
      g_prefix_error(&rule_error, "backward through op '%s' (node %s): ", node->op->name,
                     node->name);
    g_propagate_error(error, rule_error);
    return FALSE;
  }
  return TRUE;
}

/* The loss must be in the graph, a single f32 element, and the graph must
 * not have a backward pass yet. */
static gboolean
check_loss(QkvGraph *graph, QkvValue *loss, GError **error)
{
  if (!qkv_values_present("backward", &loss, 1, error))
    return FALSE;
  if (loss->graph != graph) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_GRAPH_MISMATCH,
                "backward: the loss '%s' belongs to another graph", loss->name);
    return FALSE;
  }
  if (qkv_value_is_retired(graph, loss)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "backward: the loss '%s' was removed from the graph by a rollback", loss->name);
    return FALSE;
  }
  if (graph->has_backward) {
    /* One set of gradient nodes per graph: qkv_graph_gradient() and the
     * parameters' gradient buffers have room for one loss's gradients. */
    const gchar *first = graph->backward_loss ? graph->backward_loss->name : "?";
    if (graph->backward_loss == loss)
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "backward: the graph already has the gradients of the loss '%s'; "
                  "qkv_graph_backward() is called once per graph",
                  first);
    else
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "backward: the graph already has the gradients of the loss '%s', so it "
                  "cannot take those of a second loss '%s'; add the losses (qkv_add) and call "
                  "qkv_graph_backward() once, or build a second graph for the second loss",
                  first, loss->name);
    return FALSE;
  }
  if (loss->dtype != QKV_F32 || qkv_shape_numel(&loss->shape) != 1) {
    g_autofree gchar *sh = qkv_shape_to_string(&loss->shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "backward: the loss '%s' must be a single f32 element, it is %s%s", loss->name,
                qkv_dtype_name(loss->dtype), sh);
    return FALSE;
  }
  return TRUE;
}

/* Per value id (of the first n_values): whether the loss depends on it. */
static gboolean *
values_reaching(QkvGraph *graph, const QkvValue *loss, guint n_values, guint n_nodes)
{
  gboolean *reaches = g_new0(gboolean, n_values);
  reaches[loss->id] = TRUE;
  for (guint n = n_nodes; n-- > 0;) {
    QkvNode *node = g_ptr_array_index(graph->nodes, n);
    gboolean any = FALSE;
    for (guint o = 0; o < node->n_outputs; o++)
      any |= reaches[node->outputs[o]->id];
    if (any)
      for (guint i = 0; i < node->n_inputs; i++)
        reaches[node->inputs[i]->id] = TRUE;
  }
  return reaches;
}

/* Sum what the sweep collected for each gradient source the loss depends
 * on and record those gradients in the graph; the graph's gradient table is
 * only touched when every sum could be built. */
static gboolean
publish_gradients(Sweep *sw, const gboolean *reaches, QkvValue *loss, GError **error)
{
  QkvGraph *graph = sw->graph;
  g_autoptr(GPtrArray) param_grads = g_ptr_array_new();
  g_autoptr(GHashTable) grads = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; i < sw->v1; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (!is_grad_source(v) || !reaches[i])
      continue;
    QkvValue *grad = sum_contributions(sw->contrib[i], error);
    if (sw->contrib[i] != NULL && grad == NULL)
      return FALSE;
    if (grad == NULL)
      continue;
    g_hash_table_insert(grads, v, grad);
    if (v->kind == QKV_VALUE_PARAM)
      g_ptr_array_add(param_grads, v);
  }
  GHashTableIter iter;
  gpointer k, val;
  g_hash_table_iter_init(&iter, grads);
  while (g_hash_table_iter_next(&iter, &k, &val))
    g_hash_table_insert(graph->grads, k, val);
  for (guint i = 0; i < param_grads->len; i++)
    g_ptr_array_add(graph->param_grads, g_ptr_array_index(param_grads, i));
  graph->has_backward = TRUE;
  graph->backward_loss = loss;
  return TRUE;
}

gboolean
qkv_graph_backward(QkvGraph *graph, QkvValue *loss, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(graph != NULL, FALSE);
  if (!check_loss(graph, loss, error))
    return FALSE;

  const guint n_values = graph->values->len, n_nodes = graph->nodes->len;
  Sweep sw;
  sweep_init(&sw, graph, 0, 0, 0);
  sw.loss = loss;
  for (guint i = 0; i < n_values; i++)
    sw.wanted[i] = is_grad_source(g_ptr_array_index(graph->values, i));
  sweep_mark_wanted(&sw);
  gboolean *reaches = values_reaching(graph, loss, n_values, n_nodes);

  if (sw.wanted[loss->id]) {
    g_autoptr(QkvTensor) ones = qkv_tensor_new(QKV_F32, &loss->shape);
    qkv_tensor_fill(ones, 1.0);
    sweep_route(&sw, loss, qkv_graph_constant(graph, ones, NULL));
  }
  gboolean ok = reverse_sweep(&sw, error) && publish_gradients(&sw, reaches, loss, error);
  if (!ok)
    qkv_graph_truncate(graph, n_values, n_nodes);
  g_free(reaches);
  sweep_clear(&sw);
  return ok;
}

QkvValue *
qkv_graph_gradient(QkvGraph *graph, QkvValue *value)
{
  g_return_val_if_fail(graph != NULL && value != NULL, NULL);
  return g_hash_table_lookup(graph->grads, value);
}
