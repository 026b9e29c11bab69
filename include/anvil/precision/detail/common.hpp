#pragma once
/// @file
/// Pieces shared by the precision policies: the settings a run applies, and the config
/// every policy has. Light header.

#include <c10/core/ScalarType.h>

#include <optional>
#include <string_view>

#include <anvil/core/concepts.hpp>
#include <anvil/core/param.hpp>

namespace anvil {

/// The schedule of a dynamic loss scaler (precision/loss_scaler.hpp): start at
/// `init_scale`, multiply by `growth_factor` after `growth_interval` consecutive finite
/// steps, by `backoff_factor` after a step with inf/nan gradients (which is skipped).
struct LossScaling {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

/// What a precision policy asks of a run, as plain values (`X::settings(cfg)`), so that the
/// code applying them is compiled once, not once per Trainer type.
struct PrecisionSettings {
  std::string_view name;                                     ///< "fp32", "bf16", ...
  bool autocast = false;                                     ///< forward passes under autocast
  c10::ScalarType compute_dtype = c10::ScalarType::Float;    ///< the dtype autocast computes in
  bool needs_cuda = false;                                   ///< refused on other devices
  bool allow_tf32 = false;                                   ///< TF32 matrix products (CUDA)
  bool cudnn_benchmark = true;                               ///< cuDNN picks kernels by benchmark
  bool detect_anomaly = false;                               ///< autograd anomaly detection (slow)
  std::optional<LossScaling> loss_scaling;                   ///< dynamic loss scaling (float16)
};

}  // namespace anvil

namespace anvil::detail {

/// The settings of a precision policy `X` whose config has the common fields only.
template <class X, class Config>
PrecisionSettings settings_of(const Config& c) {
  return PrecisionSettings{X::name, X::autocast, X::compute_dtype, X::needs_cuda, X::allow_tf32,
                           c.cudnn_benchmark, c.detect_anomaly, std::nullopt};
}

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
