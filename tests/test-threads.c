/* test-threads: qkv's thread pool (src/threads.c) on its own. */
#include <qkv/qkv.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  gint64 n;
  gint *hits;       /* one counter per index, atomic */
  gint *chunk_seen; /* which chunk ran each index */
} Job;

static void
mark_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  Job *j = data;
  for (gint64 i = begin; i < end; i++) {
    g_atomic_int_inc(&j->hits[i]);
    j->chunk_seen[i] = thread;
  }
}

/* Every index runs exactly once, in the chunk the header promises,
 * [n·t/T, n·(t+1)/T), or all in chunk 0 where the loop may have found the
 * pool busy (may_be_serial) and run on the caller. */
static void
check_cover_full(gint n_threads, gint64 n, gboolean may_be_serial)
{
  Job j = {n, g_new0(gint, MAX(n, 1)), g_new0(gint, MAX(n, 1))};
  qkv_parallel_for(n_threads, n, mark_range, &j);
  gint chunks = (gint)MIN((gint64)MAX(n_threads, 1), MAX(n, 1));
  gboolean serial = may_be_serial;
  for (gint64 i = 0; i < n; i++)
    serial = serial && j.chunk_seen[i] == 0;
  if (serial)
    chunks = 1;
  for (gint64 i = 0; i < n; i++) {
    g_assert_cmpint(j.hits[i], ==, 1);
    gint want = 0;
    while (want + 1 < chunks && i >= n * (want + 1) / chunks)
      want++;
    g_assert_cmpint(j.chunk_seen[i], ==, want);
  }
  g_free(j.hits);
  g_free(j.chunk_seen);
}

static void
check_cover(gint n_threads, gint64 n)
{
  check_cover_full(n_threads, n, FALSE);
}

static void
test_cover(void)
{
  const gint64 sizes[] = {0, 1, 2, 3, 7, 64, 1000, 100003};
  for (gint t = 1; t <= 4; t++)
    for (guint s = 0; s < G_N_ELEMENTS(sizes); s++)
      for (gint rep = 0; rep < 3; rep++) /* again: workers awake, then asleep */
        check_cover(t, sizes[s]);
  /* a worker that has gone to sleep (idle longer than QKV_SPIN_US) wakes */
  g_usleep(20000);
  check_cover(2, 1000);
}

typedef struct {
  gint64 partial[8]; /* one sum per chunk */
} Nested;

static void
inner_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  /* a nested loop runs serially on the calling thread: thread is 0 */
  g_assert_cmpint(thread, ==, 0);
  gint64 *sum = data;
  for (gint64 i = begin; i < end; i++)
    *sum += i;
}

static void
outer_range(gint64 begin, gint64 end, gint thread, gpointer data)
{
  Nested *n = data;
  for (gint64 i = begin; i < end; i++) {
    gint64 s = 0;
    qkv_parallel_for(4, 100, inner_range, &s);
    n->partial[thread] += s;
  }
}

static void
test_nested(void)
{
  Nested n = {0};
  qkv_parallel_for(2, 10, outer_range, &n);
  gint64 total = 0;
  for (guint i = 0; i < G_N_ELEMENTS(n.partial); i++)
    total += n.partial[i];
  g_assert_cmpint(total, ==, 10 * 4950);
}

static gpointer
concurrent_caller(gpointer data)
{
  for (gint rep = 0; rep < 200; rep++)
    check_cover_full(2, 5000, TRUE);
  return NULL;
}

/* Two application threads share the pool: one of them runs its loop alone
 * while the other holds the pool, and both get every index once. */
static void
test_concurrent_callers(void)
{
  GThread *a = g_thread_new("caller-a", concurrent_caller, NULL);
  GThread *b = g_thread_new("caller-b", concurrent_caller, NULL);
  g_thread_join(a);
  g_thread_join(b);
}

/* A child forked after the pool started must not wait for the parent's
 * workers, which do not exist in it. */
static void
test_fork(void)
{
  check_cover(2, 1000); /* the pool has a worker now */
  pid_t pid = fork();
  g_assert_cmpint(pid, >=, 0);
  if (pid == 0) {
    alarm(10); /* a hang becomes SIGALRM */
    check_cover(2, 1000);
    check_cover(3, 100003);
    _exit(0);
  }
  int status = 0;
  g_assert_cmpint(waitpid(pid, &status, 0), ==, pid);
  g_assert_true(WIFEXITED(status));
  g_assert_cmpint(WEXITSTATUS(status), ==, 0);
}

static void
test_work_threads(void)
{
  g_assert_cmpint(qkv_work_threads(4, 10), ==, 1);
  g_assert_cmpint(qkv_work_threads(1, G_GINT64_CONSTANT(1) << 30), ==, 1);
  g_assert_cmpint(qkv_work_threads(2, G_GINT64_CONSTANT(1) << 30), ==, 2);
  /* never more threads than the work can feed */
  gint t = qkv_work_threads(64, G_GINT64_CONSTANT(1) << 19);
  g_assert_cmpint(t, >=, 2);
  g_assert_cmpint(t, <, 64);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/threads/cover", test_cover);
  g_test_add_func("/threads/nested", test_nested);
  g_test_add_func("/threads/concurrent-callers", test_concurrent_callers);
  g_test_add_func("/threads/fork", test_fork);
  g_test_add_func("/threads/work-threads", test_work_threads);
  return g_test_run();
}
