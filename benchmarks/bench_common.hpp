// Shared by anvil's benchmarks: one JSON line per figure, with the machine and the
// versions it was measured with, and a median over repeats (these machines are noisy).
#pragma once

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/blas.hpp>
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

/// Prints {"name", "value", "unit", "config", "device", "torch", "host", "blas", "date"} on one line.
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
              "\"torch\": %s, \"host\": %s, \"blas\": %s, \"date\": %s}\n",
              anvil::json_string(name).c_str(), anvil::json_number(value).c_str(),
              anvil::json_string(unit).c_str(), c.c_str(), anvil::json_string(device).c_str(),
              anvil::json_string(anvil::compat::torch_version_string()).c_str(),
              anvil::json_string(host()).c_str(),
              anvil::json_string(blas.openblas ? "OpenBLAS " + blas.core : blas.library).c_str(), anvil::json_string(date).c_str());
  std::fflush(stdout);
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
