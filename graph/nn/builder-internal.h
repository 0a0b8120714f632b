/* builder-internal.h: what the layer and model builders share about
 * parameters and scopes (not installed; G_GNUC_INTERNAL). */
#pragma once

#include <qkv/qkv.h>

/* FALSE, with QKV_ERROR_INVALID_ARGUMENT naming the parameter (its full
 * name), when a level of b's scope stack was refused. */
G_GNUC_INTERNAL gboolean builder_scope_accepts(const QkvBuilder *b, const gchar *name,
                                               GError **error);

/* qkv_build_param() for the builders: the parameter "<scope>.<name>" with
 * the book's initialiser init (as qkv_build_param()'s) unless choice (may be
 * NULL) or b->inits chooses another; choice wins over b->inits. With init
 * NULL, choice must choose (qkv_build_param_init()). */
G_GNUC_INTERNAL QkvValue *builder_param(QkvBuilder *b, const gchar *name, const QkvShape *shape,
                                        const gchar *init, gint64 fan_in, const QkvInit *choice,
                                        GError **error);

/* cached.c: the builder's cached mode (QkvBuilderCache). Whether b caches
 * this attention: b in cached mode and a causal self-attention. */
G_GNUC_INTERNAL gboolean builder_caches_attention(const QkvBuilder *b, QkvValue *queries,
                                                  QkvValue *keys, QkvValue *values,
                                                  const QkvMhaOptions *o);
/* FALSE with QKV_ERROR_INVALID_ARGUMENT for a cache without positions or
 * max_len, or options cached mode does not support (valid_lens, mask). */
G_GNUC_INTERNAL gboolean builder_check_cached_attention(const QkvBuilder *b,
                                                        const QkvMhaOptions *o, GError **error);
/* Causal self-attention of x (B, t, ·) over the caches "<scope>.k_cache"
 * and ".v_cache" with projections w[4] (W_q, W_k, W_v, W_o) and biases
 * (NULL or four): (B, t, num_hiddens); *weights (may be NULL) gets
 * (B, heads, t, max_len). Call it under the layer's scope. */
G_GNUC_INTERNAL QkvValue *builder_cached_self_attention(QkvBuilder *b, QkvValue *x,
                                                        gint64 num_hiddens, gint heads,
                                                        QkvValue *const *w, QkvValue *const *bias,
                                                        QkvValue **weights, GError **error);
/* Attention of queries (B, t, ·) over the projected keys and values that
 * the caller binds to the inputs "<scope>.keys" and "<scope>.values" (B,
 * heads, n_k, d_head), n_k from keys' shape (QkvBuilderCache.cross_inputs),
 * masked as options say (not causal): (B, t, num_hiddens). Only w[0], w[3]
 * and their biases are used. Call it under the layer's scope. */
G_GNUC_INTERNAL QkvValue *builder_cross_attention_inputs(QkvBuilder *b, QkvValue *queries,
                                                         QkvValue *keys, gint64 num_hiddens,
                                                         gint heads, QkvValue *const *w,
                                                         QkvValue *const *bias,
                                                         const QkvMhaOptions *o,
                                                         QkvValue **weights, GError **error);
