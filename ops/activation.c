/* activation.c: "gelu" and "silu", the activations of today's Transformers,
 * with their fused backward ops "gelu_backward" and "silu_backward".
 *
 *   gelu(x) = x · Φ(x) = ½ x (1 + erf(x / √2))          approximate = "none"
 *   gelu(x) ≈ ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))   approximate = "tanh"
 *   silu(x) = x · sigmoid(x)
 *
 * as torch.nn.GELU(approximate=…) and torch.nn.SiLU, written in PyTorch's
 * order of operations. The backward ops read x (not y: neither function is
 * invertible), and have gradient rules of their own, so a gradient of a
 * gradient works as it does for relu, sigmoid and tanh.
 *
 * The kernels run over blocks of ACT_BLOCK elements: erf, tanh and exp go
 * through SLEEF a block at a time (qkv_vec_erf and friends) from stack
 * buffers, and the rest is plain loops the compiler vectorises. Each block
 * reads x (and dy) before it writes the output, so the ops run in place.
 */
#include "ops-common.h"

#include <math.h>
#include "error-private.h"

/* Elements per block: a multiple of 16 floats, so that threads, which get
 * whole blocks, never write to the same cache line. */
#define ACT_BLOCK 256

#define GELU_SQRT1_2 0.70710678118654752440f   /* 1/√2 */
#define GELU_PDF_SCALE 0.39894228040143267794f /* 1/√(2π) */
#define GELU_TANH_BETA 0.79788456080286535588f /* √(2/π) */
#define GELU_TANH_KAPPA 0.044715f

typedef enum {
  GELU_EXACT,
  GELU_TANH,
} GeluForm;

/* The form the attribute names; FALSE for any other string. */
static gboolean
gelu_form(const QkvAttrs *attrs, GeluForm *form)
{
  const gchar *approximate = qkv_attrs_get_string(attrs, "approximate");
  if (g_str_equal(approximate, "none"))
    *form = GELU_EXACT;
  else if (g_str_equal(approximate, "tanh"))
    *form = GELU_TANH;
  else
    return FALSE;
  return TRUE;
}

/* ---- shapes --------------------------------------------------------------- */

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
unary_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!f32_inputs(ctx, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

/* (dy, x) → dx of x's shape. */
static gboolean
backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!f32_inputs(ctx, error))
    return FALSE;
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and x must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[1];
  return TRUE;
}

static gboolean
check_gelu_form(QkvShapeCtx *ctx, GError **error)
{
  GeluForm form;
  if (!gelu_form(ctx->attrs, &form))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "approximate is '%s', it must be 'none' or 'tanh'",
                           qkv_attrs_get_string(ctx->attrs, "approximate"));
  return TRUE;
}

static gboolean
gelu_shape(QkvShapeCtx *ctx, GError **error)
{
  return check_gelu_form(ctx, error) && unary_shape(ctx, error);
}

static gboolean
gelu_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  return check_gelu_form(ctx, error) && backward_shape(ctx, error);
}

/* ---- kernels -------------------------------------------------------------- */

/* One block of len ≥ 1 elements of a kernel, with two scratch buffers of
 * ACT_BLOCK floats: dy is NULL for a forward op. */
typedef void (*ActBlockFunc)(const float *x, const float *dy, float *out, gint64 len, float *t,
                             float *u);

typedef struct {
  ActBlockFunc block;
  const float *x, *dy;
  float *out;
  gint64 n;
} ActJob;

static void
act_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ActJob *j = user_data;
  float t[ACT_BLOCK], u[ACT_BLOCK];
  for (gint64 b = begin; b < end; b++) {
    gint64 start = b * ACT_BLOCK, len = MIN(ACT_BLOCK, j->n - start);
    j->block(j->x + start, j->dy != NULL ? j->dy + start : NULL, j->out + start, len, t, u);
  }
}

/* A forward kernel (input x) or a backward one (inputs dy, x). */
static void
act_run(const QkvKernelCtx *ctx, ActBlockFunc block, gboolean backward)
{
  gint64 n = qkv_shape_numel(&ctx->out[0].shape);
  ActJob job = {
      .block = block,
      .x = ctx->in[backward ? 1 : 0].data,
      .dy = backward ? ctx->in[0].data : NULL,
      .out = ctx->out[0].data,
      .n = n,
  };
  /* a SLEEF call and some ten simple operations per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, 20 * n), (n + ACT_BLOCK - 1) / ACT_BLOCK, act_blocks,
                   &job);
}

static void
gelu_exact_block(const float *x, const float *dy, float *y, gint64 len, float *t, float *u)
{
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    t[k] = x[k] * GELU_SQRT1_2;
  qkv_vec_erf(t, t, (gsize)len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    y[k] = x[k] * 0.5f * (1.0f + t[k]);
}

/* t = tanh(√(2/π) (x + 0.044715 x³)) for the block. */
static void
gelu_tanh_inner(const float *x, float *t, gint64 len)
{
#pragma omp simd
  for (gint64 k = 0; k < len; k++) {
    float v = x[k];
    t[k] = GELU_TANH_BETA * (v + GELU_TANH_KAPPA * (v * v * v));
  }
  qkv_vec_tanh(t, t, (gsize)len);
}

static void
gelu_tanh_block(const float *x, const float *dy, float *y, gint64 len, float *t, float *u)
{
  gelu_tanh_inner(x, t, len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    y[k] = x[k] * 0.5f * (1.0f + t[k]);
}

/* gelu'(x) = Φ(x) + x φ(x), φ(x) = exp(-x²/2) / √(2π). */
static void
gelu_exact_backward_block(const float *x, const float *dy, float *dx, gint64 len, float *cdf,
                          float *pdf)
{
#pragma omp simd
  for (gint64 k = 0; k < len; k++) {
    cdf[k] = x[k] * GELU_SQRT1_2;
    pdf[k] = x[k] * x[k] * -0.5f;
  }
  qkv_vec_erf(cdf, cdf, (gsize)len);
  qkv_vec_exp(pdf, pdf, (gsize)len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++) {
    float phi = 0.5f * (1.0f + cdf[k]);
    dx[k] = dy[k] * (phi + x[k] * (GELU_PDF_SCALE * pdf[k]));
  }
}

/* With u = β (x + κ x³) and t = tanh(u):
 * gelu'(x) = ½ (1 + t) + ½ x (1 − t²) β (1 + 3κ x²). */
static void
gelu_tanh_backward_block(const float *x, const float *dy, float *dx, gint64 len, float *t, float *u)
{
  gelu_tanh_inner(x, t, len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++) {
    float v = x[k], tk = t[k];
    float left = 0.5f * v, right = 1.0f + tk;
    float left_derivative = 0.5f * right;
    float right_derivative = left * (1.0f - tk * tk);
    float inner_derivative = GELU_TANH_BETA * (1.0f + 3.0f * GELU_TANH_KAPPA * (v * v));
    dx[k] = dy[k] * (left_derivative + right_derivative * inner_derivative);
  }
}

/* sigmoid(x) for the block into s: exp(−|x|) never overflows, and e/(1 + e)
 * keeps its relative precision far into the negative tail. */
static void
sigmoid_block(const float *x, float *s, gint64 len)
{
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    s[k] = -fabsf(x[k]);
  qkv_vec_exp(s, s, (gsize)len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++) {
    /* a select of operands, not of results, so that the loop vectorises */
    float num = x[k] >= 0.0f ? 1.0f : s[k];
    s[k] = num / (1.0f + s[k]);
  }
}

static void
silu_block(const float *x, const float *dy, float *y, gint64 len, float *s, float *u)
{
  sigmoid_block(x, s, len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    y[k] = x[k] * s[k];
}

/* silu'(x) = s (1 + x (1 − s)), s = sigmoid(x). */
static void
silu_backward_block(const float *x, const float *dy, float *dx, gint64 len, float *s, float *u)
{
  sigmoid_block(x, s, len);
#pragma omp simd
  for (gint64 k = 0; k < len; k++)
    dx[k] = dy[k] * s[k] * (1.0f + x[k] * (1.0f - s[k]));
}

static void
gelu_forward(const QkvKernelCtx *ctx)
{
  GeluForm form = GELU_EXACT;
  gelu_form(ctx->attrs, &form);
  act_run(ctx, form == GELU_TANH ? gelu_tanh_block : gelu_exact_block, FALSE);
}

static void
gelu_backward_forward(const QkvKernelCtx *ctx)
{
  GeluForm form = GELU_EXACT;
  gelu_form(ctx->attrs, &form);
  act_run(ctx, form == GELU_TANH ? gelu_tanh_backward_block : gelu_exact_backward_block, TRUE);
}

static void
silu_forward(const QkvKernelCtx *ctx)
{
  act_run(ctx, silu_block, FALSE);
}

static void
silu_backward_forward(const QkvKernelCtx *ctx)
{
  act_run(ctx, silu_backward_block, TRUE);
}

/* ---- gradient rules -------------------------------------------------------- */

static gboolean
gelu_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_gelu_backward(g->out_grads[0], g->inputs[0],
                                     qkv_attrs_get_string(g->attrs, "approximate"), error);
  return g->in_grads[0] != NULL;
}

static gboolean
silu_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_silu_backward(g->out_grads[0], g->inputs[0], error);
  return g->in_grads[0] != NULL;
}

/* a · x + c, elementwise, with c a scalar constant. */
static QkvValue *
affine(QkvValue *x, double a, float c, GError **error)
{
  QkvValue *t = qkv_scale(x, a, error);
  return t != NULL ? qkv_add(t, qkv_graph_scalar(qkv_value_graph(x), c), error) : NULL;
}

/* gelu''(x) from built-in ops. Exact: φ(x) (2 − x²). Tanh form, with u, t as
 * in the kernel and u' = β (1 + 3κ x²):
 *   (1 − t²) (u' (1 − x t u') + 3βκ x²). */
static QkvValue *
gelu_second_derivative(QkvValue *x, GeluForm form, GError **error)
{
  QkvValue *x2 = qkv_mul(x, x, error);
  if (form == GELU_EXACT) {
    QkvValue *phi = qkv_scale(qkv_exp(qkv_scale(x2, -0.5, error), error), GELU_PDF_SCALE, error);
    return qkv_mul(phi, affine(x2, -1.0, 2.0f, error), error);
  }
  QkvValue *u =
      qkv_scale(qkv_add(x, qkv_mul(x2, qkv_scale(x, GELU_TANH_KAPPA, error), error), error),
                GELU_TANH_BETA, error);
  QkvValue *t = qkv_tanh(u, error);
  QkvValue *sech2 = affine(qkv_mul(t, t, error), -1.0, 1.0f, error);
  QkvValue *du = affine(x2, 3.0 * GELU_TANH_BETA * GELU_TANH_KAPPA, GELU_TANH_BETA, error);
  QkvValue *xtdu = qkv_mul(qkv_mul(x, t, error), du, error);
  QkvValue *inner = qkv_mul(du, affine(xtdu, -1.0, 1.0f, error), error);
  inner = qkv_add(inner, qkv_scale(x2, 3.0 * GELU_TANH_BETA * GELU_TANH_KAPPA, error), error);
  return qkv_mul(sech2, inner, error);
}

/* silu''(x) = s (1 − s) (2 + x (1 − 2s)), s = sigmoid(x). */
static QkvValue *
silu_second_derivative(QkvValue *x, GError **error)
{
  QkvValue *s = qkv_sigmoid(x, error);
  QkvValue *ds = qkv_mul(s, affine(s, -1.0, 1.0f, error), error);
  QkvValue *r = affine(qkv_mul(x, affine(s, -2.0, 1.0f, error), error), 1.0, 2.0f, error);
  return qkv_mul(ds, r, error);
}

/* Both backward ops are linear in dy: d/d(dy) is the op applied to the
 * incoming gradient, and d/dx is ddx · dy · f''(x). */
static gboolean
second_order(QkvGradCtx *g, QkvValue *ddy, QkvValue *second, GError **error)
{
  if (g->needs_grad[0] && (g->in_grads[0] = ddy) == NULL)
    return FALSE;
  if (g->needs_grad[1]) {
    QkvValue *t = qkv_mul(g->out_grads[0], g->inputs[0], error);
    if ((g->in_grads[1] = qkv_mul(t, second, error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
gelu_backward_grad(QkvGradCtx *g, GError **error)
{
  const gchar *approximate = qkv_attrs_get_string(g->attrs, "approximate");
  GeluForm form = GELU_EXACT;
  gelu_form(g->attrs, &form);
  QkvValue *ddy = g->needs_grad[0]
                      ? qkv_gelu_backward(g->out_grads[0], g->inputs[1], approximate, error)
                      : NULL;
  if (g->needs_grad[0] && ddy == NULL)
    return FALSE;
  QkvValue *second = g->needs_grad[1] ? gelu_second_derivative(g->inputs[1], form, error) : NULL;
  return second_order(g, ddy, second, error);
}

static gboolean
silu_backward_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *ddy = g->needs_grad[0] ? qkv_silu_backward(g->out_grads[0], g->inputs[1], error) : NULL;
  if (g->needs_grad[0] && ddy == NULL)
    return FALSE;
  QkvValue *second = g->needs_grad[1] ? silu_second_derivative(g->inputs[1], error) : NULL;
  return second_order(g, ddy, second, error);
}

/* ---- registration ---------------------------------------------------------- */

#define GELU_APPROXIMATE_ATTR                                                                      \
  QKV_ATTRS(QKV_STRING_ATTR("approximate", "none",                                                 \
                            "'none': the exact x · Φ(x) through erf; 'tanh': the tanh "          \
                            "approximation (PyTorch's approximate=)"))

const QkvOpDef qkv_ops_activation[] = {
    QKV_OP(.name = "gelu",
           .doc = "x · Φ(x) = ½ x (1 + erf(x / √2)), or with approximate 'tanh' "
                  "½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), as torch.nn.GELU",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"), GELU_APPROXIMATE_ATTR, .flags = QKV_OP_INPLACE,
           .shape = gelu_shape, .forward = gelu_forward, .gradient = gelu_grad),
    QKV_OP(.name = "gelu_backward", .doc = "dy · gelu'(x), for gelu of the same approximate",
           QKV_INPUTS("dy", "x"), QKV_OUTPUTS("dx"), GELU_APPROXIMATE_ATTR, .flags = QKV_OP_INPLACE,
           .shape = gelu_backward_shape, .forward = gelu_backward_forward,
           .gradient = gelu_backward_grad),
    QKV_OP(.name = "silu", .doc = "x · sigmoid(x) (SiLU, swish), as torch.nn.SiLU", QKV_INPUTS("x"),
           QKV_OUTPUTS("y"), .flags = QKV_OP_INPLACE, .shape = unary_shape, .forward = silu_forward,
           .gradient = silu_grad),
    QKV_OP(.name = "silu_backward", .doc = "dy · s (1 + x (1 − s)), s = sigmoid(x)",
           QKV_INPUTS("dy", "x"), QKV_OUTPUTS("dx"), .flags = QKV_OP_INPLACE,
           .shape = backward_shape, .forward = silu_backward_forward,
           .gradient = silu_backward_grad),
    QKV_OPS_END,
};

/* ---- typed functions ------------------------------------------------------- */

static GVariant *
approximate_attrs(const gchar *approximate)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "approximate",
                        g_variant_new_string(approximate != NULL ? approximate : "none"));
  return g_variant_builder_end(&attrs);
}

QkvValue *
qkv_gelu(QkvValue *x, const gchar *approximate, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("gelu", error, x);
  return qkv_op_call("gelu", &x, 1, approximate_attrs(approximate), error);
}

QkvValue *
qkv_gelu_backward(QkvValue *dy, QkvValue *x, const gchar *approximate, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("gelu_backward", error, dy, x);
  QkvValue *inputs[] = {dy, x};
  return qkv_op_call("gelu_backward", inputs, 2, approximate_attrs(approximate), error);
}

QkvValue *
qkv_silu(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("silu", error, x);
  return qkv_op_call("silu", &x, 1, NULL, error);
}

QkvValue *
qkv_silu_backward(QkvValue *dy, QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("silu_backward", error, dy, x);
  QkvValue *inputs[] = {dy, x};
  return qkv_op_call("silu_backward", inputs, 2, NULL, error);
}
