/* threads.c: qkv's own thread pool, behind every parallel kernel and GEMM.
 *
 * Why not OpenMP teams: libgomp reads its wait policy once, when it is
 * loaded, and by default an idle worker spins for a few milliseconds after
 * every parallel region. On a machine whose other cores are busy that
 * spinning steals the core a descheduled worker needs, and every barrier
 * waits out a scheduler slice (the main job ran 40–70× slower beside two CPU
 * hogs). Here a waiting thread spins only briefly (QKV_SPIN_US, default 50
 * µs: long enough to catch the next kernel of a plan, short against a
 * scheduler slice) and then sleeps on a condition variable, so it never
 * burns a core that another process needs.
 *
 * One job at a time: a second thread that wants the pool while it is busy
 * runs its loop itself, so concurrent plans stay correct. A kernel already
 * running on a pool worker runs nested loops serially.
 *
 * Also here: the process-wide default thread count (qkv_set_num_threads())
 * that plans and the GEMM routing fall back on. */
#include "kernels/kernels-private.h"

#ifdef QKV_ARCH_X86
#include <immintrin.h>
#endif
#include <pthread.h>
#include <string.h>

#define POOL_MAX_THREADS 256

/* pthread's mutexes and condition variables rather than GLib's: GLib's
 * GMutex is its own futex code, whose ordering ThreadSanitizer cannot see,
 * so under -Db_sanitize=thread (.ci/run) every hand-over of the pool from
 * one caller to the next looked like a data race. */
typedef struct {
  pthread_mutex_t lock;  /* guards sleeping and waking */
  pthread_cond_t wake;   /* workers wait here for a new generation */
  pthread_cond_t done;   /* the caller waits here for pending to reach 0 */
  pthread_mutex_t owner; /* held by the thread whose job runs */
  GThread *threads[POOL_MAX_THREADS];
  gint n_started;                          /* workers 1..n_started exist */
  gint birth_generation[POOL_MAX_THREADS]; /* the generation a worker starts after */

  /* the job of the current generation */
  QkvRangeFunc body;
  gpointer user_data;
  gint64 n;
  gint n_chunks;
  QkvPrecision precision; /* the caller's: products in the chunks follow it */

  gint generation;          /* atomic: bumped once per job */
  gint pending;             /* atomic: workers still running this job */
  gint sleepers;            /* under lock */
  gboolean caller_sleeping; /* under lock */
} Pool;

static Pool pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .owner = PTHREAD_MUTEX_INITIALIZER,
};
/* atomic: threads that find it unset may all compute it, and agree */
static gint spin_us = -1;
static __thread gboolean on_pool_worker = FALSE;

static gint64
pool_spin_us(void)
{
  gint us = g_atomic_int_get(&spin_us);
  if (G_UNLIKELY(us < 0)) {
    const gchar *env = g_getenv("QKV_SPIN_US");
    gint64 v = 50;
    if (env != NULL) {
      gchar *end = NULL;
      gint64 parsed = g_ascii_strtoll(env, &end, 10);
      if (end != env && *end == '\0' && parsed >= 0 && parsed <= 1000000)
        v = parsed;
    }
    us = (gint)v;
    g_atomic_int_set(&spin_us, us);
  }
  return us;
}

/* Tells the core that this thread is spinning, so that it yields the
 * pipeline to a sibling hardware thread (and, on x86, leaves the loop without
 * a memory-order mis-speculation); a plain spin elsewhere. */
static inline void
spin_pause(void)
{
#if defined(QKV_ARCH_X86)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* Spin while (*word == value) == equal, for at most the spin budget; TRUE
 * if that stopped holding in time. */
static gboolean
spin_while(gint *word, gint value, gboolean equal)
{
  gint64 budget = pool_spin_us(), deadline = 0;
  for (guint i = 0;; i++) {
    if ((g_atomic_int_get(word) == value) != equal)
      return TRUE;
    if (budget == 0)
      return FALSE;
    spin_pause();
    if ((i & 63) == 63) {
      gint64 now = g_get_monotonic_time();
      if (deadline == 0)
        deadline = now + budget;
      else if (now >= deadline)
        return FALSE;
    }
  }
}

static void
run_chunk(gint index)
{
  gint64 begin = pool.n * index / pool.n_chunks, end = pool.n * (index + 1) / pool.n_chunks;
  if (begin < end)
    pool.body(begin, end, index, pool.user_data);
}

static gpointer
worker_main(gpointer data)
{
  gint index = GPOINTER_TO_INT(data);
  on_pool_worker = TRUE;
  /* not the current generation: the job that started this worker may have
   * been published before the thread got to run */
  gint seen = pool.birth_generation[index];
  for (;;) {
    if (!spin_while(&pool.generation, seen, TRUE)) {
      pthread_mutex_lock(&pool.lock);
      pool.sleepers++;
      while (g_atomic_int_get(&pool.generation) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
      pool.sleepers--;
      pthread_mutex_unlock(&pool.lock);
    }
    seen = g_atomic_int_get(&pool.generation);
    if (index < pool.n_chunks) {
      qkv_set_running_precision(pool.precision);
      run_chunk(index);
    }
    if (g_atomic_int_dec_and_test(&pool.pending)) {
      pthread_mutex_lock(&pool.lock);
      if (pool.caller_sleeping)
        pthread_cond_signal(&pool.done);
      pthread_mutex_unlock(&pool.lock);
    }
  }
  return NULL;
}

/* In a child after fork() only the forking thread exists: forget the
 * workers (and a job or lock the parent may have held), so that the child's
 * first parallel loop starts workers of its own instead of waiting forever. */
static void
pool_reset_in_child(void)
{
  memset(&pool, 0, sizeof pool);
  pthread_mutex_init(&pool.lock, NULL);
  pthread_cond_init(&pool.wake, NULL);
  pthread_cond_init(&pool.done, NULL);
  pthread_mutex_init(&pool.owner, NULL);
  on_pool_worker = FALSE;
}

/* Start workers up to index want - 1; FALSE if the system refused a thread. */
static gboolean
ensure_workers(gint want)
{
  static gsize atfork_once = 0;
  if (g_once_init_enter(&atfork_once)) {
    pthread_atfork(NULL, NULL, pool_reset_in_child);
    g_once_init_leave(&atfork_once, 1);
  }
  while (pool.n_started < want - 1) {
    gint index = pool.n_started + 1;
    GError *error = NULL;
    pool.birth_generation[index] = g_atomic_int_get(&pool.generation);
    GThread *t = g_thread_try_new("qkv-worker", worker_main, GINT_TO_POINTER(index), &error);
    if (t == NULL) {
      g_clear_error(&error);
      return FALSE;
    }
    pool.threads[index] = t;
    pool.n_started = index;
  }
  return TRUE;
}

void
qkv_parallel_for(gint n_threads, gint64 n, QkvRangeFunc body, gpointer user_data)
{
  if (n <= 0)
    return;
  gint nt = (gint)MIN((gint64)MIN(n_threads, POOL_MAX_THREADS), n);
  if (nt <= 1 || on_pool_worker || pthread_mutex_trylock(&pool.owner) != 0) {
    body(0, n, 0, user_data);
    return;
  }
  if (!ensure_workers(nt))
    nt = pool.n_started + 1;
  if (nt <= 1) {
    pthread_mutex_unlock(&pool.owner);
    body(0, n, 0, user_data);
    return;
  }
  pool.body = body;
  pool.user_data = user_data;
  pool.n = n;
  pool.n_chunks = nt;
  pool.precision = qkv_get_running_precision();
  /* every started worker takes part in the generation (those past n_chunks
   * only count down), so that none can miss a job and see the next one */
  g_atomic_int_set(&pool.pending, pool.n_started);
  g_atomic_int_inc(&pool.generation);
  pthread_mutex_lock(&pool.lock);
  if (pool.sleepers > 0)
    pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);

  on_pool_worker = TRUE; /* nested loops in chunk 0 run serially too */
  run_chunk(0);
  on_pool_worker = FALSE;

  if (!spin_while(&pool.pending, 0, FALSE)) {
    pthread_mutex_lock(&pool.lock);
    pool.caller_sleeping = TRUE;
    while (g_atomic_int_get(&pool.pending) != 0)
      pthread_cond_wait(&pool.done, &pool.lock);
    pool.caller_sleeping = FALSE;
    pthread_mutex_unlock(&pool.lock);
  }
  pthread_mutex_unlock(&pool.owner);
}

/* Above this many units of work (about one simple float operation each) per
 * extra thread, splitting a loop pays for waking a worker and joining it. The
 * figure comes from bench/bench-threads (bench/RESULTS.md §6): a fork and
 * join costs 0.2 µs while the worker still spins but 44–52 µs once it sleeps
 * (a 2-vCPU KVM guest), about 2^17 operations of the cheapest loop; two
 * threads beat one only from about 64 k–128 k elements with a sleeping
 * worker. */
#define PARALLEL_WORK_PER_THREAD (G_GINT64_CONSTANT(1) << 17)

gint
qkv_work_threads(gint n_threads, gint64 work)
{
  if (n_threads <= 1 || work < 2 * PARALLEL_WORK_PER_THREAD)
    return 1;
  return (gint)MIN((gint64)n_threads, work / PARALLEL_WORK_PER_THREAD);
}

gint
qkv_kernel_threads(const QkvKernelCtx *ctx, gint64 work)
{
  return qkv_work_threads(ctx->n_threads, work);
}

void
qkv_kernel_parallel_for(const QkvKernelCtx *ctx, gint64 n, QkvRangeFunc body, gpointer user_data)
{
  qkv_parallel_for(ctx->n_threads, n, body, user_data);
}

static gint global_threads = 0; /* atomic; 0: not set */

void
qkv_set_num_threads(gint n_threads)
{
  g_atomic_int_set(&global_threads, MAX(n_threads, 0));
}

/* OMP_NUM_THREADS's first entry if it is a positive number, else the cores
 * this process may run on. Read from the environment rather than from
 * omp_get_max_threads(): OpenBLAS's openblas_set_num_threads(1) lowers that. */
static gint
default_threads(void)
{
  static gsize value = 0;
  if (g_once_init_enter(&value)) {
    gint n = (gint)g_get_num_processors();
    const gchar *env = g_getenv("OMP_NUM_THREADS");
    if (env != NULL) {
      gchar *end = NULL;
      gint64 parsed = g_ascii_strtoll(env, &end, 10);
      if (end != env && (*end == '\0' || *end == ',') && parsed > 0 && parsed <= 4096)
        n = (gint)parsed;
    }
    g_once_init_leave(&value, (gsize)MAX(n, 1));
  }
  return (gint)value;
}

gint
qkv_get_num_threads(void)
{
  gint n = g_atomic_int_get(&global_threads);
  return n > 0 ? n : default_threads();
}
