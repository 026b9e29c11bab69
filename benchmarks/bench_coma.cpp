// COMA's speed and the mapping mission's outcomes, one JSON line per figure.
//
// speed: env steps/s and minibatch steps/s (one critic and one actor step each) of
//   Trainer<COMA, EpisodeBuffer> on an env (default: the mapping mission) with 1 and 8
//   vectorised copies, FP32 and BF16 (CPU autocast), each run `bench.steps` env steps; on
//   CUDA, `bench.cuda_graph=[on,off]` times the minibatch steps graphed and op by op.
// reference: the random and lawnmower policies on a mapping mission (`bench.env`: Mapping,
//   or MappingWestheider, the published one), `bench.episodes` missions per seed.
// policy: the trained policies of COMA runs (`bench.runs`: run directories of
//   examples/coma on the mapping mission; each is read from its config.yaml and its latest
//   checkpoint), acting deterministically, on the same missions as the references.
// diagnose: the published mission's trained runs (`bench.runs`), exploring: the spread of
//   their advantages and their critics' error by altitude (see `diagnose`).
// A mission's figures: its return (the weighted entropy removed, a fraction of the prior's),
// the weighted and the plain entropy left at its end, and the map's error.
#include <anvil/buffers/episode_buffer.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <fcntl.h>
#include <unistd.h>

#include <anvil/algorithms/coma.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/trainer.hpp>

struct BenchConfig {
  anvil::Param<std::string, "mode", "speed, reference, policy or diagnose"> mode{"speed"};
  anvil::Param<std::string, "env", "a built-in multi-agent env (speed); reference, policy: Mapping or MappingWestheider"> env{"Mapping"};
  anvil::Param<std::vector<int>, "num_envs", "vectorised copies (speed)", anvil::at_least(1)> num_envs{1, 8};
  anvil::Param<std::vector<std::string>, "precision", "fp32 and/or bf16 (speed)"> precision{"fp32", "bf16"};
  anvil::Param<std::int64_t, "steps", "env steps per speed run", anvil::at_least(1)> steps{20'000};
  anvil::Param<int, "rounds", "speed: rounds, each timing every setting once (interleaved)", anvil::at_least(1)> rounds{3};
  anvil::Param<int, "batch_size", "coma.batch_size of the speed runs", anvil::at_least(1)> batch_size{128};
  anvil::Param<std::string, "device", "run.device of the speed runs: cpu, cuda, cuda:N or auto"> device{"cpu"};
  anvil::Param<std::vector<std::string>, "cuda_graph",
               "coma.cuda_graph values of the speed runs: on (on CUDA, each minibatch's steps replayed from a "
               "CUDA graph), off (op by op)">
      cuda_graph{"on"};
  anvil::Param<int, "episodes", "missions per seed (reference, policy)", anvil::at_least(1)> episodes{200};
  anvil::Param<std::vector<int>, "seeds", "seeds of the missions (reference; policy: the first)"> seeds{1, 2, 3};
  anvil::Param<std::vector<std::string>, "runs", "run directories of trained COMA policies (policy)"> runs{};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

template <class X>
void speed(const BenchConfig& b, int n, const std::string& precision, const std::string& graph, int round) {
  using Trainer = anvil::Trainer<anvil::COMA, anvil::EpisodeBuffer, anvil::SingleDevice, X>;
  typename Trainer::Config t;
  t.run->device = *b.device;
  t.run->progress = anvil::ProgressMode::off;
  t.run->checkpoint_interval = 0;
  t.run->tensorboard = false;
  t.run->threads = 1;
  t.run->seed = 1;
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_coma_" + std::to_string(::getpid()))).string();
  t.env->num_envs = n;
  t.buffer->max_steps = 64;
  t.train->steps = b.steps;
  t.train->eval_interval = 0;
  t.train->eval_episodes = 1;
  t.algorithm->batch_size = b.batch_size;
  t.algorithm->cuda_graph = graph == "on";
  anvil::envs::with_team_env(*b.env, [&](const auto& env) {
    Trainer trainer(env, t, "bench_coma");
    const auto r = trainer.fit();
    const double wall = r.wall_seconds - trainer.times().seconds(anvil::Phase::eval);
    const std::vector<std::pair<std::string, bench::Value>> cfg{
        {"env", *b.env}, {"num_envs", n}, {"precision", precision}, {"batch_size", *b.batch_size}, {"steps", r.env_steps},
        {"cuda_graph", graph}, {"round", round}};
    const std::string dev = trainer.context().device.str();
    bench::emit("coma_env_steps_per_s", static_cast<double>(r.env_steps) / wall, "env steps/s", cfg, dev);
    bench::emit("coma_minibatch_steps_per_s",
                static_cast<double>(trainer.algorithm().critic_steps()) /
                    (trainer.times().seconds(anvil::Phase::update) + trainer.times().seconds(anvil::Phase::optimizer)),
                "minibatch steps/s (critic + actor)", cfg, dev);
    std::error_code ec;
    std::filesystem::remove_all(trainer.run_dir(), ec);
  });
}

// A policy on a mapping mission (M: MappingTask or PublishedMapping): the agents' actions
// for each of a batch of missions.
template <class M>
using MissionPolicy = std::function<void(std::vector<anvil::envs::Joint<M>>&, std::vector<std::int64_t>& joint_actions)>;

// The mean over `episodes` missions (seeded as evaluations are, from `seed`) of: the
// return, the weighted entropy left, the entropy left, the map error and (the published
// mission) the F1 score of the target class.
template <class M>
std::array<double, 5> missions(const MissionPolicy<M>& policy, int episodes, std::uint64_t seed) {
  std::vector<anvil::envs::Joint<M>> envs(static_cast<std::size_t>(episodes));
  for (int e = 0; e < episodes; ++e)
    envs[static_cast<std::size_t>(e)].reset(anvil::derive_seed(seed, anvil::Stream::eval_env, static_cast<std::uint64_t>(e)));
  std::vector<double> ret(envs.size(), 0.0);
  std::vector<std::int64_t> joint(envs.size());
  for (std::int64_t t = 0; t < M::kSteps; ++t) {
    policy(envs, joint);
    for (std::size_t e = 0; e < envs.size(); ++e) ret[e] += envs[e].step(joint[e]).reward;
  }
  std::array<double, 5> sum{};
  for (std::size_t e = 0; e < envs.size(); ++e) {
    const auto& m = envs[e].env();
    sum[0] += ret[e];
    sum[1] += m.weighted_entropy_fraction();
    sum[2] += m.entropy_fraction();
    sum[3] += m.map_error();
    if constexpr (requires { m.f1(); }) sum[4] += m.f1();
  }
  for (auto& x : sum) x /= episodes;
  return sum;
}

template <class M>
void emit_missions(const std::array<double, 5>& r, std::vector<std::pair<std::string, bench::Value>> c) {
  c.insert(c.begin(), {"env", std::string(M::name)});
  constexpr bool published = requires(const M& m) { m.f1(); };
  bench::emit("mapping_return", r[0], published ? "sum of 22 x relative weighted-entropy reduction - 0.5" : "weighted entropy removed, fraction of the prior's", c);
  bench::emit("mapping_weighted_entropy_left", r[1], "fraction of the prior's", c);
  bench::emit("mapping_entropy_left", r[2], "fraction of the prior's", c);
  bench::emit("mapping_map_error", r[3], "mean absolute error", c);
  if (published) bench::emit("mapping_f1", r[4], "F1 of the target class, map thresholded at 0.5", c);
}

// Random flights (uniform over each agent's available actions) and the lawnmower sweep.
template <class M>
MissionPolicy<M> random_policy(std::uint64_t seed) {
  return [rng = anvil::Rng(seed * 7919)](auto& envs, auto& joint) mutable {
    for (std::size_t e = 0; e < envs.size(); ++e) {
      std::array<std::int64_t, M::kAgents> a{};
      for (int i = 0; i < M::kAgents; ++i)
        do a[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(rng.below(M::kActions));
        while (!envs[e].env().available(i, a[static_cast<std::size_t>(i)]));
      joint[e] = anvil::envs::encode_joint_action(a, M::kActions);
    }
  };
}
template <class M>
MissionPolicy<M> lawnmower_policy() {
  return [](auto& envs, auto& joint) {
    for (std::size_t e = 0; e < envs.size(); ++e) {
      if (envs[e].env().steps() > 0) envs[e].env().lawnmower_turns();  // after the previous step
      joint[e] = anvil::envs::encode_joint_action(envs[e].env().lawnmower(), M::kActions);
    }
  };
}

// The latest checkpoint in a run directory.
std::filesystem::path latest_checkpoint(const std::filesystem::path& dir) {
  std::filesystem::path best;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".ckpt" && (best.empty() || e.path().filename() > best.filename())) best = e.path();
  if (best.empty()) throw anvil::Error("bench.runs: '" + dir.string() + "' holds no checkpoint");
  return best;
}

using RunTrainer = anvil::Trainer<anvil::COMA, anvil::EpisodeBuffer>;

// A trained COMA run on mission M, resumed from its latest checkpoint in a scratch directory
// (its config, but for how it was parallelised: this is one process), started quietly.
template <class M>
std::unique_ptr<RunTrainer> trained_run(const std::string& dir) {
  RunTrainer::Config t;
  auto settings = anvil::load_yaml_file((std::filesystem::path(dir) / "config.yaml").string());
  std::erase_if(settings, [](const anvil::Setting& s) { return s.key.starts_with("parallel."); });
  anvil::apply_settings(t, settings);
  t.run->resume = latest_checkpoint(dir).string();
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_coma_run_" + std::to_string(::getpid()))).string();
  t.run->progress = anvil::ProgressMode::off;
  t.run->tensorboard = false;
  t.run->device = "cpu";
  // The trainer's start-up lines would break the JSON lines: stdout goes to /dev/null
  // while it starts.
  std::fflush(stdout);
  const int saved = ::dup(1), null = ::open("/dev/null", O_WRONLY);
  ::dup2(null, 1);
  auto trainer = std::make_unique<RunTrainer>(anvil::envs::Joint<M>{}, t, "bench_coma");
  trainer->begin();
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(null);
  return trainer;
}

// A trained COMA run's policy (deterministic), read from its directory.
template <class M>
void trained_policy(const std::string& dir, int episodes, std::uint64_t seed) {
  auto held = trained_run<M>(dir);
  auto& trainer = *held;
  auto& coma = trainer.algorithm();
  const auto& t = coma.config();
  const auto row = trainer.collector().spec().obs_dim();
  const MissionPolicy<M> act = [&](auto& envs, auto& joint) {
    at::Tensor rows = at::empty({static_cast<std::int64_t>(envs.size()), row});
    auto* p = rows.data_ptr<float>();
    for (std::size_t e = 0; e < envs.size(); ++e) {
      const auto obs = envs[e].observation();
      std::copy(obs.begin(), obs.end(), p + static_cast<std::int64_t>(e) * row);
    }
    const at::Tensor a = coma.act(rows, anvil::ActMode::deterministic).to(at::kCPU);
    for (std::size_t e = 0; e < envs.size(); ++e) joint[e] = a[static_cast<std::int64_t>(e)].item<std::int64_t>();
  };
  const auto r = missions<M>(act, episodes, seed);
  emit_missions<M>(r, {{"policy", "coma:" + std::string(anvil::enum_names(*t.critic)[static_cast<std::size_t>(*t.critic)])},
                       {"run", dir}, {"seed", static_cast<int>(seed)}, {"episodes", episodes},
                       {"env_steps", trainer.env_steps()}});
  std::error_code ec;
  std::filesystem::remove_all(trainer.run_dir(), ec);
}

// Why a critic kind leads or not (issue 52): a trained run's policy flies `episodes`
// missions exploring as in training (its final epsilon); on them, per agent-transition, its
// advantage (counterfactual: Q(s, u)[u_a] - sum pi Q; central-V and independent: the
// TD(lambda) target - V) and its critic's error against the Monte Carlo return (of the
// taken action's Q, or of V), by the agent's altitude (read from its observation's position
// map: (altitude + 1) / 4 at the centre).
void diagnose(const std::string& dir, int episodes, std::uint64_t seed) {
  using M = anvil::envs::PublishedMapping;
  auto held = trained_run<M>(dir);
  auto& trainer = *held;
  auto& coma = trainer.algorithm();
  const auto& t = coma.config();
  const auto& l = coma.layout();
  const auto row = l.row_size();
  const std::int64_t B = episodes, T = M::kSteps, k = l.agents, n = l.num_actions;
  std::vector<anvil::envs::Joint<M>> envs(static_cast<std::size_t>(B));
  auto obs = at::empty({B, T, row}), act = at::empty({B, T}, at::kLong), rew = at::empty({B, T});
  for (std::int64_t e = 0; e < B; ++e)
    envs[static_cast<std::size_t>(e)].reset(anvil::derive_seed(seed, anvil::Stream::eval_env, static_cast<std::uint64_t>(e)));
  for (std::int64_t s = 0; s < T; ++s) {
    auto rows = at::empty({B, row});
    for (std::int64_t e = 0; e < B; ++e) {
      const auto o = envs[static_cast<std::size_t>(e)].observation();
      std::copy(o.begin(), o.end(), rows.data_ptr<float>() + e * row);
    }
    obs.select(1, s).copy_(rows);
    const auto a = coma.act(rows, anvil::ActMode::explore);
    act.select(1, s).copy_(a);
    for (std::int64_t e = 0; e < B; ++e) rew[e][s] = envs[static_cast<std::size_t>(e)].step(a[e].item<std::int64_t>()).reward;
  }
  auto last = at::empty({B, row});
  for (std::int64_t e = 0; e < B; ++e) {
    const auto o = envs[static_cast<std::size_t>(e)].observation();
    std::copy(o.begin(), o.end(), last.data_ptr<float>() + e * row);
  }
  auto term = at::zeros({B, T});
  term.select(1, T - 1).fill_(1.0);
  const anvil::EpisodeBatch b{obs, act, rew, term, at::ones({B, T}), at::full({B}, T, at::kLong), last};
  torch::NoGradGuard no_grad;
  const auto y = coma.targets(b);  // [B, T, k]
  const auto u = coma.decode(act);
  const auto onehot = at::one_hot(u, n).to(at::kFloat);
  const auto prev = at::cat({at::zeros({B, 1, k, n}), onehot.narrow(1, 0, T - 1)}, 1);
  auto ci = coma.critic_input(obs, onehot, prev);
  if (coma.maps()) ci = coma.critic_encoder()->forward(ci);
  const auto out = coma.critic()->forward(ci).to(at::kFloat);
  const bool q = coma.q_critic();
  const auto value = q ? out.gather(-1, u.unsqueeze(-1)).squeeze(-1) : out.squeeze(-1);
  const auto adv = q ? value - anvil::COMA::counterfactual_baseline(coma.policy(obs, coma.epsilon()), out) : y - value;
  // Monte Carlo returns, the same for every agent.
  auto g = at::zeros({B, T});
  const double gamma = *t.gamma;
  auto acc = at::zeros({B});
  for (std::int64_t s = T; s-- > 0;) {
    acc = rew.select(1, s) + gamma * acc;
    g.select(1, s).copy_(acc);
  }
  const auto err = value - g.unsqueeze(-1);
  const auto alt = (coma.split_obs(obs).select(-1, 2 * 121 + 5 * 11 + 5) * 4 - 1).round().to(at::kLong);  // [B, T, k]
  const std::string kind(anvil::enum_names(*t.critic)[static_cast<std::size_t>(*t.critic)]);
  const std::vector<std::pair<std::string, bench::Value>> c{{"env", std::string(M::name)}, {"policy", "coma:" + kind}, {"run", dir},
                                                            {"seed", static_cast<int>(seed)}, {"episodes", episodes},
                                                            {"epsilon", coma.epsilon()}};
  bench::emit("coma_advantage_std", adv.std().item<double>(), "std of the advantage over agent-transitions", c);
  bench::emit("coma_advantage_abs", adv.abs().mean().item<double>(), "mean |advantage|", c);
  bench::emit("coma_critic_rmse", err.square().mean().sqrt().item<double>(), "critic against the Monte Carlo return, RMSE", c);
  for (int h = 0; h < 3; ++h) {
    const auto at_h = alt == h;
    const auto count = at_h.sum().item<double>();
    auto ch = c;
    ch.push_back({"altitude_m", 5 * (h + 1)});
    ch.push_back({"share", count / static_cast<double>(alt.numel())});
    if (count > 0) {
      bench::emit("coma_critic_rmse_by_altitude", err.masked_select(at_h).square().mean().sqrt().item<double>(),
                  "critic against the Monte Carlo return, RMSE, agents at this altitude", ch);
      bench::emit("coma_advantage_std_by_altitude", adv.masked_select(at_h).std().item<double>(),
                  "std of the advantage, agents at this altitude", ch);
    }
  }
  // The greedy policy (as evaluations fly): where its agents fly, and how often a move
  // undoes the one before (back to the pose of two steps ago).
  std::array<double, 3> at_alt{};
  double back = 0, moves = 0;
  for (std::int64_t e = 0; e < B; ++e)
    envs[static_cast<std::size_t>(e)].reset(anvil::derive_seed(seed, anvil::Stream::eval_env, static_cast<std::uint64_t>(e)));
  std::vector<std::array<std::array<int, 3>, 4>> two_ago(static_cast<std::size_t>(B)), one_ago(static_cast<std::size_t>(B));
  for (std::int64_t s = 0; s < T; ++s) {
    auto rows = at::empty({B, row});
    for (std::int64_t e = 0; e < B; ++e) {
      const auto o = envs[static_cast<std::size_t>(e)].observation();
      std::copy(o.begin(), o.end(), rows.data_ptr<float>() + e * row);
      for (int i = 0; i < 4; ++i) one_ago[static_cast<std::size_t>(e)][static_cast<std::size_t>(i)] = envs[static_cast<std::size_t>(e)].env().pose(i);
    }
    const auto a = coma.act(rows, anvil::ActMode::deterministic);
    for (std::int64_t e = 0; e < B; ++e) {
      auto& env = envs[static_cast<std::size_t>(e)];
      env.step(a[e].item<std::int64_t>());
      for (int i = 0; i < 4; ++i) {
        const auto p = env.env().pose(i);
        at_alt[static_cast<std::size_t>(p[2])] += 1;
        if (s > 0) back += p == two_ago[static_cast<std::size_t>(e)][static_cast<std::size_t>(i)], moves += 1;
      }
      two_ago[static_cast<std::size_t>(e)] = one_ago[static_cast<std::size_t>(e)];
    }
  }
  const double total = at_alt[0] + at_alt[1] + at_alt[2];
  for (int h = 0; h < 3; ++h) {
    auto ch = c;
    ch.push_back({"altitude_m", 5 * (h + 1)});
    bench::emit("coma_greedy_altitude_share", at_alt[static_cast<std::size_t>(h)] / total, "share of the greedy policy's agent-steps at this altitude", ch);
  }
  bench::emit("coma_greedy_back_and_forth", back / moves, "share of the greedy policy's moves back to the pose of two steps before", c);
  std::error_code ec;
  std::filesystem::remove_all(trainer.run_dir(), ec);
}

// The reference and policy modes on mission M.
template <class M>
void mission_modes(const BenchConfig& b) {
  if (*b.mode == "reference") {
    for (const bool lawn : {false, true})
      for (int seed : *b.seeds) {
        const auto s = static_cast<std::uint64_t>(seed);
        emit_missions<M>(missions<M>(lawn ? lawnmower_policy<M>() : random_policy<M>(s), b.episodes, s),
                         {{"policy", lawn ? "lawnmower" : "random"}, {"seed", seed}, {"episodes", *b.episodes}});
      }
    return;
  }
  if (b.runs->empty()) throw anvil::ConfigError("bench.runs: name the run directories to evaluate (bench.mode=policy)");
  if (b.seeds->empty()) throw anvil::ConfigError("bench.seeds: empty; the missions' seed is its first");
  for (const auto& dir : *b.runs) trained_policy<M>(dir, b.episodes, static_cast<std::uint64_t>(b.seeds->front()));
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  if (*b.mode == "diagnose") {  // the published mission's trained runs (bench.runs)
    if (b.runs->empty()) throw anvil::ConfigError("bench.runs: name the run directories to diagnose (bench.mode=diagnose)");
    for (const auto& dir : *b.runs) diagnose(dir, b.episodes, static_cast<std::uint64_t>(b.seeds->empty() ? 1 : b.seeds->front()));
    return 0;
  }
  if (*b.mode == "reference" || *b.mode == "policy") {  // on bench.env: Mapping or MappingWestheider
    if (*b.env == "Mapping") mission_modes<anvil::envs::MappingTask>(b);
    else if (*b.env == "MappingWestheider") mission_modes<anvil::envs::PublishedMapping>(b);
    else throw anvil::ConfigError("bench.env: '" + *b.env + "' is not a mapping mission (Mapping, MappingWestheider)");
    return 0;
  }
  if (*b.mode != "speed")
    throw anvil::ConfigError("bench.mode: '" + *b.mode + "' is not one of speed, reference, policy, diagnose");
  for (const auto& g : *b.cuda_graph)
    if (g != "on" && g != "off") throw anvil::ConfigError("bench.cuda_graph: '" + g + "' is neither on nor off");
  for (int round = 0; round < b.rounds; ++round)
    for (int n : *b.num_envs)
      for (const auto& p : *b.precision)
        for (const auto& g : *b.cuda_graph) {
          if (p == "fp32") speed<anvil::FP32>(b, n, p, g, round);
          else if (p == "bf16") speed<anvil::BF16>(b, n, p, g, round);
          else throw anvil::ConfigError("bench.precision: '" + p + "' is neither fp32 nor bf16");
        }
}
