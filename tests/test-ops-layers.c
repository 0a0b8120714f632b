/* test-ops-layers.c: "layer_norm", "position_wise_ffn", "positional_encoding",
 * "additive_attention" and their fused backward ops: finite-difference
 * gradients, agreement with the same computation built from primitive ops,
 * hand-computed values, bad input, and numbers from PyTorch
 * (tests/reference/layers_ref.py → tests/data/layers_ref.txt). */
#include "test-util.h"

#include <math.h>
#include <string.h>

#define MAX_INPUTS 8

/* ---- running a graph with its input gradients --------------------------- */

typedef struct {
  guint n;
  QkvTensor *out;
  QkvTensor *grads[MAX_INPUTS]; /* NULL for i32 inputs */
} Run;

static void
run_clear(Run *r)
{
  qkv_tensor_free(r->out);
  for (guint i = 0; i < r->n; i++)
    qkv_tensor_free(r->grads[i]);
  memset(r, 0, sizeof(*r));
}

/* Build on inputs, reduce the output to Σ out · w (w: the given weights, or
 * fixed random ones), differentiate, run once; the output and d/d input for
 * every f32 input. */
static void
run_with_grads(guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build, gpointer user_data,
               const QkvTensor *weights, gboolean training, gint n_threads, Run *run)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[MAX_INPUTS];
  g_assert_cmpuint(n, <=, MAX_INPUTS);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] =
        qkv_graph_input(g, name, qkv_tensor_dtype(inputs[i]), qkv_tensor_shape(inputs[i]), &error);
    g_assert_no_error(error);
    qkv_value_set_requires_grad(in[i], qkv_tensor_dtype(inputs[i]) == QKV_F32);
  }
  QkvValue *out = build(g, in, user_data, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) w = weights != NULL ? qkv_tensor_copy(weights)
                                           : qkv_test_uniform(qkv_value_shape(out), 99, -1, 1);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(w), qkv_value_shape(out)));
  QkvValue *wv = qkv_graph_constant(g, w, &error);
  QkvValue *loss = qkv_sum(qkv_mul(out, wv, &error), NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);

  QkvValue *outs[MAX_INPUTS + 1] = {out};
  gint slot[MAX_INPUTS];
  guint n_outs = 1;
  for (guint i = 0; i < n; i++) {
    QkvValue *gv = qkv_tensor_dtype(inputs[i]) == QKV_F32 ? qkv_graph_gradient(g, in[i]) : NULL;
    slot[i] = gv != NULL ? (gint)n_outs : -1;
    if (gv != NULL)
      outs[n_outs++] = gv;
  }
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = training;
  opts.n_threads = n_threads;
  opts.seed = 7;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, &opts, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, inputs[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);

  run->n = n;
  run->out = qkv_tensor_copy(qkv_plan_output(plan, 0));
  for (guint i = 0; i < n; i++) {
    run->grads[i] = NULL;
    if (qkv_tensor_dtype(inputs[i]) != QKV_F32)
      continue;
    if (slot[i] >= 0) {
      run->grads[i] = qkv_tensor_copy(qkv_plan_output(plan, (guint)slot[i]));
    } else {
      run->grads[i] = qkv_tensor_new(QKV_F32, qkv_tensor_shape(inputs[i]));
      qkv_tensor_fill(run->grads[i], 0.0);
    }
  }
}

/* |actual − expected| ≤ factor · u · max|expected| element by element
 * (tests/test-util.h): entries well below the tensor's scale come out of
 * cancellations (y = x̂ · gamma + beta near 0; a gradient through a softmax,
 * whose row sums are 0), where float rounding of the O(scale) terms, in either
 * computation, is the whole difference. */
#define assert_close_scaled(actual, expected, factor)                                              \
  qkv_assert_scaled(#actual " vs " #expected, (actual), (expected), (factor))

/* ---- bounds on two float32 computations of one value ----------------------
 *
 * Each op's computations (fused, composite, 1 or 3 threads, PyTorch) evaluate
 * the same formulas with the sums in another order. A float32 sum of n terms
 * is off by at most S(n) = qkv_test_sum_factor(n) times u times the sum of its
 * terms' magnitudes, the errors of the sums on a value's path add up to first
 * order, and two computations differ by twice that. The tensor's scale
 * (max|expected|) stands for the magnitudes (inputs are O(1)); each elementwise
 * function (tanh, exp, division, sqrt) adds about 2 u. The path lengths, from
 * the shapes of the inputs: */

/* layer_norm over rows of d: mean and variance (d terms each), the backward's
 * Σ g and Σ g·x̂ (d each), dgamma and dbeta over all rows; rsqrt, the
 * normalisation and the affine map: 8 u. */
static double
ln_factor(QkvTensor *const *t)
{
  const QkvShape *s = qkv_tensor_shape(t[0]);
  gint64 d = s->dims[s->rank - 1], rows = qkv_tensor_numel(t[0]) / d;
  return 2.0 * (4 * qkv_test_sum_factor(d) + qkv_test_sum_factor(rows) + 8);
}

/* position_wise_ffn x (…, d) · W1ᵀ (f × d) then · W2ᵀ (o × f): forward d and
 * f terms, backward dH = dY W2 (o), dX = dH W1 (f), the weight and bias
 * gradients over all rows; the biases and the ReLU: 4 u. */
static double
ffn_factor(QkvTensor *const *t)
{
  const QkvShape *s = qkv_tensor_shape(t[0]);
  gint64 d = s->dims[s->rank - 1], rows = qkv_tensor_numel(t[0]) / d;
  gint64 f = qkv_tensor_shape(t[1])->dims[0], o = qkv_tensor_shape(t[3])->dims[0];
  return 2.0 * (qkv_test_sum_factor(d) + 2 * qkv_test_sum_factor(f) + qkv_test_sum_factor(o) +
                qkv_test_sum_factor(rows) + 4);
}

/* additive_attention q (b, nq, qs), k (b, nk, ks), v (b, nk, vs), W_q (h, qs),
 * W_k (h, ks), w_v (1, h): forward the projections (qs or ks terms), scores
 * w_v · tanh(…) (h), softmax and weights · v (nk each); backward dP (vs), the
 * softmax backward (nk), the feature gradient summed over keys (nk) or
 * queries (nq) and through w_v (h), the weight gradients over all b·nq·nk
 * features; tanh, exp and the divisions: 12 u. */
static double
aa_factor(QkvTensor *const *t)
{
  const QkvShape *q = qkv_tensor_shape(t[0]), *k = qkv_tensor_shape(t[1]),
                 *v = qkv_tensor_shape(t[2]);
  gint64 b = q->dims[0], nq = q->dims[1], nk = k->dims[1];
  gint64 d_in = MAX(q->dims[2], k->dims[2]), vs = v->dims[2], h = qkv_tensor_shape(t[3])->dims[0];
  return 2.0 * (qkv_test_sum_factor(d_in) + 2 * qkv_test_sum_factor(h) +
                3 * qkv_test_sum_factor(nk) + qkv_test_sum_factor(vs) +
                qkv_test_sum_factor(MAX(nq, nk)) + qkv_test_sum_factor(b * nq * nk) + 12);
}

/* positional_encoding x + P: P's angles pos / 10000^(2i/d) carry about 3 u
 * (relative) from the power and the division, so sin and cos of them are
 * off by up to 3 u · pos + 1 u, and the addition adds 1 u. */
static double
pe_factor_at(QkvTensor *const *t, gint64 offset)
{
  const QkvShape *s = qkv_tensor_shape(t[0]);
  gint64 positions = offset + s->dims[s->rank - 2];
  return 2.0 * (3 * positions + 2);
}

static double
pe_factor(QkvTensor *const *t)
{
  return pe_factor_at(t, 0);
}

/* The fused op and its composite of primitive ops agree on the output and
 * every input gradient within factor · u · (the tensor's scale). */
static void
assert_same_as_composite(const gchar *label, guint n, QkvTensor *const *inputs,
                         QkvCheckBuildFunc fused, QkvCheckBuildFunc composite, gpointer user_data,
                         double factor)
{
  Run a = {0}, b = {0};
  run_with_grads(n, inputs, fused, user_data, NULL, FALSE, 0, &a);
  run_with_grads(n, inputs, composite, user_data, NULL, FALSE, 0, &b);
  g_autofree gchar *lo = g_strdup_printf("%s: output", label);
  qkv_assert_scaled(lo, a.out, b.out, factor);
  for (guint i = 0; i < n; i++) {
    if (a.grads[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s: d input %u", label, i);
    qkv_assert_scaled(li, a.grads[i], b.grads[i], factor);
  }
  run_clear(&a);
  run_clear(&b);
}

/* The same plan run with 1 thread and with several agrees (the per-thread
 * partial sums of the backward ops are sized at compile time): the same bound
 * as two computations of any other kind. */
static void
assert_thread_counts_agree(guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                           gpointer user_data, double factor)
{
  Run a = {0}, b = {0};
  run_with_grads(n, inputs, build, user_data, NULL, FALSE, 1, &a);
  run_with_grads(n, inputs, build, user_data, NULL, FALSE, 3, &b);
  qkv_assert_scaled("3 threads vs 1: output", b.out, a.out, factor);
  for (guint i = 0; i < n; i++)
    if (a.grads[i] != NULL)
      qkv_assert_scaled("3 threads vs 1: gradient", b.grads[i], a.grads[i], factor);
  run_clear(&a);
  run_clear(&b);
}

/* ---- bad input ---------------------------------------------------------- */

/* ========================================================================
 * layer_norm
 * ======================================================================== */

typedef struct {
  double eps;
} LnArgs;

static QkvValue *
build_ln(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const LnArgs *a = user_data;
  return qkv_layer_norm(in[0], in[1], in[2], a->eps, error);
}

/* (x − mean) · exp(−½ log(var + eps)) · gamma + beta from primitive ops. */
static QkvValue *
build_ln_composite(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const LnArgs *a = user_data;
  const gint last = -1;
  QkvValue *mean = qkv_mean(in[0], &last, 1, TRUE, error);
  QkvValue *xc = mean ? qkv_sub(in[0], mean, error) : NULL;
  QkvValue *sq = xc ? qkv_mul(xc, xc, error) : NULL;
  QkvValue *var = sq ? qkv_mean(sq, &last, 1, TRUE, error) : NULL;
  QkvValue *ve = var ? qkv_add(var, qkv_graph_scalar(g, (float)a->eps), error) : NULL;
  QkvValue *lg = ve ? qkv_log(ve, error) : NULL;
  QkvValue *rstd = lg ? qkv_exp(qkv_scale(lg, -0.5, error), error) : NULL;
  QkvValue *xhat = rstd ? qkv_mul(xc, rstd, error) : NULL;
  QkvValue *y = xhat ? qkv_mul(xhat, in[1], error) : NULL;
  return y ? qkv_add(y, in[2], error) : NULL;
}

static void
ln_inputs(const QkvShape *xs, guint32 seed, QkvTensor **t)
{
  QkvShape ds = QKV_SHAPE(xs->dims[xs->rank - 1]);
  t[0] = qkv_test_uniform(xs, seed, -2, 2);
  t[1] = qkv_test_uniform(&ds, seed + 1, 0.5f, 1.5f);
  t[2] = qkv_test_uniform(&ds, seed + 2, -1, 1);
}

static void
free_inputs(guint n, QkvTensor **t)
{
  for (guint i = 0; i < n; i++)
    qkv_tensor_free(t[i]);
}

static void
test_ln_values(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 4));
  QkvValue *gamma = qkv_test_input(g, "gamma", QKV_F32, QKV_SHAPE(4));
  QkvValue *beta = qkv_test_input(g, "beta", QKV_F32, QKV_SHAPE(4));
  QkvValue *y = qkv_layer_norm(x, gamma, beta, 1e-5, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(y);
  g_assert_cmpstr(qkv_node_op_name(node), ==, "layer_norm");
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 3);
  QkvValue *outs[] = {y, qkv_node_output(node, 1), qkv_node_output(node, 2)};
  g_assert_cmpint(qkv_value_shape(outs[1])->rank, ==, 1);
  g_assert_cmpint(qkv_value_shape(outs[1])->dims[0], ==, 2);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  const float xv[] = {1, 2, 3, 4, -1, -1, -1, -1}, gv[] = {1, 2, 1, 1}, bv[] = {0, 0, 0.5f, 0};
  QkvShape s24 = QKV_SHAPE(2, 4), s4 = QKV_SHAPE(4);
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(&s24, xv);
  g_autoptr(QkvTensor) tg = qkv_tensor_new_f32(&s4, gv);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&s4, bv);
  g_assert_true(qkv_plan_bind(plan, "x", tx, NULL) && qkv_plan_bind(plan, "gamma", tg, NULL) &&
                qkv_plan_bind(plan, "beta", tb, NULL));
  g_assert_true(qkv_plan_run(plan, &error));
  /* Row 0: mean 2.5, biased variance 1.25. Row 1 is constant: x̂ = 0. */
  double rs = 1.0 / sqrt(1.25 + 1e-5);
  const float want_y[] = {(float)(-1.5 * rs),
                          (float)(2 * -0.5 * rs),
                          (float)(0.5 * rs + 0.5),
                          (float)(1.5 * rs),
                          0,
                          0,
                          0.5f,
                          0};
  qkv_assert_values(qkv_plan_output(plan, 0), want_y, 8, 1e-6);
  const float want_mean[] = {2.5f, -1}, want_rstd[] = {(float)rs, (float)(1.0 / sqrt(1e-5))};
  qkv_assert_values(qkv_plan_output(plan, 1), want_mean, 2, 1e-6);
  qkv_assert_values(qkv_plan_output(plan, 2), want_rstd, 2, 1e-2);
}

static void
test_ln_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(5), QKV_SHAPE(3, 7), QKV_SHAPE(2, 3, 13), QKV_SHAPE(4, 1),
                       QKV_SHAPE(2, 2, 2, 17)};
  LnArgs args = {1e-5};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    QkvTensor *t[3];
    ln_inputs(&shapes[i], 10 + 3 * i, t);
    qkv_test_gradcheck("layer_norm", 3, t, NULL, build_ln, &args);
    free_inputs(3, t);
  }
  /* A larger eps changes the function; the gradient follows. */
  LnArgs big = {0.5};
  QkvShape s = QKV_SHAPE(3, 6);
  QkvTensor *t[3];
  ln_inputs(&s, 40, t);
  qkv_test_gradcheck("layer_norm eps 0.5", 3, t, NULL, build_ln, &big);
  free_inputs(3, t);
}

/* Forward and backward in double by hand, for x (rows, d) and the
 * reduction weights dy that run_with_grads uses. */
static void
test_ln_double(void)
{
  const gint64 rows = 300, d = 67;
  QkvShape xs = QKV_SHAPE(rows, d);
  QkvTensor *t[3];
  ln_inputs(&xs, 70, t);
  LnArgs args = {1e-5};
  Run run = {0};
  run_with_grads(3, t, build_ln, &args, NULL, FALSE, 0, &run);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&xs, 99, -1, 1);
  g_autoptr(QkvTensor) y = qkv_tensor_new(QKV_F32, &xs);
  g_autoptr(QkvTensor) dx = qkv_tensor_new(QKV_F32, &xs);
  QkvShape ds = QKV_SHAPE(d);
  g_autoptr(QkvTensor) dgamma = qkv_tensor_new(QKV_F32, &ds);
  g_autoptr(QkvTensor) dbeta = qkv_tensor_new(QKV_F32, &ds);
  const float *x = qkv_tensor_f32(t[0]), *gamma = qkv_tensor_f32(t[1]),
              *beta = qkv_tensor_f32(t[2]), *g = qkv_tensor_f32(dy);
  double *sum_g = g_new0(double, d), *sum_b = g_new0(double, d), *xhat = g_new(double, d);
  for (gint64 r = 0; r < rows; r++) {
    double mu = 0, var = 0, a = 0, b = 0;
    for (gint64 j = 0; j < d; j++)
      mu += x[r * d + j];
    mu /= d;
    for (gint64 j = 0; j < d; j++)
      var += (x[r * d + j] - mu) * (x[r * d + j] - mu);
    double rs = 1 / sqrt(var / d + 1e-5);
    for (gint64 j = 0; j < d; j++) {
      xhat[j] = (x[r * d + j] - mu) * rs;
      qkv_tensor_f32(y)[r * d + j] = (float)(xhat[j] * gamma[j] + beta[j]);
      a += gamma[j] * (double)g[r * d + j];
      b += gamma[j] * (double)g[r * d + j] * xhat[j];
      sum_g[j] += g[r * d + j] * xhat[j];
      sum_b[j] += g[r * d + j];
    }
    for (gint64 j = 0; j < d; j++)
      qkv_tensor_f32(dx)[r * d + j] =
          (float)(rs * (gamma[j] * (double)g[r * d + j] - a / d - xhat[j] * b / d));
  }
  for (gint64 j = 0; j < d; j++) {
    qkv_tensor_f32(dgamma)[j] = (float)sum_g[j];
    qkv_tensor_f32(dbeta)[j] = (float)sum_b[j];
  }
  /* One float32 computation against the exact value (rounded once): half of
   * ln_factor, the bound on two computations, with one rounding more for want;
   * ln_factor itself is that and to spare. */
  double factor = ln_factor(t);
  assert_close_scaled(run.out, y, factor);
  assert_close_scaled(run.grads[0], dx, factor);
  assert_close_scaled(run.grads[1], dgamma, factor);
  assert_close_scaled(run.grads[2], dbeta, factor);
  g_free(sum_g);
  g_free(sum_b);
  g_free(xhat);
  run_clear(&run);
  free_inputs(3, t);
}

static void
test_ln_composite(void)
{
  /* The last is big enough for the parallel paths (2 threads in the tests;
   * a loop forks from 2^18 units of work, about 8 per element here). */
  QkvShape shapes[] = {QKV_SHAPE(19), QKV_SHAPE(2, 5, 19), QKV_SHAPE(3, 1, 33),
                       QKV_SHAPE(3, 40, 301)};
  LnArgs args = {1e-5};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    QkvTensor *t[3];
    ln_inputs(&shapes[i], 50 + 3 * i, t);
    assert_same_as_composite("layer_norm", 3, t, build_ln, build_ln_composite, &args, ln_factor(t));
    if (i == G_N_ELEMENTS(shapes) - 1)
      assert_thread_counts_agree(3, t, build_ln, &args, ln_factor(t));
    free_inputs(3, t);
  }
}

/* ========================================================================
 * position_wise_ffn
 * ======================================================================== */

static QkvValue *
build_ffn(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_position_wise_ffn(in[0], in[1], in[2], in[3], in[4], error);
}

static QkvValue *
build_ffn_composite(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  /* matmul wants rank 2 or more: a vector x goes in as one row. */
  const QkvShape *xs = qkv_value_shape(in[0]);
  QkvShape row = QKV_SHAPE(1, xs->dims[0]), ys = *xs;
  ys.dims[xs->rank - 1] = qkv_value_shape(in[3])->dims[0];
  QkvValue *x = xs->rank == 1 ? qkv_reshape(in[0], &row, error) : in[0];
  QkvValue *h = x ? qkv_matmul(x, in[1], FALSE, TRUE, error) : NULL;
  h = h ? qkv_add(h, in[2], error) : NULL;
  h = h ? qkv_relu(h, error) : NULL;
  QkvValue *y = h ? qkv_matmul(h, in[3], FALSE, TRUE, error) : NULL;
  y = y ? qkv_add(y, in[4], error) : NULL;
  return y && xs->rank == 1 ? qkv_reshape(y, &ys, error) : y;
}

/* Random FFN inputs for x of shape xs, F hidden, O outputs. With
 * avoid_kinks, seeds are tried until every hidden pre-activation is at least
 * 0.03 from 0, so finite-difference steps of 1e-2 never cross the ReLU's kink. */
static void
ffn_inputs(const QkvShape *xs, gint64 f, gint64 o, guint32 seed, gboolean avoid_kinks,
           QkvTensor **t)
{
  gint64 d = xs->dims[xs->rank - 1];
  QkvShape w1s = QKV_SHAPE(f, d), b1s = QKV_SHAPE(f), w2s = QKV_SHAPE(o, f), b2s = QKV_SHAPE(o);
  for (guint attempt = 0;; attempt++, seed += 17) {
    t[0] = qkv_test_uniform(xs, seed, -1, 1);
    t[1] = qkv_test_uniform(&w1s, seed + 1, -1, 1);
    t[2] = qkv_test_uniform(&b1s, seed + 2, -0.5f, 0.5f);
    t[3] = qkv_test_uniform(&w2s, seed + 3, -1, 1);
    t[4] = qkv_test_uniform(&b2s, seed + 4, -0.5f, 0.5f);
    if (!avoid_kinks)
      return;
    const float *x = qkv_tensor_f32(t[0]), *w1 = qkv_tensor_f32(t[1]), *b1 = qkv_tensor_f32(t[2]);
    gint64 rows = qkv_tensor_numel(t[0]) / d;
    double closest = INFINITY;
    for (gint64 r = 0; r < rows; r++)
      for (gint64 k = 0; k < f; k++) {
        double s = b1[k];
        for (gint64 j = 0; j < d; j++)
          s += (double)x[r * d + j] * w1[k * d + j];
        closest = fmin(closest, fabs(s));
      }
    if (closest >= 0.03)
      return;
    g_assert_cmpuint(attempt, <, 1000);
    free_inputs(5, t);
  }
}

static void
test_ffn_values(void)
{
  /* x (1, 2), w1 = [[1, 0], [0, 1], [1, 1]], b1 = [0, -5, 1], w2 = [[1, 1, 1]], b2 = [0.5]:
   * hidden = relu([1, -3, 4]) = [1, 0, 4], y = 5.5. */
  QkvShape xs = QKV_SHAPE(1, 2), w1s = QKV_SHAPE(3, 2), b1s = QKV_SHAPE(3), w2s = QKV_SHAPE(1, 3),
           b2s = QKV_SHAPE(1);
  const float x[] = {1, 2}, w1[] = {1, 0, 0, 1, 1, 1}, b1[] = {0, -5, 1}, w2[] = {1, 1, 1},
              b2[] = {0.5f};
  QkvTensor *t[] = {qkv_tensor_new_f32(&xs, x), qkv_tensor_new_f32(&w1s, w1),
                    qkv_tensor_new_f32(&b1s, b1), qkv_tensor_new_f32(&w2s, w2),
                    qkv_tensor_new_f32(&b2s, b2)};
  g_autoptr(QkvTensor) y = qkv_test_eval(5, t, build_ffn, NULL);
  const float want[] = {5.5f};
  qkv_assert_values(y, want, 1, 1e-6);
  g_assert_cmpint(qkv_tensor_dim(y, 1), ==, 1);
  free_inputs(5, t);
}

static void
test_ffn_grad(void)
{
  struct {
    QkvShape x;
    gint64 f, o;
  } cases[] = {
      {QKV_SHAPE(6), 5, 6},
      {QKV_SHAPE(3, 5), 7, 5},
      {QKV_SHAPE(2, 3, 5), 9, 4},
      {QKV_SHAPE(2, 1, 2, 3), 4, 3},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    QkvTensor *t[5];
    ffn_inputs(&cases[i].x, cases[i].f, cases[i].o, 100 + 10 * i, TRUE, t);
    qkv_test_gradcheck("position_wise_ffn", 5, t, NULL, build_ffn, NULL);
    free_inputs(5, t);
  }
}

/* Zero rows in dy (padded positions under a masked loss) send the backward
 * down its row-skipping path (ops-common.h): the output goes through a
 * constant row mask before the loss. */
static QkvValue *
build_ffn_row_masked(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *y = build_ffn(g, in, NULL, error);
  QkvValue *mask = y ? qkv_graph_constant(g, user_data, error) : NULL;
  return mask ? qkv_mul(y, mask, error) : NULL;
}

/* Five rows in 24 are padding: the gradients skip them and must equal both
 * finite differences and the dense backward. */
static void
test_ffn_zero_rows(void)
{
  QkvShape xs = QKV_SHAPE(2, 12, 5), ms = QKV_SHAPE(2, 12, 1);
  g_autoptr(QkvTensor) mask = qkv_tensor_new(QKV_F32, &ms);
  for (gint64 r = 0; r < 24; r++)
    qkv_tensor_f32(mask)[r] = (r % 12) < (r < 12 ? 9 : 10) ? 1.0f : 0.0f;
  QkvTensor *t[5];
  ffn_inputs(&xs, 7, 4, 300, TRUE, t);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_ALWAYS);
  qkv_test_gradcheck("position_wise_ffn zero rows", 5, t, NULL, build_ffn_row_masked, mask);
  Run sparse = {0}, dense = {0};
  run_with_grads(5, t, build_ffn_row_masked, mask, NULL, FALSE, 0, &sparse);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_OFF);
  run_with_grads(5, t, build_ffn_row_masked, mask, NULL, FALSE, 0, &dense);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_AUTO);
  for (guint i = 0; i < 5; i++)
    assert_close_scaled(sparse.grads[i], dense.grads[i], ffn_factor(t));
  /* the padded rows of dx are exactly zero */
  for (gint64 r = 0; r < 24; r++)
    if (qkv_tensor_f32(mask)[r] == 0.0f)
      for (gint64 j = 0; j < 5; j++)
        g_assert_cmpfloat(qkv_tensor_f32(sparse.grads[0])[r * 5 + j], ==, 0.0f);
  run_clear(&sparse);
  run_clear(&dense);
  free_inputs(5, t);
}

static void
test_ffn_composite(void)
{
  struct {
    QkvShape x;
    gint64 f, o;
  } cases[] = {
      {QKV_SHAPE(7), 13, 7},
      {QKV_SHAPE(2, 5, 11), 23, 11},
      {QKV_SHAPE(3, 10, 19), 37, 6},
      {QKV_SHAPE(4, 50, 33), 67, 33},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    QkvTensor *t[5];
    ffn_inputs(&cases[i].x, cases[i].f, cases[i].o, 200 + 10 * i, FALSE, t);
    assert_same_as_composite("position_wise_ffn", 5, t, build_ffn, build_ffn_composite, NULL,
                             ffn_factor(t));
    free_inputs(5, t);
  }
}

/* ========================================================================
 * positional_encoding
 * ======================================================================== */

typedef struct {
  double dropout;
  gint64 offset;
  const QkvTensor *table; /* composite: P as a constant */
} PeArgs;

static QkvValue *
build_pe(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const PeArgs *a = user_data;
  return qkv_positional_encoding(in[0], a->dropout, a->offset, error);
}

static QkvValue *
build_pe_mask(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *y = build_pe(g, in, user_data, error);
  return y ? qkv_node_output(qkv_value_node(y), 1) : NULL;
}

static QkvValue *
build_pe_composite(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const PeArgs *a = user_data;
  QkvValue *p = qkv_graph_constant(g, a->table, error);
  return p ? qkv_add(in[0], p, error) : NULL;
}

/* The book's table, by hand in double: P[pos, j] for j = 2i or 2i + 1. */
static double
pe_value(gint64 pos, gint64 j, gint64 d)
{
  double angle = (double)pos / pow(10000.0, (double)(j - (j & 1)) / (double)d);
  return (j & 1) ? cos(angle) : sin(angle);
}

/* The table as the book builds it: the angle in float32 (position divided by
 * 10000^(2i/d), both float), its sine or cosine in double. Far from position
 * 0 this differs from pe_value() by the float rounding of the angle. */
static QkvTensor *
pe_table(gint64 t, gint64 d, gint64 offset)
{
  QkvShape s = QKV_SHAPE(t, d);
  QkvTensor *p = qkv_tensor_new(QKV_F32, &s);
  for (gint64 pos = 0; pos < t; pos++)
    for (gint64 j = 0; j < d; j++) {
      float angle = (float)(offset + pos) / powf(10000.0f, (float)(j - (j & 1)) / (float)d);
      qkv_tensor_f32(p)[pos * d + j] = (float)((j & 1) ? cos(angle) : sin(angle));
    }
  return p;
}

static void
test_pe_values(void)
{
  /* On zeros the output is P itself. */
  QkvShape s = QKV_SHAPE(1, 4, 8);
  g_autoptr(QkvTensor) zeros = qkv_tensor_new(QKV_F32, &s);
  qkv_tensor_fill(zeros, 0.0);
  QkvTensor *in[] = {zeros};
  PeArgs args = {0, 0, NULL};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_pe, &args);
  const struct {
    gint64 pos, j;
    double want;
  } at[] = {
      {0, 0, 0.0},      {0, 1, 1.0},        {1, 0, sin(1.0)},  {1, 1, cos(1.0)},
      {1, 2, sin(0.1)}, {1, 3, cos(0.1)},   {1, 4, sin(0.01)}, {1, 6, sin(0.001)},
      {2, 2, sin(0.2)}, {3, 7, cos(0.003)}, {3, 0, sin(3.0)},  {2, 5, cos(0.02)},
  };
  for (guint i = 0; i < G_N_ELEMENTS(at); i++)
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y, at[i].pos * 8 + at[i].j), at[i].want, 2e-7);

  /* Odd d: the last column is a sine column, 10000^(4/5) for columns 4 (and
   * would-be 5); a (T, d) input. */
  QkvShape s35 = QKV_SHAPE(3, 5);
  g_autoptr(QkvTensor) z5 = qkv_tensor_new(QKV_F32, &s35);
  qkv_tensor_fill(z5, 0.0);
  QkvTensor *in5[] = {z5};
  g_autoptr(QkvTensor) y5 = qkv_test_eval(1, in5, build_pe, &args);
  g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y5, 2 * 5 + 4), sin(2.0 / pow(10000.0, 0.8)), 2e-7);
  g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y5, 2 * 5 + 3), cos(2.0 / pow(10000.0, 0.4)), 2e-7);
  g_autoptr(QkvTensor) p5 = pe_table(3, 5, 0);
  qkv_assert_tensor_close(y5, p5, 1e-6);

  /* offset: rows 5 … 7 of the table. */
  PeArgs shifted = {0, 5, NULL};
  QkvShape s23 = QKV_SHAPE(2, 3, 6);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s23, 3, -1, 1);
  QkvTensor *inx[] = {x};
  g_autoptr(QkvTensor) ys = qkv_test_eval(1, inx, build_pe, &shifted);
  for (gint64 b = 0; b < 2; b++)
    for (gint64 t = 0; t < 3; t++)
      for (gint64 j = 0; j < 6; j++) {
        gint64 e = (b * 3 + t) * 6 + j;
        g_assert_cmpfloat_with_epsilon(qkv_tensor_get(ys, e),
                                       qkv_tensor_get(x, e) + pe_value(5 + t, j, 6), 5e-7);
      }
}

static void
test_pe_composite(void)
{
  struct {
    QkvShape x;
    gint64 offset;
  } cases[] = {
      {QKV_SHAPE(7, 8), 0},
      {QKV_SHAPE(3, 7, 6), 0},
      {QKV_SHAPE(2, 13, 9), 4},
      {QKV_SHAPE(5, 200, 160), 0}, /* parallel paths (table rows, then x's rows) */
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const QkvShape *s = &cases[i].x;
    g_autoptr(QkvTensor) x = qkv_test_uniform(s, 300 + i, -1, 1);
    g_autoptr(QkvTensor) table =
        pe_table(s->dims[s->rank - 2], s->dims[s->rank - 1], cases[i].offset);
    PeArgs args = {0, cases[i].offset, table};
    QkvTensor *in[] = {x};
    assert_same_as_composite("positional_encoding", 1, in, build_pe, build_pe_composite, &args,
                             pe_factor_at(in, cases[i].offset));
  }
}

static void
test_pe_dropout(void)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(4, 50, 30);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 5, -1, 1);
  QkvTensor *in[] = {x};
  PeArgs args = {0.25, 2, NULL};
  g_autoptr(QkvTensor) y = qkv_check_evaluate(1, in, build_pe, &args, TRUE, &error);
  g_autoptr(QkvTensor) mask = qkv_check_evaluate(1, in, build_pe_mask, &args, TRUE, &error);
  g_assert_no_error(error);
  gint64 n = qkv_tensor_numel(x), dropped = 0;
  for (gint64 e = 0; e < n; e++) {
    double m = qkv_tensor_get(mask, e);
    gint64 pos = (e / 30) % 50, j = e % 30;
    g_assert_true(m == 0.0 || fabs(m - 1.0 / 0.75) < 1e-6);
    dropped += m == 0.0;
    double want = (qkv_tensor_get(x, e) + pe_value(2 + pos, j, 30)) * m;
    g_assert_cmpfloat(fabs(qkv_tensor_get(y, e) - want), <=, 1e-5);
  }
  double rate = (double)dropped / (double)n;
  g_test_message("dropped %.4f of %" G_GINT64_FORMAT, rate, n);
  g_assert_cmpfloat(fabs(rate - 0.25), <, 0.02);

  /* Evaluation: no dropout, mask all ones. */
  g_autoptr(QkvTensor) ye = qkv_test_eval(1, in, build_pe, &args);
  g_autoptr(QkvTensor) me = qkv_test_eval(1, in, build_pe_mask, &args);
  for (gint64 e = 0; e < n; e++) {
    gint64 pos = (e / 30) % 50, j = e % 30;
    g_assert_cmpfloat(qkv_tensor_get(me, e), ==, 1.0);
    g_assert_cmpfloat(fabs(qkv_tensor_get(ye, e) - qkv_tensor_get(x, e) - pe_value(2 + pos, j, 30)),
                      <=, 1e-5);
  }
}

static void
test_pe_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(7, 8), QKV_SHAPE(2, 5, 6), QKV_SHAPE(3, 4, 5)};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++) {
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[i], 400 + i, -1, 1);
    QkvTensor *in[] = {x};
    PeArgs plain = {0, (gint64)i, NULL}, drop = {0.3, 1, NULL};
    qkv_test_gradcheck("positional_encoding", 1, in, NULL, build_pe, &plain);
    QkvCheckOptions opts = qkv_check_options_default();
    opts.training = TRUE;
    qkv_test_gradcheck_full("positional_encoding dropout training", 1, in, NULL, build_pe, &drop,
                            &opts);
    /* The dropout op in evaluation is the identity plus P. */
    qkv_test_gradcheck("positional_encoding dropout eval", 1, in, NULL, build_pe, &drop);
  }
}

/* ========================================================================
 * additive_attention
 * ======================================================================== */

typedef struct {
  double dropout;
  gboolean use_lens;
  gboolean return_weights;
  const QkvTensor *lens; /* composite: to build the mask constants */
} AaArgs;

static QkvValue *
build_aa(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const AaArgs *a = user_data;
  QkvValue *weights = NULL;
  QkvValue *out = qkv_additive_attention(in[0], in[1], in[2], in[3], in[4], in[5],
                                         a->use_lens ? in[6] : NULL, a->dropout, &weights, error);
  return a->return_weights ? weights : out;
}

/* The book's forward from primitive ops; masked scores are replaced by -1e6
 * through constants: s · keep + (keep − 1) · 1e6. */
static QkvValue *
build_aa_composite(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const AaArgs *a = user_data;
  const QkvShape *qs = qkv_value_shape(in[0]), *ks = qkv_value_shape(in[1]);
  gint64 b = qs->dims[0], nq = qs->dims[1], nk = ks->dims[1], h = qkv_value_shape(in[3])->dims[0];
  QkvValue *qp = qkv_matmul(in[0], in[3], FALSE, TRUE, error);
  QkvValue *kp = qp ? qkv_matmul(in[1], in[4], FALSE, TRUE, error) : NULL;
  QkvShape q4 = QKV_SHAPE(b, nq, 1, h), k4 = QKV_SHAPE(b, 1, nk, h), s3 = QKV_SHAPE(b, nq, nk);
  qp = kp ? qkv_reshape(qp, &q4, error) : NULL;
  kp = qp ? qkv_reshape(kp, &k4, error) : NULL;
  QkvValue *f = kp ? qkv_tanh(qkv_add(qp, kp, error), error) : NULL;
  QkvValue *s = f ? qkv_matmul(f, in[5], FALSE, TRUE, error) : NULL;
  s = s ? qkv_reshape(s, &s3, error) : NULL;
  if (s != NULL && a->use_lens) {
    g_autoptr(QkvTensor) keep = qkv_tensor_new(QKV_F32, &s3);
    g_autoptr(QkvTensor) fill = qkv_tensor_new(QKV_F32, &s3);
    const gint32 *lens = qkv_tensor_const_data(a->lens);
    gboolean per_query = qkv_tensor_rank(a->lens) == 2;
    for (gint64 r = 0; r < b * nq; r++)
      for (gint64 j = 0; j < nk; j++) {
        gint32 len = per_query ? lens[r] : lens[r / nq];
        gboolean kept = j < len;
        qkv_tensor_f32(keep)[r * nk + j] = kept ? 1.0f : 0.0f;
        qkv_tensor_f32(fill)[r * nk + j] = kept ? 0.0f : -1e6f;
      }
    QkvValue *kv = qkv_graph_constant(g, keep, error);
    QkvValue *fv = qkv_graph_constant(g, fill, error);
    s = qkv_add(qkv_mul(s, kv, error), fv, error);
  }
  QkvValue *w = s ? qkv_softmax(s, error) : NULL;
  if (a->return_weights)
    return w;
  return w ? qkv_matmul(w, in[2], FALSE, FALSE, error) : NULL;
}

typedef struct {
  gint64 b, nq, nk, qs, ks, vs, h;
} AaSizes;

/* q, k, v, w_q, w_k, w_v and (lens_rank 1 or 2) valid_lens in [0, nk + 1]. */
static guint
aa_inputs(const AaSizes *z, gint lens_rank, guint32 seed, QkvTensor **t)
{
  QkvShape q = QKV_SHAPE(z->b, z->nq, z->qs), k = QKV_SHAPE(z->b, z->nk, z->ks),
           v = QKV_SHAPE(z->b, z->nk, z->vs), wq = QKV_SHAPE(z->h, z->qs),
           wk = QKV_SHAPE(z->h, z->ks), wv = QKV_SHAPE(1, z->h);
  t[0] = qkv_test_uniform(&q, seed, -1, 1);
  t[1] = qkv_test_uniform(&k, seed + 1, -1, 1);
  t[2] = qkv_test_uniform(&v, seed + 2, -1, 1);
  t[3] = qkv_test_uniform(&wq, seed + 3, -1, 1);
  t[4] = qkv_test_uniform(&wk, seed + 4, -1, 1);
  t[5] = qkv_test_uniform(&wv, seed + 5, -1.5f, 1.5f);
  if (lens_rank == 0)
    return 6;
  QkvShape ls = lens_rank == 1 ? QKV_SHAPE(z->b) : QKV_SHAPE(z->b, z->nq);
  t[6] = qkv_test_randint(&ls, seed + 6, 0, (gint32)z->nk + 2);
  return 7;
}

static void
test_aa_values(void)
{
  /* h = 1, w_q = w_k = 0: every score is 0, so the weights are uniform over
   * the valid keys and out is the mean of their values. valid_lens (B) = [2, 3]. */
  AaSizes z = {2, 2, 3, 2, 2, 2, 1};
  QkvTensor *t[7];
  aa_inputs(&z, 1, 1, t);
  qkv_tensor_fill(t[3], 0.0);
  qkv_tensor_fill(t[4], 0.0);
  qkv_tensor_i32(t[6])[0] = 2;
  qkv_tensor_i32(t[6])[1] = 3;
  AaArgs out_args = {0, TRUE, FALSE, NULL}, w_args = {0, TRUE, TRUE, NULL};
  g_autoptr(QkvTensor) out = qkv_test_eval(7, t, build_aa, &out_args);
  g_autoptr(QkvTensor) w = qkv_test_eval(7, t, build_aa, &w_args);
  const float third = 1.0f / 3;
  const float want_w[] = {0.5f, 0.5f, 0, 0.5f, 0.5f, 0, third, third, third, third, third, third};
  qkv_assert_values(w, want_w, 12, 1e-6);
  const float *v = qkv_tensor_f32(t[2]);
  for (gint64 i = 0; i < 2; i++)
    for (gint64 c = 0; c < 2; c++) {
      double m0 = (v[0 * 2 + c] + v[1 * 2 + c]) / 2;
      double m1 = (v[6 + 0 * 2 + c] + v[6 + 1 * 2 + c] + v[6 + 2 * 2 + c]) / 3;
      g_assert_cmpfloat_with_epsilon(qkv_tensor_get(out, i * 2 + c), m0, 1e-6);
      g_assert_cmpfloat_with_epsilon(qkv_tensor_get(out, 4 + i * 2 + c), m1, 1e-6);
    }
  free_inputs(7, t);

  /* The saved features are tanh(W_q q + W_k k), one h-vector per pair. */
  AaSizes z2 = {1, 2, 3, 2, 3, 1, 2};
  aa_inputs(&z2, 0, 5, t);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[6];
  for (guint i = 0; i < 6; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] = qkv_graph_input(g, name, QKV_F32, qkv_tensor_shape(t[i]), &error);
  }
  QkvValue *o =
      qkv_additive_attention(in[0], in[1], in[2], in[3], in[4], in[5], NULL, 0, NULL, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(o);
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 3);
  QkvValue *feat = qkv_node_output(node, 2);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &feat, 1, NULL, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < 6; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, t[i], NULL));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  const QkvTensor *ft = qkv_plan_output(plan, 0);
  const float *q = qkv_tensor_f32(t[0]), *k = qkv_tensor_f32(t[1]), *wq = qkv_tensor_f32(t[3]),
              *wk = qkv_tensor_f32(t[4]);
  for (gint64 i = 0; i < 2; i++)
    for (gint64 j = 0; j < 3; j++)
      for (gint64 c = 0; c < 2; c++) {
        double u = 0;
        for (gint64 e = 0; e < 2; e++)
          u += (double)wq[c * 2 + e] * q[i * 2 + e];
        for (gint64 e = 0; e < 3; e++)
          u += (double)wk[c * 3 + e] * k[j * 3 + e];
        g_assert_cmpfloat_with_epsilon(qkv_tensor_get(ft, (i * 3 + j) * 2 + c), tanh(u), 1e-6);
      }
  free_inputs(6, t);
}

static void
test_aa_grad(void)
{
  const AaSizes sizes[] = {
      {2, 3, 4, 5, 3, 2, 6},
      {1, 1, 5, 3, 3, 4, 7},
      {3, 2, 3, 2, 4, 3, 5},
  };
  for (guint i = 0; i < G_N_ELEMENTS(sizes); i++)
    for (gint lens_rank = 0; lens_rank <= 2; lens_rank++) {
      QkvTensor *t[7];
      guint n = aa_inputs(&sizes[i], lens_rank, 500 + 10 * i + lens_rank, t);
      AaArgs plain = {0, lens_rank > 0, FALSE, NULL};
      g_autofree gchar *label = g_strdup_printf("additive_attention %u lens rank %d", i, lens_rank);
      qkv_test_gradcheck(label, n, t, NULL, build_aa, &plain);
      /* A loss on the weights output alone. */
      AaArgs weights = {0, lens_rank > 0, TRUE, NULL};
      qkv_test_gradcheck("additive_attention weights", n, t, NULL, build_aa, &weights);
      /* Dropout on the weights, mask fixed by the seed. */
      AaArgs drop = {0.3, lens_rank > 0, FALSE, NULL};
      QkvCheckOptions opts = qkv_check_options_default();
      opts.training = TRUE;
      qkv_test_gradcheck_full("additive_attention dropout", n, t, NULL, build_aa, &drop, &opts);
      free_inputs(n, t);
    }
}

/* Forward and backward of the book's additive attention in double by hand
 * (no dropout), with the reduction weights that run_with_grads uses; the
 * result is the output (or the weights) and the six input gradients. */
static void
aa_double(const AaSizes *z, QkvTensor *const *t, gboolean use_lens, gboolean return_weights,
          QkvTensor **result)
{
  const gint64 B = z->b, nq = z->nq, nk = z->nk, qs = z->qs, ks = z->ks, vs = z->vs, h = z->h;
  const float *q = qkv_tensor_f32(t[0]), *k = qkv_tensor_f32(t[1]), *v = qkv_tensor_f32(t[2]),
              *wq = qkv_tensor_f32(t[3]), *wk = qkv_tensor_f32(t[4]), *wv = qkv_tensor_f32(t[5]);
  const gint32 *lens = use_lens ? qkv_tensor_i32(t[6]) : NULL;
  gboolean per_query = use_lens && qkv_tensor_rank(t[6]) == 2;
  double *qp = g_new0(double, B *nq *h), *kp = g_new0(double, B *nk *h);
  double *f = g_new0(double, B *nq *nk *h), *p = g_new0(double, B *nq *nk);
  double *dp = g_new0(double, B *nq *nk), *dqp = g_new0(double, B *nq *h);
  double *dkp = g_new0(double, B *nk *h);
  for (gint64 r = 0; r < B * nq; r++)
    for (gint64 c = 0; c < h; c++)
      for (gint64 e = 0; e < qs; e++)
        qp[r * h + c] += (double)wq[c * qs + e] * q[r * qs + e];
  for (gint64 r = 0; r < B * nk; r++)
    for (gint64 c = 0; c < h; c++)
      for (gint64 e = 0; e < ks; e++)
        kp[r * h + c] += (double)wk[c * ks + e] * k[r * ks + e];
  QkvShape os = QKV_SHAPE(B, nq, vs), ws = QKV_SHAPE(B, nq, nk);
  g_autoptr(QkvTensor) w = qkv_test_uniform(return_weights ? &ws : &os, 99, -1, 1);
  const float *dy = qkv_tensor_f32(w);
  result[0] = qkv_tensor_new(QKV_F32, return_weights ? &ws : &os);
  for (guint i = 1; i < 7; i++) {
    result[i] = qkv_tensor_new(QKV_F32, qkv_tensor_shape(t[i - 1]));
    qkv_tensor_fill(result[i], 0.0);
  }
  float *out = qkv_tensor_f32(result[0]), *dq = qkv_tensor_f32(result[1]),
        *dk = qkv_tensor_f32(result[2]), *dv = qkv_tensor_f32(result[3]),
        *dwq = qkv_tensor_f32(result[4]), *dwk = qkv_tensor_f32(result[5]),
        *dwv = qkv_tensor_f32(result[6]);
  for (gint64 r = 0; r < B * nq; r++) {
    gint64 b = r / nq, len = nk;
    if (lens != NULL)
      len = per_query ? lens[r] : lens[b];
    double *s = p + r * nk, m = -INFINITY, sum = 0;
    for (gint64 j = 0; j < nk; j++) {
      s[j] = 0;
      for (gint64 c = 0; c < h; c++) {
        double x = tanh(qp[r * h + c] + kp[(b * nk + j) * h + c]);
        f[(r * nk + j) * h + c] = x;
        s[j] += wv[c] * x;
      }
      if (j >= len)
        s[j] = -1e6;
      m = fmax(m, s[j]);
    }
    for (gint64 j = 0; j < nk; j++)
      sum += (s[j] = exp(s[j] - m));
    for (gint64 j = 0; j < nk; j++)
      s[j] /= sum;
    /* output, and the gradient reaching the weights */
    for (gint64 j = 0; j < nk; j++) {
      if (return_weights) {
        out[r * nk + j] = (float)s[j];
        dp[r * nk + j] = dy[r * nk + j];
        continue;
      }
      for (gint64 c = 0; c < vs; c++) {
        dp[r * nk + j] += (double)dy[r * vs + c] * v[(b * nk + j) * vs + c];
        dv[(b * nk + j) * vs + c] += (float)(s[j] * dy[r * vs + c]);
      }
    }
    if (!return_weights)
      for (gint64 c = 0; c < vs; c++) {
        double o = 0;
        for (gint64 j = 0; j < nk; j++)
          o += s[j] * v[(b * nk + j) * vs + c];
        out[r * vs + c] = (float)o;
      }
    double dot = 0;
    for (gint64 j = 0; j < nk; j++)
      dot += s[j] * dp[r * nk + j];
    for (gint64 j = 0; j < nk; j++) {
      double ds = j < len ? s[j] * (dp[r * nk + j] - dot) : 0;
      for (gint64 c = 0; c < h; c++) {
        double x = f[(r * nk + j) * h + c], df = ds * wv[c] * (1 - x * x);
        dqp[r * h + c] += df;
        dkp[(b * nk + j) * h + c] += df;
        dwv[c] += (float)(ds * x);
      }
    }
  }
  for (gint64 r = 0; r < B * nq; r++)
    for (gint64 c = 0; c < h; c++)
      for (gint64 e = 0; e < qs; e++) {
        dq[r * qs + e] += (float)(dqp[r * h + c] * wq[c * qs + e]);
        dwq[c * qs + e] += (float)(dqp[r * h + c] * q[r * qs + e]);
      }
  for (gint64 r = 0; r < B * nk; r++)
    for (gint64 c = 0; c < h; c++)
      for (gint64 e = 0; e < ks; e++) {
        dk[r * ks + e] += (float)(dkp[r * h + c] * wk[c * ks + e]);
        dwk[c * ks + e] += (float)(dkp[r * h + c] * k[r * ks + e]);
      }
  g_free(qp);
  g_free(kp);
  g_free(f);
  g_free(p);
  g_free(dp);
  g_free(dqp);
  g_free(dkp);
}

static void
test_aa_double(void)
{
  const AaSizes sizes[] = {
      {2, 3, 4, 5, 3, 2, 6},
      {4, 9, 11, 7, 5, 6, 13},
      {3, 17, 19, 10, 9, 7, 23},
      {1, 20, 30, 6, 5, 4, 31},
  };
  for (guint i = 0; i < G_N_ELEMENTS(sizes); i++)
    for (gint lens_rank = 0; lens_rank <= 2; lens_rank++)
      for (gint rw = 0; rw <= 1; rw++) {
        QkvTensor *t[7], *want[7];
        guint n = aa_inputs(&sizes[i], lens_rank, 600 + 10 * i + lens_rank, t);
        AaArgs args = {0, lens_rank > 0, rw, NULL};
        Run run = {0};
        run_with_grads(n, t, build_aa, &args, NULL, FALSE, 0, &run);
        aa_double(&sizes[i], t, lens_rank > 0, rw, want);
        /* One float32 computation against the exact value: within the bound
         * on two (aa_factor), which covers it with one rounding of want. */
        double factor = aa_factor(t);
        assert_close_scaled(run.out, want[0], factor);
        for (guint j = 0; j < 6; j++)
          assert_close_scaled(run.grads[j], want[j + 1], factor);
        free_inputs(7, want);
        free_inputs(n, t);
        run_clear(&run);
      }
}

static void
test_aa_composite(void)
{
  const AaSizes sizes[] = {
      {2, 3, 4, 5, 3, 2, 6},
      {4, 9, 11, 7, 5, 6, 13},
      {3, 17, 19, 10, 9, 7, 47}, /* parallel over the batch */
      {1, 40, 60, 6, 5, 4, 31},  /* parallel over query rows, then key rows */
  };
  for (guint i = 0; i < G_N_ELEMENTS(sizes); i++)
    for (gint lens_rank = 0; lens_rank <= 2; lens_rank++) {
      QkvTensor *t[7];
      guint n = aa_inputs(&sizes[i], lens_rank, 600 + 10 * i + lens_rank, t);
      AaArgs args = {0, lens_rank > 0, FALSE, n > 6 ? t[6] : NULL};
      assert_same_as_composite("additive_attention", n, t, build_aa, build_aa_composite, &args,
                               aa_factor(t));
      AaArgs wargs = {0, lens_rank > 0, TRUE, n > 6 ? t[6] : NULL};
      assert_same_as_composite("additive_attention weights", n, t, build_aa, build_aa_composite,
                               &wargs, aa_factor(t));
      if (i >= 2)
        assert_thread_counts_agree(n, t, build_aa, &args, aa_factor(t));
      free_inputs(n, t);
    }
}

static void
test_aa_dropout(void)
{
  g_autoptr(GError) error = NULL;
  AaSizes z = {3, 8, 40, 4, 4, 5, 6};
  QkvTensor *t[7];
  guint n = aa_inputs(&z, 1, 77, t);
  AaArgs drop = {0.4, TRUE, FALSE, NULL}, none = {0, TRUE, FALSE, NULL};
  AaArgs drop_w = {0.4, TRUE, TRUE, NULL}, none_w = {0, TRUE, TRUE, NULL};
  /* Evaluation ignores dropout; the weights output is before dropout either way. */
  g_autoptr(QkvTensor) a = qkv_test_eval(n, t, build_aa, &drop);
  g_autoptr(QkvTensor) b = qkv_test_eval(n, t, build_aa, &none);
  qkv_assert_tensor_close(a, b, 0);
  g_autoptr(QkvTensor) wt = qkv_check_evaluate(n, t, build_aa, &drop_w, TRUE, &error);
  g_autoptr(QkvTensor) we = qkv_test_eval(n, t, build_aa, &none_w);
  qkv_assert_tensor_close(wt, we, 0);
  /* Training changes the output, and differs from step to step. */
  g_autoptr(QkvTensor) c = qkv_check_evaluate(n, t, build_aa, &drop, TRUE, &error);
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_tensor_max_rel_diff(a, c, 1e-3), >, 1e-2);
  free_inputs(n, t);
}

/* ========================================================================
 * errors, allocation, reference
 * ======================================================================== */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 3, 8));
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(2, 8));
  QkvValue *v1 = qkv_test_input(g, "v1", QKV_F32, QKV_SHAPE(8));
  QkvValue *v7 = qkv_test_input(g, "v7", QKV_F32, QKV_SHAPE(7));
  QkvValue *v16 = qkv_test_input(g, "v16", QKV_F32, QKV_SHAPE(16));
  QkvValue *w1 = qkv_test_input(g, "w1", QKV_F32, QKV_SHAPE(16, 8));
  QkvValue *w1_bad = qkv_test_input(g, "w1_bad", QKV_F32, QKV_SHAPE(16, 9));
  QkvValue *w2 = qkv_test_input(g, "w2", QKV_F32, QKV_SHAPE(8, 16));
  QkvValue *w2_bad = qkv_test_input(g, "w2_bad", QKV_F32, QKV_SHAPE(8, 15));
  QkvValue *scalar = qkv_test_input(g, "scalar", QKV_F32, qkv_shape_scalar());

  /* layer_norm */
  qkv_assert_op_fails(g, "'layer_norm'", QKV_ERROR_SHAPE, qkv_layer_norm(x, v7, v1, 1e-5, &error_));
  qkv_assert_op_fails(g, "'layer_norm'", QKV_ERROR_SHAPE,
                      qkv_layer_norm(x, v1, v16, 1e-5, &error_));
  qkv_assert_op_fails(g, "'layer_norm'", QKV_ERROR_DTYPE,
                      qkv_layer_norm(xi, v1, v1, 1e-5, &error_));
  qkv_assert_op_fails(g, "'layer_norm'", QKV_ERROR_SHAPE,
                      qkv_layer_norm(scalar, v1, v1, 1e-5, &error_));
  qkv_assert_op_fails(g, "'layer_norm'", QKV_ERROR_ATTRIBUTE,
                      qkv_layer_norm(x, v1, v1, -1, &error_));
  QkvValue *two[] = {x, v1};
  qkv_assert_op_fails(g, "layer_norm", QKV_ERROR_ARITY,
                      qkv_graph_op(g, "layer_norm", two, 2, NULL, &error_));

  /* position_wise_ffn */
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_SHAPE,
                      qkv_position_wise_ffn(x, w1_bad, v16, w2, v1, &error_));
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_SHAPE,
                      qkv_position_wise_ffn(x, w1, v7, w2, v1, &error_));
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_SHAPE,
                      qkv_position_wise_ffn(x, w1, v16, w2_bad, v1, &error_));
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_SHAPE,
                      qkv_position_wise_ffn(x, w1, v16, w2, v16, &error_));
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_SHAPE,
                      qkv_position_wise_ffn(x, v16, v16, w2, v1, &error_));
  qkv_assert_op_fails(g, "'position_wise_ffn'", QKV_ERROR_DTYPE,
                      qkv_position_wise_ffn(xi, w1, v16, w2, v1, &error_));

  /* positional_encoding */
  qkv_assert_op_fails(g, "'positional_encoding'", QKV_ERROR_SHAPE,
                      qkv_positional_encoding(v1, 0, 0, &error_));
  qkv_assert_op_fails(g, "'positional_encoding'", QKV_ERROR_DTYPE,
                      qkv_positional_encoding(xi, 0, 0, &error_));
  qkv_assert_op_fails(g, "'positional_encoding'", QKV_ERROR_ATTRIBUTE,
                      qkv_positional_encoding(x, 1.5, 0, &error_));
  qkv_assert_op_fails(g, "'positional_encoding'", QKV_ERROR_ATTRIBUTE,
                      qkv_positional_encoding(x, 0, -1, &error_));

  /* additive_attention: q (2, 3, 4), k (2, 5, 6), v (2, 5, 7), h = 9 */
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(2, 3, 4));
  QkvValue *k = qkv_test_input(g, "k", QKV_F32, QKV_SHAPE(2, 5, 6));
  QkvValue *v = qkv_test_input(g, "v", QKV_F32, QKV_SHAPE(2, 5, 7));
  QkvValue *v_short = qkv_test_input(g, "v_short", QKV_F32, QKV_SHAPE(2, 4, 7));
  QkvValue *wq = qkv_test_input(g, "wq", QKV_F32, QKV_SHAPE(9, 4));
  QkvValue *wk = qkv_test_input(g, "wk", QKV_F32, QKV_SHAPE(9, 6));
  QkvValue *wv = qkv_test_input(g, "wv", QKV_F32, QKV_SHAPE(1, 9));
  QkvValue *wq_bad = qkv_test_input(g, "wq_bad", QKV_F32, QKV_SHAPE(9, 5));
  QkvValue *wk_bad = qkv_test_input(g, "wk_bad", QKV_F32, QKV_SHAPE(8, 6));
  QkvValue *wv_bad = qkv_test_input(g, "wv_bad", QKV_F32, QKV_SHAPE(2, 9));
  QkvValue *lens = qkv_test_input(g, "lens", QKV_I32, QKV_SHAPE(2));
  QkvValue *lens_f = qkv_test_input(g, "lens_f", QKV_F32, QKV_SHAPE(2));
  QkvValue *lens_bad = qkv_test_input(g, "lens_bad", QKV_I32, QKV_SHAPE(2, 5));
  const gchar *aa = "'additive_attention'";
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(q, k, v, wq_bad, wk, wv, NULL, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(q, k, v, wq, wk_bad, wv, NULL, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(q, k, v, wq, wk, wv_bad, NULL, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(q, k, v_short, wq, wk, wv, NULL, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_DTYPE,
                      qkv_additive_attention(q, k, v, wq, wk, wv, lens_f, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(q, k, v, wq, wk, wv, lens_bad, 0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_ATTRIBUTE,
                      qkv_additive_attention(q, k, v, wq, wk, wv, lens, 1.0, NULL, &error_));
  qkv_assert_op_fails(g, aa, QKV_ERROR_SHAPE,
                      qkv_additive_attention(x, k, v, wq, wk, wv, NULL, 0, NULL, &error_));
  /* and a good one still goes in */
  g_autoptr(GError) error = NULL;
  QkvValue *weights = NULL;
  g_assert_nonnull(qkv_additive_attention(q, k, v, wq, wk, wv, lens, 0.1, &weights, &error));
  g_assert_no_error(error);
  g_assert_nonnull(weights);
}

/* The saved outputs (mean, rstd, hidden, features, masks) carry no gradient;
 * a loss that uses one is an error naming the op, and the graph is unchanged. */
static void
test_saved_outputs_have_no_gradient(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(3, 4));
  QkvValue *gamma = qkv_test_input(g, "gamma", QKV_F32, QKV_SHAPE(4));
  QkvValue *beta = qkv_test_input(g, "beta", QKV_F32, QKV_SHAPE(4));
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_layer_norm(x, gamma, beta, 1e-5, &error);
  QkvValue *mean = qkv_node_output(qkv_value_node(y), 1);
  QkvValue *loss =
      qkv_add(qkv_sum(y, NULL, 0, FALSE, &error), qkv_sum(mean, NULL, 0, FALSE, &error), &error);
  g_assert_no_error(error);
  guint n_nodes = qkv_graph_n_nodes(g);
  g_assert_false(qkv_graph_backward(g, loss, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT);
  g_assert_nonnull(strstr(error->message, "layer_norm"));
  g_test_message("%s", error->message);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
}

typedef struct {
  QkvTensor *t[16];
} AllLayers;

/* One graph with all four ops: positional encoding, FFN, layer norm and
 * additive attention (keys = values = the normalised sequence). */
static QkvValue *
build_all(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *x = qkv_positional_encoding(in[0], 0.1, 0, error);
  QkvValue *f = x ? qkv_position_wise_ffn(x, in[1], in[2], in[3], in[4], error) : NULL;
  QkvValue *s = f ? qkv_add(x, f, error) : NULL;
  QkvValue *n = s ? qkv_layer_norm(s, in[5], in[6], 1e-5, error) : NULL;
  return n ? qkv_additive_attention(in[7], n, n, in[8], in[9], in[10], in[11], 0.1, NULL, error)
           : NULL;
}

static void
all_inputs(AllLayers *a)
{
  /* B 3, T 6, d 10, F 14; queries (3, 2, 5), h 7 */
  QkvShape shapes[] = {QKV_SHAPE(3, 6, 10), QKV_SHAPE(14, 10), QKV_SHAPE(14),  QKV_SHAPE(10, 14),
                       QKV_SHAPE(10),       QKV_SHAPE(10),     QKV_SHAPE(10),  QKV_SHAPE(3, 2, 5),
                       QKV_SHAPE(7, 5),     QKV_SHAPE(7, 10),  QKV_SHAPE(1, 7)};
  for (guint i = 0; i < G_N_ELEMENTS(shapes); i++)
    a->t[i] = qkv_test_uniform(&shapes[i], 900 + i, -1, 1);
  /* Keep every ReLU unit on (|x · w1ᵀ| ≤ 10 · 2 · 0.2 < 4.5 ≤ b1), so
   * finite differences never step over its kink. */
  qkv_tensor_free(a->t[1]);
  qkv_tensor_free(a->t[2]);
  a->t[1] = qkv_test_uniform(&shapes[1], 901, -0.2f, 0.2f);
  a->t[2] = qkv_test_uniform(&shapes[2], 902, 4.5f, 5);
  QkvShape ls = QKV_SHAPE(3);
  const gint32 lens[] = {6, 2, 4};
  a->t[11] = qkv_tensor_new_i32(&ls, lens);
}

static void
test_no_allocation_per_run(void)
{
  AllLayers a = {0};
  all_inputs(&a);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[12];
  for (guint i = 0; i < 12; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] = qkv_graph_input(g, name, qkv_tensor_dtype(a.t[i]), qkv_tensor_shape(a.t[i]), &error);
    qkv_value_set_requires_grad(in[i], i < 11);
  }
  QkvValue *out = build_all(g, in, NULL, &error);
  QkvValue *loss = qkv_sum(out, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvValue *outs[12] = {loss};
  for (guint i = 0; i < 11; i++)
    outs[i + 1] = qkv_graph_gradient(g, in[i]);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 12, &opts, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < 12; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, a.t[i], NULL));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  guint64 before = qkv_alloc_count();
  for (guint i = 0; i < 20; i++)
    g_assert_true(qkv_plan_run(plan, &error));
  g_assert_cmpuint(qkv_alloc_count(), ==, before);

  /* And the whole chain passes the gradient check in training mode. */
  QkvCheckOptions copts = qkv_check_options_default();
  copts.training = TRUE;
  gboolean check[12] = {TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, FALSE};
  qkv_test_gradcheck_full("all layers", 12, a.t, check, build_all, NULL, &copts);
  free_inputs(12, a.t);
}

/* ---- against PyTorch ---------------------------------------------------- */

static GHashTable *reference;

static QkvTensor *
ref(const gchar *prefix, const gchar *name)
{
  g_autofree gchar *key = g_strconcat(prefix, "_", name, NULL);
  return qkv_test_ref(reference, key);
}

/* Run build on the named reference inputs with the reference reduction
 * weights; compare the output and the gradients (grad names, NULL to skip). */
static void
check_reference(const gchar *prefix, guint n, const gchar *const *in_names,
                const gchar *const *grad_names, QkvCheckBuildFunc build, gpointer user_data,
                double (*factor_of)(QkvTensor *const *in))
{
  QkvTensor *in[MAX_INPUTS];
  for (guint i = 0; i < n; i++)
    in[i] = ref(prefix, in_names[i]);
  Run r = {0};
  run_with_grads(n, in, build, user_data, ref(prefix, "w"), FALSE, 0, &r);
  /* PyTorch's float32 computation and qkv's: the op's bound on two. */
  double factor = factor_of(in);
  g_autofree gchar *lo = g_strdup_printf("%s.out vs PyTorch", prefix);
  qkv_assert_scaled(lo, r.out, ref(prefix, "out"), factor);
  for (guint i = 0; i < n; i++) {
    if (grad_names[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s.%s vs PyTorch", prefix, grad_names[i]);
    qkv_assert_scaled(li, r.grads[i], ref(prefix, grad_names[i]), factor);
  }
  run_clear(&r);
}

static void
test_reference_layer_norm(void)
{
  const gchar *in[] = {"x", "gamma", "beta"}, *grads[] = {"dx", "dgamma", "dbeta"};
  LnArgs args = {1e-5};
  check_reference("ln", 3, in, grads, build_ln, &args, ln_factor);
  check_reference("ln2", 3, in, grads, build_ln, &args, ln_factor);
}

static void
test_reference_ffn(void)
{
  const gchar *in[] = {"x", "w1", "b1", "w2", "b2"}, *grads[] = {"dx", "dw1", "db1", "dw2", "db2"};
  check_reference("ffn", 5, in, grads, build_ffn, NULL, ffn_factor);
  check_reference("ffn2", 5, in, grads, build_ffn, NULL, ffn_factor);
}

static void
test_reference_positional(void)
{
  const gchar *in[] = {"x"}, *grads[] = {"dx"};
  PeArgs args = {0, 0, NULL};
  check_reference("pe8", 1, in, grads, build_pe, &args, pe_factor);
  check_reference("pe6", 1, in, grads, build_pe, &args, pe_factor);
  /* The end of the book's 1000-row table: float angles up to 999 rad. */
  PeArgs tail = {0, 990, NULL};
  QkvTensor *z[] = {ref("petail", "x")};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, z, build_pe, &tail);
  QkvTensor *want = ref("petail", "out");
  /* Angles up to 999 rad carry 3 u · 999 from the power and the division
   * (pe_factor): a difference of order 1 (a wrong position or frequency) still
   * shows. */
  qkv_assert_scaled("positions 990-999 vs PyTorch", y, want, pe_factor_at(z, 990));
}

static void
test_reference_additive(void)
{
  const gchar *in[] = {"q", "k", "v", "wq", "wk", "wv", "lens"},
              *grads[] = {"dq", "dk", "dv", "dwq", "dwk", "dwv", NULL};
  AaArgs plain = {0, FALSE, FALSE, NULL}, lens = {0, TRUE, FALSE, NULL};
  check_reference("aa", 6, in, grads, build_aa, &plain, aa_factor);
  check_reference("aalens", 7, in, grads, build_aa, &lens, aa_factor);
  check_reference("aalens2", 7, in, grads, build_aa, &lens, aa_factor);
  /* The weights PyTorch kept (attention_weights). */
  AaArgs wl = {0, TRUE, TRUE, NULL};
  QkvTensor *t[7];
  for (guint i = 0; i < 7; i++)
    t[i] = ref("aalens", in[i]);
  g_autoptr(QkvTensor) w = qkv_test_eval(7, t, build_aa, &wl);
  qkv_assert_scaled("aalens.weights vs PyTorch", w, ref("aalens", "weights"), aa_factor(t));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  reference = qkv_test_load_reference("layers_ref.txt");
  g_test_add_func("/layers/layer-norm/values", test_ln_values);
  g_test_add_func("/layers/layer-norm/grad", test_ln_grad);
  g_test_add_func("/layers/layer-norm/composite", test_ln_composite);
  g_test_add_func("/layers/layer-norm/double", test_ln_double);
  g_test_add_func("/layers/ffn/values", test_ffn_values);
  g_test_add_func("/layers/ffn/grad", test_ffn_grad);
  g_test_add_func("/layers/ffn/composite", test_ffn_composite);
  g_test_add_func("/layers/ffn/zero-rows", test_ffn_zero_rows);
  g_test_add_func("/layers/positional/values", test_pe_values);
  g_test_add_func("/layers/positional/composite", test_pe_composite);
  g_test_add_func("/layers/positional/dropout", test_pe_dropout);
  g_test_add_func("/layers/positional/grad", test_pe_grad);
  g_test_add_func("/layers/additive/values", test_aa_values);
  g_test_add_func("/layers/additive/grad", test_aa_grad);
  g_test_add_func("/layers/additive/composite", test_aa_composite);
  g_test_add_func("/layers/additive/double", test_aa_double);
  g_test_add_func("/layers/additive/dropout", test_aa_dropout);
  g_test_add_func("/layers/bad-input", test_bad_input);
  g_test_add_func("/layers/saved-outputs", test_saved_outputs_have_no_gradient);
  g_test_add_func("/layers/no-allocation", test_no_allocation_per_run);
  g_test_add_func("/layers/reference/layer-norm", test_reference_layer_norm);
  g_test_add_func("/layers/reference/ffn", test_reference_ffn);
  g_test_add_func("/layers/reference/positional", test_reference_positional);
  g_test_add_func("/layers/reference/additive", test_reference_additive);
  int rc = g_test_run();
  g_hash_table_unref(reference);
  return rc;
}
