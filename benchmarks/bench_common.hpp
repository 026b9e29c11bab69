// Shared by anvil's benchmarks: one JSON line per figure, with the machine and the
// versions it was measured with, and a median over repeats (these machines are noisy).
#pragma once

#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <functional>
#include <map>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/train/start.hpp>

namespace bench {

/// A config value for the JSON line: a number or a string.
struct Value {
  std::string json;
  Value(double v) : json(anvil::json_number(v)) {}                  // NOLINT
  Value(int v) : json(std::to_string(v)) {}                          // NOLINT
  Value(long v) : json(std::to_string(v)) {}                         // NOLINT
  Value(long long v) : json(std::to_string(v)) {}                    // NOLINT
  Value(const std::string& s) : json(anvil::json_string(s)) {}       // NOLINT
  Value(const char* s) : json(anvil::json_string(s)) {}              // NOLINT
};

inline std::string host() {
  char buf[256] = "unknown";
  ::gethostname(buf, sizeof buf);
  return buf;
}

/// The CPU's model name (/proc/cpuinfo), "unknown" where it is not given.
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}

/// Prints {"name", "value", "unit", "config", "device", "torch", "host", "cpu", "blas", "date"} on one line.
inline void emit(const std::string& name, double value, const std::string& unit,
                 const std::vector<std::pair<std::string, Value>>& config,
                 const std::string& device = "cpu") {
  std::string c = "{";
  for (std::size_t i = 0; i < config.size(); ++i)
    c += (i ? ", " : "") + anvil::json_string(config[i].first) + ": " + config[i].second.json;
  c += "}";
  const auto blas = anvil::blas_info();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::printf("{\"name\": %s, \"value\": %s, \"unit\": %s, \"config\": %s, \"device\": %s, "
              "\"torch\": %s, \"host\": %s, \"cpu\": %s, \"blas\": %s, \"date\": %s}\n",
              anvil::json_string(name).c_str(), anvil::json_number(value).c_str(),
              anvil::json_string(unit).c_str(), c.c_str(), anvil::json_string(device).c_str(),
              anvil::json_string(anvil::compat::torch_version_string()).c_str(),
              anvil::json_string(host()).c_str(), anvil::json_string(cpu_model()).c_str(),
              anvil::json_string(blas.openblas ? "OpenBLAS " + blas.core : blas.library).c_str(), anvil::json_string(date).c_str());
  std::fflush(stdout);
}

/// This core's float multiply-add peak in GFLOP/s (2 per lane per fused multiply-add),
/// measured on 12 independent chains of vector FMAs for about 0.2 s: AVX-512 where the
/// CPU runs anvil's AVX-512 kernels, else AVX2 with FMA, else 0 (not measured). The ceiling
/// a matrix product of floats can reach on one thread; an AMD Zen 4 core, whose AVX-512
/// FMAs are two 256-bit halves, gives the same figure from both.
#if ANVIL_SIMD_X86
// 12 independent chains of a = a * m + b on vectors of 16 or 8 floats (fused: the benchmarks
// build in GNU mode, where GCC contracts them); inlined into the target-specific callers.
typedef float Floats16 __attribute__((vector_size(64)));
typedef float Floats8 __attribute__((vector_size(32)));
template <class V>
[[gnu::always_inline]] inline double fma_chains(long n) {
  V a[12];
  for (int i = 0; i < 12; ++i) a[i] = V{} + 0.001f * static_cast<float>(i);
  const V m = V{} + 0.9999f, b = V{} + 0.0001f;
  for (long k = 0; k < n; ++k)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = a[i] * m + b;
  V s = a[0];
  for (int i = 1; i < 12; ++i) s += a[i];
  return s[0];
}
ANVIL_TARGET_AVX512 inline double fma_chains_512(long n) { return fma_chains<Floats16>(n); }
__attribute__((target("avx2,fma"))) inline double fma_chains_256(long n) { return fma_chains<Floats8>(n); }
#endif
inline double fma_peak_gflops() {
#if ANVIL_SIMD_X86
  __builtin_cpu_init();
  const bool wide = anvil::simd::avx512();
  if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0.0;
  const int lanes = wide ? 16 : 8;
  double best = 0.0, sink = 0.0;
  for (long n = 1 << 16;; n *= 2) {  // grow to about 0.05 s a try, then keep the best of 4
    const auto t0 = std::chrono::steady_clock::now();
    sink += wide ? fma_chains_512(n) : fma_chains_256(n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < 0.05) continue;
    best = 12.0 * lanes * 2 * static_cast<double>(n) / s / 1e9;
    for (int r = 0; r < 3; ++r) {
      const auto t1 = std::chrono::steady_clock::now();
      sink += wide ? fma_chains_512(n) : fma_chains_256(n);
      best = std::max(best, 12.0 * lanes * 2 * static_cast<double>(n) /
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() / 1e9);
    }
    break;
  }
  if (sink == 42.0) std::fprintf(stderr, " ");  // keeps the chains from being optimised away
  return best;
#else
  return 0.0;
#endif
}

/// The FMA ceiling of `threads` cores at once: `fma_peak_gflops` on that many threads
/// started together, summed (two vCPUs that are hyperthreads of one core share its units,
/// and the sum then stays near one core's figure).
inline double fma_peak_gflops(int threads) {
  std::vector<double> each(static_cast<std::size_t>(threads), 0.0);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&each, i] { each[static_cast<std::size_t>(i)] = fma_peak_gflops(); });
  for (auto& t : pool) t.join();
  double sum = 0.0;
  for (double g : each) sum += g;
  return sum;
}

/// A StepContext's options for precision policy `X` on `device`, as the Trainer sets them:
/// autocast to X's dtype where it has one, a loss scaler where it scales losses.
template <class X>
anvil::StepContext::Options step_options(c10::Device device) {
  anvil::StepContext::Options so;
  so.device = device;
  so.autocast = X::autocast;
  so.autocast_dtype = X::compute_dtype;
  if constexpr (X::loss_scaling) so.loss_scaling = anvil::LossScaler::Options{};
  return so;
}

/// Runs a reference implementation's command (stdout captured, stderr dropped) and returns
/// the number after `"value": ` in its JSON line; 0 if it failed.
inline double run_reference(const std::string& command) {
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return 0;
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (::pclose(p) != 0) return 0;
  const auto k = out.find("\"value\": ");
  return k == std::string::npos ? 0 : std::atof(out.c_str() + k + 9);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Median over rounds of ours[r] / theirs[r], skipping rounds where theirs failed (0).
inline double median_ratio(const std::vector<double>& ours, const std::vector<double>& theirs) {
  std::vector<double> r;
  for (std::size_t i = 0; i < std::min(ours.size(), theirs.size()); ++i)
    if (theirs[i] > 0) r.push_back(ours[i] / theirs[i]);
  return median(std::move(r));
}

/// A benchmark's config from its command line (anvil's syntax, `--help` included), with
/// torch's intra-op threads set from `bench.threads` (0: torch's default).
template <class Config>
Config start(int argc, char** argv) {
  auto cfg = anvil::start_config<Config>(argc, argv);
  if (cfg.bench->threads > 0) torch::set_num_threads(cfg.bench->threads);
  return cfg;
}

/// Runs `once()` repeatedly for about `seconds`, `repeats` times; returns the median rate
/// in calls per second. `warmup` calls first, untimed.
inline double median_rate(const std::function<void()>& once, double seconds, int repeats = 3,
                          int warmup = 20) {
  for (int i = 0; i < warmup; ++i) once();
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    long calls = 0;
    double elapsed = 0;
    do {
      once();
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < seconds);
    rates.push_back(static_cast<double>(calls) / elapsed);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Steps of n envs with random observations that chain as a real env's do: each step's
// next_obs is the following step's obs, and every `episode` steps the episode is cut
// (truncated) and the next starts from a fresh observation.
class ChainedSteps {
 public:
  ChainedSteps(std::int64_t n, std::int64_t obs, std::int64_t act, std::int64_t episode)
      : n_(n), obs_(obs), act_(act), episode_(episode), cur_(torch::randn({n, obs})) {}
  anvil::StepBatch next() {
    const bool ends = (++t_ % episode_) == 0;
    anvil::StepBatch s{cur_, torch::rand({n_, act_}) * 2 - 1, torch::randn({n_}), torch::randn({n_, obs_}),
                       torch::zeros({n_}), torch::full({n_}, ends ? 1.f : 0.f), at::Tensor()};
    cur_ = ends ? torch::randn({n_, obs_}) : s.next_obs;
    return s;
  }

 private:
  std::int64_t n_;
  std::int64_t obs_, act_;
  std::int64_t episode_, t_ = 0;
  torch::Tensor cur_;
};

// Fills `b` with `n` transitions from `envs` chained envs with episodes of `episode` steps.
template <class B>
void fill(B& b, std::int64_t n, std::int64_t obs, std::int64_t act, std::int64_t envs, std::int64_t episode) {
  ChainedSteps steps(envs, obs, act, episode);
  for (std::int64_t done = 0; done < n; done += envs) b.add(steps.next());
}

}  // namespace bench
