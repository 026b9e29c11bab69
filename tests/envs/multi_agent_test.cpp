// Tests for the multi-agent envs (envs/multi_agent/): the particle physics of simple spread
// worked by hand, the mapping mission's sensor, belief and budget, the matrix games'
// payoffs, and Joint's layout of a team step as one observation row and one joint action.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <anvil/envs/multi_agent/mapping.hpp>
#include <anvil/envs/multi_agent/matrix_game.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>
#include <anvil/envs/multi_agent/simple_spread.hpp>

namespace {

using namespace anvil::envs;

TEST_CASE("SimpleSpread: a push and a contact move the agents as the particle world's equations say") {
  SimpleSpread e;
  // Agents far apart; landmarks on two agents and one at (3, 0).
  e.place({{{0, 0}, {1, 0}, {0, 1}}}, {{{0, 0}, {1, 0}, {3, 0}}});
  const std::array<std::int64_t, 3> push{1, 0, 4};  // agent 0: +x, agent 2: -y
  const auto r = e.step(push);
  // v = 0 * 0.75 + 5 * 0.1 = 0.5, x = 0.5 * 0.1 = 0.05
  CHECK(e.agent_velocity(0)[0] == doctest::Approx(0.5));
  CHECK(e.agent_position(0)[0] == doctest::Approx(0.05));
  CHECK(e.agent_position(2)[1] == doctest::Approx(1 - 0.05));
  CHECK(e.agent_position(1)[0] == doctest::Approx(1.0));
  // Coverage after the step: landmark (0,0) nearest is agent 0 at 0.05; (1,0) agent 1 at 0;
  // (3,0) agent 1 at 2. Team reward = -3 * 2.05 - 3 (each agent "collides" with itself).
  CHECK(r.reward == doctest::Approx(-3 * 2.05 - 3));
  CHECK_FALSE(r.terminated);
  CHECK_FALSE(r.truncated);

  // Two agents 0.2 apart overlap by 0.1: penetration softplus(100) * 0.001 = 0.1, force
  // 100 * 0.1 = 10 pushing them apart, so each moves 10 * 0.1 * 0.1 = 0.1 away.
  e.place({{{0, 0}, {0.2, 0}, {5, 5}}}, {{{0, 0}, {0.2, 0}, {5, 5}}});
  const std::array<std::int64_t, 3> none{0, 0, 0};
  const auto c = e.step(none);
  CHECK(e.agent_position(0)[0] == doctest::Approx(-0.1).epsilon(1e-6));
  CHECK(e.agent_position(1)[0] == doctest::Approx(0.3).epsilon(1e-6));
  // 0.4 apart after the step: no collision between them; coverage 0.1 + 0.1 + 0.
  CHECK(c.reward == doctest::Approx(-3 * 0.2 - 3));
}

TEST_CASE("SimpleSpread: 18 numbers per agent, the state is their concatenation, 25 steps end an episode") {
  Joint<SimpleSpread> j;
  const auto l = j.agent_layout();
  CHECK(l.agents == 3);
  CHECK(l.obs_dim == 18);
  CHECK(l.num_actions == 5);
  CHECK(l.state_dim == 54);
  CHECK(j.action_space().n == 125);
  auto row = j.reset(3);
  std::vector<float> own(18);
  for (int i = 0; i < 3; ++i) {
    j.env().observe(i, own);
    for (int k = 0; k < 18; ++k) {
      CHECK(row[static_cast<std::size_t>(i * 18 + k)] == own[static_cast<std::size_t>(k)]);
      CHECK(row[static_cast<std::size_t>(l.state_offset() + i * 18 + k)] == own[static_cast<std::size_t>(k)]);
    }
  }
  StepResult r;
  for (int t = 0; t < 25; ++t) r = j.step(0);
  CHECK(r.truncated);
  CHECK_THROWS_AS(j.step(0), EnvError);
  // An episode depends on its seed alone.
  Joint<SimpleSpread> a, b;
  const auto ra = a.reset(9);
  const auto rb = b.reset(9);
  CHECK(std::vector<float>(ra.begin(), ra.end()) == std::vector<float>(rb.begin(), rb.end()));
}

TEST_CASE("Joint: joint actions encode each agent's action in base num_actions, agent 0 first") {
  const std::array<std::int64_t, 3> u{4, 0, 2};
  CHECK(encode_joint_action(u, 5) == 4 + 0 * 5 + 2 * 25);
  std::array<std::int64_t, 3> back{};
  decode_joint_action(54, 5, back);
  CHECK(back == u);
  Joint<MatrixGame> g(MatrixGame::climbing());
  g.reset(0);
  const auto r = g.step(encode_joint_action(std::array<std::int64_t, 2>{1, 2}, 3));  // agent 0 b, agent 1 c
  CHECK(r.reward == 6.0);  // climbing[a1 = c][a0 = b]
  CHECK(r.terminated);
  g.reset(0);
  CHECK_THROWS_WITH_AS(g.step(9), doctest::Contains("joint action 9 is outside [0, 9)"), EnvError);
}

TEST_CASE("MatrixGame: the climbing, penalty and credit games' payoffs and optima") {
  const auto c = MatrixGame::climbing();
  CHECK(c.optimum() == 11);
  CHECK(c.payoff(std::array<std::int64_t, 2>{0, 1}) == -30);
  CHECK(c.payoff(std::array<std::int64_t, 2>{2, 2}) == 5);
  const auto p = MatrixGame::penalty(-100);
  CHECK(p.payoff(std::array<std::int64_t, 2>{0, 2}) == -100);
  CHECK(p.payoff(std::array<std::int64_t, 2>{1, 1}) == 2);
  const auto k = MatrixGame::credit(4, 1.0, 10.0);  // good actions: 0, 1, 0, 1
  CHECK(k.num_agents() == 4);
  CHECK(k.optimum() == 31);
  CHECK(k.payoff(std::array<std::int64_t, 4>{0, 0, 0, 0}) == 1 + 10);
  CHECK(k.payoff(std::array<std::int64_t, 4>{1, 1, 1, 0}) == 10);
  CHECK(k.payoff(std::array<std::int64_t, 4>{0, 1, 0, 1}) == 31);
  CHECK(k.payoff(MatrixGame::credit_optimum(4)) == 31);
  CHECK_THROWS_WITH_AS(MatrixGame(2, 3, std::vector<double>(8, 0.0)), doctest::Contains("need 9 payoffs"), anvil::Error);
  // Each game goes by its own name (env.id, logs), though all are one type.
  CHECK(spec_of(Joint<MatrixGame>(c)).name == "Climbing");
  CHECK(Joint<MatrixGame>(p).id() == "Penalty");
  CHECK(env_name(Joint<MatrixGame>(k)) == "Credit");
  CHECK(env_name(Joint<SimpleSpread>{}) == "SimpleSpread");
  CHECK(MatrixGame(1, 2, std::vector<double>{0.0, 1.0}, "OneArm").id() == "OneArm");
  CHECK_THROWS_WITH_AS(MatrixGame(1, 2, std::vector<double>{0.0, 1.0}, ""), doctest::Contains("a game's id has 1 to 23"),
                       anvil::Error);
}

TEST_CASE("Mapping: moves off the grid or beyond the altitudes are unavailable, and Joint refuses them naming the agent") {
  Joint<MappingTask> j;
  const auto l = j.agent_layout();
  CHECK(l.agents == 4);
  CHECK(l.num_actions == 7);
  j.reset(5);
  // Walk agent 0 to the south-west corner; the others stay.
  auto& m = j.env();
  for (int t = 0; t < 8 && m.pose(0)[1] > 0; ++t) j.step(MappingTask::south);
  for (int t = 0; t < 4 && m.pose(0)[0] > 0; ++t) j.step(MappingTask::west);
  if (m.pose(0)[0] == 0 && m.pose(0)[1] == 0) {
    CHECK_FALSE(m.available(0, MappingTask::south));
    CHECK_FALSE(m.available(0, MappingTask::west));
    CHECK_FALSE(m.available(0, MappingTask::down));  // altitude 0
    CHECK(m.available(0, MappingTask::up));
    CHECK(m.available(0, MappingTask::stay));
    CHECK_THROWS_WITH_AS(j.step(MappingTask::south), doctest::Contains("agent 0 took action 2, which is not available"),
                         EnvError);
  }
  // The row's availability block says the same as the env.
  const auto row = j.reset(6);
  for (int i = 0; i < 4; ++i)
    for (int a = 0; a < 7; ++a)
      CHECK((row[static_cast<std::size_t>(l.avail_offset() + i * 7 + a)] > 0.5f) == m.available(i, a));
}

TEST_CASE("Mapping: the weighted reward counts the entropy removed where the updated map believes in targets") {
  MappingTask m;  // weighted entropy, the default
  CHECK(m.reward_kind() == MappingReward::weighted_entropy);
  m.reset(4);
  auto beliefs = [&] {
    std::vector<double> p;
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) p.push_back(m.belief(x, y));
    return p;
  };
  auto h = [](double p) { return p <= 0 || p >= 1 ? 0.0 : -(p * std::log2(p) + (1 - p) * std::log2(1 - p)); };
  double total = 0;
  bool some_target_cell = false, some_empty_cell = false;
  for (int t = 0; t < 6; ++t) {
    const auto before = beliefs();
    const std::array<std::int64_t, 4> a{MappingTask::up, MappingTask::stay, MappingTask::north, MappingTask::stay};
    const std::array<std::int64_t, 4> b{MappingTask::stay, MappingTask::up, MappingTask::stay, MappingTask::east};
    std::array<std::int64_t, 4> act = t % 2 ? b : a;
    for (int i = 0; i < 4; ++i)
      if (!m.available(i, act[static_cast<std::size_t>(i)])) act[static_cast<std::size_t>(i)] = MappingTask::stay;
    const double r = m.step(act).reward;
    const auto after = beliefs();
    // By hand: sum over cells of w(p_after) (H(p_before) - H(p_after)), w 1 above 1/2, 0
    // below, 1/2 at it; over the prior's weighted entropy, 1024 cells x 1/2.
    double expect = 0;
    for (std::size_t c = 0; c < after.size(); ++c) {
      const double w = after[c] > 0.501 ? 1.0 : after[c] < 0.499 ? 0.0 : 0.5;
      expect += w * (h(before[c]) - h(after[c]));
      if (after[c] > 0.9 && before[c] != after[c]) some_target_cell = true;
      if (after[c] < 0.1 && before[c] != after[c]) some_empty_cell = true;
    }
    CHECK(r == doctest::Approx(expect / 512.0).epsilon(1e-9));
    total += r;
  }
  CHECK(some_target_cell);  // the measurements changed both kinds of cell,
  CHECK(some_empty_cell);   // and only the first kind paid
  CHECK(total > 0.0);
  CHECK(m.weighted_entropy_fraction() < 1.0);
}

TEST_CASE("Mapping: rewards add up to the entropy removed, the budget ends the mission, a low sensor learns its cells") {
  Joint<MappingTask> j(MappingTask(MappingReward::entropy));
  j.reset(11);
  const double start = j.env().entropy_fraction();
  CHECK(start < 1.0);  // the first measurement at the start
  double sum = 0;
  StepResult r;
  for (int t = 0; t < 14; ++t) {
    r = j.step(MappingTask::stay);  // every agent hovers at altitude 0
    sum += r.reward;
    if (t < 13) CHECK_FALSE(r.terminated);
  }
  CHECK(r.terminated);
  CHECK(sum == doctest::Approx(start - j.env().entropy_fraction()).epsilon(1e-9));
  CHECK_THROWS_AS(j.step(MappingTask::stay), EnvError);
  // 15 readings at 5% error: every cell under agent 0 is believed as it is.
  const auto p = j.env().pose(0);
  const int cx = p[0] * 4 + 2, cy = p[1] * 4 + 2;
  for (int y = std::max(0, cy - 2); y < std::min(32, cy + 2); ++y)
    for (int x = std::max(0, cx - 2); x < std::min(32, cx + 2); ++x)
      CHECK(std::abs(j.env().belief(x, y) - (j.env().target(x, y) ? 1.0 : 0.0)) < 0.05);
  // A lawnmower sweep at altitude 1 maps more of the field than hovering.
  MappingTask lawn(MappingReward::entropy);
  lawn.reset(11);
  for (int t = 0; t < 14; ++t) {
    const auto a = lawn.lawnmower();
    lawn.step(a);
    lawn.lawnmower_turns();
  }
  CHECK(lawn.entropy_fraction() < j.env().entropy_fraction());
  CHECK(lawn.map_error() < j.env().map_error());
}

}  // namespace
