/* qkv-plugin-kernel.h: what kernels call (part of qkv-plugin.h): parallel
 * loops on qkv's thread pool, the GEMM and its backends, vectorised math,
 * sparse backward, and counter-based random numbers. */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-plugin-op.h"

G_BEGIN_DECLS

/**
 * QkvRangeFunc:
 * @begin: the begin
 * @end: the end
 * @thread_index: the thread index
 * @user_data: data given with the callback
 *
 * Run body(begin, end, thread_index, user_data) over [0, n) split into
 * contiguous chunks, one per thread (up to ctx->n_threads), on qkv's thread
 * pool. Chunk i is [n·i/t, n·(i+1)/t) for t chunks, so results that depend on
 * the split depend only on the thread count.
 */
typedef void (*QkvRangeFunc)(gint64 begin, gint64 end, gint thread_index, gpointer user_data);
/**
 * qkv_kernel_parallel_for: (skip)
 * @ctx: a #QkvKernelCtx
 * @n: the n
 * @body: the body
 * @user_data: (closure): data for the callback
 *
 * Kernel parallel for.
 */
QKV_API
void qkv_kernel_parallel_for(const QkvKernelCtx *ctx, gint64 n, QkvRangeFunc body,
                             gpointer user_data);
/**
 * qkv_parallel_for: (skip)
 * @n_threads: the n threads
 * @n: the n
 * @body: the body
 * @user_data: (closure): data for the callback
 *
 * The same with an explicit thread count (≤ 1: on the calling thread). Loops
 * started from inside a pool chunk, or while another thread's loop holds the
 * pool, run on the calling thread. Idle pool threads spin for at most
 * QKV_SPIN_US microseconds (default 50) and then sleep.
 */
QKV_API
void qkv_parallel_for(gint n_threads, gint64 n, QkvRangeFunc body, gpointer user_data);
/**
 * qkv_kernel_threads: (skip)
 * @ctx: a #QkvKernelCtx
 * @work: the work
 *
 * How many of ctx->n_threads a loop of work units (about one simple float
 * operation each) should use: 1 below the size where waking a thread costs
 * more than it saves, so that small kernels never fork.
 *
 * Returns: the gint
 */
QKV_API
gint qkv_kernel_threads(const QkvKernelCtx *ctx, gint64 work);
/**
 * qkv_work_threads:
 * @n_threads: the n threads
 * @work: the work
 *
 * The same for a thread budget of n_threads.
 *
 * Returns: the gint
 */
QKV_API
gint qkv_work_threads(gint n_threads, gint64 work);

/**
 * qkv_sgemm: (skip)
 * @transpose_a: the transpose a
 * @transpose_b: the transpose b
 * @m: the m
 * @n: the n
 * @k: the k
 * @alpha: the alpha
 * @a: the a
 * @lda: the lda
 * @b: the b
 * @ldb: the ldb
 * @beta: the beta
 * @c: (out) (optional): where to store the c, or %NULL
 * @ldc: the ldc
 * @n_threads: the n threads
 *
 * c = alpha·op(a)·op(b) + beta·c, row-major, through the GEMM backend below
 * (small products through qkv's own AVX-512 kernel). Products below
 * about 4 M multiply-adds run on one thread (splitting them costs more than it
 * saves); larger ones use up to n_threads (≤ 0: the thread count of the plan
 * running on this thread, else qkv_get_num_threads()). Inside a parallel
 * region it always runs on the calling thread. lda, ldb, ldc are the stored
 * rows' lengths.
 */
QKV_API
void qkv_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
               float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
               float *c, gint64 ldc, gint n_threads);

/**
 * qkv_sgemm_typed: (skip)
 * @transpose_a: the transpose a
 * @transpose_b: the transpose b
 * @m: the m
 * @n: the n
 * @k: the k
 * @alpha: the alpha
 * @a: the a: floats, or bfloat16 bits where @a_dtype is QKV_BF16
 * @a_dtype: QKV_F32 or QKV_BF16
 * @lda: the lda, in elements
 * @b: the b, as @a
 * @b_dtype: QKV_F32 or QKV_BF16
 * @ldb: the ldb, in elements
 * @beta: the beta
 * @c: (out) (optional): where to store the c, or %NULL
 * @ldc: the ldc
 * @n_threads: the n threads
 *
 * qkv_sgemm() with operands that may be stored as bfloat16 (an activation
 * that a plan keeps in bf16, QkvOpDef.bf16_outputs). In bf16 precision the
 * result has the bits qkv_sgemm() gives on the same values in float32 (the
 * operands are rounded to bf16 there anyway); in fp32 the bf16 values are
 * widened (exactly) and multiplied in float32. Any other dtype logs a
 * critical and leaves c unchanged.
 */
QKV_API
void qkv_sgemm_typed(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                     float alpha, gconstpointer a, QkvDType a_dtype, gint64 lda, gconstpointer b,
                     QkvDType b_dtype, gint64 ldb, float beta, float *c, gint64 ldc,
                     gint n_threads);

/**
 * qkv_bf16_from_floats: (skip)
 * @dst: (array length=n): the bfloat16 bits
 * @src: (array length=n): the floats
 * @n: how many
 *
 * Rounds n floats to bfloat16 as bf16 precision does everywhere: to
 * nearest even, float32 subnormals to signed zero, NaN stays NaN.
 */
QKV_API
void qkv_bf16_from_floats(guint16 *dst, const float *src, gsize n);

/**
 * qkv_bf16_to_floats: (skip)
 * @dst: (array length=n): the floats
 * @src: (array length=n): the bfloat16 bits
 * @n: how many
 *
 * Widens n bfloat16 values to float32 (exact: every bf16 value is a float).
 */
QKV_API
void qkv_bf16_to_floats(float *dst, const guint16 *src, gsize n);

/**
 * qkv_sgemm_operand_final: (skip)
 * @data: (array length=n_floats): the floats
 * @n_floats: how many
 *
 * A kernel's promise that it writes data[0 .. n_floats) no more until it
 * returns, so that qkv_sgemm() in bf16 precision may convert those floats
 * once for every product of the kernel that reads them (it keeps a copy per
 * plan run of inputs, never of what the running kernel may still write: its
 * outputs and scratch). Call it for an output or a scratch matrix that is
 * complete and that two or more products read; anywhere else (fp32, outside
 * a plan run) it does nothing. Breaking the promise makes later products
 * read stale values.
 */
QKV_API
void qkv_sgemm_operand_final(const float *data, gsize n_floats);

/**
 * qkv_gemm_backend:
 *
 * The GEMM library behind qkv_sgemm(): "onednn" (its JIT kernels follow the
 * CPU's features; the default where qkv was built with it and picked AVX-512;
 * products under 64×64×64 multiply-adds, where its per-call cost dominates,
 * still go to OpenBLAS) or "openblas" (the fallback; QKV_GEMM=openblas forces
 * it).
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_gemm_backend(void);
/**
 * qkv_gemm_kernel:
 *
 * The kernels that backend runs: "jit avx512_core" and the like for oneDNN,
 * OpenBLAS's core type (e.g. "Haswell") for OpenBLAS.
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_gemm_kernel(void);
/**
 * qkv_bf16_native:
 * @why: (out) (optional) (transfer none): the why
 *
 * Whether bf16 products (QKV_PRECISION_BF16, qkv-plan.h) run on the CPU's
 * bf16 instructions: TRUE where qkv was built with oneDNN, the GEMM backend
 * is oneDNN and the CPU has AVX512_BF16 (or AMX); FALSE where qkv emulates
 * them (rounds the operands to bf16 and multiplies in float32). *why (if
 * why is not NULL) gets a static phrase saying what decided it, e.g.
 * "oneDNN avx512_core_amx" or "the CPU has no AVX512_BF16".
 *
 * Returns: %TRUE or %FALSE, as described above
 */
QKV_API
gboolean qkv_bf16_native(const gchar **why);
/**
 * qkv_set_gemm_backend:
 * @name: the name
 * @error: return location for a #GError, or %NULL
 *
 * Picks the backend by name, as QKV_GEMM does: "auto", "openblas" or
 * "onednn". FALSE with QKV_ERROR_INVALID_ARGUMENT for an unknown name or one
 * this build lacks. Call it while no product runs (benchmarks, tests).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_set_gemm_backend(const gchar *name, GError **error);

/**
 * qkv_vec_exp: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * Vector math over n floats (dst may equal src), through SLEEF's widest
 * vector functions the CPU supports, with a scalar fallback.
 */
QKV_API
void qkv_vec_exp(float *dst, const float *src, gsize n);
/**
 * qkv_vec_tanh: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * See qkv_vec_exp().
 */
QKV_API
void qkv_vec_tanh(float *dst, const float *src, gsize n);
/**
 * qkv_vec_erf: (skip)
 * @dst: (out) (optional): where to store the dst, or %NULL
 * @src: (array length=n): the src, @n of them
 * @n: the number of @src
 *
 * See qkv_vec_exp().
 */
QKV_API
void qkv_vec_erf(float *dst, const float *src, gsize n);
/**
 * qkv_vec_isa:
 *
 * The ISA picked at run time: "avx512f", "avx2" or "scalar".
 *
 * Returns: (transfer none): the string
 */
QKV_API
const gchar *qkv_vec_isa(void);

/**
 * QkvSparseBackward:
 * @QKV_SPARSE_BACKWARD_OFF: off
 * @QKV_SPARSE_BACKWARD_AUTO: auto
 * @QKV_SPARSE_BACKWARD_ALWAYS: always
 *
 * Sparse backward: whether backward kernels may run their products over the
 * rows of a gradient that are not all zero (padded positions under a masked
 * loss) instead of over every row. The result is the same up to the order of
 * float sums. AUTO (the default) does it where the product is large enough
 * to pay for gathering the rows; ALWAYS wherever a row is zero (for tests);
 * OFF never. The environment variable QKV_SPARSE_BACKWARD=0 starts it OFF.
 * Process-wide; change it between runs, not during one.
 */
typedef enum {
  QKV_SPARSE_BACKWARD_OFF,
  QKV_SPARSE_BACKWARD_AUTO,
  QKV_SPARSE_BACKWARD_ALWAYS,
} QkvSparseBackward;
/**
 * qkv_set_sparse_backward:
 * @mode: the mode
 *
 * Set sparse backward. A value that is not a QkvSparseBackward leaves the
 * mode unchanged and logs a critical: a value a user gives goes to
 * qkv_try_set_sparse_backward().
 */
QKV_API
void qkv_set_sparse_backward(QkvSparseBackward mode);
/**
 * qkv_try_set_sparse_backward:
 * @mode: the mode
 * @error: return location for a #GError, or %NULL
 *
 * qkv_set_sparse_backward() that refuses a value that is not a
 * QkvSparseBackward (QKV_SPARSE_BACKWARD_OFF, QKV_SPARSE_BACKWARD_AUTO or
 * QKV_SPARSE_BACKWARD_ALWAYS) with QKV_ERROR_INVALID_ARGUMENT naming it (the
 * mode unchanged).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_try_set_sparse_backward(QkvSparseBackward mode, GError **error);
/**
 * qkv_get_sparse_backward:
 *
 * See qkv_set_sparse_backward().
 *
 * Returns: the #QkvSparseBackward
 */
QKV_API
QkvSparseBackward qkv_get_sparse_backward(void);

/**
 * qkv_random_uniform:
 * @key: the key
 * @counter: the counter
 *
 * Counter-based random numbers: a uniform float in [0, 1) for (key, counter).
 *
 * Returns: the float
 */
QKV_API
float qkv_random_uniform(guint64 key, guint64 counter);
/**
 * qkv_random_dropout_mask: (skip)
 * @key: the key
 * @first: the first
 * @n: the n
 * @p: the p
 * @mask: (out) (optional): where to store the mask, or %NULL
 *
 * A dropout mask for counters first .. first + n - 1: mask[j] is 0 where
 * qkv_random_uniform(key, first + j) < p, else 1/(1-p). Vectorised; the same
 * numbers as the scalar draws.
 */
QKV_API
void qkv_random_dropout_mask(guint64 key, guint64 first, gsize n, float p, float *mask);
/**
 * qkv_random_key:
 * @seed: the seed
 * @step: the step
 * @node_id: the node id
 *
 * Mix seed, step and node id into one key.
 *
 * Returns: the guint64
 */
QKV_API
guint64 qkv_random_key(guint64 seed, guint64 step, guint32 node_id);

G_END_DECLS
