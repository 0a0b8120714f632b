/* pooling.c: attention pooling with learned queries (soft, or hard: one
 * position picked per query), mean pooling, and the sentence classifier
 * built on them. */
#include <math.h>
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "error-private.h"

/* x (B, T, D) f32 and valid_lens NULL or i32 (B) with x's B. */
static gboolean
check_inputs(const gchar *builder, QkvValue *x, QkvValue *valid_lens, GError **error)
{
  const QkvShape *xs = qkv_value_shape(x);
  if (qkv_value_dtype(x) != QKV_F32 || xs->rank != 3) {
    g_autofree gchar *sh = qkv_shape_to_string(xs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE, "%s: x must be f32 (B, T, D), got %s %s",
                builder, qkv_dtype_name(qkv_value_dtype(x)), sh);
    return FALSE;
  }
  if (valid_lens == NULL)
    return TRUE;
  const QkvShape *vs = qkv_value_shape(valid_lens);
  if (qkv_value_dtype(valid_lens) != QKV_I32 || vs->rank != 1 || vs->dims[0] != xs->dims[0]) {
    g_autofree gchar *sh = qkv_shape_to_string(vs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s: valid_lens must be i32 (B) = (%" G_GINT64_FORMAT "), got %s %s", builder,
                xs->dims[0], qkv_dtype_name(qkv_value_dtype(valid_lens)), sh);
    return FALSE;
  }
  return TRUE;
}

/* The scores (B, K, T) of K learned queries against the keys x W_kᵀ. */
static QkvValue *
query_scores(QkvBuilder *b, const gchar *name, QkvValue *x, gint num_queries, gint64 key_size,
             GError **error)
{
  QkvShape qs = QKV_SHAPE(num_queries, key_size);
  qkv_builder_push(b, name, error);
  QkvValue *queries = qkv_build_param(b, "queries", &qs, "embedding", 0, error);
  /* (B, T, key_size); not tried after a failure, which would set error twice */
  QkvValue *keys = queries ? qkv_build_linear(b, "W_k", x, key_size, FALSE, error) : NULL;
  qkv_builder_pop(b);
  /* a (K, key) matrix against a batch of (T, key): one product per sentence */
  QkvValue *scores = qkv_matmul(queries, keys, FALSE, TRUE, error); /* (B, K, T) */
  return qkv_scale(scores, 1.0 / sqrt((double)key_size), error);
}

/* Soft weights from the masked softmax, or hard ones: the one-hot of one
 * position per query from gumbel_softmax at temperature tau. */
static QkvValue *
attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *valid_lens,
                  gint num_queries, gint64 key_size, gboolean hard, double tau, QkvValue **weights,
                  GError **error)
{
  QkvValue *scores = query_scores(b, name, x, num_queries, key_size, error);
  QkvValue *w = hard ? qkv_gumbel_softmax(scores, valid_lens, tau, TRUE, -1, error)
                     : qkv_masked_softmax(scores, valid_lens, FALSE, error);
  QkvValue *out = qkv_matmul(w, x, FALSE, FALSE, error); /* (B, K, D) */
  *weights = w;
  return out;
}

/* A Gumbel-softmax temperature: finite and > 0. */
static gboolean
check_tau(const gchar *builder, const gchar *field, double tau, GError **error)
{
  if (tau > 0 && isfinite(tau))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s is %g, it must be finite and > 0", builder, field, tau);
  return FALSE;
}

/* The checks and the all-or-nothing step of both attention poolings. */
static QkvValue *
build_attention_pooling(QkvBuilder *b, const gchar *me, const gchar *name, QkvValue *x,
                        QkvValue *valid_lens, gint num_queries, gint64 key_size, gboolean hard,
                        double tau, QkvValue **weights, GError **error)
{
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!builder_check_positive(me, "num_queries", num_queries, error) ||
      !builder_check_positive(me, "key_size", key_size, error) ||
      (hard && !check_tau(me, "tau", tau, error)) || !check_inputs(me, x, valid_lens, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *w = NULL;
  QkvValue *out =
      attention_pooling(b, name, x, valid_lens, num_queries, key_size, hard, tau, &w, error);
  out = qkv_builder_end(b, &mark, out);
  if (out != NULL && weights != NULL)
    *weights = w;
  return out;
}

QkvValue *
qkv_build_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *valid_lens,
                            gint num_queries, gint64 key_size, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  return build_attention_pooling(b, "qkv_build_attention_pooling", name, x, valid_lens, num_queries,
                                 key_size, FALSE, 0.0, weights, error);
}

QkvValue *
qkv_build_hard_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x,
                                 QkvValue *valid_lens, gint num_queries, gint64 key_size,
                                 double tau, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  return build_attention_pooling(b, "qkv_build_hard_attention_pooling", name, x, valid_lens,
                                 num_queries, key_size, TRUE, tau, weights, error);
}

static QkvValue *
mean_pooling(QkvValue *x, QkvValue *valid_lens, QkvValue **weights, GError **error)
{
  /* A (B, T) value that follows the bound shapes, for the mask's length. */
  const gint last = -1;
  QkvValue *like = qkv_squeeze(qkv_slice(x, -1, 0, 1, error), &last, 1, error);
  QkvValue *w;
  if (valid_lens != NULL) {
    /* Equal scores through the same masked softmax as attention pooling: the
     * valid positions share the weight, padding gets exactly 0, and an empty
     * sequence is uniform as there. The mask is 0/1, so · 0 is exactly 0. */
    QkvValue *zeros = qkv_scale(qkv_sequence_mask_like(valid_lens, like, error), 0.0, error);
    w = qkv_masked_softmax(qkv_unsqueeze(zeros, 1, error), valid_lens, FALSE, error);
  } else {
    QkvValue *zeros = qkv_scale(qkv_eq(like, like, error), 0.0, error); /* 0/1 even for NaN */
    w = qkv_softmax(qkv_unsqueeze(zeros, 1, error), error);
  }
  *weights = w;
  return qkv_matmul(w, x, FALSE, FALSE, error); /* (B, 1, D) */
}

QkvValue *
qkv_build_mean_pooling(QkvBuilder *b, QkvValue *x, QkvValue *valid_lens, QkvValue **weights,
                       GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (x == NULL)
    return NULL;
  if (!check_inputs("qkv_build_mean_pooling", x, valid_lens, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *w = NULL;
  QkvValue *out = qkv_builder_end(b, &mark, mean_pooling(x, valid_lens, &w, error));
  if (out != NULL && weights != NULL)
    *weights = w;
  return out;
}

static QkvValue *
classifier(QkvBuilder *b, const QkvPoolingClassifierConfig *cfg, QkvValue *tokens,
           QkvValue *valid_lens, QkvValue **weights, GError **error)
{
  QkvValue *x =
      qkv_build_embedding(b, "embedding", tokens, cfg->vocab_size, cfg->embed_size, error);
  /* word order: the only way for a weighted average to tell "are you" from
   * "you are" is word vectors that know their position */
  if (cfg->positional_encoding)
    x = qkv_positional_encoding(x, 0.0, 0, error);
  QkvValue *pooled;
  if (cfg->pooling == QKV_POOLING_ATTENTION)
    pooled = qkv_build_attention_pooling(b, "pool", x, valid_lens, cfg->num_queries, cfg->key_size,
                                         weights, error);
  else if (cfg->pooling == QKV_POOLING_HARD)
    pooled =
        qkv_build_hard_attention_pooling(b, "pool", x, valid_lens, cfg->num_queries, cfg->key_size,
                                         cfg->tau > 0 ? cfg->tau : 1.0, weights, error);
  else
    pooled = qkv_build_mean_pooling(b, x, valid_lens, weights, error);
  gint64 k = cfg->pooling == QKV_POOLING_MEAN ? 1 : cfg->num_queries, d = cfg->embed_size;
  /* dense on the concatenation [c_1; …; c_K] (B, K·D), as nn.Linear(K·D, C)
   * would take it, computed without flattening the batch: a reshape's
   * gradient has the shape built, and a plan may bind a partial batch. Row
   * block k of the weight meets c_k; the K products are summed. */
  QkvShape ws = QKV_SHAPE(cfg->num_classes, k * d), bs = QKV_SHAPE(cfg->num_classes);
  QkvShape w3s = QKV_SHAPE(cfg->num_classes, k, d);
  const gint swap[] = {1, 0, 2};
  const gint first = 0;
  QkvValue *w =
      pooled ? qkv_build_param(b, "dense.weight", &ws, "linear_weight", k * d, error) : NULL;
  QkvValue *bias = w ? qkv_build_param(b, "dense.bias", &bs, "linear_bias", k * d, error) : NULL;
  QkvValue *wk = qkv_permute(qkv_reshape(w, &w3s, error), swap, 3, error); /* (K, C, D) */
  QkvValue *ck = qkv_permute(pooled, swap, 3, error);                      /* (K, B, D) */
  QkvValue *parts = qkv_matmul(ck, wk, FALSE, TRUE, error);                /* (K, B, C) */
  return qkv_add(qkv_sum(parts, &first, 1, FALSE, error), bias, error);
}

QkvValue *
qkv_build_pooling_classifier(QkvBuilder *b, const QkvPoolingClassifierConfig *cfg, QkvValue *tokens,
                             QkvValue *valid_lens, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (tokens == NULL)
    return NULL;
  const gchar *me = "qkv_build_pooling_classifier";
  if (!builder_check_positive(me, "cfg->vocab_size", cfg->vocab_size, error) ||
      !builder_check_positive(me, "cfg->embed_size", cfg->embed_size, error) ||
      !builder_check_positive(me, "cfg->num_classes", cfg->num_classes, error))
    return NULL;
  if (cfg->pooling != QKV_POOLING_ATTENTION && cfg->pooling != QKV_POOLING_MEAN &&
      cfg->pooling != QKV_POOLING_HARD) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: cfg->pooling is %d, it must be QKV_POOLING_ATTENTION, QKV_POOLING_MEAN or "
                "QKV_POOLING_HARD",
                me, (gint)cfg->pooling);
    return NULL;
  }
  if (cfg->pooling == QKV_POOLING_HARD && cfg->tau != 0 &&
      !check_tau(me, "cfg->tau", cfg->tau, error))
    return NULL;
  if (cfg->pooling != QKV_POOLING_MEAN &&
      (!builder_check_positive(me, "cfg->num_queries", cfg->num_queries, error) ||
       !builder_check_positive(me, "cfg->key_size", cfg->key_size, error)))
    return NULL;
  const QkvShape *ts = qkv_value_shape(tokens);
  if (qkv_value_dtype(tokens) != QKV_I32 || ts->rank != 2) {
    g_autofree gchar *sh = qkv_shape_to_string(ts);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE, "%s: tokens must be i32 (B, T), got %s %s", me,
                qkv_dtype_name(qkv_value_dtype(tokens)), sh);
    return NULL;
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *w = NULL;
  QkvValue *logits = classifier(b, cfg, tokens, valid_lens, weights ? &w : NULL, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits != NULL && weights != NULL)
    *weights = w;
  return logits;
}
