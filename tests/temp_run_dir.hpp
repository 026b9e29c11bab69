// A fresh, empty run directory per test process and name, under the system's temp dir.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <anvil/train/run_config.hpp>

inline std::string temp_run_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("anvil_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

// The seed of a learning test (the doctest suite "learning"): `fixed`, or ANVIL_LEARNING_SEED
// when it is set, so that benchmarks/learning_seeds.py can run every learning test over other
// seeds than the one its threshold was set with. A value that is not a whole number throws.
inline std::uint64_t learning_seed(std::uint64_t fixed) {
  const char* s = std::getenv("ANVIL_LEARNING_SEED");
  if (s == nullptr || *s == '\0') return fixed;
  char* end = nullptr;
  const auto v = std::strtoull(s, &end, 10);
  if (*end != '\0' || *s == '-')
    throw std::invalid_argument(std::string("ANVIL_LEARNING_SEED='") + s + "' is not a seed (a whole number, 0 or more)");
  return v;
}

// A learning test's run section: on the CPU in temp_run_dir(name), no progress bar, a log line
// every `log_interval` steps, no checkpoints, one update thread (so the seed fixes the run):
// `learning_seed(seed)`.
template <class RunSection>
void learning_test_run(RunSection& run, const std::string& name, std::int64_t log_interval, std::uint64_t seed) {
  run.device = "cpu";
  run.run_dir = temp_run_dir(name);
  run.progress = anvil::ProgressMode::off;
  run.log_interval = log_interval;
  run.checkpoint_interval = 0;
  run.update_threads = 1;
  run.seed = learning_seed(seed);
}
