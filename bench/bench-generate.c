/* bench-generate.c: qkv-gpt's generation speed, tokens per second, through
 * the key/value caches (examples/gpt/generate.c: gpt_logits built in cached
 * mode, QkvPlanDecoder under qkv_generate) against recomputing the prefix
 * for every token.
 *
 * Model: examples/gpt's GPT (its defaults: d_model 64, 2 blocks, 4 heads;
 * a vocabulary of 64), initialised as it is (speed does not depend on
 * training), with a block of --prompt + --tokens positions so that the
 * caches never restart and both ways see the same context. One row (batch
 * 1), greedy: both ways emit --tokens tokens after a random prompt, timed
 * from building the graph to the last token:
 *   cached     gpt_generate(): one plan run per token over one token;
 *   recompute  gpt_logits compiled for the block and bound at step t to the
 *              t + 1 tokens so far (a plan runs on bound shapes smaller than
 *              compiled), keeping the last position's logits.
 * The two alternate, --reps times each, after a warm-up run of each; the
 * medians are printed, with their ratio and how many of the greedy tokens
 * the two agree on (rounding may flip a near tie).
 *
 *   qkv-bench-generate --tokens 256 --reps 3 --threads 1
 */
#include <qkv/qkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt/gpt.h"
#include "../examples/common/options.h"
#include "../examples/common/program-version.h"

static gint opt_tokens = 256, opt_prompt = 8, opt_reps = 3, opt_threads = 1;
static gint opt_d_model = 64, opt_layers = 2, opt_heads = 4, opt_vocab = 64;
static gboolean opt_version = FALSE;

static GOptionEntry entries[] = {
    {"tokens", 'n', 0, G_OPTION_ARG_INT, &opt_tokens, "Tokens generated (default 256)", "N"},
    {"prompt", 0, 0, G_OPTION_ARG_INT, &opt_prompt, "Prompt tokens (default 8)", "N"},
    {"reps", 0, 0, G_OPTION_ARG_INT, &opt_reps, "Timed runs of each way (default 3)", "N"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "Worker threads (default 1)", "N"},
    {"d-model", 0, 0, G_OPTION_ARG_INT, &opt_d_model, "Width (default 64)", "N"},
    {"layers", 0, 0, G_OPTION_ARG_INT, &opt_layers, "Blocks (default 2)", "N"},
    {"heads", 0, 0, G_OPTION_ARG_INT, &opt_heads, "Heads (default 4)", "N"},
    {"vocab", 0, 0, G_OPTION_ARG_INT, &opt_vocab, "Vocabulary (default 64)", "N"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

typedef struct {
  QkvPlan *plan; /* logits (1, n, vocab) of the n tokens bound */
  gint32 *ids;   /* the context so far */
  gint64 vocab;
} Recompute;

static gboolean
recompute_step(gpointer data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
               float *logits, GError **error)
{
  Recompute *r = data;
  r->ids[step] = tokens[0];
  QkvShape s = QKV_SHAPE(1, step + 1);
  g_autoptr(QkvTensor) x =
      qkv_tensor_new_i32(&s, r->ids); /* a copy: n ints, next to n tokens of compute */
  if (!qkv_plan_bind(r->plan, "x", x, error) || !qkv_plan_run(r->plan, error))
    return FALSE;
  const float *out = qkv_tensor_const_data(qkv_plan_output(r->plan, 0));
  memcpy(logits, out + (gsize)step * r->vocab, (gsize)r->vocab * sizeof(float));
  return TRUE;
}

static gboolean
recompute_generate(QkvParams *params, const GptConfig *cfg, const gint32 *prompt, gint n_prompt,
                   gint length, gint32 *out, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .inits = &gpt_inits};
  QkvShape window = QKV_SHAPE(1, cfg->block);
  QkvValue *logits = gpt_logits(&b, cfg, qkv_graph_input(g, "x", QKV_I32, &window, error), error);
  g_autoptr(QkvPlan) plan = logits ? qkv_graph_compile(g, &logits, 1, NULL, error) : NULL;
  g_autofree gint32 *ids = g_new0(gint32, cfg->block);
  QkvGenerateOptions o = qkv_generate_options_default();
  o.sample.temperature = 0;
  o.vocab = cfg->vocab;
  gint n_out = 0;
  return plan && qkv_generate(&o, 1, prompt, &n_prompt, length, recompute_step,
                              &(Recompute){plan, ids, cfg->vocab}, out, &n_out, error);
}

static int
compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) ctx = g_option_context_new("- cached generation against recompute");
  g_option_context_add_main_entries(ctx, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT("tokens", &opt_tokens, 1, 1000000),
      OPTION_INT("prompt", &opt_prompt, 1, 1000000),
      OPTION_INT("reps", &opt_reps, 1, 1000000),
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
      OPTION_INT("d-model", &opt_d_model, 1, 65536),
      OPTION_INT("layers", &opt_layers, 1, 256),
      OPTION_INT("heads", &opt_heads, 1, 4096),
      OPTION_INT("vocab", &opt_vocab, 2, 1000000),
  };
  if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
    fprintf(stderr, "qkv-bench-generate: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-bench-generate");
    return 0;
  }
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    fprintf(stderr, "qkv-bench-generate: %s\n", error->message);
    return 2;
  }
  if (opt_d_model % opt_heads != 0) {
    fprintf(stderr, "qkv-bench-generate: --d-model %d is not a multiple of --heads %d\n",
            opt_d_model, opt_heads);
    return 2;
  }
  qkv_init();
  qkv_set_num_threads(opt_threads);
  GptConfig cfg = {opt_vocab, opt_prompt + opt_tokens, opt_d_model, opt_layers, opt_heads};
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 1, .inits = &gpt_inits};
  QkvShape one = QKV_SHAPE(1, cfg.block);
  if (gpt_logits(&b, &cfg, qkv_graph_input(g, "x", QKV_I32, &one, &error), &error) == NULL) {
    fprintf(stderr, "qkv-bench-generate: %s\n", error->message);
    return 1;
  }
  g_autofree gint32 *prompt = g_new(gint32, opt_prompt);
  for (gint i = 0; i < opt_prompt; i++)
    prompt[i] = (gint32)((i * 7 + 3) % opt_vocab);
  g_autofree gint32 *cached_out = g_new(gint32, opt_tokens);
  g_autofree gint32 *recompute_out = g_new(gint32, opt_tokens);
  g_autofree double *t_cached = g_new(double, opt_reps);
  g_autofree double *t_recompute = g_new(double, opt_reps);
  QkvSampleOptions greedy = qkv_sample_options_default();
  greedy.temperature = 0;
  for (gint rep = -1; rep < opt_reps; rep++) { /* rep -1: the warm-up */
    gint n_out = 0;
    gint64 start = g_get_monotonic_time();
    if (!gpt_generate(params, &cfg, prompt, opt_prompt, opt_tokens, &greedy, QKV_PRECISION_FP32,
                      cached_out, &n_out, &error))
      break;
    gint64 mid = g_get_monotonic_time();
    if (!recompute_generate(params, &cfg, prompt, opt_prompt, opt_tokens, recompute_out, &error))
      break;
    gint64 end = g_get_monotonic_time();
    if (rep >= 0) {
      t_cached[rep] = (mid - start) / 1e6;
      t_recompute[rep] = (end - mid) / 1e6;
    }
  }
  if (error != NULL) {
    fprintf(stderr, "qkv-bench-generate: %s\n", error->message);
    return 1;
  }
  qsort(t_cached, opt_reps, sizeof(double), compare_doubles);
  qsort(t_recompute, opt_reps, sizeof(double), compare_doubles);
  double c = t_cached[opt_reps / 2], r = t_recompute[opt_reps / 2];
  gint agree = 0;
  for (gint i = 0; i < opt_tokens; i++)
    agree += cached_out[i] == recompute_out[i];
  printf("GPT d_model %d, %d blocks, %d heads, vocab %d; batch 1, prompt %d, %d tokens, %d "
         "thread(s), median of %d\n",
         opt_d_model, opt_layers, opt_heads, opt_vocab, opt_prompt, opt_tokens, opt_threads,
         opt_reps);
  printf("cached     %8.4f s  %10.1f tokens/s\n", c, opt_tokens / c);
  printf("recompute  %8.4f s  %10.1f tokens/s\n", r, opt_tokens / r);
  printf("ratio      %.2f x\n", r / c);
  printf("greedy tokens the two agree on: %d of %d\n", agree, opt_tokens);
  return 0;
}
