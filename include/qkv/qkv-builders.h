/* qkv-builders.h: builders that add layers and models to a graph and create
 * their parameters in a QkvParams store, under the names the book's PyTorch
 * modules give them in their state_dict. Builders use only the public API. */
#pragma once

#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/* Nadaraya-Watson kernel regression with one learned width w (parameter
 * "<prefix>w", shape (1)): for each query q_i,
 *   f(q_i) = Σ_j softmax_j(-((q_i - k_ij) · w)² / 2) · v_ij.
 * queries (n), keys (n, m), values (n, m) → predictions (n). If the store has
 * no "<prefix>w" yet it is created as U(0, 1) from seed, like torch.rand.
 * *weights (may be NULL) receives the attention weights (n, m). */
QkvValue *qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                  QkvValue *queries, QkvValue *keys, QkvValue *values,
                                  guint64 seed, QkvValue **weights, GError **error);

G_END_DECLS
