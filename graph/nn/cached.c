/* cached.c: a builder's cached mode (QkvBuilderCache, qkv-builders.h):
 * causal self-attention over key/value caches kept in graph states, and the
 * token positions that position embeddings read. The attention is written
 * with plain ops (projections, kv_cache_append, kv_cache_attention over the
 * filled slots, which also gives the weights when they are asked for)
 * rather than the fused multi_head_attention op, because its keys and
 * values come from the cache, not from its inputs. */
#include <math.h>
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "nn/builder-internal.h"
#include "error-private.h"

/* FALSE with QKV_ERROR_INVALID_ARGUMENT naming me unless b's cache has
 * positions and max_len ≥ 1. */
static gboolean
check_cache(const QkvBuilder *b, const gchar *me, GError **error)
{
  if (b->cache->positions != NULL && b->cache->max_len >= 1)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: b->cache needs positions (i32 (B)) and max_len ≥ 1 (got %s, %" G_GINT64_FORMAT
              ")",
              me, b->cache->positions != NULL ? "positions" : "NULL", b->cache->max_len);
  return FALSE;
}

QkvValue *
qkv_build_positions(QkvBuilder *b, QkvValue *tokens, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (tokens == NULL)
    return NULL;
  if (b->cache == NULL)
    return qkv_positions(tokens, NULL, 0, error);
  if (!check_cache(b, "qkv_build_positions", error))
    return NULL;
  return qkv_positions(tokens, b->cache->positions, 0, error);
}

gboolean
builder_caches_attention(const QkvBuilder *b, QkvValue *queries, QkvValue *keys, QkvValue *values,
                         const QkvMhaOptions *o)
{
  return b->cache != NULL && o->causal && queries == keys && keys == values;
}

gboolean
builder_check_cached_attention(const QkvBuilder *b, const QkvMhaOptions *o, GError **error)
{
  if (!check_cache(b, "qkv_build_mha", error))
    return FALSE;
  if (o->valid_lens == NULL && o->mask == NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "qkv_build_mha: a cached causal self-attention masks by position; valid_lens and "
              "a mask are not supported in cached mode");
  return FALSE;
}

/* x · wᵀ (+ bias) */
static QkvValue *
project(QkvValue *x, QkvValue *w, QkvValue *bias, GError **error)
{
  QkvValue *y = qkv_matmul(x, w, FALSE, TRUE, error);
  return bias != NULL ? qkv_add(y, bias, error) : y;
}

/* (B, t, heads · dh) → (B, heads, t, dh); one token is a reshape. */
static QkvValue *
split_heads(QkvValue *y, gint64 B, gint64 t, gint heads, gint64 dh, GError **error)
{
  if (t == 1) {
    QkvShape s = QKV_SHAPE(B, heads, 1, dh);
    return qkv_reshape(y, &s, error);
  }
  QkvShape s = QKV_SHAPE(B, t, heads, dh);
  const gint perm[] = {0, 2, 1, 3};
  return qkv_permute(qkv_reshape(y, &s, error), perm, 4, error);
}

/* (B, heads, t, dh) → (B, t, heads · dh) */
static QkvValue *
merge_heads(QkvValue *y, gint64 B, gint64 t, gint64 d, GError **error)
{
  QkvShape s = QKV_SHAPE(B, t, d);
  if (t == 1)
    return qkv_reshape(y, &s, error);
  const gint perm[] = {0, 2, 1, 3};
  return qkv_reshape(qkv_permute(y, perm, 4, error), &s, error);
}

/* The state "<scope>.<what>" of shape. */
static QkvValue *
cache_state(QkvBuilder *b, const gchar *what, const QkvShape *shape, GError **error)
{
  if (error != NULL && *error != NULL)
    return NULL;
  g_autofree gchar *name = qkv_builder_scoped_name(b, what);
  return qkv_graph_state(b->graph, name, QKV_F32, shape, error);
}

/* The kv_cache_attention op (ops/kv_cache.c): q over the filled slots of
 * keys and values, which must be kv_cache_append's outputs 0 so that the
 * plan runs it after the appends. With weights non-NULL it also gives the
 * attention weights (B, heads, t, max_len), computed over the same filled
 * slots and 0 past them: a step costs in proportion to the tokens so far,
 * not to max_len, whether or not the weights are asked for. */
static QkvValue *
cache_attention(QkvValue *q, QkvValue *keys, QkvValue *values, QkvValue *pos, double scale,
                QkvValue **weights, GError **error)
{
  if ((error != NULL && *error != NULL) || q == NULL || keys == NULL || values == NULL)
    return NULL;
  QkvValue *inputs[] = {q, keys, values, pos};
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "scale", g_variant_new_double(scale));
  g_variant_builder_add(&attrs, "{sv}", "weights", g_variant_new_boolean(weights != NULL));
  QkvNode *node = qkv_graph_add_node(qkv_value_graph(q), "kv_cache_attention", inputs, 4,
                                     g_variant_builder_end(&attrs), error);
  if (node == NULL)
    return NULL;
  if (weights != NULL)
    *weights = qkv_node_output(node, 1);
  return qkv_node_output(node, 0);
}

QkvValue *
builder_cached_self_attention(QkvBuilder *b, QkvValue *x, gint64 num_hiddens, gint heads,
                              QkvValue *const *w, QkvValue *const *bias, QkvValue **weights,
                              GError **error)
{
  const QkvShape *xs = qkv_value_shape(x);
  if (xs->rank != 3) {
    g_autofree gchar *shape = qkv_shape_to_string(xs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_mha: cached self-attention takes x (B, t, d), got %s", shape);
    return NULL;
  }
  const gint64 B = xs->dims[0], t = xs->dims[1], dh = num_hiddens / heads;
  QkvShape cs = QKV_SHAPE(B, heads, b->cache->max_len, dh);
  QkvValue *pos = b->cache->positions;
  QkvValue *q = split_heads(project(x, w[0], bias ? bias[0] : NULL, error), B, t, heads, dh, error);
  QkvValue *k = split_heads(project(x, w[1], bias ? bias[1] : NULL, error), B, t, heads, dh, error);
  QkvValue *v = split_heads(project(x, w[2], bias ? bias[2] : NULL, error), B, t, heads, dh, error);
  QkvValue *keys = qkv_kv_cache_append(cache_state(b, "k_cache", &cs, error), k, pos, NULL, error);
  QkvValue *values =
      qkv_kv_cache_append(cache_state(b, "v_cache", &cs, error), v, pos, NULL, error);
  /* reads only the filled slots of each row's caches: a step costs in
   * proportion to the tokens so far, not to max_len */
  QkvValue *p = NULL;
  QkvValue *a = cache_attention(q, keys, values, pos, 1.0 / sqrt((double)dh),
                                weights != NULL ? &p : NULL, error);
  a = merge_heads(a, B, t, num_hiddens, error);
  QkvValue *out = project(a, w[3], bias ? bias[3] : NULL, error);
  if (out != NULL && weights != NULL)
    *weights = p;
  return out;
}

/* The input "<scope>.<what>" of shape. */
static QkvValue *
scoped_input(QkvBuilder *b, const gchar *what, const QkvShape *shape, GError **error)
{
  if (error != NULL && *error != NULL)
    return NULL;
  g_autofree gchar *name = qkv_builder_scoped_name(b, what);
  return qkv_graph_input(b->graph, name, QKV_F32, shape, error);
}

QkvValue *
builder_cross_attention_inputs(QkvBuilder *b, QkvValue *queries, QkvValue *keys, gint64 num_hiddens,
                               gint heads, QkvValue *const *w, QkvValue *const *bias,
                               const QkvMhaOptions *o, QkvValue **weights, GError **error)
{
  const QkvShape *qs = qkv_value_shape(queries), *ks = qkv_value_shape(keys);
  if (qs->rank != 3 || ks->rank != 3 || ks->dims[0] != qs->dims[0]) {
    g_autofree gchar *a = qkv_shape_to_string(qs);
    g_autofree gchar *k = qkv_shape_to_string(ks);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_mha: a cross-attention with projected inputs takes queries (B, t, d) "
                "and keys (B, n_k, d), got %s and %s",
                a, k);
    return NULL;
  }
  const gint64 B = qs->dims[0], t = qs->dims[1], dh = num_hiddens / heads;
  QkvShape kv = QKV_SHAPE(B, heads, ks->dims[1], dh);
  QkvValue *kp = scoped_input(b, "keys", &kv, error);
  QkvValue *vp = scoped_input(b, "values", &kv, error);
  QkvValue *q =
      split_heads(project(queries, w[0], bias ? bias[0] : NULL, error), B, t, heads, dh, error);
  QkvValue *s = qkv_scale(qkv_matmul(q, kp, FALSE, TRUE, error), 1.0 / sqrt((double)dh), error);
  QkvValue *p = qkv_masked_softmax_full(s, o->valid_lens, o->mask, o->mask_kind, FALSE, error);
  QkvValue *a = merge_heads(qkv_matmul(p, vp, FALSE, FALSE, error), B, t, num_hiddens, error);
  QkvValue *out = project(a, w[3], bias ? bias[3] : NULL, error);
  if (out != NULL && weights != NULL)
    *weights = p;
  return out;
}

/* The projection of x (B, n, ·) by "<name>.<proj>" (D, ·) (and its bias),
 * split into heads. */
static QkvValue *
project_param(QkvBuilder *b, const gchar *proj, QkvValue *x, gint64 num_hiddens, gint heads,
              gboolean with_bias, GError **error)
{
  const QkvShape *xs = qkv_value_shape(x);
  gint64 in = xs->dims[xs->rank - 1];
  QkvShape ws = QKV_SHAPE(num_hiddens, in), bs = QKV_SHAPE(num_hiddens);
  g_autofree gchar *wname = g_strconcat(proj, ".weight", NULL);
  g_autofree gchar *bname = g_strconcat(proj, ".bias", NULL);
  QkvValue *w = qkv_build_param(b, wname, &ws, "linear_weight", in, error);
  QkvValue *bias = with_bias ? qkv_build_param(b, bname, &bs, "linear_bias", in, error) : NULL;
  if (with_bias && bias == NULL)
    return NULL;
  return split_heads(project(x, w, bias, error), xs->dims[0], xs->dims[1], heads,
                     num_hiddens / heads, error);
}

QkvValue *
qkv_build_mha_keys_values(QkvBuilder *b, const gchar *name, QkvValue *keys, QkvValue *values,
                          gint64 num_hiddens, gint num_heads, const QkvMhaOptions *options,
                          QkvValue **projected_values, GError **error)
{
  if (projected_values != NULL) /* a failure leaves out-values NULL */
    *projected_values = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL && projected_values != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (keys == NULL || values == NULL)
    return NULL;
  if (!builder_check_heads("qkv_build_mha_keys_values", "num_heads", num_heads, "num_hiddens",
                           num_hiddens, error))
    return NULL;
  const QkvShape *ks = qkv_value_shape(keys), *vs = qkv_value_shape(values);
  if (ks->rank != 3 || vs->rank != 3 || ks->dims[0] != vs->dims[0] || ks->dims[1] != vs->dims[1]) {
    g_autofree gchar *k = qkv_shape_to_string(ks);
    g_autofree gchar *v = qkv_shape_to_string(vs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_mha_keys_values: keys and values must be (B, n_k, ·), got %s and %s", k,
                v);
    return NULL;
  }
  gboolean with_bias = options != NULL && options->bias;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  qkv_builder_push(b, name, error);
  QkvValue *k = project_param(b, "W_k", keys, num_hiddens, num_heads, with_bias, error);
  QkvValue *v =
      k ? project_param(b, "W_v", values, num_hiddens, num_heads, with_bias, error) : NULL;
  qkv_builder_pop(b);
  k = qkv_builder_end(b, &mark, v != NULL ? k : NULL);
  if (k != NULL)
    *projected_values = v;
  return k;
}
