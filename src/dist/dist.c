/* dist.c: data-parallel training over MPI (qkv-dist.h): the process group,
 * the wait that starts every collective, and the watchdog; the collectives
 * themselves are in dist-collectives.c. Compiled only when Meson found MPI;
 * dist-none.c stands in otherwise.
 *
 * Every collective is split in two: a non-blocking all-reduce of a small
 * header that this rank polls (MPI_Iallreduce + MPI_Test), then the blocking
 * collective itself. The header says which collective this is (a sequence
 * number, the function, the size of its data): reduced with MPI_MAX over
 * the values and their negations it gives every rank the largest and the
 * smallest, so every rank learns at once whether all are at the same call.
 * Where they are not, or a rank has announced that it leaves, the ranks
 * exchange who is where and why, and all fail with the same story instead
 * of mixing unrelated data or waiting forever for a rank that is gone.
 * The header is also where a rank waits for slower ones — usually a whole
 * backward pass of imbalance, and where a dead peer is noticed: while
 * polling, the processes of the ranks on this machine are checked every
 * 50 ms, and the timeout is enforced. Once every rank has arrived, the data moves
 * with MPI_Allreduce/MPI_Bcast, whose tuned algorithms are about twice as fast
 * as their non-blocking twins (18 MB over shared memory, 2 ranks: 6.4 ms
 * blocking, 13.9 ms for MPI_Iallreduce polled to completion). A rank that dies
 * in those few milliseconds is left to the launcher, which aborts the job and
 * names it.
 */
#include "dist/dist-private.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/core-private.h"
#include "error-private.h"

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
  if (dist->broken)
    g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_BROKEN,
                "rank %d: an earlier collective failed; this process group cannot be used any "
                "more",
                dist->rank);
  else if (dist->ended)
    g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_BROKEN,
                "rank %d: this process group has ended (%s); it takes part in no more "
                "collectives",
                dist->rank, dist->ended_why);
  return !dist->broken && !dist->ended;
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

void
qkv_dist_arm(QkvDist *dist, const gchar *what)
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

/* ---- the agreement before every collective ---- */

#define LABEL_LEN 400

/* Where one rank is, as the ranks exchange it when their headers differ. */
typedef struct {
  gint64 seq, op, size;
  char label[LABEL_LEN]; /* why it leaves, what it agrees on */
} Arrival;

static const gchar *
op_name(gint64 op)
{
  switch ((QkvDistOp)op) {
  case QKV_DIST_OP_LEAVE:
    return "leave";
  case QKV_DIST_OP_BROADCAST:
  case QKV_DIST_OP_PARAM_CHECK:
    return "parameter broadcast";
  case QKV_DIST_OP_STATE_CHECK:
    return "optimizer state broadcast";
  case QKV_DIST_OP_GRADS:
    return "gradient all-reduce";
  case QKV_DIST_OP_ALLREDUCE:
    return "all-reduce";
  case QKV_DIST_OP_BARRIER:
    return "barrier";
  case QKV_DIST_OP_AGREE:
    return "agreement";
  }
  return "unknown collective";
}

/* "the gradient all-reduce of 1234 floats (collective 57)" */
static gchar *
describe_arrival(const Arrival *a)
{
  g_autofree gchar *what = NULL;
  if (a->op == QKV_DIST_OP_GRADS)
    what = g_strdup_printf("the gradient all-reduce of %" G_GINT64_FORMAT " floats", a->size);
  else if (a->op == QKV_DIST_OP_ALLREDUCE)
    what = g_strdup_printf("the all-reduce of %" G_GINT64_FORMAT " values", a->size);
  else if (a->op == QKV_DIST_OP_AGREE)
    what = g_strdup_printf("the agreement on %s", a->label);
  else if (a->op == QKV_DIST_OP_PARAM_CHECK || a->op == QKV_DIST_OP_STATE_CHECK)
    what = g_strdup_printf("the check of the %s", op_name(a->op));
  else
    what = g_strdup_printf("the %s", op_name(a->op));
  return g_strdup_printf("%s (collective %" G_GINT64_FORMAT ")", what, a->seq);
}

/* Copy text into a label, cut at a character boundary. */
static void
set_label(char *label, const gchar *text)
{
  const gchar *end = NULL;
  g_strlcpy(label, text != NULL ? text : "", LABEL_LEN);
  g_utf8_validate(label, -1, &end);
  label[end - label] = '\0';
}

/* The ranks' headers differ: learn where each is, and fail as every other
 * rank does. Every rank completed the header, so every rank is here. */
static gboolean
diverged(QkvDist *dist, const gint64 mine[3], const gchar *label, GError **error)
{
  Arrival me = {.seq = mine[0], .op = mine[1], .size = mine[2]};
  set_label(me.label, label);
  g_autofree Arrival *all = g_new0(Arrival, dist->size);
  qkv_dist_arm(dist, "exchange of where each rank is");
  int rc = MPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, dist->comm);
  qkv_dist_disarm(dist);
  if (!qkv_dist_mpi_check(dist, rc, "MPI_Allgather", error))
    return FALSE;
  gint left = -1, stayed = -1;
  for (gint r = 0; r < dist->size; r++) {
    all[r].label[LABEL_LEN - 1] = '\0';
    if (all[r].op == QKV_DIST_OP_LEAVE && left < 0)
      left = r;
    if (all[r].op != QKV_DIST_OP_LEAVE && (stayed < 0 || r == dist->rank))
      stayed = r;
  }
  g_autofree gchar *message = NULL;
  if (left >= 0 && stayed >= 0) {
    g_autofree gchar *where = describe_arrival(&all[stayed]);
    message = g_strdup_printf("rank %d left the job (%s) while rank %d was at %s", left,
                              all[left].label, stayed, where);
  } else {
    gint other = 1;
    while (other < dist->size - 1 && memcmp(&all[other], &all[0], 3 * sizeof(gint64)) == 0)
      other++;
    g_autofree gchar *where0 = describe_arrival(&all[0]);
    g_autofree gchar *where = describe_arrival(&all[other]);
    message = g_strdup_printf("the ranks reached different collectives: rank 0 was at %s, rank "
                              "%d at %s (every rank must make the same calls in the same order)",
                              where0, other, where);
  }
  dist->ended = TRUE;
  g_free(dist->ended_why);
  dist->ended_why = g_strdup(message);
  g_set_error_literal(error, QKV_DIST_ERROR,
                      left >= 0 && stayed >= 0 ? QKV_DIST_ERROR_PEER_LEFT : QKV_DIST_ERROR_MISMATCH,
                      message);
  return FALSE;
}

/* Poll req until it completes, checking the local peers and the timeout
 * every 50 ms; what names the collective for messages. */
static gboolean
wait_for_all(QkvDist *dist, MPI_Request *req, const gchar *what, GError **error)
{
  const double start = now_s();
  double next_check = start + 0.05;
  for (guint64 spins = 0;; spins++) {
    int done = 0;
    if (!qkv_dist_mpi_check(dist, MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test", error))
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
                  "(QKV_DIST_TIMEOUT); a rank on another machine may have died, or one is "
                  "busy for longer than that",
                  dist->rank, t - start, what);
      return FALSE;
    }
  }
  dist->stats.seconds_wait += now_s() - start;
  return TRUE;
}

gboolean
qkv_dist_arrive(QkvDist *dist, QkvDistOp op, gint64 size, const gchar *label, GError **error)
{
  if (!qkv_dist_check_usable(dist, error))
    return FALSE;
  if (dist->size == 1) {
    dist->seq++;
    return TRUE;
  }
  qkv_dist_disarm(dist);
  const gint64 mine[3] = {dist->seq + 1, op, size};
  /* the maxima, and the negated minima */
  gint64 header[6] = {mine[0], mine[1], mine[2], -mine[0], -mine[1], -mine[2]};
  MPI_Request req;
  if (!qkv_dist_mpi_check(
          dist, MPI_Iallreduce(MPI_IN_PLACE, header, 6, MPI_INT64_T, MPI_MAX, dist->comm, &req),
          "MPI_Iallreduce", error))
    return FALSE;
  dist->seq++;
  if (!wait_for_all(dist, &req, op_name(op), error))
    return FALSE;
  for (gint i = 0; i < 3; i++)
    if (header[i] != -header[i + 3])
      return diverged(dist, mine, label, error);
  if (op != QKV_DIST_OP_LEAVE)
    qkv_dist_arm(dist, op_name(op));
  return TRUE;
}

gboolean
qkv_dist_leave(QkvDist *dist, const gchar *reason, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL, FALSE);
  if (dist->ended)
    return TRUE;
  gboolean ok = qkv_dist_arrive(dist, QKV_DIST_OP_LEAVE, 0, reason, error);
  if (ok) {
    dist->ended = TRUE;
    dist->ended_why = g_strdup("this rank left it");
  }
  return ok;
}

/* QKV_DIST_TIMEOUT, or the default when it is not set. Every rank reads
 * its own environment before any collective, so a bad value fails alike
 * on every rank that has it, without leaving the others in a collective. */
static gboolean
initial_timeout(double *seconds, GError **error)
{
  const gchar *text = g_getenv("QKV_DIST_TIMEOUT");
  *seconds = QKV_DIST_DEFAULT_TIMEOUT;
  if (text == NULL)
    return TRUE;
  gchar *end = NULL;
  double x = g_ascii_strtod(text, &end);
  if (end == text || *end != '\0' || !isfinite(x) || x < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "QKV_DIST_TIMEOUT='%s' is not a number of seconds (0 waits without a limit)", text);
    return FALSE;
  }
  *seconds = x;
  return TRUE;
}

static QkvDist *
dist_new(MPI_Comm comm, gboolean owns_mpi, GError **error)
{
  double timeout;
  if (!initial_timeout(&timeout, error))
    return NULL;
  QkvDist *dist = g_new0(QkvDist, 1);
  dist->owns_mpi = owns_mpi;
  dist->comm = MPI_COMM_NULL;
  dist->bucket_bytes = 64u << 20;
  dist->prefix = g_strdup("qkv");
  dist->timeout = timeout;
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
  QKV_RETURN_IF_ERROR_SET(error, NULL);
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
  QKV_RETURN_IF_ERROR_SET(error, NULL);
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
  /* the others learn that this rank is gone at their next collective */
  if (!dist->broken && !dist->ended)
    qkv_dist_leave(dist, "its process group was freed", NULL);
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
  g_free(dist->ended_why);
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

double
qkv_dist_get_timeout(const QkvDist *dist)
{
  return dist->timeout;
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
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (batch_size >= dist->size)
    return TRUE;
  g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH,
              "a global batch of %" G_GINT64_FORMAT " cannot be split over %d processes (each "
              "needs at least one example); use a batch of at least %d or fewer processes",
              batch_size, dist->size, dist->size);
  return FALSE;
}
