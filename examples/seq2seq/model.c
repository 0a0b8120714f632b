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
      .tie_embeddings = cfg->tie_embeddings,
  };
  QkvValue *enc = qkv_build_transformer_encoder(b, &tc, src, src_valid, error);
  return qkv_build_transformer_decoder(b, &tc, dec_in, enc, src_valid, cross_weights, error);
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

static QkvValue *
build_luong(QkvBuilder *b, const ModelConfig *cfg, QkvValue *src, QkvValue *src_valid,
            QkvValue *dec_in, QkvValue **weights, GError **error)
{
  QkvLuongConfig lc = {
      .src_vocab = cfg->src_vocab,
      .tgt_vocab = cfg->tgt_vocab,
      .embed_size = cfg->embed_size,
      .num_hiddens = cfg->num_hiddens,
      .num_layers = cfg->num_layers,
      .dropout = cfg->dropout,
      .attention = cfg->luong,
      .input_feeding = cfg->input_feeding,
  };
  return qkv_build_luong_seq2seq(b, &lc, src, src_valid, dec_in, weights, error);
}

const gchar *
model_kind_name(ModelKind kind)
{
  return kind == MODEL_TRANSFORMER ? "transformer" : kind == MODEL_BAHDANAU ? "bahdanau" : "luong";
}

gchar *
model_attention_describe(const ModelConfig *cfg)
{
  if (cfg->kind != MODEL_LUONG)
    return NULL;
  static const gchar *const scores[] = {"dot", "general", "concat"};
  static const gchar *const aligns[] = {"global", "local-m", "local-p"};
  GString *s = g_string_new(scores[cfg->luong.score]);
  g_string_append_printf(s, ", %s", aligns[cfg->luong.align]);
  if (cfg->luong.align != QKV_LUONG_GLOBAL)
    g_string_append_printf(s, " %d", cfg->luong.window);
  if (cfg->input_feeding)
    g_string_append(s, ", input feeding");
  return g_string_free(s, FALSE);
}

gchar *
model_title(const ModelConfig *cfg)
{
  g_autofree gchar *attention = model_attention_describe(cfg);
  return attention ? g_strdup_printf("%s (%s)", model_kind_name(cfg->kind), attention)
                   : g_strdup(model_kind_name(cfg->kind));
}

/* The graph's inputs and the model's logits; *weights (may be NULL) gets
 * the encoder-decoder attention weights. */
static QkvValue *
build_logits(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
             QkvValue **weights, GError **error)
{
  mp->batch = batch;
  mp->graph = qkv_graph_new();
  QkvGraph *g = mp->graph;
  QkvShape bt = QKV_SHAPE(batch, cfg->num_steps), bs = QKV_SHAPE(batch);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, error);
  QkvBuilder b = {.graph = g, .params = params, .seed = cfg->seed, .xavier_linear = TRUE};
  return cfg->kind == MODEL_TRANSFORMER
             ? build_transformer(&b, cfg, src, src_valid, dec_in, weights, error)
         : cfg->kind == MODEL_BAHDANAU
             ? build_bahdanau(&b, cfg, src, src_valid, dec_in, weights, error)
             : build_luong(&b, cfg, src, src_valid, dec_in, weights, error);
}

/* The training loss of logits against the "labels" and "tgt_valid"
 * inputs, with label smoothing epsilon. */
static QkvValue *
build_loss(ModelPlan *mp, const ModelConfig *cfg, QkvValue *logits, double epsilon, GError **error)
{
  QkvShape bt = QKV_SHAPE(mp->batch, cfg->num_steps), bs = QKV_SHAPE(mp->batch);
  QkvValue *labels = qkv_graph_input(mp->graph, "labels", QKV_I32, &bt, error);
  QkvValue *tgt_valid = qkv_graph_input(mp->graph, "tgt_valid", QKV_I32, &bs, error);
  return qkv_build_seq2seq_loss_lens_smoothed(logits, labels, tgt_valid, epsilon, NULL, error);
}

gboolean
model_plan_build(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                 gboolean training, gint threads, GError **error)
{
  QkvValue *weights = NULL;
  QkvValue *logits = build_logits(mp, cfg, params, batch, training ? NULL : &weights, error);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.n_threads = threads;
  opts.precision = cfg->precision;
  opts.bf16_activations = cfg->precision == QKV_PRECISION_BF16;
  opts.seed = cfg->seed * 1000003u + (guint64)batch;
  if (training) {
    QkvValue *loss = build_loss(mp, cfg, logits, cfg->label_smoothing, error);
    if (!qkv_graph_backward(mp->graph, loss, error))
      return FALSE;
    opts.training = TRUE;
    mp->plan = qkv_graph_compile(mp->graph, &loss, 1, &opts, error);
  } else {
    QkvValue *outs[] = {logits, weights};
    mp->plan = qkv_graph_compile(mp->graph, outs, weights ? 2 : 1, &opts, error);
  }
  return mp->plan != NULL;
}

gboolean
model_plan_build_loss(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                      gint threads, GError **error)
{
  QkvValue *logits = build_logits(mp, cfg, params, batch, NULL, error);
  QkvValue *loss = build_loss(mp, cfg, logits, 0.0, error);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.n_threads = threads; /* not training: no dropout */
  mp->plan = qkv_graph_compile(mp->graph, &loss, 1, &opts, error);
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
