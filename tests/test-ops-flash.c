/* test-ops-flash.c: the memory-efficient ("flash") kernels of
 * "dot_product_attention" and "multi_head_attention".
 *
 * For every mask (none, valid lengths per batch or per query with empty
 * rows, causal, boolean and additive masks, and their combinations), for
 * one to three heads, dropout, and lengths that are not multiples of the
 * blocks: the flash kernels against the weights path (values and every
 * gradient, within a bound derived below), finite differences, thread
 * counts, that the typed builders pick the kernel when no weights are asked
 * for, and that a plan then holds no O(T²) buffer.
 */
#include "test-util.h"

#include <math.h>
#include <string.h>

typedef enum { OP_DOT, OP_MHA } Op;
typedef enum { LENS_NONE, LENS_BATCH, LENS_QUERY } Lens;
typedef enum { MASK_NONE, MASK_BOOLEAN, MASK_ADDITIVE } Mask;

typedef struct {
  Op op;
  gint heads; /* OP_MHA */
  gint64 batch, n_q, n_k, d, d_v;
  gboolean causal;
  Lens lens;
  Mask mask;
  double dropout;
  gint64 block_q, block_k; /* the flash blocks (0: default) */
  gboolean flash;          /* set by the runs */
  gboolean moderate_mask;  /* no -1e9 in an additive mask (finite differences) */
} Spec;

static const gchar *
mask_kind_name(Mask m)
{
  return m == MASK_BOOLEAN ? "boolean" : m == MASK_ADDITIVE ? "additive" : "none";
}

/* Inputs: q, k, v (dot) or queries, keys, values, w_q, w_k, w_v, w_o (mha),
 * then valid_lens, then the mask. */
static guint
n_fixed(const Spec *s)
{
  return s->op == OP_DOT ? 3 : 7;
}

static QkvValue *
build(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Spec *s = user_data;
  guint n = n_fixed(s) + (s->lens != LENS_NONE) + (s->mask != MASK_NONE);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  if (s->op == OP_MHA)
    g_variant_builder_add(&attrs, "{sv}", "num_heads", g_variant_new_int64(s->heads));
  g_variant_builder_add(&attrs, "{sv}", "causal", g_variant_new_boolean(s->causal));
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(s->dropout));
  g_variant_builder_add(&attrs, "{sv}", "mask_kind", g_variant_new_string(mask_kind_name(s->mask)));
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(s->flash));
  g_variant_builder_add(&attrs, "{sv}", "block_q", g_variant_new_int64(s->block_q));
  g_variant_builder_add(&attrs, "{sv}", "block_k", g_variant_new_int64(s->block_k));
  QkvNode *node =
      qkv_graph_add_node(graph, s->op == OP_DOT ? "dot_product_attention" : "multi_head_attention",
                         in, n, g_variant_builder_end(&attrs), error);
  return node != NULL ? qkv_node_output(node, 0) : NULL;
}

/* The inputs of a spec, from fixed seeds. Valid lengths include 0 (a row
 * without keys: uniform weights) and lengths past n_k; the boolean mask
 * drops about a third of the scores and every score of one query row; the
 * additive mask has values in [-3, 1) and a -1e9 (masked by value). */
static QkvTensor *
uniform(QkvShape shape, guint32 seed, float lo, float hi)
{
  return qkv_test_uniform(&shape, seed, lo, hi);
}

static QkvTensor *
ints(QkvShape shape, const gint32 *v)
{
  return qkv_tensor_new_i32(&shape, v);
}

static guint
make_inputs(const Spec *s, QkvTensor **t)
{
  guint n = 0;
  gint64 B = s->batch, H = s->op == OP_MHA ? s->heads : 1;
  if (s->op == OP_DOT) {
    t[n++] = uniform(QKV_SHAPE(B, s->n_q, s->d), 1, -1, 1);
    t[n++] = uniform(QKV_SHAPE(B, s->n_k, s->d), 2, -1, 1);
    t[n++] = uniform(QKV_SHAPE(B, s->n_k, s->d_v), 3, -1, 1);
  } else {
    gint64 hidden = s->d * H, d_in = 5;
    t[n++] = uniform(QKV_SHAPE(B, s->n_q, d_in), 1, -1, 1);
    t[n++] = uniform(QKV_SHAPE(B, s->n_k, d_in), 2, -1, 1);
    t[n++] = uniform(QKV_SHAPE(B, s->n_k, d_in), 3, -1, 1);
    for (guint i = 0; i < 3; i++)
      t[n++] = uniform(QKV_SHAPE(hidden, d_in), 4 + i, -0.8f, 0.8f);
    t[n++] = uniform(QKV_SHAPE(hidden, hidden), 7, -0.5f, 0.5f);
  }
  if (s->lens == LENS_BATCH) {
    gint32 *v = g_new(gint32, B);
    for (gint64 b = 0; b < B; b++)
      v[b] = (gint32)(b == 0 ? s->n_k - 3 : b == 1 ? 0 : s->n_k + 2);
    t[n++] = ints(QKV_SHAPE(B), v);
    g_free(v);
  } else if (s->lens == LENS_QUERY) {
    gint32 *v = g_new(gint32, B * s->n_q);
    for (gint64 i = 0; i < B * s->n_q; i++)
      v[i] = (gint32)((i * 7) % (s->n_k + 3)); /* 0 … n_k + 2 */
    t[n++] = ints(QKV_SHAPE(B, s->n_q), v);
    g_free(v);
  }
  if (s->mask != MASK_NONE) {
    /* one mask per batch element and head for dot, shared by the heads
     * (rank 3) for mha */
    QkvShape ms = QKV_SHAPE(B, s->n_q, s->n_k);
    QkvTensor *m = qkv_test_uniform(&ms, 11, -3, 1);
    float *x = qkv_tensor_data(m);
    for (gint64 i = 0; i < qkv_shape_numel(&ms); i++) {
      gint64 row = i / s->n_k;
      if (s->mask == MASK_BOOLEAN)
        x[i] = (row % s->n_q == 2 || x[i] < -1.7f) ? 0.0f : 1.0f;
      else if (i % 13 == 5 && !s->moderate_mask)
        x[i] = -1e9f;
    }
    t[n++] = m;
  }
  return n;
}

static void
free_inputs(guint n, QkvTensor **t)
{
  for (guint i = 0; i < n; i++)
    qkv_tensor_free(t[i]);
}

/* out and d sum(out · w) / d input i (w uniform, fixed seed), in a plan
 * compiled for training (dropout active, seed 5) with n_threads. */
static QkvTensor *
run(const Spec *s, guint n, QkvTensor *const *t, gint n_threads, QkvTensor **grads)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *in[16];
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    in[i] = qkv_test_input(g, name, qkv_tensor_dtype(t[i]), *qkv_tensor_shape(t[i]));
    if (qkv_tensor_dtype(t[i]) == QKV_F32)
      qkv_value_set_requires_grad(in[i], TRUE);
  }
  QkvValue *out = build(g, in, (gpointer)s, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) w = qkv_test_uniform(qkv_value_shape(out), 99, -1, 1);
  QkvValue *loss =
      qkv_sum(qkv_mul(out, qkv_graph_constant(g, w, &error), &error), NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvValue *outs[17] = {out};
  guint n_outs = 1;
  gint slot[16];
  for (guint i = 0; i < n; i++) {
    QkvValue *gv = qkv_graph_gradient(g, in[i]);
    slot[i] = gv != NULL ? (gint)n_outs : -1;
    if (gv != NULL)
      outs[n_outs++] = gv;
  }
  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  opts.seed = 5;
  opts.n_threads = n_threads;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, n_outs, &opts, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    g_assert_true(qkv_plan_bind(plan, name, t[i], &error));
  }
  g_assert_true(qkv_plan_run(plan, &error));
  for (guint i = 0; i < n; i++)
    grads[i] = qkv_tensor_dtype(t[i]) != QKV_F32 ? NULL
               : slot[i] >= 0 ? qkv_tensor_copy(qkv_plan_output(plan, (guint)slot[i]))
                              : qkv_tensor_new(QKV_F32, qkv_tensor_shape(t[i]));
  return qkv_tensor_copy(qkv_plan_output(plan, 0));
}

/* ---- the bound --------------------------------------------------------------
 *
 * Flash and the weights path compute the same values by the same formulas
 * with the sums split differently, so (tests/test-util.h, and the attention
 * suite's dot_factor and mha_factor, whose path lengths these are) they
 * differ by at most 2 × (the summed lengths of the sums on a value's path) ×
 * u × the tensor's scale. On the path of either: the scores (d terms), the
 * softmax and weights · v (2 n_k), four roundings for exp and the division;
 * backward dP (d_v), the softmax's row dot and dS · k (2 n_k), four more,
 * and dv, dk (n_q, or for mha's weight gradients batch × n rows). Flash adds
 * per key block one rescale of the running sum and one of the output rows
 * (2 ⌈n_k / block_k⌉), and in the backward each weight comes from exp(s −
 * lse) with lse = m + log l: a few more roundings of a number of the
 * scores' size (8). MHA adds its projections (d_in and hidden terms, both
 * ways). */
static double
flash_factor(const Spec *s)
{
  gint64 bk = s->block_k > 0 ? s->block_k : 128;
  double blocks = 2.0 * (double)((s->n_k + bk - 1) / bk) + 8;
  double rows = s->op == OP_DOT ? s->n_q : s->batch * MAX(s->n_q, s->n_k);
  double path = s->d + 2 * s->n_k + 4 + s->d_v + 2 * s->n_k + 4 + rows + blocks;
  if (s->op == OP_MHA)
    path += 2 * (5 + s->d * s->heads) + s->d_v;
  return 2.0 * path;
}

/* Flash against the weights path: out and every gradient. */
static void
check_against_weights(const gchar *label, Spec s)
{
  QkvTensor *t[16], *gf[16], *gw[16];
  guint n = make_inputs(&s, t);
  s.flash = TRUE;
  g_autoptr(QkvTensor) out_f = run(&s, n, t, 2, gf);
  s.flash = FALSE;
  g_autoptr(QkvTensor) out_w = run(&s, n, t, 1, gw);
  double factor = flash_factor(&s);
  g_autofree gchar *lo = g_strdup_printf("%s: out", label);
  double worst = qkv_assert_scaled(lo, out_f, out_w, factor);
  for (guint i = 0; i < n; i++) {
    if (gf[i] == NULL)
      continue;
    g_autofree gchar *li = g_strdup_printf("%s: gradient of input %u", label, i);
    /* an element of a gradient that vanishes identically (the additive mask
     * at masked scores) is judged on the scale of the others */
    worst = fmax(worst, qkv_assert_scaled(li, gf[i], gw[i], factor));
    qkv_tensor_free(gf[i]);
    qkv_tensor_free(gw[i]);
  }
  g_test_message("%s: flash vs weights path, factor needed %.3g of %g", label, worst, factor);
  free_inputs(n, t);
}

static const struct {
  const gchar *name;
  gboolean causal;
  Lens lens;
  Mask mask;
} mask_cases[] = {
    {"none", FALSE, LENS_NONE, MASK_NONE},
    {"lens-batch", FALSE, LENS_BATCH, MASK_NONE},
    {"lens-query", FALSE, LENS_QUERY, MASK_NONE},
    {"causal", TRUE, LENS_NONE, MASK_NONE},
    {"causal-lens", TRUE, LENS_QUERY, MASK_NONE},
    {"boolean", FALSE, LENS_NONE, MASK_BOOLEAN},
    {"boolean-lens-causal", TRUE, LENS_BATCH, MASK_BOOLEAN},
    {"additive", FALSE, LENS_NONE, MASK_ADDITIVE},
    {"additive-lens", FALSE, LENS_QUERY, MASK_ADDITIVE},
    {"additive-causal", TRUE, LENS_NONE, MASK_ADDITIVE},
};

/* Every mask, with blocks that divide neither length (8 × 16 on 29 × 37)
 * and with one block (the default 128). */
static void
test_dot_masks(void)
{
  for (guint c = 0; c < G_N_ELEMENTS(mask_cases); c++)
    for (gint64 blk = 0; blk < 2; blk++) {
      Spec s = {.op = OP_DOT, .batch = 3, .n_q = 29, .n_k = 37, .d = 8, .d_v = 6};
      s.causal = mask_cases[c].causal;
      s.lens = mask_cases[c].lens;
      s.mask = mask_cases[c].mask;
      s.block_q = blk ? 8 : 0;
      s.block_k = blk ? 16 : 0;
      g_autofree gchar *label =
          g_strdup_printf("dot %s blocks %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT,
                          mask_cases[c].name, s.block_q, s.block_k);
      check_against_weights(label, s);
    }
}

static void
test_mha_masks(void)
{
  for (guint c = 0; c < G_N_ELEMENTS(mask_cases); c++)
    for (gint heads = 1; heads <= 3; heads++) {
      Spec s = {.op = OP_MHA, .heads = heads, .batch = 2, .n_q = 21, .n_k = 19, .d = 4, .d_v = 4};
      s.causal = mask_cases[c].causal;
      s.lens = mask_cases[c].lens;
      s.mask = mask_cases[c].mask;
      s.block_q = 8;
      s.block_k = 5;
      g_autofree gchar *label = g_strdup_printf("mha %s heads %d", mask_cases[c].name, heads);
      check_against_weights(label, s);
    }
}

/* Dropout on the weights: the flash kernels draw the same mask again from
 * the key (a different draw would differ by O(1), far past the bound), in
 * the forward and in the backward. */
static void
test_dropout(void)
{
  for (guint c = 0; c < G_N_ELEMENTS(mask_cases); c += 3) {
    Spec s = {.op = OP_DOT, .batch = 2, .n_q = 17, .n_k = 23, .d = 8, .d_v = 8, .dropout = 0.3};
    s.causal = mask_cases[c].causal;
    s.lens = mask_cases[c].lens;
    s.mask = mask_cases[c].mask;
    s.block_q = 4;
    s.block_k = 8;
    g_autofree gchar *label = g_strdup_printf("dot dropout %s", mask_cases[c].name);
    check_against_weights(label, s);
    Spec m = {.op = OP_MHA, .heads = 2, .batch = 2, .n_q = 13, .n_k = 11, .d = 4, .d_v = 4};
    m.dropout = 0.4;
    m.causal = s.causal;
    m.lens = s.lens;
    m.mask = s.mask;
    m.block_q = 4;
    m.block_k = 3;
    g_autofree gchar *ml = g_strdup_printf("mha dropout %s", mask_cases[c].name);
    check_against_weights(ml, m);
  }
}

/* Finite differences through the flash kernels themselves, the additive
 * mask's gradient included. */
static void
test_gradcheck(void)
{
  static const guint cases[] = {0, 2, 4, 6, 9};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    const gchar *name = mask_cases[cases[c]].name;
    Spec s = {.op = OP_DOT, .batch = 2, .n_q = 7, .n_k = 9, .d = 3, .d_v = 2, .flash = TRUE};
    s.causal = mask_cases[cases[c]].causal;
    s.lens = mask_cases[cases[c]].lens;
    s.mask = mask_cases[cases[c]].mask;
    s.block_q = 3;
    s.block_k = 4;
    s.moderate_mask = TRUE;
    QkvTensor *t[16];
    guint n = make_inputs(&s, t);
    g_autofree gchar *label = g_strdup_printf("flash dot %s", name);
    qkv_test_gradcheck(label, n, t, NULL, build, &s);
    free_inputs(n, t);
    Spec m = s;
    m.op = OP_MHA;
    m.heads = 2;
    m.d = m.d_v = 2;
    m.block_k = 2;
    n = make_inputs(&m, t);
    g_autofree gchar *ml = g_strdup_printf("flash mha %s", name);
    qkv_test_gradcheck(ml, n, t, NULL, build, &m);
    free_inputs(n, t);
  }
}

/* One problem (batch 1, one head) over two threads splits the query blocks
 * of the forward and the key blocks of the backward; many problems split
 * the problems. Both within the bound of the serial run. */
static void
test_threads(void)
{
  Spec specs[] = {
      {.op = OP_DOT, .batch = 1, .n_q = 150, .n_k = 170, .d = 16, .d_v = 16, .causal = TRUE},
      {.op = OP_MHA, .heads = 3, .batch = 2, .n_q = 90, .n_k = 90, .d = 8, .d_v = 8},
  };
  for (guint c = 0; c < G_N_ELEMENTS(specs); c++) {
    Spec s = specs[c];
    s.block_q = 16;
    s.block_k = 24;
    s.lens = LENS_QUERY;
    s.flash = TRUE;
    QkvTensor *t[16], *g1[16], *g2[16];
    guint n = make_inputs(&s, t);
    g_autoptr(QkvTensor) o1 = run(&s, n, t, 1, g1);
    g_autoptr(QkvTensor) o2 = run(&s, n, t, 2, g2);
    double factor = flash_factor(&s);
    qkv_assert_scaled("threads: out", o2, o1, factor);
    for (guint i = 0; i < n; i++)
      if (g1[i] != NULL) {
        g_autofree gchar *li = g_strdup_printf("threads %u: gradient of input %u", c, i);
        qkv_assert_scaled(li, g2[i], g1[i], factor);
        qkv_tensor_free(g1[i]);
        qkv_tensor_free(g2[i]);
      }
    free_inputs(n, t);
  }
}

/* The typed builders take the flash kernel exactly when no weights are
 * asked for, and a training plan of multi-head attention then holds no
 * buffer of T² floats: at T = 1024 the weights alone would be 4 MiB a head. */
static void
test_builder_memory(void)
{
  const gint64 T = 1024, hidden = 16;
  const gint heads = 2;
  gsize arena[2];
  for (gint want_weights = 0; want_weights < 2; want_weights++) {
    g_autoptr(GError) error = NULL;
    g_autoptr(QkvGraph) g = qkv_graph_new();
    QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(1, T, hidden));
    QkvValue *w[4];
    for (guint i = 0; i < 4; i++) {
      g_autofree gchar *name = g_strdup_printf("w%u", i);
      w[i] = qkv_test_input(g, name, QKV_F32, QKV_SHAPE(hidden, hidden));
      qkv_value_set_requires_grad(w[i], TRUE);
    }
    QkvValue *weights = NULL;
    QkvValue *out = qkv_multi_head_attention(x, x, x, w[0], w[1], w[2], w[3], NULL, heads, NULL,
                                             TRUE, 0.1, want_weights ? &weights : NULL, &error);
    g_assert_no_error(error);
    QkvValue *loss = qkv_sum(out, NULL, 0, FALSE, &error);
    g_assert_true(qkv_graph_backward(g, loss, &error));
    QkvValue *outs[5] = {loss};
    for (guint i = 0; i < 4; i++)
      outs[1 + i] = qkv_graph_gradient(g, w[i]);
    QkvPlanOptions opts = qkv_plan_options_default();
    opts.training = TRUE;
    g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 5, &opts, &error);
    g_assert_no_error(error);
    arena[want_weights] = qkv_plan_arena_size(plan);
    g_test_message("mha T=%" G_GINT64_FORMAT " %s weights: arena %" G_GSIZE_FORMAT " bytes", T,
                   want_weights ? "with" : "without", arena[want_weights]);
  }
  gsize square = (gsize)(T * T) * sizeof(float);
  g_assert_cmpuint(arena[0], <, square);
  g_assert_cmpuint(arena[1], >=, (gsize)heads * square);
}

/* A flash backward node refuses a gradient of the weights (there are none)
 * and a missing dout, and the block sizes must not be negative. */
static void
test_bad(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *q = qkv_test_input(g, "q", QKV_F32, QKV_SHAPE(2, 5, 4));
  QkvValue *lse = qkv_test_input(g, "lse", QKV_F32, QKV_SHAPE(2, 5, 2));
  QkvValue *wts = qkv_test_input(g, "w", QKV_F32, QKV_SHAPE(2, 5, 5));
  QkvValue *in[] = {q, q, q, lse, q, q, wts};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  g_variant_builder_add(&attrs, "{sv}", "grad_weights", g_variant_new_boolean(TRUE));
  GError *error = NULL;
  g_assert_null(qkv_graph_add_node(g, "dot_product_attention_backward", in, 7,
                                   g_variant_builder_end(&attrs), &error));
  g_assert_nonnull(error);
  g_test_message("%s", error->message);
  g_clear_error(&error);
  /* the weights path's weights where flash wants the row statistics */
  QkvValue *in2[] = {q, q, q, wts, q, q};
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  g_assert_null(qkv_graph_add_node(g, "dot_product_attention_backward", in2, 6,
                                   g_variant_builder_end(&attrs), &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_test_message("%s", error->message);
  g_clear_error(&error);
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "flash", g_variant_new_boolean(TRUE));
  g_variant_builder_add(&attrs, "{sv}", "block_k", g_variant_new_int64(-4));
  g_assert_null(
      qkv_graph_add_node(g, "dot_product_attention", in, 3, g_variant_builder_end(&attrs), &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE);
  g_test_message("%s", error->message);
  g_clear_error(&error);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/flash/dot-masks", test_dot_masks);
  g_test_add_func("/flash/mha-masks", test_mha_masks);
  g_test_add_func("/flash/dropout", test_dropout);
  g_test_add_func("/flash/gradcheck", test_gradcheck);
  g_test_add_func("/flash/threads", test_threads);
  g_test_add_func("/flash/builder-memory", test_builder_memory);
  g_test_add_func("/flash/bad", test_bad);
  return g_test_run();
}
