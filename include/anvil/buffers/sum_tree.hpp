#pragma once
/// @file
/// `PriorityTree`: the sum tree and min tree behind prioritized replay, built for batches.
///
/// A binary sum tree over a million leaves costs about 20 dependent cache misses per
/// sample. Here every node has 8 children that fill one 64-byte cache line (doubles), so a
/// descent is 7 levels deep and the top levels stay in cache; and a batch descends level
/// by level, all of its samples at once, prefetching each next line into the L2
/// (`prefetch_l2`), so the misses of one batch overlap instead of queueing. Sums are
/// recomputed from the 8 children after each change, never adjusted by differences, so
/// they do not drift over millions of updates.
///
/// With the misses overlapped, what is left is arithmetic on lines: a prefix sum of 8
/// children per sample and level in `find`, a sum and a minimum of 8 children per touched
/// node in `set`. On x86-64 CPUs with AVX-512 one line is one register, and these run as a
/// few shuffles and masked adds instead of some 40 scalar instructions. The project builds
/// for baseline x86-64, so the AVX-512 kernels carry their own target attribute and are
/// chosen once at run time (`__builtin_cpu_supports`); elsewhere portable scalar kernels
/// run. Both do the same floating-point operations in the same order (the order of the
/// vector shuffles, written out in `sum8` and `prefix8`), so they pick the same leaves and
/// store the same sums, bit for bit; the tests hold them to that. The rest is bookkeeping
/// kept small: ascending masses pass the top levels by counting, against running prefix
/// sums, how many nodes each has passed (compares only, 8 at a time, in 4 interleaved runs
/// so that the walks overlap); `set` drops repeated parents as they come (sorted children
/// give sorted parents) and sweeps whole levels once a level has no more nodes than the
/// batch touched. Light header.

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
#include <anvil/core/simd.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANVIL_SUM_TREE_X86 1
#include <immintrin.h>
#endif

namespace anvil::detail {

/// The per-line arithmetic of `PriorityTree`, one set of kernels per instruction set.
namespace sum_tree {

inline constexpr std::int64_t kFanout = 8;
inline constexpr double kInf = std::numeric_limits<double>::infinity();
/// How many touched nodes ahead `set` fetches the lines it will write.
inline constexpr std::size_t kWriteAhead = 16;

/// The sum of one line, pairwise: the order in which the vector kernels add (halves of
/// halves). The prefix sums of `prefix8` end in this same value, so the sum a parent stores
/// and the last prefix its children give in `find` agree exactly.
inline double sum8(const double* x) noexcept {
  return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

/// Inclusive prefix sums of one line in three rounds of additions (pairs, then pairs of
/// pairs, then halves), the order of the vector kernel's three masked adds.
inline void prefix8(const double* x, double* p) noexcept {
  const double s01 = x[0] + x[1], s23 = x[2] + x[3], s45 = x[4] + x[5], s67 = x[6] + x[7];
  p[0] = x[0];
  p[1] = s01;
  p[2] = x[2] + s01;
  p[3] = s23 + s01;
  const double s456 = x[6] + s45, s4567 = s67 + s45;
  p[4] = x[4] + p[3];
  p[5] = s45 + p[3];
  p[6] = s456 + p[3];
  p[7] = s4567 + p[3];
}

/// One level of descents: sample k sits at node `node[k]` of the level above `s` with
/// `rest[k]` of mass left; it moves to the child whose prefix interval holds the rest.
/// `next` (the level below `s`, or null) gets the chosen lines prefetched.
using DescendFn = void (*)(const double* s, const double* next, std::size_t n, double* rest,
                           std::int64_t* node);
/// Recomputes the parents of the sorted nodes `list[0, n)` of the level below (sums from
/// `s`, minimums from `m`, or from the positive values of `s` at the leaves, where `m` is
/// null) into `s_up` and `m_up`; leaves the distinct parents, sorted, in `list` and returns
/// how many.
using RecomputeListFn = std::size_t (*)(const double* s, const double* m, std::int64_t* list,
                                        std::size_t n, double* s_up, double* m_up);
/// Recomputes every node in [0, nodes) of a level (see `RecomputeListFn`).
using RecomputeAllFn = void (*)(const double* s, const double* m, std::int64_t nodes,
                                double* s_up, double* m_up);
/// Running prefix sums over the `lines` lines of `s` into `p`: line i's `prefix8` plus the
/// sum of the lines before it (which is the previous line's last prefix).
using LevelPrefixFn = void (*)(const double* s, std::int64_t lines, double* p);

/// For each of the ascending `mass[0, n)`, how many of the ascending `before[0, last)` it has
/// reached (is >= to), into `count`. `before` holds at least 16 entries of +inf from `last`
/// on. Counting compares and never adds, so every kernel gives the same counts.
using MergeFn = void (*)(const double* before, std::int64_t last, const double* mass, std::size_t n,
                         std::int64_t* count);

struct Kernels {
  DescendFn descend;
  RecomputeListFn recompute_list[2];  ///< [0]: above the leaves, [1]: leaves (min of positive values)
  RecomputeAllFn recompute_all[2];
  LevelPrefixFn level_prefix;
  MergeFn merge;
};

// ---- portable scalar kernels -------------------------------------------------------------

inline void descend_scalar(const double* s, const double* next, std::size_t n, double* rest,
                           std::int64_t* node) {
  for (std::size_t k = 0; k < n; ++k) {
    // Branch-free: the child is the number of prefix sums r has reached (empty children
    // have the same prefix as the one before them, so they are passed over). Without
    // branches to mispredict, the CPU overlaps the descents of many samples.
    const double* child = s + node[k] * kFanout;
    const double r = rest[k];
    double p[kFanout];
    prefix8(child, p);
    std::int64_t c = 0;
    for (std::int64_t j = 0; j < kFanout - 1; ++j) c += r >= p[j];
    // round-off can leave r past the last non-empty child: step back to it (rare)
    while (c > 0 && child[c] <= 0.0) --c;
    const double d = r - (c > 0 ? p[c - 1] : 0.0);
    rest[k] = d > 0.0 ? d : 0.0;  // (not std::max: +0 for -0, as the vector kernel's maxsd)
    node[k] = node[k] * kFanout + c;
    if (next != nullptr) prefetch_l2(next + node[k] * kFanout);
  }
}

template <bool kLeaves>
inline void node_scalar(const double* s, const double* m, std::int64_t p, double* s_up, double* m_up) {
  const double* x = s + p * kFanout;
  double lo = kInf;
  for (std::int64_t c = 0; c < kFanout; ++c) {
    // at the leaves, empty (zero) ones do not count towards the minimum
    if constexpr (kLeaves) lo = std::min(lo, x[c] > 0.0 ? x[c] : kInf);
    else lo = std::min(lo, m[p * kFanout + c]);
  }
  s_up[p] = sum8(x);
  m_up[p] = lo;
}

/// Recomputes the parents of a sorted list of changed nodes (indices at the level below) with
/// the node kernel `Node`, each parent once; leaves the parents in `list` and returns how
/// many. Always inlined, so it takes each kernel's own target (and `Node` inlines into it).
template <auto Node>
[[gnu::always_inline]] inline std::size_t recompute_parents(const double* s, const double* m, std::int64_t* list,
                                                            std::size_t n, double* s_up, double* m_up) {
  std::size_t out = 0;
  std::int64_t last = -1;
  for (std::size_t i = 0; i < n; ++i) {
    // the minimums above a batch's leaves are not on `find`'s path: fetch them ahead
    if (i + kWriteAhead < n) prefetch_l2(m_up + (list[i + kWriteAhead] >> 3));
    const std::int64_t p = list[i] >> 3;  // indices are >= 0
    if (p == last) continue;
    Node(s, m, p, s_up, m_up);
    list[out++] = last = p;
  }
  return out;
}

template <bool kLeaves>
inline std::size_t recompute_list_scalar(const double* s, const double* m, std::int64_t* list, std::size_t n,
                                         double* s_up, double* m_up) {
  return recompute_parents<&node_scalar<kLeaves>>(s, m, list, n, s_up, m_up);
}

template <bool kLeaves>
inline void recompute_all_scalar(const double* s, const double* m, std::int64_t nodes, double* s_up,
                                 double* m_up) {
  for (std::int64_t p = 0; p < nodes; ++p) node_scalar<kLeaves>(s, m, p, s_up, m_up);
}

inline void level_prefix_scalar(const double* s, std::int64_t lines, double* p) {
  double carry = 0;
  for (std::int64_t i = 0; i < lines; ++i) {
    double q[kFanout];
    prefix8(s + i * kFanout, q);
    for (std::int64_t j = 0; j < kFanout; ++j) p[i * kFanout + j] = carry + q[j];
    carry = p[i * kFanout + kFanout - 1];
  }
}

inline void merge_scalar(const double* before, std::int64_t last, const double* mass, std::size_t n,
                         std::int64_t* count) {
  std::int64_t j = 0;
  for (std::size_t k = 0; k < n; ++k) {
    while (j < last && before[j] <= mass[k]) ++j;
    count[k] = j;
  }
}

inline constexpr Kernels kScalar{&descend_scalar,
                                 {&recompute_list_scalar<false>, &recompute_list_scalar<true>},
                                 {&recompute_all_scalar<false>, &recompute_all_scalar<true>},
                                 &level_prefix_scalar, &merge_scalar};

// ---- AVX-512 kernels ----------------------------------------------------------------------

#if defined(ANVIL_SUM_TREE_X86)
#define ANVIL_SUM_TREE_AVX512 __attribute__((target("avx512f,popcnt")))
// GCC 12 flags the undefined pass-through operand inside its own AVX-512 intrinsics
// (GCC bug 105593, fixed in 13): not ours to fix, and noise in every file that includes this.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// `prefix8` of the line in `x`: pairs (lanes 1, 3, 5, 7 add their left neighbour), pairs
/// of pairs (lanes 2, 3 and 6, 7 add lanes 1 and 5), halves (lanes 4-7 add lane 3).
ANVIL_SUM_TREE_AVX512 inline __m512d prefix8_avx512(__m512d x) noexcept {
  x = _mm512_mask_add_pd(x, 0xAA, x, _mm512_movedup_pd(x));
  x = _mm512_mask_add_pd(x, 0xCC, x, _mm512_permutex_pd(x, 0x55));
  return _mm512_mask_add_pd(x, 0xF0, x, _mm512_permutexvar_pd(_mm512_set1_epi64(3), x));
}

/// `sum8` of the line in every lane: neighbours, then pairs, then halves (addition
/// commutes exactly, so each lane holds the same pairwise sum).
ANVIL_SUM_TREE_AVX512 inline __m512d sum8_avx512(__m512d x) noexcept {
  x = _mm512_add_pd(x, _mm512_permute_pd(x, 0x55));
  x = _mm512_add_pd(x, _mm512_permutex_pd(x, 0x4E));
  return _mm512_add_pd(x, _mm512_shuffle_f64x2(x, x, 0x4E));
}

ANVIL_SUM_TREE_AVX512 inline __m512d min8_avx512(__m512d x) noexcept {
  x = _mm512_min_pd(x, _mm512_permute_pd(x, 0x55));
  x = _mm512_min_pd(x, _mm512_permutex_pd(x, 0x4E));
  return _mm512_min_pd(x, _mm512_shuffle_f64x2(x, x, 0x4E));
}

template <bool kPrefetch>
ANVIL_SUM_TREE_AVX512 inline void descend_avx512_impl(const double* s, const double* next, std::size_t n,
                                                       double* rest, std::int64_t* node) {
  const __m512i zero = _mm512_setzero_si512();
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t at = node[k] * kFanout;
    const __m512d x = _mm512_load_pd(s + at);
    const double r = rest[k];
    // the prefix before each child: (0, p0, ..., p6)
    const __m512d before = _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(prefix8_avx512(x)), zero, 7));
    // The prefix sums ascend (the children are >= 0), so the children r has reached are the
    // low bits of this mask and the child is the highest; only non-empty ones count, which
    // steps back over trailing empty children (or to child 0).
    const __mmask8 full = _mm512_cmp_pd_mask(x, _mm512_castsi512_pd(zero), _CMP_GT_OQ);
    const unsigned reach = _mm512_mask_cmp_pd_mask(full, before, _mm512_set1_pd(r), _CMP_LE_OQ);
    const auto c = static_cast<unsigned>(31 ^ __builtin_clz(reach | 1u));
    const double d = r - _mm512_cvtsd_f64(_mm512_permutexvar_pd(_mm512_set1_epi64(c), before));
    rest[k] = d > 0.0 ? d : 0.0;
    node[k] = at + c;
    if constexpr (kPrefetch) prefetch_l2(next + node[k] * kFanout);
  }
}

ANVIL_SUM_TREE_AVX512 inline void descend_avx512(const double* s, const double* next, std::size_t n,
                                                  double* rest, std::int64_t* node) {
  if (next != nullptr) descend_avx512_impl<true>(s, next, n, rest, node);
  else descend_avx512_impl<false>(s, next, n, rest, node);
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline void node_avx512(const double* s, const double* m, std::int64_t p, double* s_up,
                                              double* m_up) noexcept {
  const __m512d x = _mm512_load_pd(s + p * kFanout);
  __m512d lo;
  if constexpr (kLeaves) {
    lo = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GT_OQ), _mm512_set1_pd(kInf), x);
  } else {
    lo = _mm512_load_pd(m + p * kFanout);
  }
  s_up[p] = _mm512_cvtsd_f64(sum8_avx512(x));
  m_up[p] = _mm512_cvtsd_f64(min8_avx512(lo));
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline std::size_t recompute_list_avx512(const double* s, const double* m,
                                                               std::int64_t* list, std::size_t n,
                                                               double* s_up, double* m_up) {
  return recompute_parents<&node_avx512<kLeaves>>(s, m, list, n, s_up, m_up);
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline void recompute_all_avx512(const double* s, const double* m, std::int64_t nodes,
                                                       double* s_up, double* m_up) {
  for (std::int64_t p = 0; p < nodes; ++p) node_avx512<kLeaves>(s, m, p, s_up, m_up);
}

ANVIL_SUM_TREE_AVX512 inline void level_prefix_avx512(const double* s, std::int64_t lines, double* p) {
  __m512d carry = _mm512_setzero_pd();
  for (std::int64_t i = 0; i < lines; ++i) {
    const __m512d q = _mm512_add_pd(carry, prefix8_avx512(_mm512_load_pd(s + i * kFanout)));
    _mm512_storeu_pd(p + i * kFanout, q);
    carry = _mm512_permutexvar_pd(_mm512_set1_epi64(7), q);
  }
}

/// `merge_scalar`, 8 entries a compare, and the samples in 4 runs advanced in turn: one
/// walk is a chain of dependent loads and compares, and 4 of them overlap.
ANVIL_SUM_TREE_AVX512 inline void merge_avx512(const double* before, std::int64_t last, const double* mass,
                                                std::size_t n, std::int64_t* count) {
  constexpr std::size_t kRuns = 4;
  std::size_t start[kRuns + 1];
  std::int64_t j[kRuns];
  for (std::size_t run = 0; run <= kRuns; ++run) start[run] = run * n / kRuns;
  for (std::size_t run = 0; run < kRuns; ++run)
    j[run] = start[run] < n ? std::upper_bound(before, before + last, mass[start[run]]) - before : 0;
  const std::size_t len = start[1] - start[0] + 1;  // the runs differ by at most one
  for (std::size_t i = 0; i < len; ++i) {
    for (std::size_t run = 0; run < kRuns; ++run) {
      const std::size_t k = start[run] + i;
      if (k >= start[run + 1]) continue;
      const __m512d r = _mm512_set1_pd(mass[k]);
      std::int64_t at = j[run];
      unsigned step;
      do {  // the entries ascend: those reached are the low bits of the mask
        step = static_cast<unsigned>(__builtin_popcount(_mm512_cmp_pd_mask(_mm512_loadu_pd(before + at), r, _CMP_LE_OQ)));
        at += step;
      } while (step == 8 && at < last);
      count[k] = j[run] = std::min(at, last);
    }
  }
}

inline constexpr Kernels kAvx512{&descend_avx512,
                                 {&recompute_list_avx512<false>, &recompute_list_avx512<true>},
                                 {&recompute_all_avx512<false>, &recompute_all_avx512<true>},
                                 &level_prefix_avx512, &merge_avx512};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef ANVIL_SUM_TREE_AVX512
#endif

/// Set, trees built afterwards use the scalar kernels (the tests compare the two).
inline bool force_scalar = false;

/// The kernels for this CPU: checked once, at the first tree built.
inline const Kernels& kernels() {
#if defined(ANVIL_SUM_TREE_X86)
  if (simd::avx512() && !force_scalar) return kAvx512;
#endif
  return kScalar;
}

}  // namespace sum_tree

/// Sums and minimums over `capacity` non-negative priorities (see file comment).
class PriorityTree {
 public:
  static constexpr std::int64_t kFanout = sum_tree::kFanout;  ///< children per node: one cache line of doubles

  PriorityTree() = default;
  explicit PriorityTree(std::int64_t capacity)
      : capacity_(capacity), kernels_(&sum_tree::kernels()), width_(level_widths(capacity)) {
    for (std::int64_t w : width_) {  // each level starts on a cache line (and huge pages)
      sum_.emplace_back(static_cast<std::size_t>(w), 0.0);
      // The min tree shares the sum tree's leaves: its level 0 stays empty.
      min_.emplace_back(min_.empty() ? 0 : static_cast<std::size_t>(w), sum_tree::kInf);
    }
  }

  /// The bytes a tree of `capacity` leaves holds (sums and minimums), before it is built.
  [[nodiscard]] static std::int64_t bytes_for(std::int64_t capacity) {
    std::int64_t n = 0;
    const auto w = level_widths(capacity);
    for (std::size_t l = 0; l < w.size(); ++l) n += w[l] * (l == 0 ? 1 : 2);
    return n * static_cast<std::int64_t>(sizeof(double));
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
    // Sorted, a level's touched nodes give their parents sorted too, and repeats side by
    // side, dropped as they come. Batches from `find` come sorted already (stratified masses
    // ascend), so the sort is usually skipped.
    if (!std::is_sorted(touched_.begin(), touched_.end())) std::sort(touched_.begin(), touched_.end());
    std::size_t n = touched_.size();
    for (std::size_t level = 1; level < sum_.size(); ++level) {
      const double* s = line(sum_, level - 1);
      const double* m = level > 1 ? line(min_, level - 1) : nullptr;
      const std::int64_t nodes = width_[level - 1] / kFanout;  // the level's nodes that have children
      // With at least as many touched children as the level has nodes (the top levels, or
      // large batches), a sweep over all of them costs less than the list, here and above.
      if (static_cast<std::int64_t>(n) >= nodes) {
        for (; level < sum_.size(); ++level) {
          kernels_->recompute_all[level == 1](line(sum_, level - 1), level > 1 ? line(min_, level - 1) : nullptr,
                                              width_[level - 1] / kFanout, line(sum_, level), line(min_, level));
        }
        break;
      }
      n = kernels_->recompute_list[level == 1](s, m, touched_.data(), n, line(sum_, level), line(min_, level));
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
    // a walk along the deepest level no wider than 4 nodes per sample, against its running
    // prefix sums, costs less than that many levels of descents.
    if (n >= 16 && std::is_sorted(mass.begin(), mass.end())) {
      std::size_t level = top;
      while (level > 1 && width_[level - 1] <= static_cast<std::int64_t>(4 * n)) --level;
      if (level < top) {
        top = level;
        const double* s = line(sum_, level);
        const std::int64_t w = width_[level];  // whole lines: only the root level is not
        prefix_.resize(static_cast<std::size_t>(w) + 16);
        kernels_->level_prefix(s, w / kFanout, prefix_.data());
        // the last node is never passed (round-off may leave masses at or past the total)
        std::fill(prefix_.begin() + (w - 1), prefix_.end(), sum_tree::kInf);
        const double* before = prefix_.data();  // before[j]: the sum of nodes 0..j
        kernels_->merge(before, w - 1, mass.data(), n, out.data());
        const double* next = line(sum_, level - 1);
        for (std::size_t k = 0; k < n; ++k) {
          std::int64_t c = out[k];
          while (c > 0 && s[c] <= 0.0) --c;  // round-off past the last non-empty node
          rest_[k] = std::max(mass[k] - (c > 0 ? before[c - 1] : 0.0), 0.0);
          out[k] = c;
          prefetch_l2(next + c * kFanout);
        }
      }
    }
    for (std::size_t level = top; level-- > 0;)
      kernels_->descend(line(sum_, level), level > 0 ? line(sum_, level - 1) : nullptr, n, rest_.data(), out.data());
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
  // Each level's width, leaves first: whole cache lines per level, down to the root.
  static std::vector<std::int64_t> level_widths(std::int64_t capacity) {
    std::vector<std::int64_t> w;
    std::int64_t n = capacity;
    do {
      n = (n + kFanout - 1) / kFanout * kFanout;
      w.push_back(n);
      n /= kFanout;
    } while (w.back() > kFanout);
    w.push_back(1);  // the root
    return w;
  }
  static double* line(std::vector<HugeArray<double>>& tree, std::size_t l) noexcept { return tree[l].data(); }
  static const double* line(const std::vector<HugeArray<double>>& tree, std::size_t l) noexcept {
    return tree[l].data();
  }

  std::int64_t capacity_ = 0;
  const sum_tree::Kernels* kernels_ = &sum_tree::kScalar;
  std::vector<std::int64_t> width_;           // nodes per level, leaves first
  std::vector<HugeArray<double>> sum_, min_;  // level 0 = leaves; last = root
  std::vector<std::int64_t> touched_;
  std::vector<double> rest_, prefix_;
};

}  // namespace anvil::detail
