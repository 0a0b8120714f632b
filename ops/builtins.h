/* builtins.h: the contract between ops/ and the runtime (not installed).
 *
 * The runtime's qkv_init() calls qkv_register_builtin_ops() once, after the
 * registry is up and before any plugin loads; it registers every op of every
 * family below through qkv_register_builtin(), which src/core/registry.c
 * defines. */
#pragma once

#include "qkv/qkv.h"

/* Register a built-in op; a failure is a bug in qkv and aborts. */
void qkv_register_builtin(const QkvOpDef *def);

/* Register every built-in op family (ops/builtins.c). */
void qkv_register_builtin_ops(void);

/* The built-in op families, in registration order: one file each,
 * ops/<family>.c (mha's goes on in mha-backward.c), which defines the table
 * qkv_ops_<family>[] of its op definitions (op-def.h). X(family) is applied
 * to each; adding a family means adding it here and its file to
 * ops/meson.build. */
#define QKV_BUILTIN_FAMILIES(X)                                                                    \
  X(matmul)                                                                                        \
  X(elementwise)                                                                                   \
  X(reduce)                                                                                        \
  X(shape)                                                                                         \
  X(softmax)                                                                                       \
  X(embedding)                                                                                     \
  X(loss)                                                                                          \
  X(masked_softmax)                                                                                \
  X(dot_attention)                                                                                 \
  X(mha)                                                                                           \
  X(dropout)                                                                                       \
  X(layer_norm)                                                                                    \
  X(ffn)                                                                                           \
  X(positional)                                                                                    \
  X(additive_attention)                                                                            \
  X(compare)                                                                                       \
  X(select)                                                                                        \
  X(math)                                                                                          \
  X(argreduce)                                                                                     \
  X(index)                                                                                         \
  X(cast)                                                                                          \
  X(view)                                                                                          \
  X(gumbel_softmax)                                                                                \
  X(activation)                                                                                    \
  X(rms_norm)                                                                                      \
  X(kv_cache)
