#pragma once
/// @file
/// `GaussianActor`: the tanh-squashed Gaussian policy of SAC (Haarnoja et al. 2018,
/// "Soft Actor-Critic: Off-Policy Maximum Entropy Deep RL with a Stochastic Actor", app. C).

#include <torch/nn/cloneable.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <anvil/core/param.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/observation_encoder.hpp>

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
  using Config = GaussianActorConfig;

  GaussianActorImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }

  void reset() override {
    // Several heads read the task's one-hot, the observation's last `heads` numbers.
    net_ = register_module("net", Mlp(obs_dim_, widths(cfg_.hidden), 2 * act_dim_, cfg_.activation,
                                      MlpHeads{.count = cfg_.heads, .at = obs_dim_ - cfg_.heads}));
  }

  /// Mean and log standard deviation of the pre-squash Gaussian. The log std is squashed
  /// smoothly into [log_std_min, log_std_max] (a hard clamp would zero its gradient).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs) {
    auto out = net_->forward(encoder_ && obs.scalar_type() == at::kByte ? encoder_->forward(obs).detach() : obs);
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
    return sample(obs, at::randn({obs.size(0), act_dim_}, obs.options().dtype(at::kFloat)));
  }

  /// The deterministic action used for evaluation: tanh of the mean.
  at::Tensor mode(const at::Tensor& obs) { return forward(obs).first.tanh(); }

  [[nodiscard]] std::int64_t action_dim() const noexcept { return act_dim_; }
  /// The network from observations to [mean, raw log std].
  [[nodiscard]] const Mlp& net() const noexcept { return net_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

  /// Reads observations through `encoder` (rows of parts, e.g. images), the critic's: its
  /// features with the gradient stopped, so the actor's loss does not train the encoder
  /// (DrQ, Kostrikov et al. 2020; SAC-AE, Yarats et al. 2019). Not a submodule: the
  /// encoder's parameters are the critic's, not the actor's. `obs_dim` was its output size;
  /// the actor takes rows of bytes or their features (see ObsEncoder).
  void share_encoder(ObsEncoder encoder) { encoder_ = std::move(encoder); }
  [[nodiscard]] ObsEncoder encoder() const noexcept { return encoder_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp net_{nullptr};
  ObsEncoder encoder_{nullptr};
};
TORCH_MODULE(GaussianActor);

namespace detail {

// The element-wise part of `GaussianActorTape::sample` for rows [mean | pre-log-std] of `o`
// [batch, 2 ad] and standard-normal `eps` [batch, ad]: t = tanh(pre-log-std), sd =
// exp(log_std), a = tanh(mean + eps sd) (also written to `action` with row stride
// `stride`), lp = each row's log-density. One loop per action column, over the rows, which
// the compiler vectorises (with the simd:: approximations of exp, tanh and log).
ANVIL_SIMD_KERNEL(squashed_gaussian,
                  (const float* __restrict o, const float* __restrict eps, float* __restrict t, float* __restrict sd,
                   float* __restrict a, float* __restrict lp, float* __restrict action, std::int64_t stride,
                   std::int64_t batch, std::int64_t ad, float k, float c),
                  (o, eps, t, sd, a, lp, action, stride, batch, ad, k, c), {
                    constexpr float kHalfLog2Pi = 0.91893853320467274178f, kLog2 = 0.69314718055994530942f;
                    for (std::int64_t i = 0; i < batch; ++i) lp[i] = 0.f;
                    for (std::int64_t j = 0; j < ad; ++j)
                      for (std::int64_t i = 0; i < batch; ++i) {
                        const std::int64_t ij = i * ad + j;
                        const float mean = o[i * 2 * ad + j];
                        const float th = simd::tanh_approx(o[i * 2 * ad + ad + j]);
                        const float log_std = k * th + c;
                        const float s = simd::exp_approx(log_std);
                        const float e = eps[ij];
                        const float u = mean + e * s;
                        const float act = simd::tanh_approx(u);
                        // softplus(-2u), stable for either sign of u
                        const float au = u < 0.f ? -u : u;
                        const float sp = (u < 0.f ? -2.f * u : 0.f) + simd::log_approx(1.0f + simd::exp_approx(-2.f * au));
                        lp[i] += -0.5f * e * e - log_std - kHalfLog2Pi - 2.f * (kLog2 - u - sp);
                        t[ij] = th;
                        sd[ij] = s;
                        a[ij] = act;
                        action[i * stride + j] = act;
                      }
                  })

}  // namespace detail

/// `GaussianActor::sample` and its backward written out by hand, for float32 on the CPU (see
/// nn/manual_mlp.hpp for why). The same arithmetic as `sample`; run under NoGradGuard.
class GaussianActorTape {
 public:
  static bool supports(const GaussianActorImpl& a) { return unsupported(a).empty(); }
  /// Why `a` cannot run on a tape, or "" when it can.
  static std::string unsupported(const GaussianActorImpl& a) {
    if (a.encoder()) return "input comes through a convolutional encoder (images)";
    return MlpTape::unsupported(*a.net());
  }

  /// Draws actions like `sample(obs, noise)` and writes them into `action`, row i at
  /// `action + i * stride` (so they can land inside a critic's input rows). The
  /// log-densities are in `log_prob()` until the next call.
  void sample(const GaussianActorImpl& actor, const at::Tensor& obs, const at::Tensor& noise,
              float* action, std::int64_t stride) {
    const auto& out = net_.forward(*actor.net(), obs);
    const std::int64_t batch = obs.size(0), ad = actor.action_dim();
    if (log_prob_.numel() != batch || t_.size(1) != ad) {
      log_prob_ = at::empty({batch}, obs.options());
      t_ = at::empty({batch, ad}, obs.options());
      std_ = at::empty({batch, ad}, obs.options());
      a_ = at::empty({batch, ad}, obs.options());
      dout_ = at::empty({batch, 2 * ad}, obs.options());
    }
    noise_ = noise;
    const double lo = actor.config().log_std_min, hi = actor.config().log_std_max;
    const float k = static_cast<float>(0.5 * (hi - lo)), c = static_cast<float>(0.5 * (hi + lo));
    detail::squashed_gaussian(out.data_ptr<float>(), noise.data_ptr<float>(), t_.data_ptr<float>(),
                              std_.data_ptr<float>(), a_.data_ptr<float>(), log_prob_.data_ptr<float>(), action, stride,
                              batch, ad, k, c);
  }

  /// The deterministic action tanh(mean), written like `sample`'s.
  void mode(const GaussianActorImpl& actor, const at::Tensor& obs, float* action, std::int64_t stride) {
    const auto& out = net_.forward(*actor.net(), obs);
    const std::int64_t batch = obs.size(0), ad = actor.action_dim();
    const float* o = out.data_ptr<float>();
    for (std::int64_t i = 0; i < batch; ++i)
      for (std::int64_t j = 0; j < ad; ++j) action[i * stride + j] = simd::tanh_approx(o[i * 2 * ad + j]);
  }

  [[nodiscard]] const at::Tensor& log_prob() const noexcept { return log_prob_; }

  /// Backpropagates a loss through the last `sample`: `d_action` [B, act_dim] is dL/daction
  /// and every log-density has dL/dlog_prob = `d_log_prob` (or row i `d_log_prob_rows[i]`
  /// when given). Writes the network's parameter
  /// gradients into `grads` (as `MlpTape::backward`).
  void backward(const GaussianActorImpl& actor, const at::Tensor& d_action, float d_log_prob,
                std::vector<at::Tensor>& grads, const float* d_log_prob_rows = nullptr) {
    const std::int64_t batch = a_.size(0), ad = a_.size(1);
    const double lo = actor.config().log_std_min, hi = actor.config().log_std_max;
    const float k = static_cast<float>(0.5 * (hi - lo));
    const float *t = t_.data_ptr<float>(), *sd = std_.data_ptr<float>(), *a = a_.data_ptr<float>();
    const float *eps = noise_.data_ptr<float>(), *da = d_action.data_ptr<float>();
    float* d = dout_.data_ptr<float>();
    for (std::int64_t i = 0; i < batch; ++i)
      for (std::int64_t j = 0; j < ad; ++j) {
        const std::int64_t ij = i * ad + j;
        const float dlp = d_log_prob_rows ? d_log_prob_rows[i] : d_log_prob;
        // log_prob depends on u through the tanh correction: d/du = 2 tanh(u).
        const float du = da[ij] * (1.f - a[ij] * a[ij]) + dlp * 2.f * a[ij];
        // u = mean + eps * exp(log_std); log_prob has -log_std.
        const float dlog_std = du * eps[ij] * sd[ij] - dlp;
        d[i * 2 * ad + j] = du;
        d[i * 2 * ad + ad + j] = dlog_std * k * (1.f - t[ij] * t[ij]);
      }
    net_.backward(*actor.net(), dout_, &grads, nullptr);
  }

 private:
  MlpTape net_;
  at::Tensor noise_, log_prob_, t_, std_, a_, dout_;
};

}  // namespace anvil::nn
