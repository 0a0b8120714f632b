/* peak-timing.c: the timing loops qkv-sgemm-peak's figures share. */
#include "peak-timing.h"

#include <time.h>

double
peak_now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
peak_compare_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  double (*loop)(void);
  double flops, seconds;
} LoopRun;

static gpointer
loop_thread(gpointer data)
{
  LoopRun *run = data;
  double t0 = peak_now_s();
  run->flops = run->loop();
  run->seconds = peak_now_s() - t0;
  return NULL;
}

double
peak_threads_gflops(double (*loop)(void), gint n, const gchar *thread_name)
{
  double best = 0;
  n = CLAMP(n, 1, 16);
  for (int t = 0; t < 3; t++) {
    LoopRun runs[16];
    GThread *th[16];
    for (gint i = 0; i < n; i++) {
      runs[i] = (LoopRun){loop, 0, 0};
      th[i] = g_thread_new(thread_name, loop_thread, &runs[i]);
    }
    double flops = 0, secs = 0;
    for (gint i = 0; i < n; i++) {
      g_thread_join(th[i]);
      flops += runs[i].flops;
      secs = MAX(secs, runs[i].seconds);
    }
    best = MAX(best, flops / secs / 1e9);
  }
  return best;
}

double
peak_median_seconds(void (*call)(gpointer data), gpointer data, double seconds)
{
  for (int w = 0; w < 2; w++)
    call(data);
  GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
  double start = peak_now_s();
  for (;;) {
    double t0 = peak_now_s();
    call(data);
    double dt = peak_now_s() - t0;
    g_array_append_val(times, dt);
    if (times->len >= 5 && peak_now_s() - start >= seconds)
      break;
  }
  g_array_sort(times, peak_compare_double);
  double median = g_array_index(times, double, times->len / 2);
  g_array_unref(times);
  return median;
}
