/* peak-timing.h: the timing loops qkv-sgemm-peak's figures share
 * (sgemm-peak.c, bf16-peak.c). */
#pragma once

#include <glib.h>

/* Seconds on the monotonic clock. */
double peak_now_s(void);

/* qsort order of doubles, ascending. */
int peak_compare_double(const void *a, const void *b);

/* GFLOP/s of n threads (clamped to 1..16) each running loop at once, loop
 * returning the FLOPs it did: their sum over the slowest thread's time, best
 * of three tries. */
double peak_threads_gflops(double (*loop)(void), gint n, const gchar *thread_name);

/* Median seconds of one call(data): two calls untimed, then calls (each
 * timed on its own) until seconds have passed and at least 5 calls were
 * made. */
double peak_median_seconds(void (*call)(gpointer data), gpointer data, double seconds);
