/* qkv-builders-attention.h: attention builders (part of qkv-builders.h): the
 * book's multi-head attention with its options and the cached mode's
 * projected keys and values, Luong attention (global, local-m, local-p),
 * attention pooling (soft, hard, mean) and Nadaraya-Watson kernel
 * regression. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-builders-core.h"
#include "qkv-nn.h"

G_BEGIN_DECLS

/**
 * qkv_build_mha:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The book's MultiHeadAttention (bias = FALSE): "<name>.W_q.weight", W_k, W_v,
 * W_o, all (num_hiddens, ·). *weights (may be NULL) gets (B, heads, n_q, n_k);
 * with NULL, long sequences take the memory-efficient kernel
 * (qkv_multi_head_attention in qkv-nn.h).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                        QkvValue *values, gint64 num_hiddens, gint num_heads, QkvValue *valid_lens,
                        gboolean causal, double dropout, QkvValue **weights, GError **error);
/**
 * qkv_build_mha_masked:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @kind: the kind
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a mask (may be NULL) of the given kind for the attention
 * scores (qkv_multi_head_attention_masked in qkv-nn.h): a local window, a
 * padding mask or learned ALiBi-style biases.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_masked(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                               QkvValue *values, gint64 num_hiddens, gint num_heads,
                               QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                               gboolean causal, double dropout, QkvValue **weights, GError **error);
/**
 * QkvMhaOptions:
 *
 * How qkv_build_mha_full() attends; zero-initialise it (designated
 * initialisers do): all zero is qkv_build_mha() with no lengths, no mask, no
 * dropout and no biases.
 */
typedef struct {
  QkvValue *valid_lens;  /* i32 (B) or (B, n_q), or NULL (qkv_masked_softmax) */
  QkvValue *mask;        /* NULL, or a mask of mask_kind for the scores */
  QkvMaskKind mask_kind; /* QKV_MASK_BOOLEAN by default */
  gboolean causal;
  double dropout; /* on the attention weights, in [0, 1) */
  /* TRUE: biases "<name>.W_q.bias", "W_k.bias", "W_v.bias" and "W_o.bias"
   * (num_hiddens each) after the four projections, the nn.Linear(bias=True)
   * of the book's MultiHeadAttention(bias=True); new ones start as
   * nn.Linear's biases do (U(±1/√fan_in), or b->inits->bias). In
   * nn.MultiheadAttention(bias=True) they are in_proj_bias = [W_q.bias;
   * W_k.bias; W_v.bias] and out_proj.bias (whose weights are in_proj_weight
   * = [W_q.weight; W_k.weight; W_v.weight] and out_proj.weight = W_o.weight);
   * PyTorch starts them at 0 (QkvBuilderInits.bias = QKV_INIT_CONSTANT 0
   * does the same). */
  gboolean bias;
  gpointer reserved[4];
} QkvMhaOptions;

/**
 * qkv_build_mha_full:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @options: (nullable): a #QkvMhaOptions
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_mha() with everything optional in options (NULL: all zero).
 * Without biases it builds what qkv_build_mha_masked() builds. With
 * b->cache, a causal self-attention attends over its key/value cache
 * (QkvBuilderCache); *weights is then (B, heads, t, max_len), exactly 0 at
 * the slots a query does not see, and asking for it does not make a step
 * read past the filled slots.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_full(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                             QkvValue *values, gint64 num_hiddens, gint num_heads,
                             const QkvMhaOptions *options, QkvValue **weights, GError **error);

/**
 * qkv_build_mha_keys_values:
 * @b: a #QkvBuilder
 * @name: the name
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @options: (nullable): a #QkvMhaOptions
 * @projected_values: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The keys and values of the attention "<name>" projected and split into
 * heads as it projects them (its W_k, W_v and, with options->bias, their
 * biases; parameters created if missing, as qkv_build_mha_full() would):
 * keys (B, n_k, ·) and values (B, n_k, ·) → (B, heads, n_k, num_hiddens /
 * heads), the projected keys returned and the values in *projected_values.
 * What a cached builder's cross-attention takes with
 * QkvBuilderCache.cross_inputs. On failure NULL and *projected_values NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_keys_values(QkvBuilder *b, const gchar *name, QkvValue *keys,
                                    QkvValue *values, gint64 num_hiddens, gint num_heads,
                                    const QkvMhaOptions *options, QkvValue **projected_values,
                                    GError **error);

/**
 * QkvLuongScore:
 * @QKV_LUONG_DOT: h_tᵀ h̄_s (no parameters, no 1/√d scaling)
 * @QKV_LUONG_GENERAL: h_tᵀ W_a h̄_s; "<name>.W_a.weight" (H, H)
 * @QKV_LUONG_CONCAT: v_aᵀ tanh(W_a [h_t; h̄_s]); "<name>.W_a.weight" (H, 2H), whose first H columns
 *   take h_t, and "<name>.v_a.weight" (1, H)
 *
 * ---- Luong attention (Luong, Pham & Manning 2015, "Effective Approaches
 * to Attention-based Neural Machine Translation") ---------------------------
 *
 * A decoder state h_t (a query) scores every source state h̄_s (the encoder's
 * outputs), the scores go through a softmax over the source positions (a
 * masked softmax: positions at or past the sentence's valid length and, for
 * local attention, outside the window are masked as the book masks padding),
 * and the context c_t is the weighted sum of the h̄_s.
 */
typedef enum {
  QKV_LUONG_DOT,     /* h_tᵀ h̄_s (no parameters, no 1/√d scaling) */
  QKV_LUONG_GENERAL, /* h_tᵀ W_a h̄_s; "<name>.W_a.weight" (H, H) */
  /* v_aᵀ tanh(W_a [h_t; h̄_s]); "<name>.W_a.weight" (H, 2H), whose first H
   * columns take h_t, and "<name>.v_a.weight" (1, H) */
  QKV_LUONG_CONCAT,
} QkvLuongScore;

/**
 * QkvLuongAlign:
 * @QKV_LUONG_GLOBAL: every source position
 * @QKV_LUONG_LOCAL_M: local-m: the positions s with |s − p_t| ≤ D, p_t = min(t, S − 1) for the
 *   query at target position t (the paper's p_t = t, held at the sentence's last word so that a
 *   target longer than its source still sees one)
 * @QKV_LUONG_LOCAL_P: local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) ∈ [0, S], the positions |s −
 *   p_t| ≤ D, and the softmax's weights then multiplied (not renormalised, as in the paper's eq.
 *   10) by exp(−(s − p_t)² / (2σ²)), σ = D / 2; "<name>.W_p.weight" (H, H), "<name>.v_p.weight" (1,
 *   H). The window's edge passes no gradient; the Gaussian trains W_p and v_p.
 *
 * The luong align values.
 */
typedef enum {
  QKV_LUONG_GLOBAL, /* every source position */
  /* local-m: the positions s with |s − p_t| ≤ D, p_t = min(t, S − 1) for
   * the query at target position t (the paper's p_t = t, held at the
   * sentence's last word so that a target longer than its source still
   * sees one) */
  QKV_LUONG_LOCAL_M,
  /* local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) ∈ [0, S], the positions
   * |s − p_t| ≤ D, and the softmax's weights then multiplied (not
   * renormalised, as in the paper's eq. 10) by exp(−(s − p_t)² / (2σ²)),
   * σ = D / 2; "<name>.W_p.weight" (H, H), "<name>.v_p.weight" (1, H). The
   * window's edge passes no gradient; the Gaussian trains W_p and v_p. */
  QKV_LUONG_LOCAL_P,
} QkvLuongAlign;

/**
 * QkvLuongAttentionConfig:
 *
 * S above is the source sentence's own length, its valid length (the book's
 * valid lengths count <eos>), so p_t follows each sentence and not the
 * padded T_src; with no valid lengths it is T_src. Positions count from 0.
 */
typedef struct {
  QkvLuongScore score;
  QkvLuongAlign align;
  gint window; /* D, >= 1 for the local alignments; ignored for global */
  gpointer reserved[2];
} QkvLuongAttentionConfig;

/**
 * qkv_build_luong_attention:
 * @b: a #QkvBuilder
 * @name: the name
 * @cfg: a #QkvLuongAttentionConfig
 * @queries: a #QkvValue
 * @source: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @first_position: the first position
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Luong attention of queries (B, n_q, H) over source (B, S, H) (keys and
 * values both, as in the paper), with the parameters of cfg->score and
 * cfg->align under name ("decoder.attention"). src_valid: i32 (B) or NULL.
 * Query i sits at target position first_position + i (local-m reads it).
 * → context (B, n_q, H); *weights (may be NULL) receives the alignment
 * weights (B, n_q, S), the Gaussian included for local-p.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_attention(QkvBuilder *b, const gchar *name,
                                    const QkvLuongAttentionConfig *cfg, QkvValue *queries,
                                    QkvValue *source, QkvValue *src_valid, gint64 first_position,
                                    QkvValue **weights, GError **error);
/**
 * qkv_build_luong_attentional:
 * @b: a #QkvBuilder
 * @name: the name
 * @context: a #QkvValue
 * @h: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The attentional vector ã_t = tanh(W_c [c_t; h_t]) with no bias (eq. 5),
 * W_c "<name>.weight" (H, H_c + H): context (…, H_c), h (…, H) → (…, H).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_attentional(QkvBuilder *b, const gchar *name, QkvValue *context,
                                      QkvValue *h, GError **error);

/**
 * qkv_build_attention_pooling:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @num_queries: the num queries
 * @key_size: the key size
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Attention pooling with learned queries and scaled dot-product scores:
 * num_queries query vectors
 * "<name>.queries" (K, key_size), N(0, 1), attend over the T word vectors of
 * each sequence in x (B, T, D) f32, whose keys are "<name>.W_k" (no bias:
 * weight (key_size, D)) applied to them:
 *   scores = queries · (x W_kᵀ)ᵀ / √key_size                      (B, K, T)
 *   weights = masked_softmax(scores, valid_lens)                  (B, K, T)
 *   output = weights · x                                          (B, K, D)
 * Row k of the output is the weighted average of the word vectors under
 * query k. valid_lens (i32 (B), or NULL: every position counts) masks the
 * padding as masked_softmax does: a position ≥ the valid length gets weight
 * 0 exactly (a sequence of length 0 gets uniform weights, as in the book).
 * *weights (may be NULL) receives the weights (B, K, T). Follows the shapes
 * a plan is bound with (a shorter T, a partial batch).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x,
                                      QkvValue *valid_lens, gint num_queries, gint64 key_size,
                                      QkvValue **weights, GError **error);
/**
 * qkv_build_hard_attention_pooling:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @num_queries: the num queries
 * @key_size: the key size
 * @tau: the tau
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Hard attention pooling: as qkv_build_attention_pooling() (the same
 * parameters "<name>.queries" and "<name>.W_k", the same scores), but each
 * query takes one word vector instead of an average:
 *   weights = gumbel_softmax(scores, valid_lens, tau, hard)       (B, K, T)
 * one-hot rows: in plans compiled for training the position is sampled from
 * softmax(scores) (Gumbel-max), in evaluation it is the argmax of the
 * scores. A position ≥ the valid length is never picked (a sequence of
 * length 0 picks nothing and pools to zeros). The pick is not differentiable;
 * training goes through the straight-through Gumbel-softmax estimator: the
 * gradient of the one-hot is taken to be that of softmax((scores + g) / tau)
 * for the same noise g (qkv_gumbel_softmax()). tau finite and > 0 (1 is the
 * usual start); *weights (may be NULL) receives the one-hot weights.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_hard_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x,
                                           QkvValue *valid_lens, gint num_queries, gint64 key_size,
                                           double tau, QkvValue **weights, GError **error);
/**
 * qkv_build_mean_pooling:
 * @b: a #QkvBuilder
 * @x: (nullable): a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Mean pooling, the baseline: the average of the valid word vectors of each
 * sequence, as attention pooling with every score equal. x (B, T, D),
 * valid_lens i32 (B) or NULL → (B, 1, D); *weights (may be NULL) receives
 * the uniform weights (B, 1, T). No parameters.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mean_pooling(QkvBuilder *b, QkvValue *x, QkvValue *valid_lens,
                                 QkvValue **weights, GError **error);

/**
 * qkv_build_nw_regression:
 * @graph: a #QkvGraph
 * @params: a #QkvParams
 * @prefix: the prefix
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @seed: the seed
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Nadaraya-Watson kernel regression with one learned width w (parameter
 * "<prefix>w", shape (1)): for each query q_i,
 *   f(q_i) = Σ_j softmax_j(-((q_i - k_ij) · w)² / 2) · v_ij.
 * queries (n), keys (n, m), values (n, m) → predictions (n). If the store has
 * no "<prefix>w" yet it is created as U(0, 1) from seed, like torch.rand.
 * *weights (may be NULL) receives the attention weights (n, m).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                  QkvValue *queries, QkvValue *keys, QkvValue *values, guint64 seed,
                                  QkvValue **weights, GError **error);
/**
 * qkv_build_nw_regression_masked:
 * @graph: a #QkvGraph
 * @params: a #QkvParams
 * @prefix: the prefix
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @seed: the seed
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a boolean mask (f32 0/1, broadcast to (n, m); may be NULL):
 * a 0 leaves key j out of query i's softmax, as QKV_MASK_BOOLEAN does in
 * masked_softmax — the book's training, where each point attends to every
 * other point but itself.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_nw_regression_masked(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                         QkvValue *queries, QkvValue *keys, QkvValue *values,
                                         QkvValue *mask, guint64 seed, QkvValue **weights,
                                         GError **error);

G_END_DECLS
