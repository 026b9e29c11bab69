// Shared by the tests that hold a CUDA graph's arithmetic (`update_as_captured`, or a replay
// on a GPU) to the op-by-op update: the loss scaler's decisions, and the collective's batches.
#pragma once

#include <doctest/doctest.h>

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil::test {

// With a loss scaler (FP16), the captured side took the op-by-op side's decisions: the same
// scale, growth count and skipped steps, and some step was skipped (so the skip ran).
inline void check_same_scaler_decisions(StepContext& op_by_op, StepContext& captured) {
  if (!op_by_op.scaler()) return;
  REQUIRE(captured.scaler());
  CHECK(captured.scaler()->current_scale() == op_by_op.scaler()->current_scale());
  CHECK(captured.scaler()->good_steps() == op_by_op.scaler()->good_steps());
  CHECK(captured.scaler()->skipped() == op_by_op.scaler()->skipped());
  CHECK(op_by_op.scaler()->skipped() > 0);
}

// An env spec whose observation is envs::History's of `h` tokens over states of `od` and
// actions of `ad` numbers (what CollectiveDistillation reads).
inline EnvSpec history_spec(int h, int od, int ad) {
  EnvSpec s;
  s.name = "history";
  const auto w = static_cast<std::size_t>(h * (od + ad + 1) + h + od);
  s.observation = Box{std::vector<float>(w, -10.0f), std::vector<float>(w, 10.0f)};
  s.action = Box{std::vector<float>(static_cast<std::size_t>(ad), -1.0f), std::vector<float>(static_cast<std::size_t>(ad), 1.0f)};
  return s;
}

// `n` windows shaped as history_spec(h, od, ad)'s on the host, with random labels.
inline CollectiveBatch random_windows(std::int64_t n, int h, int od, int ad) {
  CollectiveBatch b;
  b.tokens = torch::randn({n, h, od + ad + 1});
  b.mask = (torch::rand({n, h}) < 0.8).to(torch::kFloat);
  b.mask.select(1, h - 1).fill_(1.0f);
  b.obs = torch::randn({n, od});
  b.action = torch::rand({n, ad}) * 2 - 1;
  b.mean = torch::randn({n, ad});
  b.log_std = torch::rand({n, ad}) * -2;
  b.q_target = torch::randn({n}) * 3;
  return b;
}

}  // namespace anvil::test
