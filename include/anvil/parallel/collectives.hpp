#pragma once
/// @file
/// Collectives built from the two every `Parallelism` has (`all_reduce_mean`, `broadcast`),
/// so the Trainer, DDP's tests and user parallelisms share one implementation: a sum over
/// ranks, and rank 0's bytes on every rank.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
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

}  // namespace anvil
