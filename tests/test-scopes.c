/* test-scopes.c: the builder's name scopes (qkv_builder_push() and friends):
 * parameter names and the graph's scope follow the stack, the book's models
 * nest under a scope with their names unchanged below it, a failed builder
 * leaves the stack as it found it, and misuse (a pop too many, a name too
 * long or not UTF-8, a copied builder) is refused without a crash. */
#include "test-util.h"

#include <string.h>

typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvBuilder b;
  QkvValue *x; /* f32 (2, 3, 4) */
} Fixture;

static void
fixture_set_up(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  f->graph = qkv_graph_new();
  f->params = qkv_params_new();
  f->b = (QkvBuilder){.graph = f->graph, .params = f->params, .seed = 5};
  QkvShape s = QKV_SHAPE(2, 3, 4);
  f->x = qkv_graph_input(f->graph, "x", QKV_F32, &s, &error);
  g_assert_no_error(error);
  qkv_graph_set_scope(f->graph, "user");
}

static void
fixture_tear_down(Fixture *f, gconstpointer data)
{
  /* every test leaves the stack empty, so nothing is left to free */
  g_assert_null(f->b.scopes);
  qkv_graph_free(f->graph);
  qkv_params_free(f->params);
}

static gboolean
has_param(Fixture *f, const gchar *name)
{
  return qkv_params_lookup(f->params, name) != NULL;
}

static void
test_nesting(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  g_assert_null(qkv_builder_get_scope(b));
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);

  g_assert_true(qkv_builder_push(b, "blocks.0", &error));
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "blocks.0");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.blocks.0");
  g_assert_true(qkv_builder_push(b, "attention", &error));
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 2);
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "blocks.0.attention");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.blocks.0.attention");

  QkvValue *y = qkv_build_linear(b, "W_q", f->x, 5, TRUE, &error);
  g_assert_no_error(error);
  g_assert_nonnull(y);
  g_assert_true(has_param(f, "blocks.0.attention.W_q.weight"));
  g_assert_true(has_param(f, "blocks.0.attention.W_q.bias"));
  g_assert_cmpuint(qkv_params_size(f->params), ==, 2);
  /* the layer pushed its own name while it ran, for its nodes */
  const gchar *node = qkv_node_name(qkv_value_node(y));
  g_assert_true(g_str_has_prefix(node, "user.blocks.0.attention.W_q."));
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "blocks.0.attention");
  g_autofree gchar *full = qkv_builder_scoped_name(b, "W_q.weight");
  g_assert_cmpstr(full, ==, "blocks.0.attention.W_q.weight");

  /* a pop restores the graph's scope of its push, whatever happened since */
  qkv_graph_set_scope(f->graph, "elsewhere");
  qkv_builder_pop(b);
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "blocks.0");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.blocks.0");
  qkv_builder_pop(b);
  g_assert_null(qkv_builder_get_scope(b));
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
  g_assert_null(b->scopes); /* freed by the pop that emptied it */

  /* printf names; "" is a level without a name */
  for (gint i = 0; i < 3; i++) {
    g_assert_true(qkv_builder_push_printf(b, &error, "blocks.%d", i));
    g_assert_true(qkv_builder_push(b, "", &error));
    g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 2);
    QkvShape s = QKV_SHAPE(3);
    g_assert_nonnull(qkv_build_param(b, "gamma", &s, "ones", 0, &error));
    qkv_builder_pop(b);
    qkv_builder_pop(b);
  }
  g_assert_no_error(error);
  g_assert_true(has_param(f, "blocks.2.gamma"));
  g_assert_cmpuint(qkv_params_size(f->params), ==, 5);
  g_autofree gchar *bare = qkv_builder_scoped_name(b, "w");
  g_assert_cmpstr(bare, ==, "w");

  /* a parameter reused under the same scoped name, not created twice */
  g_assert_true(qkv_builder_push(b, "blocks.0.attention", &error));
  g_assert_nonnull(qkv_build_linear(b, "W_q", f->x, 5, TRUE, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 5);
  qkv_builder_pop(b);
}

/* Every name of a store, in order, each prefixed with prefix. */
static gchar *
names_of(QkvParams *params, const gchar *prefix)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    g_autofree gchar *shape = qkv_shape_to_string(qkv_param_shape(p));
    g_string_append_printf(s, "%s%s %s\n", prefix, qkv_param_name(p), shape);
  }
  return g_string_free(s, FALSE);
}

/* The Transformer (luong FALSE) or a Luong seq2seq with every score and
 * alignment parameter (concat score, local-p) into params, under scope (may
 * be NULL). */
static void
build_model(QkvParams *params, const gchar *scope, gboolean luong)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 3, .xavier_linear = TRUE};
  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, &error);
  QkvValue *valid = qkv_graph_input(g, "valid", QKV_I32, &bs, &error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, &error);
  if (scope != NULL)
    qkv_builder_push(&b, scope, &error);
  QkvValue *logits;
  if (!luong) {
    QkvTransformerConfig tc = {.src_vocab = 11,
                               .tgt_vocab = 13,
                               .num_hiddens = 8,
                               .ffn_hiddens = 16,
                               .num_heads = 2,
                               .num_layers = 2,
                               .tie_embeddings = QKV_TIE_DECODER};
    QkvValue *enc = qkv_build_transformer_encoder(&b, &tc, src, valid, &error);
    logits = qkv_build_transformer_decoder(&b, &tc, dec_in, enc, valid, NULL, &error);
  } else {
    QkvLuongConfig lc = {
        .src_vocab = 11,
        .tgt_vocab = 13,
        .embed_size = 6,
        .num_hiddens = 8,
        .num_layers = 2,
        .attention = {.score = QKV_LUONG_CONCAT, .align = QKV_LUONG_LOCAL_P, .window = 2},
        .input_feeding = TRUE};
    logits = qkv_build_luong_seq2seq(&b, &lc, src, valid, dec_in, NULL, &error);
  }
  g_assert_no_error(error);
  g_assert_nonnull(logits);
  if (scope != NULL) {
    g_assert_cmpstr(qkv_builder_get_scope(&b), ==, scope);
    qkv_builder_pop(&b);
  }
  g_assert_null(qkv_graph_get_scope(g));
}

/* The book's models under a scope: every name is "<scope>." and the name
 * it has without one (which the safetensors fixtures pin), in the same
 * order. */
static void
test_models_under_scope(void)
{
  for (gint luong = 0; luong < 2; luong++) {
    g_autoptr(QkvParams) plain = qkv_params_new();
    g_autoptr(QkvParams) scoped = qkv_params_new();
    build_model(plain, NULL, luong);
    build_model(scoped, "model.0", luong);
    g_autofree gchar *want = names_of(plain, "model.0.");
    g_autofree gchar *have = names_of(scoped, "");
    g_assert_cmpstr(have, ==, want);
    g_test_message("%s", have);
    const gchar *some =
        luong ? "decoder.attention.v_p.weight" : "encoder.blks.block1.attention.W_q.weight";
    g_assert_nonnull(qkv_params_lookup(plain, some));
  }
}

/* A builder that fails midway leaves the stack, the graph's scope and the
 * store as they were. */
static void
test_rollback(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  g_assert_true(qkv_builder_push(b, "outer", &error));
  QkvShape odd = QKV_SHAPE(97);
  g_assert_nonnull(
      qkv_params_add(f->params, "outer.encoder.blks.block1.ffn.dense1.weight", &odd, &error));
  QkvShape bt = QKV_SHAPE(2, 5);
  QkvValue *src = qkv_graph_input(f->graph, "src", QKV_I32, &bt, &error);
  guint n_nodes = qkv_graph_n_nodes(f->graph), n_values = qkv_graph_n_values(f->graph);
  QkvTransformerConfig tc = {.src_vocab = 11,
                             .tgt_vocab = 11,
                             .num_hiddens = 8,
                             .ffn_hiddens = 16,
                             .num_heads = 2,
                             .num_layers = 2};
  /* block 0 builds, block 1's ffn finds its weight with the wrong shape */
  g_assert_null(qkv_build_transformer_encoder(b, &tc, src, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_true(strstr(error->message, "'outer.encoder.blks.block1.ffn.dense1.weight'") != NULL);
  g_clear_error(&error);
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 1);
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "outer");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.outer");
  g_assert_cmpuint(qkv_params_size(f->params), ==, 1);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, n_nodes);
  g_assert_cmpuint(qkv_graph_n_values(f->graph), ==, n_values);

  /* a step of one's own that returns early with levels pushed: the end
   * pops them, failed or not */
  for (gint failed = 0; failed < 2; failed++) {
    QkvBuilderMark mark;
    qkv_builder_begin(b, &mark);
    qkv_builder_push(b, "a", &error);
    qkv_builder_push(b, "b", &error);
    QkvShape s = QKV_SHAPE(2);
    g_autofree gchar *name = g_strdup_printf("p%d", failed);
    g_autofree gchar *full = g_strdup_printf("outer.a.b.p%d", failed);
    QkvValue *p = qkv_build_param(b, name, &s, "zeros", 0, &error);
    g_assert_no_error(error);
    g_assert_true(has_param(f, full));
    g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.outer.a.b");
    QkvValue *result = qkv_builder_end(b, &mark, failed ? NULL : p);
    g_assert_true(result == (failed ? NULL : p));
    g_assert_true(has_param(f, full) == !failed);
    g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 1);
    g_assert_cmpstr(qkv_builder_get_scope(b), ==, "outer");
    g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.outer");
  }
  g_assert_cmpuint(qkv_params_size(f->params), ==, 2);

  /* a step that pops a level it did not push: a critical at its end */
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  qkv_builder_pop(b);
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*popped 1 scope levels*");
  qkv_builder_end(b, &mark, NULL);
  g_test_assert_expected_messages();
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.outer"); /* the step's start */
}

/* Popping an empty stack, and a copy of a builder with scopes pushed. */
static void
test_misuse(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*qkv_builder_pop*");
  qkv_builder_pop(b);
  g_test_assert_expected_messages();
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
  qkv_builder_clear_scopes(b); /* nothing to clear */

  g_assert_true(qkv_builder_push(b, "model", &error));
  QkvBuilder copy = *b;
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*qkv_builder_push*owner*");
  g_assert_false(qkv_builder_push(&copy, "other", &error));
  g_test_assert_expected_messages();
  g_test_expect_message("qkv", G_LOG_LEVEL_CRITICAL, "*qkv_builder_pop*owner*");
  qkv_builder_pop(&copy);
  g_test_assert_expected_messages();
  /* reading through the copy is harmless */
  g_assert_cmpstr(qkv_builder_get_scope(&copy), ==, "model");
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 1);
  qkv_builder_pop(b);
  g_assert_no_error(error);
}

static void
assert_refused(Fixture *f, QkvBuilder *b)
{
  g_autoptr(GError) error = NULL;
  guint n = qkv_params_size(f->params), nodes = qkv_graph_n_nodes(f->graph);
  g_assert_null(qkv_build_linear(b, "dense", f->x, 3, TRUE, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_true(strstr(error->message, "refused") != NULL);
  g_assert_cmpuint(qkv_params_size(f->params), ==, n);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, nodes);
}

/* Names the stack refuses: the level is pushed all the same (so pops stay
 * balanced), keeps the scope below it, and nothing is built under it. */
static void
test_refused_names(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  g_assert_true(qkv_builder_push(b, "a", &error));
  /* "a." plus the name: QKV_BUILDER_SCOPE_MAX bytes is the longest accepted */
  g_autofree gchar *fits = g_strnfill(QKV_BUILDER_SCOPE_MAX - 2, 'x');
  g_autofree gchar *over = g_strnfill(QKV_BUILDER_SCOPE_MAX - 1, 'x');
  g_assert_true(qkv_builder_push(b, fits, &error));
  g_assert_cmpuint(strlen(qkv_builder_get_scope(b)), ==, QKV_BUILDER_SCOPE_MAX);
  qkv_builder_pop(b);
  g_assert_no_error(error);

  g_autofree gchar *graph_scope = g_strdup(qkv_graph_get_scope(f->graph));
  g_assert_false(qkv_builder_push(b, over, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_true(strstr(error->message, "QKV_BUILDER_SCOPE_MAX") != NULL);
  g_clear_error(&error);
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 2);
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "a");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, graph_scope);
  assert_refused(f, b);
  /* a valid name above a refused level is refused too */
  g_assert_true(qkv_builder_push(b, "inner", &error));
  assert_refused(f, b);
  qkv_builder_pop(b);
  qkv_builder_pop(b);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, graph_scope);
  g_assert_nonnull(qkv_build_linear(b, "dense", f->x, 3, TRUE, &error));
  g_assert_no_error(error);
  g_assert_true(has_param(f, "a.dense.weight"));

  g_assert_false(qkv_builder_push(b, "bad\xff", &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_true(strstr(error->message, "UTF-8") != NULL);
  g_clear_error(&error);
  assert_refused(f, b);
  qkv_builder_pop(b);

  /* errors chain: a push after a failure keeps the first error */
  g_set_error_literal(&error, QKV_ERROR, QKV_ERROR_SHAPE, "first");
  g_assert_false(qkv_builder_push(b, over, &error));
  g_assert_false(qkv_builder_push(b, "fine", &error));
  g_assert_cmpstr(error->message, ==, "first");
  /* the level is there for its pop, refused: it names nothing */
  assert_refused(f, b);
  qkv_builder_pop(b);
  qkv_builder_pop(b);
  qkv_builder_pop(b);
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
}

static void
test_clear(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  for (gint i = 0; i < 3; i++)
    qkv_builder_push_printf(b, &error, "level%d", i);
  g_assert_no_error(error);
  g_assert_cmpstr(qkv_builder_get_scope(b), ==, "level0.level1.level2");
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user.level0.level1.level2");
  qkv_builder_clear_scopes(b);
  g_assert_cmpuint(qkv_builder_get_scope_depth(b), ==, 0);
  g_assert_null(b->scopes);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
#define ADD(path, fn) g_test_add(path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD("/scopes/nesting", test_nesting);
  ADD("/scopes/rollback", test_rollback);
  ADD("/scopes/misuse", test_misuse);
  ADD("/scopes/refused-names", test_refused_names);
  ADD("/scopes/clear", test_clear);
#undef ADD
  g_test_add_func("/scopes/models-under-scope", test_models_under_scope);
  return g_test_run();
}
