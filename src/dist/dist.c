/* dist.c: data-parallel training over MPI (qkv-dist.h): the process group,
 * the wait that starts every collective, and the watchdog; the collectives
 * themselves are in dist-collectives.c. Compiled only when Meson found MPI;
 * dist-none.c stands in otherwise.
 *
 * Every collective is split in two: a non-blocking barrier that this rank
 * polls (MPI_Ibarrier + MPI_Test), then the blocking collective itself. The
 * barrier is where a rank waits for slower ones — usually a whole backward
 * pass of imbalance, and where a dead peer is noticed: while polling, the
 * processes of the ranks on this machine are checked every 50 ms, and the
 * timeout (if any) is enforced. Once every rank has arrived, the data moves
 * with MPI_Allreduce/MPI_Bcast, whose tuned algorithms are about twice as fast
 * as their non-blocking twins (18 MB over shared memory, 2 ranks: 6.4 ms
 * blocking, 13.9 ms for MPI_Iallreduce polled to completion). A rank that dies
 * in those few milliseconds is left to the launcher, which aborts the job and
 * names it.
 */
#include "dist/dist-private.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/core-private.h"

/* clang-format would write the quark's name with spaces, and every binding
 * would see them: keep it away from the formatter. */
// clang-format off
G_DEFINE_QUARK(qkv-dist-error-quark, qkv_dist_error)
// clang-format on

gboolean
qkv_dist_available(void)
{
  return TRUE;
}

gboolean
qkv_dist_mpi_check(QkvDist *dist, int rc, const gchar *what, GError **error)
{
  if (rc == MPI_SUCCESS)
    return TRUE;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    g_strlcpy(text, "unknown MPI error", sizeof text);
  if (dist != NULL)
    dist->broken = TRUE;
  g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MPI, "%s failed: %s", what, text);
  return FALSE;
}

gboolean
qkv_dist_check_usable(QkvDist *dist, GError **error)
{
  if (!dist->broken)
    return TRUE;
  g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_BROKEN,
              "rank %d: an earlier collective failed; this process group cannot be used any more",
              dist->rank);
  return FALSE;
}

/* Whether the process of a rank on this machine is gone: no such pid, or a
 * zombie its launcher has not reaped yet. */
static gboolean
local_peer_dead(const Peer *peer)
{
  pid_t pid = (pid_t)peer->pid;
  if (kill(pid, 0) != 0)
    return errno == ESRCH;
  char path[64], buf[256];
  g_snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return FALSE;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* "pid (comm) S ...": the state follows the last ')' */
  const char *close = strrchr(buf, ')');
  return close != NULL && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* ---- SIGTERM report ---- */

/* Everything the handler prints is formatted beforehand: it may only make
 * async-signal-safe calls (kill, open, read, write, _exit). */
static struct {
  const Peer *peers;
  gint n, self;
  gchar **gone;   /* per rank: the line naming it */
  gchar *generic; /* no local rank is gone */
} term_report;

/* local_peer_dead() with async-signal-safe calls only */
static gboolean
peer_dead_signal_safe(const Peer *peer)
{
  if (kill((pid_t)peer->pid, 0) != 0)
    return errno == ESRCH;
  char path[64] = "/proc/", digits[24];
  gint64 v = peer->pid;
  gint nd = 0, at = 6;
  do {
    digits[nd++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (nd > 0)
    path[at++] = digits[--nd];
  memcpy(path + at, "/stat", 6);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return FALSE;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return FALSE;
  buf[n] = '\0';
  const char *close_paren = NULL;
  for (ssize_t i = 0; i < n; i++)
    if (buf[i] == ')')
      close_paren = buf + i;
  return close_paren != NULL && close_paren[1] == ' ' &&
         (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

static void
on_sigterm(int sig)
{
  gboolean any = FALSE;
  const Peer *self = &term_report.peers[term_report.self];
  for (gint r = 0; r < term_report.n; r++) {
    const Peer *p = &term_report.peers[r];
    if (r == term_report.self || strcmp(p->host, self->host) != 0 || !peer_dead_signal_safe(p))
      continue;
    ssize_t ignored = write(STDERR_FILENO, term_report.gone[r], strlen(term_report.gone[r]));
    (void)ignored;
    any = TRUE;
  }
  if (!any) {
    ssize_t ignored = write(STDERR_FILENO, term_report.generic, strlen(term_report.generic));
    (void)ignored;
  }
  _exit(128 + sig);
}

void
qkv_dist_report_sigterm(QkvDist *dist, const gchar *prefix)
{
  g_return_if_fail(dist != NULL && prefix != NULL);
  /* the previous report's strings stay: a handler may be running on them */
  g_free(dist->prefix);
  dist->prefix = g_strdup(prefix);
  term_report.peers = dist->peers;
  term_report.n = dist->size;
  term_report.self = dist->rank;
  gchar **gone = g_new0(gchar *, dist->size + 1);
  for (gint r = 0; r < dist->size; r++)
    gone[r] = g_strdup_printf("%s (rank %d): stopped by SIGTERM: rank %d (pid %" G_GINT64_FORMAT
                              " on %s) is gone\n",
                              prefix, dist->rank, r, dist->peers[r].pid, dist->peers[r].host);
  term_report.gone = gone;
  term_report.generic =
      g_strdup_printf("%s (rank %d): stopped by SIGTERM (the launcher stops every rank when one "
                      "fails; its message names the rank)\n",
                      prefix, dist->rank);
  struct sigaction sa = {0};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

/* The first rank on this machine whose process is gone, or -1. */
static gint
find_lost_rank(QkvDist *dist)
{
  const Peer *self = &dist->peers[dist->rank];
  for (gint r = 0; r < dist->size; r++)
    if (r != dist->rank && strcmp(dist->peers[r].host, self->host) == 0 &&
        local_peer_dead(&dist->peers[r]))
      return r;
  return -1;
}

/* The blocking part of a collective cannot be abandoned: if a peer dies while
 * this rank is inside MPI_Allreduce, the call never returns (mpirun usually
 * kills the job, but not when told to keep going, --enable-recovery, and
 * not every launcher does). A thread watches while it is armed; if a rank on
 * this machine is gone (or the timeout passed) it prints which and ends the
 * process, the only way out of the call. It sleeps otherwise. */
static gpointer
watchdog_main(gpointer data)
{
  QkvDist *dist = data;
  while (!g_atomic_int_get(&dist->watchdog_stop)) {
    g_usleep(50000);
    gint64 since = __atomic_load_n(&dist->armed_since, __ATOMIC_ACQUIRE);
    if (since == 0)
      continue;
    gint lost = find_lost_rank(dist);
    double waited = (double)(g_get_monotonic_time() - since) * 1e-6;
    gboolean late = dist->timeout > 0 && waited > dist->timeout;
    if (lost < 0 && !late)
      continue;
    /* still armed: the call did not finish meanwhile */
    if (__atomic_load_n(&dist->armed_since, __ATOMIC_ACQUIRE) != since)
      continue;
    if (lost >= 0)
      g_printerr("%s (rank %d): rank %d (pid %" G_GINT64_FORMAT " on %s) died; rank %d was "
                 "inside the %s, an MPI call that cannot be abandoned, and exits\n",
                 dist->prefix, dist->rank, lost, dist->peers[lost].pid, dist->peers[lost].host,
                 dist->rank, dist->armed_what);
    else
      g_printerr("%s (rank %d): the %s took over %.0f s (QKV_DIST_TIMEOUT); a rank on another "
                 "machine may have died; this process exits\n",
                 dist->prefix, dist->rank, dist->armed_what, waited);
    _exit(1);
  }
  return NULL;
}

static void
arm(QkvDist *dist, const gchar *what)
{
  if (dist->size == 1)
    return;
  if (dist->watchdog == NULL)
    dist->watchdog = g_thread_new("qkv-dist-watchdog", watchdog_main, dist);
  dist->armed_what = what;
  __atomic_store_n(&dist->armed_since, MAX(g_get_monotonic_time(), 1), __ATOMIC_RELEASE);
}

void
qkv_dist_disarm(QkvDist *dist)
{
  __atomic_store_n(&dist->armed_since, 0, __ATOMIC_RELEASE);
}

/* Wait until every rank reaches this point, noticing dead local peers and
 * the timeout; what names the collective for messages. */
gboolean
qkv_dist_arrive(QkvDist *dist, const gchar *what, GError **error)
{
  if (dist->size == 1)
    return TRUE;
  qkv_dist_disarm(dist);
  MPI_Request req;
  if (!qkv_dist_mpi_check(dist, MPI_Ibarrier(dist->comm, &req), "MPI_Ibarrier", error))
    return FALSE;
  const double start = now_s();
  double next_check = start + 0.05;
  for (guint64 spins = 0;; spins++) {
    int done = 0;
    if (!qkv_dist_mpi_check(dist, MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", error))
      return FALSE;
    if (done)
      break;
    /* the ranks may share the cores (and other users' work may too): after
     * a moment of spinning, let the scheduler run someone else */
    if (spins > 1000)
      sched_yield();
    double t = now_s();
    if (t < next_check)
      continue;
    next_check = t + 0.05;
    gint lost = find_lost_rank(dist);
    if (lost >= 0) {
      dist->broken = TRUE;
      g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_PEER_LOST,
                  "rank %d (pid %" G_GINT64_FORMAT " on %s) died; rank %d stopped waiting for it "
                  "in the %s",
                  lost, dist->peers[lost].pid, dist->peers[lost].host, dist->rank, what);
      return FALSE;
    }
    if (dist->timeout > 0 && t - start > dist->timeout) {
      dist->broken = TRUE;
      g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_TIMEOUT,
                  "rank %d waited %.0f s in the %s for ranks that did not arrive "
                  "(QKV_DIST_TIMEOUT); a rank on another machine may have died",
                  dist->rank, t - start, what);
      return FALSE;
    }
  }
  dist->stats.seconds_wait += now_s() - start;
  arm(dist, what);
  return TRUE;
}

static QkvDist *
dist_new(MPI_Comm comm, gboolean owns_mpi, GError **error)
{
  QkvDist *dist = g_new0(QkvDist, 1);
  dist->owns_mpi = owns_mpi;
  dist->comm = MPI_COMM_NULL;
  dist->bucket_bytes = 64u << 20;
  dist->prefix = g_strdup("qkv");
  const gchar *timeout = g_getenv("QKV_DIST_TIMEOUT");
  if (timeout != NULL)
    dist->timeout = MAX(g_ascii_strtod(timeout, NULL), 0);
  if (!qkv_dist_mpi_check(NULL, MPI_Comm_dup(comm, &dist->comm), "MPI_Comm_dup", error))
    goto fail;
  /* errors come back as return codes, which become GErrors, instead of
   * aborting every process */
  MPI_Comm_set_errhandler(dist->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(dist->comm, &dist->rank);
  MPI_Comm_size(dist->comm, &dist->size);
  MPI_Comm local;
  if (!qkv_dist_mpi_check(
          NULL, MPI_Comm_split_type(dist->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type", error))
    goto fail;
  MPI_Comm_size(local, &dist->local_size);
  MPI_Comm_free(&local);
  Peer self = {0};
  int len = 0;
  char name[MPI_MAX_PROCESSOR_NAME];
  MPI_Get_processor_name(name, &len);
  g_strlcpy(self.host, name, sizeof self.host);
  self.pid = (gint64)getpid();
  dist->peers = g_new0(Peer, dist->size);
  if (!qkv_dist_mpi_check(NULL,
                          MPI_Allgather(&self, sizeof self, MPI_BYTE, dist->peers, sizeof self,
                                        MPI_BYTE, dist->comm),
                          "MPI_Allgather", error))
    goto fail;
  return dist;
fail:
  if (dist->comm != MPI_COMM_NULL)
    MPI_Comm_free(&dist->comm);
  g_free(dist->peers);
  g_free(dist->prefix);
  g_free(dist);
  return NULL;
}

QkvDist *
qkv_dist_init(int *argc, char ***argv, GError **error)
{
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MPI,
                "MPI was finalized already; it cannot be started again in this process");
    return NULL;
  }
  gboolean owns = FALSE;
  if (!initialized) {
    /* qkv's worker threads never call MPI: the calling thread does it all */
    int provided = 0;
    if (!qkv_dist_mpi_check(NULL, MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided),
                            "MPI_Init_thread", error))
      return NULL;
    owns = TRUE;
  }
  QkvDist *dist = dist_new(MPI_COMM_WORLD, owns, error);
  if (dist == NULL && owns)
    MPI_Finalize();
  return dist;
}

QkvDist *
qkv_dist_new_for_comm(const void *mpi_comm, GError **error)
{
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (mpi_comm == NULL || !initialized) {
    g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MPI,
                mpi_comm == NULL ? "qkv_dist_new_for_comm: no communicator given"
                                 : "qkv_dist_new_for_comm: MPI is not initialised");
    return NULL;
  }
  return dist_new(*(const MPI_Comm *)mpi_comm, FALSE, error);
}

void
qkv_dist_free(QkvDist *dist)
{
  if (dist == NULL)
    return;
  /* A broken group may have a peer stuck in a collective, or none left to
   * answer: freeing the communicator or finalizing could wait forever. */
  if (!dist->broken) {
    MPI_Comm_free(&dist->comm);
    if (dist->owns_mpi)
      MPI_Finalize();
  }
  if (dist->watchdog != NULL) {
    g_atomic_int_set(&dist->watchdog_stop, 1);
    g_thread_join(dist->watchdog);
  }
  g_free(dist->prefix);
  g_free(dist->peers);
  g_free(dist->flat);
  g_free(dist);
}

gint
qkv_dist_rank(const QkvDist *dist)
{
  return dist->rank;
}

gint
qkv_dist_world_size(const QkvDist *dist)
{
  return dist->size;
}

gint
qkv_dist_local_size(const QkvDist *dist)
{
  return dist->local_size;
}

gboolean
qkv_dist_is_root(const QkvDist *dist)
{
  return dist->rank == 0;
}

void
qkv_dist_set_timeout(QkvDist *dist, double seconds)
{
  dist->timeout = seconds > 0 ? seconds : 0;
}

void
qkv_dist_set_bucket_bytes(QkvDist *dist, gsize bytes)
{
  /* MPI counts are ints */
  dist->bucket_bytes = CLAMP(bytes, sizeof(float), (gsize)G_MAXINT / 2 * sizeof(float));
}

void
qkv_dist_shard(const QkvDist *dist, gint64 n, gint64 *offset, gint64 *count)
{
  qkv_split_range(n, dist->size, dist->rank, offset, count);
}

gboolean
qkv_dist_check_batch(const QkvDist *dist, gint64 batch_size, GError **error)
{
  if (batch_size >= dist->size)
    return TRUE;
  g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH,
              "a global batch of %" G_GINT64_FORMAT " cannot be split over %d processes (each "
              "needs at least one example); use a batch of at least %d or fewer processes",
              batch_size, dist->size, dist->size);
  return FALSE;
}
