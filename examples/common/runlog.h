/* runlog.h: a training run's log, for the examples' --log and --plot.
 *
 * --log FILE.jsonl writes one JSON object per line: a "start" record (the
 * program, qkv's version, the time), then one record per optimizer step and
 * one per epoch, as they happen (each line is flushed, so `tail -f` follows
 * a run). A record holds the fields that were measured:
 *
 *   {"event": "step", "epoch": 3, "step": 25, "lr": 0.005, "loss": 1.93,
 *    "grad_norm": 0.87, "tokens_per_s": 31500, "elapsed_s": 0.71}
 *   {"event": "epoch", "epoch": 3, "step": 30, "lr": 0.005, "loss": 2.01,
 *    "tokens_per_s": 30900, "elapsed_s": 0.85, "valid_loss": 2.4,
 *    "valid_bleu": 3.1}
 *
 * --plot FILE.png draws the records kept in memory: the training loss of
 * every step and of every epoch, the validation loss where measured, and
 * the learning rate below them, against the optimizer step. */
#pragma once

#include <glib.h>
#include <qkv/qkv.h>

typedef struct RunLog RunLog;

/* One record; the doubles that are NaN were not measured and are left out
 * (run_log_record() starts with every one NaN). */
typedef struct {
  const gchar *event; /* "step" or "epoch" */
  const gchar *run;   /* which model, where a program trains several; NULL */
  gint epoch;         /* from 1 */
  gint64 step;        /* optimizer steps so far, this one included */
  double lr;
  double loss;
  double grad_norm;
  double tokens_per_s;
  double elapsed_s; /* since training started */
  double valid_loss;
  double valid_bleu;
  double valid_accuracy;
} RunLogRecord;

RunLogRecord run_log_record(const gchar *event, gint epoch, gint64 step);

/* A log that writes to jsonl_path (NULL: kept in memory only, for a plot)
 * on behalf of program. Fails when the file cannot be created. */
RunLog *run_log_new(const gchar *jsonl_path, const gchar *program, GError **error);
void run_log_free(RunLog *log);
/* Write one record (and keep it for the plot). Fails when the line cannot
 * be written. */
gboolean run_log_add(RunLog *log, const RunLogRecord *record, GError **error);
/* The plot of the records so far, titled title, to png_path. */
gboolean run_log_plot(const RunLog *log, const gchar *png_path, const gchar *title, GError **error);

/* The global L2 norm of the parameters' gradients (the frozen ones left
 * out), for a log's grad_norm where no clipping computes it; it only reads
 * them (clipping by an infinite norm could still scale NaNs). */
double run_log_grad_norm(QkvParams *params);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(RunLog, run_log_free)
