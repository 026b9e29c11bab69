// Async collection in the off-policy loop: an env whose step costs about as much as an
// update (Pendulum with CPU work added to each step), trained with SAC in env.mode=sync and
// env.mode=async, interleaved. Async steps the envs in the background while the updates
// run (the policy that acts is one round of updates behind), so an env-bound run should
// take less wall time; the learning result of both is printed beside it.
//   bench_async                          (calibrates the env's cost to one update's time)
//   bench_async bench.cost_us=2000 bench.steps=20000 bench.rounds=2
#include "bench_common.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>

#include <anvil/compiled.hpp>  // the prebuilt Trainer<SAC, UniformBuffer>: this file compiles in seconds

namespace {

/// Pendulum-v1 whose every step also burns `cost_us` microseconds of CPU time, standing in
/// for a simulator whose step costs about as much as an update.
struct BusyPendulum : anvil::envs::Pendulum {
  static constexpr std::string_view name = "BusyPendulum";
  double cost_us = 0;
  anvil::envs::StepResult step(std::span<const float> action) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(cost_us);
    volatile double sink = 0;
    while (std::chrono::steady_clock::now() < end)
      for (int i = 0; i < 32; ++i) sink = sink + std::sin(sink + i);
    return Pendulum::step(action);
  }
};

struct BenchConfig {
  anvil::Param<std::int64_t, "steps", "env steps of each run", anvil::at_least(1)> steps{15000};
  anvil::Param<std::int64_t, "learning_starts", "env steps of random actions first", anvil::at_least(0)>
      learning_starts{1000};
  anvil::Param<double, "cost_us", "CPU time added to each env step, in microseconds (0: one update's time)",
               anvil::at_least(0)>
      cost_us{0};
  anvil::Param<int, "hidden", "width of both hidden layers of the actor and the critics", anvil::at_least(1)> hidden{64};
  anvil::Param<int, "rounds", "sync/async pairs, interleaved", anvil::at_least(1)> rounds{1};
  anvil::Param<int, "update_threads", "threads of each update (1: the other core steps the envs)", anvil::in_range(1, 8)>
      update_threads{1};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;

struct Outcome {
  double wall = 0, final_eval = NAN, best_eval = NAN, update_s = 0;
};

Outcome run(const BenchConfig& b, anvil::envs::VecMode mode, double cost_us, std::int64_t steps) {
  Trainer::Config t;
  t.run->device = "cpu";
  t.run->progress = anvil::ProgressMode::off;
  t.run->checkpoint_interval = 0;
  t.run->update_threads = b.update_threads;
  t.run->seed = 1;
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_async_" + std::to_string(::getpid()))).string();
  t.env->mode = mode;
  t.train->steps = steps;
  t.train->learning_starts = std::min(*b.learning_starts, steps / 2);
  t.train->eval_interval = 0;
  t.train->eval_episodes = 10;
  t.algorithm->actor->hidden = {*b.hidden, *b.hidden};
  t.algorithm->critic->hidden = {*b.hidden, *b.hidden};
  t.algorithm->actor_lr = 1e-3;
  t.algorithm->critic_lr = 1e-3;
  t.algorithm->alpha_lr = 1e-3;
  BusyPendulum env;
  env.cost_us = cost_us;
  Trainer trainer(env, t, "bench_async");
  const auto r = trainer.fit();
  const auto& times = trainer.times();
  Outcome o;
  o.wall = r.wall_seconds - times.seconds(anvil::Phase::eval);  // training, not the final evaluation
  o.final_eval = r.final_eval_return;
  o.best_eval = r.best_eval_return;
  o.update_s = (times.seconds(anvil::Phase::update) + times.seconds(anvil::Phase::optimizer)) /
               std::max<std::int64_t>(1, r.updates);
  std::error_code ec;
  std::filesystem::remove_all(trainer.run_dir(), ec);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  double cost = b.cost_us;
  if (cost <= 0) {  // one update's time, measured on this machine with these networks
    const auto probe = run(b, anvil::envs::VecMode::sync, 0, std::min<std::int64_t>(b.steps, 2 * *b.learning_starts + 1000));
    cost = probe.update_s * 1e6;
  }
  std::vector<double> sync_wall, async_wall;
  std::vector<std::pair<std::string, bench::Value>> c{{"env", "BusyPendulum"}, {"cost_us", std::round(cost)},
                                                      {"steps", static_cast<long long>(*b.steps)},
                                                      {"hidden", *b.hidden}, {"update_threads", *b.update_threads}};
  for (int round = 0; round < b.rounds; ++round) {
    for (auto mode : {anvil::envs::VecMode::sync, anvil::envs::VecMode::async}) {
      const auto o = run(b, mode, cost, b.steps);
      const std::string m = mode == anvil::envs::VecMode::sync ? "sync" : "async";
      (mode == anvil::envs::VecMode::sync ? sync_wall : async_wall).push_back(o.wall);
      auto cm = c;
      cm.emplace_back("mode", m);
      cm.emplace_back("round", round);
      bench::emit("async_collect_training_wall_s", o.wall, "s", cm, "cpu");
      bench::emit("async_collect_final_eval_return", o.final_eval, "return", cm, "cpu");
      bench::emit("async_collect_best_eval_return", o.best_eval, "return", cm, "cpu");
    }
  }
  bench::emit("async_collect_speedup", bench::median(sync_wall) / bench::median(async_wall), "x (sync wall / async wall)", c,
              "cpu");
}
