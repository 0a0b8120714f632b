/* test-gemm.c: qkv_sgemm() on each GEMM backend against a double-precision
 * loop; which backend runs by default and how QKV_GEMM forces the fallback;
 * and that a backend's OpenMP runtime starts no thread team of its own. */
#include "test-util.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* The backends this build and CPU can run. */
static const gchar *const *
backends(void)
{
#ifdef QKV_HAVE_ONEDNN
  static const gchar *const all[] = {"openblas", "onednn", NULL};
#else
  static const gchar *const all[] = {"openblas", NULL};
#endif
  return all;
}

static void
set_backend(const gchar *name)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_set_gemm_backend(name, &error));
  g_assert_no_error(error);
}

static float
uniform(guint32 *seed)
{
  *seed = *seed * 1664525u + 1013904223u;
  return (float)(*seed >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

typedef struct {
  gint64 m, n, k;
} Dims;

/* One product c = α·op(a)·op(b) + β·c with padded leading dimensions,
 * against a double loop. Each element may differ by what float rounding of a
 * k-term dot product allows: k roundings of products and sums, each at most
 * 2^-24 relative, on the sum of magnitudes, plus the scaling by α and β. The
 * padding between rows of c must stay untouched; with β = 0, c is not read
 * (it holds NaN). */
static void
check_product(gboolean ta, gboolean tb, const Dims *d, float alpha, float beta, gint threads)
{
  gint64 m = d->m, n = d->n, k = d->k;
  gint64 ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  gint64 lda = ac + 3, ldb = bc + 5, ldc = n + 7;
  guint32 seed = (guint32)(m * 131 + n * 17 + k + ta * 2 + tb);
  float *a = g_new(float, ar *lda), *b = g_new(float, br *ldb), *c = g_new(float, m *ldc);
  double *c0 = g_new(double, m *n);
  for (gint64 i = 0; i < ar * lda; i++)
    a[i] = uniform(&seed);
  for (gint64 i = 0; i < br * ldb; i++)
    b[i] = uniform(&seed);
  for (gint64 i = 0; i < m; i++)
    for (gint64 j = 0; j < ldc; j++) {
      float v = j < n ? uniform(&seed) : 1234.5f; /* padding: a sentinel */
      c[i * ldc + j] = beta == 0.0f && j < n ? NAN : v;
      if (j < n)
        c0[i * n + j] = beta == 0.0f ? 0.0 : v;
    }
  qkv_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
  for (gint64 i = 0; i < m; i++) {
    for (gint64 j = 0; j < n; j++) {
      double sum = 0, mag = 0;
      for (gint64 p = 0; p < k; p++) {
        double x = ta ? a[p * lda + i] : a[i * lda + p];
        double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        mag += fabs(x * y);
      }
      double want = alpha * sum + beta * c0[i * n + j];
      double bound = (2.0 * (double)k + 2.0) * ldexp(1.0, -24) *
                         (fabs(alpha) * mag + fabs(beta * c0[i * n + j])) +
                     1e-30;
      double got = c[i * ldc + j];
      if (!(fabs(got - want) <= bound))
        g_error("%s sgemm %s%s %" G_GINT64_FORMAT "×%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT
                " α=%g β=%g, %d threads: c[%" G_GINT64_FORMAT ",%" G_GINT64_FORMAT
                "] = %.9g, want %.9g ± %.3g",
                qkv_gemm_backend(), ta ? "T" : "N", tb ? "T" : "N", m, n, k, alpha, beta, threads,
                i, j, got, want, bound);
    }
    for (gint64 j = n; j < ldc; j++)
      g_assert_cmpfloat(c[i * ldc + j], ==, 1234.5f);
  }
  g_free(a);
  g_free(b);
  g_free(c);
  g_free(c0);
}

static void
test_accuracy(void)
{
  /* odd shapes: one row or one column (the matrix-vector path: the small
   * ones may go to the small kernel first, the larger ones cannot), the
   * small kernel's sizes (10×8×10, 10×10×8), larger ones; the last two are above
   * the size qkv_sgemm() splits over threads, one split by rows and one by
   * columns */
  static const Dims dims[] = {{1, 1, 1},     {1, 37, 19},   {23, 1, 11},   {1, 1, 13},
                              {1, 300, 200}, {200, 1, 300}, {10, 8, 10},   {10, 10, 8},
                              {3, 5, 7},     {17, 33, 9},   {67, 129, 65}, {261, 131, 129},
                              {67, 515, 131}};
  static const float alphas[] = {1.0f, -0.75f}, betas[] = {0.0f, 0.5f};
  for (const gchar *const *be = backends(); *be != NULL; be++) {
    set_backend(*be);
    g_assert_cmpstr(qkv_gemm_backend(), ==, *be);
    for (guint s = 0; s < G_N_ELEMENTS(dims); s++)
      for (int t = 0; t < 4; t++)
        for (guint x = 0; x < G_N_ELEMENTS(alphas); x++)
          for (guint y = 0; y < G_N_ELEMENTS(betas); y++)
            for (gint threads = 1; threads <= 2; threads++) {
              /* one thread is enough below the split size */
              if (threads == 2 && dims[s].m * dims[s].n * dims[s].k < (1 << 22))
                continue;
              check_product(t & 1, t >> 1, &dims[s], alphas[x], betas[y], threads);
            }
  }
  set_backend("auto");
}

/* The default: oneDNN where qkv was built with it and picked AVX-512 (it
 * follows QKV_VEC_ISA, so the suite under QKV_VEC_ISA=avx2 or scalar also
 * tests the OpenBLAS fallback); OpenBLAS elsewhere. */
static void
test_default_backend(void)
{
  set_backend("auto");
#ifdef QKV_HAVE_ONEDNN
  gboolean want_onednn = g_str_equal(qkv_vec_isa(), "avx512f");
#else
  gboolean want_onednn = FALSE;
#endif
  g_assert_cmpstr(qkv_gemm_backend(), ==, want_onednn ? "onednn" : "openblas");
  if (want_onednn)
    g_assert_cmpstr(qkv_gemm_kernel(), ==, "jit avx512_core");

  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_set_gemm_backend("mkl", &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_cmpstr(qkv_gemm_backend(), ==, want_onednn ? "onednn" : "openblas");
}

/* QKV_GEMM=openblas, read at the first product, forces the fallback. */
static void
test_env_fallback(void)
{
  if (g_test_subprocess()) {
    g_setenv("QKV_GEMM", "openblas", TRUE);
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4];
    qkv_sgemm(FALSE, FALSE, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2, 1);
    g_assert_cmpfloat(c[0], ==, 19.0f);
    g_assert_cmpstr(qkv_gemm_backend(), ==, "openblas");
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed();
}

static guint
n_tasks(void)
{
  g_autoptr(GDir) dir = g_dir_open("/proc/self/task", 0, NULL);
  g_assert_nonnull(dir);
  guint n = 0;
  while (g_dir_read_name(dir) != NULL)
    n++;
  return n;
}

/* No backend starts threads of its own: the only threads are qkv's pool
 * workers, even after the caller raised its OpenMP thread count (2 here);
 * qkv_sgemm() lowers it to 1 again, as openblas_set_num_threads(1) does. */
static void
test_no_thread_team(void)
{
  const gint64 m = 256, n = 256, k = 128; /* above the split size */
  float *a = g_new0(float, m *k), *b = g_new0(float, k *n), *c = g_new0(float, m *n);
  /* the pool's workers exist after one split product */
  set_backend("openblas");
  qkv_sgemm(FALSE, FALSE, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n, 2);
  guint before = n_tasks();
  for (const gchar *const *be = backends(); *be != NULL; be++) {
    set_backend(*be);
    omp_set_num_threads(2);
    for (int rep = 0; rep < 3; rep++) {
      qkv_sgemm(FALSE, TRUE, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n, 1);
      qkv_sgemm(TRUE, FALSE, m, n, k, 1.0f, a, m, b, n, 0.0f, c, n, 2);
    }
    g_assert_cmpuint(n_tasks(), ==, before);
    g_assert_cmpint(omp_get_max_threads(), ==, 1);
  }
  set_backend("auto");
  g_free(a);
  g_free(b);
  g_free(c);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/gemm/accuracy", test_accuracy);
  g_test_add_func("/gemm/default-backend", test_default_backend);
  g_test_add_func("/gemm/env-fallback", test_env_fallback);
  g_test_add_func("/gemm/no-thread-team", test_no_thread_team);
  return g_test_run();
}
