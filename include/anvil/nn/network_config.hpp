#pragma once
/// @file
/// The default networks' config sections and the activation choice, apart from the modules,
/// so a config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/error.hpp>
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
  Param<double, "log_std_max", "upper bound of the log standard deviation"> log_std_max{2.0};  Param<int, "heads",
        "output heads: N > 1 gives each of N tasks its own output layer, picked by the observation's last N "
        "numbers, the task's one-hot (a multi-task env's; multi-head SAC, Yu et al. 2019)",
        at_least(1)>
      heads{1};
};

/// The twin critics' shape (`TwinQ`), under the algorithm's `critic` section
/// (`sac.critic.hidden=256,256`).
struct TwinQConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};  Param<int, "heads",
        "output heads: N > 1 gives each of N tasks its own output layer, picked by the observation's last N "
        "numbers, the task's one-hot (a multi-task env's; multi-head SAC, Yu et al. 2019)",
        at_least(1)>
      heads{1};
};

/// Which convolutional encoder reads an image part of the observation.
enum class EncoderKind { small, nature, resnet18 };
constexpr auto enum_names(EncoderKind) { return std::array<std::string_view, 3>{"small", "nature", "resnet18"}; }

/// How an algorithm reads observations with images (`EnvSpec::layout`), under its
/// `encoder` section (`sac.encoder.kind=nature`): one encoder per image part, its features
/// concatenated with the observation's float parts before the networks' MLPs. Unused for
/// float observations.
struct ObsEncoderConfig {
  Param<EncoderKind, "kind",
        "small: 4 convolutions with GroupNorm and spatial-softmax keypoints; nature: DQN's 3 convolutions; resnet18: "
        "Diffusion Policy's ResNet-18 with GroupNorm and spatial softmax (11.2M weights; images 32x32 or larger)"> kind{
      EncoderKind::small};
  Param<int, "features", "features per image part", at_least(1)> features{64};
  Param<int, "width", "small: channels of its first two convolutions (the last two have twice as many; a multiple of 8)",
        at_least(8)> width{32};
  Param<int, "shift", "random shift of the sampled images in training, up to this many pixels (DrQ); 0: none",
        at_least(0)> shift{4};

  void validate() const {
    if (*width % 8 != 0)
      throw ConfigError("encoder.width=" + std::to_string(*width) +
                        " is not a multiple of 8 (the small encoder's GroupNorm has 8 groups)");
  }
};

class GaussianActor;  // nn/gaussian_actor.hpp
class TwinQ;          // nn/twin_q.hpp

}  // namespace anvil::nn
