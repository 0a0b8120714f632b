/* test-pooling.c: attention pooling with learned queries (soft and hard),
 * mean pooling and the pooling classifier (qkv-builders.h): shapes,
 * parameter names, the padding masks, the weighted average against one
 * computed here, hard attention's picks (the argmax in evaluation, samples
 * in training that never land on padding), gradients against finite
 * differences, partial batches, and bad input refused with nothing added. */
#include "test-util.h"

#include <math.h>
#include <string.h>

#define B 3
#define T 5
#define D 4
#define K 2
#define KEY 3
#define V 7
#define C 3

static const gint32 lens_data[B] = {5, 2, 3};

typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  QkvBuilder b;
  QkvValue *x, *lens, *tokens, *labels;
} Fixture;

static void
fixture_set_up(Fixture *f, gconstpointer data)
{
  g_autoptr(GError) error = NULL;
  f->graph = qkv_graph_new();
  f->params = qkv_params_new();
  f->b = (QkvBuilder){.graph = f->graph, .params = f->params, .seed = 5};
  f->x = qkv_test_input(f->graph, "x", QKV_F32, QKV_SHAPE(B, T, D));
  f->lens = qkv_test_input(f->graph, "lens", QKV_I32, QKV_SHAPE(B));
  f->tokens = qkv_test_input(f->graph, "tokens", QKV_I32, QKV_SHAPE(B, T));
  f->labels = qkv_test_input(f->graph, "labels", QKV_I32, QKV_SHAPE(B));
}

static void
fixture_tear_down(Fixture *f, gconstpointer data)
{
  qkv_graph_free(f->graph);
  qkv_params_free(f->params);
}

static void
assert_shape(QkvValue *v, QkvShape want)
{
  g_assert_nonnull(v);
  g_autofree gchar *got = qkv_shape_to_string(qkv_value_shape(v));
  g_autofree gchar *exp = qkv_shape_to_string(&want);
  g_assert_cmpstr(got, ==, exp);
}

static void
assert_param(QkvParams *params, const gchar *name, QkvShape want)
{
  QkvParam *p = qkv_params_lookup(params, name);
  if (p == NULL)
    g_error("no parameter '%s'", name);
  g_autofree gchar *got = qkv_shape_to_string(qkv_param_shape(p));
  g_autofree gchar *exp = qkv_shape_to_string(&want);
  g_assert_cmpstr(got, ==, exp);
}

/* Weights are a masked softmax (rows sum to 1, nothing beyond the valid
 * length, exactly), and the output is their average of x, both checked
 * against sums made here in double. */
static void
check_pooling(const QkvTensor *x, const QkvTensor *w, const QkvTensor *out, gint rows,
              gboolean uniform)
{
  for (gint bi = 0; bi < B; bi++)
    for (gint r = 0; r < rows; r++) {
      double sum = 0;
      for (gint t = 0; t < T; t++) {
        double wt = qkv_tensor_get(w, ((gint64)bi * rows + r) * T + t);
        if (t >= lens_data[bi])
          g_assert_cmpfloat(wt, ==, 0.0); /* padding: not even a rounding's worth */
        else if (uniform)
          g_assert_cmpfloat_with_epsilon(wt, 1.0 / lens_data[bi], 1e-6);
        else
          g_assert_cmpfloat(wt, >, 0.0);
        sum += wt;
      }
      g_assert_cmpfloat_with_epsilon(sum, 1.0, 1e-5);
      for (gint d = 0; d < D; d++) {
        double want = 0, mag = 0;
        for (gint t = 0; t < T; t++) {
          double wt = qkv_tensor_get(w, ((gint64)bi * rows + r) * T + t);
          double xv = qkv_tensor_get(x, ((gint64)bi * T + t) * D + d);
          want += wt * xv;
          mag += fabs(wt * xv);
        }
        double got = qkv_tensor_get(out, ((gint64)bi * rows + r) * D + d);
        /* a sum of T products in f32: T u of the magnitudes */
        g_assert_cmpfloat(fabs(got - want), <=, 2 * T * QKV_TEST_U * mag + 1e-12);
      }
    }
}

static void
test_attention_pooling(Fixture *f, gconstpointer data)
{
  QkvShape btd = QKV_SHAPE(B, T, D);
  g_autoptr(GError) error = NULL;
  QkvValue *w = NULL;
  QkvValue *out = qkv_build_attention_pooling(&f->b, "pool", f->x, f->lens, K, KEY, &w, &error);
  g_assert_no_error(error);
  assert_shape(out, QKV_SHAPE(B, K, D));
  assert_shape(w, QKV_SHAPE(B, K, T));
  assert_param(f->params, "pool.queries", QKV_SHAPE(K, KEY));
  assert_param(f->params, "pool.W_k.weight", QKV_SHAPE(KEY, D));
  g_assert_cmpuint(qkv_params_size(f->params), ==, 2);

  g_autoptr(QkvTensor) x = qkv_test_uniform(&btd, 3, -2, 2);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&bs, lens_data);
  /* Padding that would show if it leaked in. The scores are linear in x, so
   * of ±1e4 one sign scores high for each query: no chance that it happens
   * to be masked by a score far below the others. */
  for (gint sign = -1; sign <= 1; sign += 2) {
    for (gint bi = 0; bi < B; bi++)
      for (gint t = lens_data[bi]; t < T; t++)
        for (gint d = 0; d < D; d++)
          qkv_tensor_f32(x)[((gsize)bi * T + t) * D + d] = sign * 1e4f;
    const gchar *names[] = {"x", "lens"};
    QkvTensor *inputs[] = {x, lens};
    QkvValue *outs[] = {out, w};
    QkvTensor *res[2];
    g_assert_true(qkv_graph_eval(f->graph, names, inputs, 2, outs, res, 2, &error));
    g_assert_no_error(error);
    check_pooling(x, res[1], res[0], K, FALSE);
    for (gint i = 0; i < B * K * D; i++)
      g_assert_cmpfloat(fabs(qkv_tensor_get(res[0], i)), <, 100);
    qkv_tensor_free(res[0]);
    qkv_tensor_free(res[1]);
  }
}

static void
test_mean_pooling(Fixture *f, gconstpointer data)
{
  QkvShape btd = QKV_SHAPE(B, T, D);
  g_autoptr(GError) error = NULL;
  QkvValue *w = NULL;
  QkvValue *out = qkv_build_mean_pooling(&f->b, f->x, f->lens, &w, &error);
  QkvValue *w_all = NULL;
  QkvValue *out_all = qkv_build_mean_pooling(&f->b, f->x, NULL, &w_all, &error);
  g_assert_no_error(error);
  assert_shape(out, QKV_SHAPE(B, 1, D));
  assert_shape(w, QKV_SHAPE(B, 1, T));
  g_assert_cmpuint(qkv_params_size(f->params), ==, 0);

  g_autoptr(QkvTensor) x = qkv_test_uniform(&btd, 4, -2, 2);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&bs, lens_data);
  const gchar *names[] = {"x", "lens"};
  QkvTensor *inputs[] = {x, lens};
  QkvValue *outs[] = {out, w, out_all, w_all};
  QkvTensor *res[4];
  g_assert_true(qkv_graph_eval(f->graph, names, inputs, 2, outs, res, 4, &error));
  g_assert_no_error(error);
  check_pooling(x, res[1], res[0], 1, TRUE);
  /* without lengths: the plain mean over all T */
  for (gint i = 0; i < B * T; i++)
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(res[3], i), 1.0 / T, 1e-6);
  for (guint i = 0; i < 4; i++)
    qkv_tensor_free(res[i]);
}

/* The position each (batch, query) row of hard weights (B, K, T) picks,
 * asserting one-hot rows within the valid length, and that the output row
 * is x at that position exactly (1·x plus zeros). */
static void
hard_picks(const QkvTensor *x, const QkvTensor *w, const QkvTensor *out, gint *picks)
{
  for (gint row = 0; row < B * K; row++) {
    gint bi = row / K, pick = -1;
    for (gint t = 0; t < T; t++) {
      double wt = qkv_tensor_get(w, (gint64)row * T + t);
      if (wt == 1.0) {
        g_assert_cmpint(pick, ==, -1);
        pick = t;
      } else {
        g_assert_cmpfloat(wt, ==, 0.0);
      }
    }
    g_assert_cmpint(pick, >=, 0);
    g_assert_cmpint(pick, <, lens_data[bi]);
    for (gint d = 0; d < D; d++)
      g_assert_cmpfloat(qkv_tensor_get(out, (gint64)row * D + d), ==,
                        qkv_tensor_get(x, ((gint64)bi * T + pick) * D + d));
    picks[row] = pick;
  }
}

/* Hard attention pooling shares the soft one's parameters and scores. In
 * evaluation each query takes the word the soft weights rank first, every
 * time; in training it samples, never padding (scored ±1e4 here, so it
 * would win if seen), differently from step to step, the same again for
 * the same seed and step. */
static void
test_hard_attention_pooling(Fixture *f, gconstpointer data)
{
  QkvShape btd = QKV_SHAPE(B, T, D);
  g_autoptr(GError) error = NULL;
  QkvValue *w = NULL, *w_soft = NULL;
  QkvValue *out =
      qkv_build_hard_attention_pooling(&f->b, "pool", f->x, f->lens, K, KEY, 0.5, &w, &error);
  g_assert_no_error(error);
  assert_shape(out, QKV_SHAPE(B, K, D));
  assert_shape(w, QKV_SHAPE(B, K, T));
  assert_param(f->params, "pool.queries", QKV_SHAPE(K, KEY));
  assert_param(f->params, "pool.W_k.weight", QKV_SHAPE(KEY, D));
  g_assert_cmpuint(qkv_params_size(f->params), ==, 2);
  qkv_build_attention_pooling(&f->b, "pool", f->x, f->lens, K, KEY, &w_soft, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_params_size(f->params), ==, 2);

  g_autoptr(QkvTensor) x = qkv_test_uniform(&btd, 3, -2, 2);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&bs, lens_data);
  gint picks[B * K], again[B * K];
  for (gint sign = -1; sign <= 1; sign += 2) {
    for (gint bi = 0; bi < B; bi++)
      for (gint t = lens_data[bi]; t < T; t++)
        for (gint d = 0; d < D; d++)
          qkv_tensor_f32(x)[((gsize)bi * T + t) * D + d] = sign * 1e4f;
    const gchar *names[] = {"x", "lens"};
    QkvTensor *inputs[] = {x, lens};
    QkvValue *outs[] = {out, w, w_soft};
    QkvTensor *res[3];
    for (gint run = 0; run < 2; run++) {
      g_assert_true(qkv_graph_eval(f->graph, names, inputs, 2, outs, res, 3, &error));
      g_assert_no_error(error);
      hard_picks(x, res[1], res[0], run == 0 ? picks : again);
      for (gint row = 0; row < B * K; row++) {
        gint best = 0;
        for (gint t = 1; t < T; t++)
          if (qkv_tensor_get(res[2], (gint64)row * T + t) >
              qkv_tensor_get(res[2], (gint64)row * T + best))
            best = t;
        g_assert_cmpint(picks[row], ==, best);
      }
      for (gint i = 0; i < 3; i++)
        qkv_tensor_free(res[i]);
    }
    g_assert_cmpmem(again, sizeof again, picks, sizeof picks);
  }

  /* training: two plans of the same seed draw alike, step by step */
  QkvValue *outs[] = {out, w};
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.seed = 21;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(f->graph, outs, 2, &o, &error);
  g_autoptr(QkvPlan) twin = qkv_graph_compile(f->graph, outs, 2, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", x, &error) && qkv_plan_bind(plan, "lens", lens, &error) &&
                qkv_plan_bind(twin, "x", x, &error) && qkv_plan_bind(twin, "lens", lens, &error));
  gint first[B * K], moved = 0;
  for (gint step = 0; step < 100; step++) {
    g_assert_true(qkv_plan_run(plan, &error) && qkv_plan_run(twin, &error));
    hard_picks(x, qkv_plan_output(plan, 1), qkv_plan_output(plan, 0), picks);
    hard_picks(x, qkv_plan_output(twin, 1), qkv_plan_output(twin, 0), again);
    g_assert_cmpmem(again, sizeof again, picks, sizeof picks);
    if (step == 0)
      memcpy(first, picks, sizeof picks);
    else
      moved += memcmp(first, picks, sizeof picks) != 0;
  }
  g_test_message("steps whose picks differ from step 0's: %d of 99", moved);
  g_assert_cmpint(moved, >, 50);
  qkv_plan_set_step(plan, 0);
  g_assert_true(qkv_plan_run(plan, &error));
  hard_picks(x, qkv_plan_output(plan, 1), qkv_plan_output(plan, 0), picks);
  g_assert_cmpmem(first, sizeof first, picks, sizeof picks);
}

/* d out / d x through the attention (keys and values are both x) against
 * finite differences, by qkv_check_gradients. */
static QkvValue *
build_pool_x(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvBuilder *proto = user_data;
  QkvBuilder b = {.graph = g, .params = proto->params, .seed = 5};
  return qkv_build_attention_pooling(&b, "pool", in[0], in[1], K, KEY, NULL, error);
}

static void
test_pooling_input_gradient(void)
{
  QkvShape btd = QKV_SHAPE(B, T, D);
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder proto = {.params = params};
  g_autoptr(QkvTensor) x = qkv_test_uniform(&btd, 6, -1, 1);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&bs, lens_data);
  QkvTensor *inputs[] = {x, lens};
  qkv_test_gradcheck("attention pooling, d/dx", 2, inputs, NULL, build_pool_x, &proto);
}

/* The classifier's training graph on tokens drawn from a small vocabulary,
 * compiled for its loss; every parameter checked by finite differences. */
static void
check_classifier_gradients(QkvPooling pooling)
{
  QkvShape btt = QKV_SHAPE(B, T), bb1 = QKV_SHAPE(B);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 9};
  QkvPoolingClassifierConfig cfg = {.vocab_size = V,
                                    .embed_size = D,
                                    .key_size = KEY,
                                    .num_queries = K,
                                    .num_classes = C,
                                    .pooling = pooling,
                                    .positional_encoding = TRUE};
  QkvValue *tokens = qkv_test_input(g, "tokens", QKV_I32, QKV_SHAPE(B, T));
  QkvValue *lens = qkv_test_input(g, "lens", QKV_I32, QKV_SHAPE(B));
  QkvValue *labels = qkv_test_input(g, "labels", QKV_I32, QKV_SHAPE(B));
  QkvValue *w = NULL;
  QkvValue *logits = qkv_build_pooling_classifier(&b, &cfg, tokens, lens, &w, &error);
  QkvValue *loss = qkv_cross_entropy(logits, labels, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  assert_shape(logits, QKV_SHAPE(B, C));
  gint64 k = pooling == QKV_POOLING_ATTENTION ? K : 1;
  assert_shape(w, QKV_SHAPE(B, k, T));
  assert_param(params, "embedding.weight", QKV_SHAPE(V, D));
  assert_param(params, "dense.weight", QKV_SHAPE(C, k * D));
  assert_param(params, "dense.bias", QKV_SHAPE(C));
  g_assert_cmpuint(qkv_params_size(params), ==, pooling == QKV_POOLING_ATTENTION ? 5 : 3);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) tok = qkv_test_randint(&btt, 11, 0, V);
  g_autoptr(QkvTensor) lab = qkv_test_randint(&bb1, 12, 0, C);
  QkvShape bs = QKV_SHAPE(B);
  g_autoptr(QkvTensor) len = qkv_tensor_new_i32(&bs, lens_data);
  g_assert_true(qkv_plan_bind(plan, "tokens", tok, &error) &&
                qkv_plan_bind(plan, "lens", len, &error) &&
                qkv_plan_bind(plan, "labels", lab, &error));
  for (guint i = 0; i < qkv_params_size(params); i++) {
    const gchar *name = qkv_param_name(qkv_params_nth(params, i));
    qkv_test_param_fd(plan, params, name, 40, 1e-2, 2e-2, 1e-2, 1.0);
  }
  /* the check itself catches a gradient 10% off */
  g_assert_cmpfloat(qkv_test_param_fd(plan, params, "dense.weight", 40, 1e-2, 2e-2, 1e-2, 1.1), >,
                    2e-2);
}

static void
test_classifier_gradients_attention(void)
{
  check_classifier_gradients(QKV_POOLING_ATTENTION);
}

static void
test_classifier_gradients_mean(void)
{
  check_classifier_gradients(QKV_POOLING_MEAN);
}

/* The classifier with hard attention: the same parameters as with soft
 * attention; dense's gradients (which do not move the picks) against finite
 * differences in an evaluation plan (picks fixed at the argmax); the
 * straight-through estimator gives the queries and keys a gradient, though
 * the picks have none. */
static void
test_classifier_hard(void)
{
  QkvShape btt = QKV_SHAPE(B, T), bb1 = QKV_SHAPE(B), bs = QKV_SHAPE(B);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = g, .params = params, .seed = 9};
  QkvPoolingClassifierConfig cfg = {.vocab_size = V,
                                    .embed_size = D,
                                    .key_size = KEY,
                                    .num_queries = K,
                                    .num_classes = C,
                                    .pooling = QKV_POOLING_HARD,
                                    .positional_encoding = TRUE};
  QkvValue *tokens = qkv_test_input(g, "tokens", QKV_I32, QKV_SHAPE(B, T));
  QkvValue *lens = qkv_test_input(g, "lens", QKV_I32, QKV_SHAPE(B));
  QkvValue *labels = qkv_test_input(g, "labels", QKV_I32, QKV_SHAPE(B));
  QkvValue *w = NULL;
  QkvValue *logits = qkv_build_pooling_classifier(&b, &cfg, tokens, lens, &w, &error);
  QkvValue *loss = qkv_cross_entropy(logits, labels, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  assert_shape(logits, QKV_SHAPE(B, C));
  assert_shape(w, QKV_SHAPE(B, K, T));
  assert_param(params, "pool.queries", QKV_SHAPE(K, KEY));
  assert_param(params, "pool.W_k.weight", QKV_SHAPE(KEY, D));
  assert_param(params, "dense.weight", QKV_SHAPE(C, K * D));
  g_assert_cmpuint(qkv_params_size(params), ==, 5);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_autoptr(QkvTensor) tok = qkv_test_randint(&btt, 11, 0, V);
  g_autoptr(QkvTensor) lab = qkv_test_randint(&bb1, 12, 0, C);
  g_autoptr(QkvTensor) len = qkv_tensor_new_i32(&bs, lens_data);
  for (gint training = 0; training < 2; training++) {
    QkvPlanOptions o = qkv_plan_options_default();
    o.training = training;
    g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &o, &error);
    g_assert_no_error(error);
    g_assert_true(qkv_plan_bind(plan, "tokens", tok, &error) &&
                  qkv_plan_bind(plan, "lens", len, &error) &&
                  qkv_plan_bind(plan, "labels", lab, &error));
    if (!training) {
      qkv_test_param_fd(plan, params, "dense.weight", 40, 1e-2, 2e-2, 1e-2, 1.0);
      qkv_test_param_fd(plan, params, "dense.bias", 40, 1e-2, 2e-2, 1e-2, 1.0);
    }
    g_assert_true(qkv_plan_run(plan, &error));
    const gchar *st[] = {"pool.queries", "pool.W_k.weight"};
    for (guint i = 0; i < G_N_ELEMENTS(st); i++)
      g_assert_cmpfloat(qkv_test_max_abs(qkv_param_grad(qkv_params_lookup(params, st[i]))), >, 0.0);
  }
}

/* Compiled for a batch of B sentences of T words, run (forward and
 * backward) on a partial batch of shorter sentences, as the example's last
 * batch and its length buckets are: the same logits as a graph built at the
 * small shapes. */
static void
test_classifier_bound_shapes(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvPoolingClassifierConfig cfg = {.vocab_size = V,
                                    .embed_size = D,
                                    .key_size = KEY,
                                    .num_queries = K,
                                    .num_classes = C,
                                    .pooling = QKV_POOLING_ATTENTION,
                                    .positional_encoding = TRUE};
  QkvValue *outs[2];
  QkvPlan *plans[2];
  QkvGraph *graphs[2];
  gint bb[] = {B, 2}, tt[] = {T, 3};
  for (gint i = 0; i < 2; i++) {
    graphs[i] = qkv_graph_new();
    QkvBuilder b = {.graph = graphs[i], .params = params, .seed = 9};
    QkvValue *tokens = qkv_test_input(graphs[i], "tokens", QKV_I32, QKV_SHAPE(bb[i], tt[i]));
    QkvValue *lens = qkv_test_input(graphs[i], "lens", QKV_I32, QKV_SHAPE(bb[i]));
    QkvValue *labels = qkv_test_input(graphs[i], "labels", QKV_I32, QKV_SHAPE(bb[i]));
    QkvValue *logits = qkv_build_pooling_classifier(&b, &cfg, tokens, lens, NULL, &error);
    QkvValue *loss = qkv_cross_entropy(logits, labels, NULL, QKV_REDUCTION_SUM, &error);
    g_assert_true(qkv_graph_backward(graphs[i], loss, &error));
    outs[0] = loss;
    outs[1] = logits;
    QkvPlanOptions o = qkv_plan_options_default();
    o.training = TRUE;
    plans[i] = qkv_graph_compile(graphs[i], outs, 2, &o, &error);
    g_assert_no_error(error);
  }
  QkvShape bt = QKV_SHAPE(2, 3), bs = QKV_SHAPE(2);
  g_autoptr(QkvTensor) tok = qkv_test_randint(&bt, 13, 0, V);
  g_autoptr(QkvTensor) len = qkv_tensor_new_i32(&bs, (const gint32[]){3, 1});
  g_autoptr(QkvTensor) lab = qkv_tensor_new_i32(&bs, (const gint32[]){2, 0});
  g_autoptr(QkvTensor) grad0 = NULL;
  for (gint i = 0; i < 2; i++) {
    g_assert_true(qkv_plan_bind(plans[i], "tokens", tok, &error) &&
                  qkv_plan_bind(plans[i], "lens", len, &error) &&
                  qkv_plan_bind(plans[i], "labels", lab, &error));
    g_assert_true(qkv_plan_run(plans[i], &error));
    g_assert_no_error(error);
    if (i == 0)
      grad0 = qkv_tensor_copy(qkv_param_grad(qkv_params_lookup(params, "pool.queries")));
  }
  qkv_assert_scaled("logits", qkv_plan_output(plans[0], 1), qkv_plan_output(plans[1], 1), 64);
  qkv_assert_scaled("d loss / d queries", grad0,
                    qkv_param_grad(qkv_params_lookup(params, "pool.queries")), 256);
  for (gint i = 0; i < 2; i++) {
    qkv_plan_free(plans[i]);
    qkv_graph_free(graphs[i]);
  }
}

/* call (using &error) fails with a message matching pattern, adding no node,
 * value or parameter, and sets *w (if given) to NULL. */
#define ASSERT_FAILS(f, call, pattern)                                                             \
  G_STMT_START                                                                                     \
  {                                                                                                \
    guint nodes_ = qkv_graph_n_nodes((f)->graph), values_ = qkv_graph_n_values((f)->graph);        \
    guint params_ = qkv_params_size((f)->params);                                                  \
    GError *error = NULL;                                                                          \
    QkvValue *r_ = (call);                                                                         \
    g_assert_null(r_);                                                                             \
    g_assert_nonnull(error);                                                                       \
    g_test_message("%s", error->message);                                                          \
    if (!g_pattern_match_simple((pattern), error->message))                                        \
      g_error("'%s' does not match '%s'", error->message, (pattern));                              \
    g_assert_cmpuint(qkv_graph_n_nodes((f)->graph), ==, nodes_);                                   \
    g_assert_cmpuint(qkv_graph_n_values((f)->graph), ==, values_);                                 \
    g_assert_cmpuint(qkv_params_size((f)->params), ==, params_);                                   \
    g_clear_error(&error);                                                                         \
  }                                                                                                \
  G_STMT_END

static void
test_bad_input(Fixture *f, gconstpointer data)
{
  QkvBuilder *b = &f->b;
  QkvValue *w = f->x;
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "pool", f->x, f->lens, 0, KEY, &w, &error),
               "qkv_build_attention_pooling: num_queries is 0, it must be > 0");
  g_assert_null(w);
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "pool", f->x, f->lens, K, -1, NULL, &error),
               "qkv_build_attention_pooling: key_size is -1, it must be > 0");
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "pool", f->tokens, f->lens, K, KEY, NULL, &error),
               "qkv_build_attention_pooling: x must be f32 (B, T, D), got i32 (3, 5)");
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "pool", f->x, f->tokens, K, KEY, NULL, &error),
               "qkv_build_attention_pooling: valid_lens must be i32 (B) = (3), got i32 (3, 5)");
  ASSERT_FAILS(f, qkv_build_mean_pooling(b, f->x, f->x, NULL, &error),
               "qkv_build_mean_pooling: valid_lens must be i32 (B)*");
  const double bad_taus[] = {0.0, -1.0, NAN, INFINITY};
  for (guint i = 0; i < G_N_ELEMENTS(bad_taus); i++) {
    w = f->x;
    ASSERT_FAILS(
        f,
        qkv_build_hard_attention_pooling(b, "pool", f->x, f->lens, K, KEY, bad_taus[i], &w, &error),
        "qkv_build_hard_attention_pooling: tau is *, it must be finite and > 0");
    g_assert_null(w);
  }
  ASSERT_FAILS(
      f, qkv_build_hard_attention_pooling(b, "pool", f->x, f->lens, 0, KEY, 1.0, NULL, &error),
      "qkv_build_hard_attention_pooling: num_queries is 0, it must be > 0");
  /* the queries exist with another shape: found after W_k's turn came */
  QkvShape odd = QKV_SHAPE(97);
  g_autoptr(GError) setup = NULL;
  g_assert_nonnull(qkv_params_add(f->params, "bad.W_k.weight", &odd, &setup));
  w = f->x;
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "bad", f->x, f->lens, K, KEY, &w, &error),
               "parameter 'bad.W_k.weight' exists with shape (97)*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "bad.queries"));
  /* both wrong: the first error is the one reported (and the only one set) */
  g_assert_nonnull(qkv_params_add(f->params, "bad2.queries", &odd, &setup));
  g_assert_nonnull(qkv_params_add(f->params, "bad2.W_k.weight", &odd, &setup));
  ASSERT_FAILS(f, qkv_build_attention_pooling(b, "bad2", f->x, f->lens, K, KEY, NULL, &error),
               "parameter 'bad2.queries' exists with shape (97)*");

  const gchar *me = "qkv_build_pooling_classifier: ";
  const struct {
    QkvPoolingClassifierConfig cfg;
    const gchar *reason;
  } bad[] = {
      {{.vocab_size = 0,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = K,
        .num_classes = C,
        .pooling = QKV_POOLING_ATTENTION},
       "cfg->vocab_size is 0, it must be > 0"},
      {{.vocab_size = V,
        .embed_size = 0,
        .key_size = KEY,
        .num_queries = K,
        .num_classes = C,
        .pooling = QKV_POOLING_ATTENTION},
       "cfg->embed_size is 0, it must be > 0"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = K,
        .num_classes = 0,
        .pooling = QKV_POOLING_ATTENTION},
       "cfg->num_classes is 0, it must be > 0"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = 0,
        .num_classes = C,
        .pooling = QKV_POOLING_ATTENTION},
       "cfg->num_queries is 0, it must be > 0"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = 0,
        .num_queries = K,
        .num_classes = C,
        .pooling = QKV_POOLING_ATTENTION},
       "cfg->key_size is 0, it must be > 0"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = K,
        .num_classes = C,
        .pooling = 7},
       "cfg->pooling is 7, it must be QKV_POOLING_ATTENTION, QKV_POOLING_MEAN or QKV_POOLING_HARD"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = K,
        .num_classes = C,
        .pooling = QKV_POOLING_HARD,
        .tau = -0.5},
       "cfg->tau is -0.5, it must be finite and > 0"},
      {{.vocab_size = V,
        .embed_size = D,
        .key_size = KEY,
        .num_queries = 0,
        .num_classes = C,
        .pooling = QKV_POOLING_HARD},
       "cfg->num_queries is 0, it must be > 0"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree gchar *pattern = g_strconcat(me, bad[i].reason, NULL);
    w = f->x;
    ASSERT_FAILS(f, qkv_build_pooling_classifier(b, &bad[i].cfg, f->tokens, f->lens, &w, &error),
                 pattern);
    g_assert_null(w);
  }
  /* mean pooling ignores the attention fields */
  QkvPoolingClassifierConfig mean = {.vocab_size = V,
                                     .embed_size = D,
                                     .key_size = 0,
                                     .num_queries = 0,
                                     .num_classes = C,
                                     .pooling = QKV_POOLING_MEAN};
  ASSERT_FAILS(f, qkv_build_pooling_classifier(b, &mean, f->x, f->lens, NULL, &error),
               "qkv_build_pooling_classifier: tokens must be i32 (B, T), got f32 (3, 5, 4)");
  /* the last parameter of all is wrong: everything before goes too */
  g_assert_nonnull(qkv_params_add(f->params, "dense.bias", &odd, &setup));
  QkvPoolingClassifierConfig good = {.vocab_size = V,
                                     .embed_size = D,
                                     .key_size = KEY,
                                     .num_queries = K,
                                     .num_classes = C,
                                     .pooling = QKV_POOLING_ATTENTION,
                                     .positional_encoding = TRUE};
  w = f->x;
  ASSERT_FAILS(f, qkv_build_pooling_classifier(b, &good, f->tokens, f->lens, &w, &error),
               "parameter 'dense.bias' exists with shape (97)*");
  g_assert_null(w);
  g_assert_null(qkv_params_lookup(f->params, "embedding.weight"));
  /* a NULL input from an earlier failure: NULL, the error left alone */
  g_assert_null(qkv_build_pooling_classifier(b, &good, NULL, f->lens, NULL, NULL));
  g_assert_null(qkv_build_attention_pooling(b, "pool", NULL, f->lens, K, KEY, NULL, NULL));
  g_assert_null(qkv_build_mean_pooling(b, NULL, f->lens, NULL, NULL));
  g_assert_null(
      qkv_build_hard_attention_pooling(b, "pool", NULL, f->lens, K, KEY, 1.0, NULL, NULL));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
#define ADD(path, func) g_test_add(path, Fixture, NULL, fixture_set_up, func, fixture_tear_down)
  ADD("/pooling/attention", test_attention_pooling);
  ADD("/pooling/mean", test_mean_pooling);
  ADD("/pooling/hard-attention", test_hard_attention_pooling);
  ADD("/pooling/bad-input", test_bad_input);
#undef ADD
  g_test_add_func("/pooling/input-gradient", test_pooling_input_gradient);
  g_test_add_func("/pooling/classifier-gradients-attention", test_classifier_gradients_attention);
  g_test_add_func("/pooling/classifier-gradients-mean", test_classifier_gradients_mean);
  g_test_add_func("/pooling/classifier-gradients-hard", test_classifier_hard);
  g_test_add_func("/pooling/classifier-bound-shapes", test_classifier_bound_shapes);
  return g_test_run();
}
