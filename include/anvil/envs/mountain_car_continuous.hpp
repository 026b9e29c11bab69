#pragma once
/// @file
/// Mountain car with a continuous throttle, the same MDP as Gymnasium's
/// MountainCarContinuous-v0 so that returns can be compared with published results.
/// Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/envs/detail/episode.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs {

/// Drive an under-powered car out of a valley: it must rock back and forth to build
/// momentum, so greedy throttle fails and exploration is the whole difficulty. The
/// mountain car of A. W. Moore, "Efficient memory-based learning for robot control"
/// (PhD thesis, Cambridge, 1990; tech. report UCAM-CL-TR-209), with the constants,
/// reward, start distribution and time limit of Gymnasium's MountainCarContinuous-v0
/// (https://gymnasium.farama.org/environments/classic_control/mountain_car_continuous/).
///
/// State (position, velocity). With force = clip(action, -1, 1) and power 0.0015:
///
///     velocity' = clip(velocity + force * 0.0015 - 0.0025 cos(3 position), -0.07, 0.07)
///     position' = clip(position + velocity', -1.2, 0.6)
///     velocity' = 0 if position' == -1.2 and velocity' < 0   (inelastic left wall)
///
/// Terminated when position' >= 0.45 and velocity' >= 0 (goal_velocity 0); truncated
/// after 999 steps. Reward -0.1 action^2 on every step, plus 100 on the terminating one.
/// Observation = the state (float32). Start: position ~ U(-0.6, -0.4), velocity 0,
/// drawn from `Rng(seed)`. Each step computes in double and then rounds the stored
/// state to float32, because the published env stores its state as a float32 array.
///
/// Out-of-range actions: the published env CLIPS the action to [-1, 1] for the force
/// only; its control cost uses the action as given (`-0.1 * action[0]^2`), so an action
/// of 3 pushes exactly as hard as 1 but costs 0.9, not 0.1. We do the same. A NaN or
/// infinite action is a bug upstream, not a throttle, so it throws `EnvError` instead;
/// so does a wrong action length, and stepping before `reset` or after the episode has
/// ended. A step that throws leaves the env unchanged. Error messages say "step k" with
/// k = `elapsed_steps()`, the number of steps the episode had completed.
struct MountainCarContinuous {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "MountainCarContinuous-v0";
  /// Gymnasium's time limit (max_episode_steps) for MountainCarContinuous-v0.
  static constexpr std::int64_t kMaxEpisodeSteps = 999;
  /// Smallest action that still changes the force; smaller ones are clipped to it.
  static constexpr double kMinAction = -1.0;
  /// Largest action that still changes the force; larger ones are clipped to it.
  static constexpr double kMaxAction = 1.0;
  /// Left wall.
  static constexpr double kMinPosition = -1.2;
  /// Right edge of the track.
  static constexpr double kMaxPosition = 0.6;
  /// Speed limit; velocities are clipped to it.
  static constexpr double kMaxSpeed = 0.07;
  /// Position at (or beyond) which the car has escaped.
  static constexpr double kGoalPosition = 0.45;
  /// Least velocity at the goal that counts (Gymnasium's default goal_velocity).
  static constexpr double kGoalVelocity = 0.0;
  /// Force per unit of clipped action.
  static constexpr double kPower = 0.0015;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double position = 0.0;  ///< along the track; the valley floor is at -pi/6
    double velocity = 0.0;  ///< position change per step
  };

  /// [position, velocity] in [-1.2, 0.6] x [-0.07, 0.07], as published.
  [[nodiscard]] Box observation_space() const {
    const auto v = static_cast<float>(kMaxSpeed);
    return Box{{static_cast<float>(kMinPosition), -v}, {static_cast<float>(kMaxPosition), v}};
  }
  /// One throttle value in [-1, 1], as published.
  [[nodiscard]] Box action_space() const {
    return Box{{static_cast<float>(kMinAction)}, {static_cast<float>(kMaxAction)}};
  }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    return set_state(State{.position = rng_.uniform(-0.6, -0.4), .velocity = 0.0});
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"position", s.position}, {"velocity", s.velocity}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Apply throttle `action[0]` (force clipped to [-1, 1], cost not, as published).
  StepResult step(std::span<const float> action) {
    episode_.check_step(action, /*size=*/1);
    const double a = static_cast<double>(action[0]);
    const double force = std::clamp(a, kMinAction, kMaxAction);

    double position = state_.position;
    double velocity = state_.velocity;
    velocity += force * kPower - 0.0025 * std::cos(3.0 * position);
    velocity = std::clamp(velocity, -kMaxSpeed, kMaxSpeed);
    position += velocity;
    position = std::clamp(position, kMinPosition, kMaxPosition);
    if (position == kMinPosition && velocity < 0.0) velocity = 0.0;

    const bool terminated = position >= kGoalPosition && velocity >= kGoalVelocity;
    const double reward = (terminated ? 100.0 : 0.0) - 0.1 * a * a;
    state_.position = static_cast<float>(position);
    state_.velocity = static_cast<float>(velocity);
    write_observation();
    return episode_.finish_step(obs_, reward, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// Replace the published time limit (`env.max_episode_steps`; `detail::Episode::set_max_steps`).
  void set_max_episode_steps(std::int64_t n) { episode_.set_max_steps(n); }
  /// The physical state, for tests and for logging.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(state_.position);
    obs_[1] = static_cast<float>(state_.velocity);
  }

  State state_{};
  std::array<float, 2> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<MountainCarContinuous>);
static_assert(ContinuousEnv<MountainCarContinuous>);

}  // namespace anvil::envs
