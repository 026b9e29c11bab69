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

/// How a replay buffer stores observations: full float32, or 16-bit floats to halve the
/// memory of observation-heavy buffers (batches always come out as float32).
enum class ObsDtype { float32, bfloat16, float16 };
constexpr auto enum_names(ObsDtype) {
  return std::array<std::string_view, 3>{"float32", "bfloat16", "float16"};
}

namespace detail {

/// A ring of `capacity` transitions in one preallocated row-major float tensor, a row per
/// transition: [obs | next_obs | action | reward | terminated (| discount)]. One row is one
/// or a few adjacent cache lines, so gathering a random batch costs one memory round trip
/// per transition rather than one per field. With 16-bit observations, [obs | next_obs]
/// rows live in a second tensor of that type. On the CPU a batch comes out as contiguous
/// float32 tensors; on a GPU as column views of the gathered rows. Transition number k
/// (counting every transition ever added, from 0) is its id; it lives in row k % capacity
/// until `capacity` more are added after it. Discrete actions are stored as floats (exact
/// below 2^24).
class TransitionStore {
 public:
  /// `with_discount`: rows also keep a per-transition bootstrap discount (n-step returns).
  TransitionStore(const envs::EnvSpec& spec, std::int64_t capacity, c10::Device device, std::string owner,
                  bool with_discount = false, ObsDtype obs_dtype = ObsDtype::float32)
      : capacity_(capacity),
        device_(device),
        owner_(std::move(owner)),
        od_(spec.obs_dim()),
        ad_(spec.action_dim()),
        discrete_(spec.discrete()),
        with_discount_(with_discount),
        obs_dtype_(obs_dtype),
        so_(obs_dtype == ObsDtype::float32 ? 2 * od_ : 0),
        width_(so_ + ad_ + 2 + (with_discount ? 1 : 0)) {
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    data_ = at::empty({capacity_, width_}, f);
    if (obs_dtype_ != ObsDtype::float32)
      obs_ = at::empty({capacity_, 2 * od_}, f.dtype(obs_dtype_ == ObsDtype::bfloat16 ? at::kBFloat16 : at::kHalf));
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
      auto obs_rows = obs_.defined() ? obs_.narrow(0, slot, k) : rows;
      auto put = [&](at::Tensor& dst, std::int64_t col, std::int64_t w, const at::Tensor& t) {
        dst.narrow(1, col, w).copy_(t.narrow(0, done, k).reshape({k, w}));
      };
      put(obs_rows, 0, od_, s.obs);
      put(obs_rows, od_, od_, s.next_obs);
      put(rows, so_, ad_, s.action);
      put(rows, so_ + ad_, 1, s.reward);
      put(rows, so_ + ad_ + 1, 1, s.terminated);
      if (with_discount_) {
        if (!s.discount.defined()) throw Error(owner_ + ": n-step storage needs each transition's discount");
        put(rows, so_ + ad_ + 2, 1, s.discount);
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
      auto observations = [&](const auto* obs_src, std::int64_t stride) {
        for (std::int64_t i = 0; i < std::min(kAhead, n); ++i) __builtin_prefetch(obs_src + slots[i] * stride);
        for (std::int64_t i = 0; i < n; ++i) {
          if (i + kAhead < n) __builtin_prefetch(obs_src + slots[i + kAhead] * stride);
          const auto* row = obs_src + slots[i] * stride;
          for (std::int64_t j = 0; j < od_; ++j) {
            o[i * od_ + j] = static_cast<float>(row[j]);
            no[i * od_ + j] = static_cast<float>(row[od_ + j]);
          }
        }
      };
      switch (obs_dtype_) {
        case ObsDtype::float32: observations(src, width_); break;
        case ObsDtype::bfloat16: observations(obs_.data_ptr<c10::BFloat16>(), 2 * od_); break;
        case ObsDtype::float16: observations(obs_.data_ptr<c10::Half>(), 2 * od_); break;
      }
      for (std::int64_t i = 0; i < std::min(kAhead, n); ++i) __builtin_prefetch(src + slots[i] * width_ + so_);
      for (std::int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(src + slots[i + kAhead] * width_ + so_);
        const float* row = src + slots[i] * width_ + so_;
        std::copy(row, row + ad_, a + i * ad_);
        r[i] = row[ad_];
        t[i] = row[ad_ + 1];
        if (d) d[i] = row[ad_ + 2];
      }
      b.action = discrete_ ? action.view({n}).to(at::kLong) : action;
    } else {
      auto idx = at::empty({n}, at::TensorOptions().dtype(at::kLong));
      std::copy(slots.begin(), slots.end(), idx.data_ptr<std::int64_t>());
      const auto di = idx.to(device_, /*non_blocking=*/true);
      const auto rows = data_.index_select(0, di);
      const auto obs_rows = obs_.defined() ? obs_.index_select(0, di).to(at::kFloat) : rows;
      b.obs = obs_rows.narrow(1, 0, od_);
      b.next_obs = obs_rows.narrow(1, od_, od_);
      b.action = discrete_ ? rows.select(1, so_).to(at::kLong) : rows.narrow(1, so_, ad_);
      b.reward = rows.select(1, so_ + ad_);
      b.terminated = rows.select(1, so_ + ad_ + 1);
      if (with_discount_) b.discount = rows.select(1, so_ + ad_ + 2);
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
    w.value<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_));
    const auto rows = data_.narrow(0, 0, size()).to(at::kCPU).contiguous();
    w.bytes(rows.data_ptr<float>(), static_cast<std::size_t>(rows.numel()) * sizeof(float));
    if (obs_.defined()) {
      const auto o = obs_.narrow(0, 0, size()).to(at::kCPU).contiguous();
      w.bytes(o.data_ptr(), static_cast<std::size_t>(o.numel()) * 2);
    }
  }
  /// What `save` wrote, read and checked against this store's shape, not yet applied.
  struct Saved {
    at::Tensor rows, obs;
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
    r.expect<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_), "buffer.obs_dtype (0 float32, 1 bfloat16, 2 float16)");
    const std::int64_t n = std::min(s.added, capacity_);
    s.rows = at::empty({n, width_}, at::kFloat);
    r.bytes(s.rows.data_ptr<float>(), static_cast<std::size_t>(n * width_) * sizeof(float), "transitions");
    if (obs_.defined()) {
      s.obs = at::empty({n, 2 * od_}, obs_.options().device(at::kCPU));
      r.bytes(s.obs.data_ptr(), static_cast<std::size_t>(n * 2 * od_) * 2, "observations");
    }
    return s;
  }
  void restore(Saved&& s) {
    data_.narrow(0, 0, s.rows.size(0)).copy_(s.rows);
    if (obs_.defined()) obs_.narrow(0, 0, s.obs.size(0)).copy_(s.obs);
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
    std::int64_t b = data_.numel() * static_cast<std::int64_t>(data_.element_size());
    if (obs_.defined()) b += obs_.numel() * static_cast<std::int64_t>(obs_.element_size());
    return b;
  }

 private:
  std::int64_t capacity_;
  c10::Device device_;
  std::string owner_;
  std::int64_t od_, ad_;
  bool discrete_, with_discount_;
  ObsDtype obs_dtype_;
  std::int64_t so_;     // first column of action, reward, ... in data_
  std::int64_t width_;  // columns of data_
  at::Tensor data_, obs_;  // obs_: [obs | next_obs] rows when they are 16-bit
  std::int64_t added_ = 0;
};

}  // namespace detail
}  // namespace anvil
