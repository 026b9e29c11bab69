#pragma once
/// @file
/// The environment contract: spaces, one step's result, and the `Env` concept.
///
/// Light header: no torch. Environments own their observation storage and hand out
/// views of it, so stepping allocates nothing; `VecEnv` copies those views into its
/// batched tensors.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil::envs {

// The spaces (core/spaces.hpp) under the names envs have always used.
using anvil::AgentLayout;
using anvil::Box;
using anvil::Discrete;
using anvil::EnvSpec;
using anvil::ObsLayout;

/// What one step returns. `observation` views storage owned by the env and stays valid
/// until the env is stepped or reset again: float numbers (`StepResult`, an env whose
/// observation space is a `Box`) or a row of bytes of several parts (`ByteStepResult`, an
/// env whose observation space is an `ObsLayout`, e.g. an image).
template <class T>
struct BasicStepResult {
  std::span<const T> observation;
  double reward = 0.0;
  bool terminated = false;  ///< the MDP reached a terminal state: do not bootstrap
  bool truncated = false;   ///< stopped by a time limit: bootstrap from `observation`
};
using StepResult = BasicStepResult<float>;
using ByteStepResult = BasicStepResult<std::uint8_t>;

/// The element of an env's observation rows, by its observation space.
template <class S> struct obs_element_for;
template <> struct obs_element_for<Box> { using type = float; };
template <> struct obs_element_for<ObsLayout> { using type = std::uint8_t; };

template <class E>
using observation_space_t = std::remove_cvref_t<decltype(std::declval<const E&>().observation_space())>;
template <class E>
using obs_element_t = typename obs_element_for<observation_space_t<E>>::type;

/// Elements in one observation row of a space: a Box's numbers, a layout's bytes.
inline std::size_t row_elements(const Box& b) noexcept { return b.size(); }
inline std::size_t row_elements(const ObsLayout& l) noexcept { return static_cast<std::size_t>(l.row_bytes()); }

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
/// `step(action)` advances it by one step. The observation space is a `Box` (observations
/// are spans of floats) or an `ObsLayout` (rows of bytes: images, or images beside
/// numbers); the action space a `Box` (action is a span of floats) or a `Discrete` (action
/// is an index).
/// Time limits are part of the env: `step` sets `truncated` when the episode's step
/// budget is used up. Envs are not thread-safe; `VecEnv` steps each from one thread at a time.
template <class E>
concept Env = std::movable<E> &&
    requires(E& e, const E& ce, std::uint64_t seed, action_t<E> a) {
      { E::name } -> std::convertible_to<std::string_view>;
      typename obs_element_t<E>;
      { e.reset(seed) } -> std::same_as<std::span<const obs_element_t<E>>>;
      { e.step(a) } -> std::same_as<BasicStepResult<obs_element_t<E>>>;
    };

/// An env whose observations are rows of bytes of several parts (an `ObsLayout`).
template <class E>
concept ByteObservations = Env<E> && std::same_as<observation_space_t<E>, ObsLayout>;

/// An env that tells which of several tasks its current episode is (a multi-task env, or
/// one that draws a task per episode): `task_names()` lists them all, `task_index()` is the
/// current episode's. Evaluations report each task apart.
template <class E>
concept TaskTagged = Env<E> && requires(const E& e) {
  { e.task_names() } -> std::convertible_to<std::vector<std::string>>;
  { e.task_index() } -> std::convertible_to<std::int64_t>;
};

/// An env that is several agents acting as one (envs/multi_agent/): it describes how its
/// observation row and joint action are laid out.
template <class E>
concept DescribesAgents = Env<E> && requires(const E& e) {
  { e.agent_layout() } -> std::same_as<AgentLayout>;
};

/// An env type that stands for several envs, each with a name of its own (`id()`), e.g. the
/// matrix games, which are one type with different payoffs: `env.id` and logs use `id()`.
template <class E>
concept NamedAtRunTime = Env<E> && requires(const E& e) {
  { e.id() } -> std::convertible_to<std::string_view>;
};

/// The name of env `e`: its `id()` where it has one, else its type's `name`.
template <class E>
[[nodiscard]] std::string env_name(const E& e) {
  if constexpr (NamedAtRunTime<E>) return std::string(e.id());
  else return std::string(E::name);
}

/// The spec of env `e` (with its tasks, when it has several, and its agents).
template <class E>
EnvSpec spec_of(const E& e) {
  EnvSpec s{env_name(e), {}, e.action_space(), {}};
  if constexpr (std::same_as<observation_space_t<E>, ObsLayout>) {
    s.layout = e.observation_space();
    const auto n = static_cast<std::size_t>(s.layout.float_numel());
    s.observation = Box{std::vector<float>(n, -std::numeric_limits<float>::infinity()),
                        std::vector<float>(n, std::numeric_limits<float>::infinity())};
  } else {
    s.observation = e.observation_space();
  }
  if constexpr (DescribesAgents<E>) s.agents = e.agent_layout();
  if constexpr (TaskTagged<E>) {
    auto names = e.task_names();
    if (names.size() > 1) s.tasks = std::move(names);
  }
  return s;
}

/// An env whose tasks are chosen at run time (`env.suite`, `env.tasks`): `select_tasks`
/// takes a suite name and a list of task names (either may be empty) and throws a
/// ConfigError naming the field at fault.
template <class E>
concept TaskSelectable = TaskTagged<E> && requires(E& e, const std::string& suite, const std::vector<std::string>& tasks) {
  e.select_tasks(suite, tasks);
};

/// An env whose time limit can be set at run time (`env.max_episode_steps`):
/// `set_max_episode_steps(n)` truncates its episodes after n steps from the next reset on,
/// and throws a ConfigError naming the field for n < 1.
template <class E>
concept TimeLimitable = Env<E> && requires(E& e, std::int64_t n) { e.set_max_episode_steps(n); };

/// An env that takes its place among several: a VecEnv calls `place(index, count)` on env
/// `index` of `count` (indices count over every rank's envs), e.g. to spread the envs over
/// tasks.
template <class E>
concept Placeable = Env<E> && requires(E& e, std::int64_t i) { e.place(i, i); };

/// An env that says whether the step it just took met its task's goal (`success()`); an
/// episode succeeds when any of its steps does. Evaluations report success rates.
template <class E>
concept ReportsSuccess = Env<E> && requires(const E& e) {
  { e.success() } -> std::convertible_to<bool>;
};

/// An env that is not trivially copyable but writes and reads its own state for
/// checkpoints: `save_state(BinaryWriter&) const` and `load_state(BinaryReader&)`, which
/// throws on a state that does not fit (a VecEnv loads into copies first, so a refused
/// checkpoint changes nothing). Trivially copyable envs are saved as bytes without this.
template <class E>
concept SavesOwnState = Env<E> && requires(const E& ce, E& e, BinaryWriter& w, BinaryReader& r) {
  ce.save_state(w);
  e.load_state(r);
};

/// An env whose actions are continuous (a `Box`).
template <class E>
concept ContinuousEnv = Env<E> && std::same_as<action_space_t<E>, Box>;
/// An env whose actions are discrete choices.
template <class E>
concept DiscreteEnv = Env<E> && std::same_as<action_space_t<E>, Discrete>;

}  // namespace anvil::envs
