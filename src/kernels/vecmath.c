/* vecmath.c: vector exp/tanh through SLEEF, the ISA picked at run time;
 * counter-based random numbers; a simple parallel-for for kernels. */
#include "kernels/kernels-private.h"

#include <math.h>
#include <string.h>
/* outside any target region, so that each intrinsic keeps its own ISA and
 * the AVX2 functions below can use them */
#include <immintrin.h>

typedef void (*VecFunc)(float *dst, const float *src, gsize n);
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

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
/* sleef.h declares its vector functions for the ISAs enabled where it is read */
#include <sleef.h>

/* The tail goes through the same vector function with a masked load, so every
 * element gets identical rounding whatever its position. */
static void
exp_avx512(float *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, Sleef_expf16_u10avx512f(_mm512_loadu_ps(src + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, Sleef_expf16_u10avx512f(x));
  }
}

static void
tanh_avx512(float *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, Sleef_tanhf16_u10avx512f(_mm512_loadu_ps(src + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, Sleef_tanhf16_u10avx512f(x));
  }
}
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

/* AVX2 path. */
#define QKV_AVX2 __attribute__((target("avx,avx2,fma")))
#define QKV_DEFINE_AVX2(NAME, SLEEF_FN)                                                            \
  QKV_AVX2 static void NAME(float *dst, const float *src, gsize n)                                 \
  {                                                                                                \
    gsize i = 0;                                                                                   \
    __m256 v;                                                                                      \
    for (; i + 8 <= n; i += 8) {                                                                   \
      memcpy(&v, src + i, sizeof v);                                                               \
      v = SLEEF_FN(v);                                                                             \
      memcpy(dst + i, &v, sizeof v);                                                               \
    }                                                                                              \
    if (i < n) {                                                                                   \
      float buf[8] = {0};                                                                          \
      memcpy(buf, src + i, (n - i) * sizeof(float));                                               \
      memcpy(&v, buf, sizeof v);                                                                   \
      v = SLEEF_FN(v);                                                                             \
      memcpy(dst + i, &v, (n - i) * sizeof(float));                                                \
    }                                                                                              \
  }
QKV_DEFINE_AVX2(exp_avx2, Sleef_expf8_u10avx2)
QKV_DEFINE_AVX2(tanh_avx2, Sleef_tanhf8_u10avx2)

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

static void
exp_scalar(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = Sleef_expf_u10(src[i]);
}

static void
tanh_scalar(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = Sleef_tanhf_u10(src[i]);
}

static VecFunc vec_exp, vec_tanh;
static MaskFunc dropout_mask;
static const gchar *vec_isa;

static void
pick_isa(void)
{
  static gsize done = 0;
  if (g_once_init_enter(&done)) {
    const gchar *force = g_getenv("QKV_VEC_ISA"); /* "scalar", "avx2": to test the fallbacks */
    __builtin_cpu_init();
    gboolean avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
    gboolean avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (force != NULL && g_str_equal(force, "scalar"))
      avx512 = avx2 = FALSE;
    else if (force != NULL && g_str_equal(force, "avx2"))
      avx512 = FALSE;
    if (avx512) {
      vec_exp = exp_avx512, vec_tanh = tanh_avx512, vec_isa = "avx512f";
      dropout_mask = dropout_mask_avx512;
    } else if (avx2) {
      dropout_mask = dropout_mask_avx2;
      vec_exp = exp_avx2, vec_tanh = tanh_avx2, vec_isa = "avx2";
    } else {
      vec_exp = exp_scalar, vec_tanh = tanh_scalar, vec_isa = "scalar";
      dropout_mask = dropout_mask_scalar;
    }
    g_once_init_leave(&done, 1);
  }
}

void
qkv_vec_exp(float *dst, const float *src, gsize n)
{
  if (G_UNLIKELY(vec_exp == NULL))
    pick_isa();
  vec_exp(dst, src, n);
}

void
qkv_vec_tanh(float *dst, const float *src, gsize n)
{
  if (G_UNLIKELY(vec_tanh == NULL))
    pick_isa();
  vec_tanh(dst, src, n);
}

const gchar *
qkv_vec_isa(void)
{
  pick_isa();
  return vec_isa;
}

gboolean
qkv_use_avx512(void)
{
  pick_isa();
  return vec_exp == exp_avx512;
}

gboolean
qkv_use_avx2(void)
{
  pick_isa();
  return vec_exp == exp_avx2;
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
    pick_isa();
  dropout_mask(key, first, n, p, (float)(1.0 / (1.0 - (double)p)), mask);
}

void
qkv_kernel_parallel_for(const QkvKernelCtx *ctx, gint64 n, QkvRangeFunc body, gpointer user_data)
{
  qkv_parallel_for(ctx->n_threads, n, body, user_data);
}

/* -1: not read from the environment yet. */
static gint sparse_backward = -1;

void
qkv_set_sparse_backward(QkvSparseBackward mode)
{
  g_return_if_fail(mode >= QKV_SPARSE_BACKWARD_OFF && mode <= QKV_SPARSE_BACKWARD_ALWAYS);
  g_atomic_int_set(&sparse_backward, (gint)mode);
}

QkvSparseBackward
qkv_get_sparse_backward(void)
{
  gint v = g_atomic_int_get(&sparse_backward);
  if (G_UNLIKELY(v < 0)) {
    const gchar *env = g_getenv("QKV_SPARSE_BACKWARD");
    v = env != NULL && g_strcmp0(env, "0") == 0 ? QKV_SPARSE_BACKWARD_OFF
                                                : QKV_SPARSE_BACKWARD_AUTO;
    g_atomic_int_compare_and_exchange(&sparse_backward, -1, v);
    v = g_atomic_int_get(&sparse_backward);
  }
  return (QkvSparseBackward)v;
}
