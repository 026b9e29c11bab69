// Test helper shared by the replay buffer tests.
#pragma once

#include <torch/types.h>

#include <anvil/core/batch.hpp>
#include <anvil/envs/pendulum.hpp>

#include <string>

namespace anvil::test {

/// One step of n envs whose fields all encode the transition's id (base + row): obs and
/// reward are the id, the action is id / 1000, next_obs is id + 0.5.
inline StepBatch step_of(std::int64_t n, float base) {
  auto ids = torch::arange(n, torch::kFloat) + base;
  return StepBatch{ids.unsqueeze(1).repeat({1, 3}), ids.unsqueeze(1) / 1000.0f, ids,
                   ids.unsqueeze(1).repeat({1, 3}) + 0.5f, torch::zeros({n}), torch::zeros({n}), {}};
}

}  // namespace anvil::test

namespace anvil::test {

/// Step t of n envs whose observations chain, as a real env's do: env i observes
/// [t, i, 0] and moves to [t + 1, i, 0]; its episodes end (truncated) every `episode`
/// steps, and the next one starts from the reset observation [t + 1, i, 1]. The action is
/// the env's index and the reward is t.
inline StepBatch chain_step(std::int64_t n, std::int64_t t, std::int64_t episode) {
  StepBatch s;
  auto i = torch::arange(n, torch::kFloat);
  auto tt = torch::full({n}, static_cast<float>(t));
  const bool starts = t > 0 && t % episode == 0, ends = (t + 1) % episode == 0;
  s.obs = torch::stack({tt, i, torch::full({n}, starts ? 1.f : 0.f)}, 1);
  s.next_obs = torch::stack({tt + 1, i, torch::zeros({n})}, 1);
  s.action = i.unsqueeze(1);
  s.reward = tt;
  s.terminated = torch::zeros({n});
  s.truncated = torch::full({n}, ends ? 1.f : 0.f);
  return s;
}

}  // namespace anvil::test

namespace anvil::test {

/// Pendulum's spec with `tasks` named tasks ("t0", "t1", ...): transitions carry a task.
inline EnvSpec tasked_spec(int tasks) {
  auto s = envs::spec_of(envs::Pendulum{});
  for (int k = 0; k < tasks; ++k) s.tasks.push_back("t" + std::to_string(k));
  return s;
}

/// `chain_step` with env i on task `task_of(i)`.
template <class F>
inline StepBatch tasked_step(std::int64_t n, std::int64_t t, std::int64_t episode, F task_of) {
  auto s = chain_step(n, t, episode);
  s.task = torch::empty({n}, torch::kLong);
  for (std::int64_t i = 0; i < n; ++i) s.task[i] = task_of(i);
  return s;
}

}  // namespace anvil::test
