#pragma once
/// @file
/// `StepCollector`: what stands between a loop and its envs. It owns the vectorised envs and
/// the observations they show now, maps the algorithm's actions to the env's units (and
/// draws the uniform random actions of the warm-up), steps the envs (at once, or started in
/// the background and landed later: `env.mode=async`), times the env phase, and keeps the
/// training episodes' returns, and a recurrent policy's memory of each env (`AgentMemory`:
/// the envs whose episode ended start one at their next observation). Not a template: one copy serves every Trainer type.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/agent_memory.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/reused_tensor.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/data/episode_stats.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/observe/timers.hpp>

namespace anvil {

/// The envs of one rank, as a loop collects from them (see file comment).
class StepCollector {
 public:
  /// Collects from `envs`, timing env steps into `times` (which must outlive it).
  StepCollector(std::unique_ptr<envs::VecEnvBase> envs, PhaseTimes& times)
      : envs_(std::move(envs)), times_(&times) {
    const auto& spec = envs_->spec();
    if (!spec.discrete()) {
      // Algorithms act in [-1, 1] per bounded dimension; unbounded ones pass through.
      const auto& box = std::get<Box>(spec.action);
      const auto d = spec.action_dim();
      scale_ = at::ones({d});
      offset_ = at::zeros({d});
      low_ = at::full({d}, -1.0);
      high_ = at::full({d}, 1.0);
      for (std::int64_t i = 0; i < d; ++i) {
        if (std::isfinite(box.low[static_cast<std::size_t>(i)]) && std::isfinite(box.high[static_cast<std::size_t>(i)])) {
          scale_[i] = 0.5 * (box.high[static_cast<std::size_t>(i)] - box.low[static_cast<std::size_t>(i)]);
          offset_[i] = 0.5 * (box.high[static_cast<std::size_t>(i)] + box.low[static_cast<std::size_t>(i)]);
        } else {
          low_[i] = -INFINITY;
          high_[i] = INFINITY;
        }
      }
    }
  }

  [[nodiscard]] const EnvSpec& spec() const noexcept { return envs_->spec(); }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return envs_->num_envs(); }
  [[nodiscard]] envs::VecEnvBase& envs() noexcept { return *envs_; }
  [[nodiscard]] const envs::VecEnvBase& envs() const noexcept { return *envs_; }
  /// The tasks of envs that have tasks (`VecEnvBase::groups()`); empty otherwise.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return envs_->groups(); }
  [[nodiscard]] EpisodeStats& episodes() noexcept { return stats_; }
  [[nodiscard]] const EpisodeStats& episodes() const noexcept { return stats_; }
  /// A recurrent policy's memory of each env (unplanned for other policies; the on-policy
  /// loop plans it); each step marks the envs whose episode ended as starting one.
  [[nodiscard]] AgentMemory& memory() noexcept { return memory_; }
  [[nodiscard]] const AgentMemory& memory() const noexcept { return memory_; }

  /// The observations to act on: those the last step left (the first of a new episode
  /// where one ended); the envs are reset the first time.
  [[nodiscard]] const at::Tensor& observations() {
    if (!obs_.defined()) obs_ = envs_->reset();
    return obs_;
  }

  /// The algorithm's actions as the env takes them: discrete indices as int64 on the CPU;
  /// continuous ones clipped to [-1, 1] and scaled to the bounds (unbounded dimensions as
  /// they are). The algorithm may keep the unclipped action.
  [[nodiscard]] at::Tensor to_env(const at::Tensor& a) const {
    if (spec().discrete()) return a.to(at::kCPU, at::kLong).reshape({-1});
    if (a.is_cpu() && a.scalar_type() == at::kFloat && a.is_contiguous() && a.dim() == 2 &&
        a.size(1) == scale_.size(0)) {
      // The usual case, once per env step: one allocation and a loop, no LibTorch ops.
      auto out = env_actions_.take(a.sizes(), at::kFloat);  // the last step's, once the envs let go of it
      const float* in = a.data_ptr<float>();
      const float *lo = low_.data_ptr<float>(), *hi = high_.data_ptr<float>();
      const float *sc = scale_.data_ptr<float>(), *off = offset_.data_ptr<float>();
      float* o = out.data_ptr<float>();
      const std::int64_t n = a.size(0), d = a.size(1);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < d; ++j) {
          // max(min(x, high), low): NaN passes through, as with at::min and at::max
          const float x = in[i * d + j];
          const float c = std::isnan(x) ? x : std::max(std::min(x, hi[j]), lo[j]);
          o[i * d + j] = c * sc[j] + off[j];
        }
      return out;
    }
    const auto c = a.to(at::kCPU, at::kFloat);
    return at::max(at::min(c, high_), low_) * scale_ + offset_;
  }
  /// The env-unit scale and offset of continuous actions (for policy files); undefined
  /// for discrete ones.
  [[nodiscard]] const at::Tensor& action_scale() const noexcept { return scale_; }
  [[nodiscard]] const at::Tensor& action_offset() const noexcept { return offset_; }
  /// Where continuous actions are clipped before that scaling (-1 and 1, or -inf and inf
  /// for an unbounded dimension); undefined for discrete ones.
  [[nodiscard]] const at::Tensor& action_low() const noexcept { return low_; }
  [[nodiscard]] const at::Tensor& action_high() const noexcept { return high_; }

  /// Actions drawn uniformly in the algorithm's units, one row per env (the warm-up before
  /// learning starts), from torch's generator.
  [[nodiscard]] at::Tensor random_actions() const {
    const auto n = num_envs();
    if (spec().discrete()) return at::randint(spec().num_actions(), {n}, at::kLong);
    return at::rand({n, spec().action_dim()}) * 2.0 - 1.0;
  }

  /// Steps every env with `actions` (the algorithm's units) and returns the step; the
  /// observations move on and finished episodes are counted (unless the caller counts them
  /// itself: `count_episodes` false). The step's tensors stay valid until the step after next.
  const envs::VecStep& step(const at::Tensor& actions, bool count_episodes = true) {
    const envs::VecStep* s = nullptr;
    {
      ScopedPhase ph(*times_, Phase::env);  // one timed phase for the launch and the wait
      start(actions);
      s = &finish();
    }
    return take_in(*s, count_episodes);
  }

  /// Starts a step with `actions` without waiting for it: with `env.mode=async` the envs
  /// step in the background while the caller works (e.g. updates) until `land`.
  void launch(const at::Tensor& actions) {
    ScopedPhase ph(*times_, Phase::env);
    start(actions);
  }
  /// Whether a launched step has not landed yet.
  [[nodiscard]] bool in_flight() const noexcept { return in_flight_; }
  /// Waits for the launched step and takes it in (as `step` does).
  const envs::VecStep& land(bool count_episodes = true) {
    const envs::VecStep* s = nullptr;
    {
      ScopedPhase ph(*times_, Phase::env);
      s = &finish();
    }
    return take_in(*s, count_episodes);
  }

  /// Every env starts a new episode now (the episodic loop's rounds); a step in flight
  /// lands first.
  void restart() {
    if (in_flight_) (void)land();
    obs_ = envs_->reset();
    last_obs_ = at::Tensor();
    memory_.restart();
  }
  /// The observations the step that landed last was taken from (what a transition stores).
  [[nodiscard]] const at::Tensor& previous_observations() const noexcept { return last_obs_; }

  /// The run's env-step count (the clock's), which episodes are recorded with.
  void count_steps_from(const std::int64_t* env_steps) noexcept { env_steps_ = env_steps; }
  /// The run's env steps now (0 when no count was given).
  [[nodiscard]] std::int64_t env_step() const noexcept { return env_steps_ ? *env_steps_ : 0; }

  /// After the envs' state was restored (a resume): act on what they show now, or start
  /// new episodes when their state was not saved.
  void restored() {
    obs_ = envs_->observations();
    last_obs_ = at::Tensor();
    if (!envs_->saves_state()) memory_.restart();
  }

 private:
  // launch's and land's work, untimed (the callers time it).
  void start(const at::Tensor& actions) {
    if (in_flight_) throw Error("StepCollector::launch: a step is already in flight; land() it first");
    if (!obs_.defined()) obs_ = envs_->reset();
    envs_->step_async(to_env(actions));
    in_flight_ = true;
  }
  const envs::VecStep& finish() {
    if (!in_flight_) throw Error("StepCollector::land: no step in flight");
    in_flight_ = false;
    return envs_->step_wait();
  }
  const envs::VecStep& take_in(const envs::VecStep& s, bool count_episodes) {
    last_obs_ = obs_;
    obs_ = s.obs;
    memory_.mark_starts(s.terminated, s.truncated);
    if (count_episodes)
      for (const auto& e : s.ended) stats_.record(e.episode_return, e.length, env_step() + num_envs());
    return s;
  }
  std::unique_ptr<envs::VecEnvBase> envs_;
  PhaseTimes* times_;
  at::Tensor obs_, last_obs_;
  at::Tensor scale_, offset_, low_, high_;
  mutable detail::ReusedTensor env_actions_;  // to_env's output, step after step
  bool in_flight_ = false;
  EpisodeStats stats_;
  AgentMemory memory_;
  const std::int64_t* env_steps_ = nullptr;
};

}  // namespace anvil
