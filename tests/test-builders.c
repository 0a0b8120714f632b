/* test-builders.c: every builder is all-or-nothing. A bad size or config is
 * refused with an error naming the builder and the field, and a failure
 * midway (a parameter that exists with another shape, an op that rejects its
 * inputs) rolls back what the call had added: the graph's nodes, values and
 * scope and the store's parameters are as before the call, and the
 * out-parameters are NULL. Also the marks (qkv_graph_mark(),
 * qkv_params_mark()) the builders are made of. */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* A Transformer config from its first seven fields, in order (designated,
 * so that the fields added since are zero: their defaults). */
#define TCFG(sv, tv, d, f, h, l, p)                                                                \
  {                                                                                                \
    .src_vocab = (sv), .tgt_vocab = (tv), .num_hiddens = (d), .ffn_hiddens = (f),                  \
    .num_heads = (h), .num_layers = (l), .dropout = (p)                                            \
  }

/* A graph with inputs, a store holding a built encoder (unless "empty"), and a scope of the
 * caller's own, so that rolling back has something to keep. */
typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvBuilder b;
  QkvTransformerConfig tcfg;
  QkvGruSeq2SeqConfig gcfg;
  QkvValue *src, *src_valid, *dec_in, *x, *labels, *mask, *enc;
} Fixture;

static void
fixture_set_up(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  f->graph = qkv_graph_new();
  f->params = qkv_params_new();
  f->b = (QkvBuilder){.graph = f->graph, .params = f->params, .seed = 1};
  f->tcfg = (QkvTransformerConfig)TCFG(11, 13, 8, 16, 2, 2, 0.1);
  f->gcfg = (QkvGruSeq2SeqConfig){11, 13, 6, 8, 2, 0.1};
  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2), btd = QKV_SHAPE(2, 5, 8);
  f->src = qkv_graph_input(f->graph, "src", QKV_I32, &bt, &error);
  f->src_valid = qkv_graph_input(f->graph, "src_valid", QKV_I32, &bs, &error);
  f->dec_in = qkv_graph_input(f->graph, "dec_in", QKV_I32, &bt, &error);
  f->x = qkv_graph_input(f->graph, "x", QKV_F32, &btd, &error);
  f->labels = qkv_graph_input(f->graph, "labels", QKV_I32, &bt, &error);
  f->mask = qkv_graph_input(f->graph, "mask", QKV_F32, &bt, &error);
  /* data "empty": no encoder, for the tests that build the models' own. */
  if (data == NULL) {
    f->enc = qkv_build_transformer_encoder(&f->b, &f->tcfg, f->src, f->src_valid, &error);
    g_assert_no_error(error);
    g_assert_nonnull(f->enc);
  }
  qkv_graph_set_scope(f->graph, "user");
}

static void
fixture_tear_down(Fixture *f, gconstpointer data)
{
  qkv_graph_free(f->graph);
  qkv_params_free(f->params);
}

/* What a failed call must leave as it was. */
typedef struct {
  guint n_nodes, n_values, n_params;
  gchar *names; /* every parameter name with its shape, in store order */
  gchar *scope;
} Snapshot;

static gchar *
param_names(QkvParams *params)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    g_autofree gchar *shape = qkv_shape_to_string(qkv_param_shape(p));
    g_string_append_printf(s, "%s %s\n", qkv_param_name(p), shape);
  }
  return g_string_free(s, FALSE);
}

static Snapshot
snapshot(Fixture *f)
{
  const gchar *scope = qkv_graph_get_scope(f->graph);
  return (Snapshot){qkv_graph_n_nodes(f->graph), qkv_graph_n_values(f->graph),
                    qkv_params_size(f->params), param_names(f->params), g_strdup(scope)};
}

static void
check_failed(Fixture *f, Snapshot *before, QkvValue *result, GError *error, const gchar *pattern,
             const gchar *call)
{
  g_test_message("%s: %s", call, error ? error->message : "(no error)");
  if (result != NULL || error == NULL)
    g_error("%s: succeeded; it must fail with '%s'", call, pattern);
  if (!g_pattern_match_simple(pattern, error->message))
    g_error("%s: the error '%s' does not match '%s'", call, error->message, pattern);
  g_autofree gchar *names = param_names(f->params);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, before->n_nodes);
  g_assert_cmpuint(qkv_graph_n_values(f->graph), ==, before->n_values);
  g_assert_cmpuint(qkv_params_size(f->params), ==, before->n_params);
  g_assert_cmpstr(names, ==, before->names);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, before->scope);
  g_free(before->names);
  g_free(before->scope);
}

/* call (an expression using &error) fails with a message matching pattern
 * and changes nothing. */
#define ASSERT_FAILS(f, call, pattern)                                                             \
  do {                                                                                             \
    Snapshot before_ = snapshot(f);                                                                \
    GError *error = NULL;                                                                          \
    QkvValue *result_ = (call);                                                                    \
    check_failed((f), &before_, result_, error, (pattern), #call);                                 \
    g_clear_error(&error);                                                                         \
  } while (0)

/* A parameter the builder will want, present with the wrong shape. */
static void
add_wrong(Fixture *f, const gchar *name)
{
  QkvShape odd = QKV_SHAPE(97);
  g_autoptr(GError) error = NULL;
  g_assert_nonnull(qkv_params_add(f->params, name, &odd, &error));
}

static void
test_param(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvShape s = QKV_SHAPE(4);
  ASSERT_FAILS(f, qkv_build_param(b, "p", &s, "gaussian", 0, &error),
               "qkv_build_param: parameter 'p': unknown initialiser 'gaussian'");
  QkvShape huge = QKV_SHAPE(G_MAXINT64 / 2, G_MAXINT64 / 2);
  ASSERT_FAILS(f, qkv_build_param(b, "p", &huge, "zeros", 0, &error),
               "parameter 'p': invalid shape*");
  add_wrong(f, "q");
  ASSERT_FAILS(f, qkv_build_param(b, "q", &s, "zeros", 0, &error),
               "parameter 'q' exists with shape (97), the model needs (4)");
}

static void
test_linear(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_linear(b, "lin", f->x, 0, TRUE, &error),
               "qkv_build_linear: out_features is 0, it must be > 0");
  /* The weight and the product are added before the bias is found wrong. */
  add_wrong(f, "lin.bias");
  ASSERT_FAILS(f, qkv_build_linear(b, "lin", f->x, 4, TRUE, &error),
               "parameter 'lin.bias' exists with shape (97)*");
  g_assert_null(qkv_params_lookup(f->params, "lin.weight"));
}

static void
test_embedding(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_embedding(b, "emb", f->src, 0, 4, &error),
               "qkv_build_embedding: num is 0, it must be > 0");
  ASSERT_FAILS(f, qkv_build_embedding(b, "emb", f->src, 10, -3, &error),
               "qkv_build_embedding: dim is -3, it must be > 0");
  /* f32 ids: the op refuses them after the table was created. */
  ASSERT_FAILS(f, qkv_build_embedding(b, "emb", f->x, 10, 4, &error), "*");
  g_assert_null(qkv_params_lookup(f->params, "emb.weight"));
}

static void
test_mha(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvValue *x = f->x;
  QkvValue *w = x; /* must come back NULL */
  ASSERT_FAILS(f, qkv_build_mha(b, "att", x, x, x, 8, 0, NULL, FALSE, 0.0, &w, &error),
               "qkv_build_mha: num_heads is 0, it must be > 0");
  g_assert_null(w);
  ASSERT_FAILS(f, qkv_build_mha(b, "att", x, x, x, 8, 3, NULL, FALSE, 0.0, NULL, &error),
               "qkv_build_mha: num_heads (3) does not divide num_hiddens (8)");
  ASSERT_FAILS(f, qkv_build_mha(b, "att", x, x, x, 0, 2, NULL, FALSE, 0.0, NULL, &error),
               "qkv_build_mha: num_hiddens is 0, it must be > 0");
  ASSERT_FAILS(f, qkv_build_mha(b, "att", x, x, x, 8, 2, NULL, FALSE, 1.0, NULL, &error),
               "qkv_build_mha: dropout is 1, it must be in [0, 1)");
  add_wrong(f, "att.W_o.weight");
  w = x;
  ASSERT_FAILS(f, qkv_build_mha(b, "att", x, x, x, 8, 2, NULL, FALSE, 0.0, &w, &error),
               "parameter 'att.W_o.weight' exists*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "att.W_q.weight"));
}

static void
test_ffn(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_ffn(b, "ffn", f->x, 0, 8, &error),
               "qkv_build_ffn: ffn_hiddens is 0, it must be > 0");
  ASSERT_FAILS(f, qkv_build_ffn(b, "ffn", f->x, 16, -1, &error),
               "qkv_build_ffn: out_features is -1, it must be > 0");
  add_wrong(f, "ffn.dense2.bias");
  ASSERT_FAILS(f, qkv_build_ffn(b, "ffn", f->x, 16, 8, &error),
               "parameter 'ffn.dense2.bias' exists*");
}

static void
test_addnorm(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_addnorm(b, "an", f->x, f->x, -0.5, &error),
               "qkv_build_addnorm: dropout is -0.5, it must be in [0, 1)");
  ASSERT_FAILS(f, qkv_build_addnorm(b, "an", f->x, f->x, NAN, &error),
               "qkv_build_addnorm: dropout is nan, it must be in [0, 1)");
  /* The norm's parameters exist before the sum finds the shapes differ. */
  ASSERT_FAILS(f, qkv_build_addnorm(b, "an", f->x, f->mask, 0.1, &error), "*");
  g_assert_null(qkv_params_lookup(f->params, "an.ln.weight"));
}

static void
test_norms(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_layer_norm(b, "ln", f->x, -1, TRUE, TRUE, &error),
               "qkv_build_layer_norm: eps is -1, it must be >= 0");
  ASSERT_FAILS(f, qkv_build_rms_norm(b, "rms", f->x, NAN, &error),
               "qkv_build_rms_norm: eps is nan, it must be >= 0");
  /* The weight exists before the bias is found wrong. */
  add_wrong(f, "ln.bias");
  ASSERT_FAILS(f, qkv_build_layer_norm(b, "ln", f->x, 1e-5, TRUE, TRUE, &error),
               "parameter 'ln.bias' exists with shape (97)*");
  g_assert_null(qkv_params_lookup(f->params, "ln.weight"));
  add_wrong(f, "rms.weight");
  ASSERT_FAILS(f, qkv_build_rms_norm(b, "rms", f->x, 1e-6, &error),
               "parameter 'rms.weight' exists with shape (97)*");
  /* i32 input: the op refuses it after the weight was made */
  ASSERT_FAILS(f, qkv_build_rms_norm(b, "rms2", f->labels, 1e-6, &error), "*expected f32*");
  g_assert_null(qkv_params_lookup(f->params, "rms2.weight"));
}

static void
test_mha_bias(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvValue *x = f->x, *w = x;
  QkvMhaOptions o = {.bias = TRUE, .dropout = -0.1};
  ASSERT_FAILS(f, qkv_build_mha_full(b, "att", x, x, x, 8, 2, &o, &w, &error),
               "qkv_build_mha: dropout is -0.1, it must be in [0, 1)");
  g_assert_null(w);
  o.dropout = 0;
  add_wrong(f, "att.W_v.bias");
  w = x;
  ASSERT_FAILS(f, qkv_build_mha_full(b, "att", x, x, x, 8, 2, &o, &w, &error),
               "parameter 'att.W_v.bias' exists*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "att.W_q.weight"));
  g_assert_null(qkv_params_lookup(f->params, "att.W_q.bias"));
}

static void
test_ffn_activation(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  ASSERT_FAILS(f, qkv_build_ffn_activation(b, "ffn", f->x, 16, 8, 99, &error),
               "qkv_build_ffn: activation is 99, it must be QKV_ACTIVATION_RELU, "
               "QKV_ACTIVATION_GELU, QKV_ACTIVATION_GELU_TANH or QKV_ACTIVATION_SILU");
  add_wrong(f, "ffn.dense2.bias");
  ASSERT_FAILS(f, qkv_build_ffn_activation(b, "ffn", f->x, 16, 8, QKV_ACTIVATION_GELU, &error),
               "parameter 'ffn.dense2.bias' exists*");
  g_assert_null(qkv_params_lookup(f->params, "ffn.dense1.weight"));
}

static void
test_transformer_encoder(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  const gchar *me = "qkv_build_transformer_encoder: ";
  const struct {
    QkvTransformerConfig cfg;
    const gchar *reason;
  } bad[] = {
      {TCFG(11, 13, 8, 16, 0, 2, 0.1), "cfg->num_heads is 0, it must be > 0"},
      {TCFG(11, 13, 8, 16, 3, 2, 0.1), "cfg->num_heads (3) does not divide cfg->num_hiddens (8)"},
      {TCFG(11, 13, 8, 16, 2, -1, 0.1), "cfg->num_layers is -1, it must be > 0"},
      {TCFG(11, 13, 8, 16, 2, 0, 0.1), "cfg->num_layers is 0, it must be > 0"},
      {TCFG(0, 13, 8, 16, 2, 2, 0.1), "cfg->src_vocab is 0, it must be > 0"},
      {TCFG(11, 13, 0, 16, 2, 2, 0.1), "cfg->num_hiddens is 0, it must be > 0"},
      {TCFG(11, 13, 8, 0, 2, 2, 0.1), "cfg->ffn_hiddens is 0, it must be > 0"},
      {TCFG(11, 13, 8, 16, 2, 2, 1.5), "cfg->dropout is 1.5, it must be in [0, 1)"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree gchar *pattern = g_strconcat(me, bad[i].reason, NULL);
    ASSERT_FAILS(f, qkv_build_transformer_encoder(b, &bad[i].cfg, f->src, f->src_valid, &error),
                 pattern);
  }
  QkvTransformerConfig act = f->tcfg;
  act.ffn_activation = 7;
  ASSERT_FAILS(f, qkv_build_transformer_encoder(b, &act, f->src, f->src_valid, &error),
               "qkv_build_transformer_encoder: cfg->ffn_activation is 7, it must be*");
  /* Pre-LN: the final norm fails, after every block. */
  QkvTransformerConfig pre = f->tcfg;
  pre.norm_first = TRUE;
  add_wrong(f, "encoder.norm.bias");
  ASSERT_FAILS(f, qkv_build_transformer_encoder(b, &pre, f->src, f->src_valid, &error),
               "parameter 'encoder.norm.bias' exists*");
  /* The second block's FFN fails, after the embedding and the first block. */
  add_wrong(f, "encoder.blks.block1.ffn.dense2.bias");
  ASSERT_FAILS(f, qkv_build_transformer_encoder(b, &f->tcfg, f->src, f->src_valid, &error),
               "parameter 'encoder.blks.block1.ffn.dense2.bias' exists*");
}

static void
test_transformer_decoder(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvTransformerConfig cfg = f->tcfg;
  QkvValue *w = f->x;
  cfg.tgt_vocab = 0;
  ASSERT_FAILS(f,
               qkv_build_transformer_decoder(b, &cfg, f->dec_in, f->enc, f->src_valid, &w, &error),
               "qkv_build_transformer_decoder: cfg->tgt_vocab is 0, it must be > 0");
  g_assert_null(w);
  cfg = f->tcfg;
  cfg.num_layers = -1;
  ASSERT_FAILS(
      f, qkv_build_transformer_decoder(b, &cfg, f->dec_in, f->enc, f->src_valid, NULL, &error),
      "qkv_build_transformer_decoder: cfg->num_layers is -1, it must be > 0");
  cfg = f->tcfg;
  cfg.num_heads = 5;
  ASSERT_FAILS(
      f, qkv_build_transformer_decoder(b, &cfg, f->dec_in, f->enc, f->src_valid, NULL, &error),
      "qkv_build_transformer_decoder: cfg->num_heads (5) does not divide*");
  /* The last parameter of all: every block is built, then rolled back. */
  add_wrong(f, "decoder.dense.bias");
  w = f->x;
  ASSERT_FAILS(
      f, qkv_build_transformer_decoder(b, &f->tcfg, f->dec_in, f->enc, f->src_valid, &w, &error),
      "parameter 'decoder.dense.bias' exists*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "decoder.embedding.weight"));
}

static void
test_gru(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvValue *h_n = f->x;
  ASSERT_FAILS(f, qkv_build_gru(b, "rnn", f->x, NULL, 0, 2, 0.0, &h_n, &error),
               "qkv_build_gru: hidden is 0, it must be > 0");
  g_assert_null(h_n);
  ASSERT_FAILS(f, qkv_build_gru(b, "rnn", f->x, NULL, 4, -1, 0.0, NULL, &error),
               "qkv_build_gru: num_layers is -1, it must be > 0");
  ASSERT_FAILS(f, qkv_build_gru(b, "rnn", f->x, NULL, 4, 2, 1.0, NULL, &error),
               "qkv_build_gru: dropout is 1, it must be in [0, 1)");
  ASSERT_FAILS(f, qkv_build_gru(b, "rnn", f->mask, NULL, 4, 2, 0.0, NULL, &error),
               "qkv_build_gru 'rnn': x must be (T, B, in)*");
  ASSERT_FAILS(
      f, qkv_build_gru(b, "rnn", f->x, f->x, 4, 2, 0.0, NULL, &error),
      "qkv_build_gru 'rnn': h0 must be (num_layers, B, hidden) = (2, 5, 4), got (2, 5, 8)");
  add_wrong(f, "rnn.bias_hh_l1");
  h_n = f->x;
  ASSERT_FAILS(f, qkv_build_gru(b, "rnn", f->x, NULL, 4, 2, 0.0, &h_n, &error),
               "parameter 'rnn.bias_hh_l1' exists*");
  g_assert_null(h_n);
  g_assert_null(qkv_params_lookup(f->params, "rnn.weight_ih_l0"));
}

static void
test_bahdanau(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  const gchar *me = "qkv_build_bahdanau_seq2seq: ";
  const struct {
    QkvGruSeq2SeqConfig cfg;
    const gchar *reason;
  } bad[] = {
      {{0, 13, 6, 8, 2, 0.1}, "cfg->src_vocab is 0, it must be > 0"},
      {{11, 0, 6, 8, 2, 0.1}, "cfg->tgt_vocab is 0, it must be > 0"},
      {{11, 13, 0, 8, 2, 0.1}, "cfg->embed_size is 0, it must be > 0"},
      {{11, 13, 6, -8, 2, 0.1}, "cfg->num_hiddens is -8, it must be > 0"},
      {{11, 13, 6, 8, 0, 0.1}, "cfg->num_layers is 0, it must be > 0"},
      {{11, 13, 6, 8, 2, 1.0}, "cfg->dropout is 1, it must be in [0, 1)"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree gchar *pattern = g_strconcat(me, bad[i].reason, NULL);
    ASSERT_FAILS(
        f,
        qkv_build_bahdanau_seq2seq(b, &bad[i].cfg, f->src, f->src_valid, f->dec_in, NULL, &error),
        pattern);
  }
  ASSERT_FAILS(
      f, qkv_build_bahdanau_seq2seq(b, &f->gcfg, f->src, f->src_valid, f->src_valid, NULL, &error),
      "qkv_build_bahdanau_seq2seq: dec_in must be (B, T)*");
  add_wrong(f, "decoder.dense.bias");
  QkvValue *w = f->x;
  ASSERT_FAILS(f,
               qkv_build_bahdanau_seq2seq(b, &f->gcfg, f->src, f->src_valid, f->dec_in, &w, &error),
               "parameter 'decoder.dense.bias' exists*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "encoder.rnn.weight_ih_l0"));
}

static void
test_seq2seq_loss(Fixture *f, gconstpointer data)
{
  /* labels as f32: the loss refuses them. */
  ASSERT_FAILS(f, qkv_build_seq2seq_loss(f->enc, f->mask, f->mask, &error), "*");
}

static void
test_nw_regression(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) setup_error = NULL;
  QkvShape n = QKV_SHAPE(3), nm = QKV_SHAPE(3, 4), bad = QKV_SHAPE(3, 5);
  QkvValue *q = qkv_graph_input(f->graph, "q", QKV_F32, &n, &setup_error);
  QkvValue *k = qkv_graph_input(f->graph, "k", QKV_F32, &nm, &setup_error);
  QkvValue *k_bad = qkv_graph_input(f->graph, "k_bad", QKV_F32, &bad, &setup_error);
  g_assert_no_error(setup_error);
  QkvValue *w = f->x;
  ASSERT_FAILS(f, qkv_build_nw_regression(f->graph, f->params, "nw.", k, k, k, 0, &w, &error),
               "qkv_build_nw_regression: queries must have shape (n), got (3, 4)");
  g_assert_null(w);
  /* The width is created and used before the keys are found wrong. */
  ASSERT_FAILS(f, qkv_build_nw_regression(f->graph, f->params, "nw.", q, k, k_bad, 0, NULL, &error),
               "*");
  g_assert_null(qkv_params_lookup(f->params, "nw.w"));
  QkvValue *out = qkv_build_nw_regression(f->graph, f->params, "nw.", q, k, k, 0, &w, &setup_error);
  g_assert_no_error(setup_error);
  g_assert_nonnull(out);
  g_assert_nonnull(w);
}

/* The builders still build, set their out-parameters, and keep the
 * caller's scope. */
static void
test_success(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  QkvValue *w = NULL, *h_n = NULL;
  guint n = qkv_params_size(f->params);
  QkvValue *logits =
      qkv_build_transformer_decoder(b, &f->tcfg, f->dec_in, f->enc, f->src_valid, &w, &error);
  g_assert_no_error(error);
  g_assert_nonnull(logits);
  g_assert_nonnull(w);
  g_assert_cmpuint(qkv_params_size(f->params), >, n);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
  QkvValue *y = qkv_build_gru(b, "rnn", f->x, NULL, 4, 2, 0.0, &h_n, &error);
  g_assert_no_error(error);
  g_assert_nonnull(y);
  g_assert_nonnull(h_n);
  g_assert_cmpstr(qkv_graph_get_scope(f->graph), ==, "user");
}

/* The marks themselves: inputs, parameter values, constants, nodes and a
 * backward pass added after a mark all go, and names can be used again. */
static void
test_marks(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  g_assert_nonnull(qkv_params_add(params, "a", &s, &error));
  QkvValue *a = qkv_graph_param(g, params, "a", &error);
  QkvValue *y = qkv_mul(x, a, &error);
  g_assert_no_error(error);

  QkvGraphMark gm;
  QkvParamsMark pm;
  qkv_graph_mark(g, &gm);
  qkv_params_mark(params, &pm);
  guint nodes = qkv_graph_n_nodes(g), values = qkv_graph_n_values(g);

  QkvValue *x2 = qkv_graph_input(g, "x2", QKV_F32, &s, &error);
  g_assert_nonnull(qkv_params_add(params, "b", &s, &error));
  QkvValue *bv = qkv_graph_param(g, params, "b", &error);
  QkvValue *z = qkv_add(qkv_mul(y, bv, &error), x2, &error);
  QkvValue *loss = qkv_sum(z, NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  g_assert_nonnull(qkv_graph_gradient(g, a));

  qkv_graph_rollback(g, &gm);
  qkv_params_rollback(params, &pm);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, nodes);
  g_assert_cmpuint(qkv_graph_n_values(g), ==, values);
  g_assert_null(qkv_graph_lookup_input(g, "x2"));
  g_assert_null(qkv_params_lookup(params, "b"));
  g_assert_cmpuint(qkv_params_size(params), ==, 1);
  g_assert_null(qkv_graph_gradient(g, a));

  /* The graph works as before: the same names again, a backward pass, a plan. */
  x2 = qkv_graph_input(g, "x2", QKV_F32, &s, &error);
  g_assert_nonnull(qkv_params_add(params, "b", &s, &error));
  bv = qkv_graph_param(g, params, "b", &error);
  z = qkv_add(qkv_mul(y, bv, &error), x2, &error);
  loss = qkv_sum(z, NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, NULL, &error);
  g_assert_no_error(error);
  g_assert_nonnull(plan);
}

static void
assert_shape(QkvValue *v, QkvShape want)
{
  g_assert_nonnull(v);
  g_autofree gchar *got = qkv_shape_to_string(qkv_value_shape(v));
  g_autofree gchar *exp = qkv_shape_to_string(&want);
  g_assert_cmpstr(got, ==, exp);
}

/* Every row (last axis) of t sums to 1, within f32 rounding. */
static void
assert_rows_sum_to_one(const QkvTensor *t)
{
  gint64 n = qkv_tensor_dim(t, -1), rows = qkv_tensor_numel(t) / n;
  for (gint64 r = 0; r < rows; r++) {
    double sum = 0;
    for (gint64 j = 0; j < n; j++)
      sum += qkv_tensor_get(t, r * n + j);
    g_assert_cmpfloat_with_epsilon(sum, 1.0, 1e-5);
  }
}

/* Every block's attention weights come out, with the right shapes, and they
 * are attention weights: rows sum to 1, padding and the future get none. */
static void
test_transformer_taps(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvBuilder *b = &f->b;
  QkvValue *enc_self[2], *dec_self[2], *dec_cross[2];
  QkvTransformerTaps etaps = {.self_weights = enc_self};
  QkvValue *enc =
      qkv_build_transformer_encoder_taps(b, &f->tcfg, f->src, f->src_valid, &etaps, &error);
  QkvTransformerTaps dtaps = {.self_weights = dec_self, .cross_weights = dec_cross};
  QkvValue *logits =
      qkv_build_transformer_decoder_taps(b, &f->tcfg, f->dec_in, enc, f->src_valid, &dtaps, &error);
  g_assert_no_error(error);
  g_assert_nonnull(logits);
  for (gint i = 0; i < 2; i++) {
    assert_shape(enc_self[i], QKV_SHAPE(2, 2, 5, 5));
    assert_shape(dec_self[i], QKV_SHAPE(2, 2, 5, 5));
    assert_shape(dec_cross[i], QKV_SHAPE(2, 2, 5, 5));
  }
  g_assert_true(enc_self[0] != enc_self[1] && dec_cross[0] != dec_cross[1]);

  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2);
  g_autoptr(QkvTensor) src =
      qkv_tensor_new_i32(&bt, (const gint32[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  g_autoptr(QkvTensor) valid = qkv_tensor_new_i32(&bs, (const gint32[]){5, 3});
  const gchar *names[] = {"src", "src_valid", "dec_in"};
  QkvTensor *inputs[] = {src, valid, src};
  QkvValue *outs[] = {enc_self[0], dec_self[0], dec_cross[1]};
  QkvTensor *res[3];
  g_assert_true(qkv_graph_eval(f->graph, names, inputs, 3, outs, res, 3, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < 3; i++)
    assert_rows_sum_to_one(res[i]);
  /* batch 1 has 3 valid source positions; decoder position t sees 0..t */
  for (gint h = 0; h < 2; h++)
    for (gint q = 0; q < 5; q++)
      for (gint k = 0; k < 5; k++) {
        gint64 at = ((1 * 2 + h) * 5 + q) * 5 + k;
        if (k >= 3) {
          g_assert_cmpfloat(qkv_tensor_get(res[0], at), <, 1e-6);
          g_assert_cmpfloat(qkv_tensor_get(res[2], at), <, 1e-6);
        }
        if (k > q)
          g_assert_cmpfloat(qkv_tensor_get(res[1], at), <, 1e-6);
      }
  for (guint i = 0; i < 3; i++)
    qkv_tensor_free(res[i]);

  /* A failure leaves every slot asked for NULL. */
  QkvParams *other = qkv_params_new();
  QkvBuilder b2 = {.graph = f->graph, .params = other, .seed = 1};
  QkvShape odd = QKV_SHAPE(97);
  g_assert_nonnull(qkv_params_add(other, "decoder.dense.bias", &odd, &error));
  ASSERT_FAILS(f,
               qkv_build_transformer_decoder_taps(&b2, &f->tcfg, f->dec_in, enc, f->src_valid,
                                                  &dtaps, &error),
               "parameter 'decoder.dense.bias' exists*");
  for (gint i = 0; i < 2; i++)
    g_assert_true(dec_self[i] == NULL && dec_cross[i] == NULL);
  qkv_params_free(other);
}

static void
test_bahdanau_taps(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  QkvSeq2SeqTaps taps;
  QkvValue *logits = qkv_build_bahdanau_seq2seq_taps(&f->b, &f->gcfg, f->src, f->src_valid,
                                                     f->dec_in, &taps, &error);
  g_assert_no_error(error);
  g_assert_nonnull(logits);
  assert_shape(taps.enc_outputs, QKV_SHAPE(2, 5, 8));
  assert_shape(taps.enc_state, QKV_SHAPE(2, 2, 8));
  assert_shape(taps.attention_weights, QKV_SHAPE(2, 5, 5));
  /* the last layer's final state is the encoder's output at the last step */
  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2);
  g_autoptr(QkvTensor) src =
      qkv_tensor_new_i32(&bt, (const gint32[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  g_autoptr(QkvTensor) valid = qkv_tensor_new_i32(&bs, (const gint32[]){5, 2});
  const gchar *names[] = {"src", "src_valid", "dec_in"};
  QkvTensor *inputs[] = {src, valid, src};
  QkvValue *outs[] = {taps.enc_outputs, taps.enc_state, taps.attention_weights};
  QkvTensor *res[3];
  g_assert_true(qkv_graph_eval(f->graph, names, inputs, 3, outs, res, 3, &error));
  for (gint bi = 0; bi < 2; bi++)
    for (gint h = 0; h < 8; h++)
      g_assert_cmpfloat(qkv_tensor_get(res[0], (bi * 5 + 4) * 8 + h), ==,
                        qkv_tensor_get(res[1], (1 * 2 + bi) * 8 + h));
  assert_rows_sum_to_one(res[2]);
  for (guint i = 0; i < 3; i++)
    qkv_tensor_free(res[i]);

  QkvParams *other = qkv_params_new();
  QkvBuilder b2 = {.graph = f->graph, .params = other, .seed = 1};
  QkvShape odd = QKV_SHAPE(97);
  g_assert_nonnull(qkv_params_add(other, "decoder.dense.bias", &odd, &error));
  ASSERT_FAILS(f,
               qkv_build_bahdanau_seq2seq_taps(&b2, &f->gcfg, f->src, f->src_valid, f->dec_in,
                                               &taps, &error),
               "parameter 'decoder.dense.bias' exists*");
  g_assert_true(taps.enc_outputs == NULL && taps.enc_state == NULL &&
                taps.attention_weights == NULL);
  qkv_params_free(other);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
#define ADD(path, func, data)                                                                      \
  g_test_add(path, Fixture, data, fixture_set_up, func, fixture_tear_down)
  ADD("/builders/param", test_param, NULL);
  ADD("/builders/linear", test_linear, NULL);
  ADD("/builders/embedding", test_embedding, NULL);
  ADD("/builders/mha", test_mha, NULL);
  ADD("/builders/ffn", test_ffn, NULL);
  ADD("/builders/addnorm", test_addnorm, NULL);
  ADD("/builders/norms", test_norms, NULL);
  ADD("/builders/mha-bias", test_mha_bias, NULL);
  ADD("/builders/ffn-activation", test_ffn_activation, NULL);
  ADD("/builders/transformer-encoder", test_transformer_encoder, "empty");
  ADD("/builders/transformer-decoder", test_transformer_decoder, NULL);
  ADD("/builders/gru", test_gru, NULL);
  ADD("/builders/bahdanau-seq2seq", test_bahdanau, "empty");
  ADD("/builders/seq2seq-loss", test_seq2seq_loss, NULL);
  ADD("/builders/nw-regression", test_nw_regression, NULL);
  ADD("/builders/success", test_success, NULL);
  ADD("/builders/transformer-taps", test_transformer_taps, "empty");
  ADD("/builders/bahdanau-taps", test_bahdanau_taps, "empty");
#undef ADD
  g_test_add_func("/builders/marks", test_marks);
  return g_test_run();
}
