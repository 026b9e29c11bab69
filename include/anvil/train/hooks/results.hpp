#pragma once
/// @file
/// What a run reports: an evaluation's returns (`EvalResult`) and a finished run's outcome
/// (`FitResult`). Light header.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace anvil {

/// Mean, spread and range of evaluation returns, the success rate, and each task's.
struct EvalResult {
  double mean = NAN, std = NAN, min = NAN, max = NAN;
  double success = NAN;  ///< the share of episodes that succeeded (NaN: the env does not say)
  int episodes = 0;
  /// The returns and success rate of one task (or agent) of an env that has several.
  struct Group {
    std::string name;
    double mean = NAN;
    int episodes = 0;
    double success = NAN;
  };
  std::vector<Group> groups;  ///< empty when the env has no tasks
};

/// What `fit()` achieved; also written to `summary.json`.
struct FitResult {
  double final_eval_return = NAN;
  double best_eval_return = NAN;
  std::int64_t env_steps = 0;
  std::int64_t updates = 0;
  double wall_seconds = 0.0;
  std::string stopped_by;  ///< empty: the run finished; else e.g. "stopped by SIGTERM"
};

}  // namespace anvil
