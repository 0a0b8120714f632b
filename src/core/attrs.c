/* attrs.c: node attributes, parsed once from a{sv} against the op's schema.
 *
 * Kernels look attributes up by name on every run, so the parsed form is a
 * flat array that lookups scan without allocating. */
#include "core/core-private.h"

#include <string.h>

static const gchar *
attr_type_name(QkvAttrType type)
{
  switch (type) {
  case QKV_ATTR_INT:
    return "an int";
  case QKV_ATTR_FLOAT:
    return "a float";
  case QKV_ATTR_BOOL:
    return "a bool";
  case QKV_ATTR_INTS:
    return "an int array";
  case QKV_ATTR_STRING:
    return "a string";
  }
  return "?";
}

static gboolean
parse_value(QkvAttrEntry *e, GVariant *v)
{
  const GVariantType *t = g_variant_get_type(v);
  switch (e->type) {
  case QKV_ATTR_INT:
    if (g_variant_type_equal(t, G_VARIANT_TYPE_INT64))
      e->int_value = g_variant_get_int64(v);
    else if (g_variant_type_equal(t, G_VARIANT_TYPE_INT32))
      e->int_value = g_variant_get_int32(v);
    else
      return FALSE;
    return TRUE;
  case QKV_ATTR_FLOAT:
    if (g_variant_type_equal(t, G_VARIANT_TYPE_DOUBLE))
      e->float_value = g_variant_get_double(v);
    else if (g_variant_type_equal(t, G_VARIANT_TYPE_INT64))
      e->float_value = (double)g_variant_get_int64(v);
    else if (g_variant_type_equal(t, G_VARIANT_TYPE_INT32))
      e->float_value = g_variant_get_int32(v);
    else
      return FALSE;
    return TRUE;
  case QKV_ATTR_BOOL:
    if (!g_variant_type_equal(t, G_VARIANT_TYPE_BOOLEAN))
      return FALSE;
    e->int_value = g_variant_get_boolean(v);
    return TRUE;
  case QKV_ATTR_INTS: {
    gsize n = 0;
    g_clear_pointer(&e->ints, g_free);
    if (g_variant_type_equal(t, G_VARIANT_TYPE("ax"))) {
      const gint64 *d = g_variant_get_fixed_array(v, &n, sizeof(gint64));
      e->ints = g_new0(gint64, MAX(n, 1));
      if (n > 0)
        memcpy(e->ints, d, n * sizeof(gint64));
    } else if (g_variant_type_equal(t, G_VARIANT_TYPE("ai"))) {
      const gint32 *d = g_variant_get_fixed_array(v, &n, sizeof(gint32));
      e->ints = g_new0(gint64, MAX(n, 1));
      for (gsize i = 0; i < n; i++)
        e->ints[i] = d[i];
    } else {
      return FALSE;
    }
    e->n_ints = (guint)n;
    return TRUE;
  }
  case QKV_ATTR_STRING:
    if (!g_variant_type_equal(t, G_VARIANT_TYPE_STRING))
      return FALSE;
    g_free(e->string_value);
    e->string_value = g_variant_dup_string(v, NULL);
    return TRUE;
  }
  return FALSE;
}

QkvAttrs *
qkv_attrs_parse(const QkvOpDef *def, const gchar *node_name, GVariant *variant, GError **error)
{
  if (variant != NULL && !g_variant_is_of_type(variant, G_VARIANT_TYPE_VARDICT)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE,
                "op '%s' (node %s): attributes must be a GVariant of type a{sv}, not %s", def->name,
                node_name, g_variant_get_type_string(variant));
    return NULL;
  }
  QkvAttrs *attrs = g_new0(QkvAttrs, 1);
  attrs->n = def->n_attrs;
  attrs->entries = g_new0(QkvAttrEntry, MAX(def->n_attrs, 1));
  for (guint i = 0; i < def->n_attrs; i++) {
    const QkvAttrSpec *spec = &def->attrs[i];
    QkvAttrEntry *e = &attrs->entries[i];
    e->name = spec->name;
    e->type = spec->type;
    e->int_value = spec->default_int;
    e->float_value = spec->default_float;
    e->string_value = g_strdup(spec->default_string);
  }
  if (variant != NULL) {
    GVariantIter iter;
    const gchar *key;
    GVariant *value;
    g_variant_iter_init(&iter, variant);
    while (g_variant_iter_next(&iter, "{&sv}", &key, &value)) {
      QkvAttrEntry *e = NULL;
      for (guint i = 0; i < attrs->n; i++)
        if (g_str_equal(attrs->entries[i].name, key))
          e = &attrs->entries[i];
      gboolean ok = FALSE;
      if (e == NULL)
        g_set_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE,
                    "op '%s' (node %s): unknown attribute '%s'", def->name, node_name, key);
      else if (e->given) /* an a{sv} may repeat a key */
        g_set_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE,
                    "op '%s' (node %s): attribute '%s' is given twice", def->name, node_name, key);
      else if (!parse_value(e, value))
        g_set_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE,
                    "op '%s' (node %s): attribute '%s' must be %s, got GVariant type '%s'",
                    def->name, node_name, key, attr_type_name(e->type),
                    g_variant_get_type_string(value));
      else
        ok = e->given = TRUE;
      g_variant_unref(value);
      if (!ok) {
        qkv_attrs_free(attrs);
        return NULL;
      }
    }
  }
  for (guint i = 0; i < def->n_attrs; i++) {
    if (def->attrs[i].required && !attrs->entries[i].given) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_ATTRIBUTE,
                  "op '%s' (node %s): missing required attribute '%s' (%s)", def->name, node_name,
                  def->attrs[i].name, attr_type_name(def->attrs[i].type));
      qkv_attrs_free(attrs);
      return NULL;
    }
  }
  return attrs;
}

void
qkv_attrs_free(QkvAttrs *attrs)
{
  if (attrs == NULL)
    return;
  for (guint i = 0; i < attrs->n; i++) {
    g_free(attrs->entries[i].ints);
    g_free(attrs->entries[i].string_value);
  }
  g_free(attrs->entries);
  g_free(attrs);
}

static const QkvAttrEntry *
find(const QkvAttrs *attrs, const gchar *name, QkvAttrType type)
{
  for (guint i = 0; i < attrs->n; i++) {
    const QkvAttrEntry *e = &attrs->entries[i];
    if (strcmp(e->name, name) == 0) {
      if (e->type != type && !(type == QKV_ATTR_INT && e->type == QKV_ATTR_BOOL))
        g_critical("attribute '%s' is a %s, read as a %s", name, attr_type_name(e->type),
                   attr_type_name(type));
      return e;
    }
  }
  g_critical("attribute '%s' is not in the op's schema", name);
  return NULL;
}

gint64
qkv_attrs_get_int(const QkvAttrs *attrs, const gchar *name)
{
  const QkvAttrEntry *e = find(attrs, name, QKV_ATTR_INT);
  return e ? e->int_value : 0;
}

double
qkv_attrs_get_float(const QkvAttrs *attrs, const gchar *name)
{
  const QkvAttrEntry *e = find(attrs, name, QKV_ATTR_FLOAT);
  return e ? e->float_value : 0.0;
}

gboolean
qkv_attrs_get_bool(const QkvAttrs *attrs, const gchar *name)
{
  const QkvAttrEntry *e = find(attrs, name, QKV_ATTR_BOOL);
  return e ? e->int_value != 0 : FALSE;
}

const gint64 *
qkv_attrs_get_ints(const QkvAttrs *attrs, const gchar *name, guint *n)
{
  const QkvAttrEntry *e = find(attrs, name, QKV_ATTR_INTS);
  if (n != NULL)
    *n = e ? e->n_ints : 0;
  return e ? e->ints : NULL;
}

const gchar *
qkv_attrs_get_string(const QkvAttrs *attrs, const gchar *name)
{
  const QkvAttrEntry *e = find(attrs, name, QKV_ATTR_STRING);
  return e ? e->string_value : NULL;
}

gboolean
qkv_attrs_has(const QkvAttrs *attrs, const gchar *name)
{
  for (guint i = 0; i < attrs->n; i++)
    if (strcmp(attrs->entries[i].name, name) == 0)
      return attrs->entries[i].given;
  return FALSE;
}

gchar *
qkv_attrs_to_string(const QkvAttrs *attrs)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < attrs->n; i++) {
    const QkvAttrEntry *e = &attrs->entries[i];
    if (s->len)
      g_string_append(s, ", ");
    g_string_append_printf(s, "%s=", e->name);
    switch (e->type) {
    case QKV_ATTR_INT:
      g_string_append_printf(s, "%" G_GINT64_FORMAT, e->int_value);
      break;
    case QKV_ATTR_FLOAT:
      g_string_append_printf(s, "%g", e->float_value);
      break;
    case QKV_ATTR_BOOL:
      g_string_append(s, e->int_value ? "true" : "false");
      break;
    case QKV_ATTR_INTS:
      g_string_append_c(s, '[');
      for (guint j = 0; j < e->n_ints; j++)
        g_string_append_printf(s, "%s%" G_GINT64_FORMAT, j ? "," : "", e->ints[j]);
      g_string_append_c(s, ']');
      break;
    case QKV_ATTR_STRING:
      g_string_append_printf(s, "\"%s\"", e->string_value ? e->string_value : "");
      break;
    }
  }
  return g_string_free(s, FALSE);
}
