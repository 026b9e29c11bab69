#pragma once
/// @file
/// What PPO and recurrent PPO share, written once: the clipped objective of a minibatch
/// from the policy's log-probabilities, entropies and values of its rows
/// (`clipped_objective`), its parts for logs (`PpoLosses`), and the optimizer with its
/// schedule and state (`PpoOptimizer`): the learning rate annealed over the run, each
/// epoch's KL early stop agreed over the ranks, the averaged weights and what checkpoints
/// keep.

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil::detail {

/// The parts of PPO's loss, for logs: means over a (micro-)batch.
struct PpoLosses {
  double policy = 0, value = 0, entropy = 0, approx_kl = 0, clip_fraction = 0;
  void add(const PpoLosses& o, double w) {
    policy += w * o.policy;
    value += w * o.value;
    entropy += w * o.entropy;
    approx_kl += w * o.approx_kl;
    clip_fraction += w * o.clip_fraction;
  }
  /// The parts from `clipped_objective_parts`'s tensor (read on the host: a device tensor
  /// is copied back once).
  static PpoLosses of(const at::Tensor& parts) {
    const auto h = parts.to(at::kCPU, at::kDouble).contiguous();
    const double* v = h.data_ptr<double>();
    return {.policy = v[2], .value = v[3], .entropy = v[4], .approx_kl = v[0], .clip_fraction = v[1]};
  }
  /// As an update's metrics.
  [[nodiscard]] std::vector<std::pair<std::string, double>> metrics() const {
    return {{"policy_loss", policy}, {"value_loss", value}, {"entropy", entropy},
            {"approx_kl", approx_kl}, {"clip_fraction", clip_fraction}};
  }
};

/// PPO's loss of a (micro-)batch `b`: the clipped surrogate + vf_coef * the value loss
/// (clipped with `clip_value`) - ent_coef * the mean entropy, from the current policy's
/// `log_prob`, `entropy` and value `v` of its rows ([B] each, float32), and its parts as a
/// float64 tensor [5] (approximate KL, clip fraction, policy loss, value loss, entropy:
/// `PpoLosses::of` reads them), with no value read back to the host: what a CUDA graph can
/// hold. `Cfg` has PPO's fields (clip, clip_value, vf_coef, ent_coef).
template <class Cfg>
std::pair<at::Tensor, at::Tensor> clipped_objective_parts(const at::Tensor& log_prob, const at::Tensor& entropy,
                                                          const at::Tensor& v, const RolloutBatch& b, const Cfg& cfg) {
  const auto log_ratio = log_prob - b.log_prob;
  const auto ratio = log_ratio.exp();
  const double c = cfg.clip;
  const auto policy_loss = at::max(-b.advantage * ratio, -b.advantage * ratio.clamp(1.0 - c, 1.0 + c)).mean();
  at::Tensor value_loss;
  if (cfg.clip_value > 0) {
    const auto clipped = b.value + (v - b.value).clamp(-*cfg.clip_value, *cfg.clip_value);
    value_loss = 0.5 * at::max((v - b.returns).square(), (clipped - b.returns).square()).mean();
  } else {
    value_loss = 0.5 * (v - b.returns).square().mean();
  }
  const auto ent = entropy.mean();
  auto loss = policy_loss + *cfg.vf_coef * value_loss - *cfg.ent_coef * ent;
  torch::NoGradGuard no_grad;
  // KL(old || new) estimated as E[(r - 1) - log r], unbiased and never negative.
  const auto approx_kl = ((ratio - 1.0) - log_ratio).mean();
  const auto clip_fraction = ((ratio - 1.0).abs() > c).to(at::kFloat).mean();
  auto parts = at::stack({approx_kl.to(at::kDouble), clip_fraction.to(at::kDouble), policy_loss.detach().to(at::kDouble),
                          value_loss.detach().to(at::kDouble), ent.detach().to(at::kDouble)});
  return {loss, parts};
}

/// `clipped_objective_parts` with its parts read into `out` (one copy to the host).
template <class Cfg>
at::Tensor clipped_objective(const at::Tensor& log_prob, const at::Tensor& entropy, const at::Tensor& v,
                             const RolloutBatch& b, const Cfg& cfg, PpoLosses& out) {
  auto [loss, parts] = clipped_objective_parts(log_prob, entropy, v, b, cfg);
  out = PpoLosses::of(parts);
  return loss;
}

/// Log-densities [B] of `action` [B, d] under independent Gaussians of means `mean`
/// [B, d] and log standard deviations `log_std` [d].
inline at::Tensor gaussian_log_prob(const at::Tensor& mean, const at::Tensor& log_std, const at::Tensor& action) {
  const auto z = (action - mean) * (-log_std).exp();
  return (-0.5 * z.square() - log_std - 0.5 * std::log(2.0 * std::numbers::pi)).sum(-1);
}
/// The entropy of those Gaussians, for each of `rows` rows.
inline at::Tensor gaussian_entropy(const at::Tensor& log_std, std::int64_t rows) {
  return (log_std + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi))).sum().expand({rows});
}
/// An action [B] drawn from each row's categorical distribution of `logits` [B, n].
inline at::Tensor sample_categorical(const at::Tensor& logits) {
  return at::multinomial(logits.softmax(-1), 1).squeeze(-1);
}
/// The mean standard deviation of continuous actions (`action_std` in logs), with no
/// LibTorch op for a float32 host tensor.
inline double mean_std(const at::Tensor& log_std) {
  if (log_std.device().is_cpu() && log_std.scalar_type() == at::kFloat) {
    const float* ls = log_std.data_ptr<float>();
    const std::int64_t d = log_std.numel();
    double m = 0;
    for (std::int64_t j = 0; j < d; ++j) m += std::exp(static_cast<double>(ls[j])) / static_cast<double>(d);
    return m;
  }
  return log_std.detach().exp().mean().item().toDouble();
}

/// The optimizer of a PPO actor-critic with its schedule and state (see file comment).
class PpoOptimizer {
 public:
  PpoOptimizer() = default;
  /// Adam over `params` at `lr` (the annealing's start) with epsilon `eps`; `section`
  /// names the algorithm in errors; the averaged weights live on `device`.
  PpoOptimizer(std::vector<at::Tensor> params, double lr, double eps, std::string section, c10::Device device)
      : base_lr_(lr), opt_(std::move(params), {.lr = lr, .eps = eps}), section_(std::move(section)) {
    ema_.set_device(device);
  }

  [[nodiscard]] FlatAdam& adam() noexcept { return opt_; }
  [[nodiscard]] const FlatAdam& adam() const noexcept { return opt_; }
  /// An update was made whose minibatch's approximate KL was `approx_kl`.
  void count(double approx_kl) noexcept {
    ++updates_;
    epoch_kl_ += approx_kl;
    ++epoch_minibatches_;
  }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Ends an update: one optimizer step on the minibatch's gradient `grad` (its norm
  /// clipped to `max_grad_norm`), counted; its losses `sum` and, for a Gaussian policy
  /// (`log_std` defined), the actions' mean standard deviation as its metrics.
  UpdateInfo step(StepContext& ctx, const at::Tensor& grad, double max_grad_norm, const PpoLosses& sum,
                  const at::Tensor& log_std) {
    ctx.apply(opt_, grad, max_grad_norm);
    return counted(sum, log_std);
  }
  /// The host's part of an update whose optimizer step was taken (`step`, or a replayed
  /// CUDA graph, whose step the caller counted): counts it, with its losses `sum` and, for a
  /// Gaussian policy, the actions' mean standard deviation as its metrics.
  UpdateInfo counted(const PpoLosses& sum, const at::Tensor& log_std) {
    count(sum.approx_kl);
    UpdateInfo info;
    info.metrics = sum.metrics();
    if (log_std.defined()) info.metrics.emplace_back("action_std", mean_std(log_std));
    return info;
  }

  /// Ends an epoch: whether to run another. With `target_kl` > 0, the epochs stop once
  /// the epoch's mean approximate KL between the policy that collected the rollout and the
  /// current one, averaged over the ranks (so every rank stops at the same epoch), exceeds it.
  bool end_epoch(double target_kl, StepContext& ctx) {
    const double kl = epoch_minibatches_ > 0 ? epoch_kl_ / static_cast<double>(epoch_minibatches_) : 0.0;
    const bool any = epoch_minibatches_ > 0;
    epoch_kl_ = 0;
    epoch_minibatches_ = 0;
    if (!(target_kl > 0) || !any) return true;
    return ctx.mean_over_ranks(kl) <= target_kl;
  }
  /// Where the run is (the fraction of train.steps done): with `anneal` the learning rate
  /// falls linearly to 0.
  void set_progress(bool anneal, double done) {
    if (anneal) opt_.set_lr(base_lr_ * std::clamp(1.0 - done, 0.0, 1.0));
  }

  /// The averaged weights (`train.ema_decay`; optim/ema.hpp).
  void ema_update(double decay) { ema_.update(opt_.parameters().flat(), decay); }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }

  /// State protocol: the actor-critic with its Adam state, the update count, the averaged
  /// weights.
  struct Saved {
    FlatAdam::Saved opt;
    std::int64_t updates = 0;
    Ema::Saved ema;
  };
  void save(BinaryWriter& w) const {
    opt_.save(w);
    w.value(updates_);
    ema_.save(w);
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.opt = opt_.read(r, (section_ + " actor-critic").c_str());
    s.updates = r.value<std::int64_t>((section_ + " update count").c_str());
    s.ema = ema_.read(r, (section_ + " averaged parameters").c_str(), opt_.parameters().flat());
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
  }

 private:
  double base_lr_ = 0;
  FlatAdam opt_;
  std::string section_ = "ppo";
  std::int64_t updates_ = 0;
  double epoch_kl_ = 0;  ///< approximate KL summed over this epoch's minibatches
  std::int64_t epoch_minibatches_ = 0;
  Ema ema_;
};

}  // namespace anvil::detail
