#pragma once
/// @file
/// Soft Actor-Critic (Haarnoja, Zhou, Abbeel, Levine 2018, "Soft Actor-Critic: Off-Policy
/// Maximum Entropy Deep Reinforcement Learning with a Stochastic Actor"; with automatic
/// entropy tuning from Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and
/// Applications"). Defaults are the published hyperparameters: Adam at 3e-4, batch 256,
/// gamma 0.99, tau 0.005, 256x256 networks, target entropy -|A|.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/twin_q.hpp>
#include <anvil/train/flat_adam.hpp>
#include <anvil/train/step_context.hpp>

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

/// Algorithm policy: Soft Actor-Critic (see file comment) with swappable networks.
/// @tparam Actor  a `SquashedPolicyNetwork` (default: tanh-Gaussian MLP)
/// @tparam Critic a `TwinCriticNetwork` (default: two MLP Q-functions)
template <class Actor = nn::GaussianActor, class Critic = nn::TwinQ>
class BasicSAC {
  static_assert(SquashedPolicyNetwork<Actor>,
                "BasicSAC<Actor, ...>: Actor must be a torch module holder built from "
                "(obs_dim, act_dim, Config) with sample(obs, noise) -> nn::PolicySample and "
                "mode(obs) -> Tensor; see nn::GaussianActor");
  static_assert(TwinCriticNetwork<Critic>,
                "BasicSAC<..., Critic>: Critic must be a torch module holder built from "
                "(obs_dim, act_dim, Config) with forward(obs, act) -> pair of Q tensors; see "
                "nn::TwinQ");

 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "sac";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;

  struct Config {
    Param<int, "batch_size", "transitions per gradient update", at_least(1)> batch_size{256};
    Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
    Param<double, "tau", "Polyak coefficient of the target networks", in_range(0, 1)> tau{0.005};
    Param<double, "actor_lr", "actor learning rate (Adam)", positive> actor_lr{3e-4};
    Param<double, "critic_lr", "critic learning rate (Adam)", positive> critic_lr{3e-4};
    Param<double, "alpha_lr", "entropy temperature learning rate (Adam)", positive> alpha_lr{3e-4};
    Param<double, "init_alpha", "initial entropy temperature", positive> init_alpha{1.0};
    Param<bool, "auto_alpha", "tune the temperature towards the target entropy"> auto_alpha{true};
    Param<double, "target_entropy_scale", "target entropy is -scale * action_dim", at_least(0)>
        target_entropy_scale{1.0};
    Param<int, "actor_update_freq", "update the actor and temperature every N updates", at_least(1)>
        actor_update_freq{1};
    Param<int, "target_update_freq", "Polyak-average the targets every N updates", at_least(1)>
        target_update_freq{1};
    Param<double, "max_grad_norm", "clip each gradient's global norm (0: off)", at_least(0)>
        max_grad_norm{0.0};
    Section<"actor", detail::module_config_t<Actor>> actor;
    Section<"critic", detail::module_config_t<Critic>> critic;
  };

  BasicSAC(const envs::EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device) {
    if (spec.discrete())
      throw ConfigError("SAC needs a continuous (Box) action space; " + spec.name +
                        " has discrete actions: use PPO");
    const auto& box = std::get<envs::Box>(spec.action);
    for (std::size_t i = 0; i < box.size(); ++i)
      if (!std::isfinite(box.low[i]) || !std::isfinite(box.high[i]))
        throw ConfigError("SAC squashes actions into the action space's bounds, but " + spec.name +
                          "'s action " + std::to_string(i) + " is unbounded");
    const auto od = spec.obs_dim(), ad = spec.action_dim();
    act_dim_ = ad;
    actor_ = Actor(od, ad, *cfg.actor);
    critic_ = Critic(od, ad, *cfg.critic);
    critic_target_ = std::dynamic_pointer_cast<typename Critic::ContainedType>(critic_->clone());
    actor_->to(device_);
    critic_->to(device_);
    critic_target_->to(device_);
    for (auto& p : critic_target_->parameters()) p.set_requires_grad(false);
    log_alpha_ = torch::full({1}, std::log(*cfg.init_alpha),
                             torch::TensorOptions().device(device_).requires_grad(true));
    target_entropy_ = -cfg.target_entropy_scale * static_cast<double>(ad);
    // Each network's parameters move into one flat buffer: Adam, clipping, all-reduce and
    // the Polyak average become a handful of ops (see train/flat_adam.hpp).
    const double s = ctx.lr_scale;
    actor_opt_ = FlatAdam(actor_->parameters(), {.lr = cfg.actor_lr * s});
    critic_opt_ = FlatAdam(critic_->parameters(), {.lr = cfg.critic_lr * s});
    alpha_opt_ = FlatAdam({log_alpha_}, {.lr = cfg.alpha_lr * s});
    target_ = FlatParameters(critic_target_->parameters());
  }

  /// Actions in [-1, 1] for a batch of observations: sampled to explore, or the mean.
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    auto o = obs.to(device_, at::kFloat);
    return mode == ActMode::explore
               ? actor_->sample(o, at::randn({o.size(0), act_dim_}, o.options())).action
               : actor_->mode(o);
  }

  /// One SAC update. The critic loss, the actor loss and the temperature loss are all
  /// computed from the parameters as they were before this update, as in the authors'
  /// reference implementation (which runs the three training ops in one session call); so
  /// the critic's and the actor's gradients are independent and `ctx` computes them at
  /// once when it has two threads, with the same result as one after another. Then the
  /// optimizers step, and (every target_update_freq updates) the target critic moves
  /// towards the critic by Polyak averaging. The actor and temperature update every
  /// actor_update_freq updates.
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    const auto alpha = log_alpha_.detach().exp();
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    // Noise drawn here, in a fixed order, so the update is reproducible on any thread count.
    const auto noise_next = at::randn({b.obs.size(0), act_dim_}, b.obs.options());
    const auto noise_obs = actor_step ? at::randn({b.obs.size(0), act_dim_}, b.obs.options()) : at::Tensor();

    at::Tensor critic_grad, critic_loss, td, q_mean;
    auto critic_part = [&] {
      at::Tensor target;
      {  // soft Bellman target, in float32 and without gradients
        torch::NoGradGuard no_grad;
        auto guard = ctx.autocast();
        auto next = actor_->sample(b.next_obs, noise_next);
        auto [tq1, tq2] = critic_target_->forward(b.next_obs, next.action);
        auto v = at::min(tq1, tq2).to(at::kFloat) - alpha * next.log_prob.to(at::kFloat);
        auto discount = b.discount.defined() ? b.discount : torch::full({}, *cfg_.gamma, v.options());
        target = b.reward + discount * (1.0 - b.terminated) * v;
      }
      auto guard = ctx.autocast();
      auto [q1, q2] = critic_->forward(b.obs, b.action);
      auto e1 = q1.to(at::kFloat) - target, e2 = q2.to(at::kFloat) - target;
      auto per_sample = 0.5 * (e1.square() + e2.square());
      critic_loss = b.weight.defined() ? (b.weight * per_sample).mean() : per_sample.mean();
      critic_grad = ctx.gradient(critic_loss, critic_opt_);
      td = 0.5 * (e1.abs() + e2.abs()).detach();
      q_mean = q1.detach().mean();
    };

    at::Tensor actor_grad, alpha_grad, actor_loss, alpha_loss, entropy;
    auto actor_part = [&] {
      auto guard = ctx.autocast();
      auto s = actor_->sample(b.obs, noise_obs);
      auto [q1, q2] = critic_->forward(b.obs, s.action);
      auto log_prob = s.log_prob.to(at::kFloat);
      actor_loss = (alpha * log_prob - at::min(q1, q2).to(at::kFloat)).mean();
      actor_grad = ctx.gradient(actor_loss, actor_opt_);
      entropy = -log_prob.detach().mean();
      if (cfg_.auto_alpha) {
        alpha_loss = -(log_alpha_ * (log_prob.detach() + target_entropy_)).mean();
        alpha_grad = ctx.gradient(alpha_loss, alpha_opt_);
      }
    };

    if (actor_step) ctx.concurrently({critic_part, actor_part});
    else critic_part();

    UpdateInfo info;
    ctx.apply(critic_opt_, critic_grad, cfg_.max_grad_norm);
    info.metrics.emplace_back("critic_loss", critic_loss.item().toDouble());
    info.metrics.emplace_back("q_mean", q_mean.item().toDouble());
    if (actor_step) {
      ctx.apply(actor_opt_, actor_grad, cfg_.max_grad_norm);
      info.metrics.emplace_back("actor_loss", actor_loss.item().toDouble());
      info.metrics.emplace_back("entropy", entropy.item().toDouble());
      if (cfg_.auto_alpha) {
        ctx.apply(alpha_opt_, alpha_grad);
        info.metrics.emplace_back("alpha_loss", alpha_loss.item().toDouble());
      }
    }
    info.metrics.emplace_back("alpha", log_alpha_.detach().exp().item().toDouble());

    if (updates_ % cfg_.target_update_freq == 0) {
      torch::NoGradGuard no_grad;
      target_.flat().lerp_(critic_opt_.parameters().flat(), *cfg_.tau);
    }
    ++updates_;
    info.td_error = td;
    return info;
  }

  [[nodiscard]] Actor& actor() noexcept { return actor_; }
  [[nodiscard]] Critic& critic() noexcept { return critic_; }
  [[nodiscard]] Critic& critic_target() noexcept { return critic_target_; }
  [[nodiscard]] double alpha() const { return log_alpha_.detach().exp().item().toDouble(); }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Batch size the trainer samples for each update.
  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }

 private:
  Config cfg_;
  c10::Device device_;
  Actor actor_{nullptr};
  Critic critic_{nullptr}, critic_target_{nullptr};
  at::Tensor log_alpha_;
  double target_entropy_ = 0.0;
  std::int64_t act_dim_ = 0;
  FlatAdam actor_opt_, critic_opt_, alpha_opt_;
  FlatParameters target_;
  std::int64_t updates_ = 0;
};

/// SAC with the default networks: tanh-Gaussian actor and twin-Q critic, 256x256 MLPs.
using SAC = BasicSAC<>;

static_assert(Algorithm<SAC>);

}  // namespace anvil
