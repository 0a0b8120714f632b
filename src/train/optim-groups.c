/* optim-groups.c: parameter groups (PyTorch's param_groups) of an optimizer:
 * which params a group holds, and the learning-rate factor and weight decay
 * they are updated with. */
#include "train/optim-private.h"

#include <math.h>
#include "error-private.h"

gboolean
qkv_param_filter_matrices(QkvParam *param, gpointer user_data)
{
  g_return_val_if_fail(param != NULL, FALSE);
  return qkv_param_shape(param)->rank >= 2;
}

void
qkv_optim_group_free(gpointer data)
{
  OptimGroup *group = data;
  if (group->spec != NULL)
    g_pattern_spec_free(group->spec);
  g_free(group->pattern);
  g_free(group);
}

/* A factor or a decay must be finite and at least 0, as the config's lr and
 * weight_decay. */
static gboolean
check_group_settings(const QkvOptimizer *opt, const gchar *fn, double lr_factor,
                     double weight_decay, GError **error)
{
  const gchar *what = NULL;
  double value = 0;
  if (!(lr_factor >= 0) || !isfinite(lr_factor))
    what = "lr_factor", value = lr_factor;
  else if (!(weight_decay >= 0) || !isfinite(weight_decay))
    what = "weight_decay", value = weight_decay;
  if (what == NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s (%s optimizer): %s must be finite and at least 0, got %g", fn,
              qkv_optimizer_kind_name(opt->kind), what, value);
  return FALSE;
}

guint
qkv_optimizer_add_group(QkvOptimizer *opt, const gchar *pattern, QkvParamFilter filter,
                        gpointer user_data, double lr_factor, double weight_decay, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, 0);
  const gchar *fn = "qkv_optimizer_add_group";
  g_return_val_if_fail(opt != NULL, 0);
  if (pattern == NULL && filter == NULL) {
    /* a group that takes every param is the default group: its settings are
     * the optimizer's own (qkv_optimizer_set_config) */
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: a group needs a name pattern, a filter or both", fn);
    return 0;
  }
  /* checkpoints store the pattern as a string */
  if (pattern != NULL && !g_utf8_validate(pattern, -1, NULL)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: the pattern is not valid UTF-8",
                fn);
    return 0;
  }
  if (!check_group_settings(opt, fn, lr_factor, weight_decay, error))
    return 0;
  OptimGroup *group = g_new0(OptimGroup, 1);
  if (pattern != NULL) {
    group->pattern = g_strdup(pattern);
    group->spec = g_pattern_spec_new(pattern);
  }
  group->filter = filter;
  group->filter_data = user_data;
  group->lr_factor = lr_factor;
  group->weight_decay = weight_decay;
  if (opt->groups == NULL)
    opt->groups = g_ptr_array_new_with_free_func(qkv_optim_group_free);
  g_ptr_array_add(opt->groups, group);
  return opt->groups->len;
}

guint
qkv_optimizer_get_n_groups(const QkvOptimizer *opt)
{
  g_return_val_if_fail(opt != NULL, 0);
  return 1 + (opt->groups != NULL ? opt->groups->len : 0);
}

/* Added group number index (1, 2, ...), or NULL for the default group 0. */
static const OptimGroup *
group_at(const QkvOptimizer *opt, guint index)
{
  return index == 0 ? NULL : g_ptr_array_index(opt->groups, index - 1);
}

static gboolean
group_holds(const OptimGroup *group, QkvParam *param)
{
  if (group->spec != NULL && !g_pattern_spec_match_string(group->spec, qkv_param_name(param)))
    return FALSE;
  return group->filter == NULL || group->filter(param, group->filter_data);
}

guint
qkv_optimizer_group_of(const QkvOptimizer *opt, QkvParam *param)
{
  g_return_val_if_fail(opt != NULL && param != NULL, 0);
  for (guint i = 0; opt->groups != NULL && i < opt->groups->len; i++)
    if (group_holds(g_ptr_array_index(opt->groups, i), param))
      return i + 1;
  return 0;
}

const gchar *
qkv_optimizer_get_group_pattern(const QkvOptimizer *opt, guint group)
{
  g_return_val_if_fail(opt != NULL, NULL);
  /* a group past the end is a value a user can pass: quiet, as documented */
  if (group == 0 || group >= qkv_optimizer_get_n_groups(opt))
    return NULL;
  return group_at(opt, group)->pattern;
}

QkvParamFilter
qkv_optimizer_get_group_filter(const QkvOptimizer *opt, guint group, gpointer *user_data)
{
  if (user_data != NULL)
    *user_data = NULL;
  g_return_val_if_fail(opt != NULL, NULL);
  if (group == 0 || group >= qkv_optimizer_get_n_groups(opt))
    return NULL;
  if (user_data != NULL)
    *user_data = group_at(opt, group)->filter_data;
  return group_at(opt, group)->filter;
}

double
qkv_optimizer_get_group_lr_factor(const QkvOptimizer *opt, guint group)
{
  g_return_val_if_fail(opt != NULL, NAN);
  if (group >= qkv_optimizer_get_n_groups(opt))
    return NAN;
  return group == 0 ? 1.0 : group_at(opt, group)->lr_factor;
}

double
qkv_optimizer_get_group_weight_decay(const QkvOptimizer *opt, guint group)
{
  g_return_val_if_fail(opt != NULL, NAN);
  if (group >= qkv_optimizer_get_n_groups(opt))
    return NAN;
  return group == 0 ? opt->config.weight_decay : group_at(opt, group)->weight_decay;
}

double
qkv_optimizer_get_group_lr(const QkvOptimizer *opt, guint group)
{
  g_return_val_if_fail(opt != NULL, NAN);
  if (group >= qkv_optimizer_get_n_groups(opt))
    return NAN;
  QkvOptimConfig config;
  qkv_optimizer_group_config(opt, group, &config);
  return config.lr;
}

gboolean
qkv_optimizer_set_group_settings(QkvOptimizer *opt, guint group, double lr_factor,
                                 double weight_decay, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  const gchar *fn = "qkv_optimizer_set_group_settings";
  g_return_val_if_fail(opt != NULL, FALSE);
  guint n = qkv_optimizer_get_n_groups(opt);
  if (group == 0 || group >= n) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: group %u is not an added group (the optimizer has groups 1 to %u; "
                "group 0's settings are the optimizer's config)",
                fn, group, n - 1);
    return FALSE;
  }
  if (!check_group_settings(opt, fn, lr_factor, weight_decay, error))
    return FALSE;
  OptimGroup *g = g_ptr_array_index(opt->groups, group - 1);
  g->lr_factor = lr_factor;
  g->weight_decay = weight_decay;
  return TRUE;
}

void
qkv_optimizer_group_config(const QkvOptimizer *opt, guint group, QkvOptimConfig *config)
{
  *config = opt->config;
  if (group == 0)
    return;
  const OptimGroup *g = group_at(opt, group);
  /* factor 1 leaves the lr exactly as the schedule set it; a product past
   * the largest double stops there, as a growing step schedule does */
  config->lr = fmin(opt->config.lr * g->lr_factor, G_MAXDOUBLE);
  config->weight_decay = g->weight_decay;
}
