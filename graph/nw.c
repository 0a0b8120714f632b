/* nw.c: Nadaraya-Watson attention pooling with a learned kernel width. */
#include <qkv/qkv.h>
#include <qkv/qkv-builders.h>

static QkvValue *
nw_regression(QkvGraph *graph, QkvParams *params, const gchar *w_name, QkvValue *queries,
              QkvValue *keys, QkvValue *values, guint64 seed, QkvValue **weights, GError **error)
{
  if (qkv_params_lookup(params, w_name) == NULL) {
    QkvShape s = QKV_SHAPE(1);
    QkvParam *p = qkv_params_add(params, w_name, &s, error);
    if (p == NULL)
      return NULL;
    GRand *rand = g_rand_new_with_seed((guint32)seed);
    qkv_tensor_f32(qkv_param_value(p))[0] = (float)g_rand_double(rand);
    g_rand_free(rand);
  }
  const QkvShape *qs = qkv_value_shape(queries);
  QkvShape column = QKV_SHAPE(qs->dims[0], 1);
  QkvValue *w = qkv_graph_param(graph, params, w_name, error);
  QkvValue *q = w ? qkv_reshape(queries, &column, error) : NULL;
  QkvValue *diff = q ? qkv_sub(q, keys, error) : NULL;
  QkvValue *scaled = diff ? qkv_mul(diff, w, error) : NULL;
  QkvValue *square = scaled ? qkv_mul(scaled, scaled, error) : NULL;
  QkvValue *scores = square ? qkv_scale(square, -0.5, error) : NULL;
  QkvValue *attention = scores ? qkv_softmax(scores, error) : NULL;
  QkvValue *weighted = attention ? qkv_mul(attention, values, error) : NULL;
  gint last = 1;
  QkvValue *out = weighted ? qkv_sum(weighted, &last, 1, FALSE, error) : NULL;
  *weights = attention;
  return out;
}

QkvValue *
qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix, QkvValue *queries,
                        QkvValue *keys, QkvValue *values, guint64 seed, QkvValue **weights,
                        GError **error)
{
  g_return_val_if_fail(graph != NULL && params != NULL && queries != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  const QkvShape *qs = qkv_value_shape(queries);
  if (qs->rank != 1) {
    g_autofree gchar *sh = qkv_shape_to_string(qs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_nw_regression: queries must have shape (n), got %s", sh);
    return NULL;
  }
  g_autofree gchar *w_name = g_strconcat(prefix ? prefix : "", "w", NULL);
  /* All or nothing, as the QkvBuilder builders (it has no QkvBuilder). */
  QkvGraphMark graph_mark;
  QkvParamsMark params_mark;
  qkv_graph_mark(graph, &graph_mark);
  qkv_params_mark(params, &params_mark);
  QkvValue *attention = NULL;
  QkvValue *out =
      nw_regression(graph, params, w_name, queries, keys, values, seed, &attention, error);
  if (out == NULL) {
    qkv_graph_rollback(graph, &graph_mark);
    qkv_params_rollback(params, &params_mark);
  } else if (weights != NULL) {
    *weights = attention;
  }
  return out;
}
