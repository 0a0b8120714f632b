/* test-misuse.c: values a user can pass that used to corrupt memory or
 * silently do the wrong thing, and are now refused: stale graph and store
 * marks (a mark whose point was rolled back past), a gradient accumulator
 * whose parameters a store rollback removed, and step decoders asked for
 * sizes whose arithmetic overflows. */
#include <string.h>

#include "test-util.h"

/* ---- graph marks ----------------------------------------------------------- */

/* x · w summed: a graph with a parameter, so that backward has work. */
static QkvValue *
small_loss(QkvGraph *g, QkvParams *params, const gchar *input)
{
  g_autoptr(GError) error = NULL;
  QkvValue *x = qkv_test_input(g, input, QKV_F32, QKV_SHAPE(3, 4));
  QkvValue *w = qkv_graph_param(g, params, "w", &error);
  QkvValue *y = qkv_matmul(x, w, FALSE, FALSE, &error);
  QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  return loss;
}

static QkvParams *
store_with_w(void)
{
  g_autoptr(GError) error = NULL;
  QkvParams *params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(4, 2);
  qkv_params_add(params, "w", &ws, &error);
  g_assert_no_error(error);
  return params;
}

/* A mark taken after a backward pass, then a rollback past it and a second
 * backward: the mark's counts fit the graph again, but the values it
 * counted are gone. Rolling back to it used to keep the second pass's
 * gradient table while freeing its values, and compiling read them. */
static void
test_graph_mark_after_second_backward(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = store_with_w();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvGraphMark before, after;
  qkv_graph_mark(g, &before);
  QkvValue *loss = small_loss(g, params, "x");
  g_assert_true(qkv_graph_backward(g, loss, &error));
  qkv_graph_mark(g, &after);
  g_assert_true(qkv_graph_rollback_checked(g, &before, &error));
  g_assert_no_error(error);
  /* a second model with more nodes before its loss, and its backward */
  QkvValue *x2 = qkv_test_input(g, "x2", QKV_F32, QKV_SHAPE(3, 4));
  QkvValue *twice = qkv_add(x2, x2, &error);
  QkvValue *w = qkv_graph_param(g, params, "w", &error);
  QkvValue *y = qkv_matmul(twice, w, FALSE, FALSE, &error);
  loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  guint n_values = qkv_graph_n_values(g), n_nodes = qkv_graph_n_nodes(g);
  g_assert_cmpuint(n_values, >=, after.n_values);

  /* the unchecked entry does nothing (it used to free the second pass's
   * gradient values and keep them in the table, for compile to read) */
  qkv_graph_rollback(g, &after);
  QkvValue *dw = qkv_graph_gradient(g, w);
  g_assert_nonnull(dw);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &dw, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
  g_assert_false(qkv_graph_rollback_checked(g, &after, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "stale"));
  g_clear_error(&error);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);

  /* the graph is whole: its gradient runs */
  g_autoptr(QkvTensor) xt = qkv_test_uniform(qkv_value_shape(x2), 1, -1, 1);
  g_assert_true(qkv_plan_bind(plan, "x2", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  /* d sum(2x · w) / dw[i][j] = 2 Σ_r x[r][i] */
  const float *xd = qkv_tensor_const_data(xt);
  const float *dwd = qkv_tensor_const_data(qkv_plan_output(plan, 0));
  for (gint i = 0; i < 4; i++) {
    float want = 0;
    for (gint r = 0; r < 3; r++)
      want += xd[r * 4 + i] + xd[r * 4 + i];
    g_assert_cmpfloat_with_epsilon(dwd[i * 2], want, 1e-5);
  }
}

/* A mark whose counts are at most the graph's, but taken on a branch that
 * was rolled back: rolling back to it used to cut away later work. Marks
 * that nest still work. */
static void
test_graph_mark_of_rolled_back_branch(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvGraphMark outer, inner, branch;
  qkv_graph_mark(g, &outer);
  QkvValue *a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2));
  qkv_graph_mark(g, &inner);
  QkvValue *b = qkv_relu(a, &error);
  qkv_graph_mark(g, &branch);
  /* nesting: inner, then outer */
  qkv_graph_rollback(g, &inner);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 1);
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 0);
  /* a rollback to outer again is fine: nothing was added since */
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_no_error(error);

  /* later work, more than the branch had */
  a = qkv_test_input(g, "a", QKV_F32, QKV_SHAPE(2));
  b = qkv_exp(a, &error);
  QkvValue *c = qkv_tanh(b, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_graph_n_values(g), >, branch.n_values);
  g_assert_false(qkv_graph_rollback_checked(g, &branch, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_false(qkv_graph_rollback_checked(g, &inner, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  qkv_graph_rollback(g, &branch);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 3);
  g_assert_true(qkv_value_graph(c) == g);
  g_assert_cmpstr(qkv_node_op_name(qkv_value_node(c)), ==, "tanh");
  /* a mark taken before a failed backward stays good */
  QkvGraphMark good;
  qkv_graph_mark(g, &good);
  g_assert_false(qkv_graph_backward(g, c, &error)); /* not a scalar */
  g_clear_error(&error);
  QkvValue *d = qkv_relu(c, &error);
  g_assert_nonnull(d);
  g_assert_true(qkv_graph_rollback_checked(g, &good, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 3);
  /* and the empty graph's mark is never stale */
  g_assert_true(qkv_graph_rollback_checked(g, &outer, &error));
  g_assert_cmpuint(qkv_graph_n_values(g), ==, 0);
}

/* ---- store marks and the gradient accumulator ------------------------------ */

static QkvParam *
add_param(QkvParams *params, const gchar *name, gint64 n)
{
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(n);
  QkvParam *p = qkv_params_add(params, name, &s, &error);
  g_assert_no_error(error);
  return p;
}

static void
test_params_stale_mark(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvParamsMark outer, branch;
  qkv_params_mark(params, &outer);
  add_param(params, "a", 3);
  qkv_params_mark(params, &branch);
  add_param(params, "b", 3);
  g_assert_true(qkv_params_rollback_checked(params, &outer, &error));
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
  add_param(params, "c", 3);
  add_param(params, "d", 3);
  /* branch counted one parameter, "a", which is gone: refused, nothing removed */
  g_assert_false(qkv_params_rollback_checked(params, &branch, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "stale"));
  g_clear_error(&error);
  qkv_params_rollback(params, &branch);
  g_assert_cmpuint(qkv_params_size(params), ==, 2);
  g_assert_nonnull(qkv_params_lookup(params, "d"));
  /* nested marks work */
  QkvParamsMark two;
  qkv_params_mark(params, &two);
  add_param(params, "e", 3);
  qkv_params_rollback(params, &two);
  g_assert_cmpuint(qkv_params_size(params), ==, 2);
  qkv_params_rollback(params, &outer);
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
}

/* An accumulator whose parameters a rollback removed does nothing (it used
 * to read and write their freed gradient buffers); one whose parameters all
 * survive a rollback of later ones keeps working. */
static void
test_accumulator_after_rollback(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvParam *kept = add_param(params, "kept", 4);
  QkvParamsMark mark;
  qkv_params_mark(params, &mark);
  add_param(params, "gone", 1000);
  g_autoptr(QkvGradAccumulator) stale = qkv_grad_accumulator_new(params, &error);
  g_assert_no_error(error);
  qkv_grad_accumulator_add(stale);
  qkv_params_rollback(params, &mark);
  qkv_tensor_fill(qkv_param_grad(kept), 2.0);
  qkv_grad_accumulator_add(stale);
  g_assert_cmpuint(qkv_grad_accumulator_store(stale), ==, G_MAXUINT);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(kept), 0), ==, 2.0);

  g_autoptr(QkvGradAccumulator) acc = qkv_grad_accumulator_new(params, &error);
  g_assert_no_error(error);
  add_param(params, "later", 2);
  qkv_grad_accumulator_add(acc);
  qkv_grad_accumulator_add(acc);
  qkv_params_rollback(params, &mark);
  g_assert_cmpuint(qkv_grad_accumulator_store(acc), ==, 2);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(kept), 0), ==, 4.0);
}

/* ---- step decoders asked for sizes that overflow --------------------------- */

static const QkvTransformerConfig tcfg = {.src_vocab = 13,
                                          .tgt_vocab = 11,
                                          .num_hiddens = 16,
                                          .ffn_hiddens = 24,
                                          .num_heads = 4,
                                          .num_layers = 1};
static const QkvGruSeq2SeqConfig gcfg = {
    .src_vocab = 13, .tgt_vocab = 11, .embed_size = 8, .num_hiddens = 16, .num_layers = 1};
static const QkvLuongConfig lcfg = {.src_vocab = 13,
                                    .tgt_vocab = 11,
                                    .embed_size = 8,
                                    .num_hiddens = 16,
                                    .num_layers = 1,
                                    .attention = {QKV_LUONG_GENERAL, QKV_LUONG_GLOBAL, 0}};

/* The parameters of model 0 (the Transformer), 1 (Bahdanau) or 2 (Luong). */
static void
train_model(gint model, QkvParams *params)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *src = qkv_test_input(g, "src", QKV_I32, QKV_SHAPE(2, 5));
  QkvValue *valid = qkv_test_input(g, "src_valid", QKV_I32, QKV_SHAPE(2));
  QkvValue *dec = qkv_test_input(g, "dec_in", QKV_I32, QKV_SHAPE(2, 4));
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  if (model == 0) {
    QkvValue *enc = qkv_build_transformer_encoder(&b, &tcfg, src, valid, &error);
    qkv_build_transformer_decoder(&b, &tcfg, dec, enc, valid, NULL, &error);
  } else if (model == 1) {
    qkv_build_bahdanau_seq2seq(&b, &gcfg, src, valid, dec, NULL, &error);
  } else {
    qkv_build_luong_seq2seq(&b, &lcfg, src, valid, dec, NULL, &error);
  }
  g_assert_no_error(error);
}

static QkvStepDecoder *
new_decoder(gint model, QkvParams *params, gint max_rows, gint64 src_len, gint max_len,
            GError **error)
{
  if (model == 0)
    return qkv_step_decoder_new_transformer(params, &tcfg, max_rows, src_len, max_len, 1, error);
  if (model == 1)
    return qkv_step_decoder_new_bahdanau(params, &gcfg, max_rows, src_len, max_len, 1, error);
  return qkv_step_decoder_new_luong(params, &lcfg, max_rows, src_len, max_len, 1, error);
}

static void
expect_refused(gint model, QkvParams *params, gint max_rows, gint64 src_len, gint max_len,
               const gchar *named)
{
  g_autoptr(GError) error = NULL;
  guint n_params = qkv_params_size(params);
  QkvStepDecoder *d = new_decoder(model, params, max_rows, src_len, max_len, &error);
  if (d != NULL)
    g_error("model %d: a decoder of %d rows, src_len %" G_GINT64_FORMAT " and max_len %d was made",
            model, max_rows, src_len, max_len);
  g_assert_nonnull(error);
  if (!g_error_matches(error, QKV_ERROR, QKV_ERROR_MEMORY) &&
      !g_error_matches(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT))
    g_error("model %d: refused with an unexpected error: %s", model, error->message);
  if (strstr(error->message, named) == NULL)
    g_error("model %d: the message does not name %s: %s", model, named, error->message);
  g_test_message("model %d: %s", model, error->message);
  g_assert_cmpuint(qkv_params_size(params), ==, n_params);
}

static void
test_decoder_sizes(void)
{
  g_autoptr(GError) error = NULL;
  for (gint model = 0; model < 3; model++) {
    g_autoptr(QkvParams) params = qkv_params_new();
    train_model(model, params);
    /* the sizes work at small values */
    g_autoptr(QkvStepDecoder) d = new_decoder(model, params, 2, 5, 4, &error);
    g_assert_no_error(error);
    expect_refused(model, params, 2, G_GINT64_CONSTANT(1) << 40, 4, "1099511627776");
    expect_refused(model, params, G_MAXINT, G_MAXINT64, 4, "9223372036854775807");
    if (model == 0) {
      /* the Transformer attends to max_len + 1 keys per step */
      expect_refused(model, params, 2, 5, G_MAXINT, "2147483647");
    } else {
      /* the GRU decoders keep no cache: max_len only bounds the steps */
      g_autoptr(QkvStepDecoder) long_one = new_decoder(model, params, 2, 5, G_MAXINT, &error);
      g_assert_no_error(error);
      g_assert_nonnull(long_one);
    }
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/misuse/graph-mark-after-second-backward",
                  test_graph_mark_after_second_backward);
  g_test_add_func("/misuse/graph-mark-of-rolled-back-branch",
                  test_graph_mark_of_rolled_back_branch);
  g_test_add_func("/misuse/params-stale-mark", test_params_stale_mark);
  g_test_add_func("/misuse/accumulator-after-rollback", test_accumulator_after_rollback);
  g_test_add_func("/misuse/decoder-sizes", test_decoder_sizes);
  return g_test_run();
}
