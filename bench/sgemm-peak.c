/* sgemm-peak.c: what OpenBLAS's cblas_sgemm reaches on the GEMMs of the
 * peer Transformer's linear layers, as the ceiling qkv's step is measured
 * against (bench/compare.py runs it in the same session as the training
 * benchmarks).
 *
 * For every linear layer shape (tokens × in → out) of a config, the three
 * GEMMs of a training step are timed, row-major as qkv calls them:
 *   forward  Y = X·Wᵀ   (NT)  M = tokens, N = out, K = in
 *   dX       dX = dY·W  (NN)  M = tokens, N = in,  K = out
 *   dW       dW = dYᵀ·X (TN)  M = out,    N = in,  K = tokens
 * Each is called twice untimed, then repeatedly (each call timed on its own)
 * until --seconds have passed and at least 5 calls were made; the median call
 * gives the GFLOP/s (2·M·N·K per call).
 *
 * Summary: "gflops_weighted" is the FLOPs of all the config's linear-layer
 * GEMMs in one training step divided by the time they take at the measured
 * medians (each shape weighted by how often the model has it), i.e. the GEMM
 * rate a framework that spent no time outside these GEMMs would reach.
 * Also "gflops_median_shapes", the median over the shapes measured.
 *
 *   qkv-sgemm-peak [--config S|M|L] [--threads N] [--seconds S]
 * Prints one line per GEMM to stderr and one JSON line to stdout.
 */
#include <glib.h>

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static gchar *opt_config = NULL;
static gint opt_threads = 1;
static double opt_seconds = 1.0;

static GOptionEntry entries[] = {
    {"config", 'c', 0, G_OPTION_ARG_STRING, &opt_config, "S, M or L (default L)", "NAME"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "OpenBLAS threads (default 1)", "N"},
    {"seconds", 0, 0, G_OPTION_ARG_DOUBLE, &opt_seconds, "Minimum time per GEMM (default 1)", "S"},
    {NULL}};

typedef struct {
  const char *name;
  gint64 d_model, ffn;
  gint n_enc, n_dec;
  gint batch, num_steps;
  gint64 vocab;
} Config;

/* torch_transformer.py's CONFIGS (the fields that fix the GEMM shapes) */
static const Config configs[] = {
    {"S", 32, 64, 2, 2, 64, 10, 200},
    {"M", 256, 1024, 2, 2, 64, 32, 1000},
    {"L", 512, 2048, 6, 6, 16, 64, 8000},
};

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
compare_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static float *
random_matrix(gsize n, guint32 *seed)
{
  float *p = g_new(float, n);
  for (gsize i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    p[i] = (float)(*seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
  return p;
}

/* Median seconds of C (M×N) = op(A) (M×K) · op(B) (K×N). */
static double
time_sgemm(gint M, gint N, gint K, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb)
{
  guint32 seed = 12345u;
  float *A = random_matrix((gsize)M * K, &seed);
  float *B = random_matrix((gsize)K * N, &seed);
  float *C = random_matrix((gsize)M * N, &seed);
  gint lda = ta == CblasNoTrans ? K : M, ldb = tb == CblasNoTrans ? N : K;
  for (int w = 0; w < 2; w++)
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
  GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
  double start = now_s();
  for (;;) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
    double dt = now_s() - t0;
    g_array_append_val(times, dt);
    if (times->len >= 5 && now_s() - start >= opt_seconds)
      break;
  }
  g_array_sort(times, compare_double);
  double median = g_array_index(times, double, times->len / 2);
  g_array_unref(times);
  g_free(A);
  g_free(B);
  g_free(C);
  return median;
}

typedef struct {
  const char *name;
  gint64 in, out;
  gint64 count; /* instances per model */
} Linear;

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context =
      g_option_context_new("- cblas_sgemm rate at the peer Transformer's GEMM shapes");
  g_option_context_add_main_entries(context, entries, NULL);
  if (!g_option_context_parse(context, &argc, &argv, &error)) {
    g_printerr("qkv-sgemm-peak: %s\n", error->message);
    return 2;
  }
  const Config *cfg = NULL;
  for (guint i = 0; i < G_N_ELEMENTS(configs); i++)
    if (g_str_equal(opt_config ? opt_config : "L", configs[i].name))
      cfg = &configs[i];
  if (cfg == NULL || opt_threads < 1 || opt_seconds < 0) {
    g_printerr("qkv-sgemm-peak: --config S|M|L, --threads >= 1, --seconds >= 0\n");
    return 2;
  }
  openblas_set_num_threads(opt_threads);
  omp_set_num_threads(opt_threads);

  const gint64 d = cfg->d_model, f = cfg->ffn;
  const Linear linears[] = {
      {"attn W_q/k/v/o", d, d, 4 * cfg->n_enc + 8 * cfg->n_dec},
      {"ffn dense1", d, f, cfg->n_enc + cfg->n_dec},
      {"ffn dense2", f, d, cfg->n_enc + cfg->n_dec},
      {"out dense", d, cfg->vocab, 1},
  };
  const gint tokens = cfg->batch * cfg->num_steps;
  fprintf(stderr, "OpenBLAS %s (%s), %d threads, config %s (%d tokens)\n", openblas_get_corename(),
          openblas_get_config(), openblas_get_num_threads(), cfg->name, tokens);
  double flops_total = 0, seconds_total = 0;
  GArray *rates = g_array_new(FALSE, FALSE, sizeof(double));
  GString *json = g_string_new(NULL);
  g_string_append_printf(json,
                         "{\"config\": \"%s\", \"threads\": %d, \"seconds\": %g, \"shapes\": [",
                         cfg->name, opt_threads, opt_seconds);
  for (guint i = 0; i < G_N_ELEMENTS(linears); i++) {
    const Linear *l = &linears[i];
    struct {
      const char *kind;
      gint M, N, K;
      CBLAS_TRANSPOSE ta, tb;
    } gemms[] = {
        {"fwd NT", tokens, (gint)l->out, (gint)l->in, CblasNoTrans, CblasTrans},
        {"dX NN", tokens, (gint)l->in, (gint)l->out, CblasNoTrans, CblasNoTrans},
        {"dW TN", (gint)l->out, (gint)l->in, tokens, CblasTrans, CblasNoTrans},
    };
    for (guint k = 0; k < G_N_ELEMENTS(gemms); k++) {
      double s = time_sgemm(gemms[k].M, gemms[k].N, gemms[k].K, gemms[k].ta, gemms[k].tb);
      double flops = 2.0 * gemms[k].M * gemms[k].N * gemms[k].K;
      double rate = flops / s / 1e9;
      g_array_append_val(rates, rate);
      flops_total += flops * (double)l->count;
      seconds_total += s * (double)l->count;
      fprintf(stderr,
              "%-16s %-7s %5d %5d %5d  x%-3" G_GINT64_FORMAT "  median %8.3f ms  %7.1f GFLOP/s\n",
              l->name, gemms[k].kind, gemms[k].M, gemms[k].N, gemms[k].K, l->count, s * 1e3, rate);
      g_string_append_printf(json,
                             "%s{\"layer\": \"%s\", \"gemm\": \"%s\", \"M\": %d, \"N\": %d, "
                             "\"K\": %d, \"count\": %" G_GINT64_FORMAT
                             ", \"median_s\": %.6g, \"gflops\": %.2f}",
                             i + k ? ", " : "", l->name, gemms[k].kind, gemms[k].M, gemms[k].N,
                             gemms[k].K, l->count, s, rate);
    }
  }
  g_array_sort(rates, compare_double);
  double median_rate = g_array_index(rates, double, rates->len / 2);
  g_array_unref(rates);
  g_string_append_printf(json,
                         "], \"gemm_flops_per_step\": %.6g, \"gemm_s_per_step\": %.6g, "
                         "\"gflops_weighted\": %.2f, \"gflops_median_shapes\": %.2f, "
                         "\"blas\": \"%s\"}",
                         flops_total, seconds_total, flops_total / seconds_total / 1e9, median_rate,
                         openblas_get_corename());
  printf("%s\n", json->str);
  g_string_free(json, TRUE);
  return 0;
}
