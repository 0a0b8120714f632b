/* test-hostile.c: the catalogue of defects a fault campaign found (issue 17),
 * one case each: huge but valid sizes, argument checks of the tensor
 * constructors, out-of-range optimizer step counts. Each case is input that
 * once aborted the process or was silently accepted; now it is a GError.
 * (Checkpoint files and saves have their cases in test-checkpoint.c.) */
#include "test-util.h"

#include <qkv/qkv-types.h>

#include <math.h>
#include <string.h>

/* Under AddressSanitizer an allocation above its limit aborts unless told to
 * return NULL, as the C library does. Only a sanitizer build calls this. */
const char *__asan_default_options(void);
const char *
__asan_default_options(void)
{
  return "allocator_may_return_null=1";
}

/* ---- huge but valid shapes ---- */

static void
test_params_add_huge(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(G_GINT64_CONSTANT(1) << 38, 4);
  g_assert_true(qkv_shape_is_valid(&s));
  g_assert_null(qkv_params_add(params, "huge.weight", &s, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
  g_test_message("%s", error->message);
  g_assert_nonnull(strstr(error->message, "'huge.weight'"));
  g_assert_nonnull(strstr(error->message, "4398046511104 bytes"));
  /* the store is unchanged and the name stays free */
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  g_assert_null(qkv_params_lookup(params, "huge.weight"));
  QkvShape small = QKV_SHAPE(2);
  g_clear_error(&error);
  g_assert_nonnull(qkv_params_add(params, "huge.weight", &small, &error));
  g_assert_no_error(error);
}

static void
test_tensor_new_huge(void)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(G_GINT64_CONSTANT(1) << 40);
  g_assert_null(qkv_tensor_try_new(QKV_F32, &s, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
  g_test_message("%s", error->message);
  g_assert_nonnull(strstr(error->message, "4398046511104 bytes"));
  g_assert_nonnull(strstr(error->message, "(1099511627776)"));
  /* the plain constructor has no GError: NULL, and no abort */
  g_assert_null(qkv_tensor_new(QKV_F32, &s));
}

static void
test_compile_huge_intermediate(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(G_GINT64_CONSTANT(1) << 20, G_GINT64_CONSTANT(1) << 18);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  g_assert_no_error(error);
  QkvValue *y = qkv_relu(x, &error);
  g_assert_no_error(error);
  QkvValue *z = qkv_relu(y, &error);
  g_assert_no_error(error);
  QkvPlan *plan = qkv_graph_compile(g, &z, 1, NULL, &error);
  g_assert_null(plan);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
  g_test_message("%s", error->message);
  g_assert_nonnull(strstr(error->message, "arena"));
  g_assert_nonnull(strstr(error->message, "1099511627776 bytes"));
  g_assert_nonnull(strstr(error->message, "(1048576, 262144)"));
}

/* Plugin-style ops: one with a huge output, one asking for huge scratch. */
static const gchar *const one_input[] = {"x", NULL};
static const gchar *const one_output[] = {"y", NULL};

static gboolean
huge_output_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->n_outputs = 1;
  ctx->out_shapes[0] = QKV_SHAPE(G_GINT64_CONSTANT(1) << 22, G_GINT64_CONSTANT(1) << 22);
  ctx->out_dtypes[0] = QKV_F32;
  return TRUE;
}

static gboolean
same_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->n_outputs = 1;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  ctx->out_dtypes[0] = QKV_F32;
  return TRUE;
}

static void
never_runs(const QkvKernelCtx *ctx)
{
  g_assert_not_reached();
}

static gsize
scratch_near_max(const QkvShapeCtx *ctx, gint n_threads)
{
  /* rounding it up to the arena alignment would wrap around */
  return G_MAXSIZE - 5;
}

static gsize
scratch_petabyte(const QkvShapeCtx *ctx, gint n_threads)
{
  return (gsize)1 << 50;
}

static void
register_hostile_ops(void)
{
  static const QkvOpDef defs[] = {
      {QKV_OP_DEF_INIT, .name = "hostile.huge_output", .min_inputs = 1, .max_inputs = 1,
       .input_names = one_input, .output_names = one_output, .shape = huge_output_shape,
       .forward = never_runs},
      {QKV_OP_DEF_INIT, .name = "hostile.scratch_wraps", .min_inputs = 1, .max_inputs = 1,
       .input_names = one_input, .output_names = one_output, .shape = same_shape,
       .forward = never_runs, .scratch_size = scratch_near_max},
      {QKV_OP_DEF_INIT, .name = "hostile.scratch_huge", .min_inputs = 1, .max_inputs = 1,
       .input_names = one_input, .output_names = one_output, .shape = same_shape,
       .forward = never_runs, .scratch_size = scratch_petabyte},
  };
  for (guint i = 0; i < G_N_ELEMENTS(defs); i++) {
    if (qkv_op_lookup(defs[i].name) != NULL)
      continue;
    g_autoptr(GError) error = NULL;
    g_assert_true(qkv_op_register(&defs[i], &error));
    g_assert_no_error(error);
  }
}

static void
test_plugin_op_huge(void)
{
  register_hostile_ops();
  const struct {
    const gchar *op, *needle1, *needle2;
  } cases[] = {
      {"hostile.huge_output", "70368744177664 bytes", "(4194304, 4194304)"},
      {"hostile.scratch_wraps", "more than", "scratch memory of node"},
      {"hostile.scratch_huge", "1125899906842624 bytes", "op 'hostile.scratch_huge'"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(QkvGraph) g = qkv_graph_new();
    g_autoptr(GError) error = NULL;
    QkvShape s = QKV_SHAPE(4);
    QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
    QkvValue *y = qkv_graph_op(g, cases[i].op, &x, 1, NULL, &error);
    g_assert_no_error(error);
    g_assert_null(qkv_graph_compile(g, &y, 1, NULL, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
    g_test_message("%s: %s", cases[i].op, error->message);
    g_assert_nonnull(strstr(error->message, cases[i].needle1));
    g_assert_nonnull(strstr(error->message, cases[i].needle2));
  }
}

/* ---- tensor constructors ---- */

static void
test_tensor_bad_arguments(void)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(3);
  g_assert_null(qkv_tensor_try_new((QkvDType)7, &s, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_DTYPE);
  g_assert_nonnull(strstr(error->message, "dtype 7"));
  g_clear_error(&error);

  g_assert_null(qkv_tensor_try_new_borrowed(QKV_F32, &s, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "NULL"));
  g_clear_error(&error);

  float data[3] = {1, 2, 3};
  g_assert_null(qkv_tensor_try_new_borrowed((QkvDType)7, &s, data, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_DTYPE);
  g_clear_error(&error);
  QkvShape bad = QKV_SHAPE(-1, 3);
  g_assert_null(qkv_tensor_try_new(QKV_F32, &bad, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "(-1, 3)"));
  g_clear_error(&error);

  /* the GError-less constructors: NULL with a critical warning, no tensor
   * that a later qkv_tensor_fill() would write through */
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*data != NULL*");
  g_assert_null(qkv_tensor_new_borrowed(QKV_F32, &s, NULL));
  g_test_assert_expected_messages();
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*dtype*");
  g_assert_null(qkv_tensor_new((QkvDType)7, &s));
  g_test_assert_expected_messages();
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*dtype*");
  g_assert_null(qkv_tensor_new_borrowed((QkvDType)7, &s, data));
  g_test_assert_expected_messages();

  /* and the good cases still work */
  g_autoptr(QkvTensor) t = qkv_tensor_try_new_borrowed(QKV_F32, &s, data, &error);
  g_assert_no_error(error);
  qkv_tensor_fill(t, 4.0);
  g_assert_cmpfloat(data[2], ==, 4.0f);
}

/* ---- optimizer step counts ---- */

static void
test_optimizer_step_range(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3), scalar = qkv_shape_scalar();
  QkvParam *w = qkv_params_add(params, "w", &ws, NULL);
  qkv_tensor_fill(qkv_param_value(w), 1.0);
  qkv_tensor_fill(qkv_param_grad(w), 0.5);
  QkvOptimConfig c = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_optimizer_step(opt, &error));
  g_assert_no_error(error);
  gint32 *step = qkv_tensor_i32(qkv_param_state_full(w, "step", QKV_I32, &scalar));
  g_assert_cmpint(step[0], ==, 1);

  /* a negative count would make every value NaN; G_MAXINT32 cannot count on */
  const gint32 refused[] = {-1, -5, G_MININT32, G_MAXINT32};
  for (guint i = 0; i < G_N_ELEMENTS(refused); i++) {
    step[0] = refused[i];
    g_autoptr(QkvTensor) before = qkv_tensor_copy(qkv_param_value(w));
    g_assert_false(qkv_optimizer_step(opt, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_test_message("%s", error->message);
    g_assert_nonnull(strstr(error->message, "'w'"));
    g_clear_error(&error);
    g_assert_cmpint(step[0], ==, refused[i]);
    g_assert_cmpfloat(qkv_tensor_max_rel_diff(qkv_param_value(w), before, 1), ==, 0);
    g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 1);
  }
  /* the last count that can still advance does, to finite values */
  step[0] = G_MAXINT32 - 1;
  g_assert_true(qkv_optimizer_step(opt, &error));
  g_assert_no_error(error);
  g_assert_cmpint(step[0], ==, G_MAXINT32);
  for (gint64 i = 0; i < 3; i++)
    g_assert_true(isfinite(qkv_tensor_get(qkv_param_value(w), i)));

  /* the optimizer's own 64-bit count stops at G_MAXINT64 */
  step[0] = 5;
  qkv_optimizer_set_step(opt, G_MAXINT64);
  g_assert_false(qkv_optimizer_step(opt, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_cmpint(step[0], ==, 5);
}

/* A schedule position restored as G_MAXINT64 (checkpoints accept it)
 * overflowed at the next qkv_schedule_step(). */
static void
test_schedule_position_limit(void)
{
  g_autoptr(QkvSchedule) s = qkv_schedule_new_step(0.1, 10, 0.5);
  qkv_schedule_set_position(s, G_MAXINT64 - 1);
  double lr = qkv_schedule_step(s, NULL);
  g_assert_cmpint(qkv_schedule_get_position(s), ==, G_MAXINT64);
  g_assert_cmpfloat(qkv_schedule_step(s, NULL), ==, lr);
  g_assert_cmpint(qkv_schedule_get_position(s), ==, G_MAXINT64);
}

/* ---- attention on huge but valid inputs (issue 29, item 6) ----
 *
 * q and k of (2, 2^31, 4) are valid tensors (2^34 floats each), but the
 * scores they imply, 2 · 2^31 · 2^31 of them, overflowed gint64 in the
 * builders' flash decision (signed overflow under UBSan) and in the kernels'
 * products. Each op refuses them where they enter, when the node is built;
 * nothing is allocated. With QKV_FLASH_ATTENTION=1 (the memory-efficient
 * kernel, whose weights output is only the row statistics) the nodes were
 * accepted. */

static QkvValue *
huge_input(QkvGraph *g, const gchar *name, QkvShape s)
{
  g_autoptr(GError) error = NULL;
  QkvValue *x = qkv_graph_input(g, name, QKV_F32, &s, &error);
  g_assert_no_error(error);
  return x;
}

/* force: the builders' choice by size (unset) or always flash */
static void
set_flash_env(gboolean force)
{
  if (force)
    g_setenv("QKV_FLASH_ATTENTION", "1", TRUE);
  else
    g_unsetenv("QKV_FLASH_ATTENTION");
}

static void
assert_huge_attention_error(QkvValue *out, GError *error)
{
  g_assert_null(out);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_test_message("%s", error->message);
  g_assert_nonnull(strstr(error->message, "2^63 bytes"));
}

static void
test_attention_huge(void)
{
  const gint64 n = G_GINT64_CONSTANT(1) << 31;
  for (gint c = 0; c < 4; c++) {
    gboolean want_weights = c & 1;
    set_flash_env(c < 2);
    g_autoptr(QkvGraph) g = qkv_graph_new();
    g_autoptr(GError) error = NULL;
    QkvValue *q = huge_input(g, "q", QKV_SHAPE(2, n, 4));
    QkvValue *k = huge_input(g, "k", QKV_SHAPE(2, n, 4));
    QkvValue *v = huge_input(g, "v", QKV_SHAPE(2, n, 4));
    QkvValue *weights = NULL;
    QkvValue *out =
        qkv_dot_product_attention(q, k, v, NULL, TRUE, 0.0, want_weights ? &weights : NULL, &error);
    assert_huge_attention_error(out, error);
  }
  g_unsetenv("QKV_FLASH_ATTENTION");
  /* the fused backward op, built by name as a gradient rule would */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(GError) error = NULL;
  QkvValue *inputs[] = {
      huge_input(g, "q", QKV_SHAPE(2, n, 4)),   huge_input(g, "k", QKV_SHAPE(2, n, 4)),
      huge_input(g, "v", QKV_SHAPE(2, n, 4)),   huge_input(g, "stats", QKV_SHAPE(2, n, 2)),
      huge_input(g, "out", QKV_SHAPE(2, n, 4)), huge_input(g, "dout", QKV_SHAPE(2, n, 4))};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  g_variant_builder_add(&attrs, "{sv}", "grad_out", g_variant_new_boolean(TRUE));
  QkvNode *node = qkv_graph_add_node(g, "dot_product_attention_backward", inputs,
                                     G_N_ELEMENTS(inputs), g_variant_builder_end(&attrs), &error);
  assert_huge_attention_error((QkvValue *)node, error);
}

static void
test_mha_huge(void)
{
  const gint64 n = G_GINT64_CONSTANT(1) << 31;
  for (gint c = 0; c < 4; c++) {
    gboolean want_weights = c & 1;
    set_flash_env(c < 2);
    g_autoptr(GError) error = NULL;
    g_autoptr(QkvGraph) g = qkv_graph_new();
    QkvValue *x = huge_input(g, "x", QKV_SHAPE(2, n, 4));
    QkvValue *w[4];
    for (guint i = 0; i < 4; i++)
      w[i] = huge_input(g, (const gchar *[]){"w_q", "w_k", "w_v", "w_o"}[i], QKV_SHAPE(4, 4));
    QkvValue *weights = NULL;
    QkvValue *out = qkv_multi_head_attention(x, x, x, w[0], w[1], w[2], w[3], NULL, 2, NULL, TRUE,
                                             0.0, want_weights ? &weights : NULL, &error);
    assert_huge_attention_error(out, error);
  }
  g_unsetenv("QKV_FLASH_ATTENTION");
}

/* ---- indices a user can pass ---- */

/* Any message logged while a test that installs this runs fails it. */
static void
fail_on_any_message(const gchar *domain, GLogLevelFlags level, const gchar *message,
                    gpointer user_data)
{
  g_error("unexpected message [%s]: %s", domain != NULL ? domain : "", message);
}

/* An index, axis or output number one past the end (a count from another
 * object, an off-by-one) is a value, not a broken pointer: the getters
 * return their documented out-of-range results and log nothing. */
static void
test_index_past_end_quiet(void)
{
  guint handler = g_log_set_handler(
      "qkv", G_LOG_LEVEL_MASK | G_LOG_FLAG_FATAL | G_LOG_FLAG_RECURSION, fail_on_any_message, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3), xs = QKV_SHAPE(2, 3);
  QkvParam *w = qkv_params_add(params, "w", &ws, &error);
  g_assert_no_error(error);
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, &error);
  g_assert_no_error(error);

  /* params and their states */
  g_assert_true(qkv_params_nth(params, 0) == w);
  g_assert_null(qkv_params_nth(params, 1));
  g_assert_null(qkv_params_nth(params, G_MAXUINT));
  guint n_states = qkv_param_n_states(w);
  const guint past_states[] = {n_states, n_states + 1, G_MAXUINT};
  for (guint i = 0; i < G_N_ELEMENTS(past_states); i++) {
    QkvTensor *state = (QkvTensor *)w;
    g_assert_null(qkv_param_nth_state(w, past_states[i], &state));
    g_assert_null(state);
  }

  /* a graph's node outputs, a plan's outputs */
  g_autoptr(QkvGraph) graph = qkv_graph_new();
  QkvValue *x = qkv_graph_input(graph, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_add(x, qkv_graph_param(graph, params, "w", &error), &error);
  QkvValue *total = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(y);
  guint n_out = qkv_node_n_outputs(node);
  g_assert_true(qkv_node_output(node, n_out - 1) == y);
  g_assert_null(qkv_node_output(node, n_out));
  g_assert_null(qkv_node_output(node, G_MAXUINT));
  QkvValue *outs[] = {y, total};
  QkvPlanOptions o = qkv_plan_options_default();
  g_autoptr(QkvPlan) plan = qkv_graph_compile(graph, outs, 2, &o, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) xt = qkv_test_uniform(&xs, 3, -1, 1);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  const QkvTensor *yt = qkv_plan_output(plan, 0);
  g_assert_nonnull(yt);
  double sum = 0, magnitude = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(yt); i++) {
    sum += qkv_tensor_get(yt, i);
    magnitude += fabs(qkv_tensor_get(yt, i));
  }
  /* a float32 sum of six terms: within gamma(6) ~ 6 u of their magnitudes */
  g_assert_cmpfloat(fabs(qkv_plan_output_scalar(plan, 1) - sum), <=, 6 * QKV_TEST_U * magnitude);
  g_assert_null(qkv_plan_output(plan, 2));
  g_assert_null(qkv_plan_output(plan, G_MAXUINT));
  g_assert_true(isnan(qkv_plan_output_scalar(plan, 2)));
  g_assert_true(isnan(qkv_plan_output_scalar(plan, G_MAXUINT)));

  /* a tensor's axes and elements */
  g_assert_cmpint(qkv_tensor_dim(yt, 1), ==, 3);
  g_assert_cmpint(qkv_tensor_dim(yt, -2), ==, 2);
  const gint bad_axes[] = {2, 3, -3, G_MAXINT, G_MININT};
  for (guint i = 0; i < G_N_ELEMENTS(bad_axes); i++)
    g_assert_cmpint(qkv_tensor_dim(yt, bad_axes[i]), ==, -1);
  const gint64 bad_index[] = {6, 7, -1, G_MAXINT64, G_MININT64};
  for (guint i = 0; i < G_N_ELEMENTS(bad_index); i++)
    g_assert_true(isnan(qkv_tensor_get(yt, bad_index[i])));
  g_log_remove_handler("qkv", handler);
}

/* A rank outside [0, QKV_MAX_RANK] is refused quietly: qkv_shape_from_array
 * gave a scalar shape (accepted by every constructor) with a critical. */
static void
test_shape_rank_out_of_range_quiet(void)
{
  guint handler = g_log_set_handler(
      "qkv", G_LOG_LEVEL_MASK | G_LOG_FLAG_FATAL | G_LOG_FLAG_RECURSION, fail_on_any_message, NULL);
  gint64 dims[QKV_MAX_RANK + 1];
  for (gint i = 0; i <= QKV_MAX_RANK; i++)
    dims[i] = 1;
  const gint bad[] = {QKV_MAX_RANK + 1, -1, G_MININT};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    QkvShape s = qkv_shape_from_array(bad[i], dims);
    g_assert_false(qkv_shape_is_valid(&s));
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_tensor_try_new(QKV_F32, &s, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
    g_assert_null(qkv_shape_new(dims, bad[i]));
  }
  /* the largest rank still works */
  QkvShape top = qkv_shape_from_array(QKV_MAX_RANK, dims);
  g_assert_true(qkv_shape_is_valid(&top));
  g_assert_cmpint(top.rank, ==, QKV_MAX_RANK);
  QkvShape *heap = qkv_shape_new(dims, QKV_MAX_RANK);
  g_assert_nonnull(heap);
  g_assert_true(qkv_shape_equal(heap, &top));
  qkv_shape_free(heap);
  g_log_remove_handler("qkv", handler);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/hostile/params-add-huge", test_params_add_huge);
  g_test_add_func("/hostile/tensor-new-huge", test_tensor_new_huge);
  g_test_add_func("/hostile/compile-huge-intermediate", test_compile_huge_intermediate);
  g_test_add_func("/hostile/plugin-op-huge", test_plugin_op_huge);
  g_test_add_func("/hostile/tensor-bad-arguments", test_tensor_bad_arguments);
  g_test_add_func("/hostile/optimizer-step-range", test_optimizer_step_range);
  g_test_add_func("/hostile/schedule-position-limit", test_schedule_position_limit);
  g_test_add_func("/hostile/attention-huge", test_attention_huge);
  g_test_add_func("/hostile/mha-huge", test_mha_huge);
  g_test_add_func("/hostile/index-past-end-quiet", test_index_past_end_quiet);
  g_test_add_func("/hostile/shape-rank-out-of-range-quiet", test_shape_rank_out_of_range_quiet);
  return g_test_run();
}
