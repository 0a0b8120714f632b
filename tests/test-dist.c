/* test-dist.c: qkv-dist.h. Meson runs it under `mpirun -np 2` when qkv was
 * built with MPI (every rank runs every test; rank 0 prints); without MPI it
 * checks that qkv_dist_init() says so and exits 77 (skipped). */
#include <qkv/qkv-dist.h>
#include <qkv/qkv.h>
#include <stdio.h>
#include <string.h>

#include "test-util.h"

static QkvDist *dist;

static QkvParams *
make_params(gint64 rows_b)
{
  QkvParams *p = qkv_params_new();
  QkvShape sa = QKV_SHAPE(3, 4), sb = QKV_SHAPE(rows_b), sc = QKV_SHAPE(2);
  g_assert_nonnull(qkv_params_add(p, "a", &sa, NULL));
  g_assert_nonnull(qkv_params_add(p, "b", &sb, NULL));
  g_assert_nonnull(qkv_params_add(p, "frozen", &sc, NULL));
  qkv_param_set_frozen(qkv_params_lookup(p, "frozen"), TRUE);
  return p;
}

static void
fill(QkvTensor *t, float base)
{
  float *x = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    x[i] = base + (float)i;
}

/* The shards of every n tile [0, n) exactly once. */
static void
test_shard(void)
{
  const gint w = qkv_dist_world_size(dist);
  for (gint64 n = 0; n <= 9; n++) {
    gint64 off = -1, count = -1;
    qkv_dist_shard(dist, n, &off, &count);
    g_assert_cmpint(count, >=, n / w);
    g_assert_cmpint(count, <=, n / w + 1);
    g_autofree double *hits = g_new0(double, n + 1);
    for (gint64 i = off; i < off + count; i++)
      hits[i] += 1;
    hits[n] = (double)count;
    g_assert_true(qkv_dist_allreduce(dist, hits, (guint)n + 1, QKV_DIST_SUM, NULL));
    for (gint64 i = 0; i < n; i++)
      g_assert_cmpfloat(hits[i], ==, 1.0);
    g_assert_cmpfloat(hits[n], ==, (double)n);
  }
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_dist_check_batch(dist, w, NULL));
  g_assert_false(qkv_dist_check_batch(dist, w - 1, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_assert_nonnull(strstr(error->message, "cannot be split over"));
}

/* Sum and mean of the gradients and the extras, in buckets smaller than one
 * parameter; frozen parameters keep their own gradient. */
static void
test_allreduce_grads(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  g_autoptr(QkvParams) p = make_params(5);
  for (gint round = 0; round < 2; round++) {
    QkvDistReduce op = round == 0 ? QKV_DIST_SUM : QKV_DIST_MEAN;
    fill(qkv_param_grad(qkv_params_lookup(p, "a")), 100.0f * (float)r);
    fill(qkv_param_grad(qkv_params_lookup(p, "b")), -10.0f * (float)r);
    fill(qkv_param_grad(qkv_params_lookup(p, "frozen")), 7.0f + (float)r);
    float extra[2] = {(float)r + 1, 2.0f};
    qkv_dist_reset_stats(dist);
    qkv_dist_set_bucket_bytes(dist, 5 * sizeof(float));
    g_autoptr(GError) error = NULL;
    g_assert_true(qkv_dist_allreduce_grads(dist, p, op, extra, 2, &error));
    g_assert_no_error(error);
    /* Σ_r (100 r + i) = 100 w(w-1)/2 + w i */
    const double ranks = (double)w * (w - 1) / 2, div = op == QKV_DIST_MEAN ? w : 1;
    const float *a = qkv_tensor_f32(qkv_param_grad(qkv_params_lookup(p, "a")));
    for (gint i = 0; i < 12; i++)
      g_assert_cmpfloat_with_epsilon(a[i], (100 * ranks + (double)w * i) / div, 1e-4);
    const float *b = qkv_tensor_f32(qkv_param_grad(qkv_params_lookup(p, "b")));
    for (gint i = 0; i < 5; i++)
      g_assert_cmpfloat_with_epsilon(b[i], (-10 * ranks + (double)w * i) / div, 1e-4);
    const float *f = qkv_tensor_f32(qkv_param_grad(qkv_params_lookup(p, "frozen")));
    g_assert_cmpfloat(f[0], ==, 7.0f + (float)r);
    g_assert_cmpfloat_with_epsilon(extra[0], (ranks + w) / div, 1e-5);
    g_assert_cmpfloat_with_epsilon(extra[1], 2.0 * w / div, 1e-5);
    QkvDistStats st;
    qkv_dist_get_stats(dist, &st);
    g_assert_cmpuint(st.reductions, ==, 1);
    if (w > 1) {
      /* 12 + 5 + 2 floats in calls of at most 5 */
      g_assert_cmpuint(st.bytes_reduced, ==, 19 * sizeof(float));
      g_assert_cmpuint(st.mpi_calls, ==, 4);
    }
  }
  qkv_dist_set_bucket_bytes(dist, 64u << 20);
}

/* Values, optimizer state (created where missing, dropped where rank 0 has
 * none) and the step count come from rank 0. */
static void
test_broadcast(void)
{
  const gint r = qkv_dist_rank(dist);
  g_autoptr(QkvParams) p = make_params(5);
  QkvOptimConfig oc = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(p, &oc, NULL);
  for (guint i = 0; i < qkv_params_size(p); i++)
    fill(qkv_param_value(qkv_params_nth(p, i)), 1000.0f * (float)r + (float)i);
  if (r == 0) {
    fill(qkv_param_grad(qkv_params_lookup(p, "a")), 1.0f);
    g_assert_true(qkv_optimizer_step(opt, NULL));
    g_assert_true(qkv_optimizer_step(opt, NULL));
  } else {
    qkv_param_state(qkv_params_lookup(p, "b"), "only_here");
  }
  g_autoptr(QkvParams) want = make_params(5);
  for (guint i = 0; i < qkv_params_size(p); i++)
    fill(qkv_param_value(qkv_params_nth(want, i)), (float)i);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_dist_broadcast_params(dist, p, opt, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 2);
  QkvParam *a = qkv_params_lookup(p, "a");
  if (r == 0) {
    /* rank 0's own values moved with its two Adam steps */
    return;
  }
  g_assert_null(qkv_param_lookup_state(qkv_params_lookup(p, "b"), "only_here"));
  g_assert_cmpuint(qkv_param_n_states(a), >, 0);
  qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(p, "b")),
                          qkv_param_value(qkv_params_lookup(want, "b")), 0);
  g_assert_nonnull(qkv_param_lookup_state(a, "exp_avg"));
}

/* After the broadcast every rank's values and states are bit-identical:
 * compare them with a sum across ranks. */
static void
test_broadcast_identical(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  g_autoptr(QkvParams) p = make_params(5);
  QkvOptimConfig oc = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(p, &oc, NULL);
  fill(qkv_param_value(qkv_params_lookup(p, "a")), 3.0f * (float)r);
  fill(qkv_param_grad(qkv_params_lookup(p, "a")), 1.0f + (float)r);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  g_assert_true(qkv_dist_broadcast_params(dist, p, opt, NULL));
  const float *v = qkv_tensor_f32(qkv_param_value(qkv_params_lookup(p, "a")));
  const float *m = qkv_tensor_f32(qkv_param_lookup_state(qkv_params_lookup(p, "a"), "exp_avg"));
  double mine[2] = {v[5], m[5]}, sum[2] = {v[5], m[5]};
  g_assert_true(qkv_dist_allreduce(dist, sum, 2, QKV_DIST_SUM, NULL));
  g_assert_cmpfloat(sum[0], ==, mine[0] * w);
  g_assert_cmpfloat(sum[1], ==, mine[1] * w);
}

/* A rank whose parameter has another shape: every rank fails, naming it. */
static void
test_mismatch(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  if (w < 2) {
    g_test_skip("needs two ranks");
    return;
  }
  g_autoptr(QkvParams) p = make_params(r == 1 ? 6 : 5);
  fill(qkv_param_value(qkv_params_lookup(p, "a")), 50.0f * (float)r);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_dist_broadcast_params(dist, p, NULL, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_assert_nonnull(strstr(error->message, "rank 1 holds parameter 'b' with shape (6)"));
  g_assert_nonnull(strstr(error->message, "rank 0 with shape (5)"));
  /* nothing was overwritten, and the group still works */
  g_assert_cmpfloat(qkv_tensor_f32(qkv_param_value(qkv_params_lookup(p, "a")))[0], ==,
                    50.0f * (float)r);
  g_assert_true(qkv_dist_barrier(dist, NULL));
  /* a different number of parameters */
  g_autoptr(QkvParams) q = make_params(5);
  QkvShape s = QKV_SHAPE(1);
  if (r == 1)
    g_assert_nonnull(qkv_params_add(q, "extra", &s, NULL));
  g_clear_error(&error);
  g_assert_false(qkv_dist_broadcast_params(dist, q, NULL, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_assert_nonnull(strstr(error->message, "rank 1 holds 4 parameters, rank 0 holds 3"));
}

/* A second group over the same processes, for tests that end theirs. */
static QkvDist *
other_group(void)
{
  g_autoptr(GError) error = NULL;
  QkvDist *g = qkv_dist_init(NULL, NULL, &error);
  g_assert_no_error(error);
  return g;
}

/* A group that has ended refuses every collective, and leaving it again
 * does nothing. */
static void
assert_ended(QkvDist *g, const gchar *why)
{
  g_autoptr(GError) error = NULL;
  double v = 1;
  g_assert_false(qkv_dist_allreduce(g, &v, 1, QKV_DIST_SUM, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_BROKEN);
  g_assert_nonnull(strstr(error->message, "has ended"));
  g_assert_nonnull(strstr(error->message, why));
  g_assert_true(qkv_dist_leave(g, "again", NULL));
}

/* Rank 1 leaves while the others are at an all-reduce: every rank fails at
 * once with the same story, instead of the others waiting forever. */
static void
test_leave_early(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  if (w < 2) {
    g_test_skip("needs two ranks");
    return;
  }
  QkvDist *g = other_group();
  g_assert_true(qkv_dist_barrier(g, NULL));
  g_autoptr(GError) error = NULL;
  double v[3] = {1, 2, 3};
  if (r == 1)
    g_assert_false(qkv_dist_leave(g, "finished after 3 epochs", &error));
  else
    g_assert_false(qkv_dist_allreduce(g, v, 3, QKV_DIST_SUM, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_PEER_LEFT);
  g_autofree gchar *want = g_strdup_printf(
      "rank 1 left the job (finished after 3 epochs) while rank %d was at the all-reduce of 3 "
      "values (collective 2)",
      r == 1 ? 0 : r);
  g_assert_cmpstr(error->message, ==, want);
  g_assert_cmpfloat(v[0], ==, 1);
  assert_ended(g, "left the job");
  qkv_dist_free(g);
}

/* Every rank leaves at the same point: that is the end of the job. */
static void
test_leave_together(void)
{
  QkvDist *g = other_group();
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_dist_barrier(g, NULL));
  g_assert_true(qkv_dist_leave(g, "done", &error));
  g_assert_no_error(error);
  assert_ended(g, "this rank left it");
  qkv_dist_free(g);
  if (qkv_dist_world_size(dist) < 2)
    return;
  /* freeing a group leaves it: the others see the reason */
  g = other_group();
  if (qkv_dist_rank(dist) == 1) {
    qkv_dist_free(g);
    return;
  }
  g_assert_false(qkv_dist_barrier(g, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_PEER_LEFT);
  g_assert_nonnull(strstr(error->message, "rank 1 left the job (its process group was freed)"));
  qkv_dist_free(g);
}

/* Ranks at different collectives, or the same one with other sizes, fail
 * before any data moves, naming both. */
static void
test_different_collectives(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  if (w < 2) {
    g_test_skip("needs two ranks");
    return;
  }
  g_autoptr(GError) error = NULL;
  QkvDist *g = other_group();
  double v[4] = {0};
  gboolean ok =
      r == 0 ? qkv_dist_barrier(g, &error) : qkv_dist_allreduce(g, v, 2, QKV_DIST_SUM, &error);
  g_assert_false(ok);
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_assert_nonnull(strstr(error->message, "rank 0 was at the barrier (collective 1), rank 1 at "
                                          "the all-reduce of 2 values (collective 1)"));
  assert_ended(g, "reached different collectives");
  qkv_dist_free(g);
  g_clear_error(&error);
  g = other_group();
  g_assert_false(qkv_dist_allreduce(g, v, r == 1 ? 4 : 3, QKV_DIST_SUM, &error));
  g_assert_nonnull(strstr(error->message, "rank 0 was at the all-reduce of 3 values (collective "
                                          "1), rank 1 at the all-reduce of 4 values"));
  qkv_dist_free(g);
}

/* qkv_dist_agree(): equal values pass; differences name the ranks and
 * their values (long ones by hash); the group stays usable; ranks agreeing
 * on different things are at different collectives. */
static void
test_agree(void)
{
  const gint r = qkv_dist_rank(dist), w = qkv_dist_world_size(dist);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_dist_agree(dist, "option --lr", "0.005", &error));
  g_assert_no_error(error);
  if (w < 2) {
    g_test_skip("needs two ranks");
    return;
  }
  g_autofree gchar *mine = g_strdup_printf("%g", r == 1 ? 0.01 : 0.005);
  g_assert_false(qkv_dist_agree(dist, "option --lr", mine, &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_autofree gchar *others = g_strdup_printf("%s 0", w > 2 ? "ranks" : "rank");
  for (gint q = 2; q < w; q++) {
    g_autofree gchar *was = others;
    others = g_strdup_printf("%s, %d", was, q);
  }
  g_autofree gchar *want = g_strdup_printf("option --lr differs: %s %s 0.005; rank 1 has 0.01",
                                           others, w > 2 ? "have" : "has");
  g_assert_cmpstr(error->message, ==, want);
  g_clear_error(&error);
  g_autofree gchar *long_value = g_strnfill(200, r == 1 ? 'b' : 'a');
  g_assert_false(qkv_dist_agree(dist, "the vocabulary", long_value, &error));
  g_assert_nonnull(strstr(error->message, "rank 1 has a value of 200 bytes, SHA-256 "));
  g_clear_error(&error);
  g_assert_true(qkv_dist_barrier(dist, NULL));
  QkvDist *g = other_group();
  g_assert_false(qkv_dist_agree(g, r == 1 ? "option --seed" : "option --lr", "1", &error));
  g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_MISMATCH);
  g_assert_nonnull(strstr(error->message, "rank 0 was at the agreement on option --lr "
                                          "(collective 1), rank 1 at the agreement on option "
                                          "--seed"));
  qkv_dist_free(g);
}

/* 60 s unless QKV_DIST_TIMEOUT says otherwise (test-dist.py setup sets
 * it: the environment is read once per group). */
static void
test_timeout_default(void)
{
  if (g_getenv("QKV_DIST_TIMEOUT") == NULL)
    g_assert_cmpfloat(qkv_dist_get_timeout(dist), ==, QKV_DIST_DEFAULT_TIMEOUT);
  qkv_dist_set_timeout(dist, 0);
  g_assert_cmpfloat(qkv_dist_get_timeout(dist), ==, 0);
  qkv_dist_set_timeout(dist, QKV_DIST_DEFAULT_TIMEOUT);
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  if (!qkv_dist_available()) {
    QkvDist *none = qkv_dist_init(&argc, &argv, &error);
    g_assert_null(none);
    g_assert_error(error, QKV_DIST_ERROR, QKV_DIST_ERROR_UNAVAILABLE);
    g_assert_nonnull(strstr(error->message, "without MPI"));
    printf("qkv built without MPI: qkv_dist_init() reports it; skipping the MPI tests\n");
    return 77;
  }
  dist = qkv_dist_init(&argc, &argv, &error);
  g_assert_no_error(error);
  /* rank 0 reports; the others only fail loudly (g_assert aborts the job) */
  if (qkv_dist_rank(dist) != 0 && freopen("/dev/null", "w", stdout) == NULL)
    return 1;
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/dist/shard", test_shard);
  g_test_add_func("/dist/allreduce-grads", test_allreduce_grads);
  g_test_add_func("/dist/broadcast", test_broadcast);
  g_test_add_func("/dist/broadcast-identical", test_broadcast_identical);
  g_test_add_func("/dist/mismatch", test_mismatch);
  g_test_add_func("/dist/leave-early", test_leave_early);
  g_test_add_func("/dist/leave-together", test_leave_together);
  g_test_add_func("/dist/different-collectives", test_different_collectives);
  g_test_add_func("/dist/agree", test_agree);
  g_test_add_func("/dist/timeout-default", test_timeout_default);
  int rc = g_test_run();
  qkv_dist_free(dist);
  return rc;
}
