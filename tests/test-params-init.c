/* test-params-init.c: seeded initialisers — moments of large draws against
 * theory, bounds, determinism, fans and errors — and the same initialisers
 * chosen as data (QkvInit) through the builders. */
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

/* ---- initialisers chosen as data, through a builder ----------------------
 *
 * The bounds on moments: the sample variance of n independent draws has a
 * standard deviation of about σ²·√((κ − 1)/n), κ the kurtosis (3 for a
 * normal, 9/5 for a uniform); the mean's is σ/√n. Six of the first and five
 * of the second are never reached by chance (the seeds are fixed anyway),
 * while a std off by 5% moves the variance by 10%, far outside both for the
 * 65536 draws used here (6·√(2/65536) = 3.3%). */
static void
assert_drawn(const gchar *what, QkvTensor *t, double mean, double var, double kurtosis)
{
  double n = (double)qkv_tensor_numel(t);
  assert_moments(what, t, mean, var, 6.0 * sqrt((kurtosis - 1.0) / n));
}

/* A new parameter built with init by a builder of seed 9, under scope (may
 * be NULL); the tensor belongs to params. */
static QkvTensor *
built_in(QkvParams *params, const gchar *scope, const gchar *name, const QkvShape *shape,
         const QkvInit *init)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 9};
  if (scope != NULL)
    qkv_builder_push(&b, scope, &error);
  QkvValue *v = qkv_build_param_init(&b, name, shape, init, &error);
  g_assert_no_error(error);
  g_assert_nonnull(v);
  g_autofree gchar *full = qkv_builder_scoped_name(&b, name);
  qkv_builder_clear_scopes(&b);
  return qkv_param_value(qkv_params_lookup(params, full));
}

/* (rows, cols), or (rows) for cols 0, built with init in a store of its own
 * that the caller frees. */
static QkvTensor *
built(QkvParams **params, gint64 rows, gint64 cols, const QkvInit *init)
{
  *params = qkv_params_new();
  QkvShape s = cols > 0 ? QKV_SHAPE(rows, cols) : QKV_SHAPE(rows);
  return built_in(*params, NULL, "p", &s, init);
}

static void
assert_all(QkvTensor *t, float value)
{
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    g_assert_cmpfloat(qkv_tensor_f32(t)[i], ==, value);
}

static void
test_choice_constants(void)
{
  g_autoptr(QkvParams) p1 = NULL, p2 = NULL, p3 = NULL;
  assert_all(built(&p1, 7, 3, &(QkvInit){.kind = QKV_INIT_ZEROS}), 0.0f);
  assert_all(built(&p2, 7, 0, &(QkvInit){.kind = QKV_INIT_ONES}), 1.0f);
  assert_all(built(&p3, 7, 3, &(QkvInit){.kind = QKV_INIT_CONSTANT, .value = -1.5}), -1.5f);
}

static void
test_choice_uniform(void)
{
  g_autoptr(QkvParams) p1 = NULL, p2 = NULL;
  QkvTensor *t = built(&p1, 256, 256, &(QkvInit){.kind = QKV_INIT_UNIFORM, .a = -0.3, .b = 0.7});
  assert_drawn("uniform(-0.3, 0.7)", t, 0.2, 1.0 / 12.0, 1.8);
  Stats s = stats_of(t);
  /* inside [a, b), and near both ends: P(no draw in the last 0.1%) = e^-65 */
  g_assert_cmpfloat(s.min, >=, (float)-0.3);
  g_assert_cmpfloat(s.max, <, (float)0.7);
  g_assert_cmpfloat(s.min, <, -0.3 + 1e-3);
  g_assert_cmpfloat(s.max, >, 0.7 - 1e-3);
  /* a = b = 0: uniform_'s default U(0, 1) */
  t = built(&p2, 256, 256, &(QkvInit){.kind = QKV_INIT_UNIFORM});
  assert_drawn("uniform default", t, 0.5, 1.0 / 12.0, 1.8);
  s = stats_of(t);
  g_assert_cmpfloat(s.min, >=, 0.0);
  g_assert_cmpfloat(s.max, <, 1.0);
}

static void
test_choice_normal(void)
{
  g_autoptr(QkvParams) p1 = NULL, p2 = NULL;
  QkvTensor *t =
      built(&p1, 256, 256, &(QkvInit){.kind = QKV_INIT_NORMAL, .mean = 0.5, .std = 0.02});
  assert_drawn("normal(0.5, 0.02²)", t, 0.5, 0.02 * 0.02, 3.0);
  /* std 0: normal_'s default 1 */
  t = built(&p2, 256, 256, &(QkvInit){.kind = QKV_INIT_NORMAL});
  assert_drawn("normal default", t, 0.0, 1.0, 3.0);
}

/* Every |t_i| within bound, and the largest within 0.1% of it. */
static void
assert_symmetric_bound(const gchar *what, QkvTensor *t, double bound)
{
  Stats s = stats_of(t);
  g_test_message("%s: [%g, %g], bound %g", what, s.min, s.max, bound);
  g_assert_cmpfloat(s.max, <=, (float)bound);
  g_assert_cmpfloat(s.min, >=, -(float)bound);
  g_assert_cmpfloat(s.max, >, 0.999 * bound);
  g_assert_cmpfloat(s.min, <, -0.999 * bound);
  assert_drawn(what, t, 0.0, bound * bound / 3.0, 1.8);
}

static void
test_choice_xavier(void)
{
  g_autoptr(QkvParams) p1 = NULL, p2 = NULL, p3 = NULL, p4 = NULL;
  /* (fan_out 256, fan_in 512): bound gain·√(6/(fan_in + fan_out)) */
  QkvTensor *t = built(&p1, 256, 512, &(QkvInit){.kind = QKV_INIT_XAVIER_UNIFORM});
  assert_symmetric_bound("xavier_uniform", t, sqrt(6.0 / 768.0));
  /* gain 0 is gain 1: the same draws */
  QkvTensor *one = built(&p2, 256, 512, &(QkvInit){.kind = QKV_INIT_XAVIER_UNIFORM, .gain = 1});
  g_assert_cmpmem(qkv_tensor_f32(t), 4 * 256 * 512, qkv_tensor_f32(one), 4 * 256 * 512);
  t = built(&p3, 256, 512, &(QkvInit){.kind = QKV_INIT_XAVIER_UNIFORM, .gain = 2});
  assert_symmetric_bound("xavier_uniform gain 2", t, 2 * sqrt(6.0 / 768.0));
  t = built(&p4, 256, 512, &(QkvInit){.kind = QKV_INIT_XAVIER_NORMAL});
  assert_drawn("xavier_normal", t, 0.0, 2.0 / 768.0, 3.0);
}

static void
test_choice_kaiming(void)
{
  g_autoptr(QkvParams) p1 = NULL, p2 = NULL, p3 = NULL, p4 = NULL;
  /* fan_in mode, gain √(2/(1+a²)): bound gain·√(3/fan_in), std gain/√fan_in */
  QkvTensor *t = built(&p1, 512, 128, &(QkvInit){.kind = QKV_INIT_KAIMING_UNIFORM});
  assert_symmetric_bound("kaiming_uniform relu", t, sqrt(6.0 / 128.0));
  t = built(&p2, 512, 128, &(QkvInit){.kind = QKV_INIT_KAIMING_UNIFORM, .a = 1.0});
  assert_symmetric_bound("kaiming_uniform a=1", t, sqrt(3.0 / 128.0));
  t = built(&p3, 512, 128, &(QkvInit){.kind = QKV_INIT_KAIMING_NORMAL});
  assert_drawn("kaiming_normal relu", t, 0.0, 2.0 / 128.0, 3.0);
  t = built(&p4, 512, 128, &(QkvInit){.kind = QKV_INIT_KAIMING_NORMAL, .a = sqrt(5.0)});
  assert_drawn("kaiming_normal a=√5", t, 0.0, 1.0 / (3.0 * 128.0), 3.0);
}

/* A chosen initialiser draws from qkv_init_seed_for_name(seed, full name). */
static void
test_choice_seed(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(33, 7);
  QkvInit normal = {.kind = QKV_INIT_NORMAL, .std = 0.02};
  QkvTensor *t = built_in(params, "blk", "w", &s, &normal);
  g_assert_nonnull(qkv_params_lookup(params, "blk.w"));
  g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &s);
  g_assert_true(qkv_init_normal(want, 0.0, 0.02, qkv_init_seed_for_name(9, "blk.w"), NULL));
  qkv_assert_tensor_close(t, want, 0.0);
}

/* The values of every parameter of a store, in order. */
static GByteArray *
store_values(QkvParams *params)
{
  GByteArray *bytes = g_byte_array_new();
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvTensor *t = qkv_param_value(qkv_params_nth(params, i));
    g_byte_array_append(bytes, (const guint8 *)qkv_tensor_f32(t), (guint)(4 * qkv_tensor_numel(t)));
  }
  return bytes;
}

/* A linear layer and an embedding; how depends on how: 0 the plain
 * builders, 1 the _init ones with NULL, 2 with QKV_INIT_DEFAULT, 3 a
 * builder whose inits are all QKV_INIT_DEFAULT. */
static QkvParams *
layers_built(gint how, gboolean xavier_linear)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvParams *params = qkv_params_new();
  const QkvBuilderInits defaults = {0};
  QkvBuilder b = {.graph = g,
                  .params = params,
                  .seed = 4,
                  .xavier_linear = xavier_linear,
                  .inits = how == 3 ? &defaults : NULL};
  QkvShape xs = QKV_SHAPE(2, 16), is = QKV_SHAPE(2, 3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *ids = qkv_graph_input(g, "ids", QKV_I32, &is, &error);
  const QkvInit def = {.kind = QKV_INIT_DEFAULT};
  const QkvInit *choice = how == 2 ? &def : NULL;
  QkvValue *y, *e;
  if (how == 0 || how == 3) {
    y = qkv_build_linear(&b, "d", x, 8, TRUE, &error);
    e = qkv_build_embedding(&b, "e", ids, 10, 4, &error);
  } else {
    y = qkv_build_linear_init(&b, "d", x, 8, TRUE, choice, choice, &error);
    e = qkv_build_embedding_init(&b, "e", ids, 10, 4, choice, &error);
  }
  g_assert_no_error(error);
  g_assert_nonnull(y);
  g_assert_nonnull(e);
  return params;
}

/* Choosing nothing is the book's choice, value for value. */
static void
test_choice_defaults(void)
{
  for (gint xavier = 0; xavier < 2; xavier++) {
    g_autoptr(QkvParams) plain = layers_built(0, xavier);
    g_autoptr(GByteArray) want = store_values(plain);
    for (gint how = 1; how < 4; how++) {
      g_autoptr(QkvParams) other = layers_built(how, xavier);
      g_autoptr(GByteArray) have = store_values(other);
      g_assert_cmpmem(have->data, have->len, want->data, want->len);
    }
    /* and the book's choice is what it was: nn.Linear's or Xavier, nn.Embedding's */
    QkvShape ws = QKV_SHAPE(8, 16), bs = QKV_SHAPE(8), es = QKV_SHAPE(10, 4);
    g_autoptr(QkvTensor) w = qkv_tensor_new(QKV_F32, &ws);
    g_autoptr(QkvTensor) bias = qkv_tensor_new(QKV_F32, &bs);
    g_autoptr(QkvTensor) emb = qkv_tensor_new(QKV_F32, &es);
    guint64 ws_seed = qkv_init_seed_for_name(4, "d.weight");
    g_assert_true(xavier ? qkv_init_xavier_uniform(w, 1.0, ws_seed, NULL)
                         : qkv_init_kaiming_uniform(w, sqrt(5.0), ws_seed, NULL));
    g_assert_true(qkv_init_uniform(bias, -0.25, 0.25, qkv_init_seed_for_name(4, "d.bias"), NULL));
    g_assert_true(qkv_init_embedding(emb, qkv_init_seed_for_name(4, "e.weight"), NULL));
    qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(plain, "d.weight")), w, 0.0);
    qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(plain, "d.bias")), bias, 0.0);
    qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(plain, "e.weight")), emb, 0.0);
  }
}

/* "linear weights Xavier, bias zeros", "embedding N(0, 0.02²)", per call. */
static void
test_choice_layers(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 6};
  QkvShape xs = QKV_SHAPE(2, 256), is = QKV_SHAPE(2, 3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *ids = qkv_graph_input(g, "ids", QKV_I32, &is, &error);
  const QkvInit xavier = {.kind = QKV_INIT_XAVIER_UNIFORM}, zeros = {.kind = QKV_INIT_ZEROS};
  const QkvInit small = {.kind = QKV_INIT_NORMAL, .std = 0.02};
  g_assert_nonnull(qkv_build_linear_init(&b, "d", x, 256, TRUE, &xavier, &zeros, &error));
  g_assert_nonnull(qkv_build_embedding_init(&b, "e", ids, 1024, 64, &small, &error));
  g_assert_no_error(error);
  assert_symmetric_bound("linear weight xavier",
                         qkv_param_value(qkv_params_lookup(params, "d.weight")), sqrt(6.0 / 512.0));
  assert_all(qkv_param_value(qkv_params_lookup(params, "d.bias")), 0.0f);
  assert_drawn("embedding N(0, 0.02²)", qkv_param_value(qkv_params_lookup(params, "e.weight")), 0.0,
               0.02 * 0.02, 3.0);
}

/* A builder's choices by role reach every parameter of a model. */
static void
test_builder_inits(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  const QkvBuilderInits inits = {.embedding = {.kind = QKV_INIT_NORMAL, .std = 0.02},
                                 .weight = {.kind = QKV_INIT_XAVIER_UNIFORM},
                                 .bias = {.kind = QKV_INIT_ZEROS}};
  QkvBuilder b = {.graph = g, .params = params, .seed = 2, .inits = &inits};
  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, &error);
  QkvValue *valid = qkv_graph_input(g, "valid", QKV_I32, &bs, &error);
  QkvTransformerConfig tc = {.src_vocab = 1024,
                             .tgt_vocab = 1024,
                             .num_hiddens = 64,
                             .ffn_hiddens = 128,
                             .num_heads = 4,
                             .num_layers = 1};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &tc, src, valid, &error);
  g_assert_nonnull(qkv_build_transformer_decoder(&b, &tc, src, enc, valid, NULL, &error));
  g_assert_no_error(error);
  guint n_weights = 0, n_biases = 0;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const gchar *name = qkv_param_name(p);
    QkvTensor *t = qkv_param_value(p);
    gint64 fan_in, fan_out;
    if (strstr(name, ".ln.") != NULL) { /* LayerNorm keeps its ones and zeros */
      assert_all(t, g_str_has_suffix(name, ".weight") ? 1.0f : 0.0f);
    } else if (strstr(name, "embedding") != NULL) {
      assert_drawn(name, t, 0.0, 0.02 * 0.02, 3.0);
    } else if (g_str_has_suffix(name, ".bias")) {
      assert_all(t, 0.0f);
      n_biases++;
    } else {
      g_assert_true(qkv_init_compute_fans(qkv_param_shape(p), &fan_in, &fan_out, NULL));
      Stats s = stats_of(t);
      float bound = (float)sqrt(6.0 / (double)(fan_in + fan_out));
      g_assert_cmpfloat(s.max, <=, bound);
      g_assert_cmpfloat(s.min, >=, -bound);
      g_assert_cmpfloat(s.max, >, 0.9 * bound);
      n_weights++;
    }
  }
  /* W_q, W_k, W_v, W_o per attention (3), dense1 and dense2 per ffn (2), the output */
  g_assert_cmpuint(n_weights, ==, 3 * 4 + 2 * 2 + 1);
  g_assert_cmpuint(n_biases, ==, 2 * 2 + 1);
}

/* A bad choice adds nothing; a parameter that exists keeps its values. */
static void
test_choice_errors(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  QkvShape xs = QKV_SHAPE(2, 4), s = QKV_SHAPE(3, 4);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  guint n_nodes = qkv_graph_n_nodes(g), n_values = qkv_graph_n_values(g);
  const QkvInit xavier = {.kind = QKV_INIT_XAVIER_UNIFORM};
  /* a bias has no fans: the weight made before it goes too */
  g_assert_null(qkv_build_linear_init(&b, "d", x, 3, TRUE, NULL, &xavier, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_true(g_str_has_prefix(error->message, "parameter 'd.bias': "));
  g_clear_error(&error);
  const QkvInit bad[] = {
      {.kind = (QkvInitKind)99},
      {.kind = QKV_INIT_UNIFORM, .a = 1, .b = 0},
      {.kind = QKV_INIT_NORMAL, .std = -1},
      {.kind = QKV_INIT_XAVIER_NORMAL, .gain = NAN},
      {.kind = QKV_INIT_DEFAULT},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_assert_null(qkv_build_param_init(&b, "p", &s, &bad[i], &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_test_message("%s", error->message);
    g_clear_error(&error);
  }
  g_assert_null(qkv_build_param_init(&b, "p", &s, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  /* a builder's bad choice for a role fails the builders that use it */
  const QkvBuilderInits inits = {.weight = {.kind = (QkvInitKind)42}};
  b.inits = &inits;
  g_assert_null(qkv_build_linear(&b, "d", x, 3, TRUE, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  b.inits = NULL;
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);

  const QkvInit normal = {.kind = QKV_INIT_NORMAL}, ones = {.kind = QKV_INIT_ONES};
  g_assert_nonnull(qkv_build_param_init(&b, "p", &s, &normal, &error));
  QkvTensor *t = qkv_param_value(qkv_params_lookup(params, "p"));
  float first = qkv_tensor_f32(t)[0];
  g_assert_nonnull(qkv_build_param_init(&b, "p", &s, &ones, &error));
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_tensor_f32(t)[0], ==, first);
  g_assert_cmpfloat(first, !=, 1.0f);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/params-init/constants", test_constants);
  g_test_add_func("/params-init/uniform", test_uniform);
  g_test_add_func("/params-init/normal", test_normal);
  g_test_add_func("/params-init/xavier", test_xavier);
  g_test_add_func("/params-init/kaiming-and-linear", test_kaiming_and_linear);
  g_test_add_func("/params-init/fans", test_fans);
  g_test_add_func("/params-init/errors", test_errors);
  g_test_add_func("/params-init/seeds", test_seeds);
  g_test_add_func("/params-init/writes-in-place", test_writes_in_place);
  g_test_add_func("/params-init/choice/constants", test_choice_constants);
  g_test_add_func("/params-init/choice/uniform", test_choice_uniform);
  g_test_add_func("/params-init/choice/normal", test_choice_normal);
  g_test_add_func("/params-init/choice/xavier", test_choice_xavier);
  g_test_add_func("/params-init/choice/kaiming", test_choice_kaiming);
  g_test_add_func("/params-init/choice/seed", test_choice_seed);
  g_test_add_func("/params-init/choice/defaults", test_choice_defaults);
  g_test_add_func("/params-init/choice/layers", test_choice_layers);
  g_test_add_func("/params-init/choice/builder-inits", test_builder_inits);
  g_test_add_func("/params-init/choice/errors", test_choice_errors);
  return g_test_run();
}
