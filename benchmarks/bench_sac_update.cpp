// SAC gradient updates per second at the sizes the speed targets name (256x256 and 64x64
// networks, batch 256), side by side with the same update in PyTorch Python
// (benchmarks/reference/sac_update.py), and the whole-run env steps/s of the main job.
//
// These machines are noisy (other tenants take whole milliseconds), so the two are timed in
// interleaved rounds: in each round every anvil setting runs for `seconds`, then every
// Python thread setting does. Each side's best setting is the one with the highest median;
// the speed-up is the median over rounds of the per-round ratio of those two settings, so
// both halves of a ratio saw the same machine. One JSON line per figure.
#include <anvil/algorithms/sac_graph.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <filesystem>

#include <anvil/anvil.hpp>

#ifndef ANVIL_BENCH_REFERENCE
#define ANVIL_BENCH_REFERENCE ""
#endif

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{2.0};
  anvil::Param<int, "rounds", "interleaved rounds of anvil and Python timings", anvil::at_least(1)> rounds{5};
  anvil::Param<std::vector<int>, "hidden", "network widths to measure", anvil::at_least(1)> hidden{256, 64};
  anvil::Param<int, "batch", "batch size", anvil::at_least(1)> batch{256};
  anvil::Param<std::vector<int>, "threads", "intra-op thread counts to measure", anvil::at_least(1)> threads{1};
  anvil::Param<std::vector<int>, "update_threads", "update_threads settings to measure", anvil::at_least(1)> update_threads{1, 2};
  anvil::Param<std::vector<int>, "manual_backward", "sac.manual_backward settings to measure (1: on, 0: off)", anvil::in_range(0, 1)> manual_backward{1};
  anvil::Param<std::string, "python", "interpreter of the Python reference (empty: skip it)"> python{"/usr/bin/python3"};
  anvil::Param<std::string, "reference", "the Python reference script"> reference{ANVIL_BENCH_REFERENCE};
  anvil::Param<std::vector<int>, "python_threads", "torch.set_num_threads settings of the reference", anvil::at_least(1)> python_threads{1, 2};
  anvil::Param<std::int64_t, "run_steps", "env steps of the main-job run (0: skip)", anvil::at_least(0)> run_steps{20000};
  anvil::Param<std::vector<anvil::Matmul>, "matmul",
               "run.matmul settings to measure (auto, blas, anvil): the updates interleaved, a main-job run each",
               anvil::at_least(1)>
      matmul{std::vector<anvil::Matmul>{anvil::Matmul::auto_}};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

// One timed repeat of the Python reference; 0 if it could not run.
double python_rate(const BenchConfig& b, int hidden, int threads) {
  return bench::run_reference(*b.python + " " + *b.reference + " --hidden " + std::to_string(hidden) +
                              " --batch " + std::to_string(*b.batch) + " --threads " +
                              std::to_string(threads) + " --seconds " + std::to_string(*b.seconds) +
                              " --repeats 1");
}

using bench::median;

// Multiply-adds in the matrix products of one SAC update on the hand-written path, actor
// obs -> h -> h -> 2 act and twin critics (obs + act) -> h -> h -> 1, batch B: forwards of
// the actor on s' and s, of the target critics on (s', a'), of the critics on (s, a) and
// (s, a~); the critics' weight gradients and their input gradients from layer 2 up; the
// critics' input gradients through all layers for the actor's loss; the actor's weight
// gradients and input gradients from layer 2 up. Checked against a count of the BLAS
// calls of a run (an LD_PRELOAD sgemm_ wrapper summing m*n*k over 1,001 updates at 64x64,
// batch 100: 7,000,494 a update, of which the 200 evaluation steps' forwards are 882).
double sac_update_fmas(double obs, double act, double h, double batch) {
  const double actor = obs * h + h * h + h * 2 * act, critic = (obs + act) * h + h * h + h;
  const double fwd = 2 * actor + 2 * critic + 2 * critic + 2 * critic;
  const double critic_dw = 2 * critic, critic_dx = 2 * (h * h + h), actor_critic_dx = 2 * critic;
  const double actor_dw = actor, actor_dx = h * h + h * 2 * act;
  return batch * (fwd + critic_dw + critic_dx + actor_critic_dx + actor_dw + actor_dx);
}

struct Setting {
  int threads = 1, update_threads = 1, manual = 1;
  std::vector<double> rates;
  anvil::Matmul matmul = anvil::Matmul::auto_;
};

std::string name_of(anvil::Matmul m) { return std::string(enum_names(m)[static_cast<std::size_t>(m)]); }

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const auto spec = anvil::envs::spec_of(anvil::envs::Pendulum{});
  const bool with_python = !b.python->empty() && !b.reference->empty() &&
                           python_rate(b, 64, 1) > 0;  // also warms the page cache
  if (!b.python->empty() && !with_python)
    std::fprintf(stderr, "bench_sac_update: the Python reference (%s %s) did not run; timing anvil only\n",
                 b.python->c_str(), b.reference->c_str());

  // The core's multiply-add ceiling, to say how near it the updates run.
  const double peak = bench::fma_peak_gflops();
  if (peak > 0) bench::emit("cpu_fma_peak_gflops", peak, "GFLOP/s", {{"threads", 1}});
  // Both vCPUs at once: the ceiling of the main job, whose default update threads use two.
  const double peak2 = bench::fma_peak_gflops(2);
  if (peak2 > 0) bench::emit("cpu_fma_peak_gflops", peak2, "GFLOP/s", {{"threads", 2}, {"one_core", peak}});

  for (int h : *b.hidden) {
    // One SAC and replay buffer per setting, built once; rounds alternate between them.
    struct Run {
      Setting s;
      std::unique_ptr<anvil::SAC> sac;
      std::unique_ptr<anvil::UniformBuffer> buffer;
      std::unique_ptr<anvil::StepContext> ctx;
    };
    std::vector<Run> runs;
    for (anvil::Matmul matmul : *b.matmul)
    for (int threads : *b.threads)
      for (int tasks : *b.update_threads)
        for (int manual : *b.manual_backward) {
          torch::set_num_threads(threads);
          torch::manual_seed(0);
          anvil::SAC::Config sc;
          sc.batch_size = *b.batch;
          sc.actor->hidden = {h, h};
          sc.critic->hidden = {h, h};
          sc.manual_backward = manual;
          Run r;
          r.s.threads = threads, r.s.update_threads = tasks, r.s.manual = manual, r.s.matmul = matmul;
          r.sac = std::make_unique<anvil::SAC>(spec, sc, anvil::RunContext{});
          anvil::UniformBuffer::Config bc;
          bc.capacity = 100'000;
          r.buffer = std::make_unique<anvil::UniformBuffer>(spec, bc, anvil::RunContext{});
          bench::fill(*r.buffer, bc.capacity, 3, 1, 100, 200);  // random Pendulum-shaped steps
          anvil::StepContext::Options so;
          so.threads = tasks;
          r.ctx = std::make_unique<anvil::StepContext>(so);
          runs.push_back(std::move(r));
        }
    std::vector<Setting> py;
    if (with_python)
      for (int t : *b.python_threads) py.push_back({t, 1, 0, {}});

    for (int round = 0; round < b.rounds; ++round) {
      for (auto& r : runs) {
        torch::set_num_threads(r.s.threads);
        anvil::blas::set_matmul(r.s.matmul);
        r.s.rates.push_back(bench::median_rate(
            [&] { r.sac->update(r.buffer->sample(*b.batch), *r.ctx); }, b.seconds, 1, round ? 5 : 50));
      }
      for (auto& p : py) p.rates.push_back(python_rate(b, h, p.threads));
    }

    const std::string size = std::to_string(h) + "x" + std::to_string(h);
    const Setting* best = nullptr;
    for (const auto& r : runs) {
      bench::emit("sac_update", median(r.s.rates), "updates/s",
                  {{"hidden", size}, {"batch", *b.batch}, {"threads", r.s.threads},
                   {"update_threads", r.s.update_threads}, {"manual_backward", r.s.manual ? 1 : 0},
                   {"matmul", name_of(r.s.matmul)}, {"rounds", *b.rounds}, {"impl", "anvil"}});
      if (!best || median(r.s.rates) > median(best->rates)) best = &r.s;
      // The matrix products' arithmetic rate, and its share of one core's peak (one update
      // thread: the products run on one core).
      if (r.s.manual && r.s.threads == 1 && r.s.update_threads == 1) {
        const double gflops = 2 * sac_update_fmas(static_cast<double>(spec.obs_dim()), static_cast<double>(spec.action_dim()), h, *b.batch) * median(r.s.rates) / 1e9;
        bench::emit("sac_update_matmul_gflops", gflops, "GFLOP/s",
                    {{"hidden", size}, {"batch", *b.batch}, {"threads", 1}, {"update_threads", 1},
                     {"matmul", name_of(r.s.matmul)}, {"share_of_core_peak", peak > 0 ? gflops / peak : 0.0},
                     {"rounds", *b.rounds}});
      }
    }
    const Setting* best_py = nullptr;
    for (const auto& p : py) {
      bench::emit("python_sac_update", median(p.rates), "updates/s",
                  {{"hidden", size}, {"batch", *b.batch}, {"threads", p.threads},
                   {"rounds", *b.rounds}, {"impl", "pytorch-python"}});
      if (!best_py || median(p.rates) > median(best_py->rates)) best_py = &p;
    }
    if (best && best_py)
      bench::emit("sac_update_speedup_vs_python", bench::median_ratio(best->rates, best_py->rates), "x",
                  {{"hidden", size}, {"batch", *b.batch}, {"threads", best->threads},
                   {"update_threads", best->update_threads}, {"matmul", name_of(best->matmul)},
                   {"python_threads", best_py->threads},
                   {"rounds", *b.rounds}});
  }

  for (anvil::Matmul matmul : *b.matmul) {
    if (*b.run_steps == 0) break;
    using T = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
    T::Config c;  // the main job's settings (examples/train_sac_pendulum.cpp)
    c.train->steps = b.run_steps;
    c.train->eval_interval = 2000;
    c.algorithm->actor_lr = 1e-3;
    c.algorithm->critic_lr = 1e-3;
    c.algorithm->alpha_lr = 1e-3;
    c.run->device = "cpu";
    c.run->matmul = matmul;
    c.run->progress = anvil::ProgressMode::off;
    // A directory of its own each time (a second run must not find the first's run there).
    c.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_sac_update_" + std::to_string(::getpid()))).string();
    T t(anvil::envs::Pendulum{}, c);
    const auto r = t.fit();
    bench::emit("main_job_env_steps_per_s", static_cast<double>(r.env_steps) / r.wall_seconds,
                "env steps/s",
                {{"env", "Pendulum-v1"}, {"steps", static_cast<long long>(r.env_steps)},
                 {"final_eval_return", r.final_eval_return}, {"threads", *c.run->threads},
                 {"update_threads", *c.run->update_threads}, {"matmul", name_of(matmul)}});
    // The update phase's FLOP rate (the matrix products of every update over the seconds
    // timed as update and optimizer) against both vCPUs' ceiling, and what the optimizer
    // phase (Adam on each network's flat parameters, the critics' Polyak average) takes.
    const auto& times = t.times();
    const double learn = times.seconds(anvil::Phase::update) + times.seconds(anvil::Phase::optimizer);
    const double h = static_cast<double>(c.algorithm->actor->hidden->front());
    const double update_gflops = 2 * sac_update_fmas(static_cast<double>(spec.obs_dim()), static_cast<double>(spec.action_dim()), h,
                                                     static_cast<double>(*c.algorithm->batch_size)) *
                                 static_cast<double>(r.updates) / learn / 1e9;
    bench::emit("main_job_update_gflops", update_gflops, "GFLOP/s",
                {{"env", "Pendulum-v1"}, {"updates", static_cast<long long>(r.updates)},
                 {"update_threads", *c.run->update_threads}, {"matmul", name_of(matmul)},
                 {"share_of_two_vcpu_peak", peak2 > 0 ? update_gflops / peak2 : 0.0},
                 {"update_seconds", times.seconds(anvil::Phase::update)},
                 {"optimizer_seconds", times.seconds(anvil::Phase::optimizer)},
                 {"optimizer_share_of_run", times.share(anvil::Phase::optimizer)}});
    // The phase timers are on by default; their cost must stay far under 2% of a run.
    bench::emit("main_job_timer_overhead_share", t.timer_overhead(), "fraction",
                {{"env", "Pendulum-v1"}, {"steps", static_cast<long long>(r.env_steps)},
                 {"phases_timed", static_cast<long long>(t.times().calls())}});
    std::error_code ec;
    std::filesystem::remove_all(t.run_dir(), ec);
  }
}
