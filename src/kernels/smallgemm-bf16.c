/* smallgemm-bf16.c: bf16 products too small for oneDNN's per-call cost (the
 * attention heads' 32×32×32 of a d_model 256 Transformer come by the
 * thousand per step), on CPUs with AVX512_BF16.
 *
 * The operands are rounded to bf16 as everywhere in bf16 precision
 * (VCVTNEPS2BF16: to nearest even, subnormals to zero, the rounding of
 * gemm-bf16.c), or taken as they are where stored as bf16 (a plan's bf16
 * activations, qkv_sgemm_typed()), and packed in pairs along k: one 32-bit word holds op(x)[i,
 * 2p] in its low half and op(x)[i, 2p + 1] in its high half (an odd k's
 * last word has a zero high half). VDPBF16PS then adds two exact products
 * per lane and instruction into float32 accumulators, so the results are
 * those of the emulated path (rounded operands, products exact in float32,
 * float32 sums) up to the order of the sums, and to VDPBF16PS flushing
 * subnormal partial sums to zero (as oneDNN's bf16 kernels do too).
 *
 * Blocking as in smallgemm.c: MR rows of op(a) (broadcast words) against up
 * to 4 vectors of 16 columns of op(b), the accumulators in registers, then
 * c = α·acc + β·c. The packed operands live in scratch the caller provides
 * (qkv_small_sgemm_bf16_scratch() bytes). */
#include "kernels/kernels-private.h"

#include <string.h>

#ifdef QKV_ARCH_X86
/* outside any target region, so that each intrinsic keeps its own ISA */
#include <immintrin.h>

/* Rows per block, for up to 2 and for 3 or 4 vectors of columns: MR × NV
 * accumulators, NV vectors of b and a broadcast fit in the 32 zmm
 * registers, with enough independent accumulators (12 or more) to keep two
 * dot-product pipes busy; 8 rows divide the attention heads' 32 or 64. */
#define MR_NARROW 8
#define MR_WIDE 6

static gint64
pairs(gint64 k)
{
  return (k + 1) / 2;
}

gsize
qkv_small_sgemm_bf16_scratch(gint64 m, gint64 n, gint64 k)
{
  /* packed a, packed b, 16 rows of pairs for pack_rows_transposed() */
  return (gsize)(pairs(k) * (m + n + 16) + 16) * sizeof(guint32);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/* n floats as bf16, one after the other; an odd n gets a zero after them,
 * so that the last pair is whole (written by the masked store, as the rest:
 * the kernel reads these bytes as 32-bit words). */
static inline void
row_to_bf16(guint16 *dst, const float *src, gint64 n)
{
  gint64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  if (i < n) { /* an odd n always leaves a tail of at most 15, so the pad fits */
    __mmask16 load = (__mmask16)((1u << (n - i)) - 1);
    __mmask16 store = (__mmask16)((1u << (n - i + n % 2)) - 1);
    __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(load, src + i));
    _mm256_mask_storeu_epi16(dst + i, store, (__m256i)v);
  }
}

/* row_to_bf16() for a row stored as bf16: a copy, and the zero (through
 * memcpy, as the kernel reads these bytes as 32-bit words). */
static inline void
row_copy_bf16(guint16 *dst, const guint16 *src, gint64 n)
{
  static const guint16 zero = 0;
  memcpy(dst, src, (gsize)n * sizeof(guint16));
  if (n % 2)
    memcpy(dst + n, &zero, sizeof zero);
}

/* x rows of k floats each (ld apart; bf16 where src16), k along the row,
 * into rows of pairs(k) words ld_dst apart: each row's pairs already lie
 * together. */
static void
pack_rows(guint32 *dst, gint64 ld_dst, gconstpointer src, gboolean src16, gint64 ld, gint64 x,
          gint64 k)
{
  for (gint64 r = 0; r < x; r++) {
    if (src16)
      row_copy_bf16((guint16 *)(dst + r * ld_dst), (const guint16 *)src + r * ld, k);
    else
      row_to_bf16((guint16 *)(dst + r * ld_dst), (const float *)src + r * ld, k);
  }
}

/* The same rows transposed: pair p of row r goes to dst[p·x + r]. Blocks of
 * 16 rows go through tmp (16 rows of pairs(k) words) and a gather takes
 * word p of the 16. */
static void
pack_rows_transposed(guint32 *dst, gconstpointer src, gboolean src16, gint64 ld, gint64 x, gint64 k,
                     guint32 *tmp)
{
  gsize elem = src16 ? sizeof(guint16) : sizeof(float);
  gint64 kh = pairs(k);
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_set1_epi32((int)kh),
                         _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  for (gint64 r0 = 0; r0 < x; r0 += 16) {
    gint64 nr = MIN(16, x - r0);
    __mmask16 mk = (__mmask16)(nr == 16 ? 0xffff : (1u << nr) - 1);
    pack_rows(tmp, kh, (const guint8 *)src + (gsize)(r0 * ld) * elem, src16, ld, nr, k);
    for (gint64 p = 0; p < kh; p++)
      _mm512_mask_storeu_epi32(
          dst + p * x + r0, mk,
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, rows, tmp + p, 4));
  }
}

/* 16 bf16 of row lo in the low half of a vector, 16 of row hi (NULL: zeros)
 * in the high half, as VCVTNE2PS2BF16 leaves converted floats (mk: the
 * columns there are). */
static inline __m512i
two_rows_bf16(const guint16 *lo, const guint16 *hi, __mmask16 mk)
{
  __m256i l = _mm256_maskz_loadu_epi16(mk, lo);
  __m256i h = hi != NULL ? _mm256_maskz_loadu_epi16(mk, hi) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
}

/* pack_across_rows() for rows stored as bf16. */
static void
pack_across_rows_bf16(guint32 *dst, gint64 stride_p, const guint16 *src, gint64 ld, gint64 x,
                      gint64 k, __m512i pair_up)
{
  for (gint64 p = 0; p < pairs(k); p++) {
    const guint16 *lo = src + 2 * p * ld, *hi = 2 * p + 1 < k ? lo + ld : NULL;
    guint32 *d = dst + p * stride_p;
    for (gint64 i = 0; i < x; i += 16) {
      __mmask16 mk = (__mmask16)(x - i >= 16 ? 0xffff : (1u << (x - i)) - 1);
      __m512i v = two_rows_bf16(lo + i, hi != NULL ? hi + i : NULL, mk);
      _mm512_mask_storeu_epi32(d + i, mk, _mm512_permutexvar_epi16(pair_up, v));
    }
  }
}

/* k rows of x floats each (ld apart; bf16 where src16), k across the rows:
 * rows 2p and 2p + 1 interleave into dst[p·stride_p + 0 … x).
 * VCVTNE2PS2BF16 puts the 16 bf16 of row 2p in the low half of a vector and
 * those of row 2p + 1 in the high half; a word permutation pairs them. */
static void
pack_across_rows(guint32 *dst, gint64 stride_p, gconstpointer source, gboolean src16, gint64 ld,
                 gint64 x, gint64 k)
{
  const __m512i pair_up =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  if (src16) {
    pack_across_rows_bf16(dst, stride_p, source, ld, x, k, pair_up);
    return;
  }
  const float *src = source;
  for (gint64 p = 0; p < pairs(k); p++) {
    const float *lo = src + 2 * p * ld, *hi = 2 * p + 1 < k ? lo + ld : NULL;
    guint32 *d = dst + p * stride_p;
    gint64 i = 0;
    for (; i + 16 <= x; i += 16) {
      __m512 h = hi != NULL ? _mm512_loadu_ps(hi + i) : _mm512_setzero_ps();
      __m512i v = (__m512i)_mm512_cvtne2ps_pbh(h, _mm512_loadu_ps(lo + i));
      _mm512_storeu_si512(d + i, _mm512_permutexvar_epi16(pair_up, v));
    }
    if (i < x) {
      __mmask16 mk = (__mmask16)((1u << (x - i)) - 1);
      __m512 h = hi != NULL ? _mm512_maskz_loadu_ps(mk, hi + i) : _mm512_setzero_ps();
      __m512i v = (__m512i)_mm512_cvtne2ps_pbh(h, _mm512_maskz_loadu_ps(mk, lo + i));
      _mm512_mask_storeu_epi32(d + i, mk, _mm512_permutexvar_epi16(pair_up, v));
    }
  }
}

/* One block of up to MR rows × NV vectors of 16 columns over kh pairs. Rows
 * past mr reuse the last row (computed, never stored). */
#define DEFINE_BLOCK(NV, MR)                                                                       \
  static inline void block_nv##NV(gint64 mr, gint64 kh, float alpha, const guint32 *a,             \
                                  gint64 a_rs, gint64 a_cs, const guint32 *b, gint64 ldb,          \
                                  float beta, float *c, gint64 ldc, __mmask16 tail)                \
  {                                                                                                \
    __m512 acc[MR][NV];                                                                            \
    const guint32 *ar[MR];                                                                         \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++)                                           \
    {                                                                                              \
      ar[r] = a + (r < mr ? r : mr - 1) * a_rs;                                                    \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();        \
    }                                                                                              \
    for (gint64 p = 0; p < kh; p++) {                                                              \
      const guint32 *brow = b + p * ldb;                                                           \
      __m512bh bv[NV];                                                                             \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                                 \
          (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, brow + 16 * v)                   \
                                 : _mm512_loadu_si512(brow + 16 * v));                             \
      _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++)                                         \
      {                                                                                            \
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)ar[r][p * a_cs]);                           \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =                           \
            _mm512_dpbf16_ps(acc[r][v], av, bv[v]);                                                \
      }                                                                                            \
    }                                                                                              \
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                            \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++)                                           \
    {                                                                                              \
      if (r >= mr)                                                                                 \
        break;                                                                                     \
      float *crow = c + r * ldc;                                                                   \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                         \
      {                                                                                            \
        __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;                                     \
        __m512 x = _mm512_mul_ps(va, acc[r][v]);                                                   \
        if (beta != 0.0f)                                                                          \
          x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, crow + 16 * v), x);                    \
        _mm512_mask_storeu_ps(crow + 16 * v, mk, x);                                               \
      }                                                                                            \
    }                                                                                              \
  }
DEFINE_BLOCK(1, MR_NARROW)
DEFINE_BLOCK(2, MR_NARROW)
DEFINE_BLOCK(3, MR_WIDE)
DEFINE_BLOCK(4, MR_WIDE)

void
qkv_small_sgemm_bf16(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                     float alpha, gconstpointer a, gboolean a16, gint64 lda, gconstpointer b,
                     gboolean b16, gint64 ldb, float beta, float *c, gint64 ldc, gpointer scratch)
{
  gint64 kh = pairs(k);
  guint32 *pa = scratch, *pb = pa + m * kh;
  guint32 *tmp = pb + n * kh;
  /* op(b) as kh rows of n words; op(a) as m rows of kh words (a_rs = kh,
   * a_cs = 1) or, transposed, kh rows of m words (a_rs = 1, a_cs = m) */
  if (transpose_b)
    pack_rows_transposed(pb, b, b16, ldb, n, k, tmp);
  else
    pack_across_rows(pb, n, b, b16, ldb, n, k);
  gint64 a_rs, a_cs;
  if (transpose_a) {
    pack_across_rows(pa, m, a, a16, lda, m, k);
    a_rs = 1, a_cs = m;
  } else {
    pack_rows(pa, kh, a, a16, lda, m, k);
    a_rs = kh, a_cs = 1;
  }
  for (gint64 j0 = 0; j0 < n; j0 += 64) {
    gint64 nc = MIN(64, n - j0);
    gint64 nv = (nc + 15) / 16;
    gint64 rest = nc - 16 * (nv - 1);
    __mmask16 tail = (__mmask16)(rest == 16 ? 0xffff : (1u << rest) - 1);
    gint64 rows = nv <= 2 ? MR_NARROW : MR_WIDE;
    for (gint64 i0 = 0; i0 < m; i0 += rows) {
      gint64 mr = MIN(rows, m - i0);
      const guint32 *ai = pa + i0 * a_rs;
      float *ci = c + i0 * ldc + j0;
      const guint32 *bj = pb + j0;
      switch (nv) {
      case 1:
        block_nv1(mr, kh, alpha, ai, a_rs, a_cs, bj, n, beta, ci, ldc, tail);
        break;
      case 2:
        block_nv2(mr, kh, alpha, ai, a_rs, a_cs, bj, n, beta, ci, ldc, tail);
        break;
      case 3:
        block_nv3(mr, kh, alpha, ai, a_rs, a_cs, bj, n, beta, ci, ldc, tail);
        break;
      default:
        block_nv4(mr, kh, alpha, ai, a_rs, a_cs, bj, n, beta, ci, ldc, tail);
        break;
      }
    }
  }
}
#pragma GCC pop_options

#else /* !QKV_ARCH_X86 */

gsize
qkv_small_sgemm_bf16_scratch(gint64 m, gint64 n, gint64 k)
{
  return 0;
}

void
qkv_small_sgemm_bf16(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                     float alpha, gconstpointer a, gboolean a16, gint64 lda, gconstpointer b,
                     gboolean b16, gint64 ldb, float beta, float *c, gint64 ldc, gpointer scratch)
{
  g_assert_not_reached(); /* gemm-bf16.c calls it on x86 only */
}

#endif /* QKV_ARCH_X86 */
