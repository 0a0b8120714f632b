/* luong-internal.h: the Luong attention pieces luong.c shares with its step
 * decoder (decode-luong.c); not installed, G_GNUC_INTERNAL. */
#pragma once

#include <qkv/qkv.h>

/* What the attention keeps between queries: the source, its projection (so
 * a step-by-step decoder projects it once, not once per step) and the
 * constants the windows are made of. */
typedef struct {
  QkvLuongAttentionConfig cfg;
  gint64 hidden, src_len;
  QkvValue *source;    /* (B, S, H) */
  QkvValue *keys;      /* dot: source; general: source W_aᵀ; concat: source W_a[:, H:]ᵀ */
  QkvValue *w_query;   /* concat: W_a[:, :H] */
  QkvValue *v_a;       /* concat: (1, H) */
  QkvValue *w_p, *v_p; /* local-p */
  QkvValue *valid;     /* i32 (B) or NULL */
  QkvValue *length;    /* local: S as f32, (B, 1, 1) or a scalar */
  QkvValue *positions; /* local: 0 … S-1 as f32, (S) */
  QkvValue *window;    /* local: D as an f32 scalar */
} Luong;

/* Create or reuse the parameters of attention name over source (B, S, H)
 * and project the source once. */
G_GNUC_INTERNAL gboolean luong_prepare(QkvBuilder *b, const gchar *name,
                                       const QkvLuongAttentionConfig *cfg, QkvValue *source,
                                       QkvValue *src_valid, Luong *a, GError **error);
/* Local-m only (NULL otherwise): the constant target positions first …
 * first + n − 1 as f32 (n, 1). */
G_GNUC_INTERNAL QkvValue *luong_target_positions(QkvBuilder *b, const Luong *a, gint64 first,
                                                 gint64 n, GError **error);
/* Queries (B, n, H) at target_positions (local-m: f32 (n, 1) or (B, n, 1),
 * a constant or a graph input; unused otherwise) → context (B, n, H) and the
 * weights (B, n, S). */
G_GNUC_INTERNAL QkvValue *luong_attend(QkvBuilder *b, const Luong *a, QkvValue *queries,
                                       QkvValue *target_positions, QkvValue **weights,
                                       GError **error);
/* ã = tanh(W_c [context; h]), W_c "<name>.weight" without bias. */
G_GNUC_INTERNAL QkvValue *luong_attentional(QkvBuilder *b, const gchar *name, QkvValue *context,
                                            QkvValue *h, GError **error);
