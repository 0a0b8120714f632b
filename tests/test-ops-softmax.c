/* test-ops-softmax.c: "softmax", "log_softmax" and their backward ops. */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef QkvValue *(*UnaryFunc)(QkvValue *x, GError **error);
typedef QkvValue *(*BinaryFunc)(QkvValue *a, QkvValue *b, GError **error);

/* Function pointers travel through user_data inside a struct (ISO C has no
 * conversion between function and object pointers). */
typedef struct {
  UnaryFunc f;
} Unary;
typedef struct {
  BinaryFunc f;
} Binary;

static const Unary SOFTMAX = {qkv_softmax}, LOG_SOFTMAX = {qkv_log_softmax};
static const Binary SOFTMAX_BACKWARD = {qkv_softmax_backward},
                    LOG_SOFTMAX_BACKWARD = {qkv_log_softmax_backward};

static QkvValue *
build_unary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Unary *u = user_data;
  return u->f(in[0], error);
}

static QkvValue *
build_binary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Binary *b = user_data;
  return b->f(in[0], in[1], error);
}

/* softmax of an intermediate, which the planner may overwrite in place. */
static QkvValue *
build_scaled_softmax(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *x = qkv_scale(in[0], 2.0, error);
  return x != NULL ? qkv_softmax(x, error) : NULL;
}

static QkvTensor *
eval1(const Unary *u, QkvTensor *x)
{
  QkvTensor *in[] = {x};
  return qkv_test_eval(1, in, build_unary, (gpointer)u);
}

static void
test_softmax_forward(void)
{
  QkvShape s = QKV_SHAPE(3, 3);
  /* Row 1 is row 0 shifted by 1000 (overflows without the max shift); row 2
   * is constant. */
  float x[] = {1, 2, 3, 1001, 1002, 1003, -7, -7, -7};
  g_autoptr(QkvTensor) t = qkv_tensor_new_f32(&s, x);
  g_autoptr(QkvTensor) y = eval1(&SOFTMAX, t);
  float want[] = {0.09003057f, 0.24472847f, 0.66524096f, 0.09003057f, 0.24472847f,
                  0.66524096f, 1.0f / 3,    1.0f / 3,    1.0f / 3};
  qkv_assert_values(y, want, 9, 1e-6);

  g_autoptr(QkvTensor) ly = eval1(&LOG_SOFTMAX, t);
  float want_log[] = {-2.40760596f, -1.40760596f, -0.40760596f, -2.40760596f, -1.40760596f,
                      -0.40760596f, -1.09861229f, -1.09861229f, -1.09861229f};
  qkv_assert_values(ly, want_log, 9, 1e-5);

  /* In place on an intermediate: softmax(2x); row 0 is softmax([2 4 6]). */
  QkvTensor *in[] = {t};
  g_autoptr(QkvTensor) y2 = qkv_test_eval(1, in, build_scaled_softmax, NULL);
  float want2[] = {0.01587624f, 0.11731043f, 0.86681333f, 0.01587624f, 0.11731043f,
                   0.86681333f, 1.0f / 3,    1.0f / 3,    1.0f / 3};
  qkv_assert_values(y2, want2, 9, 1e-6);
}

/* A rank-1 input, and a fully masked row (all -inf) which gives zeros (and
 * -inf for log_softmax) rather than NaN. */
static void
test_softmax_edge_rows(void)
{
  QkvShape s4 = QKV_SHAPE(4);
  float x[] = {0, 0, logf(2), logf(4)};
  g_autoptr(QkvTensor) t = qkv_tensor_new_f32(&s4, x);
  g_autoptr(QkvTensor) y = eval1(&SOFTMAX, t);
  float want[] = {0.125f, 0.125f, 0.25f, 0.5f};
  qkv_assert_values(y, want, 4, 1e-6);

  QkvShape s23 = QKV_SHAPE(2, 3);
  float masked[] = {-INFINITY, -INFINITY, -INFINITY, 0, -INFINITY, 0};
  g_autoptr(QkvTensor) tm = qkv_tensor_new_f32(&s23, masked);
  g_autoptr(QkvTensor) ym = eval1(&SOFTMAX, tm);
  float want_m[] = {0, 0, 0, 0.5f, 0, 0.5f};
  qkv_assert_values(ym, want_m, 6, 1e-7);
  g_autoptr(QkvTensor) lm = eval1(&LOG_SOFTMAX, tm);
  for (gint i = 0; i < 3; i++)
    g_assert_true(isinf(qkv_tensor_get(lm, i)) && qkv_tensor_get(lm, i) < 0);
  g_assert_cmpfloat_with_epsilon(qkv_tensor_get(lm, 3), -0.69314718, 1e-6);
}

/* Many long rows (the parallel path): each row sums to 1, and log_softmax
 * is the log of softmax. */
static void
test_softmax_large(void)
{
  QkvShape s = QKV_SHAPE(64, 611);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 1, -20, 20);
  g_autoptr(QkvTensor) y = eval1(&SOFTMAX, x);
  g_autoptr(QkvTensor) ly = eval1(&LOG_SOFTMAX, x);
  for (gint64 r = 0; r < 64; r++) {
    double sum = 0;
    for (gint64 j = 0; j < 611; j++) {
      double p = qkv_tensor_get(y, r * 611 + j), lp = qkv_tensor_get(ly, r * 611 + j);
      sum += p;
      /* p = exp(x - m) / s and lp = (x - m) - log s in float32, s a sum of
       * 611 positive terms, within S(611) u relative (qkv_test_sum_factor).
       * As x - m ≤ 0 ≤ log s, |x - m| and log s are at most |lp|: lp is off
       * by S(611) u (through log s) plus the roundings of x - m, log (2 u)
       * and the subtraction, at most 4 |lp| u + 1 u; exp(lp) carries that
       * relative. p carries S(611) u, 2 u for exp and 1 u for the division. */
      double factor = 2 * qkv_test_sum_factor(611) + 4 * fabs(lp) + 8;
      g_assert_cmpfloat(fabs(exp(lp) - p), <=, factor * QKV_TEST_U * p + 1e-30);
    }
    /* Each p within (S(611) + 4) u relative (above), their sum alike. */
    g_assert_cmpfloat_with_epsilon(sum, 1.0, (qkv_test_sum_factor(611) + 4) * QKV_TEST_U);
  }
}

static void
test_backward_forward(void)
{
  QkvShape s = QKV_SHAPE(1, 3);
  /* dot = 0.2: dx = y (dy − 0.2) */
  float dy[] = {1, 0, 0}, y[] = {0.2f, 0.3f, 0.5f};
  g_autoptr(QkvTensor) tdy = qkv_tensor_new_f32(&s, dy);
  g_autoptr(QkvTensor) ty = qkv_tensor_new_f32(&s, y);
  QkvTensor *in[] = {tdy, ty};
  g_autoptr(QkvTensor) dx = qkv_test_eval(2, in, build_binary, (gpointer)&SOFTMAX_BACKWARD);
  float want[] = {0.16f, -0.06f, -0.1f};
  qkv_assert_values(dx, want, 3, 1e-6);

  /* Σ dy = 6: dx = dy − 6 exp(y) */
  float dy2[] = {1, 2, 3}, ly[] = {logf(0.2f), logf(0.3f), logf(0.5f)};
  g_autoptr(QkvTensor) tdy2 = qkv_tensor_new_f32(&s, dy2);
  g_autoptr(QkvTensor) tly = qkv_tensor_new_f32(&s, ly);
  QkvTensor *in2[] = {tdy2, tly};
  g_autoptr(QkvTensor) dx2 = qkv_test_eval(2, in2, build_binary, (gpointer)&LOG_SOFTMAX_BACKWARD);
  float want2[] = {-0.2f, 0.2f, 0.0f};
  qkv_assert_values(dx2, want2, 3, 1e-6);
}

static void
test_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(5), QKV_SHAPE(3, 7), QKV_SHAPE(2, 3, 5), QKV_SHAPE(4, 1)};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[i], 10 + i, -2, 2);
    QkvTensor *in[] = {x};
    qkv_test_gradcheck("softmax", 1, in, NULL, build_unary, (gpointer)&SOFTMAX);
    qkv_test_gradcheck("log_softmax", 1, in, NULL, build_unary, (gpointer)&LOG_SOFTMAX);
    qkv_test_gradcheck("softmax of intermediate", 1, in, NULL, build_scaled_softmax, NULL);
  }
}

/* ---- bad input -------------------------------------------------------- */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *scalar = qkv_test_input(g, "scalar", QKV_F32, qkv_shape_scalar());
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *b = qkv_test_input(g, "b", QKV_F32, QKV_SHAPE(3, 2));

  qkv_assert_op_fails(g, "'softmax'", QKV_ERROR_DTYPE, qkv_softmax(xi, &error_));
  qkv_assert_op_fails(g, "'log_softmax'", QKV_ERROR_DTYPE, qkv_log_softmax(xi, &error_));
  qkv_assert_op_fails(g, "'softmax'", QKV_ERROR_SHAPE, qkv_softmax(scalar, &error_));
  qkv_assert_op_fails(g, "softmax_backward", QKV_ERROR_SHAPE, qkv_softmax_backward(a, b, &error_));
  qkv_assert_op_fails(g, "log_softmax_backward", QKV_ERROR_DTYPE,
                      qkv_log_softmax_backward(a, xi, &error_));
  QkvValue *two[] = {a, a};
  qkv_assert_op_fails(g, "softmax", QKV_ERROR_ARITY,
                      qkv_graph_op(g, "softmax", two, 2, NULL, &error_));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/softmax/forward", test_softmax_forward);
  g_test_add_func("/softmax/edge-rows", test_softmax_edge_rows);
  g_test_add_func("/softmax/large", test_softmax_large);
  g_test_add_func("/softmax/backward-ops", test_backward_forward);
  g_test_add_func("/softmax/grad", test_grad);
  g_test_add_func("/softmax/bad-input", test_bad_input);
  return g_test_run();
}
