/* test-util.h: small helpers shared by the test suites. */
#pragma once

#include <qkv/qkv.h>

/* A tensor of uniform values in [lo, hi) from a fixed seed. */
QkvTensor *qkv_test_uniform(const QkvShape *shape, guint32 seed, float lo, float hi);
/* An i32 tensor of uniform integers in [lo, hi). */
QkvTensor *qkv_test_randint(const QkvShape *shape, guint32 seed, gint32 lo, gint32 hi);
/* Assert |actual_i - expected_i| <= tol * max(|expected_i|, 1e-3) for every i.
 * For exact results (tol 0) and for values known to a stated relative accuracy;
 * two float32 computations of one value use qkv_assert_scaled/bounded below. */
#define qkv_assert_tensor_close(actual, expected, tol)                                             \
  qkv_test_assert_close(__FILE__, __LINE__, (actual), (expected), (tol))
void qkv_test_assert_close(const char *file, int line, const QkvTensor *actual,
                           const QkvTensor *expected, double tol);
/* Assert the data of actual equals n floats within tol (absolute). */
void qkv_test_assert_values(const char *file, int line, const QkvTensor *actual,
                            const float *expected, gsize n, double tol);
#define qkv_assert_values(actual, expected, n, tol)                                                \
  qkv_test_assert_values(__FILE__, __LINE__, (actual), (expected), (n), (tol))

/* ---- comparing two float32 computations of the same value ----------------
 *
 * Two correct float32 computations of one quantity (fused vs composite, sparse
 * vs dense, 1 vs n threads, qkv vs PyTorch) differ by rounding only, and by how
 * much depends on the order of the sums, which OpenBLAS picks per CPU. So the
 * tolerance is a bound derived from the arithmetic, never a number one CPU
 * happened to allow:
 *
 *   |actual_i - expected_i| <= factor * u * scale_i
 *
 * with u = 2^-24 the unit roundoff of float32 and scale_i either a per-element
 * magnitude (for a sum, the sum of the magnitudes of its terms, e.g. (|A||B|)_ij
 * for a GEMM: the rigorous bound of a sum of n terms is gamma(n) times that) or
 * the tensor's scale max_j |expected_j|. The factor is written at each call
 * site with where it comes from (two computations, chained GEMMs, inner
 * dimension, ...). A perturbation of 1e-4 (relative) of one element of typical
 * size exceeds factor * u * scale as long as factor stays well below
 * 1e-4 / u ~ 1678, which tests/test-util's "bounds catch errors" test shows
 * for checks of each kind. */

/* The unit roundoff of float32: half the distance from 1 to the next float. */
#define QKV_TEST_U (1.0 / 16777216.0)
/* The unit roundoff of bfloat16 (8 significant bits), for plans in bf16
 * precision: rounding an operand to bf16 moves it by at most this much,
 * relative. A bf16 bound in units of u: QKV_TEST_U_BF16 / QKV_TEST_U = 2^16. */
#define QKV_TEST_U_BF16 (1.0 / 256.0)
/* Higham's gamma_n = n u / (1 - n u): |fl(sum of n terms) - sum| <= gamma_n *
 * (sum of |terms|) for any order of the additions (recursive, blocked, pairwise
 * or split over threads) with one rounding per product. */
double qkv_test_gamma(double n);
/* The rounding error of a float32 sum of n terms in units of u times the sum
 * of the terms' magnitudes: n, the worst case for any order (gamma(n)/u to
 * first order), for short sums; for long ones, where the worst case (every
 * rounding the same way) is far too pessimistic to catch anything, Higham and
 * Mary's probabilistic bound lambda·sqrt(n) with lambda = 6 ("A New Approach
 * to Probabilistic Rounding Error Analysis", SISC 2019: it holds for any
 * order with probability at least 1 - 2n·exp(-lambda²/2) = 1 - 3e-8·n under
 * independent roundings). min(n, 6·sqrt(n)): n up to 36. */
double qkv_test_sum_factor(double n);
/* max_i |t_i| (f32 or i32). */
double qkv_test_max_abs(const QkvTensor *t);
/* The per-element magnitude of a matrix product: |A|·|B| (or with A, B
 * transposed), computed in double. The rounding error of any float32 GEMM is
 * at most gamma(k) times it, k the inner dimension. Leading dimensions beyond
 * the last two are a batch, as in qkv_matmul. */
QkvTensor *qkv_test_abs_matmul(const QkvTensor *a, const QkvTensor *b, gboolean trans_a,
                               gboolean trans_b);

/* TRUE when |actual_i - expected_i| <= factor * u * scale_i for every i, where
 * scale_i = magnitude_i, or max(max_j |expected_j|, min_scale) when magnitude
 * is NULL. min_scale is for a value that vanishes identically (a sum whose
 * terms cancel exactly, such as the gradient of the key bias of attention):
 * its rounding noise follows the magnitude of the terms, not the result's.
 * Otherwise FALSE, and *message (if not NULL) names the first failing element
 * (free it with g_free). *needed (if not NULL) gets the smallest factor that
 * would have passed: max_i |actual_i - expected_i| / (u * scale_i). Shapes must
 * agree; NaN fails. Asserts nothing, so a test can show a check catches an
 * error. */
gboolean qkv_test_check_bound(const QkvTensor *actual, const QkvTensor *expected,
                              const QkvTensor *magnitude, double min_scale, double factor,
                              double *needed, gchar **message);
/* Assert qkv_test_check_bound; logs the factor needed (g_test_message) so a
 * run with --verbose shows each check's margin. Returns the factor needed. */
double qkv_test_assert_bound(const char *file, int line, const gchar *label,
                             const QkvTensor *actual, const QkvTensor *expected,
                             const QkvTensor *magnitude, double min_scale, double factor);
/* |actual - expected| <= factor * u * max|expected| element-wise. */
#define qkv_assert_scaled(label, actual, expected, factor)                                         \
  qkv_test_assert_bound(__FILE__, __LINE__, (label), (actual), (expected), NULL, 0, (factor))
/* |actual - expected| <= factor * u * max(max|expected|, min_scale). */
#define qkv_assert_scaled_min(label, actual, expected, min_scale, factor)                          \
  qkv_test_assert_bound(__FILE__, __LINE__, (label), (actual), (expected), NULL, (min_scale),      \
                        (factor))
/* |actual_i - expected_i| <= factor * u * magnitude_i element-wise. */
#define qkv_assert_bounded(label, actual, expected, magnitude, factor)                             \
  qkv_test_assert_bound(__FILE__, __LINE__, (label), (actual), (expected), (magnitude), 0, (factor))
/* |t| element-wise: the magnitude of a value computed elementwise, for a
 * bound relative to each element (qkv_assert_bounded). */
QkvTensor *qkv_test_abs(const QkvTensor *t);
/* A copy of t with element i multiplied by (1 + rel): a "real error" for the
 * tests that show a bound catches one. */
QkvTensor *qkv_test_perturbed(const QkvTensor *t, gint64 i, double rel);
/* The index of an element of typical size: the one whose |t_i| is nearest the
 * root mean square of t. */
gint64 qkv_test_typical_index(const QkvTensor *t);

/* Run qkv_check_gradients with default options and assert it passes. */
void qkv_test_gradcheck(const char *label, guint n_inputs, QkvTensor *const *inputs,
                        const gboolean *check, QkvCheckBuildFunc build, gpointer user_data);
/* Same, with options. */
void qkv_test_gradcheck_full(const char *label, guint n_inputs, QkvTensor *const *inputs,
                             const gboolean *check, QkvCheckBuildFunc build, gpointer user_data,
                             const QkvCheckOptions *options);
/* Run build on n inputs ("in0", "in1", …, at most 16) and return its output
 * and, in grads[i], d sum(out · w) / d input i for every f32 input (zeros
 * where none flows; NULL for i32 inputs), w = loss_weights or uniform in
 * [-1, 1) from a fixed seed. Asserts success. */
QkvTensor *qkv_test_run_with_grads(guint n, QkvTensor *const *tensors, QkvCheckBuildFunc build,
                                   gpointer user_data, const QkvTensor *loss_weights,
                                   QkvTensor **grads);
/* Evaluate build on inputs (eval mode) and return the output; asserts success. */
QkvTensor *qkv_test_eval(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                         gpointer user_data);
/* Evaluate build on inputs and assert that the run fails with a QKV_ERROR of
 * code whose message contains want. */
void qkv_test_assert_eval_fails(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                                gpointer user_data, gint code, const gchar *want);

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

/* ---- finite differences of a parameter ----------------------------------
 *
 * For builders, whose weights are parameters rather than graph inputs:
 * plan's output 0 is a scalar loss over a graph with qkv_graph_backward()
 * done and its inputs bound. Runs the plan once and asserts, for up to
 * max_elems elements of the parameter (evenly spaced; all when it has no
 * more), that the gradient the plan wrote agrees with the central difference
 * (loss(p + eps) - loss(p - eps)) / 2 eps within rel_tol · max(|numeric|,
 * abs_floor). The parameter's value is restored. Returns the largest
 * |analytic - numeric| / max(|numeric|, abs_floor) seen. With scale ≠ 1 the
 * analytic gradient is multiplied by scale first and nothing is asserted:
 * a test shows with it that the check catches a wrong gradient. */
double qkv_test_param_fd(QkvPlan *plan, QkvParams *params, const gchar *name, gint64 max_elems,
                         double eps, double rel_tol, double abs_floor, double scale);

/* ---- the thread suites' seq2seq model -------------------------------------
 *
 * test-tsan.c and test-concurrency.c run the same small Transformer from
 * several threads and compare with single-threaded runs: its configuration,
 * its batches (QKV_TEST_S2S_ROWS rows of QKV_TEST_S2S_SRC_LEN source and
 * QKV_TEST_S2S_TGT_LEN target tokens) and its graph live here. */

enum { QKV_TEST_S2S_ROWS = 4, QKV_TEST_S2S_SRC_LEN = 6, QKV_TEST_S2S_TGT_LEN = 5 };
extern const QkvTransformerConfig qkv_test_s2s_config;

/* One batch of the model's inputs, in the order of qkv_test_s2s_input_names. */
typedef struct {
  QkvTensor *src, *src_valid, *dec_in, *labels, *label_valid;
} QkvTestBatch;
extern const gchar *const qkv_test_s2s_input_names[5];

/* A batch of rows random sequences (tokens from 3, lengths from 1) from seed
 * .. seed + 4. */
void qkv_test_batch_init(QkvTestBatch *b, gint rows, guint32 seed);
void qkv_test_batch_clear(QkvTestBatch *b);
/* Bind every tensor of b to plan's input of its name. */
gboolean qkv_test_batch_bind(QkvPlan *plan, const QkvTestBatch *b, GError **error);
/* The book's Transformer over params (created on first use, shared after;
 * Xavier linear layers from seed 3) on g, for QKV_TEST_S2S_ROWS rows: returns
 * the masked loss and, if logits is not NULL, the decoder's logits there.
 * Asserts success. */
QkvValue *qkv_test_s2s_build(QkvGraph *g, QkvParams *params, QkvValue **logits);
/* Every parameter's value (or, with grads, its gradient) of params, end to
 * end; *n gets the count. Free with g_free. */
float *qkv_test_params_flatten(QkvParams *params, gboolean grads, gsize *n);
