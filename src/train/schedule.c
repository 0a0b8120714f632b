/* schedule.c: learning-rate schedules. */
#include "core/core-private.h"
#include "qkv/qkv-optim.h"

#include <math.h>

struct _QkvSchedule {
  QkvScheduleKind kind;
  double lr;     /* base lr, or the factor of the warm-up rule */
  double gamma;  /* step */
  double min_lr; /* cosine */
  gint64 period; /* step_size, t_max or warmup */
  gint64 d_model;
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

QkvSchedule *
qkv_schedule_new_constant(double lr)
{
  g_return_val_if_fail(lr >= 0 && isfinite(lr), NULL);
  return schedule_new(QKV_SCHEDULE_CONSTANT, lr, 1);
}

QkvSchedule *
qkv_schedule_new_step(double lr, gint64 step_size, double gamma)
{
  g_return_val_if_fail(lr >= 0 && isfinite(lr), NULL);
  g_return_val_if_fail(step_size > 0 && gamma >= 0 && isfinite(gamma), NULL);
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_STEP, lr, step_size);
  s->gamma = gamma;
  return s;
}

QkvSchedule *
qkv_schedule_new_cosine(double lr, gint64 t_max, double min_lr)
{
  g_return_val_if_fail(lr >= 0 && isfinite(lr), NULL);
  g_return_val_if_fail(t_max > 0 && min_lr >= 0 && isfinite(min_lr), NULL);
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_COSINE, lr, t_max);
  s->min_lr = min_lr;
  return s;
}

QkvSchedule *
qkv_schedule_new_warmup(double factor, gint64 d_model, gint64 warmup)
{
  g_return_val_if_fail(factor >= 0 && isfinite(factor), NULL);
  g_return_val_if_fail(d_model > 0 && warmup > 0, NULL);
  QkvSchedule *s = schedule_new(QKV_SCHEDULE_WARMUP, factor, warmup);
  s->d_model = d_model;
  return s;
}

void
qkv_schedule_free(QkvSchedule *schedule)
{
  g_free(schedule);
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
  case QKV_SCHEDULE_STEP:
    return s->lr * pow(s->gamma, (double)((step - 1) / s->period));
  case QKV_SCHEDULE_COSINE: {
    gint64 t = MIN(step - 1, s->period);
    return s->min_lr +
           (s->lr - s->min_lr) * (1.0 + cos(G_PI * (double)t / (double)s->period)) / 2.0;
  }
  case QKV_SCHEDULE_WARMUP: {
    double n = (double)step;
    return s->lr / sqrt((double)s->d_model) * fmin(1.0 / sqrt(n), n * pow((double)s->period, -1.5));
  }
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
  g_return_if_fail(s != NULL && position >= 0);
  s->position = position;
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
  }
  return "?";
}
