/* softmax.c: "softmax" and "log_softmax" over the last axis, and their
 * backward ops.
 *
 * Rows are shifted by their maximum before exponentiation, so large logits
 * do not overflow; exp runs over whole rows through qkv_vec_exp (SLEEF).
 */
#include "ops-common.h"

#include <math.h>
#include "error-private.h"

static float
row_max(const float *x, gint64 n)
{
  float m = -INFINITY;
  for (gint64 j = 0; j < n; j++)
    m = x[j] > m ? x[j] : m;
  return m;
}

/* y = softmax(x) over one row; y may equal x. A row of -inf only (fully
 * masked) gives zeros rather than NaN. */
static void
softmax_row(float *y, const float *x, gint64 n)
{
  float m = row_max(x, n);
  if (m == -INFINITY) {
    memset(y, 0, (gsize)n * sizeof(float));
    return;
  }
  for (gint64 j = 0; j < n; j++)
    y[j] = x[j] - m;
  qkv_vec_exp(y, y, (gsize)n);
  float sum = 0.0f;
  for (gint64 j = 0; j < n; j++)
    sum += y[j];
  float inv = 1.0f / sum;
  for (gint64 j = 0; j < n; j++)
    y[j] *= inv;
}

/* y = log_softmax(x) over one row; y must not alias x (exp(x - max) is
 * staged in y while x is still needed). */
static void
log_softmax_row(float *y, const float *x, gint64 n)
{
  float m = row_max(x, n);
  if (m == -INFINITY) {
    for (gint64 j = 0; j < n; j++)
      y[j] = -INFINITY;
    return;
  }
  for (gint64 j = 0; j < n; j++)
    y[j] = x[j] - m;
  qkv_vec_exp(y, y, (gsize)n);
  float sum = 0.0f;
  for (gint64 j = 0; j < n; j++)
    sum += y[j];
  /* (x − m) is exact for nearby values; folding m into the log term first
   * would round it at the scale of m (1000 + 0.4 loses digits). */
  float log_sum = logf(sum);
  for (gint64 j = 0; j < n; j++)
    y[j] = (x[j] - m) - log_sum;
}

/* Units of work per element of a row pass with an exp (max, subtract, exp,
 * sum, scale; the exp counting for several). */
#define SOFTMAX_WORK 10

typedef struct {
  const float *x; /* x, or dy for the backward ops */
  const float *y; /* the forward output (backward ops only) */
  float *out;
  gint64 cols;
} SoftmaxJob;

static void
softmax_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SoftmaxJob *j = user_data;
  for (gint64 r = begin; r < end; r++)
    softmax_row(j->out + r * j->cols, j->x + r * j->cols, j->cols);
}

static void
log_softmax_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SoftmaxJob *j = user_data;
  for (gint64 r = begin; r < end; r++)
    log_softmax_row(j->out + r * j->cols, j->x + r * j->cols, j->cols);
}

/* dx = y · (dy − Σ dy·y) for rows [begin, end). */
static void
softmax_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SoftmaxJob *a = user_data;
  const gint64 cols = a->cols;
  for (gint64 r = begin; r < end; r++) {
    const float *dyr = a->x + r * cols, *yr = a->y + r * cols;
    float *dxr = a->out + r * cols;
    float dot = 0.0f;
    for (gint64 j = 0; j < cols; j++)
      dot += dyr[j] * yr[j];
    for (gint64 j = 0; j < cols; j++)
      dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

/* dx = dy − exp(y) · Σ dy for rows [begin, end). */
static void
log_softmax_backward_rows(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const SoftmaxJob *a = user_data;
  const gint64 cols = a->cols;
  for (gint64 r = begin; r < end; r++) {
    const float *dyr = a->x + r * cols;
    float *dxr = a->out + r * cols;
    float sum = 0.0f;
    for (gint64 j = 0; j < cols; j++)
      sum += dyr[j];
    /* Stage exp(y) in dx: without QKV_OP_INPLACE it aliases neither input. */
    qkv_vec_exp(dxr, a->y + r * cols, (gsize)cols);
    for (gint64 j = 0; j < cols; j++)
      dxr[j] = dyr[j] - dxr[j] * sum;
  }
}

static gboolean
softmax_shape(QkvShapeCtx *ctx, GError **error)
{
  if (ctx->in_dtypes[0] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "x must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[0]));
  if (ctx->in_shapes[0].rank < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "x must have rank 1 or more (softmax runs over the last axis)");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
softmax_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[0], &rows, &cols);
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  SoftmaxJob job = {x, NULL, y, cols};
  qkv_parallel_for(qkv_kernel_threads(ctx, SOFTMAX_WORK * rows * cols), rows, softmax_rows, &job);
}

static void
log_softmax_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[0], &rows, &cols);
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  SoftmaxJob job = {x, NULL, y, cols};
  qkv_parallel_for(qkv_kernel_threads(ctx, SOFTMAX_WORK * rows * cols), rows, log_softmax_rows,
                   &job);
}

static gboolean
softmax_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] = qkv_softmax_backward(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

static gboolean
log_softmax_grad(QkvGradCtx *g, GError **error)
{
  if (g->out_grads[0] == NULL || !g->needs_grad[0])
    return TRUE;
  g->in_grads[0] = qkv_log_softmax_backward(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

/* ---- backward ops ------------------------------------------------------- */

static gboolean
backward_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *dy = &ctx->in_shapes[0], *y = &ctx->in_shapes[1];
  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "dy and y must be f32, got %s and %s",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  if (!qkv_shape_equal(dy, y) || dy->rank < 1)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "dy and y must have the same shape, of rank 1 or more");
  ctx->out_shapes[0] = *y;
  return TRUE;
}

/* dx = y · (dy − Σ dy·y), the softmax Jacobian-vector product per row. */
static void
softmax_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[1], &rows, &cols);
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
  SoftmaxJob job = {dy, y, dx, cols};
  /* a dot product and a scaled difference: about four units per element */
  qkv_parallel_for(qkv_kernel_threads(ctx, 4 * rows * cols), rows, softmax_backward_rows, &job);
}

/* dx = dy − exp(y) · Σ dy, since exp(log_softmax) is the softmax. */
static void
log_softmax_backward_forward(const QkvKernelCtx *ctx)
{
  gint64 rows, cols;
  qkv_view_rows(&ctx->in[1], &rows, &cols);
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
  SoftmaxJob job = {dy, y, dx, cols};
  qkv_parallel_for(qkv_kernel_threads(ctx, SOFTMAX_WORK * rows * cols), rows,
                   log_softmax_backward_rows, &job);
}

/* ---- registration ------------------------------------------------------- */

const QkvOpDef qkv_ops_softmax[] = {
    /* In place: each row is read completely (its max) before it is overwritten. */
    QKV_OP(.name = "softmax", .doc = "exp(x) / Σ exp(x) over the last axis", QKV_INPUTS("x"),
           QKV_OUTPUTS("y"), .flags = QKV_OP_INPLACE, .shape = softmax_shape,
           .forward = softmax_forward, .gradient = softmax_grad),
    QKV_OP(.name = "log_softmax", .doc = "x − log Σ exp(x) over the last axis", QKV_INPUTS("x"),
           QKV_OUTPUTS("y"), .shape = softmax_shape, .forward = log_softmax_forward,
           .gradient = log_softmax_grad),
    QKV_OP(.name = "softmax_backward",
           .doc = "y · (dy − Σ dy·y) over the last axis, given the softmax output y",
           QKV_INPUTS("dy", "y"), QKV_OUTPUTS("dx"), .shape = backward_shape,
           .forward = softmax_backward_forward),
    QKV_OP(.name = "log_softmax_backward",
           .doc = "dy − exp(y) · Σ dy over the last axis, given the log_softmax output y",
           QKV_INPUTS("dy", "y"), QKV_OUTPUTS("dx"), .shape = backward_shape,
           .forward = log_softmax_backward_forward),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

QkvValue *
qkv_softmax(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("softmax", error, x);
  return qkv_op_call("softmax", &x, 1, NULL, error);
}

QkvValue *
qkv_log_softmax(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("log_softmax", error, x);
  return qkv_op_call("log_softmax", &x, 1, NULL, error);
}

QkvValue *
qkv_softmax_backward(QkvValue *dy, QkvValue *y, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("softmax_backward", error, dy, y);
  QkvValue *inputs[] = {dy, y};
  return qkv_op_call("softmax_backward", inputs, 2, NULL, error);
}

QkvValue *
qkv_log_softmax_backward(QkvValue *dy, QkvValue *y, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("log_softmax_backward", error, dy, y);
  QkvValue *inputs[] = {dy, y};
  return qkv_op_call("log_softmax_backward", inputs, 2, NULL, error);
}
