/* translate.h: the seq2seq example's decoding — the library's step decoders
 * (one plan run per token, keys and values or the GRU state carried from
 * step to step) under beam search; beam 1 is greedy decoding. */
#pragma once

#include <qkv/qkv.h>
#include "data.h"
#include "model.h"

typedef struct {
  QkvStepDecoder *decoder; /* compiled on first use, for max_sentences × beam rows */
  QkvBeamOptions options;
  gint max_sentences;
  gint num_steps;
  gint threads;
  gint cross_layer; /* the block whose attention translator_sentence returns; -1: the last */
} Translator;

/* Set up (nothing is compiled yet): sources and outputs of num_steps tokens,
 * up to max_sentences sentences at once, beam size beam, length penalty α. */
void translator_init(Translator *t, gint num_steps, gint max_sentences, gint beam, double alpha,
                     gint threads);
void translator_clear(Translator *t);

/* Translate n ≤ max_sentences encoded sentences (src n × num_steps ids,
 * src_valid n): out (n × num_steps) gets each translation's ids without
 * <eos>, lens its length. */
gboolean translator_run(Translator *t, const ModelConfig *cfg, QkvParams *params,
                        const Seq2SeqData *data, const gint32 *src, const gint32 *src_valid, gint n,
                        gint32 *out, gint *lens, GError **error);

/* Translate one sentence to text. weights_out (may be NULL) gets the
 * incremental decoder's encoder-decoder attention weights along the
 * translation, as the heat map takes them: (1, heads, num_steps, num_steps)
 * (block cross_layer's) for the Transformer, (1, num_steps, num_steps) for
 * Bahdanau and Luong; rows are the decoder's steps (each token, then
 * <eos>). tokens_out (may be NULL) gets, with subword vocabularies, the
 * source's and the translation's pieces as the model saw and produced them,
 * each joined by spaces (free both with g_free()); it is left as it is for
 * words, which the sentence and the translation show themselves. */
gchar *translator_sentence(Translator *t, const ModelConfig *cfg, QkvParams *params,
                           const Seq2SeqData *data, const gchar *sentence, QkvTensor **weights_out,
                           gchar *tokens_out[2], gint *src_len, gint *out_len, GError **error);
