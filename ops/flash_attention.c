/* flash_attention.c: the memory-efficient attention kernels (see
 * flash-attention.h for the scheme and how masks are honoured).
 *
 * The products are the GEMM library's (qkv_sgemm, on the calling thread
 * inside a pool chunk); the exps are SLEEF's over a whole block
 * (qkv_vec_exp); the passes over rows of a block (maximum, shift, sum,
 * rescale, the softmax gradient) have AVX-512 versions picked with the same
 * ISA as vecmath.c (so QKV_VEC_ISA=avx2 or scalar turns them off too) and
 * plain C fallbacks.
 */
#include "flash-attention.h"

#if defined(__x86_64__) || defined(__i386__)
#define FLASH_X86 1
#include <immintrin.h>
#endif

/* A row whose running maximum is at or below this visits every key block:
 * there, masked keys (-1e6) may carry weight. Above it, exp(-1e6 - max) is
 * below e^-120, which rounds to 0 in float (the smallest subnormal is about
 * e^-103), so skipped blocks change nothing. */
#define FLASH_LOW_ROW (QKV_ATTN_MASKED_SCORE + 120.0f)

/* ---- row passes ---------------------------------------------------------- */

#ifdef FLASH_X86
static gint avx512_state = -1;

static gboolean
use_avx512(void)
{
  gint s = g_atomic_int_get(&avx512_state);
  if (G_UNLIKELY(s < 0)) {
    s = g_strcmp0(qkv_vec_isa(), "avx512f") == 0 ? 1 : 0;
    g_atomic_int_set(&avx512_state, s);
  }
  return s == 1;
}

#pragma GCC push_options
#pragma GCC target("avx512f")

static inline __mmask16
tail_mask(gint64 left)
{
  return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static float
row_max_avx512(const float *x, gint64 n)
{
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (gint64 j = 0; j < n; j += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - j), x + j));
  return _mm512_reduce_max_ps(m);
}

static void
row_shift_avx512(float *x, gint64 n, float a)
{
  const __m512 va = _mm512_set1_ps(a);
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(x + j, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + j), va));
  }
}

static void
row_shift2_avx512(float *x, gint64 n, float a, float b)
{
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    __m512 y = _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + j), va);
    _mm512_mask_storeu_ps(x + j, k, _mm512_add_ps(y, vb));
  }
}

static float
row_sum_avx512(const float *x, gint64 n)
{
  __m512 s = _mm512_setzero_ps();
  for (gint64 j = 0; j < n; j += 16)
    s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tail_mask(n - j), x + j));
  return _mm512_reduce_add_ps(s);
}

static void
row_scale_avx512(float *x, gint64 n, float a)
{
  const __m512 va = _mm512_set1_ps(a);
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), va));
  }
}

static void
row_mul_avx512(float *dst, const float *x, const float *y, gint64 n)
{
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(
        dst + j, k,
        _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), _mm512_maskz_loadu_ps(k, y + j)));
  }
}

static float
row_dot_avx512(const float *x, const float *y, gint64 n)
{
  __m512 s = _mm512_setzero_ps();
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + j), _mm512_maskz_loadu_ps(k, y + j), s);
  }
  return _mm512_reduce_add_ps(s);
}

static void
row_softmax_grad_avx512(float *dp, const float *p, float dot, gint64 n)
{
  const __m512 vd = _mm512_set1_ps(dot);
  for (gint64 j = 0; j < n; j += 16) {
    __mmask16 k = tail_mask(n - j);
    __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd);
    _mm512_mask_storeu_ps(dp + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), g));
  }
}

#pragma GCC pop_options
#endif

/* max_j x[j] (-inf for n = 0) */
static float
row_max(const float *x, gint64 n)
{
#ifdef FLASH_X86
  if (use_avx512())
    return row_max_avx512(x, n);
#endif
  float m = -INFINITY;
  for (gint64 j = 0; j < n; j++)
    m = x[j] > m ? x[j] : m;
  return m;
}

/* x += a */
static void
row_shift(float *x, gint64 n, float a)
{
#ifdef FLASH_X86
  if (use_avx512()) {
    row_shift_avx512(x, n, a);
    return;
  }
#endif
  for (gint64 j = 0; j < n; j++)
    x[j] += a;
}

/* x = (x + a) + b */
static void
row_shift2(float *x, gint64 n, float a, float b)
{
#ifdef FLASH_X86
  if (use_avx512()) {
    row_shift2_avx512(x, n, a, b);
    return;
  }
#endif
  for (gint64 j = 0; j < n; j++)
    x[j] = (x[j] + a) + b;
}

static float
row_sum(const float *x, gint64 n)
{
#ifdef FLASH_X86
  if (use_avx512())
    return row_sum_avx512(x, n);
#endif
  float s = 0.0f;
  for (gint64 j = 0; j < n; j++)
    s += x[j];
  return s;
}

/* x *= a */
static void
row_scale(float *x, gint64 n, float a)
{
#ifdef FLASH_X86
  if (use_avx512()) {
    row_scale_avx512(x, n, a);
    return;
  }
#endif
  for (gint64 j = 0; j < n; j++)
    x[j] *= a;
}

/* dst = x · y elementwise (dst may be x) */
static void
row_mul(float *dst, const float *x, const float *y, gint64 n)
{
#ifdef FLASH_X86
  if (use_avx512()) {
    row_mul_avx512(dst, x, y, n);
    return;
  }
#endif
  for (gint64 j = 0; j < n; j++)
    dst[j] = x[j] * y[j];
}

static float
row_dot(const float *x, const float *y, gint64 n)
{
#ifdef FLASH_X86
  if (use_avx512())
    return row_dot_avx512(x, y, n);
#endif
  float s = 0.0f;
  for (gint64 j = 0; j < n; j++)
    s += x[j] * y[j];
  return s;
}

/* dp = p · (dp − dot): the softmax's gradient before masking */
static void
row_softmax_grad(float *dp, const float *p, float dot, gint64 n)
{
#ifdef FLASH_X86
  if (use_avx512()) {
    row_softmax_grad_avx512(dp, p, dot, n);
    return;
  }
#endif
  for (gint64 j = 0; j < n; j++)
    dp[j] = p[j] * (dp[j] - dot);
}

/* ---- masks ----------------------------------------------------------------- */

/* Keys j0 … j0 + n − 1 of score row `row` (limit: its kept prefix): the
 * scores s as the book's masked_softmax sees them (an additive mask added,
 * masked scores replaced by -1e6). */
static void
mask_scores(const QkvAttnProblem *pb, float *s, gint64 row, gint64 j0, gint64 n, gint64 limit)
{
  const QkvAttnScoreMask *mv = pb->mask.values;
  if (mv == NULL) {
    for (gint64 c = MAX(limit - j0, 0); c < n; c++)
      s[c] = QKV_ATTN_MASKED_SCORE;
    return;
  }
  const float *mrow = qkv_attn_mask_row(mv, row);
  const gint64 ks = mv->key_stride;
  for (gint64 c = 0; c < n; c++) {
    gint64 j = j0 + c;
    if (j >= limit)
      s[c] = QKV_ATTN_MASKED_SCORE;
    else if (mv->additive)
      s[c] += mrow[j * ks];
    else if (mrow[j * ks] == 0.0f)
      s[c] = QKV_ATTN_MASKED_SCORE;
  }
}

/* Zero the gradient at the masked keys of a row (their scores were replaced
 * by a constant). */
static void
mask_gradient(const QkvAttnProblem *pb, float *ds, gint64 row, gint64 j0, gint64 n, gint64 limit)
{
  const QkvAttnScoreMask *mv = pb->mask.values;
  for (gint64 c = MAX(limit - j0, 0); c < n; c++)
    ds[c] = 0.0f;
  if (mv == NULL || mv->additive)
    return;
  const float *mrow = qkv_attn_mask_row(mv, row);
  for (gint64 c = 0; c < MIN(limit - j0, n); c++)
    if (mrow[(j0 + c) * mv->key_stride] == 0.0f)
      ds[c] = 0.0f;
}

/* ---- layout helpers ---------------------------------------------------------- */

static gint64
block_q_of(const QkvFlashLayout *L)
{
  gint64 b = L->block_q > 0 ? L->block_q : QKV_FLASH_BLOCK_Q;
  return MAX(MIN(b, L->pb.n_q), 1);
}

static gint64
block_k_of(const QkvFlashLayout *L)
{
  gint64 b = L->block_k > 0 ? L->block_k : QKV_FLASH_BLOCK_K;
  return MAX(MIN(b, L->pb.n_k), 1);
}

static gint64
n_blocks(gint64 n, gint64 block)
{
  return (n + block - 1) / block;
}

/* Offsets of problem idx's blocks. */
static void
problem_offsets(const QkvFlashLayout *L, gint64 idx, gint64 *qo, gint64 *ko, gint64 *vo, gint64 *oo)
{
  gint64 b = idx / L->heads, h = idx % L->heads;
  *qo = b * L->q_batch + h * L->q_head;
  *ko = b * L->k_batch + h * L->k_head;
  *vo = b * L->v_batch + h * L->v_head;
  *oo = b * L->o_batch + h * L->o_head;
}

/* Blocks handed out in the order 0, n−1, 1, n−2, …: under a causal mask the
 * work per block grows (or shrinks) along the sequence, and this keeps
 * contiguous chunks of blocks about equal. */
static gint64
zigzag(gint64 u, gint64 n)
{
  return (u & 1) ? n - 1 - u / 2 : u / 2;
}

/* Floats rounded up to whole cache lines, so that each buffer is aligned. */
static gint64
lines(gint64 floats)
{
  return (floats + 15) / 16 * 16;
}

static gint64
forward_floats(gint64 bq, gint64 bk)
{
  /* scores, dropout row, m, l, rescale factors, row limits (gint64) */
  return lines(bq * bk) + lines(bk) + 3 * lines(bq) + lines(2 * bq);
}

static gint64
backward_floats(gint64 n_q, gint64 bq, gint64 bk)
{
  /* weights, their gradient, dropout block, D (a problem's rows), limits */
  return 3 * lines(bq * bk) + lines(n_q) + lines(2 * bq);
}

static gint64
clamp_block(gint64 b, gint64 def, gint64 n)
{
  return MAX(MIN(b > 0 ? b : def, n), 1);
}

gsize
qkv_flash_forward_scratch(gint64 n_q, gint64 n_k, gint64 d, gint64 d_v, gint64 block_q,
                          gint64 block_k, gint n_threads)
{
  gint64 bq = clamp_block(block_q, QKV_FLASH_BLOCK_Q, n_q);
  gint64 bk = clamp_block(block_k, QKV_FLASH_BLOCK_K, n_k);
  return (gsize)MAX(n_threads, 1) * (gsize)forward_floats(bq, bk) * sizeof(float);
}

/* Per thread, then the dq partials of threads 1… when the problems are
 * fewer than the threads (the key blocks of one problem are split). */
gsize
qkv_flash_backward_scratch(gint64 n_problems, gint64 n_q, gint64 n_k, gint64 d, gint64 d_v,
                           gint64 block_q, gint64 block_k, gint n_threads)
{
  gint64 bq = clamp_block(block_q, QKV_FLASH_BLOCK_Q, n_q);
  gint64 bk = clamp_block(block_k, QKV_FLASH_BLOCK_K, n_k);
  gint nt = MAX(n_threads, 1);
  gsize bytes = (gsize)nt * (gsize)backward_floats(n_q, bq, bk) * sizeof(float);
  if (n_problems < nt)
    bytes += (gsize)(nt - 1) * (gsize)lines(n_q * d) * sizeof(float);
  return bytes;
}

/* Threads for work multiply-adds, capped by what scratch holds. */
static gint
flash_threads(const QkvKernelCtx *ctx, gint64 work, gint64 units, gsize per_thread,
              gsize extra_per_thread)
{
  gint nt = qkv_work_threads(MAX(ctx->n_threads, 1), 2 * work);
  nt = (gint)MIN((gint64)nt, MAX(units, 1));
  while (nt > 1 && (gsize)nt * per_thread + (gsize)(nt - 1) * extra_per_thread > ctx->scratch_size)
    nt--;
  return MAX(nt, 1);
}

/* ---- forward ------------------------------------------------------------------ */

typedef struct {
  const QkvKernelCtx *ctx;
  const QkvFlashLayout *L;
  gconstpointer q, k, v; /* stored as L->pb.q_dtype, k_dtype, v_dtype */
  float *out, *stats;
  gint64 bq, bk, n_qb;
  gint64 per_thread; /* floats */
} ForwardJob;

/* Query block t of problem idx. */
static void
forward_block(const ForwardJob *job, gint64 idx, gint64 t, float *ws)
{
  const QkvFlashLayout *L = job->L;
  const QkvAttnProblem *pb = &L->pb;
  const gint64 n_q = pb->n_q, n_k = pb->n_k, d = pb->d, d_v = pb->d_v;
  const gint64 bq = job->bq, bk = job->bk;
  gint64 qo, ko, vo, oo;
  problem_offsets(L, idx, &qo, &ko, &vo, &oo);
  const gint64 i0 = t * bq, br = MIN(bq, n_q - i0);
  gconstpointer q = qkv_attn_operand_at(job->q, pb->q_dtype, qo + i0 * pb->ldq),
                k = qkv_attn_operand_at(job->k, pb->k_dtype, ko),
                v = qkv_attn_operand_at(job->v, pb->v_dtype, vo);
  float *o = job->out + oo + i0 * pb->ldo;
  float *s = ws, *drow = s + lines(bq * bk), *m = drow + lines(bk), *l = m + lines(bq);
  float *alpha = l + lines(bq);
  gint64 *limit = (gint64 *)(alpha + lines(bq));
  const gint64 row0 = idx * n_q + i0;

  gint64 kmax = 0;
  for (gint64 r = 0; r < br; r++) {
    limit[r] = MIN(qkv_attn_row_limit(&pb->mask, row0 + r, n_k), n_k);
    kmax = MAX(kmax, limit[r]);
    m[r] = -INFINITY;
    l[r] = 0.0f;
    memset(o + r * pb->ldo, 0, (gsize)d_v * sizeof(float));
  }
  for (gint64 j0 = 0; j0 < n_k; j0 += bk) {
    if (j0 >= kmax) {
      gboolean low = FALSE;
      for (gint64 r = 0; r < br && !low; r++)
        low = limit[r] < n_k && m[r] <= FLASH_LOW_ROW;
      if (!low)
        break;
    }
    const gint64 bc = MIN(bk, n_k - j0);
    qkv_attn_sgemm_typed(FALSE, TRUE, br, bc, d, pb->scale, q, pb->q_dtype, pb->ldq,
                         qkv_attn_operand_at(k, pb->k_dtype, j0 * pb->ldk), pb->k_dtype, pb->ldk,
                         0.0f, s, bc);
    for (gint64 r = 0; r < br; r++) {
      float *sr = s + r * bc;
      mask_scores(pb, sr, row0 + r, j0, bc, limit[r]);
      float mx = MAX(m[r], row_max(sr, bc));
      alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mx);
      m[r] = mx;
      row_shift(sr, bc, -mx);
    }
    qkv_vec_exp(s, s, (gsize)(br * bc));
    for (gint64 r = 0; r < br; r++) {
      float *sr = s + r * bc;
      l[r] = l[r] * alpha[r] + row_sum(sr, bc);
      if (alpha[r] != 1.0f)
        row_scale(o + r * pb->ldo, d_v, alpha[r]);
      if (L->dropout_active) {
        /* the counter of the weights path's dropout mask element */
        qkv_random_dropout_mask(L->key, (guint64)((row0 + r) * n_k + j0), (gsize)bc,
                                (float)pb->dropout, drow);
        row_mul(sr, sr, drow, bc);
      }
    }
    if (d_v > 0)
      qkv_attn_sgemm_typed(FALSE, FALSE, br, d_v, bc, 1.0f, s, QKV_F32, bc,
                           qkv_attn_operand_at(v, pb->v_dtype, j0 * pb->ldv), pb->v_dtype, pb->ldv,
                           1.0f, o, pb->ldo);
  }
  for (gint64 r = 0; r < br; r++) {
    float *st = job->stats + 2 * (row0 + r);
    if (n_k == 0) {
      st[0] = st[1] = 0.0f;
      continue;
    }
    row_scale(o + r * pb->ldo, d_v, 1.0f / l[r]);
    st[0] = m[r];
    st[1] = logf(l[r]);
  }
}

static void
forward_units(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ForwardJob *job = user_data;
  float *ws = (float *)job->ctx->scratch + thread * job->per_thread;
  for (gint64 u = begin; u < end; u++)
    forward_block(job, u / job->n_qb, zigzag(u % job->n_qb, job->n_qb), ws);
}

void
qkv_flash_forward(const QkvKernelCtx *ctx, const QkvFlashLayout *L, gconstpointer q,
                  gconstpointer k, gconstpointer v, float *out, float *stats)
{
  const QkvAttnProblem *pb = &L->pb;
  if (pb->n_q <= 0 || L->n_problems <= 0)
    return;
  ForwardJob job = {.ctx = ctx, .L = L, .q = q, .k = k, .v = v, .out = out, .stats = stats};
  job.bq = block_q_of(L);
  job.bk = block_k_of(L);
  job.n_qb = n_blocks(pb->n_q, job.bq);
  job.per_thread = forward_floats(job.bq, job.bk);
  gint64 units = L->n_problems * job.n_qb;
  gint64 work = L->n_problems * pb->n_q * MAX(pb->n_k, 1) * MAX(MAX(pb->d, pb->d_v), 1);
  gint nt = flash_threads(ctx, work, units, (gsize)job.per_thread * sizeof(float), 0);
  qkv_parallel_for(nt, units, forward_units, &job);
}

/* ---- backward ----------------------------------------------------------------- */

typedef struct {
  const QkvKernelCtx *ctx;
  const QkvFlashLayout *L;
  gconstpointer q, k, v; /* stored as L->pb.q_dtype, k_dtype, v_dtype */
  const float *out, *stats, *dout;
  float *dq, *dk, *dv, *dscores;
  gint64 bq, bk, n_qb, n_kb;
  gint64 per_thread; /* floats */
  /* split mode: one problem, its key blocks over the threads */
  gint64 split_idx;
  const float *split_D;
  float *partials; /* threads 1…: n_q × d each (lines(n_q·d) apart) */
} BackwardJob;

/* D_i = dout_i · out_i for every query row of problem idx (Σ_j p_ij dp_ij,
 * with dropout as well). */
static void
row_dots(const BackwardJob *job, gint64 idx, float *D)
{
  const QkvFlashLayout *L = job->L;
  gint64 qo, ko, vo, oo;
  problem_offsets(L, idx, &qo, &ko, &vo, &oo);
  for (gint64 i = 0; i < L->pb.n_q; i++)
    D[i] = row_dot(job->dout + oo + i * L->pb.ldo, job->out + oo + i * L->pb.ldo, L->pb.d_v);
}

/* Key block kt of problem idx against every query block: dk and dv of its
 * keys, and its share of dq added to dq_rows (row stride ld_dq). */
static void
backward_block(const BackwardJob *job, gint64 idx, gint64 kt, const float *D, float *dq_rows,
               gint64 ld_dq, float *ws)
{
  const QkvFlashLayout *L = job->L;
  const QkvAttnProblem *pb = &L->pb;
  const gint64 n_q = pb->n_q, n_k = pb->n_k, d = pb->d, d_v = pb->d_v;
  const gint64 bq = job->bq, bk = job->bk;
  gint64 qo, ko, vo, oo;
  problem_offsets(L, idx, &qo, &ko, &vo, &oo);
  const gint64 j0 = kt * bk, bc = MIN(bk, n_k - j0);
  gconstpointer kb = qkv_attn_operand_at(job->k, pb->k_dtype, ko + j0 * pb->ldk),
                vb = qkv_attn_operand_at(job->v, pb->v_dtype, vo + j0 * pb->ldv);
  float *dkb = job->dk + ko + j0 * pb->ldk, *dvb = job->dv + vo + j0 * pb->ldv;
  float *p = ws, *dp = p + lines(bq * bk), *drop = dp + lines(bq * bk);
  gint64 *limit = (gint64 *)(drop + lines(bq * bk) + lines(n_q));
  /* per query row: the maximum m and log l of the forward's sum */
  const float *stats = job->stats + 2 * idx * n_q;

  qkv_attn_zero_block(dkb, bc, d, pb->ldk);
  qkv_attn_zero_block(dvb, bc, d_v, pb->ldv);
  for (gint64 t = 0; t < job->n_qb; t++) {
    const gint64 i0 = t * bq, br = MIN(bq, n_q - i0), row0 = idx * n_q + i0;
    gboolean needed = FALSE;
    for (gint64 r = 0; r < br; r++) {
      limit[r] = MIN(qkv_attn_row_limit(&pb->mask, row0 + r, n_k), n_k);
      needed |= j0 < limit[r] || (limit[r] < n_k && stats[2 * (i0 + r)] <= FLASH_LOW_ROW);
    }
    if (!needed)
      continue;
    gconstpointer qb = qkv_attn_operand_at(job->q, pb->q_dtype, qo + i0 * pb->ldq);
    const float *dob = job->dout + oo + i0 * pb->ldo;
    /* the weights of the block, again */
    qkv_attn_sgemm_typed(FALSE, TRUE, br, bc, d, pb->scale, qb, pb->q_dtype, pb->ldq, kb,
                         pb->k_dtype, pb->ldk, 0.0f, p, bc);
    for (gint64 r = 0; r < br; r++) {
      mask_scores(pb, p + r * bc, row0 + r, j0, bc, limit[r]);
      /* (s − m) − log l: s − m is exact where s is near m, even where both
       * are -1e6 (a row without kept keys), which s − (m + log l) is not */
      row_shift2(p + r * bc, bc, -stats[2 * (i0 + r)], -stats[2 * (i0 + r) + 1]);
    }
    qkv_vec_exp(p, p, (gsize)(br * bc));
    const float *pd = p;
    if (L->dropout_active) {
      for (gint64 r = 0; r < br; r++) {
        qkv_random_dropout_mask(L->key, (guint64)((row0 + r) * n_k + j0), (gsize)bc,
                                (float)pb->dropout, drop + r * bc);
        row_mul(dp + r * bc, p + r * bc, drop + r * bc, bc);
      }
      pd = dp;
    }
    /* dv += dropout(p)ᵀ dout */
    if (d_v > 0)
      qkv_attn_sgemm(TRUE, FALSE, bc, d_v, br, 1.0f, pd, bc, dob, pb->ldo, 1.0f, dvb, pb->ldv);
    /* dp = dout vᵀ (· the dropout mask) */
    qkv_attn_sgemm_typed(FALSE, TRUE, br, bc, d_v, 1.0f, dob, QKV_F32, pb->ldo, vb, pb->v_dtype,
                         pb->ldv, 0.0f, dp, bc);
    for (gint64 r = 0; r < br; r++) {
      float *dpr = dp + r * bc;
      if (L->dropout_active)
        row_mul(dpr, dpr, drop + r * bc, bc);
      row_softmax_grad(dpr, p + r * bc, D[i0 + r], bc);
      mask_gradient(pb, dpr, row0 + r, j0, bc, limit[r]);
      if (job->dscores != NULL)
        memcpy(job->dscores + (row0 + r) * n_k + j0, dpr, (gsize)bc * sizeof(float));
    }
    /* dq += scale · ds k, dk += scale · dsᵀ q */
    if (d > 0) {
      qkv_attn_sgemm_typed(FALSE, FALSE, br, d, bc, pb->scale, dp, QKV_F32, bc, kb, pb->k_dtype,
                           pb->ldk, 1.0f, dq_rows + i0 * ld_dq, ld_dq);
      qkv_attn_sgemm_typed(TRUE, FALSE, bc, d, br, pb->scale, dp, QKV_F32, bc, qb, pb->q_dtype,
                           pb->ldq, 1.0f, dkb, pb->ldk);
    }
  }
}

/* Whole problems [begin, end), one thread each. */
static void
backward_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const BackwardJob *job = user_data;
  const QkvAttnProblem *pb = &job->L->pb;
  float *ws = (float *)job->ctx->scratch + thread * job->per_thread;
  float *D = ws + 3 * lines(job->bq * job->bk);
  for (gint64 idx = begin; idx < end; idx++) {
    gint64 qo, ko, vo, oo;
    problem_offsets(job->L, idx, &qo, &ko, &vo, &oo);
    row_dots(job, idx, D);
    qkv_attn_zero_block(job->dq + qo, pb->n_q, pb->d, pb->ldq);
    if (job->dscores != NULL)
      memset(job->dscores + idx * pb->n_q * pb->n_k, 0, (gsize)(pb->n_q * pb->n_k) * sizeof(float));
    for (gint64 kt = 0; kt < job->n_kb; kt++)
      backward_block(job, idx, kt, D, job->dq + qo, pb->ldq, ws);
  }
}

/* Key blocks [begin, end) of problem split_idx: thread 0 adds into dq, the
 * others into their partials. */
static void
backward_key_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const BackwardJob *job = user_data;
  const QkvAttnProblem *pb = &job->L->pb;
  float *ws = (float *)job->ctx->scratch + thread * job->per_thread;
  gint64 qo, ko, vo, oo;
  problem_offsets(job->L, job->split_idx, &qo, &ko, &vo, &oo);
  float *dq = thread == 0 ? job->dq + qo : job->partials + (thread - 1) * lines(pb->n_q * pb->d);
  gint64 ld = thread == 0 ? pb->ldq : pb->d;
  for (gint64 u = begin; u < end; u++)
    backward_block(job, job->split_idx, zigzag(u, job->n_kb), job->split_D, dq, ld, ws);
}

void
qkv_flash_backward(const QkvKernelCtx *ctx, const QkvFlashLayout *L, gconstpointer q,
                   gconstpointer k, gconstpointer v, const float *out, const float *stats,
                   const float *dout, float *dq, float *dk, float *dv, float *dscores)
{
  const QkvAttnProblem *pb = &L->pb;
  if (L->n_problems <= 0)
    return;
  if (pb->n_q <= 0) {
    /* no query: nothing reaches the keys and values */
    for (gint64 idx = 0; idx < L->n_problems; idx++) {
      gint64 qo, ko, vo, oo;
      problem_offsets(L, idx, &qo, &ko, &vo, &oo);
      qkv_attn_zero_block(dk + ko, pb->n_k, pb->d, pb->ldk);
      qkv_attn_zero_block(dv + vo, pb->n_k, pb->d_v, pb->ldv);
    }
    return;
  }
  BackwardJob job = {.ctx = ctx,
                     .L = L,
                     .q = q,
                     .k = k,
                     .v = v,
                     .out = out,
                     .stats = stats,
                     .dout = dout,
                     .dq = dq,
                     .dk = dk,
                     .dv = dv,
                     .dscores = dscores};
  job.bq = block_q_of(L);
  job.bk = block_k_of(L);
  job.n_qb = n_blocks(pb->n_q, job.bq);
  job.n_kb = pb->n_q > 0 ? n_blocks(pb->n_k, job.bk) : 0;
  job.per_thread = backward_floats(pb->n_q, job.bq, job.bk);
  gint64 work = L->n_problems * pb->n_q * MAX(pb->n_k, 1) * MAX(MAX(pb->d, pb->d_v), 1);
  gsize per_thread = (gsize)job.per_thread * sizeof(float);
  gint nt = flash_threads(ctx, work, L->n_problems * MAX(job.n_kb, 1), per_thread, 0);
  if (nt <= 1 || L->n_problems >= nt || job.n_kb < 2) {
    nt = MIN(nt, (gint)MIN(L->n_problems, G_MAXINT));
    qkv_parallel_for(nt, L->n_problems, backward_problems, &job);
    return;
  }
  /* fewer problems than threads: split each problem's key blocks */
  gsize partial = (gsize)lines(pb->n_q * pb->d) * sizeof(float);
  nt = flash_threads(ctx, work, job.n_kb, per_thread, partial);
  nt = (gint)MIN((gint64)nt, job.n_kb);
  float *D = (float *)ctx->scratch + 3 * lines(job.bq * job.bk);
  job.partials = (float *)ctx->scratch + nt * job.per_thread;
  job.split_D = D;
  for (gint64 idx = 0; idx < L->n_problems; idx++) {
    gint64 qo, ko, vo, oo;
    problem_offsets(L, idx, &qo, &ko, &vo, &oo);
    row_dots(&job, idx, D);
    qkv_attn_zero_block(dq + qo, pb->n_q, pb->d, pb->ldq);
    if (nt > 1)
      memset(job.partials, 0, (gsize)(nt - 1) * partial);
    if (dscores != NULL)
      memset(dscores + idx * pb->n_q * pb->n_k, 0, (gsize)(pb->n_q * pb->n_k) * sizeof(float));
    job.split_idx = idx;
    qkv_parallel_for(nt, job.n_kb, backward_key_blocks, &job);
    for (gint th = 1; th < nt; th++) {
      const float *part = job.partials + (th - 1) * lines(pb->n_q * pb->d);
      for (gint64 i = 0; i < pb->n_q; i++) {
        float *row = dq + qo + i * pb->ldq;
        const float *src = part + i * pb->d;
        for (gint64 c = 0; c < pb->d; c++)
          row[c] += src[c];
      }
    }
  }
}
