// A consumer of the anvil package: a typed config from the command line and a YAML file,
// and a built-in env stepped with it.
#include <anvil/core/config.hpp>
#include <anvil/envs/pendulum.hpp>

#include <cstdio>

struct RunConfig {
  anvil::Param<std::uint64_t, "seed", "seed"> seed{0};
  anvil::Param<int, "steps", "steps to take", anvil::at_least(1)> steps{1};
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
}
