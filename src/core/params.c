/* params.c: the parameter store. */
#include "core/core-private.h"
#include "error-private.h"

static void
param_free(gpointer data)
{
  QkvParam *p = data;
  g_free(p->name);
  qkv_tensor_free(p->value);
  qkv_tensor_free(p->grad);
  g_ptr_array_unref(p->state_names);
  g_ptr_array_unref(p->states);
  g_free(p);
}

QkvParams *
qkv_params_new(void)
{
  QkvParams *params = g_new0(QkvParams, 1);
  params->ref_count = 1;
  params->list = g_ptr_array_new_with_free_func(param_free);
  params->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  return params;
}

void
qkv_params_free(QkvParams *params)
{
  if (params == NULL)
    return;
  /* graphs, optimizers and bindings may hold references (qkv_params_ref()) */
  if (!g_atomic_int_dec_and_test(&params->ref_count))
    return;
  g_hash_table_unref(params->by_name);
  g_ptr_array_unref(params->list);
  g_free(params);
}

QkvParam *
qkv_params_add(QkvParams *params, const gchar *name, const QkvShape *shape, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL && name != NULL && shape != NULL, NULL);
  if (g_hash_table_contains(params->by_name, name)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_EXISTS, "parameter '%s' already exists", name);
    return NULL;
  }
  if (!qkv_shape_is_valid(shape)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "parameter '%s': invalid shape (rank %d, a negative dimension, or too many "
                "elements)",
                name, shape->rank);
    return NULL;
  }
  g_autoptr(QkvTensor) value = qkv_tensor_try_new(QKV_F32, shape, NULL);
  g_autoptr(QkvTensor) grad = value != NULL ? qkv_tensor_try_new(QKV_F32, shape, NULL) : NULL;
  if (grad == NULL) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    gsize nbytes = (gsize)qkv_shape_numel(shape) * sizeof(float);
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "parameter '%s': cannot allocate its value and gradient, shape %s, %" G_GSIZE_FORMAT
                " bytes each",
                name, s, nbytes);
    return NULL;
  }
  QkvParam *p = g_new0(QkvParam, 1);
  p->born = params->generation;
  p->name = g_strdup(name);
  p->value = g_steal_pointer(&value);
  p->grad = g_steal_pointer(&grad);
  p->state_names = g_ptr_array_new_with_free_func(g_free);
  p->states = g_ptr_array_new_with_free_func((GDestroyNotify)qkv_tensor_free);
  g_ptr_array_add(params->list, p);
  g_hash_table_insert(params->by_name, p->name, p);
  return p;
}

QkvParam *
qkv_params_lookup(QkvParams *params, const gchar *name)
{
  g_return_val_if_fail(params != NULL && name != NULL, NULL);
  return g_hash_table_lookup(params->by_name, name);
}

guint
qkv_params_size(QkvParams *params)
{
  return params->list->len;
}

QkvParam *
qkv_params_nth(QkvParams *params, guint index)
{
  g_return_val_if_fail(params != NULL, NULL);
  /* an index past the end is a value a user can pass: quiet, as documented */
  if (index >= params->list->len)
    return NULL;
  return g_ptr_array_index(params->list, index);
}

gint64
qkv_params_numel(QkvParams *params)
{
  gint64 n = 0;
  for (guint i = 0; i < params->list->len; i++)
    n += qkv_tensor_numel(((QkvParam *)g_ptr_array_index(params->list, i))->value);
  return n;
}

gint64
qkv_params_numel_trainable(QkvParams *params)
{
  gint64 n = 0;
  for (guint i = 0; i < params->list->len; i++) {
    QkvParam *p = g_ptr_array_index(params->list, i);
    if (!p->frozen)
      n += qkv_tensor_numel(p->value);
  }
  return n;
}

void
qkv_params_zero_grad(QkvParams *params)
{
  for (guint i = 0; i < params->list->len; i++)
    qkv_tensor_fill(((QkvParam *)g_ptr_array_index(params->list, i))->grad, 0.0);
}

const gchar *
qkv_param_name(const QkvParam *param)
{
  return param->name;
}

QkvTensor *
qkv_param_value(QkvParam *param)
{
  return param->value;
}

QkvTensor *
qkv_param_grad(QkvParam *param)
{
  return param->grad;
}

const QkvShape *
qkv_param_shape(const QkvParam *param)
{
  return qkv_tensor_shape(param->value);
}

void
qkv_param_set_frozen(QkvParam *param, gboolean frozen)
{
  param->frozen = frozen;
}

gboolean
qkv_param_get_frozen(const QkvParam *param)
{
  return param->frozen;
}

QkvTensor *
qkv_param_lookup_state(QkvParam *param, const gchar *name)
{
  for (guint i = 0; i < param->state_names->len; i++)
    if (g_str_equal(g_ptr_array_index(param->state_names, i), name))
      return g_ptr_array_index(param->states, i);
  return NULL;
}

QkvTensor *
qkv_param_state(QkvParam *param, const gchar *name)
{
  QkvTensor *t = qkv_param_lookup_state(param, name);
  if (t != NULL)
    return t;
  t = qkv_tensor_new(QKV_F32, qkv_tensor_shape(param->value));
  g_ptr_array_add(param->state_names, g_strdup(name));
  g_ptr_array_add(param->states, t);
  return t;
}

QkvTensor *
qkv_param_try_state(QkvParam *param, const gchar *name, QkvDType dtype, const QkvShape *shape,
                    GError **error)
{
  QkvTensor *t = qkv_param_lookup_state(param, name);
  if (t != NULL)
    return t;
  t = qkv_tensor_try_new(dtype, shape, NULL);
  if (t == NULL) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "parameter '%s': cannot allocate state '%s', %s %s, %" G_GSIZE_FORMAT " bytes",
                param->name, name, qkv_dtype_name(dtype), s,
                (gsize)qkv_shape_numel(shape) * qkv_dtype_size(dtype));
    return NULL;
  }
  g_ptr_array_add(param->state_names, g_strdup(name));
  g_ptr_array_add(param->states, t);
  return t;
}

QkvTensor *
qkv_param_state_full(QkvParam *param, const gchar *name, QkvDType dtype, const QkvShape *shape)
{
  g_return_val_if_fail(param != NULL && name != NULL && shape != NULL, NULL);
  QkvTensor *t = qkv_param_lookup_state(param, name);
  if (t != NULL) {
    g_return_val_if_fail(
        qkv_tensor_dtype(t) == dtype && qkv_shape_equal(qkv_tensor_shape(t), shape), NULL);
    return t;
  }
  t = qkv_tensor_new(dtype, shape);
  g_return_val_if_fail(t != NULL, NULL);
  g_ptr_array_add(param->state_names, g_strdup(name));
  g_ptr_array_add(param->states, t);
  return t;
}

gboolean
qkv_param_remove_state(QkvParam *param, const gchar *name)
{
  g_return_val_if_fail(param != NULL && name != NULL, FALSE);
  for (guint i = 0; i < param->state_names->len; i++) {
    if (g_str_equal(g_ptr_array_index(param->state_names, i), name)) {
      g_ptr_array_remove_index(param->state_names, i);
      g_ptr_array_remove_index(param->states, i);
      return TRUE;
    }
  }
  return FALSE;
}

guint
qkv_param_n_states(QkvParam *param)
{
  return param->states->len;
}

const gchar *
qkv_param_nth_state(QkvParam *param, guint index, QkvTensor **tensor)
{
  if (tensor != NULL)
    *tensor = NULL;
  g_return_val_if_fail(param != NULL, NULL);
  if (index >= param->states->len)
    return NULL;
  if (tensor != NULL)
    *tensor = g_ptr_array_index(param->states, index);
  return g_ptr_array_index(param->state_names, index);
}

void
qkv_params_mark(QkvParams *params, QkvParamsMark *mark)
{
  g_return_if_fail(params != NULL && mark != NULL);
  *mark = (QkvParamsMark){.n_params = params->list->len, .generation = params->generation};
}

gboolean
qkv_params_mark_is_current(const QkvParams *params, const QkvParamsMark *mark)
{
  if (mark->n_params > params->list->len || mark->generation > params->generation)
    return FALSE;
  if (mark->n_params == 0)
    return TRUE;
  const QkvParam *last = g_ptr_array_index(params->list, mark->n_params - 1);
  return last->born <= mark->generation;
}

gboolean
qkv_params_rollback_checked(QkvParams *params, const QkvParamsMark *mark, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(params != NULL && mark != NULL, FALSE);
  if (!qkv_params_mark_is_current(params, mark)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_params_rollback: stale mark (%u parameters): a rollback since it was taken "
                "removed what it counted; the store is unchanged",
                mark->n_params);
    return FALSE;
  }
  if (params->list->len > mark->n_params)
    params->generation++;
  while (params->list->len > mark->n_params) {
    QkvParam *p = g_ptr_array_index(params->list, params->list->len - 1);
    g_hash_table_remove(params->by_name, p->name);
    g_ptr_array_remove_index(params->list, params->list->len - 1);
  }
  return TRUE;
}

void
qkv_params_rollback(QkvParams *params, const QkvParamsMark *mark)
{
  qkv_params_rollback_checked(params, mark, NULL);
}

gboolean
qkv_params_grads_acquire(QkvParams *params)
{
  return g_atomic_int_compare_and_exchange(&params->grads_busy, 0, 1);
}

void
qkv_params_grads_release(QkvParams *params)
{
  g_atomic_int_set(&params->grads_busy, 0);
}
