#pragma once
/// @file
/// `AgentMemory`: what a recurrent policy (`CarriesMemory`) remembers of each of N envs,
/// held by whoever steps those envs, not by the policy: the on-policy loop holds the
/// training envs' (in the StepCollector, saved in checkpoints per rank, like the envs), an
/// evaluation holds its own. The policy reads it when it acts and writes the next state
/// back; the holder marks the envs whose next observation starts an episode, and the policy
/// forgets those rows before it acts on them.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/tensor_io.hpp>

namespace anvil {

/// A recurrent policy's memory of N envs (see file comment).
struct AgentMemory {
  at::Tensor state;  ///< [N, width] float on the policy's device
  at::Tensor first;  ///< [N] float on the policy's device: 1 where the next observation starts an episode

  /// Memory for `n` envs of `width` numbers on `device`, every env at an episode's start.
  /// Kept as it is when it already has that shape (a resumed run's restored memory).
  void plan(std::int64_t n, std::int64_t width, c10::Device device) {
    if (state.defined() && state.size(0) == n && state.size(1) == width) {
      state = state.to(device);
      first = first.to(device);
      return;
    }
    state = at::zeros({n, width}, at::TensorOptions().dtype(at::kFloat).device(device));
    first = at::ones({n}, state.options());
  }
  /// Whether `plan` has given it a shape.
  [[nodiscard]] bool planned() const noexcept { return state.defined(); }
  /// Every env starts an episode at its next observation (the envs were all reset).
  void restart() {
    if (planned()) first.fill_(1.0);
  }
  /// After a step: the envs whose episode ended (terminated or truncated, [N] float 0/1,
  /// any device) start one at their next observation; the others go on.
  void mark_starts(const at::Tensor& terminated, const at::Tensor& truncated) {
    if (planned()) first.copy_(at::max(terminated, truncated).to(at::kFloat).reshape({first.size(0)}));
  }

  /// State protocol (core/state.hpp): the shape, then the state and the flags (none before
  /// `plan`).
  void save(BinaryWriter& w) const {
    w.value(static_cast<std::int64_t>(planned() ? state.size(0) : 0));
    w.value(static_cast<std::int64_t>(planned() ? state.size(1) : 0));
    if (!planned()) return;
    write_tensor(w, state, "the policy's memory of its envs");
    write_tensor(w, first, "the envs' episode-start flags");
  }
  struct Saved {
    at::Tensor state, first;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    const auto n = r.value<std::int64_t>("memory rows"), width = r.value<std::int64_t>("memory width");
    if (n < 0 || width < 0) r.fail("memory rows", "are negative");
    Saved s;
    if (n == 0) return s;
    const auto like = at::empty({n, width}, at::kFloat);
    s.state = read_tensor(r, "the policy's memory of its envs", like);
    s.first = read_tensor(r, "the envs' episode-start flags", at::empty({n}, at::kFloat));
    return s;
  }
  void restore(const Saved& s) {
    if (!s.state.defined()) {
      state = first = at::Tensor();
      return;
    }
    const auto device = planned() ? state.device() : c10::Device(c10::kCPU);
    state = s.state.to(device);
    first = s.first.to(device);
  }
};

}  // namespace anvil
