/* qkv-ops.h: typed functions for the built-in primitive ops.
 *
 * Each adds one node to the graph its inputs belong to and returns its
 * (first) output, or NULL with a QKV_ERROR and the graph unchanged. The same
 * ops are reachable by name through qkv_graph_add_node(); the op name and its
 * attributes are given in each comment.
 */
#pragma once

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/* "matmul" {transpose_a: b, transpose_b: b}: a (…, M, K) · b (…, K, N) with
 * optional transposes of the last two axes. The batch axes must be equal, or
 * one side may have none (a weight shared by the whole batch). */
QkvValue *qkv_matmul(QkvValue *a, QkvValue *b, gboolean transpose_a, gboolean transpose_b,
                     GError **error);

/* "add", "sub", "mul", "div": elementwise with NumPy broadcasting. */
QkvValue *qkv_add(QkvValue *a, QkvValue *b, GError **error);
QkvValue *qkv_sub(QkvValue *a, QkvValue *b, GError **error);
QkvValue *qkv_mul(QkvValue *a, QkvValue *b, GError **error);
QkvValue *qkv_div(QkvValue *a, QkvValue *b, GError **error);
/* "scale" {factor: d}: x · factor. */
QkvValue *qkv_scale(QkvValue *x, double factor, GError **error);
/* "neg": -x. */
QkvValue *qkv_neg(QkvValue *x, GError **error);

/* "reshape" {shape: ax}: same elements, new shape; one dimension may be -1. */
QkvValue *qkv_reshape(QkvValue *x, const QkvShape *shape, GError **error);
/* "permute" {perm: ax}: output axis i is input axis perm[i]. */
QkvValue *qkv_permute(QkvValue *x, const gint *perm, guint n, GError **error);
/* Swap two axes (a "permute" node). */
QkvValue *qkv_transpose(QkvValue *x, gint axis0, gint axis1, GError **error);
/* "slice" {axis: i, start: x, end: x}: elements start ≤ i < end along axis;
 * negative start/end count from the end. */
QkvValue *qkv_slice(QkvValue *x, gint axis, gint64 start, gint64 end, GError **error);
/* "concat" {axis: i}: join n values along axis; other axes must agree. */
QkvValue *qkv_concat(QkvValue *const *xs, guint n, gint axis, GError **error);

/* "sum", "mean" {axes: ax, keepdims: b}: reduce over the axes given (all
 * axes when n_axes is 0). */
QkvValue *qkv_sum(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
QkvValue *qkv_mean(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error);
/* "sum_to" {shape: ax}: sum x down to a shape it was broadcast from. */
QkvValue *qkv_sum_to(QkvValue *x, const QkvShape *shape, GError **error);
/* "broadcast_to" {shape: ax}: repeat x to a shape it broadcasts to. */
QkvValue *qkv_broadcast_to(QkvValue *x, const QkvShape *shape, GError **error);

/* Elementwise "relu", "sigmoid", "tanh", "exp", "log". */
QkvValue *qkv_relu(QkvValue *x, GError **error);
QkvValue *qkv_sigmoid(QkvValue *x, GError **error);
QkvValue *qkv_tanh(QkvValue *x, GError **error);
QkvValue *qkv_exp(QkvValue *x, GError **error);
QkvValue *qkv_log(QkvValue *x, GError **error);

/* "softmax" and "log_softmax" over the last axis. */
QkvValue *qkv_softmax(QkvValue *x, GError **error);
QkvValue *qkv_log_softmax(QkvValue *x, GError **error);

/* "embedding": ids (i32, any shape) pick rows of weight (V, D) → (…, D).
 * An id outside [0, V) gives a zero row. */
QkvValue *qkv_embedding(QkvValue *ids, QkvValue *weight, GError **error);

typedef enum {
  QKV_REDUCTION_NONE,
  QKV_REDUCTION_SUM,
  QKV_REDUCTION_MEAN,
} QkvReduction;

/* "cross_entropy" {reduction: s ("none", "sum", "mean")}: logits (…, C),
 * targets i32 (…), optional weight f32 (…) that multiplies each token's loss
 * (a mask, for instance); NULL for none. "none" gives the per-token loss
 * (shape of targets); "mean" divides the weighted sum by the number of tokens. */
QkvValue *qkv_cross_entropy(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                            QkvReduction reduction, GError **error);
/* "mse" {reduction: s}: (pred - target)², reduced. */
QkvValue *qkv_mse(QkvValue *pred, QkvValue *target, QkvReduction reduction, GError **error);

/* Gradient ops that the rules above add; usable directly too. */
/* "relu_backward": dy · (y > 0), given the forward output y. */
QkvValue *qkv_relu_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "sigmoid_backward": dy · y (1 - y). */
QkvValue *qkv_sigmoid_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "tanh_backward": dy · (1 - y²). */
QkvValue *qkv_tanh_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "softmax_backward": y · (dy - Σ dy·y), over the last axis. */
QkvValue *qkv_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "log_softmax_backward": dy - exp(y) Σ dy, over the last axis. */
QkvValue *qkv_log_softmax_backward(QkvValue *dy, QkvValue *y, GError **error);
/* "embedding_backward" {num_embeddings: x}: scatter-add dy rows into a
 * (num_embeddings, D) gradient. */
QkvValue *qkv_embedding_backward(QkvValue *dy, QkvValue *ids, gint64 num_embeddings,
                                 GError **error);
/* "cross_entropy_backward" {reduction: s}: d loss / d logits. */
QkvValue *qkv_cross_entropy_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                     QkvValue *weight, QkvReduction reduction, GError **error);
/* "slice_backward" {shape: ax, axis: i, start: x}: place dy into zeros of the
 * input's shape at start along axis. */
QkvValue *qkv_slice_backward(QkvValue *dy, const QkvShape *input_shape, gint axis, gint64 start,
                             GError **error);

G_END_DECLS
