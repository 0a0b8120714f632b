/* test-bf16-activations.c: activations stored as bfloat16
 * (QkvPlanOptions.bf16_activations) and the products that read them
 * (qkv_sgemm_typed()).
 *
 * The claim is exactness, not a bound: a product rounds its operands to
 * bf16 in bf16 precision, so an activation that only feeds products may be
 * stored rounded without changing a bit. So:
 * - qkv_sgemm_typed() with one or both operands stored as bf16 gives, in
 *   bf16 precision, the bits qkv_sgemm() gives on the floats they were
 *   rounded from (every layout, m and k that the native path pads and that
 *   it does not, small products, strided operands, one and two threads,
 *   native and emulated); in fp32, the bits of qkv_sgemm() on the widened
 *   values;
 * - a Transformer's training step in bf16 gives the same loss and the same
 *   gradients bit for bit with bf16 activations as without, on one thread
 *   and two, with the backward's zero-row skipping on and off, and its
 *   arena holds the FFN hidden layers in half the bytes;
 * - the plan API refuses what would mix the two: bf16 activations in an
 *   fp32 plan, and switching such a plan to fp32; a value the caller asks
 *   for stays float32.
 *
 * Linked with the library's objects (as test-bf16) for the running
 * precision and the forced emulation; runs as detected and with
 * QKV_VEC_ISA=avx2 (emulated). */
#include "test-util.h"

#include "kernels/kernels-private.h"

#include <string.h>

/* ---- qkv_sgemm_typed() ------------------------------------------------------ */

typedef struct {
  gint64 m, n, k;
} Dims;

static void
fill(float *x, gint64 n, guint32 seed)
{
  for (gint64 i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) * (1.0f / 8388608.0f) - 1.0f;
  }
}

/* Before each product, NaN bytes in the conversion and widening buffers
 * (the calling thread's: the copies and widenings are made there), so that
 * a copy or a widening that leaves part of an operand out cannot pass on
 * what an earlier product of the same operand left there. */
static void
scrub_scratch(void)
{
  qkv_bf16_poison_scratch();
}

/* c = op(a)·op(b) + 0.5 c0 through qkv_sgemm() on floats, or through
 * qkv_sgemm_typed() on the given storage of the same operands. */
static float *
product(gboolean ta, gboolean tb, const Dims *d, gconstpointer a, QkvDType at, gint64 lda,
        gconstpointer b, QkvDType bt, gint64 ldb, const float *c0, QkvPrecision precision,
        gint threads)
{
  scrub_scratch();
  float *c = g_memdup2(c0, (gsize)(d->m * d->n) * sizeof(float));
  qkv_set_running_precision(precision);
  if (at == QKV_F32 && bt == QKV_F32)
    qkv_sgemm(ta, tb, d->m, d->n, d->k, 1.0f, a, lda, b, ldb, 0.5f, c, d->n, threads);
  else
    qkv_sgemm_typed(ta, tb, d->m, d->n, d->k, 1.0f, a, at, lda, b, bt, ldb, 0.5f, c, d->n, threads);
  qkv_set_running_precision(QKV_PRECISION_FP32);
  return c;
}

/* One product in every storage of its operands, against float storage. */
static void
check_typed(gboolean ta, gboolean tb, const Dims *d, gint64 pad, gint threads, guint32 seed)
{
  gint64 a_rows = ta ? d->k : d->m, a_cols = ta ? d->m : d->k;
  gint64 b_rows = tb ? d->n : d->k, b_cols = tb ? d->k : d->n;
  gint64 lda = a_cols + pad, ldb = b_cols + pad;
  const gint64 a_size = a_rows * lda, b_size = b_rows * ldb, c_size = d->m * d->n;
  g_autofree float *a = g_new(float, a_size), *b = g_new(float, b_size);
  g_autofree float *c0 = g_new(float, c_size);
  fill(a, a_size, seed);
  fill(b, b_size, seed + 1);
  fill(c0, c_size, seed + 2);
  /* the bf16 storage, and the floats it stands for */
  g_autofree guint16 *a16 = g_new(guint16, a_size), *b16 = g_new(guint16, b_size);
  g_autofree float *aw = g_new(float, a_size), *bw = g_new(float, b_size);
  qkv_bf16_from_floats(a16, a, (gsize)a_size);
  qkv_bf16_from_floats(b16, b, (gsize)b_size);
  qkv_bf16_to_floats(aw, a16, (gsize)a_size);
  qkv_bf16_to_floats(bw, b16, (gsize)b_size);
  /* fp32 widens a bf16 operand into dense rows: the float32 reference reads
   * that layout too, since a float32 backend's sums may follow the layout */
  const gint64 a_dense = a_rows * a_cols, b_dense = b_rows * b_cols;
  g_autofree float *ad = g_new(float, a_dense), *bd = g_new(float, b_dense);
  for (gint64 r = 0; r < a_rows; r++)
    memcpy(ad + r * a_cols, aw + r * lda, (gsize)a_cols * sizeof(float));
  for (gint64 r = 0; r < b_rows; r++)
    memcpy(bd + r * b_cols, bw + r * ldb, (gsize)b_cols * sizeof(float));
  gsize bytes = (gsize)(d->m * d->n) * sizeof(float);
  for (gint emulate = 0; emulate < 2; emulate++) {
    qkv_set_bf16_emulation(emulate);
    g_autofree float *want =
        product(ta, tb, d, a, QKV_F32, lda, b, QKV_F32, ldb, c0, QKV_PRECISION_BF16, threads);
    for (gint which = 1; which < 4; which++) {
      g_autofree float *want32 = product(ta, tb, d, which & 1 ? ad : aw, QKV_F32,
                                         which & 1 ? a_cols : lda, which & 2 ? bd : bw, QKV_F32,
                                         which & 2 ? b_cols : ldb, c0, QKV_PRECISION_FP32, threads);
      QkvDType at = which & 1 ? QKV_BF16 : QKV_F32, bt = which & 2 ? QKV_BF16 : QKV_F32;
      gconstpointer ap = which & 1 ? (gconstpointer)a16 : a,
                    bp = which & 2 ? (gconstpointer)b16 : b;
      g_autofree float *got =
          product(ta, tb, d, ap, at, lda, bp, bt, ldb, c0, QKV_PRECISION_BF16, threads);
      /* fp32: the widened values (a float operand here is the widened one) */
      gconstpointer ap32 = which & 1 ? (gconstpointer)a16 : aw;
      gconstpointer bp32 = which & 2 ? (gconstpointer)b16 : bw;
      g_autofree float *got32 =
          product(ta, tb, d, ap32, at, lda, bp32, bt, ldb, c0, QKV_PRECISION_FP32, threads);
      if (memcmp(got, want, bytes) != 0 || memcmp(got32, want32, bytes) != 0)
        g_error("%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT
                " ta %d tb %d pad %" G_GINT64_FORMAT " %d threads, emulated %d, a %s b %s: "
                "bf16 %s, fp32 %s",
                d->m, d->n, d->k, ta, tb, pad, threads, emulate, qkv_dtype_name(at),
                qkv_dtype_name(bt), memcmp(got, want, bytes) ? "differs" : "same",
                memcmp(got32, want32, bytes) ? "differs" : "same");
    }
  }
  qkv_set_bf16_emulation(FALSE);
}

static void
test_sgemm_typed(void)
{
  /* small (the small-product kernel, odd k and column tails included), m
   * and k that are padded (65, 100, 1000) and that are not (64, 128, 256),
   * and one that the pool splits */
  static const Dims dims[] = {{8, 8, 8},      {32, 32, 32},    {9, 17, 13},    {31, 50, 33},
                              {100, 64, 70},  {128, 256, 64},  {65, 96, 1000}, {256, 200, 128},
                              {1000, 64, 40}, {512, 512, 256}, {300, 257, 129}};
  guint checked = 0;
  for (guint i = 0; i < G_N_ELEMENTS(dims); i++)
    for (gint layout = 0; layout < 4; layout++)
      for (gint64 pad = 0; pad <= 3; pad += 3) {
        gint threads = 1 + (gint)((i + (guint)layout) % 2);
        check_typed(layout & 1, layout >> 1, &dims[i], pad, threads, 17u * i + (guint)layout);
        checked++;
      }
  g_test_message("%u products, bf16 natively: %s", checked, qkv_bf16_native(NULL) ? "yes" : "no");
  /* where products can run natively, the native route was among those checked */
  if (qkv_bf16_native(NULL))
    g_assert_cmpuint(qkv_bf16_primitives_built(), >, 0);
}

/* k = 0 only scales c; m or n = 0 leaves it; a dtype that is not f32 or
 * bf16 is refused with a critical and c untouched. */
static void
test_sgemm_typed_edges(void)
{
  float c[4] = {1, 2, 3, 4}, want[4] = {0.5f, 1, 1.5f, 2};
  guint16 a16[4] = {0};
  qkv_set_running_precision(QKV_PRECISION_BF16);
  qkv_sgemm_typed(FALSE, FALSE, 2, 2, 0, 1.0f, a16, QKV_BF16, 1, a16, QKV_BF16, 2, 0.5f, c, 2, 1);
  g_assert_cmpmem(c, sizeof c, want, sizeof want);
  qkv_sgemm_typed(FALSE, FALSE, 0, 2, 2, 1.0f, a16, QKV_BF16, 2, a16, QKV_BF16, 2, 0.5f, c, 2, 1);
  g_assert_cmpmem(c, sizeof c, want, sizeof want);
  if (g_test_undefined()) {
    g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*a_dtype == QKV_F32*");
    qkv_sgemm_typed(FALSE, FALSE, 2, 2, 2, 1.0f, a16, QKV_I32, 2, a16, QKV_BF16, 2, 0.0f, c, 2, 1);
    g_test_assert_expected_messages();
    g_assert_cmpmem(c, sizeof c, want, sizeof want);
  }
  qkv_set_running_precision(QKV_PRECISION_FP32);
}

/* ---- a Transformer's training step ----------------------------------------- */

#define B 8
#define T 16
#define VOCAB 40
#define HIDDEN 64
#define FFN 128
#define LAYERS 2

typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvValue *loss;
  QkvTensor *inputs[5];
} Model;

static const gchar *const input_names[] = {"src", "src_valid", "dec_in", "labels", "mask"};

static void
model_init(Model *m)
{
  g_autoptr(GError) error = NULL;
  m->graph = qkv_graph_new();
  m->params = qkv_params_new();
  QkvShape bt = QKV_SHAPE(B, T), bs = QKV_SHAPE(B);
  QkvValue *v[5];
  for (guint i = 0; i < 5; i++)
    v[i] = qkv_test_input(m->graph, input_names[i], i == 4 ? QKV_F32 : QKV_I32, i == 1 ? bs : bt);
  QkvBuilder b = {.graph = m->graph, .params = m->params, .seed = 3, .xavier_linear = TRUE};
  QkvTransformerConfig cfg = {.src_vocab = VOCAB,
                              .tgt_vocab = VOCAB,
                              .num_hiddens = HIDDEN,
                              .ffn_hiddens = FFN,
                              .num_heads = 4,
                              .num_layers = LAYERS,
                              .dropout = 0};
  QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, v[0], v[1], &error);
  QkvValue *logits = qkv_build_transformer_decoder(&b, &cfg, v[2], enc, v[1], NULL, &error);
  m->loss = qkv_build_seq2seq_loss(logits, v[3], v[4], &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(m->graph, m->loss, &error));
  m->inputs[0] = qkv_test_randint(&bt, 21, 3, VOCAB);
  gint32 lens[B] = {T, 5, 3, T, 11, 16, 1, 9};
  m->inputs[1] = qkv_tensor_new_i32(&bs, lens);
  m->inputs[2] = qkv_test_randint(&bt, 22, 3, VOCAB);
  m->inputs[3] = qkv_test_randint(&bt, 23, 3, VOCAB);
  m->inputs[4] = qkv_tensor_new(QKV_F32, &bt);
  for (gint64 i = 0; i < B * T; i++)
    qkv_tensor_f32(m->inputs[4])[i] = i % T < lens[i / T] ? 1.0f : 0.0f;
}

static void
model_clear(Model *m)
{
  for (guint i = 0; i < 5; i++)
    qkv_tensor_free(m->inputs[i]);
  qkv_params_free(m->params);
  qkv_graph_free(m->graph);
}

static QkvPlan *
model_plan(Model *m, gint threads, gboolean bf16_activations)
{
  g_autoptr(GError) error = NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = threads;
  o.precision = QKV_PRECISION_BF16;
  o.bf16_activations = bf16_activations;
  QkvPlan *plan = qkv_graph_compile(m->graph, &m->loss, 1, &o, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < 5; i++)
    g_assert_true(qkv_plan_bind(plan, input_names[i], m->inputs[i], &error));
  return plan;
}

/* One step: the loss, and a copy of every gradient (concatenated). */
static float *
model_step(Model *m, QkvPlan *plan, float *loss, gsize *bytes)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_run(plan, &error));
  *loss = (float)qkv_plan_output_scalar(plan, 0);
  GByteArray *all = g_byte_array_new();
  for (guint i = 0; i < qkv_params_size(m->params); i++) {
    const QkvTensor *g = qkv_param_grad(qkv_params_nth(m->params, i));
    g_byte_array_append(all, qkv_tensor_const_data(g), (guint)qkv_tensor_nbytes(g));
  }
  *bytes = all->len;
  return (float *)(gpointer)g_byte_array_free(all, FALSE);
}

static void
test_training_step(void)
{
  for (gint mode = 0; mode < 8; mode++) {
    gint threads = 1 + mode % 2;
    /* the attention's weights path (its size's choice), then flash */
    gboolean flash = mode >= 4;
    g_setenv("QKV_FLASH_ATTENTION", flash ? "1" : "0", TRUE);
    Model m;
    model_init(&m);
    qkv_set_sparse_backward(mode % 4 < 2 ? QKV_SPARSE_BACKWARD_OFF : QKV_SPARSE_BACKWARD_ALWAYS);
    g_autoptr(QkvPlan) f32 = model_plan(&m, threads, FALSE);
    g_autoptr(QkvPlan) b16 = model_plan(&m, threads, TRUE);
    float loss32, loss16;
    gsize n32, n16;
    /* twice each, alternating: the second runs meet warm caches */
    for (gint rep = 0; rep < 2; rep++) {
      g_autofree float *g32 = model_step(&m, f32, &loss32, &n32);
      g_autofree float *g16 = model_step(&m, b16, &loss16, &n16);
      g_assert_cmpfloat(loss16, ==, loss32);
      g_assert_cmpmem(g16, n16, g32, n32);
    }
    /* in 2 bytes instead of 4: the FFN hidden layers (B·T × FFN, one per
     * encoder and decoder block) and the attention projections q, k, v
     * (B·T × HIDDEN each; an encoder block has one attention, a decoder
     * block two) */
    gsize saved = qkv_plan_intermediates_size(f32) - qkv_plan_intermediates_size(b16);
    gsize ffn = 2 * LAYERS * (gsize)(B * T * FFN) * 2,
          qkv = 3 * LAYERS * 3 * (gsize)(B * T * HIDDEN) * 2;
    g_assert_cmpuint(saved, ==, ffn + qkv);
    g_assert_cmpuint(qkv_plan_arena_size(b16), <=, qkv_plan_arena_size(f32));
    g_test_message("%s, %d threads, sparse backward %s: loss %.9g both ways; arena %" G_GSIZE_FORMAT
                   " bytes with bf16 activations, %" G_GSIZE_FORMAT " without",
                   flash ? "flash" : "weights path", threads, mode % 4 < 2 ? "off" : "always",
                   loss16, qkv_plan_arena_size(b16), qkv_plan_arena_size(f32));
    g_clear_pointer(&f32, qkv_plan_free);
    g_clear_pointer(&b16, qkv_plan_free);
    model_clear(&m);
  }
  g_unsetenv("QKV_FLASH_ATTENTION");
  qkv_set_sparse_backward(QKV_SPARSE_BACKWARD_AUTO);
}

/* ---- the plan API --------------------------------------------------------------- */

static void
test_plan_api(void)
{
  g_autoptr(GError) error = NULL;
  Model m;
  model_init(&m);
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.bf16_activations = TRUE;
  g_assert_null(qkv_graph_compile(m.graph, &m.loss, 1, &o, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "bf16_activations"));
  g_clear_error(&error);

  g_autoptr(QkvPlan) plan = model_plan(&m, 1, TRUE);
  g_assert_false(qkv_plan_try_set_precision(plan, QKV_PRECISION_FP32, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "compile the graph again"));
  g_clear_error(&error);
  g_assert_cmpint(qkv_plan_get_precision(plan), ==, QKV_PRECISION_BF16);
  g_assert_true(qkv_plan_try_set_precision(plan, QKV_PRECISION_BF16, &error));
  model_clear(&m);
}

/* A value the caller asks for stays float32: the FFN's hidden layer as an
 * output of an evaluation plan with bf16 activations is the float32 one,
 * while the same plan without asking for it stores it in half the bytes
 * and gives the same y. */
static void
test_requested_output(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(3, 50, 24);
  g_autoptr(QkvTensor) xt = qkv_test_uniform(&xs, 1, -1, 1);
  QkvShape w1s = QKV_SHAPE(80, 24), b1s = QKV_SHAPE(80), w2s = QKV_SHAPE(24, 80),
           b2s = QKV_SHAPE(24);
  g_autoptr(QkvTensor) w1 = qkv_test_uniform(&w1s, 2, -0.3f, 0.3f);
  g_autoptr(QkvTensor) b1 = qkv_test_uniform(&b1s, 3, -0.1f, 0.1f);
  g_autoptr(QkvTensor) w2 = qkv_test_uniform(&w2s, 4, -0.3f, 0.3f);
  g_autoptr(QkvTensor) b2 = qkv_test_uniform(&b2s, 5, -0.1f, 0.1f);
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, xs);
  QkvValue *y = qkv_position_wise_ffn(
      x, qkv_graph_constant(g, w1, &error), qkv_graph_constant(g, b1, &error),
      qkv_graph_constant(g, w2, &error), qkv_graph_constant(g, b2, &error), &error);
  g_assert_no_error(error);
  QkvValue *hidden = qkv_node_output(qkv_value_node(y), 1);
  QkvPlanOptions o = qkv_plan_options_default();
  o.precision = QKV_PRECISION_BF16;
  QkvValue *both[] = {y, hidden};
  g_autoptr(QkvPlan) f32 = qkv_graph_compile(g, both, 2, &o, &error);
  o.bf16_activations = TRUE;
  g_autoptr(QkvPlan) asked = qkv_graph_compile(g, both, 2, &o, &error);
  g_autoptr(QkvPlan) y_only = qkv_graph_compile(g, &y, 1, &o, &error);
  g_assert_no_error(error);
  QkvPlan *plans[] = {f32, asked, y_only};
  for (guint i = 0; i < 3; i++) {
    g_assert_true(qkv_plan_bind(plans[i], "x", xt, &error));
    g_assert_true(qkv_plan_run(plans[i], &error));
  }
  const QkvTensor *h32 = qkv_plan_output(f32, 1), *h = qkv_plan_output(asked, 1);
  g_assert_cmpmem(qkv_tensor_const_data(h), qkv_tensor_nbytes(h), qkv_tensor_const_data(h32),
                  qkv_tensor_nbytes(h32));
  for (guint i = 1; i < 3; i++)
    g_assert_cmpmem(qkv_tensor_const_data(qkv_plan_output(plans[i], 0)),
                    qkv_tensor_nbytes(qkv_plan_output(plans[i], 0)),
                    qkv_tensor_const_data(qkv_plan_output(f32, 0)),
                    qkv_tensor_nbytes(qkv_plan_output(f32, 0)));
  g_assert_cmpuint(qkv_plan_intermediates_size(asked), ==, qkv_plan_intermediates_size(f32));
  g_assert_cmpuint(qkv_plan_intermediates_size(y_only) + 3 * 50 * 80 * 2, ==,
                   qkv_plan_intermediates_size(f32));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/bf16-activations/sgemm-typed", test_sgemm_typed);
  g_test_add_func("/bf16-activations/sgemm-typed-edges", test_sgemm_typed_edges);
  g_test_add_func("/bf16-activations/training-step", test_training_step);
  g_test_add_func("/bf16-activations/plan-api", test_plan_api);
  g_test_add_func("/bf16-activations/requested-output", test_requested_output);
  return g_test_run();
}
