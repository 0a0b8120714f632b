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

/* The slot of QkvKernelCtx.reserved that holds a GError ** (the executor's
 * per-plan failure, NULL between runs) where qkv_kernel_fail() stores the
 * first failure of a run. */
#define QKV_KERNEL_CTX_FAILURE_SLOT 0
