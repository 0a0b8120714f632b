/* ops-common.h: what the built-in op families share (not installed).
 *
 * Ops see only the op ABI (qkv-plugin.h), the public graph API for their
 * typed builders and gradient rules, and the small helpers below.
 */
#pragma once

#include <string.h>
#include "qkv/qkv.h"

/* Register a built-in op; a failure is a bug in qkv and aborts. */
void qkv_register_builtin(const QkvOpDef *def);

/* One registration function per op family (ops/<family>.c). */
void qkv_register_ops_matmul(void);
void qkv_register_ops_elementwise(void);
void qkv_register_ops_reduce(void);
void qkv_register_ops_shape(void);
void qkv_register_ops_softmax(void);
void qkv_register_ops_embedding(void);
void qkv_register_ops_loss(void);
void qkv_register_ops_masked_softmax(void);
void qkv_register_ops_dot_attention(void);
void qkv_register_ops_mha(void);
void qkv_register_ops_dropout(void);
void qkv_register_ops_layer_norm(void);
void qkv_register_ops_ffn(void);
void qkv_register_ops_positional(void);
void qkv_register_ops_additive_attention(void);

/* Add a node with inputs[0]'s graph and return its output 0. */
static inline QkvValue *
qkv_op_call(const gchar *op_name, QkvValue *const *inputs, guint n_inputs, GVariant *attrs,
            GError **error)
{
  g_return_val_if_fail(n_inputs > 0 && inputs[0] != NULL, NULL);
  return qkv_graph_op(qkv_value_graph(inputs[0]), op_name, inputs, n_inputs, attrs, error);
}

/* Row-major strides (in elements) of shape. */
static inline void
qkv_shape_strides(const QkvShape *shape, gint64 *strides)
{
  gint64 s = 1;
  for (gint i = shape->rank - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape->dims[i];
  }
}

/* Normalise a possibly negative axis; -1 if out of range. */
static inline gint
qkv_normalize_axis(gint axis, gint rank)
{
  if (axis < 0)
    axis += rank;
  return (axis >= 0 && axis < rank) ? axis : -1;
}

/* A GVariant holding an int64 array (floating). */
static inline GVariant *
qkv_variant_ints(const gint64 *values, gsize n)
{
  return g_variant_new_fixed_array(G_VARIANT_TYPE_INT64, values, n, sizeof(gint64));
}

/* Size of the last axis and the number of rows before it. */
static inline void
qkv_view_rows(const QkvView *v, gint64 *rows, gint64 *cols)
{
  gint64 n = qkv_shape_numel(&v->shape);
  *cols = v->shape.rank > 0 ? v->shape.dims[v->shape.rank - 1] : 1;
  *rows = *cols > 0 ? n / *cols : 0;
}
