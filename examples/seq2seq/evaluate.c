/* evaluate.c: the results qkv-seq2seq prints after training (evaluate.h). */
#include "evaluate.h"

#include <stdio.h>

#include "bleu.h"
#include "heatmap.h"
#include "heldout.h"

/* The book's four sentences with their BLEU against the book's references,
 * or --translate's sentences; the first one's attention to --heatmap. */
static gboolean
translate_sentences(Trainer *tr, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  const gchar *engs[] = {"go .", "i lost .", "he's calm .", "i'm home ."};
  const gchar *fras[] = {"va !", "j'ai perdu .", "il est calme .", "je suis chez moi ."};
  gint n_sentences = 4;
  if (o->translate != NULL)
    n_sentences = (gint)g_strv_length(o->translate);
  else if (o->reverse)
    n_sentences = 0;
  for (gint i = 0; i < n_sentences; i++) {
    const gchar *sentence = o->translate ? o->translate[i] : engs[i];
    g_autoptr(QkvTensor) weights = NULL;
    gint src_len = 0, out_len = 0;
    g_autofree gchar *translation = trainer_translate(
        tr, sentence, i == 0 && o->heatmap ? &weights : NULL, &src_len, &out_len, error);
    if (translation == NULL)
      return FALSE;
    if (o->translate != NULL)
      printf("%s => %s\n", sentence, translation);
    else
      printf("%s => %s, bleu %.3f\n", sentence, translation, bleu(translation, fras[i], 2));
    if (weights != NULL &&
        !heatmap_write(o->heatmap, weights, sentence, translation, tr->data.src_vocab,
                       tr->data.num_steps, src_len, out_len, error))
      return FALSE;
  }
  return TRUE;
}

/* Corpus BLEU-4 on the --heldout pairs after the training ones, greedy and
 * beam 4, as the Transformer paper decodes. */
static gboolean
print_heldout_bleu(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  GPtrArray *src = NULL, *tgt = NULL;
  if (!seq2seq_data_load_pairs(data_path, o->num_examples + 1, o->heldout, &src, &tgt, error))
    return FALSE;
  if (src->len == 0) {
    /* a file that ends with the training pairs has nothing to hold out */
    printf("held-out BLEU: no sentence pairs after the %d training lines of %s\n",
           o->num_examples + 1, data_path);
    g_ptr_array_unref(src);
    g_ptr_array_unref(tgt);
    return TRUE;
  }
  double greedy = 0, beam = 0;
  gint64 t0 = g_get_monotonic_time();
  gboolean ok = heldout_bleu(&tr->cfg, tr->params, &tr->data, src, tgt, 64, 1, o->length_penalty,
                             o->threads, &greedy, error) &&
                heldout_bleu(&tr->cfg, tr->params, &tr->data, src, tgt, 64, 4, o->length_penalty,
                             o->threads, &beam, error);
  if (ok) {
    QkvBleuOptions how = heldout_bleu_options();
    g_autofree gchar *signature = qkv_bleu_signature(&how, 1);
    printf("held-out BLEU-4 on %u unseen pairs (corpus, as sacrebleu, 0-100): greedy %.2f, beam 4 "
           "%.2f (alpha %g; %.1f s)\n",
           src->len, greedy, beam, o->length_penalty, (g_get_monotonic_time() - t0) / 1e6);
    printf("BLEU signature: %s\n", signature);
  }
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  return ok;
}

/* Decoding of held-out sequences of the reverse task (greedy or --beam):
 * token accuracy up to <eos>. */
static gboolean
print_reverse_accuracy(Trainer *tr, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  Seq2SeqData test;
  if (!seq2seq_data_reverse(&test, 100, o->steps, o->reverse_vocab, (guint64)o->seed + 1000003u,
                            error))
    return FALSE;
  gint right = 0, total = 0;
  for (gint s = 0; s < test.n; s++) {
    GString *sentence = g_string_new(NULL);
    for (gint t = 0; t < test.src_valid[s] - 1; t++)
      g_string_append_printf(sentence, "%s%s", t ? " " : "",
                             vocab_token(test.src_vocab, test.src[s * o->steps + t]));
    gint src_len, out_len;
    g_autofree gchar *pred = trainer_translate(tr, sentence->str, NULL, &src_len, &out_len, error);
    g_string_free(sentence, TRUE);
    if (pred == NULL) {
      seq2seq_data_clear(&test);
      return FALSE;
    }
    g_auto(GStrv) toks = g_strsplit(pred, " ", -1);
    gint n_pred = pred[0] ? (gint)g_strv_length(toks) : 0;
    for (gint t = 0; t < test.tgt_valid[s]; t++) {
      gint want = test.tgt[s * o->steps + t];
      gint got = t < n_pred ? vocab_lookup(test.tgt_vocab, toks[t])
                            : (t == n_pred ? test.tgt_vocab->eos : -1);
      right += got == want;
      total++;
    }
  }
  g_autofree gchar *how = o->beam > 1 ? g_strdup_printf("beam %d", o->beam) : g_strdup("greedy");
  printf("reverse task: %s token accuracy %.3f on %d held-out sequences\n", how,
         (double)right / total, test.n);
  seq2seq_data_clear(&test);
  return TRUE;
}

gboolean
seq2seq_evaluate(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  if (!translate_sentences(tr, error))
    return FALSE;
  if (!o->reverse && o->translate == NULL && o->heldout > 0 &&
      !print_heldout_bleu(tr, data_path, error))
    return FALSE;
  return !o->reverse || print_reverse_accuracy(tr, error);
}
