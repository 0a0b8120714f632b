/* gru-internal.h: the GRU pieces gru.c shares with the other recurrent
 * builders in graph/ (luong.c); not installed, and G_GNUC_INTERNAL keeps
 * them out of the library's exported symbols. */
#pragma once

#include <qkv/qkv.h>

/* One layer's parameters "<name>.weight_ih_l{k}" (3H, in), "weight_hh_l{k}"
 * (3H, H), "bias_ih_l{k}", "bias_hh_l{k}" (3H), gates ordered r, z, n. */
typedef struct {
  QkvValue *w_ih, *w_hh, *b_ih, *b_hh;
} GruLayer;

/* Create or reuse layer k's parameters (input size in, hidden size hidden). */
G_GNUC_INTERNAL gboolean gru_layer_params(QkvBuilder *b, const gchar *name, gint k, gint64 in,
                                          gint64 hidden, GruLayer *layer, GError **error);
/* One step from the input projection gi = x W_ihᵀ + b_ih (B, 3H) and the
 * state h (B, H), or NULL for the zero state. */
G_GNUC_INTERNAL QkvValue *gru_cell(const GruLayer *layer, QkvValue *gi, QkvValue *h, gint64 hidden,
                                   GError **error);
/* Row l of a (L, B, H) state as (B, H). */
G_GNUC_INTERNAL QkvValue *gru_state_row(QkvValue *state, gint l, GError **error);
/* Stack n values of shape (B, H) along a new axis (0 or 1). */
G_GNUC_INTERNAL QkvValue *gru_stack(QkvValue *const *rows, guint n, gint axis, GError **error);
