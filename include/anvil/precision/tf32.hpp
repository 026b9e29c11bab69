#pragma once
/// @file
/// `TF32`: float32 storage with TF32 matrix products on CUDA (same as FP32 on CPU). Light header.

#include <string_view>

#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Precision policy: float32 storage with TF32 matrix products on CUDA (same as FP32 on CPU).
struct TF32 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "tf32";
  static constexpr FixedString config_section = "precision";
  /// Forward passes and losses run inside an autocast scope.
  static constexpr bool autocast = false;
  /// Losses are multiplied by a dynamic scale before backward (float16's narrow range).
  static constexpr bool loss_scaling = false;
  /// Only CUDA runs this precision.
  static constexpr bool needs_cuda = false;
  /// Matrix products may use TF32 tensor cores (CUDA, Ampere and later).
  static constexpr bool allow_tf32 = true;
  /// The dtype autocast computes in (float32 when there is no autocast).
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
  using Config = detail::PrecisionConfig;
  /// What a run applies (see PrecisionSettings).
  static PrecisionSettings settings(const Config& c) { return detail::settings_of<TF32>(c); }
};

static_assert(Precision<TF32>);

}  // namespace anvil
