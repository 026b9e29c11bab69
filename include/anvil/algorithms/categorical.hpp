#pragma once
/// @file
/// Categorical policies over a discrete action set with some actions unavailable (an
/// availability mask of 1s and 0s beside each row): logits masked, a policy mixed with
/// epsilon of a uniform choice among the available actions, and a sample from each row's
/// distribution. Used by COMA's actor (algorithms/coma.hpp).

#include <ATen/ATen.h>

#include <cstdint>

namespace anvil::categorical {

/// `logits` with the actions `avail` marks unavailable (below 0.5) at -1e10, so a softmax
/// gives them no probability.
[[nodiscard]] inline at::Tensor masked(const at::Tensor& logits, const at::Tensor& avail) {
  return logits.masked_fill(avail < 0.5, -1e10);
}

/// Probabilities `p` mixed with `eps` of a uniform choice among the available actions.
[[nodiscard]] inline at::Tensor mixed(const at::Tensor& p, const at::Tensor& avail, double eps) {
  if (eps <= 0) return p;
  const auto a = avail.to(at::kFloat);
  return (1 - eps) * p + eps * a / a.sum(-1, true);
}

/// `mixed` with the weights as tensors, `keep` = 1 - epsilon and `eps` (float32 scalars,
/// where a CUDA graph reads them each replay): the same arithmetic.
[[nodiscard]] inline at::Tensor mixed(const at::Tensor& p, const at::Tensor& avail, const at::Tensor& keep,
                                      const at::Tensor& eps) {
  const auto a = avail.to(at::kFloat);
  return keep * p + eps * a / a.sum(-1, true);
}

/// An action index drawn from each row of probabilities `p` [..., n]: shape [...] (int64).
[[nodiscard]] inline at::Tensor sample(const at::Tensor& p) {
  auto s = p.sizes().vec();
  s.pop_back();
  return at::multinomial(p.reshape({-1, p.size(-1)}), 1).reshape(s);
}

}  // namespace anvil::categorical
