/* sparse.c: the process-wide switch for sparse backward products
 * (qkv_set_sparse_backward(), qkv-plugin.h), which the ops' backward kernels
 * read. A setting of its own: it has nothing to do with the thread pool or
 * the instruction set, so it lives in neither of their files. */
#include "kernels/kernels-private.h"
#include "error-private.h"

/* -1: not read from the environment yet. */
static gint sparse_backward = -1;

gboolean
qkv_try_set_sparse_backward(QkvSparseBackward mode, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  /* the int compare: an enum's range is the compiler's to assume */
  if ((gint)mode < (gint)QKV_SPARSE_BACKWARD_OFF || (gint)mode > (gint)QKV_SPARSE_BACKWARD_ALWAYS) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_try_set_sparse_backward: mode %d is not a QkvSparseBackward "
                "(QKV_SPARSE_BACKWARD_OFF = %d, QKV_SPARSE_BACKWARD_AUTO = %d or "
                "QKV_SPARSE_BACKWARD_ALWAYS = %d)",
                (int)mode, (int)QKV_SPARSE_BACKWARD_OFF, (int)QKV_SPARSE_BACKWARD_AUTO,
                (int)QKV_SPARSE_BACKWARD_ALWAYS);
    return FALSE;
  }
  g_atomic_int_set(&sparse_backward, (gint)mode);
  return TRUE;
}

void
qkv_set_sparse_backward(QkvSparseBackward mode)
{
  /* a bad value is a caller's bug here: loud, as g_return_if_fail was */
  g_autoptr(GError) error = NULL;
  if (!qkv_try_set_sparse_backward(mode, &error))
    g_critical("%s", error->message);
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
