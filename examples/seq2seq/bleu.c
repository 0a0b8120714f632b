/* bleu.c: per-sentence BLEU as the book defines it. */
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
