#pragma once
/// @file
/// Image encoders: an image batch [B, C, H, W] (uint8 pixels, or floats already in [0, 1])
/// to a feature vector [B, F] that an actor, a critic or a denoiser takes as its input.
///
///  - `NatureCnn` (Mnih et al. 2015, "Human-level control through deep reinforcement
///    learning", Methods): 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1 convolutions,
///    ReLU, then a 512-unit layer. The encoder of DQN and of most pixel SAC/PPO baselines at
///    84x84.
///  - `SmallCnn`: four 3x3 convolutions (stride 2, 1, 2, 1), each GroupNorm and ReLU, pooled by
///    spatial softmax (nn/spatial_softmax.hpp) and projected to F features: the small encoder
///    for this machine's learning runs, in the spirit of Diffusion Policy's (GroupNorm, not
///    BatchNorm, which mixes samples and breaks with EMA weights and small batches;
///    keypoints, not averages).
///  - `ResNet18Gn` (nn/resnet18_gn.hpp): Diffusion Policy's ResNet-18.
///
/// Pixels are converted where the encoder runs: a uint8 batch is moved to the device as
/// bytes and scaled to [0, 1] floats there (`image_to_float`), so a replay buffer and a host
/// to device copy carry a quarter of the bytes.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/nn/spatial_softmax.hpp>

namespace anvil::nn {

/// uint8 pixels [.., C, H, W] -> float32 in [0, 1] on the same device; floats pass as they are.
inline at::Tensor image_to_float(const at::Tensor& x) {
  return x.scalar_type() == at::kByte ? x.to(at::kFloat).div_(255.0) : x;
}

/// GroupNorm in float32 (its statistics need it under autocast, and LibTorch 1.13's CPU
/// kernel takes one dtype), back in the input's dtype.
inline at::Tensor group_norm_f32(torch::nn::GroupNorm& norm, const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) return norm->forward(x);
  return norm->forward(x.to(at::kFloat)).to(x.scalar_type());
}

/// The spatial size after a convolution (kernel k, stride s, padding p).
constexpr std::int64_t conv_out(std::int64_t size, std::int64_t k, std::int64_t s, std::int64_t p = 0) {
  return (size + 2 * p - k) / s + 1;
}

/// The image a pixel encoder takes: channels (3 per RGB frame x stacked frames), height, width.
struct ImageShape {
  std::int64_t channels = 3, height = 84, width = 84;
};

/// DQN's encoder (see file comment): [B, C, H, W] -> [B, 512] (ReLU features).
class NatureCnnImpl : public torch::nn::Cloneable<NatureCnnImpl> {
 public:
  explicit NatureCnnImpl(ImageShape in, std::int64_t features = 512) : in_(in), features_(features) {
    h_ = conv_out(conv_out(conv_out(in.height, 8, 4), 4, 2), 3, 1);
    w_ = conv_out(conv_out(conv_out(in.width, 8, 4), 4, 2), 3, 1);
    if (h_ < 1 || w_ < 1)
      throw ConfigError("NatureCnn: a " + std::to_string(in.height) + "x" + std::to_string(in.width) +
                        " image is too small for its 8/4/3 convolutions (36x36 at least)");
    reset();
  }
  void reset() override {
    conv0 = register_module("conv0", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_.channels, 32, 8).stride(4)));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).stride(1)));
    fc = register_module("fc", torch::nn::Linear(64 * h_ * w_, features_));
  }
  at::Tensor forward(const at::Tensor& images) {
    auto h = at::relu(conv0->forward(image_to_float(images)));
    h = at::relu(conv1->forward(h));
    h = at::relu(conv2->forward(h));
    return at::relu(fc->forward(h.flatten(1)));
  }
  [[nodiscard]] std::int64_t output_size() const noexcept { return features_; }

  torch::nn::Conv2d conv0{nullptr}, conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  ImageShape in_;
  std::int64_t features_, h_ = 0, w_ = 0;
};
TORCH_MODULE(NatureCnn);

/// The small GroupNorm encoder (see file comment): [B, C, H, W] -> [B, features].
class SmallCnnImpl : public torch::nn::Cloneable<SmallCnnImpl> {
 public:
  struct Options {
    std::int64_t width = 32;       ///< channels of the first two convolutions; the last two have twice as many
    std::int64_t groups = 8;       ///< GroupNorm groups
    std::int64_t keypoints = 32;   ///< spatial-softmax keypoints
    std::int64_t features = 64;    ///< output features
  };
  SmallCnnImpl(ImageShape in, Options o) : in_(in), o_(o) {
    if (o_.width % o_.groups != 0)
      throw ConfigError("SmallCnn: width " + std::to_string(o_.width) + " is not a multiple of its " + std::to_string(o_.groups) +
                        " norm groups");
    h_ = conv_out(conv_out(in.height, 3, 2, 1), 3, 2, 1);
    w_ = conv_out(conv_out(in.width, 3, 2, 1), 3, 2, 1);
    reset();
  }
  explicit SmallCnnImpl(ImageShape in) : SmallCnnImpl(in, Options{}) {}

  void reset() override {
    // Direct children ("conv0".., "norm0"..), not ModuleLists: a clone copies into these very
    // modules, so the vectors stay the clone's own.
    convs.clear(), norms.clear();
    const std::int64_t widths[] = {o_.width, o_.width, 2 * o_.width, 2 * o_.width}, strides[] = {2, 1, 2, 1};
    std::int64_t c = in_.channels;
    for (int i = 0; i < 4; ++i) {
      convs.push_back(register_module("conv" + std::to_string(i),
                                      torch::nn::Conv2d(torch::nn::Conv2dOptions(c, widths[i], 3).stride(strides[i]).padding(1))));
      norms.push_back(register_module("norm" + std::to_string(i), torch::nn::GroupNorm(torch::nn::GroupNormOptions(o_.groups, widths[i]))));
      c = widths[i];
    }
    pool = register_module("pool", SpatialSoftmax(c, h_, w_, o_.keypoints));
    fc = register_module("fc", torch::nn::Linear(pool->output_size(), o_.features));
  }
  at::Tensor forward(const at::Tensor& images) {
    auto h = image_to_float(images);
    for (std::size_t i = 0; i < convs.size(); ++i) h = at::relu(group_norm_f32(norms[i], convs[i]->forward(h)));
    return fc->forward(pool->forward(h));
  }
  [[nodiscard]] std::int64_t output_size() const noexcept { return o_.features; }

  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::GroupNorm> norms;
  SpatialSoftmax pool{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  ImageShape in_;
  Options o_;
  std::int64_t h_ = 0, w_ = 0;
};
TORCH_MODULE(SmallCnn);

}  // namespace anvil::nn
