#pragma once
/// @file
/// `ResNet18Gn`: the image encoder of Diffusion Policy (Chi et al. 2023, section IV-B): a
/// ResNet-18 (He et al. 2016, "Deep Residual Learning for Image Recognition", table 1) trained
/// from scratch, with two changes the paper makes: every BatchNorm is a GroupNorm (16 channels
/// a group), which keeps per-sample statistics and so works with EMA weights and any batch,
/// and the global average pooling is a spatial softmax (nn/spatial_softmax.hpp; 32 keypoints,
/// as robomimic's visual core that the paper builds on), projected to `features` (64).
///
/// Trunk: 7x7 stride-2 convolution (64), norm, ReLU, 3x3 stride-2 max pooling; four stages of
/// two basic blocks (64, 128, 256, 512 channels; stages 2-4 halve the size), a basic block
/// being 3x3 conv, norm, ReLU, 3x3 conv, norm, plus the input (through a strided 1x1
/// convolution and norm where the size or width changes), ReLU. No convolution has a bias
/// (a norm follows each). The trunk has ResNet-18's 11,176,512 parameters for RGB input (its
/// 11,689,512 less the 1000-class layer); an 84x84 image leaves a 3x3 map of 512 channels.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/nn/image_encoders.hpp>
#include <anvil/nn/spatial_softmax.hpp>

namespace anvil::nn {

/// GroupNorm with 16 channels a group (Diffusion Policy's replacement of BatchNorm).
inline torch::nn::GroupNorm group_norm_16(std::int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(channels / 16, channels));
}

/// ResNet's basic block with GroupNorm (see file comment).
class BasicBlockGnImpl : public torch::nn::Cloneable<BasicBlockGnImpl> {
 public:
  BasicBlockGnImpl(std::int64_t in, std::int64_t out, std::int64_t stride) : in_(in), out_(out), stride_(stride) { reset(); }
  void reset() override {
    conv0 = register_module("conv0", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, out_, 3).stride(stride_).padding(1).bias(false)));
    norm0 = register_module("norm0", group_norm_16(out_));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(out_, out_, 3).padding(1).bias(false)));
    norm1 = register_module("norm1", group_norm_16(out_));
    if (stride_ != 1 || in_ != out_) {
      down = register_module("down", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, out_, 1).stride(stride_).bias(false)));
      down_norm = register_module("down_norm", group_norm_16(out_));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = at::relu(group_norm_f32(norm0, conv0->forward(x)));
    h = group_norm_f32(norm1, conv1->forward(h));
    const auto skip = down ? group_norm_f32(down_norm, down->forward(x)) : x;
    return at::relu(h + skip);
  }
  torch::nn::Conv2d conv0{nullptr}, conv1{nullptr}, down{nullptr};
  torch::nn::GroupNorm norm0{nullptr}, norm1{nullptr}, down_norm{nullptr};

 private:
  std::int64_t in_, out_, stride_;
};
TORCH_MODULE(BasicBlockGn);

/// Diffusion Policy's ResNet-18 (see file comment): [B, C, H, W] -> [B, features].
class ResNet18GnImpl : public torch::nn::Cloneable<ResNet18GnImpl> {
 public:
  explicit ResNet18GnImpl(ImageShape in, std::int64_t keypoints = 32, std::int64_t features = 64)
      : in_(in), keypoints_(keypoints), features_(features) {
    auto size = [](std::int64_t s) {
      s = conv_out(conv_out(s, 7, 2, 3), 3, 2, 1);                                     // stem and max pooling
      for (int stage = 1; stage < 4; ++stage) s = conv_out(s, 3, 2, 1);                // stages 2-4
      return s;
    };
    h_ = size(in.height), w_ = size(in.width);
    if (in.height < 32 || in.width < 32)
      throw ConfigError("ResNet18Gn: a " + std::to_string(in.height) + "x" + std::to_string(in.width) +
                        " image is too small for its five halvings (32x32 at least)");
    reset();
  }

  void reset() override {
    stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_.channels, 64, 7).stride(2).padding(3).bias(false)));
    stem_norm = register_module("stem_norm", group_norm_16(64));
    // Each block a direct child ("block0".."block7"): a clone then copies into these very
    // modules (a ModuleList would be replaced by new ones, leaving `blocks` pointing at the old).
    blocks.clear();
    std::int64_t c = 64;
    for (const std::int64_t width : {64, 128, 256, 512})
      for (int b = 0; b < 2; ++b) {
        blocks.push_back(register_module("block" + std::to_string(blocks.size()), BasicBlockGn(c, width, b == 0 && width != 64 ? 2 : 1)));
        c = width;
      }
    pool = register_module("pool", SpatialSoftmax(512, h_, w_, keypoints_));
    fc = register_module("fc", torch::nn::Linear(pool->output_size(), features_));
  }

  /// The trunk alone: [B, C, H, W] -> [B, 512, h, w].
  at::Tensor trunk(const at::Tensor& images) {
    auto h = at::relu(group_norm_f32(stem_norm, stem->forward(image_to_float(images))));
    h = at::max_pool2d(h, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
    for (auto& b : blocks) h = b->forward(h);
    return h;
  }
  at::Tensor forward(const at::Tensor& images) { return fc->forward(pool->forward(trunk(images))); }

  [[nodiscard]] std::int64_t output_size() const noexcept { return features_; }
  /// The trunk's output map: 512 x height x width.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> map_size() const noexcept { return {h_, w_}; }

  torch::nn::Conv2d stem{nullptr};
  torch::nn::GroupNorm stem_norm{nullptr};
  std::vector<BasicBlockGn> blocks;  ///< the four stages' two blocks each
  SpatialSoftmax pool{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  ImageShape in_;
  std::int64_t keypoints_, features_, h_ = 0, w_ = 0;
};
TORCH_MODULE(ResNet18Gn);

}  // namespace anvil::nn
