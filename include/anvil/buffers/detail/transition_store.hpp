#pragma once
/// @file
/// `TransitionStore`: the preallocated ring of transitions both replay buffers keep, and
/// the ids that name a transition for as long as it is stored.

#include <ATen/ATen.h>

#include <algorithm>
#include <span>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>

namespace anvil {

/// Where a replay buffer keeps its tensors: with the networks (no copy per sample; the
/// default) or in host memory (for buffers larger than the GPU's memory).
enum class Storage { compute, cpu };
constexpr auto enum_names(Storage) { return std::array<std::string_view, 2>{"compute", "cpu"}; }

namespace detail {

/// A ring of `capacity` transitions in one preallocated row-major float tensor, a row per
/// transition: [obs | next_obs | action | reward | terminated (| discount)]. One row is one or a few
/// adjacent cache lines, so gathering a random batch costs one memory round trip per
/// transition rather than one per field. On the CPU a batch comes out as contiguous tensors;
/// on a GPU as column views of one gathered tensor. Transition number k (counting every transition
/// ever added, from 0) is its id; it lives in row k % capacity until `capacity` more are
/// added after it. Discrete actions are stored as floats (exact below 2^24).
class TransitionStore {
 public:
  /// `with_discount`: rows also keep a per-transition bootstrap discount (n-step returns).
  TransitionStore(const envs::EnvSpec& spec, std::int64_t capacity, c10::Device device, std::string owner,
                  bool with_discount = false)
      : capacity_(capacity),
        device_(device),
        owner_(std::move(owner)),
        od_(spec.obs_dim()),
        ad_(spec.action_dim()),
        discrete_(spec.discrete()),
        with_discount_(with_discount),
        width_(2 * od_ + ad_ + 2 + (with_discount ? 1 : 0)) {
    data_ = at::empty({capacity_, width_}, at::TensorOptions().dtype(at::kFloat).device(device_));
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
      auto rows = data_.narrow(0, slot, k);
      auto put = [&](std::int64_t col, std::int64_t w, const at::Tensor& t) {
        rows.narrow(1, col, w).copy_(t.narrow(0, done, k).reshape({k, w}));
      };
      put(0, od_, s.obs);
      put(od_, od_, s.next_obs);
      put(2 * od_, ad_, s.action);
      put(2 * od_ + ad_, 1, s.reward);
      put(2 * od_ + ad_ + 1, 1, s.terminated);
      if (with_discount_) {
        if (!s.discount.defined()) throw Error(owner_ + ": n-step storage needs each transition's discount");
        put(2 * od_ + ad_ + 2, 1, s.discount);
      }
      added_ += k;
      done += k;
    }
    return first;
  }

  /// The transitions in rows `slots` as a batch of contiguous tensors on the storage
  /// device, with their ids in `index`.
  ReplayBatch gather(std::span<const std::int64_t> slots) const {
    const auto n = static_cast<std::int64_t>(slots.size());
    ReplayBatch b;
    if (device_.is_cpu()) {
      const auto f = data_.options();
      b.obs = at::empty({n, od_}, f);
      b.next_obs = at::empty({n, od_}, f);
      at::Tensor action = at::empty({n, ad_}, f);
      b.reward = at::empty({n}, f);
      b.terminated = at::empty({n}, f);
      if (with_discount_) b.discount = at::empty({n}, f);
      const float* src = data_.data_ptr<float>();
      float *o = b.obs.data_ptr<float>(), *no = b.next_obs.data_ptr<float>(), *a = action.data_ptr<float>();
      float *r = b.reward.data_ptr<float>(), *t = b.terminated.data_ptr<float>();
      float* d = with_discount_ ? b.discount.data_ptr<float>() : nullptr;
      constexpr std::int64_t kAhead = 8;  // rows in flight: random rows miss every cache
      for (std::int64_t i = 0; i < std::min(kAhead, n); ++i) __builtin_prefetch(src + slots[i] * width_);
      for (std::int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(src + slots[i + kAhead] * width_);
        const float* row = src + slots[i] * width_;
        std::copy(row, row + od_, o + i * od_);
        std::copy(row + od_, row + 2 * od_, no + i * od_);
        std::copy(row + 2 * od_, row + 2 * od_ + ad_, a + i * ad_);
        r[i] = row[2 * od_ + ad_];
        t[i] = row[2 * od_ + ad_ + 1];
        if (d) d[i] = row[2 * od_ + ad_ + 2];
      }
      b.action = discrete_ ? action.view({n}).to(at::kLong) : action;
    } else {
      auto idx = at::empty({n}, at::TensorOptions().dtype(at::kLong));
      std::copy(slots.begin(), slots.end(), idx.data_ptr<std::int64_t>());
      const auto rows = data_.index_select(0, idx.to(device_, /*non_blocking=*/true));
      b.obs = rows.narrow(1, 0, od_);
      b.next_obs = rows.narrow(1, od_, od_);
      b.action = discrete_ ? rows.select(1, 2 * od_).to(at::kLong) : rows.narrow(1, 2 * od_, ad_);
      b.reward = rows.select(1, 2 * od_ + ad_);
      b.terminated = rows.select(1, 2 * od_ + ad_ + 1);
      if (with_discount_) b.discount = rows.select(1, 2 * od_ + ad_ + 2);
    }
    b.index = at::empty({n}, at::TensorOptions().dtype(at::kLong));
    auto* id = b.index.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) id[i] = id_of(slots[i]);
    return b;
  }

  /// Writes the stored rows and counters.
  void save(BinaryWriter& w) const {
    w.value(capacity_);
    w.value(width_);
    w.value(od_);
    w.value(ad_);
    w.value<std::uint8_t>(with_discount_);
    w.value(added_);
    const auto rows = data_.narrow(0, 0, size()).to(at::kCPU).contiguous();
    w.bytes(rows.data_ptr<float>(), static_cast<std::size_t>(rows.numel()) * sizeof(float));
  }
  /// What `save` wrote, read and checked against this store's shape, not yet applied.
  struct Saved {
    at::Tensor rows;
    std::int64_t added = 0;
  };
  Saved read(BinaryReader& r) const {
    r.expect(capacity_, "buffer.capacity");
    r.expect(width_, "row width");
    r.expect(od_, "observation size");
    r.expect(ad_, "action size");
    r.expect<std::uint8_t>(with_discount_, "n-step storage (1: rows keep a discount)");
    Saved s;
    s.added = r.value<std::int64_t>("transitions added");
    if (s.added < 0) r.fail("transitions added", "is negative");
    const std::int64_t n = std::min(s.added, capacity_);
    s.rows = at::empty({n, width_}, at::kFloat);
    r.bytes(s.rows.data_ptr<float>(), static_cast<std::size_t>(n * width_) * sizeof(float), "transitions");
    return s;
  }
  void restore(Saved&& s) {
    data_.narrow(0, 0, s.rows.size(0)).copy_(s.rows);
    added_ = s.added;
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
    return data_.numel() * static_cast<std::int64_t>(data_.element_size());
  }

 private:
  std::int64_t capacity_;
  c10::Device device_;
  std::string owner_;
  std::int64_t od_, ad_;
  bool discrete_, with_discount_;
  std::int64_t width_;
  at::Tensor data_;
  std::int64_t added_ = 0;
};

}  // namespace detail
}  // namespace anvil
