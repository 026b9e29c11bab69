#pragma once
/// @file
/// Soft Actor-Critic (Haarnoja, Zhou, Abbeel, Levine 2018, "Soft Actor-Critic: Off-Policy
/// Maximum Entropy Deep Reinforcement Learning with a Stochastic Actor"; with automatic
/// entropy tuning from Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and
/// Applications"). Defaults are the published hyperparameters: Adam at 3e-4, batch 256,
/// gamma 0.99, tau 0.005, 256x256 networks, target entropy -|A|.
///
/// With an env that has tasks (a multi-task suite; `EnvSpec::tasks`), the `tasks` section
/// gives each task its own learned temperature, picked by each transition's task in every
/// loss, with its own target entropy, and can weight each transition's losses by its
/// task's T * softmax(-log alpha) (Yang et al. 2020, "Multi-Task Reinforcement Learning with
/// Soft Modularization"; the Meta-World+ baselines' `use_task_weights`): the multi-task SAC
/// of Yu et al. 2019 (Meta-World) with disentangled temperatures. `MultiTaskSAC` is this
/// algorithm with those on by default, in its own config section (`mtsac`). With
/// `actor.heads` and `critic.heads` at the number of tasks, each task has its own output
/// layer in the actor and the critics (nn::MlpHeads), picked by the observation's task
/// one-hot: Meta-World's multi-head SAC (MT-MH-SAC).

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <anvil/algorithms/sac_config.hpp>
#include <anvil/algorithms/sac_graph.hpp>
#include <anvil/algorithms/sac_manual.hpp>
#include <anvil/algorithms/sac_parts.hpp>
#include <anvil/algorithms/soft_state.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/randn.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/twin_q.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Algorithm policy: Soft Actor-Critic (see file comment) with swappable networks.
/// @tparam Actor  a `SquashedPolicyNetwork` (default: tanh-Gaussian MLP)
/// @tparam Critic a `TwinCriticNetwork` (default: two MLP Q-functions)
/// @tparam kMultiTask MultiTaskSAC: section `mtsac`, a temperature per task by default
template <class Actor, class Critic, bool kMultiTask>
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
  static constexpr auto config_section = detail::sac_config_section<kMultiTask>;
  static constexpr bool on_policy = false;
  /// Observations with images go through a convolutional encoder (see the constructor).
  static constexpr bool reads_images = true;
  using Batch = ReplayBatch;

  using Config = SacConfig<detail::module_config_t<Actor>, detail::module_config_t<Critic>, kMultiTask>;

  BasicSAC(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device) {
    if (spec.discrete())
      throw ConfigError("SAC needs a continuous (Box) action space; " + spec.name +
                        " has discrete actions: use DiscreteSAC (train_sac_discrete) or PPO");
    const auto& box = std::get<Box>(spec.action);
    for (std::size_t i = 0; i < box.size(); ++i)
      if (!std::isfinite(box.low[i]) || !std::isfinite(box.high[i]))
        throw ConfigError("SAC squashes actions into the action space's bounds, but " + spec.name +
                          "'s action " + std::to_string(i) + " is unbounded");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than " +
                        std::string(config_section.view()) + ".batch_size (" + std::to_string(*cfg.batch_size) +
                        "): micro-batches would be empty");
    const auto ad = spec.action_dim();
    act_dim_ = ad;
    // Observations with images: one encoder, the critic's, its features shared with the
    // actor with the gradient stopped (nn::GaussianActor::share_encoder).
    nn::ObsEncoder encoder{nullptr};
    if (spec.byte_rows()) {
      if constexpr (kReadsImages) {
        encoder = nn::ObsEncoder(spec.layout, *cfg.encoder);
        layout_ = spec.layout;
      } else {
        throw ConfigError(spec.name + "'s observations have images (" + spec.layout.describe() +
                          "); these networks read float observations only (nn::GaussianActor and nn::TwinQ read images)");
      }
    }
    const auto od = encoder ? encoder->output_size() : spec.obs_dim();
    if constexpr (kDefaultNetworks) {  // output heads, one per task, read the observation's task one-hot
      const auto tasks = static_cast<int>(spec.tasks.size());
      for (const auto& [net, heads] : {std::pair{"actor", *cfg.actor->heads}, std::pair{"critic", *cfg.critic->heads}})
        if (heads > 1 && (encoder || heads != tasks))
          throw ConfigError(std::string(config_section.view()) + "." + net + ".heads=" + std::to_string(heads) +
                            " gives each task its own output layer, picked by the observation's task one-hot: it "
                            "needs an env with " + std::to_string(heads) + " tasks and float observations; " +
                            spec.name + " has " + std::to_string(tasks) + " task" + (tasks == 1 ? "" : "s") +
                            (encoder ? " and images" : ""));
    }
    actor_ = Actor(od, ad, *cfg.actor);
    critic_ = Critic(od, ad, *cfg.critic);
    if constexpr (kReadsImages) {
      if (encoder) {
        critic_->set_encoder(encoder);
        actor_->share_encoder(encoder);
      }
    }
    critic_target_ = std::dynamic_pointer_cast<typename Critic::ContainedType>(critic_->clone());
    actor_->to(device_);
    critic_->to(device_);
    critic_target_->to(device_);
    for (auto& p : critic_target_->parameters()) p.set_requires_grad(false);
    // Temperatures: one, or one per task (tasks.per_task_alpha with an env that has tasks).
    const std::string sec(config_section.view());
    const auto& tc = *cfg.tasks;
    task_names_ = spec.tasks;
    const auto tasks = static_cast<std::int64_t>(task_names_.size());
    alphas_ = tc.per_task_alpha && tasks > 1 ? tasks : 1;
    if (tc.loss_weights && alphas_ == 1)
      throw ConfigError(sec + ".tasks.loss_weights weighs tasks by their temperatures: it needs " + sec +
                        ".tasks.per_task_alpha and an env with several tasks (" + spec.name + " has " +
                        std::to_string(std::max<std::int64_t>(tasks, 1)) + ")");
    task_weights_ = tc.loss_weights;
    const auto& scales = *tc.target_entropy_scales;
    if (!scales.empty() && static_cast<std::int64_t>(scales.size()) != alphas_)
      throw ConfigError(sec + ".tasks.target_entropy_scales has " + std::to_string(scales.size()) +
                        " values; it needs one per temperature (" + std::to_string(alphas_) +
                        (alphas_ > 1 ? ": one per task of " + spec.name + ")" : ")"));
    for (std::int64_t k = 0; k < alphas_; ++k)
      target_entropy_.push_back(-(scales.empty() ? *cfg.target_entropy_scale : scales[static_cast<std::size_t>(k)]) *
                                static_cast<double>(ad));
    log_alpha_ = torch::full({alphas_}, std::log(*cfg.init_alpha),
                             torch::TensorOptions().device(device_).requires_grad(true));
    target_entropy_t_ = at::tensor(std::vector<float>(target_entropy_.begin(), target_entropy_.end())).to(device_);
    // Each network's parameters move into one flat buffer: Adam, clipping, all-reduce and
    // the Polyak average become a handful of ops (see train/flat_adam.hpp).
    const double s = ctx.lr_scale(cfg.batch_size);
    actor_opt_ = FlatAdam(actor_->parameters(), {.lr = cfg.actor_lr * s});
    critic_opt_ = FlatAdam(critic_->parameters(), {.lr = cfg.critic_lr * s});
    alpha_opt_ = FlatAdam({log_alpha_}, {.lr = cfg.alpha_lr * s});
    target_ = FlatParameters(critic_target_->parameters());
    ema_.set_device(device_);
    if constexpr (kDefaultNetworks) {
      autograd_why_ = nn::why_autograd(cfg.manual_backward, std::string(config_section.view()), device_,
                                           {{"the actor's", nn::GaussianActorTape::unsupported(*actor_)},
                                            {"the critics'", nn::MlpTape::unsupported(*critic_->q1())}});
      if (autograd_why_.empty())
        manual_ = std::make_unique<detail::SacManual>(critic_opt_.parameters(), critic_,
                                                     actor_opt_.parameters(), actor_);
    } else {
      autograd_why_ = "networks of their own (the hand-written passes are GaussianActor's and TwinQ's)";
    }
  }

  /// Actions in [-1, 1] for a batch of observations: sampled to explore, or the mean.
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    // Rows of parts (images) go to the device as bytes; the encoder converts them there.
    if (!layout_.parts.empty()) nn::detail::check_rows(obs, layout_, "SAC: act");
    const auto dtype = layout_.parts.empty() ? at::kFloat : at::kByte;
    auto o = obs.device() == device_ && obs.scalar_type() == dtype ? obs : obs.to(device_, dtype);
    if constexpr (kDefaultNetworks) {
      if (manual_) {
        o = o.contiguous();
        auto action = at::empty({o.size(0), act_dim_}, o.options());
        if (mode == ActMode::explore)
          manual_->act_tape.sample(*actor_, o, anvil::randn(o.size(0), act_dim_, o.options()),
                                   action.data_ptr<float>(), act_dim_);
        else
          manual_->act_tape.mode(*actor_, o, action.data_ptr<float>(), act_dim_);
        return action;
      }
    }
    const at::Tensor noise =
        mode == ActMode::explore ? at::randn({o.size(0), act_dim_}, o.options().dtype(at::kFloat)) : at::Tensor();
    auto actor_forward = [this](const at::Tensor& x, const at::Tensor& eps) {
      return eps.defined() ? actor_->sample(x, eps).action : actor_->mode(x);
    };
    // On a GPU the actor's forward is replayed from a CUDA graph per batch size and mode
    // (algorithms/sac_graph.hpp), the noise drawn here as op by op.
    if (detail::SacGraphed::act_graphable(*this, o)) return detail::SacGraphed::act(*this, o, noise, actor_forward);
    return actor_forward(o, noise);
  }
  /// What the run header says of CUDA graphs on a GPU: what is captured, and why not where not.
  [[nodiscard]] std::string cuda_graph_note(const StepContext& ctx) const {
    const std::string who(config_section.view());
    if (!cfg_.cuda_graph) return "off (" + who + ".cuda_graph=false): the update and acting run op by op";
    const std::string why = ctx.why_not_graphable(/*loops_micro_batches=*/true);
    if (!why.empty()) return who + "'s update runs op by op (" + why + "); acting is captured";
    return who + "'s update and acting are captured (a graph per shape, after " +
           std::to_string(GraphedUpdate::kWarmups) + " warm-ups op by op each)";
  }
  /// Actions replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_acts() const noexcept { return act_graphs_.replays(); }

  /// One SAC update. The critic loss, the actor loss and the temperature loss are all
  /// computed from the parameters as they were before this update, as in the authors'
  /// reference implementation (which runs the three training ops in one session call); so
  /// the critic's and the actor's gradients are independent and `ctx` computes them at
  /// once when it has two threads, with the same result as one after another. Then the
  /// optimizers step, and (every target_update_freq updates) the target critic moves
  /// towards the critic by Polyak averaging. The actor and temperature update every
  /// actor_update_freq updates.
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    // Noise drawn here, in a fixed order, so the update is reproducible on any thread count.
    UpdateNoise noise;
    const auto f = b.obs.options().dtype(at::kFloat);
    noise.next = at::randn({b.obs.size(0), act_dim_}, f);
    if (updates_ % cfg_.actor_update_freq == 0) noise.obs = at::randn({b.obs.size(0), act_dim_}, f);
    return update(b, ctx, noise);
  }

  /// The standard-normal draws of one update, one row per transition: for the actions
  /// at the next states and (on actor steps) at the current states.
  struct UpdateNoise {
    at::Tensor next, obs;
  };

  /// `update` with given noise: the same draws give the same update however the batch is
  /// split, e.g. across ranks (the data-parallel equivalence test uses this). On CUDA, with
  /// `cuda_graph` on and an update a graph can hold (one process; one
  /// temperature or one per task, micro-batches or not), the update is replayed from a CUDA
  /// graph.
  UpdateInfo update(const ReplayBatch& batch, StepContext& ctx, const UpdateNoise& noise) {
    if (!layout_.parts.empty() && cfg_.encoder->shift > 0) {
      // DrQ: obs and next_obs each shifted at random, every transition on its own.
      ReplayBatch shifted = batch;
      shifted.obs = nn::shift_images(batch.obs, layout_, *cfg_.encoder->shift);
      shifted.next_obs = nn::shift_images(batch.next_obs, layout_, *cfg_.encoder->shift);
      return eager_update(shifted, ctx, noise);
    }
    if (detail::SacGraphed::graphable(*this, batch, ctx, noise)) return detail::SacGraphed::update(*this, batch, ctx, noise);
    return eager_update(batch, ctx, noise);
  }

  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }

  /// The update as a CUDA graph holds it, run op by op on any device: device work alone
  /// (the temperature, the optimizers' step counts and learning rates read from tensors, no
  /// host read until the end), then the host's bookkeeping. The same update as `update`
  /// within float rounding; the tests check the two agree on the CPU, where no graph runs.
  UpdateInfo update_as_captured(const ReplayBatch& b, StepContext& ctx, const UpdateNoise& noise) {
    return detail::SacGraphed::as_captured(*this, b, ctx, noise);
  }

 private:
  // The update op by op (what `update` runs when no graph holds it).
  UpdateInfo eager_update(const ReplayBatch& batch, StepContext& ctx, const UpdateNoise& noise) {
    const bool per_task = alphas_ > 1;
    const double alpha = per_task ? 0.0 : alpha_values()[0];
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    const auto& noise_next = noise.next;
    const auto& noise_obs = noise.obs;
    // Per task: each transition's temperature, and its task's loss weight (the critic's
    // times PER's importance weight).
    detail::TaskRows rows;
    if (per_task) {
      if (!batch.task.defined())
        throw Error(std::string(config_section.view()) + ": the batch has no task ids, but the env has " +
                    std::to_string(alphas_) + " tasks (a replay buffer of this run stores them)");
      rows = detail::task_rows(log_alpha_, batch, task_weights_);
    }
    const at::Tensor& alpha_row = rows.alpha_row;
    const at::Tensor& task_w = rows.task_w;
    const ReplayBatch& b = task_weights_ ? rows.weighted : batch;

    bool manual = false;
    if constexpr (kDefaultNetworks)
      manual = manual_ && !ctx.autocasts() && !ctx.scales_losses() && b.obs.device().is_cpu() &&
               b.obs.scalar_type() == at::kFloat;

    detail::SacCriticResult critic;
    detail::SacActorResult actor;
    // Gradient accumulation: the batch in micro-batches, each gradient weighed by its share
    // of the batch, so the sum is the whole batch's gradient (losses are means).
    const auto parts = ctx.micro_batches(b.obs.size(0));
    std::vector<at::Tensor> td_parts;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      ReplayBatch rows;  // a micro-batch's rows; the whole batch is used as it is
      const ReplayBatch& mb = whole ? b : (rows = rows_of(b, part.begin, part.rows));
      const auto nn = whole ? noise_next : noise_next.narrow(0, part.begin, part.rows);
      const auto no = whole || !actor_step ? noise_obs : noise_obs.narrow(0, part.begin, part.rows);
      const auto ar = whole || !alpha_row.defined() ? alpha_row : alpha_row.narrow(0, part.begin, part.rows);
      const auto tw = whole || !task_w.defined() ? task_w : task_w.narrow(0, part.begin, part.rows);
      detail::SacCriticResult c;
      detail::SacActorResult a;
      // Images: each encoder reads the micro-batch once; the parts read the features (the
      // critic's with the gradient, the actor's without; the target's for the target Q).
      ReplayBatch critic_in, actor_in;
      at::Tensor target_next;
      if constexpr (kReadsImages) {
        if (!layout_.parts.empty()) {
          auto guard = ctx.autocast();
          critic_in = mb;
          critic_in.obs = critic_->encoder()->forward(mb.obs);
          {
            torch::NoGradGuard no_grad;
            critic_in.next_obs = critic_->encoder()->forward(mb.next_obs);
            target_next = critic_target_->encoder()->forward(mb.next_obs);
          }
          actor_in = mb;
          actor_in.obs = critic_in.obs.detach();
        }
      }
      const ReplayBatch& cb = layout_.parts.empty() ? mb : critic_in;
      const ReplayBatch& ab = layout_.parts.empty() ? mb : actor_in;
      // On the hand-written path with both parts, the actor part's thread samples the next
      // observations' actions for the critic part (detail::SacNextHandoff), so it runs first
      // when they run one after the other.
      detail::SacNextHandoff next_actions;
      bool hand_next = false;
      if constexpr (kDefaultNetworks) hand_next = manual && actor_step;
      auto critic_part = [&] {
        if constexpr (kDefaultNetworks)
          if (manual)
            return void(c = detail::manual_critic(*manual_, *actor_, *critic_, *critic_target_, mb, alpha,
                                                  *cfg_.gamma, nn, ar, hand_next ? &next_actions : nullptr));
        c = detail::autograd_critic(actor_, critic_, critic_target_, critic_opt_, *cfg_.gamma, cb, {alpha, ar}, nn, ctx,
                                    target_next);
      };
      auto actor_part = [&] {
        if constexpr (kDefaultNetworks)
          if (manual) {
            if (hand_next) next_actions.provide([&] {
                detail::manual_next_actions(*manual_, *actor_, mb, nn, critic_target_.get(),
                                            ctx.threads() > 1 ? detail::sac_head_rows(mb.obs.size(0)) : 0);
              });
            return void(a = detail::manual_actor(*manual_, *actor_, *critic_, mb, alpha, cfg_.auto_alpha,
                                                 target_entropy_[0], no, ar, tw));
          }
        a = detail::autograd_actor(actor_, critic_, actor_opt_, ab, {alpha, ar}, no, ctx, tw);
        if (!per_task && cfg_.auto_alpha) detail::autograd_temperature(a, log_alpha_, alpha_opt_, target_entropy_[0], ctx);
      };
      // Per task, the temperatures' gradient from the transitions' log-densities.
      auto temperature_part = [&] {
        if (!per_task || !actor_step || !cfg_.auto_alpha) return;
        const auto task = (whole ? batch.task : batch.task.narrow(0, part.begin, part.rows)).to(at::kLong);
        const auto t = detail::task_temperatures(log_alpha_, target_entropy_t_, a.log_prob, task);
        a.alpha_grad = t.grad;
        a.alpha_loss = t.loss_sum.item<double>() / static_cast<double>(task.numel());
      };
      if (hand_next) ctx.concurrently({actor_part, critic_part});
      else if (actor_step) ctx.concurrently({critic_part, actor_part});
      else critic_part();
      temperature_part();
      if (whole) {
        critic = std::move(c);
        actor = std::move(a);
        break;
      }
      const double share = part.share;
      accumulate(critic.grad, c.grad, part);
      critic.loss += share * c.loss;
      critic.q_mean += share * c.q_mean;
      td_parts.push_back(c.td.clone());  // the fast path reuses its buffers
      if (actor_step) {
        accumulate(actor.grad, a.grad, part);
        if (a.alpha_grad.defined()) accumulate(actor.alpha_grad, a.alpha_grad, part);
        actor.loss += share * a.loss;
        actor.entropy += share * a.entropy;
        actor.alpha_loss += share * a.alpha_loss;
      }
    }
    if (parts.size() > 1) critic.td = at::cat(td_parts);

    UpdateInfo info;
    // One step for the three optimizers: their gradients cross ranks in one all-reduce.
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
    {
      info.metrics.emplace_back("alpha", this->alpha());
      if (per_task) {
        const auto alphas = alpha_values();
        for (std::size_t k = 0; k < alphas.size(); ++k) info.metrics.emplace_back("alpha/" + task_names_[k], alphas[k]);
      }
    }

    ++updates_;
    info.td_error = critic.td;
    return info;
  }

  detail::SacGraphs graphs_;  // the update in CUDA graphs, one per shape (algorithms/sac_graph.hpp)
  detail::SacActGraphs act_graphs_;  // acting in CUDA graphs, one per batch size and mode

 public:

  /// The learning rates now, by optimizer (for logs).
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{"actor", actor_opt_.lr()}, {"critic", critic_opt_.lr()}, {"alpha", alpha_opt_.lr()}};
  }
  /// Each network's parameters as one flat tensor (for weight histograms).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor", actor_opt_.parameters().flat()}, {"critic", critic_opt_.parameters().flat()}};
  }

  /// Whether updates and actions take the hand-written fast path (`manual_backward`).
  [[nodiscard]] bool manual_backward() const noexcept { return manual_ != nullptr; }
  /// How the actor's and critics' gradients are taken: by the hand-written passes (why
  /// empty), or autograd and why (anvil::DescribesGradients).
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> gradient_paths() const {
    return {{"actor and critics", autograd_why_}};
  }

  /// Moves the exponential moving average of the actor's weights towards the current ones:
  /// ema = decay ema + (1 - decay) weights (Polyak averaging of the policy, as a run's
  /// `train.ema_decay` asks for after each update). The first call starts it at the weights.
  void ema_update(double decay) { ema_.update(actor_opt_.parameters().flat(), decay); }
  /// The averaged actor weights (flat, in the order of `actor()->parameters()`); undefined
  /// until the first `ema_update`.
  [[nodiscard]] const at::Tensor& ema_weights() const noexcept { return ema_.weights(); }
  /// Runs `f` with the averaged weights in the actor (when there are any), then puts the
  /// trained weights back, whatever `f` does.
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(actor_opt_.parameters().flat(), std::forward<F>(f));
  }

  /// The actor's parameters as policy.safetensors names them (`WarmStarts`: `init.weights`).
  /// With images, the encoder the actor reads through (`encoder.*`) too: the critic's and
  /// its target's copy, both starting from the file's (a name listed twice is copied twice).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> policy_parameters()
    requires std::same_as<Actor, nn::GaussianActor>
  {
    auto out = named_parameters_of(*actor_, "");
    if (critic_->encoder())
      for (const auto* c : {&critic_, &critic_target_})
        for (auto& p : named_parameters_of(*(*c)->encoder(), "encoder.")) out.push_back(std::move(p));
    return out;
  }

  /// Writes the policy alone, for deployment (`anvil::load_policy`): the actor's shape and
  /// its weights (the averaged ones when there are any), after the image encoder it reads
  /// through when the observations hold images (the critic's, its weights as they are). Policy files hold the default
  /// GaussianActor only; with a user actor this does not exist and the Trainer writes no
  /// policy.bin (its checkpoints hold the actor).
  void save_policy(BinaryWriter& w) const
    requires std::same_as<Actor, nn::GaussianActor>
  {
    // A policy that reads images: the encoder (the critic's, shared) goes first.
    const auto& ac = *cfg_.actor;
    if (const auto encoder = actor_->encoder()) {
      w.string("EncodedGaussianActor");
      nn::save_encoder(w, *encoder);
    } else if (ac.heads > 1) {  // an output head per task (nn::MlpHeads)
      w.string("MultiHeadGaussianActor");
      w.value(*ac.heads);
    } else {
      w.string("GaussianActor");
    }
    w.value(static_cast<std::int64_t>(actor_->net()->in_features()));
    w.value(act_dim_);
    w.value(static_cast<std::uint64_t>(ac.hidden->size()));
    for (int h : *ac.hidden) w.value(h);
    w.value(static_cast<int>(*ac.activation));
    w.value(*ac.log_std_min);
    w.value(*ac.log_std_max);
    write_tensor(w, ema_.defined() ? ema_.weights() : actor_opt_.parameters().flat(), "the actor's weights");
  }

  /// Everything a checkpoint holds of SAC (algorithms/soft_state.hpp): the actor and the
  /// critic with their Adam states, the target critic, the learned temperature with its
  /// optimizer, the update count (which schedules actor and target updates) and the average.
  using Saved = detail::SoftSaved;
  void save(BinaryWriter& w) const { detail::SoftState::save(*this, w); }
  /// Reads what `save` wrote, checking every size against this SAC; changes nothing here,
  /// so a caller can check the whole file before `restore`.
  [[nodiscard]] Saved read(BinaryReader& r) const { return detail::SoftState::read(*this, r, "sac"); }
  void restore(const Saved& s) {
    detail::SoftState::restore(*this, s);
    graphs_.clear();  // captured again from the restored state (warm-ups first)
    act_graphs_.clear();
  }

  [[nodiscard]] Actor& actor() noexcept { return actor_; }
  [[nodiscard]] Critic& critic() noexcept { return critic_; }
  [[nodiscard]] Critic& critic_target() noexcept { return critic_target_; }
  /// The optimizers (their moments show the gradients they were given).
  [[nodiscard]] const FlatAdam& actor_optimizer() const noexcept { return actor_opt_; }
  [[nodiscard]] const FlatAdam& critic_optimizer() const noexcept { return critic_opt_; }
  [[nodiscard]] const FlatAdam& alpha_optimizer() const noexcept { return alpha_opt_; }
  /// The temperature (the mean of the tasks' when there is one per task).
  [[nodiscard]] double alpha() const {
    const auto a = alpha_values();
    double mean = 0;
    for (const double x : a) mean += x / static_cast<double>(a.size());
    return mean;
  }
  /// Each temperature: one, or one per task.
  [[nodiscard]] at::Tensor alphas() const { return log_alpha_.detach().exp().to(at::kCPU); }
  /// How many temperatures: 1, or the env's tasks with `tasks.per_task_alpha`.
  [[nodiscard]] std::int64_t temperatures() const noexcept { return alphas_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Batch size the trainer samples for each update.
  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  /// The discount (n-step returns in the buffer, a reward normaliser's return).
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

 private:
  friend struct detail::SacGraphed;
  friend struct detail::SoftState;
  static constexpr bool kDefaultNetworks =
      std::same_as<Actor, nn::GaussianActor> && std::same_as<Critic, nn::TwinQ>;

  Config cfg_;
  c10::Device device_;
  Actor actor_{nullptr};
  Critic critic_{nullptr}, critic_target_{nullptr};
  at::Tensor log_alpha_;
  std::vector<double> target_entropy_;  // one per temperature
  at::Tensor target_entropy_t_;         // the same, float32 on the device (the tasks' temperatures read it there)
  std::int64_t alphas_ = 1;             // temperatures: 1, or one per task
  bool task_weights_ = false;           // tasks.loss_weights
  std::vector<std::string> task_names_;
  // Whether the networks read images through a shared encoder (nn::TwinQ, nn::GaussianActor).
  static constexpr bool kReadsImages = requires(Critic& c, Actor& a, nn::ObsEncoder e) {
    c->set_encoder(e);
    c->encoder();
    a->share_encoder(e);
  };
  std::int64_t act_dim_ = 0;
  ObsLayout layout_;  // the observation's parts when it has images (empty: float rows)
  FlatAdam actor_opt_, critic_opt_, alpha_opt_;
  FlatParameters target_;
  std::int64_t updates_ = 0;
  std::unique_ptr<detail::SacManual> manual_;  // the fast path, when it applies
  std::string autograd_why_;                   // why not ("" when it applies)

  // exp(log alpha) of each temperature, read straight from host memory when it is there
  // (two LibTorch ops and a copy per update otherwise).
  [[nodiscard]] std::vector<double> alpha_values() const {
    if (log_alpha_.device().is_cpu() && log_alpha_.scalar_type() == at::kFloat && log_alpha_.is_contiguous()) {
      const float* la = log_alpha_.data_ptr<float>();
      std::vector<double> a(static_cast<std::size_t>(alphas_));
      for (std::size_t k = 0; k < a.size(); ++k) a[k] = std::exp(static_cast<double>(la[k]));
      return a;
    }
    const auto t = log_alpha_.detach().exp().to(at::kCPU, at::kDouble).contiguous();
    return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
  }
  Ema ema_;                                     // averaged actor weights (train.ema_decay)
};


static_assert(Algorithm<SAC>);
static_assert(Algorithm<MultiTaskSAC>);

}  // namespace anvil
