#pragma once
/// @file
/// Large arrays that are read at random (replay storage, priority trees) backed by 2 MiB
/// pages where the OS offers them, so a random access costs one cache miss and rarely a
/// TLB miss too: with 4 KiB pages, a 100 MB array spans 25,000 pages, far more than the TLB
/// holds. On Linux with transparent huge pages in "madvise" mode (Debian's default) this
/// needs an madvise(MADV_HUGEPAGE) before the memory is first touched. Light header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace anvil::detail {

inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

/// Starts fetching the cache line at `p` into the second-level cache, for a read soon.
///
/// The random reads of replay storage and priority trees fetch their lines ahead this way
/// rather than into the first-level cache (`__builtin_prefetch(p)`): on the machine class
/// of benchmarks/RESULTS.md, random lines of a 128 MiB array on 2 MiB pages arrive at 4.9
/// ns a line when each is fetched 32 lines ahead into the L2, 7.3 ns into the L1 (whose
/// few miss buffers bound how many are in flight) and 8.9 ns unfetched
/// (benchmarks/random_lines.c). Always inlined: GCC counts a prefetch as no side effect,
/// so a call to a function that only prefetches may be dropped as dead code.
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
inline void prefetch_l2(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 1);
#else
  (void)p;
#endif
}

/// Asks for huge pages over the whole pages inside [p, p + bytes), for regions of at least
/// two huge pages; a no-op elsewhere. Call it before the memory is first written.
inline void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p == nullptr || bytes < 2 * kHugePage) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
  const auto e = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
  if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// A fixed-size array of trivially copyable `T`, aligned to a cache line (to a huge page
/// when large, and advised to use huge pages), every element set to `fill`.
template <class T>
class HugeArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  HugeArray() = default;
  HugeArray(std::size_t n, const T& fill) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    const std::size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
    p_ = static_cast<T*>(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    if (p_ == nullptr) throw std::bad_alloc();
    advise_huge_pages(p_, bytes);
    std::fill(p_, p_ + n, fill);
  }
  HugeArray(const HugeArray& o) : HugeArray(o.n_, T{}) { std::copy(o.begin(), o.end(), p_); }
  HugeArray(HugeArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HugeArray& operator=(HugeArray o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~HugeArray() { std::free(p_); }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] const T* data() const noexcept { return p_; }
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }
  T* begin() noexcept { return p_; }
  T* end() noexcept { return p_ + n_; }
  const T* begin() const noexcept { return p_; }
  const T* end() const noexcept { return p_ + n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace anvil::detail
