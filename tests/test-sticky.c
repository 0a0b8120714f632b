/* test-sticky.c: errors are sticky. Every public function that takes a
 * GError ** and finds *error already set returns its failure value at once
 * (NULL, FALSE or 0), keeps that first error as it was, logs nothing, and
 * adds nothing to a graph or a parameter store.
 *
 * The list of such functions is read at run time from the public headers
 * (the headers of include/qkv in the source tree; G_TEST_SRCDIR is tests/), so that a
 * new function taking a GError ** fails /sticky/complete until the table of
 * CALL entries below calls it.
 *
 * Each CALL(fn, expr) calls fn once with otherwise valid arguments (a small
 * fixture: a graph with inputs, parameters and a state, builders, a compiled
 * plan, an optimizer, a checkpoint file, step decoders over trained-shape
 * parameters, ...) and error pointing to a GError set beforehand; expr is
 * TRUE when fn returned its failure value. Run with QKV_STICKY_VALID=1 to
 * make every call once with an empty error instead and list the calls that
 * fail then: that checks that the arguments are valid (a development aid,
 * not part of the suite). */
#include <string.h>
#include <glib/gstdio.h>
#include <qkv/qkv.h>
#include <qkv/qkv-checkpoint.h>
#include <qkv/qkv-dist.h>
#include <qkv/qkv-types.h>
#include "test-util.h"

/* ---- everything logged is counted ----------------------------------------- */

static guint n_logged;
static GString *logged;

static void
count_message(GLogLevelFlags level, const gchar *domain, const gchar *message)
{
  n_logged++;
  g_string_append_printf(logged, "[%s %d] %s\n", domain ? domain : "-", (int)level,
                         message ? message : "");
}

static GLogWriterOutput
counting_writer(GLogLevelFlags level, const GLogField *fields, gsize n_fields, gpointer user_data)
{
  const gchar *domain = NULL, *message = NULL;
  for (gsize i = 0; i < n_fields; i++) {
    if (g_str_equal(fields[i].key, "GLIB_DOMAIN"))
      domain = fields[i].value;
    else if (g_str_equal(fields[i].key, "MESSAGE"))
      message = fields[i].value;
  }
  count_message(level, domain, message);
  return G_LOG_WRITER_HANDLED;
}

static void
counting_handler(const gchar *domain, GLogLevelFlags level, const gchar *message, gpointer data)
{
  count_message(level, domain, message);
}

/* ---- the fixture ---------------------------------------------------------- */

typedef struct {
  QkvGraph *graph; /* the graph the graph-building calls add to */
  QkvParams *params;
  QkvBuilder b;
  /* Luong's seq2seq names its parameters as Bahdanau's does, with other
   * shapes: it builds into a store of its own */
  QkvParams *params2;
  QkvBuilder b2;
  /* inputs of graph: x, y (2, 3, 4) f32; kv (2, 5, 4) f32; lens (2) i32;
   * ids (2, 3) i32; tw (2, 3) f32; mask (3, 5) f32; nq (3), nk (3, 5) f32;
   * fresh (2, 2, 1, 2) f32; a state cache (2, 2, 6, 2) f32 */
  QkvValue *x, *y, *kv, *lens, *ids, *tw, *mask, *nq, *nk, *fresh, *cache;
  /* gather's index ids3 (2, 3, 2) i32 and a gradient g3 (2, 3, 2) f32 */
  QkvValue *ids3, *g3;
  /* parameters: w44 (4, 4), wv (1, 4), b4 (4), w84 (8, 4), w48 (4, 8), b8 (8),
   * emb (10, 4) */
  QkvValue *w44, *wv, *b4, *w84, *w48, *b8, *emb;
  QkvValue *biases[4];
  QkvValue *loss; /* sum of x: an f32 scalar */
  /* the out-value (weights, indices, h_n, ...) of the calls that have one:
   * set to a value before each call, NULL after it (a failure's out-values) */
  QkvValue *out;
  QkvGraphMark mark;
  QkvParamsMark params_mark;
  QkvShape s4, s34, s64, s234, s5234;
  gint64 fan_in, fan_out;
  gint perm[3], axes_all[3], axis0[1];
  QkvTransformerConfig tcfg;
  QkvGruSeq2SeqConfig gcfg;
  QkvLuongConfig lcfg;
  QkvLuongAttentionConfig lacfg;
  QkvPoolingClassifierConfig pcfg;
  QkvMhaOptions mha_options;
  QkvInit init_ones;
  /* a separate little graph and its compiled plan: input a (2, 2), state s
   * (2, 2), out = a + s */
  QkvGraph *pgraph;
  QkvValue *pa, *pstate, *pout;
  QkvPlan *plan;
  QkvGraphMark pmark;
  QkvTensor *ta, *tresult;
  QkvPlanOptions plan_options;
  /* a graph for the probe op whose shape rule calls qkv_shape_error() */
  QkvGraph *sgraph;
  QkvValue *sx;
  /* training */
  QkvOptimizer *opt;
  QkvOptimConfig sgd, adam;
  const gchar *select[2];
  GPtrArray *select_array; /* a sentinel for out-lists */
  QkvTensor *t34, *t4, *tw34;
  QkvCheckOptions check_options;
  double max_rel_err;
  gchar *dir, *checkpoint, *new_checkpoint;
  /* decoding */
  QkvParams *tparams, *gparams, *lparams;
  QkvStepDecoder *tdec, *gdec, *ldec;
  /* a plan with inputs "tokens" (2, 1), "positions" (2) and logits (2, 1, 4)
   * (an embedding of the positions), and its QkvPlanDecoder */
  QkvGraph *dgraph;
  QkvPlan *dplan, *dplan_spare; /* the spare for qkv_plan_decoder_new's call, whose decoder
                                 * binds its tensors and is freed: pdec's plan stays bound */
  QkvPlanDecoder *pdec;
  QkvTensor *src, *src_valid;
  QkvBeamOptions beam;
  QkvSampleOptions sample;
  QkvGenerateOptions generate;
  gint32 tokens[64], parents[64], prompt[2];
  gint lengths[8], prompt_lens[1];
  double scores[8];
  float logits[64];
  guint64 row_ids[2];
  /* plugins */
  gchar *plugin_path;
  QkvOpDef def;
} Fixture;

static Fixture fx;

static const gchar *const probe_inputs[] = {"x", NULL};
static const gchar *const probe_outputs[] = {"y", NULL};
static GError **probe_error;   /* the error qkv_shape_error() is given */
static gboolean probe_result;  /* what it returned */
static gboolean probe_reached; /* whether the shape rule ran */

static gboolean
probe_shape(QkvShapeCtx *ctx, GError **error)
{
  if (probe_error != NULL) {
    probe_reached = TRUE;
    probe_result = qkv_shape_error(ctx, probe_error, QKV_ERROR_SHAPE, "probe %d", 1);
  }
  ctx->out_shapes[0] = ctx->in_shapes[0];
  ctx->out_dtypes[0] = ctx->in_dtypes[0];
  return TRUE;
}

static void
identity_forward(const QkvKernelCtx *ctx)
{
  memcpy(ctx->out[0].data, ctx->in[0].data,
         qkv_shape_numel(&ctx->in[0].shape) * qkv_dtype_size(ctx->in[0].dtype));
}

static QkvOpDef
probe_def(const gchar *name)
{
  return (QkvOpDef){QKV_OP_DEF_INIT,
                    .name = name,
                    .doc = "the identity (tests/test-sticky.c)",
                    .min_inputs = 1,
                    .max_inputs = 1,
                    .input_names = probe_inputs,
                    .output_names = probe_outputs,
                    .shape = probe_shape,
                    .forward = identity_forward};
}

/* qkv_shape_error() needs a shape rule's context: add a probe node whose
 * rule calls it with the caller's error (the node itself is added to
 * sgraph, not to the fixture's graph). TRUE when the rule ran and
 * qkv_shape_error() returned FALSE. */
static gboolean
shape_error_probe(GError **error)
{
  g_autoptr(GError) own = NULL;
  probe_error = error;
  probe_reached = FALSE;
  probe_result = TRUE;
  QkvValue *out = qkv_graph_op(fx.sgraph, "test.sticky_probe", &fx.sx, 1, NULL, &own);
  probe_error = NULL;
  g_assert_no_error(own);
  g_assert_nonnull(out);
  return probe_reached && !probe_result;
}

static QkvValue *
check_build(QkvGraph *graph, QkvValue *const *inputs, gpointer user_data, GError **error)
{
  return qkv_sum(qkv_tanh(inputs[0], error), NULL, 0, FALSE, error);
}

/* A step callback: log-probabilities favouring token (step + row) % vocab. */
static gboolean
toy_step(gpointer user_data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
         float *logits, GError **error)
{
  for (gint r = 0; r < n_rows; r++)
    for (gint v = 0; v < 5; v++)
      logits[r * 5 + v] = (v == (step + r) % 5) ? -0.1f : -3.0f;
  return TRUE;
}

static gboolean
accept_all(QkvParam *param, gpointer user_data)
{
  return TRUE;
}

static QkvValue *
input(QkvGraph *graph, const gchar *name, QkvDType dtype, QkvShape shape)
{
  g_autoptr(GError) error = NULL;
  QkvValue *v = qkv_graph_input(graph, name, dtype, &shape, &error);
  g_assert_no_error(error);
  return v;
}

static QkvValue *
param(const gchar *name, QkvShape shape)
{
  g_autoptr(GError) error = NULL;
  QkvParam *p = qkv_params_add(fx.params, name, &shape, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_init_uniform(qkv_param_value(p), -0.5, 0.5, 7, &error));
  QkvValue *v = qkv_graph_param(fx.graph, fx.params, name, &error);
  g_assert_no_error(error);
  return v;
}

/* Parameters of a trained model of each kind: built once on a scratch graph. */
static QkvParams *
model_params(gint kind)
{
  g_autoptr(GError) error = NULL;
  QkvParams *params = qkv_params_new();
  g_autoptr(QkvGraph) graph = qkv_graph_new();
  QkvBuilder b = {.graph = graph, .params = params, .seed = 3};
  QkvValue *src = input(graph, "src", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *valid = input(graph, "valid", QKV_I32, QKV_SHAPE(2));
  QkvValue *dec = input(graph, "dec", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *out;
  if (kind == 0) {
    QkvValue *enc = qkv_build_transformer_encoder(&b, &fx.tcfg, src, valid, &error);
    out = qkv_build_transformer_decoder(&b, &fx.tcfg, dec, enc, valid, NULL, &error);
  } else if (kind == 1) {
    out = qkv_build_bahdanau_seq2seq(&b, &fx.gcfg, src, valid, dec, NULL, &error);
  } else {
    out = qkv_build_luong_seq2seq(&b, &fx.lcfg, src, valid, dec, NULL, &error);
  }
  g_assert_no_error(error);
  g_assert_nonnull(out);
  return params;
}

static void
fixture_init(void)
{
  g_autoptr(GError) error = NULL;
  fx.graph = qkv_graph_new();
  fx.params = qkv_params_new();
  fx.b = (QkvBuilder){.graph = fx.graph, .params = fx.params, .seed = 1};
  fx.params2 = qkv_params_new();
  fx.b2 = (QkvBuilder){.graph = fx.graph, .params = fx.params2, .seed = 2};
  fx.x = input(fx.graph, "x", QKV_F32, QKV_SHAPE(2, 3, 4));
  fx.y = input(fx.graph, "y", QKV_F32, QKV_SHAPE(2, 3, 4));
  fx.kv = input(fx.graph, "kv", QKV_F32, QKV_SHAPE(2, 5, 4));
  fx.lens = input(fx.graph, "lens", QKV_I32, QKV_SHAPE(2));
  fx.ids = input(fx.graph, "ids", QKV_I32, QKV_SHAPE(2, 3));
  fx.tw = input(fx.graph, "tw", QKV_F32, QKV_SHAPE(2, 3));
  fx.mask = input(fx.graph, "mask", QKV_F32, QKV_SHAPE(3, 5));
  fx.nq = input(fx.graph, "nq", QKV_F32, QKV_SHAPE(3));
  fx.nk = input(fx.graph, "nk", QKV_F32, QKV_SHAPE(3, 5));
  fx.fresh = input(fx.graph, "fresh", QKV_F32, QKV_SHAPE(2, 2, 1, 2));
  fx.ids3 = input(fx.graph, "ids3", QKV_I32, QKV_SHAPE(2, 3, 2));
  fx.g3 = input(fx.graph, "g3", QKV_F32, QKV_SHAPE(2, 3, 2));
  QkvShape cache_shape = QKV_SHAPE(2, 2, 6, 2);
  fx.cache = qkv_graph_state(fx.graph, "cache", QKV_F32, &cache_shape, &error);
  g_assert_no_error(error);
  fx.w44 = param("w44", QKV_SHAPE(4, 4));
  fx.wv = param("wv", QKV_SHAPE(1, 4));
  fx.b4 = param("b4", QKV_SHAPE(4));
  fx.w84 = param("w84", QKV_SHAPE(8, 4));
  fx.w48 = param("w48", QKV_SHAPE(4, 8));
  fx.b8 = param("b8", QKV_SHAPE(8));
  fx.emb = param("emb", QKV_SHAPE(10, 4));
  for (guint i = 0; i < 4; i++)
    fx.biases[i] = fx.b4;
  fx.loss = qkv_sum(fx.x, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  qkv_graph_mark(fx.graph, &fx.mark);
  qkv_params_mark(fx.params, &fx.params_mark);
  fx.s4 = QKV_SHAPE(4);
  fx.s34 = QKV_SHAPE(3, 4);
  fx.s234 = QKV_SHAPE(2, 3, 4);
  fx.s64 = QKV_SHAPE(6, 4);
  fx.s5234 = QKV_SHAPE(5, 2, 3, 4);
  fx.perm[0] = 1, fx.perm[1] = 0, fx.perm[2] = 2;
  fx.axes_all[0] = 0, fx.axes_all[1] = 1, fx.axes_all[2] = 2;
  fx.axis0[0] = 0;
  fx.tcfg = (QkvTransformerConfig){.src_vocab = 10,
                                   .tgt_vocab = 5,
                                   .num_hiddens = 4,
                                   .ffn_hiddens = 8,
                                   .num_heads = 2,
                                   .num_layers = 1};
  fx.gcfg = (QkvGruSeq2SeqConfig){
      .src_vocab = 10, .tgt_vocab = 5, .embed_size = 4, .num_hiddens = 4, .num_layers = 1};
  fx.lacfg = (QkvLuongAttentionConfig){.score = QKV_LUONG_GENERAL, .align = QKV_LUONG_GLOBAL};
  fx.lcfg = (QkvLuongConfig){.src_vocab = 10,
                             .tgt_vocab = 5,
                             .embed_size = 4,
                             .num_hiddens = 4,
                             .num_layers = 1,
                             .attention = fx.lacfg};
  fx.pcfg = (QkvPoolingClassifierConfig){.vocab_size = 10,
                                         .embed_size = 4,
                                         .key_size = 4,
                                         .num_queries = 2,
                                         .num_classes = 2,
                                         .pooling = QKV_POOLING_ATTENTION};
  fx.mha_options = (QkvMhaOptions){.valid_lens = fx.lens};
  fx.init_ones = (QkvInit){.kind = QKV_INIT_ONES};

  fx.pgraph = qkv_graph_new();
  fx.pa = input(fx.pgraph, "a", QKV_F32, QKV_SHAPE(2, 2));
  QkvShape s22 = QKV_SHAPE(2, 2);
  fx.pstate = qkv_graph_state(fx.pgraph, "s", QKV_F32, &s22, &error);
  fx.pout = qkv_add(fx.pa, fx.pstate, &error);
  fx.plan_options = qkv_plan_options_default();
  fx.plan = qkv_graph_compile(fx.pgraph, &fx.pout, 1, &fx.plan_options, &error);
  g_assert_no_error(error);
  qkv_graph_mark(fx.pgraph, &fx.pmark);
  fx.ta = qkv_test_uniform(&s22, 1, -1.0f, 1.0f);
  g_assert_true(qkv_plan_bind(fx.plan, "a", fx.ta, &error));

  fx.dgraph = qkv_graph_new();
  QkvValue *dtokens = input(fx.dgraph, "tokens", QKV_I32, QKV_SHAPE(2, 1));
  QkvValue *dpos = input(fx.dgraph, "positions", QKV_I32, QKV_SHAPE(2));
  QkvShape table = QKV_SHAPE(10, 4);
  g_autoptr(QkvTensor) dtable = qkv_test_uniform(&table, 2, -1.0f, 1.0f);
  QkvValue *dlogits = qkv_embedding(qkv_positions(dtokens, dpos, 0, &error),
                                    qkv_graph_constant(fx.dgraph, dtable, &error), &error);
  fx.dplan = qkv_graph_compile(fx.dgraph, &dlogits, 1, NULL, &error);
  fx.dplan_spare = qkv_graph_compile(fx.dgraph, &dlogits, 1, NULL, &error);
  fx.pdec = qkv_plan_decoder_new(fx.dplan, 2, 4, &error);
  g_assert_no_error(error);

  fx.def = probe_def("test.sticky_probe");
  g_assert_true(qkv_op_register(&fx.def, &error));
  g_assert_no_error(error);
  fx.def = probe_def("test.sticky_registered");
  fx.sgraph = qkv_graph_new();
  fx.sx = input(fx.sgraph, "x", QKV_F32, QKV_SHAPE(2));

  fx.sgd = qkv_optim_config_sgd(0.1);
  fx.adam = qkv_optim_config_adam(0.01);
  fx.opt = qkv_optimizer_new_sgd(fx.params, &fx.sgd, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_optimizer_add_group(fx.opt, "w*", NULL, NULL, 1.0, 0.0, &error), ==, 1);
  fx.select[0] = "w44";
  fx.select_array = g_ptr_array_new();
  fx.t34 = qkv_test_uniform(&fx.s34, 2, -1.0f, 1.0f);
  fx.t4 = qkv_tensor_new(QKV_F32, &fx.s4);
  fx.tw34 = qkv_tensor_new(QKV_F32, &fx.s34);
  fx.check_options = qkv_check_options_default();
  fx.dir = g_dir_make_tmp("qkv-sticky-XXXXXX", &error);
  g_assert_no_error(error);
  fx.checkpoint = g_build_filename(fx.dir, "saved.safetensors", NULL);
  fx.new_checkpoint = g_build_filename(fx.dir, "new.safetensors", NULL);
  g_assert_true(qkv_checkpoint_save(fx.checkpoint, fx.params, NULL, NULL, NULL, &error));
  g_assert_no_error(error);

  fx.tparams = model_params(0);
  fx.gparams = model_params(1);
  fx.lparams = model_params(2);
  fx.tdec = qkv_step_decoder_new_transformer(fx.tparams, &fx.tcfg, 2, 3, 4, 1, &error);
  g_assert_no_error(error);
  fx.gdec = qkv_step_decoder_new_bahdanau(fx.gparams, &fx.gcfg, 2, 3, 4, 1, &error);
  g_assert_no_error(error);
  fx.ldec = qkv_step_decoder_new_luong(fx.lparams, &fx.lcfg, 2, 3, 4, 1, &error);
  g_assert_no_error(error);
  const gint32 src[] = {3, 4, 5, 6, 7, 0}, valid[] = {3, 2};
  QkvShape s23 = QKV_SHAPE(2, 3), s2 = QKV_SHAPE(2);
  fx.src = qkv_tensor_new_i32(&s23, src);
  fx.src_valid = qkv_tensor_new_i32(&s2, valid);
  g_assert_true(qkv_step_decoder_start(fx.tdec, fx.src, fx.src_valid, 1, &error));
  g_assert_no_error(error);
  fx.beam = qkv_beam_options_default();
  fx.beam.beam_size = 1;
  fx.beam.max_len = 4;
  fx.beam.vocab = 5;
  fx.beam.bos = 1;
  fx.beam.eos = 2;
  fx.sample = qkv_sample_options_default();
  fx.generate = qkv_generate_options_default();
  fx.generate.vocab = 5;
  fx.generate.bos = 1;
  fx.generate.eos = 2;
  fx.prompt[0] = 3;
  fx.prompt_lens[0] = 1;
  for (guint i = 0; i < G_N_ELEMENTS(fx.logits); i++)
    fx.logits[i] = -(float)(i % 5);
  fx.row_ids[0] = 0, fx.row_ids[1] = 1;
  fx.plugin_path = g_test_build_filename(G_TEST_BUILT, "plugins", "good-a.so", NULL);
}

static void
remove_dir(const gchar *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  const gchar *name;
  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree gchar *path = g_build_filename(dir, name, NULL);
    g_remove(path);
  }
  g_rmdir(dir);
}

static void
fixture_clear(void)
{
  qkv_step_decoder_free(fx.tdec);
  qkv_plan_decoder_free(fx.pdec);
  qkv_plan_free(fx.dplan);
  qkv_plan_free(fx.dplan_spare);
  qkv_graph_free(fx.dgraph);
  qkv_step_decoder_free(fx.gdec);
  qkv_step_decoder_free(fx.ldec);
  qkv_params_free(fx.tparams);
  qkv_params_free(fx.gparams);
  qkv_params_free(fx.lparams);
  qkv_tensor_free(fx.src);
  qkv_tensor_free(fx.src_valid);
  qkv_tensor_free(fx.ta);
  qkv_tensor_free(fx.tresult);
  qkv_tensor_free(fx.t34);
  qkv_tensor_free(fx.t4);
  qkv_tensor_free(fx.tw34);
  qkv_plan_free(fx.plan);
  qkv_optimizer_free(fx.opt);
  g_ptr_array_unref(fx.select_array);
  qkv_graph_free(fx.pgraph);
  qkv_graph_free(fx.sgraph);
  qkv_graph_free(fx.graph);
  qkv_params_free(fx.params);
  qkv_params_free(fx.params2);
  remove_dir(fx.dir);
  g_free(fx.dir);
  g_free(fx.checkpoint);
  g_free(fx.new_checkpoint);
  g_free(fx.plugin_path);
}

/* ---- the calls ------------------------------------------------------------ */

/* Each entry: the function and an expression (over the fixture f and the
 * error pointer error) that calls it and is TRUE when it returned its
 * failure value. Keep them in the headers' order. */
#define STICKY_CALLS(CALL)                                                                         \
  /* qkv-builders-core.h */                                                                        \
  CALL(qkv_builder_push, push_and_pop(f, error))                                                   \
  CALL(qkv_builder_push_printf, push_printf_and_pop(f, error))                                     \
  CALL(qkv_build_param, qkv_build_param(&f->b, "bp", &f->s4, "zeros", 4, error) == NULL)           \
  CALL(qkv_build_param_init,                                                                       \
       qkv_build_param_init(&f->b, "bpi", &f->s4, &f->init_ones, error) == NULL)                   \
  /* qkv-builders-layers.h */                                                                      \
  CALL(qkv_build_linear, qkv_build_linear(&f->b, "lin", f->x, 3, TRUE, error) == NULL)             \
  CALL(qkv_build_linear_init,                                                                      \
       qkv_build_linear_init(&f->b, "lini", f->x, 3, TRUE, &f->init_ones, NULL, error) == NULL)    \
  CALL(qkv_build_embedding, qkv_build_embedding(&f->b, "embb", f->ids, 10, 4, error) == NULL)      \
  CALL(qkv_build_embedding_init,                                                                   \
       qkv_build_embedding_init(&f->b, "embi", f->ids, 10, 4, &f->init_ones, error) == NULL)       \
  CALL(qkv_build_positions, qkv_build_positions(&f->b, f->ids, error) == NULL)                     \
  CALL(qkv_build_ffn, qkv_build_ffn(&f->b, "ffn", f->x, 8, 4, error) == NULL)                      \
  CALL(qkv_build_ffn_activation,                                                                   \
       qkv_build_ffn_activation(&f->b, "ffna", f->x, 8, 4, QKV_ACTIVATION_GELU, error) == NULL)    \
  CALL(qkv_build_addnorm, qkv_build_addnorm(&f->b, "an", f->x, f->y, 0.0, error) == NULL)          \
  CALL(qkv_build_layer_norm,                                                                       \
       qkv_build_layer_norm(&f->b, "ln", f->x, 1e-5, TRUE, TRUE, error) == NULL)                   \
  CALL(qkv_build_rms_norm, qkv_build_rms_norm(&f->b, "rms", f->x, 1e-5, error) == NULL)            \
  CALL(qkv_build_gru,                                                                              \
       qkv_build_gru(&f->b, "gru", f->x, NULL, 4, 1, 0.0, &f->out, error) == NULL &&               \
           f->out == NULL)                                                                         \
  /* qkv-builders-attention.h */                                                                   \
  CALL(qkv_build_mha, qkv_build_mha(&f->b, "mha", f->x, f->kv, f->kv, 4, 2, f->lens, FALSE, 0.0,   \
                                    &f->out, error) == NULL &&                                     \
                          f->out == NULL)                                                          \
  CALL(qkv_build_mha_masked,                                                                       \
       qkv_build_mha_masked(&f->b, "mham", f->x, f->kv, f->kv, 4, 2, f->lens, f->mask,             \
                            QKV_MASK_BOOLEAN, FALSE, 0.0, &f->out, error) == NULL &&               \
           f->out == NULL)                                                                         \
  CALL(qkv_build_mha_full, qkv_build_mha_full(&f->b, "mhaf", f->x, f->kv, f->kv, 4, 2,             \
                                              &f->mha_options, &f->out, error) == NULL &&          \
                               f->out == NULL)                                                     \
  CALL(qkv_build_mha_keys_values, qkv_build_mha_keys_values(&f->b, "mhakv", f->kv, f->kv, 4, 2,    \
                                                            NULL, &f->out, error) == NULL &&       \
                                      f->out == NULL)                                              \
  CALL(qkv_build_luong_attention, qkv_build_luong_attention(&f->b, "la", &f->lacfg, f->x, f->kv,   \
                                                            f->lens, 0, &f->out, error) == NULL && \
                                      f->out == NULL)                                              \
  CALL(qkv_build_luong_attentional,                                                                \
       qkv_build_luong_attentional(&f->b, "lat", f->x, f->y, error) == NULL)                       \
  CALL(qkv_build_attention_pooling,                                                                \
       qkv_build_attention_pooling(&f->b, "pool", f->x, f->lens, 2, 4, &f->out, error) == NULL &&  \
           f->out == NULL)                                                                         \
  CALL(qkv_build_hard_attention_pooling,                                                           \
       qkv_build_hard_attention_pooling(&f->b, "hpool", f->x, f->lens, 2, 4, 1.0, &f->out,         \
                                        error) == NULL &&                                          \
           f->out == NULL)                                                                         \
  CALL(qkv_build_mean_pooling,                                                                     \
       qkv_build_mean_pooling(&f->b, f->x, f->lens, &f->out, error) == NULL && f->out == NULL)     \
  CALL(qkv_build_nw_regression, qkv_build_nw_regression(f->graph, f->params, "nw.", f->nq, f->nk,  \
                                                        f->nk, 1, &f->out, error) == NULL &&       \
                                    f->out == NULL)                                                \
  CALL(qkv_build_nw_regression_masked,                                                             \
       qkv_build_nw_regression_masked(f->graph, f->params, "nwm.", f->nq, f->nk, f->nk, f->nk, 1,  \
                                      &f->out, error) == NULL &&                                   \
           f->out == NULL)                                                                         \
  /* qkv-builders-models.h */                                                                      \
  CALL(qkv_build_transformer_encoder,                                                              \
       qkv_build_transformer_encoder(&f->b, &f->tcfg, f->ids, f->lens, error) == NULL)             \
  CALL(qkv_build_transformer_decoder,                                                              \
       qkv_build_transformer_decoder(&f->b, &f->tcfg, f->ids, f->x, f->lens, &f->out, error) ==    \
               NULL &&                                                                             \
           f->out == NULL)                                                                         \
  CALL(qkv_build_transformer_encoder_taps,                                                         \
       qkv_build_transformer_encoder_taps(&f->b, &f->tcfg, f->ids, f->lens, NULL, error) == NULL)  \
  CALL(qkv_build_transformer_decoder_taps,                                                         \
       qkv_build_transformer_decoder_taps(&f->b, &f->tcfg, f->ids, f->x, f->lens, NULL, error) ==  \
           NULL)                                                                                   \
  CALL(qkv_build_bahdanau_seq2seq, qkv_build_bahdanau_seq2seq(&f->b, &f->gcfg, f->ids, f->lens,    \
                                                              f->ids, &f->out, error) == NULL &&   \
                                       f->out == NULL)                                             \
  CALL(qkv_build_bahdanau_seq2seq_taps,                                                            \
       qkv_build_bahdanau_seq2seq_taps(&f->b, &f->gcfg, f->ids, f->lens, f->ids, NULL, error) ==   \
           NULL)                                                                                   \
  CALL(qkv_build_luong_seq2seq, qkv_build_luong_seq2seq(&f->b2, &f->lcfg, f->ids, f->lens, f->ids, \
                                                        &f->out, error) == NULL &&                 \
                                    f->out == NULL)                                                \
  CALL(qkv_build_seq2seq_loss, qkv_build_seq2seq_loss(f->x, f->ids, f->tw, error) == NULL)         \
  CALL(qkv_build_seq2seq_loss_lens,                                                                \
       qkv_build_seq2seq_loss_lens(f->x, f->ids, f->lens, &f->out, error) == NULL &&               \
           f->out == NULL)                                                                         \
  CALL(qkv_build_seq2seq_loss_smoothed,                                                            \
       qkv_build_seq2seq_loss_smoothed(f->x, f->ids, f->tw, 0.1, error) == NULL)                   \
  CALL(qkv_build_seq2seq_loss_lens_smoothed,                                                       \
       qkv_build_seq2seq_loss_lens_smoothed(f->x, f->ids, f->lens, 0.1, &f->out, error) == NULL && \
           f->out == NULL)                                                                         \
  CALL(qkv_build_pooling_classifier,                                                               \
       qkv_build_pooling_classifier(&f->b, &f->pcfg, f->ids, f->lens, &f->out, error) == NULL &&   \
           f->out == NULL)                                                                         \
  /* qkv-check.h */                                                                                \
  CALL(qkv_check_gradients, !qkv_check_gradients(1, &f->t34, NULL, check_build, NULL,              \
                                                 &f->check_options, &f->max_rel_err, error))       \
  CALL(qkv_check_evaluate,                                                                         \
       take_tensor(f, qkv_check_evaluate(1, &f->t34, check_build, NULL, FALSE, error)))            \
  /* qkv-checkpoint.h */                                                                           \
  CALL(qkv_checkpoint_save,                                                                        \
       !qkv_checkpoint_save(f->new_checkpoint, f->params, f->opt, NULL, NULL, error) &&            \
           !g_file_test(f->new_checkpoint, G_FILE_TEST_EXISTS))                                    \
  CALL(qkv_checkpoint_save_full,                                                                   \
       !qkv_checkpoint_save_full(f->new_checkpoint, f->params, f->opt, NULL, NULL,                 \
                                 QKV_CHECKPOINT_DTYPE_BF16, error) &&                              \
           !g_file_test(f->new_checkpoint, G_FILE_TEST_EXISTS))                                    \
  CALL(qkv_checkpoint_load, load_fails(f, error))                                                  \
  CALL(qkv_checkpoint_read_metadata,                                                               \
       take_table(qkv_checkpoint_read_metadata(f->checkpoint, error)))                             \
  CALL(qkv_safetensors_read, take_table(qkv_safetensors_read(f->checkpoint, NULL, error)))         \
  /* qkv-decode.h */                                                                               \
  CALL(qkv_beam_search,                                                                            \
       !qkv_beam_search(&f->beam, 1, toy_step, NULL, f->tokens, f->lengths, f->scores, error))     \
  CALL(qkv_step_decoder_new_transformer,                                                           \
       take_decoder(qkv_step_decoder_new_transformer(f->tparams, &f->tcfg, 2, 3, 4, 1, error)))    \
  CALL(qkv_step_decoder_new_bahdanau,                                                              \
       take_decoder(qkv_step_decoder_new_bahdanau(f->gparams, &f->gcfg, 2, 3, 4, 1, error)))       \
  CALL(qkv_step_decoder_new_luong,                                                                 \
       take_decoder(qkv_step_decoder_new_luong(f->lparams, &f->lcfg, 2, 3, 4, 1, error)))          \
  CALL(qkv_step_decoder_start, !qkv_step_decoder_start(f->gdec, f->src, f->src_valid, 1, error))   \
  CALL(qkv_step_decoder_step,                                                                      \
       !qkv_step_decoder_step(f->tdec, 0, f->tokens, NULL, 2, f->logits, error))                   \
  CALL(qkv_step_decoder_translate,                                                                 \
       !qkv_step_decoder_translate(f->ldec, f->src, f->src_valid, &f->beam, f->tokens, f->lengths, \
                                   f->scores, error))                                              \
  CALL(qkv_step_decoder_try_set_precision, decoder_precision_kept(f, error))                       \
  CALL(qkv_sample_logits,                                                                          \
       !qkv_sample_logits(&f->sample, f->logits, 2, 5, 0, f->row_ids, f->tokens, error))           \
  CALL(qkv_plan_decoder_new, take_plan_decoder(qkv_plan_decoder_new(f->dplan_spare, 2, 4, error))) \
  CALL(qkv_plan_decoder_step,                                                                      \
       !qkv_plan_decoder_step(f->pdec, 0, f->tokens, NULL, 2, f->logits, error))                   \
  CALL(qkv_generate, !qkv_generate(&f->generate, 1, f->prompt, f->prompt_lens, 2, toy_step, NULL,  \
                                   f->tokens, f->lengths, error))                                  \
  /* qkv-dist.h: a group needs mpirun (or MPI in this process): the calls                          \
   * on a group get none, which is never looked at with an error set */                            \
  CALL(qkv_dist_init, qkv_dist_init(NULL, NULL, error) == NULL)                                    \
  CALL(qkv_dist_new_for_comm, qkv_dist_new_for_comm(NULL, error) == NULL)                          \
  CALL(qkv_dist_leave, !qkv_dist_leave(NULL, "sticky", error))                                     \
  CALL(qkv_dist_check_batch, !qkv_dist_check_batch(NULL, 8, error))                                \
  CALL(qkv_dist_broadcast_params, !qkv_dist_broadcast_params(NULL, f->params, f->opt, error))      \
  CALL(qkv_dist_allreduce_grads,                                                                   \
       !qkv_dist_allreduce_grads(NULL, f->params, QKV_DIST_SUM, NULL, 0, error))                   \
  CALL(qkv_dist_allreduce, !qkv_dist_allreduce(NULL, f->scores, 2, QKV_DIST_SUM, error))           \
  CALL(qkv_dist_barrier, !qkv_dist_barrier(NULL, error))                                           \
  CALL(qkv_dist_agree, !qkv_dist_agree(NULL, "what", "value", error))                              \
  /* qkv-graph.h */                                                                                \
  CALL(qkv_values_present, !qkv_values_present("sticky", &f->x, 1, error))                         \
  CALL(qkv_graph_input, qkv_graph_input(f->graph, "new", QKV_F32, &f->s4, error) == NULL)          \
  CALL(qkv_graph_state, qkv_graph_state(f->graph, "new_state", QKV_F32, &f->s4, error) == NULL)    \
  CALL(qkv_graph_param, qkv_graph_param(f->graph, f->params, "w44", error) == NULL)                \
  CALL(qkv_graph_constant, qkv_graph_constant(f->graph, f->t4, error) == NULL)                     \
  CALL(qkv_graph_add_node,                                                                         \
       qkv_graph_add_node(f->graph, "scale", &f->x, 1, scale_attrs(), error) == NULL)              \
  CALL(qkv_graph_op, qkv_graph_op(f->graph, "scale", &f->x, 1, scale_attrs(), error) == NULL)      \
  CALL(qkv_graph_rollback_checked, !qkv_graph_rollback_checked(f->pgraph, &f->pmark, error))       \
  CALL(qkv_graph_backward, !qkv_graph_backward(f->graph, f->loss, error))                          \
  /* qkv-init.h */                                                                                 \
  CALL(qkv_init_compute_fans, !qkv_init_compute_fans(&f->s34, &f->fan_in, &f->fan_out, error))     \
  CALL(qkv_init_zeros, !qkv_init_zeros(f->tw34, error))                                            \
  CALL(qkv_init_ones, !qkv_init_ones(f->tw34, error))                                              \
  CALL(qkv_init_constant, !qkv_init_constant(f->tw34, 2.0, error))                                 \
  CALL(qkv_init_uniform, !qkv_init_uniform(f->tw34, -1.0, 1.0, 1, error))                          \
  CALL(qkv_init_normal, !qkv_init_normal(f->tw34, 0.0, 1.0, 1, error))                             \
  CALL(qkv_init_xavier_uniform, !qkv_init_xavier_uniform(f->tw34, 1.0, 1, error))                  \
  CALL(qkv_init_xavier_normal, !qkv_init_xavier_normal(f->tw34, 1.0, 1, error))                    \
  CALL(qkv_init_kaiming_uniform, !qkv_init_kaiming_uniform(f->tw34, 0.0, 1, error))                \
  CALL(qkv_init_linear, !qkv_init_linear(f->tw34, NULL, 1, error))                                 \
  CALL(qkv_init_embedding, !qkv_init_embedding(f->tw34, 1, error))                                 \
  /* qkv-nn.h */                                                                                   \
  CALL(qkv_masked_softmax, qkv_masked_softmax(f->x, f->lens, FALSE, error) == NULL)                \
  CALL(qkv_masked_softmax_full,                                                                    \
       qkv_masked_softmax_full(f->x, f->lens, NULL, QKV_MASK_BOOLEAN, TRUE, error) == NULL)        \
  CALL(qkv_dot_product_attention, qkv_dot_product_attention(f->x, f->kv, f->kv, f->lens, FALSE,    \
                                                            0.0, &f->out, error) == NULL &&        \
                                      f->out == NULL)                                              \
  CALL(qkv_dot_product_attention_masked,                                                           \
       qkv_dot_product_attention_masked(f->x, f->kv, f->kv, f->lens, f->mask, QKV_MASK_BOOLEAN,    \
                                        FALSE, 0.0, &f->out, error) == NULL &&                     \
           f->out == NULL)                                                                         \
  CALL(qkv_additive_attention, qkv_additive_attention(f->x, f->kv, f->kv, f->w44, f->w44, f->wv,   \
                                                      f->lens, 0.0, &f->out, error) == NULL &&     \
                                   f->out == NULL)                                                 \
  CALL(qkv_multi_head_attention,                                                                   \
       qkv_multi_head_attention(f->x, f->kv, f->kv, f->w44, f->w44, f->w44, f->w44, f->biases, 2,  \
                                f->lens, FALSE, 0.0, &f->out, error) == NULL &&                    \
           f->out == NULL)                                                                         \
  CALL(qkv_multi_head_attention_masked,                                                            \
       qkv_multi_head_attention_masked(f->x, f->kv, f->kv, f->w44, f->w44, f->w44, f->w44, NULL,   \
                                       2, f->lens, f->mask, QKV_MASK_ADDITIVE, FALSE, 0.0,         \
                                       &f->out, error) == NULL &&                                  \
           f->out == NULL)                                                                         \
  CALL(qkv_layer_norm, qkv_layer_norm(f->x, f->b4, f->b4, 1e-5, error) == NULL)                    \
  CALL(qkv_position_wise_ffn,                                                                      \
       qkv_position_wise_ffn(f->x, f->w84, f->b8, f->w48, f->b4, error) == NULL)                   \
  CALL(qkv_positional_encoding, qkv_positional_encoding(f->x, 0.0, 0, error) == NULL)              \
  CALL(qkv_positional_encoding_at,                                                                 \
       qkv_positional_encoding_at(f->x, f->lens, 0.0, 0, error) == NULL)                           \
  CALL(qkv_dropout, qkv_dropout(f->x, 0.5, error) == NULL)                                         \
  /* qkv-ops-basic.h */                                                                            \
  CALL(qkv_matmul, qkv_matmul(f->x, f->w44, FALSE, TRUE, error) == NULL)                           \
  CALL(qkv_add, qkv_add(f->x, f->y, error) == NULL)                                                \
  CALL(qkv_sub, qkv_sub(f->x, f->y, error) == NULL)                                                \
  CALL(qkv_mul, qkv_mul(f->x, f->y, error) == NULL)                                                \
  CALL(qkv_div, qkv_div(f->x, f->y, error) == NULL)                                                \
  CALL(qkv_scale, qkv_scale(f->x, 2.0, error) == NULL)                                             \
  CALL(qkv_neg, qkv_neg(f->x, error) == NULL)                                                      \
  CALL(qkv_reshape, qkv_reshape(f->x, &f->s64, error) == NULL)                                     \
  CALL(qkv_permute, qkv_permute(f->x, f->perm, 3, error) == NULL)                                  \
  CALL(qkv_transpose, qkv_transpose(f->x, 1, 2, error) == NULL)                                    \
  CALL(qkv_slice, qkv_slice(f->x, 1, 0, 2, error) == NULL)                                         \
  CALL(qkv_concat, qkv_concat(&f->x, 1, 0, error) == NULL)                                         \
  CALL(qkv_sum, qkv_sum(f->x, f->axes_all, 3, FALSE, error) == NULL)                               \
  CALL(qkv_mean, qkv_mean(f->x, f->axis0, 1, TRUE, error) == NULL)                                 \
  CALL(qkv_sum_to, qkv_sum_to(f->x, &f->s4, error) == NULL)                                        \
  CALL(qkv_broadcast_to, qkv_broadcast_to(f->x, &f->s5234, error) == NULL)                         \
  CALL(qkv_clamp, qkv_clamp(f->x, -1.0, 1.0, error) == NULL)                                       \
  CALL(qkv_abs, qkv_abs(f->x, error) == NULL)                                                      \
  CALL(qkv_sign, qkv_sign(f->x, error) == NULL)                                                    \
  CALL(qkv_sqrt, qkv_sqrt(f->x, error) == NULL)                                                    \
  CALL(qkv_square, qkv_square(f->x, error) == NULL)                                                \
  CALL(qkv_pow, qkv_pow(f->x, 3.0, error) == NULL)                                                 \
  CALL(qkv_pow_tensor, qkv_pow_tensor(f->x, f->y, error) == NULL)                                  \
  CALL(qkv_max, qkv_max(f->x, -1, FALSE, &f->out, error) == NULL && f->out == NULL)                \
  CALL(qkv_min, qkv_min(f->x, -1, TRUE, &f->out, error) == NULL && f->out == NULL)                 \
  CALL(qkv_argmax, qkv_argmax(f->x, -1, FALSE, error) == NULL)                                     \
  CALL(qkv_argmin, qkv_argmin(f->x, 0, FALSE, error) == NULL)                                      \
  CALL(qkv_cast, qkv_cast(f->x, QKV_I32, error) == NULL)                                           \
  CALL(qkv_unsqueeze, qkv_unsqueeze(f->x, 0, error) == NULL)                                       \
  CALL(qkv_squeeze, qkv_squeeze(f->x, NULL, 0, error) == NULL)                                     \
  CALL(qkv_expand, qkv_expand(f->b4, &f->s234, error) == NULL)                                     \
  CALL(qkv_slice_backward, qkv_slice_backward(f->x, &f->s234, 1, 0, error) == NULL)                \
  CALL(qkv_clamp_backward, qkv_clamp_backward(f->y, f->x, -1.0, 1.0, error) == NULL)               \
  /* qkv-ops-nn.h */                                                                               \
  CALL(qkv_relu, qkv_relu(f->x, error) == NULL)                                                    \
  CALL(qkv_sigmoid, qkv_sigmoid(f->x, error) == NULL)                                              \
  CALL(qkv_tanh, qkv_tanh(f->x, error) == NULL)                                                    \
  CALL(qkv_exp, qkv_exp(f->x, error) == NULL)                                                      \
  CALL(qkv_log, qkv_log(f->x, error) == NULL)                                                      \
  CALL(qkv_gelu, qkv_gelu(f->x, "tanh", error) == NULL)                                            \
  CALL(qkv_silu, qkv_silu(f->x, error) == NULL)                                                    \
  CALL(qkv_rms_norm, qkv_rms_norm(f->x, f->b4, 1e-6, error) == NULL)                               \
  CALL(qkv_softmax, qkv_softmax(f->x, error) == NULL)                                              \
  CALL(qkv_log_softmax, qkv_log_softmax(f->x, error) == NULL)                                      \
  CALL(qkv_embedding, qkv_embedding(f->ids, f->emb, error) == NULL)                                \
  CALL(qkv_cross_entropy,                                                                          \
       qkv_cross_entropy(f->x, f->ids, f->tw, QKV_REDUCTION_MEAN, error) == NULL)                  \
  CALL(qkv_cross_entropy_smoothed,                                                                 \
       qkv_cross_entropy_smoothed(f->x, f->ids, NULL, QKV_REDUCTION_SUM, 0.1, error) == NULL)      \
  CALL(qkv_cross_entropy_ignore,                                                                   \
       qkv_cross_entropy_ignore(f->x, f->ids, NULL, QKV_REDUCTION_NONE, 0.0, 0, error) == NULL)    \
  CALL(qkv_mse, qkv_mse(f->x, f->y, QKV_REDUCTION_MEAN, error) == NULL)                            \
  CALL(qkv_relu_backward, qkv_relu_backward(f->y, f->x, error) == NULL)                            \
  CALL(qkv_sigmoid_backward, qkv_sigmoid_backward(f->y, f->x, error) == NULL)                      \
  CALL(qkv_tanh_backward, qkv_tanh_backward(f->y, f->x, error) == NULL)                            \
  CALL(qkv_gelu_backward, qkv_gelu_backward(f->y, f->x, "none", error) == NULL)                    \
  CALL(qkv_silu_backward, qkv_silu_backward(f->y, f->x, error) == NULL)                            \
  CALL(qkv_softmax_backward, qkv_softmax_backward(f->y, f->x, error) == NULL)                      \
  CALL(qkv_log_softmax_backward, qkv_log_softmax_backward(f->y, f->x, error) == NULL)              \
  CALL(qkv_embedding_backward, qkv_embedding_backward(f->x, f->ids, 10, error) == NULL)            \
  CALL(qkv_cross_entropy_backward,                                                                 \
       qkv_cross_entropy_backward(f->loss, f->x, f->ids, NULL, QKV_REDUCTION_SUM, error) == NULL)  \
  CALL(qkv_cross_entropy_backward_smoothed,                                                        \
       qkv_cross_entropy_backward_smoothed(f->loss, f->x, f->ids, f->tw, QKV_REDUCTION_SUM, 0.1,   \
                                           error) == NULL)                                         \
  CALL(qkv_cross_entropy_backward_ignore,                                                          \
       qkv_cross_entropy_backward_ignore(f->loss, f->x, f->ids, NULL, QKV_REDUCTION_MEAN, 0.0, 0,  \
                                         error) == NULL)                                           \
  CALL(qkv_cross_entropy_weight_backward,                                                          \
       qkv_cross_entropy_weight_backward(f->loss, f->x, f->ids, QKV_REDUCTION_SUM, 0.0, -100,      \
                                         error) == NULL)                                           \
  CALL(qkv_gumbel_softmax, qkv_gumbel_softmax(f->x, NULL, 1.0, TRUE, -1, error) == NULL)           \
  /* qkv-ops-select.h */                                                                           \
  CALL(qkv_eq, qkv_eq(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_ne, qkv_ne(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_lt, qkv_lt(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_le, qkv_le(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_gt, qkv_gt(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_ge, qkv_ge(f->x, f->y, error) == NULL)                                                  \
  CALL(qkv_maximum, qkv_maximum(f->x, f->y, error) == NULL)                                        \
  CALL(qkv_minimum, qkv_minimum(f->x, f->y, error) == NULL)                                        \
  CALL(qkv_where, qkv_where(f->y, f->x, f->y, error) == NULL)                                      \
  CALL(qkv_masked_fill, qkv_masked_fill(f->x, f->y, -1.0, error) == NULL)                          \
  CALL(qkv_sequence_mask, qkv_sequence_mask(f->lens, 3, error) == NULL)                            \
  CALL(qkv_sequence_mask_like, qkv_sequence_mask_like(f->lens, f->ids, error) == NULL)             \
  CALL(qkv_gather, qkv_gather(f->x, f->ids3, 2, error) == NULL)                                    \
  CALL(qkv_index_select, qkv_index_select(f->x, f->lens, 2, error) == NULL)                        \
  CALL(qkv_gather_backward, qkv_gather_backward(f->g3, f->ids3, &f->s234, 2, error) == NULL)       \
  CALL(qkv_index_select_backward, qkv_index_select_backward(f->kv, f->lens, 3, 0, error) == NULL)  \
  CALL(qkv_kv_cache_append,                                                                        \
       qkv_kv_cache_append(f->cache, f->fresh, f->lens, &f->out, error) == NULL && f->out == NULL) \
  CALL(qkv_positions, qkv_positions(f->ids, f->lens, 1, error) == NULL)                            \
  /* qkv-optim-optimizer.h */                                                                      \
  CALL(qkv_optimizer_new_sgd, take_optimizer(qkv_optimizer_new_sgd(f->params, &f->sgd, error)))    \
  CALL(qkv_optimizer_new_adam, take_optimizer(qkv_optimizer_new_adam(f->params, &f->adam, error))) \
  CALL(qkv_optimizer_new_adamw,                                                                    \
       take_optimizer(qkv_optimizer_new_adamw(f->params, &f->adam, error)))                        \
  CALL(qkv_optimizer_new,                                                                          \
       take_optimizer(qkv_optimizer_new(QKV_OPTIMIZER_SGD, f->params, &f->sgd, error)))            \
  CALL(qkv_optimizer_select_names, !qkv_optimizer_select_names(f->opt, f->select, error))          \
  CALL(qkv_optimizer_step, !qkv_optimizer_step(f->opt, error))                                     \
  CALL(qkv_optimizer_step_clipped,                                                                 \
       !qkv_optimizer_step_clipped(f->opt, 1.0, QKV_CLIP_TORCH, NULL, error))                      \
  CALL(qkv_optimizer_try_set_lr, !qkv_optimizer_try_set_lr(f->opt, 0.5, error))                    \
  CALL(qkv_optimizer_set_config, !qkv_optimizer_set_config(f->opt, &f->sgd, error))                \
  /* qkv-optim-groups.h */                                                                         \
  CALL(qkv_optimizer_add_group,                                                                    \
       qkv_optimizer_add_group(f->opt, NULL, accept_all, NULL, 0.5, 0.0, error) == 0)              \
  CALL(qkv_optimizer_set_group_settings,                                                           \
       !qkv_optimizer_set_group_settings(f->opt, 1, 2.0, 0.01, error))                             \
  /* qkv-optim-accumulate.h */                                                                     \
  CALL(qkv_grad_accumulator_new, take_accumulator(qkv_grad_accumulator_new(f->params, error)))     \
  /* qkv-optim-schedule.h */                                                                       \
  CALL(qkv_schedule_try_new_constant, take_schedule(qkv_schedule_try_new_constant(0.1, error)))    \
  CALL(qkv_schedule_try_new_step, take_schedule(qkv_schedule_try_new_step(0.1, 10, 0.5, error)))   \
  CALL(qkv_schedule_try_new_cosine,                                                                \
       take_schedule(qkv_schedule_try_new_cosine(0.1, 100, 0.0, error)))                           \
  CALL(qkv_schedule_try_new_warmup, take_schedule(qkv_schedule_try_new_warmup(1.0, 4, 10, error))) \
  CALL(qkv_schedule_try_new_warmup_decay,                                                          \
       take_schedule(qkv_schedule_try_new_warmup_decay(QKV_DECAY_COSINE, 2, 10, 0.1, 0.0, error))) \
  /* qkv-params.h */                                                                               \
  CALL(qkv_params_add, qkv_params_add(f->params, "added", &f->s4, error) == NULL)                  \
  CALL(qkv_params_rollback_checked,                                                                \
       !qkv_params_rollback_checked(f->params, &f->params_mark, error))                            \
  /* qkv-plan.h */                                                                                 \
  CALL(qkv_graph_compile,                                                                          \
       take_plan(qkv_graph_compile(f->pgraph, &f->pout, 1, &f->plan_options, error)))              \
  CALL(qkv_plan_bind, !qkv_plan_bind(f->plan, "a", f->ta, error))                                  \
  CALL(qkv_plan_run, !qkv_plan_run(f->plan, error))                                                \
  CALL(qkv_plan_reset_state, !qkv_plan_reset_state(f->plan, "s", error))                           \
  CALL(qkv_plan_reorder_states, !qkv_plan_reorder_states(f->plan, f->parents, 2, error))           \
  CALL(qkv_plan_try_set_precision, plan_precision_kept(f, error))                                  \
  CALL(qkv_graph_eval, eval_fails(f, error))                                                       \
  /* qkv-plugin-op.h */                                                                            \
  CALL(qkv_shape_error, shape_error_probe(error))                                                  \
  CALL(qkv_op_register,                                                                            \
       !qkv_op_register(&f->def, error) && qkv_op_lookup("test.sticky_registered") == NULL)        \
  /* qkv-plugin-kernel.h */                                                                        \
  CALL(qkv_set_gemm_backend, !qkv_set_gemm_backend(qkv_gemm_backend(), error))                     \
  CALL(qkv_try_set_sparse_backward, sparse_backward_kept(error))                                   \
  /* qkv-plugin-load.h */                                                                          \
  CALL(qkv_plugin_load, qkv_plugin_load(f->plugin_path, error) == NULL)                            \
  /* qkv-tensor.h */                                                                               \
  CALL(qkv_tensor_try_new, take_tensor(f, qkv_tensor_try_new(QKV_F32, &f->s34, error)))            \
  CALL(qkv_tensor_try_new_borrowed,                                                                \
       take_tensor(f, qkv_tensor_try_new_borrowed(QKV_F32, &f->s4, f->logits, error)))             \
  CALL(qkv_tensor_copy_from, !qkv_tensor_copy_from(f->tw34, f->t34, error))                        \
  /* qkv-types.h */                                                                                \
  CALL(qkv_tensor_new_from_bytes, bytes_fail(f, TRUE, error))                                      \
  CALL(qkv_tensor_set_bytes, bytes_fail(f, FALSE, error))                                          \
  CALL(qkv_graph_eval_to_array, eval_array_fails(f, error))

/* Helpers for the calls that return something to free: TRUE when the call
 * gave nothing back. */
static gboolean
take_tensor(Fixture *f, QkvTensor *tensor)
{
  qkv_tensor_free(tensor);
  return tensor == NULL;
}

static gboolean
take_table(GHashTable *table)
{
  if (table != NULL)
    g_hash_table_unref(table);
  return table == NULL;
}

static gboolean
take_decoder(QkvStepDecoder *decoder)
{
  qkv_step_decoder_free(decoder);
  return decoder == NULL;
}

static gboolean
take_optimizer(QkvOptimizer *opt)
{
  qkv_optimizer_free(opt);
  return opt == NULL;
}

static gboolean
take_accumulator(QkvGradAccumulator *acc)
{
  qkv_grad_accumulator_free(acc);
  return acc == NULL;
}

static gboolean
take_schedule(QkvSchedule *schedule)
{
  qkv_schedule_free(schedule);
  return schedule == NULL;
}

static gboolean
take_plan_decoder(QkvPlanDecoder *decoder)
{
  qkv_plan_decoder_free(decoder);
  return decoder == NULL;
}

static gboolean
take_plan(QkvPlan *plan)
{
  qkv_plan_free(plan);
  return plan == NULL;
}

/* The setters: each is asked for a value other than the current one, so
 * that one that applied it despite the error is caught; TRUE when it failed
 * and the setting is as it was. Under QKV_STICKY_VALID the value is applied
 * and put back, so that the later calls meet the fixture as it was. */
static gboolean
plan_precision_kept(Fixture *f, GError **error)
{
  QkvPrecision before = qkv_plan_get_precision(f->plan);
  QkvPrecision other = before == QKV_PRECISION_FP32 ? QKV_PRECISION_BF16 : QKV_PRECISION_FP32;
  gboolean ok = qkv_plan_try_set_precision(f->plan, other, error);
  gboolean kept = qkv_plan_get_precision(f->plan) == before;
  if (ok)
    qkv_plan_set_precision(f->plan, before);
  return !ok && kept;
}

static gboolean
decoder_precision_kept(Fixture *f, GError **error)
{
  QkvPrecision before = qkv_step_decoder_get_precision(f->tdec);
  QkvPrecision other = before == QKV_PRECISION_FP32 ? QKV_PRECISION_BF16 : QKV_PRECISION_FP32;
  gboolean ok = qkv_step_decoder_try_set_precision(f->tdec, other, error);
  gboolean kept = qkv_step_decoder_get_precision(f->tdec) == before;
  if (ok)
    qkv_step_decoder_set_precision(f->tdec, before);
  return !ok && kept;
}

static gboolean
sparse_backward_kept(GError **error)
{
  QkvSparseBackward before = qkv_get_sparse_backward();
  QkvSparseBackward other =
      before == QKV_SPARSE_BACKWARD_OFF ? QKV_SPARSE_BACKWARD_AUTO : QKV_SPARSE_BACKWARD_OFF;
  gboolean ok = qkv_try_set_sparse_backward(other, error);
  gboolean kept = qkv_get_sparse_backward() == before;
  if (ok)
    qkv_set_sparse_backward(before);
  return !ok && kept;
}

/* A floating a{sv} for the "scale" op: the graph sinks it either way. */
static GVariant *
scale_attrs(void)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "factor", g_variant_new_double(2.0));
  return g_variant_builder_end(&attrs);
}

static gboolean
eval_fails(Fixture *f, GError **error)
{
  const gchar *names[] = {"a", "s"};
  QkvTensor *inputs[] = {f->ta, f->ta};
  QkvTensor *result = f->t4; /* a failure's results are NULL */
  gboolean ok = qkv_graph_eval(f->pgraph, names, inputs, 1, &f->pout, &result, 1, error);
  if (result != f->t4)
    qkv_tensor_free(result);
  return !ok && result == NULL;
}

/* Valid bytes for f->t4 (4 f32): the refusal comes from the error alone. */
static gboolean
bytes_fail(Fixture *f, gboolean make_new, GError **error)
{
  float values[4] = {1, 2, 3, 4};
  g_autoptr(GBytes) bytes = g_bytes_new(values, sizeof values);
  if (make_new)
    return take_tensor(f, qkv_tensor_new_from_bytes(QKV_F32, &f->s4, bytes, error));
  float before = ((const float *)qkv_tensor_const_data(f->t4))[0];
  return !qkv_tensor_set_bytes(f->t4, bytes, error) &&
         ((const float *)qkv_tensor_const_data(f->t4))[0] == before;
}

static gboolean
eval_array_fails(Fixture *f, GError **error)
{
  const gchar *names[] = {"a"};
  QkvTensor *inputs[] = {f->ta};
  GPtrArray *results = qkv_graph_eval_to_array(f->pgraph, names, inputs, 1, &f->pout, 1, error);
  if (results != NULL)
    g_ptr_array_unref(results);
  return results == NULL;
}

static gboolean
load_fails(Fixture *f, GError **error)
{
  /* a failure's lists are NULL */
  GPtrArray *missing = f->select_array, *unexpected = f->select_array;
  gboolean ok = qkv_checkpoint_load(f->checkpoint, f->params, NULL, NULL,
                                    QKV_CHECKPOINT_ALLOW_MISSING | QKV_CHECKPOINT_ALLOW_UNEXPECTED,
                                    &missing, &unexpected, error);
  if (missing != f->select_array && missing != NULL)
    g_ptr_array_unref(missing);
  if (unexpected != f->select_array && unexpected != NULL)
    g_ptr_array_unref(unexpected);
  return !ok && missing == NULL && unexpected == NULL;
}

/* A push with an error set still adds a scope level, so that every push is
 * matched by one pop (qkv-builders.h); the level is a refused one. */
static gboolean
push_and_pop(Fixture *f, GError **error)
{
  gboolean ok = qkv_builder_push(&f->b, "scope", error);
  gboolean pushed = qkv_builder_get_scope_depth(&f->b) == 1;
  qkv_builder_pop(&f->b);
  return !ok && pushed;
}

static gboolean
push_printf_and_pop(Fixture *f, GError **error)
{
  gboolean ok = qkv_builder_push_printf(&f->b, error, "block.%d", 3);
  gboolean pushed = qkv_builder_get_scope_depth(&f->b) == 1;
  qkv_builder_pop(&f->b);
  return !ok && pushed;
}

typedef struct {
  const gchar *name;
  gboolean (*call)(Fixture *f, GError **error);
} StickyCall;

#define DEFINE_CALL(fn, expr)                                                                      \
  static gboolean call_##fn(Fixture *f, GError **error)                                            \
  {                                                                                                \
    (void)fn; /* a name the headers no longer declare does not compile */                          \
    return (expr);                                                                                 \
  }
STICKY_CALLS(DEFINE_CALL)
#undef DEFINE_CALL

#define TABLE_ENTRY(fn, expr) {#fn, call_##fn},
static const StickyCall calls[] = {STICKY_CALLS(TABLE_ENTRY)};
#undef TABLE_ENTRY

/* ---- the headers' list ---------------------------------------------------- */

/* The names of the functions declared with QKV_API in the headers of include/qkv that
 * take a GError **, read from the source tree (comments and preprocessor
 * lines left out; a declaration runs from QKV_API to its ';'). */
static GPtrArray *
header_functions(void)
{
  g_autofree gchar *dir = g_test_build_filename(G_TEST_DIST, "..", "include", "qkv", NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(GDir) d = g_dir_open(dir, 0, &error);
  g_assert_no_error(error);
  g_autoptr(GRegex) comments = g_regex_new("/\\*.*?\\*/|//[^\\n]*", G_REGEX_DOTALL, 0, &error);
  g_autoptr(GRegex) preprocessor =
      g_regex_new("^[ \\t]*#(?:[^\\n]*\\\\\\n)*[^\\n]*", G_REGEX_MULTILINE, 0, &error);
  g_autoptr(GRegex) decl = g_regex_new("\\bQKV_API\\s+([^;{}]*?)\\s*;", 0, 0, &error);
  g_autoptr(GRegex) fname = g_regex_new("\\b(qkv_\\w+)\\s*\\(", 0, 0, &error);
  g_assert_no_error(error);
  GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
  guint n_headers = 0;
  const gchar *entry;
  while ((entry = g_dir_read_name(d)) != NULL) {
    if (!g_str_has_suffix(entry, ".h"))
      continue;
    n_headers++;
    g_autofree gchar *path = g_build_filename(dir, entry, NULL);
    g_autofree gchar *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, &error));
    g_autofree gchar *no_comments = g_regex_replace_literal(comments, text, -1, 0, " ", 0, &error);
    g_autofree gchar *code =
        g_regex_replace_literal(preprocessor, no_comments, -1, 0, " ", 0, &error);
    g_assert_no_error(error);
    g_autoptr(GMatchInfo) m = NULL;
    g_regex_match(decl, code, 0, &m);
    for (; g_match_info_matches(m); g_match_info_next(m, NULL)) {
      g_autofree gchar *d_text = g_match_info_fetch(m, 1);
      if (strstr(d_text, "GError") == NULL ||
          !g_regex_match_simple("GError\\s*\\*\\s*\\*", d_text, 0, 0))
        continue;
      g_autoptr(GMatchInfo) n = NULL;
      g_assert_true(g_regex_match(fname, d_text, 0, &n));
      g_ptr_array_add(names, g_match_info_fetch(n, 1));
    }
  }
  g_assert_cmpuint(n_headers, >, 10);
  return names;
}

static gboolean
table_has(const gchar *name)
{
  for (guint i = 0; i < G_N_ELEMENTS(calls); i++)
    if (g_str_equal(calls[i].name, name))
      return TRUE;
  return FALSE;
}

/* Every header function has a CALL entry, and every entry is a header
 * function (so the parse above found them: it cannot pass by finding none). */
static void
test_complete(void)
{
  g_autoptr(GPtrArray) names = header_functions();
  g_autoptr(GString) missing = g_string_new(NULL);
  for (guint i = 0; i < names->len; i++)
    if (!table_has(names->pdata[i]))
      g_string_append_printf(missing, " %s", (const gchar *)names->pdata[i]);
  if (missing->len > 0)
    g_test_message("public functions taking GError ** with no CALL entry in tests/test-sticky.c:%s",
                   missing->str);
  g_assert_cmpstr(missing->str, ==, "");
  for (guint i = 0; i < G_N_ELEMENTS(calls); i++) {
    gboolean found = FALSE;
    for (guint j = 0; j < names->len && !found; j++)
      found = g_str_equal(names->pdata[j], calls[i].name);
    if (!found)
      g_test_message("CALL entry %s: no such declaration with a GError ** in include/qkv",
                     calls[i].name);
    g_assert_true(found);
  }
  g_assert_cmpuint(names->len, ==, G_N_ELEMENTS(calls));
  g_test_message("%u public functions take a GError **; each has a CALL entry", names->len);
}

/* ---- one case per call ---------------------------------------------------- */

static GQuark
sticky_quark(void)
{
  return g_quark_from_static_string("test-sticky-first-error");
}

static void
test_call(gconstpointer data)
{
  const StickyCall *c = data;
  GError *first = g_error_new_literal(sticky_quark(), 7, "the first error");
  const gchar *message = first->message;
  GError *error = first;
  guint nodes = qkv_graph_n_nodes(fx.graph), values = qkv_graph_n_values(fx.graph);
  guint pnodes = qkv_graph_n_nodes(fx.pgraph), pvalues = qkv_graph_n_values(fx.pgraph);
  guint n_params = qkv_params_size(fx.params), n_params2 = qkv_params_size(fx.params2);
  guint sgraph_nodes = qkv_graph_n_nodes(fx.sgraph);
  guint logged_before = n_logged;
  g_string_truncate(logged, 0);
  fx.out = fx.x;

  gboolean failed = c->call(&fx, &error);

  if (n_logged != logged_before)
    g_test_message("%s logged: %s", c->name, logged->str);
  g_assert_cmpuint(n_logged, ==, logged_before);
  g_assert_true(error == first);
  g_assert_true(error->domain == sticky_quark());
  g_assert_cmpint(error->code, ==, 7);
  g_assert_true(error->message == message);
  g_assert_cmpstr(error->message, ==, "the first error");
  g_assert_true(failed);
  g_assert_cmpuint(qkv_graph_n_nodes(fx.graph), ==, nodes);
  g_assert_cmpuint(qkv_graph_n_values(fx.graph), ==, values);
  g_assert_cmpuint(qkv_graph_n_nodes(fx.pgraph), ==, pnodes);
  g_assert_cmpuint(qkv_graph_n_values(fx.pgraph), ==, pvalues);
  g_assert_cmpuint(qkv_params_size(fx.params), ==, n_params);
  g_assert_cmpuint(qkv_params_size(fx.params2), ==, n_params2);
  /* only the probe's own node, which the rule calling qkv_shape_error() is in */
  g_assert_cmpuint(qkv_graph_n_nodes(fx.sgraph), <=, sgraph_nodes + 1);
  g_error_free(error);
}

/* QKV_STICKY_VALID=1: every call once with an empty error; the calls that
 * fail then (their arguments are not valid) are listed. qkv_shape_error()
 * always returns FALSE, and a group of qkv-dist needs mpirun. */
static int
check_valid(void)
{
  guint n_failed = 0;
  for (guint i = 0; i < G_N_ELEMENTS(calls); i++) {
    GError *error = NULL;
    if (g_str_has_prefix(calls[i].name, "qkv_dist_") &&
        !g_str_equal(calls[i].name, "qkv_dist_init"))
      continue; /* no group: see above */
    gboolean failed = calls[i].call(&fx, &error);
    if (failed || error != NULL) {
      n_failed++;
      g_printerr("%s: %s\n", calls[i].name, error ? error->message : "failed with no error");
    }
    g_clear_error(&error);
  }
  g_printerr("%u of %u calls failed with an empty error (the qkv_dist_ calls on a group skipped)\n",
             n_failed, (guint)G_N_ELEMENTS(calls));
  return n_failed == 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  logged = g_string_new(NULL);
  /* Count every message (criticals and GLib's "GError set over the top of a
   * previous GError" included) instead of aborting on the first: each case
   * asserts that its call logged nothing. */
  g_log_set_always_fatal(G_LOG_FATAL_MASK);
  g_log_set_writer_func(counting_writer, NULL, NULL);
  g_log_set_default_handler(counting_handler, NULL);
  fixture_init();
  g_assert_cmpuint(n_logged, ==, 0);
  if (g_getenv("QKV_STICKY_VALID") != NULL) {
    int rc = check_valid();
    fixture_clear();
    return rc;
  }
  /* each case checks everything, and every failure is reported */
  g_test_set_nonfatal_assertions();
  g_test_add_func("/sticky/complete", test_complete);
  for (guint i = 0; i < G_N_ELEMENTS(calls); i++) {
    g_autofree gchar *path = g_strdup_printf("/sticky/%s", calls[i].name);
    g_test_add_data_func(path, &calls[i], test_call);
  }
  int rc = g_test_run();
  fixture_clear();
  g_string_free(logged, TRUE);
  return rc;
}
