/* model.c: building the example's graphs with qkv's builders. */
#include "model.h"

static QkvValue *
build_transformer(QkvBuilder *b, const ModelConfig *cfg, QkvValue *src, QkvValue *src_valid,
                  QkvValue *dec_in, QkvValue **cross_weights, GError **error)
{
  QkvTransformerConfig tc = {
      .src_vocab = cfg->src_vocab,
      .tgt_vocab = cfg->tgt_vocab,
      .num_hiddens = cfg->num_hiddens,
      .ffn_hiddens = cfg->ffn_hiddens,
      .num_heads = cfg->num_heads,
      .num_layers = cfg->num_layers,
      .dropout = cfg->dropout,
  };
  QkvValue *enc = qkv_build_transformer_encoder(b, &tc, src, src_valid, error);
  return enc ? qkv_build_transformer_decoder(b, &tc, dec_in, enc, src_valid, cross_weights, error)
             : NULL;
}

static QkvValue *
build_bahdanau(QkvBuilder *b, const ModelConfig *cfg, QkvValue *src, QkvValue *src_valid,
               QkvValue *dec_in, QkvValue **weights, GError **error)
{
  QkvGruSeq2SeqConfig gc = {
      .src_vocab = cfg->src_vocab,
      .tgt_vocab = cfg->tgt_vocab,
      .embed_size = cfg->embed_size,
      .num_hiddens = cfg->num_hiddens,
      .num_layers = cfg->num_layers,
      .dropout = cfg->dropout,
  };
  return qkv_build_bahdanau_seq2seq(b, &gc, src, src_valid, dec_in, weights, error);
}

gboolean
model_plan_build(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                 gboolean training, gint threads, GError **error)
{
  mp->batch = batch;
  mp->graph = qkv_graph_new();
  QkvGraph *g = mp->graph;
  QkvShape bt = QKV_SHAPE(batch, cfg->num_steps), bs = QKV_SHAPE(batch);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, error);
  QkvBuilder b = {.graph = g, .params = params, .seed = cfg->seed, .xavier_linear = TRUE};
  QkvValue *weights = NULL;
  QkvValue *logits =
      cfg->kind == MODEL_TRANSFORMER
          ? build_transformer(&b, cfg, src, src_valid, dec_in, training ? NULL : &weights, error)
          : build_bahdanau(&b, cfg, src, src_valid, dec_in, training ? NULL : &weights, error);
  if (logits == NULL)
    return FALSE;
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.n_threads = threads;
  opts.seed = cfg->seed * 1000003u + (guint64)batch;
  if (training) {
    QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, error);
    QkvValue *tgt_valid = qkv_graph_input(g, "tgt_valid", QKV_I32, &bs, error);
    QkvValue *loss = qkv_build_seq2seq_loss_lens(logits, labels, tgt_valid, NULL, error);
    if (loss == NULL || !qkv_graph_backward(g, loss, error))
      return FALSE;
    opts.training = TRUE;
    mp->plan = qkv_graph_compile(g, &loss, 1, &opts, error);
  } else {
    QkvValue *outs[] = {logits, weights};
    mp->plan = qkv_graph_compile(g, outs, weights ? 2 : 1, &opts, error);
  }
  return mp->plan != NULL;
}

void
model_plan_clear(ModelPlan *mp)
{
  qkv_plan_free(mp->plan);
  qkv_graph_free(mp->graph);
  mp->plan = NULL;
  mp->graph = NULL;
}
