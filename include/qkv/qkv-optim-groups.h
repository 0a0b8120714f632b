/* qkv-optim-groups.h: an optimizer's parameter groups (part of qkv-optim.h),
 * as PyTorch's param_groups: params updated with their own learning-rate
 * factor and weight decay. */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-optim-optimizer.h"

G_BEGIN_DECLS

/* Parameter groups, as PyTorch's param_groups: params updated with their own
 * learning-rate factor and weight decay, all by one optimizer, in one
 * (clipped) step, under one step count and one checkpoint. The usual case,
 * AdamW decaying the matrices only:
 *
 *   opt = qkv_optimizer_new_adamw(params, &config, &error);   decay for ...
 *   qkv_optimizer_add_group(opt, NULL, qkv_param_filter_matrices, NULL,
 *                           1.0, config.weight_decay, &error); ... matrices
 *   config.weight_decay = 0;                                   none for the
 *   qkv_optimizer_set_config(opt, &config, &error);            rest
 *
 * Groups partition the store: a param is in the first added group that holds
 * it (groups 1, 2, ... in the order they were added), or else in the default
 * group 0, whose settings are the optimizer's own config (lr factor 1 and
 * config.weight_decay). Membership is asked at every step, so params added to
 * the store later find their group too; which params an optimizer updates at
 * all is still its selection (qkv_optimizer_select_*()) minus the frozen ones.
 * A group's params are updated with the config, but with lr = config.lr ·
 * lr_factor (so a schedule's lr, scaled) and the group's weight_decay, which
 * acts as the optimizer kind says: added to the gradient (SGD, Adam) or
 * decoupled, p -= lr·wd·p with the group's lr (AdamW). An optimizer without
 * added groups updates exactly as before groups existed. Checkpoints save the
 * groups' patterns, membership and settings, and loading one requires the
 * same groups (see qkv-checkpoint.h). */

/**
 * qkv_param_filter_matrices:
 * @param: a #QkvParam
 * @user_data: (closure): data for the callback
 *
 * A QkvParamFilter accepting params of rank 2 or more (weight matrices,
 * embedding tables, convolution kernels), not vectors or scalars (biases,
 * norm gains); user_data is unused.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_param_filter_matrices(QkvParam *param, gpointer user_data);
/**
 * qkv_optimizer_add_group:
 * @opt: a #QkvOptimizer
 * @pattern: the pattern
 * @filter: (scope forever) (closure user_data): a #QkvParamFilter
 * @user_data: (closure): data for the callback
 * @lr_factor: the lr factor
 * @weight_decay: the weight decay
 * @error: return location for a #GError, or %NULL
 *
 * Add a group holding the params whose name matches pattern (a GPatternSpec
 * glob: '*' any string, '.' included, '?' any character; NULL: any name) and
 * that filter accepts (called with user_data; NULL: any param); one of the
 * two must be given. lr_factor and weight_decay must be finite and at least
 * 0. Returns the group's number, 1 for the first added, or 0 with
 * QKV_ERROR_INVALID_ARGUMENT (nothing added) for a bad value, no pattern and
 * no filter, or a pattern that is not UTF-8.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_optimizer_add_group(QkvOptimizer *opt, const gchar *pattern, QkvParamFilter filter,
                              gpointer user_data, double lr_factor, double weight_decay,
                              GError **error);
/**
 * qkv_optimizer_get_n_groups:
 * @opt: a #QkvOptimizer
 *
 * The number of groups, the default group 0 included (1 when none was
 * added); valid group numbers are 0 to that minus 1.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_optimizer_get_n_groups(const QkvOptimizer *opt);
/**
 * qkv_optimizer_group_of:
 * @opt: a #QkvOptimizer
 * @param: a #QkvParam
 *
 * The group param is in now (0: the default group).
 *
 * Returns: the guint
 */
QKV_API
guint qkv_optimizer_group_of(const QkvOptimizer *opt, QkvParam *param);
/**
 * qkv_optimizer_get_group_pattern:
 * @opt: a #QkvOptimizer
 * @group: the group
 *
 * A group's pattern as given (NULL if none; always NULL for group 0 and for
 * a group past the end, without a message).
 *
 * Returns: (transfer none) (nullable): the string
 */
QKV_API
const gchar *qkv_optimizer_get_group_pattern(const QkvOptimizer *opt, guint group);
/**
 * qkv_optimizer_get_group_filter: (skip)
 * @opt: a #QkvOptimizer
 * @group: the group
 * @user_data: (nullable): the user data
 *
 * A group's filter (NULL if none; always NULL for group 0 and for a group
 * past the end, without a message), its user_data in *user_data if that is
 * not NULL (NULL with a NULL filter).
 *
 * Returns: the #QkvParamFilter
 */
QKV_API
QkvParamFilter qkv_optimizer_get_group_filter(const QkvOptimizer *opt, guint group,
                                              gpointer *user_data);
/**
 * qkv_optimizer_get_group_lr_factor:
 * @opt: a #QkvOptimizer
 * @group: the group
 *
 * A group's lr factor (1 for group 0; NaN, without a message, for a group
 * past the end).
 *
 * Returns: the double
 */
QKV_API
double qkv_optimizer_get_group_lr_factor(const QkvOptimizer *opt, guint group);
/**
 * qkv_optimizer_get_group_weight_decay:
 * @opt: a #QkvOptimizer
 * @group: the group
 *
 * A group's weight decay (group 0: the config's; NaN, without a message,
 * for a group past the end).
 *
 * Returns: the double
 */
QKV_API
double qkv_optimizer_get_group_weight_decay(const QkvOptimizer *opt, guint group);
/**
 * qkv_optimizer_get_group_lr:
 * @opt: a #QkvOptimizer
 * @group: the group
 *
 * The lr a group's params are updated with now: the config's lr times the
 * group's factor (at most G_MAXDOUBLE; NaN, without a message, for a group
 * past the end).
 *
 * Returns: the double
 */
QKV_API
double qkv_optimizer_get_group_lr(const QkvOptimizer *opt, guint group);
/**
 * qkv_optimizer_set_group_settings:
 * @opt: a #QkvOptimizer
 * @group: the group
 * @lr_factor: the lr factor
 * @weight_decay: the weight decay
 * @error: return location for a #GError, or %NULL
 *
 * Change an added group's lr factor and weight decay (checked as by
 * add_group). QKV_ERROR_INVALID_ARGUMENT, nothing changed, for a bad value or
 * for a group that was not added: 0 (the default group's settings are the
 * config's: qkv_optimizer_set_config()) or one past the last.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_set_group_settings(QkvOptimizer *opt, guint group, double lr_factor,
                                          double weight_decay, GError **error);

G_END_DECLS
