/* qkv-gpt: a character-level GPT on the English side of the fra-eng pairs.
 * Trains (printing training and held-out loss), saves, loads, and samples
 * a continuation of a prompt. See README.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "gpt.h"
#include "../common/options.h"
#include "../common/program-version.h"
#include "../common/text.h"

static gint opt_steps = 1000, opt_threads = 0, opt_length = 200, opt_top_k = 0;
static gint opt_d_model = 64, opt_layers = 2, opt_heads = 4, opt_block = 32, opt_batch = 16;
static gint opt_warmup = 100, opt_eval_every = 100, opt_max_lines = 0;
static gint64 opt_seed = 0;
static gdouble opt_lr = 3e-3, opt_weight_decay = 0.1, opt_clip = 1.0;
static gdouble opt_temperature = 0.8, opt_top_p = 1.0;
static gchar *opt_save = NULL, *opt_load = NULL, *opt_prompt = NULL, *opt_data = NULL;
static gchar *opt_precision = NULL, *opt_save_dtype = NULL;
static QkvPrecision precision = QKV_PRECISION_FP32;
static QkvCheckpointDType save_dtype = QKV_CHECKPOINT_DTYPE_F32;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"steps", 0, 0, G_OPTION_ARG_INT, &opt_steps, "Training steps, 0 to 1000000 (1000)", "N"},
    {"threads", 0, 0, G_OPTION_ARG_INT, &opt_threads, "Worker threads, 1 to 256 (default: all)",
     "N"},
    {"save", 0, 0, G_OPTION_ARG_FILENAME, &opt_save, "Save the model here after training", "FILE"},
    {"save-dtype", 0, 0, G_OPTION_ARG_STRING, &opt_save_dtype,
     "Parameters saved as f32 (default) or bf16 (rounded to nearest even, half the size)", "DTYPE"},
    {"load", 0, 0, G_OPTION_ARG_FILENAME, &opt_load,
     "Start from this checkpoint (its model sizes and vocabulary)", "FILE"},
    {"prompt", 0, 0, G_OPTION_ARG_FILENAME, &opt_prompt, /* bytes as given: UTF-8 in any locale */
     "Text the sample continues (default: none)", "TEXT"},
    {"length", 0, 0, G_OPTION_ARG_INT, &opt_length, "Characters to sample, 1 to 100000 (200)", "N"},
    {"temperature", 0, 0, G_OPTION_ARG_DOUBLE, &opt_temperature,
     "Sampling temperature, 0 (greedy) to 100 (0.8)", "T"},
    {"top-k", 0, 0, G_OPTION_ARG_INT, &opt_top_k,
     "Keep the k likeliest characters, 0 (all) to 100000", "K"},
    {"top-p", 0, 0, G_OPTION_ARG_DOUBLE, &opt_top_p, "Nucleus sampling, 0 < p <= 1 (1)", "P"},
    {"seed", 0, 0, G_OPTION_ARG_INT64, &opt_seed,
     "Seed of initialisation, batches and sampling (0)", "S"},
    {"d-model", 0, 0, G_OPTION_ARG_INT, &opt_d_model, "Model width, 4 to 4096 (64)", "D"},
    {"layers", 0, 0, G_OPTION_ARG_INT, &opt_layers, "Transformer blocks, 1 to 64 (2)", "N"},
    {"heads", 0, 0, G_OPTION_ARG_INT, &opt_heads, "Attention heads, dividing d-model (4)", "N"},
    {"block", 0, 0, G_OPTION_ARG_INT, &opt_block, "Context length, 2 to 4096 (32)", "N"},
    {"batch", 0, 0, G_OPTION_ARG_INT, &opt_batch, "Windows per batch, 1 to 4096 (16)", "N"},
    {"lr", 0, 0, G_OPTION_ARG_DOUBLE, &opt_lr, "Peak learning rate, 0 < lr <= 1 (0.003)", "LR"},
    {"warmup", 0, 0, G_OPTION_ARG_INT, &opt_warmup, "Warm-up steps, 0 to steps (100)", "N"},
    {"weight-decay", 0, 0, G_OPTION_ARG_DOUBLE, &opt_weight_decay,
     "AdamW decay of the matrices, 0 to 1 (0.1)", "WD"},
    {"clip", 0, 0, G_OPTION_ARG_DOUBLE, &opt_clip, "Gradient norm clip, > 0 (1)", "C"},
    {"eval-every", 0, 0, G_OPTION_ARG_INT, &opt_eval_every,
     "Steps between reports, 1 to 1000000 (100)", "N"},
    {"max-lines", 0, 0, G_OPTION_ARG_INT, &opt_max_lines, "Read only the first N lines (0: all)",
     "N"},
    {"precision", 0, 0, G_OPTION_ARG_STRING, &opt_precision,
     "Matrix products in fp32 (default) or bf16 (operands rounded to bfloat16, float32 sums, as "
     "PyTorch's autocast), in training and sampling",
     "NAME"},
    {"data", 0, 0, G_OPTION_ARG_FILENAME, &opt_data, "The tab-separated pairs (fra.txt.gz)",
     "FILE"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

/* FALSE with a message naming the option when a value is outside its range */
static gboolean
check_options(GError **error)
{
  const OptionRange ranges[] = {
      OPTION_INT("steps", &opt_steps, 0, 1000000),
      OPTION_INT("threads", &opt_threads, 0, MIN(options_max_threads(), 256)),
      OPTION_INT("length", &opt_length, 1, 100000),
      OPTION_DOUBLE("temperature", &opt_temperature, 0, 100),
      OPTION_INT("top-k", &opt_top_k, 0, 100000),
      OPTION_DOUBLE_OPEN("top-p", &opt_top_p, 0, 1, TRUE, FALSE),
      OPTION_INT64("seed", &opt_seed, 0, G_MAXINT64),
      OPTION_INT("d-model", &opt_d_model, 4, 4096),
      OPTION_INT("layers", &opt_layers, 1, 64),
      OPTION_INT("heads", &opt_heads, 1, 4096),
      OPTION_INT("block", &opt_block, 2, 4096),
      OPTION_INT("batch", &opt_batch, 1, 4096),
      OPTION_DOUBLE_OPEN("lr", &opt_lr, 0, 1, TRUE, FALSE),
      OPTION_INT("warmup", &opt_warmup, 0, opt_steps > 0 ? opt_steps : 1000000),
      OPTION_DOUBLE("weight-decay", &opt_weight_decay, 0, 1),
      OPTION_DOUBLE_OPEN("clip", &opt_clip, 0, 1e6, TRUE, FALSE),
      OPTION_INT("eval-every", &opt_eval_every, 1, 1000000),
      OPTION_INT("max-lines", &opt_max_lines, 0, G_MAXINT),
  };
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), error))
    return FALSE;
  if (opt_d_model % opt_heads != 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heads %d does not divide --d-model %d", opt_heads, opt_d_model);
    return FALSE;
  }
  if (!options_check_choice("precision", opt_precision, "fp32", "bf16", error) ||
      !options_check_choice("save-dtype", opt_save_dtype, "f32", "bf16", error))
    return FALSE;
  if (opt_save_dtype != NULL && opt_save == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--save-dtype is the dtype of the file --save writes; give --save too");
    return FALSE;
  }
  if (opt_precision != NULL && g_str_equal(opt_precision, "bf16"))
    precision = QKV_PRECISION_BF16;
  if (opt_save_dtype != NULL && g_str_equal(opt_save_dtype, "bf16"))
    save_dtype = QKV_CHECKPOINT_DTYPE_BF16;
  if (opt_load == NULL && opt_steps == 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--steps 0 without --load would sample from an untrained model");
    return FALSE;
  }
  return TRUE;
}

static gint64
metadata_int(GHashTable *metadata, const gchar *key, gint64 lo, gint64 hi, GError **error)
{
  const gchar *s = g_hash_table_lookup(metadata, key);
  gint64 v = 0;
  if (s == NULL || !g_ascii_string_to_signed(s, 10, lo, hi, &v, NULL))
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: metadata \"%s\" is missing or not in [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                "]",
                opt_load, key, lo, hi);
  return v;
}

/* The model sizes and vocabulary of the checkpoint --load names. */
static gboolean
read_model(GptConfig *cfg, GptCorpus *corpus, GError **error)
{
  g_autoptr(GHashTable) md = qkv_checkpoint_read_metadata(opt_load, error);
  if (md == NULL)
    return FALSE;
  GError *e = NULL;
  cfg->block = metadata_int(md, "block", 2, 4096, &e);
  cfg->d_model = e ? 0 : metadata_int(md, "d_model", 4, 4096, &e);
  cfg->layers = e ? 0 : (gint)metadata_int(md, "layers", 1, 64, &e);
  cfg->heads = e ? 0 : (gint)metadata_int(md, "heads", 1, cfg->d_model, &e);
  const gchar *chars = g_hash_table_lookup(md, "vocab");
  if (e == NULL && chars == NULL)
    g_set_error(&e, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: no \"vocab\" metadata", opt_load);
  if (e != NULL || !gpt_vocab_set(corpus, chars, &e)) {
    g_propagate_error(error, e);
    return FALSE;
  }
  cfg->vocab = corpus->vocab;
  return TRUE;
}

static gboolean
save_model(QkvParams *params, const GptConfig *cfg, const GptCorpus *corpus, GError **error)
{
  g_autoptr(GHashTable) md = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
  g_hash_table_insert(md, "vocab", g_strdup(corpus->chars));
  g_hash_table_insert(md, "block", g_strdup_printf("%" G_GINT64_FORMAT, cfg->block));
  g_hash_table_insert(md, "d_model", g_strdup_printf("%" G_GINT64_FORMAT, cfg->d_model));
  g_hash_table_insert(md, "layers", g_strdup_printf("%d", cfg->layers));
  g_hash_table_insert(md, "heads", g_strdup_printf("%d", cfg->heads));
  return qkv_checkpoint_save_full(opt_save, params, NULL, NULL, md, save_dtype, error);
}

/* Creates the parameters (initialised from the seed), or reads them from
 * --load: a throwaway graph builds them in the store. */
static gboolean
make_params(QkvParams *params, const GptConfig *cfg, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = (guint64)opt_seed, .inits = &gpt_inits};
  QkvShape one = QKV_SHAPE(1, cfg->block);
  if (gpt_logits(&b, cfg, qkv_graph_input(g, "x", QKV_I32, &one, error), error) == NULL)
    return FALSE;
  return opt_load == NULL || qkv_checkpoint_load(opt_load, params, NULL, NULL,
                                                 QKV_CHECKPOINT_STRICT, NULL, NULL, error);
}

static gboolean
sample(QkvParams *params, const GptConfig *cfg, const GptCorpus *corpus, GError **error)
{
  /* the context starts as a line does, after a '\n' */
  g_autofree gchar *text = g_strconcat("\n", opt_prompt ? opt_prompt : "", NULL);
  gint n_prompt = 0;
  g_autofree gint32 *prompt = gpt_encode(corpus, text, &n_prompt, error);
  g_autofree gint32 *out = g_new(gint32, opt_length);
  QkvSampleOptions so = qkv_sample_options_default();
  so.temperature = opt_temperature;
  so.top_k = opt_top_k;
  so.top_p = opt_top_p;
  so.seed = (guint64)opt_seed;
  if (prompt == NULL) { /* a bad --prompt is a bad option value */
    g_prefix_error(error, "--prompt: ");
    (*error)->domain = G_OPTION_ERROR;
    (*error)->code = G_OPTION_ERROR_BAD_VALUE;
    return FALSE;
  }
  gint n_out = 0;
  if (!gpt_generate(params, cfg, prompt, n_prompt, opt_length, &so, precision, out, &n_out, error))
    return FALSE;
  g_autofree gchar *continuation = gpt_decode(corpus, out, n_out);
  printf("--- sample (temperature %g, top-k %d, top-p %g, seed %" G_GINT64_FORMAT ") ---\n%s%s\n",
         opt_temperature, opt_top_k, opt_top_p, opt_seed, opt_prompt ? opt_prompt : "",
         continuation);
  return TRUE;
}

static gboolean
run(GError **error)
{
  GptConfig cfg = {0, opt_block, opt_d_model, opt_layers, opt_heads};
  GptCorpus corpus = {0};
  gboolean ok = FALSE;
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autofree gchar *path =
      opt_data ? g_strdup(opt_data) : text_fra_eng_path(QKV_DATA_DIR, QKV_SOURCE_DATA_DIR);
  if (opt_load != NULL && !read_model(&cfg, &corpus, error))
    goto out;
  if (opt_steps > 0 && !gpt_corpus_load(&corpus, path, opt_max_lines, 0.05, error))
    goto out;
  cfg.vocab = corpus.vocab;
  if (opt_steps > 0 && MIN(corpus.train.n, corpus.val.n) <= cfg.block) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "the text (%" G_GINT64_FORMAT " training, %" G_GINT64_FORMAT
                " held-out characters) is too short for --block %" G_GINT64_FORMAT,
                corpus.train.n, corpus.val.n, cfg.block);
    goto out;
  }
  if (!make_params(params, &cfg, error))
    goto out;
  printf("%" G_GINT64_FORMAT " characters, block %" G_GINT64_FORMAT ", d_model %" G_GINT64_FORMAT
         ", %d layers, %d heads: %" G_GINT64_FORMAT " parameters\n",
         cfg.vocab, cfg.block, cfg.d_model, cfg.layers, cfg.heads, qkv_params_numel(params));
  if (opt_steps > 0) {
    printf("%" G_GINT64_FORMAT " training and %" G_GINT64_FORMAT " held-out characters\n",
           corpus.train.n, corpus.val.n);
    GptTrainOptions train = {.steps = opt_steps,
                             .warmup = opt_warmup,
                             .batch = opt_batch,
                             .eval_every = opt_eval_every,
                             .lr = opt_lr,
                             .weight_decay = opt_weight_decay,
                             .clip = opt_clip,
                             .seed = (guint64)opt_seed,
                             .precision = precision};
    if (!gpt_train(params, &cfg, &corpus, &train, error))
      goto out;
  }
  if (opt_save != NULL && !save_model(params, &cfg, &corpus, error))
    goto out;
  ok = sample(params, &cfg, &corpus, error);
out:
  gpt_corpus_clear(&corpus);
  return ok;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context = g_option_context_new("- a character-level GPT");
  g_option_context_add_main_entries(context, entries, NULL);
  if (!g_option_context_parse(context, &argc, &argv, &error)) {
    fprintf(stderr, "qkv-gpt: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-gpt");
    return 0;
  }
  if (!check_options(&error)) {
    fprintf(stderr, "qkv-gpt: %s\n", error->message);
    return 2;
  }
  if (argc > 1) {
    fprintf(stderr, "qkv-gpt: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  if (opt_threads > 0)
    qkv_set_num_threads(opt_threads);
  if (!run(&error)) {
    fprintf(stderr, "qkv-gpt: %s\n", error->message);
    return error->domain == G_OPTION_ERROR ? 2 : 1;
  }
  return 0;
}
