// A consumer of the anvil package: a typed config from the command line and a YAML file,
// and a built-in env stepped with it; with run.python=python:MODULE:ATTR, a Python env too,
// made through the door anvil's programs use (in this process, or in run.workers worker
// processes) from the Python env libraries of the anvil it was built against.
#include <anvil/core/config.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/python_env.hpp>

#include <cstdio>
#include <string>
#include <vector>

struct RunConfig {
  anvil::Param<std::uint64_t, "seed", "seed"> seed{0};
  anvil::Param<int, "steps", "steps to take", anvil::at_least(1)> steps{1};
  anvil::Param<std::string, "python", "a Python env to step as well (python:MODULE:ATTR); empty: none"> python{""};
  anvil::Param<int, "workers", "worker processes for the Python env (0: in this process)", anvil::at_least(0)> workers{0};
};
struct Config {
  anvil::Section<"run", RunConfig> run;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::parse_config<Config>(argc, argv);
  anvil::envs::Pendulum env;
  auto obs = env.reset(cfg.run->seed);
  for (int i = 0; i < cfg.run->steps; ++i) obs = env.step(std::array<float, 1>{0.5f}).observation;
  std::printf("seed=%llu steps=%d obs_dim=%zu\n", static_cast<unsigned long long>(*cfg.run->seed),
              *cfg.run->steps, obs.size());
  if (cfg.run->python->empty()) return 0;
  const auto py = anvil::envs::python_env(*cfg.run->python, {}, *cfg.run->workers);
  anvil::envs::VecEnvConfig vc;
  vc.num_envs = 1;
  vc.workers = *cfg.run->workers;
  const auto batch = py.batch_maker()(vc, *cfg.run->seed, 0, 0);
  const auto n = static_cast<std::size_t>(batch->spec().obs_dim());
  std::vector<float> o(n), next(n), reward(1), terminated(1), truncated(1), action(static_cast<std::size_t>(batch->spec().action_dim()));
  std::vector<anvil::envs::EpisodeEnd> ended(1);
  batch->reset(o.data(), 0);
  for (int i = 0; i < cfg.run->steps; ++i)
    batch->step(0, 1, action.data(), {o.data(), next.data(), reward.data(), terminated.data(), truncated.data(), nullptr,
                                      ended.data()}, i);
  std::printf("python env stepped %d times: %s\n", *cfg.run->steps, py.note().c_str());
}
