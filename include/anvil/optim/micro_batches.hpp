#pragma once
/// @file
/// The micro-batches of gradient accumulation: a batch of `rows` split into `parts` runs of
/// consecutive rows, each with its share of the batch. An algorithm computes the gradient of
/// each part's mean loss, weighs it by the share and sums: the whole batch's gradient (its
/// losses are means), so the optimizer, the all-reduce across ranks, the loss scaler's check
/// and clipping each run once per step. Light header.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace anvil {

/// Rows [begin, begin + rows) of a batch, `share` = rows / batch rows.
struct MicroBatch {
  std::int64_t begin = 0;
  std::int64_t rows = 0;
  double share = 1.0;
};

/// `parts` micro-batches of a batch of `rows` (at most one per row; sizes differ by at most
/// one). One part is the whole batch.
[[nodiscard]] inline std::vector<MicroBatch> micro_batches(std::int64_t rows, std::int64_t parts) {
  parts = std::clamp<std::int64_t>(parts, 1, std::max<std::int64_t>(rows, 1));
  std::vector<MicroBatch> out;
  out.reserve(static_cast<std::size_t>(parts));
  for (std::int64_t i = 0; i < parts; ++i) {
    const std::int64_t begin = rows * i / parts, n = rows * (i + 1) / parts - begin;
    out.push_back({begin, n, static_cast<double>(n) / static_cast<double>(rows)});
  }
  return out;
}

}  // namespace anvil
