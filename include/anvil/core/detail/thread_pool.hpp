#pragma once
/// @file
/// A minimal fork-join pool, for stepping envs and for the independent gradients of an
/// update: `parallel_for` splits [0, n) into one contiguous chunk per thread, the caller
/// runs the first, and the first exception thrown is rethrown in the caller. Between calls
/// workers spin for a few tens of microseconds (a training loop calls again that soon, and
/// waking a sleeping thread costs about as long on a VM), then sleep on a condition
/// variable, so an idle pool takes no CPU from training. `available_cores` counts the cores
/// this process may run on. Light header.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <istream>
#include <sstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace anvil::detail {

/// The whole cores a cgroup CPU quota allows the process whose `/proc/<pid>/cgroup` text
/// is `cgroup` (rounded up; 0: no quota found), read from the cgroup file system mounted at
/// `root`: cgroup v2's `cpu.max` ("max" is none) or v1's `cpu.cfs_quota_us` over
/// `cpu.cfs_period_us` (-1 is none), in the process's own group or, inside a container
/// whose cgroup namespace hides the path, at the root.
inline int cgroup_quota_cores(std::istream& cgroup, const std::string& root) {
  auto cores = [](double quota, double period) {
    return quota > 0 && period > 0 ? static_cast<int>((quota + period - 1) / period) : 0;
  };
  for (std::string line; std::getline(cgroup, line);) {
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {  // v2: "0::/path"
      for (const std::string& dir : {root + path, root}) {
        std::ifstream f(dir + "/cpu.max");
        std::string quota;
        double period = 0, q = 0;
        if (f >> quota >> period) return std::istringstream(quota) >> q ? cores(q, period) : 0;  // "max": none
      }
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {  // v1: "N:cpu,cpuacct:/path"
      for (const std::string& dir : {root + "/cpu,cpuacct" + path, root + "/cpu" + path, root + "/cpu,cpuacct",
                                     root + "/cpu"}) {
        std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
        double quota = 0, period = 0;
        if (q >> quota && p >> period) return cores(quota, period);
      }
    }
  }
  return 0;
}

/// The cores this process may use now: its CPU affinity (taskset, a container's cpuset),
/// capped by a cgroup CPU quota (`docker --cpus`); `std::thread::hardware_concurrency()`
/// where neither is known. At least 1.
inline int count_available_cores() {
  int n = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
  std::ifstream cgroup("/proc/self/cgroup");
  if (const int quota = cgroup_quota_cores(cgroup, "/sys/fs/cgroup"); quota > 0) n = n > 0 ? std::min(n, quota) : quota;
#endif
  return std::max(1, n);
}

/// `count_available_cores()` at its first call. A thread that spins waiting for another on
/// the same core only delays it, so thread counts and spin-waits follow this, not the
/// machine's core count.
inline int available_cores() {
  static const int cores = count_available_cores();
  return cores;
}

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
