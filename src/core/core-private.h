/* core-private.h: the core's internal structures (tensor, attributes,
 * parameter store, graph) and the registry's internals, shared by the layers
 * of src/ (not installed; ops/ and graph/ never include it). */
#pragma once

#include "qkv/qkv.h"
#include "kernels/kernels-private.h"
#include "qkv/qkv.h"

struct _QkvTensor {
  QkvDType dtype;
  QkvShape shape;
  gpointer data;
  gboolean owns_data;
  /* References (qkv_tensor_ref()); qkv_tensor_free() drops one. */
  gint ref_count;
};

typedef struct {
  const gchar *name; /* points into the op's schema */
  QkvAttrType type;
  gboolean given;
  gint64 int_value;
  double float_value;
  gint64 *ints;
  guint n_ints;
  gchar *string_value;
} QkvAttrEntry;

struct _QkvAttrs {
  guint n;
  QkvAttrEntry *entries;
};

/* Parse and validate a{sv} attributes against def's schema. */
QkvAttrs *qkv_attrs_parse(const QkvOpDef *def, const gchar *node_name, GVariant *attrs,
                          GError **error);
void qkv_attrs_free(QkvAttrs *attrs);
/* "transpose_a=true, axis=1"; free with g_free(). */
gchar *qkv_attrs_to_string(const QkvAttrs *attrs);

struct _QkvParam {
  guint64 born; /* the store's generation when the param was added */
  gchar *name;
  QkvTensor *value;
  QkvTensor *grad;
  gboolean frozen;
  GPtrArray *state_names; /* gchar* */
  GPtrArray *states;      /* QkvTensor* */
};

struct _QkvParams {
  GPtrArray *list;     /* QkvParam*, insertion order, owned */
  GHashTable *by_name; /* name -> QkvParam* */
  /* Bumped by every rollback that removes parameters. A mark (or anything
   * that counted the first n params) is still good when the n-th param was
   * born no later than the generation it saw: a param at that index born
   * later replaced one that a rollback removed. */
  guint64 generation;
  gint grads_busy; /* atomic: a plan run is writing the gradient buffers */
  /* References (qkv_params_ref()): graphs that took a parameter and
   * optimizers hold one, so a binding that frees objects in any order
   * (Python's garbage collector) never leaves them a freed store. */
  gint ref_count;
};

/* The first mark->n_params params are still those the mark counted. */
gboolean qkv_params_mark_is_current(const QkvParams *params, const QkvParamsMark *mark);
/* Take the store's gradient buffers for one plan run: FALSE (without
 * waiting) when another run holds them. */
gboolean qkv_params_grads_acquire(QkvParams *params);
void qkv_params_grads_release(QkvParams *params);

struct _QkvValue {
  QkvGraph *graph;
  guint id;
  guint64 born; /* the graph's generation when the value was added */
  QkvValueKind kind;
  QkvShape shape;
  QkvDType dtype;
  QkvNode *node;      /* QKV_VALUE_OP */
  guint output_index; /* QKV_VALUE_OP */
  gchar *name;
  QkvParam *param;     /* QKV_VALUE_PARAM */
  QkvParams *params;   /* QKV_VALUE_PARAM */
  QkvTensor *constant; /* QKV_VALUE_CONSTANT, owned */
  gboolean requires_grad;
};

struct _QkvNode {
  QkvGraph *graph;
  guint id;
  guint64 born;       /* the graph's generation when the node was added */
  const QkvOpDef *op; /* stable pointer into the registry */
  gchar *name;
  guint n_inputs;
  QkvValue **inputs;
  guint n_outputs;
  QkvValue *outputs[QKV_MAX_OUTPUTS];
  QkvAttrs *attrs;
};

struct _QkvGraph {
  GPtrArray *values; /* QkvValue*, owned, index = id */
  GPtrArray *nodes;  /* QkvNode*, owned, index = id; creation order is topological */
  GPtrArray *inputs; /* QkvValue* of kind INPUT */
  GHashTable *input_by_name;
  GHashTable *param_values; /* QkvParam* -> QkvValue* */
  gchar *scope;
  gboolean has_backward;
  QkvValue *backward_loss; /* the loss of that backward pass, for error messages */
  GHashTable *grads;       /* QkvValue* (param or input) -> gradient QkvValue* */
  GPtrArray *param_grads;  /* QkvValue* param values that have a gradient, in order */
  /* Bumped by every truncation (rollback, a failed backward pass): a mark
   * is stale when the last value or node it counted was born later than
   * the generation it saw (see QkvParams). */
  guint64 generation;
  /* References (qkv_graph_ref()): plans and boxed values and nodes (the
   * GObject type glue, src/gtypes.c) hold one each. */
  gint ref_count;
  /* Set once a value or node was handed out as a boxed reference: from then
   * on a truncation keeps the values and nodes it removes (in retired_*)
   * until the graph is freed, so a reference to one never dangles. */
  gboolean retire;
  GPtrArray *retired_values;
  GPtrArray *retired_nodes;
  /* The stores that qkv_graph_param() took values from, one reference each. */
  GPtrArray *held_params;
};

/* Build the shape context of a node from its input values. */
void qkv_node_fill_shape_ctx(const QkvNode *node, QkvShapeCtx *ctx, QkvShape *in_shapes,
                             QkvDType *in_dtypes);

/* Drop every value and node added after the given counts (rollbacks, and
 * autodiff undoing a failed backward pass); bumps the generation when
 * anything goes. */
void qkv_graph_truncate(QkvGraph *graph, guint n_values, guint n_nodes);
/* TRUE for a value of graph that a truncation removed and a boxed reference
 * kept alive (QkvGraph.retire): it may not go into new nodes, plans or
 * backward passes. */
gboolean qkv_value_is_retired(const QkvGraph *graph, const QkvValue *value);

/* Registry internals (the built-in registration entry lives in ops/builtins.h). */
void qkv_registry_init(void);
/* Set the origin recorded for ops this thread registers from now on (the
 * plugin loader); NULL restores "built-in". Returns the previous origin. */
const gchar *qkv_registry_set_origin(const gchar *origin);
/* Remove an op (rolls back a plugin that failed half-way). */
void qkv_registry_unregister(const gchar *name);
/* The param's state of that name, created (zero) if absent; a GError
 * (QKV_ERROR_MEMORY) instead of an abort when it cannot be allocated. */
QkvTensor *qkv_param_try_state(QkvParam *param, const gchar *name, QkvDType dtype,
                               const QkvShape *shape, GError **error);

/* A tensor over data with no checks: data may be NULL until a plan binds an
 * input (plan outputs that are graph inputs). */
QkvTensor *qkv_tensor_new_view(QkvDType dtype, const QkvShape *shape, gpointer data);
