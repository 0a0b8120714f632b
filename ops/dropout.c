/* dropout.c: "dropout" and "dropout_backward".
 *
 * In a plan compiled for training, each element is zeroed with probability p
 * and the others are scaled by 1/(1-p) (inverted dropout, as nn.Dropout).
 * The draw for element i is qkv_random_uniform(key(seed, step, node), i), so
 * a mask is reproducible from (seed, step) and changes from step to step.
 * The mask (0 or 1/(1-p)) is output 1, which the backward multiplies by; in
 * evaluation the op is the identity and the mask is all ones. With p = 0 the
 * op has a single output.
 */
#include "attention-common.h"
#include "error-private.h"

/* Elements per parallel chunk. */
#define DROPOUT_CHUNK 4096

static gboolean
dropout_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (!qkv_attn_check_dropout(ctx, "p", error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  if (qkv_attrs_get_float(ctx->attrs, "p") > 0.0) {
    ctx->n_outputs = 2;
    ctx->out_shapes[1] = ctx->in_shapes[0];
  }
  return TRUE;
}

typedef struct {
  const QkvKernelCtx *ctx;
  double p;
  const float *x;
  float *y, *mask;
  gint64 n;
} DropoutJob;

static void
dropout_chunks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const DropoutJob *d = user_data;
  for (gint64 c = begin; c < end; c++) {
    gint64 first = c * DROPOUT_CHUNK, len = MIN(DROPOUT_CHUNK, d->n - first);
    qkv_dropout_fill_mask(d->ctx, d->p, d->mask + first, first, len);
    for (gint64 j = first; j < first + len; j++)
      d->y[j] = d->x[j] * d->mask[j];
  }
}

static void
dropout_forward(const QkvKernelCtx *ctx)
{
  double p = qkv_attrs_get_float(ctx->attrs, "p");
  gint64 n = qkv_shape_numel(&ctx->in[0].shape);
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  float *mask = ctx->n_outputs > 1 ? ctx->out[1].data : NULL;
  if (mask == NULL || !qkv_dropout_active(ctx, p)) {
    if (y != x)
      memcpy(y, x, (gsize)n * sizeof(float));
    if (mask != NULL)
      qkv_dropout_fill_mask(ctx, p, mask, 0, n);
    return;
  }
  DropoutJob job = {ctx, p, x, y, mask, n};
  /* the hash behind each draw is about ten units of work */
  qkv_parallel_for(qkv_kernel_threads(ctx, 10 * n), (n + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK,
                   dropout_chunks, &job);
}

static gboolean
dropout_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  if (g->n_outputs < 2) {
    g->in_grads[0] = g->out_grads[0];
    return TRUE;
  }
  QkvValue *inputs[] = {g->out_grads[0], g->outputs[1]};
  g->in_grads[0] = qkv_op_call("dropout_backward", inputs, 2, NULL, error);
  return g->in_grads[0] != NULL;
}

static gboolean
dropout_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy and mask must be f32, got %s and %s",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and mask must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
dropout_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 n = qkv_shape_numel(&ctx->in[0].shape);
  const float *dy = ctx->in[0].data, *mask = ctx->in[1].data;
  float *dx = ctx->out[0].data;
  qkv_mul_floats(ctx, dx, dy, mask, n);
}

const QkvOpDef qkv_ops_dropout[] = {
    QKV_OP(.name = "dropout",
           .doc = "training: zero each element with probability p, scale the rest by 1/(1-p); "
                  "evaluation: the identity. Output 1 (only when p > 0) is the mask, 0 or 1/(1-p) "
                  "(all ones in evaluation), saved for the backward; it carries no gradient.",
           QKV_INPUTS("x"), QKV_OUTPUTS("y", "mask"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("p", FLOAT, "probability of zeroing an element, in [0, 1)")),
           .flags = QKV_OP_INPLACE | QKV_OP_RANDOM, .shape = dropout_shape,
           .forward = dropout_forward, .gradient = dropout_grad),
    QKV_OP(.name = "dropout_backward", .doc = "dy · mask, with the mask that dropout saved",
           QKV_INPUTS("dy", "mask"), QKV_OUTPUTS("dx"), .flags = QKV_OP_INPLACE,
           .shape = dropout_backward_shape, .forward = dropout_backward_forward),
    QKV_OPS_END,
};

QkvValue *
qkv_dropout(QkvValue *x, double p, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("dropout", error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "p", g_variant_new_double(p));
  return qkv_op_call("dropout", &x, 1, g_variant_builder_end(&attrs), error);
}
