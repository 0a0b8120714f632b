/* test-shapes.c: a plan compiled for (B, T) run on smaller bound inputs — the
 * same outputs and parameter gradients as a plan compiled at the smaller
 * shape, no allocation per run, refusals — and the seq2seq loss from valid
 * lengths. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-builders.h>

/* ---- the seq2seq loss from valid lengths -------------------------------- */

#define LB 3
#define LT 4
#define LV 5

static void
test_loss_lens(void)
{
  g_autoptr(GError) error = NULL;
  QkvShape btv = QKV_SHAPE(LB, LT, LV), bt = QKV_SHAPE(LB, LT), b = QKV_SHAPE(LB);
  g_autoptr(QkvTensor) logits_t = qkv_test_uniform(&btv, 7, -2, 2);
  g_autoptr(QkvTensor) labels_t = qkv_test_randint(&bt, 8, 0, LV);
  const gint32 lens[LB] = {4, 1, 0};
  g_autoptr(QkvTensor) lens_t = qkv_tensor_new_from_data(QKV_I32, &b, lens);
  float mask[LB * LT];
  for (gint i = 0; i < LB; i++)
    for (gint t = 0; t < LT; t++)
      mask[i * LT + t] = t < lens[i] ? 1.0f : 0.0f;
  g_autoptr(QkvTensor) mask_t = qkv_tensor_new_from_data(QKV_F32, &bt, mask);

  /* one graph, both losses */
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *logits = qkv_graph_input(g, "logits", QKV_F32, &btv, &error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, &error);
  QkvValue *valid = qkv_graph_input(g, "valid", QKV_I32, &b, &error);
  QkvValue *maskv = qkv_graph_input(g, "mask", QKV_F32, &bt, &error);
  qkv_value_set_requires_grad(logits, TRUE);
  QkvValue *per_seq = NULL;
  QkvValue *from_lens = qkv_build_seq2seq_loss_lens(logits, labels, valid, &per_seq, &error);
  g_assert_no_error(error);
  QkvValue *from_mask = qkv_build_seq2seq_loss(logits, labels, maskv, &error);
  g_assert_no_error(error);
  g_assert_nonnull(per_seq);
  g_assert_cmpint(qkv_value_shape(per_seq)->rank, ==, 1);
  g_assert_cmpint(qkv_value_shape(per_seq)->dims[0], ==, LB);
  QkvValue *total = qkv_add(from_lens, from_mask, &error);
  g_assert_true(qkv_graph_backward(g, total, &error));
  g_assert_no_error(error);

  /* hand computation in double: per_seq[b] = (1/T) Σ_{t<len} lse - logit[label] */
  const float *x = qkv_tensor_data(logits_t);
  const gint32 *y = qkv_tensor_data(labels_t);
  double want_seq[LB], want_sum = 0;
  for (gint i = 0; i < LB; i++) {
    double acc = 0;
    for (gint t = 0; t < LT; t++) {
      const float *row = x + (i * LT + t) * LV;
      double mx = row[0], se = 0;
      for (gint v = 1; v < LV; v++)
        mx = MAX(mx, row[v]);
      for (gint v = 0; v < LV; v++)
        se += exp(row[v] - mx);
      acc += mask[i * LT + t] * (mx + log(se) - row[y[i * LT + t]]);
    }
    want_seq[i] = acc / LT;
    want_sum += want_seq[i];
  }

  /* separate plans so that each loss has its own gradient of logits */
  QkvValue *outs_lens[] = {from_lens, per_seq};
  g_autoptr(QkvPlan) p = qkv_graph_compile(g, outs_lens, 2, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(p, "logits", logits_t, &error));
  g_assert_true(qkv_plan_bind(p, "labels", labels_t, &error));
  g_assert_true(qkv_plan_bind(p, "valid", lens_t, &error));
  g_assert_true(qkv_plan_bind(p, "mask", mask_t, &error));
  g_assert_true(qkv_plan_run(p, &error));
  g_assert_cmpfloat(fabs(qkv_plan_output_scalar(p, 0) - want_sum), <=, 1e-5 * fabs(want_sum));
  const float *seq = qkv_tensor_data((QkvTensor *)qkv_plan_output(p, 1));
  for (gint i = 0; i < LB; i++)
    g_assert_cmpfloat(fabs(seq[i] - want_seq[i]), <=, 1e-5 * MAX(fabs(want_seq[i]), 1e-3));
  g_assert_cmpfloat(seq[2], ==, 0.0f); /* length 0: nothing counts */

  /* against the f32-mask path: the same arithmetic, so exactly equal, and
   * the gradient of the summed losses is twice each one's (both paths) */
  QkvValue *dlogits = qkv_graph_gradient(g, logits);
  QkvValue *outs_both[] = {from_lens, from_mask, dlogits};
  g_autoptr(QkvPlan) q = qkv_graph_compile(g, outs_both, 3, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(q, "logits", logits_t, &error));
  g_assert_true(qkv_plan_bind(q, "labels", labels_t, &error));
  g_assert_true(qkv_plan_bind(q, "valid", lens_t, &error));
  g_assert_true(qkv_plan_bind(q, "mask", mask_t, &error));
  g_assert_true(qkv_plan_run(q, &error));
  g_assert_cmpfloat(qkv_plan_output_scalar(q, 0), ==, qkv_plan_output_scalar(q, 1));
  /* d/dlogits of Σ_b mean_t: (softmax - onehot) · mask / T, twice */
  const float *dx = qkv_tensor_data((QkvTensor *)qkv_plan_output(q, 2));
  for (gint r = 0; r < LB * LT; r++) {
    const float *row = x + r * LV;
    double mx = row[0], se = 0;
    for (gint v = 1; v < LV; v++)
      mx = MAX(mx, row[v]);
    for (gint v = 0; v < LV; v++)
      se += exp(row[v] - mx);
    for (gint v = 0; v < LV; v++) {
      double want = 2 * mask[r] * (exp(row[v] - mx) / se - (v == y[r])) / LT;
      g_assert_cmpfloat(fabs(dx[r * LV + v] - want), <=, 1e-6);
    }
  }
}

/* ---- variable shapes: an MLP -------------------------------------------- */

#define MB 8
#define MI 6
#define MH 12
#define MC 4

static QkvGraph *
mlp_graph(QkvParams *params, gint64 batch, QkvValue **loss)
{
  g_autoptr(GError) error = NULL;
  QkvGraph *g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(batch, MI), ys = QKV_SHAPE(batch);
  QkvValue *h = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_graph_input(g, "y", QKV_I32, &ys, &error);
  const gint64 sizes[] = {MI, MH, MC};
  for (gint l = 0; l < 2; l++) {
    g_autofree gchar *wn = g_strdup_printf("l%d.weight", l);
    g_autofree gchar *bn = g_strdup_printf("l%d.bias", l);
    if (qkv_params_lookup(params, wn) == NULL) {
      QkvShape ws = QKV_SHAPE(sizes[l + 1], sizes[l]), bs = QKV_SHAPE(sizes[l + 1]);
      g_autoptr(QkvTensor) wi = qkv_test_uniform(&ws, 10 + l, -0.5f, 0.5f);
      g_autoptr(QkvTensor) bi = qkv_test_uniform(&bs, 20 + l, -0.1f, 0.1f);
      qkv_tensor_copy_from(qkv_param_value(qkv_params_add(params, wn, &ws, &error)), wi, NULL);
      qkv_tensor_copy_from(qkv_param_value(qkv_params_add(params, bn, &bs, &error)), bi, NULL);
    }
    h = qkv_matmul(h, qkv_graph_param(g, params, wn, NULL), FALSE, TRUE, &error);
    h = qkv_add(h, qkv_graph_param(g, params, bn, NULL), &error);
    if (l == 0)
      h = qkv_tanh(h, &error);
  }
  /* mean over the batch: divides by the bound batch */
  *loss = qkv_cross_entropy(h, y, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_true(qkv_graph_backward(g, *loss, &error));
  g_assert_no_error(error);
  return g;
}

static GPtrArray *
snapshot_grads(QkvParams *params)
{
  GPtrArray *a = g_ptr_array_new_with_free_func((GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < qkv_params_size(params); i++)
    g_ptr_array_add(a, qkv_tensor_copy(qkv_param_grad(qkv_params_nth(params, i))));
  return a;
}

static QkvPlan *
compile_training(QkvGraph *g, QkvValue *loss)
{
  g_autoptr(GError) error = NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = 2;
  QkvPlan *plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  g_assert_no_error(error);
  return plan;
}

/* Run plan once on the bound inputs; returns the loss, *grads the
 * parameter gradients. */
static float
run_and_snapshot(QkvPlan *plan, QkvParams *params, GPtrArray **grads)
{
  g_autoptr(GError) error = NULL;
  qkv_plan_run(plan, &error);
  g_assert_no_error(error);
  *grads = snapshot_grads(params);
  return qkv_plan_output_scalar(plan, 0);
}

static void
assert_same_grads(GPtrArray *a, GPtrArray *b)
{
  g_assert_cmpuint(a->len, ==, b->len);
  for (guint i = 0; i < a->len; i++)
    qkv_assert_tensor_close(g_ptr_array_index(a, i), g_ptr_array_index(b, i), 0.0);
}

static void
test_mlp_smaller_batch(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *loss_big, *loss_small;
  g_autoptr(QkvGraph) big = mlp_graph(params, MB, &loss_big);
  g_autoptr(QkvGraph) small = mlp_graph(params, 3, &loss_small);
  g_autoptr(QkvPlan) pb = compile_training(big, loss_big);
  g_autoptr(QkvPlan) ps = compile_training(small, loss_small);

  QkvShape xs_full = QKV_SHAPE(MB, MI), ys_full = QKV_SHAPE(MB);
  QkvShape xs = QKV_SHAPE(3, MI), ys = QKV_SHAPE(3);
  g_autoptr(QkvTensor) x_full = qkv_test_uniform(&xs_full, 1, -1, 1);
  g_autoptr(QkvTensor) y_full = qkv_test_randint(&ys_full, 2, 0, MC);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 3, -1, 1);
  g_autoptr(QkvTensor) y = qkv_test_randint(&ys, 4, 0, MC);

  g_assert_true(qkv_plan_bind(ps, "x", x, &error));
  g_assert_true(qkv_plan_bind(ps, "y", y, &error));
  g_autoptr(GPtrArray) want_grads = NULL;
  float want = run_and_snapshot(ps, params, &want_grads);

  /* full batch, then the partial one, then back: each as its own plan */
  g_autoptr(GPtrArray) full_grads = NULL, got_grads = NULL, again_grads = NULL;
  g_assert_true(qkv_plan_bind(pb, "x", x_full, &error));
  g_assert_true(qkv_plan_bind(pb, "y", y_full, &error));
  float full = run_and_snapshot(pb, params, &full_grads);
  g_assert_true(qkv_plan_bind(pb, "x", x, &error));
  g_assert_true(qkv_plan_bind(pb, "y", y, &error));
  float got = run_and_snapshot(pb, params, &got_grads);
  g_assert_cmpfloat(got, ==, want);
  assert_same_grads(got_grads, want_grads);

  /* switching back and forth, with no allocation */
  guint64 before = qkv_alloc_count();
  for (gint i = 0; i < 4; i++) {
    g_assert_true(qkv_plan_bind(pb, "x", x_full, &error));
    g_assert_true(qkv_plan_bind(pb, "y", y_full, &error));
    g_assert_true(qkv_plan_run(pb, &error));
    g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, full);
    g_assert_true(qkv_plan_bind(pb, "x", x, &error));
    g_assert_true(qkv_plan_bind(pb, "y", y, &error));
    g_assert_true(qkv_plan_run(pb, &error));
    g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, want);
  }
  g_assert_cmpuint(qkv_alloc_count(), ==, before);
  g_autoptr(GPtrArray) last_grads = snapshot_grads(params);
  assert_same_grads(last_grads, want_grads);

  /* bigger than compiled, or another rank: refused, and the plan still runs */
  QkvShape xb = QKV_SHAPE(MB + 1, MI), xr = QKV_SHAPE(MB * MI);
  g_autoptr(QkvTensor) too_big = qkv_tensor_new(QKV_F32, &xb);
  g_autoptr(QkvTensor) flat = qkv_tensor_new(QKV_F32, &xr);
  g_assert_false(qkv_plan_bind(pb, "x", too_big, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "input 'x'"));
  g_clear_error(&error);
  g_assert_false(qkv_plan_bind(pb, "x", flat, &error));
  g_clear_error(&error);
  g_assert_true(qkv_plan_run(pb, &error));
  g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, want);

  /* inputs that disagree (x of 3 rows, y of 8): the shape rule refuses,
   * naming the node; binding them consistent again recovers */
  g_assert_true(qkv_plan_bind(pb, "y", y_full, &error));
  g_assert_false(qkv_plan_run(pb, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "cross_entropy"));
  g_clear_error(&error);
  g_assert_true(qkv_plan_bind(pb, "x", x_full, &error));
  g_assert_true(qkv_plan_run(pb, &error));
  g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, full);
  g_autoptr(GPtrArray) back_grads = snapshot_grads(params);
  assert_same_grads(back_grads, full_grads);
  (void)again_grads;
}

/* An op that fixes its output shape when the graph is built is refused on
 * smaller inputs, by name; a reshape with a fixed target, too. */
static void
test_static_shape_refused(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(4, 1), t = QKV_SHAPE(4, 3), flat = QKV_SHAPE(12);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  QkvValue *b = qkv_broadcast_to(x, &t, &error);
  QkvValue *r = qkv_reshape(b, &flat, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) pb = qkv_graph_compile(g, &b, 1, NULL, &error);
  g_autoptr(QkvPlan) pr = qkv_graph_compile(g, &r, 1, NULL, &error);
  g_assert_no_error(error);
  /* (1, 1) does broadcast to the fixed (4, 3): only the flag stops a silent
   * (4, 3) result where the caller expects (1, 3) */
  QkvShape one = QKV_SHAPE(1, 1), small = QKV_SHAPE(2, 1);
  g_autoptr(QkvTensor) x1 = qkv_test_uniform(&one, 1, 0, 1);
  g_autoptr(QkvTensor) xs = qkv_test_uniform(&small, 1, 0, 1);
  g_assert_true(qkv_plan_bind(pb, "x", x1, &error));
  g_assert_false(qkv_plan_run(pb, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "broadcast_to"));
  g_assert_nonnull(strstr(error->message, "fixes its output shape"));
  g_clear_error(&error);
  /* at the compiled shape it runs again */
  g_autoptr(QkvTensor) x4 = qkv_test_uniform(&s, 1, 0, 1);
  g_assert_true(qkv_plan_bind(pb, "x", x4, &error));
  g_assert_true(qkv_plan_run(pb, &error));
  g_assert_no_error(error);
  g_clear_error(&error);
  g_assert_true(qkv_plan_bind(pr, "x", xs, &error));
  g_assert_false(qkv_plan_run(pr, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
}

/* A per-example value broadcast against a constant: p = x w (B, 1) against
 * positions (S), as Luong's local-p does. Its gradient sums the broadcast
 * axis back (sum_to (B, 1)); a plan compiled at batch 4 and bound to 2 gives
 * the gradient of a plan compiled at 2. */
static QkvGraph *
broadcast_graph(QkvParams *params, gint64 batch, QkvValue **loss)
{
  g_autoptr(GError) error = NULL;
  QkvGraph *g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(batch, 1), ws = QKV_SHAPE(1), ps = QKV_SHAPE(5);
  if (qkv_params_lookup(params, "w") == NULL)
    qkv_tensor_f32(qkv_param_value(qkv_params_add(params, "w", &ws, &error)))[0] = 0.7f;
  const float pos[] = {0, 1, 2, 3, 4};
  g_autoptr(QkvTensor) pt = qkv_tensor_new_f32(&ps, pos);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *p = qkv_mul(x, qkv_graph_param(g, params, "w", NULL), &error);
  QkvValue *offset = qkv_sub(qkv_graph_constant(g, pt, &error), p, &error);
  *loss = qkv_sum(qkv_square(offset, &error), NULL, 0, FALSE, &error);
  g_assert_true(qkv_graph_backward(g, *loss, &error));
  g_assert_no_error(error);
  return g;
}

static void
test_broadcast_smaller_batch(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *loss_big, *loss_small;
  g_autoptr(QkvGraph) big = broadcast_graph(params, 4, &loss_big);
  g_autoptr(QkvGraph) small = broadcast_graph(params, 2, &loss_small);
  g_autoptr(QkvPlan) pb = compile_training(big, loss_big);
  g_autoptr(QkvPlan) ps = compile_training(small, loss_small);
  QkvShape xs = QKV_SHAPE(2, 1);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 9, 0, 6);
  g_assert_true(qkv_plan_bind(ps, "x", x, &error));
  g_autoptr(GPtrArray) want_grads = NULL, got_grads = NULL;
  float want = run_and_snapshot(ps, params, &want_grads);
  g_assert_true(qkv_plan_bind(pb, "x", x, &error));
  float got = run_and_snapshot(pb, params, &got_grads);
  g_assert_cmpfloat(got, ==, want);
  assert_same_grads(got_grads, want_grads);
}

/* ---- variable shapes: the book's Transformer and Bahdanau model ---------- */

#define TV 23
#define TB 4
#define TT 7

typedef struct {
  gboolean bahdanau;
  double dropout;
  /* the smaller batch: an unrolled GRU has a fixed number of steps, so only
   * the Transformer also varies the length */
  gint64 small_batch, small_steps;
  const QkvLuongConfig *luong; /* set: this Luong model instead */
} ModelCase;

static QkvGraph *
model_graph(QkvParams *params, const ModelCase *mc, gint64 batch, gint64 steps, QkvValue **loss)
{
  g_autoptr(GError) error = NULL;
  QkvGraph *g = qkv_graph_new();
  QkvShape bt = QKV_SHAPE(batch, steps), bs = QKV_SHAPE(batch);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, &error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, &error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, &error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, &error);
  QkvValue *tgt_valid = qkv_graph_input(g, "tgt_valid", QKV_I32, &bs, &error);
  QkvBuilder b = {.graph = g, .params = params, .seed = 3, .xavier_linear = TRUE};
  QkvValue *logits;
  if (mc->luong) {
    QkvLuongConfig cfg = *mc->luong;
    cfg.dropout = mc->dropout;
    logits = qkv_build_luong_seq2seq(&b, &cfg, src, src_valid, dec_in, NULL, &error);
  } else if (mc->bahdanau) {
    QkvGruSeq2SeqConfig cfg = {TV, TV, 8, 16, 2, mc->dropout};
    logits = qkv_build_bahdanau_seq2seq(&b, &cfg, src, src_valid, dec_in, NULL, &error);
  } else {
    QkvTransformerConfig cfg = {.src_vocab = TV,
                                .tgt_vocab = TV,
                                .num_hiddens = 16,
                                .ffn_hiddens = 32,
                                .num_heads = 2,
                                .num_layers = 2,
                                .dropout = mc->dropout};
    QkvValue *enc = qkv_build_transformer_encoder(&b, &cfg, src, src_valid, &error);
    logits = qkv_build_transformer_decoder(&b, &cfg, dec_in, enc, src_valid, NULL, &error);
  }
  *loss = qkv_build_seq2seq_loss_lens(logits, labels, tgt_valid, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, *loss, &error));
  g_assert_no_error(error);
  return g;
}

typedef struct {
  QkvTensor *src, *src_valid, *dec_in, *labels, *tgt_valid;
} Batch;

static void
batch_init(Batch *b, gint64 batch, gint64 steps, guint32 seed)
{
  QkvShape bt = QKV_SHAPE(batch, steps), bs = QKV_SHAPE(batch);
  b->src = qkv_test_randint(&bt, seed, 3, TV);
  b->dec_in = qkv_test_randint(&bt, seed + 1, 3, TV);
  b->labels = qkv_test_randint(&bt, seed + 2, 3, TV);
  b->src_valid = qkv_test_randint(&bs, seed + 3, 1, (gint32)steps + 1);
  b->tgt_valid = qkv_test_randint(&bs, seed + 4, 1, (gint32)steps + 1);
}

static void
batch_clear(Batch *b)
{
  qkv_tensor_free(b->src);
  qkv_tensor_free(b->src_valid);
  qkv_tensor_free(b->dec_in);
  qkv_tensor_free(b->labels);
  qkv_tensor_free(b->tgt_valid);
}

static void
batch_bind(QkvPlan *plan, const Batch *b)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_bind(plan, "src", b->src, &error));
  g_assert_true(qkv_plan_bind(plan, "src_valid", b->src_valid, &error));
  g_assert_true(qkv_plan_bind(plan, "dec_in", b->dec_in, &error));
  g_assert_true(qkv_plan_bind(plan, "labels", b->labels, &error));
  g_assert_true(qkv_plan_bind(plan, "tgt_valid", b->tgt_valid, &error));
  g_assert_no_error(error);
}

/* A plan compiled at (TB, TT) and bound to a smaller batch gives bit for bit
 * the loss and gradients of a plan compiled at the smaller shape. */
static void
test_model_smaller(gconstpointer data)
{
  const ModelCase *mc = data;
  const gint64 sb = mc->small_batch, st = mc->small_steps;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *loss_big, *loss_small;
  g_autoptr(QkvGraph) big = model_graph(params, mc, TB, TT, &loss_big);
  g_autoptr(QkvGraph) small = model_graph(params, mc, sb, st, &loss_small);
  g_autoptr(QkvPlan) pb = compile_training(big, loss_big);
  g_autoptr(QkvPlan) ps = compile_training(small, loss_small);
  Batch full, part;
  batch_init(&full, TB, TT, 100);
  batch_init(&part, sb, st, 200);

  batch_bind(ps, &part);
  g_autoptr(GPtrArray) want_grads = NULL;
  float want = run_and_snapshot(ps, params, &want_grads);

  /* the same step of the dropout generator as ps's run */
  qkv_plan_set_step(pb, 0);
  batch_bind(pb, &part);
  g_autoptr(GPtrArray) got_grads = NULL;
  float got = run_and_snapshot(pb, params, &got_grads);
  g_test_message("loss at (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                 "): compiled there %.9g, compiled at (%d, %d) %.9g",
                 sb, st, want, TB, TT, got);
  g_assert_cmpfloat(got, ==, want);
  assert_same_grads(got_grads, want_grads);

  /* back and forth, no allocation, the same results each time */
  batch_bind(pb, &full);
  qkv_plan_set_step(pb, 5);
  g_autoptr(GPtrArray) full_grads = NULL;
  float full_loss = run_and_snapshot(pb, params, &full_grads);
  guint64 before = qkv_alloc_count();
  for (gint i = 0; i < 3; i++) {
    batch_bind(pb, &part);
    qkv_plan_set_step(pb, 0);
    g_assert_true(qkv_plan_run(pb, NULL));
    g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, want);
    batch_bind(pb, &full);
    qkv_plan_set_step(pb, 5);
    g_assert_true(qkv_plan_run(pb, NULL));
    g_assert_cmpfloat(qkv_plan_output_scalar(pb, 0), ==, full_loss);
  }
  g_assert_cmpuint(qkv_alloc_count(), ==, before);
  g_autoptr(GPtrArray) last = snapshot_grads(params);
  assert_same_grads(last, full_grads);
  batch_clear(&full);
  batch_clear(&part);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  static const ModelCase transformer = {FALSE, 0.0, 3, 5, NULL},
                         transformer_dropout = {FALSE, 0.1, 3, 5, NULL},
                         bahdanau = {TRUE, 0.0, 3, TT, NULL},
                         bahdanau_dropout = {TRUE, 0.1, 1, TT, NULL};
  /* Luong without input feeding runs the decoder GRU over all steps and
   * attends once; with it, step by step from ã_0 = 0 */
  static const QkvLuongConfig luong_m = {.src_vocab = TV,
                                         .tgt_vocab = TV,
                                         .embed_size = 8,
                                         .num_hiddens = 16,
                                         .num_layers = 2,
                                         .attention = {.score = QKV_LUONG_GENERAL,
                                                       .align = QKV_LUONG_LOCAL_M,
                                                       .window = 2}},
                              luong_p_feed = {.src_vocab = TV,
                                              .tgt_vocab = TV,
                                              .embed_size = 8,
                                              .num_hiddens = 16,
                                              .num_layers = 2,
                                              .attention = {.score = QKV_LUONG_CONCAT,
                                                            .align = QKV_LUONG_LOCAL_P,
                                                            .window = 2},
                                              .input_feeding = TRUE};
  static const ModelCase luong = {FALSE, 0.0, 3, TT, &luong_m},
                         luong_feed_dropout = {FALSE, 0.1, 1, TT, &luong_p_feed};
  g_test_add_func("/shapes/seq2seq-loss-from-lengths", test_loss_lens);
  g_test_add_func("/shapes/mlp-smaller-batch", test_mlp_smaller_batch);
  g_test_add_func("/shapes/static-shape-refused", test_static_shape_refused);
  g_test_add_func("/shapes/broadcast-gradient-smaller-batch", test_broadcast_smaller_batch);
  g_test_add_data_func("/shapes/transformer-smaller", &transformer, test_model_smaller);
  g_test_add_data_func("/shapes/transformer-smaller-dropout", &transformer_dropout,
                       test_model_smaller);
  g_test_add_data_func("/shapes/bahdanau-smaller-batch", &bahdanau, test_model_smaller);
  g_test_add_data_func("/shapes/bahdanau-batch-of-one-dropout", &bahdanau_dropout,
                       test_model_smaller);
  g_test_add_data_func("/shapes/luong-local-m-smaller-batch", &luong, test_model_smaller);
  g_test_add_data_func("/shapes/luong-local-p-feeding-batch-of-one-dropout", &luong_feed_dropout,
                       test_model_smaller);
  return g_test_run();
}
