// anvil's AVX-512 matrix products (include/anvil/core/sgemm.hpp: the tiles' product, and the
// few-rows one where blas::gemm takes it) against the BLAS Torch uses (`sgemm_`, called as
// blas::gemm calls it), on the products of a SAC update and of acting: the figures behind
// `blas::own_kernel_takes`, `blas::own_rows_kernel_takes` and `run.matmul`'s auto choice. One thread,
// interleaved rounds (each round times every shape on both sides, in alternating order), the
// best of 3 repeats a side a round; one JSON line per shape with the median time of each and
// the median of the per-round ratios. No torch in this program.
//
//   build/benchmarks/bench_gemm [--rounds=5]        (run it alone; taskset -c 0 for one core)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/sgemm.hpp>

namespace {

struct Shape {
  const char* what;
  bool trans_a, trans_b;
  std::int64_t m, n, k;
};

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find_first_not_of(" \t", line.find(':') + 1));
  return "unknown";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i] + 9, &end, 10);
      if (end == argv[i] + 9 || *end != '\0') {
        std::fprintf(stderr, "bench_gemm: %s: --rounds takes a whole number\n", argv[i]);
        return 2;
      }
      rounds = v > 1000000 ? 1000000 : static_cast<int>(v);
    } else {
      std::fprintf(stderr, "bench_gemm: unknown argument %s (known: --rounds=N)\n", argv[i]);
      return 2;
    }
  }
  if (rounds < 1) {
    std::fprintf(stderr, "bench_gemm: --rounds must be at least 1\n");
    return 2;
  }
#if !ANVIL_SIMD_X86
  std::fprintf(stderr, "bench_gemm: anvil's product is for x86-64 with AVX-512; nothing to measure here\n");
  return 0;
#else
  if (!anvil::simd::avx512()) {
    std::fprintf(stderr, "bench_gemm: this CPU has no AVX-512; anvil's product does not run here\n");
    return 0;
  }
  if (anvil::blas::sgemm() == nullptr) {
    std::fprintf(stderr, "bench_gemm: no BLAS sgemm_ found (libopenblas.so.0, libblas.so.3)\n");
    return 1;
  }
  // Products of a 256-wide SAC update at batch 256 (x W^T forward, dy W input gradient,
  // dy^T x weight gradient), a 64-wide one at batch 100 and 256, and the thin ones
  // own_kernel_takes leaves to the BLAS.
  const Shape shapes[] = {
      {"forward 256x256, batch 256", false, true, 256, 256, 256},
      {"input gradient 256x256, batch 256", false, false, 256, 256, 256},
      {"weight gradient 256x256, batch 256", true, false, 256, 256, 256},
      {"first layer forward 4 -> 256, batch 256", false, true, 256, 256, 4},
      {"forward 64x64, batch 256", false, true, 256, 64, 64},
      {"forward 64x64, batch 100", false, true, 100, 64, 64},
      {"weight gradient 64x64, batch 256", true, false, 64, 64, 256},
      {"forward 256x256, batch 8", false, true, 8, 256, 256},
      {"forward 512x512, batch 256", false, true, 256, 512, 512},
      {"thin: head 256 -> 1, batch 256 (BLAS in run.matmul=auto)", false, true, 256, 1, 256},
      {"thin: acting 256x256, one row (BLAS in run.matmul=auto)", false, true, 1, 256, 256},
      {"acting 64x64, 4 rows (PPO at RLtools' config)", false, true, 4, 64, 64},
      {"acting first layer 3 -> 64, 4 rows", false, true, 4, 64, 3},
      {"acting 256x256, 4 rows", false, true, 4, 256, 256},
  };
  // What run.matmul=auto picks on this CPU; then anvil's side is measured whatever auto picks.
  const bool auto_takes_own = anvil::blas::own_matmul();
  anvil::blas::set_matmul(anvil::Matmul::anvil);
  const anvil::BlasInfo blas = anvil::blas_info();
  const std::string cpu = cpu_model(), blas_name = blas.openblas ? "OpenBLAS " + blas.core : blas.library;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (const Shape& s : shapes) {
    const std::int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    std::vector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.n * s.k)),
        c(static_cast<std::size_t>(s.m * s.n));
    for (float& x : a) x = normal(gen);
    for (float& x : b) x = normal(gen);
    const long iters = std::max<long>(20, 40'000'000L / (s.m * s.n * s.k + 2000));
    // anvil's side: its few-rows product where blas::gemm would take it, else the tiles'
    const bool rows = anvil::blas::own_rows_kernel_takes(s.trans_a, s.trans_b, s.m, s.n, s.k, 0.f);
    auto time_side = [&](bool own) {
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < iters; ++i) {
          if (own && rows)
            anvil::simd::sgemm_rows_bt_avx512(s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, c.data(), s.n);
          else if (own)
            anvil::simd::sgemm_avx512(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f,
                                      c.data(), s.n);
          else {  // the BLAS as blas::gemm calls it (row-major C is column-major C^T)
            const char ta = s.trans_a ? 'T' : 'N', tb = s.trans_b ? 'T' : 'N';
            const int M = static_cast<int>(s.n), N = static_cast<int>(s.m), K = static_cast<int>(s.k);
            const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(s.n);
            const float one = 1.f, zero = 0.f;
            anvil::blas::sgemm()(&tb, &ta, &M, &N, &K, &one, b.data(), &lb, a.data(), &la, &zero, c.data(), &lc);
          }
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      return best;
    };
    std::vector<double> own_us, blas_us, ratio;
    for (int r = 0; r < rounds; ++r) {
      double o, p;
      if (r % 2 == 0) p = time_side(false), o = time_side(true);
      else o = time_side(true), p = time_side(false);
      own_us.push_back(o * 1e6), blas_us.push_back(p * 1e6), ratio.push_back(p / o);
    }
    const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
    std::printf(
        "{\"name\": \"gemm_anvil_vs_blas\", \"shape\": \"%s\", \"trans_a\": %d, \"trans_b\": %d, \"m\": %lld, "
        "\"n\": %lld, \"k\": %lld, \"anvil_us\": %.3f, \"blas_us\": %.3f, \"anvil_gflops\": %.1f, \"blas_gflops\": %.1f, "
        "\"speedup\": %.3f, \"anvil_kernel\": \"%s\", \"taken_by_anvil_in_auto\": %s, \"rounds\": %d, \"cpu\": \"%s\", \"blas\": \"%s\", "
        "\"date\": \"%s\"}\n",
        s.what, s.trans_a ? 1 : 0, s.trans_b ? 1 : 0, static_cast<long long>(s.m), static_cast<long long>(s.n),
        static_cast<long long>(s.k), median(own_us), median(blas_us), flops / median(own_us) / 1e3,
        flops / median(blas_us) / 1e3, median(ratio), rows ? "rows" : "tiles",
        auto_takes_own && (anvil::blas::own_kernel_takes(s.m, s.n, s.k) || rows) ? "true" : "false", rounds, cpu.c_str(), blas_name.c_str(),
        date);
    std::fflush(stdout);
  }
  return 0;
#endif
}
