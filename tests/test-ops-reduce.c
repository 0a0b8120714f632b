/* test-ops-reduce.c: sum, mean, sum_to and broadcast_to. */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef enum {
  OP_SUM,
  OP_MEAN,
  OP_SUM_TO,
  OP_BROADCAST_TO,
} ReduceOp;

static const char *const op_names[] = {"sum", "mean", "sum_to", "broadcast_to"};

/* One case: the op, its axes and keepdims (sum, mean) or target shape. */
typedef struct {
  ReduceOp op;
  gint axes[QKV_MAX_RANK];
  guint n_axes;
  gboolean keepdims;
  QkvShape shape;
} ReduceCase;

static QkvValue *
build_reduce(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const ReduceCase *c = user_data;
  switch (c->op) {
  case OP_SUM:
    return qkv_sum(in[0], c->axes, c->n_axes, c->keepdims, error);
  case OP_MEAN:
    return qkv_mean(in[0], c->axes, c->n_axes, c->keepdims, error);
  case OP_SUM_TO:
    return qkv_sum_to(in[0], &c->shape, error);
  case OP_BROADCAST_TO:
    return qkv_broadcast_to(in[0], &c->shape, error);
  }
  return NULL;
}

static gchar *
case_label(const ReduceCase *c, const QkvShape *in)
{
  g_autofree gchar *si = qkv_shape_to_string(in);
  if (c->op == OP_SUM_TO || c->op == OP_BROADCAST_TO) {
    g_autofree gchar *st = qkv_shape_to_string(&c->shape);
    return g_strdup_printf("%s %s -> %s", op_names[c->op], si, st);
  }
  GString *s = g_string_new(NULL);
  g_string_printf(s, "%s %s axes [", op_names[c->op], si);
  for (guint i = 0; i < c->n_axes; i++)
    g_string_append_printf(s, "%s%d", i ? ", " : "", c->axes[i]);
  g_string_append_printf(s, "]%s", c->keepdims ? " keepdims" : "");
  return g_string_free(s, FALSE);
}

/* Evaluate c on x (given as values) and compare shape and values. */
static void
check_values(const ReduceCase *c, const QkvShape *sx, const float *x, const QkvShape *s_out,
             const float *want, double tol)
{
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(sx, x);
  g_autoptr(QkvTensor) out = qkv_test_eval(1, &tx, build_reduce, (gpointer)c);
  g_autofree gchar *label = case_label(c, sx);
  g_autofree gchar *got = qkv_shape_to_string(qkv_tensor_shape(out));
  g_autofree gchar *expected = qkv_shape_to_string(s_out);
  g_test_message("%s: %s", label, got);
  g_assert_cmpstr(got, ==, expected);
  qkv_assert_values(out, want, (gsize)qkv_shape_numel(s_out), tol);
}

static const float iota6[] = {1, 2, 3, 4, 5, 6};

static float iota24[24];

static void
fill_iota24(void)
{
  for (int i = 0; i < 24; i++)
    iota24[i] = (float)i;
}

/* ---- forward values worked out by hand ---- */

static void
test_sum_values(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), scalar = qkv_shape_scalar();
  {
    ReduceCase c = {.op = OP_SUM};
    const float want[] = {21};
    check_values(&c, &s23, iota6, &scalar, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM, .axes = {0}, .n_axes = 1};
    QkvShape so = QKV_SHAPE(3);
    const float want[] = {5, 7, 9};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM, .axes = {1}, .n_axes = 1};
    QkvShape so = QKV_SHAPE(2);
    const float want[] = {6, 15};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM, .axes = {-1}, .n_axes = 1, .keepdims = TRUE};
    QkvShape so = QKV_SHAPE(2, 1);
    const float want[] = {6, 15};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM, .axes = {1, 0}, .n_axes = 2, .keepdims = TRUE};
    QkvShape so = QKV_SHAPE(1, 1);
    const float want[] = {21};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }

  /* x[i][j][k] = 12i + 4j + k on (2, 3, 4) */
  QkvShape s234 = QKV_SHAPE(2, 3, 4);
  {
    /* Σ_{i,k} = 32j + 60: reduced axes on both sides of a kept one */
    ReduceCase c = {.op = OP_SUM, .axes = {0, 2}, .n_axes = 2};
    QkvShape so = QKV_SHAPE(3);
    const float want[] = {60, 92, 124};
    check_values(&c, &s234, iota24, &so, want, 1e-5);
  }
  {
    /* Σ_j = 36i + 12 + 3k: the middle axis */
    ReduceCase c = {.op = OP_SUM, .axes = {1}, .n_axes = 1};
    QkvShape so = QKV_SHAPE(2, 4);
    const float want[] = {12, 15, 18, 21, 48, 51, 54, 57};
    check_values(&c, &s234, iota24, &so, want, 1e-5);
  }
  {
    /* Σ_i = 2(4j + k) + 12: the leading axis (column sums) */
    ReduceCase c = {.op = OP_SUM, .axes = {0}, .n_axes = 1, .keepdims = TRUE};
    QkvShape so = QKV_SHAPE(1, 3, 4);
    const float want[] = {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34};
    check_values(&c, &s234, iota24, &so, want, 1e-5);
  }
  {
    /* Σ_{j,k} = 48i + 66: trailing axes (row sums) */
    ReduceCase c = {.op = OP_SUM, .axes = {-2, -1}, .n_axes = 2};
    QkvShape so = QKV_SHAPE(2);
    const float want[] = {66, 210};
    check_values(&c, &s234, iota24, &so, want, 1e-5);
  }
  {
    /* a rank-0 input: the sum of everything is itself */
    ReduceCase c = {.op = OP_SUM};
    const float x[] = {7.5f}, want[] = {7.5f};
    check_values(&c, &scalar, x, &scalar, want, 0);
  }
  {
    /* reducing only an axis of size 1 copies */
    ReduceCase c = {.op = OP_SUM, .axes = {1}, .n_axes = 1};
    QkvShape s31 = QKV_SHAPE(3, 1), s3 = QKV_SHAPE(3);
    const float x[] = {1, -2, 3};
    check_values(&c, &s31, x, &s3, x, 0);
  }
}

static void
test_mean_values(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), scalar = qkv_shape_scalar();
  {
    ReduceCase c = {.op = OP_MEAN};
    const float want[] = {3.5f};
    check_values(&c, &s23, iota6, &scalar, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_MEAN, .axes = {0}, .n_axes = 1};
    QkvShape so = QKV_SHAPE(3);
    const float want[] = {2.5f, 3.5f, 4.5f};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_MEAN, .axes = {1}, .n_axes = 1, .keepdims = TRUE};
    QkvShape so = QKV_SHAPE(2, 1);
    const float want[] = {2, 5};
    check_values(&c, &s23, iota6, &so, want, 1e-6);
  }
  {
    /* (2, 3, 4) over axes 0 and 2: (32j + 60) / 8 */
    QkvShape s234 = QKV_SHAPE(2, 3, 4), so = QKV_SHAPE(1, 3, 1);
    ReduceCase c = {.op = OP_MEAN, .axes = {0, -1}, .n_axes = 2, .keepdims = TRUE};
    const float want[] = {7.5f, 11.5f, 15.5f};
    check_values(&c, &s234, iota24, &so, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_MEAN};
    const float x[] = {-3}, want[] = {-3};
    check_values(&c, &scalar, x, &scalar, want, 0);
  }
}

static void
test_sum_to_values(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), scalar = qkv_shape_scalar();
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(3)};
    const float want[] = {5, 7, 9};
    check_values(&c, &s23, iota6, &c.shape, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(1, 3)};
    const float want[] = {5, 7, 9};
    check_values(&c, &s23, iota6, &c.shape, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(2, 1)};
    const float want[] = {6, 15};
    check_values(&c, &s23, iota6, &c.shape, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = qkv_shape_scalar()};
    const float want[] = {21};
    check_values(&c, &s23, iota6, &scalar, want, 1e-6);
  }
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(2, 3)};
    check_values(&c, &s23, iota6, &c.shape, iota6, 0);
  }
  QkvShape s234 = QKV_SHAPE(2, 3, 4);
  {
    /* (2,3,4) → (3,1): the leading axis goes, the last sums to 1 */
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(3, 1)};
    const float want[] = {60, 92, 124};
    check_values(&c, &s234, iota24, &c.shape, want, 1e-5);
  }
  {
    ReduceCase c = {.op = OP_SUM_TO, .shape = QKV_SHAPE(2, 1, 4)};
    const float want[] = {12, 15, 18, 21, 48, 51, 54, 57};
    check_values(&c, &s234, iota24, &c.shape, want, 1e-5);
  }
}

static void
test_broadcast_to_values(void)
{
  {
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(2, 3)};
    QkvShape s3 = QKV_SHAPE(3);
    const float x[] = {1, 2, 3}, want[] = {1, 2, 3, 1, 2, 3};
    check_values(&c, &s3, x, &c.shape, want, 0);
  }
  {
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(2, 3)};
    QkvShape s21 = QKV_SHAPE(2, 1);
    const float x[] = {1, 2}, want[] = {1, 1, 1, 2, 2, 2};
    check_values(&c, &s21, x, &c.shape, want, 0);
  }
  {
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(2, 2)};
    QkvShape scalar = qkv_shape_scalar();
    const float x[] = {5}, want[] = {5, 5, 5, 5};
    check_values(&c, &scalar, x, &c.shape, want, 0);
  }
  {
    /* (3,1) → (2,3,2): x[j] at [i][j][k] */
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(2, 3, 2)};
    QkvShape s31 = QKV_SHAPE(3, 1);
    const float x[] = {1, 2, 3}, want[] = {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3};
    check_values(&c, &s31, x, &c.shape, want, 0);
  }
  {
    /* (2,1,2) → (2,3,2): x[i][k] at [i][j][k] */
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(2, 3, 2)};
    QkvShape s212 = QKV_SHAPE(2, 1, 2);
    const float x[] = {1, 2, 3, 4}, want[] = {1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4};
    check_values(&c, &s212, x, &c.shape, want, 0);
  }
  {
    /* only a leading 1 added: same elements */
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = QKV_SHAPE(1, 3)};
    QkvShape s3 = QKV_SHAPE(3);
    const float x[] = {4, 5, 6};
    check_values(&c, &s3, x, &c.shape, x, 0);
  }
}

static void
test_attrs_by_name(void)
{
  /* The generic path: axes given as "ai" (what GVariant text makes of [1]). */
  QkvShape s23 = QKV_SHAPE(2, 3);
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(GError) error = NULL;
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s23, &error);
  g_assert_no_error(error);
  QkvValue *y = qkv_graph_op(g, "sum", &x, 1,
                             g_variant_new_parsed("{'axes': <[1]>, 'keepdims': <true>}"), &error);
  g_assert_no_error(error);
  QkvShape want = QKV_SHAPE(2, 1);
  g_assert_true(qkv_shape_equal(qkv_value_shape(y), &want));
  /* no attributes at all: every axis, no keepdims */
  QkvValue *m = qkv_graph_op(g, "mean", &x, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpint(qkv_value_shape(m)->rank, ==, 0);

  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, (QkvValue *[]){y, m}, 2, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) tx = qkv_tensor_new_f32(&s23, iota6);
  g_assert_true(qkv_plan_bind(plan, "x", tx, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  const float want_y[] = {6, 15};
  qkv_assert_values(qkv_plan_output(plan, 0), want_y, 2, 1e-6);
  g_assert_cmpfloat_with_epsilon(qkv_plan_output_scalar(plan, 1), 3.5, 1e-6);
}

/* ---- every kernel path against a naive reference, small and large ---- */

/* Σ of x over the flagged axes, in double, laid out like keepdims output. */
static QkvTensor *
naive_sum(const QkvTensor *x, const gboolean *reduced, gboolean mean)
{
  const QkvShape *s = qkv_tensor_shape(x);
  QkvShape kept = *s;
  for (gint d = 0; d < s->rank; d++)
    if (reduced[d])
      kept.dims[d] = 1;
  gint64 n_out = qkv_shape_numel(&kept), n_in = qkv_shape_numel(s);
  double *acc = g_new0(double, n_out);
  const float *xv = qkv_tensor_const_data(x);
  for (gint64 i = 0; i < n_in; i++) {
    gint64 rest = i, off = 0, stride = 1;
    for (gint d = s->rank - 1; d >= 0; d--) {
      gint64 c = rest % s->dims[d];
      rest /= s->dims[d];
      if (!reduced[d]) {
        off += c * stride;
        stride *= s->dims[d];
      }
    }
    acc[off] += xv[i];
  }
  QkvTensor *out = qkv_tensor_new(QKV_F32, &kept);
  float *o = qkv_tensor_f32(out);
  for (gint64 i = 0; i < n_out; i++)
    o[i] = (float)(mean ? acc[i] * n_out / n_in : acc[i]);
  g_free(acc);
  return out;
}

static void
test_reduce_paths(void)
{
  const QkvShape shapes[] = {QKV_SHAPE(4, 5, 6), QKV_SHAPE(80, 60, 56), QKV_SHAPE(3, 1, 50000, 2)};
  for (gsize s = 0; s < G_N_ELEMENTS(shapes); s++) {
    const QkvShape *sx = &shapes[s];
    g_autoptr(QkvTensor) x = qkv_test_uniform(sx, 5 + (guint32)s, -1, 1);
    g_autoptr(QkvTensor) abs_x = qkv_test_abs(x);
    /* every subset of axes (the empty one meaning all axes) */
    for (guint mask = 0; mask < (1u << sx->rank); mask++) {
      for (int op = OP_SUM; op <= OP_MEAN; op++) {
        ReduceCase c = {.op = (ReduceOp)op, .keepdims = TRUE};
        gboolean reduced[QKV_MAX_RANK];
        for (gint d = 0; d < sx->rank; d++) {
          reduced[d] = mask == 0 || (mask >> d & 1);
          if (mask >> d & 1)
            c.axes[c.n_axes++] = d;
        }
        g_autoptr(QkvTensor) out = qkv_test_eval(1, &x, build_reduce, &c);
        g_autoptr(QkvTensor) want = naive_sum(x, reduced, op == OP_MEAN);
        g_autoptr(QkvTensor) magnitude = naive_sum(abs_x, reduced, op == OP_MEAN);
        g_autofree gchar *label = case_label(&c, sx);
        /* A float32 sum of n terms against the exact one (rounded once):
         * S(n) = qkv_test_sum_factor(n) times the sum of |terms| (of the mean:
         * the mean of |terms|), plus the roundings of want and of the mean's
         * division: S(n) + 2. */
        double n_terms = (double)qkv_tensor_numel(x) / (double)qkv_tensor_numel(want);
        double factor = qkv_test_sum_factor(n_terms) + 2;
        qkv_assert_bounded(label, out, want, magnitude, factor);

        /* sum_to the keepdims shape is the same sum */
        if (op == OP_SUM) {
          ReduceCase t = {.op = OP_SUM_TO, .shape = *qkv_tensor_shape(want)};
          g_autoptr(QkvTensor) out_to = qkv_test_eval(1, &x, build_reduce, &t);
          qkv_assert_bounded(label, out_to, want, magnitude, factor);
        }
      }
    }
  }
}

static void
test_broadcast_paths(void)
{
  const struct {
    QkvShape from, to;
  } cases[] = {
      {qkv_shape_scalar(), QKV_SHAPE(80, 60, 56)},  {QKV_SHAPE(56), QKV_SHAPE(80, 60, 56)},
      {QKV_SHAPE(60, 1), QKV_SHAPE(80, 60, 56)},    {QKV_SHAPE(80, 1, 56), QKV_SHAPE(80, 60, 56)},
      {QKV_SHAPE(1, 60, 1), QKV_SHAPE(80, 60, 56)}, {QKV_SHAPE(80, 60, 56), QKV_SHAPE(80, 60, 56)},
      {QKV_SHAPE(3, 1), QKV_SHAPE(3, 5)},           {QKV_SHAPE(1, 4), QKV_SHAPE(2, 3, 4)},
  };
  for (gsize k = 0; k < G_N_ELEMENTS(cases); k++) {
    const QkvShape *from = &cases[k].from, *to = &cases[k].to;
    g_autoptr(QkvTensor) x = qkv_test_uniform(from, 9 + (guint32)k, -1, 1);
    ReduceCase c = {.op = OP_BROADCAST_TO, .shape = *to};
    g_autoptr(QkvTensor) out = qkv_test_eval(1, &x, build_reduce, &c);
    g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, to);
    float *w = qkv_tensor_f32(want);
    const float *xv = qkv_tensor_const_data(x);
    for (gint64 i = 0; i < qkv_shape_numel(to); i++) {
      gint64 rest = i, off = 0, stride = 1;
      for (gint d = to->rank - 1, xd = from->rank - 1; d >= 0; d--, xd--) {
        gint64 coord = rest % to->dims[d];
        rest /= to->dims[d];
        if (xd >= 0) {
          if (from->dims[xd] != 1)
            off += coord * stride;
          stride *= from->dims[xd];
        }
      }
      w[i] = xv[off];
    }
    qkv_assert_tensor_close(out, want, 0);
  }
}

/* ---- gradients by finite differences ---- */

static void
gradcheck_case(const ReduceCase *c, const QkvShape *sx, guint32 seed)
{
  g_autoptr(QkvTensor) x = qkv_test_uniform(sx, seed, -1, 1);
  g_autofree gchar *label = case_label(c, sx);
  qkv_test_gradcheck(label, 1, &x, NULL, build_reduce, (gpointer)c);
}

static void
test_reduce_gradients(void)
{
  const struct {
    QkvShape x;
    gint axes[3];
    guint n_axes;
    gboolean keepdims;
  } cases[] = {
      {QKV_SHAPE(3, 4), {0}, 0, FALSE},       {QKV_SHAPE(3, 4), {0}, 1, FALSE},
      {QKV_SHAPE(3, 4), {-1}, 1, TRUE},       {QKV_SHAPE(3, 4), {1}, 1, FALSE},
      {QKV_SHAPE(2, 3, 4), {0, 2}, 2, FALSE}, {QKV_SHAPE(2, 3, 4), {1}, 1, TRUE},
      {QKV_SHAPE(2, 3, 4), {1}, 1, FALSE},    {QKV_SHAPE(2, 3, 4), {0, 1, 2}, 3, TRUE},
      {QKV_SHAPE(5), {0}, 0, TRUE},           {qkv_shape_scalar(), {0}, 0, FALSE},
      {QKV_SHAPE(3, 1), {1}, 1, FALSE},
  };
  for (gsize k = 0; k < G_N_ELEMENTS(cases); k++) {
    for (int op = OP_SUM; op <= OP_MEAN; op++) {
      ReduceCase c = {.op = (ReduceOp)op, .n_axes = cases[k].n_axes, .keepdims = cases[k].keepdims};
      memcpy(c.axes, cases[k].axes, sizeof cases[k].axes);
      gradcheck_case(&c, &cases[k].x, 100 + (guint32)k);
    }
  }
}

static void
test_sum_to_broadcast_to_gradients(void)
{
  const struct {
    QkvShape big, small;
  } cases[] = {
      {QKV_SHAPE(3, 4), QKV_SHAPE(4)},          {QKV_SHAPE(3, 4), QKV_SHAPE(3, 1)},
      {QKV_SHAPE(2, 3, 4), QKV_SHAPE(3, 1)},    {QKV_SHAPE(2, 3, 4), QKV_SHAPE(2, 1, 4)},
      {QKV_SHAPE(2, 3, 4), QKV_SHAPE(1, 3, 1)}, {QKV_SHAPE(2, 3), qkv_shape_scalar()},
      {QKV_SHAPE(2, 3), QKV_SHAPE(2, 3)},       {QKV_SHAPE(1, 5), QKV_SHAPE(5)},
  };
  for (gsize k = 0; k < G_N_ELEMENTS(cases); k++) {
    ReduceCase to_small = {.op = OP_SUM_TO, .shape = cases[k].small};
    gradcheck_case(&to_small, &cases[k].big, 200 + (guint32)k);
    ReduceCase to_big = {.op = OP_BROADCAST_TO, .shape = cases[k].big};
    gradcheck_case(&to_big, &cases[k].small, 300 + (guint32)k);
  }
}

static QkvValue *
build_normalise(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  /* (x - mean(x, -1)) / sum(x², -1): reductions feeding broadcasts both ways. */
  gint last = -1;
  QkvValue *mu = qkv_mean(in[0], &last, 1, TRUE, error);
  QkvValue *centred = mu ? qkv_sub(in[0], mu, error) : NULL;
  QkvValue *sq = centred ? qkv_mul(in[0], in[0], error) : NULL;
  QkvValue *ss = sq ? qkv_sum(sq, &last, 1, TRUE, error) : NULL;
  return ss ? qkv_div(centred, ss, error) : NULL;
}

static void
test_composite_gradient(void)
{
  QkvShape s = QKV_SHAPE(3, 5);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 400, 0.5f, 1.5f);
  qkv_test_gradcheck("(x - mean(x)) / sum(x²)", 1, &x, NULL, build_normalise, NULL);
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
  QkvShape s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s23, NULL);
  QkvValue *v = qkv_graph_input(g, "v", QKV_F32, &s3, NULL);
  QkvValue *ids = qkv_graph_input(g, "ids", QKV_I32, &s23, NULL);
  g_assert_nonnull(x);
  guint n_nodes = qkv_graph_n_nodes(g);

  /* axes out of range, or named twice */
  const struct {
    gint axes[2];
    guint n;
  } bad_axes[] = {{{2}, 1}, {{-3}, 1}, {{0, -2}, 2}, {{1, 1}, 2}};
  for (gsize k = 0; k < G_N_ELEMENTS(bad_axes); k++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_sum(x, bad_axes[k].axes, bad_axes[k].n, FALSE, &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "sum");
    g_clear_error(&error);
    g_assert_null(qkv_mean(x, bad_axes[k].axes, bad_axes[k].n, TRUE, &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "mean");
  }

  /* i32 input */
  {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_sum(ids, NULL, 0, FALSE, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, "sum");
    g_clear_error(&error);
    g_assert_null(qkv_mean(ids, NULL, 0, FALSE, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, "mean");
    g_clear_error(&error);
    g_assert_null(qkv_sum_to(ids, &s3, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, "sum_to");
    g_clear_error(&error);
    g_assert_null(qkv_broadcast_to(ids, &s23, &error));
    assert_error_names_op(error, QKV_ERROR_DTYPE, "broadcast_to");
  }

  /* target shapes that do not fit */
  {
    const QkvShape sum_to_bad[] = {QKV_SHAPE(4), QKV_SHAPE(2), QKV_SHAPE(1, 2, 3), QKV_SHAPE(3, 3)};
    for (gsize k = 0; k < G_N_ELEMENTS(sum_to_bad); k++) {
      g_autoptr(GError) error = NULL;
      g_assert_null(qkv_sum_to(x, &sum_to_bad[k], &error));
      assert_error_names_op(error, QKV_ERROR_SHAPE, "sum_to");
    }
    const QkvShape broadcast_bad[] = {QKV_SHAPE(4), QKV_SHAPE(3, 2), qkv_shape_scalar()};
    for (gsize k = 0; k < G_N_ELEMENTS(broadcast_bad); k++) {
      g_autoptr(GError) error = NULL;
      g_assert_null(qkv_broadcast_to(v, &broadcast_bad[k], &error));
      assert_error_names_op(error, QKV_ERROR_SHAPE, "broadcast_to");
    }
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_broadcast_to(x, &s3, &error));
    assert_error_names_op(error, QKV_ERROR_SHAPE, "broadcast_to");
  }

  /* attributes: missing, mistyped, out of range */
  {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_graph_op(g, "sum_to", &x, 1, NULL, &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "sum_to");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "broadcast_to", &v, 1, NULL, &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "broadcast_to");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "broadcast_to", &v, 1,
                               g_variant_new_parsed("{'shape': <'2, 3'>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "broadcast_to");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "broadcast_to", &v, 1,
                               g_variant_new_parsed("{'shape': <[2, -3]>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "broadcast_to");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "broadcast_to", &v, 1,
                               g_variant_new_parsed("{'shape': <[1, 1, 1, 1, 1, 1, 3]>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "broadcast_to");
    g_clear_error(&error);
    g_assert_null(
        qkv_graph_op(g, "mean", &x, 1, g_variant_new_parsed("{'keepdims': <1>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "mean");
    g_clear_error(&error);
    g_assert_null(qkv_graph_op(g, "sum", &x, 1, g_variant_new_parsed("{'axes': <1.5>}"), &error));
    assert_error_names_op(error, QKV_ERROR_ATTRIBUTE, "sum");
  }

  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
}

static void
test_registered(void)
{
  const char *names[] = {"sum", "mean", "sum_to", "broadcast_to"};
  qkv_init();
  for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
    const QkvOpDef *def = qkv_op_lookup(names[i]);
    g_assert_nonnull(def);
    g_assert_cmpstr(def->name, ==, names[i]);
    g_assert_nonnull(def->gradient);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  fill_iota24();
  g_test_add_func("/ops/reduce/registered", test_registered);
  g_test_add_func("/ops/reduce/sum-values", test_sum_values);
  g_test_add_func("/ops/reduce/mean-values", test_mean_values);
  g_test_add_func("/ops/reduce/sum-to-values", test_sum_to_values);
  g_test_add_func("/ops/reduce/broadcast-to-values", test_broadcast_to_values);
  g_test_add_func("/ops/reduce/attrs-by-name", test_attrs_by_name);
  g_test_add_func("/ops/reduce/reduce-paths", test_reduce_paths);
  g_test_add_func("/ops/reduce/broadcast-paths", test_broadcast_paths);
  g_test_add_func("/ops/reduce/reduce-gradients", test_reduce_gradients);
  g_test_add_func("/ops/reduce/sum-to-broadcast-to-gradients", test_sum_to_broadcast_to_gradients);
  g_test_add_func("/ops/reduce/composite-gradient", test_composite_gradient);
  g_test_add_func("/ops/reduce/errors", test_errors);
  return g_test_run();
}
