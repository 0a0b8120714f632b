/* qkv-tensor.h: shapes and host tensors.
 *
 * A tensor is a contiguous, row-major n-d array of f32 or i32 in host memory.
 * It either owns its data or borrows a buffer that the caller keeps alive.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include <stdint.h>

G_BEGIN_DECLS

/**
 * QKV_MAX_RANK:
 *
 * The highest rank a shape may have.
 */
#define QKV_MAX_RANK 6

/**
 * QkvDType:
 * @QKV_F32: f32
 * @QKV_I32: i32
 * @QKV_BF16: bfloat16, for storage only: no graph value or tensor has it. A
 *   kernel sees it on the view of an output (or input) that a plan compiled
 *   with bf16_activations keeps in bfloat16 (QkvOpDef.bf16_outputs), and a
 *   scratch_size function in QkvShapeCtx.out_dtypes.
 *
 * The dtype values.
 */
typedef enum {
  QKV_F32 = 0,
  QKV_I32 = 1,
  QKV_BF16 = 2,
} QkvDType;

/**
 * QkvShape:
 *
 * A shape: rank 0 (a scalar) up to QKV_MAX_RANK. Plain data, copy freely.
 */
typedef struct {
  gint rank;
  gint64 dims[QKV_MAX_RANK];
} QkvShape;

/**
 * QKV_SHAPE:
 * @...: the values
 *
 * QKV_SHAPE(2, 3, 4) builds a QkvShape from its dimensions;
 * QKV_SHAPE() is not valid C, use qkv_shape_scalar() for rank 0.
 */
#define QKV_SHAPE(...)                                                                             \
  qkv_shape_from_array((gint)(sizeof((gint64[]){__VA_ARGS__}) / sizeof(gint64)),                   \
                       (const gint64[]){__VA_ARGS__})

/**
 * qkv_shape_from_array: (skip)
 * @rank: the rank
 * @dims: the dims
 *
 * Shape from array. A rank outside 0 to %QKV_MAX_RANK gives, without a
 * message, a shape of rank -1 that qkv_shape_is_valid() rejects (and every
 * function taking a shape refuses with a #GError).
 *
 * Returns: the #QkvShape
 */
QKV_API
QkvShape qkv_shape_from_array(gint rank, const gint64 *dims);
/**
 * qkv_shape_scalar: (skip)
 *
 * See qkv_shape_from_array().
 *
 * Returns: the #QkvShape
 */
QKV_API
QkvShape qkv_shape_scalar(void);
/**
 * qkv_shape_is_valid:
 * @shape: a #QkvShape
 *
 * Rank 0 to QKV_MAX_RANK, no negative dimension, and a byte size (4 bytes an
 * element) that fits in a gssize.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_shape_is_valid(const QkvShape *shape);
/**
 * qkv_shape_numel:
 * @shape: a #QkvShape
 *
 * Number of elements (1 for a scalar).
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_shape_numel(const QkvShape *shape);
/**
 * qkv_shape_equal:
 * @a: a #QkvShape
 * @b: a #QkvShape
 *
 * See qkv_shape_numel().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_shape_equal(const QkvShape *a, const QkvShape *b);
/**
 * qkv_shape_to_string:
 * @shape: a #QkvShape
 *
 * "(2, 3, 4)"; free with g_free().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_shape_to_string(const QkvShape *shape);
/**
 * qkv_shape_broadcast:
 * @a: a #QkvShape
 * @b: a #QkvShape
 * @out: a #QkvShape
 *
 * NumPy broadcasting of a and b into out; FALSE if they do not broadcast.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_shape_broadcast(const QkvShape *a, const QkvShape *b, QkvShape *out);

/**
 * qkv_dtype_name:
 * @dtype: the dtype
 *
 * "f32", "i32" or "bf16".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_dtype_name(QkvDType dtype);
/**
 * qkv_dtype_size:
 * @dtype: the dtype
 *
 * Bytes per element.
 *
 * Returns: the gsize
 */
QKV_API
gsize qkv_dtype_size(QkvDType dtype);

/**
 * QkvTensor:
 *
 * An opaque tensor.
 */
typedef struct _QkvTensor QkvTensor;

/**
 * qkv_tensor_new:
 * @dtype: the dtype
 * @shape: a #QkvShape
 *
 * A new zero-filled tensor that owns its data (64-byte aligned). NULL with a
 * critical warning for a dtype other than QKV_F32/QKV_I32 or an invalid shape;
 * NULL (no warning) when the memory cannot be had.
 *
 * Returns: (transfer full) (nullable): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_new(QkvDType dtype, const QkvShape *shape);
/**
 * qkv_tensor_try_new:
 * @dtype: the dtype
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * Like qkv_tensor_new(), but every failure is a GError: QKV_ERROR_DTYPE,
 * QKV_ERROR_SHAPE, or QKV_ERROR_MEMORY naming the shape and the bytes asked for.
 *
 * Returns: (transfer full) (nullable): a new #QkvTensor, or %NULL with @error set
 */
QKV_API
QkvTensor *qkv_tensor_try_new(QkvDType dtype, const QkvShape *shape, GError **error);
/**
 * qkv_tensor_new_from_data:
 * @dtype: the dtype
 * @shape: a #QkvShape
 * @data: the data
 *
 * A new tensor that owns a copy of data (numel × dtype size bytes).
 *
 * Returns: (transfer full): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_new_from_data(QkvDType dtype, const QkvShape *shape, gconstpointer data);
/**
 * qkv_tensor_new_borrowed:
 * @dtype: the dtype
 * @shape: (nullable): a #QkvShape
 * @data: the data
 *
 * A tensor that borrows data: the caller keeps it alive and frees it. NULL
 * with a critical warning for a bad dtype or shape or NULL data.
 *
 * Returns: (transfer full) (nullable): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data);
/**
 * qkv_tensor_try_new_borrowed:
 * @dtype: the dtype
 * @shape: a #QkvShape
 * @data: the data
 * @error: return location for a #GError, or %NULL
 *
 * Like qkv_tensor_new_borrowed(), with each refusal as a GError.
 *
 * Returns: (transfer full) (nullable): a new #QkvTensor, or %NULL with @error set
 */
QKV_API
QkvTensor *qkv_tensor_try_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data,
                                       GError **error);
/**
 * qkv_tensor_new_f32:
 * @shape: a #QkvShape
 * @values: the values
 *
 * Convenience: an f32 tensor holding a copy of n values, shaped as given.
 *
 * Returns: (transfer full): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_new_f32(const QkvShape *shape, const float *values);
/**
 * qkv_tensor_new_i32:
 * @shape: a #QkvShape
 * @values: the values
 *
 * Convenience: an i32 tensor holding a copy of n values, shaped as given.
 *
 * Returns: (transfer full): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_new_i32(const QkvShape *shape, const gint32 *values);
/**
 * qkv_tensor_copy:
 * @tensor: a #QkvTensor
 *
 * A deep copy that owns its data.
 *
 * Returns: (transfer full): a new #QkvTensor
 */
QKV_API
QkvTensor *qkv_tensor_copy(const QkvTensor *tensor);
/**
 * qkv_tensor_free:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_copy().
 */
QKV_API
void qkv_tensor_free(QkvTensor *tensor);
/**
 * qkv_tensor_ref:
 * @tensor: a tensor
 *
 * Take a reference on @tensor; qkv_tensor_free() drops one. A reference
 * keeps the tensor's struct alive, and its data when the tensor owns it;
 * borrowed data stays the lender's to keep alive.
 *
 * Returns: (transfer full): @tensor
 */
QKV_API
QkvTensor *qkv_tensor_ref(QkvTensor *tensor);

/**
 * qkv_tensor_dtype:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_ref().
 *
 * Returns: the #QkvDType
 */
QKV_API
QkvDType qkv_tensor_dtype(const QkvTensor *tensor);
/**
 * qkv_tensor_shape:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_ref().
 *
 * Returns: (transfer none): a #QkvShape
 */
QKV_API
const QkvShape *qkv_tensor_shape(const QkvTensor *tensor);
/**
 * qkv_tensor_rank:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_ref().
 *
 * Returns: the gint
 */
QKV_API
gint qkv_tensor_rank(const QkvTensor *tensor);
/**
 * qkv_tensor_dim:
 * @tensor: a #QkvTensor
 * @axis: the axis
 *
 * Size of axis i; negative i counts from the end. -1, without a message,
 * for an axis outside the rank.
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_tensor_dim(const QkvTensor *tensor, gint axis);
/**
 * qkv_tensor_numel:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_dim().
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_tensor_numel(const QkvTensor *tensor);
/**
 * qkv_tensor_nbytes:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_dim().
 *
 * Returns: the gsize
 */
QKV_API
gsize qkv_tensor_nbytes(const QkvTensor *tensor);
/**
 * qkv_tensor_owns_data:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_dim().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_tensor_owns_data(const QkvTensor *tensor);
/**
 * qkv_tensor_data:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_dim().
 *
 * Returns: the gpointer
 */
QKV_API
gpointer qkv_tensor_data(QkvTensor *tensor);
/**
 * qkv_tensor_const_data:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_dim().
 *
 * Returns: the gpointer
 */
QKV_API
gconstpointer qkv_tensor_const_data(const QkvTensor *tensor);
/**
 * qkv_tensor_f32:
 * @tensor: a #QkvTensor
 *
 * Typed data pointers; NULL (with a critical warning) on a dtype mismatch.
 *
 * Returns: (transfer none) (nullable): the result
 */
QKV_API
float *qkv_tensor_f32(QkvTensor *tensor);
/**
 * qkv_tensor_i32:
 * @tensor: a #QkvTensor
 *
 * See qkv_tensor_f32().
 *
 * Returns: (transfer none): the result
 */
QKV_API
gint32 *qkv_tensor_i32(QkvTensor *tensor);

/**
 * qkv_tensor_fill:
 * @tensor: a #QkvTensor
 * @value: the value
 *
 * Set every element to value (converted to the tensor's dtype).
 */
QKV_API
void qkv_tensor_fill(QkvTensor *tensor, double value);
/**
 * qkv_tensor_copy_from:
 * @dst: a #QkvTensor
 * @src: a #QkvTensor
 * @error: return location for a #GError, or %NULL
 *
 * Copy src's elements into dst; shapes and dtypes must be equal.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_tensor_copy_from(QkvTensor *dst, const QkvTensor *src, GError **error);
/**
 * qkv_tensor_get:
 * @tensor: a #QkvTensor
 * @index: the index
 *
 * Element i (flat index) as a double; NaN, without a message, for an
 * index outside [0, numel).
 *
 * Returns: the double
 */
QKV_API
double qkv_tensor_get(const QkvTensor *tensor, gint64 index);
/**
 * qkv_tensor_max_rel_diff:
 * @a: a #QkvTensor
 * @b: a #QkvTensor
 * @floor: the floor
 *
 * Largest |a - b| / max(|b|, floor) over all elements; tensors must match.
 *
 * Returns: the double
 */
QKV_API
double qkv_tensor_max_rel_diff(const QkvTensor *a, const QkvTensor *b, double floor);

/**
 * QKV_PRINT_THRESHOLD:
 *
 * Printing, NumPy style: nested brackets, elements right-aligned to one
 * width, f32 as "%.6g" with a trailing "." when that reads as an integer
 * ("1."), then the dtype and shape ("[[1., 2.],\n [3., 4.]] f32(2, 2)").
 * A tensor of more than threshold elements is summarised: each axis longer
 * than 2 · edge_items shows its first and last edge_items entries around
 * "...". An empty tensor counts its empty sub-arrays instead (a (10^6, 0)
 * tensor has a million "[]" rows), so it summarises too. edge_items 0 shows
 * a summarised axis as "[...]" alone; below 0 counts as 0. Lines are not
 * wrapped. Free the string with g_free().
 */
#define QKV_PRINT_THRESHOLD 1000
/**
 * QKV_PRINT_EDGE_ITEMS:
 *
 * Print edge items.
 */
#define QKV_PRINT_EDGE_ITEMS 3
/**
 * qkv_tensor_to_string_full:
 * @tensor: a #QkvTensor
 * @threshold: the threshold
 * @edge_items: the edge items
 *
 * Tensor to string full.
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_tensor_to_string_full(const QkvTensor *tensor, gint64 threshold, gint edge_items);
/**
 * qkv_tensor_to_string:
 * @tensor: a #QkvTensor
 *
 * qkv_tensor_to_string_full() with QKV_PRINT_THRESHOLD and QKV_PRINT_EDGE_ITEMS.
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_tensor_to_string(const QkvTensor *tensor);
/**
 * qkv_tensor_print:
 * @tensor: a #QkvTensor
 *
 * qkv_tensor_to_string() and a newline, through g_print().
 */
QKV_API
void qkv_tensor_print(const QkvTensor *tensor);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvTensor, qkv_tensor_free)

G_END_DECLS
