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
