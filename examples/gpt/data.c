/* data.c: the English side of the fra-eng pairs as character ids. */
#include <string.h>
#include "gpt.h"
#include "../common/text.h"

static gint
compare_unichar(gconstpointer a, gconstpointer b)
{
  gunichar x = *(const gunichar *)a, y = *(const gunichar *)b;
  return x < y ? -1 : x > y;
}

/* The vocabulary from its characters in id order (UTF-8). */
gboolean
gpt_vocab_set(GptCorpus *corpus, const gchar *chars, GError **error)
{
  glong n = 0;
  gunichar *by_id = g_utf8_to_ucs4(chars, -1, NULL, &n, error);
  if (by_id == NULL)
    return FALSE;
  g_free(corpus->by_id);
  g_free(corpus->chars);
  if (corpus->ids)
    g_hash_table_unref(corpus->ids);
  corpus->by_id = by_id;
  corpus->chars = g_strdup(chars);
  corpus->vocab = n;
  corpus->ids = g_hash_table_new(NULL, NULL);
  for (glong i = 0; i < n; i++)
    g_hash_table_insert(corpus->ids, GUINT_TO_POINTER(by_id[i]), GINT_TO_POINTER(i + 1));
  return TRUE;
}

/* The ids of text's characters; an error names a character not in the
 * vocabulary. */
gint32 *
gpt_encode(const GptCorpus *corpus, const gchar *text, gint *n, GError **error)
{
  if (!g_utf8_validate(text, -1, NULL)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "text is not valid UTF-8");
    return NULL;
  }
  gint32 *ids = g_new(gint32, g_utf8_strlen(text, -1) + 1);
  *n = 0;
  for (const gchar *p = text; *p; p = g_utf8_next_char(p)) {
    gint id =
        GPOINTER_TO_INT(g_hash_table_lookup(corpus->ids, GUINT_TO_POINTER(g_utf8_get_char(p))));
    if (id == 0) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "the character '%.*s' is not in the vocabulary", (int)(g_utf8_next_char(p) - p),
                  p);
      g_free(ids);
      return NULL;
    }
    ids[(*n)++] = id - 1;
  }
  return ids;
}

gchar *
gpt_decode(const GptCorpus *corpus, const gint32 *ids, gint n)
{
  GString *s = g_string_new(NULL);
  for (gint i = 0; i < n; i++)
    g_string_append_unichar(s, corpus->by_id[ids[i]]);
  return g_string_free(s, FALSE);
}

static gboolean
encode_lines(const GptCorpus *corpus, GPtrArray *lines, guint from, guint to, GptText *text,
             GError **error)
{
  g_autoptr(GString) joined = g_string_new(NULL);
  for (guint i = from; i < to; i++) {
    g_string_append(joined, g_ptr_array_index(lines, i));
    g_string_append_c(joined, '\n');
  }
  gint n = 0;
  text->ids = gpt_encode(corpus, joined->str, &n, error);
  text->n = n;
  return text->ids != NULL;
}

/* The English sentences (the text before the tab) of the first max_lines
 * lines (0: all); the last val_share of them are held out. The vocabulary
 * is every character of the kept lines and '\n', in code point order,
 * unless one is set already (a loaded checkpoint's). */
gboolean
gpt_corpus_load(GptCorpus *corpus, const gchar *path, gint max_lines, double val_share,
                GError **error)
{
  g_autoptr(GInputStream) raw = text_open(path, error);
  if (raw == NULL)
    return FALSE;
  g_autoptr(GDataInputStream) in = g_data_input_stream_new(raw);
  g_autoptr(GPtrArray) lines = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GHashTable) seen = g_hash_table_new(NULL, NULL);
  g_hash_table_add(seen, GUINT_TO_POINTER('\n'));
  gchar *line;
  GError *read_error = NULL;
  while ((max_lines == 0 || lines->len < (guint)max_lines) &&
         (line = g_data_input_stream_read_line_utf8(in, NULL, NULL, &read_error)) != NULL) {
    line[strcspn(line, "\t\r")] = '\0';
    for (const gchar *p = line; *p; p = g_utf8_next_char(p))
      g_hash_table_add(seen, GUINT_TO_POINTER(g_utf8_get_char(p)));
    g_ptr_array_add(lines, line);
  }
  if (read_error != NULL) {
    g_propagate_prefixed_error(error, read_error, "%s: ", path);
    return FALSE;
  }
  guint n_val = (guint)(lines->len * val_share);
  if (lines->len < 2 || n_val < 1) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: %u lines read, too few to hold some out", path, lines->len);
    return FALSE;
  }
  if (corpus->ids == NULL) {
    g_autoptr(GArray) chars = g_array_new(FALSE, FALSE, sizeof(gunichar));
    GHashTableIter iter;
    gpointer key;
    g_hash_table_iter_init(&iter, seen);
    while (g_hash_table_iter_next(&iter, &key, NULL))
      g_array_append_vals(chars, &(gunichar){GPOINTER_TO_UINT(key)}, 1);
    g_array_sort(chars, compare_unichar);
    g_autofree gchar *utf8 =
        g_ucs4_to_utf8((gunichar *)(void *)chars->data, chars->len, NULL, NULL, error);
    if (utf8 == NULL || !gpt_vocab_set(corpus, utf8, error))
      return FALSE;
  }
  return encode_lines(corpus, lines, 0, lines->len - n_val, &corpus->train, error) &&
         encode_lines(corpus, lines, lines->len - n_val, lines->len, &corpus->val, error);
}

void
gpt_corpus_clear(GptCorpus *corpus)
{
  g_free(corpus->chars);
  g_free(corpus->by_id);
  if (corpus->ids)
    g_hash_table_unref(corpus->ids);
  g_free(corpus->train.ids);
  g_free(corpus->val.ids);
  memset(corpus, 0, sizeof(*corpus));
}
