#pragma once
/// @file
/// Collectives built from the two every `Parallelism` has (`all_reduce_mean`, `broadcast`),
/// so the Trainer, its loops and hooks, DDP's tests and user parallelisms share one
/// implementation: a sum over ranks, and rank 0's bytes on every rank. `Ranks` is a
/// Parallelism seen without its type, so that code which only needs these (hooks, loops'
/// agreement between ranks) is compiled once rather than once per Trainer type.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace anvil {

/// Sums `t` (a CPU tensor) over the ranks of `p` in place, through its all-reduce on `device`.
template <class P>
void sum_over_ranks(P& p, at::Tensor& t, c10::Device device) {
  const int world = p.world_size();
  if (world == 1) return;
  std::vector<at::Tensor> v{t.to(device)};
  p.all_reduce_mean(v);
  t.copy_(v[0].to(at::kCPU).mul_(world));
}

/// Rank 0's `bytes` (any length) on every rank of `p`, through its broadcast on `device`.
template <class P>
void broadcast_bytes(P& p, std::vector<std::uint8_t>& bytes, c10::Device device) {
  if (p.world_size() == 1) return;
  std::vector<at::Tensor> n{at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong).to(device)};
  p.broadcast(n);
  bytes.resize(static_cast<std::size_t>(n[0].item<std::int64_t>()));
  std::vector<at::Tensor> b{
      at::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, at::kByte).to(device)};
  p.broadcast(b);
  if (!b[0].is_cpu() || b[0].data_ptr() != bytes.data())
    std::memcpy(bytes.data(), b[0].cpu().data_ptr(), bytes.size());
}

/// The ranks of a run, whatever its Parallelism type: who this process is, and the
/// collectives on the run's device. Default-constructed: one process.
class Ranks {
 public:
  Ranks() = default;
  /// A view of `p` (which must outlive it) whose collectives run on `device`.
  template <class P>
  Ranks(P& p, c10::Device device)
      : rank_(p.rank()), world_(p.world_size()), device_(device),
        all_reduce_([&p](std::vector<at::Tensor>& t) { p.all_reduce_mean(t); }),
        broadcast_([&p](std::vector<at::Tensor>& t) { p.broadcast(t); }) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return world_; }
  [[nodiscard]] bool is_main() const noexcept { return rank_ == 0; }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }

  /// Averages `ts` across ranks in place (nothing for one process).
  void all_reduce_mean(std::vector<at::Tensor>& ts) {
    if (world_ > 1) all_reduce_(ts);
  }
  /// Rank 0's `ts` on every rank, in place.
  void broadcast(std::vector<at::Tensor>& ts) {
    if (world_ > 1) broadcast_(ts);
  }
  /// Sums the CPU tensor `t` over the ranks in place.
  void sum(at::Tensor& t) { sum_over_ranks(*this, t, device_); }
  /// The sum of `x` over the ranks.
  [[nodiscard]] double sum(double x) {
    if (world_ == 1) return x;
    auto t = at::full({1}, x, at::kDouble);
    sum(t);
    return t.item<double>();
  }
  /// Sums each element of `v` over the ranks (one collective for all of them).
  void sum(std::vector<double>& v) {
    if (world_ == 1 || v.empty()) return;
    auto t = at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, at::kDouble);
    sum(t);
  }
  /// Rank 0's bytes on every rank.
  void broadcast(std::vector<std::uint8_t>& bytes) { broadcast_bytes(*this, bytes, device_); }
  /// Rank 0's strings on every rank.
  void broadcast(std::vector<std::string>& strings) {
    if (world_ == 1) return;
    std::vector<std::uint8_t> bytes;
    if (is_main())
      for (const auto& s : strings) {
        bytes.insert(bytes.end(), s.begin(), s.end());
        bytes.push_back(0);
      }
    broadcast(bytes);
    strings.clear();
    std::string cur;
    for (auto b : bytes) {
      if (b == 0) {
        strings.push_back(cur);
        cur.clear();
      } else {
        cur += static_cast<char>(b);
      }
    }
  }

 private:
  int rank_ = 0, world_ = 1;
  c10::Device device_{c10::kCPU};
  std::function<void(std::vector<at::Tensor>&)> all_reduce_, broadcast_;
};

}  // namespace anvil
