#pragma once
/// @file
/// Activation functions selectable from configs.

#include <array>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/silu.h>

#include <anvil/nn/network_config.hpp>

namespace anvil::nn {


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
