/* test-sample.c: qkv_sample_logits() and qkv_generate() (qkv-decode.h) —
 * greedy decoding, the distributions that temperature, top-k and top-p draw
 * from (counted over many draws against exact probabilities), the sets top-k
 * and top-p keep at their boundaries, reproducibility (seeds, steps, rows,
 * thread counts), the generation loop on hand-made Markov chains, and the
 * errors for bad arguments. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-decode.h>

/* ---- counting draws -------------------------------------------------------- */

/* P(X ≥ x) for X chi-square with df degrees of freedom: the regularised
 * upper incomplete gamma Q(df/2, x/2) in closed form (a finite sum for even
 * df, erfc and a finite sum for odd df). */
static double
chi2_survival(double x, gint df)
{
  const double h = x / 2.0;
  double q, term;
  gint i;
  if (df % 2 == 0) {
    q = 0.0, term = exp(-h);
    for (i = 0; i < df / 2; i++) {
      q += term;
      term *= h / (i + 1);
    }
    return q;
  }
  q = erfc(sqrt(h));
  term = exp(-h) * sqrt(h) / tgamma(1.5);
  for (i = 1; i <= df / 2; i++) {
    q += term;
    term *= h / (i + 0.5);
  }
  return q;
}

/* Pearson's statistic of counts (n tokens, draws in all) against
 * probabilities p; tokens of probability 0 must never be drawn. Returns the
 * survival probability of the statistic with (tokens of p > 0) - 1 degrees
 * of freedom: a correct sampler falls below 1e-6 on one seed in a million. */
static double
chi2_test(const gint *counts, const double *p, gint n, gint draws)
{
  double stat = 0.0;
  gint cells = 0;
  for (gint v = 0; v < n; v++) {
    if (p[v] == 0.0) {
      g_assert_cmpint(counts[v], ==, 0);
      continue;
    }
    double e = p[v] * draws;
    stat += (counts[v] - e) * (counts[v] - e) / e;
    cells++;
  }
  double s = chi2_survival(stat, cells - 1);
  g_test_message("chi-square %.2f over %d cells: P = %.3g", stat, cells, s);
  return s;
}

/* softmax(x / t) restricted to keep (NULL: all), in double. */
static void
exact_probs(const float *x, gint n, double t, const gboolean *keep, double *p)
{
  double m = -INFINITY, total = 0.0;
  for (gint v = 0; v < n; v++)
    m = MAX(m, (double)x[v]);
  for (gint v = 0; v < n; v++) {
    p[v] = (keep == NULL || keep[v]) ? exp(((double)x[v] - m) / t) : 0.0;
    total += p[v];
  }
  for (gint v = 0; v < n; v++)
    p[v] /= total;
}

/* Draw one row of logits once per step for steps 0 .. draws - 1 and count
 * the tokens. */
static void
count_draws(const QkvSampleOptions *o, const float *x, gint n, gint draws, gint *counts)
{
  g_autoptr(GError) error = NULL;
  memset(counts, 0, sizeof(gint) * n);
  for (gint s = 0; s < draws; s++) {
    gint32 token = -1;
    g_assert_true(qkv_sample_logits(o, x, 1, n, (guint64)s, NULL, &token, &error));
    g_assert_no_error(error);
    g_assert_cmpint(token, >=, 0);
    g_assert_cmpint(token, <, n);
    counts[token]++;
  }
}

/* ---- greedy ------------------------------------------------------------------ */

/* Temperature 0 is the argmax, the lowest id on a tie, whatever the seed,
 * step, top_k and top_p. */
static void
test_greedy(void)
{
  g_autoptr(GError) error = NULL;
  const float rows[][4] = {
      {1, 3, 3, 2}, {-INFINITY, -INFINITY, 0.5f, 0.5f}, {-2, -1, -INFINITY, -1.5f},
      {7, 7, 7, 7}, {-1e30f, -1e30f, -1e30f, -3e29f},
  };
  const gint32 want[] = {1, 2, 1, 0, 3};
  const gint n = G_N_ELEMENTS(want);
  for (gint variant = 0; variant < 4; variant++) {
    QkvSampleOptions o = qkv_sample_options_default();
    o.temperature = 0.0;
    o.seed = (guint64)variant * 977;
    o.top_k = variant == 2 ? 1 : 0;
    o.top_p = variant == 3 ? 0.01 : 1.0;
    gint32 got[G_N_ELEMENTS(want)];
    g_assert_true(qkv_sample_logits(&o, &rows[0][0], n, 4, (guint64)variant, NULL, got, &error));
    g_assert_no_error(error);
    for (gint r = 0; r < n; r++)
      g_assert_cmpint(got[r], ==, want[r]);
  }

  /* random rows with ties made on purpose, against a plain loop */
  const gint R = 64, V = 37;
  QkvShape s = QKV_SHAPE(R, V);
  g_autoptr(QkvTensor) t = qkv_test_randint(&s, 5, -4, 4);
  g_autofree float *x = g_new(float, R *V);
  for (gint i = 0; i < R * V; i++)
    x[i] = (float)qkv_tensor_i32(t)[i];
  gint32 got[64];
  QkvSampleOptions o = qkv_sample_options_default();
  o.temperature = 0.0;
  g_assert_true(qkv_sample_logits(&o, x, R, V, 0, NULL, got, &error));
  for (gint r = 0; r < R; r++) {
    gint32 best = 0;
    for (gint v = 1; v < V; v++)
      if (x[r * V + v] > x[r * V + best])
        best = v;
    g_assert_cmpint(got[r], ==, best);
  }
}

/* ---- the distributions ---------------------------------------------------- */

/* softmax(x / T) over 20000 draws, for T below and above 1; the same counts
 * are far from the distribution of another temperature (the check has the
 * power to see a wrong one). A -inf token is never drawn. */
static void
test_temperature(void)
{
  const float x[] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, -INFINITY};
  const gint n = G_N_ELEMENTS(x), draws = 20000;
  const double temps[] = {0.7, 2.5};
  for (gsize i = 0; i < G_N_ELEMENTS(temps); i++) {
    QkvSampleOptions o = qkv_sample_options_default();
    o.temperature = temps[i];
    o.seed = 11 + i;
    gint counts[G_N_ELEMENTS(x)];
    double p[G_N_ELEMENTS(x)], wrong[G_N_ELEMENTS(x)];
    count_draws(&o, x, n, draws, counts);
    exact_probs(x, n, temps[i], NULL, p);
    g_assert_cmpfloat(chi2_test(counts, p, n, draws), >, 1e-6);
    exact_probs(x, n, temps[i] * 1.25, NULL, wrong);
    g_assert_cmpfloat(chi2_test(counts, wrong, n, draws), <, 1e-6);
  }
}

/* Top-k draws only the k largest, each at its renormalised probability;
 * tokens tied with the k-th are all kept; k at or above the number of
 * possible tokens changes nothing. */
static void
test_top_k(void)
{
  const float x[] = {0.3f, 2.0f, -1.0f, 1.5f, 0.9f, 1.2f, -INFINITY};
  const gint n = G_N_ELEMENTS(x), draws = 12000;
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_k = 3;
  o.seed = 3;
  gint counts[G_N_ELEMENTS(x)];
  double p[G_N_ELEMENTS(x)];
  const gboolean top3[] = {FALSE, TRUE, FALSE, TRUE, FALSE, TRUE, FALSE};
  count_draws(&o, x, n, draws, counts);
  exact_probs(x, n, 1.0, top3, p);
  g_assert_cmpfloat(chi2_test(counts, p, n, draws), >, 1e-6);

  /* ties at the boundary: the 2nd largest is 4, and both 4s stay */
  const float tied[] = {5.0f, 4.0f, 1.0f, 4.0f};
  const gboolean keep[] = {TRUE, TRUE, FALSE, TRUE};
  o.top_k = 2;
  count_draws(&o, tied, 4, draws, counts);
  exact_probs(tied, 4, 1.0, keep, p);
  g_assert_cmpint(counts[3], >, 0);
  g_assert_cmpfloat(chi2_test(counts, p, 4, draws), >, 1e-6);

  /* k of 6 (the tokens above -inf) or more: the same draws as no top-k */
  for (gint k = 6; k <= 8; k++) {
    gint with_k[G_N_ELEMENTS(x)], without[G_N_ELEMENTS(x)];
    o.top_k = k;
    count_draws(&o, x, n, 500, with_k);
    o.top_k = 0;
    count_draws(&o, x, n, 500, without);
    g_assert_cmpmem(with_k, sizeof with_k, without, sizeof without);
  }
}

/* Top-k on wider random rows: every draw's logit is at least the k-th
 * largest of its row. */
static void
test_top_k_random_rows(void)
{
  g_autoptr(GError) error = NULL;
  const gint R = 200, V = 1000, k = 25;
  QkvShape s = QKV_SHAPE(R, V);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&s, 9, -3, 3);
  const float *x = qkv_tensor_f32(t);
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_k = k;
  o.temperature = 4.0; /* flat enough that the tail would show up */
  gint32 got[200];
  for (guint64 step = 0; step < 5; step++) {
    g_assert_true(qkv_sample_logits(&o, x, R, V, step, NULL, got, &error));
    for (gint r = 0; r < R; r++) {
      const float *row = x + (gsize)r * V;
      gint above = 0;
      for (gint v = 0; v < V; v++)
        above += row[v] > row[got[r]];
      g_assert_cmpint(above, <, k);
    }
  }
}

/* Top-p keeps a token while the probability ranked before it is below p:
 * with p = 0.75 over {0.5, 0.3, 0.15, 0.05} that is 0.5 and 0.3 (0.3 is the
 * token that makes the total reach p, and it is drawn); a rule that kept
 * tokens while their cumulative probability stayed within p would keep 0.5
 * alone. */
static void
test_top_p(void)
{
  const double probs[] = {0.15, 0.5, 0.05, 0.3};
  float x[4];
  for (gint v = 0; v < 4; v++)
    x[v] = (float)log(probs[v]);
  const gint draws = 12000;
  gint counts[4];
  double p[4];
  QkvSampleOptions o = qkv_sample_options_default();
  o.seed = 21;
  o.top_p = 0.75;
  const gboolean nucleus_75[] = {FALSE, TRUE, FALSE, TRUE};
  count_draws(&o, x, 4, draws, counts);
  exact_probs(x, 4, 1.0, nucleus_75, p);
  g_assert_cmpint(counts[3], >, 0);
  g_assert_cmpfloat(chi2_test(counts, p, 4, draws), >, 1e-6);

  o.top_p = 0.85;
  const gboolean nucleus_85[] = {TRUE, TRUE, FALSE, TRUE};
  count_draws(&o, x, 4, draws, counts);
  exact_probs(x, 4, 1.0, nucleus_85, p);
  g_assert_cmpfloat(chi2_test(counts, p, 4, draws), >, 1e-6);

  /* ties rank by id: four equal tokens, exactly 0.25 each; p = 0.5 keeps
   * ids 0 and 1 (0.5 before id 2 is not below 0.5), a hair more keeps id 2 */
  const float flat[] = {0, 0, 0, 0};
  o.top_p = 0.5;
  count_draws(&o, flat, 4, 2000, counts);
  g_assert_cmpint(counts[0], >, 0);
  g_assert_cmpint(counts[1], >, 0);
  g_assert_cmpint(counts[2] + counts[3], ==, 0);
  o.top_p = 0.5000001;
  count_draws(&o, flat, 4, 2000, counts);
  g_assert_cmpint(counts[2], >, 0);
  g_assert_cmpint(counts[3], ==, 0);
}

/* Top-p applies to what top-k left, renormalised: over {0.4, 0.3, 0.2,
 * 0.1} with k = 2 the distribution is {4/7, 3/7}, so p = 0.5 keeps the first
 * token alone (on the original probabilities 0.4 < 0.5 would keep the
 * second), and p = 0.6 both. */
static void
test_top_k_then_top_p(void)
{
  const double probs[] = {0.4, 0.3, 0.2, 0.1};
  float x[4];
  for (gint v = 0; v < 4; v++)
    x[v] = (float)log(probs[v]);
  gint counts[4];
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_k = 2;
  o.top_p = 0.5;
  count_draws(&o, x, 4, 2000, counts);
  g_assert_cmpint(counts[0], ==, 2000);
  o.top_p = 0.6;
  count_draws(&o, x, 4, 2000, counts);
  g_assert_cmpint(counts[1], >, 0);
  g_assert_cmpint(counts[0] + counts[1], ==, 2000);
}

/* The nucleus of one row computed the plain way: sort by logit (ties by
 * id), keep while the probability before is below p. */
static void
reference_nucleus(const float *x, gint n, double t, double top_p, gboolean *keep)
{
  double p[256];
  gint order[256];
  exact_probs(x, n, t, NULL, p);
  for (gint v = 0; v < n; v++)
    order[v] = v;
  for (gint i = 1; i < n; i++)
    for (gint j = i; j > 0 && (x[order[j]] > x[order[j - 1]]); j--) {
      gint s = order[j];
      order[j] = order[j - 1];
      order[j - 1] = s;
    }
  double before = 0.0;
  for (gint i = 0; i < n; i++) {
    keep[order[i]] = before < top_p;
    before += p[order[i]];
  }
}

/* Top-p on random rows: every draw is in the row's nucleus, and the draws
 * of a row follow its renormalised nucleus. */
static void
test_top_p_random_rows(void)
{
  g_autoptr(GError) error = NULL;
  const gint R = 50, V = 200, draws = 4000;
  QkvShape s = QKV_SHAPE(R, V);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&s, 13, -4, 4);
  const float *x = qkv_tensor_f32(t);
  QkvSampleOptions o = qkv_sample_options_default();
  o.temperature = 0.8;
  o.top_p = 0.9;
  gint32 got[50];
  gboolean keep[50][200];
  for (gint r = 0; r < R; r++)
    reference_nucleus(x + (gsize)r * V, V, o.temperature, o.top_p, keep[r]);
  for (guint64 step = 0; step < 40; step++) {
    g_assert_true(qkv_sample_logits(&o, x, R, V, step, NULL, got, &error));
    for (gint r = 0; r < R; r++)
      g_assert_true(keep[r][got[r]]);
  }
  gint counts[200];
  double p[200];
  count_draws(&o, x, V, draws, counts);
  exact_probs(x, V, o.temperature, keep[0], p);
  /* pool the cells expected below 5 draws, as Pearson's test wants */
  gint small_count = 0;
  double small_p = 0.0;
  for (gint v = 0; v < V; v++)
    if (p[v] > 0 && p[v] * draws < 5) {
      small_count += counts[v], small_p += p[v];
      counts[v] = 0, p[v] = 0.0;
    }
  counts[0] += small_count, p[0] += small_p;
  g_assert_cmpfloat(chi2_test(counts, p, V, draws), >, 1e-6);
}

/* ---- reproducibility -------------------------------------------------------- */

static void
sample_rows(const QkvSampleOptions *o, const float *x, gint rows, gint vocab, guint64 step,
            const guint64 *ids, gint32 *out)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_sample_logits(o, x, rows, vocab, step, ids, out, &error));
  g_assert_no_error(error);
}

/* The same seed and step give the same tokens; another seed or step gives
 * others (on a flat row of 50, about 49 rows in 50 differ). */
static void
test_seeds(void)
{
  const gint R = 256, V = 50;
  g_autofree float *x = g_new0(float, R *V);
  gint32 a[256], b[256], c[256], d[256];
  QkvSampleOptions o = qkv_sample_options_default();
  o.seed = 1;
  sample_rows(&o, x, R, V, 0, NULL, a);
  sample_rows(&o, x, R, V, 0, NULL, b);
  g_assert_cmpmem(a, sizeof a, b, sizeof b);
  sample_rows(&o, x, R, V, 1, NULL, d);
  o.seed = 2;
  sample_rows(&o, x, R, V, 0, NULL, c);
  gint differ_seed = 0, differ_step = 0;
  for (gint r = 0; r < R; r++) {
    differ_seed += a[r] != c[r];
    differ_step += a[r] != d[r];
  }
  g_assert_cmpint(differ_seed, >, 220);
  g_assert_cmpint(differ_step, >, 220);
}

/* The sampler runs on the calling thread; the thread count must not change
 * what it draws, with every filter on. */
static void
test_threads(void)
{
  const gint R = 64, V = 300;
  QkvShape s = QKV_SHAPE(R, V);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&s, 17, -2, 2);
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_k = 40;
  o.top_p = 0.8;
  o.seed = 5;
  gint32 one[64], two[64];
  const gint saved = qkv_get_num_threads();
  for (guint64 step = 0; step < 3; step++) {
    qkv_set_num_threads(1);
    sample_rows(&o, qkv_tensor_f32(t), R, V, step, NULL, one);
    qkv_set_num_threads(2);
    sample_rows(&o, qkv_tensor_f32(t), R, V, step, NULL, two);
    g_assert_cmpmem(one, sizeof one, two, sizeof two);
  }
  qkv_set_num_threads(saved);
}

/* A row's draw depends on its own logits and id only: changing row 0 leaves
 * the others as they were, and a row sampled alone under its id draws what
 * it drew at that index in the batch. */
static void
test_rows_independent(void)
{
  const gint R = 8, V = 20;
  QkvShape s = QKV_SHAPE(R, V);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&s, 23, -1, 1);
  g_autofree float *x = g_memdup2(qkv_tensor_f32(t), R * V * sizeof(float));
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_p = 0.95;
  for (guint64 step = 0; step < 20; step++) {
    gint32 before[8], after[8];
    sample_rows(&o, x, R, V, step, NULL, before);
    for (gint v = 0; v < V; v++)
      x[v] = (float)((v * 7 + (gint)step) % V);
    sample_rows(&o, x, R, V, step, NULL, after);
    g_assert_cmpmem(before + 1, (R - 1) * sizeof(gint32), after + 1, (R - 1) * sizeof(gint32));
    for (gint r = 0; r < R; r++) {
      const guint64 id = (guint64)r;
      gint32 alone;
      sample_rows(&o, x + (gsize)r * V, 1, V, step, &id, &alone);
      g_assert_cmpint(alone, ==, after[r]);
    }
  }
}

/* ---- bad arguments ----------------------------------------------------------- */

static guint log_count;
static gboolean log_counting;

/* Installed once for the program: counts what is logged while log_counting
 * is set, else logs as usual. */
static GLogWriterOutput
count_log_writer(GLogLevelFlags level, const GLogField *fields, gsize n_fields, gpointer data)
{
  if (log_counting) {
    log_count++;
    return G_LOG_WRITER_HANDLED;
  }
  return g_log_writer_default(level, fields, n_fields, data);
}

/* qkv_sample_logits must refuse the call with QKV_ERROR_INVALID_ARGUMENT,
 * a message containing what, and leave the token untouched. */
static void
assert_sample_refused(const QkvSampleOptions *o, const float *x, gint rows, gint64 vocab,
                      const gchar *what)
{
  g_autoptr(GError) error = NULL;
  gint32 tokens[4] = {77, 77, 77, 77};
  g_assert_false(qkv_sample_logits(o, x, rows, vocab, 0, NULL, tokens, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  if (strstr(error->message, what) == NULL)
    g_error("'%s' does not name '%s'", error->message, what);
  g_test_message("%s", error->message);
  for (gint i = 0; i < 4; i++)
    g_assert_cmpint(tokens[i], ==, 77);
}

static void
test_sample_bad_arguments(void)
{
  const float ok[] = {0, 1, 2, 3, 0, 1, 2, 3};
  log_counting = TRUE;
  log_count = 0;
  const double bad_temps[] = {-0.5, NAN, INFINITY};
  for (gsize i = 0; i < G_N_ELEMENTS(bad_temps); i++) {
    QkvSampleOptions o = qkv_sample_options_default();
    o.temperature = bad_temps[i];
    assert_sample_refused(&o, ok, 2, 4, "temperature");
  }
  const double bad_ps[] = {0.0, -0.1, 1.5, NAN};
  for (gsize i = 0; i < G_N_ELEMENTS(bad_ps); i++) {
    QkvSampleOptions o = qkv_sample_options_default();
    o.top_p = bad_ps[i];
    assert_sample_refused(&o, ok, 2, 4, "top_p");
  }
  QkvSampleOptions o = qkv_sample_options_default();
  o.top_k = -1;
  assert_sample_refused(&o, ok, 2, 4, "top_k");
  o = qkv_sample_options_default();
  assert_sample_refused(&o, ok, 2, 0, "vocab");
  assert_sample_refused(&o, ok, 2, (gint64)G_MAXINT32 + 1, "vocab");
  assert_sample_refused(&o, ok, -1, 4, "n_rows");

  /* bad logits name the row and token; greedy checks them too */
  for (gint greedy = 0; greedy < 2; greedy++) {
    o.temperature = greedy ? 0.0 : 1.0;
    float x[8];
    memcpy(x, ok, sizeof x);
    x[6] = NAN;
    assert_sample_refused(&o, x, 2, 4, "row 1: the logit of token 2 is nan");
    x[6] = INFINITY;
    assert_sample_refused(&o, x, 2, 4, "row 1: the logit of token 2 is +inf");
    for (gint v = 0; v < 4; v++)
      x[v] = -INFINITY;
    x[6] = 0;
    assert_sample_refused(&o, x, 2, 4, "row 0: every logit is -inf");
  }
  /* no rows: nothing to do */
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_sample_logits(&o, NULL, 0, 4, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  log_counting = FALSE;
  g_assert_cmpuint(log_count, ==, 0);
}

/* ---- generation ------------------------------------------------------------ */

enum { V = 7, BOS = 1, EOS = 2, MAX_STEPS = 16 };

/* A Markov chain as a step callback: the logits after token a are
 * table[a]; it records what each row fed at each step and can fail. */
typedef struct {
  float table[V][V];
  gint calls;
  gint32 fed[MAX_STEPS][4];
  gint fail_step; /* return FALSE at this step (-1: never) */
  gboolean fail_without_error;
  gint nan_step, nan_row; /* write a NaN there (-1: never) */
} Chain;

#define TEST_ERROR (g_quark_from_static_string("test-sample-error"))

static gboolean
chain_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
           float *logits, GError **error)
{
  Chain *c = user_data;
  c->calls++;
  g_assert_cmpint(step, <, MAX_STEPS);
  for (gint r = 0; r < n_rows; r++) {
    g_assert_cmpint(parents[r], ==, r);
    g_assert_cmpint(tokens[r], >=, 0);
    g_assert_cmpint(tokens[r], <, V);
    if (r < 4)
      c->fed[step][r] = tokens[r];
    memcpy(logits + (gsize)r * V, c->table[tokens[r]], sizeof c->table[0]);
  }
  if (step == c->nan_step)
    logits[(gsize)c->nan_row * V + 3] = NAN;
  if (step == c->fail_step) {
    if (!c->fail_without_error)
      g_set_error(error, TEST_ERROR, 7, "the chain broke at step %d", step);
    return FALSE;
  }
  return TRUE;
}

/* A chain whose argmax after each token is next[token]: 1 (bos) → 3 → 4 →
 * 5 → 2 (eos); 6 → 6 forever; 2 → 2 and 0 → 0. */
static void
chain_init_greedy(Chain *c)
{
  const gint32 next[V] = {0, 3, 2, 4, 5, 2, 6};
  memset(c, 0, sizeof *c);
  c->fail_step = c->nan_step = -1;
  for (gint a = 0; a < V; a++)
    for (gint b = 0; b < V; b++)
      c->table[a][b] = b == next[a] ? 5.0f : (float)(b % 3) - 1.0f;
}

/* Greedy generation: prompts of different lengths fed token by token,
 * each row stopping at eos or max_new_tokens, stopped rows fed eos. */
static void
test_generate_greedy(void)
{
  g_autoptr(GError) error = NULL;
  Chain c;
  chain_init_greedy(&c);
  QkvGenerateOptions o = qkv_generate_options_default();
  o.sample.temperature = 0.0;
  o.vocab = V;
  o.eos = EOS;
  const gint32 prompt[] = {3, 5, 3, 4, 6};
  const gint lens[] = {1, 3, 1};
  gint32 out[3][4];
  gint out_lens[3];
  g_assert_true(qkv_generate(&o, 3, prompt, lens, 4, chain_step, &c, &out[0][0], out_lens, &error));
  g_assert_no_error(error);
  const gint32 want[3][4] = {{4, 5, EOS, EOS}, {5, EOS, EOS, EOS}, {6, 6, 6, 6}};
  const gint want_lens[] = {2, 1, 4};
  g_assert_cmpmem(out, sizeof out, want, sizeof want);
  g_assert_cmpmem(out_lens, sizeof out_lens, want_lens, sizeof want_lens);
  /* row 0 draws at steps 0–2, row 1 (context 3) at 2–3, row 2 at 0–3 */
  g_assert_cmpint(c.calls, ==, 4);
  const gint32 fed[4][3] = {{3, 5, 6}, {4, 3, 6}, {5, 4, 6}, {EOS, 5, 6}};
  for (gint t = 0; t < 4; t++)
    for (gint b = 0; b < 3; b++)
      g_assert_cmpint(c.fed[t][b], ==, fed[t][b]);
}

/* With bos every context starts with it (an empty prompt is bos alone);
 * without eos every row runs to max_new_tokens, a stopped row fed its last
 * token. */
static void
test_generate_bos_and_no_eos(void)
{
  g_autoptr(GError) error = NULL;
  Chain c;
  chain_init_greedy(&c);
  QkvGenerateOptions o = qkv_generate_options_default();
  o.sample.temperature = 0.0;
  o.vocab = V;
  o.bos = BOS;
  o.eos = EOS;
  const gint32 prompt[] = {4};
  const gint lens[] = {0, 1};
  gint32 out[2][5];
  gint out_lens[2];
  g_assert_true(qkv_generate(&o, 2, prompt, lens, 5, chain_step, &c, &out[0][0], out_lens, &error));
  const gint32 want[2][5] = {{3, 4, 5, EOS, EOS}, {5, EOS, EOS, EOS, EOS}};
  g_assert_cmpmem(out, sizeof out, want, sizeof want);
  g_assert_cmpint(out_lens[0], ==, 3);
  g_assert_cmpint(out_lens[1], ==, 1);
  g_assert_cmpint(c.fed[0][0], ==, BOS);
  g_assert_cmpint(c.fed[0][1], ==, BOS);
  g_assert_cmpint(c.fed[1][1], ==, 4);
  g_assert_cmpint(c.calls, ==, 4);

  chain_init_greedy(&c);
  o.eos = -1;
  g_assert_true(qkv_generate(&o, 2, prompt, lens, 5, chain_step, &c, &out[0][0], out_lens, &error));
  const gint32 no_eos[2][5] = {{3, 4, 5, 2, 2}, {5, 2, 2, 2, 2}};
  g_assert_cmpmem(out, sizeof out, no_eos, sizeof no_eos);
  g_assert_cmpint(out_lens[0], ==, 5);
  g_assert_cmpint(out_lens[1], ==, 5);
  /* row 0 draws its 5th token at step 4, row 1 (a context one token
   * longer) at step 5, when row 0 is fed its last token */
  g_assert_cmpint(c.calls, ==, 6);
  g_assert_cmpint(c.fed[5][0], ==, 2);
  g_assert_cmpint(c.fed[5][1], ==, 2);
}

/* A chain with random logits (a fixed table): sampled generation. */
static void
chain_init_random(Chain *c, guint32 seed)
{
  QkvShape s = QKV_SHAPE(V, V);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&s, seed, -1.5f, 1.5f);
  memset(c, 0, sizeof *c);
  c->fail_step = c->nan_step = -1;
  memcpy(c->table, qkv_tensor_f32(t), sizeof c->table);
}

static void
generate(const QkvGenerateOptions *o, Chain *c, gint batch, const gint32 *prompt, const gint *lens,
         gint max_new, gint32 *out, gint *out_lens)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(
      qkv_generate(o, batch, prompt, lens, max_new, chain_step, c, out, out_lens, &error));
  g_assert_no_error(error);
}

/* Sampled generation draws row b's i-th token as qkv_sample_logits() does
 * with step i and id b, so a row's tokens depend neither on the other rows'
 * prompts nor on when they stop, nor on the thread count. */
static void
test_generate_sampled(void)
{
  Chain c;
  chain_init_random(&c, 31);
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = V;
  o.eos = EOS;
  o.sample.seed = 99;
  o.sample.top_k = 5;
  o.sample.top_p = 0.9;
  const gint32 prompt[] = {3, 4, 0, 5, 6, 6, 1};
  const gint lens[] = {2, 4, 1};
  enum { MAX_NEW = 8 };
  gint32 out[3][MAX_NEW], again[3][MAX_NEW];
  gint out_lens[3], again_lens[3];
  generate(&o, &c, 3, prompt, lens, MAX_NEW, &out[0][0], out_lens);

  /* replay each row's chain with qkv_sample_logits */
  for (gint b = 0, at = 0; b < 3; at += lens[b], b++) {
    gint32 last = prompt[at + lens[b] - 1];
    gint n = 0;
    for (gint i = 0; i < MAX_NEW; i++) {
      const guint64 id = (guint64)b;
      gint32 token;
      sample_rows(&o.sample, c.table[last], 1, V, (guint64)i, &id, &token);
      if (token == EOS)
        break;
      g_assert_cmpint(out[b][n++], ==, token);
      last = token;
    }
    g_assert_cmpint(out_lens[b], ==, n);
  }

  /* row 0 alone: the same tokens */
  const gint one_len[] = {2};
  gint32 alone[1][MAX_NEW];
  gint alone_len[1];
  generate(&o, &c, 1, prompt, one_len, MAX_NEW, &alone[0][0], alone_len);
  g_assert_cmpint(alone_len[0], ==, out_lens[0]);
  g_assert_cmpmem(alone[0], sizeof alone[0], out[0], sizeof out[0]);

  /* threads 1 and 2 */
  const gint saved = qkv_get_num_threads();
  qkv_set_num_threads(1);
  generate(&o, &c, 3, prompt, lens, MAX_NEW, &again[0][0], again_lens);
  qkv_set_num_threads(saved);
  g_assert_cmpmem(again, sizeof again, out, sizeof out);
  g_assert_cmpmem(again_lens, sizeof again_lens, out_lens, sizeof out_lens);
}

/* The callback's error is the call's; a callback that fails without one
 * gets an error naming the step; a NaN in a row that draws is refused, in
 * a row still inside its prompt ignored. */
static void
test_generate_callback_errors(void)
{
  g_autoptr(GError) error = NULL;
  Chain c;
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = V;
  o.eos = EOS;
  const gint32 prompt[] = {6, 3, 4, 5};
  const gint lens[] = {1, 3};
  gint32 out[2][6];
  gint out_lens[2];
  log_counting = TRUE;
  log_count = 0;

  chain_init_greedy(&c);
  c.fail_step = 2;
  g_assert_false(
      qkv_generate(&o, 2, prompt, lens, 6, chain_step, &c, &out[0][0], out_lens, &error));
  g_assert_error(error, TEST_ERROR, 7);
  g_assert_cmpint(c.calls, ==, 3);
  g_clear_error(&error);

  chain_init_greedy(&c);
  c.fail_step = 1;
  c.fail_without_error = TRUE;
  g_assert_false(
      qkv_generate(&o, 2, prompt, lens, 6, chain_step, &c, &out[0][0], out_lens, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "step 1"));
  g_clear_error(&error);

  chain_init_greedy(&c);
  c.nan_step = 2;
  c.nan_row = 1;
  g_assert_false(
      qkv_generate(&o, 2, prompt, lens, 6, chain_step, &c, &out[0][0], out_lens, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "step 2: row 1: the logit of token 3 is nan"));
  g_clear_error(&error);

  chain_init_greedy(&c);
  c.nan_step = 1;
  c.nan_row = 1;
  g_assert_true(qkv_generate(&o, 2, prompt, lens, 6, chain_step, &c, &out[0][0], out_lens, &error));
  g_assert_no_error(error);
  log_counting = FALSE;
  g_assert_cmpuint(log_count, ==, 0);
}

/* Through a real step decoder: greedy qkv_generate() with bos, eos and empty
 * prompts is beam search with beam size 1 on a small Transformer (random
 * weights), token for token; and sampled generation repeats itself. */
static void
test_generate_transformer(void)
{
  static const QkvTransformerConfig cfg = {.src_vocab = 15,
                                           .tgt_vocab = 17,
                                           .num_hiddens = 32,
                                           .ffn_hiddens = 48,
                                           .num_heads = 4,
                                           .num_layers = 2};
  enum { B = 3, S = 6, L = 9 };
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  /* the training graph, built once to create the parameters */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape bs = QKV_SHAPE(B, S), b1 = QKV_SHAPE(B), bl = QKV_SHAPE(B, L);
  QkvValue *src_v = qkv_test_input(g, "src", QKV_I32, bs);
  QkvValue *valid_v = qkv_test_input(g, "src_valid", QKV_I32, b1);
  QkvValue *dec_v = qkv_test_input(g, "dec_in", QKV_I32, bl);
  QkvBuilder b = {.graph = g, .params = params, .seed = 4, .xavier_linear = TRUE};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, src_v, valid_v, &error);
  g_assert_nonnull(qkv_build_transformer_decoder(&b, &cfg, dec_v, enc, valid_v, NULL, &error));
  g_assert_no_error(error);
  g_autoptr(QkvStepDecoder) dec =
      qkv_step_decoder_new_transformer(params, &cfg, B, S, L, 0, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) src = qkv_test_randint(&bs, 8, 3, 15);
  const gint32 valid_lens[B] = {S, 4, 2};
  g_autoptr(QkvTensor) valid = qkv_tensor_new_i32(&b1, valid_lens);

  QkvBeamOptions beam = qkv_beam_options_default();
  beam.beam_size = 1;
  beam.max_len = L;
  beam.vocab = cfg.tgt_vocab;
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = cfg.tgt_vocab;
  o.bos = beam.bos;
  o.sample.temperature = 0.0;
  const gint empty[B] = {0, 0, 0};
  gint32 want[B * L], got[B * L], again[B * L];
  gint want_lens[B], got_lens[B], again_lens[B];
  /* the random model rarely draws <eos> 2; a second round makes the 4th
   * token of sentence 0 the eos, so that rows stop early */
  for (gint round = 0; round < 2; round++) {
    if (round == 1)
      beam.eos = want[3];
    o.eos = beam.eos;
    g_assert_true(
        qkv_step_decoder_translate(dec, src, valid, &beam, want, want_lens, NULL, &error));
    g_assert_no_error(error);
    g_assert_true(qkv_step_decoder_start(dec, src, valid, 1, &error));
    g_assert_true(
        qkv_generate(&o, B, NULL, empty, L, qkv_step_decoder_step, dec, got, got_lens, &error));
    g_assert_no_error(error);
    g_test_message("eos %d: lengths %d %d %d of %d", o.eos, want_lens[0], want_lens[1],
                   want_lens[2], L);
    g_assert_cmpmem(got, sizeof got, want, sizeof want);
    g_assert_cmpmem(got_lens, sizeof got_lens, want_lens, sizeof want_lens);
  }
  g_assert_cmpint(want_lens[0], <=, 3);

  o.sample.temperature = 1.5;
  o.sample.top_k = 8;
  o.sample.seed = 7;
  for (gint run = 0; run < 2; run++) {
    g_assert_true(qkv_step_decoder_start(dec, src, valid, 1, &error));
    g_assert_true(qkv_generate(&o, B, NULL, empty, L, qkv_step_decoder_step, dec,
                               run == 0 ? got : again, run == 0 ? got_lens : again_lens, &error));
    g_assert_no_error(error);
  }
  g_assert_cmpmem(got, sizeof got, again, sizeof again);
  g_assert_cmpmem(got_lens, sizeof got_lens, again_lens, sizeof again_lens);
}

/* qkv_generate must refuse the call before any step with
 * QKV_ERROR_INVALID_ARGUMENT naming what. */
static void
assert_generate_refused(const QkvGenerateOptions *o, gint batch, const gint32 *prompt,
                        const gint *lens, gint max_new, const gchar *what)
{
  g_autoptr(GError) error = NULL;
  Chain c;
  chain_init_greedy(&c);
  gint32 out[8];
  gint out_lens[2];
  g_assert_false(
      qkv_generate(o, batch, prompt, lens, max_new, chain_step, &c, out, out_lens, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  if (strstr(error->message, what) == NULL)
    g_error("'%s' does not name '%s'", error->message, what);
  g_test_message("%s", error->message);
  g_assert_cmpint(c.calls, ==, 0);
}

static void
test_generate_bad_arguments(void)
{
  const gint32 prompt[] = {3, 4};
  const gint lens[] = {1, 1};
  log_counting = TRUE;
  log_count = 0;
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = V;
  assert_generate_refused(&o, 0, prompt, lens, 4, "batch");
  assert_generate_refused(&o, 2, prompt, lens, 0, "max_new_tokens");
  const gint32 bad_ids[] = {-2, V, 1000};
  for (gsize i = 0; i < G_N_ELEMENTS(bad_ids); i++) {
    QkvGenerateOptions b = o;
    b.bos = bad_ids[i];
    assert_generate_refused(&b, 2, prompt, lens, 4, "bos");
    b = o;
    b.eos = bad_ids[i];
    assert_generate_refused(&b, 2, prompt, lens, 4, "eos");
  }
  QkvGenerateOptions b = o;
  b.vocab = 0;
  assert_generate_refused(&b, 2, prompt, lens, 4, "vocab");
  b = o;
  b.sample.temperature = -1.0;
  assert_generate_refused(&b, 2, prompt, lens, 4, "temperature");
  b = o;
  b.sample.top_p = 2.0;
  assert_generate_refused(&b, 2, prompt, lens, 4, "top_p");

  const gint32 bad_prompt[] = {3, V};
  assert_generate_refused(&o, 2, bad_prompt, lens, 4, "row 1: prompt token 0 is 7");
  const gint negative[] = {1, -1};
  assert_generate_refused(&o, 2, prompt, negative, 4, "row 1: the prompt length is -1");
  const gint empty[] = {0, 2};
  assert_generate_refused(&o, 2, prompt, empty, 4, "row 0: the prompt length is 0");
  assert_generate_refused(&o, 2, NULL, lens, 4, "row 0: a prompt of 1 tokens but prompt is NULL");
  const gint long_prompt[] = {G_MAXINT - 2, 1};
  assert_generate_refused(&o, 2, prompt, long_prompt, 4, "steps");
  log_counting = FALSE;
  g_assert_cmpuint(log_count, ==, 0);
}

/* Scores that cannot be had (2^16 rows of 2^31 - 1: half a petabyte) are
 * QKV_ERROR_MEMORY before any step. AddressSanitizer aborts on such a
 * request instead of failing it, so the test does not run under it. */
static void
test_generate_huge(void)
{
#if defined(__SANITIZE_ADDRESS__)
  g_test_skip("AddressSanitizer aborts on allocations this large");
#else
  g_autoptr(GError) error = NULL;
  QkvGenerateOptions o = qkv_generate_options_default();
  o.vocab = G_MAXINT32;
  o.bos = BOS;
  const gint batch = 1 << 16;
  g_autofree gint *lens = g_new0(gint, batch);
  g_autofree gint32 *out = g_new(gint32, batch);
  g_autofree gint *out_lens = g_new(gint, batch);
  Chain c;
  chain_init_greedy(&c);
  g_assert_false(qkv_generate(&o, batch, NULL, lens, 1, chain_step, &c, out, out_lens, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_MEMORY);
  g_assert_nonnull(strstr(error->message, "qkv_generate"));
  g_assert_cmpint(c.calls, ==, 0);
#endif
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_log_set_writer_func(count_log_writer, NULL, NULL);
  qkv_init();
  g_test_add_func("/sample/greedy", test_greedy);
  g_test_add_func("/sample/temperature", test_temperature);
  g_test_add_func("/sample/top-k", test_top_k);
  g_test_add_func("/sample/top-k-random-rows", test_top_k_random_rows);
  g_test_add_func("/sample/top-p", test_top_p);
  g_test_add_func("/sample/top-k-then-top-p", test_top_k_then_top_p);
  g_test_add_func("/sample/top-p-random-rows", test_top_p_random_rows);
  g_test_add_func("/sample/seeds", test_seeds);
  g_test_add_func("/sample/threads", test_threads);
  g_test_add_func("/sample/rows-independent", test_rows_independent);
  g_test_add_func("/sample/bad-arguments", test_sample_bad_arguments);
  g_test_add_func("/generate/greedy", test_generate_greedy);
  g_test_add_func("/generate/bos-and-no-eos", test_generate_bos_and_no_eos);
  g_test_add_func("/generate/sampled", test_generate_sampled);
  g_test_add_func("/generate/callback-errors", test_generate_callback_errors);
  g_test_add_func("/generate/transformer", test_generate_transformer);
  g_test_add_func("/generate/bad-arguments", test_generate_bad_arguments);
  g_test_add_func("/generate/huge", test_generate_huge);
  return g_test_run();
}
