/* autodiff.c: symbolic reverse mode. The gradient nodes are appended to the
 * same graph, so one plan holds forward and backward. */
#include "core/core-private.h"

#include <string.h>


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

/* Sum the contributions collected for one value; NULL if there are none. */
static QkvValue *
sum_contributions(GPtrArray *list, GError **error)
{
  if (list == NULL || list->len == 0)
    return NULL;
  QkvValue *total = g_ptr_array_index(list, 0);
  for (guint i = 1; i < list->len && total != NULL; i++)
    total = qkv_add(total, g_ptr_array_index(list, i), error);
  return total;
}

static void
add_contribution(GPtrArray **contrib, QkvValue *v, QkvValue *grad)
{
  if (contrib[v->id] == NULL)
    contrib[v->id] = g_ptr_array_new();
  g_ptr_array_add(contrib[v->id], grad);
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

/* Where a gradient reaching value v inside a decomposition goes: to the local
 * contributions of a value the decomposition added (those in [v0, v1)), or
 * to the node's input i that v is, if that input needs a gradient. Anything
 * else (constants) takes none. */
typedef struct {
  const QkvNode *node;
  const gboolean *needs;
  guint v0, v1;
  gboolean *wanted;     /* index v->id - v0: needs a gradient */
  GPtrArray **contrib;  /* index v->id - v0 */
  GPtrArray **to_input; /* index i */
} Decomposition;

static gboolean
decomposition_wants(const Decomposition *d, const QkvValue *v)
{
  if (v->id >= d->v0 && v->id < d->v1)
    return d->wanted[v->id - d->v0];
  for (guint i = 0; i < d->node->n_inputs; i++)
    if (d->node->inputs[i] == v && d->needs[i])
      return TRUE;
  return FALSE;
}

static void
append_gradient(GPtrArray **slot, QkvValue *grad)
{
  if (*slot == NULL)
    *slot = g_ptr_array_new();
  g_ptr_array_add(*slot, grad);
}

static void
decomposition_route(Decomposition *d, QkvValue *v, QkvValue *grad)
{
  if (v->id >= d->v0 && v->id < d->v1) {
    if (d->wanted[v->id - d->v0])
      append_gradient(&d->contrib[v->id - d->v0], grad);
    return;
  }
  /* An input used twice by the node: its whole gradient goes to the first
   * slot, which sums the same in the caller. */
  for (guint i = 0; i < d->node->n_inputs; i++) {
    if (d->node->inputs[i] == v && d->needs[i]) {
      append_gradient(&d->to_input[i], grad);
      return;
    }
  }
}

/* The gradient of a node whose op has no gradient rule but a decomposition:
 * build the decomposition in the graph, seed its outputs with the node's
 * output gradients, and run reverse accumulation over the nodes it added.
 * What reaches the node's inputs is their gradient. */
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

  const guint v1 = graph->values->len, n1 = graph->nodes->len;
  Decomposition d = {
      .node = node,
      .needs = needs,
      .v0 = v0,
      .v1 = v1,
      .wanted = g_new0(gboolean, MAX(v1 - v0, 1)),
      .contrib = g_new0(GPtrArray *, MAX(v1 - v0, 1)),
      .to_input = g_new0(GPtrArray *, MAX(node->n_inputs, 1)),
  };
  gboolean ok = TRUE;

  for (guint n = n0; n < n1; n++) {
    QkvNode *dn = g_ptr_array_index(graph->nodes, n);
    gboolean any = FALSE;
    for (guint i = 0; i < dn->n_inputs; i++)
      any |= decomposition_wants(&d, dn->inputs[i]) && input_differentiable(dn, i);
    for (guint o = 0; o < dn->n_outputs; o++)
      d.wanted[dn->outputs[o]->id - v0] = any && dn->outputs[o]->dtype == QKV_F32;
  }
  for (guint o = 0; o < node->n_outputs; o++)
    if (out_grads[o] != NULL)
      decomposition_route(&d, outs[o], out_grads[o]);

  for (guint n = n1; ok && n-- > n0;) {
    QkvNode *dn = g_ptr_array_index(graph->nodes, n);
    QkvValue *dn_out_grads[QKV_MAX_OUTPUTS] = {NULL};
    gboolean any_out = FALSE;
    for (guint o = 0; ok && o < dn->n_outputs; o++) {
      guint k = dn->outputs[o]->id - v0;
      if (!d.wanted[k] || d.contrib[k] == NULL)
        continue;
      dn_out_grads[o] = sum_contributions(d.contrib[k], error);
      ok = dn_out_grads[o] != NULL;
      any_out = TRUE;
    }
    if (!ok || !any_out)
      continue;
    gboolean *dn_needs = g_new0(gboolean, MAX(dn->n_inputs, 1));
    QkvValue **dn_in_grads = g_new0(QkvValue *, MAX(dn->n_inputs, 1));
    gboolean any_in = FALSE;
    for (guint i = 0; i < dn->n_inputs; i++) {
      dn_needs[i] = decomposition_wants(&d, dn->inputs[i]) && input_differentiable(dn, i);
      any_in |= dn_needs[i];
    }
    if (any_in) {
      if (dn->op->gradient == NULL && dn->op->decompose == NULL) {
        g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                    "backward: op '%s' (node %s, in the decomposition of op '%s' node %s) has "
                    "no gradient rule",
                    dn->op->name, dn->name, node->op->name, node->name);
        ok = FALSE;
      } else {
        ok = node_gradient(graph, dn, dn_out_grads, dn_needs, dn_in_grads, depth + 1, error);
      }
      for (guint i = 0; ok && i < dn->n_inputs; i++) {
        if (!dn_needs[i] || dn_in_grads[i] == NULL)
          continue;
        ok = check_input_gradient(graph, dn, i, dn_in_grads[i], error);
        if (ok)
          decomposition_route(&d, dn->inputs[i], dn_in_grads[i]);
      }
    }
    g_free(dn_in_grads);
    g_free(dn_needs);
  }

  for (guint i = 0; ok && i < node->n_inputs; i++) {
    in_grads[i] = sum_contributions(d.to_input[i], error);
    ok = d.to_input[i] == NULL || in_grads[i] != NULL;
  }

  for (guint k = 0; k < v1 - v0; k++)
    if (d.contrib[k] != NULL)
      g_ptr_array_unref(d.contrib[k]);
  for (guint i = 0; i < node->n_inputs; i++)
    if (d.to_input[i] != NULL)
      g_ptr_array_unref(d.to_input[i]);
  g_free(d.to_input);
  g_free(d.contrib);
  g_free(d.wanted);
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

gboolean
qkv_graph_backward(QkvGraph *graph, QkvValue *loss, GError **error)
{
  g_return_val_if_fail(graph != NULL, FALSE);
  if (!qkv_values_present("backward", &loss, 1, error))
    return FALSE;
  if (loss->graph != graph) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_GRAPH_MISMATCH,
                "backward: the loss '%s' belongs to another graph", loss->name);
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

  const guint n_values = graph->values->len, n_nodes = graph->nodes->len;
  gboolean *wants_grad = g_new0(gboolean, n_values);
  gboolean *reaches = g_new0(gboolean, n_values);
  GPtrArray **contrib = g_new0(GPtrArray *, n_values);
  gboolean ok = TRUE;

  for (guint i = 0; i < n_values; i++)
    wants_grad[i] = is_grad_source(g_ptr_array_index(graph->values, i));
  for (guint n = 0; n < n_nodes; n++) {
    QkvNode *node = g_ptr_array_index(graph->nodes, n);
    gboolean any = FALSE;
    for (guint i = 0; i < node->n_inputs; i++)
      any |= wants_grad[node->inputs[i]->id] && input_differentiable(node, i);
    for (guint o = 0; o < node->n_outputs; o++)
      wants_grad[node->outputs[o]->id] = any && node->outputs[o]->dtype == QKV_F32;
  }
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

  if (wants_grad[loss->id]) {
    g_autoptr(QkvTensor) ones = qkv_tensor_new(QKV_F32, &loss->shape);
    qkv_tensor_fill(ones, 1.0);
    add_contribution(contrib, loss, qkv_graph_constant(graph, ones, NULL));
  }

  for (guint n = n_nodes; ok && n-- > 0;) {
    QkvNode *node = g_ptr_array_index(graph->nodes, n);
    QkvValue *out_grads[QKV_MAX_OUTPUTS] = {NULL};
    gboolean any_out = FALSE;
    for (guint o = 0; ok && o < node->n_outputs; o++) {
      QkvValue *v = node->outputs[o];
      if (!wants_grad[v->id] || contrib[v->id] == NULL)
        continue;
      out_grads[o] = sum_contributions(contrib[v->id], error);
      ok = out_grads[o] != NULL;
      any_out = TRUE;
    }
    if (!ok || !any_out)
      continue;
    /* heap, not alloca: this loop runs once per node of graphs of any size */
    g_autofree gboolean *needs = g_new0(gboolean, MAX(node->n_inputs, 1));
    gboolean any_in = FALSE;
    for (guint i = 0; i < node->n_inputs; i++) {
      needs[i] = wants_grad[node->inputs[i]->id] && input_differentiable(node, i);
      any_in |= needs[i];
    }
    if (!any_in)
      continue;
    if (node->op->gradient == NULL && node->op->decompose == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                  "backward: op '%s' (node %s) has no gradient rule, but the loss '%s' depends "
                  "on it",
                  node->op->name, node->name, loss->name);
      ok = FALSE;
      break;
    }
    g_autofree QkvValue **in_grads = g_new0(QkvValue *, MAX(node->n_inputs, 1));
    if (!node_gradient(graph, node, out_grads, needs, in_grads, 0, error)) {
      ok = FALSE;
      break;
    }
    for (guint i = 0; ok && i < node->n_inputs; i++) {
      if (!needs[i] || in_grads[i] == NULL)
        continue;
      ok = check_input_gradient(graph, node, i, in_grads[i], error);
      if (ok)
        add_contribution(contrib, node->inputs[i], in_grads[i]);
    }
  }

  GPtrArray *param_grads = g_ptr_array_new();
  GHashTable *grads = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; ok && i < n_values; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (!is_grad_source(v) || !reaches[i])
      continue;
    QkvValue *grad = sum_contributions(contrib[i], error);
    if (contrib[i] != NULL && grad == NULL) {
      ok = FALSE;
      break;
    }
    if (grad == NULL)
      continue;
    g_hash_table_insert(grads, v, grad);
    if (v->kind == QKV_VALUE_PARAM)
      g_ptr_array_add(param_grads, v);
  }

  if (ok) {
    GHashTableIter iter;
    gpointer k, val;
    g_hash_table_iter_init(&iter, grads);
    while (g_hash_table_iter_next(&iter, &k, &val))
      g_hash_table_insert(graph->grads, k, val);
    for (guint i = 0; i < param_grads->len; i++)
      g_ptr_array_add(graph->param_grads, g_ptr_array_index(param_grads, i));
    graph->has_backward = TRUE;
    graph->backward_loss = loss;
  } else {
    qkv_graph_truncate(graph, n_values, n_nodes);
  }
  g_hash_table_unref(grads);
  g_ptr_array_unref(param_grads);
  for (guint i = 0; i < n_values; i++)
    if (contrib[i] != NULL)
      g_ptr_array_unref(contrib[i]);
  g_free(contrib);
  g_free(reaches);
  g_free(wants_grad);
  return ok;
}

QkvValue *
qkv_graph_gradient(QkvGraph *graph, QkvValue *value)
{
  g_return_val_if_fail(graph != NULL && value != NULL, NULL);
  return g_hash_table_lookup(graph->grads, value);
}
