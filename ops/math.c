/* math.c: elementwise "abs", "sign", "sqrt", "square" and "pow" (by a
 * scalar exponent).
 *
 * Gradients follow PyTorch at the awkward points: abs has gradient
 * sign(x), 0 at x = 0; sqrt's is dy / (2 sqrt(x)), +inf at 0 and NaN below;
 * pow's is p·x^(p-1)·dy, and exactly 0 for p = 0 (even at x = 0, where the
 * formula would give 0·inf). sign is flat almost everywhere: no gradient.
 */
#include "ops-common.h"

#include <math.h>

static const gchar *const x_input[] = {"x", NULL};
static const gchar *const y_output[] = {"y", NULL};

typedef enum {
  MATH_ABS,
  MATH_SIGN,
  MATH_SQRT,
  MATH_SQUARE,
  MATH_POW,
} MathKind;

typedef struct {
  MathKind kind;
  const float *x;
  float *y;
  float p;
} MathJob;

static void
math_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MathJob *j = user_data;
  const float *x = j->x;
  float *y = j->y;
  const float p = j->p;
  switch (j->kind) {
  case MATH_ABS:
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      y[i] = fabsf(x[i]);
    break;
  case MATH_SIGN:
    /* Written so that NaN passes through, as torch.sign does. */
#pragma omp simd
    for (gint64 i = begin; i < end; i++) {
      float v = x[i];
      y[i] = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
    }
    break;
  case MATH_SQRT:
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      y[i] = sqrtf(x[i]);
    break;
  case MATH_SQUARE:
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      y[i] = x[i] * x[i];
    break;
  case MATH_POW:
    /* The exponents PyTorch also special-cases get the exact forms (one
     * rounding each: x·x and sqrt are correctly rounded); the rest go to
     * powf, within an ulp or so. */
    if (p == 2.0f) {
#pragma omp simd
      for (gint64 i = begin; i < end; i++)
        y[i] = x[i] * x[i];
    } else if (p == 1.0f) {
      if (y != x)
        memcpy(y + begin, x + begin, (gsize)(end - begin) * sizeof(float));
    } else if (p == 0.0f) {
      /* x^0 = 1 for every x, NaN included (C and PyTorch agree). */
      for (gint64 i = begin; i < end; i++)
        y[i] = 1.0f;
    } else if (p == 0.5f) {
#pragma omp simd
      for (gint64 i = begin; i < end; i++)
        y[i] = sqrtf(x[i]);
    } else if (p == -1.0f) {
#pragma omp simd
      for (gint64 i = begin; i < end; i++)
        y[i] = 1.0f / x[i];
    } else {
      for (gint64 i = begin; i < end; i++)
        y[i] = powf(x[i], p);
    }
    break;
  }
}

static void
math_run(const QkvKernelCtx *ctx, MathKind kind, float p)
{
  MathJob job = {kind, ctx->in[0].data, ctx->out[0].data, p};
  gint64 n = qkv_shape_numel(&ctx->out[0].shape);
  /* powf costs some tens of simple operations. */
  gint64 work = kind == MATH_POW ? 16 * n : n;
  qkv_parallel_for(qkv_kernel_threads(ctx, work), n, math_range, &job);
}

static void
abs_forward(const QkvKernelCtx *ctx)
{
  math_run(ctx, MATH_ABS, 0);
}

static void
sign_forward(const QkvKernelCtx *ctx)
{
  math_run(ctx, MATH_SIGN, 0);
}

static void
sqrt_forward(const QkvKernelCtx *ctx)
{
  math_run(ctx, MATH_SQRT, 0);
}

static void
square_forward(const QkvKernelCtx *ctx)
{
  math_run(ctx, MATH_SQUARE, 0);
}

static void
pow_forward(const QkvKernelCtx *ctx)
{
  math_run(ctx, MATH_POW, (float)qkv_attrs_get_float(ctx->attrs, "exponent"));
}

static gboolean
unary_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static const QkvAttrSpec pow_attrs[] = {
    {.name = "exponent", .type = QKV_ATTR_FLOAT, .required = TRUE, .doc = "p in x^p"},
};

static gboolean
pow_shape(QkvShapeCtx *ctx, GError **error)
{
  double p = qkv_attrs_get_float(ctx->attrs, "exponent");
  /* Finite in f32, the precision the kernel uses. */
  if (!isfinite((float)p))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "exponent must be a finite f32 value, got %g", p);
  return unary_shape(ctx, error);
}

/* abs' = sign(x): 0 at 0, as PyTorch's. */
static gboolean
abs_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *s = qkv_sign(g->inputs[0], error);
  g->in_grads[0] = s ? qkv_mul(g->out_grads[0], s, error) : NULL;
  return g->in_grads[0] != NULL;
}

static gboolean
sign_grad(QkvGradCtx *g, GError **error)
{
  return TRUE;
}

/* sqrt' = 1 / (2 y), from the output. */
static gboolean
sqrt_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *q = qkv_div(g->out_grads[0], g->outputs[0], error);
  g->in_grads[0] = q ? qkv_scale(q, 0.5, error) : NULL;
  return g->in_grads[0] != NULL;
}

static gboolean
square_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *t = qkv_mul(g->out_grads[0], g->inputs[0], error);
  g->in_grads[0] = t ? qkv_scale(t, 2.0, error) : NULL;
  return g->in_grads[0] != NULL;
}

static gboolean
pow_grad(QkvGradCtx *g, GError **error)
{
  /* The exponent the kernel used: rounded to f32, as PyTorch rounds a
   * scalar exponent for an f32 tensor. */
  double p = (float)qkv_attrs_get_float(g->attrs, "exponent");
  if (p == 0.0)
    return TRUE;
  if (p == 1.0) {
    g->in_grads[0] = g->out_grads[0];
    return TRUE;
  }
  QkvValue *t = qkv_pow(g->inputs[0], p - 1.0, error);
  t = t ? qkv_scale(t, p, error) : NULL;
  g->in_grads[0] = t ? qkv_mul(g->out_grads[0], t, error) : NULL;
  return g->in_grads[0] != NULL;
}

#define MATH_DEF(NAME, DOC)                                                                        \
  {                                                                                                \
    QKV_OP_DEF_INIT, .name = #NAME, .doc = DOC, .min_inputs = 1, .max_inputs = 1,                  \
                     .input_names = x_input, .output_names = y_output, .flags = QKV_OP_INPLACE,    \
                     .shape = unary_shape, .forward = NAME##_forward, .gradient = NAME##_grad,     \
  }

static const QkvOpDef math_ops[] = {
    MATH_DEF(abs, "|x|; gradient sign(x) (0 at 0)"),
    MATH_DEF(sign, "-1, 0 or 1 by the sign of x (NaN stays NaN); no gradient"),
    MATH_DEF(sqrt, "square root of x (NaN below 0)"),
    MATH_DEF(square, "x · x"),
    {
        QKV_OP_DEF_INIT,
        .name = "pow",
        .doc = "x to the power exponent (a scalar); gradient exponent · x^(exponent - 1), 0 for "
               "exponent 0",
        .min_inputs = 1,
        .max_inputs = 1,
        .input_names = x_input,
        .output_names = y_output,
        .attrs = pow_attrs,
        .n_attrs = G_N_ELEMENTS(pow_attrs),
        .flags = QKV_OP_INPLACE,
        .shape = pow_shape,
        .forward = pow_forward,
        .gradient = pow_grad,
    },
};

void
qkv_register_ops_math(void)
{
  for (gsize i = 0; i < G_N_ELEMENTS(math_ops); i++)
    qkv_register_builtin(&math_ops[i]);
}

/* ---- typed functions ---------------------------------------------------- */

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */
static QkvValue *
unary_call(const gchar *op_name, QkvValue *x, GVariant *attrs, GError **error)
{
  if (x == NULL)
    return NULL;
  return qkv_op_call(op_name, &x, 1, attrs, error);
}

QkvValue *
qkv_abs(QkvValue *x, GError **error)
{
  return unary_call("abs", x, NULL, error);
}

QkvValue *
qkv_sign(QkvValue *x, GError **error)
{
  return unary_call("sign", x, NULL, error);
}

QkvValue *
qkv_sqrt(QkvValue *x, GError **error)
{
  return unary_call("sqrt", x, NULL, error);
}

QkvValue *
qkv_square(QkvValue *x, GError **error)
{
  return unary_call("square", x, NULL, error);
}

QkvValue *
qkv_pow(QkvValue *x, double exponent, GError **error)
{
  if (x == NULL)
    return NULL; /* before building attrs that nothing would free */
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "exponent", g_variant_new_double(exponent));
  return unary_call("pow", x, g_variant_builder_end(&attrs), error);
}
