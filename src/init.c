/* init.c: the library's entry, above every layer of src/: qkv_init() brings
 * up the registry (core), registers the built-in ops (ops/) and then loads
 * the plugins (plugin/), in that order. */
#include "core/core-private.h"
#include "plugin/plugin-private.h"
#include "builtins.h"

void
qkv_init(void)
{
  static gsize builtins_ready = 0;
  /* The built-in ops first: plugins register into a complete registry. */
  if (g_once_init_enter(&builtins_ready)) {
    qkv_registry_init();
    qkv_register_builtin_ops();
    g_once_init_leave(&builtins_ready, 1);
  }
  qkv_plugins_init();
}
