/* flash-attention.h: the memory-efficient attention kernels that
 * dot_product_attention and multi_head_attention run when the caller did not
 * ask for the weights (the ops' "flash" attribute, which the typed builders
 * set then, for weights of 4 MiB or more: qkv_flash_wanted below). The
 * choice is made when the graph is built because a plan has no way to tell
 * a kernel that an output goes unread, and the backward needs to know what
 * the forward saved. Not installed.
 *
 * FlashAttention-2's scheme on the CPU: the scores of one (batch, head)
 * problem are made block_q × block_k at a time and never stored. The
 * forward keeps a running row maximum and row sum (online softmax) and
 * saves, per query row, the maximum m of its masked scores and log Σ
 * exp(s − m) (the row statistics); the backward remakes each block of
 * weights from them as exp((s − m) − log l). Memory is O(T·d) per head instead
 * of O(T²), and dropout on the weights is drawn again from its counter-based
 * key (the same draws as the stored dropout mask of the weights path).
 *
 * The masks are the book's, exactly as the weights path applies them
 * (attention-common.h): a masked score becomes -1e6, so a row without kept
 * keys is uniform over all n_k keys, and a masked score has no gradient.
 * Blocks of keys past every row's valid length (or the causal diagonal) are
 * skipped, since their weights are exactly 0 in float, unless a row's kept
 * scores are all so low that -1e6 is not negligible beside them; such rows
 * (no kept key at all, or a boolean mask that drops every kept key) make
 * the kernel visit every block, as the book's softmax does.
 */
#pragma once

#include "attention-common.h"

/* Default block sizes (rows of queries, keys): a 128 × 128 block of scores
 * is 64 KiB, so it, its gradient and the operand rows stay in L2, and each
 * product is large enough for the GEMM library to run near its peak. */
#define QKV_FLASH_BLOCK_Q 128
#define QKV_FLASH_BLOCK_K 128

/* Where the problems' operands lie: problem idx is batch element idx / heads
 * and head idx % heads; its q block starts at b·q_batch + h·q_head (in
 * floats, row stride pb.ldq), and likewise for k, v and out (and for their
 * gradients, laid out as they are). */
typedef struct {
  QkvAttnProblem pb;
  gint64 heads, n_problems;
  gint64 q_batch, q_head, k_batch, k_head, v_batch, v_head, o_batch, o_head;
  gint64 block_q, block_k; /* ≤ 0: the defaults */
  gboolean dropout_active;
  guint64 key; /* the dropout key, when active */
} QkvFlashLayout;

/* The dropout key output of a flash forward op: i32 (3), the key's low and
 * high 32 bits and whether dropout was active (a plan compiled for training). */
#define QKV_FLASH_KEY_LEN 3

/* Scratch bytes of the forward and the backward for n_threads threads. */
gsize qkv_flash_forward_scratch(gint64 n_q, gint64 n_k, gint64 d, gint64 d_v, gint64 block_q,
                                gint64 block_k, gint n_threads);
gsize qkv_flash_backward_scratch(gint64 n_problems, gint64 n_q, gint64 n_k, gint64 d, gint64 d_v,
                                 gint64 block_q, gint64 block_k, gint n_threads);

/* out = dropout(softmax(masked scores)) v for every problem, and stats (two
 * floats per score row, problem idx's rows from idx·n_q on): the maximum m
 * of the row's masked scores and log Σ exp(s − m). q, k, v are stored as
 * L->pb.q_dtype, k_dtype, v_dtype. */
void qkv_flash_forward(const QkvKernelCtx *ctx, const QkvFlashLayout *L, gconstpointer q,
                       gconstpointer k, gconstpointer v, float *out, float *stats);

/* dq, dk, dv (laid out as q, k, v) from dout (laid out as out), the forward's
 * out and stats. dscores (may be NULL) receives the gradient of the scores
 * (n_problems × n_q × n_k), for an additive mask's gradient. */
void qkv_flash_backward(const QkvKernelCtx *ctx, const QkvFlashLayout *L, gconstpointer q,
                        gconstpointer k, gconstpointer v, const float *out, const float *stats,
                        const float *dout, float *dq, float *dk, float *dv, float *dscores);

/* Write the dropout key of this run (QKV_FLASH_KEY_LEN i32) for dropout p. */
static inline void
qkv_flash_write_key(const QkvKernelCtx *ctx, double p, gint32 *out)
{
  guint64 key = qkv_random_key(ctx->seed, ctx->step, ctx->node_id);
  out[0] = (gint32)(guint32)(key & 0xffffffffu);
  out[1] = (gint32)(guint32)(key >> 32);
  out[2] = qkv_dropout_active(ctx, p) ? 1 : 0;
}

/* Read it back into a layout. */
static inline void
qkv_flash_read_key(QkvFlashLayout *L, const gint32 *in)
{
  L->key = (guint64)(guint32)in[0] | ((guint64)(guint32)in[1] << 32);
  L->dropout_active = in[2] != 0 && L->pb.dropout > 0.0;
}

/* Check the block_q and block_k attributes (0 or more). */
static inline gboolean
qkv_flash_check_blocks(const QkvShapeCtx *ctx, GError **error)
{
  const gchar *names[] = {"block_q", "block_k"};
  for (guint i = 0; i < 2; i++)
    if (qkv_attrs_get_int(ctx->attrs, names[i]) < 0)
      return qkv_shape_error(ctx, error, QKV_ERROR_ATTRIBUTE,
                             "%s must be 0 (the default) or more, got %" G_GINT64_FORMAT, names[i],
                             qkv_attrs_get_int(ctx->attrs, names[i]));
  return TRUE;
}

/* Below this many bytes of weights per node the typed builders keep the
 * weights path: there the weights cost little memory, and keeping them
 * spares the backward their recomputation (one more product per block),
 * which is what small models (the book's, at T ≈ 10) spend their time on. */
#define QKV_FLASH_MIN_WEIGHTS_BYTES (G_GINT64_CONSTANT(1) << 22)

/* The product of n sizes (each 0 or more) in *product; FALSE, and
 * G_MAXINT64 there, when it does not fit a gint64. */
static inline gboolean
qkv_attn_size_product(const gint64 *sizes, guint n, gint64 *product)
{
  gint64 p = 1;
  for (guint i = 0; i < n; i++)
    if (__builtin_mul_overflow(p, sizes[i], &p)) {
      *product = G_MAXINT64;
      return FALSE;
    }
  *product = p;
  return TRUE;
}

/* The attention kernels count the scores (batch · heads · n_q · n_k), their
 * work (that times the features of a product) and their bytes in gint64 and
 * gsize. Sizes whose product does not fit are refused here, where they enter
 * (the shape rules), so that no product further on can overflow: q and k of
 * (2, 2^31, 4) are valid tensors, but their 2^63 scores are not. */
static inline gboolean
qkv_attn_check_sizes(QkvShapeCtx *ctx, gint64 batch, gint64 heads, gint64 n_q, gint64 n_k,
                     gint64 features, GError **error)
{
  const gint64 sizes[] = {batch, heads, n_q, n_k, MAX(features, 1), (gint64)sizeof(float)};
  gint64 bytes;
  if (qkv_attn_size_product(sizes, G_N_ELEMENTS(sizes), &bytes))
    return TRUE;
  return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE,
                         "the attention scores (batch %" G_GINT64_FORMAT ", heads %" G_GINT64_FORMAT
                         ", queries %" G_GINT64_FORMAT ", keys %" G_GINT64_FORMAT
                         ") times %" G_GINT64_FORMAT
                         " features take more than 2^63 bytes of work to count",
                         batch, heads, n_q, n_k, MAX(features, 1));
}

/* Whether a typed builder takes the flash kernel for a node whose weights
 * (not asked for) would take weights_bytes: QKV_FLASH_ATTENTION=1 always,
 * =0 never (for comparisons), otherwise from QKV_FLASH_MIN_WEIGHTS_BYTES. */
static inline gboolean
qkv_flash_wanted(gint64 weights_bytes)
{
  const gchar *env = g_getenv("QKV_FLASH_ATTENTION");
  if (g_strcmp0(env, "0") == 0)
    return FALSE;
  if (g_strcmp0(env, "1") == 0)
    return TRUE;
  return weights_bytes >= QKV_FLASH_MIN_WEIGHTS_BYTES;
}

/* qkv_flash_wanted() for the weights of batch · heads · n_q · n_k floats,
 * computed without overflow (past gint64 they are surely large; the op's
 * shape rule then refuses them). */
static inline gboolean
qkv_flash_wanted_for(gint64 batch, gint64 heads, gint64 n_q, gint64 n_k)
{
  const gint64 sizes[] = {batch, heads, n_q, n_k, (gint64)sizeof(float)};
  gint64 bytes;
  qkv_attn_size_product(sizes, G_N_ELEMENTS(sizes), &bytes);
  return qkv_flash_wanted(bytes);
}
