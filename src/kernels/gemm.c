/* gemm.c: qkv_sgemm() and the GEMM libraries behind it.
 *
 * OpenBLAS picks its kernels from a table of CPU models: 0.3.21 does not know
 * AMD's Zen 5 and runs its Haswell (AVX2) kernels there, at about half of what
 * the core can do (issue 18). oneDNN's sgemm picks its JIT kernels from the
 * CPU's feature bits instead, so on every CPU with AVX-512 it runs AVX-512
 * code. So, when qkv is built with oneDNN (the Meson option "onednn") and the
 * ISA qkv picked is AVX-512 (QKV_VEC_ISA may force a fallback, and then the
 * GEMM falls back too), products go to dnnl_sgemm(); otherwise, or with
 * QKV_GEMM=openblas, to OpenBLAS. The small-product kernel (smallgemm.c) goes
 * first whatever the backend: it still wins at the shapes it takes.
 *
 * Either library always runs on one thread per call. qkv splits large products
 * into blocks of rows or columns over its own pool (threads.c), so its thread
 * setting is obeyed and no library thread team spins after a call. */
#include "kernels/kernels-private.h"

#include <cblas.h>
#include <string.h>
#include <omp.h>

#include "error-private.h"

#ifdef QKV_HAVE_ONEDNN
#include <dnnl.h>
#endif

typedef enum {
  GEMM_OPENBLAS,
  GEMM_ONEDNN,
} GemmBackend;

static const gchar *const backend_names[] = {"openblas", "onednn"};

/* -1 until the first product (or qkv_set_gemm_backend()) picks one. */
static gint gemm_backend = -1;

/* Below this many multiply-adds splitting a product loses: on the book's
 * model (640×32×32 projections) two threads made a training step 1.5× slower
 * than one. */
#define QKV_GEMM_PARALLEL_MIN (G_GINT64_CONSTANT(1) << 22)

/* oneDNN costs about 250 ns more per call than OpenBLAS (bench/bench-gemm,
 * Zen 4): 16×16×16 takes 340 ns there and 95 ns in OpenBLAS, 32×32×32 850 ns
 * and 615 ns. Products below this many multiply-adds (64×64×64) are that
 * overhead more than arithmetic, whatever the vector width, so they stay on
 * OpenBLAS. */
#define QKV_GEMM_ONEDNN_MIN (G_GINT64_CONSTANT(1) << 18)

/* The thread count of the plan running on this thread (0: none running). */
static __thread gint running_plan_threads = 0;
/* The precision of the plan running on this thread, or of the loop this
 * pool worker runs for it. */
static __thread QkvPrecision running_precision = QKV_PRECISION_FP32;

void
qkv_set_running_plan_threads(gint n_threads)
{
  running_plan_threads = n_threads;
}

void
qkv_set_running_precision(QkvPrecision precision)
{
  running_precision = precision;
}

QkvPrecision
qkv_get_running_precision(void)
{
  return running_precision;
}

#ifdef QKV_HAVE_ONEDNN
/* oneDNN's ISA: DNNL_MAX_CPU_ISA and the CPU, fixed at oneDNN's first query
 * (qkv never sets it), so asked once: qkv_bf16_native() runs per product. */
static dnnl_cpu_isa_t
onednn_isa(void)
{
  static gsize isa = 0; /* the ISA + 1 */
  if (g_once_init_enter(&isa))
    g_once_init_leave(&isa, (gsize)dnnl_get_effective_cpu_isa() + 1);
  return (dnnl_cpu_isa_t)(isa - 1);
}
#endif

/* Whether oneDNN's sgemm would run AVX-512 kernels here: it caps its ISA at
 * DNNL_MAX_CPU_ISA and at what the CPU has. */
static gboolean
onednn_has_avx512(void)
{
#ifdef QKV_HAVE_ONEDNN
  dnnl_cpu_isa_t isa = onednn_isa();
  return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
#else
  return FALSE;
#endif
}

static gboolean
onednn_available(void)
{
#ifdef QKV_HAVE_ONEDNN
  return TRUE;
#else
  return FALSE;
#endif
}

static gint
auto_backend(void)
{
  return onednn_available() && qkv_use_avx512() && onednn_has_avx512() ? GEMM_ONEDNN
                                                                       : GEMM_OPENBLAS;
}

/* name → backend, -1 for an unknown one or one this build lacks. */
static gint
backend_from_name(const gchar *name, gboolean *unknown)
{
  *unknown = FALSE;
  if (name == NULL || g_str_equal(name, "") || g_str_equal(name, "auto"))
    return auto_backend();
  if (g_str_equal(name, "openblas"))
    return GEMM_OPENBLAS;
  if (g_str_equal(name, "onednn"))
    return onednn_available() ? GEMM_ONEDNN : -1;
  *unknown = TRUE;
  return -1;
}

static GemmBackend
current_backend(void)
{
  gint b = g_atomic_int_get(&gemm_backend);
  if (G_LIKELY(b >= 0))
    return (GemmBackend)b;
  /* QKV_GEMM: "auto" (the default), "openblas" or "onednn" */
  const gchar *env = g_getenv("QKV_GEMM");
  gboolean unknown;
  b = backend_from_name(env, &unknown);
  if (b < 0) {
    g_warning("QKV_GEMM=%s: %s; using the default", env,
              unknown ? "unknown GEMM backend (auto, openblas or onednn)"
                      : "this build of qkv has no oneDNN");
    b = auto_backend();
  }
  g_atomic_int_compare_and_exchange(&gemm_backend, -1, b);
  return (GemmBackend)g_atomic_int_get(&gemm_backend);
}

gboolean
qkv_set_gemm_backend(const gchar *name, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  gboolean unknown;
  gint b = backend_from_name(name, &unknown);
  if (b < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_set_gemm_backend: %s “%s” (auto, openblas%s)",
                unknown ? "unknown GEMM backend" : "this build of qkv has no", name,
                onednn_available() ? " or onednn" : "");
    return FALSE;
  }
  g_atomic_int_set(&gemm_backend, b);
  return TRUE;
}

const gchar *
qkv_gemm_backend(void)
{
  return backend_names[current_backend()];
}

const gchar *
qkv_gemm_kernel(void)
{
  if (current_backend() == GEMM_OPENBLAS)
    return openblas_get_corename();
#ifdef QKV_HAVE_ONEDNN
  /* oneDNN's sgemm has JIT kernels for AVX-512 (avx512_core), AVX2 and SSE4.1 */
  dnnl_cpu_isa_t isa = onednn_isa();
  if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core)
    return "jit avx512_core";
  if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2)
    return "jit avx2";
  return "jit sse41 or reference";
#else
  return "none";
#endif
}

gboolean
qkv_bf16_native(const gchar **why)
{
  const gchar *reason;
  gboolean native = FALSE;
#ifdef QKV_HAVE_ONEDNN
  dnnl_cpu_isa_t isa = onednn_isa();
  if (!qkv_use_avx512())
    reason = "QKV_VEC_ISA picked no AVX-512";
  else if (current_backend() != GEMM_ONEDNN)
    reason = "the GEMM backend is OpenBLAS";
  else if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx)
    reason = "oneDNN avx512_core_amx", native = TRUE;
  else if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16)
    reason = "oneDNN avx512_core_bf16", native = TRUE;
  else
    reason = "the CPU has no AVX512_BF16";
#else
  reason = "this build of qkv has no oneDNN";
#endif
  if (why != NULL)
    *why = reason;
  return native;
}

/* OpenBLAS itself always runs on one thread: its OpenMP build would start a
 * libgomp team whose idle workers spin for milliseconds after every call
 * (see threads.c). qkv splits large products over its own pool instead. */
static void
blas_single_thread(void)
{
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    openblas_set_num_threads(1);
    g_once_init_leave(&once, 1);
  }
}

/* A product with one row or one column is a matrix-vector product: OpenBLAS's
 * sgemm packs the whole matrix for it on every call where its small-matrix
 * kernels do not apply (all of Zen's, AVX2), which made a decoding step at
 * batch 1 (1×256 times 256×256) spend 46 % of its time in sgemm_incopy;
 * sgemv reads the matrix once. With β = 0, c is cleared first, so that what
 * the arena held there (even NaN) does not leak into it whatever sgemv does
 * with a zero β. */
static gboolean
openblas_sgemv(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
               float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
               float *c, gint64 ldc)
{
  if (k <= 0 || (m != 1 && n != 1))
    return FALSE;
  if (m == 1) {
    /* c (1×n) = α a op(B) + β c: op(B)ᵀ a, with a's elements lda apart when
     * A is stored transposed (k×1) */
    if (beta == 0.0f)
      memset(c, 0, (gsize)n * sizeof(float));
    cblas_sgemv(CblasRowMajor, transpose_b ? CblasNoTrans : CblasTrans,
                (blasint)(transpose_b ? n : k), (blasint)(transpose_b ? k : n), alpha, b,
                (blasint)MAX(ldb, 1), a, transpose_a ? (blasint)MAX(lda, 1) : 1, beta, c, 1);
    return TRUE;
  }
  /* n == 1: c (m×1, ldc apart) = α op(A) b + β c */
  if (beta == 0.0f)
    for (gint64 i = 0; i < m; i++)
      c[i * ldc] = 0.0f;
  cblas_sgemv(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              (blasint)(transpose_a ? k : m), (blasint)(transpose_a ? m : k), alpha, a,
              (blasint)MAX(lda, 1), b, transpose_b ? 1 : (blasint)MAX(ldb, 1), beta, c,
              (blasint)MAX(ldc, 1));
  return TRUE;
}

static void
openblas_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
               float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
               float *c, gint64 ldc)
{
  if (openblas_sgemv(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
              (blasint)MAX(lda, 1), b, (blasint)MAX(ldb, 1), beta, c, (blasint)MAX(ldc, 1));
}

#ifdef QKV_HAVE_ONEDNN
static gboolean
onednn_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k, float alpha,
             const float *a, gint64 lda, const float *b, gint64 ldb, float beta, float *c,
             gint64 ldc)
{
  return dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a,
                    MAX(lda, 1), b, MAX(ldb, 1), beta, c, MAX(ldc, 1)) == dnnl_success;
}
#endif

/* Both libraries are built on OpenMP here and take their thread count from
 * omp_get_max_threads() of the calling thread, not only from their own
 * setting: OpenBLAS's OpenMP build resets its thread count to that value on
 * every call, and oneDNN reads nothing else. On qkv's pool workers (and on a
 * caller that never lowered it) that is the core count, so each call would
 * start a libgomp team of its own, whose idle workers then spin against
 * qkv's pool. So every call first lowers the calling thread's count to 1 and
 * leaves it there, as openblas_set_num_threads(1) always did on the first
 * caller: qkv's other OpenBLAS calls (the FFN's bias gradients go through
 * cblas_sgemv) rely on it too. Putting the count back after each call made
 * those start teams and cost qkv its 2-thread speed-up. */
static void
backend_sgemm(GemmBackend backend, gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n,
              gint64 k, float alpha, const float *a, gint64 lda, const float *b, gint64 ldb,
              float beta, float *c, gint64 ldc)
{
  if (G_UNLIKELY(omp_get_max_threads() != 1))
    omp_set_num_threads(1);
  gboolean done = FALSE;
#ifdef QKV_HAVE_ONEDNN
  /* oneDNN refuses leading dimensions shorter than a row even where OpenBLAS
   * takes them (an empty k): such a call goes to OpenBLAS, which also does
   * c = β·c for k = 0; and so do small products (QKV_GEMM_ONEDNN_MIN). A
   * split product's blocks are 64 rows or columns of one above the split
   * size, so they stay above it unless k is short. */
  if (backend == GEMM_ONEDNN && k > 0 && m * n * k >= QKV_GEMM_ONEDNN_MIN)
    done = onednn_sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  if (!done) {
    blas_single_thread();
    openblas_sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

typedef struct {
  GemmBackend backend;
  gboolean ta, tb, split_rows;
  gint64 m, n, k, lda, ldb, ldc, block;
  float alpha, beta;
  const float *a, *b;
  float *c;
} GemmJob;

/* Blocks [begin, end) of rows (or columns) of c. */
static void
gemm_blocks(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const GemmJob *j = data;
  if (j->split_rows) {
    gint64 r0 = begin * j->block, r1 = MIN(j->m, end * j->block);
    const float *a = j->ta ? j->a + r0 : j->a + r0 * j->lda;
    backend_sgemm(j->backend, j->ta, j->tb, r1 - r0, j->n, j->k, j->alpha, a, j->lda, j->b, j->ldb,
                  j->beta, j->c + r0 * j->ldc, j->ldc);
  } else {
    gint64 c0 = begin * j->block, c1 = MIN(j->n, end * j->block);
    const float *b = j->tb ? j->b + c0 * j->ldb : j->b + c0;
    backend_sgemm(j->backend, j->ta, j->tb, j->m, c1 - c0, j->k, j->alpha, j->a, j->lda, b, j->ldb,
                  j->beta, j->c + c0, j->ldc);
  }
}

void
qkv_sgemm(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k, float alpha,
          const float *a, gint64 lda, const float *b, gint64 ldb, float beta, float *c, gint64 ldc,
          gint n_threads)
{
  if (m <= 0 || n <= 0)
    return;
  if (n_threads <= 0)
    n_threads = running_plan_threads > 0 ? running_plan_threads : qkv_get_num_threads();
  /* an empty sum (k = 0) only scales c, in any precision */
  if (G_UNLIKELY(running_precision == QKV_PRECISION_BF16) && k > 0)
    qkv_sgemm_bf16(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   n_threads);
  else
    qkv_sgemm_fp32(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   n_threads);
}

void
qkv_sgemm_typed(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
                float alpha, gconstpointer a, QkvDType a_dtype, gint64 lda, gconstpointer b,
                QkvDType b_dtype, gint64 ldb, float beta, float *c, gint64 ldc, gint n_threads)
{
  g_return_if_fail(a_dtype == QKV_F32 || a_dtype == QKV_BF16);
  g_return_if_fail(b_dtype == QKV_F32 || b_dtype == QKV_BF16);
  gboolean a_bf16 = a_dtype == QKV_BF16, b_bf16 = b_dtype == QKV_BF16;
  if (!a_bf16 && !b_bf16) {
    qkv_sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, n_threads);
    return;
  }
  if (m <= 0 || n <= 0)
    return;
  if (n_threads <= 0)
    n_threads = running_plan_threads > 0 ? running_plan_threads : qkv_get_num_threads();
  if (k == 0) /* only scales c: no operand is read */
    qkv_sgemm_fp32(transpose_a, transpose_b, m, n, 0, alpha, a, lda, b, ldb, beta, c, ldc,
                   n_threads);
  else if (running_precision == QKV_PRECISION_BF16)
    qkv_sgemm_bf16_typed(transpose_a, transpose_b, m, n, k, alpha, a, a_bf16, lda, b, b_bf16, ldb,
                         beta, c, ldc, n_threads);
  else
    qkv_sgemm_fp32_typed(transpose_a, transpose_b, m, n, k, alpha, a, a_bf16, lda, b, b_bf16, ldb,
                         beta, c, ldc, n_threads);
}

void
qkv_sgemm_fp32(gboolean transpose_a, gboolean transpose_b, gint64 m, gint64 n, gint64 k,
               float alpha, const float *a, gint64 lda, const float *b, gint64 ldb, float beta,
               float *c, gint64 ldc, gint n_threads)
{
  if (qkv_small_sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  GemmBackend backend = current_backend();
  gint nt = m * n * k < QKV_GEMM_PARALLEL_MIN ? 1 : n_threads;
  if (nt <= 1) {
    backend_sgemm(backend, transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  /* Split the longer side of c into blocks of 64 rows or columns (whole
   * register tiles of any kernel): every element is still one call's dot
   * product over the whole of k. */
  GemmJob job = {backend, transpose_a, transpose_b, m >= n, m,    n, k, lda,
                 ldb,     ldc,         64,          alpha,  beta, a, b, c};
  gint64 blocks = ((job.split_rows ? m : n) + job.block - 1) / job.block;
  qkv_parallel_for((gint)MIN(nt, blocks), blocks, gemm_blocks, &job);
}
