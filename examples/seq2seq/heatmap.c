/* heatmap.c: one panel per attention head, tokens on both axes, a white to
 * dark-red scale from 0 to 1. */
#include "heatmap.h"

#include <cairo.h>
#include <string.h>

#define CELL 36.0
#define MARGIN_LEFT 110.0
#define MARGIN_TOP 90.0
#define GAP 40.0

static void
draw_label(cairo_t *cr, const gchar *text, double x, double y, double angle)
{
  cairo_save(cr);
  cairo_move_to(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_show_text(cr, text);
  cairo_restore(cr);
}

gboolean
heatmap_write(const gchar *path, const QkvTensor *weights, const gchar *source,
              const gchar *translation, const Vocab *src_vocab, gint num_steps, gint src_len,
              gint out_len, GError **error)
{
  const QkvShape *s = qkv_tensor_shape(weights);
  gint heads = s->rank == 4 ? (gint)s->dims[1] : 1;
  gint64 tq = s->dims[s->rank - 2], tk = s->dims[s->rank - 1];
  gint rows = (gint)MIN(out_len + 1, tq), cols = (gint)MIN(src_len, tk);
  g_auto(GStrv) src_tokens = g_strsplit(source, " ", -1);
  g_auto(GStrv) out_tokens = g_strsplit(translation, " ", -1);

  double panel_w = cols * CELL, panel_h = rows * CELL;
  int width = (int)(MARGIN_LEFT + heads * (panel_w + GAP) + 20);
  int height = (int)(MARGIN_TOP + panel_h + 60);
  cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t *cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);
  cairo_set_source_rgb(cr, 0, 0, 0);
  g_autofree gchar *title =
      g_strdup_printf("encoder-decoder attention: \"%s\" => \"%s\"", source, translation);
  draw_label(cr, title, 10, 22, 0);

  const float *w = qkv_tensor_const_data(weights);
  for (gint h = 0; h < heads; h++) {
    double x0 = MARGIN_LEFT + h * (panel_w + GAP), y0 = MARGIN_TOP;
    g_autofree gchar *head = g_strdup_printf("head %d", h + 1);
    cairo_set_source_rgb(cr, 0, 0, 0);
    draw_label(cr, head, x0, y0 + panel_h + 30, 0);
    for (gint r = 0; r < rows; r++) {
      for (gint c = 0; c < cols; c++) {
        float v = w[((gsize)h * tq + r) * tk + c];
        v = CLAMP(v, 0.0f, 1.0f);
        /* white → dark red */
        cairo_set_source_rgb(cr, 1.0 - 0.45 * v, 1.0 - 0.95 * v, 1.0 - 0.95 * v);
        cairo_rectangle(cr, x0 + c * CELL, y0 + r * CELL, CELL, CELL);
        cairo_fill(cr);
      }
    }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x0, y0, panel_w, panel_h);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    for (gint c = 0; c < cols; c++) {
      const gchar *tok = c < (gint)g_strv_length(src_tokens) ? src_tokens[c] : "<eos>";
      (void)src_vocab;
      draw_label(cr, tok, x0 + c * CELL + CELL * 0.6, y0 - 6, -G_PI / 3);
    }
    if (h == 0) {
      for (gint r = 0; r < rows; r++) {
        const gchar *tok = r < out_len ? out_tokens[r] : "<eos>";
        cairo_text_extents_t ext;
        cairo_text_extents(cr, tok, &ext);
        draw_label(cr, tok, x0 - ext.x_advance - 8, y0 + r * CELL + CELL * 0.6, 0);
      }
    }
  }
  (void)num_steps;
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
