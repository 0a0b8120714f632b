/* qkv-builders-models.h: whole-model builders (part of qkv-builders.h): the
 * Transformer encoder and decoder (with their taps), the book's GRU seq2seq
 * with Bahdanau attention, the Luong seq2seq, the seq2seq losses and the
 * pooling sentence classifier. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-builders-core.h"
#include "qkv-builders-layers.h"
#include "qkv-builders-attention.h"

G_BEGIN_DECLS

/**
 * QkvTieEmbeddings:
 * @QKV_TIE_NONE: separate matrices, the book's model
 * @QKV_TIE_DECODER: the decoder's output projection is "decoder.embedding.weight" (tgt_vocab, d)
 * @QKV_TIE_ALL: a joint vocabulary (src_vocab must equal tgt_vocab): the encoder's embedding, the
 *   decoder's and the output projection are all "encoder.embedding.weight";
 *   "decoder.embedding.weight" does not exist
 *
 * Weight tying (Press & Wolf 2017; "Attention is all you need" §3.4) in the
 * Transformer: one matrix E (vocab, d) is both an embedding table and the
 * output projection, logits = h Eᵀ + "decoder.dense.bias" (PyTorch's
 * convention: tying dense.weight to embedding.weight keeps the Linear's
 * bias, which costs only vocab numbers and lets frequent tokens start
 * ahead). Inputs are still scaled by √d, as without tying. Autodiff sums the
 * gradients of every use of E. The shared matrix is one parameter, stored
 * (and saved in checkpoints) once, under the name given below;
 * "decoder.dense.weight" does not exist.
 */
typedef enum {
  QKV_TIE_NONE = 0, /* separate matrices, the book's model */
  /* the decoder's output projection is "decoder.embedding.weight" (tgt_vocab, d) */
  QKV_TIE_DECODER,
  /* a joint vocabulary (src_vocab must equal tgt_vocab): the encoder's
   * embedding, the decoder's and the output projection are all
   * "encoder.embedding.weight"; "decoder.embedding.weight" does not exist */
  QKV_TIE_ALL,
} QkvTieEmbeddings;

/**
 * QkvTransformerConfig:
 *
 * Zero-initialise it (designated initialisers do): fields added later take
 * their defaults from zero.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 num_hiddens;
  gint64 ffn_hiddens;
  gint num_heads;
  gint num_layers;
  double dropout;
  QkvTieEmbeddings tie_embeddings; /* QKV_TIE_NONE by default */
  /* FALSE: the book's post-LN blocks, LayerNorm(x + dropout(sublayer(x)))
   * (addnorm{k}). TRUE: pre-LN blocks, x + dropout(sublayer(LN(x))), as
   * nn.TransformerEncoderLayer(norm_first=True) and its decoder twin: the
   * LayerNorm before sub-layer k keeps its name "addnorm{k}.ln", so a
   * checkpoint has the same names either way; each stack then ends with a
   * LayerNorm of its own, "encoder.norm" and "decoder.norm" (the norm= of
   * nn.TransformerEncoder and nn.TransformerDecoder), the decoder's before
   * its dense layer. (PyTorch's layers also drop out inside the FFN, after
   * the activation; these blocks, like the book's, do not.) */
  gboolean norm_first;
  QkvActivation ffn_activation; /* between the FFN's layers: ReLU by default */
  /* TRUE: every attention has biases (QkvMhaOptions.bias), as
   * nn.MultiheadAttention's default bias=True */
  gboolean attention_bias;
  gpointer reserved[2];
} QkvTransformerConfig;

/**
 * qkv_build_transformer_encoder:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @src: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * TransformerEncoder "encoder": embedding · √d, positional encoding, blocks
 * "encoder.blks.block{i}" (attention, addnorm1, ffn, addnorm2) with the
 * padding mask from valid_lens (i32 (B)). src (B, T) i32 → (B, T, d).
 * With cfg->norm_first, pre-LN blocks and "encoder.norm" at the end.
 *
 * The names map onto nn.TransformerEncoderLayer's: self_attn.in_proj_weight
 * = [attention.W_q.weight; W_k.weight; W_v.weight] (in_proj_bias alike with
 * attention_bias), self_attn.out_proj = attention.W_o, linear1 = ffn.dense1,
 * linear2 = ffn.dense2, norm1 = addnorm1.ln, norm2 = addnorm2.ln (in the
 * decoder: self_attn = attention1, multihead_attn = attention2, norm3 =
 * addnorm3.ln).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_encoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *src, QkvValue *valid_lens, GError **error);
/**
 * qkv_build_transformer_decoder:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @tgt: a #QkvValue
 * @enc_outputs: a #QkvValue
 * @enc_valid_lens: (nullable): a #QkvValue
 * @cross_weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * TransformerDecoder "decoder" over a whole target prefix: embedding · √d,
 * positional encoding (positions 0…T-1), blocks "decoder.blks.block{i}" with
 * causal self-attention attention1, encoder-decoder attention attention2,
 * ffn and addnorm1..3, then "decoder.dense" → logits (B, T, tgt_vocab)
 * (with cfg->tie_embeddings, the embedding matrix transposed and
 * "decoder.dense.bias").
 * cross_weights (may be NULL) receives the last block's encoder-decoder
 * attention weights (B, heads, T, T_src). With b->cache (QkvBuilderCache)
 * it is the step decoder's graph: tgt holds each row's new tokens at
 * b->cache->positions, and attention1 attends over its key/value cache.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_decoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *tgt, QkvValue *enc_outputs,
                                        QkvValue *enc_valid_lens, QkvValue **cross_weights,
                                        GError **error);

/**
 * QkvTransformerTaps:
 *
 * Intermediates of the Transformer builders, for looking at them. Each
 * array the caller sets (non-NULL) must have cfg->num_layers slots; slot i
 * receives block i's attention weights (B, heads, n_q, n_k), before dropout.
 * On failure every slot asked for is NULL.
 */
typedef struct {
  /* encoder: self-attention (B, heads, T, T); decoder: the causal
   * self-attention attention1 (B, heads, T, T) */
  QkvValue **self_weights;
  /* decoder only: encoder-decoder attention attention2 (B, heads, T, T_src) */
  QkvValue **cross_weights;
  gpointer reserved[4];
} QkvTransformerTaps;

/**
 * qkv_build_transformer_encoder_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @src: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @taps: (nullable): a #QkvTransformerTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_transformer_encoder() that also fills taps (may be NULL).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_encoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *src, QkvValue *valid_lens,
                                             QkvTransformerTaps *taps, GError **error);
/**
 * qkv_build_transformer_decoder_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @tgt: a #QkvValue
 * @enc_outputs: a #QkvValue
 * @enc_valid_lens: (nullable): a #QkvValue
 * @taps: (nullable): a #QkvTransformerTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_transformer_decoder() that fills taps (may be NULL) instead of
 * returning only the last block's cross-attention weights.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_decoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *tgt, QkvValue *enc_outputs,
                                             QkvValue *enc_valid_lens, QkvTransformerTaps *taps,
                                             GError **error);

/**
 * QkvGruSeq2SeqConfig:
 *
 * A gru seq2 seq config.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 embed_size;
  gint64 num_hiddens;
  gint num_layers;
  double dropout;
} QkvGruSeq2SeqConfig;

/**
 * qkv_build_bahdanau_seq2seq:
 * @b: a #QkvBuilder
 * @cfg: a #QkvGruSeq2SeqConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The book's Seq2SeqEncoder ("encoder.embedding", "encoder.rnn") and
 * Seq2SeqAttentionDecoder ("decoder.attention.W_k/W_q/w_v", "decoder.embedding",
 * "decoder.rnn", "decoder.dense") unrolled over the time steps, with teacher
 * forcing on dec_in (B, T). src (B, T), src_valid (B) → logits (B, T, V).
 * *weights (may be NULL) receives the attention weights (B, T, T_src).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                                     QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                                     GError **error);

/**
 * QkvSeq2SeqTaps:
 *
 * Intermediates of qkv_build_bahdanau_seq2seq_taps(); all NULL on failure.
 */
typedef struct {
  QkvValue *enc_outputs;       /* the encoder GRU's outputs, (B, T_src, H) */
  QkvValue *enc_state;         /* its final hidden state, (L, B, H) */
  QkvValue *attention_weights; /* as *weights below, (B, T, T_src) */
  gpointer reserved[4];
} QkvSeq2SeqTaps;

/**
 * qkv_build_bahdanau_seq2seq_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvGruSeq2SeqConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @taps: (nullable): a #QkvSeq2SeqTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_bahdanau_seq2seq() that fills taps (may be NULL).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_bahdanau_seq2seq_taps(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg,
                                          QkvValue *src, QkvValue *src_valid, QkvValue *dec_in,
                                          QkvSeq2SeqTaps *taps, GError **error);

/**
 * QkvLuongConfig:
 *
 * A luong config.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 embed_size;
  gint64 num_hiddens;
  gint num_layers;
  double dropout; /* between GRU layers, as nn.GRU's */
  QkvLuongAttentionConfig attention;
  /* feed ã_{t-1} to the next step: the decoder GRU's input is
   * [embedding; ã_{t-1}] (E + H), with ã_0 = 0 */
  gboolean input_feeding;
  gpointer reserved[4];
} QkvLuongConfig;

/**
 * qkv_build_luong_seq2seq:
 * @b: a #QkvBuilder
 * @cfg: a #QkvLuongConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A Luong seq2seq on the book's GRU encoder ("encoder.embedding",
 * "encoder.rnn", as qkv_build_bahdanau_seq2seq's): the decoder GRU
 * "decoder.rnn" starts from the encoder's final state and reads
 * "decoder.embedding" (plus ã_{t-1} with input feeding); its top layer's
 * h_t attends ("decoder.attention", qkv_build_luong_attention) over the
 * encoder's outputs, "decoder.W_c" makes ã_t
 * (qkv_build_luong_attentional) and "decoder.dense" (with bias) the
 * logits. Teacher forcing on dec_in (B, T); src (B, T_src), src_valid (B)
 * → logits (B, T, V); *weights (may be NULL) receives (B, T, T_src). Without
 * input feeding the decoder GRU runs over all steps before attending; with
 * it, step by step.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_seq2seq(QkvBuilder *b, const QkvLuongConfig *cfg, QkvValue *src,
                                  QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                                  GError **error);

/**
 * qkv_build_seq2seq_loss:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The book's MaskedSoftmaxCELoss summed over the batch: Σ_b mean_t(ce[b,t] ·
 * mask[b,t]) for logits (B, T, V), labels i32 (B, T), mask f32 (B, T).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                 GError **error);
/**
 * qkv_build_seq2seq_loss_lens:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @per_seq: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same from i32 valid lengths (B), as the book's MaskedSoftmaxCELoss
 * takes them: the mask is sequence_mask(valid_lens) over labels' T, built in
 * the graph. *per_seq (may be NULL) receives the per-sequence loss (B),
 * mean_t(ce · mask); the return value is its sum. The mean divides by the T
 * a plan is bound with, so the loss follows shorter sequences.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_lens(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                                      QkvValue **per_seq, GError **error);
/**
 * qkv_build_seq2seq_loss_smoothed:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @label_smoothing: the label smoothing
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_seq2seq_loss and _lens with label smoothing ε in [0, 1] in the
 * cross-entropy (qkv_cross_entropy_smoothed, "Attention is all you need"
 * trains with ε = 0.1). ε = 0 gives the unsmoothed loss.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_smoothed(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                          double label_smoothing, GError **error);
/**
 * qkv_build_seq2seq_loss_lens_smoothed:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @label_smoothing: the label smoothing
 * @per_seq: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_build_seq2seq_loss_smoothed().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_lens_smoothed(QkvValue *logits, QkvValue *labels,
                                               QkvValue *valid_lens, double label_smoothing,
                                               QkvValue **per_seq, GError **error);

/**
 * QkvPooling:
 * @QKV_POOLING_ATTENTION: attention
 * @QKV_POOLING_MEAN: mean
 * @QKV_POOLING_HARD: qkv_build_hard_attention_pooling()
 *
 * The pooling values.
 */
typedef enum {
  QKV_POOLING_ATTENTION,
  QKV_POOLING_MEAN,
  QKV_POOLING_HARD, /* qkv_build_hard_attention_pooling() */
} QkvPooling;

/**
 * QkvPoolingClassifierConfig:
 *
 * A pooling classifier config.
 */
typedef struct {
  gint64 vocab_size;
  gint64 embed_size;  /* D, the word vectors' size */
  gint64 key_size;    /* attention only (soft or hard) */
  gint num_queries;   /* K, attention only (one per class is the usual choice) */
  gint num_classes;   /* C */
  QkvPooling pooling; /* QKV_POOLING_ATTENTION, QKV_POOLING_MEAN or QKV_POOLING_HARD */
  /* TRUE: the Transformer's sinusoidal positional encoding is added to the
   * word vectors (no parameters), so the pooling can see word order */
  gboolean positional_encoding;
  double tau; /* QKV_POOLING_HARD: the Gumbel-softmax temperature (0: 1) */
  gpointer reserved[3];
} QkvPoolingClassifierConfig;

/**
 * qkv_build_pooling_classifier:
 * @b: a #QkvBuilder
 * @cfg: a #QkvPoolingClassifierConfig
 * @tokens: (nullable): a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A sentence classifier: "embedding" (vocab_size, D), then attention pooling
 * "pool" (pool.queries, pool.W_k.weight; soft, or hard for
 * QKV_POOLING_HARD) or mean pooling, the K pooled
 * vectors concatenated into one feature [c_1; …; c_K] (B, K·D) (K = 1 for
 * mean pooling), and "dense" (weight (C, K·D), bias (C)) to the class logits.
 * tokens i32 (B, T), valid_lens i32 (B) or NULL → logits (B, C). *weights
 * (may be NULL) receives the pooling weights (B, K, T).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_pooling_classifier(QkvBuilder *b, const QkvPoolingClassifierConfig *cfg,
                                       QkvValue *tokens, QkvValue *valid_lens, QkvValue **weights,
                                       GError **error);

G_END_DECLS
