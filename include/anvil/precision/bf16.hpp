#pragma once
/// @file
/// `BF16`: autocast to bfloat16 (CPU and CUDA); float32 master weights, no loss scaling. Light header.

#include <string_view>

#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Precision policy: autocast to bfloat16 (CPU and CUDA); float32 master weights, no loss scaling.
struct BF16 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "bf16";
  static constexpr FixedString config_section = "precision";
  /// Forward passes and losses run inside an autocast scope.
  static constexpr bool autocast = true;
  /// Losses are multiplied by a dynamic scale before backward (float16's narrow range).
  static constexpr bool loss_scaling = false;
  /// Only CUDA runs this precision.
  static constexpr bool needs_cuda = false;
  /// Matrix products may use TF32 tensor cores (CUDA, Ampere and later).
  static constexpr bool allow_tf32 = false;
  /// The dtype autocast computes in (float32 when there is no autocast).
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::BFloat16;
  using Config = detail::PrecisionConfig;
};

static_assert(Precision<BF16>);

}  // namespace anvil
