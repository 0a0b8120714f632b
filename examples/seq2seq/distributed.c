/* distributed.c: the --distributed mode of qkv-seq2seq (see distributed.h). */
#include "distributed.h"

#include <stdio.h>
#include <string.h>
#include <qkv/qkv-dist.h>

static QkvDist *dist = NULL;
static FILE *step_log = NULL;

/* The shortest text that reads back as x: 0.005, not 0.0050000000000000001. */
static gchar *
number_text(double x)
{
  gchar buf[G_ASCII_DTOSTR_BUF_SIZE], format[8];
  for (gint digits = 6; digits <= 17; digits++) {
    g_snprintf(format, sizeof format, "%%.%dg", digits);
    g_ascii_formatd(buf, sizeof buf, format, x);
    if (g_ascii_strtod(buf, NULL) == x)
      break;
  }
  return g_strdup(buf);
}

/* The options whose values every rank must share, as text: those that set
 * the model, the data, the optimizer, the schedule or the order of the
 * examples. (The per-rank ones: --threads, and the outputs of rank 0.) */
static gboolean
agree_options(const Seq2seqOptions *o, GError **error)
{
  gboolean reverse = o->reverse, transformer = o->kind == MODEL_TRANSFORMER;
  gboolean luong = o->kind == MODEL_LUONG;
  const LuongOptions *lo = &o->luong;
  struct {
    const gchar *name;
    gchar *value; /* NULL: does not apply to this run's task or model */
  } options[] = {
      {"--task", g_strdup(reverse ? "reverse" : "fra")},
      {"--model", g_strdup(model_kind_name(o->kind))},
      {"--epochs", g_strdup_printf("%d", o->epochs)},
      {"--batch-size", g_strdup_printf("%d", o->batch)},
      {"--accumulate", g_strdup_printf("%d", o->accumulate)},
      {"--num-steps", g_strdup_printf("%d", o->steps)},
      {"--num-examples", reverse ? NULL : g_strdup_printf("%d", o->num_examples)},
      {"--reverse-size", reverse ? g_strdup_printf("%d", o->reverse_size) : NULL},
      {"--reverse-vocab", reverse ? g_strdup_printf("%d", o->reverse_vocab) : NULL},
      {"--seed", g_strdup_printf("%" G_GINT64_FORMAT, o->seed)},
      {"--lr", number_text(o->lr)},
      {"--warmup", g_strdup_printf("%d", o->warmup)},
      {"--clip", number_text(o->clip)},
      {"--clip-rule", g_strdup(o->clip_rule != NULL ? o->clip_rule : "torch")},
      {"--label-smoothing", number_text(o->label_smoothing)},
      {"--dropout", number_text(o->dropout)},
      {"--hidden", g_strdup_printf("%d", o->hidden)},
      {"--layers", g_strdup_printf("%d", o->layers)},
      {"--heads", transformer ? g_strdup_printf("%d", o->heads) : NULL},
      {"--ffn", transformer ? g_strdup_printf("%d", o->ffn) : NULL},
      {"--tie-embeddings", transformer ? g_strdup(o->tie ? "on" : "off") : NULL},
      {"--score", luong ? g_strdup(lo->score != NULL ? lo->score : "general") : NULL},
      {"--local-m", luong ? g_strdup(lo->local_m != NULL ? lo->local_m : "off") : NULL},
      {"--local-p", luong ? g_strdup(lo->local_p != NULL ? lo->local_p : "off") : NULL},
      {"--input-feeding", luong ? g_strdup(lo->input_feeding ? "on" : "off") : NULL},
  };
  /* every difference, one per line, not only the first: a mismatch leaves
   * the group usable, and one run should show everything to fix */
  GString *differences = g_string_new(NULL);
  gint n_differences = 0;
  gboolean ok = TRUE;
  for (guint i = 0; i < G_N_ELEMENTS(options); i++) {
    g_autoptr(GError) local = NULL;
    g_autofree gchar *what = g_strdup_printf("option %s", options[i].name);
    /* every rank agrees on every option, in the same order, even where it
     * does not apply, as the ranks' task or model may differ too */
    const gchar *value = options[i].value != NULL ? options[i].value : "(unused)";
    if (ok && !qkv_dist_agree(dist, what, value, &local)) {
      if (g_error_matches(local, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH)) {
        g_string_append_printf(differences, "\n  %s", local->message);
        n_differences++;
      } else {
        g_propagate_error(error, g_steal_pointer(&local));
        ok = FALSE;
      }
    }
    g_free(options[i].value);
  }
  if (ok && n_differences > 0) {
    /* one difference on the line itself, several below a heading */
    g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH, "%s%s",
                n_differences > 1 ? "the ranks were given different options:" : "",
                differences->str + (n_differences > 1 ? 0 : 3));
    ok = FALSE;
  }
  g_string_free(differences, TRUE);
  return ok;
}

/* "N tokens, SHA-256 0123456789abcdef" */
static gchar *
vocab_fingerprint(const Vocab *vocab)
{
  g_autofree gchar *tokens = vocab_join(vocab);
  g_autofree gchar *sha = g_compute_checksum_for_string(G_CHECKSUM_SHA256, tokens, -1);
  return g_strdup_printf("%d tokens, SHA-256 %.16s", vocab_size(vocab), sha);
}

/* "N pairs, SHA-256 0123456789abcdef" over every id and length */
static gchar *
data_fingerprint(const Seq2SeqData *data)
{
  g_autoptr(GChecksum) sha = g_checksum_new(G_CHECKSUM_SHA256);
  const gsize ids = (gsize)data->n * (gsize)data->num_steps * sizeof(gint32);
  const gsize lengths = (gsize)data->n * sizeof(gint32);
  g_checksum_update(sha, (const guchar *)&data->n, sizeof data->n);
  g_checksum_update(sha, (const guchar *)&data->num_steps, sizeof data->num_steps);
  g_checksum_update(sha, (const guchar *)data->src, (gssize)ids);
  g_checksum_update(sha, (const guchar *)data->src_valid, (gssize)lengths);
  g_checksum_update(sha, (const guchar *)data->tgt, (gssize)ids);
  g_checksum_update(sha, (const guchar *)data->tgt_valid, (gssize)lengths);
  return g_strdup_printf("%d pairs, SHA-256 %.16s", data->n, g_checksum_get_string(sha));
}

/* What the options make of the model, as a whole: what no single option
 * shows (the tying the data allows, the Luong attention). */
static gchar *
model_fingerprint(const ModelConfig *cfg)
{
  g_autofree gchar *title = model_title(cfg);
  g_autofree gchar *dropout = number_text(cfg->dropout);
  g_autofree gchar *smoothing = number_text(cfg->label_smoothing);
  return g_strdup_printf("%s, vocabularies %" G_GINT64_FORMAT "/%" G_GINT64_FORMAT
                         ", %d steps, hidden %" G_GINT64_FORMAT ", embedding %" G_GINT64_FORMAT
                         ", FFN %" G_GINT64_FORMAT ", %d heads, %d layers, tying %d, dropout %s, "
                         "label smoothing %s, seed %" G_GUINT64_FORMAT,
                         title, cfg->src_vocab, cfg->tgt_vocab, cfg->num_steps, cfg->num_hiddens,
                         cfg->embed_size, cfg->ffn_hiddens, cfg->num_heads, cfg->num_layers,
                         (int)cfg->tie_embeddings, dropout, smoothing, cfg->seed);
}

static gboolean
agree_setup(const Seq2seqOptions *o, const ModelConfig *cfg, const Seq2SeqData *data,
            GError **error)
{
  g_autofree gchar *model = model_fingerprint(cfg);
  g_autofree gchar *src = vocab_fingerprint(data->src_vocab);
  g_autofree gchar *tgt = vocab_fingerprint(data->tgt_vocab);
  g_autofree gchar *pairs = data_fingerprint(data);
  return agree_options(o, error) && qkv_dist_agree(dist, "the model configuration", model, error) &&
         qkv_dist_agree(dist, "the source vocabulary", src, error) &&
         qkv_dist_agree(dist, "the target vocabulary", tgt, error) &&
         qkv_dist_agree(dist, "the training data", pairs, error);
}

gboolean
seq2seq_dist_start(const Seq2seqOptions *o, const ModelConfig *cfg, const Seq2SeqData *data,
                   GError **error)
{
  dist = qkv_dist_init(NULL, NULL, error);
  if (dist == NULL)
    return FALSE;
  /* mpirun stops the other ranks with SIGTERM when one dies: say why */
  qkv_dist_report_sigterm(dist, "qkv-seq2seq");
  if (!qkv_dist_check_batch(dist, MIN(o->batch, data->n), error) ||
      !agree_setup(o, cfg, data, error))
    return FALSE;
  /* one report, not one per rank */
  if (!qkv_dist_is_root(dist) && freopen("/dev/null", "w", stdout) == NULL)
    g_warning("rank %d: cannot silence stdout", qkv_dist_rank(dist));
  return TRUE;
}

gboolean
seq2seq_dist_agree_position(gint epochs_done, gint64 global_step, GError **error)
{
  if (dist == NULL)
    return TRUE;
  g_autofree gchar *position =
      g_strdup_printf("epoch %d step %" G_GINT64_FORMAT, epochs_done, global_step);
  return qkv_dist_agree(dist, "the training position (--resume)", position, error);
}

gboolean
seq2seq_dist_leave_trained(gint epochs_done, gint64 global_step, GError **error)
{
  if (dist == NULL)
    return TRUE;
  g_autofree gchar *reason = g_strdup_printf(
      "finished training after %d epochs, step %" G_GINT64_FORMAT, epochs_done, global_step);
  return qkv_dist_leave(dist, reason, error);
}

void
seq2seq_dist_finish(const GError *error)
{
  /* the others learn at their next collective why this rank stopped; the
   * outcome changes nothing here, this rank has reported its own error */
  if (dist != NULL && error != NULL)
    qkv_dist_leave(dist, error->message, NULL);
  g_clear_pointer(&dist, qkv_dist_free);
}

gboolean
seq2seq_dist_active(void)
{
  return dist != NULL;
}

gboolean
seq2seq_dist_is_root(void)
{
  return dist == NULL || qkv_dist_is_root(dist);
}

gint
seq2seq_dist_rank(void)
{
  return dist != NULL ? qkv_dist_rank(dist) : 0;
}

gint
seq2seq_dist_world_size(void)
{
  return dist != NULL ? qkv_dist_world_size(dist) : 1;
}

void
seq2seq_dist_reseed(QkvPlan *plan, guint64 seed)
{
  if (dist != NULL && qkv_dist_rank(dist) > 0)
    qkv_plan_set_seed(plan,
                      seed + G_GUINT64_CONSTANT(0x9E3779B97F4A7C15) * (guint64)qkv_dist_rank(dist));
}

gint
seq2seq_dist_default_threads(void)
{
  gint local = dist != NULL ? qkv_dist_local_size(dist) : 1;
  return MAX(1, (gint)g_get_num_processors() / local);
}

void
seq2seq_dist_shard(gint batch, gint *offset, gint *count)
{
  gint64 off = 0, n = batch;
  if (dist != NULL)
    qkv_dist_shard(dist, batch, &off, &n);
  *offset = (gint)off;
  *count = (gint)n;
}

gboolean
seq2seq_dist_broadcast(QkvParams *params, QkvOptimizer *optimizer, GError **error)
{
  return dist == NULL || qkv_dist_broadcast_params(dist, params, optimizer, error);
}

gboolean
seq2seq_dist_reduce(QkvParams *params, double *loss, double *tokens, GError **error)
{
  if (dist == NULL)
    return TRUE;
  float extra[2] = {(float)*loss, (float)*tokens};
  if (!qkv_dist_allreduce_grads(dist, params, QKV_DIST_SUM, extra, 2, error))
    return FALSE;
  *loss = extra[0];
  *tokens = extra[1];
  return TRUE;
}

void
seq2seq_dist_print_error(const gchar *program, const GError *error)
{
  if (dist == NULL) {
    g_printerr("%s: %s\n", program, error->message);
    return;
  }
  if (error->domain == QKV_DIST_ERROR && error->code == QKV_DIST_ERROR_MISMATCH &&
      !qkv_dist_is_root(dist)) {
    g_printerr("%s (rank %d): stopped: the ranks disagree (rank 0 reports how)\n", program,
               qkv_dist_rank(dist));
    return;
  }
  g_printerr("%s (rank %d): %s\n", program, qkv_dist_rank(dist), error->message);
}

gboolean
seq2seq_step_log_open(const gchar *path, GError **error)
{
  if (!seq2seq_dist_is_root())
    return TRUE;
  step_log = fopen(path, "w");
  if (step_log == NULL) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "--step-losses %s: cannot write it",
                path);
    return FALSE;
  }
  return TRUE;
}

void
seq2seq_step_log(gint64 step, double loss)
{
  if (step_log != NULL)
    fprintf(step_log, "%" G_GINT64_FORMAT " %.9g\n", step, loss);
}

void
seq2seq_step_log_close(void)
{
  if (step_log != NULL)
    fclose(step_log);
  step_log = NULL;
}
