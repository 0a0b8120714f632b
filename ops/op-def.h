/* op-def.h: writing a built-in op's QkvOpDef without boilerplate (not
 * installed).
 *
 * Every op family (ops/<family>.c, listed once in builtins.h) ends with the
 * table of its definitions, closed by QKV_OPS_END:
 *
 *   const QkvOpDef qkv_ops_dropout[] = {
 *       QKV_OP(.name = "dropout", .doc = "…",
 *              QKV_INPUTS("x"), QKV_OUTPUTS("y", "mask"),
 *              QKV_ATTRS(QKV_REQUIRED_ATTR("p", FLOAT, "probability of zeroing …")),
 *              .shape = dropout_shape, .forward = dropout_forward, .gradient = dropout_grad),
 *       QKV_OPS_END,
 *   };
 *
 * QKV_OP(fields…)             a QkvOpDef for this header's ABI (QKV_OP_DEF_INIT)
 *                             with the given designated fields.
 * QKV_INPUTS(names…)          all inputs required: min_inputs = max_inputs = the
 *                             number of names.
 * QKV_INPUTS_OPT(n, names…)   the first n inputs required, the rest optional:
 *                             max_inputs = the number of names. Which optional
 *                             inputs a node has, and so where each sits, is the
 *                             business of the op's slots function (see
 *                             qkv_slot_next below).
 * QKV_INPUTS_VARIADIC(name)   one or more inputs, all called name.
 * QKV_OUTPUTS(names…)         the output names.
 * QKV_ATTRS(specs…)           the attribute schema, written in place;
 * QKV_ATTR_TABLE(array)       or a named QkvAttrSpec array that several ops share.
 *
 * The attribute specs: QKV_REQUIRED_ATTR(name, TYPE, doc) with TYPE one of INT,
 * FLOAT, BOOL, INTS, STRING; QKV_INT_ATTR, QKV_FLOAT_ATTR, QKV_BOOL_ATTR,
 * QKV_STRING_ATTR (name, default, doc); QKV_INTS_ATTR(name, doc), optional
 * without a default.
 *
 * The name lists are C11 compound literals. Outside a function body those
 * are static arrays, which is what lets the registry keep pointers to them;
 * so write the tables at file scope only. (dot_product_attention_backward,
 * whose flash layout has one input more than it names, sets min_inputs,
 * max_inputs and input_names by hand.)
 */
#pragma once

#include "qkv/qkv.h"

#define QKV_OP(...)                                                                                \
  {                                                                                                \
    QKV_OP_DEF_INIT, __VA_ARGS__                                                                   \
  }

/* Closes a family's table (the registration loop stops at a NULL name). */
#define QKV_OPS_END                                                                                \
  {                                                                                                \
    .name = NULL                                                                                   \
  }

/* A NULL-terminated name list, and the number of names in it. */
#define QKV_NAMES(...) ((const gchar *const[]){__VA_ARGS__, NULL})
#define QKV_N_NAMES(...) (sizeof((const gchar *const[]){__VA_ARGS__}) / sizeof(const gchar *))

#define QKV_INPUTS(...) QKV_INPUTS_OPT(QKV_N_NAMES(__VA_ARGS__), __VA_ARGS__)
#define QKV_INPUTS_OPT(n_required, ...)                                                            \
  .min_inputs = (guint)(n_required), .max_inputs = (gint)QKV_N_NAMES(__VA_ARGS__),                 \
  .input_names = QKV_NAMES(__VA_ARGS__)
#define QKV_INPUTS_VARIADIC(name) .min_inputs = 1, .max_inputs = -1, .input_names = QKV_NAMES(name)
#define QKV_OUTPUTS(...) .output_names = QKV_NAMES(__VA_ARGS__)

#define QKV_ATTR_TABLE(array) .attrs = (array), .n_attrs = G_N_ELEMENTS(array)
#define QKV_ATTRS(...) QKV_ATTR_TABLE(((const QkvAttrSpec[]){__VA_ARGS__}))

#define QKV_REQUIRED_ATTR(NAME, TYPE, DOC)                                                         \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_##TYPE, .required = TRUE, .doc = (DOC)                        \
  }
#define QKV_INT_ATTR(NAME, DEFAULT, DOC)                                                           \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_INT, .default_int = (DEFAULT), .doc = (DOC)                   \
  }
#define QKV_BOOL_ATTR(NAME, DEFAULT, DOC)                                                          \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_BOOL, .default_int = (DEFAULT), .doc = (DOC)                  \
  }
#define QKV_FLOAT_ATTR(NAME, DEFAULT, DOC)                                                         \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_FLOAT, .default_float = (DEFAULT), .doc = (DOC)               \
  }
#define QKV_STRING_ATTR(NAME, DEFAULT, DOC)                                                        \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_STRING, .default_string = (DEFAULT), .doc = (DOC)             \
  }
#define QKV_INTS_ATTR(NAME, DOC)                                                                   \
  {                                                                                                \
    .name = (NAME), .type = QKV_ATTR_INTS, .doc = (DOC)                                            \
  }

/* The name of input i of the op whose shape rule runs (for messages; "?"
 * past the named ones). */
static inline const gchar *
qkv_input_name(const QkvShapeCtx *ctx, guint i)
{
  const QkvOpDef *def = qkv_op_lookup(ctx->op_name);
  const gchar *const *names = def != NULL ? def->input_names : NULL;
  for (guint k = 0; names != NULL && names[k] != NULL; k++)
    if (k == i)
      return names[k];
  return "?";
}

/* ---- optional inputs in fixed order ----------------------------------------
 *
 * An op whose optional inputs may each be absent keeps them in one fixed
 * order after its required ones, a present one taking the next slot. Such
 * an op has one slots function that turns "which are present" into "where
 * each sits" (-1: absent) by calling qkv_slot_next() once per optional
 * input, in order; its typed builder, shape rule, kernel and gradient rule
 * all go through that function, so no position is worked out twice. */

/* The slot of the next optional input (width inputs wide), or -1 when it is
 * absent; *n_inputs counts the inputs so far. */
static inline gint
qkv_slot_next(guint *n_inputs, gboolean present, guint width)
{
  if (!present)
    return -1;
  gint slot = (gint)*n_inputs;
  *n_inputs += width;
  return slot;
}

/* inputs[slot] = value, unless the input is absent (slot -1). */
static inline void
qkv_slot_put(QkvValue **inputs, gint slot, QkvValue *value)
{
  if (slot >= 0)
    inputs[slot] = value;
}
