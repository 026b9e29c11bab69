#pragma once
/// @file
/// The buffers anvil writes files through that the C library does not know (C++ streams,
/// rows held back), registered while they are open, so that `anvil::exit_fast` can flush
/// them before it ends the process without the libraries' teardown. Light header.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace anvil::detail {

/// Every registered flush (see file comment). One per process; thread-safe.
class FlushRegistry {
 public:
  static FlushRegistry& instance() {
    static FlushRegistry* r = new FlushRegistry;  // never destroyed: usable until the very end
    return *r;
  }
  std::uint64_t add(std::function<void()> flush) {
    std::lock_guard lock(mu_);
    flushes_.emplace(++next_, std::move(flush));
    return next_;
  }
  void remove(std::uint64_t id) {
    std::lock_guard lock(mu_);
    flushes_.erase(id);
  }
  /// Runs every registered flush, oldest first; one that throws does not stop the others.
  void flush_all() noexcept {
    std::lock_guard lock(mu_);
    for (auto& [id, f] : flushes_) {
      try {
        f();
      } catch (...) {
      }
    }
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::function<void()>> flushes_;
  std::uint64_t next_ = 0;
};

/// Registers `flush` for its own life (held by an object that does not move, e.g. a Run).
class FlushAtExit {
 public:
  explicit FlushAtExit(std::function<void()> flush) : id_(FlushRegistry::instance().add(std::move(flush))) {}
  FlushAtExit(const FlushAtExit&) = delete;
  FlushAtExit& operator=(const FlushAtExit&) = delete;
  ~FlushAtExit() { FlushRegistry::instance().remove(id_); }

 private:
  std::uint64_t id_;
};

}  // namespace anvil::detail
