/* test-decode-precision.c: a step decoder under QKV_PRECISION_BF16 computes
 * the bf16 forward of its model, the one a plan compiled with bf16 runs over
 * the whole prefix; under fp32 (the default) the fp32 one. */
#include <math.h>
#include <string.h>
#include <qkv/qkv.h>
#include "test-util.h"

#define BOS 1
#define PAD 0

static const QkvTransformerConfig tcfg = {
    .src_vocab = 15,
    .tgt_vocab = 17,
    .num_hiddens = 32,
    .ffn_hiddens = 48,
    .num_heads = 4,
    .num_layers = 2,
};
static const QkvGruSeq2SeqConfig gcfg = {
    .src_vocab = 15, .tgt_vocab = 17, .embed_size = 12, .num_hiddens = 16, .num_layers = 2};

/* logits (B, T, V) of the full model over dec_in, its products in p */
static QkvTensor *
full_logits(gboolean transformer, QkvParams *params, QkvTensor *src, QkvTensor *valid,
            QkvTensor *dec_in, QkvPrecision p)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *s = qkv_test_input(g, "src", QKV_I32, *qkv_tensor_shape(src));
  QkvValue *v = qkv_test_input(g, "src_valid", QKV_I32, *qkv_tensor_shape(valid));
  QkvValue *d = qkv_test_input(g, "dec_in", QKV_I32, *qkv_tensor_shape(dec_in));
  QkvBuilder b = {.graph = g, .params = params, .seed = 11, .xavier_linear = TRUE};
  QkvValue *logits;
  if (transformer) {
    QkvValue *enc = qkv_build_transformer_encoder(&b, &tcfg, s, v, &error);
    logits = qkv_build_transformer_decoder(&b, &tcfg, d, enc, v, NULL, &error);
  } else {
    logits = qkv_build_bahdanau_seq2seq(&b, &gcfg, s, v, d, NULL, &error);
  }
  g_assert_no_error(error);
  QkvPlanOptions o = qkv_plan_options_default();
  o.precision = p;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &logits, 1, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "src", src, &error) &&
                qkv_plan_bind(plan, "src_valid", valid, &error) &&
                qkv_plan_bind(plan, "dec_in", dec_in, &error) && qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  return qkv_tensor_copy(qkv_plan_output(plan, 0));
}

/* the largest over rows of max|a - b| / max|b| in the row: logits near zero
 * are cancelling sums, so each row is measured against its largest logit */
static double
worst_row_diff(const float *a, const float *b, gint64 rows, gint64 n)
{
  double worst = 0;
  for (gint64 r = 0; r < rows; r++) {
    double diff = 0, mag = 0;
    for (gint64 i = 0; i < n; i++) {
      diff = MAX(diff, fabs((double)a[r * n + i] - b[r * n + i]));
      mag = MAX(mag, fabs((double)b[r * n + i]));
    }
    worst = MAX(worst, diff / mag);
  }
  return worst;
}

/* Teacher-forced: the decoder steps through dec_in's tokens, and its logits
 * (B·T rows, in step order) are compared with the full model's (B, T). */
static void
check_precision(gboolean transformer)
{
  const gint B = 3, S = 7, T = 9;
  const gint64 V = transformer ? tcfg.tgt_vocab : gcfg.tgt_vocab;
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape bs = QKV_SHAPE(B, S), b1 = QKV_SHAPE(B), bt = QKV_SHAPE(B, T);
  g_autoptr(QkvTensor) src = qkv_test_randint(&bs, 5, 3, 15);
  g_autoptr(QkvTensor) valid = qkv_tensor_new(QKV_I32, &b1);
  g_autoptr(QkvTensor) dec_in = qkv_test_randint(&bt, 6, 3, 17);
  for (gint b = 0; b < B; b++) {
    gint32 len = MAX(1, S - 3 * b);
    qkv_tensor_i32(valid)[b] = len;
    for (gint t = len; t < S; t++)
      qkv_tensor_i32(src)[b * S + t] = PAD;
    qkv_tensor_i32(dec_in)[b * T] = BOS;
  }
  /* the first full model creates the parameters the decoders read */
  g_autoptr(QkvTensor) ref32 =
      full_logits(transformer, params, src, valid, dec_in, QKV_PRECISION_FP32);
  g_autoptr(QkvTensor) ref16 =
      full_logits(transformer, params, src, valid, dec_in, QKV_PRECISION_BF16);

  float *steps[2];
  for (gint p = 0; p < 2; p++) {
    g_autoptr(QkvStepDecoder) dec =
        transformer ? qkv_step_decoder_new_transformer(params, &tcfg, B, S, T, 0, &error)
                    : qkv_step_decoder_new_bahdanau(params, &gcfg, B, S, T, 0, &error);
    g_assert_no_error(error);
    g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, QKV_PRECISION_FP32);
    qkv_step_decoder_set_precision(dec, (QkvPrecision)p);
    g_assert_cmpint(qkv_step_decoder_get_precision(dec), ==, p);
    g_assert_true(qkv_step_decoder_start(dec, src, valid, 1, &error));
    g_assert_no_error(error);
    /* (B, T, V) as the full model lays them out */
    steps[p] = g_new(float, (gsize)B *T *V);
    g_autofree float *lg = g_new(float, (gsize)B *V);
    for (gint t = 0; t < T; t++) {
      gint32 tokens[3];
      for (gint b = 0; b < B; b++)
        tokens[b] = qkv_tensor_i32(dec_in)[b * T + t];
      g_assert_true(qkv_step_decoder_step(dec, t, tokens, NULL, B, lg, &error));
      g_assert_no_error(error);
      for (gint b = 0; b < B; b++)
        memcpy(steps[p] + ((gsize)b * T + t) * V, lg + (gsize)b * V, V * sizeof(float));
    }
  }
  const float *r32 = qkv_tensor_const_data(ref32), *r16 = qkv_tensor_const_data(ref16);
  double fp32_fp32 = worst_row_diff(steps[0], r32, B * T, V);
  double bf16_bf16 = worst_row_diff(steps[1], r16, B * T, V);
  double bf16_fp32 = worst_row_diff(steps[1], r32, B * T, V);
  g_test_message("%s: decoder fp32 vs full fp32 %.3g, decoder bf16 vs full bf16 %.3g, decoder "
                 "bf16 vs full fp32 %.3g",
                 transformer ? "transformer" : "bahdanau", fp32_fp32, bf16_bf16, bf16_fp32);
  /* fp32: the same sums in another order; test-decode.c's EQUAL_REL (1e-5,
   * about 170 u of the largest logit) argues the bound */
  g_assert_cmpfloat(fp32_fp32, <=, 1e-5);
  /* bf16 moves the logits by a few u_b = 2^-8 of their size: under 1e-3 of
   * the largest logit (a quarter of u_b) it did not take effect */
  g_assert_cmpfloat(bf16_fp32, >=, 1e-3);
  /* The decoder's and the full model's bf16 products round the same
   * operands, except where a float32 reordering moved an activation across
   * a bf16 rounding boundary (probability about k·2^-16 per operand of a
   * k-term sum), so they stay far closer to each other than to fp32; the
   * factor 1/16 is test-bf16.c's (/bf16/transformer-step) for two bf16 runs
   * of the same model on different product paths. */
  g_assert_cmpfloat(bf16_bf16, <=, bf16_fp32 / 16);
  g_free(steps[0]);
  g_free(steps[1]);
}

static void
test_transformer(void)
{
  check_precision(TRUE);
}

static void
test_bahdanau(void)
{
  check_precision(FALSE);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/decode-precision/transformer", test_transformer);
  g_test_add_func("/decode-precision/bahdanau", test_bahdanau);
  return g_test_run();
}
