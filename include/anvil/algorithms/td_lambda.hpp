#pragma once
/// @file
/// TD(lambda) targets of whole episodes (Sutton and Barto 2018, section 12.1), as COMA's
/// critic learns from them.

#include <ATen/ATen.h>

#include <cstdint>

namespace anvil {

/// TD(lambda) targets of whole episodes, [B, T] or [B, T, k] (per agent):
///     y_t = r_t + gamma (1 - d_t) [(1 - lambda) v_{t+1} + lambda y'_{t+1}],
/// with y'_{t+1} = y_{t+1} inside the episode and v_{t+1} after its last step.
/// `reward`, `terminated`, `mask` are [B, T]; `next_value` is [B, T, ...]: the value of
/// the step after each step (after an episode's last step: its bootstrap value). Rows
/// outside an episode (mask 0) are 0. Float32 in, float32 out.
inline at::Tensor td_lambda_targets(const at::Tensor& reward, const at::Tensor& terminated, const at::Tensor& mask,
                                    const at::Tensor& next_value, double gamma, double lambda) {
  const std::int64_t T = reward.size(1);
  auto expand = [&](const at::Tensor& x) {
    at::Tensor y = x;
    while (y.dim() < next_value.dim()) y = y.unsqueeze(-1);
    return y;
  };
  const auto r = expand(reward), d = expand(terminated), m = expand(mask);
  auto y = at::zeros_like(next_value);
  at::Tensor later = next_value.select(1, T - 1);  // y' after the last column: its bootstrap value
  for (std::int64_t t = T - 1; t >= 0; --t) {
    const auto v = next_value.select(1, t);
    if (t + 1 < T) {
      const auto inside = m.select(1, t + 1);  // step t+1 belongs to the episode
      later = inside * y.select(1, t + 1) + (1 - inside) * v;
    } else {
      later = v;
    }
    y.select(1, t).copy_((r.select(1, t) + gamma * (1 - d.select(1, t)) * ((1 - lambda) * v + lambda * later)) *
                         m.select(1, t));
  }
  return y;
}

}  // namespace anvil
