/* test-ops-attention-masks.c: the mask input (boolean or additive) of
 * "masked_softmax", "dot_product_attention" and "multi_head_attention".
 *
 * Each op and mask kind, for every broadcast shape the ops document, with
 * and without valid lengths and causal: finite-difference gradients (the
 * additive mask's included), the same computation built from primitive ops
 * (add, masked_fill, softmax: values and every gradient), a local-window
 * mask built in the graph, PyTorch's numbers
 * (tests/reference/attention_masks_ref.py) and shapes that must be refused.
 */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef enum { OP_SOFTMAX, OP_DOT, OP_MHA } Op;

typedef struct {
  Op op;
  QkvMaskKind kind;
  gboolean causal;
  const QkvTensor *valid_lens; /* NULL: none; else input n_fixed */
  gint heads;                  /* multi-head attention */
  guint n_fixed;               /* inputs before valid_lens and the mask */
  gboolean weights;            /* output the weights (else out) */
  /* the local-window test builds the mask in the graph from this width */
  gint window;
} Spec;

/* ---- fused ops ------------------------------------------------------------ */

/* Inputs: the op's (x; q, k, v; queries, keys, values, w_q, w_k, w_v, w_o),
 * then valid_lens if any, then the mask. */
static QkvValue *
build_fused(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *vl = s->valid_lens != NULL ? in[s->n_fixed] : NULL;
  QkvValue *mask = in[s->n_fixed + (vl != NULL ? 1 : 0)];
  QkvValue *w = NULL, *out = NULL;
  switch (s->op) {
  case OP_SOFTMAX:
    return qkv_masked_softmax_full(in[0], vl, mask, s->kind, s->causal, error);
  case OP_DOT:
    out = qkv_dot_product_attention_masked(in[0], in[1], in[2], vl, mask, s->kind, s->causal, 0.0,
                                           &w, error);
    break;
  case OP_MHA:
    out = qkv_multi_head_attention_masked(in[0], in[1], in[2], in[3], in[4], in[5], in[6], NULL,
                                          s->heads, vl, mask, s->kind, s->causal, 0.0, &w, error);
    break;
  }
  return s->weights ? w : out;
}

/* ---- the same from primitive ops ---------------------------------------- */

/* 1 where the valid lengths and causal keep a score of shape s (…, n_q, n_k)
 * (score rows under one batch element: all but the first axis), else 0. */
static QkvTensor *
keep_tensor(const QkvShape *s, const QkvTensor *valid_lens, gboolean causal)
{
  QkvTensor *t = qkv_tensor_new(QKV_F32, s);
  float *p = qkv_tensor_f32(t);
  gint64 n_q = s->dims[s->rank - 2], n_k = s->dims[s->rank - 1];
  gint64 rows = qkv_shape_numel(s) / MAX(n_k, 1), per_batch = rows / MAX(s->dims[0], 1);
  for (gint64 r = 0; r < rows; r++) {
    gint64 i = r % n_q, b = r / per_batch, limit = n_k;
    if (valid_lens != NULL)
      limit = MIN(limit, (gint64)qkv_tensor_get(
                             valid_lens, qkv_tensor_rank(valid_lens) == 1 ? b : b * n_q + i));
    if (causal)
      limit = MIN(limit, i + 1);
    for (gint64 j = 0; j < n_k; j++)
      p[r * n_k + j] = j < limit ? 1.0f : 0.0f;
  }
  return t;
}

/* softmax of scores with the mask applied as the ops document: an additive
 * mask added, then -1e6 where the lengths, causal or a boolean 0 mask. */
static QkvValue *
composite_softmax(QkvValue *scores, QkvValue *mask, const Spec *s, GError **error)
{
  QkvGraph *g = qkv_value_graph(scores);
  if (s->kind == QKV_MASK_ADDITIVE)
    scores = qkv_add(scores, mask, error);
  g_autoptr(QkvTensor) keep = keep_tensor(qkv_value_shape(scores), s->valid_lens, s->causal);
  QkvValue *zero = qkv_graph_scalar(g, 0.0f);
  QkvValue *ck = scores ? qkv_graph_constant(g, keep, error) : NULL;
  QkvValue *dropped = ck ? qkv_eq(ck, zero, error) : NULL;
  scores = dropped ? qkv_masked_fill(scores, dropped, -1e6, error) : NULL;
  if (scores != NULL && s->kind == QKV_MASK_BOOLEAN) {
    QkvValue *off = qkv_eq(mask, zero, error);
    scores = off ? qkv_masked_fill(scores, off, -1e6, error) : NULL;
  }
  return scores ? qkv_softmax(scores, error) : NULL;
}

static QkvValue *
composite_attention(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *mask, const Spec *s,
                    QkvValue **weights, GError **error)
{
  const QkvShape *qs = qkv_value_shape(q);
  QkvValue *scores = qkv_matmul(q, k, FALSE, TRUE, error);
  scores = scores ? qkv_scale(scores, 1.0 / sqrt((double)qs->dims[qs->rank - 1]), error) : NULL;
  *weights = scores ? composite_softmax(scores, mask, s, error) : NULL;
  return *weights ? qkv_matmul(*weights, v, FALSE, FALSE, error) : NULL;
}

/* (B, T, H) → (B, heads, T, H / heads), the book's transpose_qkv. */
static QkvValue *
split_heads(QkvValue *x, gint heads, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  QkvShape shape = QKV_SHAPE(s->dims[0], s->dims[1], heads, s->dims[2] / heads);
  QkvValue *r = qkv_reshape(x, &shape, error);
  const gint perm[] = {0, 2, 1, 3};
  return r ? qkv_permute(r, perm, 4, error) : NULL;
}

static QkvValue *
build_composite(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  QkvValue *mask = in[s->n_fixed + (s->valid_lens != NULL ? 1 : 0)];
  QkvValue *w = NULL, *out = NULL;
  switch (s->op) {
  case OP_SOFTMAX:
    return composite_softmax(in[0], mask, s, error);
  case OP_DOT:
    out = composite_attention(in[0], in[1], in[2], mask, s, &w, error);
    break;
  case OP_MHA: {
    /* a rank-3 mask is (B, n_q, n_k), shared by the heads */
    if (qkv_value_shape(mask)->rank == 3)
      mask = qkv_unsqueeze(mask, 1, error);
    QkvValue *h[3];
    for (guint i = 0; i < 3; i++) {
      QkvValue *p = qkv_matmul(in[i], in[3 + i], FALSE, TRUE, error);
      h[i] = p ? split_heads(p, s->heads, error) : NULL;
      if (h[i] == NULL)
        return NULL;
    }
    QkvValue *o = mask ? composite_attention(h[0], h[1], h[2], mask, s, &w, error) : NULL;
    const gint perm[] = {0, 2, 1, 3};
    o = o ? qkv_permute(o, perm, 4, error) : NULL;
    const QkvShape *qs = qkv_value_shape(in[0]);
    QkvShape cs = QKV_SHAPE(qs->dims[0], qs->dims[1], -1);
    QkvValue *concat = o ? qkv_reshape(o, &cs, error) : NULL;
    out = concat ? qkv_matmul(concat, in[6], FALSE, TRUE, error) : NULL;
    break;
  }
  }
  return s->weights ? w : out;
}

/* Fused and composite agree within factor · u · (each tensor's scale), the
 * value and every input gradient. */
static void
compare_with_composite(const gchar *label, guint n, QkvTensor *const *tensors, Spec *spec,
                       double factor)
{
  QkvTensor *gf[16], *gc[16];
  g_autoptr(QkvTensor) of = qkv_test_run_with_grads(n, tensors, build_fused, spec, NULL, gf);
  g_autoptr(QkvTensor) oc = qkv_test_run_with_grads(n, tensors, build_composite, spec, NULL, gc);
  g_autofree gchar *l0 = g_strdup_printf("%s: value", label);
  double worst = qkv_assert_scaled(l0, of, oc, factor);
  for (guint i = 0; i < n; i++) {
    if (gf[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s: gradient of input %u", label, i);
    worst = fmax(worst, qkv_assert_scaled(li, gf[i], gc[i], factor));
    qkv_tensor_free(gf[i]);
    qkv_tensor_free(gc[i]);
  }
  g_test_message("%s: fused vs primitives, factor needed %.3g of %g", label, worst, factor);
}

/* ---- bounds ----------------------------------------------------------------
 *
 * As in test-ops-attention.c: two float32 computations of one value by the
 * same formulas differ by at most 2 × (the lengths of the sums on its path)
 * × u × the magnitudes involved, which the tensor's scale stands for, plus a
 * few u per softmax. The mask adds one addition, rounded the same way in
 * both (x + mask is one float32 addition either way), and an additive mask's
 * gradient is a sum of the scores' gradients over the axes it was broadcast
 * along: `terms` more on its path. */

static double
softmax_factor(gint64 n_k, gint64 terms)
{
  return 2.0 * (2 * n_k + 4 + terms);
}

/* scores (d terms), softmax (n_k), weights · v (n_k); backward dP (d_v),
 * softmax backward (n_k), dq (n_k), dk and dv (n_q); the mask's gradient
 * (terms). */
static double
dot_factor(gint64 n_q, gint64 n_k, gint64 d, gint64 d_v, gint64 terms)
{
  return 2.0 * (d + 2 * n_k + 4 + d_v + 2 * n_k + 4 + n_q + terms);
}

/* dot_factor of one head plus the projections (d_in, hidden) both ways and
 * the weight gradients' sums over batch · positions rows. */
static double
mha_factor(gint64 batch, gint64 n, gint64 d_in, gint64 hidden, gint64 heads, gint64 terms)
{
  gint64 dh = hidden / heads;
  return dot_factor(n, n, dh, dh, terms) + 2.0 * (d_in + 2 * hidden + batch * n);
}

/* A boolean mask of that shape: 0 with probability about 0.3. */
static QkvTensor *
bool_mask(const QkvShape *s, guint32 seed)
{
  QkvTensor *t = qkv_test_uniform(s, seed, 0, 1);
  float *p = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    p[i] = p[i] < 0.3f ? 0.0f : 1.0f;
  return t;
}

static QkvTensor *
make_mask(QkvMaskKind kind, const QkvShape *s, guint32 seed)
{
  return kind == QKV_MASK_BOOLEAN ? bool_mask(s, seed) : qkv_test_uniform(s, seed, -2, 2);
}

/* Gradient check (the mask's too when additive: a boolean mask is piecewise
 * constant) and fused vs composite, for inputs tensors[0 .. n_fixed - 1],
 * then valid_lens and the mask. */
static void
check_case(const gchar *label, Spec *spec, QkvTensor *const *fixed, QkvTensor *mask, double factor)
{
  QkvTensor *in[16];
  gboolean check[16];
  guint n = 0;
  for (guint i = 0; i < spec->n_fixed; i++) {
    check[n] = TRUE;
    in[n++] = fixed[i];
  }
  if (spec->valid_lens != NULL) {
    check[n] = FALSE;
    in[n++] = (QkvTensor *)spec->valid_lens;
  }
  check[n] = spec->kind == QKV_MASK_ADDITIVE;
  in[n++] = mask;
  qkv_test_gradcheck(label, n, in, check, build_fused, spec);
  compare_with_composite(label, n, in, spec, factor);
}

/* ---- masked_softmax ------------------------------------------------------- */

static void
test_softmax(void)
{
  QkvShape xs = QKV_SHAPE(2, 3, 5);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 1, -2, 2);
  QkvShape sb = QKV_SHAPE(2), sq = QKV_SHAPE(2, 3);
  g_autoptr(QkvTensor) vb = qkv_test_randint(&sb, 2, 0, 7);
  g_autoptr(QkvTensor) vq = qkv_test_randint(&sq, 3, 0, 7);
  QkvShape masks[] = {QKV_SHAPE(5), QKV_SHAPE(3, 5), QKV_SHAPE(2, 1, 5), QKV_SHAPE(2, 3, 5),
                      QKV_SHAPE(2, 3, 1)};
  QkvTensor *lens[] = {NULL, vb, vq};
  for (guint kind = 0; kind < 2; kind++)
    for (guint m = 0; m < G_N_ELEMENTS(masks); m++) {
      g_autoptr(QkvTensor) mask = make_mask(kind, &masks[m], 10 + m);
      for (guint l = 0; l < 3; l++)
        for (gint causal = 0; causal < 2; causal++) {
          Spec spec = {.op = OP_SOFTMAX,
                       .kind = kind,
                       .causal = causal,
                       .valid_lens = lens[l],
                       .n_fixed = 1};
          g_autofree gchar *label = g_strdup_printf(
              "masked_softmax kind %u mask %u lens %u causal %d", kind, m, l, causal);
          QkvTensor *fixed[] = {x};
          gint64 terms = qkv_tensor_numel(x) / qkv_shape_numel(&masks[m]);
          check_case(label, &spec, fixed, mask, softmax_factor(5, terms));
        }
    }
  /* rank 4 scores, a mask broadcast along two axes */
  QkvShape x4s = QKV_SHAPE(2, 2, 3, 4), m4s = QKV_SHAPE(2, 1, 1, 4);
  g_autoptr(QkvTensor) x4 = qkv_test_uniform(&x4s, 4, -2, 2);
  for (guint kind = 0; kind < 2; kind++) {
    g_autoptr(QkvTensor) mask = make_mask(kind, &m4s, 20);
    Spec spec = {.op = OP_SOFTMAX, .kind = kind, .causal = TRUE, .valid_lens = vb, .n_fixed = 1};
    QkvTensor *fixed[] = {x4};
    check_case("masked_softmax rank 4", &spec, fixed, mask, softmax_factor(4, 6));
  }
}

/* A fully masked row (boolean) comes out uniform, exactly like a row of
 * valid length 0; an additive mask of 0 changes nothing. */
static void
test_softmax_rows(void)
{
  QkvShape xs = QKV_SHAPE(1, 2, 4), ms = QKV_SHAPE(2, 4);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 5, -2, 2);
  const float mv[] = {0, 0, 0, 0, 1, 0, 1, 1};
  g_autoptr(QkvTensor) mask = qkv_tensor_new_f32(&ms, mv);
  Spec spec = {.op = OP_SOFTMAX, .kind = QKV_MASK_BOOLEAN, .n_fixed = 1};
  QkvTensor *in[] = {x, mask};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_fused, &spec);
  const float *py = qkv_tensor_f32(y), *px = qkv_tensor_f32(x);
  for (gint j = 0; j < 4; j++)
    g_assert_cmpfloat(py[j], ==, 0.25f);
  double e0 = exp(px[4]), e2 = exp(px[6]), e3 = exp(px[7]), sum = e0 + e2 + e3;
  const double want[] = {e0 / sum, 0, e2 / sum, e3 / sum};
  for (gint j = 0; j < 4; j++)
    g_assert_cmpfloat(fabs(py[4 + j] - want[j]), <=, 8 * QKV_TEST_U);
  /* additive zeros: the same numbers as no mask at all */
  g_autoptr(QkvTensor) zeros = qkv_tensor_new(QKV_F32, &ms);
  spec.kind = QKV_MASK_ADDITIVE;
  QkvTensor *in0[] = {x, zeros};
  g_autoptr(QkvTensor) y0 = qkv_test_eval(2, in0, build_fused, &spec);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *xv = qkv_test_input(g, "in0", QKV_F32, xs);
  QkvValue *plain = qkv_masked_softmax(xv, NULL, FALSE, &error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &plain, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "in0", x, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  qkv_assert_tensor_close(y0, qkv_plan_output(plan, 0), 0);
}

/* ---- dot_product_attention ------------------------------------------------ */

static void
test_dot(void)
{
  const gint64 B = 2, n_q = 4, n_k = 6, d = 3, d_v = 2;
  QkvShape qs = QKV_SHAPE(B, n_q, d), ks = QKV_SHAPE(B, n_k, d), vs = QKV_SHAPE(B, n_k, d_v);
  g_autoptr(QkvTensor) q = qkv_test_uniform(&qs, 30, -1, 1);
  g_autoptr(QkvTensor) k = qkv_test_uniform(&ks, 31, -1, 1);
  g_autoptr(QkvTensor) v = qkv_test_uniform(&vs, 32, -1, 1);
  QkvShape sb = QKV_SHAPE(B);
  g_autoptr(QkvTensor) vb = qkv_test_randint(&sb, 33, 0, (gint32)n_k + 1);
  QkvShape masks[] = {QKV_SHAPE(n_k), QKV_SHAPE(n_q, n_k), QKV_SHAPE(B, 1, n_k),
                      QKV_SHAPE(B, n_q, n_k)};
  QkvTensor *lens[] = {NULL, vb};
  for (guint kind = 0; kind < 2; kind++)
    for (guint m = 0; m < G_N_ELEMENTS(masks); m++) {
      g_autoptr(QkvTensor) mask = make_mask(kind, &masks[m], 40 + m);
      for (guint l = 0; l < 2; l++)
        for (gint causal = 0; causal < 2; causal++)
          for (gint weights = 0; weights < 2; weights++) {
            Spec spec = {.op = OP_DOT,
                         .kind = kind,
                         .causal = causal,
                         .valid_lens = lens[l],
                         .n_fixed = 3,
                         .weights = weights};
            g_autofree gchar *label = g_strdup_printf(
                "dot_product_attention kind %u mask %u lens %u causal %d weights %d", kind, m, l,
                causal, weights);
            QkvTensor *fixed[] = {q, k, v};
            gint64 terms = B * n_q * n_k / qkv_shape_numel(&masks[m]);
            check_case(label, &spec, fixed, mask, dot_factor(n_q, n_k, d, d_v, terms));
          }
    }
}

/* ---- multi_head_attention -------------------------------------------------- */

static void
test_mha(void)
{
  const gint64 B = 2, n = 4, d_in = 5, H = 6, heads = 2;
  QkvShape xs = QKV_SHAPE(B, n, d_in), ws = QKV_SHAPE(H, d_in), wos = QKV_SHAPE(H, H);
  g_autoptr(QkvTensor) xq = qkv_test_uniform(&xs, 50, -1, 1);
  g_autoptr(QkvTensor) xk = qkv_test_uniform(&xs, 51, -1, 1);
  g_autoptr(QkvTensor) xv = qkv_test_uniform(&xs, 52, -1, 1);
  g_autoptr(QkvTensor) wq = qkv_test_uniform(&ws, 53, -0.6f, 0.6f);
  g_autoptr(QkvTensor) wk = qkv_test_uniform(&ws, 54, -0.6f, 0.6f);
  g_autoptr(QkvTensor) wv = qkv_test_uniform(&ws, 55, -0.6f, 0.6f);
  g_autoptr(QkvTensor) wo = qkv_test_uniform(&wos, 56, -0.6f, 0.6f);
  QkvShape sq = QKV_SHAPE(B, n);
  g_autoptr(QkvTensor) vq = qkv_test_randint(&sq, 57, 0, (gint32)n + 1);
  QkvShape masks[] = {QKV_SHAPE(n, n),           QKV_SHAPE(B, n, n),
                      QKV_SHAPE(B, 1, n),        QKV_SHAPE(B, heads, n, n),
                      QKV_SHAPE(1, heads, n, n), QKV_SHAPE(1, heads, 1, n)};
  QkvTensor *lens[] = {NULL, vq};
  for (guint kind = 0; kind < 2; kind++)
    for (guint m = 0; m < G_N_ELEMENTS(masks); m++) {
      g_autoptr(QkvTensor) mask = make_mask(kind, &masks[m], 60 + m);
      for (guint l = 0; l < 2; l++)
        for (gint causal = 0; causal < 2; causal++) {
          Spec spec = {.op = OP_MHA,
                       .kind = kind,
                       .causal = causal,
                       .valid_lens = lens[l],
                       .n_fixed = 7,
                       .heads = heads,
                       .weights = (m + l) % 2};
          g_autofree gchar *label = g_strdup_printf(
              "multi_head_attention kind %u mask %u lens %u causal %d", kind, m, l, causal);
          QkvTensor *fixed[] = {xq, xk, xv, wq, wk, wv, wo};
          gint64 terms = B * heads * n * n / qkv_shape_numel(&masks[m]);
          check_case(label, &spec, fixed, mask, mha_factor(B, n, d_in, H, heads, terms));
        }
    }
}

/* ---- a local window built in the graph ------------------------------------ */

/* The boolean mask |s - t| ≤ window over (n_q, n_k), from constants of the
 * positions, abs and a comparison. */
static QkvValue *
window_mask(QkvGraph *g, gint64 n_q, gint64 n_k, gint window, GError **error)
{
  QkvShape cs = QKV_SHAPE(n_q, 1), rs = QKV_SHAPE(1, n_k);
  g_autoptr(QkvTensor) ti = qkv_tensor_new(QKV_F32, &cs);
  g_autoptr(QkvTensor) tj = qkv_tensor_new(QKV_F32, &rs);
  for (gint64 i = 0; i < n_q; i++)
    qkv_tensor_f32(ti)[i] = (float)i;
  for (gint64 j = 0; j < n_k; j++)
    qkv_tensor_f32(tj)[j] = (float)j;
  QkvValue *i = qkv_graph_constant(g, ti, error);
  QkvValue *j = i ? qkv_graph_constant(g, tj, error) : NULL;
  QkvValue *diff = j ? qkv_sub(i, j, error) : NULL;
  QkvValue *dist = diff ? qkv_abs(diff, error) : NULL;
  return dist ? qkv_le(dist, qkv_graph_scalar(g, (float)window), error) : NULL;
}

/* q, k, v, valid_lens: the window mask is built here and handed on as the
 * mask input, to the fused op, or to the composite when window < 0. */
static QkvValue *
build_window(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  const QkvShape *qs = qkv_value_shape(in[0]), *ks = qkv_value_shape(in[1]);
  QkvValue *mask = window_mask(graph, qs->dims[1], ks->dims[1], ABS(s->window), error);
  if (mask == NULL)
    return NULL;
  QkvValue *with_mask[] = {in[0], in[1], in[2], in[3], mask};
  return (s->window < 0 ? build_composite : build_fused)(graph, with_mask, user_data, error);
}

static void
test_local_window(void)
{
  const gint64 B = 2, n = 7, d = 4;
  QkvShape qs = QKV_SHAPE(B, n, d);
  g_autoptr(QkvTensor) q = qkv_test_uniform(&qs, 70, -1, 1);
  g_autoptr(QkvTensor) k = qkv_test_uniform(&qs, 71, -1, 1);
  g_autoptr(QkvTensor) v = qkv_test_uniform(&qs, 72, -1, 1);
  const gint32 lens[] = {5, 7};
  QkvShape sb = QKV_SHAPE(B);
  g_autoptr(QkvTensor) vl = qkv_tensor_new_i32(&sb, lens);
  Spec spec = {.op = OP_DOT,
               .kind = QKV_MASK_BOOLEAN,
               .causal = TRUE,
               .valid_lens = vl,
               .n_fixed = 3,
               .weights = TRUE,
               .window = 2};
  QkvTensor *in[] = {q, k, v, vl};
  qkv_test_gradcheck("local window", 4, in, NULL, build_window, &spec);
  g_autoptr(QkvTensor) w = qkv_test_eval(4, in, build_window, &spec);
  /* key t is kept for query s exactly when t ≤ s (causal), t < len and
   * s - t ≤ 2: those weights are positive and sum to 1, the rest are 0 */
  const float *pw = qkv_tensor_f32(w);
  for (gint64 b = 0; b < B; b++)
    for (gint64 s = 0; s < n; s++) {
      double sum = 0;
      for (gint64 t = 0; t < n; t++) {
        float x = pw[(b * n + s) * n + t];
        gboolean kept = t <= s && t < lens[b] && s - t <= 2;
        if (kept)
          g_assert_cmpfloat(x, >, 0.0f);
        else
          g_assert_cmpfloat(x, ==, 0.0f);
        sum += x;
      }
      g_assert_cmpfloat(fabs(sum - 1.0), <=, 2 * n * QKV_TEST_U);
    }
  /* against the composite (a negative window selects it in build_window) */
  QkvTensor *gf[4], *gc[4];
  g_autoptr(QkvTensor) of = qkv_test_run_with_grads(4, in, build_window, &spec, NULL, gf);
  Spec composite = spec;
  composite.window = -spec.window;
  g_autoptr(QkvTensor) oc = qkv_test_run_with_grads(4, in, build_window, &composite, NULL, gc);
  double factor = dot_factor(n, n, d, d, 0);
  qkv_assert_scaled("local window: value", of, oc, factor);
  for (guint i = 0; i < 3; i++) {
    g_autofree gchar *li = g_strdup_printf("local window: gradient of input %u", i);
    qkv_assert_scaled(li, gf[i], gc[i], factor);
    qkv_tensor_free(gf[i]);
    qkv_tensor_free(gc[i]);
  }
}

/* ---- PyTorch -------------------------------------------------------------- */

static GHashTable *reference;

static QkvTensor *
ref(const gchar *c, const gchar *name)
{
  g_autofree gchar *key = g_strdup_printf("%s.%s", c, name);
  return qkv_test_ref(reference, key);
}

/* qkv in float32 against PyTorch in float64 from the same float32 inputs:
 * one float32 computation's error, half the two-computation bound, plus the
 * rounding of the reference to float32 (1 u), and exp's few u. */
static void
check_reference(const gchar *c, Spec *spec, guint n_fixed, const gchar *const *names,
                const gchar *out_name, double factor)
{
  QkvTensor *in[8];
  guint n = 0;
  for (guint i = 0; i < n_fixed; i++)
    in[n++] = ref(c, names[i]);
  if (spec->valid_lens != NULL)
    in[n++] = (QkvTensor *)spec->valid_lens;
  in[n++] = ref(c, "mask");
  /* the loss is sum(out · w) with PyTorch's w, built in the graph */
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *vals[8];
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    vals[i] = qkv_test_input(g, name, qkv_tensor_dtype(in[i]), *qkv_tensor_shape(in[i]));
    if (qkv_tensor_dtype(in[i]) == QKV_F32)
      qkv_value_set_requires_grad(vals[i], TRUE);
  }
  QkvValue *out = build_fused(g, vals, spec, &error);
  QkvValue *wv = qkv_graph_constant(g, ref(c, "w"), &error);
  QkvValue *loss = qkv_sum(qkv_mul(out, wv, &error), NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvValue *outs[9] = {out};
  for (guint i = 0; i < n_fixed; i++)
    outs[1 + i] = qkv_graph_gradient(g, vals[i]);
  guint n_outs = 1 + n_fixed;
  if (spec->kind == QKV_MASK_ADDITIVE)
    outs[n_outs++] = qkv_graph_gradient(g, vals[n - 1]);
  else
    g_assert_null(qkv_graph_gradient(g, vals[n - 1]));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, NULL, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, in[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  g_autofree gchar *lo = g_strdup_printf("%s: %s vs PyTorch", c, out_name);
  qkv_assert_scaled(lo, qkv_plan_output(plan, 0), ref(c, out_name), factor);
  for (guint i = 0; i < n_fixed; i++) {
    g_autofree gchar *dn = g_strdup_printf("d%s", names[i]);
    g_autofree gchar *li = g_strdup_printf("%s: %s vs PyTorch", c, dn);
    qkv_assert_scaled(li, qkv_plan_output(plan, 1 + i), ref(c, dn), factor);
  }
  if (spec->kind == QKV_MASK_ADDITIVE) {
    g_autofree gchar *li = g_strdup_printf("%s: dmask vs PyTorch", c);
    qkv_assert_scaled(li, qkv_plan_output(plan, n_outs - 1), ref(c, "dmask"), factor);
  }
}

static void
test_reference(void)
{
  reference = qkv_test_load_reference("attention_masks_ref.txt");
  const gchar *const x_names[] = {"x"};
  const gchar *const qkv_names[] = {"q", "k", "v"};
  Spec s1 = {.op = OP_SOFTMAX,
             .kind = QKV_MASK_BOOLEAN,
             .valid_lens = ref("ms_bool", "valid_lens"),
             .n_fixed = 1};
  check_reference("ms_bool", &s1, 1, x_names, "y", softmax_factor(5, 2) / 2 + 1);
  Spec s2 = {.op = OP_SOFTMAX,
             .kind = QKV_MASK_ADDITIVE,
             .causal = TRUE,
             .valid_lens = ref("ms_add", "valid_lens"),
             .n_fixed = 1};
  check_reference("ms_add", &s2, 1, x_names, "y", softmax_factor(5, 3) / 2 + 1);
  Spec s3 = {.op = OP_DOT,
             .kind = QKV_MASK_BOOLEAN,
             .valid_lens = ref("dot_bool", "valid_lens"),
             .n_fixed = 3};
  check_reference("dot_bool", &s3, 3, qkv_names, "out", dot_factor(4, 6, 3, 2, 1) / 2 + 1);
  Spec s4 = {.op = OP_DOT, .kind = QKV_MASK_ADDITIVE, .causal = TRUE, .n_fixed = 3};
  check_reference("dot_add", &s4, 3, qkv_names, "out", dot_factor(4, 6, 3, 2, 2) / 2 + 1);
  g_hash_table_unref(reference);
}

/* ---- the builder ------------------------------------------------------------ */

/* qkv_build_mha_masked with a learned additive bias (a zeros parameter, as
 * ALiBi-style biases start) computes what qkv_build_mha does with the same
 * parameters, and the bias receives a gradient. */
static void
test_builder(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 7};
  QkvShape xs = QKV_SHAPE(2, 4, 6), bs = QKV_SHAPE(1, 2, 4, 4);
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, xs);
  QkvValue *bias = qkv_build_param(&b, "alibi", &bs, "zeros", 0, &error);
  QkvValue *masked = qkv_build_mha_masked(&b, "attn", x, x, x, 6, 2, NULL, bias, QKV_MASK_ADDITIVE,
                                          TRUE, 0.0, NULL, &error);
  QkvValue *plain = qkv_build_mha(&b, "attn", x, x, x, 6, 2, NULL, TRUE, 0.0, NULL, &error);
  g_assert_no_error(error);
  QkvValue *loss = qkv_sum(qkv_square(masked, &error), NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvValue *dbias = qkv_graph_gradient(g, bias);
  g_assert_nonnull(dbias);
  QkvValue *outs[] = {masked, plain, dbias};
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) xt = qkv_test_uniform(&xs, 80, -1, 1);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  /* adding zeros is exact: the same numbers */
  qkv_assert_tensor_close(qkv_plan_output(plan, 0), qkv_plan_output(plan, 1), 0);
  g_assert_cmpfloat(qkv_test_max_abs(qkv_plan_output(plan, 2)), >, 0.0);
}

/* ---- refused ---------------------------------------------------------------- */

static void
test_bad_masks(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 3, 5));
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(2, 3, 4));
  QkvValue *k = qkv_test_input(g, "k", QKV_F32, QKV_SHAPE(2, 5, 4));
  QkvValue *w = qkv_test_input(g, "w", QKV_F32, QKV_SHAPE(4, 4));
  QkvValue *m_wide = qkv_test_input(g, "m_wide", QKV_F32, QKV_SHAPE(3, 6));
  QkvValue *m_q = qkv_test_input(g, "m_q", QKV_F32, QKV_SHAPE(4, 5));
  QkvValue *m_rank = qkv_test_input(g, "m_rank", QKV_F32, QKV_SHAPE(1, 2, 3, 5));
  QkvValue *m_i32 = qkv_test_input(g, "m_i32", QKV_I32, QKV_SHAPE(3, 5));
  QkvValue *m_ok = qkv_test_input(g, "m_ok", QKV_F32, QKV_SHAPE(3, 5));
  QkvValue *m_heads = qkv_test_input(g, "m_heads", QKV_F32, QKV_SHAPE(2, 3, 3, 5));
  QkvValue *m_h3 = qkv_test_input(g, "m_h3", QKV_F32, QKV_SHAPE(3, 3, 5));
  QkvValue *vl_f32 = qkv_test_input(g, "vl_f32", QKV_F32, QKV_SHAPE(2));
  QkvValue *wt = NULL;
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax_full(x, NULL, m_wide, QKV_MASK_BOOLEAN, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax_full(x, NULL, m_q, QKV_MASK_ADDITIVE, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_SHAPE,
                      qkv_masked_softmax_full(x, NULL, m_rank, QKV_MASK_BOOLEAN, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_DTYPE,
                      qkv_masked_softmax_full(x, NULL, m_i32, QKV_MASK_BOOLEAN, FALSE, &error_));
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_ATTRIBUTE,
                      qkv_masked_softmax_full(x, NULL, m_ok, (QkvMaskKind)7, FALSE, &error_));
  /* an f32 valid_lens stays an error, not a mask */
  qkv_assert_op_fails(g, "'masked_softmax'", QKV_ERROR_DTYPE,
                      qkv_masked_softmax(x, vl_f32, FALSE, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention_masked(q, k, k, NULL, m_wide, QKV_MASK_BOOLEAN,
                                                       FALSE, 0.0, &wt, &error_));
  qkv_assert_op_fails(g, "'dot_product_attention'", QKV_ERROR_SHAPE,
                      qkv_dot_product_attention_masked(q, k, k, NULL, m_rank, QKV_MASK_ADDITIVE,
                                                       FALSE, 0.0, &wt, &error_));
  /* multi-head: (B, H, n_q, n_k) with the wrong head count, and a rank-3
   * mask whose first axis is not the batch (it is not read as per head) */
  qkv_assert_op_fails(g, "'multi_head_attention'", QKV_ERROR_SHAPE,
                      qkv_multi_head_attention_masked(q, k, k, w, w, w, w, NULL, 2, NULL, m_heads,
                                                      QKV_MASK_BOOLEAN, FALSE, 0.0, &wt, &error_));
  qkv_assert_op_fails(g, "'multi_head_attention'", QKV_ERROR_SHAPE,
                      qkv_multi_head_attention_masked(q, k, k, w, w, w, w, NULL, 2, NULL, m_h3,
                                                      QKV_MASK_ADDITIVE, FALSE, 0.0, &wt, &error_));
  /* a good mask goes through */
  g_autoptr(GError) error = NULL;
  g_assert_nonnull(qkv_masked_softmax_full(x, NULL, m_ok, QKV_MASK_BOOLEAN, FALSE, &error));
  g_assert_no_error(error);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/attention-masks/softmax", test_softmax);
  g_test_add_func("/attention-masks/softmax-rows", test_softmax_rows);
  g_test_add_func("/attention-masks/dot", test_dot);
  g_test_add_func("/attention-masks/mha", test_mha);
  g_test_add_func("/attention-masks/local-window", test_local_window);
  g_test_add_func("/attention-masks/pytorch", test_reference);
  g_test_add_func("/attention-masks/builder", test_builder);
  g_test_add_func("/attention-masks/bad", test_bad_masks);
  return g_test_run();
}
