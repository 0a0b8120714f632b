/* test-ops-loss.c: "cross_entropy", "cross_entropy_backward" and "mse". */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef struct {
  QkvReduction reduction;
  gboolean weighted; /* inputs[2] is the weight */
  double label_smoothing;
} LossSpec;

/* A loss with an ignore_index other than the default -100. */
typedef struct {
  LossSpec loss;
  gint ignore_index;
} IgnoreSpec;

static GHashTable *reference; /* tests/data/loss_ref.txt */

static QkvValue *
build_ce(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const LossSpec *s = user_data;
  if (s->label_smoothing != 0.0)
    return qkv_cross_entropy_smoothed(in[0], in[1], s->weighted ? in[2] : NULL, s->reduction,
                                      s->label_smoothing, error);
  return qkv_cross_entropy(in[0], in[1], s->weighted ? in[2] : NULL, s->reduction, error);
}

/* cross_entropy with an ignore_index, by name, as a caller without a typed
 * function would add it */
static QkvValue *
build_ce_ignoring(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const IgnoreSpec *spec = user_data;
  const LossSpec *s = &spec->loss;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "reduction",
                        g_variant_new_string(s->reduction == QKV_REDUCTION_NONE  ? "none"
                                             : s->reduction == QKV_REDUCTION_SUM ? "sum"
                                                                                 : "mean"));
  g_variant_builder_add(&attrs, "{sv}", "label_smoothing",
                        g_variant_new_double(s->label_smoothing));
  g_variant_builder_add(&attrs, "{sv}", "ignore_index", g_variant_new_int32(spec->ignore_index));
  QkvValue *inputs[] = {in[0], in[1], s->weighted ? in[2] : NULL};
  return qkv_graph_op(graph, "cross_entropy", inputs, s->weighted ? 3 : 2,
                      g_variant_builder_end(&attrs), error);
}

/* The same through the typed function. */
static QkvValue *
build_ce_ignore_typed(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const IgnoreSpec *spec = user_data;
  const LossSpec *s = &spec->loss;
  return qkv_cross_entropy_ignore(in[0], in[1], s->weighted ? in[2] : NULL, s->reduction,
                                  s->label_smoothing, spec->ignore_index, error);
}

/* inputs: dloss, logits, targets, [weight] */
static QkvValue *
build_ce_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const LossSpec *s = user_data;
  return qkv_cross_entropy_backward(in[0], in[1], in[2], s->weighted ? in[3] : NULL, s->reduction,
                                    error);
}

static QkvValue *
build_mse(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const LossSpec *s = user_data;
  return qkv_mse(in[0], in[1], s->reduction, error);
}

static const QkvReduction reductions[] = {QKV_REDUCTION_NONE, QKV_REDUCTION_SUM,
                                          QKV_REDUCTION_MEAN};

/* ---- cross_entropy forward --------------------------------------------- */

/* logits rows [1 2 3] and [1 1 1], targets 2 and 0:
 * loss0 = −log softmax([1 2 3])[2] = 0.40760596, loss1 = log 3 = 1.09861229. */
static void
test_ce_forward(void)
{
  QkvShape sl = QKV_SHAPE(2, 3), st = QKV_SHAPE(2);
  float logits[] = {1, 2, 3, 1, 1, 1}, weight[] = {1, 0.5f};
  gint32 targets[] = {2, 0};
  g_autoptr(QkvTensor) tl = qkv_tensor_new_f32(&sl, logits);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&st, targets);
  g_autoptr(QkvTensor) tw = qkv_tensor_new_f32(&st, weight);
  QkvTensor *in[] = {tl, tt, tw};

  const struct {
    LossSpec spec;
    gint rank;
    float want[2];
    gsize n;
  } cases[] = {
      {{QKV_REDUCTION_NONE, FALSE, 0}, 1, {0.40760596f, 1.09861229f}, 2},
      {{QKV_REDUCTION_SUM, FALSE, 0}, 0, {1.50621825f}, 1},
      {{QKV_REDUCTION_MEAN, FALSE, 0}, 0, {0.75310913f}, 1},
      {{QKV_REDUCTION_NONE, TRUE, 0}, 1, {0.40760596f, 0.54930614f}, 2},
      {{QKV_REDUCTION_SUM, TRUE, 0}, 0, {0.95691210f}, 1},
      /* weighted mean divides by the number of tokens (2), not Σ weight */
      {{QKV_REDUCTION_MEAN, TRUE, 0}, 0, {0.47845605f}, 1},
  };
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    g_autoptr(QkvTensor) y =
        qkv_test_eval(cases[c].spec.weighted ? 3 : 2, in, build_ce, (gpointer)&cases[c].spec);
    g_assert_cmpint(qkv_tensor_rank(y), ==, cases[c].rank);
    qkv_assert_values(y, cases[c].want, cases[c].n, 1e-6);
  }
}

/* Large logits do not overflow, and an ignored target (ignore_index, -100
 * by default) adds nothing and is left out of the mean. */
static void
test_ce_edge(void)
{
  QkvShape sl = QKV_SHAPE(3, 3), st = QKV_SHAPE(3);
  float logits[] = {1001, 1002, 1003, 5, 6, 7, 1, 1, 1};
  gint32 targets[] = {2, -100, -100};
  g_autoptr(QkvTensor) tl = qkv_tensor_new_f32(&sl, logits);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&st, targets);
  QkvTensor *in[] = {tl, tt};
  LossSpec none = {QKV_REDUCTION_NONE, FALSE, 0}, mean = {QKV_REDUCTION_MEAN, FALSE, 0};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_ce, &none);
  float want[] = {0.40760596f, 0, 0};
  qkv_assert_values(y, want, 3, 1e-5);
  g_autoptr(QkvTensor) ym = qkv_test_eval(2, in, build_ce, &mean);
  float want_mean = 0.40760596f;
  qkv_assert_values(ym, &want_mean, 1, 1e-6);
  /* with every target ignored the mean is 0 (PyTorch's is NaN) */
  gint32 none_counted[] = {-100, -100, -100};
  g_autoptr(QkvTensor) tn = qkv_tensor_new_i32(&st, none_counted);
  QkvTensor *inn[] = {tl, tn};
  g_autoptr(QkvTensor) yz = qkv_test_eval(2, inn, build_ce, &mean);
  float zero = 0;
  qkv_assert_values(yz, &zero, 1, 0);

  /* A single token: logits rank 1, targets rank 0. */
  QkvShape s3 = QKV_SHAPE(3), s0 = qkv_shape_scalar();
  gint32 t1 = 1;
  g_autoptr(QkvTensor) tl1 = qkv_tensor_new_f32(&s3, logits + 6);
  g_autoptr(QkvTensor) tt1 = qkv_tensor_new_i32(&s0, &t1);
  QkvTensor *in1[] = {tl1, tt1};
  g_autoptr(QkvTensor) y1 = qkv_test_eval(2, in1, build_ce, &none);
  g_assert_cmpint(qkv_tensor_rank(y1), ==, 0);
  float want1 = 1.09861229f;
  qkv_assert_values(y1, &want1, 1, 1e-6);
}

/* Many tokens (the parallel path with per-thread scratch rows) against a
 * reference in double. */
static void
test_ce_large(void)
{
  const gint64 n = 200, c = 301;
  QkvShape sl = QKV_SHAPE(4, n / 4, c), st = QKV_SHAPE(4, n / 4);
  g_autoptr(QkvTensor) logits = qkv_test_uniform(&sl, 1, -8, 8);
  g_autoptr(QkvTensor) targets = qkv_test_randint(&st, 2, -3, (gint32)c + 3);
  g_autoptr(QkvTensor) weight = qkv_test_uniform(&st, 3, 0, 2);
  /* about one in fifty ignored */
  gint64 counted = 0;
  for (gint64 i = 0; i < n; i++) {
    gint32 *t = &qkv_tensor_i32(targets)[i];
    *t = *t >= 0 && *t < c ? *t : -100;
    counted += *t != -100;
  }
  QkvTensor *in[] = {logits, targets, weight};

  g_autoptr(QkvTensor) want_none = qkv_tensor_new(QKV_F32, &st);
  g_autoptr(QkvTensor) magnitude = qkv_tensor_new(QKV_F32, &st);
  double total = 0, total_magnitude = 0;
  for (gint64 i = 0; i < n; i++) {
    const float *x = qkv_tensor_f32(logits) + i * c;
    gint32 t = qkv_tensor_i32(targets)[i];
    double loss = 0;
    if (t >= 0 && t < c) {
      double m = -INFINITY, s = 0;
      for (gint64 j = 0; j < c; j++)
        m = fmax(m, x[j]);
      for (gint64 j = 0; j < c; j++)
        s += exp(x[j] - m);
      loss = (log(s) + m - x[t]) * qkv_tensor_f32(weight)[i];
      qkv_tensor_f32(magnitude)[i] =
          (float)(qkv_tensor_f32(weight)[i] * (1 + fabs(log(s)) + fabs(m) + fabs(x[t])));
    }
    qkv_tensor_f32(want_none)[i] = (float)loss;
    total += loss;
    total_magnitude += qkv_tensor_f32(magnitude)[i];
  }
  /* One float32 computation against the exact loss: the sum of c positive
   * exp terms is within S(c) u (relative, qkv_test_sum_factor) and each exp
   * within 2 u, so log s is within (S(c) + 2) u absolute; log, the additions
   * of m and x_t, the weight and the rounding of want add a rounding each of
   * their operands' sizes: (S(c) + 6) u times w · (1 + |log s| + |m| + |x_t|). */
  double factor = qkv_test_sum_factor((double)c) + 6;
  /* Sum and mean add up the n losses: S(n) u times their magnitudes more. */
  double sum_bound =
      QKV_TEST_U * (factor * total_magnitude + qkv_test_sum_factor((double)n) * total_magnitude);
  LossSpec none = {QKV_REDUCTION_NONE, TRUE, 0}, sum = {QKV_REDUCTION_SUM, TRUE, 0},
           mean = {QKV_REDUCTION_MEAN, TRUE, 0};
  g_autoptr(QkvTensor) y = qkv_test_eval(3, in, build_ce, &none);
  qkv_assert_bounded("cross_entropy vs double", y, want_none, magnitude, factor);
  g_autoptr(QkvTensor) ys = qkv_test_eval(3, in, build_ce, &sum);
  g_assert_cmpfloat(fabs(qkv_tensor_get(ys, 0) - total), <=, sum_bound);
  g_autoptr(QkvTensor) ym = qkv_test_eval(3, in, build_ce, &mean);
  g_assert_cmpfloat(fabs(qkv_tensor_get(ym, 0) - total / counted), <=,
                    sum_bound / counted + QKV_TEST_U * fabs(total / counted));
}

/* ---- cross_entropy_backward ------------------------------------------- */

static void
test_ce_backward_forward(void)
{
  QkvShape sl = QKV_SHAPE(2, 3), st = QKV_SHAPE(2), s0 = qkv_shape_scalar();
  float logits[] = {1, 2, 3, 1, 1, 1}, one = 1, weight[] = {1, 0.5f}, dl[] = {2, -1};
  gint32 targets[] = {2, 0};
  g_autoptr(QkvTensor) tl = qkv_tensor_new_f32(&sl, logits);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&st, targets);
  g_autoptr(QkvTensor) tw = qkv_tensor_new_f32(&st, weight);
  g_autoptr(QkvTensor) td = qkv_tensor_new_f32(&s0, &one);
  g_autoptr(QkvTensor) tdn = qkv_tensor_new_f32(&st, dl);

  /* mean: (softmax − onehot) / 2 */
  QkvTensor *in[] = {td, tl, tt, tw};
  LossSpec mean = {QKV_REDUCTION_MEAN, FALSE, 0};
  g_autoptr(QkvTensor) dx = qkv_test_eval(3, in, build_ce_backward, &mean);
  float want[] = {0.04501529f, 0.12236424f, -0.16737952f, -0.33333333f, 0.16666667f, 0.16666667f};
  qkv_assert_values(dx, want, 6, 1e-6);

  /* none, weighted: row i scaled by dloss[i] · weight[i] = 2 and −0.5 */
  QkvTensor *inn[] = {tdn, tl, tt, tw};
  LossSpec none_w = {QKV_REDUCTION_NONE, TRUE, 0};
  g_autoptr(QkvTensor) dxn = qkv_test_eval(4, inn, build_ce_backward, &none_w);
  float want_n[] = {0.18006114f, 0.48945694f,  -0.66951808f,
                    0.33333333f, -0.16666667f, -0.16666667f};
  qkv_assert_values(dxn, want_n, 6, 1e-6);
}

/* ---- label smoothing against PyTorch ------------------------------------ */

/* F.cross_entropy(label_smoothing=ε) for ε = 0, 0.1, 0.25 and 1 (the uniform
 * target alone), every reduction and the per-token weight, value and
 * gradient (tests/reference/loss_ref.py). */
static void
test_ce_smoothing_reference(void)
{
  static const double eps[] = {0.0, 0.1, 0.25, 1.0};
  QkvTensor *logits = qkv_test_ref(reference, "logits");
  QkvTensor *targets = qkv_test_ref(reference, "targets");
  QkvTensor *valid = qkv_test_ref(reference, "valid");
  QkvTensor *weight = qkv_test_ref(reference, "weight");
  float one = 1;
  QkvShape s0 = qkv_shape_scalar();
  g_autoptr(QkvTensor) unit = qkv_tensor_new_f32(&s0, &one);
  const struct {
    const gchar *name;
    QkvTensor *targets;
    QkvReduction reduction;
    gboolean weighted;
    const QkvTensor *loss_weights;
  } cases[] = {
      {"none", targets, QKV_REDUCTION_NONE, FALSE, qkv_test_ref(reference, "w")},
      {"sum", targets, QKV_REDUCTION_SUM, FALSE, unit},
      {"mean", valid, QKV_REDUCTION_MEAN, FALSE, unit},
      {"wsum", targets, QKV_REDUCTION_SUM, TRUE, unit},
  };
  for (guint k = 0; k < G_N_ELEMENTS(eps); k++) {
    for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
      LossSpec spec = {cases[c].reduction, cases[c].weighted, eps[k]};
      QkvTensor *in[] = {logits, cases[c].targets, weight};
      QkvTensor *grads[3] = {NULL};
      g_autoptr(QkvTensor) y = qkv_test_run_with_grads(cases[c].weighted ? 3 : 2, in, build_ce,
                                                       &spec, cases[c].loss_weights, grads);
      g_autoptr(QkvTensor) dlogits = grads[0];
      for (guint i = 1; i < 3; i++)
        g_clear_pointer(&grads[i], qkv_tensor_free);
      g_autofree gchar *value_name = g_strdup_printf("eps%u_%s", k, cases[c].name);
      g_autofree gchar *grad_name = g_strdup_printf("eps%u_%s_grad", k, cases[c].name);
      g_autofree gchar *label = g_strdup_printf("cross_entropy eps %g %s", eps[k], cases[c].name);
      /* The bound is 1e-5 of the tensor's scale, 168 u. What the
       * arithmetic allows: a token's loss and each gradient element come
       * from a softmax over C = 11 logits in [-3, 3], within (S(11) + 6) u =
       * 17 u of the row's magnitude 1 + |lse| + |max| + |x_t| (test_ce_large),
       * at most 1 + 5.4 + 3 + 3 ≈ 12.4, against losses of typical size 2.4
       * and more; the sums over 15 tokens add S(15) = 15 u of their
       * magnitudes. (17 · 12.4 / 2.4 + 15) u ≈ 103 u < 168 u: PyTorch and
       * qkv, two such computations, stay within 1e-5 of the scale. */
      const double factor = 1e-5 / QKV_TEST_U;
      qkv_assert_scaled(label, y, qkv_test_ref(reference, value_name), factor);
      qkv_assert_scaled(label, dlogits, qkv_test_ref(reference, grad_name), factor);
    }
  }
}

/* ---- targets out of range and ignore_index ------------------------------ */

/* Evaluate cross_entropy(logits (rows, c), targets) and expect the run to
 * fail naming the node, the row and the value. */
static void
assert_ce_run_fails(gint64 rows, gint64 c, const gint32 *targets, QkvCheckBuildFunc build,
                    gconstpointer spec, const gchar *want)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape sl = QKV_SHAPE(rows, c), st = QKV_SHAPE(rows);
  QkvValue *in[] = {qkv_test_input(g, "logits", QKV_F32, sl),
                    qkv_test_input(g, "targets", QKV_I32, st)};
  g_autoptr(GError) error = NULL;
  QkvValue *loss = build(g, in, (gpointer)spec, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) tl = qkv_test_uniform(&sl, 5, -1, 1);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&st, targets);
  const gchar *names[] = {"logits", "targets"};
  QkvTensor *tensors[] = {tl, tt};
  QkvTensor *result = NULL;
  g_assert_false(qkv_graph_eval(g, names, tensors, 2, &loss, &result, 1, &error));
  g_assert_null(result);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INDEX);
  g_autofree gchar *full = g_strdup_printf("run: node '%s' (cross_entropy): %s",
                                           qkv_node_name(qkv_value_node(loss)), want);
  if (strstr(error->message, full) == NULL)
    g_error("message '%s' does not say '%s'", error->message, full);
  g_test_message("%s", error->message);
}

/* A target outside [0, C) that is not ignore_index fails the run (it used
 * to add 0 and still count in the mean: 0.80 for the case below). */
static void
test_ce_out_of_range_fails(void)
{
  const gint32 targets[] = {0, 1, 2, 7, 4, 9};
  LossSpec mean = {QKV_REDUCTION_MEAN, FALSE, 0}, none = {QKV_REDUCTION_NONE, FALSE, 0.1};
  assert_ce_run_fails(6, 5, targets, build_ce, &mean, "target 7 at row 3 is outside [0, 5)");
  assert_ce_run_fails(6, 5, targets, build_ce, &none, "target 7 at row 3 is outside [0, 5)");
  const gint32 negative[] = {-100, 1, -1, 3};
  assert_ce_run_fails(4, 5, negative, build_ce, &mean, "target -1 at row 2 is outside [0, 5)");
  /* with another ignore_index, -100 is just out of range */
  IgnoreSpec ignore2 = {{QKV_REDUCTION_SUM, FALSE, 0}, 2};
  assert_ce_run_fails(4, 5, negative, build_ce_ignoring, &ignore2,
                      "target -100 at row 0 is outside [0, 5)");
}

/* The backward op checks its targets too (when it runs without the forward). */
static void
test_ce_backward_out_of_range_fails(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape sl = QKV_SHAPE(3, 4), st = QKV_SHAPE(3), s0 = qkv_shape_scalar();
  QkvValue *dloss = qkv_test_input(g, "dloss", QKV_F32, s0);
  QkvValue *logits = qkv_test_input(g, "logits", QKV_F32, sl);
  QkvValue *targets = qkv_test_input(g, "targets", QKV_I32, st);
  g_autoptr(GError) error = NULL;
  QkvValue *dx =
      qkv_cross_entropy_backward(dloss, logits, targets, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  float one = 1;
  const gint32 tv[] = {1, 4, 0};
  g_autoptr(QkvTensor) td = qkv_tensor_new_f32(&s0, &one);
  g_autoptr(QkvTensor) tl = qkv_test_uniform(&sl, 6, -1, 1);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&st, tv);
  const gchar *names[] = {"dloss", "logits", "targets"};
  QkvTensor *tensors[] = {td, tl, tt};
  QkvTensor *result = NULL;
  g_assert_false(qkv_graph_eval(g, names, tensors, 3, &dx, &result, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INDEX);
  g_assert_nonnull(strstr(error->message, "(cross_entropy_backward): target 4 at row 1"));
}

/* ignore_index against PyTorch: the mean over the targets not ignored (the
 * default -100, and a class that occurs), and the per-token weight with
 * every reduction, value and gradients for the logits and the weight
 * (tests/reference/loss_ref.py). */
static void
test_ce_ignore_reference(void)
{
  static const double eps[] = {0.0, 0.1, 0.25, 1.0};
  QkvTensor *logits = qkv_test_ref(reference, "logits");
  QkvTensor *targets = qkv_test_ref(reference, "targets");
  QkvTensor *valid = qkv_test_ref(reference, "valid");
  QkvTensor *weight = qkv_test_ref(reference, "weight");
  gint ignore_class = qkv_tensor_i32(qkv_test_ref(reference, "ignore_class"))[0];
  float one = 1;
  QkvShape s0 = qkv_shape_scalar();
  g_autoptr(QkvTensor) unit = qkv_tensor_new_f32(&s0, &one);
  const struct {
    const gchar *name;
    QkvTensor *targets;
    QkvReduction reduction;
    gboolean weighted;
    QkvCheckBuildFunc build;
    const QkvTensor *loss_weights;
  } cases[] = {
      {"imean", targets, QKV_REDUCTION_MEAN, FALSE, build_ce, unit},
      {"cmean", valid, QKV_REDUCTION_MEAN, FALSE, build_ce_ignoring, unit},
      {"cmean", valid, QKV_REDUCTION_MEAN, FALSE, build_ce_ignore_typed, unit},
      {"wnone", targets, QKV_REDUCTION_NONE, TRUE, build_ce, qkv_test_ref(reference, "w")},
      {"wsum", targets, QKV_REDUCTION_SUM, TRUE, build_ce, unit},
      {"wmean", targets, QKV_REDUCTION_MEAN, TRUE, build_ce, unit},
  };
  for (guint k = 0; k < G_N_ELEMENTS(eps); k++) {
    for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
      IgnoreSpec spec = {{cases[c].reduction, cases[c].weighted, eps[k]}, ignore_class};
      QkvTensor *in[] = {logits, cases[c].targets, weight};
      QkvTensor *grads[3] = {NULL};
      /* build_ce reads the LossSpec at the head of spec */
      g_autoptr(QkvTensor) y = qkv_test_run_with_grads(
          cases[c].weighted ? 3 : 2, in, cases[c].build, &spec, cases[c].loss_weights, grads);
      g_autoptr(QkvTensor) dlogits = grads[0];
      g_autoptr(QkvTensor) dweight = grads[2];
      g_assert_null(grads[1]);
      g_autofree gchar *prefix = g_strdup_printf("eps%u_%s", k, cases[c].name);
      g_autofree gchar *grad_name = g_strdup_printf("%s_grad", prefix);
      g_autofree gchar *label = g_strdup_printf("cross_entropy eps %g %s", eps[k], cases[c].name);
      /* the bound of test_ce_smoothing_reference; the weight's gradient is a
       * token's loss times dloss (over the tokens counted, for "mean"), one
       * such computation more */
      const double factor = 1e-5 / QKV_TEST_U;
      qkv_assert_scaled(label, y, qkv_test_ref(reference, prefix), factor);
      qkv_assert_scaled(label, dlogits, qkv_test_ref(reference, grad_name), factor);
      if (cases[c].weighted) {
        g_autofree gchar *wgrad_name = g_strdup_printf("%s_wgrad", prefix);
        g_autofree gchar *wlabel = g_strdup_printf("%s d/dweight", label);
        qkv_assert_scaled(wlabel, dweight, qkv_test_ref(reference, wgrad_name), factor);
      }
    }
  }
}

/* ---- gradients ---------------------------------------------------------- */

static void
test_ce_grad(void)
{
  const struct {
    QkvShape logits, targets;
  } shapes[] = {
      {QKV_SHAPE(4, 5), QKV_SHAPE(4)},
      {QKV_SHAPE(2, 3, 7), QKV_SHAPE(2, 3)},
      {QKV_SHAPE(6), qkv_shape_scalar()},
  };
  for (guint s = 0; s < G_N_ELEMENTS(shapes); s++) {
    gint64 c = shapes[s].logits.dims[shapes[s].logits.rank - 1];
    g_autoptr(QkvTensor) logits = qkv_test_uniform(&shapes[s].logits, 10 + s, -2, 2);
    /* one target in ten ignored, on average */
    g_autoptr(QkvTensor) targets = qkv_test_randint(&shapes[s].targets, 20 + s, 0, (gint32)c + 1);
    for (gint64 i = 0; i < qkv_tensor_numel(targets); i++)
      if (qkv_tensor_i32(targets)[i] == c)
        qkv_tensor_i32(targets)[i] = -100;
    g_autoptr(QkvTensor) weight = qkv_test_uniform(&shapes[s].targets, 30 + s, 0, 2);
    QkvTensor *in[] = {logits, targets, weight};
    for (guint r = 0; r < G_N_ELEMENTS(reductions); r++) {
      for (gint weighted = 0; weighted < 2; weighted++) {
        for (gint smoothed = 0; smoothed < 2; smoothed++) {
          LossSpec spec = {reductions[r], weighted, smoothed ? 0.1 : 0.0};
          g_autofree gchar *label =
              g_strdup_printf("cross_entropy shape %u reduction %d weighted %d eps %g", s, r,
                              weighted, spec.label_smoothing);
          /* the logits and the per-token weight */
          qkv_test_gradcheck(label, weighted ? 3 : 2, in, NULL, build_ce, &spec);
        }
      }
    }
  }
}

static void
test_mse(void)
{
  QkvShape s = QKV_SHAPE(3);
  float pred[] = {1, 2, 3}, target[] = {0, 2, 5};
  g_autoptr(QkvTensor) tp = qkv_tensor_new_f32(&s, pred);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_f32(&s, target);
  QkvTensor *in[] = {tp, tt};
  LossSpec none = {QKV_REDUCTION_NONE, FALSE, 0}, sum = {QKV_REDUCTION_SUM, FALSE, 0},
           mean = {QKV_REDUCTION_MEAN, FALSE, 0};
  g_autoptr(QkvTensor) yn = qkv_test_eval(2, in, build_mse, &none);
  float want_n[] = {1, 0, 4};
  qkv_assert_values(yn, want_n, 3, 1e-6);
  g_autoptr(QkvTensor) ys = qkv_test_eval(2, in, build_mse, &sum);
  float want_s = 5;
  g_assert_cmpint(qkv_tensor_rank(ys), ==, 0);
  qkv_assert_values(ys, &want_s, 1, 1e-6);
  g_autoptr(QkvTensor) ym = qkv_test_eval(2, in, build_mse, &mean);
  float want_m = 5.0f / 3;
  qkv_assert_values(ym, &want_m, 1, 1e-6);

  QkvShape shapes[] = {QKV_SHAPE(7), QKV_SHAPE(3, 5), QKV_SHAPE(2, 3, 4)};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    g_autoptr(QkvTensor) p = qkv_test_uniform(&shapes[i], 40 + i, -2, 2);
    g_autoptr(QkvTensor) t = qkv_test_uniform(&shapes[i], 50 + i, -2, 2);
    QkvTensor *gin[] = {p, t};
    for (guint r = 0; r < G_N_ELEMENTS(reductions); r++) {
      LossSpec spec = {reductions[r], FALSE, 0};
      g_autofree gchar *label = g_strdup_printf("mse shape %u reduction %d", i, r);
      qkv_test_gradcheck(label, 2, gin, NULL, build_mse, &spec);
    }
    gboolean only_target[] = {FALSE, TRUE};
    qkv_test_gradcheck("mse target only", 2, gin, only_target, build_mse, &none);
  }
}

/* ---- bad input -------------------------------------------------------- */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *logits = qkv_test_input(g, "logits", QKV_F32, QKV_SHAPE(4, 5));
  QkvValue *ilogits = qkv_test_input(g, "ilogits", QKV_I32, QKV_SHAPE(4, 5));
  QkvValue *targets = qkv_test_input(g, "targets", QKV_I32, QKV_SHAPE(4));
  QkvValue *ftargets = qkv_test_input(g, "ftargets", QKV_F32, QKV_SHAPE(4));
  QkvValue *targets3 = qkv_test_input(g, "targets3", QKV_I32, QKV_SHAPE(3));
  QkvValue *weight3 = qkv_test_input(g, "weight3", QKV_F32, QKV_SHAPE(3));
  QkvValue *iweight = qkv_test_input(g, "iweight", QKV_I32, QKV_SHAPE(4));
  QkvValue *dl4 = qkv_test_input(g, "dl4", QKV_F32, QKV_SHAPE(4));
  QkvValue *pred = qkv_test_input(g, "pred", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *pred_t = qkv_test_input(g, "pred_t", QKV_F32, QKV_SHAPE(3, 2));

  const QkvReduction mean = QKV_REDUCTION_MEAN;
  qkv_assert_op_fails(g, "'cross_entropy'", QKV_ERROR_DTYPE,
                      qkv_cross_entropy(ilogits, targets, NULL, mean, &error_));
  qkv_assert_op_fails(g, "'cross_entropy'", QKV_ERROR_DTYPE,
                      qkv_cross_entropy(logits, ftargets, NULL, mean, &error_));
  qkv_assert_op_fails(g, "'cross_entropy'", QKV_ERROR_SHAPE,
                      qkv_cross_entropy(logits, targets3, NULL, mean, &error_));
  qkv_assert_op_fails(g, "'cross_entropy'", QKV_ERROR_SHAPE,
                      qkv_cross_entropy(logits, targets, weight3, mean, &error_));
  qkv_assert_op_fails(g, "'cross_entropy'", QKV_ERROR_DTYPE,
                      qkv_cross_entropy(logits, targets, iweight, mean, &error_));
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "reduction", g_variant_new_string("avg"));
  QkvValue *lt[] = {logits, targets};
  qkv_assert_op_fails(
      g, "'cross_entropy'", QKV_ERROR_ATTRIBUTE,
      qkv_graph_op(g, "cross_entropy", lt, 2, g_variant_builder_end(&attrs), &error_));

  qkv_assert_op_fails(g, "label_smoothing", QKV_ERROR_ATTRIBUTE,
                      qkv_cross_entropy_smoothed(logits, targets, NULL, mean, 1.5, &error_));
  qkv_assert_op_fails(g, "label_smoothing", QKV_ERROR_ATTRIBUTE,
                      qkv_cross_entropy_smoothed(logits, targets, NULL, mean, -0.1, &error_));

  /* backward: dloss of the wrong shape for the reduction */
  qkv_assert_op_fails(g, "cross_entropy_backward", QKV_ERROR_SHAPE,
                      qkv_cross_entropy_backward(dl4, logits, targets, NULL, mean, &error_));
  qkv_assert_op_fails(
      g, "cross_entropy_backward", QKV_ERROR_SHAPE,
      qkv_cross_entropy_backward(weight3, logits, targets, NULL, QKV_REDUCTION_NONE, &error_));

  qkv_assert_op_fails(g, "'mse'", QKV_ERROR_SHAPE, qkv_mse(pred, pred_t, mean, &error_));
  qkv_assert_op_fails(g, "'mse'", QKV_ERROR_DTYPE, qkv_mse(ftargets, targets, mean, &error_));

  /* Without reduction the default is "mean": a scalar. */
  g_autoptr(GError) error = NULL;
  QkvValue *loss = qkv_graph_op(g, "cross_entropy", lt, 2, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpint(qkv_value_shape(loss)->rank, ==, 0);
}

/* Any message logged while a test that installs this runs fails it. */
static void
fail_on_any_message(const gchar *domain, GLogLevelFlags level, const gchar *message,
                    gpointer user_data)
{
  g_error("unexpected message [%s]: %s", domain != NULL ? domain : "", message);
}

/* A reduction outside the enum (a cast from a user's integer, a binding's
 * number) is a GError naming the function and the value, not a critical
 * with NULL and no error. */
static void
test_unknown_reduction(void)
{
  guint handler = g_log_set_handler(
      "qkv", G_LOG_LEVEL_MASK | G_LOG_FLAG_FATAL | G_LOG_FLAG_RECURSION, fail_on_any_message, NULL);
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *logits = qkv_test_input(g, "logits", QKV_F32, QKV_SHAPE(4, 5));
  QkvValue *targets = qkv_test_input(g, "targets", QKV_I32, QKV_SHAPE(4));
  QkvValue *dl4 = qkv_test_input(g, "dl4", QKV_F32, QKV_SHAPE(4));
  QkvValue *pred = qkv_test_input(g, "pred", QKV_F32, QKV_SHAPE(2, 3));
  const QkvReduction bad[] = {(QkvReduction)3, (QkvReduction)-1, (QkvReduction)1000};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    QkvReduction r = bad[i];
    qkv_assert_op_fails(g, "qkv_cross_entropy_ignore", QKV_ERROR_INVALID_ARGUMENT,
                        qkv_cross_entropy(logits, targets, NULL, r, &error_));
    qkv_assert_op_fails(g, "qkv_cross_entropy_backward_ignore", QKV_ERROR_INVALID_ARGUMENT,
                        qkv_cross_entropy_backward(dl4, logits, targets, NULL, r, &error_));
    qkv_assert_op_fails(
        g, "qkv_cross_entropy_weight_backward", QKV_ERROR_INVALID_ARGUMENT,
        qkv_cross_entropy_weight_backward(dl4, logits, targets, r, 0.0, -100, &error_));
    qkv_assert_op_fails(g, "qkv_mse", QKV_ERROR_INVALID_ARGUMENT, qkv_mse(pred, pred, r, &error_));
    GError *error = NULL;
    g_assert_null(qkv_mse(pred, pred, r, &error));
    gchar *value = g_strdup_printf("reduction %d", (gint)r);
    g_assert_nonnull(strstr(error->message, value));
    g_free(value);
    g_clear_error(&error);
  }
  g_log_remove_handler("qkv", handler);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  reference = qkv_test_load_reference("loss_ref.txt");
  g_test_add_func("/loss/cross_entropy/forward", test_ce_forward);
  g_test_add_func("/loss/cross_entropy/edge", test_ce_edge);
  g_test_add_func("/loss/cross_entropy/large", test_ce_large);
  g_test_add_func("/loss/cross_entropy/backward-op", test_ce_backward_forward);
  g_test_add_func("/loss/cross_entropy/grad", test_ce_grad);
  g_test_add_func("/loss/cross_entropy/smoothing-reference", test_ce_smoothing_reference);
  g_test_add_func("/loss/cross_entropy/out-of-range-fails", test_ce_out_of_range_fails);
  g_test_add_func("/loss/cross_entropy/backward-out-of-range-fails",
                  test_ce_backward_out_of_range_fails);
  g_test_add_func("/loss/cross_entropy/ignore-reference", test_ce_ignore_reference);
  g_test_add_func("/loss/mse", test_mse);
  g_test_add_func("/loss/bad-input", test_bad_input);
  g_test_add_func("/loss/unknown-reduction", test_unknown_reduction);
  int status = g_test_run();
  g_hash_table_unref(reference);
  return status;
}
