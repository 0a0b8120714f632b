/* bench-gemm.c: qkv_sgemm() against a direct cblas_sgemm() call (OpenBLAS)
 * at the small shapes attention produces, one thread: per-(batch, head)
 * products of the book's model (10×10×8), of config M (32×32×32) and of
 * config L (64×64×64), in the three layouts the attention kernels use, and a
 * few projection shapes near the small kernel's size limit.
 *
 * For each it prints the median ns per call of both and their ratio, and the
 * largest difference between the two results relative to the largest |c|;
 * in a build with oneDNN also a direct dnnl_sgemm() call (the backend
 * qkv_sgemm() uses past its small kernel on AVX-512), to see where the small
 * kernel (src/smallgemm.c) still wins against it.
 *
 * Usage: bench-gemm [calls per shape (default 20000)]
 */
#include <qkv/qkv.h>

#include <cblas.h>
#include <math.h>
#include <omp.h>
#ifdef QKV_HAVE_ONEDNN
#include <dnnl.h>
#endif
#include <stdio.h>
#include <stdlib.h>

#include "../examples/common/program-version.h"

typedef struct {
  gboolean ta, tb;
  gint64 m, n, k;
} Shape;

static int
compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void
call_cblas(const Shape *s, const float *a, const float *b, float *c)
{
  gint64 lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
              (blasint)s->m, (blasint)s->n, (blasint)s->k, 0.5f, a, (blasint)lda, b, (blasint)ldb,
              0.0f, c, (blasint)s->n);
}

#ifdef QKV_HAVE_ONEDNN
static void
call_dnnl(const Shape *s, const float *a, const float *b, float *c)
{
  gint64 lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 0.5f, a, lda, b, ldb, 0.0f, c,
             s->n);
}
#endif

static void
call_qkv(const Shape *s, const float *a, const float *b, float *c)
{
  gint64 lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  qkv_sgemm(s->ta, s->tb, s->m, s->n, s->k, 0.5f, a, lda, b, ldb, 0.0f, c, s->n, 1);
}

/* Median ns per call over 9 passes of `calls` calls. */
static double
time_calls(void (*f)(const Shape *, const float *, const float *, float *), const Shape *s,
           const float *a, const float *b, float *c, gint calls)
{
  double pass[9];
  for (gint p = 0; p < 9; p++) {
    gint64 t0 = g_get_monotonic_time();
    for (gint i = 0; i < calls; i++)
      f(s, a, b, c);
    pass[p] = (double)(g_get_monotonic_time() - t0) * 1e3 / calls;
  }
  qsort(pass, 9, sizeof(double), compare_doubles);
  return pass[4];
}

int
main(int argc, char **argv)
{
  if (program_version_requested(argc, argv)) {
    program_print_version("bench-gemm");
    return 0;
  }
  gint calls = argc > 1 ? atoi(argv[1]) : 20000;
  if (calls <= 0) {
    fprintf(stderr, "usage: bench-gemm [calls per shape]\n");
    return 2;
  }
  qkv_set_num_threads(1);
  omp_set_num_threads(1); /* one thread for oneDNN too */
  static const Shape shapes[] = {
      {FALSE, TRUE, 10, 10, 8},    {FALSE, FALSE, 10, 8, 10},   {TRUE, FALSE, 10, 8, 10},
      {FALSE, TRUE, 32, 32, 32},   {FALSE, FALSE, 32, 32, 32},  {TRUE, FALSE, 32, 32, 32},
      {FALSE, TRUE, 64, 64, 64},   {FALSE, FALSE, 64, 64, 64},  {TRUE, FALSE, 64, 64, 64},
      {FALSE, TRUE, 640, 32, 32},  {FALSE, FALSE, 640, 32, 32}, {TRUE, FALSE, 32, 32, 640},
      {FALSE, TRUE, 96, 96, 96},   {FALSE, TRUE, 128, 32, 32},  {FALSE, TRUE, 640, 64, 32},
      {FALSE, TRUE, 640, 32, 64},  {FALSE, TRUE, 256, 64, 64},  {FALSE, TRUE, 640, 128, 128},
      {FALSE, TRUE, 2048, 64, 64}, {FALSE, TRUE, 16, 16, 16},   {FALSE, FALSE, 16, 16, 16},
      {TRUE, FALSE, 16, 16, 16},   {FALSE, FALSE, 20, 20, 20},  {TRUE, FALSE, 20, 20, 20},
  };
  printf("%-22s %12s %12s %7s %10s %12s %9s\n", "op(a)·op(b), m×n×k", "qkv ns", "cblas ns", "ratio",
         "max diff", "dnnl ns", "dnnl/qkv");
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    const Shape *s = &shapes[i];
    gsize na = (gsize)(s->m * s->k), nb = (gsize)(s->k * s->n), nc = (gsize)(s->m * s->n);
    float *a = g_new(float, na), *b = g_new(float, nb);
    float *c1 = g_new0(float, nc), *c2 = g_new0(float, nc);
    for (gsize j = 0; j < na; j++)
      a[j] = (float)((j * 7919) % 1000) / 500.0f - 1.0f;
    for (gsize j = 0; j < nb; j++)
      b[j] = (float)((j * 104729) % 1000) / 500.0f - 1.0f;
    call_qkv(s, a, b, c1);
    call_cblas(s, a, b, c2);
    double diff = 0, scale = 0;
    for (gsize j = 0; j < nc; j++) {
      diff = MAX(diff, fabs((double)c1[j] - c2[j]));
      scale = MAX(scale, fabs((double)c2[j]));
    }
    gint reps = (gint)MAX(10, calls * 512.0 / MAX(s->m * s->n * s->k / 512, 1) / 512);
    double tq = time_calls(call_qkv, s, a, b, c1, reps);
    double tc = time_calls(call_cblas, s, a, b, c2, reps);
    char label[64];
    g_snprintf(label, sizeof label,
               "%s%s %" G_GINT64_FORMAT "×%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT,
               s->ta ? "T" : "N", s->tb ? "T" : "N", s->m, s->n, s->k);
    double td = NAN;
#ifdef QKV_HAVE_ONEDNN
    td = time_calls(call_dnnl, s, a, b, c2, reps);
#endif
    printf("%-22s %12.1f %12.1f %7.2f %10.2e %12.1f %9.2f\n", label, tq, tc, tc / tq,
           diff / MAX(scale, 1e-30), td, td / tq);
    g_free(a);
    g_free(b);
    g_free(c1);
    g_free(c2);
  }
  return 0;
}
