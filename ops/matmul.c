/* matmul.c: "matmul", batched matrix products through cblas_sgemm.
 *
 * a (…, M, K) · b (…, K, N) → (…, M, N), with optional transposes of the last
 * two axes of either side. The batch axes of a and b are equal, or one side
 * is a plain matrix shared by the whole batch (a weight).
 */
#include "ops-common.h"

#include <cblas.h>
#include "error-private.h"

/* Below this many multiply-adds per product, splitting each product costs
 * more than it gains, so batches of such products are split across the pool
 * instead (qkv_sgemm then runs on the calling thread inside each chunk).
 * Bigger products are run one after the other, each split by qkv_sgemm over
 * the plan's thread count. */
#define MATMUL_SMALL_PRODUCT (128 * 128 * 128)

/* The sizes of one product: op(a) is (m, k), op(b) is (k, n). */
typedef struct {
  gint64 m, k, n;
} MatmulDims;

static MatmulDims
matmul_dims(const QkvShape *a, const QkvShape *b, gboolean ta, gboolean tb, gint64 *kb)
{
  MatmulDims d;
  d.m = ta ? a->dims[a->rank - 1] : a->dims[a->rank - 2];
  d.k = ta ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
  d.n = tb ? b->dims[b->rank - 2] : b->dims[b->rank - 1];
  if (kb != NULL)
    *kb = tb ? b->dims[b->rank - 1] : b->dims[b->rank - 2];
  return d;
}

static gboolean
matmul_shape(QkvShapeCtx *ctx, GError **error)
{
  const QkvShape *a = &ctx->in_shapes[0], *b = &ctx->in_shapes[1];
  gboolean ta = qkv_attrs_get_bool(ctx->attrs, "transpose_a");
  gboolean tb = qkv_attrs_get_bool(ctx->attrs, "transpose_b");

  if (ctx->in_dtypes[0] != QKV_F32 || ctx->in_dtypes[1] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "a and b must be f32, got %s and %s",
                           qkv_dtype_name(ctx->in_dtypes[0]), qkv_dtype_name(ctx->in_dtypes[1]));
  if (a->rank < 2 || b->rank < 2)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "a and b must have rank 2 or more, got ranks %d and %d", a->rank,
                           b->rank);

  gint64 kb;
  MatmulDims d = matmul_dims(a, b, ta, tb, &kb);
  if (d.k != kb)
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "inner dimensions differ: K = %" G_GINT64_FORMAT
                           " (a) vs %" G_GINT64_FORMAT " (b)",
                           d.k, kb);

  if (a->rank > 2 && b->rank > 2) {
    gboolean same = a->rank == b->rank;
    for (gint i = 0; same && i < a->rank - 2; i++)
      same = a->dims[i] == b->dims[i];
    if (!same)
      return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                             "batch axes differ (they must be equal, or one side must be a "
                             "rank-2 matrix)");
  }

  const QkvShape *batched = a->rank >= b->rank ? a : b;
  QkvShape *out = &ctx->out_shapes[0];
  *out = *batched;
  out->dims[out->rank - 2] = d.m;
  out->dims[out->rank - 1] = d.n;
  return TRUE;
}

static void
sgemm(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, const float *a, const float *b,
      float *c)
{
  /* leading dimensions of the stored (not transposed) matrices */
  qkv_sgemm(ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n, 0);
}

typedef struct {
  gboolean ta, tb;
  MatmulDims d;
  const float *a, *b;
  float *c;
  gint64 stride_a, stride_b, stride_c;
} MatmulBatchJob;

static void
matmul_batch_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const MatmulBatchJob *j = user_data;
  for (gint64 i = begin; i < end; i++)
    sgemm(j->ta, j->tb, j->d.m, j->d.n, j->d.k, j->a + i * j->stride_a, j->b + i * j->stride_b,
          j->c + i * j->stride_c);
}

static void
matmul_forward(const QkvKernelCtx *ctx)
{
  const QkvView *a = &ctx->in[0], *b = &ctx->in[1];
  QkvView *c = &ctx->out[0];
  gboolean ta = qkv_attrs_get_bool(ctx->attrs, "transpose_a");
  gboolean tb = qkv_attrs_get_bool(ctx->attrs, "transpose_b");
  MatmulDims d = matmul_dims(&a->shape, &b->shape, ta, tb, NULL);
  const float *pa = a->data, *pb = b->data;
  float *pc = c->data;

  gint64 batch = 1;
  for (gint i = 0; i < c->shape.rank - 2; i++)
    batch *= c->shape.dims[i];
  if (batch == 0 || d.m == 0 || d.n == 0)
    return;
  if (d.k == 0) {
    memset(pc, 0, (gsize)(batch * d.m * d.n) * sizeof(float));
    return;
  }

  /* A batched a times a shared b is one tall product: the batch rows of a
   * (and of c) are contiguous when a is not transposed. */
  if (batch == 1 || (b->shape.rank == 2 && !ta)) {
    sgemm(ta, tb, batch * d.m, d.n, d.k, pa, pb, pc);
    return;
  }

  gint64 stride_a = a->shape.rank > 2 ? d.m * d.k : 0;
  gint64 stride_b = b->shape.rank > 2 ? d.k * d.n : 0;
  gint64 stride_c = d.m * d.n;
  gint64 work = d.m * d.n * d.k;
  if (work < MATMUL_SMALL_PRODUCT && ctx->n_threads > 1) {
    MatmulBatchJob job = {ta, tb, d, pa, pb, pc, stride_a, stride_b, stride_c};
    /* a multiply-add is two units of work */
    qkv_parallel_for(qkv_kernel_threads(ctx, 2 * batch * work), batch, matmul_batch_range, &job);
  } else {
    for (gint64 i = 0; i < batch; i++)
      sgemm(ta, tb, d.m, d.n, d.k, pa + i * stride_a, pb + i * stride_b, pc + i * stride_c);
  }
}

/* Sum x over its leading (batch) axes, leaving the last two: the gradient of
 * a matrix shared across the batch. */
static QkvValue *
sum_batch_axes(QkvValue *x, GError **error)
{
  gint axes[QKV_MAX_RANK];
  gint rank = qkv_value_shape(x)->rank;
  for (gint i = 0; i < rank - 2; i++)
    axes[i] = i;
  return qkv_sum(x, axes, (guint)(rank - 2), FALSE, error);
}

/* x (…, R, C) as one (rows, C) matrix. */
static QkvValue *
fold_rows(QkvValue *x, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  gint64 rows = 1;
  for (gint i = 0; i < s->rank - 1; i++)
    rows *= s->dims[i];
  /* -1: the rows follow x's leading dims when a plan runs on smaller inputs */
  QkvShape shape =
      QKV_SHAPE(rows > 0 && s->dims[s->rank - 1] > 0 ? -1 : rows, s->dims[s->rank - 1]);
  return qkv_reshape(x, &shape, error);
}

/* With C = op(A) · op(B): d op(A) = dC · op(B)ᵀ and d op(B) = op(A)ᵀ · dC, and
 * a transposed input takes the transpose of that. */
static gboolean
matmul_grad(QkvGradCtx *g, GError **error)
{
  QkvValue *a = g->inputs[0], *b = g->inputs[1], *dc = g->out_grads[0];
  gboolean ta = qkv_attrs_get_bool(g->attrs, "transpose_a");
  gboolean tb = qkv_attrs_get_bool(g->attrs, "transpose_b");
  gint ra = qkv_value_shape(a)->rank, rb = qkv_value_shape(b)->rank;

  if (dc == NULL)
    return TRUE;

  if (g->needs_grad[0]) {
    QkvValue *da = ta ? qkv_matmul(b, dc, tb, TRUE, error) : qkv_matmul(dc, b, FALSE, !tb, error);
    if (da != NULL && ra == 2 && rb > 2)
      da = sum_batch_axes(da, error);
    if (da == NULL)
      return FALSE;
    g->in_grads[0] = da;
  }

  if (g->needs_grad[1]) {
    QkvValue *db;
    if (rb == 2 && ra > 2 && !ta) {
      /* The sum over the batch of the per-batch products is one product of
       * the folded matrices: Σ Aᵢᵀ dCᵢ = A₂ᵀ dC₂. */
      QkvValue *a2 = fold_rows(a, error);
      QkvValue *dc2 = a2 != NULL ? fold_rows(dc, error) : NULL;
      if (dc2 == NULL)
        return FALSE;
      db = tb ? qkv_matmul(dc2, a2, TRUE, FALSE, error) : qkv_matmul(a2, dc2, TRUE, FALSE, error);
    } else {
      db = tb ? qkv_matmul(dc, a, TRUE, ta, error) : qkv_matmul(a, dc, !ta, FALSE, error);
      if (db != NULL && rb == 2 && ra > 2)
        db = sum_batch_axes(db, error);
    }
    if (db == NULL)
      return FALSE;
    g->in_grads[1] = db;
  }
  return TRUE;
}

const QkvOpDef qkv_ops_matmul[] = {
    QKV_OP(.name = "matmul",
           .doc = "a (…, M, K) · b (…, K, N) with optional transposes of the last two axes; the "
                  "batch axes are equal or one side is a shared rank-2 matrix",
           QKV_INPUTS("a", "b"), QKV_OUTPUTS("c"),
           QKV_ATTRS(QKV_BOOL_ATTR("transpose_a", FALSE, "use the transpose of a's last two axes"),
                     QKV_BOOL_ATTR("transpose_b", FALSE, "use the transpose of b's last two axes")),
           .shape = matmul_shape, .forward = matmul_forward, .gradient = matmul_grad),
    QKV_OPS_END,
};

QkvValue *
qkv_matmul(QkvValue *a, QkvValue *b, gboolean transpose_a, gboolean transpose_b, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  QKV_RETURN_IF_MISSING("matmul", error, a, b);
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "transpose_a", g_variant_new_boolean(transpose_a));
  g_variant_builder_add(&attrs, "{sv}", "transpose_b", g_variant_new_boolean(transpose_b));
  QkvValue *inputs[] = {a, b};
  return qkv_op_call("matmul", inputs, 2, g_variant_builder_end(&attrs), error);
}
