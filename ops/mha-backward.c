/* mha-backward.c: the gradient of multi_head_attention (mha.c): its
 * gradient rule and the fused "multi_head_attention_backward" op. The two
 * files are one op family, whose table is in mha.c; the backward half lives
 * here only to keep each file a readable length.
 *
 * The backward runs the forward's steps in reverse: dout through w_o into
 * the heads' concatenation, each (batch, head) problem's attention backward
 * (or the flash kernels, which make the weights again block by block), then
 * the three projections, skipping rows whose gradient is zero
 * (ops-common.h).
 */
#include "mha-internal.h"

/* Where the backward op's optional inputs sit (-1: absent), after
 * BW_FIRST_OPTIONAL (mha-internal.h): mha_backward_slots() takes the struct
 * with each field saying whether that input is present (nonzero). */
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
    const QkvAttnProblem *pb = j->pb;
    qkv_attn_backward_problem(pb, idx, j->dconcat + qoff,
                              qkv_attn_operand_at(j->proj[0], pb->q_dtype, qoff),
                              qkv_attn_operand_at(j->proj[1], pb->k_dtype, koff),
                              qkv_attn_operand_at(j->proj[2], pb->v_dtype, koff), j->p + idx * nn,
                              j->drop ? j->drop + idx * nn : NULL, j->dw ? j->dw + idx * nn : NULL,
                              pd, j->dscores != NULL ? j->dscores + idx * nn : pd + nn,
                              j->dproj[0] + qoff, j->dproj[1] + koff, j->dproj[2] + koff);
  }
}

gboolean
mha_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  MhaBackwardSlots in;
  if (!mha_backward_slots_of(ctx->n_inputs, ctx->attrs, &in))
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected queries, keys, values, w_q, w_k, w_v, w_o, weights, q_proj, "
                           "k_proj, v_proj, concat, then dropout_mask (dropout > 0), dout "
                           "(grad_out), dweights (grad_weights), optional valid_lens (i32) and "
                           "mask (f32)");
  if (!mha_check_inputs(ctx, -1, error))
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

/* dC, dQp (B·n_q × H each), dKp, dVp (B·n_k × H each), four gather buffers
 * (concat, then the queries' rows; dout; the keys' rows; the values' rows),
 * three row indices (max(B·n_q, B·n_k) each; an even number of floats
 * before them keeps them aligned), then per-thread attention scratch. */
static gsize
backward_shared_scratch(const MhaDims *d)
{
  return (gsize)(2 * d->batch * d->n_q * d->hidden + 2 * d->batch * d->n_k * d->hidden +
                 4 * gather_floats(d)) *
             sizeof(float) +
         3 * (gsize)MAX(d->batch * d->n_q, d->batch * d->n_k) * sizeof(gint64);
}

gsize
mha_backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
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

/* The rows of an input that a projection's backward gathered. */
typedef struct {
  const float *x, *rows; /* rows: NULL where nothing was gathered */
  const gint64 *index;
  gint64 m, width;
} Gathered;

/* For proj = x · wᵀ (+ b): dx (rows × in) = dproj · w, dw (H × in) = dprojᵀ ·
 * x, db = column sums of dproj, over the rows of dproj that are not zero
 * (ops-common.h). dproj is scratch and is compacted in place; xbuf takes the
 * gathered rows of x unless an earlier projection (done[0 .. n_done))
 * gathered the same rows of the same input (self-attention's three
 * projections usually do: one gather, and in bf16 one copy of it). What
 * this one gathered goes to *mine. */
static void
projection_backward(const QkvKernelCtx *ctx, gint64 rows, gint64 in, gint64 hidden, float *dproj,
                    const float *x, const float *w, float *dx, float *dw, float *db, gint64 *index,
                    float *xbuf, const Gathered *done, guint n_done, Gathered *mine)
{
  gint64 m = rows > 0 ? qkv_nonzero_rows(dproj, rows, hidden, hidden, index) : 0;
  gboolean compact = qkv_compact_pays(m, rows, hidden * in);
  gint64 n = rows;
  *mine = (Gathered){x, NULL, index, m, in};
  if (compact) {
    qkv_compact_rows(dproj, index, m, hidden);
    const float *found = NULL;
    for (guint i = 0; i < n_done && found == NULL; i++)
      if (done[i].rows != NULL && done[i].x == x && done[i].width == in && done[i].m == m &&
          memcmp(done[i].index, index, (gsize)m * sizeof(gint64)) == 0)
        found = done[i].rows;
    if (found == NULL) {
      qkv_gather_rows(ctx, xbuf, x, in, index, m, in);
      qkv_sgemm_operand_final(xbuf, (gsize)(m * in)); /* not written again this step */
      found = xbuf;
    }
    mine->rows = x = found;
    n = m;
  }
  qkv_sgemm_operand_final(dproj, (gsize)(n * hidden)); /* read by two products */
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

/* The output projection out = concat · w_oᵀ + b_o: dconcat, dw_o and db_o
 * (may be NULL) from dout (NULL: zero), over the rows of dout that are not
 * zero; index and gather[0], gather[1] are scratch, and gather[1] keeps the
 * gathered dout for the rest of the step. */
static void
output_backward(const QkvKernelCtx *ctx, const MhaDims *d, gint64 rows, const float *dout,
                const float *concat, const float *w_o, float *dconcat, float *dw_o, float *db_o,
                gint64 *index, float *const *gather)
{
  if (dout != NULL) {
    gint64 m = rows > 0 ? qkv_nonzero_rows(dout, rows, d->hidden, d->hidden, index) : 0;
    gboolean compact = qkv_compact_pays(m, rows, d->hidden * d->hidden);
    gint64 n = rows;
    if (compact) {
      /* gather[1] stays dout's for the rest of the step: two products read
       * it (one copy in bf16) */
      qkv_gather_rows(ctx, gather[1], dout, d->hidden, index, m, d->hidden);
      qkv_gather_rows(ctx, gather[0], concat, d->hidden, index, m, d->hidden);
      qkv_sgemm_operand_final(gather[1], (gsize)(m * d->hidden));
      dout = gather[1];
      concat = gather[0];
      n = m;
    }
    qkv_attn_sgemm(FALSE, FALSE, n, d->hidden, d->hidden, 1.0f, dout, d->hidden, w_o, d->hidden,
                   0.0f, dconcat, d->hidden);
    if (n > 0)
      qkv_attn_sgemm(TRUE, FALSE, d->hidden, d->hidden, n, 1.0f, dout, d->hidden, concat, d->hidden,
                     0.0f, dw_o, d->hidden);
    else
      memset(dw_o, 0, (gsize)(d->hidden * d->hidden) * sizeof(float));
    if (db_o != NULL)
      column_sums(n, d->hidden, dout, db_o);
    if (compact)
      qkv_expand_rows(dconcat, index, m, rows, d->hidden);
  } else {
    memset(dconcat, 0, (gsize)(rows * d->hidden) * sizeof(float));
    memset(dw_o, 0, (gsize)(d->hidden * d->hidden) * sizeof(float));
    if (db_o != NULL)
      memset(db_o, 0, (gsize)d->hidden * sizeof(float));
  }
}

void
mha_backward_kernel(const QkvKernelCtx *ctx)
{
  MhaBackwardSlots in;
  mha_backward_slots_of(ctx->n_inputs, ctx->attrs, &in);
  QkvShape shapes[4];
  for (guint i = 0; i < 4; i++)
    shapes[i] = ctx->in[i].shape;
  MhaDims d = mha_dims(shapes, qkv_attrs_get_int(ctx->attrs, "num_heads"));
  QkvAttnScoreMask values;
  QkvAttnProblem pb = mha_problem_of(&d, in.valid_lens >= 0 ? &ctx->in[in.valid_lens] : NULL,
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
  /* floats, or bf16 where the plan stores them so (bf16 activations) */
  gconstpointer proj[3] = {ctx->in[BW_QP].data, ctx->in[BW_KP].data, ctx->in[BW_VP].data};
  pb.q_dtype = ctx->in[BW_QP].dtype;
  pb.k_dtype = ctx->in[BW_KP].dtype;
  pb.v_dtype = ctx->in[BW_VP].dtype;
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
  float *gather[4];
  gather[0] = dproj[2] + rows[2] * d.hidden;
  for (guint i = 1; i < 4; i++)
    gather[i] = gather[i - 1] + gather_floats(&d);
  gint64 *indices[3];
  indices[0] = (gint64 *)(gather[3] + gather_floats(&d));
  for (guint i = 1; i < 3; i++)
    indices[i] = indices[i - 1] + MAX(rows[0], rows[1]);
  gint64 *index = indices[0];
  float *attn_scratch = (float *)(indices[2] + MAX(rows[0], rows[1]));

  /* out = concat · w_oᵀ + b_o */
  output_backward(ctx, &d, rows[0], dout, concat, w[3], dconcat, ctx->out[6].data,
                  has_bias ? ctx->out[10].data : NULL, index, gather);

  gsize shared = backward_shared_scratch(&d);
  if (qkv_attrs_get_bool(ctx->attrs, "flash")) {
    QkvFlashLayout L = mha_flash_layout_of(&pb, &d, ctx->attrs);
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
    gint nt = mha_problem_threads(ctx, &d, per_thread,
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

  /* proj = x · wᵀ + b; projection i gathers into gather[0], [2] or [3]
   * (concat's rows in gather[0] are read no more) */
  Gathered done[3];
  float *xbuf[3] = {gather[0], gather[2], gather[3]};
  for (guint i = 0; i < 3; i++)
    projection_backward(ctx, rows[i], in_size[i], d.hidden, dproj[i], x[i], w[i], ctx->out[i].data,
                        ctx->out[3 + i].data, has_bias ? ctx->out[7 + i].data : NULL, indices[i],
                        xbuf[i], done, i, &done[i]);
}

/* The weights output is differentiable; the saved outputs (projections,
 * concatenation, dropout mask) carry no gradient. */
gboolean
mha_grad(QkvGradCtx *g, GError **error)
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
