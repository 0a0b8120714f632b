/* test-schedule.c: the warm-up-decay schedules (qkv_schedule_new_warmup_decay)
 * against transformers' lambdas run by torch's LambdaLR
 * (tests/data/schedule_ref.txt), their checks, and their lr reaching an
 * optimizer's parameter groups. */
#include "test-util.h"

#include <float.h>
#include <math.h>
#include <string.h>

static QkvDecay
decay_from_name(const gchar *name)
{
  if (g_str_equal(name, "cosine"))
    return QKV_DECAY_COSINE;
  if (g_str_equal(name, "linear"))
    return QKV_DECAY_LINEAR;
  g_assert_cmpstr(name, ==, "constant");
  return QKV_DECAY_CONSTANT;
}

/* How far qkv's lr may be from the reference, u = 2^-53 being the unit
 * roundoff of double. The warm-up (peak·(t/W)), the constant part and the
 * decaying fraction f (the same operations on the same values: cos(π·p),
 * (T - t)/(T - W)) are computed alike on both sides; what differs is how f
 * meets the floor: qkv forms min + (peak - min)·f, three roundings of
 * non-negative terms, at most 3u·lr; the reference forms peak·(f·(1 - r) + r)
 * with r = min/peak, five roundings, at most 4u·lr (the error of r enters
 * with weight 1 - f). Together 7u·lr, taken as 8u·lr. A libm whose cos is
 * one ulp away from the one that wrote the file moves f by up to u, hence
 * u·(peak - min) more for the cosine, taken as 2u·(peak - min). */
static double
lr_bound(QkvDecay decay, double peak, double min_lr, double want)
{
  const double u = DBL_EPSILON / 2;
  double bound = 8 * u * fabs(want);
  if (decay == QKV_DECAY_COSINE)
    bound += 2 * u * (peak - min_lr);
  return bound;
}

static void
test_matches_reference(void)
{
  g_autofree gchar *path = qkv_test_data_path("schedule_ref.txt");
  g_autofree gchar *text = NULL;
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_get_contents(path, &text, NULL, &error));
  g_assert_no_error(error);
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  g_autoptr(QkvSchedule) s = NULL;
  g_autofree gchar *current = NULL;
  guint compared = 0, cases = 0;
  double worst = 0; /* largest |diff| / bound */
  for (guint i = 0; lines[i] != NULL; i++) {
    if (lines[i][0] == '#' || lines[i][0] == '\0')
      continue;
    g_auto(GStrv) f = g_strsplit(lines[i], " ", -1);
    g_assert_cmpuint(g_strv_length(f), ==, 7);
    QkvDecay decay = decay_from_name(f[0]);
    gint64 warmup = g_ascii_strtoll(f[1], NULL, 10), total = g_ascii_strtoll(f[2], NULL, 10);
    double peak = g_ascii_strtod(f[3], NULL), min_lr = g_ascii_strtod(f[4], NULL);
    gint64 step = g_ascii_strtoll(f[5], NULL, 10);
    double want = g_ascii_strtod(f[6], NULL);
    /* a new case: a new schedule, stepped from position 0 */
    g_autofree gchar *key = g_strjoin(" ", f[0], f[1], f[2], f[3], f[4], NULL);
    if (current == NULL || !g_str_equal(key, current)) {
      g_clear_pointer(&s, qkv_schedule_free);
      s = qkv_schedule_try_new_warmup_decay(decay, warmup, total, peak, min_lr, &error);
      g_assert_no_error(error);
      g_free(current);
      current = g_steal_pointer(&key);
      cases++;
    }
    double got = qkv_schedule_step(s, NULL);
    g_assert_cmpint(qkv_schedule_get_position(s), ==, step);
    g_assert_cmpfloat(got, ==, qkv_schedule_lr_at(s, step));
    double diff = fabs(got - want), bound = lr_bound(decay, peak, min_lr, want);
    if (!(diff <= bound))
      g_error("%s step %" G_GINT64_FORMAT ": lr %.17g, reference %.17g, |diff| %.3g > bound %.3g",
              current, step, got, want, diff, bound);
    if (bound > 0)
      worst = fmax(worst, diff / bound);
    compared++;
  }
  g_assert_cmpuint(cases, ==, 9);
  g_test_message("%u lrs of %u schedules; largest |diff| %.3g of its bound", compared, cases,
                 worst);
}

static void
test_shape(void)
{
  /* the first update of a warm-up has lr 0, as with transformers */
  g_autoptr(QkvSchedule) cosine = qkv_schedule_new_warmup_decay(QKV_DECAY_COSINE, 4, 12, 1.0, 0.1);
  g_assert_cmpint(qkv_schedule_get_kind(cosine), ==, QKV_SCHEDULE_WARMUP_COSINE);
  g_assert_cmpstr(qkv_schedule_kind_name(QKV_SCHEDULE_WARMUP_COSINE), ==, "warmup_cosine");
  g_assert_cmpfloat(qkv_schedule_lr_at(cosine, 0), ==, 0);
  g_assert_cmpfloat(qkv_schedule_lr_at(cosine, 1), ==, 0);
  g_assert_cmpfloat(qkv_schedule_lr_at(cosine, 3), ==, 0.5);
  g_assert_cmpfloat(qkv_schedule_lr_at(cosine, 5), ==, 1.0);
  g_assert_cmpfloat(qkv_schedule_lr_at(cosine, 9), ==, 0.55); /* halfway: (1 + 0.1) / 2 */
  /* at and after total_steps: the floor, for good (transformers' cosine rises again) */
  const gint64 late[] = {13, 14, 20, 1000, G_MAXINT64};
  for (guint i = 0; i < G_N_ELEMENTS(late); i++)
    g_assert_cmpfloat(qkv_schedule_lr_at(cosine, late[i]), ==, 0.1);

  g_autoptr(QkvSchedule) linear = qkv_schedule_new_warmup_decay(QKV_DECAY_LINEAR, 2, 6, 0.5, 0.0);
  g_assert_cmpstr(qkv_schedule_kind_name(qkv_schedule_get_kind(linear)), ==, "warmup_linear");
  const double linear_lrs[] = {0, 0.25, 0.5, 0.375, 0.25, 0.125, 0, 0, 0};
  for (guint i = 0; i < G_N_ELEMENTS(linear_lrs); i++)
    g_assert_cmpfloat(qkv_schedule_lr_at(linear, i + 1), ==, linear_lrs[i]);

  /* constant: total_steps and min_lr checked, not used */
  g_autoptr(QkvSchedule) constant =
      qkv_schedule_new_warmup_decay(QKV_DECAY_CONSTANT, 2, 3, 0.5, 0.25);
  g_assert_cmpstr(qkv_schedule_kind_name(qkv_schedule_get_kind(constant)), ==, "warmup_constant");
  const double constant_lrs[] = {0, 0.25, 0.5, 0.5, 0.5, 0.5};
  for (guint i = 0; i < G_N_ELEMENTS(constant_lrs); i++)
    g_assert_cmpfloat(qkv_schedule_lr_at(constant, i + 1), ==, constant_lrs[i]);
  g_assert_cmpfloat(qkv_schedule_lr_at(constant, G_MAXINT64), ==, 0.5);

  /* no warm-up: the peak first; a warm-up as long as the whole run: the
   * floor right after it */
  g_autoptr(QkvSchedule) none = qkv_schedule_new_warmup_decay(QKV_DECAY_COSINE, 0, 10, 2.0, 0);
  g_assert_cmpfloat(qkv_schedule_lr_at(none, 1), ==, 2.0);
  g_autoptr(QkvSchedule) all = qkv_schedule_new_warmup_decay(QKV_DECAY_LINEAR, 4, 4, 2.0, 0.5);
  g_assert_cmpfloat(qkv_schedule_lr_at(all, 4), ==, 1.5);
  g_assert_cmpfloat(qkv_schedule_lr_at(all, 5), ==, 0.5);
  /* peak 0: 0 throughout */
  g_autoptr(QkvSchedule) zero = qkv_schedule_new_warmup_decay(QKV_DECAY_COSINE, 3, 9, 0, 0);
  for (gint64 step = 1; step < 12; step++)
    g_assert_cmpfloat(qkv_schedule_lr_at(zero, step), ==, 0);
}

static void
test_bad_values(void)
{
  struct {
    QkvDecay decay;
    gint64 warmup, total;
    double peak, min_lr;
    const gchar *named;
  } bad[] = {
      {(QkvDecay)3, 1, 10, 1, 0, "decay"},
      {(QkvDecay)-1, 1, 10, 1, 0, "decay"},
      {QKV_DECAY_COSINE, -1, 10, 1, 0, "warmup_steps"},
      {QKV_DECAY_COSINE, 0, 0, 1, 0, "total_steps"},
      {QKV_DECAY_LINEAR, 0, -5, 1, 0, "total_steps"},
      {QKV_DECAY_LINEAR, 11, 10, 1, 0, "warmup_steps (11) must be at most total_steps (10)"},
      {QKV_DECAY_CONSTANT, 1, 10, -1, 0, "peak_lr"},
      {QKV_DECAY_CONSTANT, 1, 10, NAN, 0, "peak_lr"},
      {QKV_DECAY_COSINE, 1, 10, INFINITY, 0, "peak_lr"},
      {QKV_DECAY_COSINE, 1, 10, 1, -0.1, "min_lr"},
      {QKV_DECAY_COSINE, 1, 10, 1, NAN, "min_lr"},
      {QKV_DECAY_COSINE, 1, 10, 1, INFINITY, "min_lr"},
      {QKV_DECAY_CONSTANT, 1, 10, 1, 2, "min_lr (2) must be at most peak_lr (1)"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_schedule_try_new_warmup_decay(bad[i].decay, bad[i].warmup, bad[i].total,
                                                    bad[i].peak, bad[i].min_lr, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    g_assert_nonnull(strstr(error->message, "qkv_schedule_try_new_warmup_decay"));
    if (strstr(error->message, bad[i].named) == NULL)
      g_error("case %u: '%s' does not name '%s'", i, error->message, bad[i].named);
    g_assert_null(qkv_schedule_new_warmup_decay(bad[i].decay, bad[i].warmup, bad[i].total,
                                                bad[i].peak, bad[i].min_lr));
  }
}

/* qkv_schedule_step() sets the optimizer's lr; each group takes it times its
 * factor. */
static void
test_steps_groups(void)
{
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape ms = QKV_SHAPE(2, 3), vs = QKV_SHAPE(3);
  QkvParam *w = qkv_params_add(params, "fc.weight", &ms, NULL);
  QkvParam *b = qkv_params_add(params, "fc.bias", &vs, NULL);
  QkvOptimConfig c = qkv_optim_config_adamw(1.0);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &c, &error);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "*.bias", NULL, NULL, 0.5, 0, &error), ==, 1);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, b), ==, 1);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, w), ==, 0);
  g_autoptr(QkvSchedule) s =
      qkv_schedule_try_new_warmup_decay(QKV_DECAY_LINEAR, 2, 4, 0.25, 0.0, &error);
  g_assert_no_error(error);
  const double lrs[] = {0, 0.125, 0.25, 0.125, 0};
  for (guint i = 0; i < G_N_ELEMENTS(lrs); i++) {
    g_assert_cmpfloat(qkv_schedule_step(s, opt), ==, lrs[i]);
    g_assert_cmpfloat(qkv_optimizer_get_lr(opt), ==, lrs[i]);
    g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 0), ==, lrs[i]);
    g_assert_cmpfloat(qkv_optimizer_get_group_lr(opt, 1), ==, lrs[i] * 0.5);
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/schedule/warmup-decay/matches-reference", test_matches_reference);
  g_test_add_func("/schedule/warmup-decay/shape", test_shape);
  g_test_add_func("/schedule/warmup-decay/bad-values", test_bad_values);
  g_test_add_func("/schedule/warmup-decay/steps-groups", test_steps_groups);
  return g_test_run();
}
