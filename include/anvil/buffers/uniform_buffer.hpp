#pragma once
/// @file
/// `UniformBuffer`: experience replay with uniform sampling (Lin 1992; Mnih et al. 2015).

#include <cstdint>
#include <utility>
#include <vector>

// replay_core.hpp brings the ring, its config, batches, the context, state and Rng
#include <anvil/buffers/detail/replay_core.hpp>

namespace anvil {

/// Buffer policy: a ring of `capacity` transitions in preallocated tensors, each
/// observation stored once (buffers/detail/transition_store.hpp). One call adds a whole
/// step of N envs; one call samples a batch; when full, new transitions overwrite the
/// oldest. Terminated and truncated are kept apart: only `terminated` stops bootstrapping.
class UniformBuffer : public detail::ReplayBase<UniformBuffer, UniformBufferConfig> {
 public:
  /// The format tag of the files `save(path)` writes.
  static constexpr const char* file_format = "anvil UniformBuffer v4";

  UniformBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx) : ReplayBase(spec, cfg, ctx, "UniformBuffer") {}

  /// Adds one step of N envs (row i = env i). N may exceed the free space: the ring wraps.
  /// With n-step returns, what is stored is the transitions this step completes.
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept { return store_.bytes(); }
  void add(const StepBatch& s) { store_.add(s); }

  /// `n` transitions drawn uniformly with replacement; `index` holds their ids. With an env
  /// that has tasks and `balance_tasks`, each task that has transitions gets an equal share
  /// of the batch (see `ReplayCore::task_quotas`), drawn uniformly among its own; the batch
  /// lists them task by task.
  ReplayBatch sample(std::int64_t n) {
    check_batch(n);
    slots_.resize(static_cast<std::size_t>(n));
    const auto rows = static_cast<std::uint64_t>(store_.stored());
    const bool gaps = size() < store_.stored();  // rows of transitions that left early
    if (!balance_) {
      for (auto& s : slots_) {
        do s = static_cast<std::int64_t>(rng_.below(rows));
        while (gaps && !store_.valid(s));  // (rare) are drawn again
      }
      return store_.gather(slots_);
    }
    // Uniform draws kept while their task's quota is open: each task's share is a uniform
    // sample of its own transitions.
    const auto quota = task_quotas(n, calls_++);
    std::vector<std::int64_t> begin(quota.size() + 1, 0), filled(quota.size(), 0);
    for (std::size_t k = 0; k < quota.size(); ++k) begin[k + 1] = begin[k] + quota[k];
    for (std::int64_t got = 0; got < n;) {
      const auto s = static_cast<std::int64_t>(rng_.below(rows));
      if (gaps && !store_.valid(s)) continue;
      const auto k = static_cast<std::size_t>(store_.task_of(s));
      if (filled[k] == quota[k]) continue;
      slots_[static_cast<std::size_t>(begin[k] + filled[k]++)] = s;
      ++got;
    }
    return store_.gather(slots_);
  }

  /// State protocol (core/state.hpp): the transitions, n-step windows and sampling state.
  using ReplayBase::save, ReplayBase::load;  // (the buffer file)
  void save(BinaryWriter& w) const {
    store_.save(w);
    w.value(rng_.state());
    w.value(calls_);
  }
  struct Saved {
    detail::TransitionStore::Saved core;
    Rng::State rng{};
    std::int64_t calls = 0;
  };
  /// Reads what `save` wrote, checked against this buffer's config; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{store_.read(r), {}, 0};
    s.rng = r.value<Rng::State>("sampling state");
    s.calls = r.value<std::int64_t>("balanced batches drawn");
    return s;
  }
  void restore(Saved&& s) {
    store_.restore(std::move(s.core));
    rng_.set_state(s.rng);
    calls_ = s.calls;
  }

 private:
  std::int64_t calls_ = 0;  // balanced batches drawn (which task gets the remainder rotates)
  std::vector<std::int64_t> slots_;
};

static_assert(ReplayBuffer<UniformBuffer>);

}  // namespace anvil
