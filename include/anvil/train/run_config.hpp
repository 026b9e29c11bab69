#pragma once
/// @file
/// The Trainer's own config sections: `run` (where and how a run executes) and `train`
/// (the schedule: how much to collect, when and how often to update). Light header.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <anvil/core/param.hpp>

namespace anvil {

/// How learning rates follow the batch size and the number of ranks.
enum class LrScaling { none, sqrt, linear };
constexpr auto enum_names(LrScaling) {
  return std::array<std::string_view, 3>{"none", "sqrt", "linear"};
}

/// How progress is shown: a live bar on a terminal, periodic lines otherwise.
enum class ProgressMode { auto_, bar, lines, off };
constexpr auto enum_names(ProgressMode) {
  return std::array<std::string_view, 4>{"auto", "bar", "lines", "off"};
}

/// The `run` section; its keys may be written without the section (`--seed=3`).
struct RunConfig {
  Param<std::uint64_t, "seed", "seed of torch, every env, the buffer and exploration"> seed{0};
  Param<std::string, "device", "cpu, cuda, cuda:N, or auto (CUDA when present)"> device{"auto"};
  Param<std::string, "run_dir", "where logs go (empty: runs/<algorithm>-<env>-<time>)"> run_dir{""};
  Param<int, "threads", "intra-op threads of torch (1 is fastest for small nets on CPU)",
        in_range(1, 1024)>
      threads{1};
  Param<int, "update_threads",
        "threads computing an update's independent gradients at once (CPU; SAC: critic and "
        "actor; 0: 2 when each process has 2 cores)",
        in_range(0, 64)>
      update_threads{0};
  Param<std::int64_t, "log_interval", "env steps between log lines and CSV rows", at_least(1)>
      log_interval{1000};
  Param<ProgressMode, "progress", "auto: a bar on a terminal, lines otherwise"> progress{
      ProgressMode::auto_};
  Param<bool, "smoke", "a run of seconds that checks everything works"> smoke{false};
  Param<std::int64_t, "checkpoint_interval",
        "env steps between checkpoints in the run directory (0: only at the end)", at_least(0)>
      checkpoint_interval{10'000};
  Param<int, "keep_last", "checkpoints kept; older ones are deleted", at_least(1)> keep_last{3};
  Param<bool, "checkpoint_buffer", "also save the replay buffer with each checkpoint (exact resume)">
      checkpoint_buffer{false};
  Param<bool, "tensorboard", "write TensorBoard event files in the run directory"> tensorboard{true};
  Param<bool, "tensorboard_histograms", "also histograms of the networks' weights at each log row">
      tensorboard_histograms{false};
  Param<bool, "timings", "time each phase of a step (env, act, sample, update, all-reduce, ...)"> timings{true};
  Param<bool, "sync_timings", "on CUDA, synchronise the device around each timed phase (true times)">
      sync_timings{true};
  Param<std::string, "resume",
        "a checkpoint to continue from, or auto: the latest in run_dir (none there: start afresh)">
      resume{""};
};

/// The `train` section: the schedule of collection and updates.
struct TrainConfig {
  Param<std::int64_t, "steps", "env steps to train for (all envs together)", at_least(1)> steps{100'000};
  Param<std::int64_t, "learning_starts", "env steps of uniform random actions before learning",
        at_least(0)>
      learning_starts{1000};
  Param<int, "update_interval", "env steps between rounds of updates", at_least(1)> update_interval{1};
  Param<int, "updates_per_interval", "gradient updates per round (update-to-data ratio)", at_least(1)>
      updates_per_interval{1};
  Param<int, "grad_accumulation",
        "micro-batches per optimizer step: the batch's gradient is accumulated over k parts (memory)",
        at_least(1)>
      grad_accumulation{1};
  Param<double, "ema_decay",
        "exponential moving average of the policy's weights after each update, used to evaluate "
        "and in policy.bin (0: off; e.g. 0.995)",
        Range{.lo = 0, .hi = 1, .hi_open = true}>
      ema_decay{0.0};
  Param<LrScaling, "lr_scaling", "none; sqrt: lr*sqrt(batch/base_batch); linear: lr*world_size">
      lr_scaling{LrScaling::none};
  Param<int, "base_batch", "batch size the learning rates were tuned for (sqrt scaling)", at_least(1)>
      base_batch{256};
  Param<std::int64_t, "eval_interval", "env steps between evaluations (0: only at the end)", at_least(0)>
      eval_interval{5000};
  Param<int, "eval_episodes", "episodes per evaluation, deterministic actions", at_least(1)>
      eval_episodes{10};
};

}  // namespace anvil
