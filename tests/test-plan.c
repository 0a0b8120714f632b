/* test-plan.c: compiled plans — arena layout, no allocation per run, the
 * same results as an evaluation that shares no memory. */
#include "test-util.h"

#include <math.h>
#include <string.h>

#define BATCH 32
#define IN 16
#define HIDDEN 48
#define CLASSES 5

typedef struct {
  QkvParams *params;
  QkvGraph *graph;
  QkvValue *loss;
  QkvTensor *x, *y;
} Mlp;

static void
mlp_build(Mlp *m)
{
  g_autoptr(GError) error = NULL;
  m->params = qkv_params_new();
  m->graph = qkv_graph_new();
  const gint64 sizes[] = {IN, HIDDEN, HIDDEN, HIDDEN, CLASSES};
  QkvShape xs = QKV_SHAPE(BATCH, IN), ys = QKV_SHAPE(BATCH);
  QkvValue *h = qkv_graph_input(m->graph, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_graph_input(m->graph, "y", QKV_I32, &ys, &error);
  for (gint l = 0; l < 4; l++) {
    g_autofree gchar *wn = g_strdup_printf("layers.%d.weight", l);
    g_autofree gchar *bn = g_strdup_printf("layers.%d.bias", l);
    QkvShape ws = QKV_SHAPE(sizes[l + 1], sizes[l]), bs = QKV_SHAPE(sizes[l + 1]);
    QkvParam *w = qkv_params_add(m->params, wn, &ws, &error);
    QkvParam *b = qkv_params_add(m->params, bn, &bs, &error);
    g_autoptr(QkvTensor) wi = qkv_test_uniform(&ws, 10 + l, -0.4f, 0.4f);
    g_autoptr(QkvTensor) bi = qkv_test_uniform(&bs, 20 + l, -0.1f, 0.1f);
    qkv_tensor_copy_from(qkv_param_value(w), wi, NULL);
    qkv_tensor_copy_from(qkv_param_value(b), bi, NULL);
    h = qkv_matmul(h, qkv_graph_param(m->graph, m->params, wn, NULL), FALSE, TRUE, &error);
    h = qkv_add(h, qkv_graph_param(m->graph, m->params, bn, NULL), &error);
    if (l < 3)
      h = qkv_relu(h, &error);
  }
  m->loss = qkv_cross_entropy(h, y, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(m->graph, m->loss, &error));
  g_assert_no_error(error);
  m->x = qkv_test_uniform(&xs, 1, -1, 1);
  m->y = qkv_test_randint(&ys, 2, 0, CLASSES);
}

static void
mlp_clear(Mlp *m)
{
  qkv_tensor_free(m->x);
  qkv_tensor_free(m->y);
  qkv_graph_free(m->graph);
  qkv_params_free(m->params);
}

static QkvPlan *
mlp_plan(Mlp *m, QkvValue *const *outs, guint n, gint threads)
{
  g_autoptr(GError) error = NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = threads;
  QkvPlan *plan = qkv_graph_compile(m->graph, outs, n, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(plan, "x", m->x, &error));
  g_assert_true(qkv_plan_bind(plan, "y", m->y, &error));
  return plan;
}

static GPtrArray *
snapshot_grads(QkvParams *params)
{
  GPtrArray *a = g_ptr_array_new_with_free_func((GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < qkv_params_size(params); i++)
    g_ptr_array_add(a, qkv_tensor_copy(qkv_param_grad(qkv_params_nth(params, i))));
  return a;
}

static void
test_arena_smaller_than_intermediates(void)
{
  Mlp m = {0};
  mlp_build(&m);
  g_autoptr(QkvPlan) plan = mlp_plan(&m, &m.loss, 1, 1);
  gsize arena = qkv_plan_arena_size(plan), total = qkv_plan_intermediates_size(plan);
  g_test_message("4-layer MLP training plan: %u steps, arena %" G_GSIZE_FORMAT
                 " bytes, intermediates %" G_GSIZE_FORMAT " bytes",
                 qkv_plan_n_steps(plan), arena, total);
  g_print("# 4-layer MLP training plan: arena %" G_GSIZE_FORMAT
          " bytes, sum of intermediates %" G_GSIZE_FORMAT " bytes\n",
          arena, total);
  g_assert_cmpuint(arena, <, total);
  mlp_clear(&m);
}

static void
test_runs_allocate_nothing(void)
{
  Mlp m = {0};
  mlp_build(&m);
  g_autoptr(QkvPlan) plan = mlp_plan(&m, &m.loss, 1, 2);
  g_assert_true(qkv_plan_run(plan, NULL)); /* warm up lazy library state */
  guint64 before = qkv_alloc_count();
  for (int i = 0; i < 100; i++)
    g_assert_true(qkv_plan_run(plan, NULL));
  guint64 after = qkv_alloc_count();
  g_test_message("allocations during 100 runs: %" G_GUINT64_FORMAT, after - before);
  g_assert_cmpuint(after - before, ==, 0);
  /* the counter does count: a new tensor moves it */
  QkvShape s = QKV_SHAPE(4);
  qkv_tensor_free(qkv_tensor_new(QKV_F32, &s));
  g_assert_cmpuint(qkv_alloc_count(), ==, after + 1);
  mlp_clear(&m);
}

static void
test_matches_unshared_evaluation(void)
{
  Mlp m = {0};
  mlp_build(&m);
  g_autoptr(QkvPlan) lean = mlp_plan(&m, &m.loss, 1, 1);
  g_assert_true(qkv_plan_run(lean, NULL));
  float lean_loss = qkv_plan_output_scalar(lean, 0);
  g_autoptr(GPtrArray) lean_grads = snapshot_grads(m.params);

  /* node by node: one plan per parameter gradient, each computing only what
   * that gradient needs, with its own arena */
  for (guint i = 0; i < qkv_params_size(m.params); i++) {
    QkvParam *p = qkv_params_nth(m.params, i);
    QkvValue *pv = qkv_graph_param(m.graph, m.params, qkv_param_name(p), NULL);
    QkvValue *gv = qkv_graph_gradient(m.graph, pv);
    g_assert_nonnull(gv);
    QkvValue *outs[] = {gv, m.loss};
    QkvPlanOptions o = qkv_plan_options_default();
    o.training = TRUE;
    o.skip_param_grads = TRUE;
    o.n_threads = 1;
    g_autoptr(QkvPlan) single = qkv_graph_compile(m.graph, outs, 2, &o, NULL);
    g_assert_true(qkv_plan_bind(single, "x", m.x, NULL) && qkv_plan_bind(single, "y", m.y, NULL));
    g_assert_true(qkv_plan_run(single, NULL));
    qkv_assert_tensor_close(qkv_plan_output(single, 0), g_ptr_array_index(lean_grads, i), 1e-5);
    g_assert_cmpfloat_with_epsilon(qkv_plan_output_scalar(single, 1), lean_loss, 1e-6);
  }

  /* the same graph with no memory sharing and nothing in place: every
   * intermediate in its own buffer, evaluated node by node */
  {
    QkvPlanOptions o = qkv_plan_options_default();
    o.training = TRUE;
    o.n_threads = 1;
    o.no_memory_reuse = TRUE;
    g_autoptr(QkvPlan) unshared = qkv_graph_compile(m.graph, &m.loss, 1, &o, NULL);
    g_assert_cmpuint(qkv_plan_arena_size(unshared), >=, qkv_plan_intermediates_size(unshared));
    g_assert_true(qkv_plan_bind(unshared, "x", m.x, NULL) &&
                  qkv_plan_bind(unshared, "y", m.y, NULL));
    g_assert_true(qkv_plan_run(unshared, NULL));
    g_assert_cmpfloat(qkv_plan_output_scalar(unshared, 0), ==, lean_loss);
    g_autoptr(GPtrArray) unshared_grads = snapshot_grads(m.params);
    for (guint i = 0; i < unshared_grads->len; i++)
      qkv_assert_tensor_close(g_ptr_array_index(unshared_grads, i),
                              g_ptr_array_index(lean_grads, i), 0);
  }

  /* two threads give the same numbers */
  g_autoptr(QkvPlan) two = mlp_plan(&m, &m.loss, 1, 2);
  g_assert_true(qkv_plan_run(two, NULL));
  g_assert_cmpfloat_with_epsilon(qkv_plan_output_scalar(two, 0), lean_loss, 1e-5);
  g_autoptr(GPtrArray) two_grads = snapshot_grads(m.params);
  for (guint i = 0; i < two_grads->len; i++)
    qkv_assert_tensor_close(g_ptr_array_index(two_grads, i), g_ptr_array_index(lean_grads, i),
                            1e-4);
  mlp_clear(&m);
}

static void
test_sgd_training_lowers_loss(void)
{
  Mlp m = {0};
  mlp_build(&m);
  g_autoptr(QkvPlan) plan = mlp_plan(&m, &m.loss, 1, 2);
  float first = 0, last = 0;
  for (int step = 0; step < 60; step++) {
    g_assert_true(qkv_plan_run(plan, NULL));
    last = qkv_plan_output_scalar(plan, 0);
    if (step == 0)
      first = last;
    for (guint i = 0; i < qkv_params_size(m.params); i++) {
      QkvParam *p = qkv_params_nth(m.params, i);
      float *w = qkv_tensor_f32(qkv_param_value(p));
      const float *gr = qkv_tensor_f32(qkv_param_grad(p));
      for (gint64 k = 0; k < qkv_tensor_numel(qkv_param_value(p)); k++)
        w[k] -= 0.5f * gr[k];
    }
  }
  g_test_message("loss %g -> %g", first, last);
  g_assert_cmpfloat(last, <, 0.5 * first);
  mlp_clear(&m);
}

static void
test_pruning_and_unbound_inputs(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *a = qkv_graph_input(g, "a", QKV_F32, &s, NULL);
  QkvValue *b = qkv_graph_input(g, "b", QKV_F32, &s, NULL);
  QkvValue *ea = qkv_exp(a, NULL);
  QkvValue *unused = qkv_exp(qkv_exp(b, NULL), NULL);
  g_assert_nonnull(unused);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &ea, 1, NULL, NULL);
  g_assert_cmpuint(qkv_plan_n_steps(plan), ==, 1);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_plan_run(plan, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_UNBOUND);
  g_assert_nonnull(strstr(error->message, "'a'"));
  g_clear_error(&error);
  /* b is not needed, so a alone is enough */
  float av[] = {0, 1, 2};
  g_autoptr(QkvTensor) at = qkv_tensor_new_f32(&s, av);
  g_assert_true(qkv_plan_bind(plan, "a", at, NULL));
  g_assert_true(qkv_plan_run(plan, &error));
  float want[] = {1, expf(1), expf(2)};
  qkv_assert_values(qkv_plan_output(plan, 0), want, 3, 1e-5);
  /* a tensor of the wrong shape is refused */
  QkvShape s4 = QKV_SHAPE(4);
  g_autoptr(QkvTensor) wrong = qkv_tensor_new(QKV_F32, &s4);
  g_assert_false(qkv_plan_bind(plan, "a", wrong, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  g_assert_false(qkv_plan_bind(plan, "nope", at, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
}

/* ---- a kernel failing the run ------------------------------------------- */

/* "test.nonneg": y = x, but every negative element fails the run, from
 * whichever pool thread meets it. "test.count": y = x, counting its runs. */
static gint count_runs;

static gboolean
same_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
nonneg_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvKernelCtx *ctx = user_data;
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  for (gint64 i = begin; i < end; i++) {
    y[i] = x[i];
    if (x[i] < 0)
      qkv_kernel_fail(ctx, QKV_ERROR_INVALID_ARGUMENT, "element %" G_GINT64_FORMAT " is negative",
                      i);
  }
}

static void
nonneg_forward(const QkvKernelCtx *ctx)
{
  qkv_kernel_parallel_for(ctx, qkv_shape_numel(&ctx->in[0].shape), nonneg_range, (gpointer)ctx);
}

static void
count_forward(const QkvKernelCtx *ctx)
{
  memcpy(ctx->out[0].data, ctx->in[0].data,
         (gsize)qkv_shape_numel(&ctx->in[0].shape) * sizeof(float));
  g_atomic_int_inc(&count_runs);
}

static void
register_failing_ops(void)
{
  static const QkvOpDef defs[] = {
      {QKV_OP_DEF_INIT, .name = "test.nonneg", .min_inputs = 1, .max_inputs = 1,
       .shape = same_shape, .forward = nonneg_forward},
      {QKV_OP_DEF_INIT, .name = "test.count", .min_inputs = 1, .max_inputs = 1, .shape = same_shape,
       .forward = count_forward},
  };
  for (guint i = 0; i < G_N_ELEMENTS(defs); i++) {
    g_autoptr(GError) error = NULL;
    if (qkv_op_lookup(defs[i].name) == NULL)
      g_assert_true(qkv_op_register(&defs[i], &error));
    g_assert_no_error(error);
  }
}

/* A kernel's qkv_kernel_fail() stops the run after its node with a GError
 * naming the node; the nodes after it do not run, the step does not count,
 * and the plan runs again once the input is good. Many threads failing at
 * once give one error (the first). */
static void
test_kernel_failure_stops_run(void)
{
  register_failing_ops();
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(4096);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  QkvValue *checked = qkv_graph_op(g, "test.nonneg", &x, 1, NULL, NULL);
  QkvValue *counted = qkv_graph_op(g, "test.count", &checked, 1, NULL, NULL);
  g_assert_nonnull(counted);
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = 4;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &counted, 1, &o, NULL);
  g_autoptr(QkvTensor) good = qkv_test_uniform(&s, 1, 0, 1);
  g_autoptr(QkvTensor) bad = qkv_test_uniform(&s, 2, -1, 1);
  g_autoptr(GError) error = NULL;

  g_assert_true(qkv_plan_bind(plan, "x", bad, NULL));
  for (gint attempt = 0; attempt < 3; attempt++) {
    gint runs = g_atomic_int_get(&count_runs);
    g_assert_false(qkv_plan_run(plan, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_autofree gchar *want = g_strdup_printf("run: node '%s' (test.nonneg): element ",
                                             qkv_node_name(qkv_value_node(checked)));
    if (!g_str_has_prefix(error->message, want) ||
        !g_str_has_suffix(error->message, " is negative"))
      g_error("unexpected message '%s'", error->message);
    g_test_message("%s", error->message);
    g_clear_error(&error);
    g_assert_cmpint(g_atomic_int_get(&count_runs), ==, runs);
    g_assert_cmpuint(qkv_plan_get_step(plan), ==, 0);
  }

  g_assert_true(qkv_plan_bind(plan, "x", good, NULL));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_plan_get_step(plan), ==, 1);
  qkv_assert_tensor_close(qkv_plan_output(plan, 0), good, 0);
}

/* The plan holds a reference to a bound tensor: the caller frees its own
 * right after binding, memory of that size is handed out again and filled
 * with NaN (glibc reuses a freed small block first), and the run still
 * reads the values bound. Without the plan's reference the run would read
 * the NaNs (or, under ASan, fail as a use after free). */
static void
test_bound_tensor_outlives_caller(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(16);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_scale(x, 2.0, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &y, 1, NULL, &error);
  g_assert_no_error(error);
  QkvTensor *t = qkv_test_uniform(&xs, 3, -1.0f, 1.0f);
  float want[16];
  for (gint i = 0; i < 16; i++)
    want[i] = 2.0f * qkv_tensor_f32(t)[i];
  g_assert_true(qkv_plan_bind(plan, "x", t, &error));
  qkv_tensor_free(t);
  QkvTensor *reuse[8];
  for (guint i = 0; i < G_N_ELEMENTS(reuse); i++) {
    reuse[i] = qkv_tensor_new(QKV_F32, &xs);
    for (gint j = 0; j < 16; j++)
      qkv_tensor_f32(reuse[i])[j] = NAN;
  }
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  const float *got = qkv_tensor_const_data(qkv_plan_output(plan, 0));
  for (gint i = 0; i < 16; i++)
    g_assert_cmpfloat(got[i], ==, want[i]);
  /* rebinding drops the plan's reference to the first tensor */
  g_assert_true(qkv_plan_bind(plan, "x", reuse[0], &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_true(isnan(((const float *)qkv_tensor_const_data(qkv_plan_output(plan, 0)))[0]));
  for (guint i = 0; i < G_N_ELEMENTS(reuse); i++)
    qkv_tensor_free(reuse[i]);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/plan/arena-smaller-than-intermediates", test_arena_smaller_than_intermediates);
  g_test_add_func("/plan/runs-allocate-nothing", test_runs_allocate_nothing);
  g_test_add_func("/plan/matches-unshared-evaluation", test_matches_unshared_evaluation);
  g_test_add_func("/plan/sgd-training-lowers-loss", test_sgd_training_lowers_loss);
  g_test_add_func("/plan/pruning-and-unbound-inputs", test_pruning_and_unbound_inputs);
  g_test_add_func("/plan/kernel-failure-stops-run", test_kernel_failure_stops_run);
  g_test_add_func("/plan/bound-tensor-outlives-caller", test_bound_tensor_outlives_caller);
  return g_test_run();
}
