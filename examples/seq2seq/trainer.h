/* trainer.h: the state of one qkv-seq2seq run — the options, the data,
 * the model's parameters and optimizer, the training plan and the decoder —
 * shared by training (main.c), checkpoints (resume.c) and the evaluation
 * after training (evaluate.c). */
#pragma once

#include <qkv/qkv.h>
#include <qkv/qkv-optim.h>

#include "data.h"
#include "model.h"
#include "options.h"
#include "translate.h"

typedef struct {
  const Seq2seqOptions *opt;
  ModelConfig cfg;
  Seq2SeqData data;
  QkvParams *params;
  QkvOptimizer *optimizer;
  /* one training plan, compiled for the full batch; the last, partial batch
   * of an epoch is bound as is (a plan runs on smaller leading dims) */
  ModelPlan train;
  QkvGradAccumulator *accumulator; /* --accumulate over 1 */
  QkvSchedule *schedule;           /* --warmup, else NULL */
  QkvClipRule clip_rule;
  Translator translator;
  gint epochs_done;
  gint64 global_step;
  double last_loss;
  double last_tokens_per_s;
} Trainer;

/* Decoding of one sentence by the incremental step decoder (one plan run per
 * token, every token at its true position) under beam search (--beam;
 * greedy by default). */
gchar *trainer_translate(Trainer *tr, const gchar *sentence, QkvTensor **weights_out, gint *src_len,
                         gint *out_len, GError **error);

/* --save: the model, the optimizer state, the vocabularies and the options
 * --resume checks, to path (safetensors). */
gboolean trainer_save(Trainer *tr, const gchar *path, GError **error);
/* --resume: load path into tr's parameters and optimizer, refusing a
 * checkpoint of another model, configuration or data, or with NaN or Inf. */
gboolean trainer_resume(Trainer *tr, const gchar *path, GError **error);
