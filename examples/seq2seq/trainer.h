/* trainer.h: the state of one qkv-seq2seq run — the options, the data,
 * the model's parameters and optimizer, the training plan and the decoder —
 * shared by training (main.c), checkpoints (resume.c) and the evaluation
 * after training (evaluate.c). */
#pragma once

#include <qkv/qkv.h>
#include <qkv/qkv-optim.h>

#include <stdio.h>

#include "../common/runlog.h"
#include "data.h"
#include "model.h"
#include "options.h"
#include "translate.h"
#include "validate.h"

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
  /* where the lines about training go: stdout, or stderr when --translate -
   * keeps stdout for the translations */
  FILE *out;
  gchar *data_name;       /* "fra-eng", the --data file's name, or "reverse task" */
  RunLog *log;            /* --log or --plot (rank 0), else NULL */
  gint64 plotted_at;      /* when --plot was last drawn */
  gint64 start_time;      /* of training, for the log's elapsed time */
  Seq2SeqLoadReport load; /* what loading the training data skipped */
  Validation valid;       /* --valid, --valid-data */
  gchar *subwords_from;   /* --vocab sentencepiece: where the model came from, in words */
} Trainer;

/* Decoding of one sentence by the incremental step decoder (one plan run per
 * token, every token at its true position) under beam search (--beam;
 * greedy by default). */
gchar *trainer_translate(Trainer *tr, const gchar *sentence, QkvTensor **weights_out,
                         gchar *tokens_out[2], gint *src_len, gint *out_len, GError **error);

/* --save: the model, the optimizer state, the vocabularies and the options
 * --resume checks, to path (safetensors). */
gboolean trainer_save(Trainer *tr, const gchar *path, GError **error);
/* --resume: load path into tr's parameters and optimizer, refusing a
 * checkpoint of another model, configuration or data, or with NaN or Inf. */
gboolean trainer_resume(Trainer *tr, const gchar *path, GError **error);

/* --vocab sentencepiece with --resume: the SentencePiece model a checkpoint
 * holds (refusing one trained on words). */
struct Spm *trainer_checkpoint_subwords(const gchar *path, GError **error);

/* --plot: the curves of the run's log so far (nothing without --plot). */
gboolean trainer_plot(Trainer *tr, GError **error);

/* --valid, --valid-data: read (or for --task reverse, make) the validation
 * pairs and encode them with the training vocabularies. */
gboolean trainer_validation_setup(Trainer *tr, const gchar *data_path, GError **error);
/* The validation loss (the book's metric: cross-entropy per target token,
 * without dropout or label smoothing) and, for sentence pairs, corpus BLEU
 * of greedy translations (NaN for --task reverse); then --save-best and the
 * count --early-stop watches. */
gboolean trainer_validate(Trainer *tr, GError **error);
