/* qkv-nn.h: typed functions for the attention family of fused ops.
 *
 * Each is one registered op with a forward kernel and a fused backward op;
 * semantics follow Dive into Deep Learning (PyTorch edition), so models built
 * with them reproduce the book and load its weights. Weight matrices use
 * PyTorch's nn.Linear layout: (out_features, in_features).
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/**
 * QkvMaskKind:
 * @QKV_MASK_BOOLEAN: boolean
 * @QKV_MASK_ADDITIVE: additive
 *
 * How a mask input of the attention ops applies to the scores.
 *
 * QKV_MASK_BOOLEAN: a 0 masks the key out: its score becomes -1e6 before the
 *   softmax, exactly like a key beyond the valid length (so a row with every
 *   key masked comes out uniform, as in the book); any other value keeps it.
 *   No gradient reaches the mask.
 * QKV_MASK_ADDITIVE: the mask is added to the scores before the softmax
 *   (ALiBi-style biases, or -inf / -1e9 entries; a row whose every kept score
 *   is -inf gives NaN, as in PyTorch). Differentiable: its gradient is the
 *   gradient of the scores summed over the axes it was broadcast along, so
 *   learned biases train.
 *
 * The masks combine: an additive mask is added first, then valid lengths,
 * causal and a boolean mask each replace the scores they mask by -1e6. The
 * mask is f32 and broadcasts to the scores (…, n_q, n_k): its shape is
 * right-aligned against theirs and each axis must be 1 or the scores' size,
 * e.g. (n_k), (n_q, n_k), (B, 1, n_k), (B, n_q, n_k). Multi-head attention's
 * scores are (B, num_heads, n_q, n_k); there a rank-3 mask is (B, n_q, n_k)
 * (or (B, 1, n_k), …), shared by the heads like valid lengths, and a per-head
 * mask is rank 4: (B, H, n_q, n_k), or (1, H, n_q, n_k) for all batch
 * elements. Other shapes are refused with QKV_ERROR_SHAPE. Without a mask the
 * kernels run exactly as before masks existed.
 */
typedef enum {
  QKV_MASK_BOOLEAN,
  QKV_MASK_ADDITIVE,
} QkvMaskKind;

/**
 * qkv_masked_softmax:
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @causal: the causal
 * @error: return location for a #GError, or %NULL
 *
 * "masked_softmax" {causal: b, mask_kind: s}: softmax over the last axis of x
 * (…, n_q, n_k). valid_lens (may be NULL) is i32 of shape (B) — one length
 * per leading batch element, shared by all its queries — or (B, n_q) — one
 * per query, where B is x's first axis. Keys at positions ≥ the valid length
 * get -1e6 before the softmax, as the book does (a row of valid length 0
 * comes out uniform). causal masks keys after the query's position the same
 * way.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_masked_softmax(QkvValue *x, QkvValue *valid_lens, gboolean causal, GError **error);
/**
 * qkv_masked_softmax_full:
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @kind: the kind
 * @causal: the causal
 * @error: return location for a #GError, or %NULL
 *
 * The same with a mask (may be NULL) of the given kind (see QkvMaskKind). The
 * op's inputs are x, then valid_lens and mask where given.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_masked_softmax_full(QkvValue *x, QkvValue *valid_lens, QkvValue *mask,
                                  QkvMaskKind kind, gboolean causal, GError **error);

/**
 * qkv_dot_product_attention:
 * @q: a #QkvValue
 * @k: a #QkvValue
 * @v: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * "dot_product_attention" {causal: b, dropout: d}: softmax(Q Kᵀ / √d) V with
 * the masks of masked_softmax and dropout on the weights.
 * q (B, n_q, d), k (B, n_k, d), v (B, n_k, d_v) → (B, n_q, d_v).
 * *weights (may be NULL) receives the attention weights (B, n_q, n_k), before
 * dropout. With weights NULL and weights that would take 4 MiB or more, the
 * node runs the memory-efficient kernel ("flash" attribute): the weights are
 * made block by block and never stored, forward and backward, so memory is
 * O(n_q + n_k) per batch element instead of O(n_q·n_k); same masks, same
 * dropout draws, the same values up to float rounding.
 * QKV_FLASH_ATTENTION=1 takes it at every size, =0 never.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_dot_product_attention(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *valid_lens,
                                    gboolean causal, double dropout, QkvValue **weights,
                                    GError **error);
/**
 * qkv_dot_product_attention_masked:
 * @q: a #QkvValue
 * @k: a #QkvValue
 * @v: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @kind: the kind
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a mask (may be NULL) of the given kind, broadcasting to the
 * scores (B, n_q, n_k) (see QkvMaskKind).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_dot_product_attention_masked(QkvValue *q, QkvValue *k, QkvValue *v,
                                           QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                                           gboolean causal, double dropout, QkvValue **weights,
                                           GError **error);

/**
 * qkv_additive_attention:
 * @q: a #QkvValue
 * @k: a #QkvValue
 * @v: a #QkvValue
 * @w_q: a #QkvValue
 * @w_k: a #QkvValue
 * @w_v: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * "additive_attention" {dropout: d}: score(q, k) = w_vᵀ tanh(W_q q + W_k k),
 * masked softmax over keys, weighted sum of v.
 * q (B, n_q, q_size), k (B, n_k, k_size), v (B, n_k, v_size),
 * w_q (h, q_size), w_k (h, k_size), w_v (1, h) → (B, n_q, v_size).
 * *weights (may be NULL) receives (B, n_q, n_k).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_additive_attention(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *w_q,
                                 QkvValue *w_k, QkvValue *w_v, QkvValue *valid_lens, double dropout,
                                 QkvValue **weights, GError **error);

/**
 * qkv_multi_head_attention:
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @w_q: a #QkvValue
 * @w_k: a #QkvValue
 * @w_v: a #QkvValue
 * @w_o: a #QkvValue
 * @biases: a #QkvValue
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * "multi_head_attention" {num_heads: i, causal: b, dropout: d}: the book's
 * MultiHeadAttention as one op. queries (B, n_q, d_q), keys (B, n_k, d_k),
 * values (B, n_k, d_v); w_q (H, d_q), w_k (H, d_k), w_v (H, d_v), w_o (H, H);
 * biases: NULL (the book's default, bias=False) or an array of four (H)
 * vectors b_q, b_k, b_v, b_o. H must be a multiple of num_heads. valid_lens as
 * for masked_softmax, repeated for every head. → (B, n_q, H).
 * *weights (may be NULL) receives the per-head weights (B, num_heads, n_q, n_k).
 * With weights NULL the memory-efficient kernel runs as for
 * qkv_dot_product_attention (weights of 4 MiB or more; QKV_FLASH_ATTENTION).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_multi_head_attention(QkvValue *queries, QkvValue *keys, QkvValue *values,
                                   QkvValue *w_q, QkvValue *w_k, QkvValue *w_v, QkvValue *w_o,
                                   QkvValue *const *biases, gint num_heads, QkvValue *valid_lens,
                                   gboolean causal, double dropout, QkvValue **weights,
                                   GError **error);
/**
 * qkv_multi_head_attention_masked:
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @w_q: a #QkvValue
 * @w_k: a #QkvValue
 * @w_v: a #QkvValue
 * @w_o: a #QkvValue
 * @biases: a #QkvValue
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @kind: the kind
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a mask (may be NULL) of the given kind, broadcasting to the
 * per-head scores (B, num_heads, n_q, n_k) (see QkvMaskKind for the shapes).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_multi_head_attention_masked(QkvValue *queries, QkvValue *keys, QkvValue *values,
                                          QkvValue *w_q, QkvValue *w_k, QkvValue *w_v,
                                          QkvValue *w_o, QkvValue *const *biases, gint num_heads,
                                          QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                                          gboolean causal, double dropout, QkvValue **weights,
                                          GError **error);

/**
 * qkv_layer_norm:
 * @x: a #QkvValue
 * @gamma: a #QkvValue
 * @beta: a #QkvValue
 * @eps: the eps
 * @error: return location for a #GError, or %NULL
 *
 * "layer_norm" {eps: d}: normalise over the last axis, then · gamma + beta
 * (both of the last axis' size).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_layer_norm(QkvValue *x, QkvValue *gamma, QkvValue *beta, double eps, GError **error);

/**
 * qkv_position_wise_ffn:
 * @x: a #QkvValue
 * @w1: a #QkvValue
 * @b1: a #QkvValue
 * @w2: a #QkvValue
 * @b2: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "position_wise_ffn": dense (w1 (F, D), b1 (F)), ReLU, dense (w2 (D, F),
 * b2 (D)) over the last axis of x (…, D).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_position_wise_ffn(QkvValue *x, QkvValue *w1, QkvValue *b1, QkvValue *w2, QkvValue *b2,
                                GError **error);

/**
 * qkv_positional_encoding:
 * @x: a #QkvValue
 * @dropout: the dropout
 * @offset: the offset
 * @error: return location for a #GError, or %NULL
 *
 * "positional_encoding" {dropout: d}: x (B, T, d) + P[:T], with
 * P[pos, 2i] = sin(pos / 10000^(2i/d)), P[pos, 2i+1] = cos(pos / 10000^(2i/d)),
 * for any T and d, then dropout. The attribute offset (default 0) shifts the
 * positions, for decoding one step at a time.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_positional_encoding(QkvValue *x, double dropout, gint64 offset, GError **error);
/**
 * qkv_positional_encoding_at:
 * @x: a #QkvValue
 * @positions: a #QkvValue
 * @dropout: the dropout
 * @offset: the offset
 * @error: return location for a #GError, or %NULL
 *
 * The same with a second input, positions i32 (B) for x (B, T, d) or (1) for
 * x (T, d): batch element b's rows are positions offset + positions[b] …
 * offset + positions[b] + T - 1. A decode-step graph binds the step number
 * there, so one compiled plan gives every token its true position. No
 * gradient reaches positions.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_positional_encoding_at(QkvValue *x, QkvValue *positions, double dropout,
                                     gint64 offset, GError **error);

/**
 * qkv_dropout:
 * @x: a #QkvValue
 * @p: the p
 * @error: return location for a #GError, or %NULL
 *
 * "dropout" {p: d}: in plans compiled for training, zero each element with
 * probability p and scale the rest by 1/(1-p); the identity in evaluation.
 * Masks come from a counter-based generator keyed by (seed, step, node).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_dropout(QkvValue *x, double p, GError **error);

G_END_DECLS
