/* qkv-plugin-op.h: defining an op (part of qkv-plugin.h, which describes the
 * op ABI): the ABI's version, attributes, the contexts of shape rules,
 * kernels, gradient rules and decompositions, QkvOpDef, and registering and
 * looking up ops. */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-tensor.h"
#include "qkv-error.h"
#include "qkv-graph.h"

G_BEGIN_DECLS

/**
 * QKV_OP_ABI_MAJOR:
 *
 * Op abi major.
 */
#define QKV_OP_ABI_MAJOR 1
/**
 * QKV_OP_ABI_MINOR:
 *
 * Op abi minor.
 */
#define QKV_OP_ABI_MINOR 3

/**
 * QKV_MAX_OUTPUTS:
 *
 * The most outputs one node may have.
 */
#define QKV_MAX_OUTPUTS 16

/**
 * QkvAttrType:
 * @QKV_ATTR_INT: GVariant "i" or "x"
 * @QKV_ATTR_FLOAT: GVariant "d" (an "i" or "x" is accepted and converted)
 * @QKV_ATTR_BOOL: GVariant "b"
 * @QKV_ATTR_INTS: GVariant "ai" or "ax"
 * @QKV_ATTR_STRING: GVariant "s"
 *
 * The attr type values.
 */
typedef enum {
  QKV_ATTR_INT,    /* GVariant "i" or "x" */
  QKV_ATTR_FLOAT,  /* GVariant "d" (an "i" or "x" is accepted and converted) */
  QKV_ATTR_BOOL,   /* GVariant "b" */
  QKV_ATTR_INTS,   /* GVariant "ai" or "ax" */
  QKV_ATTR_STRING, /* GVariant "s" */
} QkvAttrType;

/**
 * QkvAttrSpec:
 *
 * One attribute of an op's schema. Attributes not given take the default.
 */
typedef struct {
  const gchar *name;
  QkvAttrType type;
  gboolean required;
  gint64 default_int;          /* INT and BOOL */
  double default_float;        /* FLOAT */
  const gchar *default_string; /* STRING */
  const gchar *doc;
} QkvAttrSpec;

/**
 * QkvAttrs:
 *
 * A node's attributes, validated against the schema when the node was added.
 * Lookups are by name and allocate nothing.
 */
typedef struct _QkvAttrs QkvAttrs;

/**
 * qkv_attrs_get_int: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * Attrs get int.
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_attrs_get_int(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_float: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_int().
 *
 * Returns: the double
 */
QKV_API
double qkv_attrs_get_float(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_bool: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_int().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_attrs_get_bool(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_get_ints: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 * @n: (out) (optional): where to store the n, or %NULL
 *
 * The array and its length; the array is owned by attrs.
 *
 * Returns: (transfer none): the result
 */
QKV_API
const gint64 *qkv_attrs_get_ints(const QkvAttrs *attrs, const gchar *name, guint *n);
/**
 * qkv_attrs_get_string: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * See qkv_attrs_get_ints().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_attrs_get_string(const QkvAttrs *attrs, const gchar *name);
/**
 * qkv_attrs_has: (skip)
 * @attrs: a #QkvAttrs
 * @name: the name
 *
 * TRUE if the attribute was given explicitly when the node was added.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_attrs_has(const QkvAttrs *attrs, const gchar *name);

/**
 * QkvShapeCtx:
 *
 * What a shape rule sees and fills in.
 */
typedef struct {
  const gchar *op_name;
  const gchar *node_name;
  guint n_inputs;
  const QkvShape *in_shapes;
  const QkvDType *in_dtypes;
  const QkvAttrs *attrs;
  /* Filled in by the rule: number of outputs (1 by default), shapes, dtypes
   * (QKV_F32 by default). */
  guint n_outputs;
  QkvShape out_shapes[QKV_MAX_OUTPUTS];
  QkvDType out_dtypes[QKV_MAX_OUTPUTS];
  gpointer reserved[4];
} QkvShapeCtx;

/**
 * qkv_shape_error: (skip)
 * @ctx: a #QkvShapeCtx
 * @error: return location for a #GError, or %NULL
 * @code: the code
 * @format: the format
 * @...: the format's arguments
 *
 * Report a shape-rule failure: the message is prefixed with the op and node
 * names and suffixed with the input shapes. Always returns FALSE.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_shape_error(const QkvShapeCtx *ctx, GError **error, QkvError code, const gchar *format,
                         ...) G_GNUC_PRINTF(4, 5);

/**
 * QkvView:
 *
 * A tensor as a kernel sees it: contiguous, row-major.
 */
typedef struct {
  gpointer data;
  QkvShape shape;
  QkvDType dtype;
} QkvView;

/**
 * QkvKernelCtx:
 *
 * What a kernel sees. The kernel is called once per node run; it may use up to
 * n_threads threads, through qkv_kernel_parallel_for() (an OpenMP team of
 * its own would spin beside qkv's pool).
 */
typedef struct {
  const gchar *op_name;
  const gchar *node_name;
  guint n_inputs;
  guint n_outputs;
  const QkvView *in;
  QkvView *out;
  const QkvAttrs *attrs;
  /* Per-node scratch memory of the size the op's scratch_size asked for. */
  gpointer scratch;
  gsize scratch_size;
  gint n_threads;
  /* Plan compiled for training: dropout and friends are active. */
  gboolean training;
  /* Counter-based randomness: a kernel draws from (seed, step, node_id). */
  guint64 seed;
  guint64 step;
  guint32 node_id;
  /* The library's: reserved[0] is where qkv_kernel_fail() records a failure
   * (ABI 1.2). A kernel never touches them. */
  gpointer reserved[4];
} QkvKernelCtx;

/**
 * qkv_kernel_fail: (skip)
 * @ctx: a #QkvKernelCtx
 * @code: the code
 * @format: the format
 * @...: the format's arguments
 *
 * Fail the run (ABI 1.2): a kernel that finds its inputs unusable (an index
 * outside its range, say) reports it here and returns normally, leaving its
 * outputs in any state but without reading or writing out of bounds. When
 * the node's kernel returns, the plan stops the run: qkv_plan_run() fails
 * with a GError of code in the QKV_ERROR domain, whose message is the
 * formatted one prefixed with "run: node 'NAME' (OP): ". Kernels may call it
 * from any thread of their parallel loops, as often as they like; the first
 * call of a run wins and the later ones are dropped.
 */
QKV_API
void qkv_kernel_fail(const QkvKernelCtx *ctx, QkvError code, const gchar *format, ...)
    G_GNUC_PRINTF(3, 4);

/**
 * QkvGradCtx:
 *
 * What a gradient rule sees. The rule adds nodes to graph (with the typed op
 * functions or qkv_graph_add_node()) and stores d loss / d input i in
 * in_grads[i] for each input with needs_grad[i]; it may leave a gradient NULL
 * when it is zero. out_grads[j] is NULL where no gradient reaches output j.
 */
typedef struct {
  QkvGraph *graph;
  QkvNode *node;
  const QkvAttrs *attrs;
  guint n_inputs;
  guint n_outputs;
  QkvValue *const *inputs;
  QkvValue *const *outputs;
  QkvValue *const *out_grads;
  const gboolean *needs_grad;
  QkvValue **in_grads;
  gpointer reserved[4];
} QkvGradCtx;

/**
 * QkvDecomposeCtx:
 *
 * What a decomposition sees (ABI 1.1). The function adds to graph, with the
 * typed op functions or qkv_graph_add_node(), nodes of existing ops that
 * compute the same function as the node, built from inputs (and constants)
 * only, and stores in outputs[j] the value equal to output j of the node.
 * Autodiff uses it for an op without a gradient rule: it builds the
 * decomposition next to the node and differentiates through it.
 */
typedef struct {
  QkvGraph *graph;
  QkvNode *node;
  const QkvAttrs *attrs;
  guint n_inputs;
  guint n_outputs;
  QkvValue *const *inputs;
  QkvValue **outputs;
  gpointer reserved[4];
} QkvDecomposeCtx;

/**
 * QkvShapeFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a shape func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvShapeFunc)(QkvShapeCtx *ctx, GError **error);
/**
 * QkvKernelFunc:
 * @ctx: the ctx
 *
 * The signature of a kernel func.
 */
typedef void (*QkvKernelFunc)(const QkvKernelCtx *ctx);
/**
 * QkvGradFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a grad func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvGradFunc)(QkvGradCtx *ctx, GError **error);
/**
 * QkvScratchFunc:
 * @ctx: the ctx
 * @n_threads: the n threads
 *
 * Scratch bytes a node needs, given its shapes and the thread count.
 * ctx->out_dtypes says how the plan stores each output: QKV_BF16 where it
 * keeps it in bfloat16 (QkvOpDef.bf16_outputs), else the value's dtype.
 *
 * Returns: as described above
 */
typedef gsize (*QkvScratchFunc)(const QkvShapeCtx *ctx, gint n_threads);
/**
 * QkvDecomposeFunc:
 * @ctx: the ctx
 * @error: return location for a #GError
 *
 * The signature of a decompose func.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvDecomposeFunc)(QkvDecomposeCtx *ctx, GError **error);

/**
 * QkvOpFlags:
 * @QKV_OP_INPLACE: Output 0 may share input 0's buffer (same byte size) when input 0 is an
 *   intermediate read by no later node. The kernel must then cope with out[0].data == in[0].data.
 * @QKV_OP_RANDOM: The kernel draws random numbers (from ctx->seed, step, node_id).
 * @QKV_OP_STATIC_SHAPE: The output shape comes from an attribute fixed when the graph was built
 *   (broadcast_to's target, for instance): a plan refuses to run the node on inputs smaller than
 *   those it was compiled for.
 *
 * The op flags values.
 */
typedef enum {
  /* Output 0 may share input 0's buffer (same byte size) when input 0 is an
   * intermediate read by no later node. The kernel must then cope with
   * out[0].data == in[0].data. */
  QKV_OP_INPLACE = 1 << 0,
  /* The kernel draws random numbers (from ctx->seed, step, node_id). */
  QKV_OP_RANDOM = 1 << 1,
  /* The output shape comes from an attribute fixed when the graph was built
   * (broadcast_to's target, for instance): a plan refuses to run the node on
   * inputs smaller than those it was compiled for. */
  QKV_OP_STATIC_SHAPE = 1 << 2,
} QkvOpFlags;

/**
 * QkvOpDef:
 *
 * A op def.
 */
typedef struct _QkvOpDef {
  /* sizeof(QkvOpDef) as the author compiled it, and the ABI version. */
  guint32 struct_size;
  guint16 abi_major;
  guint16 abi_minor;

  const gchar *name;
  const gchar *doc;
  /* Input count: min_inputs to max_inputs (-1: no upper bound). */
  guint min_inputs;
  gint max_inputs;
  /* Names of the inputs and outputs, NULL-terminated (for messages and tools). */
  const gchar *const *input_names;
  const gchar *const *output_names;
  /* Attribute schema: n_attrs entries. */
  const QkvAttrSpec *attrs;
  guint n_attrs;
  /* Bit i set: input i never takes a gradient (indices, lengths, targets).
   * i32 inputs never take one in any case. */
  guint64 no_grad_inputs;
  guint32 flags; /* QkvOpFlags */

  QkvShapeFunc shape;
  QkvKernelFunc forward;
  /* NULL: the op is not differentiable (autodiff reports it by name). */
  QkvGradFunc gradient;
  /* NULL: no scratch memory. */
  QkvScratchFunc scratch_size;

  /* ABI 1.1. For an op without a gradient rule: build the same function from
   * existing ops, so autodiff can differentiate through it. NULL: none. */
  QkvDecomposeFunc decompose;

  /* ABI 1.3. Bit o of bf16_outputs: output o (an f32 one) may be stored as
   * bfloat16 in a plan compiled with bf16_activations (QkvPlanOptions), when
   * every node that reads it has the matching bit of bf16_inputs set and it
   * is not one of the plan's outputs or a parameter's gradient. The kernels
   * then see QKV_BF16 on those views (and the scratch_size function on
   * ctx->out_dtypes[o]): for activations that only feed matrix products
   * (qkv_sgemm_typed()), which round them to bf16 in any case. Zero: always
   * float32. (Two guint32 in place of one pointer: the struct keeps its
   * size where pointers have 8 bytes; elsewhere it grows by 4, which the
   * registry's struct_size handles as for any older definition.) */
  guint32 bf16_outputs;
  guint32 bf16_inputs;

  /* Zero. New fields are taken from here, so the struct keeps its size. */
  gpointer reserved[10];
} QkvOpDef;

/**
 * QKV_OP_DEF_INIT:
 *
 * Initialise a QkvOpDef for the header the caller compiles against.
 */
#define QKV_OP_DEF_INIT                                                                            \
  .struct_size = sizeof(QkvOpDef), .abi_major = QKV_OP_ABI_MAJOR, .abi_minor = QKV_OP_ABI_MINOR

/**
 * qkv_op_register: (skip)
 * @def: a #QkvOpDef
 * @error: return location for a #GError, or %NULL
 *
 * Register an op; the registry keeps a copy of def (strings and arrays it
 * points to must stay valid while the op is registered). Fails with
 * QKV_ERROR_EXISTS for a taken name and QKV_ERROR_INVALID_ARGUMENT for an
 * incomplete or incompatible definition.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_op_register(const QkvOpDef *def, GError **error);
/**
 * qkv_op_lookup: (skip)
 * @name: (nullable): the name
 *
 * The op of that name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvOpDef
 */
QKV_API
const QkvOpDef *qkv_op_lookup(const gchar *name);
/**
 * qkv_op_origin:
 * @name: the name
 *
 * Where the op came from: "built-in" or the plugin file path.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_op_origin(const gchar *name);
/**
 * qkv_op_list:
 *
 * Names of every registered op, sorted; free with g_strfreev().
 *
 * Returns: (transfer full) (array zero-terminated=1): the result
 */
QKV_API
gchar **qkv_op_list(void);

G_END_DECLS
