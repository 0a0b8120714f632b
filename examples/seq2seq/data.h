/* data.h: the seq2seq example's data — the book's English-French pairs and a
 * synthetic reverse task — as fixed-length id arrays with valid lengths. */
#pragma once

#include <glib.h>

#include "../common/vocab.h"

/* Limits of the data the example builds: enough for the whole fra-eng corpus
 * (about 190,000 pairs) and far longer sequences than the book's 10 steps;
 * the reverse task also keeps n * num_steps under SEQ2SEQ_MAX_IDS (512 MB
 * per id array). */
#define SEQ2SEQ_MAX_EXAMPLES 1000000
#define SEQ2SEQ_MAX_STEPS 1024
#define SEQ2SEQ_MAX_IDS (G_GINT64_CONSTANT(1) << 27)
#define SEQ2SEQ_MAX_REVERSE_VOCAB 1000000

/* n sequences of num_steps ids each, with valid lengths (the <eos> counted). */
typedef struct {
  gint n;
  gint num_steps;
  gint32 *src;
  gint32 *src_valid;
  gint32 *tgt;
  gint32 *tgt_valid;
  Vocab *src_vocab;
  Vocab *tgt_vocab;
  /* --vocab sentencepiece: the one model both vocabularies split with
   * (their ->subwords), owned here; NULL for words */
  struct Spm *subwords;
} Seq2SeqData;

/* --vocab sentencepiece: the subword model to split with (spm.h), or how to
 * train one. */
typedef struct {
  struct Spm *model; /* given (--spm-model, a checkpoint's): taken over by the data */
  gint vocab_size;   /* else trained with this many pieces at most, */
  const gchar *type; /* "unigram" or "bpe", */
  const gchar *save; /* and saved here when not NULL */
} Seq2SeqSubwords;

/* The book's preprocessing of one text: U+202F and U+00A0 to spaces,
 * lower-case, a space before , . ! ? where none precedes. */
gchar *nmt_preprocess(const gchar *text);

/* Load the first num_examples + 1 lines of fra.txt (plain or .gz), exactly
 * as the book's load_data_nmt does. Fails on limits outside the ones above,
 * a NUL byte, a line over 64 KiB, invalid UTF-8, or no sentence pair. */
gboolean seq2seq_data_load_nmt(Seq2SeqData *data, const gchar *path, gint num_examples,
                               gint num_steps, GError **error);
/* What loading a file of pairs kept and skipped, and why. */
typedef struct {
  gint lines;        /* lines looked at */
  gint no_tab;       /* skipped: one column only, not a pair */
  gint blank;        /* skipped: empty */
  gint too_long;     /* skipped: more than max_len words on a side */
  gint more_columns; /* kept: a third column or more, ignored (Tatoeba's attribution) */
} Seq2SeqLoadReport;

/* seq2seq_data_load_nmt with the vocabularies' min_freq (the book's is 2)
 * and, when max_len > 0, without the pairs that have more than max_len
 * words on either side. Lines of three or more tab-separated columns are
 * pairs of their first two; "\r" before a newline is dropped. report (may
 * be NULL) gets the counts. */
gboolean seq2seq_data_load_nmt_full(Seq2SeqData *data, const gchar *path, gint num_examples,
                                    gint num_steps, gint min_freq, gint max_len,
                                    Seq2SeqLoadReport *report, GError **error);
/* The same pairs (max_len still counts words) in subword pieces: one
 * SentencePiece model for both sides, trained on the English and French
 * sentences of the training pairs unless subwords->model is given; both
 * vocabularies are its pieces in its id order (<unk> <pad> <bos> <eos>
 * first, as the word vocabularies have them), and min_freq does not apply. */
gboolean seq2seq_data_load_nmt_subwords(Seq2SeqData *data, const gchar *path, gint num_examples,
                                        gint num_steps, gint max_len, Seq2SeqSubwords *subwords,
                                        Seq2SeqLoadReport *report, GError **error);
/* The report in words ("skipped 2 of 40 lines: 1 blank, 1 without a tab
 * (not a pair)"), or NULL when nothing was skipped and no line had more
 * columns. Free with g_free(). */
gchar *seq2seq_load_report_describe(const Seq2SeqLoadReport *report, gint max_len);

/* The synthetic reverse task of bench/peers (splitmix64 stream from seed):
 * tokens <pad>=0, <bos>=1, <eos>=2, others 3..vocab-1. Fails unless
 * vocab >= 4, n >= 1 and num_steps >= 2 (and within the limits above). */
gboolean seq2seq_data_reverse(Seq2SeqData *data, gint n, gint num_steps, gint vocab, guint64 seed,
                              GError **error);
void seq2seq_data_clear(Seq2SeqData *data);

/* The sentence pairs of lines first .. first + n − 1 (counted from 0) of
 * fra.txt, preprocessed as seq2seq_data_load_nmt does, as text: src_out and
 * tgt_out get arrays of gchar* (free with g_ptr_array_unref); the first two
 * columns of a line of more are its pair. The lines after
 * a training set's (first = num_examples + 1) are pairs it never saw. The
 * arrays are empty when those lines hold no pair (or the file ends before
 * them); fails on a file that cannot be read or is not UTF-8. */
gboolean seq2seq_data_load_pairs(const gchar *path, gint first, gint n, GPtrArray **src_out,
                                 GPtrArray **tgt_out, GError **error);

/* Tokens of a sentence as the book's predict_seq2seq does: lower-case, split
 * on spaces (or into vocab's subword pieces), ids, then <eos>;
 * truncated/padded to num_steps. Returns the valid length. */
gint seq2seq_encode_sentence(const Vocab *vocab, const gchar *sentence, gint num_steps,
                             gint32 *ids);
/* The text of n ids of vocab: words joined by spaces, or subword pieces
 * joined into words (SentencePiece's decoding). Free with g_free(). */
gchar *seq2seq_decode_ids(const Vocab *vocab, const gint32 *ids, gint n);
