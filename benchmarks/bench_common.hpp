// Shared by anvil's benchmarks: one JSON line per figure, with the machine and the
// versions it was measured with, and a median over repeats (these machines are noisy).
#pragma once

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/observe/run_files.hpp>

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

/// Prints {"name", "value", "unit", "config", "device", "torch", "host", "blas"} on one line.
inline void emit(const std::string& name, double value, const std::string& unit,
                 const std::vector<std::pair<std::string, Value>>& config,
                 const std::string& device = "cpu") {
  std::string c = "{";
  for (std::size_t i = 0; i < config.size(); ++i)
    c += (i ? ", " : "") + anvil::json_string(config[i].first) + ": " + config[i].second.json;
  c += "}";
  const auto blas = anvil::blas_info();
  std::printf("{\"name\": %s, \"value\": %s, \"unit\": %s, \"config\": %s, \"device\": %s, "
              "\"torch\": %s, \"host\": %s, \"blas\": %s}\n",
              anvil::json_string(name).c_str(), anvil::json_number(value).c_str(),
              anvil::json_string(unit).c_str(), c.c_str(), anvil::json_string(device).c_str(),
              anvil::json_string(anvil::compat::torch_version_string()).c_str(),
              anvil::json_string(host()).c_str(),
              anvil::json_string(blas.openblas ? "OpenBLAS " + blas.core : blas.library).c_str());
  std::fflush(stdout);
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

}  // namespace bench
