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
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <qkv/qkv.h>
#include <qkv/qkv-optim.h>

#include "../common/batch.h"
#include "../common/program-version.h"
#include "../common/spm.h"
#include "../common/text.h"
#include "distributed.h"
#include "evaluate.h"
#include "options.h"
#include "tied.h"
#include "trainer.h"

static ModelPlan *
train_plan(Trainer *tr, GError **error)
{
  if (tr->train.plan == NULL) {
    /* compiled for this process's share of a full batch; smaller shares
     * (the last batch) run on it too */
    gint first_row, shard;
    seq2seq_dist_shard(MIN(tr->opt->batch, tr->data.n), &first_row, &shard);
    gint64 part_first, rows; /* the first micro-batch is the largest */
    qkv_split_range(shard, tr->opt->accumulate, 0, &part_first, &rows);
    if (!model_plan_build(&tr->train, &tr->cfg, tr->params, (gint)rows, TRUE, tr->opt->threads,
                          error)) {
      model_plan_clear(&tr->train);
      return NULL;
    }
    if (tr->opt->accumulate > 1 && tr->accumulator == NULL) {
      tr->accumulator = qkv_grad_accumulator_new(tr->params, error);
      if (tr->accumulator == NULL)
        return NULL;
    }
    /* model_plan_build's seed, made this rank's own */
    seq2seq_dist_reseed(tr->train.plan, tr->cfg.seed * 1000003u + (guint64)rows);
  }
  return &tr->train;
}

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

/* What one optimizer step measured. */
typedef struct {
  double loss, tokens, norm;
} StepResult;

/* One optimizer step over the global batch order[first..]: this process's
 * rows as --accumulate micro-batches, the all-reduce (--distributed),
 * clipping and the update. */
static gboolean
train_step(Trainer *tr, const BatchBuffers *buf, const gint *order, gint first, gint epoch,
           StepResult *result, GError **error)
{
  /* --distributed: this process's rows of the global batch, run as
   * --accumulate micro-batches. Their losses are summed as floats, as
   * the all-reduce sums the ranks' losses, so that N micro-batches
   * compute what N processes compute. */
  gint global_batch = MIN(tr->opt->batch, tr->data.n - first), shard_first, shard;
  seq2seq_dist_shard(global_batch, &shard_first, &shard);
  float loss_of_parts = 0;
  double step_tokens = 0;
  gint parts_run = 0;
  for (gint part = 0; part < tr->opt->accumulate; part++) {
    gint64 offset, rows;
    qkv_split_range(shard, tr->opt->accumulate, part, &offset, &rows);
    if (rows == 0)
      continue;
    double part_loss;
    guint64 plan_step = (guint64)tr->global_step * (guint64)tr->opt->accumulate + (guint64)part;
    if (!train_micro_batch(tr, buf, order + first + shard_first + offset, (gint)rows, plan_step,
                           &part_loss, &step_tokens, error))
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
  seq2seq_step_log(tr->global_step + 1, step_loss / step_tokens);
  /* Once the loss is NaN or Inf the weights are too (or soon will be):
   * going on would train on garbage and save it. */
  if (!isfinite(step_loss)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "the loss became %s at epoch %d, step %" G_GINT64_FORMAT
                "; stopping (try a smaller --lr, or --clip)",
                isnan(step_loss) ? "NaN" : "infinite", epoch + 1, tr->global_step + 1);
    return FALSE;
  }
  if (tr->schedule != NULL)
    qkv_schedule_step(tr->schedule, tr->optimizer);
  double norm = NAN;
  if (tr->log != NULL && tr->opt->clip <= 0)
    norm = run_log_grad_norm(tr->params);
  if (tr->opt->clip > 0
          ? !qkv_optimizer_step_clipped(tr->optimizer, tr->opt->clip, tr->clip_rule, &norm, error)
          : !qkv_optimizer_step(tr->optimizer, error))
    return FALSE;
  tr->global_step++;
  *result = (StepResult){step_loss, step_tokens, norm};
  return TRUE;
}

static gboolean
log_step(Trainer *tr, gint epoch, const StepResult *r, double seconds, GError **error)
{
  if (tr->log == NULL)
    return TRUE;
  RunLogRecord rec = run_log_record("step", epoch + 1, tr->global_step);
  rec.lr = qkv_optimizer_get_lr(tr->optimizer);
  rec.loss = r->loss / r->tokens;
  rec.grad_norm = r->norm;
  rec.tokens_per_s = r->tokens / seconds;
  rec.elapsed_s = (g_get_monotonic_time() - tr->start_time) / 1e6;
  return run_log_add(tr->log, &rec, error);
}

/* The epoch's record in --log, and --plot redrawn (at the progress lines'
 * pace, at most every two seconds, so that it can be watched without
 * slowing training down; after training it is drawn in full). */
static gboolean
log_epoch(Trainer *tr, gint epoch, gboolean redraw, GError **error)
{
  if (tr->log == NULL)
    return TRUE;
  RunLogRecord rec = run_log_record("epoch", epoch + 1, tr->global_step);
  rec.lr = qkv_optimizer_get_lr(tr->optimizer);
  rec.loss = tr->last_loss;
  rec.tokens_per_s = tr->last_tokens_per_s;
  rec.elapsed_s = (g_get_monotonic_time() - tr->start_time) / 1e6;
  if (tr->valid.measured) {
    rec.valid_loss = tr->valid.last_loss;
    rec.valid_bleu = tr->valid.last_bleu;
  }
  if (!run_log_add(tr->log, &rec, error))
    return FALSE;
  gint64 now = g_get_monotonic_time();
  if (!redraw || tr->opt->plot == NULL || now - tr->plotted_at < 2 * G_USEC_PER_SEC)
    return TRUE;
  tr->plotted_at = now;
  return trainer_plot(tr, error);
}

/* The validation figures of the progress line, or "" when none were
 * measured this epoch; free with g_free(). */
static gchar *
valid_figures(const Trainer *tr, gboolean tty)
{
  const Validation *v = &tr->valid;
  if (!v->measured)
    return g_strdup("");
  g_autofree gchar *bleu = isnan(v->last_bleu) ? g_strdup("")
                           : tty               ? g_strdup_printf("  BLEU %.2f", v->last_bleu)
                                               : g_strdup_printf(", BLEU %.2f", v->last_bleu);
  const gchar *best = v->since_best == 0 ? " (best)" : "";
  return tty ? g_strdup_printf("  valid loss %.3f%s%s", v->last_loss, bleu, best)
             : g_strdup_printf(", valid loss %.3f%s%s", v->last_loss, bleu, best);
}

/* After an epoch: --save-every, validation, the log, the progress line. */
static gboolean
end_epoch(Trainer *tr, gint epoch, gint epochs, gint64 start, gint first_epoch, gboolean tty,
          GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  tr->epochs_done = epoch + 1;
  if (o->save != NULL && o->save_every > 0 && (epoch + 1) % o->save_every == 0 &&
      seq2seq_dist_is_root() && !trainer_save(tr, o->save, error))
    return FALSE;
  tr->valid.measured = FALSE;
  if (tr->valid.on && seq2seq_dist_is_root() && (epoch + 1) % o->valid_every == 0 &&
      !trainer_validate(tr, error))
    return FALSE;
  gboolean last = epoch + 1 == epochs || tr->valid.stop;
  gboolean line = (epoch + 1) % 10 == 0 || last || tr->valid.measured;
  if (!log_epoch(tr, epoch, line, error))
    return FALSE;
  double elapsed = (g_get_monotonic_time() - start) / 1e6;
  double left = elapsed / (epoch + 1 - first_epoch) * (epochs - epoch - 1);
  gchar eta[32];
  format_duration(eta, sizeof eta, left);
  g_autofree gchar *valid = valid_figures(tr, tty);
  if (tty) {
    fprintf(tr->out, "\repoch %d/%d  loss %.3f%s  %.0f tokens/sec  %s left   ", epoch + 1, epochs,
            tr->last_loss, valid, tr->last_tokens_per_s, eta);
    fflush(tr->out);
  } else if (!o->quiet && line) {
    fprintf(tr->out, "epoch %d/%d loss %.3f%s, %.0f tokens/sec, %s left\n", epoch + 1, epochs,
            tr->last_loss, valid, tr->last_tokens_per_s, eta);
  }
  if (tr->valid.stop && !o->quiet)
    fprintf(tr->out,
            "%searly stop after epoch %d: %d validation%s without a lower loss (best %.3f after "
            "epoch %d)%s",
            tty ? "\n" : "", epoch + 1, tr->valid.since_best, tr->valid.since_best > 1 ? "s" : "",
            tr->valid.best_loss, tr->valid.best_epoch, tty ? "" : "\n");
  return TRUE;
}

static gboolean
train(Trainer *tr, gint epochs, GError **error)
{
  const gint n = tr->data.n, T = tr->data.num_steps;
  g_autofree gint *order = g_new(gint, n);
  gint batch_max = MIN(tr->opt->batch, n);
  QkvShape bt = QKV_SHAPE(batch_max, T), bs = QKV_SHAPE(batch_max);
  g_autoptr(QkvTensor) src = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) src_valid = qkv_tensor_new(QKV_I32, &bs);
  g_autoptr(QkvTensor) dec_in = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) labels = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvTensor) tgt_valid = qkv_tensor_new(QKV_I32, &bs);
  BatchBuffers buffers = {src, src_valid, dec_in, labels, tgt_valid};
  gboolean tty = isatty(fileno(tr->out)) && !tr->opt->quiet;
  gint64 start = g_get_monotonic_time();
  gint first_epoch = tr->epochs_done;
  tr->start_time = start;

  for (gint epoch = tr->epochs_done; epoch < epochs && !tr->valid.stop; epoch++) {
    gint64 epoch_start = g_get_monotonic_time();
    double loss_sum = 0, tokens = 0;
    shuffle(order, n, tr->cfg.seed, epoch);
    for (gint first = 0; first < n; first += tr->opt->batch) {
      gint64 step_start = g_get_monotonic_time();
      StepResult step;
      if (!train_step(tr, &buffers, order, first, epoch, &step, error) ||
          !log_step(tr, epoch, &step, (g_get_monotonic_time() - step_start) / 1e6, error))
        return FALSE;
      loss_sum += step.loss;
      tokens += step.tokens;
    }
    double epoch_s = (g_get_monotonic_time() - epoch_start) / 1e6;
    tr->last_loss = loss_sum / tokens;
    tr->last_tokens_per_s = tokens / epoch_s;
    if (!end_epoch(tr, epoch, epochs, start, first_epoch, tty, error))
      return FALSE;
  }
  if (tty)
    fprintf(tr->out, "\n");
  return TRUE;
}

gboolean
trainer_plot(Trainer *tr, GError **error)
{
  if (tr->log == NULL || tr->opt->plot == NULL)
    return TRUE;
  g_autofree gchar *title = model_title(&tr->cfg);
  g_autofree gchar *full = g_strdup_printf("qkv-seq2seq: %s on %s", title, tr->data_name);
  return run_log_plot(tr->log, tr->opt->plot, full, error);
}

gchar *
trainer_translate(Trainer *tr, const gchar *sentence, QkvTensor **weights_out, gchar *tokens_out[2],
                  gint *src_len, gint *out_len, GError **error)
{
  return translator_sentence(&tr->translator, &tr->cfg, tr->params, &tr->data, sentence,
                             weights_out, tokens_out, src_len, out_len, error);
}

/* The model's configuration from the options and the data. */
static void
trainer_configure(Trainer *tr)
{
  const Seq2seqOptions *o = tr->opt;
  tr->cfg.src_vocab = vocab_size(tr->data.src_vocab);
  tr->cfg.tgt_vocab = vocab_size(tr->data.tgt_vocab);
  tr->cfg.num_steps = o->steps;
  tr->cfg.num_hiddens = o->hidden;
  tr->cfg.embed_size = o->hidden;
  tr->cfg.ffn_hiddens = o->ffn;
  tr->cfg.num_heads = o->heads;
  tr->cfg.num_layers = o->layers;
  tr->cfg.dropout = o->dropout;
  tr->cfg.label_smoothing = o->label_smoothing;
  tr->cfg.precision = o->precision;
  tr->clip_rule =
      o->clip_rule != NULL && g_str_equal(o->clip_rule, "d2l") ? QKV_CLIP_D2L : QKV_CLIP_TORCH;
  tr->cfg.seed = (guint64)o->seed;
  luong_options_apply(&o->luong, &tr->cfg, SEQ2SEQ_MAX_STEPS, NULL); /* checked when parsed */
  tr->cfg.tie_embeddings = o->tie ? tied_mode(&tr->data) : QKV_TIE_NONE;
}

/* --vocab sentencepiece: the pairs in subword pieces of the model of
 * --spm-model, of the checkpoint --resume continues, or trained here (and
 * saved to --spm-save or beside --save). */
static gboolean
load_subwords(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  g_autofree gchar *save = o->spm_save != NULL ? g_strdup(o->spm_save)
                           : o->save != NULL   ? g_strconcat(o->save, ".spm.model", NULL)
                                               : NULL;
  const gchar *type = o->spm_type != NULL ? o->spm_type : "unigram";
  Seq2SeqSubwords sw = {.vocab_size = o->spm_vocab_size, .type = type};
  if (o->spm_model != NULL) {
    sw.model = spm_load(o->spm_model, error);
    tr->subwords_from = g_strdup_printf("from %s", o->spm_model);
  } else if (o->resume != NULL) {
    sw.model = trainer_checkpoint_subwords(o->resume, error);
    tr->subwords_from = g_strdup_printf("from %s", o->resume);
  } else {
    sw.save = save;
    tr->subwords_from =
        g_strdup_printf("%s, trained on both sides of the training pairs%s%s", type,
                        save != NULL ? ", saved to " : "", save != NULL ? save : "");
  }
  if ((o->spm_model != NULL || o->resume != NULL) && sw.model == NULL)
    return FALSE;
  gboolean ok = seq2seq_data_load_nmt_subwords(&tr->data, data_path, o->num_examples, o->steps,
                                               o->max_len, &sw, &tr->load, error);
  spm_free(sw.model); /* left only where loading failed before taking it */
  return ok;
}

/* Everything before training: the data, the parameters (created by
 * compiling the training plan), the optimizer, and what --distributed,
 * --step-losses, --resume and --warmup add. */
static gboolean
trainer_setup(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  if (o->reverse) {
    if (!seq2seq_data_reverse(&tr->data, o->reverse_size, o->steps, o->reverse_vocab,
                              (guint64)o->seed, error))
      return FALSE;
  } else if (o->subwords) {
    if (!load_subwords(tr, data_path, error))
      return FALSE;
  } else if (!seq2seq_data_load_nmt_full(&tr->data, data_path, o->num_examples, o->steps,
                                         o->min_freq, o->max_len, &tr->load, error)) {
    return FALSE;
  }
  trainer_configure(tr);
  if (!trainer_validation_setup(tr, data_path, error))
    return FALSE;
  tr->params = qkv_params_new();
  translator_init(&tr->translator, o->steps, 1, o->beam, o->length_penalty, o->threads);
  tr->translator.cross_layer = o->heatmap_block > 0 ? o->heatmap_block - 1 : -1;
  if (o->distributed) {
    if (!seq2seq_dist_start(o, &tr->cfg, &tr->data, error))
      return FALSE;
    if (o->threads == 0)
      qkv_set_num_threads(seq2seq_dist_default_threads());
  }
  if (o->step_losses != NULL && !seq2seq_step_log_open(o->step_losses, error))
    return FALSE;
  if ((o->log != NULL || o->plot != NULL) && seq2seq_dist_is_root() &&
      (tr->log = run_log_new(o->log, "qkv-seq2seq", error)) == NULL)
    return FALSE;

  /* building the training plan creates and initialises every parameter */
  if (train_plan(tr, error) == NULL)
    return FALSE;
  QkvOptimConfig oc = qkv_optim_config_adam(o->lr);
  tr->optimizer = qkv_optimizer_new_adam(tr->params, &oc, error);
  if (tr->optimizer == NULL)
    return FALSE;
  if (o->resume != NULL && !trainer_resume(tr, o->resume, error))
    return FALSE;
  if (o->warmup > 0) {
    /* the paper's factor · d^-0.5 · min(step^-0.5, step · warmup^-1.5),
     * with the factor that makes its peak (at step = warmup) --lr */
    double factor = o->lr * sqrt((double)o->hidden * (double)o->warmup);
    tr->schedule = qkv_schedule_new_warmup(factor, o->hidden, o->warmup);
    qkv_schedule_set_position(tr->schedule, tr->global_step);
  }
  /* --distributed: every rank starts from rank 0's weights and state */
  return seq2seq_dist_agree_position(tr->epochs_done, tr->global_step, error) &&
         seq2seq_dist_broadcast(tr->params, tr->optimizer, error);
}

static void
trainer_clear(Trainer *tr)
{
  translator_clear(&tr->translator);
  model_plan_clear(&tr->train);
  qkv_grad_accumulator_free(tr->accumulator);
  qkv_schedule_free(tr->schedule);
  qkv_optimizer_free(tr->optimizer);
  qkv_params_free(tr->params);
  validation_clear(&tr->valid);
  seq2seq_data_clear(&tr->data);
  seq2seq_step_log_close();
  run_log_free(tr->log);
  g_free(tr->data_name);
  g_free(tr->subwords_from);
}

/* What validation measures, when it is on. */
static void
print_validation_setup(Trainer *tr)
{
  const Seq2seqOptions *o = tr->opt;
  if (!tr->valid.on || o->quiet || !seq2seq_dist_is_root())
    return;
  g_autofree gchar *every = o->valid_every > 1 ? g_strdup_printf("every %d epochs", o->valid_every)
                                               : g_strdup("every epoch");
  g_autofree gchar *from =
      o->reverse      ? g_strdup("held-out sequences")
      : o->valid_data ? g_strdup_printf("pairs of %s", o->valid_data)
                      : g_strdup_printf("pairs after the %d training lines", o->num_examples + 1);
  g_autofree gchar *stop =
      o->early_stop > 0
          ? g_strdup_printf("; early stop after %d without improvement", o->early_stop)
          : g_strdup("");
  fprintf(tr->out, "validation: %d %s, %s (loss%s)%s%s%s\n", tr->valid.ids.n, from, every,
          o->reverse ? "" : " and greedy BLEU", o->save_best ? "; best kept in " : "",
          o->save_best ? o->save_best : "", stop);
}

/* The lines before training: the model and data, the optimizer, and what
 * --tie-embeddings and --distributed change. */
static gboolean
print_setup(Trainer *tr, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  if (!o->quiet) {
    g_autofree gchar *title = model_title(&tr->cfg);
    fprintf(tr->out,
            "%s on %s: %d pairs, vocabularies %d/%d, %" G_GINT64_FORMAT " parameters, %d threads\n",
            title, tr->data_name, tr->data.n, vocab_size(tr->data.src_vocab),
            vocab_size(tr->data.tgt_vocab), qkv_params_numel(tr->params),
            o->threads > 0 ? o->threads : qkv_get_num_threads());
    /* fp32 (the default) prints nothing, so that its output stays as it was */
    if (o->precision == QKV_PRECISION_BF16) {
      const gchar *why;
      gboolean native = qkv_bf16_native(&why);
      fprintf(tr->out, "precision: bf16 matrix products (%s: %s), float32 everything else\n",
              native ? "native" : "emulated", why);
    }
  }
  if (!o->quiet) {
    g_autofree gchar *schedule =
        o->warmup > 0 ? g_strdup_printf(", warm-up over %d steps then 1/sqrt(step)", o->warmup)
                      : g_strdup("");
    g_autofree gchar *clip =
        o->clip > 0 ? g_strdup_printf("clipping at %g by %s", o->clip,
                                      tr->clip_rule == QKV_CLIP_D2L
                                          ? "the book's rule (grad_clipping: norm / |g|)"
                                          : "PyTorch's rule (clip_grad_norm_: norm / (|g| + 1e-6))")
                    : g_strdup("no clipping");
    fprintf(tr->out, "training: Adam lr %g%s, %s, label smoothing %g\n", o->lr, schedule, clip,
            o->label_smoothing);
  }
  if (tr->data.subwords != NULL && !o->quiet)
    fprintf(tr->out, "subwords: one SentencePiece model of %d pieces for both languages (%s)\n",
            vocab_size(tr->data.src_vocab), tr->subwords_from);
  g_autofree gchar *skipped = seq2seq_load_report_describe(&tr->load, o->max_len);
  if (skipped != NULL && !o->quiet)
    fprintf(tr->out, "data: %s\n", skipped);
  print_validation_setup(tr);
  gint64 untied = 0;
  if (o->tie && !tied_untied_count(&tr->cfg, &untied, error))
    return FALSE;
  if (o->tie && !o->quiet)
    fprintf(tr->out,
            "tied embeddings: %s; %" G_GINT64_FORMAT " parameters, %" G_GINT64_FORMAT
            " without --tie-embeddings\n",
            tied_mode_name(tr->cfg.tie_embeddings), qkv_params_numel(tr->params), untied);
  if (!o->quiet && seq2seq_dist_active())
    fprintf(tr->out, "distributed: %d processes, each trains on its share of every batch of %d\n",
            seq2seq_dist_world_size(), MIN(o->batch, tr->data.n));
  return TRUE;
}

/* Training up to --epochs (nothing when a resumed run is there already),
 * then --save. */
static gboolean
train_and_save(Trainer *tr, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  gint64 t0 = g_get_monotonic_time();
  gboolean trained = tr->epochs_done < o->epochs;
  if (trained && !train(tr, o->epochs, error)) {
    /* the curves up to the failure (a loss that became NaN) help to see why */
    trainer_plot(tr, NULL);
    return FALSE;
  }
  double train_s = (g_get_monotonic_time() - t0) / 1e6;
  if (trained)
    fprintf(tr->out, "loss %.3f, %.1f tokens/sec (last epoch; %.1f s for %d epochs)\n",
            tr->last_loss, tr->last_tokens_per_s, train_s,
            tr->valid.stop ? tr->epochs_done : o->epochs);
  if (trained && !trainer_plot(tr, error))
    return FALSE;
  if (trained && o->plot != NULL && !o->quiet && tr->log != NULL)
    fprintf(tr->out, "plot written to %s\n", o->plot);
  if (o->save != NULL && seq2seq_dist_is_root()) {
    if (!trainer_save(tr, o->save, error))
      return FALSE;
    if (!o->quiet)
      fprintf(tr->out, "saved %s\n", o->save);
  }
  return TRUE;
}

static gboolean
run(const Seq2seqOptions *o, GError **error)
{
  /* --translate - keeps stdout for the translations */
  Trainer tr = {.opt = o, .out = o->translate_stdin ? stderr : stdout};
  g_autofree gchar *data_path =
      o->data ? g_strdup(o->data) : text_fra_eng_path(QKV_DATA_DIR, QKV_SOURCE_DATA_DIR);
  tr.data_name = o->reverse ? g_strdup("reverse task")
                 : o->data  ? g_path_get_basename(o->data)
                            : g_strdup("fra-eng");
  tr.cfg.kind = o->kind;
  if (o->threads > 0)
    qkv_set_num_threads(o->threads);
  if (!seq2seq_options_check_paths(o, error))
    return FALSE;
  /* rank 0 translates and reports */
  gboolean ok = trainer_setup(&tr, data_path, error) && print_setup(&tr, error) &&
                train_and_save(&tr, error) &&
                seq2seq_dist_leave_trained(tr.epochs_done, tr.global_step, error) &&
                (!seq2seq_dist_is_root() || seq2seq_evaluate(&tr, data_path, error));
  trainer_clear(&tr);
  return ok;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  Seq2seqOptions options;
  seq2seq_options_init(&options);
  if (!seq2seq_options_parse(&options, &argc, &argv, &error)) {
    g_printerr("qkv-seq2seq: %s\n", error->message);
    seq2seq_options_clear(&options);
    return 2;
  }
  if (options.version) {
    program_print_version("qkv-seq2seq");
    seq2seq_options_clear(&options);
    return 0;
  }
  gboolean ok = run(&options, &error);
  if (!ok)
    seq2seq_dist_print_error("qkv-seq2seq", error);
  /* after a failed collective this leaves MPI as it is (finalizing could
   * wait for a dead rank) */
  seq2seq_dist_finish(ok ? NULL : error);
  seq2seq_options_clear(&options);
  return ok ? 0 : 1;
}
