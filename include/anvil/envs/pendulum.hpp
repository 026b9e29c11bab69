#pragma once
/// @file
/// Pendulum swing-up, the same MDP as Gymnasium's Pendulum-v1 so that returns can be
/// compared with published results. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/envs/detail/episode.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs {

/// Swing a frictionless pendulum up and hold it upright with a bounded torque: the
/// classic under-actuated swing-up problem of control theory, with the constants,
/// reward, start distribution and time limit of Gymnasium's Pendulum-v1
/// (https://gymnasium.farama.org/environments/classic_control/pendulum/).
///
/// State (theta, theta_dot), theta = 0 upright, counter-clockwise positive; computed in
/// double as the published env computes in float64. With u the torque clipped to
/// [-2, 2], dt = 0.05, g = 10, m = 1, l = 1:
///
///     theta_dot' = clip(theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt, -8, 8)
///     theta'     = theta + theta_dot' dt        (semi-implicit Euler)
///     reward     = -(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)
///
/// where the reward uses the state *before* the step and normalize() maps to [-pi, pi).
/// The episode never terminates; it is truncated after 200 steps. Observation
/// [cos theta, sin theta, theta_dot] (float32), so the angle has no seam at +-pi.
/// Start: theta ~ U(-pi, pi), theta_dot ~ U(-1, 1), drawn from `Rng(seed)`.
///
/// Out-of-range actions: the published env CLIPS the torque to [-2, 2] before it enters
/// either the dynamics or the cost, so we do the same: an action of 5 is exactly an
/// action of 2, and it is not penalised beyond it. A NaN or infinite action is a bug
/// upstream, not a torque, so it throws `EnvError` instead; so does a wrong action
/// length, and stepping before `reset` or after the episode has ended. A step that
/// throws leaves the env unchanged. Error messages say "step k" with k =
/// `elapsed_steps()`, the number of steps the episode had completed.
struct Pendulum {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "Pendulum-v1";
  /// Gymnasium's time limit (max_episode_steps) for Pendulum-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 200;
  /// Largest angular speed; the dynamics clip to it, which keeps observations bounded.
  static constexpr double kMaxSpeed = 8.0;
  /// Largest torque; larger actions are clipped to it, as published.
  static constexpr double kMaxTorque = 2.0;
  /// Integration time step in seconds.
  static constexpr double kDt = 0.05;
  /// Gravity; Gymnasium's default `g` (10, not 9.81).
  static constexpr double kGravity = 10.0;
  /// Pendulum mass.
  static constexpr double kMass = 1.0;
  /// Pendulum length.
  static constexpr double kLength = 1.0;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double theta = 0.0;      ///< angle from upright, radians, not wrapped
    double theta_dot = 0.0;  ///< angular velocity, radians per second
  };

  /// [cos theta, sin theta, theta_dot] in [-1, 1] x [-1, 1] x [-8, 8], as published.
  [[nodiscard]] Box observation_space() const {
    const auto v = static_cast<float>(kMaxSpeed);
    return Box{{-1.0f, -1.0f, -v}, {1.0f, 1.0f, v}};
  }
  /// One torque in [-2, 2], as published.
  [[nodiscard]] Box action_space() const {
    const auto t = static_cast<float>(kMaxTorque);
    return Box{{-t}, {t}};
  }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    State s;
    s.theta = rng_.uniform(-std::numbers::pi, std::numbers::pi);
    s.theta_dot = rng_.uniform(-1.0, 1.0);
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"theta", s.theta}, {"theta_dot", s.theta_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Advance one step of dt with torque `action[0]` (clipped to [-2, 2], as published).
  StepResult step(std::span<const float> action) {
    episode_.check_step(action, /*size=*/1);
    const double u = std::clamp(static_cast<double>(action[0]), -kMaxTorque, kMaxTorque);
    const double th = state_.theta;
    const double thdot = state_.theta_dot;
    const double cost = normalize_angle(th) * normalize_angle(th) + 0.1 * thdot * thdot +
                        0.001 * u * u;
    double new_thdot =
        thdot + (3.0 * kGravity / (2.0 * kLength) * std::sin(th) +
                 3.0 / (kMass * kLength * kLength) * u) *
                    kDt;
    new_thdot = std::clamp(new_thdot, -kMaxSpeed, kMaxSpeed);
    state_.theta = th + new_thdot * kDt;
    state_.theta_dot = new_thdot;
    write_observation();
    return episode_.finish_step(obs_, -cost, /*terminated=*/false);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// Replace the published time limit (`env.max_episode_steps`; `detail::Episode::set_max_steps`).
  void set_max_episode_steps(std::int64_t n) { episode_.set_max_steps(n); }
  /// The physical state, in double, for tests and for logging what the float32
  /// observation rounds away.
  [[nodiscard]] State state() const noexcept { return state_; }

  /// Map an angle to [-pi, pi), as the published reward does before squaring it, so a
  /// pendulum that has spun round n times is not penalised for it.
  [[nodiscard]] static double normalize_angle(double x) noexcept {
    constexpr double kTwoPi = 2.0 * std::numbers::pi;
    double r = std::fmod(x + std::numbers::pi, kTwoPi);  // sign of x + pi
    if (r < 0.0) r += kTwoPi;                            // floored modulo, as Python's %
    return r - std::numbers::pi;
  }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(std::cos(state_.theta));
    obs_[1] = static_cast<float>(std::sin(state_.theta));
    obs_[2] = static_cast<float>(state_.theta_dot);
  }

  State state_{};
  std::array<float, 3> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<Pendulum>);
static_assert(ContinuousEnv<Pendulum>);

}  // namespace anvil::envs
