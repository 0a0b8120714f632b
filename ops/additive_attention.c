/* additive_attention.c: "additive_attention", the book's AdditiveAttention
 * as one op, and its fused backward op.
 *
 *   features[b, i, j] = tanh(W_q q[b, i] + W_k k[b, j])        (h values)
 *   scores[b, i, j]   = w_v · features[b, i, j]
 *   weights           = masked_softmax(scores, valid_lens)      (-1e6 masking)
 *   out               = dropout(weights) · v
 *
 * The projections W_q q and W_k k are one cblas_sgemm each over all rows; the
 * features of one query row (n_k × h values, contiguous) are built, passed
 * through SLEEF's tanh in one call and dotted with w_v. The features are an
 * output: the backward reads them for both the tanh derivative and dw_v, so
 * it never evaluates tanh again. Outputs: 0 the result (B, n_q, v_size),
 * 1 the weights before dropout (B, n_q, n_k), 2 the features
 * (B, n_q, n_k, h), and, when dropout > 0, 3 the dropout mask (B, n_q, n_k).
 */
#include "attention-common.h"
#include "error-private.h"

/* The inputs: q, k, v, w_q, w_k, w_v, then valid_lens. */
enum { AA_VALID_LENS = 6, AA_MAX_INPUTS };

/* The backward op's: dout, q, k, v, w_q, w_k, w_v, weights, features, then
 * the dropout mask, dweights and valid_lens. Where each optional one sits
 * (-1: absent): aa_backward_slots() takes the struct with each field saying
 * whether that input is present (nonzero) and lays them out in order. */
enum { BW_WEIGHTS = 7, BW_FEATURES, BW_FIRST_OPTIONAL };
#define AA_MAX_BACKWARD_INPUTS 12
typedef struct {
  gint mask, dweights, valid_lens;
  guint n_inputs;
} AaBackwardSlots;

static AaBackwardSlots
aa_backward_slots(AaBackwardSlots present)
{
  AaBackwardSlots s = {.n_inputs = BW_FIRST_OPTIONAL};
  s.mask = qkv_slot_next(&s.n_inputs, present.mask, 1);
  s.dweights = qkv_slot_next(&s.n_inputs, present.dweights, 1);
  s.valid_lens = qkv_slot_next(&s.n_inputs, present.valid_lens, 1);
  return s;
}

/* An existing node's: the attributes say whether there are a dropout mask
 * and dweights, the count whether there are valid lengths. */
static gboolean
aa_backward_slots_of(guint n_inputs, const QkvAttrs *attrs, AaBackwardSlots *s)
{
  for (gint valid_lens = 0; valid_lens < 2; valid_lens++) {
    *s = aa_backward_slots((AaBackwardSlots){
        .mask = qkv_attrs_get_float(attrs, "dropout") > 0.0,
        .dweights = qkv_attrs_get_bool(attrs, "weights_grad"),
        .valid_lens = valid_lens,
    });
    if (s->n_inputs == n_inputs)
      return TRUE;
  }
  return FALSE;
}

typedef struct {
  gint64 batch, n_q, n_k, q_size, k_size, v_size, h;
} AaDims;

/* Check q, k, v, w_q, w_k, w_v at inputs first … first + 5 and fill dims. */
static gboolean
aa_check_operands(const QkvShapeCtx *ctx, guint first, AaDims *dims, GError **error)
{
  const QkvShape *q = &ctx->in_shapes[first], *k = &ctx->in_shapes[first + 1],
                 *v = &ctx->in_shapes[first + 2], *w_q = &ctx->in_shapes[first + 3],
                 *w_k = &ctx->in_shapes[first + 4], *w_v = &ctx->in_shapes[first + 5];
  for (guint i = first; i < first + 6; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "q, k, v, w_q, w_k and w_v must be f32");
  if (q->rank != 3 || k->rank != 3 || v->rank != 3)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "q, k and v must be (B, n_q, q_size), (B, n_k, k_size) and "
                           "(B, n_k, v_size)");
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0] || v->dims[1] != k->dims[1])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "q, k and v must share the batch size, and k and v the number of keys");
  if (w_q->rank != 2 || w_q->dims[1] != q->dims[2] || w_q->dims[0] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "w_q must be (h, %" G_GINT64_FORMAT ") to take q's last axis",
                           q->dims[2]);
  gint64 h = w_q->dims[0];
  if (w_k->rank != 2 || w_k->dims[0] != h || w_k->dims[1] != k->dims[2])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "w_k must be (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                           ") like w_q and k's last axis",
                           h, k->dims[2]);
  if (w_v->rank != 2 || w_v->dims[0] != 1 || w_v->dims[1] != h)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "w_v must be (1, %" G_GINT64_FORMAT ")", h);
  *dims = (AaDims){.batch = q->dims[0],
                   .n_q = q->dims[1],
                   .n_k = k->dims[1],
                   .q_size = q->dims[2],
                   .k_size = k->dims[2],
                   .v_size = v->dims[2],
                   .h = h};
  return TRUE;
}

static AaDims
aa_dims_from_views(const QkvView *in)
{
  return (AaDims){.batch = in[0].shape.dims[0],
                  .n_q = in[0].shape.dims[1],
                  .n_k = in[1].shape.dims[1],
                  .q_size = in[0].shape.dims[2],
                  .k_size = in[1].shape.dims[2],
                  .v_size = in[2].shape.dims[2],
                  .h = in[3].shape.dims[0]};
}

static gboolean
aa_shape(QkvShapeCtx *ctx, GError **error)
{
  AaDims d = {0};
  gboolean per_query;
  if (!aa_check_operands(ctx, 0, &d, error))
    return FALSE;
  if (ctx->n_inputs > AA_VALID_LENS &&
      !qkv_attn_check_valid_lens(ctx, AA_VALID_LENS, d.batch, d.n_q, &per_query, error))
    return FALSE;
  if (!qkv_attn_check_dropout(ctx, "dropout", error))
    return FALSE;
  ctx->n_outputs = 3;
  ctx->out_shapes[0] = QKV_SHAPE(d.batch, d.n_q, d.v_size);
  ctx->out_shapes[1] = QKV_SHAPE(d.batch, d.n_q, d.n_k);
  ctx->out_shapes[2] = QKV_SHAPE(d.batch, d.n_q, d.n_k, d.h);
  if (qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0) {
    ctx->n_outputs = 4;
    ctx->out_shapes[3] = ctx->out_shapes[1];
  }
  return TRUE;
}

/* Forward scratch: the projections W_q q (B·n_q × h) and W_k k (B·n_k × h),
 * and the weights after dropout (B·n_q × n_k) when there is dropout. */
static gsize
aa_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  AaDims d = {0};
  if (!aa_check_operands(ctx, 0, &d, NULL))
    return 0;
  gint64 n = d.batch * (d.n_q + d.n_k) * d.h;
  if (qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0)
    n += d.batch * d.n_q * d.n_k;
  return (gsize)n * sizeof(float);
}

typedef struct {
  gboolean ta, tb;
  gint64 m, n, k;
  const float *a;
  gint64 stride_a, lda;
  const float *b;
  gint64 stride_b, ldb;
  float *c;
  gint64 stride_c, ldc;
} AaSgemmJob;

static void
aa_sgemm_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const AaSgemmJob *j = user_data;
  for (gint64 i = begin; i < end; i++)
    qkv_attn_sgemm(j->ta, j->tb, j->m, j->n, j->k, 1.0f, j->a + i * j->stride_a, j->lda,
                   j->b + i * j->stride_b, j->ldb, 0.0f, j->c + i * j->stride_c, j->ldc);
}

/* c[i] = op(a[i]) · op(b[i]) for i < batch, with the element strides given.
 * Small products run in parallel over the batch (OpenBLAS single-threaded
 * inside), big ones one after the other (OpenBLAS threads each). */
static void
aa_batched_sgemm(const QkvKernelCtx *ctx, gint64 batch, gboolean ta, gboolean tb, gint64 m,
                 gint64 n, gint64 k, const float *a, gint64 stride_a, gint64 lda, const float *b,
                 gint64 stride_b, gint64 ldb, float *c, gint64 stride_c, gint64 ldc)
{
  if (k == 0) {
    for (gint64 i = 0; i < batch; i++)
      qkv_attn_zero_block(c + i * stride_c, m, n, ldc);
    return;
  }
  gint nt = qkv_attn_problem_threads(ctx, batch, m * n * k, 0, 0);
  AaSgemmJob job = {ta, tb, m, n, k, a, stride_a, lda, b, stride_b, ldb, c, stride_c, ldc};
  qkv_parallel_for(nt, batch, aa_sgemm_range, &job);
}

typedef struct {
  const QkvKernelCtx *ctx;
  const AaDims *d;
  const QkvAttnMask *am;
  const float *qp, *kp, *w_v;
  double p;
  gboolean drop;
  float *features, *weights, *mask, *dropped;
} AaForwardJob;

/* Features, scores, weights (and the dropout mask) of query rows [begin, end). */
static void
aa_forward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const AaForwardJob *a = user_data;
  const gint64 nk = a->d->n_k, h = a->d->h;
  const float *qp = a->qp, *kp = a->kp, *w_v = a->w_v;
  float *weights = a->weights, *mask = a->mask, *dropped = a->dropped;
  for (gint64 r = begin; r < end; r++) {
    const gint64 b = r / a->d->n_q;
    const float *qr = qp + r * h;
    float *fr = a->features + r * nk * h, *wr = weights + r * nk;
    for (gint64 j = 0; j < nk; j++) {
      const float *kr = kp + (b * nk + j) * h;
      float *f = fr + j * h;
#pragma omp simd
      for (gint64 c = 0; c < h; c++)
        f[c] = qr[c] + kr[c];
    }
    qkv_vec_tanh(fr, fr, (gsize)(nk * h));
    for (gint64 j = 0; j < nk; j++) {
      const float *f = fr + j * h;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (gint64 c = 0; c < h; c++)
        s += f[c] * w_v[c];
      wr[j] = s;
    }
    qkv_attn_softmax_row(wr, wr, nk, qkv_attn_row_limit(a->am, r, nk));
    if (mask != NULL) {
      float *mr = mask + r * nk;
      qkv_dropout_fill_mask(a->ctx, a->p, mr, r * nk, nk);
      if (a->drop)
        for (gint64 j = 0; j < nk; j++)
          dropped[r * nk + j] = wr[j] * mr[j];
    }
  }
}

static void
aa_forward(const QkvKernelCtx *ctx)
{
  const AaDims d = aa_dims_from_views(ctx->in);
  const gint64 nk = d.n_k, h = d.h, rows = d.batch * d.n_q;
  const float *q = ctx->in[0].data, *k = ctx->in[1].data, *v = ctx->in[2].data,
              *w_q = ctx->in[3].data, *w_k = ctx->in[4].data, *w_v = ctx->in[5].data;
  const double p = qkv_attrs_get_float(ctx->attrs, "dropout");
  float *out = ctx->out[0].data, *weights = ctx->out[1].data, *features = ctx->out[2].data;
  float *mask = ctx->n_outputs > 3 ? ctx->out[3].data : NULL;
  float *qp = ctx->scratch, *kp = qp + rows * h, *dropped = kp + d.batch * nk * h;
  const gboolean drop = mask != NULL && qkv_dropout_active(ctx, p);
  const QkvAttnMask am = qkv_attn_mask_from_view(
      ctx->n_inputs > AA_VALID_LENS ? &ctx->in[AA_VALID_LENS] : NULL, d.n_q, d.n_q, FALSE);

  qkv_attn_sgemm(FALSE, TRUE, rows, h, d.q_size, 1.0f, q, d.q_size, w_q, d.q_size, 0.0f, qp, h);
  qkv_attn_sgemm(FALSE, TRUE, d.batch * nk, h, d.k_size, 1.0f, k, d.k_size, w_k, d.k_size, 0.0f, kp,
                 h);
  if (d.q_size == 0)
    memset(qp, 0, (gsize)(rows * h) * sizeof(float));
  if (d.k_size == 0)
    memset(kp, 0, (gsize)(d.batch * nk * h) * sizeof(float));

  AaForwardJob job = {ctx, &d, &am, qp, kp, w_v, p, drop, features, weights, mask, dropped};
  /* tanh is about ten units of work per feature */
  qkv_parallel_for(qkv_kernel_threads(ctx, 12 * rows * nk * h), rows, aa_forward_rows, &job);

  aa_batched_sgemm(ctx, d.batch, FALSE, FALSE, d.n_q, d.v_size, nk, drop ? dropped : weights,
                   d.n_q * nk, nk, v, nk * d.v_size, d.v_size, out, d.n_q * d.v_size, d.v_size);
}

/* ---- backward ----------------------------------------------------------- */

static gboolean
aa_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  AaDims d = {0};
  gboolean per_query;
  AaBackwardSlots l;
  if (!aa_backward_slots_of(ctx->n_inputs, ctx->attrs, &l)) /* l: the layout with valid_lens */
    return qkv_shape_error(ctx, error, QKV_ERROR_ARITY,
                           "expected %u inputs (%u with valid_lens) for these attributes, got %u",
                           l.n_inputs - 1, l.n_inputs, ctx->n_inputs);
  if (!aa_check_operands(ctx, 1, &d, error))
    return FALSE;
  QkvShape out = QKV_SHAPE(d.batch, d.n_q, d.v_size), w = QKV_SHAPE(d.batch, d.n_q, d.n_k),
           feat = QKV_SHAPE(d.batch, d.n_q, d.n_k, d.h);
  gboolean ok = qkv_shape_equal(&ctx->in_shapes[0], &out) &&
                qkv_shape_equal(&ctx->in_shapes[BW_WEIGHTS], &w) &&
                qkv_shape_equal(&ctx->in_shapes[BW_FEATURES], &feat);
  if (l.mask >= 0)
    ok = ok && qkv_shape_equal(&ctx->in_shapes[l.mask], &w);
  if (l.dweights >= 0)
    ok = ok && qkv_shape_equal(&ctx->in_shapes[l.dweights], &w);
  for (guint i = 0; i < ctx->n_inputs; i++)
    ok = ok && ((gint)i == l.valid_lens || ctx->in_dtypes[i] == QKV_F32);
  if (!ok)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dout, weights, features, mask and dweights do not fit q, k and v");
  if (l.valid_lens >= 0 &&
      !qkv_attn_check_valid_lens(ctx, (guint)l.valid_lens, d.batch, d.n_q, &per_query, error))
    return FALSE;
  ctx->n_outputs = 6;
  for (guint i = 0; i < 6; i++)
    ctx->out_shapes[i] = ctx->in_shapes[1 + i];
  return TRUE;
}

/* Backward scratch, in floats: score gradients (B·n_q × n_k), the weights
 * after dropout (same, with dropout), the projection gradients (B·n_q × h,
 * B·n_k × h); then per-thread dw_v partial sums (h doubles each). */
static gsize
aa_backward_floats(const AaDims *d, gboolean has_mask)
{
  gsize n = (gsize)(d->batch * d->n_q * d->n_k * (has_mask ? 2 : 1) +
                    d->batch * (d->n_q + d->n_k) * d->h);
  return (n + 1) / 2 * 2; /* keep the doubles aligned */
}

static gsize
aa_backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  AaDims d = {0};
  if (!aa_check_operands(ctx, 1, &d, NULL))
    return 0;
  gboolean has_mask = qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0;
  return aa_backward_floats(&d, has_mask) * sizeof(float) +
         (gsize)MAX(n_threads, 1) * (gsize)d.h * sizeof(double);
}

typedef struct {
  AaDims d;
  const float *weights, *features, *mask, *dweights, *w_v;
  QkvAttnMask am;
  float *dscores, *dqp, *dkp;
  double *dwv_partials;
} AaBackward;

/* Query row r: the score gradients (through dropout and the masked softmax),
 * the gradient of W_q q, and into dwv this row's share of dw_v; with dkb (the
 * gradient of W_k k for r's batch element, not yet scaled by w_v) also its
 * share of that. With s = w_v · f and f = tanh(u): ds/du = w_v ⊙ (1 − f²),
 * ds/dw_v = f. */
static void
aa_backward_row(const AaBackward *a, gint64 r, double *dwv, float *dkb)
{
  const gint64 nk = a->d.n_k, h = a->d.h;
  float *ds = a->dscores + r * nk, *dqr = a->dqp + r * h;
  const float *fr = a->features + r * nk * h;
  if (a->mask != NULL)
    for (gint64 j = 0; j < nk; j++)
      ds[j] *= a->mask[r * nk + j];
  if (a->dweights != NULL)
    for (gint64 j = 0; j < nk; j++)
      ds[j] += a->dweights[r * nk + j];
  qkv_attn_softmax_backward_row(ds, ds, a->weights + r * nk, nk, qkv_attn_row_limit(&a->am, r, nk));
  memset(dqr, 0, (gsize)h * sizeof(float));
  for (gint64 j = 0; j < nk; j++) {
    const float *f = fr + j * h;
    const float g = ds[j];
    if (g == 0.0f) /* masked keys */
      continue;
    if (dkb != NULL) {
      float *dkr = dkb + j * h;
#pragma omp simd
      for (gint64 c = 0; c < h; c++) {
        float t = g * (1.0f - f[c] * f[c]);
        dqr[c] += t;
        dkr[c] += t;
        dwv[c] += (double)(g * f[c]);
      }
    } else {
#pragma omp simd
      for (gint64 c = 0; c < h; c++) {
        dqr[c] += g * (1.0f - f[c] * f[c]);
        dwv[c] += (double)(g * f[c]);
      }
    }
  }
#pragma omp simd
  for (gint64 c = 0; c < h; c++)
    dqr[c] *= a->w_v[c];
}

/* Query rows [begin, end), dw_v into this thread's partial sums. */
static void
aa_backward_query_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const AaBackward *a = user_data;
  double *dwv = a->dwv_partials + (gsize)thread * (gsize)a->d.h;
  for (gint64 r = begin; r < end; r++)
    aa_backward_row(a, r, dwv, NULL);
}

/* Batch elements [begin, end): their query rows and, in the same pass over
 * the features, their key rows (which no other batch element touches). */
static void
aa_backward_batches(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const AaBackward *a = user_data;
  const gint64 nq = a->d.n_q, nk = a->d.n_k, h = a->d.h;
  double *dwv = a->dwv_partials + (gsize)thread * (gsize)h;
  for (gint64 b = begin; b < end; b++) {
    float *dkb = a->dkp + b * nk * h;
    memset(dkb, 0, (gsize)(nk * h) * sizeof(float));
    for (gint64 i = 0; i < nq; i++)
      aa_backward_row(a, b * nq + i, dwv, dkb);
    for (gint64 j = 0; j < nk; j++)
#pragma omp simd
      for (gint64 c = 0; c < h; c++)
        dkb[j * h + c] *= a->w_v[c];
  }
}

typedef struct {
  const AaDims *d;
  const float *dscores, *features, *w_v;
  float *dkp;
} AaKeyRowsJob;

/* The gradient of W_k k for key rows [begin, end) of all batch elements: a
 * sum over the queries. */
static void
aa_backward_key_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const AaKeyRowsJob *a = user_data;
  const gint64 nq = a->d->n_q, nk = a->d->n_k, h = a->d->h;
  const float *w_v = a->w_v;
  for (gint64 bj = begin; bj < end; bj++) {
    const gint64 b = bj / nk, j = bj % nk;
    float *dkr = a->dkp + bj * h;
    memset(dkr, 0, (gsize)h * sizeof(float));
    for (gint64 i = 0; i < nq; i++) {
      const float g = a->dscores[(b * nq + i) * nk + j];
      if (g == 0.0f)
        continue;
      const float *f = a->features + ((b * nq + i) * nk + j) * h;
#pragma omp simd
      for (gint64 c = 0; c < h; c++)
        dkr[c] += g * (1.0f - f[c] * f[c]);
    }
#pragma omp simd
    for (gint64 c = 0; c < h; c++)
      dkr[c] *= w_v[c];
  }
}

static void
aa_backward_forward(const QkvKernelCtx *ctx)
{
  const AaDims d = aa_dims_from_views(ctx->in + 1);
  AaBackwardSlots l;
  aa_backward_slots_of(ctx->n_inputs, ctx->attrs, &l);
  const gint64 nq = d.n_q, nk = d.n_k, h = d.h, rows = d.batch * nq, nn = rows * nk;
  const float *dout = ctx->in[0].data, *q = ctx->in[1].data, *k = ctx->in[2].data,
              *v = ctx->in[3].data, *w_q = ctx->in[4].data, *w_k = ctx->in[5].data,
              *w_v = ctx->in[6].data, *weights = ctx->in[BW_WEIGHTS].data,
              *features = ctx->in[BW_FEATURES].data;
  const float *mask = l.mask >= 0 ? ctx->in[l.mask].data : NULL;
  float *dq = ctx->out[0].data, *dk = ctx->out[1].data, *dv = ctx->out[2].data,
        *dw_q = ctx->out[3].data, *dw_k = ctx->out[4].data, *dw_v = ctx->out[5].data;
  const gsize n_floats = aa_backward_floats(&d, mask != NULL);
  float *dscores = ctx->scratch, *dropped = dscores + nn, *dqp = dropped + (mask ? nn : 0),
        *dkp = dqp + rows * h;
  double *dwv_partials = (double *)((float *)ctx->scratch + n_floats);

  /* The value side: dv = dropout(weights)ᵀ · dout, and the gradient of the
   * dropped weights, dout · vᵀ, staged in dscores. */
  const float *used = weights;
  if (mask != NULL) {
    qkv_mul_floats(ctx, dropped, weights, mask, nn);
    used = dropped;
  }
  aa_batched_sgemm(ctx, d.batch, TRUE, FALSE, nk, d.v_size, nq, used, nq * nk, nk, dout,
                   nq * d.v_size, d.v_size, dv, nk * d.v_size, d.v_size);
  aa_batched_sgemm(ctx, d.batch, FALSE, TRUE, nq, nk, d.v_size, dout, nq * d.v_size, d.v_size, v,
                   nk * d.v_size, d.v_size, dscores, nq * nk, nk);

  /* The features are read once, batch element by batch element, when there
   * are enough of those to share out among the threads (as many threads as
   * the scratch holds dw_v sums for); otherwise query rows, then key rows. */
  AaBackward a = {
      .d = d,
      .weights = weights,
      .features = features,
      .mask = mask,
      .dweights = l.dweights >= 0 ? ctx->in[l.dweights].data : NULL,
      .w_v = w_v,
      .am =
          qkv_attn_mask_from_view(l.valid_lens >= 0 ? &ctx->in[l.valid_lens] : NULL, nq, nq, FALSE),
      .dscores = dscores,
      .dqp = dqp,
      .dkp = dkp,
      .dwv_partials = dwv_partials,
  };
  gsize capacity = (ctx->scratch_size - n_floats * sizeof(float)) / ((gsize)h * sizeof(double));
  /* a few units of work per feature: the tanh derivative, two products */
  gint n_threads = (gint)MIN((gsize)qkv_kernel_threads(ctx, 6 * nn * h), MAX(capacity, 1));
  const gboolean by_batch = d.batch >= n_threads;
  memset(dwv_partials, 0, (gsize)n_threads * (gsize)h * sizeof(double));
  QkvKernelCtx team = *ctx;
  team.n_threads = n_threads;
  if (by_batch)
    qkv_kernel_parallel_for(&team, d.batch, aa_backward_batches, &a);
  else
    qkv_kernel_parallel_for(&team, rows, aa_backward_query_rows, &a);
  for (gint64 c = 0; c < h; c++) {
    double s = 0.0;
    for (gint t = 0; t < n_threads; t++)
      s += dwv_partials[(gsize)t * (gsize)h + (gsize)c];
    dw_v[c] = (float)s;
  }

  /* Key rows, when not done above: the gradient of W_k k sums over queries. */
  if (!by_batch) {
    AaKeyRowsJob kj = {&d, dscores, features, w_v, dkp};
    qkv_parallel_for(qkv_kernel_threads(ctx, 4 * nn * h), d.batch * nk, aa_backward_key_rows, &kj);
  }

  /* Through the projections: dq = dqp · W_q, dW_q = dqpᵀ · q, and alike for k. */
  aa_batched_sgemm(ctx, 1, FALSE, FALSE, rows, d.q_size, h, dqp, 0, h, w_q, 0, d.q_size, dq, 0,
                   d.q_size);
  aa_batched_sgemm(ctx, 1, TRUE, FALSE, h, d.q_size, rows, dqp, 0, h, q, 0, d.q_size, dw_q, 0,
                   d.q_size);
  aa_batched_sgemm(ctx, 1, FALSE, FALSE, d.batch * nk, d.k_size, h, dkp, 0, h, w_k, 0, d.k_size, dk,
                   0, d.k_size);
  aa_batched_sgemm(ctx, 1, TRUE, FALSE, h, d.k_size, d.batch * nk, dkp, 0, h, k, 0, d.k_size, dw_k,
                   0, d.k_size);
}

static gboolean
aa_grad(QkvGradCtx *g, GError **error)
{
  for (guint o = 2; o < g->n_outputs; o++)
    if (g->out_grads[o] != NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                  "additive_attention: the saved output '%s' takes no gradient",
                  qkv_ops_additive_attention[0].output_names[o]);
      return FALSE;
    }
  QkvValue *dout = g->out_grads[0], *dweights = g->out_grads[1];
  if (dout == NULL && dweights == NULL)
    return TRUE;
  if (dout == NULL) {
    g_autoptr(QkvTensor) zeros = qkv_tensor_new(QKV_F32, qkv_value_shape(g->outputs[0]));
    qkv_tensor_fill(zeros, 0.0);
    dout = qkv_graph_constant(g->graph, zeros, error);
    if (dout == NULL)
      return FALSE;
  }
  double p = qkv_attrs_get_float(g->attrs, "dropout");
  QkvValue *valid_lens = g->n_inputs > AA_VALID_LENS ? g->inputs[AA_VALID_LENS] : NULL;
  AaBackwardSlots bw = aa_backward_slots((AaBackwardSlots){
      .mask = g->n_outputs > 3, .dweights = dweights != NULL, .valid_lens = valid_lens != NULL});
  QkvValue *inputs[AA_MAX_BACKWARD_INPUTS] = {dout};
  for (guint i = 0; i < AA_VALID_LENS; i++)
    inputs[1 + i] = g->inputs[i];
  inputs[BW_WEIGHTS] = g->outputs[1];
  inputs[BW_FEATURES] = g->outputs[2];
  qkv_slot_put(inputs, bw.mask, g->n_outputs > 3 ? g->outputs[3] : NULL);
  qkv_slot_put(inputs, bw.dweights, dweights);
  qkv_slot_put(inputs, bw.valid_lens, valid_lens);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(p));
  g_variant_builder_add(&attrs, "{sv}", "weights_grad", g_variant_new_boolean(dweights != NULL));

  QkvNode *node = qkv_graph_add_node(g->graph, "additive_attention_backward", inputs, bw.n_inputs,
                                     g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < 6; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_additive_attention[] = {
    QKV_OP(.name = "additive_attention",
           .doc = "the book's AdditiveAttention: softmax over keys (masked by valid_lens) of w_v · "
                  "tanh(W_q q + W_k k), dropout, weighted sum of v; outputs the result, the "
                  "weights, the tanh features and (dropout > 0) the dropout mask",
           QKV_INPUTS_OPT(AA_VALID_LENS, "q", "k", "v", "w_q", "w_k", "w_v", "valid_lens"),
           QKV_OUTPUTS("out", "weights", "features", "mask"),
           QKV_ATTRS(QKV_FLOAT_ATTR("dropout", 0.0,
                                    "dropout probability on the attention weights, in [0, 1)")),
           .no_grad_inputs = 1 << AA_VALID_LENS, .flags = QKV_OP_RANDOM, .shape = aa_shape,
           .forward = aa_forward, .gradient = aa_grad, .scratch_size = aa_scratch),
    QKV_OP(.name = "additive_attention_backward",
           .doc = "dq, dk, dv, dw_q, dw_k, dw_v of additive_attention from dout and the saved "
                  "weights, features and dropout mask (optionally a gradient reaching the weights "
                  "directly)",
           QKV_INPUTS_OPT(BW_FIRST_OPTIONAL, "dout", "q", "k", "v", "w_q", "w_k", "w_v", "weights",
                          "features", "mask", "dweights", "valid_lens"),
           QKV_OUTPUTS("dq", "dk", "dv", "dw_q", "dw_k", "dw_v"),
           QKV_ATTRS(
               QKV_FLOAT_ATTR("dropout", 0.0,
                              "the forward's dropout; > 0: input 9 is the saved mask"),
               QKV_BOOL_ATTR("weights_grad", FALSE,
                             "a gradient reaching the weights output directly follows (dweights)")),
           .shape = aa_backward_shape, .forward = aa_backward_forward,
           .scratch_size = aa_backward_scratch),
    QKV_OPS_END,
};

/* ---- typed function ----------------------------------------------------- */

QkvValue *
qkv_additive_attention(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *w_q, QkvValue *w_k,
                       QkvValue *w_v, QkvValue *valid_lens, double dropout, QkvValue **weights,
                       GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("additive_attention", error, q, k, v);
  QKV_RETURN_IF_MISSING("additive_attention", error, w_q, w_k, w_v);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  QkvValue *inputs[AA_MAX_INPUTS] = {q, k, v, w_q, w_k, w_v, valid_lens};
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(q), "additive_attention", inputs,
                                     valid_lens != NULL ? AA_MAX_INPUTS : AA_VALID_LENS,
                                     g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return NULL;
  if (weights != NULL)
    *weights = qkv_node_output(node, 1);
  return qkv_node_output(node, 0);
}
