#pragma once
/// @file
/// `Mlp`: a multilayer perceptron with configurable widths and activation.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/autocast.hpp>
#include <anvil/nn/activation.hpp>

namespace anvil::nn {

/// Fully connected network `in -> hidden... -> out`, activation after every hidden layer,
/// none after the output. Cloneable, so target networks are deep copies.
class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  MlpImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t out,
          Activation activation = Activation::relu)
      : in_(in), hidden_(std::move(hidden)), out_(out), activation_(activation) {
    reset();
  }

  /// (Re)creates the layers with fresh default initialisation (Cloneable's contract).
  void reset() override {
    layers_.clear();
    std::int64_t width = in_;
    for (std::size_t i = 0; i <= hidden_.size(); ++i) {
      const std::int64_t next = i < hidden_.size() ? hidden_[i] : out_;
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, next)));
      width = next;
    }
  }

  /// Under autocast (BF16, FP16) the hidden layers run in the reduced dtype and the output
  /// layer in float32: outputs such as Q-values of several hundred need float32's 24-bit
  /// significand, since bfloat16 keeps 8 bits (steps of 2 to 4 at |Q| = 500, larger than
  /// a typical reward), and the output layer is a small part of the network's work.
  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) x = activate(layers_[i]->forward(x), activation_);
    const Float32Scope float32(x.device().type());
    return layers_.back()->forward(float32.active() ? x.to(at::kFloat) : x);
  }

  /// The output layer, e.g. to rescale its initial weights.
  torch::nn::Linear& output_layer() { return layers_.back(); }
  /// All layers, input first.
  [[nodiscard]] const std::vector<torch::nn::Linear>& layers() const noexcept { return layers_; }
  [[nodiscard]] Activation activation() const noexcept { return activation_; }
  [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }

 private:
  std::int64_t in_;
  std::vector<std::int64_t> hidden_;
  std::int64_t out_;
  Activation activation_;
  std::vector<torch::nn::Linear> layers_;
};
TORCH_MODULE(Mlp);

/// Converts config widths (int) to the int64 layer sizes torch takes.
inline std::vector<std::int64_t> widths(const std::vector<int>& w) { return {w.begin(), w.end()}; }

}  // namespace anvil::nn
