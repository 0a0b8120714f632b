/* qkv.h: everything in the public API.
 *
 * qkv is a C library for building, differentiating and training tensor
 * computation graphs, with the attention family as first-class ops.
 */
#pragma once

#include "qkv-api.h"
#include "qkv-version.h"
#include "qkv-error.h"
#include "qkv-tensor.h"
#include "qkv-params.h"
#include "qkv-graph.h"
#include "qkv-ops.h"
#include "qkv-nn.h"
#include "qkv-plan.h"
#include "qkv-plugin.h"
#include "qkv-check.h"
#include "qkv-init.h"
#include "qkv-optim.h"
#include "qkv-checkpoint.h"
#include "qkv-builders.h"
#include "qkv-decode.h"
#include "qkv-bleu.h"

G_BEGIN_DECLS

/**
 * qkv_init:
 *
 * Initialise the library: register the built-in ops, then load the plugins
 * found in the directories of QKV_PLUGIN_PATH and in the installed plugin
 * directory (a plugin that fails to load is a warning). Every entry point
 * calls it on demand; calling it again is harmless.
 */
QKV_API
void qkv_init(void);
/**
 * qkv_version:
 *
 * The library version, "MAJOR.MINOR.PATCH".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_version(void);

G_END_DECLS
