/* random.c: counter-based random numbers (a key per seed, step and node;
 * a draw per counter) and the dropout masks made from them. The mask has
 * scalar, AVX2 and AVX-512 variants that give bit-identical masks; which one
 * runs follows the ISA vecmath.c picked (QKV_VEC_ISA forces a fallback;
 * off x86 it is always the scalar one). */
#include "kernels/kernels-private.h"

#ifdef QKV_ARCH_X86
/* outside any target region, so that each intrinsic keeps its own ISA and
 * the AVX2 functions below can use them */
#include <immintrin.h>
#endif

typedef void (*MaskFunc)(guint64 key, guint64 first, gsize n, float p, float scale, float *mask);

#define QKV_GOLDEN G_GUINT64_CONSTANT(0x9e3779b97f4a7c15)

/* splitmix64's finaliser: a bijective 64-bit mix. */
static inline guint64
mix64(guint64 z)
{
  z = (z ^ (z >> 30)) * G_GUINT64_CONSTANT(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * G_GUINT64_CONSTANT(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* The draw for counter c is mix64(key + (c + 1)·golden) >> 40, scaled to [0, 1). */
static void
dropout_mask_scalar(guint64 key, guint64 first, gsize n, float p, float scale, float *mask)
{
  for (gsize j = 0; j < n; j++) {
    guint64 z = mix64(key + (first + j + 1) * QKV_GOLDEN);
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    mask[j] = u < p ? 0.0f : scale;
  }
}

#ifdef QKV_ARCH_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
/* Eight draws at a time: the same integer mix as dropout_mask_scalar, so
 * masks are identical whichever path makes them. */
static void
dropout_mask_avx512(guint64 key, guint64 first, gsize n, float p, float scale, float *mask)
{
  const __m512i golden = _mm512_set1_epi64((long long)QKV_GOLDEN);
  const __m512i c1 = _mm512_set1_epi64((long long)G_GUINT64_CONSTANT(0xbf58476d1ce4e5b9));
  const __m512i c2 = _mm512_set1_epi64((long long)G_GUINT64_CONSTANT(0x94d049bb133111eb));
  const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i kv = _mm512_set1_epi64((long long)key);
  const __m256 vp = _mm256_set1_ps(p), vscale = _mm256_set1_ps(scale);
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
  gsize j = 0;
  for (; j + 8 <= n; j += 8) {
    __m512i c = _mm512_add_epi64(_mm512_set1_epi64((long long)(first + j + 1)), lanes);
    __m512i z = _mm512_add_epi64(kv, _mm512_mullo_epi64(c, golden));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), c1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), c2);
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    __m256 u = _mm256_mul_ps(_mm512_cvtepu64_ps(_mm512_srli_epi64(z, 40)), unit);
    __mmask8 drop = _mm256_cmp_ps_mask(u, vp, _CMP_LT_OQ);
    _mm256_storeu_ps(mask + j, _mm256_mask_blend_ps(drop, vscale, _mm256_setzero_ps()));
  }
  dropout_mask_scalar(key, first + j, n - j, p, scale, mask + j);
}
#pragma GCC pop_options

#define QKV_AVX2 __attribute__((target("avx,avx2,fma")))

/* The low 64 bits of a · b per lane, from 32 × 32 → 64-bit products (AVX2
 * has no 64-bit multiply): a_lo b_lo + ((a_hi b_lo + a_lo b_hi) << 32). */
QKV_AVX2 static inline __m256i
mullo64_avx2(__m256i a, __m256i b, __m256i b_hi)
{
  __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b), _mm256_mul_epu32(a, b_hi));
  return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

/* Four draws' 24-bit values (z >> 40 of the same integer mix as
 * dropout_mask_scalar) for counters c … c + 3, one per 64-bit lane. */
QKV_AVX2 static inline __m256i
draw4_avx2(__m256i kv, __m256i c)
{
  const __m256i golden = _mm256_set1_epi64x((long long)QKV_GOLDEN);
  const __m256i golden_hi = _mm256_srli_epi64(golden, 32);
  const __m256i c1 = _mm256_set1_epi64x((long long)G_GUINT64_CONSTANT(0xbf58476d1ce4e5b9));
  const __m256i c2 = _mm256_set1_epi64x((long long)G_GUINT64_CONSTANT(0x94d049bb133111eb));
  __m256i z = _mm256_add_epi64(kv, mullo64_avx2(c, golden, golden_hi));
  z = mullo64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), c1, _mm256_srli_epi64(c1, 32));
  z = mullo64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), c2, _mm256_srli_epi64(c2, 32));
  z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
  return _mm256_srli_epi64(z, 40);
}

/* Eight draws at a time, identical to dropout_mask_scalar's: the 24-bit
 * values convert to float exactly and compare as they do there. */
QKV_AVX2 static void
dropout_mask_avx2(guint64 key, guint64 first, gsize n, float p, float scale, float *mask)
{
  const __m256i kv = _mm256_set1_epi64x((long long)key);
  const __m256i lanes = _mm256_set_epi64x(3, 2, 1, 0);
  const __m256i low_dwords = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256 vp = _mm256_set1_ps(p), vscale = _mm256_set1_ps(scale);
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
  gsize j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256i c0 = _mm256_add_epi64(_mm256_set1_epi64x((long long)(first + j + 1)), lanes);
    __m256i c1 = _mm256_add_epi64(c0, _mm256_set1_epi64x(4));
    /* the low dword of each lane, draws 0–3 then 4–7 */
    __m128i lo =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(draw4_avx2(kv, c0), low_dwords));
    __m128i hi =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(draw4_avx2(kv, c1), low_dwords));
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_set_m128i(hi, lo)), unit);
    __m256 drop = _mm256_cmp_ps(u, vp, _CMP_LT_OQ);
    _mm256_storeu_ps(mask + j, _mm256_blendv_ps(vscale, _mm256_setzero_ps(), drop));
  }
  dropout_mask_scalar(key, first + j, n - j, p, scale, mask + j);
}
#endif /* QKV_ARCH_X86 */

static MaskFunc dropout_mask;

static void
pick_dropout_mask(void)
{
  static gsize done = 0;
  if (g_once_init_enter(&done)) {
    MaskFunc fn = dropout_mask_scalar;
#ifdef QKV_ARCH_X86
    if (qkv_use_avx512())
      fn = dropout_mask_avx512;
    else if (qkv_use_avx2())
      fn = dropout_mask_avx2;
#endif
    dropout_mask = fn;
    g_once_init_leave(&done, 1);
  }
}

guint64
qkv_random_key(guint64 seed, guint64 step, guint32 node_id)
{
  guint64 k = mix64(seed + G_GUINT64_CONSTANT(0x9e3779b97f4a7c15));
  k = mix64(k ^ (step * G_GUINT64_CONSTANT(0xd1b54a32d192ed03) + 1));
  return mix64(k ^ ((guint64)node_id * G_GUINT64_CONSTANT(0x8cb92ba72f3d8dd7) + 2));
}

float
qkv_random_uniform(guint64 key, guint64 counter)
{
  guint64 z = mix64(key + (counter + 1) * QKV_GOLDEN);
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

void
qkv_random_dropout_mask(guint64 key, guint64 first, gsize n, float p, float *mask)
{
  if (G_UNLIKELY(dropout_mask == NULL))
    pick_dropout_mask();
  dropout_mask(key, first, n, p, (float)(1.0 / (1.0 - (double)p)), mask);
}
