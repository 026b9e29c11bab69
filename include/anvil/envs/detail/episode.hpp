#pragma once
/// @file
/// The bookkeeping every built-in env shares: the episode's phase and step count, its
/// time limit, and the checks (and their error messages) that make bad input throw
/// `EnvError` before the env's state is touched. Light header: no torch.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs::detail {

/// One env's episode, held by the env as a member so that the built-in envs word their
/// errors alike ("NAME: step k: ...", with k the steps completed) and apply their time
/// limits alike. The checks only read, so an env that calls them all before changing its
/// own state keeps its promise that a step which throws leaves it unchanged.
class Episode {
 public:
  /// One field of a start state, named so that the error for a bad one can say which.
  struct StateField {
    const char* name;  ///< as the field is spelled in the env's `State`
    double value;      ///< the value `set_state` was given
  };

  /// `env_name` must outlive the episode (the envs pass their static `name`);
  /// `max_steps` is the time limit after which a step reports `truncated`.
  Episode(std::string_view env_name, std::int64_t max_steps) noexcept
      : env_name_(env_name), max_steps_(max_steps) {}

  /// Begin a new episode (from `set_state`, which `reset` goes through) at the state made
  /// of `state`: the step count restarts at 0 and stepping is allowed again, whatever
  /// ended the last one. Throws, changing nothing, if a field is not finite: the dynamics
  /// would carry a NaN into every later observation.
  void start(std::initializer_list<StateField> state) {
    for (const StateField& f : state)
      if (!std::isfinite(f.value))
        throw EnvError(std::string(env_name_) + ": set_state: " + f.name + " is " +
                       non_finite_name(f.value));
    steps_ = 0;
    phase_ = Phase::kRunning;
  }

  /// Throw unless a step may run with this Box action: an episode is running and the
  /// action has `size` elements, all finite. Values outside the box are let through,
  /// because the published envs clip them; a NaN or infinity is a bug upstream that
  /// clipping would hide.
  void check_step(std::span<const float> action, std::size_t size) const {
    check_running();
    if (action.size() != size)
      fail("action has " + std::to_string(action.size()) + " elements, expected " +
           std::to_string(size));
    for (std::size_t i = 0; i < action.size(); ++i)
      if (!std::isfinite(action[i]))
        fail("action[" + std::to_string(i) + "] is " + non_finite_name(action[i]));
  }

  /// Throw unless a step may run with this discrete action: an episode is running and the
  /// action is one of `space`'s choices (there is nothing to clip an index to).
  void check_step(std::int64_t action, const Discrete& space) const {
    check_running();
    if (!space.contains(action))
      fail("action " + std::to_string(action) + " is not in Discrete(" +
           std::to_string(space.n) + ")");
  }

  /// Count the step the env has just applied and close the episode if it ended there,
  /// so the next step throws. A terminating step is never also truncated: terminal
  /// states must not be bootstrapped from, whatever the step count.
  StepResult finish_step(std::span<const float> observation, double reward, bool terminated) {
    ++steps_;
    const bool truncated = !terminated && steps_ >= max_steps_;
    if (terminated) phase_ = Phase::kTerminated;
    if (truncated) phase_ = Phase::kTruncated;
    return StepResult{observation, reward, terminated, truncated};
  }

  /// Count the step the env has just applied and end the episode there, truncated, before
  /// its time limit: the env cannot go on (a simulator that went unstable), and the step's
  /// outcome must not be treated as terminal.
  StepResult cut_short(std::span<const float> observation, double reward) {
    ++steps_;
    phase_ = Phase::kCutShort;
    return StepResult{observation, reward, false, true};
  }

  /// Continue an episode restored from a checkpoint, `steps` steps in (running, or ended
  /// at the time limit when it has reached it).
  void resume(std::int64_t steps) noexcept {
    steps_ = steps;
    phase_ = steps >= max_steps_ ? Phase::kTruncated : Phase::kRunning;
  }

  /// Set the time limit (`env.max_episode_steps`): episodes from the next `start` on are
  /// truncated after `max_steps` steps. Throws a ConfigError naming the field for fewer than 1.
  void set_max_steps(std::int64_t max_steps) {
    if (max_steps < 1)
      throw ConfigError(std::string(env_name_) + ": env.max_episode_steps=" + std::to_string(max_steps) +
                        ": a time limit is at least 1 step");
    max_steps_ = max_steps;
  }

  /// Steps completed in the current episode (0 before the first `start`).
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

 private:
  enum class Phase { kNotStarted, kRunning, kTerminated, kTruncated, kCutShort };

  // Stepping before `reset` or past the end of an episode is a bug in the caller's loop,
  // not something to step through silently.
  void check_running() const {
    if (phase_ == Phase::kNotStarted)
      throw EnvError(std::string(env_name_) + ": step() called before reset()");
    if (phase_ == Phase::kTerminated)
      fail("the episode has ended (terminated); call reset() first");
    if (phase_ == Phase::kTruncated)
      fail("the episode has ended (truncated at the time limit); call reset() first");
    if (phase_ == Phase::kCutShort)
      fail("the episode has ended (truncated: the env could not go on); call reset() first");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw EnvError(std::string(env_name_) + ": step " + std::to_string(steps_) + ": " + what);
  }

  std::string_view env_name_;
  std::int64_t max_steps_;
  std::int64_t steps_ = 0;
  Phase phase_ = Phase::kNotStarted;
};

}  // namespace anvil::envs::detail
