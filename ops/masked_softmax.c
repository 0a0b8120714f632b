/* masked_softmax.c: "masked_softmax" (the book's masked_softmax, plus a
 * causal mask) and its fused backward op.
 *
 * x (…, n_q, n_k) with B = x's first axis; valid_lens (B) gives one length
 * per batch element (all its rows), (B, n_q) one per query. An optional mask
 * input (mask_kind "boolean" or "additive") broadcasts to x. Masked scores
 * are replaced by -1e6 before the softmax (see attention-common.h).
 */
#include "attention-common.h"
#include "error-private.h"

#define BLOCK_ELEMENTS 1024

/* The inputs: x, or dy and y for the backward op, then valid_lens and the
 * mask (QkvAttnSlots from the first optional slot on). */
#define FIRST_OPTIONAL 1
#define BACKWARD_FIRST_OPTIONAL 2

static const QkvAttrSpec masked_softmax_attrs[] = {
    QKV_BOOL_ATTR("causal", FALSE,
                  "also mask key j > query i (i: the row's index along the n_q axis)"),
    QKV_ATTN_MASK_KIND_ATTR,
};

/* Checks x (rank ≥ 2, f32) and the optional valid_lens (i32) and mask (f32)
 * from index first on. */
static gboolean
check_scores(QkvShapeCtx *ctx, guint x_index, guint first, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[x_index];
  if (ctx->in_dtypes[x_index] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[x_index]));
  if (x->rank < 2)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must have rank 2 or more (…, queries, keys), got rank %d", x->rank);
  QkvAttnSlots in;
  if (!qkv_attn_check_mask_kind(ctx, error))
    return FALSE;
  if (!qkv_attn_slots_of(first, ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected optional valid_lens, then a mask when mask_kind is not "
                           "\"none\"");
  if (in.valid_lens >= 0) {
    gboolean per_query;
    if (!qkv_attn_check_valid_lens(ctx, (guint)in.valid_lens, x->dims[0], x->dims[x->rank - 2],
                                   &per_query, error))
      return FALSE;
  }
  return in.mask < 0 || qkv_attn_check_mask(ctx, (guint)in.mask, x, FALSE, error);
}

static gboolean
masked_softmax_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_scores(ctx, 0, FIRST_OPTIONAL, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

/* The masks of a kernel whose optional inputs start at first; values
 * receives the mask input's description. */
static QkvAttnMask
kernel_mask(const QkvKernelCtx *ctx, const QkvShape *x, guint first, QkvAttnScoreMask *values)
{
  QkvAttnSlots in;
  qkv_attn_slots_of(first, ctx->n_inputs, ctx->attrs, &in);
  gint64 rows = 1;
  for (gint i = 0; i < x->rank - 1; i++)
    rows *= x->dims[i];
  gint64 batch = x->dims[0];
  QkvAttnMask m = qkv_attn_mask_from_view(in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                          batch > 0 ? rows / batch : 1, x->dims[x->rank - 2],
                                          qkv_attrs_get_bool(ctx->attrs, "causal"));
  if (in.mask >= 0) {
    qkv_attn_score_mask_init(values, &ctx->in[in.mask], x, FALSE,
                             qkv_attn_mask_additive(ctx->attrs));
    m.values = values;
  }
  return m;
}

typedef struct {
  const QkvAttnMask *mask;
  const float *x; /* x, or dy for the backward */
  const float *y; /* the forward output (backward only) */
  float *out;
  gint64 rows, cols, block;
} MaskedSoftmaxJob;

/* Blocks [begin, end) of block rows each. */
static void
masked_softmax_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MaskedSoftmaxJob *j = user_data;
  const gint64 cols = j->cols;
  for (gint64 b = begin; b < end; b++) {
    gint64 r = b * j->block, n = MIN(j->block, j->rows - r);
    qkv_attn_softmax_rows(j->out + r * cols, j->x + r * cols, n, cols, j->mask, r);
  }
}

static void
masked_softmax_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MaskedSoftmaxJob *j = user_data;
  const gint64 cols = j->cols;
  for (gint64 r = begin; r < end; r++) {
    gint64 limit = qkv_attn_row_limit(j->mask, r, cols);
    if (j->mask->values != NULL)
      qkv_attn_softmax_backward_masked_row(j->out + r * cols, j->x + r * cols, j->y + r * cols,
                                           cols, limit, j->mask->values, r);
    else
      qkv_attn_softmax_backward_row(j->out + r * cols, j->x + r * cols, j->y + r * cols, cols,
                                    limit);
  }
}

static void
masked_softmax_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[0], &rows, &cols);
  QkvAttnScoreMask values;
  QkvAttnMask mask = kernel_mask(ctx, &ctx->in[0].shape, FIRST_OPTIONAL, &values);
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  /* Blocks of rows of about BLOCK_ELEMENTS scores share one exp call. */
  gint64 block = cols > 0 ? MAX(BLOCK_ELEMENTS / cols, 1) : 1;
  gint64 n_blocks = (rows + block - 1) / block;
  MaskedSoftmaxJob job = {&mask, x, NULL, y, rows, cols, block};
  /* about ten units of work per score (max, subtract, exp, sum, scale) */
  qkv_parallel_for(qkv_kernel_threads(ctx, 10 * rows * cols), n_blocks, masked_softmax_blocks,
                   &job);
}

/* dx, and for an additive mask its gradient: dx (the gradient of x + mask)
 * summed over the axes the mask was broadcast along. A boolean mask has
 * none. */
static gboolean
masked_softmax_grad(QkvGradCtx *g, GError **error)
{
  QkvAttnSlots in;
  qkv_attn_slots_of(FIRST_OPTIONAL, g->n_inputs, g->attrs, &in);
  gint mi = in.mask;
  gboolean mask_grad = mi >= 0 && qkv_attn_mask_additive(g->attrs) && g->needs_grad[mi];
  if (g->out_grads[0] == NULL || !(g->needs_grad[0] || mask_grad))
    return TRUE;
  QkvAttnSlots bw = qkv_attn_slots(BACKWARD_FIRST_OPTIONAL, in.valid_lens >= 0, mi >= 0);
  QkvValue *inputs[4] = {g->out_grads[0], g->outputs[0]};
  qkv_slot_put(inputs, bw.valid_lens, in.valid_lens >= 0 ? g->inputs[in.valid_lens] : NULL);
  qkv_slot_put(inputs, bw.mask, mi >= 0 ? g->inputs[mi] : NULL);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "causal",
                        g_variant_new_boolean(qkv_attrs_get_bool(g->attrs, "causal")));
  g_variant_builder_add(&attrs, "{sv}", "mask_kind",
                        g_variant_new_string(qkv_attrs_get_string(g->attrs, "mask_kind")));
  QkvValue *dx = qkv_op_call("masked_softmax_backward", inputs, bw.n_inputs,
                             g_variant_builder_end(&attrs), error);
  if (dx == NULL)
    return FALSE;
  if (g->needs_grad[0])
    g->in_grads[0] = dx;
  if (mask_grad) {
    g->in_grads[mi] = qkv_sum_to(dx, qkv_value_shape(g->inputs[mi]), error);
    if (g->in_grads[mi] == NULL)
      return FALSE;
  }
  return TRUE;
}

/* ---- backward op --------------------------------------------------------- */

static gboolean
masked_softmax_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (!check_scores(ctx, 1, BACKWARD_FIRST_OPTIONAL, error))
    return FALSE;
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and y must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[1];
  return TRUE;
}

static void
masked_softmax_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[1], &rows, &cols);
  QkvAttnScoreMask values;
  QkvAttnMask mask = kernel_mask(ctx, &ctx->in[1].shape, BACKWARD_FIRST_OPTIONAL, &values);
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
  MaskedSoftmaxJob job = {&mask, dy, y, dx, rows, cols, 1};
  /* a dot product and a scaled difference: about four units per score */
  qkv_parallel_for(qkv_kernel_threads(ctx, 4 * rows * cols), rows, masked_softmax_backward_rows,
                   &job);
}

/* ---- registration -------------------------------------------------------- */

const QkvOpDef qkv_ops_masked_softmax[] = {
    /* In place: each row is read (its maximum) before it is written. */
    QKV_OP(.name = "masked_softmax",
           .doc = "softmax over the last axis of x (…, n_q, n_k) after replacing masked scores by "
                  "-1e6 (d2l's masked_softmax). Optional valid_lens i32 (B) or (B, n_q), B = x's "
                  "first axis: keys at positions ≥ the valid length are masked (length 0 gives a "
                  "uniform row). causal masks key j > query i. Optional mask f32 (after valid_lens "
                  "when both are given), broadcasting to x (right-aligned, each axis 1 or full): "
                  "with mask_kind \"boolean\" a 0 masks the key like the valid length does; with "
                  "\"additive\" it is added to the scores first (and takes a gradient). Masked "
                  "scores get no gradient.",
           QKV_INPUTS_OPT(FIRST_OPTIONAL, "x", "valid_lens", "mask"), QKV_OUTPUTS("y"),
           QKV_ATTR_TABLE(masked_softmax_attrs), .flags = QKV_OP_INPLACE,
           .shape = masked_softmax_shape, .forward = masked_softmax_forward,
           .gradient = masked_softmax_grad),
    /* In place: each row's dot product is taken before the row is written. */
    QKV_OP(.name = "masked_softmax_backward",
           .doc = "y · (dy − Σ dy·y) over the last axis, given the masked_softmax output y; 0 at "
                  "masked keys (valid_lens, mask and causal as for the forward op)",
           QKV_INPUTS_OPT(BACKWARD_FIRST_OPTIONAL, "dy", "y", "valid_lens", "mask"),
           QKV_OUTPUTS("dx"), QKV_ATTR_TABLE(masked_softmax_attrs),
           .no_grad_inputs = 1 << 2 | 1 << 3, .flags = QKV_OP_INPLACE,
           .shape = masked_softmax_backward_shape, .forward = masked_softmax_backward_forward),
    QKV_OPS_END,
};

/* ---- typed function ------------------------------------------------------ */

QkvValue *
qkv_masked_softmax(QkvValue *x, QkvValue *valid_lens, gboolean causal, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_masked_softmax_full(x, valid_lens, NULL, QKV_MASK_BOOLEAN, causal, error);
}

QkvValue *
qkv_masked_softmax_full(QkvValue *x, QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                        gboolean causal, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("masked_softmax", error, x);
  QkvAttnSlots in = qkv_attn_slots(FIRST_OPTIONAL, valid_lens != NULL, mask != NULL);
  QkvValue *inputs[3] = {x};
  qkv_slot_put(inputs, in.valid_lens, valid_lens);
  qkv_slot_put(inputs, in.mask, mask);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "causal", g_variant_new_boolean(causal));
  if (mask != NULL)
    g_variant_builder_add(&attrs, "{sv}", "mask_kind",
                          g_variant_new_string(qkv_attn_mask_kind_name(kind)));
  return qkv_op_call("masked_softmax", inputs, in.n_inputs, g_variant_builder_end(&attrs), error);
}
