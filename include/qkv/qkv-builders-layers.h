/* qkv-builders-layers.h: layer builders (part of qkv-builders.h): nn.Linear,
 * nn.Embedding, token positions, the position-wise FFN and its activations,
 * AddNorm, LayerNorm, RMSNorm and nn.GRU. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-builders-core.h"

G_BEGIN_DECLS

/**
 * qkv_build_linear:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @out_features: the out features
 * @bias: the bias
 * @error: return location for a #GError, or %NULL
 *
 * nn.Linear: x (…, in) · weightᵀ (+ bias) → (…, out); "<name>.weight" (out, in),
 * "<name>.bias" (out).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                           gboolean bias, GError **error);
/**
 * qkv_build_linear_init:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @out_features: the out features
 * @bias: the bias
 * @weight_init: (nullable): a #QkvInit
 * @bias_init: (nullable): a #QkvInit
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_linear() with the initialisers of a new weight and bias chosen
 * here ("linear weights Xavier, bias zeros"); NULL or QKV_INIT_DEFAULT for
 * either keeps the builder's choice (b->inits, else the book's). A bias has
 * rank 1: Xavier or Kaiming for it fails with QKV_ERROR_SHAPE.
 *
 * Returns: (transfer full) (nullable): a new #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_linear_init(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                                gboolean bias, const QkvInit *weight_init, const QkvInit *bias_init,
                                GError **error);
/**
 * qkv_build_embedding:
 * @b: a #QkvBuilder
 * @name: the name
 * @ids: a #QkvValue
 * @num: the num
 * @dim: the dim
 * @error: return location for a #GError, or %NULL
 *
 * nn.Embedding: ids (…) → (…, dim); "<name>.weight" (num, dim), N(0, 1).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_embedding(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num,
                              gint64 dim, GError **error);
/**
 * qkv_build_embedding_init:
 * @b: a #QkvBuilder
 * @name: the name
 * @ids: a #QkvValue
 * @num: the num
 * @dim: the dim
 * @init: (nullable): a #QkvInit
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_embedding() with the initialiser of a new table chosen here
 * (GPT-2's N(0, 0.02²): {.kind = QKV_INIT_NORMAL, .std = 0.02}); NULL or
 * QKV_INIT_DEFAULT keeps the builder's choice.
 *
 * Returns: (transfer full) (nullable): a new #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_embedding_init(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num,
                                   gint64 dim, const QkvInit *init, GError **error);

/**
 * qkv_build_positions:
 * @b: a #QkvBuilder
 * @tokens: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The i32 positions of tokens (B, T): (T) 0 … T − 1 (torch.arange(T)),
 * or in cached mode (b->cache) row b's positions[b] … positions[b] + T − 1
 * as (B, T) (qkv_positions()). For learned position embeddings:
 * qkv_embedding(qkv_build_positions(b, tokens, &error), wpe, &error).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_positions(QkvBuilder *b, QkvValue *tokens, GError **error);

/**
 * QkvActivation:
 * @QKV_ACTIVATION_RELU: the book's
 * @QKV_ACTIVATION_GELU: exact, nn.GELU() (qkv_gelu)
 * @QKV_ACTIVATION_GELU_TANH: nn.GELU(approximate="tanh")
 * @QKV_ACTIVATION_SILU: nn.SiLU() (qkv_silu)
 *
 * The activation between the two dense layers of a position-wise FFN (and
 * of the Transformer's, QkvTransformerConfig.ffn_activation).
 */
typedef enum {
  QKV_ACTIVATION_RELU = 0,  /* the book's */
  QKV_ACTIVATION_GELU,      /* exact, nn.GELU() (qkv_gelu) */
  QKV_ACTIVATION_GELU_TANH, /* nn.GELU(approximate="tanh") */
  QKV_ACTIVATION_SILU,      /* nn.SiLU() (qkv_silu) */
} QkvActivation;

/**
 * qkv_build_ffn:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @ffn_hiddens: the ffn hiddens
 * @out_features: the out features
 * @error: return location for a #GError, or %NULL
 *
 * PositionWiseFFN: "<name>.dense1" (ffn_hiddens), ReLU, "<name>.dense2" (out).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_ffn(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
                        gint64 out_features, GError **error);
/**
 * qkv_build_ffn_activation:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @ffn_hiddens: the ffn hiddens
 * @out_features: the out features
 * @activation: the activation
 * @error: return location for a #GError, or %NULL
 *
 * The same with another activation, under the same names. ReLU is
 * qkv_build_ffn()'s fused op; the others are two linear layers around the
 * activation's op.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_ffn_activation(QkvBuilder *b, const gchar *name, QkvValue *x,
                                   gint64 ffn_hiddens, gint64 out_features,
                                   QkvActivation activation, GError **error);
/**
 * qkv_build_addnorm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @y: a #QkvValue
 * @dropout: the dropout
 * @error: return location for a #GError, or %NULL
 *
 * AddNorm: LayerNorm(dropout(y) + x) with "<name>.ln.weight/.bias".
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_addnorm(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *y,
                            double dropout, GError **error);
/**
 * qkv_build_layer_norm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @eps: the eps
 * @elementwise_affine: the elementwise affine
 * @bias: the bias
 * @error: return location for a #GError, or %NULL
 *
 * nn.LayerNorm(d, eps, elementwise_affine, bias) over the last axis (d) of
 * x: "<name>.weight" (d, ones) unless !elementwise_affine, "<name>.bias"
 * (d, zeros) unless !elementwise_affine or !bias (PyTorch's bias= of 2.1).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_layer_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps,
                               gboolean elementwise_affine, gboolean bias, GError **error);
/**
 * qkv_build_rms_norm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @eps: the eps
 * @error: return location for a #GError, or %NULL
 *
 * nn.RMSNorm(d, eps) over the last axis (d) of x (qkv_rms_norm):
 * "<name>.weight" (d, ones).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_rms_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps,
                             GError **error);

/**
 * qkv_build_gru:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: (nullable): a #QkvValue
 * @h0: (nullable): a #QkvValue
 * @hidden: the hidden
 * @num_layers: the num layers
 * @dropout: the dropout
 * @h_n: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * nn.GRU with PyTorch's gate equations and parameter layout:
 * "<name>.weight_ih_l{k}" (3H, in), "<name>.weight_hh_l{k}" (3H, H),
 * "<name>.bias_ih_l{k}", "<name>.bias_hh_l{k}" (3H), gates ordered r, z, n;
 * dropout on every layer's output but the last. x (T, B, in), h0 (L, B, H)
 * or NULL for zeros → outputs (T, B, H); *h_n (may be NULL) gets (L, B, H).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden,
                        gint num_layers, double dropout, QkvValue **h_n, GError **error);

G_END_DECLS
