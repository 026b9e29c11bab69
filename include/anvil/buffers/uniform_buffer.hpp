#pragma once
/// @file
/// `UniformBuffer`: experience replay with uniform sampling (Lin 1992; Mnih et al. 2015).

#include <ATen/ATen.h>

#include <array>
#include <filesystem>
#include <cstdint>
#include <string>
#include <vector>

#include <anvil/buffers/detail/replay_core.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>

namespace anvil {

/// Buffer policy: a ring of `capacity` transitions in preallocated tensors, each
/// observation stored once (buffers/detail/transition_store.hpp). One call adds a whole
/// step of N envs; one call samples a batch; when full, new transitions overwrite the
/// oldest. Terminated and truncated are kept apart: only `terminated` stops bootstrapping.
class UniformBuffer {
 public:
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = "buffer";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;
  using Step = StepBatch;
  /// The format tag of the files `save(path)` writes.
  static constexpr const char* file_format = "anvil UniformBuffer v3";

  struct Config {
    detail::CapacityParam capacity{1'000'000};
    detail::StorageParam storage{Storage::compute};
    detail::ObsDtypeParam obs_dtype{ObsDtype::float32};
    detail::NStepParam n_step{1};
  };

  UniformBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : core_(spec, cfg.capacity, cfg.storage, cfg.obs_dtype, cfg.n_step, ctx, "UniformBuffer"),
        rng_(ctx.seed_for(Stream::buffer)) {}

  /// Adds one step of N envs (row i = env i). N may exceed the free space: the ring wraps.
  /// With n-step returns, what is stored is the transitions this step completes.
  void add(const StepBatch& s) { core_.add(s); }

  /// `n` transitions drawn uniformly with replacement; `index` holds their ids.
  ReplayBatch sample(std::int64_t n) {
    core_.check_batch(n);
    slots_.resize(static_cast<std::size_t>(n));
    const auto rows = static_cast<std::uint64_t>(core_.stored());
    const bool gaps = core_.size() < core_.stored();  // rows of transitions that left early
    for (auto& s : slots_) {
      do s = static_cast<std::int64_t>(rng_.below(rows));
      while (gaps && !core_.valid(s));  // (rare) are drawn again
    }
    return core_.gather(slots_);
  }

  /// The discount of n-step returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { core_.set_discount(gamma); }
  /// The run's plan (the loop calls it before the run and after a resume): the discount.
  void plan(const StoragePlan& p) noexcept { set_discount(p.discount); }

  /// State protocol (core/state.hpp): the transitions, n-step windows and sampling state.
  void save(BinaryWriter& w) const {
    core_.save(w);
    w.value(rng_.state());
  }
  struct Saved {
    detail::ReplayCore::Saved core;
    Rng::State rng{};
  };
  /// Reads what `save` wrote, checked against this buffer's config; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{core_.read(r), {}};
    s.rng = r.value<Rng::State>("sampling state");
    return s;
  }
  void restore(Saved&& s) {
    core_.restore(std::move(s.core));
    rng_.set_state(s.rng);
  }

  /// Writes the buffer to `path`, atomically: a crash mid-save leaves the previous file intact.
  void save(const std::filesystem::path& path) const { save_file(*this, path, file_format); }
  /// Restores what `save(path)` wrote; the buffer's config must match. On any error the
  /// buffer is unchanged.
  void load(const std::filesystem::path& path) { read_file(*this, path, file_format)(); }

  [[nodiscard]] std::int64_t size() const noexcept { return core_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return core_.capacity(); }
  /// Transitions stored since construction (including overwritten ones).
  [[nodiscard]] std::int64_t added() const noexcept { return core_.added(); }
  /// Transitions that left before `capacity` newer ones arrived, because the observation
  /// ring ran out (episodes under 4 steps, or observations that do not chain).
  [[nodiscard]] std::int64_t dropped() const noexcept { return core_.dropped(); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept { return core_.bytes(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return core_.device(); }

 private:
  detail::ReplayCore core_;
  Rng rng_;
  std::vector<std::int64_t> slots_;
};

static_assert(ReplayBuffer<UniformBuffer>);

}  // namespace anvil
