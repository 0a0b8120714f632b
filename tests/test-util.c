/* test-util.c: small helpers shared by the test suites. */
#include "test-util.h"

#include <math.h>
#include <stdlib.h>

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
