/* plot.h: line charts drawn with cairo as matplotlib draws its defaults —
 * one or more panels stacked over a shared x axis, each with its ticks,
 * grid, axis labels and legend — written as a PNG. */
#pragma once

#include <glib.h>

/* matplotlib's first colours (tab:blue, tab:orange, tab:green, tab:red,
 * tab:purple, tab:brown), as 0xRRGGBB */
#define PLOT_C0 0x1f77b4
#define PLOT_C1 0xff7f0e
#define PLOT_C2 0x2ca02c
#define PLOT_C3 0xd62728
#define PLOT_C4 0x9467bd
#define PLOT_C5 0x8c564b

typedef struct {
  const gchar *label; /* in the legend; NULL: none */
  const double *x, *y;
  gsize n;
  guint32 rgb;
  double line_width; /* 0: no line */
  double alpha;      /* 0 is taken as 1 */
  gboolean markers;  /* a dot at every point */
  gboolean dashed;
} PlotSeries;

typedef struct {
  const gchar *y_label;
  gboolean log_y; /* a logarithmic y axis; points at or below 0 are left out */
  const PlotSeries *series;
  gsize n_series;
  double height; /* share of the figure's panel space; 0 is taken as 1 */
} PlotPanel;

/* Draw the panels, top to bottom, under title, the x axis (x_label) at the
 * bottom, to a PNG of width × height pixels. Points that are NaN or
 * infinite break a line. Fails only when the file cannot be written. */
gboolean plot_write_png(const gchar *path, const gchar *title, const gchar *x_label,
                        const PlotPanel *panels, gsize n_panels, gint width, gint height,
                        GError **error);
