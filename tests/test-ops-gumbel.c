/* test-ops-gumbel.c: "gumbel_softmax" and its backward op.
 *
 * Evaluation is the plain argmax (and softmax(x / tau) for the relaxation);
 * training draws one-hot picks that follow softmax(x) (the Gumbel-max
 * trick), differ from step to step and repeat for a (seed, step); masked
 * positions are never picked; the relaxation's gradient passes the finite
 * difference check, and the hard op's straight-through gradient is exactly
 * the relaxation's; bad input is refused. */
#include "test-util.h"

#include <math.h>
#include <string.h>

/* A plan over gumbel_softmax(logits, lens) with outputs 0 y, 1 the
 * relaxation (y again without hard) and, when w_y or w_soft is given, 2 the
 * gradient of Σ y·w_y + Σ soft·w_soft with respect to the logits. Inputs
 * "logits" and "lens" (when lens is given) are bound. */
typedef struct {
  double tau;
  gboolean hard;
  gint axis;
  gboolean training;
  guint64 seed;
  gint n_threads;
  const QkvTensor *w_y, *w_soft;
} GumbelSpec;

typedef struct {
  QkvGraph *graph;
  QkvPlan *plan;
} GumbelRun;

static GumbelRun
gumbel_compile(const GumbelSpec *s, QkvTensor *logits, QkvTensor *lens)
{
  g_autoptr(GError) error = NULL;
  GumbelRun r = {qkv_graph_new(), NULL};
  QkvValue *x = qkv_test_input(r.graph, "logits", QKV_F32, *qkv_tensor_shape(logits));
  QkvValue *vl =
      lens != NULL ? qkv_test_input(r.graph, "lens", QKV_I32, *qkv_tensor_shape(lens)) : NULL;
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_gumbel_softmax(x, vl, s->tau, s->hard, s->axis, &error);
  g_assert_no_error(error);
  QkvValue *soft = s->hard ? qkv_node_output(qkv_value_node(y), 1) : y;
  QkvValue *outs[3] = {y, soft, NULL};
  guint n_outs = 2;
  if (s->w_y != NULL || s->w_soft != NULL) {
    QkvValue *loss = NULL;
    const QkvTensor *ws[] = {s->w_y, s->w_soft};
    QkvValue *vs[] = {y, soft};
    for (gint i = 0; i < 2; i++) {
      if (ws[i] == NULL)
        continue;
      QkvValue *w = qkv_graph_constant(r.graph, ws[i], &error);
      QkvValue *term = qkv_sum(qkv_mul(vs[i], w, &error), NULL, 0, FALSE, &error);
      loss = loss != NULL ? qkv_add(loss, term, &error) : term;
    }
    g_assert_no_error(error);
    g_assert_true(qkv_graph_backward(r.graph, loss, &error));
    outs[n_outs++] = qkv_graph_gradient(r.graph, x);
    g_assert_nonnull(outs[2]);
  }
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = s->training;
  o.seed = s->seed;
  o.n_threads = s->n_threads;
  r.plan = qkv_graph_compile(r.graph, outs, n_outs, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(r.plan, "logits", logits, &error));
  if (lens != NULL)
    g_assert_true(qkv_plan_bind(r.plan, "lens", lens, &error));
  return r;
}

static void
gumbel_run_clear(GumbelRun *r)
{
  qkv_plan_free(r->plan);
  qkv_graph_free(r->graph);
}

/* Run and copy output i. */
static QkvTensor *
run_output(GumbelRun *r, guint i)
{
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_plan_run(r->plan, &error));
  g_assert_no_error(error);
  return qkv_tensor_copy(qkv_plan_output(r->plan, i));
}

/* The position of the single 1 of each row of n (a one-hot along the last
 * axis, rows × n), asserting every other entry is exactly 0; -1 for a row of
 * zeros. */
static gint64
one_hot_index(const QkvTensor *y, gint64 row, gint64 n)
{
  gint64 pick = -1;
  for (gint64 j = 0; j < n; j++) {
    double v = qkv_tensor_get(y, row * n + j);
    if (v == 1.0) {
      g_assert_cmpint(pick, ==, -1);
      pick = j;
    } else {
      g_assert_cmpfloat(v, ==, 0.0);
    }
  }
  return pick;
}

/* The first largest of n values of t from element first, stride apart. */
static gint64
argmax_strided(const QkvTensor *t, gint64 first, gint64 n, gint64 stride)
{
  gint64 best = 0;
  for (gint64 j = 1; j < n; j++)
    if (qkv_tensor_get(t, first + j * stride) > qkv_tensor_get(t, first + best * stride))
      best = j;
  return best;
}

/* ---- evaluation ----------------------------------------------------------- */

/* No noise: the one-hot of the argmax and softmax(x / tau), along the last
 * axis and along a middle one; two runs agree exactly. */
static void
test_eval(void)
{
  QkvShape s = QKV_SHAPE(5, 4, 7);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 1, -2, 2);
  const gint axes[] = {-1, 1};
  const gint64 n_axis[] = {7, 4}, strides[] = {1, 7};
  for (guint a = 0; a < G_N_ELEMENTS(axes); a++) {
    GumbelSpec spec = {.tau = 0.7, .hard = TRUE, .axis = axes[a]};
    GumbelRun r = gumbel_compile(&spec, x, NULL);
    g_autoptr(QkvTensor) y = run_output(&r, 0);
    g_autoptr(QkvTensor) soft = qkv_tensor_copy(qkv_plan_output(r.plan, 1));
    g_autoptr(QkvTensor) again = run_output(&r, 0);
    qkv_assert_tensor_close(again, y, 0);
    const gint64 n = n_axis[a], stride = strides[a];
    const gint64 rows = qkv_tensor_numel(x) / n;
    for (gint64 row = 0; row < rows; row++) {
      gint64 first = (row / stride) * n * stride + row % stride;
      gint64 best = argmax_strided(x, first, n, stride);
      double m = qkv_tensor_get(x, first + best * stride), sum = 0;
      for (gint64 j = 0; j < n; j++)
        sum += exp((qkv_tensor_get(x, first + j * stride) - m) / spec.tau);
      for (gint64 j = 0; j < n; j++) {
        gint64 i = first + j * stride;
        g_assert_cmpfloat(qkv_tensor_get(y, i), ==, j == best ? 1.0 : 0.0);
        double want = exp((qkv_tensor_get(x, i) - m) / spec.tau) / sum;
        /* x / tau, a difference, an exp and a sum of n: a few dozen u at most */
        g_assert_cmpfloat(fabs(qkv_tensor_get(soft, i) - want), <=, 64 * QKV_TEST_U);
      }
    }
    gumbel_run_clear(&r);
  }
}

/* ---- training ------------------------------------------------------------- */

/* One-hot picks at the largest entry of the relaxation of the same draw,
 * which differ from the argmax, from step to step and from seed to seed,
 * and repeat for the same (seed, step) in this plan and another. */
static void
test_training(void)
{
  const gint64 rows = 256, n = 10;
  QkvShape s = QKV_SHAPE(rows, n);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 2, -0.5, 0.5);
  GumbelSpec spec = {.tau = 1.0, .hard = TRUE, .axis = -1, .training = TRUE, .seed = 42};
  GumbelRun r = gumbel_compile(&spec, x, NULL);
  g_autoptr(QkvTensor) y0 = run_output(&r, 0);
  g_autoptr(QkvTensor) soft0 = qkv_tensor_copy(qkv_plan_output(r.plan, 1));
  g_autoptr(QkvTensor) y1 = run_output(&r, 0); /* step 1 */
  gint64 not_argmax = 0, moved = 0;
  for (gint64 row = 0; row < rows; row++) {
    gint64 pick = one_hot_index(y0, row, n);
    g_assert_cmpint(pick, >=, 0);
    double sum = 0;
    for (gint64 j = 0; j < n; j++) {
      sum += qkv_tensor_get(soft0, row * n + j);
      g_assert_cmpfloat(qkv_tensor_get(soft0, row * n + j), <=,
                        qkv_tensor_get(soft0, row * n + pick));
    }
    g_assert_cmpfloat(fabs(sum - 1.0), <=, 16 * QKV_TEST_U);
    not_argmax += pick != argmax_strided(x, row * n, n, 1);
    moved += pick != one_hot_index(y1, row, n);
  }
  g_test_message("picks other than the argmax: %.3f; moved at step 1: %.3f",
                 (double)not_argmax / rows, (double)moved / rows);
  /* near-uniform logits over 10 positions: most picks are not the argmax,
   * and two independent draws mostly differ */
  g_assert_cmpfloat((double)not_argmax / rows, >, 0.5);
  g_assert_cmpfloat((double)moved / rows, >, 0.5);

  qkv_plan_set_step(r.plan, 0);
  g_autoptr(QkvTensor) y0_again = run_output(&r, 0);
  qkv_assert_tensor_close(y0_again, y0, 0);
  GumbelRun other = gumbel_compile(&spec, x, NULL);
  g_autoptr(QkvTensor) y0_other = run_output(&other, 0);
  qkv_assert_tensor_close(y0_other, y0, 0);
  GumbelSpec seed43 = spec;
  seed43.seed = 43;
  GumbelRun third = gumbel_compile(&seed43, x, NULL);
  g_autoptr(QkvTensor) y_seed = run_output(&third, 0);
  gint64 differ = 0;
  for (gint64 row = 0; row < rows; row++)
    differ += one_hot_index(y_seed, row, n) != one_hot_index(y0, row, n);
  g_assert_cmpfloat((double)differ / rows, >, 0.5);

  /* The draws follow the element, not the thread split. */
  GumbelSpec one_thread = spec;
  one_thread.n_threads = 1;
  GumbelRun single = gumbel_compile(&one_thread, x, NULL);
  g_autoptr(QkvTensor) y_single = run_output(&single, 1);
  qkv_assert_tensor_close(y_single, soft0, 0);
  gumbel_run_clear(&r);
  gumbel_run_clear(&other);
  gumbel_run_clear(&third);
  gumbel_run_clear(&single);
}

/* The Gumbel-max trick: position j is picked with probability softmax(x)_j,
 * whatever tau (tau shapes the relaxation, not the pick). */
static void
test_frequencies(void)
{
  const gint64 rows = 20000, n = 5;
  const float logits[] = {1.0f, 0.0f, -1.0f, 0.5f, 2.0f};
  QkvShape s = QKV_SHAPE(rows, n);
  g_autoptr(QkvTensor) x = qkv_tensor_new(QKV_F32, &s);
  for (gint64 i = 0; i < rows * n; i++)
    qkv_tensor_f32(x)[i] = logits[i % n];
  double z = 0;
  for (gint64 j = 0; j < n; j++)
    z += exp(logits[j]);
  QkvTensor *picks[2];
  const double taus[] = {1.0, 0.25};
  for (gint t = 0; t < 2; t++) {
    GumbelSpec spec = {.tau = taus[t], .hard = TRUE, .axis = -1, .training = TRUE, .seed = 7};
    GumbelRun r = gumbel_compile(&spec, x, NULL);
    picks[t] = run_output(&r, 0);
    gumbel_run_clear(&r);
  }
  qkv_assert_tensor_close(picks[1], picks[0], 0);
  gint64 counts[5] = {0};
  for (gint64 row = 0; row < rows; row++)
    counts[one_hot_index(picks[0], row, n)]++;
  for (gint64 j = 0; j < n; j++) {
    double p = exp(logits[j]) / z, f = (double)counts[j] / rows;
    double sigma = sqrt(p * (1 - p) / rows);
    g_test_message("position %" G_GINT64_FORMAT ": softmax %.4f, picked %.4f (%.1f sigma)", j, p, f,
                   (f - p) / sigma);
    g_assert_cmpfloat(fabs(f - p), <, 5 * sigma);
  }
  qkv_tensor_free(picks[0]);
  qkv_tensor_free(picks[1]);
}

/* ---- masking -------------------------------------------------------------- */

#define MB 4
#define MK 3
#define MT 6

/* Logits (MB, MK, MT) whose padding would always win if it were seen. */
static QkvTensor *
padded_logits(const gint32 *lens, gboolean per_query)
{
  QkvShape s = QKV_SHAPE(MB, MK, MT);
  QkvTensor *x = qkv_test_uniform(&s, 3, -0.5, 0.5);
  for (gint b = 0; b < MB; b++)
    for (gint k = 0; k < MK; k++)
      for (gint t = per_query ? lens[b * MK + k] : lens[b]; t < MT; t++)
        qkv_tensor_f32(x)[(b * MK + k) * MT + t] = 30.0f;
  return x;
}

/* Over many steps, no pick beyond the valid length, every valid position
 * picked at some step, the relaxation 0 there, nothing at all in a row of
 * length 0; no gradient reaches a masked logit. */
static void
check_masked(const gint32 *lens_data, gboolean per_query)
{
  QkvShape ls = per_query ? QKV_SHAPE(MB, MK) : QKV_SHAPE(MB);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&ls, lens_data);
  g_autoptr(QkvTensor) x = padded_logits(lens_data, per_query);
  QkvShape s = QKV_SHAPE(MB, MK, MT);
  g_autoptr(QkvTensor) w = qkv_test_uniform(&s, 4, -1, 1);
  GumbelSpec spec = {.tau = 0.5, .hard = TRUE, .axis = -1, .training = TRUE, .seed = 11, .w_y = w};
  GumbelRun r = gumbel_compile(&spec, x, lens);
  gboolean seen[MB * MK][MT] = {{FALSE}};
  for (gint step = 0; step < 200; step++) {
    g_autoptr(GError) error = NULL;
    g_assert_true(qkv_plan_run(r.plan, &error));
    const QkvTensor *y = qkv_plan_output(r.plan, 0), *soft = qkv_plan_output(r.plan, 1);
    const QkvTensor *dx = qkv_plan_output(r.plan, 2);
    for (gint row = 0; row < MB * MK; row++) {
      gint len = per_query ? lens_data[row] : lens_data[row / MK];
      gint64 pick = one_hot_index(y, row, MT);
      if (len == 0)
        g_assert_cmpint(pick, ==, -1);
      else
        g_assert_cmpint(pick, <, len);
      if (pick >= 0)
        seen[row][pick] = TRUE;
      for (gint t = len; t < MT; t++) {
        g_assert_cmpfloat(qkv_tensor_get(soft, row * MT + t), ==, 0.0);
        g_assert_cmpfloat(qkv_tensor_get(dx, row * MT + t), ==, 0.0);
      }
    }
  }
  for (gint row = 0; row < MB * MK; row++) {
    gint len = per_query ? lens_data[row] : lens_data[row / MK];
    for (gint t = 0; t < len; t++)
      g_assert_true(seen[row][t]);
  }
  gumbel_run_clear(&r);

  /* evaluation: the argmax among the valid positions */
  GumbelSpec eval = {.tau = 1.0, .hard = TRUE, .axis = -1};
  GumbelRun e = gumbel_compile(&eval, x, lens);
  g_autoptr(QkvTensor) y = run_output(&e, 0);
  for (gint row = 0; row < MB * MK; row++) {
    gint len = per_query ? lens_data[row] : lens_data[row / MK];
    g_assert_cmpint(one_hot_index(y, row, MT), ==,
                    len > 0 ? argmax_strided(x, (gint64)row * MT, len, 1) : -1);
  }
  gumbel_run_clear(&e);
}

static void
test_mask(void)
{
  const gint32 per_batch[MB] = {6, 2, 1, 0};
  check_masked(per_batch, FALSE);
  const gint32 per_query[MB * MK] = {6, 3, 0, 2, 2, 1, 5, 4, 6, 0, 1, 3};
  check_masked(per_query, TRUE);
}

/* ---- gradients ------------------------------------------------------------ */

typedef struct {
  double tau;
  gint axis;
  gboolean lens;
} GradSpec;

static QkvValue *
build_soft(QkvGraph *g, QkvValue *const *in, gpointer user_data, GError **error)
{
  const GradSpec *s = user_data;
  return qkv_gumbel_softmax(in[0], s->lens ? in[1] : NULL, s->tau, FALSE, s->axis, error);
}

/* The relaxation (hard = false) against finite differences, with the noise
 * of training (fixed by the step) and without it. */
static void
test_grad(void)
{
  QkvShape s = QKV_SHAPE(3, 2, 5), bs = QKV_SHAPE(3);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 5, -1, 1);
  g_autoptr(QkvTensor) lens = qkv_tensor_new_i32(&bs, (const gint32[]){5, 3, 0});
  const GradSpec specs[] = {
      {1.0, -1, FALSE}, {0.5, -1, TRUE}, {2.0, 1, FALSE}, {0.7, 0, FALSE}, {1.5, 2, TRUE},
  };
  for (guint i = 0; i < G_N_ELEMENTS(specs); i++)
    for (gint training = 0; training < 2; training++) {
      QkvCheckOptions o = qkv_check_options_default();
      o.training = training;
      QkvTensor *in[] = {x, lens};
      g_autofree gchar *label =
          g_strdup_printf("gumbel_softmax soft, tau %g, axis %d%s%s", specs[i].tau, specs[i].axis,
                          specs[i].lens ? ", valid_lens" : "", training ? ", training" : "");
      qkv_test_gradcheck_full(label, specs[i].lens ? 2 : 1, in, NULL, build_soft,
                              (gpointer)&specs[i], &o);
    }
}

/* hard: the forward is the one-hot, the relaxation output is the soft op's
 * output for the same draw, and the gradient is exactly the soft op's, which
 * is s · (w − Σ w·s) / tau; a gradient reaching the relaxation output too
 * adds to it. */
static void
test_straight_through(void)
{
  const gint64 rows = 6, n = 8;
  QkvShape s = QKV_SHAPE(rows, n);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 6, -1, 1);
  g_autoptr(QkvTensor) w = qkv_test_uniform(&s, 7, -1, 1);
  g_autoptr(QkvTensor) w2 = qkv_test_uniform(&s, 8, -1, 1);
  g_autoptr(QkvTensor) w_sum = qkv_tensor_new(QKV_F32, &s);
  for (gint64 i = 0; i < rows * n; i++)
    qkv_tensor_f32(w_sum)[i] = qkv_tensor_f32(w)[i] + qkv_tensor_f32(w2)[i];
  const double tau = 0.5;
  GumbelSpec hard = {.tau = tau, .hard = TRUE, .axis = -1, .training = TRUE, .seed = 5, .w_y = w};
  GumbelSpec soft = hard;
  soft.hard = FALSE;
  GumbelRun rh = gumbel_compile(&hard, x, NULL), rs = gumbel_compile(&soft, x, NULL);
  g_autoptr(QkvTensor) y_hard = run_output(&rh, 0);
  g_autoptr(QkvTensor) s_hard = qkv_tensor_copy(qkv_plan_output(rh.plan, 1));
  g_autoptr(QkvTensor) dx_hard = qkv_tensor_copy(qkv_plan_output(rh.plan, 2));
  g_autoptr(QkvTensor) y_soft = run_output(&rs, 0);
  g_autoptr(QkvTensor) dx_soft = qkv_tensor_copy(qkv_plan_output(rs.plan, 2));
  qkv_assert_tensor_close(s_hard, y_soft, 0);
  qkv_assert_tensor_close(dx_hard, dx_soft, 0);
  for (gint64 row = 0; row < rows; row++) {
    g_assert_cmpint(one_hot_index(y_hard, row, n), ==, argmax_strided(y_soft, row * n, n, 1));
    double dot = 0, mag = 0;
    for (gint64 j = 0; j < n; j++) {
      dot += qkv_tensor_get(w, row * n + j) * qkv_tensor_get(y_soft, row * n + j);
      mag += fabs(qkv_tensor_get(w, row * n + j) * qkv_tensor_get(y_soft, row * n + j));
    }
    for (gint64 j = 0; j < n; j++) {
      double sj = qkv_tensor_get(y_soft, row * n + j);
      double want = sj * (qkv_tensor_get(w, row * n + j) - dot) / tau;
      /* a dot product of n terms, a difference and two products */
      double bound = (n + 4) * QKV_TEST_U * sj * (fabs(qkv_tensor_get(w, row * n + j)) + mag) / tau;
      g_assert_cmpfloat(fabs(qkv_tensor_get(dx_hard, row * n + j) - want), <=, bound + 1e-12);
    }
  }
  gumbel_run_clear(&rh);
  gumbel_run_clear(&rs);

  /* both outputs used: the relaxation's gradient is w + w2 */
  GumbelSpec both = hard;
  both.w_soft = w2;
  GumbelSpec sum = soft;
  sum.w_y = w_sum;
  GumbelRun rb = gumbel_compile(&both, x, NULL), rw = gumbel_compile(&sum, x, NULL);
  g_autoptr(QkvTensor) dx_both = run_output(&rb, 2);
  g_autoptr(QkvTensor) dx_sum = run_output(&rw, 2);
  qkv_assert_tensor_close(dx_both, dx_sum, 0);
  gumbel_run_clear(&rb);
  gumbel_run_clear(&rw);
}

/* ---- errors --------------------------------------------------------------- */

static void
test_errors(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(3, 2, 5));
  QkvValue *v = qkv_test_input(g, "v", QKV_F32, QKV_SHAPE(5));
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(3, 5));
  QkvValue *lens = qkv_test_input(g, "lens", QKV_I32, QKV_SHAPE(3));
  QkvValue *lens_bad = qkv_test_input(g, "lens_bad", QKV_I32, QKV_SHAPE(4));
  QkvValue *lens_f = qkv_test_input(g, "lens_f", QKV_F32, QKV_SHAPE(3));
  QkvValue *ds = qkv_test_input(g, "ds", QKV_F32, QKV_SHAPE(3, 5));
  const gchar *op = "gumbel_softmax";
  qkv_assert_op_fails(g, op, QKV_ERROR_DTYPE, qkv_gumbel_softmax(xi, NULL, 1.0, TRUE, -1, &error_));
  const double bad_taus[] = {0.0, -1.0, NAN, INFINITY};
  for (guint i = 0; i < G_N_ELEMENTS(bad_taus); i++)
    qkv_assert_op_fails(g, op, QKV_ERROR_ATTRIBUTE,
                        qkv_gumbel_softmax(x, NULL, bad_taus[i], TRUE, -1, &error_));
  qkv_assert_op_fails(g, op, QKV_ERROR_ATTRIBUTE,
                      qkv_gumbel_softmax(x, NULL, 1.0, TRUE, 3, &error_));
  qkv_assert_op_fails(g, op, QKV_ERROR_ATTRIBUTE,
                      qkv_gumbel_softmax(x, NULL, 1.0, TRUE, -4, &error_));
  /* valid lengths mask the last axis only, of logits (B, …, n_q, n) */
  qkv_assert_op_fails(g, op, QKV_ERROR_SHAPE, qkv_gumbel_softmax(x, lens, 1.0, TRUE, 1, &error_));
  qkv_assert_op_fails(g, op, QKV_ERROR_SHAPE, qkv_gumbel_softmax(v, lens, 1.0, TRUE, -1, &error_));
  qkv_assert_op_fails(g, op, QKV_ERROR_SHAPE,
                      qkv_gumbel_softmax(x, lens_bad, 1.0, TRUE, -1, &error_));
  qkv_assert_op_fails(g, op, QKV_ERROR_DTYPE,
                      qkv_gumbel_softmax(x, lens_f, 1.0, FALSE, -1, &error_));
  /* the backward op: ds and the relaxation agree in shape */
  QkvValue *pair[] = {ds, x};
  qkv_assert_op_fails(g, "gumbel_softmax_backward", QKV_ERROR_SHAPE,
                      qkv_graph_op(g, "gumbel_softmax_backward", pair, 2, NULL, &error_));
  /* without hard there is one output */
  g_autoptr(GError) error = NULL;
  QkvValue *y = qkv_gumbel_softmax(x, lens, 1.0, FALSE, -1, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_node_n_outputs(qkv_value_node(y)), ==, 1);
  y = qkv_gumbel_softmax(x, lens, 1.0, TRUE, -1, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_node_n_outputs(qkv_value_node(y)), ==, 2);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/gumbel/eval", test_eval);
  g_test_add_func("/gumbel/training", test_training);
  g_test_add_func("/gumbel/frequencies", test_frequencies);
  g_test_add_func("/gumbel/mask", test_mask);
  g_test_add_func("/gumbel/grad", test_grad);
  g_test_add_func("/gumbel/straight-through", test_straight_through);
  g_test_add_func("/gumbel/errors", test_errors);
  return g_test_run();
}
