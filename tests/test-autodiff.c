/* test-autodiff.c: reverse mode over whole graphs. */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* Run a training plan for loss and return the gradient of value. */
static QkvTensor *
grad_of(QkvGraph *g, QkvValue *loss, QkvValue *value, const gchar *input, QkvTensor *x)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvValue *gv = qkv_graph_gradient(g, value);
  g_assert_nonnull(gv);
  g_assert_true(qkv_shape_equal(qkv_value_shape(gv), qkv_value_shape(value)));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &gv, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, input, x, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  return qkv_tensor_copy(qkv_plan_output(plan, 0));
}

static void
test_value_used_twice(void)
{
  /* loss = Σ x·x + Σ x  →  d/dx = 2x + 1 */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *sq = qkv_mul(x, x, NULL);
  QkvValue *loss =
      qkv_add(qkv_sum(sq, NULL, 0, FALSE, NULL), qkv_sum(x, NULL, 0, FALSE, NULL), NULL);
  float xv[] = {1, -2, 0.5f};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_autoptr(QkvTensor) gx = grad_of(g, loss, x, "x", xt);
  float want[] = {3, -3, 2};
  qkv_assert_values(gx, want, 3, 1e-6);
}

static void
test_diamond(void)
{
  /* a = relu(x), b = exp(x), loss = Σ a·b  →  d/dx = [x>0] e^x + relu(x) e^x */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(4);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *a = qkv_relu(x, NULL), *b = qkv_exp(x, NULL);
  QkvValue *loss = qkv_sum(qkv_mul(a, b, NULL), NULL, 0, FALSE, NULL);
  float xv[] = {-1, 0.5f, 2, -0.25f};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_autoptr(QkvTensor) gx = grad_of(g, loss, x, "x", xt);
  float want[4];
  for (int i = 0; i < 4; i++)
    want[i] = xv[i] > 0 ? expf(xv[i]) * (1 + xv[i]) : 0;
  qkv_assert_values(gx, want, 4, 1e-5);
}

static void
test_param_shared_by_two_graphs(void)
{
  /* One store, two graphs using w differently; each writes its own gradient. */
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(2), xs = QKV_SHAPE(2);
  QkvParam *p = qkv_params_add(params, "w", &ws, NULL);
  qkv_tensor_f32(qkv_param_value(p))[0] = 3;
  qkv_tensor_f32(qkv_param_value(p))[1] = -1;
  float xv[] = {2, 5};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&xs, xv);

  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  QkvValue *x1 = qkv_graph_input(g1, "x", QKV_F32, &xs, NULL);
  QkvValue *w1 = qkv_graph_param(g1, params, "w", NULL);
  QkvValue *l1 = qkv_sum(qkv_mul(x1, w1, NULL), NULL, 0, FALSE, NULL); /* d/dw = x */
  g_autoptr(QkvGraph) g2 = qkv_graph_new();
  QkvValue *x2 = qkv_graph_input(g2, "x", QKV_F32, &xs, NULL);
  QkvValue *w2 = qkv_graph_param(g2, params, "w", NULL);
  QkvValue *l2 = qkv_sum(qkv_mul(w2, w2, NULL), NULL, 0, FALSE, NULL); /* d/dw = 2w */
  (void)x2;
  g_assert_true(qkv_graph_backward(g1, l1, NULL));
  g_assert_true(qkv_graph_backward(g2, l2, NULL));
  g_autoptr(QkvPlan) p1 = qkv_graph_compile(g1, &l1, 1, NULL, NULL);
  g_autoptr(QkvPlan) p2 = qkv_graph_compile(g2, &l2, 1, NULL, NULL);
  g_assert_true(qkv_plan_bind(p1, "x", xt, NULL));
  g_assert_true(qkv_plan_run(p1, NULL));
  float want1[] = {2, 5};
  qkv_assert_values(qkv_param_grad(p), want1, 2, 1e-6);
  g_assert_cmpfloat_with_epsilon(qkv_plan_output_scalar(p1, 0), 1.0, 1e-6);
  g_assert_true(qkv_plan_run(p2, NULL));
  float want2[] = {6, -2};
  qkv_assert_values(qkv_param_grad(p), want2, 2, 1e-6); /* overwritten, not accumulated */
  g_assert_true(qkv_plan_run(p2, NULL));
  qkv_assert_values(qkv_param_grad(p), want2, 2, 1e-6);
}

static void
test_frozen_param_gets_no_gradient(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(2);
  QkvParam *a = qkv_params_add(params, "a", &s, NULL);
  qkv_params_add(params, "b", &s, NULL);
  qkv_param_set_frozen(a, TRUE);
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *va = qkv_graph_param(g, params, "a", NULL);
  QkvValue *vb = qkv_graph_param(g, params, "b", NULL);
  QkvValue *loss = qkv_sum(qkv_mul(va, vb, NULL), NULL, 0, FALSE, NULL);
  g_assert_true(qkv_graph_backward(g, loss, NULL));
  g_assert_null(qkv_graph_gradient(g, va));
  g_assert_nonnull(qkv_graph_gradient(g, vb));
}

static gboolean
nograd_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
nograd_forward(const QkvKernelCtx *ctx)
{
  memcpy(ctx->out[0].data, ctx->in[0].data, qkv_shape_numel(&ctx->in[0].shape) * 4);
}

static void
test_op_without_gradient(void)
{
  static const QkvOpDef def = {
      QKV_OP_DEF_INIT, .name = "test.opaque", .min_inputs = 1,
      .max_inputs = 1, .shape = nograd_shape, .forward = nograd_forward,
  };
  if (qkv_op_lookup("test.opaque") == NULL)
    g_assert_true(qkv_op_register(&def, NULL));
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_graph_op(g, "test.opaque", &x, 1, NULL, NULL);
  QkvValue *loss = qkv_sum(qkv_exp(y, NULL), NULL, 0, FALSE, NULL);
  guint nodes = qkv_graph_n_nodes(g);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_graph_backward(g, loss, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT);
  g_assert_nonnull(strstr(error->message, "test.opaque"));
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, nodes); /* rolled back */
  /* the graph still compiles and runs */
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, NULL, NULL);
  float xv[] = {0, 0, 0};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_assert_true(qkv_plan_bind(plan, "x", xt, NULL) && qkv_plan_run(plan, NULL));
  g_assert_cmpfloat_with_epsilon(qkv_plan_output_scalar(plan, 0), 3.0, 1e-6);
}

static void
test_loss_must_be_scalar(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_graph_backward(g, qkv_exp(x, NULL), &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
}

/* A second backward is refused, naming the loss that has the gradients and
 * the one asked for; the first loss's gradients are untouched. Rolling back
 * past the first call frees the graph for another loss. */
static void
test_second_backward(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *l1 = qkv_sum(qkv_mul(x, x, NULL), NULL, 0, FALSE, NULL);
  QkvValue *l2 = qkv_sum(x, NULL, 0, FALSE, NULL);
  QkvGraphMark mark;
  qkv_graph_mark(g, &mark);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_graph_backward(g, l1, &error));
  QkvValue *g1 = qkv_graph_gradient(g, x);
  guint nodes = qkv_graph_n_nodes(g);

  g_assert_false(qkv_graph_backward(g, l2, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_autofree gchar *want =
      g_strdup_printf("backward: the graph already has the gradients of the loss '%s', so it "
                      "cannot take those of a second loss '%s'*",
                      qkv_value_name(l1), qkv_value_name(l2));
  g_assert_true(g_pattern_match_simple(want, error->message));
  g_clear_error(&error);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, nodes);
  g_assert_true(qkv_graph_gradient(g, x) == g1);

  g_assert_false(qkv_graph_backward(g, l1, &error));
  g_autofree gchar *again = g_strdup_printf(
      "backward: the graph already has the gradients of the loss '%s'; *", qkv_value_name(l1));
  g_assert_true(g_pattern_match_simple(again, error->message));
  g_clear_error(&error);

  qkv_graph_rollback(g, &mark);
  g_assert_true(qkv_graph_backward(g, l2, &error));
  g_assert_false(qkv_graph_backward(g, l1, &error));
  g_autofree gchar *swapped = g_strdup_printf("*the loss '%s', so it cannot take those of a "
                                              "second loss '%s'*",
                                              qkv_value_name(l2), qkv_value_name(l1));
  g_assert_true(g_pattern_match_simple(swapped, error->message));
  g_clear_error(&error);
  /* d l2 / dx = 1 */
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, (const float[]){1, 2, 3});
  QkvValue *gx = qkv_graph_gradient(g, x);
  QkvTensor *res = NULL;
  g_assert_true(qkv_graph_eval(g, (const gchar *[]){"x"}, &xt, 1, &gx, &res, 1, &error));
  qkv_assert_values(res, ((const float[]){1, 1, 1}), 3, 0);
  qkv_tensor_free(res);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/autodiff/value-used-twice", test_value_used_twice);
  g_test_add_func("/autodiff/diamond", test_diamond);
  g_test_add_func("/autodiff/param-shared-by-two-graphs", test_param_shared_by_two_graphs);
  g_test_add_func("/autodiff/frozen-param", test_frozen_param_gets_no_gradient);
  g_test_add_func("/autodiff/op-without-gradient", test_op_without_gradient);
  g_test_add_func("/autodiff/loss-must-be-scalar", test_loss_must_be_scalar);
  g_test_add_func("/autodiff/second-backward", test_second_backward);
  return g_test_run();
}
