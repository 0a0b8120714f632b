/* test-tsan.c: the concurrent uses docs/threads.md allows, each checked
 * against the same work done on one thread. CI builds this suite with
 * -Db_sanitize=thread (.ci/run, stage "ThreadSanitizer"), where a data race
 * inside qkv fails it even when the numbers come out right; in the ordinary
 * builds it checks the numbers only.
 *
 * The allowed cases:
 *   - two evaluation plans over one shared QkvParams, run at once;
 *   - an evaluation plan beside a training plan over the same store (the
 *     training run writes the store's gradients, the evaluation reads its
 *     values; nobody steps an optimizer meanwhile);
 *   - two trainings with a store, graph, plan and optimizer each;
 *   - two step decoders over one store, each translating and stepping;
 *   - two plans of 2 threads each, sharing qkv's one thread pool (the one
 *     that finds it busy runs its loops on its own thread).
 *
 * Every comparison is exact (memcmp or ==): the same plan or decoder on the
 * same inputs runs the same kernels in the same order whichever thread calls
 * it, so no rounding can differ. The exception is the pool case, where a plan
 * that finds the pool busy runs a loop as one chunk instead of two; it is
 * checked against a bound instead (see test_pool). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "test-util.h"

#define ROUNDS 12

/* The model, its batches and its graph are test-util.h's seq2seq fixtures,
 * shared with test-concurrency.c. */

static void
bind_batch(QkvPlan *plan, const QkvTestBatch *b)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_test_batch_bind(plan, b, &error));
  g_assert_no_error(error);
}

/* The seq2seq Transformer over params (created on first use, shared after)
 * with two outputs, the decoder's logits and the masked loss; gradients when
 * train. */
static QkvPlan *
transformer_plan(QkvGraph *g, QkvParams *params, gboolean train, gint n_threads)
{
  g_autoptr(GError) error = NULL;
  QkvValue *logits = NULL;
  QkvValue *loss = qkv_test_s2s_build(g, params, &logits);
  if (train)
    g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = n_threads;
  QkvValue *outs[] = {logits, loss};
  QkvPlan *plan = qkv_graph_compile(g, outs, 2, &o, &error);
  g_assert_no_error(error);
  return plan;
}

/* One run's results: the logits and the loss, and with grads the store's
 * gradients, end to end. */
typedef struct {
  float *logits;
  gsize n_logits;
  float loss;
  float *grads;
  gsize n_grads;
} Result;

static void
result_clear(Result *r)
{
  g_clear_pointer(&r->logits, g_free);
  g_clear_pointer(&r->grads, g_free);
}

static void
run_plan(QkvPlan *plan, QkvParams *grads_of, Result *out)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  const QkvTensor *logits = qkv_plan_output(plan, 0);
  out->n_logits = (gsize)qkv_tensor_numel(logits);
  out->logits = g_memdup2(qkv_tensor_const_data(logits), qkv_tensor_nbytes(logits));
  out->loss = qkv_plan_output_scalar(plan, 1);
  if (grads_of == NULL)
    return;
  out->grads = qkv_test_params_flatten(grads_of, TRUE, &out->n_grads);
}

static gboolean
result_equal(const Result *a, const Result *b)
{
  return a->n_logits == b->n_logits &&
         memcmp(a->logits, b->logits, a->n_logits * sizeof(float)) == 0 && a->loss == b->loss &&
         a->n_grads == b->n_grads &&
         (a->n_grads == 0 || memcmp(a->grads, b->grads, a->n_grads * sizeof(float)) == 0);
}

/* ---- plans over one store ------------------------------------------------- */

typedef struct {
  QkvPlan *plan;
  QkvParams *grads_of; /* the store whose gradients the plan writes, or NULL */
  const Result *want;
  gint wrong;
} PlanJob;

static gpointer
plan_job(gpointer data)
{
  PlanJob *j = data;
  for (gint round = 0; round < ROUNDS; round++) {
    Result got = {0};
    run_plan(j->plan, j->grads_of, &got);
    j->wrong += !result_equal(&got, j->want);
    result_clear(&got);
  }
  return NULL;
}

/* Run both jobs at once, each in a thread of its own; both must give their
 * single-threaded results in every round. */
static void
run_side_by_side(PlanJob *jobs)
{
  GThread *threads[2];
  for (gint i = 0; i < 2; i++)
    threads[i] = g_thread_new("plan", plan_job, &jobs[i]);
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  for (gint i = 0; i < 2; i++)
    if (jobs[i].wrong > 0)
      g_error("plan %d: %d of %d concurrent runs differ from its run alone", i, jobs[i].wrong,
              ROUNDS);
}

/* Two evaluation plans, compiled from two graphs over one store, each bound
 * to its own batch. */
static void
test_eval_plans_shared_params(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g0 = qkv_graph_new();
  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  g_autoptr(QkvPlan) p0 = transformer_plan(g0, params, FALSE, 1);
  g_autoptr(QkvPlan) p1 = transformer_plan(g1, params, FALSE, 1);
  QkvTestBatch b0, b1;
  qkv_test_batch_init(&b0, QKV_TEST_S2S_ROWS, 7);
  qkv_test_batch_init(&b1, QKV_TEST_S2S_ROWS, 17);
  bind_batch(p0, &b0);
  bind_batch(p1, &b1);
  Result want[2] = {{0}};
  run_plan(p0, NULL, &want[0]);
  run_plan(p1, NULL, &want[1]);
  /* different batches: a plan that read the other's inputs would show */
  g_assert_false(result_equal(&want[0], &want[1]));
  PlanJob jobs[2] = {{.plan = p0, .want = &want[0]}, {.plan = p1, .want = &want[1]}};
  run_side_by_side(jobs);
  for (gint i = 0; i < 2; i++)
    result_clear(&want[i]);
  qkv_test_batch_clear(&b0);
  qkv_test_batch_clear(&b1);
}

/* A training plan (forward and backward, writing the store's gradients)
 * beside an evaluation plan reading the same parameter values. */
static void
test_eval_beside_training(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g0 = qkv_graph_new();
  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  g_autoptr(QkvPlan) train = transformer_plan(g0, params, TRUE, 1);
  g_autoptr(QkvPlan) eval = transformer_plan(g1, params, FALSE, 1);
  QkvTestBatch b0, b1;
  qkv_test_batch_init(&b0, QKV_TEST_S2S_ROWS, 27);
  qkv_test_batch_init(&b1, QKV_TEST_S2S_ROWS, 37);
  bind_batch(train, &b0);
  bind_batch(eval, &b1);
  Result want[2] = {{0}};
  run_plan(train, params, &want[0]);
  run_plan(eval, NULL, &want[1]);
  g_assert_cmpuint(want[0].n_grads, >, 0);
  PlanJob jobs[2] = {{.plan = train, .grads_of = params, .want = &want[0]},
                     {.plan = eval, .want = &want[1]}};
  run_side_by_side(jobs);
  for (gint i = 0; i < 2; i++)
    result_clear(&want[i]);
  qkv_test_batch_clear(&b0);
  qkv_test_batch_clear(&b1);
}

/* ---- two independent trainings -------------------------------------------- */

enum { TRAIN_STEPS = 8 };

typedef struct {
  guint32 seed;
  float losses[TRAIN_STEPS];
  float *values; /* the parameters after the last step, end to end */
  gsize n_values;
} Training;

/* A whole training with its own store, graph, plan and Adam: the loss of
 * every step, and the parameters it ends with. */
static gpointer
train(gpointer data)
{
  Training *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvPlan) plan = transformer_plan(g, params, TRUE, 1);
  QkvOptimConfig config = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &config, &error);
  g_assert_no_error(error);
  QkvTestBatch b;
  qkv_test_batch_init(&b, QKV_TEST_S2S_ROWS, t->seed);
  bind_batch(plan, &b);
  for (gint step = 0; step < TRAIN_STEPS; step++) {
    qkv_params_zero_grad(params);
    g_assert_true(qkv_plan_run(plan, &error));
    t->losses[step] = qkv_plan_output_scalar(plan, 1);
    g_assert_true(qkv_optimizer_step(opt, &error));
    g_assert_no_error(error);
  }
  t->values = qkv_test_params_flatten(params, FALSE, &t->n_values);
  qkv_test_batch_clear(&b);
  return NULL;
}

static void
test_independent_trainings(void)
{
  Training want[2] = {{.seed = 47}, {.seed = 57}}, got[2] = {{.seed = 47}, {.seed = 57}};
  for (gint i = 0; i < 2; i++)
    train(&want[i]);
  /* the training learns: a test of losses that never move would be empty */
  for (gint i = 0; i < 2; i++)
    g_assert_cmpfloat(want[i].losses[TRAIN_STEPS - 1], <, want[i].losses[0]);
  g_assert_true(memcmp(want[0].losses, want[1].losses, sizeof want[0].losses) != 0);
  GThread *threads[2];
  for (gint i = 0; i < 2; i++)
    threads[i] = g_thread_new("train", train, &got[i]);
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  for (gint i = 0; i < 2; i++) {
    for (gint s = 0; s < TRAIN_STEPS; s++)
      if (got[i].losses[s] != want[i].losses[s])
        g_error("training %d, step %d: loss %.9g beside another training, %.9g alone", i, s,
                got[i].losses[s], want[i].losses[s]);
    g_assert_cmpuint(got[i].n_values, ==, want[i].n_values);
    g_assert_true(memcmp(got[i].values, want[i].values, want[i].n_values * sizeof(float)) == 0);
    g_free(got[i].values);
    g_free(want[i].values);
  }
}

/* ---- two step decoders over one store ------------------------------------- */

enum { MAX_LEN = 8, DEC_STEPS = 5 };

static const gint32 fed_tokens[DEC_STEPS][2] = {{1, 1}, {4, 5}, {6, 3}, {7, 7}, {3, 9}};

typedef struct {
  QkvStepDecoder *decoder;
  QkvTensor *src, *src_valid;
  const QkvBeamOptions *options;
  /* one translation and DEC_STEPS fed steps' logits */
  gint32 tokens[2 * MAX_LEN];
  gint lengths[2];
  double scores[2];
  float *logits;
  gint wrong;
} Decoding;

static void
decode_once(Decoding *d, gint32 *tokens, gint *lengths, double *scores, float *logits)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_step_decoder_translate(d->decoder, d->src, d->src_valid, d->options, tokens,
                                           lengths, scores, &error));
  g_assert_true(qkv_step_decoder_start(d->decoder, d->src, d->src_valid, 1, &error));
  const gsize vocab = (gsize)qkv_test_s2s_config.tgt_vocab;
  for (gint t = 0; t < DEC_STEPS; t++)
    g_assert_true(qkv_step_decoder_step(d->decoder, t, fed_tokens[t], NULL, 2,
                                        logits + t * 2 * vocab, &error));
  g_assert_no_error(error);
}

static gpointer
decode_rounds(gpointer data)
{
  Decoding *d = data;
  const gsize n_logits = (gsize)DEC_STEPS * 2 * qkv_test_s2s_config.tgt_vocab;
  g_autofree float *logits = g_new(float, n_logits);
  for (gint round = 0; round < ROUNDS; round++) {
    gint32 tokens[2 * MAX_LEN];
    gint lengths[2];
    double scores[2];
    decode_once(d, tokens, lengths, scores, logits);
    d->wrong += memcmp(tokens, d->tokens, sizeof tokens) != 0 ||
                memcmp(lengths, d->lengths, sizeof lengths) != 0 ||
                memcmp(scores, d->scores, sizeof scores) != 0 ||
                memcmp(logits, d->logits, n_logits * sizeof(float)) != 0;
  }
  return NULL;
}

static void
test_step_decoders_shared_params(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  /* creates and initialises the parameters */
  g_autoptr(QkvPlan) unused = transformer_plan(g, params, FALSE, 1);
  QkvBeamOptions o = qkv_beam_options_default();
  o.beam_size = 3;
  o.max_len = MAX_LEN;
  o.vocab = qkv_test_s2s_config.tgt_vocab;
  QkvShape two = QKV_SHAPE(2, QKV_TEST_S2S_SRC_LEN), two_rows = QKV_SHAPE(2);
  Decoding d[2];
  for (gint i = 0; i < 2; i++) {
    d[i] = (Decoding){.options = &o};
    d[i].decoder = qkv_step_decoder_new_transformer(params, &qkv_test_s2s_config, 6,
                                                    QKV_TEST_S2S_SRC_LEN, MAX_LEN, 1, &error);
    g_assert_no_error(error);
    d[i].src = qkv_test_randint(&two, 9 + 10 * i, 3, (gint32)qkv_test_s2s_config.src_vocab);
    d[i].src_valid = qkv_test_randint(&two_rows, 10 + 10 * i, 2, QKV_TEST_S2S_SRC_LEN + 1);
    d[i].logits = g_new(float, (gsize)DEC_STEPS * 2 * qkv_test_s2s_config.tgt_vocab);
    decode_once(&d[i], d[i].tokens, d[i].lengths, d[i].scores, d[i].logits);
  }
  g_assert_true(memcmp(d[0].logits, d[1].logits,
                       (gsize)2 * qkv_test_s2s_config.tgt_vocab * sizeof(float)) != 0);
  GThread *threads[2];
  for (gint i = 0; i < 2; i++)
    threads[i] = g_thread_new("decoder", decode_rounds, &d[i]);
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  for (gint i = 0; i < 2; i++) {
    if (d[i].wrong > 0)
      g_error("decoder %d: %d of %d concurrent rounds differ from its rounds alone", i, d[i].wrong,
              ROUNDS);
    qkv_step_decoder_free(d[i].decoder);
    qkv_tensor_free(d[i].src);
    qkv_tensor_free(d[i].src_valid);
    g_free(d[i].logits);
  }
}

/* ---- two plans sharing the thread pool ------------------------------------ */

enum { POOL_ROWS = 256, POOL_DIM = 128 };

typedef struct {
  QkvPlan *plan;
  const float *want;
  gsize n;
  double worst; /* the largest |got - want| / (1 + |want|) over the rounds */
} PoolJob;

static gpointer
pool_job(gpointer data)
{
  PoolJob *j = data;
  g_autoptr(GError) error = NULL;
  for (gint round = 0; round < ROUNDS; round++) {
    g_assert_true(qkv_plan_run(j->plan, &error));
    const float *got = qkv_tensor_const_data(qkv_plan_output(j->plan, 0));
    for (gsize i = 0; i < j->n; i++)
      j->worst = MAX(j->worst, fabs((double)got[i] - j->want[i]) / (1 + fabs(j->want[i])));
  }
  return NULL;
}

/* softmax(x · w) rows over a shared w, with 2 threads per plan: big enough
 * that the kernels split their loops (qkv_kernel_threads()), so the two
 * plans compete for the one pool and one of them regularly runs a loop on
 * its own thread. */
static QkvPlan *
pool_plan(QkvGraph *g, QkvParams *params, const QkvTensor *x)
{
  g_autoptr(GError) error = NULL;
  QkvShape xs = QKV_SHAPE(POOL_ROWS, POOL_DIM);
  QkvValue *xv = qkv_test_input(g, "x", QKV_F32, xs);
  QkvValue *w = qkv_graph_param(g, params, "w", &error);
  QkvValue *y = qkv_softmax(qkv_matmul(xv, w, FALSE, FALSE, &error), &error);
  g_assert_no_error(error);
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = 2;
  QkvPlan *plan = qkv_graph_compile(g, &y, 1, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", (QkvTensor *)x, &error));
  return plan;
}

static void
test_pool(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(POOL_DIM, POOL_DIM), xs = QKV_SHAPE(POOL_ROWS, POOL_DIM);
  QkvParam *p = qkv_params_add(params, "w", &ws, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_init_uniform(qkv_param_value(p), -0.5, 0.5, 3, &error));
  g_autoptr(QkvTensor) x0 = qkv_test_uniform(&xs, 1, -1, 1);
  g_autoptr(QkvTensor) x1 = qkv_test_uniform(&xs, 2, -1, 1);
  g_autoptr(QkvGraph) g0 = qkv_graph_new();
  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  g_autoptr(QkvPlan) p0 = pool_plan(g0, params, x0);
  g_autoptr(QkvPlan) p1 = pool_plan(g1, params, x1);
  PoolJob jobs[2];
  for (gint i = 0; i < 2; i++) {
    QkvPlan *plan = i == 0 ? p0 : p1;
    g_assert_true(qkv_plan_run(plan, &error));
    const QkvTensor *y = qkv_plan_output(plan, 0);
    jobs[i] = (PoolJob){.plan = plan,
                        .want = g_memdup2(qkv_tensor_const_data(y), qkv_tensor_nbytes(y)),
                        .n = (gsize)qkv_tensor_numel(y)};
  }
  GThread *threads[2];
  for (gint i = 0; i < 2; i++)
    threads[i] = g_thread_new("pool", pool_job, &jobs[i]);
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  /* A loop run as one chunk instead of two may sum a dot product of
   * POOL_DIM terms in another order: each order is within γ_POOL_DIM·Σ|a·b|
   * of the exact sum (Higham, Thm 3.1), so two orders differ by at most
   * twice that. With |x| ≤ 1, |w| ≤ 0.5 the logits' Σ|a·b| ≤ POOL_DIM/2,
   * and softmax's derivative is at most 1 per logit, relative to (1 + |y|)
   * adds the exp's and the division's few ulps (the 4 below). */
  const double bound = 2 * qkv_test_gamma(POOL_DIM) * POOL_DIM / 2 + 4 * FLT_EPSILON;
  for (gint i = 0; i < 2; i++) {
    g_test_message("pool plan %d: worst difference %.3g (bound %.3g)", i, jobs[i].worst, bound);
    g_assert_cmpfloat(jobs[i].worst, <=, bound);
    g_free((gpointer)jobs[i].want);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/tsan/eval-plans-shared-params", test_eval_plans_shared_params);
  g_test_add_func("/tsan/eval-beside-training", test_eval_beside_training);
  g_test_add_func("/tsan/independent-trainings", test_independent_trainings);
  g_test_add_func("/tsan/step-decoders-shared-params", test_step_decoders_shared_params);
  g_test_add_func("/tsan/pool", test_pool);
  return g_test_run();
}
