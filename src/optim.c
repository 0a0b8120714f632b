/* optim.c: SGD, Adam, AdamW and gradient clipping, with PyTorch's update
 * rules (torch/optim/sgd.py, adam.py, adamw.py, _single_tensor_*). */
#include "qkv-private.h"
#include "qkv/qkv-optim.h"

#include <math.h>

/* Element loops run in parallel only when a tensor is big enough to pay for
 * the threads; each element is computed the same way either way, so the
 * result does not depend on the thread count. */
#define PARALLEL_MIN 32768

typedef enum {
  SELECT_ALL,
  SELECT_NAMES,
  SELECT_FILTER,
} SelectMode;

struct _QkvOptimizer {
  QkvOptimizerKind kind;
  QkvParams *params;
  QkvOptimConfig config;
  gint64 step;
  SelectMode mode;
  GHashTable *selected; /* QkvParam* set, SELECT_NAMES */
  QkvParamFilter filter;
  gpointer filter_data;
};

QkvOptimConfig
qkv_optim_config_sgd(double lr)
{
  QkvOptimConfig c = {0};
  c.lr = lr;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  return c;
}

QkvOptimConfig
qkv_optim_config_adam(double lr)
{
  return qkv_optim_config_sgd(lr);
}

QkvOptimConfig
qkv_optim_config_adamw(double lr)
{
  QkvOptimConfig c = qkv_optim_config_sgd(lr);
  c.weight_decay = 1e-2;
  return c;
}

const gchar *
qkv_optimizer_kind_name(QkvOptimizerKind kind)
{
  switch (kind) {
  case QKV_OPTIMIZER_SGD:
    return "sgd";
  case QKV_OPTIMIZER_ADAM:
    return "adam";
  case QKV_OPTIMIZER_ADAMW:
    return "adamw";
  }
  return "?";
}

gboolean
qkv_optimizer_kind_from_name(const gchar *name, QkvOptimizerKind *kind)
{
  static const QkvOptimizerKind kinds[] = {QKV_OPTIMIZER_SGD, QKV_OPTIMIZER_ADAM,
                                           QKV_OPTIMIZER_ADAMW};
  for (guint i = 0; i < G_N_ELEMENTS(kinds); i++) {
    if (name != NULL && g_str_equal(name, qkv_optimizer_kind_name(kinds[i]))) {
      if (kind != NULL)
        *kind = kinds[i];
      return TRUE;
    }
  }
  return FALSE;
}

static gboolean
validate_config(QkvOptimizerKind kind, const QkvOptimConfig *c, GError **error)
{
  const gchar *name = qkv_optimizer_kind_name(kind);
#define BAD(...)                                                                                   \
  do {                                                                                             \
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, __VA_ARGS__);                        \
    return FALSE;                                                                                  \
  } while (0)
  if (!(c->lr >= 0) || !isfinite(c->lr))
    BAD("%s: invalid learning rate %g", name, c->lr);
  if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
    BAD("%s: invalid weight_decay %g", name, c->weight_decay);
  if (kind == QKV_OPTIMIZER_SGD) {
    if (!(c->momentum >= 0) || !isfinite(c->momentum))
      BAD("%s: invalid momentum %g", name, c->momentum);
    if (!isfinite(c->dampening))
      BAD("%s: invalid dampening %g", name, c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
      BAD("%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)", name,
          c->momentum, c->dampening);
  } else {
    if (!(c->eps >= 0) || !isfinite(c->eps))
      BAD("%s: invalid eps %g", name, c->eps);
    if (!(c->beta1 >= 0 && c->beta1 < 1))
      BAD("%s: invalid beta1 %g (need 0 <= beta1 < 1)", name, c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1))
      BAD("%s: invalid beta2 %g (need 0 <= beta2 < 1)", name, c->beta2);
  }
#undef BAD
  return TRUE;
}

QkvOptimizer *
qkv_optimizer_new(QkvOptimizerKind kind, QkvParams *params, const QkvOptimConfig *config,
                  GError **error)
{
  g_return_val_if_fail(params != NULL && config != NULL, NULL);
  g_return_val_if_fail(
      kind == QKV_OPTIMIZER_SGD || kind == QKV_OPTIMIZER_ADAM || kind == QKV_OPTIMIZER_ADAMW, NULL);
  if (!validate_config(kind, config, error))
    return NULL;
  QkvOptimizer *opt = g_new0(QkvOptimizer, 1);
  opt->kind = kind;
  opt->params = params;
  opt->config = *config;
  opt->mode = SELECT_ALL;
  return opt;
}

QkvOptimizer *
qkv_optimizer_new_sgd(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  return qkv_optimizer_new(QKV_OPTIMIZER_SGD, params, config, error);
}

QkvOptimizer *
qkv_optimizer_new_adam(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  return qkv_optimizer_new(QKV_OPTIMIZER_ADAM, params, config, error);
}

QkvOptimizer *
qkv_optimizer_new_adamw(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  return qkv_optimizer_new(QKV_OPTIMIZER_ADAMW, params, config, error);
}

void
qkv_optimizer_free(QkvOptimizer *opt)
{
  if (opt == NULL)
    return;
  if (opt->selected != NULL)
    g_hash_table_unref(opt->selected);
  g_free(opt);
}

gboolean
qkv_optimizer_select_names(QkvOptimizer *opt, const gchar *const *names, GError **error)
{
  g_return_val_if_fail(opt != NULL && names != NULL, FALSE);
  GHashTable *set = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; names[i] != NULL; i++) {
    QkvParam *p = qkv_params_lookup(opt->params, names[i]);
    if (p == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                  "%s optimizer: no parameter named '%s' in the store",
                  qkv_optimizer_kind_name(opt->kind), names[i]);
      g_hash_table_unref(set);
      return FALSE;
    }
    g_hash_table_add(set, p);
  }
  if (opt->selected != NULL)
    g_hash_table_unref(opt->selected);
  opt->selected = set;
  opt->mode = SELECT_NAMES;
  return TRUE;
}

void
qkv_optimizer_select_filter(QkvOptimizer *opt, QkvParamFilter filter, gpointer user_data)
{
  g_return_if_fail(opt != NULL && filter != NULL);
  g_clear_pointer(&opt->selected, g_hash_table_unref);
  opt->mode = SELECT_FILTER;
  opt->filter = filter;
  opt->filter_data = user_data;
}

void
qkv_optimizer_select_all(QkvOptimizer *opt)
{
  g_return_if_fail(opt != NULL);
  g_clear_pointer(&opt->selected, g_hash_table_unref);
  opt->mode = SELECT_ALL;
}

gboolean
qkv_optimizer_includes(QkvOptimizer *opt, QkvParam *param)
{
  g_return_val_if_fail(opt != NULL && param != NULL, FALSE);
  switch (opt->mode) {
  case SELECT_ALL:
    return TRUE;
  case SELECT_NAMES:
    return g_hash_table_contains(opt->selected, param);
  case SELECT_FILTER:
    return opt->filter(param, opt->filter_data);
  }
  return FALSE;
}

/* The params one step touches, in store order. */
static GPtrArray *
active_params(QkvOptimizer *opt)
{
  guint n = qkv_params_size(opt->params);
  GPtrArray *a = g_ptr_array_sized_new(n);
  for (guint i = 0; i < n; i++) {
    QkvParam *p = qkv_params_nth(opt->params, i);
    if (!qkv_param_get_frozen(p) && qkv_optimizer_includes(opt, p))
      g_ptr_array_add(a, p);
  }
  return a;
}

/* An existing state must have the dtype and shape the update expects. */
static gboolean
check_state(QkvParam *p, const gchar *name, QkvDType dtype, const QkvShape *shape, GError **error)
{
  QkvTensor *t = qkv_param_lookup_state(p, name);
  if (t == NULL || (qkv_tensor_dtype(t) == dtype && qkv_shape_equal(qkv_tensor_shape(t), shape)))
    return TRUE;
  g_autofree gchar *want = qkv_shape_to_string(shape);
  g_autofree gchar *got = qkv_shape_to_string(qkv_tensor_shape(t));
  g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
              "optimizer state '%s' of parameter '%s' is %s %s, expected %s %s", name,
              qkv_param_name(p), qkv_dtype_name(qkv_tensor_dtype(t)), got, qkv_dtype_name(dtype),
              want);
  return FALSE;
}

static void
sgd_update(const QkvOptimConfig *c, QkvParam *param)
{
  QkvTensor *value = qkv_param_value(param);
  float *p = qkv_tensor_f32(value);
  const float *g = qkv_tensor_f32(qkv_param_grad(param));
  gint64 n = qkv_tensor_numel(value);
  const float wd = (float)c->weight_decay, mom = (float)c->momentum;
  const float one_minus_damp = (float)(1.0 - c->dampening), neg_lr = (float)(-c->lr);
  const gboolean decay = c->weight_decay != 0, nesterov = c->nesterov;
  if (c->momentum == 0) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (gint64 i = 0; i < n; i++) {
      float d = decay ? g[i] + wd * p[i] : g[i];
      p[i] = p[i] + neg_lr * d;
    }
    return;
  }
  /* PyTorch starts the buffer as a copy of the first (decayed) gradient */
  gboolean first = qkv_param_lookup_state(param, "momentum_buffer") == NULL;
  float *buf = qkv_tensor_f32(qkv_param_state(param, "momentum_buffer"));
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (gint64 i = 0; i < n; i++) {
    float d = decay ? g[i] + wd * p[i] : g[i];
    float b = first ? d : buf[i] * mom + one_minus_damp * d;
    buf[i] = b;
    d = nesterov ? d + mom * b : b;
    p[i] = p[i] + neg_lr * d;
  }
}

static void
adam_update(QkvOptimizerKind kind, const QkvOptimConfig *c, QkvParam *param)
{
  QkvTensor *value = qkv_param_value(param);
  float *p = qkv_tensor_f32(value);
  const float *g = qkv_tensor_f32(qkv_param_grad(param));
  gint64 n = qkv_tensor_numel(value);
  QkvShape scalar = qkv_shape_scalar();
  gint32 *step_state = qkv_tensor_i32(qkv_param_state_full(param, "step", QKV_I32, &scalar));
  float *m = qkv_tensor_f32(qkv_param_state(param, "exp_avg"));
  float *v = qkv_tensor_f32(qkv_param_state(param, "exp_avg_sq"));
  gint32 step = ++step_state[0];

  const double bias_correction1 = 1.0 - pow(c->beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(c->beta2, (double)step);
  const float neg_step_size = (float)(-(c->lr / bias_correction1));
  const float bias_correction2_sqrt = (float)sqrt(bias_correction2);
  const float beta1 = (float)c->beta1, one_minus_beta1 = (float)(1.0 - c->beta1);
  const float beta2 = (float)c->beta2, one_minus_beta2 = (float)(1.0 - c->beta2);
  const float eps = (float)c->eps, wd = (float)c->weight_decay;
  const float decoupled = (float)(1.0 - c->lr * c->weight_decay);
  const gboolean l2 = kind == QKV_OPTIMIZER_ADAM && c->weight_decay != 0;
  const gboolean decay_weights = kind == QKV_OPTIMIZER_ADAMW;

#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN)
  for (gint64 i = 0; i < n; i++) {
    float pi = p[i];
    if (decay_weights)
      pi = pi * decoupled;
    float gi = l2 ? g[i] + wd * pi : g[i];
    float mi = m[i] * beta1 + one_minus_beta1 * gi;
    float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    p[i] = pi + neg_step_size * (mi / denom);
  }
}

gboolean
qkv_optimizer_step(QkvOptimizer *opt, GError **error)
{
  g_return_val_if_fail(opt != NULL, FALSE);
  g_autoptr(GPtrArray) active = active_params(opt);
  /* check everything first, so a step either updates all params or none */
  for (guint i = 0; i < active->len; i++) {
    QkvParam *p = g_ptr_array_index(active, i);
    const QkvShape *shape = qkv_param_shape(p);
    QkvShape scalar = qkv_shape_scalar();
    gboolean ok;
    if (opt->kind == QKV_OPTIMIZER_SGD)
      ok = check_state(p, "momentum_buffer", QKV_F32, shape, error);
    else
      ok = check_state(p, "exp_avg", QKV_F32, shape, error) &&
           check_state(p, "exp_avg_sq", QKV_F32, shape, error) &&
           check_state(p, "step", QKV_I32, &scalar, error);
    if (!ok)
      return FALSE;
  }
  for (guint i = 0; i < active->len; i++) {
    QkvParam *p = g_ptr_array_index(active, i);
    if (opt->kind == QKV_OPTIMIZER_SGD)
      sgd_update(&opt->config, p);
    else
      adam_update(opt->kind, &opt->config, p);
  }
  opt->step++;
  return TRUE;
}

void
qkv_optimizer_zero_grad(QkvOptimizer *opt)
{
  g_return_if_fail(opt != NULL);
  g_autoptr(GPtrArray) active = active_params(opt);
  for (guint i = 0; i < active->len; i++)
    qkv_tensor_fill(qkv_param_grad(g_ptr_array_index(active, i)), 0.0);
}

static gboolean
optimizer_filter(QkvParam *param, gpointer user_data)
{
  return qkv_optimizer_includes(user_data, param);
}

double
qkv_optimizer_clip_grad_norm(QkvOptimizer *opt, double max_norm)
{
  g_return_val_if_fail(opt != NULL, NAN);
  return qkv_clip_grad_norm(opt->params, optimizer_filter, opt, max_norm);
}

double
qkv_clip_grad_norm(QkvParams *params, QkvParamFilter filter, gpointer user_data, double max_norm)
{
  g_return_val_if_fail(params != NULL, NAN);
  guint n_params = qkv_params_size(params);
  /* the sum of squares in double, serially: the same norm for any thread count */
  double sum = 0;
  for (guint i = 0; i < n_params; i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (qkv_param_get_frozen(p) || (filter != NULL && !filter(p, user_data)))
      continue;
    QkvTensor *grad = qkv_param_grad(p);
    const float *g = qkv_tensor_f32(grad);
    gint64 n = qkv_tensor_numel(grad);
    /* vector lanes, but a fixed order: the same norm for any thread count */
#pragma omp simd reduction(+ : sum)
    for (gint64 k = 0; k < n; k++)
      sum += (double)g[k] * (double)g[k];
  }
  double norm = sqrt(sum);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1 || isnan(coef)) {
    const float c = (float)coef;
    for (guint i = 0; i < n_params; i++) {
      QkvParam *p = qkv_params_nth(params, i);
      if (qkv_param_get_frozen(p) || (filter != NULL && !filter(p, user_data)))
        continue;
      QkvTensor *grad = qkv_param_grad(p);
      float *g = qkv_tensor_f32(grad);
      gint64 n = qkv_tensor_numel(grad);
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
      for (gint64 k = 0; k < n; k++)
        g[k] *= c;
    }
  }
  return norm;
}

void
qkv_optimizer_set_lr(QkvOptimizer *opt, double lr)
{
  g_return_if_fail(opt != NULL);
  g_return_if_fail(lr >= 0 && isfinite(lr));
  opt->config.lr = lr;
}

double
qkv_optimizer_get_lr(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, 0);
  return opt->config.lr;
}

const QkvOptimConfig *
qkv_optimizer_get_config(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, NULL);
  return &opt->config;
}

gboolean
qkv_optimizer_set_config(QkvOptimizer *opt, const QkvOptimConfig *config, GError **error)
{
  g_return_val_if_fail(opt != NULL && config != NULL, FALSE);
  if (!validate_config(opt->kind, config, error))
    return FALSE;
  opt->config = *config;
  return TRUE;
}

gint64
qkv_optimizer_get_step(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, 0);
  return opt->step;
}

void
qkv_optimizer_set_step(QkvOptimizer *opt, gint64 step)
{
  g_return_if_fail(opt != NULL && step >= 0);
  opt->step = step;
}

QkvOptimizerKind
qkv_optimizer_get_kind(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, QKV_OPTIMIZER_SGD);
  return opt->kind;
}

QkvParams *
qkv_optimizer_get_params(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, NULL);
  return opt->params;
}
