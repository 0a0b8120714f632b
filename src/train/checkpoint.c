/* checkpoint.c: safetensors checkpoints — atomic save, validated load. */
#include "core/core-private.h"
#include "qkv/qkv-checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OPTIM_PREFIX "__optim__."
#define METADATA_KEY "__metadata__"
/* the reference implementation refuses larger headers too */
#define MAX_HEADER_LEN G_GUINT64_CONSTANT(100000000)

typedef enum {
  ST_F32,
  ST_I32,
  ST_I64,
} StDType;

typedef struct {
  gchar *name;
  StDType dtype;
  QkvShape shape;
  guint64 begin, end; /* relative to the data section */
} Entry;

/* A parsed, fully checked file. */
typedef struct {
  gchar *path;
  gchar *contents;
  gsize size;
  guint64 data_start;   /* 8 + header length */
  GPtrArray *entries;   /* Entry*, header order */
  GHashTable *by_name;  /* name -> Entry* */
  GHashTable *metadata; /* gchar* -> gchar* */
} StFile;

/* Deeper nesting than any safetensors header needs is refused before parsing. */
#define MAX_JSON_DEPTH 16

/* A pass over the raw header before json-glib sees it, for what json-glib
 * lets through: nesting deep enough to overflow its recursive parser, an
 * escaped NUL (json-glib returns C strings, so "a.weight\u0000evil" would
 * become "a.weight"), and text after the first JSON value. It also counts
 * object keys: json-glib keeps only the last of duplicate keys, so fewer
 * members in the parsed tree than keys here means a duplicate. FALSE with
 * *where (offset in text) and *why on the first problem. */
static gboolean
json_prescan(const gchar *text, gsize n, guint64 *n_keys, gsize *where, const gchar **why)
{
  gint depth = 0;
  gboolean in_string = FALSE, ended = FALSE;
  gsize string_end = 0;
  *n_keys = 0;
  for (gsize i = 0; i < n; i++) {
    gchar c = text[i];
    if (in_string) {
      if (c == '\\') {
        if (i + 5 < n && memcmp(text + i + 1, "u0000", 5) == 0) {
          *where = i;
          *why = "a string holds an escaped NUL (\\u0000)";
          return FALSE;
        }
        i++;
      } else if (c == '"') {
        in_string = FALSE;
        string_end = i;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
      continue;
    if (ended) {
      *where = i;
      *why = "text follows the header's JSON object";
      return FALSE;
    }
    if (c == ':' && string_end > 0) {
      /* the last token was a string and a colon follows: a key */
      (*n_keys)++;
    }
    string_end = 0;
    if (c == '"') {
      in_string = TRUE;
    } else if (c == '{' || c == '[') {
      if (++depth > MAX_JSON_DEPTH) {
        *where = i;
        *why = "the header nests deeper than " G_STRINGIFY(MAX_JSON_DEPTH) " levels";
        return FALSE;
      }
    } else if (c == '}' || c == ']') {
      if (--depth == 0)
        ended = TRUE;
    }
  }
  return TRUE;
}

/* Members of every object in the tree. */
static guint64
json_count_members(JsonNode *node)
{
  guint64 n = 0;
  if (JSON_NODE_HOLDS_OBJECT(node)) {
    JsonObject *o = json_node_get_object(node);
    g_autoptr(GList) members = json_object_get_values(o);
    n += g_list_length(members);
    for (GList *l = members; l != NULL; l = l->next)
      n += json_count_members(l->data);
  } else if (JSON_NODE_HOLDS_ARRAY(node)) {
    JsonArray *a = json_node_get_array(node);
    for (guint i = 0; i < json_array_get_length(a); i++)
      n += json_count_members(json_array_get_element(a, i));
  }
  return n;
}

static void
entry_free(gpointer data)
{
  Entry *e = data;
  g_free(e->name);
  g_free(e);
}

static void
st_file_free(StFile *f)
{
  if (f == NULL)
    return;
  g_free(f->path);
  g_free(f->contents);
  if (f->by_name != NULL)
    g_hash_table_unref(f->by_name);
  if (f->entries != NULL)
    g_ptr_array_unref(f->entries);
  if (f->metadata != NULL)
    g_hash_table_unref(f->metadata);
  g_free(f);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(StFile, st_file_free)

static const gchar *
st_dtype_name(StDType d)
{
  switch (d) {
  case ST_F32:
    return "F32";
  case ST_I32:
    return "I32";
  case ST_I64:
    return "I64";
  }
  return "?";
}

static gsize
st_dtype_size(StDType d)
{
  return d == ST_I64 ? 8 : 4;
}

/* Every dtype the format defines; qkv reads three of them. */
static const gchar *const known_dtypes[] = {
    "BOOL",    "U8",  "I8",      "I16",     "U16", "F16",     "BF16",    "I32",
    "U32",     "F32", "F64",     "I64",     "U64", "F8_E5M2", "F8_E4M3", "F8_E4M3FN",
    "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64", NULL};

#define CORRUPT(...) g_set_error(error, QKV_ERROR, QKV_ERROR_CORRUPT, __VA_ARGS__)

static gboolean
json_get_uint(JsonNode *node, guint64 *out)
{
  if (node == NULL || !JSON_NODE_HOLDS_VALUE(node) ||
      json_node_get_value_type(node) != G_TYPE_INT64)
    return FALSE;
  gint64 v = json_node_get_int(node);
  if (v < 0)
    return FALSE;
  *out = (guint64)v;
  return TRUE;
}

static Entry *
parse_entry(const StFile *f, const gchar *name, JsonNode *node, guint64 data_size, GError **error)
{
  const gchar *path = f->path;
  guint64 header_at = 8;
  if (!JSON_NODE_HOLDS_OBJECT(node)) {
    CORRUPT("checkpoint '%s': tensor '%s': header entry is not an object (header at byte offset "
            "%" G_GUINT64_FORMAT ")",
            path, name, header_at);
    return NULL;
  }
  JsonObject *o = json_node_get_object(node);
  JsonNode *dn = json_object_get_member(o, "dtype");
  if (dn == NULL || !JSON_NODE_HOLDS_VALUE(dn) || json_node_get_value_type(dn) != G_TYPE_STRING) {
    CORRUPT("checkpoint '%s': tensor '%s': missing or non-string \"dtype\"", path, name);
    return NULL;
  }
  const gchar *dtype = json_node_get_string(dn);
  g_autofree Entry *e = g_new0(Entry, 1);
  if (g_str_equal(dtype, "F32"))
    e->dtype = ST_F32;
  else if (g_str_equal(dtype, "I32"))
    e->dtype = ST_I32;
  else if (g_str_equal(dtype, "I64"))
    e->dtype = ST_I64;
  else if (g_strv_contains(known_dtypes, dtype)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE,
                "checkpoint '%s': tensor '%s': dtype %s is not supported (qkv reads F32, I32, I64)",
                path, name, dtype);
    return NULL;
  } else {
    CORRUPT("checkpoint '%s': tensor '%s': unknown dtype '%s'", path, name, dtype);
    return NULL;
  }

  JsonNode *sn = json_object_get_member(o, "shape");
  if (sn == NULL || !JSON_NODE_HOLDS_ARRAY(sn)) {
    CORRUPT("checkpoint '%s': tensor '%s': missing or non-array \"shape\"", path, name);
    return NULL;
  }
  JsonArray *sa = json_node_get_array(sn);
  guint rank = json_array_get_length(sa);
  if (rank > QKV_MAX_RANK) {
    CORRUPT("checkpoint '%s': tensor '%s': rank %u exceeds qkv's maximum %d", path, name, rank,
            QKV_MAX_RANK);
    return NULL;
  }
  e->shape.rank = (gint)rank;
  guint64 nbytes = st_dtype_size(e->dtype);
  gboolean overflow = FALSE;
  for (guint i = 0; i < rank; i++) {
    guint64 d;
    if (!json_get_uint(json_array_get_element(sa, i), &d) || d > (guint64)G_MAXINT64) {
      CORRUPT("checkpoint '%s': tensor '%s': shape entry %u is not a non-negative integer", path,
              name, i);
      return NULL;
    }
    e->shape.dims[i] = (gint64)d;
    if (!g_uint64_checked_mul(&nbytes, nbytes, d))
      overflow = TRUE;
  }

  JsonNode *on = json_object_get_member(o, "data_offsets");
  JsonArray *oa = on != NULL && JSON_NODE_HOLDS_ARRAY(on) ? json_node_get_array(on) : NULL;
  if (oa == NULL || json_array_get_length(oa) != 2 ||
      !json_get_uint(json_array_get_element(oa, 0), &e->begin) ||
      !json_get_uint(json_array_get_element(oa, 1), &e->end)) {
    CORRUPT("checkpoint '%s': tensor '%s': \"data_offsets\" must be [begin, end], two "
            "non-negative integers",
            path, name);
    return NULL;
  }
  if (e->begin > e->end) {
    CORRUPT("checkpoint '%s': tensor '%s': data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
            "] end before begin (byte offset %" G_GUINT64_FORMAT ")",
            path, name, e->begin, e->end, f->data_start + e->begin);
    return NULL;
  }
  if (e->end > data_size) {
    CORRUPT("checkpoint '%s': tensor '%s': data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
            "] run past the end of the file: byte offset %" G_GUINT64_FORMAT
            " > file size %" G_GSIZE_FORMAT,
            path, name, e->begin, e->end, f->data_start + e->end, f->size);
    return NULL;
  }
  if (overflow || e->end - e->begin != nbytes) {
    g_autofree gchar *s = qkv_shape_to_string(&e->shape);
    CORRUPT("checkpoint '%s': tensor '%s': %s %s needs %s%" G_GUINT64_FORMAT
            " bytes but data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
            "] hold %" G_GUINT64_FORMAT " (byte offset %" G_GUINT64_FORMAT ")",
            path, name, dtype, s, overflow ? "more than " : "", overflow ? G_MAXUINT64 : nbytes,
            e->begin, e->end, e->end - e->begin, f->data_start + e->begin);
    return NULL;
  }
  e->name = g_strdup(name);
  return g_steal_pointer(&e);
}

static gint
compare_entries(gconstpointer a, gconstpointer b)
{
  const Entry *x = *(Entry *const *)a, *y = *(Entry *const *)b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static gboolean
parse_header(StFile *f, GError **error)
{
  const gchar *path = f->path;
  if (f->size < 8) {
    CORRUPT("checkpoint '%s': file of %" G_GSIZE_FORMAT
            " bytes is too short for the 8-byte header length at byte offset 0",
            path, f->size);
    return FALSE;
  }
  guint64 n = 0;
  for (int i = 7; i >= 0; i--)
    n = (n << 8) | (guchar)f->contents[i];
  if (n > f->size - 8) {
    CORRUPT("checkpoint '%s': header length %" G_GUINT64_FORMAT
            " (at byte offset 0) runs past the end of the file (%" G_GSIZE_FORMAT " bytes)",
            path, n, f->size);
    return FALSE;
  }
  if (n > MAX_HEADER_LEN) {
    CORRUPT("checkpoint '%s': header length %" G_GUINT64_FORMAT
            " exceeds the limit of %" G_GUINT64_FORMAT,
            path, n, MAX_HEADER_LEN);
    return FALSE;
  }
  f->data_start = 8 + n;
  guint64 data_size = f->size - f->data_start;
  const gchar *header = f->contents + 8;
  const gchar *bad_utf8 = NULL;
  if (!g_utf8_validate_len(header, n, &bad_utf8)) {
    CORRUPT("checkpoint '%s': header is not valid UTF-8 at byte offset %" G_GUINT64_FORMAT, path,
            (guint64)(bad_utf8 - f->contents));
    return FALSE;
  }
  if (n == 0 || header[0] != '{') {
    CORRUPT("checkpoint '%s': header at byte offset 8 is not a JSON object", path);
    return FALSE;
  }
  /* json-glib parses recursively without a depth limit; a header nested a
   * million levels deep would overflow the stack. Valid safetensors headers
   * nest three levels. */
  gsize bad_at = 0;
  guint64 n_keys = 0;
  const gchar *why = NULL;
  if (!json_prescan(header, n, &n_keys, &bad_at, &why)) {
    CORRUPT("checkpoint '%s': %s at byte offset %" G_GUINT64_FORMAT, path, why,
            (guint64)(8 + bad_at));
    return FALSE;
  }
  g_autoptr(JsonParser) parser = json_parser_new();
  g_autoptr(GError) json_error = NULL;
  if (!json_parser_load_from_data(parser, header, (gssize)n, &json_error)) {
    /* json-glib quotes the offending token, which may not be UTF-8 */
    g_autofree gchar *shown = g_utf8_make_valid(json_error->message, -1);
    CORRUPT("checkpoint '%s': header (byte offsets 8 to %" G_GUINT64_FORMAT
            ") is not valid JSON: %s",
            path, 8 + n, shown);
    return FALSE;
  }
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
    CORRUPT("checkpoint '%s': header at byte offset 8 is not a JSON object", path);
    return FALSE;
  }
  if (json_count_members(root) != n_keys) {
    CORRUPT("checkpoint '%s': the header (byte offsets 8 to %" G_GUINT64_FORMAT
            ") repeats a key; names must be unique",
            path, 8 + n);
    return FALSE;
  }
  JsonObject *obj = json_node_get_object(root);
  f->entries = g_ptr_array_new_with_free_func(entry_free);
  f->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  f->metadata = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  g_autoptr(GList) members = json_object_get_members(obj);
  for (GList *l = members; l != NULL; l = l->next) {
    const gchar *name = l->data;
    JsonNode *node = json_object_get_member(obj, name);
    if (!g_utf8_validate(name, -1, NULL)) {
      g_autofree gchar *shown = g_utf8_make_valid(name, -1);
      CORRUPT("checkpoint '%s': tensor name '%s' is not valid UTF-8 (an escaped lone surrogate?)",
              path, shown);
      return FALSE;
    }
    if (g_str_equal(name, METADATA_KEY)) {
      if (!JSON_NODE_HOLDS_OBJECT(node)) {
        CORRUPT("checkpoint '%s': \"__metadata__\" is not an object", path);
        return FALSE;
      }
      JsonObject *mo = json_node_get_object(node);
      g_autoptr(GList) keys = json_object_get_members(mo);
      for (GList *k = keys; k != NULL; k = k->next) {
        JsonNode *v = json_object_get_member(mo, k->data);
        if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING) {
          CORRUPT("checkpoint '%s': metadata '%s' is not a string", path, (const gchar *)k->data);
          return FALSE;
        }
        g_hash_table_replace(f->metadata, g_strdup(k->data), g_strdup(json_node_get_string(v)));
      }
      continue;
    }
    Entry *e = parse_entry(f, name, node, data_size, error);
    if (e == NULL)
      return FALSE;
    g_ptr_array_add(f->entries, e);
    g_hash_table_insert(f->by_name, e->name, e);
  }
  /* Like the reference implementation: sorted by offsets, the tensors tile
   * the data section exactly, from 0 to its end, with no gap, no overlap and
   * no trailing bytes. (Alignment needs no rule of its own: qkv copies bytes,
   * and tiling from 0 with 4- and 8-byte elements keeps every tensor 4-byte
   * aligned anyway.) */
  g_autoptr(GPtrArray) sorted = g_ptr_array_sized_new(f->entries->len);
  for (guint i = 0; i < f->entries->len; i++)
    g_ptr_array_add(sorted, g_ptr_array_index(f->entries, i));
  g_ptr_array_sort(sorted, compare_entries);
  const Entry *prev = NULL;
  guint64 expected = 0;
  for (guint i = 0; i < sorted->len; i++) {
    const Entry *e = g_ptr_array_index(sorted, i);
    if (e->begin < expected) {
      CORRUPT("checkpoint '%s': tensor '%s' (data_offsets [%" G_GUINT64_FORMAT
              ", %" G_GUINT64_FORMAT "]) overlaps tensor '%s' (data_offsets [%" G_GUINT64_FORMAT
              ", %" G_GUINT64_FORMAT "]) at byte offset %" G_GUINT64_FORMAT,
              path, e->name, e->begin, e->end, prev->name, prev->begin, prev->end,
              f->data_start + e->begin);
      return FALSE;
    }
    if (e->begin > expected) {
      CORRUPT("checkpoint '%s': a gap of %" G_GUINT64_FORMAT
              " unused bytes before tensor '%s' (data_offsets [%" G_GUINT64_FORMAT
              ", %" G_GUINT64_FORMAT "]) at byte offset %" G_GUINT64_FORMAT
              "; tensors must cover the data section without gaps",
              path, e->begin - expected, e->name, e->begin, e->end, f->data_start + expected);
      return FALSE;
    }
    expected = e->end;
    prev = e;
  }
  if (expected != data_size) {
    CORRUPT("checkpoint '%s': %" G_GUINT64_FORMAT " trailing bytes after the last tensor, from "
            "byte offset %" G_GUINT64_FORMAT " to the end of the file",
            path, data_size - expected, f->data_start + expected);
    return FALSE;
  }
  return TRUE;
}

static StFile *
st_file_open(const gchar *path, GError **error)
{
  g_autoptr(StFile) f = g_new0(StFile, 1);
  f->path = g_strdup(path);
  g_autoptr(GError) io_error = NULL;
  if (!g_file_get_contents(path, &f->contents, &f->size, &io_error)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "checkpoint '%s': %s", path, io_error->message);
    return NULL;
  }
  if (!parse_header(f, error))
    return NULL;
  return g_steal_pointer(&f);
}

static const guchar *
entry_data(const StFile *f, const Entry *e)
{
  return (const guchar *)f->contents + f->data_start + e->begin;
}

/* Copy n little-endian 32-bit words into dst. */
static void
copy_le32(gpointer dst, const guchar *src, gsize n)
{
#if G_BYTE_ORDER == G_LITTLE_ENDIAN
  memcpy(dst, src, n * 4);
#else
  guint32 *d = dst;
  for (gsize i = 0; i < n; i++)
    d[i] = (guint32)src[4 * i] | (guint32)src[4 * i + 1] << 8 | (guint32)src[4 * i + 2] << 16 |
           (guint32)src[4 * i + 3] << 24;
#endif
}

/* Convert an I64 tensor to i32; FALSE (naming the element's byte offset) if
 * a value does not fit. */
static gboolean
copy_i64_to_i32(const StFile *f, const Entry *e, gint32 *dst, GError **error)
{
  const guchar *src = entry_data(f, e);
  gint64 n = qkv_shape_numel(&e->shape);
  for (gint64 i = 0; i < n; i++) {
    guint64 u = 0;
    for (int b = 7; b >= 0; b--)
      u = (u << 8) | src[8 * i + b];
    gint64 v = (gint64)u;
    if (v < G_MININT32 || v > G_MAXINT32) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE,
                  "checkpoint '%s': tensor '%s': I64 value %" G_GINT64_FORMAT
                  " at byte offset %" G_GUINT64_FORMAT " does not fit in i32",
                  f->path, e->name, v, f->data_start + e->begin + 8 * (guint64)i);
      return FALSE;
    }
    if (dst != NULL)
      dst[i] = (gint32)v;
  }
  return TRUE;
}

GHashTable *
qkv_safetensors_read(const gchar *path, GHashTable **metadata, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_autoptr(StFile) f = st_file_open(path, error);
  if (f == NULL)
    return NULL;
  g_autoptr(GHashTable) out =
      g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < f->entries->len; i++) {
    const Entry *e = g_ptr_array_index(f->entries, i);
    QkvTensor *t = qkv_tensor_try_new(e->dtype == ST_F32 ? QKV_F32 : QKV_I32, &e->shape, error);
    if (t == NULL) {
      g_prefix_error(error, "checkpoint '%s': tensor '%s': ", path, e->name);
      return NULL;
    }
    g_hash_table_insert(out, g_strdup(e->name), t);
    if (e->dtype == ST_I64) {
      if (!copy_i64_to_i32(f, e, qkv_tensor_i32(t), error))
        return NULL;
    } else {
      copy_le32(qkv_tensor_data(t), entry_data(f, e), (gsize)qkv_tensor_numel(t));
    }
  }
  if (metadata != NULL)
    *metadata = g_hash_table_ref(f->metadata);
  return g_steal_pointer(&out);
}

GHashTable *
qkv_checkpoint_read_metadata(const gchar *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_autoptr(StFile) f = st_file_open(path, error);
  return f != NULL ? g_hash_table_ref(f->metadata) : NULL;
}

/* ---- load ---- */

typedef struct {
  QkvParam *param;
  gchar *state; /* NULL: the param's value */
  const Entry *entry;
} Assignment;

static void
assignment_free(gpointer data)
{
  Assignment *a = data;
  g_free(a->state);
  g_free(a);
}

static const gchar *
metadata_get(const StFile *f, const gchar *key, GError **error)
{
  const gchar *v = g_hash_table_lookup(f->metadata, key);
  if (v == NULL)
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "checkpoint '%s': metadata '%s' is missing",
                f->path, key);
  return v;
}

static gboolean
metadata_double(const StFile *f, const gchar *key, double *out, GError **error)
{
  const gchar *v = metadata_get(f, key, error);
  if (v == NULL)
    return FALSE;
  gchar *end = NULL;
  double d = g_ascii_strtod(v, &end);
  if (end == v || *end != '\0' || !isfinite(d)) {
    CORRUPT("checkpoint '%s': metadata '%s' = '%s' is not a finite number", f->path, key, v);
    return FALSE;
  }
  *out = d;
  return TRUE;
}

static gboolean
metadata_int(const StFile *f, const gchar *key, gint64 *out, GError **error)
{
  const gchar *v = metadata_get(f, key, error);
  if (v == NULL)
    return FALSE;
  guint64 u;
  if (!g_ascii_string_to_unsigned(v, 10, 0, G_MAXINT64, &u, NULL)) {
    CORRUPT("checkpoint '%s': metadata '%s' = '%s' is not a non-negative integer", f->path, key, v);
    return FALSE;
  }
  *out = (gint64)u;
  return TRUE;
}

static gboolean
metadata_bool(const StFile *f, const gchar *key, gboolean *out, GError **error)
{
  const gchar *v = metadata_get(f, key, error);
  if (v == NULL)
    return FALSE;
  if (g_str_equal(v, "true") || g_str_equal(v, "false")) {
    *out = g_str_equal(v, "true");
    return TRUE;
  }
  CORRUPT("checkpoint '%s': metadata '%s' = '%s' is not true or false", f->path, key, v);
  return FALSE;
}

static gboolean
read_optimizer_metadata(const StFile *f, QkvOptimizer *opt, QkvOptimConfig *config, gint64 *step,
                        GError **error)
{
  const gchar *kind = g_hash_table_lookup(f->metadata, "qkv.optimizer.kind");
  if (kind == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s' holds no optimizer state (no 'qkv.optimizer.kind' metadata)",
                f->path);
    return FALSE;
  }
  const gchar *want = qkv_optimizer_kind_name(qkv_optimizer_get_kind(opt));
  if (!g_str_equal(kind, want)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "checkpoint '%s' holds %s optimizer state, not %s", f->path, kind, want);
    return FALSE;
  }
  *config = *qkv_optimizer_get_config(opt);
  if (!metadata_int(f, "qkv.optimizer.step", step, error) ||
      !metadata_double(f, "qkv.optimizer.lr", &config->lr, error) ||
      !metadata_double(f, "qkv.optimizer.weight_decay", &config->weight_decay, error) ||
      !metadata_double(f, "qkv.optimizer.momentum", &config->momentum, error) ||
      !metadata_double(f, "qkv.optimizer.dampening", &config->dampening, error) ||
      !metadata_bool(f, "qkv.optimizer.nesterov", &config->nesterov, error) ||
      !metadata_double(f, "qkv.optimizer.beta1", &config->beta1, error) ||
      !metadata_double(f, "qkv.optimizer.beta2", &config->beta2, error) ||
      !metadata_double(f, "qkv.optimizer.eps", &config->eps, error))
    return FALSE;
  /* validate without touching opt */
  g_autoptr(GError) invalid = NULL;
  g_autoptr(QkvOptimizer) probe = qkv_optimizer_new(
      qkv_optimizer_get_kind(opt), qkv_optimizer_get_params(opt), config, &invalid);
  if (probe == NULL) {
    CORRUPT("checkpoint '%s': optimizer hyper-parameters: %s", f->path, invalid->message);
    return FALSE;
  }
  return TRUE;
}

static gboolean
read_schedule_metadata(const StFile *f, QkvSchedule *schedule, gint64 *position, GError **error)
{
  const gchar *kind = g_hash_table_lookup(f->metadata, "qkv.schedule.kind");
  if (kind == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s' holds no schedule position (no 'qkv.schedule.kind' metadata)",
                f->path);
    return FALSE;
  }
  const gchar *want = qkv_schedule_kind_name(qkv_schedule_get_kind(schedule));
  if (!g_str_equal(kind, want)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "checkpoint '%s' holds the position of a %s schedule, not %s", f->path, kind, want);
    return FALSE;
  }
  return metadata_int(f, "qkv.schedule.position", position, error);
}

/* Does the entry fit into an existing tensor t? */
static gboolean
check_fits(const StFile *f, const Entry *e, const QkvTensor *t, const gchar *what, GError **error)
{
  QkvDType want = qkv_tensor_dtype(t);
  gboolean dtype_ok = want == QKV_F32 ? e->dtype == ST_F32 : e->dtype != ST_F32;
  if (!dtype_ok) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE,
                "checkpoint '%s': tensor '%s' is %s but %s is %s (byte offset %" G_GUINT64_FORMAT
                ")",
                f->path, e->name, st_dtype_name(e->dtype), what, qkv_dtype_name(want),
                f->data_start + e->begin);
    return FALSE;
  }
  if (!qkv_shape_equal(&e->shape, qkv_tensor_shape(t))) {
    g_autofree gchar *got = qkv_shape_to_string(&e->shape);
    g_autofree gchar *exp = qkv_shape_to_string(qkv_tensor_shape(t));
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "checkpoint '%s': tensor '%s' has shape %s but %s has shape %s", f->path, e->name,
                got, what, exp);
    return FALSE;
  }
  return TRUE;
}

static void
copy_entry(const StFile *f, const Entry *e, QkvTensor *t)
{
  if (e->dtype == ST_I64)
    copy_i64_to_i32(f, e, qkv_tensor_i32(t), NULL); /* range checked already */
  else
    copy_le32(qkv_tensor_data(t), entry_data(f, e), (gsize)qkv_tensor_numel(t));
}

static gchar *
list_names(GPtrArray *names)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < names->len && i < 5; i++)
    g_string_append_printf(s, "%s'%s'", i ? ", " : "", (const gchar *)g_ptr_array_index(names, i));
  if (names->len > 5)
    g_string_append_printf(s, " and %u more", names->len - 5);
  return g_string_free(s, FALSE);
}

gboolean
qkv_checkpoint_load(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                    QkvSchedule *schedule, QkvCheckpointFlags flags, GPtrArray **missing,
                    GPtrArray **unexpected, GError **error)
{
  g_return_val_if_fail(path != NULL && params != NULL, FALSE);
  g_return_val_if_fail(optimizer == NULL || qkv_optimizer_get_params(optimizer) == params, FALSE);
  if (missing != NULL)
    *missing = NULL;
  if (unexpected != NULL)
    *unexpected = NULL;
  g_autoptr(StFile) f = st_file_open(path, error);
  if (f == NULL)
    return FALSE;

  g_autoptr(GPtrArray) missing_names = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) unexpected_names = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) plan = g_ptr_array_new_with_free_func(assignment_free);
  /* params whose state the load replaces */
  g_autoptr(GHashTable) loaded = g_hash_table_new(g_direct_hash, g_direct_equal);

  /* 1. every param against the file */
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const Entry *e = g_hash_table_lookup(f->by_name, qkv_param_name(p));
    if (e == NULL) {
      g_ptr_array_add(missing_names, g_strdup(qkv_param_name(p)));
      continue;
    }
    g_autofree gchar *what = g_strdup_printf("parameter '%s'", qkv_param_name(p));
    if (!check_fits(f, e, qkv_param_value(p), what, error))
      return FALSE;
    Assignment *a = g_new0(Assignment, 1);
    a->param = p;
    a->entry = e;
    g_ptr_array_add(plan, a);
    g_hash_table_add(loaded, p);
  }

  /* 2. every tensor of the file against the store */
  for (guint i = 0; i < f->entries->len; i++) {
    const Entry *e = g_ptr_array_index(f->entries, i);
    if (qkv_params_lookup(params, e->name) != NULL)
      continue;
    if (!g_str_has_prefix(e->name, OPTIM_PREFIX)) {
      g_ptr_array_add(unexpected_names, g_strdup(e->name));
      continue;
    }
    if (optimizer == NULL)
      continue;
    const gchar *rest = e->name + strlen(OPTIM_PREFIX);
    const gchar *dot = strrchr(rest, '.');
    g_autofree gchar *pname = dot != NULL ? g_strndup(rest, dot - rest) : NULL;
    QkvParam *p = pname != NULL ? qkv_params_lookup(params, pname) : NULL;
    if (p == NULL || dot[1] == '\0') {
      g_ptr_array_add(unexpected_names, g_strdup(e->name));
      continue;
    }
    const gchar *state = dot + 1;
    QkvTensor *existing = qkv_param_lookup_state(p, state);
    g_autofree gchar *what =
        g_strdup_printf("optimizer state '%s' of parameter '%s'", state, pname);
    if (existing != NULL && !check_fits(f, e, existing, what, error))
      return FALSE;
    /* a fresh optimizer has no state to compare with: the step count is an
     * integer scalar, every other state has the parameter's shape in f32 */
    gboolean is_step = g_str_equal(state, "step");
    gboolean fits = is_step ? (e->dtype == ST_I32 || e->dtype == ST_I64) && e->shape.rank == 0
                            : e->dtype == ST_F32 && qkv_shape_equal(&e->shape, qkv_param_shape(p));
    if (!fits) {
      g_autofree gchar *got = qkv_shape_to_string(&e->shape);
      g_autofree gchar *want = qkv_shape_to_string(qkv_param_shape(p));
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "checkpoint '%s': %s is %s%s at byte offset %" G_GUINT64_FORMAT ", expected %s",
                  f->path, what, st_dtype_name(e->dtype), got, f->data_start + e->begin,
                  is_step ? "an integer scalar" : want);
      return FALSE;
    }
    if (e->dtype == ST_I64 && !copy_i64_to_i32(f, e, NULL, error))
      return FALSE;
    if (is_step) {
      /* a negative count makes the next Adam update NaN. G_MAXINT32 loads
       * (a save of a store at that count must load back); the optimizer
       * refuses to step past it. */
      gint32 count = 0;
      if (e->dtype == ST_I64)
        copy_i64_to_i32(f, e, &count, NULL);
      else
        copy_le32(&count, entry_data(f, e), 1);
      if (count < 0) {
        CORRUPT("checkpoint '%s': %s is %d at byte offset %" G_GUINT64_FORMAT
                ", a step count cannot be negative",
                f->path, what, count, f->data_start + e->begin);
        return FALSE;
      }
    }
    Assignment *a = g_new0(Assignment, 1);
    a->param = p;
    a->state = g_strdup(state);
    a->entry = e;
    g_ptr_array_add(plan, a);
  }

  if (missing_names->len > 0 && !(flags & QKV_CHECKPOINT_ALLOW_MISSING)) {
    g_autofree gchar *list = list_names(missing_names);
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s' has no tensor for parameter %s", path, list);
    return FALSE;
  }
  if (unexpected_names->len > 0 && !(flags & QKV_CHECKPOINT_ALLOW_UNEXPECTED)) {
    g_autofree gchar *list = list_names(unexpected_names);
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s': tensor %s matches no parameter of the store", path, list);
    return FALSE;
  }

  /* 3. optimizer and schedule metadata */
  QkvOptimConfig config;
  gint64 opt_step = 0, position = 0;
  if (optimizer != NULL && !read_optimizer_metadata(f, optimizer, &config, &opt_step, error))
    return FALSE;
  if (schedule != NULL && !read_schedule_metadata(f, schedule, &position, error))
    return FALSE;

  /* 4. everything checked: apply */
  if (optimizer != NULL) {
    /* the state of a loaded param becomes exactly the file's */
    g_autoptr(GHashTable) keep = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (guint i = 0; i < plan->len; i++) {
      Assignment *a = g_ptr_array_index(plan, i);
      if (a->state != NULL)
        g_hash_table_add(keep, g_strdup_printf("%p/%s", (void *)a->param, a->state));
    }
    GHashTableIter it;
    gpointer key;
    g_hash_table_iter_init(&it, loaded);
    while (g_hash_table_iter_next(&it, &key, NULL)) {
      QkvParam *p = key;
      for (guint s = qkv_param_n_states(p); s-- > 0;) {
        const gchar *name = qkv_param_nth_state(p, s, NULL);
        g_autofree gchar *k = g_strdup_printf("%p/%s", (void *)p, name);
        if (!g_hash_table_contains(keep, k))
          qkv_param_remove_state(p, name);
      }
    }
  }
  for (guint i = 0; i < plan->len; i++) {
    Assignment *a = g_ptr_array_index(plan, i);
    QkvTensor *t;
    if (a->state == NULL)
      t = qkv_param_value(a->param);
    else
      t = qkv_param_state_full(a->param, a->state, a->entry->dtype == ST_F32 ? QKV_F32 : QKV_I32,
                               &a->entry->shape);
    copy_entry(f, a->entry, t);
  }
  if (optimizer != NULL) {
    qkv_optimizer_set_config(optimizer, &config, NULL);
    qkv_optimizer_set_step(optimizer, opt_step);
  }
  if (schedule != NULL)
    qkv_schedule_set_position(schedule, position);

  if (missing != NULL)
    *missing = g_steal_pointer(&missing_names);
  if (unexpected != NULL)
    *unexpected = g_steal_pointer(&unexpected_names);
  return TRUE;
}

/* ---- stale temporary files ---- */

/* A save writes ".BASE.tmp-XXXXXX" beside BASE (XXXXXX: six characters from
 * g_mkstemp's alphabet) and holds an exclusive flock() on it until the
 * rename. A save that is killed leaves that file behind; the next successful
 * save of the same target removes such leftovers. A leftover is removed only
 * if its name has exactly that pattern for this target, it is a regular file
 * of ours, nobody holds its lock (a live writer does), and it has not been
 * modified for STALE_TMP_SECONDS: the age rule covers the instant between
 * g_mkstemp and flock in another process, and writers that do not lock
 * (older qkv versions, file systems where flock is local). */
#define STALE_TMP_SECONDS 60

static gboolean
is_temp_name_for(const gchar *name, const gchar *base)
{
  gsize nb = strlen(base);
  if (name[0] != '.' || strncmp(name + 1, base, nb) != 0 || strncmp(name + 1 + nb, ".tmp-", 5) != 0)
    return FALSE;
  const gchar *x = name + 1 + nb + 5;
  for (int i = 0; i < 6; i++)
    if (!g_ascii_isalnum(x[i]))
      return FALSE;
  return x[6] == '\0';
}

/* Best effort: a leftover that cannot be removed stays, the save has
 * succeeded either way. */
static void
remove_stale_temporaries(const gchar *dir, const gchar *base, const gchar *own_tmp)
{
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return;
  time_t now = time(NULL);
  const gchar *name;
  while ((name = g_dir_read_name(d)) != NULL) {
    if (!is_temp_name_for(name, base))
      continue;
    g_autofree gchar *p = g_build_filename(dir, name, NULL);
    if (g_str_equal(p, own_tmp))
      continue;
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
      continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        now - st.st_mtime >= STALE_TMP_SECONDS && flock(fd, LOCK_EX | LOCK_NB) == 0)
      unlink(p);
    close(fd);
  }
  g_dir_close(d);
}

/* ---- save ---- */

typedef struct {
  gchar *name;
  QkvTensor *tensor; /* borrowed */
} SaveItem;

static void
save_item_free(gpointer data)
{
  SaveItem *s = data;
  g_free(s->name);
  g_free(s);
}

static void
add_item(GPtrArray *items, gchar *name, QkvTensor *t)
{
  SaveItem *s = g_new0(SaveItem, 1);
  s->name = name;
  s->tensor = t;
  g_ptr_array_add(items, s);
}

static gchar *
format_double(double v)
{
  gchar buf[G_ASCII_DTOSTR_BUF_SIZE];
  return g_strdup(g_ascii_dtostr(buf, sizeof buf, v));
}

static gboolean
write_all(int fd, const void *data, gsize n, const gchar *path, const gchar *tmp, GError **error)
{
  const guchar *p = data;
  while (n > 0) {
    gssize w = write(fd, p, MIN(n, (gsize)1 << 30));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int err = w < 0 ? errno : ENOSPC;
      g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': writing '%s': %s", path,
                  tmp, g_strerror(err));
      return FALSE;
    }
    p += w;
    n -= (gsize)w;
  }
  return TRUE;
}

static gboolean
write_tensor(int fd, QkvTensor *t, const gchar *path, const gchar *tmp, GError **error)
{
#if G_BYTE_ORDER == G_LITTLE_ENDIAN
  return write_all(fd, qkv_tensor_const_data(t), qkv_tensor_nbytes(t), path, tmp, error);
#else
  gsize n = (gsize)qkv_tensor_numel(t);
  const guint32 *src = qkv_tensor_const_data(t);
  g_autofree guint32 *le = g_new(guint32, MAX(n, 1));
  for (gsize i = 0; i < n; i++)
    le[i] = GUINT32_TO_LE(src[i]);
  return write_all(fd, le, n * 4, path, tmp, error);
#endif
}

gboolean
qkv_checkpoint_save(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                    QkvSchedule *schedule, GHashTable *metadata, GError **error)
{
  g_return_val_if_fail(path != NULL && params != NULL, FALSE);
  g_return_val_if_fail(optimizer == NULL || qkv_optimizer_get_params(optimizer) == params, FALSE);

  /* what goes in, in order */
  g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(save_item_free);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const gchar *name = qkv_param_name(p);
    if (g_str_equal(name, METADATA_KEY) || g_str_has_prefix(name, OPTIM_PREFIX)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "saving checkpoint '%s': parameter name '%s' is reserved", path, name);
      return FALSE;
    }
    /* json-glib would write the bytes as they are, and no reader (qkv's
     * included) accepts a header that is not UTF-8 */
    if (!g_utf8_validate(name, -1, NULL)) {
      g_autofree gchar *shown = g_utf8_make_valid(name, -1);
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "saving checkpoint '%s': parameter name '%s' is not valid UTF-8", path, shown);
      return FALSE;
    }
    add_item(items, g_strdup(name), qkv_param_value(p));
  }
  if (optimizer != NULL) {
    for (guint i = 0; i < qkv_params_size(params); i++) {
      QkvParam *p = qkv_params_nth(params, i);
      for (guint s = 0; s < qkv_param_n_states(p); s++) {
        QkvTensor *t;
        const gchar *state = qkv_param_nth_state(p, s, &t);
        if (state[0] == '\0' || strchr(state, '.') != NULL || !g_utf8_validate(state, -1, NULL)) {
          g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                      "saving checkpoint '%s': state name '%s' of parameter '%s' must be "
                      "non-empty UTF-8 and contain no '.'",
                      path, state, qkv_param_name(p));
          return FALSE;
        }
        add_item(items, g_strdup_printf(OPTIM_PREFIX "%s.%s", qkv_param_name(p), state), t);
      }
    }
  }

  /* the header */
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, METADATA_KEY);
  json_builder_begin_object(b);
  {
    g_autoptr(GHashTable) meta = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
    g_autoptr(GPtrArray) keys = g_ptr_array_new();
#define META(k, v)                                                                                 \
  do {                                                                                             \
    g_hash_table_insert(meta, (gpointer)(k), (v));                                                 \
    g_ptr_array_add(keys, (gpointer)(k));                                                          \
  } while (0)
    if (metadata == NULL || !g_hash_table_contains(metadata, "format"))
      META("format", g_strdup("pt"));
    META("qkv.version", g_strdup(qkv_version()));
    if (optimizer != NULL) {
      const QkvOptimConfig *c = qkv_optimizer_get_config(optimizer);
      META("qkv.optimizer.kind",
           g_strdup(qkv_optimizer_kind_name(qkv_optimizer_get_kind(optimizer))));
      META("qkv.optimizer.step",
           g_strdup_printf("%" G_GINT64_FORMAT, qkv_optimizer_get_step(optimizer)));
      META("qkv.optimizer.lr", format_double(c->lr));
      META("qkv.optimizer.weight_decay", format_double(c->weight_decay));
      META("qkv.optimizer.momentum", format_double(c->momentum));
      META("qkv.optimizer.dampening", format_double(c->dampening));
      META("qkv.optimizer.nesterov", g_strdup(c->nesterov ? "true" : "false"));
      META("qkv.optimizer.beta1", format_double(c->beta1));
      META("qkv.optimizer.beta2", format_double(c->beta2));
      META("qkv.optimizer.eps", format_double(c->eps));
    }
    if (schedule != NULL) {
      META("qkv.schedule.kind", g_strdup(qkv_schedule_kind_name(qkv_schedule_get_kind(schedule))));
      META("qkv.schedule.position",
           g_strdup_printf("%" G_GINT64_FORMAT, qkv_schedule_get_position(schedule)));
    }
#undef META
    for (guint i = 0; i < keys->len; i++) {
      json_builder_set_member_name(b, g_ptr_array_index(keys, i));
      json_builder_add_string_value(b, g_hash_table_lookup(meta, g_ptr_array_index(keys, i)));
    }
    if (metadata != NULL) {
      g_autoptr(GList) user_keys = g_hash_table_get_keys(metadata);
      user_keys = g_list_sort(user_keys, (GCompareFunc)g_strcmp0);
      for (GList *l = user_keys; l != NULL; l = l->next) {
        const gchar *k = l->data, *v = g_hash_table_lookup(metadata, k);
        if (g_str_has_prefix(k, "qkv.") || v == NULL || !g_utf8_validate(k, -1, NULL) ||
            !g_utf8_validate(v, -1, NULL)) {
          g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                      "saving checkpoint '%s': metadata key '%s' is reserved or its value is "
                      "not a UTF-8 string",
                      path, k);
          return FALSE;
        }
        json_builder_set_member_name(b, k);
        json_builder_add_string_value(b, v);
      }
    }
  }
  json_builder_end_object(b);
  guint64 offset = 0;
  for (guint i = 0; i < items->len; i++) {
    SaveItem *s = g_ptr_array_index(items, i);
    const QkvShape *shape = qkv_tensor_shape(s->tensor);
    json_builder_set_member_name(b, s->name);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "dtype");
    json_builder_add_string_value(b, qkv_tensor_dtype(s->tensor) == QKV_F32 ? "F32" : "I32");
    json_builder_set_member_name(b, "shape");
    json_builder_begin_array(b);
    for (gint d = 0; d < shape->rank; d++)
      json_builder_add_int_value(b, shape->dims[d]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "data_offsets");
    json_builder_begin_array(b);
    json_builder_add_int_value(b, (gint64)offset);
    offset += qkv_tensor_nbytes(s->tensor);
    json_builder_add_int_value(b, (gint64)offset);
    json_builder_end_array(b);
    json_builder_end_object(b);
  }
  json_builder_end_object(b);
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  json_generator_set_root(gen, root);
  gsize json_len = 0;
  g_autofree gchar *json = json_generator_to_data(gen, &json_len);
  GString *header = g_string_sized_new(json_len + 16);
  g_string_append_len(header, "\0\0\0\0\0\0\0\0", 8);
  g_string_append_len(header, json, (gssize)json_len);
  while (header->len % 8 != 0)
    g_string_append_c(header, ' ');
  guint64 n = header->len - 8;
  for (int i = 0; i < 8; i++)
    header->str[i] = (gchar)((n >> (8 * i)) & 0xff);

  /* write a temporary file beside path, then rename it over path */
  g_autofree gchar *dir = g_path_get_dirname(path);
  g_autofree gchar *base = g_path_get_basename(path);
  g_autofree gchar *tmp = g_strdup_printf("%s%c.%s.tmp-XXXXXX", dir, G_DIR_SEPARATOR, base);
  int fd = g_mkstemp_full(tmp, O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    g_string_free(header, TRUE);
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO,
                "saving checkpoint '%s': cannot create a temporary file in '%s': %s", path, dir,
                g_strerror(err));
    return FALSE;
  }
  /* marks the file as being written (see remove_stale_temporaries); a file
   * system without flock just leaves the age rule */
  (void)flock(fd, LOCK_EX | LOCK_NB);
  gboolean ok = write_all(fd, header->str, header->len, path, tmp, error);
  g_string_free(header, TRUE);
  for (guint i = 0; ok && i < items->len; i++)
    ok = write_tensor(fd, ((SaveItem *)g_ptr_array_index(items, i))->tensor, path, tmp, error);
  if (ok && fsync(fd) != 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': fsync of '%s': %s", path,
                tmp, g_strerror(err));
    ok = FALSE;
  }
  if (close(fd) != 0 && ok) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': closing '%s': %s", path,
                tmp, g_strerror(err));
    ok = FALSE;
  }
  if (ok && rename(tmp, path) != 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': renaming '%s': %s", path,
                tmp, g_strerror(err));
    ok = FALSE;
  }
  if (!ok) {
    unlink(tmp);
    return FALSE;
  }
  /* make the rename itself durable */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP)) {
    int err = errno;
    if (dfd >= 0)
      close(dfd);
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO,
                "saving checkpoint '%s': written, but syncing directory '%s' failed: %s", path, dir,
                g_strerror(err));
    return FALSE;
  }
  close(dfd);
  remove_stale_temporaries(dir, base, tmp);
  return TRUE;
}
