#pragma once
/// @file
/// The default networks' config sections and the activation choice, apart from the modules,
/// so a config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <string_view>
#include <vector>

#include <anvil/core/param.hpp>

namespace anvil::nn {

/// Hidden-layer activation.
enum class Activation { relu, tanh, elu, gelu, silu, leaky_relu };
/// Names for configs (`sac.actor.activation=tanh`).
constexpr auto enum_names(Activation) {
  return std::array<std::string_view, 6>{"relu", "tanh", "elu", "gelu", "silu", "leaky_relu"};
}

/// The tanh-Gaussian actor's shape (`GaussianActor`), under the algorithm's `actor`
/// section (`sac.actor.hidden=64,64`).
struct GaussianActorConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};
  Param<double, "log_std_min", "lower bound of the log standard deviation"> log_std_min{-5.0};
  Param<double, "log_std_max", "upper bound of the log standard deviation"> log_std_max{2.0};
};

/// The twin critics' shape (`TwinQ`), under the algorithm's `critic` section
/// (`sac.critic.hidden=256,256`).
struct TwinQConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};
};

class GaussianActor;  // nn/gaussian_actor.hpp
class TwinQ;          // nn/twin_q.hpp

}  // namespace anvil::nn
