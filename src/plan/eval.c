/* eval.c: one-shot evaluation of a graph, for looking at values. */
#include "core/core-private.h"

#include <qkv/qkv.h>
#include "error-private.h"

gboolean
qkv_graph_eval(QkvGraph *graph, const gchar *const *input_names, QkvTensor *const *inputs,
               guint n_inputs, QkvValue *const *outputs, QkvTensor **results, guint n_outputs,
               GError **error)
{
  for (guint i = 0; results != NULL && i < n_outputs; i++)
    results[i] = NULL; /* a failure, an earlier one's included, leaves them NULL */
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(graph != NULL, FALSE);
  g_return_val_if_fail(n_outputs == 0 || (outputs != NULL && results != NULL), FALSE);
  g_return_val_if_fail(n_inputs == 0 || (input_names != NULL && inputs != NULL), FALSE);
  /* an earlier failure left a NULL among the outputs: keep its error */
  if (!qkv_values_present("qkv_graph_eval: outputs", outputs, n_outputs, error))
    return FALSE;
  if (n_outputs == 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_graph_eval: no outputs asked for");
    return FALSE;
  }
  for (guint i = 0; i < n_inputs; i++) {
    if (input_names[i] == NULL || inputs[i] == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "qkv_graph_eval: input %u has a NULL %s", i,
                  input_names[i] == NULL ? "name" : "tensor");
      return FALSE;
    }
  }
  QkvPlanOptions options = qkv_plan_options_default();
  options.skip_param_grads = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(graph, outputs, n_outputs, &options, error);
  if (plan == NULL)
    return FALSE;
  for (guint i = 0; i < n_inputs; i++) {
    /* An input the outputs do not depend on is dropped by the compiler; binding
     * it is harmless, but a name the graph does not have at all is a mistake. */
    if (qkv_graph_lookup_input(graph, input_names[i]) == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                  "qkv_graph_eval: the graph has no input '%s'", input_names[i]);
      return FALSE;
    }
    GError *bind_error = NULL;
    if (!qkv_plan_bind(plan, input_names[i], inputs[i], &bind_error)) {
      if (g_error_matches(bind_error, QKV_ERROR, QKV_ERROR_NOT_FOUND)) {
        g_clear_error(&bind_error);
        continue;
      }
      g_propagate_prefixed_error(error, bind_error, "qkv_graph_eval: ");
      return FALSE;
    }
  }
  if (!qkv_plan_run(plan, error)) {
    g_prefix_error(error, "qkv_graph_eval: ");
    return FALSE;
  }
  for (guint i = 0; i < n_outputs; i++)
    results[i] = qkv_tensor_copy(qkv_plan_output(plan, i));
  return TRUE;
}
