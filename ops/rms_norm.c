/* rms_norm.c: "rms_norm" over the last axis and its fused backward op.
 *
 * y = x · rstd · weight with rstd = 1 / √(mean(x²) + eps), as
 * torch.nn.RMSNorm and LLaMA's RMSNorm (Zhang & Sennrich 2019): no mean is
 * subtracted and there is no bias. The weight is optional (RMSNorm with
 * elementwise_affine=False). Like layer_norm, the forward op also returns
 * rstd per row, which "rms_norm_backward" reads, and the row sums are
 * accumulated in double.
 */
#include "ops-common.h"

#include <float.h>
#include <math.h>
#include "error-private.h"

/* The shape of x without its last axis: one entry per row. */
static QkvShape
rows_shape(const QkvShape *x)
{
  QkvShape s = *x;
  s.rank = x->rank - 1;
  return s;
}

static gboolean
f32_inputs(QkvShapeCtx *ctx, GError **error)
{
  for (guint i = 0; i < ctx->n_inputs; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
  return TRUE;
}

/* x has rank ≥ 1 and a non-empty last axis d; weight, when given, is (d). */
static gboolean
check_x_and_weight(QkvShapeCtx *ctx, const QkvShape *x, const QkvShape *weight, GError **error)
{
  if (x->rank < 1 || x->dims[x->rank - 1] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must have rank 1 or more and a non-empty last axis");
  gint64 d = x->dims[x->rank - 1];
  if (weight != NULL && (weight->rank != 1 || weight->dims[0] != d))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "weight must be a vector of x's last axis size (%" G_GINT64_FORMAT ")",
                           d);
  return TRUE;
}

static gboolean
rms_norm_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0];
  if (!f32_inputs(ctx, error) ||
      !check_x_and_weight(ctx, x, ctx->n_inputs > 1 ? &ctx->in_shapes[1] : NULL, error))
    return FALSE;
  double eps = qkv_attrs_get_float(ctx->attrs, "eps");
  if (!(eps >= 0.0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "eps must be >= 0, got %g", eps);
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = *x;
  ctx->out_shapes[1] = rows_shape(x);
  return TRUE;
}

typedef struct {
  const float *x, *weight; /* weight may be NULL */
  float *y, *rstd;
  gint64 d;
  double eps;
} RmsNormJob;

static void
rms_norm_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const RmsNormJob *a = user_data;
  const gint64 d = a->d;
  for (gint64 r = begin; r < end; r++) {
    const float *xr = a->x + r * d;
    float *yr = a->y + r * d;
    double squares = 0.0;
#pragma omp simd reduction(+ : squares)
    for (gint64 j = 0; j < d; j++)
      squares += (double)xr[j] * xr[j];
    const double rs = 1.0 / sqrt(squares / (double)d + a->eps);
    if (a->weight != NULL) {
#pragma omp simd
      for (gint64 j = 0; j < d; j++)
        yr[j] = (float)(xr[j] * rs * a->weight[j]);
    } else {
#pragma omp simd
      for (gint64 j = 0; j < d; j++)
        yr[j] = (float)(xr[j] * rs);
    }
    a->rstd[r] = (float)rs;
  }
}

static void
rms_norm_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, d;
  qkv_view_rows(&ctx->in[0], &rows, &d);
  RmsNormJob job = {
      .x = ctx->in[0].data,
      .weight = ctx->n_inputs > 1 ? ctx->in[1].data : NULL,
      .y = ctx->out[0].data,
      .rstd = ctx->out[1].data,
      .d = d,
      .eps = qkv_attrs_get_float(ctx->attrs, "eps"),
  };
  /* one pass for the squares, one for the output */
  qkv_parallel_for(qkv_kernel_threads(ctx, 4 * rows * d), rows, rms_norm_rows, &job);
}

/* ---- backward ----------------------------------------------------------- */

/* Inputs dy, x, rstd and, for a forward op with a weight, weight; outputs
 * dx and, with a weight, dweight. */
static gboolean
rms_norm_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *x = &ctx->in_shapes[1];
  const gboolean weighted = ctx->n_inputs > 3;
  if (!f32_inputs(ctx, error) ||
      !check_x_and_weight(ctx, x, weighted ? &ctx->in_shapes[3] : NULL, error))
    return FALSE;
  QkvShape rows = rows_shape(x);
  if (!qkv_shape_equal(dy, x) || !qkv_shape_equal(&ctx->in_shapes[2], &rows))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy must have x's shape and rstd x's shape without its last axis");
  ctx->n_outputs = weighted ? 2 : 1;
  ctx->out_shapes[0] = *x;
  if (weighted)
    ctx->out_shapes[1] = ctx->in_shapes[3];
  return TRUE;
}

/* Per-thread partial sums of dweight: D doubles per thread (none without a
 * weight). */
static gsize
rms_norm_backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  if (ctx->n_inputs <= 3)
    return 0;
  const QkvShape *x = &ctx->in_shapes[1];
  return (gsize)MAX(n_threads, 1) * (gsize)x->dims[x->rank - 1] * sizeof(double);
}

typedef struct {
  const float *dy, *x, *rstd, *weight; /* weight may be NULL */
  float *dx;
  double *partials; /* per thread: dweight (D); NULL without a weight */
  gint64 d;
} RmsBackward;

/* Rows [begin, end): dx row by row, and this thread's share of dweight.
 * With x̂ = x · rstd and g = weight · dy (dy without a weight):
 *   dx = rstd · (g − x̂ · mean(g · x̂)). */
static void
rms_norm_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const RmsBackward *a = user_data;
  const gint64 d = a->d;
  const float *w = a->weight;
  double *dweight = w != NULL ? a->partials + (gsize)thread * (gsize)d : NULL;
  for (gint64 r = begin; r < end; r++) {
    const float *dyr = a->dy + r * d, *xr = a->x + r * d;
    float *dxr = a->dx + r * d;
    const double rs = a->rstd[r];
    double sum_gx = 0.0;
    if (w != NULL) {
#pragma omp simd reduction(+ : sum_gx)
      for (gint64 j = 0; j < d; j++) {
        double xhat = xr[j] * rs;
        sum_gx += (double)w[j] * dyr[j] * xhat;
        dweight[j] += dyr[j] * xhat;
      }
    } else {
#pragma omp simd reduction(+ : sum_gx)
      for (gint64 j = 0; j < d; j++)
        sum_gx += (double)dyr[j] * (xr[j] * rs);
    }
    const double mean_gx = sum_gx / (double)d;
#pragma omp simd
    for (gint64 j = 0; j < d; j++) {
      double xhat = xr[j] * rs, g = w != NULL ? (double)w[j] * dyr[j] : (double)dyr[j];
      dxr[j] = (float)(rs * (g - xhat * mean_gx));
    }
  }
}

static void
rms_norm_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, d;
  qkv_view_rows(&ctx->in[1], &rows, &d);
  const gboolean weighted = ctx->n_inputs > 3;
  RmsBackward a = {
      .dy = ctx->in[0].data,
      .x = ctx->in[1].data,
      .rstd = ctx->in[2].data,
      .weight = weighted ? ctx->in[3].data : NULL,
      .dx = ctx->out[0].data,
      .partials = weighted ? ctx->scratch : NULL,
      .d = d,
  };
  gint n_threads = qkv_kernel_threads(ctx, 8 * rows * d);
  if (weighted) {
    /* as many threads as the scratch has partial sums for (the thread
     * count may have grown since the plan was compiled) */
    gint64 capacity = (gint64)(ctx->scratch_size / ((gsize)d * sizeof(double)));
    n_threads = (gint)MIN((gint64)n_threads, MAX(capacity, 1));
    memset(a.partials, 0, (gsize)n_threads * (gsize)d * sizeof(double));
  }
  QkvKernelCtx team = *ctx;
  team.n_threads = n_threads;
  qkv_kernel_parallel_for(&team, rows, rms_norm_backward_rows, &a);
  if (!weighted)
    return;
  /* threads own contiguous row ranges in order: the same sum on every run
   * with the same thread count */
  float *dweight = ctx->out[1].data;
  for (gint64 j = 0; j < d; j++) {
    double s = 0.0;
    for (gint t = 0; t < n_threads; t++)
      s += a.partials[(gsize)t * (gsize)d + (gsize)j];
    dweight[j] = (float)s;
  }
}

static gboolean
rms_norm_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[1] != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "rms_norm: the saved statistic (output rstd) takes no gradient");
    return FALSE;
  }
  if (g->out_grads[0] == NULL)
    return TRUE;
  const gboolean weighted = g->n_inputs > 1;
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0], g->outputs[1],
                        weighted ? g->inputs[1] : NULL};
  QkvNode *node =
      qkv_graph_add_node(g->graph, "rms_norm_backward", inputs, weighted ? 4 : 3, NULL, error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < g->n_inputs; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_rms_norm[] = {
    QKV_OP(.name = "rms_norm",
           .doc = "x / √(mean(x²) + eps) · weight over the last axis (no weight: 1), as "
                  "torch.nn.RMSNorm; outputs y and the per-row rstd that the backward reads",
           QKV_INPUTS_OPT(1, "x", "weight"), QKV_OUTPUTS("y", "rstd"),
           QKV_ATTRS(QKV_FLOAT_ATTR("eps", FLT_EPSILON,
                                    "added to the mean square before the square root (default: "
                                    "float32's machine epsilon, as torch.nn.RMSNorm's eps=None)")),
           .shape = rms_norm_shape, .forward = rms_norm_forward, .gradient = rms_norm_grad),
    QKV_OP(.name = "rms_norm_backward",
           .doc = "dx and, with a weight, dweight of rms_norm from dy, x, the saved rstd and the "
                  "weight",
           QKV_INPUTS_OPT(3, "dy", "x", "rstd", "weight"), QKV_OUTPUTS("dx", "dweight"),
           .shape = rms_norm_backward_shape, .forward = rms_norm_backward_forward,
           .scratch_size = rms_norm_backward_scratch),
    QKV_OPS_END,
};

/* ---- typed function ----------------------------------------------------- */

QkvValue *
qkv_rms_norm(QkvValue *x, QkvValue *weight, double eps, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("rms_norm", error, x);
  /* a NULL weight means none, unless an earlier call failed */
  if (error != NULL && *error != NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "eps", g_variant_new_double(eps));
  QkvValue *inputs[] = {x, weight};
  return qkv_op_call("rms_norm", inputs, weight != NULL ? 2 : 1, g_variant_builder_end(&attrs),
                     error);
}
