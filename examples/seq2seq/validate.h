/* validate.h: the state of validation during training (--valid,
 * --valid-data, --save-best, --early-stop); the functions are the
 * Trainer's (trainer.h, validate.c). */
#pragma once

#include <glib.h>

#include "data.h"
#include "model.h"

typedef struct {
  gboolean on;
  GPtrArray *src, *tgt;        /* the pairs as text (NULL for --task reverse) */
  Seq2SeqData ids;             /* encoded with the training vocabularies (not owned here) */
  ModelPlan plan;              /* the loss without dropout, compiled on first use */
  double last_loss, last_bleu; /* NaN until measured; BLEU NaN for --task reverse */
  gboolean measured;           /* in the epoch just ended */
  double best_loss;            /* +inf until measured */
  gint best_epoch;
  gint since_best; /* validations in a row without a lower loss */
  gboolean stop;   /* --early-stop reached */
} Validation;

void validation_clear(Validation *v);
