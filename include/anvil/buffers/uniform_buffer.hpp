#pragma once
/// @file
/// `UniformBuffer`: experience replay with uniform sampling (Lin 1992; Mnih et al. 2015).

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/env.hpp>

namespace anvil {

/// Where a replay buffer keeps its tensors: with the networks (no copy per sample; the
/// default) or in host memory (for buffers larger than the GPU's memory).
enum class Storage { compute, cpu };
constexpr auto enum_names(Storage) { return std::array<std::string_view, 2>{"compute", "cpu"}; }

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
  };

  UniformBuffer(const envs::EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : capacity_(cfg.capacity),
        device_(*cfg.storage == Storage::cpu ? c10::Device(c10::kCPU) : ctx.device),
        rng_(ctx.seed_for(Stream::buffer)) {
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    obs_ = at::empty({capacity_, spec.obs_dim()}, f);
    next_obs_ = at::empty({capacity_, spec.obs_dim()}, f);
    action_ = spec.discrete() ? at::empty({capacity_}, f.dtype(at::kLong))
                              : at::empty({capacity_, spec.action_dim()}, f);
    reward_ = at::empty({capacity_}, f);
    terminated_ = at::empty({capacity_}, f);
  }

  /// Adds one step of N envs (row i = env i). N may exceed the free space: the ring wraps.
  void add(const StepBatch& s) {
    const std::int64_t n = s.obs.size(0);
    if (n > capacity_)
      throw Error("UniformBuffer: adding " + std::to_string(n) +
                  " transitions at once exceeds buffer.capacity=" + std::to_string(capacity_));
    std::int64_t done = 0;
    while (done < n) {
      const std::int64_t k = std::min(n - done, capacity_ - next_);
      auto dst = [&](at::Tensor& t) { return t.narrow(0, next_, k); };
      auto src = [&](const at::Tensor& t) { return t.narrow(0, done, k); };
      dst(obs_).copy_(src(s.obs));
      dst(next_obs_).copy_(src(s.next_obs));
      dst(action_).copy_(src(s.action).view(dst(action_).sizes()));
      dst(reward_).copy_(src(s.reward));
      dst(terminated_).copy_(src(s.terminated));
      next_ = (next_ + k) % capacity_;
      size_ = std::min(size_ + k, capacity_);
      done += k;
    }
    added_ += n;
  }

  /// `n` transitions drawn uniformly with replacement.
  ReplayBatch sample(std::int64_t n) {
    if (size_ == 0) throw Error("UniformBuffer: sample() from an empty buffer");
    auto idx = at::empty({n}, at::TensorOptions().dtype(at::kLong));
    auto* p = idx.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(size_)));
    const auto di = device_.is_cpu() ? idx : idx.to(device_, /*non_blocking=*/true);
    ReplayBatch b;
    b.obs = obs_.index_select(0, di);
    b.action = action_.index_select(0, di);
    b.reward = reward_.index_select(0, di);
    b.next_obs = next_obs_.index_select(0, di);
    b.terminated = terminated_.index_select(0, di);
    b.index = idx;
    return b;
  }

  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  /// Transitions added since construction (including overwritten ones).
  [[nodiscard]] std::int64_t added() const noexcept { return added_; }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = 0;
    for (const auto* t : {&obs_, &next_obs_, &action_, &reward_, &terminated_})
      b += t->numel() * static_cast<std::int64_t>(t->element_size());
    return b;
  }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }

 private:
  std::int64_t capacity_;
  c10::Device device_;
  Rng rng_;
  at::Tensor obs_, next_obs_, action_, reward_, terminated_;
  std::int64_t next_ = 0, size_ = 0, added_ = 0;
};

static_assert(ReplayBuffer<UniformBuffer>);

}  // namespace anvil
