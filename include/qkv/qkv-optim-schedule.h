/* qkv-optim-schedule.h: learning-rate schedules (part of qkv-optim.h):
 * QkvSchedule, constant, step, cosine, the Transformer's warm-up and linear
 * warm-up followed by a decay. */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-optim-optimizer.h"

G_BEGIN_DECLS

/**
 * QkvSchedule:
 *
 * An opaque schedule.
 */
typedef struct _QkvSchedule QkvSchedule;

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

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvSchedule, qkv_schedule_free)

G_END_DECLS
