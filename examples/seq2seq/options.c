/* options.c: qkv-seq2seq's options (options.h). */
#include "options.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <glib/gstdio.h>

#include "data.h"

void
seq2seq_options_init(Seq2seqOptions *o)
{
  *o = (Seq2seqOptions){
      .num_examples = 600,
      .batch = 64,
      .steps = 10,
      .lr = 0.005,
      .dropout = 0.1,
      .hidden = 32,
      .layers = 2,
      .heads = 4,
      .ffn = 64,
      .clip = 1.0,
      .reverse_vocab = 200,
      .reverse_size = 2000,
      .beam = 1,
      .length_penalty = 0.6,
      .accumulate = 1,
      .heldout = 1000,
  };
}

/* The numeric options are read as text and parsed by parse_numeric_options
 * rather than by GOption, which takes "nan" for a double and knows no ranges:
 * every value is parsed in full and checked against its range, so nonsense
 * stops the program before any work. The upper limits are far beyond the
 * book's settings; they keep a typo from asking for terabytes. */
typedef struct {
  const gchar *name;
  gint *value;
  gint64 min, max; /* max 0: worked out when parsed (--threads) */
  gchar *text;     /* as given, or NULL */
} IntOption;

enum {
  O_EPOCHS,
  O_NUM_EXAMPLES,
  O_BATCH,
  O_STEPS,
  O_HIDDEN,
  O_LAYERS,
  O_HEADS,
  O_FFN,
  O_THREADS,
  O_REVERSE_VOCAB,
  O_REVERSE_SIZE,
  O_BEAM,
  O_SAVE_EVERY,
  O_ACCUMULATE,
  O_WARMUP,
  O_HELDOUT,
  N_INT_OPTIONS
};

typedef struct {
  const gchar *name;
  double *value;
  double min, max;
  gboolean min_open, max_open; /* whether the bound itself is excluded */
  gchar *text;
} DoubleOption;

enum { O_LR, O_DROPOUT, O_CLIP, O_LENGTH_PENALTY, O_LABEL_SMOOTHING, N_DOUBLE_OPTIONS };

/* The texts GOption fills, and where each parsed value goes. */
typedef struct {
  IntOption ints[N_INT_OPTIONS];
  DoubleOption doubles[N_DOUBLE_OPTIONS];
} NumericOptions;

static NumericOptions
numeric_options(Seq2seqOptions *o)
{
  return (NumericOptions){
      .ints =
          {
              [O_EPOCHS] = {"epochs", &o->epochs, 0, 1000000, NULL},
              [O_NUM_EXAMPLES] = {"num-examples", &o->num_examples, 1, SEQ2SEQ_MAX_EXAMPLES, NULL},
              [O_BATCH] = {"batch-size", &o->batch, 1, 1000000, NULL},
              [O_STEPS] = {"num-steps", &o->steps, 2, SEQ2SEQ_MAX_STEPS, NULL},
              [O_HIDDEN] = {"hidden", &o->hidden, 1, 8192, NULL},
              [O_LAYERS] = {"layers", &o->layers, 1, 64, NULL},
              [O_HEADS] = {"heads", &o->heads, 1, 8192, NULL},
              [O_FFN] = {"ffn", &o->ffn, 1, 65536, NULL},
              [O_THREADS] = {"threads", &o->threads, 1, 0, NULL},
              [O_REVERSE_VOCAB] = {"reverse-vocab", &o->reverse_vocab, 4, SEQ2SEQ_MAX_REVERSE_VOCAB,
                                   NULL},
              [O_REVERSE_SIZE] = {"reverse-size", &o->reverse_size, 1, SEQ2SEQ_MAX_EXAMPLES, NULL},
              [O_BEAM] = {"beam", &o->beam, 1, 64, NULL},
              [O_SAVE_EVERY] = {"save-every", &o->save_every, 1, 1000000, NULL},
              [O_ACCUMULATE] = {"accumulate", &o->accumulate, 1, 1000000, NULL},
              [O_WARMUP] = {"warmup", &o->warmup, 0, 100000000, NULL},
              [O_HELDOUT] = {"heldout", &o->heldout, 0, 100000, NULL},
          },
      .doubles = {
          [O_LR] = {"lr", &o->lr, 0, 10, TRUE, FALSE, NULL},
          [O_DROPOUT] = {"dropout", &o->dropout, 0, 1, FALSE, TRUE, NULL},
          [O_CLIP] = {"clip", &o->clip, 0, 1e30, FALSE, FALSE, NULL},
          [O_LENGTH_PENALTY] = {"length-penalty", &o->length_penalty, 0, 100, FALSE, FALSE, NULL},
          [O_LABEL_SMOOTHING] = {"label-smoothing", &o->label_smoothing, 0, 1, FALSE, FALSE, NULL},
      }};
}

#define INT_ARG(i) G_OPTION_ARG_STRING, &num->ints[i].text
#define DOUBLE_ARG(i) G_OPTION_ARG_STRING, &num->doubles[i].text

/* The option table, pointing into o and, for the numeric options, at the
 * texts that parse_numeric_options reads; free with g_free(). */
static GOptionEntry *
option_entries_new(Seq2seqOptions *o, NumericOptions *num)
{
  GOptionEntry table[] = {
      {"model", 'm', 0, G_OPTION_ARG_STRING, &o->model,
       "transformer (default), bahdanau (GRU encoder, additive-attention decoder) or luong (GRU "
       "encoder, Luong-attention decoder)",
       "NAME"},
      LUONG_OPTION_ENTRIES(&o->luong),
      {"task", 0, 0, G_OPTION_ARG_STRING, &o->task,
       "fra (default: the book's English-French pairs) or reverse (reverse random token "
       "sequences; needs no data)",
       "NAME"},
      {"data", 0, 0, G_OPTION_ARG_FILENAME, &o->data,
       "fra.txt or fra.txt.gz to read (default: the copy shipped with qkv)", "FILE"},
      {"epochs", 'e', 0, INT_ARG(O_EPOCHS),
       "Training epochs in all (default 200 for transformer, 250 for bahdanau and luong); with "
       "--resume, training continues up to this count",
       "N"},
      {"num-examples", 0, 0, INT_ARG(O_NUM_EXAMPLES),
       "Sentence pairs to read, as the book's num_examples (default 600; the book's loop keeps "
       "one more)",
       "N"},
      {"batch-size", 'b', 0, INT_ARG(O_BATCH), "Batch size (default 64)", "N"},
      {"num-steps", 0, 0, INT_ARG(O_STEPS),
       "Tokens per sequence after truncating or padding (default 10, at most 1024)", "N"},
      {"lr", 0, 0, DOUBLE_ARG(O_LR), "Adam learning rate (default 0.005)", "LR"},
      {"dropout", 0, 0, DOUBLE_ARG(O_DROPOUT), "Dropout probability, in [0, 1) (default 0.1)", "P"},
      {"hidden", 0, 0, INT_ARG(O_HIDDEN),
       "d_model of the Transformer, hidden and embedding size of the GRUs (default 32)", "N"},
      {"layers", 0, 0, INT_ARG(O_LAYERS), "Blocks or GRU layers (default 2)", "N"},
      {"heads", 0, 0, INT_ARG(O_HEADS), "Attention heads; must divide --hidden (default 4)", "N"},
      {"ffn", 0, 0, INT_ARG(O_FFN), "Hidden size of the position-wise FFN (default 64)", "N"},
      {"clip", 0, 0, DOUBLE_ARG(O_CLIP),
       "Clip gradients to this global L2 norm (default 1; 0 turns clipping off)", "NORM"},
      {"clip-rule", 0, 0, G_OPTION_ARG_STRING, &o->clip_rule,
       "torch (default: scale by NORM / (norm + 1e-6) when below 1, as clip_grad_norm_) or d2l "
       "(the book's grad_clipping: NORM / norm when norm > NORM)",
       "RULE"},
      {"label-smoothing", 0, 0, DOUBLE_ARG(O_LABEL_SMOOTHING),
       "Label smoothing epsilon of the training loss, in [0, 1] (default 0; the Transformer paper "
       "uses 0.1)",
       "EPS"},
      {"warmup", 0, 0, INT_ARG(O_WARMUP),
       "Warm the learning rate up over N steps to --lr, then decay it as 1/sqrt(step) (the "
       "Transformer paper's schedule, peaking at --lr; default 0: constant --lr)",
       "N"},
      {"heldout", 0, 0, INT_ARG(O_HELDOUT),
       "After training, score corpus BLEU-4 (greedy and beam 4) on the N sentence pairs after the "
       "training ones, which training never sees (default 1000; 0: none)",
       "N"},
      {"precision", 0, 0, G_OPTION_ARG_STRING, &o->precision_name,
       "fp32 (default) or bf16: every matrix product rounds its operands to bfloat16 and sums in "
       "float32, as PyTorch's autocast; weights, optimizer state and the other ops stay float32",
       "NAME"},
      {"threads", 't', 0, INT_ARG(O_THREADS),
       "Worker threads, at most 4 per processor (default: OpenMP's default, usually the number "
       "of cores)",
       "N"},
      {"seed", 's', 0, G_OPTION_ARG_INT64, &o->seed,
       "Seed for initial weights, shuffling and dropout (default 0)", "N"},
      {"save", 0, 0, G_OPTION_ARG_FILENAME, &o->save,
       "Save the model, optimizer state and vocabularies to FILE (safetensors) after training",
       "FILE"},
      {"resume", 0, 0, G_OPTION_ARG_FILENAME, &o->resume,
       "Start from a checkpoint written by --save (training continues up to --epochs)", "FILE"},
      {"translate", 0, 0, G_OPTION_ARG_STRING_ARRAY, &o->translate,
       "Translate SENTENCE (may be repeated) instead of the book's four sentences", "SENTENCE"},
      {"heatmap", 0, 0, G_OPTION_ARG_FILENAME, &o->heatmap,
       "Draw the encoder-decoder attention weights of the first translated sentence, per head, "
       "to FILE.png",
       "FILE"},
      {"reverse-vocab", 0, 0, INT_ARG(O_REVERSE_VOCAB),
       "Vocabulary size of --task reverse, at least 4 (default 200)", "N"},
      {"reverse-size", 0, 0, INT_ARG(O_REVERSE_SIZE),
       "Training sequences of --task reverse (default 2000)", "N"},
      {"beam", 0, 0, INT_ARG(O_BEAM),
       "Beam size of the translations (default 1: greedy decoding); the Transformer paper uses 4",
       "K"},
      {"length-penalty", 0, 0, DOUBLE_ARG(O_LENGTH_PENALTY),
       "alpha of beam search's length penalty ((5 + |Y|) / 6)^alpha (default 0.6)", "ALPHA"},
      {"tie-embeddings", 0, 0, G_OPTION_ARG_NONE, &o->tie,
       "Transformer: the output projection is the decoder's embedding matrix (and the encoder's "
       "too when source and target share one vocabulary, as in --task reverse); prints the "
       "parameter count with and without",
       NULL},
      {"quiet", 'q', 0, G_OPTION_ARG_NONE, &o->quiet, "Print only the final results", NULL},
      {"distributed", 0, 0, G_OPTION_ARG_NONE, &o->distributed,
       "Train data-parallel over MPI (start with mpirun -np N): each process takes its share of "
       "every --batch-size batch; rank 0 prints and saves",
       NULL},
      {"save-every", 0, 0, INT_ARG(O_SAVE_EVERY),
       "Also save to --save after every N epochs during training", "N"},
      {"step-losses", 0, 0, G_OPTION_ARG_FILENAME, &o->step_losses,
       "Write each training step's loss (the book's metric of its batch) to FILE, one per line",
       "FILE"},
      {"accumulate", 0, 0, INT_ARG(O_ACCUMULATE),
       "Run each batch as N micro-batches and sum their gradients before the step (less memory; "
       "the arithmetic of --distributed over N processes)",
       "N"},
      {NULL}};
  return g_memdup2(table, sizeof table);
}

/* More threads than this only adds overhead: --threads 10000 took 53.6 s and
 * 2.2 GB where 2 threads took 0.11 s. */
static gint
max_threads(void)
{
  return 4 * (gint)g_get_num_processors();
}

static gboolean
parse_numeric_options(const NumericOptions *num, GError **error)
{
  for (guint i = 0; i < N_INT_OPTIONS; i++) {
    const IntOption *o = &num->ints[i];
    if (o->text == NULL)
      continue;
    gint64 max = o->max > 0 ? o->max : max_threads(), n;
    if (!g_ascii_string_to_signed(o->text, 10, o->min, max, &n, NULL)) {
      g_autofree gchar *why =
          o->max > 0 ? g_strdup("")
                     : g_strdup_printf(" (4 times the %u processors here)", g_get_num_processors());
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "--%s must be an integer from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT
                  "%s, not '%s'",
                  o->name, o->min, max, why, o->text);
      return FALSE;
    }
    *o->value = (gint)n;
  }
  for (guint i = 0; i < N_DOUBLE_OPTIONS; i++) {
    const DoubleOption *o = &num->doubles[i];
    if (o->text == NULL)
      continue;
    gchar *end = NULL;
    double x = g_ascii_strtod(o->text, &end);
    gboolean ok = end != o->text && *end == '\0' && isfinite(x) &&
                  (o->min_open ? x > o->min : x >= o->min) &&
                  (o->max_open ? x < o->max : x <= o->max);
    if (!ok) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "--%s must be a number in %c%g, %g%c, not '%s'", o->name, o->min_open ? '(' : '[',
                  o->min, o->max, o->max_open ? ')' : ']', o->text);
      return FALSE;
    }
    *o->value = x;
  }
  return TRUE;
}

/* The checks between options, made before any work (each option's own
 * range is checked as it is parsed). */
static gboolean
check_options(Seq2seqOptions *o, GError **error)
{
  gboolean reverse = o->task != NULL && g_str_equal(o->task, "reverse");
  if (o->task != NULL && !reverse && !g_str_equal(o->task, "fra")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "unknown --task '%s'", o->task);
    return FALSE;
  }
  ModelKind kind = MODEL_TRANSFORMER;
  if (o->model != NULL && g_str_equal(o->model, "bahdanau"))
    kind = MODEL_BAHDANAU;
  else if (o->model != NULL && g_str_equal(o->model, "luong"))
    kind = MODEL_LUONG;
  else if (o->model != NULL && !g_str_equal(o->model, "transformer")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "unknown --model '%s'", o->model);
    return FALSE;
  }
  ModelConfig probe = {.kind = kind};
  if (!luong_options_apply(&o->luong, &probe, SEQ2SEQ_MAX_STEPS, error))
    return FALSE;
  if (o->tie && kind != MODEL_TRANSFORMER) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--tie-embeddings ties the Transformer's embeddings; --model %s has none to tie",
                o->model);
    return FALSE;
  }
  if (o->precision_name != NULL && !g_str_equal(o->precision_name, "fp32") &&
      !g_str_equal(o->precision_name, "bf16")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "unknown --precision '%s' (fp32 or bf16)", o->precision_name);
    return FALSE;
  }
  o->reverse = reverse;
  o->kind = kind;
  o->precision = o->precision_name != NULL && g_str_equal(o->precision_name, "bf16")
                     ? QKV_PRECISION_BF16
                     : QKV_PRECISION_FP32;
  if (kind == MODEL_TRANSFORMER && o->hidden % o->heads != 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heads %d does not divide --hidden %d (each head takes hidden / heads "
                "features)",
                o->heads, o->hidden);
    return FALSE;
  }
  if (reverse && (gint64)o->reverse_size * o->steps > SEQ2SEQ_MAX_IDS) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--reverse-size %d times --num-steps %d is over %" G_GINT64_FORMAT " tokens",
                o->reverse_size, o->steps, SEQ2SEQ_MAX_IDS);
    return FALSE;
  }
  if (o->accumulate > o->batch) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--accumulate %d splits each batch into %d micro-batches; a batch of %d rows "
                "cannot fill them (give a smaller --accumulate or a larger --batch-size)",
                o->accumulate, o->accumulate, o->batch);
    return FALSE;
  }
  if (o->clip_rule != NULL && !g_str_equal(o->clip_rule, "torch") &&
      !g_str_equal(o->clip_rule, "d2l")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "unknown --clip-rule '%s' (torch or d2l)", o->clip_rule);
    return FALSE;
  }
  if (o->save_every > 0 && o->save == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--save-every saves to the file --save names; give --save too");
    return FALSE;
  }
  if (o->heatmap != NULL && reverse && o->translate == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heatmap draws the first translated sentence, and --task reverse translates "
                "none without --translate");
    return FALSE;
  }
  return TRUE;
}

/* --save and --heatmap are written after training: a path that cannot be
 * written must stop the program before training, not lose the model after.
 * Creating and removing a file beside it is the test that cannot lie
 * (permissions, read-only mounts, a missing directory). */
static gboolean
check_writable(const gchar *option, const gchar *path, GError **error)
{
  if (g_file_test(path, G_FILE_TEST_IS_DIR)) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_ISDIR, "%s %s: is a directory", option, path);
    return FALSE;
  }
  if (g_file_test(path, G_FILE_TEST_EXISTS) && g_access(path, W_OK) != 0) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_ACCES, "%s %s: cannot write it: %s", option, path,
                g_strerror(errno));
    return FALSE;
  }
  g_autofree gchar *dir = g_path_get_dirname(path);
  g_autofree gchar *probe = g_build_filename(dir, ".qkv-seq2seq-XXXXXX", NULL);
  gint fd = g_mkstemp(probe);
  if (fd < 0) {
    int saved = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(saved),
                "%s %s: cannot create files in %s: %s", option, path, dir, g_strerror(saved));
    return FALSE;
  }
  close(fd);
  g_unlink(probe);
  return TRUE;
}

gboolean
seq2seq_options_check_paths(const Seq2seqOptions *o, GError **error)
{
  return (o->save == NULL || check_writable("--save", o->save, error)) &&
         (o->heatmap == NULL || check_writable("--heatmap", o->heatmap, error));
}

gboolean
seq2seq_options_parse(Seq2seqOptions *o, gint *argc, gchar ***argv, GError **error)
{
  NumericOptions num = numeric_options(o);
  g_autofree GOptionEntry *entries = option_entries_new(o, &num);
  g_autoptr(GOptionContext) context = g_option_context_new(
      "- train a seq2seq model of Dive into Deep Learning (ch. 10) and translate");
  g_option_context_set_summary(
      context, "Default: the book's Transformer on 600 English-French pairs (d_model 32, 2 "
               "blocks, 4 heads,\nFFN 64, dropout 0.1, batch 64, Adam lr 0.005, clipping at 1, "
               "200 epochs, Xavier init),\nthen the book's four test sentences with BLEU.");
  g_option_context_add_main_entries(context, entries, NULL);
  gboolean ok = g_option_context_parse(context, argc, argv, error) &&
                parse_numeric_options(&num, error) && check_options(o, error);
  if (ok && num.ints[O_EPOCHS].text == NULL)
    o->epochs = o->kind == MODEL_TRANSFORMER ? 200 : 250;
  for (guint i = 0; i < N_INT_OPTIONS; i++)
    g_free(num.ints[i].text);
  for (guint i = 0; i < N_DOUBLE_OPTIONS; i++)
    g_free(num.doubles[i].text);
  return ok;
}

void
seq2seq_options_clear(Seq2seqOptions *o)
{
  g_clear_pointer(&o->model, g_free);
  g_clear_pointer(&o->task, g_free);
  g_clear_pointer(&o->data, g_free);
  g_clear_pointer(&o->save, g_free);
  g_clear_pointer(&o->resume, g_free);
  g_clear_pointer(&o->translate, g_strfreev);
  g_clear_pointer(&o->heatmap, g_free);
  g_clear_pointer(&o->step_losses, g_free);
  g_clear_pointer(&o->clip_rule, g_free);
  g_clear_pointer(&o->precision_name, g_free);
  luong_options_clear(&o->luong);
}
