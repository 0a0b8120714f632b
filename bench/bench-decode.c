/* bench-decode.c: decoding speed of the book's Transformer, tokens per
 * second, with the step decoder's key/value cache (qkv_step_decoder_*)
 * against recomputing the decoder on the whole prefix for every token.
 *
 * Model: a benchmark configuration of bench-transformer.c (M: d_model 256,
 * FFN 1024, 8 heads, 2 + 2 blocks, vocabulary 1000, sources of 32 tokens),
 * Xavier-initialised by the builders (speed does not depend on training).
 * Each run decodes --batch random sources of 17–32 tokens into --len tokens
 * each (the argmax with <eos> left out, so every sentence runs the full
 * length). Both ways run the encoder once per batch and are timed from the
 * sources to the last token:
 *   cache   qkv_step_decoder_start(), then --len qkv_step_decoder_step():
 *           one plan run per token over one token per sentence;
 *   prefix  the decoder of qkv_build_transformer_decoder() compiled for --len
 *           positions and bound at step t to the t + 1 tokens so far (a plan
 *           runs on bound shapes smaller than compiled), so step t computes
 *           t + 1 positions and keeps the last one's logits: the cost of
 *           decoding without a cache, every token at its true position.
 * The two alternate, --reps times each, after one warm-up run of each;
 * medians are printed, then one JSON line.
 *
 *   qkv-bench-decode --config M --batch 1 --len 64 --reps 5 --threads 2
 */
#include <qkv/qkv.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../examples/common/options.h"

#include "../examples/common/program-version.h"

typedef struct {
  const gchar *name;
  gint64 d_model, ffn;
  gint heads, layers;
  gint src_len;
  gint64 vocab;
} DecodeConfig;

/* bench-transformer.c's configurations (its num_steps is the source length) */
static const DecodeConfig configs[] = {
    {"S", 32, 64, 4, 2, 10, 200},
    {"M", 256, 1024, 8, 2, 32, 1000},
    {"L", 512, 2048, 8, 6, 64, 8000},
};

enum { EOS = 2 };

static gchar *opt_config = NULL;
static gint opt_batch = 1;
static gint opt_len = 64;
static gint opt_reps = 5;
static gint opt_threads = 2;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"config", 'c', 0, G_OPTION_ARG_STRING, &opt_config, "S, M or L (default M)", "NAME"},
    {"batch", 'b', 0, G_OPTION_ARG_INT, &opt_batch, "Sentences decoded together (default 1)", "N"},
    {"len", 0, 0, G_OPTION_ARG_INT, &opt_len, "Tokens decoded per sentence (default 64)", "N"},
    {"reps", 0, 0, G_OPTION_ARG_INT, &opt_reps, "Timed runs of each way (default 5)", "N"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "Worker threads (default 2)", "N"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

static void
die(const gchar *what, GError *error)
{
  g_printerr("qkv-bench-decode: %s: %s\n", what, error ? error->message : "failed");
  exit(1);
}

static gint32
argmax_no_eos(const float *row, gint64 n)
{
  gint32 best = EOS == 0 ? 1 : 0;
  for (gint64 v = 0; v < n; v++)
    if (v != EOS && row[v] > row[best])
      best = (gint32)v;
  return best;
}

typedef struct {
  const DecodeConfig *c;
  QkvTransformerConfig tc;
  gint B, L;
  QkvTensor *src, *valid;
  /* prefix recomputation */
  QkvGraph *enc_graph, *dec_graph;
  QkvPlan *enc_plan, *dec_plan;
  QkvTensor *enc;     /* (B, S, d) */
  QkvTensor **dec_in; /* dec_in[t]: (B, t + 1) */
  QkvStepDecoder *step;
  float *logits; /* (B, V) */
  gint32 *tokens;
  gint32 checksum;
} Bench;

static void
bench_setup(Bench *b, QkvParams *params)
{
  g_autoptr(GError) error = NULL;
  const DecodeConfig *c = b->c;
  const gint B = b->B, S = c->src_len, L = b->L;
  b->tc = (QkvTransformerConfig){.src_vocab = c->vocab,
                                 .tgt_vocab = c->vocab,
                                 .num_hiddens = c->d_model,
                                 .ffn_hiddens = c->ffn,
                                 .num_heads = c->heads,
                                 .num_layers = c->layers};
  QkvShape bs = QKV_SHAPE(B, S), b1 = QKV_SHAPE(B), bsd = QKV_SHAPE(B, S, c->d_model);
  QkvShape bl = QKV_SHAPE(B, L);
  b->src = qkv_tensor_new(QKV_I32, &bs);
  b->valid = qkv_tensor_new(QKV_I32, &b1);
  GRand *rand = g_rand_new_with_seed(42);
  for (gint i = 0; i < B; i++) {
    gint len = g_rand_int_range(rand, S / 2 + 1, S + 1);
    qkv_tensor_i32(b->valid)[i] = len;
    for (gint t = 0; t < S; t++)
      qkv_tensor_i32(b->src)[i * S + t] = t < len ? g_rand_int_range(rand, 3, (gint32)c->vocab) : 0;
  }
  g_rand_free(rand);

  QkvBuilder eb = {.params = params, .seed = 1, .xavier_linear = TRUE};
  eb.graph = b->enc_graph = qkv_graph_new();
  QkvValue *src = qkv_graph_input(eb.graph, "src", QKV_I32, &bs, &error);
  QkvValue *valid = qkv_graph_input(eb.graph, "src_valid", QKV_I32, &b1, &error);
  QkvValue *enc = qkv_build_transformer_encoder(&eb, &b->tc, src, valid, &error);
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = opt_threads;
  b->enc_plan = enc ? qkv_graph_compile(eb.graph, &enc, 1, &o, &error) : NULL;
  if (b->enc_plan == NULL || !qkv_plan_bind(b->enc_plan, "src", b->src, &error) ||
      !qkv_plan_bind(b->enc_plan, "src_valid", b->valid, &error))
    die("encoder plan", error);

  QkvBuilder db = eb;
  db.graph = b->dec_graph = qkv_graph_new();
  QkvValue *encv = qkv_graph_input(db.graph, "enc", QKV_F32, &bsd, &error);
  QkvValue *dvalid = qkv_graph_input(db.graph, "src_valid", QKV_I32, &b1, &error);
  QkvValue *dec = qkv_graph_input(db.graph, "dec_in", QKV_I32, &bl, &error);
  QkvValue *logits = qkv_build_transformer_decoder(&db, &b->tc, dec, encv, dvalid, NULL, &error);
  b->dec_plan = logits ? qkv_graph_compile(db.graph, &logits, 1, &o, &error) : NULL;
  b->enc = qkv_tensor_new(QKV_F32, &bsd);
  if (b->dec_plan == NULL || !qkv_plan_bind(b->dec_plan, "enc", b->enc, &error) ||
      !qkv_plan_bind(b->dec_plan, "src_valid", b->valid, &error))
    die("prefix decoder plan", error);
  b->dec_in = g_new(QkvTensor *, L);
  for (gint t = 0; t < L; t++) {
    QkvShape s = QKV_SHAPE(B, t + 1);
    b->dec_in[t] = qkv_tensor_new(QKV_I32, &s);
  }

  b->step = qkv_step_decoder_new_transformer(params, &b->tc, B, S, L, opt_threads, &error);
  if (b->step == NULL)
    die("step decoder", error);
  b->logits = g_new(float, (gsize)B * c->vocab);
  b->tokens = g_new(gint32, B);
}

/* Seconds to decode the batch with the cache. */
static double
run_cache(Bench *b)
{
  g_autoptr(GError) error = NULL;
  const gint64 V = b->c->vocab;
  gint64 t0 = g_get_monotonic_time();
  if (!qkv_step_decoder_start(b->step, b->src, b->valid, 1, &error))
    die("start", error);
  for (gint i = 0; i < b->B; i++)
    b->tokens[i] = 1;
  for (gint t = 0; t < b->L; t++) {
    if (!qkv_step_decoder_step(b->step, t, b->tokens, NULL, b->B, b->logits, &error))
      die("step", error);
    for (gint i = 0; i < b->B; i++)
      b->tokens[i] = argmax_no_eos(b->logits + i * V, V);
  }
  double s = (g_get_monotonic_time() - t0) / 1e6;
  b->checksum = b->tokens[0];
  return s;
}

/* Seconds to decode the batch by recomputing the prefix. */
static double
run_prefix(Bench *b)
{
  g_autoptr(GError) error = NULL;
  const gint64 V = b->c->vocab;
  const gint B = b->B, L = b->L;
  gint64 t0 = g_get_monotonic_time();
  if (!qkv_plan_run(b->enc_plan, &error) ||
      !qkv_tensor_copy_from(b->enc, qkv_plan_output(b->enc_plan, 0), &error))
    die("encoder", error);
  for (gint t = 0; t < L; t++) {
    gint32 *d = qkv_tensor_i32(b->dec_in[t]);
    for (gint i = 0; i < B; i++) {
      if (t > 0)
        memcpy(d + i * (t + 1), qkv_tensor_i32(b->dec_in[t - 1]) + i * t, t * sizeof(gint32));
      d[i * (t + 1) + t] = t == 0 ? 1 : b->tokens[i];
    }
    if (!qkv_plan_bind(b->dec_plan, "dec_in", b->dec_in[t], &error) ||
        !qkv_plan_run(b->dec_plan, &error))
      die("prefix step", error);
    const float *out = qkv_tensor_const_data(qkv_plan_output(b->dec_plan, 0));
    for (gint i = 0; i < B; i++)
      b->tokens[i] = argmax_no_eos(out + ((gsize)i * (t + 1) + t) * V, V);
  }
  double s = (g_get_monotonic_time() - t0) / 1e6;
  b->checksum = b->tokens[0];
  return s;
}

static int
cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double
median(double *v, gint n)
{
  qsort(v, n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) ctx =
      g_option_context_new("- Transformer decoding speed: key/value cache against prefix "
                           "recomputation");
  g_option_context_add_main_entries(ctx, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT("batch", &opt_batch, 1, 4096),
      OPTION_INT("len", &opt_len, 1, 65536),
      OPTION_INT("reps", &opt_reps, 1, 1000000),
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
  };
  if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
    g_printerr("qkv-bench-decode: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-bench-decode");
    return 0;
  }
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-bench-decode: %s\n", error->message);
    return 2;
  }
  const DecodeConfig *c = NULL;
  for (guint i = 0; i < G_N_ELEMENTS(configs); i++)
    if (g_strcmp0(opt_config ? opt_config : "M", configs[i].name) == 0)
      c = &configs[i];
  if (c == NULL || opt_batch < 1 || opt_len < 1 || opt_reps < 1 || opt_threads < 1) {
    g_printerr("qkv-bench-decode: --config S|M|L; --batch, --len, --reps, --threads >= 1\n");
    return 2;
  }
  qkv_set_num_threads(opt_threads);
  g_autoptr(QkvParams) params = qkv_params_new();
  Bench b = {.c = c, .B = opt_batch, .L = opt_len};
  bench_setup(&b, params);

  run_cache(&b);
  gint32 cache_tok = b.checksum;
  run_prefix(&b);
  gint32 prefix_tok = b.checksum;
  g_autofree double *tc = g_new(double, opt_reps);
  g_autofree double *tp = g_new(double, opt_reps);
  for (gint r = 0; r < opt_reps; r++) {
    tc[r] = run_cache(&b);
    tp[r] = run_prefix(&b);
    fprintf(stderr, "rep %d: cache %.4f s, prefix %.4f s\n", r + 1, tc[r], tp[r]);
  }
  double mc = median(tc, opt_reps), mp = median(tp, opt_reps);
  double tokens = (double)opt_batch * opt_len;
  printf("config %s, batch %d, %d tokens each, %d threads, %d reps (median)\n", c->name, opt_batch,
         opt_len, opt_threads, opt_reps);
  printf("  cache : %8.4f s  %9.1f tokens/s\n", mc, tokens / mc);
  printf("  prefix: %8.4f s  %9.1f tokens/s\n", mp, tokens / mp);
  printf("  speed-up %.1fx (last token of sentence 0: %s)\n", mp / mc,
         cache_tok == prefix_tok ? "same both ways" : "differs");
  printf("{\"config\": \"%s\", \"batch\": %d, \"len\": %d, \"threads\": %d, \"reps\": %d, "
         "\"cache_s\": %.5f, \"prefix_s\": %.5f, \"cache_tokens_per_s\": %.1f, "
         "\"prefix_tokens_per_s\": %.1f, \"speedup\": %.2f}\n",
         c->name, opt_batch, opt_len, opt_threads, opt_reps, mc, mp, tokens / mc, tokens / mp,
         mp / mc);

  for (gint t = 0; t < opt_len; t++)
    qkv_tensor_free(b.dec_in[t]);
  g_free(b.dec_in);
  qkv_step_decoder_free(b.step);
  qkv_plan_free(b.enc_plan);
  qkv_plan_free(b.dec_plan);
  qkv_graph_free(b.enc_graph);
  qkv_graph_free(b.dec_graph);
  qkv_tensor_free(b.enc);
  qkv_tensor_free(b.src);
  qkv_tensor_free(b.valid);
  g_free(b.logits);
  g_free(b.tokens);
  return 0;
}
