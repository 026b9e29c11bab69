// expect: Trainer: the offline loop samples random batches from data it loads from a file; the Buffer lacks sample(n) or load(path)
#include "common.hpp"

// A replay buffer the off-policy loop could use, but with no way to load a dataset: the
// offline loop cannot learn from it.
struct MemoryOnly {
  using policy_kind = anvil::BufferKind;
  static constexpr anvil::FixedString config_section = "buffer";
  static constexpr bool on_policy = false;
  using Batch = anvil::ReplayBatch;
  using Step = anvil::StepBatch;
  struct Config {};
  MemoryOnly(const anvil::envs::EnvSpec&, const Config&, const anvil::RunContext&) {}
  void add(const Step&) {}
  void plan(const anvil::StoragePlan&) {}
  Batch sample(std::int64_t) { return {}; }
  std::int64_t size() const { return 0; }
  std::int64_t capacity() const { return 0; }
  void save(anvil::BinaryWriter&) const {}
  int read(anvil::BinaryReader&) const { return 0; }
  void restore(int) {}
};
static_assert(anvil::ReplayBuffer<MemoryOnly>);
int main() {
  anvil::Trainer<anvil::SAC, MemoryOnly, anvil::SingleDevice, anvil::FP32, anvil::OfflineLoop> t(anvil::envs::Pendulum{},
                                                                                                anvil::Args{});
  t.fit();
}
