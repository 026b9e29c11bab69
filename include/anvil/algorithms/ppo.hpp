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
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/ppo_graph.hpp>
#include <anvil/algorithms/ppo_manual.hpp>
#include <anvil/algorithms/ppo_objective.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/reused_tensor.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/observation_encoder.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Algorithm policy: PPO (see file comment).
class PPO {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "ppo";
  static constexpr bool on_policy = true;
  /// Observations with images go through one convolutional encoder that the actor and the
  /// critic share, trained by the whole loss (nn::ObsEncoder).
  static constexpr bool reads_images = true;
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
    if (spec.byte_rows()) encoder_ = nn::ObsEncoder(spec.layout, *cfg.encoder);
    const auto od = encoder_ ? encoder_->output_size() : spec.obs_dim();
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
    if (encoder_) {
      encoder_->to(device_);
      for (const auto& p : encoder_->parameters()) params.push_back(p);
    }
    opt_ = detail::PpoOptimizer(std::move(params), cfg.lr * ctx.lr_scale(cfg.minibatch_size), cfg.adam_eps,
                                std::string(config_section.view()), device_);
    autograd_why_ = nn::why_autograd(cfg.manual_backward, std::string(config_section.view()), device_,
                                         {{"the actor's", encoder_ ? std::string("input comes through a convolutional encoder (images)")
                                                                   : nn::MlpTape::unsupported(*actor_)},
                                          {"the critic's", nn::MlpTape::unsupported(*critic_)}});
    if (autograd_why_.empty())
      manual_ = std::make_unique<detail::PpoManual>(opt_.adam().parameters(), actor_, log_std_, critic_);
  }

  /// Actions for a batch of observations: sampled to explore, the mode (argmax or mean)
  /// when deterministic. Discrete: int64 [N]; continuous: float [N, act_dim].
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      const auto& out = manual_->act_actor.forward(*actor_, o);
      if (discrete_) return mode == ActMode::explore ? manual_->categorical(out, nullptr) : out.argmax(-1);
      if (mode != ActMode::explore) return out.clone();
      return manual_->sample(out, log_std_, nullptr);
    }
    const auto out = actor_->forward(features(obs));
    if (discrete_) return mode == ActMode::explore ? sample_categorical(out) : out.argmax(-1);
    return mode == ActMode::explore ? out + log_std_.exp() * at::randn_like(out) : out;
  }

  /// A sampled action with its log-probability and the value of `obs`, for the rollout.
  RolloutAct act_for_rollout(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      // Once per env step: no LibTorch op beyond the outputs' allocations and the noise.
      const bool ready = obs.device() == device_ && obs.scalar_type() == at::kFloat && obs.is_contiguous();
      const auto o = ready ? obs : obs.to(device_, at::kFloat).contiguous();
      const std::int64_t n = o.size(0);
      RolloutAct r;
      // (the outputs: the last step's tensors again, once the rollout has copied and dropped them)
      r.log_prob = rollout_log_prob_.take({n}, at::kFloat);
      const auto& out = manual_->act_actor.forward(*actor_, o);
      r.action = discrete_ ? manual_->categorical(out, &r.log_prob) : manual_->sample(out, log_std_, &r.log_prob);
      const auto& v = manual_->act_critic.forward(*critic_, o);  // [n, 1], the tape's buffer
      r.value = rollout_value_.take({n}, at::kFloat);
      std::memcpy(r.value.data_ptr<float>(), v.data_ptr<float>(), static_cast<std::size_t>(n) * sizeof(float));
      return r;
    }
    const auto o = features(obs);
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
    return critic_->forward(features(obs)).squeeze(-1);
  }

  /// One gradient step on a minibatch: clipped surrogate + vf_coef * value loss -
  /// ent_coef * entropy. With gradient accumulation the minibatch is split into the
  /// context's micro-batches and their weighted gradients summed before one step. On a GPU,
  /// with `cuda_graph` on and an update a graph can hold (one process, no
  /// random image shifts), each minibatch size's update is replayed from a CUDA graph
  /// (algorithms/ppo_graph.hpp).
  UpdateInfo update(const RolloutBatch& b, StepContext& ctx) {
    if (detail::PpoGraphed::graphable(*this, b, ctx)) return detail::PpoGraphed::update(*this, b, ctx);
    return eager_update(b, ctx);
  }

  /// The update as a CUDA graph holds it, run op by op on any device: device work alone (the
  /// loss's parts stay a tensor until the step is taken), then the host's bookkeeping. It
  /// gives what `update` gives within float rounding; the tests check the two agree on the
  /// CPU, where no graph runs. Refused, saying why, where a graph could not hold the update.
  UpdateInfo update_as_captured(const RolloutBatch& b, StepContext& ctx) {
    return detail::PpoGraphed::as_captured(*this, b, ctx);
  }
  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }
  /// What the run header says of CUDA graphs on a GPU: what is captured, and why not where not.
  [[nodiscard]] std::string cuda_graph_note(const StepContext& ctx) const {
    const std::string who(config_section.view());
    const std::string why = detail::PpoGraphed::why_not(*this, ctx);
    if (!why.empty()) return who + "'s update runs op by op: " + why + "; acting runs op by op";
    return who + "'s minibatch update is captured (a graph per minibatch size, after " +
           std::to_string(GraphedUpdate::kWarmups) + " warm-ups op by op each); acting runs op by op";
  }

  /// Ends an epoch over the rollout: whether to run another. With `target_kl` set, the
  /// epochs stop once the epoch's mean approximate KL between the policy that collected the
  /// rollout and the current one, averaged over the ranks (so every rank stops at the same
  /// epoch), exceeds it.
  bool end_epoch(StepContext& ctx) { return opt_.end_epoch(cfg_.target_kl, ctx); }

  /// Where the run is, as the fraction of train.steps done: anneals the learning rate.
  void set_progress(double done) { opt_.set_progress(cfg_.anneal_lr, done); }
  [[nodiscard]] int epochs() const noexcept { return cfg_.epochs; }
  [[nodiscard]] std::int64_t minibatch_size() const noexcept { return cfg_.minibatch_size; }
  [[nodiscard]] double target_kl() const noexcept { return cfg_.target_kl; }
  /// The discount (the rollout's advantages, a reward normaliser's return).
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

  /// Moves the average of the actor-critic's weights towards the current ones
  /// (`train.ema_decay`; see optim/ema.hpp); evaluation and checkpoints use it.
  void ema_update(double decay) { opt_.ema_update(decay); }
  /// Runs `f` with the averaged weights in place (when there are any), then restores them.
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return opt_.with_ema_weights(std::forward<F>(f));
  }

  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"ppo", opt_.adam().lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor_critic", opt_.adam().parameters().flat()}};
  }

  /// State protocol (core/state.hpp): the actor-critic with its Adam state, the update
  /// count, the averaged weights.
  using Saved = detail::PpoOptimizer::Saved;
  void save(BinaryWriter& w) const { opt_.save(w); }
  [[nodiscard]] Saved read(BinaryReader& r) const { return opt_.read(r); }
  void restore(const Saved& s) {
    opt_.restore(s);
    graphs_.clear();  // captured again from the restored state (warm-ups first)
  }

  /// The acting network for policy.safetensors (`ExportsTensors`): the actor MLP as `net.fc0`,
  /// `net.fc1`, ...; its deterministic action is the argmax (discrete) or the mean
  /// (continuous, clipped and scaled by the run as its collector does).
  [[nodiscard]] PolicyTensors policy_tensors() const {
    PolicyTensors p{"PpoActor", {}, {}, !discrete_};
    add_module_tensors(p, "net.", *actor_);
    p.meta = {{"obs_dim", std::to_string(actor_->in_features())},
              {"action_dim", std::to_string(act_dim_)},
              {"discrete", discrete_ ? "1" : "0"},
              {"hidden", comma_list(*cfg_.actor->hidden)},
              {"activation", enum_text(*cfg_.actor->activation)}};
    if (encoder_) nn::add_encoder_tensors(p, *encoder_);  // images: the heads' shared encoder
    return p;
  }

  /// The actor's parameters as policy.safetensors names them (`WarmStarts`: `init.weights`),
  /// with images the heads' shared encoder (`encoder.*`) too.
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> policy_parameters() {
    auto out = named_parameters_of(*actor_, "net.");
    if (encoder_)
      for (auto& p : named_parameters_of(*encoder_, "encoder.")) out.push_back(std::move(p));
    return out;
  }

  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  [[nodiscard]] nn::Mlp& critic() noexcept { return critic_; }
  /// Log standard deviation of continuous actions (undefined for discrete ones).
  [[nodiscard]] const at::Tensor& log_std() const noexcept { return log_std_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_.adam(); }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return opt_.updates(); }
  [[nodiscard]] bool discrete() const noexcept { return discrete_; }
  /// Whether acting and updates take the hand-written fast path (`manual_backward`).
  [[nodiscard]] bool manual_backward() const noexcept { return manual_ != nullptr; }
  /// How the actor's and critic's gradients are taken: by the hand-written passes (why
  /// empty), or autograd and why (anvil::DescribesGradients).
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> gradient_paths() const {
    return {{"actor and critic", autograd_why_}};
  }

 private:
  using Losses = detail::PpoLosses;

  // What the heads read: the encoder's features of rows of parts (bytes to the device), or
  // the float observations.
  at::Tensor features(const at::Tensor& obs) {
    if (encoder_) {
      nn::detail::check_rows(obs, encoder_->layout(), "PPO: act");
      return encoder_->forward(obs.to(device_));
    }
    return obs.to(device_, at::kFloat);
  }

  // The update op by op (what `update` runs when no graph holds it).
  UpdateInfo eager_update(const RolloutBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    Losses sum;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      Losses l;
      const RolloutBatch& mb = whole ? b : slice(b, part.begin, part.rows);
      auto g = manual_ && !ctx.autocasts() && !ctx.scales_losses()
                   ? manual_->gradient(*actor_, *critic_, log_std_, cfg_, mb, l)
                   : ctx.gradient(losses(mb, ctx, l), opt_.adam());
      accumulate(grad, std::move(g), part);
      sum.add(l, part.share);
    }
    return opt_.step(ctx, grad, cfg_.max_grad_norm, sum, log_std_);
  }


  // The loss of a (micro-)batch; its parts reported in `out`.
  at::Tensor losses(const RolloutBatch& b, StepContext& ctx, Losses& out) {
    auto [loss, parts] = loss_parts(b, ctx);
    out = Losses::of(parts);
    return loss;
  }
  // The loss of a (micro-)batch and its parts as a tensor (`detail::clipped_objective_parts`),
  // with no value read back to the host.
  std::pair<at::Tensor, at::Tensor> loss_parts(const RolloutBatch& b, StepContext& ctx) {
    auto guard = ctx.autocast();
    at::Tensor x = b.obs;
    if (encoder_) {  // images: encoded once for both heads (randomly shifted first with encoder.shift, as RAD does)
      x = encoder_->forward(nn::shift_images(b.obs, encoder_->layout(), *cfg_.encoder->shift));
    }
    const auto logits = actor_->forward(x).to(at::kFloat);
    at::Tensor log_prob, entropy;
    if (discrete_) {
      const auto lp = logits.log_softmax(-1);
      log_prob = lp.gather(-1, b.action.unsqueeze(-1)).squeeze(-1);
      entropy = -(lp.exp() * lp).sum(-1);
    } else {
      log_prob = gaussian_log_prob(logits, b.action);
      entropy = detail::gaussian_entropy(log_std_, b.obs.size(0));
    }
    const auto v = critic_->forward(x).squeeze(-1).to(at::kFloat);
    return detail::clipped_objective_parts(log_prob, entropy, v, b, cfg_);
  }

  at::Tensor gaussian_log_prob(const at::Tensor& mean, const at::Tensor& action) const {
    return detail::gaussian_log_prob(mean, log_std_, action);
  }
  static at::Tensor sample_categorical(const at::Tensor& logits) { return detail::sample_categorical(logits); }
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
  detail::PpoOptimizer opt_;         ///< Adam, its schedule, the averaged weights (train.ema_decay)
  nn::ObsEncoder encoder_{nullptr};  ///< observations with images: the heads' shared encoder
  std::unique_ptr<detail::PpoManual> manual_;  ///< the hand-written path, when it applies
  detail::ReusedTensor rollout_log_prob_, rollout_value_;  ///< act_for_rollout's outputs on that path
  std::string autograd_why_;                   ///< why not ("" when it applies)
  detail::PpoGraphs graphs_;  ///< the update in CUDA graphs, one per minibatch size (algorithms/ppo_graph.hpp)

  friend struct detail::PpoGraphed;
};

static_assert(OnPolicyAlgorithm<PPO>);

}  // namespace anvil
