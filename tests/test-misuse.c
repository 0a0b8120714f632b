/* test-misuse.c: values a user can pass that used to corrupt memory or
 * silently do the wrong thing, and are now refused: stale graph and store
 * marks (a mark whose point was rolled back past) and a gradient
 * accumulator whose parameters a store rollback removed. */
#include <string.h>

#include "test-util.h"

/* ---- graph marks ----------------------------------------------------------- */

/* x · w summed: a graph with a parameter, so that backward has work. */
static QkvValue *
small_loss(QkvGraph *g, QkvParams *params, const gchar *input)
{
  g_autoptr(GError) error = NULL;
  QkvValue *x = qkv_test_input(g, input, QKV_F32, QKV_SHAPE(3, 4));
  QkvValue *w = qkv_graph_param(g, params, "w", &error);
  QkvValue *y = qkv_matmul(x, w, FALSE, FALSE, &error);
  QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  return loss;
}

static QkvParams *
store_with_w(void)
{
  g_autoptr(GError) error = NULL;
  QkvParams *params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(4, 2);
  qkv_params_add(params, "w", &ws, &error);
  g_assert_no_error(error);
  return params;
}

/* A mark taken after a backward pass, then a rollback past it and a second
 * backward: the mark's counts fit the graph again, but the values it
 * counted are gone. Rolling back to it used to keep the second pass's
 * gradient table while freeing its values, and compiling read them. */
static void
test_graph_mark_after_second_backward(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = store_with_w();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvGraphMark before, after;
  qkv_graph_mark(g, &before);
  QkvValue *loss = small_loss(g, params, "x");
  g_assert_true(qkv_graph_backward(g, loss, &error));
  qkv_graph_mark(g, &after);
  g_assert_true(qkv_graph_rollback_checked(g, &before, &error));
  g_assert_no_error(error);
  /* a second model with more nodes before its loss, and its backward */
  QkvValue *x2 = qkv_test_input(g, "x2", QKV_F32, QKV_SHAPE(3, 4));
  QkvValue *twice = qkv_add(x2, x2, &error);
  QkvValue *w = qkv_graph_param(g, params, "w", &error);
  QkvValue *y = qkv_matmul(twice, w, FALSE, FALSE, &error);
  loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  guint n_values = qkv_graph_n_values(g), n_nodes = qkv_graph_n_nodes(g);
  g_assert_cmpuint(n_values, >=, after.n_values);

  /* the unchecked entry does nothing (it used to free the second pass's
   * gradient values and keep them in the table, for compile to read) */
  qkv_graph_rollback(g, &after);
  QkvValue *dw = qkv_graph_gradient(g, w);
  g_assert_nonnull(dw);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &dw, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
  g_assert_false(qkv_graph_rollback_checked(g, &after, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "stale"));
  g_clear_error(&error);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);

  /* the graph is whole: its gradient runs */
  g_autoptr(QkvTensor) xt = qkv_test_uniform(qkv_value_shape(x2), 1, -1, 1);
  g_assert_true(qkv_plan_bind(plan, "x2", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  /* d sum(2x · w) / dw[i][j] = 2 Σ_r x[r][i] */
  const float *xd = qkv_tensor_const_data(xt);
  const float *dwd = qkv_tensor_const_data(qkv_plan_output(plan, 0));
  for (gint i = 0; i < 4; i++) {
    float want = 0;
    for (gint r = 0; r < 3; r++)
      want += xd[r * 4 + i] + xd[r * 4 + i];
    g_assert_cmpfloat_with_epsilon(dwd[i * 2], want, 1e-5);
  }
}

/* A mark whose counts are at most the graph's, but taken on a branch that
 * was rolled back: rolling back to it used to cut away later work. Marks
 * that nest still work. */
static void
test_graph_mark_of_rolled_back_branch(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvGraphMark outer, inner, branch;
  qkv_graph_mark(g, &outer);
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2));
  qkv_graph_mark(g, &inner);
  QkvValue *b = qkv_relu(a, &error);
  qkv_graph_mark(g, &branch);
  /* nesting: inner, then outer */
  qkv_graph_rollback(g, &inner);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 1);
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 0);
  /* a rollback to outer again is fine: nothing was added since */
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_no_error(error);

  /* later work, more than the branch had */
  a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2));
  b = qkv_exp(a, &error);
  QkvValue *c = qkv_tanh(b, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_graph_n_values(g), >, branch.n_values);
  g_assert_false(qkv_graph_rollback_checked(g, &branch, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_graph_rollback_checked(g, &inner, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  qkv_graph_rollback(g, &branch);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 3);
  g_assert_true(qkv_value_graph(c) == g);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(c)), ==, "tanh");
  /* a mark taken before a failed backward stays good */
  QkvGraphMark good;
  qkv_graph_mark(g, &good);
  g_assert_false(qkv_graph_backward(g, c, &error)); /* not a scalar */
  g_clear_error(&error);
  QkvValue *d = qkv_relu(c, &error);
  g_assert_nonnull(d);
  g_assert_true(qkv_graph_rollback_checked(g, &good, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 3);
  /* and the empty graph's mark is never stale */
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 0);
}

/* ---- store marks and the gradient accumulator ------------------------------ */

static QkvParam *
add_param(QkvParams *params, const gchar *name, gint64 n)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(n);
  QkvParam *p = qkv_params_add(params, name, &s, &error);
  g_assert_no_error(error);
  return p;
}

static void
test_params_stale_mark(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvParamsMark outer, branch;
  qkv_params_mark(params, &outer);
  add_param(params, "a", 3);
  qkv_params_mark(params, &branch);
  add_param(params, "b", 3);
  g_assert_true(qkv_params_rollback_checked(params, &outer, &error));
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  add_param(params, "c", 3);
  add_param(params, "d", 3);
  /* branch counted one parameter, "a", which is gone: refused, nothing removed */
  g_assert_false(qkv_params_rollback_checked(params, &branch, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "stale"));
  g_clear_error(&error);
  qkv_params_rollback(params, &branch);
  g_assert_cmpuint(qkv_params_size(params), ==, 2);
  g_assert_nonnull(qkv_params_lookup(params, "d"));
  /* nested marks work */
  QkvParamsMark two;
  qkv_params_mark(params, &two);
  add_param(params, "e", 3);
  qkv_params_rollback(params, &two);
  g_assert_cmpuint(qkv_params_size(params), ==, 2);
  qkv_params_rollback(params, &outer);
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
}

/* An accumulator whose parameters a rollback removed does nothing (it used
 * to read and write their freed gradient buffers); one whose parameters all
 * survive a rollback of later ones keeps working. */
static void
test_accumulator_after_rollback(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvParam *kept = add_param(params, "kept", 4);
  QkvParamsMark mark;
  qkv_params_mark(params, &mark);
  add_param(params, "gone", 1000);
  g_autoptr(QkvGradAccumulator) stale = qkv_grad_accumulator_new(params, &error);
  g_assert_no_error(error);
  qkv_grad_accumulator_add(stale);
  qkv_params_rollback(params, &mark);
  qkv_tensor_fill(qkv_param_grad(kept), 2.0);
  qkv_grad_accumulator_add(stale);
  g_assert_cmpuint(qkv_grad_accumulator_store(stale), ==, G_MAXUINT);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(kept), 0), ==, 2.0);

  g_autoptr(QkvGradAccumulator) acc = qkv_grad_accumulator_new(params, &error);
  g_assert_no_error(error);
  add_param(params, "later", 2);
  qkv_grad_accumulator_add(acc);
  qkv_grad_accumulator_add(acc);
  qkv_params_rollback(params, &mark);
  g_assert_cmpuint(qkv_grad_accumulator_store(acc), ==, 2);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(kept), 0), ==, 4.0);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/misuse/graph-mark-after-second-backward",
                  test_graph_mark_after_second_backward);
  g_test_add_func("/misuse/graph-mark-of-rolled-back-branch",
                  test_graph_mark_of_rolled_back_branch);
  g_test_add_func("/misuse/params-stale-mark", test_params_stale_mark);
  g_test_add_func("/misuse/accumulator-after-rollback", test_accumulator_after_rollback);
  return g_test_run();
}
