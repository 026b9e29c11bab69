#pragma once
/// @file
/// `EpisodeStats`: the returns of the episodes this rank's envs finished during training:
/// the most recent ones (for the running mean in logs and on the progress bar) and how many
/// finished since the ranks last added up their counts (`Clock::episodes`), and each
/// episode finished since the last log row (return, length, env step) for per-episode
/// logs. Light header.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>

namespace anvil {

/// Training episodes' returns on this rank (see file comment).
class EpisodeStats {
 public:
  /// Returns kept for the running mean.
  static constexpr std::size_t kKept = 100;

  /// One finished episode, for per-episode logs.
  struct Episode {
    double episode_return = 0;
    std::int64_t length = 0;
    std::int64_t env_step = 0;  ///< the run's env steps when it ended
  };
  /// Episodes kept for per-episode logs between two log rows (the oldest go beyond it).
  static constexpr std::size_t kFreshKept = 10'000;

  /// Counts one finished episode of `length` steps that ended at env step `env_step`.
  void record(double episode_return, std::int64_t length = 0, std::int64_t env_step = 0) {
    recent_.push_back(episode_return);
    if (recent_.size() > kKept) recent_.pop_front();
    ++unfolded_;
    if (fresh_.size() < kFreshKept) fresh_.push_back({episode_return, length, env_step});
  }
  /// The episodes finished since the last call (per-episode logs), oldest first.
  std::vector<Episode> take_fresh() { return std::exchange(fresh_, {}); }

  /// The last (up to) `kKept` returns, oldest first.
  [[nodiscard]] const std::deque<double>& recent() const noexcept { return recent_; }
  /// How many of the last `k` returns there are, and their sum.
  [[nodiscard]] std::pair<std::size_t, double> last(std::size_t k) const {
    k = std::min(k, recent_.size());
    return {k, std::accumulate(recent_.end() - static_cast<std::ptrdiff_t>(k), recent_.end(), 0.0)};
  }
  /// Mean of the last `k` returns (NaN before the first episode ends).
  [[nodiscard]] double recent_mean(std::size_t k = 10) const {
    const auto [n, sum] = last(k);
    return n > 0 ? sum / static_cast<double>(n) : NAN;
  }
  /// Episodes finished since the last `take_unfolded`.
  [[nodiscard]] std::int64_t unfolded() const noexcept { return unfolded_; }
  /// Those episodes' count, and resets it (the caller adds it to the clock's total).
  std::int64_t take_unfolded() noexcept { return std::exchange(unfolded_, 0); }

  /// State protocol (core/state.hpp).
  void save(BinaryWriter& w) const {
    w.value(unfolded_);
    w.value(static_cast<std::uint64_t>(recent_.size()));
    for (double x : recent_) w.value(x);
  }
  struct Saved {
    std::int64_t unfolded = 0;
    std::deque<double> recent;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.unfolded = r.value<std::int64_t>("episodes since the last count");
    const auto n = r.value<std::uint64_t>("recent returns");
    if (n > kKept) r.fail("recent returns", "are more than the " + std::to_string(kKept) + " a run keeps");
    for (std::uint64_t i = 0; i < n; ++i) s.recent.push_back(r.value<double>("recent returns"));
    return s;
  }
  void restore(Saved s) {
    unfolded_ = s.unfolded;
    recent_ = std::move(s.recent);
  }

 private:
  std::deque<double> recent_;
  std::int64_t unfolded_ = 0;
  std::vector<Episode> fresh_;
};

}  // namespace anvil
