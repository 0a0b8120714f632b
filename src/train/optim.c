/* optim.c: SGD, Adam, AdamW and gradient clipping, with PyTorch's update
 * rules (torch/optim/sgd.py, adam.py, adamw.py, _single_tensor_*). */
#include "train/optim-private.h"

#include <math.h>
#include "error-private.h"

/* Element loops run on qkv_get_num_threads() threads when a tensor is big
 * enough to pay for them (qkv_work_threads()); each element is computed the
 * same way either way, so the result does not depend on the thread count. */
static gint
loop_threads(gint64 work)
{
  return qkv_work_threads(qkv_get_num_threads(), work);
}

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
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL && config != NULL, NULL);
  g_return_val_if_fail(
      kind == QKV_OPTIMIZER_SGD || kind == QKV_OPTIMIZER_ADAM || kind == QKV_OPTIMIZER_ADAMW, NULL);
  if (!validate_config(kind, config, error))
    return NULL;
  QkvOptimizer *opt = g_new0(QkvOptimizer, 1);
  opt->ref_count = 1;
  opt->kind = kind;
  /* the store must outlive the optimizer: hold it */
  opt->params = qkv_params_ref(params);
  opt->config = *config;
  opt->mode = SELECT_ALL;
  return opt;
}

QkvOptimizer *
qkv_optimizer_new_sgd(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_optimizer_new(QKV_OPTIMIZER_SGD, params, config, error);
}

QkvOptimizer *
qkv_optimizer_new_adam(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_optimizer_new(QKV_OPTIMIZER_ADAM, params, config, error);
}

QkvOptimizer *
qkv_optimizer_new_adamw(QkvParams *params, const QkvOptimConfig *config, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_optimizer_new(QKV_OPTIMIZER_ADAMW, params, config, error);
}

void
qkv_optimizer_free(QkvOptimizer *opt)
{
  if (opt == NULL)
    return;
  if (!g_atomic_int_dec_and_test(&opt->ref_count))
    return;
  qkv_params_free(opt->params);
  if (opt->selected != NULL)
    g_hash_table_unref(opt->selected);
  if (opt->groups != NULL)
    g_ptr_array_unref(opt->groups);
  g_free(opt);
}

gboolean
qkv_optimizer_select_names(QkvOptimizer *opt, const gchar *const *names, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
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

/* The element loops below are written once and compiled twice: for the
 * baseline ISA and for AVX-512, picked at run time. Both round every
 * operation identically (C11 mode: no FMA contraction), so results do not
 * depend on the machine or the thread count. grad_scale multiplies the
 * gradient first, exactly as a separate clipping pass would. */
typedef struct {
  float grad_scale;
  float lr, wd, momentum, one_minus_dampening; /* SGD */
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float neg_step_size, bias_correction2_sqrt, decoupled; /* Adam */
  gboolean nesterov, first;
} UpdateConsts;

#define QKV_UPDATE_KERNELS(SUFFIX, ATTR)                                                           \
  ATTR static void sgd_span_##SUFFIX(const UpdateConsts *k, float *restrict p,                     \
                                     const float *restrict g, float *restrict buf, gint64 n)       \
  {                                                                                                \
    const float gs = k->grad_scale, wd = k->wd, neg_lr = -k->lr, mom = k->momentum;                \
    const float damp = k->one_minus_dampening;                                                     \
    if (buf == NULL) {                                                                             \
      _Pragma("omp simd") for (gint64 i = 0; i < n; i++) p[i] =                                    \
          p[i] + neg_lr * (g[i] * gs + wd * p[i]);                                                 \
    } else if (k->first) {                                                                         \
      _Pragma("omp simd") for (gint64 i = 0; i < n; i++)                                           \
      {                                                                                            \
        float d = g[i] * gs + wd * p[i];                                                           \
        buf[i] = d;                                                                                \
        p[i] = p[i] + neg_lr * (k->nesterov ? d + mom * d : d);                                    \
      }                                                                                            \
    } else {                                                                                       \
      _Pragma("omp simd") for (gint64 i = 0; i < n; i++)                                           \
      {                                                                                            \
        float d = g[i] * gs + wd * p[i];                                                           \
        float b = buf[i] * mom + damp * d;                                                         \
        buf[i] = b;                                                                                \
        p[i] = p[i] + neg_lr * (k->nesterov ? d + mom * b : b);                                    \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  ATTR static void adam_span_##SUFFIX(const UpdateConsts *k, gboolean adamw, float *restrict p,    \
                                      const float *restrict g, float *restrict m,                  \
                                      float *restrict v, gint64 n)                                 \
  {                                                                                                \
    const float gs = k->grad_scale, wd = k->wd, b1 = k->beta1, omb1 = k->one_minus_beta1;          \
    const float b2 = k->beta2, omb2 = k->one_minus_beta2, eps = k->eps;                            \
    const float neg_step = k->neg_step_size, bc2 = k->bias_correction2_sqrt;                       \
    const float decoupled = k->decoupled;                                                          \
    if (adamw) {                                                                                   \
      _Pragma("omp simd") for (gint64 i = 0; i < n; i++)                                           \
      {                                                                                            \
        float pi = p[i] * decoupled, gi = g[i] * gs;                                               \
        float mi = m[i] * b1 + omb1 * gi, vi = v[i] * b2 + omb2 * gi * gi;                         \
        m[i] = mi;                                                                                 \
        v[i] = vi;                                                                                 \
        p[i] = pi + neg_step * (mi / (sqrtf(vi) / bc2 + eps));                                     \
      }                                                                                            \
    } else {                                                                                       \
      _Pragma("omp simd") for (gint64 i = 0; i < n; i++)                                           \
      {                                                                                            \
        float pi = p[i], gi = g[i] * gs + wd * pi;                                                 \
        float mi = m[i] * b1 + omb1 * gi, vi = v[i] * b2 + omb2 * gi * gi;                         \
        m[i] = mi;                                                                                 \
        v[i] = vi;                                                                                 \
        p[i] = pi + neg_step * (mi / (sqrtf(vi) / bc2 + eps));                                     \
      }                                                                                            \
    }                                                                                              \
  }

QKV_UPDATE_KERNELS(baseline, )
#ifdef QKV_ARCH_X86
QKV_UPDATE_KERNELS(avx512, __attribute__((target("avx512f,avx512vl"))))
#else
/* never picked off x86, where qkv_use_avx512() is FALSE */
#define sgd_span_avx512 sgd_span_baseline
#define adam_span_avx512 adam_span_baseline
#endif

/* Element loops run over blocks of 16 floats, so that every chunk but the
 * last is a whole number of vectors. */
#define SPAN_BLOCK 16

typedef struct {
  const UpdateConsts *k;
  gboolean wide, adamw;
  gint64 n;
  float *p, *buf, *m, *v;
  const float *g;
} SpanJob;

static void
sgd_blocks(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const SpanJob *j = data;
  gint64 b = begin * SPAN_BLOCK, len = MIN(j->n, end * SPAN_BLOCK) - b;
  float *buf = j->buf != NULL ? j->buf + b : NULL;
  if (j->wide)
    sgd_span_avx512(j->k, j->p + b, j->g + b, buf, len);
  else
    sgd_span_baseline(j->k, j->p + b, j->g + b, buf, len);
}

static void
adam_blocks(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const SpanJob *j = data;
  gint64 b = begin * SPAN_BLOCK, len = MIN(j->n, end * SPAN_BLOCK) - b;
  if (j->wide)
    adam_span_avx512(j->k, j->adamw, j->p + b, j->g + b, j->m + b, j->v + b, len);
  else
    adam_span_baseline(j->k, j->adamw, j->p + b, j->g + b, j->m + b, j->v + b, len);
}

/* Run span over n elements; work is the float operations per element. */
static void
run_spans(QkvRangeFunc span, const SpanJob *job, gint64 work_per_element)
{
  qkv_parallel_for(loop_threads(job->n * work_per_element), (job->n + SPAN_BLOCK - 1) / SPAN_BLOCK,
                   span, (gpointer)job);
}

static void
sgd_update(const QkvOptimConfig *c, QkvParam *param, float grad_scale, gboolean first)
{
  QkvTensor *value = qkv_param_value(param);
  float *p = qkv_tensor_f32(value);
  const float *g = qkv_tensor_f32(qkv_param_grad(param));
  gint64 n = qkv_tensor_numel(value);
  UpdateConsts k = {
      .grad_scale = grad_scale,
      .lr = (float)c->lr,
      .wd = (float)c->weight_decay,
      .momentum = (float)c->momentum,
      .one_minus_dampening = (float)(1.0 - c->dampening),
      .nesterov = c->nesterov,
  };
  float *buf = NULL;
  if (c->momentum != 0) {
    /* PyTorch starts the buffer as a copy of the first (decayed) gradient */
    k.first = first;
    buf = qkv_tensor_f32(qkv_param_lookup_state(param, "momentum_buffer"));
  }
  SpanJob job = {.k = &k, .wide = qkv_use_avx512(), .n = n, .p = p, .buf = buf, .g = g};
  run_spans(sgd_blocks, &job, 4);
}

static void
adam_update(QkvOptimizerKind kind, const QkvOptimConfig *c, QkvParam *param, float grad_scale)
{
  QkvTensor *value = qkv_param_value(param);
  float *p = qkv_tensor_f32(value);
  const float *g = qkv_tensor_f32(qkv_param_grad(param));
  gint64 n = qkv_tensor_numel(value);
  QkvShape scalar = qkv_shape_scalar();
  gint32 *step_state = qkv_tensor_i32(qkv_param_state_full(param, "step", QKV_I32, &scalar));
  float *m = qkv_tensor_f32(qkv_param_state(param, "exp_avg"));
  float *v = qkv_tensor_f32(qkv_param_state(param, "exp_avg_sq"));
  /* optimizer_update checked 0 <= step < G_MAXINT32; count in 64 bits */
  gint64 step = (gint64)step_state[0] + 1;
  step_state[0] = (gint32)step;

  const double bias_correction1 = 1.0 - pow(c->beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(c->beta2, (double)step);
  const gboolean adamw = kind == QKV_OPTIMIZER_ADAMW;
  UpdateConsts k = {
      .grad_scale = grad_scale,
      /* Adam's L2 term; AdamW decays the weights instead */
      .wd = adamw ? 0.0f : (float)c->weight_decay,
      .beta1 = (float)c->beta1,
      .one_minus_beta1 = (float)(1.0 - c->beta1),
      .beta2 = (float)c->beta2,
      .one_minus_beta2 = (float)(1.0 - c->beta2),
      .eps = (float)c->eps,
      .neg_step_size = (float)(-(c->lr / bias_correction1)),
      .bias_correction2_sqrt = (float)sqrt(bias_correction2),
      .decoupled = (float)(1.0 - c->lr * c->weight_decay),
  };
  SpanJob job = {
      .k = &k, .wide = qkv_use_avx512(), .adamw = adamw, .n = n, .p = p, .m = m, .v = v, .g = g};
  run_spans(adam_blocks, &job, 12);
}

/* Updates every active param with its gradient times grad_scale; checks
 * every state first, so a step either updates all params or none. */
static gboolean
optimizer_update(QkvOptimizer *opt, GPtrArray *active, float grad_scale, GError **error)
{
  if (opt->step == G_MAXINT64) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "optimizer step: the step count %" G_GINT64_FORMAT " cannot go higher", opt->step);
    return FALSE;
  }
  QkvShape scalar = qkv_shape_scalar();
  for (guint i = 0; i < active->len; i++) {
    QkvParam *p = g_ptr_array_index(active, i);
    const QkvShape *shape = qkv_param_shape(p);
    gboolean ok;
    if (opt->kind == QKV_OPTIMIZER_SGD)
      ok = check_state(p, "momentum_buffer", QKV_F32, shape, error);
    else
      ok = check_state(p, "exp_avg", QKV_F32, shape, error) &&
           check_state(p, "exp_avg_sq", QKV_F32, shape, error) &&
           check_state(p, "step", QKV_I32, &scalar, error);
    if (!ok)
      return FALSE;
    QkvTensor *st = opt->kind == QKV_OPTIMIZER_SGD ? NULL : qkv_param_lookup_state(p, "step");
    gint32 count = st != NULL ? qkv_tensor_i32(st)[0] : 0;
    /* a negative count makes 1 - beta^step zero or negative (NaN updates);
     * the i32 state cannot count past G_MAXINT32 */
    if (count < 0 || count == G_MAXINT32) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "optimizer state 'step' of parameter '%s' is %d; it must be in [0, %d)",
                  qkv_param_name(p), count, G_MAXINT32);
      return FALSE;
    }
  }
  /* create missing state up front, so running out of memory is an error
   * before any param has moved */
  g_autofree gboolean *first = g_new0(gboolean, MAX(active->len, 1));
  for (guint i = 0; i < active->len; i++) {
    QkvParam *p = g_ptr_array_index(active, i);
    const QkvShape *shape = qkv_param_shape(p);
    first[i] = qkv_param_lookup_state(p, "momentum_buffer") == NULL;
    gboolean ok;
    if (opt->kind == QKV_OPTIMIZER_SGD)
      ok = opt->config.momentum == 0 ||
           qkv_param_try_state(p, "momentum_buffer", QKV_F32, shape, error) != NULL;
    else
      ok = qkv_param_try_state(p, "exp_avg", QKV_F32, shape, error) != NULL &&
           qkv_param_try_state(p, "exp_avg_sq", QKV_F32, shape, error) != NULL &&
           qkv_param_try_state(p, "step", QKV_I32, &scalar, error) != NULL;
    if (!ok)
      return FALSE;
  }
  for (guint i = 0; i < active->len; i++) {
    QkvParam *p = g_ptr_array_index(active, i);
    QkvOptimConfig config;
    qkv_optimizer_group_config(opt, qkv_optimizer_group_of(opt, p), &config);
    if (opt->kind == QKV_OPTIMIZER_SGD)
      sgd_update(&config, p, grad_scale, first[i]);
    else
      adam_update(opt->kind, &config, p, grad_scale);
  }
  opt->step++;
  return TRUE;
}

gboolean
qkv_optimizer_step(QkvOptimizer *opt, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(opt != NULL, FALSE);
  g_autoptr(GPtrArray) active = active_params(opt);
  return optimizer_update(opt, active, 1.0f, error);
}

/* The clipping factor of torch.nn.utils.clip_grad_norm_ or of d2l's
 * grad_clipping, or 1 when the norm is within max_norm. */
static float
clip_coefficient(double norm, double max_norm, QkvClipRule rule)
{
  if (rule == QKV_CLIP_D2L)
    return norm > max_norm || isnan(norm) ? (float)(max_norm / norm) : 1.0f;
  double coef = max_norm / (norm + 1e-6);
  return coef < 1 || isnan(coef) ? (float)coef : 1.0f;
}

/* max_norm must be at least 0 (+inf clips nothing; NaN and negative values
 * would turn the gradients NaN or point them uphill) and rule one of the
 * two. NULL when they are good, else what is wrong. */
static const gchar *
clip_arguments_problem(double max_norm, QkvClipRule rule)
{
  if (!(max_norm >= 0))
    return "max_norm must be at least 0 (not NaN)";
  if (rule != QKV_CLIP_TORCH && rule != QKV_CLIP_D2L)
    return "rule must be QKV_CLIP_TORCH or QKV_CLIP_D2L";
  return NULL;
}

static double grads_sum_of_squares(GPtrArray *params);

gboolean
qkv_optimizer_step_clipped(QkvOptimizer *opt, double max_norm, QkvClipRule rule, double *norm,
                           GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(opt != NULL, FALSE);
  const gchar *problem = clip_arguments_problem(max_norm, rule);
  if (problem != NULL) {
    if (norm != NULL)
      *norm = -1;
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_optimizer_step_clipped: %s; got max_norm %g and rule %d", problem, max_norm,
                (gint)rule);
    return FALSE;
  }
  g_autoptr(GPtrArray) active = active_params(opt);
  double total = sqrt(grads_sum_of_squares(active));
  if (norm != NULL)
    *norm = total;
  return optimizer_update(opt, active, clip_coefficient(total, max_norm, rule), error);
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
qkv_optimizer_clip_grad_norm(QkvOptimizer *opt, double max_norm, QkvClipRule rule)
{
  g_return_val_if_fail(opt != NULL, NAN);
  return qkv_clip_grad_norm(opt->params, optimizer_filter, opt, max_norm, rule);
}

/* Elements per partial sum. The partial sums are added in a fixed order, so
 * the norm is the same for any thread count. */
#define NORM_BLOCK 16384

typedef struct {
  const float *g;
  gint64 n;
  double *out;
} NormJob;

static void
norm_blocks(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const NormJob *j = data;
  for (gint64 b = begin; b < end; b++) {
    const float *x = j->g + b * NORM_BLOCK;
    gint64 len = MIN(NORM_BLOCK, j->n - b * NORM_BLOCK);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (gint64 k = 0; k < len; k++)
      s += (double)x[k] * (double)x[k];
    j->out[b] = s;
  }
}

static double
grads_sum_of_squares(GPtrArray *params)
{
  gint64 n_blocks = 0;
  for (guint i = 0; i < params->len; i++) {
    gint64 n = qkv_tensor_numel(qkv_param_grad(g_ptr_array_index(params, i)));
    n_blocks += (n + NORM_BLOCK - 1) / NORM_BLOCK;
  }
  g_autofree double *partial = g_new0(double, MAX(n_blocks, 1));
  gint64 first_block = 0;
  for (guint i = 0; i < params->len; i++) {
    const QkvTensor *grad = qkv_param_grad(g_ptr_array_index(params, i));
    NormJob job = {qkv_tensor_f32((QkvTensor *)grad), qkv_tensor_numel(grad),
                   partial + first_block};
    gint64 blocks = (job.n + NORM_BLOCK - 1) / NORM_BLOCK;
    qkv_parallel_for(loop_threads(2 * job.n), blocks, norm_blocks, &job);
    first_block += blocks;
  }
  double sum = 0;
  for (gint64 b = 0; b < n_blocks; b++)
    sum += partial[b];
  return sum;
}

static GPtrArray *
filtered_params(QkvParams *params, QkvParamFilter filter, gpointer user_data)
{
  guint n = qkv_params_size(params);
  GPtrArray *a = g_ptr_array_sized_new(n);
  for (guint i = 0; i < n; i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (!qkv_param_get_frozen(p) && (filter == NULL || filter(p, user_data)))
      g_ptr_array_add(a, p);
  }
  return a;
}

double
qkv_clip_grad_norm(QkvParams *params, QkvParamFilter filter, gpointer user_data, double max_norm,
                   QkvClipRule rule)
{
  g_return_val_if_fail(params != NULL, NAN);
  if (clip_arguments_problem(max_norm, rule) != NULL)
    return -1;
  g_autoptr(GPtrArray) selected = filtered_params(params, filter, user_data);
  double norm = sqrt(grads_sum_of_squares(selected));
  const float c = clip_coefficient(norm, max_norm, rule);
  if (c == 1.0f)
    return norm;
  for (guint i = 0; i < selected->len; i++) {
    QkvTensor *grad = qkv_param_grad(g_ptr_array_index(selected, i));
    float *g = qkv_tensor_f32(grad);
    gint64 n = qkv_tensor_numel(grad);
    /* a pass over memory: one thread streams it as fast as two */
#pragma omp simd
    for (gint64 k = 0; k < n; k++)
      g[k] *= c;
  }
  return norm;
}

gboolean
qkv_optimizer_try_set_lr(QkvOptimizer *opt, double lr, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(opt != NULL, FALSE);
  /* a value a user (or a schedule) passes: refused, never a critical */
  if (!(lr >= 0) || !isfinite(lr)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_optimizer_try_set_lr (%s optimizer): lr must be finite and at least 0, got %g",
                qkv_optimizer_kind_name(opt->kind), lr);
    return FALSE;
  }
  opt->config.lr = lr;
  return TRUE;
}

void
qkv_optimizer_set_lr(QkvOptimizer *opt, double lr)
{
  g_return_if_fail(opt != NULL);
  qkv_optimizer_try_set_lr(opt, lr, NULL);
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
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
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
  g_return_if_fail(opt != NULL);
  /* as qkv_schedule_set_position(): a negative count is a new optimizer's */
  opt->step = MAX(step, 0);
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
