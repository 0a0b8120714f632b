/* good.c: a minimal valid plugin, built twice under different file names
 * with the same plugin name (GOOD_OP names its one op). */
#include <qkv/qkv.h>

static gboolean
good_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

/* y = x + 1 */
static void
good_forward(const QkvKernelCtx *ctx)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  for (gint64 i = 0; i < qkv_shape_numel(&ctx->out[0].shape); i++)
    y[i] = x[i] + 1.0f;
}

static gboolean
good_gradient(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = g->out_grads[0];
  return TRUE;
}

static gboolean
register_good(GError **error)
{
  static const QkvOpDef def = {
      QKV_OP_DEF_INIT, .name = GOOD_OP,     .doc = "x + 1",          .min_inputs = 1,
      .max_inputs = 1, .shape = good_shape, .forward = good_forward, .gradient = good_gradient,
  };
  return qkv_op_register(&def, error);
}

QKV_PLUGIN_DEFINE("test-good", "1.0", "MIT", "one op: x + 1", register_good);
