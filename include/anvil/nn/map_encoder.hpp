#pragma once
/// @file
/// `MapEncoder`: reads vectors that carry maps (a multi-agent env's map channels,
/// `MapShape`, at known offsets) through a CNN and passes the rest of each vector as it
/// is: [..., d] -> [..., output_size()], the CNN's features followed by the other numbers
/// in their order. The maps of one vector (e.g. the state's and an agent's observation's,
/// for a critic) share their height and width and are stacked on their channels into one
/// CNN input. The CNN is Westheider et al.'s (IROS 2023; dmar-bonn/ipp-marl, actor/network.py
/// and critic/network.py): three convolutions, 5x5, 4x4 and 4x4, stride 1, no padding,
/// `channels` wide, each followed by ReLU, flattened (11 x 11 maps: 1 x 1 x channels).

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil::nn {

/// Maps at `offset` numbers into a vector.
struct MapSegment {
  std::int64_t offset = 0;
  MapShape shape;
};

class MapEncoderImpl : public torch::nn::Cloneable<MapEncoderImpl> {
 public:
  static constexpr std::array<std::int64_t, 3> kKernels{5, 4, 4};

  MapEncoderImpl(std::int64_t input_size, std::vector<MapSegment> maps, std::int64_t channels)
      : input_size_(input_size), maps_(std::move(maps)), channels_(channels) {
    if (maps_.empty()) throw ConfigError("MapEncoder: no maps to encode");
    std::int64_t h = maps_.front().shape.height, w = maps_.front().shape.width;
    for (const auto& m : maps_) {
      if (m.shape.height != h || m.shape.width != w)
        throw ConfigError("MapEncoder: maps of " + std::to_string(h) + " x " + std::to_string(w) + " and " +
                          std::to_string(m.shape.height) + " x " + std::to_string(m.shape.width) +
                          " cannot be stacked into one CNN input");
      if (m.offset < 0 || m.offset + m.shape.numel() > input_size_)
        throw ConfigError("MapEncoder: maps at " + std::to_string(m.offset) + " overrun a vector of " + std::to_string(input_size_));
      in_channels_ += m.shape.channels;
    }
    for (auto k : kKernels) h -= k - 1, w -= k - 1;
    if (h < 1 || w < 1)
      throw ConfigError("MapEncoder: maps of " + std::to_string(maps_.front().shape.height) + " x " +
                        std::to_string(maps_.front().shape.width) + " are too small for its 5x5, 4x4, 4x4 convolutions (at least 11 x 11)");
    features_ = channels_ * h * w;
    reset();
  }

  void reset() override {
    convs_.clear();
    std::int64_t in = in_channels_;
    for (std::size_t i = 0; i < kKernels.size(); ++i) {
      convs_.push_back(register_module("conv" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(in, channels_, kKernels[i]))));
      in = channels_;
    }
    std::vector<std::int64_t> rest;
    std::vector<bool> in_map(static_cast<std::size_t>(input_size_), false);
    for (const auto& m : maps_)
      for (std::int64_t i = 0; i < m.shape.numel(); ++i) in_map[static_cast<std::size_t>(m.offset + i)] = true;
    for (std::int64_t i = 0; i < input_size_; ++i)
      if (!in_map[static_cast<std::size_t>(i)]) rest.push_back(i);
    rest_ = register_buffer("rest", at::tensor(rest, at::TensorOptions().dtype(at::kLong)));
  }

  /// [..., input_size] -> [..., output_size()].
  at::Tensor forward(const at::Tensor& x) {
    auto lead = x.sizes().vec();
    lead.pop_back();
    const auto flat = x.reshape({-1, input_size_});
    const auto n = flat.size(0);
    const auto& s = maps_.front().shape;
    std::vector<at::Tensor> planes;
    for (const auto& m : maps_) planes.push_back(flat.narrow(1, m.offset, m.shape.numel()).reshape({n, m.shape.channels, s.height, s.width}));
    auto y = planes.size() == 1 ? planes.front() : at::cat(planes, 1);
    for (auto& c : convs_) y = c->forward(y).relu();
    auto out = at::cat({y.reshape({n, features_}), flat.index_select(1, rest_.to(flat.device()))}, 1);
    lead.push_back(output_size());
    return out.reshape(lead);
  }

  [[nodiscard]] std::int64_t output_size() const noexcept { return features_ + rest_.numel(); }
  [[nodiscard]] std::int64_t input_size() const noexcept { return input_size_; }
  [[nodiscard]] std::int64_t in_channels() const noexcept { return in_channels_; }
  [[nodiscard]] std::int64_t channels() const noexcept { return channels_; }
  [[nodiscard]] const std::vector<MapSegment>& maps() const noexcept { return maps_; }

 private:
  std::int64_t input_size_;
  std::vector<MapSegment> maps_;
  std::int64_t channels_, in_channels_ = 0, features_ = 0;
  std::vector<torch::nn::Conv2d> convs_;
  at::Tensor rest_;
};
TORCH_MODULE(MapEncoder);

}  // namespace anvil::nn
