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

/// How a multi-agent env's step travels through the single-agent machinery (VecEnv,
/// buffers, loops): as one observation row and one joint action index
/// (envs/multi_agent/multi_agent_env.hpp). The row is
///
///     [ obs of agent 0 | ... | obs of agent k-1 | available actions of agent 0 | ... | of agent k-1 | state | first ]
///
/// with each agent's available actions as 1/0 and `first` 1 on an episode's first row
/// (0 after), so that a policy with memory (a recurrent actor) knows when to forget,
/// whichever loop or evaluation steps the env. The joint action's digits in base
/// `num_actions` are the agents' actions, agent 0's the least significant.
struct AgentLayout {
  std::int64_t agents = 0;       ///< 0: a single-agent env
  std::int64_t obs_dim = 0;      ///< one agent's observation
  std::int64_t num_actions = 0;  ///< one agent's discrete actions
  std::int64_t state_dim = 0;    ///< the global state (the centralised critic's input)

  [[nodiscard]] bool multi_agent() const noexcept { return agents > 0; }
  [[nodiscard]] std::int64_t avail_offset() const noexcept { return agents * obs_dim; }
  [[nodiscard]] std::int64_t state_offset() const noexcept { return agents * (obs_dim + num_actions); }
  [[nodiscard]] std::int64_t first_offset() const noexcept { return state_offset() + state_dim; }
  [[nodiscard]] std::int64_t row_size() const noexcept { return first_offset() + 1; }
  /// num_actions ^ agents, or 0 when it would not fit in an int64.
  [[nodiscard]] std::int64_t joint_actions() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t i = 0; i < agents; ++i) {
      if (num_actions > 0 && n > (std::int64_t{1} << 62) / num_actions) return 0;
      n *= num_actions;
    }
    return n;
  }
};

/// What a policy needs to know about an env to be built: its name and spaces.
struct EnvSpec {
  std::string name;
  Box observation;
  std::variant<Box, Discrete> action;
  /// The env's tasks, for envs that have several (a multi-task suite); empty otherwise.
  /// Replay buffers then store each transition's task and algorithms may condition on it.
  std::vector<std::string> tasks{};
  /// The agents of a multi-agent env (`agents.agents == 0` for a single-agent one).
  AgentLayout agents{};

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
