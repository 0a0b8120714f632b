/* reduce.c: sums over axes ("sum", "mean"), summing down to a broadcast
 * source shape ("sum_to") and its adjoint, repeating up to a shape
 * ("broadcast_to").
 *
 * All three reductions share one kernel. It first merges adjacent axes that
 * are reduced (or kept) alike and drops axes of size 1; nearly every real case
 * then reads as [outer, reduced, inner] (a total, row sums, column sums, a
 * middle axis), each with a loop that runs over contiguous memory.
 */
#include "ops-common.h"

#include <math.h>
#include "error-private.h"

/* At most this many parts for a total (its partial sums live on the stack). */
#define REDUCE_MAX_PARTS 64

/* Columns summed per task on the [outer, reduced, inner] path: a stack
 * accumulator this wide stays in L1 and the inner loop vectorises. */
#define REDUCE_COL_BLOCK 256

/* ---------------------------------------------------------------------------
 * The shared reduction kernel
 * ------------------------------------------------------------------------- */

typedef struct {
  /* [outer, reduced, inner] when general is FALSE. */
  gboolean general;
  gint64 outer, reduced, inner;
  /* The merged axes for the general path: sizes and output strides (0 on
   * reduced axes). */
  gint rank;
  gint64 dims[QKV_MAX_RANK];
  gint64 out_strides[QKV_MAX_RANK];
} ReduceLayout;

static void
reduce_layout(const QkvShape *in, const gboolean *reduced_axis, ReduceLayout *l)
{
  gint64 sizes[QKV_MAX_RANK];
  gboolean red[QKV_MAX_RANK];
  gint n = 0;
  /* Merge runs of axes that are all reduced or all kept; an axis of size 1
   * changes nothing in the layout, whichever it is. */
  for (gint d = 0; d < in->rank; d++) {
    if (in->dims[d] == 1)
      continue;
    if (n > 0 && red[n - 1] == reduced_axis[d]) {
      sizes[n - 1] *= in->dims[d];
    } else {
      sizes[n] = in->dims[d];
      red[n] = reduced_axis[d];
      n++;
    }
  }

  gint i = 0;
  l->outer = l->reduced = l->inner = 1;
  if (i < n && !red[i])
    l->outer = sizes[i++];
  if (i < n && red[i])
    l->reduced = sizes[i++];
  if (i < n && !red[i])
    l->inner = sizes[i++];
  l->general = i < n;

  if (l->general) {
    l->rank = n;
    gint64 stride = 1;
    for (gint d = n - 1; d >= 0; d--) {
      l->dims[d] = sizes[d];
      l->out_strides[d] = red[d] ? 0 : stride;
      if (!red[d])
        stride *= sizes[d];
    }
  }
}

/* Σ x[0..n) in double: a float sum of many terms drifts, and the vectorised
 * double sum costs little more. */
static double
sum_contiguous(const float *x, gint64 n)
{
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (gint64 i = 0; i < n; i++)
    acc += x[i];
  return acc;
}

typedef struct {
  const float *x;
  gint64 n;
  gint n_parts;
  double *partial;
} ReduceTotalJob;

/* Parts [begin, end) of a total; part p is [n·p/n_parts, n·(p+1)/n_parts). */
static void
reduce_total_parts(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ReduceTotalJob *j = user_data;
  for (gint64 p = begin; p < end; p++) {
    gint64 b = j->n * p / j->n_parts, e = j->n * (p + 1) / j->n_parts;
    j->partial[p] = sum_contiguous(j->x + b, e - b);
  }
}

typedef struct {
  const float *x;
  float *out;
  gint64 red;
} ReduceRowsJob;

static void
reduce_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ReduceRowsJob *j = user_data;
  for (gint64 o = begin; o < end; o++)
    j->out[o] = (float)sum_contiguous(j->x + o * j->red, j->red);
}

typedef struct {
  const float *x;
  float *out;
  gint64 red, inner, n_blocks;
} ReduceColsJob;

static void
reduce_col_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ReduceColsJob *c = user_data;
  const gint64 red = c->red, inner = c->inner, n_blocks = c->n_blocks;
  for (gint64 t = begin; t < end; t++) {
    const gint64 o = t / n_blocks;
    const gint64 j0 = (t % n_blocks) * REDUCE_COL_BLOCK;
    const gint64 width = MIN(REDUCE_COL_BLOCK, inner - j0);
    const float *slab = c->x + o * red * inner + j0;
    float acc[REDUCE_COL_BLOCK];
    for (gint64 j = 0; j < width; j++)
      acc[j] = 0.0f;
    for (gint64 r = 0; r < red; r++) {
      const float *row = slab + r * inner;
#pragma omp simd
      for (gint64 j = 0; j < width; j++)
        acc[j] += row[j];
    }
    memcpy(c->out + o * inner + j0, acc, (gsize)width * sizeof(float));
  }
}

/* out = x summed over the axes flagged in reduced_axis; out has the kept axes'
 * elements in order. Allocates nothing. */
static void
reduce_sum(const QkvKernelCtx *ctx, const float *x, const QkvShape *in_shape,
           const gboolean *reduced_axis, float *out)
{
  ReduceLayout l;
  reduce_layout(in_shape, reduced_axis, &l);
  const gint64 n_in = qkv_shape_numel(in_shape);
  const gint n_threads = qkv_kernel_threads(ctx, n_in);

  if (l.general) {
    /* Rare (reduced axes on both sides of a kept one): one pass over x with an
     * odometer that tracks the output offset. */
    gint64 n_out = 1;
    for (gint d = 0; d < l.rank; d++)
      if (l.out_strides[d] != 0)
        n_out *= l.dims[d];
    memset(out, 0, (gsize)n_out * sizeof(float));
    gint64 coord[QKV_MAX_RANK] = {0};
    gint64 off = 0;
    for (gint64 i = 0; i < n_in; i++) {
      out[off] += x[i];
      for (gint d = l.rank - 1; d >= 0; d--) {
        off += l.out_strides[d];
        if (++coord[d] < l.dims[d])
          break;
        off -= l.out_strides[d] * l.dims[d];
        coord[d] = 0;
      }
    }
    return;
  }

  const gint64 outer = l.outer, red = l.reduced, inner = l.inner;
  if (inner == 1 && outer == 1) {
    /* A total: one contiguous part per thread, the parts' sums added in
     * order, so the result depends only on the thread count (not on which
     * thread ran which part). */
    const gint n_parts = MIN(n_threads, REDUCE_MAX_PARTS);
    double partial[REDUCE_MAX_PARTS];
    ReduceTotalJob job = {x, red, n_parts, partial};
    qkv_parallel_for(n_parts, n_parts, reduce_total_parts, &job);
    double acc = 0.0;
    for (gint t = 0; t < n_parts; t++)
      acc += partial[t];
    out[0] = (float)acc;
  } else if (inner == 1) {
    /* Row sums. */
    ReduceRowsJob job = {x, out, red};
    qkv_parallel_for(n_threads, outer, reduce_rows, &job);
  } else {
    /* Column sums of each [reduced, inner] slab, a block of columns per task. */
    const gint64 n_blocks = (inner + REDUCE_COL_BLOCK - 1) / REDUCE_COL_BLOCK;
    ReduceColsJob job = {x, out, red, inner, n_blocks};
    qkv_parallel_for(n_threads, outer * n_blocks, reduce_col_blocks, &job);
  }
}

/* ---------------------------------------------------------------------------
 * "sum" and "mean"
 * ------------------------------------------------------------------------- */

static const QkvAttrSpec reduce_attrs[] = {
    QKV_INTS_ATTR("axes", "axes to reduce, negative ones counted from the end; empty: all axes"),
    QKV_BOOL_ATTR("keepdims", FALSE, "keep reduced axes as size 1"),
};

/* Flag the axes named by the "axes" attribute (all when it is empty). Returns
 * the index into the attribute of a bad (out of range or repeated) axis, or -1. */
static gint
axes_mask(const QkvAttrs *attrs, gint rank, gboolean *mask)
{
  guint n_axes = 0;
  const gint64 *axes = qkv_attrs_get_ints(attrs, "axes", &n_axes);
  for (gint d = 0; d < rank; d++)
    mask[d] = n_axes == 0;
  for (guint i = 0; i < n_axes; i++) {
    gint64 a = axes[i];
    if (a < -rank || a >= rank)
      return (gint)i;
    gint axis = qkv_normalize_axis((gint)a, rank);
    if (mask[axis])
      return (gint)i;
    mask[axis] = TRUE;
  }
  return -1;
}

static gboolean
reduce_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  const QkvShape *in = &ctx->in_shapes[0];
  gboolean mask[QKV_MAX_RANK];
  gint bad = axes_mask(ctx->attrs, in->rank, mask);
  if (bad >= 0) {
    guint n_axes = 0;
    const gint64 *axes = qkv_attrs_get_ints(ctx->attrs, "axes", &n_axes);
    gint64 a = axes[bad];
    if (a < -in->rank || a >= in->rank)
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "axis %" G_GINT64_FORMAT " is out of range for rank %d", a, in->rank);
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "axis %" G_GINT64_FORMAT " (axis %d of rank %d) is given twice", a,
                           qkv_normalize_axis((gint)a, in->rank), in->rank);
  }
  gboolean keepdims = qkv_attrs_get_bool(ctx->attrs, "keepdims");
  QkvShape *out = &ctx->out_shapes[0];
  out->rank = 0;
  for (gint d = 0; d < in->rank; d++) {
    if (!mask[d])
      out->dims[out->rank++] = in->dims[d];
    else if (keepdims)
      out->dims[out->rank++] = 1;
  }
  return TRUE;
}

static void
sum_forward(const QkvKernelCtx *ctx)
{
  gboolean mask[QKV_MAX_RANK];
  axes_mask(ctx->attrs, ctx->in[0].shape.rank, mask);
  reduce_sum(ctx, ctx->in[0].data, &ctx->in[0].shape, mask, ctx->out[0].data);
}

static void
mean_forward(const QkvKernelCtx *ctx)
{
  sum_forward(ctx);
  gint64 n_in = qkv_shape_numel(&ctx->in[0].shape);
  gint64 n_out = qkv_shape_numel(&ctx->out[0].shape);
  if (n_out == 0)
    return;
  /* An empty reduction gives NaN, as 0/0 does in NumPy. */
  float inv = n_in > 0 ? (float)((double)n_out / (double)n_in) : NAN;
  float *y = ctx->out[0].data;
  for (gint64 i = 0; i < n_out; i++)
    y[i] *= inv;
}

/* Gradient of a reduction over axes: one "reduce_backward" node that repeats
 * dy along the reduced axes of x (times 1/count for mean). It reads x's shape
 * when it runs, not when the graph is built, so a plan run on inputs smaller
 * than compiled divides by the bound count. */
static gboolean
reduce_grad(QkvGradCtx *g, gboolean mean, GError **error)
{
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0]};
  guint n_axes = 0;
  const gint64 *axes = qkv_attrs_get_ints(g->attrs, "axes", &n_axes);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axes", qkv_variant_ints(axes, n_axes));
  g_variant_builder_add(&attrs, "{sv}", "mean", g_variant_new_boolean(mean));
  g->in_grads[0] = qkv_op_call("reduce_backward", inputs, 2, g_variant_builder_end(&attrs), error);
  return g->in_grads[0] != NULL;
}

static gboolean
reduce_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *in = &ctx->in_shapes[1];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  gboolean mask[QKV_MAX_RANK];
  if (axes_mask(ctx->attrs, in->rank, mask) >= 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "axes do not fit x's rank %d",
                           in->rank);
  gint64 kept = 1;
  for (gint d = 0; d < in->rank; d++)
    kept *= mask[d] ? 1 : in->dims[d];
  if (qkv_shape_numel(&ctx->in_shapes[0]) != kept)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy has %" G_GINT64_FORMAT " elements, x's kept axes %" G_GINT64_FORMAT,
                           qkv_shape_numel(&ctx->in_shapes[0]), kept);
  ctx->out_shapes[0] = *in;
  ctx->out_dtypes[0] = QKV_F32;
  return TRUE;
}

static void
reduce_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *shape = &ctx->out[0].shape;
  const float *dy = ctx->in[0].data;
  float *dx = ctx->out[0].data;
  gboolean mask[QKV_MAX_RANK];
  axes_mask(ctx->attrs, shape->rank, mask);
  /* dy's stride along each axis of x: 0 on reduced axes */
  gint64 stride[QKV_MAX_RANK], count = 1, acc = 1;
  for (gint d = shape->rank - 1; d >= 0; d--) {
    stride[d] = mask[d] ? 0 : acc;
    if (mask[d])
      count *= shape->dims[d];
    else
      acc *= shape->dims[d];
  }
  const float factor =
      qkv_attrs_get_bool(ctx->attrs, "mean") ? (count > 0 ? 1.0f / (float)count : 0.0f) : 1.0f;
  const gint64 n = qkv_shape_numel(shape);
  const gint64 inner = shape->rank > 0 ? shape->dims[shape->rank - 1] : 1;
  const gint64 inner_stride = shape->rank > 0 ? stride[shape->rank - 1] : 0;
  if (n == 0 || inner == 0)
    return;
  gint64 idx[QKV_MAX_RANK] = {0};
  for (gint64 row = 0; row < n / inner; row++) {
    gint64 base = 0;
    for (gint d = 0; d < shape->rank - 1; d++)
      base += idx[d] * stride[d];
    float *out = dx + row * inner;
    for (gint64 i = 0; i < inner; i++)
      out[i] = dy[base + i * inner_stride] * factor;
    for (gint d = shape->rank - 2; d >= 0; d--) {
      if (++idx[d] < shape->dims[d])
        break;
      idx[d] = 0;
    }
  }
}

static gboolean
sum_grad(QkvGradCtx *g, GError **error)
{
  return reduce_grad(g, FALSE, error);
}

static gboolean
mean_grad(QkvGradCtx *g, GError **error)
{
  return reduce_grad(g, TRUE, error);
}

/* ---------------------------------------------------------------------------
 * "sum_to" and "broadcast_to"
 * ------------------------------------------------------------------------- */

static const QkvAttrSpec shape_attrs[] = {
    QKV_REQUIRED_ATTR("shape", INTS, "the target shape"),
};

/* The "shape" attribute as a QkvShape, or an error. */
static gboolean
target_shape(QkvShapeCtx *ctx, QkvShape *shape, GError **error)
{
  guint n = 0;
  const gint64 *dims = qkv_attrs_get_ints(ctx->attrs, "shape", &n);
  if (n > QKV_MAX_RANK)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "shape has %u dims, more than the highest rank %d", n, QKV_MAX_RANK);
  for (guint i = 0; i < n; i++)
    if (dims[i] < 0)
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "shape has a negative dim %" G_GINT64_FORMAT, dims[i]);
  *shape = n > 0 ? qkv_shape_from_array((gint)n, dims) : qkv_shape_scalar();
  return TRUE;
}

/* TRUE if small broadcasts to big under NumPy rules and the result is big. */
static gboolean
broadcasts_to(const QkvShape *small, const QkvShape *big)
{
  if (small->rank > big->rank)
    return FALSE;
  for (gint i = 1; i <= small->rank; i++) {
    gint64 s = small->dims[small->rank - i], b = big->dims[big->rank - i];
    if (s != b && s != 1)
      return FALSE;
  }
  return TRUE;
}

static gboolean
sum_to_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  QkvShape target;
  if (!target_shape(ctx, &target, error))
    return FALSE;
  /* The summed axes (a 1 in the target) are fixed; the kept ones follow x,
   * which may be smaller than the target (a plan bound to a smaller batch
   * than it was built for, where a per-example value was broadcast), never
   * bigger. qkv_sum_to() holds a new node to the strict rule. */
  const QkvShape *x = &ctx->in_shapes[0], asked = target;
  gboolean fits = target.rank <= x->rank;
  for (gint i = 1; fits && i <= target.rank; i++) {
    gint64 *t = &target.dims[target.rank - i], s = x->dims[x->rank - i];
    fits = *t == 1 || s <= *t;
    if (*t != 1)
      *t = s;
  }
  if (!fits) {
    g_autofree gchar *s = qkv_shape_to_string(&asked);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x cannot be summed to %s, which does not broadcast to x's shape", s);
  }
  ctx->out_shapes[0] = target;
  return TRUE;
}

static void
sum_to_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *in = &ctx->in[0].shape, *out = &ctx->out[0].shape;
  gboolean mask[QKV_MAX_RANK];
  gint lead = in->rank - out->rank;
  /* Leading axes that the target lacks are summed away; so are its 1s. */
  for (gint d = 0; d < in->rank; d++)
    mask[d] = d < lead || out->dims[d - lead] == 1;
  reduce_sum(ctx, ctx->in[0].data, in, mask, ctx->out[0].data);
}

static gboolean
sum_to_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_broadcast_to(g->out_grads[0], qkv_value_shape(g->inputs[0]), error);
  return g->in_grads[0] != NULL;
}

static gboolean
broadcast_to_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  QkvShape target;
  if (!target_shape(ctx, &target, error))
    return FALSE;
  if (!broadcasts_to(&ctx->in_shapes[0], &target)) {
    g_autofree gchar *s = qkv_shape_to_string(&target);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "x does not broadcast to %s", s);
  }
  ctx->out_shapes[0] = target;
  return TRUE;
}

typedef struct {
  const float *x;
  float *y;
  const QkvShape *out;
  const gint64 *x_strides;
  gint last;
  gint64 row_len;
  gboolean repeat_elem;
  float fill;
} BroadcastJob;

static void
broadcast_fill(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const BroadcastJob *j = user_data;
  const float v = j->fill;
  float *y = j->y;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    y[i] = v;
}

static void
broadcast_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const BroadcastJob *j = user_data;
  const gint64 row_len = j->row_len;
  for (gint64 r = begin; r < end; r++) {
    /* Offset of this row's first element in x, from its coordinates. */
    gint64 rest = r, off = 0;
    for (gint d = j->last - 1; d >= 0; d--) {
      off += (rest % j->out->dims[d]) * j->x_strides[d];
      rest /= j->out->dims[d];
    }
    float *dst = j->y + r * row_len;
    if (j->repeat_elem) {
      const float v = j->x[off];
#pragma omp simd
      for (gint64 k = 0; k < row_len; k++)
        dst[k] = v;
    } else {
      memcpy(dst, j->x + off, (gsize)row_len * sizeof(float));
    }
  }
}

static void
broadcast_to_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *in = &ctx->in[0].shape, *out = &ctx->out[0].shape;
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  const gint64 n_in = qkv_shape_numel(in), n_out = qkv_shape_numel(out);
  const gint n_threads = qkv_kernel_threads(ctx, n_out);
  if (n_out == 0)
    return;

  if (n_in == 1) {
    const float v = x[0];
    BroadcastJob job = {.x = x, .y = y, .row_len = 1, .repeat_elem = TRUE};
    job.fill = v;
    qkv_parallel_for(n_threads, n_out, broadcast_fill, &job);
    return;
  }

  if (n_in == n_out) {
    /* Only leading 1s differ: the same elements in the same order. */
    if (y != x)
      memcpy(y, x, (gsize)n_out * sizeof(float));
    return;
  }

  /* x's strides in the output's rank, 0 along the axes x is repeated on. */
  gint64 x_strides[QKV_MAX_RANK];
  gint64 own[QKV_MAX_RANK];
  qkv_shape_strides(in, own);
  const gint lead = out->rank - in->rank;
  for (gint d = 0; d < out->rank; d++) {
    gint xd = d - lead;
    x_strides[d] = (xd < 0 || in->dims[xd] == 1) ? 0 : own[xd];
  }

  /* The output rows along the last axis: each is either a copy of a row of x
   * (last axis kept) or one element of x repeated (last axis broadcast). */
  const gint last = out->rank - 1;
  const gint64 row_len = out->dims[last];
  const gint64 n_rows = n_out / row_len;
  const gboolean repeat_elem = x_strides[last] == 0;
  BroadcastJob job = {x, y, out, x_strides, last, row_len, repeat_elem, 0.0f};
  qkv_parallel_for(n_threads, n_rows, broadcast_rows, &job);
}

static gboolean
broadcast_to_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_sum_to(g->out_grads[0], qkv_value_shape(g->inputs[0]), error);
  return g->in_grads[0] != NULL;
}

/* ---------------------------------------------------------------------------
 * Registration
 * ------------------------------------------------------------------------- */

const QkvOpDef qkv_ops_reduce[] = {
    QKV_OP(.name = "reduce_backward",
           .doc = "gradient of sum or mean: dy repeated along x's reduced axes (divided by their "
                  "size for mean); x gives only the shape",
           QKV_INPUTS("dy", "x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_INTS_ATTR("axes", "the reduced axes, as given to sum or mean"),
                     QKV_BOOL_ATTR("mean", FALSE, "divide by the number of elements reduced")),
           .no_grad_inputs = 1 << 1, .shape = reduce_backward_shape,
           .forward = reduce_backward_forward),
    QKV_OP(.name = "sum", .doc = "sum of x over axes (all axes when none are given)",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(reduce_attrs), .shape = reduce_shape,
           .forward = sum_forward, .gradient = sum_grad),
    QKV_OP(.name = "mean", .doc = "mean of x over axes (all axes when none are given)",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(reduce_attrs), .shape = reduce_shape,
           .forward = mean_forward, .gradient = mean_grad),
    QKV_OP(.name = "sum_to",
           .doc = "sum x down to a shape that broadcasts to x's (the adjoint of broadcast_to)",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(shape_attrs), .shape = sum_to_shape,
           .forward = sum_to_forward, .gradient = sum_to_grad),
    QKV_OP(.name = "broadcast_to", .doc = "repeat x up to a shape it broadcasts to (NumPy rules)",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(shape_attrs),
           .flags = QKV_OP_STATIC_SHAPE, .shape = broadcast_to_shape,
           .forward = broadcast_to_forward, .gradient = broadcast_to_grad),
    QKV_OPS_END,
};

/* ---------------------------------------------------------------------------
 * Typed functions
 * ------------------------------------------------------------------------- */

static QkvValue *
reduce_call(const gchar *op_name, QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims,
            GError **error)
{
  QKV_RETURN_IF_MISSING(op_name, error, x);
  g_return_val_if_fail(n_axes == 0 || axes != NULL, NULL);
  GVariantBuilder axes_builder, attrs;
  g_variant_builder_init(&axes_builder, G_VARIANT_TYPE("ax"));
  for (guint i = 0; i < n_axes; i++)
    g_variant_builder_add(&axes_builder, "x", (gint64)axes[i]);
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axes", g_variant_builder_end(&axes_builder));
  g_variant_builder_add(&attrs, "{sv}", "keepdims", g_variant_new_boolean(keepdims));
  return qkv_op_call(op_name, &x, 1, g_variant_builder_end(&attrs), error);
}

static QkvValue *
shape_call(const gchar *op_name, QkvValue *x, const QkvShape *shape, GError **error)
{
  g_return_val_if_fail(shape != NULL, NULL);
  QKV_RETURN_IF_MISSING(op_name, error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "shape",
                        qkv_variant_ints(shape->dims, (gsize)MAX(shape->rank, 0)));
  return qkv_op_call(op_name, &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_sum(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return reduce_call("sum", x, axes, n_axes, keepdims, error);
}

QkvValue *
qkv_mean(QkvValue *x, const gint *axes, guint n_axes, gboolean keepdims, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return reduce_call("mean", x, axes, n_axes, keepdims, error);
}

QkvValue *
qkv_sum_to(QkvValue *x, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  /* the shape rule lets x be smaller than the target, for plans run at a
   * smaller batch; a node is only added where the target broadcasts to x */
  if (x != NULL && shape != NULL && qkv_value_dtype(x) == QKV_F32 &&
      !broadcasts_to(shape, qkv_value_shape(x))) {
    g_autofree gchar *have = qkv_shape_to_string(qkv_value_shape(x));
    g_autofree gchar *want = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "op 'sum_to': x %s cannot be summed to %s, which does not broadcast to x's shape",
                have, want);
    return NULL;
  }
  return shape_call("sum_to", x, shape, error);
}

QkvValue *
qkv_broadcast_to(QkvValue *x, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return shape_call("broadcast_to", x, shape, error);
}
