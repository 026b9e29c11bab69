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

/// PPO's section (`ppo`).
struct PpoConfig {
  Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
  Param<double, "lr", "learning rate (Adam) of actor and critic", positive> lr{3e-4};
  Param<bool, "anneal_lr", "decay the learning rate linearly to 0 over train.steps"> anneal_lr{true};
  Param<int, "epochs", "passes over each rollout", in_range(1, 1000)> epochs{10};
  Param<std::int64_t, "minibatch_size", "rollout rows per gradient step (per rank)", at_least(1)>
      minibatch_size{64};
  Param<double, "clip", "clip range of the probability ratio", positive> clip{0.2};
  Param<double, "clip_value", "clip the value's change to +-this in the value loss (0: off)", at_least(0)>
      clip_value{0.0};
  Param<double, "vf_coef", "weight of the value loss", at_least(0)> vf_coef{0.5};
  Param<double, "ent_coef", "weight of the entropy bonus", at_least(0)> ent_coef{0.0};
  Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)> max_grad_norm{0.5};
  Param<double, "target_kl",
        "stop a rollout's epochs once the mean approximate KL of an epoch exceeds this (0: off)", at_least(0)>
      target_kl{0.0};
  Param<double, "adam_eps", "Adam's epsilon", positive> adam_eps{1e-5};
  Param<double, "init_log_std", "initial log standard deviation of continuous actions"> init_log_std{0.0};
  Param<bool, "ortho_init", "orthogonal initialisation of the layers (gain sqrt 2; heads 0.01 and 1)">
      ortho_init{true};
  Param<bool, "manual_backward",
        "hand-written passes for the default networks in float32 on the CPU: acting and updates without "
        "LibTorch ops (false: autograd; same result, slower)">
      manual_backward{true};
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

template <>
struct policy_config<PPO> {
  using type = PpoConfig;
  static constexpr FixedString section = "ppo";
};

}  // namespace anvil
