/* accumulate.c: gradient accumulation over micro-batches and the even split
 * of a batch into parts (qkv-optim.h). */
#include "core/core-private.h"

#include <string.h>
#include <qkv/qkv-optim.h>
#include "error-private.h"

struct _QkvGradAccumulator {
  QkvParams *params;
  QkvParamsMark created; /* the store at creation: members are among its params */
  GPtrArray *members;    /* QkvParam *: the non-frozen params at creation */
  float *sum;            /* their gradients end to end */
  gsize n;
  guint adds;
  gint ref_count; /* qkv_grad_accumulator_ref(); _free() drops one */
};

QkvGradAccumulator *
qkv_grad_accumulator_new(QkvParams *params, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL, NULL);
  GPtrArray *members = g_ptr_array_new();
  gsize n = 0;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    if (qkv_param_get_frozen(p))
      continue;
    g_ptr_array_add(members, p);
    n += (gsize)qkv_tensor_numel(qkv_param_grad(p));
  }
  float *sum = n > 0 ? g_try_new(float, n) : NULL;
  if (n > 0 && sum == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "no memory for the %zu-byte gradient accumulator (%u params)", n * sizeof(float),
                members->len);
    g_ptr_array_unref(members);
    return NULL;
  }
  QkvGradAccumulator *acc = g_new0(QkvGradAccumulator, 1);
  acc->ref_count = 1;
  /* the store must outlive the accumulator: hold it */
  acc->params = qkv_params_ref(params);
  qkv_params_mark(params, &acc->created);
  acc->members = members;
  acc->sum = sum;
  acc->n = n;
  return acc;
}

void
qkv_grad_accumulator_free(QkvGradAccumulator *acc)
{
  if (acc == NULL)
    return;
  if (!g_atomic_int_dec_and_test(&acc->ref_count))
    return;
  qkv_params_free(acc->params);
  g_ptr_array_unref(acc->members);
  g_free(acc->sum);
  g_free(acc);
}

/* A qkv_params_rollback() since creation may have freed members: then the
 * accumulator must not touch them (a user-passable state, so no warning). */
static gboolean
members_alive(const QkvGradAccumulator *acc)
{
  return qkv_params_mark_is_current(acc->params, &acc->created);
}

void
qkv_grad_accumulator_add(QkvGradAccumulator *acc)
{
  g_return_if_fail(acc != NULL);
  if (!members_alive(acc))
    return;
  float *at = acc->sum;
  for (guint i = 0; i < acc->members->len; i++) {
    QkvTensor *g = qkv_param_grad(g_ptr_array_index(acc->members, i));
    const float *src = qkv_tensor_data(g);
    gint64 k = qkv_tensor_numel(g);
    /* the first add copies, so that one part's sum is its gradient exactly
     * (0 + -0 would be +0) */
    if (acc->adds == 0)
      memcpy(at, src, (gsize)k * sizeof(float));
    else
      for (gint64 j = 0; j < k; j++)
        at[j] += src[j];
    at += k;
  }
  acc->adds++;
}

guint
qkv_grad_accumulator_store(QkvGradAccumulator *acc)
{
  g_return_val_if_fail(acc != NULL, 0);
  if (!members_alive(acc))
    return G_MAXUINT;
  const float *at = acc->sum;
  for (guint i = 0; i < acc->members->len; i++) {
    QkvTensor *g = qkv_param_grad(g_ptr_array_index(acc->members, i));
    gsize bytes = qkv_tensor_nbytes(g);
    if (acc->adds == 0)
      memset(qkv_tensor_data(g), 0, bytes);
    else
      memcpy(qkv_tensor_data(g), at, bytes);
    at += qkv_tensor_numel(g);
  }
  guint adds = acc->adds;
  acc->adds = 0;
  return adds;
}

gboolean
qkv_split_range(gint64 n, gint parts, gint index, gint64 *offset, gint64 *count)
{
  g_return_val_if_fail(offset != NULL && count != NULL, FALSE);
  if (n < 0 || parts < 1 || index < 0 || index >= parts) {
    *offset = 0;
    *count = 0;
    return FALSE;
  }
  gint64 base = n / parts, extra = n % parts;
  *offset = index * base + MIN(index, extra);
  *count = base + (index < extra ? 1 : 0);
  return TRUE;
}

QkvGradAccumulator *
qkv_grad_accumulator_ref(QkvGradAccumulator *acc)
{
  g_return_val_if_fail(acc != NULL, NULL);
  g_atomic_int_inc(&acc->ref_count);
  return acc;
}
