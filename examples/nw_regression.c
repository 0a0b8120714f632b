/* nw_regression: Nadaraya-Watson attention pooling, as Dive into Deep
 * Learning (0.17, section 10.2) sets it up.
 *
 * 50 training points x = sorted 5·U(0,1), y = 2 sin(x) + x^0.8 + N(0, 0.5²);
 * during training each point attends to the other 49. The parametric model
 * learns one kernel width w with SGD (lr 0.5, full batch, 5 epochs) on the
 * sum of squared errors. Test points x = 0, 0.1, …, 4.9 are scored against the
 * noiseless function for average pooling, the non-parametric model (w = 1)
 * and the parametric one. */
#include <cairo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <qkv/qkv.h>

#include "common/options.h"
#include "common/program-version.h"

#define N_TRAIN 50
#define N_TEST 50

static gint64 opt_seed = 0;
static gint opt_epochs = 5;
static double opt_lr = 0.5;
static gchar *opt_plot = NULL;
static gboolean opt_version = FALSE;

static GOptionEntry entries[] = {
    {"seed", 's', 0, G_OPTION_ARG_INT64, &opt_seed, "Random seed for data and w (default 0)", "N"},
    {"epochs", 'e', 0, G_OPTION_ARG_INT, &opt_epochs, "Training epochs (default 5)", "N"},
    {"lr", 0, 0, G_OPTION_ARG_DOUBLE, &opt_lr, "SGD learning rate (default 0.5)", "LR"},
    {"plot", 'p', 0, G_OPTION_ARG_FILENAME, &opt_plot,
     "Draw the fit and the attention-weight matrix of the parametric model to FILE.png", "FILE"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
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

/* Left: training points, the true function, both models' predictions.
 * Right: the parametric model's attention weights, test queries × training keys. */
static gboolean
plot(const gchar *path, const float *x_train, const float *y_train, const float *x_test,
     const float *pred_np, const float *pred_p, const float *weights, GError **error)
{
  const int panel = 420, pad = 50, width = 2 * panel + 3 * pad, height = panel + 2 * pad;
  cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t *cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);

  /* the fit: x in [0, 5], y in [-1, 5] */
  double x0 = pad, y0 = pad;
#define PX(x) (x0 + (x) / 5.0 * panel)
#define PY(y) (y0 + panel - ((y) + 1.0) / 6.0 * panel)
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x0, y0, panel, panel);
  cairo_stroke(cr);
  cairo_move_to(cr, x0, y0 - 12);
  cairo_show_text(cr, "fit: truth (black), w = 1 (blue), learned w (red), data (green)");
  const float *curves[] = {NULL, pred_np, pred_p};
  const double colours[][3] = {{0, 0, 0}, {0.1, 0.3, 0.9}, {0.85, 0.1, 0.1}};
  for (int c = 0; c < 3; c++) {
    cairo_set_source_rgb(cr, colours[c][0], colours[c][1], colours[c][2]);
    cairo_set_line_width(cr, c == 0 ? 1.5 : 2);
    for (int i = 0; i < N_TEST; i++) {
      double y = c == 0 ? truth(x_test[i]) : curves[c][i];
      if (i == 0)
        cairo_move_to(cr, PX(x_test[i]), PY(y));
      else
        cairo_line_to(cr, PX(x_test[i]), PY(y));
    }
    cairo_stroke(cr);
  }
  cairo_set_source_rgb(cr, 0.2, 0.6, 0.2);
  for (int i = 0; i < N_TRAIN; i++) {
    cairo_arc(cr, PX(x_train[i]), PY(y_train[i]), 3, 0, 2 * G_PI);
    cairo_fill(cr);
  }
#undef PX
#undef PY

  /* the attention weights: rows are test queries, columns training keys */
  x0 = 2 * pad + panel;
  double cell_w = (double)panel / N_TRAIN, cell_h = (double)panel / N_TEST;
  float top = 0;
  for (int i = 0; i < N_TEST * N_TRAIN; i++)
    top = MAX(top, weights[i]);
  for (int r = 0; r < N_TEST; r++)
    for (int c = 0; c < N_TRAIN; c++) {
      double v = top > 0 ? weights[r * N_TRAIN + c] / top : 0;
      cairo_set_source_rgb(cr, 1.0 - 0.45 * v, 1.0 - 0.95 * v, 1.0 - 0.95 * v);
      cairo_rectangle(cr, x0 + c * cell_w, y0 + r * cell_h, cell_w + 0.5, cell_h + 0.5);
      cairo_fill(cr);
    }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, x0, y0, panel, panel);
  cairo_stroke(cr);
  cairo_move_to(cr, x0, y0 - 12);
  cairo_show_text(cr, "attention weights: test x (rows), training x (columns)");
  cairo_move_to(cr, x0, y0 + panel + 20);
  cairo_show_text(cr, "sorted training inputs");

  cairo_destroy(cr);
  cairo_status_t st = cairo_surface_write_to_png(surface, path);
  cairo_surface_destroy(surface);
  if (st != CAIRO_STATUS_SUCCESS) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "writing %s: %s", path,
                cairo_status_to_string(st));
    return FALSE;
  }
  return TRUE;
}

/* The model, straight-line: each call passes a NULL on, so the caller checks
 * once. queries (n) attend to keys x (m) with values y (m), both repeated
 * for every query; with leave_one_out a query leaves out the key equal to
 * itself, so each training point attends to the other 49, as the book
 * trains (the inputs are continuous draws, so no two coincide). */
static QkvValue *
nw_model(QkvGraph *g, QkvParams *params, QkvValue *queries, gint64 n, QkvValue *x, QkvValue *y,
         gboolean leave_one_out, QkvValue **weights, GError **error)
{
  const QkvShape rows = QKV_SHAPE(n, -1);
  QkvValue *keys = qkv_expand(qkv_unsqueeze(x, 0, error), &rows, error);   /* (n, m) */
  QkvValue *values = qkv_expand(qkv_unsqueeze(y, 0, error), &rows, error); /* (n, m) */
  QkvValue *mask = leave_one_out ? qkv_ne(qkv_unsqueeze(queries, 1, error), keys, error) : NULL;
  return qkv_build_nw_regression_masked(g, params, "", queries, keys, values, mask,
                                        (guint64)opt_seed + 1, weights, error);
}

/* Test predictions (and the attention weights) of the model over params. */
static gboolean
predict(QkvParams *params, QkvTensor *x_test, QkvTensor *x_train, QkvTensor *y_train,
        QkvTensor **pred, QkvTensor **weights, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *q = qkv_graph_input(g, "queries", QKV_F32, qkv_tensor_shape(x_test), error);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, qkv_tensor_shape(x_train), error);
  QkvValue *y = qkv_graph_input(g, "y", QKV_F32, qkv_tensor_shape(y_train), error);
  QkvValue *outs[2] = {NULL, NULL};
  outs[0] = nw_model(g, params, q, N_TEST, x, y, FALSE, &outs[1], error);
  const gchar *names[] = {"queries", "x", "y"};
  QkvTensor *inputs[] = {x_test, x_train, y_train}, *results[2];
  if (!qkv_graph_eval(g, names, inputs, 3, outs, results, 2, error))
    return FALSE;
  *pred = results[0];
  *weights = results[1];
  return TRUE;
}

static double
mse_vs_truth(const float *x, const float *pred, gint n)
{
  double mse = 0;
  for (gint i = 0; i < n; i++)
    mse += (pred[i] - truth(x[i])) * (pred[i] - truth(x[i])) / n;
  return mse;
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
  QkvShape n_shape = QKV_SHAPE(N_TRAIN), t_shape = QKV_SHAPE(N_TEST);
  g_autoptr(QkvTensor) x_train_t = qkv_tensor_new_f32(&n_shape, x_train);
  g_autoptr(QkvTensor) y_train_t = qkv_tensor_new_f32(&n_shape, y_train);
  g_autoptr(QkvTensor) x_test_t = qkv_tensor_new_f32(&t_shape, x_test);

  /* training: every point predicted from the others, the summed squared
   * error, its gradient, and plain SGD on the one parameter */
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) train = qkv_graph_new();
  QkvValue *x = qkv_graph_input(train, "x", QKV_F32, &n_shape, error);
  QkvValue *y = qkv_graph_input(train, "y", QKV_F32, &n_shape, error);
  QkvValue *pred = nw_model(train, params, x, N_TRAIN, x, y, TRUE, NULL, error);
  QkvValue *loss = qkv_mse(pred, y, QKV_REDUCTION_SUM, error);
  if (!qkv_graph_backward(train, loss, error))
    return FALSE;
  QkvPlanOptions topts = qkv_plan_options_default();
  topts.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(train, &loss, 1, &topts, error);
  QkvOptimConfig sgd_config = qkv_optim_config_sgd(opt_lr);
  g_autoptr(QkvOptimizer) sgd = qkv_optimizer_new_sgd(params, &sgd_config, error);
  if (plan == NULL || sgd == NULL || !qkv_plan_bind(plan, "x", x_train_t, error) ||
      !qkv_plan_bind(plan, "y", y_train_t, error))
    return FALSE;
  float *w = qkv_tensor_f32(qkv_param_value(qkv_params_lookup(params, "w")));
  printf("w init %.4f\n", w[0]);
  for (int epoch = 0; epoch < opt_epochs; epoch++) {
    if (!qkv_plan_run(plan, error) || !qkv_optimizer_step(sgd, error))
      return FALSE;
    printf("epoch %d, loss %.6f, w %.4f\n", epoch + 1, qkv_plan_output_scalar(plan, 0), w[0]);
  }

  /* test MSE against the noiseless function; the non-parametric model is
   * the same kernel with w = 1 */
  g_autoptr(QkvTensor) pred_p = NULL, weights_p = NULL, pred_np = NULL, weights_np = NULL;
  float learned = w[0];
  if (!predict(params, x_test_t, x_train_t, y_train_t, &pred_p, &weights_p, error))
    return FALSE;
  w[0] = 1.0f;
  if (!predict(params, x_test_t, x_train_t, y_train_t, &pred_np, &weights_np, error))
    return FALSE;
  w[0] = learned;
  double avg = 0, mse_avg = 0;
  for (int i = 0; i < N_TRAIN; i++)
    avg += y_train[i] / N_TRAIN;
  for (int i = 0; i < N_TEST; i++)
    mse_avg += (avg - truth(x_test[i])) * (avg - truth(x_test[i])) / N_TEST;
  printf("learned w %.4f\n", learned);
  printf("test MSE vs truth: average pooling %.4f, non-parametric %.4f, parametric %.4f\n", mse_avg,
         mse_vs_truth(x_test, qkv_tensor_f32(pred_np), N_TEST),
         mse_vs_truth(x_test, qkv_tensor_f32(pred_p), N_TEST));
  if (opt_plot != NULL) {
    if (!plot(opt_plot, x_train, y_train, x_test, qkv_tensor_f32(pred_np), qkv_tensor_f32(pred_p),
              qkv_tensor_f32(weights_p), error))
      return FALSE;
    printf("plot written to %s\n", opt_plot);
  }
  return TRUE;
}

int
main(int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context =
      g_option_context_new("- Nadaraya-Watson attention pooling (d2l 10.2)");
  g_option_context_add_main_entries(context, entries, NULL);
  const OptionRange ranges[] = {
      OPTION_INT("epochs", &opt_epochs, 0, 1000000),
      OPTION_DOUBLE("lr", &opt_lr, 0, 1000),
      OPTION_INT64("seed", &opt_seed, G_MININT64, G_MAXINT64),
  };
  if (!g_option_context_parse(context, &argc, &argv, &error) ||
      !options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-nw-regression: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-nw-regression");
    return 0;
  }
  if (!run(&error)) {
    g_printerr("qkv-nw-regression: %s\n", error->message);
    return 1;
  }
  return 0;
}
