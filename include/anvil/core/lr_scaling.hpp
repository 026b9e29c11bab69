#pragma once
/// @file
/// How learning rates follow the batch size and the number of ranks (`train.lr_scaling`).
/// Each algorithm applies the rule to the batch its learning rates were tuned for (SAC's
/// batch, PPO's minibatch), through `RunContext::lr_scale`. Light header.

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace anvil {

/// none: as configured; sqrt: lr * sqrt(batch / base_batch) (Krizhevsky 2014, "One weird
/// trick"; the rule our users' multi-task SAC uses); linear: lr * number of ranks (Goyal et
/// al. 2017, for data-parallel runs whose global batch grows with the ranks).
enum class LrScaling { none, sqrt, linear };
constexpr auto enum_names(LrScaling) {
  return std::array<std::string_view, 3>{"none", "sqrt", "linear"};
}

/// The factor on learning rates tuned for `base_batch` rows per step, for a run taking
/// `batch` rows per step on `world_size` ranks.
[[nodiscard]] inline double lr_scale(LrScaling rule, std::int64_t batch, std::int64_t base_batch, int world_size) {
  switch (rule) {
    case LrScaling::none: return 1.0;
    case LrScaling::sqrt: return std::sqrt(static_cast<double>(batch) / static_cast<double>(base_batch));
    case LrScaling::linear: return static_cast<double>(world_size);
  }
  return 1.0;
}

}  // namespace anvil
