/* qkv-private.h: the runtime's internal structures (not installed). */
#pragma once

#include "qkv/qkv.h"

struct _QkvTensor {
  QkvDType dtype;
  QkvShape shape;
  gpointer data;
  gboolean owns_data;
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
};

struct _QkvValue {
  QkvGraph *graph;
  guint id;
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
};

/* Build the shape context of a node from its input values. */
void qkv_node_fill_shape_ctx(const QkvNode *node, QkvShapeCtx *ctx, QkvShape *in_shapes,
                             QkvDType *in_dtypes);

/* Registry internals. */
void qkv_registry_init(void);
/* Register a built-in op; a failure is a bug in qkv and aborts. */
void qkv_register_builtin(const QkvOpDef *def);
/* Set the origin recorded for ops this thread registers from now on (the
 * plugin loader); NULL restores "built-in". Returns the previous origin. */
const gchar *qkv_registry_set_origin(const gchar *origin);
/* Remove an op (rolls back a plugin that failed half-way). */
void qkv_registry_unregister(const gchar *name);
/* Load the plugins of qkv_plugin_search_path(); failures are warnings. */
void qkv_plugins_init(void);
/* elf.c: whether data (or the file at path) is a complete ELF shared object
 * for this machine, every header and segment inside the file, so that
 * dlopen() reads nothing past its end. The error (QKV_ERROR_PLUGIN) says what
 * is wrong, without the file name. */
gboolean qkv_elf_check_shared_object(const guint8 *data, gsize size, GError **error);
gboolean qkv_elf_check_file(const gchar *path, GError **error);

/* The param's state of that name, created (zero) if absent; a GError
 * (QKV_ERROR_MEMORY) instead of an abort when it cannot be allocated. */
QkvTensor *qkv_param_try_state(QkvParam *param, const gchar *name, QkvDType dtype,
                               const QkvShape *shape, GError **error);

/* A tensor over data with no checks: data may be NULL until a plan binds an
 * input (plan outputs that are graph inputs). */
QkvTensor *qkv_tensor_new_view(QkvDType dtype, const QkvShape *shape, gpointer data);

/* Zeroed, 64-byte aligned allocation that counts calls (see qkv_alloc_count());
 * NULL when the memory cannot be had (never aborts). */
gpointer qkv_aligned_alloc0(gsize size);
void qkv_aligned_free(gpointer ptr);

/* The executor tells qkv_sgemm() the thread count of the plan it runs. */
void qkv_set_running_plan_threads(gint n_threads);
/* Whether the ISA picked at run time (qkv_vec_isa(), QKV_VEC_ISA may force
 * a fallback) is AVX-512 (F, DQ, VL): kernels with an AVX-512 variant use it. */
gboolean qkv_use_avx512(void);
/* Whether it is AVX2 with FMA (and not AVX-512): kernels with an AVX2
 * variant use it. */
gboolean qkv_use_avx2(void);
/* qkv_sgemm()'s path for small products (src/smallgemm.c): computes c and
 * returns TRUE when the CPU has AVX-512 or AVX2 and the product is one it takes,
 * else returns FALSE without touching c. */
gboolean qkv_small_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                         float alpha, const float *a, gint64 lda, const float *b, gint64 ldb,
                         float beta, float *c, gint64 ldc);
