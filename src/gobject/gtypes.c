/* gtypes.c: the GObject type glue (qkv-types.h): boxed types over qkv's
 * reference-counted objects, and the entry points bindings need where the C
 * API takes a macro, a struct by value or a caller-allocated array. */
#include "core/core-private.h"
#include "plan/plan-private.h"
#include "train/optim-private.h"
#include "qkv/qkv-types.h"
#include "error-private.h"

#include <string.h>

/* ---- References ---------------------------------------------------------- */

/* TypeName *type_name_ref(TypeName *arg) for the types that count their own
 * references (ref_count, released by their _free). arg is the parameter's
 * name, which g_return_val_if_fail's message quotes. */
#define QKV_DEFINE_REF(TypeName, type_name, arg)                                                   \
  TypeName *type_name##_ref(TypeName *arg)                                                         \
  {                                                                                                \
    g_return_val_if_fail(arg != NULL, NULL);                                                       \
    g_atomic_int_inc(&arg->ref_count);                                                             \
    return arg;                                                                                    \
  }

QKV_DEFINE_REF(QkvGraph, qkv_graph, graph)
QKV_DEFINE_REF(QkvParams, qkv_params, params)
QKV_DEFINE_REF(QkvPlan, qkv_plan, plan)
QKV_DEFINE_REF(QkvOptimizer, qkv_optimizer, opt)
QKV_DEFINE_REF(QkvTensor, qkv_tensor, tensor)

/* A value (or node) belongs to its graph: a reference to it is one on the
 * graph, and the graph keeps what a rollback removes from then on. The
 * graph is built by one thread at a time (qkv-graph.h), so the flag needs
 * no atomics. */
#define QKV_DEFINE_GRAPH_MEMBER_REF(TypeName, type_name, arg)                                      \
  TypeName *type_name##_ref(TypeName *arg)                                                         \
  {                                                                                                \
    g_return_val_if_fail(arg != NULL, NULL);                                                       \
    arg->graph->retire = TRUE;                                                                     \
    qkv_graph_ref(arg->graph);                                                                     \
    return arg;                                                                                    \
  }                                                                                                \
                                                                                                   \
  void type_name##_unref(TypeName *arg)                                                            \
  {                                                                                                \
    if (arg != NULL)                                                                               \
      qkv_graph_free(arg->graph);                                                                  \
  }

QKV_DEFINE_GRAPH_MEMBER_REF(QkvValue, qkv_value, value)
QKV_DEFINE_GRAPH_MEMBER_REF(QkvNode, qkv_node, node)

/* type_name_copy() and type_name_free() of the plain structs bindings get
 * boxed (no pointers inside): a byte copy, and g_free. */
#define QKV_DEFINE_STRUCT_COPY_FREE(TypeName, type_name, arg)                                      \
  TypeName *type_name##_copy(const TypeName *arg)                                                  \
  {                                                                                                \
    g_return_val_if_fail(arg != NULL, NULL);                                                       \
    return g_memdup2(arg, sizeof *arg);                                                            \
  }                                                                                                \
                                                                                                   \
  void type_name##_free(TypeName *arg)                                                             \
  {                                                                                                \
    g_free(arg);                                                                                   \
  }

/* A boxed copy of a tensor: the same tensor when it owns its data (a
 * parameter's value stays live and shared), a deep copy when it borrows
 * (a plan's outputs are views into an arena the next run overwrites). */
static QkvTensor *
tensor_boxed_copy(QkvTensor *tensor)
{
  return tensor->owns_data ? qkv_tensor_ref(tensor) : qkv_tensor_copy(tensor);
}

/* GLib's boxed-type macro casts through a transparent union, which
 * -Wpedantic reports under GCC. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
/* clang-format off */
G_DEFINE_BOXED_TYPE(QkvShape, qkv_shape, qkv_shape_copy, qkv_shape_free)
G_DEFINE_BOXED_TYPE(QkvTensor, qkv_tensor, tensor_boxed_copy, qkv_tensor_free)
G_DEFINE_BOXED_TYPE(QkvParams, qkv_params, qkv_params_ref, qkv_params_free)
G_DEFINE_BOXED_TYPE(QkvGraph, qkv_graph, qkv_graph_ref, qkv_graph_free)
G_DEFINE_BOXED_TYPE(QkvValue, qkv_value, qkv_value_ref, qkv_value_unref)
G_DEFINE_BOXED_TYPE(QkvNode, qkv_node, qkv_node_ref, qkv_node_unref)
G_DEFINE_BOXED_TYPE(QkvPlan, qkv_plan, qkv_plan_ref, qkv_plan_free)
G_DEFINE_BOXED_TYPE(QkvPlanOptions, qkv_plan_options, qkv_plan_options_copy, qkv_plan_options_free)
G_DEFINE_BOXED_TYPE(QkvOptimizer, qkv_optimizer, qkv_optimizer_ref, qkv_optimizer_free)
G_DEFINE_BOXED_TYPE(QkvOptimConfig, qkv_optim_config, qkv_optim_config_copy, qkv_optim_config_free)
G_DEFINE_BOXED_TYPE(QkvSchedule, qkv_schedule, qkv_schedule_copy, qkv_schedule_free)
G_DEFINE_BOXED_TYPE(QkvBuilder, qkv_builder, qkv_builder_copy, qkv_builder_free)
G_DEFINE_BOXED_TYPE(QkvGradAccumulator, qkv_grad_accumulator, qkv_grad_accumulator_ref,
                    qkv_grad_accumulator_free)
/* clang-format on */
#pragma GCC diagnostic pop

/* ---- Shapes -------------------------------------------------------------- */

QkvShape *
qkv_shape_new(const gint64 *dims, gint rank)
{
  /* a rank out of range is a value a user can pass: NULL, as documented */
  if (rank < 0 || rank > QKV_MAX_RANK)
    return NULL;
  g_return_val_if_fail(rank == 0 || dims != NULL, NULL);
  QkvShape *shape = g_new0(QkvShape, 1);
  *shape = rank == 0 ? qkv_shape_scalar() : qkv_shape_from_array(rank, dims);
  return shape;
}

QKV_DEFINE_STRUCT_COPY_FREE(QkvShape, qkv_shape, shape)

const gint64 *
qkv_shape_get_dims(const QkvShape *shape, gint *rank)
{
  g_return_val_if_fail(shape != NULL && rank != NULL, NULL);
  *rank = CLAMP(shape->rank, 0, QKV_MAX_RANK);
  return shape->dims;
}

/* ---- Tensors as bytes ---------------------------------------------------- */

QkvTensor *
qkv_tensor_new_from_bytes(QkvDType dtype, const QkvShape *shape, GBytes *bytes, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (bytes == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_tensor_new_from_bytes: bytes is NULL");
    return NULL;
  }
  g_autoptr(QkvTensor) t = qkv_tensor_try_new(dtype, shape, error);
  if (t == NULL)
    return NULL;
  gsize size = 0;
  gconstpointer data = g_bytes_get_data(bytes, &size);
  if (size != qkv_tensor_nbytes(t)) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_tensor_new_from_bytes: %zu bytes for a %s tensor of shape %s, which takes "
                "%zu",
                size, qkv_dtype_name(dtype), s, qkv_tensor_nbytes(t));
    return NULL;
  }
  if (size > 0)
    memcpy(qkv_tensor_data(t), data, size);
  return g_steal_pointer(&t);
}

GBytes *
qkv_tensor_to_bytes(const QkvTensor *tensor)
{
  g_return_val_if_fail(tensor != NULL, NULL);
  return g_bytes_new(qkv_tensor_const_data(tensor), qkv_tensor_nbytes(tensor));
}

gboolean
qkv_tensor_set_bytes(QkvTensor *tensor, GBytes *bytes, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (tensor == NULL || bytes == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "qkv_tensor_set_bytes: %s is NULL",
                tensor == NULL ? "tensor" : "bytes");
    return FALSE;
  }
  gsize size = 0;
  gconstpointer data = g_bytes_get_data(bytes, &size);
  if (size != qkv_tensor_nbytes(tensor)) {
    g_autofree gchar *s = qkv_shape_to_string(qkv_tensor_shape(tensor));
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_tensor_set_bytes: %zu bytes for a %s tensor of shape %s, which takes %zu",
                size, qkv_dtype_name(qkv_tensor_dtype(tensor)), s, qkv_tensor_nbytes(tensor));
    return FALSE;
  }
  if (size > 0)
    memcpy(qkv_tensor_data(tensor), data, size);
  return TRUE;
}

/* ---- Structs by value ---------------------------------------------------- */

QkvPlanOptions *
qkv_plan_options_new(void)
{
  QkvPlanOptions *options = g_new0(QkvPlanOptions, 1);
  *options = qkv_plan_options_default();
  return options;
}

QKV_DEFINE_STRUCT_COPY_FREE(QkvPlanOptions, qkv_plan_options, options)

QkvOptimConfig *
qkv_optim_config_new(QkvOptimizerKind kind, double lr)
{
  QkvOptimConfig config;
  switch (kind) {
  case QKV_OPTIMIZER_SGD:
    config = qkv_optim_config_sgd(lr);
    break;
  case QKV_OPTIMIZER_ADAM:
    config = qkv_optim_config_adam(lr);
    break;
  case QKV_OPTIMIZER_ADAMW:
    config = qkv_optim_config_adamw(lr);
    break;
  default:
    g_return_val_if_reached(NULL);
  }
  return g_memdup2(&config, sizeof config);
}

QKV_DEFINE_STRUCT_COPY_FREE(QkvOptimConfig, qkv_optim_config, config)

QkvBuilder *
qkv_builder_new(QkvGraph *graph, QkvParams *params, guint64 seed)
{
  g_return_val_if_fail(graph != NULL && params != NULL, NULL);
  QkvBuilder *b = g_new0(QkvBuilder, 1);
  b->graph = qkv_graph_ref(graph);
  b->params = qkv_params_ref(params);
  b->seed = seed;
  return b;
}

QkvBuilder *
qkv_builder_copy(const QkvBuilder *b)
{
  g_return_val_if_fail(b != NULL, NULL);
  QkvBuilder *copy = g_memdup2(b, sizeof *b);
  copy->scopes = NULL; /* the stack belongs to b (qkv-builders.h) */
  if (copy->graph != NULL)
    qkv_graph_ref(copy->graph);
  if (copy->params != NULL)
    qkv_params_ref(copy->params);
  return copy;
}

void
qkv_builder_free(QkvBuilder *b)
{
  if (b == NULL)
    return;
  qkv_builder_clear_scopes(b);
  qkv_graph_free(b->graph);
  qkv_params_free(b->params);
  g_free(b);
}

/* ---- Arrays -------------------------------------------------------------- */

GPtrArray *
qkv_graph_eval_to_array(QkvGraph *graph, const gchar *const *input_names, QkvTensor *const *inputs,
                        guint n_inputs, QkvValue *const *outputs, guint n_outputs, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_autofree QkvTensor **results = g_new0(QkvTensor *, MAX(n_outputs, 1));
  if (!qkv_graph_eval(graph, input_names, inputs, n_inputs, outputs, results, n_outputs, error))
    return NULL;
  GPtrArray *array = g_ptr_array_new_full(n_outputs, (GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < n_outputs; i++)
    g_ptr_array_add(array, results[i]);
  return array;
}
