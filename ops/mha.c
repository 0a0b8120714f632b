/* mha.c: "multi_head_attention", the book's MultiHeadAttention as one op,
 * and its fused backward op.
 *
 * The projections are single tall products x Wᵀ (+ b) over all batch rows.
 * Head h of a projection is its column block h·dh … (h+1)·dh − 1, exactly the
 * book's transpose_qkv, so the per-head attention reads and writes those
 * blocks in place (row stride H) and the heads' results land directly in the
 * concatenation that transpose_output would build. Valid lengths are shared
 * by the heads of a batch element (the book's repeat_interleave).
 */
#include "flash-attention.h"

/* Output indices of the forward op. */
enum { OUT_OUT, OUT_WEIGHTS, OUT_QP, OUT_KP, OUT_VP, OUT_CONCAT, OUT_MASK };

/* ---- where the optional inputs sit -----------------------------------------
 *
 * Each slots struct says where a node's optional inputs sit (-1: absent).
 * Its function takes the same struct with each field saying whether that
 * input is present (nonzero) and lays them out in order after the required
 * inputs; the _of function finds the layout of an existing node. */

/* multi_head_attention: queries, keys, values, w_q, w_k, w_v, w_o, then
 * the biases b_q, b_k, b_v, b_o (all four or none; bias is b_q's slot),
 * valid_lens and the mask. */
#define MHA_FIRST_OPTIONAL 7
#define MHA_MAX_INPUTS 13
typedef struct {
  gint bias, valid_lens, mask;
  guint n_inputs;
} MhaSlots;

static MhaSlots
mha_slots(MhaSlots present)
{
  MhaSlots s = {.n_inputs = MHA_FIRST_OPTIONAL};
  s.bias = qkv_slot_next(&s.n_inputs, present.bias, 4);
  s.valid_lens = qkv_slot_next(&s.n_inputs, present.valid_lens, 1);
  s.mask = qkv_slot_next(&s.n_inputs, present.mask, 1);
  return s;
}

/* mask_kind says whether there is a mask, the count whether there are
 * biases and valid lengths (no two choices give the same count). */
static gboolean
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

/* multi_head_attention_backward: the forward's required inputs, its outputs
 * weights (with flash the row statistics), q_proj, k_proj, v_proj and
 * concat, then the dropout mask (with flash the dropout key), dout,
 * dweights, valid_lens and the mask. */
enum { BW_WEIGHTS = MHA_FIRST_OPTIONAL, BW_QP, BW_KP, BW_VP, BW_CONCAT, BW_FIRST_OPTIONAL };
#define MHA_MAX_BACKWARD_INPUTS 17
typedef struct {
  gint dropout_mask, dout, dweights, valid_lens, mask;
  guint n_inputs;
} MhaBackwardSlots;

static MhaBackwardSlots
mha_backward_slots(MhaBackwardSlots present)
{
  MhaBackwardSlots s = {.n_inputs = BW_FIRST_OPTIONAL};
  s.dropout_mask = qkv_slot_next(&s.n_inputs, present.dropout_mask, 1);
  s.dout = qkv_slot_next(&s.n_inputs, present.dout, 1);
  s.dweights = qkv_slot_next(&s.n_inputs, present.dweights, 1);
  s.valid_lens = qkv_slot_next(&s.n_inputs, present.valid_lens, 1);
  s.mask = qkv_slot_next(&s.n_inputs, present.mask, 1);
  return s;
}

/* The attributes say which inputs there are, but for valid_lens, which the
 * count says. */
static gboolean
mha_backward_slots_of(guint n_inputs, const QkvAttrs *attrs, MhaBackwardSlots *s)
{
  for (gint valid_lens = 0; valid_lens < 2; valid_lens++) {
    *s = mha_backward_slots((MhaBackwardSlots){
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

/* The sizes of one node. */
typedef struct {
  gint64 batch, n_q, n_k, d_q, d_k, d_v, hidden, heads, dh;
} MhaDims;

static MhaDims
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

/* Checks the forward inputs 0..6 (and the biases at bias_index.. if
 * bias_index ≥ 0) and the heads. */
static gboolean
check_inputs(QkvShapeCtx *ctx, gint bias_index, GError **error)
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
  if (!check_inputs(ctx, in.bias, error))
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

/* The attention problem of one (batch, head): operands are column blocks of
 * the (rows, H) projections. values receives the description of the mask
 * input (may be NULL: none). */
static QkvAttnProblem
problem_of(const MhaDims *d, const QkvView *valid_lens, const QkvView *mask,
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

/* Threads for the (batch, head) problems. */
static gint
problem_threads(const QkvKernelCtx *ctx, const MhaDims *d, gsize per_thread, gsize available)
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

/* The flash kernels' layout of the (batch, head) problems: column blocks of
 * the projections, as the weights path reads them. */
static QkvFlashLayout
flash_layout_of(const QkvAttnProblem *pb, const MhaDims *d, const QkvAttrs *attrs)
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
  if (qkv_attrs_get_bool(ctx->attrs, "flash"))
    return qkv_flash_forward_scratch(d.n_q, d.n_k, d.dh, d.dh,
                                     qkv_attrs_get_int(ctx->attrs, "block_q"),
                                     qkv_attrs_get_int(ctx->attrs, "block_k"), n_threads);
  return (gsize)MAX(n_threads, 1) * forward_scratch_per_thread(&d, ctx->attrs);
}

/* The (batch, head) attention problems, forward or backward. */
typedef struct {
  const QkvKernelCtx *ctx;
  const QkvAttnProblem *pb;
  const MhaDims *d;
  const float *proj[3];
  float *weights, *mask, *concat; /* forward outputs */
  const float *p, *drop, *dw;     /* backward inputs */
  const float *dconcat;
  float *dproj[3];
  float *scratch;        /* per-thread scratch, or NULL */
  gint64 scratch_floats; /* per thread */
  float *dscores;        /* backward: the scores' gradient (B, heads, n_q, n_k), or NULL */
} MhaProblemsJob;

static void
mha_forward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MhaProblemsJob *j = user_data;
  const MhaDims *d = j->d;
  const gint64 nn = d->n_q * d->n_k;
  float *pd = j->scratch != NULL ? j->scratch + thread * j->scratch_floats : NULL;
  for (gint64 idx = begin; idx < end; idx++) {
    gint64 b = idx / d->heads, h = idx % d->heads;
    qkv_attn_forward_problem(j->ctx, j->pb, idx, j->proj[0] + b * d->n_q * d->hidden + h * d->dh,
                             j->proj[1] + b * d->n_k * d->hidden + h * d->dh,
                             j->proj[2] + b * d->n_k * d->hidden + h * d->dh, j->weights + idx * nn,
                             j->mask ? j->mask + idx * nn : NULL, pd,
                             j->concat + b * d->n_q * d->hidden + h * d->dh);
  }
}

static void
mha_backward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MhaProblemsJob *j = user_data;
  const MhaDims *d = j->d;
  const gint64 nn = d->n_q * d->n_k;
  float *pd = j->scratch + thread * j->scratch_floats;
  for (gint64 idx = begin; idx < end; idx++) {
    gint64 b = idx / d->heads, h = idx % d->heads;
    gint64 qoff = b * d->n_q * d->hidden + h * d->dh, koff = b * d->n_k * d->hidden + h * d->dh;
    qkv_attn_backward_problem(j->pb, idx, j->dconcat + qoff, j->proj[0] + qoff, j->proj[1] + koff,
                              j->proj[2] + koff, j->p + idx * nn,
                              j->drop ? j->drop + idx * nn : NULL, j->dw ? j->dw + idx * nn : NULL,
                              pd, j->dscores != NULL ? j->dscores + idx * nn : pd + nn,
                              j->dproj[0] + qoff, j->dproj[1] + koff, j->dproj[2] + koff);
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
  QkvAttnProblem pb = problem_of(&d, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                 in.mask >= 0 ? &ctx->in[in.mask] : NULL, &values, ctx->attrs);
  const float *x[3], *w[4], *bias[4];
  for (guint i = 0; i < 4; i++) {
    if (i < 3)
      x[i] = ctx->in[i].data;
    w[i] = ctx->in[3 + i].data;
    bias[i] = in.bias >= 0 ? ctx->in[(guint)in.bias + i].data : NULL;
  }
  float *out = ctx->out[OUT_OUT].data, *p = ctx->out[OUT_WEIGHTS].data;
  float *proj[3] = {ctx->out[OUT_QP].data, ctx->out[OUT_KP].data, ctx->out[OUT_VP].data};
  float *concat = ctx->out[OUT_CONCAT].data;
  float *drop = ctx->n_outputs > OUT_MASK ? ctx->out[OUT_MASK].data : NULL;
  gint64 rows[3] = {d.batch * d.n_q, d.batch * d.n_k, d.batch * d.n_k};
  gint64 in_size[3] = {d.d_q, d.d_k, d.d_v};

  for (guint i = 0; i < 3; i++)
    project(rows[i], in_size[i], d.hidden, x[i], w[i], bias[i], proj[i]);

  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = flash_layout_of(&pb, &d, ctx->attrs);
    if (drop != NULL) {
      qkv_flash_write_key(ctx, pb.dropout, (gint32 *)drop);
      qkv_flash_read_key(&L, (const gint32 *)drop);
    }
    qkv_flash_forward(ctx, &L, proj[0], proj[1], proj[2], concat, p);
    project(rows[0], d.hidden, d.hidden, concat, w[3], bias[3], out);
    return;
  }
  gsize per_thread = forward_scratch_per_thread(&d, ctx->attrs);
  gint nt = problem_threads(ctx, &d, per_thread, ctx->scratch_size);
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

/* ---- backward ----------------------------------------------------------- */

static gboolean
backward_shape(QkvShapeCtx *ctx, GError **error)
{
  MhaBackwardSlots in;
  if (!mha_backward_slots_of(ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected queries, keys, values, w_q, w_k, w_v, w_o, weights, q_proj, "
                           "k_proj, v_proj, concat, then dropout_mask (dropout > 0), dout "
                           "(grad_out), dweights (grad_weights), optional valid_lens (i32) and "
                           "mask (f32)");
  if (!check_inputs(ctx, -1, error))
    return FALSE;
  MhaDims d = mha_dims(ctx->in_shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  QkvShape wshape = QKV_SHAPE(d.batch, d.heads, d.n_q, d.n_k);
  QkvShape qshape = QKV_SHAPE(d.batch, d.n_q, d.hidden);
  QkvShape kshape = QKV_SHAPE(d.batch, d.n_k, d.hidden);
  gboolean flash = qkv_attrs_get_bool(ctx->attrs, "flash");
  QkvShape lse_shape = QKV_SHAPE(d.batch, d.heads, d.n_q, 2),
           key_shape = QKV_SHAPE(QKV_FLASH_KEY_LEN);
  if (flash && (in.dweights >= 0 || in.dout < 0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "flash takes dout (grad_out) and no dweights (grad_weights)");
  struct {
    gint index;
    const QkvShape *shape;
    QkvDType dtype;
  } checks[] = {{BW_WEIGHTS, flash ? &lse_shape : &wshape, QKV_F32},
                {BW_QP, &qshape, QKV_F32},
                {BW_KP, &kshape, QKV_F32},
                {BW_VP, &kshape, QKV_F32},
                {BW_CONCAT, &qshape, QKV_F32},
                {in.dropout_mask, flash ? &key_shape : &wshape, flash ? QKV_I32 : QKV_F32},
                {in.dout, &qshape, QKV_F32},
                {in.dweights, &wshape, QKV_F32}};
  for (guint c = 0; c < G_N_ELEMENTS(checks); c++) {
    gint i = checks[c].index;
    if (i >= 0 && (ctx->in_dtypes[i] != checks[c].dtype ||
                   !qkv_shape_equal(&ctx->in_shapes[i], checks[c].shape))) {
      g_autofree gchar *want = qkv_shape_to_string(checks[c].shape);
      const gchar *name = i == in.dropout_mask       ? (flash ? "dropout_key" : "dropout_mask")
                          : i == in.dout             ? "dout"
                          : i == in.dweights         ? "dweights"
                          : i == BW_WEIGHTS && flash ? "row_stats"
                                                     : qkv_input_name(ctx, (guint)i);
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "%s must be %s%s", name,
                             qkv_dtype_name(checks[c].dtype), want);
    }
  }
  gboolean per_query;
  if (in.valid_lens >= 0 &&
      !qkv_attn_check_valid_lens(ctx, (guint)in.valid_lens, d.batch, d.n_q, &per_query, error))
    return FALSE;
  if (in.mask >= 0 && !qkv_attn_check_mask(ctx, (guint)in.mask, &wshape, TRUE, error))
    return FALSE;
  if (!qkv_attn_check_mask_kind(ctx, error) || !qkv_flash_check_blocks(ctx, error))
    return FALSE;
  ctx->n_outputs = 7;
  for (guint i = 0; i < 7; i++)
    ctx->out_shapes[i] = ctx->in_shapes[i];
  if (qkv_attrs_get_bool(ctx->attrs, "has_bias")) {
    ctx->n_outputs = 11;
    for (guint i = 7; i < 11; i++)
      ctx->out_shapes[i] = QKV_SHAPE(d.hidden);
  }
  /* the scores' gradient comes last */
  if (qkv_attrs_get_bool(ctx->attrs, "grad_mask"))
    ctx->out_shapes[ctx->n_outputs++] = wshape;
  return TRUE;
}

static gsize
backward_scratch_per_thread(const MhaDims *d)
{
  return 2 * (gsize)(d->n_q * d->n_k) * sizeof(float);
}

/* The largest rows × columns matrix the zero-row skipping gathers: dout or
 * concat (B·n_q × H), or one of the inputs. */
static gint64
gather_floats(const MhaDims *d)
{
  gint64 q = d->batch * d->n_q, k = d->batch * d->n_k;
  return MAX(MAX(q * d->hidden, q * d->d_q), MAX(k * d->d_k, k * d->d_v));
}

/* dC, dQp (B·n_q × H each), dKp, dVp (B·n_k × H each), two gather buffers,
 * row indices (max(B·n_q, B·n_k); an even number of floats before them keeps
 * them aligned), then per-thread attention scratch. */
static gsize
backward_shared_scratch(const MhaDims *d)
{
  return (gsize)(2 * d->batch * d->n_q * d->hidden + 2 * d->batch * d->n_k * d->hidden +
                 2 * gather_floats(d)) *
             sizeof(float) +
         (gsize)MAX(d->batch * d->n_q, d->batch * d->n_k) * sizeof(gint64);
}

static gsize
backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  MhaDims d = mha_dims(ctx->in_shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  if (qkv_attrs_get_bool(ctx->attrs, "flash"))
    return backward_shared_scratch(&d) +
           qkv_flash_backward_scratch(d.batch * d.heads, d.n_q, d.n_k, d.dh, d.dh,
                                      qkv_attrs_get_int(ctx->attrs, "block_q"),
                                      qkv_attrs_get_int(ctx->attrs, "block_k"), n_threads);
  return backward_shared_scratch(&d) + (gsize)MAX(n_threads, 1) * backward_scratch_per_thread(&d);
}

/* db (H) = Σ over rows of x (rows, H). */
static void
column_sums(gint64 rows, gint64 hidden, const float *x, float *db)
{
  memset(db, 0, (gsize)hidden * sizeof(float));
  for (gint64 r = 0; r < rows; r++)
    for (gint64 j = 0; j < hidden; j++)
      db[j] += x[r * hidden + j];
}

/* For proj = x · wᵀ (+ b): dx (rows × in) = dproj · w, dw (H × in) = dprojᵀ ·
 * x, db = column sums of dproj, over the rows of dproj that are not zero
 * (ops-common.h). dproj is scratch and is compacted in place; xbuf holds the
 * gathered rows of x. */
static void
projection_backward(const QkvKernelCtx *ctx, gint64 rows, gint64 in, gint64 hidden, float *dproj,
                    const float *x, const float *w, float *dx, float *dw, float *db, gint64 *index,
                    float *xbuf)
{
  gint64 m = rows > 0 ? qkv_nonzero_rows(dproj, rows, hidden, hidden, index) : 0;
  gboolean compact = qkv_compact_pays(m, rows, hidden * in);
  gint64 n = rows;
  if (compact) {
    qkv_compact_rows(dproj, index, m, hidden);
    qkv_gather_rows(ctx, xbuf, x, in, index, m, in);
    x = xbuf;
    n = m;
  }
  qkv_attn_sgemm(FALSE, FALSE, n, in, hidden, 1.0f, dproj, hidden, w, in, 0.0f, dx, in);
  if (n > 0)
    qkv_attn_sgemm(TRUE, FALSE, hidden, in, n, 1.0f, dproj, hidden, x, in, 0.0f, dw, in);
  else
    memset(dw, 0, (gsize)(hidden * in) * sizeof(float));
  if (db != NULL)
    column_sums(n, hidden, dproj, db);
  if (compact)
    qkv_expand_rows(dx, index, m, rows, in);
}

static void
backward_kernel(const QkvKernelCtx *ctx)
{
  MhaBackwardSlots in;
  mha_backward_slots_of(ctx->n_inputs, ctx->attrs, &in);
  QkvShape shapes[4];
  for (guint i = 0; i < 4; i++)
    shapes[i] = ctx->in[i].shape;
  MhaDims d = mha_dims(shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  QkvAttnScoreMask values;
  QkvAttnProblem pb = problem_of(&d, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
                                 in.mask >= 0 ? &ctx->in[in.mask] : NULL, &values, ctx->attrs);
  gboolean has_bias = qkv_attrs_get_bool(ctx->attrs, "has_bias");
  float *dscores =
      qkv_attrs_get_bool(ctx->attrs, "grad_mask") ? ctx->out[ctx->n_outputs - 1].data : NULL;
  const float *x[3], *w[4];
  for (guint i = 0; i < 4; i++) {
    if (i < 3)
      x[i] = ctx->in[i].data;
    w[i] = ctx->in[3 + i].data;
  }
  const float *p = ctx->in[BW_WEIGHTS].data, *concat = ctx->in[BW_CONCAT].data;
  const float *proj[3] = {ctx->in[BW_QP].data, ctx->in[BW_KP].data, ctx->in[BW_VP].data};
  const float *drop = in.dropout_mask >= 0 ? ctx->in[in.dropout_mask].data : NULL;
  const float *dout = in.dout >= 0 ? ctx->in[in.dout].data : NULL;
  const float *dw = in.dweights >= 0 ? ctx->in[in.dweights].data : NULL;
  gint64 rows[3] = {d.batch * d.n_q, d.batch * d.n_k, d.batch * d.n_k};
  gint64 in_size[3] = {d.d_q, d.d_k, d.d_v};

  float *dconcat = ctx->scratch;
  float *dproj[3];
  dproj[0] = dconcat + rows[0] * d.hidden;
  dproj[1] = dproj[0] + rows[0] * d.hidden;
  dproj[2] = dproj[1] + rows[1] * d.hidden;
  float *gather_a = dproj[2] + rows[2] * d.hidden, *gather_b = gather_a + gather_floats(&d);
  gint64 *index = (gint64 *)(gather_b + gather_floats(&d));
  float *attn_scratch = (float *)(index + MAX(rows[0], rows[1]));

  /* out = concat · w_oᵀ + b_o, over the rows of dout that are not zero */
  float *dw_o = ctx->out[6].data, *db_o = has_bias ? ctx->out[10].data : NULL;
  if (dout != NULL) {
    gint64 m = rows[0] > 0 ? qkv_nonzero_rows(dout, rows[0], d.hidden, d.hidden, index) : 0;
    gboolean compact = qkv_compact_pays(m, rows[0], d.hidden * d.hidden);
    gint64 n = rows[0];
    if (compact) {
      qkv_gather_rows(ctx, gather_a, dout, d.hidden, index, m, d.hidden);
      qkv_gather_rows(ctx, gather_b, concat, d.hidden, index, m, d.hidden);
      dout = gather_a;
      concat = gather_b;
      n = m;
    }
    qkv_attn_sgemm(FALSE, FALSE, n, d.hidden, d.hidden, 1.0f, dout, d.hidden, w[3], d.hidden, 0.0f,
                   dconcat, d.hidden);
    if (n > 0)
      qkv_attn_sgemm(TRUE, FALSE, d.hidden, d.hidden, n, 1.0f, dout, d.hidden, concat, d.hidden,
                     0.0f, dw_o, d.hidden);
    else
      memset(dw_o, 0, (gsize)(d.hidden * d.hidden) * sizeof(float));
    if (db_o != NULL)
      column_sums(n, d.hidden, dout, db_o);
    if (compact)
      qkv_expand_rows(dconcat, index, m, rows[0], d.hidden);
  } else {
    memset(dconcat, 0, (gsize)(rows[0] * d.hidden) * sizeof(float));
    memset(dw_o, 0, (gsize)(d.hidden * d.hidden) * sizeof(float));
    if (db_o != NULL)
      memset(db_o, 0, (gsize)d.hidden * sizeof(float));
  }

  gsize shared = backward_shared_scratch(&d);
  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = flash_layout_of(&pb, &d, ctx->attrs);
    if (in.dropout_mask >= 0)
      qkv_flash_read_key(&L, ctx->in[in.dropout_mask].data);
    /* the flash kernels take their scratch from after the shared part */
    QkvKernelCtx fctx = *ctx;
    fctx.scratch = attn_scratch;
    fctx.scratch_size = ctx->scratch_size > shared ? ctx->scratch_size - shared : 0;
    qkv_flash_backward(&fctx, &L, proj[0], proj[1], proj[2], ctx->in[BW_CONCAT].data, p, dconcat,
                       dproj[0], dproj[1], dproj[2], dscores);
  } else {
    gsize per_thread = backward_scratch_per_thread(&d);
    gint nt = problem_threads(ctx, &d, per_thread,
                              ctx->scratch_size > shared ? ctx->scratch_size - shared : 0);
    gint64 nn = d.n_q * d.n_k, n_problems = d.batch * d.heads;
    MhaProblemsJob job = {
        .ctx = ctx,
        .pb = &pb,
        .d = &d,
        .proj = {proj[0], proj[1], proj[2]},
        .p = p,
        .drop = drop,
        .dw = dw,
        .dconcat = dconcat,
        .dproj = {dproj[0], dproj[1], dproj[2]},
        .scratch = attn_scratch,
        .scratch_floats = 2 * nn,
        .dscores = dscores,
    };
    qkv_parallel_for(nt, n_problems, mha_backward_problems, &job);
  }

  /* proj = x · wᵀ + b */
  for (guint i = 0; i < 3; i++)
    projection_backward(ctx, rows[i], in_size[i], d.hidden, dproj[i], x[i], w[i], ctx->out[i].data,
                        ctx->out[3 + i].data, has_bias ? ctx->out[7 + i].data : NULL, index,
                        gather_a);
}

/* The weights output is differentiable; the saved outputs (projections,
 * concatenation, dropout mask) carry no gradient. */
static gboolean
forward_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dout = g->out_grads[OUT_OUT], *dw = g->out_grads[OUT_WEIGHTS];
  gboolean flash = qkv_attrs_get_bool(g->attrs, "flash");
  /* with flash, output 1 is the row statistics: it has no gradient */
  if (flash)
    dw = NULL;
  MhaSlots in;
  mha_slots_of(g->n_inputs, g->attrs, &in);
  gint mi = in.mask;
  /* the inputs with gradients: the required ones and the biases */
  guint n_float = in.bias >= 0 ? (guint)in.bias + 4 : MHA_FIRST_OPTIONAL;
  gboolean mask_grad = mi >= 0 && qkv_attn_mask_additive(g->attrs) && g->needs_grad[mi];
  gboolean any = mask_grad;
  for (guint i = 0; i < n_float; i++)
    any |= g->needs_grad[i];
  if ((dout == NULL && dw == NULL) || !any)
    return TRUE;
  double dropout = qkv_attrs_get_float(g->attrs, "dropout");
  MhaBackwardSlots bw = mha_backward_slots((MhaBackwardSlots){
      .dropout_mask = dropout > 0.0,
      .dout = dout != NULL,
      .dweights = dw != NULL,
      .valid_lens = in.valid_lens >= 0,
      .mask = mi >= 0,
  });
  QkvValue *inputs[MHA_MAX_BACKWARD_INPUTS];
  for (guint i = 0; i < MHA_FIRST_OPTIONAL; i++)
    inputs[i] = g->inputs[i];
  for (guint o = OUT_WEIGHTS; o <= OUT_CONCAT; o++)
    inputs[BW_WEIGHTS + o - OUT_WEIGHTS] = g->outputs[o];
  qkv_slot_put(inputs, bw.dropout_mask, g->outputs[OUT_MASK]);
  qkv_slot_put(inputs, bw.dout, dout);
  qkv_slot_put(inputs, bw.dweights, dw);
  qkv_slot_put(inputs, bw.valid_lens, in.valid_lens >= 0 ? g->inputs[in.valid_lens] : NULL);
  qkv_slot_put(inputs, bw.mask, mi >= 0 ? g->inputs[mi] : NULL);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "num_heads",
                        g_variant_new_int64(qkv_attrs_get_int(g->attrs, "num_heads")));
  qkv_attn_pass_on_attrs(&attrs, g->attrs);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  g_variant_builder_add(&attrs, "{sv}", "has_bias", g_variant_new_boolean(in.bias >= 0));
  g_variant_builder_add(&attrs, "{sv}", "grad_out", g_variant_new_boolean(dout != NULL));
  g_variant_builder_add(&attrs, "{sv}", "grad_weights", g_variant_new_boolean(dw != NULL));
  g_variant_builder_add(&attrs, "{sv}", "grad_mask", g_variant_new_boolean(mask_grad));
  QkvNode *node = qkv_graph_add_node(g->graph, "multi_head_attention_backward", inputs, bw.n_inputs,
                                     g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < n_float; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  if (mask_grad) {
    /* dscores (B, H, n_q, n_k) to the mask's shape: a rank-3 mask is shared
     * by the heads, so their gradients add up first */
    QkvValue *ds = qkv_node_output(node, n_float);
    const QkvShape *ms = qkv_value_shape(g->inputs[mi]);
    if (ms->rank == 3) {
      gint heads_axis = 1;
      ds = qkv_sum(ds, &heads_axis, 1, FALSE, error);
      if (ds == NULL)
        return FALSE;
    }
    g->in_grads[mi] = qkv_sum_to(ds, ms, error);
    if (g->in_grads[mi] == NULL)
      return FALSE;
  }
  return TRUE;
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
           .gradient = forward_grad, .scratch_size = forward_scratch),
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
           .shape = backward_shape, .forward = backward_kernel, .scratch_size = backward_scratch),
    QKV_OPS_END,
};

QkvValue *
qkv_multi_head_attention(QkvValue *queries, QkvValue *keys, QkvValue *values, QkvValue *w_q,
                         QkvValue *w_k, QkvValue *w_v, QkvValue *w_o, QkvValue *const *biases,
                         gint num_heads, QkvValue *valid_lens, gboolean causal, double dropout,
                         QkvValue **weights, GError **error)
{
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
      qkv_flash_wanted(qs->dims[0] * MAX(num_heads, 1) * qs->dims[1] * ks->dims[1] *
                       (gint64)sizeof(float)))
    g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(queries), "multi_head_attention", inputs,
                                     in.n_inputs, g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return NULL;
  if (weights != NULL)
    *weights = qkv_node_output(node, OUT_WEIGHTS);
  return qkv_node_output(node, OUT_OUT);
}
