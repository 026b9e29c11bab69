#pragma once
/// @file
/// One-step cooperative matrix games: k agents each choose one of n actions once, and the
/// team gets the payoff of the joint action. The classic tests of coordination and credit
/// assignment. Light header: no torch.

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include <anvil/envs/multi_agent/multi_agent_env.hpp>

namespace anvil::envs {

/// A one-step cooperative game given by its payoff tensor (agent 0's action the fastest
/// index, as in a joint action). Every agent observes the constant 1 (there is one state),
/// every action is always available, and each episode is one step that terminates.
/// Trivially copyable (checkpoints save it as bytes).
class MatrixGame {
 public:
  static constexpr std::string_view name = "MatrixGame";
  static constexpr std::int64_t kMaxEntries = 1024;

  MatrixGame() : MatrixGame(climbing()) {}
  /// `payoff` holds n^k entries, indexed by the joint action; `id` names the game in logs
  /// and for `env.id` (at most 23 characters).
  MatrixGame(std::int64_t agents, std::int64_t actions, std::span<const double> payoff,
             std::string_view id = "MatrixGame")
      : k_(agents), n_(actions) {
    if (id.empty() || id.size() >= id_.size())
      throw Error("MatrixGame: a game's id has 1 to " + std::to_string(id_.size() - 1) + " characters, got '" +
                  std::string(id) + "'");
    std::copy(id.begin(), id.end(), id_.begin());
    std::int64_t entries = 1;
    for (std::int64_t i = 0; i < agents; ++i) entries *= actions;
    if (agents < 1 || actions < 1 || entries > kMaxEntries || static_cast<std::int64_t>(payoff.size()) != entries)
      throw Error("MatrixGame: " + std::to_string(agents) + " agents with " + std::to_string(actions) +
                  " actions need " + std::to_string(entries) + " payoffs (at most " + std::to_string(kMaxEntries) +
                  "), got " + std::to_string(payoff.size()));
    for (std::int64_t i = 0; i < entries; ++i) payoff_[static_cast<std::size_t>(i)] = payoff[static_cast<std::size_t>(i)];
  }

  /// The climbing game (Claus and Boutilier 1998, "The dynamics of reinforcement learning in
  /// cooperative multiagent systems", AAAI): optimum 11 at (0, 0), guarded by -30 penalties;
  /// independent learners settle on (2, 2) or (1, 1).
  static MatrixGame climbing() {
    // The published table has agent 0's action as its row and agent 1's as its column:
    //   {11, -30, 0}, {-30, 7, 6}, {0, 0, 5}; stored by joint action (payoff[a0 + 3 a1]).
    const std::array<double, 9> p{11, -30, 0, -30, 7, 0, 0, 6, 5};
    return MatrixGame(2, 3, p, "Climbing");
  }
  /// The penalty game (Claus and Boutilier 1998) with miscoordination penalty `k` <= 0:
  /// optima 10 at (0, 0) and (2, 2), a safe 2 at (1, 1), and k where the agents disagree
  /// between the optima.
  static MatrixGame penalty(double k) {
    const std::array<double, 9> p{10, 0, k, 0, 2, 0, k, 0, 10};
    return MatrixGame(2, 3, p, "Penalty");
  }
  /// A credit-assignment game: k agents with two actions. Agent 0's good action is 0,
  /// worth `small` to the team; agent i >= 1's good action is i mod 2, worth `large`. The
  /// optimum is every agent on its good action. While the others explore, their choices
  /// put noise of variance about (k - 1) large^2 / 4 into the team's reward, next to which
  /// agent 0's share is small: an advantage that does not condition on the others' actions
  /// (an independent critic's, a central V's) carries that noise, and agent 0 learns
  /// slowly; COMA's counterfactual advantage removes the others' share. The good actions
  /// alternate so that an actor shared by the agents gains nothing from learning one
  /// action for all of them: each agent's choice must come from its own credit.
  static MatrixGame credit(std::int64_t agents, double small, double large) {
    std::array<double, kMaxEntries> p{};
    const std::int64_t n = std::int64_t{1} << agents;
    if (agents < 2 || n > kMaxEntries) throw Error("MatrixGame::credit: 2 to 10 agents, got " + std::to_string(agents));
    for (std::int64_t j = 0; j < n; ++j) {
      double r = (j & 1) ? 0.0 : small;
      for (std::int64_t a = 1; a < agents; ++a)
        if (((j >> a) & 1) == (a & 1)) r += large;
      p[static_cast<std::size_t>(j)] = r;
    }
    return MatrixGame(agents, 2, std::span<const double>(p.data(), static_cast<std::size_t>(n)), "Credit");
  }
  /// The joint action of the credit game's optimum (agent 0 on 0, agent i on i mod 2).
  static std::int64_t credit_optimum(std::int64_t agents) noexcept {
    std::int64_t j = 0;
    for (std::int64_t a = 1; a < agents; ++a) j |= (a & 1) << a;
    return j;
  }

  /// The game's name ("Climbing", "Penalty", "Credit", or the one it was given).
  [[nodiscard]] std::string_view id() const noexcept { return std::string_view(id_.data()); }
  [[nodiscard]] std::int64_t num_agents() const noexcept { return k_; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept { return 1; }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return n_; }
  [[nodiscard]] std::int64_t state_size() const noexcept { return 1; }

  void reset(std::uint64_t /*seed*/) noexcept { done_ = false; }
  TeamStep step(std::span<const std::int64_t> actions) {
    if (done_) throw EnvError("MatrixGame: step after the one step of its episode");
    done_ = true;
    return TeamStep{payoff(actions), true, false};
  }
  void observe(std::int64_t /*agent*/, std::span<float> out) const noexcept { out[0] = 1.0f; }
  void available_actions(std::int64_t /*agent*/, std::span<float> out) const noexcept {
    for (auto& x : out) x = 1.0f;
  }
  void write_state(std::span<float> out) const noexcept { out[0] = 1.0f; }

  /// The payoff of a joint action (one action per agent).
  [[nodiscard]] double payoff(std::span<const std::int64_t> actions) const {
    return payoff_[static_cast<std::size_t>(encode_joint_action(actions, n_))];
  }
  /// The payoff of a joint action index.
  [[nodiscard]] double payoff(std::int64_t joint) const { return payoff_.at(static_cast<std::size_t>(joint)); }
  /// The best payoff.
  [[nodiscard]] double optimum() const noexcept {
    std::int64_t entries = 1;
    for (std::int64_t i = 0; i < k_; ++i) entries *= n_;
    double best = payoff_[0];
    for (std::int64_t i = 1; i < entries; ++i) best = std::max(best, payoff_[static_cast<std::size_t>(i)]);
    return best;
  }

 private:
  std::int64_t k_ = 2, n_ = 3;
  std::array<double, kMaxEntries> payoff_{};
  std::array<char, 24> id_{};
  bool done_ = false;
};

static_assert(MultiAgentEnv<MatrixGame>);

}  // namespace anvil::envs
