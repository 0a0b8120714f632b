/* evaluate.h: what qkv-seq2seq reports after training — the translations
 * of the book's four sentences (or --translate's) with their BLEU and the
 * --heatmap, the --heldout corpus BLEU, and the reverse task's accuracy. */
#pragma once

#include "trainer.h"

/* data_path: the fra-eng file trained on (its held-out pairs follow the
 * training ones). */
gboolean seq2seq_evaluate(Trainer *tr, const gchar *data_path, GError **error);
