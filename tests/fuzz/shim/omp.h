/* omp.h for the fuzz build: one thread, no OpenMP runtime (clang's libomp
 * is not among the packages run.sh may assume). The library's pragmas are
 * ignored without -fopenmp, so every parallel region runs on this thread. */
#pragma once

static inline int
omp_get_num_threads(void)
{
  return 1;
}

static inline int
omp_get_thread_num(void)
{
  return 0;
}

static inline int
omp_get_max_threads(void)
{
  return 1;
}

static inline int
omp_get_num_procs(void)
{
  return 1;
}

static inline int
omp_in_parallel(void)
{
  return 0;
}

static inline void
omp_set_num_threads(int n)
{
  (void)n;
}
