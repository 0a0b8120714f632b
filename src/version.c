/* version.c: the library's version and its error domain (QKV_ERROR), which
 * every layer of src/ may raise: it sits beside init.c, outside the layers. */
#include "core/core-private.h"

/* clang-format would write the quark's name with spaces, and every binding
 * would see them: keep it away from the formatter. */
// clang-format off
G_DEFINE_QUARK(qkv-error-quark, qkv_error)
// clang-format on

const gchar *
qkv_version(void)
{
  return QKV_VERSION;
}
