/* version.c: the library's version and its error domain (QKV_ERROR), which
 * every layer of src/ may raise: it sits beside init.c, outside the layers. */
#include "core/core-private.h"

G_DEFINE_QUARK(qkv - error - quark, qkv_error)

const gchar *
qkv_version(void)
{
  return QKV_VERSION;
}
