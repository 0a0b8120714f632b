/* grid-heatmap.c: the heat map of grid-heatmap.h; the same scale and layout
 * as the seq2seq example's per-head panels. */
#include "grid-heatmap.h"

#include <cairo.h>

#define CELL 40.0
#define GAP 8.0

static void
draw_label(cairo_t *cr, const gchar *text, double x, double y, double angle)
{
  cairo_save(cr);
  cairo_move_to(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_show_text(cr, text);
  cairo_restore(cr);
}

void
heatmap_colour(cairo_t *cr, double v)
{
  v = CLAMP(v, 0.0, 1.0);
  cairo_set_source_rgb(cr, 1.0 - 0.45 * v, 1.0 - 0.95 * v, 1.0 - 0.95 * v);
}

double
heatmap_draw_colour_bar(cairo_t *cr, double x, double y, double h, const gchar *caption)
{
  const double bar_w = 14;
  /* the strip, one line of pixels per colour, 1 at the top */
  for (double dy = 0; dy < h; dy += 1.0) {
    heatmap_colour(cr, 1.0 - dy / h);
    cairo_rectangle(cr, x, y + dy, bar_w, MIN(1.0, h - dy) + 0.5);
    cairo_fill(cr);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x, y, bar_w, h);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 11);
  double widest = 0;
  for (gint i = 0; i <= 5; i++) {
    gchar label[8];
    g_snprintf(label, sizeof label, "%.1f", i / 5.0);
    double ty = y + h - h * i / 5.0;
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, x + bar_w, ty);
    cairo_line_to(cr, x + bar_w + 4, ty);
    cairo_stroke(cr);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, label, &ext);
    widest = MAX(widest, ext.x_advance);
    cairo_move_to(cr, x + bar_w + 6, ty + ext.height / 2);
    cairo_show_text(cr, label);
  }
  if (caption != NULL) {
    cairo_text_extents_t ext;
    cairo_text_extents(cr, caption, &ext);
    cairo_save(cr);
    cairo_move_to(cr, x + bar_w + widest + 22, y + h / 2 + ext.x_advance / 2);
    cairo_rotate(cr, -G_PI / 2);
    cairo_show_text(cr, caption);
    cairo_restore(cr);
  }
  cairo_set_font_size(cr, 13);
  return bar_w + widest + 30;
}

gboolean
grid_heatmap_write(const gchar *path, const gchar *title, const float *values, gint rows, gint cols,
                   const gchar *const *row_labels, const gchar *const *col_labels,
                   gboolean show_values, GError **error)
{
  g_return_val_if_fail(path != NULL && values != NULL && rows > 0 && cols > 0, FALSE);
  /* measure the labels first, so that none is cut off */
  cairo_surface_t *probe = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
  cairo_t *pc = cairo_create(probe);
  cairo_select_font_face(pc, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(pc, 13);
  double left = 0, top = 0, title_w = 0;
  cairo_text_extents_t ext;
  for (gint r = 0; r < rows; r++) {
    cairo_text_extents(pc, row_labels[r], &ext);
    left = MAX(left, ext.x_advance);
  }
  for (gint c = 0; c < cols; c++) {
    cairo_text_extents(pc, col_labels[c], &ext);
    top = MAX(top, ext.x_advance * 0.87); /* sin 60° */
  }
  if (title != NULL) {
    cairo_text_extents(pc, title, &ext);
    title_w = ext.x_advance;
  }
  cairo_destroy(pc);
  cairo_surface_destroy(probe);

  double x0 = left + 2 * GAP + 10, y0 = top + 3 * GAP + 30;
  /* the colour bar and its labels take about 70 pixels */
  int width = (int)MAX(x0 + cols * CELL + 30 + 70, title_w + 20);
  int height = (int)(y0 + MAX(rows * CELL, 100.0) + 20);
  cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t *cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);
  cairo_set_source_rgb(cr, 0, 0, 0);
  if (title != NULL)
    draw_label(cr, title, 10, 22, 0);
  for (gint r = 0; r < rows; r++)
    for (gint c = 0; c < cols; c++) {
      float v = CLAMP(values[(gsize)r * cols + c], 0.0f, 1.0f);
      heatmap_colour(cr, v);
      cairo_rectangle(cr, x0 + c * CELL, y0 + r * CELL, CELL, CELL);
      cairo_fill(cr);
      if (show_values) {
        gchar num[16];
        g_snprintf(num, sizeof num, "%.2f", values[(gsize)r * cols + c]);
        cairo_set_font_size(cr, 10);
        cairo_text_extents(cr, num, &ext);
        if (v > 0.5)
          cairo_set_source_rgb(cr, 1, 1, 1);
        else
          cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        draw_label(cr, num, x0 + c * CELL + (CELL - ext.x_advance) / 2, y0 + r * CELL + CELL * 0.6,
                   0);
        cairo_set_font_size(cr, 13);
      }
    }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x0, y0, cols * CELL, rows * CELL);
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  for (gint c = 0; c < cols; c++)
    draw_label(cr, col_labels[c], x0 + c * CELL + CELL * 0.4, y0 - 6, -G_PI / 3);
  for (gint r = 0; r < rows; r++) {
    cairo_text_extents(cr, row_labels[r], &ext);
    draw_label(cr, row_labels[r], x0 - ext.x_advance - GAP, y0 + r * CELL + CELL * 0.6, 0);
  }
  heatmap_draw_colour_bar(cr, x0 + cols * CELL + 20, y0, MAX(rows * CELL, 100.0), "weight");
  cairo_destroy(cr);
  cairo_status_t st = cairo_surface_write_to_png(surface, path);
  cairo_surface_destroy(surface);
  if (st != CAIRO_STATUS_SUCCESS) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "writing %s: %s", path,
                cairo_status_to_string(st));
    return FALSE;
  }
  return TRUE;
}
