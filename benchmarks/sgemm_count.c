/* Counts the single-precision matrix products a program makes through BLAS's sgemm_, and
 * their multiply-adds (m * n * k each), and prints both when the program exits. It checks
 * the FLOP count bench_sac_update assumes for one SAC update (sac_update_fmas): the
 * hand-written paths find sgemm_ in the process at run time, so a library preloaded ahead
 * of the BLAS sees every call.
 *
 *   gcc -O2 -shared -fPIC benchmarks/sgemm_count.c -o build/sgemm_count.so -ldl
 *   LD_PRELOAD=build/sgemm_count.so build/examples/train_sac_pendulum train.steps=1100 \
 *     train.learning_starts=100 sac.batch_size=100 sac.actor.hidden=64,64 sac.critic.hidden=64,64 \
 *     train.eval_interval=0 train.eval_episodes=1 run.update_threads=1 run.progress=off
 *
 * Divide the multiply-adds by the run's updates (summary.json). The counts are not
 * synchronised: run the program with one update thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);

static long long calls, multiply_adds;

static void report(void) {
  fprintf(stderr, "sgemm_count: %lld sgemm_ calls, %lld multiply-adds\n", calls, multiply_adds);
}

void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) {
  static sgemm_fn next;
  if (!next) {
    next = (sgemm_fn)dlsym(RTLD_NEXT, "sgemm_");
    if (!next) {
      fprintf(stderr, "sgemm_count: no sgemm_ after this library (no BLAS loaded)\n");
      abort();
    }
    atexit(report);
  }
  ++calls;
  multiply_adds += (long long)*m * *n * *k;
  next(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
