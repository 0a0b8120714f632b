/* qkv-classify: sentence type from word order, with attention pooling.
 *
 * The English side of the shipped Tatoeba pairs (examples/data/fra-eng),
 * labelled by the final punctuation — statement ".", question "?",
 * exclamation "!" — with every . ? ! removed from the input, so the model
 * must tell "do you like it" from "you like it" by the words alone. The
 * sentences are deduplicated by their input and split into training and
 * held-out sets with no input in both.
 *
 * Three models learn it from the same data and seed: the pooling classifier
 * of qkv-builders.h with attention pooling (one learned query per class by
 * default), with hard attention pooling (each query picks one word: sampled
 * in training, the argmax in evaluation; trained by straight-through
 * Gumbel-softmax) and with mean pooling; all are compared with the majority
 * class on the held-out set. The attention model is saved with the checkpoint API,
 * loaded into a fresh store and evaluated again: the accuracy must be the
 * same, or the program exits 1 (the test suite runs a small configuration).
 * --heatmap draws each query's attention over one sentence's words. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <glib/gstdio.h>
#include <qkv/qkv.h>

#include "../common/batch.h"
#include "../common/grid-heatmap.h"
#include "../common/options.h"
#include "../common/program-version.h"
#include "../common/runlog.h"
#include "../common/text.h"
#include "data.h"

static gchar *opt_data = NULL;
static gint opt_epochs = 3;
static gint opt_batch = 128;
static gint opt_embed = 32;
static gint opt_key = 32;
static gint opt_queries = N_CLASSES;
static gint opt_max_sentences = 0;
static gint opt_max_len = 24;
static gint opt_min_freq = 2;
static gint opt_threads = 0;
static gint64 opt_seed = 1;
static double opt_lr = 0.01;
static double opt_held_out = 0.1;
static double opt_tau = 1.0;
static gchar *opt_heatmap = NULL;
static gchar *opt_sentence = NULL;
static gchar *opt_save = NULL;
static gboolean opt_quiet = FALSE;
static gboolean opt_no_positions = FALSE;
static gchar *opt_precision = NULL;
static gchar *opt_save_dtype = NULL;

static gchar *opt_log = NULL;
static gchar *opt_plot = NULL;
static gboolean opt_version = FALSE;
static gint opt_valid = 0;
static gint opt_valid_every = 1;
static gint opt_early_stop = 0;
static gchar *opt_save_best = NULL;

/* The options by group, as --help-all shows them; qkv-seq2seq groups its
 * own the same way. */
static GOptionEntry model_entries[] = {
    {"embed", 0, 0, G_OPTION_ARG_INT, &opt_embed, "Word vector size (default 32)", "N"},
    {"key-size", 0, 0, G_OPTION_ARG_INT, &opt_key, "Attention key and query size (default 32)",
     "N"},
    {"queries", 0, 0, G_OPTION_ARG_INT, &opt_queries,
     "Learned attention queries (default 3, one per class)", "K"},
    {"no-positions", 0, 0, G_OPTION_ARG_NONE, &opt_no_positions,
     "Do not add positional encodings to the word vectors (both models then see a bag of words)",
     NULL},
    {NULL}};

static GOptionEntry training_entries[] = {
    {"epochs", 'e', 0, G_OPTION_ARG_INT, &opt_epochs, "Training epochs per model (default 3)", "N"},
    {"batch-size", 'b', 0, G_OPTION_ARG_INT, &opt_batch, "Batch size (default 128)", "N"},
    {"lr", 0, 0, G_OPTION_ARG_DOUBLE, &opt_lr, "Adam learning rate (default 0.01)", "LR"},
    {"precision", 0, 0, G_OPTION_ARG_STRING, &opt_precision,
     "Training's matrix products in fp32 (default) or bf16 (operands rounded to bfloat16, "
     "float32 sums, as PyTorch's autocast)",
     "NAME"},
    {"tau", 0, 0, G_OPTION_ARG_DOUBLE, &opt_tau,
     "Gumbel-softmax temperature of hard attention pooling (default 1)", "T"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "Worker threads (default: all cores)", "N"},
    {"seed", 's', 0, G_OPTION_ARG_INT64, &opt_seed,
     "Seed of the split, the initialisation and the batch order (default 1)", "N"},
    {"log", 0, 0, G_OPTION_ARG_FILENAME, &opt_log,
     "Write one JSON object per training step and per epoch of both models (run, epoch, step, "
     "lr, loss, grad norm, tokens/s, elapsed time) to FILE",
     "FILE.jsonl"},
    {"plot", 0, 0, G_OPTION_ARG_FILENAME, &opt_plot,
     "Draw both models' training and validation loss curves and the learning rate to FILE "
     "(PNG)",
     "FILE.png"},
    {"valid-every", 0, 0, G_OPTION_ARG_INT, &opt_valid_every, "Validate every K epochs (default 1)",
     "K"},
    {"early-stop", 0, 0, G_OPTION_ARG_INT, &opt_early_stop,
     "Stop training a model after P validations in a row without a lower validation loss", "P"},
    {NULL}};

static GOptionEntry data_entries[] = {
    {"data", 0, 0, G_OPTION_ARG_FILENAME, &opt_data,
     "Tab-separated sentence pairs, English first; further columns are ignored (default: the "
     "shipped fra-eng fra.txt.gz)",
     "FILE"},
    {"max-sentences", 'n', 0, G_OPTION_ARG_INT, &opt_max_sentences,
     "Use this many distinct sentences, 0 for all (default 0: about 116,000)", "N"},
    {"held-out", 0, 0, G_OPTION_ARG_DOUBLE, &opt_held_out,
     "Share of the sentences held out for testing (default 0.1)", "P"},
    {"max-len", 0, 0, G_OPTION_ARG_INT, &opt_max_len,
     "Words per sentence; longer ones are cut (default 24)", "N"},
    {"min-freq", 0, 0, G_OPTION_ARG_INT, &opt_min_freq,
     "Words seen fewer times in training are <unk> (default 2)", "N"},
    {"valid", 0, 0, G_OPTION_ARG_INT, &opt_valid,
     "Keep N of the training sentences apart and measure the loss and accuracy on them every "
     "--valid-every epochs (default 0: none)",
     "N"},
    {NULL}};

static GOptionEntry heatmap_entries[] = {
    {"heatmap", 0, 0, G_OPTION_ARG_FILENAME, &opt_heatmap,
     "Draw each query's attention over the words of --sentence as a PNG, with a colour scale",
     "FILE.png"},
    {"sentence", 0, 0, G_OPTION_ARG_STRING, &opt_sentence,
     "The sentence for --heatmap (default \"do you know what time it is\")", "TEXT"},
    {NULL}};

static GOptionEntry checkpoint_entries[] = {
    {"save", 0, 0, G_OPTION_ARG_FILENAME, &opt_save,
     "Keep the attention model's checkpoint here (safetensors; the vocabulary in its metadata)",
     "FILE"},
    {"save-best", 0, 0, G_OPTION_ARG_FILENAME, &opt_save_best,
     "Save the attention model to FILE whenever its validation loss is the lowest so far", "FILE"},
    {"save-dtype", 0, 0, G_OPTION_ARG_STRING, &opt_save_dtype,
     "f32 (default) or bf16: the dtype of the saved parameters; bf16 rounds them to nearest even "
     "(the loaded model then scores as the rounded weights do, not exactly as trained)",
     "DTYPE"},
    {NULL}};

static GOptionEntry main_entries[] = {
    {"quiet", 'q', 0, G_OPTION_ARG_NONE, &opt_quiet, "Print only the results", NULL},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

static void
add_option_groups(GOptionContext *context)
{
  const struct {
    const gchar *name, *description, *help;
    GOptionEntry *entries;
  } groups[] = {
      {"model", "Model options:", "Show the model options", model_entries},
      {"training", "Training options:", "Show the training options", training_entries},
      {"data", "Data options:", "Show the data options", data_entries},
      {"heatmap", "Heat map options:", "Show the heat map options", heatmap_entries},
      {"checkpoints", "Checkpoint options:", "Show the checkpoint options", checkpoint_entries},
  };
  g_option_context_add_main_entries(context, main_entries, NULL);
  for (guint i = 0; i < G_N_ELEMENTS(groups); i++) {
    GOptionGroup *g =
        g_option_group_new(groups[i].name, groups[i].description, groups[i].help, NULL, NULL);
    g_option_group_add_entries(g, groups[i].entries);
    g_option_context_add_group(context, g);
  }
}

static QkvPoolingClassifierConfig
model_config(const ClassifyData *data, QkvPooling pooling)
{
  return (QkvPoolingClassifierConfig){
      .vocab_size = vocab_size(data->vocab),
      .embed_size = opt_embed,
      .key_size = opt_key,
      .num_queries = opt_queries,
      .num_classes = N_CLASSES,
      .pooling = pooling,
      .positional_encoding = !opt_no_positions,
      .tau = opt_tau,
  };
}

/* One mini-batch, cut to its longest sentence. */
typedef struct {
  QkvTensor *tokens, *lens, *labels;
} Batch;

static void
batch_clear(gpointer p)
{
  Batch *b = p;
  qkv_tensor_free(b->tokens);
  qkv_tensor_free(b->lens);
  qkv_tensor_free(b->labels);
}

static const Split *sort_split;

static gint
by_length(gconstpointer a, gconstpointer b)
{
  gint i = *(const gint *)a, j = *(const gint *)b;
  gint d = sort_split->lens[i] - sort_split->lens[j];
  return d != 0 ? d : i - j;
}

/* The training set in batches of sentences of about the same length, each
 * only as long as its longest: the plan runs them at their own T (bound
 * shapes), which costs far less than padding everything to --max-len. */
static GArray *
make_batches(const Split *s, gint batch)
{
  g_autofree gint *order = g_new(gint, s->n);
  batch_order_init(order, s->n);
  sort_split = s;
  qsort(order, s->n, sizeof(gint), by_length);
  GArray *batches = g_array_new(FALSE, FALSE, sizeof(Batch));
  g_array_set_clear_func(batches, batch_clear);
  for (gint start = 0; start < s->n; start += batch) {
    gint n = MIN(batch, s->n - start);
    gint t = MAX(1, s->lens[order[start + n - 1]]);
    QkvShape bt = QKV_SHAPE(n, t), bs = QKV_SHAPE(n);
    Batch b = {qkv_tensor_new(QKV_I32, &bt), qkv_tensor_new(QKV_I32, &bs),
               qkv_tensor_new(QKV_I32, &bs)};
    const gint *rows = order + start;
    batch_gather_rows(qkv_tensor_i32(b.tokens), t, s->ids, s->max_len, rows, n);
    batch_gather(qkv_tensor_i32(b.lens), s->lens, rows, n);
    batch_gather(qkv_tensor_i32(b.labels), s->labels, rows, n);
    g_array_append_val(batches, b);
  }
  return batches;
}

/* The share of the split's sentences whose argmax class is right and, when
 * loss is not NULL, their mean cross-entropy. */
static gboolean
evaluate(const QkvPoolingClassifierConfig *cfg, QkvParams *params, const Split *s, double *acc,
         double *loss, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = (guint64)opt_seed + 1};
  QkvShape bt = QKV_SHAPE(s->n, s->max_len), bs = QKV_SHAPE(s->n);
  g_autoptr(QkvTensor) tokens_t = qkv_tensor_new_i32(&bt, s->ids);
  g_autoptr(QkvTensor) lens_t = qkv_tensor_new_i32(&bs, s->lens);
  g_autoptr(QkvTensor) labels_t = qkv_tensor_new_i32(&bs, s->labels);
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &bt, error);
  QkvValue *lens = qkv_graph_input(g, "lens", QKV_I32, &bs, error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bs, error);
  QkvValue *logits = qkv_build_pooling_classifier(&b, cfg, tokens, lens, NULL, error);
  QkvValue *right =
      qkv_mean(qkv_eq(qkv_argmax(logits, 1, FALSE, error), labels, error), NULL, 0, FALSE, error);
  QkvValue *outs[] = {
      right,
      loss != NULL ? qkv_cross_entropy(logits, labels, NULL, QKV_REDUCTION_MEAN, error) : NULL};
  const gchar *names[] = {"tokens", "lens", "labels"};
  QkvTensor *inputs[] = {tokens_t, lens_t, labels_t};
  QkvTensor *results[2] = {NULL, NULL};
  if (!qkv_graph_eval(g, names, inputs, 3, outs, results, loss != NULL ? 2 : 1, error))
    return FALSE;
  *acc = qkv_tensor_get(results[0], 0);
  if (loss != NULL)
    *loss = qkv_tensor_get(results[1], 0);
  qkv_tensor_free(results[0]);
  qkv_tensor_free(results[1]);
  return TRUE;
}

static gboolean
accuracy(const QkvPoolingClassifierConfig *cfg, QkvParams *params, const Split *s, double *acc,
         GError **error)
{
  return evaluate(cfg, params, s, acc, NULL, error);
}

/* --valid: one model's best validation loss so far and the validations
 * since. */
typedef struct {
  double best;
  gint best_epoch, since_best;
  gboolean stop;
} Watch;

/* --save-dtype */
static QkvCheckpointDType
save_dtype(void)
{
  return opt_save_dtype != NULL && g_str_equal(opt_save_dtype, "bf16") ? QKV_CHECKPOINT_DTYPE_BF16
                                                                       : QKV_CHECKPOINT_DTYPE_F32;
}

static gboolean
save_model(const gchar *path, QkvParams *params, const Vocab *vocab, GError **error)
{
  g_autoptr(GHashTable) meta = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
  g_hash_table_insert(meta, "classify.vocab", vocab_join(vocab));
  return qkv_checkpoint_save_full(path, params, NULL, NULL, meta, save_dtype(), error);
}

/* Validate after an epoch: the loss and accuracy to *rec and the
 * progress line, --save-best for the attention model, --early-stop. */
static gboolean
validate(const QkvPoolingClassifierConfig *cfg, QkvParams *params, const ClassifyData *data,
         gint epoch, Watch *w, RunLogRecord *rec, GError **error)
{
  double acc = 0, loss = 0;
  if (!evaluate(cfg, params, &data->valid, &acc, &loss, error))
    return FALSE;
  rec->valid_loss = loss;
  rec->valid_accuracy = acc;
  gboolean best = loss < w->best;
  if (best) {
    w->best = loss;
    w->best_epoch = epoch + 1;
    w->since_best = 0;
    if (opt_save_best != NULL && cfg->pooling == QKV_POOLING_ATTENTION &&
        !save_model(opt_save_best, params, data->vocab, error))
      return FALSE;
  } else {
    w->stop = opt_early_stop > 0 && ++w->since_best >= opt_early_stop;
  }
  if (!opt_quiet)
    printf("    valid loss %.4f, accuracy %.4f%s\n", loss, acc, best ? " (best)" : "");
  if (w->stop && !opt_quiet)
    printf("    early stop: %d validations without a lower loss (best %.4f after epoch %d)\n",
           w->since_best, w->best, w->best_epoch);
  return TRUE;
}

/* --log and --plot (both models, told apart by their run names) */
static RunLog *run_log = NULL;

/* One step's record: the batch's mean loss, the gradients' norm (read
 * after the step, which leaves them as they were). */
static gboolean
log_step(QkvOptimizer *opt, QkvParams *params, const gchar *label, gint epoch, double loss,
         double tokens, double seconds, gint64 t0, GError **error)
{
  if (run_log == NULL)
    return TRUE;
  RunLogRecord rec = run_log_record("step", epoch + 1, qkv_optimizer_get_step(opt));
  rec.run = label;
  rec.lr = qkv_optimizer_get_lr(opt);
  rec.loss = loss;
  rec.grad_norm = run_log_grad_norm(params);
  rec.tokens_per_s = tokens / seconds;
  rec.elapsed_s = (g_get_monotonic_time() - t0) / 1e6;
  return run_log_add(run_log, &rec, error);
}

static gboolean
train(const QkvPoolingClassifierConfig *cfg, QkvParams *params, GArray *batches,
      const ClassifyData *data, const gchar *label, GError **error)
{
  gint max_len = opt_max_len;
  Watch watch = {.best = INFINITY};
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = (guint64)opt_seed};
  QkvShape bt = QKV_SHAPE(opt_batch, max_len), bs = QKV_SHAPE(opt_batch);
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &bt, error);
  QkvValue *lens = qkv_graph_input(g, "lens", QKV_I32, &bs, error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bs, error);
  QkvValue *logits = qkv_build_pooling_classifier(&b, cfg, tokens, lens, NULL, error);
  QkvValue *loss = qkv_cross_entropy(logits, labels, NULL, QKV_REDUCTION_MEAN, error);
  qkv_graph_backward(g, loss, error);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  opts.n_threads = opt_threads;
  if (opt_precision != NULL && g_str_equal(opt_precision, "bf16"))
    opts.precision = QKV_PRECISION_BF16, opts.bf16_activations = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &opts, error);
  QkvOptimConfig adam = qkv_optim_config_adam(opt_lr);
  g_autoptr(QkvOptimizer) opt = plan ? qkv_optimizer_new_adam(params, &adam, error) : NULL;
  if (opt == NULL) /* errors chain: the first failure is in error */
    return FALSE;
  g_autoptr(GRand) rng = g_rand_new_with_seed((guint32)opt_seed + 17);
  g_autofree gint *order = g_new(gint, batches->len);
  batch_order_init(order, (gint)batches->len);
  gint64 t0 = g_get_monotonic_time();
  for (gint epoch = 0; epoch < opt_epochs && !watch.stop; epoch++) {
    batch_shuffle(rng, order, batches->len, sizeof *order);
    double sum = 0, epoch_tokens = 0;
    gint64 epoch_start = g_get_monotonic_time();
    for (guint s = 0; s < batches->len; s++) {
      Batch *bt_ = &g_array_index(batches, Batch, order[s]);
      gint64 step_start = g_get_monotonic_time();
      if (!qkv_plan_bind(plan, "tokens", bt_->tokens, error) ||
          !qkv_plan_bind(plan, "lens", bt_->lens, error) ||
          !qkv_plan_bind(plan, "labels", bt_->labels, error) || !qkv_plan_run(plan, error) ||
          !qkv_optimizer_step(opt, error))
        return FALSE;
      double step_loss = qkv_plan_output_scalar(plan, 0);
      sum += step_loss;
      double tokens = 0;
      for (gint64 r = 0; r < qkv_tensor_numel(bt_->lens); r++)
        tokens += qkv_tensor_i32(bt_->lens)[r];
      epoch_tokens += tokens;
      if (!log_step(opt, params, label, epoch, step_loss, tokens,
                    (g_get_monotonic_time() - step_start) / 1e6, t0, error))
        return FALSE;
    }
    if (!opt_quiet)
      printf("  %s epoch %d: mean loss %.4f (%.1f s)\n", label, epoch + 1, sum / batches->len,
             (g_get_monotonic_time() - t0) / 1e6);
    RunLogRecord rec = run_log_record("epoch", epoch + 1, qkv_optimizer_get_step(opt));
    rec.run = label;
    rec.lr = opt_lr;
    rec.loss = sum / batches->len;
    rec.tokens_per_s = epoch_tokens / ((g_get_monotonic_time() - epoch_start) / 1e6);
    rec.elapsed_s = (g_get_monotonic_time() - t0) / 1e6;
    if (opt_valid > 0 && (epoch + 1) % opt_valid_every == 0 &&
        !validate(cfg, params, data, epoch, &watch, &rec, error))
      return FALSE;
    if (run_log != NULL && !run_log_add(run_log, &rec, error))
      return FALSE;
  }
  return TRUE;
}

/* The attention of each query over the words of one sentence, and the
 * model's class for it, drawn to path. */
static gboolean
draw_heatmap(const QkvPoolingClassifierConfig *cfg, QkvParams *params, const Vocab *vocab,
             const gchar *sentence, const gchar *path, GError **error)
{
  g_auto(GStrv) words = NULL;
  /* the label is the sentence's own mark, if it has one; the input never does */
  g_autofree gchar *marked = g_strconcat(sentence, ".", NULL);
  gint given = classify_sentence(sentence, NULL);
  classify_sentence(given >= 0 ? sentence : marked, &words);
  gint n = (gint)MIN(g_strv_length(words), (guint)opt_max_len);
  if (n == 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--sentence '%s' has no words to attend over", sentence);
    return FALSE;
  }
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = (guint64)opt_seed + 1};
  QkvShape bt = QKV_SHAPE(1, n), bs = QKV_SHAPE(1);
  g_autoptr(QkvTensor) tokens_t = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) lens_t = qkv_tensor_new(QKV_I32, &bs);
  qkv_tensor_i32(lens_t)[0] = classify_encode(vocab, words, n, qkv_tensor_i32(tokens_t));
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &bt, error);
  QkvValue *lens = qkv_graph_input(g, "lens", QKV_I32, &bs, error);
  QkvValue *weights = NULL;
  QkvValue *logits = qkv_build_pooling_classifier(&b, cfg, tokens, lens, &weights, error);
  QkvValue *probs = qkv_softmax(logits, error);
  const gchar *names[] = {"tokens", "lens"};
  QkvTensor *inputs[] = {tokens_t, lens_t};
  QkvValue *outs[] = {weights, probs};
  QkvTensor *res[2] = {NULL, NULL};
  if (!qkv_graph_eval(g, names, inputs, 2, outs, res, 2, error))
    return FALSE;
  gint best = 0;
  for (gint c = 1; c < N_CLASSES; c++)
    if (qkv_tensor_get(res[1], c) > qkv_tensor_get(res[1], best))
      best = c;
  g_autoptr(GPtrArray) rows = g_ptr_array_new_with_free_func(g_free);
  for (gint k = 0; k < cfg->num_queries; k++)
    g_ptr_array_add(rows, g_strdup_printf("query %d", k + 1));
  g_autoptr(GPtrArray) cols = g_ptr_array_new_with_free_func(g_free);
  for (gint t = 0; t < n; t++) {
    gint id = qkv_tensor_i32(tokens_t)[t];
    g_ptr_array_add(cols,
                    id == VOCAB_UNK ? g_strdup_printf("%s (unk)", words[t]) : g_strdup(words[t]));
  }
  g_autofree gchar *title = g_strdup_printf(
      "\"%s\": %s (p = %.2f)%s%s", sentence, class_name(best), qkv_tensor_get(res[1], best),
      given >= 0 ? ", labelled " : "", given >= 0 ? class_name(given) : "");
  gboolean ok = grid_heatmap_write(path, title, qkv_tensor_const_data(res[0]), cfg->num_queries, n,
                                   (const gchar *const *)rows->pdata,
                                   (const gchar *const *)cols->pdata, TRUE, error);
  if (ok && !opt_quiet) {
    printf("heat map of \"%s\" (%s, p = %.2f) written to %s\n", sentence, class_name(best),
           qkv_tensor_get(res[1], best), path);
    for (gint k = 0; k < cfg->num_queries; k++) {
      printf("  query %d:", k + 1);
      for (gint t = 0; t < n; t++)
        printf(" %s %.2f", words[t], qkv_tensor_get(res[0], (gint64)k * n + t));
      printf("\n");
    }
  }
  qkv_tensor_free(res[0]);
  qkv_tensor_free(res[1]);
  return ok;
}

/* Save params, load them into a fresh store, and evaluate again: *after
 * gets the accuracy of the loaded model. */
static gboolean
round_trip(const QkvPoolingClassifierConfig *cfg, QkvParams *params, const ClassifyData *data,
           double *after, GError **error)
{
  g_autofree gchar *dir = NULL;
  g_autofree gchar *path = NULL;
  if (opt_save != NULL) {
    path = g_strdup(opt_save);
  } else {
    dir = g_dir_make_tmp("qkv-classify-XXXXXX", error);
    if (dir == NULL)
      return FALSE;
    path = g_build_filename(dir, "classify.safetensors", NULL);
  }
  g_autoptr(QkvParams) restored = qkv_params_new();
  double untrained = -1;
  /* the fresh store's first graph creates its params from another seed */
  gboolean ok =
      accuracy(cfg, restored, &data->held_out, &untrained, error) &&
      save_model(path, params, data->vocab, error) &&
      qkv_checkpoint_load(path, restored, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, error) &&
      accuracy(cfg, restored, &data->held_out, after, error);
  if (dir != NULL) {
    g_remove(path);
    g_rmdir(dir);
  }
  if (ok && !opt_quiet)
    printf("a fresh store: held-out accuracy %.4f; after loading the checkpoint: %.4f\n", untrained,
           *after);
  return ok;
}

static gboolean
check_options(GError **error)
{
  /* The upper limits are far beyond useful settings; they keep a typo from
   * asking for terabytes. */
  const OptionRange ranges[] = {
      OPTION_INT("epochs", &opt_epochs, 0, 1000000),
      OPTION_INT("batch-size", &opt_batch, 1, 1000000),
      OPTION_INT("embed", &opt_embed, 1, 8192),
      OPTION_INT("key-size", &opt_key, 1, 8192),
      OPTION_INT("queries", &opt_queries, 1, 1024),
      OPTION_INT("max-sentences", &opt_max_sentences, 0, 100000000),
      OPTION_INT("max-len", &opt_max_len, 1, 4096),
      OPTION_INT("min-freq", &opt_min_freq, 1, 1000000),
      OPTION_INT("threads", &opt_threads, 0, options_max_threads()),
      OPTION_INT("valid", &opt_valid, 0, 1000000),
      OPTION_INT("valid-every", &opt_valid_every, 1, 1000000),
      OPTION_INT("early-stop", &opt_early_stop, 0, 1000000),
      OPTION_INT64("seed", &opt_seed, G_MININT64, G_MAXINT64),
      OPTION_DOUBLE_OPEN("held-out", &opt_held_out, 0, 1, TRUE, TRUE),
      OPTION_DOUBLE_OPEN("lr", &opt_lr, 0, 10, TRUE, FALSE),
      OPTION_DOUBLE_OPEN("tau", &opt_tau, 0, 1e6, TRUE, FALSE),
  };
  if (!options_check_ranges(ranges, G_N_ELEMENTS(ranges), error))
    return FALSE;
  if ((opt_save_best != NULL || opt_early_stop > 0 || opt_valid_every != 1) && opt_valid == 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--save-best, --early-stop and --valid-every act on validation; give --valid N");
    return FALSE;
  }
  if (!options_check_choice("precision", opt_precision, "fp32", "bf16", error) ||
      !options_check_choice("save-dtype", opt_save_dtype, "f32", "bf16", error))
    return FALSE;
  if (opt_sentence != NULL && opt_heatmap == NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--sentence only chooses the sentence of --heatmap");
    return FALSE;
  }
  return TRUE;
}

static gboolean
run(GError **error)
{
  if (opt_threads > 0)
    qkv_set_num_threads(opt_threads);
  g_autofree gchar *path =
      opt_data ? g_strdup(opt_data) : text_fra_eng_path(QKV_DATA_DIR, QKV_SOURCE_DATA_DIR);
  ClassifyData data;
  if (!classify_data_load(&data, path, opt_max_sentences, opt_held_out, opt_valid, opt_max_len,
                          opt_min_freq, (guint64)opt_seed, error))
    return FALSE;
  gboolean ok = FALSE;
  GArray *batches = NULL;
  QkvParams *att = NULL, *mean = NULL, *hard = NULL;

  gint train_counts[N_CLASSES] = {0}, held_counts[N_CLASSES] = {0};
  for (gint i = 0; i < data.train.n; i++)
    train_counts[data.train.labels[i]]++;
  for (gint i = 0; i < data.held_out.n; i++)
    held_counts[data.held_out.labels[i]]++;
  gint majority = 0;
  for (gint c = 1; c < N_CLASSES; c++)
    if (train_counts[c] > train_counts[majority])
      majority = c;
  if (!opt_quiet) {
    printf("%d English sentences read, %d without a final . ? or !, %d distinct inputs (%d seen "
           "with two labels: the first kept), %d cut to %d words\n",
           data.n_read, data.n_unlabelled, data.n_unique, data.n_conflicts, data.n_truncated,
           opt_max_len);
    if (data.n_no_tab > 0)
      printf("%d lines without a tab skipped (not sentence pairs)\n", data.n_no_tab);
    printf("training %d (%d . / %d ? / %d !), held out %d (%d . / %d ? / %d !), vocabulary %d\n",
           data.train.n, train_counts[0], train_counts[1], train_counts[2], data.held_out.n,
           held_counts[0], held_counts[1], held_counts[2], vocab_size(data.vocab));
    g_autofree gchar *every = opt_valid_every > 1
                                  ? g_strdup_printf("every %d epochs", opt_valid_every)
                                  : g_strdup("every epoch");
    if (data.valid.n > 0)
      printf("validation: %d sentences kept apart from training, %s\n", data.valid.n, every);
  }

  if ((opt_log != NULL || opt_plot != NULL) &&
      (run_log = run_log_new(opt_log, "qkv-classify", error)) == NULL)
    goto out;
  batches = make_batches(&data.train, opt_batch);
  QkvPoolingClassifierConfig att_cfg = model_config(&data, QKV_POOLING_ATTENTION);
  QkvPoolingClassifierConfig mean_cfg = model_config(&data, QKV_POOLING_MEAN);
  QkvPoolingClassifierConfig hard_cfg = model_config(&data, QKV_POOLING_HARD);
  att = qkv_params_new();
  mean = qkv_params_new();
  hard = qkv_params_new();
  double acc_att = 0, acc_mean = 0, acc_hard = 0, acc_loaded = -1;
  gint64 t0 = g_get_monotonic_time();
  if (!train(&att_cfg, att, batches, &data, "attention", error) ||
      !accuracy(&att_cfg, att, &data.held_out, &acc_att, error))
    goto out;
  double att_s = (g_get_monotonic_time() - t0) / 1e6;
  t0 = g_get_monotonic_time();
  if (!train(&hard_cfg, hard, batches, &data, "hard attention", error) ||
      !accuracy(&hard_cfg, hard, &data.held_out, &acc_hard, error))
    goto out;
  double hard_s = (g_get_monotonic_time() - t0) / 1e6;
  t0 = g_get_monotonic_time();
  if (!train(&mean_cfg, mean, batches, &data, "mean pooling", error) ||
      !accuracy(&mean_cfg, mean, &data.held_out, &acc_mean, error))
    goto out;
  double mean_s = (g_get_monotonic_time() - t0) / 1e6;
  double acc_majority = (double)held_counts[majority] / data.held_out.n;
  if (opt_plot != NULL) {
    if (!run_log_plot(run_log, opt_plot, "qkv-classify: attention, hard attention and mean pooling",
                      error))
      goto out;
    if (!opt_quiet)
      printf("plot written to %s\n", opt_plot);
  }

  printf("held-out accuracy on %d sentences (%d epochs, batch %d):\n", data.held_out.n, opt_epochs,
         opt_batch);
  printf("  attention pooling (%d queries) %.4f  %" G_GINT64_FORMAT " parameters, %.1f s\n",
         opt_queries, acc_att, qkv_params_numel(att), att_s);
  printf("  hard attention (%d queries)    %.4f  %" G_GINT64_FORMAT " parameters, %.1f s\n",
         opt_queries, acc_hard, qkv_params_numel(hard), hard_s);
  printf("  mean pooling                  %.4f  %" G_GINT64_FORMAT " parameters, %.1f s\n",
         acc_mean, qkv_params_numel(mean), mean_s);
  printf("  majority class (%s)     %.4f\n", class_name(majority), acc_majority);

  if (!round_trip(&att_cfg, att, &data, &acc_loaded, error))
    goto out;
  if (save_dtype() == QKV_CHECKPOINT_DTYPE_BF16) {
    /* rounded weights score as they score: no equality to demand */
    printf("loaded from the bf16 checkpoint: %.4f (trained float32 weights: %.4f)\n", acc_loaded,
           acc_att);
  } else if (acc_loaded != acc_att) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "the loaded checkpoint gives accuracy %.6f, not %.6f", acc_loaded, acc_att);
    goto out;
  } else {
    printf("loaded from the checkpoint: %.4f, the same\n", acc_loaded);
  }
  if (opt_heatmap != NULL &&
      !draw_heatmap(&att_cfg, att, data.vocab,
                    opt_sentence ? opt_sentence : "do you know what time it is", opt_heatmap,
                    error))
    goto out;
  ok = TRUE;
out:
  if (batches != NULL)
    g_array_unref(batches);
  qkv_params_free(att);
  qkv_params_free(mean);
  qkv_params_free(hard);
  classify_data_clear(&data);
  g_clear_pointer(&run_log, run_log_free);
  return ok;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context = g_option_context_new("- sentence types by attention pooling");
  g_option_context_set_summary(
      context,
      "Learns whether an English sentence of the shipped Tatoeba pairs is a statement (.), a\n"
      "question (?) or an exclamation (!) from its words alone (the punctuation is removed),\n"
      "with learned attention queries over the words, and compares hard attention (one word\n"
      "per query), mean pooling and the majority class on held-out sentences. The attention\n"
      "model goes through a checkpoint and must score the same after loading.\n\n"
      "Data: the Tatoeba Project (tatoeba.org) via www.manythings.org/anki, CC BY 2.0; see\n"
      "fra-eng/_about.txt beside fra.txt.gz.");
  add_option_groups(context);
  if (!g_option_context_parse(context, &argc, &argv, &error) || !check_options(&error)) {
    fprintf(stderr, "qkv-classify: %s\n", error->message);
    return 2;
  }
  if (argc > 1) {
    fprintf(stderr, "qkv-classify: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-classify");
    return EXIT_SUCCESS;
  }
  if (!run(&error)) {
    fprintf(stderr, "qkv-classify: %s\n", error->message);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
