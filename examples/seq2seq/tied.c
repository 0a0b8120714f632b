/* tied.c: --tie-embeddings, kept out of main.c. */
#include "tied.h"

QkvTieEmbeddings
tied_mode(const Seq2SeqData *data)
{
  const Vocab *s = data->src_vocab, *t = data->tgt_vocab;
  if (vocab_size(s) != vocab_size(t))
    return QKV_TIE_DECODER;
  for (gint i = 0; i < vocab_size(s); i++)
    if (g_strcmp0(vocab_token(s, i), vocab_token(t, i)) != 0)
      return QKV_TIE_DECODER;
  return QKV_TIE_ALL;
}

const gchar *
tied_mode_name(QkvTieEmbeddings mode)
{
  switch (mode) {
  case QKV_TIE_DECODER:
    return "decoder embedding = output projection (\"decoder.embedding.weight\")";
  case QKV_TIE_ALL:
    return "one matrix for the joint vocabulary: encoder and decoder embeddings and output "
           "projection (\"encoder.embedding.weight\")";
  default:
    return "none";
  }
}

gboolean
tied_untied_count(const ModelConfig *cfg, gint64 *count, GError **error)
{
  ModelConfig untied = *cfg;
  untied.tie_embeddings = QKV_TIE_NONE;
  g_autoptr(QkvParams) scratch = qkv_params_new();
  ModelPlan mp = {0};
  /* the smallest graph that creates every parameter: one sentence, no
   * training nodes */
  gboolean ok = model_plan_build(&mp, &untied, scratch, 1, FALSE, 1, error);
  if (ok)
    *count = qkv_params_numel(scratch);
  model_plan_clear(&mp);
  return ok;
}
