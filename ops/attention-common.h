/* attention-common.h: what masked_softmax, dot_product_attention,
 * multi_head_attention and dropout share (not installed).
 *
 * Masking follows the book's masked_softmax: a masked score is replaced by
 * -1e6 before the softmax. A row always keeps a prefix of its keys (valid
 * lengths and the causal mask both cut the row at some key), so the row
 * kernels take that prefix length. With at least one key kept, exp(-1e6 - max)
 * is exactly 0 in float, so the masked weights are 0; with none kept, every
 * score is -1e6 and the row is uniform, as in the book. (The book's result
 * differs only when the kept scores themselves lie below about -1e6 + 100.)
 * A replaced score has no gradient.
 *
 * A mask input (QkvMaskKind in qkv-nn.h) breaks the prefix rule, so rows
 * with one take the general row kernels (qkv_attn_softmax_masked_row and its
 * backward), which apply the additive mask, then replace every masked score
 * by -1e6 literally, as the book does. Without a mask input the prefix
 * kernels run unchanged: the only cost is a test of QkvAttnMask.values per
 * block of rows.
 */
#pragma once

#include "ops-common.h"

#include <cblas.h>
#include <math.h>

typedef struct {
  float *dst;
  const float *a, *b;
} QkvMulJob;

static inline void
qkv_mul_range(gint64 begin, gint64 end, gint thread, gpointer user_data)
{
  const QkvMulJob *j = user_data;
  for (gint64 i = begin; i < end; i++)
    j->dst[i] = j->a[i] * j->b[i];
}

/* dst[i] = a[i] · b[i] for i < n (applying a dropout mask), on the pool. */
static inline void
qkv_mul_floats(const QkvKernelCtx *ctx, float *dst, const float *a, const float *b, gint64 n)
{
  QkvMulJob job = {dst, a, b};
  qkv_parallel_for(qkv_kernel_threads(ctx, n), n, qkv_mul_range, &job);
}

/* A general mask input (boolean or additive) broadcast to the scores. Its
 * shape is first aligned to the scores' rank (qkv_attn_align_mask); a
 * dimension of 1 then repeats along that axis (stride 0). */
typedef struct {
  const float *data;
  gboolean additive;         /* added to the scores, else nonzero = keep */
  gint rank;                 /* the scores' rank less the key axis */
  gint64 dims[QKV_MAX_RANK]; /* the scores' leading dimensions (rows) */
  gint64 strides[QKV_MAX_RANK];
  gint64 key_stride; /* 0 (one value for every key) or 1 */
} QkvAttnScoreMask;

/* How the rows of a (…, n_q, n_k) score tensor are masked. */
typedef struct {
  const gint32 *lens;    /* valid lengths, or NULL */
  gboolean per_query;    /* lens is (B, n_q), not (B) */
  gint64 rows_per_batch; /* score rows under one leading batch element */
  gint64 n_q;
  gboolean causal; /* key j > query i is masked */
  /* A mask input, or NULL. Without one the kernels take the prefix-only
   * paths below, exactly as before masks existed. */
  const QkvAttnScoreMask *values;
} QkvAttnMask;

/* ---- the optional valid_lens and mask inputs -------------------------------
 *
 * Every attention op ends with optional valid lengths (i32), then, when the
 * mask_kind attribute is not "none", a mask (f32). For dot_product_attention
 * and masked_softmax(_backward) these are the only optional inputs, and
 * QkvAttnSlots is their layout (op-def.h); the other ops have slots structs
 * of their own that end with the same pair. */

/* Where valid_lens and the mask sit (-1: absent) and how many inputs the
 * node has, with the optional ones starting at slot first. */
typedef struct {
  gint valid_lens, mask;
  guint n_inputs;
} QkvAttnSlots;

static inline QkvAttnSlots
qkv_attn_slots(guint first, gboolean valid_lens, gboolean mask)
{
  QkvAttnSlots s = {.n_inputs = first};
  s.valid_lens = qkv_slot_next(&s.n_inputs, valid_lens, 1);
  s.mask = qkv_slot_next(&s.n_inputs, mask, 1);
  return s;
}

/* Whether the mask_kind attribute says a mask input is there. */
static inline gboolean
qkv_attn_has_mask(const QkvAttrs *attrs)
{
  return g_strcmp0(qkv_attrs_get_string(attrs, "mask_kind"), "none") != 0;
}

/* The layout of a node of n_inputs inputs: mask_kind says whether there is
 * a mask, the count whether there are valid lengths; FALSE when the count
 * fits neither. (Telling them apart by the attribute rather than by dtype
 * keeps an f32 valid_lens an error.) */
static inline gboolean
qkv_attn_slots_of(guint first, guint n_inputs, const QkvAttrs *attrs, QkvAttnSlots *s)
{
  for (gint valid_lens = 0; valid_lens < 2; valid_lens++) {
    *s = qkv_attn_slots(first, valid_lens, qkv_attn_has_mask(attrs));
    if (s->n_inputs == n_inputs)
      return TRUE;
  }
  return FALSE;
}

/* Adds to a backward node's attributes those it takes over unchanged from
 * the forward node: causal, mask_kind and the flash ones. */
static inline void
qkv_attn_pass_on_attrs(GVariantBuilder *b, const QkvAttrs *forward)
{
  g_variant_builder_add(b, "{sv}", "causal",
                        g_variant_new_boolean(qkv_attrs_get_bool(forward, "causal")));
  g_variant_builder_add(b, "{sv}", "mask_kind",
                        g_variant_new_string(qkv_attrs_get_string(forward, "mask_kind")));
  g_variant_builder_add(b, "{sv}", "flash",
                        g_variant_new_boolean(qkv_attrs_get_bool(forward, "flash")));
  g_variant_builder_add(b, "{sv}", "block_q",
                        g_variant_new_int64(qkv_attrs_get_int(forward, "block_q")));
  g_variant_builder_add(b, "{sv}", "block_k",
                        g_variant_new_int64(qkv_attrs_get_int(forward, "block_k")));
}

/* The score value that a masked key gets (the book's). */
#define QKV_ATTN_MASKED_SCORE (-1e6f)

/* ---- attribute specs the attention ops share -------------------------------
 *
 * Written once here; each op's schema (op-def.h) lists those it takes. */

/* dot_product_attention and multi_head_attention. */
#define QKV_ATTN_CAUSAL_ATTR QKV_BOOL_ATTR("causal", FALSE, "mask key j > query i")
#define QKV_ATTN_DROPOUT_ATTR                                                                      \
  QKV_FLOAT_ATTR("dropout", 0.0,                                                                   \
                 "dropout probability on the attention weights (training only), in [0, 1)")
/* STATS is the shape of the row statistics, KEY_OUTPUT the index of the
 * dropout output, both as string literals. */
#define QKV_ATTN_FLASH_ATTR(STATS, KEY_OUTPUT)                                                     \
  QKV_BOOL_ATTR("flash", FALSE,                                                                    \
                "memory-efficient kernel (the typed builder's choice when no weights are asked "   \
                "for): output 1 is the row statistics " STATS " of the masked scores (maximum m, " \
                "log Σ exp(s − m)) instead of the weights, and output " KEY_OUTPUT                 \
                " (dropout > 0) the dropout key, i32 (3), instead of the mask")
/* The flash kernels' block sizes, forward and backward. */
#define QKV_ATTN_FLASH_BLOCK_ATTRS                                                                 \
  QKV_INT_ATTR("block_q", 0, "flash: query rows per block (0: 128)"),                              \
      QKV_INT_ATTR("block_k", 0, "flash: keys per block (0: 128)")

/* Those two and masked_softmax: which mask input there is. */
#define QKV_ATTN_MASK_KIND_ATTR                                                                    \
  QKV_STRING_ATTR("mask_kind", "none",                                                             \
                  "\"none\" (no mask input), \"boolean\" (the last input is a mask: 0 = masked "   \
                  "out, its score becomes -1e6; nonzero = kept) or \"additive\" (the last input "  \
                  "is added to the scores before the softmax; differentiable)")

/* Their backward ops. SCORES is the shape of the scores, a string literal. */
#define QKV_ATTN_GRAD_OUT_ATTR                                                                     \
  QKV_BOOL_ATTR("grad_out", TRUE, "dout (the gradient of out) is an input")
#define QKV_ATTN_GRAD_WEIGHTS_ATTR                                                                 \
  QKV_BOOL_ATTR("grad_weights", FALSE,                                                             \
                "dweights (a gradient reaching the weights output) is an input")
#define QKV_ATTN_FORWARD_MASK_KIND_ATTR QKV_STRING_ATTR("mask_kind", "none", "the forward op's")
#define QKV_ATTN_GRAD_MASK_ATTR(SCORES)                                                            \
  QKV_BOOL_ATTR("grad_mask", FALSE,                                                                \
                "also output dscores " SCORES ", the gradient of the scores, from which an "       \
                "additive mask's gradient is summed")

/* The mask_kind attribute for a QkvMaskKind; an unknown value gives a name
 * the shape rule refuses. */
static inline const gchar *
qkv_attn_mask_kind_name(QkvMaskKind kind)
{
  switch (kind) {
  case QKV_MASK_BOOLEAN:
    return "boolean";
  case QKV_MASK_ADDITIVE:
    return "additive";
  }
  return "unknown";
}

/* mask_kind as a boolean: TRUE for "additive". */
static inline gboolean
qkv_attn_mask_additive(const QkvAttrs *attrs)
{
  return g_strcmp0(qkv_attrs_get_string(attrs, "mask_kind"), "additive") == 0;
}

/* Check the mask_kind attribute. */
static inline gboolean
qkv_attn_check_mask_kind(const QkvShapeCtx *ctx, GError **error)
{
  const gchar *kind = qkv_attrs_get_string(ctx->attrs, "mask_kind");
  if (g_strcmp0(kind, "none") != 0 && g_strcmp0(kind, "boolean") != 0 &&
      g_strcmp0(kind, "additive") != 0)
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                           "mask_kind must be \"none\", \"boolean\" or \"additive\", got \"%s\"",
                           kind != NULL ? kind : "(null)");
  return TRUE;
}

/* The mask's shape aligned to scores of rank `rank`: leading 1s are added
 * (NumPy's right alignment), except that with per_batch_rank3 (multi-head
 * attention, scores (B, H, n_q, n_k)) a rank-3 mask is (B, n_q, n_k), shared
 * by the heads like valid lengths, and becomes (B, 1, n_q, n_k). FALSE when
 * the mask's rank is 0 or above rank. */
static inline gboolean
qkv_attn_align_mask(const QkvShape *mask, gint rank, gboolean per_batch_rank3, QkvShape *aligned)
{
  if (mask->rank < 1 || mask->rank > rank)
    return FALSE;
  aligned->rank = rank;
  if (per_batch_rank3 && rank == 4 && mask->rank == 3) {
    aligned->dims[0] = mask->dims[0];
    aligned->dims[1] = 1;
    aligned->dims[2] = mask->dims[1];
    aligned->dims[3] = mask->dims[2];
    return TRUE;
  }
  gint lead = rank - mask->rank;
  for (gint d = 0; d < rank; d++)
    aligned->dims[d] = d < lead ? 1 : mask->dims[d - lead];
  return TRUE;
}

/* Check the mask input at index (f32, broadcasting to scores as above). */
static inline gboolean
qkv_attn_check_mask(const QkvShapeCtx *ctx, guint index, const QkvShape *scores,
                    gboolean per_batch_rank3, GError **error)
{
  if (ctx->in_dtypes[index] != QKV_F32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "mask must be f32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[index]));
  const QkvShape *m = &ctx->in_shapes[index];
  QkvShape a;
  gboolean ok = qkv_attn_align_mask(m, scores->rank, per_batch_rank3, &a);
  for (gint d = 0; ok && d < scores->rank; d++)
    ok = a.dims[d] == 1 || a.dims[d] == scores->dims[d];
  if (!ok) {
    g_autofree gchar *ms = qkv_shape_to_string(m);
    g_autofree gchar *ss = qkv_shape_to_string(scores);
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                           "mask %s does not broadcast to the scores %s (%s)", ms, ss,
                           per_batch_rank3 ? "(n_k), (n_q, n_k), (B, n_q, n_k) shared by the "
                                             "heads, or (B, H, n_q, n_k), each axis 1 or full"
                                           : "right-aligned, each axis 1 or full");
  }
  return TRUE;
}

/* The kernel's description of a mask view (checked by qkv_attn_check_mask)
 * against scores of shape `scores`. */
static inline void
qkv_attn_score_mask_init(QkvAttnScoreMask *s, const QkvView *mask, const QkvShape *scores,
                         gboolean per_batch_rank3, gboolean additive)
{
  QkvShape a;
  qkv_attn_align_mask(&mask->shape, scores->rank, per_batch_rank3, &a);
  s->data = mask->data;
  s->additive = additive;
  s->rank = scores->rank - 1;
  gint64 stride = 1;
  for (gint d = scores->rank - 1; d >= 0; d--) {
    gint64 st = a.dims[d] == 1 ? 0 : stride;
    if (d == scores->rank - 1)
      s->key_stride = st;
    else {
      s->dims[d] = scores->dims[d];
      s->strides[d] = st;
    }
    stride *= a.dims[d];
  }
}

/* The mask values of score row r (with stride key_stride). */
static inline const float *
qkv_attn_mask_row(const QkvAttnScoreMask *s, gint64 r)
{
  gint64 off = 0;
  for (gint d = s->rank - 1; d >= 0; d--) {
    off += (r % s->dims[d]) * s->strides[d];
    r /= s->dims[d];
  }
  return s->data + off;
}

/* Whether key j of a row (mask values mrow, limit from the valid lengths and
 * causal) keeps its score. */
static inline gboolean
qkv_attn_key_kept(const QkvAttnScoreMask *s, const float *mrow, gint64 j, gint64 limit)
{
  return j < limit && (s->additive || mrow[j * s->key_stride] != 0.0f);
}

/* The softmax of row r with a mask input: additive values are added, then
 * every masked score (beyond the limit, or 0 in a boolean mask) becomes
 * -1e6, as the book's masked_softmax does, so a row without kept keys comes
 * out uniform. y may equal x. */
static inline void
qkv_attn_softmax_masked_row(float *y, const float *x, gint64 n, gint64 limit,
                            const QkvAttnScoreMask *s, gint64 r)
{
  if (n <= 0)
    return;
  const float *mrow = qkv_attn_mask_row(s, r);
  const gint64 ks = s->key_stride;
  for (gint64 j = 0; j < n; j++) {
    float v = x[j];
    if (j >= limit)
      v = QKV_ATTN_MASKED_SCORE;
    else if (s->additive)
      v += mrow[j * ks];
    else if (mrow[j * ks] == 0.0f)
      v = QKV_ATTN_MASKED_SCORE;
    y[j] = v;
  }
  float mx = y[0];
  for (gint64 j = 1; j < n; j++)
    mx = y[j] > mx ? y[j] : mx;
  for (gint64 j = 0; j < n; j++)
    y[j] -= mx;
  qkv_vec_exp(y, y, (gsize)n);
  float sum = 0.0f;
  for (gint64 j = 0; j < n; j++)
    sum += y[j];
  float inv = 1.0f / sum;
  for (gint64 j = 0; j < n; j++)
    y[j] *= inv;
}

/* dx = y · (dy − Σ dy·y) at the kept keys of row r, 0 at the masked ones
 * (their scores were replaced by a constant). For an additive mask dx is
 * also the gradient of the mask's value there. dx may equal dy. */
static inline void
qkv_attn_softmax_backward_masked_row(float *dx, const float *dy, const float *y, gint64 n,
                                     gint64 limit, const QkvAttnScoreMask *s, gint64 r)
{
  const float *mrow = qkv_attn_mask_row(s, r);
  float dot = 0.0f;
  for (gint64 j = 0; j < n; j++)
    dot += dy[j] * y[j];
  for (gint64 j = 0; j < n; j++)
    dx[j] = qkv_attn_key_kept(s, mrow, j, limit) ? y[j] * (dy[j] - dot) : 0.0f;
}

/* The number of keys row r keeps (a prefix of its n_k keys). */
static inline gint64
qkv_attn_row_limit(const QkvAttnMask *m, gint64 r, gint64 n_k)
{
  gint64 limit = n_k;
  gint64 i = r % m->n_q;
  if (m->lens != NULL) {
    gint64 b = r / m->rows_per_batch;
    gint64 len = m->per_query ? m->lens[b * m->n_q + i] : m->lens[b];
    limit = MIN(limit, len);
  }
  if (m->causal)
    limit = MIN(limit, i + 1);
  return MAX(limit, 0);
}

/* y = masked softmax of one row x of n scores, keeping the first limit; y
 * may equal x. */
static inline void
qkv_attn_softmax_row(float *y, const float *x, gint64 n, gint64 limit)
{
  if (limit <= 0) {
    float u = n > 0 ? 1.0f / (float)n : 0.0f;
    for (gint64 j = 0; j < n; j++)
      y[j] = u;
    return;
  }
  float m = x[0];
  for (gint64 j = 1; j < limit; j++)
    m = x[j] > m ? x[j] : m;
  for (gint64 j = 0; j < limit; j++)
    y[j] = x[j] - m;
  qkv_vec_exp(y, y, (gsize)limit);
  float sum = 0.0f;
  for (gint64 j = 0; j < limit; j++)
    sum += y[j];
  float inv = 1.0f / sum;
  for (gint64 j = 0; j < limit; j++)
    y[j] *= inv;
  for (gint64 j = limit; j < n; j++)
    y[j] = 0.0f;
}

/* The masked softmax of n_rows consecutive rows of n scores (score rows
 * first_row … of the tensor m describes); y may equal x. Same numbers as
 * qkv_attn_softmax_row, with one exp call over the whole block, which is
 * what makes short rows (n of 10 or so) cheap: masked keys enter the exp as
 * -inf (giving 0), a row without kept keys as zeros (giving a uniform row). */
static inline void
qkv_attn_softmax_rows(float *y, const float *x, gint64 n_rows, gint64 n, const QkvAttnMask *m,
                      gint64 first_row)
{
  if (n <= 0 || n_rows <= 0)
    return;
  if (m->values != NULL) {
    for (gint64 i = 0; i < n_rows; i++)
      qkv_attn_softmax_masked_row(y + i * n, x + i * n, n,
                                  MIN(qkv_attn_row_limit(m, first_row + i, n), n), m->values,
                                  first_row + i);
    return;
  }
  for (gint64 i = 0; i < n_rows; i++) {
    const float *xr = x + i * n;
    float *yr = y + i * n;
    gint64 limit = MIN(qkv_attn_row_limit(m, first_row + i, n), n);
    if (limit <= 0) {
      for (gint64 j = 0; j < n; j++)
        yr[j] = 0.0f;
      continue;
    }
    float mx = xr[0];
    for (gint64 j = 1; j < limit; j++)
      mx = xr[j] > mx ? xr[j] : mx;
    for (gint64 j = 0; j < limit; j++)
      yr[j] = xr[j] - mx;
    for (gint64 j = limit; j < n; j++)
      yr[j] = -INFINITY;
  }
  qkv_vec_exp(y, y, (gsize)(n_rows * n));
  for (gint64 i = 0; i < n_rows; i++) {
    float *yr = y + i * n;
    float sum = 0.0f;
    for (gint64 j = 0; j < n; j++)
      sum += yr[j];
    float inv = 1.0f / sum;
    for (gint64 j = 0; j < n; j++)
      yr[j] *= inv;
  }
}

/* dx = y · (dy − Σ dy·y) over the kept prefix of one row, 0 for masked keys
 * (their scores were replaced by a constant); dx may equal dy. */
static inline void
qkv_attn_softmax_backward_row(float *dx, const float *dy, const float *y, gint64 n, gint64 limit)
{
  limit = MIN(limit, n);
  float dot = 0.0f;
  for (gint64 j = 0; j < limit; j++)
    dot += dy[j] * y[j];
  for (gint64 j = 0; j < limit; j++)
    dx[j] = y[j] * (dy[j] - dot);
  for (gint64 j = MAX(limit, 0); j < n; j++)
    dx[j] = 0.0f;
}

/* Validate a dropout probability attribute. */
static inline gboolean
qkv_attn_check_dropout(const QkvShapeCtx *ctx, const gchar *name, GError **error)
{
  double p = qkv_attrs_get_float(ctx->attrs, name);
  if (!(p >= 0.0 && p < 1.0))
    return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE, "%s must be in [0, 1), got %g", name,
                           p);
  return TRUE;
}

/* Whether a kernel applies dropout of probability p. */
static inline gboolean
qkv_dropout_active(const QkvKernelCtx *ctx, double p)
{
  return ctx->training && p > 0.0;
}

/* The dropout scale mask for elements first .. first + n - 1 of a tensor: 0
 * with probability p, else 1/(1-p). The same (seed, step, node) and element
 * give the same draw. Without dropout active, all ones. */
static inline void
qkv_dropout_fill_mask(const QkvKernelCtx *ctx, double p, float *mask, gint64 first, gint64 n)
{
  if (!qkv_dropout_active(ctx, p)) {
    for (gint64 j = 0; j < n; j++)
      mask[j] = 1.0f;
    return;
  }
  guint64 key = qkv_random_key(ctx->seed, ctx->step, ctx->node_id);
  qkv_random_dropout_mask(key, (guint64)first, (gsize)n, (float)p, mask);
}

/* Check valid_lens (i32, (B) or (B, n_q)) against scores of shape (B, …, n_q,
 * n_k); sets *per_query. */
static inline gboolean
qkv_attn_check_valid_lens(const QkvShapeCtx *ctx, guint index, gint64 batch, gint64 n_q,
                          gboolean *per_query, GError **error)
{
  const QkvShape *vl = &ctx->in_shapes[index];
  if (ctx->in_dtypes[index] != QKV_I32)
    return qkv_shape_error(ctx, error, QKV_ERROR_DTYPE, "valid_lens must be i32, got %s",
                           qkv_dtype_name(ctx->in_dtypes[index]));
  if (vl->rank == 1 && vl->dims[0] == batch) {
    *per_query = FALSE;
    return TRUE;
  }
  if (vl->rank == 2 && vl->dims[0] == batch && vl->dims[1] == n_q) {
    *per_query = TRUE;
    return TRUE;
  }
  return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                         "valid_lens must be (%" G_GINT64_FORMAT ") or (%" G_GINT64_FORMAT
                         ", %" G_GINT64_FORMAT ") (batch, or batch and queries)",
                         batch, batch, n_q);
}

/* A mask description from a kernel's valid_lens view (may be NULL). */
static inline QkvAttnMask
qkv_attn_mask_from_view(const QkvView *valid_lens, gint64 rows_per_batch, gint64 n_q,
                        gboolean causal)
{
  QkvAttnMask m = {0};
  m.lens = valid_lens != NULL ? valid_lens->data : NULL;
  m.per_query = valid_lens != NULL && valid_lens->shape.rank == 2;
  m.rows_per_batch = MAX(rows_per_batch, 1);
  m.n_q = MAX(n_q, 1);
  m.causal = causal;
  return m;
}

/* ---- scaled dot-product attention of one (batch, head) problem ---------- */

/* The sizes of one problem and the row strides (leading dimensions) of its
 * operands, which may be column blocks of wider matrices (one head of a
 * multi-head projection). P, the dropout mask and the scratch matrices are
 * contiguous n_q × n_k. */
typedef struct {
  gint64 n_q, n_k, d, d_v;
  gint64 ldq, ldk, ldv, ldo;
  float scale; /* 1/√d */
  double dropout;
  QkvAttnMask mask;
  /* How q, k and v are stored: QKV_F32 (zero, the default), or QKV_BF16
   * where a plan keeps multi-head attention's projections in bf16 (bf16
   * activations: they only feed products). Every other operand is f32. */
  QkvDType q_dtype, k_dtype, v_dtype;
} QkvAttnProblem;

/* Element `at` of an operand stored as dtype (QKV_F32 or QKV_BF16) that
 * starts at base. */
static inline gconstpointer
qkv_attn_operand_at(gconstpointer base, QkvDType dtype, gint64 at)
{
  gsize elem = dtype == QKV_BF16 ? sizeof(guint16) : sizeof(float);
  return (const guint8 *)base + (gsize)at * elem;
}

static inline void
qkv_attn_sgemm(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const float *a,
               gint64 lda, const float *b, gint64 ldb, float beta, float *c, gint64 ldc)
{
  qkv_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 0);
}

/* qkv_attn_sgemm() with operands in either storage (qkv_sgemm_typed()). */
static inline void
qkv_attn_sgemm_typed(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha,
                     gconstpointer a, QkvDType a_dtype, gint64 lda, gconstpointer b,
                     QkvDType b_dtype, gint64 ldb, float beta, float *c, gint64 ldc)
{
  qkv_sgemm_typed(ta, tb, m, n, k, alpha, a, a_dtype, lda, b, b_dtype, ldb, beta, c, ldc, 0);
}

/* Forward of problem index `index` (its rows are rows index·n_q … of the
 * score tensor): p = masked_softmax(q kᵀ · scale), out = dropout(p) v.
 * drop (may be NULL: no dropout output) receives the dropout mask; pd is
 * n_q × n_k scratch, used when dropout is active. q, k, v are stored as
 * pb->q_dtype, k_dtype, v_dtype. */
static inline void
qkv_attn_forward_problem(const QkvKernelCtx *ctx, const QkvAttnProblem *pb, gint64 index,
                         gconstpointer q, gconstpointer k, gconstpointer v, float *p, float *drop,
                         float *pd, float *out)
{
  gint64 n_q = pb->n_q, n_k = pb->n_k;
  qkv_attn_sgemm_typed(FALSE, TRUE, n_q, n_k, pb->d, pb->scale, q, pb->q_dtype, pb->ldq, k,
                       pb->k_dtype, pb->ldk, 0.0f, p, n_k);
  qkv_attn_softmax_rows(p, p, n_q, n_k, &pb->mask, index * n_q);
  const float *a = p;
  if (drop != NULL) {
    qkv_dropout_fill_mask(ctx, pb->dropout, drop, index * n_q * n_k, n_q * n_k);
    if (qkv_dropout_active(ctx, pb->dropout)) {
      for (gint64 j = 0; j < n_q * n_k; j++)
        pd[j] = p[j] * drop[j];
      a = pd;
    }
  }
  if (n_k == 0) {
    for (gint64 i = 0; i < n_q; i++)
      memset(out + i * pb->ldo, 0, (gsize)pb->d_v * sizeof(float));
    return;
  }
  qkv_attn_sgemm_typed(FALSE, FALSE, n_q, pb->d_v, n_k, 1.0f, a, QKV_F32, n_k, v, pb->v_dtype,
                       pb->ldv, 0.0f, out, pb->ldo);
}

/* Zero an m × n block with row stride ld. */
static inline void
qkv_attn_zero_block(float *x, gint64 m, gint64 n, gint64 ld)
{
  for (gint64 i = 0; i < m; i++)
    memset(x + i * ld, 0, (gsize)n * sizeof(float));
}

/* Backward of one problem. dout (may be NULL: zero) is n_q × d_v with row
 * stride ldo; dweights (may be NULL) is a gradient reaching p directly; drop
 * is the saved dropout mask (NULL: none). dq, dk, dv have the strides of q,
 * k, v. pd and dp are n_q × n_k scratch; dp ends up holding the gradient of
 * the scores q kᵀ·scale (+ an additive mask), which is how the ops output
 * an additive mask's gradient: they pass an output block as dp. q, k, v
 * are stored as pb->q_dtype, k_dtype, v_dtype. */
static inline void
qkv_attn_backward_problem(const QkvAttnProblem *pb, gint64 index, const float *dout,
                          gconstpointer q, gconstpointer k, gconstpointer v, const float *p,
                          const float *drop, const float *dweights, float *pd, float *dp, float *dq,
                          float *dk, float *dv)
{
  gint64 n_q = pb->n_q, n_k = pb->n_k, nn = n_q * n_k;
  const float *a = p;
  if (drop != NULL) {
    for (gint64 j = 0; j < nn; j++)
      pd[j] = p[j] * drop[j];
    a = pd;
  }
  if (dout != NULL && n_q > 0) {
    qkv_attn_sgemm(TRUE, FALSE, n_k, pb->d_v, n_q, 1.0f, a, n_k, dout, pb->ldo, 0.0f, dv, pb->ldv);
    if (pb->d_v > 0)
      qkv_attn_sgemm_typed(FALSE, TRUE, n_q, n_k, pb->d_v, 1.0f, dout, QKV_F32, pb->ldo, v,
                           pb->v_dtype, pb->ldv, 0.0f, dp, n_k);
    else
      memset(dp, 0, (gsize)nn * sizeof(float));
    if (drop != NULL)
      for (gint64 j = 0; j < nn; j++)
        dp[j] *= drop[j];
  } else {
    qkv_attn_zero_block(dv, n_k, pb->d_v, pb->ldv);
    memset(dp, 0, (gsize)nn * sizeof(float));
  }
  if (dweights != NULL)
    for (gint64 j = 0; j < nn; j++)
      dp[j] += dweights[j];
  for (gint64 i = 0; i < n_q; i++) {
    gint64 limit = qkv_attn_row_limit(&pb->mask, index * n_q + i, n_k);
    if (pb->mask.values != NULL)
      qkv_attn_softmax_backward_masked_row(dp + i * n_k, dp + i * n_k, p + i * n_k, n_k, limit,
                                           pb->mask.values, index * n_q + i);
    else
      qkv_attn_softmax_backward_row(dp + i * n_k, dp + i * n_k, p + i * n_k, n_k, limit);
  }
  if (n_k > 0)
    qkv_attn_sgemm_typed(FALSE, FALSE, n_q, pb->d, n_k, pb->scale, dp, QKV_F32, n_k, k, pb->k_dtype,
                         pb->ldk, 0.0f, dq, pb->ldq);
  else
    qkv_attn_zero_block(dq, n_q, pb->d, pb->ldq);
  if (n_q > 0)
    qkv_attn_sgemm_typed(TRUE, FALSE, n_k, pb->d, n_q, pb->scale, dp, QKV_F32, n_k, q, pb->q_dtype,
                         pb->ldq, 0.0f, dk, pb->ldk);
  else
    qkv_attn_zero_block(dk, n_k, pb->d, pb->ldk);
}

/* Below this many multiply-adds per problem and with at least as many
 * problems as threads, problems run in parallel on the pool (qkv_sgemm runs
 * on the calling thread inside a pool chunk); otherwise one after the other
 * with qkv_sgemm splitting each product. */
#define QKV_ATTN_SMALL_PROBLEM (256 * 256 * 256)
/* Below this many multiply-adds in all (per product), the problems run on one
 * thread: waking a team costs more than it saves, and OpenBLAS calls inside a
 * parallel region were seen to stall for milliseconds on a 2-vCPU VM. */
#define QKV_ATTN_PARALLEL_MIN (1 << 18)

/* Threads to spread n_problems of `work` multiply-adds each over, given
 * scratch for at most scratch_size / per_thread threads (the plan may have
 * been given more threads after it sized the scratch). Returns 1 for the
 * sequential path. */
static inline gint
qkv_attn_problem_threads(const QkvKernelCtx *ctx, gint64 n_problems, gint64 work, gsize per_thread,
                         gsize scratch_available)
{
  gint nt = MAX(ctx->n_threads, 1);
  if (per_thread > 0)
    nt = (gint)MIN((gsize)nt, MAX(scratch_available / per_thread, (gsize)1));
  if (nt <= 1 || n_problems * work < QKV_ATTN_PARALLEL_MIN ||
      (n_problems < nt && work >= QKV_ATTN_SMALL_PROBLEM))
    return 1;
  /* a multiply-add is two units of work */
  nt = MIN(nt, qkv_work_threads(nt, 2 * n_problems * work));
  return (gint)MIN((gint64)nt, MAX(n_problems, 1));
}
