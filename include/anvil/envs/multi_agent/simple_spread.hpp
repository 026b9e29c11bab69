#pragma once
/// @file
/// "Simple spread" of the multi-agent particle environments (Lowe et al. 2017, "Multi-Agent
/// Actor-Critic for Mixed Cooperative-Competitive Environments"; Mordatch and Abbeel 2018):
/// three agents must cover three landmarks without colliding, in episodes of 25 steps.
/// Written here from the published description and constants. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>

namespace anvil::envs {

/// Simple spread with the particle world's published physics:
///
/// - a 2-D world stepped with dt = 0.1; each step a movable entity's velocity is damped
///   by 0.25, then gains force/mass * dt (mass 1), and its position moves by velocity * dt;
/// - agents are discs of radius 0.15; landmarks (radius 0.05) do not collide or move;
/// - an agent's action: 0 no force, 1 +x, 2 -x, 3 +y, 4 -y (the particle envs' one-hot
///   action order, which EPyMARL's integer actions go through); the force is the unit
///   direction times the sensitivity 5;
/// - overlapping agents push each other apart with the soft contact force
///   100 * softplus(-(d - d_min) / 0.001) * 0.001 along the line between them;
/// - start: agents and landmarks uniform in [-1, 1]^2, velocities 0;
/// - an agent observes [its velocity, its position, each landmark relative to it, each
///   other agent relative to it, the others' communication (always 0 here)]: 18 numbers;
///   the state is the agents' observations concatenated (54), as EPyMARL gives its critics;
/// - reward, shared by the team: the particle envs' per-agent rewards summed over the
///   agents, as EPyMARL's published MPE returns are (its logged returns divided by the
///   number of agents): each agent gets minus the sum over landmarks of the distance to
///   the nearest agent, minus 1 for each agent within 0.3 of it, itself included (the
///   published scenario counts an agent's distance 0 to itself as a collision, so every
///   step costs the team 3 however it moves). A team reward is therefore
///   -3 * coverage - 3 - 2 * (colliding pairs);
/// - episodes end (truncated) after 25 steps.
///
/// Trivially copyable (checkpoints save it as bytes).
class SimpleSpread {
 public:
  static constexpr std::string_view name = "SimpleSpread";
  static constexpr int kAgents = 3, kLandmarks = 3;
  static constexpr std::int64_t kEpisodeSteps = 25;
  static constexpr double kDt = 0.1, kDamping = 0.25, kSensitivity = 5.0, kAgentSize = 0.15;
  static constexpr double kContactForce = 100.0, kContactMargin = 1e-3;

  [[nodiscard]] std::int64_t num_agents() const noexcept { return kAgents; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept { return 4 + 2 * kLandmarks + 4 * (kAgents - 1); }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return 5; }
  [[nodiscard]] std::int64_t state_size() const noexcept { return kAgents * agent_observation_size(); }

  void reset(std::uint64_t seed) {
    Rng rng(seed);
    for (auto& a : agents_) a = Body{{rng.uniform(-1, 1), rng.uniform(-1, 1)}, {0, 0}};
    for (auto& l : landmarks_) l = {rng.uniform(-1, 1), rng.uniform(-1, 1)};
    steps_ = 0;
    started_ = true;
  }

  TeamStep step(std::span<const std::int64_t> actions) {
    if (!started_) throw EnvError("SimpleSpread: step before reset");
    if (steps_ >= kEpisodeSteps) throw EnvError("SimpleSpread: step after the episode's 25 steps");
    std::array<std::array<double, 2>, kAgents> force{};
    for (int i = 0; i < kAgents; ++i) {
      const auto a = actions[static_cast<std::size_t>(i)];
      if (a < 0 || a > 4) throw EnvError("SimpleSpread: agent " + std::to_string(i) + " action " + std::to_string(a) + " is outside [0, 5)");
      if (a == 1) force[i][0] = kSensitivity;
      if (a == 2) force[i][0] = -kSensitivity;
      if (a == 3) force[i][1] = kSensitivity;
      if (a == 4) force[i][1] = -kSensitivity;
    }
    for (int i = 0; i < kAgents; ++i)
      for (int j = i + 1; j < kAgents; ++j) {
        const double dx = agents_[i].pos[0] - agents_[j].pos[0], dy = agents_[i].pos[1] - agents_[j].pos[1];
        const double d = std::sqrt(dx * dx + dy * dy);
        if (d == 0.0) continue;  // coincident centres push along no direction
        const double x = -(d - 2 * kAgentSize) / kContactMargin;
        const double pen = (x > 30 ? x : std::log1p(std::exp(x))) * kContactMargin;  // softplus
        const double f = kContactForce * pen / d;
        force[i][0] += f * dx;
        force[i][1] += f * dy;
        force[j][0] -= f * dx;
        force[j][1] -= f * dy;
      }
    for (int i = 0; i < kAgents; ++i)
      for (int c = 0; c < 2; ++c) {
        auto& v = agents_[i].vel[c];
        v = v * (1 - kDamping) + force[i][c] * kDt;
        agents_[i].pos[c] += v * kDt;
      }
    ++steps_;
    return TeamStep{reward(), false, steps_ >= kEpisodeSteps};
  }

  /// The team's reward in the current positions (see class comment).
  [[nodiscard]] double reward() const noexcept {
    double r = -kAgents * coverage_distance();
    for (int i = 0; i < kAgents; ++i)
      for (int j = 0; j < kAgents; ++j)
        if (distance(agents_[i].pos, agents_[j].pos) < 2 * kAgentSize) r -= 1.0;  // i == j included, as published
    return r;
  }
  /// Sum over landmarks of the distance to the nearest agent.
  [[nodiscard]] double coverage_distance() const noexcept {
    double s = 0;
    for (const auto& l : landmarks_) {
      double best = 1e300;
      for (const auto& a : agents_) best = std::min(best, distance(a.pos, l));
      s += best;
    }
    return s;
  }

  void observe(std::int64_t agent, std::span<float> out) const noexcept {
    const auto& me = agents_[static_cast<std::size_t>(agent)];
    std::size_t k = 0;
    out[k++] = static_cast<float>(me.vel[0]);
    out[k++] = static_cast<float>(me.vel[1]);
    out[k++] = static_cast<float>(me.pos[0]);
    out[k++] = static_cast<float>(me.pos[1]);
    for (const auto& l : landmarks_) {
      out[k++] = static_cast<float>(l[0] - me.pos[0]);
      out[k++] = static_cast<float>(l[1] - me.pos[1]);
    }
    for (int j = 0; j < kAgents; ++j) {
      if (j == agent) continue;
      out[k++] = static_cast<float>(agents_[j].pos[0] - me.pos[0]);
      out[k++] = static_cast<float>(agents_[j].pos[1] - me.pos[1]);
    }
    while (k < out.size()) out[k++] = 0.0f;  // the others' communication: silent agents
  }
  void available_actions(std::int64_t /*agent*/, std::span<float> out) const noexcept {
    for (auto& x : out) x = 1.0f;
  }
  void write_state(std::span<float> out) const noexcept {
    const auto d = static_cast<std::size_t>(agent_observation_size());
    for (int i = 0; i < kAgents; ++i) observe(i, out.subspan(i * d, d));
  }

  /// Places the agents and landmarks (tests; velocities become 0, the step count 0).
  void place(const std::array<std::array<double, 2>, kAgents>& agents,
             const std::array<std::array<double, 2>, kLandmarks>& landmarks) noexcept {
    for (int i = 0; i < kAgents; ++i) agents_[i] = Body{agents[i], {0, 0}};
    landmarks_ = landmarks;
    steps_ = 0;
    started_ = true;
  }
  [[nodiscard]] std::array<double, 2> agent_position(int i) const noexcept { return agents_[i].pos; }
  [[nodiscard]] std::array<double, 2> agent_velocity(int i) const noexcept { return agents_[i].vel; }

 private:
  struct Body {
    std::array<double, 2> pos{}, vel{};
  };
  static double distance(const std::array<double, 2>& a, const std::array<double, 2>& b) noexcept {
    return std::hypot(a[0] - b[0], a[1] - b[1]);
  }

  std::array<Body, kAgents> agents_{};
  std::array<std::array<double, 2>, kLandmarks> landmarks_{};
  std::int64_t steps_ = 0;
  bool started_ = false;
};

static_assert(MultiAgentEnv<SimpleSpread>);

}  // namespace anvil::envs
