/* plugin-private.h: the plugin loader's entry points for qkv_init() and the
 * ELF checks it runs before dlopen() (not installed). */
#pragma once

#include "qkv/qkv.h"

/* Load the plugins of qkv_plugin_search_path(); failures are warnings. */
void qkv_plugins_init(void);
/* elf.c: whether data (or the file at path) is a complete ELF shared object
 * for this machine, every header and segment inside the file, so that
 * dlopen() reads nothing past its end. The error (QKV_ERROR_PLUGIN) says what
 * is wrong, without the file name. */
gboolean qkv_elf_check_shared_object(const guint8 *data, gsize size, GError **error);
gboolean qkv_elf_check_file(const gchar *path, GError **error);

