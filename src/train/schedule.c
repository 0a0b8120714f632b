/* schedule.c: learning-rate schedules. */
#include "core/core-private.h"
#include "qkv/qkv-optim.h"
#include "qkv/qkv-types.h"

#include <math.h>
#include "error-private.h"

struct _QkvSchedule {
  QkvScheduleKind kind;
  double lr;     /* base or peak lr, or the factor of the warm-up rule */
  double gamma;  /* step */
  double min_lr; /* cosine, warm-up-decay */
  gint64 period; /* step_size, t_max or warmup (both warm-up rules) */
  gint64 d_model;
  gint64 total; /* warm-up-decay: total_steps */
  gint64 position;
};

static QkvSchedule *
schedule_new(QkvScheduleKind kind, double lr, gint64 period)
{
  QkvSchedule *s = g_new0(QkvSchedule, 1);
  s->kind = kind;
  s->lr = lr;
  s->period = period;
  return s;
}

/* A rate (or factor) must be finite and at least 0; a count at least 1. */
static gboolean
check_rate(const gchar *fn, const gchar *what, double value, GError **error)
{
  if (value >= 0 && isfinite(value))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s must be finite and at least 0, got %g", fn, what, value);
  return FALSE;
}

static gboolean
check_count(const gchar *fn, const gchar *what, gint64 value, GError **error)
{
  if (value >= 1)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s must be at least 1, got %" G_GINT64_FORMAT, fn, what, value);
  return FALSE;
}

QkvSchedule *
qkv_schedule_try_new_constant(double lr, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (!check_rate("qkv_schedule_try_new_constant", "lr", lr, error))
    return NULL;
  return schedule_new(QKV_SCHEDULE_CONSTANT, lr, 1);
}

QkvSchedule *
qkv_schedule_try_new_step(double lr, gint64 step_size, double gamma, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  const gchar *fn = "qkv_schedule_try_new_step";
  if (!check_rate(fn, "lr", lr, error) || !check_count(fn, "step_size", step_size, error) ||
      !check_rate(fn, "gamma", gamma, error))
    return NULL;
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_STEP, lr, step_size);
  s->gamma = gamma;
  return s;
}

QkvSchedule *
qkv_schedule_try_new_cosine(double lr, gint64 t_max, double min_lr, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  const gchar *fn = "qkv_schedule_try_new_cosine";
  if (!check_rate(fn, "lr", lr, error) || !check_count(fn, "t_max", t_max, error) ||
      !check_rate(fn, "min_lr", min_lr, error))
    return NULL;
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_COSINE, lr, t_max);
  s->min_lr = min_lr;
  return s;
}

QkvSchedule *
qkv_schedule_try_new_warmup(double factor, gint64 d_model, gint64 warmup, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  const gchar *fn = "qkv_schedule_try_new_warmup";
  if (!check_rate(fn, "factor", factor, error) || !check_count(fn, "d_model", d_model, error) ||
      !check_count(fn, "warmup", warmup, error))
    return NULL;
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_WARMUP, factor, warmup);
  s->d_model = d_model;
  return s;
}

static gboolean
check_steps(const gchar *fn, const gchar *what, gint64 value, GError **error)
{
  if (value >= 0)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s must be at least 0, got %" G_GINT64_FORMAT, fn, what, value);
  return FALSE;
}

QkvSchedule *
qkv_schedule_try_new_warmup_decay(QkvDecay decay, gint64 warmup_steps, gint64 total_steps,
                                  double peak_lr, double min_lr, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  const gchar *fn = "qkv_schedule_try_new_warmup_decay";
  QkvScheduleKind kind;
  switch (decay) {
  case QKV_DECAY_COSINE:
    kind = QKV_SCHEDULE_WARMUP_COSINE;
    break;
  case QKV_DECAY_LINEAR:
    kind = QKV_SCHEDULE_WARMUP_LINEAR;
    break;
  case QKV_DECAY_CONSTANT:
    kind = QKV_SCHEDULE_WARMUP_CONSTANT;
    break;
  default:
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: decay must be QKV_DECAY_COSINE, QKV_DECAY_LINEAR or QKV_DECAY_CONSTANT, "
                "got %d",
                fn, (gint)decay);
    return NULL;
  }
  if (!check_steps(fn, "warmup_steps", warmup_steps, error) ||
      !check_count(fn, "total_steps", total_steps, error) ||
      !check_rate(fn, "peak_lr", peak_lr, error) || !check_rate(fn, "min_lr", min_lr, error))
    return NULL;
  if (warmup_steps > total_steps) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: warmup_steps (%" G_GINT64_FORMAT
                ") must be at most total_steps (%" G_GINT64_FORMAT ")",
                fn, warmup_steps, total_steps);
    return NULL;
  }
  if (min_lr > peak_lr) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: min_lr (%g) must be at most peak_lr (%g)", fn, min_lr, peak_lr);
    return NULL;
  }
  QkvSchedule *s = schedule_new(kind, peak_lr, warmup_steps);
  s->min_lr = min_lr;
  s->total = total_steps;
  return s;
}

/* The constructors without an error: NULL, quietly, for a bad value. */

QkvSchedule *
qkv_schedule_new_constant(double lr)
{
  return qkv_schedule_try_new_constant(lr, NULL);
}

QkvSchedule *
qkv_schedule_new_step(double lr, gint64 step_size, double gamma)
{
  return qkv_schedule_try_new_step(lr, step_size, gamma, NULL);
}

QkvSchedule *
qkv_schedule_new_cosine(double lr, gint64 t_max, double min_lr)
{
  return qkv_schedule_try_new_cosine(lr, t_max, min_lr, NULL);
}

QkvSchedule *
qkv_schedule_new_warmup(double factor, gint64 d_model, gint64 warmup)
{
  return qkv_schedule_try_new_warmup(factor, d_model, warmup, NULL);
}

QkvSchedule *
qkv_schedule_new_warmup_decay(QkvDecay decay, gint64 warmup_steps, gint64 total_steps,
                              double peak_lr, double min_lr)
{
  return qkv_schedule_try_new_warmup_decay(decay, warmup_steps, total_steps, peak_lr, min_lr, NULL);
}

void
qkv_schedule_free(QkvSchedule *schedule)
{
  g_free(schedule);
}

/* Hugging Face transformers' warm-up schedules (get_{cosine,linear,constant}_
 * schedule_with_warmup, with min_lr as in get_cosine_with_min_lr_schedule_
 * with_warmup), as LambdaLR runs them: the lr of update t + 1 is computed from
 * t, the number of updates made before it. */
static double
warmup_decay_lr(const QkvSchedule *s, gint64 step)
{
  const gint64 t = step - 1, warmup = s->period;
  if (t < warmup)
    return s->lr * ((double)t / (double)warmup);
  if (s->kind == QKV_SCHEDULE_WARMUP_CONSTANT)
    return s->lr;
  /* HF lets the cosine rise again after total_steps; here the lr stays at
   * min_lr, as CosineAnnealingLR's closed form above does */
  if (t >= s->total)
    return s->min_lr;
  const double span = (double)MAX(s->total - warmup, 1);
  double fraction; /* of peak_lr - min_lr still to go */
  if (s->kind == QKV_SCHEDULE_WARMUP_COSINE)
    fraction = 0.5 * (1.0 + cos(G_PI * ((double)(t - warmup) / span)));
  else
    fraction = (double)(s->total - t) / span;
  return s->min_lr + (s->lr - s->min_lr) * fraction;
}

double
qkv_schedule_lr_at(const QkvSchedule *s, gint64 step)
{
  g_return_val_if_fail(s != NULL, 0);
  if (step < 1)
    step = 1;
  switch (s->kind) {
  case QKV_SCHEDULE_CONSTANT:
    return s->lr;
  case QKV_SCHEDULE_STEP: {
    /* gamma > 1 grows the rate without bound: it stops at the largest
     * double, which an optimizer still takes (inf it would refuse); a rate
     * of 0 stays 0 (0 · inf would be NaN) */
    if (s->lr == 0)
      return 0;
    return fmin(s->lr * pow(s->gamma, (double)((step - 1) / s->period)), G_MAXDOUBLE);
  }
  case QKV_SCHEDULE_COSINE: {
    gint64 t = MIN(step - 1, s->period);
    return s->min_lr +
           (s->lr - s->min_lr) * (1.0 + cos(G_PI * (double)t / (double)s->period)) / 2.0;
  }
  case QKV_SCHEDULE_WARMUP: {
    double n = (double)step;
    return s->lr / sqrt((double)s->d_model) * fmin(1.0 / sqrt(n), n * pow((double)s->period, -1.5));
  }
  case QKV_SCHEDULE_WARMUP_COSINE:
  case QKV_SCHEDULE_WARMUP_LINEAR:
  case QKV_SCHEDULE_WARMUP_CONSTANT:
    return warmup_decay_lr(s, step);
  }
  return 0;
}

double
qkv_schedule_step(QkvSchedule *s, QkvOptimizer *opt)
{
  g_return_val_if_fail(s != NULL, 0);
  /* saturate: a position restored from a checkpoint may be G_MAXINT64, and
   * every rule's lr is settled long before that */
  if (s->position < G_MAXINT64)
    s->position++;
  double lr = qkv_schedule_lr_at(s, s->position);
  if (opt != NULL)
    qkv_optimizer_set_lr(opt, lr);
  return lr;
}

gint64
qkv_schedule_get_position(const QkvSchedule *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return s->position;
}

void
qkv_schedule_set_position(QkvSchedule *s, gint64 position)
{
  g_return_if_fail(s != NULL);
  s->position = MAX(position, 0);
}

QkvScheduleKind
qkv_schedule_get_kind(const QkvSchedule *s)
{
  g_return_val_if_fail(s != NULL, QKV_SCHEDULE_CONSTANT);
  return s->kind;
}

const gchar *
qkv_schedule_kind_name(QkvScheduleKind kind)
{
  switch (kind) {
  case QKV_SCHEDULE_CONSTANT:
    return "constant";
  case QKV_SCHEDULE_STEP:
    return "step";
  case QKV_SCHEDULE_COSINE:
    return "cosine";
  case QKV_SCHEDULE_WARMUP:
    return "warmup";
  case QKV_SCHEDULE_WARMUP_COSINE:
    return "warmup_cosine";
  case QKV_SCHEDULE_WARMUP_LINEAR:
    return "warmup_linear";
  case QKV_SCHEDULE_WARMUP_CONSTANT:
    return "warmup_constant";
  }
  return "?";
}

QkvSchedule *
qkv_schedule_copy(const QkvSchedule *schedule)
{
  g_return_val_if_fail(schedule != NULL, NULL);
  return g_memdup2(schedule, sizeof *schedule);
}
