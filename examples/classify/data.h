/* data.h: the classify example's data — the English side of the Tatoeba
 * pairs, labelled by sentence type from the final punctuation. */
#pragma once

#include <glib.h>

#include "../common/vocab.h"

typedef enum {
  CLASS_STATEMENT,   /* "." */
  CLASS_QUESTION,    /* "?" */
  CLASS_EXCLAMATION, /* "!" */
  N_CLASSES,
} SentenceClass;

/* The class's name and its punctuation mark. */
const gchar *class_name(gint label);
const gchar *class_mark(gint label);

/* A sentence's label from its last character (after trailing white space):
 * '.', '?' or '!'; -1 for any other ending (a closing quote, no mark). When
 * it has one, *tokens (may be NULL) gets the input the model sees: the
 * sentence lower-cased, with every '.', '?' and '!' removed (not only the
 * last: "Really? Why?" would give its label away), "," ";" ":" and '"' as
 * tokens of their own, split on white space (U+00A0 and U+202F count). */
gint classify_sentence(const gchar *sentence, gchar ***tokens);

/* The vocabulary's first ids (common/vocab.h), and no <bos> or <eos>. */
#define VOCAB_PAD 0
#define VOCAB_UNK 1

/* One split: n sentences of at most max_len tokens, ids padded with
 * VOCAB_PAD, row-major (n, max_len). */
typedef struct {
  gint n;
  gint max_len;
  gint32 *ids;
  gint32 *lens;
  gint32 *labels;
  gchar **text; /* the model's input, tokens joined by spaces */
} Split;

typedef struct {
  Split train, valid, held_out; /* valid: --valid's sentences, maybe none */
  Vocab *vocab;
  gint n_read;       /* English sentences read (with repeats) */
  gint n_no_tab;     /* skipped: lines without a tab (not pairs) */
  gint n_unlabelled; /* dropped: no final . ? ! */
  gint n_unique;     /* distinct inputs kept */
  gint n_conflicts;  /* inputs seen with more than one label (the first kept) */
  gint n_truncated;  /* inputs longer than max_len */
} ClassifyData;

/* Read path (fra.txt, plain or .gz: "English<TAB>French…" lines, further
 * columns ignored; lines without a tab are skipped and counted), keep the
 * labelled English sentences, deduplicate them by their input (so no input
 * is in both splits), shuffle with seed, keep the first max_sentences (0:
 * all), put a held_out share of them aside and n_valid of the rest for
 * validation, and build the vocabulary from the training split (tokens seen
 * at least min_freq times; others are <unk>). */
gboolean classify_data_load(ClassifyData *data, const gchar *path, gint max_sentences,
                            double held_out, gint n_valid, gint max_len, gint min_freq,
                            guint64 seed, GError **error);
void classify_data_clear(ClassifyData *data);

/* Encode one sentence (already tokenised) into max_len ids; returns its
 * length (at most max_len). */
gint classify_encode(const Vocab *v, gchar **tokens, gint max_len, gint32 *ids);
