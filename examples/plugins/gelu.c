/* gelu.c: a qkv plugin with the GELU activation (tanh form).
 *
 *   gelu(x) = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
 *
 * qkv has GELU built in ("gelu" with approximate = "tanh"); this plugin is
 * the worked example of a fused op pair. Its ops carry the prefix
 * "example.", as a plugin's ops should carry one of their own: registering
 * a name that is taken (a built-in's, or another plugin's) fails, and qkv
 * may gain built-ins under plain names.
 *
 * Two ops:
 *   "example.gelu"           x → y, with a gradient rule that adds one
 *                            example.gelu_backward node;
 *   "example.gelu_backward"  (dy, x) → dx = dy · gelu'(x), a fused kernel. It
 *                            has no gradient rule of its own but a
 *                            decomposition into built-in ops, so autodiff can
 *                            take a gradient of the gradient (second order)
 *                            through it.
 *
 * It uses only the installed headers, so it builds out of the source tree:
 *
 *   cc -O2 -shared -fPIC -o gelu.so gelu.c $(pkg-config --cflags --libs qkv)
 */
#include <qkv/qkv.h>

#include <math.h>

#define GELU_K 0.7978845608028654f /* √(2/π) */
#define GELU_C 0.044715f

/* Elements per block: tanh runs on a block in one qkv_vec_tanh() call from a
 * stack buffer, so the kernels can run in place (x is read before y is
 * written, block by block). */
#define GELU_BLOCK 256

static const gchar *const gelu_inputs[] = {"x", NULL};
static const gchar *const gelu_outputs[] = {"y", NULL};
static const gchar *const gelu_backward_inputs[] = {"dy", "x", NULL};
static const gchar *const gelu_backward_outputs[] = {"dx", NULL};

/* ------------------------------------------------------------------------- */
/* gelu                                                                      */
/* ------------------------------------------------------------------------- */

static gboolean
gelu_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
gelu_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const QkvKernelCtx *ctx = data;
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  float t[GELU_BLOCK];
  for (gint64 start = begin; start < end; start += GELU_BLOCK) {
    gint64 len = MIN(GELU_BLOCK, end - start);
    for (gint64 k = 0; k < len; k++) {
      float v = x[start + k];
      t[k] = GELU_K * (v + GELU_C * v * v * v);
    }
    qkv_vec_tanh(t, t, (gsize)len);
    for (gint64 k = 0; k < len; k++)
      y[start + k] = 0.5f * x[start + k] * (1.0f + t[k]);
  }
}

static void
gelu_forward(const QkvKernelCtx *ctx)
{
  qkv_kernel_parallel_for(ctx, qkv_shape_numel(&ctx->out[0].shape), gelu_range, (gpointer)ctx);
}

static gboolean
gelu_gradient(QkvGradCtx *g, GError **error)
{
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0]};
  g->in_grads[0] = qkv_graph_op(g->graph, "example.gelu_backward", inputs, 2, NULL, error);
  return g->in_grads[0] != NULL;
}

/* ------------------------------------------------------------------------- */
/* gelu_backward                                                             */
/* ------------------------------------------------------------------------- */

static gboolean
gelu_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy and x must be f32");
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and x must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

/* gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t²) · k (1 + 3c x²), t = tanh(k (x + c x³)). */
static void
gelu_backward_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const QkvKernelCtx *ctx = data;
  const float *dy = ctx->in[0].data, *x = ctx->in[1].data;
  float *dx = ctx->out[0].data;
  float t[GELU_BLOCK];
  for (gint64 start = begin; start < end; start += GELU_BLOCK) {
    gint64 len = MIN(GELU_BLOCK, end - start);
    for (gint64 k = 0; k < len; k++) {
      float v = x[start + k];
      t[k] = GELU_K * (v + GELU_C * v * v * v);
    }
    qkv_vec_tanh(t, t, (gsize)len);
    for (gint64 k = 0; k < len; k++) {
      float v = x[start + k], tk = t[k];
      float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
      float d = 0.5f * (1.0f + tk) + 0.5f * v * (1.0f - tk * tk) * du;
      dx[start + k] = dy[start + k] * d;
    }
  }
}

static void
gelu_backward_forward(const QkvKernelCtx *ctx)
{
  qkv_kernel_parallel_for(ctx, qkv_shape_numel(&ctx->out[0].shape), gelu_backward_range,
                          (gpointer)ctx);
}

/* The same formula from built-in ops, for autodiff to differentiate. */
static gboolean
gelu_backward_decompose(QkvDecomposeCtx *d, GError **error)
{
  QkvValue *dy = d->inputs[0], *x = d->inputs[1];
  QkvValue *one = qkv_graph_scalar(d->graph, 1.0f);
  QkvValue *x2, *u, *t, *a, *b, *du, *sum;
  if ((x2 = qkv_mul(x, x, error)) == NULL || (u = qkv_mul(x2, x, error)) == NULL ||
      (u = qkv_scale(u, GELU_C, error)) == NULL || (u = qkv_add(u, x, error)) == NULL ||
      (u = qkv_scale(u, GELU_K, error)) == NULL || (t = qkv_tanh(u, error)) == NULL)
    return FALSE;
  /* a = 0.5 (1 + t) */
  if ((a = qkv_add(t, one, error)) == NULL || (a = qkv_scale(a, 0.5, error)) == NULL)
    return FALSE;
  /* b = 0.5 x (1 - t²) · k (1 + 3c x²) */
  if ((b = qkv_mul(t, t, error)) == NULL || (b = qkv_sub(one, b, error)) == NULL ||
      (b = qkv_mul(b, x, error)) == NULL || (du = qkv_scale(x2, 3.0 * GELU_C, error)) == NULL ||
      (du = qkv_add(du, one, error)) == NULL || (b = qkv_mul(b, du, error)) == NULL ||
      (b = qkv_scale(b, 0.5 * GELU_K, error)) == NULL)
    return FALSE;
  if ((sum = qkv_add(a, b, error)) == NULL)
    return FALSE;
  d->outputs[0] = qkv_mul(dy, sum, error);
  return d->outputs[0] != NULL;
}

/* ------------------------------------------------------------------------- */
/* Registration                                                              */
/* ------------------------------------------------------------------------- */

static const QkvOpDef gelu_ops[] = {
    {
        QKV_OP_DEF_INIT,
        .name = "example.gelu",
        .doc = "0.5 · x · (1 + tanh(√(2/π) (x + 0.044715 x³))), the tanh form of GELU",
        .min_inputs = 1,
        .max_inputs = 1,
        .input_names = gelu_inputs,
        .output_names = gelu_outputs,
        .flags = QKV_OP_INPLACE,
        .shape = gelu_shape,
        .forward = gelu_forward,
        .gradient = gelu_gradient,
    },
    {
        QKV_OP_DEF_INIT,
        .name = "example.gelu_backward",
        .doc = "dy · gelu'(x)",
        .min_inputs = 2,
        .max_inputs = 2,
        .input_names = gelu_backward_inputs,
        .output_names = gelu_backward_outputs,
        .flags = QKV_OP_INPLACE,
        .shape = gelu_backward_shape,
        .forward = gelu_backward_forward,
        .decompose = gelu_backward_decompose,
    },
};

static gboolean
register_gelu(GError **error)
{
  for (gsize i = 0; i < G_N_ELEMENTS(gelu_ops); i++)
    if (!qkv_op_register(&gelu_ops[i], error))
      return FALSE;
  return TRUE;
}

QKV_PLUGIN_DEFINE("gelu", "1.0.0", "MIT", "GELU activation (tanh form) and its gradient",
                  register_gelu);
