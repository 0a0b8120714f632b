/* dist-none.c: qkv-dist.h in a qkv built without MPI. Creating a group fails
 * with QKV_DIST_ERROR_UNAVAILABLE, so no other function can be reached with a
 * valid QkvDist; they exist so that programs link either way. */
#include "qkv/qkv-dist.h"

#include <string.h>
#include "error-private.h"

/* clang-format would write the quark's name with spaces, and every binding
 * would see them: keep it away from the formatter. */
// clang-format off
G_DEFINE_QUARK(qkv-dist-error-quark, qkv_dist_error)
// clang-format on

struct _QkvDist {
  gint unused;
};

gboolean
qkv_dist_available(void)
{
  return FALSE;
}

static void
set_unavailable(GError **error)
{
  g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_UNAVAILABLE,
              "this qkv was built without MPI: install Open MPI (Debian: libopenmpi-dev "
              "openmpi-bin) and rebuild with meson setup -Dmpi=enabled");
}

QkvDist *
qkv_dist_init(int *argc, char ***argv, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  set_unavailable(error);
  return NULL;
}

QkvDist *
qkv_dist_new_for_comm(const void *mpi_comm, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  set_unavailable(error);
  return NULL;
}

void
qkv_dist_free(QkvDist *dist)
{
  g_free(dist);
}

gboolean
qkv_dist_leave(QkvDist *dist, const gchar *reason, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

gint
qkv_dist_rank(const QkvDist *dist)
{
  return 0;
}

gint
qkv_dist_world_size(const QkvDist *dist)
{
  return 1;
}

gint
qkv_dist_local_size(const QkvDist *dist)
{
  return 1;
}

gboolean
qkv_dist_is_root(const QkvDist *dist)
{
  return TRUE;
}

void
qkv_dist_set_timeout(QkvDist *dist, double seconds)
{
}

double
qkv_dist_get_timeout(const QkvDist *dist)
{
  return 0;
}

void
qkv_dist_set_bucket_bytes(QkvDist *dist, gsize bytes)
{
}

void
qkv_dist_shard(const QkvDist *dist, gint64 n, gint64 *offset, gint64 *count)
{
  *offset = 0;
  *count = n;
}

gboolean
qkv_dist_check_batch(const QkvDist *dist, gint64 batch_size, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  return TRUE;
}

gboolean
qkv_dist_broadcast_params(QkvDist *dist, QkvParams *params, QkvOptimizer *optimizer, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

gboolean
qkv_dist_allreduce_grads(QkvDist *dist, QkvParams *params, QkvDistReduce op, float *extra,
                         guint n_extra, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

gboolean
qkv_dist_allreduce(QkvDist *dist, double *values, guint n, QkvDistReduce op, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

gboolean
qkv_dist_barrier(QkvDist *dist, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

gboolean
qkv_dist_agree(QkvDist *dist, const gchar *what, const gchar *value, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  set_unavailable(error);
  return FALSE;
}

void
qkv_dist_report_sigterm(QkvDist *dist, const gchar *prefix)
{
}

void
qkv_dist_get_stats(const QkvDist *dist, QkvDistStats *stats)
{
  memset(stats, 0, sizeof *stats);
}

void
qkv_dist_reset_stats(QkvDist *dist)
{
}
