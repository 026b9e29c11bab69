/* How fast this machine serves independent cache misses: the floor under a replay buffer's
 * gather of random transitions. Touches one byte in each of N random 64-byte lines of a
 * large array (loads independent of each other, so the core keeps as many misses in flight
 * as it can) and prints the time per line, with 4 KiB pages and with 2 MiB pages
 * (MADV_HUGEPAGE), as JSON lines: plain loads, and loads with each line prefetched 32
 * lines ahead into the L1 or into the L2 (how the replay gather fetches, see
 * include/anvil/core/detail/huge_pages.hpp's prefetch_l2).
 *
 *   cc -O2 -o random_lines benchmarks/random_lines.c
 *   taskset -c 0 ./random_lines [MiB, default 1024]
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
  const size_t bytes = mib << 20, lines = bytes / 64, n = (size_t)1 << 22;
  size_t* at = malloc(n * sizeof *at);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < n; ++i) {  /* xorshift64: random line offsets, drawn before timing */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    at[i] = (size_t)(x % lines) * 64;
  }
  for (int huge = 0; huge <= 1; ++huge) {
    char* p = aligned_alloc((size_t)2 << 20, bytes);
    if (!p || !at) return 1;
    madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(p, 1, bytes);
    /* plain loads; then each line also prefetched 32 lines ahead, into the L1
       (__builtin_prefetch(p) = prefetcht0) or into the L2 (locality 1 = prefetcht2) */
    static const char* const how[] = {"load", "prefetch_l1_32_ahead", "prefetch_l2_32_ahead"};
    for (int mode = 0; mode < 3; ++mode) {
      const size_t ahead = 32;
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        volatile long sink = 0;
        long s = 0;
        const double t = now();
        if (mode == 0) {
          for (size_t i = 0; i < n; ++i) s += p[at[i]];
        } else if (mode == 1) {
          for (size_t i = 0; i < n; ++i) {
            if (i + ahead < n) __builtin_prefetch(p + at[i + ahead]);
            s += p[at[i]];
          }
        } else {
          for (size_t i = 0; i < n; ++i) {
            if (i + ahead < n) __builtin_prefetch(p + at[i + ahead], 0, 1);
            s += p[at[i]];
          }
        }
        const double ns = (now() - t) / (double)n * 1e9;
        sink = s;
        (void)sink;
        if (ns < best) best = ns;
      }
      printf("{\"bench\": \"random_lines\", \"array_mib\": %zu, \"huge_pages\": %s, \"access\": \"%s\", "
             "\"ns_per_line\": %.2f}\n",
             mib, huge ? "true" : "false", how[mode], best);
    }
    free(p);
  }
  free(at);
  return 0;
}
