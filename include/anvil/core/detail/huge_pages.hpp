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

/// A `std::allocator` for vectors of bytes or numbers filled in bulk (demonstrations read
/// from a file): blocks of two huge pages or more aligned to a huge page and advised to use
/// huge pages, and elements default-initialised (a resize leaves them unset, the reader
/// writes every one), so a large read takes a few page faults, by the threads that fill it,
/// instead of one per 4 KiB page (at about 10 us a fault on a VM: 0.25 s for 90 MB,
/// measured on this machine class, 0.012 s on huge pages).
template <class T>
struct HugePageAllocator {
  static_assert(std::is_trivially_copyable_v<T>);
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  [[nodiscard]] T* allocate(std::size_t n) {
    const std::size_t bytes = std::max<std::size_t>(n * sizeof(T), 1);
    const std::size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p == nullptr) throw std::bad_alloc();
    advise_huge_pages(p, bytes);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) ::new (static_cast<void*>(p)) U;  // default-initialised: unset
    else ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

/// A fixed-size array of trivially copyable `T`, aligned to a cache line (to a huge page
/// when large, and advised to use huge pages), every element set to `fill`: at once, or
/// (`Lazy`) as `reach` first passes each, front to back, so that the pages of a large table
/// that fills in index order are touched as it fills rather than when it is made.
template <class T>
class HugeArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  struct Lazy {};

  HugeArray() = default;
  HugeArray(std::size_t n, const T& fill) : HugeArray(n, fill, Lazy{}) {
    if (n > 0) reach(n - 1);
  }
  /// `n` elements of which none is set yet: an element at or past `filled()` holds no value
  /// until `reach` passes it.
  HugeArray(std::size_t n, const T& fill, Lazy) : n_(n), fill_(fill) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    const std::size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
    p_ = static_cast<T*>(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    if (p_ == nullptr) throw std::bad_alloc();
    advise_huge_pages(p_, bytes);
  }
  HugeArray(const HugeArray& o) : HugeArray(o.n_, o.fill_, Lazy{}) {
    std::copy(o.p_, o.p_ + o.filled_, p_);
    filled_ = o.filled_;
  }
  HugeArray(HugeArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), filled_(std::exchange(o.filled_, 0)), fill_(o.fill_) {}
  HugeArray& operator=(HugeArray o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(filled_, o.filled_);
    std::swap(fill_, o.fill_);
    return *this;
  }
  ~HugeArray() { std::free(p_); }

  /// Sets every element before and at `i` not set yet to the fill.
  void reach(std::size_t i) noexcept {
    if (i < filled_) return;
    std::fill(p_ + filled_, p_ + i + 1, fill_);
    filled_ = i + 1;
  }
  /// Sets the first `k` elements to the fill and leaves the rest unset (a table about to
  /// be filled again from the front, as from a checkpoint).
  void restart(std::size_t k) noexcept {
    filled_ = 0;
    if (k > 0) reach(k - 1);
  }
  /// How many elements from the front hold a value.
  [[nodiscard]] std::size_t filled() const noexcept { return filled_; }

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
  std::size_t filled_ = 0;
  T fill_{};
};

}  // namespace anvil::detail
