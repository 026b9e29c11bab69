#pragma once
/// @file
/// Which BLAS does Torch's CPU matrix products, and making the fast one the default.
///
/// Two facts measured on the machines anvil is developed on (Debian bookworm, AVX-512
/// CPUs): Debian's reference BLAS makes Torch's matrix products about 10x slower than
/// OpenBLAS; and OpenBLAS's AVX-512 kernels (SkylakeX family) make a 256-wide SAC update about
/// 46% faster than its AVX2 (Haswell) ones. OpenBLAS 0.3.21 picks AVX-512 kernels for the CPUs
/// it knows; for one it does not know it may settle on AVX2 kernels. `prefer_fast_blas` then
/// restarts the program once with `OPENBLAS_CORETYPE=SkylakeX` (OpenBLAS reads the variable
/// only when it loads). It does nothing when the variable is already
/// set. A user who sets OPENBLAS_CORETYPE themselves keeps their choice.
///
/// `blas::gemm` is a row-major single-precision matrix product that calls the BLAS Torch
/// uses directly (found at run time, so nothing more is linked), for the hand-written fast
/// paths of small networks: at RL sizes a LibTorch op costs as much again as its arithmetic
/// (see nn/manual_mlp.hpp). Where anvil's own AVX-512 product (core/sgemm.hpp) is faster,
/// `gemm` runs that instead (`Matmul`, the `run.matmul` field). Light header.

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <anvil/core/sgemm.hpp>
#include <anvil/core/simd.hpp>

#if ANVIL_SIMD_X86
#include <cpuid.h>
#endif

namespace anvil {

/// What the running process uses for BLAS.
struct BlasInfo {
  std::string library;  ///< path of the libblas in use, from /proc/self/maps ("" if unknown)
  std::string core;     ///< OpenBLAS's kernel family ("Haswell", "SkylakeX", ...), "" otherwise
  bool openblas = false;
  bool reference = false;  ///< Netlib's reference BLAS: about 10x slower matrix products
};

/// Inspects the BLAS loaded into this process.
inline BlasInfo blas_info() {
  BlasInfo info;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libopenblas") != std::string::npos) info.openblas = true;
    if (path.find("libblas.so") != std::string::npos && info.library.empty()) info.library = path;
  }
  if (!info.library.empty() && info.library.find("openblas") == std::string::npos &&
      info.library.find("/blas/") != std::string::npos)
    info.reference = true;
  using corename_fn = char* (*)();
  if (auto fn = reinterpret_cast<corename_fn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    info.openblas = true;
    if (const char* c = fn()) info.core = c;
  }
  return info;
}

/// True when the CPU runs AVX-512 (the F, BW, DQ and VL subsets OpenBLAS's SkylakeX kernels use).
inline bool cpu_has_avx512() { return simd::avx512(); }

/// OpenBLAS kernel families that already use AVX-512.
inline bool is_avx512_core(const std::string& core) {
  for (const char* k : {"SkylakeX", "skylakex", "Cooperlake", "cooperlake", "SapphireRapids",
                        "sapphirerapids", "Zen4", "zen4"})
    if (core.find(k) != std::string::npos) return true;
  return false;
}

/// Restarts this program (same arguments) with OPENBLAS_CORETYPE=SkylakeX when OpenBLAS
/// chose non-AVX-512 kernels on an AVX-512 CPU; returns normally in every other case,
/// including when OPENBLAS_CORETYPE is already set. Call first thing in main (before any
/// threads start); `parse_config(argc, argv)` does.
inline void prefer_fast_blas(int argc, char** argv) {
  if (argc < 1 || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const BlasInfo b = blas_info();
  if (!b.openblas || b.core.empty() || is_avx512_core(b.core) || !cpu_has_avx512()) return;
  std::fprintf(stderr,
               "anvil: OpenBLAS chose its %s kernels on this AVX-512 CPU; restarting with "
               "OPENBLAS_CORETYPE=SkylakeX for faster matrix products (set OPENBLAS_CORETYPE "
               "yourself to choose)\n",
               b.core.c_str());
  std::fflush(stderr);
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  ::execv("/proc/self/exe", argv);
  // exec failed: carry on with the kernels we have.
}

/// Which code runs the CPU matrix products of the hand-written fast paths (`blas::gemm`):
/// anvil's AVX-512 product (core/sgemm.hpp) for the shapes it is faster at, or always the
/// BLAS Torch uses. `auto_` picks anvil's on the cores whose AVX-512 multiply-adds are a full
/// 512 bits wide, where it was measured faster (docs/benchmarks/main-job.md): Intel's, and
/// AMD's from Zen 5 (family 0x1A); the BLAS elsewhere (Zen 4's AVX-512 runs on 256-bit halves
/// and has not been measured with it).
enum class Matmul { auto_, blas, anvil };
constexpr auto enum_names(Matmul) { return std::array<std::string_view, 3>{"auto", "blas", "anvil"}; }

namespace blas {

namespace detail {
#if ANVIL_SIMD_X86
/// The CPU's family (base plus extended family, CPUID leaf 1; /proc/cpuinfo's "cpu family").
/// On AMD, 0x19 is Zen 3 and Zen 4 (whose AVX-512 runs on 256-bit halves), 0x1A Zen 5 (full
/// 512-bit multiply-adds).
inline unsigned cpu_family() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return 0;
  const unsigned base = (a >> 8) & 0xF;
  return base == 0xF ? base + ((a >> 20) & 0xFF) : base;
}
#endif

inline std::atomic<Matmul>& matmul_choice() {
  static std::atomic<Matmul> choice{Matmul::auto_};
  return choice;
}
}  // namespace detail

/// Chooses the code of every later `gemm` in this process (`run.matmul`; a Trainer sets it
/// when it is built). `anvil` on a CPU without AVX-512 means the BLAS.
inline void set_matmul(Matmul m) noexcept { detail::matmul_choice().store(m, std::memory_order_relaxed); }

/// Whether `gemm` may run anvil's AVX-512 product at all: the CPU has AVX-512 and the
/// choice (`set_matmul`, resolved for `auto_`) is anvil's.
inline bool own_matmul() noexcept {
#if ANVIL_SIMD_X86
  if (!simd::avx512()) return false;
  switch (detail::matmul_choice().load(std::memory_order_relaxed)) {
    case Matmul::anvil: return true;
    case Matmul::blas: return false;
    case Matmul::auto_: {
      static const bool full_width = [] {
        __builtin_cpu_init();
        return __builtin_cpu_is("intel") != 0 || (__builtin_cpu_is("amd") != 0 && detail::cpu_family() >= 0x1A);
      }();
      return full_width;
    }
  }
#endif
  return false;
}

/// Whether row-major C [m, n] (inner dimension k) goes to anvil's AVX-512 product: where
/// `own_matmul()` and the shape is one it beats OpenBLAS's SkylakeX kernels at (measured on
/// an Intel Xeon, benchmarks/bench_gemm.cpp): at least 8 rows and 32 columns of C and an
/// inner dimension of 4 to 512 (a packed panel of op(B) then stays in a core's L1 or L2).
/// Thin products (a network's one-column head, a batch of a few rows) stay with the BLAS.
/// With element-wise steps to fuse (`after`: bias, ReLU or its derivative), an inner dimension
/// of 1 to 3 goes to it too: OpenBLAS is faster at the bare product there (256 x 256 x 1:
/// 7.9 us against 10.8), but the pass after it makes the pair slower than the fused product
/// (a ReLU's backward through a one-output layer: 14.7 us against 12.5; a 3-input first layer
/// with its bias and ReLU: 17.0 against 7.9).
inline bool own_kernel_takes(std::int64_t m, std::int64_t n, std::int64_t k, const simd::Epilogue& after = {}) noexcept {
  const bool fuses = after.bias || after.relu || after.keep;
  return m >= 8 && n >= 32 && k >= (fuses ? 1 : 4) && k <= 512 && own_matmul();
}

/// Whether row-major C [m, n] = alpha A B^T + `after` goes to anvil's few-rows product
/// (`simd::sgemm_rows_bt_avx512`): where `own_matmul()`, fewer than 8 rows (acting for a
/// few envs; `own_kernel_takes` starts at 8), B transposed and A not, beta 0, and only a bias
/// and ReLU to fuse. It beats OpenBLAS's SkylakeX kernels and the pass after them at these
/// shapes (4 x 64 x 64 with bias and ReLU: 0.51 us against 0.70; 4 x 64 x 3: 0.25 against
/// 0.32; 4 x 256 x 256: even), except one row through a wide layer, where OpenBLAS's
/// matrix-vector product reads the weights faster (1 x 256 x 256: 2.6 us against 2.3):
/// one row takes it up to n * k of 32,768.
inline bool own_rows_kernel_takes(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                  float beta, const simd::Epilogue& after = {}) noexcept {
  return m >= 1 && m < 8 && n >= 1 && k >= 1 && !trans_a && trans_b && beta == 0.f && !after.keep &&
         !after.row_sums && (m > 1 || n * k <= 32768) && own_matmul();
}

/// Whether a few-rows product that `own_rows_kernel_takes` runs faster from a kept copy of
/// B^T (`simd::sgemm_rows_b_avx512`, B^T [k, n] as stored): at 16 columns or more, where
/// broadcasting A along the rows of B^T beats n dot products summed across lanes (Intel
/// Xeon, Sapphire Rapids class: 4 x 64 x 64 with bias and ReLU 0.24 us against 0.50, 4 x 64
/// x 3 0.024 against 0.25, 1 x 64 x 64 0.12 against 0.20; 4 x 8 x 64 0.087 against 0.063).
/// Only for a copy made once and used many times (a weight used for acting between two
/// updates): transposing a 64 x 64 weight costs 0.3 us, more than the product.
inline bool own_rows_kernel_takes_copy(std::int64_t m, std::int64_t n, std::int64_t k, float beta,
                                       const simd::Epilogue& after = {}) noexcept {
  return n >= 16 && own_rows_kernel_takes(false, true, m, n, k, beta, after);
}

/// The Fortran BLAS single-precision matrix product (column-major).
using sgemm_fn = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                          const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                          const float* beta, float* c, const int* ldc);

/// The BLAS `sgemm_` of this process: the one Torch loaded (Debian's libtorch links
/// libblas.so.3), else OpenBLAS or the system BLAS opened here; null when there is none
/// (`gemm` then computes with plain loops).
inline sgemm_fn sgemm() {
  static const sgemm_fn fn = [] {
    if (void* f = ::dlsym(RTLD_DEFAULT, "sgemm_")) return reinterpret_cast<sgemm_fn>(f);
    for (const char* lib : {"libopenblas.so.0", "libblas.so.3"})
      if (void* h = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL))
        if (void* f = ::dlsym(h, "sgemm_")) return reinterpret_cast<sgemm_fn>(f);
    return sgemm_fn{nullptr};
  }();
  return fn;
}

/// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (`trans_a`,
/// `trans_b`); lda, ldb, ldc are the row strides of A, B and C as stored. Then `after`'s
/// steps (bias, ReLU, ReLU's backward, op(A)'s row sums: `simd::Epilogue`), fused into the
/// product where anvil's runs, as passes after it otherwise; the same bits either way.
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc, const simd::Epilogue& after = {}) {
  if (m == 0) return;
#if ANVIL_SIMD_X86
  if (n > 0 && own_kernel_takes(m, n, k, after))
    return simd::sgemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, after);
  if (own_rows_kernel_takes(trans_a, trans_b, m, n, k, beta, after))
    return simd::sgemm_rows_bt_avx512(m, n, k, alpha, a, lda, b, ldb, c, ldc, after);
#endif
  if (n == 0) {
  } else if (const sgemm_fn f = sgemm()) {
    // Row-major C is column-major C^T = op(B)^T op(A)^T: swap the operands.
    const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
    const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
    f(&tb, &ta, &M, &N, &K, &alpha, b, &lb, a, &la, &beta, c, &lc);
  } else {
    for (std::int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      for (std::int64_t j = 0; j < n; ++j) ci[j] = beta == 0.f ? 0.f : beta * ci[j];
      for (std::int64_t p = 0; p < k; ++p) {
        const float aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
        if (trans_b)
          for (std::int64_t j = 0; j < n; ++j) ci[j] += aip * b[j * ldb + p];
        else
          for (std::int64_t j = 0; j < n; ++j) ci[j] += aip * b[p * ldb + j];
      }
    }
  }
  if (!after.empty()) simd::apply_epilogue(after, trans_a, m, n, k, a, lda, c, ldc);
}

/// Whether row-major C [m, n] = A B^T (inner dimension k) runs faster as A (B^T) with B^T
/// copied out first. OpenBLAS's AVX-512 kernel families (0.3's `sgemm_small_kernel_permit`)
/// compute A B^T, column-major "TN", with their small-matrix kernel only when m n <= 1200
/// and k >= 32, else with the packed general kernel (a pass zeroing C, both operands
/// packed); A (B^T), "NN", takes the small-matrix kernel up to 1e6 multiply-adds. Between
/// the two the copy pays. Measured on a 64-wide layer with `simd::transpose` as the copy
/// (benchmarks/transposed_gemm.cpp): 9.3 -> 7.6 us at m = 100; 1.10 -> 0.66 us for a
/// first layer with k = 3; even at m = 256 (past 1e6). Below m = 8 the gain is mixed
/// (0.12 against 0.13 us at m = 1, k = 3), so the plain product stays. Never with another
/// BLAS or OpenBLAS's other kernels, nor where anvil's own product takes the shape (it packs
/// B^T itself).
inline bool transposed_copy_pays(std::int64_t m, std::int64_t n, std::int64_t k) {
  if (own_kernel_takes(m, n, k)) return false;
  static const bool small_kernels = [] {
    if (sgemm() == nullptr) return false;
    const BlasInfo b = blas_info();
    return b.openblas && is_avx512_core(b.core);
  }();
  const double mnk = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return small_kernels && m >= 8 && mnk <= 1e6 && (m * n > 1200 || k < 32);
}

}  // namespace blas

}  // namespace anvil
