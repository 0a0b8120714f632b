/* builtins.h: the contract between ops/ and the runtime (not installed).
 *
 * The runtime's qkv_init() calls qkv_register_builtin_ops() once, after the
 * registry is up and before any plugin loads; each op family registers its
 * definitions through qkv_register_builtin(), which src/core/registry.c
 * defines. */
#pragma once

#include "qkv/qkv.h"

/* Register a built-in op; a failure is a bug in qkv and aborts. */
void qkv_register_builtin(const QkvOpDef *def);

/* Register every built-in op family (ops/builtins.c). */
void qkv_register_builtin_ops(void);
