#pragma once
/// @file
/// The data that passes between policies, as named structs of tensors.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

/// One step of N envs, as the trainer hands it to a buffer: row i is env i.
/// `next_obs` is the observation the step led to, before any autoreset, so a truncated
/// episode can bootstrap from its true last state.
struct StepBatch {
  at::Tensor obs;         ///< [N, obs_dim]
  at::Tensor action;      ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor reward;      ///< [N]
  at::Tensor next_obs;    ///< [N, obs_dim]
  at::Tensor terminated;  ///< [N] float 0/1: terminal state, do not bootstrap
  at::Tensor truncated;   ///< [N] float 0/1: cut by a time limit, bootstrap
  at::Tensor task;        ///< [N] int64: each env's task (envs with tasks; else undefined)
};

/// A batch sampled from a replay buffer.
struct ReplayBatch {
  at::Tensor obs;         ///< [B, obs_dim]
  at::Tensor action;      ///< [B, act_dim]
  at::Tensor reward;      ///< [B] (an n-step return when the buffer computes them)
  at::Tensor next_obs;    ///< [B, obs_dim]
  at::Tensor terminated;  ///< [B] float 0/1
  at::Tensor discount;    ///< [B] gamma^n for the bootstrap term (gamma for 1-step)
  at::Tensor weight;      ///< [B] importance weights (ones for uniform sampling)
  at::Tensor index;       ///< [B] int64 ids (the order transitions were added in), for priority updates
  at::Tensor task;        ///< [B] int64: each transition's task (envs with tasks; else undefined)
};

/// Rows [begin, begin + n) of every defined field of `b` (views, no copies): the micro-
/// batches of gradient accumulation.
inline ReplayBatch rows_of(const ReplayBatch& b, std::int64_t begin, std::int64_t n) {
  auto part = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
  return {part(b.obs),        part(b.action),   part(b.reward), part(b.next_obs), part(b.terminated),
          part(b.discount),   part(b.weight),   part(b.index),  part(b.task)};
}

/// A batch of collective distillation (buffers/collective_dataset.hpp): for each target
/// row, the history before it and the expert's labels at it.
struct CollectiveBatch {
  at::Tensor tokens;    ///< [B, H, obs_dim + act_dim + 1] the (state, action, reward) steps before, oldest first
  at::Tensor mask;      ///< [B, H] float 1 where the token is of the target row's episode
  at::Tensor obs;       ///< [B, obs_dim] the target row's state
  at::Tensor action;    ///< [B, act_dim] the action taken there (for the Q head)
  at::Tensor mean;      ///< [B, act_dim] the expert's pre-tanh mean
  at::Tensor log_std;   ///< [B, act_dim] the expert's log standard deviation
  at::Tensor q_target;  ///< [B] the expert's clipped double-Q target
  at::Tensor task;      ///< [B] int64 task ids (the dataset's task list)
};

/// Rows [begin, begin + n) of every field of `b` (views): micro-batches.
inline CollectiveBatch rows_of(const CollectiveBatch& b, std::int64_t begin, std::int64_t n) {
  auto part = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
  return {part(b.tokens), part(b.mask), part(b.obs), part(b.action), part(b.mean), part(b.log_std), part(b.q_target), part(b.task)};
}

/// A minibatch of an on-policy rollout, with advantages already computed.
struct RolloutBatch {
  at::Tensor obs;        ///< [B, obs_dim]
  at::Tensor action;     ///< [B, act_dim] or [B] (discrete)
  at::Tensor log_prob;   ///< [B] log-probability of `action` under the policy that acted
  at::Tensor advantage;  ///< [B]
  at::Tensor returns;    ///< [B] targets for the value function
  at::Tensor value;      ///< [B] value estimates at collection time
  /// Sequences, for recurrent policies (`CarriesMemory`): with `sequence_length` L > 0 the
  /// B rows are L consecutive steps of K = B / L env rows, time first (row t K + j is step
  /// t of sequence j); `first` [B] is 1 where an episode starts at a row (the memory is
  /// forgotten before it), `memory` [K, width] the policy's memory at each sequence's first
  /// row as it acted. L = 0: independent rows, `first` and `memory` undefined.
  at::Tensor first{};
  at::Tensor memory{};
  std::int64_t sequence_length = 0;
};

/// One step of N envs as an on-policy algorithm collects it: what the policy did and what
/// it expected, for a rollout buffer to compute advantages from.
struct RolloutStep {
  at::Tensor obs;             ///< [N, obs_dim] what the policy acted on
  at::Tensor action;          ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor log_prob;        ///< [N] log-probability of `action` under the acting policy
  at::Tensor value;           ///< [N] value estimate of `obs`
  at::Tensor reward;          ///< [N]
  at::Tensor terminated;      ///< [N] float 0/1: terminal state, the return ends here
  at::Tensor truncated;       ///< [N] float 0/1: cut by a time limit, bootstrap from the last state
  at::Tensor bootstrap_value; ///< [N] value of the last state where truncated (undefined: none truncated)
  at::Tensor memory{};        ///< [N, width] a recurrent policy's memory it acted from (undefined: none)
  at::Tensor first{};         ///< [N] float 0/1: `obs` starts an episode (with `memory`)
};

/// What an on-policy algorithm returns when it acts for a rollout.
struct RolloutAct {
  at::Tensor action;    ///< [N, act_dim] or [N] (discrete)
  at::Tensor log_prob;  ///< [N]
  at::Tensor value;     ///< [N]
  at::Tensor memory{};  ///< [N, width] a recurrent policy's memory it acted from (undefined: none)
};

/// One step of N envs as the episodic loop collects it: row i is env i. `live` is 1 for
/// the envs still in the episode this round collects (0 for those whose episode has ended
/// and which now run on into one that is not kept).
struct EpisodeStep {
  at::Tensor obs;         ///< [N, obs_dim] what the policy acted on
  at::Tensor action;      ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor reward;      ///< [N]
  at::Tensor terminated;  ///< [N] float 0/1
  at::Tensor truncated;   ///< [N] float 0/1
  at::Tensor live;        ///< [N] float 0/1
  at::Tensor next_obs;    ///< [N, obs_dim] what the step led to (the last of an ended episode)
};

/// A round of whole episodes, one per env, padded to the longest: row i is env i's episode.
struct EpisodeBatch {
  at::Tensor obs;         ///< [N, T, obs_dim]
  at::Tensor action;      ///< [N, T, act_dim] or [N, T] (discrete)
  at::Tensor reward;      ///< [N, T]
  at::Tensor terminated;  ///< [N, T] 1 at a terminal step (the return ends there)
  at::Tensor mask;        ///< [N, T] 1 where the step belongs to the episode, 0 in the padding
  at::Tensor length;      ///< [N] int64: each episode's steps
  at::Tensor last_obs;    ///< [N, obs_dim] the observation after each episode's last step
};

/// What a buffer is told of the run before it starts, and again after a resume (`plan`).
struct StoragePlan {
  std::int64_t num_envs = 1;  ///< envs stepped together on this rank: the rows of each `add`
  std::int64_t horizon = 0;   ///< the run's length in env steps (schedules such as PER's beta)
  double discount = 0.99;     ///< the algorithm's discount (n-step returns, advantages)
  /// Windows of consecutive steps, for algorithms that learn from sequences (Diffusion
  /// Policy): observations and actions per sample (1, 1: single transitions).
  std::int64_t sequence_obs = 1;
  std::int64_t sequence_actions = 1;
  /// A recurrent policy's memory of each env, in numbers (0: none), for a rollout to keep
  /// beside each step (`CarriesMemory`).
  std::int64_t memory = 0;
};

/// What one call of an algorithm's `update` reports: scalar metrics for logging, and for
/// prioritized replay the new priorities of the batch's rows (|TD error|), else undefined.
struct UpdateInfo {
  std::vector<std::pair<std::string, double>> metrics;
  at::Tensor td_error;
};

}  // namespace anvil
