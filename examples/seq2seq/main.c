/* qkv-seq2seq: trains the Transformer (or the GRU + Bahdanau attention model)
 * of Dive into Deep Learning (0.17, chapter 10) on the book's English-French
 * pairs and translates, printing the book's loss metric and BLEU.
 *
 *   qkv-seq2seq                          the book's Transformer experiment
 *   qkv-seq2seq --model bahdanau         the book's GRU + attention experiment
 *   qkv-seq2seq --model luong --score general --local-p 2 --input-feeding
 *                                        the same GRUs with Luong attention
 *   qkv-seq2seq --task reverse           a synthetic task that needs no data
 *   qkv-seq2seq --save m.safetensors     then: --resume m.safetensors --translate "i'm home ."
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include <qkv/qkv.h>
#include <qkv/qkv-checkpoint.h>
#include <qkv/qkv-optim.h>

#include "../common/batch.h"
#include "../common/text.h"
#include "bleu.h"
#include "data.h"
#include "distributed.h"
#include "heatmap.h"
#include "heldout.h"
#include "luong-options.h"
#include "translate.h"
#include "tied.h"
#include "model.h"

static gchar *opt_model = NULL;
static gchar *opt_task = NULL;
static gchar *opt_data = NULL;
static gint opt_epochs = 0; /* until given: the model's default */
static gint opt_num_examples = 600;
static gint opt_batch = 64;
static gint opt_steps = 10;
static double opt_lr = 0.005;
static double opt_dropout = 0.1;
static gint opt_hidden = 32;
static gint opt_layers = 2;
static gint opt_heads = 4;
static gint opt_ffn = 64;
static double opt_clip = 1.0;
static gint opt_threads = 0; /* 0: the library's default */
static gint64 opt_seed = 0;
static gchar *opt_save = NULL;
static gchar *opt_resume = NULL;
static gchar **opt_translate = NULL;
static gchar *opt_heatmap = NULL;
static gint opt_reverse_vocab = 200;
static gint opt_reverse_size = 2000;
static gboolean opt_quiet = FALSE;
static gint opt_beam = 1;
static double opt_length_penalty = 0.6;
static gboolean opt_tie = FALSE;
static gboolean opt_distributed = FALSE;
static gint opt_save_every = 0;
static gchar *opt_step_losses = NULL;
static gint opt_accumulate = 1;
static double opt_label_smoothing = 0.0;
static gint opt_warmup = 0;
static gchar *opt_clip_rule = NULL;
static gint opt_heldout = 1000;

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

static IntOption int_options[N_INT_OPTIONS] = {
    [O_EPOCHS] = {"epochs", &opt_epochs, 0, 1000000, NULL},
    [O_NUM_EXAMPLES] = {"num-examples", &opt_num_examples, 1, SEQ2SEQ_MAX_EXAMPLES, NULL},
    [O_BATCH] = {"batch-size", &opt_batch, 1, 1000000, NULL},
    [O_STEPS] = {"num-steps", &opt_steps, 2, SEQ2SEQ_MAX_STEPS, NULL},
    [O_HIDDEN] = {"hidden", &opt_hidden, 1, 8192, NULL},
    [O_LAYERS] = {"layers", &opt_layers, 1, 64, NULL},
    [O_HEADS] = {"heads", &opt_heads, 1, 8192, NULL},
    [O_FFN] = {"ffn", &opt_ffn, 1, 65536, NULL},
    [O_THREADS] = {"threads", &opt_threads, 1, 0, NULL},
    [O_REVERSE_VOCAB] = {"reverse-vocab", &opt_reverse_vocab, 4, SEQ2SEQ_MAX_REVERSE_VOCAB, NULL},
    [O_REVERSE_SIZE] = {"reverse-size", &opt_reverse_size, 1, SEQ2SEQ_MAX_EXAMPLES, NULL},
    [O_BEAM] = {"beam", &opt_beam, 1, 64, NULL},
    [O_SAVE_EVERY] = {"save-every", &opt_save_every, 1, 1000000, NULL},
    [O_ACCUMULATE] = {"accumulate", &opt_accumulate, 1, 1000000, NULL},
    [O_WARMUP] = {"warmup", &opt_warmup, 0, 100000000, NULL},
    [O_HELDOUT] = {"heldout", &opt_heldout, 0, 100000, NULL},
};

typedef struct {
  const gchar *name;
  double *value;
  double min, max;
  gboolean min_open, max_open; /* whether the bound itself is excluded */
  gchar *text;
} DoubleOption;

enum { O_LR, O_DROPOUT, O_CLIP, O_LENGTH_PENALTY, O_LABEL_SMOOTHING, N_DOUBLE_OPTIONS };

static DoubleOption double_options[N_DOUBLE_OPTIONS] = {
    [O_LR] = {"lr", &opt_lr, 0, 10, TRUE, FALSE, NULL},
    [O_DROPOUT] = {"dropout", &opt_dropout, 0, 1, FALSE, TRUE, NULL},
    [O_CLIP] = {"clip", &opt_clip, 0, 1e30, FALSE, FALSE, NULL},
    [O_LENGTH_PENALTY] = {"length-penalty", &opt_length_penalty, 0, 100, FALSE, FALSE, NULL},
    [O_LABEL_SMOOTHING] = {"label-smoothing", &opt_label_smoothing, 0, 1, FALSE, FALSE, NULL},
};

#define INT_ARG(o) G_OPTION_ARG_STRING, &int_options[o].text
#define DOUBLE_ARG(o) G_OPTION_ARG_STRING, &double_options[o].text

static GOptionEntry entries[] = {
    {"model", 'm', 0, G_OPTION_ARG_STRING, &opt_model,
     "transformer (default), bahdanau (GRU encoder, additive-attention decoder) or luong (GRU "
     "encoder, Luong-attention decoder)",
     "NAME"},
    LUONG_OPTION_ENTRIES,
    {"task", 0, 0, G_OPTION_ARG_STRING, &opt_task,
     "fra (default: the book's English-French pairs) or reverse (reverse random token "
     "sequences; needs no data)",
     "NAME"},
    {"data", 0, 0, G_OPTION_ARG_FILENAME, &opt_data,
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
    {"clip-rule", 0, 0, G_OPTION_ARG_STRING, &opt_clip_rule,
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
    {"threads", 't', 0, INT_ARG(O_THREADS),
     "Worker threads, at most 4 per processor (default: OpenMP's default, usually the number "
     "of cores)",
     "N"},
    {"seed", 's', 0, G_OPTION_ARG_INT64, &opt_seed,
     "Seed for initial weights, shuffling and dropout (default 0)", "N"},
    {"save", 0, 0, G_OPTION_ARG_FILENAME, &opt_save,
     "Save the model, optimizer state and vocabularies to FILE (safetensors) after training",
     "FILE"},
    {"resume", 0, 0, G_OPTION_ARG_FILENAME, &opt_resume,
     "Start from a checkpoint written by --save (training continues up to --epochs)", "FILE"},
    {"translate", 0, 0, G_OPTION_ARG_STRING_ARRAY, &opt_translate,
     "Translate SENTENCE (may be repeated) instead of the book's four sentences", "SENTENCE"},
    {"heatmap", 0, 0, G_OPTION_ARG_FILENAME, &opt_heatmap,
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
    {"tie-embeddings", 0, 0, G_OPTION_ARG_NONE, &opt_tie,
     "Transformer: the output projection is the decoder's embedding matrix (and the encoder's "
     "too when source and target share one vocabulary, as in --task reverse); prints the "
     "parameter count with and without",
     NULL},
    {"quiet", 'q', 0, G_OPTION_ARG_NONE, &opt_quiet, "Print only the final results", NULL},
    {"distributed", 0, 0, G_OPTION_ARG_NONE, &opt_distributed,
     "Train data-parallel over MPI (start with mpirun -np N): each process takes its share of "
     "every --batch-size batch; rank 0 prints and saves",
     NULL},
    {"save-every", 0, 0, INT_ARG(O_SAVE_EVERY),
     "Also save to --save after every N epochs during training", "N"},
    {"step-losses", 0, 0, G_OPTION_ARG_FILENAME, &opt_step_losses,
     "Write each training step's loss (the book's metric of its batch) to FILE, one per line",
     "FILE"},
    {"accumulate", 0, 0, INT_ARG(O_ACCUMULATE),
     "Run each batch as N micro-batches and sum their gradients before the step (less memory; "
     "the arithmetic of --distributed over N processes)",
     "N"},
    {NULL}};

/* More threads than this only adds overhead: --threads 10000 took 53.6 s and
 * 2.2 GB where 2 threads took 0.11 s. */
static gint
max_threads(void)
{
  return 4 * (gint)g_get_num_processors();
}

static gboolean
parse_numeric_options(GError **error)
{
  for (guint i = 0; i < N_INT_OPTIONS; i++) {
    const IntOption *o = &int_options[i];
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
    const DoubleOption *o = &double_options[i];
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

typedef struct {
  ModelConfig cfg;
  Seq2SeqData data;
  QkvParams *params;
  QkvOptimizer *optimizer;
  /* one training plan, compiled for the full batch; the last, partial batch
   * of an epoch is bound as is (a plan runs on smaller leading dims) */
  ModelPlan train;
  QkvGradAccumulator *accumulator; /* --accumulate over 1 */
  QkvSchedule *schedule;           /* --warmup, else NULL */
  QkvClipRule clip_rule;
  Translator translator;
  gint epochs_done;
  gint64 global_step;
  double last_loss;
  double last_tokens_per_s;
} Trainer;

static ModelPlan *
train_plan(Trainer *tr, GError **error)
{
  if (tr->train.plan == NULL) {
    /* compiled for this process's share of a full batch; smaller shares
     * (the last batch) run on it too */
    gint first_row, shard;
    seq2seq_dist_shard(MIN(opt_batch, tr->data.n), &first_row, &shard);
    gint64 part_first, rows; /* the first micro-batch is the largest */
    qkv_split_range(shard, opt_accumulate, 0, &part_first, &rows);
    if (!model_plan_build(&tr->train, &tr->cfg, tr->params, (gint)rows, TRUE, opt_threads, error)) {
      model_plan_clear(&tr->train);
      return NULL;
    }
    if (opt_accumulate > 1 && tr->accumulator == NULL) {
      tr->accumulator = qkv_grad_accumulator_new(tr->params, error);
      if (tr->accumulator == NULL)
        return NULL;
    }
    /* model_plan_build's seed, made this rank's own */
    seq2seq_dist_reseed(tr->train.plan, tr->cfg.seed * 1000003u + (guint64)rows);
  }
  return &tr->train;
}

static gboolean save(Trainer *tr, const gchar *path, GError **error);

/* Host buffers of a full batch; a micro-batch uses their first rows. */
typedef struct {
  QkvTensor *src, *src_valid, *dec_in, *labels, *tgt_valid;
} BatchBuffers;

/* Forward and backward over the examples ex[0..rows): the summed loss to
 * *loss, the target tokens added to *tokens, the gradients in the store. */
static gboolean
train_micro_batch(Trainer *tr, const BatchBuffers *buf, const gint *ex, gint rows,
                  guint64 plan_step, double *loss, double *tokens, GError **error)
{
  ModelPlan *mp = train_plan(tr, error);
  if (mp == NULL)
    return FALSE;
  const gint T = tr->data.num_steps, bos = tr->data.tgt_vocab->bos;
  gint32 *s = qkv_tensor_i32(buf->src), *sv = qkv_tensor_i32(buf->src_valid);
  gint32 *d = qkv_tensor_i32(buf->dec_in), *l = qkv_tensor_i32(buf->labels);
  gint32 *tv = qkv_tensor_i32(buf->tgt_valid);
  batch_gather_rows(s, T, tr->data.src, T, ex, rows);
  batch_gather_rows(l, T, tr->data.tgt, T, ex, rows);
  batch_gather(sv, tr->data.src_valid, ex, rows);
  batch_gather(tv, tr->data.tgt_valid, ex, rows);
  for (gint i = 0; i < rows; i++) {
    /* teacher forcing: <bos> then the target shifted right by one */
    d[i * T] = bos;
    memcpy(d + i * T + 1, tr->data.tgt + (gsize)ex[i] * T, (T - 1) * sizeof(gint32));
    *tokens += tr->data.tgt_valid[ex[i]];
  }
  /* tensors of this micro-batch's size that borrow the full-size buffers */
  QkvShape cbt = QKV_SHAPE(rows, T), cbs = QKV_SHAPE(rows);
  g_autoptr(QkvTensor) v_src = qkv_tensor_new_borrowed(QKV_I32, &cbt, s);
  g_autoptr(QkvTensor) v_valid = qkv_tensor_new_borrowed(QKV_I32, &cbs, sv);
  g_autoptr(QkvTensor) v_dec = qkv_tensor_new_borrowed(QKV_I32, &cbt, d);
  g_autoptr(QkvTensor) v_lab = qkv_tensor_new_borrowed(QKV_I32, &cbt, l);
  g_autoptr(QkvTensor) v_tvalid = qkv_tensor_new_borrowed(QKV_I32, &cbs, tv);
  if (!qkv_plan_bind(mp->plan, "src", v_src, error) ||
      !qkv_plan_bind(mp->plan, "src_valid", v_valid, error) ||
      !qkv_plan_bind(mp->plan, "dec_in", v_dec, error) ||
      !qkv_plan_bind(mp->plan, "labels", v_lab, error) ||
      !qkv_plan_bind(mp->plan, "tgt_valid", v_tvalid, error))
    return FALSE;
  qkv_plan_set_step(mp->plan, plan_step);
  if (!qkv_plan_run(mp->plan, error))
    return FALSE;
  *loss = qkv_plan_output_scalar(mp->plan, 0);
  return TRUE;
}

/* Fisher-Yates with a generator seeded by (seed, epoch), so a resumed run
 * shuffles as the uninterrupted one would. */
static void
shuffle(gint *order, gint n, guint64 seed, gint epoch)
{
  GRand *rand = g_rand_new_with_seed((guint32)(seed * 7919u + (guint64)epoch * 104729u + 17u));
  batch_order_init(order, n);
  batch_shuffle(rand, order, (guint)n, sizeof *order);
  g_rand_free(rand);
}

static void
format_duration(gchar *buf, gsize size, double seconds)
{
  if (seconds < 60)
    g_snprintf(buf, size, "%.0fs", seconds);
  else
    g_snprintf(buf, size, "%dm%02ds", (int)(seconds / 60), (int)fmod(seconds, 60));
}

static gboolean
train(Trainer *tr, gint epochs, GError **error)
{
  const gint n = tr->data.n, T = tr->data.num_steps;
  g_autofree gint *order = g_new(gint, n);
  gint batch_max = MIN(opt_batch, n);
  QkvShape bt = QKV_SHAPE(batch_max, T), bs = QKV_SHAPE(batch_max);
  g_autoptr(QkvTensor) src = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) src_valid = qkv_tensor_new(QKV_I32, &bs);
  g_autoptr(QkvTensor) dec_in = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) labels = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) tgt_valid = qkv_tensor_new(QKV_I32, &bs);
  BatchBuffers buffers = {src, src_valid, dec_in, labels, tgt_valid};
  gboolean tty = isatty(fileno(stdout)) && !opt_quiet;
  gint64 start = g_get_monotonic_time();
  gint first_epoch = tr->epochs_done;

  for (gint epoch = tr->epochs_done; epoch < epochs; epoch++) {
    gint64 epoch_start = g_get_monotonic_time();
    double loss_sum = 0, tokens = 0;
    shuffle(order, n, tr->cfg.seed, epoch);
    for (gint first = 0; first < n; first += opt_batch) {
      /* --distributed: this process's rows of the global batch, run as
       * --accumulate micro-batches. Their losses are summed as floats, as
       * the all-reduce sums the ranks' losses, so that N micro-batches
       * compute what N processes compute. */
      gint global_batch = MIN(opt_batch, n - first), shard_first, shard;
      seq2seq_dist_shard(global_batch, &shard_first, &shard);
      float loss_of_parts = 0;
      double step_tokens = 0;
      gint parts_run = 0;
      for (gint part = 0; part < opt_accumulate; part++) {
        gint64 offset, rows;
        qkv_split_range(shard, opt_accumulate, part, &offset, &rows);
        if (rows == 0)
          continue;
        double part_loss;
        guint64 plan_step = (guint64)tr->global_step * (guint64)opt_accumulate + (guint64)part;
        if (!train_micro_batch(tr, &buffers, order + first + shard_first + offset, (gint)rows,
                               plan_step, &part_loss, &step_tokens, error))
          return FALSE;
        loss_of_parts += (float)part_loss;
        if (tr->accumulator != NULL)
          qkv_grad_accumulator_add(tr->accumulator);
        parts_run++;
      }
      if (tr->accumulator != NULL)
        qkv_grad_accumulator_store(tr->accumulator); /* zeros when no part had rows */
      else if (parts_run == 0)
        qkv_params_zero_grad(tr->params); /* a short last batch left this rank no rows */
      double step_loss = loss_of_parts;
      if (!seq2seq_dist_reduce(tr->params, &step_loss, &step_tokens, error))
        return FALSE;
      double loss = step_loss;
      tokens += step_tokens;
      seq2seq_step_log(tr->global_step + 1, step_loss / step_tokens);
      /* Once the loss is NaN or Inf the weights are too (or soon will be):
       * going on would train on garbage and save it. */
      if (!isfinite(loss)) {
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "the loss became %s at epoch %d, step %" G_GINT64_FORMAT
                    "; stopping (try a smaller --lr, or --clip)",
                    isnan(loss) ? "NaN" : "infinite", epoch + 1, tr->global_step + 1);
        return FALSE;
      }
      loss_sum += loss;
      if (tr->schedule != NULL)
        qkv_schedule_step(tr->schedule, tr->optimizer);
      if (opt_clip > 0
              ? !qkv_optimizer_step_clipped(tr->optimizer, opt_clip, tr->clip_rule, NULL, error)
              : !qkv_optimizer_step(tr->optimizer, error))
        return FALSE;
      tr->global_step++;
    }
    double epoch_s = (g_get_monotonic_time() - epoch_start) / 1e6;
    tr->last_loss = loss_sum / tokens;
    tr->last_tokens_per_s = tokens / epoch_s;
    tr->epochs_done = epoch + 1;
    if (opt_save != NULL && opt_save_every > 0 && (epoch + 1) % opt_save_every == 0 &&
        seq2seq_dist_is_root() && !save(tr, opt_save, error))
      return FALSE;
    double elapsed = (g_get_monotonic_time() - start) / 1e6;
    double left = elapsed / (epoch + 1 - first_epoch) * (epochs - epoch - 1);
    gchar eta[32];
    format_duration(eta, sizeof eta, left);
    if (tty) {
      printf("\repoch %d/%d  loss %.3f  %.0f tokens/sec  %s left   ", epoch + 1, epochs,
             tr->last_loss, tr->last_tokens_per_s, eta);
      fflush(stdout);
    } else if (!opt_quiet && ((epoch + 1) % 10 == 0 || epoch + 1 == epochs)) {
      printf("epoch %d/%d loss %.3f, %.0f tokens/sec, %s left\n", epoch + 1, epochs, tr->last_loss,
             tr->last_tokens_per_s, eta);
    }
  }
  if (tty)
    printf("\n");
  return TRUE;
}

/* Decoding of one sentence by the incremental step decoder (one plan run per
 * token, every token at its true position) under beam search (--beam;
 * greedy by default). */
static gchar *
translate(Trainer *tr, const gchar *sentence, QkvTensor **weights_out, gint *src_len, gint *out_len,
          GError **error)
{
  return translator_sentence(&tr->translator, &tr->cfg, tr->params, &tr->data, sentence,
                             weights_out, src_len, out_len, error);
}

static gboolean
save(Trainer *tr, const gchar *path, GError **error)
{
  g_autoptr(GHashTable) meta = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
  g_hash_table_insert(meta, "seq2seq.model", g_strdup(model_kind_name(tr->cfg.kind)));
  if (tr->cfg.kind == MODEL_LUONG) /* the same parameters serve several attentions */
    g_hash_table_insert(meta, "seq2seq.attention", model_attention_describe(&tr->cfg));
  g_hash_table_insert(meta, "seq2seq.epochs_done", g_strdup_printf("%d", tr->epochs_done));
  g_hash_table_insert(meta, "seq2seq.global_step",
                      g_strdup_printf("%" G_GINT64_FORMAT, tr->global_step));
  /* the options that shape the model but not its parameters' shapes (heads)
   * or that the data depends on, so that --resume can refuse a mismatch */
  g_hash_table_insert(meta, "seq2seq.hidden", g_strdup_printf("%d", opt_hidden));
  g_hash_table_insert(meta, "seq2seq.layers", g_strdup_printf("%d", opt_layers));
  g_hash_table_insert(meta, "seq2seq.heads", g_strdup_printf("%d", opt_heads));
  g_hash_table_insert(meta, "seq2seq.ffn", g_strdup_printf("%d", opt_ffn));
  g_hash_table_insert(meta, "seq2seq.num_steps", g_strdup_printf("%d", opt_steps));
  g_hash_table_insert(meta, "seq2seq.src_vocab", vocab_join(tr->data.src_vocab));
  g_hash_table_insert(meta, "seq2seq.tgt_vocab", vocab_join(tr->data.tgt_vocab));
  return qkv_checkpoint_save(path, tr->params, tr->optimizer, NULL, meta, error);
}

/* An integer of the checkpoint's metadata, parsed in full and in range. */
static gboolean
meta_int(GHashTable *meta, const gchar *path, const gchar *key, gint64 min, gint64 max, gint64 *out,
         GError **error)
{
  const gchar *text = g_hash_table_lookup(meta, key);
  if (text == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s has no %s in its metadata (not written by this qkv-seq2seq's --save)", path,
                key);
    return FALSE;
  }
  if (!g_ascii_string_to_signed(text, 10, min, max, out, NULL)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: metadata %s is '%s', not an integer from %" G_GINT64_FORMAT
                " to %" G_GINT64_FORMAT,
                path, key, text, min, max);
    return FALSE;
  }
  return TRUE;
}

static gboolean
tensor_is_finite(QkvTensor *t)
{
  if (qkv_tensor_dtype(t) != QKV_F32)
    return TRUE;
  const float *x = qkv_tensor_f32(t);
  for (gint64 i = 0, n = qkv_tensor_numel(t); i < n; i++)
    if (!isfinite(x[i]))
      return FALSE;
  return TRUE;
}

static gboolean
resume(Trainer *tr, const gchar *path, GError **error)
{
  g_autoptr(GHashTable) meta = qkv_checkpoint_read_metadata(path, error);
  if (meta == NULL)
    return FALSE;
  const gchar *model = g_hash_table_lookup(meta, "seq2seq.model");
  const gchar *want = model_kind_name(tr->cfg.kind);
  if (model == NULL || !g_str_equal(model, want)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s holds a '%s' model, not '%s' (use --model)", path, model ? model : "?", want);
    return FALSE;
  }
  g_autofree gchar *attention = model_attention_describe(&tr->cfg);
  const gchar *stored_attention = g_hash_table_lookup(meta, "seq2seq.attention");
  if (attention != NULL &&
      (stored_attention == NULL || !g_str_equal(stored_attention, attention))) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained with Luong attention '%s', not '%s' (use --score, --local-m, "
                "--local-p, --input-feeding)",
                path, stored_attention ? stored_attention : "?", attention);
    return FALSE;
  }
  /* The number of heads does not show in the parameters' shapes, so a
   * strict load alone would take a 2-head model as a 4-head one. */
  struct {
    const gchar *key, *option;
    gint value;
    gboolean applies;
  } config[] = {
      {"seq2seq.hidden", "--hidden", opt_hidden, TRUE},
      {"seq2seq.layers", "--layers", opt_layers, TRUE},
      {"seq2seq.heads", "--heads", opt_heads, tr->cfg.kind == MODEL_TRANSFORMER},
      {"seq2seq.ffn", "--ffn", opt_ffn, tr->cfg.kind == MODEL_TRANSFORMER},
      {"seq2seq.num_steps", "--num-steps", opt_steps, TRUE},
  };
  for (guint i = 0; i < G_N_ELEMENTS(config); i++) {
    gint64 stored;
    if (!config[i].applies)
      continue;
    if (!meta_int(meta, path, config[i].key, 1, G_MAXINT, &stored, error))
      return FALSE;
    if (stored != config[i].value) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "%s was trained with %s %" G_GINT64_FORMAT
                  ", not %s %d (give %s %" G_GINT64_FORMAT ")",
                  path, config[i].option, stored, config[i].option, config[i].value,
                  config[i].option, stored);
      return FALSE;
    }
  }
  gint64 done, step;
  if (!meta_int(meta, path, "seq2seq.epochs_done", 0, 1000000, &done, error) ||
      !meta_int(meta, path, "seq2seq.global_step", 0, G_MAXINT64, &step, error))
    return FALSE;
  g_autofree gchar *sv = vocab_join(tr->data.src_vocab);
  g_autofree gchar *tv = vocab_join(tr->data.tgt_vocab);
  const gchar *fsv = g_hash_table_lookup(meta, "seq2seq.src_vocab");
  const gchar *ftv = g_hash_table_lookup(meta, "seq2seq.tgt_vocab");
  if (fsv == NULL || ftv == NULL || !g_str_equal(fsv, sv) || !g_str_equal(ftv, tv)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained on other data (its vocabularies differ; check --task and "
                "--num-examples)",
                path);
    return FALSE;
  }
  if (!qkv_checkpoint_load(path, tr->params, tr->optimizer, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL,
                           error))
    return FALSE;
  /* NaN or Inf weights would train to a NaN loss and translate to noise */
  for (guint i = 0; i < qkv_params_size(tr->params); i++) {
    QkvParam *param = qkv_params_nth(tr->params, i);
    const gchar *bad = tensor_is_finite(qkv_param_value(param)) ? NULL : "value";
    for (guint j = 0; bad == NULL && j < qkv_param_n_states(param); j++) {
      QkvTensor *state = NULL;
      const gchar *name = qkv_param_nth_state(param, j, &state);
      if (!tensor_is_finite(state))
        bad = name;
    }
    if (bad != NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "%s: %s of parameter %s holds NaN or Inf", path,
                  g_str_equal(bad, "value") ? "the value" : bad, qkv_param_name(param));
      return FALSE;
    }
  }
  tr->epochs_done = (gint)done;
  tr->global_step = step;
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

/* The checks between options, made before any work (each option's own
 * range is checked as it is parsed). */
static gboolean
check_options(gboolean *reverse_out, ModelKind *kind_out, GError **error)
{
  gboolean reverse = opt_task != NULL && g_str_equal(opt_task, "reverse");
  if (opt_task != NULL && !reverse && !g_str_equal(opt_task, "fra")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "unknown --task '%s'", opt_task);
    return FALSE;
  }
  ModelKind kind = MODEL_TRANSFORMER;
  if (opt_model != NULL && g_str_equal(opt_model, "bahdanau"))
    kind = MODEL_BAHDANAU;
  else if (opt_model != NULL && g_str_equal(opt_model, "luong"))
    kind = MODEL_LUONG;
  else if (opt_model != NULL && !g_str_equal(opt_model, "transformer")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "unknown --model '%s'", opt_model);
    return FALSE;
  }
  ModelConfig probe = {.kind = kind};
  if (!luong_options_apply(&probe, SEQ2SEQ_MAX_STEPS, error))
    return FALSE;
  if (opt_tie && kind != MODEL_TRANSFORMER) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--tie-embeddings ties the Transformer's embeddings; --model %s has none to tie",
                opt_model);
    return FALSE;
  }
  *reverse_out = reverse;
  *kind_out = kind;
  if (kind == MODEL_TRANSFORMER && opt_hidden % opt_heads != 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heads %d does not divide --hidden %d (each head takes hidden / heads "
                "features)",
                opt_heads, opt_hidden);
    return FALSE;
  }
  if (reverse && (gint64)opt_reverse_size * opt_steps > SEQ2SEQ_MAX_IDS) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--reverse-size %d times --num-steps %d is over %" G_GINT64_FORMAT " tokens",
                opt_reverse_size, opt_steps, SEQ2SEQ_MAX_IDS);
    return FALSE;
  }
  if (opt_accumulate > opt_batch) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--accumulate %d splits each batch into %d micro-batches; a batch of %d rows "
                "cannot fill them (give a smaller --accumulate or a larger --batch-size)",
                opt_accumulate, opt_accumulate, opt_batch);
    return FALSE;
  }
  if (opt_clip_rule != NULL && !g_str_equal(opt_clip_rule, "torch") &&
      !g_str_equal(opt_clip_rule, "d2l")) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "unknown --clip-rule '%s' (torch or d2l)", opt_clip_rule);
    return FALSE;
  }
  if (opt_save_every > 0 && opt_save == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--save-every saves to the file --save names; give --save too");
    return FALSE;
  }
  if (opt_heatmap != NULL && reverse && opt_translate == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--heatmap draws the first translated sentence, and --task reverse translates "
                "none without --translate");
    return FALSE;
  }
  return TRUE;
}

/* Corpus BLEU-4 on the --heldout pairs after the training ones, greedy and
 * beam 4, as the Transformer paper decodes. */
static gboolean
print_heldout_bleu(Trainer *tr, const gchar *data_path, GError **error)
{
  GPtrArray *src = NULL, *tgt = NULL;
  if (!seq2seq_data_load_pairs(data_path, opt_num_examples + 1, opt_heldout, &src, &tgt, error))
    return FALSE;
  if (src->len == 0) {
    /* a file that ends with the training pairs has nothing to hold out */
    printf("held-out BLEU: no sentence pairs after the %d training lines of %s\n",
           opt_num_examples + 1, data_path);
    g_ptr_array_unref(src);
    g_ptr_array_unref(tgt);
    return TRUE;
  }
  double greedy = 0, beam = 0;
  gint64 t0 = g_get_monotonic_time();
  gboolean ok = heldout_bleu(&tr->cfg, tr->params, &tr->data, src, tgt, 64, 1, opt_length_penalty,
                             opt_threads, &greedy, error) &&
                heldout_bleu(&tr->cfg, tr->params, &tr->data, src, tgt, 64, 4, opt_length_penalty,
                             opt_threads, &beam, error);
  if (ok)
    printf("held-out BLEU-4 on %u unseen pairs (corpus, as sacrebleu, 0-100): greedy %.2f, beam 4 "
           "%.2f (alpha %g; %.1f s)\n",
           src->len, greedy, beam, opt_length_penalty, (g_get_monotonic_time() - t0) / 1e6);
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  return ok;
}

static gboolean
run(gboolean reverse, ModelKind kind, GError **error)
{
  Trainer tr = {0};
  gboolean ok = FALSE;
  g_autofree gchar *data_path = opt_data ? g_strdup(opt_data) : text_fra_eng_path(QKV_DATA_DIR, QKV_SOURCE_DATA_DIR);
  tr.cfg.kind = kind;
  if (int_options[O_EPOCHS].text == NULL)
    opt_epochs = kind == MODEL_TRANSFORMER ? 200 : 250;
  if (opt_threads > 0)
    qkv_set_num_threads(opt_threads);
  if ((opt_save != NULL && !check_writable("--save", opt_save, error)) ||
      (opt_heatmap != NULL && !check_writable("--heatmap", opt_heatmap, error)))
    return FALSE;

  if (reverse) {
    if (!seq2seq_data_reverse(&tr.data, opt_reverse_size, opt_steps, opt_reverse_vocab,
                              (guint64)opt_seed, error))
      return FALSE;
  } else if (!seq2seq_data_load_nmt(&tr.data, data_path, opt_num_examples, opt_steps, error)) {
    return FALSE;
  }
  tr.cfg.src_vocab = vocab_size(tr.data.src_vocab);
  tr.cfg.tgt_vocab = vocab_size(tr.data.tgt_vocab);
  tr.cfg.num_steps = opt_steps;
  tr.cfg.num_hiddens = opt_hidden;
  tr.cfg.embed_size = opt_hidden;
  tr.cfg.ffn_hiddens = opt_ffn;
  tr.cfg.num_heads = opt_heads;
  tr.cfg.num_layers = opt_layers;
  tr.cfg.dropout = opt_dropout;
  tr.cfg.label_smoothing = opt_label_smoothing;
  tr.clip_rule =
      opt_clip_rule != NULL && g_str_equal(opt_clip_rule, "d2l") ? QKV_CLIP_D2L : QKV_CLIP_TORCH;
  tr.cfg.seed = (guint64)opt_seed;
  luong_options_apply(&tr.cfg, SEQ2SEQ_MAX_STEPS, NULL); /* checked in check_options */
  tr.cfg.tie_embeddings = opt_tie ? tied_mode(&tr.data) : QKV_TIE_NONE;
  tr.params = qkv_params_new();
  translator_init(&tr.translator, opt_steps, 1, opt_beam, opt_length_penalty, opt_threads);
  if (opt_distributed) {
    if (!seq2seq_dist_start(MIN(opt_batch, tr.data.n), error))
      goto out;
    if (opt_threads == 0)
      qkv_set_num_threads(seq2seq_dist_default_threads());
  }
  if (opt_step_losses != NULL && !seq2seq_step_log_open(opt_step_losses, error))
    goto out;

  /* building the training plan creates and initialises every parameter */
  if (train_plan(&tr, error) == NULL)
    goto out;
  QkvOptimConfig oc = qkv_optim_config_adam(opt_lr);
  tr.optimizer = qkv_optimizer_new_adam(tr.params, &oc, error);
  if (tr.optimizer == NULL)
    goto out;
  if (opt_resume != NULL && !resume(&tr, opt_resume, error))
    goto out;
  if (opt_warmup > 0) {
    /* the paper's factor · d^-0.5 · min(step^-0.5, step · warmup^-1.5),
     * with the factor that makes its peak (at step = warmup) --lr */
    double factor = opt_lr * sqrt((double)opt_hidden * (double)opt_warmup);
    tr.schedule = qkv_schedule_new_warmup(factor, opt_hidden, opt_warmup);
    qkv_schedule_set_position(tr.schedule, tr.global_step);
  }
  /* --distributed: every rank starts from rank 0's weights and state */
  if (!seq2seq_dist_broadcast(tr.params, tr.optimizer, error))
    goto out;
  if (!opt_quiet) {
    g_autofree gchar *title = model_title(&tr.cfg);
    printf("%s on %s: %d pairs, vocabularies %d/%d, %" G_GINT64_FORMAT " parameters, %d threads\n",
           title, reverse ? "reverse task" : "fra-eng", tr.data.n, vocab_size(tr.data.src_vocab),
           vocab_size(tr.data.tgt_vocab), qkv_params_numel(tr.params),
           opt_threads > 0 ? opt_threads : qkv_get_num_threads());
  }
  if (!opt_quiet) {
    g_autofree gchar *schedule =
        opt_warmup > 0 ? g_strdup_printf(", warm-up over %d steps then 1/sqrt(step)", opt_warmup)
                       : g_strdup("");
    g_autofree gchar *clip =
        opt_clip > 0
            ? g_strdup_printf("clipping at %g by %s", opt_clip,
                              tr.clip_rule == QKV_CLIP_D2L
                                  ? "the book's rule (grad_clipping: norm / |g|)"
                                  : "PyTorch's rule (clip_grad_norm_: norm / (|g| + 1e-6))")
            : g_strdup("no clipping");
    printf("training: Adam lr %g%s, %s, label smoothing %g\n", opt_lr, schedule, clip,
           opt_label_smoothing);
  }
  gint64 untied = 0;
  if (opt_tie && !tied_untied_count(&tr.cfg, &untied, error))
    goto out;
  if (opt_tie && !opt_quiet)
    printf("tied embeddings: %s; %" G_GINT64_FORMAT " parameters, %" G_GINT64_FORMAT
           " without --tie-embeddings\n",
           tied_mode_name(tr.cfg.tie_embeddings), qkv_params_numel(tr.params), untied);
  if (!opt_quiet && seq2seq_dist_active())
    printf("distributed: %d processes, each trains on its share of every batch of %d\n",
           seq2seq_dist_world_size(), MIN(opt_batch, tr.data.n));
  gint64 t0 = g_get_monotonic_time();
  gboolean trained = tr.epochs_done < opt_epochs;
  if (trained && !train(&tr, opt_epochs, error))
    goto out;
  double train_s = (g_get_monotonic_time() - t0) / 1e6;
  if (trained)
    printf("loss %.3f, %.1f tokens/sec (last epoch; %.1f s for %d epochs)\n", tr.last_loss,
           tr.last_tokens_per_s, train_s, opt_epochs);
  if (opt_save != NULL && seq2seq_dist_is_root()) {
    if (!save(&tr, opt_save, error))
      goto out;
    if (!opt_quiet)
      printf("saved %s\n", opt_save);
  }
  if (!seq2seq_dist_is_root()) {
    ok = TRUE; /* rank 0 translates and reports */
    goto out;
  }

  const gchar *engs[] = {"go .", "i lost .", "he's calm .", "i'm home ."};
  const gchar *fras[] = {"va !", "j'ai perdu .", "il est calme .", "je suis chez moi ."};
  gint n_sentences = 4;
  if (opt_translate != NULL)
    n_sentences = (gint)g_strv_length(opt_translate);
  else if (reverse)
    n_sentences = 0;
  for (gint i = 0; i < n_sentences; i++) {
    const gchar *sentence = opt_translate ? opt_translate[i] : engs[i];
    g_autoptr(QkvTensor) weights = NULL;
    gint src_len = 0, out_len = 0;
    g_autofree gchar *translation = translate(
        &tr, sentence, i == 0 && opt_heatmap ? &weights : NULL, &src_len, &out_len, error);
    if (translation == NULL)
      goto out;
    if (opt_translate != NULL)
      printf("%s => %s\n", sentence, translation);
    else
      printf("%s => %s, bleu %.3f\n", sentence, translation, bleu(translation, fras[i], 2));
    if (weights != NULL &&
        !heatmap_write(opt_heatmap, weights, sentence, translation, tr.data.src_vocab,
                       tr.data.num_steps, src_len, out_len, error))
      goto out;
  }
  if (!reverse && opt_translate == NULL && opt_heldout > 0 &&
      !print_heldout_bleu(&tr, data_path, error))
    goto out;
  if (reverse) {
    /* decoding of held-out sequences (greedy or --beam), token accuracy up to <eos> */
    Seq2SeqData test;
    if (!seq2seq_data_reverse(&test, 100, opt_steps, opt_reverse_vocab,
                              (guint64)opt_seed + 1000003u, error))
      goto out;
    gint right = 0, total = 0;
    for (gint s = 0; s < test.n; s++) {
      GString *sentence = g_string_new(NULL);
      for (gint t = 0; t < test.src_valid[s] - 1; t++)
        g_string_append_printf(sentence, "%s%s", t ? " " : "",
                               vocab_token(test.src_vocab, test.src[s * opt_steps + t]));
      gint src_len, out_len;
      g_autofree gchar *pred = translate(&tr, sentence->str, NULL, &src_len, &out_len, error);
      g_string_free(sentence, TRUE);
      if (pred == NULL) {
        seq2seq_data_clear(&test);
        goto out;
      }
      g_auto(GStrv) toks = g_strsplit(pred, " ", -1);
      gint n_pred = pred[0] ? (gint)g_strv_length(toks) : 0;
      for (gint t = 0; t < test.tgt_valid[s]; t++) {
        gint want = test.tgt[s * opt_steps + t];
        gint got = t < n_pred ? vocab_lookup(test.tgt_vocab, toks[t])
                              : (t == n_pred ? test.tgt_vocab->eos : -1);
        right += got == want;
        total++;
      }
    }
    g_autofree gchar *how =
        opt_beam > 1 ? g_strdup_printf("beam %d", opt_beam) : g_strdup("greedy");
    printf("reverse task: %s token accuracy %.3f on %d held-out sequences\n", how,
           (double)right / total, test.n);
    seq2seq_data_clear(&test);
  }
  ok = TRUE;
out:
  translator_clear(&tr.translator);
  model_plan_clear(&tr.train);
  qkv_grad_accumulator_free(tr.accumulator);
  qkv_schedule_free(tr.schedule);
  qkv_optimizer_free(tr.optimizer);
  qkv_params_free(tr.params);
  seq2seq_data_clear(&tr.data);
  seq2seq_step_log_close();
  return ok;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context = g_option_context_new(
      "- train a seq2seq model of Dive into Deep Learning (ch. 10) and translate");
  g_option_context_set_summary(
      context, "Default: the book's Transformer on 600 English-French pairs (d_model 32, 2 "
               "blocks, 4 heads,\nFFN 64, dropout 0.1, batch 64, Adam lr 0.005, clipping at 1, "
               "200 epochs, Xavier init),\nthen the book's four test sentences with BLEU.");
  g_option_context_add_main_entries(context, entries, NULL);
  if (!g_option_context_parse(context, &argc, &argv, &error)) {
    g_printerr("qkv-seq2seq: %s\n", error->message);
    return 2;
  }
  gboolean reverse = FALSE;
  ModelKind kind = MODEL_TRANSFORMER;
  if (!parse_numeric_options(&error) || !check_options(&reverse, &kind, &error)) {
    g_printerr("qkv-seq2seq: %s\n", error->message);
    return 2;
  }
  gboolean ok = run(reverse, kind, &error);
  if (!ok)
    seq2seq_dist_print_error("qkv-seq2seq", error);
  /* after a failed collective this leaves MPI as it is (finalizing could
   * wait for a dead rank) */
  seq2seq_dist_finish();
  return ok ? 0 : 1;
}
