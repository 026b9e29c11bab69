// Diffusion Policy's costs on Push-T's shapes (observation 2 x 20, actions 16 x 2):
//
//  - training samples/s (one optimizer step on a batch of windows, DDPM loss) under FP32 and
//    BF16 autocast, at each U-Net size given, in interleaved rounds; BF16's ratio to FP32 is
//    the median of per-round ratios;
//  - inference latency per action chunk (one observation, the whole sampling chain): DDPM
//    with all its steps against DDIM with each `bench.ddim` count.
//
// Runs on `bench.device` (default: CUDA when present; there FP16 with its loss scaler is
// timed too, and FP32 op by op, diffusion.cuda_graph=false, against the update replayed from
// a CUDA graph as a run has it). One JSON line per figure. scripts/gpu-check.sh builds and runs it against the
// LibTorch inside a PyTorch installation.
#include <anvil/nn/unet1d.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <anvil/algorithms/diffusion_policy.hpp>
#include <anvil/core/context.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp16.hpp>
#include <anvil/precision/fp32.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{3.0};
  anvil::Param<int, "rounds", "interleaved rounds over the training settings", anvil::at_least(1)> rounds{3};
  anvil::Param<std::vector<std::string>, "widths", "U-Net sizes: channels per level, joined by 'x' (e.g. 32x64x128)"> widths{
      "32x64x128", "256x512x1024"};
  anvil::Param<int, "batch", "windows per training step", anvil::at_least(1)> batch{256};
  anvil::Param<std::vector<int>, "ddim", "DDIM step counts timed at inference", anvil::at_least(1)> ddim{8, 16};
  anvil::Param<int, "train_steps", "DDPM steps (the chain DDPM inference runs)", anvil::at_least(1)> train_steps{100};
  anvil::Param<std::string, "device", "auto (CUDA when present), cpu, cuda or cuda:N"> device{"auto"};
  anvil::Param<int, "threads", "torch intra-op threads (0: torch's default)", anvil::at_least(0)> threads{0};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

std::vector<int> parse_widths(const std::string& s) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start < s.size()) {
    const auto x = s.find('x', start);
    out.push_back(std::stoi(s.substr(start, x - start)));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return out;
}

anvil::EnvSpec pusht_spec() {
  anvil::EnvSpec s;
  s.name = "PushT";
  s.observation = anvil::Box{std::vector<float>(40, 0.0f), std::vector<float>(40, 512.0f)};
  s.action = anvil::Box{std::vector<float>(16, 0.0f), std::vector<float>(16, 512.0f)};
  return s;
}

anvil::DiffusionPolicy::Config policy_config(const std::vector<int>& widths, int batch, int train_steps) {
  anvil::DiffusionPolicy::Config c;
  c.widths = widths;
  c.step_embed = std::min(256, widths.front());
  c.batch_size = batch;
  c.train_steps = train_steps;
  c.inference_steps = std::min(train_steps, 16);
  return c;
}

struct Setting {
  std::string precision, widths;
  bool graph = true;  // diffusion.cuda_graph
  std::unique_ptr<anvil::DiffusionPolicy> dp;
  std::unique_ptr<anvil::StepContext> ctx;
  anvil::ReplayBatch batch;
  std::vector<double> rates;
};

template <class X>
Setting make(const anvil::RunContext& run, const std::string& widths, int batch, int train_steps, bool graph = true) {
  torch::manual_seed(0);
  auto c = policy_config(parse_widths(widths), batch, train_steps);
  c.cuda_graph = graph;
  Setting s{std::string(X::name), widths, graph, std::make_unique<anvil::DiffusionPolicy>(pusht_spec(), c, run), {}, {}, {}};
  s.dp->fit_normalizer(at::zeros({20}), at::full({20}, 512.0), at::zeros({2}), at::full({2}, 512.0));
  s.ctx = std::make_unique<anvil::StepContext>(bench::step_options<X>(run.device));
  s.batch.obs = (at::rand({batch, 40}) * 512).to(run.device);
  s.batch.action = (at::rand({batch, 32}) * 512).to(run.device);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  anvil::RunContext run;
  run.device = anvil::resolve_device(b.device, 0);
  const std::string device = run.device.str();

  // Training: FP32 and BF16 at each size, interleaved.
  std::vector<Setting> settings;
  for (const auto& w : *b.widths) {
    if (run.device.is_cuda()) settings.push_back(make<anvil::FP32>(run, w, b.batch, b.train_steps, false));
    settings.push_back(make<anvil::FP32>(run, w, b.batch, b.train_steps));
    settings.push_back(make<anvil::BF16>(run, w, b.batch, b.train_steps));
    if (run.device.is_cuda()) settings.push_back(make<anvil::FP16>(run, w, b.batch, b.train_steps));  // loss-scaled; CUDA only
  }
  for (int round = 0; round < b.rounds; ++round)
    for (auto& s : settings)
      s.rates.push_back(static_cast<double>(*b.batch) *
                        bench::median_rate([&] { s.dp->update(s.batch, *s.ctx); }, b.seconds, 1, round ? 1 : 3));
  for (const auto& s : settings) {
    const std::vector<std::pair<std::string, bench::Value>> conf{
        {"precision", s.precision}, {"widths", s.widths}, {"batch", *b.batch}, {"rounds", *b.rounds},
        {"cuda_graph", s.dp->graphed_updates() > 0 ? 1 : 0}, {"threads", at::get_num_threads()}};
    bench::emit("diffusion_train_samples_per_s", bench::median(s.rates), "samples/s", conf, device);
    // The ratio to FP32 (op by op on CUDA) at the same size.
    for (const auto& base : settings)
      if (&base != &s && base.precision == "fp32" && (!run.device.is_cuda() || !base.graph) && base.widths == s.widths)
        bench::emit("diffusion_train_vs_fp32", bench::median_ratio(s.rates, base.rates), "x", conf, device);
  }

  // Inference: one observation, the whole chain, FP32 weights (the EMA weights a run evaluates).
  for (const auto& w : *b.widths) {
    auto c = policy_config(parse_widths(w), b.batch, b.train_steps);
    std::vector<std::pair<std::string, int>> samplers{{"ddpm", *b.train_steps}};
    for (int k : *b.ddim)
      if (k <= b.train_steps) samplers.emplace_back("ddim", k);
    for (const auto& [name, k] : samplers) {
      c.sampler = name == "ddpm" ? anvil::DiffusionSampler::ddpm : anvil::DiffusionSampler::ddim;
      c.inference_steps = name == "ddpm" ? std::min(16, *b.train_steps) : k;
      torch::manual_seed(0);
      anvil::DiffusionPolicy dp(pusht_spec(), c, run);
      dp.fit_normalizer(at::zeros({20}), at::full({20}, 512.0), at::zeros({2}), at::full({2}, 512.0));
      const auto obs = (at::rand({1, 40}) * 512).to(run.device);
      const double rate = bench::median_rate([&] { (void)dp.act(obs, anvil::ActMode::deterministic).to(at::kCPU); }, b.seconds, 3, 2);
      bench::emit("diffusion_chunk_latency_ms", 1000.0 / rate, "ms per action chunk",
                  {{"sampler", name}, {"steps", k}, {"widths", w}, {"threads", at::get_num_threads()}}, device);
    }
  }
}
