/* elementwise.c: binary ops with NumPy broadcasting (add, sub, mul, div), unary
 * ops (scale, neg, relu, sigmoid, tanh, exp, log) and the fused gradient ops
 * of the activations (relu_backward, sigmoid_backward, tanh_backward).
 *
 * Every kernel splits its output into one contiguous chunk per thread and runs
 * a plain loop over each chunk, so the compiler can vectorise the loops and
 * SLEEF can work on whole arrays. Kernels read element i before they write
 * element i, which is what lets the unary ops (and the binary ops, whose output
 * lays out like input 0 whenever the two have the same size) run in place.
 */
#include "broadcast-common.h"

#include <math.h>
#include "error-private.h"

/* Chunks start on a multiple of this many floats (a 64-byte cache line), so
 * threads never write to the same line and SLEEF sees aligned starts. */
#define EW_CHUNK_ALIGN 16

typedef void (*EwChunkFunc)(const QkvKernelCtx *ctx, gconstpointer data, gint64 begin, gint64 end);

typedef struct {
  const QkvKernelCtx *ctx;
  EwChunkFunc chunk;
  gconstpointer data;
  gint64 n;
} EwJob;

static void
ew_blocks(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const EwJob *j = user_data;
  gint64 b = MIN(begin * EW_CHUNK_ALIGN, j->n), e = MIN(end * EW_CHUNK_ALIGN, j->n);
  if (b < e)
    j->chunk(j->ctx, j->data, b, e);
}

/* Run chunk over [0, n) split into contiguous, aligned chunks, one per thread;
 */
static void
ew_parallel(const QkvKernelCtx *ctx, gint64 n, EwChunkFunc chunk, gconstpointer data)
{
  if (n == 0)
    return;
  gint nt = qkv_kernel_threads(ctx, n);
  if (nt == 1) {
    chunk(ctx, data, 0, n);
    return;
  }
  EwJob job = {ctx, chunk, data, n};
  qkv_parallel_for(nt, (n + EW_CHUNK_ALIGN - 1) / EW_CHUNK_ALIGN, ew_blocks, &job);
}

/* ---------------------------------------------------------------------------
 * Binary ops with broadcasting
 * ------------------------------------------------------------------------- */

typedef enum {
  /* a, b and the output lay out alike (equal shapes up to leading 1s). */
  BCAST_SAME,
  /* a lays out like the output; b is one element. */
  BCAST_B_SCALAR,
  BCAST_A_SCALAR,
  /* a lays out like the output; b repeats along leading axes (a row bias). */
  BCAST_B_ROWS,
  BCAST_A_ROWS,
  /* Anything else: walk the output with per-input strides, 0 on broadcast axes. */
  BCAST_GENERAL,
} BcastKind;

typedef struct {
  BcastKind kind;
  /* BCAST_*_ROWS: the number of elements of the repeated operand. */
  gint64 period;
  /* BCAST_GENERAL: the output dims and each input's strides in the output's rank. */
  gint rank;
  gint64 dims[QKV_MAX_RANK];
  gint64 a_strides[QKV_MAX_RANK];
  gint64 b_strides[QKV_MAX_RANK];
} BcastLayout;

/* TRUE if x's dims, less its leading 1s, are the trailing dims of out: x then
 * repeats whole along the leading axes of out. */
static gboolean
repeats_along_leading_axes(const QkvShape *x, const QkvShape *out)
{
  gint lead = 0;
  while (lead < x->rank && x->dims[lead] == 1)
    lead++;
  gint k = x->rank - lead;
  if (k > out->rank)
    return FALSE;
  for (gint i = 1; i <= k; i++)
    if (x->dims[x->rank - i] != out->dims[out->rank - i])
      return FALSE;
  return TRUE;
}

/* x's strides aligned to the right of out's rank, 0 where x is broadcast. */
static void
broadcast_strides(const QkvShape *x, const QkvShape *out, gint64 *strides)
{
  gint64 own[QKV_MAX_RANK];
  qkv_shape_strides(x, own);
  gint offset = out->rank - x->rank;
  for (gint d = 0; d < out->rank; d++) {
    gint xd = d - offset;
    strides[d] = (xd < 0 || x->dims[xd] == 1) ? 0 : own[xd];
  }
}

static void
bcast_layout(const QkvShape *a, const QkvShape *b, const QkvShape *out, BcastLayout *l)
{
  gint64 n = qkv_shape_numel(out);
  gint64 na = qkv_shape_numel(a), nb = qkv_shape_numel(b);
  /* With n > 0, an operand with n elements must lay out like the output:
   * every axis of it is either the output's or a leading 1. */
  if (na == n && nb == n)
    l->kind = BCAST_SAME;
  else if (na == n && nb == 1)
    l->kind = BCAST_B_SCALAR;
  else if (nb == n && na == 1)
    l->kind = BCAST_A_SCALAR;
  else if (na == n && repeats_along_leading_axes(b, out))
    l->kind = BCAST_B_ROWS;
  else if (nb == n && repeats_along_leading_axes(a, out))
    l->kind = BCAST_A_ROWS;
  else
    l->kind = BCAST_GENERAL;

  l->period = l->kind == BCAST_B_ROWS ? nb : na;
  if (l->kind == BCAST_GENERAL) {
    l->rank = out->rank;
    memcpy(l->dims, out->dims, sizeof l->dims);
    broadcast_strides(a, out, l->a_strides);
    broadcast_strides(b, out, l->b_strides);
  }
}

typedef float (*BinaryFunc)(float x, float y);

/* out[i] = op(a[·], b[·]) over output elements [begin, end). Always inlined
 * into one small function per op, so op becomes a direct, inlined call and
 * each loop vectorises. */
G_ALWAYS_INLINE static inline void
binary_chunk(const BcastLayout *l, float *out, const float *a, const float *b, gint64 begin,
             gint64 end, BinaryFunc op)
{
  switch (l->kind) {
  case BCAST_SAME:
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      out[i] = op(a[i], b[i]);
    break;
  case BCAST_B_SCALAR: {
    const float s = b[0];
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      out[i] = op(a[i], s);
    break;
  }
  case BCAST_A_SCALAR: {
    const float s = a[0];
#pragma omp simd
    for (gint64 i = begin; i < end; i++)
      out[i] = op(s, b[i]);
    break;
  }
  case BCAST_B_ROWS:
  case BCAST_A_ROWS: {
    /* Walk row segments so the inner loop has no wrap-around test. */
    const gint64 period = l->period;
    gint64 j = begin % period;
    for (gint64 i = begin; i < end;) {
      gint64 len = MIN(period - j, end - i);
      if (l->kind == BCAST_B_ROWS) {
#pragma omp simd
        for (gint64 k = 0; k < len; k++)
          out[i + k] = op(a[i + k], b[j + k]);
      } else {
#pragma omp simd
        for (gint64 k = 0; k < len; k++)
          out[i + k] = op(a[j + k], b[i + k]);
      }
      i += len;
      j = 0;
    }
    break;
  }
  case BCAST_GENERAL: {
    /* An odometer over the output's axes, one row of the last axis at a time. */
    const gint rank = l->rank, last = rank - 1;
    const gint64 inner = l->dims[last];
    const gint64 sa = l->a_strides[last], sb = l->b_strides[last];
    gint64 coord[QKV_MAX_RANK];
    gint64 oa = 0, ob = 0, rest = begin;
    for (gint d = last; d >= 0; d--) {
      coord[d] = rest % l->dims[d];
      rest /= l->dims[d];
      oa += coord[d] * l->a_strides[d];
      ob += coord[d] * l->b_strides[d];
    }
    for (gint64 i = begin; i < end;) {
      gint64 k0 = coord[last];
      gint64 len = MIN(inner - k0, end - i);
      if (sa == 1 && sb == 1) {
#pragma omp simd
        for (gint64 k = 0; k < len; k++)
          out[i + k] = op(a[oa + k], b[ob + k]);
      } else {
#pragma omp simd
        for (gint64 k = 0; k < len; k++)
          out[i + k] = op(a[oa + k * sa], b[ob + k * sb]);
      }
      i += len;
      /* Back to the start of the row, then carry into the outer axes. */
      oa -= k0 * sa;
      ob -= k0 * sb;
      coord[last] = 0;
      for (gint d = last - 1; d >= 0; d--) {
        coord[d]++;
        oa += l->a_strides[d];
        ob += l->b_strides[d];
        if (coord[d] < l->dims[d])
          break;
        oa -= l->dims[d] * l->a_strides[d];
        ob -= l->dims[d] * l->b_strides[d];
        coord[d] = 0;
      }
    }
    break;
  }
  }
}

static inline float
op_add(float x, float y)
{
  return x + y;
}

static inline float
op_sub(float x, float y)
{
  return x - y;
}

static inline float
op_mul(float x, float y)
{
  return x * y;
}

static inline float
op_div(float x, float y)
{
  return x / y;
}

#define DEFINE_BINARY_KERNEL(NAME)                                                                 \
  static void NAME##_chunk(const QkvKernelCtx *ctx, gconstpointer layout, gint64 begin,            \
                           gint64 end)                                                             \
  {                                                                                                \
    binary_chunk(layout, ctx->out[0].data, ctx->in[0].data, ctx->in[1].data, begin, end,           \
                 op_##NAME);                                                                       \
  }                                                                                                \
  static void NAME##_forward(const QkvKernelCtx *ctx)                                              \
  {                                                                                                \
    BcastLayout layout;                                                                            \
    bcast_layout(&ctx->in[0].shape, &ctx->in[1].shape, &ctx->out[0].shape, &layout);               \
    ew_parallel(ctx, qkv_shape_numel(&ctx->out[0].shape), NAME##_chunk, &layout);                  \
  }

DEFINE_BINARY_KERNEL(add)
DEFINE_BINARY_KERNEL(sub)
DEFINE_BINARY_KERNEL(mul)
DEFINE_BINARY_KERNEL(div)

static gboolean
check_f32_inputs(QkvShapeCtx *ctx, GError **error)
{
  for (guint i = 0; i < ctx->n_inputs; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
  return TRUE;
}

static gboolean
binary_shape(QkvShapeCtx *ctx, GError **error)
{
  return check_f32_inputs(ctx, error) && qkv_bcast_shapes(ctx, 2, &ctx->out_shapes[0], error);
}

static gboolean
add_grad(QkvGradCtx *g, GError **error)
{
  for (guint i = 0; i < 2; i++) {
    if (!g->needs_grad[i])
      continue;
    g->in_grads[i] = qkv_grad_to_input(g->out_grads[0], g->inputs[i], error);
    if (g->in_grads[i] == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
sub_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dy = g->out_grads[0];
  if (g->needs_grad[0]) {
    g->in_grads[0] = qkv_grad_to_input(dy, g->inputs[0], error);
    if (g->in_grads[0] == NULL)
      return FALSE;
  }
  if (g->needs_grad[1]) {
    /* Negate after reducing: the reduced tensor is the smaller one. */
    QkvValue *db = qkv_grad_to_input(dy, g->inputs[1], error);
    if (db == NULL || (g->in_grads[1] = qkv_neg(db, error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
mul_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dy = g->out_grads[0];
  for (guint i = 0; i < 2; i++) {
    if (!g->needs_grad[i])
      continue;
    QkvValue *prod = qkv_mul(dy, g->inputs[1 - i], error);
    if (prod == NULL || (g->in_grads[i] = qkv_grad_to_input(prod, g->inputs[i], error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
div_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *dy = g->out_grads[0], *b = g->inputs[1], *y = g->outputs[0];
  if (g->needs_grad[0]) {
    QkvValue *q = qkv_div(dy, b, error);
    if (q == NULL || (g->in_grads[0] = qkv_grad_to_input(q, g->inputs[0], error)) == NULL)
      return FALSE;
  }
  if (g->needs_grad[1]) {
    /* d(a/b)/db = -a/b² = -y/b: reuse the forward output instead of a. */
    QkvValue *t = qkv_mul(dy, y, error);
    if (t == NULL || (t = qkv_div(t, b, error)) == NULL ||
        (t = qkv_grad_to_input(t, b, error)) == NULL ||
        (g->in_grads[1] = qkv_neg(t, error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------
 * Unary ops
 * ------------------------------------------------------------------------- */

static gboolean
unary_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_f32_inputs(ctx, error))
    return FALSE;
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
unary_run(const QkvKernelCtx *ctx, EwChunkFunc chunk)
{
  ew_parallel(ctx, qkv_shape_numel(&ctx->out[0].shape), chunk, NULL);
}

static void
scale_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  const float factor = (float)qkv_attrs_get_float(ctx->attrs, "factor");
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    y[i] = x[i] * factor;
}

static void
neg_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    y[i] = -x[i];
}

/* Written so that a NaN passes through instead of turning into 0. */
static void
relu_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

/* Stack block for sigmoid: the sign of x is needed after exp(-|x|), and in
 * place the output buffer cannot hold both. */
#define SIGMOID_BLOCK 512

static void
sigmoid_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  float e[SIGMOID_BLOCK];
  /* exp(-|x|) never overflows, and e/(1+e) keeps full relative precision far
   * into the negative tail, where 0.5·(1 + tanh(x/2)) would round to 0. */
  for (gint64 start = begin; start < end; start += SIGMOID_BLOCK) {
    gint64 len = MIN(SIGMOID_BLOCK, end - start);
#pragma omp simd
    for (gint64 k = 0; k < len; k++)
      e[k] = -fabsf(x[start + k]);
    qkv_vec_exp(e, e, (gsize)len);
#pragma omp simd
    for (gint64 k = 0; k < len; k++) {
      float xk = x[start + k], ek = e[k];
      /* A select of operands, not of results: GCC will not speculate the
       * product, so a ternary on results would keep the loop scalar. */
      float num = xk >= 0.0f ? 1.0f : ek;
      y[start + k] = num / (1.0f + ek);
    }
  }
}

static void
tanh_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  qkv_vec_tanh(y + begin, x + begin, (gsize)(end - begin));
}

static void
exp_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  qkv_vec_exp(y + begin, x + begin, (gsize)(end - begin));
}

static void
log_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    y[i] = logf(x[i]);
}

/* NAME_forward runs NAME_chunk over the whole output. */
#define DEFINE_UNARY_FORWARD(NAME)                                                                 \
  static void NAME##_forward(const QkvKernelCtx *ctx)                                              \
  {                                                                                                \
    unary_run(ctx, NAME##_chunk);                                                                  \
  }

DEFINE_UNARY_FORWARD(scale)
DEFINE_UNARY_FORWARD(neg)
DEFINE_UNARY_FORWARD(relu)
DEFINE_UNARY_FORWARD(sigmoid)
DEFINE_UNARY_FORWARD(tanh)
DEFINE_UNARY_FORWARD(exp)
DEFINE_UNARY_FORWARD(log)

static gboolean
scale_grad(QkvGradCtx *g, GError **error)
{
  double factor = qkv_attrs_get_float(g->attrs, "factor");
  g->in_grads[0] = qkv_scale(g->out_grads[0], factor, error);
  return g->in_grads[0] != NULL;
}

static gboolean
neg_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_neg(g->out_grads[0], error);
  return g->in_grads[0] != NULL;
}

/* The activations differentiate through their output y, which the forward
 * pass keeps anyway, so x need not stay alive for the backward pass. */
static gboolean
relu_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_relu_backward(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

static gboolean
sigmoid_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_sigmoid_backward(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

static gboolean
tanh_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_tanh_backward(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

static gboolean
exp_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_mul(g->out_grads[0], g->outputs[0], error);
  return g->in_grads[0] != NULL;
}

static gboolean
log_grad(QkvGradCtx *g, GError **error)
{
  g->in_grads[0] = qkv_div(g->out_grads[0], g->inputs[0], error);
  return g->in_grads[0] != NULL;
}

/* ---------------------------------------------------------------------------
 * Activation gradients: dx from dy and the forward output y
 * ------------------------------------------------------------------------- */

static gboolean
backward_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!check_f32_inputs(ctx, error))
    return FALSE;
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "dy and y must have the same shape");
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
relu_backward_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++) {
    /* Load dy unconditionally: a select vectorises, a conditional load does not. */
    float d = dy[i];
    dx[i] = y[i] > 0.0f ? d : 0.0f;
  }
}

static void
sigmoid_backward_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

static void
tanh_backward_chunk(const QkvKernelCtx *ctx, gconstpointer unused, gint64 begin, gint64 end)
{
  const float *dy = ctx->in[0].data, *y = ctx->in[1].data;
  float *dx = ctx->out[0].data;
#pragma omp simd
  for (gint64 i = begin; i < end; i++)
    dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

DEFINE_UNARY_FORWARD(relu_backward)
DEFINE_UNARY_FORWARD(sigmoid_backward)
DEFINE_UNARY_FORWARD(tanh_backward)

/* Second derivatives, so that a gradient of a gradient works too. Each op is
 * linear in dy, so d/d(dy) is the same op applied to the incoming gradient. */

static gboolean
relu_backward_grad(QkvGradCtx *g, GError **error)
{
  /* y only selects; away from y = 0 the output does not depend on it. */
  if (g->needs_grad[0]) {
    g->in_grads[0] = qkv_relu_backward(g->out_grads[0], g->inputs[1], error);
    if (g->in_grads[0] == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
sigmoid_backward_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *ddx = g->out_grads[0], *dy = g->inputs[0], *y = g->inputs[1];
  if (g->needs_grad[0]) {
    g->in_grads[0] = qkv_sigmoid_backward(ddx, y, error);
    if (g->in_grads[0] == NULL)
      return FALSE;
  }
  if (g->needs_grad[1]) {
    /* d/dy [dy·y(1-y)] = dy·(1 - 2y) = dy - 2·dy·y */
    QkvValue *t = qkv_mul(dy, y, error);
    if (t == NULL || (t = qkv_scale(t, -2.0, error)) == NULL ||
        (t = qkv_add(t, dy, error)) == NULL || (g->in_grads[1] = qkv_mul(t, ddx, error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
tanh_backward_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *ddx = g->out_grads[0], *dy = g->inputs[0], *y = g->inputs[1];
  if (g->needs_grad[0]) {
    g->in_grads[0] = qkv_tanh_backward(ddx, y, error);
    if (g->in_grads[0] == NULL)
      return FALSE;
  }
  if (g->needs_grad[1]) {
    /* d/dy [dy·(1 - y²)] = -2·dy·y */
    QkvValue *t = qkv_mul(dy, y, error);
    if (t == NULL || (t = qkv_mul(t, ddx, error)) == NULL ||
        (g->in_grads[1] = qkv_scale(t, -2.0, error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------
 * Registration
 * ------------------------------------------------------------------------- */

/* Every op here may run in place: kernels read element i before writing it. */
#define ELEMENTWISE_OP(NAME, DOC, KIND, ...)                                                       \
  QKV_OP(.name = #NAME, .doc = DOC, __VA_ARGS__, .flags = QKV_OP_INPLACE, .shape = KIND##_shape,   \
         .forward = NAME##_forward, .gradient = NAME##_grad)
#define BINARY_DEF(NAME, DOC)                                                                      \
  ELEMENTWISE_OP(NAME, DOC, binary, QKV_INPUTS("a", "b"), QKV_OUTPUTS("y"))
#define UNARY_DEF(NAME, DOC) ELEMENTWISE_OP(NAME, DOC, unary, QKV_INPUTS("x"), QKV_OUTPUTS("y"))
#define BACKWARD_DEF(NAME, DOC)                                                                    \
  ELEMENTWISE_OP(NAME, DOC, backward, QKV_INPUTS("dy", "y"), QKV_OUTPUTS("dx"))

const QkvOpDef qkv_ops_elementwise[] = {
    BINARY_DEF(add, "a + b, with NumPy broadcasting"),
    BINARY_DEF(sub, "a - b, with NumPy broadcasting"),
    BINARY_DEF(mul, "a · b elementwise, with NumPy broadcasting"),
    BINARY_DEF(div, "a / b elementwise, with NumPy broadcasting"),
    /* factor is required: its default of 1 is never read */
    ELEMENTWISE_OP(scale, "x · factor", unary, QKV_INPUTS("x"), QKV_OUTPUTS("y"),
                   QKV_ATTRS({.name = "factor",
                              .type = QKV_ATTR_FLOAT,
                              .required = TRUE,
                              .default_float = 1.0,
                              .doc = "the multiplier"})),
    UNARY_DEF(neg, "-x"),
    UNARY_DEF(relu, "max(x, 0)"),
    UNARY_DEF(sigmoid, "1 / (1 + exp(-x))"),
    UNARY_DEF(tanh, "tanh(x)"),
    UNARY_DEF(exp, "exp(x)"),
    UNARY_DEF(log, "natural logarithm of x"),
    BACKWARD_DEF(relu_backward, "dy · (y > 0), given relu's output y"),
    BACKWARD_DEF(sigmoid_backward, "dy · y · (1 - y), given sigmoid's output y"),
    BACKWARD_DEF(tanh_backward, "dy · (1 - y²), given tanh's output y"),
    QKV_OPS_END,
};

/* ---------------------------------------------------------------------------
 * Typed functions
 * ------------------------------------------------------------------------- */

static QkvValue *
binary_call(const gchar *op_name, QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_MISSING(op_name, error, a, b);
  QkvValue *inputs[] = {a, b};
  return qkv_op_call(op_name, inputs, 2, NULL, error);
}

static QkvValue *
unary_call(const gchar *op_name, QkvValue *x, GError **error)
{
  QKV_RETURN_IF_MISSING(op_name, error, x);
  return qkv_op_call(op_name, &x, 1, NULL, error);
}

QkvValue *
qkv_add(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("add", a, b, error);
}

QkvValue *
qkv_sub(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("sub", a, b, error);
}

QkvValue *
qkv_mul(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("mul", a, b, error);
}

QkvValue *
qkv_div(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("div", a, b, error);
}

QkvValue *
qkv_scale(QkvValue *x, double factor, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("scale", error, x);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "factor", g_variant_new_double(factor));
  return qkv_op_call("scale", &x, 1, g_variant_builder_end(&attrs), error);
}

QkvValue *
qkv_neg(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("neg", x, error);
}

QkvValue *
qkv_relu(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("relu", x, error);
}

QkvValue *
qkv_sigmoid(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("sigmoid", x, error);
}

QkvValue *
qkv_tanh(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("tanh", x, error);
}

QkvValue *
qkv_exp(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("exp", x, error);
}

QkvValue *
qkv_log(QkvValue *x, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return unary_call("log", x, error);
}

QkvValue *
qkv_relu_backward(QkvValue *dy, QkvValue *y, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("relu_backward", dy, y, error);
}

QkvValue *
qkv_sigmoid_backward(QkvValue *dy, QkvValue *y, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("sigmoid_backward", dy, y, error);
}

QkvValue *
qkv_tanh_backward(QkvValue *dy, QkvValue *y, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("tanh_backward", dy, y, error);
}
