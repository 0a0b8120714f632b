/* qkv-plugin.h: the op ABI, shared by built-in ops and plugins.
 *
 * An op is a QkvOpDef: its name, inputs, outputs, attribute schema, a shape
 * rule run when a node is added, a forward kernel run by plans, and a gradient
 * rule that adds gradient nodes to the graph (or, failing that, a
 * decomposition into existing ops that autodiff differentiates through). The
 * struct is versioned and append-only: a definition compiled against an older
 * header (smaller struct_size, or an older minor version, same major) keeps
 * registering, with the newer fields zeroed.
 *
 * A plugin is a shared module that registers ops through the same QkvOpDef.
 * It describes itself with QKV_PLUGIN_DEFINE() (qkv-plugin-load.h) and
 * is loaded by qkv_plugin_load() or found at initialisation in the
 * directories of QKV_PLUGIN_PATH and in the installed plugin directory.
 *
 * ABI history: 1.0 first version; 1.1 QkvOpDef.decompose; 1.2 qkv_kernel_fail()
 * (a kernel fails the run; QkvKernelCtx.reserved[0] became the executor's).
 *
 * This header holds no declarations of its own: it includes the three parts,
 * each of which can also be included alone:
 *   qkv-plugin-op.h      defining an op: QkvOpDef, its contexts, registering
 *   qkv-plugin-kernel.h  what kernels call: threads, GEMM, vector math, random
 *   qkv-plugin-load.h    plugins: describing, loading and listing them
 */
#pragma once

#include "qkv-plugin-op.h"
#include "qkv-plugin-kernel.h"
#include "qkv-plugin-load.h"
