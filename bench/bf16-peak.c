/* bf16-peak.c: the bf16 ceiling beside sgemm-peak.c's float32 one, so a bf16
 * step time can be read against what the core's bf16 instructions can do:
 * the VDPBF16PS peak (AVX512_BF16; a machine with AMX has a higher one,
 * reached through oneDNN's AMX kernels, not measured by this loop) and
 * oneDNN's bf16 matmul at one large shape. */
#include "bf16-peak.h"

#include "peak-timing.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#ifdef QKV_BENCH_ONEDNN
#include <dnnl.h>
#endif

#define DOT_ITERS 40000000L

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* 12 independent accumulators, as sgemm-peak.c's FMA loop (more than the
 * instruction's latency × pipes); returns FLOPs done: per instruction 16
 * lanes × 2 products × (multiply + add). a = 1, b = 2^-24: each
 * accumulator grows by 2^-23 per iteration, staying normal and finite. */
__attribute__((target("avx512bf16,avx512f"))) static double
dot_loop_zmm(void)
{
  __m512 ones = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(0x1p-24f);
  __m512bh a = _mm512_cvtne2ps_pbh(ones, ones), b = _mm512_cvtne2ps_pbh(tiny, tiny);
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
         c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  for (long i = 0; i < DOT_ITERS; i++) {
    c0 = _mm512_dpbf16_ps(c0, a, b), c1 = _mm512_dpbf16_ps(c1, a, b);
    c2 = _mm512_dpbf16_ps(c2, a, b), c3 = _mm512_dpbf16_ps(c3, a, b);
    c4 = _mm512_dpbf16_ps(c4, a, b), c5 = _mm512_dpbf16_ps(c5, a, b);
    c6 = _mm512_dpbf16_ps(c6, a, b), c7 = _mm512_dpbf16_ps(c7, a, b);
    c8 = _mm512_dpbf16_ps(c8, a, b), c9 = _mm512_dpbf16_ps(c9, a, b);
    c10 = _mm512_dpbf16_ps(c10, a, b), c11 = _mm512_dpbf16_ps(c11, a, b);
    /* keeps the compiler from folding or merging the chains */
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
  }
  volatile float sink =
      _mm512_reduce_add_ps(c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11);
  (void)sink;
  return DOT_ITERS * 12.0 * 16 * 2 * 2;
}

static gboolean
cpu_has_bf16(void)
{
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}
#else
static double
dot_loop_zmm(void)
{
  return 0;
}

static gboolean
cpu_has_bf16(void)
{
  return FALSE;
}
#endif

double
bf16_dot_peak(gint n, const gchar **why)
{
  if (!cpu_has_bf16()) {
    *why = "no AVX512_BF16";
    return 0;
  }
  *why = "vdpbf16ps zmm";
  return peak_threads_gflops(dot_loop_zmm, n, "dpbf16");
}

#ifdef QKV_BENCH_ONEDNN
typedef struct {
  dnnl_primitive_t prim;
  dnnl_stream_t stream;
  dnnl_exec_arg_t *args;
} MatmulCall;

static void
matmul_call(gpointer data)
{
  const MatmulCall *mc = data;
  dnnl_primitive_execute(mc->prim, mc->stream, 3, mc->args);
  dnnl_stream_wait(mc->stream);
}

/* bf16 bits of x (truncated: the values are random, their rounding does not
 * change the speed) */
static void
fill_bf16(guint16 *p, gint64 n, guint32 seed)
{
  for (gint64 i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    float x = (float)(seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
    guint32 bits;
    memcpy(&bits, &x, 4);
    p[i] = (guint16)(bits >> 16);
  }
}

double
bf16_onednn_matmul(gint n, gint64 m, gint64 nn, gint64 k, double seconds, const gchar **isa)
{
  omp_set_num_threads(n);
  dnnl_engine_t engine = NULL;
  dnnl_stream_t stream = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
  dnnl_memory_desc_t a_md, b_md, c_md;
  dnnl_dims_t a_dims = {m, k}, b_dims = {k, nn}, c_dims = {m, nn};
  dnnl_matmul_desc_t desc;
  guint16 *a = g_new(guint16, m * k), *b = g_new(guint16, k * nn);
  float *c = g_new0(float, m *nn);
  double rate = 0;
  fill_bf16(a, m * k, 1);
  fill_bf16(b, k * nn, 2);
  *isa = "oneDNN refused the bf16 matmul";
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
      dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&a_md, 2, a_dims, dnnl_bf16, dnnl_ab) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&b_md, 2, b_dims, dnnl_bf16, dnnl_ab) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&c_md, 2, c_dims, dnnl_f32, dnnl_ab) == dnnl_success &&
      dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
      dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) == dnnl_success &&
      dnnl_primitive_create(&prim, pd) == dnnl_success &&
      dnnl_memory_create(&ma, &a_md, engine, a) == dnnl_success &&
      dnnl_memory_create(&mb, &b_md, engine, b) == dnnl_success &&
      dnnl_memory_create(&mc, &c_md, engine, c) == dnnl_success) {
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    *isa = impl != NULL ? g_intern_string(impl) : "?";
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    MatmulCall call = {prim, stream, args};
    rate = 2.0 * m * nn * k / peak_median_seconds(matmul_call, &call, seconds) / 1e9;
  }
  dnnl_memory_destroy(ma);
  dnnl_memory_destroy(mb);
  dnnl_memory_destroy(mc);
  dnnl_primitive_destroy(prim);
  dnnl_primitive_desc_destroy(pd);
  dnnl_stream_destroy(stream);
  dnnl_engine_destroy(engine);
  g_free(a);
  g_free(b);
  g_free(c);
  return rate;
}
#else
double
bf16_onednn_matmul(gint n, gint64 m, gint64 nn, gint64 k, double seconds, const gchar **isa)
{
  (void)n, (void)m, (void)nn, (void)k, (void)seconds;
  *isa = "qkv-sgemm-peak built without oneDNN";
  return 0;
}
#endif
