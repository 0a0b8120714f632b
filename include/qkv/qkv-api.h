/* qkv-api.h: the mark on every function the shared library exports.
 *
 * libqkv is compiled with -fvisibility=hidden: a function is part of the
 * library's ABI only when its declaration in include/qkv/ starts with
 * QKV_API. Everything else (the runtime's own helpers, the ops' kernels)
 * stays inside the library. tests/test-exports.py checks that the exported
 * symbols and the QKV_API declarations are the same set.
 */
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define QKV_API __attribute__((visibility("default"))) extern
#else
#define QKV_API extern
#endif
