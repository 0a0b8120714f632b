/* attention-common.h: what masked_softmax, dot_product_attention,
 * multi_head_attention and dropout share (not installed).
 *
 * Masking follows the book's masked_softmax: a masked score is replaced by
 * -1e6 before the softmax. A row always keeps a prefix of its keys (valid
 * lengths and the causal mask both cut the row at some key), so the row
 * kernels take that prefix length. With at least one key kept, exp(-1e6 - max)
 * is exactly 0 in float, so the masked weights are 0; with none kept, every
 * score is -1e6 and the row is uniform, as in the book. (The book's result
 * differs only when the kept scores themselves lie below about -1e6 + 100.)
 * A replaced score has no gradient.
 */
#pragma once

#include "ops-common.h"

#include <cblas.h>
#include <math.h>

typedef struct {
  float *dst;
  const float *a, *b;
} QkvMulJob;

static inline void
qkv_mul_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvMulJob *j = user_data;
  for (gint64 i = begin; i < end; i++)
    j->dst[i] = j->a[i] * j->b[i];
}

/* dst[i] = a[i] · b[i] for i < n (applying a dropout mask), on the pool. */
static inline void
qkv_mul_floats(const QkvKernelCtx *ctx, float *dst, const float *a, const float *b, gint64 n)
{
  QkvMulJob job = {dst, a, b};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, qkv_mul_range, &job);
}

/* How the rows of a (…, n_q, n_k) score tensor are masked. */
typedef struct {
  const gint32 *lens;    /* valid lengths, or NULL */
  gboolean per_query;    /* lens is (B, n_q), not (B) */
  gint64 rows_per_batch; /* score rows under one leading batch element */
  gint64 n_q;
  gboolean causal; /* key j > query i is masked */
} QkvAttnMask;

/* The number of keys row r keeps (a prefix of its n_k keys). */
static inline gint64
qkv_attn_row_limit(const QkvAttnMask *m, gint64 r, gint64 n_k)
{
  gint64 limit = n_k;
  gint64 i = r % m->n_q;
  if (m->lens != NULL) {
    gint64 b = r / m->rows_per_batch;
    gint64 len = m->per_query ? m->lens[b * m->n_q + i] : m->lens[b];
    limit = MIN(limit, len);
  }
  if (m->causal)
    limit = MIN(limit, i + 1);
  return MAX(limit, 0);
}

/* y = masked softmax of one row x of n scores, keeping the first limit; y
 * may equal x. */
static inline void
qkv_attn_softmax_row(float *y, const float *x, gint64 n, gint64 limit)
{
  if (limit <= 0) {
    float u = n > 0 ? 1.0f / (float)n : 0.0f;
    for (gint64 j = 0; j < n; j++)
      y[j] = u;
    return;
  }
  float m = x[0];
  for (gint64 j = 1; j < limit; j++)
    m = x[j] > m ? x[j] : m;
  for (gint64 j = 0; j < limit; j++)
    y[j] = x[j] - m;
  qkv_vec_exp(y, y, (gsize)limit);
  float sum = 0.0f;
  for (gint64 j = 0; j < limit; j++)
    sum += y[j];
  float inv = 1.0f / sum;
  for (gint64 j = 0; j < limit; j++)
    y[j] *= inv;
  for (gint64 j = limit; j < n; j++)
    y[j] = 0.0f;
}

/* The masked softmax of n_rows consecutive rows of n scores (score rows
 * first_row … of the tensor m describes); y may equal x. Same numbers as
 * qkv_attn_softmax_row, with one exp call over the whole block, which is
 * what makes short rows (n of 10 or so) cheap: masked keys enter the exp as
 * -inf (giving 0), a row without kept keys as zeros (giving a uniform row). */
static inline void
qkv_attn_softmax_rows(float *y, const float *x, gint64 n_rows, gint64 n, const QkvAttnMask *m,
                      gint64 first_row)
{
  if (n <= 0 || n_rows <= 0)
    return;
  for (gint64 i = 0; i < n_rows; i++) {
    const float *xr = x + i * n;
    float *yr = y + i * n;
    gint64 limit = MIN(qkv_attn_row_limit(m, first_row + i, n), n);
    if (limit <= 0) {
      for (gint64 j = 0; j < n; j++)
        yr[j] = 0.0f;
      continue;
    }
    float mx = xr[0];
    for (gint64 j = 1; j < limit; j++)
      mx = xr[j] > mx ? xr[j] : mx;
    for (gint64 j = 0; j < limit; j++)
      yr[j] = xr[j] - mx;
    for (gint64 j = limit; j < n; j++)
      yr[j] = -INFINITY;
  }
  qkv_vec_exp(y, y, (gsize)(n_rows * n));
  for (gint64 i = 0; i < n_rows; i++) {
    float *yr = y + i * n;
    float sum = 0.0f;
    for (gint64 j = 0; j < n; j++)
      sum += yr[j];
    float inv = 1.0f / sum;
    for (gint64 j = 0; j < n; j++)
      yr[j] *= inv;
  }
}

/* dx = y · (dy − Σ dy·y) over the kept prefix of one row, 0 for masked keys
 * (their scores were replaced by a constant); dx may equal dy. */
static inline void
qkv_attn_softmax_backward_row(float *dx, const float *dy, const float *y, gint64 n, gint64 limit)
{
  limit = MIN(limit, n);
  float dot = 0.0f;
  for (gint64 j = 0; j < limit; j++)
    dot += dy[j] * y[j];
  for (gint64 j = 0; j < limit; j++)
    dx[j] = y[j] * (dy[j] - dot);
  for (gint64 j = MAX(limit, 0); j < n; j++)
    dx[j] = 0.0f;
}

/* Validate a dropout probability attribute. */
static inline gboolean
qkv_attn_check_dropout(const QkvShapeCtx *ctx, const gchar *name, GError **error)
{
  double p = qkv_attrs_get_float(ctx->attrs, name);
  if (!(p >= 0.0 && p < 1.0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "%s must be in [0, 1), got %g", name,
                           p);
  return TRUE;
}

/* Whether a kernel applies dropout of probability p. */
static inline gboolean
qkv_dropout_active(const QkvKernelCtx *ctx, double p)
{
  return ctx->training && p > 0.0;
}

/* The dropout scale mask for elements first .. first + n - 1 of a tensor: 0
 * with probability p, else 1/(1-p). The same (seed, step, node) and element
 * give the same draw. Without dropout active, all ones. */
static inline void
qkv_dropout_fill_mask(const QkvKernelCtx *ctx, double p, float *mask, gint64 first, gint64 n)
{
  if (!qkv_dropout_active(ctx, p)) {
    for (gint64 j = 0; j < n; j++)
      mask[j] = 1.0f;
    return;
  }
  guint64 key = qkv_random_key(ctx->seed, ctx->step, ctx->node_id);
  qkv_random_dropout_mask(key, (guint64)first, (gsize)n, (float)p, mask);
}

/* Check valid_lens (i32, (B) or (B, n_q)) against scores of shape (B, …, n_q,
 * n_k); sets *per_query. */
static inline gboolean
qkv_attn_check_valid_lens(const QkvShapeCtx *ctx, guint index, gint64 batch, gint64 n_q,
                          gboolean *per_query, GError **error)
{
  const QkvShape *vl = &ctx->in_shapes[index];
  if (ctx->in_dtypes[index] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "valid_lens must be i32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[index]));
  if (vl->rank == 1 && vl->dims[0] == batch) {
    *per_query = FALSE;
    return TRUE;
  }
  if (vl->rank == 2 && vl->dims[0] == batch && vl->dims[1] == n_q) {
    *per_query = TRUE;
    return TRUE;
  }
  return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                         "valid_lens must be (%" G_GINT64_FORMAT ") or (%" G_GINT64_FORMAT
                         ", %" G_GINT64_FORMAT ") (batch, or batch and queries)",
                         batch, batch, n_q);
}

/* A mask description from a kernel's valid_lens view (may be NULL). */
static inline QkvAttnMask
qkv_attn_mask_from_view(const QkvView *valid_lens, gint64 rows_per_batch, gint64 n_q,
                        gboolean causal)
{
  QkvAttnMask m = {0};
  m.lens = valid_lens != NULL ? valid_lens->data : NULL;
  m.per_query = valid_lens != NULL && valid_lens->shape.rank == 2;
  m.rows_per_batch = MAX(rows_per_batch, 1);
  m.n_q = MAX(n_q, 1);
  m.causal = causal;
  return m;
}

/* ---- scaled dot-product attention of one (batch, head) problem ---------- */

/* The sizes of one problem and the row strides (leading dimensions) of its
 * operands, which may be column blocks of wider matrices (one head of a
 * multi-head projection). P, the dropout mask and the scratch matrices are
 * contiguous n_q × n_k. */
typedef struct {
  gint64 n_q, n_k, d, d_v;
  gint64 ldq, ldk, ldv, ldo;
  float scale; /* 1/√d */
  double dropout;
  QkvAttnMask mask;
} QkvAttnProblem;

static inline void
qkv_attn_sgemm(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const float *a,
               gint64 lda, const float *b, gint64 ldb, float beta, float *c, gint64 ldc)
{
  qkv_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 0);
}

/* Forward of problem index `index` (its rows are rows index·n_q … of the
 * score tensor): p = masked_softmax(q kᵀ · scale), out = dropout(p) v.
 * drop (may be NULL: no dropout output) receives the dropout mask; pd is
 * n_q × n_k scratch, used when dropout is active. */
static inline void
qkv_attn_forward_problem(const QkvKernelCtx *ctx, const QkvAttnProblem *pb, gint64 index,
                         const float *q, const float *k, const float *v, float *p, float *drop,
                         float *pd, float *out)
{
  gint64 n_q = pb->n_q, n_k = pb->n_k;
  qkv_attn_sgemm(FALSE, TRUE, n_q, n_k, pb->d, pb->scale, q, pb->ldq, k, pb->ldk, 0.0f, p, n_k);
  qkv_attn_softmax_rows(p, p, n_q, n_k, &pb->mask, index * n_q);
  const float *a = p;
  if (drop != NULL) {
    qkv_dropout_fill_mask(ctx, pb->dropout, drop, index * n_q * n_k, n_q * n_k);
    if (qkv_dropout_active(ctx, pb->dropout)) {
      for (gint64 j = 0; j < n_q * n_k; j++)
        pd[j] = p[j] * drop[j];
      a = pd;
    }
  }
  if (n_k == 0) {
    for (gint64 i = 0; i < n_q; i++)
      memset(out + i * pb->ldo, 0, (gsize)pb->d_v * sizeof(float));
    return;
  }
  qkv_attn_sgemm(FALSE, FALSE, n_q, pb->d_v, n_k, 1.0f, a, n_k, v, pb->ldv, 0.0f, out, pb->ldo);
}

/* Zero an m × n block with row stride ld. */
static inline void
qkv_attn_zero_block(float *x, gint64 m, gint64 n, gint64 ld)
{
  for (gint64 i = 0; i < m; i++)
    memset(x + i * ld, 0, (gsize)n * sizeof(float));
}

/* Backward of one problem. dout (may be NULL: zero) is n_q × d_v with row
 * stride ldo; dweights (may be NULL) is a gradient reaching p directly; drop
 * is the saved dropout mask (NULL: none). dq, dk, dv have the strides of q,
 * k, v. pd and dp are n_q × n_k scratch. */
static inline void
qkv_attn_backward_problem(const QkvAttnProblem *pb, gint64 index, const float *dout, const float *q,
                          const float *k, const float *v, const float *p, const float *drop,
                          const float *dweights, float *pd, float *dp, float *dq, float *dk,
                          float *dv)
{
  gint64 n_q = pb->n_q, n_k = pb->n_k, nn = n_q * n_k;
  const float *a = p;
  if (drop != NULL) {
    for (gint64 j = 0; j < nn; j++)
      pd[j] = p[j] * drop[j];
    a = pd;
  }
  if (dout != NULL && n_q > 0) {
    qkv_attn_sgemm(TRUE, FALSE, n_k, pb->d_v, n_q, 1.0f, a, n_k, dout, pb->ldo, 0.0f, dv, pb->ldv);
    if (pb->d_v > 0)
      qkv_attn_sgemm(FALSE, TRUE, n_q, n_k, pb->d_v, 1.0f, dout, pb->ldo, v, pb->ldv, 0.0f, dp,
                     n_k);
    else
      memset(dp, 0, (gsize)nn * sizeof(float));
    if (drop != NULL)
      for (gint64 j = 0; j < nn; j++)
        dp[j] *= drop[j];
  } else {
    qkv_attn_zero_block(dv, n_k, pb->d_v, pb->ldv);
    memset(dp, 0, (gsize)nn * sizeof(float));
  }
  if (dweights != NULL)
    for (gint64 j = 0; j < nn; j++)
      dp[j] += dweights[j];
  for (gint64 i = 0; i < n_q; i++) {
    gint64 limit = qkv_attn_row_limit(&pb->mask, index * n_q + i, n_k);
    qkv_attn_softmax_backward_row(dp + i * n_k, dp + i * n_k, p + i * n_k, n_k, limit);
  }
  if (n_k > 0)
    qkv_attn_sgemm(FALSE, FALSE, n_q, pb->d, n_k, pb->scale, dp, n_k, k, pb->ldk, 0.0f, dq,
                   pb->ldq);
  else
    qkv_attn_zero_block(dq, n_q, pb->d, pb->ldq);
  if (n_q > 0)
    qkv_attn_sgemm(TRUE, FALSE, n_k, pb->d, n_q, pb->scale, dp, n_k, q, pb->ldq, 0.0f, dk, pb->ldk);
  else
    qkv_attn_zero_block(dk, n_k, pb->d, pb->ldk);
}

/* Below this many multiply-adds per problem and with at least as many
 * problems as threads, problems run in parallel on the pool (qkv_sgemm runs
 * on the calling thread inside a pool chunk); otherwise one after the other
 * with qkv_sgemm splitting each product. */
#define QKV_ATTN_SMALL_PROBLEM (256 * 256 * 256)
/* Below this many multiply-adds in all (per product), the problems run on one
 * thread: waking a team costs more than it saves, and OpenBLAS calls inside a
 * parallel region were seen to stall for milliseconds on a 2-vCPU VM. */
#define QKV_ATTN_PARALLEL_MIN (1 << 18)

/* Threads to spread n_problems of `work` multiply-adds each over, given
 * scratch for at most scratch_size / per_thread threads (the plan may have
 * been given more threads after it sized the scratch). Returns 1 for the
 * sequential path. */
static inline gint
qkv_attn_problem_threads(const QkvKernelCtx *ctx, gint64 n_problems, gint64 work, gsize per_thread,
                         gsize scratch_available)
{
  gint nt = MAX(ctx->n_threads, 1);
  if (per_thread > 0)
    nt = (gint)MIN((gsize)nt, MAX(scratch_available / per_thread, (gsize)1));
  if (nt <= 1 || n_problems * work < QKV_ATTN_PARALLEL_MIN ||
      (n_problems < nt && work >= QKV_ATTN_SMALL_PROBLEM))
    return 1;
  /* a multiply-add is two units of work */
  nt = MIN(nt, qkv_work_threads(nt, 2 * n_problems * work));
  return (gint)MIN((gint64)nt, MAX(n_problems, 1));
}
