/* test-optim.c: SGD, Adam and AdamW against torch.optim (tests/data/optim_ref.txt),
 * frozen params and subsets, gradient clipping, learning-rate schedules. */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* The same formulas as tests/reference/optim_ref.py. */
static double
initial_value(const gchar *name, gint i)
{
  if (g_str_equal(name, "w"))
    return 0.1 * ((i * 5) % 13) - 0.6;
  return 0.25 * ((i * 3) % 7) - 0.7;
}

static double
offset_value(const gchar *name, gint i)
{
  if (g_str_equal(name, "w"))
    return 0.05 * ((i * 7) % 11) - 0.25;
  return 0.3 - 0.2 * ((i * 2) % 5);
}

static QkvParams *
make_store(void)
{
  QkvParams *params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3, 4), bs = QKV_SHAPE(4);
  const gchar *names[] = {"w", "b"};
  const QkvShape *shapes[] = {&ws, &bs};
  for (guint k = 0; k < 2; k++) {
    QkvParam *p = qkv_params_add(params, names[k], shapes[k], NULL);
    float *v = qkv_tensor_f32(qkv_param_value(p));
    for (gint i = 0; i < qkv_shape_numel(shapes[k]); i++)
      v[i] = (float)initial_value(names[k], i);
  }
  return params;
}

/* grad = 2·p + c, in f32 as PyTorch forms it */
static void
set_grads(QkvParams *params)
{
  for (guint k = 0; k < qkv_params_size(params); k++) {
    QkvParam *p = qkv_params_nth(params, k);
    const gchar *name = qkv_param_name(p);
    const float *v = qkv_tensor_f32(qkv_param_value(p));
    float *g = qkv_tensor_f32(qkv_param_grad(p));
    for (gint i = 0; i < qkv_tensor_numel(qkv_param_value(p)); i++)
      g[i] = 2.0f * v[i] + (float)offset_value(name, i);
  }
}

static double worst_rel = 0;

/* qkv's and PyTorch's float32 updates of the same element: no sums across
 * elements, about 8 roundings per step (weight decay, the moment updates,
 * sqrt, the bias corrections, the division and the step), each relative to
 * operands of the size of the tensor (params, gradients and moments are
 * O(scale)), over 3 steps, in two computations: 2 × 3 × 8 = 48 u times the
 * tensor's scale. */
#define OPTIM_FACTOR 48.0

static void
assert_matches(const QkvTensor *actual, const QkvTensor *expected, const gchar *what)
{
  g_assert_cmpint(qkv_tensor_numel(actual), ==, qkv_tensor_numel(expected));
  /* The reference stores tensors flat. */
  g_autoptr(QkvTensor) flat =
      qkv_tensor_new_from_data(QKV_F32, qkv_tensor_shape(actual), qkv_tensor_const_data(expected));
  double needed = qkv_assert_scaled(what, actual, flat, OPTIM_FACTOR);
  worst_rel = fmax(worst_rel, needed);
}

typedef void (*AddGroups)(QkvOptimizer *opt);

static void
run_against_torch_grouped(const gchar *label, QkvOptimizerKind kind, const QkvOptimConfig *config,
                          const gchar *const *state_names, AddGroups add_groups)
{
  g_autoptr(GHashTable) ref = qkv_test_load_reference("optim_ref.txt");
  g_autoptr(QkvParams) params = make_store();
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new(kind, params, config, &error);
  g_assert_no_error(error);
  if (add_groups != NULL)
    add_groups(opt);
  for (gint step = 1; step <= 3; step++) {
    set_grads(params);
    g_assert_true(qkv_optimizer_step(opt, &error));
    g_assert_no_error(error);
    g_assert_cmpint(qkv_optimizer_get_step(opt), ==, step);
    for (guint k = 0; k < qkv_params_size(params); k++) {
      QkvParam *p = qkv_params_nth(params, k);
      g_autofree gchar *name = g_strdup_printf("%s.%s.step%d", label, qkv_param_name(p), step);
      assert_matches(qkv_param_value(p), qkv_test_ref(ref, name), name);
    }
  }
  for (guint k = 0; k < qkv_params_size(params); k++) {
    QkvParam *p = qkv_params_nth(params, k);
    for (guint s = 0; state_names[s] != NULL; s++) {
      g_autofree gchar *name =
          g_strdup_printf("%s.%s.%s", label, qkv_param_name(p), state_names[s]);
      QkvTensor *state = qkv_param_lookup_state(p, state_names[s]);
      g_assert_nonnull(state);
      assert_matches(state, qkv_test_ref(ref, name), name);
    }
  }
  g_test_message("%s: largest factor needed so far %.3g of %g", label, worst_rel, OPTIM_FACTOR);
}

static void
run_against_torch(const gchar *label, QkvOptimizerKind kind, const QkvOptimConfig *config,
                  const gchar *const *state_names)
{
  run_against_torch_grouped(label, kind, config, state_names, NULL);
}

static void
test_sgd_momentum(void)
{
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  const gchar *states[] = {"momentum_buffer", NULL};
  run_against_torch("sgd", QKV_OPTIMIZER_SGD, &c, states);
}

static void
test_sgd_nesterov(void)
{
  QkvOptimConfig c = qkv_optim_config_sgd(0.05);
  c.momentum = 0.8;
  c.weight_decay = 0.02;
  c.nesterov = TRUE;
  const gchar *states[] = {"momentum_buffer", NULL};
  run_against_torch("nesterov", QKV_OPTIMIZER_SGD, &c, states);
}

static void
test_adam(void)
{
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  c.weight_decay = 0.1;
  const gchar *states[] = {"exp_avg", "exp_avg_sq", NULL};
  run_against_torch("adam", QKV_OPTIMIZER_ADAM, &c, states);
}

static void
test_adamw(void)
{
  QkvOptimConfig c = qkv_optim_config_adamw(0.01);
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.eps = 1e-6;
  c.weight_decay = 0.1;
  const gchar *states[] = {"exp_avg", "exp_avg_sq", NULL};
  run_against_torch("adamw", QKV_OPTIMIZER_ADAMW, &c, states);
  QkvShape scalar = qkv_shape_scalar();
  QkvParams *params = make_store();
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &c, NULL);
  set_grads(params);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  /* the per-param step count is a scalar i32 state, as state['step'] in PyTorch */
  QkvTensor *step = qkv_param_lookup_state(qkv_params_lookup(params, "w"), "step");
  g_assert_nonnull(step);
  g_assert_cmpint(qkv_tensor_dtype(step), ==, QKV_I32);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(step), &scalar));
  g_assert_cmpint(qkv_tensor_i32(step)[0], ==, 1);
  qkv_optimizer_free(g_steal_pointer(&opt));
  qkv_params_free(params);
}

static void
test_defaults(void)
{
  QkvOptimConfig sgd = qkv_optim_config_sgd(0.5), adam = qkv_optim_config_adam(1e-3),
                 adamw = qkv_optim_config_adamw(1e-3);
  g_assert_cmpfloat(sgd.lr, ==, 0.5);
  g_assert_cmpfloat(sgd.momentum, ==, 0);
  g_assert_cmpfloat(sgd.dampening, ==, 0);
  g_assert_cmpfloat(sgd.weight_decay, ==, 0);
  g_assert_cmpfloat(adam.beta1, ==, 0.9);
  g_assert_cmpfloat(adam.beta2, ==, 0.999);
  g_assert_cmpfloat(adam.eps, ==, 1e-8);
  g_assert_cmpfloat(adam.weight_decay, ==, 0);
  g_assert_cmpfloat(adamw.weight_decay, ==, 1e-2);
}

static void
test_invalid_config(void)
{
  g_autoptr(QkvParams) params = make_store();
  g_autoptr(GError) error = NULL;
  QkvOptimConfig c = qkv_optim_config_sgd(-1);
  g_assert_null(qkv_optimizer_new_sgd(params, &c, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "learning rate"));
  g_clear_error(&error);
  c = qkv_optim_config_sgd(0.1);
  c.nesterov = TRUE;
  g_assert_null(qkv_optimizer_new_sgd(params, &c, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  c = qkv_optim_config_adam(0.1);
  c.beta1 = 1.0;
  g_assert_null(qkv_optimizer_new_adam(params, &c, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "beta1"));
  g_clear_error(&error);
  c = qkv_optim_config_adamw(0.1);
  c.eps = NAN;
  g_assert_null(qkv_optimizer_new_adamw(params, &c, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  /* set_config validates too and keeps the old one on failure */
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &(QkvOptimConfig){0}, &error);
  g_assert_nonnull(opt);
  QkvOptimConfig good = qkv_optim_config_adam(0.01);
  g_assert_true(qkv_optimizer_set_config(opt, &good, NULL));
  c = good;
  c.beta2 = -0.5;
  g_assert_false(qkv_optimizer_set_config(opt, &c, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_cmpfloat(qkv_optimizer_get_config(opt)->beta2, ==, 0.999);
}

static gboolean
only_bias(QkvParam *param, gpointer user_data)
{
  return g_str_has_suffix(qkv_param_name(param), "b");
}

static void
test_frozen_and_subsets(void)
{
  g_autoptr(QkvParams) params = make_store();
  QkvParam *w = qkv_params_lookup(params, "w"), *b = qkv_params_lookup(params, "b");
  g_autoptr(QkvTensor) w0 = qkv_tensor_copy(qkv_param_value(w));
  g_autoptr(QkvTensor) b0 = qkv_tensor_copy(qkv_param_value(b));
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, NULL);
  g_assert_cmpint(qkv_params_numel(params), ==, 16);
  g_assert_cmpint(qkv_params_numel_trainable(params), ==, 16);

  /* frozen: skipped */
  qkv_param_set_frozen(w, TRUE);
  g_assert_cmpint(qkv_params_numel_trainable(params), ==, 4);
  set_grads(params);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  qkv_assert_tensor_close(qkv_param_value(w), w0, 0);
  g_assert_cmpfloat(qkv_tensor_max_rel_diff(qkv_param_value(b), b0, 1e-6), >, 1e-3);
  qkv_param_set_frozen(w, FALSE);

  /* a list of names */
  g_autoptr(GError) error = NULL;
  const gchar *bad[] = {"w", "nope", NULL};
  g_assert_false(qkv_optimizer_select_names(opt, bad, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_nonnull(strstr(error->message, "'nope'"));
  g_clear_error(&error);
  g_assert_true(qkv_optimizer_includes(opt, w)); /* unchanged after the failure */
  const gchar *only_w[] = {"w", NULL};
  g_assert_true(qkv_optimizer_select_names(opt, only_w, &error));
  g_assert_true(qkv_optimizer_includes(opt, w));
  g_assert_false(qkv_optimizer_includes(opt, b));
  g_autoptr(QkvTensor) b1 = qkv_tensor_copy(qkv_param_value(b));
  set_grads(params);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  qkv_assert_tensor_close(qkv_param_value(b), b1, 0);
  g_assert_cmpfloat(qkv_tensor_max_rel_diff(qkv_param_value(w), w0, 1e-6), >, 1e-3);

  /* a predicate; zero_grad and clipping follow the selection */
  qkv_optimizer_select_filter(opt, only_bias, NULL);
  g_assert_false(qkv_optimizer_includes(opt, w));
  g_assert_true(qkv_optimizer_includes(opt, b));
  set_grads(params);
  qkv_optimizer_zero_grad(opt);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(b), 0), ==, 0);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_grad(w), 1), !=, 0);
  qkv_optimizer_select_all(opt);
  g_assert_true(qkv_optimizer_includes(opt, b) && qkv_optimizer_includes(opt, w));
}

static void
test_lr_changes_between_steps(void)
{
  g_autoptr(QkvParams) params = make_store();
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  QkvParam *w = qkv_params_lookup(params, "w");
  g_autoptr(QkvTensor) w0 = qkv_tensor_copy(qkv_param_value(w));
  qkv_optimizer_set_lr(opt, 0.0);
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, 0.0);
  set_grads(params);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  /* lr 0: values stay, the moments move */
  qkv_assert_tensor_close(qkv_param_value(w), w0, 0);
  g_assert_cmpfloat(fabs(qkv_tensor_get(qkv_param_lookup_state(w, "exp_avg"), 0)), >, 0);
  qkv_optimizer_set_lr(opt, 0.1);
  set_grads(params);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  g_assert_cmpfloat(qkv_tensor_max_rel_diff(qkv_param_value(w), w0, 1e-6), >, 1e-3);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 2);
}

static void
test_state_of_wrong_shape(void)
{
  g_autoptr(QkvParams) params = make_store();
  QkvShape odd = QKV_SHAPE(2);
  QkvParam *b = qkv_params_lookup(params, "b");
  g_assert_nonnull(qkv_param_state_full(b, "exp_avg", QKV_F32, &odd));
  QkvParam *w = qkv_params_lookup(params, "w");
  g_autoptr(QkvTensor) w0 = qkv_tensor_copy(qkv_param_value(w));
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  set_grads(params);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_optimizer_step(opt, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "'exp_avg'"));
  /* nothing was updated, not even the params checked before */
  qkv_assert_tensor_close(qkv_param_value(w), w0, 0);
  g_assert_null(qkv_param_lookup_state(w, "exp_avg"));
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 0);
  g_assert_true(qkv_param_remove_state(b, "exp_avg"));
  g_assert_false(qkv_param_remove_state(b, "exp_avg"));
  g_clear_error(&error); /* errors are sticky: with it kept, the step would not run */
  g_assert_true(qkv_optimizer_step(opt, &error));
}

/* qkv_optimizer_step_clipped() gives the same parameters and state, bit for
 * bit, as clip_grad_norm then step, for Adam, AdamW and SGD with momentum,
 * over tensors large enough to run in parallel chunks, and leaves the
 * gradients unclipped. */
static void
test_step_clipped(gconstpointer data)
{
  const QkvClipRule rule = GPOINTER_TO_INT(data);
  const QkvOptimizerKind kinds[] = {QKV_OPTIMIZER_ADAM, QKV_OPTIMIZER_ADAMW, QKV_OPTIMIZER_SGD};
  QkvShape big = QKV_SHAPE(300, 401), small = QKV_SHAPE(7);
  for (guint k = 0; k < G_N_ELEMENTS(kinds); k++) {
    g_autoptr(QkvParams) one = qkv_params_new();
    g_autoptr(QkvParams) two = qkv_params_new();
    QkvParams *stores[] = {one, two};
    for (guint s = 0; s < 2; s++) {
      QkvParam *w = qkv_params_add(stores[s], "w", &big, NULL);
      QkvParam *b = qkv_params_add(stores[s], "b", &small, NULL);
      g_autoptr(QkvTensor) w0 = qkv_test_uniform(&big, 1, -1, 1);
      g_autoptr(QkvTensor) b0 = qkv_test_uniform(&small, 2, -1, 1);
      memcpy(qkv_tensor_f32(qkv_param_value(w)), qkv_tensor_f32(w0), qkv_tensor_nbytes(w0));
      memcpy(qkv_tensor_f32(qkv_param_value(b)), qkv_tensor_f32(b0), qkv_tensor_nbytes(b0));
    }
    QkvOptimConfig c = kinds[k] == QKV_OPTIMIZER_SGD    ? qkv_optim_config_sgd(0.1)
                       : kinds[k] == QKV_OPTIMIZER_ADAM ? qkv_optim_config_adam(0.01)
                                                        : qkv_optim_config_adamw(0.01);
    c.momentum = kinds[k] == QKV_OPTIMIZER_SGD ? 0.9 : 0.0;
    g_autoptr(GError) error = NULL;
    g_autoptr(QkvOptimizer) separate = qkv_optimizer_new(kinds[k], one, &c, &error);
    g_autoptr(QkvOptimizer) fused = qkv_optimizer_new(kinds[k], two, &c, &error);
    g_assert_no_error(error);
    for (guint step = 0; step < 3; step++) {
      for (guint s = 0; s < 2; s++)
        for (guint i = 0; i < 2; i++) {
          QkvTensor *g = qkv_param_grad(qkv_params_nth(stores[s], i));
          g_autoptr(QkvTensor) r = qkv_test_uniform(qkv_tensor_shape(g), 10 + step * 2 + i, -2, 2);
          memcpy(qkv_tensor_f32(g), qkv_tensor_f32(r), qkv_tensor_nbytes(r));
        }
      /* max_norm 1 clips (the norm is in the hundreds) except on step 2 */
      double max_norm = step == 2 ? 1e6 : 1.0;
      double norm1 = qkv_optimizer_clip_grad_norm(separate, max_norm, rule), norm2 = 0;
      g_assert_true(qkv_optimizer_step(separate, &error));
      g_autoptr(QkvTensor) grad_before = qkv_tensor_copy(qkv_param_grad(qkv_params_nth(two, 0)));
      g_assert_true(qkv_optimizer_step_clipped(fused, max_norm, rule, &norm2, &error));
      g_assert_no_error(error);
      g_assert_cmpfloat(norm1, ==, norm2);
      qkv_assert_values(qkv_param_grad(qkv_params_nth(two, 0)), qkv_tensor_f32(grad_before),
                        (gsize)qkv_tensor_numel(grad_before), 0);
      for (guint i = 0; i < 2; i++) {
        QkvParam *p1 = qkv_params_nth(one, i), *p2 = qkv_params_nth(two, i);
        gsize n = (gsize)qkv_tensor_numel(qkv_param_value(p1));
        qkv_assert_values(qkv_param_value(p2), qkv_tensor_f32(qkv_param_value(p1)), n, 0);
        const gchar *state = kinds[k] == QKV_OPTIMIZER_SGD ? "momentum_buffer" : "exp_avg_sq";
        qkv_assert_values(qkv_param_state(p2, state), qkv_tensor_f32(qkv_param_state(p1, state)), n,
                          0);
      }
    }
  }
}

/* d2l's grad_clipping: θ / ‖g‖ exactly, only when ‖g‖ > θ. With ‖g‖ = 13
 * and θ = 6.5 the factor is exactly 0.5 (PyTorch's rule gives 6.5 / (13 +
 * 1e-6), a little less); at θ = 13 the book's rule leaves the gradients as
 * they are while PyTorch's scales them by 13 / (13 + 1e-6). */
static void
test_clip_grad_norm_d2l(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s2 = QKV_SHAPE(2), s1 = QKV_SHAPE(1);
  QkvParam *a = qkv_params_add(params, "a", &s2, NULL);
  QkvParam *b = qkv_params_add(params, "b", &s1, NULL);
  float ga[] = {3, 4}, gb[] = {12};
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_grad(b)), gb, sizeof gb);

  g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, 13.0, QKV_CLIP_D2L), ==, 13.0);
  qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
  qkv_assert_values(qkv_param_grad(b), gb, 1, 0);

  g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, 6.5, QKV_CLIP_D2L), ==, 13.0);
  float half_a[] = {1.5f, 2.0f}, half_b[] = {6.0f};
  qkv_assert_values(qkv_param_grad(a), half_a, 2, 0);
  qkv_assert_values(qkv_param_grad(b), half_b, 1, 0);

  /* PyTorch's rule at θ = 13 scales: the two rules differ there. */
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_grad(b)), gb, sizeof gb);
  qkv_clip_grad_norm(params, NULL, NULL, 13.0, QKV_CLIP_TORCH);
  g_assert_cmpfloat(qkv_tensor_f32(qkv_param_grad(b))[0], <, 12.0f);

  /* the optimizer's clipped step takes the rule too: SGD lr 1 without
   * momentum moves p by exactly the clipped gradient */
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_grad(b)), gb, sizeof gb);
  qkv_tensor_fill(qkv_param_value(a), 0.0);
  qkv_tensor_fill(qkv_param_value(b), 0.0);
  QkvOptimConfig c = qkv_optim_config_sgd(1.0);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, &error);
  double norm = 0;
  g_assert_true(qkv_optimizer_step_clipped(opt, 6.5, QKV_CLIP_D2L, &norm, &error));
  g_assert_no_error(error);
  g_assert_cmpfloat(norm, ==, 13.0);
  float step_a[] = {-1.5f, -2.0f}, step_b[] = {-6.0f};
  qkv_assert_values(qkv_param_value(a), step_a, 2, 0);
  qkv_assert_values(qkv_param_value(b), step_b, 1, 0);
}

static void
test_clip_grad_norm(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s2 = QKV_SHAPE(2), s1 = QKV_SHAPE(1), s3 = QKV_SHAPE(3);
  QkvParam *a = qkv_params_add(params, "a", &s2, NULL);
  QkvParam *b = qkv_params_add(params, "b", &s1, NULL);
  QkvParam *frozen = qkv_params_add(params, "frozen", &s3, NULL);
  qkv_param_set_frozen(frozen, TRUE);
  float ga[] = {3, 4}, gb[] = {12}, gf[] = {100, 100, 100};
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_grad(b)), gb, sizeof gb);
  memcpy(qkv_tensor_f32(qkv_param_grad(frozen)), gf, sizeof gf);

  /* a large max_norm: the norm (sqrt(9 + 16 + 144) = 13), nothing scaled */
  g_assert_cmpfloat_with_epsilon(qkv_clip_grad_norm(params, NULL, NULL, 100.0, QKV_CLIP_TORCH),
                                 13.0, 1e-12);
  qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
  qkv_assert_values(qkv_param_grad(b), gb, 1, 0);

  /* max_norm 6.5: coefficient 6.5 / (13 + 1e-6) */
  double norm = qkv_clip_grad_norm(params, NULL, NULL, 6.5, QKV_CLIP_TORCH);
  g_assert_cmpfloat_with_epsilon(norm, 13.0, 1e-12);
  float coef = (float)(6.5 / (13.0 + 1e-6));
  float want_a[] = {3 * coef, 4 * coef}, want_b[] = {12 * coef};
  qkv_assert_values(qkv_param_grad(a), want_a, 2, 1e-7);
  qkv_assert_values(qkv_param_grad(b), want_b, 1, 1e-7);
  qkv_assert_values(qkv_param_grad(frozen), gf, 3, 0);
  /* the clipped norm is max_norm (up to the 1e-6) */
  g_assert_cmpfloat_with_epsilon(qkv_clip_grad_norm(params, NULL, NULL, 1e9, QKV_CLIP_TORCH), 6.5,
                                 1e-5);

  /* the optimizer's selection */
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_grad(b)), gb, sizeof gb);
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, NULL);
  const gchar *names[] = {"a", NULL};
  g_assert_true(qkv_optimizer_select_names(opt, names, NULL));
  g_assert_cmpfloat_with_epsilon(qkv_optimizer_clip_grad_norm(opt, 1.0, QKV_CLIP_TORCH), 5.0,
                                 1e-12);
  float c5 = (float)(1.0 / (5.0 + 1e-6));
  float want_a5[] = {3 * c5, 4 * c5};
  qkv_assert_values(qkv_param_grad(a), want_a5, 2, 1e-7);
  qkv_assert_values(qkv_param_grad(b), gb, 1, 0);
}

/* A max_norm that is NaN or negative, or a rule that is neither
 * QKV_CLIP_TORCH nor QKV_CLIP_D2L, is refused: qkv_clip_grad_norm() and
 * qkv_optimizer_clip_grad_norm() return -1 and leave the gradients as they
 * are, qkv_optimizer_step_clipped() fails with QKV_ERROR_INVALID_ARGUMENT and
 * updates nothing. +inf clips nothing. */
static void
test_clip_bad_arguments(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s2 = QKV_SHAPE(2);
  QkvParam *a = qkv_params_add(params, "a", &s2, NULL);
  float ga[] = {3, 4}, va[] = {0.5f, -0.25f};
  memcpy(qkv_tensor_f32(qkv_param_grad(a)), ga, sizeof ga);
  memcpy(qkv_tensor_f32(qkv_param_value(a)), va, sizeof va);
  QkvOptimConfig c = qkv_optim_config_sgd(1.0);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, NULL);

  const double bad_norms[] = {NAN, -1.0, -INFINITY};
  for (gsize i = 0; i < G_N_ELEMENTS(bad_norms); i++) {
    for (gint r = 0; r < 2; r++) {
      QkvClipRule rule = r == 0 ? QKV_CLIP_TORCH : QKV_CLIP_D2L;
      g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, bad_norms[i], rule), ==, -1.0);
      g_assert_cmpfloat(qkv_optimizer_clip_grad_norm(opt, bad_norms[i], rule), ==, -1.0);
      qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
      g_autoptr(GError) error = NULL;
      double norm = 0;
      g_assert_false(qkv_optimizer_step_clipped(opt, bad_norms[i], rule, &norm, &error));
      g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
      g_assert_nonnull(strstr(error->message, "max_norm"));
      g_assert_cmpfloat(norm, ==, -1.0);
      qkv_assert_values(qkv_param_value(a), va, 2, 0);
      qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
    }
  }
  const QkvClipRule unknown = (QkvClipRule)7;
  g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, 1.0, unknown), ==, -1.0);
  g_assert_cmpfloat(qkv_optimizer_clip_grad_norm(opt, 1.0, unknown), ==, -1.0);
  qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
  g_autoptr(GError) error = NULL;
  g_assert_false(qkv_optimizer_step_clipped(opt, 1.0, unknown, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "rule"));
  g_clear_error(&error);
  qkv_assert_values(qkv_param_value(a), va, 2, 0);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 0);

  /* +inf: the norm, nothing scaled */
  g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, INFINITY, QKV_CLIP_TORCH), ==, 5.0);
  g_assert_cmpfloat(qkv_clip_grad_norm(params, NULL, NULL, INFINITY, QKV_CLIP_D2L), ==, 5.0);
  qkv_assert_values(qkv_param_grad(a), ga, 2, 0);
}

static void
test_schedule_warmup(void)
{
  const double factor = 2.0, d_model = 512, warmup = 4000;
  g_autoptr(QkvSchedule) s = qkv_schedule_new_warmup(factor, 512, 4000);
  double scale = factor / sqrt(d_model);
  /* step 1: the linear branch, 1 · warmup^-1.5 */
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 1), scale * pow(warmup, -1.5), 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 1), 2.0 / sqrt(512.0) / 252982.21281347,
                                 1e-12);
  /* step warmup: both branches meet at warmup^-0.5 */
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 4000), scale / sqrt(warmup), 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 4000), 1.3975424859373685e-03, 1e-15);
  /* step 10·warmup: the inverse square root branch */
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 40000), scale / sqrt(40000.0), 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(s, 40000), 4.419417382415922e-04, 1e-15);
  g_assert_cmpfloat(qkv_schedule_lr_at(s, 3999), <, qkv_schedule_lr_at(s, 4000));
  g_assert_cmpfloat(qkv_schedule_lr_at(s, 4001), <, qkv_schedule_lr_at(s, 4000));
  g_assert_cmpfloat(qkv_schedule_lr_at(s, 0), ==, qkv_schedule_lr_at(s, 1));

  /* stepping advances the position and sets the optimizer's lr */
  g_autoptr(QkvParams) params = make_store();
  QkvOptimConfig c = qkv_optim_config_adam(1.0);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  g_assert_cmpint(qkv_schedule_get_position(s), ==, 0);
  g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, qkv_schedule_lr_at(s, 1));
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, qkv_schedule_lr_at(s, 1));
  g_assert_cmpfloat(qkv_schedule_step(s, NULL), ==, qkv_schedule_lr_at(s, 2));
  g_assert_cmpint(qkv_schedule_get_position(s), ==, 2);
  qkv_schedule_set_position(s, 3999);
  g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, qkv_schedule_lr_at(s, 4000));
  g_assert_cmpint(qkv_schedule_get_kind(s), ==, QKV_SCHEDULE_WARMUP);
  g_assert_cmpstr(qkv_schedule_kind_name(QKV_SCHEDULE_WARMUP), ==, "warmup");
}

static void
test_schedule_cosine_step_constant(void)
{
  g_autoptr(QkvSchedule) cosine = qkv_schedule_new_cosine(0.1, 100, 0.001);
  /* t = step - 1: full lr first, the midpoint at t = 50, min_lr from t = 100 on */
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 1), 0.1, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 51), 0.0505, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 26),
                                 0.001 + 0.099 * (1 + cos(G_PI / 4)) / 2, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 26), 0.0855017856687341, 1e-12);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 101), 0.001, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(cosine, 500), 0.001, 1e-15);

  g_autoptr(QkvSchedule) step = qkv_schedule_new_step(0.1, 30, 0.1);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 1), 0.1, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 30), 0.1, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 31), 0.01, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 60), 0.01, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 61), 0.001, 1e-15);
  g_assert_cmpfloat_with_epsilon(qkv_schedule_lr_at(step, 95), 0.0001, 1e-15);

  g_autoptr(QkvSchedule) constant = qkv_schedule_new_constant(0.25);
  g_assert_cmpfloat(qkv_schedule_lr_at(constant, 1), ==, 0.25);
  g_assert_cmpfloat(qkv_schedule_lr_at(constant, 123456), ==, 0.25);
  g_assert_cmpfloat(qkv_schedule_step(constant, NULL), ==, 0.25);
  g_assert_cmpint(qkv_schedule_get_position(constant), ==, 1);
}

/* Bad schedule values: the qkv_schedule_new_*() constructors return NULL
 * without a message (a critical would abort the test). */
static void
test_schedule_bad_values_quiet(void)
{
  g_assert_null(qkv_schedule_new_constant(NAN));
  g_assert_null(qkv_schedule_new_constant(-0.1));
  g_assert_null(qkv_schedule_new_warmup(1.0, 512, 0));
  g_assert_null(qkv_schedule_new_warmup(1.0, 512, -5));
  g_assert_null(qkv_schedule_new_warmup(1.0, -1, 4000));
  g_assert_null(qkv_schedule_new_warmup(INFINITY, 512, 4000));
  g_assert_null(qkv_schedule_new_step(0.1, 0, 0.5));
  g_assert_null(qkv_schedule_new_step(0.1, -3, 0.5));
  g_assert_null(qkv_schedule_new_step(0.1, 10, INFINITY));
  g_assert_null(qkv_schedule_new_step(0.1, 10, NAN));
  g_assert_null(qkv_schedule_new_step(0.1, 10, -0.5));
  g_assert_null(qkv_schedule_new_cosine(0.1, -3, 0.0));
  g_assert_null(qkv_schedule_new_cosine(0.1, 0, 0.0));
  g_assert_null(qkv_schedule_new_cosine(0.1, 100, NAN));
  g_assert_null(qkv_schedule_new_cosine(0.1, 100, -0.001));
  /* the edges that are allowed */
  g_autoptr(QkvSchedule) zero = qkv_schedule_new_step(0.0, 1, 0.0);
  g_assert_nonnull(zero);
  g_assert_cmpfloat(qkv_schedule_lr_at(zero, 5), ==, 0.0);
  g_autoptr(QkvSchedule) one = qkv_schedule_new_warmup(1.0, 1, 1);
  g_assert_nonnull(one);
}

/* Any message logged while a test that installs this runs fails it: a
 * value a user can pass must be refused or clamped, never a critical. */
static void
fail_on_any_message(const gchar *domain, GLogLevelFlags level, const gchar *message,
                    gpointer user_data)
{
  g_error("unexpected message [%s]: %s", domain != NULL ? domain : "", message);
}

/* Values a user can pass to the optimizer's and the schedules' setters:
 * refused (the try forms say why) or clamped, as the headers say; once a
 * critical each (set_lr NaN, inf or negative; set_step negative). */
static void
test_optimizer_setters_quiet(void)
{
  guint handler = g_log_set_handler(
      "qkv", G_LOG_LEVEL_MASK | G_LOG_FLAG_FATAL | G_LOG_FLAG_RECURSION, fail_on_any_message, NULL);
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(3);
  g_assert_nonnull(qkv_params_add(params, "w", &s, NULL));
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  const double bad[] = {NAN, INFINITY, -INFINITY, -0.5, -G_MINDOUBLE};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    qkv_optimizer_set_lr(opt, bad[i]);
    g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, 0.01);
    g_autoptr(GError) error = NULL;
    g_assert_false(qkv_optimizer_try_set_lr(opt, bad[i], &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_assert_nonnull(strstr(error->message, "lr must be finite"));
    g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, 0.01);
  }
  /* the edges that are allowed */
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_optimizer_try_set_lr(opt, 0.0, &error));
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, 0.0);
  qkv_optimizer_set_lr(opt, G_MAXDOUBLE);
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, G_MAXDOUBLE);

  qkv_optimizer_set_step(opt, 7);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 7);
  qkv_optimizer_set_step(opt, -4);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 0);
  qkv_optimizer_set_step(opt, G_MININT64);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 0);

  /* the schedules' setters and steps with the same kind of values */
  g_autoptr(QkvSchedule) sched = qkv_schedule_new_step(0.1, 1, 1e300);
  qkv_schedule_set_position(sched, -4);
  g_assert_cmpint(qkv_schedule_get_position(sched), ==, 0);
  for (gint i = 0; i < 4; i++)
    g_assert_true(isfinite(qkv_schedule_step(sched, opt)));
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, qkv_schedule_lr_at(sched, 4));
  g_assert_true(isfinite(qkv_schedule_lr_at(sched, G_MININT64)));
  g_assert_true(isfinite(qkv_schedule_lr_at(sched, G_MAXINT64)));
  g_log_remove_handler("qkv", handler);
}

/* A group number past the end is a value a user can pass (a count kept
 * from another optimizer, an off-by-one over get_n_groups): the getters
 * return their documented out-of-range values and log nothing. */
static void
test_group_getters_out_of_range_quiet(void)
{
  guint handler = g_log_set_handler(
      "qkv", G_LOG_LEVEL_MASK | G_LOG_FLAG_FATAL | G_LOG_FLAG_RECURSION, fail_on_any_message, NULL);
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE(3);
  g_assert_nonnull(qkv_params_add(params, "w", &s, NULL));
  QkvOptimConfig c = qkv_optim_config_adamw(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &c, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "w", NULL, NULL, 2, 0.5, &error), ==, 1);
  g_assert_no_error(error);
  guint n = qkv_optimizer_get_n_groups(opt);
  g_assert_cmpuint(n, ==, 2);
  /* the last valid group still answers */
  g_assert_cmpstr(qkv_optimizer_get_group_pattern(opt, n - 1), ==, "w");
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(opt, n - 1), ==, 2.0);
  const guint past[] = {n, n + 1, G_MAXUINT};
  for (guint i = 0; i < G_N_ELEMENTS(past); i++) {
    g_assert_null(qkv_optimizer_get_group_pattern(opt, past[i]));
    gpointer data = opt;
    g_assert_null(qkv_optimizer_get_group_filter(opt, past[i], &data));
    g_assert_null(data);
    g_assert_true(isnan(qkv_optimizer_get_group_lr_factor(opt, past[i])));
    g_assert_true(isnan(qkv_optimizer_get_group_weight_decay(opt, past[i])));
    g_assert_true(isnan(qkv_optimizer_get_group_lr(opt, past[i])));
  }
  g_log_remove_handler("qkv", handler);
}

/* The qkv_schedule_try_new_*() forms say what is wrong. */
static void
test_schedule_try_new_errors(void)
{
  struct {
    QkvSchedule *s;
    const gchar *name;
  } bad[] = {
      {NULL, "lr"},    {NULL, "warmup"}, {NULL, "d_model"}, {NULL, "factor"},
      {NULL, "gamma"}, {NULL, "t_max"},  {NULL, "min_lr"},  {NULL, "step_size"},
  };
  GError *errors[G_N_ELEMENTS(bad)] = {NULL};
  bad[0].s = qkv_schedule_try_new_constant(-1.0, &errors[0]);
  bad[1].s = qkv_schedule_try_new_warmup(1.0, 512, 0, &errors[1]);
  bad[2].s = qkv_schedule_try_new_warmup(1.0, -1, 4000, &errors[2]);
  bad[3].s = qkv_schedule_try_new_warmup(NAN, 512, 4000, &errors[3]);
  bad[4].s = qkv_schedule_try_new_step(0.1, 10, INFINITY, &errors[4]);
  bad[5].s = qkv_schedule_try_new_cosine(0.1, -3, 0.0, &errors[5]);
  bad[6].s = qkv_schedule_try_new_cosine(0.1, 100, NAN, &errors[6]);
  bad[7].s = qkv_schedule_try_new_step(0.1, -1, 0.5, &errors[7]);
  for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_assert_null(bad[i].s);
    g_assert_error(errors[i], QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_assert_nonnull(strstr(errors[i]->message, bad[i].name));
    g_error_free(errors[i]);
  }
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvSchedule) good = qkv_schedule_try_new_cosine(0.1, 100, 0.001, &error);
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_schedule_lr_at(good, 1), ==, 0.1);
}

/* A negative position counts as 0; a StepLR whose gamma overflows the rate
 * stops at the largest double, which the optimizer takes (inf it refused
 * with a critical at every step). */
static void
test_schedule_position_and_overflow(void)
{
  g_autoptr(QkvSchedule) s = qkv_schedule_new_step(1.0, 1, 1e300);
  qkv_schedule_set_position(s, -4);
  g_assert_cmpint(qkv_schedule_get_position(s), ==, 0);
  g_autoptr(QkvParams) params = make_store();
  QkvOptimConfig c = qkv_optim_config_sgd(1.0);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, NULL);
  g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, 1.0);
  g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, 1e300);
  g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, G_MAXDOUBLE);
  g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, G_MAXDOUBLE);
  g_assert_cmpfloat(qkv_schedule_lr_at(s, 1000), ==, G_MAXDOUBLE);
  /* a rate of 0 stays 0 however large gamma^k is */
  g_autoptr(QkvSchedule) zero = qkv_schedule_new_step(0.0, 1, 1e300);
  g_assert_cmpfloat(qkv_schedule_lr_at(zero, 1000), ==, 0.0);
}

/* qkv_split_range() with no parts, an index past them or a negative n:
 * FALSE, and both outputs 0 rather than left as they were. */
static void
test_split_range_bad(void)
{
  const struct {
    gint64 n;
    gint parts, index;
  } bad[] = {{10, 0, 0}, {10, 3, 3}, {10, 3, -1}, {-5, 2, 0}, {10, -2, 0}};
  for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
    gint64 offset = 12345, count = 12345;
    g_assert_false(qkv_split_range(bad[i].n, bad[i].parts, bad[i].index, &offset, &count));
    g_assert_cmpint(offset, ==, 0);
    g_assert_cmpint(count, ==, 0);
  }
  gint64 offset = -1, count = -1;
  g_assert_true(qkv_split_range(10, 3, 2, &offset, &count));
  g_assert_cmpint(offset, ==, 7);
  g_assert_cmpint(count, ==, 3);
}

/* ---- gradient accumulation ---------------------------------------------- */

#define AB 7 /* rows */
#define AI 3 /* inputs */
#define AO 2 /* outputs */

/* loss = Σ ((x Wᵀ + b)²) / 2 over a batch of rows. With small integer data
 * every product and partial sum is an integer far below 2^24, exact in f32,
 * so the gradient of the whole batch and the sum over its parts are equal
 * exactly, whatever order either is summed in. */
static void
test_grad_accumulator(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(AO, AI), bs = QKV_SHAPE(AO), fs = QKV_SHAPE(4);
  float *w = qkv_tensor_f32(qkv_param_value(qkv_params_add(params, "w", &ws, &error)));
  float *b = qkv_tensor_f32(qkv_param_value(qkv_params_add(params, "b", &bs, &error)));
  QkvParam *frozen = qkv_params_add(params, "frozen", &fs, &error);
  g_assert_no_error(error);
  qkv_param_set_frozen(frozen, TRUE);
  for (gint i = 0; i < AO * AI; i++)
    w[i] = (float)((i * 5) % 7 - 3);
  for (gint i = 0; i < AO; i++)
    b[i] = (float)(i - 1);

  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(AB, AI);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_add(qkv_matmul(x, qkv_graph_param(g, params, "w", &error), FALSE, TRUE, &error),
                        qkv_graph_param(g, params, "b", &error), &error);
  QkvValue *loss = qkv_scale(qkv_sum(qkv_square(y, &error), NULL, 0, FALSE, &error), 0.5, &error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  g_assert_no_error(error);

  float data[AB * AI];
  for (gint i = 0; i < AB * AI; i++)
    data[i] = (float)((i * 3) % 5 - 2);
  g_autoptr(QkvTensor) all = qkv_tensor_new_from_data(QKV_F32, &xs, data);
  g_assert_true(qkv_plan_bind(plan, "x", all, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_autoptr(QkvTensor) want_w = qkv_tensor_copy(qkv_param_grad(qkv_params_lookup(params, "w")));
  g_autoptr(QkvTensor) want_b = qkv_tensor_copy(qkv_param_grad(qkv_params_lookup(params, "b")));
  g_assert_cmpfloat(qkv_tensor_f32(want_w)[0], !=, 0.0f); /* the check below has teeth */

  g_autoptr(QkvGradAccumulator) acc = qkv_grad_accumulator_new(params, &error);
  g_assert_no_error(error);
  /* nothing added: store gives zeros */
  g_assert_cmpuint(qkv_grad_accumulator_store(acc), ==, 0);
  for (gint i = 0; i < AO; i++)
    g_assert_cmpfloat(qkv_tensor_f32(qkv_param_grad(qkv_params_lookup(params, "b")))[i], ==, 0.0f);

  for (gint parts = 1; parts <= AB + 2; parts++) {
    gint64 covered = 0;
    guint added = 0;
    for (gint part = 0; part < parts; part++) {
      gint64 offset, rows;
      qkv_split_range(AB, parts, part, &offset, &rows);
      g_assert_cmpint(offset, ==, covered); /* consecutive, in order */
      g_assert_cmpint(rows, >=, AB / parts);
      g_assert_cmpint(rows, <=, AB / parts + 1);
      covered += rows;
      if (rows == 0)
        continue;
      QkvShape ps = QKV_SHAPE(rows, AI);
      g_autoptr(QkvTensor) piece = qkv_tensor_new_borrowed(QKV_F32, &ps, data + offset * AI);
      g_assert_true(qkv_plan_bind(plan, "x", piece, &error));
      g_assert_true(qkv_plan_run(plan, &error));
      g_assert_no_error(error);
      qkv_grad_accumulator_add(acc);
      added++;
    }
    g_assert_cmpint(covered, ==, AB);
    g_assert_cmpuint(added, ==, MIN(parts, AB));
    /* between runs the buffers hold the last part's gradient only */
    if (parts > 1)
      g_assert_cmpfloat(fabsf(qkv_tensor_f32(qkv_param_grad(qkv_params_lookup(params, "w")))[0] -
                              qkv_tensor_f32(want_w)[0]),
                        >, 0.0f);
    g_assert_cmpuint(qkv_grad_accumulator_store(acc), ==, added);
    qkv_assert_tensor_close(qkv_param_grad(qkv_params_lookup(params, "w")), want_w, 0.0);
    qkv_assert_tensor_close(qkv_param_grad(qkv_params_lookup(params, "b")), want_b, 0.0);
  }
}

/* Parameter groups against torch.optim's param_groups (tests/reference/optim_ref.py,
 * *_groups): each group's lr is the optimizer's times the factor. */
static void
add_bias_group_quarter(QkvOptimizer *opt)
{
  g_autoptr(GError) error = NULL;
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "b", NULL, NULL, 0.25, 0.0, &error), ==, 1);
  g_assert_no_error(error);
}

static void
add_bias_group_half(QkvOptimizer *opt)
{
  g_autoptr(GError) error = NULL;
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "b", NULL, NULL, 0.5, 0.0, &error), ==, 1);
  g_assert_no_error(error);
}

/* w matches both groups and goes to the first; b only the catch-all pattern */
static void
add_matrix_and_rest_groups(QkvOptimizer *opt)
{
  g_autoptr(GError) error = NULL;
  g_assert_cmpuint(
      qkv_optimizer_add_group(opt, NULL, qkv_param_filter_matrices, NULL, 2.0, 0.2, &error), ==, 1);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "*", NULL, NULL, 0.5, 0.0, &error), ==, 2);
  g_assert_no_error(error);
  QkvParams *params = qkv_optimizer_get_params(opt);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, qkv_params_lookup(params, "w")), ==, 1);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, qkv_params_lookup(params, "b")), ==, 2);
}

static void
test_groups_sgd(void)
{
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  const gchar *states[] = {"momentum_buffer", NULL};
  run_against_torch_grouped("sgd_groups", QKV_OPTIMIZER_SGD, &c, states, add_bias_group_quarter);
}

static void
test_groups_adam(void)
{
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  c.weight_decay = 0.1;
  const gchar *states[] = {"exp_avg", "exp_avg_sq", NULL};
  run_against_torch_grouped("adam_groups", QKV_OPTIMIZER_ADAM, &c, states, add_bias_group_half);
}

static void
test_groups_adamw(void)
{
  QkvOptimConfig c = qkv_optim_config_adamw(0.01);
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.eps = 1e-6;
  c.weight_decay = 0.1;
  const gchar *states[] = {"exp_avg", "exp_avg_sq", NULL};
  run_against_torch_grouped("adamw_groups", QKV_OPTIMIZER_ADAMW, &c, states,
                            add_matrix_and_rest_groups);
}

static gboolean
accept_none(QkvParam *param, gpointer user_data)
{
  return FALSE;
}

static void
test_groups_api(void)
{
  g_autoptr(QkvParams) params = make_store();
  QkvParam *w = qkv_params_lookup(params, "w"), *b = qkv_params_lookup(params, "b");
  QkvOptimConfig c = qkv_optim_config_adamw(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &c, NULL);
  g_autoptr(GError) error = NULL;

  /* only the default group, with the config's settings */
  g_assert_cmpuint(qkv_optimizer_get_n_groups(opt), ==, 1);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, w), ==, 0);
  g_assert_null(qkv_optimizer_get_group_pattern(opt, 0));
  gpointer data = opt;
  g_assert_null(qkv_optimizer_get_group_filter(opt, 0, &data));
  g_assert_null(data);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(opt, 0), ==, 1.0);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 0), ==, 1e-2);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 0), ==, 0.01);

  /* refused: nothing added */
  const double bad[][2] = {{-1, 0}, {NAN, 0}, {INFINITY, 0}, {1, -0.5}, {1, NAN}, {1, INFINITY}};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_assert_cmpuint(qkv_optimizer_add_group(opt, "w", NULL, NULL, bad[i][0], bad[i][1], &error),
                     ==, 0);
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_assert_nonnull(strstr(error->message, i < 3 ? "lr_factor" : "weight_decay"));
    g_clear_error(&error);
  }
  g_assert_cmpuint(qkv_optimizer_add_group(opt, NULL, NULL, NULL, 1, 0, &error), ==, 0);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "w\xff", NULL, NULL, 1, 0, &error), ==, 0);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "UTF-8"));
  g_clear_error(&error);
  g_assert_cmpuint(qkv_optimizer_get_n_groups(opt), ==, 1);

  /* pattern and filter must both accept; the first group that holds a param wins */
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "*", accept_none, params, 3, 0, &error), ==, 1);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "?", NULL, NULL, 0.5, 0, &error), ==, 2);
  g_assert_cmpuint(
      qkv_optimizer_add_group(opt, "*", qkv_param_filter_matrices, NULL, 2, 0.1, &error), ==, 3);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_optimizer_get_n_groups(opt), ==, 4);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, w), ==, 2);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, b), ==, 2);
  QkvShape ms = QKV_SHAPE(2, 2), vs = QKV_SHAPE(5);
  QkvParam *later = qkv_params_add(params, "later.weight", &ms, NULL);
  QkvParam *gain = qkv_params_add(params, "later.gain", &vs, NULL);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, later), ==, 3); /* asked when needed */
  g_assert_cmpuint(qkv_optimizer_group_of(opt, gain), ==, 0);
  g_assert_cmpstr(qkv_optimizer_get_group_pattern(opt, 2), ==, "?");
  g_assert_true(qkv_optimizer_get_group_filter(opt, 1, &data) == accept_none);
  g_assert_true(data == params);
  g_assert_true(qkv_optimizer_get_group_filter(opt, 3, NULL) == qkv_param_filter_matrices);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(opt, 3), ==, 2);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 3), ==, 0.1);
  qkv_optimizer_set_lr(opt, 0.25);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 3), ==, 0.5);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 0), ==, 0.25);

  /* settings change; group 0's are the config's */
  g_assert_true(qkv_optimizer_set_group_settings(opt, 3, 0.75, 0.3, &error));
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(opt, 3), ==, 0.75);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 3), ==, 0.3);
  const guint not_added[] = {0, 4};
  for (guint i = 0; i < G_N_ELEMENTS(not_added); i++) {
    g_assert_false(qkv_optimizer_set_group_settings(opt, not_added[i], 1, 0, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_clear_error(&error);
  }
  g_assert_false(qkv_optimizer_set_group_settings(opt, 3, 1, -1, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 3), ==, 0.3);
  /* set_config changes group 0 only */
  c.weight_decay = 0.5;
  g_assert_true(qkv_optimizer_set_config(opt, &c, NULL));
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 0), ==, 0.5);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(opt, 3), ==, 0.3);
  /* a factor that would overflow stops at the largest double */
  g_assert_true(qkv_optimizer_set_group_settings(opt, 3, 4, 0, NULL));
  qkv_optimizer_set_lr(opt, G_MAXDOUBLE);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 3), ==, G_MAXDOUBLE);
}

/* The job of two optimizers and the global clipping function, done by one
 * optimizer with a group in one clipped step: the same bits. A group with the
 * default group's settings changes nothing either. */
static void
test_groups_one_clipped_step(void)
{
  const QkvOptimizerKind kinds[] = {QKV_OPTIMIZER_SGD, QKV_OPTIMIZER_ADAM, QKV_OPTIMIZER_ADAMW};
  for (guint k = 0; k < G_N_ELEMENTS(kinds); k++) {
    g_autoptr(QkvParams) split = make_store();
    g_autoptr(QkvParams) grouped = make_store();
    g_autoptr(QkvParams) same = make_store();
    g_autoptr(QkvParams) plain = make_store();
    QkvOptimConfig c =
        kinds[k] == QKV_OPTIMIZER_SGD ? qkv_optim_config_sgd(0.1) : qkv_optim_config_adamw(0.01);
    c.momentum = kinds[k] == QKV_OPTIMIZER_SGD ? 0.9 : 0.0;
    c.weight_decay = 0.05;
    QkvOptimConfig bias_config = c;
    bias_config.lr = c.lr * 0.5;
    bias_config.weight_decay = 0;
    g_autoptr(GError) error = NULL;
    g_autoptr(QkvOptimizer) matrices = qkv_optimizer_new(kinds[k], split, &c, &error);
    g_autoptr(QkvOptimizer) biases = qkv_optimizer_new(kinds[k], split, &bias_config, &error);
    g_autoptr(QkvOptimizer) one = qkv_optimizer_new(kinds[k], grouped, &c, &error);
    g_autoptr(QkvOptimizer) noop = qkv_optimizer_new(kinds[k], same, &c, &error);
    g_autoptr(QkvOptimizer) none = qkv_optimizer_new(kinds[k], plain, &c, &error);
    g_assert_no_error(error);
    qkv_optimizer_select_filter(matrices, qkv_param_filter_matrices, NULL);
    qkv_optimizer_select_filter(biases, only_bias, NULL);
    g_assert_cmpuint(qkv_optimizer_add_group(one, NULL, only_bias, NULL, 0.5, 0, &error), ==, 1);
    g_assert_cmpuint(qkv_optimizer_add_group(noop, "*", NULL, NULL, 1, 0.05, &error), ==, 1);
    g_assert_no_error(error);
    for (gint step = 0; step < 4; step++) {
      set_grads(split);
      set_grads(grouped);
      set_grads(same);
      set_grads(plain);
      double max_norm = step == 3 ? 1e6 : 0.5, norm = 0;
      double global = qkv_clip_grad_norm(split, NULL, NULL, max_norm, QKV_CLIP_TORCH);
      g_assert_true(qkv_optimizer_step(matrices, &error) && qkv_optimizer_step(biases, &error));
      g_assert_true(qkv_optimizer_step_clipped(one, max_norm, QKV_CLIP_TORCH, &norm, &error));
      g_assert_cmpfloat(norm, ==, global);
      g_assert_true(qkv_optimizer_step_clipped(noop, max_norm, QKV_CLIP_TORCH, NULL, &error));
      g_assert_true(qkv_optimizer_step_clipped(none, max_norm, QKV_CLIP_TORCH, NULL, &error));
      g_assert_no_error(error);
      for (guint i = 0; i < 2; i++) {
        QkvTensor *want = qkv_param_value(qkv_params_nth(split, i));
        gsize n = (gsize)qkv_tensor_numel(want);
        qkv_assert_values(qkv_param_value(qkv_params_nth(grouped, i)), qkv_tensor_f32(want), n, 0);
        qkv_assert_values(qkv_param_value(qkv_params_nth(same, i)),
                          qkv_tensor_f32(qkv_param_value(qkv_params_nth(plain, i))), n, 0);
      }
    }
    g_assert_cmpint(qkv_optimizer_get_step(one), ==, 4);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/optim/sgd-momentum-weight-decay-matches-torch", test_sgd_momentum);
  g_test_add_func("/optim/sgd-nesterov-matches-torch", test_sgd_nesterov);
  g_test_add_func("/optim/adam-matches-torch", test_adam);
  g_test_add_func("/optim/adamw-matches-torch", test_adamw);
  g_test_add_func("/optim/groups/sgd-matches-torch", test_groups_sgd);
  g_test_add_func("/optim/groups/adam-matches-torch", test_groups_adam);
  g_test_add_func("/optim/groups/adamw-matches-torch", test_groups_adamw);
  g_test_add_func("/optim/groups/api", test_groups_api);
  g_test_add_func("/optim/groups/one-clipped-step", test_groups_one_clipped_step);
  g_test_add_func("/optim/defaults", test_defaults);
  g_test_add_func("/optim/invalid-config", test_invalid_config);
  g_test_add_func("/optim/frozen-and-subsets", test_frozen_and_subsets);
  g_test_add_func("/optim/lr-changes-between-steps", test_lr_changes_between_steps);
  g_test_add_func("/optim/state-of-wrong-shape", test_state_of_wrong_shape);
  g_test_add_func("/optim/clip-grad-norm", test_clip_grad_norm);
  g_test_add_func("/optim/clip-grad-norm-d2l", test_clip_grad_norm_d2l);
  g_test_add_data_func("/optim/step-clipped/torch", GINT_TO_POINTER(QKV_CLIP_TORCH),
                       test_step_clipped);
  g_test_add_data_func("/optim/step-clipped/d2l", GINT_TO_POINTER(QKV_CLIP_D2L), test_step_clipped);
  g_test_add_func("/optim/clip-bad-arguments", test_clip_bad_arguments);
  g_test_add_func("/optim/schedule-warmup", test_schedule_warmup);
  g_test_add_func("/optim/schedule-cosine-step-constant", test_schedule_cosine_step_constant);
  g_test_add_func("/optim/schedule-bad-values-quiet", test_schedule_bad_values_quiet);
  g_test_add_func("/optim/optimizer-setters-quiet", test_optimizer_setters_quiet);
  g_test_add_func("/optim/groups/getters-out-of-range-quiet",
                  test_group_getters_out_of_range_quiet);
  g_test_add_func("/optim/schedule-try-new-errors", test_schedule_try_new_errors);
  g_test_add_func("/optim/schedule-position-and-overflow", test_schedule_position_and_overflow);
  g_test_add_func("/optim/grad-accumulator", test_grad_accumulator);
  g_test_add_func("/optim/split-range-bad", test_split_range_bad);
  return g_test_run();
}
