/* index.c: picking elements by i32 indices along an axis: "gather" (an
 * index per output element, as torch.gather), "index_select" (whole slices,
 * as torch.index_select), and their gradients "gather_backward" and
 * "index_select_backward", which scatter-add.
 *
 * As with "embedding", an index outside [0, size of the axis) fails the run,
 * naming its position and value, unless the node has zero_out_of_range:
 * then it picks a zero and receives no gradient. The scatter-adds skip such
 * indices. Nothing reads or writes out of bounds. Negative indices do not
 * count from the end (PyTorch refuses them).
 *
 * The scatter-adds split their work by output position off the axis: every
 * task owns whole fibers along the axis, so no two threads write one element
 * and each element sums its terms in index order, whatever the thread count.
 */
#include "ops-common.h"
#include "error-private.h"

/* Columns per task: a block of the positions after the axis. */
#define INDEX_COL_BLOCK 256

/* Every op's here. */
#define AXIS_ATTR QKV_REQUIRED_ATTR("axis", INT, "the axis indexed (negative counts from the end)")

/* gather's and index_select's. */
static const QkvAttrSpec pick_attrs[] = {
    AXIS_ATTR,
    QKV_ZERO_OUT_OF_RANGE_ATTR,
};

static gint
attr_axis(const QkvAttrs *attrs, gint rank)
{
  gint64 axis = qkv_attrs_get_int(attrs, "axis");
  return (axis < -rank || axis >= rank) ? -1 : qkv_normalize_axis((gint)axis, rank);
}

static gboolean
axis_error(QkvShapeCtx *ctx, gint rank, GError **error)
{
  return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                         "axis %" G_GINT64_FORMAT " is out of range for rank %d",
                         qkv_attrs_get_int(ctx->attrs, "axis"), rank);
}

static gboolean
check_dtype(QkvShapeCtx *ctx, guint i, const gchar *name, gboolean i32_too, GError **error)
{
  QkvDType t = ctx->in_dtypes[i];
  if (t == QKV_F32 || (i32_too && t == QKV_I32))
    return TRUE;
  return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected %s", name,
                         qkv_dtype_name(t), i32_too ? "f32 or i32" : "f32");
}

static gboolean
check_index_dtype(QkvShapeCtx *ctx, guint i, GError **error)
{
  if (ctx->in_dtypes[i] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "index is %s, expected i32",
                           qkv_dtype_name(ctx->in_dtypes[i]));
  return TRUE;
}

/* ---- gather and gather_backward ---------------------------------------- */

/* index (…, L, …) against the data shape (…, N, …): same rank, and no
 * larger than the data off the axis (as torch.gather asks). */
static gboolean
check_gather_index(QkvShapeCtx *ctx, const QkvShape *index, const QkvShape *data,
                   const gchar *data_name, gint axis, GError **error)
{
  if (index->rank != data->rank)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "index has rank %d but %s has rank %d (they must agree)", index->rank,
                           data_name, data->rank);
  for (gint d = 0; d < data->rank; d++)
    if (d != axis && index->dims[d] > data->dims[d])
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "index is longer than %s on axis %d (%" G_GINT64_FORMAT
                             " > %" G_GINT64_FORMAT "), which is not the gather axis %d",
                             data_name, d, index->dims[d], data->dims[d], axis);
  return TRUE;
}

static gboolean
gather_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0], *index = &ctx->in_shapes[1];
  if (!check_dtype(ctx, 0, "x", TRUE, error) || !check_index_dtype(ctx, 1, error))
    return FALSE;
  gint axis = attr_axis(ctx->attrs, x->rank);
  if (axis < 0)
    return axis_error(ctx, x->rank, error);
  if (!check_gather_index(ctx, index, x, "x", axis, error))
    return FALSE;
  ctx->out_shapes[0] = *index;
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

/* The attribute "shape" as a QkvShape, checked. */
static gboolean
shape_attr(QkvShapeCtx *ctx, const QkvAttrs *attrs, QkvShape *shape, GError **error)
{
  guint n = 0;
  const gint64 *dims = qkv_attrs_get_ints(attrs, "shape", &n);
  if (n > QKV_MAX_RANK)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                                          "shape has rank %u, more than %d", n, QKV_MAX_RANK);
  for (guint i = 0; i < n; i++)
    if (dims[i] < 0)
      return ctx == NULL ||
             qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "shape has a negative dim %" G_GINT64_FORMAT " at axis %u", dims[i],
                             i);
  *shape = n > 0 ? qkv_shape_from_array((gint)n, dims) : qkv_shape_scalar();
  return TRUE;
}

static gboolean
gather_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *index = &ctx->in_shapes[1];
  QkvShape shape;
  if (!check_dtype(ctx, 0, "dy", FALSE, error) || !check_index_dtype(ctx, 1, error) ||
      !shape_attr(ctx, ctx->attrs, &shape, error))
    return FALSE;
  gint axis = attr_axis(ctx->attrs, shape.rank);
  if (axis < 0)
    return axis_error(ctx, shape.rank, error);
  if (!qkv_shape_equal(dy, index))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and index must have the same shape");
  if (!check_gather_index(ctx, index, &shape, "shape", axis, error))
    return FALSE;
  ctx->out_shapes[0] = shape;
  return TRUE;
}

/* Where the positions of an index (or dy) tensor land in the data tensor:
 * index is (outer, len, inner) around the axis, data (·, n, data_inner). */
typedef struct {
  const QkvShape *index_shape, *data_shape;
  gint axis;
  gint64 outer, len, inner, n, data_inner, n_blocks;
  /* The positions after the axis are laid out alike in both. */
  gboolean same_inner;
} GatherLayout;

static void
gather_layout(GatherLayout *l, const QkvShape *index, const QkvShape *data, gint axis)
{
  l->index_shape = index;
  l->data_shape = data;
  l->axis = axis;
  l->outer = l->inner = l->data_inner = 1;
  l->same_inner = TRUE;
  for (gint d = 0; d < axis; d++)
    l->outer *= index->dims[d];
  for (gint d = axis + 1; d < index->rank; d++) {
    l->inner *= index->dims[d];
    l->data_inner *= data->dims[d];
    l->same_inner &= index->dims[d] == data->dims[d];
  }
  l->len = index->dims[axis];
  l->n = data->dims[axis];
  l->n_blocks = (l->inner + INDEX_COL_BLOCK - 1) / INDEX_COL_BLOCK;
}

/* Offset in data of outer position o of the index (axis position 0). */
static gint64
gather_outer_offset(const GatherLayout *l, gint64 o)
{
  gint64 off = 0, stride = l->n * l->data_inner;
  for (gint d = l->axis - 1; d >= 0; d--) {
    off += (o % l->index_shape->dims[d]) * stride;
    o /= l->index_shape->dims[d];
    stride *= l->data_shape->dims[d];
  }
  return off;
}

/* Offsets in data of the inner positions c0 .. c0 + width of the index. */
static void
gather_inner_offsets(const GatherLayout *l, gint64 c0, gint64 width, gint64 *offsets)
{
  for (gint64 c = 0; c < width; c++) {
    if (l->same_inner) {
      offsets[c] = c0 + c;
      continue;
    }
    gint64 rest = c0 + c, off = 0, stride = 1;
    for (gint d = l->index_shape->rank - 1; d > l->axis; d--) {
      off += (rest % l->index_shape->dims[d]) * stride;
      rest /= l->index_shape->dims[d];
      stride *= l->data_shape->dims[d];
    }
    offsets[c] = off;
  }
}

typedef struct {
  GatherLayout l;
  const gint32 *index;
  /* gather: read src (data), write dst (index-shaped); gather_backward:
   * read src (index-shaped), add into dst (data). */
  gconstpointer src;
  gpointer dst;
  gboolean i32;
  QkvBadIndex *bad; /* gather's, unless zero_out_of_range */
} GatherJob;

static void
gather_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const GatherJob *j = user_data;
  const GatherLayout *l = &j->l;
  gint64 inner_off[INDEX_COL_BLOCK];
  for (gint64 t = begin; t < end; t++) {
    const gint64 o = t / l->n_blocks, c0 = (t % l->n_blocks) * INDEX_COL_BLOCK;
    const gint64 width = MIN(INDEX_COL_BLOCK, l->inner - c0);
    const gint64 base = gather_outer_offset(l, o);
    gather_inner_offsets(l, c0, width, inner_off);
    for (gint64 k = 0; k < l->len; k++) {
      const gint64 row = (o * l->len + k) * l->inner + c0;
      const gint32 *id = j->index + row;
      /* 4-byte elements moved as bits: f32 and i32 alike. */
      const guint32 *src = j->src;
      guint32 *dst = (guint32 *)j->dst + row;
      for (gint64 c = 0; c < width; c++) {
        gint64 i = id[c];
        if (G_LIKELY(i >= 0 && i < l->n)) {
          dst[c] = src[base + i * l->data_inner + inner_off[c]];
        } else {
          dst[c] = 0;
          if (j->bad != NULL)
            qkv_bad_index_note(j->bad, row + c);
        }
      }
    }
  }
}

static void
gather_backward_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const GatherJob *j = user_data;
  const GatherLayout *l = &j->l;
  gint64 inner_off[INDEX_COL_BLOCK];
  for (gint64 t = begin; t < end; t++) {
    const gint64 o = t / l->n_blocks, c0 = (t % l->n_blocks) * INDEX_COL_BLOCK;
    const gint64 width = MIN(INDEX_COL_BLOCK, l->inner - c0);
    const gint64 base = gather_outer_offset(l, o);
    gather_inner_offsets(l, c0, width, inner_off);
    float *dst = j->dst;
    for (gint64 k = 0; k < l->len; k++) {
      const gint64 row = (o * l->len + k) * l->inner + c0;
      const gint32 *id = j->index + row;
      const float *src = (const float *)j->src + row;
      for (gint64 c = 0; c < width; c++) {
        gint64 i = id[c];
        if (i >= 0 && i < l->n)
          dst[base + i * l->data_inner + inner_off[c]] += src[c];
      }
    }
  }
}

typedef struct {
  float *x;
} ZeroJob;

static void
zero_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ZeroJob *j = user_data;
  memset(j->x + begin, 0, (gsize)(end - begin) * sizeof(float));
}

static void
zero_fill(const QkvKernelCtx *ctx, float *x, gint64 n)
{
  ZeroJob job = {x};
  qkv_parallel_for(qkv_kernel_threads(ctx, n / 8), n, zero_range, &job);
}

static void
gather_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *x = &ctx->in[0].shape, *index = &ctx->in[1].shape;
  QkvBadIndex bad;
  qkv_bad_index_init(&bad);
  GatherJob job = {.index = ctx->in[1].data,
                   .src = ctx->in[0].data,
                   .dst = ctx->out[0].data,
                   .bad = qkv_attrs_get_bool(ctx->attrs, "zero_out_of_range") ? NULL : &bad};
  gint axis = attr_axis(ctx->attrs, x->rank);
  gather_layout(&job.l, index, x, axis);
  gint64 n_tasks = job.l.outer * job.l.n_blocks;
  if (qkv_shape_numel(index) == 0)
    return;
  gint nt = qkv_kernel_threads(ctx, qkv_shape_numel(index));
  qkv_parallel_for(MIN((gint64)nt, n_tasks), n_tasks, gather_range, &job);
  qkv_bad_index_report(ctx, &bad, "index", job.index, index, job.l.n, axis);
}

static void
gather_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *index = &ctx->in[1].shape, *shape = &ctx->out[0].shape;
  GatherJob job = {.index = ctx->in[1].data, .src = ctx->in[0].data, .dst = ctx->out[0].data};
  gather_layout(&job.l, index, shape, attr_axis(ctx->attrs, shape->rank));
  zero_fill(ctx, ctx->out[0].data, qkv_shape_numel(shape));
  gint64 n_tasks = job.l.outer * job.l.n_blocks;
  if (qkv_shape_numel(index) == 0)
    return;
  gint nt = qkv_kernel_threads(ctx, qkv_shape_numel(index));
  qkv_parallel_for(MIN((gint64)nt, n_tasks), n_tasks, gather_backward_range, &job);
}

static gboolean
gather_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  const QkvShape *x = qkv_value_shape(g->inputs[0]);
  g->in_grads[0] =
      qkv_gather_backward(g->out_grads[0], g->inputs[1], x, attr_axis(g->attrs, x->rank), error);
  return g->in_grads[0] != NULL;
}

/* gather or index_select of x at index along axis with zero_out_of_range:
 * the adjoint of a scatter-add that skips bad indices. */
static QkvValue *
pick_zero_out_of_range(const gchar *op_name, QkvValue *x, QkvValue *index, gint axis,
                       GError **error)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  g_variant_builder_add(&attrs, "{sv}", "zero_out_of_range", g_variant_new_boolean(TRUE));
  QkvValue *inputs[] = {x, index};
  return qkv_op_call(op_name, inputs, 2, g_variant_builder_end(&attrs), error);
}

/* Linear in dy: its gradient gathers the incoming one (indices the
 * scatter-add skipped pick zeros). */
static gboolean
gather_backward_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  const QkvShape *shape = qkv_value_shape(g->outputs[0]);
  g->in_grads[0] = pick_zero_out_of_range("gather", g->out_grads[0], g->inputs[1],
                                          attr_axis(g->attrs, shape->rank), error);
  return g->in_grads[0] != NULL;
}

/* ---- index_select and index_select_backward ---------------------------- */

static gboolean
index_select_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0], *index = &ctx->in_shapes[1];
  if (!check_dtype(ctx, 0, "x", TRUE, error) || !check_index_dtype(ctx, 1, error))
    return FALSE;
  gint axis = attr_axis(ctx->attrs, x->rank);
  if (axis < 0)
    return axis_error(ctx, x->rank, error);
  if (index->rank != 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "index must have rank 1, it has rank %d",
                           index->rank);
  ctx->out_shapes[0] = *x;
  ctx->out_shapes[0].dims[axis] = index->dims[0];
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

static gboolean
index_select_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *index = &ctx->in_shapes[1];
  gint64 size = qkv_attrs_get_int(ctx->attrs, "size");
  if (!check_dtype(ctx, 0, "dy", FALSE, error) || !check_index_dtype(ctx, 1, error))
    return FALSE;
  gint axis = attr_axis(ctx->attrs, dy->rank);
  if (axis < 0)
    return axis_error(ctx, dy->rank, error);
  if (size < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "size must not be negative, got %" G_GINT64_FORMAT, size);
  if (index->rank != 1 || index->dims[0] != dy->dims[axis])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "index must have rank 1 and the length of dy's axis %d", axis);
  ctx->out_shapes[0] = *dy;
  ctx->out_shapes[0].dims[axis] = size;
  return TRUE;
}

typedef struct {
  const gint32 *index;
  gconstpointer src;
  gpointer dst;
  /* Around the axis: outer × (src_len or dst_len) × inner. */
  gint64 src_len, dst_len, inner, n_blocks;
  QkvBadIndex *bad; /* index_select's, unless zero_out_of_range */
} SelectJob;

/* Rows (o, k) of the output: a copy of row index[k] of x, or zeros. */
static void
index_select_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SelectJob *j = user_data;
  const gint64 k_len = j->dst_len, inner = j->inner, n = j->src_len;
  for (gint64 r = begin; r < end; r++) {
    const gint64 o = r / k_len, k = r % k_len, i = j->index[k];
    guint32 *dst = (guint32 *)j->dst + r * inner;
    if (G_LIKELY(i >= 0 && i < n)) {
      memcpy(dst, (const guint32 *)j->src + (o * n + i) * inner, (gsize)inner * sizeof(guint32));
    } else {
      memset(dst, 0, (gsize)inner * sizeof(guint32));
      if (j->bad != NULL)
        qkv_bad_index_note(j->bad, k);
    }
  }
}

/* Tasks (o, block of columns): zero the block along the whole axis of dx,
 * then add the rows of dy in index order. */
static void
index_select_backward_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SelectJob *j = user_data;
  const gint64 k_len = j->src_len, n = j->dst_len, inner = j->inner;
  for (gint64 t = begin; t < end; t++) {
    const gint64 o = t / j->n_blocks, c0 = (t % j->n_blocks) * INDEX_COL_BLOCK;
    const gint64 width = MIN(INDEX_COL_BLOCK, inner - c0);
    float *dx = (float *)j->dst + o * n * inner + c0;
    const float *dy = (const float *)j->src + o * k_len * inner + c0;
    for (gint64 r = 0; r < n; r++)
      memset(dx + r * inner, 0, (gsize)width * sizeof(float));
    for (gint64 k = 0; k < k_len; k++) {
      const gint64 i = j->index[k];
      if (i < 0 || i >= n)
        continue;
      float *d = dx + i * inner;
      const float *s = dy + k * inner;
#pragma omp simd
      for (gint64 c = 0; c < width; c++)
        d[c] += s[c];
    }
  }
}

static void
split_at(const QkvShape *shape, gint axis, gint64 *outer, gint64 *inner)
{
  *outer = *inner = 1;
  for (gint d = 0; d < axis; d++)
    *outer *= shape->dims[d];
  for (gint d = axis + 1; d < shape->rank; d++)
    *inner *= shape->dims[d];
}

static void
index_select_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *x = &ctx->in[0].shape, *y = &ctx->out[0].shape;
  gint axis = attr_axis(ctx->attrs, x->rank);
  gint64 outer, inner;
  split_at(x, axis, &outer, &inner);
  QkvBadIndex bad;
  qkv_bad_index_init(&bad);
  SelectJob job = {ctx->in[1].data,
                   ctx->in[0].data,
                   ctx->out[0].data,
                   x->dims[axis],
                   y->dims[axis],
                   inner,
                   0,
                   qkv_attrs_get_bool(ctx->attrs, "zero_out_of_range") ? NULL : &bad};
  gint64 rows = outer * y->dims[axis];
  if (rows == 0 || inner == 0)
    return;
  qkv_parallel_for(qkv_kernel_threads(ctx, rows * inner), rows, index_select_range, &job);
  qkv_bad_index_report(ctx, &bad, "index", job.index, &ctx->in[1].shape, job.src_len, axis);
}

static void
index_select_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *dy = &ctx->in[0].shape, *dx = &ctx->out[0].shape;
  gint axis = attr_axis(ctx->attrs, dy->rank);
  gint64 outer, inner;
  split_at(dx, axis, &outer, &inner);
  SelectJob job = {ctx->in[1].data,
                   ctx->in[0].data,
                   ctx->out[0].data,
                   dy->dims[axis],
                   dx->dims[axis],
                   inner,
                   (inner + INDEX_COL_BLOCK - 1) / INDEX_COL_BLOCK,
                   NULL};
  gint64 n_tasks = outer * job.n_blocks;
  if (n_tasks == 0)
    return;
  gint nt = qkv_kernel_threads(ctx, qkv_shape_numel(dy) + qkv_shape_numel(dx));
  qkv_parallel_for(MIN((gint64)nt, n_tasks), n_tasks, index_select_backward_range, &job);
}

static gboolean
index_select_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  const QkvShape *x = qkv_value_shape(g->inputs[0]);
  gint axis = attr_axis(g->attrs, x->rank);
  g->in_grads[0] =
      qkv_index_select_backward(g->out_grads[0], g->inputs[1], x->dims[axis], axis, error);
  return g->in_grads[0] != NULL;
}

static gboolean
index_select_backward_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  gint axis = attr_axis(g->attrs, qkv_value_shape(g->inputs[0])->rank);
  g->in_grads[0] =
      pick_zero_out_of_range("index_select", g->out_grads[0], g->inputs[1], axis, error);
  return g->in_grads[0] != NULL;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_index[] = {
    QKV_OP(.name = "gather",
           .doc = "y[…, k, …] = x[…, index[…, k, …], …] along axis (torch.gather); y has index's "
                  "shape; an index out of range fails the run, or with zero_out_of_range gives 0",
           QKV_INPUTS("x", "index"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(pick_attrs),
           .no_grad_inputs = 1 << 1, .shape = gather_shape, .forward = gather_forward,
           .gradient = gather_grad),
    QKV_OP(.name = "gather_backward",
           .doc = "zeros of shape with dy scatter-added at index along axis (the gradient of "
                  "gather); indices out of range are skipped",
           QKV_INPUTS("dy", "index"), QKV_OUTPUTS("dx"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("shape", INTS, "the gathered input's shape"), AXIS_ATTR),
           .no_grad_inputs = 1 << 1, .shape = gather_backward_shape,
           .forward = gather_backward_forward, .gradient = gather_backward_grad),
    QKV_OP(.name = "index_select",
           .doc = "the slices of x at the positions index (i32, rank 1) along axis; an index out "
                  "of range fails the run, or with zero_out_of_range gives a zero slice",
           QKV_INPUTS("x", "index"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(pick_attrs),
           .no_grad_inputs = 1 << 1, .shape = index_select_shape, .forward = index_select_forward,
           .gradient = index_select_grad),
    QKV_OP(.name = "index_select_backward",
           .doc = "zeros with size along axis, the slices of dy added at index (the gradient of "
                  "index_select); indices out of range are skipped",
           QKV_INPUTS("dy", "index"), QKV_OUTPUTS("dx"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("size", INT, "the length of the selected input's axis"),
                     AXIS_ATTR),
           .no_grad_inputs = 1 << 1, .shape = index_select_backward_shape,
           .forward = index_select_backward_forward, .gradient = index_select_backward_grad),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */

static GVariant *
axis_attrs_new(gint axis)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  return g_variant_builder_end(&attrs);
}

QkvValue *
qkv_gather(QkvValue *x, QkvValue *index, gint axis, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL || index == NULL)
    return NULL;
  QkvValue *inputs[] = {x, index};
  return qkv_op_call("gather", inputs, 2, axis_attrs_new(axis), error);
}

QkvValue *
qkv_gather_backward(QkvValue *dy, QkvValue *index, const QkvShape *input_shape, gint axis,
                    GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (dy == NULL || index == NULL || input_shape == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "shape",
                        qkv_variant_ints(input_shape->dims, (gsize)MAX(input_shape->rank, 0)));
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  QkvValue *inputs[] = {dy, index};
  return qkv_op_call("gather_backward", inputs, 2, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_index_select(QkvValue *x, QkvValue *index, gint axis, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL || index == NULL)
    return NULL;
  QkvValue *inputs[] = {x, index};
  return qkv_op_call("index_select", inputs, 2, axis_attrs_new(axis), error);
}

QkvValue *
qkv_index_select_backward(QkvValue *dy, QkvValue *index, gint64 size, gint axis, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (dy == NULL || index == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "size", g_variant_new_int64(size));
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  QkvValue *inputs[] = {dy, index};
  return qkv_op_call("index_select_backward", inputs, 2, g_variant_builder_end(&attrs), error);
}
