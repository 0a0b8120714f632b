/* qkv-optim.h: optimizers, gradient clipping and learning-rate schedules.
 *
 * An optimizer updates parameter values in place from their gradient buffers,
 * outside any graph, so its hyper-parameters (lr, weight decay, ...) may change
 * between steps without recompiling a plan. The update rules are PyTorch's
 * (torch.optim.SGD, Adam, AdamW, non-foreach, maximize=False, amsgrad=False),
 * computed in f32 per element like PyTorch's CPU kernels.
 *
 * Optimizer state lives in the store, as named state tensors of each param
 * (qkv_param_state()): "momentum_buffer" (SGD), "exp_avg", "exp_avg_sq" and a
 * scalar i32 "step" (Adam, AdamW: PyTorch's per-param state['step'], from 0
 * to G_MAXINT32; the optimizer's own count is 64-bit). As in
 * PyTorch, a state that does not exist yet is created on a param's first
 * update, so an optimizer made over a store that already holds state (say,
 * one a checkpoint restored) continues from it. The optimizer itself holds
 * only its hyper-parameters, its selection of params, its parameter groups
 * and a step count.
 *
 * Frozen params (qkv_param_set_frozen()) are skipped by every function here.
 *
 * A training loop:
 *
 *   qkv_schedule_step(schedule, opt);              sets the lr for this update
 *   qkv_plan_run(plan, &error);                    forward + backward
 *   qkv_optimizer_clip_grad_norm(opt, 1.0, QKV_CLIP_TORCH);
 *   qkv_optimizer_step(opt, &error);              (or both at once:
 *                                                  qkv_optimizer_step_clipped)
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-params.h"

G_BEGIN_DECLS

/**
 * QkvOptimizer:
 *
 * An opaque optimizer.
 */
typedef struct _QkvOptimizer QkvOptimizer;
/**
 * QkvSchedule:
 *
 * An opaque schedule.
 */
typedef struct _QkvSchedule QkvSchedule;

/**
 * QkvOptimizerKind:
 * @QKV_OPTIMIZER_SGD: sgd
 * @QKV_OPTIMIZER_ADAM: adam
 * @QKV_OPTIMIZER_ADAMW: adamw
 *
 * The optimizer kind values.
 */
typedef enum {
  QKV_OPTIMIZER_SGD,
  QKV_OPTIMIZER_ADAM,
  QKV_OPTIMIZER_ADAMW,
} QkvOptimizerKind;

/**
 * QkvOptimConfig:
 *
 * Hyper-parameters, PyTorch's names and meanings. Fields an optimizer does
 * not use are ignored. Start from qkv_optim_config_sgd/adam/adamw().
 */
typedef struct {
  double lr;
  /* SGD and Adam: L2 term wd·p added to the gradient; AdamW: decoupled
   * p -= lr·wd·p before the Adam update. */
  double weight_decay;
  /* SGD */
  double momentum;
  double dampening;
  gboolean nesterov; /* needs momentum > 0 and dampening = 0 */
  /* Adam, AdamW */
  double beta1;
  double beta2;
  double eps;
  gpointer reserved[4];
} QkvOptimConfig;

/**
 * qkv_optim_config_sgd: (skip)
 * @lr: the lr
 *
 * PyTorch's defaults: SGD momentum 0, dampening 0, weight decay 0;
 * Adam betas (0.9, 0.999), eps 1e-8, weight decay 0; AdamW the same with
 * weight decay 1e-2.
 *
 * Returns: the #QkvOptimConfig
 */
QKV_API
QkvOptimConfig qkv_optim_config_sgd(double lr);
/**
 * qkv_optim_config_adam: (skip)
 * @lr: the lr
 *
 * See qkv_optim_config_sgd().
 *
 * Returns: the #QkvOptimConfig
 */
QKV_API
QkvOptimConfig qkv_optim_config_adam(double lr);
/**
 * qkv_optim_config_adamw: (skip)
 * @lr: the lr
 *
 * See qkv_optim_config_sgd().
 *
 * Returns: the #QkvOptimConfig
 */
QKV_API
QkvOptimConfig qkv_optim_config_adamw(double lr);

/**
 * QkvParamFilter:
 * @param: the param
 * @user_data: data given with the callback
 *
 * Selects params: TRUE to include param.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvParamFilter)(QkvParam *param, gpointer user_data);

/**
 * qkv_optimizer_new_sgd:
 * @params: a #QkvParams
 * @config: a #QkvOptimConfig
 * @error: return location for a #GError, or %NULL
 *
 * An optimizer over every param in the store (those added later included);
 * narrow it with qkv_optimizer_select_*(). NULL and QKV_ERROR_INVALID_ARGUMENT
 * for an invalid config (negative lr, beta outside [0, 1), ...). The store
 * must outlive the optimizer.
 *
 * Returns: (transfer full) (nullable): a new #QkvOptimizer, or %NULL with @error set
 */
QKV_API
QkvOptimizer *qkv_optimizer_new_sgd(QkvParams *params, const QkvOptimConfig *config,
                                    GError **error);
/**
 * qkv_optimizer_new_adam:
 * @params: a #QkvParams
 * @config: a #QkvOptimConfig
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_optimizer_new_sgd().
 *
 * Returns: (transfer full) (nullable): a new #QkvOptimizer, or %NULL with @error set
 */
QKV_API
QkvOptimizer *qkv_optimizer_new_adam(QkvParams *params, const QkvOptimConfig *config,
                                     GError **error);
/**
 * qkv_optimizer_new_adamw:
 * @params: a #QkvParams
 * @config: a #QkvOptimConfig
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_optimizer_new_sgd().
 *
 * Returns: (transfer full) (nullable): a new #QkvOptimizer, or %NULL with @error set
 */
QKV_API
QkvOptimizer *qkv_optimizer_new_adamw(QkvParams *params, const QkvOptimConfig *config,
                                      GError **error);
/**
 * qkv_optimizer_new:
 * @kind: the kind
 * @params: a #QkvParams
 * @config: a #QkvOptimConfig
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_optimizer_new_sgd().
 *
 * Returns: (transfer full) (nullable): a new #QkvOptimizer, or %NULL with @error set
 */
QKV_API
QkvOptimizer *qkv_optimizer_new(QkvOptimizerKind kind, QkvParams *params,
                                const QkvOptimConfig *config, GError **error);
/**
 * qkv_optimizer_free:
 * @opt: a #QkvOptimizer
 *
 * See qkv_optimizer_new_sgd().
 */
QKV_API
void qkv_optimizer_free(QkvOptimizer *opt);
/**
 * qkv_optimizer_ref:
 * @opt: an optimizer
 *
 * Take a reference on @opt; qkv_optimizer_free() drops one.
 *
 * Returns: (transfer full): @opt
 */
QKV_API
QkvOptimizer *qkv_optimizer_ref(QkvOptimizer *opt);

/**
 * qkv_optimizer_select_names:
 * @opt: a #QkvOptimizer
 * @names: (array zero-terminated=1): the names, %NULL-terminated
 * @error: return location for a #GError, or %NULL
 *
 * Update only these params (a NULL-terminated list of names, fixed now);
 * QKV_ERROR_NOT_FOUND naming the first unknown name, and no change.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_select_names(QkvOptimizer *opt, const gchar *const *names, GError **error);
/**
 * qkv_optimizer_select_filter:
 * @opt: a #QkvOptimizer
 * @filter: (scope forever) (closure user_data): a #QkvParamFilter
 * @user_data: (closure): data for the callback
 *
 * Update only the params filter accepts, asked at every step.
 */
QKV_API
void qkv_optimizer_select_filter(QkvOptimizer *opt, QkvParamFilter filter, gpointer user_data);
/**
 * qkv_optimizer_select_all:
 * @opt: a #QkvOptimizer
 *
 * Back to every param in the store.
 */
QKV_API
void qkv_optimizer_select_all(QkvOptimizer *opt);
/**
 * qkv_optimizer_includes:
 * @opt: a #QkvOptimizer
 * @param: a #QkvParam
 *
 * Whether opt updates param (ignoring frozen).
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_optimizer_includes(QkvOptimizer *opt, QkvParam *param);

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

/**
 * qkv_optimizer_step:
 * @opt: a #QkvOptimizer
 * @error: return location for a #GError, or %NULL
 *
 * One update of every selected, non-frozen param from its gradient buffer;
 * the step count goes up by one. Refused (QKV_ERROR_INVALID_ARGUMENT, nothing
 * updated) when a param's "step" state is negative or already G_MAXINT32 (the
 * i32 state is advanced in 64-bit arithmetic and cannot count further), when
 * the optimizer's own count is G_MAXINT64, and (QKV_ERROR_MEMORY) when missing
 * state cannot be allocated.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_step(QkvOptimizer *opt, GError **error);
/**
 * qkv_optimizer_zero_grad:
 * @opt: a #QkvOptimizer
 *
 * Zero the gradients of the selected params.
 */
QKV_API
void qkv_optimizer_zero_grad(QkvOptimizer *opt);
/**
 * QkvClipRule:
 * @QKV_CLIP_TORCH: torch.nn.utils.clip_grad_norm_: by θ / (‖g‖ + 1e-6) whenever that is < 1
 * @QKV_CLIP_D2L: the book's grad_clipping (d2l): by θ / ‖g‖ when ‖g‖ > θ, no 1e-6
 *
 * How clipping scales gradients whose global L2 norm ‖g‖ is above max_norm θ.
 */
typedef enum {
  /* torch.nn.utils.clip_grad_norm_: by θ / (‖g‖ + 1e-6) whenever that is < 1 */
  QKV_CLIP_TORCH,
  /* the book's grad_clipping (d2l): by θ / ‖g‖ when ‖g‖ > θ, no 1e-6 */
  QKV_CLIP_D2L,
} QkvClipRule;

/**
 * qkv_optimizer_clip_grad_norm:
 * @opt: a #QkvOptimizer
 * @max_norm: the max norm
 * @rule: the rule
 *
 * qkv_clip_grad_norm() over the selected params (-1 for a bad max_norm or
 * rule, nothing scaled).
 *
 * Returns: the double
 */
QKV_API
double qkv_optimizer_clip_grad_norm(QkvOptimizer *opt, double max_norm, QkvClipRule rule);
/**
 * qkv_optimizer_step_clipped:
 * @opt: a #QkvOptimizer
 * @max_norm: the max norm
 * @rule: the rule
 * @norm: (out) (optional): where to store the norm, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * qkv_optimizer_clip_grad_norm() and qkv_optimizer_step() in one pass over
 * the parameter state: the update uses the clipped gradients, with the same
 * result bit for bit, but the gradient buffers are left as they were (not
 * clipped). The total norm before clipping goes to norm (may be NULL).
 * A max_norm or rule that qkv_clip_grad_norm() refuses is refused with
 * QKV_ERROR_INVALID_ARGUMENT: nothing updated, the step count unchanged,
 * *norm set to -1.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_step_clipped(QkvOptimizer *opt, double max_norm, QkvClipRule rule,
                                    double *norm, GError **error);

/**
 * qkv_optimizer_set_lr:
 * @opt: a #QkvOptimizer
 * @lr: the lr
 *
 * Set the learning rate. An lr must be finite and at least 0, as in the
 * config; any other (NaN, ±inf, negative) leaves the lr unchanged, without a
 * message: qkv_optimizer_try_set_lr() says so.
 */
QKV_API
void qkv_optimizer_set_lr(QkvOptimizer *opt, double lr);
/**
 * qkv_optimizer_try_set_lr:
 * @opt: a #QkvOptimizer
 * @lr: the lr
 * @error: return location for a #GError, or %NULL
 *
 * qkv_optimizer_set_lr() that refuses an lr that is not finite or below 0
 * with QKV_ERROR_INVALID_ARGUMENT (the lr unchanged).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_try_set_lr(QkvOptimizer *opt, double lr, GError **error);
/**
 * qkv_optimizer_get_lr:
 * @opt: a #QkvOptimizer
 *
 * See qkv_optimizer_try_set_lr().
 *
 * Returns: the double
 */
QKV_API
double qkv_optimizer_get_lr(const QkvOptimizer *opt);
/**
 * qkv_optimizer_get_config:
 * @opt: a #QkvOptimizer
 *
 * The live hyper-parameters; change them with set_config or set_lr.
 *
 * Returns: (transfer none): a #QkvOptimConfig
 */
QKV_API
const QkvOptimConfig *qkv_optimizer_get_config(const QkvOptimizer *opt);
/**
 * qkv_optimizer_set_config:
 * @opt: a #QkvOptimizer
 * @config: a #QkvOptimConfig
 * @error: return location for a #GError, or %NULL
 *
 * Replace the hyper-parameters (validated as by new).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_optimizer_set_config(QkvOptimizer *opt, const QkvOptimConfig *config, GError **error);
/**
 * qkv_optimizer_get_step:
 * @opt: a #QkvOptimizer
 *
 * Updates made so far (restored by qkv_checkpoint_load()).
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_optimizer_get_step(const QkvOptimizer *opt);
/**
 * qkv_optimizer_set_step:
 * @opt: a #QkvOptimizer
 * @step: the step
 *
 * A negative step counts as 0 (a new optimizer's).
 */
QKV_API
void qkv_optimizer_set_step(QkvOptimizer *opt, gint64 step);
/**
 * qkv_optimizer_get_kind:
 * @opt: a #QkvOptimizer
 *
 * See qkv_optimizer_get_step().
 *
 * Returns: the #QkvOptimizerKind
 */
QKV_API
QkvOptimizerKind qkv_optimizer_get_kind(const QkvOptimizer *opt);
/**
 * qkv_optimizer_get_params:
 * @opt: a #QkvOptimizer
 *
 * See qkv_optimizer_get_step().
 *
 * Returns: (transfer none): a #QkvParams
 */
QKV_API
QkvParams *qkv_optimizer_get_params(const QkvOptimizer *opt);
/**
 * qkv_optimizer_kind_name:
 * @kind: the kind
 *
 * "sgd", "adam", "adamw"; and back (FALSE if unknown).
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_optimizer_kind_name(QkvOptimizerKind kind);
/**
 * qkv_optimizer_kind_from_name:
 * @name: the name
 * @kind: (out) (optional): where to store the kind, or %NULL
 *
 * See qkv_optimizer_kind_name().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_optimizer_kind_from_name(const gchar *name, QkvOptimizerKind *kind);

/**
 * qkv_clip_grad_norm:
 * @params: (nullable): a #QkvParams
 * @filter: (scope call) (closure user_data) (nullable): a #QkvParamFilter
 * @user_data: (closure): data for the callback
 * @max_norm: the max norm
 * @rule: the rule
 *
 * The L2 norm of all the gradients of the non-frozen params filter accepts
 * (filter NULL: all) taken together, as if concatenated; when it is above
 * max_norm, every one of those gradients is scaled down as rule says:
 * QKV_CLIP_TORCH as torch.nn.utils.clip_grad_norm_ (by max_norm / (norm +
 * 1e-6) if that is < 1), QKV_CLIP_D2L as the book's grad_clipping (by
 * max_norm / norm if norm > max_norm). Returns the norm before clipping (inf
 * or nan if a gradient is not finite, and then the gradients are scaled by 0
 * or nan as PyTorch would). max_norm must be at least 0 (+inf clips nothing)
 * and rule one of the two above: for a NaN or negative max_norm or another
 * rule it returns -1, which no norm is, and leaves the gradients as they
 * are.
 *
 * Returns: the double
 */
QKV_API
double qkv_clip_grad_norm(QkvParams *params, QkvParamFilter filter, gpointer user_data,
                          double max_norm, QkvClipRule rule);

/**
 * QkvGradAccumulator:
 *
 * Gradient accumulation (micro-batches).
 *
 * A plan run overwrites the gradient buffers. To take one optimizer step over
 * a batch run in parts, add each part's gradients to an accumulator after
 * its run, then store the sum back into the gradient buffers:
 *
 *   for (part = 0; part < parts; part++) {
 *     qkv_split_range(batch, parts, part, &offset, &rows);
 *     ... bind rows [offset, offset + rows), qkv_plan_run() ...
 *     qkv_grad_accumulator_add(acc);
 *   }
 *   qkv_grad_accumulator_store(acc);  then clip and qkv_optimizer_step()
 *
 * For a loss summed over examples (reduction "sum") the stored gradient is the
 * whole batch's. With the parts split as qkv_dist_shard() splits a batch over
 * ranks, the arithmetic is that of data-parallel training: two parts give bit
 * for bit the gradients that qkv_dist_allreduce_grads() (QKV_DIST_SUM) gives
 * two ranks, since a sum of two floats does not depend on their order.
 */
typedef struct _QkvGradAccumulator QkvGradAccumulator;

/**
 * qkv_grad_accumulator_new:
 * @params: a #QkvParams
 * @error: return location for a #GError, or %NULL
 *
 * An accumulator for the non-frozen params of the store as it is now; its
 * buffers are allocated here (QKV_ERROR_MEMORY naming the bytes if they
 * cannot be had), so adding and storing allocate nothing.
 *
 * Returns: (transfer full) (nullable): a new #QkvGradAccumulator, or %NULL with @error set
 */
QKV_API
QkvGradAccumulator *qkv_grad_accumulator_new(QkvParams *params, GError **error);
/**
 * qkv_grad_accumulator_free:
 * @acc: a #QkvGradAccumulator
 *
 * See qkv_grad_accumulator_new().
 */
QKV_API
void qkv_grad_accumulator_free(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_ref:
 * @acc: an accumulator
 *
 * Take a reference on @acc; qkv_grad_accumulator_free() drops one.
 *
 * Returns: (transfer full): @acc
 */
QKV_API
QkvGradAccumulator *qkv_grad_accumulator_ref(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_add:
 * @acc: a #QkvGradAccumulator
 *
 * Add the current gradient buffers to the sum (the first add after creation
 * or a store copies them).
 */
QKV_API
void qkv_grad_accumulator_add(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_store:
 * @acc: a #QkvGradAccumulator
 *
 * Write the sum into the gradient buffers (zeros if nothing was added) and
 * start a new sum. Returns the number of adds the sum held.
 * After a qkv_params_rollback() that removed a parameter of the store as it
 * was at creation, the accumulator is dead: add does nothing and store
 * writes nothing and returns G_MAXUINT; free it and make a new one.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_grad_accumulator_store(QkvGradAccumulator *acc);

/**
 * qkv_split_range:
 * @n: the n
 * @parts: the parts
 * @index: the index
 * @offset: (out) (optional): where to store the offset, or %NULL
 * @count: (out) (optional): where to store the count, or %NULL
 *
 * Part index of n items split into parts as evenly as possible, the first
 * n % parts parts one larger: its first item in *offset and its size in
 * *count (0 when parts > n leaves it empty). qkv_dist_shard() splits a batch
 * over ranks this way. Returns FALSE, with *offset and *count 0, when n is
 * negative, parts below 1 or index outside [0, parts).
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_split_range(gint64 n, gint parts, gint index, gint64 *offset, gint64 *count);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvGradAccumulator, qkv_grad_accumulator_free)

/**
 * QkvScheduleKind:
 * @QKV_SCHEDULE_CONSTANT: constant
 * @QKV_SCHEDULE_STEP: step
 * @QKV_SCHEDULE_COSINE: cosine
 * @QKV_SCHEDULE_WARMUP: warmup
 * @QKV_SCHEDULE_WARMUP_COSINE: warmup cosine
 * @QKV_SCHEDULE_WARMUP_LINEAR: warmup linear
 * @QKV_SCHEDULE_WARMUP_CONSTANT: warmup constant
 *
 * Learning-rate schedules.
 *
 * qkv_schedule_lr_at(s, step) is the lr for the step-th update, counted from
 * 1. A schedule also keeps a position, the number of updates it has scheduled
 * (0 when new): qkv_schedule_step() advances it and returns, and optionally
 * sets on an optimizer, the lr for the update about to be made. Call it once
 * before every qkv_optimizer_step(). Checkpoints save and restore the
 * position.
 */
typedef enum {
  QKV_SCHEDULE_CONSTANT,
  QKV_SCHEDULE_STEP,
  QKV_SCHEDULE_COSINE,
  QKV_SCHEDULE_WARMUP,
  QKV_SCHEDULE_WARMUP_COSINE,
  QKV_SCHEDULE_WARMUP_LINEAR,
  QKV_SCHEDULE_WARMUP_CONSTANT,
} QkvScheduleKind;

/**
 * QkvDecay:
 * @QKV_DECAY_COSINE: half a cosine from peak_lr down to min_lr
 * @QKV_DECAY_LINEAR: a straight line from peak_lr down to min_lr
 * @QKV_DECAY_CONSTANT: none: peak_lr from then on
 *
 * What follows the linear warm-up of qkv_schedule_new_warmup_decay().
 */
typedef enum {
  /* half a cosine from peak_lr down to min_lr */
  QKV_DECAY_COSINE,
  /* a straight line from peak_lr down to min_lr */
  QKV_DECAY_LINEAR,
  /* none: peak_lr from then on */
  QKV_DECAY_CONSTANT,
} QkvDecay;

/* The constructors: rates (lr, gamma, min_lr, factor, peak_lr) must be
 * finite and at least 0, counts (step_size, t_max, d_model, warmup,
 * total_steps) at least 1, warmup_steps at least 0. The
 * qkv_schedule_try_new_*() forms report a bad value as
 * QKV_ERROR_INVALID_ARGUMENT naming it; the qkv_schedule_new_*() forms
 * return NULL for it without a message. */

/**
 * qkv_schedule_new_constant:
 * @lr: the lr
 *
 * lr at every step.
 *
 * Returns: (transfer full): a new #QkvSchedule
 */
QKV_API
QkvSchedule *qkv_schedule_new_constant(double lr);
/**
 * qkv_schedule_try_new_constant:
 * @lr: the lr
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_schedule_new_constant().
 *
 * Returns: (transfer full) (nullable): a new #QkvSchedule, or %NULL with @error set
 */
QKV_API
QkvSchedule *qkv_schedule_try_new_constant(double lr, GError **error);
/**
 * qkv_schedule_new_step:
 * @lr: the lr
 * @step_size: the step size
 * @gamma: the gamma
 *
 * torch.optim.lr_scheduler.StepLR: lr·gamma^⌊(step-1)/step_size⌋. A gamma
 * above 1 grows the lr until it stops at G_MAXDOUBLE (never inf).
 *
 * Returns: (transfer full): a new #QkvSchedule
 */
QKV_API
QkvSchedule *qkv_schedule_new_step(double lr, gint64 step_size, double gamma);
/**
 * qkv_schedule_try_new_step:
 * @lr: the lr
 * @step_size: the step size
 * @gamma: the gamma
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_schedule_new_step().
 *
 * Returns: (transfer full) (nullable): a new #QkvSchedule, or %NULL with @error set
 */
QKV_API
QkvSchedule *qkv_schedule_try_new_step(double lr, gint64 step_size, double gamma, GError **error);
/**
 * qkv_schedule_new_cosine:
 * @lr: the lr
 * @t_max: the t max
 * @min_lr: the min lr
 *
 * CosineAnnealingLR's closed form with t = step-1, held at min_lr after
 * t_max: min_lr + (lr - min_lr)·(1 + cos(π·t/t_max))/2.
 *
 * Returns: (transfer full): a new #QkvSchedule
 */
QKV_API
QkvSchedule *qkv_schedule_new_cosine(double lr, gint64 t_max, double min_lr);
/**
 * qkv_schedule_try_new_cosine:
 * @lr: the lr
 * @t_max: the t max
 * @min_lr: the min lr
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_schedule_new_cosine().
 *
 * Returns: (transfer full) (nullable): a new #QkvSchedule, or %NULL with @error set
 */
QKV_API
QkvSchedule *qkv_schedule_try_new_cosine(double lr, gint64 t_max, double min_lr, GError **error);
/**
 * qkv_schedule_new_warmup:
 * @factor: the factor
 * @d_model: the d model
 * @warmup: the warmup
 *
 * "Attention is all you need" warm-up:
 * factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), peaking at
 * step = warmup.
 *
 * Returns: (transfer full): a new #QkvSchedule
 */
QKV_API
QkvSchedule *qkv_schedule_new_warmup(double factor, gint64 d_model, gint64 warmup);
/**
 * qkv_schedule_try_new_warmup:
 * @factor: the factor
 * @d_model: the d model
 * @warmup: the warmup
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_schedule_new_warmup().
 *
 * Returns: (transfer full) (nullable): a new #QkvSchedule, or %NULL with @error set
 */
QKV_API
QkvSchedule *qkv_schedule_try_new_warmup(double factor, gint64 d_model, gint64 warmup,
                                         GError **error);
/**
 * qkv_schedule_new_warmup_decay:
 * @decay: the decay
 * @warmup_steps: the warmup steps
 * @total_steps: the total steps
 * @peak_lr: the peak lr
 * @min_lr: the min lr
 *
 * Hugging Face transformers' get_cosine_schedule_with_warmup,
 * get_linear_schedule_with_warmup and get_constant_schedule_with_warmup (as
 * LambdaLR steps them), decaying to a floor min_lr (as transformers'
 * get_cosine_with_min_lr_schedule_with_warmup). With t = step - 1, the
 * number of updates made before this one, W = warmup_steps and T =
 * total_steps:
 *
 *   t < W:       peak_lr · t / W    (so the first update has lr 0 when W > 0,
 *                                    as in transformers)
 *   W <= t < T:  min_lr + (peak_lr - min_lr) · f, with p = (t - W) / (T - W)
 *                (T - W at least 1) and f = (1 + cos(π·p)) / 2 for
 *                QKV_DECAY_COSINE, 1 - p (computed (T - t) / (T - W)) for
 *                QKV_DECAY_LINEAR;
 *   t >= T:      min_lr (transformers' cosine would rise again);
 *
 * and QKV_DECAY_CONSTANT is peak_lr for every t >= W (T and min_lr are only
 * checked). Besides the common rules, warmup_steps must be at most
 * total_steps and min_lr at most peak_lr; decay one of the three. Kinds:
 * QKV_SCHEDULE_WARMUP_COSINE, _LINEAR, _CONSTANT.
 *
 * Returns: (transfer full): a new #QkvSchedule
 */
QKV_API
QkvSchedule *qkv_schedule_new_warmup_decay(QkvDecay decay, gint64 warmup_steps, gint64 total_steps,
                                           double peak_lr, double min_lr);
/**
 * qkv_schedule_try_new_warmup_decay:
 * @decay: the decay
 * @warmup_steps: the warmup steps
 * @total_steps: the total steps
 * @peak_lr: the peak lr
 * @min_lr: the min lr
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_schedule_new_warmup_decay().
 *
 * Returns: (transfer full) (nullable): a new #QkvSchedule, or %NULL with @error set
 */
QKV_API
QkvSchedule *qkv_schedule_try_new_warmup_decay(QkvDecay decay, gint64 warmup_steps,
                                               gint64 total_steps, double peak_lr, double min_lr,
                                               GError **error);
/**
 * qkv_schedule_free:
 * @schedule: a #QkvSchedule
 *
 * See qkv_schedule_new_warmup_decay().
 */
QKV_API
void qkv_schedule_free(QkvSchedule *schedule);

/**
 * qkv_schedule_lr_at:
 * @schedule: a #QkvSchedule
 * @step: the step
 *
 * The lr for update number step (steps below 1 count as 1).
 *
 * Returns: the double
 */
QKV_API
double qkv_schedule_lr_at(const QkvSchedule *schedule, gint64 step);
/**
 * qkv_schedule_step:
 * @schedule: a #QkvSchedule
 * @opt: (nullable): a #QkvOptimizer
 *
 * Advance the position by one (it stays at G_MAXINT64 once there) and return
 * lr_at(position); if opt is not NULL, also qkv_optimizer_set_lr(opt, that lr).
 *
 * Returns: the double
 */
QKV_API
double qkv_schedule_step(QkvSchedule *schedule, QkvOptimizer *opt);
/**
 * qkv_schedule_get_position:
 * @schedule: a #QkvSchedule
 *
 * See qkv_schedule_step().
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_schedule_get_position(const QkvSchedule *schedule);
/**
 * qkv_schedule_set_position:
 * @schedule: a #QkvSchedule
 * @position: the position
 *
 * A negative position counts as 0 (a new schedule's).
 */
QKV_API
void qkv_schedule_set_position(QkvSchedule *schedule, gint64 position);
/**
 * qkv_schedule_get_kind:
 * @schedule: a #QkvSchedule
 *
 * See qkv_schedule_set_position().
 *
 * Returns: the #QkvScheduleKind
 */
QKV_API
QkvScheduleKind qkv_schedule_get_kind(const QkvSchedule *schedule);
/**
 * qkv_schedule_kind_name:
 * @kind: the kind
 *
 * "constant", "step", "cosine", "warmup", "warmup_cosine", "warmup_linear",
 * "warmup_constant".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_schedule_kind_name(QkvScheduleKind kind);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvOptimizer, qkv_optimizer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvSchedule, qkv_schedule_free)

G_END_DECLS
