/* check.c: the finite-difference gradient check shared by every op test,
 * plugin test and model test. */
#include "core/core-private.h"

#include <math.h>
#include "error-private.h"

QkvCheckOptions
qkv_check_options_default(void)
{
  QkvCheckOptions o = {0};
  o.eps = 1e-2;
  o.rel_tol = 2e-2;
  o.abs_floor = 1e-2;
  o.seed = 1234;
  return o;
}

typedef struct {
  QkvGraph *graph;
  QkvValue **inputs;
  QkvValue *output;
} Built;

static gboolean
build_graph(Built *b, guint n_inputs, QkvTensor *const *inputs, const gboolean *wants_grad,
            QkvCheckBuildFunc build, gpointer user_data, GError **error)
{
  b->graph = qkv_graph_new();
  b->inputs = g_new0(QkvValue *, MAX(n_inputs, 1));
  for (guint i = 0; i < n_inputs; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    b->inputs[i] = qkv_graph_input(b->graph, name, inputs[i]->dtype, &inputs[i]->shape, error);
    if (b->inputs[i] == NULL)
      return FALSE;
    if (wants_grad != NULL && wants_grad[i])
      qkv_value_set_requires_grad(b->inputs[i], TRUE);
  }
  b->output = build(b->graph, b->inputs, user_data, error);
  if (b->output == NULL) {
    if (error != NULL && *error == NULL)
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "the build function failed");
    return FALSE;
  }
  return TRUE;
}

static void
built_clear(Built *b)
{
  g_free(b->inputs);
  qkv_graph_free(b->graph);
}

static gboolean
bind_all(QkvPlan *plan, guint n_inputs, QkvTensor *const *tensors, GError **error)
{
  for (guint i = 0; i < n_inputs; i++) {
    g_autofree gchar *name = g_strdup_printf("in%u", i);
    if (!qkv_plan_bind(plan, name, tensors[i], error))
      return FALSE;
  }
  return TRUE;
}

QkvTensor *
qkv_check_evaluate(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                   gpointer user_data, gboolean training, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  Built b = {0};
  QkvTensor *result = NULL;
  if (build_graph(&b, n_inputs, inputs, NULL, build, user_data, error)) {
    QkvPlanOptions opts = qkv_plan_options_default();
    opts.training = training;
    QkvPlan *plan = qkv_graph_compile(b.graph, &b.output, 1, &opts, error);
    if (plan != NULL && bind_all(plan, n_inputs, inputs, error) && qkv_plan_run(plan, error))
      result = qkv_tensor_copy(qkv_plan_output(plan, 0));
    qkv_plan_free(plan);
  }
  built_clear(&b);
  return result;
}

/* loss = Σ out · w with fixed random w, so every output element matters.
 * The ops are called by name ("mul", "sum") through the registry. */
static QkvValue *
add_weighted_loss(Built *b, const QkvCheckOptions *opt, QkvTensor **weights, GError **error)
{
  *weights = qkv_tensor_new(QKV_F32, qkv_value_shape(b->output));
  GRand *rand = g_rand_new_with_seed((guint32)opt->seed);
  float *w = qkv_tensor_f32(*weights);
  for (gint64 i = 0; i < qkv_tensor_numel(*weights); i++)
    w[i] = (float)g_rand_double_range(rand, -1.0, 1.0);
  g_rand_free(rand);
  QkvValue *wv = qkv_graph_constant(b->graph, *weights, error);
  if (wv == NULL)
    return NULL;
  QkvValue *terms[] = {b->output, wv};
  QkvValue *prod = qkv_graph_op(qkv_value_graph(b->output), "mul", terms, 2, NULL, error);
  if (prod == NULL)
    return NULL;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axes", g_variant_new_array(G_VARIANT_TYPE_INT64, NULL, 0));
  g_variant_builder_add(&attrs, "{sv}", "keepdims", g_variant_new_boolean(FALSE));
  return qkv_graph_op(qkv_value_graph(prod), "sum", &prod, 1, g_variant_builder_end(&attrs), error);
}

/* Nudge each element of input i (bound as work) by ±eps and compare the
 * central difference of the loss (plan output 0) with analytic; the worst
 * relative error so far is kept in *worst. */
static gboolean
check_input_numerically(QkvPlan *plan, guint i, const QkvTensor *input, QkvTensor *work,
                        const QkvTensor *analytic, const QkvCheckOptions *opt, double *worst,
                        GError **error)
{
  float *x = qkv_tensor_f32(work);
  for (gint64 e = 0; e < qkv_tensor_numel(work); e++) {
    float orig = x[e];
    x[e] = (float)(orig + opt->eps);
    double xp = x[e];
    qkv_plan_set_step(plan, 0);
    gboolean ok = qkv_plan_run(plan, error);
    double lp = qkv_plan_output_scalar(plan, 0);
    x[e] = (float)(orig - opt->eps);
    double xm = x[e];
    qkv_plan_set_step(plan, 0);
    ok = ok && qkv_plan_run(plan, error);
    double lm = qkv_plan_output_scalar(plan, 0);
    x[e] = orig;
    if (!ok)
      return FALSE;
    double numeric = (lp - lm) / (xp - xm);
    double a = qkv_tensor_get(analytic, e);
    double err = fabs(a - numeric) / fmax(fabs(numeric), opt->abs_floor);
    if (!(err <= *worst))
      *worst = isnan(err) ? INFINITY : err;
    if (!(err <= opt->rel_tol)) {
      g_autofree gchar *sh = qkv_shape_to_string(qkv_tensor_shape(input));
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "gradient check: input %u %s element %" G_GINT64_FORMAT
                  ": autodiff %.7g, finite difference %.7g (rel err %.3g > %.3g)",
                  i, sh, e, a, numeric, err, opt->rel_tol);
      return FALSE;
    }
  }
  return TRUE;
}

gboolean
qkv_check_gradients(guint n_inputs, QkvTensor *const *inputs, const gboolean *check,
                    QkvCheckBuildFunc build, gpointer user_data, const QkvCheckOptions *options,
                    double *max_rel_err, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  QkvCheckOptions opt = options ? *options : qkv_check_options_default();
  gboolean *wants_grad = g_new0(gboolean, MAX(n_inputs, 1));
  for (guint i = 0; i < n_inputs; i++)
    wants_grad[i] = inputs[i]->dtype == QKV_F32 && (check == NULL || check[i]);

  Built b = {0};
  QkvPlan *plan = NULL;
  QkvTensor **work = g_new0(QkvTensor *, MAX(n_inputs, 1));
  QkvTensor *weights = NULL;
  gboolean ok = FALSE;
  double worst = 0;

  if (!build_graph(&b, n_inputs, inputs, wants_grad, build, user_data, error))
    goto out;
  if (qkv_value_dtype(b.output) != QKV_F32) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE, "gradient check: the output is not f32");
    goto out;
  }
  QkvValue *loss = add_weighted_loss(&b, &opt, &weights, error);
  if (loss == NULL || !qkv_graph_backward(b.graph, loss, error))
    goto out;

  GPtrArray *outs = g_ptr_array_new();
  g_ptr_array_add(outs, loss);
  gint *grad_slot = g_new0(gint, MAX(n_inputs, 1));
  for (guint i = 0; i < n_inputs; i++) {
    grad_slot[i] = -1;
    if (!wants_grad[i])
      continue;
    QkvValue *gv = qkv_graph_gradient(b.graph, b.inputs[i]);
    if (gv != NULL) {
      grad_slot[i] = (gint)outs->len;
      g_ptr_array_add(outs, gv);
    }
  }
  QkvPlanOptions popts = qkv_plan_options_default();
  popts.training = opt.training;
  popts.seed = opt.seed;
  plan = qkv_graph_compile(b.graph, (QkvValue *const *)outs->pdata, outs->len, &popts, error);
  g_ptr_array_unref(outs);
  if (plan == NULL) {
    g_free(grad_slot);
    goto out;
  }
  for (guint i = 0; i < n_inputs; i++)
    work[i] = qkv_tensor_copy(inputs[i]);
  if (!bind_all(plan, n_inputs, work, error) || !qkv_plan_run(plan, error)) {
    g_free(grad_slot);
    goto out;
  }
  /* copy every analytic gradient before any input is nudged: later runs
   * overwrite the plan's outputs */
  QkvTensor **analytic = g_new0(QkvTensor *, MAX(n_inputs, 1));
  for (guint i = 0; i < n_inputs; i++) {
    if (!wants_grad[i])
      continue;
    analytic[i] = grad_slot[i] >= 0 ? qkv_tensor_copy(qkv_plan_output(plan, (guint)grad_slot[i]))
                                    : qkv_tensor_new(QKV_F32, qkv_tensor_shape(inputs[i]));
  }
  ok = TRUE;
  for (guint i = 0; ok && i < n_inputs; i++)
    if (wants_grad[i])
      ok = check_input_numerically(plan, i, inputs[i], work[i], analytic[i], &opt, &worst, error);
  for (guint i = 0; i < n_inputs; i++)
    qkv_tensor_free(analytic[i]);
  g_free(analytic);
  g_free(grad_slot);

out:
  if (max_rel_err != NULL)
    *max_rel_err = worst;
  qkv_plan_free(plan);
  for (guint i = 0; i < n_inputs; i++)
    qkv_tensor_free(work[i]);
  g_free(work);
  qkv_tensor_free(weights);
  built_clear(&b);
  g_free(wants_grad);
  return ok;
}
