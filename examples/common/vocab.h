/* vocab.h: the examples' vocabularies (tokens with ids 0..n-1 and the
 * reserved ids a model needs) and the token counts they are built from. */
#pragma once

#include <glib.h>

typedef struct {
  GPtrArray *idx_to_token;  /* gchar* */
  GHashTable *token_to_idx; /* gchar* -> index + 1 */
  gint unk, pad, bos, eos;  /* the reserved tokens' ids; -1 where there is none */
  /* Where the tokens are subword pieces (seq2seq's --vocab sentencepiece):
   * the SentencePiece model (spm.h) that splits sentences into them and
   * joins them back, whose ids the tokens' ids are; borrowed. NULL: the
   * tokens are words, split on spaces. */
  const struct Spm *subwords;
} Vocab;

/* An empty vocabulary: no tokens, every reserved id -1. */
Vocab *vocab_new(void);
void vocab_free(Vocab *vocab);
/* The id of token, which is appended when new. */
gint vocab_add(Vocab *vocab, const gchar *token);
gint vocab_size(const Vocab *vocab);
/* The id of a token (vocab->unk when unknown). */
gint vocab_lookup(const Vocab *vocab, const gchar *token);
/* The token of an id ("<unk>" for an id out of range). */
const gchar *vocab_token(const Vocab *vocab, gint id);
/* Every token in id order, one per line, as checkpoints keep them; free
 * with g_free(). */
gchar *vocab_join(const Vocab *vocab);

/* The ids of tokens (NULL-terminated) in len slots: the first len tokens,
 * then <eos> when eos is set and a slot is left, then <pad> to the end.
 * Returns the valid length (tokens and <eos>). */
gint vocab_encode(const Vocab *vocab, gchar *const *tokens, gint len, gboolean eos, gint32 *ids);

/* How often each token occurs, in order of first appearance; the token
 * strings are borrowed, so they must outlive the counter. */
typedef struct {
  const gchar *token;
  gint count;
  gint first_seen;
} TokenCount;

typedef struct {
  GArray *counts;    /* TokenCount */
  GHashTable *index; /* token -> its index in counts + 1 */
} TokenCounter;

void token_counter_init(TokenCounter *counter);
void token_counter_clear(TokenCounter *counter);
/* Count every token of a NULL-terminated array. */
void token_counter_add(TokenCounter *counter, gchar *const *tokens);
/* Falling count, ties in order of first appearance (Python's stable sort
 * of collections.Counter items, as the book's Vocab does); this ends the
 * counting: add no tokens after it. */
void token_counter_sort_by_count(TokenCounter *counter);
/* Append to vocab, in the counter's order, every token counted at least
 * min_freq times that it does not hold yet. */
void vocab_add_counted(Vocab *vocab, const TokenCounter *counter, gint min_freq);
