/* kv_cache.c: "kv_cache_append", the key/value cache of incremental
 * decoding. Its input 0 is a graph state (qkv_graph_state()) that the
 * kernel writes in place: the plan keeps the state across runs and runs
 * this node after every other reader of the cache (src/plan/state.c).
 * And "positions", the token positions a cached graph feeds to position
 * embeddings and to the causal mask of attention over the cache.
 *
 * An inference op: it has no gradient rule, so autodiff refuses a loss that
 * depends on it through a differentiable input. */
#include "ops-common.h"

#include <string.h>
#include "error-private.h"

static gboolean
kv_cache_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *cache = &ctx->in_shapes[0], *fresh = &ctx->in_shapes[1];
  const QkvShape *pos = &ctx->in_shapes[2];
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32 || ctx->in_dtypes[2] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE,
                           "expected cache f32, new f32 and positions i32");
  if (cache->rank != 4 || fresh->rank != 4 || pos->rank != 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "expected cache (B, H, T_max, d), new (B, H, t, d), positions (B)");
  if (fresh->dims[0] != cache->dims[0] || fresh->dims[1] != cache->dims[1] ||
      fresh->dims[3] != cache->dims[3] || pos->dims[0] != cache->dims[0])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "new (B, H, t, d) and positions (B) must match the cache's B, H and d");
  if (fresh->dims[2] > cache->dims[2])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "%" G_GINT64_FORMAT " new slots do not fit a cache of %" G_GINT64_FORMAT,
                           fresh->dims[2], cache->dims[2]);
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = *cache;
  ctx->out_dtypes[0] = QKV_F32;
  ctx->out_shapes[1] = *pos;
  ctx->out_dtypes[1] = QKV_I32;
  return TRUE;
}

/* Writes the new slots into the cache (the state's buffer, which the plan
 * gives this op to write). Output 0 is that same buffer in a plan (state.c
 * points it there), so a step writes only its t slots per row and head; a
 * caller that gave output 0 memory of its own gets a copy of the cache.
 * A row whose slots would not fit (only possible for positions computed in
 * the graph: the plan refuses bound or constant ones before the run) is
 * left alone and reports length 0. */
static void
kv_cache_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *cs = &ctx->in[0].shape;
  gint64 B = cs->dims[0], H = cs->dims[1], T = cs->dims[2], d = cs->dims[3];
  gint64 t = ctx->in[1].shape.dims[2];
  float *cache = (float *)ctx->in[0].data;
  const float *fresh = ctx->in[1].data;
  const gint32 *pos = ctx->in[2].data;
  gint32 *lengths = ctx->out[1].data;
  for (gint64 b = 0; b < B; b++) {
    gint64 p = pos[b];
    if (p < 0 || p + t > T) {
      lengths[b] = 0;
      continue;
    }
    for (gint64 h = 0; h < H; h++)
      memcpy(cache + ((b * H + h) * T + p) * d, fresh + (b * H + h) * t * d,
             (gsize)(t * d) * sizeof(float));
    lengths[b] = (gint32)(p + t);
  }
  if (ctx->out[0].data != cache)
    memcpy(ctx->out[0].data, cache, (gsize)(B * H * T * d) * sizeof(float));
}

/* x (B, T, …) or (T), optional starts i32 (B) → i32 (T), or (B, T) with
 * starts. T follows x's shape on every run (a plan bound to a shorter x). */
static gboolean
positions_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0];
  if (x->rank < 1 || (ctx->n_inputs > 1 && x->rank < 2))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "expected x (B, T, …) with starts, (T) or (B, T, …) without");
  gint64 t = x->rank >= 2 ? x->dims[1] : x->dims[0];
  ctx->n_outputs = 1;
  ctx->out_dtypes[0] = QKV_I32;
  if (ctx->n_inputs == 1) {
    QkvShape out = QKV_SHAPE(t);
    ctx->out_shapes[0] = out;
    return TRUE;
  }
  const QkvShape *starts = &ctx->in_shapes[1];
  if (ctx->in_dtypes[1] != QKV_I32 || starts->rank != 1 || starts->dims[0] != x->dims[0])
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "starts must be i32 (%" G_GINT64_FORMAT "), one per row of x",
                           x->dims[0]);
  QkvShape out = QKV_SHAPE(x->dims[0], t);
  ctx->out_shapes[0] = out;
  return TRUE;
}

static void
positions_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *out = &ctx->out[0].shape;
  const gint64 offset = qkv_attrs_get_int(ctx->attrs, "offset");
  const gint32 *starts = ctx->n_inputs > 1 ? ctx->in[1].data : NULL;
  gint64 rows = out->rank == 2 ? out->dims[0] : 1, t = out->dims[out->rank - 1];
  gint32 *y = ctx->out[0].data;
  for (gint64 b = 0; b < rows; b++)
    for (gint64 i = 0; i < t; i++)
      y[b * t + i] = (gint32)((starts != NULL ? starts[b] : 0) + offset + i);
}

const QkvOpDef qkv_ops_kv_cache[] = {
    QKV_OP(.name = "kv_cache_append",
           .doc = "writes new (B, H, t, d) into the cache state (B, H, T_max, d) at [b, :, "
                  "positions[b] : positions[b] + t] in place; outputs 0 the cache after the write "
                  "(B, H, T_max, d), in a plan the state's own buffer (no copy: read it only "
                  "through this output to see the write), and 1 the valid lengths positions + t, "
                  "i32 (B), for masked "
                  "attention. Input 0 must be a graph state; positions past T_max are refused "
                  "at run time. Inference only: no gradient.",
           QKV_INPUTS("cache", "new", "positions"), QKV_OUTPUTS("keys", "lengths"),
           .shape = kv_cache_shape, .forward = kv_cache_forward),
    QKV_OP(.name = "positions",
           .doc = "i32 positions of x's tokens: without starts (T) offset + i, T = x's axis 1 "
                  "(axis 0 for rank 1); with starts i32 (B) the positions (B, T) starts[b] + "
                  "offset + i. Only x's shape is read. No gradient.",
           QKV_INPUTS_OPT(1, "x", "starts"), QKV_OUTPUTS("positions"),
           QKV_ATTRS(QKV_INT_ATTR("offset", 0, "added to every position")),
           .shape = positions_shape, .forward = positions_forward),
    QKV_OPS_END,
};

QkvValue *
qkv_kv_cache_append(QkvValue *cache, QkvValue *fresh, QkvValue *positions, QkvValue **lengths,
                    GError **error)
{
  if (lengths != NULL) /* a failure leaves out-values NULL */
    *lengths = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("kv_cache_append", error, cache, fresh, positions);
  if (qkv_value_kind(cache) != QKV_VALUE_STATE) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "kv_cache_append: the cache must be a graph state (qkv_graph_state)");
    return NULL;
  }
  QkvValue *inputs[] = {cache, fresh, positions};
  QkvNode *node =
      qkv_graph_add_node(qkv_value_graph(cache), "kv_cache_append", inputs, 3, NULL, error);
  if (node == NULL)
    return NULL;
  if (lengths != NULL)
    *lengths = qkv_node_output(node, 1);
  return qkv_node_output(node, 0);
}

QkvValue *
qkv_positions(QkvValue *x, QkvValue *starts, gint64 offset, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("positions", error, x);
  QkvValue *inputs[] = {x, starts};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "offset", g_variant_new_int64(offset));
  return qkv_op_call("positions", inputs, starts != NULL ? 2 : 1, g_variant_builder_end(&attrs),
                     error);
}
