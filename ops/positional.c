/* positional.c: "positional_encoding", the book's PositionalEncoding.
 *
 * y = dropout(x + P[offset : offset + T]) with
 *   P[pos, 2i] = sin(pos / 10000^(2i/d)), P[pos, 2i+1] = cos(pos / 10000^(2i/d)).
 * An optional second input, positions (i32, one per batch element), moves
 * each batch element's rows to start at offset + positions[b]: a decode-step
 * graph compiled once feeds the step number there, so every emitted token
 * gets its true position without a plan per step.
 * There is no table of a fixed maximum length: each run computes the T rows it
 * needs into scratch memory. The angle is computed in float exactly as the
 * book builds its table (arange(0, d, 2) / d, 10000 to that power, the
 * position divided by it, all float32), so positions far from 0 round like
 * PyTorch's; the sine and cosine of that float angle are then taken in double
 * and rounded once. An odd d ends with a sine column.
 *
 * With dropout > 0 the op has a second output, the dropout mask (0 or
 * 1/(1-p), all ones in evaluation), which the backward multiplies by through
 * "dropout_backward"; without dropout the gradient is dy itself.
 */
#include "attention-common.h"

#include <math.h>
#include "error-private.h"

/* The optional positions input sits in a fixed slot after x. */
#define PE_POSITIONS 1

static gboolean
pe_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0];
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (x->rank != 2 && x->rank != 3)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must be (T, d) or (B, T, d), got rank %d", x->rank);
  if (!qkv_attn_check_dropout(ctx, "dropout", error))
    return FALSE;
  gint64 offset = qkv_attrs_get_int(ctx->attrs, "offset");
  if (offset < 0 || offset > G_MAXINT32)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "offset must be in [0, 2^31), got %" G_GINT64_FORMAT, offset);
  if (ctx->n_inputs > PE_POSITIONS) {
    const QkvShape *ps = &ctx->in_shapes[PE_POSITIONS];
    gint64 batch = x->rank == 3 ? x->dims[0] : 1;
    if (ctx->in_dtypes[PE_POSITIONS] != QKV_I32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "positions must be i32, got %s",
                             qkv_dtype_name(ctx->in_dtypes[PE_POSITIONS]));
    if (ps->rank != 1 || ps->dims[0] != batch) {
      g_autofree gchar *have = qkv_shape_to_string(ps);
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "positions must be (%" G_GINT64_FORMAT ") (one per batch element), "
                             "got %s",
                             batch, have);
    }
  }
  ctx->out_shapes[0] = *x;
  if (qkv_attrs_get_float(ctx->attrs, "dropout") > 0.0) {
    ctx->n_outputs = 2;
    ctx->out_shapes[1] = *x;
  }
  return TRUE;
}

/* The table rows (T × d, or B·T × d when each batch element has its own
 * start) and the d column divisors. */
static gsize
pe_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  const QkvShape *x = &ctx->in_shapes[0];
  gint64 t = x->dims[x->rank - 2], d = x->dims[x->rank - 1];
  gint64 rows = ctx->n_inputs > PE_POSITIONS && x->rank == 3 ? x->dims[0] * t : t;
  return (gsize)(rows * d + d) * sizeof(float);
}

/* 10000^(2i/d) for column j = 2i or 2i + 1, in float as the book's table. */
static void
pe_divisors(float *div, gint64 d)
{
  for (gint64 j = 0; j < d; j++)
    div[j] = powf(10000.0f, (float)(j - (j & 1)) / (float)d);
}

/* One row of P for position pos: columns 2i and 2i + 1 share their angle,
 * so one sincos serves both. */
static void
pe_row(float *p, const float *div, gint64 pos, gint64 d)
{
  for (gint64 j = 0; j < d; j += 2) {
    double s, c;
    sincos((double)((float)pos / div[j]), &s, &c);
    p[j] = (float)s;
    if (j + 1 < d)
      p[j + 1] = (float)c;
  }
}

typedef struct {
  const QkvKernelCtx *ctx;
  const float *x, *div;
  const gint32 *positions; /* NULL: every batch element starts at offset */
  float *table, *y, *mask;
  double p;
  gint64 t, d, offset;
  gint64 table_rows; /* t, or batch · t with positions */
} PeJob;

/* Table row r is position offset + r, or with positions the row (b, r % t)
 * at offset + positions[b] + r % t. */
static void
pe_table_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const PeJob *j = user_data;
  for (gint64 r = begin; r < end; r++) {
    gint64 pos = j->offset + r % j->t;
    if (j->positions != NULL)
      pos += j->positions[r / j->t];
    pe_row(j->table + r * j->d, j->div, pos, j->d);
  }
}

/* Rows (b, pos) in order: y may be x (in place), each row read before it is
 * written. */
static void
pe_add_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const PeJob *a = user_data;
  const gint64 d = a->d;
  for (gint64 r = begin; r < end; r++) {
    const float *xr = a->x + r * d, *pr = a->table + (r % a->table_rows) * d;
    float *yr = a->y + r * d;
#pragma omp simd
    for (gint64 j = 0; j < d; j++)
      yr[j] = xr[j] + pr[j];
    if (a->mask != NULL) {
      float *mr = a->mask + r * d;
      qkv_dropout_fill_mask(a->ctx, a->p, mr, r * d, d);
#pragma omp simd
      for (gint64 j = 0; j < d; j++)
        yr[j] *= mr[j];
    }
  }
}

static void
pe_forward(const QkvKernelCtx *ctx)
{
  const QkvShape *xs = &ctx->in[0].shape;
  const gint64 t = xs->dims[xs->rank - 2], d = xs->dims[xs->rank - 1];
  const gint64 batch = xs->rank == 3 ? xs->dims[0] : 1;
  const gint64 offset = qkv_attrs_get_int(ctx->attrs, "offset");
  const double p = qkv_attrs_get_float(ctx->attrs, "dropout");
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  float *mask = ctx->n_outputs > 1 ? ctx->out[1].data : NULL;
  const gint32 *positions = ctx->n_inputs > PE_POSITIONS ? ctx->in[PE_POSITIONS].data : NULL;
  const gint64 table_rows = positions != NULL ? batch * t : t;
  float *table = ctx->scratch, *div = table + table_rows * d;

  pe_divisors(div, d);
  PeJob job = {ctx, x, div, positions, table, y, mask, p, t, d, offset, table_rows};
  /* a sincos is about twenty units of work per pair, ten per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, 10 * table_rows * d), table_rows, pe_table_rows, &job);
  /* the dropout draw's hash is about ten units per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, (mask != NULL ? 12 : 2) * batch * t * d), batch * t,
                   pe_add_rows, &job);
}

static gboolean
pe_grad(QkvGradCtx *g, GError **error)
{
  if (g->n_outputs > 1 && g->out_grads[1] != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "positional_encoding: the saved dropout mask (output 1) takes no gradient");
    return FALSE;
  }
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  if (g->n_outputs < 2) {
    g->in_grads[0] = g->out_grads[0];
    return TRUE;
  }
  QkvValue *inputs[] = {g->out_grads[0], g->outputs[1]};
  g->in_grads[0] = qkv_op_call("dropout_backward", inputs, 2, NULL, error);
  return g->in_grads[0] != NULL;
}

const QkvOpDef qkv_ops_positional[] = {
    QKV_OP(.name = "positional_encoding",
           .doc = "dropout(x + P[offset : offset + T]) with the book's sine/cosine table P, "
                  "computed for any T and d; the optional input positions (i32 (B)) adds a start "
                  "per batch element; output 1 (only when dropout > 0) is the dropout mask",
           QKV_INPUTS_OPT(PE_POSITIONS, "x", "positions"), QKV_OUTPUTS("y", "mask"),
           QKV_ATTRS(
               QKV_FLOAT_ATTR("dropout", 0.0, "dropout probability after the addition, in [0, 1)"),
               QKV_INT_ATTR("offset", 0,
                            "position of the first row (for decoding one step at a time)")),
           .flags = QKV_OP_INPLACE | QKV_OP_RANDOM, .shape = pe_shape, .forward = pe_forward,
           .gradient = pe_grad, .scratch_size = pe_scratch),
    QKV_OPS_END,
};

QkvValue *
qkv_positional_encoding(QkvValue *x, double dropout, gint64 offset, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("positional_encoding", error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  g_variant_builder_add(&attrs, "{sv}", "offset", g_variant_new_int64(offset));
  return qkv_op_call("positional_encoding", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_positional_encoding_at(QkvValue *x, QkvValue *positions, double dropout, gint64 offset,
                           GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("positional_encoding", error, x, positions);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "dropout", g_variant_new_double(dropout));
  g_variant_builder_add(&attrs, "{sv}", "offset", g_variant_new_int64(offset));
  QkvValue *inputs[] = {x, positions};
  return qkv_op_call("positional_encoding", inputs, 2, g_variant_builder_end(&attrs), error);
}
