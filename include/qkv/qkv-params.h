/* qkv-params.h: the parameter store.
 *
 * A QkvParams holds named f32 tensors (dotted names such as
 * "encoder.blks.block0.attention.W_q.weight"), each with a gradient buffer of
 * the same shape and named optimizer-state tensors. It outlives graphs; any
 * number of graphs (training, evaluation, decoding) may read the same store.
 *
 * Threads: plans and decoders in different threads may read one store at
 * the same time. A plan run that writes parameter gradients holds the
 * store's gradient buffers for the run; another such run over the same
 * store in another thread is refused with QKV_ERROR_BUSY (qkv-plan.h).
 * Everything that changes the store (adding, rolling back, zero_grad,
 * optimizer steps, accumulators, loading a checkpoint) takes no guard:
 * do it while no plan over the store runs.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-tensor.h"

G_BEGIN_DECLS

/**
 * QkvParams:
 *
 * An opaque params.
 */
typedef struct _QkvParams QkvParams;
/**
 * QkvParam:
 *
 * An opaque param.
 */
typedef struct _QkvParam QkvParam;

/**
 * qkv_params_new:
 *
 * Params new.
 *
 * Returns: (transfer full): a new #QkvParams
 */
QKV_API
QkvParams *qkv_params_new(void);
/**
 * qkv_params_free:
 * @params: a #QkvParams
 *
 * See qkv_params_new().
 */
QKV_API
void qkv_params_free(QkvParams *params);
/**
 * qkv_params_ref:
 * @params: a parameter store
 *
 * Take a reference on @params; qkv_params_free() drops one.
 *
 * Returns: (transfer full): @params
 */
QKV_API
QkvParams *qkv_params_ref(QkvParams *params);

/**
 * qkv_params_add:
 * @params: a #QkvParams
 * @name: the name
 * @shape: a #QkvShape
 * @error: return location for a #GError, or %NULL
 *
 * Add a zero-initialised f32 parameter; QKV_ERROR_EXISTS if the name is taken,
 * QKV_ERROR_SHAPE for an invalid shape, QKV_ERROR_MEMORY (naming the param and
 * the bytes) if its value and gradient cannot be allocated.
 *
 * Returns: (transfer none) (nullable): a #QkvParam, or %NULL with @error set
 */
QKV_API
QkvParam *qkv_params_add(QkvParams *params, const gchar *name, const QkvShape *shape,
                         GError **error);
/**
 * qkv_params_lookup:
 * @params: a #QkvParams
 * @name: (nullable): the name
 *
 * The parameter of that name, or NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvParam
 */
QKV_API
QkvParam *qkv_params_lookup(QkvParams *params, const gchar *name);
/**
 * qkv_params_size:
 * @params: a #QkvParams
 *
 * Number of parameters (tensors), and the i-th in insertion order.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_params_size(QkvParams *params);
/**
 * qkv_params_nth:
 * @params: a #QkvParams
 * @index: the index
 *
 * See qkv_params_size(). NULL, without a message, for an index past the end.
 *
 * Returns: (transfer none) (nullable): a #QkvParam
 */
QKV_API
QkvParam *qkv_params_nth(QkvParams *params, guint index);
/**
 * qkv_params_numel:
 * @params: a #QkvParams
 *
 * Total number of scalar elements over all parameters.
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_params_numel(QkvParams *params);
/**
 * qkv_params_numel_trainable:
 * @params: a #QkvParams
 *
 * Scalar elements over the parameters that are not frozen.
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_params_numel_trainable(QkvParams *params);
/**
 * qkv_params_zero_grad:
 * @params: a #QkvParams
 *
 * Set every gradient buffer to zero.
 */
QKV_API
void qkv_params_zero_grad(QkvParams *params);

/**
 * qkv_param_name:
 * @param: a #QkvParam
 *
 * See qkv_params_zero_grad().
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_param_name(const QkvParam *param);
/**
 * qkv_param_value:
 * @param: a #QkvParam
 *
 * See qkv_params_zero_grad().
 *
 * Returns: (transfer none): a #QkvTensor
 */
QKV_API
QkvTensor *qkv_param_value(QkvParam *param);
/**
 * qkv_param_grad:
 * @param: a #QkvParam
 *
 * See qkv_params_zero_grad().
 *
 * Returns: (transfer none): a #QkvTensor
 */
QKV_API
QkvTensor *qkv_param_grad(QkvParam *param);
/**
 * qkv_param_shape:
 * @param: a #QkvParam
 *
 * See qkv_params_zero_grad().
 *
 * Returns: (transfer none): a #QkvShape
 */
QKV_API
const QkvShape *qkv_param_shape(const QkvParam *param);
/**
 * qkv_param_set_frozen:
 * @param: a #QkvParam
 * @frozen: the frozen
 *
 * A frozen parameter gets no gradient from qkv_graph_backward() and is
 * skipped by optimizers.
 */
QKV_API
void qkv_param_set_frozen(QkvParam *param, gboolean frozen);
/**
 * qkv_param_get_frozen:
 * @param: a #QkvParam
 *
 * See qkv_param_set_frozen().
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_param_get_frozen(const QkvParam *param);
/**
 * qkv_param_state:
 * @param: a #QkvParam
 * @name: the name
 *
 * Named optimizer state ("exp_avg", "momentum_buffer", ...): created zeroed
 * with the parameter's shape on first use.
 *
 * Returns: (transfer none): a #QkvTensor
 */
QKV_API
QkvTensor *qkv_param_state(QkvParam *param, const gchar *name);
/**
 * qkv_param_state_full:
 * @param: a #QkvParam
 * @name: the name
 * @dtype: the dtype
 * @shape: a #QkvShape
 *
 * Named state of a given dtype and shape (e.g. a scalar step count), created
 * zeroed on first use; NULL (with a critical warning) if a state of that name
 * exists with another dtype or shape.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor
 */
QKV_API
QkvTensor *qkv_param_state_full(QkvParam *param, const gchar *name, QkvDType dtype,
                                const QkvShape *shape);
/**
 * qkv_param_remove_state:
 * @param: a #QkvParam
 * @name: the name
 *
 * Drop the named state tensor; FALSE if there was none.
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_param_remove_state(QkvParam *param, const gchar *name);
/**
 * qkv_param_lookup_state:
 * @param: a #QkvParam
 * @name: the name
 *
 * The state tensor if it exists, else NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor
 */
QKV_API
QkvTensor *qkv_param_lookup_state(QkvParam *param, const gchar *name);
/**
 * qkv_param_n_states:
 * @param: (nullable): a #QkvParam
 *
 * The state tensors in creation order: count, and the i-th name (owned by
 * param) with its tensor stored in *tensor if not NULL.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_param_n_states(QkvParam *param);
/**
 * qkv_param_nth_state:
 * @param: a #QkvParam
 * @index: the index
 * @tensor: (out) (optional) (transfer none): a #QkvTensor
 *
 * See qkv_param_n_states(). NULL (and NULL in *tensor), without a message,
 * for an index past the end.
 *
 * Returns: (transfer none) (nullable): the string
 */
QKV_API
const gchar *qkv_param_nth_state(QkvParam *param, guint index, QkvTensor **tensor);

/**
 * QkvParamsMark:
 *
 * A point to roll a store back to (see QkvGraphMark): what
 * qkv_params_mark() saw. Plain data; nothing to free. generation took one
 * of the reserved pointers (same size on 64-bit systems).
 */
typedef struct {
  guint n_params;
  guint64 generation;
  gpointer reserved[1];
} QkvParamsMark;

/**
 * qkv_params_mark:
 * @params: a #QkvParams
 * @mark: a #QkvParamsMark
 *
 * Record in *mark which parameters the store holds now.
 */
QKV_API
void qkv_params_mark(QkvParams *params, QkvParamsMark *mark);
/**
 * qkv_params_rollback:
 * @params: a #QkvParams
 * @mark: a #QkvParamsMark
 *
 * Remove (and free) the parameters added since mark was taken; those there
 * before keep their values. Nothing may use a removed parameter any more: roll
 * back the graphs that took it (qkv_graph_rollback()) first, and do not use
 * a plan made since the mark (a gradient accumulator made since notices and
 * does nothing, see qkv-optim.h). Marks nest as graph marks do; a stale mark
 * (one taken before a rollback removed a parameter it counted) is refused by
 * qkv_params_rollback_checked() with QKV_ERROR_INVALID_ARGUMENT and ignored
 * silently by qkv_params_rollback(); the store is unchanged then.
 */
QKV_API
void qkv_params_rollback(QkvParams *params, const QkvParamsMark *mark);
/**
 * qkv_params_rollback_checked:
 * @params: a #QkvParams
 * @mark: a #QkvParamsMark
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_params_rollback().
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_params_rollback_checked(QkvParams *params, const QkvParamsMark *mark, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvParams, qkv_params_free)

G_END_DECLS
