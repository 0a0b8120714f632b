/* dist-private.h: what dist.c (the process group, the wait before every
 * collective and the watchdog) shares with dist-collectives.c (the
 * broadcast and the all-reduces). Both are built only when Meson found MPI. */
#pragma once

#include "qkv/qkv-dist.h"

#include <mpi.h>

#define HOST_LEN 128

typedef struct {
  char host[HOST_LEN];
  gint64 pid;
} Peer;

struct _QkvDist {
  MPI_Comm comm;
  gint rank, size, local_size;
  gboolean owns_mpi; /* qkv_dist_init() called MPI_Init_thread */
  gboolean broken;
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
/* FALSE with QKV_DIST_ERROR_BROKEN once a collective has failed. */
gboolean qkv_dist_check_usable(QkvDist *dist, GError **error);
/* Waits until every rank reaches this point, noticing dead local peers and
 * the timeout, then arms the watchdog for the blocking collective that
 * follows; what names the collective for messages. */
gboolean qkv_dist_arrive(QkvDist *dist, const gchar *what, GError **error);
/* The blocking collective is over: the watchdog stands down. */
void qkv_dist_disarm(QkvDist *dist);
