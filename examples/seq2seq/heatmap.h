/* heatmap.h: attention weights drawn as labelled heat maps (cairo PNG). */
#pragma once

#include <qkv/qkv.h>
#include "data.h"

/* weights: (1, heads, T, T) or (1, T, T); rows are decoder positions (the
 * tokens produced, then <eos>), columns the source tokens (with <eos>). */
gboolean heatmap_write(const gchar *path, const QkvTensor *weights, const gchar *source,
                       const gchar *translation, const Vocab *src_vocab, gint num_steps,
                       gint src_len, gint out_len, GError **error);
