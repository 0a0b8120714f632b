/* nw.c: Nadaraya-Watson attention pooling with a learned kernel width. */
#include <qkv/qkv.h>
#include <qkv/qkv-builders.h>
#include "error-private.h"

static QkvValue *
nw_regression(QkvGraph *graph, QkvParams *params, const gchar *w_name, QkvValue *queries,
              QkvValue *keys, QkvValue *values, QkvValue *mask, guint64 seed, QkvValue **weights,
              GError **error)
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
  const gint last = 1;
  /* softmax(-((q - k) w)² / 2) over the keys, then the weighted values */
  QkvValue *w = qkv_graph_param(graph, params, w_name, error);
  QkvValue *q = qkv_unsqueeze(queries, last, error); /* (n, 1) against keys (n, m) */
  QkvValue *scores =
      qkv_scale(qkv_square(qkv_mul(qkv_sub(q, keys, error), w, error), error), -0.5, error);
  QkvValue *attention =
      mask ? qkv_masked_softmax_full(scores, NULL, mask, QKV_MASK_BOOLEAN, FALSE, error)
           : qkv_softmax(scores, error);
  QkvValue *out = qkv_sum(qkv_mul(attention, values, error), &last, 1, FALSE, error);
  *weights = attention;
  return out;
}

QkvValue *
qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix, QkvValue *queries,
                        QkvValue *keys, QkvValue *values, guint64 seed, QkvValue **weights,
                        GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_nw_regression_masked(graph, params, prefix, queries, keys, values, NULL, seed,
                                        weights, error);
}

QkvValue *
qkv_build_nw_regression_masked(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                               QkvValue *queries, QkvValue *keys, QkvValue *values, QkvValue *mask,
                               guint64 seed, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(graph != NULL && params != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  /* errors chain: after an earlier failure, add nothing */
  if (queries == NULL || keys == NULL || values == NULL || (error != NULL && *error != NULL))
    return NULL;
  const QkvShape *qs = qkv_value_shape(queries);
  if (qs->rank != 1) {
    g_autofree gchar *sh = qkv_shape_to_string(qs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_nw_regression: queries must have shape (n), got %s", sh);
    return NULL;
  }
  /* prefix is glued on, not a scope: "nw." gives "nw.w", "" gives "w" */
  g_autofree gchar *w_name = g_strconcat(prefix ? prefix : "", "w", NULL);
  /* all or nothing, as every builder: a builder step over graph and params */
  QkvBuilder b = {.graph = graph, .params = params};
  QkvBuilderMark mark;
  qkv_builder_begin(&b, &mark);
  QkvValue *attention = NULL;
  QkvValue *out = qkv_builder_end(
      &b, &mark,
      nw_regression(graph, params, w_name, queries, keys, values, mask, seed, &attention, error));
  if (out != NULL && weights != NULL)
    *weights = attention;
  return out;
}
