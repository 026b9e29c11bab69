#pragma once
/// @file
/// `UpdateMetrics`: the scalars algorithms report with each update (`UpdateInfo::metrics`:
/// losses, Q means, temperatures, KL, ...) and loops add (PPO's epochs), summed by name
/// until the next log row, which writes their means. Light header.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>

namespace anvil {

/// Sums and counts of named metrics since the last log row (see file comment).
class UpdateMetrics {
 public:
  /// Adds one value of metric `name`.
  void add(const std::string& name, double v) {
    auto& m = sums_[name];
    m.first += v;
    m.second += 1;
  }
  /// Adds every `(name, value)` of one update.
  void add(const std::vector<std::pair<std::string, double>>& values) {
    for (const auto& [k, v] : values) add(k, v);
  }
  /// Sum and count of each metric, by name (alphabetical: the columns' order).
  [[nodiscard]] const std::map<std::string, std::pair<double, int>>& sums() const noexcept { return sums_; }
  /// Zeroes every sum, keeping the names (a log row's columns stay).
  void clear_values() {
    for (auto& [name, m] : sums_) m = {0.0, 0};
  }
  /// Makes sure every name in `names` is known (with nothing summed yet), so that ranks
  /// reduce the same list.
  void know(const std::vector<std::string>& names) {
    for (const auto& n : names) sums_.try_emplace(n, 0.0, 0);
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [k, m] : sums_) out.push_back(k);
    return out;
  }

  /// State protocol (core/state.hpp): the sums since the last log row.
  void save(BinaryWriter& w) const {
    w.value(static_cast<std::uint64_t>(sums_.size()));
    for (const auto& [k, m] : sums_) {
      w.string(k);
      w.value(m.first);
      w.value(m.second);
    }
  }
  using Saved = std::map<std::string, std::pair<double, int>>;
  [[nodiscard]] Saved read(BinaryReader& r) const {
    const auto n = r.value<std::uint64_t>("metrics");
    if (n > 10'000) r.fail("metrics", "has an implausible number of entries");
    Saved s;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("metric name");
      const auto sum = r.value<double>("metric sum");
      s[k] = {sum, r.value<int>("metric count")};
    }
    return s;
  }
  void restore(Saved s) { sums_ = std::move(s); }

 private:
  std::map<std::string, std::pair<double, int>> sums_;
};

}  // namespace anvil
