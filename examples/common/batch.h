/* batch.h: shuffling and gathering the rows of a mini-batch, shared by the
 * examples that train on id sequences. */
#pragma once

#include <glib.h>

/* Fisher-Yates over n elements of elem_size bytes (at most 16) at base:
 * for i from n - 1 down to 1, swap element i with element
 * g_rand_int_range(rng, 0, i + 1). The examples' runs depend on this
 * order of draws. */
void batch_shuffle(GRand *rng, gpointer base, guint n, gsize elem_size);

/* order[i] = i for i < n. */
void batch_order_init(gint *order, gint n);

/* Rows rows[0..n) of src (rows of src_width ids) to dst, the first width
 * ids of each, packed (rows of width ids). */
void batch_gather_rows(gint32 *dst, gint width, const gint32 *src, gint src_width, const gint *rows,
                       gint n);

/* dst[i] = src[rows[i]] for i < n. */
void batch_gather(gint32 *dst, const gint32 *src, const gint *rows, gint n);
