// Tests for COMA (algorithms/coma.hpp) and multi-agent envs in the Trainer: the
// counterfactual baseline and the critic's input by hand, TD(lambda) targets against the
// forward view, masked actions never sampled, the counterfactual advantage isolating an
// agent's credit where the baselines' advantages do not, COMA learning a credit-assignment
// game that independent actor-critic does not, bitwise resume, BF16 and the loss scaler's
// one update per step of two optimizers.
#include <anvil/algorithms/coma.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <array>
#include <cmath>
#include <span>
#include <string_view>
#include <filesystem>
#include <optional>
#include <vector>

#include <anvil/anvil.hpp>

#include "../captured_checks.hpp"
#include "../python_policy_check.hpp"
#include "../skip.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

using ComaTrainer = Trainer<COMA, EpisodeBuffer>;

RunContext cpu_context() {
  RunContext ctx;
  ctx.device = c10::Device(c10::kCPU);
  return ctx;
}

template <class T = ComaTrainer>
typename T::Config coma_config(const std::string& name, std::int64_t steps, int envs) {
  typename T::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(name);
  c.run->progress = ProgressMode::off;
  c.run->seed = 1;
  c.run->log_interval = steps;
  c.run->checkpoint_interval = 0;
  c.run->threads = 1;
  c.env->num_envs = envs;
  c.buffer->max_steps = 30;
  c.train->steps = steps;
  c.train->eval_interval = 0;
  c.train->eval_episodes = 4;
  return c;
}


// Steps a trained run's envs `steps` times from new episodes, acting as evaluation does,
// and checks that its policy.safetensors, loaded by anvil.load_policy, takes the same
// actions on the same observation rows (skipped visibly without torch in Python); `out`:
// how many episode starts and whether some action was masked.
struct ExportedRollout {
  double firsts = 0;
  bool any_masked = false;
};
void check_exported_policy(ComaTrainer& t, int steps, ExportedRollout& out) {
  const std::filesystem::path file = t.run_dir() / "policy.safetensors";
  REQUIRE(std::filesystem::exists(file));
  auto& col = t.collector();
  auto& coma = t.algorithm();
  col.restart();
  std::vector<at::Tensor> obs, avail, first, action;
  for (int s = 0; s < steps; ++s) {
    const auto rows = col.observations().clone();
    const auto joint = coma.act(rows, ActMode::deterministic);
    obs.push_back(coma.split_obs(rows));
    avail.push_back(coma.split_avail(rows));
    first.push_back(coma.split_first(rows));
    action.push_back(coma.decode(joint));
    (void)col.step(joint, false);
  }
  const auto firsts = at::stack(first), av = at::stack(avail);
  out = {firsts.sum().item<double>(), (av < 0.5).any().item<bool>()};
  ANVIL_CHECK_POLICY_IN_PYTHON(file, {{"obs", at::stack(obs)}, {"avail", av}, {"first", firsts}, {"action", at::stack(action)}}, {});
}
}  // namespace

TEST_CASE("COMA: the counterfactual baseline and advantage of a matrix game, by hand") {
  // Climbing game, agent 1 plays b: agent 0's Q over its actions is the column (-30, 7, 0).
  const auto q = torch::tensor({{-30.0f, 7.0f, 0.0f}});
  const auto pi = torch::tensor({{0.2f, 0.5f, 0.3f}});
  const auto b = COMA::counterfactual_baseline(pi, q);
  CHECK(b.item<float>() == doctest::Approx(0.2 * -30 + 0.5 * 7 + 0.3 * 0));  // -2.5
  // The advantage of b is 7 - (-2.5) = 9.5; of a, -30 + 2.5.
  CHECK((q[0][1] - b[0]).item<float>() == doctest::Approx(9.5));
  CHECK((q[0][0] - b[0]).item<float>() == doctest::Approx(-27.5));

  // The critic's input for each agent: the state, its observation, its id, the others'
  // actions one-hot with its own block zero, and the previous joint action.
  const envs::Joint<envs::MatrixGame> game(envs::MatrixGame::climbing());
  COMA::Config cfg;
  COMA coma(envs::spec_of(game), cfg, cpu_context());
  CHECK(coma.critic_input_size() == 1 + 1 + 2 + 2 * 2 * 3);
  auto g = game;
  const auto row = g.reset(0);
  const auto rows = torch::tensor(std::vector<float>(row.begin(), row.end())).reshape({1, 1, -1});
  const auto u = torch::tensor({2L, 1L}).reshape({1, 1, 2});  // agent 0: c, agent 1: b
  const auto onehot = torch::one_hot(u, 3).to(torch::kFloat);
  const auto prev = torch::zeros_like(onehot);
  const auto x = coma.critic_input(rows, onehot, prev).reshape({2, -1});
  // Agent 0 sees [state 1, obs 1, id (1, 0), others (0 0 0 | 0 1 0), prev (0...)].
  CHECK(torch::equal(x[0], torch::tensor({1.f, 1.f, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f})));
  CHECK(torch::equal(x[1], torch::tensor({1.f, 1.f, 0.f, 1.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f})));
  // Joint actions decode into the agents' actions, agent 0 first.
  CHECK(torch::equal(coma.decode(torch::tensor({7L})), torch::tensor({{1L, 2L}})));
  CHECK(coma.encode(torch::tensor({{1L, 2L}})).item<std::int64_t>() == 7);
}

TEST_CASE("COMA: TD(lambda) targets equal the forward view's lambda-returns, per episode and agent") {
  torch::manual_seed(3);
  const std::int64_t B = 3, T = 6, k = 2;
  const double gamma = 0.9, lambda = 0.7;
  const auto reward = torch::randn({B, T});
  const auto next = torch::randn({B, T, k});  // the value after each step (bootstrap after the last)
  const std::vector<std::int64_t> len{6, 4, 2};
  const std::vector<bool> ends_terminal{true, false, true};
  auto mask = torch::zeros({B, T}), term = torch::zeros({B, T});
  for (std::int64_t b = 0; b < B; ++b) {
    mask[b].narrow(0, 0, len[b]).fill_(1.0);
    if (ends_terminal[b]) term[b][len[b] - 1] = 1.0;
  }
  const auto y = td_lambda_targets(reward, term, mask, next, gamma, lambda);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t a = 0; a < k; ++a)
      for (std::int64_t t = 0; t < T; ++t) {
        if (t >= len[b]) {
          CHECK(y[b][t][a].item<float>() == 0.0f);
          continue;
        }
        // n-step returns G^(n)_t, n = 1 .. N (N = steps left); the last bootstraps with
        // the value after the episode, 0 when it ended in a terminal state.
        const std::int64_t N = len[b] - t;
        auto g_n = [&](std::int64_t n) {
          double g = 0, disc = 1;
          for (std::int64_t i = 0; i < n; ++i) {
            g += disc * reward[b][t + i].item<double>();
            disc *= gamma;
          }
          const std::int64_t last = t + n - 1;
          const double d = term[b][last].item<double>();
          return g + disc * (1 - d) * next[b][last][a].item<double>();
        };
        double lam = 0;
        for (std::int64_t n = 1; n < N; ++n) lam += (1 - lambda) * std::pow(lambda, n - 1) * g_n(n);
        lam += std::pow(lambda, N - 1) * g_n(N);
        CHECK(y[b][t][a].item<float>() == doctest::Approx(lam).epsilon(1e-5));
      }
}

TEST_CASE("COMA: unavailable actions are never sampled or chosen, even with epsilon 1") {
  envs::Joint<envs::MappingTask> m;
  const auto l = m.agent_layout();
  // Rows from real missions at the field's edges: random walks push agents into corners.
  std::vector<float> rows;
  Rng rng(2);
  for (int e = 0; e < 40; ++e) {
    auto row = m.reset(static_cast<std::uint64_t>(e));
    for (int t = 0; t < 10; ++t) {
      rows.insert(rows.end(), row.begin(), row.end());
      std::vector<std::int64_t> u(static_cast<std::size_t>(l.agents));
      for (std::int64_t i = 0; i < l.agents; ++i)
        do u[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(rng.below(7));
        while (row[static_cast<std::size_t>(l.avail_offset() + i * 7 + u[static_cast<std::size_t>(i)])] < 0.5f);
      row = m.step(envs::encode_joint_action(u, 7)).observation;
    }
  }
  const auto obs = torch::tensor(rows).reshape({-1, l.row_size()});
  for (double eps : {0.5, 1.0}) {
    COMA::Config cfg;
    cfg.epsilon_start = eps;
    cfg.epsilon_finish = eps;
    COMA coma(envs::spec_of(m), cfg, cpu_context());
    const auto avail = coma.split_avail(obs);
    REQUIRE((avail.sum(-1) < 7).any().item<bool>());  // some actions are unavailable
    for (int rep = 0; rep < 20; ++rep)
      for (auto mode : {ActMode::explore, ActMode::deterministic}) {
        const auto u = coma.decode(coma.act(obs, mode));
        const auto taken = avail.gather(-1, u.unsqueeze(-1));
        REQUIRE(taken.min().item<float>() == 1.0f);
      }
  }
}

namespace {

struct AdvantageStats {
  double variance = 0;  ///< of agent 0's advantages over uniformly random joint actions
  double error = 0;     ///< mean |advantage - agent 0's true counterfactual advantage|
};

// Trains COMA or a baseline's critic on the credit-assignment game under a uniform policy
// (epsilon 1: the behaviour never changes), then measures agent 0's advantages.
AdvantageStats agent0_advantages(ComaCritic critic) {
  const std::int64_t k = 6;
  const auto game = envs::MatrixGame::credit(k, 1.0, 10.0);
  auto c = coma_config("coma_credit", 2560, 64);
  c.algorithm->critic = critic;
  c.algorithm->batch_size = 64;
  c.algorithm->batch_number = 5;
  c.algorithm->data_passes = 2;
  c.algorithm->target_update_interval = 10;
  c.algorithm->epsilon_start = 1.0;
  c.algorithm->epsilon_finish = 1.0;
  c.algorithm->critic_lr = 3e-3;
  c.buffer->max_steps = 1;
  ComaTrainer t(envs::Joint<envs::MatrixGame>(game), c);
  t.fit();
  auto& coma = t.algorithm();
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const std::int64_t n = 1024;
  const auto u = torch::randint(0, 2, {n, 1, k}, torch::kLong);
  const auto rows = torch::ones({n, 1, k * 3 + 2});  // obs 1 | all available | state 1 | first step
  const auto onehot = torch::one_hot(u, 2).to(torch::kFloat);
  const auto out = coma.critic()->forward(coma.critic_input(rows, onehot, torch::zeros_like(onehot))).select(1, 0).select(1, 0);
  const auto u0 = u.select(1, 0).select(1, 0);
  std::vector<float> r(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = static_cast<float>(game.payoff(coma.encode(u[i][0]).item<std::int64_t>()));
  const auto reward = torch::tensor(r);
  at::Tensor adv;
  if (critic == ComaCritic::counterfactual)
    adv = out.gather(-1, u0.unsqueeze(-1)).squeeze(-1) - COMA::counterfactual_baseline(torch::full({n, 2}, 0.5f), out);
  else
    adv = reward - out.squeeze(-1);  // one step: the TD(lambda) return is the reward
  // Agent 0's true counterfactual advantage: its own share, 1 for action 0, against the mean 0.5.
  const auto truth = (u0 == 0).to(torch::kFloat) - 0.5f;
  std::filesystem::remove_all(*c.run->run_dir);
  return {adv.var().item<double>(), (adv - truth).abs().mean().item<double>()};
}

}  // namespace

TEST_CASE("COMA: the counterfactual advantage isolates an agent's own share of the team reward, where central-V and independent do not") {
  // Credit game: agent 0's action 0 is worth 1 to the team, each of five other agents'
  // action 1 worth 10. Under uniform play agent 0's true advantage is +-0.5; the others'
  // choices add noise of variance 5 x 25 to any advantage that does not condition on them.
  const auto coma = agent0_advantages(ComaCritic::counterfactual);
  const auto cv = agent0_advantages(ComaCritic::central_v);
  const auto iac = agent0_advantages(ComaCritic::independent);
  MESSAGE("agent 0's advantage: variance COMA " << coma.variance << ", central-V " << cv.variance << ", independent "
                                                << iac.variance << "; mean error COMA " << coma.error << ", central-V "
                                                << cv.error << ", independent " << iac.error);
  CHECK(coma.error < 0.15);
  CHECK(coma.variance < 0.5);
  CHECK(cv.variance > 50 * coma.variance);
  CHECK(iac.variance > 50 * coma.variance);
  CHECK(cv.error > 5.0);
  CHECK(iac.error > 5.0);
}

namespace {

struct CreditRun {
  double agent0_good = 0;  ///< agent 0's probability of its good action after training
  bool optimal = false;    ///< whether the deterministic joint action is the optimum
};

// Trains on the 7-agent credit game (agent 0's good action worth 1, each other agent's
// worth 50) for 4800 episodes under constant exploration (epsilon 0.5, so the others'
// choices keep their noise in the team's reward), then reads the trained policy.
CreditRun train_credit(ComaCritic critic, std::uint64_t seed) {
  const std::int64_t k = 7;
  const auto game = envs::MatrixGame::credit(k, 1.0, 50.0);
  auto c = coma_config("coma_credit_learn", 4800, 64);
  c.run->seed = seed;
  c.run->tensorboard = false;
  c.buffer->max_steps = 1;
  c.algorithm->critic = critic;
  c.algorithm->batch_size = 64;
  c.algorithm->batch_number = 5;
  c.algorithm->data_passes = 2;
  c.algorithm->target_update_interval = 10;
  c.algorithm->critic_lr = 3e-3;
  c.algorithm->actor_lr = 1e-3;
  c.algorithm->epsilon_start = 0.5;
  c.algorithm->epsilon_finish = 0.5;
  ComaTrainer t(envs::Joint<envs::MatrixGame>(game), c);
  t.fit();
  auto& coma = t.algorithm();
  torch::NoGradGuard no_grad;
  const auto rows = torch::ones({1, k * 3 + 2});  // obs 1 | all available | state 1 | first step
  const auto pi = coma.policy(rows, 0.0).reshape({k, 2});
  const auto greedy = coma.act(rows, ActMode::deterministic).item<std::int64_t>();
  std::filesystem::remove_all(*c.run->run_dir);
  return {pi[0][0].item<double>(), greedy == envs::MatrixGame::credit_optimum(k)};
}

}  // namespace

TEST_CASE("COMA learns the optimal joint action of the credit game, where independent actor-critic fails" * doctest::test_suite("learning")) {
  // Same networks, schedule, seeds and budget; only the critic and advantage differ.
  double coma_min = 1, iac_mean = 0, cv_mean = 0;
  int coma_optimal = 0, iac_optimal = 0, cv_optimal = 0;
  const int seeds = 5;
  const std::uint64_t first = learning_seed(1);  // seeds first .. first + 4
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    const auto coma = train_credit(ComaCritic::counterfactual, seed);
    const auto iac = train_credit(ComaCritic::independent, seed);
    const auto cv = train_credit(ComaCritic::central_v, seed);
    coma_min = std::min(coma_min, coma.agent0_good);
    iac_mean += iac.agent0_good / seeds;
    cv_mean += cv.agent0_good / seeds;
    coma_optimal += coma.optimal;
    iac_optimal += iac.optimal;
    cv_optimal += cv.optimal;
  }
  MESSAGE("optimal joint action in " << seeds << " seeds: COMA " << coma_optimal << ", independent " << iac_optimal
                                     << ", central-V " << cv_optimal << "; agent 0's good action: COMA >= " << coma_min
                                     << ", independent " << iac_mean << " and central-V " << cv_mean << " on average");
  CHECK(coma_optimal == seeds);
  CHECK(coma_min > 0.99);      // every seed: agent 0 has found its small share
  CHECK(iac_optimal < seeds);  // independent actor-critic misses it in some seeds
  CHECK(iac_mean < 0.8);       // and is unsure of agent 0's action on average
}

TEST_CASE("Trainer<COMA>: resuming from a checkpoint continues bitwise like the uninterrupted run, MLP and GRU actors") {
  for (int gru : {0, 16}) {
    CAPTURE(gru);
    auto c = coma_config("coma_resume_a", 2000, 4);
    c.algorithm->actor->gru = gru;
    c.run->checkpoint_interval = 900;
    c.algorithm->batch_size = 64;
    c.algorithm->batch_number = 5;  // 320 agent-transitions: a round holds 300, so a training
    c.algorithm->data_passes = 2;   // every second round, and the checkpoint after round 9 holds one
    c.algorithm->target_update_interval = 5;
    c.algorithm->epsilon_anneal_episodes = 50;
    ComaTrainer a(envs::Joint<envs::SimpleSpread>{}, c);
    a.fit();
    std::filesystem::path ckpt;
    for (const auto& e : std::filesystem::directory_iterator(*c.run->run_dir))
      if (e.path().extension() == ".ckpt" && e.path().filename().string().find("000000000900") != std::string::npos) ckpt = e.path();
    REQUIRE_FALSE(ckpt.empty());
    {  // the checkpoint holds episodes waiting for the next training
      auto probe = c;
      probe.run->run_dir = temp_run_dir("coma_resume_probe");
      probe.run->resume = ckpt.string();
      probe.train->steps = 900;
      ComaTrainer p(envs::Joint<envs::SimpleSpread>{}, probe);
      p.begin();
      CHECK(p.algorithm().held_transitions() == 300);
      std::filesystem::remove_all(*probe.run->run_dir);
    }

    auto rc = c;
    rc.run->run_dir = temp_run_dir("coma_resume_b");
    rc.run->resume = ckpt.string();
    ComaTrainer b(envs::Joint<envs::SimpleSpread>{}, rc);
    b.fit();
    CHECK(b.env_steps() == a.env_steps());
    CHECK(b.algorithm().episodes() == a.algorithm().episodes());
    CHECK(b.algorithm().critic_steps() == a.algorithm().critic_steps());
    auto weights = [](ComaTrainer& t) {
      std::vector<at::Tensor> w;
      for (const auto& [name, p] : t.algorithm().flat_parameters()) w.push_back(p.clone());
      return w;
    };
    const auto wa = weights(a), wb = weights(b);
    REQUIRE(wa.size() == wb.size());
    for (std::size_t i = 0; i < wa.size(); ++i) CHECK(torch::equal(wa[i], wb[i]));

    // Another seed gives other weights: the comparison can tell.
    auto f = c;
    f.run->run_dir = temp_run_dir("coma_resume_c");
    f.run->seed = 9;
    f.run->checkpoint_interval = 0;
    ComaTrainer o(envs::Joint<envs::SimpleSpread>{}, f);
    o.fit();
    CHECK_FALSE(torch::equal(weights(o)[0], wa[0]));
    for (const auto& d : {*c.run->run_dir, *rc.run->run_dir, *f.run->run_dir}) std::filesystem::remove_all(d);
  }
}

namespace {

// A memory task: each of two agents sees a cue bit at the first of two steps and a blank
// at the second, where the team scores 1 for each agent whose action repeats its cue. An
// agent without memory can do no better than guess (a return of 1 on average); one that
// remembers scores 2. The critic's state holds the cues throughout.
struct Recall {
  static constexpr std::string_view name = "Recall";
  std::array<int, 2> cue{};
  std::int64_t t = 0;
  [[nodiscard]] std::int64_t num_agents() const { return 2; }
  [[nodiscard]] std::int64_t agent_observation_size() const { return 2; }  // cue, is-blank
  [[nodiscard]] std::int64_t num_actions() const { return 2; }
  [[nodiscard]] std::int64_t state_size() const { return 3; }  // both cues, the step
  void reset(std::uint64_t seed) {
    Rng rng(seed);
    for (auto& c : cue) c = static_cast<int>(rng.below(2));
    t = 0;
  }
  envs::TeamStep step(std::span<const std::int64_t> u) {
    double r = 0;
    if (t == 1)
      for (int i = 0; i < 2; ++i) r += u[static_cast<std::size_t>(i)] == cue[static_cast<std::size_t>(i)] ? 1.0 : 0.0;
    ++t;
    return {r, t == 2, false};
  }
  void observe(std::int64_t a, std::span<float> out) const {
    out[0] = t == 0 ? static_cast<float>(cue[static_cast<std::size_t>(a)]) : 0.0f;
    out[1] = t == 0 ? 0.0f : 1.0f;
  }
  void available_actions(std::int64_t, std::span<float> out) const { out[0] = out[1] = 1.0f; }
  void write_state(std::span<float> out) const {
    out[0] = static_cast<float>(cue[0]);
    out[1] = static_cast<float>(cue[1]);
    out[2] = static_cast<float>(t);
  }
};
static_assert(envs::MultiAgentEnv<Recall>);

double train_recall(int gru) {
  auto c = coma_config("coma_recall", 6000, 16);
  c.run->tensorboard = false;
  c.buffer->max_steps = 2;
  c.train->eval_episodes = 64;
  c.algorithm->actor->gru = gru;
  c.algorithm->actor->hidden = std::vector<int>{32};
  c.algorithm->critic_net->hidden = std::vector<int>{64};
  c.algorithm->batch_size = 32;
  c.algorithm->batch_number = 2;
  c.algorithm->data_passes = 2;
  c.algorithm->target_update_interval = 10;
  c.algorithm->actor_lr = 3e-3;
  c.algorithm->critic_lr = 3e-3;
  c.algorithm->epsilon_anneal_episodes = 1500;
  ComaTrainer t(envs::Joint<Recall>{}, c);
  const auto r = t.fit();
  std::filesystem::remove_all(*c.run->run_dir);
  return r.final_eval_return;
}

}  // namespace

TEST_CASE("COMA with a GRU actor remembers a cue that an MLP actor cannot see any more") {
  const double gru = train_recall(16), mlp = train_recall(0);
  MESSAGE("Recall return (2 = both agents remember): GRU " << gru << ", MLP " << mlp);
  CHECK(gru > 1.9);
  CHECK(mlp < 1.5);
}

TEST_CASE("COMA's GRU actor acts step by step as its training unrolls the episode") {
  COMA::Config cfg;
  cfg.actor->gru = 8;
  envs::Joint<envs::MappingTask> m;
  torch::manual_seed(4);
  COMA coma(envs::spec_of(m), cfg, cpu_context());
  REQUIRE(coma.recurrent());
  // Two missions side by side, acted on step by step; the second starts one step late
  // (its first row comes while the first mission is at its second step).
  std::array<envs::Joint<envs::MappingTask>, 2> env;
  std::vector<at::Tensor> rows0, rows1, acts;
  auto row_of = [](const auto& e) { const auto o = e.observation(); return torch::tensor(std::vector<float>(o.begin(), o.end())); };
  env[0].reset(1);
  env[1].reset(2);
  env[1].step(0);  // env 1 is one step into a mission; it restarts below
  for (int t = 0; t < 8; ++t) {
    if (t == 1) env[1].reset(3);
    const auto rows = torch::stack({row_of(env[0]), row_of(env[1])});
    rows0.push_back(rows[0]);
    if (t >= 1) rows1.push_back(rows[1]);
    const auto a = coma.act(rows, ActMode::deterministic);
    acts.push_back(a);
    for (int e = 0; e < 2; ++e) env[static_cast<std::size_t>(e)].step(a[e].item<std::int64_t>());
  }
  // The same episodes unrolled from their starts give the same choices.
  const auto seq0 = torch::stack(rows0).unsqueeze(0), seq1 = torch::stack(rows1).unsqueeze(0);
  torch::NoGradGuard no_grad;
  const auto greedy0 = coma.encode(coma.policy(seq0, 0.0).argmax(-1)).squeeze(0);
  const auto greedy1 = coma.encode(coma.policy(seq1, 0.0).argmax(-1)).squeeze(0);
  for (int t = 0; t < 8; ++t) CHECK(acts[static_cast<std::size_t>(t)][0].item<std::int64_t>() == greedy0[t].item<std::int64_t>());
  for (int t = 1; t < 8; ++t)
    CHECK(acts[static_cast<std::size_t>(t)][1].item<std::int64_t>() == greedy1[t - 1].item<std::int64_t>());
}

TEST_CASE("Trainer<COMA, EpisodeBuffer, SingleDevice, BF16>: mapping missions train with finite losses, per critic kind") {
  using Bf16Trainer = Trainer<COMA, EpisodeBuffer, SingleDevice, BF16>;
  for (auto critic : {ComaCritic::counterfactual, ComaCritic::central_v, ComaCritic::independent}) {
    auto c = coma_config<Bf16Trainer>("coma_bf16", 560, 4);
    c.buffer->max_steps = 14;
    c.train->update->grad_accumulation = 2;
    c.algorithm->critic = critic;
    c.algorithm->batch_size = 32;
    c.algorithm->batch_number = 2;
    c.algorithm->data_passes = 1;
    Bf16Trainer t(envs::Joint<envs::MappingTask>{}, c);
    const auto r = t.fit();
    CHECK(t.algorithm().updates() >= 4);
    CHECK(std::isfinite(r.final_eval_return));
    CHECK(r.final_eval_return > 0.0);  // any mission removes some of the map's entropy
    std::filesystem::remove_all(*c.run->run_dir);
  }
}

TEST_SUITE("gpu") {
TEST_CASE("Trainer<COMA, EpisodeBuffer, SingleDevice, FP16>: mapping missions train on CUDA, the critic and actor steps sharing each scaler step") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  using Fp16Trainer = Trainer<COMA, EpisodeBuffer, SingleDevice, FP16>;
  auto c = coma_config<Fp16Trainer>("coma_fp16", 1120, 8);
  c.run->device = "cuda";
  // A scale too small to overflow and a growth interval longer than the run: each critic
  // step and the actor step after it are one step of the scaler's schedule, never two.
  c.precision->init_scale = 256.0;
  c.precision->growth_interval = 100000;
  c.buffer->max_steps = 14;
  c.algorithm->batch_size = 64;
  c.algorithm->batch_number = 2;
  c.algorithm->data_passes = 2;
  Fp16Trainer t(envs::Joint<envs::MappingTask>{}, c);
  const auto r = t.fit();
  const auto* scaler = t.step_context().scaler();
  REQUIRE(scaler != nullptr);
  CHECK(t.algorithm().critic_steps() >= 20);
  REQUIRE(scaler->skipped() == 0);
  CHECK(scaler->good_steps() == t.algorithm().critic_steps());  // two per step if the optimizers counted apart
  CHECK(scaler->current_scale() == 256.0);
  CHECK(std::isfinite(r.final_eval_return));
  for (const auto& [name, w] : t.algorithm().flat_parameters()) CHECK(torch::isfinite(w).all().item<bool>());
  std::filesystem::remove_all(*c.run->run_dir);
}
}

TEST_CASE("COMA refuses a single-agent env, naming it") {
  COMA::Config cfg;
  CHECK_THROWS_WITH_AS(COMA(envs::spec_of(envs::CartPole{}), cfg, cpu_context()),
                       doctest::Contains("COMA: CartPole-v1 is not a multi-agent env"), ConfigError);
}

TEST_CASE("Trainer<COMA>: normalize.obs is refused for a multi-agent env, normalize.reward is taken") {
  auto c = coma_config("coma_normalize", 100, 2);
  c.normalize->obs = true;
  CHECK_THROWS_WITH_AS(ComaTrainer(envs::Joint<envs::SimpleSpread>{}, c),
                       doctest::Contains("normalize.obs: SimpleSpread is a multi-agent env"), ConfigError);
  c.normalize->obs = false;
  c.normalize->reward = true;
  c.normalize->gamma = 0.99;
  ComaTrainer t(envs::Joint<envs::SimpleSpread>{}, c);
  CHECK(t.fit().env_steps >= 100);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("LossScaler: two optimizers' steps inside one scaler step update the scale once") {
  LossScaler s(LossScaling{.init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2});
  auto finite = [] { return torch::ones({3}); };
  auto bad = [] { return torch::tensor({1.0f, INFINITY, 0.0f}); };
  for (int step = 0; step < 2; ++step) {
    s.begin_step();
    auto g1 = finite(), g2 = finite();
    CHECK(s.unscale_and_check(g1));
    CHECK(s.unscale_and_check(g2));
    s.end_step();
  }
  CHECK(s.current_scale() == 2048.0);  // grew after 2 steps, not after 2 optimizer calls
  s.begin_step();
  auto g1 = finite(), g2 = bad();
  CHECK(s.unscale_and_check(g1));        // the critic steps
  CHECK_FALSE(s.unscale_and_check(g2));  // the actor's step is skipped
  s.end_step();
  CHECK(s.current_scale() == 1024.0);  // one backoff
  CHECK(s.good_steps() == 0);
  CHECK(s.skipped() == 1);
}

TEST_CASE("Trainer<COMA>: policy.safetensors acts in PyTorch as the run's actor (anvil.load_policy): MLP and GRU, masked actions") {
  for (int gru : {0, 16}) {
    CAPTURE(gru);
    auto c = coma_config(gru ? "coma_export_gru" : "coma_export_mlp", 600, 8);
    c.algorithm->actor->gru = gru;
    c.algorithm->batch_size = 32;
    c.algorithm->batch_number = 2;
    ComaTrainer t(envs::Joint<envs::MappingTask>{}, c);
    t.fit();
    // 125 steps of the 8 envs (1,000 observation rows) from new episodes (many end and start
    // again: a recurrent actor's memory restarts there), acting as evaluation does
    ExportedRollout r;
    check_exported_policy(t, 125, r);
    CHECK(r.firsts > 8);    // episodes restarted
    CHECK(r.any_masked);    // some actions masked
  }
}

namespace {

TEST_CASE("Trainer<COMA> on the published mapping mission: its maps go through the CNN for every critic kind, and resume bitwise") {
  for (auto critic : {ComaCritic::counterfactual, ComaCritic::central_v, ComaCritic::independent}) {
    CAPTURE(critic);
    auto c = coma_config("coma_maps", 600, 4);
    c.buffer->max_steps = 15;
    c.algorithm->critic = critic;
    c.algorithm->map_encoder->channels = 8;
    c.algorithm->batch_size = 60;
    c.algorithm->batch_number = 2;
    c.algorithm->data_passes = 1;
    c.algorithm->target_update_interval = 3;
    c.run->checkpoint_interval = 300;
    ComaTrainer t(envs::Joint<envs::PublishedMapping>{}, c);
    auto& coma = t.algorithm();
    REQUIRE(coma.maps());
    // 7 observation maps through the actor's CNN; the critic's stacks the state's 4 with them
    // (the independent critic reads the observation alone).
    CHECK(coma.actor_encoder()->in_channels() == 7);
    CHECK(coma.critic_encoder()->in_channels() == (critic == ComaCritic::independent ? 7 : 11));
    CHECK(coma.actor()->in_features() == 8 * 1 * 1 + 4);  // the CNN's 8 features and the id
    const auto r = t.fit();
    CHECK(coma.updates() >= 2);
    CHECK(std::isfinite(r.final_eval_return));
    // Resume from the checkpoint at 300 steps: the same weights at the end.
    auto rc = c;
    rc.run->run_dir = temp_run_dir("coma_maps_resume");
    std::filesystem::path ckpt;
    for (const auto& e : std::filesystem::directory_iterator(*c.run->run_dir))
      if (e.path().extension() == ".ckpt" && e.path().filename().string().find("000000000300") != std::string::npos) ckpt = e.path();
    REQUIRE_FALSE(ckpt.empty());
    rc.run->resume = ckpt.string();
    ComaTrainer b(envs::Joint<envs::PublishedMapping>{}, rc);
    b.fit();
    const auto fa = coma.flat_parameters(), fb = b.algorithm().flat_parameters();
    for (std::size_t i = 0; i < fa.size(); ++i) CHECK(at::equal(fa[i].second, fb[i].second));
    std::filesystem::remove_all(*c.run->run_dir);
    std::filesystem::remove_all(*rc.run->run_dir);
  }
  // coma.map_encoder.channels=0: the maps are plain numbers for the MLPs.
  auto c = coma_config("coma_maps_flat", 120, 2);
  c.buffer->max_steps = 15;
  c.algorithm->map_encoder->channels = 0;
  c.algorithm->batch_size = 60;
  c.algorithm->batch_number = 1;
  ComaTrainer t(envs::Joint<envs::PublishedMapping>{}, c);
  CHECK_FALSE(t.algorithm().maps());
  CHECK(t.algorithm().actor()->in_features() == 7 * 121 + 4);
  t.fit();
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer<COMA>: a policy with a map encoder acts in PyTorch as the run's actor (anvil.load_policy)") {
  auto c = coma_config("coma_export_maps", 300, 4);
  c.buffer->max_steps = 15;
  c.algorithm->map_encoder->channels = 8;
  c.algorithm->batch_size = 60;
  c.algorithm->batch_number = 2;
  ComaTrainer t(envs::Joint<envs::PublishedMapping>{}, c);
  t.fit();
  ExportedRollout r;
  check_exported_policy(t, 30, r);
  CHECK(r.any_masked);
}

}  // namespace

namespace {
// Random episodes of 1-3 steps in `l`'s rows (observations, states and rewards drawn, every
// action available, the first step flagged) with random joint actions of `joint` choices.
EpisodeBatch random_episodes(const AgentLayout& l, std::int64_t episodes, std::int64_t joint) {
  const std::int64_t T = 3;
  auto obs = torch::randn({episodes, T, l.row_size()});
  obs.narrow(-1, l.avail_offset(), l.agents * l.num_actions).fill_(1.0);
  obs.select(-1, l.first_offset()).fill_(0.0);
  obs.select(1, 0).select(-1, l.first_offset()).fill_(1.0);
  const auto length = torch::randint(1, T + 1, {episodes}, torch::kLong);
  const auto mask = (torch::arange(T).unsqueeze(0) < length.unsqueeze(1)).to(torch::kFloat);
  auto last_obs = torch::randn({episodes, l.row_size()});
  last_obs.narrow(-1, l.avail_offset(), l.agents * l.num_actions).fill_(1.0);
  last_obs.select(-1, l.first_offset()).fill_(0.0);
  const auto terminated = mask * (torch::rand({episodes, T}) < 0.5).to(torch::kFloat) *
                          (torch::arange(T).unsqueeze(0) == (length - 1).unsqueeze(1)).to(torch::kFloat);
  return EpisodeBatch{obs, torch::randint(0, joint, {episodes, T}, torch::kLong), torch::randn({episodes, T}) * mask,
                      terminated, mask, length, last_obs};
}

// Two COMAs from one seed, one updated by `update`, one by `update_as_captured` (each
// minibatch's critic and actor steps as a CUDA graph holds them, op by op), on the same
// rounds of episodes through step contexts with `options`: their metrics, weights, target
// critics and step counts agree within float rounding.
void check_coma_captured_matches(const COMA::Config& cfg, const StepContext::Options& options = {},
                                 const std::optional<StepContext::Options>& captured_options = {}) {
  const auto game = envs::MatrixGame::credit(3, 1.0, 10.0);
  const auto spec = envs::spec_of(envs::Joint<envs::MatrixGame>(game));
  torch::manual_seed(41);
  COMA eager(spec, cfg, cpu_context());
  torch::manual_seed(41);
  COMA captured(spec, cfg, cpu_context());
  StepContext ce(options), cc(captured_options.value_or(options));
  int trained = 0;
  for (int round = 0; round < 6; ++round) {
    torch::manual_seed(42 + round);
    const auto b = random_episodes(spec.agents, 16, spec.agents.joint_actions());
    torch::manual_seed(100 + round);  // the same minibatch order on both sides
    const auto x = eager.update(b, ce);
    torch::manual_seed(100 + round);
    const auto y = captured.update_as_captured(b, cc);
    REQUIRE(x.metrics.size() == y.metrics.size());
    trained += x.metrics.empty() ? 0 : 1;
    for (std::size_t i = 0; i < x.metrics.size(); ++i) {
      CAPTURE(round);
      CHECK(x.metrics[i].first == y.metrics[i].first);
      CHECK(y.metrics[i].second == doctest::Approx(x.metrics[i].second).epsilon(1e-4));
    }
  }
  CHECK(trained >= 2);
  auto close = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    bool ok = a.size() == b.size();
    for (std::size_t i = 0; ok && i < a.size(); ++i) ok = torch::allclose(a[i], b[i], 1e-4, 1e-5);
    return ok;
  };
  CHECK(close(eager.actor()->parameters(), captured.actor()->parameters()));
  CHECK(close(eager.critic()->parameters(), captured.critic()->parameters()));
  CHECK(close(eager.critic_target()->parameters(), captured.critic_target()->parameters()));
  CHECK(captured.updates() == eager.updates());
  CHECK(cc.steps() == ce.steps());
  CHECK(captured.graphed_updates() == 0);
  test::check_same_scaler_decisions(ce, cc);  // with a loss scaler: the same decisions on the device
}
}  // namespace

TEST_CASE("COMA: a minibatch's critic and actor steps as a CUDA graph holds them match the op-by-op steps, per critic kind, FP16's scaler included") {
  // On the CPU no graph runs, but the captured form of the steps runs op by op
  // (update_as_captured): the arithmetic a replay does on CUDA, with epsilon's mixing
  // weights as device scalars and the losses kept as tensors until the training's end.
  // Every critic kind with epsilon mixed in, then none, then gradient accumulation's
  // micro-batches looped over inside.
  COMA::Config cfg;
  cfg.actor->hidden = {32};
  cfg.critic_net->hidden = {32};
  cfg.batch_size = 24;
  cfg.batch_number = 2;
  cfg.data_passes = 2;
  cfg.target_update_interval = 3;
  cfg.ent_coef = 0.01;
  cfg.epsilon_anneal_episodes = 40;
  for (const auto critic : {ComaCritic::counterfactual, ComaCritic::central_v, ComaCritic::independent}) {
    CAPTURE(static_cast<int>(critic));
    cfg.critic = critic;
    check_coma_captured_matches(cfg);
  }
  cfg.critic = ComaCritic::counterfactual;
  cfg.epsilon_start = 0.0;
  cfg.epsilon_finish = 0.0;
  check_coma_captured_matches(cfg);
  cfg.epsilon_start = 0.5;
  StepContext::Options accumulating;
  accumulating.micro_batches = 4;
  check_coma_captured_matches(cfg, accumulating);
  // A minibatch's critic and actor steps are one step of FP16's loss scaler, captured or
  // not. A scale near float32's limit makes gradients overflow as float16's do at 2^16:
  // steps are skipped and the scale halves, then grows back after 2 finite minibatches.
  StepContext::Options eager;
  eager.loss_scaling = LossScaler::Options{.init_scale = std::ldexp(1.0, 124), .growth_factor = 2.0,
                                           .backoff_factor = 0.5, .growth_interval = 2};
  auto captured = eager;
  captured.loss_scaler_on_device = true;
  check_coma_captured_matches(cfg, eager, captured);
}

TEST_CASE("COMA: steps a CUDA graph cannot hold are refused by name, and the run header says why") {
  const auto spec = envs::spec_of(envs::Joint<envs::MatrixGame>(envs::MatrixGame::credit(3, 1.0, 10.0)));
  COMA::Config cfg;
  StepContext::Options o;  // a loss scaler whose state is on the host (on CUDA it is on the device)
  o.loss_scaling = LossScaler::Options{};
  StepContext scaled(o);
  COMA coma(spec, cfg, cpu_context());
  const auto b = random_episodes(spec.agents, 4, spec.agents.joint_actions());
  CHECK_THROWS_WITH_AS((void)coma.update_as_captured(b, scaled),
                       "coma: these steps cannot be captured: the loss scaler's state is on the host "
                       "(StepContext::Options::loss_scaler_on_device)",
                       Error);
  CHECK(cuda_graph_note(coma, scaled).find("coma's update runs op by op: the loss scaler's state is on the host") == 0);
  CHECK(cuda_graph_note(coma, StepContext{}) ==
        "coma's critic and actor steps are captured (a graph per minibatch size, after 2 warm-ups op by op each); "
        "acting runs op by op");
  auto gru = cfg;
  gru.actor->gru = 8;
  StepContext plain;
  COMA recurrent(spec, gru, cpu_context());
  CHECK_THROWS_WITH_AS((void)recurrent.update_as_captured(b, plain),
                       "coma: these steps cannot be captured: coma.actor.gru: a recurrent actor unrolls every held "
                       "episode in each step",
                       Error);
  auto off = cfg;
  off.cuda_graph = false;
  CHECK(cuda_graph_note(COMA(spec, off, cpu_context()), plain) ==
        "coma's update runs op by op: off (coma.cuda_graph=false); acting runs op by op");
}
