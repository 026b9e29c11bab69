#pragma once
/// @file
/// `PriorityTree`: the sum tree and min tree behind prioritized replay, built for batches.
///
/// A binary sum tree over a million leaves costs about 20 dependent cache misses per
/// sample. Here every node has 8 children that fill one 64-byte cache line (doubles), so a
/// descent is 7 levels deep and the top levels stay in cache; and a batch descends level
/// by level, all of its samples at once, prefetching each next line, so the misses of one
/// batch overlap instead of queueing. Sums are recomputed from the 8 children after each
/// change, never adjusted by differences, so they do not drift over millions of updates.
/// Light header.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include <anvil/core/detail/huge_pages.hpp>

namespace anvil::detail {

/// Sums and minimums over `capacity` non-negative priorities (see file comment).
class PriorityTree {
 public:
  static constexpr std::int64_t kFanout = 8;  ///< children per node: one cache line of doubles

  PriorityTree() = default;
  explicit PriorityTree(std::int64_t capacity) : capacity_(capacity) {
    std::int64_t n = capacity;
    do {
      n = (n + kFanout - 1) / kFanout * kFanout;  // whole cache lines per level
      width_.push_back(n);
      n /= kFanout;
    } while (width_.back() > kFanout);
    width_.push_back(1);  // the root
    for (std::int64_t w : width_) {  // each level starts on a cache line (and huge pages)
      sum_.emplace_back(static_cast<std::size_t>(w), 0.0);
      // The min tree shares the sum tree's leaves: its level 0 stays empty.
      min_.emplace_back(min_.empty() ? 0 : static_cast<std::size_t>(w), std::numeric_limits<double>::infinity());
    }
  }

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] double total() const noexcept { return line(sum_, sum_.size() - 1)[0]; }
  /// The smallest positive priority (+inf when there is none): the one that gives the
  /// largest importance weight among transitions that can be sampled.
  [[nodiscard]] double min() const noexcept { return line(min_, min_.size() - 1)[0]; }
  [[nodiscard]] double get(std::int64_t i) const noexcept { return line(sum_, 0)[i]; }

  /// Sets leaf `idx[k]` to `value[k]` for every k, then recomputes the ancestors once per
  /// touched node. Indices must be in [0, capacity) and values finite and >= 0 (the caller
  /// checks: the buffer names the offending entry).
  void set(std::span<const std::int64_t> idx, std::span<const double> value) {
    double* leaf = line(sum_, 0);
    touched_.assign(idx.begin(), idx.end());
    for (std::size_t k = 0; k < idx.size(); ++k) leaf[idx[k]] = value[k];
    // Sorted, it stays sorted as it is divided below. Batches from `find` come sorted
    // already (stratified masses ascend), so the sort is usually skipped.
    if (!std::is_sorted(touched_.begin(), touched_.end())) std::sort(touched_.begin(), touched_.end());
    for (std::size_t level = 1; level < sum_.size(); ++level) {
      for (auto& t : touched_) t /= kFanout;
      touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
      for (auto t : touched_) {
        const double* s = line(sum_, level - 1) + t * kFanout;
        double acc = 0, lo = std::numeric_limits<double>::infinity();
        if (level == 1) {  // leaves: empty (zero) ones do not count towards the minimum
          for (std::int64_t c = 0; c < kFanout; ++c) {
            acc += s[c];
            lo = std::min(lo, s[c] > 0.0 ? s[c] : std::numeric_limits<double>::infinity());
          }
        } else {
          const double* m = line(min_, level - 1) + t * kFanout;
          for (std::int64_t c = 0; c < kFanout; ++c) {
            acc += s[c];
            lo = std::min(lo, m[c]);
          }
        }
        line(sum_, level)[t] = acc;
        line(min_, level)[t] = lo;
      }
    }
  }

  /// For each `mass[k]` in [0, total()), the leaf whose prefix-sum interval holds it, into
  /// `out[k]`. All the batch's descents advance one level at a time (see file comment).
  void find(std::span<const double> mass, std::span<std::int64_t> out) {
    const std::size_t n = mass.size();
    rest_.assign(mass.begin(), mass.end());
    std::fill(out.begin(), out.end(), 0);
    std::size_t top = sum_.size() - 1;  // the level the descents start from
    // Ascending masses (stratified sampling gives them) pass the top levels in one merge:
    // a walk along the deepest level no wider than 4 nodes per sample, keeping a running
    // prefix sum, costs less than that many levels of descents.
    if (n >= 16 && std::is_sorted(mass.begin(), mass.end())) {
      std::size_t level = top;
      while (level > 1 && width_[level - 1] <= static_cast<std::int64_t>(4 * n)) --level;
      if (level < top) {
        top = level;
        const double* s = line(sum_, level);
        const std::int64_t w = width_[level];
        std::int64_t j = 0;
        double before = 0;  // sum of the nodes left of j
        for (std::size_t k = 0; k < n; ++k) {
          const double r = mass[k];
          while (j < w - 1 && before + s[j] <= r) before += s[j++];
          while (j > 0 && s[j] <= 0.0) before -= s[--j];  // round-off past the last non-empty node
          rest_[k] = std::max(r - before, 0.0);
          out[k] = j;
          __builtin_prefetch(line(sum_, level - 1) + j * kFanout);
        }
      }
    }
    for (std::size_t level = top; level-- > 0;) {
      const double* s = line(sum_, level);
      for (std::size_t k = 0; k < n; ++k) {
        // Branch-free: the child is the number of prefix sums r has reached (empty children
        // have the same prefix as the one before them, so they are passed over). Without
        // branches to mispredict, the CPU overlaps the descents of many samples.
        const double* child = s + out[k] * kFanout;
        const double r = rest_[k];
        // Prefix sums by a 3-deep tree of additions rather than a chain of 7.
        double prefix[kFanout];
        const double s01 = child[0] + child[1], s23 = child[2] + child[3], s45 = child[4] + child[5];
        prefix[0] = child[0];
        prefix[1] = s01;
        prefix[2] = s01 + child[2];
        prefix[3] = s01 + s23;
        prefix[4] = prefix[3] + child[4];
        prefix[5] = prefix[3] + s45;
        prefix[6] = prefix[5] + child[6];
        std::int64_t c = 0;
        for (std::int64_t j = 0; j < kFanout - 1; ++j) c += r >= prefix[j];
        // round-off can leave r past the last non-empty child: step back to it (rare)
        while (c > 0 && child[c] <= 0.0) --c;
        rest_[k] = std::max(r - (c > 0 ? prefix[c - 1] : 0.0), 0.0);
        out[k] = out[k] * kFanout + c;
        if (level > 0) __builtin_prefetch(line(sum_, level - 1) + out[k] * kFanout);
      }
    }
  }

  /// Bytes held by the two trees.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = 0;
    for (const auto* tree : {&sum_, &min_})
      for (const auto& l : *tree) b += static_cast<std::int64_t>(l.size() * sizeof(double));
    return b;
  }

 private:
  // Level `l` of `tree` (64-byte aligned).
  static double* line(std::vector<HugeArray<double>>& tree, std::size_t l) noexcept { return tree[l].data(); }
  static const double* line(const std::vector<HugeArray<double>>& tree, std::size_t l) noexcept {
    return tree[l].data();
  }

  std::int64_t capacity_ = 0;
  std::vector<std::int64_t> width_;           // nodes per level, leaves first
  std::vector<HugeArray<double>> sum_, min_;  // level 0 = leaves; last = root
  std::vector<std::int64_t> touched_;
  std::vector<double> rest_;
};

}  // namespace anvil::detail
