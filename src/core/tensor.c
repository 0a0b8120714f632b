/* tensor.c: shapes and host tensors. */
#include "core/core-private.h"

#include <math.h>
#include <string.h>
#include "error-private.h"

QkvShape
qkv_shape_from_array(gint rank, const gint64 *dims)
{
  QkvShape s = {0};
  /* a rank outside [0, QKV_MAX_RANK] is a value a user can pass: an invalid
   * shape (rank -1), which every function taking a shape refuses with a
   * GError, rather than a critical and a scalar that would be accepted */
  if (rank < 0 || rank > QKV_MAX_RANK) {
    s.rank = -1;
    return s;
  }
  s.rank = rank;
  for (gint i = 0; i < rank; i++)
    s.dims[i] = dims[i];
  return s;
}

QkvShape
qkv_shape_scalar(void)
{
  QkvShape s = {0};
  return s;
}

gint64
qkv_shape_numel(const QkvShape *shape)
{
  gint64 n = 1;
  for (gint i = 0; i < shape->rank; i++)
    n *= shape->dims[i];
  return n;
}

gboolean
qkv_shape_equal(const QkvShape *a, const QkvShape *b)
{
  if (a->rank != b->rank)
    return FALSE;
  for (gint i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i])
      return FALSE;
  return TRUE;
}

gchar *
qkv_shape_to_string(const QkvShape *shape)
{
  GString *s = g_string_new("(");
  for (gint i = 0; i < shape->rank; i++)
    g_string_append_printf(s, "%s%" G_GINT64_FORMAT, i ? ", " : "", shape->dims[i]);
  g_string_append_c(s, ')');
  return g_string_free(s, FALSE);
}

gboolean
qkv_shape_broadcast(const QkvShape *a, const QkvShape *b, QkvShape *out)
{
  QkvShape r = {0};
  r.rank = MAX(a->rank, b->rank);
  for (gint i = 0; i < r.rank; i++) {
    gint ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
    gint64 da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da == db || db == 1)
      r.dims[i] = da;
    else if (da == 1)
      r.dims[i] = db;
    else
      return FALSE;
  }
  *out = r;
  return TRUE;
}

const gchar *
qkv_dtype_name(QkvDType dtype)
{
  switch (dtype) {
  case QKV_F32:
    return "f32";
  case QKV_I32:
    return "i32";
  case QKV_BF16:
    return "bf16";
  }
  return "?";
}

gsize
qkv_dtype_size(QkvDType dtype)
{
  return dtype == QKV_BF16 ? 2 : 4;
}

gboolean
qkv_shape_is_valid(const QkvShape *shape)
{
  if (shape->rank < 0 || shape->rank > QKV_MAX_RANK)
    return FALSE;
  /* every element count times 4 bytes must fit a gssize */
  gint64 n = 4;
  for (gint i = 0; i < shape->rank; i++)
    if (shape->dims[i] < 0 || __builtin_mul_overflow(n, shape->dims[i], &n))
      return FALSE;
  return n <= G_MAXSSIZE;
}

static QkvTensor *
tensor_alloc(QkvDType dtype, const QkvShape *shape)
{
  QkvTensor *t = g_new0(QkvTensor, 1);
  t->ref_count = 1;
  t->dtype = dtype;
  t->shape = *shape;
  return t;
}

static gboolean
dtype_is_valid(QkvDType dtype)
{
  return dtype == QKV_F32 || dtype == QKV_I32;
}

/* The checks every constructor makes; what names the constructor. */
static gboolean
check_tensor_args(const gchar *what, QkvDType dtype, const QkvShape *shape, GError **error)
{
  if (!dtype_is_valid(dtype)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE, "%s: dtype %d is neither f32 nor i32", what,
                (gint)dtype);
    return FALSE;
  }
  if (shape == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: shape is NULL", what);
    return FALSE;
  }
  if (!qkv_shape_is_valid(shape)) {
    g_autofree gchar *s = shape->rank >= 0 && shape->rank <= QKV_MAX_RANK
                              ? qkv_shape_to_string(shape)
                              : g_strdup_printf("of rank %d", shape->rank);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s: shape %s is invalid (rank above %d, a negative dimension, or more bytes "
                "than fit in a gssize)",
                what, s, QKV_MAX_RANK);
    return FALSE;
  }
  return TRUE;
}

QkvTensor *
qkv_tensor_try_new(QkvDType dtype, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (!check_tensor_args("tensor", dtype, shape, error))
    return NULL;
  gsize nbytes = (gsize)qkv_shape_numel(shape) * qkv_dtype_size(dtype);
  gpointer data = qkv_aligned_alloc0(nbytes);
  if (data == NULL) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "tensor: cannot allocate %" G_GSIZE_FORMAT " bytes for a %s tensor of shape %s",
                nbytes, qkv_dtype_name(dtype), s);
    return NULL;
  }
  QkvTensor *t = tensor_alloc(dtype, shape);
  t->data = data;
  t->owns_data = TRUE;
  return t;
}

QkvTensor *
qkv_tensor_new(QkvDType dtype, const QkvShape *shape)
{
  g_return_val_if_fail(dtype_is_valid(dtype), NULL);
  g_return_val_if_fail(shape != NULL && qkv_shape_is_valid(shape), NULL);
  /* out of memory: NULL, quietly (qkv_tensor_try_new says why) */
  return qkv_tensor_try_new(dtype, shape, NULL);
}

QkvTensor *
qkv_tensor_new_from_data(QkvDType dtype, const QkvShape *shape, gconstpointer data)
{
  QkvTensor *t = qkv_tensor_new(dtype, shape);
  if (t != NULL && data != NULL)
    memcpy(t->data, data, qkv_tensor_nbytes(t));
  return t;
}

QkvTensor *
qkv_tensor_try_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (!check_tensor_args("borrowed tensor", dtype, shape, error))
    return NULL;
  if (data == NULL) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "borrowed tensor: data is NULL for a %s tensor of shape %s", qkv_dtype_name(dtype),
                s);
    return NULL;
  }
  return qkv_tensor_new_view(dtype, shape, data);
}

QkvTensor *
qkv_tensor_new_borrowed(QkvDType dtype, const QkvShape *shape, gpointer data)
{
  g_return_val_if_fail(dtype_is_valid(dtype), NULL);
  g_return_val_if_fail(shape != NULL && qkv_shape_is_valid(shape), NULL);
  g_return_val_if_fail(data != NULL, NULL);
  return qkv_tensor_new_view(dtype, shape, data);
}

QkvTensor *
qkv_tensor_new_view(QkvDType dtype, const QkvShape *shape, gpointer data)
{
  QkvTensor *t = tensor_alloc(dtype, shape);
  t->data = data;
  t->owns_data = FALSE;
  return t;
}

QkvTensor *
qkv_tensor_new_f32(const QkvShape *shape, const float *values)
{
  return qkv_tensor_new_from_data(QKV_F32, shape, values);
}

QkvTensor *
qkv_tensor_new_i32(const QkvShape *shape, const gint32 *values)
{
  return qkv_tensor_new_from_data(QKV_I32, shape, values);
}

QkvTensor *
qkv_tensor_copy(const QkvTensor *tensor)
{
  g_return_val_if_fail(tensor != NULL, NULL);
  return qkv_tensor_new_from_data(tensor->dtype, &tensor->shape, tensor->data);
}

void
qkv_tensor_free(QkvTensor *tensor)
{
  if (tensor == NULL)
    return;
  /* a boxed reference (qkv_tensor_ref()) may still hold it */
  if (!g_atomic_int_dec_and_test(&tensor->ref_count))
    return;
  if (tensor->owns_data)
    qkv_aligned_free(tensor->data);
  g_free(tensor);
}

QkvDType
qkv_tensor_dtype(const QkvTensor *tensor)
{
  return tensor->dtype;
}

const QkvShape *
qkv_tensor_shape(const QkvTensor *tensor)
{
  return &tensor->shape;
}

gint
qkv_tensor_rank(const QkvTensor *tensor)
{
  return tensor->shape.rank;
}

gint64
qkv_tensor_dim(const QkvTensor *tensor, gint axis)
{
  g_return_val_if_fail(tensor != NULL, -1);
  /* an axis outside the rank is a value a user can pass: quiet, as documented */
  if (axis < -tensor->shape.rank || axis >= tensor->shape.rank)
    return -1;
  if (axis < 0)
    axis += tensor->shape.rank;
  return tensor->shape.dims[axis];
}

gint64
qkv_tensor_numel(const QkvTensor *tensor)
{
  return qkv_shape_numel(&tensor->shape);
}

gsize
qkv_tensor_nbytes(const QkvTensor *tensor)
{
  return (gsize)qkv_shape_numel(&tensor->shape) * qkv_dtype_size(tensor->dtype);
}

gboolean
qkv_tensor_owns_data(const QkvTensor *tensor)
{
  return tensor->owns_data;
}

gpointer
qkv_tensor_data(QkvTensor *tensor)
{
  return tensor->data;
}

gconstpointer
qkv_tensor_const_data(const QkvTensor *tensor)
{
  return tensor->data;
}

float *
qkv_tensor_f32(QkvTensor *tensor)
{
  g_return_val_if_fail(tensor != NULL && tensor->dtype == QKV_F32, NULL);
  return tensor->data;
}

gint32 *
qkv_tensor_i32(QkvTensor *tensor)
{
  g_return_val_if_fail(tensor != NULL && tensor->dtype == QKV_I32, NULL);
  return tensor->data;
}

void
qkv_tensor_fill(QkvTensor *tensor, double value)
{
  g_return_if_fail(tensor != NULL);
  gint64 n = qkv_tensor_numel(tensor);
  if (tensor->dtype == QKV_F32) {
    float *d = tensor->data;
    for (gint64 i = 0; i < n; i++)
      d[i] = (float)value;
  } else {
    gint32 *d = tensor->data;
    for (gint64 i = 0; i < n; i++)
      d[i] = (gint32)value;
  }
}

gboolean
qkv_tensor_copy_from(QkvTensor *dst, const QkvTensor *src, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (dst->dtype != src->dtype || !qkv_shape_equal(&dst->shape, &src->shape)) {
    g_autofree gchar *a = qkv_shape_to_string(&dst->shape);
    g_autofree gchar *b = qkv_shape_to_string(&src->shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "tensor copy: destination is %s %s but source is %s %s", qkv_dtype_name(dst->dtype),
                a, qkv_dtype_name(src->dtype), b);
    return FALSE;
  }
  memmove(dst->data, src->data, qkv_tensor_nbytes(dst));
  return TRUE;
}

double
qkv_tensor_get(const QkvTensor *tensor, gint64 index)
{
  g_return_val_if_fail(tensor != NULL, NAN);
  /* an index outside the tensor is a value a user can pass: quiet, as documented */
  if (index < 0 || index >= qkv_tensor_numel(tensor))
    return NAN;
  if (tensor->dtype == QKV_F32)
    return ((const float *)tensor->data)[index];
  return ((const gint32 *)tensor->data)[index];
}

double
qkv_tensor_max_rel_diff(const QkvTensor *a, const QkvTensor *b, double floor)
{
  g_return_val_if_fail(qkv_shape_equal(&a->shape, &b->shape), INFINITY);
  double worst = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(a); i++) {
    double x = qkv_tensor_get(a, i), y = qkv_tensor_get(b, i);
    double d = fabs(x - y) / fmax(fabs(y), floor);
    if (!(d <= worst))
      worst = isnan(d) ? INFINITY : d;
  }
  return worst;
}

/* Printing, after NumPy's repr: nested brackets, every element padded to
 * one width so columns line up, and a summary ("...") of each long axis
 * once the tensor is larger than the threshold. */

typedef struct {
  const QkvTensor *tensor;
  gboolean summary; /* whether axes longer than 2 · edge are summarised */
  gint64 edge;      /* items kept at each end of a summarised axis */
  gint width;       /* widest element seen (measuring) or to pad to (writing) */
  GString *out;     /* NULL while measuring */
  gint64 strides[QKV_MAX_RANK];
} Printer;

static void
format_element(const QkvTensor *t, gint64 i, gchar *buf, gsize size)
{
  if (t->dtype == QKV_I32) {
    g_snprintf(buf, size, "%" G_GINT32_FORMAT, ((const gint32 *)t->data)[i]);
    return;
  }
  float v = ((const float *)t->data)[i];
  if (isnan(v)) {
    g_strlcpy(buf, "nan", size);
    return;
  }
  if (isinf(v)) {
    g_strlcpy(buf, v > 0 ? "inf" : "-inf", size);
    return;
  }
  g_snprintf(buf, size, "%.6g", (double)v);
  /* "1." rather than "1", so an f32 never reads as an integer */
  if (strpbrk(buf, ".e") == NULL)
    g_strlcat(buf, ".", size);
}

static void
print_block(Printer *p, gint axis, gint64 offset)
{
  const QkvShape *sh = &p->tensor->shape;
  if (axis == sh->rank) {
    gchar buf[48];
    format_element(p->tensor, offset, buf, sizeof buf);
    gint len = (gint)strlen(buf);
    if (p->out == NULL)
      p->width = MAX(p->width, len);
    else
      g_string_append_printf(p->out, "%*s", p->width, buf);
    return;
  }
  const gint64 n = sh->dims[axis];
  const gboolean summarise = p->summary && n > 2 * p->edge;
  if (p->out != NULL)
    g_string_append_c(p->out, '[');
  for (gint64 i = 0; i < n; i++) {
    if (i > 0 && p->out != NULL) {
      if (axis == sh->rank - 1) {
        g_string_append(p->out, ", ");
      } else {
        /* one blank line more for every axis deeper than a matrix's rows */
        g_string_append_c(p->out, ',');
        for (gint k = axis; k < sh->rank - 1; k++)
          g_string_append_c(p->out, '\n');
        for (gint k = 0; k <= axis; k++)
          g_string_append_c(p->out, ' ');
      }
    }
    if (summarise && i == p->edge) {
      if (p->out != NULL)
        g_string_append(p->out, "...");
      i = n - p->edge - 1;
      continue;
    }
    print_block(p, axis + 1, offset + i * p->strides[axis]);
  }
  if (p->out != NULL)
    g_string_append_c(p->out, ']');
}

/* What the threshold bounds: the number of elements, or, for an empty
 * tensor, the number of (empty) sub-arrays printed at its deepest level
 * that has any: a (10^6, 0) tensor prints a million "[]". For a tensor with
 * elements the two are the same. Saturates at G_MAXINT64. */
static gint64
printed_items(const QkvShape *shape)
{
  gint64 n = 1, most = 1;
  for (gint a = 0; a < shape->rank; a++) {
    if (__builtin_mul_overflow(n, shape->dims[a], &n))
      return G_MAXINT64;
    most = MAX(most, n);
  }
  return most;
}

gchar *
qkv_tensor_to_string_full(const QkvTensor *tensor, gint64 threshold, gint edge_items)
{
  g_return_val_if_fail(tensor != NULL, NULL);
  Printer p = {.tensor = tensor,
               .summary = printed_items(&tensor->shape) > threshold,
               .edge = MAX(edge_items, 0)};
  gint64 stride = 1;
  for (gint a = tensor->shape.rank; a-- > 0;) {
    p.strides[a] = stride;
    stride *= tensor->shape.dims[a];
  }
  print_block(&p, 0, 0);
  p.out = g_string_new(NULL);
  print_block(&p, 0, 0);
  g_autofree gchar *sh = qkv_shape_to_string(&tensor->shape);
  g_string_append_printf(p.out, " %s%s", qkv_dtype_name(tensor->dtype), sh);
  return g_string_free(p.out, FALSE);
}

gchar *
qkv_tensor_to_string(const QkvTensor *tensor)
{
  return qkv_tensor_to_string_full(tensor, QKV_PRINT_THRESHOLD, QKV_PRINT_EDGE_ITEMS);
}

void
qkv_tensor_print(const QkvTensor *tensor)
{
  g_return_if_fail(tensor != NULL);
  g_autofree gchar *s = qkv_tensor_to_string(tensor);
  g_print("%s\n", s);
}
