/* transformer-internal.h: the Transformer pieces that graph/decode.c's step
 * decoder shares with transformer.c, so that a tied model decodes with the
 * matrices it trained (not installed). */
#pragma once

#include <qkv/qkv.h>

/* The embedding that the "encoder" or "decoder" half reads: one matrix for
 * both under QKV_TIE_ALL. */
G_GNUC_INTERNAL const gchar *transformer_embedding_name(const QkvTransformerConfig *cfg,
                                                        const gchar *half);
/* The decoder's output projection to tgt_vocab logits: "decoder.dense", or
 * the decoder embedding transposed plus "decoder.dense.bias" when tied. */
G_GNUC_INTERNAL QkvValue *transformer_output(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *x, GError **error);
