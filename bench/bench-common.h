/* bench-common.h: what the fused-versus-composite benchmarks share — timing
 * a compiled plan, and measuring in a child process so that ru_maxrss is
 * that measurement's own peak. */
#pragma once

#include <qkv/qkv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  double median_ms, min_ms;
  guint64 arena_bytes;
  long maxrss_kb;
  guint n_steps;
  char error[256];
} BenchResult;

static int
bench_compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* A training plan for out: loss = Σ out · w with fixed random w, then the
 * gradients of every graph input in inputs as outputs; tensors[i] is bound to
 * input "in<i>". NULL with error on failure. */
static inline QkvPlan *
bench_training_plan(QkvGraph *graph, QkvValue *out, GPtrArray *inputs, GPtrArray *tensors,
                    GError **error)
{
  g_autoptr(QkvTensor) w = qkv_tensor_new(QKV_F32, qkv_value_shape(out));
  GRand *rand = g_rand_new_with_seed(9);
  float *d = qkv_tensor_f32(w);
  for (gint64 i = 0; i < qkv_tensor_numel(w); i++)
    d[i] = (float)g_rand_double_range(rand, -1, 1);
  g_rand_free(rand);
  QkvValue *wv = qkv_graph_constant(graph, w, error);
  QkvValue *prod = wv ? qkv_mul(out, wv, error) : NULL;
  QkvValue *loss = prod ? qkv_sum(prod, NULL, 0, FALSE, error) : NULL;
  if (loss == NULL || !qkv_graph_backward(graph, loss, error))
    return NULL;
  g_autoptr(GPtrArray) outs = g_ptr_array_new();
  g_ptr_array_add(outs, loss);
  for (guint i = 0; i < inputs->len; i++) {
    QkvValue *gv = qkv_graph_gradient(graph, g_ptr_array_index(inputs, i));
    if (gv != NULL)
      g_ptr_array_add(outs, gv);
  }
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  opts.seed = 1;
  QkvPlan *plan = qkv_graph_compile(graph, (QkvValue *const *)outs->pdata, outs->len, &opts, error);
  for (guint i = 0; plan != NULL && i < tensors->len; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    if (!qkv_plan_bind(plan, name, g_ptr_array_index(tensors, i), error))
      g_clear_pointer(&plan, qkv_plan_free);
  }
  return plan;
}

/* Two warm-up runs, then runs timed ones; fills r (error on failure). */
static inline void
bench_time_plan(QkvPlan *plan, gint runs, BenchResult *r)
{
  g_autoptr(GError) error = NULL;
  gboolean ok = plan != NULL;
  for (gint i = 0; ok && i < 2; i++)
    ok = qkv_plan_run(plan, &error);
  double *times = g_new(double, MAX(runs, 1));
  for (gint i = 0; ok && i < runs; i++) {
    gint64 t0 = g_get_monotonic_time();
    ok = qkv_plan_run(plan, &error);
    times[i] = (double)(g_get_monotonic_time() - t0) / 1000.0;
  }
  if (ok && runs > 0) {
    qsort(times, (size_t)runs, sizeof(double), bench_compare_doubles);
    r->median_ms = runs % 2 ? times[runs / 2] : 0.5 * (times[runs / 2 - 1] + times[runs / 2]);
    r->min_ms = times[0];
    r->arena_bytes = qkv_plan_arena_size(plan);
    r->n_steps = qkv_plan_n_steps(plan);
  } else {
    g_strlcpy(r->error, error ? error->message : "failed", sizeof r->error);
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  r->maxrss_kb = usage.ru_maxrss;
  g_free(times);
}

/* Run measure(data, r) in a child (the parent runs no OpenMP region, so
 * forking is safe) and copy its result back. */
static inline void
bench_measure_in_child(void (*measure)(gconstpointer data, BenchResult *r), gconstpointer data,
                       BenchResult *r)
{
  int fds[2];
  memset(r, 0, sizeof *r);
  if (pipe(fds) != 0) {
    g_strlcpy(r->error, "pipe failed", sizeof r->error);
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    BenchResult mine = {0};
    measure(data, &mine);
    ssize_t written = write(fds[1], &mine, sizeof mine);
    _exit(written == (ssize_t)sizeof mine ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = pid > 0 ? read(fds[0], r, sizeof *r) : -1;
  close(fds[0]);
  if (pid > 0)
    waitpid(pid, NULL, 0);
  if (got != (ssize_t)sizeof *r) {
    memset(r, 0, sizeof *r);
    g_strlcpy(r->error, "the measuring process failed", sizeof r->error);
  }
}
