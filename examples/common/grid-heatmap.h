/* grid-heatmap.h: one matrix of weights in [0, 1] drawn as a labelled heat
 * map (cairo PNG), for the examples' attention pictures. */
#pragma once

#include <cairo.h>
#include <glib.h>

/* The colour of a weight v (clamped to [0, 1]): white at 0 to dark red at 1,
 * the scale of every heat map of the examples. */
void heatmap_colour(cairo_t *cr, double v);
/* The colour bar of that scale: a vertical strip of height h with its top
 * left corner at (x, y), ticks 0 to 1 by 0.2 on its right, caption along
 * it. Returns the width it takes. */
double heatmap_draw_colour_bar(cairo_t *cr, double x, double y, double h, const gchar *caption);

/* values: rows × cols, row-major; row_labels (rows strings) down the left,
 * col_labels (cols strings) slanted along the top, title above, the colour
 * bar on the right. Values are clamped to [0, 1] (white to dark red); with
 * show_values each cell also prints its value to two decimals. */
gboolean grid_heatmap_write(const gchar *path, const gchar *title, const float *values, gint rows,
                            gint cols, const gchar *const *row_labels,
                            const gchar *const *col_labels, gboolean show_values, GError **error);
