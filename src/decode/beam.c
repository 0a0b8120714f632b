/* beam.c: beam search over a step callback (qkv-decode.h).
 *
 * Scores are kept in double: the log-softmax of a float row is taken in
 * double so that two different logits never round to the same
 * log-probability, and beam size 1 picks exactly the argmax of the logits
 * (the lowest id on a real tie), as a greedy loop over the raw logits does. */
#include <math.h>
#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>
#include <string.h>
#include "error-private.h"

QkvBeamOptions
qkv_beam_options_default(void)
{
  return (QkvBeamOptions){.beam_size = 4, .length_penalty = 0.6, .bos = 1, .eos = 2};
}

double
qkv_beam_length_penalty(gint length, double alpha)
{
  return alpha == 0.0 ? 1.0 : pow((5.0 + length) / 6.0, alpha);
}

/* One candidate extension: row's hypothesis followed by token. */
typedef struct {
  double score;
  gint row;
  gint32 token;
} Candidate;

/* Whether a ranks before b: higher score, then lower row, then lower token. */
static gboolean
candidate_before(const Candidate *a, const Candidate *b)
{
  if (a->score != b->score)
    return a->score > b->score;
  if (a->row != b->row)
    return a->row < b->row;
  return a->token < b->token;
}

/* Insert c into best (sorted, n of at most cap kept). */
static void
candidate_offer(Candidate *best, gint *n, gint cap, const Candidate *c)
{
  if (*n == cap && !candidate_before(c, &best[cap - 1]))
    return;
  gint i = *n < cap ? (*n)++ : cap - 1;
  while (i > 0 && candidate_before(c, &best[i - 1])) {
    best[i] = best[i - 1];
    i--;
  }
  best[i] = *c;
}

/* The search's state, allocated once. */
typedef struct {
  gint batch, k, rows, max_len;
  gint64 vocab;
  float *logits;      /* rows × vocab */
  double *logp;       /* vocab, one row's log-softmax */
  double *live;       /* rows: total log P of each live hypothesis, -inf when none */
  gint32 *hist;       /* rows × max_len: tokens of each live hypothesis */
  gint32 *next_hist;  /* the same, being built */
  double *next_live;  /* rows */
  gint32 *tokens;     /* rows: what each row feeds next */
  gint32 *parents;    /* rows */
  Candidate *cands;   /* 2k */
  gint *n_done;       /* batch: ended hypotheses */
  double *best_score; /* batch: best ended score, -inf when none */
  gint *best_len;     /* batch */
  gint32 *best_hist;  /* batch × max_len */
} Beam;

static void
beam_free(Beam *s)
{
  g_free(s->logits);
  g_free(s->logp);
  g_free(s->live);
  g_free(s->hist);
  g_free(s->next_hist);
  g_free(s->next_live);
  g_free(s->tokens);
  g_free(s->parents);
  g_free(s->cands);
  g_free(s->n_done);
  g_free(s->best_score);
  g_free(s->best_len);
  g_free(s->best_hist);
}

/* Every buffer of the search, sized from the caller's batch, beam_size,
 * max_len and vocab: g_try_new returns NULL instead of aborting when the
 * memory cannot be had. The element counts fit a gsize (check_options keeps
 * rows below 2^29, vocab and max_len below 2^31); g_try_new checks the byte
 * sizes. */
static gboolean
beam_alloc(Beam *s, GError **error)
{
  const gsize rows = (gsize)s->rows, batch = (gsize)s->batch, vocab = (gsize)s->vocab;
  const gsize max_len = (gsize)s->max_len, n_scores = rows * vocab;
  s->logits = g_try_new(float, n_scores);
  s->logp = g_try_new(double, vocab);
  s->live = g_try_new(double, rows);
  s->hist = g_try_new0(gint32, rows * max_len);
  s->next_hist = g_try_new0(gint32, rows * max_len);
  s->next_live = g_try_new(double, rows);
  s->tokens = g_try_new(gint32, rows);
  s->parents = g_try_new(gint32, rows);
  s->cands = g_try_new(Candidate, 2 * (gsize)s->k);
  s->n_done = g_try_new0(gint, batch);
  s->best_score = g_try_new(double, batch);
  s->best_len = g_try_new0(gint, batch);
  s->best_hist = g_try_new0(gint32, batch * max_len);
  if (s->logits != NULL && s->logp != NULL && s->live != NULL && s->hist != NULL &&
      s->next_hist != NULL && s->next_live != NULL && s->tokens != NULL && s->parents != NULL &&
      s->cands != NULL && s->n_done != NULL && s->best_score != NULL && s->best_len != NULL &&
      s->best_hist != NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
              "qkv_beam_search: no memory for %d rows (batch %d × beam_size %d) of %" G_GSIZE_FORMAT
              " scores and %" G_GSIZE_FORMAT " tokens each",
              s->rows, s->batch, s->k, vocab, max_len);
  return FALSE;
}

/* An ended hypothesis for sentence s: tokens hist[0..len) (without <eos>),
 * total log-probability logp and |Y| = y_len for the penalty. */
static void
beam_end(Beam *s, gint sentence, const gint32 *hist, gint len, double logp, gint y_len,
         double alpha)
{
  double score = logp / qkv_beam_length_penalty(y_len, alpha);
  s->n_done[sentence]++;
  if (score > s->best_score[sentence]) {
    s->best_score[sentence] = score;
    s->best_len[sentence] = len;
    memcpy(s->best_hist + (gsize)sentence * s->max_len, hist, (gsize)len * sizeof(gint32));
  }
}

/* log-softmax of a float row, in double; a row of -inf only (no token
 * possible) stays -inf rather than becoming NaN. */
static void
log_softmax_row(const float *x, gint64 n, double *out)
{
  double m = -INFINITY;
  for (gint64 v = 0; v < n; v++)
    m = MAX(m, (double)x[v]);
  if (m == -INFINITY) {
    for (gint64 v = 0; v < n; v++)
      out[v] = -INFINITY;
    return;
  }
  double sum = 0;
  for (gint64 v = 0; v < n; v++)
    sum += exp((double)x[v] - m);
  double lse = m + log(sum);
  for (gint64 v = 0; v < n; v++)
    out[v] = (double)x[v] - lse;
}

static gboolean
check_options(const QkvBeamOptions *o, gint batch, GError **error)
{
  const gchar *bad = NULL;
  if (o->beam_size < 1)
    bad = "beam_size must be at least 1";
  else if (!(o->length_penalty >= 0.0) || !isfinite(o->length_penalty))
    bad = "length_penalty must be finite and at least 0";
  else if (o->max_len < 1)
    bad = "max_len must be at least 1";
  else if (o->vocab < 1 || o->vocab > G_MAXINT32)
    bad = "vocab must be in [1, 2^31)";
  else if (o->bos < 0 || o->bos >= o->vocab)
    bad = "bos must be a token id in [0, vocab)";
  else if (o->eos < 0 || o->eos >= o->vocab)
    bad = "eos must be a token id in [0, vocab)";
  else if (batch < 1)
    bad = "batch must be at least 1";
  else if ((gint64)batch * o->beam_size > G_MAXINT32 / 4)
    bad = "batch × beam_size is too large";
  if (bad != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "qkv_beam_search: %s", bad);
    return FALSE;
  }
  return TRUE;
}

/* The scores the callback wrote at step t for the live hypotheses of the
 * sentences not yet done (the other rows are not read): each must be finite
 * or -inf, and each such sentence needs a hypothesis with a token that is
 * not -inf. A row of -inf only ends just that row's hypothesis. */
static gboolean
check_scores(const Beam *s, gint t, GError **error)
{
  for (gint b = 0; b < s->batch; b++) {
    if (s->n_done[b] >= s->k)
      continue;
    gint live = 0, dead = 0;
    for (gint row = b * s->k; row < (b + 1) * s->k; row++) {
      if (s->live[row] == -INFINITY)
        continue;
      live++;
      const float *x = s->logits + (gsize)row * s->vocab;
      gboolean any = FALSE;
      for (gint64 v = 0; v < s->vocab; v++) {
        if (isnan(x[v]) || x[v] == INFINITY) {
          g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                      "qkv_beam_search: step %d: the callback's score for token %" G_GINT64_FORMAT
                      " of row %d is %s (scores must be finite or -inf)",
                      t, v, row, isnan(x[v]) ? "nan" : "+inf");
          return FALSE;
        }
        any = any || x[v] > -INFINITY;
      }
      dead += !any;
    }
    if (live > 0 && dead == live) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "qkv_beam_search: step %d: every score of sentence %d's live hypotheses is -inf "
                  "(no token can follow)",
                  t, b);
      return FALSE;
    }
  }
  return TRUE;
}

/* One step for sentence s: extend its live hypotheses from s->logits. */
static void
beam_extend(Beam *s, gint sentence, gint t, double alpha, gint32 eos)
{
  const gint k = s->k, first = sentence * k;
  gint n = 0;
  for (gint j = 0; j < k; j++) {
    gint row = first + j;
    if (s->live[row] == -INFINITY)
      continue;
    log_softmax_row(s->logits + (gsize)row * s->vocab, s->vocab, s->logp);
    for (gint64 v = 0; v < s->vocab; v++) {
      Candidate c = {s->live[row] + s->logp[v], row, (gint32)v};
      candidate_offer(s->cands, &n, 2 * k, &c);
    }
  }
  gint kept = 0;
  for (gint i = 0; i < n && kept < k; i++) {
    const Candidate *c = &s->cands[i];
    const gint32 *h = s->hist + (gsize)c->row * s->max_len;
    if (c->token == eos) {
      /* only an <eos> that ranks among the k best ends a hypothesis: with
       * k = 1 this is the greedy rule "stop when the argmax is <eos>" */
      if (i < k && c->score > -INFINITY)
        beam_end(s, sentence, h, t, c->score, t + 1, alpha);
      continue;
    }
    if (c->score == -INFINITY)
      break;
    gint row = first + kept++;
    gint32 *nh = s->next_hist + (gsize)row * s->max_len;
    memcpy(nh, h, (gsize)t * sizeof(gint32));
    nh[t] = c->token;
    s->next_live[row] = c->score;
    s->tokens[row] = c->token;
    s->parents[row] = c->row;
  }
  for (gint j = kept; j < k; j++) {
    s->next_live[first + j] = -INFINITY;
    s->tokens[first + j] = eos;
    s->parents[first + j] = first + j;
  }
}

gboolean
qkv_beam_search(const QkvBeamOptions *options, gint batch, QkvDecodeStepFunc step,
                gpointer user_data, gint32 *out_tokens, gint *out_lengths, double *out_scores,
                GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(options != NULL && step != NULL, FALSE);
  g_return_val_if_fail(out_tokens != NULL && out_lengths != NULL, FALSE);
  if (!check_options(options, batch, error))
    return FALSE;
  const gint k = options->beam_size, rows = batch * k, max_len = options->max_len;
  const double alpha = options->length_penalty;
  const gint32 eos = options->eos;
  Beam s = {.batch = batch, .k = k, .rows = rows, .max_len = max_len, .vocab = options->vocab};
  if (!beam_alloc(&s, error)) {
    beam_free(&s);
    return FALSE;
  }
  /* each sentence starts with one live hypothesis, <bos>, in its first slot:
   * the other slots would only repeat it */
  for (gint r = 0; r < rows; r++) {
    s.live[r] = r % k == 0 ? 0.0 : -INFINITY;
    s.tokens[r] = options->bos;
    s.parents[r] = r;
  }
  for (gint b = 0; b < batch; b++)
    s.best_score[b] = -INFINITY;

  gboolean ok = TRUE;
  gint t = 0;
  for (; t < max_len; t++) {
    gboolean any = FALSE;
    for (gint b = 0; b < batch && !any; b++)
      any = s.n_done[b] < k;
    if (!any)
      break;
    if (!step(user_data, t, s.tokens, s.parents, rows, s.logits, error) ||
        !check_scores(&s, t, error)) {
      ok = FALSE;
      break;
    }
    for (gint b = 0; b < batch; b++) {
      if (s.n_done[b] >= k) {
        for (gint j = 0; j < k; j++) {
          gint r = b * k + j;
          s.next_live[r] = -INFINITY;
          s.tokens[r] = eos;
          s.parents[r] = r;
        }
        continue;
      }
      beam_extend(&s, b, t, alpha, eos);
      if (s.n_done[b] >= k)
        for (gint j = 0; j < k; j++)
          s.next_live[b * k + j] = -INFINITY;
    }
    double *dl = s.live;
    s.live = s.next_live;
    s.next_live = dl;
    gint32 *dh = s.hist;
    s.hist = s.next_hist;
    s.next_hist = dh;
  }
  if (ok) {
    /* at max_len the live hypotheses end where they are */
    for (gint r = 0; r < rows; r++)
      if (s.live[r] > -INFINITY)
        beam_end(&s, r / k, s.hist + (gsize)r * max_len, t, s.live[r], t, alpha);
    for (gint b = 0; b < batch; b++) {
      gint32 *o = out_tokens + (gsize)b * max_len;
      memcpy(o, s.best_hist + (gsize)b * max_len, (gsize)s.best_len[b] * sizeof(gint32));
      for (gint i = s.best_len[b]; i < max_len; i++)
        o[i] = eos;
      out_lengths[b] = s.best_len[b];
      if (out_scores != NULL)
        out_scores[b] = s.best_score[b];
    }
  }
  beam_free(&s);
  return ok;
}
