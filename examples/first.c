/* first: a complete first program, the one README.md quotes.
 *
 * The task: points drawn uniformly in a disc of radius 3, labelled by the
 * ring they fall in (radius below 1: class 0, below 2: class 1, else 2), so
 * no straight line separates the classes. A two-layer MLP learns it with
 * mini-batch Adam under a cosine schedule; an evaluation graph over the same
 * parameters measures argmax accuracy on held-out points; a checkpoint is
 * saved, loaded into a fresh store, and must give the same accuracy.
 *
 * Exits 1 when anything fails or the accuracy is below MIN_ACCURACY, so the
 * test suite runs it as a test.
 *
 * qkv-first --load PATH trains nothing: it evaluates the checkpoint at PATH
 * (examples/python/first.py saves one) on the same test points and prints
 * its accuracy, with the same exit rule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <glib/gstdio.h>
#include <qkv/qkv.h>

#include "common/program-version.h"

#define N_TRAIN 1024
#define N_TEST 512
#define BATCH 32
#define HIDDEN 32
#define CLASSES 3
#define EPOCHS 30
#define MIN_ACCURACY 0.9

/* n points (x, y) and their ring labels, from rng */
static void
make_rings(GRand *rng, gint n, float *points, gint32 *labels)
{
  for (gint i = 0; i < n; i++) {
    double r = 3.0 * sqrt(g_rand_double(rng)), a = 2 * G_PI * g_rand_double(rng);
    points[2 * i] = (float)(r * cos(a));
    points[2 * i + 1] = (float)(r * sin(a));
    labels[i] = r < 1.0 ? 0 : r < 2.0 ? 1 : 2;
  }
}

/* The model: logits (n, CLASSES) for x (n, 2). Builders create the
 * parameters in b's store the first time and reuse them after, so a second
 * graph built on the same store shares them. */
static QkvValue *
mlp(QkvBuilder *b, QkvValue *x, GError **error)
{
  QkvValue *h = qkv_build_linear(b, "hidden", x, HIDDEN, TRUE, error);
  h = qkv_relu(h, error);
  return qkv_build_linear(b, "out", h, CLASSES, TRUE, error);
}

/* An evaluation graph over params: the share of the test points whose
 * argmax class is right. Straight-line: each call passes on a NULL, so one
 * check at the end sees the first error. */
static gboolean
accuracy(QkvParams *params, QkvTensor *x_test, QkvTensor *y_test, double *acc, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  /* the seed only initialises params the store does not have yet */
  QkvBuilder b = {.graph = g, .params = params, .seed = 2};
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, qkv_tensor_shape(x_test), error);
  QkvValue *y = qkv_graph_input(g, "y", QKV_I32, qkv_tensor_shape(y_test), error);
  QkvValue *pred = qkv_argmax(mlp(&b, x, error), 1, FALSE, error); /* i32 (N_TEST) */
  QkvValue *right = qkv_mean(qkv_eq(pred, y, error), NULL, 0, FALSE, error);
  const gchar *names[] = {"x", "y"};
  QkvTensor *inputs[] = {x_test, y_test};
  g_autoptr(QkvTensor) result = NULL;
  if (!qkv_graph_eval(g, names, inputs, 2, &right, &result, 1, error))
    return FALSE;
  *acc = qkv_tensor_get(result, 0);
  return TRUE;
}

/* --load PATH: the accuracy of a saved checkpoint on the test points (the
 * training points are drawn first, as run() draws them, so the test points
 * are the same). */
static gboolean
evaluate_checkpoint(const gchar *path, GError **error)
{
  g_autoptr(GRand) rng = g_rand_new_with_seed(7);
  QkvShape xs = QKV_SHAPE(N_TRAIN, 2), ys = QKV_SHAPE(N_TRAIN);
  QkvShape txs = QKV_SHAPE(N_TEST, 2), tys = QKV_SHAPE(N_TEST);
  g_autoptr(QkvTensor) x_train = qkv_tensor_new(QKV_F32, &xs);
  g_autoptr(QkvTensor) y_train = qkv_tensor_new(QKV_I32, &ys);
  g_autoptr(QkvTensor) x_test = qkv_tensor_new(QKV_F32, &txs);
  g_autoptr(QkvTensor) y_test = qkv_tensor_new(QKV_I32, &tys);
  make_rings(rng, N_TRAIN, qkv_tensor_f32(x_train), qkv_tensor_i32(y_train));
  make_rings(rng, N_TEST, qkv_tensor_f32(x_test), qkv_tensor_i32(y_test));
  /* the first evaluation creates the params untrained; the load overwrites them */
  g_autoptr(QkvParams) params = qkv_params_new();
  double acc_untrained = -1, acc = -1;
  if (!accuracy(params, x_test, y_test, &acc_untrained, error) ||
      !qkv_checkpoint_load(path, params, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, error) ||
      !accuracy(params, x_test, y_test, &acc, error))
    return FALSE;
  printf("loaded %s: test accuracy %.3f\n", path, acc);
  if (acc < MIN_ACCURACY) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "test accuracy %.3f is below %.2f",
                acc, MIN_ACCURACY);
    return FALSE;
  }
  return TRUE;
}

static gboolean
run(GError **error)
{
  /* the data, made here: a training and a test set */
  g_autoptr(GRand) rng = g_rand_new_with_seed(7);
  QkvShape xs = QKV_SHAPE(N_TRAIN, 2), ys = QKV_SHAPE(N_TRAIN);
  QkvShape txs = QKV_SHAPE(N_TEST, 2), tys = QKV_SHAPE(N_TEST);
  g_autoptr(QkvTensor) x_train = qkv_tensor_new(QKV_F32, &xs);
  g_autoptr(QkvTensor) y_train = qkv_tensor_new(QKV_I32, &ys);
  g_autoptr(QkvTensor) x_test = qkv_tensor_new(QKV_F32, &txs);
  g_autoptr(QkvTensor) y_test = qkv_tensor_new(QKV_I32, &tys);
  make_rings(rng, N_TRAIN, qkv_tensor_f32(x_train), qkv_tensor_i32(y_train));
  make_rings(rng, N_TEST, qkv_tensor_f32(x_test), qkv_tensor_i32(y_test));

  /* the training graph: the model, its loss, and the gradient nodes */
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  QkvShape bxs = QKV_SHAPE(BATCH, 2), bys = QKV_SHAPE(BATCH);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &bxs, error);
  QkvValue *y = qkv_graph_input(g, "y", QKV_I32, &bys, error);
  QkvValue *logits = mlp(&b, x, error);
  QkvValue *loss = qkv_cross_entropy(logits, y, NULL, QKV_REDUCTION_MEAN, error);
  qkv_graph_backward(g, loss, error); /* gradient nodes join the graph */

  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &opts, error);

  /* Adam under a cosine schedule; made only when the plan was */
  const gint steps_per_epoch = N_TRAIN / BATCH;
  QkvOptimConfig adam = qkv_optim_config_adam(0.02);
  g_autoptr(QkvOptimizer) opt = plan ? qkv_optimizer_new_adam(params, &adam, error) : NULL;
  g_autoptr(QkvSchedule) schedule =
      opt ? qkv_schedule_try_new_cosine(0.02, (gint64)EPOCHS * steps_per_epoch, 0.001, error)
          : NULL;

  /* the batch tensors are bound once; each step refills them */
  g_autoptr(QkvTensor) x_batch = qkv_tensor_new(QKV_F32, &bxs);
  g_autoptr(QkvTensor) y_batch = qkv_tensor_new(QKV_I32, &bys);
  if (schedule == NULL || /* the one check: error holds the first failure */
      !qkv_plan_bind(plan, "x", x_batch, error) || !qkv_plan_bind(plan, "y", y_batch, error))
    return FALSE;

  g_autofree gint *order = g_new(gint, N_TRAIN);
  for (gint i = 0; i < N_TRAIN; i++)
    order[i] = i;
  float last_loss = 0;
  for (gint epoch = 0; epoch < EPOCHS; epoch++) {
    for (gint i = N_TRAIN - 1; i > 0; i--) { /* shuffle */
      gint j = g_rand_int_range(rng, 0, i + 1), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (gint s = 0; s < steps_per_epoch; s++) {
      for (gint k = 0; k < BATCH; k++) {
        gint i = order[s * BATCH + k];
        qkv_tensor_f32(x_batch)[2 * k] = qkv_tensor_f32(x_train)[2 * i];
        qkv_tensor_f32(x_batch)[2 * k + 1] = qkv_tensor_f32(x_train)[2 * i + 1];
        qkv_tensor_i32(y_batch)[k] = qkv_tensor_i32(y_train)[i];
      }
      qkv_schedule_step(schedule, opt); /* sets the lr for this update */
      if (!qkv_plan_run(plan, error) || /* forward, and d loss / d params */
          !qkv_optimizer_step(opt, error))
        return FALSE;
      last_loss = qkv_plan_output_scalar(plan, 0);
    }
  }

  double acc = 0;
  if (!accuracy(params, x_test, y_test, &acc, error))
    return FALSE;
  printf("last batch loss %.4f, test accuracy %.3f\n", last_loss, acc);

  /* save, load into a fresh store, evaluate again */
  g_autofree gchar *dir = g_dir_make_tmp("qkv-first-XXXXXX", error);
  if (dir == NULL)
    return FALSE;
  g_autofree gchar *path = g_build_filename(dir, "first.safetensors", NULL);
  /* a fresh store: its first evaluation creates the params from another
   * seed, untrained; the load overwrites them */
  g_autoptr(QkvParams) restored = qkv_params_new();
  double acc_untrained = -1, acc_restored = -1;
  gboolean ok =
      accuracy(restored, x_test, y_test, &acc_untrained, error) &&
      qkv_checkpoint_save(path, params, opt, schedule, NULL, error) &&
      qkv_checkpoint_load(path, restored, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, error) &&
      accuracy(restored, x_test, y_test, &acc_restored, error);
  g_remove(path);
  g_rmdir(dir);
  if (!ok)
    return FALSE;
  printf("a fresh store: test accuracy %.3f; after loading the checkpoint: %.3f\n", acc_untrained,
         acc_restored);

  if (acc_restored != acc) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "the loaded checkpoint gives accuracy %.4f, not %.4f", acc_restored, acc);
    return FALSE;
  }
  if (acc < MIN_ACCURACY) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "test accuracy %.3f is below %.2f",
                acc, MIN_ACCURACY);
    return FALSE;
  }
  return TRUE;
}

int
main(int argc, char **argv)
{
  if (program_version_requested(argc, argv)) {
    program_print_version("qkv-first");
    return EXIT_SUCCESS;
  }
  g_autoptr(GError) error = NULL;
  if (argc == 3 && g_str_equal(argv[1], "--load")) {
    if (!evaluate_checkpoint(argv[2], &error)) {
      fprintf(stderr, "first: %s\n", error->message);
      return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s [--load CHECKPOINT]\n", argv[0]);
    return EXIT_FAILURE;
  }
  if (!run(&error)) {
    fprintf(stderr, "first: %s\n", error->message);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
