// COMA's speed and the mapping mission's outcomes, one JSON line per figure.
//
// speed: env steps/s and minibatch steps/s (one critic and one actor step each) of
//   Trainer<COMA, EpisodeBuffer> on an env (default: the mapping mission) with 1 and 8
//   vectorised copies, FP32 and BF16 (CPU autocast), each run `bench.steps` env steps.
// reference: the random and lawnmower policies on the mapping mission, `bench.episodes`
//   missions per seed.
// policy: the trained policies of COMA runs (`bench.runs`: run directories of
//   examples/coma on the mapping mission; each is read from its config.yaml and its latest
//   checkpoint), acting deterministically, on the same missions as the references.
// A mission's figures: its return (the weighted entropy removed, a fraction of the prior's),
// the weighted and the plain entropy left at its end, and the map's error.
#include "bench_common.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fcntl.h>
#include <unistd.h>

#include <anvil/algorithms/coma.hpp>
#include <anvil/buffers/episode_buffer.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/trainer.hpp>

struct BenchConfig {
  anvil::Param<std::string, "mode", "speed, reference or policy"> mode{"speed"};
  anvil::Param<std::string, "env", "a built-in multi-agent env (speed)"> env{"Mapping"};
  anvil::Param<std::vector<int>, "num_envs", "vectorised copies (speed)", anvil::at_least(1)> num_envs{1, 8};
  anvil::Param<std::vector<std::string>, "precision", "fp32 and/or bf16 (speed)"> precision{"fp32", "bf16"};
  anvil::Param<std::int64_t, "steps", "env steps per speed run", anvil::at_least(1)> steps{20'000};
  anvil::Param<int, "rounds", "speed: rounds, each timing every setting once (interleaved)", anvil::at_least(1)> rounds{3};
  anvil::Param<int, "batch_size", "coma.batch_size of the speed runs", anvil::at_least(1)> batch_size{128};
  anvil::Param<std::string, "device", "run.device of the speed runs: cpu, cuda, cuda:N or auto"> device{"cpu"};
  anvil::Param<int, "episodes", "missions per seed (reference, policy)", anvil::at_least(1)> episodes{200};
  anvil::Param<std::vector<int>, "seeds", "seeds of the missions (reference; policy: the first)"> seeds{1, 2, 3};
  anvil::Param<std::vector<std::string>, "runs", "run directories of trained COMA policies (policy)"> runs{};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

template <class X>
void speed(const BenchConfig& b, int n, const std::string& precision, int round) {
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
  anvil::envs::with_team_env(*b.env, [&](const auto& env) {
    Trainer trainer(env, t, "bench_coma");
    const auto r = trainer.fit();
    const double wall = r.wall_seconds - trainer.times().seconds(anvil::Phase::eval);
    const std::vector<std::pair<std::string, bench::Value>> cfg{
        {"env", *b.env}, {"num_envs", n}, {"precision", precision}, {"batch_size", *b.batch_size}, {"steps", r.env_steps},
        {"round", round}};
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

// A policy on the mapping mission: the agents' actions for each of a batch of missions.
using MissionPolicy = std::function<void(std::vector<anvil::envs::Joint<anvil::envs::MappingTask>>&,
                                         std::vector<std::int64_t>& joint_actions)>;

// The mean over `episodes` missions (seeded as evaluations are, from `seed`) of: the
// return, the weighted entropy left, the entropy left and the map error.
std::array<double, 4> missions(const MissionPolicy& policy, int episodes, std::uint64_t seed) {
  using anvil::envs::MappingTask;
  std::vector<anvil::envs::Joint<MappingTask>> envs(static_cast<std::size_t>(episodes));
  for (int e = 0; e < episodes; ++e)
    envs[static_cast<std::size_t>(e)].reset(anvil::derive_seed(seed, anvil::Stream::eval_env, static_cast<std::uint64_t>(e)));
  std::vector<double> ret(envs.size(), 0.0);
  std::vector<std::int64_t> joint(envs.size());
  for (std::int64_t t = 0; t < MappingTask::kBudget; ++t) {
    policy(envs, joint);
    for (std::size_t e = 0; e < envs.size(); ++e) ret[e] += envs[e].step(joint[e]).reward;
  }
  std::array<double, 4> sum{};
  for (std::size_t e = 0; e < envs.size(); ++e) {
    sum[0] += ret[e];
    sum[1] += envs[e].env().weighted_entropy_fraction();
    sum[2] += envs[e].env().entropy_fraction();
    sum[3] += envs[e].env().map_error();
  }
  for (auto& x : sum) x /= episodes;
  return sum;
}

void emit_missions(const std::array<double, 4>& r, const std::vector<std::pair<std::string, bench::Value>>& c) {
  bench::emit("mapping_return", r[0], "weighted entropy removed, fraction of the prior's", c);
  bench::emit("mapping_weighted_entropy_left", r[1], "fraction of the prior's", c);
  bench::emit("mapping_entropy_left", r[2], "fraction of the prior's", c);
  bench::emit("mapping_map_error", r[3], "mean absolute error", c);
}

// Random flights (uniform over each agent's available actions) and the lawnmower sweep.
MissionPolicy random_policy(std::uint64_t seed) {
  return [rng = anvil::Rng(seed * 7919)](auto& envs, auto& joint) mutable {
    using anvil::envs::MappingTask;
    for (std::size_t e = 0; e < envs.size(); ++e) {
      std::array<std::int64_t, MappingTask::kAgents> a{};
      for (int i = 0; i < MappingTask::kAgents; ++i)
        do a[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(rng.below(MappingTask::kActions));
        while (!envs[e].env().available(i, a[static_cast<std::size_t>(i)]));
      joint[e] = anvil::envs::encode_joint_action(a, MappingTask::kActions);
    }
  };
}
MissionPolicy lawnmower_policy() {
  return [](auto& envs, auto& joint) {
    using anvil::envs::MappingTask;
    for (std::size_t e = 0; e < envs.size(); ++e) {
      if (envs[e].env().steps() > 0) envs[e].env().lawnmower_turns();  // after the previous step
      joint[e] = anvil::envs::encode_joint_action(envs[e].env().lawnmower(), MappingTask::kActions);
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

// A trained COMA run's policy (deterministic), read from its directory.
void trained_policy(const std::string& dir, int episodes, std::uint64_t seed) {
  using Trainer = anvil::Trainer<anvil::COMA, anvil::EpisodeBuffer>;
  Trainer::Config t;
  // The run's config, but for how it was parallelised: this evaluation is one process.
  auto settings = anvil::load_yaml_file((std::filesystem::path(dir) / "config.yaml").string());
  std::erase_if(settings, [](const anvil::Setting& s) { return s.key.starts_with("parallel."); });
  anvil::apply_settings(t, settings);
  t.run->resume = latest_checkpoint(dir).string();
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_coma_policy_" + std::to_string(::getpid()))).string();
  t.run->progress = anvil::ProgressMode::off;
  t.run->tensorboard = false;
  t.run->device = "cpu";
  // The trainer's start-up lines would break the JSON lines: stdout goes to /dev/null
  // while it starts.
  std::fflush(stdout);
  const int saved = ::dup(1), null = ::open("/dev/null", O_WRONLY);
  ::dup2(null, 1);
  Trainer trainer(anvil::envs::Joint<anvil::envs::MappingTask>{}, t, "bench_coma");
  trainer.begin();
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(null);
  auto& coma = trainer.algorithm();
  const auto row = trainer.collector().spec().obs_dim();
  const MissionPolicy act = [&](auto& envs, auto& joint) {
    auto rows = at::empty({static_cast<std::int64_t>(envs.size()), row});
    auto* p = rows.data_ptr<float>();
    for (std::size_t e = 0; e < envs.size(); ++e) {
      const auto obs = envs[e].observation();
      std::copy(obs.begin(), obs.end(), p + static_cast<std::int64_t>(e) * row);
    }
    const auto a = coma.act(rows, anvil::ActMode::deterministic).to(at::kCPU);
    for (std::size_t e = 0; e < envs.size(); ++e) joint[e] = a[static_cast<std::int64_t>(e)].item<std::int64_t>();
  };
  const auto r = missions(act, episodes, seed);
  emit_missions(r, {{"policy", "coma:" + std::string(anvil::enum_names(*t.algorithm->critic)[static_cast<std::size_t>(*t.algorithm->critic)])},
                    {"run", dir}, {"seed", static_cast<int>(seed)}, {"episodes", episodes},
                    {"env_steps", trainer.env_steps()}});
  std::error_code ec;
  std::filesystem::remove_all(trainer.run_dir(), ec);
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  if (*b.mode == "reference") {
    for (const bool lawn : {false, true})
      for (int seed : *b.seeds) {
        const auto s = static_cast<std::uint64_t>(seed);
        emit_missions(missions(lawn ? lawnmower_policy() : random_policy(s), b.episodes, s),
                      {{"policy", lawn ? "lawnmower" : "random"}, {"seed", seed}, {"episodes", *b.episodes}});
      }
    return 0;
  }
  if (*b.mode == "policy") {
    if (b.runs->empty()) throw anvil::ConfigError("bench.runs: name the run directories to evaluate (bench.mode=policy)");
    if (b.seeds->empty()) throw anvil::ConfigError("bench.seeds: empty; the missions' seed is its first");
    for (const auto& dir : *b.runs) trained_policy(dir, b.episodes, static_cast<std::uint64_t>(b.seeds->front()));
    return 0;
  }
  if (*b.mode != "speed")
    throw anvil::ConfigError("bench.mode: '" + *b.mode + "' is not one of speed, reference, policy");
  for (int round = 0; round < b.rounds; ++round)
    for (int n : *b.num_envs)
      for (const auto& p : *b.precision) {
        if (p == "fp32") speed<anvil::FP32>(b, n, p, round);
        else if (p == "bf16") speed<anvil::BF16>(b, n, p, round);
        else throw anvil::ConfigError("bench.precision: '" + p + "' is neither fp32 nor bf16");
      }
}
