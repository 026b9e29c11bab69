#pragma once
/// @file
/// `UniformBuffer`: experience replay with uniform sampling (Lin 1992; Mnih et al. 2015).

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <anvil/buffers/detail/n_step.hpp>
#include <anvil/buffers/detail/transition_store.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/env.hpp>

namespace anvil {

/// Buffer policy: a ring of `capacity` transitions in preallocated tensors. One call adds a
/// whole step of N envs; one call samples a batch; when full, new transitions overwrite the
/// oldest. Terminated and truncated are kept apart: only `terminated` stops bootstrapping.
class UniformBuffer {
 public:
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = "buffer";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;

  struct Config {
    Param<std::int64_t, "capacity", "transitions kept; the oldest are overwritten", at_least(1)>
        capacity{1'000'000};
    Param<Storage, "storage", "compute: tensors on the training device; cpu: in host memory">
        storage{Storage::compute};
    Param<int, "n_step", "store n-step returns: rewards summed over up to n steps, discounted by "
                         "the algorithm's gamma (1: one-step transitions)", in_range(1, 1000)>
        n_step{1};
  };

  UniformBuffer(const envs::EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : store_(spec, cfg.capacity, *cfg.storage == Storage::cpu ? c10::Device(c10::kCPU) : ctx.device,
               "UniformBuffer", cfg.n_step > 1),
        nstep_(cfg.n_step, 0.99),
        rng_(ctx.seed_for(Stream::buffer)) {}

  /// Adds one step of N envs (row i = env i). N may exceed the free space: the ring wraps.
  /// With n-step returns, what is stored is the transitions this step completes.
  void add(const StepBatch& s) {
    if (nstep_.n() == 1) return void(store_.add(s));
    auto done = nstep_.push(s);
    if (done.obs.defined()) store_.add(done);
  }

  /// `n` transitions drawn uniformly with replacement; `index` holds their ids.
  ReplayBatch sample(std::int64_t n) {
    if (n < 1 || n > size())
      throw Error("UniformBuffer: sample(" + std::to_string(n) + ") from a buffer holding " +
                  std::to_string(size()) + " transitions; the batch size must be between 1 and the size");
    slots_.resize(static_cast<std::size_t>(n));
    for (auto& s : slots_) s = static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(size())));
    return store_.gather(slots_);
  }

  /// The discount of n-step returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { nstep_.set_gamma(gamma); }

  [[nodiscard]] std::int64_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return store_.capacity(); }
  /// Transitions added since construction (including overwritten ones).
  [[nodiscard]] std::int64_t added() const noexcept { return store_.added(); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept { return store_.bytes(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return store_.device(); }

 private:
  detail::TransitionStore store_;
  detail::NStepWindow nstep_;
  Rng rng_;
  std::vector<std::int64_t> slots_;
};

static_assert(ReplayBuffer<UniformBuffer>);

}  // namespace anvil
