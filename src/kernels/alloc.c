/* alloc.c: the aligned allocator behind tensors and plan arenas.
 *
 * Every allocation is counted so that a test can prove a plan run makes none.
 * Sizes come from user shapes, so a failed allocation is reported to the
 * caller (NULL), who turns it into a QKV_ERROR_MEMORY naming what it wanted:
 * the library never aborts because a shape was too big. */
#include "kernels/kernels-private.h"

#include <stdlib.h>
#include <string.h>

static guint64 alloc_count; /* atomic */

#define QKV_ALIGN 64

gpointer
qkv_aligned_alloc0(gsize size)
{
  /* aligned_alloc wants a multiple of the alignment; rounding must not wrap */
  if (size > G_MAXSIZE - QKV_ALIGN)
    return NULL;
  gsize rounded = (size + QKV_ALIGN - 1) / QKV_ALIGN * QKV_ALIGN;
  if (rounded == 0)
    rounded = QKV_ALIGN;
  gpointer ptr = aligned_alloc(QKV_ALIGN, rounded);
  if (ptr == NULL)
    return NULL;
  memset(ptr, 0, rounded);
  __atomic_add_fetch(&alloc_count, 1, __ATOMIC_RELAXED);
  return ptr;
}

void
qkv_aligned_free(gpointer ptr)
{
  free(ptr);
}

guint64
qkv_alloc_count(void)
{
  return __atomic_load_n(&alloc_count, __ATOMIC_RELAXED);
}
