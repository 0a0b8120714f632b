/* test-util.c: small helpers shared by the test suites. */
#include "test-util.h"

#include <math.h>

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
      g_error("%s:%d: element %" G_GINT64_FORMAT " of %s: %.9g vs expected %.9g (rel err %.3g > %.3g)",
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
qkv_test_eval(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
              gpointer user_data)
{
  g_autoptr(GError) error = NULL;
  QkvTensor *out = qkv_check_evaluate(n_inputs, inputs, build, user_data, FALSE, &error);
  g_assert_no_error(error);
  g_assert_nonnull(out);
  return out;
}
