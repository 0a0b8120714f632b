/* layer_norm.c: "layer_norm" over the last axis and its fused backward op.
 *
 * y = (x − mean) · rstd · gamma + beta with rstd = 1 / √(var + eps) and the
 * biased variance, as torch.nn.LayerNorm (the book's AddNorm). The forward op
 * also returns mean and rstd per row; "layer_norm_backward" reads them, so
 * the backward needs no second pass over the statistics. Row statistics are
 * accumulated in double: the rows of a Transformer are short, and the result
 * then matches PyTorch to the last bit or two.
 */
#include "ops-common.h"

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
layer_norm_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0], *gamma = &ctx->in_shapes[1], *beta = &ctx->in_shapes[2];
  for (guint i = 0; i < 3; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x, gamma and beta must be f32");
  if (x->rank < 1 || x->dims[x->rank - 1] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must have rank 1 or more and a non-empty last axis");
  gint64 d = x->dims[x->rank - 1];
  if (gamma->rank != 1 || gamma->dims[0] != d || beta->rank != 1 || beta->dims[0] != d)
    return qkv_shape_error(
        ctx, error, QKV_ERROR_SHAPE,
        "gamma and beta must be vectors of x's last axis size (%" G_GINT64_FORMAT ")", d);
  double eps = qkv_attrs_get_float(ctx->attrs, "eps");
  if (!(eps >= 0.0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "eps must be >= 0, got %g", eps);
  ctx->n_outputs = 3;
  ctx->out_shapes[0] = *x;
  ctx->out_shapes[1] = rows_shape(x);
  ctx->out_shapes[2] = rows_shape(x);
  return TRUE;
}

typedef struct {
  const float *x, *gamma, *beta;
  float *y, *mean, *rstd;
  gint64 d;
  double eps;
} LayerNormJob;

static void
layer_norm_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const LayerNormJob *a = user_data;
  const gint64 d = a->d;
  const float *gamma = a->gamma, *beta = a->beta;
  for (gint64 r = begin; r < end; r++) {
    const float *xr = a->x + r * d;
    float *yr = a->y + r * d;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (gint64 j = 0; j < d; j++)
      sum += xr[j];
    double mu = sum / (double)d;
    double var = 0.0;
#pragma omp simd reduction(+ : var)
    for (gint64 j = 0; j < d; j++) {
      double c = xr[j] - mu;
      var += c * c;
    }
    double rs = 1.0 / sqrt(var / (double)d + a->eps);
#pragma omp simd
    for (gint64 j = 0; j < d; j++)
      yr[j] = (float)((xr[j] - mu) * rs * gamma[j] + beta[j]);
    a->mean[r] = (float)mu;
    a->rstd[r] = (float)rs;
  }
}

static void
layer_norm_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, d;
  qkv_view_rows(&ctx->in[0], &rows, &d);
  const float *x = ctx->in[0].data, *gamma = ctx->in[1].data, *beta = ctx->in[2].data;
  float *y = ctx->out[0].data, *mean = ctx->out[1].data, *rstd = ctx->out[2].data;
  double eps = qkv_attrs_get_float(ctx->attrs, "eps");

  LayerNormJob job = {x, gamma, beta, y, mean, rstd, d, eps};
  /* two passes for the moments, one for the output: about eight units of
   * work per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, 8 * rows * d), rows, layer_norm_rows, &job);
}

/* ---- backward ----------------------------------------------------------- */

static gboolean
layer_norm_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *x = &ctx->in_shapes[1], *gamma = &ctx->in_shapes[2];
  for (guint i = 0; i < 5; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "every input must be f32");
  if (x->rank < 1 || x->dims[x->rank - 1] < 1 || !qkv_shape_equal(dy, x))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy and x must have the same shape, with a non-empty last axis");
  gint64 d = x->dims[x->rank - 1];
  QkvShape rows = rows_shape(x);
  if (gamma->rank != 1 || gamma->dims[0] != d || !qkv_shape_equal(&ctx->in_shapes[3], &rows) ||
      !qkv_shape_equal(&ctx->in_shapes[4], &rows))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "gamma must be (%" G_GINT64_FORMAT
                           "), mean and rstd must have x's shape without its last axis",
                           d);
  ctx->n_outputs = 3;
  ctx->out_shapes[0] = *x;
  ctx->out_shapes[1] = *gamma;
  ctx->out_shapes[2] = *gamma;
  return TRUE;
}

/* Per-thread partial sums of dgamma and dbeta: 2·D doubles per thread. */
static gsize
layer_norm_backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *x = &ctx->in_shapes[1];
  gint64 d = x->dims[x->rank - 1];
  return (gsize)MAX(n_threads, 1) * 2 * (gsize)d * sizeof(double);
}

typedef struct {
  const float *dy, *x, *gamma, *mean, *rstd;
  float *dx;
  double *partials; /* per thread: dgamma (D), then dbeta (D) */
  gint64 d;
} LnBackward;

/* Rows [begin, end): dx row by row, and this thread's share of dgamma/dbeta.
 * With x̂ = (x − mean) · rstd and g = gamma · dy:
 *   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)). */
static void
layer_norm_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const LnBackward *a = user_data;
  const gint64 d = a->d;
  double *dgamma = a->partials + (gsize)thread * 2 * (gsize)d, *dbeta = dgamma + d;
  for (gint64 r = begin; r < end; r++) {
    const float *dyr = a->dy + r * d, *xr = a->x + r * d;
    float *dxr = a->dx + r * d;
    const double mu = a->mean[r], rs = a->rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (gint64 j = 0; j < d; j++) {
      double xhat = (xr[j] - mu) * rs, g = (double)a->gamma[j] * dyr[j];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    const double mean_g = sum_g / (double)d, mean_gx = sum_gx / (double)d;
#pragma omp simd
    for (gint64 j = 0; j < d; j++) {
      double xhat = (xr[j] - mu) * rs, g = (double)a->gamma[j] * dyr[j];
      dxr[j] = (float)(rs * (g - mean_g - xhat * mean_gx));
    }
  }
}

static void
layer_norm_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, d;
  qkv_view_rows(&ctx->in[1], &rows, &d);
  LnBackward a = {
      .dy = ctx->in[0].data,
      .x = ctx->in[1].data,
      .gamma = ctx->in[2].data,
      .mean = ctx->in[3].data,
      .rstd = ctx->in[4].data,
      .dx = ctx->out[0].data,
      .partials = ctx->scratch,
      .d = d,
  };
  float *dgamma = ctx->out[1].data, *dbeta = ctx->out[2].data;

  /* As many threads as the scratch has partial sums for (the thread count
   * may have grown since the plan was compiled), one if the work is small. */
  gint64 capacity = (gint64)(ctx->scratch_size / (2 * (gsize)d * sizeof(double)));
  gint n_threads = (gint)MIN((gint64)qkv_kernel_threads(ctx, 10 * rows * d), MAX(capacity, 1));
  memset(a.partials, 0, (gsize)n_threads * 2 * (gsize)d * sizeof(double));

  QkvKernelCtx team = *ctx;
  team.n_threads = n_threads;
  qkv_kernel_parallel_for(&team, rows, layer_norm_backward_rows, &a);

  /* Threads own contiguous row ranges in order, so this sum is the same on
   * every run with the same thread count. */
  for (gint64 j = 0; j < d; j++) {
    double g = 0.0, b = 0.0;
    for (gint t = 0; t < n_threads; t++) {
      g += a.partials[(gsize)t * 2 * (gsize)d + (gsize)j];
      b += a.partials[(gsize)t * 2 * (gsize)d + (gsize)(d + j)];
    }
    dgamma[j] = (float)g;
    dbeta[j] = (float)b;
  }
}

static gboolean
layer_norm_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[1] != NULL || g->out_grads[2] != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "layer_norm: the saved statistics (outputs mean and rstd) take no gradient");
    return FALSE;
  }
  if (g->out_grads[0] == NULL)
    return TRUE;
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0], g->inputs[1], g->outputs[1], g->outputs[2]};
  QkvNode *node = qkv_graph_add_node(g->graph, "layer_norm_backward", inputs, 5, NULL, error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < 3; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_layer_norm[] = {
    QKV_OP(.name = "layer_norm",
           .doc = "(x − mean) / √(var + eps) · gamma + beta over the last axis (biased variance); "
                  "outputs y and the per-row mean and rstd that the backward reads",
           QKV_INPUTS("x", "gamma", "beta"), QKV_OUTPUTS("y", "mean", "rstd"),
           QKV_ATTRS(QKV_FLOAT_ATTR("eps", 1e-5, "added to the variance before the square root")),
           .shape = layer_norm_shape, .forward = layer_norm_forward, .gradient = layer_norm_grad),
    QKV_OP(.name = "layer_norm_backward",
           .doc =
               "dx, dgamma and dbeta of layer_norm from dy, x, gamma and the saved mean and rstd",
           QKV_INPUTS("dy", "x", "gamma", "mean", "rstd"), QKV_OUTPUTS("dx", "dgamma", "dbeta"),
           .shape = layer_norm_backward_shape, .forward = layer_norm_backward_forward,
           .scratch_size = layer_norm_backward_scratch),
    QKV_OPS_END,
};

/* ---- typed function ----------------------------------------------------- */

QkvValue *
qkv_layer_norm(QkvValue *x, QkvValue *gamma, QkvValue *beta, double eps, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("layer_norm", error, x, gamma, beta);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "eps", g_variant_new_double(eps));
  QkvValue *inputs[] = {x, gamma, beta};
  return qkv_op_call("layer_norm", inputs, 3, g_variant_builder_end(&attrs), error);
}
