#pragma once
/// @file
/// Recurrent PPO: PPO (algorithms/ppo.hpp: the clipped objective, value loss, entropy
/// bonus, annealed Adam, KL early stop) whose actor and value each carry a GRU state
/// through the episode (`nn::GruActor`: layers on the observation, a GRU cell, a linear
/// head), for envs whose current observation does not tell the whole state (the GRU policy
/// of Habitat's PPO; CleanRL's and SB3-contrib's recurrent PPO with a GRU for the LSTM).
///
/// Memory (`CarriesMemory`): the actor's and the value's states side by side, [N, 2 x
/// ppo_recurrent.memory] per env, held by whoever steps the envs and forgotten where an
/// episode starts. The rollout keeps the memory each step acted from.
///
/// Learning from sequences with *stored states*, not a burn-in: each minibatch is made of
/// runs of `sequence_length` consecutive steps of one env (a whole rollout by default),
/// unrolled from the memory the policy had when it acted on the run's first step, the
/// memory forgotten again at every episode start inside the run. Why stored states: the
/// data is on-policy, so the stored state is exactly the one the rollout's
/// log-probabilities came from (the first epoch's ratios are 1, as in feed-forward PPO),
/// and it is stale only by the few epochs of one rollout. A burn-in (R2D2's answer to
/// states thousands of updates old in a replay buffer) would spend steps of every
/// sequence on warming a state up and still not reproduce the acting one. Gradients flow
/// through the whole sequence (back-propagation through time).
///
/// Discrete actions: a categorical policy; continuous: a Gaussian with a state-independent
/// log standard deviation, in the Trainer's normalised units as PPO's. Autograd only (no
/// hand-written path); observations with images are refused by the Trainer. The actor
/// goes to policy.safetensors (kind `RecurrentPpoActor`): in Python `anvil.load_policy`
/// gives a module that takes and returns the actor's memory.

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/ppo_objective.hpp>
#include <anvil/core/agent_memory.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/nn/gru_actor.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Algorithm policy: recurrent PPO (see file comment).
class RecurrentPPO {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "ppo_recurrent";
  static constexpr bool on_policy = true;
  using Batch = RolloutBatch;
  using Config = RecurrentPpoConfig;

  RecurrentPPO(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), discrete_(spec.discrete()),
        act_dim_(spec.discrete() ? spec.num_actions() : spec.action_dim()), width_(cfg.memory) {
    const std::string section(config_section.view());
    if (discrete_ && act_dim_ < 2)
      throw ConfigError(section + ": " + spec.name + " has " + std::to_string(act_dim_) + " discrete action(s); needs 2 or more");
    const std::int64_t od = spec.obs_dim();
    actor_ = nn::GruActor(od, nn::widths(cfg.actor->hidden), width_, act_dim_, cfg.actor->activation);
    critic_ = nn::GruActor(od, nn::widths(cfg.critic->hidden), width_, 1, cfg.critic->activation);
    if (cfg.ortho_init) {
      init_orthogonal(*actor_, 0.01);
      init_orthogonal(*critic_, 1.0);
    }
    actor_->to(device_);
    critic_->to(device_);
    std::vector<at::Tensor> params = actor_->parameters();
    if (!discrete_) {
      log_std_ = torch::full({act_dim_}, *cfg.init_log_std, at::TensorOptions().device(device_).requires_grad(true));
      params.push_back(log_std_);
    }
    for (const auto& p : critic_->parameters()) params.push_back(p);
    opt_ = detail::PpoOptimizer(std::move(params), cfg.lr * ctx.lr_scale(cfg.minibatch_size), cfg.adam_eps, section,
                                device_);
  }

  /// The numbers of memory per env: the actor's state, then the value's.
  [[nodiscard]] std::int64_t memory_width() const noexcept { return 2 * width_; }
  /// Steps per sequence the updates unroll (0: a whole rollout).
  [[nodiscard]] std::int64_t sequence_length() const noexcept { return cfg_.sequence_length; }

  /// Actions for observations of N envs, acting from `memory` (planned for N envs here
  /// when it has no shape yet: every env at an episode's start) and moving it on: sampled
  /// to explore, the mode when deterministic. Discrete: int64 [N]; continuous: [N, d].
  at::Tensor act(const at::Tensor& obs, ActMode mode, AgentMemory& memory) {
    torch::NoGradGuard no_grad;
    const auto s = advance(obs, memory);
    if (discrete_) return mode == ActMode::explore ? detail::sample_categorical(s.out) : s.out.argmax(-1);
    return mode == ActMode::explore ? s.out + log_std_.exp() * at::randn_like(s.out) : s.out;
  }
  /// Actions as at the first step of an episode (a fresh memory): what a caller without
  /// memory gets.
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    AgentMemory fresh;
    return act(obs, mode, fresh);
  }

  /// A sampled action with its log-probability and the value of `obs`, from `memory`
  /// (moved on), and the memory it acted from, for the rollout.
  RolloutAct act_for_rollout(const at::Tensor& obs, AgentMemory& memory) {
    torch::NoGradGuard no_grad;
    auto s = advance(obs, memory);
    RolloutAct r;
    if (discrete_) {
      r.action = detail::sample_categorical(s.out);
      r.log_prob = s.out.log_softmax(-1).gather(-1, r.action.unsqueeze(-1)).squeeze(-1);
    } else {
      r.action = s.out + log_std_.exp() * at::randn_like(s.out);
      r.log_prob = detail::gaussian_log_prob(s.out, log_std_, r.action);
    }
    r.value = std::move(s.value);
    r.memory = std::move(s.from);
    return r;
  }

  /// Values [N] of `obs` from `memory`, which stays as it is.
  at::Tensor value(const at::Tensor& obs, const AgentMemory& memory) {
    torch::NoGradGuard no_grad;
    const auto o = obs.to(device_, at::kFloat);
    const auto h = from(memory, o.size(0));
    return critic_->step(o, h.narrow(1, width_, width_)).first.squeeze(-1);
  }

  /// One gradient step on a minibatch of sequences (`RolloutBatch::sequence_length`), each
  /// unrolled from its stored memory: clipped surrogate + vf_coef * value loss - ent_coef *
  /// entropy. With gradient accumulation the sequences are split into the context's
  /// micro-batches and their weighted gradients summed before one step.
  UpdateInfo update(const RolloutBatch& b, StepContext& ctx) {
    if (b.sequence_length < 1 || !b.memory.defined() || !b.first.defined())
      throw Error(std::string(config_section.view()) +
                  ": update needs a minibatch of sequences with their stored memory (RolloutBuffer::sequences)");
    const std::int64_t sequences = b.obs.size(0) / b.sequence_length;
    Losses sum;
    at::Tensor grad;
    const auto parts = ctx.micro_batches(sequences);
    for (const auto& part : parts) {
      Losses l;
      const RolloutBatch mb = parts.size() == 1 ? b : some_sequences(b, part.begin, part.rows);
      accumulate(grad, ctx.gradient(losses(mb, ctx, l), opt_.adam()), part);
      sum.add(l, part.share);
    }
    return opt_.step(ctx, grad, cfg_.max_grad_norm, sum, log_std_);
  }

  /// Ends an epoch over the rollout: whether to run another (`target_kl`, as PPO).
  bool end_epoch(StepContext& ctx) { return opt_.end_epoch(cfg_.target_kl, ctx); }
  /// Where the run is, as the fraction of train.steps done: anneals the learning rate.
  void set_progress(double done) { opt_.set_progress(cfg_.anneal_lr, done); }
  [[nodiscard]] int epochs() const noexcept { return cfg_.epochs; }
  [[nodiscard]] std::int64_t minibatch_size() const noexcept { return cfg_.minibatch_size; }
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

  /// The averaged weights (`train.ema_decay`), as PPO's.
  void ema_update(double decay) { opt_.ema_update(decay); }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return opt_.with_ema_weights(std::forward<F>(f));
  }
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{std::string(config_section.view()), opt_.adam().lr()}};
  }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor_critic", opt_.adam().parameters().flat()}};
  }
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> gradient_paths() const {
    return {{"actor and value (GRU)", "recurrent networks: autograd through time"}};
  }

  /// State protocol (core/state.hpp): the networks with their Adam state, the update count,
  /// the averaged weights (the envs' memory is the run's, per rank: `AgentMemory`).
  using Saved = detail::PpoOptimizer::Saved;
  void save(BinaryWriter& w) const { opt_.save(w); }
  [[nodiscard]] Saved read(BinaryReader& r) const { return opt_.read(r); }
  void restore(const Saved& s) { opt_.restore(s); }

  /// The acting network for policy.safetensors (`ExportsTensors`): the actor's layers,
  /// GRU cell and head as `net.fc0`, ..., `net.gru.*`, `net.head.*`, with its memory width;
  /// its deterministic action is the argmax (discrete) or the mean (continuous, clipped and
  /// scaled by the run as its collector does), from the actor's part of the memory.
  [[nodiscard]] PolicyTensors policy_tensors() const {
    PolicyTensors p{"RecurrentPpoActor", {}, {}, !discrete_};
    add_module_tensors(p, "net.", *actor_);
    p.meta = {{"obs_dim", std::to_string(actor_->in_features())},
              {"action_dim", std::to_string(act_dim_)},
              {"discrete", discrete_ ? "1" : "0"},
              {"hidden", comma_list(*cfg_.actor->hidden)},
              {"activation", enum_text(*cfg_.actor->activation)},
              {"memory", std::to_string(width_)}};
    return p;
  }

  /// What the current networks make of a minibatch of sequences, unrolled from their
  /// stored memory (with gradients): the log-probability of each row's action, the
  /// entropy of its distribution and its value, [B] each in float32.
  struct Unrolled {
    at::Tensor log_prob, entropy, value;
  };
  [[nodiscard]] Unrolled unroll(const RolloutBatch& b) {
    const std::int64_t len = b.sequence_length, rows = b.obs.size(0), k = rows / len;
    const auto x = b.obs.to(device_, at::kFloat).view({len, k, b.obs.size(1)});
    const auto first = b.first.view({len, k});
    const auto out = actor_->unroll(x, first, b.memory.narrow(1, 0, width_)).reshape({rows, act_dim_}).to(at::kFloat);
    Unrolled u;
    u.value = critic_->unroll(x, first, b.memory.narrow(1, width_, width_)).reshape({rows}).to(at::kFloat);
    if (discrete_) {
      const auto lp = out.log_softmax(-1);
      u.log_prob = lp.gather(-1, b.action.unsqueeze(-1)).squeeze(-1);
      u.entropy = -(lp.exp() * lp).sum(-1);
    } else {
      u.log_prob = detail::gaussian_log_prob(out, log_std_, b.action);
      u.entropy = detail::gaussian_entropy(log_std_, rows);
    }
    return u;
  }

  [[nodiscard]] nn::GruActor& actor() noexcept { return actor_; }
  [[nodiscard]] nn::GruActor& critic() noexcept { return critic_; }
  [[nodiscard]] const at::Tensor& log_std() const noexcept { return log_std_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_.adam(); }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return opt_.updates(); }
  [[nodiscard]] bool discrete() const noexcept { return discrete_; }

 private:
  using Losses = detail::PpoLosses;

  // One step of both networks from `memory` (its episode starts forgotten), which then
  // holds the next states: the actor's output, the value, and the memory acted from.
  struct Step {
    at::Tensor out, value, from;
  };
  Step advance(const at::Tensor& obs, AgentMemory& memory) {
    const auto o = obs.to(device_, at::kFloat);
    const std::int64_t n = o.size(0);
    memory.plan(n, memory_width(), device_);
    Step s;
    s.from = from(memory, n);
    auto [out, next_a] = actor_->step(o, s.from.narrow(1, 0, width_));
    auto [v, next_c] = critic_->step(o, s.from.narrow(1, width_, width_));
    memory.state = at::cat({next_a, next_c}, 1);
    memory.first.zero_();
    s.out = std::move(out);
    s.value = v.squeeze(-1);
    return s;
  }
  // The memory to act from for `n` rows: the held state, zero where an episode starts.
  at::Tensor from(const AgentMemory& memory, std::int64_t n) const {
    if (!memory.planned() || memory.state.size(0) != n || memory.state.size(1) != memory_width())
      throw Error(std::string(config_section.view()) + ": the memory holds " +
                  (memory.planned() ? std::to_string(memory.state.size(0)) + " x " + std::to_string(memory.state.size(1))
                                    : std::string("nothing")) +
                  " but " + std::to_string(n) + " envs x " + std::to_string(memory_width()) + " are acted on");
    return memory.state * (1 - memory.first).unsqueeze(-1);
  }

  // The loss of a minibatch of sequences; its parts reported in `out`.
  at::Tensor losses(const RolloutBatch& b, StepContext& ctx, Losses& out) {
    auto guard = ctx.autocast();
    const auto u = unroll(b);
    return detail::clipped_objective(u.log_prob, u.entropy, u.value, b, cfg_, out);
  }

  // Sequences [begin, begin + n) of a minibatch of sequences (time first).
  static RolloutBatch some_sequences(const RolloutBatch& b, std::int64_t begin, std::int64_t n) {
    const std::int64_t len = b.sequence_length, k = b.obs.size(0) / len;
    auto cut = [&](const at::Tensor& t) {
      std::vector<std::int64_t> shape{len, k};
      for (std::int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
      auto parts = t.view(shape).narrow(1, begin, n);
      shape[1] = n;
      std::vector<std::int64_t> flat{len * n};
      flat.insert(flat.end(), shape.begin() + 2, shape.end());
      return parts.reshape(flat);
    };
    RolloutBatch out{cut(b.obs), cut(b.action), cut(b.log_prob), cut(b.advantage), cut(b.returns), cut(b.value)};
    out.first = cut(b.first);
    out.memory = b.memory.narrow(0, begin, n);
    out.sequence_length = len;
    return out;
  }

  // Orthogonal weights with gain sqrt(2) in the layers before the cell and `head_gain` in
  // the output layer, zero biases; the GRU cell keeps its own initialisation.
  static void init_orthogonal(nn::GruActorImpl& net, double head_gain) {
    torch::NoGradGuard no_grad;
    for (auto& item : net.named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      if (name.starts_with("gru.")) continue;
      if (name.ends_with(".bias")) p.zero_();
      else torch::nn::init::orthogonal_(p, name.starts_with("head.") ? head_gain : std::sqrt(2.0));
    }
  }

  Config cfg_;
  c10::Device device_;
  bool discrete_;
  std::int64_t act_dim_;  ///< action dimensions, or the number of discrete actions
  std::int64_t width_;    ///< each network's GRU state
  nn::GruActor actor_{nullptr}, critic_{nullptr};
  at::Tensor log_std_;
  detail::PpoOptimizer opt_;  ///< Adam, its schedule, the averaged weights (train.ema_decay)
};

static_assert(OnPolicyAlgorithm<RecurrentPPO>);
static_assert(CarriesMemory<RecurrentPPO>);

}  // namespace anvil
