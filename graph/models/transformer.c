/* transformer.c: the book's Transformer encoder and decoder (d2l 0.17,
 * section 10.7) as graph builders, with its state_dict names, and the
 * variants of today's models on the same names: pre-LN blocks
 * (cfg->norm_first), another FFN activation, attention biases. */
#include <math.h>
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "models/transformer-internal.h"
#include "error-private.h"

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
      !builder_check_dropout(builder, "cfg->dropout", cfg->dropout, error) ||
      !builder_check_activation(builder, "cfg->ffn_activation", cfg->ffn_activation, error))
    return FALSE;
  if (cfg->tie_embeddings != QKV_TIE_NONE && cfg->tie_embeddings != QKV_TIE_DECODER &&
      cfg->tie_embeddings != QKV_TIE_ALL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: cfg->tie_embeddings is %d, it must be QKV_TIE_NONE, QKV_TIE_DECODER or "
                "QKV_TIE_ALL",
                builder, (gint)cfg->tie_embeddings);
    return FALSE;
  }
  /* both halves check it: either may be built alone (a decoding graph) */
  if (cfg->tie_embeddings == QKV_TIE_ALL && cfg->src_vocab != cfg->tgt_vocab) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: cfg->tie_embeddings is QKV_TIE_ALL, which needs one joint vocabulary, but "
                "cfg->src_vocab (%" G_GINT64_FORMAT ") and cfg->tgt_vocab (%" G_GINT64_FORMAT
                ") differ",
                builder, cfg->src_vocab, cfg->tgt_vocab);
    return FALSE;
  }
  return TRUE;
}

/* The embedding a half uses ("encoder" or "decoder"): its own, or with a
 * joint vocabulary the encoder's for both. */
const gchar *
transformer_embedding_name(const QkvTransformerConfig *cfg, const gchar *half)
{
  if (cfg->tie_embeddings == QKV_TIE_ALL)
    return "encoder.embedding";
  return g_str_equal(half, "encoder") ? "encoder.embedding" : "decoder.embedding";
}

static QkvValue *
embed_and_encode_positions(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 vocab,
                           const QkvTransformerConfig *cfg, GError **error)
{
  const gchar *emb_name = transformer_embedding_name(cfg, name);
  QkvValue *x = qkv_build_embedding(b, emb_name, ids, vocab, cfg->num_hiddens, error);
  x = qkv_scale(x, sqrt((double)cfg->num_hiddens), error);
  /* a cached decoder (QkvBuilderCache) takes its tokens at the rows' positions */
  if (b->cache != NULL && g_str_equal(name, "decoder"))
    return qkv_positional_encoding_at(x, b->cache->positions, cfg->dropout, 0, error);
  return qkv_positional_encoding(x, cfg->dropout, 0, error);
}

QkvValue *
transformer_sublayer_in(QkvBuilder *b, const QkvTransformerConfig *cfg, const gchar *name,
                        QkvValue *x, GError **error)
{
  if (!cfg->norm_first)
    return x;
  qkv_builder_push(b, name, error);
  QkvValue *h = qkv_build_layer_norm(b, "ln", x, 1e-5, TRUE, TRUE, error);
  qkv_builder_pop(b);
  return h;
}

QkvValue *
transformer_sublayer_out(QkvBuilder *b, const QkvTransformerConfig *cfg, const gchar *name,
                         QkvValue *x, QkvValue *y, GError **error)
{
  if (!cfg->norm_first)
    return qkv_build_addnorm(b, name, x, y, cfg->dropout, error);
  QkvValue *d = cfg->dropout > 0 ? qkv_dropout(y, cfg->dropout, error) : y;
  return qkv_add(d, x, error);
}

QkvValue *
transformer_final_norm(QkvBuilder *b, const QkvTransformerConfig *cfg, const gchar *half,
                       QkvValue *x, GError **error)
{
  if (!cfg->norm_first)
    return x;
  g_autofree gchar *name = g_strconcat(half, ".norm", NULL);
  return qkv_build_layer_norm(b, name, x, 1e-5, TRUE, TRUE, error);
}

/* An attention of a block: the book's, with biases under cfg->attention_bias. */
static QkvValue *
attention(QkvBuilder *b, const QkvTransformerConfig *cfg, const gchar *name, QkvValue *q,
          QkvValue *kv, QkvValue *valid_lens, gboolean causal, QkvValue **weights, GError **error)
{
  QkvMhaOptions o = {
      .valid_lens = valid_lens,
      .causal = causal,
      .dropout = cfg->dropout,
      .bias = cfg->attention_bias,
  };
  return qkv_build_mha_full(b, name, q, kv, kv, cfg->num_hiddens, cfg->num_heads, &o, weights,
                            error);
}

/* The FFN sub-layer "ffn" of a block on x. */
static QkvValue *
ffn(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *x, GError **error)
{
  return qkv_build_ffn_activation(b, "ffn", x, cfg->ffn_hiddens, cfg->num_hiddens,
                                  cfg->ffn_activation, error);
}

/* self_weights: NULL, or cfg->num_layers slots for each block's attention weights */
static QkvValue *
encoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *src, QkvValue *valid_lens,
        QkvValue **self_weights, GError **error)
{
  QkvValue *x = embed_and_encode_positions(b, "encoder", src, cfg->src_vocab, cfg, error);
  for (gint i = 0; i < cfg->num_layers; i++) {
    qkv_builder_push_printf(b, error, "encoder.blks.block%d", i);
    QkvValue *h = transformer_sublayer_in(b, cfg, "addnorm1", x, error);
    QkvValue *a = attention(b, cfg, "attention", h, h, valid_lens, FALSE,
                            self_weights ? &self_weights[i] : NULL, error);
    QkvValue *y = transformer_sublayer_out(b, cfg, "addnorm1", x, a, error);
    QkvValue *f = ffn(b, cfg, transformer_sublayer_in(b, cfg, "addnorm2", y, error), error);
    x = transformer_sublayer_out(b, cfg, "addnorm2", y, f, error);
    qkv_builder_pop(b);
  }
  return transformer_final_norm(b, cfg, "encoder", x, error);
}

QkvValue *
qkv_build_transformer_encoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *src,
                              QkvValue *valid_lens, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
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
  if (cfg != NULL) /* a failure leaves the taps NULL */
    taps_clear(taps, cfg->num_layers);
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
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

/* logits = x Eᵀ + "decoder.dense.bias", E the decoder's embedding matrix:
 * the same parameter the embedding reads, so its gradient sums both uses. */
static QkvValue *
tied_output(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *x, GError **error)
{
  QkvShape es = QKV_SHAPE(cfg->tgt_vocab, cfg->num_hiddens), bs = QKV_SHAPE(cfg->tgt_vocab);
  qkv_builder_push(b, transformer_embedding_name(cfg, "decoder"), error);
  QkvValue *e = qkv_build_param(b, "weight", &es, "embedding", 0, error);
  qkv_builder_pop(b);
  QkvValue *bias =
      e ? qkv_build_param(b, "decoder.dense.bias", &bs, "linear_bias", cfg->num_hiddens, error)
        : NULL;
  QkvValue *y = bias ? qkv_matmul(x, e, FALSE, TRUE, error) : NULL;
  return qkv_add(y, bias, error);
}

QkvValue *
transformer_output(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *x, GError **error)
{
  if (cfg->tie_embeddings == QKV_TIE_NONE)
    return qkv_build_linear(b, "decoder.dense", x, cfg->tgt_vocab, TRUE, error);
  return x ? tied_output(b, cfg, x, error) : NULL;
}

static QkvValue *
decoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *tgt, QkvValue *enc_outputs,
        QkvValue *enc_valid_lens, QkvValue **cross_weights, QkvTransformerTaps *taps,
        GError **error)
{
  QkvValue *x = embed_and_encode_positions(b, "decoder", tgt, cfg->tgt_vocab, cfg, error);
  for (gint i = 0; i < cfg->num_layers; i++) {
    qkv_builder_push_printf(b, error, "decoder.blks.block%d", i);
    /* the book's training-time dec_valid_lens = 1..T per query is the causal mask */
    QkvValue **self_w = (taps && taps->self_weights) ? &taps->self_weights[i] : NULL;
    QkvValue *h = transformer_sublayer_in(b, cfg, "addnorm1", x, error);
    QkvValue *a1 = attention(b, cfg, "attention1", h, h, NULL, TRUE, self_w, error);
    QkvValue *y = transformer_sublayer_out(b, cfg, "addnorm1", x, a1, error);
    QkvValue **weights = (cross_weights != NULL && i == cfg->num_layers - 1) ? cross_weights : NULL;
    if (taps != NULL && taps->cross_weights != NULL)
      weights = &taps->cross_weights[i];
    h = transformer_sublayer_in(b, cfg, "addnorm2", y, error);
    QkvValue *a2 =
        attention(b, cfg, "attention2", h, enc_outputs, enc_valid_lens, FALSE, weights, error);
    QkvValue *z = transformer_sublayer_out(b, cfg, "addnorm2", y, a2, error);
    QkvValue *f = ffn(b, cfg, transformer_sublayer_in(b, cfg, "addnorm3", z, error), error);
    x = transformer_sublayer_out(b, cfg, "addnorm3", z, f, error);
    qkv_builder_pop(b);
  }
  x = transformer_final_norm(b, cfg, "decoder", x, error);
  return transformer_output(b, cfg, x, error);
}

QkvValue *
qkv_build_transformer_decoder(QkvBuilder *b, const QkvTransformerConfig *cfg, QkvValue *tgt,
                              QkvValue *enc_outputs, QkvValue *enc_valid_lens,
                              QkvValue **cross_weights, GError **error)
{
  if (cross_weights != NULL) /* a failure leaves out-values NULL */
    *cross_weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (cross_weights != NULL)
    *cross_weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (tgt == NULL || enc_outputs == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_decoder", cfg, "cfg->tgt_vocab", cfg->tgt_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *weights = NULL;
  QkvValue *logits = decoder(b, cfg, tgt, enc_outputs, enc_valid_lens,
                             cross_weights ? &weights : NULL, NULL, error);
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
  if (cfg != NULL) /* a failure leaves the taps NULL */
    taps_clear(taps, cfg->num_layers);
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (tgt == NULL || enc_outputs == NULL)
    return NULL;
  if (!check_config("qkv_build_transformer_decoder", cfg, "cfg->tgt_vocab", cfg->tgt_vocab, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *logits = decoder(b, cfg, tgt, enc_outputs, enc_valid_lens, NULL, taps, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits == NULL)
    taps_clear(taps, cfg->num_layers);
  return logits;
}
