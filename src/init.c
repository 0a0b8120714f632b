/* init.c: library initialisation, version and the error domain. */
#include "qkv-private.h"

G_DEFINE_QUARK(qkv - error - quark, qkv_error)

void
qkv_init(void)
{
  /* The built-in ops first: plugins register into a complete registry. */
  qkv_registry_init();
  qkv_plugins_init();
}

const gchar *
qkv_version(void)
{
  return QKV_VERSION;
}
