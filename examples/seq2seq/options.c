/* options.c: qkv-seq2seq's options (options.h). */
#include "options.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>

#include "../common/options.h"
#include "../common/spm.h"
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
      .valid_every = 1,
      .min_freq = 2,
      .spm_vocab_size = 4000,
  };
}

/* The numeric options are read as text and parsed by the shared checker
 * (../common/options.h) rather than by GOption, so that a refusal quotes the
 * text as given: every value is parsed in full and checked against its
 * range, so nonsense stops the program before any work. The upper limits
 * are far beyond the book's settings; they keep a typo from asking for
 * terabytes. */
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
  O_VALID,
  O_VALID_EVERY,
  O_EARLY_STOP,
  O_MIN_FREQ,
  O_MAX_LEN,
  O_SPM_VOCAB_SIZE,
  O_HEATMAP_BLOCK,
  O_LR,
  O_DROPOUT,
  O_CLIP,
  O_LENGTH_PENALTY,
  O_LABEL_SMOOTHING,
  N_NUMERIC_OPTIONS
};

/* The texts GOption fills (NULL: not given), and their ranges. */
typedef struct {
  gchar *texts[N_NUMERIC_OPTIONS];
  OptionRange ranges[N_NUMERIC_OPTIONS];
  gchar *threads_why;
} NumericOptions;

#define INT_RANGE(i, name, field, lo, hi)                                                          \
  [i] = {name, OPTION_RANGE_INT, &o->field, lo, hi, 0, 0, FALSE, FALSE, &num->texts[i], NULL}
#define DOUBLE_RANGE(i, name, field, lo, hi, lo_open, hi_open)                                     \
  [i] = {name, OPTION_RANGE_DOUBLE, &o->field, 0, 0, lo, hi, lo_open, hi_open, &num->texts[i], NULL}

static void
numeric_options_init(NumericOptions *num, Seq2seqOptions *o)
{
  *num = (NumericOptions){
      .ranges = {
          INT_RANGE(O_EPOCHS, "epochs", epochs, 0, 1000000),
          INT_RANGE(O_NUM_EXAMPLES, "num-examples", num_examples, 1, SEQ2SEQ_MAX_EXAMPLES),
          INT_RANGE(O_BATCH, "batch-size", batch, 1, 1000000),
          INT_RANGE(O_STEPS, "num-steps", steps, 2, SEQ2SEQ_MAX_STEPS),
          INT_RANGE(O_HIDDEN, "hidden", hidden, 1, 8192),
          INT_RANGE(O_LAYERS, "layers", layers, 1, 64),
          INT_RANGE(O_HEADS, "heads", heads, 1, 8192),
          INT_RANGE(O_FFN, "ffn", ffn, 1, 65536),
          INT_RANGE(O_THREADS, "threads", threads, 1, options_max_threads()),
          INT_RANGE(O_REVERSE_VOCAB, "reverse-vocab", reverse_vocab, 4, SEQ2SEQ_MAX_REVERSE_VOCAB),
          INT_RANGE(O_REVERSE_SIZE, "reverse-size", reverse_size, 1, SEQ2SEQ_MAX_EXAMPLES),
          INT_RANGE(O_BEAM, "beam", beam, 1, 64),
          INT_RANGE(O_SAVE_EVERY, "save-every", save_every, 1, 1000000),
          INT_RANGE(O_ACCUMULATE, "accumulate", accumulate, 1, 1000000),
          INT_RANGE(O_WARMUP, "warmup", warmup, 0, 100000000),
          INT_RANGE(O_HELDOUT, "heldout", heldout, 0, 100000),
          INT_RANGE(O_VALID, "valid", valid, 1, 100000),
          INT_RANGE(O_VALID_EVERY, "valid-every", valid_every, 1, 1000000),
          INT_RANGE(O_EARLY_STOP, "early-stop", early_stop, 1, 1000000),
          INT_RANGE(O_MIN_FREQ, "min-freq", min_freq, 1, 1000000),
          INT_RANGE(O_MAX_LEN, "max-len", max_len, 1, 1000000),
          INT_RANGE(O_SPM_VOCAB_SIZE, "spm-vocab-size", spm_vocab_size, 5, 1000000),
          INT_RANGE(O_HEATMAP_BLOCK, "heatmap-block", heatmap_block, 1, 64),
          DOUBLE_RANGE(O_LR, "lr", lr, 0, 10, TRUE, FALSE),
          DOUBLE_RANGE(O_DROPOUT, "dropout", dropout, 0, 1, FALSE, TRUE),
          DOUBLE_RANGE(O_CLIP, "clip", clip, 0, 1e30, FALSE, FALSE),
          DOUBLE_RANGE(O_LENGTH_PENALTY, "length-penalty", length_penalty, 0, 100, FALSE, FALSE),
          DOUBLE_RANGE(O_LABEL_SMOOTHING, "label-smoothing", label_smoothing, 0, 1, FALSE, FALSE),
      }};
  num->threads_why = g_strdup_printf("(4 times the %u processors here)", g_get_num_processors());
  num->ranges[O_THREADS].why = num->threads_why;
}

static void
numeric_options_clear(NumericOptions *num)
{
  for (guint i = 0; i < N_NUMERIC_OPTIONS; i++)
    g_free(num->texts[i]);
  g_free(num->threads_why);
}

#define INT_ARG(i) G_OPTION_ARG_STRING, &num->texts[i]
#define DOUBLE_ARG(i) G_OPTION_ARG_STRING, &num->texts[i]

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
       "fra.txt or fra.txt.gz to read: tab-separated pairs, English first, further columns "
       "(Tatoeba's attribution) ignored (default: the copy shipped with qkv)",
       "FILE"},
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
      {"save-dtype", 0, 0, G_OPTION_ARG_STRING, &o->save_dtype_name,
       "f32 (default) or bf16: the parameters' dtype in the files --save and --save-best write; "
       "bf16 rounds them to nearest even and halves their size (the optimizer state stays f32)",
       "DTYPE"},
      {"resume", 0, 0, G_OPTION_ARG_FILENAME, &o->resume,
       "Start from a checkpoint written by --save (training continues up to --epochs)", "FILE"},
      {"translate", 0, 0, G_OPTION_ARG_STRING_ARRAY, &o->translate,
       "Translate SENTENCE (may be repeated) instead of the book's four sentences; - reads one "
       "sentence per line from standard input and writes one translation per line to standard "
       "output",
       "SENTENCE"},
      {"heatmap", 0, 0, G_OPTION_ARG_FILENAME, &o->heatmap,
       "Draw the encoder-decoder attention weights of a translated sentence (the first, or "
       "--heatmap-sentence), per head, with a colour scale, to FILE.png",
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

/* Watching a run, validation and one's own data; free with g_free(). */
static GOptionEntry *
watch_entries_new(Seq2seqOptions *o, NumericOptions *num)
{
  GOptionEntry table[] = {
      {"log", 0, 0, G_OPTION_ARG_FILENAME, &o->log,
       "Write one JSON object per training step and per epoch (epoch, step, lr, loss, grad norm, "
       "tokens/s, elapsed time, validation loss and BLEU when measured) to FILE",
       "FILE.jsonl"},
      {"plot", 0, 0, G_OPTION_ARG_FILENAME, &o->plot,
       "Draw the training and validation loss curves and the learning rate to FILE (PNG), "
       "during training and after it",
       "FILE.png"},
      {"valid", 0, 0, INT_ARG(O_VALID),
       "Hold out N sentence pairs (the lines after the training ones, or the first N of "
       "--valid-data) and measure the loss and BLEU on them every --valid-every epochs",
       "N"},
      {"valid-data", 0, 0, G_OPTION_ARG_FILENAME, &o->valid_data,
       "Validate on the sentence pairs of FILE (all of them, or the first --valid)", "FILE"},
      {"valid-every", 0, 0, INT_ARG(O_VALID_EVERY), "Validate every K epochs (default 1)", "K"},
      {"save-best", 0, 0, G_OPTION_ARG_FILENAME, &o->save_best,
       "Save the model to FILE whenever the validation loss is the lowest so far", "FILE"},
      {"early-stop", 0, 0, INT_ARG(O_EARLY_STOP),
       "Stop training after P validations in a row without a lower validation loss", "P"},
      {"test-data", 0, 0, G_OPTION_ARG_FILENAME, &o->test_data,
       "Score the held-out BLEU on the first --heldout pairs of FILE instead of the lines after "
       "the training (and validation) ones",
       "FILE"},
      {"min-freq", 0, 0, INT_ARG(O_MIN_FREQ),
       "Words seen fewer times in the training pairs are <unk> (default 2, the book's)", "N"},
      {"max-len", 0, 0, INT_ARG(O_MAX_LEN),
       "Skip training pairs with more than N words on either side (default: keep all; "
       "--num-steps still cuts what is kept)",
       "N"},
      {"vocab", 0, 0, G_OPTION_ARG_STRING, &o->vocab_name,
       "word (default: the book's word vocabularies) or sentencepiece (subword pieces of one "
       "SentencePiece model for both languages)",
       "KIND"},
      {"spm-vocab-size", 0, 0, INT_ARG(O_SPM_VOCAB_SIZE),
       "Pieces of the SentencePiece model trained on the training pairs, at most (default 4000; "
       "4 are <unk> <pad> <bos> <eos>)",
       "N"},
      {"spm-type", 0, 0, G_OPTION_ARG_STRING, &o->spm_type,
       "The SentencePiece model trained: unigram (default) or bpe", "TYPE"},
      {"spm-model", 0, 0, G_OPTION_ARG_FILENAME, &o->spm_model,
       "Split with this SentencePiece model instead of training one", "FILE"},
      {"spm-save", 0, 0, G_OPTION_ARG_FILENAME, &o->spm_save,
       "Save the SentencePiece model trained to FILE (default: --save's FILE.spm.model; "
       "checkpoints hold it too)",
       "FILE"},
      {"heatmap-sentence", 0, 0, G_OPTION_ARG_STRING, &o->heatmap_sentence,
       "Draw the attention of these translated sentences, counted from 1 (default 1; up to 8, "
       "comma-separated: one row of panels each)",
       "N[,N...]"},
      {"heatmap-block", 0, 0, INT_ARG(O_HEATMAP_BLOCK),
       "Draw the encoder-decoder attention of Transformer block B, from 1 (default: the last)",
       "B"},
      {"version", 'V', 0, G_OPTION_ARG_NONE, &o->version, "Print the version and exit", NULL},
      {NULL}};
  return g_memdup2(table, sizeof table);
}

/* The groups --help-all shows (--help-NAME one of them); an option of none
 * of them stays in the main group. */
static const gchar *const model_group[] = {"model",         "score",   "local-m",        "local-p",
                                           "input-feeding", "hidden",  "layers",         "heads",
                                           "ffn",           "dropout", "tie-embeddings", NULL};
static const gchar *const training_group[] = {
    "epochs",      "batch-size", "lr",          "clip",    "clip-rule", "label-smoothing",
    "warmup",      "accumulate", "seed",        "threads", "log",       "plot",
    "valid-every", "early-stop", "step-losses", NULL};
static const gchar *const data_group[] = {
    "task",  "data",           "num-examples", "num-steps", "min-freq",      "max-len",
    "valid", "valid-data",     "test-data",    "heldout",   "reverse-vocab", "reverse-size",
    "vocab", "spm-vocab-size", "spm-type",     "spm-model", "spm-save",      NULL};
static const gchar *const decoding_group[] = {
    "translate", "beam", "length-penalty", "heatmap", "heatmap-sentence", "heatmap-block", NULL};
static const gchar *const checkpoint_group[] = {"save",       "save-dtype", "resume",
                                                "save-every", "save-best",  NULL};
static const gchar *const distribution_group[] = {"distributed", NULL};

static const struct {
  const gchar *name, *description, *help;
  const gchar *const *members;
} option_groups[] = {
    {"model", "Model options:", "Show the model options", model_group},
    {"training", "Training options:", "Show the training options", training_group},
    {"data", "Data options:", "Show the data options", data_group},
    {"decoding", "Decoding options:", "Show the decoding options", decoding_group},
    {"checkpoints", "Checkpoint options:", "Show the checkpoint options", checkpoint_group},
    {"distribution", "Distribution options:", "Show the distribution options", distribution_group},
};

/* Hand every entry of entries (NULL-terminated) to its group in context;
 * the others become the main entries. */
static void
add_grouped_entries(GOptionContext *context, const GOptionEntry *entries)
{
  gsize n = 0;
  while (entries[n].long_name != NULL)
    n++;
  g_autofree GOptionEntry *main_entries = g_new0(GOptionEntry, n + 1);
  g_autofree gboolean *taken = g_new0(gboolean, n);
  for (guint g = 0; g < G_N_ELEMENTS(option_groups); g++) {
    g_autofree GOptionEntry *members = g_new0(GOptionEntry, n + 1);
    gsize k = 0;
    for (gsize i = 0; i < n; i++)
      if (g_strv_contains((const gchar *const *)option_groups[g].members, entries[i].long_name)) {
        members[k++] = entries[i];
        taken[i] = TRUE;
      }
    GOptionGroup *group = g_option_group_new(option_groups[g].name, option_groups[g].description,
                                             option_groups[g].help, NULL, NULL);
    g_option_group_add_entries(group, members);
    g_option_context_add_group(context, group);
  }
  gsize k = 0;
  for (gsize i = 0; i < n; i++)
    if (!taken[i])
      main_entries[k++] = entries[i];
  g_option_context_add_main_entries(context, main_entries, NULL);
}

/* The main table and watch_entries_new's, in one; free with g_free(). */
static GOptionEntry *
all_entries_new(Seq2seqOptions *o, NumericOptions *num)
{
  g_autofree GOptionEntry *first = option_entries_new(o, num);
  g_autofree GOptionEntry *watch = watch_entries_new(o, num);
  gsize a = 0, b = 0;
  while (first[a].long_name != NULL)
    a++;
  while (watch[b].long_name != NULL)
    b++;
  GOptionEntry *all = g_new0(GOptionEntry, a + b + 1);
  memcpy(all, first, a * sizeof *all);
  memcpy(all + a, watch, b * sizeof *all);
  return all;
}

gboolean
seq2seq_options_validating(const Seq2seqOptions *o)
{
  return o->valid > 0 || o->valid_data != NULL;
}

/* --heatmap-sentence: "N[,N...]", each from 1. */
static gboolean
parse_heatmap_sentences(Seq2seqOptions *o, GError **error)
{
  o->n_heatmap_rows = 1;
  o->heatmap_rows[0] = 1;
  if (o->heatmap_sentence == NULL)
    return TRUE;
  g_auto(GStrv) parts = g_strsplit(o->heatmap_sentence, ",", -1);
  guint n = g_strv_length(parts);
  for (guint i = 0; i < n; i++) {
    gint64 v = 0;
    if (n > SEQ2SEQ_MAX_HEATMAPS || !g_ascii_string_to_signed(parts[i], 10, 1, 10000, &v, NULL)) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "--heatmap-sentence takes 1 to %d sentence numbers from 1, comma-separated, "
                  "not '%s'",
                  SEQ2SEQ_MAX_HEATMAPS, o->heatmap_sentence);
      return FALSE;
    }
    o->heatmap_rows[i] = (gint)v;
  }
  o->n_heatmap_rows = (gint)n;
  return TRUE;
}

/* A usage error naming what is wrong. */
static gboolean
refuse(GError **error, const gchar *message)
{
  g_set_error_literal(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, message);
  return FALSE;
}

/* The checks between the watch options and the others. */
static gboolean
check_watch_options(Seq2seqOptions *o, GError **error)
{
  gboolean validating = seq2seq_options_validating(o);
  if (!parse_heatmap_sentences(o, error))
    return FALSE;
  if (o->translate != NULL && g_strv_contains((const gchar *const *)o->translate, "-")) {
    if (g_strv_length(o->translate) > 1)
      return refuse(error, "--translate - reads the sentences from standard input; give no "
                           "other --translate");
    if (o->heatmap != NULL)
      return refuse(error, "--heatmap draws sentences of --translate SENTENCE or the book's, "
                           "not of --translate -");
    o->translate_stdin = TRUE;
  }
  if ((o->save_best != NULL || o->early_stop > 0 || o->valid_every != 1) && !validating)
    return refuse(error, "--save-best, --early-stop and --valid-every act on validation; give "
                         "--valid N or --valid-data FILE");
  if (o->early_stop > 0 && o->distributed)
    return refuse(error, "--early-stop would have every process agree when to stop; it is not "
                         "available with --distributed");
  if (o->reverse && (o->valid_data != NULL || o->test_data != NULL))
    return refuse(error, "--valid-data and --test-data hold sentence pairs; --task reverse "
                         "makes its own sequences (use --valid N)");
  if (o->test_data != NULL && o->heldout == 0)
    return refuse(error, "--test-data is scored on --heldout pairs; --heldout is 0");
  if ((o->heatmap_sentence != NULL || o->heatmap_block > 0) && o->heatmap == NULL)
    return refuse(error, "--heatmap-sentence and --heatmap-block choose what --heatmap draws; "
                         "give --heatmap FILE");
  /* the sentences translated after training: --translate's or the book's four */
  gint translated = o->translate != NULL ? (gint)g_strv_length(o->translate) : o->reverse ? 0 : 4;
  for (gint k = 0; o->heatmap != NULL && k < o->n_heatmap_rows; k++)
    if (o->heatmap_rows[k] > translated) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "--heatmap-sentence %d: %d sentences are translated", o->heatmap_rows[k],
                  translated);
      return FALSE;
    }
  if (o->heatmap_block > 0 && o->kind != MODEL_TRANSFORMER)
    return refuse(error, "--heatmap-block chooses a Transformer block; the GRU models have one "
                         "attention");
  if (o->heatmap_block > o->layers) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heatmap-block %d: the model has %d blocks (--layers)", o->heatmap_block,
                o->layers);
    return FALSE;
  }
  return TRUE;
}

/* --vocab and the SentencePiece options: known values, a build that has
 * SentencePiece, and options that apply. */
static gboolean
check_subword_options(Seq2seqOptions *o, gboolean spm_vocab_size_given, gboolean reverse,
                      GError **error)
{
  if (!options_check_choice("vocab", o->vocab_name, "word", "sentencepiece", error))
    return FALSE;
  o->subwords = o->vocab_name != NULL && g_str_equal(o->vocab_name, "sentencepiece");
  const gchar *spm_option = spm_vocab_size_given ? "--spm-vocab-size"
                            : o->spm_type        ? "--spm-type"
                            : o->spm_model       ? "--spm-model"
                            : o->spm_save        ? "--spm-save"
                                                 : NULL;
  if (!o->subwords && spm_option != NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "%s applies to --vocab sentencepiece only", spm_option);
    return FALSE;
  }
  if (!o->subwords)
    return TRUE;
  if (!spm_available()) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--vocab sentencepiece: this qkv-seq2seq was built without SentencePiece "
                "(install libsentencepiece-dev and build with -Dsentencepiece=enabled)");
    return FALSE;
  }
  if (reverse) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--vocab sentencepiece splits sentences; --task reverse has numbered tokens, "
                "not text");
    return FALSE;
  }
  if (!options_check_choice("spm-type", o->spm_type, "unigram", "bpe", error))
    return FALSE;
  if (o->spm_model != NULL && (spm_vocab_size_given || o->spm_type || o->spm_save)) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--spm-model loads a SentencePiece model; %s are for training one",
                "--spm-vocab-size, --spm-type and --spm-save");
    return FALSE;
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
  if (!options_check_choice("precision", o->precision_name, "fp32", "bf16", error))
    return FALSE;
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
  if (!options_check_choice("clip-rule", o->clip_rule, "torch", "d2l", error))
    return FALSE;
  if (!options_check_choice("save-dtype", o->save_dtype_name, "f32", "bf16", error))
    return FALSE;
  o->save_dtype = o->save_dtype_name != NULL && g_str_equal(o->save_dtype_name, "bf16")
                      ? QKV_CHECKPOINT_DTYPE_BF16
                      : QKV_CHECKPOINT_DTYPE_F32;
  if (o->save_dtype_name != NULL && o->save == NULL && o->save_best == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--save-dtype is the dtype of the file --save or --save-best writes; give one");
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
         (o->heatmap == NULL || check_writable("--heatmap", o->heatmap, error)) &&
         (o->plot == NULL || check_writable("--plot", o->plot, error)) &&
         (o->save_best == NULL || check_writable("--save-best", o->save_best, error)) &&
         (o->spm_save == NULL || check_writable("--spm-save", o->spm_save, error));
}

gboolean
seq2seq_options_parse(Seq2seqOptions *o, gint *argc, gchar ***argv, GError **error)
{
  NumericOptions num;
  numeric_options_init(&num, o);
  g_autofree GOptionEntry *entries = all_entries_new(o, &num);
  g_autoptr(GOptionContext) context = g_option_context_new(
      "- train a seq2seq model of Dive into Deep Learning (ch. 10) and translate");
  g_option_context_set_summary(
      context, "Default: the book's Transformer on 600 English-French pairs (d_model 32, 2 "
               "blocks, 4 heads,\nFFN 64, dropout 0.1, batch 64, Adam lr 0.005, clipping at 1, "
               "200 epochs, Xavier init),\nthen the book's four test sentences with BLEU.");
  g_option_context_set_description(context,
                                   "--help-all lists every option; --help-model, --help-training, "
                                   "--help-data, --help-decoding,\n--help-checkpoints and "
                                   "--help-distribution list one group each.\n");
  add_grouped_entries(context, entries);
  gboolean ok = g_option_context_parse(context, argc, argv, error) &&
                options_check_ranges(num.ranges, N_NUMERIC_OPTIONS, error) &&
                check_options(o, error) &&
                check_subword_options(o, num.texts[O_SPM_VOCAB_SIZE] != NULL, o->reverse, error) &&
                check_watch_options(o, error);
  if (ok && num.texts[O_EPOCHS] == NULL)
    o->epochs = o->kind == MODEL_TRANSFORMER ? 200 : 250;
  /* a filter from a checkpoint translates with it as it is */
  if (ok && num.texts[O_EPOCHS] == NULL && o->translate_stdin && o->resume != NULL)
    o->epochs = 0;
  numeric_options_clear(&num);
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
  g_clear_pointer(&o->save_dtype_name, g_free);
  luong_options_clear(&o->luong);
  g_clear_pointer(&o->log, g_free);
  g_clear_pointer(&o->plot, g_free);
  g_clear_pointer(&o->valid_data, g_free);
  g_clear_pointer(&o->save_best, g_free);
  g_clear_pointer(&o->test_data, g_free);
  g_clear_pointer(&o->heatmap_sentence, g_free);
  g_clear_pointer(&o->vocab_name, g_free);
  g_clear_pointer(&o->spm_type, g_free);
  g_clear_pointer(&o->spm_model, g_free);
  g_clear_pointer(&o->spm_save, g_free);
}
