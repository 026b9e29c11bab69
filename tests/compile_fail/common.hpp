// Shared by the compile-fail programs: the headers a user would include, plus a small
// user-written on-policy algorithm and rollout buffer that satisfy the concepts (the rules
// hold for users' policies as for anvil's own), so only the combination is wrong.
#pragma once
#include <anvil/algorithms/ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/rollout_buffer.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp16.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/train/loops/offline.hpp>
#include <anvil/train/loops/staged.hpp>
#include <anvil/train/trainer.hpp>

namespace user {
/// A user's on-policy algorithm (e.g. REINFORCE): learns from rollouts only. It is an
/// Algorithm, but not one the on-policy loop can train (no act_for_rollout, value, ...).
struct Reinforce {
  using policy_kind = anvil::AlgorithmKind;
  static constexpr anvil::FixedString config_section = "reinforce";
  static constexpr bool on_policy = true;
  using Batch = anvil::RolloutBatch;
  struct Config {};
  Reinforce(const anvil::envs::EnvSpec&, const Config&, const anvil::RunContext&) {}
  at::Tensor act(const at::Tensor& obs, anvil::ActMode) { return obs; }
  anvil::UpdateInfo update(const Batch&, anvil::StepContext&) { return {}; }
  void save(anvil::BinaryWriter&) const {}
  int read(anvil::BinaryReader&) const { return 0; }
  void restore(int) {}
};
/// A user's rollout storage: on-policy, cleared every iteration.
struct Rollouts {
  using policy_kind = anvil::BufferKind;
  static constexpr anvil::FixedString config_section = "rollout";
  static constexpr bool on_policy = true;
  using Batch = anvil::RolloutBatch;
  using Step = anvil::RolloutStep;
  struct Config {};
  Rollouts(const anvil::envs::EnvSpec&, const Config&, const anvil::RunContext&) {}
  void add(const Step&) {}
  void plan(const anvil::StoragePlan&) {}
  std::int64_t size() const { return 0; }
  std::int64_t capacity() const { return 0; }
  void save(anvil::BinaryWriter&) const {}
  int read(anvil::BinaryReader&) const { return 0; }
  void restore(int) {}
};
/// A user's parallelism that keeps every tensor on the CPU (e.g. a Gloo-only setup).
struct CpuCluster {
  using policy_kind = anvil::ParallelismKind;
  static constexpr anvil::FixedString config_section = "cluster";
  static constexpr bool can_use_cuda = false;
  struct Config {};
  explicit CpuCluster(const Config&) {}
  static void start_ranks(const Config&, std::string_view) {}
  void connect(c10::Device) {}
  int device_index() const { return 0; }
  std::string describe() const { return "one CPU process"; }
  int rank() const { return 0; }
  int world_size() const { return 1; }
  bool is_main() const { return true; }
  void all_reduce_mean(std::vector<at::Tensor>&) {}
  void broadcast(std::vector<at::Tensor>&) {}
};
}  // namespace user
