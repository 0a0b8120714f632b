/* registry.c: the op registry, shared by built-in ops and plugins. */
#include "core/core-private.h"

#include <string.h>
#include "error-private.h"

typedef struct {
  QkvOpDef def; /* the library's own layout, newer fields zeroed for older callers */
  gchar *origin;
} OpEntry;

static GHashTable *ops; /* name -> OpEntry* */
static GMutex ops_lock;
/* Per thread, so that a plugin loading on one thread does not lend its origin
 * to ops another thread registers meanwhile. */
static _Thread_local const gchar *current_origin = "built-in";

static gboolean
valid_op_name(const gchar *name)
{
  if (name == NULL || !g_ascii_isalpha(name[0]))
    return FALSE;
  for (const gchar *p = name; *p; p++)
    if (!g_ascii_isalnum(*p) && *p != '_' && *p != '.')
      return FALSE;
  return TRUE;
}

/* Smallest struct_size a definition can have: everything up to the reserved
 * space of ABI 1.0, where the first 1.1 field (decompose) now sits. */
#define QKV_OP_DEF_MIN_SIZE offsetof(QkvOpDef, decompose)

static gboolean
register_locked(const QkvOpDef *def, GError **error)
{
  const gchar *name = def->name ? def->name : "(null)";
  if (def->abi_major != QKV_OP_ABI_MAJOR) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': built for op ABI %u.%u, but this qkv has ABI %d.%d (major differs)", name,
                def->abi_major, def->abi_minor, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
    return FALSE;
  }
  if (def->abi_minor > QKV_OP_ABI_MINOR) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': built for op ABI %u.%u, newer than this qkv's %d.%d", name,
                def->abi_major, def->abi_minor, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
    return FALSE;
  }
  if (def->struct_size < QKV_OP_DEF_MIN_SIZE) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': struct_size %u is smaller than the minimum %u", name, def->struct_size,
                (guint)QKV_OP_DEF_MIN_SIZE);
    return FALSE;
  }
  if (!valid_op_name(def->name)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op name '%s' is not valid (letters, digits, '_' and '.', starting with a letter)",
                name);
    return FALSE;
  }
  if (def->shape == NULL || def->forward == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': a shape rule and a forward kernel are required", name);
    return FALSE;
  }
  if (def->max_inputs >= 0 && (guint)def->max_inputs < def->min_inputs) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': max_inputs %d is below min_inputs %u", name, def->max_inputs,
                def->min_inputs);
    return FALSE;
  }
  if (def->n_attrs > 0 && def->attrs == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "op '%s': n_attrs is %u but attrs is NULL", name, def->n_attrs);
    return FALSE;
  }
  for (guint i = 0; i < def->n_attrs; i++) {
    if (def->attrs[i].name == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "op '%s': attribute %u has no name",
                  name, i);
      return FALSE;
    }
  }
  if (g_hash_table_contains(ops, def->name)) {
    OpEntry *old = g_hash_table_lookup(ops, def->name);
    g_set_error(error, QKV_ERROR, QKV_ERROR_EXISTS, "op '%s' is already registered (by %s)", name,
                old->origin);
    return FALSE;
  }
  OpEntry *entry = g_new0(OpEntry, 1);
  memcpy(&entry->def, def, MIN((gsize)def->struct_size, sizeof(QkvOpDef)));
  /* Fields newer than the author's header were reserved space to them. */
  if (def->abi_minor < 1)
    entry->def.decompose = NULL;
  if (def->abi_minor < 3)
    entry->def.bf16_outputs = entry->def.bf16_inputs = 0;
  memset(entry->def.reserved, 0, sizeof entry->def.reserved);
  entry->def.struct_size = sizeof(QkvOpDef);
  entry->origin = g_strdup(current_origin);
  g_hash_table_insert(ops, (gpointer)entry->def.name, entry);
  return TRUE;
}

void
qkv_registry_init(void)
{
  static gsize initialised = 0;
  if (g_once_init_enter(&initialised)) {
    ops = g_hash_table_new(g_str_hash, g_str_equal);
    g_once_init_leave(&initialised, 1);
  }
}

void
qkv_register_builtin(const QkvOpDef *def)
{
  g_autoptr(GError) error = NULL;
  g_mutex_lock(&ops_lock);
  gboolean ok = register_locked(def, &error);
  g_mutex_unlock(&ops_lock);
  if (!ok)
    g_error("qkv: registering a built-in op failed: %s", error->message);
}

gboolean
qkv_op_register(const QkvOpDef *def, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(def != NULL, FALSE);
  qkv_init();
  g_mutex_lock(&ops_lock);
  gboolean ok = register_locked(def, error);
  g_mutex_unlock(&ops_lock);
  return ok;
}

const gchar *
qkv_registry_set_origin(const gchar *origin)
{
  const gchar *old = current_origin;
  current_origin = origin ? origin : "built-in";
  return old;
}

void
qkv_registry_unregister(const gchar *name)
{
  g_mutex_lock(&ops_lock);
  OpEntry *entry = g_hash_table_lookup(ops, name);
  if (entry != NULL) {
    g_hash_table_remove(ops, name);
    g_free(entry->origin);
    g_free(entry);
  }
  g_mutex_unlock(&ops_lock);
}

const QkvOpDef *
qkv_op_lookup(const gchar *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  qkv_init();
  g_mutex_lock(&ops_lock);
  OpEntry *entry = g_hash_table_lookup(ops, name);
  g_mutex_unlock(&ops_lock);
  return entry ? &entry->def : NULL;
}

const gchar *
qkv_op_origin(const gchar *name)
{
  qkv_init();
  g_mutex_lock(&ops_lock);
  OpEntry *entry = g_hash_table_lookup(ops, name);
  g_mutex_unlock(&ops_lock);
  return entry ? entry->origin : NULL;
}

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const gchar *const *)a, *(const gchar *const *)b);
}

gchar **
qkv_op_list(void)
{
  qkv_init();
  g_mutex_lock(&ops_lock);
  guint n = g_hash_table_size(ops);
  gchar **names = g_new0(gchar *, n + 1);
  GHashTableIter iter;
  gpointer key;
  guint i = 0;
  g_hash_table_iter_init(&iter, ops);
  while (g_hash_table_iter_next(&iter, &key, NULL))
    names[i++] = g_strdup(key);
  g_mutex_unlock(&ops_lock);
  qsort(names, n, sizeof(gchar *), compare_strings);
  return names;
}
