/* math.c: elementwise "abs", "sign", "sqrt", "square", "pow" (by a scalar
 * exponent) and "pow_tensor" (by an exponent tensor that broadcasts against
 * x, as torch.pow(x, y)), with "pow_tensor_backward".
 *
 * Gradients follow PyTorch at the awkward points: abs has gradient
 * sign(x), 0 at x = 0; sqrt's is dy / (2 sqrt(x)), +inf at 0 and NaN below;
 * pow's is p·x^(p-1)·dy, and exactly 0 for p = 0 (even at x = 0, where the
 * formula would give 0·inf). sign is flat almost everywhere: no gradient.
 */
#include "broadcast-common.h"

#include <float.h>
#include <math.h>
#include "error-private.h"

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

/* Integer exponents up to this size in magnitude are computed by
 * multiplications (pow_int_range); the rest go to powf. */
#define POW_INT_MAX 16
#define POW_BLOCK 256

static gboolean
pow_is_small_integer(float p)
{
  return p == nearbyintf(p) && fabsf(p) <= POW_INT_MAX;
}

/* Whether x^|p| came out of its multiplications as anything but a normal
 * float (0, subnormal or infinite) for a finite nonzero x (a NaN x gives a
 * NaN power, which is right). Bitwise, without branches, so that the loop
 * over a block vectorises. */
static inline gint
pow_power_out_of_range(float power, float x)
{
  float a = fabsf(power), v = fabsf(x);
  return ((a < FLT_MIN) | (a > FLT_MAX)) & (v > 0.0f) & (v <= FLT_MAX);
}

/* y = x^p for an integer p, 2 ≤ |p| ≤ POW_INT_MAX, by binary exponentiation
 * over blocks: the squarings x, x², x⁴, … and the products of those the
 * bits of |p| pick are each one vectorised multiplication of the block, and
 * a negative p takes the reciprocal at the end. For p = 3 and p = -2 that is
 * x · x² and 1 / (x · x), PyTorch's own forms.
 *
 * Each product of two computed powers x^i (1 + ε_i) · x^j (1 + ε_j) rounds
 * once more, so ε_(i+j) ≤ ε_i + ε_j + u, and x^|p| is within (|p| − 1) u of
 * the exact value (relative, to first order; γ_(|p|−1) rigorously), the
 * reciprocal adding one u. That holds while every intermediate power is a
 * normal float: an element whose x^|p| underflows or overflows (while x is
 * finite and nonzero) goes to powf instead, which keeps tiny results exact
 * to an ulp and gives 1 / x^|p| below FLT_MIN its true value rather than 0.
 * Elements may run in place: a block reads x before it writes y. */
static void
pow_int_range(const float *x, float *y, gint64 begin, gint64 end, gint p)
{
  const guint n = (guint)ABS(p);
  float base[POW_BLOCK], acc[POW_BLOCK];
  for (gint64 start = begin; start < end; start += POW_BLOCK) {
    const gint64 len = MIN(POW_BLOCK, end - start);
    const float *xb = x + start;
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      base[k] = xb[k];
      acc[k] = 1.0f;
    }
    for (guint bits = n;;) {
      if (bits & 1u) {
#pragma omp simd
        for (gint64 k = 0; k < len; k++)
          acc[k] *= base[k];
      }
      bits >>= 1;
      if (bits == 0)
        break;
#pragma omp simd
      for (gint64 k = 0; k < len; k++)
        base[k] *= base[k];
    }
    gint out_of_range = 0;
#pragma omp simd reduction(| : out_of_range)
    for (gint64 k = 0; k < len; k++)
      out_of_range |= pow_power_out_of_range(acc[k], xb[k]);
    float *result = acc;
    if (p < 0) {
      result = base; /* done with the squarings */
#pragma omp simd
      for (gint64 k = 0; k < len; k++)
        result[k] = 1.0f / acc[k];
    }
    if (G_UNLIKELY(out_of_range)) {
      for (gint64 k = 0; k < len; k++)
        if (pow_power_out_of_range(acc[k], xb[k]))
          result[k] = powf(xb[k], (float)p);
    }
    memcpy(y + start, result, (gsize)len * sizeof(float));
  }
}

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
     * rounding each: x·x and sqrt are correctly rounded); other small
     * integers go to multiplications, the rest to powf, within an ulp or
     * so. */
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
    } else if (pow_is_small_integer(p)) {
      pow_int_range(x, y, begin, end, (gint)p);
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

/* ---- pow_tensor ---------------------------------------------------------- */

typedef struct {
  const float *x, *e, *dy;
  float *y, *dx, *de;
} PowJob;

static void
pow_tensor_row(gpointer data, gint64 out_off, const gint64 *in_off, const gint64 *in_step,
               gint64 len)
{
  const PowJob *j = data;
  const float *x = j->x + in_off[0], *e = j->e + in_off[1];
  float *y = j->y + out_off;
  for (gint64 k = 0; k < len; k++)
    y[k] = powf(x[k * in_step[0]], e[k * in_step[1]]);
}

static void
pow_tensor_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *ins[] = {&ctx->in[0].shape, &ctx->in[1].shape};
  QkvBcast b;
  qkv_bcast_init(&b, &ctx->out[0].shape, ins, 2);
  PowJob job = {.x = ctx->in[0].data, .e = ctx->in[1].data, .y = ctx->out[0].data};
  qkv_bcast_run(ctx, &b, pow_tensor_row, &job);
}

/* PyTorch's rules at the awkward points: d/dx = e·x^(e-1)·dy, exactly 0 where
 * e = 0; d/de = x^e·log(x)·dy, exactly 0 where x = 0 and e ≥ 0 (where the
 * formula gives 0·(-inf)). Elsewhere a negative x gives NaN for d/de. */
static void
pow_tensor_backward_row(gpointer data, gint64 out_off, const gint64 *in_off, const gint64 *in_step,
                        gint64 len)
{
  const PowJob *j = data;
  const float *dy = j->dy + in_off[0], *x = j->x + in_off[1], *e = j->e + in_off[2];
  float *dx = j->dx + out_off, *de = j->de + out_off;
  for (gint64 k = 0; k < len; k++) {
    float g = dy[k * in_step[0]], xv = x[k * in_step[1]], ev = e[k * in_step[2]];
    dx[k] = ev == 0.0f ? 0.0f : g * ev * powf(xv, ev - 1.0f);
    de[k] = (xv == 0.0f && ev >= 0.0f) ? 0.0f : g * powf(xv, ev) * logf(xv);
  }
}

static void
pow_tensor_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *ins[] = {&ctx->in[0].shape, &ctx->in[1].shape, &ctx->in[2].shape};
  QkvBcast b;
  qkv_bcast_init(&b, &ctx->out[0].shape, ins, 3);
  PowJob job = {.dy = ctx->in[0].data,
                .x = ctx->in[1].data,
                .e = ctx->in[2].data,
                .dx = ctx->out[0].data,
                .de = ctx->out[1].data};
  qkv_bcast_run(ctx, &b, pow_tensor_backward_row, &job);
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

static gboolean
pow_tensor_shape(QkvShapeCtx *ctx, GError **error)
{
  return f32_inputs(ctx, error) && qkv_bcast_shapes(ctx, 2, &ctx->out_shapes[0], error);
}

/* dx and dexponent come out in dy's (the broadcast) shape; the gradient rule
 * sums them down to x's and the exponent's. */
static gboolean
pow_tensor_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  QkvShape out;
  if (!f32_inputs(ctx, error) || !qkv_bcast_shapes(ctx, 3, &out, error))
    return FALSE;
  if (!qkv_shape_equal(&out, &ctx->in_shapes[0])) {
    g_autofree gchar *want = qkv_shape_to_string(&out);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy must have the broadcast shape of the inputs, %s", want);
  }
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = ctx->out_shapes[1] = out;
  return TRUE;
}

static gboolean
pow_tensor_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0], g->inputs[1]};
  QkvNode *node = qkv_graph_add_node(g->graph, "pow_tensor_backward", inputs, 3, NULL, error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < 2; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_grad_to_input(qkv_node_output(node, i), g->inputs[i], error);
  return (!g->needs_grad[0] || g->in_grads[0] != NULL) &&
         (!g->needs_grad[1] || g->in_grads[1] != NULL);
}

#define MATH_DEF(NAME, DOC)                                                                        \
  QKV_OP(.name = #NAME, .doc = DOC, QKV_INPUTS("x"), QKV_OUTPUTS("y"), .flags = QKV_OP_INPLACE,    \
         .shape = unary_shape, .forward = NAME##_forward, .gradient = NAME##_grad)

const QkvOpDef qkv_ops_math[] = {
    MATH_DEF(abs, "|x|; gradient sign(x) (0 at 0)"),
    MATH_DEF(sign, "-1, 0 or 1 by the sign of x (NaN stays NaN); no gradient"),
    MATH_DEF(sqrt, "square root of x (NaN below 0)"),
    MATH_DEF(square, "x · x"),
    QKV_OP(.name = "pow",
           .doc = "x to the power exponent (a scalar); gradient exponent · x^(exponent - 1), 0 for "
                  "exponent 0",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("exponent", FLOAT, "p in x^p")), .flags = QKV_OP_INPLACE,
           .shape = pow_shape, .forward = pow_forward, .gradient = pow_grad),
    QKV_OP(.name = "pow_tensor",
           .doc = "x to the power exponent elementwise, both f32 tensors broadcast together "
                  "(torch.pow(x, y)); gradients as PyTorch's, 0 where exponent is 0 (for x) or "
                  "where x is 0 and exponent ≥ 0 (for exponent)",
           QKV_INPUTS("x", "exponent"), QKV_OUTPUTS("y"), .shape = pow_tensor_shape,
           .forward = pow_tensor_forward, .gradient = pow_tensor_grad),
    QKV_OP(.name = "pow_tensor_backward",
           .doc = "d loss / d x and d loss / d exponent of pow_tensor, in dy's shape",
           QKV_INPUTS("dy", "x", "exponent"), QKV_OUTPUTS("dx", "dexponent"),
           .shape = pow_tensor_backward_shape, .forward = pow_tensor_backward_forward),
    QKV_OPS_END,
};

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
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("abs", x, NULL, error);
}

QkvValue *
qkv_sign(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("sign", x, NULL, error);
}

QkvValue *
qkv_sqrt(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("sqrt", x, NULL, error);
}

QkvValue *
qkv_square(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("square", x, NULL, error);
}

QkvValue *
qkv_pow(QkvValue *x, double exponent, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL; /* before building attrs that nothing would free */
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "exponent", g_variant_new_double(exponent));
  return unary_call("pow", x, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_pow_tensor(QkvValue *x, QkvValue *exponent, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("pow_tensor", error, x, exponent);
  QkvValue *inputs[] = {x, exponent};
  return qkv_op_call("pow_tensor", inputs, 2, NULL, error);
}
