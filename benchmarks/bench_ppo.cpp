// PPO's throughput on CartPole-v1: env steps per second of whole training runs (collect a
// rollout, then epochs of minibatch updates) with 1, 8 and 64 envs, the envs stepped in
// the calling thread (sync) or on a background thread (async); and the rate of the
// collection alone (act + env step + store), which is what more envs speed up. The rollout
// holds the same number of rows whatever the env count, so every run does the same updates.
// Beside each sync run, the same work in eager PyTorch with numpy envs
// (benchmarks/reference/ppo_cartpole.py), and the ratio.
//   bench_ppo                              the table of RESULTS.md
//   bench_ppo bench.num_envs=[8] bench.modes=[sync] bench.device=cuda
//   bench_ppo bench.device=cuda bench.num_envs=[8,64] bench.modes=[sync] bench.cuda_graph=[on,off]
//                                          PPO's minibatch update graphed against op by op
#include "bench_common.hpp"

#include <filesystem>

#include <anvil/compiled.hpp>  // the prebuilt Trainer<PPO, RolloutBuffer>: this file compiles in seconds

struct BenchConfig {
  anvil::Param<std::vector<int>, "num_envs", "env counts to measure", anvil::at_least(1)> num_envs{1, 8, 64};
  anvil::Param<std::vector<std::string>, "modes", "vec env modes: sync, async"> modes{"sync", "async"};
  anvil::Param<std::int64_t, "steps", "env steps of each timed run", anvil::at_least(1)> steps{65'536};
  anvil::Param<std::int64_t, "rollout", "rows per rollout (rollout.steps = rollout / num_envs)", anvil::at_least(1)>
      rollout{1024};
  anvil::Param<int, "epochs", "ppo.epochs", anvil::at_least(1)> epochs{4};
  anvil::Param<std::int64_t, "minibatch", "ppo.minibatch_size", anvil::at_least(1)> minibatch{256};
  anvil::Param<std::string, "device", "cpu, cuda, cuda:N or auto"> device{"cpu"};
  anvil::Param<std::vector<std::string>, "cuda_graph",
               "ppo.cuda_graph values to run: on (each minibatch size's update replayed from a CUDA graph "
               "on CUDA), off (op by op)">
      cuda_graph{"on"};
  anvil::Param<std::string, "python", "interpreter of the Python reference (empty: skip it)"> python{"/usr/bin/python3"};
  anvil::Param<std::string, "reference", "the Python reference script"> reference{ANVIL_BENCH_PPO_REFERENCE};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  using Trainer = anvil::compiled::Trainer<anvil::PPO, anvil::RolloutBuffer>;
  for (const auto& graph : *b.cuda_graph)
    if (graph != "on" && graph != "off") {
      std::fprintf(stderr, "bench_ppo: bench.cuda_graph: '%s' is neither on nor off\n", graph.c_str());
      return 2;
    }
  for (int n : *b.num_envs) {
    for (const auto& mode : *b.modes) {
      for (const auto& graph : *b.cuda_graph) {
        if (mode != "sync" && mode != "async") {
          std::fprintf(stderr, "bench_ppo: bench.modes: '%s' is neither sync nor async\n", mode.c_str());
          return 2;
        }
        Trainer::Config t;
        t.run->device = *b.device;
        t.run->progress = anvil::ProgressMode::off;
        t.run->checkpoint_interval = 0;
        t.run->tensorboard = false;
        t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_ppo_" + std::to_string(::getpid()))).string();
        t.train->steps = b.steps;
        t.train->eval_interval = 0;
        t.train->eval_episodes = 1;
        t.env->num_envs = n;
        t.env->mode = mode == "sync" ? anvil::envs::VecMode::sync : anvil::envs::VecMode::async;
        t.buffer->steps = std::max<std::int64_t>(1, *b.rollout / n);
        t.algorithm->epochs = b.epochs;
        t.algorithm->minibatch_size = std::min<std::int64_t>(b.minibatch, *t.buffer->steps * n);
        t.algorithm->cuda_graph = graph == "on";
        Trainer trainer(anvil::envs::CartPole{}, t, "bench_ppo");
        const auto r = trainer.fit();
        const auto& times = trainer.times();
        const double collect = times.seconds(anvil::Phase::act) + times.seconds(anvil::Phase::env) +
                               times.seconds(anvil::Phase::buffer_add);
        const std::vector<std::pair<std::string, bench::Value>> config{
            {"env", "CartPole-v1"},          {"num_envs", n},
            {"mode", mode},                  {"rollout_rows", static_cast<long long>(*t.buffer->steps * n)},
            {"epochs", *b.epochs},           {"minibatch", static_cast<long long>(*t.algorithm->minibatch_size)},
            {"steps", static_cast<long long>(r.env_steps)}, {"cuda_graph", graph}};
        const std::string dev = trainer.device();
        bench::emit("ppo_env_steps_per_s", static_cast<double>(r.env_steps) / r.wall_seconds, "env steps/s", config, dev);
        bench::emit("ppo_collect_steps_per_s", static_cast<double>(r.env_steps) / collect, "env steps/s", config, dev);
        bench::emit("ppo_updates_per_s", static_cast<double>(r.updates) / times.seconds(anvil::Phase::update), "updates/s",
                    config, dev);
        if (mode == "sync" && graph == b.cuda_graph->front() && !b.python->empty() && dev == "cpu") {
          const double py = bench::run_reference(*b.python + " " + *b.reference + " --num-envs " + std::to_string(n) +
                                                 " --steps " + std::to_string(*b.steps) + " --rollout " +
                                                 std::to_string(*t.buffer->steps * n) + " --epochs " +
                                                 std::to_string(*b.epochs) + " --minibatch " +
                                                 std::to_string(*t.algorithm->minibatch_size));
          if (py > 0) {
            bench::emit("python_ppo_env_steps_per_s", py, "env steps/s", config, dev);
            bench::emit("ppo_speedup_vs_python", static_cast<double>(r.env_steps) / r.wall_seconds / py, "x", config, dev);
          }
        }
        std::filesystem::remove_all(*t.run->run_dir);
      }
    }
  }
}
