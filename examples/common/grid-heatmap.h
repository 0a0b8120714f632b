/* grid-heatmap.h: one matrix of weights in [0, 1] drawn as a labelled heat
 * map (cairo PNG), for the examples' attention pictures. */
#pragma once

#include <glib.h>

/* values: rows × cols, row-major; row_labels (rows strings) down the left,
 * col_labels (cols strings) slanted along the top, title above. Values are
 * clamped to [0, 1] (white to dark red); with show_values each cell also
 * prints its value to two decimals. */
gboolean grid_heatmap_write(const gchar *path, const gchar *title, const float *values, gint rows,
                            gint cols, const gchar *const *row_labels,
                            const gchar *const *col_labels, gboolean show_values, GError **error);
