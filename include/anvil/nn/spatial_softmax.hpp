#pragma once
/// @file
/// `SpatialSoftmax`: pools a feature map [B, C, H, W] into keypoints, the expected image
/// coordinates of each channel's softmax over its H x W positions (Levine, Finn et al. 2016,
/// "End-to-End Training of Deep Visuomotor Policies", section 4.1; Finn et al. 2016, "Deep
/// Spatial Autoencoders"). Where global average pooling keeps *how much* of a feature there
/// is, this keeps *where* it is, which is what manipulation from images needs; Diffusion
/// Policy (Chi et al. 2023, section IV-B) uses it in place of ResNet's average pooling.
///
/// A 1x1 convolution first maps the C channels to K keypoints (none when K = C); each
/// keypoint's softmax (divided by a temperature) weighs the positions' coordinates, x and y
/// in [-1, 1] (left/top -1). Output [B, 2K]: x0, y0, x1, y1, ...

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>
#include <string>

#include <anvil/core/error.hpp>

namespace anvil::nn {

/// Expected coordinates of K keypoints over a feature map (see file comment).
class SpatialSoftmaxImpl : public torch::nn::Cloneable<SpatialSoftmaxImpl> {
 public:
  /// `channels` x `height` x `width` in, `keypoints` x 2 out; `temperature` divides the logits.
  SpatialSoftmaxImpl(std::int64_t channels, std::int64_t height, std::int64_t width, std::int64_t keypoints,
                     double temperature = 1.0)
      : c_(channels), h_(height), w_(width), k_(keypoints), temperature_(temperature) {
    if (c_ < 1 || h_ < 1 || w_ < 1 || k_ < 1)
      throw ConfigError("SpatialSoftmax: channels, height, width and keypoints must be positive (got " + std::to_string(c_) +
                        ", " + std::to_string(h_) + ", " + std::to_string(w_) + ", " + std::to_string(k_) + ")");
    if (!(temperature_ > 0)) throw ConfigError("SpatialSoftmax: the temperature must be positive");
    reset();
  }

  void reset() override {
    if (k_ != c_) project = register_module("project", torch::nn::Conv2d(torch::nn::Conv2dOptions(c_, k_, 1)));
    // Each position's (x, y): x along the width, y along the height, both from -1 to 1.
    const auto xs = w_ > 1 ? at::linspace(-1.0, 1.0, w_) : at::zeros({1});
    const auto ys = h_ > 1 ? at::linspace(-1.0, 1.0, h_) : at::zeros({1});
    const auto grid = at::stack({xs.unsqueeze(0).expand({h_, w_}), ys.unsqueeze(1).expand({h_, w_})}, -1);
    positions = register_buffer("positions", grid.reshape({h_ * w_, 2}).contiguous());
  }

  /// [B, C, H, W] -> [B, 2K]; the softmax in float32 (under autocast too: its exponentials
  /// and sums need it).
  at::Tensor forward(const at::Tensor& features) {
    TORCH_CHECK(features.dim() == 4 && features.size(1) == c_ && features.size(2) == h_ && features.size(3) == w_,
                "SpatialSoftmax: expects [B, ", c_, ", ", h_, ", ", w_, "], got ", features.sizes());
    auto h = project ? project->forward(features) : features;
    const auto logits = h.to(at::kFloat).flatten(2) / temperature_;   // [B, K, H*W]
    const auto attention = at::softmax(logits, -1);
    return at::matmul(attention, positions).flatten(1);               // [B, K, 2] -> [B, 2K]
  }

  [[nodiscard]] std::int64_t keypoints() const noexcept { return k_; }
  [[nodiscard]] std::int64_t output_size() const noexcept { return 2 * k_; }

  torch::nn::Conv2d project{nullptr};
  at::Tensor positions;

 private:
  std::int64_t c_, h_, w_, k_;
  double temperature_;
};
TORCH_MODULE(SpatialSoftmax);

}  // namespace anvil::nn
