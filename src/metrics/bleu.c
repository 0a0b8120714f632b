/* bleu.c: corpus BLEU and sacrebleu's 13a tokenizer (qkv-bleu.h). */
#include <qkv/qkv-bleu.h>

#include <math.h>
#include <string.h>

QkvBleuOptions
qkv_bleu_options_default(void)
{
  return (QkvBleuOptions){.tokenize = QKV_BLEU_TOKENIZE_13A};
}

/* An n-gram as the ids of its tokens: the ids are given per sentence pair,
 * so tokens are compared as whole strings, whatever they hold. */
typedef struct {
  gint n;
  gint32 ids[QKV_BLEU_MAX_ORDER];
} Ngram;

static guint
ngram_hash(gconstpointer p)
{
  const Ngram *g = p;
  guint h = (guint)g->n;
  for (gint i = 0; i < g->n; i++)
    h = h * 1000003u + (guint)g->ids[i];
  return h;
}

static gboolean
ngram_equal(gconstpointer a, gconstpointer b)
{
  const Ngram *x = a, *y = b;
  return x->n == y->n && memcmp(x->ids, y->ids, (gsize)x->n * sizeof x->ids[0]) == 0;
}

/* Each n-gram of orders 1 to QKV_BLEU_MAX_ORDER of ids[0..len) with its
 * count. */
static GHashTable *
ngram_counts(const gint32 *ids, gsize len)
{
  GHashTable *counts = g_hash_table_new_full(ngram_hash, ngram_equal, g_free, NULL);
  for (gint n = 1; n <= QKV_BLEU_MAX_ORDER; n++) {
    for (gsize i = 0; i + (gsize)n <= len; i++) {
      Ngram key = {.n = n};
      memcpy(key.ids, ids + i, (gsize)n * sizeof key.ids[0]);
      gpointer old = NULL;
      if (g_hash_table_lookup_extended(counts, &key, NULL, &old))
        g_hash_table_insert(counts, g_memdup2(&key, sizeof key),
                            GSIZE_TO_POINTER(GPOINTER_TO_SIZE(old) + 1));
      else
        g_hash_table_insert(counts, g_memdup2(&key, sizeof key), GSIZE_TO_POINTER(1));
    }
  }
  return counts;
}

/* The ids of tokens in dictionary (token -> id + 1), new tokens added. */
static gint32 *
token_ids(GHashTable *dictionary, const gchar *const *tokens, gsize *len)
{
  gsize n = tokens != NULL ? g_strv_length((gchar **)tokens) : 0;
  gint32 *ids = g_new(gint32, MAX(n, 1));
  for (gsize i = 0; i < n; i++) {
    gpointer id = g_hash_table_lookup(dictionary, tokens[i]);
    if (id == NULL) {
      id = GUINT_TO_POINTER(g_hash_table_size(dictionary) + 1);
      g_hash_table_insert(dictionary, (gpointer)tokens[i], id);
    }
    ids[i] = (gint32)(GPOINTER_TO_UINT(id) - 1);
  }
  *len = n;
  return ids;
}

/* The reference length the brevity penalty takes: the closest to the
 * hypothesis's, the shorter of two as close (sacrebleu's
 * _get_closest_ref_len). */
static gsize
closest_length(gsize hyp_len, const gsize *ref_lens, gsize n_refs)
{
  gsize best = ref_lens[0];
  for (gsize r = 1; r < n_refs; r++) {
    gsize diff = ref_lens[r] > hyp_len ? ref_lens[r] - hyp_len : hyp_len - ref_lens[r];
    gsize best_diff = best > hyp_len ? best - hyp_len : hyp_len - best;
    if (diff < best_diff || (diff == best_diff && ref_lens[r] < best))
      best = ref_lens[r];
  }
  return best;
}

/* Each n-gram's count in the reference that has it most often. */
static GHashTable *
reference_counts(GHashTable *dictionary, const gchar *const *const *references, gsize n_refs,
                 gsize *ref_lens)
{
  GHashTable *most = NULL;
  for (gsize r = 0; r < n_refs; r++) {
    g_autofree gint32 *ids = token_ids(dictionary, references[r], &ref_lens[r]);
    GHashTable *counts = ngram_counts(ids, ref_lens[r]);
    if (most == NULL) {
      most = counts;
      continue;
    }
    GHashTableIter iter;
    gpointer key, value;
    g_hash_table_iter_init(&iter, counts);
    while (g_hash_table_iter_next(&iter, &key, &value)) {
      gsize have = GPOINTER_TO_SIZE(g_hash_table_lookup(most, key));
      if (GPOINTER_TO_SIZE(value) > have)
        g_hash_table_insert(most, g_memdup2(key, sizeof(Ngram)), value);
    }
    g_hash_table_unref(counts);
  }
  return most;
}

void
qkv_bleu_stats_add_tokens_multi(QkvBleuStats *stats, const gchar *const *hypothesis,
                                const gchar *const *const *references, gsize n_refs)
{
  g_return_if_fail(stats != NULL && references != NULL && n_refs >= 1);
  g_autoptr(GHashTable) dictionary = g_hash_table_new(g_str_hash, g_str_equal);
  gsize n_hyp;
  g_autofree gint32 *hyp = token_ids(dictionary, hypothesis, &n_hyp);
  g_autofree gsize *ref_lens = g_new(gsize, n_refs);
  g_autoptr(GHashTable) ref_counts = reference_counts(dictionary, references, n_refs, ref_lens);
  stats->sys_len += (gint64)n_hyp;
  stats->ref_len += (gint64)closest_length(n_hyp, ref_lens, n_refs);
  g_autoptr(GHashTable) hyp_counts = ngram_counts(hyp, n_hyp);
  /* each hypothesis n-gram matches at most as often as a reference has it */
  GHashTableIter iter;
  gpointer key, value;
  g_hash_table_iter_init(&iter, hyp_counts);
  while (g_hash_table_iter_next(&iter, &key, &value)) {
    const Ngram *g = key;
    gsize in_hyp = GPOINTER_TO_SIZE(value);
    gsize in_ref = GPOINTER_TO_SIZE(g_hash_table_lookup(ref_counts, g));
    stats->correct[g->n - 1] += (gint64)MIN(in_hyp, in_ref);
    stats->total[g->n - 1] += (gint64)in_hyp;
  }
}

void
qkv_bleu_stats_add_tokens(QkvBleuStats *stats, const gchar *const *hypothesis,
                          const gchar *const *reference)
{
  qkv_bleu_stats_add_tokens_multi(stats, hypothesis, &reference, 1);
}

/* Python's str.isspace(): the characters str.split() separates words at. */
static gboolean
is_python_space(gunichar c)
{
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

gchar **
qkv_bleu_split(const gchar *text)
{
  g_return_val_if_fail(text != NULL, NULL);
  g_autofree gchar *valid = g_utf8_make_valid(text, -1);
  GPtrArray *words = g_ptr_array_new();
  const gchar *word = NULL;
  for (const gchar *p = valid;; p = g_utf8_next_char(p)) {
    gunichar c = g_utf8_get_char(p);
    gboolean space = c == 0 || is_python_space(c);
    if (space && word != NULL) {
      g_ptr_array_add(words, g_strndup(word, p - word));
      word = NULL;
    } else if (!space && word == NULL) {
      word = p;
    }
    if (c == 0)
      break;
  }
  g_ptr_array_add(words, NULL);
  return (gchar **)g_ptr_array_free(words, FALSE);
}

/* text without its trailing white space (Python's str.rstrip()) */
static gchar *
rstrip(const gchar *text)
{
  const gchar *end = text + strlen(text);
  while (end > text) {
    const gchar *prev = g_utf8_prev_char(end);
    if (!is_python_space(g_utf8_get_char(prev)))
      break;
    end = prev;
  }
  return g_strndup(text, end - text);
}

/* sacrebleu's TokenizerRegexp: four substitutions, each over the whole line
 * left to right, as Python's re.sub makes them. */
static const struct {
  const gchar *pattern, *replacement;
} rules_13a[] = {
    /* the ASCII punctuation and symbols but ' , - . (and the space) */
    {"([\\{-\\~\\[-\\` -\\&\\(-\\+\\:-\\@\\/])", " \\1 "},
    /* a period or comma not after a digit */
    {"([^0-9])([\\.,])", "\\1 \\2 "},
    /* a period or comma not before a digit */
    {"([\\.,])([^0-9])", " \\1 \\2"},
    /* a dash after a digit */
    {"([0-9])(-)", "\\1 \\2 "},
};

static GRegex *
rule_regex(guint i)
{
  static GRegex *compiled[G_N_ELEMENTS(rules_13a)];
  static gsize ready = 0;
  if (g_once_init_enter(&ready)) {
    for (guint r = 0; r < G_N_ELEMENTS(rules_13a); r++) {
      g_autoptr(GError) error = NULL;
      compiled[r] = g_regex_new(rules_13a[r].pattern, G_REGEX_OPTIMIZE, 0, &error);
      g_assert_no_error(error); /* fixed patterns */
    }
    g_once_init_leave(&ready, 1);
  }
  return compiled[i];
}

gchar *
qkv_bleu_tokenize_13a(const gchar *line)
{
  g_return_val_if_fail(line != NULL, NULL);
  g_autofree gchar *valid = g_utf8_make_valid(line, -1);
  GString *s = g_string_new(" ");
  g_string_append(s, valid);
  /* the language-independent part, in sacrebleu's order */
  g_string_replace(s, "<skipped>", "", 0);
  g_string_replace(s, "-\n", "", 0);
  g_string_replace(s, "\n", " ", 0);
  g_string_replace(s, "&quot;", "\"", 0);
  g_string_replace(s, "&amp;", "&", 0);
  g_string_replace(s, "&lt;", "<", 0);
  g_string_replace(s, "&gt;", ">", 0);
  g_string_append_c(s, ' ');
  gchar *text = g_string_free(s, FALSE);
  for (guint r = 0; r < G_N_ELEMENTS(rules_13a); r++) {
    gchar *next = g_regex_replace(rule_regex(r), text, -1, 0, rules_13a[r].replacement, 0, NULL);
    g_free(text);
    text = next;
  }
  g_auto(GStrv) words = qkv_bleu_split(text);
  g_free(text);
  return g_strjoinv(" ", words);
}

/* The words BLEU counts in one side of a pair, as sacrebleu's
 * _preprocess_segment and str.split() make them. */
static gchar **
text_tokens(const gchar *text, const QkvBleuOptions *o)
{
  g_autofree gchar *valid = g_utf8_make_valid(text, -1);
  g_autofree gchar *stripped = rstrip(valid);
  g_autofree gchar *cased = o->lowercase ? g_utf8_strdown(stripped, -1) : g_strdup(stripped);
  if (o->tokenize == QKV_BLEU_TOKENIZE_NONE)
    return qkv_bleu_split(cased);
  g_autofree gchar *tokenised = qkv_bleu_tokenize_13a(cased);
  return qkv_bleu_split(tokenised);
}

void
qkv_bleu_stats_add_text_multi(QkvBleuStats *stats, const gchar *hypothesis,
                              const gchar *const *references, gsize n_refs,
                              const QkvBleuOptions *options)
{
  g_return_if_fail(stats != NULL && hypothesis != NULL && references != NULL && n_refs >= 1);
  QkvBleuOptions o = options != NULL ? *options : qkv_bleu_options_default();
  g_auto(GStrv) hyp = text_tokens(hypothesis, &o);
  GPtrArray *refs = g_ptr_array_new_with_free_func((GDestroyNotify)g_strfreev);
  for (gsize r = 0; r < n_refs; r++)
    g_ptr_array_add(refs, text_tokens(references[r], &o));
  qkv_bleu_stats_add_tokens_multi(stats, (const gchar *const *)hyp,
                                  (const gchar *const *const *)refs->pdata, n_refs);
  g_ptr_array_unref(refs);
}

void
qkv_bleu_stats_add_text(QkvBleuStats *stats, const gchar *hypothesis, const gchar *reference,
                        const QkvBleuOptions *options)
{
  qkv_bleu_stats_add_text_multi(stats, hypothesis, &reference, 1, options);
}

/* sacrebleu's my_log: the log of a zero precision is a large negative
 * number, not -inf, so the score underflows to 0 */
static double
bleu_log(double x)
{
  return x == 0.0 ? -9999999999.0 : log(x);
}

QkvBleuScore
qkv_bleu_stats_compute(const QkvBleuStats *stats, gboolean effective_order)
{
  QkvBleuScore s = {.brevity_penalty = 1.0};
  g_return_val_if_fail(stats != NULL, s);
  if (stats->sys_len < stats->ref_len)
    s.brevity_penalty =
        stats->sys_len > 0 ? exp(1.0 - (double)stats->ref_len / (double)stats->sys_len) : 0.0;
  s.ratio = stats->ref_len > 0 ? (double)stats->sys_len / (double)stats->ref_len : 0.0;
  gboolean any = FALSE;
  for (gint n = 0; n < QKV_BLEU_MAX_ORDER; n++)
    any = any || stats->correct[n] > 0;
  if (!any)
    return s;
  double smooth = 1.0;
  gint orders = QKV_BLEU_MAX_ORDER;
  for (gint n = 0; n < QKV_BLEU_MAX_ORDER; n++) {
    if (stats->total[n] == 0)
      break;
    if (effective_order)
      orders = n + 1;
    if (stats->correct[n] == 0) {
      smooth *= 2.0;
      s.precisions[n] = 100.0 / (smooth * (double)stats->total[n]);
    } else {
      s.precisions[n] = 100.0 * (double)stats->correct[n] / (double)stats->total[n];
    }
  }
  double log_sum = 0.0;
  for (gint n = 0; n < orders; n++)
    log_sum += bleu_log(s.precisions[n]);
  s.score = s.brevity_penalty * exp(log_sum / orders);
  return s;
}

double
qkv_bleu_stats_score(const QkvBleuStats *stats, gboolean effective_order)
{
  return qkv_bleu_stats_compute(stats, effective_order).score;
}

gchar *
qkv_bleu_stats_format(const QkvBleuStats *stats, gboolean effective_order)
{
  g_return_val_if_fail(stats != NULL, NULL);
  QkvBleuScore s = qkv_bleu_stats_compute(stats, effective_order);
  GString *out = g_string_new(NULL);
  g_string_append_printf(out, "BLEU = %.2f ", s.score);
  for (gint n = 0; n < QKV_BLEU_MAX_ORDER; n++)
    g_string_append_printf(out, "%s%.1f", n ? "/" : "", s.precisions[n]);
  g_string_append_printf(out,
                         " (BP = %.3f ratio = %.3f hyp_len = %" G_GINT64_FORMAT
                         " ref_len = %" G_GINT64_FORMAT ")",
                         s.brevity_penalty, s.ratio, stats->sys_len, stats->ref_len);
  return g_string_free(out, FALSE);
}

double
qkv_bleu_corpus_tokens(const gchar *const *const *hypotheses, const gchar *const *const *references,
                       gsize n, gboolean effective_order, QkvBleuStats *stats_out)
{
  g_return_val_if_fail(n == 0 || (hypotheses != NULL && references != NULL), 0.0);
  QkvBleuStats stats = {0};
  for (gsize i = 0; i < n; i++)
    qkv_bleu_stats_add_tokens(&stats, hypotheses[i], references[i]);
  if (stats_out != NULL)
    *stats_out = stats;
  return qkv_bleu_stats_score(&stats, effective_order);
}

double
qkv_bleu_corpus(const gchar *const *hypotheses, const gchar *const *references, gsize n,
                const QkvBleuOptions *options, QkvBleuStats *stats_out)
{
  g_return_val_if_fail(n == 0 || (hypotheses != NULL && references != NULL), 0.0);
  QkvBleuOptions o = options != NULL ? *options : qkv_bleu_options_default();
  QkvBleuStats stats = {0};
  for (gsize i = 0; i < n; i++)
    qkv_bleu_stats_add_text(&stats, hypotheses[i], references[i], &o);
  if (stats_out != NULL)
    *stats_out = stats;
  return qkv_bleu_stats_score(&stats, o.effective_order);
}

gchar *
qkv_bleu_signature(const QkvBleuOptions *options, gsize n_refs)
{
  QkvBleuOptions o = options != NULL ? *options : qkv_bleu_options_default();
  return g_strdup_printf("nrefs:%" G_GSIZE_FORMAT
                         "|case:%s|eff:%s|tok:%s|smooth:exp|version:qkv-%s",
                         n_refs, o.lowercase ? "lc" : "mixed", o.effective_order ? "yes" : "no",
                         o.tokenize == QKV_BLEU_TOKENIZE_NONE ? "none" : "13a", QKV_VERSION);
}
