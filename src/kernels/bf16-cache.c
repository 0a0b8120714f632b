/* bf16-cache.c: bf16 copies of the operands of a plan run's products, kept
 * while they are valid, so that an operand that several products read is
 * converted once per run: a weight in the forward and the backward pass, the
 * input of the three attention projections, the gradient that two products
 * of one backward op read, an activation that the backward pass multiplies
 * again.
 *
 * Validity: the executor names each step before its kernel runs
 * (qkv_set_running_step()). A step writes only its outputs and its scratch
 * memory (the op contract: an op that works in place writes an output that
 * shares an input's memory, and that memory is then an output). So
 *  - an operand is cached only if none of its bytes lies in the running
 *    step's outputs or scratch (its own results may change under it), or
 *    the step declared those bytes final (qkv_sgemm_operand_final());
 *  - a cached copy is dropped before a step that is about to write any byte
 *    of its source runs;
 *  - everything is dropped when the run ends (between runs the caller, bind
 *    and the optimizer may write anything).
 * Only the thread that runs the plan caches (pool workers convert their
 * operands afresh), and only products on the native path (the emulated one
 * takes small products, where a lookup would cost what it saves).
 *
 * Memory: one buffer per plan-running thread. Copies made during a step stay
 * for the rest of the run while the run's copies take at most
 * QKV_BF16_CACHE_MB MiB (default 32; 0 turns the cache off); beyond that a
 * step's copies serve that step only. Copies of memory the step declared
 * final always serve that step only (the next step's scratch overlaps it),
 * from the buffer's other end, so they take none of the run's room. The
 * buffer grows at the end of a run to what the run asked for (up to that
 * limit, plus its largest step), so the first run allocates and later runs
 * at the same shapes do not. */
#include "kernels/kernels-private.h"

#include <string.h>

typedef struct {
  const float *src;
  gint64 rows, cols, ld;
  gint64 copy_rows, copy_cols; /* the copy's layout (gemm-bf16.c pads it) */
  guintptr lo, hi;             /* the source's bytes [lo, hi) */
  gsize offset;                /* of the copy in the buffer */
  gboolean live;
  gboolean step_only; /* a copy of memory the running step declared final */
} Entry;

/* Ranges of the running step's own memory that it will not write again
 * (qkv_sgemm_operand_final()); more than this many are ignored. */
#define MAX_FINAL 16

typedef struct {
  guintptr lo, hi;
} Range;

typedef struct {
  const QkvKernelCtx *step; /* the running step, NULL between runs */
  Range final[MAX_FINAL];
  guint n_final;
  guint8 *buf;
  gsize capacity;
  gsize run_top;     /* bytes the run's copies take */
  gsize step_top;    /* and those of the running step's copies on top */
  gsize step_bottom; /* the step-only copies, from the buffer's end down */
  GArray *entries;
  guint n_run_entries;                      /* entries[0 .. n) are the run's */
  gsize run_wanted, step_wanted, step_most; /* bytes asked for: the growth */
} Cache;

static void
cache_free(gpointer data)
{
  Cache *c = data;
  qkv_aligned_free(c->buf);
  if (c->entries != NULL)
    g_array_unref(c->entries);
  g_free(c);
}

static GPrivate cache_key = G_PRIVATE_INIT(cache_free);

/* The limit on the run's copies in MiB: QKV_BF16_CACHE_MB, or what a test
 * set; -1 until read. */
static gint limit_mb = -1;     /* atomic */
static guint64 cache_hits = 0; /* atomic */

static gsize
run_limit(void)
{
  gint mb = g_atomic_int_get(&limit_mb);
  if (G_UNLIKELY(mb < 0)) {
    mb = 32;
    const gchar *env = g_getenv("QKV_BF16_CACHE_MB");
    if (env != NULL) {
      gchar *end = NULL;
      gint64 v = g_ascii_strtoll(env, &end, 10);
      if (end != env && *end == '\0' && v >= 0 && v <= 1 << 20)
        mb = (gint)v;
    }
    g_atomic_int_compare_and_exchange(&limit_mb, -1, mb);
    mb = g_atomic_int_get(&limit_mb);
  }
  return (gsize)mb * 1024 * 1024;
}

void
qkv_set_bf16_cache_limit(gint mib)
{
  g_atomic_int_set(&limit_mb, MAX(mib, 0));
}

guint64
qkv_bf16_cache_hits(void)
{
  return __atomic_load_n(&cache_hits, __ATOMIC_RELAXED);
}

static Cache *
cache_get(gboolean create)
{
  Cache *c = g_private_get(&cache_key);
  if (c == NULL && create) {
    c = g_new0(Cache, 1);
    c->entries = g_array_new(FALSE, FALSE, sizeof(Entry));
    g_private_set(&cache_key, c);
  }
  return c;
}

static gboolean
overlaps(guintptr lo, guintptr hi, gconstpointer data, gsize bytes)
{
  guintptr b = (guintptr)data;
  return bytes > 0 && lo < b + bytes && b < hi;
}

/* Whether [lo, hi) meets anything the step may write. */
static gboolean
step_writes(const QkvKernelCtx *step, guintptr lo, guintptr hi)
{
  for (guint o = 0; o < step->n_outputs; o++) {
    const QkvView *v = &step->out[o];
    if (overlaps(lo, hi, v->data, (gsize)qkv_shape_numel(&v->shape) * qkv_dtype_size(v->dtype)))
      return TRUE;
  }
  return overlaps(lo, hi, step->scratch, step->scratch_size);
}

/* Whether [lo, hi) lies in memory the running step declared final. */
static gboolean
declared_final(const Cache *c, guintptr lo, guintptr hi)
{
  for (guint i = 0; i < c->n_final; i++)
    if (c->final[i].lo <= lo && hi <= c->final[i].hi)
      return TRUE;
  return FALSE;
}

void
qkv_sgemm_operand_final(const float *data, gsize n_floats)
{
  Cache *c = cache_get(FALSE);
  if (c == NULL || c->step == NULL || data == NULL || n_floats == 0 || c->n_final == MAX_FINAL)
    return;
  c->final[c->n_final++] = (Range){(guintptr)data, (guintptr)(data + n_floats)};
}

/* The running step's copies: kept for the run while the run's copies stay
 * within the limit, else dropped. */
static void
step_ends(Cache *c)
{
  c->step_most = MAX(c->step_most, c->step_wanted);
  c->step_wanted = 0;
  c->step_bottom = c->capacity;
  guint kept = c->n_run_entries;
  for (guint i = c->n_run_entries; i < c->entries->len; i++)
    if (!g_array_index(c->entries, Entry, i).step_only)
      g_array_index(c->entries, Entry, kept++) = g_array_index(c->entries, Entry, i);
  g_array_set_size(c->entries, kept);
  if (c->step_top <= run_limit()) {
    c->run_top = c->step_top;
    c->n_run_entries = c->entries->len;
  } else {
    c->step_top = c->run_top;
    g_array_set_size(c->entries, c->n_run_entries);
  }
}

/* The run ended: drop everything, and grow the buffer to what the run asked
 * for (nothing is live now). */
static void
run_ends(Cache *c)
{
  gsize want = MIN(c->run_wanted, run_limit()) + c->step_most;
  if (want > c->capacity) {
    qkv_aligned_free(c->buf);
    c->buf = qkv_aligned_alloc0(want);
    c->capacity = c->buf != NULL ? want : 0; /* no memory: no cache */
  }
  c->step_bottom = c->capacity;
  g_array_set_size(c->entries, 0);
  c->n_run_entries = 0;
  c->run_top = c->step_top = 0;
  c->run_wanted = c->step_wanted = c->step_most = 0;
}

void
qkv_set_running_step(const QkvKernelCtx *ctx)
{
  Cache *c = cache_get(ctx != NULL && qkv_get_running_precision() == QKV_PRECISION_BF16);
  if (c == NULL)
    return;
  if (c->step != NULL)
    step_ends(c);
  c->step = ctx;
  c->n_final = 0;
  if (ctx == NULL) {
    run_ends(c);
    return;
  }
  for (guint i = 0; i < c->n_run_entries; i++) {
    Entry *e = &g_array_index(c->entries, Entry, i);
    if (e->live && step_writes(ctx, e->lo, e->hi))
      e->live = FALSE;
  }
}

const guint16 *
qkv_bf16_cache_lookup(const float *src, gint64 rows, gint64 cols, gint64 ld, gint64 copy_rows,
                      gint64 copy_cols, guint16 **slot)
{
  *slot = NULL;
  Cache *c = cache_get(FALSE);
  if (c == NULL || c->step == NULL || run_limit() == 0)
    return NULL;
  for (guint i = 0; i < c->entries->len; i++) {
    const Entry *e = &g_array_index(c->entries, Entry, i);
    if (e->live && e->src == src && e->rows == rows && e->cols == cols && e->ld == ld &&
        e->copy_rows == copy_rows && e->copy_cols == copy_cols) {
      __atomic_add_fetch(&cache_hits, 1, __ATOMIC_RELAXED);
      return (const guint16 *)(c->buf + e->offset);
    }
  }
  guintptr lo = (guintptr)src, hi = (guintptr)(src + (rows - 1) * ld + cols);
  gboolean step_only = step_writes(c->step, lo, hi);
  if (step_only && !declared_final(c, lo, hi))
    return NULL;
  gsize bytes = ((gsize)(copy_rows * copy_cols) * sizeof(guint16) + 63) / 64 * 64;
  if (!step_only)
    c->run_wanted += bytes;
  c->step_wanted += bytes;
  if (c->step_top + bytes > c->step_bottom)
    return NULL;
  gsize offset = step_only ? c->step_bottom - bytes : c->step_top;
  Entry e = {src, rows, cols, ld, copy_rows, copy_cols, lo, hi, offset, TRUE, step_only};
  g_array_append_val(c->entries, e);
  if (step_only)
    c->step_bottom -= bytes;
  else
    c->step_top += bytes;
  *slot = (guint16 *)(c->buf + e.offset);
  return NULL;
}
