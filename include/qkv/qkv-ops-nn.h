/* qkv-ops-nn.h: the neural-network ops (part of qkv-ops.h, which says what an
 * op function does): activations, RMSNorm, softmax, embedding lookup, the
 * losses (cross-entropy, MSE), the gradient ops their rules add, and
 * Gumbel-softmax. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

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

G_END_DECLS
