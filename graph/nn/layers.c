/* layers.c: the book's building blocks — Linear, Embedding,
 * MultiHeadAttention, PositionWiseFFN, AddNorm — as graph builders. */
#include <math.h>
#include <qkv/qkv.h>
#include <qkv/qkv-init.h>

#include "nn/builder-checks.h"

static const gchar *const initialisers[] = {"zeros",         "ones",        "embedding", "xavier",
                                            "linear_weight", "linear_bias", NULL};

static gboolean
init_param(QkvBuilder *b, QkvParam *p, const gchar *init, gint64 fan_in, GError **error)
{
  QkvTensor *t = qkv_param_value(p);
  guint64 seed = qkv_init_seed_for_name(b->seed, qkv_param_name(p));
  if (g_str_equal(init, "zeros"))
    return qkv_init_zeros(t, error);
  if (g_str_equal(init, "ones"))
    return qkv_init_ones(t, error);
  if (g_str_equal(init, "embedding"))
    return qkv_init_embedding(t, seed, error);
  if (g_str_equal(init, "xavier"))
    return qkv_init_xavier_uniform(t, 1.0, seed, error);
  if (g_str_equal(init, "linear_weight"))
    return b->xavier_linear ? qkv_init_xavier_uniform(t, 1.0, seed, error)
                            : qkv_init_kaiming_uniform(t, sqrt(5.0), seed, error);
  if (g_str_equal(init, "linear_bias")) {
    double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
    return qkv_init_uniform(t, -bound, bound, seed, error);
  }
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "unknown initialiser '%s'", init);
  return FALSE;
}

QkvValue *
qkv_build_param(QkvBuilder *b, const gchar *name, const QkvShape *shape, const gchar *init,
                gint64 fan_in, GError **error)
{
  g_return_val_if_fail(name != NULL && shape != NULL && init != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  QkvParam *p = qkv_params_lookup(b->params, name);
  if (p != NULL) {
    if (!qkv_shape_equal(qkv_param_shape(p), shape)) {
      g_autofree gchar *have = qkv_shape_to_string(qkv_param_shape(p));
      g_autofree gchar *want = qkv_shape_to_string(shape);
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "parameter '%s' exists with shape %s, the model needs %s", name, have, want);
      return NULL;
    }
    return qkv_graph_param(b->graph, b->params, name, error);
  }
  if (!g_strv_contains(initialisers, init)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_build_param: parameter '%s': unknown initialiser '%s'", name, init);
    return NULL;
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  p = qkv_params_add(b->params, name, shape, error);
  QkvValue *v = p != NULL && init_param(b, p, init, fan_in, error)
                    ? qkv_graph_param(b->graph, b->params, name, error)
                    : NULL;
  return qkv_builder_end(b, &mark, v);
}

static gint64
last_dim(QkvValue *x)
{
  const QkvShape *s = qkv_value_shape(x);
  return s->rank > 0 ? s->dims[s->rank - 1] : 1;
}

static QkvValue *
linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features, gboolean bias,
       GError **error)
{
  gint64 in = last_dim(x);
  g_autofree gchar *wn = g_strconcat(name, ".weight", NULL);
  QkvShape ws = QKV_SHAPE(out_features, in);
  QkvValue *y =
      qkv_matmul(x, qkv_build_param(b, wn, &ws, "linear_weight", in, error), FALSE, TRUE, error);
  if (!bias)
    return y;
  g_autofree gchar *bn = g_strconcat(name, ".bias", NULL);
  QkvShape bs = QKV_SHAPE(out_features);
  return qkv_add(y, qkv_build_param(b, bn, &bs, "linear_bias", in, error), error);
}

QkvValue *
qkv_build_linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features, gboolean bias,
                 GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_linear", "out_features", out_features, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  return qkv_builder_end(b, &mark, linear(b, name, x, out_features, bias, error));
}

QkvValue *
qkv_build_embedding(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num, gint64 dim,
                    GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (ids == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_embedding", "num", num, error) ||
      !builder_check_positive("qkv_build_embedding", "dim", dim, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  g_autofree gchar *wn = g_strconcat(name, ".weight", NULL);
  QkvShape ws = QKV_SHAPE(num, dim);
  QkvValue *w = qkv_build_param(b, wn, &ws, "embedding", 0, error);
  return qkv_builder_end(b, &mark, qkv_embedding(ids, w, error));
}

QkvValue *
qkv_build_mha(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys, QkvValue *values,
              gint64 num_hiddens, gint num_heads, QkvValue *valid_lens, gboolean causal,
              double dropout, QkvValue **weights, GError **error)
{
  return qkv_build_mha_masked(b, name, queries, keys, values, num_hiddens, num_heads, valid_lens,
                              NULL, QKV_MASK_BOOLEAN, causal, dropout, weights, error);
}

QkvValue *
qkv_build_mha_masked(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                     QkvValue *values, gint64 num_hiddens, gint num_heads, QkvValue *valid_lens,
                     QkvValue *mask, QkvMaskKind kind, gboolean causal, double dropout,
                     QkvValue **weights, GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (queries == NULL || keys == NULL || values == NULL)
    return NULL;
  if (!builder_check_heads("qkv_build_mha", "num_heads", num_heads, "num_hiddens", num_hiddens,
                           error) ||
      !builder_check_dropout("qkv_build_mha", "dropout", dropout, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  const gchar *proj[] = {"W_q", "W_k", "W_v", "W_o"};
  gint64 in[] = {last_dim(queries), last_dim(keys), last_dim(values), num_hiddens};
  QkvValue *w[4] = {NULL};
  for (int i = 0; i < 4; i++) {
    g_autofree gchar *wn = g_strdup_printf("%s.%s.weight", name, proj[i]);
    QkvShape ws = QKV_SHAPE(num_hiddens, in[i]);
    w[i] = qkv_build_param(b, wn, &ws, "linear_weight", in[i], error);
  }
  QkvValue *attention_weights = NULL;
  QkvValue *out = qkv_multi_head_attention_masked(
      queries, keys, values, w[0], w[1], w[2], w[3], NULL, num_heads, valid_lens, mask, kind,
      causal, dropout, weights ? &attention_weights : NULL, error);
  out = qkv_builder_end(b, &mark, out);
  if (out != NULL && weights != NULL)
    *weights = attention_weights;
  return out;
}

QkvValue *
qkv_build_ffn(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
              gint64 out_features, GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!builder_check_positive("qkv_build_ffn", "ffn_hiddens", ffn_hiddens, error) ||
      !builder_check_positive("qkv_build_ffn", "out_features", out_features, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  gint64 in = last_dim(x);
  g_autofree gchar *w1n = g_strconcat(name, ".dense1.weight", NULL);
  g_autofree gchar *b1n = g_strconcat(name, ".dense1.bias", NULL);
  g_autofree gchar *w2n = g_strconcat(name, ".dense2.weight", NULL);
  g_autofree gchar *b2n = g_strconcat(name, ".dense2.bias", NULL);
  QkvShape w1s = QKV_SHAPE(ffn_hiddens, in), b1s = QKV_SHAPE(ffn_hiddens);
  QkvShape w2s = QKV_SHAPE(out_features, ffn_hiddens), b2s = QKV_SHAPE(out_features);
  QkvValue *w1 = qkv_build_param(b, w1n, &w1s, "linear_weight", in, error);
  QkvValue *b1 = qkv_build_param(b, b1n, &b1s, "linear_bias", in, error);
  QkvValue *w2 = qkv_build_param(b, w2n, &w2s, "linear_weight", ffn_hiddens, error);
  QkvValue *b2 = qkv_build_param(b, b2n, &b2s, "linear_bias", ffn_hiddens, error);
  return qkv_builder_end(b, &mark, qkv_position_wise_ffn(x, w1, b1, w2, b2, error));
}

QkvValue *
qkv_build_addnorm(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *y, double dropout,
                  GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL || y == NULL)
    return NULL;
  if (!builder_check_dropout("qkv_build_addnorm", "dropout", dropout, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  gint64 d = last_dim(x);
  g_autofree gchar *gn = g_strconcat(name, ".ln.weight", NULL);
  g_autofree gchar *bn = g_strconcat(name, ".ln.bias", NULL);
  QkvShape s = QKV_SHAPE(d);
  QkvValue *gamma = qkv_build_param(b, gn, &s, "ones", 0, error);
  QkvValue *beta = qkv_build_param(b, bn, &s, "zeros", 0, error);
  QkvValue *sum = qkv_add(dropout > 0 ? qkv_dropout(y, dropout, error) : y, x, error);
  return qkv_builder_end(b, &mark, qkv_layer_norm(sum, gamma, beta, 1e-5, error));
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
  if (logits == NULL || labels == NULL || mask == NULL)
    return NULL;
  return seq2seq_loss(logits, labels, mask, label_smoothing, NULL, error);
}

QkvValue *
qkv_build_seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask, GError **error)
{
  return qkv_build_seq2seq_loss_smoothed(logits, labels, mask, 0.0, error);
}

QkvValue *
qkv_build_seq2seq_loss_lens(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                            QkvValue **per_seq, GError **error)
{
  return qkv_build_seq2seq_loss_lens_smoothed(logits, labels, valid_lens, 0.0, per_seq, error);
}

QkvValue *
qkv_build_seq2seq_loss_lens_smoothed(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                                     double label_smoothing, QkvValue **per_seq, GError **error)
{
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
