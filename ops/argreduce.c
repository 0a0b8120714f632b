/* argreduce.c: the largest or smallest element along one axis: "max" and
 * "min" give the values and their indices (i32), "argmax" and "argmin" the
 * indices only.
 *
 * Ties go to the first index, and NaN counts as larger than everything for
 * max and smaller than everything for min, so the first NaN along the axis
 * is picked: both as PyTorch's max(dim)/min(dim)/argmax/argmin on CPU do.
 * The gradient of the values goes to the picked element only (it is the
 * gradient of gather); indices have none.
 */
#include "ops-common.h"
#include "error-private.h"

/* Columns scanned per task: stack accumulators this wide stay in L1 and the
 * inner loop vectorises. */
#define ARG_COL_BLOCK 256

static const QkvAttrSpec arg_attrs[] = {
    QKV_REQUIRED_ATTR("axis", INT, "the axis to reduce (negative counts from the end)"),
    QKV_BOOL_ATTR("keepdims", FALSE, "keep the reduced axis as size 1"),
};

static gint
arg_axis(const QkvAttrs *attrs, gint rank)
{
  gint64 axis = qkv_attrs_get_int(attrs, "axis");
  return (axis < -rank || axis >= rank) ? -1 : qkv_normalize_axis((gint)axis, rank);
}

static gboolean
arg_shape(QkvShapeCtx *ctx, gboolean with_values, GError **error)
{
  const QkvShape *in = &ctx->in_shapes[0];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x is %s, expected f32",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  gint axis = arg_axis(ctx->attrs, in->rank);
  if (axis < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "axis %" G_GINT64_FORMAT " is out of range for rank %d",
                           qkv_attrs_get_int(ctx->attrs, "axis"), in->rank);
  if (in->dims[axis] == 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "axis %d is empty: there is no element to pick", axis);
  if (in->dims[axis] > G_MAXINT32)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "axis %d has %" G_GINT64_FORMAT " elements, more than i32 indices reach",
                           axis, in->dims[axis]);
  QkvShape out = *in;
  if (qkv_attrs_get_bool(ctx->attrs, "keepdims")) {
    out.dims[axis] = 1;
  } else {
    for (gint d = axis; d + 1 < in->rank; d++)
      out.dims[d] = in->dims[d + 1];
    out.rank--;
  }
  if (with_values) {
    ctx->n_outputs = 2;
    ctx->out_shapes[0] = out;
    ctx->out_dtypes[0] = QKV_F32;
    ctx->out_shapes[1] = out;
    ctx->out_dtypes[1] = QKV_I32;
  } else {
    ctx->out_shapes[0] = out;
    ctx->out_dtypes[0] = QKV_I32;
  }
  return TRUE;
}

static gboolean
values_shape(QkvShapeCtx *ctx, GError **error)
{
  return arg_shape(ctx, TRUE, error);
}

static gboolean
indices_shape(QkvShapeCtx *ctx, GError **error)
{
  return arg_shape(ctx, FALSE, error);
}

typedef struct {
  const float *x;
  float *values; /* NULL for argmax/argmin */
  gint32 *indices;
  gint64 len, inner, n_blocks;
  gboolean is_max;
} ArgJob;

/* Tasks are (outer index, block of inner columns); each scans the whole axis
 * for its columns, keeping the best value and its index. */
static void
arg_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const ArgJob *j = user_data;
  const gint64 len = j->len, inner = j->inner;
  float best[ARG_COL_BLOCK];
  gint32 index[ARG_COL_BLOCK];
  for (gint64 t = begin; t < end; t++) {
    const gint64 o = t / j->n_blocks, c0 = (t % j->n_blocks) * ARG_COL_BLOCK;
    const gint64 width = MIN(ARG_COL_BLOCK, inner - c0);
    const float *slab = j->x + o * len * inner + c0;
    for (gint64 c = 0; c < width; c++) {
      best[c] = slab[c];
      index[c] = 0;
    }
    for (gint64 k = 1; k < len; k++) {
      const float *row = slab + k * inner;
      /* Strict comparisons keep the first of equal elements; a NaN takes
       * over from a number and is never replaced. */
      if (j->is_max) {
#pragma omp simd
        for (gint64 c = 0; c < width; c++) {
          float v = row[c], b = best[c];
          gboolean take = v > b || (v != v && b == b);
          best[c] = take ? v : b;
          index[c] = take ? (gint32)k : index[c];
        }
      } else {
#pragma omp simd
        for (gint64 c = 0; c < width; c++) {
          float v = row[c], b = best[c];
          gboolean take = v < b || (v != v && b == b);
          best[c] = take ? v : b;
          index[c] = take ? (gint32)k : index[c];
        }
      }
    }
    if (j->values != NULL)
      memcpy(j->values + o * inner + c0, best, (gsize)width * sizeof(float));
    memcpy(j->indices + o * inner + c0, index, (gsize)width * sizeof(gint32));
  }
}

static void
arg_run(const QkvKernelCtx *ctx, gboolean is_max, gboolean with_values)
{
  const QkvShape *in = &ctx->in[0].shape;
  gint axis = arg_axis(ctx->attrs, in->rank);
  gint64 outer = 1, inner = 1;
  for (gint d = 0; d < axis; d++)
    outer *= in->dims[d];
  for (gint d = axis + 1; d < in->rank; d++)
    inner *= in->dims[d];
  if (outer == 0 || inner == 0)
    return;
  ArgJob job = {
      .x = ctx->in[0].data,
      .values = with_values ? ctx->out[0].data : NULL,
      .indices = with_values ? ctx->out[1].data : ctx->out[0].data,
      .len = in->dims[axis],
      .inner = inner,
      .n_blocks = (inner + ARG_COL_BLOCK - 1) / ARG_COL_BLOCK,
      .is_max = is_max,
  };
  gint64 n_tasks = outer * job.n_blocks;
  gint nt = qkv_kernel_threads(ctx, qkv_shape_numel(in));
  qkv_parallel_for(MIN((gint64)nt, n_tasks), n_tasks, arg_range, &job);
}

static void
max_forward(const QkvKernelCtx *ctx)
{
  arg_run(ctx, TRUE, TRUE);
}

static void
min_forward(const QkvKernelCtx *ctx)
{
  arg_run(ctx, FALSE, TRUE);
}

static void
argmax_forward(const QkvKernelCtx *ctx)
{
  arg_run(ctx, TRUE, FALSE);
}

static void
argmin_forward(const QkvKernelCtx *ctx)
{
  arg_run(ctx, FALSE, FALSE);
}

/* d values / d x: dy scattered to the picked positions, which is the
 * gradient of gather with the indices (given the axis back if it was
 * dropped). */
static gboolean
values_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dy = g->out_grads[0], *indices = g->outputs[1];
  if (dy == NULL || !g->needs_grad[0])
    return TRUE;
  const QkvShape *in = qkv_value_shape(g->inputs[0]);
  gint axis = arg_axis(g->attrs, in->rank);
  QkvShape kept = *in;
  kept.dims[axis] = 1;
  if (!qkv_shape_equal(qkv_value_shape(dy), &kept)) {
    dy = qkv_reshape(dy, &kept, error);
    indices = dy ? qkv_reshape(indices, &kept, error) : NULL;
    if (indices == NULL)
      return FALSE;
  }
  g->in_grads[0] = qkv_gather_backward(dy, indices, in, axis, error);
  return g->in_grads[0] != NULL;
}

#define VALUES_DEF(NAME, DOC)                                                                      \
  QKV_OP(.name = #NAME, .doc = DOC, QKV_INPUTS("x"), QKV_OUTPUTS("values", "indices"),             \
         QKV_ATTR_TABLE(arg_attrs), .shape = values_shape, .forward = NAME##_forward,              \
         .gradient = values_grad)

/* The output is i32: autodiff never asks these for a gradient. */
#define INDICES_DEF(NAME, DOC)                                                                     \
  QKV_OP(.name = #NAME, .doc = DOC, QKV_INPUTS("x"), QKV_OUTPUTS("indices"),                       \
         QKV_ATTR_TABLE(arg_attrs), .shape = indices_shape, .forward = NAME##_forward)

const QkvOpDef qkv_ops_argreduce[] = {
    VALUES_DEF(max, "largest element along axis and its index (i32; first of ties, NaN wins); "
                    "gradient to the picked element"),
    VALUES_DEF(min, "smallest element along axis and its index (i32; first of ties, NaN wins); "
                    "gradient to the picked element"),
    INDICES_DEF(argmax, "index (i32) of the largest element along axis (first of ties, NaN wins)"),
    INDICES_DEF(argmin, "index (i32) of the smallest element along axis (first of ties, NaN wins)"),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

static GVariant *
arg_attrs_new(gint axis, gboolean keepdims)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(axis));
  g_variant_builder_add(&attrs, "{sv}", "keepdims", g_variant_new_boolean(keepdims));
  return g_variant_builder_end(&attrs);
}

/* A NULL input is an earlier call's failure: it is passed on, leaving the
 * first error the one the caller sees. */
static QkvValue *
values_call(const gchar *op_name, QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices,
            GError **error)
{
  if (indices != NULL)
    *indices = NULL;
  if (x == NULL)
    return NULL;
  QkvNode *node =
      qkv_graph_add_node(qkv_value_graph(x), op_name, &x, 1, arg_attrs_new(axis, keepdims), error);
  if (node == NULL)
    return NULL;
  if (indices != NULL)
    *indices = qkv_node_output(node, 1);
  return qkv_node_output(node, 0);
}

QkvValue *
qkv_max(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error)
{
  if (indices != NULL) /* a failure leaves out-values NULL */
    *indices = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return values_call("max", x, axis, keepdims, indices, error);
}

QkvValue *
qkv_min(QkvValue *x, gint axis, gboolean keepdims, QkvValue **indices, GError **error)
{
  if (indices != NULL) /* a failure leaves out-values NULL */
    *indices = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return values_call("min", x, axis, keepdims, indices, error);
}

QkvValue *
qkv_argmax(QkvValue *x, gint axis, gboolean keepdims, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  return qkv_op_call("argmax", &x, 1, arg_attrs_new(axis, keepdims), error);
}

QkvValue *
qkv_argmin(QkvValue *x, gint axis, gboolean keepdims, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (x == NULL)
    return NULL;
  return qkv_op_call("argmin", &x, 1, arg_attrs_new(axis, keepdims), error);
}
