// Tests for the built-in environments: each step is checked against the published
// (Gymnasium) equations worked by hand, and each env's contract — spaces, time limit,
// termination, seeding, and the errors bad input raises — against its header.

#include <anvil/envs/pendulum.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>

namespace {

using anvil::envs::Acrobot;
using anvil::envs::Box;
using anvil::envs::CartPole;
using anvil::envs::EnvError;
using anvil::envs::MountainCarContinuous;
using anvil::envs::Pendulum;
using anvil::envs::StepResult;

constexpr double kPi = std::numbers::pi;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// Tolerance for comparing with hand-computed values: observations are float32, so they
/// carry a relative rounding of about 6e-8; 1e-6 leaves room for that and nothing more.
doctest::Approx near(double v) { return doctest::Approx(v).epsilon(1e-6); }

/// Step a one-dimensional Box env with the scalar action `a`.
template <class E>
StepResult step_with(E& env, float a) {
  const std::array<float, 1> action{a};
  return env.step(action);
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

/// What one step did, copied out of the env so that it outlives the env.
struct Outcome {
  std::vector<float> observation;
  double reward = 0.0;
};

/// Step a fresh one-dimensional Box env from state `s` with the scalar action `a`, so a
/// test can compare two actions (or two states) without one env's step touching the other.
template <class E>
Outcome step_from(const typename E::State& s, float a) {
  E env;
  env.set_state(s);
  const StepResult r = step_with(env, a);
  return {copy(r.observation), r.reward};
}

/// Compare a Box with its published bounds, low and high apart so a failure says which.
void check_bounds(const Box& box, const std::vector<float>& low, const std::vector<float>& high) {
  CHECK(box.low == low);
  CHECK(box.high == high);
}

/// Run `env` to its time limit with `step_once`: no step before step `limit` may end the
/// episode, and step `limit` must truncate it without terminating it. Returns that last
/// step's result for the env's own checks.
template <class E, class StepOnce>
StepResult check_truncates_at(E& env, std::int64_t limit, StepOnce step_once) {
  for (std::int64_t i = 1; i < limit; ++i) {
    const StepResult r = step_once();
    REQUIRE_FALSE(r.terminated);
    REQUIRE_FALSE(r.truncated);
  }
  const StepResult last = step_once();
  CHECK(last.truncated);
  CHECK_FALSE(last.terminated);
  CHECK(env.elapsed_steps() == limit);
  return last;
}

/// Check the reset contract every env shares: a seed fixes the start, even after
/// `step_once` has moved the episode on; another seed gives another start; and each of
/// 200 seeded starts lies in the observation space and passes the env's own
/// `check_start`, called with the start's observation.
template <class E, class StepOnce, class CheckStart>
void check_seeded_resets(E& env, StepOnce step_once, CheckStart check_start) {
  const std::vector<float> first = copy(env.reset(42));
  step_once();
  CHECK(copy(env.reset(42)) == first);
  CHECK(copy(env.reset(43)) != first);
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const std::span<const float> obs = env.reset(seed);
    CHECK(env.observation_space().contains(obs));
    check_start(obs);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Pendulum-v1
// ---------------------------------------------------------------------------------------

TEST_CASE("Pendulum: one step matches the published dynamics computed by hand") {
  Pendulum env;
  env.set_state({.theta = 0.5, .theta_dot = -0.3});
  const StepResult r = step_with(env, 1.5f);

  // Cost of the state *before* the step and of the torque:
  //   theta^2 + 0.1 theta_dot^2 + 0.001 u^2 = 0.25 + 0.1 * 0.09 + 0.001 * 2.25 = 0.26125
  CHECK(r.reward == near(-0.26125));
  // theta_dot' = theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt
  //            = -0.3 + (3 * 10 / 2 * sin(0.5) + 3 / 1 * 1.5) * 0.05
  //            = -0.3 + (15 * 0.4794255386 + 4.5) * 0.05 = 0.2845691540, inside [-8, 8]
  const double theta_dot = -0.3 + (15.0 * std::sin(0.5) + 3.0 * 1.5) * 0.05;
  CHECK(theta_dot == near(0.2845691540));
  // theta' = theta + theta_dot' dt = 0.5 + 0.2845691540 * 0.05 = 0.5142284577
  const double theta = 0.5 + theta_dot * 0.05;
  CHECK(theta == near(0.5142284577));

  REQUIRE(r.observation.size() == 3);
  CHECK(r.observation[0] == near(std::cos(theta)));  // 0.8706724747
  CHECK(r.observation[1] == near(std::sin(theta)));  // 0.4918632349
  CHECK(r.observation[2] == near(theta_dot));
  CHECK_FALSE(r.terminated);
  CHECK_FALSE(r.truncated);
  CHECK(env.elapsed_steps() == 1);
  CHECK(env.state().theta == near(theta));
}

TEST_CASE("Pendulum: the cost normalises the angle and the speed is clipped to 8") {
  const Outcome a = step_from<Pendulum>({.theta = 0.5, .theta_dot = 0.0}, 0.0f);
  const Outcome b =  // three turns further
      step_from<Pendulum>({.theta = 0.5 + 3 * 2 * kPi, .theta_dot = 0.0}, 0.0f);
  CHECK(a.reward == near(b.reward));

  // theta = 3.5 is 3.5 - 2 pi = -2.7831853 from upright: cost 2.7831853^2 = 7.7461204.
  const Outcome c = step_from<Pendulum>({.theta = 3.5, .theta_dot = 0.0}, 0.0f);
  CHECK(c.reward == near(-(3.5 - 2 * kPi) * (3.5 - 2 * kPi)));
  CHECK(Pendulum::normalize_angle(3.5) == near(3.5 - 2 * kPi));
  CHECK(Pendulum::normalize_angle(-3.5) == near(-3.5 + 2 * kPi));

  // theta_dot' = 7.9 + (15 sin(pi/2) + 3 * 2) * 0.05 = 7.9 + 1.05 = 8.95 -> clipped to 8;
  // theta' = pi/2 + 8 * 0.05 = pi/2 + 0.4 uses the clipped speed.
  Pendulum d;
  d.set_state({.theta = kPi / 2, .theta_dot = 7.9});
  const StepResult r = step_with(d, 2.0f);
  CHECK(r.observation[2] == 8.0f);
  CHECK(d.state().theta == near(kPi / 2 + 0.4));
}

TEST_CASE("Pendulum: an out-of-range torque acts exactly as the bound it is clipped to") {
  for (const auto [outside, bound] : {std::array{5.0f, 2.0f}, std::array{-100.0f, -2.0f}}) {
    const Pendulum::State start{.theta = 1.0, .theta_dot = 0.5};
    const Outcome clipped = step_from<Pendulum>(start, outside);
    const Outcome at_bound = step_from<Pendulum>(start, bound);
    CHECK(clipped.observation == at_bound.observation);
    CHECK(clipped.reward == at_bound.reward);  // the cost uses the clipped torque too
  }
}

TEST_CASE("Pendulum: spaces have the published bounds") {
  const Pendulum env;
  check_bounds(env.observation_space(), {-1.0f, -1.0f, -8.0f}, {1.0f, 1.0f, 8.0f});
  check_bounds(env.action_space(), {-2.0f}, {2.0f});
}

TEST_CASE("Pendulum: the time limit truncates at step 200 and not before") {
  Pendulum env;
  env.reset(7);
  check_truncates_at(env, 200, [&] { return step_with(env, 0.0f); });
  CHECK_THROWS_WITH_AS(
      step_with(env, 0.0f),
      "Pendulum-v1: step 200: the episode has ended (truncated at the time limit); "
      "call reset() first",
      EnvError);
  env.reset(7);
  CHECK(env.elapsed_steps() == 0);
  CHECK_FALSE(step_with(env, 0.0f).truncated);
}

TEST_CASE("Pendulum: reset draws the published start state, reproducibly from the seed") {
  Pendulum env;
  check_seeded_resets(env, [&] { step_with(env, 1.0f); }, [&](std::span<const float>) {
    CHECK(env.state().theta >= -kPi);
    CHECK(env.state().theta < kPi);
    CHECK(std::abs(env.state().theta_dot) <= 1.0);
    CHECK(env.elapsed_steps() == 0);
  });
}

TEST_CASE("Pendulum: a NaN or infinite torque throws and names the env and the step") {
  Pendulum env;
  env.reset(1);
  for (int i = 0; i < 3; ++i) step_with(env, 0.5f);
  const Pendulum::State before = env.state();
  CHECK_THROWS_WITH_AS(step_with(env, kNan), "Pendulum-v1: step 3: action[0] is nan", EnvError);
  CHECK_THROWS_WITH_AS(step_with(env, kInf), "Pendulum-v1: step 3: action[0] is inf", EnvError);
  CHECK_THROWS_WITH_AS(step_with(env, -kInf), "Pendulum-v1: step 3: action[0] is -inf",
                       EnvError);
  // A step that throws changes nothing; the episode goes on.
  CHECK(env.elapsed_steps() == 3);
  CHECK(env.state().theta == before.theta);
  CHECK(env.state().theta_dot == before.theta_dot);
  step_with(env, 0.5f);
  CHECK(env.elapsed_steps() == 4);
}

TEST_CASE("Pendulum: an action of the wrong length throws") {
  Pendulum env;
  env.reset(1);
  const std::array<float, 2> two{0.0f, 0.0f};
  CHECK_THROWS_WITH_AS(env.step(two), "Pendulum-v1: step 0: action has 2 elements, expected 1",
                       EnvError);
  CHECK_THROWS_AS(env.step(std::span<const float>{}), EnvError);
}

TEST_CASE("Pendulum: stepping before reset throws") {
  Pendulum env;
  CHECK_THROWS_WITH_AS(step_with(env, 0.0f), "Pendulum-v1: step() called before reset()",
                       EnvError);
}

TEST_CASE("Pendulum: set_state rejects a non-finite state") {
  Pendulum env;
  CHECK_THROWS_WITH_AS(env.set_state({.theta = 0.0, .theta_dot = std::nan("")}),
                       "Pendulum-v1: set_state: theta_dot is nan", EnvError);
}

// ---------------------------------------------------------------------------------------
// CartPole-v1
// ---------------------------------------------------------------------------------------

TEST_CASE("CartPole: one step matches the published dynamics computed by hand") {
  CartPole env;
  env.set_state({.x = 0.1, .x_dot = -0.2, .theta = 0.05, .theta_dot = 0.3});
  const StepResult r = env.step(1);  // push right: F = +10

  // Total mass M = 1.0 + 0.1 = 1.1; pole mass times half length m l = 0.1 * 0.5 = 0.05.
  // temp = (F + m l theta_dot^2 sin(theta)) / M = (10 + 0.05 * 0.09 * sin(0.05)) / 1.1
  const double temp = (10.0 + 0.05 * 0.3 * 0.3 * std::sin(0.05)) / 1.1;
  CHECK(temp == near(9.0911135511));
  // theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - m cos(theta)^2 / M))
  const double theta_acc = (9.8 * std::sin(0.05) - std::cos(0.05) * temp) /
                           (0.5 * (4.0 / 3.0 - 0.1 * std::cos(0.05) * std::cos(0.05) / 1.1));
  CHECK(theta_acc == near(-13.8252074241));
  // x_acc = temp - m l theta_acc cos(theta) / M
  const double x_acc = temp - 0.05 * theta_acc * std::cos(0.05) / 1.1;
  CHECK(x_acc == near(9.7187467109));

  // Explicit Euler, tau = 0.02: positions move with the old velocities.
  REQUIRE(r.observation.size() == 4);
  CHECK(r.observation[0] == near(0.1 + 0.02 * -0.2));          // 0.096
  CHECK(r.observation[1] == near(-0.2 + 0.02 * x_acc));        // -0.0056250658
  CHECK(r.observation[2] == near(0.05 + 0.02 * 0.3));          // 0.056
  CHECK(r.observation[3] == near(0.3 + 0.02 * theta_acc));     // 0.0234958515
  CHECK(r.reward == 1.0);
  CHECK_FALSE(r.terminated);
  CHECK_FALSE(r.truncated);

  // Action 0 pushes left with F = -10: only the sign of F changes in temp.
  CartPole left;
  left.set_state({.x = 0.0, .x_dot = 0.0, .theta = 0.0, .theta_dot = 0.0});
  // theta = 0: temp = -10 / 1.1; theta_acc = (0 - temp) / (0.5 (4/3 - 0.1 / 1.1));
  // x_dot' = 0.02 (temp - 0.05 theta_acc / 1.1).
  const double temp0 = -10.0 / 1.1;
  const double theta_acc0 = -temp0 / (0.5 * (4.0 / 3.0 - 0.1 / 1.1));
  const StepResult l = left.step(0);
  CHECK(l.observation[1] == near(0.02 * (temp0 - 0.05 * theta_acc0 / 1.1)));
  CHECK(l.observation[3] == near(0.02 * theta_acc0));
}

TEST_CASE("CartPole: the episode terminates when the pole passes 12 degrees or the cart 2.4") {
  const double threshold = 12 * 2 * kPi / 360;  // 0.2094395 rad
  SUBCASE("the pole falls") {
    CartPole env;
    env.set_state({.x = 0.0, .x_dot = 0.0, .theta = 0.2, .theta_dot = 1.0});
    const StepResult r = env.step(1);
    // theta' = 0.2 + 0.02 * 1.0 = 0.22 > 0.2094395
    CHECK(env.state().theta == near(0.22));
    CHECK(env.state().theta > threshold);
    CHECK(r.terminated);
    CHECK_FALSE(r.truncated);
    CHECK(r.reward == 1.0);  // the terminating step earns 1 too, as published
    CHECK_THROWS_WITH_AS(env.step(1),
                         "CartPole-v1: step 1: the episode has ended (terminated); "
                         "call reset() first",
                         EnvError);
  }
  SUBCASE("the pole is still inside") {
    CartPole env;
    env.set_state({.x = 0.0, .x_dot = 0.0, .theta = -0.2, .theta_dot = -0.4});
    // theta' = -0.2 - 0.02 * 0.4 = -0.208 > -0.2094395
    CHECK_FALSE(env.step(0).terminated);
  }
  SUBCASE("the cart leaves the track to the right") {
    CartPole env;
    env.set_state({.x = 2.39, .x_dot = 1.0, .theta = 0.0, .theta_dot = 0.0});
    CHECK(env.step(1).terminated);  // x' = 2.39 + 0.02 = 2.41 > 2.4
  }
  SUBCASE("the cart leaves the track to the left") {
    CartPole env;
    env.set_state({.x = -2.39, .x_dot = -1.0, .theta = 0.0, .theta_dot = 0.0});
    CHECK(env.step(0).terminated);  // x' = -2.41 < -2.4
  }
}

TEST_CASE("CartPole: spaces have the published bounds") {
  const CartPole env;
  const auto theta_high = static_cast<float>(12 * 2 * kPi / 360 * 2);  // 24 degrees
  check_bounds(env.observation_space(), {-4.8f, -kInf, -theta_high, -kInf},
               {4.8f, kInf, theta_high, kInf});
  CHECK(theta_high == near(0.4188790205));
  CHECK(env.action_space().n == 2);
}

TEST_CASE("CartPole: the time limit truncates at step 500 and not before") {
  CartPole env;
  auto obs = copy(env.reset(11));
  // A hand-tuned linear controller that balances the pole for well over 500 steps.
  const auto policy = [](const std::vector<float>& o) -> std::int64_t {
    return o[2] + 0.5 * o[3] + 0.05 * o[0] + 0.1 * o[1] > 0 ? 1 : 0;
  };
  check_truncates_at(env, 500, [&] {
    const StepResult r = env.step(policy(obs));
    obs = copy(r.observation);
    return r;
  });
  CHECK_THROWS_AS(env.step(0), EnvError);
}

TEST_CASE("CartPole: reset draws the published start state, reproducibly from the seed") {
  CartPole env;
  check_seeded_resets(env, [&] { env.step(1); }, [](std::span<const float> obs) {
    for (const float v : obs) {
      CHECK(v >= -0.05f);
      CHECK(v <= 0.05f);
    }
  });
}

TEST_CASE("CartPole: an action outside Discrete(2) throws and names the env and the step") {
  CartPole env;
  env.reset(5);
  for (int i = 0; i < 3; ++i) env.step(i % 2);
  CHECK_THROWS_WITH_AS(env.step(5), "CartPole-v1: step 3: action 5 is not in Discrete(2)",
                       EnvError);
  CHECK_THROWS_WITH_AS(env.step(-1), "CartPole-v1: step 3: action -1 is not in Discrete(2)",
                       EnvError);
  CHECK(env.elapsed_steps() == 3);
}

TEST_CASE("CartPole: stepping before reset throws") {
  CartPole env;
  CHECK_THROWS_WITH_AS(env.step(0), "CartPole-v1: step() called before reset()", EnvError);
}

// ---------------------------------------------------------------------------------------
// MountainCarContinuous-v0
// ---------------------------------------------------------------------------------------

TEST_CASE("MountainCarContinuous: one step matches the published dynamics computed by hand") {
  MountainCarContinuous env;
  env.set_state({.position = -0.5, .velocity = 0.01});
  const StepResult r = step_with(env, 0.5f);

  // velocity' = velocity + force * power - 0.0025 cos(3 position)
  //           = 0.01 + 0.5 * 0.0015 - 0.0025 * cos(-1.5)
  //           = 0.01 + 0.00075 - 0.0025 * 0.0707372017 = 0.0105731570
  const double velocity = 0.01 + 0.5 * 0.0015 - 0.0025 * std::cos(-1.5);
  CHECK(velocity == near(0.0105731570));
  // position' = position + velocity' = -0.4894268430
  const double position = -0.5 + velocity;
  REQUIRE(r.observation.size() == 2);
  CHECK(r.observation[0] == near(position));
  CHECK(r.observation[1] == near(velocity));
  // reward = -0.1 action^2 = -0.1 * 0.25
  CHECK(r.reward == near(-0.025));
  CHECK_FALSE(r.terminated);
  CHECK_FALSE(r.truncated);
  // The published env stores its state as float32 after each step.
  CHECK(env.state().position == static_cast<double>(static_cast<float>(position)));
  CHECK(env.state().velocity == static_cast<double>(static_cast<float>(velocity)));
}

TEST_CASE("MountainCarContinuous: the left wall stops the car and the speed is clipped") {
  MountainCarContinuous env;
  env.set_state({.position = -1.19, .velocity = -0.07});
  // velocity' = -0.07 - 0.0015 - 0.0025 cos(-3.57) < -0.07 -> clipped to -0.07;
  // position' = -1.19 - 0.07 = -1.26 -> clipped to -1.2, and the wall zeroes the velocity.
  const StepResult r = step_with(env, -1.0f);
  CHECK(r.observation[0] == -1.2f);
  CHECK(r.observation[1] == 0.0f);

  MountainCarContinuous fast;
  fast.set_state({.position = -0.5, .velocity = 0.0695});
  // velocity' = 0.0695 + 0.0015 - 0.0025 * cos(-1.5) = 0.07082 -> clipped to 0.07
  CHECK(step_with(fast, 1.0f).observation[1] == 0.07f);
}

TEST_CASE("MountainCarContinuous: reaching the goal moving right terminates with +100") {
  SUBCASE("at the goal with velocity >= 0") {
    MountainCarContinuous env;
    env.set_state({.position = 0.44, .velocity = 0.02});
    const StepResult r = step_with(env, 1.0f);
    // velocity' = 0.02 + 0.0015 - 0.0025 cos(1.32) = 0.0208795614
    // position' = 0.44 + 0.0208795614 = 0.4608795614 >= 0.45
    CHECK(r.observation[0] == near(0.44 + 0.02 + 0.0015 - 0.0025 * std::cos(1.32)));
    CHECK(r.terminated);
    CHECK_FALSE(r.truncated);
    CHECK(r.reward == near(100.0 - 0.1 * 1.0 * 1.0));  // 99.9
    CHECK_THROWS_WITH_AS(step_with(env, 0.0f),
                         "MountainCarContinuous-v0: step 1: the episode has ended "
                         "(terminated); call reset() first",
                         EnvError);
  }
  SUBCASE("past the goal but rolling back does not count (goal_velocity 0)") {
    MountainCarContinuous env;
    env.set_state({.position = 0.5, .velocity = -0.01});
    // velocity' = -0.01 - 0.0015 - 0.0025 cos(1.5) = -0.0116768430 < 0
    // position' = 0.5 - 0.0116768430 = 0.4883231570 >= 0.45, but moving left
    const StepResult r = step_with(env, -1.0f);
    CHECK(r.observation[0] == near(0.4883231570));
    CHECK_FALSE(r.terminated);
    CHECK(r.reward == near(-0.1));
  }
}

TEST_CASE("MountainCarContinuous: the force is clipped to [-1, 1] but the cost is not") {
  // As published: force = clip(action, -1, 1), reward -= 0.1 * action^2 (unclipped).
  const MountainCarContinuous::State start{.position = -0.5, .velocity = 0.0};
  const Outcome clipped = step_from<MountainCarContinuous>(start, 3.0f);
  const Outcome at_bound = step_from<MountainCarContinuous>(start, 1.0f);
  CHECK(clipped.observation == at_bound.observation);
  CHECK(clipped.reward == near(-0.1 * 3.0 * 3.0));  // -0.9
  CHECK(at_bound.reward == near(-0.1 * 1.0 * 1.0));  // -0.1
}

TEST_CASE("MountainCarContinuous: spaces have the published bounds") {
  const MountainCarContinuous env;
  check_bounds(env.observation_space(), {-1.2f, -0.07f}, {0.6f, 0.07f});
  check_bounds(env.action_space(), {-1.0f}, {1.0f});
}

TEST_CASE("MountainCarContinuous: the time limit truncates at step 999 and not before") {
  MountainCarContinuous env;
  env.reset(3);
  // With no throttle the car only rocks in the valley; it cannot reach the goal.
  check_truncates_at(env, 999, [&] { return step_with(env, 0.0f); });
}

TEST_CASE("MountainCarContinuous: reset draws the published start state, reproducibly") {
  MountainCarContinuous env;
  check_seeded_resets(env, [&] { step_with(env, 1.0f); }, [&](std::span<const float>) {
    CHECK(env.state().position >= -0.6);
    CHECK(env.state().position < -0.4);
    CHECK(env.state().velocity == 0.0);
  });
}

TEST_CASE("MountainCarContinuous: bad actions and stepping before reset throw") {
  MountainCarContinuous env;
  CHECK_THROWS_WITH_AS(step_with(env, 0.0f),
                       "MountainCarContinuous-v0: step() called before reset()", EnvError);
  env.reset(2);
  step_with(env, 0.0f);
  step_with(env, 0.0f);
  CHECK_THROWS_WITH_AS(step_with(env, kNan),
                       "MountainCarContinuous-v0: step 2: action[0] is nan", EnvError);
  const std::array<float, 3> three{0.0f, 0.0f, 0.0f};
  CHECK_THROWS_WITH_AS(env.step(three),
                       "MountainCarContinuous-v0: step 2: action has 3 elements, expected 1",
                       EnvError);
}

// ---------------------------------------------------------------------------------------
// Acrobot-v1
// ---------------------------------------------------------------------------------------

namespace {

/// The book equations of motion (Sutton & Barto; Gymnasium's default), written out again
/// here from the published formulas so the env is checked against an independent copy.
/// s = (theta1, theta2, theta1_dot, theta2_dot); m = 1, l1 = 1, lc = 0.5, I = 1, g = 9.8.
std::array<double, 4> acrobot_derivatives(const std::array<double, 4>& s, double torque) {
  const double t1 = s[0], t2 = s[1], w1 = s[2], w2 = s[3];
  const double d1 = 1 * 0.25 + 1 * (1 + 0.25 + 2 * 1 * 0.5 * std::cos(t2)) + 1 + 1;
  const double d2 = 1 * (0.25 + 1 * 0.5 * std::cos(t2)) + 1;
  const double phi2 = 1 * 0.5 * 9.8 * std::cos(t1 + t2 - kPi / 2);
  const double phi1 = -1 * 1 * 0.5 * w2 * w2 * std::sin(t2) -
                      2 * 1 * 1 * 0.5 * w2 * w1 * std::sin(t2) +
                      (1 * 0.5 + 1 * 1) * 9.8 * std::cos(t1 - kPi / 2) + phi2;
  const double a2 = (torque + d2 / d1 * phi1 - 1 * 1 * 0.5 * w1 * w1 * std::sin(t2) - phi2) /
                    (1 * 0.25 + 1 - d2 * d2 / d1);
  const double a1 = -(d2 * a2 + phi1) / d1;
  return {w1, w2, a1, a2};
}

/// One classical RK4 step of 0.2 s, before wrapping and clipping.
std::array<double, 4> acrobot_rk4(const std::array<double, 4>& y, double torque) {
  const double h = 0.2;
  const auto add = [](const std::array<double, 4>& a, double c, const std::array<double, 4>& b) {
    return std::array<double, 4>{a[0] + c * b[0], a[1] + c * b[1], a[2] + c * b[2],
                                 a[3] + c * b[3]};
  };
  const auto k1 = acrobot_derivatives(y, torque);
  const auto k2 = acrobot_derivatives(add(y, h / 2, k1), torque);
  const auto k3 = acrobot_derivatives(add(y, h / 2, k2), torque);
  const auto k4 = acrobot_derivatives(add(y, h, k3), torque);
  std::array<double, 4> out{};
  for (std::size_t i = 0; i < 4; ++i)
    out[i] = y[i] + h / 6 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
  return out;
}

}  // namespace

TEST_CASE("Acrobot: the book equations give the hand-computed accelerations at rest") {
  // At rest hanging down (all zero) with torque +1 every phi term is m g cos(-pi/2) = 0:
  //   d1 = 0.25 + (1 + 0.25 + 1) + 1 + 1 = 4.5,  d2 = (0.25 + 0.5) + 1 = 1.75
  //   theta2_acc = 1 / (0.25 + 1 - 1.75^2 / 4.5) = 1 / 0.5694444 = 1.7560976
  //   theta1_acc = -(1.75 * 1.7560976) / 4.5 = -0.6829268
  const auto d = acrobot_derivatives({0, 0, 0, 0}, 1.0);
  CHECK(d[2] == near(-0.6829268293));
  CHECK(d[3] == near(1.7560975610));
}

TEST_CASE("Acrobot: one RK4 step matches the published dynamics") {
  Acrobot env;
  env.set_state({.theta1 = 0.3, .theta2 = -0.2, .theta1_dot = 0.5, .theta2_dot = -1.0});
  const StepResult r = env.step(2);  // torque +1
  const auto y = acrobot_rk4({0.3, -0.2, 0.5, -1.0}, 1.0);
  // The same step worked through in float64 from Gymnasium's acrobot.py formulas.
  CHECK(y[0] == near(0.3422438767));
  CHECK(y[1] == near(-0.3093168528));
  CHECK(y[2] == near(-0.0871717422));
  CHECK(y[3] == near(-0.0730692181));

  REQUIRE(r.observation.size() == 6);
  CHECK(r.observation[0] == near(std::cos(y[0])));
  CHECK(r.observation[1] == near(std::sin(y[0])));
  CHECK(r.observation[2] == near(std::cos(y[1])));
  CHECK(r.observation[3] == near(std::sin(y[1])));
  CHECK(r.observation[4] == near(y[2]));
  CHECK(r.observation[5] == near(y[3]));
  CHECK(r.reward == -1.0);
  CHECK_FALSE(r.terminated);
  CHECK_FALSE(r.truncated);

  // At rest with no torque the acrobot hangs still.
  Acrobot still;
  still.set_state({});
  const StepResult s = still.step(1);
  CHECK(s.observation[0] == near(1.0));
  CHECK(s.observation[1] == near(0.0));
  CHECK(s.observation[2] == near(1.0));
  CHECK(s.observation[3] == near(0.0));
  CHECK(s.observation[4] == near(0.0));
  CHECK(s.observation[5] == near(0.0));
  CHECK(s.reward == -1.0);
}

TEST_CASE("Acrobot: angles are wrapped into [-pi, pi] and speeds clipped to 4 pi and 9 pi") {
  Acrobot env;
  env.set_state({.theta1 = 0.0, .theta2 = 0.0, .theta1_dot = 20.0, .theta2_dot = -40.0});
  env.step(1);
  const auto y = acrobot_rk4({0.0, 0.0, 20.0, -40.0}, 0.0);
  // Unwrapped theta1 = 5.1724031, theta2 = -10.8469666; theta1_dot = 50.03, theta2_dot =
  // -115.2, both beyond their limits.
  CHECK(y[0] > kPi);
  CHECK(y[1] < -3 * kPi);
  CHECK(env.state().theta1 == near(y[0] - 2 * kPi));  // -1.1107823
  CHECK(env.state().theta2 == near(y[1] + 4 * kPi));  // 1.7194040
  CHECK(env.state().theta1_dot == 4 * kPi);
  CHECK(env.state().theta2_dot == -9 * kPi);
}

TEST_CASE("Acrobot: swinging the tip above the line terminates with reward 0") {
  Acrobot env;
  // Tip height -cos(2) - cos(2 + 0) = 0.8322937, just below the line at 1.0.
  env.set_state({.theta1 = 2.0, .theta2 = 0.0, .theta1_dot = 2.0, .theta2_dot = 0.0});
  const StepResult r = env.step(1);
  const auto y = acrobot_rk4({2.0, 0.0, 2.0, 0.0}, 0.0);
  // theta1' = 2.2941704, theta2' = 0.0816694: height -cos(2.294) - cos(2.376) = 1.39 > 1
  CHECK(-std::cos(y[0]) - std::cos(y[0] + y[1]) > 1.0);
  CHECK(r.terminated);
  CHECK_FALSE(r.truncated);
  CHECK(r.reward == 0.0);
  CHECK_THROWS_WITH_AS(env.step(1),
                       "Acrobot-v1: step 1: the episode has ended (terminated); "
                       "call reset() first",
                       EnvError);
}

TEST_CASE("Acrobot: spaces have the published bounds") {
  const Acrobot env;
  const auto v1 = static_cast<float>(4 * kPi);
  const auto v2 = static_cast<float>(9 * kPi);
  check_bounds(env.observation_space(), {-1.0f, -1.0f, -1.0f, -1.0f, -v1, -v2},
               {1.0f, 1.0f, 1.0f, 1.0f, v1, v2});
  CHECK(env.action_space().n == 3);
}

TEST_CASE("Acrobot: the time limit truncates at step 500 and not before") {
  Acrobot env;
  env.reset(9);
  // Without torque the acrobot only sways near the bottom; it cannot swing up.
  const StepResult last = check_truncates_at(env, 500, [&] { return env.step(1); });
  CHECK(last.reward == -1.0);
}

TEST_CASE("Acrobot: reset draws the published start state, reproducibly from the seed") {
  Acrobot env;
  check_seeded_resets(env, [&] { env.step(0); }, [&](std::span<const float>) {
    const Acrobot::State s = env.state();
    for (const double v : {s.theta1, s.theta2, s.theta1_dot, s.theta2_dot}) {
      CHECK(std::abs(v) <= 0.1f);
      CHECK(v == static_cast<double>(static_cast<float>(v)));  // rounded to float32
    }
  });
}

TEST_CASE("Acrobot: an action outside Discrete(3) and stepping before reset throw") {
  Acrobot env;
  CHECK_THROWS_WITH_AS(env.step(1), "Acrobot-v1: step() called before reset()", EnvError);
  env.reset(4);
  CHECK_THROWS_WITH_AS(env.step(3), "Acrobot-v1: step 0: action 3 is not in Discrete(3)",
                       EnvError);
  CHECK_THROWS_AS(env.step(-1), EnvError);
  CHECK(env.elapsed_steps() == 0);
}
