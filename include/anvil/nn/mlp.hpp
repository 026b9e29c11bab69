#pragma once
/// @file
/// `Mlp`: a multilayer perceptron with configurable widths and activation.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/autocast.hpp>
#include <anvil/core/error.hpp>
#include <anvil/nn/activation.hpp>

namespace anvil::nn {

/// An `Mlp`'s output heads: `count` output layers in one (rows [k out, (k + 1) out) of
/// the output layer are head k), each input row taking the head its one-hot in columns
/// [at, at + count) names (its one positive number, so a one-hot normalised per column
/// still names it): a task's, as a multi-task env's observations end in (the multi-head
/// SAC of Yu et al. 2019, "Meta-World", arXiv:1910.10897). One head: a plain MLP.
struct MlpHeads {
  std::int64_t count = 1;
  std::int64_t at = 0;
};

/// Fully connected network `in -> hidden... -> out`, activation after every hidden layer,
/// none after the output. Cloneable, so target networks are deep copies.
class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  MlpImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t out,
          Activation activation = Activation::relu, MlpHeads heads = {})
      : in_(in), hidden_(std::move(hidden)), out_(out), activation_(activation), heads_(heads) {
    if (heads_.count < 1 || heads_.at < 0 || heads_.at + heads_.count > in_)
      throw ConfigError("Mlp: " + std::to_string(heads_.count) + " heads read input columns " +
                        std::to_string(heads_.at) + " to " + std::to_string(heads_.at + heads_.count - 1) +
                        ", but the input has " + std::to_string(in_));
    reset();
  }

  /// (Re)creates the layers with fresh default initialisation (Cloneable's contract).
  void reset() override {
    layers_.clear();
    std::int64_t width = in_;
    for (std::size_t i = 0; i <= hidden_.size(); ++i) {
      const std::int64_t next = i < hidden_.size() ? hidden_[i] : out_ * heads_.count;
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, next)));
      width = next;
    }
  }

  /// Under autocast (BF16, FP16) the hidden layers run in the reduced dtype and the output
  /// layer in float32: outputs such as Q-values of several hundred need float32's 24-bit
  /// significand, since bfloat16 keeps 8 bits (steps of 2 to 4 at |Q| = 500, larger than
  /// a typical reward), and the output layer is a small part of the network's work.
  /// With several heads, each row's output is its head's (see `MlpHeads`).
  at::Tensor forward(at::Tensor x) {
    const at::Tensor input = x;
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) x = activate(layers_[i]->forward(x), activation_);
    const Float32Scope float32(x.device().type());
    auto y = layers_.back()->forward(float32.active() ? x.to(at::kFloat) : x);
    if (heads_.count == 1) return y;
    // [..., H out] -> [..., H, out], then each row's head: the one-hot's position.
    auto sizes = y.sizes().vec();
    sizes.back() = heads_.count;
    sizes.push_back(out_);
    const auto one_hot = input.narrow(-1, heads_.at, heads_.count);
    // A row's head is its one-hot's one positive number (also once normalised per column),
    // checked where that costs no device sync.
    if (one_hot.device().is_cpu() && !one_hot.gt(0).sum(-1).eq(1).all().item<bool>())
      throw Error("Mlp with " + std::to_string(heads_.count) + " heads: input columns " + std::to_string(heads_.at) +
                  " to " + std::to_string(heads_.at + heads_.count - 1) +
                  " are not a one-hot in every row: a row has no positive number or several (the observation must "
                  "end in its task's one-hot)");
    auto index = one_hot.argmax(-1, /*keepdim=*/true).unsqueeze(-1);  // [..., 1, 1]
    auto pick = sizes;
    pick[pick.size() - 2] = 1;
    return y.view(sizes).gather(-2, index.expand(pick)).squeeze(-2);
  }

  /// The output layer, e.g. to rescale its initial weights.
  torch::nn::Linear& output_layer() { return layers_.back(); }
  /// All layers, input first.
  [[nodiscard]] const std::vector<torch::nn::Linear>& layers() const noexcept { return layers_; }
  [[nodiscard]] Activation activation() const noexcept { return activation_; }
  [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
  /// One head's outputs (the output layer has `heads().count` times as many).
  [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }
  [[nodiscard]] const MlpHeads& heads() const noexcept { return heads_; }

 private:
  std::int64_t in_;
  std::vector<std::int64_t> hidden_;
  std::int64_t out_;
  Activation activation_;
  MlpHeads heads_;
  std::vector<torch::nn::Linear> layers_;
};
TORCH_MODULE(Mlp);

/// Converts config widths (int) to the int64 layer sizes torch takes.
inline std::vector<std::int64_t> widths(const std::vector<int>& w) { return {w.begin(), w.end()}; }

}  // namespace anvil::nn
