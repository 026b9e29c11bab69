#pragma once
/// @file
/// `MultiStep<E>`: an env seen through a window of its last observations and acting in
/// chunks of actions, as policies that predict action sequences act (Diffusion Policy's
/// evaluation wraps its envs the same way). One step of the wrapper executes
/// `action_horizon` actions of the inner env in turn, stopping early when the episode ends;
/// its reward is their sum; its observation is the inner env's last `obs_horizon`
/// observations, oldest first (after a reset: the first one repeated). An env of float
/// rows gives float rows (a `Box` repeated); an env of rows of parts (images) gives their
/// rows side by side, its `ObsLayout` stacked (`ObsLayout::stacked`: parts named
/// `<name>@<i>`). Light header: no torch.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs {

/// An env `E` with a Box action, observed over `obs_horizon` steps and driven by chunks of
/// `action_horizon` actions (see file comment).
template <ContinuousEnv E>
class MultiStep {
 public:
  static constexpr std::string_view name = E::name;

  using Element = obs_element_t<E>;
  using Step = BasicStepResult<Element>;

  MultiStep(E env, int obs_horizon, int action_horizon) : env_(std::move(env)), to_(obs_horizon), ta_(action_horizon) {
    if (obs_horizon < 1 || action_horizon < 1)
      throw ConfigError("MultiStep: obs_horizon and action_horizon must be at least 1 (are " + std::to_string(obs_horizon) + ", " +
                        std::to_string(action_horizon) + ")");
    inner_obs_ = row_elements(env_.observation_space());
    inner_act_ = env_.action_space().size();
    obs_.assign(static_cast<std::size_t>(to_) * inner_obs_, Element{});
  }

  [[nodiscard]] auto observation_space() const {
    if constexpr (ByteObservations<E>) return env_.observation_space().stacked(to_);
    else return repeat(env_.observation_space(), to_);
  }
  [[nodiscard]] Box action_space() const { return repeat(env_.action_space(), ta_); }

  std::span<const Element> reset(std::uint64_t seed) {
    const auto o = env_.reset(seed);
    for (int i = 0; i < to_; ++i) std::copy(o.begin(), o.end(), obs_.begin() + static_cast<std::ptrdiff_t>(i * inner_obs_));
    success_ = false;
    return obs_;
  }

  /// Executes the chunk's actions in turn (see file comment).
  Step step(std::span<const float> actions) {
    if (actions.size() != static_cast<std::size_t>(ta_) * inner_act_)
      throw EnvError(std::string(name) + ": a chunk of " + std::to_string(actions.size()) + " numbers; expected " +
                     std::to_string(ta_) + " actions of " + std::to_string(inner_act_));
    Step out{obs_, 0.0, false, false};
    success_ = false;
    for (int i = 0; i < ta_; ++i) {
      const auto r = env_.step(actions.subspan(static_cast<std::size_t>(i) * inner_act_, inner_act_));
      out.reward += r.reward;
      if constexpr (ReportsSuccess<E>) success_ = success_ || env_.success();
      std::copy(obs_.begin() + static_cast<std::ptrdiff_t>(inner_obs_), obs_.end(), obs_.begin());
      std::copy(r.observation.begin(), r.observation.end(), obs_.end() - static_cast<std::ptrdiff_t>(inner_obs_));
      out.terminated = r.terminated;
      out.truncated = r.truncated;
      if (r.terminated || r.truncated) break;
    }
    out.observation = obs_;
    return out;
  }

  /// Whether any step of the last chunk met the task's goal (when the env says so).
  [[nodiscard]] bool success() const noexcept
    requires ReportsSuccess<E>
  {
    return success_;
  }

  [[nodiscard]] int obs_horizon() const noexcept { return to_; }
  [[nodiscard]] int action_horizon() const noexcept { return ta_; }
  [[nodiscard]] E& env() noexcept { return env_; }
  [[nodiscard]] const E& env() const noexcept { return env_; }

  void save_state(BinaryWriter& w) const {
    if constexpr (SavesOwnState<E>) env_.save_state(w);
    else w.value(env_);
    w.bytes(obs_.data(), obs_.size() * sizeof(Element));
    w.value(success_);
  }
  void load_state(BinaryReader& r) {
    if constexpr (SavesOwnState<E>) env_.load_state(r);
    else env_ = r.value<E>("inner env");
    r.bytes(obs_.data(), obs_.size() * sizeof(Element), "observation window");
    success_ = r.value<bool>("chunk success");
  }

 private:
  static Box repeat(const Box& b, int n) {
    Box out;
    for (int i = 0; i < n; ++i) {
      out.low.insert(out.low.end(), b.low.begin(), b.low.end());
      out.high.insert(out.high.end(), b.high.begin(), b.high.end());
    }
    return out;
  }

  E env_;
  int to_, ta_;
  std::size_t inner_obs_ = 0, inner_act_ = 0;
  std::vector<Element> obs_;
  bool success_ = false;
};

}  // namespace anvil::envs
