/* qkv-plugin.h: the op ABI, shared by built-in ops and plugins.
 *
 * An op is a QkvOpDef: its name, inputs, outputs, attribute schema, a shape
 * rule run when a node is added, a forward kernel run by plans, and a gradient
 * rule that adds gradient nodes to the graph. The struct is versioned and
 * append-only: a definition compiled against an older header (smaller
 * struct_size, same major) keeps registering, with the newer fields zeroed.
 */
#pragma once

#include <glib.h>
#include "qkv-tensor.h"
#include "qkv-error.h"
#include "qkv-graph.h"

G_BEGIN_DECLS

#define QKV_OP_ABI_MAJOR 1
#define QKV_OP_ABI_MINOR 0

/* The most outputs one node may have. */
#define QKV_MAX_OUTPUTS 16

typedef enum {
  QKV_ATTR_INT,    /* GVariant "i" or "x" */
  QKV_ATTR_FLOAT,  /* GVariant "d" (an "i" or "x" is accepted and converted) */
  QKV_ATTR_BOOL,   /* GVariant "b" */
  QKV_ATTR_INTS,   /* GVariant "ai" or "ax" */
  QKV_ATTR_STRING, /* GVariant "s" */
} QkvAttrType;

/* One attribute of an op's schema. Attributes not given take the default. */
typedef struct {
  const gchar *name;
  QkvAttrType type;
  gboolean required;
  gint64 default_int;     /* INT and BOOL */
  double default_float;   /* FLOAT */
  const gchar *default_string; /* STRING */
  const gchar *doc;
} QkvAttrSpec;

/* A node's attributes, validated against the schema when the node was added.
 * Lookups are by name and allocate nothing. */
typedef struct _QkvAttrs QkvAttrs;

gint64 qkv_attrs_get_int(const QkvAttrs *attrs, const gchar *name);
double qkv_attrs_get_float(const QkvAttrs *attrs, const gchar *name);
gboolean qkv_attrs_get_bool(const QkvAttrs *attrs, const gchar *name);
/* The array and its length; the array is owned by attrs. */
const gint64 *qkv_attrs_get_ints(const QkvAttrs *attrs, const gchar *name, guint *n);
const gchar *qkv_attrs_get_string(const QkvAttrs *attrs, const gchar *name);
/* TRUE if the attribute was given explicitly when the node was added. */
gboolean qkv_attrs_has(const QkvAttrs *attrs, const gchar *name);

/* What a shape rule sees and fills in. */
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

/* Report a shape-rule failure: the message is prefixed with the op and node
 * names and suffixed with the input shapes. Always returns FALSE. */
gboolean qkv_shape_error(const QkvShapeCtx *ctx, GError **error, QkvError code,
                         const gchar *format, ...) G_GNUC_PRINTF(4, 5);

/* A tensor as a kernel sees it: contiguous, row-major. */
typedef struct {
  gpointer data;
  QkvShape shape;
  QkvDType dtype;
} QkvView;

/* What a kernel sees. The kernel is called once per node run; it may use up to
 * n_threads threads (OpenMP or qkv_kernel_parallel_for()). */
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
  gpointer reserved[4];
} QkvKernelCtx;

/* What a gradient rule sees. The rule adds nodes to graph (with the typed op
 * functions or qkv_graph_add_node()) and stores d loss / d input i in
 * in_grads[i] for each input with needs_grad[i]; it may leave a gradient NULL
 * when it is zero. out_grads[j] is NULL where no gradient reaches output j. */
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

typedef gboolean (*QkvShapeFunc)(QkvShapeCtx *ctx, GError **error);
typedef void (*QkvKernelFunc)(const QkvKernelCtx *ctx);
typedef gboolean (*QkvGradFunc)(QkvGradCtx *ctx, GError **error);
/* Scratch bytes a node needs, given its shapes and the thread count. */
typedef gsize (*QkvScratchFunc)(const QkvShapeCtx *ctx, gint n_threads);

typedef enum {
  /* Output 0 may share input 0's buffer (same byte size) when input 0 is an
   * intermediate read by no later node. The kernel must then cope with
   * out[0].data == in[0].data. */
  QKV_OP_INPLACE = 1 << 0,
  /* The kernel draws random numbers (from ctx->seed, step, node_id). */
  QKV_OP_RANDOM = 1 << 1,
} QkvOpFlags;

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

  gpointer reserved[12];
} QkvOpDef;

/* Initialise a QkvOpDef for the header the caller compiles against. */
#define QKV_OP_DEF_INIT                                                                            \
  .struct_size = sizeof(QkvOpDef), .abi_major = QKV_OP_ABI_MAJOR, .abi_minor = QKV_OP_ABI_MINOR

/* Register an op; the registry keeps a copy of def (strings and arrays it
 * points to must stay valid while the op is registered). Fails with
 * QKV_ERROR_EXISTS for a taken name and QKV_ERROR_INVALID_ARGUMENT for an
 * incomplete or incompatible definition. */
gboolean qkv_op_register(const QkvOpDef *def, GError **error);
/* The op of that name, or NULL. */
const QkvOpDef *qkv_op_lookup(const gchar *name);
/* Where the op came from: "built-in" or the plugin file path. */
const gchar *qkv_op_origin(const gchar *name);
/* Names of every registered op, sorted; free with g_strfreev(). */
gchar **qkv_op_list(void);

/* Run body(begin, end, thread_index, user_data) over [0, n) split into
 * contiguous chunks, one per thread (up to ctx->n_threads). */
typedef void (*QkvRangeFunc)(gint64 begin, gint64 end, gint thread_index, gpointer user_data);
void qkv_kernel_parallel_for(const QkvKernelCtx *ctx, gint64 n, QkvRangeFunc body,
                             gpointer user_data);

/* Vector math over n floats (dst may equal src), through SLEEF's widest
 * vector functions the CPU supports, with a scalar fallback. */
void qkv_vec_exp(float *dst, const float *src, gsize n);
void qkv_vec_tanh(float *dst, const float *src, gsize n);
/* The ISA picked at run time: "avx512f", "avx2" or "scalar". */
const gchar *qkv_vec_isa(void);

/* Counter-based random numbers: a uniform float in [0, 1) for (key, counter). */
float qkv_random_uniform(guint64 key, guint64 counter);
/* Mix seed, step and node id into one key. */
guint64 qkv_random_key(guint64 seed, guint64 step, guint32 node_id);

G_END_DECLS
