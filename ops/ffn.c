/* ffn.c: "position_wise_ffn", the book's PositionWiseFFN (dense, ReLU, dense)
 * as one op, and its fused backward op.
 *
 * Every position is a row: x (…, D) folds to an (N, D) matrix, so each dense
 * layer is one cblas_sgemm over all positions at once (x · w1ᵀ with w1 in
 * nn.Linear's (out, in) layout). The biases are written into the output rows
 * first and the product is accumulated onto them (beta = 1). The forward op
 * returns the ReLU activation too; the backward reads it for both the ReLU
 * mask and dw2. A bf16 plan with bf16_activations keeps that activation as
 * bfloat16: it feeds only products, which round it to bf16 anyway, and the
 * mask (its sign, which rounding keeps; a float32 subnormal rounds to zero
 * and so counts as not passed). Apart from that, the numbers stay those of
 * float32 storage.
 */
#include "ops-common.h"

#include <cblas.h>
#include "error-private.h"

/* The sizes of one FFN: N rows of D inputs, F hidden units, O outputs. */
typedef struct {
  gint64 n, d, f, o;
} FfnDims;

static gboolean
ffn_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *x = &ctx->in_shapes[0], *w1 = &ctx->in_shapes[1], *b1 = &ctx->in_shapes[2],
                 *w2 = &ctx->in_shapes[3], *b2 = &ctx->in_shapes[4];
  for (guint i = 0; i < 5; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x, w1, b1, w2 and b2 must be f32");
  if (x->rank < 1 || x->dims[x->rank - 1] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must have rank 1 or more and a non-empty last axis");
  gint64 d = x->dims[x->rank - 1];
  if (w1->rank != 2 || w1->dims[1] != d || w1->dims[0] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "w1 must be (F, %" G_GINT64_FORMAT ") to take x's last axis", d);
  gint64 f = w1->dims[0];
  if (b1->rank != 1 || b1->dims[0] != f)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "b1 must be (%" G_GINT64_FORMAT ")", f);
  if (w2->rank != 2 || w2->dims[1] != f || w2->dims[0] < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "w2 must be (O, %" G_GINT64_FORMAT ") to take the hidden layer", f);
  gint64 o = w2->dims[0];
  if (b2->rank != 1 || b2->dims[0] != o)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "b2 must be (%" G_GINT64_FORMAT ")", o);
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = *x;
  ctx->out_shapes[0].dims[x->rank - 1] = o;
  ctx->out_shapes[1] = *x;
  ctx->out_shapes[1].dims[x->rank - 1] = f;
  return TRUE;
}

static void
sgemm(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, const float *a, const float *b,
      float beta, float *c)
{
  qkv_sgemm(ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, beta, c, n, 0);
}

typedef struct {
  float *c;
  const float *src;
  gint64 cols;
} FfnRowsJob;

static void
fill_rows_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const FfnRowsJob *j = user_data;
  for (gint64 r = begin; r < end; r++)
    memcpy(j->c + r * j->cols, j->src, (gsize)j->cols * sizeof(float));
}

/* Every row of c (rows × cols) set to bias. */
static void
fill_rows(const QkvKernelCtx *ctx, float *c, const float *bias, gint64 rows, gint64 cols)
{
  FfnRowsJob job = {c, bias, cols};
  qkv_parallel_for(qkv_kernel_threads(ctx, rows * cols), rows, fill_rows_range, &job);
}

static void
relu_gate_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const FfnRowsJob *j = user_data;
  float *c = j->c;
  const float *gate = j->src;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    c[i] = gate[i] > 0.0f ? c[i] : 0.0f;
}

/* c[i] kept where gate[i] > 0, else 0 (c may be gate: the ReLU itself). */
static void
relu_gate(const QkvKernelCtx *ctx, float *c, const float *gate, gint64 n)
{
  FfnRowsJob job = {c, gate, 0};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, relu_gate_range, &job);
}

typedef struct {
  float *c;
  const guint16 *gate;
} FfnGateBf16Job;

static void
relu_gate_bf16_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const FfnGateBf16Job *j = user_data;
  float *c = j->c;
  const guint16 *gate = j->gate;
  /* positive bf16 values, +infinity included, are the bits 1 to 0x7f80 */
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    c[i] = (guint16)(gate[i] - 1u) < 0x7f80u ? c[i] : 0.0f;
}

/* relu_gate() with the gate stored as bf16. */
static void
relu_gate_bf16(const QkvKernelCtx *ctx, float *c, const guint16 *gate, gint64 n)
{
  FfnGateBf16Job job = {c, gate};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, relu_gate_bf16_range, &job);
}

typedef struct {
  guint16 *dst;
  float *src;
} FfnRoundJob;

static void
relu_round_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const FfnRoundJob *j = user_data;
  float *x = j->src;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    x[i] = x[i] > 0.0f ? x[i] : 0.0f;
  qkv_bf16_from_floats(j->dst + begin, x + begin, (gsize)(end - begin));
}

/* dst = the ReLU of src (which it overwrites), rounded to bf16. */
static void
relu_round(const QkvKernelCtx *ctx, guint16 *dst, float *src, gint64 n)
{
  FfnRoundJob job = {dst, src};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, relu_round_range, &job);
}

/* Where the forward computes the hidden layer in float32 when the plan
 * stores it as bf16. */
static gsize
ffn_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  if (ctx->out_dtypes[1] != QKV_BF16)
    return 0;
  const QkvShape *x = &ctx->in_shapes[0];
  gint64 d = x->dims[x->rank - 1], f = ctx->in_shapes[1].dims[0];
  return (gsize)(qkv_shape_numel(x) / d * f) * sizeof(float);
}

static void
ffn_forward(const QkvKernelCtx *ctx)
{
  const QkvView *w1v = &ctx->in[1], *w2v = &ctx->in[3];
  gint64 n, d;
  qkv_view_rows(&ctx->in[0], &n, &d);
  const gint64 f = w1v->shape.dims[0], o = w2v->shape.dims[0];
  const float *x = ctx->in[0].data, *w1 = w1v->data, *b1 = ctx->in[2].data, *w2 = w2v->data,
              *b2 = ctx->in[4].data;
  float *y = ctx->out[0].data;
  const QkvDType hidden_dtype = ctx->out[1].dtype;
  float *hidden = hidden_dtype == QKV_BF16 ? ctx->scratch : ctx->out[1].data;
  if (n == 0)
    return;

  fill_rows(ctx, hidden, b1, n, f);
  sgemm(FALSE, TRUE, n, f, d, x, w1, 1.0f, hidden);
  const gint64 nh = n * f;
  if (hidden_dtype == QKV_BF16)
    relu_round(ctx, ctx->out[1].data, hidden, nh);
  else
    relu_gate(ctx, hidden, hidden, nh);

  fill_rows(ctx, y, b2, n, o);
  qkv_sgemm_typed(FALSE, TRUE, n, o, f, 1.0f, ctx->out[1].data, hidden_dtype, f, w2, QKV_F32, f,
                  1.0f, y, o, 0);
}

/* ---- backward ----------------------------------------------------------- */

static gboolean
ffn_backward_dims(const QkvShapeCtx *ctx, FfnDims *dims)
{
  const QkvShape *dy = &ctx->in_shapes[0], *x = &ctx->in_shapes[1], *w1 = &ctx->in_shapes[2],
                 *w2 = &ctx->in_shapes[3], *h = &ctx->in_shapes[4];
  if (x->rank < 1 || w1->rank != 2 || w2->rank != 2 || dy->rank != x->rank || h->rank != x->rank)
    return FALSE;
  dims->d = x->dims[x->rank - 1];
  dims->f = w1->dims[0];
  dims->o = w2->dims[0];
  dims->n = dims->d > 0 ? qkv_shape_numel(x) / dims->d : 0;
  if (dims->d < 1 || w1->dims[1] != dims->d || w2->dims[1] != dims->f)
    return FALSE;
  for (gint i = 0; i < x->rank - 1; i++)
    if (dy->dims[i] != x->dims[i] || h->dims[i] != x->dims[i])
      return FALSE;
  return dy->dims[x->rank - 1] == dims->o && h->dims[x->rank - 1] == dims->f;
}

static gboolean
ffn_backward_shape(QkvShapeCtx *ctx, GError **error)
{
  FfnDims dims;
  for (guint i = 0; i < 5; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "every input must be f32");
  if (!ffn_backward_dims(ctx, &dims))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "expected dy (…, O), x (…, D), w1 (F, D), w2 (O, F), hidden (…, F)");
  ctx->n_outputs = 5;
  ctx->out_shapes[0] = ctx->in_shapes[1];
  ctx->out_shapes[1] = ctx->in_shapes[2];
  ctx->out_shapes[2] = QKV_SHAPE(dims.f);
  ctx->out_shapes[3] = ctx->in_shapes[3];
  ctx->out_shapes[4] = QKV_SHAPE(dims.o);
  return TRUE;
}

/* Where the row indices start in the backward's scratch: after the hidden
 * gradient and the ones, aligned for gint64. */
static gsize
ffn_index_offset(gint64 n, gint64 f)
{
  return ((gsize)(n * f + n) * sizeof(float) + 7) / 8 * 8;
}

/* The hidden gradient (N × F), N ones (bias gradients are column sums,
 * computed as products with a vector of ones), then for skipping zero rows
 * of dy: their indices (N), and dy, x and hidden gathered (N × (O + D + F)). */
static gsize
ffn_backward_scratch(const QkvShapeCtx *ctx, gint n_threads)
{
  FfnDims dims;
  if (!ffn_backward_dims(ctx, &dims))
    return 0;
  return ffn_index_offset(dims.n, dims.f) + (gsize)dims.n * sizeof(gint64) +
         (gsize)(dims.n * (dims.o + dims.d + dims.f)) * sizeof(float) + 3 * 64;
}

static void
ffn_backward_forward(const QkvKernelCtx *ctx)
{
  const QkvView *w1v = &ctx->in[2], *w2v = &ctx->in[3];
  gint64 n, d;
  qkv_view_rows(&ctx->in[1], &n, &d);
  const gint64 f = w1v->shape.dims[0], o = w2v->shape.dims[0];
  const float *dy = ctx->in[0].data, *x = ctx->in[1].data, *w1 = w1v->data, *w2 = w2v->data;
  /* floats, or bf16 bits (bf16_activations) */
  gconstpointer hidden = ctx->in[4].data;
  const QkvDType hidden_dtype = ctx->in[4].dtype;
  float *dx = ctx->out[0].data, *dw1 = ctx->out[1].data, *db1 = ctx->out[2].data,
        *dw2 = ctx->out[3].data, *db2 = ctx->out[4].data;
  float *dhidden = ctx->scratch, *ones = dhidden + n * f;
  gint64 *index = (gint64 *)((guint8 *)ctx->scratch + ffn_index_offset(n, f));

  /* Only the rows where dy is not zero contribute (see ops-common.h). */
  const gint64 rows = n;
  gint64 m = n > 0 ? qkv_nonzero_rows(dy, n, o, o, index) : 0;
  gboolean compact = qkv_compact_pays(m, n, f * (o + d));
  if (compact) {
    /* each gathered matrix starts on a 64-byte boundary, as arena buffers do */
    float *dy_c = qkv_align_floats(index + n), *x_c = qkv_align_floats(dy_c + m * o);
    float *hidden_c = qkv_align_floats(x_c + m * d);
    qkv_gather_rows(ctx, dy_c, dy, o, index, m, o);
    qkv_gather_rows(ctx, x_c, x, d, index, m, d);
    qkv_gather_elems(ctx, hidden_c, hidden, f, index, m, f, qkv_dtype_size(hidden_dtype));
    /* dy_c is read by two products (one copy of it in bf16) */
    qkv_sgemm_operand_final(dy_c, (gsize)(m * o));
    dy = dy_c;
    x = x_c;
    hidden = hidden_c;
    n = m;
  }

  if (n == 0) {
    memset(dx, 0, (gsize)(rows * d) * sizeof(float));
    memset(dw1, 0, (gsize)(f * d) * sizeof(float));
    memset(db1, 0, (gsize)f * sizeof(float));
    memset(dw2, 0, (gsize)(o * f) * sizeof(float));
    memset(db2, 0, (gsize)o * sizeof(float));
    return;
  }
  for (gint64 i = 0; i < n; i++)
    ones[i] = 1.0f;

  /* Second layer: dw2 = dyᵀ · hidden, db2 = dyᵀ · 1, dhidden = dy · w2. */
  qkv_sgemm_typed(TRUE, FALSE, o, f, n, 1.0f, dy, QKV_F32, o, hidden, hidden_dtype, f, 0.0f, dw2, f,
                  0);
  cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)n, (blasint)o, 1.0f, dy, (blasint)o, ones, 1,
              0.0f, db2, 1);
  sgemm(FALSE, FALSE, n, f, o, dy, w2, 0.0f, dhidden);

  /* Through the ReLU: its output is positive exactly where it passed. */
  const gint64 nh = n * f;
  if (hidden_dtype == QKV_BF16)
    relu_gate_bf16(ctx, dhidden, hidden, nh);
  else
    relu_gate(ctx, dhidden, hidden, nh);
  qkv_sgemm_operand_final(dhidden, (gsize)nh);

  /* First layer: dw1 = dhiddenᵀ · x, db1 = dhiddenᵀ · 1, dx = dhidden · w1. */
  sgemm(TRUE, FALSE, f, d, n, dhidden, x, 0.0f, dw1);
  cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)n, (blasint)f, 1.0f, dhidden, (blasint)f, ones, 1,
              0.0f, db1, 1);
  sgemm(FALSE, FALSE, n, d, f, dhidden, w1, 0.0f, dx);
  if (compact)
    qkv_expand_rows(dx, index, m, rows, d);
}

static gboolean
ffn_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[1] != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT,
                "position_wise_ffn: the saved output 'hidden' takes no gradient");
    return FALSE;
  }
  if (g->out_grads[0] == NULL)
    return TRUE;
  QkvValue *inputs[] = {g->out_grads[0], g->inputs[0], g->inputs[1], g->inputs[3], g->outputs[1]};
  QkvNode *node =
      qkv_graph_add_node(g->graph, "position_wise_ffn_backward", inputs, 5, NULL, error);
  if (node == NULL)
    return FALSE;
  for (guint i = 0; i < 5; i++)
    if (g->needs_grad[i])
      g->in_grads[i] = qkv_node_output(node, i);
  return TRUE;
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_ffn[] = {
    QKV_OP(.name = "position_wise_ffn",
           .doc = "relu(x · w1ᵀ + b1) · w2ᵀ + b2 over the last axis (w1 (F, D), w2 (O, F)); "
                  "outputs y and the ReLU activation that the backward reads",
           QKV_INPUTS("x", "w1", "b1", "w2", "b2"), QKV_OUTPUTS("y", "hidden"), .shape = ffn_shape,
           .forward = ffn_forward, .gradient = ffn_grad, .scratch_size = ffn_scratch,
           .bf16_outputs = 1u << 1),
    QKV_OP(.name = "position_wise_ffn_backward",
           .doc = "dx, dw1, db1, dw2, db2 of position_wise_ffn from dy, x, w1, w2 and the saved "
                  "ReLU activation",
           QKV_INPUTS("dy", "x", "w1", "w2", "hidden"),
           QKV_OUTPUTS("dx", "dw1", "db1", "dw2", "db2"), .shape = ffn_backward_shape,
           .forward = ffn_backward_forward, .scratch_size = ffn_backward_scratch,
           .bf16_inputs = 1u << 4),
    QKV_OPS_END,
};

/* ---- typed function ----------------------------------------------------- */

QkvValue *
qkv_position_wise_ffn(QkvValue *x, QkvValue *w1, QkvValue *b1, QkvValue *w2, QkvValue *b2,
                      GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("position_wise_ffn", error, x, w1, b1, w2, b2);
  QkvValue *inputs[] = {x, w1, b1, w2, b2};
  return qkv_op_call("position_wise_ffn", inputs, 5, NULL, error);
}
