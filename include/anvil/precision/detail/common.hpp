#pragma once
/// @file
/// Pieces shared by the precision policies. Light header.

#include <c10/core/ScalarType.h>

#include <anvil/core/concepts.hpp>
#include <anvil/core/param.hpp>

namespace anvil::detail {

/// Settings every precision policy has. cuDNN benchmark mode picks the fastest convolution
/// algorithms for fixed shapes (RL batches are fixed); anomaly detection finds the op that
/// made a NaN but slows every backward pass, so it is off unless asked for.
struct PrecisionConfig {
  Param<bool, "cudnn_benchmark", "let cuDNN benchmark and pick the fastest kernels (CUDA)">
      cudnn_benchmark{true};
  Param<bool, "detect_anomaly", "autograd anomaly detection: names the op that made a NaN (slow)">
      detect_anomaly{false};
};

}  // namespace anvil::detail
