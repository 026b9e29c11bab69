#pragma once
/// @file
/// The acrobot swing-up, the same MDP as Gymnasium's Acrobot-v1 so that returns can be
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

/// Swing the tip of a two-link pendulum, actuated only at the elbow, above a line one
/// link length over the shoulder. The acrobot of R. S. Sutton, "Generalization in
/// reinforcement learning: successful examples using sparse coarse coding" (NIPS 8,
/// 1996) and Sutton & Barto, "Reinforcement Learning: An Introduction" (sec. 11.3 of
/// the 1998 edition), with the constants, reward, start distribution and time limit of
/// Gymnasium's Acrobot-v1
/// (https://gymnasium.farama.org/environments/classic_control/acrobot/).
///
/// State (theta1, theta2, theta1_dot, theta2_dot): theta1 is the shoulder angle from
/// hanging straight down, theta2 the elbow angle relative to link 1; computed in double
/// as the published env computes in float64. Links of length 1 and mass 1, centres of
/// mass at 0.5, moments of inertia 1, g = 9.8, torque tau in {-1, 0, +1} for actions
/// {0, 1, 2}. The *book* equations of motion (Gymnasium's default; the NIPS paper
/// drops the theta1_dot^2 term of theta2_acc):
///
///     d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos theta2) + I1 + I2
///     d2 = m2 (lc2^2 + l1 lc2 cos theta2) + I2
///     phi2 = m2 lc2 g cos(theta1 + theta2 - pi/2)
///     phi1 = -m2 l1 lc2 theta2_dot^2 sin theta2 - 2 m2 l1 lc2 theta2_dot theta1_dot sin theta2
///            + (m1 lc1 + m2 l1) g cos(theta1 - pi/2) + phi2
///     theta2_acc = (tau + d2/d1 phi1 - m2 l1 lc2 theta1_dot^2 sin theta2 - phi2)
///                  / (m2 lc2^2 + I2 - d2^2/d1)
///     theta1_acc = -(d2 theta2_acc + phi1) / d1
///
/// integrated by one classical Runge-Kutta (RK4) step of dt = 0.2 s with the torque held
/// constant. Afterwards the angles are wrapped into [-pi, pi] (the published wrap adds
/// or subtracts 2 pi while outside, so exactly +-pi is kept) and the velocities clipped
/// to [-4 pi, 4 pi] and [-9 pi, 9 pi]. Terminated when the tip height
/// -cos(theta1) - cos(theta1 + theta2) exceeds 1.0; reward -1 per step and 0 on the
/// terminating step; truncated after 500 steps. Observation [cos theta1, sin theta1,
/// cos theta2, sin theta2, theta1_dot, theta2_dot] (float32), so angles have no seam.
/// Start: every state variable ~ U(-0.1, 0.1) rounded to float32 (the published env
/// casts its start state to float32), drawn from `Rng(seed)`.
///
/// Bad input throws `EnvError`: an action outside {0, 1, 2}, stepping before `reset` or
/// after the episode has ended. A step that throws leaves the env unchanged. Error
/// messages say "step k" with k = `elapsed_steps()`, the number of steps the episode had
/// completed.
struct Acrobot {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "Acrobot-v1";
  /// Gymnasium's time limit (max_episode_steps) for Acrobot-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 500;
  /// Integration time step in seconds: one RK4 step per env step.
  static constexpr double kDt = 0.2;
  /// Length of link 1 (shoulder to elbow); link 2's length only matters for drawing.
  static constexpr double kLinkLength1 = 1.0;
  /// Mass of link 1.
  static constexpr double kLinkMass1 = 1.0;
  /// Mass of link 2.
  static constexpr double kLinkMass2 = 1.0;
  /// Distance from the shoulder to link 1's centre of mass.
  static constexpr double kLinkComPos1 = 0.5;
  /// Distance from the elbow to link 2's centre of mass.
  static constexpr double kLinkComPos2 = 0.5;
  /// Moment of inertia of each link.
  static constexpr double kLinkMoi = 1.0;
  /// Gravity.
  static constexpr double kGravity = 9.8;
  /// Shoulder speed limit; velocities are clipped to it after each step.
  static constexpr double kMaxVel1 = 4 * std::numbers::pi;
  /// Elbow speed limit; velocities are clipped to it after each step.
  static constexpr double kMaxVel2 = 9 * std::numbers::pi;
  /// Tip height above the shoulder that ends the episode.
  static constexpr double kGoalHeight = 1.0;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double theta1 = 0.0;      ///< shoulder angle from hanging down, radians
    double theta2 = 0.0;      ///< elbow angle relative to link 1, radians
    double theta1_dot = 0.0;  ///< shoulder angular velocity
    double theta2_dot = 0.0;  ///< elbow angular velocity
  };

  /// As published: cosines and sines in [-1, 1], velocities within their limits.
  [[nodiscard]] Box observation_space() const {
    const auto v1 = static_cast<float>(kMaxVel1);
    const auto v2 = static_cast<float>(kMaxVel2);
    return Box{{-1.0f, -1.0f, -1.0f, -1.0f, -v1, -v2}, {1.0f, 1.0f, 1.0f, 1.0f, v1, v2}};
  }
  /// 0, 1, 2 apply torque -1, 0, +1 at the elbow.
  [[nodiscard]] Discrete action_space() const { return Discrete{3}; }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    const auto draw = [this] {
      return static_cast<double>(static_cast<float>(rng_.uniform(-0.1, 0.1)));
    };
    State s;
    s.theta1 = draw();
    s.theta2 = draw();
    s.theta1_dot = draw();
    s.theta2_dot = draw();
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"theta1", s.theta1},
                    {"theta2", s.theta2},
                    {"theta1_dot", s.theta1_dot},
                    {"theta2_dot", s.theta2_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Apply elbow torque `action - 1` for dt.
  StepResult step(std::int64_t action) {
    episode_.check_step(action, action_space());
    const double torque = static_cast<double>(action - 1);

    using Vec = std::array<double, 4>;
    const Vec y0{state_.theta1, state_.theta2, state_.theta1_dot, state_.theta2_dot};
    const auto along = [](const Vec& y, double h, const Vec& k) {
      return Vec{y[0] + h * k[0], y[1] + h * k[1], y[2] + h * k[2], y[3] + h * k[3]};
    };
    const Vec k1 = derivatives(y0, torque);
    const Vec k2 = derivatives(along(y0, kDt / 2, k1), torque);
    const Vec k3 = derivatives(along(y0, kDt / 2, k2), torque);
    const Vec k4 = derivatives(along(y0, kDt, k3), torque);
    Vec y;
    for (std::size_t i = 0; i < 4; ++i)
      y[i] = y0[i] + kDt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);

    state_.theta1 = wrap_angle(y[0]);
    state_.theta2 = wrap_angle(y[1]);
    state_.theta1_dot = std::clamp(y[2], -kMaxVel1, kMaxVel1);
    state_.theta2_dot = std::clamp(y[3], -kMaxVel2, kMaxVel2);
    write_observation();

    const bool terminated =
        -std::cos(state_.theta1) - std::cos(state_.theta2 + state_.theta1) > kGoalHeight;
    return episode_.finish_step(obs_, terminated ? 0.0 : -1.0, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// Replace the published time limit (`env.max_episode_steps`; `detail::Episode::set_max_steps`).
  void set_max_episode_steps(std::int64_t n) { episode_.set_max_steps(n); }
  /// The physical state, in double, for tests and for logging what the observation's
  /// sines and cosines hide.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  /// The book equations of motion (see the struct comment): d/dt of the state. Locals
  /// are named as in the equations so the two can be read side by side.
  static std::array<double, 4> derivatives(const std::array<double, 4>& s, double torque) {
    constexpr double m1 = kLinkMass1, m2 = kLinkMass2, l1 = kLinkLength1;
    constexpr double lc1 = kLinkComPos1, lc2 = kLinkComPos2, i1 = kLinkMoi, i2 = kLinkMoi;
    constexpr double g = kGravity, pi = std::numbers::pi;
    const double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    const double d1 =
        m1 * lc1 * lc1 + m2 * (l1 * l1 + lc2 * lc2 + 2 * l1 * lc2 * std::cos(theta2)) + i1 + i2;
    const double d2 = m2 * (lc2 * lc2 + l1 * lc2 * std::cos(theta2)) + i2;
    const double phi2 = m2 * lc2 * g * std::cos(theta1 + theta2 - pi / 2);
    const double phi1 = -m2 * l1 * lc2 * dtheta2 * dtheta2 * std::sin(theta2) -
                        2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (m1 * lc1 + m2 * l1) * g * std::cos(theta1 - pi / 2) + phi2;
    const double ddtheta2 =
        (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 * dtheta1 * std::sin(theta2) - phi2) /
        (m2 * lc2 * lc2 + i2 - d2 * d2 / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    return {dtheta1, dtheta2, ddtheta1, ddtheta2};
  }

  /// The published wrap: add or subtract 2 pi until inside [-pi, pi]. Angles from a step
  /// are within a few turns; std::remainder first keeps a huge angle given to set_state
  /// from looping (almost) forever.
  static double wrap_angle(double x) noexcept {
    constexpr double kPi = std::numbers::pi;
    if (std::abs(x) > 8 * kPi) x = std::remainder(x, 2 * kPi);
    while (x > kPi) x -= 2 * kPi;
    while (x < -kPi) x += 2 * kPi;
    return x;
  }

  void write_observation() noexcept {
    obs_[0] = static_cast<float>(std::cos(state_.theta1));
    obs_[1] = static_cast<float>(std::sin(state_.theta1));
    obs_[2] = static_cast<float>(std::cos(state_.theta2));
    obs_[3] = static_cast<float>(std::sin(state_.theta2));
    obs_[4] = static_cast<float>(state_.theta1_dot);
    obs_[5] = static_cast<float>(state_.theta2_dot);
  }

  State state_{};
  std::array<float, 6> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<Acrobot>);
static_assert(DiscreteEnv<Acrobot>);

}  // namespace anvil::envs
