#pragma once
/// @file
/// `TransitionStore`: the preallocated ring of transitions both replay buffers keep, and
/// the ids that name a transition for as long as it is stored.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>

namespace anvil {

/// Where a replay buffer keeps its tensors: with the networks (no copy per sample; the
/// default) or in host memory (for buffers larger than the GPU's memory).
enum class Storage { compute, cpu };
constexpr auto enum_names(Storage) { return std::array<std::string_view, 2>{"compute", "cpu"}; }

namespace detail {

/// A ring of `capacity` transitions in preallocated tensors. Transition number k (counting
/// every transition ever added, from 0) is its id; it lives in slot k % capacity until
/// `capacity` more are added after it.
class TransitionStore {
 public:
  TransitionStore(const envs::EnvSpec& spec, std::int64_t capacity, c10::Device device, std::string owner)
      : capacity_(capacity), device_(device), owner_(std::move(owner)) {
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    obs_ = at::empty({capacity_, spec.obs_dim()}, f);
    next_obs_ = at::empty({capacity_, spec.obs_dim()}, f);
    action_ = spec.discrete() ? at::empty({capacity_}, f.dtype(at::kLong))
                              : at::empty({capacity_, spec.action_dim()}, f);
    reward_ = at::empty({capacity_}, f);
    terminated_ = at::empty({capacity_}, f);
  }

  /// Stores one step of N envs (row i = env i); N may exceed the free space: the ring wraps.
  /// Returns the id of the first; the rest follow in order.
  std::int64_t add(const StepBatch& s) {
    const std::int64_t n = s.obs.size(0);
    if (n > capacity_)
      throw Error(owner_ + ": adding " + std::to_string(n) +
                  " transitions at once exceeds buffer.capacity=" + std::to_string(capacity_));
    const std::int64_t first = added_;
    std::int64_t done = 0;
    while (done < n) {
      const std::int64_t slot = added_ % capacity_;
      const std::int64_t k = std::min(n - done, capacity_ - slot);
      auto dst = [&](at::Tensor& t) { return t.narrow(0, slot, k); };
      auto src = [&](const at::Tensor& t) { return t.narrow(0, done, k); };
      dst(obs_).copy_(src(s.obs));
      dst(next_obs_).copy_(src(s.next_obs));
      dst(action_).copy_(src(s.action).view(dst(action_).sizes()));
      dst(reward_).copy_(src(s.reward));
      dst(terminated_).copy_(src(s.terminated));
      added_ += k;
      done += k;
    }
    return first;
  }

  /// The transitions in `slots` (int64, on the CPU) as a batch on the storage device, with
  /// their ids in `index`.
  ReplayBatch gather(const at::Tensor& slots) const {
    const auto di = device_.is_cpu() ? slots : slots.to(device_, /*non_blocking=*/true);
    ReplayBatch b;
    b.obs = obs_.index_select(0, di);
    b.action = action_.index_select(0, di);
    b.reward = reward_.index_select(0, di);
    b.next_obs = next_obs_.index_select(0, di);
    b.terminated = terminated_.index_select(0, di);
    b.index = at::empty_like(slots);
    const auto* s = slots.data_ptr<std::int64_t>();
    auto* id = b.index.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < slots.numel(); ++i) id[i] = id_of(s[i]);
    return b;
  }

  /// The id of the transition now in `slot` (slot < size()).
  [[nodiscard]] std::int64_t id_of(std::int64_t slot) const noexcept {
    const std::int64_t newest_slot = (added_ - 1) % capacity_;
    const std::int64_t base = added_ - 1 - newest_slot;  // id stored in slot 0 of this lap
    return slot <= newest_slot ? base + slot : base - capacity_ + slot;
  }
  /// Whether transition `id` is still stored (not yet overwritten).
  [[nodiscard]] bool live(std::int64_t id) const noexcept { return id >= 0 && id < added_ && id + capacity_ >= added_; }
  [[nodiscard]] std::int64_t slot_of(std::int64_t id) const noexcept { return id % capacity_; }

  [[nodiscard]] std::int64_t size() const noexcept { return std::min(added_, capacity_); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t added() const noexcept { return added_; }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] const std::string& owner() const noexcept { return owner_; }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = 0;
    for (const auto* t : {&obs_, &next_obs_, &action_, &reward_, &terminated_})
      b += t->numel() * static_cast<std::int64_t>(t->element_size());
    return b;
  }

 private:
  std::int64_t capacity_;
  c10::Device device_;
  std::string owner_;
  at::Tensor obs_, next_obs_, action_, reward_, terminated_;
  std::int64_t added_ = 0;
};

}  // namespace detail
}  // namespace anvil
