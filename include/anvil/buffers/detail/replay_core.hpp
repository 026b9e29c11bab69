#pragma once
/// @file
/// `ReplayBase`: what every replay buffer shares, written once: its declarations as a buffer
/// policy, the transition store (with its n-step windows), the checks on a batch size, the
/// tasks' shares of a balanced batch, the buffer file (`save(path)`, `load(path)`) and the
/// counts. `UniformBuffer` and `PrioritizedBuffer` derive from it and add their sampling.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <anvil/buffers/detail/transition_store.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>

namespace anvil::detail {

/// The shared part of a replay buffer `Buffer` (CRTP; see file comment). `Buffer` names its
/// `file_format` and has the state protocol (save/read/restore with a BinaryWriter/Reader).
template <class Buffer, class Cfg>
class ReplayBase : public BufferPolicy<"buffer", ReplayBatch, StepBatch> {
 public:
  using Config = Cfg;

  /// The discount of n-step returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { store_.set_gamma(gamma); }
  /// The run's plan (the loop calls it before the run and after a resume): the discount.
  void plan(const StoragePlan& p) noexcept { set_discount(p.discount); }

  /// Writes the buffer to `path`, atomically: a crash mid-save leaves the previous file intact.
  void save(const std::filesystem::path& path) const { save_file(self(), path, Buffer::file_format); }
  /// Restores what `save(path)` wrote; the buffer's config must match. On any error the
  /// buffer is unchanged.
  void load(const std::filesystem::path& path) { read_file(self(), path, Buffer::file_format)(); }

  [[nodiscard]] std::int64_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return store_.capacity(); }
  /// Transitions stored since construction (including overwritten ones).
  [[nodiscard]] std::int64_t added() const noexcept { return store_.added(); }
  /// Transitions that left before `capacity` newer ones arrived, because the observation
  /// ring ran out (episodes under 4 steps, or observations that do not chain).
  [[nodiscard]] std::int64_t dropped() const noexcept { return store_.dropped(); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept { return store_.bytes(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return store_.device(); }
  /// Whether batches are shared equally among the env's tasks (`buffer.balance_tasks` with
  /// more than one task).
  [[nodiscard]] bool balances_tasks() const noexcept { return balance_; }

 protected:
  /// The store for `cfg` (a replay buffer's config), named `owner` in errors; `extra_host_bytes`
  /// is what the buffer adds on the host (counted in the memory check).
  ReplayBase(const EnvSpec& spec, const Config& cfg, const RunContext& ctx, std::string owner,
             std::int64_t extra_host_bytes = 0)
      : store_(spec, cfg.capacity, *cfg.storage == Storage::cpu ? c10::Device(c10::kCPU) : ctx.device, std::move(owner),
               cfg.n_step, cfg.obs_dtype, extra_host_bytes),
        balance_(cfg.balance_tasks && spec.tasks.size() > 1),
        rng_(ctx.seed_for(Stream::buffer)) {}

  /// Throws unless 1 <= n <= size().
  void check_batch(std::int64_t n) const {
    if (n < 1 || n > size())
      throw Error(store_.owner() + ": sample(" + std::to_string(n) + ") from a buffer holding " +
                  std::to_string(size()) + " transitions; the batch size must be between 1 and the size");
  }

  /// How many of a batch of `n` each task gets when sampling is balanced over tasks: the
  /// tasks that have transitions share `n` equally; the remainder goes one each to the
  /// tasks from `start` on (callers rotate it, so no task is favoured over many batches).
  [[nodiscard]] std::vector<std::int64_t> task_quotas(std::int64_t n, std::int64_t start) const {
    const std::int64_t t = store_.tasks();
    std::vector<std::int64_t> q(static_cast<std::size_t>(t), 0);
    std::int64_t present = 0;
    for (std::int64_t k = 0; k < t; ++k) present += store_.task_count(k) > 0 ? 1 : 0;
    if (present == 0) return q;
    std::int64_t extra = n % present;
    for (std::int64_t j = 0; j < t; ++j) {
      const std::int64_t k = (start + j) % t;
      if (store_.task_count(k) == 0) continue;
      q[static_cast<std::size_t>(k)] = n / present + (extra > 0 ? 1 : 0);
      if (extra > 0) --extra;
    }
    return q;
  }

  TransitionStore store_;
  bool balance_;  // batches shared equally among tasks
  Rng rng_;       // the sampling stream (saved with the buffer)

 private:
  [[nodiscard]] const Buffer& self() const noexcept { return static_cast<const Buffer&>(*this); }
  [[nodiscard]] Buffer& self() noexcept { return static_cast<Buffer&>(*this); }
};

}  // namespace anvil::detail
