/* view.c: ops that change how a tensor's axes are seen: "unsqueeze" and
 * "squeeze" (add or drop axes of size 1) and "expand" (repeat along axes of
 * size 1 and new leading axes, as torch.expand).
 *
 * qkv values are not views: each op writes its own output (unsqueeze and
 * squeeze run in place when the planner lets them, costing nothing). They
 * work on f32 and i32 alike and keep the dtype. Unlike torch.squeeze(dim),
 * squeezing an axis whose size is not 1 is an error rather than a no-op.
 */
#include "ops-common.h"
#include "error-private.h"

static gboolean
check_dtype(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32 && ctx->in_dtypes[0] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32 or i32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

/* The same elements in the same order. */
static void
copy_forward(const QkvKernelCtx *ctx)
{
  if (ctx->out[0].data != ctx->in[0].data)
    memcpy(ctx->out[0].data, ctx->in[0].data,
           (gsize)qkv_shape_numel(&ctx->in[0].shape) * qkv_dtype_size(ctx->in[0].dtype));
}

/* The gradients undo the op with the inverse op rather than a reshape to x's
 * built shape, so they follow x when a plan runs at a smaller batch. */
static gboolean
unsqueeze_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  gint axis = qkv_normalize_axis((gint)qkv_attrs_get_int(g->attrs, "axis"),
                                 qkv_value_shape(g->outputs[0])->rank);
  g->in_grads[0] = qkv_squeeze(g->out_grads[0], &axis, 1, error);
  return g->in_grads[0] != NULL;
}

static gboolean
squeeze_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  /* put back, in increasing order, each axis of x that the op dropped */
  const QkvShape *in = qkv_value_shape(g->inputs[0]);
  guint n = 0;
  const gint64 *axes = qkv_attrs_get_ints(g->attrs, "axes", &n);
  gboolean dropped[QKV_MAX_RANK];
  for (gint d = 0; d < in->rank; d++)
    dropped[d] = n == 0 && in->dims[d] == 1;
  for (guint i = 0; i < n; i++)
    dropped[qkv_normalize_axis((gint)axes[i], in->rank)] = TRUE;
  QkvValue *dx = g->out_grads[0];
  for (gint d = 0; d < in->rank && dx != NULL; d++)
    if (dropped[d])
      dx = qkv_unsqueeze(dx, d, error);
  g->in_grads[0] = dx;
  return dx != NULL;
}

/* ---- unsqueeze ---------------------------------------------------------- */

static gboolean
unsqueeze_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *in = &ctx->in_shapes[0];
  gint64 axis = qkv_attrs_get_int(ctx->attrs, "axis");
  if (!check_dtype(ctx, error))
    return FALSE;
  if (in->rank + 1 > QKV_MAX_RANK)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "x already has the highest rank, %d",
                           QKV_MAX_RANK);
  /* Axes of the output, which has one more. */
  gint out_rank = in->rank + 1;
  if (axis < -out_rank || axis >= out_rank)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "axis %" G_GINT64_FORMAT " is out of range [%d, %d] for rank %d", axis,
                           -out_rank, out_rank - 1, in->rank);
  gint a = qkv_normalize_axis((gint)axis, out_rank);
  QkvShape *out = &ctx->out_shapes[0];
  out->rank = out_rank;
  for (gint d = 0, s = 0; d < out_rank; d++)
    out->dims[d] = d == a ? 1 : in->dims[s++];
  return TRUE;
}

/* ---- squeeze ------------------------------------------------------------ */

static gboolean
squeeze_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *in = &ctx->in_shapes[0];
  guint n = 0;
  const gint64 *axes = qkv_attrs_get_ints(ctx->attrs, "axes", &n);
  gboolean drop[QKV_MAX_RANK];
  if (!check_dtype(ctx, error))
    return FALSE;
  for (gint d = 0; d < in->rank; d++)
    drop[d] = n == 0 && in->dims[d] == 1;
  for (guint i = 0; i < n; i++) {
    if (axes[i] < -in->rank || axes[i] >= in->rank)
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "axis %" G_GINT64_FORMAT " is out of range for rank %d", axes[i],
                             in->rank);
    gint a = qkv_normalize_axis((gint)axes[i], in->rank);
    if (drop[a])
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "axis %d is given twice", a);
    if (in->dims[a] != 1)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "axis %d has size %" G_GINT64_FORMAT ", not 1: it cannot be dropped",
                             a, in->dims[a]);
    drop[a] = TRUE;
  }
  QkvShape *out = &ctx->out_shapes[0];
  out->rank = 0;
  for (gint d = 0; d < in->rank; d++)
    if (!drop[d])
      out->dims[out->rank++] = in->dims[d];
  return TRUE;
}

/* ---- expand ------------------------------------------------------------- */

/* The target shape with each -1 replaced by x's size; FALSE with an error
 * (when ctx is given) if x cannot be expanded to it. */
static gboolean
expand_resolve(QkvShapeCtx *ctx, const QkvShape *in, const QkvAttrs *attrs, QkvShape *out,
               GError **error)
{
  guint n = 0;
  const gint64 *dims = qkv_attrs_get_ints(attrs, "shape", &n);
  if (n > QKV_MAX_RANK)
    return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                                          "shape has rank %u, more than %d", n, QKV_MAX_RANK);
  if ((gint)n < in->rank)
    return ctx == NULL ||
           qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "shape has rank %u, less than x's rank %d (expand adds axes, it "
                           "never drops them)",
                           n, in->rank);
  gint lead = (gint)n - in->rank;
  out->rank = (gint)n;
  for (gint d = 0; d < (gint)n; d++) {
    gint64 want = dims[d];
    if (d < lead) {
      /* A new leading axis has no size to keep. */
      if (want < 0)
        return ctx == NULL ||
               qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                               "shape[%d] = %" G_GINT64_FORMAT " for a new leading axis", d, want);
      out->dims[d] = want;
      continue;
    }
    gint64 have = in->dims[d - lead];
    if (want == -1)
      want = have;
    if (want < 0)
      return ctx == NULL ||
             qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "shape[%d] = %" G_GINT64_FORMAT " is negative", d, dims[d]);
    if (have != want && have != 1)
      return ctx == NULL || qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                            "x's axis %d has size %" G_GINT64_FORMAT
                                            ", which cannot expand to %" G_GINT64_FORMAT
                                            " (only axes of size 1 repeat)",
                                            d - lead, have, want);
    out->dims[d] = want;
  }
  return TRUE;
}

static gboolean
expand_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_dtype(ctx, error))
    return FALSE;
  return expand_resolve(ctx, &ctx->in_shapes[0], ctx->attrs, &ctx->out_shapes[0], error);
}

typedef struct {
  const guint32 *x;
  guint32 *y;
  gint rank;
  gint64 dims[QKV_MAX_RANK];
  /* x's strides along the output's axes, 0 where x repeats. */
  gint64 x_strides[QKV_MAX_RANK];
} ExpandJob;

/* Output rows along the last axis: a copy of a row of x, or one element of
 * x repeated. */
static void
expand_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ExpandJob *j = user_data;
  const gint last = j->rank - 1;
  const gint64 row_len = j->dims[last];
  for (gint64 r = begin; r < end; r++) {
    gint64 rest = r, off = 0;
    for (gint d = last - 1; d >= 0; d--) {
      off += (rest % j->dims[d]) * j->x_strides[d];
      rest /= j->dims[d];
    }
    guint32 *dst = j->y + r * row_len;
    if (j->x_strides[last] == 0) {
      const guint32 v = j->x[off];
      for (gint64 k = 0; k < row_len; k++)
        dst[k] = v;
    } else {
      memcpy(dst, j->x + off, (gsize)row_len * sizeof(guint32));
    }
  }
}

static void
expand_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *in = &ctx->in[0].shape, *out = &ctx->out[0].shape;
  gint64 n_out = qkv_shape_numel(out);
  if (n_out == 0)
    return;
  if (out->rank == 0) {
    /* A scalar to a scalar. */
    copy_forward(ctx);
    return;
  }
  ExpandJob job = {.x = ctx->in[0].data, .y = ctx->out[0].data, .rank = out->rank};
  gint64 own[QKV_MAX_RANK];
  qkv_shape_strides(in, own);
  gint lead = out->rank - in->rank;
  for (gint d = 0; d < out->rank; d++) {
    gint xd = d - lead;
    job.dims[d] = out->dims[d];
    job.x_strides[d] = (xd < 0 || in->dims[xd] == 1) ? 0 : own[xd];
  }
  gint64 rows = n_out / out->dims[out->rank - 1];
  qkv_parallel_for(qkv_kernel_threads(ctx, n_out), rows, expand_range, &job);
}

/* Each element of x fed every output element it was repeated into. */
static gboolean
expand_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  const QkvShape *in = qkv_value_shape(g->inputs[0]);
  if (qkv_shape_equal(qkv_value_shape(g->out_grads[0]), in))
    g->in_grads[0] = g->out_grads[0];
  else
    g->in_grads[0] = qkv_sum_to(g->out_grads[0], in, error);
  return g->in_grads[0] != NULL;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_view[] = {
    QKV_OP(.name = "unsqueeze", .doc = "x with a new axis of size 1 at axis", QKV_INPUTS("x"),
           QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("axis", INT,
                                       "where the new axis goes in the output, -(rank + 1) ≤ axis "
                                       "≤ rank (negative counts from the end)")),
           .flags = QKV_OP_INPLACE, .shape = unsqueeze_shape, .forward = copy_forward,
           .gradient = unsqueeze_grad),
    QKV_OP(.name = "squeeze",
           .doc = "x without the given axes of size 1 (every axis of size 1 when none are given); "
                  "an axis of another size is an error",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_INTS_ATTR("axes", "axes of size 1 to drop (negative count from the end); "
                                           "empty: every axis of size 1")),
           .flags = QKV_OP_INPLACE, .shape = squeeze_shape, .forward = copy_forward,
           .gradient = squeeze_grad),
    QKV_OP(.name = "expand",
           .doc = "x repeated along its axes of size 1 and new leading axes up to shape (-1 keeps "
                  "a size), as torch.expand; gradient summed over the repeats",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("shape", INTS,
                                       "the target shape; -1 keeps x's size on that axis")),
           .shape = expand_shape, .forward = expand_forward, .gradient = expand_grad),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */

QkvValue *
qkv_unsqueeze(QkvValue *x, gint axis, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  return qkv_op_call("unsqueeze", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_squeeze(QkvValue *x, const gint *axes, guint n_axes, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  GVariantBuilder axes_builder, attrs;
  g_variant_builder_init(&axes_builder, G_VARIANT_TYPE("ax"));
  for (guint i = 0; axes != NULL && i < n_axes; i++)
    g_variant_builder_add(&axes_builder, "x", (gint64)axes[i]);
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axes", g_variant_builder_end(&axes_builder));
  return qkv_op_call("squeeze", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_expand(QkvValue *x, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL || shape == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "shape",
                        qkv_variant_ints(shape->dims, (gsize)MAX(shape->rank, 0)));
  return qkv_op_call("expand", &x, 1, g_variant_builder_end(&attrs), error);
}
