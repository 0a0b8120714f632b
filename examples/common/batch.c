/* batch.c: the shuffles and gathers of batch.h. */
#include "batch.h"

#include <string.h>

void
batch_shuffle(GRand *rng, gpointer base, guint n, gsize elem_size)
{
  guint8 tmp[16];
  g_return_if_fail(elem_size <= sizeof tmp);
  guint8 *a = base;
  for (guint i = n > 0 ? n - 1 : 0; i > 0; i--) {
    guint j = (guint)g_rand_int_range(rng, 0, (gint32)i + 1);
    if (j == i)
      continue;
    memcpy(tmp, a + (gsize)i * elem_size, elem_size);
    memcpy(a + (gsize)i * elem_size, a + (gsize)j * elem_size, elem_size);
    memcpy(a + (gsize)j * elem_size, tmp, elem_size);
  }
}

void
batch_order_init(gint *order, gint n)
{
  for (gint i = 0; i < n; i++)
    order[i] = i;
}

void
batch_gather_rows(gint32 *dst, gint width, const gint32 *src, gint src_width, const gint *rows,
                  gint n)
{
  for (gint i = 0; i < n; i++)
    memcpy(dst + (gsize)i * width, src + (gsize)rows[i] * src_width, (gsize)width * sizeof(gint32));
}

void
batch_gather(gint32 *dst, const gint32 *src, const gint *rows, gint n)
{
  for (gint i = 0; i < n; i++)
    dst[i] = src[rows[i]];
}
