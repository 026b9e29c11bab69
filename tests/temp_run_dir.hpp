// A fresh, empty run directory per test process and name, under the system's temp dir.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <anvil/train/run_config.hpp>

inline std::string temp_run_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("anvil_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

// A learning test's run section: on the CPU in temp_run_dir(name), no progress bar, a log line
// every `log_interval` steps, no checkpoints, one update thread (so `seed` fixes the run).
template <class RunSection>
void learning_test_run(RunSection& run, const std::string& name, std::int64_t log_interval, std::uint64_t seed) {
  run.device = "cpu";
  run.run_dir = temp_run_dir(name);
  run.progress = anvil::ProgressMode::off;
  run.log_interval = log_interval;
  run.checkpoint_interval = 0;
  run.update_threads = 1;
  run.seed = seed;
}
