#pragma once
/// @file
/// `GaussianActor`: the tanh-squashed Gaussian policy of SAC (Haarnoja et al. 2018,
/// "Soft Actor-Critic: Off-Policy Maximum Entropy Deep RL with a Stochastic Actor", app. C).

#include <torch/nn/cloneable.h>

#include <cmath>
#include <cstdint>

#include <anvil/core/param.hpp>
#include <anvil/nn/mlp.hpp>

namespace anvil::nn {

/// An action drawn from the policy with its log-density.
struct PolicySample {
  at::Tensor action;    ///< [B, act_dim] in [-1, 1]
  at::Tensor log_prob;  ///< [B], log-density of `action` (change of variables through tanh)
};

/// Maps observations to a diagonal Gaussian over pre-squash actions; actions are
/// tanh(u), so they lie in [-1, 1] (the Trainer rescales them to the env's bounds).
class GaussianActorImpl : public torch::nn::Cloneable<GaussianActorImpl> {
 public:
  /// Network shape, under the algorithm's `actor` section (`sac.actor.hidden=64,64`).
  struct Config {
    Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
    Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};
    Param<double, "log_std_min", "lower bound of the log standard deviation"> log_std_min{-5.0};
    Param<double, "log_std_max", "upper bound of the log standard deviation"> log_std_max{2.0};
  };

  GaussianActorImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }

  void reset() override {
    net_ = register_module("net", Mlp(obs_dim_, widths(cfg_.hidden), 2 * act_dim_, cfg_.activation));
  }

  /// Mean and log standard deviation of the pre-squash Gaussian. The log std is squashed
  /// smoothly into [log_std_min, log_std_max] (a hard clamp would zero its gradient).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs) {
    auto out = net_->forward(obs);
    auto mean = out.narrow(-1, 0, act_dim_);
    auto raw = out.narrow(-1, act_dim_, act_dim_).tanh();
    const double lo = cfg_.log_std_min, hi = cfg_.log_std_max;
    return {mean, raw.mul(0.5 * (hi - lo)).add(0.5 * (hi + lo))};
  }

  /// A reparameterised sample (gradients flow through it) and its log-density, from
  /// standard normal `noise` [B, act_dim]. Taking the noise as an argument keeps an update
  /// reproducible when its parts run on several threads.
  PolicySample sample(const at::Tensor& obs, const at::Tensor& noise) {
    auto [mean, log_std] = forward(obs);
    const auto& eps = noise;
    auto u = mean + eps * log_std.exp();
    // log N(u; mean, std) summed over dims, minus log|d tanh(u)/du|, written with
    // log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) for numerical stability.
    constexpr double kHalfLog2Pi = 0.91893853320467274178;
    auto gauss = (-0.5 * eps.square() - log_std - kHalfLog2Pi).sum(-1);
    auto correction = (2.0 * (std::log(2.0) - u - at::softplus(-2.0 * u))).sum(-1);
    return {u.tanh(), gauss - correction};
  }

  /// `sample` with fresh noise from torch's generator.
  PolicySample sample(const at::Tensor& obs) {
    return sample(obs, at::randn({obs.size(0), act_dim_}, obs.options()));
  }

  /// The deterministic action used for evaluation: tanh of the mean.
  at::Tensor mode(const at::Tensor& obs) { return forward(obs).first.tanh(); }

  [[nodiscard]] std::int64_t action_dim() const noexcept { return act_dim_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp net_{nullptr};
};
TORCH_MODULE(GaussianActor);

}  // namespace anvil::nn
