#pragma once
/// @file
/// COMA's config section (`coma`), apart from the algorithm (algorithms/coma.hpp), as SAC's
/// and PPO's are. Light header.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include <anvil/core/param.hpp>
#include <anvil/nn/network_config.hpp>

namespace anvil {

/// Which critic and advantage COMA's actor learns from (see coma.hpp).
enum class ComaCritic { counterfactual, central_v, independent };
constexpr auto enum_names(ComaCritic) {
  return std::array<std::string_view, 3>{"counterfactual", "central_v", "independent"};
}

/// Shape of COMA's critic MLP (`coma.critic_net`).
struct ComaNetConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{128};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::relu};
};
/// Shape of COMA's actor (`coma.actor`): an MLP, or one with a GRU cell after it.
struct ComaActorConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{128};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::relu};
  Param<int, "gru",
        "width of a GRU cell after the hidden layers, whose state carries the episode so far (0: a plain MLP)",
        in_range(0, 1 << 16)>
      gru{0};
};

/// The CNN that reads the maps an env declares (`MapShape`, e.g. the published mapping
/// mission's) for COMA's actor and critic (`coma.map_encoder`, nn/map_encoder.hpp).
struct ComaMapEncoderConfig {
  Param<int, "channels",
        "channels of the three convolutions over an env's maps (Westheider et al.: 256); 0: the maps are read "
        "as plain numbers by the MLPs",
        in_range(0, 4096)>
      channels{256};
};

/// Defaults: PyMARL's COMA (lr 5e-4, gamma 0.99, TD lambda 0.8, target every 200
/// critic steps, gradient norm 10, epsilon 0.5 -> 0.01) and our users' schedule (128 x 5
/// x 5 passes).
struct ComaConfig {
  Param<ComaCritic, "critic",
        "counterfactual: COMA's Q critic and counterfactual baseline; central_v: a centralised V critic "
        "(advantage TD(lambda) return - V); independent: each agent's V from its own observation "
        "(independent actor-critic)">
      critic{ComaCritic::counterfactual};
  Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
  Param<double, "td_lambda", "lambda of the critic's TD(lambda) targets", in_range(0, 1)> td_lambda{0.8};
  Param<double, "actor_lr", "learning rate (Adam) of the actor", positive> actor_lr{5e-4};
  Param<double, "critic_lr", "learning rate (Adam) of the critic", positive> critic_lr{5e-4};
  Param<std::int64_t, "batch_size", "agent-transitions per minibatch (per rank)", at_least(1)> batch_size{128};
  Param<int, "batch_number",
        "minibatches per data pass; training waits until batch_size x batch_number agent-transitions are collected",
        at_least(1)>
      batch_number{5};
  Param<int, "data_passes", "passes over the collected transitions, each in a fresh order", at_least(1)> data_passes{5};
  Param<std::int64_t, "target_update_interval", "critic steps between copies of the critic into its target",
        at_least(1)>
      target_update_interval{200};
  Param<double, "epsilon_start", "exploration: probability of a uniform available action at the start",
        in_range(0, 1)>
      epsilon_start{0.5};
  Param<double, "epsilon_finish", "exploration after the anneal", in_range(0, 1)> epsilon_finish{0.01};
  Param<std::int64_t, "epsilon_anneal_episodes", "episodes (per rank) over which epsilon falls linearly",
        at_least(1)>
      epsilon_anneal_episodes{5000};
  Param<double, "ent_coef", "weight of the policy's entropy bonus", at_least(0)> ent_coef{0.0};
  Param<double, "max_grad_norm", "clip each network's gradient norm (0: off)", at_least(0)> max_grad_norm{10.0};
  Param<bool, "cuda_graph",
        "on CUDA, capture each minibatch's critic and actor steps as one CUDA graph and replay it (one process, or "
        "DDP with parallel.capture_all_reduce; an MLP actor; FP16's loss scaler and gradient accumulation's "
        "micro-batches included; false: op by op)">
      cuda_graph{true};
  Section<"actor", ComaActorConfig> actor;
  Section<"critic_net", ComaNetConfig> critic_net;
  Section<"map_encoder", ComaMapEncoderConfig> map_encoder;
};

}  // namespace anvil
