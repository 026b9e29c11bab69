#pragma once
/// @file
/// `TwinQ`: two independent Q-networks (clipped double Q, Fujimoto et al. 2018, as used by
/// SAC: Haarnoja et al. 2018).

#include <torch/nn/cloneable.h>

#include <cstdint>
#include <utility>

#include <anvil/core/param.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/observation_encoder.hpp>

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
    // Several heads read the task's one-hot, the observation's last `heads` numbers (the
    // action follows the observation in each network's input).
    const MlpHeads heads{.count = cfg_.heads, .at = obs_dim_ - cfg_.heads};
    q1_ = register_module("q1", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation, heads));
    q2_ = register_module("q2", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation, heads));
    // A clone rebuilds its own encoder here (the copy's holder still names the original's),
    // and copies the original's weights into it.
    if (encoder_) encoder_ = register_module("encoder", ObsEncoder(encoder_->layout(), encoder_->kind(), encoder_->features(), encoder_->width()));
  }

  /// Reads observations through `encoder` (rows of parts, e.g. images), a submodule: the
  /// critic's loss trains it, and the target critic, a clone, has its own. `obs_dim` was
  /// its output size; `forward` takes rows of bytes or their features (see ObsEncoder). Set once, before the optimizer is built over the parameters.
  void set_encoder(ObsEncoder encoder) {
    encoder_ = register_module("encoder", std::move(encoder));
  }
  [[nodiscard]] ObsEncoder encoder() const noexcept { return encoder_; }
  /// Whether `forward` encodes `obs`: rows of bytes with an encoder (floats are features
  /// already encoded, see ObsEncoder).
  [[nodiscard]] bool encodes(const at::Tensor& obs) const noexcept { return encoder_ && obs.scalar_type() == at::kByte; }

  /// Both estimates, each [B].
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs, const at::Tensor& action) {
    auto x = at::cat({encodes(obs) ? encoder_->forward(obs) : obs, action}, -1);
    return {q1_->forward(x).squeeze(-1), q2_->forward(x).squeeze(-1)};
  }

  /// The two Q-networks; each takes the observation and the action concatenated, in that order.
  [[nodiscard]] const Mlp& q1() const noexcept { return q1_; }
  [[nodiscard]] const Mlp& q2() const noexcept { return q2_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp q1_{nullptr}, q2_{nullptr};
  ObsEncoder encoder_{nullptr};
};
TORCH_MODULE(TwinQ);

}  // namespace anvil::nn
