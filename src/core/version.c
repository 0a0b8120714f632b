/* version.c: the library's version and its error domain. */
#include "core/core-private.h"

G_DEFINE_QUARK(qkv - error - quark, qkv_error)

const gchar *
qkv_version(void)
{
  return QKV_VERSION;
}
