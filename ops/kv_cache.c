/* kv_cache.c: "kv_cache_append", the key/value cache of incremental
 * decoding. Its input 0 is a graph state (qkv_graph_state()) that the
 * kernel writes in place: the plan keeps the state across runs and runs
 * this node after every other reader of the cache (src/plan/state.c).
 * "kv_cache_attention", the causal attention of new queries over the
 * filled part of a cache (and, when asked, its weights). And "positions",
 * the token positions a cached graph feeds to position embeddings and to
 * the causal mask of attention over the cache.
 *
 * An inference op: it has no gradient rule, so autodiff refuses a loss that
 * depends on it through a differentiable input. */
#include "attention-common.h"

#include <math.h>
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

/* q (B, H, t, d), keys (B, H, T_max, d), values (B, H, T_max, d_v),
 * positions i32 (B) → (B, H, t, d_v), and with the attribute weights the
 * weights (B, H, t, T_max). */
static gboolean
cache_attention_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *q = &ctx->in_shapes[0], *k = &ctx->in_shapes[1], *v = &ctx->in_shapes[2];
  const QkvShape *pos = &ctx->in_shapes[3];
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32 ||
      ctx->in_dtypes[2] != QKV_F32 || ctx->in_dtypes[3] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE,
                           "expected q, keys and values f32 and positions i32");
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || pos->rank != 1 || k->dims[0] != q->dims[0] ||
      k->dims[1] != q->dims[1] || k->dims[3] != q->dims[3] || v->dims[0] != q->dims[0] ||
      v->dims[1] != q->dims[1] || v->dims[2] != k->dims[2] || pos->dims[0] != q->dims[0] ||
      k->dims[2] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "expected q (B, H, t, d), keys (B, H, T_max, d), values (B, H, "
                           "T_max, d_v) with T_max ≥ 1 and positions (B)");
  ctx->n_outputs = 1;
  QkvShape out = QKV_SHAPE(q->dims[0], q->dims[1], q->dims[2], v->dims[3]);
  ctx->out_shapes[0] = out;
  ctx->out_dtypes[0] = QKV_F32;
  if (qkv_attrs_get_bool(ctx->attrs, "weights")) {
    QkvShape w = QKV_SHAPE(q->dims[0], q->dims[1], q->dims[2], k->dims[2]);
    ctx->n_outputs = 2;
    ctx->out_shapes[1] = w;
    ctx->out_dtypes[1] = QKV_F32;
  }
  return TRUE;
}

/* One problem's scores (t × T_max) per thread; none with the weights
 * output, where each problem's scores are its own weights rows. */
static gsize
cache_attention_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  if (qkv_attrs_get_bool(ctx->attrs, "weights"))
    return 0;
  return (gsize)MAX(n_threads, 1) * (gsize)ctx->in_shapes[0].dims[2] *
         (gsize)ctx->in_shapes[1].dims[2] * sizeof(float);
}

typedef struct {
  const float *q, *k, *v;
  const gint32 *pos;
  float *out, *scratch;
  float *weights; /* (B, H, t, T_max), or NULL: not asked for */
  gint64 H, t, T, d, dv;
  float scale;
} CacheAttentionJob;

/* Problems (batch element, head) [begin, end): query i of row b sits at
 * position pos[b] + i and sees the slots before pos[b] + i + 1, so the
 * problem reads only the first n = pos[b] + t slots (all T_max past the
 * end): that makes a step cost O(filled) rather than O(T_max). Each score
 * row is masked_softmax's row (qkv_attn_softmax_row, the numbers of
 * masked_softmax's kernel): the softmax of the slots the query sees, the
 * others exactly 0, so the result is masked_softmax(scale · q keysᵀ,
 * pos + i + 1) values, and the weights are those masked_softmax rows,
 * exactly 0 at the slots past n that were not read. A row whose query sees
 * no slot at all (a position the append refused) makes the problem read
 * all T_max slots, where, as in masked_softmax, its weights are uniform.
 * The scores go to scratch, or with the weights output straight into its
 * rows (stride T_max). The products are qkv_sgemm's, so they follow the
 * plan's precision (bf16 rounds their operands) as matmul's do. */
static void
cache_attention_problems(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const CacheAttentionJob *j = user_data;
  const gint64 t = j->t, T = j->T, d = j->d, dv = j->dv;
  for (gint64 bh = begin; bh < end; bh++) {
    gint64 p = j->pos[bh / j->H];
    gint64 n = p + 1 <= 0 ? T : MIN(p + t, T);
    gint64 ld = j->weights != NULL ? T : n;
    float *s = j->weights != NULL ? j->weights + bh * t * T : j->scratch + thread * t * T;
    const float *q = j->q + bh * t * d, *k = j->k + bh * T * d, *v = j->v + bh * T * dv;
    qkv_sgemm(FALSE, TRUE, t, n, d, j->scale, q, d, k, d, 0.0f, s, ld, 1);
    for (gint64 i = 0; i < t; i++) {
      float *row = s + i * ld;
      qkv_attn_softmax_row(row, row, n, MIN(p + i + 1, n));
      for (gint64 x = n; x < ld; x++)
        row[x] = 0.0f;
    }
    qkv_sgemm(FALSE, FALSE, t, dv, n, 1.0f, s, ld, v, dv, 0.0f, j->out + bh * t * dv, dv, 1);
  }
}

static void
cache_attention_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *qs = &ctx->in[0].shape, *vs = &ctx->in[2].shape;
  CacheAttentionJob job = {
      .q = ctx->in[0].data,
      .k = ctx->in[1].data,
      .v = ctx->in[2].data,
      .pos = ctx->in[3].data,
      .out = ctx->out[0].data,
      .scratch = ctx->scratch,
      .weights = ctx->n_outputs > 1 ? ctx->out[1].data : NULL,
      .H = qs->dims[1],
      .t = qs->dims[2],
      .T = vs->dims[2],
      .d = qs->dims[3],
      .dv = vs->dims[3],
      .scale = (float)qkv_attrs_get_float(ctx->attrs, "scale"),
  };
  gint64 problems = qs->dims[0] * job.H, filled = 1;
  for (gint64 b = 0; b < qs->dims[0]; b++)
    filled = MAX(filled, MIN((gint64)job.pos[b] + job.t, job.T));
  gint64 work = problems * job.t * filled * (job.d + job.dv + 4);
  qkv_parallel_for(qkv_kernel_threads(ctx, work), problems, cache_attention_problems, &job);
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
    QKV_OP(.name = "kv_cache_attention",
           .doc = "causal attention of new queries over a key/value cache: query i of row b "
                  "(at position positions[b] + i) attends to the slots [0, positions[b] + i + "
                  "1) of keys and values only, so the cost follows the filled length, not "
                  "T_max. q (B, H, t, d), keys (B, H, T_max, d), values (B, H, T_max, d_v) "
                  "(kv_cache_append's outputs 0), positions i32 (B) → (B, H, t, d_v); the "
                  "same as masked_softmax(scale · q keysᵀ, positions + 1 + i) values. Output 1 "
                  "(only with weights) is that masked softmax, the weights (B, H, t, T_max): "
                  "written for the filled slots, exactly 0 at the slots a query does not see. "
                  "Inference only: no gradient.",
           QKV_INPUTS("q", "keys", "values", "positions"), QKV_OUTPUTS("out", "weights"),
           QKV_ATTRS(QKV_FLOAT_ATTR("scale", 1.0, "multiplies q · k"),
                     QKV_BOOL_ATTR("weights", FALSE,
                                   "also output the attention weights (B, H, t, T_max) "
                                   "(the slots past the filled ones are only zeroed)")),
           .shape = cache_attention_shape, .forward = cache_attention_forward,
           .scratch_size = cache_attention_scratch),
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
