#pragma once
/// @file
/// `BF16`: autocast to bfloat16 (CPU and CUDA); float32 master weights, no loss scaling.
///
/// Numerics (the same for `FP16`, which adds loss scaling). Autocast computes the matrix
/// products of the hidden layers, and the activations after them, in bfloat16: that is
/// where the time goes and where 8 significant bits are enough. Everything whose error
/// would steer learning stays float32:
/// - master weights, their gradients and the Adam moments (autocast casts copies of the
///   weights for each product; gradients flow back to the float32 originals);
/// - every network's output layer (`nn::Mlp` runs it under `Float32Scope`): Q-values, and
///   the policy's mean and log standard deviation, hence log-probabilities and entropy;
/// - the Bellman target r + gamma (1 - done) (min Q' - alpha log pi), built from those
///   float32 outputs with float32 arithmetic;
/// - the losses (squared TD errors, importance weighting, the actor loss) and their means;
/// - the entropy temperature log alpha, its loss and its optimizer;
/// - Polyak averaging of the target networks (a float32 lerp over flat parameters, outside
///   autocast), gradient averaging across ranks, unscaling and clipping;
/// - the TD errors fed back to a prioritized buffer.
/// Light header.

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
  /// What a run applies (see PrecisionSettings).
  static PrecisionSettings settings(const Config& c) { return detail::settings_of<BF16>(c); }
};

static_assert(Precision<BF16>);

}  // namespace anvil
