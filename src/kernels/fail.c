/* fail.c: qkv_kernel_fail(), the way a kernel stops the run it is part of.
 * The executor reads what it records after each node (src/plan/execute.c). */
#include "kernels/kernels-private.h"

void
qkv_kernel_fail(const QkvKernelCtx *ctx, QkvError code, const gchar *format, ...)
{
  g_return_if_fail(ctx != NULL && format != NULL);
  va_list args;
  va_start(args, format);
  GError *failure = g_error_new_valist(QKV_ERROR, (gint)code, format, args);
  va_end(args);
  GError **slot = ctx->reserved[QKV_KERNEL_CTX_FAILURE_SLOT];
  if (slot == NULL) {
    /* A context that no plan made (a kernel called by hand): there is no run
     * to stop, only the log to tell. */
    g_warning("node '%s' (%s): %s", ctx->node_name, ctx->op_name, failure->message);
    g_error_free(failure);
    return;
  }
  /* Pool threads may fail at once: the first to get the slot keeps it. */
  if (!g_atomic_pointer_compare_and_exchange(slot, NULL, failure))
    g_error_free(failure);
}
