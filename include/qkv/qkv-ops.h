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

/**
 * qkv_matmul:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @transpose_a: the transpose a
 * @transpose_b: the transpose b
 * @error: return location for a #GError, or %NULL
 *
 * "matmul" {transpose_a: b, transpose_b: b}: a (…, M, K) · b (…, K, N) with
 * optional transposes of the last two axes. The batch axes must be equal, or
 * one side may have none (a weight shared by the whole batch).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_matmul(QkvValue *a, QkvValue *b, gboolean transpose_a, gboolean transpose_b,
                     GError **error);

/**
 * qkv_add:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "add", "sub", "mul", "div": elementwise with NumPy broadcasting.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_add(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_sub:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_add().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sub(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_mul:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_add().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_mul(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_div:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_add().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_div(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_scale:
 * @x: a #QkvValue
 * @factor: the factor
 * @error: return location for a #GError, or %NULL
 *
 * "scale" {factor: d}: x · factor.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_scale(QkvValue *x, double factor, GError **error);
/**
 * qkv_neg:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "neg": -x.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_neg(QkvValue *x, GError **error);

/**
 * qkv_reshape:
 * @x: a #QkvValue
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * "reshape" {shape: ax}: same elements, new shape; one dimension may be -1.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_reshape(QkvValue *x, const QkvShape *shape, GError **error);
/**
 * qkv_permute:
 * @x: a #QkvValue
 * @perm: (array length=n): the perm, @n of them
 * @n: the number of @perm
 * @error: return location for a #GError, or %NULL
 *
 * "permute" {perm: ax}: output axis i is input axis perm[i].
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_permute(QkvValue *x, const gint *perm, guint n, GError **error);
/**
 * qkv_transpose:
 * @x: a #QkvValue
 * @axis0: the axis0
 * @axis1: the axis1
 * @error: return location for a #GError, or %NULL
 *
 * Swap two axes (a "permute" node).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_transpose(QkvValue *x, gint axis0, gint axis1, GError **error);
/**
 * qkv_slice:
 * @x: a #QkvValue
 * @axis: the axis
 * @start: the start
 * @end: the end
 * @error: return location for a #GError, or %NULL
 *
 * "slice" {axis: i, start: x, end: x}: elements start ≤ i < end along axis;
 * negative start/end count from the end.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_slice(QkvValue *x, gint axis, gint64 start, gint64 end, GError **error);
/**
 * qkv_concat:
 * @xs: (array length=n): the xs, @n of them
 * @n: the number of @xs
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "concat" {axis: i}: join n values along axis; other axes must agree.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_concat(QkvValue *const *xs, guint n, gint axis, GError **error);

/**
 * qkv_sum:
 * @x: a #QkvValue
 * @axes: (array length=n_axes) (nullable): the axes, @n_axes of them
 * @n_axes: the number of @axes
 * @keepdims: the keepdims
 * @error: return location for a #GError, or %NULL
 *
 * "sum", "mean" {axes: ax, keepdims: b}: reduce over the axes given (all
 * axes when n_axes is 0).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sum(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
/**
 * qkv_mean:
 * @x: a #QkvValue
 * @axes: (array length=n_axes) (nullable): the axes, @n_axes of them
 * @n_axes: the number of @axes
 * @keepdims: the keepdims
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_sum().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_mean(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
/**
 * qkv_sum_to:
 * @x: a #QkvValue
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * "sum_to" {shape: ax}: sum x down to a shape it was broadcast from.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sum_to(QkvValue *x, const QkvShape *shape, GError **error);
/**
 * qkv_broadcast_to:
 * @x: a #QkvValue
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * "broadcast_to" {shape: ax}: repeat x to a shape it broadcasts to.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_broadcast_to(QkvValue *x, const QkvShape *shape, GError **error);

/**
 * qkv_relu:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * Elementwise "relu", "sigmoid", "tanh", "exp", "log".
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_relu(QkvValue *x, GError **error);
/**
 * qkv_sigmoid:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_relu().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sigmoid(QkvValue *x, GError **error);
/**
 * qkv_tanh:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_relu().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_tanh(QkvValue *x, GError **error);
/**
 * qkv_exp:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_relu().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_exp(QkvValue *x, GError **error);
/**
 * qkv_log:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_relu().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_log(QkvValue *x, GError **error);

/**
 * qkv_gelu:
 * @x: (nullable): a #QkvValue
 * @approximate: (nullable): the approximate
 * @error: return location for a #GError, or %NULL
 *
 * "gelu" {approximate: s}: x · Φ(x) = ½ x (1 + erf(x / √2)) for approximate
 * "none" (or NULL), ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))) for "tanh", as
 * torch.nn.GELU(approximate=…); any other string is QKV_ERROR_ATTRIBUTE.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gelu(QkvValue *x, const gchar *approximate, GError **error);
/**
 * qkv_silu:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "silu": x · sigmoid(x) (SiLU, also called swish), as torch.nn.SiLU.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_silu(QkvValue *x, GError **error);
/**
 * qkv_rms_norm:
 * @x: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @eps: the eps
 * @error: return location for a #GError, or %NULL
 *
 * "rms_norm" {eps: d}: x / √(mean(x²) + eps) · weight over the last axis, as
 * torch.nn.RMSNorm (LLaMA's RMSNorm). weight is a vector of the last axis'
 * size, or NULL for none (elementwise_affine=False). PyTorch's eps=None is
 * FLT_EPSILON; LLaMA uses 1e-6 or 1e-5. The op's second output is the
 * per-row 1 / √(mean(x²) + eps), which its backward op reads.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_rms_norm(QkvValue *x, QkvValue *weight, double eps, GError **error);

/**
 * qkv_softmax:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "softmax" and "log_softmax" over the last axis.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_softmax(QkvValue *x, GError **error);
/**
 * qkv_log_softmax:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_softmax().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_log_softmax(QkvValue *x, GError **error);

/**
 * qkv_embedding:
 * @ids: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "embedding" {zero_out_of_range: b (FALSE here)}: ids (i32, any shape)
 * pick rows of weight (V, D) → (…, D). An id outside [0, V) fails the plan's
 * run with QKV_ERROR_INDEX naming the node, the position and the value; a
 * node added by name with zero_out_of_range = TRUE (qkv_graph_op) gives a
 * zero row and no gradient for it instead (a padding id past the table).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_embedding(QkvValue *ids, QkvValue *weight, GError **error);

/**
 * QkvReduction:
 * @QKV_REDUCTION_NONE: none
 * @QKV_REDUCTION_SUM: sum
 * @QKV_REDUCTION_MEAN: mean
 *
 * The reduction values. The loss functions refuse any other value with
 * QKV_ERROR_INVALID_ARGUMENT naming the function and the value.
 */
typedef enum {
  QKV_REDUCTION_NONE,
  QKV_REDUCTION_SUM,
  QKV_REDUCTION_MEAN,
} QkvReduction;

/**
 * qkv_cross_entropy:
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @error: return location for a #GError, or %NULL
 *
 * "cross_entropy" {reduction: s ("none", "sum", "mean"), label_smoothing: d
 * (0 here; see qkv_cross_entropy_smoothed), ignore_index: i (−100 here; see
 * qkv_cross_entropy_ignore)}: logits (…, C), targets i32 (…), optional
 * weight f32 (…) that multiplies each token's loss (a mask, for instance);
 * NULL for none. "none" gives the per-token loss (shape of targets); "mean"
 * divides the weighted sum by the number of targets not ignored (0 when
 * there are none). A target equal to ignore_index adds 0 and takes no
 * gradient, as PyTorch's; any other target outside [0, C) fails the plan's
 * run with QKV_ERROR_INDEX naming the node, the row and the value. The weight
 * takes a gradient (the per-token loss times dloss) as the logits do.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                            QkvReduction reduction, GError **error);
/**
 * qkv_cross_entropy_smoothed:
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @label_smoothing: the label smoothing
 * @error: return location for a #GError, or %NULL
 *
 * The same with label smoothing ε in [0, 1] (attribute "label_smoothing"), as
 * PyTorch's label_smoothing=: each token's target distribution is
 * (1 − ε) onehot(target) + ε / C, so its loss is (1 − ε)(−log p_target) +
 * ε mean_j(−log p_j). ε = 0 is qkv_cross_entropy.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_smoothed(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                                     QkvReduction reduction, double label_smoothing,
                                     GError **error);
/**
 * qkv_cross_entropy_ignore:
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @label_smoothing: the label smoothing
 * @ignore_index: the ignore index
 * @error: return location for a #GError, or %NULL
 *
 * The same with the targets to ignore (attribute "ignore_index"; PyTorch's
 * ignore_index=, which may also be a class in [0, C)). Label smoothing
 * leaves ignored targets out of both of its terms, as PyTorch does.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_ignore(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                                   QkvReduction reduction, double label_smoothing,
                                   gint64 ignore_index, GError **error);
/**
 * qkv_mse:
 * @pred: a #QkvValue
 * @target: a #QkvValue
 * @reduction: the reduction
 * @error: return location for a #GError, or %NULL
 *
 * "mse" {reduction: s}: (pred - target)², reduced.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_mse(QkvValue *pred, QkvValue *target, QkvReduction reduction, GError **error);

/* Gradient ops that the rules above add; usable directly too. */
/**
 * qkv_relu_backward:
 * @dy: a #QkvValue
 * @y: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "relu_backward": dy · (y > 0), given the forward output y.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_relu_backward(QkvValue *dy, QkvValue *y, GError **error);
/**
 * qkv_sigmoid_backward:
 * @dy: a #QkvValue
 * @y: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "sigmoid_backward": dy · y (1 - y).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sigmoid_backward(QkvValue *dy, QkvValue *y, GError **error);
/**
 * qkv_tanh_backward:
 * @dy: a #QkvValue
 * @y: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "tanh_backward": dy · (1 - y²).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_tanh_backward(QkvValue *dy, QkvValue *y, GError **error);
/**
 * qkv_gelu_backward:
 * @dy: a #QkvValue
 * @x: a #QkvValue
 * @approximate: the approximate
 * @error: return location for a #GError, or %NULL
 *
 * "gelu_backward" {approximate: s}: dy · gelu'(x), given gelu's input x.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gelu_backward(QkvValue *dy, QkvValue *x, const gchar *approximate, GError **error);
/**
 * qkv_silu_backward:
 * @dy: a #QkvValue
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "silu_backward": dy · s (1 + x (1 - s)), s = sigmoid(x), given silu's input x.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_silu_backward(QkvValue *dy, QkvValue *x, GError **error);
/**
 * qkv_softmax_backward:
 * @dy: a #QkvValue
 * @y: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "softmax_backward": y · (dy - Σ dy·y), over the last axis.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/**
 * qkv_log_softmax_backward:
 * @dy: a #QkvValue
 * @y: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "log_softmax_backward": dy - exp(y) Σ dy, over the last axis.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_log_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/**
 * qkv_embedding_backward:
 * @dy: a #QkvValue
 * @ids: a #QkvValue
 * @num_embeddings: the num embeddings
 * @error: return location for a #GError, or %NULL
 *
 * "embedding_backward" {num_embeddings: x}: scatter-add dy rows into a
 * (num_embeddings, D) gradient.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_embedding_backward(QkvValue *dy, QkvValue *ids, gint64 num_embeddings,
                                 GError **error);
/**
 * qkv_cross_entropy_backward:
 * @dloss: a #QkvValue
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @error: return location for a #GError, or %NULL
 *
 * "cross_entropy_backward" {reduction: s}: d loss / d logits.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                     QkvValue *weight, QkvReduction reduction, GError **error);
/**
 * qkv_cross_entropy_backward_smoothed:
 * @dloss: a #QkvValue
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @label_smoothing: the label smoothing
 * @error: return location for a #GError, or %NULL
 *
 * The same {reduction: s, label_smoothing: d}: (softmax − (1 − ε) onehot − ε / C)
 * · weight · dloss.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_backward_smoothed(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                              QkvValue *weight, QkvReduction reduction,
                                              double label_smoothing, GError **error);
/**
 * qkv_cross_entropy_backward_ignore:
 * @dloss: a #QkvValue
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @weight: (nullable): a #QkvValue
 * @reduction: the reduction
 * @label_smoothing: the label smoothing
 * @ignore_index: the ignore index
 * @error: return location for a #GError, or %NULL
 *
 * The same {…, ignore_index: i}: rows whose target is ignore_index get 0, and
 * "mean" divides by the targets not ignored.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_backward_ignore(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                            QkvValue *weight, QkvReduction reduction,
                                            double label_smoothing, gint64 ignore_index,
                                            GError **error);
/**
 * qkv_cross_entropy_weight_backward:
 * @dloss: a #QkvValue
 * @logits: a #QkvValue
 * @targets: a #QkvValue
 * @reduction: the reduction
 * @label_smoothing: the label smoothing
 * @ignore_index: the ignore index
 * @error: return location for a #GError, or %NULL
 *
 * "cross_entropy_weight_backward" {reduction: s, label_smoothing: d,
 * ignore_index: i}: d loss / d weight, the per-token loss without the weight
 * times dloss (/ the targets not ignored for "mean"); shape of targets.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cross_entropy_weight_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                            QkvReduction reduction, double label_smoothing,
                                            gint64 ignore_index, GError **error);
/**
 * qkv_slice_backward:
 * @dy: a #QkvValue
 * @input_shape: a #QkvShape
 * @axis: the axis
 * @start: the start
 * @error: return location for a #GError, or %NULL
 *
 * "slice_backward" {shape: ax, axis: i, start: x}: place dy into zeros of the
 * input's shape at start along axis. Only the size along axis is fixed: on the
 * other axes the output takes dy's size, which may be smaller than
 * input_shape's (a plan run at a smaller batch), never bigger.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_slice_backward(QkvValue *dy, const QkvShape *input_shape, gint axis, gint64 start,
                             GError **error);

/* ---- comparisons, selection and indexing ------------------------------- */

/**
 * qkv_eq:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "eq", "ne", "lt", "le", "gt", "ge": 1 where the comparison holds, else 0,
 * as f32, with NumPy broadcasting; a and b both f32 or both i32. NaN
 * compares unequal to everything. No gradient: the output is piecewise
 * constant, so a and b get none (a zero gradient) through it.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_eq(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_ne:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_eq().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_ne(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_lt:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_eq().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_lt(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_le:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_eq().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_le(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_gt:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_eq().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gt(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_ge:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_eq().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_ge(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_maximum:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "maximum", "minimum": the larger (smaller) of a and b elementwise, with
 * broadcasting; NaN in either gives NaN. The gradient goes to the input
 * picked and is split in half on ties (PyTorch's convention).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_maximum(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_minimum:
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_maximum().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_minimum(QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_where:
 * @cond: a #QkvValue
 * @a: a #QkvValue
 * @b: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "where": a where cond is nonzero, else b. cond is f32 or i32 (a NaN is
 * nonzero, so true); all three broadcast. Gradient to a and b (none to cond).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_where(QkvValue *cond, QkvValue *a, QkvValue *b, GError **error);
/**
 * qkv_masked_fill:
 * @x: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @value: the value
 * @error: return location for a #GError, or %NULL
 *
 * "masked_fill" {value: d}: x with value where mask (f32 or i32,
 * broadcasting to x's shape) is nonzero. Zero gradient there.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_masked_fill(QkvValue *x, QkvValue *mask, double value, GError **error);
/**
 * qkv_sequence_mask:
 * @valid_lens: a #QkvValue
 * @maxlen: the maxlen
 * @error: return location for a #GError, or %NULL
 *
 * "sequence_mask" {maxlen: x}: from i32 valid_lens (B) or (B, Q) (any
 * shape …), the f32 mask (…, maxlen) that is 1 where t < valid_lens.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sequence_mask(QkvValue *valid_lens, gint64 maxlen, GError **error);
/**
 * qkv_sequence_mask_like:
 * @valid_lens: a #QkvValue
 * @like: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The same with maxlen the last dim of like (any dtype, read for its shape
 * only): the mask follows a plan's bound shapes (see qkv-plan.h).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sequence_mask_like(QkvValue *valid_lens, QkvValue *like, GError **error);
/**
 * qkv_clamp:
 * @x: a #QkvValue
 * @lo: the lo
 * @hi: the hi
 * @error: return location for a #GError, or %NULL
 *
 * "clamp" {min: d, max: d}: x limited to [lo, hi] (-INFINITY / INFINITY
 * for no bound; lo > hi is an error); NaN passes through. The gradient
 * passes where lo ≤ x ≤ hi, bounds included (as PyTorch's).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_clamp(QkvValue *x, double lo, double hi, GError **error);

/**
 * qkv_abs:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * Elementwise "abs" (gradient sign(x), 0 at 0), "sign" (-1, 0 or 1; no
 * gradient), "sqrt" and "square".
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_abs(QkvValue *x, GError **error);
/**
 * qkv_sign:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_abs().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sign(QkvValue *x, GError **error);
/**
 * qkv_sqrt:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_abs().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_sqrt(QkvValue *x, GError **error);
/**
 * qkv_square:
 * @x: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_abs().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_square(QkvValue *x, GError **error);
/**
 * qkv_pow:
 * @x: a #QkvValue
 * @exponent: the exponent
 * @error: return location for a #GError, or %NULL
 *
 * "pow" {exponent: d}: x^exponent elementwise (the exponent rounded to f32);
 * gradient exponent · x^(exponent-1), 0 when exponent is 0.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_pow(QkvValue *x, double exponent, GError **error);
/**
 * qkv_pow_tensor:
 * @x: a #QkvValue
 * @exponent: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * "pow_tensor": x^exponent elementwise for two f32 tensors that broadcast
 * together, as torch.pow(x, y). Gradients as PyTorch's: exponent ·
 * x^(exponent-1) for x (0 where exponent is 0) and x^exponent · log(x) for
 * the exponent (0 where x is 0 and exponent ≥ 0; NaN for negative x).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_pow_tensor(QkvValue *x, QkvValue *exponent, GError **error);

/**
 * qkv_max:
 * @x: (nullable): a #QkvValue
 * @axis: the axis
 * @keepdims: the keepdims
 * @indices: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * "max", "min" {axis: i, keepdims: b}: the largest (smallest) element of x
 * along axis, and in *indices (may be NULL) its i32 index. Ties give the
 * first index; a NaN beats every number. The gradient of the values goes to
 * the picked element.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_max(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error);
/**
 * qkv_min:
 * @x: a #QkvValue
 * @axis: the axis
 * @keepdims: the keepdims
 * @indices: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_max().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_min(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error);
/**
 * qkv_argmax:
 * @x: a #QkvValue
 * @axis: the axis
 * @keepdims: the keepdims
 * @error: return location for a #GError, or %NULL
 *
 * "argmax", "argmin" {axis: i, keepdims: b}: the i32 index alone.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_argmax(QkvValue *x, gint axis, gboolean keepdims, GError **error);
/**
 * qkv_argmin:
 * @x: a #QkvValue
 * @axis: the axis
 * @keepdims: the keepdims
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_argmax().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_argmin(QkvValue *x, gint axis, gboolean keepdims, GError **error);

/**
 * qkv_cast:
 * @x: a #QkvValue
 * @dtype: the dtype
 * @error: return location for a #GError, or %NULL
 *
 * "cast" {dtype: s}: x as f32 or i32. f32 → i32 truncates toward zero; NaN
 * gives 0 and values beyond the i32 range saturate. Only f32 → f32 passes a
 * gradient.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_cast(QkvValue *x, QkvDType dtype, GError **error);
/**
 * qkv_unsqueeze:
 * @x: a #QkvValue
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "unsqueeze" {axis: i}: a new axis of size 1 at axis (-(rank+1) ≤ axis ≤
 * rank).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_unsqueeze(QkvValue *x, gint axis, GError **error);
/**
 * qkv_squeeze:
 * @x: a #QkvValue
 * @axes: (array length=n_axes) (nullable): the axes, @n_axes of them
 * @n_axes: the number of @axes
 * @error: return location for a #GError, or %NULL
 *
 * "squeeze" {axes: ax}: drop the given axes, which must have size 1 (every
 * axis of size 1 when n_axes is 0).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_squeeze(QkvValue *x, const gint *axes, guint n_axes, GError **error);
/**
 * qkv_expand:
 * @x: a #QkvValue
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * "expand" {shape: ax}: x repeated along its axes of size 1 and along new
 * leading axes to shape; -1 keeps x's size. The gradient sums over the
 * repeats.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_expand(QkvValue *x, const QkvShape *shape, GError **error);
/**
 * qkv_gather:
 * @x: a #QkvValue
 * @index: a #QkvValue
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "gather" {axis: i, zero_out_of_range: b (FALSE here)}: y[…, k, …] =
 * x[…, index[…, k, …], …] along axis, as torch.gather: index (i32) has x's
 * rank and is no larger off the axis; y has index's shape. An index outside
 * [0, size) fails the run as embedding's ids do, or with zero_out_of_range
 * (by name) gives 0.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gather(QkvValue *x, QkvValue *index, gint axis, GError **error);
/**
 * qkv_index_select:
 * @x: a #QkvValue
 * @index: a #QkvValue
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "index_select" {axis: i, zero_out_of_range: b (FALSE here)}: the slices of
 * x at positions index (i32, rank 1) along axis. An index outside [0, size)
 * fails the run, or with zero_out_of_range (by name) gives a zero slice.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_index_select(QkvValue *x, QkvValue *index, gint axis, GError **error);

/* Gradient ops of the above, scatter-adding (indices out of range skipped). */
/**
 * qkv_gather_backward:
 * @dy: a #QkvValue
 * @index: a #QkvValue
 * @input_shape: a #QkvShape
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "gather_backward" {shape: ax, axis: i}: zeros of input_shape, dy added at index.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gather_backward(QkvValue *dy, QkvValue *index, const QkvShape *input_shape, gint axis,
                              GError **error);
/**
 * qkv_index_select_backward:
 * @dy: a #QkvValue
 * @index: a #QkvValue
 * @size: the size
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "index_select_backward" {size: x, axis: i}: zeros with size along axis, the
 * slices of dy added at index.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_index_select_backward(QkvValue *dy, QkvValue *index, gint64 size, gint axis,
                                    GError **error);
/**
 * qkv_clamp_backward:
 * @dy: a #QkvValue
 * @x: a #QkvValue
 * @lo: the lo
 * @hi: the hi
 * @error: return location for a #GError, or %NULL
 *
 * "clamp_backward" {min: d, max: d}: dy where lo ≤ x ≤ hi, else 0.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_clamp_backward(QkvValue *dy, QkvValue *x, double lo, double hi, GError **error);

/**
 * qkv_gumbel_softmax:
 * @logits: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @tau: the tau
 * @hard: the hard
 * @axis: the axis
 * @error: return location for a #GError, or %NULL
 *
 * "gumbel_softmax" {tau: d, hard: b, axis: i}: one position of each row of
 * logits along axis: in plans compiled for training a sample, argmax of
 * logits + g with g standard Gumbel noise from (seed, step, node) (position j
 * with probability softmax(logits)_j); in evaluation the argmax of logits.
 * With hard, the result is the pick's one-hot (output 1 of the node is the
 * relaxation softmax((logits + g) / tau)), whose gradient is taken to be the
 * relaxation's (straight-through Gumbel-softmax, PyTorch's
 * gumbel_softmax(hard=True)); without hard the result is the relaxation.
 * valid_lens (may be NULL) i32 (B) or (B, n_q) for logits (B, …, n_q, n) and
 * axis -1, as for qkv_masked_softmax(): positions at or past the valid
 * length are never picked; a row with none picks nothing (all zeros).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_gumbel_softmax(QkvValue *logits, QkvValue *valid_lens, double tau, gboolean hard,
                             gint axis, GError **error);

/**
 * qkv_kv_cache_append:
 * @cache: a #QkvValue
 * @fresh: a #QkvValue
 * @positions: (nullable): a #QkvValue
 * @lengths: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The key/value cache of incremental decoding: writes fresh (B, H, t, d)
 * into the state cache (B, H, T_max, d, a qkv_graph_state()) at positions
 * [b] … positions[b] + t − 1 in place and returns the cache after the write;
 * *lengths (when not NULL) gets positions + t, i32 (B), the valid lengths
 * for dot-product attention. The state keeps the slots for the next run.
 * Inference only (no gradient).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_kv_cache_append(QkvValue *cache, QkvValue *fresh, QkvValue *positions,
                              QkvValue **lengths, GError **error);
/**
 * qkv_positions:
 * @x: a #QkvValue
 * @starts: (nullable): a #QkvValue
 * @offset: the offset
 * @error: return location for a #GError, or %NULL
 *
 * "positions" {offset: i}: the i32 positions of x's T tokens, T = x's axis
 * 1 (axis 0 for a rank-1 x; only x's shape is read, on every run, so a plan
 * bound to a shorter x gives fewer). Without starts (may be NULL): (T), the
 * positions offset … offset + T − 1, as torch.arange. With starts, i32 (B)
 * for x (B, T, …): (B, T), row b's positions starts[b] + offset + i, the
 * positions of new tokens appended to each row's cache at starts[b] (offset
 * 1 gives their causal valid lengths). No gradient.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_positions(QkvValue *x, QkvValue *starts, gint64 offset, GError **error);

G_END_DECLS
