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

/* The highest rank a shape may have. */
#define QKV_MAX_RANK 6

typedef enum {
  QKV_F32 = 0,
  QKV_I32 = 1,
} QkvDType;

/* A shape: rank 0 (a scalar) up to QKV_MAX_RANK. Plain data, copy freely. */
typedef struct {
  gint rank;
  gint64 dims[QKV_MAX_RANK];
} QkvShape;

/* QKV_SHAPE(2, 3, 4) builds a QkvShape from its dimensions;
 * QKV_SHAPE() is not valid C, use qkv_shape_scalar() for rank 0. */
#define QKV_SHAPE(...)                                                                             \
  qkv_shape_from_array((gint)(sizeof((gint64[]){__VA_ARGS__}) / sizeof(gint64)),                   \
                       (const gint64[]){__VA_ARGS__})

QKV_API
QkvShape qkv_shape_from_array(gint rank, const gint64 *dims);
QKV_API
QkvShape qkv_shape_scalar(void);
/* Rank 0 to QKV_MAX_RANK, no negative dimension, and a byte size (4 bytes an
 * element) that fits in a gssize. */
QKV_API
gboolean qkv_shape_is_valid(const QkvShape *shape);
/* Number of elements (1 for a scalar). */
QKV_API
gint64 qkv_shape_numel(const QkvShape *shape);
QKV_API
gboolean qkv_shape_equal(const QkvShape *a, const QkvShape *b);
/* "(2, 3, 4)"; free with g_free(). */
QKV_API
gchar *qkv_shape_to_string(const QkvShape *shape);
/* NumPy broadcasting of a and b into out; FALSE if they do not broadcast. */
QKV_API
gboolean qkv_shape_broadcast(const QkvShape *a, const QkvShape *b, QkvShape *out);

/* "f32" or "i32". */
QKV_API
const gchar *qkv_dtype_name(QkvDType dtype);
/* Bytes per element. */
QKV_API
gsize qkv_dtype_size(QkvDType dtype);

typedef struct _QkvTensor QkvTensor;

/* A new zero-filled tensor that owns its data (64-byte aligned). NULL with a
 * critical warning for a dtype other than QKV_F32/QKV_I32 or an invalid shape;
 * NULL (no warning) when the memory cannot be had. */
QKV_API
QkvTensor *qkv_tensor_new(QkvDType dtype, const QkvShape *shape);
/* Like qkv_tensor_new(), but every failure is a GError: QKV_ERROR_DTYPE,
 * QKV_ERROR_SHAPE, or QKV_ERROR_MEMORY naming the shape and the bytes asked for. */
QKV_API
QkvTensor *qkv_tensor_try_new(QkvDType dtype, const QkvShape *shape, GError **error);
/* A new tensor that owns a copy of data (numel × dtype size bytes). */
QKV_API
QkvTensor *qkv_tensor_new_from_data(QkvDType dtype, const QkvShape *shape, gconstpointer data);
/* A tensor that borrows data: the caller keeps it alive and frees it. NULL
 * with a critical warning for a bad dtype or shape or NULL data. */
QKV_API
QkvTensor *qkv_tensor_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data);
/* Like qkv_tensor_new_borrowed(), with each refusal as a GError. */
QKV_API
QkvTensor *qkv_tensor_try_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data,
                                       GError **error);
/* Convenience: an f32 tensor holding a copy of n values, shaped as given. */
QKV_API
QkvTensor *qkv_tensor_new_f32(const QkvShape *shape, const float *values);
/* Convenience: an i32 tensor holding a copy of n values, shaped as given. */
QKV_API
QkvTensor *qkv_tensor_new_i32(const QkvShape *shape, const gint32 *values);
/* A deep copy that owns its data. */
QKV_API
QkvTensor *qkv_tensor_copy(const QkvTensor *tensor);
QKV_API
void qkv_tensor_free(QkvTensor *tensor);

QKV_API
QkvDType qkv_tensor_dtype(const QkvTensor *tensor);
QKV_API
const QkvShape *qkv_tensor_shape(const QkvTensor *tensor);
QKV_API
gint qkv_tensor_rank(const QkvTensor *tensor);
/* Size of axis i; negative i counts from the end. */
QKV_API
gint64 qkv_tensor_dim(const QkvTensor *tensor, gint axis);
QKV_API
gint64 qkv_tensor_numel(const QkvTensor *tensor);
QKV_API
gsize qkv_tensor_nbytes(const QkvTensor *tensor);
QKV_API
gboolean qkv_tensor_owns_data(const QkvTensor *tensor);
QKV_API
gpointer qkv_tensor_data(QkvTensor *tensor);
QKV_API
gconstpointer qkv_tensor_const_data(const QkvTensor *tensor);
/* Typed data pointers; NULL (with a critical warning) on a dtype mismatch. */
QKV_API
float *qkv_tensor_f32(QkvTensor *tensor);
QKV_API
gint32 *qkv_tensor_i32(QkvTensor *tensor);

/* Set every element to value (converted to the tensor's dtype). */
QKV_API
void qkv_tensor_fill(QkvTensor *tensor, double value);
/* Copy src's elements into dst; shapes and dtypes must be equal. */
QKV_API
gboolean qkv_tensor_copy_from(QkvTensor *dst, const QkvTensor *src, GError **error);
/* Element i (flat index) as a double. */
QKV_API
double qkv_tensor_get(const QkvTensor *tensor, gint64 index);
/* Largest |a - b| / max(|b|, floor) over all elements; tensors must match. */
QKV_API
double qkv_tensor_max_rel_diff(const QkvTensor *a, const QkvTensor *b, double floor);

/* Printing, NumPy style: nested brackets, elements right-aligned to one
 * width, f32 as "%.6g" with a trailing "." when that reads as an integer
 * ("1."), then the dtype and shape ("[[1., 2.],\n [3., 4.]] f32(2, 2)").
 * A tensor of more than threshold elements is summarised: each axis longer
 * than 2 · edge_items shows its first and last edge_items entries around
 * "...". An empty tensor counts its empty sub-arrays instead (a (10^6, 0)
 * tensor has a million "[]" rows), so it summarises too. edge_items 0 shows
 * a summarised axis as "[...]" alone; below 0 counts as 0. Lines are not
 * wrapped. Free the string with g_free(). */
#define QKV_PRINT_THRESHOLD 1000
#define QKV_PRINT_EDGE_ITEMS 3
QKV_API
gchar *qkv_tensor_to_string_full(const QkvTensor *tensor, gint64 threshold, gint edge_items);
/* qkv_tensor_to_string_full() with QKV_PRINT_THRESHOLD and QKV_PRINT_EDGE_ITEMS. */
QKV_API
gchar *qkv_tensor_to_string(const QkvTensor *tensor);
/* qkv_tensor_to_string() and a newline, through g_print(). */
QKV_API
void qkv_tensor_print(const QkvTensor *tensor);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvTensor, qkv_tensor_free)

G_END_DECLS
