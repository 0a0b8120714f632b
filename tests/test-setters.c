/* test-setters.c: the setters whose value a user may give (a --precision
 * option, a mode read from a config) have try forms that refuse a bad value
 * with a GError naming the function and the value, and leave the setting as
 * it was; their void forms keep working and log the same message as a
 * critical. qkv_optimizer_try_set_lr() is tested in test-optim.c. */
#include <string.h>
#include <qkv/qkv.h>
#include "test-util.h"

/* Values that are none of an enum's members: just past both ends, and far
 * off (a garbage int). */
static const gint bad_values[] = {-1, 2, 3, 7, G_MAXINT, G_MININT};
static const gint bad_sparse_values[] = {-1, 3, 4, 7, G_MAXINT, G_MININT};

/* error is QKV_ERROR_INVALID_ARGUMENT and its message names the function,
 * the argument and its bad value, and every valid one */
static void
assert_refused(const GError *error, const gchar *function, const gchar *argument, gint value,
               const gchar *const *valid_names)
{
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_test_message("%s", error->message);
  g_autofree gchar *start = g_strdup_printf("%s: %s %d is not", function, argument, value);
  g_assert_true(g_str_has_prefix(error->message, start));
  for (guint i = 0; valid_names[i] != NULL; i++)
    g_assert_nonnull(strstr(error->message, valid_names[i]));
}

static const gchar *const precision_names[] = {"QKV_PRECISION_FP32", "QKV_PRECISION_BF16", NULL};
static const gchar *const sparse_names[] = {"QKV_SPARSE_BACKWARD_OFF", "QKV_SPARSE_BACKWARD_AUTO",
                                            "QKV_SPARSE_BACKWARD_ALWAYS", NULL};

/* a compiled plan over one matrix product (y = a · b) */
static QkvPlan *
matmul_plan(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *b = qkv_test_input(g, "b", QKV_F32, QKV_SHAPE(3, 2));
  QkvValue *y = qkv_matmul(a, b, FALSE, FALSE, &error);
  g_assert_no_error(error);
  QkvPlanOptions o = qkv_plan_options_default();
  QkvPlan *plan = qkv_graph_compile(g, &y, 1, &o, &error);
  g_assert_no_error(error);
  return plan;
}

static void
test_plan_precision(void)
{
  g_autoptr(QkvPlan) plan = matmul_plan();
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_FP32);
  /* a good value is applied, both ways */
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_try_set_precision(plan, QKV_PRECISION_BF16, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_BF16);
  for (guint i = 0; i < G_N_ELEMENTS(bad_values); i++) {
    g_assert_false(qkv_plan_try_set_precision(plan, (QkvPrecision)bad_values[i], &error));
    assert_refused(error, "qkv_plan_try_set_precision", "precision", bad_values[i],
                   precision_names);
    g_clear_error(&error);
    g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_BF16);
  }
  g_assert_true(qkv_plan_try_set_precision(plan, QKV_PRECISION_FP32, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_FP32);
  /* a NULL error: refused all the same, and nothing logged */
  g_assert_false(qkv_plan_try_set_precision(plan, (QkvPrecision)7, NULL));
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_FP32);

  /* the void form: the same message as a critical, the precision kept */
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "qkv_plan_try_set_precision: precision 7 *");
  qkv_plan_set_precision(plan, (QkvPrecision)7);
  g_test_assert_expected_messages();
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_FP32);
  qkv_plan_set_precision(plan, QKV_PRECISION_BF16);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_BF16);
}

/* A small transformer's step decoder; building the model first creates the
 * parameters the decoder reads. */
static QkvStepDecoder *
small_decoder(QkvParams *params)
{
  const QkvTransformerConfig cfg = {.src_vocab = 7,
                                    .tgt_vocab = 9,
                                    .num_hiddens = 8,
                                    .ffn_hiddens = 12,
                                    .num_heads = 2,
                                    .num_layers = 1};
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *s = qkv_test_input(g, "src", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *v = qkv_test_input(g, "src_valid", QKV_I32, QKV_SHAPE(2));
  QkvValue *d = qkv_test_input(g, "dec_in", QKV_I32, QKV_SHAPE(2, 4));
  QkvBuilder b = {.graph = g, .params = params, .seed = 3};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, s, v, &error);
  g_assert_no_error(error);
  g_assert_nonnull(qkv_build_transformer_decoder(&b, &cfg, d, enc, v, NULL, &error));
  g_assert_no_error(error);
  QkvStepDecoder *dec = qkv_step_decoder_new_transformer(params, &cfg, 2, 3, 4, 1, &error);
  g_assert_no_error(error);
  return dec;
}

static void
test_decoder_precision(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvStepDecoder) dec = small_decoder(params);
  g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_FP32);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_step_decoder_try_set_precision(dec, QKV_PRECISION_BF16, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_BF16);
  for (guint i = 0; i < G_N_ELEMENTS(bad_values); i++) {
    g_assert_false(qkv_step_decoder_try_set_precision(dec, (QkvPrecision)bad_values[i], &error));
    assert_refused(error, "qkv_step_decoder_try_set_precision", "precision", bad_values[i],
                   precision_names);
    g_clear_error(&error);
    g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_BF16);
  }
  g_assert_true(qkv_step_decoder_try_set_precision(dec, QKV_PRECISION_FP32, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_FP32);

  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL,
                        "qkv_step_decoder_try_set_precision: precision -1 *");
  qkv_step_decoder_set_precision(dec, (QkvPrecision)-1);
  g_test_assert_expected_messages();
  g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_FP32);
  qkv_step_decoder_set_precision(dec, QKV_PRECISION_BF16);
  g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_BF16);
}

static void
test_sparse_backward(void)
{
  /* process-wide: put back what the environment chose */
  QkvSparseBackward start = qkv_get_sparse_backward();
  g_autoptr(GError) error = NULL;
  const QkvSparseBackward good[] = {QKV_SPARSE_BACKWARD_ALWAYS, QKV_SPARSE_BACKWARD_OFF,
                                    QKV_SPARSE_BACKWARD_AUTO};
  for (guint m = 0; m < G_N_ELEMENTS(good); m++) {
    g_assert_true(qkv_try_set_sparse_backward(good[m], &error));
    g_assert_no_error(error);
    g_assert_cmpint(qkv_get_sparse_backward(), ==, good[m]);
    for (guint i = 0; i < G_N_ELEMENTS(bad_sparse_values); i++) {
      g_assert_false(qkv_try_set_sparse_backward((QkvSparseBackward)bad_sparse_values[i], &error));
      assert_refused(error, "qkv_try_set_sparse_backward", "mode", bad_sparse_values[i],
                     sparse_names);
      g_clear_error(&error);
      g_assert_cmpint(qkv_get_sparse_backward(), ==, good[m]);
    }
  }
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "qkv_try_set_sparse_backward: mode 3 *");
  qkv_set_sparse_backward((QkvSparseBackward)3);
  g_test_assert_expected_messages();
  g_assert_cmpint(qkv_get_sparse_backward(), ==, QKV_SPARSE_BACKWARD_AUTO);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_OFF);
  g_assert_cmpint(qkv_get_sparse_backward(), ==, QKV_SPARSE_BACKWARD_OFF);
  qkv_set_sparse_backward(start);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/setters/plan-precision", test_plan_precision);
  g_test_add_func("/setters/decoder-precision", test_decoder_precision);
  g_test_add_func("/setters/sparse-backward", test_sparse_backward);
  return g_test_run();
}
