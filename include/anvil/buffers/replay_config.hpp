#pragma once
/// @file
/// The replay buffers' `buffer` sections and their shared fields, and the rollout buffer's
/// `rollout` section, apart from the buffers, so a Trainer's config can be built without
/// torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <cstdint>
#include <string_view>

#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>

namespace anvil {

/// Where a replay buffer keeps its tensors: with the networks (no copy per sample; the
/// default) or in host memory (for buffers larger than the GPU's memory).
enum class Storage { compute, cpu };
constexpr auto enum_names(Storage) { return std::array<std::string_view, 2>{"compute", "cpu"}; }

/// How a replay buffer stores observations: full float32, or 16-bit floats to halve the
/// memory of observation-heavy buffers (batches always come out as float32).
enum class ObsDtype { float32, bfloat16, float16 };
constexpr auto enum_names(ObsDtype) {
  return std::array<std::string_view, 3>{"float32", "bfloat16", "float16"};
}

namespace detail {

// Config fields every replay buffer has (each buffer's Config lists them by these names).
using CapacityParam = Param<std::int64_t, "capacity", "transitions kept; the oldest are overwritten", at_least(1)>;
using StorageParam = Param<Storage, "storage", "compute: tensors on the training device; cpu: in host memory">;
using ObsDtypeParam = Param<ObsDtype, "obs_dtype",
                            "observation storage: float32, or bfloat16/float16 for half the memory">;
using NStepParam = Param<int, "n_step",
                         "store n-step returns: rewards summed over up to n steps, discounted by the "
                         "algorithm's gamma (1: one-step transitions)",
                         in_range(1, 1000)>;
using BalanceTasksParam = Param<bool, "balance_tasks",
                                "with an env that has tasks, give each task an equal share of every batch "
                                "(batch / tasks transitions each)">;

}  // namespace detail

/// The `buffer` section of `UniformBuffer`.
struct UniformBufferConfig {
  detail::CapacityParam capacity{1'000'000};
  detail::StorageParam storage{Storage::compute};
  detail::ObsDtypeParam obs_dtype{ObsDtype::float32};
  detail::NStepParam n_step{1};
  detail::BalanceTasksParam balance_tasks{true};
};

/// The `buffer` section of `PrioritizedBuffer`.
struct PrioritizedBufferConfig {
  detail::CapacityParam capacity{1'000'000};
  detail::StorageParam storage{Storage::compute};
  detail::ObsDtypeParam obs_dtype{ObsDtype::float32};
  detail::NStepParam n_step{1};
  Param<double, "alpha", "priority exponent: 0 samples uniformly, 1 in proportion to |TD error|",
        in_range(0, 1)>
      alpha{0.6};
  Param<double, "beta", "importance-weight exponent at the start; rises linearly to 1", in_range(0, 1)>
      beta{0.4};
  Param<std::int64_t, "beta_steps", "env steps over which beta reaches 1 (0: the whole run)",
        at_least(0)>
      beta_steps{0};
  Param<double, "eps", "added to |TD error| so no transition's priority is zero", positive> eps{1e-6};
  detail::BalanceTasksParam balance_tasks{true};
};

/// The `rollout` section of `RolloutBuffer`.
struct RolloutBufferConfig {
  Param<std::int64_t, "steps", "env steps per env in one rollout (the rollout is steps x num_envs)",
        in_range(1, 1 << 24)>
      steps{2048};
  Param<double, "gae_lambda", "GAE's lambda: 0 is the one-step TD error, 1 the Monte Carlo return",
        in_range(0, 1)>
      gae_lambda{0.95};
  Param<bool, "normalize_advantage", "scale each minibatch's advantages to mean 0, std 1">
      normalize_advantage{true};
};

class UniformBuffer;      // buffers/uniform_buffer.hpp
class PrioritizedBuffer;  // buffers/prioritized_buffer.hpp
class RolloutBuffer;      // buffers/rollout_buffer.hpp

template <>
struct policy_config<UniformBuffer> {
  using type = UniformBufferConfig;
  static constexpr FixedString section = "buffer";
};
template <>
struct policy_config<PrioritizedBuffer> {
  using type = PrioritizedBufferConfig;
  static constexpr FixedString section = "buffer";
};
template <>
struct policy_config<RolloutBuffer> {
  using type = RolloutBufferConfig;
  static constexpr FixedString section = "rollout";
};

}  // namespace anvil
