/* bleu.c: per-sentence BLEU as the book defines it and corpus BLEU-4. */
#include "bleu.h"

#include <math.h>
#include <string.h>

/* n tokens joined by spaces */
static gchar *
ngram(gchar **tokens, gint n)
{
  GString *s = g_string_new(NULL);
  for (gint j = 0; j < n; j++)
    g_string_append_printf(s, "%s%s", j ? " " : "", tokens[j]);
  return g_string_free(s, FALSE);
}

double
bleu(const gchar *pred, const gchar *label, gint k)
{
  g_auto(GStrv) p = g_strsplit(pred, " ", -1);
  g_auto(GStrv) l = g_strsplit(label, " ", -1);
  gint len_pred = (gint)g_strv_length(p), len_label = (gint)g_strv_length(l);
  if (len_pred == 0)
    return 0.0;
  double score = exp(MIN(0.0, 1.0 - (double)len_label / len_pred));
  for (gint n = 1; n <= k; n++) {
    GHashTable *subs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (gint i = 0; i + n <= len_label; i++) {
      gchar *key = ngram(l + i, n);
      gint c = GPOINTER_TO_INT(g_hash_table_lookup(subs, key));
      g_hash_table_insert(subs, key, GINT_TO_POINTER(c + 1));
    }
    gint matches = 0;
    for (gint i = 0; i + n <= len_pred; i++) {
      gchar *key = ngram(p + i, n);
      gint c = GPOINTER_TO_INT(g_hash_table_lookup(subs, key));
      if (c > 0) {
        matches++;
        g_hash_table_insert(subs, key, GINT_TO_POINTER(c - 1));
      } else {
        g_free(key);
      }
    }
    g_hash_table_unref(subs);
    gint denom = len_pred - n + 1;
    /* the book divides by zero here for short predictions; score that as 0 */
    if (denom <= 0)
      return 0.0;
    score *= pow((double)matches / denom, pow(0.5, n));
  }
  return score;
}

/* The non-empty white-space separated tokens of text (a NULL-terminated
 * array of pointers into a copy; free with g_strfreev). */
static gchar **
tokens_of(const gchar *text, gint *n)
{
  gchar **parts = g_strsplit_set(text, " \t\n\r\v\f", -1);
  gint kept = 0;
  for (gint i = 0; parts[i] != NULL; i++) {
    if (parts[i][0] != '\0')
      parts[kept++] = parts[i];
    else
      g_free(parts[i]);
  }
  parts[kept] = NULL;
  *n = kept;
  return parts;
}

void
bleu_stats_add(BleuStats *stats, const gchar *hypothesis, const gchar *reference)
{
  gint n_hyp, n_ref;
  g_auto(GStrv) hyp = tokens_of(hypothesis, &n_hyp);
  g_auto(GStrv) ref = tokens_of(reference, &n_ref);
  stats->sys_len += n_hyp;
  stats->ref_len += n_ref;
  for (gint n = 1; n <= BLEU_MAX_ORDER; n++) {
    /* the reference's n-gram counts; each hypothesis n-gram takes one */
    g_autoptr(GHashTable) counts = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (gint i = 0; i + n <= n_ref; i++) {
      gchar *key = ngram(ref + i, n);
      gint c = GPOINTER_TO_INT(g_hash_table_lookup(counts, key));
      g_hash_table_insert(counts, key, GINT_TO_POINTER(c + 1));
    }
    for (gint i = 0; i + n <= n_hyp; i++) {
      g_autofree gchar *key = ngram(hyp + i, n);
      gint c = GPOINTER_TO_INT(g_hash_table_lookup(counts, key));
      if (c > 0) {
        stats->correct[n - 1]++;
        g_hash_table_insert(counts, g_strdup(key), GINT_TO_POINTER(c - 1));
      }
      stats->total[n - 1]++;
    }
  }
}

double
bleu_stats_score(const BleuStats *stats)
{
  gboolean any = FALSE;
  for (gint n = 0; n < BLEU_MAX_ORDER; n++)
    any = any || stats->correct[n] > 0;
  if (!any)
    return 0.0;
  double log_sum = 0.0, smooth = 1.0;
  for (gint n = 0; n < BLEU_MAX_ORDER; n++) {
    double p;
    if (stats->total[n] == 0)
      return 0.0; /* sacrebleu's log of a zero precision: the score underflows to 0 */
    if (stats->correct[n] == 0) {
      smooth *= 2.0;
      p = 1.0 / (smooth * (double)stats->total[n]);
    } else {
      p = (double)stats->correct[n] / (double)stats->total[n];
    }
    log_sum += log(p);
  }
  double bp = 1.0;
  if (stats->sys_len < stats->ref_len)
    bp = stats->sys_len > 0 ? exp(1.0 - (double)stats->ref_len / (double)stats->sys_len) : 0.0;
  return 100.0 * bp * exp(log_sum / BLEU_MAX_ORDER);
}
