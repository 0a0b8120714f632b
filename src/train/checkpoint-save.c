/* checkpoint-save.c: qkv_checkpoint_save in three phases. The header phase
 * checks the names and builds the safetensors header; the temporary file
 * phase writes header and tensors to a new file beside the target; the
 * durable rename syncs that file, renames it over the target and syncs the
 * directory, so a crash leaves either the old checkpoint or the new one. */
#include "train/checkpoint-private.h"

#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "error-private.h"

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
  QkvTensor *tensor;  /* borrowed */
  StDType dtype;      /* in the file: F32, I32 or BF16 */
  guint64 begin, end; /* data offsets */
} SaveItem;

static void
save_item_free(gpointer data)
{
  SaveItem *s = data;
  g_free(s->name);
  g_free(s);
}

static void
add_item(GPtrArray *items, gchar *name, QkvTensor *t, StDType dtype)
{
  SaveItem *s = g_new0(SaveItem, 1);
  s->name = name;
  s->tensor = t;
  s->dtype = dtype;
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

/* f32 bits rounded to bfloat16, to nearest with ties to even: adding 0x7fff
 * and the lowest kept bit carries into the kept half exactly when the
 * dropped half is past its midpoint, or at it with the kept half odd. The
 * carry runs into the exponent where it must (0x3fffffff -> 0x4000) and
 * from the largest values into infinity, as IEEE rounding overflows. A NaN
 * would be carried into another NaN or into infinity: it is truncated
 * instead and made quiet, so it stays a NaN of its sign. */
static guint16
f32_to_bf16(guint32 bits)
{
  if ((bits & 0x7fffffff) > 0x7f800000)
    return (guint16)(bits >> 16 | 0x0040);
  return (guint16)((bits + 0x7fff + (bits >> 16 & 1)) >> 16);
}

/* An f32 tensor as little-endian bfloat16, a chunk at a time. */
static gboolean
write_bf16(int fd, const QkvTensor *t, const gchar *path, const gchar *tmp, GError **error)
{
  const float *src = qkv_tensor_const_data(t);
  gsize n = (gsize)qkv_tensor_numel(t), chunk = 1 << 16;
  g_autofree guint8 *buf = g_malloc(2 * MIN(n, chunk) + 1);
  for (gsize i = 0; i < n; i += chunk) {
    gsize m = MIN(n - i, chunk);
    for (gsize k = 0; k < m; k++) {
      guint32 bits;
      memcpy(&bits, &src[i + k], 4);
      guint16 h = f32_to_bf16(bits);
      buf[2 * k] = (guint8)h;
      buf[2 * k + 1] = (guint8)(h >> 8);
    }
    if (!write_all(fd, buf, 2 * m, path, tmp, error))
      return FALSE;
  }
  return TRUE;
}

static gboolean
write_tensor(int fd, const SaveItem *s, const gchar *path, const gchar *tmp, GError **error)
{
  QkvTensor *t = s->tensor;
  if (s->dtype == ST_BF16)
    return write_bf16(fd, t, path, tmp, error);
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

/* ---- header ---- */

/* The tensors that go in, in header order: every param's value (in
 * value_dtype), then (with an optimizer) every param's states (F32 or I32,
 * as they are). NULL if a name cannot be written. */
static GPtrArray *
collect_items(const gchar *path, QkvParams *params, QkvOptimizer *optimizer, StDType value_dtype,
              GError **error)
{
  g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(save_item_free);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const gchar *name = qkv_param_name(p);
    if (g_str_equal(name, METADATA_KEY) || g_str_has_prefix(name, OPTIM_PREFIX)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "saving checkpoint '%s': parameter name '%s' is reserved", path, name);
      return NULL;
    }
    /* json-glib would write the bytes as they are, and no reader (qkv's
     * included) accepts a header that is not UTF-8 */
    if (!g_utf8_validate(name, -1, NULL)) {
      g_autofree gchar *shown = g_utf8_make_valid(name, -1);
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "saving checkpoint '%s': parameter name '%s' is not valid UTF-8", path, shown);
      return NULL;
    }
    add_item(items, g_strdup(name), qkv_param_value(p), value_dtype);
  }
  for (guint i = 0; optimizer != NULL && i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    for (guint s = 0; s < qkv_param_n_states(p); s++) {
      QkvTensor *t;
      const gchar *state = qkv_param_nth_state(p, s, &t);
      if (state[0] == '\0' || strchr(state, '.') != NULL || !g_utf8_validate(state, -1, NULL)) {
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "saving checkpoint '%s': state name '%s' of parameter '%s' must be "
                    "non-empty UTF-8 and contain no '.'",
                    path, state, qkv_param_name(p));
        return NULL;
      }
      add_item(items, g_strdup_printf(OPTIM_PREFIX "%s.%s", qkv_param_name(p), state), t,
               qkv_tensor_dtype(t) == QKV_F32 ? ST_F32 : ST_I32);
    }
  }
  return g_steal_pointer(&items);
}

/* Sets every item's data offsets: the 4-byte tensors first, then the 2-byte
 * ones, each group in header order, so that every tensor starts at a
 * multiple of its element size (the data section starts at a multiple of
 * 8), as safetensors' own writer lays them out. With F32 params that is
 * header order. Returns the items in data order. */
static GPtrArray *
lay_out_data(GPtrArray *items)
{
  GPtrArray *order = g_ptr_array_sized_new(items->len);
  guint64 offset = 0;
  for (gsize size = 4; size >= 2; size -= 2) {
    for (guint i = 0; i < items->len; i++) {
      SaveItem *s = g_ptr_array_index(items, i);
      if (qkv_st_dtype_size(s->dtype) != size)
        continue;
      s->begin = offset;
      offset += (guint64)qkv_tensor_numel(s->tensor) * size;
      s->end = offset;
      g_ptr_array_add(order, s);
    }
  }
  return order;
}

/* One string member of the metadata; takes value. */
static void
add_metadata(JsonBuilder *b, const gchar *key, gchar *value)
{
  json_builder_set_member_name(b, key);
  json_builder_add_string_value(b, value);
  g_free(value);
}

/* The added parameter groups (none: no key, so such a file is what qkv wrote
 * before groups existed): their count, each one's pattern, whether it has a
 * filter and its settings, and the group of every param not in group 0.
 * Patterns and param names were checked to be UTF-8 already. */
static void
add_group_metadata(JsonBuilder *b, QkvOptimizer *optimizer)
{
  guint n = qkv_optimizer_get_n_groups(optimizer);
  if (n == 1)
    return;
  add_metadata(b, "qkv.optimizer.groups", g_strdup_printf("%u", n - 1));
  for (guint g = 1; g < n; g++) {
    const gchar *pattern = qkv_optimizer_get_group_pattern(optimizer, g);
    gboolean filter = qkv_optimizer_get_group_filter(optimizer, g, NULL) != NULL;
    g_autofree gchar *key = g_strdup_printf("qkv.optimizer.group.%u.", g);
    g_autofree gchar *k_pattern = g_strconcat(key, "pattern", NULL);
    g_autofree gchar *k_filter = g_strconcat(key, "filter", NULL);
    g_autofree gchar *k_lr = g_strconcat(key, "lr_factor", NULL);
    g_autofree gchar *k_wd = g_strconcat(key, "weight_decay", NULL);
    if (pattern != NULL)
      add_metadata(b, k_pattern, g_strdup(pattern));
    add_metadata(b, k_filter, g_strdup(filter ? "true" : "false"));
    add_metadata(b, k_lr, format_double(qkv_optimizer_get_group_lr_factor(optimizer, g)));
    add_metadata(b, k_wd, format_double(qkv_optimizer_get_group_weight_decay(optimizer, g)));
  }
  QkvParams *params = qkv_optimizer_get_params(optimizer);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    guint g = qkv_optimizer_group_of(optimizer, p);
    if (g == 0)
      continue;
    g_autofree gchar *key = g_strconcat(GROUP_OF_PREFIX, qkv_param_name(p), NULL);
    add_metadata(b, key, g_strdup_printf("%u", g));
  }
}

static void
add_optimizer_metadata(JsonBuilder *b, QkvOptimizer *optimizer)
{
  const QkvOptimConfig *c = qkv_optimizer_get_config(optimizer);
  add_metadata(b, "qkv.optimizer.kind",
               g_strdup(qkv_optimizer_kind_name(qkv_optimizer_get_kind(optimizer))));
  add_metadata(b, "qkv.optimizer.step",
               g_strdup_printf("%" G_GINT64_FORMAT, qkv_optimizer_get_step(optimizer)));
  add_metadata(b, "qkv.optimizer.lr", format_double(c->lr));
  add_metadata(b, "qkv.optimizer.weight_decay", format_double(c->weight_decay));
  add_metadata(b, "qkv.optimizer.momentum", format_double(c->momentum));
  add_metadata(b, "qkv.optimizer.dampening", format_double(c->dampening));
  add_metadata(b, "qkv.optimizer.nesterov", g_strdup(c->nesterov ? "true" : "false"));
  add_metadata(b, "qkv.optimizer.beta1", format_double(c->beta1));
  add_metadata(b, "qkv.optimizer.beta2", format_double(c->beta2));
  add_metadata(b, "qkv.optimizer.eps", format_double(c->eps));
  add_group_metadata(b, optimizer);
}

/* The "__metadata__" member: qkv's own keys, then the caller's in sorted
 * order. FALSE if a caller's key is reserved or not UTF-8. */
static gboolean
add_metadata_object(JsonBuilder *b, const gchar *path, QkvOptimizer *optimizer,
                    QkvSchedule *schedule, GHashTable *metadata, GError **error)
{
  json_builder_set_member_name(b, METADATA_KEY);
  json_builder_begin_object(b);
  if (metadata == NULL || !g_hash_table_contains(metadata, "format"))
    add_metadata(b, "format", g_strdup("pt"));
  add_metadata(b, "qkv.version", g_strdup(qkv_version()));
  if (optimizer != NULL)
    add_optimizer_metadata(b, optimizer);
  if (schedule != NULL) {
    add_metadata(b, "qkv.schedule.kind",
                 g_strdup(qkv_schedule_kind_name(qkv_schedule_get_kind(schedule))));
    add_metadata(b, "qkv.schedule.position",
                 g_strdup_printf("%" G_GINT64_FORMAT, qkv_schedule_get_position(schedule)));
  }
  g_autoptr(GList) user_keys = metadata != NULL ? g_hash_table_get_keys(metadata) : NULL;
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
    add_metadata(b, k, g_strdup(v));
  }
  json_builder_end_object(b);
  return TRUE;
}

/* One member per tensor, at the offsets lay_out_data chose. */
static void
add_tensor_entries(JsonBuilder *b, GPtrArray *items)
{
  for (guint i = 0; i < items->len; i++) {
    SaveItem *s = g_ptr_array_index(items, i);
    const QkvShape *shape = qkv_tensor_shape(s->tensor);
    json_builder_set_member_name(b, s->name);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "dtype");
    json_builder_add_string_value(b, qkv_st_dtype_name(s->dtype));
    json_builder_set_member_name(b, "shape");
    json_builder_begin_array(b);
    for (gint d = 0; d < shape->rank; d++)
      json_builder_add_int_value(b, shape->dims[d]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "data_offsets");
    json_builder_begin_array(b);
    json_builder_add_int_value(b, (gint64)s->begin);
    json_builder_add_int_value(b, (gint64)s->end);
    json_builder_end_array(b);
    json_builder_end_object(b);
  }
}

/* The bytes before the tensors: the header length (8 bytes, little-endian)
 * and the JSON, padded with spaces to a multiple of 8. */
static GString *
build_header(const gchar *path, GPtrArray *items, QkvOptimizer *optimizer, QkvSchedule *schedule,
             GHashTable *metadata, GError **error)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  if (!add_metadata_object(b, path, optimizer, schedule, metadata, error))
    return NULL;
  add_tensor_entries(b, items);
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
  return header;
}

/* ---- temporary file ---- */

/* The target and the temporary file beside it. save_target_clear is the
 * one cleanup of a save: it closes the temporary if still open and removes
 * it unless it was renamed over the target. */
typedef struct {
  const gchar *path; /* the target */
  gchar *dir, *base;
  gchar *tmp;
  int fd;           /* the temporary; -1 when not open */
  gboolean pending; /* tmp exists and has not been renamed */
} SaveTarget;

static void
save_target_clear(SaveTarget *t)
{
  if (t->fd >= 0)
    close(t->fd);
  if (t->pending)
    unlink(t->tmp);
  g_free(t->dir);
  g_free(t->base);
  g_free(t->tmp);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(SaveTarget, save_target_clear)

/* header, then the tensors in data order */
static gboolean
write_temporary(SaveTarget *t, const GString *header, GPtrArray *data_order, GError **error)
{
  t->tmp = g_strdup_printf("%s%c.%s.tmp-XXXXXX", t->dir, G_DIR_SEPARATOR, t->base);
  t->fd = g_mkstemp_full(t->tmp, O_WRONLY | O_CLOEXEC, 0644);
  if (t->fd < 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO,
                "saving checkpoint '%s': cannot create a temporary file in '%s': %s", t->path,
                t->dir, g_strerror(err));
    return FALSE;
  }
  t->pending = TRUE;
  /* marks the file as being written (see remove_stale_temporaries); a file
   * system without flock just leaves the age rule */
  (void)flock(t->fd, LOCK_EX | LOCK_NB);
  if (!write_all(t->fd, header->str, header->len, t->path, t->tmp, error))
    return FALSE;
  for (guint i = 0; i < data_order->len; i++)
    if (!write_tensor(t->fd, g_ptr_array_index(data_order, i), t->path, t->tmp, error))
      return FALSE;
  return TRUE;
}

/* ---- durable rename ---- */

static gboolean
durable_rename(SaveTarget *t, GError **error)
{
  if (fsync(t->fd) != 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': fsync of '%s': %s",
                t->path, t->tmp, g_strerror(err));
    return FALSE;
  }
  int fd = t->fd;
  t->fd = -1;
  if (close(fd) != 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': closing '%s': %s", t->path,
                t->tmp, g_strerror(err));
    return FALSE;
  }
  if (rename(t->tmp, t->path) != 0) {
    int err = errno;
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO, "saving checkpoint '%s': renaming '%s': %s",
                t->path, t->tmp, g_strerror(err));
    return FALSE;
  }
  t->pending = FALSE;
  /* make the rename itself durable */
  int dfd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP)) {
    int err = errno;
    if (dfd >= 0)
      close(dfd);
    g_set_error(error, QKV_ERROR, QKV_ERROR_IO,
                "saving checkpoint '%s': written, but syncing directory '%s' failed: %s", t->path,
                t->dir, g_strerror(err));
    return FALSE;
  }
  close(dfd);
  return TRUE;
}

gboolean
qkv_checkpoint_save_full(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                         QkvSchedule *schedule, GHashTable *metadata,
                         QkvCheckpointDType param_dtype, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(path != NULL && params != NULL, FALSE);
  g_return_val_if_fail(optimizer == NULL || qkv_optimizer_get_params(optimizer) == params, FALSE);
  g_return_val_if_fail(
      param_dtype == QKV_CHECKPOINT_DTYPE_F32 || param_dtype == QKV_CHECKPOINT_DTYPE_BF16, FALSE);
  StDType value_dtype = param_dtype == QKV_CHECKPOINT_DTYPE_BF16 ? ST_BF16 : ST_F32;
  g_autoptr(GPtrArray) items = collect_items(path, params, optimizer, value_dtype, error);
  if (items == NULL)
    return FALSE;
  g_autoptr(GPtrArray) data_order = lay_out_data(items);
  g_autoptr(GString) header = build_header(path, items, optimizer, schedule, metadata, error);
  if (header == NULL)
    return FALSE;
  g_auto(SaveTarget) target = {
      .path = path,
      .dir = g_path_get_dirname(path),
      .base = g_path_get_basename(path),
      .fd = -1,
  };
  if (!write_temporary(&target, header, data_order, error) || !durable_rename(&target, error))
    return FALSE;
  remove_stale_temporaries(target.dir, target.base, target.tmp);
  return TRUE;
}

gboolean
qkv_checkpoint_save(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                    QkvSchedule *schedule, GHashTable *metadata, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  return qkv_checkpoint_save_full(path, params, optimizer, schedule, metadata,
                                  QKV_CHECKPOINT_DTYPE_F32, error);
}
