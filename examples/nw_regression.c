/* nw_regression: Nadaraya-Watson attention pooling, as Dive into Deep
 * Learning (0.17, section 10.2) sets it up.
 *
 * 50 training points x = sorted 5·U(0,1), y = 2 sin(x) + x^0.8 + N(0, 0.5²);
 * during training each point attends to the other 49. The parametric model
 * learns one kernel width w with SGD (lr 0.5, full batch, 5 epochs) on the
 * sum of squared errors. Test points x = 0, 0.1, …, 4.9 are scored against the
 * noiseless function for average pooling, the non-parametric model (w = 1)
 * and the parametric one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <qkv/qkv.h>

#define N_TRAIN 50
#define N_TEST 50

static gint64 opt_seed = 0;
static gint opt_epochs = 5;
static double opt_lr = 0.5;

static GOptionEntry entries[] = {
    {"seed", 's', 0, G_OPTION_ARG_INT64, &opt_seed, "Random seed for data and w (default 0)", "N"},
    {"epochs", 'e', 0, G_OPTION_ARG_INT, &opt_epochs, "Training epochs (default 5)", "N"},
    {"lr", 0, 0, G_OPTION_ARG_DOUBLE, &opt_lr, "SGD learning rate (default 0.5)", "LR"},
    {NULL}};

static double
truth(double x)
{
  return 2 * sin(x) + pow(x, 0.8);
}

static int
compare_floats(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Box-Muller on GRand, for the N(0, 0.5²) noise. */
static double
normal(GRand *rand)
{
  double u1 = g_rand_double(rand), u2 = g_rand_double(rand);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(2 * G_PI * u2);
}

static gboolean
run(GError **error)
{
  GRand *rand = g_rand_new_with_seed((guint32)opt_seed);
  float x_train[N_TRAIN], y_train[N_TRAIN], x_test[N_TEST];
  for (int i = 0; i < N_TRAIN; i++)
    x_train[i] = (float)(5.0 * g_rand_double(rand));
  qsort(x_train, N_TRAIN, sizeof(float), compare_floats);
  for (int i = 0; i < N_TRAIN; i++)
    y_train[i] = (float)(truth(x_train[i]) + 0.5 * normal(rand));
  for (int i = 0; i < N_TEST; i++)
    x_test[i] = 0.1f * (float)i;
  g_rand_free(rand);

  /* training keys/values: every point but itself */
  g_autoptr(QkvTensor) train_keys = NULL, train_values = NULL, test_keys = NULL,
                       test_values = NULL;
  {
    QkvShape s = QKV_SHAPE(N_TRAIN, N_TRAIN - 1);
    train_keys = qkv_tensor_new(QKV_F32, &s);
    train_values = qkv_tensor_new(QKV_F32, &s);
    float *k = qkv_tensor_f32(train_keys), *v = qkv_tensor_f32(train_values);
    for (int i = 0; i < N_TRAIN; i++)
      for (int j = 0, c = 0; j < N_TRAIN; j++)
        if (j != i) {
          k[i * (N_TRAIN - 1) + c] = x_train[j];
          v[i * (N_TRAIN - 1) + c++] = y_train[j];
        }
    QkvShape t = QKV_SHAPE(N_TEST, N_TRAIN);
    test_keys = qkv_tensor_new(QKV_F32, &t);
    test_values = qkv_tensor_new(QKV_F32, &t);
    for (int i = 0; i < N_TEST; i++)
      for (int j = 0; j < N_TRAIN; j++) {
        qkv_tensor_f32(test_keys)[i * N_TRAIN + j] = x_train[j];
        qkv_tensor_f32(test_values)[i * N_TRAIN + j] = y_train[j];
      }
  }
  QkvShape n_shape = QKV_SHAPE(N_TRAIN), t_shape = QKV_SHAPE(N_TEST);
  g_autoptr(QkvTensor) x_train_t = qkv_tensor_new_f32(&n_shape, x_train);
  g_autoptr(QkvTensor) y_train_t = qkv_tensor_new_f32(&n_shape, y_train);
  g_autoptr(QkvTensor) x_test_t = qkv_tensor_new_f32(&t_shape, x_test);

  g_autoptr(QkvParams) params = qkv_params_new();

  /* the training graph: predictions, the summed squared error, its gradient */
  g_autoptr(QkvGraph) train = qkv_graph_new();
  QkvValue *q = qkv_graph_input(train, "queries", QKV_F32, &n_shape, error);
  QkvValue *k = qkv_graph_input(train, "keys", QKV_F32, qkv_tensor_shape(train_keys), error);
  QkvValue *v = qkv_graph_input(train, "values", QKV_F32, qkv_tensor_shape(train_values), error);
  QkvValue *y = qkv_graph_input(train, "targets", QKV_F32, &n_shape, error);
  QkvValue *pred = qkv_build_nw_regression(train, params, "", q, k, v, (guint64)opt_seed + 1,
                                           NULL, error);
  QkvValue *loss = pred ? qkv_mse(pred, y, QKV_REDUCTION_SUM, error) : NULL;
  if (loss == NULL || !qkv_graph_backward(train, loss, error))
    return FALSE;
  QkvPlanOptions topts = qkv_plan_options_default();
  topts.training = TRUE;
  g_autoptr(QkvPlan) train_plan = qkv_graph_compile(train, &loss, 1, &topts, error);
  if (train_plan == NULL || !qkv_plan_bind(train_plan, "queries", x_train_t, error) ||
      !qkv_plan_bind(train_plan, "keys", train_keys, error) ||
      !qkv_plan_bind(train_plan, "values", train_values, error) ||
      !qkv_plan_bind(train_plan, "targets", y_train_t, error))
    return FALSE;

  /* the evaluation graph shares the store: test queries attend to all points */
  g_autoptr(QkvGraph) eval = qkv_graph_new();
  QkvValue *eq = qkv_graph_input(eval, "queries", QKV_F32, &t_shape, error);
  QkvValue *ek = qkv_graph_input(eval, "keys", QKV_F32, qkv_tensor_shape(test_keys), error);
  QkvValue *ev = qkv_graph_input(eval, "values", QKV_F32, qkv_tensor_shape(test_values), error);
  QkvValue *epred = qkv_build_nw_regression(eval, params, "", eq, ek, ev, 0, NULL, error);
  if (epred == NULL)
    return FALSE;
  g_autoptr(QkvPlan) eval_plan = qkv_graph_compile(eval, &epred, 1, NULL, error);
  if (eval_plan == NULL || !qkv_plan_bind(eval_plan, "queries", x_test_t, error) ||
      !qkv_plan_bind(eval_plan, "keys", test_keys, error) ||
      !qkv_plan_bind(eval_plan, "values", test_values, error))
    return FALSE;

  QkvParam *w = qkv_params_lookup(params, "w");
  float *wv = qkv_tensor_f32(qkv_param_value(w));
  const float *wg = qkv_tensor_f32(qkv_param_grad(w));
  printf("w init %.4f\n", wv[0]);
  for (int epoch = 0; epoch < opt_epochs; epoch++) {
    if (!qkv_plan_run(train_plan, error))
      return FALSE;
    float l = qkv_plan_output_scalar(train_plan, 0);
    wv[0] -= (float)opt_lr * wg[0]; /* plain SGD on the one parameter */
    printf("epoch %d, loss %.6f, w %.4f\n", epoch + 1, l, wv[0]);
  }

  /* test MSE against the noiseless function */
  double avg = 0, mse_avg = 0, mse_np = 0, mse_p = 0;
  for (int i = 0; i < N_TRAIN; i++)
    avg += y_train[i] / N_TRAIN;
  if (!qkv_plan_run(eval_plan, error))
    return FALSE;
  for (int i = 0; i < N_TEST; i++) {
    double d = qkv_tensor_get(qkv_plan_output(eval_plan, 0), i) - truth(x_test[i]);
    mse_p += d * d / N_TEST;
    mse_avg += (avg - truth(x_test[i])) * (avg - truth(x_test[i])) / N_TEST;
  }
  float learned = wv[0];
  wv[0] = 1.0f; /* the non-parametric model is the same kernel with w = 1 */
  if (!qkv_plan_run(eval_plan, error))
    return FALSE;
  for (int i = 0; i < N_TEST; i++) {
    double d = qkv_tensor_get(qkv_plan_output(eval_plan, 0), i) - truth(x_test[i]);
    mse_np += d * d / N_TEST;
  }
  wv[0] = learned;
  printf("learned w %.4f\n", learned);
  printf("test MSE vs truth: average pooling %.4f, non-parametric %.4f, parametric %.4f\n",
         mse_avg, mse_np, mse_p);
  return TRUE;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context =
      g_option_context_new("- Nadaraya-Watson attention pooling (d2l 10.2)");
  g_option_context_add_main_entries(context, entries, NULL);
  if (!g_option_context_parse(context, &argc, &argv, &error)) {
    g_printerr("%s\n", error->message);
    return 2;
  }
  if (!run(&error)) {
    g_printerr("nw_regression: %s\n", error->message);
    return 1;
  }
  return 0;
}
