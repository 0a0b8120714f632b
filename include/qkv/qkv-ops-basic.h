/* qkv-ops-basic.h: the basic ops (part of qkv-ops.h, which says what an op
 * function does): matmul, arithmetic and elementwise math, reductions (sum,
 * mean, max, argmax, ...), shape ops (reshape, permute, slice, concat,
 * broadcast, squeeze, expand, ...), cast, and the gradient ops of slice and
 * clamp. */
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

/* Gradient ops that the rules of slice and clamp add; usable directly too. */
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

G_END_DECLS
