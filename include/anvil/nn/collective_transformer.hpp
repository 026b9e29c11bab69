#pragma once
/// @file
/// `CollectiveTransformer`: the collective network of collective distillation. A
/// Transformer encoder reads a short history of a task, H tokens of (state, action,
/// reward), and writes a task representation; a policy head (tanh-Gaussian, as SAC's actor)
/// and a twin Q head read [representation, state] (and the action, for Q).
///
/// The encoder is written here from linear layers and matrix products rather than with
/// LibTorch's `nn::TransformerEncoderLayer`, because in LibTorch 1.13's C++ API that layer
/// is post-norm only (no `norm_first`) and sequence-first, and under autocast its layer
/// norms and softmax would run in bfloat16 on the CPU; here the blocks are pre-norm (they
/// train without a learning-rate warm-up), batch-first, the norms and the softmax run in
/// float32 under autocast, and the same code runs on LibTorch 1.13 and 2.x.
///
/// A learned summary token is prepended to the history and the representation is its
/// output (a layer-normed [B, d_model]); it is always attended to, so an empty history
/// (the first step of an episode) gives the learned "no context yet" representation.
/// History tokens where `mask` is 0 (before the episode began) are not attended to.

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/autocast.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/nn/activation.hpp>
#include <anvil/nn/mlp.hpp>

namespace anvil::nn {

class CollectiveTransformerImpl : public torch::nn::Cloneable<CollectiveTransformerImpl> {
 public:
  struct Config {
    Param<int, "d_model", "width of the tokens and the task representation", at_least(8)> d_model{64};
    Param<int, "heads", "attention heads (d_model must divide by it)", at_least(1)> heads{4};
    Param<int, "layers", "Transformer blocks", at_least(1)> layers{2};
    Param<int, "feedforward", "width of each block's feed-forward layer", at_least(1)> feedforward{128};
    Param<std::vector<int>, "hidden", "hidden widths of the policy and Q heads", at_least(1)> hidden{256, 256};
    Param<Activation, "activation", "hidden-layer activation of the heads"> activation{Activation::relu};
    Param<double, "log_std_min", "lower bound of the policy's log standard deviation"> log_std_min{-5.0};
    Param<double, "log_std_max", "upper bound of the policy's log standard deviation"> log_std_max{2.0};
  };

  /// For states of `obs_dim`, actions of `act_dim` and histories of `history` tokens.
  CollectiveTransformerImpl(std::int64_t obs_dim, std::int64_t act_dim, std::int64_t history, const Config& cfg)
      : od_(obs_dim), ad_(act_dim), h_(history), cfg_(cfg) {
    if (cfg.d_model % cfg.heads != 0)
      throw ConfigError("d_model (" + std::to_string(*cfg.d_model) + ") does not divide by heads (" + std::to_string(*cfg.heads) + ")");
    reset();
  }

  void reset() override {
    const std::int64_t d = cfg_.d_model;
    embed_ = register_module("embed", torch::nn::Linear(token_dim(), d));
    position_ = register_parameter("position", torch::randn({h_ + 1, d}) * 0.02);
    summary_ = register_parameter("summary", torch::randn({1, 1, d}) * 0.02);
    blocks_.clear();
    for (int l = 0; l < cfg_.layers; ++l) {
      Block b;
      const std::string p = "block" + std::to_string(l) + "_";
      b.norm1 = register_module(p + "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
      b.qkv = register_module(p + "qkv", torch::nn::Linear(d, 3 * d));
      b.out = register_module(p + "out", torch::nn::Linear(d, d));
      b.norm2 = register_module(p + "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
      b.ff1 = register_module(p + "ff1", torch::nn::Linear(d, cfg_.feedforward));
      b.ff2 = register_module(p + "ff2", torch::nn::Linear(cfg_.feedforward, d));
      blocks_.push_back(b);
    }
    final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    policy_ = register_module("policy", Mlp(d + od_, widths(cfg_.hidden), 2 * ad_, cfg_.activation));
    q1_ = register_module("q1", Mlp(d + od_ + ad_, widths(cfg_.hidden), 1, cfg_.activation));
    q2_ = register_module("q2", Mlp(d + od_ + ad_, widths(cfg_.hidden), 1, cfg_.activation));
    shift_ = register_buffer("obs_shift", torch::zeros({od_}));
    scale_ = register_buffer("obs_scale", torch::ones({od_}));
  }

  /// States are normalised as (s - shift) * scale before use (in the history tokens too):
  /// the dataset's ranges mapped onto [-1, 1] (see CollectiveDistillation::fit_normalizer).
  void set_normalizer(const at::Tensor& shift, const at::Tensor& scale) {
    torch::NoGradGuard no_grad;
    shift_.copy_(shift.reshape({od_}));
    scale_.copy_(scale.reshape({od_}));
  }
  [[nodiscard]] const at::Tensor& obs_shift() const noexcept { return shift_; }
  [[nodiscard]] const at::Tensor& obs_scale() const noexcept { return scale_; }

  /// The task representation [B, d_model] (float32) of histories `tokens` [B, H, od + ad + 1]
  /// with `mask` [B, H] (1: the token is part of the history).
  at::Tensor represent(const at::Tensor& tokens, const at::Tensor& mask) {
    const std::int64_t b = tokens.size(0), d = cfg_.d_model, heads = cfg_.heads, dh = d / heads;
    const auto t = at::cat({normalise(tokens.narrow(-1, 0, od_)), tokens.narrow(-1, od_, ad_ + 1)}, -1);
    auto x = at::cat({summary_.expand({b, 1, d}).to(t.scalar_type()), embed_->forward(t).to(t.scalar_type())}, 1);
    x = x + position_.to(x.scalar_type());
    // Keys that may be attended to: the summary and the history's valid tokens.
    const auto keep = at::cat({at::ones({b, 1}, mask.options()), mask}, 1).to(at::kFloat);
    const auto bias = ((1.0 - keep) * -1e9).view({b, 1, 1, h_ + 1});
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (auto& blk : blocks_) {
      auto qkv = blk.qkv->forward(norm(blk.norm1, x)).view({b, h_ + 1, 3, heads, dh}).permute({2, 0, 3, 1, 4});
      auto q = qkv[0], k = qkv[1], v = qkv[2];  // [B, heads, T, dh]
      auto att = (at::matmul(q, k.transpose(-2, -1)).to(at::kFloat) * scale + bias).softmax(-1);
      auto y = at::matmul(att.to(v.scalar_type()), v).permute({0, 2, 1, 3}).reshape({b, h_ + 1, d});
      x = x + blk.out->forward(y).to(x.scalar_type());
      x = x + blk.ff2->forward(at::gelu(blk.ff1->forward(norm(blk.norm2, x)))).to(x.scalar_type());
    }
    return norm(final_norm_, x.select(1, 0));
  }

  /// Mean and log standard deviation (squashed into [log_std_min, log_std_max]) of the
  /// pre-tanh Gaussian at `state` [B, od] for representation `rep`.
  std::pair<at::Tensor, at::Tensor> policy(const at::Tensor& rep, const at::Tensor& state) {
    auto out = policy_->forward(at::cat({rep.to(state.scalar_type()), normalise(state)}, -1));
    auto mean = out.narrow(-1, 0, ad_);
    auto raw = out.narrow(-1, ad_, ad_).tanh();
    const double lo = cfg_.log_std_min, hi = cfg_.log_std_max;
    return {mean, raw.mul(0.5 * (hi - lo)).add(0.5 * (hi + lo))};
  }
  /// Both Q estimates [B] of `action` at `state`.
  std::pair<at::Tensor, at::Tensor> q(const at::Tensor& rep, const at::Tensor& state, const at::Tensor& action) {
    auto in = at::cat({rep.to(state.scalar_type()), normalise(state), action.to(state.scalar_type())}, -1);
    return {q1_->forward(in).squeeze(-1), q2_->forward(in).squeeze(-1)};
  }

  /// The tanh-Gaussian log-density [B] of actions `action` in (-1, 1) under (mean, log_std).
  static at::Tensor log_prob(const at::Tensor& mean, const at::Tensor& log_std, const at::Tensor& action) {
    constexpr double kHalfLog2Pi = 0.91893853320467274178;
    const auto a = action.to(at::kFloat).clamp(-1.0 + 1e-6, 1.0 - 1e-6);
    const auto u = at::atanh(a);
    const auto m = mean.to(at::kFloat), ls = log_std.to(at::kFloat);
    const auto z = (u - m) * (-ls).exp();
    return (-0.5 * z.square() - ls - kHalfLog2Pi).sum(-1) - at::log1p(-a.square()).sum(-1);
  }

  [[nodiscard]] std::int64_t obs_dim() const noexcept { return od_; }
  [[nodiscard]] std::int64_t act_dim() const noexcept { return ad_; }
  [[nodiscard]] std::int64_t history() const noexcept { return h_; }
  [[nodiscard]] std::int64_t token_dim() const noexcept { return od_ + ad_ + 1; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  struct Block {
    torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
    torch::nn::Linear qkv{nullptr}, out{nullptr}, ff1{nullptr}, ff2{nullptr};
  };
  [[nodiscard]] at::Tensor normalise(const at::Tensor& s) const { return (s - shift_.to(s.scalar_type())) * scale_.to(s.scalar_type()); }
  // Layer norm in float32 (under autocast too); the result in float32.
  static at::Tensor norm(torch::nn::LayerNorm& ln, const at::Tensor& x) {
    const Float32Scope float32(x.device().type());
    return ln->forward(x.to(at::kFloat));
  }

  std::int64_t od_, ad_, h_;
  Config cfg_;
  torch::nn::Linear embed_{nullptr};
  at::Tensor position_, summary_, shift_, scale_;
  std::vector<Block> blocks_;
  torch::nn::LayerNorm final_norm_{nullptr};
  Mlp policy_{nullptr}, q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(CollectiveTransformer);

}  // namespace anvil::nn
