/* model.h: the two models of the seq2seq example behind one interface — a
 * training graph per batch size and a greedy-decoding graph, sharing one
 * parameter store. */
#pragma once

#include <qkv/qkv.h>

typedef enum {
  MODEL_TRANSFORMER,
  MODEL_BAHDANAU,
} ModelKind;

typedef struct {
  ModelKind kind;
  gint64 src_vocab, tgt_vocab;
  gint num_steps;
  gint64 num_hiddens; /* d_model (Transformer) or GRU hidden size (Bahdanau) */
  gint64 embed_size;  /* Bahdanau only */
  gint64 ffn_hiddens; /* Transformer only */
  gint num_heads;     /* Transformer only */
  gint num_layers;
  double dropout;
  guint64 seed;
} ModelConfig;

/* A compiled graph with its inputs: "src" (B, T) i32, "src_valid" (B) i32,
 * "dec_in" (B, T) i32, and for training "labels" (B, T) i32 and "mask"
 * (B, T) f32. Outputs: training → 0 = loss; decoding → 0 = logits (B, T, V),
 * 1 = encoder-decoder attention weights (B, heads, T, T) (Transformer) or
 * (B, T, T) (Bahdanau). */
typedef struct {
  QkvGraph *graph;
  QkvPlan *plan;
  gint batch;
} ModelPlan;

gboolean model_plan_build(ModelPlan *mp, const ModelConfig *cfg, QkvParams *params, gint batch,
                          gboolean training, gint threads, GError **error);
void model_plan_clear(ModelPlan *mp);
