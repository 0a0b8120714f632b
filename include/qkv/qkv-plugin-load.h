/* qkv-plugin-load.h: plugins (part of qkv-plugin.h): how a shared module
 * describes itself (QkvPluginInfo, QKV_PLUGIN_DEFINE()), loading it, and
 * listing the plugins loaded. */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include <gmodule.h>
#include "qkv-plugin-op.h"

G_BEGIN_DECLS

/**
 * QkvPluginInfo:
 *
 * What a plugin says about itself. abi_major/abi_minor are the op ABI of the
 * header the plugin was compiled against (QKV_OP_ABI_MAJOR/MINOR): the loader
 * refuses a different major or a newer minor. Strings must stay valid while
 * the module is loaded (string literals are right).
 */
typedef struct {
  guint32 struct_size; /* sizeof(QkvPluginInfo) as the author compiled it */
  guint16 abi_major;
  guint16 abi_minor;
  const gchar *name;        /* "gelu": letters, digits, '_', '-', '.' */
  const gchar *version;     /* "1.0.0" */
  const gchar *license;     /* "MIT" */
  const gchar *description; /* one line */
  /* Registers the plugin's ops with qkv_op_register(); on failure returns
   * FALSE (with error set), and every op it registered is removed again. */
  gboolean (*register_ops)(GError **error);
  /* Zero. New fields are taken from here, so the struct keeps its size. */
  gpointer reserved[8];
} QkvPluginInfo;

/**
 * QKV_PLUGIN_DESCRIBE_SYMBOL:
 *
 * The one symbol the loader looks up in a module.
 */
#define QKV_PLUGIN_DESCRIBE_SYMBOL "qkv_plugin_describe"
/**
 * QkvPluginDescribeFunc:
 *
 * The signature of a plugin describe func.
 *
 * Returns: as described above
 */
typedef const QkvPluginInfo *(*QkvPluginDescribeFunc)(void);

/**
 * QKV_PLUGIN_DEFINE:
 * @name_: the name
 * @version_: the version
 * @license_: the license
 * @description_: the description
 * @register_func_: the register func
 *
 * Define the plugin's descriptor; use once, at file scope, in one source file
 * of the module:
 *
 *   QKV_PLUGIN_DEFINE("gelu", "1.0.0", "MIT", "GELU activation", register_gelu);
 */
#define QKV_PLUGIN_DEFINE(name_, version_, license_, description_, register_func_)                 \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void);                                  \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void)                                   \
  {                                                                                                \
    static const QkvPluginInfo info = {                                                            \
        .struct_size = sizeof(QkvPluginInfo),                                                      \
        .abi_major = QKV_OP_ABI_MAJOR,                                                             \
        .abi_minor = QKV_OP_ABI_MINOR,                                                             \
        .name = (name_),                                                                           \
        .version = (version_),                                                                     \
        .license = (license_),                                                                     \
        .description = (description_),                                                             \
        .register_ops = (register_func_),                                                          \
    };                                                                                             \
    return &info;                                                                                  \
  }                                                                                                \
  G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void)

/**
 * QkvPlugin:
 *
 * A loaded plugin; owned by the library, valid until the process ends
 * (plugins are never unloaded).
 */
typedef struct _QkvPlugin QkvPlugin;

/**
 * qkv_plugin_load:
 * @path: the path
 * @error: return location for a #GError, or %NULL
 *
 * Load the plugin module at path and register its ops, whose origin
 * (qkv_op_origin()) becomes the module's absolute path. Before the module is
 * opened its ELF headers are checked against the file: a truncated or
 * damaged file, or one built for another machine, is refused instead of
 * being handed to the dynamic loader. On any failure (file missing, truncated
 * or not a module, no descriptor, an incompatible ABI, a descriptor too
 * small, an op name already taken, a failing register function, a register
 * function that loads its own module again: that inner load fails) returns
 * NULL with a QKV_ERROR_PLUGIN error naming the file and the reason; the
 * plugin then registers nothing and the library is unchanged. Loading a file
 * that is already loaded (the same file, by its resolved path) does nothing
 * and returns the plugin loaded before; a different file with the name of a
 * loaded plugin is an error.
 *
 * Returns: (transfer none) (nullable): a #QkvPlugin, or %NULL with @error set
 */
QKV_API
const QkvPlugin *qkv_plugin_load(const gchar *path, GError **error);
/**
 * qkv_plugin_count:
 *
 * The loaded plugins in load order, those found at initialisation first.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_plugin_count(void);
/**
 * qkv_plugin_nth:
 * @index: the index
 *
 * See qkv_plugin_count().
 *
 * Returns: (transfer none): a #QkvPlugin
 */
QKV_API
const QkvPlugin *qkv_plugin_nth(guint index);
/**
 * qkv_plugin_lookup:
 * @name: (nullable): the name
 *
 * The loaded plugin of that name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvPlugin
 */
QKV_API
const QkvPlugin *qkv_plugin_lookup(const gchar *name);
/**
 * qkv_plugin_get_name:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_name(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_version:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_version(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_license:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_license(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_description:
 * @plugin: a #QkvPlugin
 *
 * See qkv_plugin_lookup().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_description(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_path:
 * @plugin: a #QkvPlugin
 *
 * The module's absolute path.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_plugin_get_path(const QkvPlugin *plugin);
/**
 * qkv_plugin_get_ops:
 * @plugin: a #QkvPlugin
 *
 * The names of the ops it registered, sorted, NULL-terminated.
 *
 * Returns: (transfer none) (array zero-terminated=1): the strings
 */
QKV_API
const gchar *const *qkv_plugin_get_ops(const QkvPlugin *plugin);
/**
 * qkv_plugin_search_path:
 *
 * The directories searched at initialisation, in order, NULL-terminated:
 * those of QKV_PLUGIN_PATH (colon-separated), then the installed plugin
 * directory (QKV_PLUGIN_SYSTEM_PATH replaces it; set it empty for none).
 *
 * Returns: (transfer none) (array zero-terminated=1): the strings
 */
QKV_API
const gchar *const *qkv_plugin_search_path(void);

G_END_DECLS
