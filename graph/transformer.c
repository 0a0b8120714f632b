/* transformer.c: the book's Transformer encoder and decoder (d2l 0.17,
 * section 10.7) as graph builders, with its state_dict names. */
#include <math.h>
#include <qkv/qkv.h>

#include "builder-checks.h"

/* The fields both halves use; vocab is src_vocab or tgt_vocab. */
static gboolean
check_config(const gchar *builder, const QkvTransformerConfig *cfg, const gchar *vocab_field,
             gint64 vocab, GError **error)
{
  if (!builder_check_positive(builder, vocab_field, vocab, error) ||
      !builder_check_heads(builder, "cfg->num_heads", cfg->num_heads, "cfg->num_hiddens",
                           cfg->num_hiddens, error) ||
      !builder_check_positive(builder, "cfg->ffn_hiddens", cfg->ffn_hiddens, error) ||
      !builder_check_positive(builder, "cfg->num_layers", cfg->num_layers, error) ||
      !builder_check_dropout(builder, "cfg->dropout", cfg->dropout, error))
    return FALSE;
  return TRUE;
}

static QkvValue *
embed_and_encode_positions(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 vocab,
                           const QkvTransformerConfig *cfg, GError **error)
{
  g_autofree gchar *emb_name = g_strconcat(name, ".embedding", NULL);
  QkvValue *x = qkv_build_embedding(b, emb_name, ids, vocab, cfg->num_hiddens, error);
  x = x ? qkv_scale(x, sqrt((double)cfg->num_hiddens), error) : NULL;
  return x ? qkv_positional_encoding(x, cfg->dropout, 0, error) : NULL;
}

/* self_weights: NULL, or cfg->num_layers slots for each block's attention weights */
static QkvValue *
encoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *src, QkvValue *valid_lens,
        QkvValue **self_weights, GError **error)
{
  QkvValue *x = embed_and_encode_positions(b, "encoder", src, cfg->src_vocab, cfg, error);
  for (gint i = 0; x != NULL && i < cfg->num_layers; i++) {
    g_autofree gchar *blk = g_strdup_printf("encoder.blks.block%d", i);
    g_autofree gchar *att = g_strconcat(blk, ".attention", NULL);
    g_autofree gchar *an1 = g_strconcat(blk, ".addnorm1", NULL);
    g_autofree gchar *ffn = g_strconcat(blk, ".ffn", NULL);
    g_autofree gchar *an2 = g_strconcat(blk, ".addnorm2", NULL);
    qkv_graph_set_scope(b->graph, blk);
    QkvValue *a = qkv_build_mha(b, att, x, x, x, cfg->num_hiddens, cfg->num_heads, valid_lens,
                                FALSE, cfg->dropout, self_weights ? &self_weights[i] : NULL, error);
    QkvValue *y = qkv_build_addnorm(b, an1, x, a, cfg->dropout, error);
    QkvValue *f = qkv_build_ffn(b, ffn, y, cfg->ffn_hiddens, cfg->num_hiddens, error);
    x = qkv_build_addnorm(b, an2, y, f, cfg->dropout, error);
  }
  return x;
}

QkvValue *
qkv_build_transformer_encoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *src,
                              QkvValue *valid_lens, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (src == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_encoder", cfg, "cfg->src_vocab", cfg->src_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  return qkv_builder_end(b, &mark, encoder(b, cfg, src, valid_lens, NULL, error));
}

/* Clear the slots a caller asked for: the builder failed, or has not run. */
static void
taps_clear(QkvTransformerTaps *taps, gint num_layers)
{
  for (gint i = 0; taps != NULL && i < num_layers; i++) {
    if (taps->self_weights != NULL)
      taps->self_weights[i] = NULL;
    if (taps->cross_weights != NULL)
      taps->cross_weights[i] = NULL;
  }
}

QkvValue *
qkv_build_transformer_encoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *src,
                                   QkvValue *valid_lens, QkvTransformerTaps *taps, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  taps_clear(taps, cfg->num_layers);
  if (src == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_encoder", cfg, "cfg->src_vocab", cfg->src_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *out = encoder(b, cfg, src, valid_lens, taps ? taps->self_weights : NULL, error);
  out = qkv_builder_end(b, &mark, out);
  if (out == NULL)
    taps_clear(taps, cfg->num_layers); /* the values named there were rolled back */
  return out;
}

/* outer_scope: the caller's scope, for the nodes after the blocks. */
static QkvValue *
decoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *tgt, QkvValue *enc_outputs,
        QkvValue *enc_valid_lens, QkvValue **cross_weights, const gchar *outer_scope,
        QkvTransformerTaps *taps, GError **error)
{
  QkvValue *x = embed_and_encode_positions(b, "decoder", tgt, cfg->tgt_vocab, cfg, error);
  for (gint i = 0; x != NULL && i < cfg->num_layers; i++) {
    g_autofree gchar *blk = g_strdup_printf("decoder.blks.block%d", i);
    g_autofree gchar *att1 = g_strconcat(blk, ".attention1", NULL);
    g_autofree gchar *an1 = g_strconcat(blk, ".addnorm1", NULL);
    g_autofree gchar *att2 = g_strconcat(blk, ".attention2", NULL);
    g_autofree gchar *an2 = g_strconcat(blk, ".addnorm2", NULL);
    g_autofree gchar *ffn = g_strconcat(blk, ".ffn", NULL);
    g_autofree gchar *an3 = g_strconcat(blk, ".addnorm3", NULL);
    qkv_graph_set_scope(b->graph, blk);
    /* the book's training-time dec_valid_lens = 1..T per query is the causal mask */
    QkvValue **self_w = (taps && taps->self_weights) ? &taps->self_weights[i] : NULL;
    QkvValue *a1 = qkv_build_mha(b, att1, x, x, x, cfg->num_hiddens, cfg->num_heads, NULL, TRUE,
                                 cfg->dropout, self_w, error);
    QkvValue *y = qkv_build_addnorm(b, an1, x, a1, cfg->dropout, error);
    QkvValue **weights = (cross_weights != NULL && i == cfg->num_layers - 1) ? cross_weights : NULL;
    if (taps != NULL && taps->cross_weights != NULL)
      weights = &taps->cross_weights[i];
    QkvValue *a2 =
        qkv_build_mha(b, att2, y, enc_outputs, enc_outputs, cfg->num_hiddens, cfg->num_heads,
                      enc_valid_lens, FALSE, cfg->dropout, weights, error);
    QkvValue *z = qkv_build_addnorm(b, an2, y, a2, cfg->dropout, error);
    QkvValue *f = qkv_build_ffn(b, ffn, z, cfg->ffn_hiddens, cfg->num_hiddens, error);
    x = qkv_build_addnorm(b, an3, z, f, cfg->dropout, error);
  }
  qkv_graph_set_scope(b->graph, outer_scope);
  return x ? qkv_build_linear(b, "decoder.dense", x, cfg->tgt_vocab, TRUE, error) : NULL;
}

QkvValue *
qkv_build_transformer_decoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *tgt,
                              QkvValue *enc_outputs, QkvValue *enc_valid_lens,
                              QkvValue **cross_weights, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (cross_weights != NULL)
    *cross_weights = NULL;
  if (tgt == NULL || enc_outputs == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_decoder", cfg, "cfg->tgt_vocab", cfg->tgt_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *weights = NULL;
  QkvValue *logits = decoder(b, cfg, tgt, enc_outputs, enc_valid_lens,
                             cross_weights ? &weights : NULL, mark.scope, NULL, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits != NULL && cross_weights != NULL)
    *cross_weights = weights;
  return logits;
}

QkvValue *
qkv_build_transformer_decoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *tgt,
                                   QkvValue *enc_outputs, QkvValue *enc_valid_lens,
                                   QkvTransformerTaps *taps, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  taps_clear(taps, cfg->num_layers);
  if (tgt == NULL || enc_outputs == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_decoder", cfg, "cfg->tgt_vocab", cfg->tgt_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *logits =
      decoder(b, cfg, tgt, enc_outputs, enc_valid_lens, NULL, mark.scope, taps, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits == NULL)
    taps_clear(taps, cfg->num_layers);
  return logits;
}
