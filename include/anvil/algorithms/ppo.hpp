#pragma once
/// @file
/// Proximal Policy Optimization (Schulman, Wolski, Dhariwal, Radford, Klimov 2017,
/// "Proximal Policy Optimization Algorithms"): the clipped surrogate objective, a value
/// loss (optionally clipped), an entropy bonus, gradient-norm clipping, a learning rate
/// annealed linearly to zero, and an early stop of the epochs when the policy moves too far
/// from the one that collected the rollout (target KL).
///
/// A categorical policy for `Discrete` actions, a Gaussian with a state-independent log
/// standard deviation for `Box` actions, both on separate actor and critic MLPs.
/// Defaults are the paper's MuJoCo settings (Adam 3e-4, 10 epochs, minibatches of 64,
/// gamma 0.99, clip 0.2; lambda 0.95 and 2048 steps are the RolloutBuffer's) with the
/// details of its reference implementation: orthogonal initialisation (gain sqrt 2, 0.01
/// on the policy head, 1 on the value head), Adam's epsilon 1e-5, gradient norm 0.5, value
/// loss coefficient 0.5 (Huang et al. 2022, "The 37 Implementation Details of PPO").
///
/// Continuous actions are in the Trainer's normalised units: the Trainer clips them to
/// [-1, 1] and scales them to the env's bounds; the rollout keeps the unclipped sample,
/// whose probability the policy gave.

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Algorithm policy: PPO (see file comment).
class PPO {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "ppo";
  static constexpr bool on_policy = true;
  using Batch = RolloutBatch;

  /// Its config section (algorithms/ppo_config.hpp) and its networks' shape.
  using Config = PpoConfig;
  using NetConfig = PpoNetConfig;

  PPO(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), discrete_(spec.discrete()),
        act_dim_(spec.discrete() ? spec.num_actions() : spec.action_dim()) {
    if (discrete_ && act_dim_ < 2)
      throw ConfigError("PPO: " + spec.name + " has " + std::to_string(act_dim_) + " discrete action(s); needs 2 or more");
    if (ctx.micro_batches > cfg.minibatch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than " +
                        std::string(config_section.view()) + ".minibatch_size (" + std::to_string(*cfg.minibatch_size) +
                        "): micro-batches would be empty");
    const auto od = spec.obs_dim();
    actor_ = nn::Mlp(od, nn::widths(cfg.actor->hidden), act_dim_, cfg.actor->activation);
    critic_ = nn::Mlp(od, nn::widths(cfg.critic->hidden), 1, cfg.critic->activation);
    if (cfg.ortho_init) {
      init_orthogonal(actor_, 0.01);
      init_orthogonal(critic_, 1.0);
    }
    actor_->to(device_);
    critic_->to(device_);
    std::vector<at::Tensor> params = actor_->parameters();
    if (!discrete_) {
      log_std_ = torch::full({act_dim_}, *cfg.init_log_std, at::TensorOptions().device(device_).requires_grad(true));
      params.push_back(log_std_);
    }
    for (const auto& p : critic_->parameters()) params.push_back(p);
    base_lr_ = cfg.lr * ctx.lr_scale(cfg.minibatch_size);
    opt_ = FlatAdam(std::move(params), {.lr = base_lr_, .eps = cfg.adam_eps});
    ema_.set_device(device_);
    if (cfg.manual_backward && device_.is_cpu() && nn::MlpTape::supports(*actor_) &&
        nn::MlpTape::supports(*critic_))
      manual_ = std::make_unique<Manual>(opt_.parameters(), actor_, log_std_, critic_);
  }

  /// Actions for a batch of observations: sampled to explore, the mode (argmax or mean)
  /// when deterministic. Discrete: int64 [N]; continuous: float [N, act_dim].
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      const auto& out = manual_->act_actor.forward(*actor_, o);
      if (discrete_) return mode == ActMode::explore ? manual_categorical(out, nullptr) : out.argmax(-1);
      if (mode != ActMode::explore) return out.clone();
      return manual_sample(out, nullptr);
    }
    const auto out = actor_->forward(obs.to(device_, at::kFloat));
    if (discrete_) return mode == ActMode::explore ? sample_categorical(out) : out.argmax(-1);
    return mode == ActMode::explore ? out + log_std_.exp() * at::randn_like(out) : out;
  }

  /// A sampled action with its log-probability and the value of `obs`, for the rollout.
  RolloutAct act_for_rollout(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      RolloutAct r;
      r.log_prob = at::empty({o.size(0)}, o.options());
      const auto& out = manual_->act_actor.forward(*actor_, o);
      r.action = discrete_ ? manual_categorical(out, &r.log_prob) : manual_sample(out, &r.log_prob);
      r.value = manual_->act_critic.forward(*critic_, o).view({o.size(0)}).clone();
      return r;
    }
    const auto o = obs.to(device_, at::kFloat);
    const auto out = actor_->forward(o);
    RolloutAct r;
    if (discrete_) {
      r.action = sample_categorical(out);
      r.log_prob = out.log_softmax(-1).gather(-1, r.action.unsqueeze(-1)).squeeze(-1);
    } else {
      r.action = out + log_std_.exp() * at::randn_like(out);
      r.log_prob = gaussian_log_prob(out, r.action);
    }
    r.value = critic_->forward(o).squeeze(-1);
    return r;
  }

  /// Value estimates [N] of observations (no gradients).
  at::Tensor value(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      return manual_->act_critic.forward(*critic_, o).view({o.size(0)}).clone();
    }
    return critic_->forward(obs.to(device_, at::kFloat)).squeeze(-1);
  }

  /// One gradient step on a minibatch: clipped surrogate + vf_coef * value loss -
  /// ent_coef * entropy. With gradient accumulation the minibatch is split into the
  /// context's micro-batches and their weighted gradients summed before one step.
  UpdateInfo update(const RolloutBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    Losses sum;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      Losses l;
      const RolloutBatch& mb = whole ? b : slice(b, part.begin, part.rows);
      auto g = manual_ && !ctx.autocasts() ? manual_gradient(mb, l) : ctx.gradient(losses(mb, ctx, l), opt_);
      if (whole) grad = std::move(g);
      else if (!grad.defined()) grad = g * part.share;
      else grad.add_(g, part.share);
      sum.add(l, part.share);
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    ++updates_;
    epoch_kl_ += sum.approx_kl;
    ++epoch_minibatches_;
    UpdateInfo info;
    info.metrics = {{"policy_loss", sum.policy},       {"value_loss", sum.value},
                    {"entropy", sum.entropy},          {"approx_kl", sum.approx_kl},
                    {"clip_fraction", sum.clip_fraction}};
    if (!discrete_) {  // the mean standard deviation of the actions
      double std_mean = 0;
      if (log_std_.device().is_cpu() && log_std_.scalar_type() == at::kFloat) {  // no ops for a host value
        const float* ls = log_std_.data_ptr<float>();
        for (std::int64_t j = 0; j < act_dim_; ++j) std_mean += std::exp(static_cast<double>(ls[j])) / static_cast<double>(act_dim_);
      } else {
        std_mean = log_std_.detach().exp().mean().item().toDouble();
      }
      info.metrics.emplace_back("action_std", std_mean);
    }
    return info;
  }

  /// Ends an epoch over the rollout: whether to run another. With `target_kl` set, the
  /// epochs stop once the epoch's mean approximate KL between the policy that collected the
  /// rollout and the current one, averaged over the ranks (so every rank stops at the same
  /// epoch), exceeds it.
  bool end_epoch(StepContext& ctx) {
    const double kl = epoch_minibatches_ > 0 ? epoch_kl_ / epoch_minibatches_ : 0.0;
    const bool any = epoch_minibatches_ > 0;
    epoch_kl_ = 0;
    epoch_minibatches_ = 0;
    if (!(cfg_.target_kl > 0) || !any) return true;
    return ctx.mean_over_ranks(kl) <= cfg_.target_kl;
  }

  /// Where the run is, as the fraction of train.steps done: anneals the learning rate.
  void set_progress(double done) {
    if (cfg_.anneal_lr) opt_.set_lr(base_lr_ * std::clamp(1.0 - done, 0.0, 1.0));
  }
  [[nodiscard]] int epochs() const noexcept { return cfg_.epochs; }
  [[nodiscard]] std::int64_t minibatch_size() const noexcept { return cfg_.minibatch_size; }
  [[nodiscard]] double target_kl() const noexcept { return cfg_.target_kl; }
  /// The discount (the rollout's advantages, a reward normaliser's return).
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

  /// Moves the average of the actor-critic's weights towards the current ones
  /// (`train.ema_decay`; see optim/ema.hpp); evaluation and checkpoints use it.
  void ema_update(double decay) { ema_.update(opt_.parameters().flat(), decay); }
  /// Runs `f` with the averaged weights in place (when there are any), then restores them.
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }

  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"ppo", opt_.lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor_critic", opt_.parameters().flat()}};
  }

  /// State protocol (core/state.hpp): the actor-critic with its Adam state, the update
  /// count, the averaged weights.
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
    s.opt = opt_.read(r, "ppo actor-critic");
    s.updates = r.value<std::int64_t>("ppo update count");
    s.ema = ema_.read(r, "ppo averaged parameters", opt_.parameters().flat());
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
  }

  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  [[nodiscard]] nn::Mlp& critic() noexcept { return critic_; }
  /// Log standard deviation of continuous actions (undefined for discrete ones).
  [[nodiscard]] const at::Tensor& log_std() const noexcept { return log_std_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] bool discrete() const noexcept { return discrete_; }
  /// Whether acting and updates take the hand-written fast path (`manual_backward`).
  [[nodiscard]] bool manual_backward() const noexcept { return manual_ != nullptr; }

 private:
  struct Losses {
    double policy = 0, value = 0, entropy = 0, approx_kl = 0, clip_fraction = 0;
    void add(const Losses& o, double w) {
      policy += w * o.policy;
      value += w * o.value;
      entropy += w * o.entropy;
      approx_kl += w * o.approx_kl;
      clip_fraction += w * o.clip_fraction;
    }
  };

  // The loss of a (micro-)batch; its parts reported in `out`.
  at::Tensor losses(const RolloutBatch& b, StepContext& ctx, Losses& out) {
    auto guard = ctx.autocast();
    const auto logits = actor_->forward(b.obs).to(at::kFloat);
    at::Tensor log_prob, entropy;
    if (discrete_) {
      const auto lp = logits.log_softmax(-1);
      log_prob = lp.gather(-1, b.action.unsqueeze(-1)).squeeze(-1);
      entropy = -(lp.exp() * lp).sum(-1);
    } else {
      log_prob = gaussian_log_prob(logits, b.action);
      entropy = (log_std_ + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi))).sum().expand({b.obs.size(0)});
    }
    const auto log_ratio = log_prob - b.log_prob;
    const auto ratio = log_ratio.exp();
    const double c = cfg_.clip;
    const auto policy_loss = at::max(-b.advantage * ratio, -b.advantage * ratio.clamp(1.0 - c, 1.0 + c)).mean();
    const auto v = critic_->forward(b.obs).squeeze(-1).to(at::kFloat);
    at::Tensor value_loss;
    if (cfg_.clip_value > 0) {
      const auto clipped = b.value + (v - b.value).clamp(-*cfg_.clip_value, *cfg_.clip_value);
      value_loss = 0.5 * at::max((v - b.returns).square(), (clipped - b.returns).square()).mean();
    } else {
      value_loss = 0.5 * (v - b.returns).square().mean();
    }
    const auto ent = entropy.mean();
    auto loss = policy_loss + *cfg_.vf_coef * value_loss - *cfg_.ent_coef * ent;
    {
      torch::NoGradGuard no_grad;
      // KL(old || new) estimated as E[(r - 1) - log r], unbiased and never negative.
      out.approx_kl = ((ratio - 1.0) - log_ratio).mean().item().toDouble();
      out.clip_fraction = ((ratio - 1.0).abs() > c).to(at::kFloat).mean().item().toDouble();
      out.policy = policy_loss.item().toDouble();
      out.value = value_loss.item().toDouble();
      out.entropy = ent.item().toDouble();
    }
    return loss;
  }

  // Buffers of the hand-written path: tapes for acting and for updates (so a rollout can
  // be collected while an update runs), and the flat gradient with each parameter's view.
  struct Manual {
    Manual(const FlatParameters& fp, const nn::Mlp& actor, const at::Tensor& log_std, const nn::Mlp& critic) {
      grad = at::empty({fp.numel()}, fp.flat().options());
      for (const auto& p : actor->parameters()) actor_grads.push_back(fp.slice_for(grad, p));
      if (log_std.defined()) log_std_grad = fp.slice_for(grad, log_std);
      for (const auto& p : critic->parameters()) critic_grads.push_back(fp.slice_for(grad, p));
    }
    nn::MlpTape act_actor, act_critic, actor, critic;
    at::Tensor grad, log_std_grad, dmean, dv, lsm;
    std::vector<at::Tensor> actor_grads, critic_grads;
  };

  // mean + exp(log_std) * noise, with the noise drawn as `randn_like(mean)` (the same draws
  // as the autograd path), and when `log_prob` is given each row's log-density into it.
  at::Tensor manual_sample(const at::Tensor& mean, at::Tensor* log_prob) const {
    const std::int64_t n = mean.size(0), ad = act_dim_;
    auto action = at::randn({n, ad}, mean.options());
    const float *m = mean.data_ptr<float>(), *ls = log_std_.data_ptr<float>();
    float* a = action.data_ptr<float>();
    float* lp = log_prob ? log_prob->data_ptr<float>() : nullptr;
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    std::vector<float> sd(static_cast<std::size_t>(ad)), inv_sd(sd.size());  // exp(+-log_std), per column
    for (std::size_t j = 0; j < sd.size(); ++j) {
      sd[j] = std::exp(ls[j]);
      inv_sd[j] = std::exp(-ls[j]);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      float sum = 0.f;
      for (std::int64_t j = 0; j < ad; ++j) {
        const auto c = static_cast<std::size_t>(j);
        const float eps = a[i * ad + j];
        const float x = m[i * ad + j] + sd[c] * eps;
        a[i * ad + j] = x;
        const float z = (x - m[i * ad + j]) * inv_sd[c];
        sum += -0.5f * z * z - ls[j] - kHalfLog2Pi;
      }
      if (lp) lp[i] = sum;
    }
    return action;
  }

  // Actions drawn from the softmax of `logits` [N, K] by `multinomial` (the autograd path's
  // draws), with each one's log-probability into `log_prob` when given.
  at::Tensor manual_categorical(const at::Tensor& logits, at::Tensor* log_prob) const {
    const std::int64_t n = logits.size(0), k = logits.size(1);
    auto lsm = at::empty({n, k}, logits.options());
    log_softmax_rows(logits.data_ptr<float>(), lsm.data_ptr<float>(), n, k);
    auto action = at::multinomial(lsm.exp(), 1).view({n});
    if (log_prob) {
      const float* l = lsm.data_ptr<float>();
      const std::int64_t* a = action.data_ptr<std::int64_t>();
      float* lp = log_prob->data_ptr<float>();
      for (std::int64_t i = 0; i < n; ++i) lp[i] = l[i * k + a[i]];
    }
    return action;
  }
  static void log_softmax_rows(const float* x, float* y, std::int64_t n, std::int64_t k) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * k;
      float m = xi[0];
      for (std::int64_t j = 1; j < k; ++j) m = std::max(m, xi[j]);
      float sum = 0.f;
      for (std::int64_t j = 0; j < k; ++j) sum += std::exp(xi[j] - m);
      const float lse = m + std::log(sum);
      for (std::int64_t j = 0; j < k; ++j) y[i * k + j] = xi[j] - lse;
    }
  }

  // The gradient of `losses`, written out by hand (the same arithmetic as autograd's, ties
  // of max and the bounds of clamp included), into the flat gradient buffer; the loss's
  // parts in `out`. Gaussian or categorical policies.
  at::Tensor manual_gradient(const RolloutBatch& batch, Losses& out) {
    torch::NoGradGuard no_grad;
    Manual& mt = *manual_;
    const auto obs = batch.obs.contiguous(), action = batch.action.contiguous();
    const auto old_lp = batch.log_prob.contiguous(), adv = batch.advantage.contiguous();
    const auto ret = batch.returns.contiguous(), old_v = batch.value.contiguous();
    const std::int64_t n = obs.size(0), ad = act_dim_;
    const float* mean = mt.actor.forward(*actor_, obs).data_ptr<float>();  // Gaussian means or logits
    const float* v = mt.critic.forward(*critic_, obs).data_ptr<float>();
    if (!mt.dmean.defined() || mt.dmean.size(0) != n) {
      mt.dmean = at::empty({n, ad}, obs.options());
      mt.dv = at::empty({n, 1}, obs.options());
      if (discrete_) mt.lsm = at::empty({n, ad}, obs.options());
    }
    float *dm = mt.dmean.data_ptr<float>(), *dv = mt.dv.data_ptr<float>();
    float* dls = discrete_ ? nullptr : mt.log_std_grad.data_ptr<float>();
    const float* ls = discrete_ ? nullptr : log_std_.data_ptr<float>();
    const float* a = discrete_ ? nullptr : action.data_ptr<float>();
    const std::int64_t* ai = discrete_ ? action.data_ptr<std::int64_t>() : nullptr;
    float* lsm = discrete_ ? mt.lsm.data_ptr<float>() : nullptr;
    if (discrete_) log_softmax_rows(mean, lsm, n, ad);
    const float *olp = old_lp.data_ptr<float>(), *A = adv.data_ptr<float>();
    const float *R = ret.data_ptr<float>(), *V = old_v.data_ptr<float>();
    const float c = static_cast<float>(*cfg_.clip), lo = 1.0f - c, hi = 1.0f + c;
    const float cv = static_cast<float>(*cfg_.clip_value), vf = static_cast<float>(*cfg_.vf_coef);
    const float ent = static_cast<float>(*cfg_.ent_coef);
    const float inv_n = 1.0f / static_cast<float>(n);
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    std::vector<float> inv_s(discrete_ ? 0 : static_cast<std::size_t>(ad));
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(inv_s.size()); ++j) {
      inv_s[static_cast<std::size_t>(j)] = std::exp(-ls[j]);
      dls[j] = 0.f;
    }
    std::vector<float> pr(discrete_ ? static_cast<std::size_t>(ad) : 0);  // a row's probabilities
    double policy = 0, value = 0, kl = 0, clipped = 0, entropy = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float lp = 0.f, h = 0.f;
      if (discrete_) {
        lp = lsm[i * ad + ai[i]];
        for (std::int64_t j = 0; j < ad; ++j) {
          pr[static_cast<std::size_t>(j)] = std::exp(lsm[i * ad + j]);
          h -= pr[static_cast<std::size_t>(j)] * lsm[i * ad + j];
        }
        entropy += h;
      } else {
        for (std::int64_t j = 0; j < ad; ++j) {
          const float z = (a[i * ad + j] - mean[i * ad + j]) * inv_s[static_cast<std::size_t>(j)];
          lp += -0.5f * z * z - ls[j] - kHalfLog2Pi;
        }
      }
      const float log_ratio = lp - olp[i], r = std::exp(log_ratio);
      const float rc = std::min(std::max(r, lo), hi);
      const float u = -A[i] * r, w = -A[i] * rc;
      policy += std::max(u, w);
      const float pass = r >= lo && r <= hi ? 1.0f : 0.0f;  // clamp's gradient
      const float g_r = (u > w ? -A[i] : u < w ? -A[i] * pass : 0.5f * (-A[i]) + 0.5f * (-A[i] * pass)) * inv_n;
      const float g_lp = g_r * r;
      if (discrete_) {
        // d log p_a / d z_j = [j = a] - p_j; d H / d z_j = -p_j (log p_j + H), weighed by -ent / n
        for (std::int64_t j = 0; j < ad; ++j) {
          const float p = pr[static_cast<std::size_t>(j)];
          dm[i * ad + j] = g_lp * ((j == ai[i] ? 1.0f : 0.0f) - p) + ent * inv_n * p * (lsm[i * ad + j] + h);
        }
      } else {
        for (std::int64_t j = 0; j < ad; ++j) {
          const float is = inv_s[static_cast<std::size_t>(j)];
          const float z = (a[i * ad + j] - mean[i * ad + j]) * is;
          dm[i * ad + j] = g_lp * z * is;
          dls[j] += g_lp * (z * z - 1.0f);
        }
      }
      kl += static_cast<double>((r - 1.0f) - log_ratio);
      clipped += std::abs(r - 1.0f) > c ? 1.0 : 0.0;
      const float e = v[i] - R[i];
      if (cv > 0) {
        const float d = v[i] - V[i], dc = std::min(std::max(d, -cv), cv);
        const float e2 = V[i] + dc - R[i];
        const float s1 = e * e, s2 = e2 * e2;
        value += 0.5 * std::max(s1, s2);
        const float pass_v = d >= -cv && d <= cv ? 1.0f : 0.0f;
        const float g1 = e, g2 = e2 * pass_v;
        dv[i] = vf * inv_n * (s1 > s2 ? g1 : s1 < s2 ? g2 : 0.5f * (g1 + g2));
      } else {
        value += 0.5 * static_cast<double>(e * e);
        dv[i] = vf * inv_n * e;
      }
    }
    if (!discrete_) {
      for (std::int64_t j = 0; j < ad; ++j) {
        entropy += static_cast<double>(ls[j]) + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi));
        dls[j] -= ent;
      }
      entropy *= static_cast<double>(n);  // the same for every row
    }
    mt.actor.backward(*actor_, mt.dmean, &mt.actor_grads, nullptr);
    mt.critic.backward(*critic_, mt.dv, &mt.critic_grads, nullptr);
    const double dn = static_cast<double>(n);
    out.policy = policy / dn;
    out.value = value / dn;
    out.entropy = entropy / dn;
    out.approx_kl = kl / dn;
    out.clip_fraction = clipped / dn;
    return mt.grad;
  }

  at::Tensor gaussian_log_prob(const at::Tensor& mean, const at::Tensor& action) const {
    const auto z = (action - mean) * (-log_std_).exp();
    return (-0.5 * z.square() - log_std_ - 0.5 * std::log(2.0 * std::numbers::pi)).sum(-1);
  }
  static at::Tensor sample_categorical(const at::Tensor& logits) {
    return at::multinomial(logits.softmax(-1), 1).squeeze(-1);
  }
  static RolloutBatch slice(const RolloutBatch& b, std::int64_t begin, std::int64_t n) {
    return {b.obs.narrow(0, begin, n),       b.action.narrow(0, begin, n),  b.log_prob.narrow(0, begin, n),
            b.advantage.narrow(0, begin, n), b.returns.narrow(0, begin, n), b.value.narrow(0, begin, n)};
  }
  // Orthogonal weights with gain sqrt(2) in hidden layers and `head_gain` in the output
  // layer, zero biases.
  static void init_orthogonal(nn::Mlp& net, double head_gain) {
    torch::NoGradGuard no_grad;
    const auto& layers = net->layers();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      torch::nn::init::orthogonal_(layers[i]->weight, i + 1 < layers.size() ? std::sqrt(2.0) : head_gain);
      layers[i]->bias.zero_();
    }
  }

  Config cfg_;
  c10::Device device_;
  bool discrete_;
  std::int64_t act_dim_;  ///< action dimensions, or the number of discrete actions
  nn::Mlp actor_{nullptr}, critic_{nullptr};
  at::Tensor log_std_;
  double base_lr_ = 0;
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  double epoch_kl_ = 0;              ///< approximate KL summed over this epoch's minibatches
  std::int64_t epoch_minibatches_ = 0;
  Ema ema_;                          ///< averaged weights (train.ema_decay)
  std::unique_ptr<Manual> manual_;   ///< the hand-written path, when it applies
};

static_assert(OnPolicyAlgorithm<PPO>);

}  // namespace anvil
