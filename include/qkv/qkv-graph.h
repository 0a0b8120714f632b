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

typedef struct _QkvGraph QkvGraph;
typedef struct _QkvNode QkvNode;
/* One output of a node (or an input, parameter or constant). Owned by its graph. */
typedef struct _QkvValue QkvValue;

typedef enum {
  QKV_VALUE_INPUT,
  QKV_VALUE_PARAM,
  QKV_VALUE_CONSTANT,
  QKV_VALUE_OP,
  QKV_VALUE_STATE,
} QkvValueKind;

/* Errors chain. Every function of qkv that takes a GError ** and finds an
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
 * QKV_ERROR_INVALID_ARGUMENT ("what: value i is NULL"). */
QKV_API
gboolean qkv_values_present(const gchar *what, QkvValue *const *values, guint n, GError **error);
/* Return NULL from the calling function unless every value given is non-NULL. */
#define QKV_RETURN_IF_MISSING(what, error, ...)                                                    \
  G_STMT_START                                                                                     \
  {                                                                                                \
    QkvValue *const qkv_present_[] = {__VA_ARGS__};                                                \
    if (!qkv_values_present((what), qkv_present_, G_N_ELEMENTS(qkv_present_), (error)))            \
      return NULL;                                                                                 \
  }                                                                                                \
  G_STMT_END

QKV_API
QkvGraph *qkv_graph_new(void);
QKV_API
void qkv_graph_free(QkvGraph *graph);

/* A named placeholder; its tensor is bound when a plan runs. */
QKV_API
QkvValue *qkv_graph_input(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                          GError **error);
/* State: a value whose buffer belongs to each plan compiled from the graph
 * (outside the arena's reuse, zero at compile) and keeps its contents from
 * one run to the next, until qkv_plan_reset_state() or qkv_plan_free().
 * Lifetimes side by side: an input lives while its bound tensor does and is
 * read-only; a parameter lives in its store; a state lives in the plan.
 * Only in-place ops write a state (kv_cache_append, as its input 0); the
 * plan runs such a writer after every reader of the state that does not
 * depend on the writer's outputs, so within one run a reader sees the
 * contents left by the previous run unless it reads the writer's output.
 * One writer per state per graph. Names are unique among a graph's states.
 * F32 or I32; NULL with QKV_ERROR_EXISTS, _DTYPE or _SHAPE. */
QKV_API
QkvValue *qkv_graph_state(QkvGraph *graph, const gchar *name, QkvDType dtype, const QkvShape *shape,
                          GError **error);
/* The parameter of that name in params. The store must outlive the graph and
 * every plan compiled from it. Adding the same name twice returns the same value. */
QKV_API
QkvValue *qkv_graph_param(QkvGraph *graph, QkvParams *params, const gchar *name, GError **error);
/* A constant holding a copy of tensor. */
QKV_API
QkvValue *qkv_graph_constant(QkvGraph *graph, const QkvTensor *tensor, GError **error);
/* An f32 scalar constant. */
QKV_API
QkvValue *qkv_graph_scalar(QkvGraph *graph, float value);

/* The generic path: add a node running the registered op op_name on inputs.
 * attrs is a GVariant of type a{sv} (or NULL); a floating reference is sunk.
 * Returns the node, or NULL with a QKV_ERROR and the graph unchanged. */
QKV_API
QkvNode *qkv_graph_add_node(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs,
                            guint n_inputs, GVariant *attrs, GError **error);
/* Same as qkv_graph_add_node() and returns output 0. */
QKV_API
QkvValue *qkv_graph_op(QkvGraph *graph, const gchar *op_name, QkvValue *const *inputs,
                       guint n_inputs, GVariant *attrs, GError **error);

QKV_API
guint qkv_node_n_outputs(const QkvNode *node);
QKV_API
QkvValue *qkv_node_output(QkvNode *node, guint index);
QKV_API
const gchar *qkv_node_name(const QkvNode *node);
QKV_API
const gchar *qkv_node_op_name(const QkvNode *node);

QKV_API
QkvGraph *qkv_value_graph(const QkvValue *value);
QKV_API
const QkvShape *qkv_value_shape(const QkvValue *value);
QKV_API
QkvDType qkv_value_dtype(const QkvValue *value);
QKV_API
QkvValueKind qkv_value_kind(const QkvValue *value);
/* The producing node for QKV_VALUE_OP values, else NULL. */
QKV_API
QkvNode *qkv_value_node(const QkvValue *value);
/* A readable name: the input or parameter name, or "node:output". */
QKV_API
const gchar *qkv_value_name(const QkvValue *value);
/* Mark a graph input as needing a gradient from qkv_graph_backward(). */
QKV_API
void qkv_value_set_requires_grad(QkvValue *value, gboolean requires_grad);

/* Look up an input by name, or NULL. */
QKV_API
QkvValue *qkv_graph_lookup_input(QkvGraph *graph, const gchar *name);
QKV_API
guint qkv_graph_n_nodes(const QkvGraph *graph);
QKV_API
guint qkv_graph_n_values(const QkvGraph *graph);

/* Prefix for the names of nodes added from now on ("encoder.blks.block0");
 * NULL or "" clears it. */
QKV_API
void qkv_graph_set_scope(QkvGraph *graph, const gchar *scope);
/* The current prefix, or NULL; owned by the graph until the next change. */
QKV_API
const gchar *qkv_graph_get_scope(const QkvGraph *graph);

/* A point to roll a graph back to, for all-or-nothing construction: take a
 * mark, add inputs, constants, parameters and nodes, and on failure roll
 * back to the mark. Plain data; nothing to free. generation is the graph's
 * count of truncations when the mark was taken, which lets a rollback tell
 * a stale mark (this field took one of the two reserved pointers: the
 * struct's size is unchanged on 64-bit systems). */
typedef struct {
  guint n_values;
  guint n_nodes;
  gboolean had_backward;
  guint64 generation;
  gpointer reserved[1];
} QkvGraphMark;

/* Record in *mark what the graph holds now. */
QKV_API
void qkv_graph_mark(QkvGraph *graph, QkvGraphMark *mark);
/* Remove every value and node added since mark was taken (they are freed:
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
 * check marks you are unsure of with the _checked variant). */
QKV_API
void qkv_graph_rollback(QkvGraph *graph, const QkvGraphMark *mark);
QKV_API
gboolean qkv_graph_rollback_checked(QkvGraph *graph, const QkvGraphMark *mark, GError **error);

/* Append to the graph the nodes that compute d loss / d v for every parameter
 * that is not frozen and every input marked requires_grad. loss must be an f32
 * scalar (or a single-element tensor). Contributions are summed where a value is
 * used more than once. On error the graph is left as it was. Call it once:
 * a second call is refused with QKV_ERROR_INVALID_ARGUMENT naming the loss
 * that already has gradients (and the new one); for the gradient of several
 * losses, backward their sum, or give each loss its own graph. */
QKV_API
gboolean qkv_graph_backward(QkvGraph *graph, QkvValue *loss, GError **error);
/* After qkv_graph_backward(): the gradient value of a parameter or input, or
 * NULL if none flows to it from the loss. */
QKV_API
QkvValue *qkv_graph_gradient(QkvGraph *graph, QkvValue *value);

/* A text listing, one line per node; free with g_free(). */
QKV_API
gchar *qkv_graph_to_string(QkvGraph *graph);
/* The graph in Graphviz DOT; free with g_free(). */
QKV_API
gchar *qkv_graph_to_dot(QkvGraph *graph);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvGraph, qkv_graph_free)

G_END_DECLS
