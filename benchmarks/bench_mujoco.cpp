// The MuJoCo manipulation suite's throughput: env steps per second of each MT10 task alone
// (1 env) and of the whole suite spread over 16 envs (MT10's setting), stepped in the
// calling thread and on a pool of threads. Random actions in [-1, 1]; one JSON line per figure.
#include <anvil/envs/mujoco/sim.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <anvil/core/config.hpp>
#include <anvil/envs/mujoco/manipulation.hpp>
#include <anvil/envs/vec_env.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{1.0};
  anvil::Param<std::vector<int>, "num_envs", "env counts of the MT10 measurement", anvil::at_least(1)> num_envs{1, 16};
  anvil::Param<int, "threads", "threads of the pooled mode", anvil::at_least(1)> threads{2};
  anvil::Param<bool, "per_task", "also each task alone with 1 env"> per_task{true};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {
double steps_per_s(const anvil::envs::mujoco::Manipulation& proto, int n, int threads, double seconds) {
  anvil::envs::VecEnvConfig vc;
  vc.num_envs = n;
  vc.threads = threads;
  anvil::envs::VecEnv<anvil::envs::mujoco::Manipulation> venv(proto, vc, 0);
  venv.reset();
  auto actions = torch::rand({n, 4}) * 2 - 1;
  return bench::median_rate([&] { venv.step(actions); }, seconds) * n;
}
}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  using anvil::envs::mujoco::Manipulation;
  if (b.per_task)
    for (auto name : anvil::envs::mujoco::kTaskNames) {
      Manipulation e;
      e.select_tasks("", {std::string(name)});
      bench::emit("mujoco_env_steps", steps_per_s(e, 1, 1, b.seconds), "env steps/s",
                  {{"task", std::string(name)}, {"num_envs", 1}, {"threads", 1}});
    }
  Manipulation mt10;
  mt10.select_tasks("mt10", {});
  for (int n : *b.num_envs)
    for (int threads : {1, *b.threads}) {
      if (threads > n) continue;
      bench::emit("mujoco_env_steps", steps_per_s(mt10, n, threads, b.seconds), "env steps/s",
                  {{"task", "mt10"}, {"num_envs", n}, {"threads", threads}});
    }
}
