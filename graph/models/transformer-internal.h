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
/* The input of sub-layer name ("addnorm1", …) of a block on its stream x:
 * x itself in the book's post-LN blocks, LayerNorm(x) under "<name>.ln" in
 * pre-LN ones (cfg->norm_first). */
G_GNUC_INTERNAL QkvValue *transformer_sublayer_in(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                                  const gchar *name, QkvValue *x, GError **error);
/* The stream after sub-layer name gave y: AddNorm "<name>" (post-LN) or
 * x + dropout(y) (pre-LN). */
G_GNUC_INTERNAL QkvValue *transformer_sublayer_out(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                                   const gchar *name, QkvValue *x, QkvValue *y,
                                                   GError **error);
/* The end of the "encoder" or "decoder" stack: x (post-LN), or its final
 * LayerNorm "<half>.norm" (pre-LN). */
G_GNUC_INTERNAL QkvValue *transformer_final_norm(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                                 const gchar *half, QkvValue *x, GError **error);
