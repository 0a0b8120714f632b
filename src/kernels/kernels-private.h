/* kernels-private.h: what the kernels layer (src/kernels/) offers the layers
 * above it inside the library (not installed). The kernels depend on nothing
 * in qkv but the public headers. */
#pragma once

#include "qkv/qkv.h"

/* x86 (64 or 32 bit) is the one architecture with AVX2 and AVX-512 variants
 * of the kernels; elsewhere each kernel takes its portable C path, as it does
 * on x86 under QKV_VEC_ISA=scalar. */
#if defined(__x86_64__) || defined(__i386__)
#define QKV_ARCH_X86 1
#endif

/* Zeroed, 64-byte aligned allocation that counts calls (see qkv_alloc_count());
 * NULL when the memory cannot be had (never aborts). */
gpointer qkv_aligned_alloc0(gsize size);
void qkv_aligned_free(gpointer ptr);

/* The executor tells qkv_sgemm() the thread count of the plan it runs. */
void qkv_set_running_plan_threads(gint n_threads);
/* ... and its precision (QKV_PRECISION_FP32 while none runs). The pool
 * (threads.c) gives a loop's workers the precision of the thread that
 * started the loop, so products inside parallel kernels follow it too. */
void qkv_set_running_precision(QkvPrecision precision);
QkvPrecision qkv_get_running_precision(void);

/* ---- bf16 products (gemm-bf16.c) ----------------------------------------
 *
 * A bf16 number is the upper half of a float32; rounding is to nearest even,
 * float32 subnormals become (signed) zero and NaN stays a quiet NaN: what the
 * CPU's VCVTNEPS2BF16 does, so that the emulation and the native path see
 * identical operands. */

/* qkv_sgemm() in bf16 (k > 0): the native path for products large enough,
 * else the operands rounded into float32 scratch and the float32 path. */
void qkv_sgemm_bf16(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                    float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
                    float *c, gint64 ldc, gint n_threads);
/* qkv_sgemm_typed() in bf16 (k > 0) and in fp32 (k > 0): a_bf16, b_bf16
 * say which operands are stored as bf16 bits (ld counting them). */
void qkv_sgemm_bf16_typed(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                          float alpha, gconstpointer a, gboolean a_bf16, gint64 lda,
                          gconstpointer b, gboolean b_bf16, gint64 ldb, float beta, float *c,
                          gint64 ldc, gint n_threads);
void qkv_sgemm_fp32_typed(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                          float alpha, gconstpointer a, gboolean a_bf16, gint64 lda,
                          gconstpointer b, gboolean b_bf16, gint64 ldb, float beta, float *c,
                          gint64 ldc, gint n_threads);
/* The float32 routing of qkv_sgemm() (small kernel, sgemv, oneDNN,
 * OpenBLAS, split over the pool), whatever the running precision. */
void qkv_sgemm_fp32(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                    float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
                    float *c, gint64 ldc, gint n_threads);
/* One block of a native bf16 product on the calling thread: c = α·op(a)·op(b)
 * + β·c with a, b already bf16 (as uint16). FALSE (c untouched) when oneDNN
 * refused it. */
gboolean qkv_bf16_block(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                        float alpha, const guint16 *a, gint64 lda, const guint16 *b, gint64 ldb,
                        float beta, float *c, gint64 ldc);
/* n floats rounded to bf16: as bf16 bits, or as the float32 they stand for. */
void qkv_bf16_round_f32(float *dst, const float *src, gsize n);
/* bf16-cache.c: the executor names the step about to run (NULL after a
 * run's last step); bf16 copies of operands are kept while valid within a
 * run. */
void qkv_set_running_step(const QkvKernelCtx *ctx);
/* The cached bf16 copy of the operand src (rows × cols, rows ld apart),
 * laid out as copy_rows × copy_cols (the operand, then zeros), or NULL; then
 * *slot is where to convert it so that it is kept, or NULL where it may not
 * be. */
const guint16 *qkv_bf16_cache_lookup(const float *src, gint64 rows, gint64 cols, gint64 ld,
                                     gint64 copy_rows, gint64 copy_cols, guint16 **slot);
/* Tests: the limit on a run's cached copies in MiB (0: no cache; else
 * QKV_BF16_CACHE_MB, default 32), and the cache hits so far. */
void qkv_set_bf16_cache_limit(gint mib);
guint64 qkv_bf16_cache_hits(void);
/* Tests: fills the calling thread's conversion and widening buffers with
 * all-ones bytes (NaN as floats and as bf16), so that a product that reads
 * a part of them it did not write shows it. */
void qkv_bf16_poison_scratch(void);
/* Tests: TRUE makes bf16 products take the emulated path even where the CPU
 * has bf16 instructions, and the conversions the portable code. */
void qkv_set_bf16_emulation(gboolean force);
/* Tests: oneDNN primitives the native bf16 path has built so far. */
guint64 qkv_bf16_primitives_built(void);
/* Whether the ISA picked at run time (qkv_vec_isa(), QKV_VEC_ISA may force
 * a fallback) is AVX-512 (F, DQ, VL): kernels with an AVX-512 variant use it. */
gboolean qkv_use_avx512(void);
/* Whether it is AVX2 with FMA (and not AVX-512): kernels with an AVX2
 * variant use it. */
gboolean qkv_use_avx2(void);
/* qkv_sgemm()'s path for small products (src/smallgemm.c): computes c and
 * returns TRUE when the CPU has AVX-512 or AVX2 and the product is one it takes,
 * else (always, off x86) returns FALSE without touching c. */
gboolean qkv_small_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                         float alpha, const float *a, gint64 lda, const float *b, gint64 ldb,
                         float beta, float *c, gint64 ldc);

/* smallgemm-bf16.c: c = α·op(a)·op(b) + β·c with the operands rounded to
 * bf16 (a16, b16: already stored as bf16 bits, ld counting them), by
 * VDPBF16PS (x86 with AVX512_BF16 only: the caller checks), in any layout;
 * scratch holds qkv_small_sgemm_bf16_scratch() bytes. */
gsize qkv_small_sgemm_bf16_scratch(gint64 m, gint64 n, gint64 k);
void qkv_small_sgemm_bf16(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                          float alpha, gconstpointer a, gboolean a16, gint64 lda, gconstpointer b,
                          gboolean b16, gint64 ldb, float beta, float *c, gint64 ldc,
                          gpointer scratch);

/* The slot of QkvKernelCtx.reserved that holds a GError ** (the executor's
 * per-plan failure, NULL between runs) where qkv_kernel_fail() stores the
 * first failure of a run. */
#define QKV_KERNEL_CTX_FAILURE_SLOT 0
