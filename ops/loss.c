/* loss.c: "cross_entropy" (with its fused backward) and "mse".
 *
 * cross_entropy takes label smoothing ε as PyTorch's label_smoothing= does:
 * the target distribution is (1 − ε) onehot(target) + ε / C, so a token's
 * loss is (1 − ε)(−log p_target) + ε mean_j(−log p_j).
 *
 * Both take a reduction attribute: "none" keeps one loss per token (per
 * element for mse), "sum" adds them up, "mean" divides that sum by the number
 * of tokens (elements). For cross_entropy a target equal to ignore_index
 * (−100 unless the node says otherwise, as PyTorch) adds a loss of 0, takes
 * a gradient of 0 and is left out of that number, as PyTorch's; a mean over
 * no target at all is 0 (PyTorch's is NaN). Any other target outside [0, C)
 * fails the run (qkv_kernel_fail), naming the row and the value, in the
 * forward and the backward kernels alike. The optional weight multiplies
 * each token's loss before the reduction, and "mean" still divides by the
 * number of targets counted, not by the sum of the weights. The weight has
 * a gradient: each token's unweighted loss times dloss (over that number,
 * for "mean"), from "cross_entropy_weight_backward".
 */
#include "ops-common.h"

#include <math.h>
#include "error-private.h"

/* cross_entropy's inputs are logits, targets and the optional weight, in
 * fixed slots; cross_entropy_backward's are dloss and the same three. */
#define CE_WEIGHT 2
#define CE_BACKWARD_WEIGHT (1 + CE_WEIGHT)

/* PyTorch's default ignore_index. */
#define CE_IGNORE_INDEX (-100)

/* Every loss op's. */
#define REDUCTION_ATTR QKV_STRING_ATTR("reduction", "mean", "\"none\", \"sum\" or \"mean\"")

static const QkvAttrSpec ce_attrs[] = {
    REDUCTION_ATTR,
    QKV_FLOAT_ATTR("label_smoothing", 0.0, "ε in [0, 1]: the target is (1 − ε) onehot + ε / C"),
    QKV_INT_ATTR("ignore_index", CE_IGNORE_INDEX,
                 "a target equal to it adds 0, takes no gradient and is left out of the mean; "
                 "any other target outside [0, C) fails the run"),
};

static const gchar *
reduction_name(QkvReduction reduction)
{
  switch (reduction) {
  case QKV_REDUCTION_NONE:
    return "none";
  case QKV_REDUCTION_SUM:
    return "sum";
  case QKV_REDUCTION_MEAN:
    return "mean";
  }
  return NULL;
}

/* The reduction named by the node's attribute; FALSE for an unknown name. */
static gboolean
reduction_parse(const QkvAttrs *attrs, QkvReduction *reduction)
{
  const gchar *name = qkv_attrs_get_string(attrs, "reduction");
  for (QkvReduction r = QKV_REDUCTION_NONE; r <= QKV_REDUCTION_MEAN; r++) {
    if (g_strcmp0(name, reduction_name(r)) == 0) {
      *reduction = r;
      return TRUE;
    }
  }
  return FALSE;
}

static gboolean
check_reduction(QkvShapeCtx *ctx, QkvReduction *reduction, GError **error)
{
  if (reduction_parse(ctx->attrs, reduction))
    return TRUE;
  return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                         "reduction must be \"none\", \"sum\" or \"mean\", got \"%s\"",
                         qkv_attrs_get_string(ctx->attrs, "reduction"));
}

static GVariant *
reduction_attrs_variant(QkvReduction reduction)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "reduction",
                        g_variant_new_string(reduction_name(reduction)));
  return g_variant_builder_end(&attrs);
}

/* ignore_index is written only when it is not the default, so that nodes
 * built without it keep the attributes they always had. */
static GVariant *
ce_attrs_variant(QkvReduction reduction, double label_smoothing, gint64 ignore_index)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "reduction",
                        g_variant_new_string(reduction_name(reduction)));
  g_variant_builder_add(&attrs, "{sv}", "label_smoothing", g_variant_new_double(label_smoothing));
  if (ignore_index != CE_IGNORE_INDEX)
    g_variant_builder_add(&attrs, "{sv}", "ignore_index", g_variant_new_int64(ignore_index));
  return g_variant_builder_end(&attrs);
}

static gboolean
check_label_smoothing(QkvShapeCtx *ctx, GError **error)
{
  double eps = qkv_attrs_get_float(ctx->attrs, "label_smoothing");
  if (eps >= 0.0 && eps <= 1.0)
    return TRUE;
  return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                         "label_smoothing must be in [0, 1], got %g", eps);
}

/* ---- cross_entropy ------------------------------------------------------ */

/* Check logits (…, C), targets i32 (…) and the optional weight f32 (…). */
static gboolean
check_ce_inputs(QkvShapeCtx *ctx, guint first, GError **error)
{
  const QkvShape *logits = &ctx->in_shapes[first], *targets = &ctx->in_shapes[first + 1];
  if (ctx->in_dtypes[first] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "logits must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[first]));
  if (ctx->in_dtypes[first + 1] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "targets must be i32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[first + 1]));
  if (logits->rank < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "logits must have rank 1 or more (classes on the last axis)");
  gboolean fits = targets->rank == logits->rank - 1;
  for (gint i = 0; fits && i < targets->rank; i++)
    fits = targets->dims[i] == logits->dims[i];
  if (!fits)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "targets must have the shape of logits without its last axis");
  if (ctx->n_inputs > first + CE_WEIGHT) {
    if (ctx->in_dtypes[first + CE_WEIGHT] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "weight must be f32, got %s",
                             qkv_dtype_name(ctx->in_dtypes[first + CE_WEIGHT]));
    if (!qkv_shape_equal(&ctx->in_shapes[first + CE_WEIGHT], targets))
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "weight must have the shape of targets");
  }
  return TRUE;
}

static gboolean
ce_shape(QkvShapeCtx *ctx, GError **error)
{
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (!check_ce_inputs(ctx, 0, error) || !check_reduction(ctx, &reduction, error) ||
      !check_label_smoothing(ctx, error))
    return FALSE;
  ctx->out_shapes[0] = reduction == QKV_REDUCTION_NONE ? ctx->in_shapes[1] : qkv_shape_scalar();
  return TRUE;
}

/* Each thread stages one row of exp(logits − max) in scratch, and the
 * per-token losses follow so that a sum adds them in one fixed order. */
static gsize
ce_scratch_size(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *logits = &ctx->in_shapes[0];
  gint64 c = logits->dims[logits->rank - 1];
  gint64 tokens = qkv_shape_numel(&ctx->in_shapes[1]);
  return (gsize)(MAX(n_threads, 1) * c + tokens) * sizeof(float);
}

/* The number of targets that count (those not equal to ignore_index), or
 * -1 after failing the run on the first other one outside [0, c). One
 * serial pass: a token's row costs c times more, and the first bad row is
 * the one reported whatever the thread count. */
static gint64
ce_count_targets(const QkvKernelCtx *ctx, const gint32 *targets, gint64 tokens, gint64 c,
                 gint64 ignore_index)
{
  gint64 counted = 0;
  for (gint64 i = 0; i < tokens; i++) {
    gint64 t = targets[i];
    if (t == ignore_index)
      continue;
    if (G_UNLIKELY(t < 0 || t >= c)) {
      qkv_kernel_fail(ctx, QKV_ERROR_INDEX,
                      "target %" G_GINT64_FORMAT " at row %" G_GINT64_FORMAT
                      " is outside [0, %" G_GINT64_FORMAT
                      ") and is not ignore_index (%" G_GINT64_FORMAT ")",
                      t, i, c, ignore_index);
      return -1;
    }
    counted++;
  }
  return counted;
}

/* A row whose target takes no part: ignored, or out of range (which
 * ce_count_targets has refused already; the row kernels check it anyway so
 * that nothing is read out of bounds). */
static inline gboolean
ce_skipped(gint64 target, gint64 c, gint64 ignore_index)
{
  return target == ignore_index || target < 0 || target >= c;
}

/* −log softmax(x)[target] over one row of c logits, using buf (c floats),
 * smoothed by eps: lse − (1 − ε) x_target − ε mean_j x_j, all relative to the
 * row's max. */
static float
ce_row(const float *x, gint64 c, gint64 target, float eps, float *buf)
{
  float m = -INFINITY;
  for (gint64 j = 0; j < c; j++)
    m = x[j] > m ? x[j] : m;
  for (gint64 j = 0; j < c; j++)
    buf[j] = x[j] - m;
  qkv_vec_exp(buf, buf, (gsize)c);
  float sum = 0.0f;
  for (gint64 j = 0; j < c; j++)
    sum += buf[j];
  if (eps == 0.0f)
    return logf(sum) - (x[target] - m);
  float shifted = 0.0f;
  for (gint64 j = 0; j < c; j++)
    shifted += x[j] - m;
  return logf(sum) - (1.0f - eps) * (x[target] - m) - eps * (shifted / (float)c);
}

/* The forward and cross_entropy_weight_backward: per-token losses, times
 * weight (the forward's) or times dloss · scale (the weight's gradient). */
typedef struct {
  const float *logits, *weight, *dloss;
  const gint32 *targets;
  float *bufs, *losses;
  gint64 c, ignore_index;
  gboolean dloss_per_token;
  float eps, scale;
} CeJob;

static void
ce_forward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const CeJob *j = user_data;
  for (gint64 i = begin; i < end; i++) {
    gint64 target = j->targets[i];
    float loss = ce_skipped(target, j->c, j->ignore_index)
                     ? 0.0f
                     : ce_row(j->logits + i * j->c, j->c, target, j->eps, j->bufs + thread * j->c);
    if (j->weight != NULL)
      loss *= j->weight[i];
    if (j->dloss != NULL)
      loss *= j->dloss[j->dloss_per_token ? i : 0] * j->scale;
    j->losses[i] = loss;
  }
}

/* Threads the kernel may use: no more than scratch has row buffers for
 * (extra floats after them are the kernel's), and than the plan gives. */
static gint
ce_scratch_threads(const QkvKernelCtx *ctx, gint64 c, gint64 extra)
{
  gint64 max_threads = c > 0 ? ((gint64)(ctx->scratch_size / sizeof(float)) - extra) / c : 1;
  return (gint)CLAMP(max_threads, 1, MAX(ctx->n_threads, 1));
}

static void
ce_forward(const QkvKernelCtx *ctx)
{
  const float *logits = ctx->in[0].data;
  const gint32 *targets = ctx->in[1].data;
  const float *weight = ctx->n_inputs > CE_WEIGHT ? ctx->in[CE_WEIGHT].data : NULL;
  float *out = ctx->out[0].data;
  gint64 c = ctx->in[0].shape.dims[ctx->in[0].shape.rank - 1];
  gint64 tokens = qkv_shape_numel(&ctx->in[1].shape);
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  reduction_parse(ctx->attrs, &reduction);
  gint64 ignore_index = qkv_attrs_get_int(ctx->attrs, "ignore_index");
  gint64 counted = ce_count_targets(ctx, targets, tokens, c, ignore_index);
  if (counted < 0)
    return;

  /* Per-token losses go straight to the output for "none", else after the
   * row buffers in scratch (the plan's thread count may have changed since
   * it was sized). */
  gint n_threads = ce_scratch_threads(ctx, c, tokens);
  float *bufs = ctx->scratch;
  float *losses = reduction == QKV_REDUCTION_NONE ? out : bufs + n_threads * c;

  CeJob job = {.logits = logits,
               .weight = weight,
               .targets = targets,
               .bufs = bufs,
               .losses = losses,
               .c = c,
               .ignore_index = ignore_index,
               .eps = (float)qkv_attrs_get_float(ctx->attrs, "label_smoothing")};
  /* about ten units of work per logit: max, subtract, exp, sum */
  qkv_parallel_for(qkv_work_threads(n_threads, 10 * tokens * c), tokens, ce_forward_rows, &job);

  if (reduction != QKV_REDUCTION_NONE) {
    double total = 0.0;
    for (gint64 i = 0; i < tokens; i++)
      total += losses[i];
    if (reduction == QKV_REDUCTION_MEAN)
      total = counted > 0 ? total / (double)counted : 0.0;
    out[0] = (float)total;
  }
}

/* d loss / d logits from cross_entropy_backward, d loss / d weight from
 * cross_entropy_weight_backward (the weight enters linearly). */
static gboolean
ce_grad(QkvGradCtx *g, GError **error)
{
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (g->out_grads[0] == NULL)
    return TRUE;
  reduction_parse(g->attrs, &reduction);
  double eps = qkv_attrs_get_float(g->attrs, "label_smoothing");
  gint64 ignore_index = qkv_attrs_get_int(g->attrs, "ignore_index");
  gboolean weighted = g->n_inputs > CE_WEIGHT;
  if (g->needs_grad[0]) {
    g->in_grads[0] = qkv_cross_entropy_backward_ignore(g->out_grads[0], g->inputs[0], g->inputs[1],
                                                       weighted ? g->inputs[CE_WEIGHT] : NULL,
                                                       reduction, eps, ignore_index, error);
    if (g->in_grads[0] == NULL)
      return FALSE;
  }
  if (weighted && g->needs_grad[CE_WEIGHT]) {
    g->in_grads[CE_WEIGHT] = qkv_cross_entropy_weight_backward(
        g->out_grads[0], g->inputs[0], g->inputs[1], reduction, eps, ignore_index, error);
    if (g->in_grads[CE_WEIGHT] == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
ce_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (!check_ce_inputs(ctx, 1, error) || !check_reduction(ctx, &reduction, error) ||
      !check_label_smoothing(ctx, error))
    return FALSE;
  const QkvShape *dloss = &ctx->in_shapes[0];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dloss must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (reduction == QKV_REDUCTION_NONE ? !qkv_shape_equal(dloss, &ctx->in_shapes[2])
                                      : qkv_shape_numel(dloss) != 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dloss must have the shape of the loss (that of targets for "
                           "reduction \"none\", else one element)");
  ctx->out_shapes[0] = ctx->in_shapes[1];
  return TRUE;
}

/* dlogits = (softmax(logits) − (1 − ε) onehot(target) − ε / C) · weight ·
 * dloss, and / N (the targets counted) for "mean"; a row whose target is
 * ignored gets zeros. */
typedef struct {
  const float *dloss, *logits;
  const gint32 *targets;
  const float *weight;
  float *dx;
  gint64 c, ignore_index;
  QkvReduction reduction;
  float mean_scale, eps;
} CeBackwardJob;

static void
ce_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const CeBackwardJob *j = user_data;
  const gint64 c = j->c;
  for (gint64 i = begin; i < end; i++) {
    const float *x = j->logits + i * c;
    float *d = j->dx + i * c;
    gint64 target = j->targets[i];
    if (ce_skipped(target, c, j->ignore_index)) {
      memset(d, 0, (gsize)c * sizeof(float));
      continue;
    }
    float scale = (j->reduction == QKV_REDUCTION_NONE ? j->dloss[i] : j->dloss[0]) * j->mean_scale;
    if (j->weight != NULL)
      scale *= j->weight[i];
    float m = -INFINITY;
    for (gint64 k = 0; k < c; k++)
      m = x[k] > m ? x[k] : m;
    for (gint64 k = 0; k < c; k++)
      d[k] = x[k] - m;
    qkv_vec_exp(d, d, (gsize)c);
    float sum = 0.0f;
    for (gint64 k = 0; k < c; k++)
      sum += d[k];
    float f = scale / sum;
    if (j->eps == 0.0f) {
      for (gint64 k = 0; k < c; k++)
        d[k] *= f;
      d[target] -= scale;
    } else {
      float uniform = scale * (j->eps / (float)c);
      for (gint64 k = 0; k < c; k++)
        d[k] = d[k] * f - uniform;
      d[target] -= (1.0f - j->eps) * scale;
    }
  }
}

static void
ce_backward_forward(const QkvKernelCtx *ctx)
{
  const float *dloss = ctx->in[0].data;
  const float *logits = ctx->in[1].data;
  const gint32 *targets = ctx->in[2].data;
  const float *weight =
      ctx->n_inputs > CE_BACKWARD_WEIGHT ? ctx->in[CE_BACKWARD_WEIGHT].data : NULL;
  float *dx = ctx->out[0].data;
  gint64 c = ctx->in[1].shape.dims[ctx->in[1].shape.rank - 1];
  gint64 tokens = qkv_shape_numel(&ctx->in[2].shape);
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  reduction_parse(ctx->attrs, &reduction);
  gint64 ignore_index = qkv_attrs_get_int(ctx->attrs, "ignore_index");
  gint64 counted = ce_count_targets(ctx, targets, tokens, c, ignore_index);
  if (counted < 0)
    return;
  float mean_scale = reduction == QKV_REDUCTION_MEAN && counted > 0 ? 1.0f / (float)counted : 1.0f;

  CeBackwardJob job = {.dloss = dloss,
                       .logits = logits,
                       .targets = targets,
                       .weight = weight,
                       .dx = dx,
                       .c = c,
                       .ignore_index = ignore_index,
                       .reduction = reduction,
                       .mean_scale = mean_scale,
                       .eps = (float)qkv_attrs_get_float(ctx->attrs, "label_smoothing")};
  qkv_parallel_for(qkv_kernel_threads(ctx, 10 * tokens * c), tokens, ce_backward_rows, &job);
}

/* ---- cross_entropy_weight_backward ---------------------------------------- */

/* dloss, logits, targets: the shapes cross_entropy_backward takes without a
 * weight; the gradient has the shape of targets. */
static gboolean
ce_weight_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!ce_backward_shape(ctx, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[2];
  return TRUE;
}

/* A row buffer per thread, as the forward's. */
static gsize
ce_weight_backward_scratch_size(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *logits = &ctx->in_shapes[1];
  return (gsize)(MAX(n_threads, 1) * logits->dims[logits->rank - 1]) * sizeof(float);
}

/* dweight[i] = loss_i · dloss (dloss[i] for "none"), / N for "mean": the
 * forward's per-token losses without the weight, scaled. */
static void
ce_weight_backward_forward(const QkvKernelCtx *ctx)
{
  const float *dloss = ctx->in[0].data;
  const gint32 *targets = ctx->in[2].data;
  gint64 c = ctx->in[1].shape.dims[ctx->in[1].shape.rank - 1];
  gint64 tokens = qkv_shape_numel(&ctx->in[2].shape);
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  reduction_parse(ctx->attrs, &reduction);
  gint64 ignore_index = qkv_attrs_get_int(ctx->attrs, "ignore_index");
  gint64 counted = ce_count_targets(ctx, targets, tokens, c, ignore_index);
  if (counted < 0)
    return;
  gint n_threads = ce_scratch_threads(ctx, c, 0);
  CeJob job = {.logits = ctx->in[1].data,
               .dloss = dloss,
               .targets = targets,
               .bufs = ctx->scratch,
               .losses = ctx->out[0].data,
               .c = c,
               .ignore_index = ignore_index,
               .dloss_per_token = reduction == QKV_REDUCTION_NONE,
               .eps = (float)qkv_attrs_get_float(ctx->attrs, "label_smoothing"),
               .scale =
                   reduction == QKV_REDUCTION_MEAN && counted > 0 ? 1.0f / (float)counted : 1.0f};
  qkv_parallel_for(qkv_work_threads(n_threads, 10 * tokens * c), tokens, ce_forward_rows, &job);
}

/* ---- mse ---------------------------------------------------------------- */

static gboolean
mse_shape(QkvShapeCtx *ctx, GError **error)
{
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE,
                           "pred and target must be f32, got %s and %s",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "pred and target must have the same shape");
  if (!check_reduction(ctx, &reduction, error))
    return FALSE;
  ctx->out_shapes[0] = reduction == QKV_REDUCTION_NONE ? ctx->in_shapes[0] : qkv_shape_scalar();
  return TRUE;
}

static void
mse_forward(const QkvKernelCtx *ctx)
{
  const float *pred = ctx->in[0].data, *target = ctx->in[1].data;
  float *out = ctx->out[0].data;
  gint64 n = qkv_shape_numel(&ctx->in[0].shape);
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  reduction_parse(ctx->attrs, &reduction);

  if (reduction == QKV_REDUCTION_NONE) {
    for (gint64 i = 0; i < n; i++) {
      float d = pred[i] - target[i];
      out[i] = d * d;
    }
    return;
  }
  /* One serial pass in double: the same sum whatever the thread count. */
  double total = 0.0;
  for (gint64 i = 0; i < n; i++) {
    double d = (double)pred[i] - (double)target[i];
    total += d * d;
  }
  if (reduction == QKV_REDUCTION_MEAN)
    total = n > 0 ? total / (double)n : 0.0;
  out[0] = (float)total;
}

/* d loss / d pred = 2 (pred − target) · dloss (/ N for "mean"), and the
 * negative of that for target. */
static gboolean
mse_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *pred = g->inputs[0], *target = g->inputs[1], *dloss = g->out_grads[0];
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (dloss == NULL || (!g->needs_grad[0] && !g->needs_grad[1]))
    return TRUE;
  reduction_parse(g->attrs, &reduction);

  gint64 n = qkv_shape_numel(qkv_value_shape(pred));
  double factor = reduction == QKV_REDUCTION_MEAN && n > 0 ? 2.0 / (double)n : 2.0;
  QkvValue *diff = qkv_sub(pred, target, error);
  if (diff == NULL)
    return FALSE;
  if (reduction != QKV_REDUCTION_NONE) {
    /* dloss is a scalar: spread it over the elements. */
    dloss = qkv_broadcast_to(dloss, qkv_value_shape(pred), error);
    if (dloss == NULL)
      return FALSE;
  }
  QkvValue *prod = qkv_mul(diff, dloss, error);
  QkvValue *dpred = prod != NULL ? qkv_scale(prod, factor, error) : NULL;
  if (dpred == NULL)
    return FALSE;
  if (g->needs_grad[0])
    g->in_grads[0] = dpred;
  if (g->needs_grad[1]) {
    g->in_grads[1] = qkv_neg(dpred, error);
    if (g->in_grads[1] == NULL)
      return FALSE;
  }
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_loss[] = {
    QKV_OP(.name = "cross_entropy",
           .doc = "−log softmax(logits)[target] per token (label_smoothing ε: (1 − ε) of that plus "
                  "ε times the mean of −log softmax over the classes), times the optional weight, "
                  "reduced by \"none\", \"sum\" or \"mean\" (sum / number of targets not "
                  "ignored); a target equal to ignore_index adds 0 and gets no gradient, any other "
                  "outside [0, C) fails the run",
           QKV_INPUTS_OPT(CE_WEIGHT, "logits", "targets", "weight"), QKV_OUTPUTS("loss"),
           QKV_ATTR_TABLE(ce_attrs), .no_grad_inputs = 1 << 1, .shape = ce_shape,
           .forward = ce_forward, .gradient = ce_grad, .scratch_size = ce_scratch_size),
    QKV_OP(.name = "cross_entropy_backward",
           .doc = "d loss / d logits of cross_entropy: (softmax − (1 − ε) onehot − ε / C) · weight "
                  "· dloss, / N for \"mean\"",
           QKV_INPUTS_OPT(CE_BACKWARD_WEIGHT, "dloss", "logits", "targets", "weight"),
           QKV_OUTPUTS("dlogits"), QKV_ATTR_TABLE(ce_attrs), .no_grad_inputs = (1 << 2) | (1 << 3),
           .shape = ce_backward_shape, .forward = ce_backward_forward),
    QKV_OP(.name = "cross_entropy_weight_backward",
           .doc = "d loss / d weight of cross_entropy: each token's unweighted loss times dloss, "
                  "/ N for \"mean\"; 0 where the target is ignored",
           QKV_INPUTS("dloss", "logits", "targets"), QKV_OUTPUTS("dweight"),
           QKV_ATTR_TABLE(ce_attrs), .no_grad_inputs = 1 << 2, .shape = ce_weight_backward_shape,
           .forward = ce_weight_backward_forward, .scratch_size = ce_weight_backward_scratch_size),
    QKV_OP(.name = "mse",
           .doc = "(pred − target)² over inputs of the same shape, reduced by \"none\", \"sum\" or "
                  "\"mean\"",
           QKV_INPUTS("pred", "target"), QKV_OUTPUTS("loss"), QKV_ATTRS(REDUCTION_ATTR),
           .shape = mse_shape, .forward = mse_forward, .gradient = mse_grad),
    QKV_OPS_END,
};

/* A reduction outside the enum is a value a caller can pass (a cast
 * integer, a binding's number): refused with a GError naming it. */
static gboolean
check_reduction_arg(const gchar *fn, QkvReduction reduction, GError **error)
{
  if (reduction_name(reduction) != NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: reduction %d is not a QkvReduction (none, sum or mean)", fn, (gint)reduction);
  return FALSE;
}

/* ---- typed functions ---------------------------------------------------- */

QkvValue *
qkv_cross_entropy_ignore(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                         QkvReduction reduction, double label_smoothing, gint64 ignore_index,
                         GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("cross_entropy", error, logits, targets);
  if (!check_reduction_arg("qkv_cross_entropy_ignore", reduction, error))
    return NULL;
  QkvValue *inputs[] = {logits, targets, weight};
  return qkv_op_call("cross_entropy", inputs, weight != NULL ? CE_WEIGHT + 1 : CE_WEIGHT,
                     ce_attrs_variant(reduction, label_smoothing, ignore_index), error);
}

QkvValue *
qkv_cross_entropy_smoothed(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                           QkvReduction reduction, double label_smoothing, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_cross_entropy_ignore(logits, targets, weight, reduction, label_smoothing,
                                  CE_IGNORE_INDEX, error);
}

QkvValue *
qkv_cross_entropy(QkvValue *logits, QkvValue *targets, QkvValue *weight, QkvReduction reduction,
                  GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_cross_entropy_smoothed(logits, targets, weight, reduction, 0.0, error);
}

QkvValue *
qkv_cross_entropy_backward_ignore(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                  QkvValue *weight, QkvReduction reduction, double label_smoothing,
                                  gint64 ignore_index, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("cross_entropy_backward", error, dloss, logits, targets);
  if (!check_reduction_arg("qkv_cross_entropy_backward_ignore", reduction, error))
    return NULL;
  QkvValue *inputs[] = {dloss, logits, targets, weight};
  return qkv_op_call("cross_entropy_backward", inputs,
                     weight != NULL ? CE_BACKWARD_WEIGHT + 1 : CE_BACKWARD_WEIGHT,
                     ce_attrs_variant(reduction, label_smoothing, ignore_index), error);
}

QkvValue *
qkv_cross_entropy_backward_smoothed(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                    QkvValue *weight, QkvReduction reduction,
                                    double label_smoothing, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_cross_entropy_backward_ignore(dloss, logits, targets, weight, reduction,
                                           label_smoothing, CE_IGNORE_INDEX, error);
}

QkvValue *
qkv_cross_entropy_weight_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                  QkvReduction reduction, double label_smoothing,
                                  gint64 ignore_index, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("cross_entropy_weight_backward", error, dloss, logits, targets);
  if (!check_reduction_arg("qkv_cross_entropy_weight_backward", reduction, error))
    return NULL;
  QkvValue *inputs[] = {dloss, logits, targets};
  return qkv_op_call("cross_entropy_weight_backward", inputs, 3,
                     ce_attrs_variant(reduction, label_smoothing, ignore_index), error);
}

QkvValue *
qkv_cross_entropy_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets, QkvValue *weight,
                           QkvReduction reduction, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_cross_entropy_backward_smoothed(dloss, logits, targets, weight, reduction, 0.0, error);
}

QkvValue *
qkv_mse(QkvValue *pred, QkvValue *target, QkvReduction reduction, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("mse", error, pred, target);
  if (!check_reduction_arg("qkv_mse", reduction, error))
    return NULL;
  QkvValue *inputs[] = {pred, target};
  return qkv_op_call("mse", inputs, 2, reduction_attrs_variant(reduction), error);
}
