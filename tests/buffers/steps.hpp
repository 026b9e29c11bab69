// Test helper shared by the replay buffer tests.
#pragma once

#include <torch/torch.h>

#include <anvil/core/batch.hpp>

namespace anvil::test {

/// One step of n envs whose fields all encode the transition's id (base + row): obs and
/// reward are the id, the action is id / 1000, next_obs is id + 0.5.
inline StepBatch step_of(std::int64_t n, float base) {
  auto ids = torch::arange(n, torch::kFloat) + base;
  return StepBatch{ids.unsqueeze(1).repeat({1, 3}), ids.unsqueeze(1) / 1000.0f, ids,
                   ids.unsqueeze(1).repeat({1, 3}) + 0.5f, torch::zeros({n}), torch::zeros({n})};
}

}  // namespace anvil::test
