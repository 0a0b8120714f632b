/* distributed.c: the --distributed mode of qkv-seq2seq (see distributed.h). */
#include "distributed.h"

#include <stdio.h>
#include <qkv/qkv-dist.h>

static QkvDist *dist = NULL;
static FILE *step_log = NULL;

gboolean
seq2seq_dist_start(gint global_batch, GError **error)
{
  dist = qkv_dist_init(NULL, NULL, error);
  if (dist == NULL)
    return FALSE;
  /* mpirun stops the other ranks with SIGTERM when one dies: say why */
  qkv_dist_report_sigterm(dist, "qkv-seq2seq");
  if (!qkv_dist_check_batch(dist, global_batch, error))
    return FALSE;
  /* one report, not one per rank */
  if (!qkv_dist_is_root(dist) && freopen("/dev/null", "w", stdout) == NULL)
    g_warning("rank %d: cannot silence stdout", qkv_dist_rank(dist));
  return TRUE;
}

void
seq2seq_dist_finish(void)
{
  g_clear_pointer(&dist, qkv_dist_free);
}

gboolean
seq2seq_dist_active(void)
{
  return dist != NULL;
}

gboolean
seq2seq_dist_is_root(void)
{
  return dist == NULL || qkv_dist_is_root(dist);
}

gint
seq2seq_dist_rank(void)
{
  return dist != NULL ? qkv_dist_rank(dist) : 0;
}

gint
seq2seq_dist_world_size(void)
{
  return dist != NULL ? qkv_dist_world_size(dist) : 1;
}

void
seq2seq_dist_reseed(QkvPlan *plan, guint64 seed)
{
  if (dist != NULL && qkv_dist_rank(dist) > 0)
    qkv_plan_set_seed(plan,
                      seed + G_GUINT64_CONSTANT(0x9E3779B97F4A7C15) * (guint64)qkv_dist_rank(dist));
}

gint
seq2seq_dist_default_threads(void)
{
  gint local = dist != NULL ? qkv_dist_local_size(dist) : 1;
  return MAX(1, (gint)g_get_num_processors() / local);
}

void
seq2seq_dist_shard(gint batch, gint *offset, gint *count)
{
  gint64 off = 0, n = batch;
  if (dist != NULL)
    qkv_dist_shard(dist, batch, &off, &n);
  *offset = (gint)off;
  *count = (gint)n;
}

gboolean
seq2seq_dist_broadcast(QkvParams *params, QkvOptimizer *optimizer, GError **error)
{
  return dist == NULL || qkv_dist_broadcast_params(dist, params, optimizer, error);
}

gboolean
seq2seq_dist_reduce(QkvParams *params, double *loss, double *tokens, GError **error)
{
  if (dist == NULL)
    return TRUE;
  float extra[2] = {(float)*loss, (float)*tokens};
  if (!qkv_dist_allreduce_grads(dist, params, QKV_DIST_SUM, extra, 2, error))
    return FALSE;
  *loss = extra[0];
  *tokens = extra[1];
  return TRUE;
}

void
seq2seq_dist_print_error(const gchar *program, const GError *error)
{
  if (dist == NULL) {
    g_printerr("%s: %s\n", program, error->message);
    return;
  }
  if (error->domain == QKV_DIST_ERROR && error->code == QKV_DIST_ERROR_MISMATCH &&
      !qkv_dist_is_root(dist))
    return;
  g_printerr("%s (rank %d): %s\n", program, qkv_dist_rank(dist), error->message);
}

gboolean
seq2seq_step_log_open(const gchar *path, GError **error)
{
  if (!seq2seq_dist_is_root())
    return TRUE;
  step_log = fopen(path, "w");
  if (step_log == NULL) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "--step-losses %s: cannot write it",
                path);
    return FALSE;
  }
  return TRUE;
}

void
seq2seq_step_log(gint64 step, double loss)
{
  if (step_log != NULL)
    fprintf(step_log, "%" G_GINT64_FORMAT " %.9g\n", step, loss);
}

void
seq2seq_step_log_close(void)
{
  if (step_log != NULL)
    fclose(step_log);
  step_log = NULL;
}
