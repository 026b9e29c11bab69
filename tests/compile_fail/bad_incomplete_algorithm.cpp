// expect: Trainer: the Algorithm declares AlgorithmKind but does not satisfy anvil::Algorithm
#include "common.hpp"

struct NoUpdate {
  using policy_kind = anvil::AlgorithmKind;
  static constexpr anvil::FixedString config_section = "no_update";
  static constexpr bool on_policy = false;
  using Batch = anvil::ReplayBatch;
  struct Config {};
  at::Tensor act(const at::Tensor& obs, anvil::ActMode) { return obs; }
  // no update(batch, ctx): the concept names the missing UpdatesFromBatches rung
};
int main() { anvil::Trainer<NoUpdate, anvil::UniformBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
