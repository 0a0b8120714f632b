/* qkv-optim-accumulate.h: gradient accumulation over the parts of a batch
 * (part of qkv-optim.h): QkvGradAccumulator and qkv_split_range(). */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-params.h"

G_BEGIN_DECLS

/**
 * QkvGradAccumulator:
 *
 * Gradient accumulation (micro-batches).
 *
 * A plan run overwrites the gradient buffers. To take one optimizer step over
 * a batch run in parts, add each part's gradients to an accumulator after
 * its run, then store the sum back into the gradient buffers:
 *
 *   for (part = 0; part < parts; part++) {
 *     qkv_split_range(batch, parts, part, &offset, &rows);
 *     ... bind rows [offset, offset + rows), qkv_plan_run() ...
 *     qkv_grad_accumulator_add(acc);
 *   }
 *   qkv_grad_accumulator_store(acc);  then clip and qkv_optimizer_step()
 *
 * For a loss summed over examples (reduction "sum") the stored gradient is the
 * whole batch's. With the parts split as qkv_dist_shard() splits a batch over
 * ranks, the arithmetic is that of data-parallel training: two parts give bit
 * for bit the gradients that qkv_dist_allreduce_grads() (QKV_DIST_SUM) gives
 * two ranks, since a sum of two floats does not depend on their order.
 */
typedef struct _QkvGradAccumulator QkvGradAccumulator;

/**
 * qkv_grad_accumulator_new:
 * @params: a #QkvParams
 * @error: return location for a #GError, or %NULL
 *
 * An accumulator for the non-frozen params of the store as it is now; its
 * buffers are allocated here (QKV_ERROR_MEMORY naming the bytes if they
 * cannot be had), so adding and storing allocate nothing.
 *
 * Returns: (transfer full) (nullable): a new #QkvGradAccumulator, or %NULL with @error set
 */
QKV_API
QkvGradAccumulator *qkv_grad_accumulator_new(QkvParams *params, GError **error);
/**
 * qkv_grad_accumulator_free:
 * @acc: a #QkvGradAccumulator
 *
 * See qkv_grad_accumulator_new().
 */
QKV_API
void qkv_grad_accumulator_free(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_ref:
 * @acc: an accumulator
 *
 * Take a reference on @acc; qkv_grad_accumulator_free() drops one.
 *
 * Returns: (transfer full): @acc
 */
QKV_API
QkvGradAccumulator *qkv_grad_accumulator_ref(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_add:
 * @acc: a #QkvGradAccumulator
 *
 * Add the current gradient buffers to the sum (the first add after creation
 * or a store copies them).
 */
QKV_API
void qkv_grad_accumulator_add(QkvGradAccumulator *acc);
/**
 * qkv_grad_accumulator_store:
 * @acc: a #QkvGradAccumulator
 *
 * Write the sum into the gradient buffers (zeros if nothing was added) and
 * start a new sum. Returns the number of adds the sum held.
 * After a qkv_params_rollback() that removed a parameter of the store as it
 * was at creation, the accumulator is dead: add does nothing and store
 * writes nothing and returns G_MAXUINT; free it and make a new one.
 *
 * Returns: the guint
 */
QKV_API
guint qkv_grad_accumulator_store(QkvGradAccumulator *acc);

/**
 * qkv_split_range:
 * @n: the n
 * @parts: the parts
 * @index: the index
 * @offset: (out) (optional): where to store the offset, or %NULL
 * @count: (out) (optional): where to store the count, or %NULL
 *
 * Part index of n items split into parts as evenly as possible, the first
 * n % parts parts one larger: its first item in *offset and its size in
 * *count (0 when parts > n leaves it empty). qkv_dist_shard() splits a batch
 * over ranks this way. Returns FALSE, with *offset and *count 0, when n is
 * negative, parts below 1 or index outside [0, parts).
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_split_range(gint64 n, gint parts, gint index, gint64 *offset, gint64 *count);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvGradAccumulator, qkv_grad_accumulator_free)

G_END_DECLS
