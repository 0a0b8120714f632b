/* model.h: the models of the seq2seq example behind one interface — a
 * training graph and a decoding graph, sharing one parameter store. Each is
 * compiled for the largest batch and runs on smaller ones. */
#pragma once

#include <qkv/qkv.h>

typedef enum {
  MODEL_TRANSFORMER,
  MODEL_BAHDANAU,
  MODEL_LUONG,
} ModelKind;

typedef struct {
  ModelKind kind;
  gint64 src_vocab, tgt_vocab;
  gint num_steps;
  gint64 num_hiddens; /* d_model (Transformer) or GRU hidden size (Bahdanau) */
  gint64 embed_size;  /* Bahdanau and Luong */
  gint64 ffn_hiddens; /* Transformer only */
  gint num_heads;     /* Transformer only */
  /* Transformer only: what --tie-embeddings ties (tied.h) */
  QkvTieEmbeddings tie_embeddings;
  gint num_layers;
  double dropout;
  double label_smoothing; /* ε of the training loss's cross-entropy */
  guint64 seed;
  QkvLuongAttentionConfig luong; /* Luong only */
  gboolean input_feeding;        /* Luong only */
  QkvPrecision precision;        /* of every plan's matrix products */
} ModelConfig;

/* "transformer", "bahdanau" or "luong" */
const gchar *model_kind_name(ModelKind kind);
/* The attention a Luong model uses ("general, local-p 2, input feeding"),
 * or NULL for the other models; free with g_free(). */
gchar *model_attention_describe(const ModelConfig *cfg);
/* The model's name with its attention: "luong (general, local-p 2)";
 * free with g_free(). */
gchar *model_title(const ModelConfig *cfg);

/* A compiled graph with its inputs: "src" (B, T) i32, "src_valid" (B) i32,
 * "dec_in" (B, T) i32, and for training "labels" (B, T) i32 and "tgt_valid"
 * (B) i32. Outputs: training → 0 = loss; decoding → 0 = logits (B, T, V),
 * 1 = encoder-decoder attention weights (B, heads, T, T) (Transformer) or
 * (B, T, T) (Bahdanau, Luong). */
typedef struct {
  QkvGraph *graph;
  QkvPlan *plan;
  gint batch;
} ModelPlan;

gboolean model_plan_build(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                          gboolean training, gint threads, GError **error);
/* Forward only, for validation: inputs as the training plan's, output 0 the
 * loss summed over the sequences, without dropout or label smoothing. */
gboolean model_plan_build_loss(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                               gint threads, GError **error);
void model_plan_clear(ModelPlan *mp);
