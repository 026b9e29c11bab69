#pragma once
/// @file
/// The environment contract: spaces, one step's result, and the `Env` concept.
///
/// Light header: no torch. Environments own their observation storage and hand out
/// views of it, so stepping allocates nothing; `VecEnv` copies those views into its
/// batched tensors.

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil::envs {

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

/// What one step returns. `observation` views storage owned by the env and stays valid
/// until the env is stepped or reset again.
struct StepResult {
  std::span<const float> observation;
  double reward = 0.0;
  bool terminated = false;  ///< the MDP reached a terminal state: do not bootstrap
  bool truncated = false;   ///< stopped by a time limit: bootstrap from `observation`
};

/// Action type an env with action space `S` takes.
template <class S> struct action_for;
template <> struct action_for<Box> { using type = std::span<const float>; };
template <> struct action_for<Discrete> { using type = std::int64_t; };

template <class E>
using action_space_t = std::remove_cvref_t<decltype(std::declval<const E&>().action_space())>;
template <class E>
using action_t = typename action_for<action_space_t<E>>::type;

/// Bad input to an env (NaN or out-of-bounds action, step before reset). The message
/// names the env and the step; `VecEnv` adds the env index.
class EnvError : public Error {
 public:
  using Error::Error;
};

/// An environment: `reset(seed)` starts an episode and returns its first observation;
/// `step(action)` advances it by one step. The observation space is a `Box`; the action
/// space a `Box` (action is a span of floats) or a `Discrete` (action is an index).
/// Time limits are part of the env: `step` sets `truncated` when the episode's step
/// budget is used up. Envs are not thread-safe; `VecEnv` steps each from one thread at a time.
template <class E>
concept Env = std::movable<E> &&
    requires(E& e, const E& ce, std::uint64_t seed, action_t<E> a) {
      { E::name } -> std::convertible_to<std::string_view>;
      { ce.observation_space() } -> std::same_as<Box>;
      { e.reset(seed) } -> std::same_as<std::span<const float>>;
      { e.step(a) } -> std::same_as<StepResult>;
    };

/// An env whose actions are continuous (a `Box`).
/// What a policy needs to know about an env to be built: its spaces.
struct EnvSpec {
  std::string name;
  Box observation;
  std::variant<Box, Discrete> action;

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

/// The spec of env `e`.
template <class E>
EnvSpec spec_of(const E& e) {
  return EnvSpec{std::string(E::name), e.observation_space(), e.action_space()};
}

template <class E>
concept ContinuousEnv = Env<E> && std::same_as<action_space_t<E>, Box>;
/// An env whose actions are discrete choices.
template <class E>
concept DiscreteEnv = Env<E> && std::same_as<action_space_t<E>, Discrete>;

}  // namespace anvil::envs
