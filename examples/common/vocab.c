/* vocab.c: the vocabularies and token counts of vocab.h. */
#include "vocab.h"

Vocab *
vocab_new(void)
{
  Vocab *v = g_new0(Vocab, 1);
  v->idx_to_token = g_ptr_array_new_with_free_func(g_free);
  v->token_to_idx = g_hash_table_new(g_str_hash, g_str_equal);
  v->unk = v->pad = v->bos = v->eos = -1;
  return v;
}

void
vocab_free(Vocab *vocab)
{
  if (vocab == NULL)
    return;
  g_hash_table_unref(vocab->token_to_idx);
  g_ptr_array_unref(vocab->idx_to_token);
  g_free(vocab);
}

gint
vocab_add(Vocab *vocab, const gchar *token)
{
  gpointer found = g_hash_table_lookup(vocab->token_to_idx, token);
  if (found != NULL)
    return GPOINTER_TO_INT(found) - 1;
  gchar *copy = g_strdup(token);
  g_ptr_array_add(vocab->idx_to_token, copy);
  gint id = (gint)vocab->idx_to_token->len - 1;
  g_hash_table_insert(vocab->token_to_idx, copy, GINT_TO_POINTER(id + 1));
  return id;
}

gint
vocab_size(const Vocab *vocab)
{
  return (gint)vocab->idx_to_token->len;
}

gint
vocab_lookup(const Vocab *vocab, const gchar *token)
{
  gpointer found = g_hash_table_lookup(vocab->token_to_idx, token);
  return found ? GPOINTER_TO_INT(found) - 1 : vocab->unk;
}

const gchar *
vocab_token(const Vocab *vocab, gint id)
{
  if (id < 0 || id >= vocab_size(vocab))
    return "<unk>";
  return g_ptr_array_index(vocab->idx_to_token, id);
}

gchar *
vocab_join(const Vocab *vocab)
{
  GString *s = g_string_new(NULL);
  for (gint i = 0; i < vocab_size(vocab); i++)
    g_string_append_printf(s, "%s%s", i ? "\n" : "", vocab_token(vocab, i));
  return g_string_free(s, FALSE);
}

gint
vocab_encode(const Vocab *vocab, gchar *const *tokens, gint len, gboolean eos, gint32 *ids)
{
  gint n = 0;
  for (; tokens[n] != NULL && n < len; n++)
    ids[n] = vocab_lookup(vocab, tokens[n]);
  if (eos && n < len)
    ids[n++] = vocab->eos;
  gint valid = n;
  for (; n < len; n++)
    ids[n] = vocab->pad;
  return valid;
}

void
token_counter_init(TokenCounter *counter)
{
  counter->counts = g_array_new(FALSE, FALSE, sizeof(TokenCount));
  counter->index = g_hash_table_new(g_str_hash, g_str_equal);
}

void
token_counter_clear(TokenCounter *counter)
{
  g_clear_pointer(&counter->counts, g_array_unref);
  g_clear_pointer(&counter->index, g_hash_table_unref);
}

void
token_counter_add(TokenCounter *counter, gchar *const *tokens)
{
  for (guint j = 0; tokens[j] != NULL; j++) {
    gpointer idx = g_hash_table_lookup(counter->index, tokens[j]);
    if (idx == NULL) {
      TokenCount tc = {tokens[j], 1, (gint)counter->counts->len};
      g_array_append_val(counter->counts, tc);
      g_hash_table_insert(counter->index, tokens[j], GINT_TO_POINTER(counter->counts->len));
    } else {
      g_array_index(counter->counts, TokenCount, GPOINTER_TO_INT(idx) - 1).count++;
    }
  }
}

static gint
by_count_then_first_seen(gconstpointer a, gconstpointer b)
{
  const TokenCount *x = a, *y = b;
  if (x->count != y->count)
    return y->count - x->count;
  return x->first_seen - y->first_seen;
}

void
token_counter_sort_by_count(TokenCounter *counter)
{
  /* the index points into the order of first appearance; nothing is
   * counted after sorting, so it is dropped rather than renumbered */
  g_hash_table_remove_all(counter->index);
  g_array_sort(counter->counts, by_count_then_first_seen);
}

void
vocab_add_counted(Vocab *vocab, const TokenCounter *counter, gint min_freq)
{
  for (guint i = 0; i < counter->counts->len; i++) {
    const TokenCount *tc = &g_array_index(counter->counts, TokenCount, i);
    if (tc->count >= min_freq)
      vocab_add(vocab, tc->token);
  }
}
