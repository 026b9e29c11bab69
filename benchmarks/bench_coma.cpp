// COMA's speed and the mapping mission's reference policies, one JSON line per figure.
//
// speed: env steps/s and minibatch steps/s (one critic and one actor step each) of
//   Trainer<COMA, EpisodeBuffer> on an env (default: the mapping mission) with 1 and 8
//   vectorised copies, FP32 and BF16 (CPU autocast), each run `bench.steps` env steps.
// reference: the random and lawnmower policies on the mapping mission over
//   `bench.episodes` missions per seed: the fraction of the prior map's entropy removed
//   (what an episode's return is), the entropy left and the map's error.
#include "bench_common.hpp"

#include <filesystem>
#include <unistd.h>

#include <anvil/algorithms/coma.hpp>
#include <anvil/buffers/episode_buffer.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/trainer.hpp>

struct BenchConfig {
  anvil::Param<std::string, "mode", "speed or reference"> mode{"speed"};
  anvil::Param<std::string, "env", "a built-in multi-agent env (speed)"> env{"Mapping"};
  anvil::Param<std::vector<int>, "num_envs", "vectorised copies (speed)", anvil::at_least(1)> num_envs{1, 8};
  anvil::Param<std::vector<std::string>, "precision", "fp32 and/or bf16 (speed)"> precision{"fp32", "bf16"};
  anvil::Param<std::int64_t, "steps", "env steps per speed run", anvil::at_least(1)> steps{20'000};
  anvil::Param<int, "batch_size", "coma.batch_size of the speed runs", anvil::at_least(1)> batch_size{128};
  anvil::Param<int, "episodes", "missions per seed (reference)", anvil::at_least(1)> episodes{200};
  anvil::Param<std::vector<int>, "seeds", "seeds (reference)"> seeds{1, 2, 3};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

template <class X>
void speed(const BenchConfig& b, int n, const std::string& precision) {
  using Trainer = anvil::Trainer<anvil::COMA, anvil::EpisodeBuffer, anvil::SingleDevice, X>;
  typename Trainer::Config t;
  t.run->device = "cpu";
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
        {"env", *b.env}, {"num_envs", n}, {"precision", precision}, {"batch_size", *b.batch_size}, {"steps", r.env_steps}};
    bench::emit("coma_env_steps_per_s", static_cast<double>(r.env_steps) / wall, "env steps/s", cfg);
    bench::emit("coma_minibatch_steps_per_s",
                static_cast<double>(trainer.algorithm().critic_steps()) /
                    (trainer.times().seconds(anvil::Phase::update) + trainer.times().seconds(anvil::Phase::optimizer)),
                "minibatch steps/s (critic + actor)", cfg);
    std::error_code ec;
    std::filesystem::remove_all(trainer.run_dir(), ec);
  });
}

// The mean over missions of (entropy removed as a return, entropy left, map error).
std::array<double, 3> reference(bool lawnmower, int episodes, std::uint64_t seed) {
  using anvil::envs::MappingTask;
  anvil::Rng rng(seed * 7919);
  std::array<double, 3> sum{};
  for (int e = 0; e < episodes; ++e) {
    MappingTask m;
    m.reset(anvil::derive_seed(seed, anvil::Stream::eval_env, static_cast<std::uint64_t>(e)));
    double ret = 0;
    for (std::int64_t t = 0; t < MappingTask::kBudget; ++t) {
      std::array<std::int64_t, MappingTask::kAgents> a{};
      if (lawnmower) {
        a = m.lawnmower();
      } else {
        for (int i = 0; i < MappingTask::kAgents; ++i)
          do a[i] = static_cast<std::int64_t>(rng.below(MappingTask::kActions));
          while (!m.available(i, a[i]));
      }
      ret += m.step(a).reward;
      if (lawnmower) m.lawnmower_turns();
    }
    sum[0] += ret;
    sum[1] += m.entropy_fraction();
    sum[2] += m.map_error();
  }
  for (auto& x : sum) x /= episodes;
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  if (*b.mode == "reference") {
    for (const bool lawn : {false, true})
      for (int seed : *b.seeds) {
        const auto r = reference(lawn, b.episodes, static_cast<std::uint64_t>(seed));
        const std::vector<std::pair<std::string, bench::Value>> c{
            {"policy", lawn ? "lawnmower" : "random"}, {"seed", seed}, {"episodes", *b.episodes}};
        bench::emit("mapping_entropy_removed", r[0], "fraction of the prior entropy", c);
        bench::emit("mapping_entropy_left", r[1], "fraction of the prior entropy", c);
        bench::emit("mapping_map_error", r[2], "mean absolute error", c);
      }
    return 0;
  }
  if (*b.mode != "speed") throw anvil::ConfigError("bench.mode: '" + *b.mode + "' is neither speed nor reference");
  for (int n : *b.num_envs)
    for (const auto& p : *b.precision) {
      if (p == "fp32") speed<anvil::FP32>(b, n, p);
      else if (p == "bf16") speed<anvil::BF16>(b, n, p);
      else throw anvil::ConfigError("bench.precision: '" + p + "' is neither fp32 nor bf16");
    }
}
