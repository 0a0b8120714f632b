/* builtins.c: registers the tables of the built-in op families at init. */
#include "ops-common.h"

static void
register_table(const QkvOpDef *defs)
{
  for (const QkvOpDef *def = defs; def->name != NULL; def++)
    qkv_register_builtin(def);
}

void
qkv_register_builtin_ops(void)
{
#define REGISTER_FAMILY(family) register_table(qkv_ops_##family);
  QKV_BUILTIN_FAMILIES(REGISTER_FAMILY)
#undef REGISTER_FAMILY
}
