#pragma once
/// @file
/// Loop config fields several loops have, declared once, and the off- and on-policy loops'
/// `train` sections, apart from the loops, so a Trainer's config can be built without torch
/// (`anvil/compiled.hpp`). Light header.

#include <algorithm>
#include <cstdint>
#include <string>

#include <anvil/core/error.hpp>
#include <anvil/core/lr_scaling.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>

namespace anvil {

/// Config fields several loops have, declared once (each loop's Config lists the ones it has).
namespace loops {
using EnvStepsParam = Param<std::int64_t, "steps", "env steps to train for (all envs together)", at_least(1)>;
using UpdateStepsParam = Param<std::int64_t, "steps", "gradient updates to train for", at_least(1)>;
using LearningStartsParam =
    Param<std::int64_t, "learning_starts", "env steps of uniform random actions before learning", at_least(0)>;
using EvalIntervalParam =
    Param<std::int64_t, "eval_interval", "env steps between evaluations (0: only at the end)", at_least(0)>;
using EvalUpdatesParam =
    Param<std::int64_t, "eval_interval", "gradient updates between evaluations (0: only at the end)", at_least(0)>;
using EvalEpisodesParam = Param<int, "eval_episodes", "episodes per evaluation, deterministic actions", at_least(1)>;

/// The update's own settings every loop has, in the `train` section itself (an inline
/// section: `train.grad_accumulation`, not `train.update.grad_accumulation`).
struct UpdateFields {
  Param<int, "grad_accumulation",
        "micro-batches per optimizer step: the batch's gradient is accumulated over k parts (memory)", at_least(1)>
      grad_accumulation{1};
  Param<double, "ema_decay",
        "exponential moving average of the policy's weights after each update, used to evaluate and in policy.bin "
        "(0: off; e.g. 0.995)",
        Range{.lo = 0, .hi = 1, .hi_open = true}>
      ema_decay{0.0};
  Param<LrScaling, "lr_scaling", "none; sqrt: lr*sqrt(batch/base_batch); linear: lr*world_size"> lr_scaling{
      LrScaling::none};
  Param<int, "base_batch", "batch size the learning rates were tuned for (sqrt scaling)", at_least(1)> base_batch{256};
};

/// What every loop's `shrink` (`run.smoke`, a run of seconds) does to its stage: at most
/// `steps` of it, no evaluation before its end, and two episodes in that one.
template <class C>
void shrink_stage(C& c, std::int64_t steps) {
  c.steps = std::min<std::int64_t>(c.steps, steps);
  c.eval_interval = 0;
  c.eval_episodes = std::min(*c.eval_episodes, 2);
}

/// The `train` section of an off-policy run.
struct OffPolicyConfig {
  loops::EnvStepsParam steps{100'000};
  loops::LearningStartsParam learning_starts{1000};
  Param<int, "update_interval", "env steps (of this rank) between rounds of updates", at_least(1)> update_interval{1};
  Param<int, "updates_per_interval", "gradient updates per round (update-to-data ratio)", at_least(1)>
      updates_per_interval{1};
  Section<"", loops::UpdateFields> update;  // inline: train.grad_accumulation, train.ema_decay, ...
  loops::EvalIntervalParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run that could never update is refused.
  void validate() const {
    if (learning_starts >= steps)
      throw ConfigError("train.learning_starts (" + std::to_string(*learning_starts) + ") is not below train.steps (" +
                        std::to_string(*steps) + "): the run would end before its first update");
  }

  /// A run of seconds (`run.smoke`): enough steps to pass the warm-up and update a little.
  void shrink() {
    shrink_stage(*this, 600);
    learning_starts = std::min<std::int64_t>(learning_starts, 200);
  }
};

/// The `train` section of an on-policy run (and of an episodic one): no warm-up and no
/// update schedule, since the algorithm learns once per rollout (or round of episodes) from
/// its own actions.
struct OnPolicyConfig {
  loops::EnvStepsParam steps{100'000};
  Section<"", loops::UpdateFields> update;  // inline: train.grad_accumulation, train.ema_decay, ...
  loops::EvalIntervalParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run of seconds (`run.smoke`).
  void shrink() { shrink_stage(*this, 600); }
};

/// The `train` section of an offline run; its counts are gradient updates.
struct OfflineConfig {
  loops::UpdateStepsParam steps{100'000};
  Param<std::string, "dataset",
        "buffer file to learn from (a run's checkpoint-*.buffer; empty: the buffer as the stages before left it)">
      dataset{""};
  Section<"", loops::UpdateFields> update;  // inline: train.grad_accumulation, train.ema_decay, ...
  loops::EvalUpdatesParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run of seconds (`run.smoke`).
  void shrink() { shrink_stage(*this, 200); }
};

}  // namespace loops

struct OffPolicyLoop;  // train/loops/off_policy.hpp
struct OnPolicyLoop;   // train/loops/on_policy.hpp

template <>
struct policy_config<OffPolicyLoop> {
  using type = loops::OffPolicyConfig;
  static constexpr FixedString section = "train";
};
template <>
struct policy_config<OnPolicyLoop> {
  using type = loops::OnPolicyConfig;
  static constexpr FixedString section = "train";
};

}  // namespace anvil
