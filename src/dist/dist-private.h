/* dist-private.h: what dist.c (the process group, the agreement and wait
 * before every collective, leaving, and the watchdog) shares with
 * dist-collectives.c (the broadcast, the all-reduces, the barrier and
 * qkv_dist_agree()). Both are built only when Meson found MPI. */
#pragma once

#include "qkv/qkv-dist.h"

#include <mpi.h>

#define HOST_LEN 128

typedef struct {
  char host[HOST_LEN];
  gint64 pid;
} Peer;

/* Which collective a rank is at: part of what the ranks agree on before
 * each (qkv_dist_arrive()). */
typedef enum {
  QKV_DIST_OP_LEAVE = 1,
  QKV_DIST_OP_BROADCAST,
  QKV_DIST_OP_PARAM_CHECK,
  QKV_DIST_OP_STATE_CHECK,
  QKV_DIST_OP_GRADS,
  QKV_DIST_OP_ALLREDUCE,
  QKV_DIST_OP_BARRIER,
  QKV_DIST_OP_AGREE,
} QkvDistOp;

struct _QkvDist {
  MPI_Comm comm;
  gint rank, size, local_size;
  gboolean owns_mpi; /* qkv_dist_init() called MPI_Init_thread */
  gboolean broken;
  /* this rank left, or the ranks reached different collectives: no more
   * collectives, but none is left half done, so MPI can still finalize */
  gboolean ended;
  gchar *ended_why;
  gint64 seq; /* collectives started */
  double timeout;
  gsize bucket_bytes;
  Peer *peers;  /* per rank */
  float *flat;  /* the packed gradients */
  gsize flat_n; /* floats allocated */
  QkvDistStats stats;
  /* the watchdog: see arm() in dist.c */
  GThread *watchdog;
  gint watchdog_stop;
  gint64 armed_since; /* monotonic µs; 0: not in a blocking collective */
  const gchar *armed_what;
  gchar *prefix; /* for the watchdog's message */
};

static inline double
now_s(void)
{
  return (double)g_get_monotonic_time() * 1e-6;
}

/* TRUE if rc is MPI_SUCCESS; otherwise a QKV_DIST_ERROR_MPI naming what,
 * and the group (if any) is marked broken. */
gboolean qkv_dist_mpi_check(QkvDist *dist, int rc, const gchar *what, GError **error);
/* FALSE with QKV_DIST_ERROR_BROKEN once a collective has failed or the
 * group has ended. */
gboolean qkv_dist_check_usable(QkvDist *dist, GError **error);
/* Waits until every rank reaches this point, noticing dead local peers and
 * the timeout, and checks that every rank is at the same collective: op, and
 * size (its payload's elements, or for QKV_DIST_OP_AGREE a hash of label)
 * must be equal. label says more for messages: what an agreement is about,
 * or why a rank leaves (may be NULL). Where they differ, every rank fails
 * with a message naming them, and the group ends. Otherwise it arms the
 * watchdog for the blocking MPI calls that follow. */
gboolean qkv_dist_arrive(QkvDist *dist, QkvDistOp op, gint64 size, const gchar *label,
                         GError **error);
/* A blocking MPI call begins: the watchdog ends the process if a local peer
 * dies or the timeout passes before it returns. */
void qkv_dist_arm(QkvDist *dist, const gchar *what);
/* The blocking collective is over: the watchdog stands down. */
void qkv_dist_disarm(QkvDist *dist);
