/* qkv-optim-optimizer.h: optimizers (part of qkv-optim.h, which says how
 * they update and where their state lives): QkvOptimizer for SGD, Adam and
 * AdamW, its configuration and selection of params, steps, the learning rate,
 * and gradient clipping. */
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

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvOptimizer, qkv_optimizer_free)

G_END_DECLS
