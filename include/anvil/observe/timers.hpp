#pragma once
/// @file
/// Where the time goes: wall-clock totals for each phase of a trainer step. Light header.
/// A phase is timed with `ScopedPhase`; two clock reads per phase, about 50 ns.

#include <array>
#include <chrono>
#include <cstddef>
#include <string_view>

namespace anvil {

/// The phases of a trainer step that are timed separately.
enum class Phase : std::size_t { env, act, buffer_add, sample, update, eval, log, count };

/// Name of each phase as it appears in logs and summary.json.
inline constexpr std::array<std::string_view, static_cast<std::size_t>(Phase::count)> kPhaseNames{
    "env", "act", "buffer_add", "sample", "update", "eval", "log"};

/// Accumulated seconds per phase.
class PhaseTimes {
 public:
  using clock = std::chrono::steady_clock;
  void add(Phase p, clock::duration d) noexcept { total_[static_cast<std::size_t>(p)] += d; }
  [[nodiscard]] double seconds(Phase p) const noexcept {
    return std::chrono::duration<double>(total_[static_cast<std::size_t>(p)]).count();
  }
  [[nodiscard]] double total_seconds() const noexcept {
    double s = 0;
    for (std::size_t i = 0; i < total_.size(); ++i) s += seconds(static_cast<Phase>(i));
    return s;
  }
  /// Share of the timed total spent in `p` (0 when nothing was timed).
  [[nodiscard]] double share(Phase p) const noexcept {
    const double t = total_seconds();
    return t > 0 ? seconds(p) / t : 0.0;
  }

 private:
  std::array<clock::duration, static_cast<std::size_t>(Phase::count)> total_{};
};

/// Adds the time from construction to destruction to one phase.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes& t, Phase p) noexcept : t_(t), p_(p), start_(PhaseTimes::clock::now()) {}
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;
  ~ScopedPhase() { t_.add(p_, PhaseTimes::clock::now() - start_); }

 private:
  PhaseTimes& t_;
  Phase p_;
  PhaseTimes::clock::time_point start_;
};

}  // namespace anvil
