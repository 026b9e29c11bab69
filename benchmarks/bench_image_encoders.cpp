// The image encoders' costs (nn/image_encoders.hpp, nn/resnet18_gn.hpp) and augmentation's:
//
//  - encoder forward + backward samples/s (uint8 pixels in, converted on the device; a mean
//    squared feature as the loss; gradients zeroed each step, no optimizer) under FP32 and
//    BF16 autocast, in interleaved rounds: NatureCnn and SmallCnn on 3 stacked RGB frames at
//    84x84 (pixel SAC/PPO), ResNet18Gn on one RGB 84x84 crop (image Push-T); BF16's ratio
//    to FP32 is the median of per-round ratios;
//  - random_shift (pad 4, 9x84x84) and random_crop (84 of 96x96, 3 channels) images/s on
//    uint8 batches;
//  - software rendering (envs/render/): Pendulum's view, frames/s at 64x64 and 84x84, and
//    Push-T's at 96x96 (with Chipmunk2D), one core.
//
// Runs on `bench.device` (default: CUDA when present). One JSON line per figure.
#include <anvil/nn/resnet18_gn.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <anvil/core/autocast.hpp>
#include <anvil/core/context.hpp>
#include <anvil/envs/render/classic_views.hpp>
#if ANVIL_WITH_CHIPMUNK
#include <anvil/envs/chipmunk/push_t_view.hpp>
#endif
#include <anvil/nn/image_augment.hpp>
#include <anvil/nn/image_encoders.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{2.0};
  anvil::Param<int, "rounds", "interleaved rounds over the settings", anvil::at_least(1)> rounds{3};
  anvil::Param<int, "batch", "images per step for NatureCnn and SmallCnn", anvil::at_least(1)> batch{128};
  anvil::Param<int, "resnet_batch", "images per step for ResNet18Gn", anvil::at_least(1)> resnet_batch{64};
  anvil::Param<int, "size", "image height and width", anvil::at_least(36)> size{84};
  anvil::Param<std::vector<std::string>, "encoders", "which encoders: nature, small, resnet18"> encoders{"nature", "small", "resnet18"};
  anvil::Param<std::string, "device", "auto (CUDA when present), cpu, cuda or cuda:N"> device{"auto"};
  anvil::Param<int, "threads", "torch intra-op threads (0: torch's default)", anvil::at_least(0)> threads{0};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

struct Setting {
  std::string encoder, precision;
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  at::Tensor images;
  std::vector<double> rates;
};

template <class Net>
Setting make(const std::string& name, const std::string& precision, Net net, std::int64_t batch, std::int64_t c,
             std::int64_t size, const c10::Device& device) {
  net->to(device);
  Setting s{name, precision, net.ptr(), [net](const at::Tensor& x) mutable { return net->forward(x); },
            at::randint(256, {batch, c, size, size}, at::TensorOptions().dtype(at::kByte)).to(device), {}};
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const auto device = anvil::resolve_device(b.device, 0);
  const std::int64_t n = *b.size;
  torch::manual_seed(0);

  std::vector<Setting> settings;
  for (const std::string precision : {"fp32", "bf16"})
    for (const auto& e : *b.encoders) {
      if (e == "nature") settings.push_back(make("NatureCnn", precision, anvil::nn::NatureCnn(anvil::nn::ImageShape{9, n, n}), b.batch, 9, n, device));
      else if (e == "small") settings.push_back(make("SmallCnn", precision, anvil::nn::SmallCnn(anvil::nn::ImageShape{9, n, n}), b.batch, 9, n, device));
      else if (e == "resnet18") settings.push_back(make("ResNet18Gn", precision, anvil::nn::ResNet18Gn(anvil::nn::ImageShape{3, n, n}), b.resnet_batch, 3, n, device));
      else throw anvil::ConfigError("bench.encoders: '" + e + "' is not nature, small or resnet18");
    }
  for (int round = 0; round < b.rounds; ++round)
    for (auto& s : settings) {
      const auto step = [&] {
        for (auto& p : s.module->parameters()) p.mutable_grad() = at::Tensor();
        at::Tensor loss;
        {
          anvil::AutocastGuard guard(device.type(), s.precision == "bf16", at::kBFloat16);
          loss = s.forward(s.images).to(at::kFloat).square().mean();
        }
        loss.backward();
        if (device.is_cuda()) (void)loss.item<float>();  // wait for the device
      };
      s.rates.push_back(static_cast<double>(s.images.size(0)) * bench::median_rate(step, b.seconds, 1, round ? 1 : 3));
    }
  for (const auto& s : settings) {
    std::int64_t params = 0;
    for (const auto& p : s.module->parameters()) params += p.numel();
    const std::vector<std::pair<std::string, bench::Value>> conf{
        {"encoder", s.encoder}, {"precision", s.precision}, {"batch", static_cast<long>(s.images.size(0))},
        {"image", std::to_string(s.images.size(1)) + "x" + std::to_string(n) + "x" + std::to_string(n)},
        {"parameters", static_cast<long>(params)}, {"rounds", *b.rounds}, {"threads", at::get_num_threads()}};
    bench::emit("image_encoder_fwd_bwd_samples_per_s", bench::median(s.rates), "samples/s", conf, device.str());
    for (const auto& base : settings)
      if (&base != &s && base.encoder == s.encoder && base.precision == "fp32" && s.precision != "fp32")
        bench::emit("image_encoder_fwd_bwd_vs_fp32", bench::median_ratio(s.rates, base.rates), "x", conf, device.str());
  }

  // Augmentation on uint8 batches.
  const auto frames = at::randint(256, {*b.batch, 9, n, n}, at::TensorOptions().dtype(at::kByte)).to(device);
  const auto big = at::randint(256, {*b.batch, 3, n + 12, n + 12}, at::TensorOptions().dtype(at::kByte)).to(device);
  auto sync = [&](const at::Tensor& t) {
    if (device.is_cuda()) (void)t.sum().item<double>();
  };
  const double shift = bench::median_rate([&] { sync(anvil::nn::random_shift(frames, 4)); }, b.seconds, 3, 3);
  bench::emit("random_shift_images_per_s", shift * static_cast<double>(*b.batch), "images/s",
              {{"pad", 4}, {"image", "9x" + std::to_string(n) + "x" + std::to_string(n)}, {"batch", *b.batch}, {"dtype", "uint8"}},
              device.str());
  const double crop = bench::median_rate([&] { sync(anvil::nn::random_crop(big, n, n)); }, b.seconds, 3, 3);
  bench::emit("random_crop_images_per_s", crop * static_cast<double>(*b.batch), "images/s",
              {{"crop", std::to_string(n) + " of " + std::to_string(n + 12)}, {"image", "3x" + std::to_string(n + 12) + "x" + std::to_string(n + 12)},
               {"batch", *b.batch}, {"dtype", "uint8"}},
              device.str());

  // Rendering: Pendulum's view at a new angle each frame.
  for (const int px : {64, 84}) {
    anvil::envs::render::Canvas canvas(px, px, anvil::envs::render::kPendulumView);
    double theta = 0;
    const double fps = bench::median_rate([&] { anvil::envs::render::draw_pendulum(canvas, theta += 0.01); }, b.seconds, 3, 50);
    bench::emit("render_frames_per_s", fps, "frames/s", {{"view", "pendulum"}, {"image", "3x" + std::to_string(px) + "x" + std::to_string(px)}});
  }
#if ANVIL_WITH_CHIPMUNK
  {
    auto canvas = anvil::envs::chipmunk::push_t_canvas(96);
    double angle = 0;
    const double fps = bench::median_rate(
        [&] { anvil::envs::chipmunk::draw_push_t(canvas, {200.0, 300.0, angle += 0.01}, 100.0, 120.0); }, b.seconds, 3, 50);
    bench::emit("render_frames_per_s", fps, "frames/s", {{"view", "push_t"}, {"image", "3x96x96"}});
  }
#endif
  return 0;
}
