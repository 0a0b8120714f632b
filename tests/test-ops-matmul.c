/* test-ops-matmul.c: "matmul" forward values, gradients and bad input. */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef struct {
  gboolean ta, tb;
} Transposes;

static QkvValue *
build_matmul(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Transposes *t = user_data;
  return qkv_matmul(in[0], in[1], t->ta, t->tb, error);
}

/* Evaluate matmul on the given tensors. */
static QkvTensor *
eval_matmul(QkvTensor *a, QkvTensor *b, gboolean ta, gboolean tb)
{
  Transposes t = {ta, tb};
  QkvTensor *in[] = {a, b};
  return qkv_test_eval(2, in, build_matmul, &t);
}

static void
assert_shape(const QkvTensor *t, const QkvShape *want)
{
  g_autofree gchar *got = qkv_shape_to_string(qkv_tensor_shape(t));
  g_autofree gchar *exp = qkv_shape_to_string(want);
  g_assert_cmpstr(got, ==, exp);
}

/* A shape with batch axes batch[0..nb), then (rows, cols), or (cols, rows)
 * when transposed: how a matrix of op(x) = (rows, cols) is stored. */
static QkvShape
stored_shape(const gint64 *batch, gint nb, gint64 rows, gint64 cols, gboolean transposed)
{
  QkvShape s = {.rank = nb + 2};
  for (gint i = 0; i < nb; i++)
    s.dims[i] = batch[i];
  s.dims[nb] = transposed ? cols : rows;
  s.dims[nb + 1] = transposed ? rows : cols;
  return s;
}

/* ---- forward values -------------------------------------------------- */

static void
test_forward_2d(void)
{
  /* [[1 2 3] [4 5 6]] · [[7 8] [9 10] [11 12]] = [[58 64] [139 154]] */
  float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
  float at[] = {1, 4, 2, 5, 3, 6}, bt[] = {7, 9, 11, 8, 10, 12};
  float want[] = {58, 64, 139, 154};
  QkvShape s23 = QKV_SHAPE(2, 3), s32 = QKV_SHAPE(3, 2), s22 = QKV_SHAPE(2, 2);
  g_autoptr(QkvTensor) ta = qkv_tensor_new_f32(&s23, a);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&s32, b);
  g_autoptr(QkvTensor) tat = qkv_tensor_new_f32(&s32, at);
  g_autoptr(QkvTensor) tbt = qkv_tensor_new_f32(&s23, bt);

  g_autoptr(QkvTensor) c00 = eval_matmul(ta, tb, FALSE, FALSE);
  g_autoptr(QkvTensor) c10 = eval_matmul(tat, tb, TRUE, FALSE);
  g_autoptr(QkvTensor) c01 = eval_matmul(ta, tbt, FALSE, TRUE);
  g_autoptr(QkvTensor) c11 = eval_matmul(tat, tbt, TRUE, TRUE);
  QkvTensor *all[] = {c00, c10, c01, c11};
  for (guint i = 0; i < G_N_ELEMENTS(all); i++) {
    assert_shape(all[i], &s22);
    /* Small integers: every product and partial sum is exact in float32. */
    qkv_assert_values(all[i], want, 4, 0);
  }
}

static void
test_forward_batched(void)
{
  /* batch 0: [[1 2] [3 4]] · [[5 6] [7 8]] = [[19 22] [43 50]];
   * batch 1: I · [[2 3] [4 5]] */
  float a[] = {1, 2, 3, 4, 1, 0, 0, 1}, b[] = {5, 6, 7, 8, 2, 3, 4, 5};
  float want[] = {19, 22, 43, 50, 2, 3, 4, 5};
  QkvShape s = QKV_SHAPE(2, 2, 2);
  g_autoptr(QkvTensor) ta = qkv_tensor_new_f32(&s, a);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&s, b);
  g_autoptr(QkvTensor) c = eval_matmul(ta, tb, FALSE, FALSE);
  assert_shape(c, &s);
  /* Small integers: every product and partial sum is exact in float32. */
  qkv_assert_values(c, want, 8, 0);

  /* With transpose_b on the same stored b: batch 0 · [[5 7] [6 8]] = [[17 23] [39 53]] */
  float want_tb[] = {17, 23, 39, 53, 2, 4, 3, 5};
  g_autoptr(QkvTensor) ctb = eval_matmul(ta, tb, FALSE, TRUE);
  /* Small integers: every product and partial sum is exact in float32. */
  qkv_assert_values(ctb, want_tb, 8, 0);
}

static void
test_forward_shared(void)
{
  float a[] = {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0};
  float b[] = {7, 8, 9, 10, 11, 12};
  QkvShape sa = QKV_SHAPE(2, 2, 3), sb = QKV_SHAPE(3, 2), sc = QKV_SHAPE(2, 2, 2);
  g_autoptr(QkvTensor) ta = qkv_tensor_new_f32(&sa, a);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&sb, b);
  /* Shared b (the one-sgemm path): batch 1 picks rows 0 and 1 of b. */
  float want[] = {58, 64, 139, 154, 7, 8, 9, 10};
  g_autoptr(QkvTensor) c = eval_matmul(ta, tb, FALSE, FALSE);
  assert_shape(c, &sc);
  /* Small integers: every product and partial sum is exact in float32. */
  qkv_assert_values(c, want, 8, 0);

  /* Shared a: (2, 3) · b (2, 3, 2); b1 = [[1 0] [0 1] [1 1]] gives [[4 5] [10 11]]. */
  float a2[] = {1, 2, 3, 4, 5, 6};
  float b2[] = {7, 8, 9, 10, 11, 12, 1, 0, 0, 1, 1, 1};
  QkvShape sa2 = QKV_SHAPE(2, 3), sb2 = QKV_SHAPE(2, 3, 2);
  g_autoptr(QkvTensor) ta2 = qkv_tensor_new_f32(&sa2, a2);
  g_autoptr(QkvTensor) tb2 = qkv_tensor_new_f32(&sb2, b2);
  float want2[] = {58, 64, 139, 154, 4, 5, 10, 11};
  g_autoptr(QkvTensor) c2 = eval_matmul(ta2, tb2, FALSE, FALSE);
  assert_shape(c2, &sc);
  /* Small integers: every product and partial sum is exact in float32. */
  qkv_assert_values(c2, want2, 8, 0);
}

/* Naive reference: c[b] = op(a[b or 0]) · op(b[b or 0]). */
static QkvTensor *
reference_matmul(QkvTensor *a, QkvTensor *b, gboolean ta, gboolean tb, gint64 batch, gint64 m,
                 gint64 k, gint64 n, const QkvShape *out_shape)
{
  QkvTensor *c = qkv_tensor_new(QKV_F32, out_shape);
  const float *pa = qkv_tensor_f32(a), *pb = qkv_tensor_f32(b);
  float *pc = qkv_tensor_f32(c);
  gboolean a_batched = qkv_tensor_rank(a) > 2, b_batched = qkv_tensor_rank(b) > 2;
  for (gint64 i = 0; i < batch; i++) {
    const float *ai = pa + (a_batched ? i * m * k : 0), *bi = pb + (b_batched ? i * k * n : 0);
    for (gint64 r = 0; r < m; r++)
      for (gint64 col = 0; col < n; col++) {
        double s = 0;
        for (gint64 j = 0; j < k; j++)
          s += (double)(ta ? ai[j * m + r] : ai[r * k + j]) *
               (double)(tb ? bi[col * k + j] : bi[j * n + col]);
        pc[(i * m + r) * n + col] = (float)s;
      }
  }
  return c;
}

/* Larger products (batched, shared, both threading strategies) against the
 * naive loop, in every transpose combination. */
static void
test_forward_reference(void)
{
  const struct {
    gint64 batch, m, k, n;
    gboolean a_batched, b_batched;
  } cases[] = {
      {3, 37, 70, 45, TRUE, TRUE},    {5, 33, 17, 29, TRUE, FALSE}, {4, 19, 23, 41, FALSE, TRUE},
      {2, 131, 130, 129, TRUE, TRUE}, {1, 65, 3, 1, FALSE, FALSE},
  };
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    for (gint combo = 0; combo < 4; combo++) {
      gboolean ta = combo & 1, tb = (combo >> 1) & 1;
      gint64 batch[] = {cases[c].batch};
      QkvShape sa = stored_shape(batch, cases[c].a_batched, cases[c].m, cases[c].k, ta);
      QkvShape sb = stored_shape(batch, cases[c].b_batched, cases[c].k, cases[c].n, tb);
      gboolean batched = cases[c].a_batched || cases[c].b_batched;
      QkvShape sc = stored_shape(batch, batched, cases[c].m, cases[c].n, FALSE);
      g_autoptr(QkvTensor) a = qkv_test_uniform(&sa, 10 + c, -1, 1);
      g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 20 + c, -1, 1);
      g_autoptr(QkvTensor) got = eval_matmul(a, b, ta, tb);
      g_autoptr(QkvTensor) want =
          reference_matmul(a, b, ta, tb, cases[c].batch, cases[c].m, cases[c].k, cases[c].n, &sc);
      /* A float32 GEMM of inner dimension k is within gamma(k) · (|A||B|)_ij
       * of the exact product, in any order of the sums; want is that product
       * rounded once (u · |want| ≤ u · (|A||B|)_ij): factor k + 1 against
       * (|A||B|)_ij. A wrong index or stride gives errors of order 1. */
      g_autoptr(QkvTensor) abs_a = qkv_tensor_copy(a);
      g_autoptr(QkvTensor) abs_b = qkv_tensor_copy(b);
      for (gint64 e = 0; e < qkv_tensor_numel(a); e++)
        qkv_tensor_f32(abs_a)[e] = fabsf(qkv_tensor_f32(a)[e]);
      for (gint64 e = 0; e < qkv_tensor_numel(b); e++)
        qkv_tensor_f32(abs_b)[e] = fabsf(qkv_tensor_f32(b)[e]);
      g_autoptr(QkvTensor) magnitude = reference_matmul(abs_a, abs_b, ta, tb, cases[c].batch,
                                                        cases[c].m, cases[c].k, cases[c].n, &sc);
      g_autofree gchar *label = g_strdup_printf("case %u ta=%d tb=%d", c, ta, tb);
      qkv_assert_bounded(label, got, want, magnitude,
                         qkv_test_gamma((double)cases[c].k) / QKV_TEST_U + 1);
    }
  }
}

/* ---- gradients -------------------------------------------------------- */

static void
gradcheck_case(const gchar *what, const gint64 *batch_a, gint nba, const gint64 *batch_b, gint nbb,
               gint64 m, gint64 k, gint64 n)
{
  for (gint combo = 0; combo < 4; combo++) {
    Transposes t = {combo & 1, (combo >> 1) & 1};
    QkvShape sa = stored_shape(batch_a, nba, m, k, t.ta);
    QkvShape sb = stored_shape(batch_b, nbb, k, n, t.tb);
    g_autoptr(QkvTensor) a = qkv_test_uniform(&sa, 100 + combo, -1, 1);
    g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 200 + combo, -1, 1);
    QkvTensor *in[] = {a, b};
    g_autofree gchar *label = g_strdup_printf("%s ta=%d tb=%d", what, t.ta, t.tb);
    qkv_test_gradcheck(label, 2, in, NULL, build_matmul, &t);
  }
}

static void
test_grad_2d(void)
{
  gradcheck_case("2d", NULL, 0, NULL, 0, 3, 5, 4);
  gradcheck_case("2d outer", NULL, 0, NULL, 0, 7, 1, 6);
}

static void
test_grad_batched(void)
{
  gint64 b2[] = {2}, b22[] = {2, 2};
  gradcheck_case("batched", b2, 1, b2, 1, 3, 5, 4);
  gradcheck_case("rank 4", b22, 2, b22, 2, 3, 2, 3);
}

static void
test_grad_shared_b(void)
{
  gint64 b2[] = {2}, b32[] = {3, 2};
  gradcheck_case("shared b", b2, 1, NULL, 0, 3, 5, 4);
  gradcheck_case("shared b rank 4", b32, 2, NULL, 0, 2, 3, 5);
}

static void
test_grad_shared_a(void)
{
  gint64 b2[] = {2}, b23[] = {2, 3};
  gradcheck_case("shared a", NULL, 0, b2, 1, 3, 5, 4);
  gradcheck_case("shared a rank 4", NULL, 0, b23, 2, 2, 3, 5);
}

/* Only one side needs a gradient: the rule must leave the other alone. */
static void
test_grad_one_side(void)
{
  Transposes t = {FALSE, TRUE};
  QkvShape sa = QKV_SHAPE(2, 3, 5), sb = QKV_SHAPE(4, 5);
  g_autoptr(QkvTensor) a = qkv_test_uniform(&sa, 7, -1, 1);
  g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 8, -1, 1);
  QkvTensor *in[] = {a, b};
  gboolean only_a[] = {TRUE, FALSE}, only_b[] = {FALSE, TRUE};
  qkv_test_gradcheck("only a", 2, in, only_a, build_matmul, &t);
  qkv_test_gradcheck("only b", 2, in, only_b, build_matmul, &t);
}

/* ---- bad input -------------------------------------------------------- */

/* The call failed with a QKV_ERROR naming op, and added no node. */
static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *a23 = qkv_test_input(g, "a23", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *b42 = qkv_test_input(g, "b42", QKV_F32, QKV_SHAPE(4, 2));
  QkvValue *b32 = qkv_test_input(g, "b32", QKV_F32, QKV_SHAPE(3, 2));
  QkvValue *i32 = qkv_test_input(g, "i32", QKV_I32, QKV_SHAPE(3, 2));
  QkvValue *v3 = qkv_test_input(g, "v3", QKV_F32, QKV_SHAPE(3));
  QkvValue *a234 = qkv_test_input(g, "a234", QKV_F32, QKV_SHAPE(2, 3, 4));
  QkvValue *b345 = qkv_test_input(g, "b345", QKV_F32, QKV_SHAPE(3, 4, 5));
  QkvValue *b2245 = qkv_test_input(g, "b2245", QKV_F32, QKV_SHAPE(2, 2, 4, 5));

  qkv_assert_op_fails(g, "matmul", QKV_ERROR_SHAPE, qkv_matmul(a23, b42, FALSE, FALSE, &error_));
  /* The transpose decides which axis is K: (2, 3)ᵀ · (3, 2) has K 2 vs 3. */
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_SHAPE, qkv_matmul(a23, b32, TRUE, FALSE, &error_));
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_DTYPE, qkv_matmul(a23, i32, FALSE, FALSE, &error_));
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_SHAPE, qkv_matmul(v3, b32, FALSE, FALSE, &error_));
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_SHAPE, qkv_matmul(a234, b345, FALSE, FALSE, &error_));
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_SHAPE, qkv_matmul(a234, b2245, FALSE, FALSE, &error_));

  /* A mistyped attribute through the generic path. */
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "transpose_a", g_variant_new_string("yes"));
  QkvValue *ab[] = {a23, b32};
  qkv_assert_op_fails(g, "matmul", QKV_ERROR_ATTRIBUTE,
                      qkv_graph_op(g, "matmul", ab, 2, g_variant_builder_end(&attrs), &error_));

  /* The good combination still works after the failures. */
  g_autoptr(GError) error = NULL;
  QkvValue *c = qkv_matmul(a23, b32, FALSE, FALSE, &error);
  g_assert_no_error(error);
  g_assert_nonnull(c);
  QkvShape want = QKV_SHAPE(2, 2);
  g_assert_true(qkv_shape_equal(qkv_value_shape(c), &want));
}

/* qkv_sgemm() against a plain double loop, at the shapes where it uses its
 * own kernel instead of OpenBLAS (tiny transposed products, x·wᵀ with a
 * narrow w) and beside them, with strided operands, alpha and beta. */
static void
test_sgemm_small_shapes(void)
{
  static const struct {
    gboolean ta, tb;
    gint64 m, n, k;
  } cases[] = {
      {FALSE, TRUE, 10, 10, 8},  {TRUE, FALSE, 10, 8, 10},  {FALSE, FALSE, 10, 8, 10},
      {FALSE, TRUE, 3, 17, 5},   {TRUE, FALSE, 17, 3, 9},   {FALSE, TRUE, 300, 32, 32},
      {FALSE, TRUE, 257, 19, 7}, {FALSE, TRUE, 64, 64, 64}, {TRUE, TRUE, 4, 5, 6},
  };
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    gboolean ta = cases[c].ta, tb = cases[c].tb;
    gint64 m = cases[c].m, n = cases[c].n, k = cases[c].k;
    /* stored shapes, each row padded by 3 floats */
    gint64 a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    gint64 lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
    QkvShape as = QKV_SHAPE(a_rows, lda), bs = QKV_SHAPE(b_rows, ldb), cs = QKV_SHAPE(m, ldc);
    g_autoptr(QkvTensor) a = qkv_test_uniform(&as, 40 + c, -1, 1);
    g_autoptr(QkvTensor) b = qkv_test_uniform(&bs, 50 + c, -1, 1);
    g_autoptr(QkvTensor) out = qkv_test_uniform(&cs, 60 + c, -1, 1);
    g_autoptr(QkvTensor) before = qkv_tensor_copy(out);
    const float *pa = qkv_tensor_f32(a), *pb = qkv_tensor_f32(b), *c0 = qkv_tensor_f32(before);
    for (gint beta_case = 0; beta_case < 2; beta_case++) {
      float alpha = 0.75f, beta = beta_case ? 0.5f : 0.0f;
      memcpy(qkv_tensor_f32(out), c0, qkv_tensor_nbytes(out));
      qkv_sgemm(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, qkv_tensor_f32(out), ldc, 1);
      const float *pc = qkv_tensor_f32(out);
      for (gint64 i = 0; i < m; i++)
        for (gint64 j = 0; j < ldc; j++) {
          if (j >= n) { /* the padding is never written */
            g_assert_cmpfloat(pc[i * ldc + j], ==, c0[i * ldc + j]);
            continue;
          }
          double sum = 0, magnitude = 0;
          for (gint64 p = 0; p < k; p++) {
            double term = (double)(ta ? pa[p * lda + i] : pa[i * lda + p]) *
                          (tb ? pb[j * ldb + p] : pb[p * ldb + j]);
            sum += term;
            magnitude += fabs(term);
          }
          double want = alpha * sum + (beta != 0.0f ? beta * c0[i * ldc + j] : 0.0);
          magnitude = fabs(alpha) * magnitude + (beta != 0.0f ? fabs(beta * c0[i * ldc + j]) : 0.0);
          /* k products summed, scaled by alpha and added to beta · c: gamma(k +
           * 2) times the sum of the magnitudes, in any order. */
          if (fabs(pc[i * ldc + j] - want) > qkv_test_gamma((double)k + 2) * magnitude)
            g_error("qkv_sgemm %s%s %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT "x%" G_GINT64_FORMAT
                    " beta %g: c[%" G_GINT64_FORMAT ",%" G_GINT64_FORMAT "] = %.8g, expected %.8g",
                    ta ? "T" : "N", tb ? "T" : "N", m, n, k, beta, i, j, pc[i * ldc + j], want);
        }
    }
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/matmul/sgemm-small-shapes", test_sgemm_small_shapes);
  g_test_add_func("/matmul/forward/2d", test_forward_2d);
  g_test_add_func("/matmul/forward/batched", test_forward_batched);
  g_test_add_func("/matmul/forward/shared", test_forward_shared);
  g_test_add_func("/matmul/forward/reference", test_forward_reference);
  g_test_add_func("/matmul/grad/2d", test_grad_2d);
  g_test_add_func("/matmul/grad/batched", test_grad_batched);
  g_test_add_func("/matmul/grad/shared-b", test_grad_shared_b);
  g_test_add_func("/matmul/grad/shared-a", test_grad_shared_a);
  g_test_add_func("/matmul/grad/one-side", test_grad_one_side);
  g_test_add_func("/matmul/bad-input", test_bad_input);
  return g_test_run();
}
