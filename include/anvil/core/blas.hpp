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
/// set. A user who sets OPENBLAS_CORETYPE themselves keeps their choice. Light header.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

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
inline bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

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

}  // namespace anvil
