/* gpt.h: a character-level decoder-only Transformer (GPT) on the English
 * side of the fra-eng pairs: the corpus, the model, training and sampling. */
#pragma once

#include <qkv/qkv.h>

typedef struct {
  gint64 vocab;   /* characters, '\n' (the line separator) among them */
  gint64 block;   /* context length: positions the model sees at once */
  gint64 d_model; /* width of the residual stream */
  gint layers, heads;
} GptConfig;

typedef struct {
  gint steps, warmup, batch, eval_every;
  double lr, weight_decay, clip; /* the lr decays to lr / 10 */
  guint64 seed;
  QkvPrecision precision; /* of the training and evaluation plans' products */
} GptTrainOptions;

/* Token ids of a text, lines joined by '\n'. */
typedef struct {
  gint32 *ids;
  gint64 n;
} GptText;

typedef struct {
  gchar *chars; /* the vocabulary, id order, as UTF-8 (id i is the i-th character) */
  gunichar *by_id;
  GHashTable *ids; /* character → id + 1 */
  gint64 vocab;
  GptText train, val;
} GptCorpus;

/* data.c */
gboolean gpt_corpus_load(GptCorpus *corpus, const gchar *path, gint max_lines, double val_share,
                         GError **error);
gboolean gpt_vocab_set(GptCorpus *corpus, const gchar *chars, GError **error);
gint32 *gpt_encode(const GptCorpus *corpus, const gchar *text, gint *n, GError **error);
gchar *gpt_decode(const GptCorpus *corpus, const gint32 *ids, gint n);
void gpt_corpus_clear(GptCorpus *corpus);

/* model.c: the model and its training */
extern const QkvBuilderInits gpt_inits;
QkvValue *gpt_logits(QkvBuilder *b, const GptConfig *cfg, QkvValue *tokens, GError **error);
gboolean gpt_train(QkvParams *params, const GptConfig *cfg, const GptCorpus *corpus,
                   const GptTrainOptions *opts, GError **error);

/* generate.c: continue prompt (n_prompt ≥ 1 ids) by length sampled ids,
 * the model's products in precision */
gboolean gpt_generate(QkvParams *params, const GptConfig *cfg, const gint32 *prompt, gint n_prompt,
                      gint length, const QkvSampleOptions *sample, QkvPrecision precision,
                      gint32 *out, gint *n_out, GError **error);
