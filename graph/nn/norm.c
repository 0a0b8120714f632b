/* norm.c: nn.LayerNorm and nn.RMSNorm as graph builders, with PyTorch's
 * parameter names ("weight", "bias") and initial values (ones, zeros). */
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "nn/builder-internal.h"
#include "error-private.h"

static gint64
last_dim(QkvValue *x)
{
  const QkvShape *s = qkv_value_shape(x);
  return s->rank > 0 ? s->dims[s->rank - 1] : 0;
}

static gboolean
check_norm(const gchar *builder, QkvValue *x, double eps, GError **error)
{
  if (!builder_check_positive(builder, "x's last axis", last_dim(x), error))
    return FALSE;
  if (eps >= 0.0)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: eps is %g, it must be >= 0",
              builder, eps);
  return FALSE;
}

/* A constant vector of d copies of value (layer_norm takes gamma and beta
 * as inputs; a LayerNorm without them multiplies by ones and adds zeros). */
static QkvValue *
constant_vector(QkvGraph *graph, gint64 d, float value, GError **error)
{
  QkvShape s = QKV_SHAPE(d);
  g_autoptr(QkvTensor) t = qkv_tensor_try_new(QKV_F32, &s, error);
  if (t == NULL)
    return NULL;
  qkv_tensor_fill(t, value);
  return qkv_graph_constant(graph, t, error);
}

QkvValue *
qkv_build_layer_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps,
                     gboolean elementwise_affine, gboolean bias, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!check_norm("qkv_build_layer_norm", x, eps, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  const gint64 d = last_dim(x);
  QkvShape s = QKV_SHAPE(d);
  qkv_builder_push(b, name, error);
  QkvValue *gamma = elementwise_affine ? qkv_build_param(b, "weight", &s, "ones", 0, error)
                                       : constant_vector(b->graph, d, 1.0f, error);
  QkvValue *beta = elementwise_affine && bias ? qkv_build_param(b, "bias", &s, "zeros", 0, error)
                                              : constant_vector(b->graph, d, 0.0f, error);
  QkvValue *y = gamma && beta ? qkv_layer_norm(x, gamma, beta, eps, error) : NULL;
  qkv_builder_pop(b);
  return qkv_builder_end(b, &mark, y);
}

QkvValue *
qkv_build_rms_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!check_norm("qkv_build_rms_norm", x, eps, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvShape s = QKV_SHAPE(last_dim(x));
  qkv_builder_push(b, name, error);
  QkvValue *weight = qkv_build_param(b, "weight", &s, "ones", 0, error);
  QkvValue *y = weight ? qkv_rms_norm(x, weight, eps, error) : NULL;
  qkv_builder_pop(b);
  return qkv_builder_end(b, &mark, y);
}
