/* alibi.c: a qkv plugin with ALiBi position biases for attention scores
 * (Press et al., "Train Short, Test Long", 2022), with causal and
 * sliding-window (local attention) masks.
 *
 * "alibi" {causal: b = false, window: i = 0, max_bias: d = 8}
 *   scores (…, H, n_q, n_k) → scores − m_h · |p_i − j|, where head h
 *   (0-based) has slope m_h = 2^(−max_bias·(h+1)/H) (for H not a power of
 *   two, the paper's interleaved slopes), and query i sits at key position
 *   p_i = i + n_k − n_q (the queries are the last n_q positions, as when
 *   decoding with a cache). Masked keys get −1e6, the value masked_softmax
 *   uses: with causal, keys after the query (j > p_i); with window w > 0,
 *   keys w or more positions away (causal: p_i − j ≥ w). Feed the result to
 *   "softmax".
 *
 * "alibi_backward" {causal, window}: dy → dy with the masked entries zeroed
 *   (the bias is a constant, so the gradient passes straight through).
 */
#include <qkv/qkv.h>

#include <math.h>

#define ALIBI_MASK_VALUE (-1e6f)

static const gchar *const alibi_inputs[] = {"scores", NULL};
static const gchar *const alibi_outputs[] = {"y", NULL};
static const gchar *const alibi_backward_inputs[] = {"dy", NULL};
static const gchar *const alibi_backward_outputs[] = {"dscores", NULL};

static const QkvAttrSpec alibi_attrs[] = {
    {.name = "causal",
     .type = QKV_ATTR_BOOL,
     .default_int = FALSE,
     .doc = "mask the keys after each query"},
    {.name = "window",
     .type = QKV_ATTR_INT,
     .default_int = 0,
     .doc = "mask keys this many positions away or more (0: no window)"},
    {.name = "max_bias",
     .type = QKV_ATTR_FLOAT,
     .default_float = 8.0,
     .doc = "the 8 in the slopes m_h = 2^(-8(h+1)/H)"},
};

/* The mask attributes only (alibi_backward needs no slopes). */
#define ALIBI_N_MASK_ATTRS 2

static gboolean
alibi_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *s = &ctx->in_shapes[0];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "the scores must be f32");
  if (s->rank < 3)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "the scores must be (…, heads, n_q, n_k), of rank 3 or more");
  if (qkv_attrs_get_int(ctx->attrs, "window") < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "window must be 0 or more");
  ctx->out_shapes[0] = *s;
  return TRUE;
}

/* Slope of head h (0-based) of n, n a power of two. */
static double
slope_power_of_two(gint64 n, gint64 h, double max_bias)
{
  return pow(2.0, -max_bias * (double)(h + 1) / (double)n);
}

/* The paper's slopes: for H not a power of two, those of the largest power of
 * two below H, then every other slope of twice that many heads. */
static double
alibi_slope(gint64 heads, gint64 h, double max_bias)
{
  gint64 closest = 1;
  while (closest * 2 <= heads)
    closest *= 2;
  if (h < closest)
    return slope_power_of_two(closest, h, max_bias);
  return slope_power_of_two(2 * closest, 2 * (h - closest), max_bias);
}

typedef struct {
  const QkvKernelCtx *ctx;
  gint64 heads, n_q, n_k;
  gboolean causal;
  gint64 window;
  double max_bias;
  gboolean backward;
} AlibiJob;

static inline gboolean
alibi_masked(const AlibiJob *job, gint64 distance)
{
  if (job->causal && distance < 0)
    return TRUE;
  return job->window > 0 && (distance >= job->window || distance <= -job->window);
}

/* One row per (batch, head, query). */
static void
alibi_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const AlibiJob *job = data;
  const float *x = job->ctx->in[0].data;
  float *y = job->ctx->out[0].data;
  for (gint64 r = begin; r < end; r++) {
    gint64 i = r % job->n_q, h = (r / job->n_q) % job->heads;
    gint64 position = i + job->n_k - job->n_q;
    float slope = (float)alibi_slope(job->heads, h, job->max_bias);
    const float *xr = x + r * job->n_k;
    float *yr = y + r * job->n_k;
    for (gint64 j = 0; j < job->n_k; j++) {
      gint64 distance = position - j;
      if (alibi_masked(job, distance))
        yr[j] = job->backward ? 0.0f : ALIBI_MASK_VALUE;
      else if (job->backward)
        yr[j] = xr[j];
      else
        yr[j] = xr[j] - slope * (float)(distance < 0 ? -distance : distance);
    }
  }
}

static void
alibi_run(const QkvKernelCtx *ctx, gboolean backward)
{
  const QkvShape *s = &ctx->in[0].shape;
  AlibiJob job = {
      .ctx = ctx,
      .heads = s->dims[s->rank - 3],
      .n_q = s->dims[s->rank - 2],
      .n_k = s->dims[s->rank - 1],
      .causal = qkv_attrs_get_bool(ctx->attrs, "causal"),
      .window = qkv_attrs_get_int(ctx->attrs, "window"),
      .max_bias = backward ? 0.0 : qkv_attrs_get_float(ctx->attrs, "max_bias"),
      .backward = backward,
  };
  if (job.n_k == 0)
    return;
  qkv_kernel_parallel_for(ctx, qkv_shape_numel(s) / job.n_k, alibi_range, &job);
}

static void
alibi_forward(const QkvKernelCtx *ctx)
{
  alibi_run(ctx, FALSE);
}

static void
alibi_backward_forward(const QkvKernelCtx *ctx)
{
  alibi_run(ctx, TRUE);
}

static QkvValue *
alibi_backward_call(QkvGraph *graph, QkvValue *dy, const QkvAttrs *attrs, GError **error)
{
  GVariantBuilder b;
  g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&b, "{sv}", "causal",
                        g_variant_new_boolean(qkv_attrs_get_bool(attrs, "causal")));
  g_variant_builder_add(&b, "{sv}", "window",
                        g_variant_new_int64(qkv_attrs_get_int(attrs, "window")));
  return qkv_graph_op(graph, "alibi_backward", &dy, 1, g_variant_builder_end(&b), error);
}

static gboolean
alibi_gradient(QkvGradCtx *g, GError **error)
{
  /* With no mask the op adds a constant: the gradient is dy itself. */
  if (!qkv_attrs_get_bool(g->attrs, "causal") && qkv_attrs_get_int(g->attrs, "window") == 0) {
    g->in_grads[0] = g->out_grads[0];
    return TRUE;
  }
  g->in_grads[0] = alibi_backward_call(g->graph, g->out_grads[0], g->attrs, error);
  return g->in_grads[0] != NULL;
}

/* Masking is linear and its own adjoint. */
static gboolean
alibi_backward_gradient(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = alibi_backward_call(g->graph, g->out_grads[0], g->attrs, error);
  return g->in_grads[0] != NULL;
}

static const QkvOpDef alibi_ops[] = {
    {
        QKV_OP_DEF_INIT,
        .name = "alibi",
        .doc = "attention scores (…, H, n_q, n_k) minus the ALiBi bias m_h·|i − j|, with "
               "optional causal and sliding-window masks (−1e6)",
        .min_inputs = 1,
        .max_inputs = 1,
        .input_names = alibi_inputs,
        .output_names = alibi_outputs,
        .attrs = alibi_attrs,
        .n_attrs = G_N_ELEMENTS(alibi_attrs),
        .flags = QKV_OP_INPLACE,
        .shape = alibi_shape,
        .forward = alibi_forward,
        .gradient = alibi_gradient,
    },
    {
        QKV_OP_DEF_INIT,
        .name = "alibi_backward",
        .doc = "dy with the entries alibi masks set to zero",
        .min_inputs = 1,
        .max_inputs = 1,
        .input_names = alibi_backward_inputs,
        .output_names = alibi_backward_outputs,
        .attrs = alibi_attrs,
        .n_attrs = ALIBI_N_MASK_ATTRS,
        .flags = QKV_OP_INPLACE,
        .shape = alibi_shape,
        .forward = alibi_backward_forward,
        .gradient = alibi_backward_gradient,
    },
};

static gboolean
register_alibi(GError **error)
{
  for (gsize i = 0; i < G_N_ELEMENTS(alibi_ops); i++)
    if (!qkv_op_register(&alibi_ops[i], error))
      return FALSE;
  return TRUE;
}

QKV_PLUGIN_DEFINE("alibi", "1.0.0", "MIT",
                  "ALiBi attention biases with causal and sliding-window masks", register_alibi);
