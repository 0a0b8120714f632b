/* heldout.c: held-out corpus BLEU, decoding whole batches at once. */
#include "heldout.h"

#include "translate.h"

QkvBleuOptions
heldout_bleu_options(void)
{
  return (QkvBleuOptions){.tokenize = QKV_BLEU_TOKENIZE_NONE, .lowercase = TRUE};
}

gboolean
heldout_bleu(const ModelConfig *cfg, QkvParams *params, const Seq2SeqData *data, GPtrArray *src,
             GPtrArray *tgt, gint batch, gint beam, double alpha, gint threads, double *score,
             GError **error)
{
  g_return_val_if_fail(src->len == tgt->len && batch > 0, FALSE);
  const gint T = data->num_steps, n = (gint)src->len;
  Translator translator;
  translator_init(&translator, T, MIN(batch, n), beam, alpha, threads);
  g_autofree gint32 *ids = g_new(gint32, (gsize)batch * T);
  g_autofree gint32 *valid = g_new(gint32, batch);
  g_autofree gint32 *out = g_new(gint32, (gsize)batch * T);
  g_autofree gint *lens = g_new(gint, batch);
  QkvBleuStats stats = {0};
  QkvBleuOptions options = heldout_bleu_options();
  gboolean ok = TRUE;
  for (gint first = 0; ok && first < n; first += batch) {
    gint rows = MIN(batch, n - first);
    for (gint r = 0; r < rows; r++)
      valid[r] = seq2seq_encode_sentence(data->src_vocab, g_ptr_array_index(src, first + r), T,
                                         ids + (gsize)r * T);
    ok = translator_run(&translator, cfg, params, data, ids, valid, rows, out, lens, error);
    for (gint r = 0; ok && r < rows; r++) {
      /* subword pieces are joined into words first, so that both
       * vocabularies are scored on the same words (heldout.h) */
      g_autofree gchar *text = seq2seq_decode_ids(data->tgt_vocab, out + (gsize)r * T, lens[r]);
      qkv_bleu_stats_add_text(&stats, text, g_ptr_array_index(tgt, first + r), &options);
    }
  }
  translator_clear(&translator);
  if (ok)
    *score = qkv_bleu_stats_score(&stats, options.effective_order);
  return ok;
}
