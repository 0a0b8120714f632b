/* select.c: picking between values by a condition or a mask: "where",
 * "masked_fill", "sequence_mask", "clamp" and its gradient op
 * "clamp_backward".
 *
 * A condition or mask may be f32 or i32; any nonzero element is true (so an
 * f32 NaN is true too), which makes the 0/1 output of a comparison or of
 * sequence_mask usable as is.
 */
#include "broadcast-common.h"

#include <math.h>
#include "error-private.h"

static gboolean
check_cond_dtype(QkvShapeCtx *ctx, guint i, const gchar *name, GError **error)
{
  if (ctx->in_dtypes[i] != QKV_F32 && ctx->in_dtypes[i] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32 or i32", name,
                           qkv_dtype_name(ctx->in_dtypes[i]));
  return TRUE;
}

static gboolean
check_f32(QkvShapeCtx *ctx, guint i, const gchar *name, GError **error)
{
  if (ctx->in_dtypes[i] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32", name,
                           qkv_dtype_name(ctx->in_dtypes[i]));
  return TRUE;
}

/* ---- where -------------------------------------------------------------- */

typedef struct {
  float *out;
  gconstpointer cond;
  QkvDType cond_dtype;
  const float *a, *b;
} WhereJob;

static void
where_row(gpointer data, gint64 out_off, const gint64 *in_off, const gint64 *in_step, gint64 len)
{
  const WhereJob *j = data;
  float *out = j->out + out_off;
  const float *a = j->a + in_off[1], *b = j->b + in_off[2];
  const gint64 sc = in_step[0], sa = in_step[1], sb = in_step[2];
  if (j->cond_dtype == QKV_I32) {
    const gint32 *c = (const gint32 *)j->cond + in_off[0];
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      /* Load both: a select vectorises, a conditional load does not. */
      float x = a[k * sa], y = b[k * sb];
      out[k] = c[k * sc] != 0 ? x : y;
    }
  } else {
    const float *c = (const float *)j->cond + in_off[0];
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      float x = a[k * sa], y = b[k * sb];
      out[k] = c[k * sc] != 0.0f ? x : y;
    }
  }
}

static gboolean
where_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_cond_dtype(ctx, 0, "cond", error) || !check_f32(ctx, 1, "a", error) ||
      !check_f32(ctx, 2, "b", error))
    return FALSE;
  return qkv_bcast_shapes(ctx, 3, &ctx->out_shapes[0], error);
}

static void
where_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *ins[] = {&ctx->in[0].shape, &ctx->in[1].shape, &ctx->in[2].shape};
  QkvBcast b;
  qkv_bcast_init(&b, &ctx->out[0].shape, ins, 3);
  WhereJob job = {ctx->out[0].data, ctx->in[0].data, ctx->in[0].dtype, ctx->in[1].data,
                  ctx->in[2].data};
  qkv_bcast_run(ctx, &b, where_row, &job);
}

/* a gets dy where cond holds, b where it does not; each summed down to its
 * shape where it was broadcast. */
static gboolean
where_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *cond = g->inputs[0], *dy = g->out_grads[0];
  if (dy == NULL)
    return TRUE;
  QkvValue *zero = qkv_graph_scalar(g->graph, 0.0f);
  for (guint i = 1; i < 3; i++) {
    if (!g->needs_grad[i])
      continue;
    QkvValue *gi = i == 1 ? qkv_where(cond, dy, zero, error) : qkv_where(cond, zero, dy, error);
    if (gi == NULL || (g->in_grads[i] = qkv_grad_to_input(gi, g->inputs[i], error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

/* ---- masked_fill -------------------------------------------------------- */

typedef struct {
  float *out;
  const float *x;
  gconstpointer mask;
  QkvDType mask_dtype;
  float value;
} MaskedFillJob;

static void
masked_fill_row(gpointer data, gint64 out_off, const gint64 *in_off, const gint64 *in_step,
                gint64 len)
{
  const MaskedFillJob *j = data;
  float *out = j->out + out_off;
  const float *x = j->x + in_off[0];
  const gint64 sx = in_step[0], sm = in_step[1];
  const float value = j->value;
  if (j->mask_dtype == QKV_I32) {
    const gint32 *m = (const gint32 *)j->mask + in_off[1];
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      float v = x[k * sx];
      out[k] = m[k * sm] != 0 ? value : v;
    }
  } else {
    const float *m = (const float *)j->mask + in_off[1];
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      float v = x[k * sx];
      out[k] = m[k * sm] != 0.0f ? value : v;
    }
  }
}

static gboolean
masked_fill_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_f32(ctx, 0, "x", error) || !check_cond_dtype(ctx, 1, "mask", error))
    return FALSE;
  QkvShape out;
  if (!qkv_bcast_shapes(ctx, 2, &out, error))
    return FALSE;
  /* The output is x's shape: the mask may repeat over x, not widen it. */
  if (!qkv_shape_equal(&out, &ctx->in_shapes[0])) {
    g_autofree gchar *s = qkv_shape_to_string(&out);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "mask must broadcast to x's shape, but together they make %s", s);
  }
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
masked_fill_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *ins[] = {&ctx->in[0].shape, &ctx->in[1].shape};
  QkvBcast b;
  qkv_bcast_init(&b, &ctx->out[0].shape, ins, 2);
  MaskedFillJob job = {ctx->out[0].data, ctx->in[0].data, ctx->in[1].data, ctx->in[1].dtype,
                       (float)qkv_attrs_get_float(ctx->attrs, "value")};
  qkv_bcast_run(ctx, &b, masked_fill_row, &job);
}

/* The filled elements are constant: zero gradient there, dy elsewhere. */
static gboolean
masked_fill_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] = qkv_masked_fill(g->out_grads[0], g->inputs[1], 0.0, error);
  return g->in_grads[0] != NULL;
}

/* ---- sequence_mask ------------------------------------------------------ */

/* sequence_mask's optional input like sits in a fixed slot after valid_lens. */
#define SEQUENCE_MASK_LIKE 1

static gboolean
sequence_mask_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *lens = &ctx->in_shapes[0];
  gint64 maxlen = qkv_attrs_get_int(ctx->attrs, "maxlen");
  if (ctx->n_inputs > SEQUENCE_MASK_LIKE) {
    /* T from like's last axis, so that it follows a plan's bound shapes */
    const QkvShape *like = &ctx->in_shapes[SEQUENCE_MASK_LIKE];
    if (like->rank < 1)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "like must have at least one axis");
    maxlen = like->dims[like->rank - 1];
  }
  if (ctx->in_dtypes[0] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "valid_lens is %s, expected i32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (maxlen < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "maxlen must not be negative, got %" G_GINT64_FORMAT, maxlen);
  if (lens->rank + 1 > QKV_MAX_RANK)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "valid_lens of rank %d would give a mask of rank more than %d",
                           lens->rank, QKV_MAX_RANK);
  QkvShape *out = &ctx->out_shapes[0];
  *out = *lens;
  out->dims[out->rank++] = maxlen;
  return TRUE;
}

typedef struct {
  const gint32 *lens;
  float *out;
  gint64 maxlen;
} SequenceMaskJob;

static void
sequence_mask_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SequenceMaskJob *j = user_data;
  const gint64 t_len = j->maxlen;
  for (gint64 r = begin; r < end; r++) {
    /* A negative length masks everything out, one past T keeps everything. */
    const gint64 len = j->lens[r];
    float *row = j->out + r * t_len;
#pragma omp simd
    for (gint64 t = 0; t < t_len; t++)
      row[t] = t < len ? 1.0f : 0.0f;
  }
}

static void
sequence_mask_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *out = &ctx->out[0].shape;
  SequenceMaskJob job = {ctx->in[0].data, ctx->out[0].data, out->dims[out->rank - 1]};
  gint64 rows = qkv_shape_numel(&ctx->in[0].shape);
  if (job.maxlen == 0)
    return;
  qkv_parallel_for(qkv_kernel_threads(ctx, rows * job.maxlen), rows, sequence_mask_range, &job);
}

/* ---- clamp and clamp_backward ------------------------------------------ */

static const QkvAttrSpec clamp_attrs[] = {
    QKV_FLOAT_ATTR("min", -INFINITY, "lower bound (-inf: none)"),
    QKV_FLOAT_ATTR("max", INFINITY, "upper bound (+inf: none)"),
};

/* PyTorch takes min > max and returns max everywhere; here it is refused,
 * since it can only be a mistake. */
static gboolean
check_bounds(QkvShapeCtx *ctx, GError **error)
{
  double lo = qkv_attrs_get_float(ctx->attrs, "min"), hi = qkv_attrs_get_float(ctx->attrs, "max");
  if (isnan(lo) || isnan(hi))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "min (%g) and max (%g) must not be NaN",
                           lo, hi);
  if (lo > hi)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "min (%g) is above max (%g)", lo, hi);
  return TRUE;
}

static gboolean
clamp_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_f32(ctx, 0, "x", error) || !check_bounds(ctx, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

typedef struct {
  const QkvKernelCtx *ctx;
  float lo, hi;
} ClampJob;

static void
clamp_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ClampJob *j = user_data;
  const float *x = j->ctx->in[0].data;
  float *y = j->ctx->out[0].data;
  const float lo = j->lo, hi = j->hi;
  /* NaN fails both tests and passes through, as in PyTorch. */
#pragma omp simd
  for (gint64 i = begin; i < end; i++) {
    float v = x[i];
    v = v < lo ? lo : v;
    y[i] = v > hi ? hi : v;
  }
}

/* The bounds rounded to f32, as PyTorch converts them for an f32 tensor.
 * Rounding is monotonic, so clamping an f32 x to the rounded bounds gives the
 * double clamp rounded to f32. */
static ClampJob
clamp_job(const QkvKernelCtx *ctx)
{
  ClampJob job = {ctx, (float)qkv_attrs_get_float(ctx->attrs, "min"),
                  (float)qkv_attrs_get_float(ctx->attrs, "max")};
  return job;
}

static void
clamp_forward(const QkvKernelCtx *ctx)
{
  ClampJob job = clamp_job(ctx);
  gint64 n = qkv_shape_numel(&ctx->out[0].shape);
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, clamp_range, &job);
}

static gboolean
clamp_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] =
      qkv_clamp_backward(g->out_grads[0], g->inputs[0], qkv_attrs_get_float(g->attrs, "min"),
                         qkv_attrs_get_float(g->attrs, "max"), error);
  return g->in_grads[0] != NULL;
}

static gboolean
clamp_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_f32(ctx, 0, "dy", error) || !check_f32(ctx, 1, "x", error) ||
      !check_bounds(ctx, error))
    return FALSE;
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and x must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
clamp_backward_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ClampJob *j = user_data;
  const float *dy = j->ctx->in[0].data, *x = j->ctx->in[1].data;
  float *dx = j->ctx->out[0].data;
  const float lo = j->lo, hi = j->hi;
  /* Inclusive at the bounds, as PyTorch's; NaN x gets none. */
#pragma omp simd
  for (gint64 i = begin; i < end; i++) {
    float d = dy[i], v = x[i];
    dx[i] = (v >= lo && v <= hi) ? d : 0.0f;
  }
}

static void
clamp_backward_forward(const QkvKernelCtx *ctx)
{
  ClampJob job = clamp_job(ctx);
  gint64 n = qkv_shape_numel(&ctx->out[0].shape);
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, clamp_backward_range, &job);
}

/* Linear in dy, flat in x. */
static gboolean
clamp_backward_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] =
      qkv_clamp_backward(g->out_grads[0], g->inputs[1], qkv_attrs_get_float(g->attrs, "min"),
                         qkv_attrs_get_float(g->attrs, "max"), error);
  return g->in_grads[0] != NULL;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_select[] = {
    QKV_OP(.name = "where",
           .doc = "a where cond is nonzero, else b (cond f32 or i32; all three broadcast); "
                  "gradient to a and b",
           QKV_INPUTS("cond", "a", "b"), QKV_OUTPUTS("y"), .no_grad_inputs = 1 << 0,
           .shape = where_shape, .forward = where_forward, .gradient = where_grad),
    QKV_OP(.name = "masked_fill",
           .doc = "x with value where mask (f32 or i32, broadcast to x) is nonzero; zero gradient "
                  "there",
           QKV_INPUTS("x", "mask"), QKV_OUTPUTS("y"),
           QKV_ATTRS(
               QKV_REQUIRED_ATTR("value", FLOAT, "what the output holds where mask is nonzero")),
           .no_grad_inputs = 1 << 1, .flags = QKV_OP_INPLACE, .shape = masked_fill_shape,
           .forward = masked_fill_forward, .gradient = masked_fill_grad),
    QKV_OP(.name = "sequence_mask",
           .doc = "f32 mask (…, maxlen) from i32 valid_lens (…): 1 where t < valid_lens, else 0; "
                  "with a second input like, maxlen is like's last dim",
           QKV_INPUTS_OPT(SEQUENCE_MASK_LIKE, "valid_lens", "like"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("maxlen", INT, "T, the length of the new last axis")),
           .no_grad_inputs = (1 << 0) | (1 << 1), .shape = sequence_mask_shape,
           .forward = sequence_mask_forward),
    QKV_OP(.name = "clamp",
           .doc = "x limited to [min, max] (NaN passes through); gradient where min ≤ x ≤ max",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), QKV_ATTR_TABLE(clamp_attrs), .flags = QKV_OP_INPLACE,
           .shape = clamp_shape, .forward = clamp_forward, .gradient = clamp_grad),
    QKV_OP(.name = "clamp_backward",
           .doc = "dy where min ≤ x ≤ max, else 0 (the gradient of clamp)", QKV_INPUTS("dy", "x"),
           QKV_OUTPUTS("dx"), QKV_ATTR_TABLE(clamp_attrs), .flags = QKV_OP_INPLACE,
           .shape = clamp_backward_shape, .forward = clamp_backward_forward,
           .gradient = clamp_backward_grad),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */

QkvValue *
qkv_where(QkvValue *cond, QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (cond == NULL || a == NULL || b == NULL)
    return NULL;
  QkvValue *inputs[] = {cond, a, b};
  return qkv_op_call("where", inputs, 3, NULL, error);
}

QkvValue *
qkv_masked_fill(QkvValue *x, QkvValue *mask, double value, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL || mask == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "value", g_variant_new_double(value));
  QkvValue *inputs[] = {x, mask};
  return qkv_op_call("masked_fill", inputs, 2, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_sequence_mask(QkvValue *valid_lens, gint64 maxlen, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (valid_lens == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "maxlen", g_variant_new_int64(maxlen));
  return qkv_op_call("sequence_mask", &valid_lens, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_sequence_mask_like(QkvValue *valid_lens, QkvValue *like, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("sequence_mask", error, valid_lens, like);
  const QkvShape *s = qkv_value_shape(like);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "maxlen",
                        g_variant_new_int64(s->rank > 0 ? s->dims[s->rank - 1] : 0));
  QkvValue *inputs[] = {valid_lens, like};
  return qkv_op_call("sequence_mask", inputs, 2, g_variant_builder_end(&attrs), error);
}

static GVariant *
bounds_attrs(double lo, double hi)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "min", g_variant_new_double(lo));
  g_variant_builder_add(&attrs, "{sv}", "max", g_variant_new_double(hi));
  return g_variant_builder_end(&attrs);
}

QkvValue *
qkv_clamp(QkvValue *x, double lo, double hi, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  return qkv_op_call("clamp", &x, 1, bounds_attrs(lo, hi), error);
}

QkvValue *
qkv_clamp_backward(QkvValue *dy, QkvValue *x, double lo, double hi, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (dy == NULL || x == NULL)
    return NULL;
  QkvValue *inputs[] = {dy, x};
  return qkv_op_call("clamp_backward", inputs, 2, bounds_attrs(lo, hi), error);
}
