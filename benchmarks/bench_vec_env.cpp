// VecEnv throughput: env steps per second for 1, 4, 16 and 64 Pendulum envs, stepped in
// the calling thread, on a pool of threads, and asynchronously. One JSON line per figure.
#include "bench_common.hpp"

#include <anvil/core/config.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/vec_env.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{1.0};
  anvil::Param<std::vector<int>, "num_envs", "env counts to measure", anvil::at_least(1)> num_envs{1, 4, 16, 64};
  anvil::Param<int, "threads", "threads of the pooled and async modes", anvil::at_least(1)> threads{2};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  struct Mode {
    const char* name;
    int threads;
    anvil::envs::VecMode mode;
  };
  const Mode modes[] = {{"sync", 1, anvil::envs::VecMode::sync},
                        {"sync_pool", *b.threads, anvil::envs::VecMode::sync},
                        {"async", *b.threads, anvil::envs::VecMode::async}};
  for (int n : *b.num_envs) {
    for (const auto& m : modes) {
      anvil::envs::VecEnvConfig vc;
      vc.num_envs = n;
      vc.threads = m.threads;
      vc.mode = m.mode;
      anvil::envs::VecEnv<anvil::envs::Pendulum> venv(anvil::envs::Pendulum{}, vc, 0);
      venv.reset();
      auto actions = torch::rand({n, 1}) * 4 - 2;  // fixed actions: time the envs, not the RNG
      const double calls = bench::median_rate([&] { venv.step(actions); }, b.seconds);
      bench::emit("vec_env_steps", calls * n, "env steps/s",
                  {{"env", "Pendulum-v1"}, {"num_envs", n}, {"mode", m.name}, {"threads", m.threads}});
    }
  }
}
