/* qkv-dist.h: data-parallel training over MPI.
 *
 * Every process (rank) holds a full copy of the parameters and the optimizer
 * state and trains on its shard of each global batch. Per step:
 *
 *   qkv_dist_shard(dist, batch, &offset, &count);   this rank's rows
 *   ... bind those rows, qkv_plan_run() ...          local forward + backward
 *   qkv_dist_allreduce_grads(dist, params, QKV_DIST_SUM, extra, n, &error);
 *   qkv_optimizer_step(...)                          the same update everywhere
 *
 * after qkv_dist_broadcast_params() once at the start, so that every rank
 * begins from rank 0's weights and state. Since every rank then applies the
 * same reduced gradient with the same optimizer, the replicas stay identical
 * (Open MPI's all-reduce algorithms hand every rank the same sums, so they
 * do not drift apart).
 *
 * Which reduction: a loss summed over the examples (qkv's seq2seq losses,
 * PyTorch's reduction="sum") wants QKV_DIST_SUM — the sum of the shards'
 * gradients is the gradient of the whole batch, so training matches one
 * process up to rounding. A loss that is a mean over the local shard wants
 * QKV_DIST_MEAN when every shard has the same size (otherwise scale the
 * loss by shard / global count and use QKV_DIST_SUM).
 *
 * The header and every function exist whether or not qkv was built with MPI
 * (meson option -Dmpi). Without it qkv_dist_init() fails with
 * QKV_DIST_ERROR_UNAVAILABLE, so a program can offer a --distributed switch
 * unconditionally and report why it cannot work; qkv_dist_available() tells
 * beforehand.
 *
 * Every rank must make the same collective calls in the same order. Before
 * each one the ranks agree on what it is (its sequence number, which
 * function, how much data): ranks that reach different calls fail with
 * QKV_DIST_ERROR_MISMATCH naming both instead of mixing their data. A rank
 * that is done with the group — finished, or stopping on an error — says so
 * with qkv_dist_leave() (qkv_dist_free() does it too): the others fail in
 * their next collective with QKV_DIST_ERROR_PEER_LEFT, naming it and its
 * reason, instead of waiting for it forever. A group whose ranks reached
 * different points has ended on every rank: further collectives fail with
 * QKV_DIST_ERROR_BROKEN, and qkv_dist_free() still finalizes MPI cleanly.
 *
 * Failures: a rank that dies (killed, crashed) while the others wait in a
 * collective is noticed within a fraction of a second when it ran on the same
 * machine (its process is gone) and reported as QKV_DIST_ERROR_PEER_LOST
 * naming the rank; for ranks on other machines the launcher (mpirun) aborts
 * the job and names the rank, and the timeout (qkv_dist_set_timeout(), 60 s
 * unless set) bounds every wait otherwise. After such a failure the QkvDist
 * is broken: further calls fail at once, and qkv_dist_free() does not
 * finalize MPI (that could hang).
 *
 * Threads: call every function from the thread that created the QkvDist.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-optim.h"
#include "qkv-params.h"

G_BEGIN_DECLS

/**
 * QKV_DIST_ERROR:
 *
 * Dist error.
 */
#define QKV_DIST_ERROR (qkv_dist_error_quark())
/**
 * QkvDistError:
 * @QKV_DIST_ERROR_UNAVAILABLE: qkv was built without MPI
 * @QKV_DIST_ERROR_MPI: an MPI call failed
 * @QKV_DIST_ERROR_PEER_LOST: another rank died; the message names it
 * @QKV_DIST_ERROR_TIMEOUT: a collective waited longer than the timeout
 * @QKV_DIST_ERROR_MISMATCH: mismatch
 * @QKV_DIST_ERROR_BROKEN: an earlier call failed or the group ended: unusable
 * @QKV_DIST_ERROR_PEER_LEFT: peer left
 *
 * The dist error values.
 */
typedef enum {
  QKV_DIST_ERROR_UNAVAILABLE, /* qkv was built without MPI */
  QKV_DIST_ERROR_MPI,         /* an MPI call failed */
  QKV_DIST_ERROR_PEER_LOST,   /* another rank died; the message names it */
  QKV_DIST_ERROR_TIMEOUT,     /* a collective waited longer than the timeout */
  QKV_DIST_ERROR_MISMATCH,    /* ranks disagree (parameter names, shapes, state, values
                               * of qkv_dist_agree(), which collective they are at) */
  QKV_DIST_ERROR_BROKEN,      /* an earlier call failed or the group ended: unusable */
  QKV_DIST_ERROR_PEER_LEFT,   /* a rank left the group (qkv_dist_leave(), qkv_dist_free())
                               * while another was still in a collective; every rank gets
                               * it, and the message names who left, why, and where the
                               * others were */
} QkvDistError;
/**
 * qkv_dist_error_quark:
 *
 * Dist error quark.
 *
 * Returns: the GQuark
 */
QKV_API
GQuark qkv_dist_error_quark(void);

/**
 * QkvDist:
 *
 * An opaque dist.
 */
typedef struct _QkvDist QkvDist;

/**
 * QkvDistReduce:
 * @QKV_DIST_SUM: the sum over ranks
 * @QKV_DIST_MEAN: the sum divided by the world size
 *
 * The dist reduce values.
 */
typedef enum {
  QKV_DIST_SUM,  /* the sum over ranks */
  QKV_DIST_MEAN, /* the sum divided by the world size */
} QkvDistReduce;

/**
 * QkvDistStats:
 *
 * Counters since creation (or qkv_dist_reset_stats()).
 */
typedef struct {
  guint64 reductions;    /* qkv_dist_allreduce_grads() calls */
  guint64 mpi_calls;     /* all-reduce calls issued for them (buckets) */
  guint64 bytes_reduced; /* payload bytes, per rank, of those calls */
  double seconds_pack;   /* copying gradients into and out of the flat buffer */
  double seconds_wait;   /* waiting for the other ranks to reach a collective */
  double seconds_reduce; /* moving and summing the data, once all have arrived */
  gpointer reserved[4];
} QkvDistStats;

/**
 * qkv_dist_available:
 *
 * Whether this qkv was built with MPI.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_dist_available(void);

/**
 * qkv_dist_init: (skip)
 * @argc: (out) (optional): where to store the argc, or %NULL
 * @argv: (nullable): the argv
 * @error: return location for a #GError, or %NULL
 *
 * Join the job this process was started in (mpirun): initialises MPI if no
 * one has (argc and argv may be NULL) and works on a duplicate of
 * MPI_COMM_WORLD. A process started without mpirun is a job of one.
 * QKV_DIST_ERROR_UNAVAILABLE without MPI.
 *
 * Returns: (transfer full) (nullable): a new #QkvDist, or %NULL with @error set
 */
QKV_API
QkvDist *qkv_dist_init(int *argc, char ***argv, GError **error);
/**
 * qkv_dist_new_for_comm: (skip)
 * @mpi_comm: the mpi comm
 * @error: return location for a #GError, or %NULL
 *
 * The same on a duplicate of an existing communicator; mpi_comm points to an
 * MPI_Comm (a pointer keeps MPI's types out of this header). MPI must be
 * initialised by the caller, with at least MPI_THREAD_FUNNELED.
 *
 * Returns: (transfer full) (nullable): a new #QkvDist, or %NULL with @error set
 */
QKV_API
QkvDist *qkv_dist_new_for_comm(const void *mpi_comm, GError **error);
/**
 * qkv_dist_free:
 * @dist: a #QkvDist
 *
 * Free the group: leaves it first if this rank has not (qkv_dist_leave()
 * with the reason "its process group was freed"), then finalizes MPI if
 * qkv_dist_init() initialised it and the group is not broken.
 */
QKV_API
void qkv_dist_free(QkvDist *dist);

/**
 * qkv_dist_leave:
 * @dist: a #QkvDist
 * @reason: the reason
 * @error: return location for a #GError, or %NULL
 *
 * This rank takes part in no more collectives: tell the others, and why
 * (reason: "finished training after 3 epochs", or the error that stops this
 * rank). Collective in effect: it waits, like a collective, for every rank
 * to reach its next call. TRUE when every rank left there together; when
 * some were still at a collective, every rank fails with
 * QKV_DIST_ERROR_PEER_LEFT ("rank 1 left the job (finished training after
 * 3 epochs) while rank 0 was at the gradient all-reduce of 1234 floats
 * (collective 57)"). Either way the group has ended: leaving again does
 * nothing and returns TRUE, other collectives fail with
 * QKV_DIST_ERROR_BROKEN.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_leave(QkvDist *dist, const gchar *reason, GError **error);

/**
 * qkv_dist_rank:
 * @dist: a #QkvDist
 *
 * See qkv_dist_leave().
 *
 * Returns: the gint
 */
QKV_API
gint qkv_dist_rank(const QkvDist *dist);
/**
 * qkv_dist_world_size:
 * @dist: a #QkvDist
 *
 * See qkv_dist_leave().
 *
 * Returns: the gint
 */
QKV_API
gint qkv_dist_world_size(const QkvDist *dist);
/**
 * qkv_dist_local_size:
 * @dist: a #QkvDist
 *
 * Ranks on this machine (this one included): the cores here are shared
 * among them.
 *
 * Returns: the gint
 */
QKV_API
gint qkv_dist_local_size(const QkvDist *dist);
/**
 * qkv_dist_is_root:
 * @dist: a #QkvDist
 *
 * Rank 0: the one that prints and writes checkpoints.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_dist_is_root(const QkvDist *dist);

/**
 * QKV_DIST_DEFAULT_TIMEOUT:
 *
 * Dist default timeout.
 */
#define QKV_DIST_DEFAULT_TIMEOUT 60.0

/**
 * qkv_dist_set_timeout:
 * @dist: a #QkvDist
 * @seconds: the seconds
 *
 * Give up waiting after this many seconds: for the other ranks to reach a
 * collective (QKV_DIST_ERROR_TIMEOUT), and in each MPI call that moves its
 * data (the process exits with a message: such a call cannot be
 * abandoned). 0 waits as long as it takes. The default,
 * QKV_DIST_DEFAULT_TIMEOUT, or the environment's QKV_DIST_TIMEOUT (seconds;
 * 0 for none; qkv_dist_init() refuses other text) when set. A rank that
 * is slow but alive — writing a large checkpoint while the others wait at
 * the next step — must finish within it: raise it for such programs.
 */
QKV_API
void qkv_dist_set_timeout(QkvDist *dist, double seconds);
/**
 * qkv_dist_get_timeout:
 * @dist: a #QkvDist
 *
 * See qkv_dist_set_timeout().
 *
 * Returns: the double
 */
QKV_API
double qkv_dist_get_timeout(const QkvDist *dist);
/**
 * qkv_dist_set_bucket_bytes:
 * @dist: a #QkvDist
 * @bytes: the bytes
 *
 * Largest all-reduce call in bytes (default 64 MiB): the gradients go out in
 * as few calls as this allows.
 */
QKV_API
void qkv_dist_set_bucket_bytes(QkvDist *dist, gsize bytes);

/**
 * qkv_dist_shard:
 * @dist: a #QkvDist
 * @n: the n
 * @offset: (out) (optional): where to store the offset, or %NULL
 * @count: (out) (optional): where to store the count, or %NULL
 *
 * The sampler: rows [*offset, *offset + *count) of a global batch of n rows
 * are this rank's. Consecutive ranks get consecutive blocks; the first n %
 * world ranks get one row more. When n < world size, some ranks get none
 * (a last, short batch): they must still take part in the all-reduce, with
 * zero gradients. This is qkv_split_range(n, world, rank) (qkv-optim.h): one
 * process accumulating the same parts (QkvGradAccumulator) computes what the
 * ranks compute.
 */
QKV_API
void qkv_dist_shard(const QkvDist *dist, gint64 n, gint64 *offset, gint64 *count);
/**
 * qkv_dist_check_batch:
 * @dist: a #QkvDist
 * @batch_size: the batch size
 * @error: return location for a #GError, or %NULL
 *
 * QKV_DIST_ERROR_MISMATCH unless every rank can get at least one row of a
 * global batch of batch_size rows.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_check_batch(const QkvDist *dist, gint64 batch_size, GError **error);

/**
 * qkv_dist_broadcast_params:
 * @dist: a #QkvDist
 * @params: a #QkvParams
 * @optimizer: (nullable): a #QkvOptimizer
 * @error: return location for a #GError, or %NULL
 *
 * Make every rank's parameters (and, with optimizer non-NULL, its state
 * tensors and step count) rank 0's. The ranks must hold the same parameters
 * in the same order with the same shapes: otherwise every rank fails with
 * QKV_DIST_ERROR_MISMATCH naming the first rank and parameter that differ,
 * and nothing is changed. State tensors rank 0 has and another rank lacks
 * are created there.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_broadcast_params(QkvDist *dist, QkvParams *params, QkvOptimizer *optimizer,
                                   GError **error);

/**
 * qkv_dist_allreduce_grads:
 * @dist: a #QkvDist
 * @params: a #QkvParams
 * @op: the op
 * @extra: (array length=n_extra) (nullable): the extra, @n_extra of them
 * @n_extra: the number of @extra
 * @error: return location for a #GError, or %NULL
 *
 * Reduce the gradient buffers of every non-frozen parameter across ranks, in
 * place, with op; extra (n_extra floats, may be NULL) rides in the same
 * buffer and is reduced with the same op (a step's loss and token count
 * cost no further call). Parameters are packed into one flat buffer and
 * reduced in calls of at most the bucket size.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_allreduce_grads(QkvDist *dist, QkvParams *params, QkvDistReduce op, float *extra,
                                  guint n_extra, GError **error);
/**
 * qkv_dist_allreduce:
 * @dist: a #QkvDist
 * @values: (array length=n): the values, @n of them
 * @n: the number of @values
 * @op: the op
 * @error: return location for a #GError, or %NULL
 *
 * Reduce n doubles across ranks, in place.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_allreduce(QkvDist *dist, double *values, guint n, QkvDistReduce op,
                            GError **error);
/**
 * qkv_dist_barrier:
 * @dist: a #QkvDist
 * @error: return location for a #GError, or %NULL
 *
 * Wait for every rank (with the same failure detection as the reductions).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_barrier(QkvDist *dist, GError **error);

/**
 * qkv_dist_agree:
 * @dist: a #QkvDist
 * @what: the what
 * @value: the value
 * @error: return location for a #GError, or %NULL
 *
 * Check that every rank holds the same value for what (an option, a
 * configuration, a hash of the data): compares the values' SHA-256 across
 * ranks. On a difference every rank fails with QKV_DIST_ERROR_MISMATCH
 * "WHAT differs: rank 0 has 0.005; rank 1 has 0.01" (ranks grouped by
 * value; values of 160 bytes or more are shown by their length and hash);
 * the group stays usable. Every rank must agree on the same things in the
 * same order: a rank agreeing on another what fails as ranks at different
 * collectives do.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_dist_agree(QkvDist *dist, const gchar *what, const gchar *value, GError **error);

/**
 * qkv_dist_report_sigterm:
 * @dist: a #QkvDist
 * @prefix: the prefix
 *
 * When a rank dies, mpirun (Open MPI's default) stops the others with
 * SIGTERM, often before they reach a collective and notice; this installs a
 * SIGTERM handler that prints "PREFIX (rank R): stopped by SIGTERM: rank L
 * (pid P on HOST) is gone" for each rank on this machine whose process is
 * gone (or, if none is, that the launcher stopped this rank) and exits
 * with status 143. It replaces any SIGTERM handler the program had; one
 * QkvDist at a time.
 */
QKV_API
void qkv_dist_report_sigterm(QkvDist *dist, const gchar *prefix);

/**
 * qkv_dist_get_stats:
 * @dist: a #QkvDist
 * @stats: a #QkvDistStats
 *
 * See qkv_dist_report_sigterm().
 */
QKV_API
void qkv_dist_get_stats(const QkvDist *dist, QkvDistStats *stats);
/**
 * qkv_dist_reset_stats:
 * @dist: a #QkvDist
 *
 * See qkv_dist_report_sigterm().
 */
QKV_API
void qkv_dist_reset_stats(QkvDist *dist);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvDist, qkv_dist_free)

G_END_DECLS
