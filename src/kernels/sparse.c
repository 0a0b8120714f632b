/* sparse.c: the process-wide switch for sparse backward products
 * (qkv_set_sparse_backward(), qkv-plugin.h), which the ops' backward kernels
 * read. A setting of its own: it has nothing to do with the thread pool or
 * the instruction set, so it lives in neither of their files. */
#include "kernels/kernels-private.h"

/* -1: not read from the environment yet. */
static gint sparse_backward = -1;

void
qkv_set_sparse_backward(QkvSparseBackward mode)
{
  g_return_if_fail(mode >= QKV_SPARSE_BACKWARD_OFF && mode <= QKV_SPARSE_BACKWARD_ALWAYS);
  g_atomic_int_set(&sparse_backward, (gint)mode);
}

QkvSparseBackward
qkv_get_sparse_backward(void)
{
  gint v = g_atomic_int_get(&sparse_backward);
  if (G_UNLIKELY(v < 0)) {
    const gchar *env = g_getenv("QKV_SPARSE_BACKWARD");
    v = env != NULL && g_strcmp0(env, "0") == 0 ? QKV_SPARSE_BACKWARD_OFF
                                                : QKV_SPARSE_BACKWARD_AUTO;
    g_atomic_int_compare_and_exchange(&sparse_backward, -1, v);
    v = g_atomic_int_get(&sparse_backward);
  }
  return (QkvSparseBackward)v;
}
