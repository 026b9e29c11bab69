#pragma once
/// @file
/// What every loop shares: the parts of a run a loop orders (`LoopParts`), the settings a
/// loop gives the Trainer (`LoopSettings`: its unit, length, evaluation schedule and the
/// optimizer-step settings), and the config fields several loops have, declared once.
///
/// A loop is a policy of kind `LoopKind` (core/concepts.hpp): a tag type with a `name`, a
/// `Config` (the `train` section), `rules<A, B>()` (true when the loop can run algorithm A
/// with buffer B; otherwise one static_assert sentence, an `ANVIL_LOOP_RULE`, names what is missing)
/// and `Runner<A, B>`, which runs it. A runner has:
///
///     Runner(const Config&, LoopParts<A, B>);
///     LoopSettings settings() const;   // the current stage's settings
///     void begin();                    // its stage starts: sets the clock's unit, plans the buffer
///     bool done() const;               // the stage's length is reached
///     void iterate(std::int64_t quiet_until);  // one iteration; see below
///     void at_log_row();               // its part of a log row (e.g. merge normalisers over ranks)
///     void resumed();                  // after a resume restored the run's state
///     int stage() const;               // which stage runs (0 but for Staged)
///     BottleneckAdvice advice(const AdviceKeys&) const;  // what the timing verdict suggests, in its knobs
///     save / read / restore            // its state (section "loop"), the same on every rank
///
/// A stage counts its length from where the clock stood when it began (`origin`), so a
/// loop can follow another in a `Staged` run.
///
/// `quiet_until` is the next clock value at which a hook (evaluation, log row, checkpoint)
/// fires: a loop that overlaps work (the off-policy loop's async env steps) leaves nothing
/// in flight when it reaches it, so hooks see the run at rest.

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/lr_scaling.hpp>
#include <anvil/core/param.hpp>

/// One rule of a loop's `rules<A, B>()`, a chain of them ended by `return true;`: when
/// `condition` is false the chain stops there, returning false after a static_assert that says
/// "Trainer: the " `sentence`; the rules after it are not instantiated, so only the first broken
/// rule speaks. (A macro because C++20 takes only a string literal as a static_assert's
/// message; `condition` goes in parentheses where it has a comma.)
#define ANVIL_LOOP_RULE(condition, sentence)         \
  if constexpr (!(condition)) {                      \
    static_assert(condition, "Trainer: the " sentence); \
    return false;                                    \
  } else
#include <anvil/data/step_collector.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/observe/update_metrics.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/loops/loop_config.hpp>

namespace anvil {

/// The parts of a run a loop orders; the Trainer owns them all.
template <class A, class B>
struct LoopParts {
  A& algorithm;
  B& buffer;
  StepContext& step;           ///< autocast, loss scaling, all-reduce, optimizer steps
  StepCollector& collector;    ///< the training envs
  Clock& clock;
  Ranks& ranks;
  PhaseTimes& times;
  UpdateMetrics& metrics;      ///< update metrics until the next log row
};

/// What a loop's config says that the Trainer and its hooks use.
struct LoopSettings {
  ClockUnit unit = ClockUnit::env_steps;    ///< what `steps` and the hooks' intervals count
  ClockUnit record_unit = ClockUnit::env_steps;  ///< the step of TensorBoard records and the progress bar
  std::int64_t steps = 0;                   ///< the stage's length, in `unit`
  std::int64_t origin = 0;                  ///< the clock (in `unit`) when the stage began
  std::int64_t eval_interval = 0;           ///< in `unit`; 0: only at the end
  int eval_episodes = 10;
  int grad_accumulation = 1;                ///< micro-batches per optimizer step
  double ema_decay = 0;                     ///< policy average after each update (0: off)
  LrScaling lr_scaling = LrScaling::none;
  std::int64_t base_batch = 256;
};

/// The config keys a loop's timing advice may name (`BottleneckAdvice`): the loop's own
/// section, and its algorithm's fields, found by their last part, so that advice names
/// only keys the run's config has.
struct AdviceKeys {
  std::string train = "train";         ///< the loop's section ("train.offline" in a Staged run)
  std::vector<std::string> algorithm;  ///< every key of the algorithm's section, in order
  /// The algorithm's first key whose last part is `leaf` ("sac.batch_size"), or "".
  [[nodiscard]] std::string find(std::string_view leaf) const {
    for (const auto& k : algorithm)
      if (k.size() > leaf.size() && k.ends_with(leaf) && k[k.size() - leaf.size() - 1] == '.') return k;
    return "";
  }
};

/// A loop a custom main can drive a step at a time (`collect(n)` env steps, `update(k)`
/// updates): the off-policy loop.
template <class R>
concept StepwiseLoop = requires(R& r, std::int64_t n, int k) {
  { r.collect(n) };
  { r.update(k) };
};

namespace loops {

/// `first` and `second` joined by `sep`, leaving out an empty one.
inline std::string either(const std::string& first, const std::string& sep, const std::string& second) {
  return first.empty() ? second : second.empty() ? first : first + sep + second;
}
/// The advice every loop gives when evaluations, log rows and checkpoints take the time.
inline std::string side_advice(const AdviceKeys& k) {
  return "raise " + k.train + ".eval_interval, run.log_interval or run.checkpoint_interval";
}
/// The advice every loop that acts in envs gives when choosing actions takes the time.
inline std::string act_advice() { return "raise env.num_envs so each forward pass serves more envs"; }

/// The settings every loop's config gives in the same fields.
template <class Config>
LoopSettings common_settings(const Config& c, ClockUnit unit) {
  LoopSettings s;
  s.unit = s.record_unit = unit;
  s.steps = c.steps;
  s.eval_interval = c.eval_interval;
  s.eval_episodes = c.eval_episodes;
  s.grad_accumulation = c.update->grad_accumulation;
  s.ema_decay = c.update->ema_decay;
  s.lr_scaling = c.update->lr_scaling;
  s.base_batch = c.update->base_batch;
  return s;
}

/// Stops the run at an update whose reported loss or statistic is not finite: without a
/// loss scaler (FP32, TF32, BF16) nothing skips that step, so the weights it moved are lost.
/// The error names the metric, the update and the env step; nothing is written after it, so
/// the last checkpoint and policy.bin stay as they were. Not a template.
[[gnu::cold, gnu::noinline]] inline void fail_non_finite(std::string_view algorithm, const std::string& metric, double v,
                                                         const Clock& clock) {
  throw Error(std::string(algorithm) + ": " + metric + " is " + non_finite_name(v) + " at gradient update " +
              std::to_string(clock.updates) + " (env step " + std::to_string(clock.env_steps) +
              "); the run stops without saving these weights (the last checkpoint is intact). Lower the learning "
              "rates, clip gradients (max_grad_norm), or look for extreme rewards or observations");
}

/// One update from `batch` through the parts' step context, timed as the update phase;
/// its metrics are kept for the next log row, the clock counts it, and the policy average
/// moves when `ema_decay` is on; a non-finite metric stops the run unless a loss scaler
/// skips such steps (`fail_non_finite`). Returns what the algorithm reported.
template <class A, class B, class Batch = typename A::Batch>
UpdateInfo update_once(LoopParts<A, B>& p, const Batch& batch, double ema_decay) {
  UpdateInfo info;
  {
    ScopedPhase ph(p.times, Phase::update);
    info = p.algorithm.update(batch, p.step);
  }
  p.metrics.add(info.metrics);
  ++p.clock.updates;
  if (!p.step.scaler())
    for (const auto& [name, v] : info.metrics)
      if (!std::isfinite(v)) [[unlikely]]
        fail_non_finite(A::config_section.view(), name, v, p.clock);
  if constexpr (AveragesPolicy<A>)
    if (ema_decay > 0) p.algorithm.ema_update(ema_decay);
  return info;
}

/// Refuses `train.ema_decay` for an algorithm that keeps no average of its policy.
template <class A>
void check_ema(double ema_decay) {
  if constexpr (!AveragesPolicy<A>)
    if (ema_decay > 0)
      throw ConfigError("train.ema_decay: " + std::string(A::config_section.view()) +
                        " keeps no average of its policy's weights (see anvil::AveragesPolicy)");
}

}  // namespace loops

/// What a Run needs of the loop that drives it, whatever the loop's type.
class LoopControl {
 public:
  virtual ~LoopControl() = default;
  [[nodiscard]] virtual LoopSettings settings() const = 0;
  [[nodiscard]] virtual int stage() const = 0;
  [[nodiscard]] virtual bool done() const = 0;
  virtual void iterate(std::int64_t quiet_until) = 0;
  virtual void at_log_row() = 0;
  virtual void resumed() = 0;
  [[nodiscard]] virtual BottleneckAdvice advice(const AdviceKeys& keys) const = 0;
};

/// `LoopControl` of a loop runner `R` (train/loops/loop.hpp).
template <class R>
class LoopControlOf final : public LoopControl {
 public:
  explicit LoopControlOf(R& r) : r_(r) {}
  [[nodiscard]] LoopSettings settings() const override { return r_.settings(); }
  [[nodiscard]] int stage() const override { return r_.stage(); }
  [[nodiscard]] bool done() const override { return r_.done(); }
  void iterate(std::int64_t quiet_until) override { r_.iterate(quiet_until); }
  void at_log_row() override { r_.at_log_row(); }
  void resumed() override { r_.resumed(); }
  [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& keys) const override { return r_.advice(keys); }

 private:
  R& r_;
};

}  // namespace anvil
