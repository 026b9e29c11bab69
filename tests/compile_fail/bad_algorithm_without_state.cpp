// expect: Trainer: the Algorithm declares AlgorithmKind but does not satisfy anvil::Algorithm
#include "common.hpp"

// Acts and updates, but has no state protocol (save/read/restore): checkpoints and the
// ranks' start-up broadcast could not hold it. The notes name the SavesState rung.
struct Stateless {
  using policy_kind = anvil::AlgorithmKind;
  static constexpr anvil::FixedString config_section = "stateless";
  static constexpr bool on_policy = false;
  using Batch = anvil::ReplayBatch;
  struct Config {};
  Stateless(const anvil::envs::EnvSpec&, const Config&, const anvil::RunContext&) {}
  at::Tensor act(const at::Tensor& obs, anvil::ActMode) { return obs; }
  anvil::UpdateInfo update(const Batch&, anvil::StepContext&) { return {}; }
};
int main() { anvil::Trainer<Stateless, anvil::UniformBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
