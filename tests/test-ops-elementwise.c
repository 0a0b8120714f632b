/* test-ops-elementwise.c: add, sub, mul, div (with broadcasting), scale, neg,
 * relu, sigmoid, tanh, exp, log and the activation gradient ops. */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef QkvValue *(*BinaryFn)(QkvValue *a, QkvValue *b, GError **error);
typedef QkvValue *(*UnaryFn)(QkvValue *x, GError **error);

typedef struct {
  const char *name;
  BinaryFn fn;
  float (*ref)(float a, float b);
} BinaryCase;

typedef struct {
  const char *name;
  UnaryFn fn;
  float (*ref)(float x);
} UnaryCase;

static float
ref_add(float a, float b)
{
  return a + b;
}

static float
ref_sub(float a, float b)
{
  return a - b;
}

static float
ref_mul(float a, float b)
{
  return a * b;
}

static float
ref_div(float a, float b)
{
  return a / b;
}

static const BinaryCase binary_cases[] = {
    {"add", qkv_add, ref_add},
    {"sub", qkv_sub, ref_sub},
    {"mul", qkv_mul, ref_mul},
    {"div", qkv_div, ref_div},
};

static QkvValue *
build_binary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const BinaryCase *c = user_data;
  return c->fn(in[0], in[1], error);
}

static QkvValue *
build_unary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const UnaryCase *c = user_data;
  return c->fn(in[0], error);
}

static QkvValue *
build_scale(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_scale(in[0], *(const double *)user_data, error);
}

/* Evaluate a binary op on two literal tensors and compare with literal values. */
static void
check_binary_values(BinaryFn fn, const QkvShape *sa, const float *a, const QkvShape *sb,
                    const float *b, const QkvShape *s_out, const float *want)
{
  BinaryCase c = {"?", fn, NULL};
  g_autoptr(QkvTensor) ta = qkv_tensor_new_f32(sa, a);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(sb, b);
  QkvTensor *in[] = {ta, tb};
  g_autoptr(QkvTensor) out = qkv_test_eval(2, in, build_binary, &c);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(out), s_out));
  qkv_assert_values(out, want, (gsize)qkv_shape_numel(s_out), 1e-6);
}

static void
check_unary_values(UnaryFn fn, const QkvShape *s, const float *x, const float *want, double tol)
{
  UnaryCase c = {"?", fn, NULL};
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(s, x);
  g_autoptr(QkvTensor) out = qkv_test_eval(1, &tx, build_unary, &c);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(out), s));
  qkv_assert_values(out, want, (gsize)qkv_shape_numel(s), tol);
}

/* ---- forward values worked out by hand ---- */

static void
test_add_values(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3);
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {10, 20, 30};
  const float want[] = {11, 22, 33, 14, 25, 36};
  /* row bias on either side */
  check_binary_values(qkv_add, &s23, a, &s3, b, &s23, want);
  check_binary_values(qkv_add, &s3, b, &s23, a, &s23, want);
  /* same shape */
  const float c[] = {0.5f, -1, 2};
  const float want_same[] = {10.5f, 19, 32};
  check_binary_values(qkv_add, &s3, b, &s3, c, &s3, want_same);
}

static void
test_sub_values(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), s21 = QKV_SHAPE(2, 1), s3 = QKV_SHAPE(3),
           scalar = qkv_shape_scalar();
  const float a[] = {1, 2, 3, 4, 5, 6}, col[] = {1, 2};
  const float want[] = {0, 1, 2, 2, 3, 4};
  check_binary_values(qkv_sub, &s23, a, &s21, col, &s23, want);
  /* scalar on the left */
  const float ten[] = {10}, x[] = {1, 2, 3};
  const float want_scalar[] = {9, 8, 7};
  check_binary_values(qkv_sub, &scalar, ten, &s3, x, &s3, want_scalar);
  /* scalar on the right */
  const float want_right[] = {-9, -8, -7};
  check_binary_values(qkv_sub, &s3, x, &scalar, ten, &s3, want_right);
}

static void
test_mul_values(void)
{
  QkvShape s21 = QKV_SHAPE(2, 1), s13 = QKV_SHAPE(1, 3), s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3),
           scalar = qkv_shape_scalar();
  const float col[] = {1, 2}, row[] = {3, 4, 5};
  const float outer[] = {3, 4, 5, 6, 8, 10};
  check_binary_values(qkv_mul, &s21, col, &s13, row, &s23, outer);
  const float x[] = {1, 2, 3}, s[] = {2.5f};
  const float want_scalar[] = {2.5f, 5, 7.5f};
  check_binary_values(qkv_mul, &s3, x, &scalar, s, &s3, want_scalar);
  /* (2,1,3) · (1,2,1) → (2,2,3) */
  QkvShape sa = QKV_SHAPE(2, 1, 3), sb = QKV_SHAPE(1, 2, 1), so = QKV_SHAPE(2, 2, 3);
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {10, -1};
  const float want3[] = {10, 20, 30, -1, -2, -3, 40, 50, 60, -4, -5, -6};
  check_binary_values(qkv_mul, &sa, a, &sb, b, &so, want3);
  /* rank-0 with rank-0 stays rank 0 */
  const float p[] = {3}, q[] = {-4}, pq[] = {-12};
  check_binary_values(qkv_mul, &scalar, p, &scalar, q, &scalar, pq);
}

static void
test_div_values(void)
{
  QkvShape s4 = QKV_SHAPE(4), s2 = QKV_SHAPE(2), s22 = QKV_SHAPE(2, 2), s21 = QKV_SHAPE(2, 1),
           scalar = qkv_shape_scalar();
  const float a[] = {1, 2, 3, 4}, b[] = {2, 4, 8, 16};
  const float want[] = {0.5f, 0.5f, 0.375f, 0.25f};
  check_binary_values(qkv_div, &s4, a, &s4, b, &s4, want);
  const float one[] = {1}, d[] = {2, 4}, want_scalar[] = {0.5f, 0.25f};
  check_binary_values(qkv_div, &scalar, one, &s2, d, &s2, want_scalar);
  const float m[] = {1, 2, 3, 4}, col[] = {2, 4}, want_col[] = {0.5f, 1, 0.75f, 1};
  check_binary_values(qkv_div, &s22, m, &s21, col, &s22, want_col);
}

static void
test_scale_neg_values(void)
{
  QkvShape s3 = QKV_SHAPE(3);
  const float x[] = {1, -2, 3};
  double factor = -0.5;
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(&s3, x);
  g_autoptr(QkvTensor) out = qkv_test_eval(1, &tx, build_scale, &factor);
  const float want[] = {-0.5f, 1, -1.5f};
  qkv_assert_values(out, want, 3, 1e-7);

  const float y[] = {1, -2, 0.5f}, want_neg[] = {-1, 2, -0.5f};
  check_unary_values(qkv_neg, &s3, y, want_neg, 0);
}

/* Against exact values written to 9-10 digits: the functions are within a
 * few ulps (SLEEF's u10: 1 ulp) of them; 1e-6 absolute on values up to 1 is
 * 8 u and more, 2e-6 on exp's values up to 7.4 is 4.5 u. Reductions are not
 * involved, so nothing here depends on the CPU's summation order. */
static void
test_activation_values(void)
{
  QkvShape s4 = QKV_SHAPE(4), s5 = QKV_SHAPE(5);
  const float r[] = {-1, 0.5f, 2, -0.1f}, want_relu[] = {0, 0.5f, 2, 0};
  check_unary_values(qkv_relu, &s4, r, want_relu, 0);

  const float s[] = {0, 2, -2, 20, -20};
  const float want_sigmoid[] = {0.5f, 0.880797078f, 0.119202922f, 1.0f, 2.0611536e-9f};
  check_unary_values(qkv_sigmoid, &s5, s, want_sigmoid, 1e-6);

  const float t[] = {0, 0.5f, -1, 3};
  const float want_tanh[] = {0, 0.462117157f, -0.761594156f, 0.995054754f};
  check_unary_values(qkv_tanh, &s4, t, want_tanh, 1e-6);

  const float e[] = {0, 1, -1, 2};
  const float want_exp[] = {1, 2.718281828f, 0.367879441f, 7.389056099f};
  check_unary_values(qkv_exp, &s4, e, want_exp, 2e-6);

  const float l[] = {1, 2.718281828f, 0.5f, 10};
  const float want_log[] = {0, 1, -0.693147181f, 2.302585093f};
  check_unary_values(qkv_log, &s4, l, want_log, 1e-6);
}

static void
test_sigmoid_tails(void)
{
  /* Far in the negative tail the result must keep its relative precision
   * (0.5·(1 + tanh(x/2)) rounds to 0 there), and must not overflow. */
  QkvShape s4 = QKV_SHAPE(4);
  const float x[] = {-20, -40, 40, -200};
  UnaryCase c = {"sigmoid", qkv_sigmoid, NULL};
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(&s4, x);
  g_autoptr(QkvTensor) out = qkv_test_eval(1, &tx, build_unary, &c);
  const double want[] = {2.0611536224385579e-09, 4.248354255291589e-18, 1.0, 0.0};
  for (int i = 0; i < 4; i++) {
    double v = qkv_tensor_get(out, i);
    g_assert_true(isfinite(v));
    g_assert_cmpfloat_with_epsilon(v, want[i], fmax(1e-6 * want[i], 1e-30));
  }
}

typedef struct {
  BinaryFn fn;
} BackwardCase;

static QkvValue *
build_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const BackwardCase *c = user_data;
  return c->fn(in[0], in[1], error);
}

static void
check_backward_values(BinaryFn fn, const float *dy, const float *y, const float *want, gsize n)
{
  QkvShape s = qkv_shape_from_array(1, (const gint64[]){(gint64)n});
  g_autoptr(QkvTensor) tdy = qkv_tensor_new_f32(&s, dy);
  g_autoptr(QkvTensor) ty = qkv_tensor_new_f32(&s, y);
  QkvTensor *in[] = {tdy, ty};
  BackwardCase c = {fn};
  g_autoptr(QkvTensor) out = qkv_test_eval(2, in, build_backward, &c);
  qkv_assert_values(out, want, n, 1e-6);
}

static void
test_backward_values(void)
{
  const float dy4[] = {1, 2, 3, 4}, y4[] = {0, 0.5f, 0, 2}, want_relu[] = {0, 2, 0, 4};
  check_backward_values(qkv_relu_backward, dy4, y4, want_relu, 4);
  const float dy3[] = {1, 2, -1};
  const float ys[] = {0.5f, 0.25f, 0.9f}, want_sigmoid[] = {0.25f, 0.375f, -0.09f};
  check_backward_values(qkv_sigmoid_backward, dy3, ys, want_sigmoid, 3);
  const float yt[] = {0, 0.5f, -0.9f}, want_tanh[] = {1, 1.5f, -0.19f};
  check_backward_values(qkv_tanh_backward, dy3, yt, want_tanh, 3);
}

/* ---- every broadcasting path against a naive reference, small and large ---- */

/* Flat index into x of output element flat, under NumPy broadcasting. */
static gint64
broadcast_index(const QkvShape *x, const QkvShape *out, gint64 flat)
{
  gint64 index = 0, stride = 1;
  for (gint d = out->rank - 1, xd = x->rank - 1; d >= 0; d--, xd--) {
    gint64 c = flat % out->dims[d];
    flat /= out->dims[d];
    if (xd >= 0) {
      if (x->dims[xd] != 1)
        index += c * stride;
      stride *= x->dims[xd];
    }
  }
  return index;
}

static void
test_broadcast_paths(void)
{
  /* Shape pairs that reach each kernel path (same, scalar either side, rows
   * either side, general), below and above the threshold for threads. */
  const struct {
    QkvShape a, b;
  } pairs[] = {
      {QKV_SHAPE(5, 7), QKV_SHAPE(5, 7)},
      {QKV_SHAPE(300, 201), QKV_SHAPE(300, 201)},
      {QKV_SHAPE(1, 300, 201), QKV_SHAPE(300, 201)},
      {QKV_SHAPE(300, 201), qkv_shape_scalar()},
      {qkv_shape_scalar(), QKV_SHAPE(300, 201)},
      {QKV_SHAPE(300, 201), QKV_SHAPE(201)},
      {QKV_SHAPE(201), QKV_SHAPE(300, 201)},
      {QKV_SHAPE(30, 4, 5), QKV_SHAPE(1, 4, 5)},
      {QKV_SHAPE(41, 30, 50), QKV_SHAPE(41, 1, 50)},
      {QKV_SHAPE(41, 1, 50), QKV_SHAPE(1, 30, 1)},
      {QKV_SHAPE(7, 5, 3), QKV_SHAPE(5, 1)},
      {QKV_SHAPE(2, 3, 1, 4), QKV_SHAPE(3, 5, 1)},
      {QKV_SHAPE(300, 1), QKV_SHAPE(1, 201)},
  };
  for (gsize p = 0; p < G_N_ELEMENTS(pairs); p++) {
    const QkvShape *sa = &pairs[p].a, *sb = &pairs[p].b;
    QkvShape so;
    g_assert_true(qkv_shape_broadcast(sa, sb, &so));
    g_autoptr(QkvTensor) a = qkv_test_uniform(sa, 11 + (guint32)p, -2, 2);
    /* positive and away from 0, so div is well defined */
    g_autoptr(QkvTensor) b = qkv_test_uniform(sb, 101 + (guint32)p, 0.5f, 3);
    QkvTensor *in[] = {a, b};
    for (gsize k = 0; k < G_N_ELEMENTS(binary_cases); k++) {
      const BinaryCase *c = &binary_cases[k];
      g_autoptr(QkvTensor) out = qkv_test_eval(2, in, build_binary, (gpointer)c);
      g_assert_true(qkv_shape_equal(qkv_tensor_shape(out), &so));
      g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &so);
      float *w = qkv_tensor_f32(want);
      const float *av = qkv_tensor_const_data(a), *bv = qkv_tensor_const_data(b);
      for (gint64 i = 0; i < qkv_shape_numel(&so); i++)
        w[i] = c->ref(av[broadcast_index(sa, &so, i)], bv[broadcast_index(sb, &so, i)]);
      /* +, -, ·, / are correctly rounded in IEEE float32, vector or
       * scalar: both are the exact result rounded once, so at most 1 u
       * (relative to the element) apart. */
      g_autoptr(QkvTensor) magnitude = qkv_test_abs(want);
      qkv_assert_bounded(c->name, out, want, magnitude, 1.0);
    }
  }
}

static float
ref_relu(float x)
{
  return x < 0 ? 0 : x;
}

static float
ref_sigmoid(float x)
{
  return (float)(1.0 / (1.0 + exp(-(double)x)));
}

static float
ref_neg(float x)
{
  return -x;
}

static const UnaryCase unary_cases[] = {
    {"neg", qkv_neg, ref_neg}, {"relu", qkv_relu, ref_relu}, {"sigmoid", qkv_sigmoid, ref_sigmoid},
    {"tanh", qkv_tanh, tanhf}, {"exp", qkv_exp, expf},       {"log", qkv_log, logf},
};

static void
test_unary_large(void)
{
  /* Odd sizes split into chunks that do not end on a vector boundary. */
  const QkvShape shapes[] = {QKV_SHAPE(37), QKV_SHAPE(301, 199)};
  for (gsize s = 0; s < G_N_ELEMENTS(shapes); s++) {
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[s], 7, -6, 6);
    g_autoptr(QkvTensor) pos = qkv_test_uniform(&shapes[s], 8, 0.01f, 50);
    for (gsize k = 0; k < G_N_ELEMENTS(unary_cases); k++) {
      const UnaryCase *c = &unary_cases[k];
      QkvTensor *in = strcmp(c->name, "log") == 0 ? pos : x;
      g_autoptr(QkvTensor) out = qkv_test_eval(1, &in, build_unary, (gpointer)c);
      g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &shapes[s]);
      const float *xv = qkv_tensor_const_data(in);
      float *w = qkv_tensor_f32(want);
      for (gint64 i = 0; i < qkv_tensor_numel(want); i++)
        w[i] = c->ref(xv[i]);
      g_test_message("%s %" G_GINT64_FORMAT " elements", c->name, qkv_tensor_numel(want));
      /* SLEEF's u10 functions (exp, tanh: within 1 ulp) against glibc's
       * float functions (within 2 ulp by glibc's published bounds for
       * expf, tanhf, logf); sigmoid is an exp, an addition and a division
       * (about 2 ulp) against the double formula rounded once: at most 4 ulp
       * apart, 1 ulp ≤ 2 u relative to the element: 8 u. */
      g_autoptr(QkvTensor) magnitude = qkv_test_abs(want);
      qkv_assert_bounded(c->name, out, want, magnitude, 8.0);
    }
  }
}

/* A chain whose intermediates the planner may overwrite in place:
 * y = -exp(-relu(2x + b)) · 0.5, then y / c (c a scalar). */
static QkvValue *
build_chain(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *v = qkv_scale(in[0], 2.0, error);
  v = v ? qkv_add(v, in[1], error) : NULL;
  v = v ? qkv_relu(v, error) : NULL;
  v = v ? qkv_neg(v, error) : NULL;
  v = v ? qkv_exp(v, error) : NULL;
  v = v ? qkv_neg(v, error) : NULL;
  v = v ? qkv_scale(v, 0.5, error) : NULL;
  v = v ? qkv_sigmoid(v, error) : NULL;
  v = v ? qkv_tanh(v, error) : NULL;
  v = v ? qkv_div(v, in[2], error) : NULL;
  return v;
}

static void
test_inplace_chain(void)
{
  const QkvShape shapes[] = {QKV_SHAPE(3, 5), QKV_SHAPE(250, 160)};
  for (gsize s = 0; s < G_N_ELEMENTS(shapes); s++) {
    QkvShape sb = QKV_SHAPE(shapes[s].dims[1]), scalar = qkv_shape_scalar();
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[s], 3, -1, 1);
    g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 4, -1, 1);
    const float cv[] = {0.25f};
    g_autoptr(QkvTensor) c = qkv_tensor_new_f32(&scalar, cv);
    QkvTensor *in[] = {x, b, c};
    g_autoptr(QkvTensor) out = qkv_test_eval(3, in, build_chain, NULL);
    g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &shapes[s]);
    const float *xv = qkv_tensor_const_data(x), *bv = qkv_tensor_const_data(b);
    float *w = qkv_tensor_f32(want);
    gint64 cols = shapes[s].dims[1];
    for (gint64 i = 0; i < qkv_tensor_numel(want); i++) {
      double v = 2.0 * xv[i] + bv[i % cols];
      v = -exp(-fmax(v, 0.0)) * 0.5;
      v = tanh(1.0 / (1.0 + exp(-v)));
      w[i] = (float)(v / 0.25);
    }
    /* Ten elementwise steps on O(1) values, each passing on its input's
     * error with a derivative of size at most 1 and adding its own: the
     * add 1 u, exp 2 u (SLEEF, 1 ulp), sigmoid 4 u (exp, add, division),
     * tanh 2 u, the division 1 u, want's rounding 1 u; the scalings by 2 and
     * 0.5 and negations are exact: 11 u, 16 on the tensor's scale (≈ 1.8). */
    qkv_assert_scaled("chain vs double", out, want, 16.0);
  }
}

/* ---- gradients by finite differences ---- */

/* Check one input at a time: each pass also covers the rule with needs_grad
 * false for the other inputs. */
static void
gradcheck_each_input(const char *label, guint n_inputs, QkvTensor *const *inputs,
                     QkvCheckBuildFunc build, gpointer user_data)
{
  g_assert_cmpuint(n_inputs, <=, 4);
  for (guint i = 0; i < n_inputs; i++) {
    gboolean check[4] = {FALSE, FALSE, FALSE, FALSE};
    check[i] = TRUE;
    g_autofree gchar *l = g_strdup_printf("%s, input %u", label, i);
    qkv_test_gradcheck(l, n_inputs, inputs, check, build, user_data);
  }
}

/* Push values off the kink of relu: |x| < margin becomes ±(margin + |x|). */
static void
avoid_zero(QkvTensor *t, float margin)
{
  float *v = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    if (fabsf(v[i]) < margin)
      v[i] = v[i] < 0 ? -(margin + fabsf(v[i])) : margin + fabsf(v[i]);
}

static void
test_binary_gradients(void)
{
  const struct {
    QkvShape a, b;
  } pairs[] = {
      {QKV_SHAPE(3, 4), QKV_SHAPE(3, 4)},       {QKV_SHAPE(3, 4), QKV_SHAPE(4)},
      {QKV_SHAPE(4), QKV_SHAPE(3, 4)},          {QKV_SHAPE(2, 1, 3), QKV_SHAPE(1, 4, 1)},
      {qkv_shape_scalar(), QKV_SHAPE(2, 3)},    {QKV_SHAPE(2, 3), qkv_shape_scalar()},
      {QKV_SHAPE(2, 3, 4), QKV_SHAPE(3, 1)},    {QKV_SHAPE(1, 3), QKV_SHAPE(3, 1)},
      {qkv_shape_scalar(), qkv_shape_scalar()},
  };
  for (gsize p = 0; p < G_N_ELEMENTS(pairs); p++) {
    for (gsize k = 0; k < G_N_ELEMENTS(binary_cases); k++) {
      const BinaryCase *c = &binary_cases[k];
      g_autoptr(QkvTensor) a = qkv_test_uniform(&pairs[p].a, 21 + (guint32)p, -1, 1);
      g_autoptr(QkvTensor) b = strcmp(c->name, "div") == 0
                                   ? qkv_test_uniform(&pairs[p].b, 31 + (guint32)p, 0.5f, 2)
                                   : qkv_test_uniform(&pairs[p].b, 31 + (guint32)p, -1, 1);
      QkvTensor *in[] = {a, b};
      g_autofree gchar *sa = qkv_shape_to_string(&pairs[p].a);
      g_autofree gchar *sb = qkv_shape_to_string(&pairs[p].b);
      g_autofree gchar *label = g_strdup_printf("%s %s %s", c->name, sa, sb);
      gradcheck_each_input(label, 2, in, build_binary, (gpointer)c);
    }
  }
}

static QkvValue *
build_square(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  /* The same value as both operands: the two contributions must add up. */
  const BinaryCase *c = user_data;
  return c->fn(in[0], in[0], error);
}

static void
test_same_value_both_operands(void)
{
  QkvShape s = QKV_SHAPE(2, 5);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 5, 0.5f, 2);
  for (gsize k = 0; k < G_N_ELEMENTS(binary_cases); k++) {
    g_autofree gchar *label = g_strdup_printf("%s(x, x)", binary_cases[k].name);
    qkv_test_gradcheck(label, 1, &x, NULL, build_square, (gpointer)&binary_cases[k]);
  }
  /* and the forward value of x·x */
  const float xv[] = {1.5f, -2};
  QkvShape s2 = QKV_SHAPE(2);
  g_autoptr(QkvTensor) t = qkv_tensor_new_f32(&s2, xv);
  g_autoptr(QkvTensor) sq = qkv_test_eval(1, &t, build_square, (gpointer)&binary_cases[2]);
  const float want[] = {2.25f, 4};
  qkv_assert_values(sq, want, 2, 1e-7);
}

static void
test_unary_gradients(void)
{
  const QkvShape shapes[] = {qkv_shape_scalar(), QKV_SHAPE(5), QKV_SHAPE(3, 4), QKV_SHAPE(2, 3, 4)};
  for (gsize s = 0; s < G_N_ELEMENTS(shapes); s++) {
    for (gsize k = 0; k < G_N_ELEMENTS(unary_cases); k++) {
      const UnaryCase *c = &unary_cases[k];
      g_autoptr(QkvTensor) x = NULL;
      if (strcmp(c->name, "log") == 0)
        x = qkv_test_uniform(&shapes[s], 41 + (guint32)s, 0.5f, 3);
      else
        x = qkv_test_uniform(&shapes[s], 41 + (guint32)s, -2, 2);
      if (strcmp(c->name, "relu") == 0)
        avoid_zero(x, 0.05f);
      g_autofree gchar *ss = qkv_shape_to_string(&shapes[s]);
      g_autofree gchar *label = g_strdup_printf("%s %s", c->name, ss);
      qkv_test_gradcheck(label, 1, &x, NULL, build_unary, (gpointer)c);
    }
    double factor = -1.5;
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[s], 51 + (guint32)s, -2, 2);
    qkv_test_gradcheck("scale", 1, &x, NULL, build_scale, &factor);
  }
}

static void
test_backward_op_gradients(void)
{
  /* Gradients of the gradient ops (second derivatives), in dy and in y. */
  QkvShape s = QKV_SHAPE(3, 4);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&s, 61, -1, 1);
  g_autoptr(QkvTensor) y_relu = qkv_test_uniform(&s, 62, -1, 1);
  avoid_zero(y_relu, 0.05f);
  g_autoptr(QkvTensor) y_sigmoid = qkv_test_uniform(&s, 63, 0.05f, 0.95f);
  g_autoptr(QkvTensor) y_tanh = qkv_test_uniform(&s, 64, -0.95f, 0.95f);

  BackwardCase relu = {qkv_relu_backward}, sigmoid = {qkv_sigmoid_backward},
               tanh_case = {qkv_tanh_backward};
  QkvTensor *in_relu[] = {dy, y_relu};
  /* relu_backward is flat in y away from 0: the analytic gradient there is 0. */
  gradcheck_each_input("relu_backward", 2, in_relu, build_backward, &relu);
  QkvTensor *in_sigmoid[] = {dy, y_sigmoid};
  gradcheck_each_input("sigmoid_backward", 2, in_sigmoid, build_backward, &sigmoid);
  QkvTensor *in_tanh[] = {dy, y_tanh};
  gradcheck_each_input("tanh_backward", 2, in_tanh, build_backward, &tanh_case);
}

static QkvValue *
build_activation_stack(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  /* log(sigmoid(tanh(x · w) + b) · exp(x)) exercises the rules together. */
  QkvValue *v = qkv_mul(in[0], in[1], error);
  v = v ? qkv_tanh(v, error) : NULL;
  v = v ? qkv_add(v, in[2], error) : NULL;
  v = v ? qkv_sigmoid(v, error) : NULL;
  QkvValue *e = v ? qkv_exp(in[0], error) : NULL;
  v = e ? qkv_mul(v, e, error) : NULL;
  return v ? qkv_log(v, error) : NULL;
}

static void
test_composite_gradient(void)
{
  QkvShape sx = QKV_SHAPE(4, 3), sw = QKV_SHAPE(3), sb = QKV_SHAPE(4, 1);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&sx, 71, -1, 1);
  g_autoptr(QkvTensor) w = qkv_test_uniform(&sw, 72, -1, 1);
  g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 73, -1, 1);
  QkvTensor *in[] = {x, w, b};
  gradcheck_each_input("log(sigmoid(tanh(x·w) + b)·exp(x))", 3, in, build_activation_stack, NULL);
}

/* ---- bad input ---- */

static void
assert_error_names_op(GError *error, gint code, const char *op)
{
  g_assert_error(error, QKV_ERROR, code);
  g_test_message("%s", error->message);
  g_assert_nonnull(strstr(error->message, op));
}

static void
test_errors(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s34 = QKV_SHAPE(3, 4), s5 = QKV_SHAPE(5), s43 = QKV_SHAPE(4, 3), s4 = QKV_SHAPE(4);
  QkvValue *a = qkv_graph_input(g, "a", QKV_F32, &s34, NULL);
  QkvValue *b = qkv_graph_input(g, "b", QKV_F32, &s5, NULL);
  QkvValue *c = qkv_graph_input(g, "c", QKV_F32, &s43, NULL);
  QkvValue *d = qkv_graph_input(g, "d", QKV_F32, &s4, NULL);
  QkvValue *ids = qkv_graph_input(g, "ids", QKV_I32, &s34, NULL);
  g_assert_nonnull(a);
  g_assert_nonnull(ids);
  guint n_nodes = qkv_graph_n_nodes(g);

  /* shapes that do not broadcast */
  for (gsize k = 0; k < G_N_ELEMENTS(binary_cases); k++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(binary_cases[k].fn(a, b, &error));
    assert_error_names_op(error, QKV_ERROR_SHAPE, binary_cases[k].name);
    g_clear_error(&error);
    g_assert_null(binary_cases[k].fn(a, c, &error));
    assert_error_names_op(error, QKV_ERROR_SHAPE, binary_cases[k].name);
  }

  /* i32 where f32 is needed, on either side and for unary ops */
  for (gsize k = 0; k < G_N_ELEMENTS(binary_cases); k++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(binary_cases[k].fn(a, ids, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, binary_cases[k].name);
    g_clear_error(&error);
    g_assert_null(binary_cases[k].fn(ids, a, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, binary_cases[k].name);
  }
  for (gsize k = 0; k < G_N_ELEMENTS(unary_cases); k++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(unary_cases[k].fn(ids, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, unary_cases[k].name);
  }
  {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_scale(ids, 2.0, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, "scale");
  }

  /* scale: missing factor, factor of the wrong type, an unknown attribute */
  {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_graph_op(g, "scale", &a, 1, NULL, &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "scale");
    g_clear_error(&error);
    g_assert_null(
        qkv_graph_op(g, "scale", &a, 1, g_variant_new_parsed("{'factor': <'two'>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "scale");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "scale", &a, 1,
                               g_variant_new_parsed("{'factor': <2.0>, 'offset': <1.0>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "scale");
    g_clear_error(&error);
    /* an integer factor is accepted and converted */
    QkvValue *ok = qkv_graph_op(g, "scale", &a, 1, g_variant_new_parsed("{'factor': <3>}"), &error);
    g_assert_no_error(error);
    g_assert_nonnull(ok);
    n_nodes++;
  }

  /* wrong number of inputs */
  {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_graph_op(g, "add", &a, 1, NULL, &error));
    assert_error_names_op(error, QKV_ERROR_ARITY, "add");
    g_clear_error(&error);
    QkvValue *three[] = {a, a, a};
    g_assert_null(qkv_graph_op(g, "relu", three, 2, NULL, &error));
    assert_error_names_op(error, QKV_ERROR_ARITY, "relu");
  }

  /* gradient ops: dy and y must match exactly (no broadcasting) */
  {
    const struct {
      const char *name;
      BinaryFn fn;
    } backward[] = {{"relu_backward", qkv_relu_backward},
                    {"sigmoid_backward", qkv_sigmoid_backward},
                    {"tanh_backward", qkv_tanh_backward}};
    for (gsize k = 0; k < G_N_ELEMENTS(backward); k++) {
      g_autoptr(GError) error = NULL;
      g_assert_null(backward[k].fn(a, d, &error));
      assert_error_names_op(error, QKV_ERROR_SHAPE, backward[k].name);
      g_clear_error(&error);
      g_assert_null(backward[k].fn(a, ids, &error));
      assert_error_names_op(error, QKV_ERROR_DTYPE, backward[k].name);
    }
  }

  /* every failure left the graph as it was */
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);

  /* and valid nodes still go in */
  g_autoptr(GError) error = NULL;
  QkvValue *sum = qkv_add(a, d, &error);
  g_assert_no_error(error);
  g_assert_nonnull(sum);
  g_assert_true(qkv_shape_equal(qkv_value_shape(sum), &s34));
}

static void
test_registered(void)
{
  const char *names[] = {"add",
                         "sub",
                         "mul",
                         "div",
                         "scale",
                         "neg",
                         "relu",
                         "sigmoid",
                         "tanh",
                         "exp",
                         "log",
                         "relu_backward",
                         "sigmoid_backward",
                         "tanh_backward"};
  qkv_init();
  for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
    const QkvOpDef *def = qkv_op_lookup(names[i]);
    g_assert_nonnull(def);
    g_assert_cmpstr(def->name, ==, names[i]);
    g_assert_nonnull(def->gradient);
    g_assert_true(def->flags & QKV_OP_INPLACE);
    g_assert_cmpstr(qkv_op_origin(names[i]), ==, "built-in");
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/ops/elementwise/registered", test_registered);
  g_test_add_func("/ops/elementwise/add-values", test_add_values);
  g_test_add_func("/ops/elementwise/sub-values", test_sub_values);
  g_test_add_func("/ops/elementwise/mul-values", test_mul_values);
  g_test_add_func("/ops/elementwise/div-values", test_div_values);
  g_test_add_func("/ops/elementwise/scale-neg-values", test_scale_neg_values);
  g_test_add_func("/ops/elementwise/activation-values", test_activation_values);
  g_test_add_func("/ops/elementwise/sigmoid-tails", test_sigmoid_tails);
  g_test_add_func("/ops/elementwise/backward-values", test_backward_values);
  g_test_add_func("/ops/elementwise/broadcast-paths", test_broadcast_paths);
  g_test_add_func("/ops/elementwise/unary-large", test_unary_large);
  g_test_add_func("/ops/elementwise/inplace-chain", test_inplace_chain);
  g_test_add_func("/ops/elementwise/binary-gradients", test_binary_gradients);
  g_test_add_func("/ops/elementwise/same-value-both-operands", test_same_value_both_operands);
  g_test_add_func("/ops/elementwise/unary-gradients", test_unary_gradients);
  g_test_add_func("/ops/elementwise/backward-op-gradients", test_backward_op_gradients);
  g_test_add_func("/ops/elementwise/composite-gradient", test_composite_gradient);
  g_test_add_func("/ops/elementwise/errors", test_errors);
  return g_test_run();
}
