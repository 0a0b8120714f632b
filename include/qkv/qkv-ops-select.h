/* qkv-ops-select.h: comparisons, selection and indexing (part of qkv-ops.h,
 * which says what an op function does): eq … ge, maximum, minimum, where,
 * masked_fill, sequence masks, gather and index_select with their gradient
 * ops, and for incremental decoding the key/value cache append and token
 * positions. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

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
