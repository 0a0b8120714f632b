/* test-ops-attention.c: "masked_softmax", "dot_product_attention",
 * "multi_head_attention", "dropout" and their fused backward ops.
 *
 * Each op is checked by finite differences, against the same computation
 * built from primitive ops (values and every input gradient), against numbers
 * PyTorch produced (tests/reference/attention_ref.py), on the book's own
 * examples, and on bad input.
 */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* ---- helpers -------------------------------------------------------------- */

/* Assert |a - e| <= factor · u · max|e| for every element (qkv_assert_scaled,
 * tests/test-util.h): two float32 computations of one value differ by rounding,
 * bounded on the tensor's scale, so elements near zero (sums of cancelling
 * terms, or gradients that vanish identically, such as that of the key bias)
 * are judged on that scale too. Returns the factor that was needed. */
#define assert_close_scaled(label, actual, expected, factor)                                       \
  qkv_assert_scaled((label), (actual), (expected), (factor))

static QkvTensor *
tensor_i32(QkvShape shape, const gint32 *values)
{
  return qkv_tensor_new_i32(&shape, values);
}

/* Keys row r of a (…, n_q, n_k) score tensor keeps, by the book's rule. */
static gint64
kept_keys(const QkvShape *s, const QkvTensor *valid_lens, gboolean causal, gint64 r)
{
  gint64 n_q = s->dims[s->rank - 2], n_k = s->dims[s->rank - 1];
  gint64 rows = qkv_shape_numel(s) / MAX(n_k, 1), batch = s->dims[0];
  gint64 i = r % n_q, b = r / (rows / batch), limit = n_k;
  if (valid_lens != NULL) {
    gint64 len = qkv_tensor_rank(valid_lens) == 1 ? (gint64)qkv_tensor_get(valid_lens, b)
                                                  : (gint64)qkv_tensor_get(valid_lens, b * n_q + i);
    limit = MIN(limit, len);
  }
  if (causal)
    limit = MIN(limit, i + 1);
  return MAX(limit, 0);
}

/* ---- building the ops under test ---------------------------------------- */

typedef enum {
  SELECT_OUT,         /* output 0 */
  SELECT_WEIGHTS,     /* the attention weights only: no gradient reaches out */
  SELECT_SUM_OF_BOTH, /* sum(out) + sum(weights): gradients reach both */
} Select;

typedef struct {
  gboolean causal;
  double dropout;
  gboolean has_valid_lens; /* the last input is valid_lens */
  gint heads;
  gboolean bias;
  gboolean self_attention; /* one input x serves as queries, keys and values */
  gboolean pre_scale;      /* apply the op to 2·x, an intermediate */
  Select select;
  const QkvTensor *valid_lens; /* for the composite builds' mask constants */
} Spec;

static QkvValue *
select_output(QkvValue *out, QkvValue *weights, Select select, GError **error)
{
  if (out == NULL)
    return NULL;
  switch (select) {
  case SELECT_OUT:
    return out;
  case SELECT_WEIGHTS:
    return weights;
  case SELECT_SUM_OF_BOTH: {
    QkvValue *a = qkv_sum(out, NULL, 0, FALSE, error);
    QkvValue *b = a ? qkv_sum(weights, NULL, 0, FALSE, error) : NULL;
    return b ? qkv_add(a, b, error) : NULL;
  }
  }
  return NULL;
}

static QkvValue *
build_masked_softmax(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *x = s->pre_scale ? qkv_scale(in[0], 2.0, error) : in[0];
  return x ? qkv_masked_softmax(x, s->has_valid_lens ? in[1] : NULL, s->causal, error) : NULL;
}

static QkvValue *
build_dot(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *weights = NULL;
  QkvValue *out = qkv_dot_product_attention(in[0], in[1], in[2], s->has_valid_lens ? in[3] : NULL,
                                            s->causal, s->dropout, &weights, error);
  return select_output(out, weights, s->select, error);
}

/* Inputs: queries, keys, values (or x alone), w_q, w_k, w_v, w_o, [b_q, b_k,
 * b_v, b_o], [valid_lens]. */
static QkvValue *
build_mha(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  guint first_w = s->self_attention ? 1 : 3;
  QkvValue *q = in[0], *k = s->self_attention ? in[0] : in[1],
           *v = s->self_attention ? in[0] : in[2];
  QkvValue *const *w = in + first_w;
  guint next = first_w + 4 + (s->bias ? 4 : 0);
  QkvValue *weights = NULL;
  QkvValue *out = qkv_multi_head_attention(q, k, v, w[0], w[1], w[2], w[3], s->bias ? w + 4 : NULL,
                                           s->heads, s->has_valid_lens ? in[next] : NULL, s->causal,
                                           s->dropout, &weights, error);
  return select_output(out, weights, s->select, error);
}

static QkvValue *
build_dropout(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *x = s->pre_scale ? qkv_scale(in[0], 2.0, error) : in[0];
  return x ? qkv_dropout(x, s->dropout, error) : NULL;
}

/* ---- the same computations from primitive ops ---------------------------- */

/* The book's masking as primitive ops: x · keep + (-1e6 where masked), with
 * keep 0 or 1, so masked scores are replaced (not shifted) and get no
 * gradient. */
static QkvValue *
composite_masked_softmax(QkvValue *x, const QkvTensor *valid_lens, gboolean causal, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  g_autoptr(QkvTensor) keep = qkv_tensor_new(QKV_F32, s);
  g_autoptr(QkvTensor) neg = qkv_tensor_new(QKV_F32, s);
  gint64 n_k = s->dims[s->rank - 1], rows = qkv_shape_numel(s) / MAX(n_k, 1);
  float *pk = qkv_tensor_f32(keep), *pn = qkv_tensor_f32(neg);
  for (gint64 r = 0; r < rows; r++) {
    gint64 limit = kept_keys(s, valid_lens, causal, r);
    for (gint64 j = 0; j < n_k; j++) {
      pk[r * n_k + j] = j < limit ? 1.0f : 0.0f;
      pn[r * n_k + j] = j < limit ? 0.0f : -1e6f;
    }
  }
  QkvGraph *g = qkv_value_graph(x);
  QkvValue *ck = qkv_graph_constant(g, keep, error);
  QkvValue *cn = ck ? qkv_graph_constant(g, neg, error) : NULL;
  QkvValue *kept = cn ? qkv_mul(x, ck, error) : NULL;
  QkvValue *masked = kept ? qkv_add(kept, cn, error) : NULL;
  return masked ? qkv_softmax(masked, error) : NULL;
}

static QkvValue *
build_masked_softmax_composite(QkvGraph *graph, QkvValue *const *in, gpointer user_data,
                               GError **error)
{
  const Spec *s = user_data;
  QkvValue *x = s->pre_scale ? qkv_scale(in[0], 2.0, error) : in[0];
  return x ? composite_masked_softmax(x, s->valid_lens, s->causal, error) : NULL;
}

/* softmax(q kᵀ / √d) v over the last two axes; *weights gets the softmax. */
static QkvValue *
composite_attention(QkvValue *q, QkvValue *k, QkvValue *v, const Spec *s, QkvValue **weights,
                    GError **error)
{
  const QkvShape *qs = qkv_value_shape(q);
  QkvValue *scores = qkv_matmul(q, k, FALSE, TRUE, error);
  scores = scores ? qkv_scale(scores, 1.0 / sqrt((double)qs->dims[qs->rank - 1]), error) : NULL;
  *weights = scores ? composite_masked_softmax(scores, s->valid_lens, s->causal, error) : NULL;
  return *weights ? qkv_matmul(*weights, v, FALSE, FALSE, error) : NULL;
}

static QkvValue *
build_dot_composite(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *weights = NULL;
  QkvValue *out = composite_attention(in[0], in[1], in[2], s, &weights, error);
  return select_output(out, weights, s->select, error);
}

/* x Wᵀ (+ b) */
static QkvValue *
composite_linear(QkvValue *x, QkvValue *w, QkvValue *b, GError **error)
{
  QkvValue *y = qkv_matmul(x, w, FALSE, TRUE, error);
  return y && b ? qkv_add(y, b, error) : y;
}

/* The book's transpose_qkv: (B, T, H) → (B, heads, T, H / heads). */
static QkvValue *
composite_split_heads(QkvValue *x, gint heads, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  QkvShape shape = QKV_SHAPE(s->dims[0], s->dims[1], heads, s->dims[2] / heads);
  QkvValue *r = qkv_reshape(x, &shape, error);
  const gint perm[] = {0, 2, 1, 3};
  return r ? qkv_permute(r, perm, 4, error) : NULL;
}

static QkvValue *
build_mha_composite(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  guint first_w = s->self_attention ? 1 : 3;
  QkvValue *x[3] = {in[0], s->self_attention ? in[0] : in[1], s->self_attention ? in[0] : in[2]};
  QkvValue *heads[3];
  for (guint i = 0; i < 3; i++) {
    QkvValue *p =
        composite_linear(x[i], in[first_w + i], s->bias ? in[first_w + 4 + i] : NULL, error);
    heads[i] = p ? composite_split_heads(p, s->heads, error) : NULL;
    if (heads[i] == NULL)
      return NULL;
  }
  QkvValue *weights = NULL;
  QkvValue *o = composite_attention(heads[0], heads[1], heads[2], s, &weights, error);
  if (o == NULL)
    return NULL;
  const gint perm[] = {0, 2, 1, 3};
  o = qkv_permute(o, perm, 4, error);
  const QkvShape *qs = qkv_value_shape(in[0]);
  QkvShape concat_shape = QKV_SHAPE(qs->dims[0], qs->dims[1], -1);
  QkvValue *concat = o ? qkv_reshape(o, &concat_shape, error) : NULL;
  QkvValue *out =
      concat ? composite_linear(concat, in[first_w + 3], s->bias ? in[first_w + 7] : NULL, error)
             : NULL;
  return select_output(out, weights, s->select, error);
}

/* ---- bounds on two float32 computations of one value ----------------------
 *
 * Fused vs composite, sparse vs dense, n threads vs 1 and qkv vs PyTorch each
 * compute the same value by the same formulas with sums in another order (and
 * exp from another library). A sum of n terms computed in float32 is off by at
 * most gamma(n) ≈ n u times the sum of its terms' magnitudes, whatever the
 * order (tests/test-util.h), and the errors of a chain of sums add up to first
 * order. So two computations differ by at most 2 × (Σ of the lengths of the
 * sums on the value's path) × u × the magnitudes involved, which the tensor's
 * scale (max |expected|) stands for: the inputs are O(1), every row of
 * attention weights sums to 1, and what an element's error exceeds its own size
 * by (sums that cancel) is covered by judging it on the largest element. Each
 * elementwise function (exp, the divisions of softmax, the scale 1/sqrt(d))
 * adds a few rounding errors: 4 u per softmax.
 *
 * The path lengths, from the shapes of the inputs: */

/* masked_softmax over rows of n_k: forward Σ exp over the row, backward
 * Σ_j g_j y_j over the row. */
static double
softmax_factor(const QkvTensor *x)
{
  const QkvShape *s = qkv_tensor_shape(x);
  gint64 n_k = s->dims[s->rank - 1];
  return 2.0 * (2 * n_k + 4);
}

/* dot_product_attention of q (…, n_q, d), k (…, n_k, d), v (…, n_k, d_v):
 * forward scores (d terms), softmax (n_k), weights · v (n_k); backward dP =
 * dO vᵀ (d_v), softmax backward (n_k), dq = dS k (n_k), dk = dSᵀ q and dv =
 * Pᵀ dO (n_q). */
static double
dot_factor(const QkvTensor *q, const QkvTensor *k, const QkvTensor *v)
{
  const QkvShape *sq = qkv_tensor_shape(q), *sk = qkv_tensor_shape(k), *sv = qkv_tensor_shape(v);
  gint64 n_q = sq->dims[sq->rank - 2], d = sq->dims[sq->rank - 1];
  gint64 n_k = sk->dims[sk->rank - 2], d_v = sv->dims[sv->rank - 1];
  return 2.0 * (d + 2 * n_k + 4 + d_v + 2 * n_k + 4 + n_q);
}

/* multi_head_attention (inputs as mha_inputs orders them): forward the
 * projections (d_in terms), scores (hidden / heads), softmax and weights · V
 * (2 n_k), the output projection (hidden); backward dO · W_o (hidden), dP (hidden
 * / heads), softmax backward and dS · K (2 n_k), and the weight and bias
 * gradients, sums over all batch × n rows. */
static double
mha_factor(const Spec *spec, QkvTensor *const *t)
{
  guint n_x = spec->self_attention ? 1 : 3;
  const QkvShape *sq = qkv_tensor_shape(t[0]), *sk = qkv_tensor_shape(t[n_x == 1 ? 0 : 1]);
  gint64 batch = sq->dims[0], n_q = sq->dims[1], n_k = sk->dims[1], d_in = 0;
  for (guint i = 0; i < n_x; i++)
    d_in = MAX(d_in, qkv_tensor_shape(t[i])->dims[2]);
  gint64 hidden = qkv_tensor_shape(t[n_x])->dims[0], d_head = hidden / spec->heads;
  double forward = d_in + d_head + 2 * n_k + 4 + hidden;
  double backward = hidden + d_head + 2 * n_k + 4 + batch * MAX(n_q, n_k);
  return 2.0 * (forward + backward);
}

/* The scale below which input i's gradient is not judged. The gradient of the
 * key bias of multi_head_attention vanishes identically (the bias shifts every
 * score of a row alike): both computations give rounding noise from sums whose
 * terms are the rows of the gradient at the key projection, of the size of
 * those at the query projection, whose sum is the query bias's gradient. */
static double
grad_min_scale(const Spec *spec, guint n, QkvTensor *const *expected, guint i)
{
  guint key_bias = (spec->self_attention ? 1u : 3u) + 4u + 1u;
  if (spec->heads == 0 || !spec->bias || i != key_bias || key_bias >= n)
    return 0;
  return qkv_test_max_abs(expected[key_bias - 1]);
}

/* Assert every input gradient (those not NULL) of actual within factor · u ·
 * (the scale of expected's); frees actual's. Returns the factor needed. */
static double
assert_grads_close(const gchar *label, guint n, const Spec *spec, QkvTensor **actual,
                   QkvTensor *const *expected, double factor)
{
  double worst = 0;
  for (guint i = 0; i < n; i++) {
    if (actual[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s: gradient of input %u", label, i);
    double min_scale = grad_min_scale(spec, n, expected, i);
    worst = fmax(worst, qkv_assert_scaled_min(li, actual[i], expected[i], min_scale, factor));
    g_clear_pointer(&actual[i], qkv_tensor_free);
  }
  return worst;
}

/* The fused op and its primitive composite agree: values and every input
 * gradient within factor · u · (the tensor's scale). */
static void
compare_with_composite(const gchar *label, guint n, QkvTensor *const *tensors,
                       QkvCheckBuildFunc fused, QkvCheckBuildFunc composite, Spec *spec,
                       double factor)
{
  QkvTensor *grads_f[16], *grads_c[16];
  g_autoptr(QkvTensor) out_f = qkv_test_run_with_grads(n, tensors, fused, spec, NULL, grads_f);
  g_autoptr(QkvTensor) out_c = qkv_test_run_with_grads(n, tensors, composite, spec, NULL, grads_c);
  g_autofree gchar *l0 = g_strdup_printf("%s: value", label);
  double worst = assert_close_scaled(l0, out_f, out_c, factor);
  worst = fmax(worst, assert_grads_close(label, n, spec, grads_f, grads_c, factor));
  for (guint i = 0; i < n; i++)
    if (grads_c[i] != NULL)
      qkv_tensor_free(grads_c[i]);
  g_test_message("%s: fused vs primitives, factor needed %.3g of %g", label, worst, factor);
}

/* ---- masked_softmax ----------------------------------------------------- */

/* Reference softmax of a row over its first `limit` entries (uniform when 0). */
static void
expected_row(const float *x, gint64 n, gint64 limit, float *y)
{
  if (limit == 0) {
    for (gint64 j = 0; j < n; j++)
      y[j] = 1.0f / (float)n;
    return;
  }
  double m = -INFINITY, sum = 0;
  for (gint64 j = 0; j < limit; j++)
    m = fmax(m, x[j]);
  for (gint64 j = 0; j < limit; j++)
    sum += exp(x[j] - m);
  for (gint64 j = 0; j < n; j++)
    y[j] = j < limit ? (float)(exp(x[j] - m) / sum) : 0.0f;
}

static void
check_masked_softmax_values(QkvTensor *x, QkvTensor *valid_lens, gboolean causal)
{
  Spec spec = {.causal = causal, .has_valid_lens = valid_lens != NULL};
  QkvTensor *in[] = {x, valid_lens};
  g_autoptr(QkvTensor) y = qkv_test_eval(valid_lens ? 2 : 1, in, build_masked_softmax, &spec);
  const QkvShape *s = qkv_tensor_shape(x);
  gint64 n_k = s->dims[s->rank - 1], rows = qkv_tensor_numel(x) / n_k;
  g_autofree float *want = g_new(float, qkv_tensor_numel(x));
  for (gint64 r = 0; r < rows; r++)
    expected_row(qkv_tensor_f32(x) + r * n_k, n_k, kept_keys(s, valid_lens, causal, r),
                 want + r * n_k);
  /* One float32 computation against the exact value rounded once: exp within
   * about 2 u, the row sum of n_k terms gamma(n_k), the division and the
   * rounding of want 1 u each, all relative to the element (probabilities,
   * at most 1, so on the scale of the tensor's largest too). */
  g_autoptr(QkvTensor) want_t = qkv_tensor_new_from_data(QKV_F32, s, want);
  qkv_assert_scaled("masked_softmax vs exact", y, want_t, n_k + 4.0);
}

/* The book's examples: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2,
 * 3])) and with torch.tensor([[1, 3], [2, 4]]). */
static void
test_masked_softmax_book(void)
{
  QkvShape s = QKV_SHAPE(2, 2, 4);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 1, 0, 1);
  gint32 lens[] = {2, 3};
  g_autoptr(QkvTensor) vl = tensor_i32(QKV_SHAPE(2), lens);
  Spec spec = {.has_valid_lens = TRUE};
  QkvTensor *in[] = {x, vl};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_masked_softmax, &spec);
  for (gint b = 0; b < 2; b++)
    for (gint i = 0; i < 2; i++) {
      double sum = 0;
      for (gint j = 0; j < 4; j++) {
        double p = qkv_tensor_get(y, (b * 2 + i) * 4 + j);
        if (j >= lens[b])
          g_assert_cmpfloat(p, ==, 0.0);
        else
          g_assert_cmpfloat(p, >, 0.0);
        sum += p;
      }
      /* Each p_i within (n_k + 4) u of its exact value (above), n_k = 4. */
      g_assert_cmpfloat_with_epsilon(sum, 1.0, (4 + 4) * QKV_TEST_U);
    }
  check_masked_softmax_values(x, vl, FALSE);

  gint32 lens2[] = {1, 3, 2, 4};
  g_autoptr(QkvTensor) vl2 = tensor_i32(QKV_SHAPE(2, 2), lens2);
  QkvTensor *in2[] = {x, vl2};
  g_autoptr(QkvTensor) y2 = qkv_test_eval(2, in2, build_masked_softmax, &spec);
  for (gint r = 0; r < 4; r++)
    for (gint j = 0; j < 4; j++)
      if (j >= lens2[r])
        g_assert_cmpfloat(qkv_tensor_get(y2, r * 4 + j), ==, 0.0);
  /* One kept score: exp(0) / exp(0), 1 up to a rounding or two. */
  g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y2, 0), 1.0, 2 * QKV_TEST_U);
  check_masked_softmax_values(x, vl2, FALSE);
}

/* Valid length 0 gives a uniform row (every score is -1e6), lengths beyond
 * n_k mask nothing, causal alone and with lengths, rank 4 scores. */
static void
test_masked_softmax_edges(void)
{
  QkvShape s = QKV_SHAPE(3, 2, 5);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 2, -3, 3);
  gint32 lens[] = {0, 9, -1};
  g_autoptr(QkvTensor) vl = tensor_i32(QKV_SHAPE(3), lens);
  Spec spec = {.has_valid_lens = TRUE};
  QkvTensor *in[] = {x, vl};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_masked_softmax, &spec);
  /* Five equal scores: 1/5 with the roundings of a sum of 5 ones and a
   * division, at most (5 + 2) u relative. */
  for (gint j = 0; j < 10; j++) {
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y, j), 0.2, 7 * QKV_TEST_U * 0.2); /* length 0 */
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y, 20 + j), 0.2,
                                   7 * QKV_TEST_U * 0.2); /* negative */
  }
  check_masked_softmax_values(x, vl, FALSE);
  check_masked_softmax_values(x, NULL, FALSE);
  check_masked_softmax_values(x, NULL, TRUE);
  check_masked_softmax_values(x, vl, TRUE);

  QkvShape sq = QKV_SHAPE(2, 4, 4);
  g_autoptr(QkvTensor) xq = qkv_test_uniform(&sq, 3, -3, 3);
  g_autoptr(QkvTensor) causal =
      qkv_test_eval(1, (QkvTensor *[]){xq}, build_masked_softmax, &(Spec){.causal = TRUE});
  for (gint b = 0; b < 2; b++)
    for (gint i = 0; i < 4; i++)
      for (gint j = 0; j < 4; j++)
        if (j > i)
          g_assert_cmpfloat(qkv_tensor_get(causal, (b * 4 + i) * 4 + j), ==, 0.0);
  g_assert_cmpfloat(qkv_tensor_get(causal, 0), ==, 1.0);

  QkvShape s4 = QKV_SHAPE(2, 3, 4, 6);
  g_autoptr(QkvTensor) x4 = qkv_test_uniform(&s4, 4, -3, 3);
  gint32 lens4[] = {2, 5};
  gint32 lens4q[] = {1, 0, 6, 3, 2, 4, 5, 1};
  g_autoptr(QkvTensor) vl4 = tensor_i32(QKV_SHAPE(2), lens4);
  g_autoptr(QkvTensor) vl4q = tensor_i32(QKV_SHAPE(2, 4), lens4q);
  check_masked_softmax_values(x4, vl4, FALSE);
  check_masked_softmax_values(x4, vl4q, TRUE);
}

static void
test_masked_softmax_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(2, 3, 5), QKV_SHAPE(3, 4, 7), QKV_SHAPE(2, 2, 3, 5)};
  for (guint c = 0; c < G_N_ELEMENTS(shapes); c++) {
    const QkvShape *s = &shapes[c];
    gint64 batch = s->dims[0], n_q = s->dims[s->rank - 2];
    g_autoptr(QkvTensor) x = qkv_test_uniform(s, 10 + c, -2, 2);
    QkvShape sb = QKV_SHAPE(batch), sq = QKV_SHAPE(batch, n_q);
    g_autoptr(QkvTensor) vb = qkv_test_randint(&sb, 20 + c, 0, (gint32)s->dims[s->rank - 1] + 2);
    g_autoptr(QkvTensor) vq = qkv_test_randint(&sq, 30 + c, 0, (gint32)s->dims[s->rank - 1] + 2);
    QkvTensor *lens[] = {NULL, vb, vq};
    for (guint l = 0; l < 3; l++)
      for (gint causal = 0; causal < 2; causal++)
        for (gint pre = 0; pre < 2; pre++) {
          Spec spec = {.causal = causal,
                       .has_valid_lens = lens[l] != NULL,
                       .pre_scale = pre,
                       .valid_lens = lens[l]};
          QkvTensor *in[] = {x, lens[l]};
          g_autofree gchar *label =
              g_strdup_printf("masked_softmax shape %u lens %u causal %d", c, l, causal);
          qkv_test_gradcheck(label, lens[l] ? 2 : 1, in, NULL, build_masked_softmax, &spec);
          compare_with_composite(label, lens[l] ? 2 : 1, in, build_masked_softmax,
                                 build_masked_softmax_composite, &spec, softmax_factor(x));
        }
  }
}

/* ---- dot_product_attention ---------------------------------------------- */

typedef struct {
  gint64 batch, n_q, n_k, d, d_v;
} DotSize;

static void
test_dot_attention_grad(void)
{
  DotSize sizes[] = {{2, 3, 7, 5, 4}, {1, 4, 4, 3, 2}, {3, 5, 6, 16, 17}};
  for (guint c = 0; c < G_N_ELEMENTS(sizes); c++) {
    DotSize z = sizes[c];
    QkvShape qs = QKV_SHAPE(z.batch, z.n_q, z.d), ks = QKV_SHAPE(z.batch, z.n_k, z.d),
             vs = QKV_SHAPE(z.batch, z.n_k, z.d_v);
    g_autoptr(QkvTensor) q = qkv_test_uniform(&qs, 40 + c, -1, 1);
    g_autoptr(QkvTensor) k = qkv_test_uniform(&ks, 50 + c, -1, 1);
    g_autoptr(QkvTensor) v = qkv_test_uniform(&vs, 60 + c, -1, 1);
    QkvShape sb = QKV_SHAPE(z.batch), sq = QKV_SHAPE(z.batch, z.n_q);
    g_autoptr(QkvTensor) vb = qkv_test_randint(&sb, 70 + c, 0, (gint32)z.n_k + 1);
    g_autoptr(QkvTensor) vq = qkv_test_randint(&sq, 80 + c, 0, (gint32)z.n_k + 1);
    QkvTensor *lens[] = {NULL, vb, vq};
    for (guint l = 0; l < 3; l++)
      for (gint causal = 0; causal < 2; causal++)
        for (guint sel = SELECT_OUT; sel <= SELECT_SUM_OF_BOTH; sel++) {
          Spec spec = {.causal = causal,
                       .has_valid_lens = lens[l] != NULL,
                       .select = sel,
                       .valid_lens = lens[l]};
          QkvTensor *in[] = {q, k, v, lens[l]};
          guint n = lens[l] ? 4 : 3;
          g_autofree gchar *label = g_strdup_printf(
              "dot_product_attention size %u lens %u causal %d select %u", c, l, causal, sel);
          qkv_test_gradcheck(label, n, in, NULL, build_dot, &spec);
          compare_with_composite(label, n, in, build_dot, build_dot_composite, &spec,
                                 dot_factor(q, k, v));
        }
  }
}

/* With dropout in training: gradients through the saved mask; the output is
 * (weights · mask) v with the mask the op exposes; evaluation ignores dropout. */
static void
test_dot_attention_dropout(void)
{
  QkvShape qs = QKV_SHAPE(2, 3, 5), ks = QKV_SHAPE(2, 7, 5), vs = QKV_SHAPE(2, 7, 4);
  g_autoptr(QkvTensor) q = qkv_test_uniform(&qs, 1, -1, 1);
  g_autoptr(QkvTensor) k = qkv_test_uniform(&ks, 2, -1, 1);
  g_autoptr(QkvTensor) v = qkv_test_uniform(&vs, 3, -1, 1);
  gint32 lens[] = {4, 7};
  g_autoptr(QkvTensor) vl = tensor_i32(QKV_SHAPE(2), lens);
  QkvCheckOptions options = qkv_check_options_default();
  options.training = TRUE;
  for (guint sel = SELECT_OUT; sel <= SELECT_SUM_OF_BOTH; sel += 2) {
    Spec spec = {.dropout = 0.4, .has_valid_lens = TRUE, .select = sel};
    QkvTensor *in[] = {q, k, v, vl};
    qkv_test_gradcheck_full("dot_product_attention dropout", 4, in, NULL, build_dot, &spec,
                            &options);
  }

  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *iq = qkv_test_input(g, "q", QKV_F32, qs), *ik = qkv_test_input(g, "k", QKV_F32, ks),
           *iv = qkv_test_input(g, "v", QKV_F32, vs),
           *ivl = qkv_test_input(g, "vl", QKV_I32, QKV_SHAPE(2));
  QkvValue *weights = NULL;
  QkvValue *out = qkv_dot_product_attention(iq, ik, iv, ivl, FALSE, 0.4, &weights, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(out);
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 3);
  QkvValue *outs[] = {out, weights, qkv_node_output(node, 2)};
  QkvPlanOptions popts = qkv_plan_options_default();
  popts.training = TRUE;
  popts.seed = 5;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, &popts, &error);
  g_assert_no_error(error);
  qkv_plan_bind(plan, "q", q, NULL);
  qkv_plan_bind(plan, "k", k, NULL);
  qkv_plan_bind(plan, "v", v, NULL);
  qkv_plan_bind(plan, "vl", vl, NULL);
  g_assert_true(qkv_plan_run(plan, &error));
  const QkvTensor *o = qkv_plan_output(plan, 0), *p = qkv_plan_output(plan, 1),
                  *m = qkv_plan_output(plan, 2);
  gint zeros = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(m); i++) {
    double mv = qkv_tensor_get(m, i);
    /* 1 / (1 - p) rounded to float32: within u of it (relative). */
    g_assert_true(mv == 0.0 || fabs(mv - 1.0 / 0.6) <= QKV_TEST_U / 0.6);
    zeros += mv == 0.0;
  }
  g_assert_cmpint(zeros, >, 0);
  g_assert_cmpint(zeros, <, qkv_tensor_numel(m));
  for (gint b = 0; b < 2; b++)
    for (gint i = 0; i < 3; i++)
      for (gint e = 0; e < 4; e++) {
        double want = 0, magnitude = 0;
        for (gint j = 0; j < 7; j++) {
          double term = qkv_tensor_get(p, (b * 3 + i) * 7 + j) *
                        qkv_tensor_get(m, (b * 3 + i) * 7 + j) *
                        qkv_tensor_get(v, (b * 7 + j) * 4 + e);
          want += term;
          magnitude += fabs(term);
        }
        /* A float32 dot product of 7 terms whose factors p · m are rounded
         * once: gamma(7 + 1) times the sum of |terms|. */
        g_assert_cmpfloat(fabs(qkv_tensor_get(o, (b * 3 + i) * 4 + e) - want), <=,
                          qkv_test_gamma(7 + 1) * magnitude);
      }

  /* Evaluation: dropout is the identity, the result equals dropout 0. */
  Spec with = {.dropout = 0.4, .has_valid_lens = TRUE}, without = {.has_valid_lens = TRUE};
  QkvTensor *in[] = {q, k, v, vl};
  g_autoptr(QkvTensor) e1 = qkv_test_eval(4, in, build_dot, &with);
  g_autoptr(QkvTensor) e0 = qkv_test_eval(4, in, build_dot, &without);
  qkv_assert_tensor_close(e1, e0, 0);
}

/* ---- multi_head_attention ----------------------------------------------- */

typedef struct {
  gint64 batch, n_q, n_k, d_q, d_k, d_v, hidden;
  gint heads;
} MhaSize;

/* Inputs of build_mha for a size: tensors (owned by the caller), count. */
static guint
mha_inputs(const MhaSize *z, const Spec *s, guint32 seed, QkvTensor *valid_lens, QkvTensor **t)
{
  guint n = 0;
  QkvShape xs[3] = {QKV_SHAPE(z->batch, z->n_q, z->d_q), QKV_SHAPE(z->batch, z->n_k, z->d_k),
                    QKV_SHAPE(z->batch, z->n_k, z->d_v)};
  for (guint i = 0; i < (s->self_attention ? 1u : 3u); i++, n++)
    t[n] = qkv_test_uniform(&xs[i], seed + n, -1, 1);
  gint64 in_sizes[4] = {z->d_q, z->d_k, z->d_v, z->hidden};
  for (guint i = 0; i < 4; i++, n++) {
    QkvShape ws = QKV_SHAPE(z->hidden, in_sizes[i]);
    t[n] = qkv_test_uniform(&ws, seed + n, -0.8f, 0.8f);
  }
  for (guint i = 0; s->bias && i < 4; i++, n++) {
    QkvShape bs = QKV_SHAPE(z->hidden);
    t[n] = qkv_test_uniform(&bs, seed + n, -0.5f, 0.5f);
  }
  if (valid_lens != NULL)
    t[n++] = qkv_tensor_copy(valid_lens);
  return n;
}

static void
free_tensors(QkvTensor **t, guint n)
{
  for (guint i = 0; i < n; i++)
    qkv_tensor_free(t[i]);
}

/* Zero rows in the output gradient (padded queries under a masked loss)
 * send the backward down its row-skipping path (ops-common.h): the output
 * goes through a constant row mask before the loss. */
typedef struct {
  Spec spec;
  const QkvTensor *row_mask;
} RowMaskedSpec;

static QkvValue *
build_mha_row_masked(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  RowMaskedSpec *ms = user_data;
  QkvValue *out = build_mha(graph, in, &ms->spec, error);
  QkvValue *mask = out ? qkv_graph_constant(graph, ms->row_mask, error) : NULL;
  return mask ? qkv_mul(out, mask, error) : NULL;
}

/* One query/key position in four is padding: the gradients skip those rows,
 * and must equal both finite differences and the dense backward. */
static void
test_mha_zero_rows(void)
{
  MhaSize z = {2, 16, 16, 6, 6, 6, 8, 2};
  QkvShape sb = QKV_SHAPE(z.batch), sm = QKV_SHAPE(z.batch, z.n_q, 1);
  const gint32 lens[] = {12, 9};
  g_autoptr(QkvTensor) vl = qkv_tensor_new(QKV_I32, &sb);
  memcpy(qkv_tensor_i32(vl), lens, sizeof lens);
  g_autoptr(QkvTensor) row_mask = qkv_tensor_new(QKV_F32, &sm);
  for (gint64 b = 0; b < z.batch; b++)
    for (gint64 i = 0; i < z.n_q; i++)
      qkv_tensor_f32(row_mask)[b * z.n_q + i] = i < lens[b] ? 1.0f : 0.0f;
  for (gint variant = 0; variant < 4; variant++) {
    RowMaskedSpec ms = {.spec = {.heads = z.heads,
                                 .causal = variant & 1,
                                 .bias = TRUE,
                                 .has_valid_lens = TRUE,
                                 .valid_lens = vl,
                                 .self_attention = (variant >> 1) & 1,
                                 .select = SELECT_OUT},
                        .row_mask = row_mask};
    QkvTensor *t[16];
    guint n = mha_inputs(&z, &ms.spec, 700 + (guint)variant, vl, t);
    g_autofree gchar *label = g_strdup_printf("multi_head_attention zero rows causal %d self %d",
                                              ms.spec.causal, ms.spec.self_attention);
    qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_ALWAYS);
    qkv_test_gradcheck(label, n, t, NULL, build_mha_row_masked, &ms);
    QkvTensor *sparse[16], *dense[16];
    g_autoptr(QkvTensor) out_s =
        qkv_test_run_with_grads(n, t, build_mha_row_masked, &ms, NULL, sparse);
    qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_OFF);
    g_autoptr(QkvTensor) out_d =
        qkv_test_run_with_grads(n, t, build_mha_row_masked, &ms, NULL, dense);
    qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_AUTO);
    g_autofree gchar *ls = g_strdup_printf("%s: sparse vs dense", label);
    assert_grads_close(ls, n, &ms.spec, sparse, dense, mha_factor(&ms.spec, t));
    for (guint i = 0; i < n; i++)
      if (dense[i] != NULL)
        qkv_tensor_free(dense[i]);
    free_tensors(t, n);
  }
}

static void
test_mha_grad(void)
{
  MhaSize sizes[] = {
      {2, 3, 5, 4, 6, 3, 6, 1},
      {2, 3, 5, 4, 6, 3, 6, 2},
      {1, 4, 7, 5, 5, 5, 6, 3},
      {2, 4, 4, 8, 8, 8, 8, 4},
  };
  for (guint c = 0; c < G_N_ELEMENTS(sizes); c++) {
    const MhaSize *z = &sizes[c];
    QkvShape sb = QKV_SHAPE(z->batch), sq = QKV_SHAPE(z->batch, z->n_q);
    g_autoptr(QkvTensor) vb = qkv_test_randint(&sb, 90 + c, 0, (gint32)z->n_k + 1);
    g_autoptr(QkvTensor) vq = qkv_test_randint(&sq, 95 + c, 0, (gint32)z->n_k + 1);
    QkvTensor *lens[] = {NULL, vb, vq};
    for (guint l = 0; l < 3; l++)
      for (gint variant = 0; variant < 4; variant++) {
        Spec spec = {.heads = z->heads,
                     .causal = variant & 1,
                     .bias = (variant >> 1) & 1,
                     .has_valid_lens = lens[l] != NULL,
                     .valid_lens = lens[l],
                     .self_attention = c == 3,
                     .select = (Select)((c + l + (guint)variant) % 3)};
        QkvTensor *t[16];
        guint n = mha_inputs(z, &spec, 100 * c + 10 * l + (guint)variant, lens[l], t);
        g_autofree gchar *label =
            g_strdup_printf("multi_head_attention size %u (heads %d) lens %u causal %d bias %d "
                            "select %d",
                            c, z->heads, l, spec.causal, spec.bias, spec.select);
        qkv_test_gradcheck(label, n, t, NULL, build_mha, &spec);
        compare_with_composite(label, n, t, build_mha, build_mha_composite, &spec,
                               mha_factor(&spec, t));
        free_tensors(t, n);
      }
  }
}

static void
test_mha_dropout(void)
{
  MhaSize z = {2, 3, 5, 4, 6, 3, 6, 2};
  QkvShape sb = QKV_SHAPE(2);
  gint32 lens[] = {3, 5};
  g_autoptr(QkvTensor) vl = qkv_tensor_new_i32(&sb, lens);
  QkvCheckOptions options = qkv_check_options_default();
  options.training = TRUE;
  for (gint bias = 0; bias < 2; bias++) {
    Spec spec = {.heads = 2, .bias = bias, .dropout = 0.3, .has_valid_lens = TRUE};
    QkvTensor *t[16];
    guint n = mha_inputs(&z, &spec, 7 + (guint)bias, vl, t);
    qkv_test_gradcheck_full("multi_head_attention dropout", n, t, NULL, build_mha, &spec, &options);
    /* Evaluation ignores dropout. */
    Spec no_dropout = spec;
    no_dropout.dropout = 0;
    g_autoptr(QkvTensor) e1 = qkv_test_eval(n, t, build_mha, &spec);
    g_autoptr(QkvTensor) e0 = qkv_test_eval(n, t, build_mha, &no_dropout);
    qkv_assert_tensor_close(e1, e0, 0);
    free_tensors(t, n);
  }
}

/* Run build's training plan with n_threads at compile time and run_threads at
 * run time into result (the value, then every input gradient); checks that
 * the run allocates nothing. Returns the number of tensors in result. */
static guint
run_threads(guint n, QkvTensor *const *t, QkvCheckBuildFunc build, Spec *spec, gint n_threads,
            gint run_threads, QkvTensor **result)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[16], *outs[17];
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] = qkv_test_input(g, name, qkv_tensor_dtype(t[i]), *qkv_tensor_shape(t[i]));
    qkv_value_set_requires_grad(in[i], qkv_tensor_dtype(t[i]) == QKV_F32);
  }
  outs[0] = build(g, in, spec, &error);
  g_assert_no_error(error);
  QkvValue *loss = qkv_sum(outs[0], NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  guint n_outs = 1;
  for (guint i = 0; i < n; i++)
    if (qkv_graph_gradient(g, in[i]) != NULL)
      outs[n_outs++] = qkv_graph_gradient(g, in[i]);
  QkvPlanOptions popts = qkv_plan_options_default();
  popts.training = TRUE;
  popts.n_threads = n_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, &popts, &error);
  g_assert_no_error(error);
  qkv_plan_set_n_threads(plan, run_threads);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    qkv_plan_bind(plan, name, t[i], NULL);
  }
  guint64 allocs = qkv_alloc_count();
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_cmpuint(qkv_alloc_count(), ==, allocs);
  for (guint o = 0; o < n_outs; o++)
    result[o] = qkv_tensor_copy(qkv_plan_output(plan, o));
  return n_outs;
}

/* The parallel paths (problems spread over threads, per-thread scratch) give
 * the serial numbers, also when a plan is given more threads after it sized
 * its scratch (the kernels then use no more threads than the scratch holds). */
static void
check_thread_counts(const gchar *label, guint n, QkvTensor *const *t, QkvCheckBuildFunc build,
                    Spec *spec, double factor)
{
  static const gint counts[][2] = {{1, 8}, {4, 4}, {3, 2}, {2, 8}};
  QkvTensor *serial[17], *r[17];
  guint n_outs = run_threads(n, t, build, spec, 1, 1, serial);
  for (guint c = 0; c < G_N_ELEMENTS(counts); c++) {
    g_assert_cmpuint(run_threads(n, t, build, spec, counts[c][0], counts[c][1], r), ==, n_outs);
    for (guint o = 0; o < n_outs; o++) {
      g_autofree gchar *l = g_strdup_printf("%s: %d threads (compiled for %d) vs 1, output %u",
                                            label, counts[c][1], counts[c][0], o);
      assert_close_scaled(l, r[o], serial[o], factor);
      qkv_tensor_free(r[o]);
    }
  }
  for (guint o = 0; o < n_outs; o++)
    qkv_tensor_free(serial[o]);
}

static void
test_threads(void)
{
  /* Sizes above the parallel threshold of attention-common.h. */
  MhaSize z = {4, 32, 48, 24, 20, 16, 64, 4};
  gint32 lens[] = {30, 48, 1, 17};
  g_autoptr(QkvTensor) vl = tensor_i32(QKV_SHAPE(4), lens);
  for (gint variant = 0; variant < 2; variant++) {
    Spec spec = {.heads = 4,
                 .bias = TRUE,
                 .dropout = variant ? 0.2 : 0.0,
                 .causal = variant,
                 .has_valid_lens = TRUE,
                 .valid_lens = vl};
    QkvTensor *t[16];
    guint n = mha_inputs(&z, &spec, 11, vl, t);
    check_thread_counts("multi_head_attention", n, t, build_mha, &spec, mha_factor(&spec, t));
    if (!variant)
      compare_with_composite("multi_head_attention parallel", n, t, build_mha, build_mha_composite,
                             &spec, mha_factor(&spec, t));
    free_tensors(t, n);
  }
  /* masked_softmax over more scores than its parallel threshold, in blocks
   * of rows that do not divide the row count. */
  QkvShape xs = QKV_SHAPE(4, 3, 33, 130), qls = QKV_SHAPE(4, 33);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 4, -4, 4);
  g_autoptr(QkvTensor) qlens = qkv_test_randint(&qls, 5, -1, 140);
  for (gint causal = 0; causal < 2; causal++) {
    Spec spec = {.causal = causal, .has_valid_lens = TRUE, .valid_lens = causal ? vl : qlens};
    QkvTensor *t[] = {x, causal ? vl : qlens};
    check_thread_counts("masked_softmax", 2, t, build_masked_softmax, &spec, softmax_factor(x));
    compare_with_composite("masked_softmax parallel", 2, t, build_masked_softmax,
                           build_masked_softmax_composite, &spec, softmax_factor(x));
  }

  QkvShape qs = QKV_SHAPE(4, 40, 40), ks = QKV_SHAPE(4, 48, 40), vs = QKV_SHAPE(4, 48, 24);
  g_autoptr(QkvTensor) q = qkv_test_uniform(&qs, 1, -1, 1);
  g_autoptr(QkvTensor) k = qkv_test_uniform(&ks, 2, -1, 1);
  g_autoptr(QkvTensor) v = qkv_test_uniform(&vs, 3, -1, 1);
  QkvTensor *t[] = {q, k, v, vl};
  for (gint variant = 0; variant < 2; variant++) {
    Spec spec = {.dropout = variant ? 0.3 : 0.0,
                 .causal = !variant,
                 .has_valid_lens = TRUE,
                 .valid_lens = vl,
                 .select = SELECT_SUM_OF_BOTH};
    check_thread_counts("dot_product_attention", 4, t, build_dot, &spec, dot_factor(q, k, v));
    if (!variant)
      compare_with_composite("dot_product_attention parallel", 4, t, build_dot, build_dot_composite,
                             &spec, dot_factor(q, k, v));
  }
}

/* ---- dropout ------------------------------------------------------------ */

static QkvPlan *
dropout_plan(QkvGraph *g, double p, gboolean training, guint64 seed, QkvTensor *x)
{
  g_autoptr(GError) error = NULL;
  QkvValue *in = qkv_graph_lookup_input(g, "x");
  if (in == NULL)
    in = qkv_test_input(g, "x", QKV_F32, *qkv_tensor_shape(x));
  QkvValue *y = qkv_dropout(in, p, &error);
  g_assert_no_error(error);
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = training;
  opts.seed = seed;
  QkvPlan *plan = qkv_graph_compile(g, &y, 1, &opts, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", x, &error));
  return plan;
}

static QkvTensor *
run_copy(QkvPlan *plan)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_run(plan, &error));
  return qkv_tensor_copy(qkv_plan_output(plan, 0));
}

static void
test_dropout(void)
{
  QkvShape s = QKV_SHAPE(200, 500);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 5, 1, 2);
  gint64 n = qkv_tensor_numel(x);
  double p = 0.3;

  /* Evaluation: the identity. */
  g_autoptr(QkvGraph) ge = qkv_graph_new();
  g_autoptr(QkvPlan) eval = dropout_plan(ge, p, FALSE, 1, x);
  g_autoptr(QkvTensor) ye = run_copy(eval);
  qkv_assert_tensor_close(ye, x, 0);

  /* Training: about p of the elements are dropped, the rest scaled. */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvPlan) train = dropout_plan(g, p, TRUE, 42, x);
  g_autoptr(QkvTensor) y0 = run_copy(train);
  g_autoptr(QkvTensor) y1 = run_copy(train); /* step 1 */
  gint64 dropped = 0, differ = 0;
  for (gint64 i = 0; i < n; i++) {
    double a = qkv_tensor_get(y0, i), xi = qkv_tensor_get(x, i);
    if (a == 0.0)
      dropped++;
    else
      /* x · float(1 / (1 - p)): two roundings (and p itself may be held as a
       * float: another half), so 3 u relative covers it. */
      g_assert_cmpfloat(fabs(a - xi / (1 - p)), <=, 3 * QKV_TEST_U * a);
    differ += (a == 0.0) != (qkv_tensor_get(y1, i) == 0.0);
  }
  g_test_message("dropout p %.2f: dropped %.4f, step 1 differs in %.4f", p, (double)dropped / n,
                 (double)differ / n);
  g_assert_cmpfloat(fabs((double)dropped / n - p), <, 0.01);
  /* A different step gives a different mask (independent: ~2p(1-p) differ). */
  g_assert_cmpfloat((double)differ / n, >, 0.3);

  /* The same (seed, step) gives the same mask, in this plan and another. */
  qkv_plan_set_step(train, 0);
  g_autoptr(QkvTensor) y0_again = run_copy(train);
  qkv_assert_tensor_close(y0_again, y0, 0);
  g_autoptr(QkvGraph) g2 = qkv_graph_new();
  g_autoptr(QkvPlan) train2 = dropout_plan(g2, p, TRUE, 42, x);
  g_autoptr(QkvTensor) y0_other = run_copy(train2);
  qkv_assert_tensor_close(y0_other, y0, 0);
  /* Another seed, another mask. */
  g_autoptr(QkvGraph) g3 = qkv_graph_new();
  g_autoptr(QkvPlan) train3 = dropout_plan(g3, p, TRUE, 43, x);
  g_autoptr(QkvTensor) y_seed = run_copy(train3);
  g_assert_cmpfloat(qkv_tensor_max_rel_diff(y_seed, y0, 1.0), >, 0.5);

  /* The saved mask (output 1) is what multiplies x: y = x · mask. */
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g4 = qkv_graph_new();
  QkvValue *in = qkv_test_input(g4, "x", QKV_F32, s);
  QkvValue *y = qkv_dropout(in, p, &error);
  g_assert_no_error(error);
  QkvNode *node = qkv_value_node(y);
  g_assert_cmpuint(qkv_node_n_outputs(node), ==, 2);
  QkvValue *outs[] = {y, qkv_node_output(node, 1)};
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  opts.seed = 42;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g4, outs, 2, &opts, &error);
  g_assert_no_error(error);
  qkv_plan_bind(plan, "x", x, NULL);
  g_assert_true(qkv_plan_run(plan, &error));
  const QkvTensor *ym = qkv_plan_output(plan, 0), *mask = qkv_plan_output(plan, 1);
  for (gint64 i = 0; i < n; i++) {
    g_assert_cmpfloat(qkv_tensor_get(ym, i), ==, qkv_tensor_get(y0, i));
    g_assert_cmpfloat(qkv_tensor_get(ym, i), ==,
                      (float)qkv_tensor_get(x, i) * (float)qkv_tensor_get(mask, i));
  }

  /* p = 0: one output, the identity even in training. */
  QkvValue *y_zero = qkv_dropout(in, 0.0, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_node_n_outputs(qkv_value_node(y_zero)), ==, 1);
  g_autoptr(QkvGraph) g5 = qkv_graph_new();
  g_autoptr(QkvPlan) zero = dropout_plan(g5, 0.0, TRUE, 42, x);
  g_autoptr(QkvTensor) yz = run_copy(zero);
  qkv_assert_tensor_close(yz, x, 0);
}

static void
test_dropout_grad(void)
{
  QkvShape shapes[] = {QKV_SHAPE(7), QKV_SHAPE(3, 5), QKV_SHAPE(2, 3, 4)};
  QkvCheckOptions options = qkv_check_options_default();
  options.training = TRUE;
  for (guint c = 0; c < G_N_ELEMENTS(shapes); c++) {
    g_autoptr(QkvTensor) x = qkv_test_uniform(&shapes[c], 70 + c, -2, 2);
    QkvTensor *in[] = {x};
    double ps[] = {0.0, 0.25, 0.6};
    for (guint i = 0; i < G_N_ELEMENTS(ps); i++)
      for (gint pre = 0; pre < 2; pre++) {
        Spec spec = {.dropout = ps[i], .pre_scale = pre};
        qkv_test_gradcheck_full("dropout training", 1, in, NULL, build_dropout, &spec, &options);
        qkv_test_gradcheck("dropout evaluation", 1, in, NULL, build_dropout, &spec);
      }
  }
}

/* ---- against PyTorch ---------------------------------------------------- */

static GHashTable *reference;

static QkvTensor *
ref(const gchar *case_name, const gchar *tensor)
{
  g_autofree gchar *name = g_strdup_printf("%s.%s", case_name, tensor);
  return qkv_test_ref(reference, name);
}

/* Compare out and the gradients of sum(out · w) with PyTorch's; names[i] is
 * the reference name of input i and "d" + names[i] its gradient. */
static void
compare_reference(const gchar *case_name, guint n, const gchar *const *names,
                  QkvCheckBuildFunc build, Spec *spec, const gchar *out_name, double factor,
                  double *worst)
{
  QkvTensor *t[16] = {NULL}, *grads[16] = {NULL};
  for (guint i = 0; i < n; i++)
    t[i] = ref(case_name, names[i]);
  g_autoptr(QkvTensor) out = qkv_test_run_with_grads(n, t, build, spec, ref(case_name, "w"), grads);
  g_autofree gchar *label = g_strdup_printf("%s.%s vs PyTorch", case_name, out_name);
  *worst = fmax(*worst, assert_close_scaled(label, out, ref(case_name, out_name), factor));
  QkvTensor *want[16] = {NULL};
  for (guint i = 0; i < n; i++)
    if (grads[i] != NULL) {
      g_autofree gchar *gname = g_strdup_printf("d%s", names[i]);
      want[i] = ref(case_name, gname);
    }
  *worst = fmax(*worst, assert_grads_close(label, n, spec, grads, want, factor));
}

static void
test_reference_masked_softmax(void)
{
  double worst = 0;
  const gchar *with_lens[] = {"x", "valid_lens"};
  Spec spec = {.has_valid_lens = TRUE};
  compare_reference("ms_batch", 2, with_lens, build_masked_softmax, &spec, "y",
                    softmax_factor(ref("ms_batch", "x")), &worst);
  compare_reference("ms_query", 2, with_lens, build_masked_softmax, &spec, "y",
                    softmax_factor(ref("ms_query", "x")), &worst);
  spec.causal = TRUE;
  compare_reference("ms_causal_lens", 2, with_lens, build_masked_softmax, &spec, "y",
                    softmax_factor(ref("ms_causal_lens", "x")), &worst);
  spec.has_valid_lens = FALSE;
  compare_reference("ms_causal", 1, with_lens, build_masked_softmax, &spec, "y",
                    softmax_factor(ref("ms_causal", "x")), &worst);
  g_test_message("masked_softmax vs PyTorch: factor needed %.3g", worst);
}

static void
test_reference_dot_attention(void)
{
  double worst = 0;
  const gchar *names[] = {"q", "k", "v", "valid_lens"};
  struct {
    const gchar *name;
    gboolean lens, causal;
  } cases[] = {{"dot_plain", FALSE, FALSE},
               {"dot_batch", TRUE, FALSE},
               {"dot_query", TRUE, FALSE},
               {"dot_causal", TRUE, TRUE}};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    Spec spec = {.has_valid_lens = cases[c].lens, .causal = cases[c].causal};
    QkvTensor *in[] = {ref(cases[c].name, "q"), ref(cases[c].name, "k"), ref(cases[c].name, "v"),
                       cases[c].lens ? ref(cases[c].name, "valid_lens") : NULL};
    double factor = dot_factor(in[0], in[1], in[2]);
    compare_reference(cases[c].name, cases[c].lens ? 4 : 3, names, build_dot, &spec, "out", factor,
                      &worst);
    spec.select = SELECT_WEIGHTS;
    g_autoptr(QkvTensor) w = qkv_test_eval(cases[c].lens ? 4 : 3, in, build_dot, &spec);
    worst = fmax(
        worst, assert_close_scaled("weights vs PyTorch", w, ref(cases[c].name, "weights"), factor));
  }
  g_test_message("dot_product_attention vs PyTorch: factor needed %.3g", worst);
}

static void
test_reference_mha(void)
{
  double worst = 0;
  struct {
    const gchar *name;
    gint heads;
    gboolean bias, lens, causal, self;
  } cases[] = {{"mha2", 2, FALSE, TRUE, FALSE, FALSE},
               {"mha4", 4, TRUE, TRUE, FALSE, FALSE},
               {"mha4_plain", 4, FALSE, FALSE, FALSE, FALSE},
               {"mha_self_causal", 2, TRUE, TRUE, TRUE, TRUE}};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    const gchar *names[16];
    guint n = 0;
    if (cases[c].self) {
      names[n++] = "x";
    } else {
      names[n++] = "queries";
      names[n++] = "keys";
      names[n++] = "values";
    }
    const gchar *w_names[] = {"w_q", "w_k", "w_v", "w_o"},
                *b_names[] = {"b_q", "b_k", "b_v", "b_o"};
    for (guint i = 0; i < 4; i++)
      names[n++] = w_names[i];
    for (guint i = 0; cases[c].bias && i < 4; i++)
      names[n++] = b_names[i];
    if (cases[c].lens)
      names[n++] = "valid_lens";
    Spec spec = {.heads = cases[c].heads,
                 .bias = cases[c].bias,
                 .has_valid_lens = cases[c].lens,
                 .causal = cases[c].causal,
                 .self_attention = cases[c].self};
    QkvTensor *in[16];
    for (guint i = 0; i < n; i++)
      in[i] = ref(cases[c].name, names[i]);
    double factor = mha_factor(&spec, in);
    compare_reference(cases[c].name, n, names, build_mha, &spec, "out", factor, &worst);
    spec.select = SELECT_WEIGHTS;
    g_autoptr(QkvTensor) w = qkv_test_eval(n, in, build_mha, &spec);
    worst = fmax(worst, assert_close_scaled("mha weights vs PyTorch", w,
                                            ref(cases[c].name, "weights"), factor));
  }
  g_test_message("multi_head_attention vs PyTorch: factor needed %.3g", worst);
}

static void
test_reference_dropout(void)
{
  double worst = 0;
  const gchar *names[] = {"x"};
  Spec spec = {.dropout = 0.0};
  /* p = 0: y = x and the gradient w, exactly. */
  compare_reference("dropout0", 1, names, build_dropout, &spec, "y", 0, &worst);
  g_test_message("dropout vs PyTorch: factor needed %.3g", worst);
}

/* ---- the bounds catch real errors ---------------------------------------- */

/* actual passes the bound against expected, and fails it once one element of
 * typical size (|e_i| nearest the RMS) is off by 1e-4 (relative). */
static void
assert_catches(const gchar *label, const QkvTensor *actual, const QkvTensor *expected,
               double min_scale, double factor)
{
  g_autofree gchar *message = NULL;
  g_assert_true(qkv_test_check_bound(actual, expected, NULL, min_scale, factor, NULL, NULL));
  gint64 i = qkv_test_typical_index(expected);
  g_autoptr(QkvTensor) bad = qkv_test_perturbed(actual, i, 1e-4);
  if (qkv_test_check_bound(bad, expected, NULL, min_scale, factor, NULL, &message))
    g_error("%s: an error of 1e-4 in element %" G_GINT64_FORMAT " passes the bound", label, i);
  g_test_message("%s: caught: %s", label, message);
}

/* Every gradient (but the key bias's, which vanishes identically) of a
 * comparison, with the factor the test above uses; frees both sets. */
static void
assert_grads_catch(const gchar *label, guint n, const Spec *spec, QkvTensor **actual,
                   QkvTensor **expected, gboolean free_expected, double factor)
{
  for (guint i = 0; i < n; i++) {
    if (actual[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s: gradient of input %u", label, i);
    double min_scale = grad_min_scale(spec, n, expected, i);
    if (min_scale == 0)
      assert_catches(li, actual[i], expected[i], 0, factor);
    qkv_tensor_free(actual[i]);
  }
  /* After the loop: grad_min_scale reads another input's gradient. */
  for (guint i = 0; free_expected && i < n; i++)
    if (expected[i] != NULL)
      qkv_tensor_free(expected[i]);
}

static void
test_bounds_catch_errors(void)
{
  /* Sparse vs dense backward of multi_head_attention (test_mha_zero_rows). */
  MhaSize z = {2, 16, 16, 6, 6, 6, 8, 2};
  QkvShape sb = QKV_SHAPE(z.batch), sm = QKV_SHAPE(z.batch, z.n_q, 1);
  const gint32 lens[] = {12, 9};
  g_autoptr(QkvTensor) vl = qkv_tensor_new_i32(&sb, lens);
  g_autoptr(QkvTensor) row_mask = qkv_tensor_new(QKV_F32, &sm);
  for (gint64 b = 0; b < z.batch; b++)
    for (gint64 i = 0; i < z.n_q; i++)
      qkv_tensor_f32(row_mask)[b * z.n_q + i] = i < lens[b] ? 1.0f : 0.0f;
  RowMaskedSpec ms = {
      .spec = {.heads = z.heads, .bias = TRUE, .has_valid_lens = TRUE, .valid_lens = vl},
      .row_mask = row_mask};
  QkvTensor *t[16], *sparse[16], *dense[16];
  guint n = mha_inputs(&z, &ms.spec, 700, vl, t);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_ALWAYS);
  g_autoptr(QkvTensor) out_s =
      qkv_test_run_with_grads(n, t, build_mha_row_masked, &ms, NULL, sparse);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_OFF);
  g_autoptr(QkvTensor) out_d =
      qkv_test_run_with_grads(n, t, build_mha_row_masked, &ms, NULL, dense);
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_AUTO);
  assert_grads_catch("mha sparse vs dense", n, &ms.spec, sparse, dense, TRUE,
                     mha_factor(&ms.spec, t));
  free_tensors(t, n);

  /* Fused vs composite: multi_head_attention (test_mha_grad's size 3). */
  MhaSize zc = {2, 4, 4, 8, 8, 8, 8, 4};
  Spec spec = {.heads = 4, .bias = TRUE, .self_attention = TRUE};
  n = mha_inputs(&zc, &spec, 301, NULL, t);
  QkvTensor *grads_f[16], *grads_c[16];
  g_autoptr(QkvTensor) out_f = qkv_test_run_with_grads(n, t, build_mha, &spec, NULL, grads_f);
  g_autoptr(QkvTensor) out_c =
      qkv_test_run_with_grads(n, t, build_mha_composite, &spec, NULL, grads_c);
  double factor = mha_factor(&spec, t);
  assert_catches("mha fused vs composite: value", out_f, out_c, 0, factor);
  assert_grads_catch("mha fused vs composite", n, &spec, grads_f, grads_c, TRUE, factor);
  free_tensors(t, n);

  /* Against PyTorch: mha4 (test_reference_mha). */
  const gchar *names[] = {"queries", "keys", "values", "w_q", "w_k", "w_v",
                          "w_o",     "b_q",  "b_k",    "b_v", "b_o", "valid_lens"};
  Spec rs = {.heads = 4, .bias = TRUE, .has_valid_lens = TRUE};
  QkvTensor *in[16], *grads[16], *want[16] = {NULL};
  n = G_N_ELEMENTS(names);
  for (guint i = 0; i < n; i++)
    in[i] = ref("mha4", names[i]);
  g_autoptr(QkvTensor) out =
      qkv_test_run_with_grads(n, in, build_mha, &rs, ref("mha4", "w"), grads);
  factor = mha_factor(&rs, in);
  assert_catches("mha4 vs PyTorch: out", out, ref("mha4", "out"), 0, factor);
  for (guint i = 0; i < n; i++)
    if (grads[i] != NULL) {
      g_autofree gchar *gname = g_strdup_printf("d%s", names[i]);
      want[i] = ref("mha4", gname);
    }
  assert_grads_catch("mha4 vs PyTorch", n, &rs, grads, want, FALSE, factor);
}

/* ---- bad input ---------------------------------------------------------- */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(2, 3, 6));
  QkvValue *k = qkv_test_input(g, "k", QKV_F32, QKV_SHAPE(2, 5, 6));
  QkvValue *v = qkv_test_input(g, "v", QKV_F32, QKV_SHAPE(2, 5, 4));
  QkvValue *k_bad = qkv_test_input(g, "k_bad", QKV_F32, QKV_SHAPE(2, 5, 7));
  QkvValue *vl = qkv_test_input(g, "vl", QKV_I32, QKV_SHAPE(2));
  QkvValue *vl_f32 = qkv_test_input(g, "vl_f32", QKV_F32, QKV_SHAPE(2));
  QkvValue *vl_long = qkv_test_input(g, "vl_long", QKV_I32, QKV_SHAPE(3));
  QkvValue *vl_q_bad = qkv_test_input(g, "vl_q_bad", QKV_I32, QKV_SHAPE(2, 4));
  QkvValue *vl_rank3 = qkv_test_input(g, "vl_rank3", QKV_I32, QKV_SHAPE(2, 3, 1));
  QkvValue *x1 = qkv_test_input(g, "x1", QKV_F32, QKV_SHAPE(5));
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(2, 3, 5));
  QkvValue *w6 = qkv_test_input(g, "w6", QKV_F32, QKV_SHAPE(6, 6));
  QkvValue *w64 = qkv_test_input(g, "w64", QKV_F32, QKV_SHAPE(6, 4));
  QkvValue *w5 = qkv_test_input(g, "w5", QKV_F32, QKV_SHAPE(6, 5));
  QkvValue *b6 = qkv_test_input(g, "b6", QKV_F32, QKV_SHAPE(6));
  QkvValue *b5 = qkv_test_input(g, "b5", QKV_F32, QKV_SHAPE(5));
  QkvValue *scores = qkv_test_input(g, "scores", QKV_F32, QKV_SHAPE(2, 3, 5));
  QkvValue *w = NULL;

  /* masked_softmax */
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_DTYPE,
                      qkv_masked_softmax(scores, vl_f32, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax(scores, vl_long, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax(scores, vl_q_bad, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax(scores, vl_rank3, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax(x1, NULL, TRUE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_DTYPE,
                      qkv_masked_softmax(xi, NULL, FALSE, &error_));

  /* dot_product_attention */
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_DTYPE,
                      qkv_dot_product_attention(q, k, v, vl_f32, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention(q, k, v, vl_long, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention(q, k, v, vl_q_bad, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention(q, k_bad, v, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention(q, k, q, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_ATTRIBUTE,
                      qkv_dot_product_attention(q, k, v, vl, FALSE, 1.0, &w, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_ATTRIBUTE,
                      qkv_dot_product_attention(q, k, v, vl, FALSE, -0.1, &w, &error_));

  /* multi_head_attention: queries (2, 3, 6), keys (2, 5, 6), values (2, 5, 4);
   * H = 6. */
  QkvValue *biases[] = {b6, b6, b6, b6}, *bad_biases[] = {b6, b6, b5, b6};
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_SHAPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, NULL, 4, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_ATTRIBUTE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, NULL, 0, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_SHAPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w6, w6, NULL, 2, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_SHAPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w5, NULL, 2, NULL, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(g, "'multi_head_attention'", QKV_ERROR_SHAPE,
                      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, bad_biases, 2, NULL, FALSE,
                                               0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_DTYPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, biases, 2, vl_f32, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_SHAPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, NULL, 2, vl_long, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_SHAPE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, NULL, 3, vl_q_bad, FALSE, 0, &w, &error_));
  qkv_assert_op_fails(
      g, "'multi_head_attention'", QKV_ERROR_ATTRIBUTE,
      qkv_multi_head_attention(q, k, v, w6, w6, w64, w6, NULL, 2, vl, FALSE, 1.5, &w, &error_));
  QkvValue *nine[] = {q, k, v, w6, w6, w64, w6, b6, b6};
  qkv_assert_op_fails(g, "multi_head_attention", QKV_ERROR_ARITY,
                      qkv_graph_op(g, "multi_head_attention", nine, 9,
                                   g_variant_new_parsed("{'num_heads': <2>}"), &error_));
  qkv_assert_op_fails(g, "multi_head_attention", QKV_ERROR_ATTRIBUTE,
                      qkv_graph_op(g, "multi_head_attention", nine, 7, NULL, &error_));

  /* dropout */
  qkv_assert_op_fails(g, "'dropout'", QKV_ERROR_ATTRIBUTE, qkv_dropout(q, 1.0, &error_));
  qkv_assert_op_fails(g, "'dropout'", QKV_ERROR_ATTRIBUTE, qkv_dropout(q, -0.5, &error_));
  qkv_assert_op_fails(g, "'dropout'", QKV_ERROR_ATTRIBUTE, qkv_dropout(q, NAN, &error_));
  qkv_assert_op_fails(g, "'dropout'", QKV_ERROR_DTYPE, qkv_dropout(xi, 0.1, &error_));
  qkv_assert_op_fails(g, "dropout", QKV_ERROR_ATTRIBUTE,
                      qkv_graph_op(g, "dropout", &q, 1, NULL, &error_));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  reference = qkv_test_load_reference("attention_ref.txt");
  g_test_add_func("/attention/masked-softmax/book", test_masked_softmax_book);
  g_test_add_func("/attention/masked-softmax/edges", test_masked_softmax_edges);
  g_test_add_func("/attention/masked-softmax/grad", test_masked_softmax_grad);
  g_test_add_func("/attention/masked-softmax/pytorch", test_reference_masked_softmax);
  g_test_add_func("/attention/dot/grad", test_dot_attention_grad);
  g_test_add_func("/attention/dot/dropout", test_dot_attention_dropout);
  g_test_add_func("/attention/dot/pytorch", test_reference_dot_attention);
  g_test_add_func("/attention/mha/grad", test_mha_grad);
  g_test_add_func("/attention/mha/dropout", test_mha_dropout);
  g_test_add_func("/attention/mha/zero-rows", test_mha_zero_rows);
  g_test_add_func("/attention/threads", test_threads);
  g_test_add_func("/attention/mha/pytorch", test_reference_mha);
  g_test_add_func("/attention/dropout/forward", test_dropout);
  g_test_add_func("/attention/dropout/grad", test_dropout_grad);
  g_test_add_func("/attention/dropout/pytorch", test_reference_dropout);
  g_test_add_func("/attention/bad-input", test_bad_input);
  g_test_add_func("/attention/bounds-catch-errors", test_bounds_catch_errors);
  int status = g_test_run();
  g_hash_table_unref(reference);
  return status;
}
