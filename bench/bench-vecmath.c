/* bench-vecmath.c: qkv_vec_exp / qkv_vec_tanh (SLEEF, the widest ISA the
 * CPU has) against plain loops of libm's expf / tanhf.
 *
 * Inputs: 1 M floats, uniform in [-87, 88] for exp (every result a normal
 * float) and in [-10, 10] for tanh. Throughput is elements per nanosecond,
 * the median of the passes (one thread). Accuracy is the largest error in
 * ulp against exp / tanh in double, the ulp being that of the float nearest
 * the exact value.
 *
 * Usage: bench-vecmath [passes]
 */
#include <qkv/qkv.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../examples/common/program-version.h"

#define N (1 << 20)

typedef void (*VecFunc)(float *dst, const float *src, gsize n);

static void
libm_exp(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = expf(src[i]);
}

static void
libm_tanh(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = tanhf(src[i]);
}

static int
compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* |got − exact| in units of the last place of the float nearest exact. */
static double
ulp_error(float got, double exact)
{
  if (exact == 0.0)
    return got == 0.0f ? 0.0 : INFINITY;
  int e;
  frexp(exact, &e); /* |exact| = m · 2^e, m in [0.5, 1) */
  double ulp = ldexp(1.0, MAX(e - 24, -149));
  return fabs((double)got - exact) / ulp;
}

typedef struct {
  const char *name;
  VecFunc f;
  double (*exact)(double);
  const float *x;
} Case;

int
main(int argc, char **argv)
{
  if (program_version_requested(argc, argv)) {
    program_print_version("bench-vecmath");
    return 0;
  }
  int passes = argc > 1 ? atoi(argv[1]) : 31;
  passes = MAX(passes, 1);
  float *xe = g_new(float, N), *xt = g_new(float, N), *y = g_new(float, N);
  double *times = g_new(double, passes);
  GRand *rand = g_rand_new_with_seed(42);
  for (gsize i = 0; i < N; i++) {
    xe[i] = (float)g_rand_double_range(rand, -87.0, 88.0);
    xt[i] = (float)g_rand_double_range(rand, -10.0, 10.0);
  }
  g_rand_free(rand);

  const Case cases[] = {
      {"qkv_vec_exp", qkv_vec_exp, exp, xe},
      {"expf loop", libm_exp, exp, xe},
      {"qkv_vec_tanh", qkv_vec_tanh, tanh, xt},
      {"tanhf loop", libm_tanh, tanh, xt},
  };
  printf("qkv %s, vector ISA %s; %d floats, median of %d passes, one thread\n", qkv_version(),
         qkv_vec_isa(), N, passes);
  printf("%-14s %-12s %12s %12s %14s\n", "function", "inputs", "median ms", "elem/ns",
         "max err (ulp)");
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    const Case *k = &cases[c];
    k->f(y, k->x, N); /* warm up */
    for (int p = 0; p < passes; p++) {
      gint64 t0 = g_get_monotonic_time();
      k->f(y, k->x, N);
      times[p] = (double)(g_get_monotonic_time() - t0) * 1e3; /* ns */
    }
    qsort(times, (size_t)passes, sizeof(double), compare_doubles);
    double median = times[passes / 2];
    double worst = 0.0;
    for (gsize i = 0; i < N; i++)
      worst = fmax(worst, ulp_error(y[i], k->exact((double)k->x[i])));
    printf("%-14s %-12s %12.3f %12.3f %14.3f\n", k->name,
           k->exact == exp ? "[-87, 88]" : "[-10, 10]", median / 1e6, (double)N / median, worst);
  }
  g_free(times);
  g_free(y);
  g_free(xt);
  g_free(xe);
  return 0;
}
