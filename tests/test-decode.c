/* test-decode.c: incremental decoding and beam search (qkv-decode.h) —
 * positional_encoding at per-row positions, the Transformer and Bahdanau
 * step decoders against the full models recomputed on the whole prefix, and
 * beam search on a hand-made model whose scores are known. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-decode.h>

enum { PAD = 0, BOS = 1, EOS = 2 };

/* ---- positional_encoding with positions -------------------------------- */

static void
test_pe_positions(void)
{
  const gint B = 3, T = 2, D = 6;
  const gint32 starts[] = {0, 5, 17};
  g_autoptr(GError) error = NULL;
  QkvShape xs = QKV_SHAPE(B, T, D);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 7, -1, 1);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) pos = qkv_tensor_new_i32(&bs, starts);

  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *xv = qkv_test_input(g, "x", QKV_F32, xs);
  QkvValue *pv = qkv_test_input(g, "positions", QKV_I32, bs);
  QkvValue *y = qkv_positional_encoding_at(xv, pv, 0.0, 2, &error);
  g_assert_no_error(error);
  const gchar *names[] = {"x", "positions"};
  QkvTensor *ins[] = {x, pos};
  g_autoptr(QkvTensor) got = NULL;
  g_assert_true(qkv_graph_eval(g, names, ins, 2, &y, &got, 1, &error));
  g_assert_no_error(error);

  /* each row as a batch of one with the offset moved: the same floats */
  for (gint b = 0; b < B; b++) {
    QkvShape one = QKV_SHAPE(1, T, D);
    g_autoptr(QkvTensor) xb = qkv_tensor_new_f32(&one, qkv_tensor_f32(x) + (gsize)b * T * D);
    g_autoptr(QkvGraph) h = qkv_graph_new();
    QkvValue *hv = qkv_test_input(h, "x", QKV_F32, one);
    QkvValue *yb = qkv_positional_encoding(hv, 0.0, 2 + starts[b], &error);
    g_assert_no_error(error);
    const gchar *n1[] = {"x"};
    g_autoptr(QkvTensor) want = NULL;
    g_assert_true(qkv_graph_eval(h, n1, &xb, 1, &yb, &want, 1, &error));
    g_assert_cmpmem(qkv_tensor_f32(got) + (gsize)b * T * D, T * D * sizeof(float),
                    qkv_tensor_f32(want), T * D * sizeof(float));
  }

  /* positions: i32, one per batch element */
  QkvShape wrong = QKV_SHAPE(B + 1);
  QkvValue *pw = qkv_test_input(g, "p_wrong", QKV_I32, wrong);
  QkvValue *pf = qkv_test_input(g, "p_f32", QKV_F32, bs);
  qkv_assert_op_fails(g, "positional_encoding", QKV_ERROR_SHAPE,
                      qkv_positional_encoding_at(xv, pw, 0.0, 0, &error_));
  qkv_assert_op_fails(g, "positional_encoding", QKV_ERROR_DTYPE,
                      qkv_positional_encoding_at(xv, pf, 0.0, 0, &error_));

  /* the gradient still reaches x (as dy), none goes to the positions */
  qkv_value_set_requires_grad(xv, TRUE);
  QkvValue *sum = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, sum, &error));
  g_assert_no_error(error);
  QkvValue *dx = qkv_graph_gradient(g, xv);
  g_assert_nonnull(dx);
  g_autoptr(QkvTensor) dxt = NULL;
  g_assert_true(qkv_graph_eval(g, names, ins, 2, &dx, &dxt, 1, &error));
  for (gint64 i = 0; i < qkv_tensor_numel(dxt); i++)
    g_assert_cmpfloat(qkv_tensor_f32(dxt)[i], ==, 1.0f);
}

/* ---- a small Transformer and its full-prefix reference -------------------- */

static const QkvTransformerConfig tcfg = {
    .src_vocab = 15,
    .tgt_vocab = 17,
    .num_hiddens = 32,
    .ffn_hiddens = 48,
    .num_heads = 4,
    .num_layers = 2,
    .dropout = 0.1,
};
/* The same sizes with pre-LN blocks, GELU and attention biases. */
static const QkvTransformerConfig tcfg_prenorm = {
    .src_vocab = 15,
    .tgt_vocab = 17,
    .num_hiddens = 32,
    .ffn_hiddens = 48,
    .num_heads = 4,
    .num_layers = 2,
    .dropout = 0.1,
    .norm_first = TRUE,
    .ffn_activation = QKV_ACTIVATION_GELU,
    .attention_bias = TRUE,
};
static const QkvGruSeq2SeqConfig gcfg = {.src_vocab = 15,
                                         .tgt_vocab = 17,
                                         .embed_size = 12,
                                         .num_hiddens = 24,
                                         .num_layers = 2,
                                         .dropout = 0.1};

/* Luong's model on the same GRU sizes, in four of its variants. */
#define LUONG_SIZES                                                                                \
  .src_vocab = 15, .tgt_vocab = 17, .embed_size = 12, .num_hiddens = 24, .num_layers = 2,          \
  .dropout = 0.1
static const QkvLuongConfig luong_general_global = {
    LUONG_SIZES, .attention = {QKV_LUONG_GENERAL, QKV_LUONG_GLOBAL, 0}};
static const QkvLuongConfig luong_dot_local_m = {
    LUONG_SIZES, .attention = {QKV_LUONG_DOT, QKV_LUONG_LOCAL_M, 2}};
static const QkvLuongConfig luong_concat_local_m_feed = {
    LUONG_SIZES, .attention = {QKV_LUONG_CONCAT, QKV_LUONG_LOCAL_M, 2}, .input_feeding = TRUE};
static const QkvLuongConfig luong_general_local_p_feed = {
    LUONG_SIZES, .attention = {QKV_LUONG_GENERAL, QKV_LUONG_LOCAL_P, 2}, .input_feeding = TRUE};

/* Which model a test decodes. */
typedef struct {
  const gchar *name;
  gboolean transformer;
  const QkvLuongConfig *luong;    /* NULL: the Transformer or Bahdanau */
  const QkvTransformerConfig *tc; /* the Transformer's: NULL for tcfg */
} ModelCase;

static const ModelCase transformer_case = {"transformer", TRUE, NULL, NULL};
static const ModelCase prenorm_case = {"transformer pre-LN GELU biases", TRUE, NULL, &tcfg_prenorm};

static const QkvTransformerConfig *
model_tc(const ModelCase *mc)
{
  return mc->tc != NULL ? mc->tc : &tcfg;
}

static const ModelCase bahdanau_case = {"bahdanau", FALSE, NULL, NULL};
static const ModelCase luong_cases[] = {
    {"luong general global", FALSE, &luong_general_global, NULL},
    {"luong dot local-m", FALSE, &luong_dot_local_m, NULL},
    {"luong concat local-m input feeding", FALSE, &luong_concat_local_m_feed, NULL},
    {"luong general local-p input feeding", FALSE, &luong_general_local_p_feed, NULL},
};

static gint64
model_vocab(const ModelCase *mc)
{
  return mc->transformer ? model_tc(mc)->tgt_vocab
         : mc->luong     ? mc->luong->tgt_vocab
                         : gcfg.tgt_vocab;
}

static QkvStepDecoder *
model_decoder(const ModelCase *mc, QkvParams *params, gint rows, gint S, gint L, GError **error)
{
  if (mc->transformer)
    return qkv_step_decoder_new_transformer(params, model_tc(mc), rows, S, L, 0, error);
  if (mc->luong)
    return qkv_step_decoder_new_luong(params, mc->luong, rows, S, L, 0, error);
  return qkv_step_decoder_new_bahdanau(params, &gcfg, rows, S, L, 0, error);
}

/* The full model over a whole target prefix (what the example decoded
 * with): logits (B, T, V) for src (B, S), src_valid (B), dec_in (B, T). */
typedef struct {
  QkvGraph *graph;
  QkvPlan *plan;
} FullModel;

static void
full_model_init(FullModel *m, QkvParams *params, const ModelCase *mc, gint B, gint S, gint T)
{
  g_autoptr(GError) error = NULL;
  m->graph = qkv_graph_new();
  QkvShape bs = QKV_SHAPE(B, S), b1 = QKV_SHAPE(B), bt = QKV_SHAPE(B, T);
  QkvValue *src = qkv_test_input(m->graph, "src", QKV_I32, bs);
  QkvValue *valid = qkv_test_input(m->graph, "src_valid", QKV_I32, b1);
  QkvValue *dec = qkv_test_input(m->graph, "dec_in", QKV_I32, bt);
  QkvBuilder b = {.graph = m->graph, .params = params, .seed = 11, .xavier_linear = TRUE};
  QkvValue *logits;
  if (mc->transformer) {
    QkvValue *enc = qkv_build_transformer_encoder(&b, model_tc(mc), src, valid, &error);
    logits = qkv_build_transformer_decoder(&b, model_tc(mc), dec, enc, valid, NULL, &error);
  } else if (mc->luong) {
    logits = qkv_build_luong_seq2seq(&b, mc->luong, src, valid, dec, NULL, &error);
  } else {
    logits = qkv_build_bahdanau_seq2seq(&b, &gcfg, src, valid, dec, NULL, &error);
  }
  g_assert_no_error(error);
  QkvPlanOptions o = qkv_plan_options_default();
  m->plan = qkv_graph_compile(m->graph, &logits, 1, &o, &error);
  g_assert_no_error(error);
}

static void
full_model_clear(FullModel *m)
{
  qkv_plan_free(m->plan);
  qkv_graph_free(m->graph);
}

/* Sources of the test: lengths 7, 4 and 1 of 7. */
static void
make_sources(gint B, gint S, QkvTensor **src, QkvTensor **valid)
{
  QkvShape bs = QKV_SHAPE(B, S), b1 = QKV_SHAPE(B);
  *src = qkv_test_randint(&bs, 5, 3, 15);
  *valid = qkv_tensor_new(QKV_I32, &b1);
  for (gint b = 0; b < B; b++) {
    gint32 len = b == 0 ? S : MAX(1, S - 3 * b);
    qkv_tensor_i32(*valid)[b] = len;
    for (gint t = len; t < S; t++)
      qkv_tensor_i32(*src)[b * S + t] = PAD;
  }
}

/* max over the row of |a - b| over max over the row of |b|. */
static double
row_rel_diff(const float *a, const float *b, gint64 n)
{
  double diff = 0, mag = 0;
  for (gint64 i = 0; i < n; i++) {
    diff = MAX(diff, fabs((double)a[i] - b[i]));
    mag = MAX(mag, fabs((double)b[i]));
  }
  return diff / mag;
}

/* The bound of the equality tests. Both sides compute every logit from the
 * same float32 parameters; they differ only in the order of additions: the
 * step plan's self-attention (the decoder's builder in cached mode) sums
 * over the max_len slots of its caches (with exact zeros for the masked
 * positions) with matmul and masked softmax where the full decoder runs the
 * fused attention op on the causal square, and it runs its GEMMs on one
 * row where the full decoder runs them on B·T rows (other BLAS blocking). Each reordered
 * sum of n terms is off by at most ~sqrt(n)·u relative to the sum of the
 * terms' magnitudes (u = 2^-24, Higham-Mary's probabilistic bound), and
 * LayerNorm after every sub-layer normalises the activations, so a
 * difference does not grow from block to block: it is a few u per layer of
 * rounding carried to the logits through the dense layer, whose sum of d
 * terms is up to ~|w|·|x| ≈ max|logit| in size. With d = 32 and 2 blocks
 * that is of order 100 u ≈ 6e-6 of max|logit| per row, so the test asks
 * for 1e-5 relative to the row's largest logit (~170 u). It is relative to
 * the row's largest logit, not to each logit: a logit near zero is a
 * cancelling sum whose own relative error is unbounded for any two orders.
 * A wrong position, a stale cache row or a masked key taken in moves the
 * logits by ~1e-2 of their size and fails by three orders of magnitude. */
#define EQUAL_REL 1e-5

/* Greedy-drive a step decoder for steps tokens (argmax each step, <eos>
 * included so the decode does not stop) and compare every step's logits
 * with the full model run on the same prefix. */
static void
check_against_full(const ModelCase *mc, gint steps, gint max_rows)
{
  const gint B = 3, S = 7;
  const gint64 V = model_vocab(mc);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  FullModel full;
  full_model_init(&full, params, mc, B, S, steps);
  g_autoptr(QkvStepDecoder) dec = model_decoder(mc, params, max_rows, S, steps, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) src = NULL, valid = NULL;
  make_sources(B, S, &src, &valid);
  g_assert_true(qkv_step_decoder_start(dec, src, valid, 1, &error));
  g_assert_no_error(error);

  QkvShape bt = QKV_SHAPE(B, steps);
  g_autoptr(QkvTensor) dec_in = qkv_tensor_new(QKV_I32, &bt);
  gint32 *din = qkv_tensor_i32(dec_in);
  g_autofree float *step_logits = g_new(float, (gsize)steps *B *V);
  gint32 tokens[3] = {BOS, BOS, BOS};
  guint64 allocs = 0;
  for (gint t = 0; t < steps; t++) {
    if (t == 1)
      allocs = qkv_alloc_count();
    float *lg = step_logits + (gsize)t * B * V;
    g_assert_true(qkv_step_decoder_step(dec, t, tokens, NULL, B, lg, &error));
    g_assert_no_error(error);
    for (gint b = 0; b < B; b++) {
      din[b * steps + t] = tokens[b];
      gint best = 0;
      for (gint v = 1; v < V; v++)
        if (lg[b * V + v] > lg[b * V + best])
          best = v;
      tokens[b] = best;
    }
  }
  g_assert_cmpuint(qkv_alloc_count(), ==, allocs);

  /* the causal mask makes position t of one run over the whole sequence the
   * full-prefix recomputation of step t (a masked key's weight is exactly 0) */
  g_assert_true(qkv_plan_bind(full.plan, "src", src, &error));
  g_assert_true(qkv_plan_bind(full.plan, "src_valid", valid, &error));
  g_assert_true(qkv_plan_bind(full.plan, "dec_in", dec_in, &error));
  g_assert_true(qkv_plan_run(full.plan, &error));
  g_assert_no_error(error);
  const float *ref = qkv_tensor_const_data(qkv_plan_output(full.plan, 0));
  double worst = 0;
  for (gint t = 0; t < steps; t++)
    for (gint b = 0; b < B; b++) {
      double rel =
          row_rel_diff(step_logits + ((gsize)t * B + b) * V, ref + ((gsize)b * steps + t) * V, V);
      if (rel > EQUAL_REL)
        g_error("%s step %d row %d: logits differ by %.3g of the largest (bound %.0e)", mc->name, t,
                b, rel, EQUAL_REL);
      worst = MAX(worst, rel);
    }
  g_test_message("%s: worst row difference %.3g (%.0f u)", mc->name, worst, worst / QKV_TEST_U);
  full_model_clear(&full);
}

static void
test_transformer_equals_full_prefix(void)
{
  check_against_full(&transformer_case, 50, 3);
}

/* 256 tokens: the step plan's self-attention now sums over 256 cached
 * slots, the longest sums of either computation; their reordering moves a
 * weighted sum by at most 6·√256 = 96 u of its terms' magnitudes
 * (qkv_test_sum_factor: Higham and Mary's bound; the worst case 256 u is
 * for every rounding going the same way), which stays within the 170 u of
 * EQUAL_REL, so the bound above holds unchanged. */
static void
test_transformer_256_steps(void)
{
  check_against_full(&transformer_case, 256, 3);
}

/* padded rows (the plan runs 5 rows for 3 sentences) change nothing */
/* The pre-LN model (with GELU and attention biases) under the same bound:
 * there a difference travels the residual stream to the final LayerNorm
 * instead of being renormalised after every sub-layer, which over 2 blocks
 * changes little (about 5 u here, as the test logs). */
static void
test_transformer_prenorm_equals_full_prefix(void)
{
  check_against_full(&prenorm_case, 30, 3);
  check_against_full(&prenorm_case, 12, 5);
}

static void
test_transformer_padded_rows(void)
{
  check_against_full(&transformer_case, 12, 5);
}

static void
test_bahdanau_equals_unrolled(void)
{
  check_against_full(&bahdanau_case, 30, 3);
}

/* Luong's decoders step with the GRU state (and ã_{t-1} with input
 * feeding; local-m's window centre is the step) */
static void
test_luong_equals_unrolled(void)
{
  for (guint i = 0; i < G_N_ELEMENTS(luong_cases); i++)
    check_against_full(&luong_cases[i], 12, 3);
}

/* ---- beam search on a hand-made model ----------------------------------- */

/* Tokens: 0 pad, 1 bos, 2 eos, 3 "A", 4 "B". The model is a table from a
 * history (the tokens emitted so far, as letters) to the next token's
 * probabilities; a history not in the table ends: eos 0.97. Each row keeps
 * its history and moves to its parent's each step, as a real model's state
 * would: a search that passed wrong parents would read wrong scores. */
typedef struct {
  const gchar *history;
  double eos, a, b;
} Entry;

typedef struct {
  const Entry *table;
  gchar hist[16][16];
  gint calls;
} Toy;

static const Entry *
toy_lookup(const Toy *m, const gchar *h)
{
  for (const Entry *e = m->table; e->history != NULL; e++)
    if (g_str_equal(e->history, h))
      return e;
  return NULL;
}

static gboolean
toy_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
         float *logits, GError **error)
{
  Toy *m = user_data;
  gchar old[16][16];
  memcpy(old, m->hist, sizeof old);
  m->calls++;
  for (gint r = 0; r < n_rows; r++) {
    g_strlcpy(m->hist[r], old[parents[r]], 16);
    if (step > 0) {
      gsize n = strlen(m->hist[r]);
      m->hist[r][n] = tokens[r] == 3 ? 'A' : tokens[r] == 4 ? 'B' : '.';
      m->hist[r][n + 1] = 0;
    }
    const Entry *e = toy_lookup(m, m->hist[r]);
    double p[5] = {1e-9, 1e-9, e ? e->eos : 0.97, e ? e->a : 0.015, e ? e->b : 0.015};
    for (gint v = 0; v < 5; v++)
      logits[r * 5 + v] = (float)log(p[v]);
  }
  return TRUE;
}

/* greedy finds "A" (0.55 · 0.35 = 0.1925); "B" is 0.45 · 0.9 = 0.405 */
static const Entry greedy_misses[] = {
    {"", 0.0, 0.55, 0.45},
    {"A", 0.35, 0.33, 0.32},
    {"B", 0.9, 0.05, 0.05},
    {NULL},
};

/* "A" ends with P 0.36 (|Y| 2), "BA" with 0.4 · 0.95 · 0.9 = 0.342 (|Y| 3) */
static const Entry length_matters[] = {
    {"", 0.0, 0.6, 0.4},
    {"A", 0.6, 0.2, 0.2},
    {"B", 0.025, 0.95, 0.025},
    {"BA", 0.9, 0.05, 0.05},
    {NULL},
};

static void
toy_search(const Entry *table, gint k, double alpha, gint batch, gint32 *out, gint *lens,
           double *scores)
{
  g_autoptr(GError) error = NULL;
  Toy m = {.table = table};
  QkvBeamOptions o = qkv_beam_options_default();
  o.beam_size = k;
  o.length_penalty = alpha;
  o.max_len = 6;
  o.vocab = 5;
  g_assert_true(qkv_beam_search(&o, batch, toy_step, &m, out, lens, scores, &error));
  g_assert_no_error(error);
}

static void
test_beam_finds_what_greedy_misses(void)
{
  gint32 out[6];
  gint len;
  double score;
  toy_search(greedy_misses, 1, 0.0, 1, out, &len, &score);
  g_assert_cmpint(len, ==, 1);
  g_assert_cmpint(out[0], ==, 3);
  g_assert_cmpfloat_with_epsilon(score, log(0.55 * 0.35), 1e-6);
  toy_search(greedy_misses, 2, 0.0, 1, out, &len, &score);
  g_assert_cmpint(len, ==, 1);
  g_assert_cmpint(out[0], ==, 4);
  g_assert_cmpint(out[1], ==, EOS); /* padding after the hypothesis */
  g_assert_cmpfloat_with_epsilon(score, log(0.45 * 0.9), 1e-6);
}

/* "A" with eos second at step 0: greedy goes on with "A" */
static const Entry eos_second[] = {
    {"", 0.4, 0.6, 0.0},
    {"A", 0.9, 0.05, 0.05},
    {NULL},
};

static void
test_beam_one_is_greedy(void)
{
  gint32 out[6];
  gint len;
  double score;
  toy_search(eos_second, 1, 0.6, 1, out, &len, &score);
  g_assert_cmpint(len, ==, 1);
  g_assert_cmpint(out[0], ==, 3);
  g_assert_cmpfloat_with_epsilon(score, log(0.6 * 0.9) / qkv_beam_length_penalty(2, 0.6), 1e-6);
}

static void
test_beam_length_penalty(void)
{
  g_assert_cmpfloat_with_epsilon(qkv_beam_length_penalty(3, 0.6), pow(8.0 / 6.0, 0.6), 1e-12);
  g_assert_cmpfloat(qkv_beam_length_penalty(7, 0.0), ==, 1.0);
  gint32 out[6];
  gint len;
  double score;
  /* α = 0: log 0.36 > log 0.342, the short one wins */
  toy_search(length_matters, 2, 0.0, 1, out, &len, &score);
  g_assert_cmpint(len, ==, 1);
  g_assert_cmpint(out[0], ==, 3);
  /* α = 1: log 0.36 / (7/6) = -0.876 < log 0.342 / (8/6) = -0.805 */
  toy_search(length_matters, 2, 1.0, 1, out, &len, &score);
  g_assert_cmpint(len, ==, 2);
  g_assert_cmpint(out[0], ==, 4);
  g_assert_cmpint(out[1], ==, 3);
  g_assert_cmpfloat_with_epsilon(score, log(0.4 * 0.95 * 0.9) / (8.0 / 6.0), 1e-6);
}

/* Several sentences at once, each with its own rows: three copies of the
 * same problem give the same answer; and max_len ends a sentence that never
 * emits <eos>. */
static const Entry never_ends[] = {
    {"", 0.0, 0.9, 0.1},       {"A", 0.0, 0.9, 0.1},
    {"AA", 0.0, 0.9, 0.1},     {"AAA", 0.0, 0.9, 0.1},
    {"AAAA", 0.0, 0.9, 0.1},   {"AAAAA", 0.0, 0.9, 0.1},
    {"AAAAAA", 0.0, 0.9, 0.1}, {NULL},
};

static void
test_beam_batch_and_max_len(void)
{
  gint32 out[3 * 6];
  gint lens[3];
  double scores[3];
  toy_search(greedy_misses, 2, 0.6, 3, out, lens, scores);
  for (gint b = 0; b < 3; b++) {
    g_assert_cmpint(lens[b], ==, 1);
    g_assert_cmpint(out[b * 6], ==, 4);
    g_assert_cmpfloat(scores[b], ==, scores[0]);
  }
  toy_search(never_ends, 1, 0.0, 1, out, lens, scores);
  g_assert_cmpint(lens[0], ==, 6);
  for (gint t = 0; t < 6; t++)
    g_assert_cmpint(out[t], ==, 3);
}

static void
test_beam_options_checked(void)
{
  g_autoptr(GError) error = NULL;
  Toy m = {.table = greedy_misses};
  gint32 out[6];
  gint len;
  QkvBeamOptions o = qkv_beam_options_default();
  o.max_len = 6;
  o.vocab = 5;
  o.beam_size = 0;
  g_assert_false(qkv_beam_search(&o, 1, toy_step, &m, out, &len, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "beam_size"));
  g_clear_error(&error);
  o.beam_size = 2;
  o.length_penalty = NAN;
  g_assert_false(qkv_beam_search(&o, 1, toy_step, &m, out, &len, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  o.length_penalty = 0.6;
  o.eos = 5;
  g_assert_false(qkv_beam_search(&o, 1, toy_step, &m, out, &len, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_cmpint(m.calls, ==, 0);
}

/* A step callback the search must never reach: it counts its calls. */
static gboolean
uncalled_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents,
              gint n_rows, float *logits, GError **error)
{
  (*(gint *)user_data)++;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "uncalled_step was called");
  return FALSE;
}

/* Buffers sized from max_len (the hypotheses, batch × beam_size × max_len
 * tokens) that cannot be had are refused with QKV_ERROR_MEMORY, not an
 * abort: here 2^18 rows of 2^31 - 1 tokens, petabytes. */
static void
test_beam_huge_max_len(void)
{
  g_autoptr(GError) error = NULL;
  QkvBeamOptions o = qkv_beam_options_default();
  o.vocab = 5;
  o.max_len = G_MAXINT;
  const gint batch = 1 << 16;
  gint32 out[1];
  g_autofree gint *lens = g_new0(gint, batch);
  gint calls = 0;
  g_assert_false(qkv_beam_search(&o, batch, uncalled_step, &calls, out, lens, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
  g_assert_nonnull(strstr(error->message, "qkv_beam_search"));
  g_assert_cmpint(calls, ==, 0);
}

/* A step callback that writes bad scores: value at step bad_step into
 * token 3 of row bad_row (every token of it when whole_row; every row when
 * bad_row is -1), 0 everywhere else but a low <eos>. */
typedef struct {
  gint bad_step, bad_row;
  float value;
  gboolean whole_row;
  gint calls;
} BadScores;

static gboolean
bad_scores_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents,
                gint n_rows, float *logits, GError **error)
{
  BadScores *m = user_data;
  m->calls++;
  for (gint r = 0; r < n_rows; r++)
    for (gint v = 0; v < 5; v++) {
      gboolean bad =
          step == m->bad_step && (m->bad_row < 0 || r == m->bad_row) && (m->whole_row || v == 3);
      logits[r * 5 + v] = bad ? m->value : v == EOS ? -10.0f : 0.0f;
    }
  return TRUE;
}

static gboolean
bad_scores_search(BadScores *m, GError **error)
{
  QkvBeamOptions o = qkv_beam_options_default();
  o.beam_size = 2;
  o.max_len = 6;
  o.vocab = 5;
  gint32 out[6];
  gint len = -1;
  return qkv_beam_search(&o, 1, bad_scores_step, m, out, &len, NULL, error);
}

/* A NaN or +inf score of a live hypothesis is refused naming the step;
 * so is a step where every live hypothesis has only -inf scores. One
 * row of -inf only ends that row's hypothesis, and rows that hold no live
 * hypothesis (at step 0 every slot but the first) are not read. */
static void
test_beam_bad_scores(void)
{
  g_autoptr(GError) error = NULL;
  BadScores nan_score = {.bad_step = 1, .bad_row = 1, .value = NAN};
  g_assert_false(bad_scores_search(&nan_score, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "step 1"));
  g_assert_nonnull(strstr(error->message, "nan"));
  g_assert_cmpint(nan_score.calls, ==, 2);
  g_clear_error(&error);
  BadScores inf_score = {.bad_step = 0, .bad_row = 0, .value = INFINITY};
  g_assert_false(bad_scores_search(&inf_score, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "step 0"));
  g_assert_nonnull(strstr(error->message, "inf"));
  g_clear_error(&error);
  BadScores all_minus_inf = {.bad_step = 2, .bad_row = -1, .value = -INFINITY, .whole_row = TRUE};
  g_assert_false(bad_scores_search(&all_minus_inf, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "step 2"));
  g_assert_nonnull(strstr(error->message, "-inf"));
  g_clear_error(&error);
  BadScores one_row = {.bad_step = 1, .bad_row = 1, .value = -INFINITY, .whole_row = TRUE};
  g_assert_true(bad_scores_search(&one_row, &error));
  g_assert_no_error(error);
  BadScores not_live = {.bad_step = 0, .bad_row = 1, .value = NAN, .whole_row = TRUE};
  g_assert_true(bad_scores_search(&not_live, &error));
  g_assert_no_error(error);
}

/* bos is checked as eos is: a token id in [0, vocab). */
static void
test_beam_bos_checked(void)
{
  const gint32 bad[] = {-7, 5, 1000};
  for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autoptr(GError) error = NULL;
    BadScores m = {.bad_step = -1};
    QkvBeamOptions o = qkv_beam_options_default();
    o.max_len = 6;
    o.vocab = 5;
    o.bos = bad[i];
    gint32 out[6];
    gint len;
    g_assert_false(qkv_beam_search(&o, 1, bad_scores_step, &m, out, &len, NULL, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_assert_nonnull(strstr(error->message, "bos"));
    g_assert_cmpint(m.calls, ==, 0);
  }
}

/* ---- beam search through a step decoder --------------------------------- */

/* A step callback that recomputes the full model on every row's whole
 * history (no cache): what the step decoder must agree with, parents and
 * all. */
typedef struct {
  FullModel full;
  QkvTensor *dec_in; /* (rows, max_len) */
  gint32 *scratch;
  gint rows, max_len;
  gint64 vocab;
  gint moved; /* steps where some row took another row's history */
} Recompute;

static gboolean
recompute_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents,
               gint n_rows, float *logits, GError **error)
{
  Recompute *m = user_data;
  gint32 *d = qkv_tensor_i32(m->dec_in);
  memcpy(m->scratch, d, (gsize)n_rows * m->max_len * sizeof(gint32));
  gboolean moved = FALSE;
  for (gint r = 0; r < n_rows; r++) {
    moved |= parents[r] != r;
    memcpy(d + r * m->max_len, m->scratch + parents[r] * m->max_len,
           (gsize)m->max_len * sizeof(gint32));
    d[r * m->max_len + step] = tokens[r];
  }
  m->moved += moved;
  if (!qkv_plan_run(m->full.plan, error))
    return FALSE;
  const float *out = qkv_tensor_const_data(qkv_plan_output(m->full.plan, 0));
  for (gint r = 0; r < n_rows; r++)
    memcpy(logits + r * m->vocab, out + ((gsize)r * m->max_len + step) * m->vocab,
           (gsize)m->vocab * sizeof(float));
  return TRUE;
}

/* The search driven by the step decoder, with every step's logits checked
 * against the recomputation on the rows' whole histories (which follow the
 * same parents). */
typedef struct {
  QkvStepDecoder *dec;
  Recompute *ref;
  float *ref_logits;
  double worst;
} Paired;

static gboolean
paired_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
            float *logits, GError **error)
{
  Paired *p = user_data;
  if (!qkv_step_decoder_step(p->dec, step, tokens, parents, n_rows, logits, error) ||
      !recompute_step(p->ref, step, tokens, parents, n_rows, p->ref_logits, error))
    return FALSE;
  for (gint r = 0; r < n_rows; r++)
    p->worst = MAX(p->worst, row_rel_diff(logits + r * p->ref->vocab,
                                          p->ref_logits + r * p->ref->vocab, p->ref->vocab));
  return TRUE;
}

static void
check_beam_through_decoder(const ModelCase *mc)
{
  const gint B = 3, S = 7, K = 3, L = 10, R = B * K;
  const gint64 V = model_vocab(mc);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  Recompute m = {.rows = R, .max_len = L, .vocab = V};
  full_model_init(&m.full, params, mc, R, S, L);
  g_autoptr(QkvStepDecoder) dec = model_decoder(mc, params, R, S, L, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) src = NULL, valid = NULL;
  make_sources(B, S, &src, &valid);
  /* the reference sees every sentence repeated on its k rows */
  QkvShape rs = QKV_SHAPE(R, S), r1 = QKV_SHAPE(R), rl = QKV_SHAPE(R, L);
  g_autoptr(QkvTensor) src_rows = qkv_tensor_new(QKV_I32, &rs);
  g_autoptr(QkvTensor) valid_rows = qkv_tensor_new(QKV_I32, &r1);
  m.dec_in = qkv_tensor_new(QKV_I32, &rl);
  m.scratch = g_new(gint32, R * L);
  g_assert_true(qkv_plan_bind(m.full.plan, "src", src_rows, &error));
  g_assert_true(qkv_plan_bind(m.full.plan, "src_valid", valid_rows, &error));
  g_assert_true(qkv_plan_bind(m.full.plan, "dec_in", m.dec_in, &error));

  for (gint k = 1; k <= K; k += K - 1) {
    for (gint r = 0; r < R; r++) {
      gint sentence = MIN(r / k, B - 1);
      memcpy(qkv_tensor_i32(src_rows) + r * S, qkv_tensor_i32(src) + sentence * S,
             S * sizeof(gint32));
      qkv_tensor_i32(valid_rows)[r] = qkv_tensor_i32(valid)[sentence];
    }
    QkvBeamOptions o = qkv_beam_options_default();
    o.beam_size = k;
    o.max_len = L;
    o.vocab = V;
    gint32 want[3 * 10], got[3 * 10];
    gint want_len[3], got_len[3];
    double want_score[3], got_score[3];
    qkv_tensor_fill(m.dec_in, PAD);
    m.moved = 0;
    g_assert_true(qkv_beam_search(&o, B, recompute_step, &m, want, want_len, want_score, &error));
    g_assert_no_error(error);
    g_assert_true(qkv_step_decoder_translate(dec, src, valid, &o, got, got_len, got_score, &error));
    g_assert_no_error(error);
    for (gint i = 0; i < B * L; i++)
      if (got[i] != want[i])
        g_test_message("k %d: at %d got %d want %d (lens %d %d %d / %d %d %d)", k, i, got[i],
                       want[i], got_len[0], got_len[1], got_len[2], want_len[0], want_len[1],
                       want_len[2]);
    g_assert_cmpmem(got, sizeof got, want, sizeof want);
    g_assert_cmpmem(got_len, sizeof got_len, want_len, sizeof want_len);
    for (gint b = 0; b < B; b++)
      g_assert_cmpfloat_with_epsilon(got_score[b], want_score[b], 1e-4 * fabs(want_score[b]));
    /* once more with both models at every step: the cache rows the decoder
     * moves to their parents hold what the recomputation sees */
    g_autofree float *ref_logits = g_new(float, (gsize)R *V);
    Paired p = {.dec = dec, .ref = &m, .ref_logits = ref_logits};
    qkv_tensor_fill(m.dec_in, PAD);
    g_assert_true(qkv_step_decoder_start(dec, src, valid, k, &error));
    g_assert_true(qkv_beam_search(&o, B, paired_step, &p, got, got_len, NULL, &error));
    g_assert_no_error(error);
    g_test_message("beam %d: worst row difference %.3g", k, p.worst);
    g_assert_cmpfloat(p.worst, <=, EQUAL_REL);

    if (k == 1) {
      /* beam 1 is greedy: argmax of the logits at every step */
      g_assert_true(qkv_step_decoder_start(dec, src, valid, 1, &error));
      gint32 tokens[3] = {BOS, BOS, BOS};
      gboolean ended[3] = {FALSE, FALSE, FALSE};
      gint glen[3] = {0, 0, 0};
      float lg[3 * 17];
      for (gint t = 0; t < L; t++) {
        g_assert_true(qkv_step_decoder_step(dec, t, tokens, NULL, B, lg, &error));
        for (gint b = 0; b < B; b++) {
          gint best = 0;
          for (gint v = 1; v < V; v++)
            if (lg[b * V + v] > lg[b * V + best])
              best = v;
          if (!ended[b] && best == EOS)
            ended[b] = TRUE;
          else if (!ended[b])
            g_assert_cmpint(got[b * L + glen[b]++], ==, best);
          tokens[b] = best;
        }
      }
      for (gint b = 0; b < B; b++)
        g_assert_cmpint(glen[b], ==, got_len[b]);
    }
  }
  g_free(m.scratch);
  qkv_tensor_free(m.dec_in);
  full_model_clear(&m.full);
}

static void
test_beam_transformer_decoder(void)
{
  check_beam_through_decoder(&transformer_case);
}

static void
test_beam_bahdanau_decoder(void)
{
  check_beam_through_decoder(&bahdanau_case);
}

static void
test_beam_luong_decoder(void)
{
  check_beam_through_decoder(&luong_cases[3]);
}

/* ---- errors ----------------------------------------------------------------- */

static void
test_decoder_errors(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  /* no trained parameters: refused, and nothing left in the store */
  QkvStepDecoder *dec = qkv_step_decoder_new_transformer(params, &tcfg, 2, 5, 8, 0, &error);
  g_assert_null(dec);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_nonnull(strstr(error->message, "encoder.embedding.weight"));
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  g_clear_error(&error);
  g_assert_null(qkv_step_decoder_new_transformer(params, &tcfg, 0, 5, 8, 0, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  /* the GRU decoders: missing parameters, bad sizes, a bad Luong window */
  QkvLuongConfig bad_window = luong_dot_local_m;
  bad_window.attention.window = 0;
  g_assert_null(qkv_step_decoder_new_luong(params, &luong_dot_local_m, 2, 5, 8, 0, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  g_clear_error(&error);
  g_assert_null(qkv_step_decoder_new_luong(params, &bad_window, 2, 5, 8, 0, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "window"));
  g_clear_error(&error);
  g_assert_null(qkv_step_decoder_new_luong(params, &luong_dot_local_m, 2, 5, 0, 0, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "qkv_step_decoder_new_luong"));
  g_clear_error(&error);
  QkvGruSeq2SeqConfig no_layers = gcfg;
  no_layers.num_layers = 0;
  g_assert_null(qkv_step_decoder_new_bahdanau(params, &no_layers, 2, 5, 8, 0, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "qkv_step_decoder_new_bahdanau"));
  g_clear_error(&error);

  FullModel full;
  full_model_init(&full, params, &transformer_case, 2, 5, 8);
  g_autoptr(QkvStepDecoder) d = qkv_step_decoder_new_transformer(params, &tcfg, 2, 5, 8, 0, &error);
  g_assert_no_error(error);
  float lg[2 * 17];
  gint32 tok[2] = {BOS, BOS};
  /* a step before start */
  g_assert_false(qkv_step_decoder_step(d, 0, tok, NULL, 2, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  QkvShape s3 = QKV_SHAPE(3, 5), b3 = QKV_SHAPE(3), s6 = QKV_SHAPE(2, 6), b2 = QKV_SHAPE(2);
  g_autoptr(QkvTensor) src3 = qkv_tensor_new(QKV_I32, &s3);
  g_autoptr(QkvTensor) val3 = qkv_tensor_new(QKV_I32, &b3);
  g_autoptr(QkvTensor) src6 = qkv_tensor_new(QKV_I32, &s6);
  g_autoptr(QkvTensor) val2 = qkv_tensor_new(QKV_I32, &b2);
  /* more rows than compiled; a source longer than compiled */
  g_assert_false(qkv_step_decoder_start(d, src3, val3, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_step_decoder_start(d, src6, val2, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  /* steps out of order, a parent that is no row */
  QkvShape s2 = QKV_SHAPE(2, 5);
  g_autoptr(QkvTensor) src2 = qkv_tensor_new(QKV_I32, &s2);
  qkv_tensor_fill(val2, 5);
  g_assert_true(qkv_step_decoder_start(d, src2, val2, 1, &error));
  g_assert_false(qkv_step_decoder_step(d, 1, tok, NULL, 2, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  gint32 bad_parents[2] = {0, 2};
  g_assert_false(qkv_step_decoder_step(d, 0, tok, bad_parents, 2, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  /* past max_len */
  for (gint t = 0; t < 8; t++)
    g_assert_true(qkv_step_decoder_step(d, t, tok, NULL, 2, lg, &error));
  g_assert_false(qkv_step_decoder_step(d, 8, tok, NULL, 2, lg, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_nonnull(qkv_step_decoder_cross_weights(d, -1));
  g_assert_null(qkv_step_decoder_cross_weights(d, 2));
  /* translate checks bos and eos against the decoder's vocabulary */
  QkvBeamOptions o = qkv_beam_options_default();
  o.beam_size = 1; /* two sentences fill the decoder's two rows */
  o.max_len = 8;
  o.vocab = qkv_step_decoder_vocab(d);
  gint32 out[2 * 8];
  gint lens[2];
  const gint32 bad_tokens[] = {-7, (gint32)o.vocab, 1000};
  for (gsize i = 0; i < G_N_ELEMENTS(bad_tokens); i++) {
    for (gint which = 0; which < 2; which++) {
      QkvBeamOptions bad = o;
      *(which == 0 ? &bad.bos : &bad.eos) = bad_tokens[i];
      g_assert_false(qkv_step_decoder_translate(d, src2, val2, &bad, out, lens, NULL, &error));
      g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
      g_assert_nonnull(strstr(error->message, which == 0 ? "bos" : "eos"));
      g_assert_nonnull(strstr(error->message, "qkv_step_decoder_translate"));
      g_clear_error(&error);
    }
  }
  g_assert_true(qkv_step_decoder_translate(d, src2, val2, &o, out, lens, NULL, &error));
  g_assert_no_error(error);
  full_model_clear(&full);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/decode/pe-positions", test_pe_positions);
  g_test_add_func("/decode/transformer-equals-full-prefix", test_transformer_equals_full_prefix);
  g_test_add_func("/decode/transformer-padded-rows", test_transformer_padded_rows);
  g_test_add_func("/decode/transformer-256-steps", test_transformer_256_steps);
  g_test_add_func("/decode/transformer-prenorm-equals-full-prefix",
                  test_transformer_prenorm_equals_full_prefix);
  g_test_add_func("/decode/bahdanau-equals-unrolled", test_bahdanau_equals_unrolled);
  g_test_add_func("/decode/luong-equals-unrolled", test_luong_equals_unrolled);
  g_test_add_func("/decode/beam-finds-what-greedy-misses", test_beam_finds_what_greedy_misses);
  g_test_add_func("/decode/beam-one-is-greedy", test_beam_one_is_greedy);
  g_test_add_func("/decode/beam-length-penalty", test_beam_length_penalty);
  g_test_add_func("/decode/beam-batch-and-max-len", test_beam_batch_and_max_len);
  g_test_add_func("/decode/beam-options-checked", test_beam_options_checked);
  g_test_add_func("/decode/beam-huge-max-len", test_beam_huge_max_len);
  g_test_add_func("/decode/beam-bad-scores", test_beam_bad_scores);
  g_test_add_func("/decode/beam-bos-checked", test_beam_bos_checked);
  g_test_add_func("/decode/beam-transformer-decoder", test_beam_transformer_decoder);
  g_test_add_func("/decode/beam-bahdanau-decoder", test_beam_bahdanau_decoder);
  g_test_add_func("/decode/beam-luong-decoder", test_beam_luong_decoder);
  g_test_add_func("/decode/errors", test_decoder_errors);
  return g_test_run();
}
