#pragma once
/// @file
/// `Clock`: where a run is. Loops advance it; hooks (evaluation, logging, checkpoints,
/// progress) fire on it. It is the same on every rank. Light header.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

/// What a loop's schedule counts: env steps (online loops) or gradient updates (offline
/// loops, which take no env steps while they learn).
enum class ClockUnit { env_steps, updates };
constexpr std::string_view unit_name(ClockUnit u) { return u == ClockUnit::env_steps ? "env steps" : "gradient updates"; }
/// One of `u`, for messages ("at env step 1200").
constexpr std::string_view step_name(ClockUnit u) { return u == ClockUnit::env_steps ? "env step" : "gradient update"; }

/// Where a run is (see file comment).
struct Clock {
  /// Env steps of every rank's envs together (what `train.steps` counts in online loops).
  std::int64_t env_steps = 0;
  /// Gradient updates (each a step of the algorithm's optimizers), the same on every rank.
  std::int64_t updates = 0;
  /// Finished training episodes of every rank's envs, as of the last time the ranks added up
  /// their counts (each log row); episodes since then are in the collector's count.
  std::int64_t episodes = 0;
  /// What `now()` counts: the unit of the loop's schedule and of the hooks' intervals.
  ClockUnit unit = ClockUnit::env_steps;

  /// The count in the loop's unit.
  [[nodiscard]] std::int64_t now() const noexcept { return unit == ClockUnit::env_steps ? env_steps : updates; }
  /// The count in `u`.
  [[nodiscard]] std::int64_t in(ClockUnit u) const noexcept { return u == ClockUnit::env_steps ? env_steps : updates; }

  void save(BinaryWriter& w) const {
    w.value(env_steps);
    w.value(updates);
    w.value(episodes);
  }
  struct Saved {
    std::int64_t env_steps = 0, updates = 0, episodes = 0;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{r.value<std::int64_t>("env steps"), r.value<std::int64_t>("updates"), r.value<std::int64_t>("episodes")};
    if (s.env_steps < 0 || s.updates < 0 || s.episodes < 0) r.fail("clock", "holds a negative count");
    return s;
  }
  void restore(const Saved& s) noexcept {
    env_steps = s.env_steps;
    updates = s.updates;
    episodes = s.episodes;
  }
};

/// When a hook fires: every `every` units of the clock (0: never, except where the hook
/// says, e.g. at the end). Keeps the schedule of a resumed run: the next time is the next
/// multiple of `every` after where the run stands.
class Every {
 public:
  Every() = default;
  explicit Every(std::int64_t every) : every_(every) {}

  /// Starts (or restarts, after a resume) at clock value `now`.
  void start(std::int64_t now) noexcept { next_ = every_ > 0 ? (now / every_ + 1) * every_ : INT64_MAX; }
  /// Whether the hook is due at `now`; when it is, the next time moves past `now`.
  [[nodiscard]] bool due(std::int64_t now) noexcept {
    if (now < next_) return false;
    while (next_ <= now) next_ += every_;
    return true;
  }
  /// The next clock value at which it is due (INT64_MAX: never).
  [[nodiscard]] std::int64_t next() const noexcept { return next_; }
  [[nodiscard]] std::int64_t every() const noexcept { return every_; }

 private:
  std::int64_t every_ = 0;
  std::int64_t next_ = INT64_MAX;
};

}  // namespace anvil
