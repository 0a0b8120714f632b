/* test-builders-layers.c: the builders of today's layers: LayerNorm and
 * RMSNorm with PyTorch's names and initial values, multi-head attention with
 * biases, the FFN with GELU or SiLU, and the Transformer's pre-LN, GELU and
 * attention-bias options: names, values against the ops they are made of,
 * the graphs of the book's options unchanged, and finite-difference
 * gradients through whole pre-LN models. (Their numbers against PyTorch's
 * nn.TransformerEncoderLayer / DecoderLayer: tests/test-models.c.) */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* A graph with an input x (2, 5, 8) and a store. */
typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvBuilder b;
  QkvValue *x;
  QkvTensor *xt;
} Fixture;

static void
fixture_set_up(Fixture *f, gconstpointer data)
{
  f->graph = qkv_graph_new();
  f->params = qkv_params_new();
  f->b = (QkvBuilder){.graph = f->graph, .params = f->params, .seed = 5};
  f->x = qkv_test_input(f->graph, "x", QKV_F32, QKV_SHAPE(2, 5, 8));
  QkvShape s = QKV_SHAPE(2, 5, 8);
  f->xt = qkv_test_uniform(&s, 17, -2, 2);
}

static void
fixture_tear_down(Fixture *f, gconstpointer data)
{
  qkv_tensor_free(f->xt);
  qkv_graph_free(f->graph);
  qkv_params_free(f->params);
}

/* Run the graph on x and return outputs (copies). */
static void
run(Fixture *f, QkvValue *const *outs, guint n, QkvTensor **results)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(f->graph, outs, n, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", f->xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++)
    results[i] = qkv_tensor_copy(qkv_plan_output(plan, i));
}

static void
assert_same_floats(const QkvTensor *a, const QkvTensor *b)
{
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(a), qkv_tensor_shape(b)));
  g_assert_cmpmem(qkv_tensor_const_data(a), qkv_tensor_nbytes(a), qkv_tensor_const_data(b),
                  qkv_tensor_nbytes(b));
}

static void
assert_param(QkvParams *params, const gchar *name, const QkvShape *shape)
{
  QkvParam *p = qkv_params_lookup(params, name);
  if (p == NULL)
    g_error("no parameter '%s'", name);
  g_assert_true(qkv_shape_equal(qkv_param_shape(p), shape));
}

static void
assert_all(const QkvTensor *t, double value)
{
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    g_assert_cmpfloat(qkv_tensor_get(t, i), ==, value);
}

/* nn.LayerNorm's names and values; without the affine map or the bias, the
 * parameters it would have are left out of the store. */
static void
test_layer_norm(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  QkvValue *y = qkv_build_layer_norm(b, "norm", f->x, 1e-5, TRUE, TRUE, &error);
  QkvValue *y_plain = qkv_build_layer_norm(b, "plain", f->x, 1e-5, FALSE, TRUE, &error);
  QkvValue *y_nobias = qkv_build_layer_norm(b, "nobias", f->x, 1e-5, TRUE, FALSE, &error);
  g_assert_no_error(error);
  QkvShape d = QKV_SHAPE(8);
  assert_param(f->params, "norm.weight", &d);
  assert_param(f->params, "norm.bias", &d);
  assert_param(f->params, "nobias.weight", &d);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 3);
  assert_all(qkv_param_value(qkv_params_lookup(f->params, "norm.weight")), 1);
  assert_all(qkv_param_value(qkv_params_lookup(f->params, "norm.bias")), 0);
  /* the op on the same numbers */
  QkvValue *ones = qkv_graph_param(f->graph, f->params, "norm.weight", &error);
  QkvValue *zeros = qkv_graph_param(f->graph, f->params, "norm.bias", &error);
  QkvValue *direct = qkv_layer_norm(f->x, ones, zeros, 1e-5, &error);
  g_assert_no_error(error);
  QkvValue *outs[] = {y, y_plain, y_nobias, direct};
  QkvTensor *r[4];
  run(f, outs, 4, r);
  for (int i = 0; i < 3; i++)
    assert_same_floats(r[i], r[3]);
  for (int i = 0; i < 4; i++)
    qkv_tensor_free(r[i]);
}

static void
test_rms_norm(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvValue *y = qkv_build_rms_norm(&f->b, "rms", f->x, 1e-6, &error);
  QkvValue *direct = qkv_rms_norm(f->x, NULL, 1e-6, &error);
  g_assert_no_error(error);
  QkvShape d = QKV_SHAPE(8);
  assert_param(f->params, "rms.weight", &d);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 1);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(y)), ==, "rms_norm");
  QkvValue *outs[] = {y, direct};
  QkvTensor *r[2];
  run(f, outs, 2, r);
  assert_same_floats(r[0], r[1]); /* x · rstd · 1 is x · rstd */
  qkv_tensor_free(r[0]);
  qkv_tensor_free(r[1]);
}

/* The listing of a graph with self-attention on x (2, 5, 8) built by
 * qkv_build_mha (full FALSE) or qkv_build_mha_full without options. */
static gchar *
mha_graph_text(gboolean full)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 5};
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 5, 8));
  QkvValue *y = full ? qkv_build_mha_full(&b, "att", x, x, x, 8, 2, NULL, NULL, &error)
                     : qkv_build_mha(&b, "att", x, x, x, 8, 2, NULL, FALSE, 0.0, NULL, &error);
  g_assert_no_error(error);
  g_assert_nonnull(y);
  return qkv_graph_to_string(g);
}

static void
test_mha_bias(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  /* without biases: the very graph qkv_build_mha builds */
  g_autofree gchar *text_plain = mha_graph_text(FALSE);
  g_autofree gchar *text_full = mha_graph_text(TRUE);
  g_assert_cmpstr(text_plain, ==, text_full);
  QkvValue *plain = qkv_build_mha(b, "att", f->x, f->x, f->x, 8, 2, NULL, FALSE, 0.0, NULL, &error);
  QkvValue *full = qkv_build_mha_full(b, "att", f->x, f->x, f->x, 8, 2, NULL, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 4);

  /* with them: W_q.bias … W_o.bias, U(±1/√fan_in) as nn.Linear's; one
   * node still, the fused op taking the biases */
  guint n0 = qkv_graph_n_nodes(f->graph);
  QkvMhaOptions o = {.bias = TRUE};
  QkvValue *biased = qkv_build_mha_full(b, "att", f->x, f->x, f->x, 8, 2, &o, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, n0 + 1);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(biased)), ==, "multi_head_attention");
  g_assert_cmpuint(qkv_params_size(f->params), ==, 8);
  const gchar *names[] = {"att.W_q.bias", "att.W_k.bias", "att.W_v.bias", "att.W_o.bias"};
  QkvShape d = QKV_SHAPE(8);
  for (int i = 0; i < 4; i++) {
    assert_param(f->params, names[i], &d);
    const QkvTensor *t = qkv_param_value(qkv_params_lookup(f->params, names[i]));
    g_assert_cmpfloat(qkv_test_max_abs(t), <=, 1 / sqrt(8.0));
    g_assert_cmpfloat(qkv_test_max_abs(t), >, 0);
  }

  /* biases at 0 (PyTorch's start, through b->inits) change nothing */
  QkvBuilderInits zero = {.bias = {.kind = QKV_INIT_CONSTANT, .value = 0}};
  QkvBuilder bz = {.graph = f->graph, .params = f->params, .seed = 5, .inits = &zero};
  QkvValue *zeroed = qkv_build_mha_full(&bz, "att0", f->x, f->x, f->x, 8, 2, &o, NULL, &error);
  g_assert_no_error(error);
  for (int i = 0; i < 4; i++) {
    g_autofree gchar *name = g_strdup_printf("att0.%s", names[i] + 4);
    assert_all(qkv_param_value(qkv_params_lookup(f->params, name)), 0);
    /* the same weights as "att" */
    g_autofree gchar *wname = g_strdup_printf("att0.W_%c.weight", names[i][6]);
    g_autofree gchar *wsrc = g_strdup_printf("att.W_%c.weight", names[i][6]);
    g_assert_true(qkv_tensor_copy_from(qkv_param_value(qkv_params_lookup(f->params, wname)),
                                       qkv_param_value(qkv_params_lookup(f->params, wsrc)),
                                       &error));
  }
  QkvValue *outs[] = {plain, full, biased, zeroed};
  QkvTensor *r[4];
  run(f, outs, 4, r);
  assert_same_floats(r[0], r[1]);
  /* the biases move the output; zero biases leave it where it was, up to
   * the rounding of the additions (one per projection, through the
   * attention's sums of O(1) terms) */
  g_assert_cmpfloat(fabs(qkv_tensor_get(r[2], 0) - qkv_tensor_get(r[0], 0)), >, 1e-3);
  qkv_assert_scaled("zero biases", r[3], r[0], 64);
  for (int i = 0; i < 4; i++)
    qkv_tensor_free(r[i]);
}

/* GELU and SiLU FFNs: qkv_build_ffn's names, and dense2(act(dense1(x))). */
static void
test_ffn_activation(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  guint n0 = qkv_graph_n_nodes(f->graph);
  QkvValue *relu = qkv_build_ffn_activation(b, "ffn", f->x, 12, 8, QKV_ACTIVATION_RELU, &error);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, n0 + 1);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(relu)), ==, "position_wise_ffn");
  const QkvActivation acts[] = {QKV_ACTIVATION_GELU, QKV_ACTIVATION_GELU_TANH, QKV_ACTIVATION_SILU};
  QkvValue *outs[6];
  for (int i = 0; i < 3; i++) {
    outs[2 * i] = qkv_build_ffn_activation(b, "ffn", f->x, 12, 8, acts[i], &error);
    /* by hand, on the same parameters */
    QkvValue *w1 = qkv_graph_param(f->graph, f->params, "ffn.dense1.weight", &error);
    QkvValue *b1 = qkv_graph_param(f->graph, f->params, "ffn.dense1.bias", &error);
    QkvValue *w2 = qkv_graph_param(f->graph, f->params, "ffn.dense2.weight", &error);
    QkvValue *b2 = qkv_graph_param(f->graph, f->params, "ffn.dense2.bias", &error);
    QkvValue *h = qkv_add(qkv_matmul(f->x, w1, FALSE, TRUE, &error), b1, &error);
    h = acts[i] == QKV_ACTIVATION_SILU
            ? qkv_silu(h, &error)
            : qkv_gelu(h, acts[i] == QKV_ACTIVATION_GELU ? "none" : "tanh", &error);
    outs[2 * i + 1] = qkv_add(qkv_matmul(h, w2, FALSE, TRUE, &error), b2, &error);
  }
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 4);
  QkvTensor *r[6];
  run(f, outs, 6, r);
  for (int i = 0; i < 6; i++) {
    if (i % 2 == 0)
      assert_same_floats(r[i], r[i + 1]);
    qkv_tensor_free(r[i]);
  }
}

/* The parameters the Transformer's options add to the book's, and nothing
 * else: the final norms, and a bias per attention projection. */
static void
test_transformer_names(void)
{
  g_autoptr(GError) error = NULL;
  const QkvTransformerConfig book = {.src_vocab = 11,
                                     .tgt_vocab = 13,
                                     .num_hiddens = 8,
                                     .ffn_hiddens = 16,
                                     .num_heads = 2,
                                     .num_layers = 2};
  QkvTransformerConfig variants[3] = {book, book, book};
  variants[0].norm_first = TRUE;
  variants[1].attention_bias = TRUE;
  variants[2].ffn_activation = QKV_ACTIVATION_SILU;
  const guint extra[] = {4, (2 + 2 * 2) * 4, 0};
  g_autoptr(QkvParams) ref = qkv_params_new();
  guint n_book = 0;
  for (int v = -1; v < 3; v++) {
    const QkvTransformerConfig *cfg = v < 0 ? &book : &variants[v];
    g_autoptr(QkvGraph) g = qkv_graph_new();
    g_autoptr(QkvParams) params = qkv_params_new();
    QkvBuilder b = {.graph = g, .params = params, .seed = 1};
    QkvValue *src = qkv_test_input(g, "src", QKV_I32, QKV_SHAPE(2, 5));
    QkvValue *valid = qkv_test_input(g, "valid", QKV_I32, QKV_SHAPE(2));
    QkvValue *enc = qkv_build_transformer_encoder(&b, cfg, src, valid, &error);
    g_assert_nonnull(qkv_build_transformer_decoder(&b, cfg, src, enc, valid, NULL, &error));
    g_assert_no_error(error);
    if (v < 0) {
      n_book = qkv_params_size(params);
      for (guint i = 0; i < n_book; i++)
        qkv_params_add(ref, qkv_param_name(qkv_params_nth(params, i)),
                       qkv_param_shape(qkv_params_nth(params, i)), NULL);
      continue;
    }
    g_assert_cmpuint(qkv_params_size(params), ==, n_book + extra[v]);
    for (guint i = 0; i < n_book; i++)
      g_assert_nonnull(qkv_params_lookup(params, qkv_param_name(qkv_params_nth(ref, i))));
    if (cfg->norm_first) {
      QkvShape d = QKV_SHAPE(8);
      assert_param(params, "encoder.norm.weight", &d);
      assert_param(params, "decoder.norm.bias", &d);
    }
    if (cfg->attention_bias) {
      QkvShape d = QKV_SHAPE(8);
      assert_param(params, "encoder.blks.block1.attention.W_k.bias", &d);
      assert_param(params, "decoder.blks.block0.attention2.W_o.bias", &d);
    }
  }
}

/* d loss / d parameter of whole pre-LN models (GELU, attention biases,
 * tied or not) against central differences of the loss. */
static void
test_prenorm_gradients(void)
{
  g_autoptr(GError) error = NULL;
  for (int tie = 0; tie < 2; tie++) {
    const QkvTransformerConfig cfg = {.src_vocab = 11,
                                      .tgt_vocab = 11,
                                      .num_hiddens = 8,
                                      .ffn_hiddens = 12,
                                      .num_heads = 2,
                                      .num_layers = 2,
                                      .tie_embeddings = tie ? QKV_TIE_ALL : QKV_TIE_NONE,
                                      .norm_first = TRUE,
                                      .ffn_activation = QKV_ACTIVATION_GELU_TANH,
                                      .attention_bias = TRUE};
    g_autoptr(QkvGraph) g = qkv_graph_new();
    g_autoptr(QkvParams) params = qkv_params_new();
    QkvBuilder b = {.graph = g, .params = params, .seed = 3, .xavier_linear = TRUE};
    QkvValue *src = qkv_test_input(g, "src", QKV_I32, QKV_SHAPE(2, 5));
    QkvValue *valid = qkv_test_input(g, "valid", QKV_I32, QKV_SHAPE(2));
    QkvValue *dec = qkv_test_input(g, "dec", QKV_I32, QKV_SHAPE(2, 5));
    QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, src, valid, &error);
    QkvValue *logits = qkv_build_transformer_decoder(&b, &cfg, dec, enc, valid, NULL, &error);
    QkvValue *loss = qkv_build_seq2seq_loss_lens(logits, src, valid, NULL, &error);
    g_assert_no_error(error);
    g_assert_true(qkv_graph_backward(g, loss, &error));
    QkvPlanOptions o = qkv_plan_options_default();
    o.training = TRUE;
    g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &o, &error);
    g_assert_no_error(error);
    QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2);
    g_autoptr(QkvTensor) st = qkv_test_randint(&bt, 1, 0, 11);
    g_autoptr(QkvTensor) dt = qkv_test_randint(&bt, 2, 0, 11);
    g_autoptr(QkvTensor) vt = qkv_tensor_new(QKV_I32, &bs);
    qkv_tensor_i32(vt)[0] = 5, qkv_tensor_i32(vt)[1] = 3;
    g_assert_true(qkv_plan_bind(plan, "src", st, &error) &&
                  qkv_plan_bind(plan, "dec", dt, &error) &&
                  qkv_plan_bind(plan, "valid", vt, &error));
    const gchar *names[] = {"encoder.norm.weight",
                            "encoder.norm.bias",
                            "encoder.blks.block0.addnorm1.ln.weight",
                            "encoder.blks.block1.attention.W_q.bias",
                            "encoder.blks.block0.attention.W_v.bias",
                            "encoder.blks.block0.ffn.dense1.weight",
                            "decoder.blks.block1.attention2.W_o.bias",
                            "decoder.blks.block0.attention1.W_v.bias",
                            "decoder.blks.block0.addnorm3.ln.bias",
                            "decoder.norm.weight",
                            "decoder.dense.bias",
                            "encoder.embedding.weight"};
    for (guint i = 0; i < G_N_ELEMENTS(names); i++)
      qkv_test_param_fd(plan, params, names[i], 24, 1e-2, 2e-2, 1e-2, 1.0);
    /* and the check catches a gradient 10% off */
    g_assert_cmpfloat(
        qkv_test_param_fd(plan, params, "encoder.norm.weight", 24, 1e-2, 2e-2, 1e-2, 1.1), >, 5e-2);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
#define ADD(path, func) g_test_add(path, Fixture, NULL, fixture_set_up, func, fixture_tear_down)
  ADD("/builders-layers/layer-norm", test_layer_norm);
  ADD("/builders-layers/rms-norm", test_rms_norm);
  ADD("/builders-layers/mha-bias", test_mha_bias);
  ADD("/builders-layers/ffn-activation", test_ffn_activation);
#undef ADD
  g_test_add_func("/builders-layers/transformer-names", test_transformer_names);
  g_test_add_func("/builders-layers/prenorm-gradients", test_prenorm_gradients);
  return g_test_run();
}
