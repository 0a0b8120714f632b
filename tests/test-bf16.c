/* test-bf16.c: bf16 precision (QkvPrecision in qkv-plan.h).
 *
 * - the rounding to bf16 against an independent one (scaling by a power of
 *   two and rint), on special values and random bit patterns, on the CPU's
 *   conversion and on the portable code;
 * - qkv_sgemm() in bf16 against exact arithmetic on the rounded operands,
 *   against exact arithmetic on the operands as given and against float32,
 *   every layout, α and β, padded rows, one and two threads, on the native
 *   path and on the emulated one (the two against each other too);
 * - the fused multi-head attention op (weights path and flash) in bf16
 *   against fp32, elementwise within a first-order bound derived from the
 *   fp32 run's intermediates;
 * - a small Transformer's training step (loss and every gradient) in bf16
 *   against fp32;
 * - the plan API: fp32 by default, bit for bit unchanged beside bf16 plans,
 *   the setting reaching the pool's workers, no allocation after the first
 *   bf16 run.
 *
 * The suite runs once as detected (native bf16 where the CPU has it) and
 * once with QKV_VEC_ISA=avx2 (emulated; see tests/meson.build).
 *
 * Notation: u = 2^-24 (float32, QKV_TEST_U), u_b = 2^-8 (bf16,
 * QKV_TEST_U_BF16). Rounding x to bf16 gives x(1 + δ) with |δ| ≤ u_b, so a
 * product of two rounded operands is ab(1 + δ1)(1 + δ2), off by at most
 * (2u_b + u_b²)|a||b|; and it is exact in float32 (8 + 8 significant bits). */
#include "test-util.h"

#include "kernels/kernels-private.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-optim.h>

/* ---- rounding -------------------------------------------------------------- */

static float
from_bits(guint32 u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static guint32
to_bits(float f)
{
  guint32 u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* x rounded to 8 significant bits, to nearest even, in double: the value
 * scaled so that its last kept bit has weight 1, rint (which rounds ties to
 * even), scaled back. Float32 subnormals become signed zero; overflow goes to
 * infinity. An implementation that shares nothing with the library's. */
static float
reference_bf16(float x)
{
  if (isnan(x) || isinf(x) || x == 0)
    return x;
  if (fabsf(x) < FLT_MIN)
    return signbit(x) ? -0.0f : 0.0f;
  int e;
  frexp(x, &e); /* |x| = f 2^e, f in [0.5, 1) */
  double r = ldexp(rint(ldexp(x, 8 - e)), e - 8);
  if (fabs(r) >= ldexp(1.0, 128))
    return signbit(x) ? -INFINITY : INFINITY;
  return (float)r;
}

static void
check_rounding(const float *src, gsize n)
{
  g_autofree guint16 *bits = g_new(guint16, n);
  g_autofree float *rounded = g_new(float, n);
  qkv_bf16_from_floats(bits, src, n);
  qkv_bf16_round_f32(rounded, src, n);
  for (gsize i = 0; i < n; i++) {
    float want = reference_bf16(src[i]);
    float got = from_bits((guint32)bits[i] << 16);
    if (isnan(src[i])) {
      /* a quiet NaN of the same sign */
      g_assert_true(isnan(got) && isnan(rounded[i]));
      g_assert_cmpuint(bits[i] & 0x40u, !=, 0);
      g_assert_cmpuint(bits[i] >> 15, ==, to_bits(src[i]) >> 31);
      continue;
    }
    if (to_bits(got) != to_bits(want) || to_bits(rounded[i]) != to_bits(want))
      g_error("bf16(%a) (bits %08x): %a and %a, want %a", src[i], to_bits(src[i]), got, rounded[i],
              want);
  }
}

static void
test_rounding(void)
{
  static const float special[] = {1.0f,
                                  -1.0f,
                                  0.0f,
                                  -0.0f,
                                  1.0f + 0x1p-8f /* tie: to even, 1 */,
                                  1.0f + 0x3p-8f /* tie: to even, up */,
                                  1.0f + 0x1p-8f + 0x1p-20f /* above the tie */,
                                  3.14159265f,
                                  -2.71828183f,
                                  0x1p-126f /* smallest normal */,
                                  0x1p-127f /* subnormal */,
                                  -0x1p-140f,
                                  FLT_MAX /* rounds to infinity */,
                                  -FLT_MAX,
                                  0x1.fep127f /* stays */,
                                  INFINITY,
                                  -INFINITY,
                                  NAN,
                                  -NAN,
                                  65504.0f,
                                  1e-30f,
                                  0x1.01p0f,
                                  0x1.018p0f};
  gsize n_special = G_N_ELEMENTS(special);
  g_assert_cmpfloat(reference_bf16(1.0f + 0x1p-8f), ==, 1.0f);
  g_assert_cmpfloat(reference_bf16(1.0f + 0x3p-8f), ==, 1.0f + 0x1p-6f);
  g_assert_cmpfloat(reference_bf16(FLT_MAX), ==, INFINITY);
  /* random bit patterns (every class: NaNs, subnormals, ties are rare but
   * the special values cover them), in lengths that leave every tail */
  gsize n = 1 << 18;
  g_autofree float *src = g_new(float, n + n_special);
  guint32 seed = 12345;
  for (gsize i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    guint32 hi = seed >> 16;
    seed = seed * 1664525u + 1013904223u;
    src[i] = from_bits(hi << 16 | seed >> 16);
  }
  memcpy(src + n, special, sizeof special);
  /* ties to even: significands with exactly the half bit set */
  for (gsize i = 0; i < 4096; i++)
    src[i] = from_bits((to_bits(src[i]) & 0xffff0000u) | 0x8000u);
  for (gint pass = 0; pass < 2; pass++) {
    /* pass 0: the fastest conversion this CPU has; 1: the portable code */
    qkv_set_bf16_emulation(pass == 1);
    for (gsize len = 0; len <= 40; len++)
      check_rounding(src + 1000, len);
    check_rounding(src, n + n_special);
    check_rounding(special, n_special);
  }
  qkv_set_bf16_emulation(FALSE);
}

/* ---- qkv_sgemm() in bf16 ------------------------------------------------------ */

static float
uniform(guint32 *seed)
{
  *seed = *seed * 1664525u + 1013904223u;
  return (float)(*seed >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

typedef struct {
  gint64 m, n, k;
  gint threads;
} Product;

typedef struct {
  gboolean ta, tb;
  float alpha, beta;
} Layout;

/* The operands and the results of one product. */
typedef struct {
  gint64 m, n, k, lda, ldb, ldc, a_rows, b_rows;
  float *a, *b, *c0;
} Operands;

static void
operands_init(Operands *o, const Product *p, const Layout *l, guint32 seed)
{
  o->m = p->m, o->n = p->n, o->k = p->k;
  o->a_rows = l->ta ? p->k : p->m, o->b_rows = l->tb ? p->n : p->k;
  o->lda = (l->ta ? p->m : p->k) + 3, o->ldb = (l->tb ? p->k : p->n) + 5, o->ldc = p->n + 7;
  o->a = g_new(float, o->a_rows * o->lda);
  o->b = g_new(float, o->b_rows * o->ldb);
  o->c0 = g_new(float, p->m * o->ldc);
  for (gint64 i = 0; i < o->a_rows * o->lda; i++)
    o->a[i] = uniform(&seed);
  for (gint64 i = 0; i < o->b_rows * o->ldb; i++)
    o->b[i] = 3.0f * uniform(&seed);
  for (gint64 i = 0; i < p->m * o->ldc; i++)
    o->c0[i] = uniform(&seed);
}

static void
operands_clear(Operands *o)
{
  g_free(o->a);
  g_free(o->b);
  g_free(o->c0);
}

/* c = α op(a) op(b) + β c0 by qkv_sgemm() in the given precision; with β = 0
 * c starts as NaN (it must not be read). The padding of c keeps c0's values. */
static float *
run_product(const Operands *o, const Layout *l, QkvPrecision precision, gint threads)
{
  float *c = g_memdup2(o->c0, (gsize)(o->m * o->ldc) * sizeof(float));
  if (l->beta == 0.0f)
    for (gint64 i = 0; i < o->m; i++)
      for (gint64 j = 0; j < o->n; j++)
        c[i * o->ldc + j] = NAN;
  qkv_set_running_precision(precision);
  qkv_sgemm(l->ta, l->tb, o->m, o->n, o->k, l->alpha, o->a, o->lda, o->b, o->ldb, l->beta, c,
            o->ldc, threads);
  qkv_set_running_precision(QKV_PRECISION_FP32);
  for (gint64 i = 0; i < o->m; i++)
    for (gint64 j = o->n; j < o->ldc; j++)
      g_assert_cmpfloat(c[i * o->ldc + j], ==, o->c0[i * o->ldc + j]);
  return c;
}

/* Element (i, j): the exact result from the rounded operands (exact_r) and
 * from the operands as given (exact); the magnitudes |α|Σ|ã||b̃| + |β c0|
 * (mag_r) and |α|Σ|a||b| + |β c0| (mag), and |α|Σ|a||b| alone (prod). */
typedef struct {
  double exact_r, exact, mag_r, mag, prod;
} Exact;

static Exact
exact_element(const Operands *o, const Layout *l, gint64 i, gint64 j)
{
  Exact e = {0, 0, 0, 0, 0};
  for (gint64 p = 0; p < o->k; p++) {
    float x = l->ta ? o->a[p * o->lda + i] : o->a[i * o->lda + p];
    float y = l->tb ? o->b[j * o->ldb + p] : o->b[p * o->ldb + j];
    double xr = reference_bf16(x), yr = reference_bf16(y);
    e.exact_r += xr * yr;
    e.mag_r += fabs(xr * yr);
    e.exact += (double)x * y;
    e.mag += fabs((double)x * y);
  }
  double c0 = l->beta == 0.0f ? 0 : o->c0[i * o->ldc + j];
  e.exact_r = l->alpha * e.exact_r + l->beta * c0;
  e.exact = l->alpha * e.exact + l->beta * c0;
  e.mag_r = fabs(l->alpha) * e.mag_r + fabs(l->beta * c0);
  e.prod = fabs(l->alpha) * e.mag;
  e.mag = e.prod + fabs(l->beta * c0);
  return e;
}

/* How far each result may be from the exact values, and the worst seen
 * (as a share of the bound). The float32 part: the k products summed in
 * any order (k - 1 roundings), products that a backend may round (if it
 * folds α into an operand), then α, β·c0 and the last addition: (2k + 4) u
 * times the magnitude, as gamma. The bf16 part: (2u_b + u_b²) Σ|a||b| (see
 * the top). float32's own result is within (2k + 2) u Σ|a||b| of exact (the
 * bound of tests/test-gemm.c). */
typedef struct {
  double vs_rounded, vs_exact, vs_fp32, vs_other;
  double fp32_excess; /* largest |bf16 - fp32| / float32's bound: > 1 shows bf16 rounding */
} Worst;

static void
check_product(const Product *p, const Layout *l, Worst *w)
{
  Operands o;
  operands_init(&o, p, l, (guint32)(p->m * 7 + p->n * 131 + p->k + l->ta * 3 + l->tb));
  g_autofree float *c_bf16 = run_product(&o, l, QKV_PRECISION_BF16, p->threads);
  g_autofree float *c_fp32 = run_product(&o, l, QKV_PRECISION_FP32, p->threads);
  qkv_set_bf16_emulation(TRUE);
  g_autofree float *c_emul = run_product(&o, l, QKV_PRECISION_BF16, p->threads);
  qkv_set_bf16_emulation(FALSE);
  double u = QKV_TEST_U, ub = QKV_TEST_U_BF16, k = (double)p->k;
  for (gint64 i = 0; i < p->m; i++)
    for (gint64 j = 0; j < p->n; j++) {
      Exact e = exact_element(&o, l, i, j);
      double f32_rounded = qkv_test_gamma(2 * k + 4) * e.mag_r + 1e-37;
      double bf16_part = (2 * ub + ub * ub) * e.prod;
      double f32_fp32 = (2 * k + 2) * u * e.mag + 1e-37;
      double got = c_bf16[i * o.ldc + j], emul = c_emul[i * o.ldc + j],
             fp32 = c_fp32[i * o.ldc + j];
      w->vs_rounded = fmax(w->vs_rounded, fabs(got - e.exact_r) / f32_rounded);
      w->vs_rounded = fmax(w->vs_rounded, fabs(emul - e.exact_r) / f32_rounded);
      w->vs_exact = fmax(w->vs_exact, fabs(got - e.exact) / (bf16_part + f32_rounded));
      w->vs_fp32 = fmax(w->vs_fp32, fabs(got - fp32) / (bf16_part + f32_rounded + f32_fp32));
      w->vs_other = fmax(w->vs_other, fabs(got - emul) / (2 * f32_rounded));
      w->fp32_excess = fmax(w->fp32_excess, fabs(got - fp32) / f32_fp32);
      if (isnan(got) || isnan(emul) || w->vs_rounded > 1 || w->vs_exact > 1 || w->vs_fp32 > 1 ||
          w->vs_other > 1)
        g_error("%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT
                " ta %d tb %d α %g β %g, %d threads, element (%" G_GINT64_FORMAT
                ", %" G_GINT64_FORMAT "): bf16 %.9g, emulated %.9g, fp32 %.9g, exact from the "
                "rounded operands %.9g, exact %.9g; worst shares of the bounds: rounded %.3g, "
                "exact %.3g, fp32 %.3g, native vs emulated %.3g",
                p->m, p->n, p->k, l->ta, l->tb, l->alpha, l->beta, p->threads, i, j, got, emul,
                fp32, e.exact_r, e.exact, w->vs_rounded, w->vs_exact, w->vs_fp32, w->vs_other);
    }
  operands_clear(&o);
}

static void
test_sgemm(void)
{
  /* small ones (below 2^18 multiply-adds: the AVX512_BF16 kernel where
   * products are native, else emulated; shapes that leave last row blocks
   * of 1 to 8 rows, 1 to 4 column vectors each full and with a tail, more
   * than one column block, odd k, a long k through the transposed packing,
   * single rows), the native threshold 2^18, single rows and columns, and
   * products split over two threads by rows (m ≥ n) and by columns */
  static const Product products[] = {
      {3, 4, 5, 1},       {17, 9, 33, 1},     {1, 1, 1, 1},      {32, 32, 32, 1},  {6, 64, 31, 1},
      {13, 100, 7, 1},    {7, 49, 2, 1},      {11, 130, 64, 1},  {2, 1, 1000, 1},  {5, 20, 9, 1},
      {4, 48, 3, 1},      {7, 16, 2, 1},      {1, 40, 17, 1},    {12, 80, 5, 1},   {1, 1, 4097, 1},
      {64, 64, 64, 1},    {100, 70, 60, 1},   {1, 300, 1000, 1}, {300, 1, 900, 1}, {130, 40, 70, 2},
      {520, 260, 130, 2}, {200, 700, 130, 2}, {64, 64, 257, 2},
  };
  static const Layout layouts[] = {
      {FALSE, FALSE, 1.0f, 0.0f}, {FALSE, TRUE, 1.0f, 0.0f},   {TRUE, FALSE, 1.0f, 1.0f},
      {TRUE, TRUE, 0.5f, -0.75f}, {FALSE, TRUE, 0.125f, 1.0f}, {TRUE, FALSE, -2.0f, 0.0f},
  };
  const gchar *why;
  gboolean native = qkv_bf16_native(&why);
  g_test_message("bf16 products here: %s (%s)", native ? "native" : "emulated", why);
  Worst w = {0, 0, 0, 0, 0};
  for (guint i = 0; i < G_N_ELEMENTS(products); i++)
    for (guint j = 0; j < G_N_ELEMENTS(layouts); j++) {
      /* the large ones in two layouts only (the reference is slow) */
      if (products[i].m * products[i].n * products[i].k > (1 << 22) && j % 3 != 0)
        continue;
      check_product(&products[i], &layouts[j], &w);
    }
  g_test_message("worst shares of the bounds: exact from the rounded operands %.3g, exact %.3g, "
                 "fp32 %.3g, native vs emulated %.3g; bf16 vs fp32 reached %.3g times float32's "
                 "bound",
                 w.vs_rounded, w.vs_exact, w.vs_fp32, w.vs_other, w.fp32_excess);
  /* no silent fp32: the operands' rounding shows, far beyond float32's error */
  g_assert_cmpfloat(w.fp32_excess, >, 100);
}

/* k = 0 only scales c (β = 0: clears it), in bf16 as in fp32. */
static void
test_sgemm_empty(void)
{
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {1, 2, 3, 4};
  qkv_set_running_precision(QKV_PRECISION_BF16);
  qkv_sgemm(FALSE, FALSE, 2, 2, 0, 1.0f, a, 1, b, 2, 0.5f, c, 2, 1);
  qkv_set_running_precision(QKV_PRECISION_FP32);
  g_assert_cmpfloat(c[0], ==, 0.5f);
  g_assert_cmpfloat(c[3], ==, 2.0f);
}

/* Products whose m or k changes from call to call (the ops drop a
 * gradient's zero rows) are cut into a bounded set of chunks on the native
 * path, so they build a bounded set of oneDNN primitives: here 45 values of
 * m build at most 8 row chunks (64·2^i up to 512, rests of 16 to 64 rows)
 * times the 2 chunks of k = 96 (64, then 32 with β = 1), where one
 * primitive per shape would build 45; 45 values of k likewise. The varying
 * dimension is the rows of the operands' copies there, as in the ops (a
 * copy's row length is part of a primitive: a varying m of a transposed a
 * would still build one per value). The results stay within the bounds of
 * test_sgemm (a sample of them: the exact reference is slow), and a shape
 * gives the same bits before and after the others (the cut is the shape's
 * alone). */
static void
test_sgemm_chunks(void)
{
  /* m varies (a not transposed), then k (a transposed, b not) */
  const Layout layouts[] = {{FALSE, FALSE, 1.0f, 0.0f},
                            {FALSE, TRUE, 0.5f, -0.75f},
                            {TRUE, FALSE, -2.0f, 0.0f},
                            {TRUE, FALSE, 1.0f, 1.0f}};
  Worst w = {0, 0, 0, 0, 0};
  for (guint l = 0; l < G_N_ELEMENTS(layouts); l++) {
    const Layout *lay = &layouts[l];
    gboolean vary_k = lay->ta;
    Operands first;
    Product p0 = {vary_k ? 64 : 600, 64, vary_k ? 600 : 96, 1};
    operands_init(&first, &p0, lay, 77);
    g_autofree float *c_first = run_product(&first, lay, QKV_PRECISION_BF16, 1);
    guint64 built = qkv_bf16_primitives_built();
    for (gint64 x = 601; x <= 997; x += 9) {
      Product p = {vary_k ? 64 : x, 64, vary_k ? x : 96, 1};
      if (x % 5 == 0) { /* also checked against the exact results */
        check_product(&p, lay, &w);
        continue;
      }
      Operands o;
      operands_init(&o, &p, lay, (guint32)x);
      g_autofree float *c = run_product(&o, lay, QKV_PRECISION_BF16, 1);
      operands_clear(&o);
    }
    built = qkv_bf16_primitives_built() - built;
    g_test_message("ta %d tb %d: 45 values of %s built %" G_GUINT64_FORMAT " primitives", lay->ta,
                   lay->tb, vary_k ? "k" : "m", built);
    if (qkv_bf16_native(NULL))
      g_assert_cmpuint(built, <=, 16);
    g_autofree float *c_again = run_product(&first, lay, QKV_PRECISION_BF16, 1);
    g_assert_cmpmem(c_first, (gsize)(first.m * first.ldc) * sizeof(float), c_again,
                    (gsize)(first.m * first.ldc) * sizeof(float));
    operands_clear(&first);
  }
  /* both cut, on two threads (above 2^24 multiply-adds: rows split in
   * blocks of 64, the second thread's block of m - 64·q rows) */
  for (gint64 k = 100; k <= 400; k += 97) {
    Product p = {1500 + k, 128, k, 2};
    check_product(&p, &layouts[k % 4], &w);
  }
  /* the second thread's block short of 64 rows is rounded up too: m from 65
   * to 127 over two threads (rows split: m ≥ n) gives it 1 to 63 rows, at
   * most 7 shapes (16, 32, 48 and 64 rows into scratch, 16, 32 and 48 into
   * c directly) beside the first thread's 64 */
  guint64 built = qkv_bf16_primitives_built();
  for (gint64 m = 65; m <= 127; m++) {
    Product p = {m, 64, 4096, 2};
    Operands o;
    operands_init(&o, &p, &layouts[0], (guint32)m);
    g_autofree float *c = run_product(&o, &layouts[0], QKV_PRECISION_BF16, 2);
    operands_clear(&o);
  }
  built = qkv_bf16_primitives_built() - built;
  g_test_message("two threads, 63 values of m: %" G_GUINT64_FORMAT " primitives", built);
  if (qkv_bf16_native(NULL))
    g_assert_cmpuint(built, <=, 8);
  g_test_message("worst shares of the bounds: exact from the rounded operands %.3g, exact %.3g, "
                 "fp32 %.3g, native vs emulated %.3g",
                 w.vs_rounded, w.vs_exact, w.vs_fp32, w.vs_other);
}

/* qkv_sgemm_operand_final(): memory the running step may write (its scratch
 * here) is converted afresh for each product, unless the step declared it
 * final; then the first product keeps its copy for the others. The copy
 * goes when a step that writes that memory starts, so new values there are
 * read. Native path only (the emulated one keeps no copies). */
static void
test_operand_final(void)
{
  if (!qkv_bf16_native(NULL)) {
    g_test_skip("bf16 products are emulated here: nothing is cached");
    return;
  }
  enum { N = 128 };
  g_autofree float *scratch = g_new(float, N *N), *b = g_new(float, N *N);
  g_autofree float *c1 = g_new(float, N *N), *c2 = g_new(float, N *N);
  guint32 seed = 5;
  for (gint i = 0; i < N * N; i++)
    scratch[i] = uniform(&seed), b[i] = uniform(&seed);
  QkvKernelCtx step = {
      .op_name = "test", .scratch = scratch, .scratch_size = N * N * sizeof(float)};
  qkv_set_running_precision(QKV_PRECISION_BF16);
  /* a first run sizes the cache (it grows when a run ends) */
  qkv_set_running_step(&step);
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c1, N, 1);
  qkv_set_running_step(NULL);

  qkv_set_running_step(&step);
  guint64 h0 = qkv_bf16_cache_hits();
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c1, N, 1);
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c2, N, 1);
  guint64 h1 = qkv_bf16_cache_hits();
  g_assert_cmpuint(h1 - h0, ==, 1); /* b only: the scratch may change under a copy */
  g_assert_cmpmem(c1, N * N * sizeof(float), c2, N * N * sizeof(float));
  qkv_sgemm_operand_final(scratch, N * N);
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c2, N, 1);
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c2, N, 1);
  guint64 h2 = qkv_bf16_cache_hits();
  g_assert_cmpuint(h2 - h1, ==, 3); /* b twice, the scratch once */
  g_assert_cmpmem(c1, N * N * sizeof(float), c2, N * N * sizeof(float));

  /* the next step writes the scratch: the copy is dropped, the new values read */
  qkv_set_running_step(&step);
  for (gint i = 0; i < N * N; i++)
    scratch[i] = -scratch[i];
  qkv_sgemm(FALSE, FALSE, N, N, N, 1.0f, scratch, N, b, N, 0.0f, c2, N, 1);
  qkv_set_running_step(NULL);
  qkv_set_running_precision(QKV_PRECISION_FP32);
  for (gint i = 0; i < N * N; i++)
    g_assert_cmpfloat(c2[i], ==, -c1[i]); /* bf16 rounding is symmetric */
}

/* ---- running graphs ------------------------------------------------------- */

/* Compile outs of g (inputs "in0", "in1", … bound to inputs) in evaluation
 * mode with the given precision and threads, run once, and copy the
 * outputs into results. */
static void
run_graph(QkvGraph *g, guint n_in, QkvTensor *const *inputs, QkvValue *const *outs, guint n_out,
          QkvPrecision precision, gint threads, QkvTensor **results)
{
  g_autoptr(GError) error = NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.precision = precision;
  o.n_threads = threads;
  o.skip_param_grads = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_out, &o, &error);
  g_assert_no_error(error);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, precision);
  for (guint i = 0; i < n_in; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, inputs[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < n_out; i++)
    results[i] = qkv_tensor_copy(qkv_plan_output(plan, i));
}

static QkvTensor *
uniform_tensor(QkvShape shape, guint32 seed, float lo, float hi)
{
  return qkv_test_uniform(&shape, seed, lo, hi);
}

static QkvValue *
graph_input(QkvGraph *g, guint index, const QkvTensor *t)
{
  g_autofree gchar *name = g_strdup_printf("in%u", index);
  return qkv_test_input(g, name, qkv_tensor_dtype(t), *qkv_tensor_shape(t));
}

/* ---- multi-head attention ------------------------------------------------- */

enum { MHA_B = 2, MHA_NQ = 9, MHA_NK = 11, MHA_DIN = 6, MHA_HEADS = 2, MHA_DH = 8 };
#define MHA_H (MHA_HEADS * MHA_DH)

/* Outputs of the weights path, in the op's order. */
enum { O_OUT, O_WEIGHTS, O_QP, O_KP, O_VP, O_CONCAT, O_N };

/* The op on queries, keys, values, w_q, w_k, w_v, w_o, valid_lens (flash:
 * blocks of 4 queries and 4 keys, so that a row spans several blocks). */
static QkvNode *
build_mha(QkvGraph *g, QkvTensor *const *t, gboolean flash)
{
  QkvValue *in[8];
  for (guint i = 0; i < 8; i++)
    in[i] = graph_input(g, i, t[i]);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "num_heads", g_variant_new_int64(MHA_HEADS));
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(flash));
  g_variant_builder_add(&attrs, "{sv}", "block_q", g_variant_new_int64(flash ? 4 : 0));
  g_variant_builder_add(&attrs, "{sv}", "block_k", g_variant_new_int64(flash ? 4 : 0));
  g_autoptr(GError) error = NULL;
  QkvNode *node =
      qkv_graph_add_node(g, "multi_head_attention", in, 8, g_variant_builder_end(&attrs), &error);
  g_assert_no_error(error);
  return node;
}

static double
at(const QkvTensor *t, gint64 i)
{
  return qkv_tensor_get(t, i);
}

/* bound[b, i, c] = 2u_b Σ_e |x[b, i, e]| |w[c, e]|: how far a projection x wᵀ
 * may move when both operands are rounded (first order). */
static QkvTensor *
projection_bound(const QkvTensor *x, const QkvTensor *w, gint64 rows)
{
  QkvShape shape = QKV_SHAPE(MHA_B, rows, MHA_H);
  QkvTensor *e = qkv_tensor_new(QKV_F32, &shape);
  for (gint64 r = 0; r < MHA_B * rows; r++)
    for (gint64 c = 0; c < MHA_H; c++) {
      double s = 0;
      for (gint64 d = 0; d < MHA_DIN; d++)
        s += fabs(at(x, r * MHA_DIN + d)) * fabs(at(w, c * MHA_DIN + d));
      qkv_tensor_f32(e)[r * MHA_H + c] = (float)(2 * QKV_TEST_U_BF16 * s);
    }
  return e;
}

/* The first-order bounds on how far each intermediate of the op may move in
 * bf16, from the fp32 run's values r[] (see test_mha). */
typedef struct {
  QkvTensor *q, *k, *v, *weights, *concat, *out;
  double max_score; /* the largest bound on a score: the size of the neglected terms */
} MhaBounds;

static void
weights_bound(MhaBounds *e, QkvTensor *const *r)
{
  const double ub = QKV_TEST_U_BF16, scale = 1 / sqrt(MHA_DH);
  e->weights = qkv_tensor_new(QKV_F32, qkv_tensor_shape(r[O_WEIGHTS]));
  e->max_score = 0;
  for (gint64 b = 0; b < MHA_B; b++)
    for (gint64 h = 0; h < MHA_HEADS; h++)
      for (gint64 i = 0; i < MHA_NQ; i++) {
        double es[MHA_NK], mean = 0;
        gint64 row = ((b * MHA_HEADS + h) * MHA_NQ + i) * MHA_NK;
        for (gint64 j = 0; j < MHA_NK; j++) {
          double s = 0;
          for (gint64 t = h * MHA_DH; t < (h + 1) * MHA_DH; t++) {
            gint64 qi = (b * MHA_NQ + i) * MHA_H + t, kj = (b * MHA_NK + j) * MHA_H + t;
            double q = fabs(at(r[O_QP], qi)), k = fabs(at(r[O_KP], kj));
            s += at(e->q, qi) * k + q * at(e->k, kj) + 2 * ub * q * k;
          }
          es[j] = scale * s;
          mean += at(r[O_WEIGHTS], row + j) * es[j];
          e->max_score = fmax(e->max_score, es[j]);
        }
        /* dp_j = p_j (ds_j - Σ_l p_l ds_l) */
        for (gint64 j = 0; j < MHA_NK; j++)
          qkv_tensor_f32(e->weights)[row + j] = (float)(at(r[O_WEIGHTS], row + j) * (es[j] + mean));
      }
}

static void
output_bounds(MhaBounds *e, QkvTensor *const *r, const QkvTensor *w_o)
{
  const double ub = QKV_TEST_U_BF16;
  e->concat = qkv_tensor_new(QKV_F32, qkv_tensor_shape(r[O_CONCAT]));
  e->out = qkv_tensor_new(QKV_F32, qkv_tensor_shape(r[O_OUT]));
  for (gint64 b = 0; b < MHA_B; b++)
    for (gint64 i = 0; i < MHA_NQ; i++)
      for (gint64 c = 0; c < MHA_H; c++) {
        gint64 h = c / MHA_DH, row = ((b * MHA_HEADS + h) * MHA_NQ + i) * MHA_NK;
        double s = 0;
        for (gint64 j = 0; j < MHA_NK; j++) {
          gint64 vj = (b * MHA_NK + j) * MHA_H + c;
          double p = at(r[O_WEIGHTS], row + j), v = fabs(at(r[O_VP], vj));
          s += at(e->weights, row + j) * v + p * at(e->v, vj) + 2 * ub * p * v;
        }
        qkv_tensor_f32(e->concat)[(b * MHA_NQ + i) * MHA_H + c] = (float)s;
      }
  for (gint64 bi = 0; bi < MHA_B * MHA_NQ; bi++)
    for (gint64 o = 0; o < MHA_H; o++) {
      double s = 0;
      for (gint64 c = 0; c < MHA_H; c++) {
        double w = fabs(at(w_o, o * MHA_H + c));
        s += at(e->concat, bi * MHA_H + c) * w + 2 * ub * fabs(at(r[O_CONCAT], bi * MHA_H + c)) * w;
      }
      qkv_tensor_f32(e->out)[bi * MHA_H + o] = (float)s;
    }
}

static void
mha_bounds_clear(MhaBounds *e)
{
  qkv_tensor_free(e->q);
  qkv_tensor_free(e->k);
  qkv_tensor_free(e->v);
  qkv_tensor_free(e->weights);
  qkv_tensor_free(e->concat);
  qkv_tensor_free(e->out);
}

/* |actual - expected| ≤ factor · bound elementwise (bound in absolute
 * terms; qkv_assert_bounded counts in units of u). */
static double
assert_within(const gchar *label, const QkvTensor *actual, const QkvTensor *expected,
              const QkvTensor *bound, double factor)
{
  g_autoptr(QkvTensor) magnitude = qkv_tensor_copy(bound);
  float *m = qkv_tensor_f32(magnitude);
  for (gint64 i = 0; i < qkv_tensor_numel(magnitude); i++)
    m[i] = (float)(m[i] / QKV_TEST_U);
  return qkv_test_assert_bound(__FILE__, __LINE__, label, actual, expected, magnitude, 0, factor);
}

/* The fused multi-head attention op in bf16 against fp32. Every product's
 * two operands are rounded (error u_b each, first order), and the errors
 * propagate (first order, elementwise, from the fp32 run's values):
 *   projections q = x w_qᵀ:   |Δq| ≤ 2u_b |x| |w_q|ᵀ                     (E_q, E_k, E_v)
 *   scores s = q kᵀ/√d_h:     |Δs| ≤ (E_q |k|ᵀ + |q| E_kᵀ + 2u_b |q||k|ᵀ)/√d_h  (E_s)
 *   weights p = softmax(s):   |Δp_j| ≤ p_j (E_s,j + Σ_l p_l E_s,l)       (dp = p(ds - p·ds))
 *   heads o = p v:            |Δo| ≤ E_p |v| + p E_v + 2u_b p |v|
 *   out = concat w_oᵀ:        |Δout| ≤ E_o |w_o|ᵀ + 2u_b |concat| |w_o|ᵀ
 * The terms left out are smaller by a factor of about the largest E_s
 * (second order: e^x - 1 - x ≈ x²/2 in the softmax), asserted below 0.15,
 * and float32's own rounding is 2^-16 times smaller than u_b: the factor
 * 1.25 covers both. Flash attention rounds the unnormalised block weights
 * exp(s - m) before multiplying them with v, while it sums the normaliser
 * from the unrounded ones: the same 2u_b p |v| term, so the same bound; its
 * fp32 result differs from the weights path by float32 rounding only. */
static void
test_mha(void)
{
  QkvTensor *t[8];
  t[0] = uniform_tensor(QKV_SHAPE(MHA_B, MHA_NQ, MHA_DIN), 1, -1, 1);
  t[1] = uniform_tensor(QKV_SHAPE(MHA_B, MHA_NK, MHA_DIN), 2, -1, 1);
  t[2] = uniform_tensor(QKV_SHAPE(MHA_B, MHA_NK, MHA_DIN), 3, -1, 1);
  for (guint i = 0; i < 3; i++)
    t[3 + i] = uniform_tensor(QKV_SHAPE(MHA_H, MHA_DIN), 4 + i, -0.8f, 0.8f);
  t[6] = uniform_tensor(QKV_SHAPE(MHA_H, MHA_H), 7, -0.5f, 0.5f);
  gint32 lens[MHA_B] = {MHA_NK, 6};
  QkvShape lens_shape = QKV_SHAPE(MHA_B);
  t[7] = qkv_tensor_new_i32(&lens_shape, lens);

  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvNode *node = build_mha(g, t, FALSE);
  QkvValue *outs[O_N];
  for (guint i = 0; i < O_N; i++)
    outs[i] = qkv_node_output(node, i);
  QkvTensor *r[O_N], *h[O_N];
  run_graph(g, 8, t, outs, O_N, QKV_PRECISION_FP32, 1, r);
  run_graph(g, 8, t, outs, O_N, QKV_PRECISION_BF16, 1, h);

  MhaBounds e;
  e.q = projection_bound(t[0], t[3], MHA_NQ);
  e.k = projection_bound(t[1], t[4], MHA_NK);
  e.v = projection_bound(t[2], t[5], MHA_NK);
  weights_bound(&e, r);
  output_bounds(&e, r, t[6]);
  g_test_message("largest bound on a score: %.3g", e.max_score);
  g_assert_cmpfloat(e.max_score, <, 0.15);
  const double factor = 1.25;
  assert_within("q_proj", h[O_QP], r[O_QP], e.q, factor);
  assert_within("k_proj", h[O_KP], r[O_KP], e.k, factor);
  assert_within("v_proj", h[O_VP], r[O_VP], e.v, factor);
  assert_within("weights", h[O_WEIGHTS], r[O_WEIGHTS], e.weights, factor);
  assert_within("concat", h[O_CONCAT], r[O_CONCAT], e.concat, factor);
  double used = assert_within("out", h[O_OUT], r[O_OUT], e.out, factor);
  g_test_message("out: %.3g of the bound used", used / factor);

  /* flash, on one and two threads (the heads then run on the pool's workers) */
  g_autoptr(QkvGraph) gf = qkv_graph_new();
  QkvValue *flash_out = qkv_node_output(build_mha(gf, t, TRUE), 0);
  for (gint threads = 1; threads <= 2; threads++) {
    g_autoptr(QkvTensor) f = NULL;
    run_graph(gf, 8, t, &flash_out, 1, QKV_PRECISION_BF16, threads, &f);
    assert_within(threads == 1 ? "flash out" : "flash out, 2 threads", f, r[O_OUT], e.out, factor);
  }
  /* no silent fp32: the bf16 result is off by far more than float32 allows */
  g_assert_false(qkv_test_check_bound(h[O_OUT], r[O_OUT], NULL, 0, 1000, NULL, NULL));

  mha_bounds_clear(&e);
  for (guint i = 0; i < O_N; i++) {
    qkv_tensor_free(r[i]);
    qkv_tensor_free(h[i]);
  }
  for (guint i = 0; i < 8; i++)
    qkv_tensor_free(t[i]);
}

/* ---- a Transformer's training step ----------------------------------------- */

enum { TR_B = 8, TR_T = 16, TR_SRC_VOCAB = 40, TR_TGT_VOCAB = 37 };

typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvPlan *plan;
  QkvTensor *inputs[5];
} Trainer;

static void
trainer_init(Trainer *tr, gint threads)
{
  g_autoptr(GError) error = NULL;
  tr->graph = qkv_graph_new();
  tr->params = qkv_params_new();
  static const gchar *const names[] = {"src", "src_valid", "dec_in", "labels", "mask"};
  QkvShape bt = QKV_SHAPE(TR_B, TR_T), bs = QKV_SHAPE(TR_B);
  QkvValue *v[5];
  for (guint i = 0; i < 5; i++)
    v[i] = qkv_test_input(tr->graph, names[i], i == 4 ? QKV_F32 : QKV_I32, i == 1 ? bs : bt);
  QkvBuilder b = {.graph = tr->graph, .params = tr->params, .seed = 5, .xavier_linear = TRUE};
  QkvTransformerConfig cfg = {.src_vocab = TR_SRC_VOCAB,
                              .tgt_vocab = TR_TGT_VOCAB,
                              .num_hiddens = 64,
                              .ffn_hiddens = 128,
                              .num_heads = 4,
                              .num_layers = 2,
                              .dropout = 0};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, v[0], v[1], &error);
  QkvValue *logits = qkv_build_transformer_decoder(&b, &cfg, v[2], enc, v[1], NULL, &error);
  QkvValue *loss = qkv_build_seq2seq_loss(logits, v[3], v[4], &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(tr->graph, loss, &error));
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = threads;
  tr->plan = qkv_graph_compile(tr->graph, &loss, 1, &o, &error);
  g_assert_no_error(error);
  tr->inputs[0] = qkv_test_randint(&bt, 11, 3, TR_SRC_VOCAB);
  gint32 lens[TR_B] = {TR_T, 5, 3, TR_T, 11, 16, 1, 9};
  tr->inputs[1] = qkv_tensor_new_i32(&bs, lens);
  tr->inputs[2] = qkv_test_randint(&bt, 12, 3, TR_TGT_VOCAB);
  tr->inputs[3] = qkv_test_randint(&bt, 13, 3, TR_TGT_VOCAB);
  tr->inputs[4] = qkv_tensor_new(QKV_F32, &bt);
  for (gint64 i = 0; i < TR_B * TR_T; i++)
    qkv_tensor_f32(tr->inputs[4])[i] = i % TR_T < lens[i / TR_T] ? 1.0f : 0.0f;
  for (guint i = 0; i < 5; i++)
    g_assert_true(qkv_plan_bind(tr->plan, names[i], tr->inputs[i], &error));
}

static void
trainer_clear(Trainer *tr)
{
  for (guint i = 0; i < 5; i++)
    qkv_tensor_free(tr->inputs[i]);
  qkv_plan_free(tr->plan);
  qkv_params_free(tr->params);
  qkv_graph_free(tr->graph);
}

/* One forward and backward pass; the loss, and copies of the gradients. */
static double
trainer_step(Trainer *tr, QkvPrecision precision, QkvTensor **grads)
{
  g_autoptr(GError) error = NULL;
  qkv_plan_set_precision(tr->plan, precision);
  g_assert_true(qkv_plan_run(tr->plan, &error));
  for (guint i = 0; i < qkv_params_size(tr->params); i++)
    grads[i] = qkv_tensor_copy(qkv_param_grad(qkv_params_nth(tr->params, i)));
  return qkv_plan_output_scalar(tr->plan, 0);
}

static double
norm_of_difference(const QkvTensor *a, const QkvTensor *b, double *norm_b)
{
  double d = 0, n = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(a); i++) {
    double x = qkv_tensor_get(a, i), y = qkv_tensor_get(b, i);
    d += (x - y) * (x - y);
    n += y * y;
  }
  *norm_b = sqrt(n);
  return sqrt(d);
}

/* Gradients of one step: per parameter, and the norm over all of them. */
typedef struct {
  guint n;
  QkvTensor **g;
  double loss, norm;
} Step;

static void
step_run(Step *st, Trainer *tr, QkvPrecision precision, gboolean emulate)
{
  st->n = qkv_params_size(tr->params);
  st->g = g_new0(QkvTensor *, st->n);
  qkv_set_bf16_emulation(emulate);
  st->loss = trainer_step(tr, precision, st->g);
  qkv_set_bf16_emulation(FALSE);
  double sq = 0;
  for (guint i = 0; i < st->n; i++) {
    double norm;
    norm_of_difference(st->g[i], st->g[i], &norm);
    sq += norm * norm;
  }
  st->norm = sqrt(sq);
}

static void
step_clear(Step *st)
{
  for (guint i = 0; i < st->n; i++)
    qkv_tensor_free(st->g[i]);
  g_free(st->g);
}

/* max_i |a_i - b_i| / |b| over the parameters, and (in *all) |a - b| / |b|
 * over all of them at once: differences relative to the norm of the whole
 * gradient b, the quantity that clipping and the update see. */
static double
step_difference(const Step *a, const Step *b, const QkvParams *params, double *all,
                const gchar **worst)
{
  double max = 0, sq = 0;
  for (guint i = 0; i < a->n; i++) {
    double norm, d = norm_of_difference(a->g[i], b->g[i], &norm) / b->norm;
    sq += d * d;
    if (d >= max)
      max = d, *worst = qkv_param_name(qkv_params_nth((QkvParams *)params, i));
  }
  *all = sqrt(sq);
  return max;
}

/* The training step of a small Transformer (2 + 2 blocks, d 64, 4 heads,
 * 128 rows: the projections and the FFN take the native path where there
 * is one, the heads' products the emulated one) against fp32: the loss and every
 * parameter's gradient.
 *
 * Bound: a normwise first-order estimate, not a rigorous one. Each product
 * moves its result by at most 2u_b |A||B| (see the top); the forward pass
 * chains P = 2 + 2·3 + 2·5 + 1 = 19 products between the embeddings and the
 * logits on the longest path (an attention is a projection, q kᵀ, p v and
 * the output projection; an FFN two; a decoder block has two attentions).
 * With LayerNorm after every block the activations stay O(1); taking each
 * product's |A||B| within κ = 4 of |AB|, the loss moves by at most about
 * 2u_b·κ·P relative: 152 u_b. A gradient goes through the forward chain
 * and back through as many products again: 2·152 u_b relative to the norm
 * of the whole gradient (one parameter's own gradient can be far more
 * sensitive: the first encoder block's W_q and W_k see scores of tens, the
 * embeddings being scaled by √d, where the softmax turns a relative error
 * of u_b in a score into a large one in its gradient).
 *
 * The native and the emulated bf16 products differ by float32 rounding
 * only, but that can move an operand across a bf16 rounding boundary (with
 * probability about k·2^-16 for a k-term sum, k ≤ 128 here: 2^-9), which
 * then propagates as any bf16 error does. So the two bf16 runs must stay much
 * closer to each other than to fp32; the factor asserted, 1/16, is
 * empirical (an AMX machine shows 0.021: the saturated softmax amplifies a
 * flipped operand more than the average one). So must bf16 on one and two
 * threads (the pool's workers run the heads). Both checks fail if a product
 * fell back to fp32 on one side. */
static void
test_transformer_step(void)
{
  const double ub = QKV_TEST_U_BF16, loss_bound = 152 * ub, grad_bound = 2 * 152 * ub;
  Trainer tr, tr2;
  trainer_init(&tr, 1);
  trainer_init(&tr2, 2);
  Step fp32, bf16, emulated, threads2;
  step_run(&fp32, &tr, QKV_PRECISION_FP32, FALSE);
  step_run(&bf16, &tr, QKV_PRECISION_BF16, FALSE);
  step_run(&emulated, &tr, QKV_PRECISION_BF16, TRUE);
  step_run(&threads2, &tr2, QKV_PRECISION_BF16, FALSE);
  double rel = fabs(bf16.loss - fp32.loss) / fabs(fp32.loss);
  g_test_message("loss fp32 %.9g, bf16 %.9g: %.3g relative, %.3g of the bound", fp32.loss,
                 bf16.loss, rel, rel / loss_bound);
  g_assert_cmpfloat(rel, <=, loss_bound);
  g_assert_cmpfloat(rel, >, 1e-5); /* float32 rounding alone stays far below */

  double all, all_other;
  const gchar *worst;
  double max = step_difference(&bf16, &fp32, tr.params, &all, &worst);
  g_test_message("gradients bf16 vs fp32: %.3g of the whole gradient's norm (%.3g of the bound), "
                 "the most in %s: %.3g",
                 all, all / grad_bound, worst, max);
  g_assert_cmpfloat(all, <=, grad_bound);
  g_assert_cmpfloat(all, >, 1e-5);
  const Step *others[] = {&emulated, &threads2};
  const gchar *labels[] = {"emulated vs native", "2 threads vs 1"};
  for (guint i = 0; i < G_N_ELEMENTS(others); i++) {
    step_difference(others[i], &bf16, tr.params, &all_other, &worst);
    double loss_other = fabs(others[i]->loss - bf16.loss) / fabs(fp32.loss);
    g_test_message("bf16 %s: gradients %.3g, loss %.3g relative (%.3g and %.3g of bf16 vs fp32)",
                   labels[i], all_other, loss_other, all_other / all, loss_other / rel);
    g_assert_cmpfloat(all_other, <=, all / 16);
    g_assert_cmpfloat(loss_other, <=, rel / 16);
  }
  step_clear(&fp32);
  step_clear(&bf16);
  step_clear(&emulated);
  step_clear(&threads2);
  trainer_clear(&tr);
  trainer_clear(&tr2);
}

/* The run's cache of bf16 copies changes nothing: the same step with the
 * cache and without gives the same loss and gradients bit for bit (a stale
 * copy would not), on one thread and two, with and without the backward
 * ops' gathered rows (declared final), and where products run natively it
 * is used (weights and repeated inputs are found in it). */
static void
test_cache(void)
{
  for (gint mode = 0; mode < 4; mode++) {
    gint threads = 1 + mode % 2;
    /* ALWAYS: the backward ops gather nonzero rows and declare them final */
    qkv_set_sparse_backward(mode < 2 ? QKV_SPARSE_BACKWARD_AUTO : QKV_SPARSE_BACKWARD_ALWAYS);
    Trainer tr;
    trainer_init(&tr, threads);
    Step cached, fresh, again;
    guint64 hits = qkv_bf16_cache_hits();
    step_run(&cached, &tr, QKV_PRECISION_BF16, FALSE);
    step_run(&again, &tr, QKV_PRECISION_BF16, FALSE); /* a second run: the cache refilled */
    guint64 used = qkv_bf16_cache_hits() - hits;
    qkv_set_bf16_cache_limit(0);
    step_run(&fresh, &tr, QKV_PRECISION_BF16, FALSE);
    qkv_set_bf16_cache_limit(32);
    g_test_message("%d threads, sparse backward %s: %" G_GUINT64_FORMAT " cache hits in two runs",
                   threads, mode < 2 ? "auto" : "always", used);
    if (qkv_bf16_native(NULL))
      g_assert_cmpuint(used, >, 0);
    g_assert_cmpfloat(cached.loss, ==, fresh.loss);
    g_assert_cmpfloat(again.loss, ==, fresh.loss);
    for (guint i = 0; i < cached.n; i++) {
      g_assert_cmpmem(qkv_tensor_const_data(cached.g[i]), qkv_tensor_nbytes(cached.g[i]),
                      qkv_tensor_const_data(fresh.g[i]), qkv_tensor_nbytes(fresh.g[i]));
      g_assert_cmpmem(qkv_tensor_const_data(again.g[i]), qkv_tensor_nbytes(again.g[i]),
                      qkv_tensor_const_data(fresh.g[i]), qkv_tensor_nbytes(fresh.g[i]));
    }
    step_clear(&cached);
    step_clear(&again);
    step_clear(&fresh);
    trainer_clear(&tr);
  }
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_AUTO);
}

/* ---- the plan API ----------------------------------------------------------- */

static QkvValue *
build_chain(QkvGraph *g, QkvTensor *const *t)
{
  g_autoptr(GError) error = NULL;
  QkvValue *x = graph_input(g, 0, t[0]), *w = graph_input(g, 1, t[1]);
  QkvValue *y = qkv_matmul(x, w, FALSE, TRUE, &error);
  y = qkv_relu(y, &error);
  y = qkv_matmul(y, x, TRUE, FALSE, &error);
  g_assert_no_error(error);
  return y;
}

/* fp32 is the default and stays bit for bit what it was beside bf16 plans
 * (the precision is the running plan's, reset after each run); bf16 runs
 * allocate nothing after the first; an unknown precision is refused. */
static void
test_plan_api(void)
{
  g_autoptr(GError) error = NULL;
  g_assert_cmpint(qkv_plan_options_default().precision, ==, QKV_PRECISION_FP32);
  QkvTensor *t[2] = {uniform_tensor(QKV_SHAPE(96, 80), 21, -1, 1),
                     uniform_tensor(QKV_SHAPE(72, 80), 22, -1, 1)};
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *y = build_chain(g, t);
  g_autoptr(QkvTensor) before = NULL, bf16 = NULL, after = NULL;
  run_graph(g, 2, t, &y, 1, QKV_PRECISION_FP32, 2, &before);
  run_graph(g, 2, t, &y, 1, QKV_PRECISION_BF16, 2, &bf16);
  run_graph(g, 2, t, &y, 1, QKV_PRECISION_FP32, 2, &after);
  g_assert_cmpmem(qkv_tensor_const_data(before), qkv_tensor_nbytes(before),
                  qkv_tensor_const_data(after), qkv_tensor_nbytes(after));
  g_assert_false(qkv_test_check_bound(bf16, before, NULL, 0, 1000, NULL, NULL));
  g_assert_cmpint(qkv_get_running_precision(), ==, QKV_PRECISION_FP32);

  /* a plan switched to bf16 and back */
  QkvPlanOptions o = qkv_plan_options_default();
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &y, 1, &o, &error);
  g_assert_no_error(error);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_FP32);
  g_assert_true(qkv_plan_bind(plan, "in0", t[0], &error) &&
                qkv_plan_bind(plan, "in1", t[1], &error));
  qkv_plan_set_precision(plan, QKV_PRECISION_BF16);
  g_assert_true(qkv_plan_run(plan, &error));
  guint64 allocations = qkv_alloc_count();
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_cmpuint(qkv_alloc_count(), ==, allocations);
  g_assert_cmpmem(qkv_tensor_const_data(qkv_plan_output(plan, 0)), qkv_tensor_nbytes(bf16),
                  qkv_tensor_const_data(bf16), qkv_tensor_nbytes(bf16));
  qkv_plan_set_precision(plan, QKV_PRECISION_FP32);
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_cmpmem(qkv_tensor_const_data(qkv_plan_output(plan, 0)), qkv_tensor_nbytes(before),
                  qkv_tensor_const_data(before), qkv_tensor_nbytes(before));

  o.precision = (QkvPrecision)7;
  QkvPlan *bad = qkv_graph_compile(g, &y, 1, &o, &error);
  g_assert_null(bad);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_test_message("%s", error->message);
  qkv_tensor_free(t[0]);
  qkv_tensor_free(t[1]);
}

static void
record_precision(gint64 begin, gint64 end, gint thread, gpointer data)
{
  gint *seen = data;
  for (gint64 i = begin; i < end; i++)
    g_atomic_int_set(&seen[i], (gint)qkv_get_running_precision());
}

/* A parallel loop's workers run with the precision of the thread that
 * started it, so products inside parallel kernels follow the plan. */
static void
test_pool_precision(void)
{
  for (gint p = QKV_PRECISION_BF16; p >= QKV_PRECISION_FP32; p--) {
    gint seen[2] = {-1, -1};
    qkv_set_running_precision((QkvPrecision)p);
    qkv_parallel_for(2, 2, record_precision, seen);
    qkv_set_running_precision(QKV_PRECISION_FP32);
    g_assert_cmpint(seen[0], ==, p);
    g_assert_cmpint(seen[1], ==, p);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/bf16/rounding", test_rounding);
  g_test_add_func("/bf16/sgemm", test_sgemm);
  g_test_add_func("/bf16/sgemm-empty", test_sgemm_empty);
  g_test_add_func("/bf16/sgemm-chunks", test_sgemm_chunks);
  g_test_add_func("/bf16/operand-final", test_operand_final);
  g_test_add_func("/bf16/pool-precision", test_pool_precision);
  g_test_add_func("/bf16/plan-api", test_plan_api);
  g_test_add_func("/bf16/multi-head-attention", test_mha);
  g_test_add_func("/bf16/transformer-step", test_transformer_step);
  g_test_add_func("/bf16/cache", test_cache);
  return g_test_run();
}
