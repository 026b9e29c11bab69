#pragma once
/// @file
/// `TwinQ`: two independent Q-networks (clipped double Q, Fujimoto et al. 2018, as used by
/// SAC: Haarnoja et al. 2018).

#include <torch/nn/cloneable.h>

#include <cstdint>
#include <utility>

#include <anvil/core/param.hpp>
#include <anvil/nn/mlp.hpp>

namespace anvil::nn {

/// Q(s, a) twice, from two networks with separate weights; the minimum of the two
/// counters the overestimation a single maximised Q-network suffers.
class TwinQImpl : public torch::nn::Cloneable<TwinQImpl> {
 public:
  using Config = TwinQConfig;

  TwinQImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }

  void reset() override {
    q1_ = register_module("q1", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation));
    q2_ = register_module("q2", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation));
  }

  /// Both estimates, each [B].
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs, const at::Tensor& action) {
    auto x = at::cat({obs, action}, -1);
    return {q1_->forward(x).squeeze(-1), q2_->forward(x).squeeze(-1)};
  }

  /// The two Q-networks; each takes the observation and the action concatenated, in that order.
  [[nodiscard]] const Mlp& q1() const noexcept { return q1_; }
  [[nodiscard]] const Mlp& q2() const noexcept { return q2_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(TwinQ);

}  // namespace anvil::nn
