// SAC updates per second under each precision policy, at 256x256 and 1024x1024 networks
// and batches of 256 and 2048, on the device given (`bench.device`, default: CUDA when
// present). On the CPU that is FP32 (with and without the hand-written float32 fast path,
// sac.manual_backward) against BF16; TF32 is FP32 there and FP16 needs CUDA, so both are
// left out. On CUDA: FP32 op by op (sac.cuda_graph=false), then FP32, TF32, BF16 and FP16
// as a run has them (the update replayed from a CUDA graph, FP16's loss scaler's check and
// skip included). Each update samples its batch from a replay buffer stored on the same
// device, as the Trainer does.
//
// Settings are timed in interleaved rounds (every setting once per round), and each figure
// is the median over rounds; the ratio to FP32 is the median of per-round ratios, so both
// halves of a ratio saw the same machine. Each setting also reports the ATen operators one
// update (its sampling included) dispatches: where an update is bound by the host, as small
// networks on a GPU are, its time is about that count times the cost of one dispatch and
// launch. One JSON line per figure.
#include "bench_common.hpp"

#include <ATen/record_function.h>

#include <algorithm>
#include <map>

// Not anvil.hpp: its c10d part needs Gloo's headers, which PyTorch's wheels do not ship
// (scripts/gpu-check.sh builds this against one).
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/core/context.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp16.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/precision/tf32.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{2.0};
  anvil::Param<int, "rounds", "interleaved rounds over all settings", anvil::at_least(1)> rounds{3};
  anvil::Param<std::vector<int>, "hidden", "network widths (two hidden layers each)", anvil::at_least(1)> hidden{256, 1024};
  anvil::Param<std::vector<int>, "batch", "batch sizes", anvil::at_least(1)> batch{256, 2048};
  anvil::Param<std::string, "device", "auto (CUDA when present), cpu, cuda or cuda:N"> device{"auto"};
  anvil::Param<int, "threads", "intra-op threads on the CPU (0: torch's default)", anvil::at_least(0)> threads{0};
  anvil::Param<int, "op_names", "also list the N most called ATen operators of each setting's update (stderr)",
               anvil::at_least(0)>
      op_names{0};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

// One measured setting: a precision (and, for FP32 on the CPU, the fast-path switch) at one
// network width and batch size, with its own SAC, buffer and step context.
struct Setting {
  std::string precision;
  bool manual = false;
  bool graph = true;  // sac.cuda_graph
  int hidden = 0, batch = 0;
  bool tf32 = false;
  std::unique_ptr<anvil::SAC> sac;
  std::unique_ptr<anvil::UniformBuffer> buffer;
  std::unique_ptr<anvil::StepContext> ctx;
  std::vector<double> rates;
};

template <class X>
Setting make(const anvil::RunContext& run, int hidden, int batch, bool manual, bool graph = true) {
  const auto spec = anvil::envs::spec_of(anvil::envs::Pendulum{});
  torch::manual_seed(0);
  anvil::SAC::Config sc;
  sc.batch_size = batch;
  sc.actor->hidden = {hidden, hidden};
  sc.critic->hidden = {hidden, hidden};
  sc.manual_backward = manual;
  sc.cuda_graph = graph;
  Setting s{std::string(X::name), manual, graph, hidden, batch, X::allow_tf32, std::make_unique<anvil::SAC>(spec, sc, run),
            {}, {}, {}};
  anvil::UniformBuffer::Config bc;
  bc.capacity = 100'000;
  s.buffer = std::make_unique<anvil::UniformBuffer>(spec, bc, run);
  bench::fill(*s.buffer, bc.capacity, 3, 1, 100, 200);  // random Pendulum-shaped steps
  s.ctx = std::make_unique<anvil::StepContext>(bench::step_options<X>(run.device));
  return s;
}

// The ATen operator calls `f` makes through the dispatcher, autograd's backward nodes
// included (RecordFunction's global callbacks; nested calls count too, as each is
// dispatched), by name (a backward node's name says so: "AddmmBackward0").
std::map<std::string, std::int64_t> aten_ops(const std::function<void()>& f) {
  static std::map<std::string, std::int64_t> calls;
  calls.clear();
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& r) -> std::unique_ptr<at::ObserverContext> {
        ++calls[r.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  f();
  at::removeCallback(handle);
  return calls;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  anvil::RunContext run;
  run.device = anvil::resolve_device(b.device, 0);
  const bool cuda = run.device.is_cuda();
  at::globalContext().setBenchmarkCuDNN(true);

  std::vector<Setting> settings;
  for (int h : *b.hidden)
    for (int n : *b.batch) {
      if (cuda) {
        settings.push_back(make<anvil::FP32>(run, h, n, false, false));
        settings.push_back(make<anvil::FP32>(run, h, n, false));
        settings.push_back(make<anvil::TF32>(run, h, n, false));
        settings.push_back(make<anvil::BF16>(run, h, n, false));
        settings.push_back(make<anvil::FP16>(run, h, n, false));
      } else {
        settings.push_back(make<anvil::FP32>(run, h, n, true));
        settings.push_back(make<anvil::FP32>(run, h, n, false));
        settings.push_back(make<anvil::BF16>(run, h, n, false));
      }
    }

  for (int round = 0; round < b.rounds; ++round)
    for (auto& s : settings) {
      at::globalContext().setAllowTF32CuBLAS(s.tf32);
      at::globalContext().setAllowTF32CuDNN(s.tf32);
      // Each update ends in a host read of its losses, so CUDA work is finished when it returns.
      s.rates.push_back(bench::median_rate([&] { s.sac->update(s.buffer->sample(s.batch), *s.ctx); }, b.seconds, 1,
                                           round ? 2 : 10));
    }

  const std::string device = run.device.str();
  for (const auto& s : settings) {
    const bool fast_path = s.manual && s.sac->manual_backward();
    std::vector<std::pair<std::string, bench::Value>> conf{
        {"precision", s.precision}, {"hidden", std::to_string(s.hidden) + "x" + std::to_string(s.hidden)},
        {"batch", s.batch}, {"manual_backward", fast_path ? 1 : 0}, {"cuda_graph", s.sac->graphed_updates() > 0 ? 1 : 0},
        {"rounds", *b.rounds},
        {"threads", at::get_num_threads()}};
    bench::emit("sac_update_precision", bench::median(s.rates), "updates/s", conf, device);
    at::globalContext().setAllowTF32CuBLAS(s.tf32);
    at::globalContext().setAllowTF32CuDNN(s.tf32);
    const auto ops = aten_ops([&] { s.sac->update(s.buffer->sample(s.batch), *s.ctx); });
    std::int64_t total = 0;
    for (const auto& [name, n] : ops) total += n;
    bench::emit("sac_update_aten_ops", static_cast<double>(total), "ops/update", conf, device);
    if (b.op_names > 0) {
      std::vector<std::pair<std::int64_t, std::string>> most;
      for (const auto& [name, n] : ops) most.emplace_back(n, name);
      std::sort(most.rbegin(), most.rend());
      std::fprintf(stderr, "bench_precision: %s %dx%d batch %d%s: %lld operators; most called:\n", s.precision.c_str(),
                   s.hidden, s.hidden, s.batch, fast_path ? " (hand-written path)" : "", static_cast<long long>(total));
      for (std::size_t i = 0; i < most.size() && i < static_cast<std::size_t>(*b.op_names); ++i)
        std::fprintf(stderr, "  %6lld %s\n", static_cast<long long>(most[i].first), most[i].second.c_str());
    }
    // The ratio to FP32 with autograd (op by op on CUDA) at the same size: the same
    // computation in float32.
    for (const auto& base : settings)
      if (&base != &s && base.precision == "fp32" && !base.manual && (!cuda || !base.graph) &&
          base.hidden == s.hidden && base.batch == s.batch)
        bench::emit("sac_update_precision_vs_fp32", bench::median_ratio(s.rates, base.rates), "x", conf, device);
  }
}
