/* test-ops-activations.c: "gelu" (exact and tanh), "silu", "rms_norm" and
 * their fused backward ops, qkv_vec_erf, and "pow" by integer exponents:
 * values against double-precision formulas, finite-difference gradients
 * (second order for the activations), agreement with the same computation
 * from primitive ops and across thread counts, bad input, and numbers from
 * PyTorch (tests/reference/activations_ref.py → tests/data/activations_ref.txt).
 *
 * Bounds follow tests/test-util.h: |actual − expected| ≤ factor · u · m
 * element by element, u = 2^-24, with the magnitude m and the factor derived
 * at each check from the roundings on the value's path. */
#include "test-util.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define U QKV_TEST_U
#define MAX_INPUTS 4

/* ---- helpers -------------------------------------------------------------- */

static QkvTensor *
tensor_from(const QkvShape *shape, const double *values)
{
  QkvTensor *t = qkv_tensor_new(QKV_F32, shape);
  float *d = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    d[i] = (float)values[i];
  return t;
}

/* The same floats, bit for bit (infinities and NaNs included). */
static void
assert_same_floats(const QkvTensor *a, const QkvTensor *b)
{
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(a), qkv_tensor_shape(b)));
  g_assert_cmpmem(qkv_tensor_const_data(a), qkv_tensor_nbytes(a), qkv_tensor_const_data(b),
                  qkv_tensor_nbytes(b));
}

/* A spread of arguments for the activations: the grid −9 … 9 in steps of
 * 1/8 (0 and small values included), then the far tails. */
static QkvTensor *
activation_grid(void)
{
  enum { N_GRID = 145 };
  double v[N_GRID + 4];
  for (gint i = 0; i < N_GRID; i++)
    v[i] = -9.0 + i / 8.0;
  v[N_GRID] = -30, v[N_GRID + 1] = 30, v[N_GRID + 2] = -100, v[N_GRID + 3] = 1e-30;
  QkvShape s = QKV_SHAPE(N_GRID + 4);
  return tensor_from(&s, v);
}

typedef struct {
  QkvTensor *out;
  QkvTensor *grads[MAX_INPUTS];
  guint n;
} Run;

static void
run_clear(Run *r)
{
  qkv_tensor_free(r->out);
  for (guint i = 0; i < r->n; i++)
    qkv_tensor_free(r->grads[i]);
  memset(r, 0, sizeof(*r));
}

/* Build on inputs, reduce to Σ out · w (w given, or uniform in [−1, 1) from a
 * fixed seed), differentiate, run once on n_threads (0: the default). */
static void
run_with_grads(guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build, gpointer user_data,
               const QkvTensor *weights, gint n_threads, Run *run)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[MAX_INPUTS];
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] = qkv_test_input(g, name, qkv_tensor_dtype(inputs[i]), *qkv_tensor_shape(inputs[i]));
    qkv_value_set_requires_grad(in[i], TRUE);
  }
  QkvValue *out = build(g, in, user_data, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) w = weights != NULL ? qkv_tensor_copy(weights)
                                           : qkv_test_uniform(qkv_value_shape(out), 99, -1, 1);
  QkvValue *loss =
      qkv_sum(qkv_mul(out, qkv_graph_constant(g, w, &error), &error), NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvValue *outs[MAX_INPUTS + 1] = {out};
  for (guint i = 0; i < n; i++)
    outs[i + 1] = qkv_graph_gradient(g, in[i]);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.n_threads = n_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n + 1, &opts, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, inputs[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  run->n = n;
  run->out = qkv_tensor_copy(qkv_plan_output(plan, 0));
  for (guint i = 0; i < n; i++)
    run->grads[i] = qkv_tensor_copy(qkv_plan_output(plan, i + 1));
}

/* ---- the activations ------------------------------------------------------ */

typedef enum {
  ACT_GELU,
  ACT_GELU_TANH,
  ACT_SILU,
} Act;

static const gchar *const act_names[] = {"gelu", "gelu tanh", "silu"};

static QkvValue *
build_act(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  switch (*(const Act *)user_data) {
  case ACT_GELU:
    return qkv_gelu(in[0], NULL, error);
  case ACT_GELU_TANH:
    return qkv_gelu(in[0], "tanh", error);
  default:
    return qkv_silu(in[0], error);
  }
}

/* The backward op on its own: inputs dy, x. */
static QkvValue *
build_act_backward(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  switch (*(const Act *)user_data) {
  case ACT_GELU:
    return qkv_gelu_backward(in[0], in[1], "none", error);
  case ACT_GELU_TANH:
    return qkv_gelu_backward(in[0], in[1], "tanh", error);
  default:
    return qkv_silu_backward(in[0], in[1], error);
  }
}

#define GELU_BETA 0.79788456080286535588 /* √(2/π) */
#define GELU_KAPPA 0.044715

/* f(x) and f'(x) in double. */
static void
act_exact(Act act, double x, double *f, double *df)
{
  if (act == ACT_GELU) {
    double cdf = 0.5 * (1 + erf(x / sqrt(2.0))), pdf = exp(-0.5 * x * x) / sqrt(2 * G_PI);
    *f = x * cdf;
    *df = cdf + x * pdf;
  } else if (act == ACT_GELU_TANH) {
    double t = tanh(GELU_BETA * (x + GELU_KAPPA * x * x * x));
    *f = 0.5 * x * (1 + t);
    *df = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_BETA * (1 + 3 * GELU_KAPPA * x * x);
  } else {
    double s = 1 / (1 + exp(-x));
    *f = x * s;
    *df = s * (1 + x * (1 - s));
  }
}

/* The bounds of one float32 evaluation, in u times m = |x| for f (|f| ≤ |x|
 * for all three) and m = |dy| (1 + |x|) for dy · f', whose terms are at most
 * 1 and about |x| in size:
 *
 *  - gelu: x/√2 rounds (u, moving erf by at most max z·erf'(z) · u = 0.49 u),
 *    erf is within 1 ulp (2 u), 1 + erf rounds (2 u, as |1 + erf| ≤ 2): the
 *    factor 1 + erf is off by 4.5 u, times |x|/2, and the product rounds once
 *    (u |x|): 3.25 u |x|.
 *  - gelu tanh: the argument β (x + κ x³) carries 5 roundings, relative to
 *    itself (x and κ x³ have one sign), moving tanh by at most
 *    max z·sech²(z) · 5 u = 2.3 u; tanh 1 ulp (2 u) and 1 + t (2 u): 6.3 u
 *    times |x|/2, and the product: 4.2 u |x|.
 *  - silu: exp(−|x|) 1 ulp, 1 + e, the division and the product: 5 u |x|.
 *  - the derivatives add, per term, the same kind of roundings and the
 *    products and sums that combine them (exp(−x²/2) carries x²/2 · u
 *    relative from its argument, but it multiplies x φ(x), whose x³ φ(x) / 2
 *    is at most 0.23): at most 8 u of |dy| (1 + |x|).
 *
 * Against a double-precision evaluation rounded to float32 add ½ u. */
static const double act_forward_factor[] = {3.25, 4.2, 5};
#define ACT_BACKWARD_FACTOR 8.0

/* The magnitudes of f and dy · f' at x. */
static QkvTensor *
backward_magnitude(const QkvTensor *dy, const QkvTensor *x)
{
  QkvTensor *m = qkv_tensor_new(QKV_F32, qkv_tensor_shape(x));
  for (gint64 i = 0; i < qkv_tensor_numel(x); i++)
    qkv_tensor_f32(m)[i] = (float)(fabs(qkv_tensor_get(dy, i)) * (1 + fabs(qkv_tensor_get(x, i))));
  return m;
}

static void
test_vec_erf(void)
{
  /* a length that is no multiple of the vector width, so the tail runs */
  const gsize n = 1003;
  g_autofree float *x = g_new(float, n), *y = g_new(float, n);
  for (gsize i = 0; i < n; i++)
    x[i] = (float)(-6.0 + 12.0 * i / (n - 1));
  qkv_vec_erf(y, x, n);
  for (gsize i = 0; i < n; i++) {
    /* SLEEF's 1-ulp erf: 1 ulp is at most 2 u relative */
    double want = erf((double)x[i]);
    if (!(fabs(y[i] - want) <= 2 * U * fabs(want) + 1e-45))
      g_error("qkv_vec_erf(%.9g) = %.9g, erf = %.17g (%s)", x[i], y[i], want, qkv_vec_isa());
  }
  /* in place, the same numbers */
  qkv_vec_erf(x, x, n);
  g_assert_cmpmem(x, n * sizeof(float), y, n * sizeof(float));
  g_assert_cmpfloat(y[n / 2 - 1], <, 0); /* odd */
}

/* Output and gradient of each activation against its double-precision
 * formulas, bounded as above. */
static void
test_act_values(void)
{
  g_autoptr(QkvTensor) x = activation_grid();
  g_autoptr(QkvTensor) dy = qkv_test_uniform(qkv_tensor_shape(x), 7, -1, 1);
  g_autoptr(QkvTensor) mx = qkv_test_abs(x);
  g_autoptr(QkvTensor) mdx = backward_magnitude(dy, x);
  const gint64 n = qkv_tensor_numel(x);
  for (Act act = ACT_GELU; act <= ACT_SILU; act++) {
    g_autofree double *f = g_new(double, n), *dx = g_new(double, n);
    for (gint64 i = 0; i < n; i++) {
      double df;
      act_exact(act, qkv_tensor_get(x, i), &f[i], &df);
      dx[i] = qkv_tensor_get(dy, i) * df;
    }
    g_autoptr(QkvTensor) want_f = tensor_from(qkv_tensor_shape(x), f);
    g_autoptr(QkvTensor) want_dx = tensor_from(qkv_tensor_shape(x), dx);
    Run r = {0};
    run_with_grads(1, &x, build_act, &act, dy, 0, &r);
    g_autofree gchar *lf = g_strdup_printf("%s vs double", act_names[act]);
    g_autofree gchar *ld = g_strdup_printf("%s' vs double", act_names[act]);
    qkv_assert_bounded(lf, r.out, want_f, mx, act_forward_factor[act] + 0.5);
    qkv_assert_bounded(ld, r.grads[0], want_dx, mdx, ACT_BACKWARD_FACTOR + 0.5);
    run_clear(&r);
  }
}

/* Values that must come out exactly. */
static void
test_act_special(void)
{
  const float xv[] = {0.0f, -0.0f, 40.0f, -40.0f, INFINITY};
  QkvShape s = QKV_SHAPE(G_N_ELEMENTS(xv));
  g_autoptr(QkvTensor) x = qkv_tensor_new_f32(&s, xv);
  for (Act act = ACT_GELU; act <= ACT_SILU; act++) {
    g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_act, &act);
    g_assert_cmpfloat(qkv_tensor_get(y, 0), ==, 0.0);
    g_assert_cmpfloat(qkv_tensor_get(y, 1), ==, 0.0);
    g_assert_cmpfloat(qkv_tensor_get(y, 2), ==, 40.0); /* Φ(40), tanh, sigmoid round to 1 */
    g_assert_cmpfloat(fabs(qkv_tensor_get(y, 3)), <, 1e-15);
    g_assert_cmpfloat(qkv_tensor_get(y, 4), ==, INFINITY);
  }
}

static void
test_act_grad(void)
{
  QkvShape s = QKV_SHAPE(3, 17);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 3, -3.5f, 3.5f);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&s, 4, -1, 1);
  for (Act act = ACT_GELU; act <= ACT_SILU; act++) {
    qkv_test_gradcheck(act_names[act], 1, &x, NULL, build_act, &act);
    /* the backward op, in dy and in x: the second derivative */
    QkvTensor *in[] = {dy, x};
    g_autofree gchar *label = g_strdup_printf("%s backward", act_names[act]);
    qkv_test_gradcheck(label, 2, in, NULL, build_act_backward, &act);
  }
}

/* gelu of a gelu: the second-order rule of gelu_backward runs inside a
 * gradient graph and is checked through it. */
static QkvValue *
build_act_twice(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *h = build_act(g, in, user_data, error);
  return h ? build_act(g, &h, user_data, error) : NULL;
}

static void
test_act_in_place(void)
{
  /* The second activation reads an intermediate no later node reads: the
   * plan may run it in place. Both runs agree with one computed apart. */
  QkvShape s = QKV_SHAPE(1000);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 5, -4, 4);
  for (Act act = ACT_GELU; act <= ACT_SILU; act++) {
    g_autoptr(QkvTensor) twice = qkv_test_eval(1, &x, build_act_twice, &act);
    g_autoptr(QkvTensor) once = qkv_test_eval(1, &x, build_act, &act);
    g_autoptr(QkvTensor) again = qkv_test_eval(1, &once, build_act, &act);
    assert_same_floats(twice, again);
    qkv_test_gradcheck(act_names[act], 1, &x, NULL, build_act_twice, &act);
  }
}

/* The tanh form is within 5e-4 of the exact one (4.7e-4 at its worst, near
 * x = ±2), and not equal to it. */
static void
test_gelu_forms_differ_little(void)
{
  g_autoptr(QkvTensor) x = activation_grid();
  Act exact = ACT_GELU, approx = ACT_GELU_TANH;
  g_autoptr(QkvTensor) a = qkv_test_eval(1, &x, build_act, &exact);
  g_autoptr(QkvTensor) b = qkv_test_eval(1, &x, build_act, &approx);
  double worst = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(x); i++)
    worst = MAX(worst, fabs(qkv_tensor_get(a, i) - qkv_tensor_get(b, i)));
  g_assert_cmpfloat(worst, <, 5e-4);
  g_assert_cmpfloat(worst, >, 1e-5); /* and they are two functions */
}

/* ---- rms_norm ------------------------------------------------------------- */

typedef struct {
  double eps;
  gboolean weight;
} RmsArgs;

static QkvValue *
build_rms(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const RmsArgs *a = user_data;
  return qkv_rms_norm(in[0], a->weight ? in[1] : NULL, a->eps, error);
}

/* x · exp(−½ log(mean(x²) + eps)) · weight from primitive ops. */
static QkvValue *
build_rms_composite(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const RmsArgs *a = user_data;
  const gint last = -1;
  QkvValue *ms = qkv_mean(qkv_mul(in[0], in[0], error), &last, 1, TRUE, error);
  QkvValue *ve = ms ? qkv_add(ms, qkv_graph_scalar(g, (float)a->eps), error) : NULL;
  QkvValue *rstd = qkv_exp(qkv_scale(qkv_log(ve, error), -0.5, error), error);
  QkvValue *y = qkv_mul(in[0], rstd, error);
  return a->weight ? qkv_mul(y, in[1], error) : y;
}

static void
rms_inputs(const QkvShape *xs, guint32 seed, QkvTensor **t)
{
  QkvShape ds = QKV_SHAPE(xs->dims[xs->rank - 1]);
  t[0] = qkv_test_uniform(xs, seed, -2, 2);
  t[1] = qkv_test_uniform(&ds, seed + 1, 0.5f, 1.5f);
}

/* Two float32 computations of rms_norm over rows of d (x O(1)): the sum of
 * squares and the backward's Σ g·x̂ (d terms each), dweight over all rows,
 * and the square root, reciprocal and products: 8 u; twice that. */
static double
rms_factor(QkvTensor *const *t)
{
  const QkvShape *s = qkv_tensor_shape(t[0]);
  gint64 d = s->dims[s->rank - 1], rows = qkv_tensor_numel(t[0]) / d;
  return 2.0 * (2 * qkv_test_sum_factor(d) + qkv_test_sum_factor(rows) + 8);
}

static void
test_rms_values(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 4));
  QkvValue *w = qkv_test_input(g, "w", QKV_F32, QKV_SHAPE(4));
  QkvValue *y = qkv_rms_norm(x, w, 1e-6, &error);
  QkvValue *y_plain = qkv_rms_norm(x, NULL, 1e-6, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(y);
  g_assert_cmpstr(qkv_node_op_name(node), ==, "rms_norm");
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 2);
  QkvValue *outs[] = {y, qkv_node_output(node, 1), y_plain};
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  /* row 0: mean square (1 + 4 + 4 + 16) / 4 = 6.25, rms 2.5; row 1 zeros */
  const float xv[] = {1, -2, 2, 4, 0, 0, 0, 0}, wv[] = {1, 2, 0.5f, -1};
  QkvShape s24 = QKV_SHAPE(2, 4), s4 = QKV_SHAPE(4);
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(&s24, xv);
  g_autoptr(QkvTensor) tw = qkv_tensor_new_f32(&s4, wv);
  g_assert_true(qkv_plan_bind(plan, "x", tx, NULL) && qkv_plan_bind(plan, "w", tw, NULL));
  g_assert_true(qkv_plan_run(plan, &error));
  double rs = 1.0 / sqrt(6.25 + 1e-6);
  const float want_y[] = {(float)rs, (float)(-4 * rs), (float)rs, (float)(-4 * rs), 0, 0, 0, 0};
  const float want_plain[] = {
      (float)rs, (float)(-2 * rs), (float)(2 * rs), (float)(4 * rs), 0, 0, 0, 0};
  const float want_rstd[] = {(float)rs, (float)(1.0 / sqrt(1e-6))};
  qkv_assert_values(qkv_plan_output(plan, 0), want_y, 8, 4 * U);
  qkv_assert_values(qkv_plan_output(plan, 2), want_plain, 8, 4 * U);
  QkvShape s2 = QKV_SHAPE(2);
  g_autoptr(QkvTensor) rstd = qkv_tensor_new_f32(&s2, want_rstd);
  qkv_assert_tensor_close(qkv_plan_output(plan, 1), rstd, 2 * U);
}

static void
test_rms_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(5), QKV_SHAPE(3, 7), QKV_SHAPE(2, 3, 13), QKV_SHAPE(4, 1)};
  RmsArgs with = {1e-6, TRUE}, without = {1e-6, FALSE}, big = {0.5, TRUE};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    QkvTensor *t[2];
    rms_inputs(&shapes[i], 10 + 3 * i, t);
    qkv_test_gradcheck("rms_norm", 2, t, NULL, build_rms, &with);
    qkv_test_gradcheck("rms_norm without weight", 1, t, NULL, build_rms, &without);
    qkv_test_gradcheck("rms_norm eps 0.5", 2, t, NULL, build_rms, &big);
    qkv_tensor_free(t[0]);
    qkv_tensor_free(t[1]);
  }
}

static void
test_rms_composite_and_threads(void)
{
  QkvShape s = QKV_SHAPE(6, 9, 40);
  QkvTensor *t[2];
  rms_inputs(&s, 50, t);
  RmsArgs cases[] = {{1e-6, TRUE}, {1e-5, FALSE}};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    guint n = cases[c].weight ? 2 : 1;
    Run fused = {0}, composite = {0}, one = {0}, three = {0};
    run_with_grads(n, t, build_rms, &cases[c], NULL, 0, &fused);
    run_with_grads(n, t, build_rms_composite, &cases[c], NULL, 0, &composite);
    run_with_grads(n, t, build_rms, &cases[c], NULL, 1, &one);
    run_with_grads(n, t, build_rms, &cases[c], NULL, 3, &three);
    double factor = rms_factor(t);
    qkv_assert_scaled("rms_norm vs composite", fused.out, composite.out, factor);
    qkv_assert_scaled("3 threads vs 1", three.out, one.out, factor);
    for (guint i = 0; i < n; i++) {
      qkv_assert_scaled("rms_norm gradient vs composite", fused.grads[i], composite.grads[i],
                        factor);
      qkv_assert_scaled("rms_norm gradient, 3 threads vs 1", three.grads[i], one.grads[i], factor);
    }
    run_clear(&fused);
    run_clear(&composite);
    run_clear(&one);
    run_clear(&three);
  }
  qkv_tensor_free(t[0]);
  qkv_tensor_free(t[1]);
}

static void
test_rms_saved_output(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 4));
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_rms_norm(x, NULL, 1e-6, &error);
  QkvValue *rstd = qkv_node_output(qkv_value_node(y), 1);
  QkvValue *loss = qkv_sum(rstd, NULL, 0, FALSE, &error);
  g_assert_false(qkv_graph_backward(g, loss, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT);
}

/* ---- pow by integers ------------------------------------------------------ */

static QkvValue *
build_pow(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_pow(in[0], *(const double *)user_data, error);
}

/* pow on an intermediate no later node reads: a plan may run it in place. */
static QkvValue *
build_pow_of_copy(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *copy = qkv_scale(in[0], 1.0, error);
  return copy ? qkv_pow(copy, *(const double *)user_data, error) : NULL;
}

/* The integer path's bound (ops/math.c): x^|p| by multiplications is within
 * γ(|p| − 1) of the exact value, relative, and a reciprocal rounds once more. */
static double
pow_int_factor(gint p)
{
  return qkv_test_gamma(ABS(p) - 1 + (p < 0 ? 1 : 0)) / U;
}

static void
test_pow_int_values(void)
{
  QkvShape s = QKV_SHAPE(2000);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 9, -2, 2);
  for (gint p = -16; p <= 16; p++) {
    double pd = p;
    g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_pow, &pd);
    g_autoptr(QkvTensor) y2 = qkv_test_eval(1, &x, build_pow_of_copy, &pd);
    assert_same_floats(y2, y);
    /* the exponents special-cased before are exact forms: one rounding */
    double factor = (p == 0 || p == 1) ? 0 : (p == 2 || p == -1) ? 1 : pow_int_factor(p);
    for (gint64 i = 0; i < qkv_tensor_numel(x); i++) {
      double xv = qkv_tensor_get(x, i), want = pow(xv, p), got = qkv_tensor_get(y, i);
      if (!(fabs(want) >= FLT_MIN && fabs(want) <= FLT_MAX))
        continue; /* out of float32's normal range: test_pow_int_edges */
      if (!(fabs(got - want) <= factor * U * fabs(want)))
        g_error("pow(%.9g, %d) = %.9g, exactly %.17g: off by %.3g u, allowed %.3g", xv, p, got,
                want, fabs(got - want) / (U * fabs(want)), factor);
    }
  }
}

/* Where x^|p| is no normal float the integer path hands the element to powf:
 * the same numbers as powf, including the signs of zeros and infinities. */
static void
test_pow_int_edges(void)
{
  const float xv[] = {1e-3f,     -1e-3f, 1e5f, -1e5f, 1e10f, 3e-6f, 0.0f,   -0.0f, INFINITY,
                      -INFINITY, NAN,    1.0f, -1.0f, 2.0f,  0.5f,  1e-20f, 7e-8f};
  QkvShape s = QKV_SHAPE(G_N_ELEMENTS(xv));
  g_autoptr(QkvTensor) x = qkv_tensor_new_f32(&s, xv);
  const gint ps[] = {3, 4, 5, 8, 15, 16, -2, -3, -5, -8, -16};
  for (guint k = 0; k < G_N_ELEMENTS(ps); k++) {
    double p = ps[k];
    g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_pow, &p);
    for (guint i = 0; i < G_N_ELEMENTS(xv); i++) {
      float got = (float)qkv_tensor_get(y, i), want = powf(xv[i], (float)p);
      gboolean same_class =
          (isnan(got) && isnan(want)) || (got == want && signbit(got) == signbit(want)) ||
          (isfinite(want) && want != 0 &&
           fabs((double)got - want) <= (pow_int_factor(ps[k]) + 2) * U * fabs((double)want));
      if (!same_class)
        g_error("pow(%g, %d) = %.9g, powf gives %.9g", xv[i], ps[k], got, want);
    }
  }
  /* the tiny and the huge: powf's values exactly */
  double p = -8;
  const float big[] = {1e5f}; /* 1e-40, below FLT_MIN */
  QkvShape s1 = QKV_SHAPE(1);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&s1, big);
  g_autoptr(QkvTensor) yb = qkv_test_eval(1, &tb, build_pow, &p);
  g_assert_cmpfloat(qkv_tensor_get(yb, 0), ==, powf(1e5f, -8.0f));
  g_assert_cmpfloat(qkv_tensor_get(yb, 0), >, 0);
}

static void
test_pow_int_grad(void)
{
  QkvShape s = QKV_SHAPE(3, 5);
  /* |x| ≤ 1.2 keeps x^16 small enough that the float32 loss's rounding does
   * not swamp the finite differences, and x ≥ 0.9 keeps the central
   * difference's own error, about eps² (p − 1)(p − 2) / (6 x²) relative,
   * under the check's 2e-2 for p = −16 */
  g_autoptr(QkvTensor) any = qkv_test_uniform(&s, 21, -1.2f, 1.2f);
  g_autoptr(QkvTensor) pos = qkv_test_uniform(&s, 22, 0.9f, 1.3f);
  const gint ps[] = {3, 4, 5, 7, 8, 11, 16, -2, -3, -5, -16};
  for (guint k = 0; k < G_N_ELEMENTS(ps); k++) {
    double p = ps[k];
    g_autofree gchar *label = g_strdup_printf("pow %d", ps[k]);
    qkv_test_gradcheck(label, 1, ps[k] > 0 ? &any : &pos, NULL, build_pow, &p);
  }
}

/* ---- bad input ------------------------------------------------------------ */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 3, 8));
  QkvValue *x2 = qkv_test_input(g, "x2", QKV_F32, QKV_SHAPE(2, 3, 7));
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(2, 8));
  QkvValue *v8 = qkv_test_input(g, "v8", QKV_F32, QKV_SHAPE(8));
  QkvValue *v7 = qkv_test_input(g, "v7", QKV_F32, QKV_SHAPE(7));
  QkvValue *scalar = qkv_test_input(g, "scalar", QKV_F32, qkv_shape_scalar());

  qkv_assert_op_fails(g, "'gelu'", QKV_ERROR_ATTRIBUTE, qkv_gelu(x, "erf", &error_));
  qkv_assert_op_fails(g, "'gelu'", QKV_ERROR_DTYPE, qkv_gelu(xi, NULL, &error_));
  qkv_assert_op_fails(g, "'gelu_backward'", QKV_ERROR_SHAPE,
                      qkv_gelu_backward(x, x2, "tanh", &error_));
  qkv_assert_op_fails(g, "'gelu_backward'", QKV_ERROR_ATTRIBUTE,
                      qkv_gelu_backward(x, x, "Tanh", &error_));
  qkv_assert_op_fails(g, "'silu'", QKV_ERROR_DTYPE, qkv_silu(xi, &error_));
  qkv_assert_op_fails(g, "'silu_backward'", QKV_ERROR_SHAPE, qkv_silu_backward(x, x2, &error_));

  qkv_assert_op_fails(g, "'rms_norm'", QKV_ERROR_SHAPE, qkv_rms_norm(x, v7, 1e-6, &error_));
  qkv_assert_op_fails(g, "'rms_norm'", QKV_ERROR_DTYPE, qkv_rms_norm(xi, NULL, 1e-6, &error_));
  qkv_assert_op_fails(g, "'rms_norm'", QKV_ERROR_SHAPE, qkv_rms_norm(scalar, NULL, 1e-6, &error_));
  qkv_assert_op_fails(g, "'rms_norm'", QKV_ERROR_ATTRIBUTE, qkv_rms_norm(x, v8, -1, &error_));
  QkvValue *three[] = {x, v8, v8};
  qkv_assert_op_fails(g, "rms_norm", QKV_ERROR_ARITY,
                      qkv_graph_op(g, "rms_norm", three, 3, NULL, &error_));

  /* a NULL from an earlier failure passes through, the first error kept */
  g_autoptr(GError) error = NULL;
  QkvValue *bad = qkv_rms_norm(x, v7, 1e-6, &error);
  g_assert_null(bad);
  g_assert_null(qkv_gelu(bad, NULL, &error));
  g_assert_null(qkv_rms_norm(x, bad, 1e-6, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
}

/* ---- against PyTorch ------------------------------------------------------ */

static GHashTable *reference;

static QkvTensor *
ref(const gchar *prefix, const gchar *name)
{
  g_autofree gchar *key = g_strconcat(prefix, "_", name, NULL);
  return qkv_test_ref(reference, key);
}

/* Two evaluations (qkv's and PyTorch's), each within the bound above. */
static void
test_reference_activations(void)
{
  const gchar *prefixes[] = {"gelu", "gelutanh", "silu"};
  for (Act act = ACT_GELU; act <= ACT_SILU; act++) {
    QkvTensor *x = ref(prefixes[act], "x");
    Run r = {0};
    run_with_grads(1, &x, build_act, &act, ref(prefixes[act], "w"), 0, &r);
    g_autoptr(QkvTensor) mx = qkv_test_abs(x);
    g_autoptr(QkvTensor) mdx = backward_magnitude(ref(prefixes[act], "w"), x);
    g_autofree gchar *lf = g_strdup_printf("%s vs PyTorch", prefixes[act]);
    g_autofree gchar *ld = g_strdup_printf("%s' vs PyTorch", prefixes[act]);
    qkv_assert_bounded(lf, r.out, ref(prefixes[act], "out"), mx, 2 * act_forward_factor[act]);
    qkv_assert_bounded(ld, r.grads[0], ref(prefixes[act], "dx"), mdx, 2 * ACT_BACKWARD_FACTOR);
    run_clear(&r);
  }
}

static void
test_reference_rms_norm(void)
{
  RmsArgs with = {1e-6, TRUE}, without = {1e-5, FALSE};
  QkvTensor *in[] = {ref("rms", "x"), ref("rms", "weight")};
  Run r = {0};
  run_with_grads(2, in, build_rms, &with, ref("rms", "w"), 0, &r);
  double factor = rms_factor(in);
  qkv_assert_scaled("rms.out vs PyTorch", r.out, ref("rms", "out"), factor);
  qkv_assert_scaled("rms.dx vs PyTorch", r.grads[0], ref("rms", "dx"), factor);
  qkv_assert_scaled("rms.dweight vs PyTorch", r.grads[1], ref("rms", "dweight"), factor);
  run_clear(&r);
  QkvTensor *x = ref("rmsnw", "x");
  run_with_grads(1, &x, build_rms, &without, ref("rmsnw", "w"), 0, &r);
  factor = rms_factor(&x);
  qkv_assert_scaled("rmsnw.out vs PyTorch", r.out, ref("rmsnw", "out"), factor);
  qkv_assert_scaled("rmsnw.dx vs PyTorch", r.grads[0], ref("rmsnw", "dx"), factor);
  run_clear(&r);
}

/* pow: qkv within γ(|p| − 1) (+ u for a reciprocal) of x^p, PyTorch within 1
 * ulp (2 u) for its pow or 2 roundings for x·x·x and 1/(x·x). The gradient
 * p · x^(p−1) · dy adds the scaling and the product on each side (2 u each)
 * and its pow, bounded the same way for p − 1. */
static void
test_reference_pow(void)
{
  const struct {
    const gchar *prefix;
    gint p;
  } cases[] = {{"powi3", 3},   {"powi4", 4},   {"powi7", 7},  {"powi16", 16},
               {"powim2", -2}, {"powim3", -3}, {"powim5", -5}};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    const gint p = cases[c].p;
    double pd = p;
    QkvTensor *x = ref(cases[c].prefix, "x"), *w = ref(cases[c].prefix, "w");
    Run r = {0};
    run_with_grads(1, &x, build_pow, &pd, w, 0, &r);
    g_autoptr(QkvTensor) my = qkv_tensor_new(QKV_F32, qkv_tensor_shape(x));
    g_autoptr(QkvTensor) mdx = qkv_tensor_new(QKV_F32, qkv_tensor_shape(x));
    for (gint64 i = 0; i < qkv_tensor_numel(x); i++) {
      double xv = qkv_tensor_get(x, i);
      qkv_tensor_f32(my)[i] = (float)fabs(pow(xv, p));
      qkv_tensor_f32(mdx)[i] = (float)fabs(p * pow(xv, p - 1) * qkv_tensor_get(w, i));
    }
    /* exponent p − 1 = 2 or −1 takes the exact forms: one rounding */
    double grad_pow = (p - 1 == 2 || p - 1 == -1) ? 1 : pow_int_factor(p - 1);
    g_autofree gchar *lo = g_strdup_printf("%s.out vs PyTorch", cases[c].prefix);
    g_autofree gchar *lg = g_strdup_printf("%s.dx vs PyTorch", cases[c].prefix);
    /* the magnitudes are rounded to float32 once: ½ u of slack */
    qkv_assert_bounded(lo, r.out, ref(cases[c].prefix, "out"), my, pow_int_factor(p) + 2 + 0.5);
    qkv_assert_bounded(lg, r.grads[0], ref(cases[c].prefix, "dx"), mdx, grad_pow + 2 + 2 + 2 + 0.5);
    run_clear(&r);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  reference = qkv_test_load_reference("activations_ref.txt");
  g_test_add_func("/activations/vec-erf", test_vec_erf);
  g_test_add_func("/activations/values", test_act_values);
  g_test_add_func("/activations/special", test_act_special);
  g_test_add_func("/activations/grad", test_act_grad);
  g_test_add_func("/activations/in-place", test_act_in_place);
  g_test_add_func("/activations/gelu-forms", test_gelu_forms_differ_little);
  g_test_add_func("/rms-norm/values", test_rms_values);
  g_test_add_func("/rms-norm/grad", test_rms_grad);
  g_test_add_func("/rms-norm/composite-and-threads", test_rms_composite_and_threads);
  g_test_add_func("/rms-norm/saved-output", test_rms_saved_output);
  g_test_add_func("/pow-int/values", test_pow_int_values);
  g_test_add_func("/pow-int/edges", test_pow_int_edges);
  g_test_add_func("/pow-int/grad", test_pow_int_grad);
  g_test_add_func("/activations/bad-input", test_bad_input);
  g_test_add_func("/reference/activations", test_reference_activations);
  g_test_add_func("/reference/rms-norm", test_reference_rms_norm);
  g_test_add_func("/reference/pow", test_reference_pow);
  int status = g_test_run();
  g_hash_table_unref(reference);
  return status;
}
