/* layers.c: the book's building blocks — Linear, Embedding,
 * MultiHeadAttention (with or without biases), PositionWiseFFN (ReLU or
 * another activation), AddNorm — as graph builders. */
#include <math.h>
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "nn/builder-internal.h"
#include "error-private.h"

static gint64
last_dim(QkvValue *x)
{
  const QkvShape *s = qkv_value_shape(x);
  return s->rank > 0 ? s->dims[s->rank - 1] : 1;
}

/* Under the scope name: "weight" and "bias" (unless !bias), initialised as
 * weight_init and bias_init choose (NULL: the builder's choice). */
static QkvValue *
linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features, gboolean bias,
       const QkvInit *weight_init, const QkvInit *bias_init, GError **error)
{
  gint64 in = last_dim(x);
  QkvShape ws = QKV_SHAPE(out_features, in), bs = QKV_SHAPE(out_features);
  qkv_builder_push(b, name, error);
  QkvValue *w = builder_param(b, "weight", &ws, "linear_weight", in, weight_init, error);
  QkvValue *y = qkv_matmul(x, w, FALSE, TRUE, error);
  if (bias)
    y = qkv_add(y, builder_param(b, "bias", &bs, "linear_bias", in, bias_init, error), error);
  qkv_builder_pop(b);
  return y;
}

QkvValue *
qkv_build_linear_init(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                      gboolean bias, const QkvInit *weight_init, const QkvInit *bias_init,
                      GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_linear", "out_features", out_features, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *y = linear(b, name, x, out_features, bias, weight_init, bias_init, error);
  return qkv_builder_end(b, &mark, y);
}

QkvValue *
qkv_build_linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features, gboolean bias,
                 GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_linear_init(b, name, x, out_features, bias, NULL, NULL, error);
}

QkvValue *
qkv_build_embedding_init(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num, gint64 dim,
                         const QkvInit *init, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (ids == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_embedding", "num", num, error) ||
      !builder_check_positive("qkv_build_embedding", "dim", dim, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvShape ws = QKV_SHAPE(num, dim);
  qkv_builder_push(b, name, error);
  QkvValue *w = builder_param(b, "weight", &ws, "embedding", 0, init, error);
  qkv_builder_pop(b);
  return qkv_builder_end(b, &mark, qkv_embedding(ids, w, error));
}

QkvValue *
qkv_build_embedding(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num, gint64 dim,
                    GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_embedding_init(b, name, ids, num, dim, NULL, error);
}

QkvValue *
qkv_build_mha(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys, QkvValue *values,
              gint64 num_hiddens, gint num_heads, QkvValue *valid_lens, gboolean causal,
              double dropout, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_mha_masked(b, name, queries, keys, values, num_hiddens, num_heads, valid_lens,
                              NULL, QKV_MASK_BOOLEAN, causal, dropout, weights, error);
}

QkvValue *
qkv_build_mha_masked(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                     QkvValue *values, gint64 num_hiddens, gint num_heads, QkvValue *valid_lens,
                     QkvValue *mask, QkvMaskKind kind, gboolean causal, double dropout,
                     QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QkvMhaOptions options = {
      .valid_lens = valid_lens,
      .mask = mask,
      .mask_kind = kind,
      .causal = causal,
      .dropout = dropout,
  };
  return qkv_build_mha_full(b, name, queries, keys, values, num_hiddens, num_heads, &options,
                            weights, error);
}

QkvValue *
qkv_build_mha_full(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                   QkvValue *values, gint64 num_hiddens, gint num_heads,
                   const QkvMhaOptions *options, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (queries == NULL || keys == NULL || values == NULL)
    return NULL;
  const QkvMhaOptions none = {0}, *o = options != NULL ? options : &none;
  if (!builder_check_heads("qkv_build_mha", "num_heads", num_heads, "num_hiddens", num_hiddens,
                           error) ||
      !builder_check_dropout("qkv_build_mha", "dropout", o->dropout, error))
    return NULL;
  gboolean cached = builder_caches_attention(b, queries, keys, values, o);
  gboolean cross = b->cache != NULL && b->cache->cross_inputs && keys != queries;
  if (cached && !builder_check_cached_attention(b, o, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  const gchar *proj[] = {"W_q", "W_k", "W_v", "W_o"};
  gint64 in[] = {last_dim(queries), last_dim(keys), last_dim(values), num_hiddens};
  QkvValue *w[4] = {NULL}, *bias[4] = {NULL};
  QkvShape bs = QKV_SHAPE(num_hiddens);
  qkv_builder_push(b, name, error);
  for (int i = 0; i < 4; i++) {
    QkvShape ws = QKV_SHAPE(num_hiddens, in[i]);
    g_autofree gchar *wname = g_strconcat(proj[i], ".weight", NULL);
    w[i] = qkv_build_param(b, wname, &ws, "linear_weight", in[i], error);
  }
  for (int i = 0; o->bias && i < 4; i++) {
    g_autofree gchar *bname = g_strconcat(proj[i], ".bias", NULL);
    bias[i] = qkv_build_param(b, bname, &bs, "linear_bias", in[i], error);
  }
  QkvValue *attention_weights = NULL;
  QkvValue *out = NULL;
  if (cached && (!o->bias || (bias[0] && bias[1] && bias[2] && bias[3])))
    out =
        builder_cached_self_attention(b, queries, num_hiddens, num_heads, w, o->bias ? bias : NULL,
                                      weights ? &attention_weights : NULL, error);
  else if (cross && (!o->bias || (bias[0] && bias[1] && bias[2] && bias[3])))
    out = builder_cross_attention_inputs(b, queries, keys, num_hiddens, num_heads, w,
                                         o->bias ? bias : NULL, o,
                                         weights ? &attention_weights : NULL, error);
  else if (!o->bias || (bias[0] && bias[1] && bias[2] && bias[3]))
    out = qkv_multi_head_attention_masked(queries, keys, values, w[0], w[1], w[2], w[3],
                                          o->bias ? bias : NULL, num_heads, o->valid_lens, o->mask,
                                          o->mask_kind, o->causal, o->dropout,
                                          weights ? &attention_weights : NULL, error);
  qkv_builder_pop(b);
  out = qkv_builder_end(b, &mark, out);
  if (out != NULL && weights != NULL)
    *weights = attention_weights;
  return out;
}

QkvValue *
qkv_build_ffn(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
              gint64 out_features, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_ffn_activation(b, name, x, ffn_hiddens, out_features, QKV_ACTIVATION_RELU,
                                  error);
}

/* The activation's op on x; NULL with an error for an unknown one. */
static QkvValue *
activation(QkvValue *x, QkvActivation act, GError **error)
{
  switch (act) {
  case QKV_ACTIVATION_RELU:
    return qkv_relu(x, error);
  case QKV_ACTIVATION_GELU:
    return qkv_gelu(x, "none", error);
  case QKV_ACTIVATION_GELU_TANH:
    return qkv_gelu(x, "tanh", error);
  case QKV_ACTIVATION_SILU:
    return qkv_silu(x, error);
  }
  return NULL;
}

QkvValue *
qkv_build_ffn_activation(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
                         gint64 out_features, QkvActivation act, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_ffn", "ffn_hiddens", ffn_hiddens, error) ||
      !builder_check_positive("qkv_build_ffn", "out_features", out_features, error) ||
      !builder_check_activation("qkv_build_ffn", "activation", act, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  qkv_builder_push(b, name, error);
  QkvValue *y;
  if (act == QKV_ACTIVATION_RELU) {
    /* the book's PositionWiseFFN as one fused op */
    gint64 in = last_dim(x);
    QkvShape w1s = QKV_SHAPE(ffn_hiddens, in), b1s = QKV_SHAPE(ffn_hiddens);
    QkvShape w2s = QKV_SHAPE(out_features, ffn_hiddens), b2s = QKV_SHAPE(out_features);
    QkvValue *w1 = qkv_build_param(b, "dense1.weight", &w1s, "linear_weight", in, error);
    QkvValue *b1 = qkv_build_param(b, "dense1.bias", &b1s, "linear_bias", in, error);
    QkvValue *w2 = qkv_build_param(b, "dense2.weight", &w2s, "linear_weight", ffn_hiddens, error);
    QkvValue *b2 = qkv_build_param(b, "dense2.bias", &b2s, "linear_bias", ffn_hiddens, error);
    y = qkv_position_wise_ffn(x, w1, b1, w2, b2, error);
  } else {
    QkvValue *h = linear(b, "dense1", x, ffn_hiddens, TRUE, NULL, NULL, error);
    h = h ? activation(h, act, error) : NULL;
    y = h ? linear(b, "dense2", h, out_features, TRUE, NULL, NULL, error) : NULL;
  }
  qkv_builder_pop(b);
  return qkv_builder_end(b, &mark, y);
}

QkvValue *
qkv_build_addnorm(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *y, double dropout,
                  GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL || y == NULL)
    return NULL;
  if (!builder_check_dropout("qkv_build_addnorm", "dropout", dropout, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvShape s = QKV_SHAPE(last_dim(x));
  qkv_builder_push(b, name, error);
  QkvValue *gamma = qkv_build_param(b, "ln.weight", &s, "ones", 0, error);
  QkvValue *beta = qkv_build_param(b, "ln.bias", &s, "zeros", 0, error);
  QkvValue *sum = qkv_add(dropout > 0 ? qkv_dropout(y, dropout, error) : y, x, error);
  QkvValue *out = qkv_layer_norm(sum, gamma, beta, 1e-5, error);
  qkv_builder_pop(b);
  return qkv_builder_end(b, &mark, out);
}

/* Σ_b mean_t(ce[b,t] · mask[b,t]): the per-sequence loss (B) in *per_seq
 * (may be NULL) and the sum. mean over T divides by the bound T when a plan
 * runs on shorter sequences than compiled. */
static QkvValue *
seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask, double label_smoothing,
             QkvValue **per_seq, GError **error)
{
  QkvGraph *graph = qkv_value_graph(logits);
  QkvGraphMark mark;
  qkv_graph_mark(graph, &mark);
  const gint time_axis = -1;
  QkvValue *ce =
      qkv_cross_entropy_smoothed(logits, labels, mask, QKV_REDUCTION_NONE, label_smoothing, error);
  QkvValue *seq = qkv_mean(ce, &time_axis, 1, FALSE, error);
  QkvValue *loss = qkv_sum(seq, NULL, 0, FALSE, error);
  if (loss == NULL) {
    qkv_graph_rollback(graph, &mark);
    return NULL;
  }
  if (per_seq != NULL)
    *per_seq = seq;
  return loss;
}

QkvValue *
qkv_build_seq2seq_loss_smoothed(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                double label_smoothing, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (logits == NULL || labels == NULL || mask == NULL)
    return NULL;
  return seq2seq_loss(logits, labels, mask, label_smoothing, NULL, error);
}

QkvValue *
qkv_build_seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_seq2seq_loss_smoothed(logits, labels, mask, 0.0, error);
}

QkvValue *
qkv_build_seq2seq_loss_lens(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                            QkvValue **per_seq, GError **error)
{
  if (per_seq != NULL) /* a failure leaves out-values NULL */
    *per_seq = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return qkv_build_seq2seq_loss_lens_smoothed(logits, labels, valid_lens, 0.0, per_seq, error);
}

QkvValue *
qkv_build_seq2seq_loss_lens_smoothed(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                                     double label_smoothing, QkvValue **per_seq, GError **error)
{
  if (per_seq != NULL) /* a failure leaves out-values NULL */
    *per_seq = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (logits == NULL || labels == NULL || valid_lens == NULL)
    return NULL;
  QkvGraph *graph = qkv_value_graph(logits);
  QkvGraphMark mark;
  qkv_graph_mark(graph, &mark);
  QkvValue *mask = qkv_sequence_mask_like(valid_lens, labels, error);
  QkvValue *loss =
      mask ? seq2seq_loss(logits, labels, mask, label_smoothing, per_seq, error) : NULL;
  if (loss == NULL)
    qkv_graph_rollback(graph, &mark); /* the mask */
  return loss;
}
