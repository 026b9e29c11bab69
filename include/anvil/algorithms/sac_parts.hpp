#pragma once
/// @file
/// SAC's update in parts, apart from the algorithm's class (algorithms/sac.hpp), the RLtools
/// way: the data each part gives back, and the generic operations (autograd, any networks,
/// any device): the critic part, the actor part and the temperature's gradient. The CPU
/// backend of the same parts is algorithms/sac_manual.hpp; the CUDA graph replays these
/// (optim/graphed_update.hpp). Each part reads the parameters as they were before the
/// update, so the critic's and the actor's parts are independent.

#include <torch/utils.h>

#include <concepts>
#include <cstdint>
#include <utility>

#include <anvil/core/batch.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

namespace detail {
template <class M>
using module_config_t = typename M::ContainedType::Config;
}  // namespace detail

/// What SAC needs of its actor: built from (obs_dim, act_dim, Config); `sample(obs, noise)`
/// gives a reparameterised action in [-1, 1] with its log-density from standard normal
/// noise [B, act_dim]; `mode(obs)` the deterministic action.
template <class Actor>
concept SquashedPolicyNetwork =
    requires { typename detail::module_config_t<Actor>; } &&
    std::constructible_from<Actor, std::int64_t, std::int64_t, const detail::module_config_t<Actor>&> &&
    requires(Actor& a, const at::Tensor& obs, const at::Tensor& noise) {
      { a->sample(obs, noise) } -> std::same_as<nn::PolicySample>;
      { a->mode(obs) } -> std::same_as<at::Tensor>;
      { a->clone() };
    };

/// What SAC needs of its critic: built from (obs_dim, act_dim, Config); `forward(obs, act)`
/// gives two independent Q estimates, each [B]; cloneable for its target copy.
template <class Critic>
concept TwinCriticNetwork =
    requires { typename detail::module_config_t<Critic>; } &&
    std::constructible_from<Critic, std::int64_t, std::int64_t, const detail::module_config_t<Critic>&> &&
    requires(Critic& c, const at::Tensor& obs, const at::Tensor& act) {
      { c->forward(obs, act) } -> std::same_as<std::pair<at::Tensor, at::Tensor>>;
      { c->clone() };
    };

namespace detail {

/// What the critic part gives back.
struct SacCriticResult {
  at::Tensor grad, td;  // flat critic gradient; per-sample |TD error| (mean of both Qs)
  double loss = 0, q_mean = 0;
  at::Tensor loss_t, q_mean_t;  // the same on the device (autograd path; a CUDA graph reads these)
};
/// What the actor part gives back (and the single temperature's gradient, when it learns).
struct SacActorResult {
  at::Tensor grad, alpha_grad;
  double loss = 0, entropy = 0, alpha_loss = 0;
  at::Tensor log_prob;  // per transition, when the caller computes the temperatures' gradient
  at::Tensor loss_t, entropy_t, alpha_loss_t;  // on the device (autograd path)
};

/// The temperature a part weighs log-densities by: one value, or a tensor (one per
/// transition, by its task; or a device scalar, which a CUDA graph reads at replay).
struct SacAlpha {
  double value = 0;
  at::Tensor row;
  [[nodiscard]] at::Tensor times(const at::Tensor& log_prob) const { return row.defined() ? row * log_prob : value * log_prob; }
};

/// The critic part by autograd: the soft Bellman target y = r + discount (1 - terminated)
/// (min target Q - alpha log pi), in float32 and without gradients; the critics' halved
/// squared errors, weighed by the batch's importance weights when it has them; their
/// gradient through `ctx` in `opt`'s flat layout. Host values only when not capturing.
/// `target_next_obs`: what the target critic reads for the next states, when it differs
/// from what the actor reads (features of images: the target's encoder's, not the critic's).
template <class Actor, class Critic>
SacCriticResult autograd_critic(Actor& actor, Critic& critic, Critic& target_critic, const FlatAdam& opt, double gamma,
                                const ReplayBatch& b, const SacAlpha& alpha, const at::Tensor& noise_next,
                                StepContext& ctx, const at::Tensor& target_next_obs = {}) {
  at::Tensor target;
  {
    torch::NoGradGuard no_grad;
    auto guard = ctx.autocast();
    auto next = actor->sample(b.next_obs, noise_next);
    auto [tq1, tq2] = target_critic->forward(target_next_obs.defined() ? target_next_obs : b.next_obs, next.action);
    const auto v = at::min(tq1, tq2).to(at::kFloat) - alpha.times(next.log_prob.to(at::kFloat));
    const auto discount = b.discount.defined() ? b.discount : at::full({}, gamma, v.options());
    target = b.reward + discount * (1.0 - b.terminated) * v;
  }
  auto guard = ctx.autocast();
  auto [q1, q2] = critic->forward(b.obs, b.action);
  auto e1 = q1.to(at::kFloat) - target, e2 = q2.to(at::kFloat) - target;
  auto per_sample = 0.5 * (e1.square() + e2.square());
  auto loss = b.weight.defined() ? (b.weight * per_sample).mean() : per_sample.mean();
  SacCriticResult r;
  r.grad = ctx.gradient(loss, opt);
  r.td = 0.5 * (e1.abs() + e2.abs()).detach();
  r.loss_t = loss.detach();
  r.q_mean_t = q1.detach().mean();
  if (!ctx.capturing()) {
    r.loss = r.loss_t.item().toDouble();
    r.q_mean = r.q_mean_t.item().toDouble();
  }
  return r;
}

/// The actor part by autograd: alpha log pi - min Q at reparameterised actions, weighed per
/// transition when `weight_row` is given; its gradient through `ctx` in `opt`'s layout. The
/// log-densities come back (detached, float32) for the temperature's gradient.
template <class Actor, class Critic>
SacActorResult autograd_actor(Actor& actor, Critic& critic, const FlatAdam& opt, const ReplayBatch& b,
                              const SacAlpha& alpha, const at::Tensor& noise, StepContext& ctx,
                              const at::Tensor& weight_row = {}) {
  auto guard = ctx.autocast();
  auto s = actor->sample(b.obs, noise);
  auto [q1, q2] = critic->forward(b.obs, s.action);
  auto log_prob = s.log_prob.to(at::kFloat);
  auto per_sample = alpha.times(log_prob) - at::min(q1, q2).to(at::kFloat);
  auto loss = weight_row.defined() ? (weight_row * per_sample).mean() : per_sample.mean();
  SacActorResult r;
  r.grad = ctx.gradient(loss, opt);
  r.loss_t = loss.detach();
  r.entropy_t = -log_prob.detach().mean();
  r.log_prob = log_prob.detach();
  if (!ctx.capturing()) {
    r.loss = r.loss_t.item().toDouble();
    r.entropy = r.entropy_t.item().toDouble();
  }
  return r;
}

/// The single temperature's part by autograd: the gradient of
/// -(log_alpha (log_prob + target_entropy)).mean() into `r`.
inline void autograd_temperature(SacActorResult& r, const at::Tensor& log_alpha, const FlatAdam& opt,
                                 double target_entropy, StepContext& ctx) {
  auto alpha_loss = -(log_alpha * (r.log_prob + target_entropy)).mean();
  r.alpha_grad = ctx.gradient(alpha_loss, opt);
  r.alpha_loss_t = alpha_loss.detach();
  if (!ctx.capturing()) r.alpha_loss = r.alpha_loss_t.item().toDouble();
}

/// With a temperature per task: each transition's temperature (`alpha_row`, by its task,
/// float32 on the batch's device) and, with the tasks' loss weights (`loss_weights`:
/// softmax(-log alpha) x tasks), the batch whose importance weights carry them (`weighted`)
/// and the weights alone (`task_w`). Device work alone, so a CUDA graph can hold it.
struct TaskRows {
  at::Tensor alpha_row, task_w;
  ReplayBatch weighted;
};
inline TaskRows task_rows(const at::Tensor& log_alpha, const ReplayBatch& batch, bool loss_weights) {
  torch::NoGradGuard no_grad;
  TaskRows r;
  const auto task = batch.task.to(log_alpha.device(), at::kLong);
  const auto la = log_alpha.detach();
  r.alpha_row = la.exp().index_select(0, task).to(batch.obs.device(), at::kFloat).contiguous();
  if (loss_weights) {
    r.task_w = (at::softmax(-la, 0) * static_cast<double>(la.numel())).index_select(0, task).to(batch.obs.device(), at::kFloat);
    r.weighted = batch;
    r.weighted.weight = batch.weight.defined() ? (batch.weight * r.task_w).contiguous() : r.task_w.contiguous();
  }
  return r;
}

/// The tasks' temperatures' part: the gradient of the loss
/// -(log_alpha[task_i] (log_prob_i + target_entropy[task_i])).mean() with respect to each
/// task's log_alpha, and the loss's sum over the batch (divide by its rows for the loss).
/// Device work alone (`target_entropy` a float32 tensor on log_alpha's device, one per
/// task), so a CUDA graph can hold it.
struct TaskTemperatures {
  at::Tensor grad, loss_sum;
};
inline TaskTemperatures task_temperatures(const at::Tensor& log_alpha, const at::Tensor& target_entropy,
                                          const at::Tensor& log_prob, const at::Tensor& task) {
  torch::NoGradGuard no_grad;
  const auto dev = log_alpha.device();
  const auto lp = log_prob.to(dev, at::kFloat).reshape({-1});
  const auto tk = task.to(dev, at::kLong).reshape({-1});
  const auto term = lp + target_entropy.index_select(0, tk);  // log_prob_i + target_entropy[task_i]
  const double n = static_cast<double>(lp.numel());
  auto grad = at::zeros({log_alpha.numel()}, term.options()).index_add_(0, tk, -term) / n;
  return {grad, -(log_alpha.detach().index_select(0, tk) * term).sum()};
}

}  // namespace detail
}  // namespace anvil
