/* plot.c: the line charts of plot.h. */
#include "plot.h"

#include <cairo.h>
#include <math.h>

#define FONT_SIZE 12.0
#define MARGIN_LEFT 78.0
#define MARGIN_RIGHT 24.0
#define MARGIN_TOP 40.0
#define MARGIN_BOTTOM 52.0
#define PANEL_GAP 22.0

/* One axis's range in data units (log10 of them on a log axis). */
typedef struct {
  double lo, hi;
  gboolean log;
} Axis;

static void
set_rgb(cairo_t *cr, guint32 rgb, double alpha)
{
  cairo_set_source_rgba(cr, ((rgb >> 16) & 0xff) / 255.0, ((rgb >> 8) & 0xff) / 255.0,
                        (rgb & 0xff) / 255.0, alpha > 0 ? alpha : 1.0);
}

static gboolean
usable(double v, gboolean log)
{
  return isfinite(v) && (!log || v > 0);
}

static double
axis_value(const Axis *a, double v)
{
  return a->log ? log10(v) : v;
}

/* The data's range with matplotlib's 5% margins; a single value gets a
 * range around it. FALSE when no point is usable. */
static gboolean
axis_fit(Axis *a, const PlotSeries *series, gsize n_series, gboolean use_x, gboolean log)
{
  double lo = INFINITY, hi = -INFINITY;
  for (gsize s = 0; s < n_series; s++)
    for (gsize i = 0; i < series[s].n; i++) {
      double v = use_x ? series[s].x[i] : series[s].y[i];
      double other = use_x ? series[s].y[i] : series[s].x[i];
      if (!usable(v, log) || !isfinite(other))
        continue;
      v = log ? log10(v) : v;
      lo = MIN(lo, v);
      hi = MAX(hi, v);
    }
  if (lo > hi)
    return FALSE;
  if (hi - lo < 1e-12 * MAX(1.0, fabs(hi))) {
    /* a constant: a tenth of it either side (matplotlib widens by less) */
    double pad = log ? 0.5 : hi != 0 ? fabs(hi) * 0.1 : 0.5;
    lo -= pad;
    hi += pad;
  }
  double margin = (hi - lo) * 0.05;
  *a = (Axis){lo - margin, hi + margin, log};
  return TRUE;
}

/* A round tick spacing giving about target ticks over range. */
static double
nice_step(double range, gint target)
{
  double raw = range / target, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
  return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * mag;
}

/* Tick positions in axis units: round numbers on a linear axis; on a log
 * axis the powers of ten, with 2 and 5 between them when the range spans
 * under two decades. */
static GArray *
axis_ticks(const Axis *a, gint target)
{
  GArray *ticks = g_array_new(FALSE, FALSE, sizeof(double));
  if (!a->log) {
    double step = nice_step(a->hi - a->lo, target);
    for (double t = ceil(a->lo / step) * step; t <= a->hi + step * 1e-9; t += step) {
      double v = fabs(t) < step * 1e-9 ? 0.0 : t;
      g_array_append_val(ticks, v);
    }
    return ticks;
  }
  gboolean minor = a->hi - a->lo < 2.0;
  gint decade_step = MAX(1, (gint)ceil((a->hi - a->lo) / target));
  for (gint k = (gint)floor(a->lo); k <= (gint)ceil(a->hi); k++) {
    const double mult[] = {1, 2, 5};
    for (guint m = 0; m < (minor ? 3u : 1u); m++) {
      double t = k + log10(mult[m]);
      if (t >= a->lo && t <= a->hi && (minor || k % decade_step == 0))
        g_array_append_val(ticks, t);
    }
  }
  return ticks;
}

static void
tick_label(gchar *buf, gsize size, const Axis *a, double t)
{
  double v = a->log ? pow(10.0, t) : t;
  g_snprintf(buf, size, "%.4g", v);
}

static void
draw_text(cairo_t *cr, const gchar *text, double x, double y, double align_x, double align_y,
          double angle)
{
  cairo_text_extents_t ext;
  cairo_text_extents(cr, text, &ext);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_move_to(cr, -ext.x_advance * align_x, ext.height * align_y);
  cairo_show_text(cr, text);
  cairo_restore(cr);
}

/* The panel's frame: pixel box and both axes. */
typedef struct {
  double x0, y0, w, h;
  Axis x, y;
} Frame;

static double
frame_px(const Frame *f, double x)
{
  return f->x0 + (x - f->x.lo) / (f->x.hi - f->x.lo) * f->w;
}

static double
frame_py(const Frame *f, double y)
{
  return f->y0 + f->h - (axis_value(&f->y, y) - f->y.lo) / (f->y.hi - f->y.lo) * f->h;
}

/* Grid lines, ticks and tick labels (the x labels only on the bottom
 * panel), then the frame. */
static void
draw_axes(cairo_t *cr, const Frame *f, gboolean x_labels)
{
  g_autoptr(GArray) xt = axis_ticks(&f->x, 8);
  g_autoptr(GArray) yt = axis_ticks(&f->y, 5);
  gchar buf[32];
  cairo_set_line_width(cr, 1.0);
  for (guint i = 0; i < xt->len; i++) {
    double px = frame_px(f, g_array_index(xt, double, i));
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, px, f->y0);
    cairo_line_to(cr, px, f->y0 + f->h);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, px, f->y0 + f->h);
    cairo_line_to(cr, px, f->y0 + f->h + 4);
    cairo_stroke(cr);
    if (x_labels) {
      tick_label(buf, sizeof buf, &f->x, g_array_index(xt, double, i));
      draw_text(cr, buf, px, f->y0 + f->h + 8, 0.5, 1.0, 0);
    }
  }
  for (guint i = 0; i < yt->len; i++) {
    double t = g_array_index(yt, double, i);
    double py = f->y0 + f->h - (t - f->y.lo) / (f->y.hi - f->y.lo) * f->h;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, f->x0, py);
    cairo_line_to(cr, f->x0 + f->w, py);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, f->x0 - 4, py);
    cairo_line_to(cr, f->x0, py);
    cairo_stroke(cr);
    tick_label(buf, sizeof buf, &f->y, t);
    draw_text(cr, buf, f->x0 - 7, py, 1.0, 0.5, 0);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, f->x0, f->y0, f->w, f->h);
  cairo_stroke(cr);
}

static void
draw_series(cairo_t *cr, const Frame *f, const PlotSeries *s)
{
  cairo_save(cr);
  cairo_rectangle(cr, f->x0, f->y0, f->w, f->h);
  cairo_clip(cr);
  set_rgb(cr, s->rgb, s->alpha);
  if (s->line_width > 0) {
    const double dash[] = {6.0, 4.0};
    cairo_set_dash(cr, dash, s->dashed ? 2 : 0, 0);
    cairo_set_line_width(cr, s->line_width);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    gboolean drawing = FALSE;
    for (gsize i = 0; i < s->n; i++) {
      if (!isfinite(s->x[i]) || !usable(s->y[i], f->y.log)) {
        drawing = FALSE;
        continue;
      }
      double px = frame_px(f, s->x[i]), py = frame_py(f, s->y[i]);
      if (drawing)
        cairo_line_to(cr, px, py);
      else
        cairo_move_to(cr, px, py);
      drawing = TRUE;
    }
    cairo_stroke(cr);
  }
  if (s->markers)
    for (gsize i = 0; i < s->n; i++)
      if (isfinite(s->x[i]) && usable(s->y[i], f->y.log)) {
        cairo_arc(cr, frame_px(f, s->x[i]), frame_py(f, s->y[i]), 3.0, 0, 2 * G_PI);
        cairo_fill(cr);
      }
  cairo_restore(cr);
}

/* Points of the series inside the box (x, y, w, h). */
static gsize
points_under(const Frame *f, const PlotSeries *series, gsize n, double x, double y, double w,
             double h)
{
  gsize under = 0;
  for (gsize s = 0; s < n; s++)
    for (gsize i = 0; i < series[s].n; i++) {
      if (!isfinite(series[s].x[i]) || !usable(series[s].y[i], f->y.log))
        continue;
      double px = frame_px(f, series[s].x[i]), py = frame_py(f, series[s].y[i]);
      under += px >= x && px <= x + w && py >= y && py <= y + h;
    }
  return under;
}

/* matplotlib's loc="best": of the four corners, the one whose box covers
 * the fewest points (the upper right on a tie). */
static void
legend_place(const Frame *f, const PlotSeries *series, gsize n, double w, double h, double *x,
             double *y)
{
  const double left = f->x0 + 8, right = f->x0 + f->w - w - 8;
  const double top = f->y0 + 8, bottom = f->y0 + f->h - h - 8;
  const double corners[4][2] = {{right, top}, {left, top}, {right, bottom}, {left, bottom}};
  gsize best = G_MAXSIZE;
  *x = right;
  *y = top;
  for (guint c = 0; c < 4; c++) {
    gsize under = points_under(f, series, n, corners[c][0], corners[c][1], w, h);
    if (under < best) {
      best = under;
      *x = corners[c][0];
      *y = corners[c][1];
    }
  }
}

/* matplotlib's legend: a white box with a grey edge in the corner that
 * hides the fewest points, each entry's line (and marker) before its
 * label. */
static void
draw_legend(cairo_t *cr, const Frame *f, const PlotSeries *series, gsize n)
{
  double widest = 0;
  gint entries = 0;
  for (gsize s = 0; s < n; s++) {
    if (series[s].label == NULL)
      continue;
    cairo_text_extents_t ext;
    cairo_text_extents(cr, series[s].label, &ext);
    widest = MAX(widest, ext.x_advance);
    entries++;
  }
  if (entries == 0)
    return;
  double row = FONT_SIZE + 6, w = widest + 48, h = entries * row + 8;
  double x = 0, y = 0;
  legend_place(f, series, n, w, h, &x, &y);
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_rectangle(cr, x, y, w, h);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
  cairo_set_line_width(cr, 1.0);
  cairo_stroke(cr);
  gint at = 0;
  for (gsize s = 0; s < n; s++) {
    const PlotSeries *p = &series[s];
    if (p->label == NULL)
      continue;
    double cy = y + 4 + row * (at++ + 0.5);
    if (p->line_width > 0) {
      const double dash[] = {6.0, 4.0};
      set_rgb(cr, p->rgb, MAX(p->alpha, 0.7));
      cairo_set_dash(cr, dash, p->dashed ? 2 : 0, 0);
      cairo_set_line_width(cr, p->line_width);
      cairo_move_to(cr, x + 8, cy);
      cairo_line_to(cr, x + 32, cy);
      cairo_stroke(cr);
      cairo_set_dash(cr, NULL, 0, 0);
    }
    if (p->markers) {
      set_rgb(cr, p->rgb, 1.0);
      cairo_arc(cr, x + 20, cy, 3.0, 0, 2 * G_PI);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    draw_text(cr, p->label, x + 40, cy, 0.0, 0.4, 0);
  }
}

static void
draw_panel(cairo_t *cr, const PlotPanel *p, const Axis *x_axis, double top, double height,
           double width, gboolean bottom)
{
  Frame f = {MARGIN_LEFT, top, width - MARGIN_LEFT - MARGIN_RIGHT, height, *x_axis, {0, 1, FALSE}};
  if (!axis_fit(&f.y, p->series, p->n_series, FALSE, p->log_y))
    f.y = (Axis){p->log_y ? -1.0 : 0.0, 1.0, p->log_y};
  draw_axes(cr, &f, bottom);
  for (gsize s = 0; s < p->n_series; s++)
    draw_series(cr, &f, &p->series[s]);
  draw_legend(cr, &f, p->series, p->n_series);
  if (p->y_label != NULL) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    draw_text(cr, p->y_label, 18, top + height / 2, 0.5, 0.0, -G_PI / 2);
  }
}

gboolean
plot_write_png(const gchar *path, const gchar *title, const gchar *x_label, const PlotPanel *panels,
               gsize n_panels, gint width, gint height, GError **error)
{
  g_return_val_if_fail(path != NULL && n_panels > 0 && width > 0 && height > 0, FALSE);
  Axis x_axis = {0, 1, FALSE};
  gboolean fitted = FALSE;
  for (gsize p = 0; p < n_panels && !fitted; p++)
    fitted = axis_fit(&x_axis, panels[p].series, panels[p].n_series, TRUE, FALSE);
  /* the x range of every panel together */
  for (gsize p = 0; p < n_panels; p++) {
    Axis a;
    if (axis_fit(&a, panels[p].series, panels[p].n_series, TRUE, FALSE)) {
      x_axis.lo = MIN(x_axis.lo, a.lo);
      x_axis.hi = MAX(x_axis.hi, a.hi);
    }
  }
  cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t *cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, FONT_SIZE);
  double total = 0;
  for (gsize p = 0; p < n_panels; p++)
    total += panels[p].height > 0 ? panels[p].height : 1.0;
  double space = height - MARGIN_TOP - MARGIN_BOTTOM - PANEL_GAP * (double)(n_panels - 1);
  double top = MARGIN_TOP;
  for (gsize p = 0; p < n_panels; p++) {
    double h = space * (panels[p].height > 0 ? panels[p].height : 1.0) / total;
    draw_panel(cr, &panels[p], &x_axis, top, h, width, p + 1 == n_panels);
    top += h + PANEL_GAP;
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  if (x_label != NULL)
    draw_text(cr, x_label, MARGIN_LEFT + (width - MARGIN_LEFT - MARGIN_RIGHT) / 2, height - 12, 0.5,
              0.0, 0);
  if (title != NULL) {
    cairo_set_font_size(cr, FONT_SIZE + 2);
    draw_text(cr, title, width / 2.0, 20, 0.5, 0.5, 0);
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
