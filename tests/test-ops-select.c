/* test-ops-select.c: comparisons, maximum/minimum, where, masked_fill,
 * sequence_mask, clamp, abs/sign/sqrt/square/pow, max/min/argmax/argmin over
 * an axis, gather, index_select, cast, unsqueeze, squeeze and expand:
 * against PyTorch (tests/reference/select_ref.py → tests/data/select_ref.txt),
 * against values worked out by hand (NaN, ties, out-of-range indices),
 * gradients by finite differences, bad input, and the threaded paths. */
#include "test-util.h"

#include <math.h>
#include <string.h>

#define MAX_INPUTS 4

/* Unit roundoff of f32. */
#define F32_U (1.0 / 16777216.0)

/* ---- running a graph with gradients ---------------------------------------- */

typedef struct {
  QkvTensor *out;
  QkvTensor *grads[MAX_INPUTS];
} Run;

static void
run_clear(Run *r)
{
  g_clear_pointer(&r->out, qkv_tensor_free);
  for (guint i = 0; i < MAX_INPUTS; i++)
    g_clear_pointer(&r->grads[i], qkv_tensor_free);
}

/* Output of build on inputs and, when weights is given, the gradients of
 * Σ out · weights for the f32 inputs (zeros where none flows). */
static void
run_graph(guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build, gpointer user_data,
          const QkvTensor *weights, gint n_threads, Run *run)
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
  QkvValue *outs[MAX_INPUTS + 1] = {out};
  gint slot[MAX_INPUTS];
  guint n_outs = 1;
  if (weights != NULL) {
    g_assert_true(qkv_shape_equal(qkv_tensor_shape(weights), qkv_value_shape(out)));
    QkvValue *wv = qkv_graph_constant(g, weights, &error);
    QkvValue *loss = qkv_sum(qkv_mul(out, wv, &error), NULL, 0, FALSE, &error);
    g_assert_no_error(error);
    g_assert_true(qkv_graph_backward(g, loss, &error));
    g_assert_no_error(error);
  }
  for (guint i = 0; i < n; i++) {
    QkvValue *gv = weights != NULL && qkv_tensor_dtype(inputs[i]) == QKV_F32
                       ? qkv_graph_gradient(g, in[i])
                       : NULL;
    slot[i] = gv != NULL ? (gint)n_outs : -1;
    if (gv != NULL)
      outs[n_outs++] = gv;
  }
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.n_threads = n_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, &opts, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, inputs[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  run->out = qkv_tensor_copy(qkv_plan_output(plan, 0));
  for (guint i = 0; i < n; i++) {
    run->grads[i] = NULL;
    if (weights == NULL || qkv_tensor_dtype(inputs[i]) != QKV_F32)
      continue;
    if (slot[i] >= 0) {
      run->grads[i] = qkv_tensor_copy(qkv_plan_output(plan, (guint)slot[i]));
    } else {
      run->grads[i] = qkv_tensor_new(QKV_F32, qkv_tensor_shape(inputs[i]));
      qkv_tensor_fill(run->grads[i], 0.0);
    }
  }
}

/* ---- comparing results ------------------------------------------------------ */

static const float *
cf32(const QkvTensor *t)
{
  return qkv_tensor_const_data(t);
}

static const gint32 *
ci32(const QkvTensor *t)
{
  return qkv_tensor_const_data(t);
}

/* Distance in units in the last place between two finite f32 values (the
 * number of floats between them). */
static gint64
ulps_between(float a, float b)
{
  gint32 ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  /* Map the sign-magnitude bit patterns onto one ordered integer line. */
  gint64 oa = ia < 0 ? (gint64)G_MININT32 - ia : ia;
  gint64 ob = ib < 0 ? (gint64)G_MININT32 - ib : ib;
  return oa > ob ? oa - ob : ob - oa;
}

/* Same shape and dtype; i32 elements equal; f32 elements within max_ulps
 * (NaN only against NaN). */
static void
assert_ulps(const char *label, const QkvTensor *actual, const QkvTensor *expected, gint64 max_ulps)
{
  g_autofree gchar *sa = qkv_shape_to_string(qkv_tensor_shape(actual));
  g_autofree gchar *se = qkv_shape_to_string(qkv_tensor_shape(expected));
  if (!qkv_shape_equal(qkv_tensor_shape(actual), qkv_tensor_shape(expected)))
    g_error("%s: shape %s, expected %s", label, sa, se);
  if (qkv_tensor_dtype(actual) != qkv_tensor_dtype(expected))
    g_error("%s: dtype %s, expected %s", label, qkv_dtype_name(qkv_tensor_dtype(actual)),
            qkv_dtype_name(qkv_tensor_dtype(expected)));
  gint64 worst = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(actual); i++) {
    if (qkv_tensor_dtype(actual) == QKV_I32) {
      gint32 a = ci32(actual)[i], e = ci32(expected)[i];
      if (a != e)
        g_error("%s: element %" G_GINT64_FORMAT " is %d, expected %d", label, i, a, e);
      continue;
    }
    float a = cf32(actual)[i], e = cf32(expected)[i];
    if (isnan(a) || isnan(e)) {
      if (!(isnan(a) && isnan(e)))
        g_error("%s: element %" G_GINT64_FORMAT " is %.9g, expected %.9g", label, i, a, e);
      continue;
    }
    gint64 d = ulps_between(a, e);
    worst = MAX(worst, d);
    if (d > max_ulps)
      g_error("%s: element %" G_GINT64_FORMAT " of %s is %.9g, expected %.9g (%" G_GINT64_FORMAT
              " ulps > %" G_GINT64_FORMAT ")",
              label, i, sa, a, e, d, max_ulps);
  }
  g_test_message("%s: %" G_GINT64_FORMAT " ulps at most", label, worst);
}

/* f32 elements within tol absolutely. */
static void
assert_abs(const char *label, const QkvTensor *actual, const QkvTensor *expected, double tol)
{
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(actual), qkv_tensor_shape(expected)));
  double worst = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(actual); i++) {
    double a = qkv_tensor_get(actual, i), e = qkv_tensor_get(expected, i);
    worst = fmax(worst, fabs(a - e));
    if (!(fabs(a - e) <= tol))
      g_error("%s: element %" G_GINT64_FORMAT " is %.9g, expected %.9g (|diff| > %.3g)", label, i,
              a, e, tol);
  }
  g_test_message("%s: max |diff| %.3g (allowed %.3g)", label, worst, tol);
}

/* A gradient element that is a sum of k terms, each at most 1 in size (the
 * reduction weights are in [-1, 1] and the masks 0, 1/2 or 1), summed in
 * f32 in some order: each rounding adds at most u times the partial sum, so
 * any order is within (k - 1)·u·k of the exact sum, and two orders (qkv's
 * and PyTorch's) within twice that. */
static double
sum_tol(gint k)
{
  return 2.0 * (k - 1) * k * F32_U;
}

/* ---- the PyTorch reference ------------------------------------------------- */

static GHashTable *reference;

static QkvTensor *
ref(const gchar *prefix, const gchar *name)
{
  g_autofree gchar *key = g_strconcat(prefix, "_", name, NULL);
  return qkv_test_ref(reference, key);
}

typedef QkvValue *(*BinaryFn)(QkvValue *a, QkvValue *b, GError **error);
typedef QkvValue *(*UnaryFn)(QkvValue *x, GError **error);

static QkvValue *
build_binary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return (*(const BinaryFn *)user_data)(in[0], in[1], error);
}

static QkvValue *
build_unary(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return (*(const UnaryFn *)user_data)(in[0], error);
}

static const struct {
  const char *name;
  BinaryFn fn;
} compare_ops[] = {
    {"eq", qkv_eq}, {"ne", qkv_ne}, {"lt", qkv_lt}, {"le", qkv_le}, {"gt", qkv_gt}, {"ge", qkv_ge},
};

static void
test_reference_compare(void)
{
  /* A comparison has one right answer: exact. */
  const char *prefixes[] = {"cmp", "cmpi"};
  for (gsize p = 0; p < G_N_ELEMENTS(prefixes); p++) {
    QkvTensor *in[] = {ref(prefixes[p], "a"), ref(prefixes[p], "b")};
    for (gsize k = 0; k < G_N_ELEMENTS(compare_ops); k++) {
      Run r = {0};
      run_graph(2, in, build_binary, (gpointer)&compare_ops[k].fn, NULL, 0, &r);
      g_autofree gchar *label = g_strdup_printf("%s %s", prefixes[p], compare_ops[k].name);
      assert_ulps(label, r.out, ref(prefixes[p], compare_ops[k].name), 0);
      run_clear(&r);
    }
  }
}

/* Output exact; the gradient of an input that the output does not broadcast
 * is exact too (dy, dy/2 or 0); one broadcast over k output elements per
 * element is a sum of k terms (sum_tol). */
static void
check_reference(const gchar *prefix, guint n, const gchar *const *in_names,
                const gchar *const *grad_names, const gint *sum_terms, gint64 out_ulps,
                gint64 grad_ulps, QkvCheckBuildFunc build, gpointer user_data)
{
  QkvTensor *in[MAX_INPUTS];
  for (guint i = 0; i < n; i++)
    in[i] = ref(prefix, in_names[i]);
  Run r = {0};
  run_graph(n, in, build, user_data, ref(prefix, "w"), 0, &r);
  g_autofree gchar *label = g_strdup_printf("%s out", prefix);
  assert_ulps(label, r.out, ref(prefix, "out"), out_ulps);
  for (guint i = 0; i < n; i++) {
    if (grad_names[i] == NULL)
      continue;
    g_autofree gchar *gl = g_strdup_printf("%s %s", prefix, grad_names[i]);
    if (sum_terms != NULL && sum_terms[i] > 1)
      assert_abs(gl, r.grads[i], ref(prefix, grad_names[i]), sum_tol(sum_terms[i]));
    else
      assert_ulps(gl, r.grads[i], ref(prefix, grad_names[i]), grad_ulps);
  }
  run_clear(&r);
}

static void
test_reference_maximum_minimum(void)
{
  /* a (2, 3, 4) is not broadcast; b (3, 1) is, over 2 · 4 = 8 elements. */
  const gchar *in[] = {"a", "b"}, *grads[] = {"da", "db"};
  const gint terms[] = {1, 8};
  check_reference("maximum", 2, in, grads, terms, 0, 0, build_binary, &(BinaryFn){qkv_maximum});
  check_reference("minimum", 2, in, grads, terms, 0, 0, build_binary, &(BinaryFn){qkv_minimum});
}

static QkvValue *
build_where(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_where(in[0], in[1], in[2], error);
}

static void
test_reference_where(void)
{
  /* Output (2, 3, 4): a (3, 4) repeats 2 times, b (2, 3, 1) 4 times. */
  const gchar *in[] = {"cond", "a", "b"}, *grads[] = {NULL, "da", "db"};
  const gint terms[] = {0, 2, 4};
  check_reference("where", 3, in, grads, terms, 0, 0, build_where, NULL);
}

static QkvValue *
build_masked_fill(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_masked_fill(in[0], in[1], *(const double *)user_data, error);
}

static void
test_reference_masked_fill(void)
{
  const gchar *in[] = {"x", "mask"}, *grads[] = {"dx", NULL};
  double value = -1e6;
  check_reference("masked_fill", 2, in, grads, NULL, 0, 0, build_masked_fill, &value);
}

static QkvValue *
build_sequence_mask(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_sequence_mask(in[0], *(const gint64 *)user_data, error);
}

static void
test_reference_sequence_mask(void)
{
  const struct {
    const char *prefix;
    gint64 maxlen;
  } cases[] = {{"seqmask1", 6}, {"seqmask2", 4}};
  for (gsize c = 0; c < G_N_ELEMENTS(cases); c++) {
    QkvTensor *lens = ref(cases[c].prefix, "lens");
    Run r = {0};
    run_graph(1, &lens, build_sequence_mask, (gpointer)&cases[c].maxlen, NULL, 0, &r);
    assert_ulps(cases[c].prefix, r.out, ref(cases[c].prefix, "out"), 0);
    run_clear(&r);
  }
}

typedef struct {
  double lo, hi;
} Bounds;

static QkvValue *
build_clamp(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Bounds *b = user_data;
  return qkv_clamp(in[0], b->lo, b->hi, error);
}

static QkvValue *
build_pow(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_pow(in[0], *(const double *)user_data, error);
}

static QkvValue *
build_pow_tensor(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_pow_tensor(in[0], in[1], error);
}

/* Flat index into a tensor of shape in that broadcasts to out, for the
 * output element at flat index i. */
static gint64
bcast_index(const QkvShape *out, gint64 i, const QkvShape *in)
{
  gint64 idx = 0, stride = 1;
  for (gint d = out->rank - 1, k = in->rank - 1; d >= 0; d--, k--) {
    gint64 coord = i % out->dims[d];
    i /= out->dims[d];
    if (k >= 0) {
      idx += (in->dims[k] == 1 ? 0 : coord) * stride;
      stride *= in->dims[k];
    }
  }
  return idx;
}

/* pow_tensor against PyTorch. The forward as pow: 2 ulps. Each gradient
 * element is a sum of k terms w·e·x^(e-1) (for x) or w·x^e·log(x) (for e),
 * one per output element that x or e broadcast to. Per term each side rounds
 * a powf and a logf (each within 1 ulp) and up to 2 products, so 4 u of
 * relative error; summing k terms adds (k - 1) u of their absolute sum S;
 * two implementations double it: |qkv - torch| <= 2 (4 + k - 1) u S, with S
 * computed here in double from the same inputs. */
static void
check_pow_tensor(const gchar *prefix)
{
  QkvTensor *x = ref(prefix, "x"), *e = ref(prefix, "e"), *w = ref(prefix, "w");
  QkvTensor *in[] = {x, e};
  Run r = {0};
  run_graph(2, in, build_pow_tensor, NULL, w, 0, &r);
  g_autofree gchar *label = g_strdup_printf("%s out", prefix);
  assert_ulps(label, r.out, ref(prefix, "out"), 2);
  const QkvShape *os = qkv_tensor_shape(r.out);
  const QkvTensor *inputs[] = {x, e};
  const gchar *grad_names[] = {"dx", "de"};
  for (gint which = 0; which < 2; which++) {
    const QkvShape *is = qkv_tensor_shape(inputs[which]);
    gint64 n = qkv_tensor_numel(inputs[which]);
    g_autofree double *sum_abs = g_new0(double, n);
    g_autofree gint *terms = g_new0(gint, n);
    for (gint64 i = 0; i < qkv_shape_numel(os); i++) {
      double xv = qkv_tensor_get(x, bcast_index(os, i, qkv_tensor_shape(x)));
      double ev = qkv_tensor_get(e, bcast_index(os, i, qkv_tensor_shape(e)));
      double wv = qkv_tensor_get(w, i);
      double term = which == 0 ? (ev == 0 ? 0 : wv * ev * pow(xv, ev - 1))
                               : (xv == 0 && ev >= 0 ? 0 : wv * pow(xv, ev) * log(xv));
      gint64 j = bcast_index(os, i, is);
      sum_abs[j] += fabs(term);
      terms[j]++;
    }
    const QkvTensor *want = ref(prefix, grad_names[which]);
    double worst = 0;
    for (gint64 j = 0; j < n; j++) {
      double got = qkv_tensor_get(r.grads[which], j), exp = qkv_tensor_get(want, j);
      double tol = 2.0 * (4 + terms[j] - 1) * F32_U * sum_abs[j];
      worst = fmax(worst, sum_abs[j] > 0 ? fabs(got - exp) / (tol / (2.0 * (3 + terms[j]))) : 0);
      if (!(fabs(got - exp) <= tol))
        g_error("%s %s: element %" G_GINT64_FORMAT " is %.9g, expected %.9g (allowed %.3g)", prefix,
                grad_names[which], j, got, exp, tol);
    }
    g_test_message("%s %s: largest |diff| / (u S) %.2f", prefix, grad_names[which], worst);
  }
  run_clear(&r);
}

static void
test_reference_math(void)
{
  const gchar *in[] = {"x"}, *grads[] = {"dx"};
  Bounds b = {-0.5, 1.0};
  /* clamp picks, abs negates, square and its gradient 2·dy·x round once
   * the same way in both (the doubling is exact): all exact. */
  check_reference("clamp", 1, in, grads, NULL, 0, 0, build_clamp, &b);
  check_reference("abs", 1, in, grads, NULL, 0, 0, build_unary, &(UnaryFn){qkv_abs});
  check_reference("square", 1, in, grads, NULL, 0, 0, build_unary, &(UnaryFn){qkv_square});
  /* sqrt is correctly rounded in IEEE arithmetic, so both give the same
   * float; its gradient is one rounding of dy / (2 y) in both (qkv's
   * (dy / y) · 0.5 halves exactly). Allowed: 1 ulp, for a sqrt that is
   * faithfully rather than correctly rounded on some CPU. */
  check_reference("sqrt", 1, in, grads, NULL, 1, 1, build_unary, &(UnaryFn){qkv_sqrt});
  /* pow: glibc's powf and PyTorch's vectorised pow are each within 1 ulp of
   * x^p, so within 2 of each other; the gradient p·x^(p-1)·dy adds a
   * rounding of the product on each side: 4 ulps. Both use the same exact
   * forms for p = 2, 1/2, -1 and 0. */
  const struct {
    const char *prefix;
    double p;
  } pows[] = {
      {"pow2", 2.0},   {"pow3", 3.0},     {"powhalf", 0.5}, {"powm1", -1.0},
      {"pow1p5", 1.5}, {"powm2p5", -2.5}, {"pow0", 0.0},    {"powthird", 0.0},
  };
  for (gsize k = 0; k < G_N_ELEMENTS(pows); k++) {
    /* 1/3 rounded to f32, as the script passes it. */
    double p = strcmp(pows[k].prefix, "powthird") == 0 ? (double)(1.0f / 3.0f) : pows[k].p;
    check_reference(pows[k].prefix, 1, in, grads, NULL, 2, 4, build_pow, &p);
  }
  /* pow with a tensor exponent, broadcast both ways, with x = 0 and e = 0 */
  check_pow_tensor("powt");
  check_pow_tensor("powt0");
}

typedef struct {
  gboolean is_max;
  gint axis;
  gboolean keepdims;
  gboolean want_indices;
} ArgCase;

static QkvValue *
build_maxmin(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const ArgCase *c = user_data;
  QkvValue *indices = NULL;
  QkvValue *values = c->is_max ? qkv_max(in[0], c->axis, c->keepdims, &indices, error)
                               : qkv_min(in[0], c->axis, c->keepdims, &indices, error);
  return c->want_indices ? indices : values;
}

static QkvValue *
build_arg(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const ArgCase *c = user_data;
  return c->is_max ? qkv_argmax(in[0], c->axis, c->keepdims, error)
                   : qkv_argmin(in[0], c->axis, c->keepdims, error);
}

static void
test_reference_max_min(void)
{
  /* Picking is exact, and each input element gets at most one term. */
  for (gint is_max = 0; is_max < 2; is_max++) {
    for (gint axis = 0; axis < 3; axis++) {
      g_autofree gchar *prefix = g_strdup_printf("%s%d", is_max ? "max" : "min", axis);
      g_autofree gchar *arg_prefix = g_strdup_printf("arg%s", prefix);
      QkvTensor *x = ref(prefix, "x");
      ArgCase c = {is_max, axis, FALSE, FALSE};
      Run r = {0};
      run_graph(1, &x, build_maxmin, &c, ref(prefix, "w"), 0, &r);
      g_autofree gchar *lv = g_strdup_printf("%s values", prefix);
      g_autofree gchar *ld = g_strdup_printf("%s dx", prefix);
      assert_ulps(lv, r.out, ref(prefix, "values"), 0);
      assert_ulps(ld, r.grads[0], ref(prefix, "dx"), 0);
      run_clear(&r);
      c.want_indices = TRUE;
      run_graph(1, &x, build_maxmin, &c, NULL, 0, &r);
      g_autofree gchar *li = g_strdup_printf("%s indices", prefix);
      assert_ulps(li, r.out, ref(prefix, "indices"), 0);
      run_clear(&r);
      run_graph(1, &x, build_arg, &c, NULL, 0, &r);
      assert_ulps(arg_prefix, r.out, ref(arg_prefix, "out"), 0);
      run_clear(&r);
    }
  }
}

static QkvValue *
build_gather(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_gather(in[0], in[1], GPOINTER_TO_INT(user_data), error);
}

static QkvValue *
build_index_select(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_index_select(in[0], in[1], GPOINTER_TO_INT(user_data), error);
}

/* gather or index_select (op name in user data's IndexZero) asking for
 * zeros where an index is out of range, by name. */
typedef struct {
  const gchar *op;
  gint axis;
} IndexZero;

static QkvValue *
build_index_zero(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const IndexZero *z = user_data;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(z->axis));
  g_variant_builder_add(&attrs, "{sv}", "zero_out_of_range", g_variant_new_boolean(TRUE));
  return qkv_graph_op(graph, z->op, in, 2, g_variant_builder_end(&attrs), error);
}

/* The most times any value occurs in an i32 tensor: how many gradient terms
 * one input element can collect. */
static gint
max_repeats(const QkvTensor *index)
{
  g_autoptr(GHashTable) counts = g_hash_table_new(g_direct_hash, g_direct_equal);
  gint most = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(index); i++) {
    gpointer key = GINT_TO_POINTER(ci32(index)[i]);
    gint n = GPOINTER_TO_INT(g_hash_table_lookup(counts, key)) + 1;
    g_hash_table_insert(counts, key, GINT_TO_POINTER(n));
    most = MAX(most, n);
  }
  return most;
}

static void
test_reference_gather_index_select(void)
{
  const gchar *in[] = {"x", "index"}, *grads[] = {"dx", NULL};
  const struct {
    const char *prefix;
    gint axis;
    QkvCheckBuildFunc build;
  } cases[] = {
      {"gather", 1, build_gather},
      {"gather0", 0, build_gather},
      {"isel", 1, build_index_select},
      {"isel2", -1, build_index_select},
  };
  for (gsize c = 0; c < G_N_ELEMENTS(cases); c++) {
    /* An element of x collects a term per time its index is picked: bounded
     * by the most any index value repeats. */
    gint terms[] = {max_repeats(ref(cases[c].prefix, "index")), 0};
    check_reference(cases[c].prefix, 2, in, grads, terms, 0, 0, cases[c].build,
                    GINT_TO_POINTER(cases[c].axis));
  }
}

static QkvValue *
build_cast(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_cast(in[0], (QkvDType)GPOINTER_TO_INT(user_data), error);
}

static QkvValue *
build_unsqueeze(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_unsqueeze(in[0], GPOINTER_TO_INT(user_data), error);
}

static QkvValue *
build_squeeze(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  gint axis = GPOINTER_TO_INT(user_data);
  return axis < 0 ? qkv_squeeze(in[0], NULL, 0, error) : qkv_squeeze(in[0], &axis, 1, error);
}

static QkvValue *
build_expand(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_expand(in[0], user_data, error);
}

static void
check_unary_ref(const char *label, QkvTensor *x, QkvCheckBuildFunc build, gpointer user_data,
                const QkvTensor *want)
{
  Run r = {0};
  run_graph(1, &x, build, user_data, NULL, 0, &r);
  assert_ulps(label, r.out, want, 0);
  run_clear(&r);
}

static void
test_reference_cast_views(void)
{
  /* Conversions and moves: exact. */
  check_unary_ref("cast f32 → i32", ref("cast", "f"), build_cast, GINT_TO_POINTER(QKV_I32),
                  ref("cast", "f_to_i"));
  check_unary_ref("cast i32 → f32", ref("cast", "i"), build_cast, GINT_TO_POINTER(QKV_F32),
                  ref("cast", "i_to_f"));
  check_unary_ref("unsqueeze 1", ref("unsqueeze", "x"), build_unsqueeze, GINT_TO_POINTER(1),
                  ref("unsqueeze", "out1"));
  check_unary_ref("unsqueeze -1", ref("unsqueeze", "x"), build_unsqueeze, GINT_TO_POINTER(-1),
                  ref("unsqueeze", "outm1"));
  check_unary_ref("squeeze all", ref("squeeze", "x"), build_squeeze, GINT_TO_POINTER(-1),
                  ref("squeeze", "all"));
  check_unary_ref("squeeze 2", ref("squeeze", "x"), build_squeeze, GINT_TO_POINTER(2),
                  ref("squeeze", "2"));
  /* (3, 1) → (2, 3, 4): each element repeats 8 times; (2, 1, 4) →
   * (2, 5, 4): 5 times. */
  const gchar *in[] = {"x"}, *grads[] = {"dx"};
  QkvShape s1 = QKV_SHAPE(2, 3, 4), s2 = QKV_SHAPE(-1, 5, -1);
  const gint terms1[] = {8}, terms2[] = {5};
  check_reference("expand", 1, in, grads, terms1, 0, 0, build_expand, &s1);
  check_reference("expand2", 1, in, grads, terms2, 0, 0, build_expand, &s2);
}

/* ---- values worked out by hand: NaN, ties, bounds, bad indices -------------- */

static QkvTensor *
f32_tensor(const QkvShape *shape, const float *values)
{
  return qkv_tensor_new_f32(shape, values);
}

/* Evaluate build on inputs; assert the output equals want exactly (NaN
 * against NaN). */
static void
check_values(const char *label, guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build,
             gpointer user_data, const QkvShape *shape, QkvDType dtype, const float *want)
{
  Run r = {0};
  run_graph(n, inputs, build, user_data, NULL, 0, &r);
  g_autoptr(QkvTensor) expected = qkv_tensor_new(dtype, shape);
  for (gint64 i = 0; i < qkv_tensor_numel(expected); i++) {
    if (dtype == QKV_F32)
      qkv_tensor_f32(expected)[i] = want[i];
    else
      qkv_tensor_i32(expected)[i] = (gint32)want[i];
  }
  assert_ulps(label, r.out, expected, 0);
  run_clear(&r);
}

/* The same for an i32 output (whose extremes floats cannot carry). */
static void
check_values_i32(const char *label, guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                 gpointer user_data, const QkvShape *shape, const gint32 *want)
{
  Run r = {0};
  run_graph(n, inputs, build, user_data, NULL, 0, &r);
  g_autoptr(QkvTensor) expected = qkv_tensor_new_i32(shape, want);
  assert_ulps(label, r.out, expected, 0);
  run_clear(&r);
}

static void
test_nan_semantics(void)
{
  QkvShape s4 = QKV_SHAPE(4);
  const float a[] = {NAN, 1, NAN, 2}, b[] = {1, NAN, NAN, 2};
  g_autoptr(QkvTensor) ta = f32_tensor(&s4, a);
  g_autoptr(QkvTensor) tb = f32_tensor(&s4, b);
  QkvTensor *in[] = {ta, tb};
  /* NaN is unequal to everything, itself included. */
  const float eq[] = {0, 0, 0, 1}, ne[] = {1, 1, 1, 0}, none[] = {0, 0, 0, 0}, le[] = {0, 0, 0, 1};
  check_values("eq NaN", 2, in, build_binary, &(BinaryFn){qkv_eq}, &s4, QKV_F32, eq);
  check_values("ne NaN", 2, in, build_binary, &(BinaryFn){qkv_ne}, &s4, QKV_F32, ne);
  check_values("lt NaN", 2, in, build_binary, &(BinaryFn){qkv_lt}, &s4, QKV_F32, none);
  check_values("le NaN", 2, in, build_binary, &(BinaryFn){qkv_le}, &s4, QKV_F32, le);
  check_values("gt NaN", 2, in, build_binary, &(BinaryFn){qkv_gt}, &s4, QKV_F32, none);
  /* maximum and minimum propagate NaN from either side. */
  const float mx[] = {NAN, NAN, NAN, 2};
  check_values("maximum NaN", 2, in, build_binary, &(BinaryFn){qkv_maximum}, &s4, QKV_F32, mx);
  check_values("minimum NaN", 2, in, build_binary, &(BinaryFn){qkv_minimum}, &s4, QKV_F32, mx);

  /* The first NaN along the axis wins max and min, as in PyTorch. */
  QkvShape s23 = QKV_SHAPE(2, 3);
  const float x[] = {1, NAN, NAN, 5, 2, 5};
  g_autoptr(QkvTensor) tx = f32_tensor(&s23, x);
  QkvShape s2 = QKV_SHAPE(2);
  ArgCase amax = {TRUE, 1, FALSE, TRUE}, amin = {FALSE, 1, FALSE, TRUE};
  const float idx_max[] = {1, 0}, idx_min[] = {1, 1};
  check_values("max NaN indices", 1, &tx, build_maxmin, &amax, &s2, QKV_I32, idx_max);
  check_values("min NaN indices", 1, &tx, build_maxmin, &amin, &s2, QKV_I32, idx_min);
  check_values("argmax NaN", 1, &tx, build_arg, &amax, &s2, QKV_I32, idx_max);
  amax.want_indices = FALSE;
  const float v_max[] = {NAN, 5};
  check_values("max NaN values", 1, &tx, build_maxmin, &amax, &s2, QKV_F32, v_max);

  /* clamp and sign let NaN through; where and masked_fill take a NaN
   * condition as true (nonzero). */
  const float c[] = {NAN, -3, 0.25f, 9};
  g_autoptr(QkvTensor) tc = f32_tensor(&s4, c);
  Bounds bounds = {-1, 1};
  const float clamped[] = {NAN, -1, 0.25f, 1};
  check_values("clamp NaN", 1, &tc, build_clamp, &bounds, &s4, QKV_F32, clamped);
  const float signs[] = {NAN, -1, 1, 1};
  check_values("sign NaN", 1, &tc, build_unary, &(UnaryFn){qkv_sign}, &s4, QKV_F32, signs);
  const float cond[] = {NAN, 0, -0.0f, 2};
  g_autoptr(QkvTensor) tcond = f32_tensor(&s4, cond);
  QkvTensor *win[] = {tcond, ta, tb};
  const float picked[] = {NAN, NAN, NAN, 2};
  check_values("where NaN cond", 3, win, build_where, NULL, &s4, QKV_F32, picked);
  QkvTensor *min_[] = {tb, tcond};
  double value = 7;
  const float filled[] = {7, NAN, NAN, 7};
  check_values("masked_fill NaN mask", 2, min_, build_masked_fill, &value, &s4, QKV_F32, filled);
}

static void
test_cast_edges(void)
{
  /* NaN → 0; beyond the i32 range saturates; truncation toward zero. */
  QkvShape s8 = QKV_SHAPE(8);
  const float f[] = {NAN, INFINITY, -INFINITY, 3e9f, -3e9f, 2147483520.0f, -2.9f, 2.9f};
  g_autoptr(QkvTensor) tf = f32_tensor(&s8, f);
  const gint32 want[] = {0, G_MAXINT32, G_MININT32, G_MAXINT32, G_MININT32, 2147483520, -2, 2};
  check_values_i32("cast edges", 1, &tf, build_cast, GINT_TO_POINTER(QKV_I32), &s8, want);
  /* A cast to the same dtype copies. */
  check_values("cast f32 → f32", 1, &tf, build_cast, GINT_TO_POINTER(QKV_F32), &s8, QKV_F32, f);
  const gint32 iv[] = {-7, 0, 1 << 30};
  QkvShape s3 = QKV_SHAPE(3);
  g_autoptr(QkvTensor) ti = qkv_tensor_new_i32(&s3, iv);
  check_values_i32("cast i32 → i32", 1, &ti, build_cast, GINT_TO_POINTER(QKV_I32), &s3, iv);
}

static void
test_ties_and_keepdims(void)
{
  /* Ties: the first index; keepdims keeps the axis as size 1. */
  QkvShape s23 = QKV_SHAPE(2, 3), s21 = QKV_SHAPE(2, 1), s13 = QKV_SHAPE(1, 3);
  const float x[] = {4, 4, 1, -2, 3, 3};
  g_autoptr(QkvTensor) tx = f32_tensor(&s23, x);
  ArgCase c = {TRUE, -1, TRUE, TRUE};
  const float imax[] = {0, 1}, imin[] = {2, 0}, vmax[] = {4, 3};
  check_values("max keepdims indices", 1, &tx, build_maxmin, &c, &s21, QKV_I32, imax);
  check_values("argmax keepdims", 1, &tx, build_arg, &c, &s21, QKV_I32, imax);
  c.want_indices = FALSE;
  check_values("max keepdims values", 1, &tx, build_maxmin, &c, &s21, QKV_F32, vmax);
  c.is_max = FALSE;
  check_values("argmin keepdims", 1, &tx, build_arg, &c, &s21, QKV_I32, imin);
  ArgCase c0 = {TRUE, 0, TRUE, TRUE};
  const float i0[] = {0, 0, 1};
  check_values("argmax axis 0", 1, &tx, build_arg, &c0, &s13, QKV_I32, i0);

  /* The gradient of max goes to the first of the tied elements only. */
  g_autoptr(QkvTensor) w = qkv_tensor_new(QKV_F32, &s21);
  qkv_tensor_fill(w, 1.0);
  c.is_max = TRUE;
  Run r = {0};
  run_graph(1, (QkvTensor *[]){tx}, build_maxmin, &c, w, 0, &r);
  const float dx[] = {1, 0, 0, 0, 1, 0};
  qkv_assert_values(r.grads[0], dx, 6, 0);
  run_clear(&r);

  /* maximum and minimum split the gradient in half on ties. */
  QkvShape s3 = QKV_SHAPE(3);
  const float a[] = {1, 2, 3}, b[] = {1, 5, 0};
  g_autoptr(QkvTensor) ta = f32_tensor(&s3, a);
  g_autoptr(QkvTensor) tb = f32_tensor(&s3, b);
  g_autoptr(QkvTensor) ones = qkv_tensor_new(QKV_F32, &s3);
  qkv_tensor_fill(ones, 1.0);
  run_graph(2, (QkvTensor *[]){ta, tb}, build_binary, &(BinaryFn){qkv_maximum}, ones, 0, &r);
  const float da[] = {0.5f, 0, 1}, db[] = {0.5f, 1, 0};
  qkv_assert_values(r.grads[0], da, 3, 0);
  qkv_assert_values(r.grads[1], db, 3, 0);
  run_clear(&r);
}

static void
test_out_of_range_indices(void)
{
  /* With zero_out_of_range, an index outside [0, n) gives 0 and takes no
   * gradient. */
  IndexZero gather_zero = {"gather", 1}, select_zero = {"index_select", 1};
  QkvShape s23 = QKV_SHAPE(2, 3), s22 = QKV_SHAPE(2, 2), s4 = QKV_SHAPE(4), s24 = QKV_SHAPE(2, 4);
  const float x[] = {1, 2, 3, 4, 5, 6};
  g_autoptr(QkvTensor) tx = f32_tensor(&s23, x);
  const gint32 gi[] = {2, -1, 3, 0};
  g_autoptr(QkvTensor) tgi = qkv_tensor_new_i32(&s22, gi);
  const float want_g[] = {3, 0, 0, 4};
  check_values("gather out of range", 2, (QkvTensor *[]){tx, tgi}, build_index_zero, &gather_zero,
               &s22, QKV_F32, want_g);
  g_autoptr(QkvTensor) w = qkv_tensor_new(QKV_F32, &s22);
  qkv_tensor_fill(w, 1.0);
  Run r = {0};
  run_graph(2, (QkvTensor *[]){tx, tgi}, build_index_zero, &gather_zero, w, 0, &r);
  const float dg[] = {0, 0, 1, 1, 0, 0};
  qkv_assert_values(r.grads[0], dg, 6, 0);
  run_clear(&r);

  const gint32 si[] = {1, 3, -2, 1};
  g_autoptr(QkvTensor) tsi = qkv_tensor_new_i32(&s4, si);
  const float want_s[] = {2, 0, 0, 2, 5, 0, 0, 5};
  check_values("index_select out of range", 2, (QkvTensor *[]){tx, tsi}, build_index_zero,
               &select_zero, &s24, QKV_F32, want_s);
  g_autoptr(QkvTensor) w24 = qkv_tensor_new(QKV_F32, &s24);
  qkv_tensor_fill(w24, 1.0);
  run_graph(2, (QkvTensor *[]){tx, tsi}, build_index_zero, &select_zero, w24, 0, &r);
  const float ds[] = {0, 2, 0, 0, 2, 0};
  qkv_assert_values(r.grads[0], ds, 6, 0);
  run_clear(&r);

  /* gather and index_select move i32 data too. */
  const gint32 ids[] = {10, 20, 30, 40, 50, 60};
  g_autoptr(QkvTensor) tids = qkv_tensor_new_i32(&s23, ids);
  const float want_i[] = {30, 0, 0, 40};
  check_values("gather i32", 2, (QkvTensor *[]){tids, tgi}, build_index_zero, &gather_zero, &s22,
               QKV_I32, want_i);
}

/* Without zero_out_of_range an index out of range fails the run, naming the
 * node, the position and the value (it used to give 0); of several, the
 * first position. */
static void
test_out_of_range_fails(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), s22 = QKV_SHAPE(2, 2), s4 = QKV_SHAPE(4);
  const float x[] = {1, 2, 3, 4, 5, 6};
  g_autoptr(QkvTensor) tx = f32_tensor(&s23, x);
  const gint32 gi[] = {2, 0, 3, -1};
  g_autoptr(QkvTensor) tgi = qkv_tensor_new_i32(&s22, gi);
  qkv_test_assert_eval_fails(2, (QkvTensor *[]){tx, tgi}, build_gather, GINT_TO_POINTER(1),
                             QKV_ERROR_INDEX,
                             "run: node 'gather_0' (gather): index 3 at position [1, 0] is "
                             "outside [0, 3) (the size of axis 1)");
  const gint32 si[] = {1, 0, -2, 5};
  g_autoptr(QkvTensor) tsi = qkv_tensor_new_i32(&s4, si);
  qkv_test_assert_eval_fails(2, (QkvTensor *[]){tx, tsi}, build_index_select, GINT_TO_POINTER(0),
                             QKV_ERROR_INDEX,
                             "run: node 'index_select_0' (index_select): index -2 at position "
                             "[2] is outside [0, 2) (the size of axis 0)");

  /* large enough for several threads, bad indices in two of their chunks */
  QkvShape sx = QKV_SHAPE(64, 300), sg = QKV_SHAPE(64, 200);
  g_autoptr(QkvTensor) big = qkv_test_uniform(&sx, 3, -1, 1);
  g_autoptr(QkvTensor) gidx = qkv_test_randint(&sg, 4, 0, 300);
  qkv_tensor_i32(gidx)[60 * 200 + 7] = 300;
  qkv_tensor_i32(gidx)[40 * 200 + 150] = -3;
  qkv_test_assert_eval_fails(2, (QkvTensor *[]){big, gidx}, build_gather, GINT_TO_POINTER(1),
                             QKV_ERROR_INDEX,
                             "(gather): index -3 at position [40, 150] is outside [0, 300)");
  QkvShape sl = QKV_SHAPE(5000);
  g_autoptr(QkvTensor) sidx = qkv_test_randint(&sl, 5, 0, 64);
  qkv_tensor_i32(sidx)[4321] = 64;
  qkv_tensor_i32(sidx)[4999] = 65;
  qkv_test_assert_eval_fails(2, (QkvTensor *[]){big, sidx}, build_index_select, GINT_TO_POINTER(0),
                             QKV_ERROR_INDEX,
                             "(index_select): index 64 at position [4321] is outside [0, 64)");
}

static void
test_small_cases(void)
{
  /* sequence_mask with maxlen 0 is empty; masked_fill and where take an
   * i32 mask or condition; comparisons of i32 ids make masks. */
  const gint32 lens[] = {2, 0};
  QkvShape s2 = QKV_SHAPE(2), s20 = QKV_SHAPE(2, 0), s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3);
  g_autoptr(QkvTensor) tl = qkv_tensor_new_i32(&s2, lens);
  gint64 zero = 0, three = 3;
  check_values("sequence_mask maxlen 0", 1, &tl, build_sequence_mask, &zero, &s20, QKV_F32, NULL);
  const float m3[] = {1, 1, 0, 0, 0, 0};
  check_values("sequence_mask", 1, &tl, build_sequence_mask, &three, &s23, QKV_F32, m3);

  const float x[] = {1, 2, 3, 4, 5, 6};
  g_autoptr(QkvTensor) tx = f32_tensor(&s23, x);
  const gint32 mi[] = {0, 1, 0};
  g_autoptr(QkvTensor) tm = qkv_tensor_new_i32(&s3, mi);
  double value = -1;
  const float filled[] = {1, -1, 3, 4, -1, 6};
  check_values("masked_fill i32 mask", 2, (QkvTensor *[]){tx, tm}, build_masked_fill, &value, &s23,
               QKV_F32, filled);
  QkvShape scalar = qkv_shape_scalar();
  const float zv[] = {0};
  g_autoptr(QkvTensor) tz = f32_tensor(&scalar, zv);
  const float picked[] = {0, 2, 0, 0, 5, 0};
  check_values("where i32 cond", 3, (QkvTensor *[]){tm, tx, tz}, build_where, NULL, &s23, QKV_F32,
               picked);
  const gint32 ids[] = {5, 0, 0, 7, 0, 1}, pad[] = {0};
  g_autoptr(QkvTensor) tids = qkv_tensor_new_i32(&s23, ids);
  g_autoptr(QkvTensor) tpad = qkv_tensor_new_i32(&scalar, pad);
  const float ne[] = {1, 0, 0, 1, 0, 1};
  check_values("ids != pad", 2, (QkvTensor *[]){tids, tpad}, build_binary, &(BinaryFn){qkv_ne},
               &s23, QKV_F32, ne);
  /* sqrt(0) = 0, abs(-0) = 0, pow(x, 0) = 1 even at 0. */
  const float e[] = {0, -0.0f, 4};
  g_autoptr(QkvTensor) te = f32_tensor(&s3, e);
  const float sq[] = {0, -0.0f, 2}, ab[] = {0, 0, 4}, ones[] = {1, 1, 1};
  check_values("sqrt", 1, &te, build_unary, &(UnaryFn){qkv_sqrt}, &s3, QKV_F32, sq);
  check_values("abs", 1, &te, build_unary, &(UnaryFn){qkv_abs}, &s3, QKV_F32, ab);
  double p0 = 0;
  check_values("pow 0", 1, &te, build_pow, &p0, &s3, QKV_F32, ones);
  /* a clamp with one bound only */
  Bounds lower = {0.5, INFINITY};
  const float cl[] = {1, 2, 3, 4, 5, 6};
  check_values("clamp lower only", 1, &tx, build_clamp, &lower, &s23, QKV_F32, cl);
  /* expand of a scalar, and to a shape with a zero axis */
  QkvShape target = QKV_SHAPE(2, 2), s02 = QKV_SHAPE(0, 2);
  const float nine[] = {9, 9, 9, 9};
  check_values("expand scalar", 1, (QkvTensor *[]){tz}, build_expand, &target, &target, QKV_F32,
               (const float[]){0, 0, 0, 0});
  g_autoptr(QkvTensor) t9 = f32_tensor(&scalar, nine);
  check_values("expand scalar 9", 1, &t9, build_expand, &target, &target, QKV_F32, nine);
  check_values("expand to empty", 1, &t9, build_expand, &s02, &s02, QKV_F32, NULL);
}

/* ---- gradients by finite differences ---------------------------------------- */

static void
gradcheck(const char *label, guint n, QkvTensor *const *inputs, QkvCheckBuildFunc build,
          gpointer user_data)
{
  qkv_test_gradcheck(label, n, inputs, NULL, build, user_data);
}

/* Values on a grid of spacing gap plus a small random part, shuffled, so
 * that no two are within gap/2 of each other: a finite-difference step of
 * 1e-2 never crosses a tie (maximum, max, clamp) or a kink (abs at 0). */
static QkvTensor *
spaced(const QkvShape *shape, guint32 seed, float gap, float offset)
{
  QkvTensor *t = qkv_tensor_new(QKV_F32, shape);
  GRand *rand = g_rand_new_with_seed(seed);
  gint64 n = qkv_tensor_numel(t);
  float *v = qkv_tensor_f32(t);
  for (gint64 i = 0; i < n; i++)
    v[i] = offset + gap * ((float)i + (float)g_rand_double_range(rand, 0.2, 0.3));
  for (gint64 i = n - 1; i > 0; i--) {
    gint64 j = g_rand_int_range(rand, 0, (gint32)i + 1);
    float tmp = v[i];
    v[i] = v[j];
    v[j] = tmp;
  }
  g_rand_free(rand);
  return t;
}

static void
test_gradients_compare_select(void)
{
  /* a on a grid of spacing 0.1 (values ending in .02 to .03), b between its
   * points: never tied, never within a finite-difference step. */
  QkvShape s234 = QKV_SHAPE(2, 3, 4), s31 = QKV_SHAPE(3, 1), s24 = QKV_SHAPE(24), s4 = QKV_SHAPE(4);
  g_autoptr(QkvTensor) pool = spaced(&s24, 1, 0.1f, -1.2f);
  g_autoptr(QkvTensor) a = qkv_tensor_new(QKV_F32, &s234);
  g_autoptr(QkvTensor) b = qkv_tensor_new(QKV_F32, &s31);
  g_autoptr(QkvTensor) b4 = qkv_tensor_new(QKV_F32, &s4);
  for (gint i = 0; i < 24; i++)
    qkv_tensor_f32(a)[i] = cf32(pool)[i];
  const float bv[] = {-0.55f, 0.05f, 0.65f}, b4v[] = {-0.95f, -0.25f, 0.35f, 0.95f};
  memcpy(qkv_tensor_f32(b), bv, sizeof bv);
  memcpy(qkv_tensor_f32(b4), b4v, sizeof b4v);
  QkvTensor *in[] = {a, b}, *in4[] = {a, b4};
  gradcheck("maximum (2,3,4) (3,1)", 2, in, build_binary, &(BinaryFn){qkv_maximum});
  gradcheck("minimum (2,3,4) (3,1)", 2, in, build_binary, &(BinaryFn){qkv_minimum});
  gradcheck("maximum (2,3,4) (4)", 2, in4, build_binary, &(BinaryFn){qkv_maximum});
  gradcheck("minimum (3,1) (2,3,4)", 2, (QkvTensor *[]){b, a}, build_binary,
            &(BinaryFn){qkv_minimum});
  /* A comparison's rule gives no gradient; away from ties the finite
   * difference is zero too. */
  for (gsize k = 0; k < G_N_ELEMENTS(compare_ops); k++)
    gradcheck(compare_ops[k].name, 2, in, build_binary, (gpointer)&compare_ops[k].fn);
  gradcheck("sign", 1, &a, build_unary, &(UnaryFn){qkv_sign});

  /* where, broadcasting all three ways */
  QkvShape s214 = QKV_SHAPE(2, 1, 4), s34 = QKV_SHAPE(3, 4), s231 = QKV_SHAPE(2, 3, 1);
  g_autoptr(QkvTensor) cond = qkv_test_randint(&s214, 3, 0, 2);
  g_autoptr(QkvTensor) condf = qkv_tensor_new(QKV_F32, &s214);
  for (gint i = 0; i < 8; i++)
    qkv_tensor_f32(condf)[i] = (float)ci32(cond)[i];
  g_autoptr(QkvTensor) wa = qkv_test_uniform(&s34, 4, -1, 1);
  g_autoptr(QkvTensor) wb = qkv_test_uniform(&s231, 5, -1, 1);
  gradcheck("where i32 cond", 3, (QkvTensor *[]){cond, wa, wb}, build_where, NULL);
  gradcheck("where f32 cond", 3, (QkvTensor *[]){condf, wa, wb}, build_where, NULL);
  gradcheck("where (a, a)", 3, (QkvTensor *[]){condf, wa, wa}, build_where, NULL);

  /* masked_fill */
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s234, 6, -1, 1);
  double value = 3;
  gradcheck("masked_fill", 2, (QkvTensor *[]){x, condf}, build_masked_fill, &value);
  gradcheck("masked_fill i32", 2, (QkvTensor *[]){x, cond}, build_masked_fill, &value);

  /* clamp, away from the bounds by more than a step */
  g_autoptr(QkvTensor) c = spaced(&s234, 7, 0.1f, -1.2f);
  for (gint64 i = 0; i < 24; i++) {
    float *v = &qkv_tensor_f32(c)[i];
    if (fabsf(*v + 0.5f) < 0.03f || fabsf(*v - 0.5f) < 0.03f)
      *v += 0.04f;
  }
  Bounds bounds = {-0.5, 0.5};
  gradcheck("clamp", 1, &c, build_clamp, &bounds);
}

static QkvValue *
build_clamp_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Bounds *b = user_data;
  return qkv_clamp_backward(in[0], in[1], b->lo, b->hi, error);
}

static void
test_gradients_math(void)
{
  const QkvShape shapes[] = {qkv_shape_scalar(), QKV_SHAPE(5), QKV_SHAPE(3, 4)};
  for (gsize s = 0; s < G_N_ELEMENTS(shapes); s++) {
    /* abs: away from the kink at 0 */
    g_autoptr(QkvTensor) x = spaced(&shapes[s], 11 + (guint32)s, 0.3f, -1.7f);
    g_autoptr(QkvTensor) pos = qkv_test_uniform(&shapes[s], 12 + (guint32)s, 0.5f, 2);
    gradcheck("abs", 1, &x, build_unary, &(UnaryFn){qkv_abs});
    gradcheck("square", 1, &x, build_unary, &(UnaryFn){qkv_square});
    gradcheck("sqrt", 1, &pos, build_unary, &(UnaryFn){qkv_sqrt});
    const double ps[] = {2, 3, 0.5, -1, 1.5, -2.5, 1, 0, 1.0 / 3};
    for (gsize k = 0; k < G_N_ELEMENTS(ps); k++) {
      g_autofree gchar *label = g_strdup_printf("pow %g", ps[k]);
      gradcheck(label, 1, &pos, build_pow, (gpointer)&ps[k]);
    }
    /* integer exponents on negative x */
    const double p3 = 3;
    gradcheck("pow 3, any sign", 1, &x, build_pow, (gpointer)&p3);
    /* a tensor exponent: x > 0 against e in [-2, 2] of the same shape, and
     * of shape (…, 1) broadcast against x */
    g_autoptr(QkvTensor) ex = qkv_test_uniform(&shapes[s], 13 + (guint32)s, -2, 2);
    gradcheck("pow_tensor", 2, (QkvTensor *[]){pos, ex}, build_pow_tensor, NULL);
    QkvShape col = shapes[s];
    if (col.rank > 0) /* a scalar exponent broadcasts as it is */
      col.dims[col.rank - 1] = 1;
    g_autoptr(QkvTensor) ecol = qkv_test_uniform(&col, 14 + (guint32)s, -2, 2);
    gradcheck("pow_tensor broadcast", 2, (QkvTensor *[]){pos, ecol}, build_pow_tensor, NULL);
  }
  /* clamp_backward: linear in dy; its rule gives x none (flat there). */
  QkvShape s = QKV_SHAPE(3, 4);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&s, 13, -1, 1);
  g_autoptr(QkvTensor) xs = spaced(&s, 14, 0.2f, -1.1f);
  Bounds b = {-0.5, 0.5};
  gradcheck("clamp_backward", 2, (QkvTensor *[]){dy, xs}, build_clamp_backward, &b);
}

static QkvValue *
build_gather_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const QkvShape *shape = user_data;
  return qkv_gather_backward(in[0], in[1], shape, 1, error);
}

static QkvValue *
build_index_select_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data,
                            GError **error)
{
  return qkv_index_select_backward(in[0], in[1], GPOINTER_TO_INT(user_data), 0, error);
}

static void
test_gradients_index(void)
{
  /* max/min values over each axis, keepdims or not: distinct values */
  QkvShape s345 = QKV_SHAPE(3, 4, 5);
  g_autoptr(QkvTensor) x = spaced(&s345, 21, 0.05f, -1.5f);
  for (gint is_max = 0; is_max < 2; is_max++)
    for (gint axis = -1; axis < 3; axis++)
      for (gint keep = 0; keep < 2; keep++) {
        ArgCase c = {is_max, axis, keep, FALSE};
        g_autofree gchar *label =
            g_strdup_printf("%s axis %d keepdims %d", is_max ? "max" : "min", axis, keep);
        gradcheck(label, 1, &x, build_maxmin, &c);
      }

  /* gather with repeated indices, on each axis, index smaller off-axis */
  QkvShape si1 = QKV_SHAPE(2, 6, 3), si0 = QKV_SHAPE(5, 4, 5), si2 = QKV_SHAPE(3, 2, 7);
  g_autoptr(QkvTensor) i1 = qkv_test_randint(&si1, 22, 0, 4);
  g_autoptr(QkvTensor) i0 = qkv_test_randint(&si0, 23, 0, 3);
  g_autoptr(QkvTensor) i2 = qkv_test_randint(&si2, 24, 0, 5);
  gradcheck("gather axis 1", 2, (QkvTensor *[]){x, i1}, build_gather, GINT_TO_POINTER(1));
  gradcheck("gather axis 0", 2, (QkvTensor *[]){x, i0}, build_gather, GINT_TO_POINTER(0));
  gradcheck("gather axis -1", 2, (QkvTensor *[]){x, i2}, build_gather, GINT_TO_POINTER(-1));

  /* index_select with repeats, each axis */
  const gint32 iv[] = {2, 0, 2, 1, 2};
  QkvShape s5 = QKV_SHAPE(5);
  g_autoptr(QkvTensor) isel = qkv_tensor_new_i32(&s5, iv);
  for (gint axis = 0; axis < 3; axis++) {
    g_autofree gchar *label = g_strdup_printf("index_select axis %d", axis);
    gradcheck(label, 2, (QkvTensor *[]){x, isel}, build_index_select, GINT_TO_POINTER(axis));
  }

  /* the scatter-add ops themselves (linear in dy) */
  g_autoptr(QkvTensor) dy1 = qkv_test_uniform(&si1, 25, -1, 1);
  QkvShape gshape = QKV_SHAPE(3, 4, 5);
  gradcheck("gather_backward", 2, (QkvTensor *[]){dy1, i1}, build_gather_backward, &gshape);
  QkvShape sdy = QKV_SHAPE(5, 3);
  g_autoptr(QkvTensor) dy2 = qkv_test_uniform(&sdy, 26, -1, 1);
  gradcheck("index_select_backward", 2, (QkvTensor *[]){dy2, isel}, build_index_select_backward,
            GINT_TO_POINTER(4));
}

static QkvValue *
build_view_chain(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  /* (3, 1) → unsqueeze 0 → (1, 3, 1) → expand (4, 3, 2) → cast f32 → f32
   * → times y → unsqueeze and squeeze back → slice → squeeze axis 2: (4, 3). */
  QkvShape target = QKV_SHAPE(4, -1, 2);
  QkvValue *v = qkv_unsqueeze(in[0], 0, error);
  v = qkv_expand(v, &target, error);
  v = qkv_cast(v, QKV_F32, error);
  v = qkv_mul(v, in[1], error);
  gint axis = 2;
  QkvValue *s = qkv_unsqueeze(v, -1, error);
  s = qkv_squeeze(s, NULL, 0, error);
  return qkv_squeeze(qkv_slice(s, axis, 0, 1, error), &axis, 1, error);
}

static void
test_gradients_views(void)
{
  QkvShape s31 = QKV_SHAPE(3, 1), s432 = QKV_SHAPE(4, 3, 2);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s31, 31, -1, 1);
  g_autoptr(QkvTensor) y = qkv_test_uniform(&s432, 32, -1, 1);
  gradcheck("unsqueeze/expand/cast/squeeze chain", 2, (QkvTensor *[]){x, y}, build_view_chain,
            NULL);
  QkvShape targets[] = {QKV_SHAPE(2, 3, 4), QKV_SHAPE(3, 1), QKV_SHAPE(2, -1, 5)};
  for (gsize t = 0; t < G_N_ELEMENTS(targets); t++) {
    g_autofree gchar *label = g_strdup_printf("expand %" G_GSIZE_FORMAT, t);
    gradcheck(label, 1, &x, build_expand, &targets[t]);
  }
  /* squeeze's gradient puts back each dropped axis in place: every size-1
   * axis, or a chosen one, of (1, 3, 1, 2) */
  QkvShape s1312 = QKV_SHAPE(1, 3, 1, 2);
  g_autoptr(QkvTensor) w = qkv_test_uniform(&s1312, 33, -1, 1);
  gradcheck("squeeze all", 1, &w, build_squeeze, GINT_TO_POINTER(-1));
  gradcheck("squeeze 2", 1, &w, build_squeeze, GINT_TO_POINTER(2));
  gradcheck("unsqueeze 3", 1, &w, build_unsqueeze, GINT_TO_POINTER(3));
}

/* A small model of the kind these ops are for: scores masked by valid
 * lengths, a hinge between the target's score and the best other one, and
 * a constant term from comparisons (no gradient). */
static QkvValue *
build_composite(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *scores = in[0], *lens = in[1], *targets = in[2];
  QkvShape s5 = QKV_SHAPE(5);
  const float iota[] = {0, 1, 2, 3, 4};
  g_autoptr(QkvTensor) t_iota = qkv_tensor_new_f32(&s5, iota);
  QkvValue *positions = qkv_graph_constant(graph, t_iota, error);
  QkvValue *mask = qkv_sequence_mask(lens, 5, error);
  QkvValue *masked = qkv_where(mask, scores, qkv_graph_scalar(graph, -100.0f), error);
  QkvValue *t = qkv_unsqueeze(targets, -1, error);
  QkvValue *picked = qkv_squeeze(qkv_gather(masked, t, 1, error), NULL, 0, error);
  QkvValue *one_hot = qkv_eq(positions, qkv_cast(t, QKV_F32, error), error);
  QkvValue *others = qkv_masked_fill(masked, one_hot, -100.0, error);
  QkvValue *best = qkv_max(others, 1, FALSE, NULL, error);
  QkvValue *margin = qkv_clamp(qkv_sub(best, picked, error), -2.0, 2.0, error);
  /* margins are multiples of 0.13 give or take 0.013: never within a
   * finite-difference step of -0.45 or of 0 */
  QkvValue *hinge = qkv_maximum(margin, qkv_graph_scalar(graph, -0.45f), error);
  QkvValue *loss = qkv_pow(qkv_abs(hinge, error), 1.5, error);
  QkvValue *right = qkv_eq(qkv_cast(qkv_argmax(masked, 1, FALSE, error), QKV_F32, error),
                           qkv_cast(targets, QKV_F32, error), error);
  return qkv_add(loss, qkv_sum(right, NULL, 0, FALSE, error), error);
}

static void
test_composite_gradient(void)
{
  QkvShape s35 = QKV_SHAPE(3, 5), s3 = QKV_SHAPE(3);
  g_autoptr(QkvTensor) scores = spaced(&s35, 41, 0.13f, -1.0f);
  const gint32 lens[] = {5, 3, 4}, targets[] = {1, 0, 3};
  g_autoptr(QkvTensor) tl = qkv_tensor_new_i32(&s3, lens);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_i32(&s3, targets);
  gradcheck("masked hinge", 3, (QkvTensor *[]){scores, tl, tt}, build_composite, NULL);
}

/* ---- bad input ------------------------------------------------------------- */

static void
test_errors(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s34 = QKV_SHAPE(3, 4), s5 = QKV_SHAPE(5), s4 = QKV_SHAPE(4), s3 = QKV_SHAPE(3),
           s345 = QKV_SHAPE(3, 4, 5), s0 = QKV_SHAPE(3, 0), s8 = QKV_SHAPE(1, 1, 1, 1, 1, 1),
           scalar = qkv_shape_scalar();
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, s34);
  QkvValue *b = qkv_test_input(g, "b", QKV_F32, s5);
  QkvValue *c = qkv_test_input(g, "c", QKV_F32, s4);
  QkvValue *ids = qkv_test_input(g, "ids", QKV_I32, s34);
  QkvValue *ids3 = qkv_test_input(g, "ids3", QKV_I32, s3);
  QkvValue *x3 = qkv_test_input(g, "x3", QKV_F32, s345);
  QkvValue *empty = qkv_test_input(g, "empty", QKV_F32, s0);
  QkvValue *deep = qkv_test_input(g, "deep", QKV_F32, s8);
  QkvValue *deep_ids = qkv_test_input(g, "deep_ids", QKV_I32, s8);
  QkvValue *sc = qkv_test_input(g, "sc", QKV_F32, scalar);
  QkvValue *ids2d = qkv_test_input(g, "ids2d", QKV_I32, s34);

  /* comparisons: shapes that do not broadcast, mixed dtypes */
  for (gsize k = 0; k < G_N_ELEMENTS(compare_ops); k++) {
    const char *op = compare_ops[k].name;
    qkv_assert_op_fails(g, op, QKV_ERROR_SHAPE, compare_ops[k].fn(a, b, &error_));
    qkv_assert_op_fails(g, op, QKV_ERROR_DTYPE, compare_ops[k].fn(a, ids, &error_));
    qkv_assert_op_fails(g, op, QKV_ERROR_DTYPE, compare_ops[k].fn(ids, a, &error_));
  }
  qkv_assert_op_fails(g, "maximum", QKV_ERROR_SHAPE, qkv_maximum(a, b, &error_));
  qkv_assert_op_fails(g, "minimum", QKV_ERROR_DTYPE, qkv_minimum(a, ids, &error_));
  qkv_assert_op_fails(g, "maximum", QKV_ERROR_DTYPE, qkv_maximum(ids, ids, &error_));

  /* where: every pair that clashes, and dtypes */
  qkv_assert_op_fails(g, "where", QKV_ERROR_SHAPE, qkv_where(a, b, a, &error_));
  qkv_assert_op_fails(g, "where", QKV_ERROR_SHAPE, qkv_where(c, a, b, &error_));
  qkv_assert_op_fails(g, "where", QKV_ERROR_SHAPE, qkv_where(b, a, a, &error_));
  qkv_assert_op_fails(g, "where", QKV_ERROR_DTYPE, qkv_where(a, ids, a, &error_));
  qkv_assert_op_fails(g, "where", QKV_ERROR_DTYPE, qkv_where(a, a, ids, &error_));

  /* masked_fill: the mask may not widen x; dtypes */
  qkv_assert_op_fails(g, "masked_fill", QKV_ERROR_SHAPE, qkv_masked_fill(c, a, 0, &error_));
  qkv_assert_op_fails(g, "masked_fill", QKV_ERROR_SHAPE, qkv_masked_fill(a, b, 0, &error_));
  qkv_assert_op_fails(g, "masked_fill", QKV_ERROR_DTYPE, qkv_masked_fill(ids, a, 0, &error_));

  /* sequence_mask */
  qkv_assert_op_fails(g, "sequence_mask", QKV_ERROR_DTYPE, qkv_sequence_mask(c, 4, &error_));
  qkv_assert_op_fails(g, "sequence_mask", QKV_ERROR_ATTRIBUTE,
                      qkv_sequence_mask(ids3, -1, &error_));
  qkv_assert_op_fails(g, "sequence_mask", QKV_ERROR_SHAPE, qkv_sequence_mask(deep_ids, 2, &error_));

  /* clamp: bounds crossed or NaN, dtype */
  qkv_assert_op_fails(g, "clamp", QKV_ERROR_ATTRIBUTE, qkv_clamp(a, 1, 0, &error_));
  qkv_assert_op_fails(g, "clamp", QKV_ERROR_ATTRIBUTE, qkv_clamp(a, NAN, 0, &error_));
  qkv_assert_op_fails(g, "clamp", QKV_ERROR_DTYPE, qkv_clamp(ids, 0, 1, &error_));
  qkv_assert_op_fails(g, "clamp_backward", QKV_ERROR_SHAPE,
                      qkv_clamp_backward(a, c, 0, 1, &error_));

  /* math: dtype, pow's exponent */
  UnaryFn unary[] = {qkv_abs, qkv_sign, qkv_sqrt, qkv_square};
  const char *unary_names[] = {"abs", "sign", "sqrt", "square"};
  for (gsize k = 0; k < G_N_ELEMENTS(unary); k++)
    qkv_assert_op_fails(g, unary_names[k], QKV_ERROR_DTYPE, unary[k](ids, &error_));
  qkv_assert_op_fails(g, "pow", QKV_ERROR_DTYPE, qkv_pow(ids, 2, &error_));
  qkv_assert_op_fails(g, "pow", QKV_ERROR_ATTRIBUTE, qkv_pow(a, INFINITY, &error_));
  qkv_assert_op_fails(g, "pow", QKV_ERROR_ATTRIBUTE, qkv_pow(a, 1e300, &error_));
  qkv_assert_op_fails(g, "pow_tensor", QKV_ERROR_DTYPE, qkv_pow_tensor(a, ids, &error_));
  qkv_assert_op_fails(g, "pow_tensor", QKV_ERROR_DTYPE, qkv_pow_tensor(ids, a, &error_));
  qkv_assert_op_fails(g, "pow_tensor", QKV_ERROR_SHAPE, qkv_pow_tensor(a, b, &error_));

  /* max/min/argmax/argmin: axis out of range, empty axis, dtype, scalar */
  qkv_assert_op_fails(g, "max", QKV_ERROR_ATTRIBUTE, qkv_max(a, 2, FALSE, NULL, &error_));
  qkv_assert_op_fails(g, "min", QKV_ERROR_ATTRIBUTE, qkv_min(a, -3, FALSE, NULL, &error_));
  qkv_assert_op_fails(g, "max", QKV_ERROR_SHAPE, qkv_max(empty, 1, FALSE, NULL, &error_));
  qkv_assert_op_fails(g, "argmax", QKV_ERROR_DTYPE, qkv_argmax(ids, 0, FALSE, &error_));
  qkv_assert_op_fails(g, "argmin", QKV_ERROR_ATTRIBUTE, qkv_argmin(sc, 0, FALSE, &error_));
  qkv_assert_op_fails(g, "argmin", QKV_ERROR_SHAPE, qkv_argmin(empty, -1, TRUE, &error_));

  /* gather: rank, off-axis sizes, dtypes, axis */
  qkv_assert_op_fails(g, "gather", QKV_ERROR_SHAPE, qkv_gather(x3, ids, 1, &error_));
  QkvValue *big_idx = qkv_test_input(g, "big_idx", QKV_I32, QKV_SHAPE(3, 2, 6));
  qkv_assert_op_fails(g, "gather", QKV_ERROR_SHAPE, qkv_gather(x3, big_idx, 1, &error_));
  qkv_assert_op_fails(g, "gather", QKV_ERROR_DTYPE, qkv_gather(a, a, 1, &error_));
  qkv_assert_op_fails(g, "gather", QKV_ERROR_ATTRIBUTE, qkv_gather(a, ids, 2, &error_));
  QkvShape bad_shape = QKV_SHAPE(3, -4);
  qkv_assert_op_fails(g, "gather_backward", QKV_ERROR_ATTRIBUTE,
                      qkv_gather_backward(a, ids, &bad_shape, 1, &error_));
  qkv_assert_op_fails(g, "gather_backward", QKV_ERROR_SHAPE,
                      qkv_gather_backward(c, ids, &s34, 1, &error_));

  /* index_select: index rank, dtypes, axis */
  qkv_assert_op_fails(g, "index_select", QKV_ERROR_SHAPE, qkv_index_select(a, ids2d, 0, &error_));
  qkv_assert_op_fails(g, "index_select", QKV_ERROR_DTYPE, qkv_index_select(a, c, 0, &error_));
  qkv_assert_op_fails(g, "index_select", QKV_ERROR_ATTRIBUTE,
                      qkv_index_select(a, ids3, 5, &error_));
  qkv_assert_op_fails(g, "index_select_backward", QKV_ERROR_SHAPE,
                      qkv_index_select_backward(a, ids3, 7, 1, &error_));
  qkv_assert_op_fails(g, "index_select_backward", QKV_ERROR_ATTRIBUTE,
                      qkv_index_select_backward(a, ids3, -1, 0, &error_));

  /* cast: an unknown dtype only reaches the op by name */
  {
    GVariantBuilder attrs;
    g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&attrs, "{sv}", "dtype", g_variant_new_string("f16"));
    qkv_assert_op_fails(g, "cast", QKV_ERROR_ATTRIBUTE,
                        qkv_graph_op(g, "cast", &a, 1, g_variant_builder_end(&attrs), &error_));
  }

  /* unsqueeze / squeeze / expand */
  qkv_assert_op_fails(g, "unsqueeze", QKV_ERROR_ATTRIBUTE, qkv_unsqueeze(a, 3, &error_));
  qkv_assert_op_fails(g, "unsqueeze", QKV_ERROR_ATTRIBUTE, qkv_unsqueeze(a, -4, &error_));
  qkv_assert_op_fails(g, "unsqueeze", QKV_ERROR_SHAPE, qkv_unsqueeze(deep, 0, &error_));
  gint axis1 = 1, twice[] = {0, -6}, far = 6;
  qkv_assert_op_fails(g, "squeeze", QKV_ERROR_SHAPE, qkv_squeeze(a, &axis1, 1, &error_));
  qkv_assert_op_fails(g, "squeeze", QKV_ERROR_ATTRIBUTE, qkv_squeeze(deep, twice, 2, &error_));
  qkv_assert_op_fails(g, "squeeze", QKV_ERROR_ATTRIBUTE, qkv_squeeze(deep, &far, 1, &error_));
  QkvShape fewer = QKV_SHAPE(4), wrong = QKV_SHAPE(3, 5), lead_m1 = QKV_SHAPE(-1, 3, 4),
           neg = QKV_SHAPE(3, -2);
  qkv_assert_op_fails(g, "expand", QKV_ERROR_SHAPE, qkv_expand(a, &fewer, &error_));
  qkv_assert_op_fails(g, "expand", QKV_ERROR_SHAPE, qkv_expand(a, &wrong, &error_));
  qkv_assert_op_fails(g, "expand", QKV_ERROR_ATTRIBUTE, qkv_expand(a, &lead_m1, &error_));
  qkv_assert_op_fails(g, "expand", QKV_ERROR_ATTRIBUTE, qkv_expand(a, &neg, &error_));
}

/* Errors chain: a NULL input (an earlier failure) gives NULL, adds nothing
 * and leaves the first error alone (no critical warning: they abort tests). */
static void
test_null_inputs(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s3 = QKV_SHAPE(3);
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, s3);
  QkvValue *ids = qkv_test_input(g, "ids", QKV_I32, s3);
  guint n = qkv_graph_n_nodes(g);
  GError *error = NULL;
  g_set_error(&error, QKV_ERROR, QKV_ERROR_SHAPE, "the first error");
  GError *first = error;
  QkvValue *indices = a;
  for (gsize k = 0; k < G_N_ELEMENTS(compare_ops); k++) {
    g_assert_null(compare_ops[k].fn(NULL, a, &error));
    g_assert_null(compare_ops[k].fn(a, NULL, &error));
  }
  g_assert_null(qkv_maximum(NULL, a, &error));
  g_assert_null(qkv_minimum(a, NULL, &error));
  g_assert_null(qkv_where(NULL, a, a, &error));
  g_assert_null(qkv_where(a, NULL, a, &error));
  g_assert_null(qkv_where(a, a, NULL, &error));
  g_assert_null(qkv_masked_fill(NULL, a, 0, &error));
  g_assert_null(qkv_masked_fill(a, NULL, 0, &error));
  g_assert_null(qkv_sequence_mask(NULL, 3, &error));
  g_assert_null(qkv_clamp(NULL, 0, 1, &error));
  g_assert_null(qkv_clamp_backward(NULL, a, 0, 1, &error));
  g_assert_null(qkv_abs(NULL, &error));
  g_assert_null(qkv_sign(NULL, &error));
  g_assert_null(qkv_sqrt(NULL, &error));
  g_assert_null(qkv_square(NULL, &error));
  g_assert_null(qkv_pow(NULL, 2, &error));
  g_assert_null(qkv_max(NULL, 0, FALSE, &indices, &error));
  g_assert_null(indices);
  g_assert_null(qkv_min(NULL, 0, FALSE, NULL, &error));
  g_assert_null(qkv_argmax(NULL, 0, FALSE, &error));
  g_assert_null(qkv_argmin(NULL, 0, FALSE, &error));
  g_assert_null(qkv_cast(NULL, QKV_F32, &error));
  g_assert_null(qkv_unsqueeze(NULL, 0, &error));
  g_assert_null(qkv_squeeze(NULL, NULL, 0, &error));
  g_assert_null(qkv_expand(NULL, &s3, &error));
  g_assert_null(qkv_gather(NULL, ids, 0, &error));
  g_assert_null(qkv_gather(a, NULL, 0, &error));
  g_assert_null(qkv_index_select(NULL, ids, 0, &error));
  g_assert_null(qkv_index_select(a, NULL, 0, &error));
  g_assert_null(qkv_gather_backward(NULL, ids, &s3, 0, &error));
  g_assert_null(qkv_index_select_backward(a, NULL, 3, 0, &error));
  g_assert_true(error == first);
  g_assert_cmpstr(error->message, ==, "the first error");
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n);
  g_clear_error(&error);
  /* and with error NULL */
  g_assert_null(qkv_where(a, NULL, a, NULL));
}

/* ---- the threaded paths against naive loops ---------------------------------- */

/* Above 2^18 elements the kernels split over threads (qkv_kernel_threads). */
static void
test_threads(void)
{
  QkvShape big = QKV_SHAPE(520, 513), row = QKV_SHAPE(513), col = QKV_SHAPE(520, 1);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&big, 51, -1, 1);
  g_autoptr(QkvTensor) r = qkv_test_uniform(&row, 52, -1, 1);
  g_autoptr(QkvTensor) cond = qkv_test_randint(&col, 53, 0, 2);
  const float *xv = cf32(x), *rv = cf32(r);
  const gint32 *cv = ci32(cond);
  const gint64 rows = 520, cols = 513, n = rows * cols;
  g_autoptr(QkvTensor) w = qkv_test_uniform(&big, 54, -1, 1);

  for (gint threads = 1; threads <= 3; threads += 2) {
    Run run = {0};
    /* lt with a row broadcast */
    run_graph(2, (QkvTensor *[]){x, r}, build_binary, &(BinaryFn){qkv_lt}, NULL, threads, &run);
    for (gint64 i = 0; i < n; i++)
      g_assert_cmpfloat(cf32(run.out)[i], ==, xv[i] < rv[i % cols] ? 1 : 0);
    run_clear(&run);
    /* where with a column condition, a row and a matrix */
    run_graph(3, (QkvTensor *[]){cond, r, x}, build_where, NULL, w, threads, &run);
    for (gint64 i = 0; i < n; i++)
      g_assert_cmpfloat(cf32(run.out)[i], ==, cv[i / cols] ? rv[i % cols] : xv[i]);
    run_clear(&run);
    /* argmax over rows and over columns */
    ArgCase c1 = {TRUE, 1, FALSE, TRUE}, c0 = {FALSE, 0, FALSE, TRUE};
    run_graph(1, &x, build_arg, &c1, NULL, threads, &run);
    for (gint64 i = 0; i < rows; i++) {
      gint64 best = 0;
      for (gint64 j = 1; j < cols; j++)
        if (xv[i * cols + j] > xv[i * cols + best])
          best = j;
      g_assert_cmpint(ci32(run.out)[i], ==, best);
    }
    run_clear(&run);
    run_graph(1, &x, build_arg, &c0, NULL, threads, &run);
    for (gint64 j = 0; j < cols; j++) {
      gint64 best = 0;
      for (gint64 i = 1; i < rows; i++)
        if (xv[i * cols + j] < xv[best * cols + j])
          best = i;
      g_assert_cmpint(ci32(run.out)[j], ==, best);
    }
    run_clear(&run);
    /* index_select of rows with repeats, and its scatter-add: row k of dx
     * sums w over the positions that picked it; index -1 (zero_out_of_range)
     * picks zeros */
    QkvShape sidx = QKV_SHAPE(rows);
    g_autoptr(QkvTensor) idx = qkv_test_randint(&sidx, 55, -1, (gint32)rows / 4);
    const gint32 *iv = ci32(idx);
    IndexZero select_zero = {"index_select", 0};
    run_graph(2, (QkvTensor *[]){x, idx}, build_index_zero, &select_zero, w, threads, &run);
    g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &big);
    qkv_tensor_fill(want, 0);
    float *wd = qkv_tensor_f32(want);
    for (gint64 k = 0; k < rows; k++)
      for (gint64 j = 0; j < cols; j++) {
        float o = cf32(run.out)[k * cols + j];
        g_assert_cmpfloat(o, ==, iv[k] >= 0 ? xv[iv[k] * cols + j] : 0);
        if (iv[k] >= 0)
          wd[iv[k] * cols + j] += cf32(w)[k * cols + j];
      }
    /* the same order of additions (index order): exact */
    assert_ulps("index_select_backward threads", run.grads[0], want, 0);
    run_clear(&run);
    /* gather along rows and its scatter-add */
    g_autoptr(QkvTensor) gidx = qkv_test_randint(&big, 56, 0, (gint32)rows);
    const gint32 *gv = ci32(gidx);
    run_graph(2, (QkvTensor *[]){x, gidx}, build_gather, GINT_TO_POINTER(0), w, threads, &run);
    qkv_tensor_fill(want, 0);
    for (gint64 i = 0; i < n; i++) {
      g_assert_cmpfloat(cf32(run.out)[i], ==, xv[gv[i] * cols + i % cols]);
      wd[gv[i] * cols + i % cols] += cf32(w)[i];
    }
    assert_ulps("gather_backward threads", run.grads[0], want, 0);
    run_clear(&run);
    /* expand of a column, and cast */
    QkvShape target = QKV_SHAPE(rows, cols);
    g_autoptr(QkvTensor) colf = qkv_test_uniform(&col, 57, -1, 1);
    run_graph(1, &colf, build_expand, &target, NULL, threads, &run);
    for (gint64 i = 0; i < n; i++)
      g_assert_cmpfloat(cf32(run.out)[i], ==, cf32(colf)[i / cols]);
    run_clear(&run);
    run_graph(1, &x, build_cast, GINT_TO_POINTER(QKV_I32), NULL, threads, &run);
    for (gint64 i = 0; i < n; i++)
      g_assert_cmpint(ci32(run.out)[i], ==, (gint32)xv[i]);
    run_clear(&run);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  reference = qkv_test_load_reference("select_ref.txt");
  g_test_add_func("/select/reference/compare", test_reference_compare);
  g_test_add_func("/select/reference/maximum-minimum", test_reference_maximum_minimum);
  g_test_add_func("/select/reference/where", test_reference_where);
  g_test_add_func("/select/reference/masked-fill", test_reference_masked_fill);
  g_test_add_func("/select/reference/sequence-mask", test_reference_sequence_mask);
  g_test_add_func("/select/reference/math", test_reference_math);
  g_test_add_func("/select/reference/max-min", test_reference_max_min);
  g_test_add_func("/select/reference/gather-index-select", test_reference_gather_index_select);
  g_test_add_func("/select/reference/cast-views", test_reference_cast_views);
  g_test_add_func("/select/values/nan", test_nan_semantics);
  g_test_add_func("/select/values/cast-edges", test_cast_edges);
  g_test_add_func("/select/values/ties-keepdims", test_ties_and_keepdims);
  g_test_add_func("/select/values/out-of-range-indices", test_out_of_range_indices);
  g_test_add_func("/select/values/out-of-range-fails", test_out_of_range_fails);
  g_test_add_func("/select/values/small-cases", test_small_cases);
  g_test_add_func("/select/gradients/compare-select", test_gradients_compare_select);
  g_test_add_func("/select/gradients/math", test_gradients_math);
  g_test_add_func("/select/gradients/index", test_gradients_index);
  g_test_add_func("/select/gradients/views", test_gradients_views);
  g_test_add_func("/select/gradients/composite", test_composite_gradient);
  g_test_add_func("/select/errors", test_errors);
  g_test_add_func("/select/null-inputs", test_null_inputs);
  g_test_add_func("/select/threads", test_threads);
  int status = g_test_run();
  g_hash_table_unref(reference);
  return status;
}
