/* compare.c: elementwise comparisons ("eq", "ne", "lt", "le", "gt", "ge")
 * giving 1 or 0 in f32, and the elementwise "maximum" and "minimum", all with
 * NumPy broadcasting.
 *
 * Comparisons take two f32 or two i32 inputs (ids == pad_id makes a mask)
 * and follow IEEE rules: NaN compares unequal to everything, itself
 * included, so only "ne" is 1 there. Their output is piecewise constant in
 * the inputs, so their gradient is zero: the rule gives none, and a loss
 * that reaches an input only through a comparison leaves it a zero gradient.
 *
 * maximum and minimum propagate NaN (either input NaN gives NaN), as
 * PyTorch's do. Their gradient goes to the input that was picked; where the
 * two are equal each gets half, which is PyTorch's convention (and keeps
 * maximum(x, x) = x with gradient 1). Where an input is NaN both get the
 * whole gradient, as in PyTorch too.
 */
#include "broadcast-common.h"
#include "error-private.h"

typedef enum {
  CMP_EQ,
  CMP_NE,
  CMP_LT,
  CMP_LE,
  CMP_GT,
  CMP_GE,
  CMP_MAXIMUM,
  CMP_MINIMUM,
} CmpKind;

typedef struct {
  CmpKind kind;
  QkvDType dtype;
  float *out;
  gconstpointer a, b;
} CmpJob;

/* The inner loop for one kind and element type; EXPR sees x and y. */
#define CMP_LOOP(T, EXPR)                                                                          \
  do {                                                                                             \
    const T *a = (const T *)j->a + in_off[0], *b = (const T *)j->b + in_off[1];                    \
    const gint64 sa = in_step[0], sb = in_step[1];                                                 \
    _Pragma("omp simd") for (gint64 k = 0; k < len; k++)                                           \
    {                                                                                              \
      T x = a[k * sa], y = b[k * sb];                                                              \
      out[k] = (EXPR);                                                                             \
    }                                                                                              \
  } while (0)

#define CMP_CASES(T)                                                                               \
  switch (j->kind) {                                                                               \
  case CMP_EQ:                                                                                     \
    CMP_LOOP(T, x == y ? 1.0f : 0.0f);                                                             \
    break;                                                                                         \
  case CMP_NE:                                                                                     \
    CMP_LOOP(T, x != y ? 1.0f : 0.0f);                                                             \
    break;                                                                                         \
  case CMP_LT:                                                                                     \
    CMP_LOOP(T, x < y ? 1.0f : 0.0f);                                                              \
    break;                                                                                         \
  case CMP_LE:                                                                                     \
    CMP_LOOP(T, x <= y ? 1.0f : 0.0f);                                                             \
    break;                                                                                         \
  case CMP_GT:                                                                                     \
    CMP_LOOP(T, x > y ? 1.0f : 0.0f);                                                              \
    break;                                                                                         \
  case CMP_GE:                                                                                     \
    CMP_LOOP(T, x >= y ? 1.0f : 0.0f);                                                             \
    break;                                                                                         \
  default:                                                                                         \
    break;                                                                                         \
  }

static void
cmp_row(gpointer data, gint64 out_off, const gint64 *in_off, const gint64 *in_step, gint64 len)
{
  const CmpJob *j = data;
  float *out = j->out + out_off;
  if (j->kind == CMP_MAXIMUM) {
    /* x != x is NaN: it wins; a NaN y wins through the false x > y. */
    CMP_LOOP(float, (x != x || x > y) ? x : y);
  } else if (j->kind == CMP_MINIMUM) {
    CMP_LOOP(float, (x != x || x < y) ? x : y);
  } else if (j->dtype == QKV_I32) {
    CMP_CASES(gint32);
  } else {
    CMP_CASES(float);
  }
}

static void
cmp_run(const QkvKernelCtx *ctx, CmpKind kind)
{
  const QkvShape *ins[] = {&ctx->in[0].shape, &ctx->in[1].shape};
  QkvBcast b;
  qkv_bcast_init(&b, &ctx->out[0].shape, ins, 2);
  CmpJob job = {kind, ctx->in[0].dtype, ctx->out[0].data, ctx->in[0].data, ctx->in[1].data};
  qkv_bcast_run(ctx, &b, cmp_row, &job);
}

#define DEFINE_FORWARD(NAME, KIND)                                                                 \
  static void NAME##_forward(const QkvKernelCtx *ctx)                                              \
  {                                                                                                \
    cmp_run(ctx, KIND);                                                                            \
  }

DEFINE_FORWARD(eq, CMP_EQ)
DEFINE_FORWARD(ne, CMP_NE)
DEFINE_FORWARD(lt, CMP_LT)
DEFINE_FORWARD(le, CMP_LE)
DEFINE_FORWARD(gt, CMP_GT)
DEFINE_FORWARD(ge, CMP_GE)
DEFINE_FORWARD(maximum, CMP_MAXIMUM)
DEFINE_FORWARD(minimum, CMP_MINIMUM)

static gboolean
compare_shape(QkvShapeCtx *ctx, GError **error)
{
  for (guint i = 0; i < 2; i++)
    if (ctx->in_dtypes[i] != QKV_F32 && ctx->in_dtypes[i] != QKV_I32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32 or i32",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
  if (ctx->in_dtypes[0] != ctx->in_dtypes[1])
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE,
                           "a is %s but b is %s (cast one of them first)",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  return qkv_bcast_shapes(ctx, 2, &ctx->out_shapes[0], error);
}

static gboolean
select_shape(QkvShapeCtx *ctx, GError **error)
{
  for (guint i = 0; i < 2; i++)
    if (ctx->in_dtypes[i] != QKV_F32)
      return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "%s is %s, expected f32",
                             qkv_input_name(ctx, i), qkv_dtype_name(ctx->in_dtypes[i]));
  return qkv_bcast_shapes(ctx, 2, &ctx->out_shapes[0], error);
}

/* A comparison is flat almost everywhere: no gradient reaches a or b. */
static gboolean
compare_grad(QkvGradCtx *g, GError **error)
{
  return TRUE;
}

/* For maximum (pick_a = gt) or minimum (pick_a = lt): a gets dy where it won,
 * dy/2 on ties, 0 where it lost; b the same the other way round. Built from
 * comparisons and where, so it is differentiable again. */
static gboolean
select_grad(QkvGradCtx *g, gboolean is_maximum, GError **error)
{
  QkvValue *a = g->inputs[0], *b = g->inputs[1], *dy = g->out_grads[0];
  if (dy == NULL)
    return TRUE;
  QkvValue *zero = qkv_graph_scalar(g->graph, 0.0f);
  QkvValue *tie = qkv_eq(a, b, error);
  QkvValue *half = tie ? qkv_scale(dy, 0.5, error) : NULL;
  QkvValue *shared = half ? qkv_where(tie, half, dy, error) : NULL;
  if (shared == NULL)
    return FALSE;
  for (guint i = 0; i < 2; i++) {
    if (!g->needs_grad[i])
      continue;
    /* Input i lost where it is below the other (maximum) or above it
     * (minimum). */
    gboolean below = is_maximum == (i == 0);
    QkvValue *lost = below ? qkv_lt(a, b, error) : qkv_gt(a, b, error);
    QkvValue *gi = lost ? qkv_where(lost, zero, shared, error) : NULL;
    if (gi == NULL || (g->in_grads[i] = qkv_grad_to_input(gi, g->inputs[i], error)) == NULL)
      return FALSE;
  }
  return TRUE;
}

static gboolean
maximum_grad(QkvGradCtx *g, GError **error)
{
  return select_grad(g, TRUE, error);
}

static gboolean
minimum_grad(QkvGradCtx *g, GError **error)
{
  return select_grad(g, FALSE, error);
}

#define COMPARE_DEF(NAME, DOC)                                                                     \
  QKV_OP(.name = #NAME, .doc = DOC, QKV_INPUTS("a", "b"), QKV_OUTPUTS("y"),                        \
         .shape = compare_shape, .forward = NAME##_forward, .gradient = compare_grad)
#define SELECT_DEF(NAME, DOC)                                                                      \
  QKV_OP(.name = #NAME, .doc = DOC, QKV_INPUTS("a", "b"), QKV_OUTPUTS("y"),                        \
         .flags = QKV_OP_INPLACE, .shape = select_shape, .forward = NAME##_forward,                \
         .gradient = NAME##_grad)

const QkvOpDef qkv_ops_compare[] = {
    COMPARE_DEF(eq, "1 where a == b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    COMPARE_DEF(ne, "1 where a != b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    COMPARE_DEF(lt, "1 where a < b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    COMPARE_DEF(le, "1 where a <= b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    COMPARE_DEF(gt, "1 where a > b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    COMPARE_DEF(ge, "1 where a >= b, else 0 (f32; inputs f32 or i32, broadcast); no gradient"),
    SELECT_DEF(maximum, "the larger of a and b elementwise (NaN wins), broadcast; gradient to "
                        "the larger, split in half on ties"),
    SELECT_DEF(minimum, "the smaller of a and b elementwise (NaN wins), broadcast; gradient to "
                        "the smaller, split in half on ties"),
    QKV_OPS_END,
};

/* ---- typed functions ---------------------------------------------------- */

/* A NULL input is an earlier call's failure: pass it on, leaving its error
 * the one the caller sees. */
static QkvValue *
binary_call(const gchar *op_name, QkvValue *a, QkvValue *b, GError **error)
{
  if (a == NULL || b == NULL)
    return NULL;
  QkvValue *inputs[] = {a, b};
  return qkv_op_call(op_name, inputs, 2, NULL, error);
}

QkvValue *
qkv_eq(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("eq", a, b, error);
}

QkvValue *
qkv_ne(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("ne", a, b, error);
}

QkvValue *
qkv_lt(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("lt", a, b, error);
}

QkvValue *
qkv_le(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("le", a, b, error);
}

QkvValue *
qkv_gt(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("gt", a, b, error);
}

QkvValue *
qkv_ge(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("ge", a, b, error);
}

QkvValue *
qkv_maximum(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("maximum", a, b, error);
}

QkvValue *
qkv_minimum(QkvValue *a, QkvValue *b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  return binary_call("minimum", a, b, error);
}
