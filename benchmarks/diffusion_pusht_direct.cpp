// Diffusion Policy (or MSE BC) on Push-T without a Trainer, files or HDF5: the scripted
// expert records demonstrations in memory, `DemoDataset` hands out windows, the algorithm
// takes `bench.updates` optimizer steps (EMA as a run keeps it), and the EMA weights are
// scored on the test seeds by the published protocol. For machines that have PyTorch with
// CUDA but not anvil's Debian packages (scripts/gpu-check.sh builds it); the example program
// examples/diffusion_pusht is the way to train with checkpoints, evaluations and DDP.
#include <anvil/buffers/demo_dataset.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <anvil/algorithms/diffusion_policy.hpp>
#include <anvil/core/context.hpp>
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/chipmunk/push_t_expert.hpp>
#include <anvil/envs/chipmunk/push_t_score.hpp>
#include <anvil/envs/multi_step.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp32.hpp>

struct BenchConfig {
  anvil::Param<int, "demos", "expert demonstrations (seeds from 0; failures skipped)", anvil::at_least(1)> demos{200};
  anvil::Param<std::int64_t, "updates", "optimizer steps", anvil::at_least(1)> updates{10000};
  anvil::Param<int, "test_episodes", "test seeds 100000 ..", anvil::at_least(1)> test_episodes{50};
  anvil::Param<std::string, "precision", "fp32 or bf16"> precision{"fp32"};
  anvil::Param<double, "ema_decay", "the EMA's ceiling", anvil::in_range(0, 1)> ema_decay{0.9999};
  anvil::Param<std::string, "device", "auto (CUDA when present), cpu, cuda"> device{"auto"};
  anvil::Param<std::uint64_t, "seed", "torch's seed and the loader's"> seed{1};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
  anvil::Section<"diffusion", anvil::DiffusionPolicy::Config> diffusion;
};

int main(int argc, char** argv) {
  using anvil::envs::chipmunk::PushT;
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const auto& dc = *cfg.diffusion;
  anvil::RunContext run;
  run.device = anvil::resolve_device(b.device, 0);
  run.seed = b.seed;
  torch::manual_seed(b.seed);
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  // Demonstrations, as the example's record mode makes them.
  anvil::Demonstrations d;
  d.env_name = "PushT";
  d.obs_dim = PushT::kObsDim;
  d.act_dim = 2;
  const anvil::envs::chipmunk::PushTExpert expert;
  for (std::uint64_t seed = 0; d.episodes() < b.demos; ++seed) {
    PushT env;
    std::vector<float> o, a;
    if (!expert.run(env, seed, [&](std::span<const float> obs, std::span<const float> act) {
          o.insert(o.end(), obs.begin(), obs.end());
          a.insert(a.end(), act.begin(), act.end());
        }))
      continue;
    const auto t = a.size() / 2;
    std::vector<float> r(t, 0.0f);
    std::vector<std::uint8_t> dn(t, 0);
    dn.back() = 1;
    d.add_episode(o, a, r, dn);
  }
  const auto demo_seconds = seconds();

  const anvil::envs::MultiStep<PushT> proto(PushT(PushT::Reward::best_gain), dc.obs_horizon, dc.action_horizon);
  const auto spec = anvil::envs::spec_of(proto);
  anvil::DemoDataset data(spec, {}, run);
  data.plan(anvil::StoragePlan{1, 0, 0.99, *dc.obs_horizon, *dc.horizon});
  data.set(d);
  anvil::DiffusionPolicy dp(spec, dc, run);
  const auto r = data.ranges();
  dp.fit_normalizer(r[0], r[1], r[2], r[3]);
  dp.plan_updates(b.updates);
  anvil::StepContext ctx(*b.precision == "bf16" ? bench::step_options<anvil::BF16>(run.device) : bench::step_options<anvil::FP32>(run.device));
  double loss = 0;
  for (std::int64_t i = 0; i < b.updates; ++i) {
    auto batch = data.sample(dp.batch_size());
    batch.obs = batch.obs.to(run.device);
    batch.action = batch.action.to(run.device);
    loss = dp.update(batch, ctx).metrics[0].second;
    dp.ema_update(b.ema_decay);
  }
  const auto train_seconds = seconds() - demo_seconds;

  // The test seeds, all episodes at once, with the EMA weights.
  const int n = b.test_episodes;
  const auto score = anvil::envs::chipmunk::score_on_test_seeds(proto, n, [&](std::span<const float> obs, int rows) {
    const auto o = at::from_blob(const_cast<float*>(obs.data()), {rows, static_cast<std::int64_t>(obs.size()) / rows}, at::kFloat);
    const at::Tensor unit = dp.with_ema_weights([&] { return dp.act(o, anvil::ActMode::deterministic); }).to(at::kCPU).contiguous();
    return std::vector<float>(unit.data_ptr<float>(), unit.data_ptr<float>() + unit.numel());
  });
  std::string widths;
  for (int w : *dc.widths) widths += (widths.empty() ? "" : "x") + std::to_string(w);
  const std::vector<std::pair<std::string, bench::Value>> conf{
      {"objective", std::string(anvil::enum_names(*dc.objective)[static_cast<std::size_t>(*dc.objective)])},
      {"widths", widths}, {"demos", *b.demos}, {"demo_steps", static_cast<long long>(d.steps())}, {"updates", static_cast<long long>(*b.updates)},
      {"batch", static_cast<long long>(*dc.batch_size)}, {"precision", *b.precision}, {"test_episodes", n},
      {"train_seconds", train_seconds}, {"final_loss", loss}};
  bench::emit("pusht_score", score.score, "mean best reward over the test seeds", conf, run.device.str());
  bench::emit("pusht_success", score.success, "share of test episodes above 95% coverage", conf, run.device.str());
}
