#pragma once
/// @file
/// `FP16`: autocast to float16 on CUDA with a dynamic loss scaler. What stays float32 is as
/// for `BF16` (see precision/bf16.hpp). Light header.

#include <string_view>

#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Precision policy: autocast to float16 on CUDA; float32 master weights; losses scaled by
/// a dynamic factor (Micikevicius et al. 2018, "Mixed Precision Training") so small
/// gradients survive float16's range; a step whose gradients overflow is skipped.
struct FP16 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "fp16";
  static constexpr FixedString config_section = "precision";
  static constexpr bool autocast = true;
  static constexpr bool loss_scaling = true;
  static constexpr bool needs_cuda = true;
  static constexpr bool allow_tf32 = false;
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Half;

  /// The loss scaler's schedule, as in the standard dynamic scaler.
  struct Config {
    Param<bool, "cudnn_benchmark", "let cuDNN benchmark and pick the fastest kernels (CUDA)">
        cudnn_benchmark{true};
    Param<bool, "detect_anomaly", "autograd anomaly detection: names the op that made a NaN (slow)">
        detect_anomaly{false};
    Param<double, "init_scale", "initial loss scale", positive> init_scale{65536.0};
    Param<double, "growth_factor", "scale multiplier after growth_interval finite steps",
          greater_than(1.0)>
        growth_factor{2.0};
    Param<double, "backoff_factor", "scale multiplier after a step with inf/nan gradients",
          Range{.lo = 0, .hi = 1, .lo_open = true, .hi_open = true}>
        backoff_factor{0.5};
    Param<int, "growth_interval", "consecutive finite steps before the scale grows", at_least(1)>
        growth_interval{2000};
  };
  /// What a run applies (see PrecisionSettings): the common settings and the scaler's schedule.
  static PrecisionSettings settings(const Config& c) {
    auto s = detail::settings_of<FP16>(c);
    s.loss_scaling = LossScaling{c.init_scale, c.growth_factor, c.backoff_factor, c.growth_interval};
    return s;
  }
};

static_assert(Precision<FP16>);

}  // namespace anvil
