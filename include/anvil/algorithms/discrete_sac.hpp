#pragma once
/// @file
/// Soft Actor-Critic for discrete actions (Christodoulou 2019, "Soft Actor-Critic for
/// Discrete Action Settings", arXiv:1910.07207). The actor gives a probability for every
/// action and each critic a Q-value for every action, so the expectations over actions that
/// continuous SAC estimates from one reparameterised sample are taken exactly:
///
///     critic target  y = r + discount (1 - terminated) sum_a' pi(a'|s') (min Q'(s',a') - alpha log pi(a'|s'))
///     actor loss     sum_a pi(a|s) (alpha log pi(a|s) - min Q(s,a))
///     temperature    -log alpha (sum_a pi(a|s) log pi(a|s) + target entropy)
///
/// with the target entropy `target_entropy_scale * log |A|` (the paper's 0.98: most of the
/// uniform policy's entropy). Twin critics with target copies; Adam at 3e-4 for the actor,
/// the critics and the temperature (the paper's). On the off-policy loop as SAC is: the
/// prioritized buffer (each transition's priority the mean |TD error| of both critics),
/// n-step returns (the batch's discounts), data parallelism (one all-reduce an update) and
/// gradient accumulation. Float observations only; it acts by sampling from the policy to
/// explore and by its most likely action otherwise.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/categorical.hpp>
#include <anvil/algorithms/sac_config.hpp>
#include <anvil/algorithms/soft_state.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/network_config.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Algorithm policy: Soft Actor-Critic for discrete actions (see file comment).
class DiscreteSAC {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "sac_discrete";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;
  using Config = DiscreteSacConfig;

  DiscreteSAC(const EnvSpec& spec, const Config& cfg, const RunContext& ctx) : cfg_(cfg), device_(ctx.device) {
    if (!spec.discrete())
      throw ConfigError("discrete SAC (sac_discrete) needs a discrete action space; " + spec.name +
                        " has continuous actions: use SAC (train_sac)");
    if (spec.num_actions() < 2)
      throw ConfigError("discrete SAC: " + spec.name + " has " + std::to_string(spec.num_actions()) +
                        " action(s); it needs 2 or more to choose from");
    if (spec.byte_rows())
      throw ConfigError("discrete SAC reads float observations only; " + spec.name + "'s have images (" +
                        spec.layout.describe() + ")");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) +
                        ") is larger than sac_discrete.batch_size (" + std::to_string(*cfg.batch_size) +
                        "): micro-batches would be empty");
    actions_ = spec.num_actions();
    const auto od = spec.obs_dim();
    auto mlp = [&](const DiscreteSacNetConfig& n) {
      return nn::Mlp(od, std::vector<std::int64_t>(n.hidden->begin(), n.hidden->end()), actions_, *n.activation);
    };
    actor_ = mlp(*cfg.actor);
    q1_ = mlp(*cfg.critic);
    q2_ = mlp(*cfg.critic);
    t1_ = std::dynamic_pointer_cast<nn::MlpImpl>(q1_->clone());
    t2_ = std::dynamic_pointer_cast<nn::MlpImpl>(q2_->clone());
    for (auto* m : {&actor_, &q1_, &q2_, &t1_, &t2_}) (*m)->to(device_);
    auto params = [](std::initializer_list<const nn::Mlp*> ms) {
      std::vector<at::Tensor> out;
      for (const auto* m : ms)
        for (auto& p : (*m)->parameters()) out.push_back(p);
      return out;
    };
    for (auto& p : params({&t1_, &t2_})) p.set_requires_grad(false);
    target_entropy_ = *cfg.target_entropy_scale * std::log(static_cast<double>(actions_));
    log_alpha_ = torch::full({1}, std::log(*cfg.init_alpha), torch::TensorOptions().device(device_).requires_grad(true));
    const double s = ctx.lr_scale(cfg.batch_size);
    actor_opt_ = FlatAdam(actor_->parameters(), {.lr = cfg.actor_lr * s});
    critic_opt_ = FlatAdam(params({&q1_, &q2_}), {.lr = cfg.critic_lr * s});
    alpha_opt_ = FlatAdam({log_alpha_}, {.lr = cfg.alpha_lr * s});
    target_ = FlatParameters(params({&t1_, &t2_}));
    ema_.set_device(device_);
  }

  /// Action indices (int64 [N]) for a batch of observations: drawn from the policy to
  /// explore, else the most likely.
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    const auto logits = actor_->forward(obs.to(device_, at::kFloat));
    return mode == ActMode::explore ? categorical::sample(at::softmax(logits.to(at::kFloat), -1)) : logits.argmax(-1);
  }

  /// One update: the critics towards the soft Bellman target, and (every actor_update_freq
  /// updates) the actor and the temperature, all from the parameters as they were before it,
  /// so the critics' and the actor's gradients are taken at once when `ctx` has two threads.
  /// Then one step of the three optimizers (one all-reduce across ranks) and the targets'
  /// move (every target_update_freq updates).
  UpdateInfo update(const ReplayBatch& batch, StepContext& ctx) {
    const double alpha = this->alpha();
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    Part critic, actor;
    std::vector<at::Tensor> td_parts;
    const auto parts = ctx.micro_batches(batch.obs.size(0));
    for (const auto& part : parts) {
      ReplayBatch rows;
      const ReplayBatch& mb = parts.size() == 1 ? batch : (rows = rows_of(batch, part.begin, part.rows));
      Part c, a;
      if (actor_step)
        ctx.concurrently({[&] { c = critic_part(mb, alpha, ctx); }, [&] { a = actor_part(mb, alpha, ctx); }});
      else
        c = critic_part(mb, alpha, ctx);
      accumulate(critic.grad, c.grad, part);
      critic.add(c, part.share);
      td_parts.push_back(c.td);
      if (actor_step) {
        accumulate(actor.grad, a.grad, part);
        if (a.alpha_grad.defined()) accumulate(actor.alpha_grad, a.alpha_grad, part);
        actor.add(a, part.share);
      }
    }
    UpdateInfo info;
    // The target critics' average follows the critics' step (in its pass where it can).
    std::vector<StepContext::Step> steps{{&critic_opt_, critic.grad, cfg_.max_grad_norm}};
    if (updates_ % cfg_.target_update_freq == 0) {
      steps[0].then_polyak = target_.flat();
      steps[0].tau = *cfg_.tau;
    }
    info.metrics.emplace_back("critic_loss", critic.loss);
    info.metrics.emplace_back("q_mean", critic.q_mean);
    if (actor_step) {
      steps.push_back({&actor_opt_, actor.grad, cfg_.max_grad_norm});
      info.metrics.emplace_back("actor_loss", actor.loss);
      info.metrics.emplace_back("entropy", actor.entropy);
      if (cfg_.auto_alpha) {
        steps.push_back({&alpha_opt_, actor.alpha_grad, 0.0});
        info.metrics.emplace_back("alpha_loss", actor.alpha_loss);
      }
    }
    ctx.apply(std::move(steps));
    info.metrics.emplace_back("alpha", this->alpha());
    ++updates_;
    info.td_error = td_parts.size() == 1 ? td_parts[0] : at::cat(td_parts);
    return info;
  }

  /// The learning rates now, by optimizer (for logs).
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{"actor", actor_opt_.lr()}, {"critic", critic_opt_.lr()}, {"alpha", alpha_opt_.lr()}};
  }
  /// Each network's parameters as one flat tensor (for weight histograms).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor", actor_opt_.parameters().flat()}, {"critic", critic_opt_.parameters().flat()}};
  }
  /// How the gradients are taken (anvil::DescribesGradients): by autograd, always.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> gradient_paths() const {
    return {{"actor and critics", "discrete SAC has no hand-written passes"}};
  }

  /// The moving average of the actor's weights (`train.ema_decay`), as SAC keeps it.
  void ema_update(double decay) { ema_.update(actor_opt_.parameters().flat(), decay); }
  [[nodiscard]] const at::Tensor& ema_weights() const noexcept { return ema_.weights(); }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(actor_opt_.parameters().flat(), std::forward<F>(f));
  }

  /// The acting network for policy.safetensors (`ExportsTensors`): the actor MLP as
  /// `net.fc0`, `net.fc1`, ...; `anvil.load_policy` acts with its most likely action.
  [[nodiscard]] PolicyTensors policy_tensors() const {
    PolicyTensors p{"DiscreteSacActor", {}, {}, false};
    add_module_tensors(p, "net.", *actor_);
    p.meta = {{"obs_dim", std::to_string(actor_->in_features())},
              {"action_dim", std::to_string(actions_)},
              {"discrete", "1"},
              {"hidden", comma_list(*cfg_.actor->hidden)},
              {"activation", enum_text(*cfg_.actor->activation)}};
    return p;
  }
  /// The actor's parameters as policy.safetensors names them (`WarmStarts`: `init.weights`).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> policy_parameters() {
    return named_parameters_of(*actor_, "net.");
  }

  /// Everything a checkpoint holds (algorithms/soft_state.hpp, as SAC's): the actor and the
  /// critics with their Adam states, the target critics, the temperature with its optimizer,
  /// the update count and the average.
  using Saved = detail::SoftSaved;
  void save(BinaryWriter& w) const { detail::SoftState::save(*this, w); }
  /// Reads what `save` wrote, checking every size against this one; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const { return detail::SoftState::read(*this, r, "sac_discrete"); }
  void restore(const Saved& s) { detail::SoftState::restore(*this, s); }

  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  /// The two critics and their targets.
  [[nodiscard]] std::pair<nn::Mlp&, nn::Mlp&> critics() noexcept { return {q1_, q2_}; }
  [[nodiscard]] std::pair<nn::Mlp&, nn::Mlp&> target_critics() noexcept { return {t1_, t2_}; }
  [[nodiscard]] const FlatAdam& actor_optimizer() const noexcept { return actor_opt_; }
  [[nodiscard]] const FlatAdam& critic_optimizer() const noexcept { return critic_opt_; }
  [[nodiscard]] double alpha() const { return std::exp(log_alpha_.detach().to(at::kCPU, at::kDouble).item<double>()); }
  [[nodiscard]] double target_entropy() const noexcept { return target_entropy_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

 private:
  friend struct detail::SoftState;

  // What one part of an update gives back: its gradient(s), losses and the critics' |TD errors|.
  struct Part {
    at::Tensor grad, alpha_grad, td;
    double loss = 0, q_mean = 0, entropy = 0, alpha_loss = 0;
    void add(const Part& p, double share) {
      loss += share * p.loss, q_mean += share * p.q_mean;
      entropy += share * p.entropy, alpha_loss += share * p.alpha_loss;
    }
  };

  // The policy's log-probabilities of every action, [B, |A|], in float32.
  [[nodiscard]] at::Tensor log_policy(const at::Tensor& obs) { return at::log_softmax(actor_->forward(obs).to(at::kFloat), -1); }

  // The critics' halved squared errors against the soft Bellman target (weighed by the
  // batch's importance weights when it has them), and their gradient.
  Part critic_part(const ReplayBatch& b, double alpha, StepContext& ctx) {
    at::Tensor target;
    {
      torch::NoGradGuard no_grad;
      auto guard = ctx.autocast();
      const auto logp = log_policy(b.next_obs);
      const auto q = at::min(t1_->forward(b.next_obs), t2_->forward(b.next_obs)).to(at::kFloat);
      const auto v = (logp.exp() * (q - alpha * logp)).sum(-1);
      const auto discount = b.discount.defined() ? b.discount : at::full({}, *cfg_.gamma, v.options());
      target = b.reward + discount * (1.0 - b.terminated) * v;
    }
    auto guard = ctx.autocast();
    const auto action = b.action.to(at::kLong).reshape({-1, 1});
    const auto q1 = q1_->forward(b.obs).to(at::kFloat).gather(1, action).squeeze(1);
    const auto q2 = q2_->forward(b.obs).to(at::kFloat).gather(1, action).squeeze(1);
    const auto e1 = q1 - target, e2 = q2 - target;
    const auto per_sample = 0.5 * (e1.square() + e2.square());
    const auto loss = b.weight.defined() ? (b.weight * per_sample).mean() : per_sample.mean();
    Part r;
    r.grad = ctx.gradient(loss, critic_opt_);
    r.td = 0.5 * (e1.abs() + e2.abs()).detach();
    r.loss = loss.item<double>();
    r.q_mean = q1.detach().mean().item<double>();
    return r;
  }

  // The actor's expected loss over every action against the critics as they are (no
  // gradient into them), and the temperature's gradient from the policy's entropy.
  Part actor_part(const ReplayBatch& b, double alpha, StepContext& ctx) {
    auto guard = ctx.autocast();
    const auto logp = log_policy(b.obs);
    const auto p = logp.exp();
    at::Tensor q;
    {
      torch::NoGradGuard no_grad;
      q = at::min(q1_->forward(b.obs), q2_->forward(b.obs)).to(at::kFloat);
    }
    const auto loss = (p * (alpha * logp - q)).sum(-1).mean();
    Part r;
    r.grad = ctx.gradient(loss, actor_opt_);
    const auto expected_log_prob = (p * logp).sum(-1).detach();  // minus each row's entropy
    r.loss = loss.item<double>();
    r.entropy = -expected_log_prob.mean().item<double>();
    if (cfg_.auto_alpha) {
      const auto alpha_loss = -(log_alpha_ * (expected_log_prob + target_entropy_)).mean();
      r.alpha_grad = ctx.gradient(alpha_loss, alpha_opt_);
      r.alpha_loss = alpha_loss.item<double>();
    }
    return r;
  }

  Config cfg_;
  c10::Device device_;
  std::int64_t actions_ = 0;
  nn::Mlp actor_{nullptr}, q1_{nullptr}, q2_{nullptr}, t1_{nullptr}, t2_{nullptr};
  at::Tensor log_alpha_;
  double target_entropy_ = 0;
  FlatAdam actor_opt_, critic_opt_, alpha_opt_;
  FlatParameters target_;
  std::int64_t updates_ = 0;
  Ema ema_;
};

static_assert(Algorithm<DiscreteSAC>);

}  // namespace anvil
