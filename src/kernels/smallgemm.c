/* smallgemm.c: register-blocked AVX-512 and AVX2 kernels for the small products that
 * qkv_sgemm() gets by the thousand from attention (one per batch and head:
 * 10×10×8 in the book's model, 64×64×64 in a d_model 512 Transformer).
 * OpenBLAS spends most of such a call on dispatch, argument checks and
 * packing; this kernel reads both operands in place.
 *
 * Every product is written as C (m×n) = α·Σ_k a(i,k)·B[k, :] + β·C, with the
 * rows of B contiguous vectors and a(i,k) a scalar broadcast from anywhere
 * (a[i·a_rs + k·a_cs]), which covers NN and TN. NT (C = A·Bᵀ) first copies
 * Bᵀ into a buffer on the stack. TT is left to OpenBLAS, and so is every
 * product this kernel is not faster at (see the selection below). Off x86
 * there is no such kernel, and every product goes to the GEMM library. */
#include "kernels/kernels-private.h"

#include <string.h>

#ifdef QKV_ARCH_X86
/* outside any target region, so that each intrinsic keeps its own ISA (an
 * include inside the AVX-512 region would tie the AVX2 ones to AVX-512) */
#include <immintrin.h>

/* Which products this kernel takes, from bench/bench-gemm at the shapes
 * attention makes (OpenBLAS 0.3.21, Zen 4): OpenBLAS is as fast or faster
 * from 16×16×16 up in every layout, except x·wᵀ with a short, narrow w
 * (640×32×32: 1.5× slower than this kernel). So: products of at most
 * TINY_MNK multiply-adds with a transposed operand (10×10×8 attention heads:
 * NT and TN 1.6–1.9× faster here, NN not), and
 * NT products with n, k ≤ NT_MAX_NK and m ≥ NT_MIN_M. Both keep Bᵀ within
 * BT_MAX floats. With AVX2 only (Zen 3, OpenBLAS's Zen kernels) the AVX2
 * kernel takes the tiny NN and TN products and nothing else: in one
 * bench-gemm run 10×8×10 NN took 100 ns here against OpenBLAS's 200 ns and
 * TN 108 against 184, but NT (which pays for the copy of Bᵀ and fills 16
 * lanes for n = 10) was 0.87–0.93 times OpenBLAS's speed at 10×10×8 and
 * 0.88–1.0 at 640×32×32 over three runs. */
#define TINY_MNK 1024
#define NT_MAX_NK 32
#define NT_MIN_M 256
#define BT_MAX 1024

#pragma GCC push_options
#pragma GCC target("avx512f")

/* Rows per block (broadcast values) and column vectors per block. */
#define MR 4

/* One block of up to MR rows × NV vectors of 16 columns. Rows past m reuse
 * the last row (computed, never stored), so the inner loop has no branches. */
#define DEFINE_BLOCK(NV)                                                                           \
  static inline void block_nv##NV(gint64 mr, gint64 k, float alpha, const float *a, gint64 a_rs,   \
                                  gint64 a_cs, const float *b, gint64 ldb, float beta, float *c,   \
                                  gint64 ldc, __mmask16 tail)                                      \
  {                                                                                                \
    __m512 acc[MR][NV];                                                                            \
    const float *ar[MR];                                                                           \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                           \
    {                                                                                              \
      ar[r] = a + (r < mr ? r : mr - 1) * a_rs;                                                    \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();        \
    }                                                                                              \
    for (gint64 kk = 0; kk < k; kk++) {                                                            \
      const float *brow = b + kk * ldb;                                                            \
      __m512 bv[NV];                                                                               \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                                 \
          v == NV - 1 ? _mm512_maskz_loadu_ps(tail, brow + 16 * v)                                 \
                      : _mm512_loadu_ps(brow + 16 * v);                                            \
      _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                         \
      {                                                                                            \
        __m512 av = _mm512_set1_ps(ar[r][kk * a_cs]);                                              \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =                           \
            _mm512_fmadd_ps(av, bv[v], acc[r][v]);                                                 \
      }                                                                                            \
    }                                                                                              \
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                            \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                           \
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
DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)

static void
small_sgemm_avx512(gint64 m, gint64 n, gint64 k, float alpha, const float *a, gint64 a_rs,
                   gint64 a_cs, const float *b, gint64 ldb, float beta, float *c, gint64 ldc)
{
  for (gint64 j0 = 0; j0 < n; j0 += 64) {
    gint64 nc = MIN(64, n - j0);
    gint64 nv = (nc + 15) / 16;
    gint64 rest = nc - 16 * (nv - 1);
    __mmask16 tail = (__mmask16)(rest == 16 ? 0xffff : (1u << rest) - 1);
    for (gint64 i0 = 0; i0 < m; i0 += MR) {
      gint64 mr = MIN(MR, m - i0);
      const float *ai = a + i0 * a_rs;
      float *ci = c + i0 * ldc + j0;
      const float *bj = b + j0;
      switch (nv) {
      case 1:
        block_nv1(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
        break;
      case 2:
        block_nv2(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
        break;
      case 3:
        block_nv3(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
        break;
      default:
        block_nv4(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
        break;
      }
    }
  }
}
#pragma GCC pop_options

/* The same blocking at AVX2's width: 8 columns a vector, at most 2 vectors
 * (16 columns) a block, so that MR × 2 accumulators, 2 rows of B and the
 * broadcast fit in the 16 ymm registers. The tail of the last vector is
 * loaded and stored through an integer mask. */
#define QKV_AVX2 __attribute__((target("avx,avx2,fma")))

#define DEFINE_BLOCK8(NV)                                                                          \
  static inline QKV_AVX2 void block8_nv##NV(gint64 mr, gint64 k, float alpha, const float *a,      \
                                            gint64 a_rs, gint64 a_cs, const float *b, gint64 ldb,  \
                                            float beta, float *c, gint64 ldc, __m256i tail)        \
  {                                                                                                \
    __m256 acc[MR][NV];                                                                            \
    const float *ar[MR];                                                                           \
    const __m256i all = _mm256_set1_epi32(-1);                                                     \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                           \
    {                                                                                              \
      ar[r] = a + (r < mr ? r : mr - 1) * a_rs;                                                    \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();        \
    }                                                                                              \
    for (gint64 kk = 0; kk < k; kk++) {                                                            \
      const float *brow = b + kk * ldb;                                                            \
      __m256 bv[NV];                                                                               \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                                 \
          v == NV - 1 ? _mm256_maskload_ps(brow + 8 * v, tail) : _mm256_loadu_ps(brow + 8 * v);    \
      _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                         \
      {                                                                                            \
        __m256 av = _mm256_set1_ps(ar[r][kk * a_cs]);                                              \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =                           \
            _mm256_fmadd_ps(av, bv[v], acc[r][v]);                                                 \
      }                                                                                            \
    }                                                                                              \
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);                            \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++)                                           \
    {                                                                                              \
      if (r >= mr)                                                                                 \
        break;                                                                                     \
      float *crow = c + r * ldc;                                                                   \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                         \
      {                                                                                            \
        __m256i mk = v == NV - 1 ? tail : all;                                                     \
        __m256 x = _mm256_mul_ps(va, acc[r][v]);                                                   \
        if (beta != 0.0f)                                                                          \
          x = _mm256_fmadd_ps(vb, _mm256_maskload_ps(crow + 8 * v, mk), x);                        \
        _mm256_maskstore_ps(crow + 8 * v, mk, x);                                                  \
      }                                                                                            \
    }                                                                                              \
  }
DEFINE_BLOCK8(1)
DEFINE_BLOCK8(2)

static QKV_AVX2 void
small_sgemm_avx2(gint64 m, gint64 n, gint64 k, float alpha, const float *a, gint64 a_rs,
                 gint64 a_cs, const float *b, gint64 ldb, float beta, float *c, gint64 ldc)
{
  for (gint64 j0 = 0; j0 < n; j0 += 16) {
    gint64 nc = MIN(16, n - j0);
    gint64 nv = (nc + 7) / 8;
    gint64 rest = nc - 8 * (nv - 1);
    __m256i tail =
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rest), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (gint64 i0 = 0; i0 < m; i0 += MR) {
      gint64 mr = MIN(MR, m - i0);
      const float *ai = a + i0 * a_rs;
      float *ci = c + i0 * ldc + j0;
      const float *bj = b + j0;
      if (nv == 1)
        block8_nv1(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
      else
        block8_nv2(mr, k, alpha, ai, a_rs, a_cs, bj, ldb, beta, ci, ldc, tail);
    }
  }
}

gboolean
qkv_small_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
                float *c, gint64 ldc)
{
  if (m <= 0 || n <= 0 || k <= 0 || (transpose_a && transpose_b))
    return FALSE;
  gboolean avx512 = qkv_use_avx512();
  gboolean tiny, tall_nt;
  if (avx512) {
    tiny = m * n * k <= TINY_MNK && (transpose_a || transpose_b);
    tall_nt = transpose_b && !transpose_a && n <= NT_MAX_NK && k <= NT_MAX_NK && m >= NT_MIN_M;
  } else {
    tiny = m * n * k <= TINY_MNK && !transpose_b && qkv_use_avx2();
    tall_nt = FALSE;
  }
  if (!(tiny || tall_nt))
    return FALSE;
  void (*kernel)(gint64, gint64, gint64, float, const float *, gint64, gint64, const float *,
                 gint64, float, float *, gint64) = avx512 ? small_sgemm_avx512 : small_sgemm_avx2;
  gint64 a_rs = transpose_a ? 1 : lda, a_cs = transpose_a ? lda : 1;
  if (!transpose_b) {
    kernel(m, n, k, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    return TRUE;
  }
  /* C = A·Bᵀ with B n×k: the kernel wants Bᵀ (k×n) row by row */
  float bt[BT_MAX];
  g_assert(n * k <= BT_MAX);
  for (gint64 j = 0; j < n; j++)
    for (gint64 kk = 0; kk < k; kk++)
      bt[kk * n + j] = b[j * ldb + kk];
  kernel(m, n, k, alpha, a, a_rs, a_cs, bt, n, beta, c, ldc);
  return TRUE;
}

#else /* !QKV_ARCH_X86 */

gboolean
qkv_small_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
                float *c, gint64 ldc)
{
  return FALSE;
}

#endif /* QKV_ARCH_X86 */
