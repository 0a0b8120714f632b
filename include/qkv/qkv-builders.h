/* qkv-builders.h: builders that add layers and models to a graph and create
 * their parameters in a QkvParams store, under the names the book's PyTorch
 * modules give them in their state_dict (so a state_dict saved as safetensors
 * loads as is). Builders use only the public API: anything they do, a user can
 * do too.
 *
 * A parameter a builder needs is reused when the store already has it with
 * the right shape (a training graph and an evaluation graph share weights),
 * created and initialised when it is missing, and an error when its shape
 * differs. */
#pragma once

#include <glib.h>
#include "qkv-graph.h"
#include "qkv-nn.h"

G_BEGIN_DECLS

/* Where builders put their nodes and parameters, and how they initialise new
 * parameters: each from qkv_init_seed_for_name(seed, name), so values do not
 * depend on the order of creation. */
typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  guint64 seed;
  /* TRUE: every linear weight starts Xavier-uniform (the book's
   * xavier_init_weights); FALSE: PyTorch's nn.Linear default. */
  gboolean xavier_linear;
  gpointer reserved[4];
} QkvBuilder;

/* Builders are all-or-nothing: a builder that fails returns NULL with an
 * error (QKV_ERROR_INVALID_ARGUMENT, naming the builder and the field, for a
 * bad size or config) and leaves the graph (its nodes, values and scope) and
 * the parameter store (its parameters and their names) as they were before
 * the call; its out-parameters (weights, h_n) are set to NULL. A NULL input
 * value (an earlier step failed) gives NULL and leaves the error as it is,
 * so calls can be chained. Your own builders get the same with
 * qkv_builder_begin() and qkv_builder_end(). */

/* What qkv_builder_begin() saw: the graph, the store and the graph's scope. */
typedef struct {
  QkvGraphMark graph;
  QkvParamsMark params;
  gchar *scope; /* owned until qkv_builder_end() */
  gpointer reserved[2];
} QkvBuilderMark;

/* Start a step that adds everything or nothing to b's graph and store. */
void qkv_builder_begin(QkvBuilder *b, QkvBuilderMark *mark);
/* End the step begun with mark: when result is NULL (it failed) roll the
 * graph and the store back to mark (qkv_graph_rollback(),
 * qkv_params_rollback()); in either case set the graph's scope back to what it
 * was at qkv_builder_begin(). Returns result. Steps nest. */
QkvValue *qkv_builder_end(QkvBuilder *b, QkvBuilderMark *mark, QkvValue *result);

/* A parameter of the given shape: reused, or created and filled by init
 * ("zeros", "ones", "linear_weight", "linear_bias", "embedding", "xavier"). */
QkvValue *qkv_build_param(QkvBuilder *b, const gchar *name, const QkvShape *shape,
                          const gchar *init, gint64 fan_in, GError **error);

/* nn.Linear: x (…, in) · weightᵀ (+ bias) → (…, out); "<name>.weight" (out, in),
 * "<name>.bias" (out). */
QkvValue *qkv_build_linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                           gboolean bias, GError **error);
/* nn.Embedding: ids (…) → (…, dim); "<name>.weight" (num, dim), N(0, 1). */
QkvValue *qkv_build_embedding(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num,
                              gint64 dim, GError **error);
/* The book's MultiHeadAttention (bias = FALSE): "<name>.W_q.weight", W_k, W_v,
 * W_o, all (num_hiddens, ·). *weights (may be NULL) gets (B, heads, n_q, n_k). */
QkvValue *qkv_build_mha(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                        QkvValue *values, gint64 num_hiddens, gint num_heads, QkvValue *valid_lens,
                        gboolean causal, double dropout, QkvValue **weights, GError **error);
/* The same with a mask (may be NULL) of the given kind for the attention
 * scores (qkv_multi_head_attention_masked in qkv-nn.h): a local window, a
 * padding mask or learned ALiBi-style biases. */
QkvValue *qkv_build_mha_masked(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                               QkvValue *values, gint64 num_hiddens, gint num_heads,
                               QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                               gboolean causal, double dropout, QkvValue **weights, GError **error);
/* PositionWiseFFN: "<name>.dense1" (ffn_hiddens), ReLU, "<name>.dense2" (out). */
QkvValue *qkv_build_ffn(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
                        gint64 out_features, GError **error);
/* AddNorm: LayerNorm(dropout(y) + x) with "<name>.ln.weight/.bias". */
QkvValue *qkv_build_addnorm(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *y,
                            double dropout, GError **error);

typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 num_hiddens;
  gint64 ffn_hiddens;
  gint num_heads;
  gint num_layers;
  double dropout;
} QkvTransformerConfig;

/* TransformerEncoder "encoder": embedding · √d, positional encoding, blocks
 * "encoder.blks.block{i}" (attention, addnorm1, ffn, addnorm2) with the
 * padding mask from valid_lens (i32 (B)). src (B, T) i32 → (B, T, d). */
QkvValue *qkv_build_transformer_encoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *src, QkvValue *valid_lens, GError **error);
/* TransformerDecoder "decoder" over a whole target prefix: embedding · √d,
 * positional encoding (positions 0…T-1), blocks "decoder.blks.block{i}" with
 * causal self-attention attention1, encoder-decoder attention attention2,
 * ffn and addnorm1..3, then "decoder.dense" → logits (B, T, tgt_vocab).
 * cross_weights (may be NULL) receives the last block's encoder-decoder
 * attention weights (B, heads, T, T_src). */
QkvValue *qkv_build_transformer_decoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *tgt, QkvValue *enc_outputs,
                                        QkvValue *enc_valid_lens, QkvValue **cross_weights,
                                        GError **error);

/* Intermediates of the Transformer builders, for looking at them. Each
 * array the caller sets (non-NULL) must have cfg->num_layers slots; slot i
 * receives block i's attention weights (B, heads, n_q, n_k), before dropout.
 * On failure every slot asked for is NULL. */
typedef struct {
  /* encoder: self-attention (B, heads, T, T); decoder: the causal
   * self-attention attention1 (B, heads, T, T) */
  QkvValue **self_weights;
  /* decoder only: encoder-decoder attention attention2 (B, heads, T, T_src) */
  QkvValue **cross_weights;
  gpointer reserved[4];
} QkvTransformerTaps;

/* qkv_build_transformer_encoder() that also fills taps (may be NULL). */
QkvValue *qkv_build_transformer_encoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *src, QkvValue *valid_lens,
                                             QkvTransformerTaps *taps, GError **error);
/* qkv_build_transformer_decoder() that fills taps (may be NULL) instead of
 * returning only the last block's cross-attention weights. */
QkvValue *qkv_build_transformer_decoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *tgt, QkvValue *enc_outputs,
                                             QkvValue *enc_valid_lens, QkvTransformerTaps *taps,
                                             GError **error);

/* nn.GRU with PyTorch's gate equations and parameter layout:
 * "<name>.weight_ih_l{k}" (3H, in), "<name>.weight_hh_l{k}" (3H, H),
 * "<name>.bias_ih_l{k}", "<name>.bias_hh_l{k}" (3H), gates ordered r, z, n;
 * dropout on every layer's output but the last. x (T, B, in), h0 (L, B, H)
 * or NULL for zeros → outputs (T, B, H); *h_n (may be NULL) gets (L, B, H). */
QkvValue *qkv_build_gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden,
                        gint num_layers, double dropout, QkvValue **h_n, GError **error);

typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 embed_size;
  gint64 num_hiddens;
  gint num_layers;
  double dropout;
} QkvGruSeq2SeqConfig;

/* The book's Seq2SeqEncoder ("encoder.embedding", "encoder.rnn") and
 * Seq2SeqAttentionDecoder ("decoder.attention.W_k/W_q/w_v", "decoder.embedding",
 * "decoder.rnn", "decoder.dense") unrolled over the time steps, with teacher
 * forcing on dec_in (B, T). src (B, T), src_valid (B) → logits (B, T, V).
 * *weights (may be NULL) receives the attention weights (B, T, T_src). */
QkvValue *qkv_build_bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                                     QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                                     GError **error);

/* Intermediates of qkv_build_bahdanau_seq2seq_taps(); all NULL on failure. */
typedef struct {
  QkvValue *enc_outputs;       /* the encoder GRU's outputs, (B, T_src, H) */
  QkvValue *enc_state;         /* its final hidden state, (L, B, H) */
  QkvValue *attention_weights; /* as *weights below, (B, T, T_src) */
  gpointer reserved[4];
} QkvSeq2SeqTaps;

/* qkv_build_bahdanau_seq2seq() that fills taps (may be NULL). */
QkvValue *qkv_build_bahdanau_seq2seq_taps(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg,
                                          QkvValue *src, QkvValue *src_valid, QkvValue *dec_in,
                                          QkvSeq2SeqTaps *taps, GError **error);

/* The book's MaskedSoftmaxCELoss summed over the batch: Σ_b mean_t(ce[b,t] ·
 * mask[b,t]) for logits (B, T, V), labels i32 (B, T), mask f32 (B, T). */
QkvValue *qkv_build_seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                 GError **error);
/* The same from i32 valid lengths (B), as the book's MaskedSoftmaxCELoss
 * takes them: the mask is sequence_mask(valid_lens) over labels' T, built in
 * the graph. *per_seq (may be NULL) receives the per-sequence loss (B),
 * mean_t(ce · mask); the return value is its sum. The mean divides by the T
 * a plan is bound with, so the loss follows shorter sequences. */
QkvValue *qkv_build_seq2seq_loss_lens(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                                      QkvValue **per_seq, GError **error);

/* Nadaraya-Watson kernel regression with one learned width w (parameter
 * "<prefix>w", shape (1)): for each query q_i,
 *   f(q_i) = Σ_j softmax_j(-((q_i - k_ij) · w)² / 2) · v_ij.
 * queries (n), keys (n, m), values (n, m) → predictions (n). If the store has
 * no "<prefix>w" yet it is created as U(0, 1) from seed, like torch.rand.
 * *weights (may be NULL) receives the attention weights (n, m). */
QkvValue *qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                  QkvValue *queries, QkvValue *keys, QkvValue *values, guint64 seed,
                                  QkvValue **weights, GError **error);

G_END_DECLS
