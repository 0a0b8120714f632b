/* dist-collectives.c: the collectives of qkv-dist.h: the parameter (and
 * optimizer state) broadcast from rank 0, the gradient and value
 * all-reduces, the barrier, and the agreement on values. Each starts with
 * qkv_dist_arrive() (dist.c), where ranks wait for each other, check that
 * they are at the same collective and notice a dead peer, and moves the
 * data with blocking MPI calls afterwards. Built only with MPI. */
#include "dist/dist-private.h"
#include "qkv/qkv-optim.h"

#include <stdlib.h>
#include <string.h>

#include "core/core-private.h"
#include "error-private.h"

#define MESSAGE_LEN 512

/* ---- broadcast ---- */

/* One line per parameter, "name shape", and one per state tensor. */
static gchar *
manifest(QkvParams *params, gboolean with_states)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    g_autofree gchar *shape = qkv_shape_to_string(qkv_param_shape(p));
    g_string_append_printf(s, "p\t%s\t%s\n", qkv_param_name(p), shape);
    for (guint j = 0; with_states && j < qkv_param_n_states(p); j++) {
      QkvTensor *t = NULL;
      const gchar *name = qkv_param_nth_state(p, j, &t);
      const QkvShape *shape = qkv_tensor_shape(t);
      g_string_append_printf(s, "s\t%s\t%d\t%d\t", name, (int)qkv_tensor_dtype(t), shape->rank);
      for (gint d = 0; d < shape->rank; d++)
        g_string_append_printf(s, "%s%" G_GINT64_FORMAT, d ? "," : "", shape->dims[d]);
      g_string_append_c(s, '\n');
    }
  }
  return g_string_free(s, FALSE);
}

/* Compare this rank's parameters with rank 0's manifest; a description of
 * the first difference, or NULL. */
static gchar *
compare_params(QkvParams *params, const gchar *root_manifest)
{
  g_auto(GStrv) lines = g_strsplit(root_manifest, "\n", -1);
  guint n_root = 0, k = 0;
  for (guint i = 0; lines[i] != NULL; i++)
    n_root += lines[i][0] == 'p';
  if (n_root != qkv_params_size(params))
    return g_strdup_printf("holds %u parameters, rank 0 holds %u", qkv_params_size(params), n_root);
  for (guint i = 0; lines[i] != NULL; i++) {
    if (lines[i][0] != 'p')
      continue;
    g_auto(GStrv) f = g_strsplit(lines[i], "\t", 3);
    QkvParam *p = qkv_params_nth(params, k++);
    g_autofree gchar *shape = qkv_shape_to_string(qkv_param_shape(p));
    if (g_strv_length(f) != 3 || !g_str_equal(f[1], qkv_param_name(p)))
      return g_strdup_printf("holds parameter %u as '%s', rank 0 as '%s'", k - 1, qkv_param_name(p),
                             g_strv_length(f) > 1 ? f[1] : "?");
    if (!g_str_equal(f[2], shape))
      return g_strdup_printf("holds parameter '%s' with shape %s, rank 0 with shape %s",
                             qkv_param_name(p), shape, f[2]);
  }
  return NULL;
}

/* Make this rank's state tensors those rank 0 lists: create the missing,
 * drop the extra. A state of another dtype or shape is a mismatch. */
static gchar *
match_states(QkvParams *params, const gchar *root_manifest)
{
  g_auto(GStrv) lines = g_strsplit(root_manifest, "\n", -1);
  QkvParam *p = NULL;
  gint k = -1;
  GHashTable *wanted = NULL;
  gchar *problem = NULL;
  for (guint i = 0; problem == NULL; i++) {
    gboolean end = lines[i] == NULL || lines[i][0] == 'p';
    if (end && p != NULL) {
      /* drop the states rank 0 does not have */
      for (guint j = qkv_param_n_states(p); j-- > 0;) {
        const gchar *name = qkv_param_nth_state(p, j, NULL);
        if (!g_hash_table_contains(wanted, name)) {
          g_autofree gchar *copy = g_strdup(name);
          qkv_param_remove_state(p, copy);
        }
      }
      g_clear_pointer(&wanted, g_hash_table_unref);
    }
    if (lines[i] == NULL)
      break;
    if (lines[i][0] == 'p') {
      p = qkv_params_nth(params, (guint)++k);
      wanted = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
      continue;
    }
    if (lines[i][0] != 's' || p == NULL)
      continue;
    g_auto(GStrv) f = g_strsplit(lines[i], "\t", 5);
    if (g_strv_length(f) != 5)
      continue;
    g_hash_table_add(wanted, g_strdup(f[1]));
    /* rank 0's dtype and shape of the state */
    QkvDType dtype = (QkvDType)atoi(f[2]);
    gint rank = CLAMP(atoi(f[3]), 0, QKV_MAX_RANK);
    g_auto(GStrv) dims_text = g_strsplit(f[4], ",", -1);
    gint64 dims[QKV_MAX_RANK] = {0};
    for (gint d = 0; d < rank && dims_text[d] != NULL; d++)
      dims[d] = g_ascii_strtoll(dims_text[d], NULL, 10);
    QkvShape want = qkv_shape_from_array(rank, dims);
    g_autofree gchar *want_text = qkv_shape_to_string(&want);
    QkvTensor *have = qkv_param_lookup_state(p, f[1]);
    if (have != NULL) {
      if (qkv_tensor_dtype(have) != dtype || !qkv_shape_equal(qkv_tensor_shape(have), &want)) {
        g_autofree gchar *shape = qkv_shape_to_string(qkv_tensor_shape(have));
        problem = g_strdup_printf("holds state '%s' of '%s' as %s %s, rank 0 as %s %s", f[1],
                                  qkv_param_name(p), qkv_dtype_name(qkv_tensor_dtype(have)), shape,
                                  qkv_dtype_name(dtype), want_text);
      }
      continue;
    }
    if (qkv_param_state_full(p, f[1], dtype, &want) == NULL)
      problem = g_strdup_printf("cannot create state '%s' %s of '%s' as rank 0 has it", f[1],
                                want_text, qkv_param_name(p));
  }
  if (wanted != NULL)
    g_hash_table_unref(wanted);
  return problem;
}

/* Every rank learns whether every rank is fine: the first rank's problem
 * becomes everyone's error. */
static gboolean
all_fine(QkvDist *dist, const gchar *problem, QkvDistOp op, GError **error)
{
  const gchar *what =
      op == QKV_DIST_OP_STATE_CHECK ? "optimizer state broadcast" : "parameter broadcast";
  char mine[MESSAGE_LEN] = {0};
  if (problem != NULL)
    g_strlcpy(mine, problem, sizeof mine);
  g_autofree char *all = g_malloc0((gsize)MESSAGE_LEN * dist->size);
  if (!qkv_dist_arrive(dist, op, 0, NULL, error) ||
      !qkv_dist_mpi_check(
          dist, MPI_Allgather(mine, MESSAGE_LEN, MPI_CHAR, all, MESSAGE_LEN, MPI_CHAR, dist->comm),
          "MPI_Allgather", error))
    return FALSE;
  for (gint r = 0; r < dist->size; r++) {
    const char *m = all + (gsize)r * MESSAGE_LEN;
    if (m[0] != '\0') {
      g_set_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH,
                  "%s: rank %d %.*s (every rank must build the same model)", what, r, MESSAGE_LEN,
                  m);
      return FALSE;
    }
  }
  return TRUE;
}

static gboolean
bcast_bytes(QkvDist *dist, gpointer data, gsize n, GError **error)
{
  for (gsize off = 0; off < n;) {
    gsize chunk = MIN(n - off, (gsize)G_MAXINT);
    qkv_dist_arm(dist, "parameter broadcast"); /* the timeout bounds each call */
    if (!qkv_dist_mpi_check(dist,
                            MPI_Bcast((char *)data + off, (int)chunk, MPI_BYTE, 0, dist->comm),
                            "MPI_Bcast", error))
      return FALSE;
    off += chunk;
  }
  return TRUE;
}

static gboolean
broadcast_params_impl(QkvDist *dist, QkvParams *params, QkvOptimizer *optimizer, GError **error)
{
  g_return_val_if_fail(dist != NULL && params != NULL, FALSE);
  if (!qkv_dist_check_usable(dist, error))
    return FALSE;
  const gboolean states = optimizer != NULL;
  g_autofree gchar *text = dist->rank == 0 ? manifest(params, states) : NULL;
  guint64 len = text != NULL ? strlen(text) + 1 : 0;
  if (!qkv_dist_arrive(dist, QKV_DIST_OP_BROADCAST, 0, NULL, error) ||
      !qkv_dist_mpi_check(dist, MPI_Bcast(&len, 1, MPI_UINT64_T, 0, dist->comm), "MPI_Bcast",
                          error))
    return FALSE;
  if (text == NULL)
    text = g_malloc0(len);
  if (!bcast_bytes(dist, text, len, error))
    return FALSE;
  text[len - 1] = '\0';
  g_autofree gchar *problem = dist->rank == 0 ? NULL : compare_params(params, text);
  if (!all_fine(dist, problem, QKV_DIST_OP_PARAM_CHECK, error))
    return FALSE;
  if (states && dist->rank != 0)
    problem = match_states(params, text);
  if (states && !all_fine(dist, problem, QKV_DIST_OP_STATE_CHECK, error))
    return FALSE;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    QkvTensor *v = qkv_param_value(p);
    if (!bcast_bytes(dist, qkv_tensor_data(v), qkv_tensor_nbytes(v), error))
      return FALSE;
    for (guint j = 0; states && j < qkv_param_n_states(p); j++) {
      QkvTensor *t = NULL;
      qkv_param_nth_state(p, j, &t);
      if (!bcast_bytes(dist, qkv_tensor_data(t), qkv_tensor_nbytes(t), error))
        return FALSE;
    }
  }
  if (states) {
    gint64 step = qkv_optimizer_get_step(optimizer);
    if (!qkv_dist_mpi_check(dist, MPI_Bcast(&step, 1, MPI_INT64_T, 0, dist->comm), "MPI_Bcast",
                            error))
      return FALSE;
    qkv_optimizer_set_step(optimizer, step);
  }
  return TRUE;
}

/* ---- reductions ---- */

static gboolean
reduce_floats(QkvDist *dist, float *buf, gsize n, GError **error)
{
  const gsize per_call = MAX(dist->bucket_bytes / sizeof(float), 1);
  double t0 = now_s();
  for (gsize off = 0; off < n;) {
    gsize chunk = MIN(n - off, per_call);
    qkv_dist_arm(dist, "gradient all-reduce"); /* the timeout bounds each call */
    if (!qkv_dist_mpi_check(
            dist,
            MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)chunk, MPI_FLOAT, MPI_SUM, dist->comm),
            "MPI_Allreduce", error))
      return FALSE;
    dist->stats.mpi_calls++;
    dist->stats.bytes_reduced += chunk * sizeof(float);
    off += chunk;
  }
  dist->stats.seconds_reduce += now_s() - t0;
  return TRUE;
}

static gboolean
allreduce_grads_impl(QkvDist *dist, QkvParams *params, QkvDistReduce op, float *extra,
                     guint n_extra, GError **error)
{
  g_return_val_if_fail(dist != NULL && params != NULL, FALSE);
  g_return_val_if_fail(extra != NULL || n_extra == 0, FALSE);
  if (!qkv_dist_check_usable(dist, error))
    return FALSE;
  dist->stats.reductions++;
  if (dist->size == 1)
    return TRUE; /* the sum and the mean of one are itself */
  double t0 = now_s();
  gsize n = n_extra;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (!qkv_param_get_frozen(p))
      n += (gsize)qkv_tensor_numel(qkv_param_grad(p));
  }
  if (n > dist->flat_n) {
    g_free(dist->flat);
    dist->flat = g_try_new(float, n);
    dist->flat_n = dist->flat != NULL ? n : 0;
    if (dist->flat == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                  "no memory for the %zu-byte gradient buffer of the all-reduce",
                  n * sizeof(float));
      return FALSE;
    }
  }
  float *at = dist->flat;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (qkv_param_get_frozen(p))
      continue;
    QkvTensor *g = qkv_param_grad(p);
    memcpy(at, qkv_tensor_data(g), qkv_tensor_nbytes(g));
    at += qkv_tensor_numel(g);
  }
  if (n_extra > 0)
    memcpy(at, extra, n_extra * sizeof(float));
  dist->stats.seconds_pack += now_s() - t0;

  if (!qkv_dist_arrive(dist, QKV_DIST_OP_GRADS, (gint64)n, NULL, error) ||
      !reduce_floats(dist, dist->flat, n, error))
    return FALSE;

  t0 = now_s();
  const float scale = op == QKV_DIST_MEAN ? 1.0f / (float)dist->size : 1.0f;
  at = dist->flat;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (qkv_param_get_frozen(p))
      continue;
    QkvTensor *g = qkv_param_grad(p);
    float *dst = qkv_tensor_f32(g);
    gint64 k = qkv_tensor_numel(g);
    if (scale == 1.0f)
      memcpy(dst, at, (gsize)k * sizeof(float));
    else
      for (gint64 j = 0; j < k; j++)
        dst[j] = at[j] * scale;
    at += k;
  }
  for (guint j = 0; j < n_extra; j++)
    extra[j] = at[j] * scale;
  dist->stats.seconds_pack += now_s() - t0;
  return TRUE;
}

static gboolean
allreduce_impl(QkvDist *dist, double *values, guint n, QkvDistReduce op, GError **error)
{
  g_return_val_if_fail(dist != NULL && (values != NULL || n == 0), FALSE);
  if (!qkv_dist_check_usable(dist, error))
    return FALSE;
  if (dist->size == 1 || n == 0)
    return TRUE;
  if (!qkv_dist_arrive(dist, QKV_DIST_OP_ALLREDUCE, n, NULL, error) ||
      !qkv_dist_mpi_check(
          dist, MPI_Allreduce(MPI_IN_PLACE, values, (int)n, MPI_DOUBLE, MPI_SUM, dist->comm),
          "MPI_Allreduce", error))
    return FALSE;
  if (op == QKV_DIST_MEAN)
    for (guint i = 0; i < n; i++)
      values[i] /= dist->size;
  return TRUE;
}

gboolean
qkv_dist_barrier(QkvDist *dist, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL, FALSE);
  gboolean ok = qkv_dist_arrive(dist, QKV_DIST_OP_BARRIER, 0, NULL, error);
  qkv_dist_disarm(dist);
  return ok;
}

/* ---- agreement on values ---- */

#define SHOWN_LEN 160
#define MAX_GROUPS_SHOWN 4

/* One rank's value, as the ranks compare it. */
typedef struct {
  guint8 digest[32];     /* SHA-256 */
  char shown[SHOWN_LEN]; /* the value, or its length and hash when long */
} Fingerprint;

static void
fingerprint(const gchar *value, Fingerprint *fp)
{
  gsize len = strlen(value), n = sizeof fp->digest;
  GChecksum *sha = g_checksum_new(G_CHECKSUM_SHA256);
  g_checksum_update(sha, (const guchar *)value, (gssize)len);
  g_checksum_get_digest(sha, fp->digest, &n);
  g_checksum_free(sha);
  if (len < SHOWN_LEN && g_utf8_validate(value, (gssize)len, NULL)) {
    memcpy(fp->shown, value, len + 1);
    return;
  }
  char hex[17];
  for (gint i = 0; i < 8; i++)
    g_snprintf(hex + 2 * i, 3, "%02x", fp->digest[i]);
  g_snprintf(fp->shown, SHOWN_LEN, "a value of %zu bytes, SHA-256 %s...", len, hex);
}

/* "WHAT differs: rank 0 has A; ranks 1 and 2 have B", or NULL when every
 * rank has the same value. */
static gchar *
describe_differences(const Fingerprint *all, gint n, const gchar *what)
{
  g_autofree gboolean *grouped = g_new0(gboolean, n);
  GString *text = g_string_new(NULL);
  gint groups = 0;
  for (gint r = 0; r < n; r++) {
    if (grouped[r])
      continue;
    GString *ranks = g_string_new(NULL);
    gint members = 0;
    for (gint q = r; q < n; q++) {
      if (grouped[q] || memcmp(all[q].digest, all[r].digest, sizeof all[r].digest) != 0)
        continue;
      grouped[q] = TRUE;
      members++;
      g_string_append_printf(ranks, "%s%d", members == 1 ? "" : ", ", q);
    }
    if (++groups <= MAX_GROUPS_SHOWN)
      g_string_append_printf(text, "%s%s %s %s %.*s", groups == 1 ? "" : "; ",
                             members == 1 ? "rank" : "ranks", ranks->str,
                             members == 1 ? "has" : "have", SHOWN_LEN, all[r].shown);
    g_string_free(ranks, TRUE);
  }
  if (groups == 1) {
    g_string_free(text, TRUE);
    return NULL;
  }
  if (groups > MAX_GROUPS_SHOWN)
    g_string_append_printf(text, "; %d more values", groups - MAX_GROUPS_SHOWN);
  g_string_prepend(text, " differs: ");
  g_string_prepend(text, what);
  return g_string_free(text, FALSE);
}

static gboolean
agree_impl(QkvDist *dist, const gchar *what, const gchar *value, GError **error)
{
  if (!qkv_dist_check_usable(dist, error))
    return FALSE;
  if (dist->size == 1)
    return qkv_dist_arrive(dist, QKV_DIST_OP_AGREE, 0, what, error);
  Fingerprint mine = {0};
  fingerprint(value, &mine);
  g_autofree Fingerprint *all = g_new0(Fingerprint, dist->size);
  /* the header carries a hash of what: ranks agreeing on different things
   * are ranks at different collectives */
  if (!qkv_dist_arrive(dist, QKV_DIST_OP_AGREE, g_str_hash(what), what, error) ||
      !qkv_dist_mpi_check(
          dist, MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, dist->comm),
          "MPI_Allgather", error))
    return FALSE;
  g_autofree gchar *problem = describe_differences(all, dist->size, what);
  if (problem == NULL)
    return TRUE;
  g_set_error_literal(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH, problem);
  return FALSE;
}

gboolean
qkv_dist_agree(QkvDist *dist, const gchar *what, const gchar *value, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL && what != NULL && value != NULL, FALSE);
  gboolean ok = agree_impl(dist, what, value, error);
  qkv_dist_disarm(dist);
  return ok;
}

void
qkv_dist_get_stats(const QkvDist *dist, QkvDistStats *stats)
{
  *stats = dist->stats;
}

void
qkv_dist_reset_stats(QkvDist *dist)
{
  memset(&dist->stats, 0, sizeof dist->stats);
}

gboolean
qkv_dist_broadcast_params(QkvDist *dist, QkvParams *params, QkvOptimizer *optimizer, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL, FALSE);
  gboolean ok = broadcast_params_impl(dist, params, optimizer, error);
  qkv_dist_disarm(dist);
  return ok;
}

gboolean
qkv_dist_allreduce_grads(QkvDist *dist, QkvParams *params, QkvDistReduce op, float *extra,
                         guint n_extra, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL, FALSE);
  gboolean ok = allreduce_grads_impl(dist, params, op, extra, n_extra, error);
  qkv_dist_disarm(dist);
  return ok;
}

gboolean
qkv_dist_allreduce(QkvDist *dist, double *values, guint n, QkvDistReduce op, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(dist != NULL, FALSE);
  gboolean ok = allreduce_impl(dist, values, n, op, error);
  qkv_dist_disarm(dist);
  return ok;
}
