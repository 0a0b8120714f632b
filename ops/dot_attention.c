/* dot_attention.c: "dot_product_attention", the book's DotProductAttention
 * as one op, and its fused backward op.
 *
 * Per batch element: scores = q kᵀ / √d (cblas_sgemm), masked softmax over the
 * keys (attention-common.h), dropout on the weights in training, weights · v.
 * Batches of small products run in parallel, one product per thread.
 */
#include "flash-attention.h"
#include "error-private.h"

/* ---- where the optional inputs sit -----------------------------------------
 *
 * dot_product_attention: q, k, v, then valid_lens and the mask
 * (QkvAttnSlots from DOT_FIRST_OPTIONAL on). */
#define DOT_FIRST_OPTIONAL 3
#define DOT_MAX_INPUTS 5

/* dot_product_attention_backward: q, k, v, the forward weights (with flash
 * its row statistics), then out (flash only), the dropout mask (with flash
 * the dropout key), dout, dweights, valid_lens and the mask. Where each sits
 * (-1: absent): dot_backward_slots() takes the struct with each field saying
 * whether that input is present (nonzero) and lays them out in order. */
enum { BW_WEIGHTS = 3 };
#define DOT_MAX_BACKWARD_INPUTS 10
typedef struct {
  gint out, dropout_mask, dout, dweights, valid_lens, mask;
  guint n_inputs;
} DotBackwardSlots;

static DotBackwardSlots
dot_backward_slots(DotBackwardSlots present)
{
  DotBackwardSlots s = {.n_inputs = BW_WEIGHTS + 1};
  s.out = qkv_slot_next(&s.n_inputs, present.out, 1);
  s.dropout_mask = qkv_slot_next(&s.n_inputs, present.dropout_mask, 1);
  s.dout = qkv_slot_next(&s.n_inputs, present.dout, 1);
  s.dweights = qkv_slot_next(&s.n_inputs, present.dweights, 1);
  s.valid_lens = qkv_slot_next(&s.n_inputs, present.valid_lens, 1);
  s.mask = qkv_slot_next(&s.n_inputs, present.mask, 1);
  return s;
}

/* An existing node's: the attributes say which inputs there are, but for
 * valid_lens, which the count says. */
static gboolean
dot_backward_slots_of(guint n_inputs, const QkvAttrs *attrs, DotBackwardSlots *s)
{
  for (gint valid_lens = 0; valid_lens < 2; valid_lens++) {
    *s = dot_backward_slots((DotBackwardSlots){
        .out = qkv_attrs_get_bool(attrs, "flash"),
        .dropout_mask = qkv_attrs_get_float(attrs, "dropout") > 0.0,
        .dout = qkv_attrs_get_bool(attrs, "grad_out"),
        .dweights = qkv_attrs_get_bool(attrs, "grad_weights"),
        .valid_lens = valid_lens,
        .mask = qkv_attn_has_mask(attrs),
    });
    if (s->n_inputs == n_inputs)
      return TRUE;
  }
  return FALSE;
}

/* ---- forward ------------------------------------------------------------ */

/* q (B, n_q, d), k (B, n_k, d), v (B, n_k, d_v), all f32. */
static gboolean
check_qkv(QkvShapeCtx *ctx, GError **error)
{
  for (guint i = 0; i < 3; i++) {
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s must be f32, got %s",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
    if (ctx->in_shapes[i].rank != 3)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "%s must have rank 3 (batch, positions, features), got rank %d",
                             qkv_input_name(ctx, i), ctx->in_shapes[i].rank);
  }
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "q, k and v must have the same batch size");
  if (k->dims[2] != q->dims[2])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "q and k must have the same feature size d");
  if (v->dims[1] != k->dims[1])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "k and v must have the same number of keys");
  return qkv_attn_check_sizes(ctx, q->dims[0], 1, q->dims[1], k->dims[1],
                              MAX(q->dims[2], v->dims[2]), error);
}

static gboolean
forward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_qkv(ctx, error) || !qkv_attn_check_dropout(ctx, "dropout", error))
    return FALSE;
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  QkvAttnSlots in;
  if (!qkv_attn_check_mask_kind(ctx, error) || !qkv_flash_check_blocks(ctx, error))
    return FALSE;
  if (!qkv_attn_slots_of(DOT_FIRST_OPTIONAL, ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected q, k, v, then optional valid_lens, then a mask when "
                           "mask_kind is not \"none\"");
  gboolean per_query;
  if (in.valid_lens >= 0 && !qkv_attn_check_valid_lens(ctx, (guint)in.valid_lens, q->dims[0],
                                                       q->dims[1], &per_query, error))
    return FALSE;
  QkvShape scores = QKV_SHAPE(q->dims[0], q->dims[1], k->dims[1]);
  if (in.mask >= 0 && !qkv_attn_check_mask(ctx, (guint)in.mask, &scores, FALSE, error))
    return FALSE;
  gboolean flash = qkv_attrs_get_bool(ctx->attrs, "flash");
  ctx->out_shapes[0] = QKV_SHAPE(q->dims[0], q->dims[1], v->dims[2]);
  ctx->out_shapes[1] =
      flash ? QKV_SHAPE(q->dims[0], q->dims[1], 2) : QKV_SHAPE(q->dims[0], q->dims[1], k->dims[1]);
  ctx->n_outputs = 2;
  if (qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0) {
    ctx->out_shapes[2] = flash ? QKV_SHAPE(QKV_FLASH_KEY_LEN) : ctx->out_shapes[1];
    ctx->out_dtypes[2] = flash ? QKV_I32 : QKV_F32;
    ctx->n_outputs = 3;
  }
  return TRUE;
}

/* The problem of every batch element; values receives the description of
 * the mask input (may be NULL: none). */
static QkvAttnProblem
problem_of(const QkvShape *q, const QkvShape *k, const QkvShape *v, const QkvView *valid_lens,
           const QkvView *mask, QkvAttnScoreMask *values, const QkvAttrs *attrs)
{
  QkvAttnProblem pb = {0};
  pb.n_q = q->dims[1];
  pb.n_k = k->dims[1];
  pb.d = q->dims[2];
  pb.d_v = v->dims[2];
  pb.ldq = pb.ldk = pb.d;
  pb.ldv = pb.ldo = pb.d_v;
  pb.scale = pb.d > 0 ? (float)(1.0 / sqrt((double)pb.d)) : 1.0f;
  pb.dropout = qkv_attrs_get_float(attrs, "dropout");
  pb.mask =
      qkv_attn_mask_from_view(valid_lens, pb.n_q, pb.n_q, qkv_attrs_get_bool(attrs, "causal"));
  if (mask != NULL) {
    QkvShape scores = QKV_SHAPE(q->dims[0], pb.n_q, pb.n_k);
    qkv_attn_score_mask_init(values, mask, &scores, FALSE, qkv_attn_mask_additive(attrs));
    pb.mask.values = values;
  }
  return pb;
}

static gsize
forward_scratch_per_thread(const QkvShape *q, const QkvShape *k, const QkvAttrs *attrs)
{
  if (qkv_attrs_get_float(attrs, "dropout") <= 0.0)
    return 0;
  return (gsize)(q->dims[1] * k->dims[1]) * sizeof(float);
}

/* The flash kernels' layout of the batch elements. */
static QkvFlashLayout
flash_layout_of(const QkvAttnProblem *pb, gint64 batch, const QkvAttrs *attrs)
{
  QkvFlashLayout L = {0};
  L.pb = *pb;
  L.heads = 1;
  L.n_problems = batch;
  L.q_batch = pb->n_q * pb->d;
  L.k_batch = pb->n_k * pb->d;
  L.v_batch = pb->n_k * pb->d_v;
  L.o_batch = pb->n_q * pb->d_v;
  L.block_q = qkv_attrs_get_int(attrs, "block_q");
  L.block_k = qkv_attrs_get_int(attrs, "block_k");
  return L;
}

static gsize
forward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  if (qkv_attrs_get_bool(ctx->attrs, "flash"))
    return qkv_flash_forward_scratch(q->dims[1], k->dims[1], q->dims[2], v->dims[2],
                                     qkv_attrs_get_int(ctx->attrs, "block_q"),
                                     qkv_attrs_get_int(ctx->attrs, "block_k"), n_threads);
  return (gsize)MAX(n_threads, 1) *
         forward_scratch_per_thread(&ctx->in_shapes[0], &ctx->in_shapes[1], ctx->attrs);
}

typedef struct {
  const QkvKernelCtx *ctx;
  const QkvAttnProblem *pb;
  const float *q, *k, *v;
  float *p, *drop, *out;
  gint64 fpt; /* scratch floats per thread, 0 without dropout */
} DotForwardJob;

/* Batch elements [begin, end), with this thread's dropout scratch. */
static void
dot_forward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const DotForwardJob *j = user_data;
  const QkvAttnProblem *pb = j->pb;
  const gint64 nn = pb->n_q * pb->n_k;
  float *pd = j->fpt > 0 ? (float *)j->ctx->scratch + thread * j->fpt : NULL;
  for (gint64 b = begin; b < end; b++)
    qkv_attn_forward_problem(j->ctx, pb, b, j->q + b * pb->n_q * pb->d, j->k + b * pb->n_k * pb->d,
                             j->v + b * pb->n_k * pb->d_v, j->p + b * nn,
                             j->drop ? j->drop + b * nn : NULL, pd, j->out + b * pb->n_q * pb->d_v);
}

static void
forward_kernel(const QkvKernelCtx *ctx)
{
  const QkvShape *qs = &ctx->in[0].shape, *ks = &ctx->in[1].shape, *vs = &ctx->in[2].shape;
  QkvAttnSlots in;
  qkv_attn_slots_of(DOT_FIRST_OPTIONAL, ctx->n_inputs, ctx->attrs, &in);
  QkvAttnScoreMask values;
  QkvAttnProblem pb = problem_of(qs, ks, vs, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                 in.mask >= 0 ? &ctx->in[in.mask] : NULL, &values, ctx->attrs);
  gint64 batch = qs->dims[0], nn = pb.n_q * pb.n_k;
  const float *q = ctx->in[0].data, *k = ctx->in[1].data, *v = ctx->in[2].data;
  float *out = ctx->out[0].data, *p = ctx->out[1].data;
  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = flash_layout_of(&pb, batch, ctx->attrs);
    if (ctx->n_outputs > 2) {
      qkv_flash_write_key(ctx, pb.dropout, ctx->out[2].data);
      qkv_flash_read_key(&L, ctx->out[2].data);
    }
    qkv_flash_forward(ctx, &L, q, k, v, out, p);
    return;
  }
  float *drop = ctx->n_outputs > 2 ? ctx->out[2].data : NULL;
  gsize per_thread = forward_scratch_per_thread(qs, ks, ctx->attrs);
  gint nt =
      qkv_attn_problem_threads(ctx, batch, nn * MAX(pb.d, pb.d_v), per_thread, ctx->scratch_size);
  gint64 fpt = (gint64)(per_thread / sizeof(float));
  DotForwardJob job = {ctx, &pb, q, k, v, p, drop, out, per_thread > 0 ? fpt : 0};
  qkv_parallel_for(nt, batch, dot_forward_problems, &job);
}

/* ---- backward ----------------------------------------------------------- */

static gboolean
backward_shape(QkvShapeCtx *ctx, GError **error)
{
  DotBackwardSlots in;
  if (!dot_backward_slots_of(ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected q, k, v, weights (with flash: the row statistics and "
                           "out), then dropout_mask (dropout > 0; with flash the dropout key), "
                           "dout (grad_out), dweights (grad_weights), optional valid_lens (i32) "
                           "and mask (f32)");
  if (!check_qkv(ctx, error))
    return FALSE;
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  QkvShape wshape = QKV_SHAPE(q->dims[0], q->dims[1], k->dims[1]);
  QkvShape oshape = QKV_SHAPE(q->dims[0], q->dims[1], v->dims[2]);
  gboolean flash = qkv_attrs_get_bool(ctx->attrs, "flash");
  QkvShape lse_shape = QKV_SHAPE(q->dims[0], q->dims[1], 2),
           key_shape = QKV_SHAPE(QKV_FLASH_KEY_LEN);
  if (flash && (in.dweights >= 0 || in.dout < 0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "flash takes dout (grad_out) and no dweights (grad_weights)");
  struct {
    gint index;
    const gchar *name;
    const QkvShape *shape;
    QkvDType dtype;
  } checks[] = {
      {BW_WEIGHTS, flash ? "row_stats" : "weights", flash ? &lse_shape : &wshape, QKV_F32},
      {in.out, "out", &oshape, QKV_F32},
      {in.dropout_mask, flash ? "dropout_key" : "dropout_mask", flash ? &key_shape : &wshape,
       flash ? QKV_I32 : QKV_F32},
      {in.dout, "dout", &oshape, QKV_F32},
      {in.dweights, "dweights", &wshape, QKV_F32}};
  for (guint c = 0; c < G_N_ELEMENTS(checks); c++) {
    gint i = checks[c].index;
    if (i >= 0 && (ctx->in_dtypes[i] != checks[c].dtype ||
                   !qkv_shape_equal(&ctx->in_shapes[i], checks[c].shape))) {
      g_autofree gchar *want = qkv_shape_to_string(checks[c].shape);
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "%s must be %s%s", checks[c].name,
                             qkv_dtype_name(checks[c].dtype), want);
    }
  }
  gboolean per_query;
  if (in.valid_lens >= 0 && !qkv_attn_check_valid_lens(ctx, (guint)in.valid_lens, q->dims[0],
                                                       q->dims[1], &per_query, error))
    return FALSE;
  if (in.mask >= 0 && !qkv_attn_check_mask(ctx, (guint)in.mask, &wshape, FALSE, error))
    return FALSE;
  if (!qkv_attn_check_mask_kind(ctx, error) || !qkv_flash_check_blocks(ctx, error))
    return FALSE;
  ctx->n_outputs = 3;
  for (guint i = 0; i < 3; i++)
    ctx->out_shapes[i] = ctx->in_shapes[i];
  if (qkv_attrs_get_bool(ctx->attrs, "grad_mask")) {
    ctx->out_shapes[3] = wshape;
    ctx->n_outputs = 4;
  }
  return TRUE;
}

static gsize
backward_scratch_per_thread(const QkvShape *q, const QkvShape *k)
{
  return 2 * (gsize)(q->dims[1] * k->dims[1]) * sizeof(float);
}

static gsize
backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  if (qkv_attrs_get_bool(ctx->attrs, "flash"))
    return qkv_flash_backward_scratch(q->dims[0], q->dims[1], k->dims[1], q->dims[2], v->dims[2],
                                      qkv_attrs_get_int(ctx->attrs, "block_q"),
                                      qkv_attrs_get_int(ctx->attrs, "block_k"), n_threads);
  return (gsize)MAX(n_threads, 1) *
         backward_scratch_per_thread(&ctx->in_shapes[0], &ctx->in_shapes[1]);
}

typedef struct {
  const QkvAttnProblem *pb;
  const float *q, *k, *v, *p, *drop, *dout, *dw;
  float *scratch; /* 2·n_q·n_k floats per thread, or NULL */
  float *dq, *dk, *dv;
  float *dscores; /* the gradient of the scores (B, n_q, n_k), or NULL */
} DotBackwardJob;

static void
dot_backward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const DotBackwardJob *j = user_data;
  const QkvAttnProblem *pb = j->pb;
  const gint64 nn = pb->n_q * pb->n_k;
  float *pd = j->scratch != NULL ? j->scratch + thread * 2 * nn : NULL;
  for (gint64 b = begin; b < end; b++) {
    float *dp = j->dscores != NULL ? j->dscores + b * nn : pd ? pd + nn : NULL;
    qkv_attn_backward_problem(
        pb, b, j->dout ? j->dout + b * pb->n_q * pb->d_v : NULL, j->q + b * pb->n_q * pb->d,
        j->k + b * pb->n_k * pb->d, j->v + b * pb->n_k * pb->d_v, j->p + b * nn,
        j->drop ? j->drop + b * nn : NULL, j->dw ? j->dw + b * nn : NULL, pd, dp,
        j->dq + b * pb->n_q * pb->d, j->dk + b * pb->n_k * pb->d, j->dv + b * pb->n_k * pb->d_v);
  }
}

static void
backward_kernel(const QkvKernelCtx *ctx)
{
  DotBackwardSlots in;
  dot_backward_slots_of(ctx->n_inputs, ctx->attrs, &in);
  const QkvShape *qs = &ctx->in[0].shape, *ks = &ctx->in[1].shape, *vs = &ctx->in[2].shape;
  QkvAttnScoreMask values;
  QkvAttnProblem pb = problem_of(qs, ks, vs, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                 in.mask >= 0 ? &ctx->in[in.mask] : NULL, &values, ctx->attrs);
  gint64 batch = qs->dims[0], nn = pb.n_q * pb.n_k;
  const float *q = ctx->in[0].data, *k = ctx->in[1].data, *v = ctx->in[2].data;
  const float *p = ctx->in[BW_WEIGHTS].data;
  const float *drop = in.dropout_mask >= 0 ? ctx->in[in.dropout_mask].data : NULL;
  const float *dout = in.dout >= 0 ? ctx->in[in.dout].data : NULL;
  const float *dw = in.dweights >= 0 ? ctx->in[in.dweights].data : NULL;
  float *dq = ctx->out[0].data, *dk = ctx->out[1].data, *dv = ctx->out[2].data;
  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = flash_layout_of(&pb, batch, ctx->attrs);
    if (in.dropout_mask >= 0)
      qkv_flash_read_key(&L, ctx->in[in.dropout_mask].data);
    qkv_flash_backward(ctx, &L, q, k, v, ctx->in[in.out].data, p, dout, dq, dk, dv,
                       ctx->n_outputs > 3 ? ctx->out[3].data : NULL);
    return;
  }
  gsize per_thread = backward_scratch_per_thread(qs, ks);
  gint nt =
      qkv_attn_problem_threads(ctx, batch, nn * MAX(pb.d, pb.d_v), per_thread, ctx->scratch_size);
  float *dscores = ctx->n_outputs > 3 ? ctx->out[3].data : NULL;
  DotBackwardJob job = {&pb, q, k, v, p, drop, dout, dw, ctx->scratch, dq, dk, dv, dscores};
  qkv_parallel_for(nt, batch, dot_backward_problems, &job);
}

/* The weights output is differentiable too (a gradient reaching it joins the
 * one coming back through dropout and v); the dropout mask is not. An
 * additive mask's gradient is the scores' gradient (the backward op's
 * dscores) summed to the mask's shape. */
static gboolean
forward_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dout = g->out_grads[0], *dw = g->out_grads[1];
  QkvAttnSlots in;
  qkv_attn_slots_of(DOT_FIRST_OPTIONAL, g->n_inputs, g->attrs, &in);
  gint mi = in.mask;
  gboolean mask_grad = mi >= 0 && qkv_attn_mask_additive(g->attrs) && g->needs_grad[mi];
  if ((dout == NULL && dw == NULL) ||
      !(g->needs_grad[0] || g->needs_grad[1] || g->needs_grad[2] || mask_grad))
    return TRUE;
  double dropout = qkv_attrs_get_float(g->attrs, "dropout");
  gboolean flash = qkv_attrs_get_bool(g->attrs, "flash");
  /* with flash, output 1 is the row statistics: it has no gradient */
  if (flash) {
    dw = NULL;
    if (dout == NULL)
      return TRUE;
  }
  DotBackwardSlots bw = dot_backward_slots((DotBackwardSlots){
      .out = flash,
      .dropout_mask = dropout > 0.0,
      .dout = dout != NULL,
      .dweights = dw != NULL,
      .valid_lens = in.valid_lens >= 0,
      .mask = in.mask >= 0,
  });
  QkvValue *inputs[DOT_MAX_BACKWARD_INPUTS] = {g->inputs[0], g->inputs[1], g->inputs[2],
                                               g->outputs[1]};
  qkv_slot_put(inputs, bw.out, g->outputs[0]);
  qkv_slot_put(inputs, bw.dropout_mask, g->outputs[2]);
  qkv_slot_put(inputs, bw.dout, dout);
  qkv_slot_put(inputs, bw.dweights, dw);
  qkv_slot_put(inputs, bw.valid_lens, in.valid_lens >= 0 ? g->inputs[in.valid_lens] : NULL);
  qkv_slot_put(inputs, bw.mask, in.mask >= 0 ? g->inputs[in.mask] : NULL);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  qkv_attn_pass_on_attrs(&attrs, g->attrs);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  g_variant_builder_add(&attrs, "{sv}", "grad_out", g_variant_new_boolean(dout != NULL));
  g_variant_builder_add(&attrs, "{sv}", "grad_weights", g_variant_new_boolean(dw != NULL));
  g_variant_builder_add(&attrs, "{sv}", "grad_mask", g_variant_new_boolean(mask_grad));
  QkvNode *node = qkv_graph_add_node(g->graph, "dot_product_attention_backward", inputs,
                                     bw.n_inputs, g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < 3; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  if (mask_grad) {
    g->in_grads[mi] = qkv_sum_to(qkv_node_output(node, 3), qkv_value_shape(g->inputs[mi]), error);
    if (g->in_grads[mi] == NULL)
      return FALSE;
  }
  return TRUE;
}

const QkvOpDef qkv_ops_dot_attention[] = {
    QKV_OP(.name = "dot_product_attention",
           .doc = "d2l's DotProductAttention: out = dropout(masked_softmax(q kᵀ / √d)) v for q (B, "
                  "n_q, d), k (B, n_k, d), v (B, n_k, d_v), optional valid_lens i32 (B) or (B, "
                  "n_q) and optional mask f32 broadcasting to (B, n_q, n_k) (mask_kind), as for "
                  "masked_softmax. Outputs: 0 out (B, n_q, d_v); 1 weights (B, n_q, n_k) before "
                  "dropout (differentiable); 2 (only when dropout > 0) the dropout mask, 0 or "
                  "1/(1-p), all ones in evaluation, saved for the backward (no gradient). With "
                  "flash (the typed builder's choice when no weights are asked for) the weights "
                  "are never stored: output 1 is the row statistics (B, n_q, 2) of the masked "
                  "scores (maximum m, log Σ exp(s − m)) and output 2 the dropout key, i32 (3), "
                  "neither with a gradient.",
           QKV_INPUTS_OPT(3, "q", "k", "v", "valid_lens", "mask"),
           QKV_OUTPUTS("out", "weights", "dropout_mask"),
           QKV_ATTRS(QKV_ATTN_CAUSAL_ATTR, QKV_ATTN_DROPOUT_ATTR, QKV_ATTN_MASK_KIND_ATTR,
                     QKV_ATTN_FLASH_ATTR("(B, n_q, 2)", "2"), QKV_ATTN_FLASH_BLOCK_ATTRS),
           .flags = QKV_OP_RANDOM, .shape = forward_shape, .forward = forward_kernel,
           .gradient = forward_grad, .scratch_size = forward_scratch),
    QKV_OP(.name = "dot_product_attention_backward",
           .doc =
               "dq, dk, dv of dot_product_attention. Inputs: q, k, v, the forward weights, then "
               "the dropout mask when dropout > 0, dout when grad_out, dweights when grad_weights, "
               "and valid_lens (i32) and mask (f32) when given to the forward op. Outputs dq, dk, "
               "dv, and with grad_mask dscores (B, n_q, n_k), the gradient of q kᵀ/√d (+ mask). "
               "With flash: q, k, v, the row statistics, out, the dropout key when dropout > 0, "
               "dout, then valid_lens and mask; the weights are made again block by block.",
           /* the flash layout has out after the statistics: one input more than named */
           .min_inputs = 4, .max_inputs = DOT_MAX_BACKWARD_INPUTS,
           .input_names = QKV_NAMES("q", "k", "v", "weights", "dropout_mask", "dout", "dweights",
                                    "valid_lens", "mask"),
           QKV_OUTPUTS("dq", "dk", "dv", "dscores"),
           QKV_ATTRS(QKV_BOOL_ATTR("causal", FALSE, "the forward op's causal"),
                     QKV_FLOAT_ATTR("dropout", 0.0,
                                    "the forward op's dropout; > 0: the dropout mask is an input"),
                     QKV_ATTN_GRAD_OUT_ATTR, QKV_ATTN_GRAD_WEIGHTS_ATTR,
                     QKV_ATTN_FORWARD_MASK_KIND_ATTR, QKV_ATTN_GRAD_MASK_ATTR("(B, n_q, n_k)"),
                     QKV_BOOL_ATTR("flash", FALSE,
                                   "the forward op's: input 3 is its row statistics, input 4 its "
                                   "out, and the dropout key replaces the dropout mask"),
                     QKV_ATTN_FLASH_BLOCK_ATTRS),
           .shape = backward_shape, .forward = backward_kernel, .scratch_size = backward_scratch),
    QKV_OPS_END,
};

QkvValue *
qkv_dot_product_attention(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *valid_lens,
                          gboolean causal, double dropout, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_dot_product_attention_masked(q, k, v, valid_lens, NULL, QKV_MASK_BOOLEAN, causal,
                                          dropout, weights, error);
}

QkvValue *
qkv_dot_product_attention_masked(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *valid_lens,
                                 QkvValue *mask, QkvMaskKind kind, gboolean causal, double dropout,
                                 QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("dot_product_attention", error, q, k, v);
  QkvAttnSlots in = qkv_attn_slots(DOT_FIRST_OPTIONAL, valid_lens != NULL, mask != NULL);
  QkvValue *inputs[DOT_MAX_INPUTS] = {q, k, v};
  qkv_slot_put(inputs, in.valid_lens, valid_lens);
  qkv_slot_put(inputs, in.mask, mask);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "causal", g_variant_new_boolean(causal));
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  if (mask != NULL)
    g_variant_builder_add(&attrs, "{sv}", "mask_kind",
                          g_variant_new_string(qkv_attn_mask_kind_name(kind)));
  /* Without a weights output the weights need not be stored: the
   * memory-efficient kernel runs (decided here, when the graph is built,
   * since that is where the caller says whether it wants them), unless
   * they are small. */
  const QkvShape *qs = qkv_value_shape(q), *ks = qkv_value_shape(k);
  if (weights == NULL && qs->rank == 3 && ks->rank == 3 &&
      qkv_flash_wanted_for(qs->dims[0], 1, qs->dims[1], ks->dims[1]))
    g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(q), "dot_product_attention", inputs,
                                     in.n_inputs, g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return NULL;
  if (weights != NULL)
    *weights = qkv_node_output(node, 1);
  return qkv_node_output(node, 0);
}
