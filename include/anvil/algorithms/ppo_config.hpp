#pragma once
/// @file
/// PPO's config section (`ppo`), apart from the algorithm (algorithms/ppo.hpp), so a
/// Trainer's config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <cstdint>
#include <vector>

#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>
#include <anvil/nn/network_config.hpp>

namespace anvil {

/// Shape of PPO's actor and critic MLPs.
struct PpoNetConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{64, 64};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::tanh};
};

/// The fields PPO (`ppo`) and recurrent PPO (`ppo_recurrent`) share, declared once.
namespace proximal {
using Gamma = Param<double, "gamma", "discount factor", in_range(0, 1)>;
using Lr = Param<double, "lr", "learning rate (Adam) of actor and critic", positive>;
using AnnealLr = Param<bool, "anneal_lr", "decay the learning rate linearly to 0 over train.steps">;
using Epochs = Param<int, "epochs", "passes over each rollout", in_range(1, 1000)>;
using MinibatchSize = Param<std::int64_t, "minibatch_size", "rollout rows per gradient step (per rank)", at_least(1)>;
using Clip = Param<double, "clip", "clip range of the probability ratio", positive>;
using ClipValue = Param<double, "clip_value", "clip the value's change to +-this in the value loss (0: off)", at_least(0)>;
using VfCoef = Param<double, "vf_coef", "weight of the value loss", at_least(0)>;
using EntCoef = Param<double, "ent_coef", "weight of the entropy bonus", at_least(0)>;
using MaxGradNorm = Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)>;
using TargetKl = Param<double, "target_kl",
                       "stop a rollout's epochs once the mean approximate KL of an epoch exceeds this (0: off)", at_least(0)>;
using AdamEps = Param<double, "adam_eps", "Adam's epsilon", positive>;
using InitLogStd = Param<double, "init_log_std", "initial log standard deviation of continuous actions">;
using OrthoInit = Param<bool, "ortho_init", "orthogonal initialisation of the layers (gain sqrt 2; heads 0.01 and 1)">;
}  // namespace proximal

/// PPO's section (`ppo`).
struct PpoConfig {
  proximal::Gamma gamma{0.99};
  proximal::Lr lr{3e-4};
  proximal::AnnealLr anneal_lr{true};
  proximal::Epochs epochs{10};
  proximal::MinibatchSize minibatch_size{64};
  proximal::Clip clip{0.2};
  proximal::ClipValue clip_value{0.0};
  proximal::VfCoef vf_coef{0.5};
  proximal::EntCoef ent_coef{0.0};
  proximal::MaxGradNorm max_grad_norm{0.5};
  proximal::TargetKl target_kl{0.0};
  proximal::AdamEps adam_eps{1e-5};
  proximal::InitLogStd init_log_std{0.0};
  proximal::OrthoInit ortho_init{true};
  Param<bool, "manual_backward",
        "hand-written passes for the default networks in float32 on the CPU: acting and updates without "
        "LibTorch ops (false: autograd; same result, slower)">
      manual_backward{true};
  Param<bool, "cuda_graph",
        "on CUDA, capture each minibatch update as a CUDA graph and replay it: one launch instead of hundreds of "
        "dispatched ops (one process, or DDP with parallel.capture_all_reduce; no random image shifts; FP16's loss "
        "scaler and gradient accumulation's micro-batches included; false: op by op)">
      cuda_graph{true};
  Section<"actor", PpoNetConfig> actor;
  Section<"critic", PpoNetConfig> critic;
  /// Observations with images: the encoder the actor and critic share (no random shift by
  /// default: PPO's ratios compare the policy on the observations it acted on).
  Section<"encoder", nn::ObsEncoderConfig> encoder{[] {
    nn::ObsEncoderConfig c;
    c.shift = 0;
    return c;
  }()};
};

class PPO;  // algorithms/ppo.hpp
class RecurrentPPO;  // algorithms/recurrent_ppo.hpp

template <>
struct policy_config<PPO> {
  using type = PpoConfig;
  static constexpr FixedString section = "ppo";
};

/// Recurrent PPO's section (`ppo_recurrent`): PPO's fields, the memory each network
/// carries, and the sequences its updates unroll.
struct RecurrentPpoConfig {
  proximal::Gamma gamma{0.99};
  proximal::Lr lr{3e-4};
  proximal::AnnealLr anneal_lr{true};
  proximal::Epochs epochs{10};
  proximal::MinibatchSize minibatch_size{256};
  proximal::Clip clip{0.2};
  proximal::ClipValue clip_value{0.0};
  proximal::VfCoef vf_coef{0.5};
  proximal::EntCoef ent_coef{0.0};
  proximal::MaxGradNorm max_grad_norm{0.5};
  proximal::TargetKl target_kl{0.0};
  proximal::AdamEps adam_eps{1e-5};
  proximal::InitLogStd init_log_std{0.0};
  proximal::OrthoInit ortho_init{true};
  Param<int, "memory", "width of the GRU state the actor and the value each carry through an episode",
        in_range(1, 65536)>
      memory{64};
  Param<std::int64_t, "sequence_length",
        "consecutive steps of one env per sequence an update unrolls from the memory stored as it acted (0: "
        "a whole rollout; must divide rollout.steps)",
        at_least(0)>
      sequence_length{0};
  /// The layers before each GRU (one of 64 by default).
  Section<"actor", PpoNetConfig> actor{[] {
    PpoNetConfig c;
    c.hidden = {64};
    return c;
  }()};
  Section<"critic", PpoNetConfig> critic{[] {
    PpoNetConfig c;
    c.hidden = {64};
    return c;
  }()};
};

template <>
struct policy_config<RecurrentPPO> {
  using type = RecurrentPpoConfig;
  static constexpr FixedString section = "ppo_recurrent";
};

}  // namespace anvil
