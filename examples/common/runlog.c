/* runlog.c: the JSONL run log and its plot (runlog.h). */
#include "runlog.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <glib/gstdio.h>
#include <qkv/qkv.h>

#include "plot.h"

struct RunLog {
  FILE *file; /* NULL: memory only */
  gchar *path;
  GArray *records; /* RunLogRecord; event and run interned */
};

RunLogRecord
run_log_record(const gchar *event, gint epoch, gint64 step)
{
  return (RunLogRecord){.event = event,
                        .epoch = epoch,
                        .step = step,
                        .lr = NAN,
                        .loss = NAN,
                        .grad_norm = NAN,
                        .tokens_per_s = NAN,
                        .elapsed_s = NAN,
                        .valid_loss = NAN,
                        .valid_bleu = NAN,
                        .valid_accuracy = NAN};
}

/* A JSON string, quoted and escaped by json-glib. */
static void
append_string(GString *line, const gchar *name, const gchar *value)
{
  g_autoptr(JsonNode) node = json_node_new(JSON_NODE_VALUE);
  json_node_set_string(node, value);
  g_autofree gchar *json = json_to_string(node, FALSE);
  g_string_append_printf(line, "%s\"%s\": %s", line->len > 1 ? ", " : "", name, json);
}

/* A number with 7 significant digits (json-glib would write 17: 0.005 as
 * 0.0050000000000000001); NaN, not measured, is left out; JSON has no
 * infinity, so a loss that overflowed is null. */
static void
append_double(GString *line, const gchar *name, double value)
{
  if (isnan(value))
    return;
  gchar buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_string_append_printf(line, "%s\"%s\": %s", line->len > 1 ? ", " : "", name,
                         isfinite(value) ? g_ascii_formatd(buf, sizeof buf, "%.7g", value)
                                         : "null");
}

static gboolean
write_line(RunLog *log, GString *line, GError **error)
{
  g_string_append(line, "}\n");
  if (fputs(line->str, log->file) == EOF || fflush(log->file) != 0) {
    int saved = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(saved), "writing %s: %s", log->path,
                g_strerror(saved));
    return FALSE;
  }
  return TRUE;
}

RunLog *
run_log_new(const gchar *jsonl_path, const gchar *program, GError **error)
{
  RunLog *log = g_new0(RunLog, 1);
  log->records = g_array_new(FALSE, FALSE, sizeof(RunLogRecord));
  if (jsonl_path == NULL)
    return log;
  log->path = g_strdup(jsonl_path);
  log->file = g_fopen(jsonl_path, "w");
  if (log->file == NULL) {
    int saved = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(saved), "--log %s: %s", jsonl_path,
                g_strerror(saved));
    run_log_free(log);
    return NULL;
  }
  g_autoptr(GDateTime) now = g_date_time_new_now_utc();
  g_autofree gchar *time = g_date_time_format_iso8601(now);
  g_autoptr(GString) line = g_string_new("{");
  append_string(line, "event", "start");
  append_string(line, "program", program);
  append_string(line, "qkv_version", qkv_version());
  append_string(line, "time", time);
  if (!write_line(log, line, error)) {
    run_log_free(log);
    return NULL;
  }
  return log;
}

void
run_log_free(RunLog *log)
{
  if (log == NULL)
    return;
  if (log->file != NULL)
    fclose(log->file);
  g_free(log->path);
  g_array_unref(log->records);
  g_free(log);
}

gboolean
run_log_add(RunLog *log, const RunLogRecord *record, GError **error)
{
  RunLogRecord kept = *record;
  kept.event = g_intern_string(record->event);
  kept.run = record->run != NULL ? g_intern_string(record->run) : NULL;
  g_array_append_val(log->records, kept);
  if (log->file == NULL)
    return TRUE;
  g_autoptr(GString) line = g_string_new("{");
  append_string(line, "event", record->event);
  if (record->run != NULL)
    append_string(line, "run", record->run);
  g_string_append_printf(line, ", \"epoch\": %d, \"step\": %" G_GINT64_FORMAT, record->epoch,
                         record->step);
  append_double(line, "lr", record->lr);
  append_double(line, "loss", record->loss);
  append_double(line, "grad_norm", record->grad_norm);
  append_double(line, "tokens_per_s", record->tokens_per_s);
  append_double(line, "elapsed_s", record->elapsed_s);
  append_double(line, "valid_loss", record->valid_loss);
  append_double(line, "valid_bleu", record->valid_bleu);
  append_double(line, "valid_accuracy", record->valid_accuracy);
  return write_line(log, line, error);
}

double
run_log_grad_norm(QkvParams *params)
{
  double sum = 0;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    QkvTensor *g = qkv_param_grad(p);
    if (qkv_param_get_frozen(p) || g == NULL || qkv_tensor_dtype(g) != QKV_F32)
      continue;
    const float *x = qkv_tensor_f32(g);
    for (gint64 k = 0, n = qkv_tensor_numel(g); k < n; k++)
      sum += (double)x[k] * x[k];
  }
  return sqrt(sum);
}

/* One curve being gathered: x (the step) and y. */
typedef struct {
  GArray *x, *y;
} Curve;

static void
curve_add(Curve *c, double x, double y)
{
  if (c->x == NULL) {
    c->x = g_array_new(FALSE, FALSE, sizeof(double));
    c->y = g_array_new(FALSE, FALSE, sizeof(double));
  }
  g_array_append_val(c->x, x);
  g_array_append_val(c->y, y);
}

enum {
  CURVE_STEP_LOSS,
  CURVE_EPOCH_LOSS,
  CURVE_VALID_LOSS,
  CURVE_BLEU,
  CURVE_ACCURACY,
  CURVE_LR,
  N_CURVES
};

/* The curves of one run. */
typedef struct {
  const gchar *run;
  Curve curves[N_CURVES];
} RunCurves;

static void
gather(const RunLog *log, GArray *runs)
{
  for (guint i = 0; i < log->records->len; i++) {
    const RunLogRecord *r = &g_array_index(log->records, RunLogRecord, i);
    RunCurves *rc = NULL;
    for (guint k = 0; k < runs->len && rc == NULL; k++)
      if (g_array_index(runs, RunCurves, k).run == r->run)
        rc = &g_array_index(runs, RunCurves, k);
    if (rc == NULL) {
      RunCurves fresh = {.run = r->run};
      g_array_append_val(runs, fresh);
      rc = &g_array_index(runs, RunCurves, runs->len - 1);
    }
    gboolean step = g_str_equal(r->event, "step");
    double x = (double)r->step;
    if (!isnan(r->loss))
      curve_add(&rc->curves[step ? CURVE_STEP_LOSS : CURVE_EPOCH_LOSS], x, r->loss);
    if (!isnan(r->valid_loss))
      curve_add(&rc->curves[CURVE_VALID_LOSS], x, r->valid_loss);
    if (!isnan(r->valid_bleu))
      curve_add(&rc->curves[CURVE_BLEU], x, r->valid_bleu);
    if (!isnan(r->valid_accuracy))
      curve_add(&rc->curves[CURVE_ACCURACY], x, r->valid_accuracy);
    if (step && !isnan(r->lr))
      curve_add(&rc->curves[CURVE_LR], x, r->lr);
  }
}

static const gchar *const curve_names[N_CURVES] = {
    "training loss (each step)", "training loss (epoch)", "validation loss",
    "validation BLEU",           "validation accuracy",   "learning rate"};

/* The series of one curve of every run, in the style matplotlib users
 * expect: training blue, validation orange for one run; a colour per run
 * (validation dashed) for several. */
static void
add_series(GArray *series, GArray *runs, gint curve, GPtrArray *labels)
{
  static const guint32 palette[] = {PLOT_C0, PLOT_C1, PLOT_C2, PLOT_C3, PLOT_C4, PLOT_C5};
  gboolean several = runs->len > 1;
  for (guint k = 0; k < runs->len; k++) {
    const RunCurves *rc = &g_array_index(runs, RunCurves, k);
    const Curve *c = &rc->curves[curve];
    if (c->x == NULL)
      continue;
    gboolean valid = curve == CURVE_VALID_LOSS || curve == CURVE_BLEU || curve == CURVE_ACCURACY;
    PlotSeries s = {
        .x = (const double *)c->x->data, .y = (const double *)c->y->data, .n = c->x->len};
    s.rgb = several ? palette[k % G_N_ELEMENTS(palette)] : valid ? PLOT_C1 : PLOT_C0;
    if (curve == CURVE_LR)
      s.rgb = several ? s.rgb : PLOT_C2;
    s.line_width = curve == CURVE_STEP_LOSS ? 1.0 : 2.0;
    s.alpha = curve == CURVE_STEP_LOSS ? 0.35 : 1.0;
    s.markers = valid && c->x->len <= 60;
    s.dashed = several && valid;
    gchar *label = several && rc->run != NULL
                       ? g_strdup_printf("%s: %s", rc->run, curve_names[curve])
                       : g_strdup(curve_names[curve]);
    g_ptr_array_add(labels, label);
    s.label = label;
    g_array_append_val(series, s);
  }
}

/* Whether the losses span so many orders of magnitude that a log axis shows
 * them better (a loss falling from 5 to 0.03 is a flat line on a linear
 * one). */
static gboolean
wants_log(const GArray *series)
{
  double lo = INFINITY, hi = 0;
  for (guint s = 0; s < series->len; s++) {
    const PlotSeries *p = &g_array_index(series, PlotSeries, s);
    for (gsize i = 0; i < p->n; i++)
      if (isfinite(p->y[i]) && p->y[i] > 0) {
        lo = MIN(lo, p->y[i]);
        hi = MAX(hi, p->y[i]);
      }
  }
  return lo < hi && hi / lo > 30;
}

gboolean
run_log_plot(const RunLog *log, const gchar *png_path, const gchar *title, GError **error)
{
  g_autoptr(GArray) runs = g_array_new(FALSE, TRUE, sizeof(RunCurves));
  gather(log, runs);
  g_autoptr(GPtrArray) labels = g_ptr_array_new_with_free_func(g_free);
  GArray *per_panel[4];
  const gint panel_curves[4][3] = {{CURVE_STEP_LOSS, CURVE_EPOCH_LOSS, CURVE_VALID_LOSS},
                                   {CURVE_BLEU, -1, -1},
                                   {CURVE_ACCURACY, -1, -1},
                                   {CURVE_LR, -1, -1}};
  const gchar *y_labels[4] = {"loss", "BLEU", "accuracy", "learning rate"};
  PlotPanel panels[4];
  gsize n_panels = 0;
  for (guint p = 0; p < 4; p++) {
    per_panel[p] = g_array_new(FALSE, FALSE, sizeof(PlotSeries));
    for (guint c = 0; c < 3 && panel_curves[p][c] >= 0; c++)
      add_series(per_panel[p], runs, panel_curves[p][c], labels);
    if (per_panel[p]->len == 0 && p > 0)
      continue;
    gboolean log_y = p == 0 && wants_log(per_panel[p]);
    panels[n_panels++] = (PlotPanel){
        .y_label = log_y ? "loss (log scale)" : y_labels[p],
        .log_y = log_y,
        .series = (const PlotSeries *)per_panel[p]->data,
        .n_series = per_panel[p]->len,
        .height = p == 0 ? 2.5 : 1.0,
    };
  }
  gboolean ok = plot_write_png(png_path, title, "optimizer step", panels, n_panels, 800,
                               n_panels > 1 ? 360 + 160 * (gint)(n_panels - 1) : 480, error);
  for (guint p = 0; p < 4; p++)
    g_array_unref(per_panel[p]);
  for (guint k = 0; k < runs->len; k++)
    for (gint c = 0; c < N_CURVES; c++) {
      Curve *curve = &g_array_index(runs, RunCurves, k).curves[c];
      if (curve->x != NULL) {
        g_array_unref(curve->x);
        g_array_unref(curve->y);
      }
    }
  return ok;
}
