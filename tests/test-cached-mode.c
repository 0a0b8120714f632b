/* test-cached-mode.c: a builder's cached mode (QkvBuilderCache) and the
 * generation around it: the "positions" op, qkv_plan_reorder_states(), the
 * caches a cached builder makes and what it refuses, and a small GPT (the
 * shape of examples/gpt's) whose 256 tokens generated through its caches
 * (QkvPlanDecoder under qkv_generate()) have the logits of the same model
 * recomputed on the whole sequence, to within a bound derived from the
 * arithmetic; QkvPlanDecoder's restart of a full context, and its beam
 * reordering, against recomputation; and the attention weights of a cached
 * self-attention against recomputation. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-decode.h>

#define F32(t) ((const float *)qkv_tensor_const_data(t))
#define I32(t) ((const gint32 *)qkv_tensor_const_data(t))

/* ---- the positions op ------------------------------------------------------ */

static void
test_positions_op(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_I32, QKV_SHAPE(2, 5));
  QkvValue *starts = qkv_test_input(g, "starts", QKV_I32, QKV_SHAPE(2));
  QkvValue *outs[] = {qkv_positions(x, NULL, 0, &error), qkv_positions(x, starts, 1, &error)};
  g_assert_no_error(error);
  QkvShape xs = QKV_SHAPE(2, 5), ss = QKV_SHAPE(2);
  g_autoptr(QkvTensor) xt = qkv_tensor_new(QKV_I32, &xs);
  const gint32 sv[] = {3, 10};
  g_autoptr(QkvTensor) st = qkv_tensor_new_i32(&ss, sv);
  const gchar *names[] = {"x", "starts"};
  QkvTensor *ins[] = {xt, st};
  QkvTensor *res[2] = {NULL, NULL};
  g_assert_true(qkv_graph_eval(g, names, ins, 2, outs, res, 2, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_tensor_shape(res[0])->rank, ==, 1);
  for (gint i = 0; i < 5; i++) {
    g_assert_cmpint(I32(res[0])[i], ==, i);
    for (gint b = 0; b < 2; b++)
      g_assert_cmpint(I32(res[1])[b * 5 + i], ==, sv[b] + 1 + i);
  }
  qkv_tensor_free(res[0]);
  qkv_tensor_free(res[1]);

  /* T follows a shorter x bound to the plan */
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 2, NULL, &error);
  g_assert_no_error(error);
  QkvShape short_shape = QKV_SHAPE(2, 3);
  g_autoptr(QkvTensor) shorter = qkv_tensor_new(QKV_I32, &short_shape);
  g_assert_true(qkv_plan_bind(plan, "x", shorter, &error) &&
                qkv_plan_bind(plan, "starts", st, &error) && qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_tensor_dim(qkv_plan_output(plan, 0), 0), ==, 3);
  g_assert_cmpint(qkv_tensor_dim(qkv_plan_output(plan, 1), 1), ==, 3);
  g_assert_cmpint(I32(qkv_plan_output(plan, 1))[3 + 2], ==, 10 + 1 + 2);

  /* starts: i32, one per row of x */
  QkvValue *wrong = qkv_test_input(g, "wrong", QKV_I32, QKV_SHAPE(3));
  QkvValue *f = qkv_test_input(g, "f", QKV_F32, QKV_SHAPE(2));
  qkv_assert_op_fails(g, "positions", QKV_ERROR_SHAPE, qkv_positions(x, wrong, 0, &error_));
  qkv_assert_op_fails(g, "positions", QKV_ERROR_SHAPE, qkv_positions(x, f, 0, &error_));
  qkv_assert_op_fails(g, "positions", QKV_ERROR_SHAPE, qkv_positions(starts, starts, 0, &error_));
}

/* ---- reordering a plan's states ---------------------------------------------- */

static void
test_reorder_states(void)
{
  const gint B = 4, T = 3;
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape cs = QKV_SHAPE(B, 1, T, 2);
  QkvValue *state = qkv_graph_state(g, "cache", QKV_F32, &cs, &error);
  QkvValue *fresh = qkv_test_input(g, "new", QKV_F32, QKV_SHAPE(B, 1, 1, 2));
  QkvValue *pos = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(B));
  QkvValue *keys = qkv_kv_cache_append(state, fresh, pos, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &keys, 1, NULL, &error);
  g_assert_no_error(error);
  QkvShape ns = QKV_SHAPE(B, 1, 1, 2), bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) nt = qkv_test_uniform(&ns, 1, -1, 1);
  g_autoptr(QkvTensor) pt = qkv_tensor_new(QKV_I32, &bs);
  g_assert_true(qkv_plan_bind(plan, "new", nt, &error) &&
                qkv_plan_bind(plan, "positions", pt, &error));
  for (gint t = 0; t < T; t++) {
    qkv_tensor_fill(pt, t);
    for (gint i = 0; i < B * 2; i++)
      qkv_tensor_f32(nt)[i] = (float)(100 * t + i);
    g_assert_true(qkv_plan_run(plan, &error));
  }
  g_autoptr(QkvTensor) before = qkv_tensor_copy(qkv_plan_state(plan, "cache"));
  /* three rows take their parents (row 2 twice, row 1 none); row 3 stays */
  const gint32 parents[] = {2, 2, 0};
  g_assert_true(qkv_plan_reorder_states(plan, parents, 3, &error));
  g_assert_no_error(error);
  const QkvTensor *after = qkv_plan_state(plan, "cache");
  const gint row = T * 2;
  for (gint r = 0; r < B; r++)
    for (gint i = 0; i < row; i++)
      g_assert_cmpfloat(F32(after)[r * row + i], ==,
                        F32(before)[(r < 3 ? parents[r] : r) * row + i]);
  /* a parent outside the rows, too many rows: refused, nothing moves */
  g_autoptr(QkvTensor) kept = qkv_tensor_copy(after);
  const gint32 bad[] = {0, 3, 1};
  g_assert_false(qkv_plan_reorder_states(plan, bad, 3, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "parents[1]"));
  g_clear_error(&error);
  const gint32 five[] = {0, 1, 2, 3, 4};
  g_assert_false(qkv_plan_reorder_states(plan, five, 5, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  qkv_assert_values(after, F32(kept), B * row, 0);
}

/* ---- a small GPT --------------------------------------------------------------- */

enum { VOCAB = 13, D = 16, HEADS = 2, LAYERS = 2, PROMPT = 8, NEW = 256, T_MAX = PROMPT + NEW };
enum { ROWS = 2 };

/* wider tables than GPT-2's 0.02 so that attention is far from uniform */
static const QkvBuilderInits inits = {.embedding = {.kind = QKV_INIT_NORMAL, .std = 0.5}};

/* examples/gpt/model.c's model (pre-LN blocks, learned positions, biased
 * attention, GELU, tied output) at test sizes: tokens (B, T) → logits
 * (B, T, VOCAB); ln1 (may be NULL) gets each block's attention input,
 * *h the final LayerNorm's output (B, T, D). */
static QkvValue *
tiny_gpt(QkvBuilder *b, QkvValue *tokens, QkvValue **ln1, QkvValue **h, GError **error)
{
  QkvShape te = QKV_SHAPE(VOCAB, D), pe = QKV_SHAPE(T_MAX, D);
  QkvValue *wte = qkv_build_param_init(b, "wte", &te, &inits.embedding, error);
  QkvValue *wpe = qkv_build_param_init(b, "wpe", &pe, &inits.embedding, error);
  QkvValue *pos = qkv_embedding(qkv_build_positions(b, tokens, error), wpe, error);
  QkvValue *x = qkv_add(qkv_embedding(tokens, wte, error), pos, error);
  QkvMhaOptions attention = {.causal = TRUE, .bias = TRUE};
  for (gint i = 0; i < LAYERS; i++) {
    qkv_builder_push_printf(b, error, "blocks.%d", i);
    QkvValue *a = qkv_build_layer_norm(b, "ln1", x, 1e-5, TRUE, TRUE, error);
    if (ln1 != NULL)
      ln1[i] = a;
    a = qkv_build_mha_full(b, "attn", a, a, a, D, HEADS, &attention, NULL, error);
    x = qkv_add(x, a, error);
    a = qkv_build_layer_norm(b, "ln2", x, 1e-5, TRUE, TRUE, error);
    a = qkv_build_ffn_activation(b, "mlp", a, 4 * D, D, QKV_ACTIVATION_GELU, error);
    x = qkv_add(x, a, error);
    qkv_builder_pop(b);
  }
  *h = qkv_build_layer_norm(b, "ln_f", x, 1e-5, TRUE, TRUE, error);
  return qkv_matmul(*h, wte, FALSE, TRUE, error);
}

/* The one-token plan of the model over params: inputs "tokens" (rows, 1) and
 * "positions" (rows), caches of max_len. */
static QkvPlan *
step_plan(QkvParams *params, gint rows, gint64 max_len, QkvGraph **graph)
{
  g_autoptr(GError) error = NULL;
  *graph = qkv_graph_new();
  QkvValue *pos = qkv_test_input(*graph, "positions", QKV_I32, QKV_SHAPE(rows));
  QkvValue *tokens = qkv_test_input(*graph, "tokens", QKV_I32, QKV_SHAPE(rows, 1));
  QkvBuilderCache cache = {.max_len = max_len, .positions = pos};
  QkvBuilder b = {.graph = *graph, .params = params, .seed = 3, .inits = &inits, .cache = &cache};
  QkvValue *h = NULL;
  QkvValue *logits = tiny_gpt(&b, tokens, NULL, &h, &error);
  g_assert_no_error(error);
  QkvPlan *plan = qkv_graph_compile(*graph, &logits, 1, NULL, &error);
  g_assert_no_error(error);
  return plan;
}

/* The model recomputed on whole sequences tokens (B, T): logits (B, T,
 * VOCAB), h (B, T, D) and each block's attention input (B, T, D). */
static void
full_run(QkvParams *params, QkvTensor *tokens, QkvTensor **logits, QkvTensor **h, QkvTensor **ln1)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *tv = qkv_test_input(g, "tokens", QKV_I32, *qkv_tensor_shape(tokens));
  QkvBuilder b = {.graph = g, .params = params, .seed = 3, .inits = &inits};
  QkvValue *outs[2 + LAYERS];
  outs[0] = tiny_gpt(&b, tv, outs + 2, &outs[1], &error);
  g_assert_no_error(error);
  QkvTensor *res[2 + LAYERS];
  const gchar *names[] = {"tokens"};
  g_assert_true(qkv_graph_eval(g, names, &tokens, 1, outs, res, 2 + LAYERS, &error));
  g_assert_no_error(error);
  *logits = res[0];
  *h = res[1];
  for (gint i = 0; i < LAYERS; i++)
    if (ln1 != NULL)
      ln1[i] = res[2 + i];
    else
      qkv_tensor_free(res[2 + i]);
}

static double
param_at(QkvParams *params, const gchar *name, gint64 i)
{
  return F32(qkv_param_value(qkv_params_lookup(params, name)))[i];
}

/* S: the largest Σ_i |q_i||k_i| / √d_head over the score terms any query
 * forms with a key at or before it, q and k recomputed in double from each
 * block's attention input (the full run's ln1 outputs). */
static double
score_magnitude(QkvParams *params, QkvTensor *const *ln1, gint B, gint T)
{
  const gint dh = D / HEADS;
  double s = 0;
  g_autofree double *q = g_new(double, (gsize)T *D), *k = g_new(double, (gsize)T *D);
  for (gint l = 0; l < LAYERS; l++) {
    g_autofree gchar *wq = g_strdup_printf("blocks.%d.attn.W_q.weight", l);
    g_autofree gchar *wk = g_strdup_printf("blocks.%d.attn.W_k.weight", l);
    g_autofree gchar *bq = g_strdup_printf("blocks.%d.attn.W_q.bias", l);
    g_autofree gchar *bk = g_strdup_printf("blocks.%d.attn.W_k.bias", l);
    for (gint b = 0; b < B; b++) {
      const float *a = F32(ln1[l]) + (gsize)b * T * D;
      for (gint t = 0; t < T; t++)
        for (gint o = 0; o < D; o++) {
          double sq = param_at(params, bq, o), sk = param_at(params, bk, o);
          for (gint j = 0; j < D; j++) {
            sq += a[t * D + j] * param_at(params, wq, o * D + j);
            sk += a[t * D + j] * param_at(params, wk, o * D + j);
          }
          q[t * D + o] = fabs(sq);
          k[t * D + o] = fabs(sk);
        }
      for (gint i = 0; i < T; i++)
        for (gint j = 0; j <= i; j++)
          for (gint hd = 0; hd < HEADS; hd++) {
            double sum = 0;
            for (gint c = hd * dh; c < (hd + 1) * dh; c++)
              sum += q[i * D + c] * k[j * D + c];
            s = MAX(s, sum / sqrt(dh));
          }
    }
  }
  return s;
}

/* The bound. Both computations do the same arithmetic in other orders: the
 * cached one projects one token per run and attends over the T_MAX slots
 * of its caches (the masked ones at weight exactly 0) with matmul, scale
 * and masked softmax; the full one runs the fused multi_head_attention op on
 * the causal square. Per block, the rounding of each sum of n terms is at
 * most sf(n) u relative to the magnitudes of its terms (sf =
 * qkv_test_sum_factor: n for short sums, 6√n for long ones), and to first
 * order a relative error of a sub-layer's output reaches the logits
 * relative to their own magnitudes unchanged (the LayerNorms renormalise,
 * the residual sums add magnitudes), except through the softmax, where a
 * score error Δs moves the attended vector by up to 2 max|Δs| relative,
 * and Δs is (2 sf(D) + sf(d_head)) u times S, the score terms' magnitude:
 *   attention  sf(D) (v) + 2 S (2 sf(D) + sf(d_head)) + sf(T) + 3 (softmax:
 *              exp, sum, divide) + sf(T) (weights · values) + sf(D) (W_o)
 *   FFN        sf(D) + 1 (GELU) + sf(4D)
 *   LayerNorm  2 sf(D) + 3 (mean, variance, the normalisation), three per
 *              block counting the final one
 *   logits     sf(D), relative to M_o = Σ_j |h_j||wte_oj|
 * summed over the blocks and doubled, as both computations err. */
static double
gpt_factor(double S)
{
  double sd = qkv_test_sum_factor(D), st = qkv_test_sum_factor(T_MAX);
  double attention = sd + 2 * S * (2 * sd + qkv_test_sum_factor(D / HEADS)) + 2 * st + 3 + sd;
  double ffn = sd + 1 + qkv_test_sum_factor(4 * D), ln = 2 * sd + 3;
  return 2 * (LAYERS * (attention + ffn + 2 * ln) + ln + sd);
}

/* M (B, T, VOCAB): Σ_j |h_j||wte_oj| per logit. */
static QkvTensor *
logit_magnitude(QkvParams *params, const QkvTensor *h)
{
  const QkvShape *hs = qkv_tensor_shape(h);
  QkvShape flat = QKV_SHAPE(hs->dims[0] * hs->dims[1], D);
  g_autoptr(QkvTensor) h2 = qkv_tensor_new_f32(&flat, F32(h));
  QkvTensor *m =
      qkv_test_abs_matmul(h2, qkv_param_value(qkv_params_lookup(params, "wte")), FALSE, TRUE);
  QkvShape out = QKV_SHAPE(hs->dims[0], hs->dims[1], VOCAB);
  QkvTensor *shaped = qkv_tensor_new_f32(&out, F32(m));
  qkv_tensor_free(m);
  return shaped;
}

/* The step callback that records what a QkvPlanDecoder fed and answered. */
typedef struct {
  QkvPlanDecoder *decoder;
  float *logits; /* (steps, rows, VOCAB) */
  gint32 *fed;   /* (rows, T_MAX) */
  gint rows, steps;
} Recorder;

static gboolean
record_step(gpointer data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
            float *logits, GError **error)
{
  Recorder *r = data;
  if (!qkv_plan_decoder_step(r->decoder, step, tokens, parents, n_rows, logits, error))
    return FALSE;
  memcpy(r->logits + (gsize)step * n_rows * VOCAB, logits, (gsize)n_rows * VOCAB * sizeof(float));
  for (gint b = 0; b < n_rows; b++)
    r->fed[b * T_MAX + step] = tokens[b];
  r->steps = step + 1;
  return TRUE;
}

/* 256 tokens sampled for two rows with prompts of 8 and 3 tokens (so the
 * rows draw from different steps on), every step's logits against the model
 * recomputed on the tokens fed. */
static void
test_gpt_cached_equals_full(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvGraph *g = NULL;
  QkvPlan *plan = step_plan(params, ROWS, T_MAX, &g);
  g_autoptr(QkvPlanDecoder) dec = qkv_plan_decoder_new(plan, ROWS, T_MAX, &error);
  g_assert_no_error(error);
  QkvShape ps = QKV_SHAPE(PROMPT + 3);
  g_autoptr(QkvTensor) prompts = qkv_test_randint(&ps, 4, 0, VOCAB);
  const gint lens[ROWS] = {PROMPT, 3};
  g_autofree float *logits = g_new(float, (gsize)T_MAX *ROWS *VOCAB);
  g_autofree gint32 *fed = g_new0(gint32, ROWS * T_MAX);
  Recorder rec = {dec, logits, fed, ROWS, 0};
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = VOCAB;
  o.sample.seed = 7;
  gint32 out[ROWS * NEW];
  gint out_lens[ROWS];
  guint64 allocs = qkv_alloc_count();
  g_assert_true(qkv_generate(&o, ROWS, qkv_tensor_i32(prompts), lens, NEW, record_step, &rec, out,
                             out_lens, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_alloc_count(), ==, allocs); /* runs allocate nothing */
  g_assert_cmpint(rec.steps, ==, PROMPT + NEW - 1);
  g_assert_cmpint(out_lens[0], ==, NEW);

  const gint T = rec.steps;
  QkvShape ts = QKV_SHAPE(ROWS, T), ls = QKV_SHAPE(ROWS, T, VOCAB);
  g_autoptr(QkvTensor) tokens = qkv_tensor_new(QKV_I32, &ts);
  g_autoptr(QkvTensor) cached = qkv_tensor_new(QKV_F32, &ls);
  for (gint b = 0; b < ROWS; b++)
    for (gint t = 0; t < T; t++) {
      qkv_tensor_i32(tokens)[b * T + t] = fed[b * T_MAX + t];
      memcpy(qkv_tensor_f32(cached) + ((gsize)b * T + t) * VOCAB,
             logits + ((gsize)t * ROWS + b) * VOCAB, VOCAB * sizeof(float));
    }
  g_autoptr(QkvTensor) full = NULL, h = NULL;
  QkvTensor *ln1[LAYERS];
  full_run(params, tokens, &full, &h, ln1);
  double S = score_magnitude(params, ln1, ROWS, T);
  for (gint i = 0; i < LAYERS; i++)
    qkv_tensor_free(ln1[i]);
  g_autoptr(QkvTensor) mag = logit_magnitude(params, h);
  double factor = gpt_factor(S);
  g_test_message("S %.2f, factor %.0f", S, factor);
  qkv_assert_bounded("cached vs full", cached, full, mag, factor);

  /* the check sees a logit off by 1e-3 of its magnitude, and a cache one
   * position behind (step t's logits against the recomputation's t − 1) */
  gint64 at = qkv_test_typical_index(full);
  g_autoptr(QkvTensor) wrong = qkv_tensor_copy(cached);
  qkv_tensor_f32(wrong)[at] += 1e-3f * F32(mag)[at];
  g_assert_false(qkv_test_check_bound(wrong, full, mag, 0, factor, NULL, NULL));
  g_autoptr(QkvTensor) behind = qkv_tensor_copy(full);
  for (gint b = 0; b < ROWS; b++)
    memcpy(qkv_tensor_f32(behind) + ((gsize)b * T + 1) * VOCAB, F32(full) + (gsize)b * T * VOCAB,
           (gsize)(T - 1) * VOCAB * sizeof(float));
  g_assert_false(qkv_test_check_bound(cached, behind, mag, 0, factor, NULL, NULL));

  qkv_plan_decoder_free(g_steal_pointer(&dec));
  qkv_plan_free(plan);
  qkv_graph_free(g);
}

/* A full cache restarts from its last max_len / 2 tokens: the logits are
 * then the recomputation's on that shorter context; and beam parents move
 * the caches' rows (two rows swapped at one step and fed the same tokens
 * after: each continues the other's history). */
static void
test_plan_decoder_restart_and_parents(void)
{
  enum { MAX_LEN = 6, STEPS = 15 };
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvGraph *g = NULL;
  QkvPlan *plan = step_plan(params, ROWS, MAX_LEN, &g);
  g_autoptr(QkvPlanDecoder) dec = qkv_plan_decoder_new(plan, ROWS, MAX_LEN, &error);
  g_assert_no_error(error);
  /* one decoder per plan: a second would rebind the inputs and share the
   * caches; after the first is freed the plan takes a new one */
  QkvPlanDecoder *second = qkv_plan_decoder_new(plan, ROWS, MAX_LEN, &error);
  g_assert_null(second);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "already has a QkvPlanDecoder"));
  g_clear_error(&error);
  qkv_plan_decoder_free(g_steal_pointer(&dec));
  dec = qkv_plan_decoder_new(plan, ROWS, MAX_LEN, &error);
  g_assert_no_error(error);
  QkvShape ss = QKV_SHAPE(ROWS, STEPS);
  g_autoptr(QkvTensor) seq = qkv_test_randint(&ss, 12, 0, VOCAB);
  /* the histories: rows swap at step 9 */
  gint32 hist[ROWS][STEPS];
  float lg[ROWS * VOCAB];
  gint start = 0;
  for (gint t = 0; t < STEPS; t++) {
    gint32 tok[ROWS], par[ROWS] = {0, 1};
    if (t == 9) {
      par[0] = 1, par[1] = 0;
      for (gint i = 0; i < t; i++) {
        gint32 x = hist[0][i];
        hist[0][i] = hist[1][i];
        hist[1][i] = x;
      }
    }
    for (gint b = 0; b < ROWS; b++)
      hist[b][t] = tok[b] = qkv_tensor_i32(seq)[b * STEPS + t];
    g_assert_true(qkv_plan_decoder_step(dec, t, tok, par, ROWS, lg, &error));
    g_assert_no_error(error);
    if (t - start == MAX_LEN)
      start = t - MAX_LEN / 2 + 1;
    /* the context the decoder should have: steps start … t */
    QkvShape cs = QKV_SHAPE(ROWS, t - start + 1);
    g_autoptr(QkvTensor) ctx = qkv_tensor_new(QKV_I32, &cs);
    for (gint b = 0; b < ROWS; b++)
      for (gint i = start; i <= t; i++)
        qkv_tensor_i32(ctx)[b * (t - start + 1) + i - start] = hist[b][i];
    g_autoptr(QkvTensor) full = NULL, h = NULL;
    QkvTensor *ln1[LAYERS];
    full_run(params, ctx, &full, &h, ln1);
    double factor = gpt_factor(score_magnitude(params, ln1, ROWS, t - start + 1));
    for (gint i = 0; i < LAYERS; i++)
      qkv_tensor_free(ln1[i]);
    g_autoptr(QkvTensor) mag = logit_magnitude(params, h);
    QkvShape rs = QKV_SHAPE(ROWS, 1, VOCAB);
    g_autoptr(QkvTensor) got = qkv_tensor_new_f32(&rs, lg);
    g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &rs);
    g_autoptr(QkvTensor) want_mag = qkv_tensor_new(QKV_F32, &rs);
    for (gint b = 0; b < ROWS; b++) {
      gsize last = ((gsize)b * (t - start + 1) + (t - start)) * VOCAB;
      memcpy(qkv_tensor_f32(want) + b * VOCAB, F32(full) + last, VOCAB * sizeof(float));
      memcpy(qkv_tensor_f32(want_mag) + b * VOCAB, F32(mag) + last, VOCAB * sizeof(float));
    }
    /* the bound of the 256-token test (its T_MAX sums are longer than these) */
    qkv_assert_bounded("restarted context", got, want, want_mag, factor);
  }
  /* steps out of order are refused */
  gint32 tok[ROWS] = {0, 0};
  g_assert_false(qkv_plan_decoder_step(dec, STEPS + 1, tok, NULL, ROWS, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_plan_decoder_step(dec, 0, tok, NULL, ROWS + 1, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  qkv_plan_decoder_free(g_steal_pointer(&dec));
  qkv_plan_free(plan);
  qkv_graph_free(g);
}

/* ---- the weights of a cached self-attention --------------------------------- */

/* A cached causal self-attention asked for its weights (the Transformer
 * decoder's self-attention taps) gives, at step s, row s of the weights of
 * the same attention recomputed on the whole sequence (the fused
 * multi_head_attention op on the causal square), zero-padded to max_len:
 * the slots after s, never written or not yet seen, exactly 0.
 *
 * The bound, per weight of row (b, h, s), in units of u to first order:
 * each computation projects q and k with sums of D terms and a bias
 * (sf(D) + 1 relative to Q_c = Σ_j |x_j||W_cj| + |b_c|, and K_c), then
 * forms the scores with sums of d_head terms and a scaling, so a score errs
 * by at most e S with e = 2 (sf(D) + 1) + sf(d_head) + 1 and S = scale ·
 * max_x Σ_c Q_c K_xc over the slots seen (computed here in double), which
 * moves a weight by 2 e S relative to itself; the softmax adds 2 S (the
 * maximum subtracted), 2 (exp, 1 ulp), sf(max_len) (the sum) and 2 (the
 * reciprocal and the product). Both computations err: factor 2, times the
 * weight. Inputs in [-1, 1] keep S, and so that bound, below the 1678 u
 * that a relative error of 1e-4 amounts to, so the check can see one. */
static void
test_cached_self_attention_weights(void)
{
  enum { MAX_LEN = 12, STEPS = 9, DH = D / HEADS };
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvMhaOptions o = {.causal = TRUE, .bias = TRUE};
  /* the step plan: one token per row at "positions" */
  g_autoptr(QkvGraph) sg = qkv_graph_new();
  QkvValue *pos = qkv_test_input(sg, "positions", QKV_I32, QKV_SHAPE(ROWS));
  QkvValue *x = qkv_test_input(sg, "x", QKV_F32, QKV_SHAPE(ROWS, 1, D));
  QkvBuilderCache cache = {.max_len = MAX_LEN, .positions = pos};
  QkvBuilder b = {.graph = sg, .params = params, .seed = 5, .cache = &cache};
  QkvValue *outs[2] = {NULL, NULL};
  outs[0] = qkv_build_mha_full(&b, "attn", x, x, x, D, HEADS, &o, &outs[1], &error);
  g_assert_no_error(error);
  QkvShape ws = QKV_SHAPE(ROWS, HEADS, 1, MAX_LEN);
  g_assert_true(qkv_shape_equal(qkv_value_shape(outs[1]), &ws));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(sg, outs, 2, NULL, &error);
  g_assert_no_error(error);
  /* the whole sequence, no cache, over the same params */
  g_autoptr(QkvGraph) fg = qkv_graph_new();
  QkvValue *xs = qkv_test_input(fg, "x", QKV_F32, QKV_SHAPE(ROWS, STEPS, D));
  QkvBuilder fb = {.graph = fg, .params = params, .seed = 5};
  QkvValue *fw = NULL;
  QkvValue *fy = qkv_build_mha_full(&fb, "attn", xs, xs, xs, D, HEADS, &o, &fw, &error);
  g_assert_no_error(error);
  g_assert_nonnull(fy);
  QkvShape seq = QKV_SHAPE(ROWS, STEPS, D);
  g_autoptr(QkvTensor) xt = qkv_test_uniform(&seq, 21, -1, 1);
  const gchar *names[] = {"x"};
  QkvTensor *full = NULL;
  g_assert_true(qkv_graph_eval(fg, names, &xt, 1, &fw, &full, 1, &error));
  g_assert_no_error(error);

  /* each step's weights row, and what the recomputation says it should be */
  QkvShape all = QKV_SHAPE(ROWS, HEADS, STEPS, MAX_LEN), one = QKV_SHAPE(ROWS, 1, D);
  QkvShape rs = QKV_SHAPE(ROWS);
  g_autoptr(QkvTensor) got = qkv_tensor_new(QKV_F32, &all);
  g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &all);
  g_autoptr(QkvTensor) mag = qkv_tensor_new(QKV_F32, &all);
  g_autoptr(QkvTensor) xone = qkv_tensor_new(QKV_F32, &one);
  g_autoptr(QkvTensor) pt = qkv_tensor_new(QKV_I32, &rs);
  for (gint s = 0; s < STEPS; s++) {
    for (gint r = 0; r < ROWS; r++)
      memcpy(qkv_tensor_f32(xone) + r * D, F32(xt) + ((gsize)r * STEPS + s) * D, D * sizeof(float));
    qkv_tensor_fill(pt, s);
    g_assert_true(qkv_plan_bind(plan, "x", xone, &error) &&
                  qkv_plan_bind(plan, "positions", pt, &error) && qkv_plan_run(plan, &error));
    g_assert_no_error(error);
    const float *w = F32(qkv_plan_output(plan, 1));
    for (gint rh = 0; rh < ROWS * HEADS; rh++)
      for (gint j = 0; j < MAX_LEN; j++) {
        gsize at = ((gsize)rh * STEPS + s) * MAX_LEN + j;
        qkv_tensor_f32(got)[at] = w[rh * MAX_LEN + j];
        qkv_tensor_f32(want)[at] = j < STEPS ? F32(full)[((gsize)rh * STEPS + s) * STEPS + j] : 0;
        if (j > s) /* not yet seen (j < STEPS) or never written */
          g_assert_cmpfloat(w[rh * MAX_LEN + j], ==, 0.0f);
      }
  }
  qkv_tensor_free(full);

  /* Q and K (ROWS, STEPS, D): the projections' magnitudes, in double */
  g_autofree double *Q = g_new(double, ROWS *STEPS *D), *K = g_new(double, ROWS *STEPS *D);
  for (gint r = 0; r < ROWS * STEPS; r++)
    for (gint c = 0; c < D; c++) {
      double mq = fabs(param_at(params, "attn.W_q.bias", c));
      double mk = fabs(param_at(params, "attn.W_k.bias", c));
      for (gint j = 0; j < D; j++) {
        mq += fabs(F32(xt)[r * D + j] * param_at(params, "attn.W_q.weight", c * D + j));
        mk += fabs(F32(xt)[r * D + j] * param_at(params, "attn.W_k.weight", c * D + j));
      }
      Q[r * D + c] = mq;
      K[r * D + c] = mk;
    }
  const double sf_d = qkv_test_sum_factor(D);
  const double e = 2 * (sf_d + 1) + qkv_test_sum_factor(DH) + 1;
  double worst = 0;
  for (gint r = 0; r < ROWS; r++)
    for (gint h = 0; h < HEADS; h++)
      for (gint s = 0; s < STEPS; s++) {
        double S = 0;
        for (gint j = 0; j <= s; j++) {
          double sum = 0;
          for (gint c = h * DH; c < (h + 1) * DH; c++)
            sum += Q[(r * STEPS + s) * D + c] * K[(r * STEPS + j) * D + c];
          S = MAX(S, sum / sqrt(DH));
        }
        double rel = 2 * e * S + 2 * S + 2 + qkv_test_sum_factor(MAX_LEN) + 2;
        worst = MAX(worst, rel);
        for (gint j = 0; j < MAX_LEN; j++) {
          gsize at = (((gsize)r * HEADS + h) * STEPS + s) * MAX_LEN + j;
          qkv_tensor_f32(mag)[at] = (float)(fabs(F32(want)[at]) * rel);
        }
      }
  double needed = qkv_assert_bounded("cached weights vs full", got, want, mag, 2.0);
  g_test_message("largest relative bound %.0f u, factor 2, needed %.2f", worst, needed);
  /* the check sees a weight off by 1e-4 of itself, and weights one step
   * behind (step s's row against the recomputation's row s − 1) */
  gint64 at = qkv_test_typical_index(want);
  g_autoptr(QkvTensor) wrong = qkv_test_perturbed(got, at, 1e-4);
  g_assert_false(qkv_test_check_bound(wrong, want, mag, 0, 2.0, NULL, NULL));
  g_autoptr(QkvTensor) behind = qkv_tensor_copy(want);
  for (gint rh = 0; rh < ROWS * HEADS; rh++)
    memcpy(qkv_tensor_f32(behind) + ((gsize)rh * STEPS + 1) * MAX_LEN,
           F32(want) + (gsize)rh * STEPS * MAX_LEN, (gsize)(STEPS - 1) * MAX_LEN * sizeof(float));
  g_assert_false(qkv_test_check_bound(got, behind, mag, 0, 2.0, NULL, NULL));
}

/* ---- what a cached builder makes and refuses ------------------------------- */

static void
test_cached_builder(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvGraph *g = NULL;
  QkvPlan *plan = step_plan(params, ROWS, 10, &g);
  /* one key and one value cache per block, named from the scope */
  for (gint l = 0; l < LAYERS; l++)
    for (gint kv = 0; kv < 2; kv++) {
      g_autofree gchar *name = g_strdup_printf("blocks.%d.attn.%s", l, kv ? "v_cache" : "k_cache");
      const QkvTensor *s = qkv_plan_state(plan, name);
      g_assert_nonnull(s);
      QkvShape want = QKV_SHAPE(ROWS, HEADS, 10, D / HEADS);
      g_assert_true(qkv_shape_equal(qkv_tensor_shape(s), &want));
    }
  g_assert_null(qkv_plan_state(plan, "blocks.2.attn.k_cache"));
  /* no more parameters than the training graph's */
  guint n = qkv_params_size(params);
  g_autoptr(QkvGraph) tg = qkv_graph_new();
  QkvBuilder tb = {.graph = tg, .params = params, .inits = &inits};
  QkvValue *h = NULL;
  g_assert_nonnull(
      tiny_gpt(&tb, qkv_test_input(tg, "t", QKV_I32, QKV_SHAPE(2, 4)), NULL, &h, &error));
  g_assert_cmpuint(qkv_params_size(params), ==, n);
  qkv_plan_free(plan);
  qkv_graph_free(g);

  /* refused: valid lengths or a mask on a cached self-attention, a cache
   * without positions; all-or-nothing */
  g_autoptr(QkvGraph) cg = qkv_graph_new();
  QkvValue *pos = qkv_test_input(cg, "positions", QKV_I32, QKV_SHAPE(2));
  QkvValue *x = qkv_test_input(cg, "x", QKV_F32, QKV_SHAPE(2, 1, D));
  QkvValue *lens = qkv_test_input(cg, "lens", QKV_I32, QKV_SHAPE(2));
  QkvBuilderCache cache = {.max_len = 4, .positions = pos};
  QkvBuilder b = {.graph = cg, .params = params, .cache = &cache};
  QkvMhaOptions o = {.causal = TRUE, .valid_lens = lens};
  guint nodes = qkv_graph_n_nodes(cg), values = qkv_graph_n_values(cg);
  g_assert_null(qkv_build_mha_full(&b, "attn", x, x, x, D, HEADS, &o, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "cached"));
  g_clear_error(&error);
  QkvBuilderCache no_pos = {.max_len = 4};
  b.cache = &no_pos;
  o.valid_lens = NULL;
  g_assert_null(qkv_build_mha_full(&b, "attn", x, x, x, D, HEADS, &o, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "positions"));
  g_clear_error(&error);
  g_assert_null(qkv_build_positions(&b, x, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_cmpuint(qkv_graph_n_nodes(cg), ==, nodes);
  g_assert_cmpuint(qkv_graph_n_values(cg), ==, values);
  /* a non-causal attention is not cached: no state */
  b.cache = &cache;
  o.causal = FALSE;
  QkvValue *y = qkv_build_mha_full(&b, "attn", x, x, x, D, HEADS, &o, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) p = qkv_graph_compile(cg, &y, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_null(qkv_plan_state(p, "attn.k_cache"));
  /* a cached one is: the weights span the cache */
  o.causal = TRUE;
  QkvValue *w = NULL;
  y = qkv_build_mha_full(&b, "attn2", x, x, x, D, HEADS, &o, &w, &error);
  g_assert_no_error(error);
  QkvShape ws = QKV_SHAPE(2, HEADS, 1, 4);
  g_assert_true(qkv_shape_equal(qkv_value_shape(w), &ws));

  /* cross_inputs: a cross-attention reads its projected keys and values
   * from inputs named from the scope, as qkv_build_mha_keys_values()
   * projects them (the Transformer step decoder's tests compare the
   * results); keys of the wrong rank are refused */
  QkvValue *src = qkv_test_input(cg, "src", QKV_F32, QKV_SHAPE(2, 5, D));
  QkvBuilderCache cross = {.max_len = 4, .positions = pos, .cross_inputs = TRUE};
  b.cache = &cross;
  o.causal = FALSE;
  y = qkv_build_mha_full(&b, "cross", x, src, src, D, HEADS, &o, &w, &error);
  g_assert_no_error(error);
  QkvShape cw = QKV_SHAPE(2, HEADS, 1, 5);
  g_assert_true(qkv_shape_equal(qkv_value_shape(w), &cw));
  QkvValue *kin = qkv_graph_lookup_input(cg, "cross.keys");
  g_assert_nonnull(kin);
  g_assert_nonnull(qkv_graph_lookup_input(cg, "cross.values"));
  QkvValue *pv = NULL;
  QkvValue *pk = qkv_build_mha_keys_values(&b, "cross", src, src, D, HEADS, &o, &pv, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_shape_equal(qkv_value_shape(pk), qkv_value_shape(kin)));
  g_assert_true(qkv_shape_equal(qkv_value_shape(pv), qkv_value_shape(kin)));
  QkvValue *flat = qkv_test_input(cg, "flat", QKV_F32, QKV_SHAPE(5, D));
  g_assert_null(qkv_build_mha_keys_values(&b, "cross", flat, flat, D, HEADS, &o, &pv, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_null(pv);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/cached-mode/positions-op", test_positions_op);
  g_test_add_func("/cached-mode/reorder-states", test_reorder_states);
  g_test_add_func("/cached-mode/gpt-cached-equals-full", test_gpt_cached_equals_full);
  g_test_add_func("/cached-mode/plan-decoder-restart-and-parents",
                  test_plan_decoder_restart_and_parents);
  g_test_add_func("/cached-mode/builder", test_cached_builder);
  g_test_add_func("/cached-mode/self-attention-weights", test_cached_self_attention_weights);
  return g_test_run();
}
