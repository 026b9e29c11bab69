// SAC gradient updates per second at the sizes the speed targets name (256x256 and 64x64
// networks, batch 256), for 1 and 2 intra-op threads, and the whole-run env steps/s of the
// main job. One JSON line per figure. Compare with benchmarks/reference/sac_update.py.
#include "bench_common.hpp"

#include <anvil/anvil.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{3.0};
  anvil::Param<std::vector<int>, "hidden", "network widths to measure", anvil::at_least(1)> hidden{256, 64};
  anvil::Param<int, "batch", "batch size", anvil::at_least(1)> batch{256};
  anvil::Param<std::vector<int>, "threads", "intra-op thread counts to measure", anvil::at_least(1)> threads{1, 2};
  anvil::Param<std::vector<int>, "update_threads", "update_threads settings to measure", anvil::at_least(1)> update_threads{1, 2};
  anvil::Param<std::int64_t, "run_steps", "env steps of the main-job run (0: skip)", anvil::at_least(0)> run_steps{20000};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::parse_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const auto spec = anvil::envs::spec_of(anvil::envs::Pendulum{});

  for (int threads : *b.threads)
  for (int tasks : *b.update_threads) {
    torch::set_num_threads(threads);
    for (int h : *b.hidden) {
      torch::manual_seed(0);
      anvil::SAC::Config sc;
      sc.batch_size = *b.batch;
      sc.actor->hidden = {h, h};
      sc.critic->hidden = {h, h};
      anvil::SAC sac(spec, sc, anvil::RunContext{});
      anvil::UniformBuffer::Config bc;
      bc.capacity = 100'000;
      anvil::UniformBuffer buffer(spec, bc, anvil::RunContext{});
      const std::int64_t n = 100'000;
      buffer.add(anvil::StepBatch{torch::randn({n, 3}), torch::rand({n, 1}) * 2 - 1, torch::randn({n}),
                                  torch::randn({n, 3}), (torch::rand({n}) < 0.01).to(torch::kFloat),
                                  torch::zeros({n})});
      anvil::StepContext::Options so;
      so.threads = tasks;
      anvil::StepContext ctx(so);
      const double ups = bench::median_rate([&] { sac.update(buffer.sample(*b.batch), ctx); }, b.seconds);
      bench::emit("sac_update", ups, "updates/s",
                  {{"hidden", std::to_string(h) + "x" + std::to_string(h)},
                   {"batch", *b.batch},
                   {"threads", threads},
                   {"update_threads", tasks},
                   {"impl", "anvil"}});
    }
  }

  if (b.run_steps > 0) {
    using T = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
    T::Config c;  // the main job's settings (examples/train_sac_pendulum.cpp)
    c.train->steps = b.run_steps;
    c.train->eval_interval = 2000;
    c.algorithm->actor_lr = 1e-3;
    c.algorithm->critic_lr = 1e-3;
    c.algorithm->alpha_lr = 1e-3;
    c.run->device = "cpu";
    c.run->progress = anvil::ProgressMode::off;
    c.run->run_dir = "runs/bench_sac_update";
    T t(anvil::envs::Pendulum{}, c);
    const auto r = t.fit();
    bench::emit("main_job_env_steps_per_s", static_cast<double>(r.env_steps) / r.wall_seconds,
                "env steps/s",
                {{"env", "Pendulum-v1"}, {"steps", static_cast<long long>(r.env_steps)},
                 {"final_eval_return", r.final_eval_return}, {"threads", 1}});
  }
}
