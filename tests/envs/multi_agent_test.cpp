// Tests for the multi-agent envs (envs/multi_agent/): the particle physics of simple spread
// worked by hand, the mapping mission's sensor, belief and budget, the matrix games'
// payoffs, and Joint's layout of a team step as one observation row and one joint action.

#include <anvil/envs/multi_agent/mapping.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <anvil/envs/multi_agent/mapping_published.hpp>
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

namespace {

using namespace anvil::envs;
using PM = PublishedMapping;

TEST_CASE("MappingWestheider: the published field, start, footprints, sensor, communication, reward and budget") {
  Joint<PM> j;
  const auto l = j.agent_layout();
  CHECK(l.agents == 4);
  CHECK(l.num_actions == 6);
  CHECK(l.obs_map.channels == 7);
  CHECK(l.obs_map.height == 11);
  CHECK(l.obs_dim == 7 * 11 * 11);
  CHECK(l.state_map.channels == 4);
  CHECK(l.state_dim == 4 * 121 + 1);
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    j.reset(seed);
    const auto& e = j.env();
    // The targets: one block against an edge, 30-60 % of the field.
    int targets = 0;
    for (int y = 0; y < 100; ++y)
      for (int x = 0; x < 100; ++x) targets += e.target(x, y);
    CHECK(targets >= 3000);
    CHECK(targets <= 6000);
    CHECK(targets % 100 == 0);  // whole rows or columns
    const bool edge = e.target(0, 0) || e.target(99, 99);
    CHECK(edge);
    for (int i = 0; i < 4; ++i) {
      CHECK(e.pose(i)[2] == 2);       // every agent starts at 15 m
      CHECK_FALSE(e.available(i, PM::up));
      const auto f = e.footprint(i);  // 2 x 15 m x tan 30 deg = 17.3 m: 35 cells of 0.5 m, clipped to the field
      CHECK(f[1] - f[0] <= 35);
      CHECK(f[1] - f[0] >= 17);
    }
  }
  // Down to 5 m: footprints 23 cells (11.5 m), then 12 (5.8 m), away from the field's edges.
  j.reset(3);
  std::array<std::int64_t, 4> a{};
  auto joint = [&](std::array<std::int64_t, 4> u) { return encode_joint_action(u, PM::kActions); };
  double sum = 0;
  StepResult r;
  for (int t = 0; t < 15; ++t) {
    for (int i = 0; i < 4; ++i) {
      const auto p = j.env().pose(i);
      a[static_cast<std::size_t>(i)] = p[2] > 0 ? PM::down : (j.env().available(i, PM::plus_x) ? PM::plus_x : PM::minus_x);
    }
    r = j.step(joint(a));
    sum += r.reward;
    if (t == 0)
      for (int i = 0; i < 4; ++i) {
        const auto p = j.env().pose(i);
        const auto f = j.env().footprint(i);
        if (p[0] >= 3 && p[0] <= 7 && p[1] >= 3 && p[1] <= 7) {
          CHECK(f[1] - f[0] == 23);
          CHECK(f[3] - f[2] == 23);
        }
      }
    if (t < 14) CHECK_FALSE(r.terminated);
    CHECK(r.reward <= 21.5);
  }
  CHECK(r.terminated);  // the budget of 14: steps 0 .. 14
  CHECK_THROWS_AS(j.step(joint(a)), EnvError);
  // At 5 m (1 % error) the cells under each agent are known after its readings there.
  for (int i = 0; i < 4; ++i) {
    const auto f = j.env().footprint(i);
    CHECK(f[1] - f[0] <= 12);
    int wrong = 0;
    for (int y = f[2]; y < f[3]; ++y)
      for (int x = f[0]; x < f[1]; ++x) wrong += std::abs(j.env().belief(x, y) - (j.env().target(x, y) ? 1.0 : 0.0)) > 0.05;
    CHECK(wrong <= 2);
  }
  CHECK(j.env().f1() > 0.0);
  CHECK(j.env().weighted_entropy_fraction() < 1.0);
  // A step that measures nothing new at 15 m gains little: 22 r - 0.5 is about -0.5 at worst.
  CHECK(sum > -0.5 * 15);
}

TEST_CASE("MappingWestheider: measurements reach the agents within 25 m, and the inputs are the published map channels") {
  Joint<PM> j;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    j.reset(seed);
    const auto& e = j.env();
    const auto row = j.observation();
    const auto l = j.agent_layout();
    for (int i = 0; i < 4; ++i) {
      const float* o = row.data() + i * l.obs_dim;
      CHECK(o[0] == doctest::Approx(1.0));                  // budget left, (14 - 0) / 14
      CHECK(o[121] == doctest::Approx((i + 1) / 4.0));      // the id
      CHECK(o[242 + 5 * 11 + 5] == doctest::Approx(0.75));  // itself at the centre, (2 + 1) / 4
      for (int k = 0; k < 121; ++k) {
        CHECK(o[5 * 121 + k] >= 0.0f);  // probabilities
        CHECK(o[5 * 121 + k] <= 1.0f);
      }
      for (int k = 0; k < 4; ++k) {
        if (k == i) continue;
        const auto p = e.pose(i), q = e.pose(k);
        const double d = std::hypot(5.0 * (p[0] - q[0]), 5.0 * (p[1] - q[1]));  // both at 15 m
        CHECK(e.heard(i, k) == (d <= 25.0));
        const float mark = o[242 + (q[1] - p[1] + 5) * 11 + (q[0] - p[0] + 5)];
        if (d <= 25.0) CHECK(mark == doctest::Approx(0.75));
      }
    }
    // The state: every agent's cell marked (2 + 1) / 3, the budget last.
    const float* s = row.data() + l.state_offset();
    for (int i = 0; i < 4; ++i) CHECK(s[e.pose(i)[1] * 11 + e.pose(i)[0]] == doctest::Approx(1.0));
    CHECK(s[4 * 121] == doctest::Approx(1.0));
  }
}

}  // namespace
