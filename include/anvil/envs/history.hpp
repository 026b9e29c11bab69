#pragma once
/// @file
/// `History<E>`: an env seen with its own recent past, for policies that infer the task from
/// it (the collective policy of collective distillation). The observation is
///
///     [ H tokens of (state, action, reward), oldest first | H mask numbers | state ]
///
/// where a state is the first `state_dim` numbers of the inner env's observation (a task
/// one-hot after them is left out), an action is in [-1, 1] (the policy's units: the env's
/// action mapped back from its bounds), and the mask is 1 for tokens of the current episode
/// (an episode starts with none). Everything else (tasks, success, placement, state for
/// checkpoints) is the inner env's. Light header: no torch.

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

template <ContinuousEnv E>
class History {
 public:
  static constexpr std::string_view name = E::name;

  /// `history` tokens of the first `state_dim` observation numbers (0: all of them).
  History(E env, int history, std::int64_t state_dim = 0) : env_(std::move(env)), h_(history) {
    const auto full = static_cast<std::int64_t>(env_.observation_space().size());
    sd_ = state_dim == 0 ? full : state_dim;
    if (h_ < 1) throw ConfigError("History: history must be at least 1 token (is " + std::to_string(h_) + ")");
    if (sd_ < 1 || sd_ > full)
      throw ConfigError("History: state_dim " + std::to_string(sd_) + " is not within the env's " + std::to_string(full) + " observation numbers");
    const auto space = env_.action_space();
    ad_ = static_cast<std::int64_t>(space.size());
    low_ = space.low;
    high_ = space.high;
    obs_.assign(static_cast<std::size_t>(h_ * token() + h_ + sd_), 0.0f);
  }

  [[nodiscard]] Box observation_space() const {
    const auto inner = env_.observation_space();
    Box b;
    const auto n = static_cast<std::size_t>(h_ * token());
    b.low.assign(n, -std::numeric_limits<float>::infinity());
    b.high.assign(n, std::numeric_limits<float>::infinity());
    b.low.insert(b.low.end(), static_cast<std::size_t>(h_), 0.0f);
    b.high.insert(b.high.end(), static_cast<std::size_t>(h_), 1.0f);
    b.low.insert(b.low.end(), inner.low.begin(), inner.low.begin() + sd_);
    b.high.insert(b.high.end(), inner.high.begin(), inner.high.begin() + sd_);
    return b;
  }
  [[nodiscard]] Box action_space() const { return env_.action_space(); }

  std::span<const float> reset(std::uint64_t seed) {
    const auto o = env_.reset(seed);
    std::fill(obs_.begin(), obs_.end(), 0.0f);
    set_state(o);
    return obs_;
  }

  StepResult step(std::span<const float> action) {
    auto r = env_.step(action);
    // The oldest token leaves; (state, action, reward) of this step comes in last.
    const auto t = static_cast<std::size_t>(token());
    const auto tokens_end = obs_.begin() + static_cast<std::ptrdiff_t>(h_ * t);
    std::copy(obs_.begin() + static_cast<std::ptrdiff_t>(t), tokens_end, obs_.begin());
    float* last = obs_.data() + (h_ - 1) * token();
    std::copy_n(obs_.data() + h_ * token() + h_, sd_, last);  // the state the action was taken in
    for (std::int64_t j = 0; j < ad_; ++j) {
      const auto k = static_cast<std::size_t>(j);
      const float a = std::clamp(action[k], low_[k], high_[k]);
      last[sd_ + j] = high_[k] > low_[k] ? 2.0f * (a - low_[k]) / (high_[k] - low_[k]) - 1.0f : 0.0f;
    }
    last[sd_ + ad_] = static_cast<float>(r.reward);
    float* mask = obs_.data() + h_ * token();
    std::copy(mask + 1, mask + h_, mask);
    mask[h_ - 1] = 1.0f;
    set_state(r.observation);
    r.observation = obs_;
    return r;
  }

  [[nodiscard]] bool success() const noexcept
    requires ReportsSuccess<E>
  {
    return env_.success();
  }
  [[nodiscard]] std::vector<std::string> task_names() const
    requires TaskTagged<E>
  {
    return env_.task_names();
  }
  [[nodiscard]] std::int64_t task_index() const
    requires TaskTagged<E>
  {
    return env_.task_index();
  }
  void select_tasks(const std::string& suite, const std::vector<std::string>& tasks)
    requires TaskSelectable<E>
  {
    env_.select_tasks(suite, tasks);
    if (static_cast<std::int64_t>(env_.observation_space().size()) < sd_)
      throw ConfigError("History: the env's observation has " + std::to_string(env_.observation_space().size()) +
                        " numbers with these tasks, fewer than state_dim " + std::to_string(sd_));
  }
  void set_max_episode_steps(std::int64_t n)
    requires TimeLimitable<E>
  {
    env_.set_max_episode_steps(n);
  }
  void place(std::int64_t index, std::int64_t count)
    requires Placeable<E>
  {
    env_.place(index, count);
  }

  [[nodiscard]] int history() const noexcept { return h_; }
  [[nodiscard]] std::int64_t state_dim() const noexcept { return sd_; }
  [[nodiscard]] std::int64_t token() const noexcept { return sd_ + ad_ + 1; }
  [[nodiscard]] E& env() noexcept { return env_; }

  void save_state(BinaryWriter& w) const {
    if constexpr (SavesOwnState<E>) env_.save_state(w);
    else w.value(env_);
    w.bytes(obs_.data(), obs_.size() * sizeof(float));
  }
  void load_state(BinaryReader& r) {
    if constexpr (SavesOwnState<E>) env_.load_state(r);
    else env_ = r.value<E>("inner env");
    r.bytes(obs_.data(), obs_.size() * sizeof(float), "history");
  }

 private:
  void set_state(std::span<const float> o) { std::copy_n(o.begin(), sd_, obs_.begin() + h_ * token() + h_); }

  E env_;
  int h_;
  std::int64_t sd_ = 0, ad_ = 0;
  std::vector<float> low_, high_;
  std::vector<float> obs_;
};

}  // namespace anvil::envs
