/* checkpoint-format.c: reading safetensors files, the part that trusts
 * nothing: the header is parsed and every rule of the format checked before
 * anything is copied out (qkv_safetensors_read, and checkpoint-load.c). */
#include "train/checkpoint-private.h"

#include <json-glib/json-glib.h>
#include <string.h>
#include "error-private.h"

/* the reference implementation refuses larger headers too */
#define MAX_HEADER_LEN G_GUINT64_CONSTANT(100000000)

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

void
qkv_st_file_free(StFile *f)
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

const gchar *
qkv_st_dtype_name(StDType d)
{
  switch (d) {
  case ST_F32:
    return "F32";
  case ST_I32:
    return "I32";
  case ST_I64:
    return "I64";
  case ST_F16:
    return "F16";
  case ST_BF16:
    return "BF16";
  case ST_F64:
    return "F64";
  }
  return "?";
}

gsize
qkv_st_dtype_size(StDType d)
{
  switch (d) {
  case ST_F16:
  case ST_BF16:
    return 2;
  case ST_I64:
  case ST_F64:
    return 8;
  case ST_F32:
  case ST_I32:
    break;
  }
  return 4;
}

gboolean
qkv_st_dtype_is_float(StDType d)
{
  return d == ST_F32 || d == ST_F16 || d == ST_BF16 || d == ST_F64;
}

/* The dtypes qkv reads, by their names in the format. */
static const struct {
  const gchar *name;
  StDType dtype;
} read_dtypes[] = {
    {"F32", ST_F32}, {"I32", ST_I32},   {"I64", ST_I64},
    {"F16", ST_F16}, {"BF16", ST_BF16}, {"F64", ST_F64},
};

/* Every dtype the format defines; qkv reads six of them. */
static const gchar *const known_dtypes[] = {
    "BOOL",    "U8",  "I8",      "I16",     "U16", "F16",     "BF16",    "I32",
    "U32",     "F32", "F64",     "I64",     "U64", "F8_E5M2", "F8_E4M3", "F8_E4M3FN",
    "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64", NULL};

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
  guint d = 0;
  while (d < G_N_ELEMENTS(read_dtypes) && !g_str_equal(dtype, read_dtypes[d].name))
    d++;
  if (d < G_N_ELEMENTS(read_dtypes)) {
    e->dtype = read_dtypes[d].dtype;
  } else if (g_strv_contains(known_dtypes, dtype)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE,
                "checkpoint '%s': tensor '%s': dtype %s is not supported (qkv reads F32, F64, "
                "F16, BF16, I32, I64)",
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
  guint64 nbytes = qkv_st_dtype_size(e->dtype);
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

/* The 8-byte little-endian header length, checked against the file size and
 * the limit; sets f->data_start. */
static gboolean
read_header_length(StFile *f, guint64 *length, GError **error)
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
  *length = n;
  return TRUE;
}

/* The n bytes of header text as a JSON object with no repeated key; the
 * parser owns the tree. */
static JsonParser *
parse_header_json(const StFile *f, guint64 n, GError **error)
{
  const gchar *path = f->path;
  const gchar *header = f->contents + 8;
  const gchar *bad_utf8 = NULL;
  if (!g_utf8_validate_len(header, n, &bad_utf8)) {
    CORRUPT("checkpoint '%s': header is not valid UTF-8 at byte offset %" G_GUINT64_FORMAT, path,
            (guint64)(bad_utf8 - f->contents));
    return NULL;
  }
  if (n == 0 || header[0] != '{') {
    CORRUPT("checkpoint '%s': header at byte offset 8 is not a JSON object", path);
    return NULL;
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
    return NULL;
  }
  g_autoptr(JsonParser) parser = json_parser_new();
  g_autoptr(GError) json_error = NULL;
  if (!json_parser_load_from_data(parser, header, (gssize)n, &json_error)) {
    /* json-glib quotes the offending token, which may not be UTF-8 */
    g_autofree gchar *shown = g_utf8_make_valid(json_error->message, -1);
    CORRUPT("checkpoint '%s': header (byte offsets 8 to %" G_GUINT64_FORMAT
            ") is not valid JSON: %s",
            path, 8 + n, shown);
    return NULL;
  }
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
    CORRUPT("checkpoint '%s': header at byte offset 8 is not a JSON object", path);
    return NULL;
  }
  if (json_count_members(root) != n_keys) {
    CORRUPT("checkpoint '%s': the header (byte offsets 8 to %" G_GUINT64_FORMAT
            ") repeats a key; names must be unique",
            path, 8 + n);
    return NULL;
  }
  return g_steal_pointer(&parser);
}

static gboolean
read_metadata_object(StFile *f, JsonNode *node, GError **error)
{
  if (!JSON_NODE_HOLDS_OBJECT(node)) {
    CORRUPT("checkpoint '%s': \"__metadata__\" is not an object", f->path);
    return FALSE;
  }
  JsonObject *mo = json_node_get_object(node);
  g_autoptr(GList) keys = json_object_get_members(mo);
  for (GList *k = keys; k != NULL; k = k->next) {
    JsonNode *v = json_object_get_member(mo, k->data);
    if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING) {
      CORRUPT("checkpoint '%s': metadata '%s' is not a string", f->path, (const gchar *)k->data);
      return FALSE;
    }
    g_hash_table_replace(f->metadata, g_strdup(k->data), g_strdup(json_node_get_string(v)));
  }
  return TRUE;
}

/* The header's members in order: the metadata and one Entry per tensor. */
static gboolean
read_members(StFile *f, JsonObject *obj, guint64 data_size, GError **error)
{
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
              f->path, shown);
      return FALSE;
    }
    if (g_str_equal(name, METADATA_KEY)) {
      if (!read_metadata_object(f, node, error))
        return FALSE;
      continue;
    }
    Entry *e = parse_entry(f, name, node, data_size, error);
    if (e == NULL)
      return FALSE;
    g_ptr_array_add(f->entries, e);
    g_hash_table_insert(f->by_name, e->name, e);
  }
  return TRUE;
}

/* Like the reference implementation: sorted by offsets, the tensors tile
 * the data section exactly, from 0 to its end, with no gap, no overlap and
 * no trailing bytes. (Alignment needs no rule: with 2-byte elements a tensor
 * may start at any even offset, but qkv reads the data byte by byte or with
 * memcpy, never through a typed pointer.) */
static gboolean
check_tiling(const StFile *f, guint64 data_size, GError **error)
{
  const gchar *path = f->path;
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

static gboolean
parse_header(StFile *f, GError **error)
{
  guint64 n = 0;
  if (!read_header_length(f, &n, error))
    return FALSE;
  guint64 data_size = f->size - f->data_start;
  g_autoptr(JsonParser) parser = parse_header_json(f, n, error);
  if (parser == NULL)
    return FALSE;
  JsonObject *obj = json_node_get_object(json_parser_get_root(parser));
  return read_members(f, obj, data_size, error) && check_tiling(f, data_size, error);
}

StFile *
qkv_st_file_open(const gchar *path, GError **error)
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

const guchar *
qkv_st_entry_data(const StFile *f, const Entry *e)
{
  return (const guchar *)f->contents + f->data_start + e->begin;
}

/* Copy n little-endian 32-bit words into dst. */
void
qkv_st_copy_le32(gpointer dst, const guchar *src, gsize n)
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

/* The little-endian 16-bit word at src. */
static guint16
read_le16(const guchar *src)
{
  return (guint16)(src[0] | src[1] << 8);
}

/* An IEEE binary16 as the binary32 with the same value, by bit operations:
 * every half is a float, subnormals included, so nothing rounds. */
static guint32
f16_to_f32_bits(guint16 h)
{
  guint32 sign = (guint32)(h & 0x8000) << 16;
  guint32 exponent = (h >> 10) & 0x1f;
  guint32 mantissa = h & 0x3ff;
  if (exponent == 0x1f) /* inf, or NaN with its payload and quiet bit moved up */
    return sign | 0x7f800000 | mantissa << 13;
  if (exponent != 0) /* normal: rebias 15 -> 127 */
    return sign | (exponent + 112) << 23 | mantissa << 13;
  if (mantissa == 0)
    return sign;
  /* subnormal, mantissa * 2^-24: a normal float. Shift the leading one up
   * to the implicit bit; each shift lowers the exponent by one from that of
   * 2^-14 (127 - 14 = 113). */
  guint32 e = 113;
  while (!(mantissa & 0x400)) {
    mantissa <<= 1;
    e--;
  }
  return sign | e << 23 | (mantissa & 0x3ff) << 13;
}

void
qkv_st_copy_to_f32(const StFile *f, const Entry *e, float *dst)
{
  const guchar *src = qkv_st_entry_data(f, e);
  gsize n = (gsize)qkv_shape_numel(&e->shape);
  guint32 bits;
  switch (e->dtype) {
  case ST_F32:
    qkv_st_copy_le32(dst, src, n);
    return;
  case ST_BF16: /* the high half of an f32 */
    for (gsize i = 0; i < n; i++) {
      bits = (guint32)read_le16(src + 2 * i) << 16;
      memcpy(&dst[i], &bits, 4);
    }
    return;
  case ST_F16:
    for (gsize i = 0; i < n; i++) {
      bits = f16_to_f32_bits(read_le16(src + 2 * i));
      memcpy(&dst[i], &bits, 4);
    }
    return;
  case ST_F64:
    for (gsize i = 0; i < n; i++) {
      guint64 u = 0;
      for (int b = 7; b >= 0; b--)
        u = (u << 8) | src[8 * i + b];
      double v;
      memcpy(&v, &u, 8);
      /* IEEE conversion (C11 Annex F): to nearest, ties to even, past the
       * f32 range to infinity */
      dst[i] = (float)v;
    }
    return;
  case ST_I32:
  case ST_I64:
    break;
  }
  g_return_if_reached();
}

/* Convert an I64 tensor to i32; FALSE (naming the element's byte offset) if
 * a value does not fit. */
gboolean
qkv_st_copy_i64_to_i32(const StFile *f, const Entry *e, gint32 *dst, GError **error)
{
  const guchar *src = qkv_st_entry_data(f, e);
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
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(path != NULL, NULL);
  g_autoptr(StFile) f = qkv_st_file_open(path, error);
  if (f == NULL)
    return NULL;
  g_autoptr(GHashTable) out =
      g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < f->entries->len; i++) {
    const Entry *e = g_ptr_array_index(f->entries, i);
    gboolean is_float = qkv_st_dtype_is_float(e->dtype);
    QkvTensor *t = qkv_tensor_try_new(is_float ? QKV_F32 : QKV_I32, &e->shape, error);
    if (t == NULL) {
      g_prefix_error(error, "checkpoint '%s': tensor '%s': ", path, e->name);
      return NULL;
    }
    g_hash_table_insert(out, g_strdup(e->name), t);
    if (is_float) {
      qkv_st_copy_to_f32(f, e, qkv_tensor_f32(t));
    } else if (e->dtype == ST_I64) {
      if (!qkv_st_copy_i64_to_i32(f, e, qkv_tensor_i32(t), error))
        return NULL;
    } else {
      qkv_st_copy_le32(qkv_tensor_data(t), qkv_st_entry_data(f, e), (gsize)qkv_tensor_numel(t));
    }
  }
  if (metadata != NULL)
    *metadata = g_hash_table_ref(f->metadata);
  return g_steal_pointer(&out);
}

GHashTable *
qkv_checkpoint_read_metadata(const gchar *path, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(path != NULL, NULL);
  g_autoptr(StFile) f = qkv_st_file_open(path, error);
  return f != NULL ? g_hash_table_ref(f->metadata) : NULL;
}
