/* tied.h: --tie-embeddings of the seq2seq example (Transformer only). */
#pragma once

#include <qkv/qkv.h>
#include "data.h"
#include "model.h"

/* What --tie-embeddings ties for this data: the decoder's output projection
 * to its embedding always, and the encoder's embedding too when the source
 * and target vocabularies are one (the same tokens with the same ids, as in
 * the reverse task); fra-eng has two, so only the decoder's there. */
QkvTieEmbeddings tied_mode(const Seq2SeqData *data);
const gchar *tied_mode_name(QkvTieEmbeddings mode);

/* The parameter count of cfg's model without tying: built (not trained) in a
 * scratch store. */
gboolean tied_untied_count(const ModelConfig *cfg, gint64 *count, GError **error);
