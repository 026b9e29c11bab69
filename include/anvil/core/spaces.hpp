#pragma once
/// @file
/// Spaces and the env spec: what a policy needs to know about an environment to be built
/// (its observation and action spaces). They live in core, below every layer that builds
/// networks or storage from them; the env contract (envs/env.hpp) uses them. Light header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace anvil {

/// A box in R^n: `low[i] <= x[i] <= high[i]` (bounds may be +-infinity).
struct Box {
  std::vector<float> low;
  std::vector<float> high;

  /// Number of dimensions.
  [[nodiscard]] std::size_t size() const noexcept { return low.size(); }
  /// True when `x` has the right size and every element is finite and inside the bounds.
  [[nodiscard]] bool contains(std::span<const float> x) const noexcept {
    if (x.size() != low.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] >= low[i] && x[i] <= high[i])) return false;  // also false for NaN
    return true;
  }
};

/// `n` discrete choices, 0 .. n-1.
struct Discrete {
  std::int64_t n = 0;
  [[nodiscard]] bool contains(std::int64_t a) const noexcept { return a >= 0 && a < n; }
};

/// What a policy needs to know about an env to be built: its name and spaces.
struct EnvSpec {
  std::string name;
  Box observation;
  std::variant<Box, Discrete> action;
  /// The env's tasks, for envs that have several (a multi-task suite); empty otherwise.
  /// Replay buffers then store each transition's task and algorithms may condition on it.
  std::vector<std::string> tasks{};

  [[nodiscard]] bool discrete() const noexcept { return std::holds_alternative<Discrete>(action); }
  [[nodiscard]] std::int64_t obs_dim() const noexcept {
    return static_cast<std::int64_t>(observation.size());
  }
  /// Width of an action row: the Box's size, or 1 for a discrete index.
  [[nodiscard]] std::int64_t action_dim() const noexcept {
    return discrete() ? 1 : static_cast<std::int64_t>(std::get<Box>(action).size());
  }
  /// Number of discrete actions (0 for a Box).
  [[nodiscard]] std::int64_t num_actions() const noexcept {
    return discrete() ? std::get<Discrete>(action).n : 0;
  }
};

}  // namespace anvil
