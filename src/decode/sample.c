/* sample.c: drawing tokens from logits, and the generation loop around it
 * (qkv-decode.h).
 *
 * Why it is built the way it is:
 *  - a token's weight exp((x - max) / T) is computed in double from the
 *    float logit whenever it is needed rather than stored, so nothing the
 *    size of the vocabulary is kept but the token ids that top-k and top-p
 *    rank (and none at all for plain sampling);
 *  - a draw walks the kept tokens adding their weights in the order their
 *    total was added, so the running sum ends at that total exactly and a
 *    target u · total with u < 1 always falls on a token;
 *  - the uniform joins two 24-bit counter-based draws into 48 bits: tokens
 *    far less likely than 2^-24 are still drawn at their rate. */
#include <math.h>
#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>
#include "error-private.h"

/* The node ids the sampler's keys are made with: its draws stay apart from
 * dropout's (whose node ids are small) under the same seed and step. */
#define SAMPLE_STREAM_HIGH 0x73616d70u
#define SAMPLE_STREAM_LOW 0x6c6f7731u

QkvSampleOptions
qkv_sample_options_default(void)
{
  return (QkvSampleOptions){.temperature = 1.0, .top_p = 1.0};
}

QkvGenerateOptions
qkv_generate_options_default(void)
{
  return (QkvGenerateOptions){.sample = qkv_sample_options_default(), .bos = -1, .eos = -1};
}

static gboolean
check_sample_options(const QkvSampleOptions *o, gint64 vocab, const gchar *func, GError **error)
{
  const gchar *bad = NULL;
  if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
    bad = "temperature must be finite and at least 0";
  else if (o->top_k < 0)
    bad = "top_k must be at least 0";
  else if (!(o->top_p > 0.0 && o->top_p <= 1.0))
    bad = "top_p must be in (0, 1]";
  else if (vocab < 1 || vocab > G_MAXINT32)
    bad = "vocab must be in [1, 2^31)";
  if (bad != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: %s", func, bad);
    return FALSE;
  }
  return TRUE;
}

/* Whether drawing needs the token ids scratch (vocab of them). */
static gboolean
needs_scratch(const QkvSampleOptions *o)
{
  return o->temperature > 0.0 && (o->top_k > 0 || o->top_p < 1.0);
}

/* Why row x cannot be drawn from (with the bad token in *bad, -1 for the
 * whole row), or NULL when it can. */
static const gchar *
row_problem(const float *x, gint64 vocab, gint64 *bad)
{
  gboolean any = FALSE;
  for (gint64 v = 0; v < vocab; v++) {
    if (isnan(x[v]) || x[v] == INFINITY) {
      *bad = v;
      return isnan(x[v]) ? "nan" : "+inf";
    }
    any = any || x[v] > -INFINITY;
  }
  *bad = -1;
  return any ? NULL : "-inf";
}

/* The error for a row that row_problem() refused; where says which call and
 * row (and step). */
static void
set_row_error(GError **error, const gchar *where, const gchar *problem, gint64 bad)
{
  if (bad < 0)
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: every logit is -inf (no token can be drawn)", where);
  else
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: the logit of token %" G_GINT64_FORMAT " is %s (logits must be finite or -inf)",
                where, bad, problem);
}

/* A uniform double in [0, 1 - 2^-48] for (seed, step, id). */
static double
sample_uniform(guint64 seed, guint64 step, guint64 id)
{
  guint64 high = qkv_random_key(seed, step, SAMPLE_STREAM_HIGH);
  guint64 low = qkv_random_key(seed, step, SAMPLE_STREAM_LOW);
  return (double)qkv_random_uniform(high, id) + (double)qkv_random_uniform(low, id) / 16777216.0;
}

/* One row being drawn from: its logits, their maximum and the temperature. */
typedef struct {
  const float *x;
  gint64 vocab;
  double max, temperature;
} Row;

static inline double
row_weight(const Row *r, gint64 v)
{
  return exp(((double)r->x[v] - r->max) / r->temperature);
}

/* Whether token a ranks before token b: a larger logit, then a lower id. */
static inline gboolean
ranks_before(const float *x, gint32 a, gint32 b)
{
  return x[a] > x[b] || (x[a] == x[b] && a < b);
}

/* Restore the heap heap[0..n) below i, a heap whose every parent ranks after
 * its children: the root is the last-ranked token. */
static void
sift_down(const float *x, gint32 *heap, gsize n, gsize i)
{
  for (;;) {
    gsize c = 2 * i + 1;
    if (c >= n)
      return;
    if (c + 1 < n && ranks_before(x, heap[c], heap[c + 1]))
      c++;
    if (!ranks_before(x, heap[i], heap[c]))
      return;
    gint32 t = heap[i];
    heap[i] = heap[c];
    heap[c] = t;
    i = c;
  }
}

/* Sort ids best first (heap sort: a deterministic order with no allocation
 * and no worst case worse than n log n). */
static void
sort_best_first(const float *x, gint32 *ids, gsize n)
{
  for (gsize i = n / 2; i-- > 0;)
    sift_down(x, ids, n, i);
  for (gsize end = n; end > 1; end--) {
    gint32 t = ids[0];
    ids[0] = ids[end - 1];
    ids[end - 1] = t;
    sift_down(x, ids, end - 1, 0);
  }
}

/* The logit of the k-th ranked token among the n_finite above -inf (k <
 * n_finite), keeping the k best seen in heap. */
static float
kth_logit(const float *x, gint64 vocab, gsize k, gint32 *heap)
{
  gsize n = 0;
  for (gint64 v = 0; v < vocab; v++) {
    if (x[v] == -INFINITY)
      continue;
    if (n < k) {
      heap[n++] = (gint32)v;
      if (n == k)
        for (gsize i = k / 2; i-- > 0;)
          sift_down(x, heap, k, i);
    } else if (ranks_before(x, (gint32)v, heap[0])) {
      heap[0] = (gint32)v;
      sift_down(x, heap, k, 0);
    }
  }
  return x[heap[0]];
}

/* The ids of the tokens whose logit is at least least and above -inf, in id
 * order; returns their count. */
static gsize
collect_at_least(const float *x, gint64 vocab, float least, gint32 *ids)
{
  gsize n = 0;
  for (gint64 v = 0; v < vocab; v++)
    if (x[v] >= least && x[v] > -INFINITY)
      ids[n++] = (gint32)v;
  return n;
}

/* Narrow ids[0..n) to top-p's nucleus, best first; returns its size. */
static gsize
nucleus(const Row *r, gint32 *ids, gsize n, double top_p)
{
  double total = 0.0;
  for (gsize i = 0; i < n; i++)
    total += row_weight(r, ids[i]);
  /* A token that weighs at most (1 - p) · total / 2n has at least
   * (1 + p) / 2 · total > p · total ranked before it (none of the at most n
   * tokens from it on weighs more), so it is out: dropping such tokens
   * before sorting leaves what a long tail costs at one pass. The best
   * token weighs 1 and always stays. */
  const double cut = (1.0 - top_p) * total / (2.0 * (double)n);
  gsize m = 0;
  for (gsize i = 0; i < n; i++)
    if (row_weight(r, ids[i]) > cut)
      ids[m++] = ids[i];
  sort_best_first(r->x, ids, m);
  const double goal = top_p * total;
  double before = 0.0;
  gsize kept = 0;
  while (kept < m && before < goal)
    before += row_weight(r, ids[kept++]);
  return kept;
}

/* The token that u falls on among ids[0..n) (every token 0 .. n - 1 when ids
 * is NULL), each as wide as its weight. */
static gint32
draw(const Row *r, const gint32 *ids, gsize n, double u)
{
  double total = 0.0;
  for (gsize i = 0; i < n; i++)
    total += row_weight(r, ids != NULL ? ids[i] : (gint32)i);
  const double target = u * total;
  double sum = 0.0;
  for (gsize i = 0; i < n; i++) {
    gint32 v = ids != NULL ? ids[i] : (gint32)i;
    sum += row_weight(r, v);
    if (sum > target)
      return v;
  }
  /* not reached: the sum ends at total > target */
  return ids != NULL ? ids[0] : 0;
}

/* The token for one row that row_problem() accepted. scratch holds vocab ids
 * when needs_scratch(). */
static gint32
sample_row(const QkvSampleOptions *o, const float *x, gint64 vocab, guint64 step, guint64 id,
           gint32 *scratch)
{
  Row r = {.x = x, .vocab = vocab, .max = -INFINITY, .temperature = o->temperature};
  gint32 best = 0;
  gint64 n_finite = 0;
  for (gint64 v = 0; v < vocab; v++) {
    if (x[v] > r.max) {
      r.max = x[v];
      best = (gint32)v;
    }
    n_finite += x[v] > -INFINITY;
  }
  if (o->temperature == 0.0)
    return best;
  const double u = sample_uniform(o->seed, step, id);
  const gint32 *ids = NULL;
  gsize n = (gsize)vocab;
  if (o->top_k > 0 && o->top_k < n_finite) {
    float least = kth_logit(x, vocab, (gsize)o->top_k, scratch);
    n = collect_at_least(x, vocab, least, scratch);
    ids = scratch;
  }
  if (o->top_p < 1.0) {
    if (ids == NULL)
      n = collect_at_least(x, vocab, -INFINITY, scratch);
    n = nucleus(&r, scratch, n, o->top_p);
    ids = scratch;
  }
  return draw(&r, ids, n, u);
}

gboolean
qkv_sample_logits(const QkvSampleOptions *options, const float *logits, gint n_rows, gint64 vocab,
                  guint64 step, const guint64 *row_ids, gint32 *tokens_out, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(options != NULL, FALSE);
  if (!check_sample_options(options, vocab, "qkv_sample_logits", error))
    return FALSE;
  if (n_rows < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_sample_logits: n_rows must be at least 0");
    return FALSE;
  }
  if (n_rows == 0)
    return TRUE;
  g_return_val_if_fail(logits != NULL && tokens_out != NULL, FALSE);
  for (gint r = 0; r < n_rows; r++) {
    gint64 bad;
    const gchar *problem = row_problem(logits + (gsize)r * (gsize)vocab, vocab, &bad);
    if (problem != NULL) {
      g_autofree gchar *where = g_strdup_printf("qkv_sample_logits: row %d", r);
      set_row_error(error, where, problem, bad);
      return FALSE;
    }
  }
  gint32 *scratch = NULL;
  if (needs_scratch(options)) {
    scratch = g_try_new(gint32, (gsize)vocab);
    if (scratch == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                  "qkv_sample_logits: no memory for %" G_GINT64_FORMAT " token ids", vocab);
      return FALSE;
    }
  }
  for (gint r = 0; r < n_rows; r++)
    tokens_out[r] = sample_row(options, logits + (gsize)r * (gsize)vocab, vocab, step,
                               row_ids != NULL ? row_ids[r] : (guint64)r, scratch);
  g_free(scratch);
  return TRUE;
}

/* ---- generation ------------------------------------------------------------ */

/* The loop's state, allocated once. */
typedef struct {
  gint batch;
  gint64 vocab;
  float *logits;   /* batch × vocab */
  gint32 *scratch; /* vocab, or NULL when needs_scratch() is not */
  gint32 *tokens;  /* batch: what each row feeds next */
  gint32 *parents; /* batch: each row its own */
  gsize *start;    /* batch: where each row's prompt begins in prompt */
  gint *context;   /* batch: tokens fed before the first draw (bos and prompt) */
  gint *n_drawn;   /* batch: tokens drawn, eos included */
  gboolean *done;  /* batch */
} Gen;

static void
gen_free(Gen *g)
{
  g_free(g->logits);
  g_free(g->scratch);
  g_free(g->tokens);
  g_free(g->parents);
  g_free(g->start);
  g_free(g->context);
  g_free(g->n_drawn);
  g_free(g->done);
}

static gboolean
gen_alloc(Gen *g, const QkvGenerateOptions *o, GError **error)
{
  const gsize batch = (gsize)g->batch, vocab = (gsize)g->vocab, n_scores = batch * vocab;
  g->logits = g_try_new(float, n_scores);
  g->scratch = needs_scratch(&o->sample) ? g_try_new(gint32, vocab) : NULL;
  g->tokens = g_try_new0(gint32, batch);
  g->parents = g_try_new(gint32, batch);
  g->start = g_try_new(gsize, batch);
  g->context = g_try_new(gint, batch);
  g->n_drawn = g_try_new0(gint, batch);
  g->done = g_try_new0(gboolean, batch);
  if (g->logits != NULL && (g->scratch != NULL || !needs_scratch(&o->sample)) &&
      g->tokens != NULL && g->parents != NULL && g->start != NULL && g->context != NULL &&
      g->n_drawn != NULL && g->done != NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
              "qkv_generate: no memory for %d rows of %" G_GINT64_FORMAT " scores", g->batch,
              g->vocab);
  return FALSE;
}

/* Everything qkv_generate() can check before the first step. */
static gboolean
check_generate(const QkvGenerateOptions *o, gint batch, const gint32 *prompt,
               const gint *prompt_lens, gint max_new_tokens, GError **error)
{
  if (!check_sample_options(&o->sample, o->vocab, "qkv_generate", error))
    return FALSE;
  const gchar *bad = NULL;
  if (o->bos < -1 || o->bos >= o->vocab)
    bad = "bos must be -1 or a token id in [0, vocab)";
  else if (o->eos < -1 || o->eos >= o->vocab)
    bad = "eos must be -1 or a token id in [0, vocab)";
  else if (batch < 1)
    bad = "batch must be at least 1";
  else if (max_new_tokens < 1)
    bad = "max_new_tokens must be at least 1";
  if (bad != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "qkv_generate: %s", bad);
    return FALSE;
  }
  gsize at = 0;
  for (gint b = 0; b < batch; b++) {
    const gint len = prompt_lens[b];
    if (len > 0 && prompt == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "qkv_generate: row %d: a prompt of %d tokens but prompt is NULL", b, len);
      return FALSE;
    }
    if (len < 0 || (len == 0 && o->bos < 0)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "qkv_generate: row %d: the prompt length is %d (it must be at least %d)", b, len,
                  o->bos < 0 ? 1 : 0);
      return FALSE;
    }
    /* the last step, at most context length + max_new_tokens - 2, is below
     * G_MAXINT so that the step count after it is a gint too */
    if ((gint64)len + (o->bos >= 0) + max_new_tokens - 2 >= G_MAXINT) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "qkv_generate: row %d: the prompt of %d tokens and max_new_tokens %d need more "
                  "steps than a gint counts",
                  b, len, max_new_tokens);
      return FALSE;
    }
    for (gint i = 0; i < len; i++, at++)
      if (prompt[at] < 0 || prompt[at] >= o->vocab) {
        g_set_error(
            error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
            "qkv_generate: row %d: prompt token %d is %d, not a token id in [0, %" G_GINT64_FORMAT
            ")",
            b, i, prompt[at], o->vocab);
        return FALSE;
      }
  }
  return TRUE;
}

/* Draw the next token of every row that draws at step t (those past their
 * context's last token and not done), and set what each feeds next. */
static gboolean
gen_draw(Gen *g, const QkvGenerateOptions *o, gint t, gint max_new_tokens, gint32 *out_tokens,
         gint *out_lens, gint *n_live, GError **error)
{
  for (gint b = 0; b < g->batch; b++) {
    if (g->done[b] || t < g->context[b] - 1)
      continue;
    const float *x = g->logits + (gsize)b * (gsize)g->vocab;
    gint64 bad;
    const gchar *problem = row_problem(x, g->vocab, &bad);
    if (problem != NULL) {
      g_autofree gchar *where = g_strdup_printf("qkv_generate: step %d: row %d", t, b);
      set_row_error(error, where, problem, bad);
      return FALSE;
    }
    gint32 token =
        sample_row(&o->sample, x, g->vocab, (guint64)g->n_drawn[b], (guint64)b, g->scratch);
    g->n_drawn[b]++;
    if (token != o->eos)
      out_tokens[(gsize)b * (gsize)max_new_tokens + (gsize)out_lens[b]++] = token;
    if (token == o->eos || g->n_drawn[b] == max_new_tokens) {
      g->done[b] = TRUE;
      (*n_live)--;
    }
    g->tokens[b] = g->done[b] && o->eos >= 0 ? o->eos : token;
  }
  return TRUE;
}

gboolean
qkv_generate(const QkvGenerateOptions *options, gint batch, const gint32 *prompt,
             const gint *prompt_lens, gint max_new_tokens, QkvDecodeStepFunc step,
             gpointer user_data, gint32 *out_tokens, gint *out_lens, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(options != NULL && step != NULL, FALSE);
  g_return_val_if_fail(out_tokens != NULL && out_lens != NULL, FALSE);
  g_return_val_if_fail(batch < 1 || prompt_lens != NULL, FALSE);
  if (!check_generate(options, batch, prompt, prompt_lens, max_new_tokens, error))
    return FALSE;
  Gen g = {.batch = batch, .vocab = options->vocab};
  if (!gen_alloc(&g, options, error)) {
    gen_free(&g);
    return FALSE;
  }
  const gint has_bos = options->bos >= 0;
  gsize at = 0;
  for (gint b = 0; b < batch; b++) {
    g.parents[b] = b;
    g.start[b] = at;
    at += (gsize)prompt_lens[b];
    g.context[b] = prompt_lens[b] + has_bos;
    out_lens[b] = 0;
  }

  gboolean ok = TRUE;
  gint n_live = batch;
  for (gint t = 0; n_live > 0; t++) {
    for (gint b = 0; b < batch; b++)
      if (t < g.context[b])
        g.tokens[b] = has_bos && t == 0 ? options->bos : prompt[g.start[b] + (gsize)(t - has_bos)];
    GError *step_error = NULL;
    if (!step(user_data, t, g.tokens, g.parents, batch, g.logits, &step_error)) {
      if (step_error == NULL)
        g_set_error(&step_error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "qkv_generate: step %d: the step callback returned FALSE without an error", t);
      g_propagate_error(error, step_error);
      ok = FALSE;
      break;
    }
    if (!gen_draw(&g, options, t, max_new_tokens, out_tokens, out_lens, &n_live, error)) {
      ok = FALSE;
      break;
    }
  }
  if (ok)
    for (gint b = 0; b < batch; b++)
      for (gint i = out_lens[b]; i < max_new_tokens; i++)
        out_tokens[(gsize)b * (gsize)max_new_tokens + (gsize)i] = options->eos;
  gen_free(&g);
  return ok;
}
