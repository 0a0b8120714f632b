/* sgemm-peak.c: the ceiling qkv's training step is measured against, as
 * three figures from the same run (bench/compare.py runs it in the same
 * session as the training benchmarks):
 *
 *   fma_peak   the FMA peak of the cores: a register-only loop of independent
 *              FMAs at the widest width the CPU has (zmm with AVX-512, else
 *              ymm), on --threads threads at once, as
 *              shared/bench/limits/cpu_peak.c measures it;
 *   openblas   cblas_sgemm as PyTorch gets it: OpenBLAS's own detection of
 *              the CPU (OPENBLAS_CORETYPE, if set, overrides it) and its own
 *              --threads threads;
 *   qkv        qkv_sgemm() with the backend qkv picks (qkv_gemm_backend(),
 *              QKV_GEMM overrides it) on --threads threads of qkv's pool.
 *
 * Beside the FMA peak, the bf16 ceiling (bf16-peak.c): the VDPBF16PS peak
 * on the same threads (AVX512_BF16; 0 without it) and oneDNN's bf16 matmul
 * at BF16_SHAPE³ (0 without oneDNN), each also per core.
 *
 * With --candidates every GEMM backend qkv can use is timed too, each on one
 * thread per call and split over qkv's pool as qkv_sgemm() splits products:
 * qkv:openblas and qkv:onednn (qkv_set_gemm_backend()), and BLIS when
 * QKV_BENCH_BLIS names its library (e.g. a libblis.so.4 unpacked from
 * Debian's libblis4-pthread; it is opened with local symbols, so its BLAS
 * interface does not replace OpenBLAS's).
 *
 * For every linear layer shape (tokens × in → out) of a config, the three
 * GEMMs of a training step are timed, row-major as qkv calls them:
 *   forward  Y = X·Wᵀ   (NT)  M = tokens, N = out, K = in
 *   dX       dX = dY·W  (NN)  M = tokens, N = in,  K = out
 *   dW       dW = dYᵀ·X (TN)  M = out,    N = in,  K = tokens
 * Each shape is timed with every candidate in turn (so drifts of the machine
 * hit all alike): two calls untimed, then calls (each timed on its own) until
 * --seconds have passed and at least 5 calls were made; the median call gives
 * the GFLOP/s (2·M·N·K per call).
 *
 * Summary per candidate: the FLOPs of all the config's linear-layer GEMMs in
 * one training step over the time they take at the measured medians (each
 * shape weighted by how often the model has it), i.e. the GEMM rate a
 * framework that spent no time outside these GEMMs would reach; and its share
 * of fma_peak. "gflops_weighted" stays OpenBLAS's (older logs have only it).
 *
 *   qkv-sgemm-peak [--config S|M|L] [--threads N] [--seconds S] [--candidates]
 * Prints one line per GEMM to stderr and one JSON line to stdout.
 */
#include <qkv/qkv.h>

#include <cblas.h>
#include <gmodule.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16-peak.h"
#include "peak-timing.h"

/* the square shape of the oneDNN bf16 matmul figure: large enough that
 * packing and threading are a small part of each call */
#define BF16_SHAPE 2048
#include "../examples/common/program-version.h"

static gchar *opt_config = NULL;
static gint opt_threads = 1;
static double opt_seconds = 1.0;
static gboolean opt_candidates = FALSE;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"config", 'c', 0, G_OPTION_ARG_STRING, &opt_config, "S, M or L (default L)", "NAME"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "Threads (default 1)", "N"},
    {"seconds", 0, 0, G_OPTION_ARG_DOUBLE, &opt_seconds, "Minimum time per GEMM (default 1)", "S"},
    {"candidates", 0, 0, G_OPTION_ARG_NONE, &opt_candidates,
     "Also time every GEMM backend qkv can use", NULL},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
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

/* ---- figure 1: the FMA peak ---- */

#define FMA_ITERS 40000000L

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#include <immintrin.h>
#include "../examples/common/options.h"

/* 12 independent accumulators (more than FMA latency × pipes on any x86 core
 * so far), FMA_ITERS iterations; returns FLOPs done. */
static double
fma_loop_zmm(void)
{
  __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
         c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  for (long i = 0; i < FMA_ITERS; i++) {
    c0 = _mm512_fmadd_ps(c0, a, b), c1 = _mm512_fmadd_ps(c1, a, b);
    c2 = _mm512_fmadd_ps(c2, a, b), c3 = _mm512_fmadd_ps(c3, a, b);
    c4 = _mm512_fmadd_ps(c4, a, b), c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b), c7 = _mm512_fmadd_ps(c7, a, b);
    c8 = _mm512_fmadd_ps(c8, a, b), c9 = _mm512_fmadd_ps(c9, a, b);
    c10 = _mm512_fmadd_ps(c10, a, b), c11 = _mm512_fmadd_ps(c11, a, b);
    /* keeps the compiler from folding or merging the chains */
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
  }
  volatile float sink =
      _mm512_reduce_add_ps(c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11);
  (void)sink;
  return FMA_ITERS * 12.0 * 16 * 2;
}

static double
fma_loop_ymm(void)
{
  __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
         c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  for (long i = 0; i < FMA_ITERS; i++) {
    c0 = _mm256_fmadd_ps(c0, a, b), c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b), c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b), c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b), c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b), c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b), c11 = _mm256_fmadd_ps(c11, a, b);
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
  }
  float out[8];
  _mm256_storeu_ps(out, c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11);
  volatile float sink = out[0];
  (void)sink;
  return FMA_ITERS * 12.0 * 8 * 2;
}
#pragma GCC pop_options

static gboolean
cpu_has_avx512(void)
{
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

/* The widest FMA loop the CPU has; FLOPs done. */
static double
fma_loop(void)
{
  return cpu_has_avx512() ? fma_loop_zmm() : fma_loop_ymm();
}

/* GFLOP/s of n threads running the loop at once; best of three tries. */
static double
fma_peak(gint n)
{
  return peak_threads_gflops(fma_loop, n, "fma");
}

/* ---- figures 2 and 3, and the candidates ---- */

typedef struct {
  gint M, N, K;
  gboolean ta, tb;
  float *A, *B, *C;
  gint lda, ldb;
} Gemm;

typedef struct Candidate Candidate;
struct Candidate {
  const char *name;
  void (*call)(const Candidate *cand, const Gemm *g);
  const char *backend; /* qkv_set_gemm_backend() name for qkv:* */
  double flops_total, seconds_total;
};

static void
call_openblas(const Candidate *cand, const Gemm *g)
{
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
              g->M, g->N, g->K, 1.0f, g->A, g->lda, g->B, g->ldb, 0.0f, g->C, g->N);
}

static void
call_qkv(const Candidate *cand, const Gemm *g)
{
  qkv_sgemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, g->lda, g->B, g->ldb, 0.0f, g->C, g->N,
            opt_threads);
}

/* BLIS's typed API (blis.h, 0.9): trans_t BLIS_TRANSPOSE = 8, strides given
 * as (row, column) pairs. */
typedef void (*BliSgemm)(int ta, int tb, gint64 m, gint64 n, gint64 k, float *alpha, float *a,
                         gint64 rsa, gint64 csa, float *b, gint64 rsb, gint64 csb, float *beta,
                         float *c, gint64 rsc, gint64 csc);
static BliSgemm bli_sgemm_fn;
static const char *blis_arch = NULL;

static void
blis_block(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const Gemm *g = data;
  float one = 1.0f, zero = 0.0f;
  /* 64-row or -column blocks of c, as qkv_sgemm() splits */
  if (g->M >= g->N) {
    gint64 r0 = begin * 64, r1 = MIN(g->M, end * 64);
    float *a = g->ta ? g->A + r0 : g->A + r0 * g->lda;
    bli_sgemm_fn(g->ta ? 8 : 0, g->tb ? 8 : 0, r1 - r0, g->N, g->K, &one, a, g->lda, 1, g->B,
                 g->ldb, 1, &zero, g->C + r0 * g->N, g->N, 1);
  } else {
    gint64 c0 = begin * 64, c1 = MIN(g->N, end * 64);
    float *b = g->tb ? g->B + c0 * g->ldb : g->B + c0;
    bli_sgemm_fn(g->ta ? 8 : 0, g->tb ? 8 : 0, g->M, c1 - c0, g->K, &one, g->A, g->lda, 1, b,
                 g->ldb, 1, &zero, g->C + c0, g->N, 1);
  }
}

static void
call_blis(const Candidate *cand, const Gemm *g)
{
  gint64 blocks = ((g->M >= g->N ? g->M : g->N) + 63) / 64;
  if ((gint64)g->M * g->N * g->K < (1 << 22) || opt_threads <= 1)
    blis_block(0, blocks, 0, (gpointer)g);
  else
    qkv_parallel_for((gint)MIN(opt_threads, blocks), blocks, blis_block, (gpointer)g);
}

static gboolean
load_blis(void)
{
  const gchar *path = g_getenv("QKV_BENCH_BLIS");
  if (path == NULL)
    return FALSE;
  GModule *mod = g_module_open(path, G_MODULE_BIND_LOCAL);
  void (*set_threads)(gint64) = NULL;
  int (*query)(void) = NULL;
  const char *(*arch_string)(int) = NULL;
  if (mod == NULL || !g_module_symbol(mod, "bli_sgemm", (gpointer *)&bli_sgemm_fn) ||
      !g_module_symbol(mod, "bli_thread_set_num_threads", (gpointer *)&set_threads) ||
      !g_module_symbol(mod, "bli_arch_query_id", (gpointer *)&query) ||
      !g_module_symbol(mod, "bli_arch_string", (gpointer *)&arch_string)) {
    g_printerr("qkv-sgemm-peak: QKV_BENCH_BLIS=%s: %s\n", path, g_module_error());
    return FALSE;
  }
  set_threads(1);
  blis_arch = arch_string(query());
  return TRUE;
}

/* Switches whatever the candidate needs before its calls. */
static void
prepare(const Candidate *cand)
{
  /* OpenBLAS on its own threads only for the "as PyTorch gets it" figure;
   * qkv's calls expect it on one (openblas_set_num_threads also sets this
   * thread's OpenMP count) */
  openblas_set_num_threads(cand->call == call_openblas ? opt_threads : 1);
  g_autoptr(GError) error = NULL;
  if (!qkv_set_gemm_backend(cand->backend ? cand->backend : "auto", &error))
    g_error("%s", error->message);
}

typedef struct {
  const Candidate *cand;
  const Gemm *g;
} CandidateCall;

static void
candidate_call(gpointer data)
{
  const CandidateCall *cc = data;
  cc->cand->call(cc->cand, cc->g);
}

/* Median seconds of one candidate's calls. */
static double
time_candidate(const Candidate *cand, const Gemm *g)
{
  prepare(cand);
  CandidateCall cc = {cand, g};
  double median = peak_median_seconds(candidate_call, &cc, opt_seconds);
  /* let OpenBLAS's OpenMP workers stop spinning before the next candidate */
  g_usleep(20000);
  return median;
}

typedef struct {
  const char *name;
  gint64 in, out;
  gint64 count; /* instances per model */
} Linear;

/* OpenBLAS and qkv, and with --candidates qkv's other backends and BLIS
 * where they load; returns how many. */
static guint
candidates_init(Candidate *cands)
{
  guint n_cands = 0;
  cands[n_cands++] = (Candidate){"openblas", call_openblas, NULL, 0, 0};
  cands[n_cands++] = (Candidate){"qkv", call_qkv, NULL, 0, 0};
  if (opt_candidates) {
    cands[n_cands++] = (Candidate){"qkv:openblas", call_qkv, "openblas", 0, 0};
    g_autoptr(GError) no_onednn = NULL;
    if (qkv_set_gemm_backend("onednn", &no_onednn))
      cands[n_cands++] = (Candidate){"qkv:onednn", call_qkv, "onednn", 0, 0};
    if (load_blis())
      cands[n_cands++] = (Candidate){"blis", call_blis, NULL, 0, 0};
    qkv_set_gemm_backend("auto", NULL);
  }
  return n_cands;
}

/* One GEMM of a layer (kind "fwd NT" and so on) on random matrices, every
 * candidate in turn: a line on stderr, a shape object in json, the first
 * candidate's rate in rates, and the totals weighted by the layer's count. */
static void
time_gemm(const Linear *l, const char *kind, Gemm g, gboolean first, Candidate *cands,
          guint n_cands, guint32 *seed, GString *json, GArray *rates)
{
  g.A = random_matrix((gsize)g.M * g.K, seed);
  g.B = random_matrix((gsize)g.K * g.N, seed);
  g.C = random_matrix((gsize)g.M * g.N, seed);
  g.lda = g.ta ? g.M : g.K;
  g.ldb = g.tb ? g.K : g.N;
  double flops = 2.0 * g.M * g.N * g.K;
  g_string_append_printf(json,
                         "%s{\"layer\": \"%s\", \"gemm\": \"%s\", \"M\": %d, \"N\": %d, "
                         "\"K\": %d, \"count\": %" G_GINT64_FORMAT,
                         first ? "" : ", ", l->name, kind, g.M, g.N, g.K, l->count);
  fprintf(stderr, "%-16s %-7s %5d %5d %5d  x%-3" G_GINT64_FORMAT, l->name, kind, g.M, g.N, g.K,
          l->count);
  for (guint c = 0; c < n_cands; c++) {
    double s = time_candidate(&cands[c], &g);
    double rate = flops / s / 1e9;
    cands[c].flops_total += flops * (double)l->count;
    cands[c].seconds_total += s * (double)l->count;
    if (c == 0) {
      g_array_append_val(rates, rate);
      g_string_append_printf(json, ", \"median_s\": %.6g, \"gflops\": %.2f", s, rate);
    } else {
      g_string_append_printf(json, ", \"%s_gflops\": %.2f", cands[c].name, rate);
    }
    fprintf(stderr, "  %s %7.1f", cands[c].name, rate);
  }
  fprintf(stderr, " GFLOP/s\n");
  g_string_append(json, "}");
  g_free(g.A);
  g_free(g.B);
  g_free(g.C);
}

/* The three GEMMs (forward, input gradient, weight gradient) of every
 * linear layer of cfg's model, for a batch of tokens rows. */
static void
time_shapes(const Config *cfg, gint tokens, Candidate *cands, guint n_cands, GString *json,
            GArray *rates)
{
  const gint64 d = cfg->d_model, f = cfg->ffn;
  const Linear linears[] = {
      {"attn W_q/k/v/o", d, d, 4 * cfg->n_enc + 8 * cfg->n_dec},
      {"ffn dense1", d, f, cfg->n_enc + cfg->n_dec},
      {"ffn dense2", f, d, cfg->n_enc + cfg->n_dec},
      {"out dense", d, cfg->vocab, 1},
  };
  guint32 seed = 12345u;
  for (guint i = 0; i < G_N_ELEMENTS(linears); i++) {
    const Linear *l = &linears[i];
    struct {
      const char *kind;
      gint M, N, K;
      gboolean ta, tb;
    } gemms[] = {
        {"fwd NT", tokens, (gint)l->out, (gint)l->in, FALSE, TRUE},
        {"dX NN", tokens, (gint)l->in, (gint)l->out, FALSE, FALSE},
        {"dW TN", (gint)l->out, (gint)l->in, tokens, TRUE, FALSE},
    };
    for (guint k = 0; k < G_N_ELEMENTS(gemms); k++) {
      Gemm g = {gemms[k].M, gemms[k].N, gemms[k].K, gemms[k].ta, gemms[k].tb,
                NULL,       NULL,       NULL,       0,           0};
      time_gemm(l, gemms[k].kind, g, i + k == 0, cands, n_cands, &seed, json, rates);
    }
  }
}

/* The totals over a step: the end of the JSON line, and the weighted rates
 * on stderr. */
static void
finish_report(GString *json, const Candidate *cands, guint n_cands, GArray *rates, double peak,
              const char *width, const gchar *qkv_backend, const gchar *qkv_kernel)
{
  g_array_sort(rates, peak_compare_double);
  double median_rate = g_array_index(rates, double, rates->len / 2);
  double ob = cands[0].flops_total / cands[0].seconds_total / 1e9;
  double qk = cands[1].flops_total / cands[1].seconds_total / 1e9;
  g_string_append_printf(json,
                         "], \"gemm_flops_per_step\": %.6g, \"gemm_s_per_step\": %.6g, "
                         "\"gflops_weighted\": %.2f, \"gflops_median_shapes\": %.2f, "
                         "\"blas\": \"%s\", \"fma_peak_gflops\": %.2f, \"fma_width\": \"%s\", "
                         "\"openblas_gflops_weighted\": %.2f, \"qkv_gflops_weighted\": %.2f, "
                         "\"qkv_gemm_s_per_step\": %.6g, \"qkv_gemm_backend\": \"%s\", "
                         "\"qkv_gemm_kernel\": \"%s\", \"openblas_share_of_peak\": %.4f, "
                         "\"qkv_share_of_peak\": %.4f, \"candidates\": {",
                         cands[0].flops_total, cands[0].seconds_total, ob, median_rate,
                         openblas_get_corename(), peak, width, ob, qk, cands[1].seconds_total,
                         qkv_backend, qkv_kernel, ob / peak, qk / peak);
  fprintf(stderr, "weighted over a step:");
  for (guint c = 0; c < n_cands; c++) {
    double r = cands[c].flops_total / cands[c].seconds_total / 1e9;
    g_string_append_printf(json, "%s\"%s\": %.2f", c ? ", " : "", cands[c].name, r);
    fprintf(stderr, "  %s %.1f GFLOP/s (%.1f %% of the FMA peak)", cands[c].name, r,
            100 * r / peak);
  }
  fprintf(stderr, "\n");
  g_string_append_printf(json, "}%s%s%s}", blis_arch ? ", \"blis_arch\": \"" : "",
                         blis_arch ? blis_arch : "", blis_arch ? "\"" : "");
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context =
      g_option_context_new("- FMA peak, OpenBLAS and qkv_sgemm at the peer Transformer's GEMMs");
  g_option_context_add_main_entries(context, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
      OPTION_DOUBLE("seconds", &opt_seconds, 0, 3600),
  };
  if (!g_option_context_parse(context, &argc, &argv, &error) ||
      !options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-sgemm-peak: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-sgemm-peak");
    return 0;
  }
  const Config *cfg = NULL;
  for (guint i = 0; i < G_N_ELEMENTS(configs); i++)
    if (g_str_equal(opt_config ? opt_config : "L", configs[i].name))
      cfg = &configs[i];
  if (cfg == NULL || opt_threads < 1 || opt_seconds < 0) {
    g_printerr("qkv-sgemm-peak: --config S|M|L, --threads >= 1, --seconds >= 0\n");
    return 2;
  }
  qkv_set_num_threads(opt_threads);
  const gchar *qkv_backend = qkv_gemm_backend(), *qkv_kernel = qkv_gemm_kernel();

  Candidate cands[8];
  guint n_cands = candidates_init(cands);

  double peak = fma_peak(opt_threads);
  const char *width = cpu_has_avx512() ? "zmm" : "ymm";

  const gchar *dot_isa = NULL, *dnnl_impl = NULL;
  double dot_peak = bf16_dot_peak(opt_threads, &dot_isa);
  double dnnl_bf16 =
      bf16_onednn_matmul(opt_threads, BF16_SHAPE, BF16_SHAPE, BF16_SHAPE, opt_seconds, &dnnl_impl);
  fprintf(stderr,
          "per core: FMA peak (%s) %.1f GFLOP/s; bf16 dot-product peak (%s) %.1f GFLOP/s; oneDNN "
          "bf16 matmul %d^3 (%s) %.1f GFLOP/s\n",
          width, peak / opt_threads, dot_isa, dot_peak / opt_threads, BF16_SHAPE, dnnl_impl,
          dnnl_bf16 / opt_threads);

  const gint tokens = cfg->batch * cfg->num_steps;
  fprintf(stderr,
          "config %s (%d tokens), %d threads; FMA peak (%s) %.1f GFLOP/s; OpenBLAS %s (%s); qkv "
          "GEMM %s, kernel %s%s%s\n",
          cfg->name, tokens, opt_threads, width, peak, openblas_get_corename(),
          openblas_get_config(), qkv_backend, qkv_kernel, blis_arch ? "; BLIS " : "",
          blis_arch ? blis_arch : "");
  GArray *rates = g_array_new(FALSE, FALSE, sizeof(double));
  GString *json = g_string_new(NULL);
  g_string_append_printf(json,
                         "{\"config\": \"%s\", \"threads\": %d, \"seconds\": %g, "
                         "\"fma_peak_gflops_per_core\": %.2f, \"bf16_dot_peak_gflops\": %.2f, "
                         "\"bf16_dot_peak_gflops_per_core\": %.2f, \"bf16_dot_isa\": \"%s\", "
                         "\"onednn_bf16_matmul_shape\": %d, \"onednn_bf16_matmul_gflops\": %.2f, "
                         "\"onednn_bf16_matmul_gflops_per_core\": %.2f, "
                         "\"onednn_bf16_matmul_impl\": \"%s\", \"shapes\": [",
                         cfg->name, opt_threads, opt_seconds, peak / opt_threads, dot_peak,
                         dot_peak / opt_threads, dot_isa, BF16_SHAPE, dnnl_bf16,
                         dnnl_bf16 / opt_threads, dnnl_impl);
  time_shapes(cfg, tokens, cands, n_cands, json, rates);
  finish_report(json, cands, n_cands, rates, peak, width, qkv_backend, qkv_kernel);
  g_array_unref(rates);
  printf("%s\n", json->str);
  g_string_free(json, TRUE);
  return 0;
}
