/* qkv-graph.h: define-then-run graphs and reverse-mode autodiff.
 *
 * A graph holds inputs (named placeholders with fixed shapes), parameters
 * (taken from a QkvParams store), constants and op nodes. Adding a node runs
 * the op's shape rule at once: on bad input it returns NULL with a QKV_ERROR
 * and leaves the graph unchanged.
 *
 * Threads: a graph is built by one thread at a time, with no guard (adding
 * values or nodes, backward, marks and rollbacks, the scope). A graph that no
 * thread changes may be read by several at once: compiling plans from it,
 * qkv_graph_eval(), listing it. Plans compiled from it read its nodes when
 * they bind and run: change the graph only while none of them binds or runs
 * (qkv-plan.h has the plans' own rule).
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-tensor.h"
#include "qkv-params.h"

G_BEGIN_DECLS

/**
 * QkvGraph:
 *
 * An opaque graph.
 */
typedef struct _QkvGraph QkvGraph;
/**
 * QkvNode:
 *
 * An opaque node.
 */
typedef struct _QkvNode QkvNode;
/**
 * QkvValue:
 *
 * One output of a node (or an input, parameter or constant). Owned by its graph.
 */
typedef struct _QkvValue QkvValue;

/**
 * QkvValueKind:
 * @QKV_VALUE_INPUT: input
 * @QKV_VALUE_PARAM: param
 * @QKV_VALUE_CONSTANT: constant
 * @QKV_VALUE_OP: op
 * @QKV_VALUE_STATE: state
 *
 * The value kind values.
 */
typedef enum {
  QKV_VALUE_INPUT,
  QKV_VALUE_PARAM,
  QKV_VALUE_CONSTANT,
  QKV_VALUE_OP,
  QKV_VALUE_STATE,
} QkvValueKind;

/**
 * qkv_values_present:
 * @what: the what
 * @values: (array length=n) (nullable): the values, @n of them
 * @n: the number of @values
 * @error: return location for a #GError, or %NULL
 *
 * Errors chain. Every function of qkv that takes a GError ** and finds an
 * error already there returns at once with its failure value (NULL, FALSE,
 * 0), does nothing and logs nothing, and keeps that error: out-values
 * (weights, indices, ...) are set to NULL as on any failure. Every typed op,
 * builder, qkv_graph_backward() and qkv_graph_compile() given a NULL value
 * (because an earlier call failed) returns NULL (or FALSE) without a warning
 * too. The first error is the one the caller sees, so straight-line model
 * code needs one check at the end:
 *
 *   QkvValue *h = qkv_matmul(x, w, FALSE, TRUE, &error);
 *   QkvValue *y = qkv_relu(h, &error);                 (NULL if the matmul failed)
 *   QkvValue *loss = qkv_mse(y, t, QKV_REDUCTION_MEAN, &error);
 *   if (loss == NULL) … error holds the matmul's message …
 *
 * When error is still empty, the NULL value itself is reported (a NULL passed
 * by mistake, not by an earlier failure).
 *
 * qkv_values_present() is that check, for your own functions: TRUE when all n
 * values are non-NULL and error holds nothing; FALSE when error already holds
 * an error (kept as it is); otherwise FALSE, setting
 * QKV_ERROR_INVALID_ARGUMENT ("what: value i is NULL").
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_values_present(const gchar *what, QkvValue *const *values, guint n, GError **error);
/**
 * QKV_RETURN_IF_MISSING:
 * @what: the what
 * @error: the error
 * @...: the values
 *
 * Return NULL from the calling function unless every value given is non-NULL.
 */
#define QKV_RETURN_IF_MISSING(what, error, ...)                                                    \
  G_STMT_START                                                                                     \
  {                                                                                                \
    QkvValue *const qkv_present_[] = {__VA_ARGS__};                                                \
    if (!qkv_values_present((what), qkv_present_, G_N_ELEMENTS(qkv_present_), (error)))            \
      return NULL;                                                                                 \
  }                                                                                                \
  G_STMT_END

/**
 * qkv_graph_new:
 *
 * Graph new.
 *
 * Returns: (transfer full): a new #QkvGraph
 */
QKV_API
QkvGraph *qkv_graph_new(void);
/**
 * qkv_graph_free:
 * @graph: a #QkvGraph
 *
 * See qkv_graph_new().
 */
QKV_API
void qkv_graph_free(QkvGraph *graph);
/**
 * qkv_graph_ref:
 * @graph: a graph
 *
 * Take a reference on @graph; qkv_graph_free() drops one, and the last
 * frees it.
 *
 * Returns: (transfer full): @graph
 */
QKV_API
QkvGraph *qkv_graph_ref(QkvGraph *graph);

/**
 * qkv_graph_input:
 * @graph: a #QkvGraph
 * @name: the name
 * @dtype: the dtype
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * A named placeholder; its tensor is bound when a plan runs.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_graph_input(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                          GError **error);
/**
 * qkv_graph_state:
 * @graph: a #QkvGraph
 * @name: the name
 * @dtype: the dtype
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * State: a value whose buffer belongs to each plan compiled from the graph
 * (outside the arena's reuse, zero at compile) and keeps its contents from
 * one run to the next, until qkv_plan_reset_state() or qkv_plan_free().
 * Lifetimes side by side: an input lives while its bound tensor does and is
 * read-only; a parameter lives in its store; a state lives in the plan.
 * Only in-place ops write a state (kv_cache_append, as its input 0); the
 * plan runs such a writer after every reader of the state that does not
 * depend on the writer's outputs, so within one run a reader sees the
 * contents left by the previous run unless it reads the writer's output.
 * The writer's output 0 is the state's own buffer after the write (no copy),
 * so a plan output that is one is a view of the state.
 * One writer per state per graph. Names are unique among a graph's states.
 * F32 or I32; NULL with QKV_ERROR_EXISTS, _DTYPE or _SHAPE.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_graph_state(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                          GError **error);
/**
 * qkv_graph_param:
 * @graph: a #QkvGraph
 * @params: a #QkvParams
 * @name: the name
 * @error: return location for a #GError, or %NULL
 *
 * The parameter of that name in params. The store must outlive the graph and
 * every plan compiled from it. Adding the same name twice returns the same value.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_graph_param(QkvGraph *graph, QkvParams *params, const gchar *name, GError **error);
/**
 * qkv_graph_constant:
 * @graph: a #QkvGraph
 * @tensor: a #QkvTensor
 * @error: return location for a #GError, or %NULL
 *
 * A constant holding a copy of tensor.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_graph_constant(QkvGraph *graph, const QkvTensor *tensor, GError **error);
/**
 * qkv_graph_scalar:
 * @graph: a #QkvGraph
 * @value: the value
 *
 * An f32 scalar constant.
 *
 * Returns: (transfer none): a #QkvValue
 */
QKV_API
QkvValue *qkv_graph_scalar(QkvGraph *graph, float value);

/**
 * qkv_graph_add_node:
 * @graph: a #QkvGraph
 * @op_name: the op name
 * @inputs: (array length=n_inputs): the inputs, @n_inputs of them
 * @n_inputs: the number of @inputs
 * @attrs: (nullable): the attrs
 * @error: return location for a #GError, or %NULL
 *
 * The generic path: add a node running the registered op op_name on inputs.
 * attrs is a GVariant of type a{sv} (or NULL); a floating reference is sunk.
 * Returns the node, or NULL with a QKV_ERROR and the graph unchanged.
 *
 * Returns: (transfer none) (nullable): a #QkvNode, or %NULL with @error set
 */
QKV_API
QkvNode *qkv_graph_add_node(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs,
                            guint n_inputs, GVariant *attrs, GError **error);
/**
 * qkv_graph_op:
 * @graph: a #QkvGraph
 * @op_name: the op name
 * @inputs: (array length=n_inputs): the inputs, @n_inputs of them
 * @n_inputs: the number of @inputs
 * @attrs: (nullable): the attrs
 * @error: return location for a #GError, or %NULL
 *
 * Same as qkv_graph_add_node() and returns output 0.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_graph_op(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs,
                       guint n_inputs, GVariant *attrs, GError **error);

/**
 * qkv_node_n_outputs:
 * @node: a #QkvNode
 *
 * See qkv_graph_op().
 *
 * Returns: the guint
 */
QKV_API
guint qkv_node_n_outputs(const QkvNode *node);
/**
 * qkv_node_output:
 * @node: a #QkvNode
 * @index: the index
 *
 * See qkv_graph_op(). NULL, without a message, for an index past the
 * node's outputs.
 *
 * Returns: (transfer none) (nullable): a #QkvValue
 */
QKV_API
QkvValue *qkv_node_output(QkvNode *node, guint index);
/**
 * qkv_node_name:
 * @node: a #QkvNode
 *
 * See qkv_graph_op().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_node_name(const QkvNode *node);
/**
 * qkv_node_op_name:
 * @node: a #QkvNode
 *
 * See qkv_graph_op().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_node_op_name(const QkvNode *node);

/**
 * qkv_value_graph:
 * @value: a #QkvValue
 *
 * See qkv_graph_op().
 *
 * Returns: (transfer none): a #QkvGraph
 */
QKV_API
QkvGraph *qkv_value_graph(const QkvValue *value);
/**
 * qkv_value_shape:
 * @value: a #QkvValue
 *
 * See qkv_graph_op().
 *
 * Returns: (transfer none): a #QkvShape
 */
QKV_API
const QkvShape *qkv_value_shape(const QkvValue *value);
/**
 * qkv_value_dtype:
 * @value: a #QkvValue
 *
 * See qkv_graph_op().
 *
 * Returns: the #QkvDType
 */
QKV_API
QkvDType qkv_value_dtype(const QkvValue *value);
/**
 * qkv_value_kind:
 * @value: a #QkvValue
 *
 * See qkv_graph_op().
 *
 * Returns: the #QkvValueKind
 */
QKV_API
QkvValueKind qkv_value_kind(const QkvValue *value);
/**
 * qkv_value_node:
 * @value: a #QkvValue
 *
 * The producing node for QKV_VALUE_OP values, else NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvNode
 */
QKV_API
QkvNode *qkv_value_node(const QkvValue *value);
/**
 * qkv_value_name:
 * @value: a #QkvValue
 *
 * A readable name: the input or parameter name, or "node:output".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_value_name(const QkvValue *value);
/**
 * qkv_value_set_requires_grad:
 * @value: a #QkvValue
 * @requires_grad: the requires grad
 *
 * Mark a graph input as needing a gradient from qkv_graph_backward().
 */
QKV_API
void qkv_value_set_requires_grad(QkvValue *value, gboolean requires_grad);

/**
 * qkv_graph_lookup_input:
 * @graph: a #QkvGraph
 * @name: (nullable): the name
 *
 * Look up an input by name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvValue
 */
QKV_API
QkvValue *qkv_graph_lookup_input(QkvGraph *graph, const gchar *name);
/**
 * qkv_graph_n_nodes:
 * @graph: a #QkvGraph
 *
 * See qkv_graph_lookup_input().
 *
 * Returns: the guint
 */
QKV_API
guint qkv_graph_n_nodes(const QkvGraph *graph);
/**
 * qkv_graph_n_values:
 * @graph: a #QkvGraph
 *
 * See qkv_graph_lookup_input().
 *
 * Returns: the guint
 */
QKV_API
guint qkv_graph_n_values(const QkvGraph *graph);

/**
 * qkv_graph_set_scope:
 * @graph: a #QkvGraph
 * @scope: (nullable): the scope
 *
 * Prefix for the names of nodes added from now on ("encoder.blks.block0");
 * NULL or "" clears it.
 */
QKV_API
void qkv_graph_set_scope(QkvGraph *graph, const gchar *scope);
/**
 * qkv_graph_get_scope:
 * @graph: a #QkvGraph
 *
 * The current prefix, or NULL; owned by the graph until the next change.
 *
 * Returns: (transfer none) (nullable): the string
 */
QKV_API
const gchar *qkv_graph_get_scope(const QkvGraph *graph);

/**
 * QkvGraphMark:
 *
 * A point to roll a graph back to, for all-or-nothing construction: take a
 * mark, add inputs, constants, parameters and nodes, and on failure roll
 * back to the mark. Plain data; nothing to free. generation is the graph's
 * count of truncations when the mark was taken, which lets a rollback tell
 * a stale mark (this field took one of the two reserved pointers: the
 * struct's size is unchanged on 64-bit systems).
 */
typedef struct {
  guint n_values;
  guint n_nodes;
  gboolean had_backward;
  guint64 generation;
  gpointer reserved[1];
} QkvGraphMark;

/**
 * qkv_graph_mark:
 * @graph: a #QkvGraph
 * @mark: a #QkvGraphMark
 *
 * Record in *mark what the graph holds now.
 */
QKV_API
void qkv_graph_mark(QkvGraph *graph, QkvGraphMark *mark);
/**
 * qkv_graph_rollback:
 * @graph: a #QkvGraph
 * @mark: a #QkvGraphMark
 *
 * Remove every value and node added since mark was taken (they are freed:
 * pointers to them become invalid), including the gradient nodes of a
 * qkv_graph_backward() run since. The scope is not changed. Marks nest:
 * rolling back to an inner mark, then to an outer one, is fine, and so is
 * rolling back to the same mark twice. Plans compiled from the graph since
 * the mark must be freed first.
 *
 * A mark is stale once a rollback (or a failed qkv_graph_backward(), which
 * rolls itself back) removed something the mark counted: a mark taken
 * inside a branch that was then rolled back, even when the graph has grown
 * past the mark's counts again. qkv_graph_rollback_checked() refuses a
 * stale mark with QKV_ERROR_INVALID_ARGUMENT and leaves the graph as it is;
 * qkv_graph_rollback() does the same silently (it has no way to report:
 * check marks you are unsure of with the _checked variant).
 */
QKV_API
void qkv_graph_rollback(QkvGraph *graph, const QkvGraphMark *mark);
/**
 * qkv_graph_rollback_checked:
 * @graph: a #QkvGraph
 * @mark: a #QkvGraphMark
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_graph_rollback().
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_graph_rollback_checked(QkvGraph *graph, const QkvGraphMark *mark, GError **error);

/**
 * qkv_graph_backward:
 * @graph: a #QkvGraph
 * @loss: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * Append to the graph the nodes that compute d loss / d v for every parameter
 * that is not frozen and every input marked requires_grad. loss must be an f32
 * scalar (or a single-element tensor). Contributions are summed where a value is
 * used more than once. On error the graph is left as it was. Call it once:
 * a second call is refused with QKV_ERROR_INVALID_ARGUMENT naming the loss
 * that already has gradients (and the new one); for the gradient of several
 * losses, backward their sum, or give each loss its own graph.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_graph_backward(QkvGraph *graph, QkvValue *loss, GError **error);
/**
 * qkv_graph_gradient:
 * @graph: a #QkvGraph
 * @value: (nullable): a #QkvValue
 *
 * After qkv_graph_backward(): the gradient value of a parameter or input, or
 * NULL if none flows to it from the loss.
 *
 * Returns: (transfer none) (nullable): a #QkvValue
 */
QKV_API
QkvValue *qkv_graph_gradient(QkvGraph *graph, QkvValue *value);

/**
 * qkv_graph_to_string:
 * @graph: a #QkvGraph
 *
 * A text listing, one line per node; free with g_free().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_graph_to_string(QkvGraph *graph);
/**
 * qkv_graph_to_dot:
 * @graph: a #QkvGraph
 *
 * The graph in Graphviz DOT; free with g_free().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_graph_to_dot(QkvGraph *graph);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvGraph, qkv_graph_free)

G_END_DECLS
