/* heatmap.h: encoder-decoder attention weights drawn as labelled heat maps
 * (cairo PNG): one row of panels per sentence, one panel per head, a colour
 * scale beside them. */
#pragma once

#include <qkv/qkv.h>

/* One translated sentence and its attention. weights: (1, heads, T, T) or
 * (1, T, T); rows are decoder positions (the tokens produced, then <eos>),
 * columns the source tokens (with <eos>). */
typedef struct {
  const QkvTensor *weights;
  const gchar *source, *translation;
  gint src_len, out_len;
  /* the labels of the columns and rows: the tokens joined by spaces
   * (subword pieces, where the model saw those); NULL: the words of source
   * and translation */
  const gchar *src_tokens, *out_tokens;
} HeatmapSentence;

/* Draw n sentences to path; attention names the weights drawn ("block 2
 * of 2", "Bahdanau attention") in the title. */
gboolean heatmap_write(const gchar *path, const HeatmapSentence *sentences, gint n,
                       const gchar *attention, GError **error);
