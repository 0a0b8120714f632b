/* bench-shapes.c: the cost of switching a compiled plan between bound
 * shapes, for the book's Transformer (config S of bench-transformer: d 32,
 * FFN 64, 4 heads, 2 + 2 blocks, dropout 0.1, batch 64, 10 steps, vocab 200).
 *
 * One training plan is compiled at (64, 10). Rounds alternate between the
 * full batch and a smaller shape (a partial batch (37, 10) or shorter
 * sentences (64, 7)). In each round every shape is run twice in a row: the
 * first run follows a switch (it re-runs the shape rules), the second does
 * not. The switching cost is the median over rounds of (first - second) at
 * the same shape, reported against the median training step (plan run,
 * forward + backward) at the full shape.
 *
 *   qkv-bench-shapes [--rounds N] [--threads N]
 */
#include <qkv/qkv.h>
#include <qkv/qkv-builders.h>

#include <stdio.h>
#include <stdlib.h>
#include "../examples/common/options.h"

#include "../examples/common/program-version.h"

enum { B = 64, T = 10, V = 200 };

static gint opt_rounds = 60;
static gint opt_threads = 1;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"rounds", 'r', 0, G_OPTION_ARG_INT, &opt_rounds, "rounds (default 60)", "N"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "threads (default 1)", "N"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

typedef struct {
  QkvTensor *src, *src_valid, *dec_in, *labels, *tgt_valid;
} Batch;

static void
batch_init(Batch *b, gint batch, gint steps, GRand *rand)
{
  QkvShape bt = QKV_SHAPE(batch, steps), bs = QKV_SHAPE(batch);
  QkvTensor **ts[] = {&b->src, &b->dec_in, &b->labels};
  for (guint k = 0; k < G_N_ELEMENTS(ts); k++) {
    *ts[k] = qkv_tensor_new(QKV_I32, &bt);
    gint32 *d = qkv_tensor_i32(*ts[k]);
    for (gint i = 0; i < batch * steps; i++)
      d[i] = g_rand_int_range(rand, 3, V);
  }
  b->src_valid = qkv_tensor_new(QKV_I32, &bs);
  b->tgt_valid = qkv_tensor_new(QKV_I32, &bs);
  for (gint i = 0; i < batch; i++) {
    qkv_tensor_i32(b->src_valid)[i] = g_rand_int_range(rand, 1, steps + 1);
    qkv_tensor_i32(b->tgt_valid)[i] = g_rand_int_range(rand, 1, steps + 1);
  }
}

static void
batch_clear(Batch *b)
{
  qkv_tensor_free(b->src);
  qkv_tensor_free(b->src_valid);
  qkv_tensor_free(b->dec_in);
  qkv_tensor_free(b->labels);
  qkv_tensor_free(b->tgt_valid);
}

static void
bind_or_die(QkvPlan *plan, const Batch *b)
{
  GError *error = NULL;
  if (!qkv_plan_bind(plan, "src", b->src, &error) ||
      !qkv_plan_bind(plan, "src_valid", b->src_valid, &error) ||
      !qkv_plan_bind(plan, "dec_in", b->dec_in, &error) ||
      !qkv_plan_bind(plan, "labels", b->labels, &error) ||
      !qkv_plan_bind(plan, "tgt_valid", b->tgt_valid, &error))
    g_error("bind: %s", error->message);
}

static double
timed_run(QkvPlan *plan)
{
  GError *error = NULL;
  gint64 t0 = g_get_monotonic_time();
  if (!qkv_plan_run(plan, &error))
    g_error("run: %s", error->message);
  return (double)(g_get_monotonic_time() - t0) * 1e-6;
}

static int
compare_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double
median(double *v, gint n)
{
  qsort(v, (size_t)n, sizeof(double), compare_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int
main(int argc, char **argv)
{
  GError *error = NULL;
  g_autoptr(GOptionContext) oc = g_option_context_new("- cost of switching plan shapes");
  g_option_context_add_main_entries(oc, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT("rounds", &opt_rounds, 1, 1000000),
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
  };
  if (!g_option_context_parse(oc, &argc, &argv, &error)) {
    g_printerr("qkv-bench-shapes: %s\n", error->message);
    g_error_free(error);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-bench-shapes");
    return 0;
  }
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-bench-shapes: %s\n", error->message);
    g_error_free(error);
    return 2;
  }
  opt_rounds = MAX(opt_rounds, 3);

  QkvParams *params = qkv_params_new();
  QkvGraph *g = qkv_graph_new();
  QkvShape bt = QKV_SHAPE(B, T), bs = QKV_SHAPE(B);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, &error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, &error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, &error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, &error);
  QkvValue *tgt_valid = qkv_graph_input(g, "tgt_valid", QKV_I32, &bs, &error);
  QkvBuilder b = {.graph = g, .params = params, .seed = 0, .xavier_linear = TRUE};
  QkvTransformerConfig cfg = {.src_vocab = V,
                              .tgt_vocab = V,
                              .num_hiddens = 32,
                              .ffn_hiddens = 64,
                              .num_heads = 4,
                              .num_layers = 2,
                              .dropout = 0.1};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, src, src_valid, &error);
  QkvValue *logits = qkv_build_transformer_decoder(&b, &cfg, dec_in, enc, src_valid, NULL, &error);
  QkvValue *loss = qkv_build_seq2seq_loss_lens(logits, labels, tgt_valid, NULL, &error);
  if (loss == NULL || !qkv_graph_backward(g, loss, &error))
    g_error("build: %s", error->message);
  QkvPlanOptions po = qkv_plan_options_default();
  po.training = TRUE;
  po.n_threads = opt_threads;
  QkvPlan *plan = qkv_graph_compile(g, &loss, 1, &po, &error);
  if (plan == NULL)
    g_error("compile: %s", error->message);

  GRand *rand = g_rand_new_with_seed(1);
  Batch full, partial, shorter;
  batch_init(&full, B, T, rand);
  batch_init(&partial, 37, T, rand);
  batch_init(&shorter, B, 7, rand);
  const Batch *small[] = {&partial, &shorter};
  const gchar *small_name[] = {"partial batch (37, 10)", "shorter sentences (64, 7)"};

  bind_or_die(plan, &full);
  for (gint i = 0; i < 5; i++)
    timed_run(plan);

  gint n = opt_rounds;
  double *step = g_new(double, n);
  double *diff_small = g_new(double, n), *diff_full = g_new(double, n);
  double *small_step = g_new(double, n);
  printf("{\"model\": \"transformer S\", \"compiled\": [%d, %d], \"threads\": %d, \"rounds\": %d",
         B, T, opt_threads, n);
  guint64 allocs = 0;
  for (guint k = 0; k < G_N_ELEMENTS(small); k++) {
    for (gint r = 0; r < n; r++) {
      guint64 a0 = qkv_alloc_count();
      bind_or_die(plan, small[k]);
      double s1 = timed_run(plan); /* after a switch */
      double s2 = timed_run(plan); /* same shape */
      bind_or_die(plan, &full);
      double f1 = timed_run(plan);
      double f2 = timed_run(plan);
      allocs += qkv_alloc_count() - a0;
      diff_small[r] = s1 - s2;
      diff_full[r] = f1 - f2;
      step[r] = f2;
      small_step[r] = s2;
    }
    double m_step = median(step, n), m_small = median(small_step, n);
    double d_small = median(diff_small, n), d_full = median(diff_full, n);
    printf(", \"%s\": {\"step_full_s\": %.6f, \"step_small_s\": %.6f, "
           "\"switch_to_small_s\": %.6f, \"switch_to_full_s\": %.6f, "
           "\"switch_share_of_step\": %.4f}",
           small_name[k], m_step, m_small, d_small, d_full, MAX(d_small, d_full) / m_step);
  }
  printf(", \"allocations\": %" G_GUINT64_FORMAT "}\n", allocs);

  g_free(step);
  g_free(diff_small);
  g_free(diff_full);
  g_free(small_step);
  batch_clear(&full);
  batch_clear(&partial);
  batch_clear(&shorter);
  g_rand_free(rand);
  qkv_plan_free(plan);
  qkv_graph_free(g);
  qkv_params_free(params);
  return 0;
}
