#pragma once
/// @file
/// PPO's CPU backend (`ppo.manual_backward`): acting and the loss's gradient with
/// hand-written arithmetic over the MLPs' tapes (nn/manual_mlp.hpp), the same as autograd's
/// (ties of max and the bounds of clamp included), into the flat gradient the optimizer
/// reads. Gaussian (a log standard deviation given) or categorical policies; float32 on
/// the CPU.

#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/ppo_objective.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/randn.hpp>
#include <anvil/core/reused_tensor.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/optim/flat_adam.hpp>

namespace anvil::detail {

/// PPO's hand-written path: tapes for acting and for updates (so a rollout can be
/// collected while an update runs), and the flat gradient with each parameter's view.
class PpoManual {
 public:
  PpoManual(const FlatParameters& fp, const nn::Mlp& actor, const at::Tensor& log_std, const nn::Mlp& critic)
      : grad(fp.new_gradient()),
        actor_grads(fp.views_of(grad, actor->parameters())),
        critic_grads(fp.views_of(grad, critic->parameters())) {
    if (log_std.defined()) log_std_grad = fp.slice_for(grad, log_std);
  }

  /// mean + exp(log_std) * noise, with the noise drawn as `randn_like(mean)` (the same draws
  /// as the autograd path), and when `log_prob` is given each row's log-density into it.
  at::Tensor sample(const at::Tensor& mean, const at::Tensor& log_std, at::Tensor* log_prob) const {
    const std::int64_t n = mean.size(0), ad = mean.size(1);
    // torch's draws (cheap for a few envs), into the last call's tensor once it is let go of
    auto action = actions_.take({n, ad}, at::kFloat);
    anvil::randn_into(action);
    const float *m = mean.data_ptr<float>(), *ls = log_std.data_ptr<float>();
    float* a = action.data_ptr<float>();
    float* lp = log_prob ? log_prob->data_ptr<float>() : nullptr;
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    auto& sd = sd_;  // exp(+-log_std), per column (buffers kept: acting allocates nothing here)
    auto& inv_sd = inv_sd_;
    sd.resize(static_cast<std::size_t>(ad));
    inv_sd.resize(sd.size());
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

  /// Actions drawn from the softmax of `logits` [N, K] by `multinomial` (the autograd path's
  /// draws), with each one's log-probability into `log_prob` when given.
  at::Tensor categorical(const at::Tensor& logits, at::Tensor* log_prob) const {
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

  /// The gradient of PPO's loss, written out by hand (the same arithmetic as autograd's, ties
  /// of max and the bounds of clamp included), into the flat gradient buffer; the loss's
  /// parts in `out`. Gaussian (`log_std` given) or categorical policies.
  at::Tensor gradient(const nn::MlpImpl& actor, const nn::MlpImpl& critic, const at::Tensor& log_std, const PpoConfig& cfg,
                      const RolloutBatch& batch, PpoLosses& out) {
    torch::NoGradGuard no_grad;
    PpoManual& mt = *this;
    const bool discrete = !log_std.defined();
    const auto obs = batch.obs.contiguous(), action = batch.action.contiguous();
    const auto old_lp = batch.log_prob.contiguous(), adv = batch.advantage.contiguous();
    const auto ret = batch.returns.contiguous(), old_v = batch.value.contiguous();
    const auto& mean_t = mt.update_actor.forward(actor, obs);  // Gaussian means or logits
    const std::int64_t n = obs.size(0), ad = mean_t.size(1);
    const float* mean = mean_t.data_ptr<float>();
    const float* v = mt.update_critic.forward(critic, obs).data_ptr<float>();
    if (!mt.dmean.defined() || mt.dmean.size(0) != n) {
      mt.dmean = at::empty({n, ad}, obs.options());
      mt.dv = at::empty({n, 1}, obs.options());
      if (discrete) mt.lsm = at::empty({n, ad}, obs.options());
    }
    float *dm = mt.dmean.data_ptr<float>(), *dv = mt.dv.data_ptr<float>();
    float* dls = discrete ? nullptr : mt.log_std_grad.data_ptr<float>();
    const float* ls = discrete ? nullptr : log_std.data_ptr<float>();
    const float* a = discrete ? nullptr : action.data_ptr<float>();
    const std::int64_t* ai = discrete ? action.data_ptr<std::int64_t>() : nullptr;
    float* lsm = discrete ? mt.lsm.data_ptr<float>() : nullptr;
    if (discrete) log_softmax_rows(mean, lsm, n, ad);
    const float *olp = old_lp.data_ptr<float>(), *A = adv.data_ptr<float>();
    const float *R = ret.data_ptr<float>(), *V = old_v.data_ptr<float>();
    const float c = static_cast<float>(*cfg.clip), lo = 1.0f - c, hi = 1.0f + c;
    const float cv = static_cast<float>(*cfg.clip_value), vf = static_cast<float>(*cfg.vf_coef);
    const float ent = static_cast<float>(*cfg.ent_coef);
    const float inv_n = 1.0f / static_cast<float>(n);
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    std::vector<float> inv_s(discrete ? 0 : static_cast<std::size_t>(ad));
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(inv_s.size()); ++j) {
      inv_s[static_cast<std::size_t>(j)] = std::exp(-ls[j]);
      dls[j] = 0.f;
    }
    std::vector<float> pr(discrete ? static_cast<std::size_t>(ad) : 0);  // a row's probabilities
    double policy = 0, value = 0, kl = 0, clipped = 0, entropy = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float lp = 0.f, h = 0.f;
      if (discrete) {
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
      if (discrete) {
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
    if (!discrete) {
      for (std::int64_t j = 0; j < ad; ++j) {
        entropy += static_cast<double>(ls[j]) + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi));
        dls[j] -= ent;
      }
      entropy *= static_cast<double>(n);  // the same for every row
    }
    mt.update_actor.backward(actor, mt.dmean, &mt.actor_grads, nullptr);
    mt.update_critic.backward(critic, mt.dv, &mt.critic_grads, nullptr);
    const double dn = static_cast<double>(n);
    out.policy = policy / dn;
    out.value = value / dn;
    out.entropy = entropy / dn;
    out.approx_kl = kl / dn;
    out.clip_fraction = clipped / dn;
    return mt.grad;
  }

  nn::MlpTape act_actor, act_critic;  ///< acting (rollouts, evaluation)

 private:
  nn::MlpTape update_actor, update_critic;
  at::Tensor grad, log_std_grad, dmean, dv, lsm;

 private:
  mutable std::vector<float> sd_, inv_sd_;  // sample's per-column exp(+-log_std)
  mutable ReusedTensor actions_;             // sample's output
  std::vector<at::Tensor> actor_grads, critic_grads;
};

}  // namespace anvil::detail
