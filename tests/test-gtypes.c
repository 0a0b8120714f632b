/* test-gtypes.c: the GObject type glue (qkv-types.h) that bindings rely on:
 * references keep objects alive whatever order they are freed in, a value
 * held through its boxed type survives its graph's free and a rollback (and
 * is then refused in new nodes), boxed tensors are shared or copied as
 * documented, and the twins (shapes, bytes, options, builders, eval to an
 * array) match the C entry points they stand for. Run under ASan in CI, the
 * use-after-free these guard against would also be reported there. */
#include "test-util.h"

#include <qkv/qkv-types.h>
#include <string.h>

static void
test_value_keeps_graph(void)
{
  QkvGraph *g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(2, 3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *held = g_boxed_copy(QKV_TYPE_VALUE, x);
  g_assert_true(held == x); /* a copy of a value is the value */
  qkv_graph_free(g);        /* the caller's reference; the value's remains */
  g_assert_cmpstr(qkv_value_name(held), ==, "x");
  QkvGraph *still = qkv_value_graph(held);
  g_autoptr(GError) error = NULL;
  QkvValue *y = qkv_relu(held, &error);
  g_assert_no_error(error);
  g_assert_nonnull(y);
  g_assert_cmpuint(qkv_graph_n_nodes(still), ==, 1);
  g_boxed_free(QKV_TYPE_VALUE, held); /* the last reference frees the graph */
}

static void
test_rollback_keeps_held_values(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(4);
  QkvGraphMark mark;
  qkv_graph_mark(g, &mark);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *r = qkv_relu(x, NULL);
  QkvValue *held = g_boxed_copy(QKV_TYPE_VALUE, r);
  qkv_graph_rollback(g, &mark);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 0);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, 0);
  /* still readable ... */
  g_assert_cmpint(qkv_value_shape(held)->dims[0], ==, 4);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(held)), ==, "relu");
  /* ... but no longer part of the graph: refused in new nodes, plans, backward */
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_relu(held, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "rollback"));
  g_clear_error(&error);
  g_assert_null(qkv_graph_compile(g, &held, 1, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  /* a new value in the same slot is a different value: still refused */
  QkvValue *x2 = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  g_assert_nonnull(qkv_relu(x2, NULL));
  g_assert_null(qkv_relu(held, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_boxed_free(QKV_TYPE_VALUE, held);
}

/* Freed in the order Python's collector might pick: store first, then the
 * graph that took its parameters, the optimizer, and last the plan. */
static void
test_any_free_order(void)
{
  QkvParams *params = qkv_params_new();
  QkvGraph *g = qkv_graph_new();
  QkvBuilder *b = qkv_builder_new(g, params, 1);
  QkvShape s = QKV_SHAPE(3, 2);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *loss = qkv_mean(qkv_build_linear(b, "lin", x, 4, TRUE, NULL), NULL, 0, FALSE, NULL);
  g_assert_nonnull(loss);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvPlanOptions *options = qkv_plan_options_new();
  options->training = TRUE;
  QkvPlan *plan = qkv_graph_compile(g, &loss, 1, options, &error);
  g_assert_no_error(error);
  QkvOptimConfig *config = qkv_optim_config_new(QKV_OPTIMIZER_SGD, 0.5);
  QkvOptimizer *opt = qkv_optimizer_new_sgd(params, config, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) xt = qkv_tensor_new(QKV_F32, &s);
  qkv_tensor_fill(xt, 1.0);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));

  qkv_params_free(params); /* the graph, the builder and the optimizer hold it */
  qkv_builder_free(b);
  qkv_graph_free(g); /* the plan holds it */
  g_assert_true(qkv_plan_run(plan, &error));
  float before = qkv_plan_output_scalar(plan, 0);
  g_assert_true(qkv_optimizer_step(opt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  /* the mean of the 3×4 outputs of a linear layer over inputs of ones: every
   * bias and weight has gradient 3/12 = 1/4, so one SGD step of lr 0.5
   * lowers each by 1/8 and each output by 1/8 · (1 + 2 inputs) = 0.375,
   * exactly in real arithmetic; float32 rounding of the dozen O(1) terms
   * stays far below 1e-5 (each ulp near 1 is 1.2e-7) */
  g_assert_cmpfloat_with_epsilon(before - qkv_plan_output_scalar(plan, 0), 0.375, 1e-5);
  qkv_optimizer_free(opt);
  qkv_plan_free(plan);
  qkv_plan_options_free(options);
  qkv_optim_config_free(config);
}

static void
test_boxed_tensors(void)
{
  QkvShape s = QKV_SHAPE(2);
  float data[2] = {1, 2};
  g_autoptr(QkvTensor) owner = qkv_tensor_new_f32(&s, data);
  QkvTensor *shared = g_boxed_copy(QKV_TYPE_TENSOR, owner);
  g_assert_true(shared == owner); /* owns its data: the same tensor */
  qkv_tensor_f32(owner)[0] = 5;
  g_assert_cmpfloat(qkv_tensor_get(shared, 0), ==, 5);
  g_boxed_free(QKV_TYPE_TENSOR, shared);

  g_autoptr(QkvTensor) view = qkv_tensor_new_borrowed(QKV_F32, &s, data);
  QkvTensor *copy = g_boxed_copy(QKV_TYPE_TENSOR, view);
  g_assert_true(copy != view); /* borrows: a deep copy */
  g_assert_true(qkv_tensor_owns_data(copy));
  data[0] = 7;
  g_assert_cmpfloat(qkv_tensor_get(copy, 0), ==, 1);
  g_boxed_free(QKV_TYPE_TENSOR, copy);
}

static void
test_bytes(void)
{
  gint64 dims[] = {2, 3};
  g_autoptr(QkvShape) s = qkv_shape_new(dims, 2);
  g_assert_cmpint(s->rank, ==, 2);
  g_assert_cmpint(s->dims[1], ==, 3);
  gint rank = 0;
  const gint64 *d = qkv_shape_get_dims(s, &rank);
  g_assert_cmpint(rank, ==, 2);
  g_assert_cmpint(d[0], ==, 2);
  g_autoptr(QkvShape) scalar = qkv_shape_new(NULL, 0);
  g_assert_cmpint(qkv_shape_numel(scalar), ==, 1);

  gint32 values[6] = {1, -2, 3, -4, 5, -6};
  g_autoptr(GBytes) in = g_bytes_new(values, sizeof values);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvTensor) t = qkv_tensor_new_from_bytes(QKV_I32, s, in, &error);
  g_assert_no_error(error);
  for (gint i = 0; i < 6; i++)
    g_assert_cmpfloat(qkv_tensor_get(t, i), ==, values[i]);
  g_autoptr(GBytes) out = qkv_tensor_to_bytes(t);
  g_assert_true(g_bytes_equal(in, out));

  /* a size that is not the tensor's: refused, nothing changed */
  g_autoptr(GBytes) short_bytes = g_bytes_new(values, 5 * sizeof(gint32));
  g_assert_null(qkv_tensor_new_from_bytes(QKV_I32, s, short_bytes, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_tensor_set_bytes(t, short_bytes, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_cmpfloat(qkv_tensor_get(t, 1), ==, -2);

  gint32 other[6] = {9, 8, 7, 6, 5, 4};
  g_autoptr(GBytes) refill = g_bytes_new(other, sizeof other);
  g_assert_true(qkv_tensor_set_bytes(t, refill, &error));
  g_assert_cmpfloat(qkv_tensor_get(t, 5), ==, 4);
}

static void
test_eval_to_array(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *outs[] = {qkv_relu(x, NULL), qkv_neg(x, NULL)};
  float data[3] = {-1, 0, 2};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, data);
  const gchar *names[] = {"x"};
  QkvTensor *inputs[] = {xt};
  g_autoptr(GError) error = NULL;
  g_autoptr(GPtrArray) results = qkv_graph_eval_to_array(g, names, inputs, 1, outs, 2, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(results->len, ==, 2);
  for (gint i = 0; i < 3; i++) {
    g_assert_cmpfloat(qkv_tensor_get(g_ptr_array_index(results, 0), i), ==, MAX(data[i], 0));
    g_assert_cmpfloat(qkv_tensor_get(g_ptr_array_index(results, 1), i), ==, -data[i]);
  }
  const gchar *wrong[] = {"nope"};
  g_assert_null(qkv_graph_eval_to_array(g, wrong, inputs, 1, outs, 2, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
}

static void
test_enum_types(void)
{
  GEnumClass *klass = g_type_class_ref(QKV_TYPE_DTYPE);
  g_assert_cmpstr(g_enum_get_value(klass, QKV_I32)->value_name, ==, "QKV_I32");
  g_type_class_unref(klass);
  g_assert_true(G_TYPE_IS_BOXED(QKV_TYPE_GRAPH));
  g_assert_true(G_TYPE_IS_BOXED(QKV_TYPE_PLAN));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/gtypes/value-keeps-graph", test_value_keeps_graph);
  g_test_add_func("/gtypes/rollback-keeps-held-values", test_rollback_keeps_held_values);
  g_test_add_func("/gtypes/any-free-order", test_any_free_order);
  g_test_add_func("/gtypes/boxed-tensors", test_boxed_tensors);
  g_test_add_func("/gtypes/bytes", test_bytes);
  g_test_add_func("/gtypes/eval-to-array", test_eval_to_array);
  g_test_add_func("/gtypes/enum-types", test_enum_types);
  return g_test_run();
}
