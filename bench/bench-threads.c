/* bench-threads: where splitting a loop over qkv's pool starts to pay.
 *
 * For loops of n simple float operations (y[i] = a[i] * b[i] + y[i], the
 * cheapest kind of kernel loop, in cache) it times the loop on one thread and
 * split over two, alternating, and prints the medians, their ratio and the
 * cost of an empty fork and join. The smallest n where two threads win by
 * a clear margin sets PARALLEL_WORK_PER_THREAD in src/threads.c.
 *
 *   bench-threads [--reps N]
 */
#include <qkv/qkv.h>
#include <stdio.h>
#include <stdlib.h>

#include "../examples/common/program-version.h"

typedef struct {
  const float *a, *b;
  float *y;
} Fma;

static void
fma_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const Fma *f = data;
  for (gint64 i = begin; i < end; i++)
    f->y[i] = f->a[i] * f->b[i] + f->y[i];
}

static void
empty_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
}

static int
compare_doubles(const void *x, const void *y)
{
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double
median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof(double), compare_doubles);
  return v[n / 2];
}

/* Median µs of one call of the loop over n elements on nt threads, from reps
 * samples of inner calls each. */
static void
time_pair(gint64 n, int reps, int inner, QkvRangeFunc body, gpointer data, double *one,
          double *two)
{
  double *t1 = g_new(double, reps), *t2 = g_new(double, reps);
  for (int r = 0; r < reps; r++) {
    for (int which = 0; which < 2; which++) {
      gint64 start = g_get_monotonic_time();
      for (int i = 0; i < inner; i++)
        qkv_parallel_for(which == 0 ? 1 : 2, n, body, data);
      double us = (double)(g_get_monotonic_time() - start) / inner;
      (which == 0 ? t1 : t2)[r] = us;
    }
  }
  *one = median(t1, reps);
  *two = median(t2, reps);
  g_free(t1);
  g_free(t2);
}

int
main(int argc, char **argv)
{
  if (program_version_requested(argc, argv)) {
    program_print_version("bench-threads");
    return 0;
  }
  int reps = 31;
  if (argc == 3 && g_strcmp0(argv[1], "--reps") == 0)
    reps = atoi(argv[2]);
  if (reps < 1) {
    fprintf(stderr, "usage: bench-threads [--reps N]  (N ≥ 1)\n");
    return 2;
  }
  const gint64 max_n = G_GINT64_CONSTANT(1) << 20;
  float *a = g_new(float, max_n), *b = g_new(float, max_n), *y = g_new0(float, max_n);
  for (gint64 i = 0; i < max_n; i++) {
    a[i] = (float)(i % 7) * 0.25f;
    b[i] = (float)(i % 5) * 0.5f;
  }
  Fma f = {a, b, y};
  double one, two;
  time_pair(2, reps, 2000, empty_range, NULL, &one, &two);
  printf("empty loop: 1 thread %.2f µs, fork and join of 2 threads %.2f µs\n", one, two);
  /* the same after the worker has gone to sleep (idle longer than QKV_SPIN_US) */
  double *cold = g_new(double, reps);
  for (int r = 0; r < reps; r++) {
    g_usleep(2000);
    gint64 start = g_get_monotonic_time();
    qkv_parallel_for(2, 2, empty_range, NULL);
    cold[r] = (double)(g_get_monotonic_time() - start);
  }
  printf("fork and join of 2 threads, the worker asleep: %.1f µs\n", median(cold, reps));
  g_free(cold);
  printf("%10s %12s %12s %8s\n", "n", "1 thread µs", "2 threads µs", "2/1");
  for (gint64 n = 1024; n <= max_n; n *= 2) {
    int inner = (int)MAX(4, (G_GINT64_CONSTANT(1) << 22) / n);
    time_pair(n, reps, inner, fma_range, &f, &one, &two);
    printf("%10" G_GINT64_FORMAT " %12.2f %12.2f %8.3f\n", n, one, two, two / one);
  }
  g_free(a);
  g_free(b);
  g_free(y);
  return 0;
}
