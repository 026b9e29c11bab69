// SAC from pixels on this machine: what an image update costs and where its time goes.
//
//  - PixelPendulum (envs/render/pixels.hpp: Pendulum drawn at 64x64, 3 frames, action
//    repeat 2): agent steps/s of one env, drawing included;
//  - the replay buffer with image transitions (uint8 rows of 3 x 3 x 64 x 64 bytes), each
//    frame of a stack stored once (buffers/detail/frame_chains.hpp) against whole rows (the
//    same layout with its frames unmarked: how they were stored before), filled side by side
//    from the same env steps: transitions/s inserted one env step at a time, bytes per
//    transition at `capacity` (and what 1M would take, extrapolated, never allocated),
//    transitions/s sampled in batches, in interleaved rounds;
//  - SAC updates/s with the small encoder (GroupNorm, spatial softmax) of each width, batch
//    `batch`, one core, in interleaved rounds with the C library's heap kept (anvil's
//    setting, train/process_settings.hpp `keep_heap`) and with glibc's default thresholds
//    (128 KiB, trimmed at once: what a process without it gets), and their ratio;
//  - where an update's time goes: the sample, DrQ's shift of obs and next_obs, the critic's
//    encoder forward and backward, the two forward passes without gradients (next_obs through
//    the critic's and the target's encoders), and the rest (MLPs, optimizers, Polyak), each
//    timed alone at the same batch.
//
// One JSON line per figure (benchmarks/bench_common.hpp).
#include <anvil/nn/image_augment.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <malloc.h>

#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/render/classic_views.hpp>
#include <anvil/train/process_settings.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{3.0};
  anvil::Param<int, "rounds", "interleaved rounds over the settings", anvil::at_least(1)> rounds{3};
  anvil::Param<int, "batch", "transitions per update", anvil::at_least(1)> batch{128};
  anvil::Param<std::vector<int>, "widths", "the small encoder's widths to time", anvil::at_least(8)> widths{16, 32};
  anvil::Param<int, "capacity", "replay buffer capacity (transitions)", anvil::at_least(1000)> capacity{100'000};
  anvil::Param<int, "threads", "torch intra-op threads (0: torch's default)", anvil::at_least(0)> threads{1};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

void heap(bool kept) {
  if (kept) {
    if (!anvil::keep_heap()) throw anvil::Error("bench_pixel_sac: the heap setting did not apply (MALLOC_* set?)");
  } else {  // glibc's starting thresholds, held (its own adapt upwards after large frees)
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    malloc_trim(0);
  }
}

double seconds_of(const std::function<void()>& f, int n) {
  for (int i = 0; i < 3; ++i) f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::manual_seed(0);
  using anvil::envs::PixelPendulum;
  const auto spec = anvil::envs::spec_of(PixelPendulum{});
  const auto row = spec.obs_dim();

  // The env: agent steps/s, drawing included.
  {
    PixelPendulum env;
    env.reset(1);
    const float a[1] = {0.3f};
    const double rate = bench::median_rate([&] {
      if (env.step(a).truncated) env.reset(2);
    }, 1.0);
    bench::emit("pixel_pendulum_steps_per_s", rate, "agent steps/s", {{"size", 64}, {"frames", 3}, {"action_repeat", 2}});
  }

  // The buffers: filled by one env's real steps (as the training loop adds them), frames
  // stored once and whole rows side by side, in alternating order; with the C library's heap
  // kept, as a run keeps it (a sampled batch of image rows is megabytes: with glibc's
  // defaults each one is a fresh mmap whose pages fault in, which the sample figure measured
  // before, 25x slower than a run samples).
  heap(true);
  anvil::UniformBuffer::Config bc;
  bc.capacity = *b.capacity;
  auto whole_spec = spec;
  for (auto& part : whole_spec.layout.parts) part.frames = 1;
  anvil::UniformBuffer buffer(spec, bc, anvil::RunContext{.seed = 3});
  {
    anvil::UniformBuffer whole(whole_spec, bc, anvil::RunContext{.seed = 3});
    anvil::envs::VecEnvConfig vc;
    vc.num_envs = 1;
    anvil::envs::EnvArray<PixelPendulum> envs(PixelPendulum{}, vc, 5);
    auto obs = at::empty({1, row}, at::kByte), next = at::empty({1, row}, at::kByte);
    auto reward = at::empty({1}), term = at::empty({1}), trunc = at::empty({1});
    std::vector<anvil::envs::EpisodeEnd> ended(1);
    envs.reset(obs.data_ptr(), 0);
    auto prev = obs.clone();
    double add_seconds[2] = {0, 0};  // frames once, whole rows
    for (std::int64_t t = 0; t < *b.capacity; ++t) {
      const auto act = at::rand({1, 1}) * 4 - 2;
      const anvil::envs::StepRows rows{obs.data_ptr(), next.data_ptr(), reward.data_ptr<float>(), term.data_ptr<float>(),
                                       trunc.data_ptr<float>(), nullptr, ended.data()};
      envs.step(0, 1, act.data_ptr<float>(), rows, t);
      const anvil::StepBatch step{prev, act / 2, reward, next, term, trunc, {}};
      for (int k = 0; k < 2; ++k) {
        const int which = (k + static_cast<int>(t)) % 2;
        const auto t0 = std::chrono::steady_clock::now();
        (which == 0 ? buffer : whole).add(step);
        add_seconds[which] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      prev.copy_(obs);
    }
    const char* names[2] = {"frames_once", "whole_rows"};
    const anvil::UniformBuffer* both[2] = {&buffer, &whole};
    for (int k = 0; k < 2; ++k) {
      bench::emit("image_buffer_insert", static_cast<double>(*b.capacity) / add_seconds[k], "transitions/s",
                  {{"row_bytes", row}, {"envs", 1}, {"storage", names[k]}});
      const double per = static_cast<double>(both[k]->bytes()) / static_cast<double>(*b.capacity);
      bench::emit("image_buffer_bytes_per_transition", per, "bytes",
                  {{"capacity", *b.capacity}, {"row_bytes", row}, {"storage", names[k]},
                   {"allocated_gib", both[k]->bytes() / 1073741824.0}, {"at_1m_gib_extrapolated", per * 1e6 / 1073741824.0}});
    }
    std::vector<double> rates[2];
    for (int round = 0; round < b.rounds; ++round)
      for (int k = 0; k < 2; ++k) {
        auto& from = k == 0 ? buffer : whole;
        rates[k].push_back(bench::median_rate([&] { (void)from.sample(*b.batch); }, b.seconds / b.rounds));
      }
    for (int k = 0; k < 2; ++k) {
      std::sort(rates[k].begin(), rates[k].end());
      bench::emit("image_buffer_sample", rates[k][rates[k].size() / 2] * *b.batch, "transitions/s",
                  {{"batch", *b.batch}, {"capacity", *b.capacity}, {"storage", names[k]}});
    }
  }

  // SAC updates, heap kept against glibc's default, interleaved.
  struct Run {
    int width;
    bool kept;
    std::unique_ptr<anvil::SAC> sac;
    std::vector<double> rates;
  };
  std::vector<Run> runs;
  anvil::StepContext::Options so;
  so.threads = 1;
  anvil::StepContext ctx(so);
  for (int w : *b.widths)
    for (bool kept : {true, false}) {
      anvil::SAC::Config sc;
      sc.batch_size = *b.batch;
      sc.encoder->width = w;
      runs.push_back({w, kept, std::make_unique<anvil::SAC>(spec, sc, anvil::RunContext{}), {}});
    }
  for (int round = 0; round < b.rounds; ++round)
    for (auto& r : runs) {
      heap(r.kept);
      r.rates.push_back(bench::median_rate([&] { r.sac->update(buffer.sample(*b.batch), ctx); }, b.seconds, 1, 3));
    }
  heap(true);
  for (const auto& r : runs) {
    const Run& other = *std::find_if(runs.begin(), runs.end(), [&](const Run& o) { return o.width == r.width && o.kept != r.kept; });
    bench::emit("pixel_sac_updates_per_s", bench::median(r.rates), "updates/s",
                {{"width", r.width}, {"batch", *b.batch}, {"heap", std::string(r.kept ? "kept" : "glibc default")},
                 {"ratio_to_other_heap", bench::median_ratio(r.rates, other.rates)}, {"rounds", *b.rounds}});
  }

  // Where an update's time goes (heap kept), each part timed alone at the same batch.
  for (int w : *b.widths) {
    anvil::SAC::Config sc;
    sc.batch_size = *b.batch;
    sc.encoder->width = w;
    anvil::SAC sac(spec, sc, anvil::RunContext{});
    auto batch = buffer.sample(*b.batch);
    const int n = 10;
    const double whole = seconds_of([&] { sac.update(buffer.sample(*b.batch), ctx); }, n);
    const double sample = seconds_of([&] { (void)buffer.sample(*b.batch); }, n);
    const double augment = seconds_of([&] {
      (void)anvil::nn::shift_images(batch.obs, spec.layout, 4);
      (void)anvil::nn::shift_images(batch.next_obs, spec.layout, 4);
    }, n);
    anvil::nn::ObsEncoder enc(spec.layout, *sc.encoder);
    const double fwd_bwd = seconds_of([&] {
      for (auto& p : enc->parameters()) p.mutable_grad() = at::Tensor();
      enc->forward(batch.obs).square().mean().backward();
    }, n);
    const double fwd = seconds_of([&] {
      torch::NoGradGuard no_grad;
      (void)enc->forward(batch.next_obs);
    }, n);
    const double rest = whole - sample - augment - fwd_bwd - 2 * fwd;
    bench::emit("pixel_sac_update_seconds", whole, "s", {{"width", w}, {"batch", *b.batch}});
    for (const auto& [part, s] : std::vector<std::pair<std::string, double>>{
             {"sample", sample}, {"shift obs and next_obs", augment}, {"critic encoder forward+backward", fwd_bwd},
             {"next_obs encoder forwards (critic's, target's)", 2 * fwd}, {"rest: MLPs, optimizers, Polyak", rest}})
      bench::emit("pixel_sac_update_share", s / whole, "fraction", {{"part", part}, {"seconds", s}, {"width", w}, {"batch", *b.batch}});
  }
  return 0;
}
