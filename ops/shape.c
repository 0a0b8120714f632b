/* shape.c: ops that move elements without computing on them: "reshape",
 * "permute", "slice", "concat" and "slice_backward".
 *
 * All of them work on f32 and i32 alike (both are 4-byte elements) and keep
 * their input's dtype.
 */
#include "ops-common.h"
#include "error-private.h"

/* TRUE on overflow, like __builtin_mul_overflow. */
static inline gboolean
g_int64_checked_mul_compat(gint64 *dest, gint64 a, gint64 b)
{
  return __builtin_mul_overflow(a, b, dest);
}

/* Element counts around an axis: dims before it, the axis, dims after it. */
static void
split_at_axis(const QkvShape *shape, gint axis, gint64 *outer, gint64 *len, gint64 *inner)
{
  *outer = 1;
  *inner = 1;
  for (gint i = 0; i < axis; i++)
    *outer *= shape->dims[i];
  for (gint i = axis + 1; i < shape->rank; i++)
    *inner *= shape->dims[i];
  *len = shape->dims[axis];
}

/* ---- reshape ------------------------------------------------------------ */

static gboolean
reshape_shape(QkvShapeCtx *ctx, GError **error)
{
  guint n;
  const gint64 *dims = qkv_attrs_get_ints(ctx->attrs, "shape", &n);
  gint64 numel = qkv_shape_numel(&ctx->in_shapes[0]);
  QkvShape *out = &ctx->out_shapes[0];

  if (n > QKV_MAX_RANK)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "shape has rank %u, more than %d", n,
                           QKV_MAX_RANK);

  gint inferred = -1;
  gint64 known = 1;
  out->rank = (gint)n;
  for (guint i = 0; i < n; i++) {
    out->dims[i] = dims[i];
    if (dims[i] == -1) {
      if (inferred >= 0)
        return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                               "shape has more than one -1 (axes %d and %u)", inferred, i);
      inferred = (gint)i;
    } else if (dims[i] < 0) {
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "shape has a negative dimension %" G_GINT64_FORMAT " at axis %u",
                             dims[i], i);
    } else if (g_int64_checked_mul_compat(&known, known, dims[i])) {
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "shape's element count overflows at axis %u", i);
    }
  }

  if (inferred >= 0) {
    if (known == 0 || numel % known != 0) {
      g_autofree gchar *s = qkv_shape_to_string(out);
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "%" G_GINT64_FORMAT " elements cannot take the shape %s", numel, s);
    }
    out->dims[inferred] = numel / known;
  } else if (known != numel) {
    g_autofree gchar *s = qkv_shape_to_string(out);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "%" G_GINT64_FORMAT " elements cannot take the shape %s", numel, s);
  }
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

static void
reshape_forward(const QkvKernelCtx *ctx)
{
  /* Run in place, the data is already where it belongs. */
  if (ctx->out[0].data != ctx->in[0].data)
    memcpy(ctx->out[0].data, ctx->in[0].data,
           (gsize)qkv_shape_numel(&ctx->in[0].shape) * qkv_dtype_size(ctx->in[0].dtype));
}

static gboolean
reshape_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] = qkv_reshape(g->out_grads[0], qkv_value_shape(g->inputs[0]), error);
  return g->in_grads[0] != NULL;
}

/* ---- permute ------------------------------------------------------------ */

/* Validate perm against rank and normalise it into out; FALSE if it is not a
 * permutation of the axes. */
static gboolean
permute_normalize(const gint64 *perm, guint n, gint rank, gint *out)
{
  gboolean seen[QKV_MAX_RANK] = {FALSE};
  if ((gint)n != rank)
    return FALSE;
  for (guint i = 0; i < n; i++) {
    gint64 p = perm[i] < 0 ? perm[i] + rank : perm[i];
    if (p < 0 || p >= rank || seen[p])
      return FALSE;
    seen[p] = TRUE;
    out[i] = (gint)p;
  }
  return TRUE;
}

static gboolean
permute_shape(QkvShapeCtx *ctx, GError **error)
{
  guint n;
  const gint64 *perm = qkv_attrs_get_ints(ctx->attrs, "perm", &n);
  const QkvShape *in = &ctx->in_shapes[0];
  gint p[QKV_MAX_RANK];

  if (!permute_normalize(perm, n, in->rank, p)) {
    g_autoptr(GString) s = g_string_new("(");
    for (guint i = 0; i < n; i++)
      g_string_append_printf(s, "%s%" G_GINT64_FORMAT, i ? ", " : "", perm[i]);
    g_string_append_c(s, ')');
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "perm %s is not a permutation of the %d axes of x", s->str, in->rank);
  }
  QkvShape *out = &ctx->out_shapes[0];
  out->rank = in->rank;
  for (gint i = 0; i < in->rank; i++)
    out->dims[i] = in->dims[p[i]];
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

typedef struct {
  const guint32 *src;
  guint32 *dst;
  const QkvShape *out_shape;
  const gint *perm;
  const gint64 *in_strides;
  gint keep;          /* leading axes that move */
  gint64 block;       /* elements of the trailing axes that stay */
  gint64 row, stride; /* when the last axis moves: its length and stride in x */
} PermuteJob;

/* Output blocks [begin, end) of block elements each, copied whole. */
static void
permute_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const PermuteJob *j = user_data;
  for (gint64 b = begin; b < end; b++) {
    gint64 rem = b, offset = 0;
    for (gint i = j->keep - 1; i >= 0; i--) {
      gint64 d = j->out_shape->dims[i];
      offset += (rem % d) * j->in_strides[j->perm[i]];
      rem /= d;
    }
    memcpy(j->dst + b * j->block, j->src + offset, (gsize)j->block * sizeof(guint32));
  }
}

/* Output rows [begin, end), each gathered with a constant stride. */
static void
permute_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const PermuteJob *j = user_data;
  const gint rank = j->out_shape->rank;
  const gint64 row = j->row, stride = j->stride;
  for (gint64 r = begin; r < end; r++) {
    gint64 rem = r, offset = 0;
    for (gint i = rank - 2; i >= 0; i--) {
      gint64 d = j->out_shape->dims[i];
      offset += (rem % d) * j->in_strides[j->perm[i]];
      rem /= d;
    }
    guint32 *out_row = j->dst + r * row;
    const guint32 *src = j->src + offset;
    for (gint64 k = 0; k < row; k++)
      out_row[k] = src[k * stride];
  }
}

static void
permute_forward(const QkvKernelCtx *ctx)
{
  const QkvView *x = &ctx->in[0];
  QkvView *y = &ctx->out[0];
  gint rank = x->shape.rank;
  guint n;
  const gint64 *perm_attr = qkv_attrs_get_ints(ctx->attrs, "perm", &n);
  gint perm[QKV_MAX_RANK];
  gint64 in_strides[QKV_MAX_RANK];
  gint64 numel = qkv_shape_numel(&x->shape);

  if (numel == 0)
    return;
  permute_normalize(perm_attr, n, rank, perm);
  qkv_shape_strides(&x->shape, in_strides);

  /* Trailing axes that stay in place form contiguous blocks (the D of
   * (B, T, H, D) → (B, H, T, D)), copied whole. */
  gint keep = rank;
  gint64 block = 1;
  while (keep > 0 && perm[keep - 1] == keep - 1) {
    keep--;
    block *= x->shape.dims[keep];
  }
  if (keep == 0) {
    memcpy(y->data, x->data, (gsize)numel * sizeof(guint32));
    return;
  }

  const guint32 *src = x->data;
  guint32 *dst = y->data;
  /* a copy: one unit of work per element */
  const gint nt = qkv_kernel_threads(ctx, numel);
  PermuteJob job = {src, dst, &y->shape, perm, in_strides, keep, block, 0, 0};
  if (block > 1) {
    qkv_parallel_for(nt, numel / block, permute_blocks, &job);
  } else {
    /* The last axis moves: gather each output row with a constant stride. */
    job.row = y->shape.dims[rank - 1];
    job.stride = in_strides[perm[rank - 1]];
    qkv_parallel_for(nt, numel / job.row, permute_rows, &job);
  }
}

static gboolean
permute_grad(QkvGradCtx *g, GError **error)
{
  guint n;
  const gint64 *perm_attr = qkv_attrs_get_ints(g->attrs, "perm", &n);
  gint rank = qkv_value_shape(g->inputs[0])->rank;
  gint perm[QKV_MAX_RANK], inverse[QKV_MAX_RANK];

  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  permute_normalize(perm_attr, n, rank, perm);
  for (gint i = 0; i < rank; i++)
    inverse[perm[i]] = i;
  g->in_grads[0] = qkv_permute(g->out_grads[0], inverse, (guint)rank, error);
  return g->in_grads[0] != NULL;
}

/* ---- slice -------------------------------------------------------------- */

/* The slice's axis and [start, end) after normalisation; FALSE with an
 * error if they are out of range (no clamping: a wrong index is a bug in the
 * caller, better reported than hidden). */
static gboolean
slice_resolve(const QkvShapeCtx *ctx, const QkvShape *in, const QkvAttrs *attrs, gint *axis,
              gint64 *start, gint64 *end, GError **error)
{
  gint64 axis_attr = qkv_attrs_get_int(attrs, "axis");
  *axis = (axis_attr < -in->rank || axis_attr >= in->rank)
              ? -1
              : qkv_normalize_axis((gint)axis_attr, in->rank);
  if (*axis < 0)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                          "axis %" G_GINT64_FORMAT " is out of range for rank %d",
                                          axis_attr, in->rank);
  gint64 dim = in->dims[*axis];
  gint64 start_attr = qkv_attrs_get_int(attrs, "start");
  gint64 end_attr = qkv_attrs_get_int(attrs, "end");
  *start = start_attr < 0 ? start_attr + dim : start_attr;
  *end = end_attr < 0 ? end_attr + dim : end_attr;
  if (*start < 0 || *end > dim || *start > *end)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                          "range [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                                          ") is out of range for axis %d of size %" G_GINT64_FORMAT,
                                          start_attr, end_attr, *axis, dim);
  return TRUE;
}

static gboolean
slice_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *in = &ctx->in_shapes[0];
  gint axis;
  gint64 start = 0, end = 0;
  if (!slice_resolve(ctx, in, ctx->attrs, &axis, &start, &end, error))
    return FALSE;
  ctx->out_shapes[0] = *in;
  ctx->out_shapes[0].dims[axis] = end - start;
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

/* Rows of a slice: chunk elements of each outer row of row elements, from
 * element first of that row on. */
typedef struct {
  const guint32 *src;
  guint32 *dst;
  gint64 chunk, row, first;
} SliceJob;

static void
slice_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SliceJob *j = user_data;
  for (gint64 o = begin; o < end; o++)
    memcpy(j->dst + o * j->chunk, j->src + o * j->row + j->first,
           (gsize)j->chunk * sizeof(guint32));
}

/* The adjoint: each chunk put back in a zeroed row. */
static void
slice_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SliceJob *j = user_data;
  const gint64 row = j->row, chunk = j->chunk, first = j->first;
  for (gint64 o = begin; o < end; o++) {
    guint32 *out_row = j->dst + o * row;
    /* Zero only around the copied chunk: each element is written once. */
    memset(out_row, 0, (gsize)first * sizeof(guint32));
    memcpy(out_row + first, j->src + o * chunk, (gsize)chunk * sizeof(guint32));
    memset(out_row + first + chunk, 0, (gsize)(row - first - chunk) * sizeof(guint32));
  }
}

static void
slice_forward(const QkvKernelCtx *ctx)
{
  const QkvView *x = &ctx->in[0];
  gint axis;
  gint64 start = 0, end = 0, outer, len, inner;
  slice_resolve(NULL, &x->shape, ctx->attrs, &axis, &start, &end, NULL);
  split_at_axis(&x->shape, axis, &outer, &len, &inner);

  const guint32 *src = x->data;
  guint32 *dst = ctx->out[0].data;
  gint64 chunk = (end - start) * inner;
  if (chunk == 0)
    return;
  SliceJob job = {src, dst, chunk, len * inner, start * inner};
  qkv_parallel_for(qkv_kernel_threads(ctx, outer * chunk), outer, slice_rows, &job);
}

static gboolean
slice_grad(QkvGradCtx *g, GError **error)
{
  const QkvShape *in = qkv_value_shape(g->inputs[0]);
  gint axis;
  gint64 start = 0, end = 0;
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  slice_resolve(NULL, in, g->attrs, &axis, &start, &end, NULL);
  g->in_grads[0] = qkv_slice_backward(g->out_grads[0], in, axis, start, error);
  return g->in_grads[0] != NULL;
}

/* ---- slice_backward ----------------------------------------------------- */

/* The output shape, axis and start of a slice_backward; FALSE with an error
 * when dy does not fit in the shape at start. */
static gboolean
slice_backward_resolve(const QkvShapeCtx *ctx, const QkvShape *dy, const QkvAttrs *attrs,
                       QkvShape *out, gint *axis, gint64 *start, GError **error)
{
  guint n;
  const gint64 *dims = qkv_attrs_get_ints(attrs, "shape", &n);
  gint64 axis_attr = qkv_attrs_get_int(attrs, "axis");
  gint64 start_attr = qkv_attrs_get_int(attrs, "start");

  if ((gint)n != dy->rank)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                          "shape has rank %u but dy has rank %d", n, dy->rank);
  *axis = (axis_attr < -dy->rank || axis_attr >= dy->rank)
              ? -1
              : qkv_normalize_axis((gint)axis_attr, dy->rank);
  if (*axis < 0)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                          "axis %" G_GINT64_FORMAT " is out of range for rank %d",
                                          axis_attr, dy->rank);
  /* Only the sliced axis is fixed; the others follow dy, so the gradient of a
   * slice runs when a plan binds a smaller batch than it was built for. */
  out->rank = dy->rank;
  for (guint i = 0; i < n; i++)
    out->dims[i] = (gint)i == *axis ? dims[i] : dy->dims[i];
  *start = start_attr < 0 ? start_attr + out->dims[*axis] : start_attr;
  /* no addition: a start near G_MAXINT64 must not wrap around */
  gboolean fits = *start >= 0 && dy->dims[*axis] <= out->dims[*axis] &&
                  *start <= out->dims[*axis] - dy->dims[*axis];
  for (gint i = 0; fits && i < dy->rank; i++)
    fits = dy->dims[i] <= dims[i]; /* smaller on the other axes: a plan's smaller batch */
  if (!fits) {
    g_autofree gchar *s = qkv_shape_to_string(out);
    return ctx == NULL ||
           qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy does not fit in shape %s at start %" G_GINT64_FORMAT " of axis %d",
                           s, start_attr, *axis);
  }
  return TRUE;
}

static gboolean
slice_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  gint axis;
  gint64 start = 0;
  if (!slice_backward_resolve(ctx, &ctx->in_shapes[0], ctx->attrs, &ctx->out_shapes[0], &axis,
                              &start, error))
    return FALSE;
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

static void
slice_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvView *dy = &ctx->in[0];
  QkvShape shape;
  gint axis;
  gint64 start, outer, len, inner;
  slice_backward_resolve(NULL, &dy->shape, ctx->attrs, &shape, &axis, &start, NULL);
  split_at_axis(&shape, axis, &outer, &len, &inner);

  const guint32 *src = dy->data;
  guint32 *dst = ctx->out[0].data;
  gint64 row = len * inner, chunk = dy->shape.dims[axis] * inner;
  if (row == 0)
    return;
  SliceJob job = {src, dst, chunk, row, start * inner};
  qkv_parallel_for(qkv_kernel_threads(ctx, outer * row), outer, slice_backward_rows, &job);
}

static gboolean
slice_backward_grad(QkvGradCtx *g, GError **error)
{
  const QkvShape *dy = qkv_value_shape(g->inputs[0]);
  QkvShape shape;
  gint axis;
  gint64 start = 0;
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  slice_backward_resolve(NULL, dy, g->attrs, &shape, &axis, &start, NULL);
  g->in_grads[0] = qkv_slice(g->out_grads[0], axis, start, start + dy->dims[axis], error);
  return g->in_grads[0] != NULL;
}

/* ---- concat ------------------------------------------------------------- */

static gint
concat_axis(const QkvAttrs *attrs, gint rank)
{
  gint64 axis = qkv_attrs_get_int(attrs, "axis");
  return (axis < -rank || axis >= rank) ? -1 : qkv_normalize_axis((gint)axis, rank);
}

static gboolean
concat_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *first = &ctx->in_shapes[0];
  gint axis = concat_axis(ctx->attrs, first->rank);
  if (axis < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "axis %" G_GINT64_FORMAT " is out of range for rank %d",
                           qkv_attrs_get_int(ctx->attrs, "axis"), first->rank);

  QkvShape *out = &ctx->out_shapes[0];
  *out = *first;
  for (guint i = 1; i < ctx->n_inputs; i++) {
    const QkvShape *s = &ctx->in_shapes[i];
    if (ctx->in_dtypes[i] != ctx->in_dtypes[0])
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE,
                             "input %u is %s but input 0 is %s (they must agree)", i,
                             qkv_dtype_name(ctx->in_dtypes[i]), qkv_dtype_name(ctx->in_dtypes[0]));
    if (s->rank != first->rank)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "input %u has rank %d but input 0 has rank %d", i, s->rank,
                             first->rank);
    for (gint d = 0; d < s->rank; d++)
      if (d != axis && s->dims[d] != first->dims[d])
        return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                               "input %u differs from input 0 on axis %d (%" G_GINT64_FORMAT
                               " vs %" G_GINT64_FORMAT "), which is not the concat axis %d",
                               i, d, s->dims[d], first->dims[d], axis);
    out->dims[axis] += s->dims[axis];
  }
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

typedef struct {
  const QkvKernelCtx *ctx;
  guint32 *dst;
  gint64 row, inner;
  gint axis;
} ConcatJob;

/* Output rows [begin, end): each input's chunk in turn. */
static void
concat_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ConcatJob *j = user_data;
  for (gint64 o = begin; o < end; o++) {
    guint32 *out_row = j->dst + o * j->row;
    for (guint i = 0; i < j->ctx->n_inputs; i++) {
      gint64 chunk = j->ctx->in[i].shape.dims[j->axis] * j->inner;
      const guint32 *src = j->ctx->in[i].data;
      memcpy(out_row, src + o * chunk, (gsize)chunk * sizeof(guint32));
      out_row += chunk;
    }
  }
}

static void
concat_forward(const QkvKernelCtx *ctx)
{
  QkvView *y = &ctx->out[0];
  gint axis = concat_axis(ctx->attrs, y->shape.rank);
  gint64 outer, len, inner;
  split_at_axis(&y->shape, axis, &outer, &len, &inner);

  guint32 *dst = y->data;
  gint64 row = len * inner;
  if (row == 0)
    return;
  ConcatJob job = {ctx, dst, row, inner, axis};
  qkv_parallel_for(qkv_kernel_threads(ctx, outer * row), outer, concat_rows, &job);
}

static gboolean
concat_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dy = g->out_grads[0];
  gint axis = concat_axis(g->attrs, qkv_value_shape(g->outputs[0])->rank);
  gint64 offset = 0;
  if (dy == NULL)
    return TRUE;
  for (guint i = 0; i < g->n_inputs; i++) {
    gint64 len = qkv_value_shape(g->inputs[i])->dims[axis];
    if (g->needs_grad[i]) {
      g->in_grads[i] = qkv_slice(dy, axis, offset, offset + len, error);
      if (g->in_grads[i] == NULL)
        return FALSE;
    }
    offset += len;
  }
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_shape[] = {
    QKV_OP(.name = "reshape", .doc = "the same elements in a new shape; one dimension may be -1",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("shape", INTS,
                                       "the new shape; one dimension may be -1 (inferred)")),
           .flags = QKV_OP_INPLACE, .shape = reshape_shape, .forward = reshape_forward,
           .gradient = reshape_grad),
    QKV_OP(.name = "permute", .doc = "reorder the axes: output axis i is input axis perm[i]",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR(
               "perm", INTS, "output axis i is input axis perm[i] (negative counts from the end)")),
           .shape = permute_shape, .forward = permute_forward, .gradient = permute_grad),
    QKV_OP(.name = "slice",
           .doc = "the elements start ≤ i < end along axis; negative indices count from the end, "
                  "and indices out of range are an error",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(
               QKV_REQUIRED_ATTR("axis", INT, "the axis to slice (negative counts from the end)"),
               QKV_REQUIRED_ATTR("start", INT, "first index kept (negative counts from the end)"),
               QKV_REQUIRED_ATTR("end", INT,
                                 "one past the last index kept (negative counts from the end)")),
           .shape = slice_shape, .forward = slice_forward, .gradient = slice_grad),
    QKV_OP(.name = "slice_backward",
           .doc = "zeros of the sliced input's shape with dy placed at start along axis",
           QKV_INPUTS("dy"), QKV_OUTPUTS("dx"),
           QKV_ATTRS(
               QKV_REQUIRED_ATTR("shape", INTS,
                                 "the sliced input's shape at build time; only its size along axis "
                                 "is kept, the other axes follow dy"),
               QKV_REQUIRED_ATTR("axis", INT, "the sliced axis (negative counts from the end)"),
               QKV_REQUIRED_ATTR("start", INT,
                                 "where dy starts along axis (negative counts from the end)")),
           .shape = slice_backward_shape, .forward = slice_backward_forward,
           .gradient = slice_backward_grad),
    QKV_OP(.name = "concat", .doc = "join the inputs along axis; the other axes must agree",
           QKV_INPUTS_VARIADIC("xs"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("axis", INT,
                                       "the axis to join along (negative counts from the end)")),
           .shape = concat_shape, .forward = concat_forward, .gradient = concat_grad),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

QkvValue *
qkv_reshape(QkvValue *x, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(shape != NULL, NULL);
  QKV_RETURN_IF_MISSING("reshape", error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "shape",
                        qkv_variant_ints(shape->dims, (gsize)MAX(shape->rank, 0)));
  return qkv_op_call("reshape", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_permute(QkvValue *x, const gint *perm, guint n, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(perm != NULL || n == 0, NULL);
  QKV_RETURN_IF_MISSING("permute", error, x);
  g_autofree gint64 *values = g_new(gint64, MAX(n, 1));
  for (guint i = 0; i < n; i++)
    values[i] = perm[i];
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "perm", qkv_variant_ints(values, n));
  return qkv_op_call("permute", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_transpose(QkvValue *x, gint axis0, gint axis1, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("transpose", error, x);
  gint rank = qkv_value_shape(x)->rank;
  gint a0 = qkv_normalize_axis(axis0, rank), a1 = qkv_normalize_axis(axis1, rank);
  if (a0 < 0 || a1 < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "op 'permute' (transpose): axes (%d, %d) are out of range for %s of rank %d", axis0,
                axis1, qkv_value_name(x), rank);
    return NULL;
  }
  gint perm[QKV_MAX_RANK];
  for (gint i = 0; i < rank; i++)
    perm[i] = i;
  perm[a0] = a1;
  perm[a1] = a0;
  return qkv_permute(x, perm, (guint)rank, error);
}

QkvValue *
qkv_slice(QkvValue *x, gint axis, gint64 start, gint64 end, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("slice", error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  g_variant_builder_add(&attrs, "{sv}", "start", g_variant_new_int64(start));
  g_variant_builder_add(&attrs, "{sv}", "end", g_variant_new_int64(end));
  return qkv_op_call("slice", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_concat(QkvValue *const *xs, guint n, gint axis, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(xs != NULL && n > 0, NULL);
  if (!qkv_values_present("concat", xs, n, error))
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  return qkv_op_call("concat", xs, n, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_slice_backward(QkvValue *dy, const QkvShape *input_shape, gint axis, gint64 start,
                   GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(input_shape != NULL, NULL);
  QKV_RETURN_IF_MISSING("slice_backward", error, dy);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "shape",
                        qkv_variant_ints(input_shape->dims, (gsize)MAX(input_shape->rank, 0)));
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  g_variant_builder_add(&attrs, "{sv}", "start", g_variant_new_int64(start));
  return qkv_op_call("slice_backward", &dy, 1, g_variant_builder_end(&attrs), error);
}
