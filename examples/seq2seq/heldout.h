/* heldout.h: corpus BLEU of the seq2seq example on sentence pairs that
 * training never saw. */
#pragma once

#include <qkv/qkv.h>
#include "data.h"
#include "model.h"

/* Translate every sentence of src (gchar*, preprocessed English) with the
 * incremental decoder under beam search (beam 1: greedy; alpha the length
 * penalty), in batches of up to batch sentences, and score the translations
 * against tgt (the French references) by corpus BLEU-4 as sacrebleu
 * computes it (qkv-bleu.h, with heldout_bleu_options()), 0 to 100. Words the
 * training vocabulary lacks read as <unk>, as in any translation. */
gboolean heldout_bleu(const ModelConfig *cfg, QkvParams *params, const Seq2SeqData *data,
                      GPtrArray *src, GPtrArray *tgt, gint batch, gint beam, double alpha,
                      gint threads, double *score, GError **error);

/* How heldout_bleu() scores: the pairs are preprocessed (lower-cased, split
 * before punctuation) as training data is, so BLEU splits them on spaces
 * only (tok:none) and lower-cases them (case:lc, which changes nothing).
 * With subword vocabularies the translation's pieces are decoded to text
 * first (SentencePiece joins them at its word-start marks), and that text
 * is split on spaces like the reference: both vocabularies are scored on
 * the same words. */
QkvBleuOptions heldout_bleu_options(void);
