/* embedding.c: "embedding" (a table lookup) and "embedding_backward" (the
 * scatter-add of its gradient into the table).
 *
 * An id outside [0, V) fails the run, naming its position and value, unless
 * the node has zero_out_of_range (for a padding id past the vocabulary, say):
 * then it selects a zero row and receives no gradient. embedding_backward
 * skips such ids. Neither reads or writes out of bounds.
 */
#include "ops-common.h"
#include "error-private.h"

static gboolean
embedding_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *ids = &ctx->in_shapes[0], *weight = &ctx->in_shapes[1];
  if (ctx->in_dtypes[0] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "ids must be i32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "weight must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[1]));
  if (weight->rank != 2)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "weight must be (V, D), got rank %d",
                           weight->rank);
  if (ids->rank + 1 > QKV_MAX_RANK)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "ids of rank %d would give an output of rank more than %d", ids->rank,
                           QKV_MAX_RANK);
  QkvShape *out = &ctx->out_shapes[0];
  *out = *ids;
  out->dims[out->rank++] = weight->dims[1];
  return TRUE;
}

typedef struct {
  const gint32 *ids;
  const float *src; /* weight, or dy for the backward */
  float *dst;       /* y, or dweight for the backward */
  gint64 v, d, n;
  QkvBadIndex *bad; /* the lookup's, unless zero_out_of_range */
} EmbeddingJob;

/* Output rows [begin, end): a row of the table, or zeros for a bad id. */
static void
embedding_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const EmbeddingJob *j = user_data;
  const gint64 v = j->v, d = j->d;
  for (gint64 i = begin; i < end; i++) {
    gint64 id = j->ids[i];
    if (G_LIKELY(id >= 0 && id < v)) {
      memcpy(j->dst + i * d, j->src + id * d, (gsize)d * sizeof(float));
    } else {
      memset(j->dst + i * d, 0, (gsize)d * sizeof(float));
      if (j->bad != NULL)
        qkv_bad_index_note(j->bad, i);
    }
  }
}

static void
embedding_forward(const QkvKernelCtx *ctx)
{
  const gint32 *ids = ctx->in[0].data;
  const float *weight = ctx->in[1].data;
  float *y = ctx->out[0].data;
  gint64 n = qkv_shape_numel(&ctx->in[0].shape);
  gint64 v = ctx->in[1].shape.dims[0], d = ctx->in[1].shape.dims[1];
  if (d == 0)
    return;
  QkvBadIndex bad;
  qkv_bad_index_init(&bad);
  gboolean zero = qkv_attrs_get_bool(ctx->attrs, "zero_out_of_range");
  EmbeddingJob job = {ids, weight, y, v, d, 0, zero ? NULL : &bad};
  qkv_parallel_for(qkv_kernel_threads(ctx, n * d), n, embedding_rows, &job);
  qkv_bad_index_report(ctx, &bad, "id", ids, &ctx->in[0].shape, v, -1);
}

static gboolean
embedding_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[1])
    return TRUE;
  gint64 v = qkv_value_shape(g->inputs[1])->dims[0];
  g->in_grads[1] = qkv_embedding_backward(g->out_grads[0], g->inputs[0], v, error);
  return g->in_grads[1] != NULL;
}

static gboolean
embedding_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *ids = &ctx->in_shapes[1];
  gint64 v = qkv_attrs_get_int(ctx->attrs, "num_embeddings");
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (ctx->in_dtypes[1] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "ids must be i32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[1]));
  if (v < 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "num_embeddings must not be negative, got %" G_GINT64_FORMAT, v);
  gboolean fits = dy->rank == ids->rank + 1;
  for (gint i = 0; fits && i < ids->rank; i++)
    fits = dy->dims[i] == ids->dims[i];
  if (!fits)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy must have the shape of ids plus a last axis D");
  ctx->out_shapes[0] = QKV_SHAPE(v, dy->dims[dy->rank - 1]);
  return TRUE;
}

/* Columns [c0, c1) of dweight: zeroed, then every token's share added in
 * token order. */
static void
embedding_backward_columns(gint64 c0, gint64 c1, gint thread, gpointer user_data)
{
  const EmbeddingJob *j = user_data;
  const gint64 v = j->v, d = j->d;
  float *dw = j->dst;
  for (gint64 r = 0; r < v; r++)
    memset(dw + r * d + c0, 0, (gsize)(c1 - c0) * sizeof(float));
  for (gint64 i = 0; i < j->n; i++) {
    gint64 id = j->ids[i];
    if (id < 0 || id >= v)
      continue;
    const float *src = j->src + i * d;
    float *dst = dw + id * d;
    for (gint64 c = c0; c < c1; c++)
      dst[c] += src[c];
  }
}

/* dweight[ids[i]] += dy[i]. Several tokens may share an id, so threads split
 * the D columns between them: each thread owns whole columns and no two
 * threads ever write the same element, and the sum over tokens keeps one
 * order whatever the thread count (deterministic results). */
static void
embedding_backward_forward(const QkvKernelCtx *ctx)
{
  const float *dy = ctx->in[0].data;
  const gint32 *ids = ctx->in[1].data;
  float *dw = ctx->out[0].data;
  gint64 n = qkv_shape_numel(&ctx->in[1].shape);
  gint64 v = ctx->out[0].shape.dims[0], d = ctx->out[0].shape.dims[1];
  /* Each thread's columns should at least fill a cache line. */
  gint n_threads = (gint)MAX(1, MIN((gint64)qkv_kernel_threads(ctx, (n + v) * d), d / 16));
  EmbeddingJob job = {ids, dy, dw, v, d, n, NULL};
  qkv_parallel_for(n_threads, d, embedding_backward_columns, &job);
}

/* The op is linear in dy: its gradient is the lookup of the incoming
 * gradient's rows, with zero rows for the ids it skipped. */
static gboolean
embedding_backward_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "zero_out_of_range", g_variant_new_boolean(TRUE));
  QkvValue *inputs[] = {g->inputs[1], g->out_grads[0]};
  g->in_grads[0] = qkv_op_call("embedding", inputs, 2, g_variant_builder_end(&attrs), error);
  return g->in_grads[0] != NULL;
}

const QkvOpDef qkv_ops_embedding[] = {
    QKV_OP(.name = "embedding",
           .doc = "rows of weight (V, D) picked by i32 ids of any shape → (…, D); an id outside "
                  "[0, V) fails the run, or with zero_out_of_range gives a zero row",
           QKV_INPUTS("ids", "weight"), QKV_OUTPUTS("y"), QKV_ATTRS(QKV_ZERO_OUT_OF_RANGE_ATTR),
           .no_grad_inputs = 1 << 0, .shape = embedding_shape, .forward = embedding_forward,
           .gradient = embedding_grad),
    QKV_OP(.name = "embedding_backward",
           .doc = "scatter-add the rows of dy (…, D) into a (num_embeddings, D) gradient at ids; "
                  "ids outside [0, num_embeddings) are skipped",
           QKV_INPUTS("dy", "ids"), QKV_OUTPUTS("dweight"),
           QKV_ATTRS(
               QKV_REQUIRED_ATTR("num_embeddings", INT, "V, the number of rows of the table")),
           .no_grad_inputs = 1 << 1, .shape = embedding_backward_shape,
           .forward = embedding_backward_forward, .gradient = embedding_backward_grad),
    QKV_OPS_END,
};

QkvValue *
qkv_embedding(QkvValue *ids, QkvValue *weight, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("embedding", error, ids, weight);
  QkvValue *inputs[] = {ids, weight};
  return qkv_op_call("embedding", inputs, 2, NULL, error);
}

QkvValue *
qkv_embedding_backward(QkvValue *dy, QkvValue *ids, gint64 num_embeddings, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("embedding_backward", error, dy, ids);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "num_embeddings", g_variant_new_int64(num_embeddings));
  QkvValue *inputs[] = {dy, ids};
  return qkv_op_call("embedding_backward", inputs, 2, g_variant_builder_end(&attrs), error);
}
