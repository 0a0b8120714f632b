/* test-params-init.c: seeded initialisers — moments of large draws against
 * theory, bounds, determinism, fans and errors. */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef struct {
  double mean, var, min, max;
} Stats;

static Stats
stats_of(QkvTensor *t)
{
  Stats s = {0, 0, INFINITY, -INFINITY};
  gint64 n = qkv_tensor_numel(t);
  const float *d = qkv_tensor_f32(t);
  for (gint64 i = 0; i < n; i++) {
    s.mean += d[i];
    s.min = fmin(s.min, d[i]);
    s.max = fmax(s.max, d[i]);
  }
  s.mean /= (double)n;
  for (gint64 i = 0; i < n; i++)
    s.var += (d[i] - s.mean) * (d[i] - s.mean);
  s.var /= (double)n;
  return s;
}

/* mean within 5 standard errors, variance within rel_var of theory */
static void
assert_moments(const gchar *what, QkvTensor *t, double mean, double var, double rel_var)
{
  Stats s = stats_of(t);
  double n = (double)qkv_tensor_numel(t);
  double se = sqrt(var / n);
  g_test_message("%s: mean %.5g (theory %.5g), variance %.5g (theory %.5g)", what, s.mean, mean,
                 s.var, var);
  if (fabs(s.mean - mean) > 5 * se)
    g_error("%s: mean %g too far from %g (standard error %g)", what, s.mean, mean, se);
  if (fabs(s.var - var) > rel_var * var)
    g_error("%s: variance %g too far from %g", what, s.var, var);
}

static QkvTensor *
f32(gint64 a, gint64 b)
{
  QkvShape s = b > 0 ? QKV_SHAPE(a, b) : QKV_SHAPE(a);
  return qkv_tensor_new(QKV_F32, &s);
}

static void
test_constants(void)
{
  g_autoptr(QkvTensor) t = f32(7, 3);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_init_ones(t, &error));
  for (gint64 i = 0; i < 21; i++)
    g_assert_cmpfloat(qkv_tensor_get(t, i), ==, 1.0);
  g_assert_true(qkv_init_constant(t, -2.5, &error));
  for (gint64 i = 0; i < 21; i++)
    g_assert_cmpfloat(qkv_tensor_get(t, i), ==, -2.5);
  g_assert_true(qkv_init_zeros(t, &error));
  for (gint64 i = 0; i < 21; i++)
    g_assert_cmpfloat(qkv_tensor_get(t, i), ==, 0.0);
  g_assert_no_error(error);
}

static void
test_uniform(void)
{
  g_autoptr(QkvTensor) t = f32(400, 500);
  g_assert_true(qkv_init_uniform(t, -2.0, 3.0, 7, NULL));
  /* U(a, b): mean (a+b)/2, variance (b-a)²/12 */
  assert_moments("uniform(-2, 3)", t, 0.5, 25.0 / 12.0, 0.01);
  Stats s = stats_of(t);
  g_assert_cmpfloat(s.min, >=, -2.0);
  g_assert_cmpfloat(s.max, <, 3.0);
  g_assert_cmpfloat(s.min, <, -1.99);
  g_assert_cmpfloat(s.max, >, 2.99);
  /* symmetric: variance bound²/3 */
  g_assert_true(qkv_init_uniform(t, -0.5, 0.5, 8, NULL));
  assert_moments("uniform(±0.5)", t, 0.0, 0.25 / 3.0, 0.01);
}

static void
test_normal(void)
{
  g_autoptr(QkvTensor) t = f32(400, 501); /* odd count: the last Box-Muller pair is split */
  g_assert_true(qkv_init_normal(t, 1.0, 2.0, 11, NULL));
  assert_moments("normal(1, 2²)", t, 1.0, 4.0, 0.015);
  /* about 68.27% within one σ */
  gint64 inside = 0, n = qkv_tensor_numel(t);
  for (gint64 i = 0; i < n; i++)
    inside += fabs(qkv_tensor_get(t, i) - 1.0) < 2.0;
  g_assert_cmpfloat(fabs((double)inside / (double)n - 0.682689), <, 0.005);
  g_assert_true(qkv_init_embedding(t, 12, NULL));
  assert_moments("embedding N(0, 1)", t, 0.0, 1.0, 0.015);
}

static void
test_xavier(void)
{
  g_autoptr(QkvTensor) t = f32(300, 700);
  g_autoptr(GError) error = NULL;
  /* Glorot: variance gain²·2/(fan_in + fan_out), fan_in 700, fan_out 300 */
  g_assert_true(qkv_init_xavier_uniform(t, 1.0, 3, &error));
  assert_moments("xavier_uniform", t, 0.0, 2.0 / 1000.0, 0.01);
  double bound = sqrt(6.0 / 1000.0);
  Stats s = stats_of(t);
  g_assert_cmpfloat(s.max, <=, bound);
  g_assert_cmpfloat(s.min, >=, -bound);
  g_assert_cmpfloat(s.max, >, 0.999 * bound);
  g_assert_true(qkv_init_xavier_uniform(t, 2.0, 3, &error));
  assert_moments("xavier_uniform gain 2", t, 0.0, 4.0 * 2.0 / 1000.0, 0.01);
  g_assert_true(qkv_init_xavier_normal(t, 1.0, 4, &error));
  assert_moments("xavier_normal", t, 0.0, 2.0 / 1000.0, 0.015);
  g_assert_no_error(error);
}

static void
test_kaiming_and_linear(void)
{
  g_autoptr(QkvTensor) w = f32(4096, 64);
  g_autoptr(QkvTensor) b = f32(4096, 0);
  g_autoptr(GError) error = NULL;
  /* a = √5: gain √(2/6) = √(1/3), bound gain·√(3/fan_in) = 1/√fan_in */
  g_assert_true(qkv_init_kaiming_uniform(w, sqrt(5.0), 5, &error));
  double bound = 1.0 / sqrt(64.0);
  assert_moments("kaiming_uniform a=√5", w, 0.0, bound * bound / 3.0, 0.01);
  Stats s = stats_of(w);
  g_assert_cmpfloat(s.max, <=, bound);
  g_assert_cmpfloat(s.min, >=, -bound);
  g_assert_cmpfloat(s.max, >, 0.999 * bound);
  /* a = 0 (ReLU): bound √(6/fan_in) */
  g_assert_true(qkv_init_kaiming_uniform(w, 0.0, 5, &error));
  assert_moments("kaiming_uniform a=0", w, 0.0, 2.0 / 64.0, 0.01);

  /* nn.Linear(64, 4096): weight and bias U(±1/√64) */
  g_assert_true(qkv_init_linear(w, b, 6, &error));
  assert_moments("linear weight", w, 0.0, bound * bound / 3.0, 0.01);
  assert_moments("linear bias", b, 0.0, bound * bound / 3.0, 0.08);
  s = stats_of(b);
  g_assert_cmpfloat(s.max, <=, bound);
  g_assert_cmpfloat(s.min, >=, -bound);
  /* the bias draws from its own stream, not the weight's first values */
  g_assert_cmpfloat(qkv_tensor_get(b, 0), !=, qkv_tensor_get(w, 0));
  g_assert_true(qkv_init_linear(w, NULL, 6, &error));
  g_assert_no_error(error);

  /* a bias that does not match the weight's rows */
  g_autoptr(QkvTensor) wrong = f32(10, 0);
  g_assert_false(qkv_init_linear(w, wrong, 6, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
}

static void
test_fans(void)
{
  gint64 fan_in = 0, fan_out = 0;
  g_autoptr(GError) error = NULL;
  QkvShape s2 = QKV_SHAPE(8, 3), s4 = QKV_SHAPE(16, 4, 3, 5), s1 = QKV_SHAPE(9);
  g_assert_true(qkv_init_compute_fans(&s2, &fan_in, &fan_out, &error));
  g_assert_cmpint(fan_in, ==, 3);
  g_assert_cmpint(fan_out, ==, 8);
  /* like PyTorch: (out, in, k...) with a receptive field prod(k) */
  g_assert_true(qkv_init_compute_fans(&s4, &fan_in, &fan_out, &error));
  g_assert_cmpint(fan_in, ==, 4 * 15);
  g_assert_cmpint(fan_out, ==, 16 * 15);
  g_assert_false(qkv_init_compute_fans(&s1, &fan_in, &fan_out, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  /* so rank-1 tensors have no Xavier or Kaiming init */
  g_autoptr(QkvTensor) v = f32(9, 0);
  g_assert_false(qkv_init_xavier_uniform(v, 1.0, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  g_assert_false(qkv_init_linear(v, NULL, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
}

static void
test_errors(void)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(4, 4);
  g_autoptr(QkvTensor) ints = qkv_tensor_new(QKV_I32, &s);
  g_assert_false(qkv_init_normal(ints, 0, 1, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_DTYPE);
  g_clear_error(&error);
  g_autoptr(QkvTensor) t = f32(4, 4);
  g_assert_false(qkv_init_uniform(t, 1.0, 1.0, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_init_normal(t, 0.0, -1.0, 1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
}

typedef gboolean (*InitFunc)(QkvTensor *t, guint64 seed);

static gboolean
do_uniform(QkvTensor *t, guint64 seed)
{
  return qkv_init_uniform(t, -1, 1, seed, NULL);
}

static gboolean
do_normal(QkvTensor *t, guint64 seed)
{
  return qkv_init_normal(t, 0, 1, seed, NULL);
}

static gboolean
do_xavier(QkvTensor *t, guint64 seed)
{
  return qkv_init_xavier_uniform(t, 1, seed, NULL);
}

static gboolean
do_linear(QkvTensor *t, guint64 seed)
{
  return qkv_init_linear(t, NULL, seed, NULL);
}

static void
test_seeds(void)
{
  InitFunc funcs[] = {do_uniform, do_normal, do_xavier, do_linear};
  for (guint f = 0; f < G_N_ELEMENTS(funcs); f++) {
    g_autoptr(QkvTensor) a = f32(33, 17);
    g_autoptr(QkvTensor) b = f32(33, 17);
    g_autoptr(QkvTensor) c = f32(33, 17);
    g_assert_true(funcs[f](a, 1234));
    g_assert_true(funcs[f](b, 1234));
    g_assert_true(funcs[f](c, 1235));
    g_assert_cmpmem(qkv_tensor_data(a), qkv_tensor_nbytes(a), qkv_tensor_data(b),
                    qkv_tensor_nbytes(b));
    gint64 same = 0;
    for (gint64 i = 0; i < qkv_tensor_numel(a); i++)
      same += qkv_tensor_get(a, i) == qkv_tensor_get(c, i);
    g_assert_cmpint(same, <, 3);
  }
  /* the generator is qkv's own and fixed: these values must never change */
  g_autoptr(QkvTensor) t = f32(4, 0);
  g_assert_true(qkv_init_uniform(t, 0, 1, 42, NULL));
  g_autofree gchar *got =
      g_strdup_printf("%.9g %.9g %.9g %.9g", qkv_tensor_get(t, 0), qkv_tensor_get(t, 1),
                      qkv_tensor_get(t, 2), qkv_tensor_get(t, 3));
  g_test_message("uniform seed 42: %s", got);
  g_assert_cmpstr(got, ==, "0.0838629678 0.378980249 0.680043399 0.924692929");

  /* per-name seeds: deterministic, distinct per name and per base seed */
  g_assert_cmpuint(qkv_init_seed_for_name(1, "fc.weight"), ==,
                   qkv_init_seed_for_name(1, "fc.weight"));
  g_assert_cmpuint(qkv_init_seed_for_name(1, "fc.weight"), !=,
                   qkv_init_seed_for_name(1, "fc.bias"));
  g_assert_cmpuint(qkv_init_seed_for_name(1, "fc.weight"), !=,
                   qkv_init_seed_for_name(2, "fc.weight"));
}

static void
test_writes_in_place(void)
{
  /* initialisers write into the param's buffer: plans keep their pointers */
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(8, 4);
  QkvParam *p = qkv_params_add(params, "fc.weight", &s, NULL);
  QkvTensor *before = qkv_param_value(p);
  gpointer data = qkv_tensor_data(before);
  g_assert_true(qkv_init_linear(qkv_param_value(p), NULL,
                                qkv_init_seed_for_name(0, qkv_param_name(p)), NULL));
  g_assert_true(qkv_param_value(p) == before);
  g_assert_true(qkv_tensor_data(qkv_param_value(p)) == data);
  g_assert_cmpfloat(qkv_tensor_get(before, 0), !=, 0.0);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/params-init/constants", test_constants);
  g_test_add_func("/params-init/uniform", test_uniform);
  g_test_add_func("/params-init/normal", test_normal);
  g_test_add_func("/params-init/xavier", test_xavier);
  g_test_add_func("/params-init/kaiming-and-linear", test_kaiming_and_linear);
  g_test_add_func("/params-init/fans", test_fans);
  g_test_add_func("/params-init/errors", test_errors);
  g_test_add_func("/params-init/seeds", test_seeds);
  g_test_add_func("/params-init/writes-in-place", test_writes_in_place);
  return g_test_run();
}
