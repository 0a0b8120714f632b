/* loss.c: "cross_entropy" (with its fused backward) and "mse".
 *
 * cross_entropy takes label smoothing ε as PyTorch's label_smoothing= does:
 * the target distribution is (1 − ε) onehot(target) + ε / C, so a token's
 * loss is (1 − ε)(−log p_target) + ε mean_j(−log p_j).
 *
 * Both take a reduction attribute: "none" keeps one loss per token (per
 * element for mse), "sum" adds them up, "mean" divides that sum by the number
 * of tokens (elements). For cross_entropy the optional weight multiplies each
 * token's loss before the reduction, and "mean" still divides by the number of
 * tokens, not by the sum of the weights. A target outside [0, C) contributes
 * a loss of 0 and a gradient of 0 (such as a padding id past the classes).
 */
#include "ops-common.h"

#include <math.h>

/* cross_entropy's inputs are logits, targets and the optional weight, in
 * fixed slots; cross_entropy_backward's are dloss and the same three. */
#define CE_WEIGHT 2
#define CE_BACKWARD_WEIGHT (1 + CE_WEIGHT)

/* Every loss op's. */
#define REDUCTION_ATTR QKV_STRING_ATTR("reduction", "mean", "\"none\", \"sum\" or \"mean\"")

static const QkvAttrSpec ce_attrs[] = {
    REDUCTION_ATTR,
    QKV_FLOAT_ATTR("label_smoothing", 0.0, "ε in [0, 1]: the target is (1 − ε) onehot + ε / C"),
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

static GVariant *
ce_attrs_variant(QkvReduction reduction, double label_smoothing)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "reduction",
                        g_variant_new_string(reduction_name(reduction)));
  g_variant_builder_add(&attrs, "{sv}", "label_smoothing", g_variant_new_double(label_smoothing));
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

/* −log softmax(x)[target] over one row of c logits, using buf (c floats),
 * smoothed by eps: lse − (1 − ε) x_target − ε mean_j x_j, all relative to the
 * row's max. */
static float
ce_row(const float *x, gint64 c, gint64 target, float eps, float *buf)
{
  if (target < 0 || target >= c)
    return 0.0f;
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

typedef struct {
  const float *logits, *weight;
  const gint32 *targets;
  float *bufs, *losses;
  gint64 c;
  float eps;
} CeJob;

static void
ce_forward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const CeJob *j = user_data;
  for (gint64 i = begin; i < end; i++) {
    float loss = ce_row(j->logits + i * j->c, j->c, j->targets[i], j->eps, j->bufs + thread * j->c);
    j->losses[i] = j->weight != NULL ? loss * j->weight[i] : loss;
  }
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

  /* Per-token losses go straight to the output for "none", else after the
   * row buffers in scratch. Use no more threads than scratch has rows for
   * (the plan's thread count may have changed since it was sized). */
  gint64 max_threads = c > 0 ? ((gint64)(ctx->scratch_size / sizeof(float)) - tokens) / c : 1;
  gint n_threads = (gint)CLAMP(max_threads, 1, MAX(ctx->n_threads, 1));
  float *bufs = ctx->scratch;
  float *losses = reduction == QKV_REDUCTION_NONE ? out : bufs + n_threads * c;

  CeJob job = {logits,
               weight,
               targets,
               bufs,
               losses,
               c,
               (float)qkv_attrs_get_float(ctx->attrs, "label_smoothing")};
  /* about ten units of work per logit: max, subtract, exp, sum */
  qkv_parallel_for(qkv_work_threads(n_threads, 10 * tokens * c), tokens, ce_forward_rows, &job);

  if (reduction != QKV_REDUCTION_NONE) {
    double total = 0.0;
    for (gint64 i = 0; i < tokens; i++)
      total += losses[i];
    if (reduction == QKV_REDUCTION_MEAN)
      total = tokens > 0 ? total / (double)tokens : 0.0;
    out[0] = (float)total;
  }
}

static gboolean
ce_grad(QkvGradCtx *g, GError **error)
{
  QkvReduction reduction = QKV_REDUCTION_MEAN;
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  reduction_parse(g->attrs, &reduction);
  g->in_grads[0] = qkv_cross_entropy_backward_smoothed(
      g->out_grads[0], g->inputs[0], g->inputs[1],
      g->n_inputs > CE_WEIGHT ? g->inputs[CE_WEIGHT] : NULL, reduction,
      qkv_attrs_get_float(g->attrs, "label_smoothing"), error);
  return g->in_grads[0] != NULL;
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
 * dloss, and / N for "mean"; a row whose target is out of range gets zeros. */
typedef struct {
  const float *dloss, *logits;
  const gint32 *targets;
  const float *weight;
  float *dx;
  gint64 c;
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
    if (target < 0 || target >= c) {
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
  float mean_scale = reduction == QKV_REDUCTION_MEAN && tokens > 0 ? 1.0f / (float)tokens : 1.0f;

  CeBackwardJob job = {
      dloss,     logits,     targets,
      weight,    dx,         c,
      reduction, mean_scale, (float)qkv_attrs_get_float(ctx->attrs, "label_smoothing")};
  qkv_parallel_for(qkv_kernel_threads(ctx, 10 * tokens * c), tokens, ce_backward_rows, &job);
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
                  "reduced by \"none\", \"sum\" or \"mean\" (sum / number of tokens); a target "
                  "outside [0, C) adds 0 and gets no gradient",
           QKV_INPUTS_OPT(CE_WEIGHT, "logits", "targets", "weight"), QKV_OUTPUTS("loss"),
           QKV_ATTR_TABLE(ce_attrs), .no_grad_inputs = (1 << 1) | (1 << 2), .shape = ce_shape,
           .forward = ce_forward, .gradient = ce_grad, .scratch_size = ce_scratch_size),
    QKV_OP(.name = "cross_entropy_backward",
           .doc = "d loss / d logits of cross_entropy: (softmax − (1 − ε) onehot − ε / C) · weight "
                  "· dloss, / N for \"mean\"",
           QKV_INPUTS_OPT(CE_BACKWARD_WEIGHT, "dloss", "logits", "targets", "weight"),
           QKV_OUTPUTS("dlogits"), QKV_ATTR_TABLE(ce_attrs), .no_grad_inputs = (1 << 2) | (1 << 3),
           .shape = ce_backward_shape, .forward = ce_backward_forward),
    QKV_OP(.name = "mse",
           .doc = "(pred − target)² over inputs of the same shape, reduced by \"none\", \"sum\" or "
                  "\"mean\"",
           QKV_INPUTS("pred", "target"), QKV_OUTPUTS("loss"), QKV_ATTRS(REDUCTION_ATTR),
           .shape = mse_shape, .forward = mse_forward, .gradient = mse_grad),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

QkvValue *
qkv_cross_entropy_smoothed(QkvValue *logits, QkvValue *targets, QkvValue *weight,
                           QkvReduction reduction, double label_smoothing, GError **error)
{
  QKV_RETURN_IF_MISSING("cross_entropy", error, logits, targets);
  g_return_val_if_fail(reduction_name(reduction) != NULL, NULL);
  QkvValue *inputs[] = {logits, targets, weight};
  return qkv_op_call("cross_entropy", inputs, weight != NULL ? CE_WEIGHT + 1 : CE_WEIGHT,
                     ce_attrs_variant(reduction, label_smoothing), error);
}

QkvValue *
qkv_cross_entropy(QkvValue *logits, QkvValue *targets, QkvValue *weight, QkvReduction reduction,
                  GError **error)
{
  return qkv_cross_entropy_smoothed(logits, targets, weight, reduction, 0.0, error);
}

QkvValue *
qkv_cross_entropy_backward_smoothed(QkvValue *dloss, QkvValue *logits, QkvValue *targets,
                                    QkvValue *weight, QkvReduction reduction,
                                    double label_smoothing, GError **error)
{
  QKV_RETURN_IF_MISSING("cross_entropy_backward", error, dloss, logits, targets);
  g_return_val_if_fail(reduction_name(reduction) != NULL, NULL);
  QkvValue *inputs[] = {dloss, logits, targets, weight};
  return qkv_op_call("cross_entropy_backward", inputs,
                     weight != NULL ? CE_BACKWARD_WEIGHT + 1 : CE_BACKWARD_WEIGHT,
                     ce_attrs_variant(reduction, label_smoothing), error);
}

QkvValue *
qkv_cross_entropy_backward(QkvValue *dloss, QkvValue *logits, QkvValue *targets, QkvValue *weight,
                           QkvReduction reduction, GError **error)
{
  return qkv_cross_entropy_backward_smoothed(dloss, logits, targets, weight, reduction, 0.0, error);
}

QkvValue *
qkv_mse(QkvValue *pred, QkvValue *target, QkvReduction reduction, GError **error)
{
  QKV_RETURN_IF_MISSING("mse", error, pred, target);
  g_return_val_if_fail(reduction_name(reduction) != NULL, NULL);
  QkvValue *inputs[] = {pred, target};
  return qkv_op_call("mse", inputs, 2, reduction_attrs_variant(reduction), error);
}
