/* qkv-types.h: GObject types for qkv's objects, and the entry points that
 * bindings (Python through GObject Introspection, Qkv-0.1.gir) call where
 * the C API takes a macro, a variadic list, a struct by value or a
 * caller-allocated array.
 *
 * Lifetimes. Graphs, parameter stores, plans, optimizers and tensors that
 * own their data are reference counted: the _free() function of each drops
 * one reference, and a binding holds one for as long as it keeps a handle.
 * A graph holds the stores its parameters come from, an optimizer its store,
 * a plan its graph, so a binding may free them in any order. A value or
 * node handed to a binding holds a reference on its graph; from then on a
 * rollback keeps the values and nodes it removes until the graph is freed
 * (they stay readable, and using them in new nodes is refused as before).
 * C code that frees each object once, in the documented order, sees no
 * change.
 *
 * qkv.h does not include this header (it needs gobject-2.0): include
 * <qkv/qkv-types.h> for the types.
 */
#pragma once

#include "qkv-api.h"
#include <glib-object.h>
#include "qkv-tensor.h"
#include "qkv-params.h"
#include "qkv-graph.h"
#include "qkv-plan.h"
#include "qkv-optim.h"
#include "qkv-builders.h"
#include "qkv-enum-types.h"

G_BEGIN_DECLS

#define QKV_TYPE_SHAPE (qkv_shape_get_type())
#define QKV_TYPE_TENSOR (qkv_tensor_get_type())
#define QKV_TYPE_PARAMS (qkv_params_get_type())
#define QKV_TYPE_GRAPH (qkv_graph_get_type())
#define QKV_TYPE_VALUE (qkv_value_get_type())
#define QKV_TYPE_NODE (qkv_node_get_type())
#define QKV_TYPE_PLAN (qkv_plan_get_type())
#define QKV_TYPE_PLAN_OPTIONS (qkv_plan_options_get_type())
#define QKV_TYPE_OPTIMIZER (qkv_optimizer_get_type())
#define QKV_TYPE_OPTIM_CONFIG (qkv_optim_config_get_type())
#define QKV_TYPE_SCHEDULE (qkv_schedule_get_type())
#define QKV_TYPE_BUILDER (qkv_builder_get_type())
#define QKV_TYPE_GRAD_ACCUMULATOR (qkv_grad_accumulator_get_type())

/**
 * qkv_shape_get_type:
 *
 * The boxed type of #QkvShape (copied by value).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_shape_get_type(void) G_GNUC_CONST;
/**
 * qkv_tensor_get_type:
 *
 * The boxed type of #QkvTensor. Its copy function takes a reference on a
 * tensor that owns its data (a parameter's value stays shared) and makes a
 * deep copy of one that borrows (a plan's output, whose memory the plan
 * reuses at the next run).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_tensor_get_type(void) G_GNUC_CONST;
/**
 * qkv_params_get_type:
 *
 * The boxed type of #QkvParams, reference counted.
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_params_get_type(void) G_GNUC_CONST;
/**
 * qkv_graph_get_type:
 *
 * The boxed type of #QkvGraph, reference counted.
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_graph_get_type(void) G_GNUC_CONST;
/**
 * qkv_value_get_type:
 *
 * The boxed type of #QkvValue: a copy is the same value, holding a
 * reference on its graph (qkv_value_ref()).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_value_get_type(void) G_GNUC_CONST;
/**
 * qkv_node_get_type:
 *
 * The boxed type of #QkvNode: a copy is the same node, holding a reference
 * on its graph (qkv_node_ref()).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_node_get_type(void) G_GNUC_CONST;
/**
 * qkv_plan_get_type:
 *
 * The boxed type of #QkvPlan, reference counted.
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_plan_get_type(void) G_GNUC_CONST;
/**
 * qkv_plan_options_get_type:
 *
 * The boxed type of #QkvPlanOptions (copied by value).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_plan_options_get_type(void) G_GNUC_CONST;
/**
 * qkv_optimizer_get_type:
 *
 * The boxed type of #QkvOptimizer, reference counted.
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_optimizer_get_type(void) G_GNUC_CONST;
/**
 * qkv_optim_config_get_type:
 *
 * The boxed type of #QkvOptimConfig (copied by value).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_optim_config_get_type(void) G_GNUC_CONST;
/**
 * qkv_schedule_get_type:
 *
 * The boxed type of #QkvSchedule (copied by value: a copy keeps its own
 * position).
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_schedule_get_type(void) G_GNUC_CONST;
/**
 * qkv_builder_get_type:
 *
 * The boxed type of a #QkvBuilder made by qkv_builder_new().
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_builder_get_type(void) G_GNUC_CONST;

/**
 * qkv_grad_accumulator_get_type:
 *
 * The boxed type of #QkvGradAccumulator, reference counted.
 *
 * Returns: the #GType
 */
QKV_API
GType qkv_grad_accumulator_get_type(void) G_GNUC_CONST;

/* ---- References ---------------------------------------------------------- */

/**
 * qkv_value_ref:
 * @value: a value
 *
 * Take a reference on @value's graph, which owns the value: the value stays
 * valid until qkv_value_unref() (a rollback of the graph keeps it, see the
 * top of qkv-types.h).
 *
 * Returns: (transfer full): @value
 */
QKV_API
QkvValue *qkv_value_ref(QkvValue *value);
/**
 * qkv_value_unref:
 * @value: (transfer full): a value from qkv_value_ref()
 *
 * Drop the graph reference that qkv_value_ref() took.
 */
QKV_API
void qkv_value_unref(QkvValue *value);
/**
 * qkv_node_ref:
 * @node: a node
 *
 * Take a reference on @node's graph, as qkv_value_ref() does.
 *
 * Returns: (transfer full): @node
 */
QKV_API
QkvNode *qkv_node_ref(QkvNode *node);
/**
 * qkv_node_unref:
 * @node: (transfer full): a node from qkv_node_ref()
 *
 * Drop the graph reference that qkv_node_ref() took.
 */
QKV_API
void qkv_node_unref(QkvNode *node);

/* ---- Shapes -------------------------------------------------------------- */

/**
 * qkv_shape_new:
 * @dims: (array length=rank) (nullable): the dimensions
 * @rank: the number of dimensions, 0 to %QKV_MAX_RANK
 *
 * A shape on the heap, the introspectable form of QKV_SHAPE() and
 * qkv_shape_from_array(). Not checked: qkv_shape_is_valid() tells, and
 * every function taking a shape checks it.
 *
 * Returns: (transfer full) (nullable): a new shape (free with
 *   qkv_shape_free()), or %NULL (without a message) when @rank is outside
 *   0 to %QKV_MAX_RANK
 */
QKV_API
QkvShape *qkv_shape_new(const gint64 *dims, gint rank);
/**
 * qkv_shape_copy:
 * @shape: a shape
 *
 * Copy a shape onto the heap.
 *
 * Returns: (transfer full): a copy of @shape on the heap
 */
QKV_API
QkvShape *qkv_shape_copy(const QkvShape *shape);
/**
 * qkv_shape_free:
 * @shape: (nullable): a shape from qkv_shape_new() or qkv_shape_copy()
 *
 * Free a heap shape.
 */
QKV_API
void qkv_shape_free(QkvShape *shape);
/**
 * qkv_shape_get_dims:
 * @shape: a shape
 * @rank: (out): the number of dimensions
 *
 * The dimensions of @shape, for bindings (C reads shape->dims).
 *
 * Returns: (array length=rank) (transfer none): the dimensions, owned by
 *   @shape
 */
QKV_API
const gint64 *qkv_shape_get_dims(const QkvShape *shape, gint *rank);

/* ---- Tensors as bytes ---------------------------------------------------- */

/**
 * qkv_tensor_new_from_bytes:
 * @dtype: %QKV_F32 or %QKV_I32
 * @shape: the tensor's shape
 * @bytes: the elements, row-major, in the machine's byte order: exactly
 *   numel × qkv_dtype_size() bytes (a NumPy array's tobytes())
 * @error: return location for a #GError, or %NULL
 *
 * A new tensor that owns a copy of @bytes, one memcpy.
 *
 * Returns: (transfer full) (nullable): the tensor, or %NULL with
 *   %QKV_ERROR_DTYPE, %QKV_ERROR_SHAPE, %QKV_ERROR_MEMORY, or
 *   %QKV_ERROR_INVALID_ARGUMENT when the size of @bytes is not the tensor's
 */
QKV_API
QkvTensor *qkv_tensor_new_from_bytes(QkvDType dtype, const QkvShape *shape, GBytes *bytes,
                                     GError **error);
/**
 * qkv_tensor_to_bytes:
 * @tensor: a tensor
 *
 * A copy of the tensor's elements (row-major, the machine's byte order),
 * for numpy.frombuffer().
 *
 * Returns: (transfer full): the qkv_tensor_nbytes() bytes
 */
QKV_API
GBytes *qkv_tensor_to_bytes(const QkvTensor *tensor);

/**
 * qkv_tensor_set_bytes:
 * @tensor: a tensor
 * @bytes: exactly qkv_tensor_nbytes() bytes, row-major, the machine's byte
 *   order
 * @error: return location for a #GError, or %NULL
 *
 * Overwrite the tensor's elements with @bytes, one memcpy: how a binding
 * refills a tensor bound to a plan (the plan keeps reading the same
 * memory).
 *
 * Returns: %TRUE, or %FALSE with %QKV_ERROR_INVALID_ARGUMENT when the size
 *   of @bytes is not the tensor's
 */
QKV_API
gboolean qkv_tensor_set_bytes(QkvTensor *tensor, GBytes *bytes, GError **error);

/* ---- Structs by value ---------------------------------------------------- */

/**
 * qkv_plan_options_new:
 *
 * qkv_plan_options_default() on the heap.
 *
 * Returns: (transfer full): new options (free with qkv_plan_options_free())
 */
QKV_API
QkvPlanOptions *qkv_plan_options_new(void);
/**
 * qkv_plan_options_copy:
 * @options: plan options
 *
 * Copy plan options onto the heap.
 *
 * Returns: (transfer full): a copy of @options on the heap
 */
QKV_API
QkvPlanOptions *qkv_plan_options_copy(const QkvPlanOptions *options);
/**
 * qkv_plan_options_free:
 * @options: (nullable): options from qkv_plan_options_new() or _copy()
 *
 * Free heap plan options.
 */
QKV_API
void qkv_plan_options_free(QkvPlanOptions *options);

/**
 * qkv_optim_config_new:
 * @kind: the optimizer the defaults are for
 * @lr: the learning rate
 *
 * qkv_optim_config_sgd(), _adam() or _adamw() (by @kind) on the heap.
 *
 * Returns: (transfer full) (nullable): a new config (free with
 *   qkv_optim_config_free()), or %NULL for an unknown @kind
 */
QKV_API
QkvOptimConfig *qkv_optim_config_new(QkvOptimizerKind kind, double lr);
/**
 * qkv_optim_config_copy:
 * @config: a config
 *
 * Copy an optimizer config onto the heap.
 *
 * Returns: (transfer full): a copy of @config on the heap
 */
QKV_API
QkvOptimConfig *qkv_optim_config_copy(const QkvOptimConfig *config);
/**
 * qkv_optim_config_free:
 * @config: (nullable): a config from qkv_optim_config_new() or _copy()
 *
 * Free a heap config.
 */
QKV_API
void qkv_optim_config_free(QkvOptimConfig *config);

/**
 * qkv_schedule_copy:
 * @schedule: a schedule
 *
 * A schedule of its own with @schedule's rule and position.
 *
 * Returns: (transfer full): a new schedule with the same rule and position
 */
QKV_API
QkvSchedule *qkv_schedule_copy(const QkvSchedule *schedule);

/**
 * qkv_builder_new:
 * @graph: where the builder adds nodes
 * @params: where it creates and finds parameters
 * @seed: the seed of new parameters' initialisers
 *
 * A builder on the heap, for bindings (C code keeps a #QkvBuilder on the
 * stack). It holds a reference on @graph and @params; set the optional
 * fields (xavier_linear) directly.
 *
 * Returns: (transfer full): a new builder (free with qkv_builder_free())
 */
QKV_API
QkvBuilder *qkv_builder_new(QkvGraph *graph, QkvParams *params, guint64 seed);
/**
 * qkv_builder_copy:
 * @b: a builder from qkv_builder_new()
 *
 * A copy with its own references and no scope pushed (a pushed scope stays
 * with @b).
 *
 * Returns: (transfer full): a new builder
 */
QKV_API
QkvBuilder *qkv_builder_copy(const QkvBuilder *b);
/**
 * qkv_builder_free:
 * @b: (nullable): a builder from qkv_builder_new() or qkv_builder_copy()
 *
 * Pop the scopes left pushed, drop the references and free @b.
 */
QKV_API
void qkv_builder_free(QkvBuilder *b);

/* ---- Arrays -------------------------------------------------------------- */

/**
 * qkv_graph_eval_to_array:
 * @graph: a graph
 * @input_names: (array length=n_inputs): the inputs' names
 * @inputs: (array length=n_inputs): the tensors bound to them
 * @n_inputs: the number of @input_names and @inputs
 * @outputs: (array length=n_outputs): the values to compute
 * @n_outputs: the number of @outputs
 * @error: return location for a #GError, or %NULL
 *
 * qkv_graph_eval() returning its results in a new array, which frees them
 * with itself (g_ptr_array_unref()).
 *
 * Returns: (transfer container) (element-type QkvTensor) (nullable): the results,
 *   one tensor per output, or %NULL with @error set
 */
QKV_API
GPtrArray *qkv_graph_eval_to_array(QkvGraph *graph, const gchar *const *input_names,
                                   QkvTensor *const *inputs, guint n_inputs,
                                   QkvValue *const *outputs, guint n_outputs, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvShape, qkv_shape_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvPlanOptions, qkv_plan_options_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvOptimConfig, qkv_optim_config_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvBuilder, qkv_builder_free)

G_END_DECLS
