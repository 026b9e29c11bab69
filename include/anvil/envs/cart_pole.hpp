#pragma once
/// @file
/// Cart-pole balancing, the same MDP as Gymnasium's CartPole-v1 so that returns can be
/// compared with published results. Light header: no torch.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/envs/detail/episode.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs {

/// Keep a pole balanced on a cart by pushing the cart left or right: the cart-pole of
/// Barto, Sutton and Anderson, "Neuronlike adaptive elements that can solve difficult
/// learning control problems" (IEEE Trans. SMC, 1983), with the constants, reward, start
/// distribution and time limit of Gymnasium's CartPole-v1
/// (https://gymnasium.farama.org/environments/classic_control/cart_pole/).
///
/// State (x, x_dot, theta, theta_dot), theta = 0 upright; computed in double as the
/// published env computes in float64. With F = +10 for action 1 and -10 for action 0,
/// g = 9.8, cart mass 1.0, pole mass m = 0.1, total mass M = 1.1, half pole length
/// l = 0.5:
///
///     temp      = (F + m l theta_dot^2 sin(theta)) / M
///     theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - m cos(theta)^2 / M))
///     x_acc     = temp - m l theta_acc cos(theta) / M
///
/// then one explicit Euler step of tau = 0.02 s (positions move with the *old*
/// velocities). Reward 1 on every step, the terminating one included (Gymnasium's
/// default, not the Sutton-Barto 0/-1 variant). Terminated when |x| > 2.4 or
/// |theta| > 12 degrees; truncated after 500 steps. Observation = the state (float32).
/// Start: every state variable ~ U(-0.05, 0.05), drawn from `Rng(seed)`.
///
/// Bad input throws `EnvError`: an action outside {0, 1}, stepping before `reset` or
/// after the episode has ended. A step that throws leaves the env unchanged. Error
/// messages say "step k" with k = `elapsed_steps()`, the number of steps the episode had
/// completed.
struct CartPole {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "CartPole-v1";
  /// Gymnasium's time limit (max_episode_steps) for CartPole-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 500;
  /// Gravity.
  static constexpr double kGravity = 9.8;
  /// Cart mass.
  static constexpr double kCartMass = 1.0;
  /// Pole mass.
  static constexpr double kPoleMass = 0.1;
  /// Half the pole's length (the published `length` is the half-length).
  static constexpr double kHalfPoleLength = 0.5;
  /// Magnitude of the push on the cart.
  static constexpr double kForce = 10.0;
  /// Integration time step in seconds.
  static constexpr double kTau = 0.02;
  /// Cart position beyond which the episode terminates.
  static constexpr double kXThreshold = 2.4;
  /// Pole angle beyond which the episode terminates: 12 degrees, in radians.
  static constexpr double kThetaThreshold = 12 * 2 * std::numbers::pi / 360;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double x = 0.0;          ///< cart position
    double x_dot = 0.0;      ///< cart velocity
    double theta = 0.0;      ///< pole angle from upright, radians
    double theta_dot = 0.0;  ///< pole angular velocity
  };

  /// As published: position within twice the termination threshold (so the observation
  /// that terminates an episode is still inside), angle within twice 12 degrees,
  /// velocities unbounded.
  [[nodiscard]] Box observation_space() const {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    const auto x = static_cast<float>(kXThreshold * 2);
    const auto th = static_cast<float>(kThetaThreshold * 2);
    return Box{{-x, -kInf, -th, -kInf}, {x, kInf, th, kInf}};
  }
  /// 0 pushes the cart left, 1 pushes it right.
  [[nodiscard]] Discrete action_space() const { return Discrete{2}; }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    State s;
    s.x = rng_.uniform(-0.05, 0.05);
    s.x_dot = rng_.uniform(-0.05, 0.05);
    s.theta = rng_.uniform(-0.05, 0.05);
    s.theta_dot = rng_.uniform(-0.05, 0.05);
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"x", s.x},
                    {"x_dot", s.x_dot},
                    {"theta", s.theta},
                    {"theta_dot", s.theta_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Push the cart left (0) or right (1) for one step of tau.
  StepResult step(std::int64_t action) {
    episode_.check_step(action, action_space());

    const double force = action == 1 ? kForce : -kForce;
    const double total_mass = kPoleMass + kCartMass;
    const double pole_mass_length = kPoleMass * kHalfPoleLength;
    const auto [x, x_dot, theta, theta_dot] = state_;
    const double cos_theta = std::cos(theta);
    const double sin_theta = std::sin(theta);
    const double temp = (force + pole_mass_length * theta_dot * theta_dot * sin_theta) / total_mass;
    const double theta_acc =
        (kGravity * sin_theta - cos_theta * temp) /
        (kHalfPoleLength * (4.0 / 3.0 - kPoleMass * cos_theta * cos_theta / total_mass));
    const double x_acc = temp - pole_mass_length * theta_acc * cos_theta / total_mass;

    state_.x = x + kTau * x_dot;
    state_.x_dot = x_dot + kTau * x_acc;
    state_.theta = theta + kTau * theta_dot;
    state_.theta_dot = theta_dot + kTau * theta_acc;
    write_observation();

    const bool terminated = state_.x < -kXThreshold || state_.x > kXThreshold ||
                            state_.theta < -kThetaThreshold || state_.theta > kThetaThreshold;
    return episode_.finish_step(obs_, /*reward=*/1.0, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// Replace the published time limit (`env.max_episode_steps`; `detail::Episode::set_max_steps`).
  void set_max_episode_steps(std::int64_t n) { episode_.set_max_steps(n); }
  /// The physical state, in double, for tests and for logging what the float32
  /// observation rounds away.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(state_.x);
    obs_[1] = static_cast<float>(state_.x_dot);
    obs_[2] = static_cast<float>(state_.theta);
    obs_[3] = static_cast<float>(state_.theta_dot);
  }

  State state_{};
  std::array<float, 4> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<CartPole>);
static_assert(DiscreteEnv<CartPole>);

/// CartPole-v1 seen through its positions only: the observation is (x, theta), the two
/// velocities hidden, so a policy has to infer them from what it saw before (a recurrent
/// policy's memory). The partially observed cart-pole of recurrent-policy benchmarks, under
/// the name RL Baselines3 Zoo gives it (CartPoleNoVel-v1, its recurrent PPO settings).
/// Dynamics, reward, start distribution, termination and time limit are CartPole-v1's
/// (its errors name CartPole-v1's steps).
struct CartPoleNoVel {
  static constexpr std::string_view name = "CartPoleNoVel-v1";

  /// CartPole-v1's bounds of x and theta.
  [[nodiscard]] Box observation_space() const {
    const auto full = pole_.observation_space();
    return Box{{full.low[0], full.low[2]}, {full.high[0], full.high[2]}};
  }
  [[nodiscard]] Discrete action_space() const { return pole_.action_space(); }
  std::span<const float> reset(std::uint64_t seed) { return positions(pole_.reset(seed)); }
  StepResult step(std::int64_t action) {
    auto r = pole_.step(action);
    r.observation = positions(r.observation);
    return r;
  }
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return pole_.elapsed_steps(); }
  void set_max_episode_steps(std::int64_t n) { pole_.set_max_episode_steps(n); }
  /// The whole physical state, velocities included.
  [[nodiscard]] CartPole::State state() const noexcept { return pole_.state(); }

 private:
  std::span<const float> positions(std::span<const float> full) noexcept {
    obs_ = {full[0], full[2]};
    return obs_;
  }
  CartPole pole_;
  std::array<float, 2> obs_{};
};

static_assert(DiscreteEnv<CartPoleNoVel>);

}  // namespace anvil::envs
