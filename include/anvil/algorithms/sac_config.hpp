#pragma once
/// @file
/// SAC's config section (`sac`, or `mtsac` for multi-task SAC) and the names `SAC` and
/// `MultiTaskSAC`, apart from the algorithm (algorithms/sac.hpp), so a Trainer's config can
/// be built without torch (`anvil/compiled.hpp`). Light header.

#include <vector>

#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>
#include <anvil/nn/network_config.hpp>

namespace anvil {

/// Soft Actor-Critic with swappable networks (algorithms/sac.hpp).
template <class Actor = nn::GaussianActor, class Critic = nn::TwinQ, bool kMultiTask = false>
class BasicSAC;

/// SAC with the default networks: tanh-Gaussian actor and twin-Q critic, 256x256 MLPs.
using SAC = BasicSAC<>;

/// Multi-task SAC with swappable networks: a temperature per task by default, in the
/// config section `mtsac` (see algorithms/sac.hpp).
template <class Actor = nn::GaussianActor, class Critic = nn::TwinQ>
using BasicMultiTaskSAC = BasicSAC<Actor, Critic, true>;
/// Multi-task SAC with the default networks.
using MultiTaskSAC = BasicMultiTaskSAC<>;

/// The fields both soft actor-critics have (SAC here, `DiscreteSAC` in
/// algorithms/discrete_sac.hpp), declared once; each config gives its own defaults.
namespace soft {
using BatchSize = Param<int, "batch_size", "transitions per gradient update", at_least(1)>;
using Gamma = Param<double, "gamma", "discount factor", in_range(0, 1)>;
using Tau = Param<double, "tau", "Polyak coefficient of the target networks (1: a copy)", in_range(0, 1)>;
using ActorLr = Param<double, "actor_lr", "actor learning rate (Adam)", positive>;
using CriticLr = Param<double, "critic_lr", "critic learning rate (Adam)", positive>;
using AlphaLr = Param<double, "alpha_lr", "entropy temperature learning rate (Adam)", positive>;
using InitAlpha = Param<double, "init_alpha", "initial entropy temperature", positive>;
using AutoAlpha = Param<bool, "auto_alpha", "tune the temperature towards the target entropy">;
using ActorUpdateFreq = Param<int, "actor_update_freq", "update the actor and temperature every N updates", at_least(1)>;
using TargetUpdateFreq = Param<int, "target_update_freq", "move the targets every N updates", at_least(1)>;
using MaxGradNorm = Param<double, "max_grad_norm", "clip each gradient's global norm (0: off)", at_least(0)>;
}  // namespace soft

namespace detail {

template <bool kMultiTask>
inline constexpr auto sac_config_section = [] {
  if constexpr (kMultiTask) return FixedString("mtsac");
  else return FixedString("sac");
}();

/// SAC's settings for envs that have tasks (see algorithms/sac.hpp); `per_task` is the
/// default of `per_task_alpha` (on in MultiTaskSAC).
template <bool per_task>
struct SacTaskConfig {
  Param<bool, "per_task_alpha",
        "with an env that has tasks: a learned temperature per task, picked by each transition's task">
      per_task_alpha{per_task};
  Param<std::vector<double>, "target_entropy_scales",
        "one per task, in the env's task order: each task's target entropy is -scale * action_dim (empty: "
        "target_entropy_scale for every task; a negative scale asks for more entropy than a uniform action)">
      target_entropy_scales{};
  Param<bool, "loss_weights",
        "weight each transition's critic and actor losses by T * softmax(-log alpha) of its task (needs "
        "per_task_alpha): tasks whose temperature is still high weigh less">
      loss_weights{false};
};

}  // namespace detail

/// SAC's section: its hyperparameters and its networks' shapes (`ActorConfig`, `CriticConfig`).
template <class ActorConfig, class CriticConfig, bool kMultiTask>
struct SacConfig {
  soft::BatchSize batch_size{256};
  soft::Gamma gamma{0.99};
  soft::Tau tau{0.005};
  soft::ActorLr actor_lr{3e-4};
  soft::CriticLr critic_lr{3e-4};
  soft::AlphaLr alpha_lr{3e-4};
  soft::InitAlpha init_alpha{1.0};
  soft::AutoAlpha auto_alpha{true};
  Param<double, "target_entropy_scale", "target entropy is -scale * action_dim", at_least(0)>
      target_entropy_scale{1.0};
  soft::ActorUpdateFreq actor_update_freq{1};
  soft::TargetUpdateFreq target_update_freq{1};
  soft::MaxGradNorm max_grad_norm{0.0};
  Param<bool, "manual_backward",
        "hand-written gradients for the default networks in float32 on the CPU (false: "
        "autograd; same result, slower)">
      manual_backward{true};
  Param<bool, "cuda_graph",
        "on CUDA, capture the update and acting as CUDA graphs and replay them: one launch instead of hundreds of "
        "dispatched ops (the update: one process, or DDP with parallel.capture_all_reduce; a temperature per task, "
        "FP16's loss scaler and gradient accumulation's micro-batches included; false: op by op)">
      cuda_graph{true};
  Section<"actor", ActorConfig> actor;
  Section<"critic", CriticConfig> critic;
  Section<"tasks", detail::SacTaskConfig<kMultiTask>> tasks;
  Section<"encoder", nn::ObsEncoderConfig> encoder;
};

/// The default networks' SAC config, named without the algorithm's class.
template <bool kMultiTask>
struct policy_config<BasicSAC<nn::GaussianActor, nn::TwinQ, kMultiTask>> {
  using type = SacConfig<nn::GaussianActorConfig, nn::TwinQConfig, kMultiTask>;
  static constexpr auto section = detail::sac_config_section<kMultiTask>;
};

/// Discrete SAC (algorithms/discrete_sac.hpp).
class DiscreteSAC;

/// The shape of discrete SAC's actor and of each critic: MLPs from the observation to one
/// output per action.
struct DiscreteSacNetConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::relu};
};

/// Discrete SAC's section (`sac_discrete`). The paper's Atari settings are Adam at 3e-4,
/// batches of 64, gamma 0.99, target entropy 0.98 log|A| and the target copied every 8,000
/// steps (`tau=1 target_update_freq=8000`); the defaults here keep SAC's Polyak average.
struct DiscreteSacConfig {
  soft::BatchSize batch_size{64};
  soft::Gamma gamma{0.99};
  soft::Tau tau{0.005};
  soft::ActorLr actor_lr{3e-4};
  soft::CriticLr critic_lr{3e-4};
  soft::AlphaLr alpha_lr{3e-4};
  soft::InitAlpha init_alpha{1.0};
  soft::AutoAlpha auto_alpha{true};
  Param<double, "target_entropy_scale",
        "target entropy is scale * log(number of actions), the uniform policy's entropy times scale "
        "(Christodoulou 2019: 0.98)",
        in_range(0, 1)>
      target_entropy_scale{0.98};
  soft::ActorUpdateFreq actor_update_freq{1};
  soft::TargetUpdateFreq target_update_freq{1};
  soft::MaxGradNorm max_grad_norm{0.0};
  Section<"actor", DiscreteSacNetConfig> actor;
  Section<"critic", DiscreteSacNetConfig> critic;
};

/// Discrete SAC's config, named without the algorithm's class.
template <>
struct policy_config<DiscreteSAC> {
  using type = DiscreteSacConfig;
  static constexpr FixedString section = "sac_discrete";
};

}  // namespace anvil
