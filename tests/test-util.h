/* test-util.h: small helpers shared by the test suites. */
#pragma once

#include <qkv/qkv.h>

/* A tensor of uniform values in [lo, hi) from a fixed seed. */
QkvTensor *qkv_test_uniform(const QkvShape *shape, guint32 seed, float lo, float hi);
/* An i32 tensor of uniform integers in [lo, hi). */
QkvTensor *qkv_test_randint(const QkvShape *shape, guint32 seed, gint32 lo, gint32 hi);
/* Assert every element of actual is within tol (relative, with abs floor 1e-6... see .c). */
#define qkv_assert_tensor_close(actual, expected, tol)                                             \
  qkv_test_assert_close(__FILE__, __LINE__, (actual), (expected), (tol))
void qkv_test_assert_close(const char *file, int line, const QkvTensor *actual,
                           const QkvTensor *expected, double tol);
/* Assert the data of actual equals n floats within tol (absolute). */
void qkv_test_assert_values(const char *file, int line, const QkvTensor *actual,
                            const float *expected, gsize n, double tol);
#define qkv_assert_values(actual, expected, n, tol)                                                \
  qkv_test_assert_values(__FILE__, __LINE__, (actual), (expected), (n), (tol))
/* Run qkv_check_gradients with default options and assert it passes. */
void qkv_test_gradcheck(const char *label, guint n_inputs, QkvTensor *const *inputs,
                        const gboolean *check, QkvCheckBuildFunc build, gpointer user_data);
/* Same, with options. */
void qkv_test_gradcheck_full(const char *label, guint n_inputs, QkvTensor *const *inputs,
                             const gboolean *check, QkvCheckBuildFunc build, gpointer user_data,
                             const QkvCheckOptions *options);
/* Evaluate build on inputs (eval mode) and return the output; asserts success. */
QkvTensor *qkv_test_eval(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                         gpointer user_data);

/* Reference data written by the scripts in tests/reference/ (text format):
 *   tensor NAME f32|i32 RANK D0 D1 ...
 *   v0 v1 v2 ...            (one line, all elements, row-major)
 * Lines starting with '#' are comments. Returns name -> QkvTensor*; aborts the
 * test with a message on a malformed file. */
GHashTable *qkv_test_load_reference(const gchar *file_name);
/* The path of a file under tests/data/ (G_TEST_SRCDIR). */
gchar *qkv_test_data_path(const gchar *file_name);
/* Look a tensor up in a reference table; fails the test if it is missing. */
QkvTensor *qkv_test_ref(GHashTable *ref, const gchar *name);

/* A graph input that must be accepted. */
QkvValue *qkv_test_input(QkvGraph *g, const gchar *name, QkvDType dtype, QkvShape shape);

/* call must return NULL with a QKV_ERROR of the given code whose message
 * names op, and leave the graph's node count unchanged. */
#define qkv_assert_op_fails(graph, op, code, call)                                                 \
  G_STMT_START                                                                                     \
  {                                                                                                \
    guint n_nodes_ = qkv_graph_n_nodes(graph);                                                     \
    GError *error_ = NULL;                                                                         \
    QkvValue *v_ = (call);                                                                         \
    g_assert_null(v_);                                                                             \
    g_assert_error(error_, QKV_ERROR, code);                                                       \
    if (strstr(error_->message, op) == NULL)                                                       \
      g_error("error message '%s' does not name '%s'", error_->message, op);                       \
    g_test_message("%s", error_->message);                                                         \
    g_assert_cmpuint(qkv_graph_n_nodes(graph), ==, n_nodes_);                                      \
    g_clear_error(&error_);                                                                        \
  }                                                                                                \
  G_STMT_END
