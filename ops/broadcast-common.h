/* broadcast-common.h: walking an output that up to three inputs broadcast
 * to (NumPy rules), for the comparison and selection ops (not installed).
 *
 * elementwise.c keeps its own specialised kernels for the arithmetic ops
 * and takes only the shape rule and gradient helpers at the end; the ops
 * here are rarer and take one general walker: adjacent axes that every
 * input steps through alike are merged first, so equal shapes and scalars
 * come down to one long row, and a bias-like operand to rows of the last
 * axis. Kernels get a row at a time with each input's offset and step (0 or
 * its stride), and write a plain loop over it.
 */
#pragma once

#include "ops-common.h"

#define QKV_BCAST_MAX_INPUTS 3

typedef struct {
  gint n_inputs;
  gint rank;
  gint64 numel;
  gint64 dims[QKV_MAX_RANK];
  /* Element strides of each input in the output's axes, 0 where broadcast. */
  gint64 strides[QKV_BCAST_MAX_INPUTS][QKV_MAX_RANK];
} QkvBcast;

/* Called for each run of len output elements starting at out_off; input i
 * is at in_off[i] and moves by in_step[i] per element. */
typedef void (*QkvBcastRowFunc)(gpointer data, gint64 out_off, const gint64 *in_off,
                                const gint64 *in_step, gint64 len);

/* Fill b for inputs of the given shapes broadcast to out (which the shape
 * rule has checked they do). */
static inline void
qkv_bcast_init(QkvBcast *b, const QkvShape *out, const QkvShape *const *ins, gint n_inputs)
{
  gint64 strides[QKV_BCAST_MAX_INPUTS][QKV_MAX_RANK];
  for (gint i = 0; i < n_inputs; i++) {
    gint64 own[QKV_MAX_RANK];
    qkv_shape_strides(ins[i], own);
    gint lead = out->rank - ins[i]->rank;
    for (gint d = 0; d < out->rank; d++) {
      gint xd = d - lead;
      strides[i][d] = (xd < 0 || ins[i]->dims[xd] == 1) ? 0 : own[xd];
    }
  }
  b->n_inputs = n_inputs;
  b->numel = qkv_shape_numel(out);
  b->rank = 0;
  /* Merge axis d into the axis kept before it when every input steps over
   * the pair as over one axis; drop axes of size 1 (nothing steps there). */
  for (gint d = 0; d < out->rank; d++) {
    if (out->dims[d] == 1)
      continue;
    gboolean merge = b->rank > 0;
    for (gint i = 0; merge && i < n_inputs; i++)
      merge = b->strides[i][b->rank - 1] == strides[i][d] * out->dims[d];
    if (merge) {
      b->dims[b->rank - 1] *= out->dims[d];
      for (gint i = 0; i < n_inputs; i++)
        b->strides[i][b->rank - 1] = strides[i][d];
    } else {
      b->dims[b->rank] = out->dims[d];
      for (gint i = 0; i < n_inputs; i++)
        b->strides[i][b->rank] = strides[i][d];
      b->rank++;
    }
  }
  if (b->rank == 0) {
    /* A single element. */
    b->rank = 1;
    b->dims[0] = 1;
    for (gint i = 0; i < n_inputs; i++)
      b->strides[i][0] = 0;
  }
}

/* Walk output elements [begin, end) row by row (rows of the last merged
 * axis), calling row for each piece. */
static inline void
qkv_bcast_walk(const QkvBcast *b, gint64 begin, gint64 end, QkvBcastRowFunc row, gpointer data)
{
  if (begin >= end)
    return;
  const gint last = b->rank - 1, n = b->n_inputs;
  const gint64 inner = b->dims[last];
  gint64 coord[QKV_MAX_RANK], off[QKV_BCAST_MAX_INPUTS] = {0}, step[QKV_BCAST_MAX_INPUTS];
  gint64 rest = begin;
  for (gint d = last; d >= 0; d--) {
    coord[d] = rest % b->dims[d];
    rest /= b->dims[d];
    for (gint i = 0; i < n; i++)
      off[i] += coord[d] * b->strides[i][d];
  }
  for (gint i = 0; i < n; i++)
    step[i] = b->strides[i][last];
  for (gint64 o = begin; o < end;) {
    gint64 k0 = coord[last], len = MIN(inner - k0, end - o);
    row(data, o, off, step, len);
    o += len;
    /* Back to the start of the row, then carry into the outer axes. */
    for (gint i = 0; i < n; i++)
      off[i] -= k0 * step[i];
    coord[last] = 0;
    for (gint d = last - 1; d >= 0; d--) {
      coord[d]++;
      for (gint i = 0; i < n; i++)
        off[i] += b->strides[i][d];
      if (coord[d] < b->dims[d])
        break;
      for (gint i = 0; i < n; i++)
        off[i] -= b->dims[d] * b->strides[i][d];
      coord[d] = 0;
    }
  }
}

typedef struct {
  const QkvBcast *b;
  QkvBcastRowFunc row;
  gpointer data;
} QkvBcastJob;

static inline void
qkv_bcast_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvBcastJob *j = user_data;
  qkv_bcast_walk(j->b, begin, end, j->row, j->data);
}

/* qkv_bcast_walk over the whole output, split over qkv's pool when it is
 * large enough to pay for waking threads. */
static inline void
qkv_bcast_run(const QkvKernelCtx *ctx, const QkvBcast *b, QkvBcastRowFunc row, gpointer data)
{
  if (b->numel == 0)
    return;
  QkvBcastJob job = {b, row, data};
  qkv_parallel_for(qkv_kernel_threads(ctx, b->numel), b->numel, qkv_bcast_range, &job);
}

/* Shape rule helper: the broadcast of the first n inputs' shapes into out,
 * or an error naming the first two inputs whose dims clash. */
static inline gboolean
qkv_bcast_shapes(QkvShapeCtx *ctx, guint n, QkvShape *out, GError **error)
{
  *out = ctx->in_shapes[0];
  for (guint i = 1; i < n; i++) {
    QkvShape next;
    if (!qkv_shape_broadcast(out, &ctx->in_shapes[i], &next)) {
      /* Find which earlier input clashes with input i, and on which axis. */
      const QkvShape *b = &ctx->in_shapes[i];
      for (guint j = 0; j < i; j++) {
        const QkvShape *a = &ctx->in_shapes[j];
        for (gint axis = 1; axis <= MIN(a->rank, b->rank); axis++) {
          gint64 da = a->dims[a->rank - axis], db = b->dims[b->rank - axis];
          if (da != db && da != 1 && db != 1)
            return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                                   "%s and %s do not broadcast (axis -%d: %" G_GINT64_FORMAT
                                   " vs %" G_GINT64_FORMAT ")",
                                   qkv_input_name(ctx, j), qkv_input_name(ctx, i), axis, da, db);
        }
      }
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "the inputs do not broadcast");
    }
    *out = next;
  }
  return TRUE;
}

/* grad (of a broadcast output) summed down to input's shape. */
static inline QkvValue *
qkv_grad_to_input(QkvValue *grad, QkvValue *input, GError **error)
{
  if (grad == NULL)
    return NULL;
  if (qkv_shape_equal(qkv_value_shape(grad), qkv_value_shape(input)))
    return grad;
  return qkv_sum_to(grad, qkv_value_shape(input), error);
}
