/* qkv-ops.h: typed functions for the built-in primitive ops.
 *
 * Each adds one node to the graph its inputs belong to and returns its
 * (first) output, or NULL with a QKV_ERROR and the graph unchanged. The same
 * ops are reachable by name through qkv_graph_add_node(); the op name and its
 * attributes are given in each comment.
 */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/* "matmul" {transpose_a: b, transpose_b: b}: a (…, M, K) · b (…, K, N) with
 * optional transposes of the last two axes. The batch axes must be equal, or
 * one side may have none (a weight shared by the whole batch). */
QKV_API
QkvValue *qkv_matmul(QkvValue *a, QkvValue *b, gboolean transpose_a, gboolean transpose_b,
                     GError **error);

/* "add", "sub", "mul", "div": elementwise with NumPy broadcasting. */
QKV_API
QkvValue *qkv_add(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_sub(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_mul(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_div(QkvValue *a, QkvValue *b, GError **error);
/* "scale" {factor: d}: x · factor. */
QKV_API
QkvValue *qkv_scale(QkvValue *x, double factor, GError **error);
/* "neg": -x. */
QKV_API
QkvValue *qkv_neg(QkvValue *x, GError **error);

/* "reshape" {shape: ax}: same elements, new shape; one dimension may be -1. */
QKV_API
QkvValue *qkv_reshape(QkvValue *x, const QkvShape *shape, GError **error);
/* "permute" {perm: ax}: output axis i is input axis perm[i]. */
QKV_API
QkvValue *qkv_permute(QkvValue *x, const gint *perm, guint n, GError **error);
/* Swap two axes (a "permute" node). */
QKV_API
QkvValue *qkv_transpose(QkvValue *x, gint axis0, gint axis1, GError **error);
/* "slice" {axis: i, start: x, end: x}: elements start ≤ i < end along axis;
 * negative start/end count from the end. */
QKV_API
QkvValue *qkv_slice(QkvValue *x, gint axis, gint64 start, gint64 end, GError **error);
/* "concat" {axis: i}: join n values along axis; other axes must agree. */
QKV_API
QkvValue *qkv_concat(QkvValue *const *xs, guint n, gint axis, GError **error);

/* "sum", "mean" {axes: ax, keepdims: b}: reduce over the axes given (all
 * axes when n_axes is 0). */
QKV_API
QkvValue *qkv_sum(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
QKV_API
QkvValue *qkv_mean(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
/* "sum_to" {shape: ax}: sum x down to a shape it was broadcast from. */
QKV_API
QkvValue *qkv_sum_to(QkvValue *x, const QkvShape *shape, GError **error);
/* "broadcast_to" {shape: ax}: repeat x to a shape it broadcasts to. */
QKV_API
QkvValue *qkv_broadcast_to(QkvValue *x, const QkvShape *shape, GError **error);

/* Elementwise "relu", "sigmoid", "tanh", "exp", "log". */
QKV_API
QkvValue *qkv_relu(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_sigmoid(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_tanh(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_exp(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_log(QkvValue *x, GError **error);

/* "gelu" {approximate: s}: x · Φ(x) = ½ x (1 + erf(x / √2)) for approximate
 * "none" (or NULL), ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))) for "tanh", as
 * torch.nn.GELU(approximate=…); any other string is QKV_ERROR_ATTRIBUTE. */
QKV_API
QkvValue *qkv_gelu(QkvValue *x, const gchar *approximate, GError **error);
/* "silu": x · sigmoid(x) (SiLU, also called swish), as torch.nn.SiLU. */
QKV_API
QkvValue *qkv_silu(QkvValue *x, GError **error);
/* "rms_norm" {eps: d}: x / √(mean(x²) + eps) · weight over the last axis, as
 * torch.nn.RMSNorm (LLaMA's RMSNorm). weight is a vector of the last axis'
 * size, or NULL for none (elementwise_affine=False). PyTorch's eps=None is
 * FLT_EPSILON; LLaMA uses 1e-6 or 1e-5. The op's second output is the
 * per-row 1 / √(mean(x²) + eps), which its backward op reads. */
QKV_API
QkvValue *qkv_rms_norm(QkvValue *x, QkvValue *weight, double eps, GError **error);

/* "softmax" and "log_softmax" over the last axis. */
QKV_API
QkvValue *qkv_softmax(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_log_softmax(QkvValue *x, GError **error);

/* "embedding" {zero_out_of_range: b (FALSE here)}: ids (i32, any shape)
 * pick rows of weight (V, D) → (…, D). An id outside [0, V) fails the plan's
 * run with QKV_ERROR_INDEX naming the node, the position and the value; a
 * node added by name with zero_out_of_range = TRUE (qkv_graph_op) gives a
 * zero row and no gradient for it instead (a padding id past the table). */
QKV_API
QkvValue *qkv_embedding(QkvValue *ids, QkvValue *weight, GError **error);

typedef enum {
  QKV_REDUCTION_NONE,
  QKV_REDUCTION_SUM,
  QKV_REDUCTION_MEAN,
} QkvReduction;

/* "cross_entropy" {reduction: s ("none", "sum", "mean"), label_smoothing: d
 * (0 here; see qkv_cross_entropy_smoothed), ignore_index: i (−100 here; see
 * qkv_cross_entropy_ignore)}: logits (…, C), targets i32 (…), optional
 * weight f32 (…) that multiplies each token's loss (a mask, for instance);
 * NULL for none. "none" gives the per-token loss (shape of targets); "mean"
 * divides the weighted sum by the number of targets not ignored (0 when
 * there are none). A target equal to ignore_index adds 0 and takes no
 * gradient, as PyTorch's; any other target outside [0, C) fails the plan's
 * run with QKV_ERROR_INDEX naming the node, the row and the value. The weight
 * takes a gradient (the per-token loss times dloss) as the logits do. */
QKV_API
QkvValue *qkv_cross_entropy(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                            QkvReduction reduction, GError **error);
/* The same with label smoothing ε in [0, 1] (attribute "label_smoothing"), as
 * PyTorch's label_smoothing=: each token's target distribution is
 * (1 − ε) onehot(target) + ε / C, so its loss is (1 − ε)(−log p_target) +
 * ε mean_j(−log p_j). ε = 0 is qkv_cross_entropy. */
QKV_API
QkvValue *qkv_cross_entropy_smoothed(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                                     QkvReduction reduction, double label_smoothing,
                                     GError **error);
/* The same with the targets to ignore (attribute "ignore_index"; PyTorch's
 * ignore_index=, which may also be a class in [0, C)). Label smoothing
 * leaves ignored targets out of both of its terms, as PyTorch does. */
QKV_API
QkvValue *qkv_cross_entropy_ignore(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                                   QkvReduction reduction, double label_smoothing,
                                   gint64 ignore_index, GError **error);
/* "mse" {reduction: s}: (pred - target)², reduced. */
QKV_API
QkvValue *qkv_mse(QkvValue *pred, QkvValue *target, QkvReduction reduction, GError **error);

/* Gradient ops that the rules above add; usable directly too. */
/* "relu_backward": dy · (y > 0), given the forward output y. */
QKV_API
QkvValue *qkv_relu_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "sigmoid_backward": dy · y (1 - y). */
QKV_API
QkvValue *qkv_sigmoid_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "tanh_backward": dy · (1 - y²). */
QKV_API
QkvValue *qkv_tanh_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "gelu_backward" {approximate: s}: dy · gelu'(x), given gelu's input x. */
QKV_API
QkvValue *qkv_gelu_backward(QkvValue *dy, QkvValue *x, const gchar *approximate, GError **error);
/* "silu_backward": dy · s (1 + x (1 - s)), s = sigmoid(x), given silu's input x. */
QKV_API
QkvValue *qkv_silu_backward(QkvValue *dy, QkvValue *x, GError **error);
/* "softmax_backward": y · (dy - Σ dy·y), over the last axis. */
QKV_API
QkvValue *qkv_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "log_softmax_backward": dy - exp(y) Σ dy, over the last axis. */
QKV_API
QkvValue *qkv_log_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "embedding_backward" {num_embeddings: x}: scatter-add dy rows into a
 * (num_embeddings, D) gradient. */
QKV_API
QkvValue *qkv_embedding_backward(QkvValue *dy, QkvValue *ids, gint64 num_embeddings,
                                 GError **error);
/* "cross_entropy_backward" {reduction: s}: d loss / d logits. */
QKV_API
QkvValue *qkv_cross_entropy_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                     QkvValue *weight, QkvReduction reduction, GError **error);
/* The same {reduction: s, label_smoothing: d}: (softmax − (1 − ε) onehot − ε / C)
 * · weight · dloss. */
QKV_API
QkvValue *qkv_cross_entropy_backward_smoothed(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                              QkvValue *weight, QkvReduction reduction,
                                              double label_smoothing, GError **error);
/* The same {…, ignore_index: i}: rows whose target is ignore_index get 0, and
 * "mean" divides by the targets not ignored. */
QKV_API
QkvValue *qkv_cross_entropy_backward_ignore(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                            QkvValue *weight, QkvReduction reduction,
                                            double label_smoothing, gint64 ignore_index,
                                            GError **error);
/* "cross_entropy_weight_backward" {reduction: s, label_smoothing: d,
 * ignore_index: i}: d loss / d weight, the per-token loss without the weight
 * times dloss (/ the targets not ignored for "mean"); shape of targets. */
QKV_API
QkvValue *qkv_cross_entropy_weight_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                            QkvReduction reduction, double label_smoothing,
                                            gint64 ignore_index, GError **error);
/* "slice_backward" {shape: ax, axis: i, start: x}: place dy into zeros of the
 * input's shape at start along axis. Only the size along axis is fixed: on the
 * other axes the output takes dy's size, which may be smaller than
 * input_shape's (a plan run at a smaller batch), never bigger. */
QKV_API
QkvValue *qkv_slice_backward(QkvValue *dy, const QkvShape *input_shape, gint axis, gint64 start,
                             GError **error);

/* ---- comparisons, selection and indexing ------------------------------- */

/* "eq", "ne", "lt", "le", "gt", "ge": 1 where the comparison holds, else 0,
 * as f32, with NumPy broadcasting; a and b both f32 or both i32. NaN
 * compares unequal to everything. No gradient: the output is piecewise
 * constant, so a and b get none (a zero gradient) through it. */
QKV_API
QkvValue *qkv_eq(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_ne(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_lt(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_le(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_gt(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_ge(QkvValue *a, QkvValue *b, GError **error);
/* "maximum", "minimum": the larger (smaller) of a and b elementwise, with
 * broadcasting; NaN in either gives NaN. The gradient goes to the input
 * picked and is split in half on ties (PyTorch's convention). */
QKV_API
QkvValue *qkv_maximum(QkvValue *a, QkvValue *b, GError **error);
QKV_API
QkvValue *qkv_minimum(QkvValue *a, QkvValue *b, GError **error);
/* "where": a where cond is nonzero, else b. cond is f32 or i32 (a NaN is
 * nonzero, so true); all three broadcast. Gradient to a and b (none to cond). */
QKV_API
QkvValue *qkv_where(QkvValue *cond, QkvValue *a, QkvValue *b, GError **error);
/* "masked_fill" {value: d}: x with value where mask (f32 or i32,
 * broadcasting to x's shape) is nonzero. Zero gradient there. */
QKV_API
QkvValue *qkv_masked_fill(QkvValue *x, QkvValue *mask, double value, GError **error);
/* "sequence_mask" {maxlen: x}: from i32 valid_lens (B) or (B, Q) (any
 * shape …), the f32 mask (…, maxlen) that is 1 where t < valid_lens. */
QKV_API
QkvValue *qkv_sequence_mask(QkvValue *valid_lens, gint64 maxlen, GError **error);
/* The same with maxlen the last dim of like (any dtype, read for its shape
 * only): the mask follows a plan's bound shapes (see qkv-plan.h). */
QKV_API
QkvValue *qkv_sequence_mask_like(QkvValue *valid_lens, QkvValue *like, GError **error);
/* "clamp" {min: d, max: d}: x limited to [lo, hi] (-INFINITY / INFINITY
 * for no bound; lo > hi is an error); NaN passes through. The gradient
 * passes where lo ≤ x ≤ hi, bounds included (as PyTorch's). */
QKV_API
QkvValue *qkv_clamp(QkvValue *x, double lo, double hi, GError **error);

/* Elementwise "abs" (gradient sign(x), 0 at 0), "sign" (-1, 0 or 1; no
 * gradient), "sqrt" and "square". */
QKV_API
QkvValue *qkv_abs(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_sign(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_sqrt(QkvValue *x, GError **error);
QKV_API
QkvValue *qkv_square(QkvValue *x, GError **error);
/* "pow" {exponent: d}: x^exponent elementwise (the exponent rounded to f32);
 * gradient exponent · x^(exponent-1), 0 when exponent is 0. */
QKV_API
QkvValue *qkv_pow(QkvValue *x, double exponent, GError **error);
/* "pow_tensor": x^exponent elementwise for two f32 tensors that broadcast
 * together, as torch.pow(x, y). Gradients as PyTorch's: exponent ·
 * x^(exponent-1) for x (0 where exponent is 0) and x^exponent · log(x) for
 * the exponent (0 where x is 0 and exponent ≥ 0; NaN for negative x). */
QKV_API
QkvValue *qkv_pow_tensor(QkvValue *x, QkvValue *exponent, GError **error);

/* "max", "min" {axis: i, keepdims: b}: the largest (smallest) element of x
 * along axis, and in *indices (may be NULL) its i32 index. Ties give the
 * first index; a NaN beats every number. The gradient of the values goes to
 * the picked element. */
QKV_API
QkvValue *qkv_max(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error);
QKV_API
QkvValue *qkv_min(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error);
/* "argmax", "argmin" {axis: i, keepdims: b}: the i32 index alone. */
QKV_API
QkvValue *qkv_argmax(QkvValue *x, gint axis, gboolean keepdims, GError **error);
QKV_API
QkvValue *qkv_argmin(QkvValue *x, gint axis, gboolean keepdims, GError **error);

/* "cast" {dtype: s}: x as f32 or i32. f32 → i32 truncates toward zero; NaN
 * gives 0 and values beyond the i32 range saturate. Only f32 → f32 passes a
 * gradient. */
QKV_API
QkvValue *qkv_cast(QkvValue *x, QkvDType dtype, GError **error);
/* "unsqueeze" {axis: i}: a new axis of size 1 at axis (-(rank+1) ≤ axis ≤
 * rank). */
QKV_API
QkvValue *qkv_unsqueeze(QkvValue *x, gint axis, GError **error);
/* "squeeze" {axes: ax}: drop the given axes, which must have size 1 (every
 * axis of size 1 when n_axes is 0). */
QKV_API
QkvValue *qkv_squeeze(QkvValue *x, const gint *axes, guint n_axes, GError **error);
/* "expand" {shape: ax}: x repeated along its axes of size 1 and along new
 * leading axes to shape; -1 keeps x's size. The gradient sums over the
 * repeats. */
QKV_API
QkvValue *qkv_expand(QkvValue *x, const QkvShape *shape, GError **error);
/* "gather" {axis: i, zero_out_of_range: b (FALSE here)}: y[…, k, …] =
 * x[…, index[…, k, …], …] along axis, as torch.gather: index (i32) has x's
 * rank and is no larger off the axis; y has index's shape. An index outside
 * [0, size) fails the run as embedding's ids do, or with zero_out_of_range
 * (by name) gives 0. */
QKV_API
QkvValue *qkv_gather(QkvValue *x, QkvValue *index, gint axis, GError **error);
/* "index_select" {axis: i, zero_out_of_range: b (FALSE here)}: the slices of
 * x at positions index (i32, rank 1) along axis. An index outside [0, size)
 * fails the run, or with zero_out_of_range (by name) gives a zero slice. */
QKV_API
QkvValue *qkv_index_select(QkvValue *x, QkvValue *index, gint axis, GError **error);

/* Gradient ops of the above, scatter-adding (indices out of range skipped). */
/* "gather_backward" {shape: ax, axis: i}: zeros of input_shape, dy added at index. */
QKV_API
QkvValue *qkv_gather_backward(QkvValue *dy, QkvValue *index, const QkvShape *input_shape, gint axis,
                              GError **error);
/* "index_select_backward" {size: x, axis: i}: zeros with size along axis, the
 * slices of dy added at index. */
QKV_API
QkvValue *qkv_index_select_backward(QkvValue *dy, QkvValue *index, gint64 size, gint axis,
                                    GError **error);
/* "clamp_backward" {min: d, max: d}: dy where lo ≤ x ≤ hi, else 0. */
QKV_API
QkvValue *qkv_clamp_backward(QkvValue *dy, QkvValue *x, double lo, double hi, GError **error);

/* "gumbel_softmax" {tau: d, hard: b, axis: i}: one position of each row of
 * logits along axis: in plans compiled for training a sample, argmax of
 * logits + g with g standard Gumbel noise from (seed, step, node) (position j
 * with probability softmax(logits)_j); in evaluation the argmax of logits.
 * With hard, the result is the pick's one-hot (output 1 of the node is the
 * relaxation softmax((logits + g) / tau)), whose gradient is taken to be the
 * relaxation's (straight-through Gumbel-softmax, PyTorch's
 * gumbel_softmax(hard=True)); without hard the result is the relaxation.
 * valid_lens (may be NULL) i32 (B) or (B, n_q) for logits (B, …, n_q, n) and
 * axis -1, as for qkv_masked_softmax(): positions at or past the valid
 * length are never picked; a row with none picks nothing (all zeros). */
QKV_API
QkvValue *qkv_gumbel_softmax(QkvValue *logits, QkvValue *valid_lens, double tau, gboolean hard,
                             gint axis, GError **error);

/* The key/value cache of incremental decoding: writes fresh (B, H, t, d)
 * into the state cache (B, H, T_max, d, a qkv_graph_state()) at positions
 * [b] … positions[b] + t − 1 in place and returns the cache after the write;
 * *lengths (when not NULL) gets positions + t, i32 (B), the valid lengths
 * for dot-product attention. The state keeps the slots for the next run.
 * Inference only (no gradient). */
QKV_API
QkvValue *qkv_kv_cache_append(QkvValue *cache, QkvValue *fresh, QkvValue *positions,
                              QkvValue **lengths, GError **error);
/* "positions" {offset: i}: the i32 positions of x's T tokens, T = x's axis
 * 1 (axis 0 for a rank-1 x; only x's shape is read, on every run, so a plan
 * bound to a shorter x gives fewer). Without starts (may be NULL): (T), the
 * positions offset … offset + T − 1, as torch.arange. With starts, i32 (B)
 * for x (B, T, …): (B, T), row b's positions starts[b] + offset + i, the
 * positions of new tokens appended to each row's cache at starts[b] (offset
 * 1 gives their causal valid lengths). No gradient. */
QKV_API
QkvValue *qkv_positions(QkvValue *x, QkvValue *starts, gint64 offset, GError **error);

G_END_DECLS
