/* checkpoint-load.c: qkv_checkpoint_load in three phases. Parse reads and
 * checks the file on its own (checkpoint-format.c); validate matches it
 * against the store, the optimizer and the schedule and decides every copy;
 * apply makes them. Nothing changes unless every check has passed, so a
 * refused file leaves the store as it was. */
#include "train/checkpoint-private.h"

#include <math.h>
#include <string.h>
#include "error-private.h"

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

/* How a group picks its params, for messages. */
static gchar *
describe_pattern(const gchar *pattern)
{
  return pattern != NULL ? g_strdup_printf("pattern '%s'", pattern) : g_strdup("no pattern");
}

/* Group g of the file against the optimizer's: the same pattern (or none)
 * and a filter in both or neither; its lr factor and weight decay go to
 * settings. */
static gboolean
read_group(const StFile *f, QkvOptimizer *opt, guint g, double settings[2], GError **error)
{
  g_autofree gchar *k_pattern = g_strdup_printf("qkv.optimizer.group.%u.pattern", g);
  g_autofree gchar *k_filter = g_strdup_printf("qkv.optimizer.group.%u.filter", g);
  g_autofree gchar *k_lr = g_strdup_printf("qkv.optimizer.group.%u.lr_factor", g);
  g_autofree gchar *k_wd = g_strdup_printf("qkv.optimizer.group.%u.weight_decay", g);
  const gchar *pattern = g_hash_table_lookup(f->metadata, k_pattern);
  const gchar *own = qkv_optimizer_get_group_pattern(opt, g);
  if (g_strcmp0(pattern, own) != 0) {
    g_autofree gchar *theirs = describe_pattern(pattern), *ours = describe_pattern(own);
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "checkpoint '%s': parameter group %u has %s, the optimizer's has %s", f->path, g,
                theirs, ours);
    return FALSE;
  }
  gboolean filter;
  if (!metadata_bool(f, k_filter, &filter, error))
    return FALSE;
  gboolean own_filter = qkv_optimizer_get_group_filter(opt, g, NULL) != NULL;
  if (filter != own_filter) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "checkpoint '%s': parameter group %u has %s filter, the optimizer's has %s",
                f->path, g, filter ? "a" : "no", own_filter ? "one" : "none");
    return FALSE;
  }
  if (!metadata_double(f, k_lr, &settings[0], error) ||
      !metadata_double(f, k_wd, &settings[1], error))
    return FALSE;
  if (settings[0] < 0 || settings[1] < 0) {
    CORRUPT("checkpoint '%s': parameter group %u: lr_factor %g and weight_decay %g must be at "
            "least 0",
            f->path, g, settings[0], settings[1]);
    return FALSE;
  }
  return TRUE;
}

/* Every param the file holds (loaded) is in the same group in the file as in
 * the optimizer; "group_of" entries name a group of the file's. */
static gboolean
check_group_members(const StFile *f, QkvOptimizer *opt, guint n, GHashTable *loaded, GError **error)
{
  GHashTableIter it;
  gpointer key, value;
  g_hash_table_iter_init(&it, f->metadata);
  while (g_hash_table_iter_next(&it, &key, &value)) {
    if (!g_str_has_prefix(key, GROUP_OF_PREFIX))
      continue;
    if (n == 0) {
      CORRUPT("checkpoint '%s': metadata '%s' names a parameter group, but the file has none",
              f->path, (const gchar *)key);
      return FALSE;
    }
    if (!g_ascii_string_to_unsigned(value, 10, 1, n, NULL, NULL)) {
      CORRUPT("checkpoint '%s': metadata '%s' = '%s' is not a group from 1 to %u", f->path,
              (const gchar *)key, (const gchar *)value, n);
      return FALSE;
    }
  }
  QkvParams *params = qkv_optimizer_get_params(opt);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (!g_hash_table_contains(loaded, p))
      continue;
    g_autofree gchar *k = g_strconcat(GROUP_OF_PREFIX, qkv_param_name(p), NULL);
    const gchar *v = g_hash_table_lookup(f->metadata, k);
    guint theirs = v != NULL ? (guint)g_ascii_strtoull(v, NULL, 10) : 0;
    guint ours = qkv_optimizer_group_of(opt, p);
    if (theirs != ours) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "checkpoint '%s': parameter '%s' is in parameter group %u there but in group "
                  "%u of the optimizer",
                  f->path, qkv_param_name(p), theirs, ours);
      return FALSE;
    }
  }
  return TRUE;
}

/* The file's parameter groups must be the optimizer's: as many, each picking
 * params the same way and holding the same params. Their settings go to
 * *settings (lr factor and weight decay of groups 1, 2, ...). */
static gboolean
read_groups_metadata(const StFile *f, QkvOptimizer *opt, GHashTable *loaded, double **settings,
                     GError **error)
{
  guint want = qkv_optimizer_get_n_groups(opt) - 1;
  gint64 have = 0;
  if (g_hash_table_contains(f->metadata, "qkv.optimizer.groups") &&
      !metadata_int(f, "qkv.optimizer.groups", &have, error))
    return FALSE;
  if (have != (gint64)want) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "checkpoint '%s' holds %" G_GINT64_FORMAT
                " added parameter groups, the optimizer has %u",
                f->path, have, want);
    return FALSE;
  }
  g_autofree double *read = g_new0(double, 2 * (gsize)MAX(want, 1));
  for (guint g = 1; g <= want; g++)
    if (!read_group(f, opt, g, read + 2 * (g - 1), error))
      return FALSE;
  if (!check_group_members(f, opt, want, loaded, error))
    return FALSE;
  *settings = g_steal_pointer(&read);
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
  gboolean dtype_ok = (want == QKV_F32) == qkv_st_dtype_is_float(e->dtype);
  if (!dtype_ok) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE,
                "checkpoint '%s': tensor '%s' is %s but %s is %s (byte offset %" G_GUINT64_FORMAT
                ")",
                f->path, e->name, qkv_st_dtype_name(e->dtype), what, qkv_dtype_name(want),
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
  if (qkv_st_dtype_is_float(e->dtype))
    qkv_st_copy_to_f32(f, e, qkv_tensor_f32(t));
  else if (e->dtype == ST_I64)
    qkv_st_copy_i64_to_i32(f, e, qkv_tensor_i32(t), NULL); /* range checked already */
  else
    qkv_st_copy_le32(qkv_tensor_data(t), qkv_st_entry_data(f, e), (gsize)qkv_tensor_numel(t));
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

/* What a load will do, decided before anything changes. */
typedef struct {
  GPtrArray *assignments; /* Assignment*: every copy to make */
  GHashTable *loaded;     /* params whose state the load replaces */
  GPtrArray *missing_names, *unexpected_names;
  QkvOptimConfig config;
  double *group_settings; /* lr factor and weight decay of groups 1, 2, ... */
  gint64 opt_step, position;
} LoadPlan;

static void
load_plan_init(LoadPlan *lp)
{
  lp->assignments = g_ptr_array_new_with_free_func(assignment_free);
  lp->loaded = g_hash_table_new(g_direct_hash, g_direct_equal);
  lp->missing_names = g_ptr_array_new_with_free_func(g_free);
  lp->unexpected_names = g_ptr_array_new_with_free_func(g_free);
}

static void
load_plan_clear(LoadPlan *lp)
{
  g_clear_pointer(&lp->assignments, g_ptr_array_unref);
  g_clear_pointer(&lp->loaded, g_hash_table_unref);
  g_clear_pointer(&lp->missing_names, g_ptr_array_unref);
  g_clear_pointer(&lp->unexpected_names, g_ptr_array_unref);
  g_clear_pointer(&lp->group_settings, g_free);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(LoadPlan, load_plan_clear)

static void
plan_copy(LoadPlan *lp, QkvParam *p, const gchar *state, const Entry *e)
{
  Assignment *a = g_new0(Assignment, 1);
  a->param = p;
  a->state = g_strdup(state);
  a->entry = e;
  g_ptr_array_add(lp->assignments, a);
}

/* ---- validate ---- */

/* Every param against the file. */
static gboolean
match_params(const StFile *f, QkvParams *params, LoadPlan *lp, GError **error)
{
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    const Entry *e = g_hash_table_lookup(f->by_name, qkv_param_name(p));
    if (e == NULL) {
      g_ptr_array_add(lp->missing_names, g_strdup(qkv_param_name(p)));
      continue;
    }
    g_autofree gchar *what = g_strdup_printf("parameter '%s'", qkv_param_name(p));
    if (!check_fits(f, e, qkv_param_value(p), what, error))
      return FALSE;
    plan_copy(lp, p, NULL, e);
    g_hash_table_add(lp->loaded, p);
  }
  return TRUE;
}

/* An "__optim__.PARAM.STATE" tensor: a state of a param of the store, or an
 * unexpected name. */
static gboolean
match_optimizer_state(const StFile *f, QkvParams *params, const Entry *e, LoadPlan *lp,
                      GError **error)
{
  const gchar *rest = e->name + strlen(OPTIM_PREFIX);
  const gchar *dot = strrchr(rest, '.');
  g_autofree gchar *pname = dot != NULL ? g_strndup(rest, dot - rest) : NULL;
  QkvParam *p = pname != NULL ? qkv_params_lookup(params, pname) : NULL;
  if (p == NULL || dot[1] == '\0') {
    g_ptr_array_add(lp->unexpected_names, g_strdup(e->name));
    return TRUE;
  }
  const gchar *state = dot + 1;
  QkvTensor *existing = qkv_param_lookup_state(p, state);
  g_autofree gchar *what = g_strdup_printf("optimizer state '%s' of parameter '%s'", state, pname);
  if (existing != NULL && !check_fits(f, e, existing, what, error))
    return FALSE;
  /* a fresh optimizer has no state to compare with: the step count is an
   * integer scalar, every other state has the parameter's shape in f32
   * (read from any floating-point dtype) */
  gboolean is_step = g_str_equal(state, "step");
  gboolean fits =
      is_step ? (e->dtype == ST_I32 || e->dtype == ST_I64) && e->shape.rank == 0
              : qkv_st_dtype_is_float(e->dtype) && qkv_shape_equal(&e->shape, qkv_param_shape(p));
  if (!fits) {
    g_autofree gchar *got = qkv_shape_to_string(&e->shape);
    g_autofree gchar *want = qkv_shape_to_string(qkv_param_shape(p));
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "checkpoint '%s': %s is %s%s at byte offset %" G_GUINT64_FORMAT ", expected %s",
                f->path, what, qkv_st_dtype_name(e->dtype), got, f->data_start + e->begin,
                is_step ? "an integer scalar" : want);
    return FALSE;
  }
  if (e->dtype == ST_I64 && !qkv_st_copy_i64_to_i32(f, e, NULL, error))
    return FALSE;
  if (is_step) {
    /* a negative count makes the next Adam update NaN. G_MAXINT32 loads
     * (a save of a store at that count must load back); the optimizer
     * refuses to step past it. */
    gint32 count = 0;
    if (e->dtype == ST_I64)
      qkv_st_copy_i64_to_i32(f, e, &count, NULL);
    else
      qkv_st_copy_le32(&count, qkv_st_entry_data(f, e), 1);
    if (count < 0) {
      CORRUPT("checkpoint '%s': %s is %d at byte offset %" G_GUINT64_FORMAT
              ", a step count cannot be negative",
              f->path, what, count, f->data_start + e->begin);
      return FALSE;
    }
  }
  plan_copy(lp, p, state, e);
  return TRUE;
}

/* Every tensor of the file against the store. */
static gboolean
match_file_tensors(const StFile *f, QkvParams *params, QkvOptimizer *optimizer, LoadPlan *lp,
                   GError **error)
{
  for (guint i = 0; i < f->entries->len; i++) {
    const Entry *e = g_ptr_array_index(f->entries, i);
    if (qkv_params_lookup(params, e->name) != NULL)
      continue;
    if (!g_str_has_prefix(e->name, OPTIM_PREFIX)) {
      g_ptr_array_add(lp->unexpected_names, g_strdup(e->name));
      continue;
    }
    if (optimizer != NULL && !match_optimizer_state(f, params, e, lp, error))
      return FALSE;
  }
  return TRUE;
}

static gboolean
validate(const StFile *f, QkvParams *params, QkvOptimizer *optimizer, QkvSchedule *schedule,
         QkvCheckpointFlags flags, LoadPlan *lp, GError **error)
{
  if (!match_params(f, params, lp, error) || !match_file_tensors(f, params, optimizer, lp, error))
    return FALSE;
  if (lp->missing_names->len > 0 && !(flags & QKV_CHECKPOINT_ALLOW_MISSING)) {
    g_autofree gchar *list = list_names(lp->missing_names);
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s' has no tensor for parameter %s", f->path, list);
    return FALSE;
  }
  if (lp->unexpected_names->len > 0 && !(flags & QKV_CHECKPOINT_ALLOW_UNEXPECTED)) {
    g_autofree gchar *list = list_names(lp->unexpected_names);
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND,
                "checkpoint '%s': tensor %s matches no parameter of the store", f->path, list);
    return FALSE;
  }
  if (optimizer != NULL &&
      (!read_optimizer_metadata(f, optimizer, &lp->config, &lp->opt_step, error) ||
       !read_groups_metadata(f, optimizer, lp->loaded, &lp->group_settings, error)))
    return FALSE;
  if (schedule != NULL && !read_schedule_metadata(f, schedule, &lp->position, error))
    return FALSE;
  return TRUE;
}

/* ---- apply ---- */

/* The state of a loaded param becomes exactly the file's: drop the states
 * the file does not hold. */
static void
drop_unloaded_states(const LoadPlan *lp)
{
  g_autoptr(GHashTable) keep = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (guint i = 0; i < lp->assignments->len; i++) {
    Assignment *a = g_ptr_array_index(lp->assignments, i);
    if (a->state != NULL)
      g_hash_table_add(keep, g_strdup_printf("%p/%s", (void *)a->param, a->state));
  }
  GHashTableIter it;
  gpointer key;
  g_hash_table_iter_init(&it, lp->loaded);
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

static void
apply(const StFile *f, const LoadPlan *lp, QkvOptimizer *optimizer, QkvSchedule *schedule)
{
  if (optimizer != NULL)
    drop_unloaded_states(lp);
  for (guint i = 0; i < lp->assignments->len; i++) {
    Assignment *a = g_ptr_array_index(lp->assignments, i);
    QkvTensor *t;
    if (a->state == NULL)
      t = qkv_param_value(a->param);
    else
      t = qkv_param_state_full(a->param, a->state,
                               qkv_st_dtype_is_float(a->entry->dtype) ? QKV_F32 : QKV_I32,
                               &a->entry->shape);
    copy_entry(f, a->entry, t);
  }
  if (optimizer != NULL) {
    qkv_optimizer_set_config(optimizer, &lp->config, NULL);
    qkv_optimizer_set_step(optimizer, lp->opt_step);
    for (guint g = 1; g < qkv_optimizer_get_n_groups(optimizer); g++)
      qkv_optimizer_set_group_settings(optimizer, g, lp->group_settings[2 * (g - 1)],
                                       lp->group_settings[2 * (g - 1) + 1], NULL);
  }
  if (schedule != NULL)
    qkv_schedule_set_position(schedule, lp->position);
}

gboolean
qkv_checkpoint_load(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                    QkvSchedule *schedule, QkvCheckpointFlags flags, GPtrArray **missing,
                    GPtrArray **unexpected, GError **error)
{
  if (missing != NULL) /* a failure, an earlier one's included, leaves them NULL */
    *missing = NULL;
  if (unexpected != NULL)
    *unexpected = NULL;
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(path != NULL && params != NULL, FALSE);
  g_return_val_if_fail(optimizer == NULL || qkv_optimizer_get_params(optimizer) == params, FALSE);
  g_autoptr(StFile) f = qkv_st_file_open(path, error);
  if (f == NULL)
    return FALSE;
  g_auto(LoadPlan) lp = {0};
  load_plan_init(&lp);
  if (!validate(f, params, optimizer, schedule, flags, &lp, error))
    return FALSE;
  apply(f, &lp, optimizer, schedule);
  if (missing != NULL)
    *missing = g_steal_pointer(&lp.missing_names);
  if (unexpected != NULL)
    *unexpected = g_steal_pointer(&lp.unexpected_names);
  return TRUE;
}
