/* validate.c: validation during training — the held-out pairs, their loss
 * and BLEU, the best checkpoint and early stopping (validate.h, trainer.h). */
#include <gio/gio.h>
#include <math.h>
#include <string.h>

#include "heldout.h"
#include "trainer.h"

void
validation_clear(Validation *v)
{
  g_clear_pointer(&v->src, g_ptr_array_unref);
  g_clear_pointer(&v->tgt, g_ptr_array_unref);
  model_plan_clear(&v->plan);
  /* the vocabularies are the training data's */
  v->ids.src_vocab = v->ids.tgt_vocab = NULL;
  seq2seq_data_clear(&v->ids);
}

/* The text pairs encoded as training data is, with the training
 * vocabularies (words they lack read as <unk>). */
static void
encode_pairs(Validation *v, const Seq2SeqData *train)
{
  const gint n = (gint)v->src->len, T = train->num_steps;
  Seq2SeqData *d = &v->ids;
  d->n = n;
  d->num_steps = T;
  d->src = g_new0(gint32, (gsize)n * T);
  d->tgt = g_new0(gint32, (gsize)n * T);
  d->src_valid = g_new0(gint32, n);
  d->tgt_valid = g_new0(gint32, n);
  for (gint i = 0; i < n; i++) {
    d->src_valid[i] = seq2seq_encode_sentence(train->src_vocab, g_ptr_array_index(v->src, i), T,
                                              d->src + (gsize)i * T);
    d->tgt_valid[i] = seq2seq_encode_sentence(train->tgt_vocab, g_ptr_array_index(v->tgt, i), T,
                                              d->tgt + (gsize)i * T);
  }
}

/* --task reverse: --valid sequences of the generator, from a seed that
 * neither the training data nor the accuracy test after training uses. */
static gboolean
reverse_pairs(Validation *v, const Seq2seqOptions *o, GError **error)
{
  if (!seq2seq_data_reverse(&v->ids, o->valid, o->steps, o->reverse_vocab,
                            (guint64)o->seed + 2000003u, error))
    return FALSE;
  vocab_free(v->ids.src_vocab);
  vocab_free(v->ids.tgt_vocab);
  v->ids.src_vocab = v->ids.tgt_vocab = NULL;
  return TRUE;
}

gboolean
trainer_validation_setup(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  Validation *v = &tr->valid;
  v->last_loss = v->last_bleu = NAN;
  v->best_loss = INFINITY;
  v->on = seq2seq_options_validating(o);
  if (!v->on)
    return TRUE;
  if (o->reverse)
    return reverse_pairs(v, o, error);
  /* --valid-data: its first --valid pairs (all without --valid); else the
   * --valid lines after the training ones */
  const gchar *path = o->valid_data != NULL ? o->valid_data : data_path;
  gint first = o->valid_data != NULL ? 0 : o->num_examples + 1;
  gint n = o->valid > 0 ? o->valid : SEQ2SEQ_MAX_EXAMPLES;
  if (!seq2seq_data_load_pairs(path, first, n, &v->src, &v->tgt, error))
    return FALSE;
  if (v->src->len == 0) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%s holds no sentence pairs to validate on%s", path,
                o->valid_data != NULL ? "" : " after the training lines (give --valid-data)");
    return FALSE;
  }
  encode_pairs(v, &tr->data);
  return TRUE;
}

/* The summed loss and target tokens of validation rows [first, first +
 * rows). */
static gboolean
batch_loss(Trainer *tr, gint first, gint rows, double *loss, double *tokens, GError **error)
{
  const Seq2SeqData *d = &tr->valid.ids;
  const gint T = d->num_steps;
  QkvShape bt = QKV_SHAPE(rows, T), bs = QKV_SHAPE(rows);
  g_autoptr(QkvTensor) src = qkv_tensor_new_i32(&bt, d->src + (gsize)first * T);
  g_autoptr(QkvTensor) src_valid = qkv_tensor_new_i32(&bs, d->src_valid + first);
  g_autoptr(QkvTensor) labels = qkv_tensor_new_i32(&bt, d->tgt + (gsize)first * T);
  g_autoptr(QkvTensor) tgt_valid = qkv_tensor_new_i32(&bs, d->tgt_valid + first);
  g_autoptr(QkvTensor) dec_in = qkv_tensor_new(QKV_I32, &bt);
  gint32 *dec = qkv_tensor_i32(dec_in);
  for (gint i = 0; i < rows; i++) {
    /* teacher forcing, as in training */
    dec[i * T] = tr->data.tgt_vocab->bos;
    memcpy(dec + i * T + 1, d->tgt + (gsize)(first + i) * T, (T - 1) * sizeof(gint32));
    *tokens += d->tgt_valid[first + i];
  }
  QkvPlan *plan = tr->valid.plan.plan;
  if (!qkv_plan_bind(plan, "src", src, error) ||
      !qkv_plan_bind(plan, "src_valid", src_valid, error) ||
      !qkv_plan_bind(plan, "dec_in", dec_in, error) ||
      !qkv_plan_bind(plan, "labels", labels, error) ||
      !qkv_plan_bind(plan, "tgt_valid", tgt_valid, error) || !qkv_plan_run(plan, error))
    return FALSE;
  *loss += qkv_plan_output_scalar(plan, 0);
  return TRUE;
}

static gboolean
validation_loss(Trainer *tr, double *loss, GError **error)
{
  Validation *v = &tr->valid;
  const gint n = v->ids.n, batch = MIN(tr->opt->batch, n);
  if (v->plan.plan == NULL &&
      !model_plan_build_loss(&v->plan, &tr->cfg, tr->params, batch, tr->opt->threads, error)) {
    model_plan_clear(&v->plan);
    return FALSE;
  }
  double sum = 0, tokens = 0;
  for (gint first = 0; first < n; first += batch)
    if (!batch_loss(tr, first, MIN(batch, n - first), &sum, &tokens, error))
      return FALSE;
  *loss = sum / tokens;
  return TRUE;
}

gboolean
trainer_validate(Trainer *tr, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  Validation *v = &tr->valid;
  double loss = NAN, bleu = NAN;
  if (!validation_loss(tr, &loss, error))
    return FALSE;
  if (v->src != NULL && !heldout_bleu(&tr->cfg, tr->params, &tr->data, v->src, v->tgt, 64, 1,
                                      o->length_penalty, o->threads, &bleu, error))
    return FALSE;
  v->last_loss = loss;
  v->last_bleu = bleu;
  v->measured = TRUE;
  if (loss < v->best_loss) {
    v->best_loss = loss;
    v->best_epoch = tr->epochs_done;
    v->since_best = 0;
    if (o->save_best != NULL && !trainer_save(tr, o->save_best, error))
      return FALSE;
  } else {
    v->since_best++;
    v->stop = o->early_stop > 0 && v->since_best >= o->early_stop;
  }
  return TRUE;
}
