/* gemm-bf16.c: qkv_sgemm() for plans in bf16 precision (QkvPrecision).
 *
 * Both paths compute one thing: the two operands rounded to bf16, then the
 * products, which are exact in float32 (8 by 8 significant bits fit in 24),
 * summed in float32. They differ only in the order of the float32 sums, so
 * a result agrees across machines to within float32 summation error.
 *
 * Native (qkv_bf16_native(): oneDNN, its backend picked, and a CPU with
 * AVX512_BF16 or AMX): the operands are converted into per-thread scratch
 * as bf16 and multiplied by oneDNN's matmul primitive, bf16 × bf16 → float32
 * (oneDNN 2.6 has no BLAS-like bf16 call). α is the primitive's output scale
 * and β a sum post-op, so c = α·op(a)·op(b) + β·c is one pass. Building a
 * primitive costs far more than running a small one, so each thread keeps
 * the primitives of the shapes it met (MATMUL_CACHE of them, the least
 * recently used one replaced), with their memory objects, whose data
 * pointers are set per call. Large products are split over the pool in
 * blocks of rows or columns, as the float32 path does. Copies of operands
 * that stay valid through a plan run are kept for the run (bf16-cache.c).
 *
 * Emulated (everywhere else, and for products too small to pay for a
 * primitive call): the operands are rounded into float32 scratch and go the
 * float32 path (qkv_sgemm_fp32()), so the small-product kernel, sgemv and
 * the split over the pool apply unchanged.
 *
 * Scratch: each thread's operand copies live in one buffer that grows to the
 * largest product the thread has seen and is freed when the thread ends, so
 * a plan's first bf16 run allocates and later runs at the same shapes do not. */
#include "kernels/kernels-private.h"

#include <omp.h>
#include <string.h>
/* outside any target region, so that each intrinsic keeps its own ISA */
#ifdef QKV_ARCH_X86
#include <immintrin.h>
#endif

#ifdef QKV_HAVE_ONEDNN
#include <dnnl.h>
#endif

/* Below this many multiply-adds the native path costs more in per-call
 * overhead (the primitive lookup and oneDNN's dispatch) than it saves: with
 * 2^14 the attention heads of config M (32×32×32) went native and the step
 * took 0.39 s instead of 0.27 (AMX, bench-transformer); 2^16 gave 0.277. The
 * same point as the float32 route to oneDNN (gemm.c). */
#define BF16_NATIVE_MIN (G_GINT64_CONSTANT(1) << 18)
/* Native products below this many multiply-adds run on one thread: AMX runs
 * them about four times faster than float32, so splitting pays later. */
#define BF16_PARALLEL_MIN (G_GINT64_CONSTANT(1) << 24)
/* Conversions of fewer elements than this run on one thread. */
#define BF16_CONVERT_PARALLEL_MIN (G_GINT64_CONSTANT(1) << 17)
/* Primitives each thread keeps (a product cut into chunks uses several). */
#define MATMUL_CACHE 128

/* Chunks: few shapes for products whose size changes. The ops skip the
 * rows of a gradient that are zero (ops-common.h), so a backward product's m
 * or k follows the batch's padding and changes from run to run. Each new
 * shape needs a primitive of its own, and building one (JIT code included)
 * took 0.4-0.9 ms on a Zen 5 against the tens of microseconds a run of one
 * takes: config M built about 16 a step. So m and k of 64 or more are cut
 * into chunks of 64·2^i, largest first, and a rest rounded up to a multiple
 * of 16: a bounded set of shapes per n (at most 6 + 4 for m or k up to
 * 4095). The rows past m are the zero rows of op(a)'s copy, multiplied into
 * a scratch block of c; the columns past k are zeros in both copies and add
 * exact zeros. The cut depends on the shape alone, so a product gives the
 * same bits every time. Aligned shapes (m = 2048) stay one call; the cost
 * elsewhere is a few calls more (m = 1000: 512, 256, 128, 64 and 40 rows in
 * 48), each reading c again when k is cut. */
#define CHUNK_MIN 64
#define CHUNK_ROUND 16

/* The length of m or k in the copies of the operands: room for the rest's
 * rounding once the dimension is cut into chunks. */
static gint64
round_to_chunk(gint64 d)
{
  return (d + CHUNK_ROUND - 1) / CHUNK_ROUND * CHUNK_ROUND;
}

static gint64
padded_dim(gint64 d)
{
  return d < CHUNK_MIN ? d : round_to_chunk(d);
}

static gint force_emulation = FALSE; /* atomic; tests */
static guint64 primitives_built = 0; /* atomic; tests */

guint64
qkv_bf16_primitives_built(void)
{
  return __atomic_load_n(&primitives_built, __ATOMIC_RELAXED);
}

void
qkv_set_bf16_emulation(gboolean force)
{
  g_atomic_int_set(&force_emulation, force ? TRUE : FALSE);
}

/* ---- rounding ------------------------------------------------------------ */

/* The bf16 bits of x: subnormals flush to signed zero, NaN stays quiet NaN,
 * the rest rounds to nearest even (an overflow rounds to infinity). */
static inline guint16
bf16_bits(float x)
{
  guint32 u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0)
    u &= 0x80000000u;
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (guint16)((u >> 16) | 0x40u);
  return (guint16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* A conversion of rows × cols floats, rows ld apart, into dense rows (as
 * bf16 bits or as rounded floats). Each is defined inside its ISA's target
 * region, so that the row loop inlines the vector code: attention's
 * per-head operands are rows of 8 to 64 floats. */
typedef void (*ConvertRows)(gpointer dst, const float *src, gint64 rows, gint64 cols, gint64 ld);

#define DEFINE_CONVERT_ROWS(NAME, ONE, TYPE)                                                       \
  static void NAME(gpointer dst, const float *src, gint64 rows, gint64 cols, gint64 ld)            \
  {                                                                                                \
    TYPE *d = dst;                                                                                 \
    for (gint64 r = 0; r < rows; r++)                                                              \
      ONE(d + r * cols, src + r * ld, (gsize)cols);                                                \
  }

static inline void
from_f32_scalar(guint16 *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = bf16_bits(src[i]);
}

static inline void
round_f32_scalar(float *dst, const float *src, gsize n)
{
  for (gsize i = 0; i < n; i++) {
    guint32 u = (guint32)bf16_bits(src[i]) << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}

DEFINE_CONVERT_ROWS(from_rows_scalar, from_f32_scalar, guint16)
DEFINE_CONVERT_ROWS(round_rows_scalar, round_f32_scalar, float)

#ifdef QKV_ARCH_X86
#pragma GCC push_options
#pragma GCC target("avx512f")

/* bf16_bits() on 16 floats, as 16 32-bit lanes holding the bits. */
static inline __m512i
bf16_bits16(__m512 x)
{
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i u = _mm512_castps_si512(x);
  __mmask16 subnormal = _mm512_testn_epi32_mask(u, exp_mask);
  u = _mm512_mask_and_epi32(u, subnormal, u, _mm512_set1_epi32((int)0x80000000u));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), exp_mask);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  return _mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, nan, quiet), 16);
}

static inline void
from_f32_avx512(guint16 *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i),
                        _mm512_cvtepi32_epi16(bf16_bits16(_mm512_loadu_ps(src + i))));
  from_f32_scalar(dst + i, src + i, n - i);
}

static inline void
round_f32_avx512(float *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(bf16_bits16(_mm512_loadu_ps(src + i)), 16));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    __m512i bits = bf16_bits16(_mm512_maskz_loadu_ps(m, src + i));
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(bits, 16));
  }
}

DEFINE_CONVERT_ROWS(from_rows_avx512, from_f32_avx512, guint16)
DEFINE_CONVERT_ROWS(round_rows_avx512, round_f32_avx512, float)
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
/* The CPU's own conversion (VCVTNE2PS2BF16): the rounding above, faster. */
static inline void
from_f32_bf16(guint16 *dst, const float *src, gsize n)
{
  gsize i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, (__m512i)v);
  }
  if (i < n)
    from_f32_avx512(dst + i, src + i, n - i);
}

DEFINE_CONVERT_ROWS(from_rows_bf16, from_f32_bf16, guint16)
#pragma GCC pop_options

static gboolean
cpu_has_avx512_bf16(void)
{
  static gsize has = 0;
  if (g_once_init_enter(&has)) {
    __builtin_cpu_init();
    g_once_init_leave(&has, __builtin_cpu_supports("avx512bf16") ? 2 : 1);
  }
  return has == 2;
}
#endif /* QKV_ARCH_X86 */

/* Operands stored as bf16 (qkv_sgemm_typed()) go through the same
 * ConvertRows slots: src then holds bf16 bits and ld counts them. A copy
 * for the native path, and a widening (exact) for the float32 ones. */
static void
copy_rows_bf16(gpointer dst, const float *src, gint64 rows, gint64 cols, gint64 ld)
{
  const guint16 *s = (const guint16 *)(gconstpointer)src;
  guint16 *d = dst;
  for (gint64 r = 0; r < rows; r++)
    memcpy(d + r * cols, s + r * ld, (gsize)cols * sizeof(guint16));
}

static void
widen_rows(gpointer dst, const float *src, gint64 rows, gint64 cols, gint64 ld)
{
  const guint16 *s = (const guint16 *)(gconstpointer)src;
  guint32 *d = dst;
  for (gint64 r = 0; r < rows; r++)
#pragma omp simd
    for (gint64 i = 0; i < cols; i++)
      d[r * cols + i] = (guint32)s[r * ld + i] << 16;
}

/* The fastest conversion here (the portable code while emulation is
 * forced, so that tests compare the two). */
static ConvertRows
convert_rows_for(gboolean to_bf16)
{
#ifdef QKV_ARCH_X86
  if (!qkv_use_avx512())
    return to_bf16 ? from_rows_scalar : round_rows_scalar;
  if (!to_bf16)
    return round_rows_avx512;
  return cpu_has_avx512_bf16() && !g_atomic_int_get(&force_emulation) ? from_rows_bf16
                                                                      : from_rows_avx512;
#else
  return to_bf16 ? from_rows_scalar : round_rows_scalar;
#endif
}

void
qkv_bf16_round_f32(float *dst, const float *src, gsize n)
{
  convert_rows_for(FALSE)(dst, src, 1, (gint64)n, (gint64)n);
}

void
qkv_bf16_from_floats(guint16 *dst, const float *src, gsize n)
{
  g_return_if_fail(n == 0 || (dst != NULL && src != NULL));
  convert_rows_for(TRUE)(dst, src, 1, (gint64)n, (gint64)n);
}

void
qkv_bf16_to_floats(float *dst, const guint16 *src, gsize n)
{
  g_return_if_fail(n == 0 || (dst != NULL && src != NULL));
  widen_rows(dst, (const float *)(gconstpointer)src, 1, (gint64)n, (gint64)n);
}

/* ---- per-thread state ----------------------------------------------------- */

#ifdef QKV_HAVE_ONEDNN
typedef struct {
  gint64 m, n, k, lda, ldb, ldc;
  gboolean ta, tb;
  float alpha, beta;
} MatmulKey;

typedef struct {
  MatmulKey key;
  guint64 last_use;
  dnnl_primitive_t primitive;
  dnnl_memory_t a, b, c, scratchpad; /* data pointers set per call */
} Matmul;
#endif

typedef struct {
  guint8 *operands; /* the converted operands of the current product */
  gsize operands_size;
  guint8 *widened; /* operands stored as bf16, widened to floats */
  gsize widened_size;
  float *c_rows; /* the rows of c that a chunk adds past m */
  gsize c_rows_size;
#ifdef QKV_HAVE_ONEDNN
  guint8 *scratchpad; /* oneDNN's, for the current primitive */
  gsize scratchpad_size;
  dnnl_stream_t stream;
  Matmul cache[MATMUL_CACHE];
  guint n_cached;
  guint64 clock;
#endif
} Bf16Thread;

#ifdef QKV_HAVE_ONEDNN
static void
matmul_clear(Matmul *mm)
{
  dnnl_memory_destroy(mm->a);
  dnnl_memory_destroy(mm->b);
  dnnl_memory_destroy(mm->c);
  dnnl_memory_destroy(mm->scratchpad);
  dnnl_primitive_destroy(mm->primitive);
  memset(mm, 0, sizeof *mm);
}
#endif

static void
bf16_thread_free(gpointer data)
{
  Bf16Thread *t = data;
  qkv_aligned_free(t->operands);
  qkv_aligned_free(t->widened);
  qkv_aligned_free(t->c_rows);
#ifdef QKV_HAVE_ONEDNN
  for (guint i = 0; i < t->n_cached; i++)
    matmul_clear(&t->cache[i]);
  qkv_aligned_free(t->scratchpad);
  if (t->stream != NULL)
    dnnl_stream_destroy(t->stream);
#endif
  g_free(t);
}

static GPrivate bf16_thread_key = G_PRIVATE_INIT(bf16_thread_free);

static Bf16Thread *
bf16_thread(void)
{
  Bf16Thread *t = g_private_get(&bf16_thread_key);
  if (G_UNLIKELY(t == NULL)) {
    t = g_new0(Bf16Thread, 1);
    g_private_set(&bf16_thread_key, t);
  }
  return t;
}

/* *buf holds at least need bytes: grown (contents lost) when it is shorter,
 * by a quarter more than asked so that slowly growing shapes settle. Running
 * out of memory here has no caller to report to, so it aborts, as g_malloc
 * does. */
static gpointer
reserve(guint8 **buf, gsize *size, gsize need)
{
  if (G_LIKELY(need <= *size))
    return *buf;
  qkv_aligned_free(*buf);
  gsize want = need + need / 4;
  *buf = qkv_aligned_alloc0(want);
  if (*buf == NULL)
    g_error("bf16 products: cannot allocate %" G_GSIZE_FORMAT " bytes of conversion scratch", want);
  *size = want;
  return *buf;
}

void
qkv_bf16_poison_scratch(void)
{
  Bf16Thread *t = bf16_thread();
  if (t->operands != NULL)
    memset(t->operands, 0xff, t->operands_size);
  if (t->widened != NULL)
    memset(t->widened, 0xff, t->widened_size);
}

/* ---- converting the operands ---------------------------------------------- */

/* A stored matrix: rows × cols with rows ld apart (floats, or bf16 bits
 * where src_bf16), copied into copy_rows × copy_cols (at least as many),
 * the rest of which is zeros. */
typedef struct {
  const float *src;
  gboolean src_bf16;
  gint64 rows, cols, ld;
  gint64 copy_rows, copy_cols;
  gpointer dst; /* guint16 (to_bf16) or float */
  ConvertRows convert;
} Operand;

typedef struct {
  Operand ops[2];
  gsize elem; /* bytes per converted element */
} ConvertJob;

/* Row r of an operand's source. */
static const float *
source_row(const Operand *op, gint64 r)
{
  gsize elem = op->src_bf16 ? sizeof(guint16) : sizeof(float);
  return (const float *)(gconstpointer)((const guint8 *)op->src + (gsize)(r * op->ld) * elem);
}

static void
convert_rows(const ConvertJob *j, const Operand *op, gint64 r0, gint64 r1)
{
  guint8 *dst = (guint8 *)op->dst + (gsize)(r0 * op->copy_cols) * j->elem;
  if (op->ld == op->cols && op->copy_cols == op->cols) { /* one run */
    op->convert(dst, source_row(op, r0), 1, (r1 - r0) * op->cols, (r1 - r0) * op->cols);
    return;
  }
  if (op->copy_cols == op->cols) {
    op->convert(dst, source_row(op, r0), r1 - r0, op->cols, op->ld);
    return;
  }
  gsize row_bytes = (gsize)op->copy_cols * j->elem,
        pad = (gsize)(op->copy_cols - op->cols) * j->elem;
  for (gint64 r = r0; r < r1; r++, dst += row_bytes) {
    op->convert(dst, source_row(op, r), 1, op->cols, op->ld);
    memset(dst + row_bytes - pad, 0, pad);
  }
}

/* Rows [begin, end) of the two operands' rows, a's first. */
static void
convert_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const ConvertJob *j = data;
  gint64 rows_a = j->ops[0].rows;
  if (begin < rows_a)
    convert_rows(j, &j->ops[0], begin, MIN(end, rows_a));
  if (end > rows_a)
    convert_rows(j, &j->ops[1], MAX(begin, rows_a) - rows_a, end - rows_a);
}

/* Where the bf16 copy of op goes: a valid copy in the run's cache (op->rows
 * becomes 0: nothing to convert), a new place in the cache, or scratch. An
 * operand stored as bf16 is its own copy where it is dense and needs no
 * padding (the primitives then see the layout a copy would have, so the
 * bits are those of float32 storage), else it is copied into scratch (a
 * copy costs less than a lookup). */
static void
place_bf16(Operand *op, gpointer scratch)
{
  if (op->src_bf16) {
    if (op->copy_rows == op->rows && op->copy_cols == op->cols && op->ld == op->cols) {
      op->dst = (gpointer)op->src, op->rows = 0;
      return;
    }
    op->dst = scratch;
    return;
  }
  guint16 *slot;
  const guint16 *cached = qkv_bf16_cache_lookup(op->src, op->rows, op->cols, op->ld, op->copy_rows,
                                                op->copy_cols, &slot);
  if (cached != NULL)
    op->dst = (gpointer)cached, op->rows = 0;
  else
    op->dst = slot != NULL ? (gpointer)slot : scratch;
}

/* The zero rows under a copy (its zero columns are written with each row). */
static void
zero_rows_below(const Operand *op, gsize elem)
{
  if (op->rows > 0 && op->copy_rows > op->rows)
    memset((guint8 *)op->dst + (gsize)(op->rows * op->copy_cols) * elem, 0,
           (gsize)((op->copy_rows - op->rows) * op->copy_cols) * elem);
}

static gsize
copy_bytes(const Operand *op, gsize elem)
{
  return ((gsize)(op->copy_rows * op->copy_cols) * elem + 63) / 64 * 64;
}

/* The conversion of an operand: rounding floats (to bf16 bits, or to the
 * floats they stand for), or a stored bf16 operand's copy or widening. */
static ConvertRows
operand_convert(gboolean src_bf16, gboolean to_bf16)
{
  if (src_bf16)
    return to_bf16 ? copy_rows_bf16 : widen_rows;
  return convert_rows_for(to_bf16);
}

/* Converts op(a) and op(b) (a_bf16, b_bf16: stored as bf16 bits): as bf16
 * (to_bf16) into the run's cache where they may be kept and the thread's
 * scratch otherwise, laid out as the native path's chunks need
 * (padded_dim() for m and k, below); else as rounded floats, dense.
 * Returns where they went and their row lengths. */
static void
convert_operands(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, const float *a,
                 gboolean a_bf16, gint64 lda, const float *b, gboolean b_bf16, gint64 ldb,
                 gboolean to_bf16, gint n_threads, gpointer *a_out, gint64 *lda_out,
                 gpointer *b_out, gint64 *ldb_out)
{
  gsize elem = to_bf16 ? sizeof(guint16) : sizeof(float);
  gint64 mp = to_bf16 ? padded_dim(m) : m, kp = to_bf16 ? padded_dim(k) : k;
  ConvertJob job = {{{a, a_bf16, ta ? k : m, ta ? m : k, lda, ta ? kp : mp, ta ? mp : kp, NULL,
                      operand_convert(a_bf16, to_bf16)},
                     {b, b_bf16, tb ? n : k, tb ? k : n, ldb, tb ? n : kp, tb ? kp : n, NULL,
                      operand_convert(b_bf16, to_bf16)}},
                    elem};
  gsize a_bytes = copy_bytes(&job.ops[0], elem);
  Bf16Thread *t = bf16_thread();
  guint8 *buf = reserve(&t->operands, &t->operands_size, a_bytes + copy_bytes(&job.ops[1], elem));
  job.ops[0].dst = buf, job.ops[1].dst = buf + a_bytes;
  if (to_bf16) {
    place_bf16(&job.ops[0], buf);
    place_bf16(&job.ops[1], buf + a_bytes);
  }
  zero_rows_below(&job.ops[0], elem);
  zero_rows_below(&job.ops[1], elem);
  gint64 rows = job.ops[0].rows + job.ops[1].rows;
  gint64 elems = job.ops[0].rows * job.ops[0].cols + job.ops[1].rows * job.ops[1].cols;
  gint nt = elems < BF16_CONVERT_PARALLEL_MIN ? 1 : n_threads;
  qkv_parallel_for(nt, rows, convert_range, &job);
  *a_out = job.ops[0].dst;
  *b_out = job.ops[1].dst;
  *lda_out = job.ops[0].copy_cols;
  *ldb_out = job.ops[1].copy_cols;
}

/* ---- the emulated path ---------------------------------------------------- */

/* Whether products can run natively, asked once per product above
 * BF16_NATIVE_MIN and once in all for the small ones (the answer changes
 * only with qkv_set_gemm_backend()); where not, one message says so. */
static gboolean
native_or_say(void)
{
  const gchar *why;
  gboolean native = qkv_bf16_native(&why);
  static gsize once = 0;
  if (!native && g_once_init_enter(&once)) {
    g_message("bf16 precision: %s, so qkv rounds the operands of matrix products to bf16 and "
              "multiplies them in float32 (emulated: the same results up to float32 rounding, "
              "not faster than fp32)",
              why);
    g_once_init_leave(&once, 1);
  }
  return native;
}

static void
sgemm_emulated(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const float *a,
               gint64 lda, const float *b, gint64 ldb, float beta, float *c, gint64 ldc,
               gint n_threads)
{
  gpointer ra, rb;
  gint64 lda_r, ldb_r;
  convert_operands(ta, tb, m, n, k, a, FALSE, lda, b, FALSE, ldb, FALSE, n_threads, &ra, &lda_r,
                   &rb, &ldb_r);
  qkv_sgemm_fp32(ta, tb, m, n, k, alpha, ra, lda_r, rb, ldb_r, beta, c, ldc, n_threads);
}

/* ---- the native path ------------------------------------------------------ */

/* Whether small products run natively, on the AVX512_BF16 kernel of
 * smallgemm-bf16.c: where the large ones do (so that "native" means one
 * thing, and the message of native_or_say() holds) and the CPU has the
 * instructions (oneDNN may be on AMX, whose CPUs have them too). */
static gboolean
small_native(void)
{
#ifdef QKV_ARCH_X86
  return cpu_has_avx512_bf16() && native_or_say();
#else
  return FALSE;
#endif
}

#ifdef QKV_HAVE_ONEDNN
static dnnl_engine_t
cpu_engine(void)
{
  static gsize engine = 0;
  if (g_once_init_enter(&engine)) {
    dnnl_engine_t e = NULL;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success)
      e = NULL;
    g_once_init_leave(&engine, e != NULL ? (gsize)e : 1);
  }
  return engine == 1 ? NULL : (dnnl_engine_t)engine;
}

static gboolean
matmul_build(Matmul *mm, const MatmulKey *key, dnnl_engine_t engine)
{
  const MatmulKey *q = key;
  dnnl_memory_desc_t a_md, b_md, c_md;
  dnnl_dims_t a_dims = {q->m, q->k}, b_dims = {q->k, q->n}, c_dims = {q->m, q->n};
  dnnl_dims_t a_strides = {q->ta ? 1 : q->lda, q->ta ? q->lda : 1};
  dnnl_dims_t b_strides = {q->tb ? 1 : q->ldb, q->tb ? q->ldb : 1};
  dnnl_dims_t c_strides = {q->ldc, 1};
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t post_ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  gboolean ok =
      dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_strides) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_strides) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides) == dnnl_success &&
      dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
      dnnl_primitive_attr_create(&attr) == dnnl_success &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
      (q->alpha == 1.0f ||
       dnnl_primitive_attr_set_output_scales(attr, 1, 0, &q->alpha) == dnnl_success) &&
      dnnl_post_ops_create(&post_ops) == dnnl_success &&
      (q->beta == 0.0f || dnnl_post_ops_append_sum(post_ops, q->beta) == dnnl_success) &&
      dnnl_primitive_attr_set_post_ops(attr, post_ops) == dnnl_success &&
      dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) == dnnl_success &&
      dnnl_primitive_create(&mm->primitive, pd) == dnnl_success;
  if (ok) {
    const dnnl_memory_desc_t *pad_md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    ok = dnnl_memory_create(&mm->a, &a_md, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&mm->b, &b_md, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&mm->c, &c_md, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&mm->scratchpad, pad_md, engine, DNNL_MEMORY_NONE) == dnnl_success;
  }
  dnnl_primitive_desc_destroy(pd);
  dnnl_post_ops_destroy(post_ops);
  dnnl_primitive_attr_destroy(attr);
  mm->key = *key;
  if (!ok)
    matmul_clear(mm);
  else
    __atomic_add_fetch(&primitives_built, 1, __ATOMIC_RELAXED);
  return ok;
}

/* The thread's primitive for key, built on a miss in place of the least
 * recently used one; NULL if oneDNN refuses it. */
static Matmul *
matmul_lookup(Bf16Thread *t, const MatmulKey *key)
{
  Matmul *slot = NULL;
  for (guint i = 0; i < t->n_cached; i++) {
    Matmul *mm = &t->cache[i];
    if (memcmp(&mm->key, key, sizeof *key) == 0) {
      mm->last_use = ++t->clock;
      return mm;
    }
    if (slot == NULL || mm->last_use < slot->last_use)
      slot = mm;
  }
  dnnl_engine_t engine = cpu_engine();
  if (engine == NULL)
    return NULL;
  if (t->stream == NULL &&
      dnnl_stream_create(&t->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
    t->stream = NULL;
    return NULL;
  }
  if (t->n_cached < MATMUL_CACHE)
    slot = &t->cache[t->n_cached++];
  else
    matmul_clear(slot);
  if (!matmul_build(slot, key, engine)) {
    *slot = t->cache[--t->n_cached]; /* keep the used slots packed */
    memset(&t->cache[t->n_cached], 0, sizeof(Matmul));
    return NULL;
  }
  slot->last_use = ++t->clock;
  return slot;
}
#endif

/* Exact products of bf16 values summed in float32, one after the other: the
 * fallback for a block oneDNN refused. */
static void
bf16_block_loops(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha,
                 const guint16 *a, gint64 lda, const guint16 *b, gint64 ldb, float beta, float *c,
                 gint64 ldc)
{
  for (gint64 i = 0; i < m; i++)
    for (gint64 j = 0; j < n; j++) {
      float sum = 0.0f;
      for (gint64 p = 0; p < k; p++) {
        guint32 x = (guint32)(ta ? a[p * lda + i] : a[i * lda + p]) << 16;
        guint32 y = (guint32)(tb ? b[j * ldb + p] : b[p * ldb + j]) << 16;
        float fx, fy;
        memcpy(&fx, &x, sizeof fx);
        memcpy(&fy, &y, sizeof fy);
        sum += fx * fy;
      }
      float *cij = &c[i * ldc + j];
      *cij = beta == 0.0f ? alpha * sum : alpha * sum + beta * *cij;
    }
}

gboolean
qkv_bf16_block(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha,
               const guint16 *a, gint64 lda, const guint16 *b, gint64 ldb, float beta, float *c,
               gint64 ldc)
{
#ifdef QKV_HAVE_ONEDNN
  /* oneDNN's OpenMP runtime would start a team of its own (see gemm.c) */
  if (G_UNLIKELY(omp_get_max_threads() != 1))
    omp_set_num_threads(1);
  Bf16Thread *t = bf16_thread();
  MatmulKey key;
  memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding */
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
  key.ta = ta, key.tb = tb, key.alpha = alpha, key.beta = beta;
  Matmul *mm = matmul_lookup(t, &key);
  if (mm == NULL)
    return FALSE;
  const dnnl_memory_desc_t *pad_md;
  dnnl_memory_get_memory_desc(mm->scratchpad, &pad_md);
  gpointer pad = reserve(&t->scratchpad, &t->scratchpad_size, dnnl_memory_desc_get_size(pad_md));
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mm->a},
                            {DNNL_ARG_WEIGHTS, mm->b},
                            {DNNL_ARG_DST, mm->c},
                            {DNNL_ARG_SCRATCHPAD, mm->scratchpad}};
  return dnnl_memory_set_data_handle(mm->a, (gpointer)a) == dnnl_success &&
         dnnl_memory_set_data_handle(mm->b, (gpointer)b) == dnnl_success &&
         dnnl_memory_set_data_handle(mm->c, c) == dnnl_success &&
         dnnl_memory_set_data_handle(mm->scratchpad, pad) == dnnl_success &&
         dnnl_primitive_execute(mm->primitive, t->stream, G_N_ELEMENTS(args), args) ==
             dnnl_success &&
         dnnl_stream_wait(t->stream) == dnnl_success;
#else
  return FALSE;
#endif
}

typedef struct {
  gboolean ta, tb, split_rows;
  gint64 m, n, k, lda, ldb, ldc, block;
  float alpha, beta;
  const guint16 *a, *b;
  float *c;
} Bf16Job;

/* qkv_bf16_block(), or the loops where oneDNN refuses. */
static void
run_block(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const guint16 *a,
          gint64 lda, const guint16 *b, gint64 ldb, float beta, float *c, gint64 ldc)
{
  if (G_LIKELY(qkv_bf16_block(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)))
    return;
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    g_warning("bf16 products: oneDNN refused a %" G_GINT64_FORMAT "×%" G_GINT64_FORMAT
              "×%" G_GINT64_FORMAT " matmul; such products run on plain loops (slow)",
              m, n, k);
    g_once_init_leave(&once, 1);
  }
  bf16_block_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The chunk of a dimension d that starts at done (chunks, above): its
 * length in the call, and in *real how much of that is the operands' (the
 * rest is padding). whole: the whole product's length of that dimension,
 * of which d may be a thread's block (blocks start at multiples of 64): the
 * copies are padded when it is 64 or more, so then a short block is rounded
 * up too. */
static gint64
next_chunk(gint64 d, gint64 whole, gint64 done, gint64 *real)
{
  gint64 left = d - done;
  *real = left;
  if (whole < CHUNK_MIN)
    return d;
  if (left < CHUNK_MIN)
    return round_to_chunk(left);
  gint64 chunk = CHUNK_MIN;
  while (chunk * 2 <= left)
    chunk *= 2;
  *real = chunk;
  return chunk;
}

/* c = α·op(a)·op(b) + β·c on the calling thread, in chunks (above); a and
 * b are copies laid out by convert_operands(), m rows of a product of
 * m_whole. */
static void
run_chunks(gboolean ta, gboolean tb, gint64 m, gint64 m_whole, gint64 n, gint64 k, float alpha,
           const guint16 *a, gint64 lda, const guint16 *b, gint64 ldb, float beta, float *c,
           gint64 ldc)
{
  gint64 rows, cols;
  for (gint64 i0 = 0; i0 < m; i0 += rows) {
    gint64 mc = next_chunk(m, m_whole, i0, &rows);
    float *ci = c + i0 * ldc;
    gint64 ldci = ldc;
    if (mc > rows) { /* past m: into scratch, with c's rows where β reads them */
      Bf16Thread *t = bf16_thread();
      ci = reserve((guint8 **)&t->c_rows, &t->c_rows_size, (gsize)(mc * n) * sizeof(float));
      ldci = n;
      for (gint64 r = 0; r < rows && beta != 0.0f; r++)
        memcpy(ci + r * n, c + (i0 + r) * ldc, (gsize)n * sizeof(float));
      memset(ci + rows * n, 0, (gsize)((mc - rows) * n) * sizeof(float));
    }
    for (gint64 p0 = 0; p0 < k; p0 += cols) {
      gint64 kc = next_chunk(k, k, p0, &cols);
      const guint16 *ap = a + (ta ? p0 * lda + i0 : i0 * lda + p0);
      const guint16 *bp = b + (tb ? p0 : p0 * ldb);
      run_block(ta, tb, mc, n, kc, alpha, ap, lda, bp, ldb, p0 == 0 ? beta : 1.0f, ci, ldci);
    }
    for (gint64 r = 0; r < rows && mc > rows; r++)
      memcpy(c + (i0 + r) * ldc, ci + r * n, (gsize)n * sizeof(float));
  }
}

/* Blocks [begin, end) of rows (or columns) of c, as one call. */
static void
bf16_blocks(gint64 begin, gint64 end, gint thread, gpointer data)
{
  const Bf16Job *j = data;
  gint64 m = j->m, n = j->n;
  const guint16 *a = j->a, *b = j->b;
  float *c = j->c;
  if (j->split_rows) {
    gint64 r0 = begin * j->block;
    m = MIN(j->m, end * j->block) - r0;
    a += j->ta ? r0 : r0 * j->lda;
    c += r0 * j->ldc;
  } else {
    gint64 c0 = begin * j->block;
    n = MIN(j->n, end * j->block) - c0;
    b += j->tb ? c0 * j->ldb : c0;
    c += c0;
  }
  run_chunks(j->ta, j->tb, m, j->m, n, j->k, j->alpha, a, j->lda, b, j->ldb, j->beta, c, j->ldc);
}

/* The operands stored as bf16 replaced by dense float copies in the
 * thread's widening buffer (exact). */
static void
widen_operands(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, const float **a,
               gboolean a_bf16, gint64 *lda, const float **b, gboolean b_bf16, gint64 *ldb)
{
  gint64 ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  gsize a_bytes = a_bf16 ? ((gsize)(ar * ac) * sizeof(float) + 63) / 64 * 64 : 0;
  gsize b_bytes = b_bf16 ? (gsize)(br * bc) * sizeof(float) : 0;
  Bf16Thread *t = bf16_thread();
  guint8 *buf = reserve(&t->widened, &t->widened_size, a_bytes + b_bytes);
  if (a_bf16) {
    widen_rows(buf, *a, ar, ac, *lda);
    *a = (const float *)(gconstpointer)buf, *lda = ac;
  }
  if (b_bf16) {
    widen_rows(buf + a_bytes, *b, br, bc, *ldb);
    *b = (const float *)(gconstpointer)(buf + a_bytes), *ldb = bc;
  }
}

static void
sgemm_bf16(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const float *a,
           gboolean a_bf16, gint64 lda, const float *b, gboolean b_bf16, gint64 ldb, float beta,
           float *c, gint64 ldc, gint n_threads)
{
  static gint small_seen = FALSE;
  gboolean small = m * n * k < BF16_NATIVE_MIN;
  if (small && G_UNLIKELY(!g_atomic_int_get(&small_seen))) {
    native_or_say();
    g_atomic_int_set(&small_seen, TRUE);
  }
  gboolean forced = g_atomic_int_get(&force_emulation);
  if (small && !forced && small_native()) {
    Bf16Thread *t = bf16_thread();
    gpointer scratch =
        reserve(&t->operands, &t->operands_size, qkv_small_sgemm_bf16_scratch(m, n, k));
    qkv_small_sgemm_bf16(ta, tb, m, n, k, alpha, a, a_bf16, lda, b, b_bf16, ldb, beta, c, ldc,
                         scratch);
    return;
  }
  /* the emulation takes a stored bf16 operand widened: rounding it to bf16
   * again gives the same bits back */
  if ((a_bf16 || b_bf16) && (small || forced || !native_or_say())) {
    widen_operands(ta, tb, m, n, k, &a, a_bf16, &lda, &b, b_bf16, &ldb);
    a_bf16 = b_bf16 = FALSE;
  }
  if (small || forced || !native_or_say()) {
    sgemm_emulated(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, n_threads);
    return;
  }
  gint nt = m * n * k < BF16_PARALLEL_MIN ? 1 : n_threads;
  gpointer a16, b16;
  gint64 lda16, ldb16;
  convert_operands(ta, tb, m, n, k, a, a_bf16, lda, b, b_bf16, ldb, TRUE, n_threads, &a16, &lda16,
                   &b16, &ldb16);
  Bf16Job job = {ta, tb, m >= n, m, n, k, lda16, ldb16, ldc, 64, alpha, beta, a16, b16, c};
  gint64 blocks = ((job.split_rows ? m : n) + job.block - 1) / job.block;
  qkv_parallel_for((gint)MIN(nt, blocks), blocks, bf16_blocks, &job);
}

void
qkv_sgemm_bf16(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha, const float *a,
               gint64 lda, const float *b, gint64 ldb, float beta, float *c, gint64 ldc,
               gint n_threads)
{
  sgemm_bf16(ta, tb, m, n, k, alpha, a, FALSE, lda, b, FALSE, ldb, beta, c, ldc, n_threads);
}

void
qkv_sgemm_bf16_typed(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha,
                     gconstpointer a, gboolean a_bf16, gint64 lda, gconstpointer b, gboolean b_bf16,
                     gint64 ldb, float beta, float *c, gint64 ldc, gint n_threads)
{
  sgemm_bf16(ta, tb, m, n, k, alpha, a, a_bf16, lda, b, b_bf16, ldb, beta, c, ldc, n_threads);
}

void
qkv_sgemm_fp32_typed(gboolean ta, gboolean tb, gint64 m, gint64 n, gint64 k, float alpha,
                     gconstpointer a, gboolean a_bf16, gint64 lda, gconstpointer b, gboolean b_bf16,
                     gint64 ldb, float beta, float *c, gint64 ldc, gint n_threads)
{
  const float *fa = a, *fb = b;
  widen_operands(ta, tb, m, n, k, &fa, a_bf16, &lda, &fb, b_bf16, &ldb);
  qkv_sgemm_fp32(ta, tb, m, n, k, alpha, fa, lda, fb, ldb, beta, c, ldc, n_threads);
}
