/* test-graph.c: building graphs, the generic path, multi-output nodes,
 * listing and DOT export, parameters shared between graphs. */
#include "test-util.h"

#include <string.h>

/* A two-output op defined in the test: (2x, x + 1), with its gradient rule. */
static gboolean
split2_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32");
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  ctx->out_shapes[1] = ctx->in_shapes[0];
  return TRUE;
}

static void
split2_forward(const QkvKernelCtx *ctx)
{
  const float *x = ctx->in[0].data;
  float *a = ctx->out[0].data, *b = ctx->out[1].data;
  for (gint64 i = 0; i < qkv_shape_numel(&ctx->in[0].shape); i++) {
    a[i] = 2 * x[i];
    b[i] = x[i] + 1;
  }
}

static gboolean
split2_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *total = NULL;
  if (g->out_grads[0] != NULL)
    total = qkv_scale(g->out_grads[0], 2.0, error);
  if (g->out_grads[1] != NULL)
    total = total ? qkv_add(total, g->out_grads[1], error) : g->out_grads[1];
  g->in_grads[0] = total;
  return total != NULL;
}

static const gchar *const split2_inputs[] = {"x", NULL};
static const gchar *const split2_outputs[] = {"doubled", "incremented", NULL};

static void
register_split2(void)
{
  static const QkvOpDef def = {
      QKV_OP_DEF_INIT,
      .name = "test.split2",
      .doc = "(2x, x + 1)",
      .min_inputs = 1,
      .max_inputs = 1,
      .input_names = split2_inputs,
      .output_names = split2_outputs,
      .shape = split2_shape,
      .forward = split2_forward,
      .gradient = split2_grad,
  };
  if (qkv_op_lookup("test.split2") == NULL) {
    g_autoptr(GError) error = NULL;
    g_assert_true(qkv_op_register(&def, &error));
    g_assert_no_error(error);
  }
}

static void
test_registry(void)
{
  register_split2();
  g_auto(GStrv) names = qkv_op_list();
  gboolean has_matmul = FALSE, has_split = FALSE;
  for (guint i = 0; names[i]; i++) {
    has_matmul |= g_str_equal(names[i], "matmul");
    has_split |= g_str_equal(names[i], "test.split2");
    if (i > 0)
      g_assert_cmpint(strcmp(names[i - 1], names[i]), <, 0);
  }
  g_assert_true(has_matmul && has_split);
  g_assert_cmpstr(qkv_op_origin("matmul"), ==, "built-in");
  g_assert_nonnull(qkv_op_lookup("softmax"));
  g_assert_null(qkv_op_lookup("no_such_op"));

  /* the same name twice is refused and the first stays */
  QkvOpDef dup = *qkv_op_lookup("test.split2");
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_op_register(&dup, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_EXISTS);
  g_assert_nonnull(strstr(error->message, "test.split2"));
}

static void
test_generic_path_and_multi_output(void)
{
  register_split2();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(2, 2);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_graph_add_node(g, "test.split2", &x, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 2);
  QkvValue *a = qkv_node_output(node, 0), *b = qkv_node_output(node, 1);

  /* generic path with attributes: matmul with transpose_b */
  GVariantBuilder vb;
  g_variant_builder_init(&vb, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&vb, "{sv}", "transpose_b", g_variant_new_boolean(TRUE));
  QkvValue *ins[] = {a, b};
  QkvValue *m = qkv_graph_op(g, "matmul", ins, 2, g_variant_builder_end(&vb), &error);
  g_assert_no_error(error);
  g_assert_nonnull(m);

  float xv[] = {1, 2, 3, 4};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  QkvValue *outs[] = {a, b, m};
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  float want_a[] = {2, 4, 6, 8}, want_b[] = {2, 3, 4, 5};
  qkv_assert_values(qkv_plan_output(plan, 0), want_a, 4, 0);
  qkv_assert_values(qkv_plan_output(plan, 1), want_b, 4, 0);
  /* a · bᵀ with a = [[2,4],[6,8]], b = [[2,3],[4,5]]: [[16, 28], [36, 64]] */
  float want_m[] = {16, 28, 36, 64};
  qkv_assert_values(qkv_plan_output(plan, 2), want_m, 4, 1e-5);
}

static void
test_listing_and_dot(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3, 4), xs = QKV_SHAPE(2, 3);
  g_assert_nonnull(qkv_params_add(params, "layer.weight", &ws, NULL));
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, NULL);
  QkvValue *w = qkv_graph_param(g, params, "layer.weight", NULL);
  g_assert_true(qkv_graph_param(g, params, "layer.weight", NULL) == w);
  qkv_graph_set_scope(g, "block0");
  QkvValue *y = qkv_matmul(x, w, FALSE, FALSE, NULL);
  qkv_graph_set_scope(g, NULL);
  QkvValue *z = qkv_relu(y, NULL);
  g_assert_nonnull(z);
  g_assert_cmpstr(qkv_node_name(qkv_value_node(y)), ==, "block0.matmul_0");
  g_assert_cmpstr(qkv_node_name(qkv_value_node(z)), ==, "relu_1");

  g_autofree gchar *text = qkv_graph_to_string(g);
  g_test_message("%s", text);
  g_assert_nonnull(strstr(text, "input \"x\" f32(2, 3)"));
  g_assert_nonnull(strstr(text, "param \"layer.weight\" f32(3, 4)"));
  g_assert_nonnull(strstr(text, "block0.matmul_0 matmul("));
  g_assert_nonnull(strstr(text, "-> f32(2, 4)"));
  g_autofree gchar *dot = qkv_graph_to_dot(g);
  g_assert_true(g_str_has_prefix(dot, "digraph qkv {"));
  g_assert_nonnull(strstr(dot, "relu_1"));
  g_assert_nonnull(strstr(dot, "->"));
}

static void
test_param_shared_by_graphs(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(2, 2), xs = QKV_SHAPE(1, 2);
  QkvParam *p = qkv_params_add(params, "w", &ws, NULL);
  float wv[] = {1, 2, 3, 4};
  memcpy(qkv_tensor_f32(qkv_param_value(p)), wv, sizeof wv);

  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  g_autoptr(QkvGraph) g2 = qkv_graph_new();
  QkvValue *x1 = qkv_graph_input(g1, "x", QKV_F32, &xs, NULL);
  QkvValue *x2 = qkv_graph_input(g2, "x", QKV_F32, &xs, NULL);
  QkvValue *y1 = qkv_matmul(x1, qkv_graph_param(g1, params, "w", NULL), FALSE, FALSE, NULL);
  QkvValue *y2 = qkv_matmul(x2, qkv_graph_param(g2, params, "w", NULL), FALSE, TRUE, NULL);
  g_autoptr(QkvPlan) p1 = qkv_graph_compile(g1, &y1, 1, NULL, NULL);
  g_autoptr(QkvPlan) p2 = qkv_graph_compile(g2, &y2, 1, NULL, NULL);
  float xv[] = {1, 1};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&xs, xv);
  g_assert_true(qkv_plan_bind(p1, "x", xt, NULL) && qkv_plan_bind(p2, "x", xt, NULL));
  g_assert_true(qkv_plan_run(p1, NULL) && qkv_plan_run(p2, NULL));
  float w1[] = {4, 6}, w2[] = {3, 7};
  qkv_assert_values(qkv_plan_output(p1, 0), w1, 2, 1e-6);
  qkv_assert_values(qkv_plan_output(p2, 0), w2, 2, 1e-6);
  /* an update to the store is seen by both plans, without recompiling */
  qkv_tensor_fill(qkv_param_value(p), 1.0);
  g_assert_true(qkv_plan_run(p1, NULL) && qkv_plan_run(p2, NULL));
  float ones2[] = {2, 2};
  qkv_assert_values(qkv_plan_output(p1, 0), ones2, 2, 1e-6);
  qkv_assert_values(qkv_plan_output(p2, 0), ones2, 2, 1e-6);
}

/* qkv_graph_eval: several outputs in one call, inputs by name, each result a
 * tensor of the caller's; every failure leaves the results NULL. */
static void
test_eval(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(2, 2);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *unused = qkv_graph_input(g, "unused", QKV_F32, &s, NULL);
  g_assert_nonnull(unused);
  QkvValue *y = qkv_scale(x, 2.0, NULL);
  QkvValue *total = qkv_sum(x, NULL, 0, FALSE, NULL);
  QkvValue *best = qkv_argmax(x, 1, FALSE, NULL);
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, (const float[]){1, 4, 3, 2});
  g_autoptr(GError) error = NULL;
  const gchar *names[] = {"x", "unused"};
  QkvTensor *inputs[] = {xt, xt};
  QkvValue *outs[] = {y, total, best, x};
  QkvTensor *res[4];
  g_assert_true(qkv_graph_eval(g, names, inputs, 2, outs, res, 4, &error));
  g_assert_no_error(error);
  qkv_assert_values(res[0], ((const float[]){2, 8, 6, 4}), 4, 0);
  qkv_assert_values(res[1], ((const float[]){10}), 1, 0);
  g_assert_cmpint(qkv_tensor_dtype(res[2]), ==, QKV_I32);
  g_assert_cmpint(qkv_tensor_i32(res[2])[0], ==, 1);
  g_assert_cmpint(qkv_tensor_i32(res[2])[1], ==, 0);
  g_assert_true(qkv_tensor_owns_data(res[3])); /* a copy, not the bound input */
  for (guint i = 0; i < 4; i++)
    qkv_tensor_free(res[i]);

  /* an unknown name, a missing input, a wrong shape */
  res[0] = xt;
  g_assert_false(qkv_graph_eval(g, (const gchar *[]){"nope"}, inputs, 1, outs, res, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_cmpstr(error->message, ==, "qkv_graph_eval: the graph has no input 'nope'");
  g_assert_null(res[0]);
  g_clear_error(&error);
  g_assert_false(qkv_graph_eval(g, NULL, NULL, 0, outs, res, 1, &error));
  g_assert_nonnull(error);
  g_assert_null(res[0]);
  g_clear_error(&error);
  QkvShape s3 = QKV_SHAPE(3);
  g_autoptr(QkvTensor) wrong = qkv_tensor_new(QKV_F32, &s3);
  g_assert_false(qkv_graph_eval(g, names, (QkvTensor *[]){wrong}, 1, outs, res, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_true(g_str_has_prefix(error->message, "qkv_graph_eval: bind: input 'x'"));
  g_clear_error(&error);

  /* errors chain: a NULL output from a failed op keeps that op's error */
  QkvValue *bad = qkv_matmul(x, qkv_sum(x, NULL, 0, FALSE, NULL), FALSE, FALSE, &error);
  g_assert_null(bad);
  g_autofree gchar *first = g_strdup(error->message);
  QkvValue *outs2[] = {y, bad};
  g_assert_false(qkv_graph_eval(g, names, inputs, 1, outs2, res, 2, &error));
  g_assert_cmpstr(error->message, ==, first);
  g_assert_true(res[0] == NULL && res[1] == NULL);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/graph/registry", test_registry);
  g_test_add_func("/graph/generic-path-multi-output", test_generic_path_and_multi_output);
  g_test_add_func("/graph/listing-and-dot", test_listing_and_dot);
  g_test_add_func("/graph/param-shared-by-graphs", test_param_shared_by_graphs);
  g_test_add_func("/graph/eval", test_eval);
  return g_test_run();
}
