#pragma once
/// @file
/// The `run` section: where and how a run executes, what it writes and when. The `train`
/// section belongs to the run's loop (train/loops/). Light header.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <anvil/core/blas.hpp>
#include <anvil/core/param.hpp>

namespace anvil {

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
        "actor; 0: 2 when each process may use 2 cores: its affinity and CPU quota)",
        in_range(0, 64)>
      update_threads{0};
  Param<Matmul, "matmul",
        "CPU matrix products of the hand-written fast paths: anvil (anvil's AVX-512 product where it is "
        "faster), blas (always the BLAS Torch uses), or auto (anvil on cores with full-width AVX-512: Intel, AMD Zen 5; blas elsewhere)">
      matmul{Matmul::auto_};
  Param<std::int64_t, "log_interval",
        "env steps between log lines and CSV rows (gradient updates in an offline loop)", at_least(1)>
      log_interval{1000};
  Param<ProgressMode, "progress", "auto: a bar on a terminal, lines otherwise"> progress{
      ProgressMode::auto_};
  Param<bool, "smoke", "a run of seconds that checks everything works"> smoke{false};
  Param<std::int64_t, "checkpoint_interval",
        "env steps between checkpoints in the run directory (gradient updates in an offline loop; 0: only "
        "at the end)",
        at_least(0)>
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
  Param<std::string, "export",
        "with run.resume: write that checkpoint's policy files (policy.safetensors, policy.bin where the "
        "algorithm has one) into this directory and end without training">
      export_dir{""};

  /// A run of seconds (`run.smoke`): log rows every 200 steps at most.
  void shrink() { log_interval = std::min<std::int64_t>(log_interval, 200); }
};

}  // namespace anvil
