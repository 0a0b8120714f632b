/* test-util.c: small helpers shared by the test suites. */
#include "test-util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

QkvTensor *
qkv_test_uniform(const QkvShape *shape, guint32 seed, float lo, float hi)
{
  QkvTensor *t = qkv_tensor_new(QKV_F32, shape);
  GRand *rand = g_rand_new_with_seed(seed);
  float *d = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    d[i] = (float)g_rand_double_range(rand, lo, hi);
  g_rand_free(rand);
  return t;
}

QkvTensor *
qkv_test_randint(const QkvShape *shape, guint32 seed, gint32 lo, gint32 hi)
{
  QkvTensor *t = qkv_tensor_new(QKV_I32, shape);
  GRand *rand = g_rand_new_with_seed(seed);
  gint32 *d = qkv_tensor_i32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    d[i] = g_rand_int_range(rand, lo, hi);
  g_rand_free(rand);
  return t;
}

void
qkv_test_assert_close(const char *file, int line, const QkvTensor *actual,
                      const QkvTensor *expected, double tol)
{
  g_autofree gchar *sa = qkv_shape_to_string(qkv_tensor_shape(actual));
  g_autofree gchar *se = qkv_shape_to_string(qkv_tensor_shape(expected));
  if (!qkv_shape_equal(qkv_tensor_shape(actual), qkv_tensor_shape(expected)))
    g_error("%s:%d: shapes differ: %s vs %s", file, line, sa, se);
  for (gint64 i = 0; i < qkv_tensor_numel(actual); i++) {
    double a = qkv_tensor_get(actual, i), e = qkv_tensor_get(expected, i);
    double err = fabs(a - e) / fmax(fabs(e), 1e-3);
    if (!(err <= tol))
      g_error("%s:%d: element %" G_GINT64_FORMAT
              " of %s: %.9g vs expected %.9g (rel err %.3g > %.3g)",
              file, line, i, sa, a, e, err, tol);
  }
}

void
qkv_test_assert_values(const char *file, int line, const QkvTensor *actual, const float *expected,
                       gsize n, double tol)
{
  if ((gsize)qkv_tensor_numel(actual) != n)
    g_error("%s:%d: %" G_GINT64_FORMAT " elements, expected %" G_GSIZE_FORMAT, file, line,
            qkv_tensor_numel(actual), n);
  for (gsize i = 0; i < n; i++) {
    double a = qkv_tensor_get(actual, (gint64)i);
    if (!(fabs(a - expected[i]) <= tol))
      g_error("%s:%d: element %" G_GSIZE_FORMAT ": %.9g vs expected %.9g", file, line, i, a,
              (double)expected[i]);
  }
}

void
qkv_test_gradcheck_full(const char *label, guint n_inputs, QkvTensor *const *inputs,
                        const gboolean *check, QkvCheckBuildFunc build, gpointer user_data,
                        const QkvCheckOptions *options)
{
  g_autoptr(GError) error = NULL;
  double max_err = 0;
  gboolean ok =
      qkv_check_gradients(n_inputs, inputs, check, build, user_data, options, &max_err, &error);
  if (!ok)
    g_error("gradient check '%s' failed: %s", label, error ? error->message : "?");
  g_test_message("gradcheck %s: max rel err %.3g", label, max_err);
}

void
qkv_test_gradcheck(const char *label, guint n_inputs, QkvTensor *const *inputs,
                   const gboolean *check, QkvCheckBuildFunc build, gpointer user_data)
{
  QkvCheckOptions options = qkv_check_options_default();
  qkv_test_gradcheck_full(label, n_inputs, inputs, check, build, user_data, &options);
}

QkvTensor *
qkv_test_eval(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build, gpointer user_data)
{
  g_autoptr(GError) error = NULL;
  QkvTensor *out = qkv_check_evaluate(n_inputs, inputs, build, user_data, FALSE, &error);
  g_assert_no_error(error);
  g_assert_nonnull(out);
  return out;
}

void
qkv_test_assert_eval_fails(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                           gpointer user_data, gint code, const gchar *want)
{
  g_autoptr(GError) error = NULL;
  QkvTensor *out = qkv_check_evaluate(n_inputs, inputs, build, user_data, FALSE, &error);
  if (out != NULL)
    g_error("the evaluation succeeded; expected it to fail with '%s'", want);
  g_assert_error(error, QKV_ERROR, code);
  if (strstr(error->message, want) == NULL)
    g_error("message '%s' does not say '%s'", error->message, want);
  g_test_message("%s", error->message);
}

gchar *
qkv_test_data_path(const gchar *file_name)
{
  const gchar *srcdir = g_getenv("G_TEST_SRCDIR");
  return g_build_filename(srcdir ? srcdir : "tests", "data", file_name, NULL);
}

GHashTable *
qkv_test_load_reference(const gchar *file_name)
{
  g_autofree gchar *path = qkv_test_data_path(file_name);
  g_autofree gchar *text = NULL;
  g_autoptr(GError) error = NULL;
  if (!g_file_get_contents(path, &text, NULL, &error))
    g_error("reading reference data: %s", error->message);
  GHashTable *table =
      g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)qkv_tensor_free);
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++) {
    if (lines[i][0] == '#' || lines[i][0] == '\0')
      continue;
    g_auto(GStrv) head = g_strsplit_set(lines[i], " \t", -1);
    if (g_strv_length(head) < 4 || !g_str_equal(head[0], "tensor"))
      g_error("%s:%u: expected 'tensor NAME DTYPE RANK DIMS...'", path, i + 1);
    QkvDType dtype = g_str_equal(head[2], "i32") ? QKV_I32 : QKV_F32;
    gint rank = atoi(head[3]);
    if (rank < 0 || rank > QKV_MAX_RANK || (gint)g_strv_length(head) < 4 + rank)
      g_error("%s:%u: bad rank", path, i + 1);
    gint64 dims[QKV_MAX_RANK];
    for (gint d = 0; d < rank; d++)
      dims[d] = g_ascii_strtoll(head[4 + d], NULL, 10);
    QkvShape shape = qkv_shape_from_array(rank, dims);
    QkvTensor *t = qkv_tensor_new(dtype, &shape);
    gint64 n = qkv_tensor_numel(t);
    const gchar *p = lines[i + 1];
    if (p == NULL)
      g_error("%s:%u: values missing", path, i + 1);
    for (gint64 k = 0; k < n; k++) {
      gchar *end = NULL;
      double v = g_ascii_strtod(p, &end);
      if (end == p)
        g_error("%s:%u: %" G_GINT64_FORMAT " values expected, found %" G_GINT64_FORMAT, path, i + 2,
                n, k);
      if (dtype == QKV_F32)
        qkv_tensor_f32(t)[k] = (float)v;
      else
        qkv_tensor_i32(t)[k] = (gint32)v;
      p = end;
    }
    g_hash_table_insert(table, g_strdup(head[1]), t);
    i++;
  }
  return table;
}

QkvTensor *
qkv_test_ref(GHashTable *ref, const gchar *name)
{
  QkvTensor *t = g_hash_table_lookup(ref, name);
  if (t == NULL)
    g_error("reference tensor '%s' is missing", name);
  return t;
}

QkvValue *
qkv_test_input(QkvGraph *g, const gchar *name, QkvDType dtype, QkvShape shape)
{
  g_autoptr(GError) error = NULL;
  QkvValue *v = qkv_graph_input(g, name, dtype, &shape, &error);
  g_assert_no_error(error);
  return v;
}

/* ---- comparing two float32 computations of the same value ---------------- */

double
qkv_test_gamma(double n)
{
  g_assert(n * QKV_TEST_U < 1);
  return n * QKV_TEST_U / (1 - n * QKV_TEST_U);
}

double
qkv_test_sum_factor(double n)
{
  return fmin(n, 6 * sqrt(n));
}

double
qkv_test_max_abs(const QkvTensor *t)
{
  double m = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    m = fmax(m, fabs(qkv_tensor_get(t, i)));
  return m;
}

QkvTensor *
qkv_test_abs_matmul(const QkvTensor *a, const QkvTensor *b, gboolean trans_a, gboolean trans_b)
{
  const QkvShape *sa = qkv_tensor_shape(a), *sb = qkv_tensor_shape(b);
  g_assert(sa->rank >= 2 && sb->rank >= 2);
  gint64 ar = sa->dims[sa->rank - 2], ac = sa->dims[sa->rank - 1];
  gint64 br = sb->dims[sb->rank - 2], bc = sb->dims[sb->rank - 1];
  gint64 m = trans_a ? ac : ar, k = trans_a ? ar : ac;
  gint64 n = trans_b ? br : bc, kb = trans_b ? bc : br;
  g_assert(k == kb);
  gint64 batch = qkv_tensor_numel(a) / (ar * ac), batch_b = qkv_tensor_numel(b) / (br * bc);
  g_assert(batch_b == batch || batch_b == 1);
  QkvShape so = *sa;
  so.dims[so.rank - 2] = m;
  so.dims[so.rank - 1] = n;
  QkvTensor *out = qkv_tensor_new(QKV_F32, &so);
  const float *pa = qkv_tensor_const_data(a), *pb = qkv_tensor_const_data(b);
  float *po = qkv_tensor_f32(out);
  for (gint64 s = 0; s < batch; s++) {
    const float *x = pa + s * ar * ac, *y = pb + (batch_b == 1 ? 0 : s * br * bc);
    for (gint64 i = 0; i < m; i++)
      for (gint64 j = 0; j < n; j++) {
        double acc = 0;
        for (gint64 l = 0; l < k; l++)
          acc += fabs((double)(trans_a ? x[l * ac + i] : x[i * ac + l])) *
                 fabs((double)(trans_b ? y[j * bc + l] : y[l * bc + j]));
        po[(s * m + i) * n + j] = (float)acc;
      }
  }
  return out;
}

gboolean
qkv_test_check_bound(const QkvTensor *actual, const QkvTensor *expected, const QkvTensor *magnitude,
                     double min_scale, double factor, double *needed, gchar **message)
{
  g_autofree gchar *sa = qkv_shape_to_string(qkv_tensor_shape(actual));
  if (!qkv_shape_equal(qkv_tensor_shape(actual), qkv_tensor_shape(expected)) ||
      (magnitude != NULL &&
       !qkv_shape_equal(qkv_tensor_shape(magnitude), qkv_tensor_shape(expected)))) {
    g_autofree gchar *se = qkv_shape_to_string(qkv_tensor_shape(expected));
    if (message != NULL)
      *message = g_strdup_printf("shapes differ: %s vs expected %s", sa, se);
    return FALSE;
  }
  double scale = magnitude == NULL ? fmax(qkv_test_max_abs(expected), min_scale) : 0, worst = 0;
  gint64 first_bad = -1;
  for (gint64 i = 0; i < qkv_tensor_numel(actual); i++) {
    double a = qkv_tensor_get(actual, i), e = qkv_tensor_get(expected, i);
    double s = magnitude == NULL ? scale : qkv_tensor_get(magnitude, i);
    double d = fabs(a - e);
    /* An exact match needs no scale (also where scale_i is 0). */
    double f = d == 0 ? 0 : d / (QKV_TEST_U * s);
    if (!(f <= factor) && first_bad < 0)
      first_bad = i;
    if (!(f <= worst))
      worst = isnan(f) ? INFINITY : f;
  }
  if (needed != NULL)
    *needed = worst;
  if (first_bad >= 0 && message != NULL) {
    double a = qkv_tensor_get(actual, first_bad), e = qkv_tensor_get(expected, first_bad);
    double s = magnitude == NULL ? scale : qkv_tensor_get(magnitude, first_bad);
    *message = g_strdup_printf("element %" G_GINT64_FORMAT " of %s: %.9g vs expected %.9g: "
                               "|diff| %.3g > %g u * %s %.3g (needs factor %.3g)",
                               first_bad, sa, a, e, fabs(a - e), factor,
                               magnitude == NULL ? "scale" : "magnitude", s, worst);
  }
  return first_bad < 0;
}

double
qkv_test_assert_bound(const char *file, int line, const gchar *label, const QkvTensor *actual,
                      const QkvTensor *expected, const QkvTensor *magnitude, double min_scale,
                      double factor)
{
  g_autofree gchar *message = NULL;
  double needed = 0;
  if (!qkv_test_check_bound(actual, expected, magnitude, min_scale, factor, &needed, &message))
    g_error("%s:%d: %s: %s", file, line, label, message);
  g_test_message("bound %s: factor needed %.3g of %g", label, needed, factor);
  return needed;
}

QkvTensor *
qkv_test_abs(const QkvTensor *t)
{
  QkvTensor *a = qkv_tensor_copy(t);
  float *d = qkv_tensor_f32(a);
  for (gint64 i = 0; i < qkv_tensor_numel(a); i++)
    d[i] = fabsf(d[i]);
  return a;
}

QkvTensor *
qkv_test_perturbed(const QkvTensor *t, gint64 i, double rel)
{
  QkvTensor *p = qkv_tensor_copy(t);
  float *d = qkv_tensor_f32(p);
  d[i] = (float)(d[i] * (1 + rel));
  return p;
}

gint64
qkv_test_typical_index(const QkvTensor *t)
{
  double ss = 0;
  gint64 n = qkv_tensor_numel(t), best = 0;
  for (gint64 i = 0; i < n; i++)
    ss += qkv_tensor_get(t, i) * qkv_tensor_get(t, i);
  double rms = sqrt(ss / (double)MAX(n, 1));
  for (gint64 i = 1; i < n; i++)
    if (fabs(fabs(qkv_tensor_get(t, i)) - rms) < fabs(fabs(qkv_tensor_get(t, best)) - rms))
      best = i;
  return best;
}

/* The output of build and d sum(out · w) / d input for every f32 input. */
QkvTensor *
qkv_test_run_with_grads(guint n, QkvTensor *const *tensors, QkvCheckBuildFunc build,
                        gpointer user_data, const QkvTensor *loss_weights, QkvTensor **grads)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *inputs[16];
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    inputs[i] =
        qkv_test_input(g, name, qkv_tensor_dtype(tensors[i]), *qkv_tensor_shape(tensors[i]));
    if (qkv_tensor_dtype(tensors[i]) == QKV_F32)
      qkv_value_set_requires_grad(inputs[i], TRUE);
  }
  QkvValue *out = build(g, inputs, user_data, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) w = NULL;
  if (loss_weights == NULL)
    w = qkv_test_uniform(qkv_value_shape(out), 99, -1, 1);
  QkvValue *wv = qkv_graph_constant(g, loss_weights ? loss_weights : w, &error);
  QkvValue *loss = qkv_sum(qkv_mul(out, wv, &error), NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvValue *outs[17] = {out};
  guint n_outs = 1;
  gint slot[16];
  for (guint i = 0; i < n; i++) {
    QkvValue *gv = qkv_graph_gradient(g, inputs[i]);
    slot[i] = gv != NULL ? (gint)n_outs : -1;
    if (gv != NULL)
      outs[n_outs++] = gv;
  }
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, NULL, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, tensors[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    if (qkv_tensor_dtype(tensors[i]) != QKV_F32)
      grads[i] = NULL;
    else if (slot[i] >= 0)
      grads[i] = qkv_tensor_copy(qkv_plan_output(plan, (guint)slot[i]));
    else
      grads[i] = qkv_tensor_new(QKV_F32, qkv_tensor_shape(tensors[i]));
  }
  return qkv_tensor_copy(qkv_plan_output(plan, 0));
}

double
qkv_test_param_fd(QkvPlan *plan, QkvParams *params, const gchar *name, gint64 max_elems, double eps,
                  double rel_tol, double abs_floor, double scale)
{
  g_autoptr(GError) error = NULL;
  QkvParam *p = qkv_params_lookup(params, name);
  if (p == NULL)
    g_error("qkv_test_param_fd: no parameter '%s'", name);
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  g_autoptr(QkvTensor) analytic = qkv_tensor_copy(qkv_param_grad(p));
  float *v = qkv_tensor_f32(qkv_param_value(p));
  gint64 n = qkv_tensor_numel(analytic);
  gint64 count = MIN(n, max_elems), stride = n / count;
  double worst = 0;
  for (gint64 k = 0; k < count; k++) {
    gint64 i = k * stride + (stride > 1 ? k % stride : 0);
    float saved = v[i];
    v[i] = saved + (float)eps;
    g_assert_true(qkv_plan_run(plan, &error));
    double up = qkv_plan_output_scalar(plan, 0);
    v[i] = saved - (float)eps;
    g_assert_true(qkv_plan_run(plan, &error));
    double down = qkv_plan_output_scalar(plan, 0);
    v[i] = saved;
    /* the step actually taken, after rounding to f32 */
    double step = (double)(saved + (float)eps) - (double)(saved - (float)eps);
    double numeric = (up - down) / step;
    double got = scale * qkv_tensor_get(analytic, i);
    double err = fabs(got - numeric) / MAX(fabs(numeric), abs_floor);
    worst = MAX(worst, err);
    if (scale == 1.0 && err > rel_tol)
      g_error("%s[%" G_GINT64_FORMAT
              "]: autodiff %.6g, finite differences %.6g (error %.3g > %.3g)",
              name, i, got, numeric, err, rel_tol);
  }
  g_assert_true(qkv_plan_run(plan, &error)); /* the gradients of the restored values */
  g_test_message("%s: largest relative error %.3g over %" G_GINT64_FORMAT " elements", name, worst,
                 count);
  return worst;
}

/* ---- the thread suites' seq2seq model ------------------------------------ */

const QkvTransformerConfig qkv_test_s2s_config = {
    .src_vocab = 13,
    .tgt_vocab = 11,
    .num_hiddens = 16,
    .ffn_hiddens = 24,
    .num_heads = 4,
    .num_layers = 2,
    .dropout = 0.0,
};

const gchar *const qkv_test_s2s_input_names[5] = {"src", "src_valid", "dec_in", "labels",
                                                  "label_valid"};

void
qkv_test_batch_init(QkvTestBatch *b, gint rows, guint32 seed)
{
  const gint S = QKV_TEST_S2S_SRC_LEN, T = QKV_TEST_S2S_TGT_LEN;
  QkvShape bs = QKV_SHAPE(rows, S), bt = QKV_SHAPE(rows, T), r = QKV_SHAPE(rows);
  b->src = qkv_test_randint(&bs, seed, 3, (gint32)qkv_test_s2s_config.src_vocab);
  b->src_valid = qkv_test_randint(&r, seed + 1, 1, S + 1);
  b->dec_in = qkv_test_randint(&bt, seed + 2, 3, (gint32)qkv_test_s2s_config.tgt_vocab);
  b->labels = qkv_test_randint(&bt, seed + 3, 3, (gint32)qkv_test_s2s_config.tgt_vocab);
  b->label_valid = qkv_test_randint(&r, seed + 4, 1, T + 1);
}

void
qkv_test_batch_clear(QkvTestBatch *b)
{
  qkv_tensor_free(b->src);
  qkv_tensor_free(b->src_valid);
  qkv_tensor_free(b->dec_in);
  qkv_tensor_free(b->labels);
  qkv_tensor_free(b->label_valid);
}

gboolean
qkv_test_batch_bind(QkvPlan *plan, const QkvTestBatch *b, GError **error)
{
  QkvTensor *const *t = &b->src;
  for (guint i = 0; i < G_N_ELEMENTS(qkv_test_s2s_input_names); i++)
    if (!qkv_plan_bind(plan, qkv_test_s2s_input_names[i], t[i], error))
      return FALSE;
  return TRUE;
}

QkvValue *
qkv_test_s2s_build(QkvGraph *g, QkvParams *params, QkvValue **logits)
{
  g_autoptr(GError) error = NULL;
  const QkvTransformerConfig *cfg = &qkv_test_s2s_config;
  const gint B = QKV_TEST_S2S_ROWS;
  QkvShape bs = QKV_SHAPE(B, QKV_TEST_S2S_SRC_LEN), bt = QKV_SHAPE(B, QKV_TEST_S2S_TGT_LEN),
           r = QKV_SHAPE(B);
  QkvValue *src = qkv_test_input(g, "src", QKV_I32, bs);
  QkvValue *valid = qkv_test_input(g, "src_valid", QKV_I32, r);
  QkvValue *dec = qkv_test_input(g, "dec_in", QKV_I32, bt);
  QkvValue *labels = qkv_test_input(g, "labels", QKV_I32, bt);
  QkvValue *label_valid = qkv_test_input(g, "label_valid", QKV_I32, r);
  QkvBuilder b = {.graph = g, .params = params, .seed = 3, .xavier_linear = TRUE};
  QkvValue *enc = qkv_build_transformer_encoder(&b, cfg, src, valid, &error);
  QkvValue *out = qkv_build_transformer_decoder(&b, cfg, dec, enc, valid, NULL, &error);
  QkvValue *loss = qkv_build_seq2seq_loss_lens(out, labels, label_valid, NULL, &error);
  g_assert_no_error(error);
  if (logits != NULL)
    *logits = out;
  return loss;
}

float *
qkv_test_params_flatten(QkvParams *params, gboolean grads, gsize *n)
{
  *n = 0;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    *n += (gsize)qkv_tensor_numel(grads ? qkv_param_grad(p) : qkv_param_value(p));
  }
  float *out = g_new(float, *n), *at = out;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const QkvTensor *t = grads ? qkv_param_grad(p) : qkv_param_value(p);
    memcpy(at, qkv_tensor_const_data(t), qkv_tensor_nbytes(t));
    at += qkv_tensor_numel(t);
  }
  return out;
}
