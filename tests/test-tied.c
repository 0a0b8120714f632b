/* test-tied.c: tied embeddings in the Transformer builders
 * (QkvTransformerConfig.tie_embeddings): which parameters exist, gradients
 * of the shared matrix against finite differences (the sum over every use),
 * one tensor for it in a checkpoint, and configs refused. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <glib/gstdio.h>
#include <qkv/qkv-checkpoint.h>

#define B 2
#define T 4
#define D 8
#define FFN 12
#define HEADS 2

static QkvTransformerConfig
config(gint64 src_vocab, gint64 tgt_vocab, QkvTieEmbeddings tie)
{
  return (QkvTransformerConfig){.src_vocab = src_vocab,
                                .tgt_vocab = tgt_vocab,
                                .num_hiddens = D,
                                .ffn_hiddens = FFN,
                                .num_heads = HEADS,
                                .num_layers = 2,
                                .dropout = 0.0,
                                .tie_embeddings = tie};
}

/* The training graph of the Transformer with cfg: returns the loss, and the
 * logits in *logits (may be NULL). */
static QkvValue *
build(QkvGraph *g, QkvParams *params, const QkvTransformerConfig *cfg, QkvValue **logits,
      GError **error)
{
  QkvBuilder b = {.graph = g, .params = params, .seed = 21, .xavier_linear = TRUE};
  QkvShape bt = QKV_SHAPE(B, T), bs = QKV_SHAPE(B);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, error);
  QkvValue *tgt_valid = qkv_graph_input(g, "tgt_valid", QKV_I32, &bs, error);
  QkvValue *enc = qkv_build_transformer_encoder(&b, cfg, src, src_valid, error);
  QkvValue *out = qkv_build_transformer_decoder(&b, cfg, dec_in, enc, src_valid, NULL, error);
  if (logits != NULL)
    *logits = out;
  return qkv_build_seq2seq_loss_lens(out, labels, tgt_valid, NULL, error);
}

static gint64
count_params(const QkvTransformerConfig *cfg, QkvParams **keep)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvParams *params = qkv_params_new();
  g_assert_nonnull(build(g, params, cfg, NULL, &error));
  g_assert_no_error(error);
  gint64 n = qkv_params_numel(params);
  if (keep != NULL)
    *keep = params;
  else
    qkv_params_free(params);
  return n;
}

static void
test_params(void)
{
  const gint64 sv = 9, tv = 11;
  QkvTransformerConfig none = config(sv, tv, QKV_TIE_NONE);
  QkvTransformerConfig dec = config(sv, tv, QKV_TIE_DECODER);
  QkvTransformerConfig joint_none = config(tv, tv, QKV_TIE_NONE);
  QkvTransformerConfig joint = config(tv, tv, QKV_TIE_ALL);
  QkvParams *p = NULL;
  gint64 n_none = count_params(&none, NULL);
  gint64 n_dec = count_params(&dec, &p);
  /* one (tgt_vocab, d) matrix fewer: the bias stays */
  g_assert_cmpint(n_dec, ==, n_none - tv * D);
  g_assert_null(qkv_params_lookup(p, "decoder.dense.weight"));
  g_assert_nonnull(qkv_params_lookup(p, "decoder.dense.bias"));
  g_assert_nonnull(qkv_params_lookup(p, "decoder.embedding.weight"));
  g_assert_nonnull(qkv_params_lookup(p, "encoder.embedding.weight"));
  qkv_params_free(p);
  /* a joint vocabulary: two matrices fewer */
  gint64 n_joint_none = count_params(&joint_none, NULL);
  gint64 n_joint = count_params(&joint, &p);
  g_assert_cmpint(n_joint, ==, n_joint_none - 2 * tv * D);
  g_assert_null(qkv_params_lookup(p, "decoder.dense.weight"));
  g_assert_null(qkv_params_lookup(p, "decoder.embedding.weight"));
  g_assert_nonnull(qkv_params_lookup(p, "decoder.dense.bias"));
  QkvParam *e = qkv_params_lookup(p, "encoder.embedding.weight");
  g_assert_nonnull(e);
  g_assert_cmpint(qkv_param_shape(e)->dims[0], ==, tv);
  g_assert_cmpint(qkv_param_shape(e)->dims[1], ==, D);
  qkv_params_free(p);
}

/* The gradient of the shared matrix is the sum over its uses — encoder
 * input, decoder input, output projection — so finite differences of the
 * loss in each of its elements must match it. */
static void
check_gradients(QkvTieEmbeddings tie, const gchar *shared)
{
  g_autoptr(GError) error = NULL;
  const gint64 v = 7;
  QkvTransformerConfig cfg = config(v, v, tie);
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *loss = build(g, params, &cfg, NULL, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, NULL, &error);
  g_assert_no_error(error);
  QkvShape bt = QKV_SHAPE(B, T), bs = QKV_SHAPE(B);
  /* ids cover the vocabulary, so every row of the matrix gets some use */
  g_autoptr(QkvTensor) src = qkv_tensor_new_i32(&bt, (const gint32[]){0, 1, 2, 3, 4, 5, 6, 1});
  g_autoptr(QkvTensor) dec_in = qkv_tensor_new_i32(&bt, (const gint32[]){6, 5, 4, 3, 2, 1, 0, 2});
  g_autoptr(QkvTensor) labels = qkv_tensor_new_i32(&bt, (const gint32[]){5, 4, 3, 2, 1, 0, 6, 3});
  g_autoptr(QkvTensor) src_valid = qkv_tensor_new_i32(&bs, (const gint32[]){4, 3});
  g_autoptr(QkvTensor) tgt_valid = qkv_tensor_new_i32(&bs, (const gint32[]){3, 4});
  g_assert_true(qkv_plan_bind(plan, "src", src, &error) &&
                qkv_plan_bind(plan, "src_valid", src_valid, &error) &&
                qkv_plan_bind(plan, "dec_in", dec_in, &error) &&
                qkv_plan_bind(plan, "labels", labels, &error) &&
                qkv_plan_bind(plan, "tgt_valid", tgt_valid, &error));
  g_assert_no_error(error);
  /* The step: the embeddings are N(0, 1) and scaled by √d on the way in, so
   * the loss curves fast along them (at 1e-2 the truncation error is several
   * percent, untied too); at 1e-3 the f32 rounding of the loss takes over.
   * 3e-3 sits between, within 1% here. The floor 5e-2 (an absolute 1e-3
   * for small elements) is above the noise of a difference of two f32
   * losses over 2 eps, summed in a thread-dependent order. */
  const double eps = 3e-3;
  qkv_test_param_fd(plan, params, shared, v * D, eps, 2e-2, 5e-2, 1.0);
  qkv_test_param_fd(plan, params, "decoder.dense.bias", v, eps, 2e-2, 5e-2, 1.0);
  /* the check catches a gradient 10% off */
  g_assert_cmpfloat(qkv_test_param_fd(plan, params, shared, v * D, eps, 2e-2, 5e-2, 1.1), >, 2e-2);
}

static void
test_gradients_joint(void)
{
  check_gradients(QKV_TIE_ALL, "encoder.embedding.weight");
}

static void
test_gradients_decoder(void)
{
  check_gradients(QKV_TIE_DECODER, "decoder.embedding.weight");
}

/* A checkpoint holds the shared matrix once, under its name, and loads into
 * a tied model only. */
static void
test_checkpoint(void)
{
  g_autoptr(GError) error = NULL;
  QkvTransformerConfig joint = config(7, 7, QKV_TIE_ALL);
  QkvParams *params = NULL;
  count_params(&joint, &params);
  g_autofree gchar *dir = g_dir_make_tmp("qkv-tied-XXXXXX", &error);
  g_assert_no_error(error);
  g_autofree gchar *path = g_build_filename(dir, "tied.safetensors", NULL);
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, NULL, &error));
  g_autoptr(GHashTable) file = qkv_safetensors_read(path, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(g_hash_table_size(file), ==, qkv_params_size(params));
  GHashTableIter it;
  gpointer key, value;
  guint n_vd = 0;
  g_hash_table_iter_init(&it, file);
  while (g_hash_table_iter_next(&it, &key, &value)) {
    const QkvShape *s = qkv_tensor_shape(value);
    if (s->rank == 2 && s->dims[0] == 7 && s->dims[1] == D) {
      g_assert_cmpstr(key, ==, "encoder.embedding.weight");
      n_vd++;
    }
  }
  g_assert_cmpuint(n_vd, ==, 1);
  QkvTensor *saved = g_hash_table_lookup(file, "encoder.embedding.weight");
  qkv_assert_tensor_close(
      saved, qkv_param_value(qkv_params_lookup(params, "encoder.embedding.weight")), 0);

  /* into a fresh tied model: strict load; into an untied one: refused */
  QkvParams *again = NULL;
  count_params(&joint, &again);
  g_assert_true(
      qkv_checkpoint_load(path, again, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, &error));
  g_assert_no_error(error);
  qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(again, "encoder.embedding.weight")),
                          saved, 0);
  QkvTransformerConfig untied = config(7, 7, QKV_TIE_NONE);
  QkvParams *other = NULL;
  count_params(&untied, &other);
  g_assert_false(
      qkv_checkpoint_load(path, other, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_test_message("%s", error->message);
  g_remove(path);
  g_rmdir(dir);
  qkv_params_free(params);
  qkv_params_free(again);
  qkv_params_free(other);
}

static void
test_bad_config(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  QkvShape bt = QKV_SHAPE(B, T), bs = QKV_SHAPE(B), btd = QKV_SHAPE(B, T, D);
  QkvValue *src = qkv_test_input(g, "src", QKV_I32, bt);
  QkvValue *valid = qkv_test_input(g, "valid", QKV_I32, bs);
  QkvValue *enc = qkv_test_input(g, "enc", QKV_F32, btd);
  guint nodes = qkv_graph_n_nodes(g);
  const struct {
    QkvTransformerConfig cfg;
    const gchar *pattern;
  } bad[] = {
      {config(9, 11, QKV_TIE_ALL),
       "*: cfg->tie_embeddings is QKV_TIE_ALL, which needs one joint vocabulary, but "
       "cfg->src_vocab (9) and cfg->tgt_vocab (11) differ"},
      {config(9, 9, 3), "*: cfg->tie_embeddings is 3, it must be QKV_TIE_NONE, *"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    GError *error = NULL;
    g_assert_null(qkv_build_transformer_encoder(&b, &bad[i].cfg, src, valid, &error));
    g_assert_nonnull(error);
    g_assert_true(g_pattern_match_simple("qkv_build_transformer_encoder*", error->message));
    g_assert_true(g_pattern_match_simple(bad[i].pattern, error->message));
    g_clear_error(&error);
    QkvValue *w = enc;
    g_assert_null(qkv_build_transformer_decoder(&b, &bad[i].cfg, src, enc, valid, &w, &error));
    g_assert_null(w);
    g_assert_nonnull(error);
    g_test_message("%s", error->message);
    g_assert_true(g_pattern_match_simple("qkv_build_transformer_decoder*", error->message));
    g_assert_true(g_pattern_match_simple(bad[i].pattern, error->message));
    g_clear_error(&error);
  }
  /* the tied projection finds the bias wrong after everything else: all goes */
  QkvShape odd = QKV_SHAPE(97);
  g_autoptr(GError) error = NULL;
  g_assert_nonnull(qkv_params_add(params, "decoder.dense.bias", &odd, &error));
  QkvTransformerConfig dec = config(9, 11, QKV_TIE_DECODER);
  g_assert_null(qkv_build_transformer_decoder(&b, &dec, src, enc, valid, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, nodes);
  g_assert_cmpuint(qkv_params_size(params), ==, 1);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/tied/params", test_params);
  g_test_add_func("/tied/gradients-joint", test_gradients_joint);
  g_test_add_func("/tied/gradients-decoder", test_gradients_decoder);
  g_test_add_func("/tied/checkpoint", test_checkpoint);
  g_test_add_func("/tied/bad-config", test_bad_config);
  return g_test_run();
}
