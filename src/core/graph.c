/* graph.c: graphs, values and nodes; listing and DOT export. */
#include "core/core-private.h"

#include <string.h>
#include "error-private.h"

static void
value_free(gpointer data)
{
  QkvValue *v = data;
  g_free(v->name);
  qkv_tensor_free(v->constant);
  g_free(v);
}

static void
node_free(gpointer data)
{
  QkvNode *n = data;
  g_free(n->name);
  g_free(n->inputs);
  qkv_attrs_free(n->attrs);
  g_free(n);
}

QkvGraph *
qkv_graph_new(void)
{
  qkv_init();
  QkvGraph *g = g_new0(QkvGraph, 1);
  g->ref_count = 1;
  g->values = g_ptr_array_new_with_free_func(value_free);
  g->nodes = g_ptr_array_new_with_free_func(node_free);
  g->inputs = g_ptr_array_new();
  g->input_by_name = g_hash_table_new(g_str_hash, g_str_equal);
  g->param_values = g_hash_table_new(g_direct_hash, g_direct_equal);
  g->grads = g_hash_table_new(g_direct_hash, g_direct_equal);
  g->param_grads = g_ptr_array_new();
  return g;
}

void
qkv_graph_free(QkvGraph *graph)
{
  if (graph == NULL)
    return;
  /* plans and boxed values may hold references (qkv_graph_ref()) */
  if (!g_atomic_int_dec_and_test(&graph->ref_count))
    return;
  if (graph->retired_nodes != NULL)
    g_ptr_array_unref(graph->retired_nodes);
  if (graph->retired_values != NULL)
    g_ptr_array_unref(graph->retired_values);
  if (graph->held_params != NULL)
    g_ptr_array_unref(graph->held_params);
  g_ptr_array_unref(graph->param_grads);
  g_hash_table_unref(graph->grads);
  g_hash_table_unref(graph->param_values);
  g_hash_table_unref(graph->input_by_name);
  g_ptr_array_unref(graph->inputs);
  g_ptr_array_unref(graph->nodes);
  g_ptr_array_unref(graph->values);
  g_free(graph->scope);
  g_free(graph);
}

static QkvValue *
value_new(QkvGraph *graph, QkvValueKind kind, QkvDType dtype, const QkvShape *shape)
{
  QkvValue *v = g_new0(QkvValue, 1);
  v->graph = graph;
  v->id = graph->values->len;
  v->born = graph->generation;
  v->kind = kind;
  v->dtype = dtype;
  v->shape = *shape;
  g_ptr_array_add(graph->values, v);
  return v;
}

static gboolean
check_shape(const QkvShape *shape, const gchar *what, const gchar *name, GError **error)
{
  if (qkv_shape_is_valid(shape))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
              "%s '%s': invalid shape (rank %d, a negative dimension, or too many elements)", what,
              name, shape->rank);
  return FALSE;
}

QkvValue *
qkv_graph_input(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && name != NULL && shape != NULL, NULL);
  if (g_hash_table_contains(graph->input_by_name, name)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_EXISTS, "graph input '%s' already exists", name);
    return NULL;
  }
  if (dtype != QKV_F32 && dtype != QKV_I32) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE, "graph input '%s': unknown dtype %d", name,
                (int)dtype);
    return NULL;
  }
  if (!check_shape(shape, "graph input", name, error))
    return NULL;
  QkvValue *v = value_new(graph, QKV_VALUE_INPUT, dtype, shape);
  v->name = g_strdup(name);
  g_ptr_array_add(graph->inputs, v);
  g_hash_table_insert(graph->input_by_name, v->name, v);
  return v;
}

QkvValue *
qkv_graph_state(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && name != NULL && shape != NULL, NULL);
  for (guint i = 0; i < graph->values->len; i++) {
    QkvValue *other = g_ptr_array_index(graph->values, i);
    if (other->kind == QKV_VALUE_STATE && g_strcmp0(other->name, name) == 0) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_EXISTS, "graph state '%s' already exists", name);
      return NULL;
    }
  }
  if (dtype != QKV_F32 && dtype != QKV_I32) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE, "graph state '%s': unknown dtype %d", name,
                (int)dtype);
    return NULL;
  }
  if (!check_shape(shape, "graph state", name, error))
    return NULL;
  QkvValue *v = value_new(graph, QKV_VALUE_STATE, dtype, shape);
  v->name = g_strdup(name);
  return v;
}

QkvValue *
qkv_graph_param(QkvGraph *graph, QkvParams *params, const gchar *name, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && params != NULL && name != NULL, NULL);
  QkvParam *p = qkv_params_lookup(params, name);
  if (p == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "parameter '%s' is not in the store", name);
    return NULL;
  }
  QkvValue *v = g_hash_table_lookup(graph->param_values, p);
  if (v != NULL)
    return v;
  v = value_new(graph, QKV_VALUE_PARAM, QKV_F32, qkv_param_shape(p));
  v->name = g_strdup(name);
  v->param = p;
  v->params = params;
  g_hash_table_insert(graph->param_values, p, v);
  /* the store must outlive the graph: hold it, for bindings that free in
   * any order */
  if (graph->held_params == NULL)
    graph->held_params = g_ptr_array_new_with_free_func((GDestroyNotify)qkv_params_free);
  if (!g_ptr_array_find(graph->held_params, params, NULL))
    g_ptr_array_add(graph->held_params, qkv_params_ref(params));
  return v;
}

QkvValue *
qkv_graph_constant(QkvGraph *graph, const QkvTensor *tensor, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && tensor != NULL, NULL);
  QkvValue *v = value_new(graph, QKV_VALUE_CONSTANT, tensor->dtype, &tensor->shape);
  v->constant = qkv_tensor_copy(tensor);
  v->name = g_strdup_printf("const_%u", v->id);
  return v;
}

QkvValue *
qkv_graph_scalar(QkvGraph *graph, float value)
{
  QkvShape s = qkv_shape_scalar();
  g_autoptr(QkvTensor) t = qkv_tensor_new_f32(&s, &value);
  return qkv_graph_constant(graph, t, NULL);
}

void
qkv_node_fill_shape_ctx(const QkvNode *node, QkvShapeCtx *ctx, QkvShape *in_shapes,
                        QkvDType *in_dtypes)
{
  memset(ctx, 0, sizeof(*ctx));
  for (guint i = 0; i < node->n_inputs; i++) {
    in_shapes[i] = node->inputs[i]->shape;
    in_dtypes[i] = node->inputs[i]->dtype;
  }
  ctx->op_name = node->op->name;
  ctx->node_name = node->name;
  ctx->n_inputs = node->n_inputs;
  ctx->in_shapes = in_shapes;
  ctx->in_dtypes = in_dtypes;
  ctx->attrs = node->attrs;
  ctx->n_outputs = node->n_outputs;
  for (guint i = 0; i < node->n_outputs; i++) {
    ctx->out_shapes[i] = node->outputs[i]->shape;
    ctx->out_dtypes[i] = node->outputs[i]->dtype;
  }
}

static gchar *
describe_inputs(guint n, const QkvShape *shapes, const QkvDType *dtypes)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *sh = qkv_shape_to_string(&shapes[i]);
    g_string_append_printf(s, "%s%s%s", i ? ", " : "", qkv_dtype_name(dtypes[i]), sh);
  }
  return g_string_free(s, FALSE);
}

gboolean
qkv_shape_error(const QkvShapeCtx *ctx, GError **error, QkvError code, const gchar *format, ...)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  va_list args;
  va_start(args, format);
  g_autofree gchar *msg = g_strdup_vprintf(format, args);
  va_end(args);
  g_autofree gchar *ins = describe_inputs(ctx->n_inputs, ctx->in_shapes, ctx->in_dtypes);
  g_set_error(error, QKV_ERROR, code, "op '%s' (node %s): %s [inputs: %s]", ctx->op_name,
              ctx->node_name, msg, ins);
  return FALSE;
}

static gchar *
make_node_name(QkvGraph *graph, const gchar *op_name)
{
  guint id = graph->nodes->len;
  if (graph->scope != NULL)
    return g_strdup_printf("%s.%s_%u", graph->scope, op_name, id);
  return g_strdup_printf("%s_%u", op_name, id);
}

gboolean
qkv_values_present(const gchar *what, QkvValue *const *values, guint n, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  for (guint i = 0; i < n; i++) {
    if (values[i] != NULL)
      continue;
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: value %u is NULL (did an earlier step fail?)", what, i);
    return FALSE;
  }
  return TRUE;
}

/* Where the plugin that might have defined an unknown op would have been
 * found, for the error: the rule of the loader's search path (src/plugin/,
 * qkv_plugin_search_path()), told from the environment and the build's
 * default directory, since core does not call into the plugin layer. */
static gchar *
plugin_search_description(void)
{
  const gchar *user = g_getenv("QKV_PLUGIN_PATH");
  const gchar *system = g_getenv("QKV_PLUGIN_SYSTEM_PATH");
  g_autofree gchar *user_part = user != NULL ? g_strdup_printf("QKV_PLUGIN_PATH (\"%s\")", user)
                                             : g_strdup("QKV_PLUGIN_PATH (not set)");
  g_autofree gchar *system_part =
      system != NULL ? g_strdup_printf("QKV_PLUGIN_SYSTEM_PATH (\"%s\"), which replaces the "
                                       "default plugin directory %s",
                                       system, QKV_PLUGIN_DIR)
                     : g_strdup_printf("the default plugin directory %s (QKV_PLUGIN_SYSTEM_PATH "
                                       "replaces it)",
                                       QKV_PLUGIN_DIR);
  return g_strdup_printf("plugins are loaded at initialisation from the directories of %s, then "
                         "of %s, or by qkv_plugin_load()",
                         user_part, system_part);
}

/* The op registered as op_name, or NULL with QKV_ERROR_UNKNOWN_OP saying
 * where a plugin defining it would have been looked for. */
static const QkvOpDef *
lookup_op(const gchar *op_name, const gchar *node_name, GError **error)
{
  const QkvOpDef *op = qkv_op_lookup(op_name);
  if (op == NULL) {
    g_autofree gchar *where = plugin_search_description();
    g_set_error(error, QKV_ERROR, QKV_ERROR_UNKNOWN_OP,
                "unknown op '%s' (node %s): no built-in op or loaded plugin has that name; %s",
                op_name, node_name, where);
  }
  return op;
}

/* Whether op takes n_inputs inputs; the message names the range the op
 * declares (at least, exactly, or from-to). */
static gboolean
check_arity(const QkvOpDef *op, const gchar *op_name, const gchar *node_name, guint n_inputs,
            GError **error)
{
  if (n_inputs >= op->min_inputs && (op->max_inputs < 0 || n_inputs <= (guint)op->max_inputs))
    return TRUE;
  if (op->max_inputs < 0)
    g_set_error(error, QKV_ERROR, QKV_ERROR_ARITY,
                "op '%s' (node %s): expects at least %u inputs, got %u", op_name, node_name,
                op->min_inputs, n_inputs);
  else if ((guint)op->max_inputs == op->min_inputs)
    g_set_error(error, QKV_ERROR, QKV_ERROR_ARITY, "op '%s' (node %s): expects %u inputs, got %u",
                op_name, node_name, op->min_inputs, n_inputs);
  else
    g_set_error(error, QKV_ERROR, QKV_ERROR_ARITY,
                "op '%s' (node %s): expects %u to %d inputs, got %u", op_name, node_name,
                op->min_inputs, op->max_inputs, n_inputs);
  return FALSE;
}

/* Whether every input is a live value of graph: not NULL, not from another
 * graph, not retired by a rollback. */
static gboolean
check_inputs(QkvGraph *graph, const gchar *op_name, const gchar *node_name, QkvValue *const *inputs,
             guint n_inputs, GError **error)
{
  for (guint i = 0; i < n_inputs; i++) {
    if (inputs[i] == NULL) {
      if (error == NULL || *error == NULL) /* else an earlier failure said why */
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "op '%s' (node %s): input %u is NULL (did an earlier step fail?)", op_name,
                    node_name, i);
      return FALSE;
    }
    if (inputs[i]->graph != graph) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_GRAPH_MISMATCH,
                  "op '%s' (node %s): input %u ('%s') belongs to another graph", op_name, node_name,
                  i, inputs[i]->name ? inputs[i]->name : "?");
      return FALSE;
    }
    if (qkv_value_is_retired(graph, inputs[i])) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "op '%s' (node %s): input %u ('%s') was removed from the graph by a rollback",
                  op_name, node_name, i, inputs[i]->name ? inputs[i]->name : "?");
      return FALSE;
    }
  }
  return TRUE;
}

/* Whether the outputs the shape rule declared are usable: 1 to
 * QKV_MAX_OUTPUTS of them, each a valid shape of a dtype values can have. */
static gboolean
check_declared_outputs(const QkvShapeCtx *ctx, GError **error)
{
  if (ctx->n_outputs < 1 || ctx->n_outputs > QKV_MAX_OUTPUTS)
    return qkv_shape_error(ctx, error, QKV_ERROR_INVALID_ARGUMENT,
                           "the shape rule declared %u outputs (1 to %d allowed)", ctx->n_outputs,
                           QKV_MAX_OUTPUTS);
  for (guint i = 0; i < ctx->n_outputs; i++) {
    gboolean ok = qkv_shape_is_valid(&ctx->out_shapes[i]) &&
                  (ctx->out_dtypes[i] == QKV_F32 || ctx->out_dtypes[i] == QKV_I32);
    if (!ok)
      return qkv_shape_error(
          ctx, error, QKV_ERROR_SHAPE,
          "output %u would have an invalid shape (negative or too many elements)", i);
  }
  return TRUE;
}

/* Run op's shape rule on the inputs into ctx (n_outputs, out_shapes,
 * out_dtypes); FALSE with error if it rejects them or declares unusable
 * outputs. ctx's input arrays live only during the call (cleared on return). */
static gboolean
infer_output_shapes(const QkvOpDef *op, const gchar *node_name, QkvValue *const *inputs,
                    guint n_inputs, const QkvAttrs *parsed, QkvShapeCtx *ctx, GError **error)
{
  QkvShape *in_shapes = g_newa(QkvShape, MAX(n_inputs, 1));
  QkvDType *in_dtypes = g_newa(QkvDType, MAX(n_inputs, 1));
  for (guint i = 0; i < n_inputs; i++) {
    in_shapes[i] = inputs[i]->shape;
    in_dtypes[i] = inputs[i]->dtype;
  }
  memset(ctx, 0, sizeof *ctx);
  ctx->op_name = op->name;
  ctx->node_name = node_name;
  ctx->n_inputs = n_inputs;
  ctx->in_shapes = in_shapes;
  ctx->in_dtypes = in_dtypes;
  ctx->attrs = parsed;
  ctx->n_outputs = 1;
  GError *shape_error = NULL;
  gboolean ok = op->shape(ctx, &shape_error);
  if (!ok) {
    if (shape_error == NULL)
      qkv_shape_error(ctx, &shape_error, QKV_ERROR_SHAPE, "the shape rule rejected the inputs");
    g_propagate_error(error, shape_error);
  } else {
    ok = check_declared_outputs(ctx, error);
  }
  ctx->in_shapes = NULL; /* the stack arrays die with this frame */
  ctx->in_dtypes = NULL;
  return ok;
}

/* The node, with its outputs as ctx declared them, appended to graph; takes
 * node_name and parsed. */
static QkvNode *
node_create(QkvGraph *graph, const QkvOpDef *op, gchar *node_name, QkvValue *const *inputs,
            guint n_inputs, QkvAttrs *parsed, const QkvShapeCtx *ctx)
{
  QkvNode *node = g_new0(QkvNode, 1);
  node->graph = graph;
  node->id = graph->nodes->len;
  node->born = graph->generation;
  node->op = op;
  node->name = node_name;
  node->n_inputs = n_inputs;
  node->inputs = g_new0(QkvValue *, MAX(n_inputs, 1));
  memcpy(node->inputs, inputs, n_inputs * sizeof(QkvValue *));
  node->attrs = parsed;
  node->n_outputs = ctx->n_outputs;
  for (guint i = 0; i < ctx->n_outputs; i++) {
    QkvValue *v = value_new(graph, QKV_VALUE_OP, ctx->out_dtypes[i], &ctx->out_shapes[i]);
    v->node = node;
    v->output_index = i;
    v->name = ctx->n_outputs == 1 ? g_strdup(node->name) : g_strdup_printf("%s:%u", node->name, i);
    node->outputs[i] = v;
  }
  g_ptr_array_add(graph->nodes, node);
  return node;
}

QkvNode *
qkv_graph_add_node(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs, guint n_inputs,
                   GVariant *attrs, GError **error)
{
  /* attrs is ours from here, whatever happens: a floating one is sunk and
   * released on every return */
  if (attrs != NULL)
    g_variant_ref_sink(attrs);
  g_autoptr(GVariant) attrs_owned = attrs;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && op_name != NULL, NULL);
  g_return_val_if_fail(n_inputs == 0 || inputs != NULL, NULL);
  g_autofree gchar *node_name = make_node_name(graph, op_name);

  const QkvOpDef *op = lookup_op(op_name, node_name, error);
  if (op == NULL || !check_arity(op, op_name, node_name, n_inputs, error) ||
      !check_inputs(graph, op_name, node_name, inputs, n_inputs, error))
    return NULL;
  QkvAttrs *parsed = qkv_attrs_parse(op, node_name, attrs, error);
  if (parsed == NULL)
    return NULL;
  QkvShapeCtx ctx;
  if (!infer_output_shapes(op, node_name, inputs, n_inputs, parsed, &ctx, error)) {
    qkv_attrs_free(parsed);
    return NULL;
  }
  return node_create(graph, op, g_steal_pointer(&node_name), inputs, n_inputs, parsed, &ctx);
}

QkvValue *
qkv_graph_op(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs, guint n_inputs,
             GVariant *attrs, GError **error)
{
  /* no check of error here: qkv_graph_add_node() makes it, after taking attrs */
  QkvNode *node = qkv_graph_add_node(graph, op_name, inputs, n_inputs, attrs, error);
  return node ? node->outputs[0] : NULL;
}

guint
qkv_node_n_outputs(const QkvNode *node)
{
  return node->n_outputs;
}

QkvValue *
qkv_node_output(QkvNode *node, guint index)
{
  g_return_val_if_fail(node != NULL, NULL);
  /* an index past the end is a value a user can pass: quiet, as documented */
  if (index >= node->n_outputs)
    return NULL;
  return node->outputs[index];
}

const gchar *
qkv_node_name(const QkvNode *node)
{
  return node->name;
}

const gchar *
qkv_node_op_name(const QkvNode *node)
{
  return node->op->name;
}

QkvGraph *
qkv_value_graph(const QkvValue *value)
{
  g_return_val_if_fail(value != NULL, NULL);
  return value->graph;
}

const QkvShape *
qkv_value_shape(const QkvValue *value)
{
  return &value->shape;
}

QkvDType
qkv_value_dtype(const QkvValue *value)
{
  return value->dtype;
}

QkvValueKind
qkv_value_kind(const QkvValue *value)
{
  return value->kind;
}

QkvNode *
qkv_value_node(const QkvValue *value)
{
  return value->node;
}

const gchar *
qkv_value_name(const QkvValue *value)
{
  return value->name;
}

void
qkv_value_set_requires_grad(QkvValue *value, gboolean requires_grad)
{
  g_return_if_fail(value != NULL);
  value->requires_grad = requires_grad;
}

QkvValue *
qkv_graph_lookup_input(QkvGraph *graph, const gchar *name)
{
  return g_hash_table_lookup(graph->input_by_name, name);
}

guint
qkv_graph_n_nodes(const QkvGraph *graph)
{
  return graph->nodes->len;
}

guint
qkv_graph_n_values(const QkvGraph *graph)
{
  return graph->values->len;
}

void
qkv_graph_set_scope(QkvGraph *graph, const gchar *scope)
{
  g_free(graph->scope);
  graph->scope = (scope != NULL && *scope) ? g_strdup(scope) : NULL;
}

static void
append_value_desc(GString *s, const QkvValue *v)
{
  g_autofree gchar *sh = qkv_shape_to_string(&v->shape);
  g_string_append_printf(s, "%s%s", qkv_dtype_name(v->dtype), sh);
}

gchar *
qkv_graph_to_string(QkvGraph *graph)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < graph->values->len; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (v->kind == QKV_VALUE_OP)
      continue;
    const gchar *kind = v->kind == QKV_VALUE_INPUT   ? "input"
                        : v->kind == QKV_VALUE_PARAM ? "param"
                        : v->kind == QKV_VALUE_STATE ? "state"
                                                     : "const";
    g_string_append_printf(s, "%%%u = %s \"%s\" ", v->id, kind, v->name);
    append_value_desc(s, v);
    if (v->requires_grad)
      g_string_append(s, " requires_grad");
    g_string_append_c(s, '\n');
  }
  for (guint i = 0; i < graph->nodes->len; i++) {
    QkvNode *n = g_ptr_array_index(graph->nodes, i);
    for (guint o = 0; o < n->n_outputs; o++)
      g_string_append_printf(s, "%s%%%u", o ? ", " : "", n->outputs[o]->id);
    g_string_append_printf(s, " = %s %s(", n->name, n->op->name);
    for (guint j = 0; j < n->n_inputs; j++)
      g_string_append_printf(s, "%s%%%u", j ? ", " : "", n->inputs[j]->id);
    g_string_append_c(s, ')');
    if (n->attrs->n > 0) {
      g_autofree gchar *a = qkv_attrs_to_string(n->attrs);
      g_string_append_printf(s, " {%s}", a);
    }
    g_string_append(s, " -> ");
    for (guint o = 0; o < n->n_outputs; o++) {
      if (o)
        g_string_append(s, ", ");
      append_value_desc(s, n->outputs[o]);
    }
    g_string_append_c(s, '\n');
  }
  return g_string_free(s, FALSE);
}

static void
append_dot_escaped(GString *s, const gchar *text)
{
  for (const gchar *p = text; *p; p++) {
    if (*p == '"' || *p == '\\')
      g_string_append_c(s, '\\');
    g_string_append_c(s, *p);
  }
}

gchar *
qkv_graph_to_dot(QkvGraph *graph)
{
  GString *s = g_string_new("digraph qkv {\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n");
  for (guint i = 0; i < graph->values->len; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (v->kind == QKV_VALUE_OP)
      continue;
    const gchar *style = v->kind == QKV_VALUE_INPUT   ? "shape=ellipse, color=blue"
                         : v->kind == QKV_VALUE_PARAM ? "shape=ellipse, color=darkgreen"
                                                      : "shape=ellipse, color=gray";
    g_autofree gchar *sh = qkv_shape_to_string(&v->shape);
    g_string_append_printf(s, "  v%u [%s, label=\"", v->id, style);
    append_dot_escaped(s, v->name);
    g_string_append_printf(s, "\\n%s%s\"];\n", qkv_dtype_name(v->dtype), sh);
  }
  for (guint i = 0; i < graph->nodes->len; i++) {
    QkvNode *n = g_ptr_array_index(graph->nodes, i);
    g_string_append_printf(s, "  n%u [shape=box, label=\"", n->id);
    append_dot_escaped(s, n->name);
    g_string_append(s, "\"];\n");
    for (guint j = 0; j < n->n_inputs; j++) {
      QkvValue *in = n->inputs[j];
      g_autofree gchar *sh = qkv_shape_to_string(&in->shape);
      if (in->kind == QKV_VALUE_OP)
        g_string_append_printf(s, "  n%u -> n%u [label=\"%s\"];\n", in->node->id, n->id, sh);
      else
        g_string_append_printf(s, "  v%u -> n%u [label=\"%s\"];\n", in->id, n->id, sh);
    }
  }
  g_string_append(s, "}\n");
  return g_string_free(s, FALSE);
}

void
qkv_graph_truncate(QkvGraph *graph, guint n_values, guint n_nodes)
{
  if (n_values < graph->values->len || n_nodes < graph->nodes->len)
    graph->generation++;
  for (guint i = n_values; i < graph->values->len; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (v->kind == QKV_VALUE_PARAM)
      g_hash_table_remove(graph->param_values, v->param);
    if (v->kind == QKV_VALUE_INPUT) {
      g_hash_table_remove(graph->input_by_name, v->name);
      g_ptr_array_remove(graph->inputs, v);
    }
  }
  if (graph->retire) {
    /* boxed references may point at what goes: keep it until the graph is freed */
    if (graph->retired_values == NULL) {
      graph->retired_values = g_ptr_array_new_with_free_func(value_free);
      graph->retired_nodes = g_ptr_array_new_with_free_func(node_free);
    }
    while (graph->nodes->len > n_nodes)
      g_ptr_array_add(graph->retired_nodes,
                      g_ptr_array_steal_index(graph->nodes, graph->nodes->len - 1));
    while (graph->values->len > n_values)
      g_ptr_array_add(graph->retired_values,
                      g_ptr_array_steal_index(graph->values, graph->values->len - 1));
  }
  g_ptr_array_set_size(graph->nodes, n_nodes);
  g_ptr_array_set_size(graph->values, n_values);
}

gboolean
qkv_value_is_retired(const QkvGraph *graph, const QkvValue *value)
{
  return value->id >= graph->values->len || g_ptr_array_index(graph->values, value->id) != value;
}

const gchar *
qkv_graph_get_scope(const QkvGraph *graph)
{
  g_return_val_if_fail(graph != NULL, NULL);
  return graph->scope;
}

void
qkv_graph_mark(QkvGraph *graph, QkvGraphMark *mark)
{
  g_return_if_fail(graph != NULL && mark != NULL);
  *mark = (QkvGraphMark){
      .n_values = graph->values->len,
      .n_nodes = graph->nodes->len,
      .had_backward = graph->has_backward,
      .generation = graph->generation,
  };
}

/* The first n objects of array are still those a mark of that generation
 * counted: none of them went in a truncation since (then the one now at
 * index n - 1, if any, was born after the mark). */
static gboolean
prefix_is_current(GPtrArray *array, guint n, guint64 generation, gboolean values)
{
  if (n > array->len)
    return FALSE;
  if (n == 0)
    return TRUE;
  gpointer last = g_ptr_array_index(array, n - 1);
  guint64 born = values ? ((QkvValue *)last)->born : ((QkvNode *)last)->born;
  return born <= generation;
}

gboolean
qkv_graph_rollback_checked(QkvGraph *graph, const QkvGraphMark *mark, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(graph != NULL && mark != NULL, FALSE);
  /* A mark with a backward pass that the graph no longer has was taken
   * after values that a rollback removed since. */
  if (!prefix_is_current(graph->values, mark->n_values, mark->generation, TRUE) ||
      !prefix_is_current(graph->nodes, mark->n_nodes, mark->generation, FALSE) ||
      mark->generation > graph->generation || (mark->had_backward && !graph->has_backward)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_graph_rollback: stale mark (%u values, %u nodes): a rollback since it was "
                "taken removed what it counted; the graph is unchanged",
                mark->n_values, mark->n_nodes);
    return FALSE;
  }
  if (graph->has_backward && !mark->had_backward) {
    /* Every gradient value came after the mark and is about to go. */
    g_hash_table_remove_all(graph->grads);
    g_ptr_array_set_size(graph->param_grads, 0);
    graph->has_backward = FALSE;
    graph->backward_loss = NULL;
  }
  qkv_graph_truncate(graph, mark->n_values, mark->n_nodes);
  return TRUE;
}

void
qkv_graph_rollback(QkvGraph *graph, const QkvGraphMark *mark)
{
  qkv_graph_rollback_checked(graph, mark, NULL);
}
