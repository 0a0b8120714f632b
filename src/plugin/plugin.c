/* plugin.c: the plugin loader.
 *
 * A plugin is a shared module that exports qkv_plugin_describe() (written by
 * QKV_PLUGIN_DEFINE()). Loading checks the file's ELF structure (elf.c), opens
 * it with GModule, checks the descriptor,
 * and calls its register function with the registry's origin set to the
 * module's path, so every op it registers is recorded as its own. A plugin
 * that fails at any step registers nothing: the ops it registered before the
 * failure are removed again and the module is closed. A plugin that loads
 * stays loaded until the process ends (its kernels may be in any plan).
 */
#include "core/core-private.h"
#include "plugin/plugin-private.h"

#include <stdlib.h>
#include <string.h>
#include "error-private.h"

struct _QkvPlugin {
  gchar *name;
  gchar *version;
  gchar *license;
  gchar *description;
  gchar *path;      /* absolute; the origin of its ops */
  gchar *real_path; /* symlinks resolved: identifies the file */
  gchar **ops;      /* sorted */
  GModule *module;
};

/* Held while a plugin loads, so loads do not interleave; recursive, so a
 * register function may look at the plugin list. */
static GRecMutex plugins_lock;
static GPtrArray *plugins; /* QkvPlugin*, load order, never freed */
/* Resolved paths of the modules being loaded now (under plugins_lock): a
 * register function that loads its own module again would otherwise recurse
 * until the stack overflows, since the module is not in plugins yet. */
static GPtrArray *loading;
static gchar **search_path;

/* Smallest descriptor: everything up to the reserved space of ABI 1.0. */
#define QKV_PLUGIN_INFO_MIN_SIZE offsetof(QkvPluginInfo, reserved)

static gboolean
valid_plugin_name(const gchar *name)
{
  if (name == NULL || !g_ascii_isalnum(name[0]))
    return FALSE;
  for (const gchar *p = name; *p; p++)
    if (!g_ascii_isalnum(*p) && *p != '_' && *p != '-' && *p != '.')
      return FALSE;
  return TRUE;
}

static QkvPlugin *
find_plugin_locked(const gchar *real_path, const gchar *name)
{
  for (guint i = 0; plugins != NULL && i < plugins->len; i++) {
    QkvPlugin *p = g_ptr_array_index(plugins, i);
    if ((real_path != NULL && g_str_equal(p->real_path, real_path)) ||
        (name != NULL && g_str_equal(p->name, name)))
      return p;
  }
  return NULL;
}

/* The ops whose origin is origin, sorted. */
static gchar **
ops_with_origin(const gchar *origin)
{
  g_auto(GStrv) names = qkv_op_list();
  GPtrArray *mine = g_ptr_array_new();
  for (guint i = 0; names[i] != NULL; i++) {
    const gchar *o = qkv_op_origin(names[i]);
    if (o != NULL && g_str_equal(o, origin))
      g_ptr_array_add(mine, g_strdup(names[i]));
  }
  g_ptr_array_add(mine, NULL);
  return (gchar **)g_ptr_array_free(mine, FALSE);
}

static void plugin_error(GError **error, const gchar *path, const gchar *format, ...)
    G_GNUC_PRINTF(3, 4);

static void
plugin_error(GError **error, const gchar *path, const gchar *format, ...)
{
  va_list args;
  va_start(args, format);
  g_autofree gchar *reason = g_strdup_vprintf(format, args);
  va_end(args);
  g_set_error(error, QKV_ERROR, QKV_ERROR_PLUGIN, "plugin '%s': %s", path, reason);
}

static QkvPlugin *open_and_register(const gchar *abs_path, const gchar *real_path,
                                    gboolean *name_taken, GError **error);

/* Load one module. *name_taken is set when the only problem is that a plugin
 * of the same name is already loaded from another file. */
static QkvPlugin *
load_locked(const gchar *path, gboolean *name_taken, GError **error)
{
  g_autofree gchar *abs_path = g_canonicalize_filename(path, NULL);
  if (name_taken != NULL)
    *name_taken = FALSE;

  if (!g_file_test(abs_path, G_FILE_TEST_EXISTS)) {
    plugin_error(error, abs_path, "no such file");
    return NULL;
  }
  if (g_file_test(abs_path, G_FILE_TEST_IS_DIR)) {
    plugin_error(error, abs_path, "is a directory, not a module");
    return NULL;
  }
  char *resolved = realpath(abs_path, NULL);
  g_autofree gchar *real_path = g_strdup(resolved ? resolved : abs_path);
  free(resolved);

  QkvPlugin *loaded = find_plugin_locked(real_path, NULL);
  if (loaded != NULL)
    return loaded;
  if (loading != NULL && g_ptr_array_find_with_equal_func(loading, real_path, g_str_equal, NULL)) {
    plugin_error(error, abs_path,
                 "is being loaded already: loading it again from its own register function (or "
                 "a module it loads) would never end");
    return NULL;
  }

  /* dlopen() maps the file as its headers describe it; a truncated file
   * makes that raise SIGBUS, which no caller could recover from. */
  GError *elf_error = NULL;
  if (!qkv_elf_check_file(abs_path, &elf_error)) {
    plugin_error(error, abs_path, "not a loadable module: %s", elf_error->message);
    g_error_free(elf_error);
    return NULL;
  }

  if (loading == NULL)
    loading = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_add(loading, g_strdup(real_path));
  QkvPlugin *plugin = open_and_register(abs_path, real_path, name_taken, error);
  g_ptr_array_remove_index(loading, loading->len - 1);
  return plugin;
}

/* The part of load_locked() that runs while real_path is marked as loading. */
static QkvPlugin *
open_and_register(const gchar *abs_path, const gchar *real_path, gboolean *name_taken,
                  GError **error)
{
  GModule *module = g_module_open(abs_path, G_MODULE_BIND_LOCAL);
  if (module == NULL) {
    /* dlerror() starts with the path; the message names it already. */
    const gchar *why = g_module_error();
    if (g_str_has_prefix(why, abs_path) && g_str_has_prefix(why + strlen(abs_path), ": "))
      why += strlen(abs_path) + 2;
    plugin_error(error, abs_path, "not a loadable module: %s", why);
    return NULL;
  }

  gpointer symbol = NULL;
  if (!g_module_symbol(module, QKV_PLUGIN_DESCRIBE_SYMBOL, &symbol) || symbol == NULL) {
    plugin_error(error, abs_path,
                 "no plugin descriptor: the module does not export %s() "
                 "(define it with QKV_PLUGIN_DEFINE())",
                 QKV_PLUGIN_DESCRIBE_SYMBOL);
    g_module_close(module);
    return NULL;
  }
  /* dlsym() gives a data pointer; ISO C has no cast from it to a function
   * pointer, so copy the bits (POSIX guarantees they are the same). */
  QkvPluginDescribeFunc describe;
  G_STATIC_ASSERT(sizeof describe == sizeof symbol);
  memcpy(&describe, &symbol, sizeof describe);
  const QkvPluginInfo *given = describe();

  /* Check what the descriptor claims before reading fields it may not have. */
  gchar *why = NULL;
  if (given == NULL)
    why = g_strdup_printf("%s() returned NULL", QKV_PLUGIN_DESCRIBE_SYMBOL);
  else if (given->struct_size < offsetof(QkvPluginInfo, name))
    why = g_strdup_printf("the descriptor's struct_size %u is smaller than the minimum %u",
                          given->struct_size, (guint)QKV_PLUGIN_INFO_MIN_SIZE);
  else if (given->abi_major != QKV_OP_ABI_MAJOR)
    why = g_strdup_printf("built for op ABI %u.%u, but this qkv has ABI %d.%d: the major "
                          "version differs, rebuild the plugin against this qkv",
                          given->abi_major, given->abi_minor, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
  else if (given->abi_minor > QKV_OP_ABI_MINOR)
    why = g_strdup_printf("built for op ABI %u.%u, newer than this qkv's %d.%d: update qkv "
                          "or rebuild the plugin against this one",
                          given->abi_major, given->abi_minor, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
  else if (given->struct_size < QKV_PLUGIN_INFO_MIN_SIZE)
    why = g_strdup_printf("the descriptor's struct_size %u is smaller than the minimum %u",
                          given->struct_size, (guint)QKV_PLUGIN_INFO_MIN_SIZE);
  QkvPluginInfo info = {0};
  if (why == NULL) {
    memcpy(&info, given, MIN((gsize)given->struct_size, sizeof info));
    if (!valid_plugin_name(info.name))
      why = g_strdup_printf("the descriptor's name '%s' is not valid (letters, digits, '_', '-' "
                            "and '.', starting with a letter or digit)",
                            info.name ? info.name : "(null)");
    else if (info.register_ops == NULL)
      why = g_strdup_printf("plugin '%s' has no register function", info.name);
  }
  if (why == NULL) {
    QkvPlugin *same_name = find_plugin_locked(NULL, info.name);
    if (same_name != NULL) {
      why = g_strdup_printf("a plugin named '%s' is already loaded from %s", info.name,
                            same_name->path);
      if (name_taken != NULL)
        *name_taken = TRUE;
    }
  }
  if (why != NULL) {
    plugin_error(error, abs_path, "%s", why);
    g_free(why);
    g_module_close(module);
    return NULL;
  }

  /* Ops registered from here on, on this thread, carry abs_path as origin. */
  const gchar *previous = qkv_registry_set_origin(abs_path);
  GError *register_error = NULL;
  gboolean ok = info.register_ops(&register_error);
  qkv_registry_set_origin(previous);
  gchar **ops = ops_with_origin(abs_path);

  if (!ok) {
    for (guint i = 0; ops[i] != NULL; i++)
      qkv_registry_unregister(ops[i]);
    if (register_error != NULL)
      plugin_error(error, abs_path, "registering its ops failed: %s", register_error->message);
    else
      plugin_error(error, abs_path,
                   "registering its ops failed: the register function of plugin '%s' returned "
                   "FALSE without an error",
                   info.name);
    g_clear_error(&register_error);
    g_strfreev(ops);
    g_module_close(module);
    return NULL;
  }
  g_clear_error(&register_error);

  /* Its kernels may end up in any plan: never unload it. */
  g_module_make_resident(module);
  QkvPlugin *plugin = g_new0(QkvPlugin, 1);
  plugin->name = g_strdup(info.name);
  plugin->version = g_strdup(info.version ? info.version : "");
  plugin->license = g_strdup(info.license ? info.license : "");
  plugin->description = g_strdup(info.description ? info.description : "");
  plugin->path = g_strdup(abs_path);
  plugin->real_path = g_strdup(real_path);
  plugin->ops = ops;
  plugin->module = module;
  if (plugins == NULL)
    plugins = g_ptr_array_new();
  g_ptr_array_add(plugins, plugin);
  g_debug("loaded plugin '%s' %s from %s (%u ops)", plugin->name, plugin->version, plugin->path,
          g_strv_length(plugin->ops));
  return plugin;
}

const QkvPlugin *
qkv_plugin_load(const gchar *path, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(path != NULL, NULL);
  qkv_init();
  g_rec_mutex_lock(&plugins_lock);
  QkvPlugin *plugin = load_locked(path, NULL, error);
  g_rec_mutex_unlock(&plugins_lock);
  return plugin;
}

static gchar **
build_search_path(void)
{
  GPtrArray *dirs = g_ptr_array_new();
  const gchar *user = g_getenv("QKV_PLUGIN_PATH");
  const gchar *system = g_getenv("QKV_PLUGIN_SYSTEM_PATH");
  if (system == NULL)
    system = QKV_PLUGIN_DIR;
  const gchar *lists[] = {user, system};
  for (guint l = 0; l < G_N_ELEMENTS(lists); l++) {
    if (lists[l] == NULL)
      continue;
    g_auto(GStrv) parts = g_strsplit(lists[l], G_SEARCHPATH_SEPARATOR_S, -1);
    for (guint i = 0; parts[i] != NULL; i++)
      if (parts[i][0] != '\0')
        g_ptr_array_add(dirs, g_strdup(parts[i]));
  }
  g_ptr_array_add(dirs, NULL);
  return (gchar **)g_ptr_array_free(dirs, FALSE);
}

static void
autoload_file(const gchar *path)
{
  g_autoptr(GError) error = NULL;
  gboolean name_taken = FALSE;
  if (load_locked(path, &name_taken, &error) != NULL)
    return;
  /* An earlier directory had a plugin of that name: QKV_PLUGIN_PATH comes
   * first, so a development copy overrides the installed one. */
  if (name_taken)
    g_debug("%s (skipped)", error->message);
  else
    g_warning("%s (skipped)", error->message);
}

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const gchar *const *)a, *(const gchar *const *)b);
}

static void
autoload_dir(const gchar *dir_path)
{
  if (g_file_test(dir_path, G_FILE_TEST_IS_REGULAR)) {
    autoload_file(dir_path);
    return;
  }
  g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
  if (dir == NULL)
    return; /* a directory that does not exist holds no plugins */
  g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(g_free);
  const gchar *entry;
  while ((entry = g_dir_read_name(dir)) != NULL) {
    if (!g_str_has_suffix(entry, "." G_MODULE_SUFFIX))
      continue;
    gchar *file = g_build_filename(dir_path, entry, NULL);
    if (g_file_test(file, G_FILE_TEST_IS_REGULAR))
      g_ptr_array_add(files, file);
    else
      g_free(file);
  }
  /* A fixed order, so which of two clashing plugins wins does not depend on
   * the file system. */
  g_ptr_array_sort(files, compare_strings);
  for (guint i = 0; i < files->len; i++)
    autoload_file(g_ptr_array_index(files, i));
}

void
qkv_plugins_init(void)
{
  static gsize done = 0;
  /* A register function that calls back into qkv (qkv_op_lookup(),
   * qkv_graph_new(), ...) reaches qkv_init() again on this thread: the
   * registry is ready by then, so it returns at once instead of waiting for
   * itself. */
  static _Thread_local gboolean loading = FALSE;
  if (loading)
    return;
  if (g_once_init_enter(&done)) {
    loading = TRUE;
    g_rec_mutex_lock(&plugins_lock);
    search_path = build_search_path();
    for (guint i = 0; search_path[i] != NULL; i++)
      autoload_dir(search_path[i]);
    g_rec_mutex_unlock(&plugins_lock);
    loading = FALSE;
    g_once_init_leave(&done, 1);
  }
}

const gchar *const *
qkv_plugin_search_path(void)
{
  qkv_init();
  return (const gchar *const *)search_path;
}

guint
qkv_plugin_count(void)
{
  qkv_init();
  g_rec_mutex_lock(&plugins_lock);
  guint n = plugins ? plugins->len : 0;
  g_rec_mutex_unlock(&plugins_lock);
  return n;
}

const QkvPlugin *
qkv_plugin_nth(guint index)
{
  qkv_init();
  g_rec_mutex_lock(&plugins_lock);
  QkvPlugin *p = (plugins && index < plugins->len) ? g_ptr_array_index(plugins, index) : NULL;
  g_rec_mutex_unlock(&plugins_lock);
  return p;
}

const QkvPlugin *
qkv_plugin_lookup(const gchar *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  qkv_init();
  g_rec_mutex_lock(&plugins_lock);
  QkvPlugin *p = find_plugin_locked(NULL, name);
  g_rec_mutex_unlock(&plugins_lock);
  return p;
}

const gchar *
qkv_plugin_get_name(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return plugin->name;
}

const gchar *
qkv_plugin_get_version(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return plugin->version;
}

const gchar *
qkv_plugin_get_license(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return plugin->license;
}

const gchar *
qkv_plugin_get_description(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return plugin->description;
}

const gchar *
qkv_plugin_get_path(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return plugin->path;
}

const gchar *const *
qkv_plugin_get_ops(const QkvPlugin *plugin)
{
  g_return_val_if_fail(plugin != NULL, NULL);
  return (const gchar *const *)plugin->ops;
}
