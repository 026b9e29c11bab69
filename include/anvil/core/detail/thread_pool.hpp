#pragma once
/// @file
/// A minimal fork-join pool, for stepping envs and for the independent gradients of an
/// update: `parallel_for` splits [0, n) into one contiguous chunk per thread, the caller
/// runs the first, and the first exception thrown is rethrown in the caller. Between calls
/// workers spin for a few tens of microseconds (a training loop calls again that soon, and
/// waking a sleeping thread costs about as long on a VM), then sleep on a condition
/// variable, so an idle pool takes no CPU from training. Light header.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace anvil::detail {

/// Busy-waits up to 50 microseconds for `ready()`; returns whether it came true. Waking a
/// thread blocked on a condition variable takes tens of microseconds on a VM; a handoff
/// that is about to happen is cheaper to wait for this way.
template <class Pred>
inline bool spin_until(Pred ready) {
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  } while (std::chrono::steady_clock::now() < until);
  return false;
}


class ThreadPool {
 public:
  /// `threads` counts the caller: 1 means no worker threads at all. `on_start` runs first
  /// in each worker (e.g. to give it the caller's OpenMP thread count, which OpenMP keeps
  /// per thread).
  explicit ThreadPool(int threads, std::function<void()> on_start = {})
      : threads_(threads < 1 ? 1 : threads) {
    for (int w = 1; w < threads_; ++w)
      workers_.emplace_back([this, w, on_start] {
        if (on_start) on_start();
        work(w);
      });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  [[nodiscard]] int threads() const noexcept { return threads_; }

  /// Runs `fn(begin, end)` over contiguous chunks covering [0, n) and waits for all.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
    if (threads_ == 1 || n <= 1) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_.store(threads_ - 1);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      auto [b, e] = chunk(0);
      fn(b, e);
    } catch (...) {
      mine = std::current_exception();
    }
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_.load() == 0; });
    fn_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::pair<std::int64_t, std::int64_t> chunk(int w) const {
    const std::int64_t per = n_ / threads_, extra = n_ % threads_;
    const std::int64_t b = w * per + std::min<std::int64_t>(w, extra);
    return {b, b + per + (w < extra ? 1 : 0)};
  }

  void work(int w) {
    std::uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); });
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      auto [b, e] = chunk(w);
      const auto* fn = fn_;
      lock.unlock();
      std::exception_ptr err;
      try {
        if (b < e) (*fn)(b, e);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (pending_.fetch_sub(1) == 1) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t, std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
};

}  // namespace anvil::detail
