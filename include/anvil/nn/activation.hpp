#pragma once
/// @file
/// Activation functions selectable from configs.

#include <array>
#include <string_view>

#include <ATen/core/Tensor.h>

namespace anvil::nn {

/// Hidden-layer activation.
enum class Activation { relu, tanh, elu, gelu, silu, leaky_relu };
/// Names for configs (`sac.actor.activation=tanh`).
constexpr auto enum_names(Activation) {
  return std::array<std::string_view, 6>{"relu", "tanh", "elu", "gelu", "silu", "leaky_relu"};
}

/// Applies `a` element-wise.
inline at::Tensor activate(const at::Tensor& x, Activation a) {
  switch (a) {
    case Activation::relu: return x.relu();
    case Activation::tanh: return x.tanh();
    case Activation::elu: return at::elu(x);
    case Activation::gelu: return at::gelu(x);
    case Activation::silu: return at::silu(x);
    case Activation::leaky_relu: return at::leaky_relu(x, 0.01);
  }
  return x;
}

}  // namespace anvil::nn
