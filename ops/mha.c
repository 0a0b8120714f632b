/* mha.c: "multi_head_attention", the book's MultiHeadAttention as one op:
 * its shape rule and forward kernel, and the table of the mha family. The
 * gradient rule and the fused backward op, the rest of the family, are in
 * mha-backward.c (mha-internal.h is what the two share).
 *
 * The projections are single tall products x Wᵀ (+ b) over all batch rows.
 * Head h of a projection is its column block h·dh … (h+1)·dh − 1, exactly the
 * book's transpose_qkv, so the per-head attention reads and writes those
 * blocks in place (row stride H) and the heads' results land directly in the
 * concatenation that transpose_output would build. Valid lengths are shared
 * by the heads of a batch element (the book's repeat_interleave).
 */
#include "mha-internal.h"
#include "error-private.h"

/* ---- where the optional inputs sit (mha-internal.h) --------------------- */

MhaSlots
mha_slots(MhaSlots present)
{
  MhaSlots s = {.n_inputs = MHA_FIRST_OPTIONAL};
  s.bias = qkv_slot_next(&s.n_inputs, present.bias, 4);
  s.valid_lens = qkv_slot_next(&s.n_inputs, present.valid_lens, 1);
  s.mask = qkv_slot_next(&s.n_inputs, present.mask, 1);
  return s;
}

gboolean
mha_slots_of(guint n_inputs, const QkvAttrs *attrs, MhaSlots *s)
{
  for (gint bits = 0; bits < 4; bits++) {
    *s = mha_slots(
        (MhaSlots){.bias = bits & 1, .valid_lens = bits >> 1, .mask = qkv_attn_has_mask(attrs)});
    if (s->n_inputs == n_inputs)
      return TRUE;
  }
  return FALSE;
}

/* ---- forward ------------------------------------------------------------ */

MhaDims
mha_dims(const QkvShape *shapes, gint64 heads)
{
  MhaDims d;
  d.batch = shapes[0].dims[0];
  d.n_q = shapes[0].dims[1];
  d.n_k = shapes[1].dims[1];
  d.d_q = shapes[0].dims[2];
  d.d_k = shapes[1].dims[2];
  d.d_v = shapes[2].dims[2];
  d.hidden = shapes[3].dims[0];
  d.heads = MAX(heads, 1);
  d.dh = d.hidden / d.heads;
  return d;
}

gboolean
mha_check_inputs(QkvShapeCtx *ctx, gint bias_index, GError **error)
{
  for (guint i = 0; i < 7; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s must be f32, got %s",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
  for (guint i = 0; i < 3; i++)
    if (ctx->in_shapes[i].rank != 3)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "%s must have rank 3 (batch, positions, features), got rank %d",
                             qkv_input_name(ctx, i), ctx->in_shapes[i].rank);
  const QkvShape *s = ctx->in_shapes;
  if (s[1].dims[0] != s[0].dims[0] || s[2].dims[0] != s[0].dims[0])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "queries, keys and values must have the same batch size");
  if (s[2].dims[1] != s[1].dims[1])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "keys and values must have the same number of positions");
  if (s[3].rank != 2)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "w_q must be a matrix (H, d_q)");
  gint64 hidden = s[3].dims[0];
  for (guint i = 3; i < 7; i++) {
    gint64 in_size = i == 6 ? hidden : s[i - 3].dims[2];
    if (s[i].rank != 2 || s[i].dims[0] != hidden || s[i].dims[1] != in_size)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "%s must be (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                             ") (hidden size, input features)",
                             qkv_input_name(ctx, i), hidden, in_size);
  }
  for (gint i = bias_index; bias_index >= 0 && i < bias_index + 4; i++)
    if (ctx->in_dtypes[i] != QKV_F32 || ctx->in_shapes[i].rank != 1 ||
        ctx->in_shapes[i].dims[0] != hidden)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "%s must be f32 (%" G_GINT64_FORMAT ") (the hidden size)",
                             qkv_input_name(ctx, (guint)i), hidden);
  gint64 heads = qkv_attrs_get_int(ctx->attrs, "num_heads");
  if (heads < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "num_heads must be 1 or more, got %" G_GINT64_FORMAT, heads);
  if (hidden % heads != 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "the hidden size %" G_GINT64_FORMAT
                           " is not a multiple of num_heads = %" G_GINT64_FORMAT,
                           hidden, heads);
  MhaDims d = mha_dims(s, heads);
  if (!qkv_attn_check_sizes(ctx, d.batch, d.heads, d.n_q, d.n_k, d.dh, error))
    return FALSE;
  /* the backward's shared scratch: at most 8 floats per position of
   * queries and keys times the widest of their features (mha-backward.c) */
  const gint64 rows[] = {d.batch, d.n_q + d.n_k, MAX(MAX(hidden, d.d_q), MAX(d.d_k, d.d_v)), 8,
                         (gint64)sizeof(float)};
  gint64 bytes;
  if (!qkv_attn_size_product(rows, G_N_ELEMENTS(rows), &bytes))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "%" G_GINT64_FORMAT " queries and %" G_GINT64_FORMAT
                           " keys per batch element of %" G_GINT64_FORMAT
                           " take more than 2^63 bytes to project",
                           d.n_q, d.n_k, d.batch);
  return qkv_attn_check_dropout(ctx, "dropout", error);
}

static gboolean
forward_shape(QkvShapeCtx *ctx, GError **error)
{
  MhaSlots in;
  if (!qkv_attn_check_mask_kind(ctx, error) || !qkv_flash_check_blocks(ctx, error))
    return FALSE;
  if (!mha_slots_of(ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected 7 inputs (queries, keys, values, w_q, w_k, w_v, w_o), 11 "
                           "with the biases b_q, b_k, b_v, b_o, then optional valid_lens (i32) "
                           "and mask (f32); got %u",
                           ctx->n_inputs);
  if (!mha_check_inputs(ctx, in.bias, error))
    return FALSE;
  MhaDims d = mha_dims(ctx->in_shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  gboolean per_query;
  if (in.valid_lens >= 0 &&
      !qkv_attn_check_valid_lens(ctx, (guint)in.valid_lens, d.batch, d.n_q, &per_query, error))
    return FALSE;
  QkvShape scores = QKV_SHAPE(d.batch, d.heads, d.n_q, d.n_k);
  if (in.mask >= 0 && !qkv_attn_check_mask(ctx, (guint)in.mask, &scores, TRUE, error))
    return FALSE;
  ctx->out_shapes[OUT_OUT] = QKV_SHAPE(d.batch, d.n_q, d.hidden);
  gboolean flash = qkv_attrs_get_bool(ctx->attrs, "flash");
  ctx->out_shapes[OUT_WEIGHTS] =
      flash ? QKV_SHAPE(d.batch, d.heads, d.n_q, 2) : QKV_SHAPE(d.batch, d.heads, d.n_q, d.n_k);
  ctx->out_shapes[OUT_QP] = QKV_SHAPE(d.batch, d.n_q, d.hidden);
  ctx->out_shapes[OUT_KP] = QKV_SHAPE(d.batch, d.n_k, d.hidden);
  ctx->out_shapes[OUT_VP] = QKV_SHAPE(d.batch, d.n_k, d.hidden);
  ctx->out_shapes[OUT_CONCAT] = QKV_SHAPE(d.batch, d.n_q, d.hidden);
  ctx->n_outputs = OUT_MASK;
  if (qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0) {
    ctx->out_shapes[OUT_MASK] = flash ? QKV_SHAPE(QKV_FLASH_KEY_LEN) : ctx->out_shapes[OUT_WEIGHTS];
    ctx->out_dtypes[OUT_MASK] = flash ? QKV_I32 : QKV_F32;
    ctx->n_outputs = OUT_MASK + 1;
  }
  return TRUE;
}

QkvAttnProblem
mha_problem_of(const MhaDims *d, const QkvView *valid_lens, const QkvView *mask,
               QkvAttnScoreMask *values, const QkvAttrs *attrs)
{
  QkvAttnProblem pb = {0};
  pb.n_q = d->n_q;
  pb.n_k = d->n_k;
  pb.d = pb.d_v = d->dh;
  pb.ldq = pb.ldk = pb.ldv = pb.ldo = d->hidden;
  pb.scale = d->dh > 0 ? (float)(1.0 / sqrt((double)d->dh)) : 1.0f;
  pb.dropout = qkv_attrs_get_float(attrs, "dropout");
  pb.mask = qkv_attn_mask_from_view(valid_lens, d->heads * d->n_q, d->n_q,
                                    qkv_attrs_get_bool(attrs, "causal"));
  if (mask != NULL) {
    QkvShape scores = QKV_SHAPE(d->batch, d->heads, d->n_q, d->n_k);
    qkv_attn_score_mask_init(values, mask, &scores, TRUE, qkv_attn_mask_additive(attrs));
    pb.mask.values = values;
  }
  return pb;
}

/* y (rows, H) = x (rows, in) · wᵀ + b. */
static void
project(gint64 rows, gint64 in, gint64 hidden, const float *x, const float *w, const float *b,
        float *y)
{
  if (b != NULL)
    for (gint64 r = 0; r < rows; r++)
      memcpy(y + r * hidden, b, (gsize)hidden * sizeof(float));
  else if (in == 0)
    memset(y, 0, (gsize)(rows * hidden) * sizeof(float));
  qkv_attn_sgemm(FALSE, TRUE, rows, hidden, in, 1.0f, x, in, w, in, b != NULL ? 1.0f : 0.0f, y,
                 hidden);
}

/* project() into an output view: through the scratch and rounded where the
 * plan stores it as bf16 (its products would round it in any case). */
static void
project_into(const QkvKernelCtx *ctx, QkvView *out, gint64 rows, gint64 in, gint64 hidden,
             const float *x, const float *w, const float *b)
{
  if (out->dtype != QKV_BF16 || rows * hidden == 0) {
    project(rows, in, hidden, x, w, b, out->data);
    return;
  }
  float *staging = ctx->scratch;
  project(rows, in, hidden, x, w, b, staging);
  qkv_round_to_bf16(ctx, out->data, staging, rows * hidden);
}

gint
mha_problem_threads(const QkvKernelCtx *ctx, const MhaDims *d, gsize per_thread, gsize available)
{
  return qkv_attn_problem_threads(ctx, d->batch * d->heads, d->n_q * d->n_k * MAX(d->dh, 1),
                                  per_thread, available);
}

static gsize
forward_scratch_per_thread(const MhaDims *d, const QkvAttrs *attrs)
{
  if (qkv_attrs_get_float(attrs, "dropout") <= 0.0)
    return 0;
  return (gsize)(d->n_q * d->n_k) * sizeof(float);
}

QkvFlashLayout
mha_flash_layout_of(const QkvAttnProblem *pb, const MhaDims *d, const QkvAttrs *attrs)
{
  QkvFlashLayout L = {0};
  L.pb = *pb;
  L.heads = d->heads;
  L.n_problems = d->batch * d->heads;
  L.q_batch = L.o_batch = d->n_q * d->hidden;
  L.k_batch = L.v_batch = d->n_k * d->hidden;
  L.q_head = L.k_head = L.v_head = L.o_head = d->dh;
  L.block_q = qkv_attrs_get_int(attrs, "block_q");
  L.block_k = qkv_attrs_get_int(attrs, "block_k");
  return L;
}

static gsize
forward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  MhaDims d = mha_dims(ctx->in_shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  gsize attention;
  if (qkv_attrs_get_bool(ctx->attrs, "flash"))
    attention = qkv_flash_forward_scratch(d.n_q, d.n_k, d.dh, d.dh,
                                          qkv_attrs_get_int(ctx->attrs, "block_q"),
                                          qkv_attrs_get_int(ctx->attrs, "block_k"), n_threads);
  else
    attention = (gsize)MAX(n_threads, 1) * forward_scratch_per_thread(&d, ctx->attrs);
  /* a projection the plan stores as bf16 is computed in float32 here first,
   * before the attention uses the scratch */
  gboolean staged = FALSE;
  for (guint o = OUT_QP; o <= OUT_VP; o++)
    staged |= ctx->out_dtypes[o] == QKV_BF16;
  gsize staging = staged ? (gsize)(MAX(d.n_q, d.n_k) * d.batch * d.hidden) * sizeof(float) : 0;
  return MAX(attention, staging);
}

static void
mha_forward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MhaProblemsJob *j = user_data;
  const MhaDims *d = j->d;
  const gint64 nn = d->n_q * d->n_k;
  float *pd = j->scratch != NULL ? j->scratch + thread * j->scratch_floats : NULL;
  for (gint64 idx = begin; idx < end; idx++) {
    gint64 b = idx / d->heads, h = idx % d->heads;
    const QkvAttnProblem *pb = j->pb;
    qkv_attn_forward_problem(
        j->ctx, pb, idx,
        qkv_attn_operand_at(j->proj[0], pb->q_dtype, b * d->n_q * d->hidden + h * d->dh),
        qkv_attn_operand_at(j->proj[1], pb->k_dtype, b * d->n_k * d->hidden + h * d->dh),
        qkv_attn_operand_at(j->proj[2], pb->v_dtype, b * d->n_k * d->hidden + h * d->dh),
        j->weights + idx * nn, j->mask ? j->mask + idx * nn : NULL, pd,
        j->concat + b * d->n_q * d->hidden + h * d->dh);
  }
}

static void
forward_kernel(const QkvKernelCtx *ctx)
{
  MhaSlots in;
  mha_slots_of(ctx->n_inputs, ctx->attrs, &in);
  QkvShape shapes[4];
  for (guint i = 0; i < 4; i++)
    shapes[i] = ctx->in[i].shape;
  MhaDims d = mha_dims(shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  QkvAttnScoreMask values;
  QkvAttnProblem pb = mha_problem_of(&d, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                     in.mask >= 0 ? &ctx->in[in.mask] : NULL, &values, ctx->attrs);
  const float *x[3], *w[4], *bias[4];
  for (guint i = 0; i < 4; i++) {
    if (i < 3)
      x[i] = ctx->in[i].data;
    w[i] = ctx->in[3 + i].data;
    bias[i] = in.bias >= 0 ? ctx->in[(guint)in.bias + i].data : NULL;
  }
  float *out = ctx->out[OUT_OUT].data, *p = ctx->out[OUT_WEIGHTS].data;
  gconstpointer proj[3] = {ctx->out[OUT_QP].data, ctx->out[OUT_KP].data, ctx->out[OUT_VP].data};
  pb.q_dtype = ctx->out[OUT_QP].dtype;
  pb.k_dtype = ctx->out[OUT_KP].dtype;
  pb.v_dtype = ctx->out[OUT_VP].dtype;
  float *concat = ctx->out[OUT_CONCAT].data;
  float *drop = ctx->n_outputs > OUT_MASK ? ctx->out[OUT_MASK].data : NULL;
  gint64 rows[3] = {d.batch * d.n_q, d.batch * d.n_k, d.batch * d.n_k};
  gint64 in_size[3] = {d.d_q, d.d_k, d.d_v};

  for (guint i = 0; i < 3; i++)
    project_into(ctx, &ctx->out[OUT_QP + i], rows[i], in_size[i], d.hidden, x[i], w[i], bias[i]);

  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = mha_flash_layout_of(&pb, &d, ctx->attrs);
    if (drop != NULL) {
      qkv_flash_write_key(ctx, pb.dropout, (gint32 *)drop);
      qkv_flash_read_key(&L, (const gint32 *)drop);
    }
    qkv_flash_forward(ctx, &L, proj[0], proj[1], proj[2], concat, p);
    project(rows[0], d.hidden, d.hidden, concat, w[3], bias[3], out);
    return;
  }
  gsize per_thread = forward_scratch_per_thread(&d, ctx->attrs);
  gint nt = mha_problem_threads(ctx, &d, per_thread, ctx->scratch_size);
  gint64 n_problems = d.batch * d.heads;
  gint64 fpt = (gint64)(per_thread / sizeof(float));
  MhaProblemsJob job = {
      .ctx = ctx,
      .pb = &pb,
      .d = &d,
      .proj = {proj[0], proj[1], proj[2]},
      .weights = p,
      .mask = drop,
      .concat = concat,
      .scratch = per_thread > 0 ? (float *)ctx->scratch : NULL,
      .scratch_floats = fpt,
  };
  qkv_parallel_for(nt, n_problems, mha_forward_problems, &job);

  project(rows[0], d.hidden, d.hidden, concat, w[3], bias[3], out);
}

const QkvOpDef qkv_ops_mha[] = {
    QKV_OP(.name = "multi_head_attention",
           .doc =
               "d2l's MultiHeadAttention as one op. Inputs: queries (B, n_q, d_q), keys (B, n_k, "
               "d_k), values (B, n_k, d_v), w_q (H, d_q), w_k (H, d_k), w_v (H, d_v), w_o (H, H) "
               "(nn.Linear layout); then optionally the biases b_q, b_k, b_v, b_o (H), all four or "
               "none; then optionally valid_lens i32 (B) or (B, n_q), then optionally a mask f32 "
               "(mask_kind) broadcasting to the scores (B, num_heads, n_q, n_k), a rank-3 mask "
               "being (B, n_q, n_k) shared by the heads. Biases are told apart by count (11 or "
               "more inputs, less the mask), the mask by mask_kind. Head h uses columns h·dh to "
               "(h+1)·dh − 1 of the projections (dh = H / num_heads), as transpose_qkv. Outputs: 0 "
               "out (B, n_q, H); 1 weights (B, num_heads, n_q, n_k) before dropout "
               "(differentiable); saved for the backward, without gradient: 2 q_proj (B, n_q, H), "
               "3 k_proj (B, n_k, H), 4 v_proj (B, n_k, H), 5 concat (B, n_q, H) (the heads' "
               "results before w_o), 6 (only when dropout > 0) the dropout mask (B, num_heads, "
               "n_q, n_k), 0 or 1/(1-p), all ones in evaluation. With flash (the typed builder's "
               "choice when no weights are asked for) the weights are never stored: output 1 is "
               "the row log-sum-exp (B, num_heads, n_q) of the masked scores and output 6 the "
               "dropout key, i32 (3), neither with a gradient.",
           QKV_INPUTS_OPT(MHA_FIRST_OPTIONAL, "queries", "keys", "values", "w_q", "w_k", "w_v",
                          "w_o", "b_q", "b_k", "b_v", "b_o", "valid_lens", "mask"),
           QKV_OUTPUTS("out", "weights", "q_proj", "k_proj", "v_proj", "concat", "dropout_mask"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("num_heads", INT,
                                       "number of heads; must divide the hidden size H"),
                     QKV_ATTN_CAUSAL_ATTR, QKV_ATTN_DROPOUT_ATTR, QKV_ATTN_MASK_KIND_ATTR,
                     QKV_ATTN_FLASH_ATTR("(B, num_heads, n_q, 2)", "6"),
                     QKV_ATTN_FLASH_BLOCK_ATTRS),
           .flags = QKV_OP_RANDOM, .shape = forward_shape, .forward = forward_kernel,
           .gradient = mha_grad, .scratch_size = forward_scratch,
           /* the projections feed only the attention's products */
           .bf16_outputs = (1u << OUT_QP) | (1u << OUT_KP) | (1u << OUT_VP)),
    QKV_OP(.name = "multi_head_attention_backward",
           .doc = "gradients of multi_head_attention: dqueries, dkeys, dvalues, dw_q, dw_k, dw_v, "
                  "dw_o and, with has_bias, db_q, db_k, db_v, db_o. Inputs: queries, keys, values, "
                  "w_q, w_k, w_v, w_o, the forward outputs weights, q_proj, k_proj, v_proj, "
                  "concat, then the dropout mask when dropout > 0, dout when grad_out, dweights "
                  "when grad_weights, and valid_lens (i32) and mask (f32) when given to the "
                  "forward op. With grad_mask, one more output after those: dscores (B, num_heads, "
                  "n_q, n_k), the gradient of the scores. With flash the weights input is the "
                  "forward's row statistics and the dropout mask input its dropout key; the "
                  "weights are made again block by block.",
           QKV_INPUTS_OPT(BW_FIRST_OPTIONAL, "queries", "keys", "values", "w_q", "w_k", "w_v",
                          "w_o", "weights", "q_proj", "k_proj", "v_proj", "concat", "dropout_mask",
                          "dout", "dweights", "valid_lens", "mask"),
           QKV_OUTPUTS("dqueries", "dkeys", "dvalues", "dw_q", "dw_k", "dw_v", "dw_o", "db_q",
                       "db_k", "db_v", "db_o", "dscores"),
           QKV_ATTRS(QKV_REQUIRED_ATTR("num_heads", INT, "the forward op's"),
                     QKV_BOOL_ATTR("causal", FALSE, "the forward op's"),
                     QKV_FLOAT_ATTR("dropout", 0.0,
                                    "the forward op's; > 0: the dropout mask is an input"),
                     QKV_BOOL_ATTR("has_bias", FALSE,
                                   "the forward op had biases: output their gradients too"),
                     QKV_ATTN_GRAD_OUT_ATTR, QKV_ATTN_GRAD_WEIGHTS_ATTR,
                     QKV_ATTN_FORWARD_MASK_KIND_ATTR,
                     QKV_ATTN_GRAD_MASK_ATTR("(B, num_heads, n_q, n_k)"),
                     QKV_BOOL_ATTR("flash", FALSE,
                                   "the forward op's: the weights input is its row statistics and "
                                   "the dropout mask input its dropout key"),
                     QKV_ATTN_FLASH_BLOCK_ATTRS),
           .shape = mha_backward_shape, .forward = mha_backward_kernel,
           .scratch_size = mha_backward_scratch,
           .bf16_inputs = (1u << BW_QP) | (1u << BW_KP) | (1u << BW_VP)),
    QKV_OPS_END,
};

QkvValue *
qkv_multi_head_attention(QkvValue *queries, QkvValue *keys, QkvValue *values, QkvValue *w_q,
                         QkvValue *w_k, QkvValue *w_v, QkvValue *w_o, QkvValue *const *biases,
                         gint num_heads, QkvValue *valid_lens, gboolean causal, double dropout,
                         QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_multi_head_attention_masked(queries, keys, values, w_q, w_k, w_v, w_o, biases,
                                         num_heads, valid_lens, NULL, QKV_MASK_BOOLEAN, causal,
                                         dropout, weights, error);
}

QkvValue *
qkv_multi_head_attention_masked(QkvValue *queries, QkvValue *keys, QkvValue *values, QkvValue *w_q,
                                QkvValue *w_k, QkvValue *w_v, QkvValue *w_o,
                                QkvValue *const *biases, gint num_heads, QkvValue *valid_lens,
                                QkvValue *mask, QkvMaskKind kind, gboolean causal, double dropout,
                                QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("multi_head_attention", error, queries, keys, values);
  QKV_RETURN_IF_MISSING("multi_head_attention", error, w_q, w_k, w_v, w_o);
  if (biases != NULL)
    QKV_RETURN_IF_MISSING("multi_head_attention", error, biases[0], biases[1], biases[2],
                          biases[3]);
  MhaSlots in = mha_slots(
      (MhaSlots){.bias = biases != NULL, .valid_lens = valid_lens != NULL, .mask = mask != NULL});
  QkvValue *inputs[MHA_MAX_INPUTS] = {queries, keys, values, w_q, w_k, w_v, w_o};
  for (gint i = 0; i < 4 && in.bias >= 0; i++)
    inputs[in.bias + i] = biases[i];
  qkv_slot_put(inputs, in.valid_lens, valid_lens);
  qkv_slot_put(inputs, in.mask, mask);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "num_heads", g_variant_new_int32(num_heads));
  g_variant_builder_add(&attrs, "{sv}", "causal", g_variant_new_boolean(causal));
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  if (mask != NULL)
    g_variant_builder_add(&attrs, "{sv}", "mask_kind",
                          g_variant_new_string(qkv_attn_mask_kind_name(kind)));
  /* no weights asked for: the memory-efficient kernel, unless they are
   * small (see qkv_dot_product_attention_masked) */
  const QkvShape *qs = qkv_value_shape(queries), *ks = qkv_value_shape(keys);
  if (weights == NULL && qs->rank == 3 && ks->rank == 3 &&
      qkv_flash_wanted_for(qs->dims[0], MAX(num_heads, 1), qs->dims[1], ks->dims[1]))
    g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(queries), "multi_head_attention", inputs,
                                     in.n_inputs, g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return NULL;
  if (weights != NULL)
    *weights = qkv_node_output(node, OUT_WEIGHTS);
  return qkv_node_output(node, OUT_OUT);
}
