/* init.c: library initialisation, version and the error domain. */
#include "qkv-private.h"

G_DEFINE_QUARK(qkv-error-quark, qkv_error)

void
qkv_init(void)
{
  qkv_registry_init();
}

const gchar *
qkv_version(void)
{
  return QKV_VERSION;
}
