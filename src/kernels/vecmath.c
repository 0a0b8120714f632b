/* vecmath.c: vector exp/tanh/erf through SLEEF, and the one run-time choice of
 * instruction set (AVX-512, AVX2 or scalar) that every kernel with vector
 * variants follows (qkv_use_avx512(), qkv_use_avx2()). Off x86 the choice is
 * always scalar. */
#include "kernels/kernels-private.h"

#include <math.h>
#include <string.h>

typedef void (*VecFunc)(float *dst, const float *src, gsize n);

#ifdef QKV_ARCH_X86
/* outside any target region, so that each intrinsic keeps its own ISA and
 * the AVX2 functions below can use them */
#include <immintrin.h>

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

static void
erf_avx512(float *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, Sleef_erff16_u10avx512f(_mm512_loadu_ps(src + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, Sleef_erff16_u10avx512f(x));
  }
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
QKV_DEFINE_AVX2(erf_avx2, Sleef_erff8_u10avx2)
#else
#include <sleef.h>
#endif /* QKV_ARCH_X86 */

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

static void
erf_scalar(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = Sleef_erff_u10(src[i]);
}

static VecFunc vec_exp, vec_tanh, vec_erf;
static const gchar *vec_isa;

#ifdef QKV_ARCH_X86
/* The widest ISA this CPU has, or the fallback QKV_VEC_ISA asks for
 * ("scalar", "avx2": to test the fallbacks). */
static void
pick_x86_isa(VecFunc *exp_fn, VecFunc *tanh_fn, VecFunc *erf_fn, const gchar **isa)
{
  const gchar *force = g_getenv("QKV_VEC_ISA");
  __builtin_cpu_init();
  gboolean avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vl");
  gboolean avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (force != NULL && g_str_equal(force, "scalar"))
    avx512 = avx2 = FALSE;
  else if (force != NULL && g_str_equal(force, "avx2"))
    avx512 = FALSE;
  if (avx512) {
    *exp_fn = exp_avx512, *tanh_fn = tanh_avx512, *erf_fn = erf_avx512, *isa = "avx512f";
  } else if (avx2) {
    *exp_fn = exp_avx2, *tanh_fn = tanh_avx2, *erf_fn = erf_avx2, *isa = "avx2";
  }
}
#endif

static void
pick_isa(void)
{
  static gsize done = 0;
  if (g_once_init_enter(&done)) {
    VecFunc exp_fn = exp_scalar, tanh_fn = tanh_scalar, erf_fn = erf_scalar;
    const gchar *isa = "scalar";
#ifdef QKV_ARCH_X86
    pick_x86_isa(&exp_fn, &tanh_fn, &erf_fn, &isa);
#endif
    vec_exp = exp_fn, vec_tanh = tanh_fn, vec_erf = erf_fn, vec_isa = isa;
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

void
qkv_vec_erf(float *dst, const float *src, gsize n)
{
  if (G_UNLIKELY(vec_erf == NULL))
    pick_isa();
  vec_erf(dst, src, n);
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
#ifdef QKV_ARCH_X86
  pick_isa();
  return vec_exp == exp_avx512;
#else
  return FALSE;
#endif
}

gboolean
qkv_use_avx2(void)
{
#ifdef QKV_ARCH_X86
  pick_isa();
  return vec_exp == exp_avx2;
#else
  return FALSE;
#endif
}
