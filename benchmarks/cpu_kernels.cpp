/* Two facts about this core behind figures in RESULTS.md, one JSON line each:
 *  - fma_peak: single-precision multiply-add throughput with 12 independent 16-wide
 *    accumulators (AVX-512), the ceiling the BLAS's small-matrix kernels are measured against;
 *  - log_exp: anvil's simd::log and simd::exp (include/anvil/core/simd.hpp) on 256 doubles,
 *    the prioritized buffer's batch, against a loop of std::log and std::exp.
 * Best of 5 repeats each. simd.hpp is a light header: no LibTorch needed.
 *
 *   g++ -O3 -std=c++20 -Iinclude -o cpu_kernels benchmarks/cpu_kernels.cpp
 *   taskset -c 0 ./cpu_kernels
 */
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include <anvil/core/simd.hpp>

static double now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

template <class F>
static double best_seconds(F&& f) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const double t = now();
    f();
    best = std::min(best, now() - t);
  }
  return best;
}

#if ANVIL_SIMD_X86
ANVIL_TARGET_AVX512 static float fma_loop(long iters) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(0.001f * static_cast<float>(j));
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(a[j], b, c);
  float lanes[16], s = 0;  // (a store, not _mm512_reduce_add_ps: GCC 12 warns inside that one)
  for (int j = 0; j < 12; ++j) {
    _mm512_storeu_ps(lanes, a[j]);
    for (float v : lanes) s += v;
  }
  return s;
}
#endif

int main() {
#if ANVIL_SIMD_X86
  if (anvil::simd::avx512()) {
    const long iters = 50000000;
    volatile float sink = 0;
    const double s = best_seconds([&] { sink = sink + fma_loop(iters); });
    std::printf("{\"bench\": \"fma_peak\", \"gflops\": %.1f}\n", static_cast<double>(iters) * 12 * 16 * 2 / s / 1e9);
  }
#endif
  const int n = 256, reps = 20000;
  std::vector<double> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = 0.1 + 0.01 * i;
  volatile double sink = 0;
  auto per_call_us = [&](auto&& f) {
    return best_seconds([&] {
             for (int r = 0; r < reps; ++r) {
               f();
               sink = sink + y[r % n];
             }
           }) /
           reps * 1e6;
  };
  const double simd_log = per_call_us([&] { anvil::simd::log(y.data(), x.data(), n); });
  const double std_log = per_call_us([&] {
    for (int i = 0; i < n; ++i) y[i] = std::log(x[i]);
  });
  const double simd_exp = per_call_us([&] { anvil::simd::exp(y.data(), x.data(), n); });
  const double std_exp = per_call_us([&] {
    for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
  });
  std::printf("{\"bench\": \"log_exp\", \"n\": %d, \"simd_log_us\": %.3f, \"std_log_us\": %.3f, \"simd_exp_us\": %.3f, "
              "\"std_exp_us\": %.3f}\n",
              n, simd_log, std_log, simd_exp, std_exp);
  return 0;
}
