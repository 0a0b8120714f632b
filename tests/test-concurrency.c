/* test-concurrency.c: what happens when two threads use one object that
 * must not be used by two at once (docs/threads.md, "What may run
 * concurrently"). A plan, a step decoder, or a parameter store's gradient
 * buffers taken by a second thread while a first one uses them refuse the
 * second call with QKV_ERROR_BUSY: each call either does its whole work and
 * gives exactly the single-threaded result, or fails with that error, and
 * memory is never corrupted (the suite also runs under AddressSanitizer).
 *
 * The threads meet at a barrier before every round so that their calls
 * overlap, and again after it, so that results are read while no call is
 * running: a plan's outputs and the store's gradients belong to whichever
 * run came last, so reading them while another run writes them would be a
 * race of the test itself. A short random wait after the first barrier
 * varies which thread calls first. Plans run on one thread each so
 * that a result does not depend on whether the thread pool was free. */
#include <pthread.h>
#include <string.h>

#include "test-util.h"

#define ROUNDS 150

/* The model, its batches and its graph are test-util.h's seq2seq fixtures,
 * shared with test-tsan.c. */

/* The seq2seq Transformer with its loss and gradients over params, compiled
 * for QKV_TEST_S2S_ROWS rows on one thread. */
static QkvPlan *
training_plan(QkvGraph *g, QkvParams *params)
{
  g_autoptr(GError) error = NULL;
  QkvValue *loss = qkv_test_s2s_build(g, params, NULL);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = 1;
  QkvPlan *plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  g_assert_no_error(error);
  return plan;
}

static gboolean
grads_equal(QkvParams *params, const float *want, gsize n)
{
  gsize got_n;
  g_autofree float *got = qkv_test_params_flatten(params, TRUE, &got_n);
  return got_n == n && memcmp(got, want, n * sizeof(float)) == 0;
}

/* Run plan once on b, single-threaded: its loss, and (if grads is not NULL)
 * a copy of the store's gradients. */
static float
reference_run(QkvPlan *plan, const QkvTestBatch *b, QkvParams *params, float **grads,
              gsize *n_grads)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_test_batch_bind(plan, b, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  if (grads != NULL)
    *grads = qkv_test_params_flatten(params, TRUE, n_grads);
  return qkv_plan_output_scalar(plan, 0);
}

/* A failed call must have been refused for the right reason; a shape error
 * is also fine where the other thread's bindings were mixed with ours. */
static void
check_refusal(GError *error, gboolean shape_allowed, gint *busy)
{
  if (error == NULL)
    return;
  if (shape_allowed && g_error_matches(error, QKV_ERROR, QKV_ERROR_SHAPE))
    return;
  if (!g_error_matches(error, QKV_ERROR, QKV_ERROR_BUSY))
    g_error("a concurrent call failed with something else than QKV_ERROR_BUSY: %s", error->message);
  (*busy)++;
}

/* In half the rounds, spin for up to 30 µs (a sleep is too coarse), so
 * that which thread calls first varies while the calls still overlap. */
static void
jitter(GRand *rand)
{
  if (g_rand_boolean(rand))
    return;
  gint64 until = g_get_monotonic_time() + g_rand_int_range(rand, 0, 30);
  while (g_get_monotonic_time() < until)
    ;
}

/* ---- one plan, two threads ------------------------------------------------ */

typedef struct {
  QkvPlan *plan;
  const QkvTestBatch *batch;
  pthread_barrier_t *barrier;
  gboolean own_batches; /* the threads bind batches of different sizes */
  float want;           /* the loss of a run on batch */
  gint ok, busy, wrong;
  float first_wrong;
} PlanHammer;

static gpointer
plan_hammer(gpointer data)
{
  PlanHammer *h = data;
  g_autoptr(GRand) rand = g_rand_new();
  for (gint round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(h->barrier);
    jitter(rand);
    GError *error = NULL;
    gboolean ran = qkv_test_batch_bind(h->plan, h->batch, &error) && qkv_plan_run(h->plan, &error);
    check_refusal(error, h->own_batches, &h->busy);
    g_clear_error(&error);
    pthread_barrier_wait(h->barrier);
    /* Both runs may have succeeded, one after the other: the output is the
     * last one's, the same loss when both bound the same batch. */
    if (ran && !h->own_batches) {
      float got = qkv_plan_output_scalar(h->plan, 0);
      if (got != h->want && h->wrong++ == 0)
        h->first_wrong = got;
    }
    h->ok += ran;
    pthread_barrier_wait(h->barrier);
  }
  return NULL;
}

static void
hammer_one_plan(gboolean own_batches)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvPlan) plan = training_plan(g, params);
  QkvTestBatch full, half;
  qkv_test_batch_init(&full, QKV_TEST_S2S_ROWS, 7);
  qkv_test_batch_init(&half, QKV_TEST_S2S_ROWS / 2, 17);
  gsize n_grads;
  g_autofree float *want_grads = NULL;
  float want = reference_run(plan, &full, params, &want_grads, &n_grads);
  float want_half = reference_run(plan, &half, params, NULL, NULL);
  g_assert_cmpfloat(want, !=, want_half);

  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, 2);
  PlanHammer h[2];
  GThread *threads[2];
  for (gint i = 0; i < 2; i++) {
    h[i] = (PlanHammer){.plan = plan,
                        .batch = own_batches && i == 0 ? &half : &full,
                        .barrier = &barrier,
                        .own_batches = own_batches,
                        .want = want};
    threads[i] = g_thread_new("hammer", plan_hammer, &h[i]);
  }
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  pthread_barrier_destroy(&barrier);
  for (gint i = 0; i < 2; i++) {
    g_test_message("thread %d: %d runs, %d refused as busy, %d wrong losses", i, h[i].ok, h[i].busy,
                   h[i].wrong);
    if (h[i].wrong > 0)
      g_error("thread %d: %d of %d runs gave a wrong loss (first %.9g, want %.9g)", i, h[i].wrong,
              h[i].ok, h[i].first_wrong, want);
    g_assert_cmpint(h[i].ok + h[i].busy, >=, 1);
  }
  /* the plan is intact: one more run on the full batch is the reference */
  g_assert_cmpfloat(reference_run(plan, &full, params, NULL, NULL), ==, want);
  g_assert_true(grads_equal(params, want_grads, n_grads));
  qkv_test_batch_clear(&full);
  qkv_test_batch_clear(&half);
}

static void
test_plan_shared_batch(void)
{
  hammer_one_plan(FALSE);
}

/* Each thread binds its own batch, one smaller than compiled: a bind never
 * lands in the middle of a run (which would shrink the views under its
 * kernels), so nothing is written out of bounds. */
static void
test_plan_own_batches(void)
{
  hammer_one_plan(TRUE);
}

/* ---- two plans over one store --------------------------------------------- */

typedef struct {
  QkvPlan *plan;
  pthread_barrier_t *barrier;
  float want;
  gboolean *ran; /* this round, per thread */
  gint index, ok, busy, wrong;
  /* thread 0 checks the store after each round */
  QkvParams *params;
  const float *want_grads[2];
  gsize n_grads;
  gint wrong_grads;
} StoreHammer;

static gpointer
store_hammer(gpointer data)
{
  StoreHammer *h = data;
  g_autoptr(GRand) rand = g_rand_new();
  for (gint round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(h->barrier);
    jitter(rand);
    GError *error = NULL;
    gboolean ran = qkv_plan_run(h->plan, &error);
    check_refusal(error, FALSE, &h->busy);
    g_clear_error(&error);
    h->ran[h->index] = ran;
    pthread_barrier_wait(h->barrier);
    if (ran && qkv_plan_output_scalar(h->plan, 0) != h->want)
      h->wrong++;
    h->ok += ran;
    if (h->index == 0) {
      /* the gradients are those of the last run that succeeded */
      gboolean a = grads_equal(h->params, h->want_grads[0], h->n_grads);
      gboolean b = grads_equal(h->params, h->want_grads[1], h->n_grads);
      if (!(h->ran[0] || h->ran[1]) || (h->ran[0] && h->ran[1] ? !(a || b) : h->ran[0] ? !a : !b))
        h->wrong_grads++;
    }
    pthread_barrier_wait(h->barrier);
  }
  return NULL;
}

enum { LIN_ROWS = 64, LIN_DIM = 192 };

/* loss = mse(x · first · second, t) over the store's "w1" and "w2": the
 * backward writes second's gradient, then first's. */
static QkvPlan *
two_layer_plan(QkvGraph *g, QkvParams *params, const gchar *first, const gchar *second,
               const QkvTensor *x, const QkvTensor *t)
{
  g_autoptr(GError) error = NULL;
  QkvShape xs = QKV_SHAPE(LIN_ROWS, LIN_DIM);
  QkvValue *xv = qkv_test_input(g, "x", QKV_F32, xs);
  QkvValue *tv = qkv_test_input(g, "t", QKV_F32, xs);
  QkvValue *a = qkv_graph_param(g, params, first, &error);
  QkvValue *b = qkv_graph_param(g, params, second, &error);
  QkvValue *h = qkv_matmul(xv, a, FALSE, FALSE, &error);
  QkvValue *y = qkv_matmul(h, b, FALSE, FALSE, &error);
  QkvValue *loss = qkv_mse(y, tv, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = 1;
  QkvPlan *plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", (QkvTensor *)x, &error));
  g_assert_true(qkv_plan_bind(plan, "t", (QkvTensor *)t, &error));
  return plan;
}

static float
reference_loss(QkvPlan *plan, QkvParams *params, float **grads, gsize *n_grads)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  *grads = qkv_test_params_flatten(params, TRUE, n_grads);
  return qkv_plan_output_scalar(plan, 0);
}

/* Two training plans over one store run from two threads. They would write
 * the same gradient buffers, in opposite orders (x·w1·w2 and x·w2·w1), so
 * two overlapping runs would leave some gradients of one and some of the
 * other: a run while the other writes them is refused instead. Used one
 * after the other, both work. */
static void
test_plans_sharing_a_store(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(LIN_DIM, LIN_DIM), xs = QKV_SHAPE(LIN_ROWS, LIN_DIM);
  const gchar *names[] = {"w1", "w2"};
  for (gint i = 0; i < 2; i++) {
    QkvParam *p = qkv_params_add(params, names[i], &ws, &error);
    g_assert_no_error(error);
    g_assert_true(qkv_init_uniform(qkv_param_value(p), -0.1, 0.1, 40 + i, &error));
  }
  g_autoptr(QkvTensor) x = qkv_test_uniform(&xs, 1, -1, 1);
  g_autoptr(QkvTensor) t = qkv_test_uniform(&xs, 2, -1, 1);
  g_autoptr(QkvGraph) g0 = qkv_graph_new();
  g_autoptr(QkvGraph) g1 = qkv_graph_new();
  g_autoptr(QkvPlan) p0 = two_layer_plan(g0, params, "w1", "w2", x, t);
  g_autoptr(QkvPlan) p1 = two_layer_plan(g1, params, "w2", "w1", x, t);
  gsize n_grads;
  g_autofree float *grads0 = NULL, *grads1 = NULL;
  float want0 = reference_loss(p0, params, &grads0, &n_grads);
  float want1 = reference_loss(p1, params, &grads1, &n_grads);
  g_assert_cmpfloat(want0, !=, want1);
  g_assert_false(grads_equal(params, grads0, n_grads));

  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, 2);
  gboolean ran[2] = {FALSE, FALSE};
  StoreHammer h[2];
  GThread *threads[2];
  for (gint i = 0; i < 2; i++) {
    h[i] = (StoreHammer){.plan = i == 0 ? p0 : p1,
                         .barrier = &barrier,
                         .want = i == 0 ? want0 : want1,
                         .ran = ran,
                         .index = i,
                         .params = params,
                         .want_grads = {grads0, grads1},
                         .n_grads = n_grads};
  }
  for (gint i = 0; i < 2; i++)
    threads[i] = g_thread_new("store", store_hammer, &h[i]);
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  pthread_barrier_destroy(&barrier);
  for (gint i = 0; i < 2; i++)
    g_test_message("plan %d: %d runs, %d refused as busy", i, h[i].ok, h[i].busy);
  if (h[0].wrong_grads > 0)
    g_error("after %d of %d rounds the store's gradients were not those of the last run",
            h[0].wrong_grads, ROUNDS);
  g_assert_cmpint(h[0].wrong + h[1].wrong, ==, 0);
  /* one after the other, both work */
  g_assert_true(qkv_plan_run(p0, &error) && qkv_plan_output_scalar(p0, 0) == want0);
  g_assert_true(grads_equal(params, grads0, n_grads));
  g_assert_true(qkv_plan_run(p1, &error) && qkv_plan_output_scalar(p1, 0) == want1);
  g_assert_true(grads_equal(params, grads1, n_grads));
}

/* ---- one step decoder, two threads ---------------------------------------- */

enum { DEC_ROWS = 6, DEC_STEPS = 6 };

typedef struct {
  QkvStepDecoder *decoder;
  const QkvTensor *src, *src_valid;
  const QkvBeamOptions *options;
  const gint32 *want_tokens;
  const gint *want_lengths;
  const double *want_scores;
  const float *want_logits; /* DEC_STEPS × 2 × vocab, fed_tokens stepping */
  pthread_barrier_t *barrier;
  gint ok, steps, busy, wrong;
} DecoderHammer;

static const gint32 fed_tokens[DEC_STEPS][2] = {{1, 1}, {4, 5}, {6, 3}, {7, 7}, {3, 9}, {5, 4}};

/* Start, then feed fed_tokens step by step; logits of every step into out
 * (DEC_STEPS × 2 × vocab). A step that finds the other thread's start or
 * step between it and our previous one is refused (QKV_ERROR_INVALID_ARGUMENT);
 * every step that runs starts from the same state, so its logits are the
 * reference (checked when check is TRUE). */
static void
drive_steps(DecoderHammer *h, float *logits, gint64 vocab, gboolean check)
{
  GError *error = NULL;
  if (!qkv_step_decoder_start(h->decoder, h->src, h->src_valid, 1, &error)) {
    check_refusal(error, FALSE, &h->busy);
    g_clear_error(&error);
    return;
  }
  for (gint t = 0; t < DEC_STEPS; t++) {
    float *out = logits + (gsize)t * 2 * vocab;
    if (!qkv_step_decoder_step(h->decoder, t, fed_tokens[t], NULL, 2, out, &error)) {
      if (!g_error_matches(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT))
        check_refusal(error, FALSE, &h->busy);
      g_clear_error(&error);
      continue;
    }
    h->steps++;
    if (check && memcmp(out, h->want_logits + (gsize)t * 2 * vocab, 2 * vocab * sizeof(float)))
      h->wrong++;
  }
}

static gpointer
decoder_hammer(gpointer data)
{
  DecoderHammer *h = data;
  const gint64 vocab = qkv_step_decoder_vocab(h->decoder);
  const gint max_len = h->options->max_len;
  g_autofree gint32 *tokens = g_new(gint32, 2 * max_len);
  g_autofree float *logits = g_new(float, (gsize)DEC_STEPS * 2 * vocab);
  gint lengths[2];
  double scores[2];
  g_autoptr(GRand) rand = g_rand_new();
  for (gint round = 0; round < ROUNDS; round++) {
    GError *error = NULL;
    pthread_barrier_wait(h->barrier);
    jitter(rand);
    if (qkv_step_decoder_translate(h->decoder, h->src, h->src_valid, h->options, tokens, lengths,
                                   scores, &error)) {
      h->ok++;
      if (memcmp(tokens, h->want_tokens, 2 * max_len * sizeof(gint32)) != 0 ||
          memcmp(lengths, h->want_lengths, sizeof(lengths)) != 0 ||
          memcmp(scores, h->want_scores, sizeof(scores)) != 0)
        h->wrong++;
    }
    check_refusal(error, FALSE, &h->busy);
    g_clear_error(&error);
    pthread_barrier_wait(h->barrier);
    jitter(rand);
    drive_steps(h, logits, vocab, TRUE);
  }
  return NULL;
}

static void
test_decoder(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvPlan) unused = training_plan(g, params);
  g_autoptr(QkvStepDecoder) dec = qkv_step_decoder_new_transformer(
      params, &qkv_test_s2s_config, DEC_ROWS, QKV_TEST_S2S_SRC_LEN, 8, 1, &error);
  g_assert_no_error(error);
  QkvShape two = QKV_SHAPE(2, QKV_TEST_S2S_SRC_LEN), two_rows = QKV_SHAPE(2);
  g_autoptr(QkvTensor) src = qkv_test_randint(&two, 9, 3, (gint32)qkv_test_s2s_config.src_vocab);
  g_autoptr(QkvTensor) src_valid = qkv_test_randint(&two_rows, 10, 2, QKV_TEST_S2S_SRC_LEN + 1);
  QkvBeamOptions o = qkv_beam_options_default();
  o.beam_size = 3;
  o.max_len = 8;
  o.vocab = qkv_test_s2s_config.tgt_vocab;
  gint32 want_tokens[2 * 8];
  gint want_lengths[2];
  double want_scores[2];
  g_assert_true(qkv_step_decoder_translate(dec, src, src_valid, &o, want_tokens, want_lengths,
                                           want_scores, &error));
  g_assert_no_error(error);
  DecoderHammer h[2];
  g_autofree float *want_logits =
      g_new(float, (gsize)DEC_STEPS * 2 * qkv_test_s2s_config.tgt_vocab);
  h[0] = (DecoderHammer){.decoder = dec, .src = src, .src_valid = src_valid};
  drive_steps(&h[0], want_logits, qkv_test_s2s_config.tgt_vocab, FALSE);

  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, 2);
  GThread *threads[2];
  for (gint i = 0; i < 2; i++) {
    h[i] = (DecoderHammer){.decoder = dec,
                           .barrier = &barrier,
                           .src = src,
                           .src_valid = src_valid,
                           .options = &o,
                           .want_tokens = want_tokens,
                           .want_lengths = want_lengths,
                           .want_scores = want_scores,
                           .want_logits = want_logits};
    threads[i] = g_thread_new("decoder", decoder_hammer, &h[i]);
  }
  for (gint i = 0; i < 2; i++)
    g_thread_join(threads[i]);
  pthread_barrier_destroy(&barrier);
  for (gint i = 0; i < 2; i++) {
    g_test_message("thread %d: %d translations, %d steps, %d calls refused as busy, %d wrong "
                   "results",
                   i, h[i].ok, h[i].steps, h[i].busy, h[i].wrong);
    if (h[i].wrong > 0)
      g_error("thread %d: %d translations or steps gave a result other than the reference", i,
              h[i].wrong);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  qkv_init();
  g_test_add_func("/concurrency/plan-shared-batch", test_plan_shared_batch);
  g_test_add_func("/concurrency/plan-own-batches", test_plan_own_batches);
  g_test_add_func("/concurrency/plans-sharing-a-store", test_plans_sharing_a_store);
  g_test_add_func("/concurrency/step-decoder", test_decoder);
  return g_test_run();
}
