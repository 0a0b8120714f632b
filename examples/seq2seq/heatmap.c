/* heatmap.c: the heat maps of heatmap.h, on the colour scale of
 * common/grid-heatmap.h. */
#include "heatmap.h"

#include <cairo.h>
#include <string.h>

#include "../common/grid-heatmap.h"

#define CELL 36.0
#define MARGIN_TOP 44.0
#define GAP 40.0
#define LABELS_TOP 64.0    /* the slanted source tokens and the sentence caption */
#define LABELS_BOTTOM 30.0 /* "head N" */

static void
draw_label(cairo_t *cr, const gchar *text, double x, double y, double angle)
{
  cairo_save(cr);
  cairo_move_to(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_show_text(cr, text);
  cairo_restore(cr);
}

/* The shape of one sentence's panels. */
typedef struct {
  gint heads, rows, cols;
  gint64 tq, tk;
  gchar **src_tokens, **out_tokens;
} Panels;

static Panels
panels_of(const HeatmapSentence *s)
{
  const QkvShape *shape = qkv_tensor_shape(s->weights);
  Panels p = {.heads = shape->rank == 4 ? (gint)shape->dims[1] : 1,
              .tq = shape->dims[shape->rank - 2],
              .tk = shape->dims[shape->rank - 1]};
  p.rows = (gint)MIN(s->out_len + 1, p.tq);
  p.cols = (gint)MIN(s->src_len, p.tk);
  p.src_tokens = g_strsplit(s->src_tokens ? s->src_tokens : s->source, " ", -1);
  p.out_tokens = g_strsplit(s->out_tokens ? s->out_tokens : s->translation, " ", -1);
  return p;
}

static const gchar *
row_token(const Panels *p, const HeatmapSentence *s, gint r)
{
  return r < s->out_len && r < (gint)g_strv_length(p->out_tokens) ? p->out_tokens[r] : "<eos>";
}

/* One sentence's row of panels with its top-left corner at (x0, y0). */
static void
draw_sentence(cairo_t *cr, const HeatmapSentence *s, const Panels *p, double x0, double y0)
{
  double panel_w = p->cols * CELL, panel_h = p->rows * CELL;
  g_autofree gchar *caption = g_strdup_printf("\"%s\" => \"%s\"", s->source, s->translation);
  cairo_set_source_rgb(cr, 0, 0, 0);
  draw_label(cr, caption, x0, y0 - LABELS_TOP + 14, 0);
  const float *w = qkv_tensor_const_data(s->weights);
  for (gint h = 0; h < p->heads; h++) {
    double px = x0 + h * (panel_w + GAP);
    for (gint r = 0; r < p->rows; r++)
      for (gint c = 0; c < p->cols; c++) {
        heatmap_colour(cr, w[((gsize)h * p->tq + r) * p->tk + c]);
        cairo_rectangle(cr, px + c * CELL, y0 + r * CELL, CELL, CELL);
        cairo_fill(cr);
      }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, px, y0, panel_w, panel_h);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    g_autofree gchar *head =
        p->heads > 1 ? g_strdup_printf("head %d of %d", h + 1, p->heads) : g_strdup("attention");
    draw_label(cr, head, px, y0 + panel_h + 20, 0);
    for (gint c = 0; c < p->cols; c++) {
      const gchar *tok = c < (gint)g_strv_length(p->src_tokens) ? p->src_tokens[c] : "<eos>";
      draw_label(cr, tok, px + c * CELL + CELL * 0.6, y0 - 6, -G_PI / 3);
    }
  }
  for (gint r = 0; r < p->rows; r++) {
    cairo_text_extents_t ext;
    cairo_text_extents(cr, row_token(p, s, r), &ext);
    draw_label(cr, row_token(p, s, r), x0 - ext.x_advance - 8, y0 + r * CELL + CELL * 0.6, 0);
  }
}

/* The widest translation token, so that no row label is cut off. */
static double
left_margin(cairo_t *cr, const HeatmapSentence *sentences, const Panels *panels, gint n)
{
  double widest = 60;
  for (gint i = 0; i < n; i++)
    for (gint r = 0; r < panels[i].rows; r++) {
      cairo_text_extents_t ext;
      cairo_text_extents(cr, row_token(&panels[i], &sentences[i], r), &ext);
      widest = MAX(widest, ext.x_advance);
    }
  return widest + 24;
}

gboolean
heatmap_write(const gchar *path, const HeatmapSentence *sentences, gint n, const gchar *attention,
              GError **error)
{
  g_return_val_if_fail(n >= 1, FALSE);
  g_autofree Panels *panels = g_new(Panels, n);
  double widest = 0, height = MARGIN_TOP;
  for (gint i = 0; i < n; i++) {
    panels[i] = panels_of(&sentences[i]);
    widest = MAX(widest, panels[i].heads * (panels[i].cols * CELL + GAP));
    height += LABELS_TOP + panels[i].rows * CELL + LABELS_BOTTOM;
  }
  /* room for the colour bar beside a short picture */
  height = MAX(height, MARGIN_TOP + LABELS_TOP + 120 + LABELS_BOTTOM);
  /* measure with a scratch surface, then draw */
  cairo_surface_t *probe = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
  cairo_t *pc = cairo_create(probe);
  cairo_select_font_face(pc, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(pc, 13);
  double left = left_margin(pc, sentences, panels, n);
  cairo_destroy(pc);
  cairo_surface_destroy(probe);
  double bar_x = left + widest;
  int width = (int)MAX(bar_x + 90, 520);
  cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, (int)height);
  cairo_t *cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);
  g_autofree gchar *title = g_strdup_printf("encoder-decoder attention, %s", attention);
  cairo_set_source_rgb(cr, 0, 0, 0);
  draw_label(cr, title, 10, 22, 0);
  double y = MARGIN_TOP;
  for (gint i = 0; i < n; i++) {
    draw_sentence(cr, &sentences[i], &panels[i], left, y + LABELS_TOP);
    y += LABELS_TOP + panels[i].rows * CELL + LABELS_BOTTOM;
  }
  heatmap_draw_colour_bar(cr, bar_x, MARGIN_TOP + LABELS_TOP,
                          MAX(120.0, height - MARGIN_TOP - LABELS_TOP - LABELS_BOTTOM),
                          "attention weight");
  for (gint i = 0; i < n; i++) {
    g_strfreev(panels[i].src_tokens);
    g_strfreev(panels[i].out_tokens);
  }
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
