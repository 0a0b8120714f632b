/* activations.c: a qkv plugin whose ops have fused forward kernels but no
 * gradient rules: each offers a decomposition into existing ops instead, and
 * autodiff differentiates through that.
 *
 *   "softplus"  log(1 + exp(x))        = relu(x) + log(1 + exp(x − 2·relu(x)))
 *   "swish"     x · sigmoid(x) (SiLU)  = mul(x, sigmoid(x))
 *   "mish"      x · tanh(softplus(x))  = mul(x, tanh(softplus(x))), through
 *                                        the plugin's own softplus, which
 *                                        decomposes in turn
 *
 * (x − 2·relu(x) is −|x|, written so that even at x = 0 the gradient is
 * right: relu's gradient there is 0, and the two terms then give ½.)
 */
#include <qkv/qkv.h>

#include <math.h>

#define ACT_BLOCK 256

static const gchar *const act_inputs[] = {"x", NULL};
static const gchar *const act_outputs[] = {"y", NULL};

static gboolean
act_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

typedef enum { ACT_SOFTPLUS, ACT_SWISH, ACT_MISH } ActKind;

typedef struct {
  const QkvKernelCtx *ctx;
  ActKind kind;
} ActJob;

/* Block by block from a stack buffer, reading x before writing y, so the
 * kernels can run in place. */
static void
act_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const ActJob *job = data;
  const float *x = job->ctx->in[0].data;
  float *y = job->ctx->out[0].data;
  float e[ACT_BLOCK];
  for (gint64 start = begin; start < end; start += ACT_BLOCK) {
    gint64 len = MIN(ACT_BLOCK, end - start);
    /* exp(−|x|) never overflows. */
    for (gint64 k = 0; k < len; k++)
      e[k] = -fabsf(x[start + k]);
    qkv_vec_exp(e, e, (gsize)len);
    if (job->kind == ACT_SWISH) {
      for (gint64 k = 0; k < len; k++) {
        float v = x[start + k];
        float sigmoid = (v >= 0.0f ? 1.0f : e[k]) / (1.0f + e[k]);
        y[start + k] = v * sigmoid;
      }
      continue;
    }
    for (gint64 k = 0; k < len; k++) {
      float v = x[start + k];
      e[k] = (v > 0.0f ? v : 0.0f) + log1pf(e[k]); /* softplus */
    }
    if (job->kind == ACT_SOFTPLUS) {
      for (gint64 k = 0; k < len; k++)
        y[start + k] = e[k];
      continue;
    }
    qkv_vec_tanh(e, e, (gsize)len);
    for (gint64 k = 0; k < len; k++)
      y[start + k] = x[start + k] * e[k];
  }
}

static void
act_run(const QkvKernelCtx *ctx, ActKind kind)
{
  ActJob job = {.ctx = ctx, .kind = kind};
  qkv_kernel_parallel_for(ctx, qkv_shape_numel(&ctx->out[0].shape), act_range, &job);
}

static void
softplus_forward(const QkvKernelCtx *ctx)
{
  act_run(ctx, ACT_SOFTPLUS);
}

static void
swish_forward(const QkvKernelCtx *ctx)
{
  act_run(ctx, ACT_SWISH);
}

static void
mish_forward(const QkvKernelCtx *ctx)
{
  act_run(ctx, ACT_MISH);
}

static gboolean
softplus_decompose(QkvDecomposeCtx *d, GError **error)
{
  QkvValue *x = d->inputs[0];
  QkvValue *one = qkv_graph_scalar(d->graph, 1.0f);
  QkvValue *r, *t;
  if ((r = qkv_relu(x, error)) == NULL || (t = qkv_scale(r, -2.0, error)) == NULL ||
      (t = qkv_add(x, t, error)) == NULL || (t = qkv_exp(t, error)) == NULL ||
      (t = qkv_add(t, one, error)) == NULL || (t = qkv_log(t, error)) == NULL)
    return FALSE;
  d->outputs[0] = qkv_add(r, t, error);
  return d->outputs[0] != NULL;
}

static gboolean
swish_decompose(QkvDecomposeCtx *d, GError **error)
{
  QkvValue *s = qkv_sigmoid(d->inputs[0], error);
  d->outputs[0] = s ? qkv_mul(d->inputs[0], s, error) : NULL;
  return d->outputs[0] != NULL;
}

static gboolean
mish_decompose(QkvDecomposeCtx *d, GError **error)
{
  QkvValue *sp = qkv_graph_op(d->graph, "softplus", d->inputs, 1, NULL, error);
  QkvValue *t = sp ? qkv_tanh(sp, error) : NULL;
  d->outputs[0] = t ? qkv_mul(d->inputs[0], t, error) : NULL;
  return d->outputs[0] != NULL;
}

#define ACT_DEF(NAME, DOC)                                                                         \
  {                                                                                                \
    QKV_OP_DEF_INIT, .name = #NAME, .doc = DOC, .min_inputs = 1, .max_inputs = 1,                  \
                     .input_names = act_inputs, .output_names = act_outputs,                       \
                     .flags = QKV_OP_INPLACE, .shape = act_shape, .forward = NAME##_forward,       \
                     .decompose = NAME##_decompose,                                                \
  }

static const QkvOpDef activation_ops[] = {
    ACT_DEF(softplus, "log(1 + exp(x))"),
    ACT_DEF(swish, "x · sigmoid(x), also called SiLU"),
    ACT_DEF(mish, "x · tanh(softplus(x))"),
};

static gboolean
register_activations(GError **error)
{
  for (gsize i = 0; i < G_N_ELEMENTS(activation_ops); i++)
    if (!qkv_op_register(&activation_ops[i], error))
      return FALSE;
  return TRUE;
}

QKV_PLUGIN_DEFINE("activations", "1.0.0", "MIT",
                  "softplus, swish and mish, differentiated through their decompositions",
                  register_activations);
