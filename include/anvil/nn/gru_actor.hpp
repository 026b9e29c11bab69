#pragma once
/// @file
/// `GruActor`: a policy network with memory, for agents that see only part of the world:
/// hidden layers on each step's input, a GRU cell that carries a hidden state through the
/// episode, and a linear output (the recurrent agent of PyMARL's COMA, with hidden layers
/// of our choosing; recurrent PPO's actor and value). The caller owns the hidden state:
/// `step` takes and returns it, and `unroll` runs whole sequences from a given state (zero
/// by default), forgetting where a sequence says an episode starts.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/autocast.hpp>
#include <anvil/core/error.hpp>
#include <anvil/nn/activation.hpp>

namespace anvil::nn {

/// `in -> hidden... (activation after each) -> GRU cell (memory) -> out`. Cloneable.
class GruActorImpl : public torch::nn::Cloneable<GruActorImpl> {
 public:
  GruActorImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t memory, std::int64_t out,
               Activation activation = Activation::relu)
      : in_(in), hidden_(std::move(hidden)), memory_(memory), out_(out), activation_(activation) {
    if (memory_ < 1) throw Error("GruActor: the memory (GRU width) must be at least 1, got " + std::to_string(memory_));
    reset();
  }
  /// (Re)creates the layers with fresh default initialisation (Cloneable's contract).
  void reset() override {
    layers_.clear();
    std::int64_t width = in_;
    for (std::size_t i = 0; i < hidden_.size(); ++i) {
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, hidden_[i])));
      width = hidden_[i];
    }
    cell_ = register_module("gru", torch::nn::GRUCell(width, memory_));
    head_ = register_module("head", torch::nn::Linear(memory_, out_));
  }

  /// One step: the outputs [R, out] and the next hidden state [R, memory] for inputs
  /// [R, in] and the hidden state `h` [R, memory]. Under autocast the hidden layers run in
  /// the reduced dtype; the cell and the output in float32 (the state is carried over many
  /// steps, where bfloat16's 8-bit significand would drift).
  std::pair<at::Tensor, at::Tensor> step(at::Tensor x, const at::Tensor& h) {
    for (auto& layer : layers_) x = activate(layer->forward(x), activation_);
    const Float32Scope float32(x.device().type());
    auto next = cell_->forward(x.to(at::kFloat), h.to(at::kFloat));
    return {head_->forward(next), next};
  }

  /// The outputs [T, R, out] of sequences [T, R, in] (time first), from the state `h0`
  /// [R, memory] (undefined: zero), zeroed again at every step t where `first[t]` ([T, R],
  /// 1/0) marks an episode start. The hidden layers and the output run on every step at
  /// once; only the cell steps through time. With autocast as `step`.
  at::Tensor unroll(const at::Tensor& x, const at::Tensor& first, const at::Tensor& h0 = {}) {
    const auto T = x.size(0), R = x.size(1);
    auto y = x.reshape({T * R, x.size(2)});
    for (auto& layer : layers_) y = activate(layer->forward(y), activation_);
    const Float32Scope float32(x.device().type());
    y = y.to(at::kFloat).view({T, R, y.size(1)});
    auto h = h0.defined() ? h0.to(at::kFloat) : at::zeros({R, memory_}, y.options());
    const auto keep = (1 - first.to(y.device(), at::kFloat)).view({T, R, 1});
    std::vector<at::Tensor> states;
    states.reserve(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) {
      h = cell_->forward(y[t], h * keep[t]);
      states.push_back(h);
    }
    return head_->forward(at::stack(states));
  }

  [[nodiscard]] std::int64_t memory() const noexcept { return memory_; }
  [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }

 private:
  std::int64_t in_;
  std::vector<std::int64_t> hidden_;
  std::int64_t memory_, out_;
  Activation activation_;
  std::vector<torch::nn::Linear> layers_;
  torch::nn::GRUCell cell_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(GruActor);

}  // namespace anvil::nn
