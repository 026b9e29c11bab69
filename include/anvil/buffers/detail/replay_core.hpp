#pragma once
/// @file
/// `ReplayCore`: what every replay buffer shares: the transition store (with its n-step
/// windows), the config fields for it, and the checks on a batch size.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <anvil/buffers/detail/transition_store.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil::detail {

class ReplayCore {
 public:
  ReplayCore(const EnvSpec& spec, std::int64_t capacity, Storage storage, ObsDtype obs_dtype,
             int n_step, const RunContext& ctx, std::string owner, std::int64_t extra_host_bytes = 0)
      : store_(spec, capacity, storage == Storage::cpu ? c10::Device(c10::kCPU) : ctx.device, std::move(owner),
               n_step, obs_dtype, extra_host_bytes) {}

  /// Stores what one step of N envs completes (the step itself for 1-step transitions).
  /// Returns the id of the first stored transition and how many were stored.
  std::pair<std::int64_t, std::int64_t> add(const StepBatch& step) { return store_.add(step); }

  /// Throws unless 1 <= n <= size().
  void check_batch(std::int64_t n) const {
    if (n < 1 || n > size())
      throw Error(store_.owner() + ": sample(" + std::to_string(n) + ") from a buffer holding " +
                  std::to_string(size()) + " transitions; the batch size must be between 1 and the size");
  }

  void save(BinaryWriter& w) const { store_.save(w); }
  using Saved = TransitionStore::Saved;
  Saved read(BinaryReader& r) const { return store_.read(r); }
  void restore(Saved&& s) { store_.restore(std::move(s)); }

  [[nodiscard]] ReplayBatch gather(std::span<const std::int64_t> slots) const { return store_.gather(slots); }
  [[nodiscard]] bool live(std::int64_t id) const noexcept { return store_.live(id); }
  [[nodiscard]] bool valid(std::int64_t slot) const noexcept { return store_.valid(slot); }
  [[nodiscard]] std::int64_t slot_of(std::int64_t id) const noexcept { return store_.slot_of(id); }
  [[nodiscard]] std::int64_t stored() const noexcept { return store_.stored(); }
  [[nodiscard]] std::span<const std::int64_t> killed() const noexcept { return store_.killed(); }
  void set_discount(double gamma) noexcept { store_.set_gamma(gamma); }

  [[nodiscard]] std::int64_t tasks() const noexcept { return store_.tasks(); }
  [[nodiscard]] std::int64_t task_count(std::int64_t t) const noexcept { return store_.task_count(t); }
  [[nodiscard]] std::int32_t task_of(std::int64_t slot) const noexcept { return store_.task_of(slot); }

  /// How many of a batch of `n` each task gets when sampling is balanced over tasks: the
  /// tasks that have transitions share `n` equally; the remainder goes one each to the
  /// tasks from `start` on (callers rotate it, so no task is favoured over many batches).
  [[nodiscard]] std::vector<std::int64_t> task_quotas(std::int64_t n, std::int64_t start) const {
    const std::int64_t t = tasks();
    std::vector<std::int64_t> q(static_cast<std::size_t>(t), 0);
    std::int64_t present = 0;
    for (std::int64_t k = 0; k < t; ++k) present += task_count(k) > 0 ? 1 : 0;
    if (present == 0) return q;
    std::int64_t extra = n % present;
    for (std::int64_t j = 0; j < t; ++j) {
      const std::int64_t k = (start + j) % t;
      if (task_count(k) == 0) continue;
      q[static_cast<std::size_t>(k)] = n / present + (extra > 0 ? 1 : 0);
      if (extra > 0) --extra;
    }
    return q;
  }

  [[nodiscard]] std::int64_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return store_.capacity(); }
  [[nodiscard]] std::int64_t added() const noexcept { return store_.added(); }
  [[nodiscard]] std::int64_t dropped() const noexcept { return store_.dropped(); }
  [[nodiscard]] std::int64_t bytes() const noexcept { return store_.bytes(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return store_.device(); }

 private:
  TransitionStore store_;
};

}  // namespace anvil::detail
