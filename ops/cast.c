/* cast.c: "cast" between f32 and i32.
 *
 * f32 → i32 truncates toward zero, as C and PyTorch's .to(torch.int32) do.
 * Where C leaves the result undefined (NaN, and values beyond the i32
 * range), qkv defines it: NaN gives 0 and out-of-range values saturate to
 * the nearest i32 (PyTorch's result there depends on the CPU). i32 → f32
 * rounds to the nearest f32 above 2^24. A cast to the same dtype copies.
 *
 * Only the f32 → f32 copy passes a gradient; a cast to or from i32 has none
 * (i32 values never take gradients).
 */
#include "ops-common.h"
#include "error-private.h"

/* The dtype an attribute string names; FALSE if none. */
static gboolean
parse_dtype(const gchar *name, QkvDType *dtype)
{
  if (g_strcmp0(name, "f32") == 0)
    *dtype = QKV_F32;
  else if (g_strcmp0(name, "i32") == 0)
    *dtype = QKV_I32;
  else
    return FALSE;
  return TRUE;
}

static gboolean
cast_shape(QkvShapeCtx *ctx, GError **error)
{
  const gchar *name = qkv_attrs_get_string(ctx->attrs, "dtype");
  QkvDType to;
  if (!parse_dtype(name, &to))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "dtype '%s' is not one cast knows (\"f32\" or \"i32\")", name);
  if (ctx->in_dtypes[0] != QKV_F32 && ctx->in_dtypes[0] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32 or i32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  ctx->out_shapes[0] = ctx->in_shapes[0];
  ctx->out_dtypes[0] = to;
  return TRUE;
}

typedef struct {
  gconstpointer x;
  gpointer y;
  QkvDType from, to;
} CastJob;

/* Both dtypes are 4 bytes and element i is read before it is written, so
 * the cast can run in place. */
static void
cast_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const CastJob *j = user_data;
  if (j->from == j->to) {
    if (j->y != j->x)
      memcpy((guint32 *)j->y + begin, (const guint32 *)j->x + begin,
             (gsize)(end - begin) * sizeof(guint32));
  } else if (j->to == QKV_F32) {
    const gint32 *x = j->x;
    float *y = j->y;
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      y[i] = (float)x[i];
  } else {
    const float *x = j->x;
    gint32 *y = j->y;
    /* 2^31 is exact in f32; every f32 below it truncates into range. */
    const float limit = 2147483648.0f;
#pragma omp simd
    for (gint64 i = begin; i < end; i++) {
      float v = x[i];
      v = v != v ? 0.0f : v;
      y[i] = v >= limit ? G_MAXINT32 : (v <= -limit ? G_MININT32 : (gint32)v);
    }
  }
}

static void
cast_forward(const QkvKernelCtx *ctx)
{
  CastJob job = {ctx->in[0].data, ctx->out[0].data, ctx->in[0].dtype, ctx->out[0].dtype};
  gint64 n = qkv_shape_numel(&ctx->out[0].shape);
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, cast_range, &job);
}

static gboolean
cast_grad(QkvGradCtx *g, GError **error)
{
  /* Only an f32 → f32 cast has an f32 output a gradient reaches and an f32
   * input to give it to; it is the identity. */
  if (g->out_grads[0] != NULL && g->needs_grad[0] && qkv_value_dtype(g->outputs[0]) == QKV_F32)
    g->in_grads[0] = g->out_grads[0];
  return TRUE;
}

const QkvOpDef qkv_ops_cast[] = {
    QKV_OP(.name = "cast",
           .doc = "x converted to dtype (\"f32\" or \"i32\"); f32 → i32 truncates toward zero, NaN "
                  "gives 0 and values beyond i32 saturate",
           QKV_INPUTS("x"), QKV_OUTPUTS("y"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("dtype", STRING, "\"f32\" or \"i32\"")),
           .flags = QKV_OP_INPLACE, .shape = cast_shape, .forward = cast_forward,
           .gradient = cast_grad),
    QKV_OPS_END,
};

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */
QkvValue *
qkv_cast(QkvValue *x, QkvDType dtype, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "dtype", g_variant_new_string(qkv_dtype_name(dtype)));
  return qkv_op_call("cast", &x, 1, g_variant_builder_end(&attrs), error);
}
