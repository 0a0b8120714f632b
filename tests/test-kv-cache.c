/* test-kv-cache.c: graph states that live across plan runs (qkv_graph_state,
 * qkv_plan_state, qkv_plan_reset_state) and the kv_cache_append op: slots
 * written at per-row positions, positions past the cache refused, and a
 * one-layer causal self-attention model decoded token by token through the
 * cache against the same model recomputed on the whole sequence; and
 * kv_cache_attention, which reads only the filled slots, with and without
 * its weights output. */
#include "test-util.h"

#include <math.h>
#include <string.h>

#define F32(t) ((const float *)qkv_tensor_const_data(t))
#define I32(t) ((const gint32 *)qkv_tensor_const_data(t))

/* A cache graph: cache state (B, 1, T_max, D), new (B, 1, t, D),
 * positions (B); outputs the cache after the write and the lengths. */
typedef struct {
  QkvGraph *g;
  QkvPlan *plan;
} CachePlan;

static CachePlan
cache_plan(gint B, gint T_max, gint D, gint t)
{
  g_autoptr(GError) error = NULL;
  CachePlan c = {qkv_graph_new(), NULL};
  QkvShape cs = QKV_SHAPE(B, 1, T_max, D);
  QkvValue *state = qkv_graph_state(c.g, "cache", QKV_F32, &cs, &error);
  QkvValue *fresh = qkv_test_input(c.g, "new", QKV_F32, QKV_SHAPE(B, 1, t, D));
  QkvValue *pos = qkv_test_input(c.g, "positions", QKV_I32, QKV_SHAPE(B));
  QkvValue *lengths = NULL;
  QkvValue *keys = qkv_kv_cache_append(state, fresh, pos, &lengths, &error);
  g_assert_no_error(error);
  QkvValue *outs[] = {keys, lengths};
  c.plan = qkv_graph_compile(c.g, outs, 2, NULL, &error);
  g_assert_no_error(error);
  return c;
}

static void
cache_plan_clear(CachePlan *c)
{
  qkv_plan_free(c->plan);
  qkv_graph_free(c->g);
}

static gboolean
cache_run(CachePlan *c, QkvTensor *fresh, const gint32 *positions, gint B, GError **error)
{
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) pos = qkv_tensor_new_i32(&bs, positions);
  return qkv_plan_bind(c->plan, "new", fresh, error) &&
         qkv_plan_bind(c->plan, "positions", pos, error) && qkv_plan_run(c->plan, error);
}

/* The state keeps what one run wrote into the next, and reset zeroes it. */
static void
test_state_persists(void)
{
  const gint B = 1, T = 4, D = 2;
  g_autoptr(GError) error = NULL;
  CachePlan c = cache_plan(B, T, D, 1);
  const QkvTensor *state = qkv_plan_state(c.plan, "cache");
  g_assert_nonnull(state);
  g_assert_null(qkv_plan_state(c.plan, "nothing"));
  for (gint i = 0; i < T * D; i++)
    g_assert_cmpfloat(F32(state)[i], ==, 0.0f);
  for (gint32 p = 0; p < 3; p++) {
    float v[] = {10.0f * (float)p + 1, 10.0f * (float)p + 2};
    QkvShape ns = QKV_SHAPE(B, 1, 1, D);
    g_autoptr(QkvTensor) fresh = qkv_tensor_new_f32(&ns, v);
    g_assert_true(cache_run(&c, fresh, &p, B, &error));
    g_assert_no_error(error);
  }
  const float want[] = {1, 2, 11, 12, 21, 22, 0, 0};
  qkv_assert_values(state, want, T * D, 0);
  qkv_assert_values(qkv_plan_output(c.plan, 0), want, T * D, 0);
  g_assert_cmpint(I32(qkv_plan_output(c.plan, 1))[0], ==, 3);
  /* the append is in place: its output 0 is the state's buffer, not a copy
   * of the whole cache made on every run */
  g_assert_true(qkv_tensor_const_data(qkv_plan_output(c.plan, 0)) == qkv_tensor_const_data(state));

  g_assert_false(qkv_plan_reset_state(c.plan, "nothing", &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_clear_error(&error);
  g_assert_true(qkv_plan_reset_state(c.plan, "cache", &error));
  for (gint i = 0; i < T * D; i++)
    g_assert_cmpfloat(F32(state)[i], ==, 0.0f);
  cache_plan_clear(&c);
}

/* Rows at different positions: each gets its slots, nothing else moves;
 * positions past T_max (or negative) are refused and leave the cache be. */
static void
test_append_positions(void)
{
  const gint B = 3, T = 6, D = 2, t = 2;
  g_autoptr(GError) error = NULL;
  CachePlan c = cache_plan(B, T, D, t);
  QkvShape ns = QKV_SHAPE(B, 1, t, D);
  g_autoptr(QkvTensor) fresh = qkv_test_uniform(&ns, 3, 1, 2);
  const gint32 pos[] = {0, 3, 4};
  g_assert_true(cache_run(&c, fresh, pos, B, &error));
  g_assert_no_error(error);
  const float *s = F32(qkv_plan_state(c.plan, "cache"));
  const float *n = qkv_tensor_f32(fresh);
  for (gint b = 0; b < B; b++) {
    for (gint i = 0; i < T; i++)
      for (gint k = 0; k < D; k++) {
        gboolean written = i >= pos[b] && i < pos[b] + t;
        float want = written ? n[(b * t + (i - pos[b])) * D + k] : 0.0f;
        g_assert_cmpfloat(s[(b * T + i) * D + k], ==, want);
      }
    g_assert_cmpint(I32(qkv_plan_output(c.plan, 1))[b], ==, pos[b] + t);
  }
  g_autoptr(QkvTensor) before = qkv_tensor_copy(qkv_plan_state(c.plan, "cache"));
  const gint32 past[] = {0, 5, 1};
  g_assert_false(cache_run(&c, fresh, past, B, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "row 1"));
  g_clear_error(&error);
  const gint32 negative[] = {0, -1, 1};
  g_assert_false(cache_run(&c, fresh, negative, B, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  qkv_assert_values(qkv_plan_state(c.plan, "cache"), qkv_tensor_f32(before), B * T * D, 0);
  cache_plan_clear(&c);

  /* more new slots than the cache holds: refused when the node is added */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape cs = QKV_SHAPE(1, 1, 2, D);
  QkvValue *state = qkv_graph_state(g, "cache", QKV_F32, &cs, &error);
  QkvValue *big = qkv_test_input(g, "new", QKV_F32, QKV_SHAPE(1, 1, 3, D));
  QkvValue *p = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(1));
  g_assert_null(qkv_kv_cache_append(state, big, p, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  /* the cache must be a state; a state name is unique */
  g_assert_null(qkv_kv_cache_append(big, big, p, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_null(qkv_graph_state(g, "cache", QKV_F32, &cs, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_EXISTS);
}

/* ---- a one-layer causal self-attention model ---------------------------- */

enum { VOCAB = 11, DIM = 8, STEPS = 32 };

typedef struct {
  QkvTensor *emb, *wq, *wk, *wv, *wo;
} Weights;

static Weights
weights_new(void)
{
  QkvShape es = QKV_SHAPE(VOCAB, DIM), ws = QKV_SHAPE(DIM, DIM), os = QKV_SHAPE(DIM, VOCAB);
  Weights w = {qkv_test_uniform(&es, 1, -1, 1), qkv_test_uniform(&ws, 2, -0.5f, 0.5f),
               qkv_test_uniform(&ws, 3, -0.5f, 0.5f), qkv_test_uniform(&ws, 4, -0.5f, 0.5f),
               qkv_test_uniform(&os, 5, -0.5f, 0.5f)};
  return w;
}

static void
weights_clear(Weights *w)
{
  qkv_tensor_free(w->emb);
  qkv_tensor_free(w->wq);
  qkv_tensor_free(w->wk);
  qkv_tensor_free(w->wv);
  qkv_tensor_free(w->wo);
}

/* x = emb[ids] (B·t, DIM) and its three projections, as (B, t, DIM). */
static void
project(QkvGraph *g, const Weights *w, QkvValue *ids, gint B, gint t, QkvValue **q, QkvValue **k,
        QkvValue **v, GError **error)
{
  QkvShape flat = QKV_SHAPE(B * t), bt = QKV_SHAPE(B, t, DIM);
  QkvValue *x =
      qkv_embedding(qkv_reshape(ids, &flat, error), qkv_graph_constant(g, w->emb, error), error);
  QkvValue **outs[] = {q, k, v};
  QkvTensor *mats[] = {w->wq, w->wk, w->wv};
  for (gint i = 0; i < 3; i++)
    *outs[i] = qkv_reshape(
        qkv_matmul(x, qkv_graph_constant(g, mats[i], error), FALSE, FALSE, error), &bt, error);
}

static QkvValue *
logits_of(QkvGraph *g, const Weights *w, QkvValue *attended, gint B, gint t, GError **error)
{
  QkvShape flat = QKV_SHAPE(B * t, DIM), out = QKV_SHAPE(B, t, VOCAB);
  QkvValue *h = qkv_reshape(attended, &flat, error);
  return qkv_reshape(qkv_matmul(h, qkv_graph_constant(g, w->wo, error), FALSE, FALSE, error), &out,
                     error);
}

/* The whole sequence at once, causal: logits (B, STEPS, VOCAB). */
static QkvTensor *
full_logits(const Weights *w, QkvTensor *ids, gint B)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *idv = qkv_test_input(g, "ids", QKV_I32, QKV_SHAPE(B, STEPS));
  QkvValue *q, *k, *v;
  project(g, w, idv, B, STEPS, &q, &k, &v, &error);
  QkvValue *a = qkv_dot_product_attention(q, k, v, NULL, TRUE, 0.0, NULL, &error);
  QkvValue *logits = logits_of(g, w, a, B, STEPS, &error);
  g_assert_no_error(error);
  const gchar *names[] = {"ids"};
  QkvTensor *out = NULL;
  g_assert_true(qkv_graph_eval(g, names, &ids, 1, &logits, &out, 1, &error));
  g_assert_no_error(error);
  return out;
}

/* One token per row per run through two caches (keys, values): row b
 * decodes its tokens 0 … lens[b] − 1, each run at the row's own position;
 * returns logits (B, STEPS, VOCAB), zero past a row's length. */
static QkvTensor *
cached_logits(const Weights *w, QkvTensor *ids, gint B, const gint *lens)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape cs = QKV_SHAPE(B, 1, STEPS, DIM), bt = QKV_SHAPE(B, STEPS, DIM);
  QkvShape one = QKV_SHAPE(B, 1, 1, DIM);
  QkvValue *ks = qkv_graph_state(g, "keys", QKV_F32, &cs, &error);
  QkvValue *vs = qkv_graph_state(g, "values", QKV_F32, &cs, &error);
  QkvValue *idv = qkv_test_input(g, "ids", QKV_I32, QKV_SHAPE(B, 1));
  QkvValue *pos = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(B));
  QkvValue *q, *k, *v, *lengths = NULL;
  project(g, w, idv, B, 1, &q, &k, &v, &error);
  QkvValue *kc = qkv_kv_cache_append(ks, qkv_reshape(k, &one, &error), pos, &lengths, &error);
  QkvValue *vc = qkv_kv_cache_append(vs, qkv_reshape(v, &one, &error), pos, NULL, &error);
  QkvValue *a =
      qkv_dot_product_attention(q, qkv_reshape(kc, &bt, &error), qkv_reshape(vc, &bt, &error),
                                lengths, FALSE, 0.0, NULL, &error);
  QkvValue *logits = logits_of(g, w, a, B, 1, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &logits, 1, NULL, &error);
  g_assert_no_error(error);

  QkvShape ls = QKV_SHAPE(B, STEPS, VOCAB), bs = QKV_SHAPE(B), b1 = QKV_SHAPE(B, 1);
  QkvTensor *out = qkv_tensor_new(QKV_F32, &ls);
  memset(qkv_tensor_data(out), 0, qkv_tensor_nbytes(out));
  gint longest = 0;
  for (gint b = 0; b < B; b++)
    longest = MAX(longest, lens[b]);
  for (gint i = 0; i < longest; i++) {
    /* a row past its length stays at its last position (rewriting a slot
     * it no longer reads) so that the rows decode together */
    gint32 p[B], tok[B];
    for (gint b = 0; b < B; b++) {
      p[b] = MIN(i, lens[b] - 1);
      tok[b] = qkv_tensor_i32(ids)[b * STEPS + p[b]];
    }
    g_autoptr(QkvTensor) pt = qkv_tensor_new_i32(&bs, p);
    g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&b1, tok);
    g_assert_true(qkv_plan_bind(plan, "ids", tt, &error));
    g_assert_true(qkv_plan_bind(plan, "positions", pt, &error));
    g_assert_true(qkv_plan_run(plan, &error));
    g_assert_no_error(error);
    const float *l = F32(qkv_plan_output(plan, 0));
    for (gint b = 0; b < B; b++)
      if (i < lens[b])
        memcpy(qkv_tensor_f32(out) + ((gsize)b * STEPS + i) * VOCAB, l + (gsize)b * VOCAB,
               VOCAB * sizeof(float));
  }
  return out;
}

/* The bound: both computations do the same arithmetic in a different order
 * (a GEMM over one row or 32, attention over the cache's STEPS slots with
 * the masked ones at probability 0 or over a causal square). Per logit the
 * rounding of each is at most (in units of u, to first order):
 *   the projections and scores: sums of DIM terms, whose error e_s (relative
 *   to the scores' magnitudes S = |q||k|/√DIM) moves each probability by at
 *   most 2 e_s S relatively; the softmax's exp, sum (STEPS terms) and
 *   division: STEPS + 3; the weighted sum of values: STEPS terms, relative
 *   to max|v|; the output projection: DIM terms, relative to |a||wo|.
 * So |Δlogit| ≤ factor u · Σ_j max|v| |wo_jo| (the attended vector is a
 * convex combination of values) with factor = 2 · (DIM + 2·(2·DIM)·S +
 * STEPS + 3 + STEPS), doubled as both computations err; S and max|v| are
 * the magnitudes of the scores and values actually attended. */
/* The magnitude |emb[tok]|·|w| of column m of one token's projection. */
static double
projection_magnitude(const Weights *w, const QkvTensor *wm, gint32 tok, gint m)
{
  double sum = 0;
  for (gint j = 0; j < DIM; j++)
    sum += fabs(F32(w->emb)[tok * DIM + j]) * fabs(F32(wm)[j * DIM + m]);
  return sum;
}

static void
check_against_full(const QkvTensor *cached, const QkvTensor *full, const Weights *w,
                   const QkvTensor *ids, gint B, const gint *lens)
{
  /* S: the largest score magnitude Σ|q||k|/√DIM over the pairs attended */
  double s = 0, max_v = 0;
  for (gint b = 0; b < B; b++)
    for (gint i = 0; i < STEPS; i++)
      for (gint j = 0; j <= i; j++) {
        double sum = 0;
        for (gint m = 0; m < DIM; m++) {
          gint32 ti = I32(ids)[b * STEPS + i], tj = I32(ids)[b * STEPS + j];
          sum += projection_magnitude(w, w->wq, ti, m) * projection_magnitude(w, w->wk, tj, m);
          max_v = MAX(max_v, projection_magnitude(w, w->wv, tj, m));
        }
        s = MAX(s, sum / sqrt(DIM));
      }
  double factor = 2.0 * (DIM + 4.0 * DIM * s + 2.0 * STEPS + 3.0);
  QkvShape ls = QKV_SHAPE(B, STEPS, VOCAB);
  g_autoptr(QkvTensor) mag = qkv_tensor_new(QKV_F32, &ls);
  g_autoptr(QkvTensor) expect = qkv_tensor_copy(full);
  for (gint b = 0; b < B; b++)
    for (gint i = 0; i < STEPS; i++)
      for (gint o = 0; o < VOCAB; o++) {
        double m = 0;
        for (gint j = 0; j < DIM; j++)
          m += max_v * fabs(qkv_tensor_f32(w->wo)[j * VOCAB + o]);
        gsize at = ((gsize)b * STEPS + i) * VOCAB + o;
        qkv_tensor_f32(mag)[at] = (float)m;
        if (i >= lens[b])
          qkv_tensor_f32(expect)[at] = 0.0f; /* not decoded */
      }
  double needed = qkv_assert_bounded("cached vs full", cached, expect, mag, factor);
  g_test_message("factor %.1f, needed %.2f", factor, needed);
  /* and the check would see an error of 1e-4 of the scale it measures in */
  g_autoptr(QkvTensor) wrong = qkv_tensor_copy(cached);
  gsize at = (gsize)(STEPS / 2) * VOCAB + 1;
  qkv_tensor_f32(wrong)[at] += 1e-4f * F32(mag)[at];
  g_assert_false(qkv_test_check_bound(wrong, expect, mag, 0, factor, NULL, NULL));
}

static void
test_cached_equals_full(void)
{
  const gint B = 1, lens[] = {STEPS};
  Weights w = weights_new();
  QkvShape is = QKV_SHAPE(B, STEPS);
  g_autoptr(QkvTensor) ids = qkv_test_randint(&is, 9, 0, VOCAB);
  g_autoptr(QkvTensor) full = full_logits(&w, ids, B);
  g_autoptr(QkvTensor) cached = cached_logits(&w, ids, B, lens);
  check_against_full(cached, full, &w, ids, B, lens);
  weights_clear(&w);
}

/* Two rows decoded together, one stopping early: the longer row's logits
 * still match its own full recompute, the shorter row's too. */
static void
test_rows_at_different_lengths(void)
{
  const gint B = 2, lens[] = {STEPS, 13};
  Weights w = weights_new();
  QkvShape is = QKV_SHAPE(B, STEPS);
  g_autoptr(QkvTensor) ids = qkv_test_randint(&is, 10, 0, VOCAB);
  g_autoptr(QkvTensor) full = full_logits(&w, ids, B);
  g_autoptr(QkvTensor) cached = cached_logits(&w, ids, B, lens);
  check_against_full(cached, full, &w, ids, B, lens);
  weights_clear(&w);
}

/* The cache op has no gradient rule: autodiff says so. */
static void
test_no_gradient(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape cs = QKV_SHAPE(1, 1, 4, 2);
  QkvValue *state = qkv_graph_state(g, "cache", QKV_F32, &cs, &error);
  QkvValue *x = qkv_test_input(g, "new", QKV_F32, QKV_SHAPE(1, 1, 1, 2));
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *p = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(1));
  QkvValue *y = qkv_kv_cache_append(state, x, p, NULL, &error);
  QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_false(qkv_graph_backward(g, loss, &error));
  g_assert_nonnull(error);
}

/* A kv_cache_attention node on q, keys, values and positions; with
 * weights its output 1 is the attention weights. */
static QkvNode *
cache_attention_node(QkvValue *q, QkvValue *keys, QkvValue *values, QkvValue *pos, double scale,
                     gboolean weights)
{
  g_autoptr(GError) error = NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "scale", g_variant_new_double(scale));
  if (weights)
    g_variant_builder_add(&attrs, "{sv}", "weights", g_variant_new_boolean(TRUE));
  QkvValue *inputs[] = {q, keys, values, pos};
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(q), "kv_cache_attention", inputs, 4,
                                     g_variant_builder_end(&attrs), &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, weights ? 2 : 1);
  return node;
}

/* kv_cache_attention reads only the filled slots of each row: after a run
 * at late positions has left NaN keys and values there, a run at early
 * positions still gives the masked-softmax attention over its own slots
 * (computed here in double), where one stale value read would make it NaN;
 * and so does the node that also outputs the weights, whose slots past
 * the ones a query sees (stale NaN ones among them) are exactly 0. */
static void
test_cache_attention(void)
{
  const gint B = 2, H = 2, T = 8, d = 3, dv = 2, t = 2;
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape ks = QKV_SHAPE(B, H, T, d), vs = QKV_SHAPE(B, H, T, dv);
  QkvValue *kstate = qkv_graph_state(g, "k", QKV_F32, &ks, &error);
  QkvValue *vstate = qkv_graph_state(g, "v", QKV_F32, &vs, &error);
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(B, H, t, d));
  QkvValue *k = qkv_test_input(g, "k_new", QKV_F32, QKV_SHAPE(B, H, t, d));
  QkvValue *v = qkv_test_input(g, "v_new", QKV_F32, QKV_SHAPE(B, H, t, dv));
  QkvValue *pos = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(B));
  QkvValue *keys = qkv_kv_cache_append(kstate, k, pos, NULL, &error);
  QkvValue *values = qkv_kv_cache_append(vstate, v, pos, NULL, &error);
  g_assert_no_error(error);
  QkvNode *plain = cache_attention_node(q, keys, values, pos, 0.5, FALSE);
  QkvNode *with_w = cache_attention_node(q, keys, values, pos, 0.5, TRUE);
  QkvValue *outs[] = {qkv_node_output(plain, 0), qkv_node_output(with_w, 0),
                      qkv_node_output(with_w, 1)};
  QkvShape want_ws = QKV_SHAPE(B, H, t, T);
  g_assert_true(qkv_shape_equal(qkv_value_shape(outs[2]), &want_ws));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  QkvShape qs = QKV_SHAPE(B, H, t, d), ns = QKV_SHAPE(B, H, t, dv), bs = QKV_SHAPE(B);
  /* run 1 fills slots 5-6 and 6-7 with NaN keys and values; run 2 writes
   * slots 0-1 and 2-3 (slots 0-1 of row 1 stay zero, as compiled) */
  const gint32 runs[2][2] = {{5, 6}, {0, 2}};
  g_autoptr(QkvTensor) qt = qkv_test_uniform(&qs, 10, -2, 2);
  g_autoptr(QkvTensor) kt = qkv_test_uniform(&qs, 20, -2, 2);
  g_autoptr(QkvTensor) vt = qkv_test_uniform(&ns, 30, -2, 2);
  g_autoptr(QkvTensor) nan = qkv_tensor_new(QKV_F32, &ns);
  g_autoptr(QkvTensor) nan_k = qkv_tensor_new(QKV_F32, &qs);
  for (gint i = 0; i < B * H * t * dv; i++)
    qkv_tensor_f32(nan)[i] = NAN;
  for (gint i = 0; i < B * H * t * d; i++)
    qkv_tensor_f32(nan_k)[i] = NAN;
  for (gint r = 0; r < 2; r++) {
    g_autoptr(QkvTensor) pt = qkv_tensor_new_i32(&bs, runs[r]);
    g_assert_true(qkv_plan_bind(plan, "q", qt, &error) &&
                  qkv_plan_bind(plan, "k_new", r == 0 ? nan_k : kt, &error) &&
                  qkv_plan_bind(plan, "v_new", r == 0 ? nan : vt, &error) &&
                  qkv_plan_bind(plan, "positions", pt, &error) && qkv_plan_run(plan, &error));
    g_assert_no_error(error);
  }
  const float *Q = qkv_tensor_f32(qt), *K = qkv_tensor_f32(kt), *V = qkv_tensor_f32(vt);
  float want[B * H * t * dv], want_w[B * H * t * T];
  for (gint bh = 0; bh < B * H; bh++)
    for (gint i = 0; i < t; i++) {
      /* query i sees slots [0, p + i], of which slot p + j holds new row j
       * and the ones before p are zero */
      gint p = runs[1][bh / H], n = p + i + 1;
      double sc[8], m = -INFINITY, sum = 0, o[2] = {0, 0};
      for (gint x = 0; x < n; x++) {
        sc[x] = 0;
        for (gint c = 0; x >= p && c < d; c++)
          sc[x] += 0.5 * Q[(bh * t + i) * d + c] * K[(bh * t + x - p) * d + c];
        m = MAX(m, sc[x]);
      }
      for (gint x = 0; x < n; x++)
        sum += exp(sc[x] - m);
      for (gint x = p; x < n; x++)
        for (gint c = 0; c < dv; c++)
          o[c] += exp(sc[x] - m) / sum * V[(bh * t + x - p) * dv + c];
      for (gint c = 0; c < dv; c++)
        want[(bh * t + i) * dv + c] = (float)o[c];
      for (gint x = 0; x < T; x++)
        want_w[(bh * t + i) * T + x] = x < n ? (float)(exp(sc[x] - m) / sum) : 0.0f;
    }
  /* sums of at most T terms below 4 in magnitude, in float32: a few u
   * (2^-24) of 4·T = 32 each, under 1e-5; a NaN fails any bound */
  qkv_assert_values(qkv_plan_output(plan, 0), want, B * H * t * dv, 1e-5);
  qkv_assert_values(qkv_plan_output(plan, 1), want, B * H * t * dv, 1e-5);
  /* the weights: scores below 0.5·d·4 = 6 in magnitude err by (d + 1) u ·
   * 6 each, which moves a weight by twice that relatively, and the softmax
   * adds 2·6 u (the max subtracted), 2 u (exp, 1 ulp), T u (the sum) and
   * 2 u (the reciprocal, the product): 72 u relative to weights ≤ 1, under
   * 1e-5. The slots a query does not see, exactly 0 */
  const QkvTensor *w = qkv_plan_output(plan, 2);
  qkv_assert_values(w, want_w, B * H * t * T, 1e-5);
  for (gint r = 0; r < B * H * t; r++)
    for (gint x = runs[1][r / (H * t)] + r % t + 1; x < T; x++)
      g_assert_cmpfloat(F32(w)[r * T + x], ==, 0.0f);
}

/* The graph cached mode built for the weights before kv_cache_attention had
 * them: scores over the whole cache (matmul, then scale) and masked_softmax
 * with the per-query lengths positions + 1 + i; out its weights · values.
 * *weights gets the masked_softmax. */
static QkvValue *
whole_cache_attention(QkvValue *q, QkvValue *keys, QkvValue *values, QkvValue *pos, double scale,
                      QkvValue **weights, GError **error)
{
  const gint perm[] = {0, 2, 1, 3}; /* (B, t, H, d): positions reads its axis 1 */
  QkvValue *lens = qkv_positions(qkv_permute(q, perm, 4, error), pos, 1, error);
  QkvValue *s = qkv_scale(qkv_matmul(q, keys, FALSE, TRUE, error), scale, error);
  *weights = qkv_masked_softmax(s, lens, FALSE, error);
  return qkv_matmul(*weights, values, FALSE, FALSE, error);
}

/* kv_cache_attention's weights (the attribute weights) against that graph:
 * keys and values are bound directly (no append), so the positions may be
 * any the op meets: 0, inside, the last slots exactly (p + t = T_max), past
 * the end (p + t > T_max, a row the append refuses: the op reads all T_max
 * slots) and -1 (query 0 sees no slot: a uniform row).
 *
 * The bound, per weight of row (b, h, i), in units of u to first order:
 * each computation forms the scores with sums of d terms and one scaling,
 * an error of (sf(d) + 1) S (sf = qkv_test_sum_factor; S = scale · max_x
 * Σ_c |q_c||k_xc| over the slots the query sees), which moves a weight by
 * at most twice that relative to itself; its softmax subtracts the row's
 * maximum (u |s − m| ≤ 2 S), takes exp (1 ulp: 2), sums at most T_max
 * positive terms (sf(T_max)) and multiplies by a reciprocal (2):
 *   r = 2 (sf(d) + 1) S + 2 S + 2 + sf(T_max) + 2
 * relative to the weight, and both computations err: factor 2 times w r
 * (w and S computed here in double). A masked weight has bound 0: both
 * must give exactly 0. out: the weights' error times |v| plus a sum of
 * T_max terms, so r + sf(T_max) relative to Σ_x w_x |v_xc|. */
static void
test_cache_attention_weights(void)
{
  enum { B = 5, H = 2, T = 7, d = 5, dv = 3, t = 2 };
  const gint32 positions[B] = {0, 3, 5, 6, -1};
  const double scale = 1.0 / sqrt(d);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(B, H, t, d));
  QkvValue *keys = qkv_test_input(g, "keys", QKV_F32, QKV_SHAPE(B, H, T, d));
  QkvValue *values = qkv_test_input(g, "values", QKV_F32, QKV_SHAPE(B, H, T, dv));
  QkvValue *pos = qkv_test_input(g, "positions", QKV_I32, QKV_SHAPE(B));
  QkvNode *node = cache_attention_node(q, keys, values, pos, scale, TRUE);
  QkvNode *plain = cache_attention_node(q, keys, values, pos, scale, FALSE);
  QkvValue *old_w = NULL;
  QkvValue *old = whole_cache_attention(q, keys, values, pos, scale, &old_w, &error);
  g_assert_no_error(error);
  QkvValue *outs[] = {qkv_node_output(node, 0), qkv_node_output(node, 1), qkv_node_output(plain, 0),
                      old, old_w};
  QkvShape qs = QKV_SHAPE(B, H, t, d), ks = QKV_SHAPE(B, H, T, d), vs = QKV_SHAPE(B, H, T, dv);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) qt = qkv_test_uniform(&qs, 41, -1, 1);
  g_autoptr(QkvTensor) kt = qkv_test_uniform(&ks, 42, -1, 1);
  g_autoptr(QkvTensor) vt = qkv_test_uniform(&vs, 43, -1, 1);
  g_autoptr(QkvTensor) pt = qkv_tensor_new_i32(&bs, positions);
  const gchar *names[] = {"q", "keys", "values", "positions"};
  QkvTensor *ins[] = {qt, kt, vt, pt};
  QkvTensor *res[5] = {NULL};
  g_assert_true(qkv_graph_eval(g, names, ins, 4, outs, res, 5, &error));
  g_assert_no_error(error);

  QkvShape ws = QKV_SHAPE(B, H, t, T), os = QKV_SHAPE(B, H, t, dv);
  g_autoptr(QkvTensor) w_mag = qkv_tensor_new(QKV_F32, &ws);
  g_autoptr(QkvTensor) out_mag = qkv_tensor_new(QKV_F32, &os);
  const float *Q = F32(qt), *K = F32(kt), *V = F32(vt), *W = F32(res[1]);
  const double sf_d = qkv_test_sum_factor(d), sf_T = qkv_test_sum_factor(T);
  for (gint bh = 0; bh < B * H; bh++)
    for (gint i = 0; i < t; i++) {
      gint r = bh * t + i;
      gint64 limit = CLAMP((gint64)positions[bh / H] + i + 1, 0, T);
      double sc[T], S = 0, m = -INFINITY, sum = 0, w[T];
      for (gint x = 0; x < limit; x++) {
        double dot = 0, mag = 0;
        for (gint c = 0; c < d; c++) {
          dot += Q[r * d + c] * K[(bh * T + x) * d + c];
          mag += fabs(Q[r * d + c] * K[(bh * T + x) * d + c]);
        }
        sc[x] = scale * dot;
        S = MAX(S, scale * mag);
        m = MAX(m, sc[x]);
      }
      for (gint x = 0; x < limit; x++)
        sum += exp(sc[x] - m);
      for (gint x = 0; x < T; x++)
        w[x] = limit == 0 ? 1.0 / T : x < limit ? exp(sc[x] - m) / sum : 0.0;
      double rel = 2 * (sf_d + 1) * S + 2 * S + 2 + sf_T + 2;
      for (gint x = 0; x < T; x++)
        qkv_tensor_f32(w_mag)[r * T + x] = (float)(w[x] * rel);
      for (gint c = 0; c < dv; c++) {
        double a = 0;
        for (gint x = 0; x < T; x++)
          a += w[x] * fabs(V[(bh * T + x) * dv + c]);
        qkv_tensor_f32(out_mag)[r * dv + c] = (float)(a * (rel + sf_T));
      }
      /* the slots query i does not see: exactly 0, read or not */
      for (gint x = limit == 0 ? T : limit; x < T; x++)
        g_assert_cmpfloat(W[r * T + x], ==, 0.0f);
    }
  double needed = qkv_assert_bounded("weights vs whole cache", res[1], res[4], w_mag, 2.0);
  g_test_message("weights: factor 2, needed %.2f", needed);
  qkv_assert_bounded("out vs whole cache", res[0], res[3], out_mag, 2.0);
  qkv_assert_bounded("out without weights vs whole cache", res[2], res[3], out_mag, 2.0);
  /* and the check would see a weight off by 1e-4 of itself */
  gint64 at = qkv_test_typical_index(res[4]);
  g_autoptr(QkvTensor) wrong = qkv_test_perturbed(res[1], at, 1e-4);
  g_assert_false(qkv_test_check_bound(wrong, res[4], w_mag, 0, 2.0, NULL, NULL));
  for (gint i = 0; i < 5; i++)
    qkv_tensor_free(res[i]);

  /* weights must be a bool */
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "weights", g_variant_new_int32(1));
  QkvValue *inputs[] = {q, keys, values, pos};
  qkv_assert_op_fails(
      g, "kv_cache_attention", QKV_ERROR_ATTRIBUTE,
      qkv_graph_op(g, "kv_cache_attention", inputs, 4, g_variant_builder_end(&attrs), &error_));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/kv-cache/state-persists", test_state_persists);
  g_test_add_func("/kv-cache/append-positions", test_append_positions);
  g_test_add_func("/kv-cache/cached-equals-full", test_cached_equals_full);
  g_test_add_func("/kv-cache/rows-at-different-lengths", test_rows_at_different_lengths);
  g_test_add_func("/kv-cache/no-gradient", test_no_gradient);
  g_test_add_func("/kv-cache/attention-reads-filled-slots", test_cache_attention);
  g_test_add_func("/kv-cache/attention-weights", test_cache_attention_weights);
  return g_test_run();
}
