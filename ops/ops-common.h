/* ops-common.h: what the built-in op families share (not installed).
 *
 * Ops see only the op ABI (qkv-plugin.h), the public graph API for their
 * typed builders and gradient rules, and the small helpers below; op-def.h
 * says how a family writes its table of op definitions.
 */
#pragma once

#include <stdatomic.h>
#include <string.h>
#include "qkv/qkv.h"
#include "builtins.h"
#include "op-def.h"

/* The op table of each family (builtins.h lists them). */
#define QKV_DECLARE_OP_TABLE(family) G_GNUC_INTERNAL extern const QkvOpDef qkv_ops_##family[];
QKV_BUILTIN_FAMILIES(QKV_DECLARE_OP_TABLE)
#undef QKV_DECLARE_OP_TABLE

/* Add a node with inputs[0]'s graph and return its output 0. */
static inline QkvValue *
qkv_op_call(const gchar *op_name, QkvValue *const *inputs, guint n_inputs, GVariant *attrs,
            GError **error)
{
  g_return_val_if_fail(n_inputs > 0, NULL);
  if (!qkv_values_present(op_name, inputs, n_inputs, error))
    return NULL;
  return qkv_graph_op(qkv_value_graph(inputs[0]), op_name, inputs, n_inputs, attrs, error);
}

/* Row-major strides (in elements) of shape. */
static inline void
qkv_shape_strides(const QkvShape *shape, gint64 *strides)
{
  gint64 s = 1;
  for (gint i = shape->rank - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape->dims[i];
  }
}

/* Normalise a possibly negative axis; -1 if out of range. */
static inline gint
qkv_normalize_axis(gint axis, gint rank)
{
  if (axis < 0)
    axis += rank;
  return (axis >= 0 && axis < rank) ? axis : -1;
}

/* A GVariant holding an int64 array (floating). */
static inline GVariant *
qkv_variant_ints(const gint64 *values, gsize n)
{
  return g_variant_new_fixed_array(G_VARIANT_TYPE_INT64, values, n, sizeof(gint64));
}

/* Size of the last axis and the number of rows before it. */
static inline void
qkv_view_rows(const QkvView *v, gint64 *rows, gint64 *cols)
{
  gint64 n = qkv_shape_numel(&v->shape);
  *cols = v->shape.rank > 0 ? v->shape.dims[v->shape.rank - 1] : 1;
  *rows = *cols > 0 ? n / *cols : 0;
}

/* ---- skipping rows with zero gradient -------------------------------------
 *
 * A padded batch under a masked loss gives gradients whose rows at padded
 * positions are exactly zero, and they stay zero down through every row-wise
 * layer and through attention whose masks keep those positions out. A
 * backward kernel can then run its GEMMs over the nonzero rows only: gather
 * them (qkv_nonzero_rows(), qkv_gather_rows() or qkv_compact_rows()),
 * multiply, and spread the row-wise result back with zeros elsewhere
 * (qkv_expand_rows()). Skipped
 * terms are exact zeros, so the result is the dense one up to the order of
 * float sums. qkv_set_sparse_backward() chooses when (qkv-plugin.h). */

/* The first 64-byte boundary at or after p, as a float pointer (scratch
 * layouts: reserve 64 bytes per aligned buffer). */
static inline float *
qkv_align_floats(gpointer p)
{
  return (float *)(((guintptr)p + 63) & ~(guintptr)63);
}

/* Indices of the rows of x (rows × cols, row stride ld) that hold anything
 * but zeros (NaN counts as nonzero); returns how many. A nonzero row usually
 * costs one load: the scan stops at its first nonzero element. */
static inline gint64
qkv_nonzero_rows(const float *x, gint64 rows, gint64 cols, gint64 ld, gint64 *index)
{
  gint64 m = 0;
  for (gint64 r = 0; r < rows; r++) {
    const float *row = x + r * ld;
    gint64 j = 0;
    while (j < cols && row[j] == 0.0f)
      j++;
    if (j < cols)
      index[m++] = r;
  }
  return m;
}

/* Whether running a product of n rows (per_row multiply-adds each) over m
 * of them pays for gathering them. AUTO: at least one row in sixteen zero,
 * and a product big enough that the copies are small beside it (on config
 * S's 640×64×32 FFN, gathering made the backward 1.5× slower). */
static inline gboolean
qkv_compact_pays(gint64 m, gint64 n, gint64 per_row)
{
  switch (qkv_get_sparse_backward()) {
  case QKV_SPARSE_BACKWARD_ALWAYS:
    return m < n;
  case QKV_SPARSE_BACKWARD_AUTO:
    return n >= 16 && m <= n - n / 16 && n * per_row >= (G_GINT64_CONSTANT(1) << 22);
  default:
    return FALSE;
  }
}

typedef struct {
  guint8 *dst;
  const guint8 *src;
  const gint64 *index;
  gsize ld, row; /* in bytes */
} QkvGatherJob;

static inline void
qkv_gather_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvGatherJob *j = user_data;
  for (gint64 i = begin; i < end; i++)
    memcpy(j->dst + (gsize)i * j->row, j->src + (gsize)j->index[i] * j->ld, j->row);
}

/* dst (m × cols, contiguous) = rows index[0..m) of src (row stride ld), of
 * elements of elem bytes. */
static inline void
qkv_gather_elems(const QkvKernelCtx *ctx, gpointer dst, gconstpointer src, gint64 ld,
                 const gint64 *index, gint64 m, gint64 cols, gsize elem)
{
  QkvGatherJob job = {dst, src, index, (gsize)ld * elem, (gsize)cols * elem};
  qkv_parallel_for(qkv_kernel_threads(ctx, m * cols), m, qkv_gather_range, &job);
}

/* The same for floats. */
static inline void
qkv_gather_rows(const QkvKernelCtx *ctx, float *dst, const float *src, gint64 ld,
                const gint64 *index, gint64 m, gint64 cols)
{
  qkv_gather_elems(ctx, dst, src, ld, index, m, cols, sizeof(float));
}

typedef struct {
  guint16 *dst;
  const float *src;
} QkvRoundJob;

static inline void
qkv_round_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvRoundJob *j = user_data;
  qkv_bf16_from_floats(j->dst + begin, j->src + begin, (gsize)(end - begin));
}

/* dst = the n floats of src rounded to bf16, on the pool: an output the
 * plan stores as bf16 (QKV_BF16 views). */
static inline void
qkv_round_to_bf16(const QkvKernelCtx *ctx, guint16 *dst, const float *src, gint64 n)
{
  QkvRoundJob job = {dst, src};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, qkv_round_range, &job);
}

/* Rows index[0..m) of x (rows × cols, contiguous; index increasing) moved to
 * rows 0..m, in order. */
static inline void
qkv_compact_rows(float *x, const gint64 *index, gint64 m, gint64 cols)
{
  for (gint64 i = 0; i < m; i++)
    if (index[i] != i)
      memcpy(x + i * cols, x + index[i] * cols, (gsize)cols * sizeof(float));
}

/* The inverse: rows 0..m of x moved to rows index[0..m), every other row of
 * the rows × cols matrix zeroed. Since index[i] ≥ i, moving from the last
 * row down never overwrites a row still to move. */
static inline void
qkv_expand_rows(float *x, const gint64 *index, gint64 m, gint64 rows, gint64 cols)
{
  gint64 zero_end = rows;
  for (gint64 i = m - 1; i >= -1; i--) {
    gint64 dst = i >= 0 ? index[i] : -1;
    if (zero_end > dst + 1)
      memset(x + (dst + 1) * cols, 0, (gsize)((zero_end - dst - 1) * cols) * sizeof(float));
    if (i >= 0 && dst != i)
      memcpy(x + dst * cols, x + i * cols, (gsize)cols * sizeof(float));
    zero_end = dst;
  }
}

/* ---- indices checked at run time ------------------------------------------
 *
 * An index op (embedding, gather, index_select) checks each index where it
 * uses it, inside its parallel loop, and never reads or writes out of
 * bounds: a bad index picks zeros. Unless the node asks for exactly that
 * (zero_out_of_range, the padding behaviour), the thread also notes the
 * position, and after the loop the kernel fails the run on the lowest one
 * noted, so that the message does not depend on the thread count. A good
 * index costs the compare the kernels always made. */

#define QKV_ZERO_OUT_OF_RANGE_ATTR                                                                 \
  QKV_BOOL_ATTR("zero_out_of_range", FALSE,                                                        \
                "an index out of range picks zeros and takes no gradient, instead of failing "     \
                "the run")

typedef struct {
  _Atomic gint64 first; /* the lowest position noted; G_MAXINT64 while none */
} QkvBadIndex;

static inline void
qkv_bad_index_init(QkvBadIndex *bad)
{
  atomic_init(&bad->first, G_MAXINT64);
}

/* From any thread: the index at position is out of range. */
static inline void
qkv_bad_index_note(QkvBadIndex *bad, gint64 position)
{
  gint64 seen = atomic_load_explicit(&bad->first, memory_order_relaxed);
  while (position < seen &&
         !atomic_compare_exchange_weak_explicit(&bad->first, &seen, position, memory_order_relaxed,
                                                memory_order_relaxed))
    ;
}

/* After the loop: fail the run on the first bad index noted, if any, with
 * "WHAT VALUE at position [i, j, …] is outside [0, n)", and " (the size of
 * axis A)" for an axis ≥ 0. */
static inline void
qkv_bad_index_report(const QkvKernelCtx *ctx, QkvBadIndex *bad, const gchar *what,
                     const gint32 *index, const QkvShape *index_shape, gint64 n, gint axis)
{
  gint64 position = atomic_load(&bad->first);
  if (G_LIKELY(position == G_MAXINT64))
    return;
  gint64 strides[QKV_MAX_RANK];
  qkv_shape_strides(index_shape, strides);
  GString *at = g_string_new("[");
  gint64 rest = position;
  for (gint d = 0; d < index_shape->rank; d++) {
    g_string_append_printf(at, "%s%" G_GINT64_FORMAT, d > 0 ? ", " : "", rest / strides[d]);
    rest %= strides[d];
  }
  g_string_append_c(at, ']');
  if (axis >= 0)
    g_string_append_printf(at, " is outside [0, %" G_GINT64_FORMAT ") (the size of axis %d)", n,
                           axis);
  else
    g_string_append_printf(at, " is outside [0, %" G_GINT64_FORMAT ")", n);
  qkv_kernel_fail(ctx, QKV_ERROR_INDEX, "%s %" G_GINT32_FORMAT " at position %s", what,
                  index[position], at->str);
  g_string_free(at, TRUE);
}
