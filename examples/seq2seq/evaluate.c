/* evaluate.c: the results qkv-seq2seq prints after training (evaluate.h). */
#include "evaluate.h"

#include <errno.h>
#include <gio/gio.h>
#include <stdio.h>
#include <stdlib.h>

#include "bleu.h"
#include "heatmap.h"
#include "heldout.h"

/* The heat map's name for the weights drawn. */
static gchar *
attention_name(const Trainer *tr)
{
  if (tr->cfg.kind == MODEL_BAHDANAU)
    return g_strdup("Bahdanau (additive) attention");
  if (tr->cfg.kind == MODEL_LUONG) {
    g_autofree gchar *how = model_attention_describe(&tr->cfg);
    return g_strdup_printf("Luong attention (%s)", how);
  }
  gint block = tr->opt->heatmap_block > 0 ? tr->opt->heatmap_block : tr->cfg.num_layers;
  return g_strdup_printf("block %d of %d%s", block, tr->cfg.num_layers,
                         block == tr->cfg.num_layers ? " (the last)" : "");
}

/* Whether --heatmap draws sentence i (from 0). */
static gboolean
wanted_in_heatmap(const Seq2seqOptions *o, gint i)
{
  for (gint k = 0; o->heatmap != NULL && k < o->n_heatmap_rows; k++)
    if (o->heatmap_rows[k] == i + 1)
      return TRUE;
  return FALSE;
}

/* --heatmap: the sentences --heatmap-sentence chose, in its order. */
static gboolean
draw_heatmap(Trainer *tr, GPtrArray *sources, GPtrArray *translations, QkvTensor **weights,
             gchar **tokens, const gint *src_lens, const gint *out_lens, gint n_sentences,
             GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  HeatmapSentence items[SEQ2SEQ_MAX_HEATMAPS];
  for (gint k = 0; k < o->n_heatmap_rows; k++) {
    gint i = o->heatmap_rows[k] - 1;
    if (i >= n_sentences) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "--heatmap-sentence %d: only %d sentences were translated", i + 1, n_sentences);
      return FALSE;
    }
    items[k] = (HeatmapSentence){weights[i],
                                 g_ptr_array_index(sources, i),
                                 g_ptr_array_index(translations, i),
                                 src_lens[i],
                                 out_lens[i],
                                 tokens[2 * i],
                                 tokens[2 * i + 1]};
  }
  g_autofree gchar *name = attention_name(tr);
  return heatmap_write(o->heatmap, items, o->n_heatmap_rows, name, error);
}

/* The book's four sentences with their BLEU against the book's references,
 * or --translate's sentences; the attention of those --heatmap-sentence
 * names to --heatmap. */
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
  g_autoptr(GPtrArray) sources = g_ptr_array_new();
  g_autoptr(GPtrArray) translations = g_ptr_array_new_with_free_func(g_free);
  g_autofree QkvTensor **weights = g_new0(QkvTensor *, n_sentences + 1);
  g_autofree gint *src_lens = g_new0(gint, n_sentences + 1);
  g_autofree gint *out_lens = g_new0(gint, n_sentences + 1);
  /* per sentence, its source and translation pieces (subwords only) */
  g_autofree gchar **tokens = g_new0(gchar *, 2 * (n_sentences + 1));
  gboolean ok = TRUE;
  for (gint i = 0; ok && i < n_sentences; i++) {
    const gchar *sentence = o->translate ? o->translate[i] : engs[i];
    gchar *translation = trainer_translate(
        tr, sentence, wanted_in_heatmap(o, i) ? &weights[i] : NULL,
        wanted_in_heatmap(o, i) ? tokens + 2 * i : NULL, &src_lens[i], &out_lens[i], error);
    ok = translation != NULL;
    if (!ok)
      break;
    g_ptr_array_add(sources, (gpointer)sentence);
    g_ptr_array_add(translations, translation);
    if (o->translate != NULL)
      printf("%s => %s\n", sentence, translation);
    else
      printf("%s => %s, bleu %.3f\n", sentence, translation, bleu(translation, fras[i], 2));
  }
  if (ok && o->heatmap != NULL)
    ok = draw_heatmap(tr, sources, translations, weights, tokens, src_lens, out_lens, n_sentences,
                      error);
  for (gint i = 0; i < n_sentences; i++) {
    qkv_tensor_free(weights[i]);
    g_free(tokens[2 * i]);
    g_free(tokens[2 * i + 1]);
  }
  return ok;
}

/* Translate lines[0..n) in one batch and print one line each (an empty
 * line for an empty one). */
static gboolean
translate_batch(Trainer *tr, Translator *t, GPtrArray *lines, GError **error)
{
  const gint T = tr->data.num_steps, n = (gint)lines->len;
  g_autofree gint32 *ids = g_new(gint32, (gsize)n * T);
  g_autofree gint32 *valid = g_new(gint32, n);
  g_autofree gint32 *out = g_new(gint32, (gsize)n * T);
  g_autofree gint *lens = g_new0(gint, n);
  g_autofree gint *rows = g_new(gint, n); /* line -> row of the batch, -1: empty */
  gint m = 0;
  for (gint i = 0; i < n; i++) {
    const gchar *line = g_ptr_array_index(lines, i);
    rows[i] = line[0] != '\0' ? m++ : -1;
    if (rows[i] >= 0)
      valid[rows[i]] =
          seq2seq_encode_sentence(tr->data.src_vocab, line, T, ids + (gsize)rows[i] * T);
  }
  if (m > 0 && !translator_run(t, &tr->cfg, tr->params, &tr->data, ids, valid, m, out, lens, error))
    return FALSE;
  for (gint i = 0; i < n; i++) {
    g_autofree gchar *text =
        rows[i] >= 0
            ? seq2seq_decode_ids(tr->data.tgt_vocab, out + (gsize)rows[i] * T, lens[rows[i]])
            : g_strdup("");
    printf("%s\n", text);
  }
  fflush(stdout);
  return TRUE;
}

/* --translate -: a filter, one sentence per line of standard input (the
 * English preprocessed as the training pairs are) to one translation per
 * line of standard output, decoded in batches. */
static gboolean
translate_stdin(Trainer *tr, GError **error)
{
  const gint batch = 64;
  Translator t;
  translator_init(&t, tr->data.num_steps, batch, tr->opt->beam, tr->opt->length_penalty,
                  tr->opt->threads);
  g_autoptr(GPtrArray) lines = g_ptr_array_new_with_free_func(g_free);
  gchar *line = NULL;
  size_t cap = 0;
  gboolean ok = TRUE;
  for (;;) {
    ssize_t len = getline(&line, &cap, stdin);
    if (len >= 0) {
      g_strchomp(line); /* the newline, a \r, trailing spaces */
      g_autofree gchar *valid = g_utf8_make_valid(line, -1);
      g_ptr_array_add(lines, tr->opt->reverse ? g_strdup(valid) : nmt_preprocess(valid));
    }
    if (lines->len == (guint)batch || (len < 0 && lines->len > 0)) {
      ok = translate_batch(tr, &t, lines, error);
      g_ptr_array_set_size(lines, 0);
    }
    if (len < 0 || !ok)
      break;
  }
  if (ok && ferror(stdin)) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "reading standard input: %s",
                g_strerror(errno));
    ok = FALSE;
  }
  free(line);
  translator_clear(&t);
  return ok;
}

/* Corpus BLEU-4 on the --heldout pairs after the training ones (and after
 * the --valid ones taken from the same file), or on the first of
 * --test-data, greedy and beam 4, as the Transformer paper decodes. */
static gboolean
print_heldout_bleu(Trainer *tr, const gchar *data_path, GError **error)
{
  const Seq2seqOptions *o = tr->opt;
  GPtrArray *src = NULL, *tgt = NULL;
  const gchar *path = o->test_data != NULL ? o->test_data : data_path;
  gint skip = o->num_examples + 1 + (o->valid_data == NULL ? o->valid : 0);
  gint first = o->test_data != NULL ? 0 : skip;
  if (!seq2seq_data_load_pairs(path, first, o->heldout, &src, &tgt, error))
    return FALSE;
  if (src->len == 0) {
    /* a file that ends with the training pairs has nothing to hold out */
    if (o->test_data != NULL)
      printf("held-out BLEU: no sentence pairs in %s\n", path);
    else
      printf("held-out BLEU: no sentence pairs after the %d training%s lines of %s\n", skip,
             o->valid_data == NULL && o->valid > 0 ? " and validation" : "", path);
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
    g_autofree gchar *pred =
        trainer_translate(tr, sentence->str, NULL, NULL, &src_len, &out_len, error);
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
  if (o->translate_stdin)
    return translate_stdin(tr, error);
  if (!translate_sentences(tr, error))
    return FALSE;
  if (!o->reverse && o->translate == NULL && o->heldout > 0 &&
      !print_heldout_bleu(tr, data_path, error))
    return FALSE;
  return !o->reverse || print_reverse_accuracy(tr, error);
}
