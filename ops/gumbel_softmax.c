/* gumbel_softmax.c: "gumbel_softmax" (a sample from a categorical
 * distribution given by logits, with the straight-through estimator for its
 * gradient) and its backward op.
 *
 * Along one axis, each row of logits x picks a position. In a plan compiled
 * for training the pick is a sample: the Gumbel-max trick takes
 * argmax_j (x_j + g_j) with g_j standard Gumbel noise, which picks j with
 * probability softmax(x)_j. In evaluation there is no noise and the pick is
 * argmax_j x_j, so a trained model answers the same every time.
 *
 * The pick itself has no useful derivative (it is piecewise constant in x).
 * With hard (the default) output 0 is its one-hot and output 1 the soft
 * relaxation s = softmax((x + g) / tau) of the same draw; the gradient of the
 * one-hot is taken to be that of s (the straight-through Gumbel-softmax
 * estimator of Jang et al. 2017, PyTorch's gumbel_softmax(hard=True): y_hard −
 * s.detach() + s). Without hard, output 0 is s itself and differentiable as
 * it stands. tau trades bias for variance: small tau makes s nearly the
 * one-hot, with large gradients near ties.
 *
 * Why this and not the score-function (REINFORCE) estimator: it fits a
 * define-then-run graph with reverse-mode autodiff as it is. The surrogate is
 * one more differentiable node, and the loss reaches the scores through the
 * usual backward pass; REINFORCE would need the per-example loss fed back as
 * a reward into a log-probability term, and a learned baseline (another
 * network and another loss) to keep its variance usable.
 *
 * The noise for element i (its flat index in x) is
 * g = −log(−log(u)), u = qkv_random_uniform(key(seed, step, node), i) + 2⁻²⁵
 * (in double, so u lies strictly inside (0, 1)), as dropout draws its masks:
 * reproducible from (seed, step) and different from step to step.
 *
 * Optional valid_lens i32 (B) or (B, n_q) masks the last axis of x
 * (…, n_q, n) as masked_softmax does (B = x's first axis): positions at or
 * past the valid length are never picked and get s = 0 and no gradient. A
 * row with no valid position picks nothing: its y and s are all zeros.
 */
#include "attention-common.h"
#include "error-private.h"

/* The inputs: logits, then the optional valid lengths. */
#define FIRST_OPTIONAL 1

/* Units of work per element: noise (two logs), a max, an exp, a scale. */
#define GUMBEL_WORK 40

static const QkvAttrSpec gumbel_softmax_attrs[] = {
    QKV_FLOAT_ATTR("tau", 1.0, "temperature of the soft relaxation softmax((x + g) / tau), > 0"),
    QKV_BOOL_ATTR("hard", TRUE,
                  "output 0 is the one-hot of the pick (straight-through gradient), and output 1 "
                  "the soft relaxation; false: output 0 is the soft relaxation"),
    QKV_INT_ATTR("axis", -1, "the axis picked along (the last one when valid_lens is given)"),
};

/* Rows of n positions along the axis, inner apart: element j of row r sits at
 * (r / inner) · n · inner + j · inner + r % inner. */
typedef struct {
  gint64 rows, n, inner;
} GumbelLayout;

static GumbelLayout
gumbel_layout(const QkvShape *x, gint axis)
{
  GumbelLayout l = {1, x->dims[axis], 1};
  for (gint d = 0; d < x->rank; d++)
    if (d < axis)
      l.rows *= x->dims[d];
    else if (d > axis)
      l.inner *= x->dims[d];
  l.rows *= l.inner;
  return l;
}

static gboolean
check_tau_and_axis(QkvShapeCtx *ctx, gint rank, gint *axis, GError **error)
{
  double tau = qkv_attrs_get_float(ctx->attrs, "tau");
  if (!(tau > 0.0 && isfinite(tau)))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "tau must be finite and > 0, got %g",
                           tau);
  gint64 given = qkv_attrs_get_int(ctx->attrs, "axis");
  *axis = given >= -rank && given < rank ? qkv_normalize_axis((gint)given, rank) : -1;
  if (*axis < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "axis %" G_GINT64_FORMAT " is out of range for rank %d", given, rank);
  return TRUE;
}

static gboolean
gumbel_softmax_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "logits must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (x->rank < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "logits must have rank 1 or more");
  gint axis;
  if (!check_tau_and_axis(ctx, x->rank, &axis, error))
    return FALSE;
  if (ctx->n_inputs > FIRST_OPTIONAL) {
    if (x->rank < 2 || axis != x->rank - 1)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "valid_lens masks the last axis of logits (…, n_q, n): the logits "
                             "need rank 2 or more and axis -1");
    gboolean per_query;
    if (!qkv_attn_check_valid_lens(ctx, FIRST_OPTIONAL, x->dims[0], x->dims[x->rank - 2],
                                   &per_query, error))
      return FALSE;
  }
  ctx->out_shapes[0] = *x;
  if (qkv_attrs_get_bool(ctx->attrs, "hard")) {
    ctx->n_outputs = 2;
    ctx->out_shapes[1] = *x;
  }
  return TRUE;
}

/* Standard Gumbel noise for counter i of key. */
static inline float
gumbel_noise(guint64 key, guint64 i)
{
  double u = (double)qkv_random_uniform(key, i) + 0x1p-25;
  return (float)-log(-log(u));
}

typedef struct {
  const float *x;
  float *y;    /* the one-hot (hard), else NULL */
  float *soft; /* the relaxation */
  GumbelLayout l;
  float tau;
  gboolean noise;
  guint64 key;
  const QkvAttnMask *mask; /* NULL without valid lengths */
} GumbelJob;

/* One row: soft gets (x + g) / tau at the kept positions, then its masked
 * softmax; y the one-hot of the largest (the first of equal ones). */
static void
gumbel_row(const GumbelJob *j, gint64 r)
{
  const gint64 n = j->l.n, stride = j->l.inner;
  const gint64 base = (r / stride) * n * stride + r % stride;
  const gint64 limit = j->mask != NULL ? MIN(qkv_attn_row_limit(j->mask, r, n), n) : n;
  gint64 best = -1;
  float top = -INFINITY;
  for (gint64 k = 0; k < limit; k++) {
    gint64 i = base + k * stride;
    float z = (j->x[i] + (j->noise ? gumbel_noise(j->key, (guint64)i) : 0.0f)) / j->tau;
    j->soft[i] = z;
    if (best < 0 || z > top) {
      best = k;
      top = z;
    }
  }
  float sum = 0.0f;
  for (gint64 k = 0; k < limit; k++) {
    gint64 i = base + k * stride;
    j->soft[i] = expf(j->soft[i] - top);
    sum += j->soft[i];
  }
  const float inv = 1.0f / sum;
  for (gint64 k = 0; k < n; k++)
    j->soft[base + k * stride] = k < limit ? j->soft[base + k * stride] * inv : 0.0f;
  if (j->y != NULL)
    for (gint64 k = 0; k < n; k++)
      j->y[base + k * stride] = k == best ? 1.0f : 0.0f;
}

static void
gumbel_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  for (gint64 r = begin; r < end; r++)
    gumbel_row(user_data, r);
}

static void
gumbel_softmax_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *x = &ctx->in[0].shape;
  gint axis = qkv_normalize_axis((gint)qkv_attrs_get_int(ctx->attrs, "axis"), x->rank);
  gboolean hard = qkv_attrs_get_bool(ctx->attrs, "hard");
  GumbelJob job = {
      .x = ctx->in[0].data,
      .y = hard ? ctx->out[0].data : NULL,
      .soft = hard ? ctx->out[1].data : ctx->out[0].data,
      .l = gumbel_layout(x, axis),
      .tau = (float)qkv_attrs_get_float(ctx->attrs, "tau"),
      .noise = ctx->training,
      .key = qkv_random_key(ctx->seed, ctx->step, ctx->node_id),
  };
  QkvAttnMask mask;
  if (ctx->n_inputs > FIRST_OPTIONAL) {
    gint64 batch = x->dims[0], n_q = x->dims[x->rank - 2];
    mask = qkv_attn_mask_from_view(&ctx->in[FIRST_OPTIONAL], batch > 0 ? job.l.rows / batch : 1,
                                   n_q, FALSE);
    job.mask = &mask;
  }
  qkv_parallel_for(qkv_kernel_threads(ctx, GUMBEL_WORK * job.l.rows * job.l.n), job.l.rows,
                   gumbel_rows, &job);
}

/* The gradient of s: out_grads[0] (through y, straight through, or s itself)
 * plus that of the exposed s. Masked positions have s = 0, so the backward
 * needs no valid lengths to give them none. */
static gboolean
gumbel_softmax_grad(QkvGradCtx *g, GError **error)
{
  if (!g->needs_grad[0])
    return TRUE;
  QkvValue *ds = g->out_grads[0];
  QkvValue *dsoft = g->n_outputs > 1 ? g->out_grads[1] : NULL;
  if (ds == NULL && dsoft == NULL)
    return TRUE;
  if (ds == NULL || dsoft != NULL) {
    ds = ds == NULL ? dsoft : qkv_add(ds, dsoft, error);
    if (ds == NULL)
      return FALSE;
  }
  QkvValue *inputs[] = {ds, g->outputs[g->n_outputs > 1 ? 1 : 0]};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "tau",
                        g_variant_new_double(qkv_attrs_get_float(g->attrs, "tau")));
  g_variant_builder_add(&attrs, "{sv}", "axis",
                        g_variant_new_int64(qkv_attrs_get_int(g->attrs, "axis")));
  g->in_grads[0] =
      qkv_op_call("gumbel_softmax_backward", inputs, 2, g_variant_builder_end(&attrs), error);
  return g->in_grads[0] != NULL;
}

/* ---- backward op --------------------------------------------------------- */

static gboolean
gumbel_softmax_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "ds and soft must be f32, got %s and %s",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "ds and soft must have the same shape");
  if (ctx->in_shapes[1].rank < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "soft must have rank 1 or more");
  gint axis;
  if (!check_tau_and_axis(ctx, ctx->in_shapes[1].rank, &axis, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[1];
  return TRUE;
}

typedef struct {
  const float *ds, *s;
  float *dx;
  GumbelLayout l;
  float inv_tau;
} GumbelBackwardJob;

/* dx = s · (ds − Σ ds·s) / tau along each row (dx may equal ds). */
static void
gumbel_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const GumbelBackwardJob *j = user_data;
  const gint64 n = j->l.n, stride = j->l.inner;
  for (gint64 r = begin; r < end; r++) {
    const gint64 base = (r / stride) * n * stride + r % stride;
    float dot = 0.0f;
    for (gint64 k = 0; k < n; k++)
      dot += j->ds[base + k * stride] * j->s[base + k * stride];
    for (gint64 k = 0; k < n; k++) {
      gint64 i = base + k * stride;
      j->dx[i] = j->s[i] * (j->ds[i] - dot) * j->inv_tau;
    }
  }
}

static void
gumbel_softmax_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *s = &ctx->in[1].shape;
  gint axis = qkv_normalize_axis((gint)qkv_attrs_get_int(ctx->attrs, "axis"), s->rank);
  GumbelBackwardJob job = {ctx->in[0].data, ctx->in[1].data, ctx->out[0].data,
                           gumbel_layout(s, axis),
                           (float)(1.0 / qkv_attrs_get_float(ctx->attrs, "tau"))};
  /* a dot product and a scaled difference: about four units per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, 4 * job.l.rows * job.l.n), job.l.rows,
                   gumbel_backward_rows, &job);
}

/* ---- registration -------------------------------------------------------- */

const QkvOpDef qkv_ops_gumbel_softmax[] = {
    QKV_OP(.name = "gumbel_softmax",
           .doc = "picks one position of each row of logits along axis: in training a sample "
                  "argmax(x + g), g standard Gumbel noise drawn from (seed, step, node), so "
                  "position j with probability softmax(x)_j; in evaluation argmax(x). With hard, "
                  "output 0 is the pick's one-hot and output 1 the relaxation "
                  "softmax((x + g) / tau) of the same draw, whose gradient the one-hot takes "
                  "(straight-through Gumbel-softmax); without hard, output 0 is the relaxation. "
                  "Optional valid_lens i32 (B) or (B, n_q) for logits (B, …, n_q, n) and axis -1: "
                  "positions at or past the valid length are never picked and get 0; a row with "
                  "none picks nothing (all zeros).",
           QKV_INPUTS_OPT(FIRST_OPTIONAL, "logits", "valid_lens"), QKV_OUTPUTS("y", "soft"),
           QKV_ATTR_TABLE(gumbel_softmax_attrs), .flags = QKV_OP_RANDOM,
           .shape = gumbel_softmax_shape, .forward = gumbel_softmax_forward,
           .gradient = gumbel_softmax_grad),
    /* In place: each row's dot product is taken before the row is written. */
    QKV_OP(.name = "gumbel_softmax_backward",
           .doc = "s · (ds − Σ ds·s) / tau along axis: the gradient of the logits of "
                  "gumbel_softmax from that of its relaxation s (output 1 with hard, else 0)",
           QKV_INPUTS("ds", "soft"), QKV_OUTPUTS("dx"),
           QKV_ATTRS(QKV_FLOAT_ATTR("tau", 1.0, "the forward op's"),
                     QKV_INT_ATTR("axis", -1, "the forward op's")),
           .flags = QKV_OP_INPLACE, .shape = gumbel_softmax_backward_shape,
           .forward = gumbel_softmax_backward_forward),
    QKV_OPS_END,
};

/* ---- typed function ------------------------------------------------------ */

QkvValue *
qkv_gumbel_softmax(QkvValue *logits, QkvValue *valid_lens, double tau, gboolean hard, gint axis,
                   GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("gumbel_softmax", error, logits);
  QkvValue *inputs[2] = {logits, valid_lens};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "tau", g_variant_new_double(tau));
  g_variant_builder_add(&attrs, "{sv}", "hard", g_variant_new_boolean(hard));
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  return qkv_op_call("gumbel_softmax", inputs, valid_lens != NULL ? 2 : 1,
                     g_variant_builder_end(&attrs), error);
}
