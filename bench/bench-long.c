/* bench-long.c: long sequences. One Transformer encoder block as the book
 * writes it (MultiHeadAttention without biases, AddNorm, PositionWiseFFN,
 * AddNorm) at d_model 512, 8 heads, FFN 2048, batch 1, causal self-attention,
 * no dropout, trained with Adam on loss = Σ out · w (w a fixed random
 * tensor): s/step is the median over the timed steps of plan run (forward,
 * backward) plus the Adam step. One JSON line.
 *
 *   qkv-bench-long --T 4096 [--threads N] [--steps N] [--warmup N]
 *   qkv-bench-long --T 4096 --attention   (the attention kernels alone)
 *
 * --attention times causal dot_product_attention forward and backward on
 * q, k, v of (8, T, 64) (the block's heads; the flash kernels, since no
 * weights are asked for) and qkv_sgemm at the FFN's shape (T × 2048 × 512)
 * in the same process: FLOP rates with the attention's useful FLOPs
 * counted as FlashAttention-2 does (forward 4·T²·d per head, halved by the
 * causal mask; backward 2.5× the forward, its recomputation included).
 *
 * QKV_FLASH_ATTENTION=0 runs the weights path instead (for comparison).
 */
#include <qkv/qkv.h>
#include <qkv/qkv-builders.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include "../examples/common/options.h"

#include "../examples/common/program-version.h"

enum { D_MODEL = 512, HEADS = 8, FFN = 2048 };

static gint64 opt_t = 1024;
static gint opt_threads = 1;
static gint opt_steps = 3;
static gint opt_warmup = 1;
static gboolean opt_attention = FALSE;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"T", 'T', 0, G_OPTION_ARG_INT64, &opt_t, "sequence length (default 1024)", "N"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "threads (default 1)", "N"},
    {"steps", 's', 0, G_OPTION_ARG_INT, &opt_steps, "timed steps (default 3)", "N"},
    {"warmup", 'w', 0, G_OPTION_ARG_INT, &opt_warmup, "untimed steps first (default 1)", "N"},
    {"attention", 'a', 0, G_OPTION_ARG_NONE, &opt_attention,
     "time the attention kernels and sgemm instead", NULL},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

static double
peak_rss_mib(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

static int
compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double
median(double *x, gint n)
{
  qsort(x, (gsize)n, sizeof(double), compare_doubles);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void
die(GError *error)
{
  g_printerr("qkv-bench-long: %s\n", error ? error->message : "failed");
  exit(1);
}

static void
train_block(void)
{
  g_autoptr(GError) error = NULL;
  const gint64 T = opt_t;
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 0};
  QkvShape xs = QKV_SHAPE(1, T, D_MODEL);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *a =
      x ? qkv_build_mha(&b, "attention", x, x, x, D_MODEL, HEADS, NULL, TRUE, 0.0, NULL, &error)
        : NULL;
  QkvValue *y = qkv_build_addnorm(&b, "addnorm1", x, a, 0.0, &error);
  QkvValue *f = qkv_build_ffn(&b, "ffn", y, FFN, D_MODEL, &error);
  QkvValue *z = qkv_build_addnorm(&b, "addnorm2", y, f, 0.0, &error);
  QkvTensor *w = qkv_tensor_new(QKV_F32, &xs);
  GRand *rand = g_rand_new_with_seed(1);
  for (gint64 i = 0; i < T * D_MODEL; i++)
    qkv_tensor_f32(w)[i] = (float)g_rand_double_range(rand, -1, 1);
  QkvValue *wv = z ? qkv_graph_constant(g, w, &error) : NULL;
  QkvValue *loss = wv ? qkv_sum(qkv_mul(z, wv, &error), NULL, 0, FALSE, &error) : NULL;
  if (loss == NULL || !qkv_graph_backward(g, loss, &error))
    die(error);
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = opt_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  if (plan == NULL)
    die(error);
  QkvOptimConfig oc = qkv_optim_config_adam(1e-4);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &oc, &error);
  g_autoptr(QkvTensor) xt = qkv_tensor_new(QKV_F32, &xs);
  for (gint64 i = 0; i < T * D_MODEL; i++)
    qkv_tensor_f32(xt)[i] = (float)g_rand_double_range(rand, -1, 1);
  g_rand_free(rand);
  if (opt == NULL || !qkv_plan_bind(plan, "x", xt, &error))
    die(error);
  double *times = g_new(double, MAX(opt_steps, 1));
  float last = 0;
  for (gint s = 0; s < opt_warmup + opt_steps; s++) {
    gint64 t0 = g_get_monotonic_time();
    if (!qkv_plan_run(plan, &error) || !qkv_optimizer_step(opt, &error))
      die(error);
    double dt = (g_get_monotonic_time() - t0) * 1e-6;
    last = qkv_plan_output_scalar(plan, 0);
    if (s >= opt_warmup)
      times[s - opt_warmup] = dt;
  }
  double med = opt_steps > 0 ? median(times, opt_steps) : 0;
  printf("{\"impl\": \"qkv\", \"T\": %" G_GINT64_FORMAT ", \"threads\": %d, \"steps\": %d, "
         "\"s_per_step\": %.4f, \"peak_rss_mib\": %.1f, \"arena_mib\": %.1f, \"loss\": %.6g, "
         "\"flash\": %s}\n",
         T, opt_threads, opt_steps, med, peak_rss_mib(), qkv_plan_arena_size(plan) / 1048576.0,
         last, g_strcmp0(g_getenv("QKV_FLASH_ATTENTION"), "0") == 0 ? "false" : "true");
  g_free(times);
  qkv_tensor_free(w);
}

static void
time_attention(void)
{
  g_autoptr(GError) error = NULL;
  const gint64 T = opt_t, dh = D_MODEL / HEADS;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(HEADS, T, dh);
  const gchar *names[] = {"q", "k", "v"};
  QkvValue *in[3];
  QkvTensor *t[3];
  GRand *rand = g_rand_new_with_seed(2);
  for (guint i = 0; i < 3; i++) {
    in[i] = qkv_graph_input(g, names[i], QKV_F32, &s, &error);
    if (in[i] == NULL)
      die(error);
    qkv_value_set_requires_grad(in[i], TRUE);
    t[i] = qkv_tensor_new(QKV_F32, &s);
    for (gint64 j = 0; j < HEADS * T * dh; j++)
      qkv_tensor_f32(t[i])[j] = (float)g_rand_double_range(rand, -1, 1);
  }
  QkvValue *out = qkv_dot_product_attention(in[0], in[1], in[2], NULL, TRUE, 0.0, NULL, &error);
  QkvValue *loss = out ? qkv_sum(out, NULL, 0, FALSE, &error) : NULL;
  if (loss == NULL || !qkv_graph_backward(g, loss, &error))
    die(error);
  QkvValue *outs[4] = {loss};
  for (guint i = 0; i < 3; i++)
    outs[1 + i] = qkv_graph_gradient(g, in[i]);
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = opt_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 4, &o, &error);
  if (plan == NULL)
    die(error);
  for (guint i = 0; i < 3; i++)
    if (!qkv_plan_bind(plan, names[i], t[i], &error))
      die(error);
  gint reps = opt_warmup + MAX(opt_steps, 1);
  double *times = g_new(double, reps);
  for (gint r = 0; r < reps; r++) {
    gint64 t0 = g_get_monotonic_time();
    if (!qkv_plan_run(plan, &error))
      die(error);
    times[r] = (g_get_monotonic_time() - t0) * 1e-6;
  }
  double att = median(times + opt_warmup, reps - opt_warmup);
  double att_flop = 3.5 * (4.0 * T * T * dh / 2.0) * HEADS;

  /* sgemm at the FFN's shape, same threads */
  gint64 m = T, n = FFN, k = D_MODEL;
  float *a = g_new0(float, m *k), *bm = g_new0(float, k *n), *c = g_new0(float, m *n);
  for (gint64 i = 0; i < m * k; i++)
    a[i] = (float)g_rand_double_range(rand, -1, 1);
  for (gint64 i = 0; i < k * n; i++)
    bm[i] = (float)g_rand_double_range(rand, -1, 1);
  double best_gemm = 1e30;
  for (gint r = 0; r < 5; r++) {
    gint64 t0 = g_get_monotonic_time();
    qkv_sgemm(FALSE, FALSE, m, n, k, 1.0f, a, k, bm, n, 0.0f, c, n, opt_threads);
    double dt = (g_get_monotonic_time() - t0) * 1e-6;
    best_gemm = MIN(best_gemm, dt);
  }
  double gemm_rate = 2.0 * m * n * k / best_gemm / 1e9, att_rate = att_flop / att / 1e9;
  printf("{\"impl\": \"qkv-attention\", \"T\": %" G_GINT64_FORMAT
         ", \"threads\": %d, \"reps\": %d, \"s_fwd_bwd\": %.4f, \"attention_gflops\": %.2f, "
         "\"sgemm_gflops\": %.2f, \"ratio\": %.3f, \"gemm\": \"%s %s\", \"vec_isa\": \"%s\"}\n",
         T, opt_threads, reps - opt_warmup, att, att_rate, gemm_rate, att_rate / gemm_rate,
         qkv_gemm_backend(), qkv_gemm_kernel(), qkv_vec_isa());
  g_free(a);
  g_free(bm);
  g_free(c);
  g_free(times);
  g_rand_free(rand);
  for (guint i = 0; i < 3; i++)
    qkv_tensor_free(t[i]);
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) ctx = g_option_context_new("- one encoder block at long T");
  g_option_context_add_main_entries(ctx, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT64("T", &opt_t, 1, 1048576),
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
      OPTION_INT("steps", &opt_steps, 1, 1000000),
      OPTION_INT("warmup", &opt_warmup, 0, 1000000),
  };
  if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
    g_printerr("qkv-bench-long: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-bench-long");
    return 0;
  }
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-bench-long: %s\n", error->message);
    return 2;
  }
  qkv_set_num_threads(opt_threads);
  if (opt_attention)
    time_attention();
  else
    train_block();
  return 0;
}
