// expect: Trainer: the off-policy loop samples batch_size() transitions per update and stores n-step returns with discount(); the Algorithm lacks one
#include "common.hpp"

// An off-policy Algorithm that says nothing of its batch size: the loop cannot sample for it.
struct NoBatchSize {
  using policy_kind = anvil::AlgorithmKind;
  static constexpr anvil::FixedString config_section = "no_batch";
  static constexpr bool on_policy = false;
  using Batch = anvil::ReplayBatch;
  struct Config {};
  NoBatchSize(const anvil::envs::EnvSpec&, const Config&, const anvil::RunContext&) {}
  at::Tensor act(const at::Tensor& obs, anvil::ActMode) { return obs; }
  anvil::UpdateInfo update(const Batch&, anvil::StepContext&) { return {}; }
  void save(anvil::BinaryWriter&) const {}
  int read(anvil::BinaryReader&) const { return 0; }
  void restore(int) {}
};
int main() { anvil::Trainer<NoBatchSize, anvil::UniformBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
