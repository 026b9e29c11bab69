#pragma once
/// @file
/// Memory a run may still take, and the check made before a large allocation: storage that
/// cannot fit is refused with an error naming the field that sized it and both figures,
/// instead of the kernel's OOM killer ending the process without a word. Light header.
///
/// Available memory is the smallest of the machine's `MemAvailable` (/proc/meminfo) and
/// the room left under this process's cgroup limit (cgroup v2 `memory.max` less
/// `memory.current`, or v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`), which
/// is what a container or a SLURM job gets.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <anvil/core/error.hpp>

namespace anvil {

/// Bytes a process may still allocate and where the figure comes from.
struct AvailableMemory {
  std::int64_t bytes = INT64_MAX;
  std::string source = "unknown";  ///< e.g. "MemAvailable in /proc/meminfo"
};

namespace detail {
inline std::optional<std::int64_t> read_int_file(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
// This process's cgroup directory under /sys/fs/cgroup (v2: the "0::" line; v1: the memory controller's).
inline std::pair<std::string, bool> own_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v1;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return {"/sys/fs/cgroup" + line.substr(3), true};
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a != std::string::npos && b != std::string::npos) {
      const auto controllers = line.substr(a + 1, b - a - 1);
      if (controllers.find("memory") != std::string::npos) v1 = "/sys/fs/cgroup/memory" + line.substr(b + 1);
    }
  }
  return {v1, false};
}
}  // namespace detail

/// What this process may still allocate (see file comment).
[[nodiscard]] inline AvailableMemory available_memory() {
  AvailableMemory m;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    std::int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        m = {kb * 1024, "MemAvailable in /proc/meminfo"};
        break;
      }
    }
  }
  const auto [dir, v2] = detail::own_cgroup();
  if (!dir.empty()) {
    const auto limit = detail::read_int_file(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    const auto used = detail::read_int_file(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    if (limit && used && *limit < (std::int64_t{1} << 60) && *limit - *used < m.bytes)
      m = {*limit - *used, std::string("the cgroup's limit (") + (v2 ? "memory.max" : "memory.limit_in_bytes") +
                               " less what it uses)"};
  }
  return m;
}

/// `bytes` as "1.5 GiB", "200 MiB", ...
[[nodiscard]] inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

/// Refuses host storage of `bytes` that cannot fit in the memory available now: a
/// ConfigError naming `field` (what sized it, e.g. "buffer.capacity=200000000"), `what`
/// (e.g. "UniformBuffer's storage") and both figures.
inline void check_fits(std::int64_t bytes, const std::string& field, const std::string& what,
                       const AvailableMemory& available = available_memory()) {
  if (bytes <= available.bytes) return;
  throw ConfigError(field + ": " + what + " needs " + human_bytes(static_cast<double>(bytes)) + ", but " +
                    human_bytes(static_cast<double>(available.bytes)) + " is available (" + available.source +
                    "); lower it or free memory");
}

/// Runs `allocate()`; a failed allocation (std::bad_alloc, or a torch allocation error)
/// becomes an Error naming `what` was being allocated and how large it was.
template <class F>
decltype(auto) allocating(const std::string& what, std::int64_t bytes, F&& allocate) {
  try {
    return std::forward<F>(allocate)();
  } catch (const std::bad_alloc&) {
    throw Error("out of memory allocating " + what + " (" + human_bytes(static_cast<double>(bytes)) + ")");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string m = e.what();
    if (m.find("alloc") == std::string::npos && m.find("memory") == std::string::npos) throw;
    throw Error("out of memory allocating " + what + " (" + human_bytes(static_cast<double>(bytes)) +
                "): " + m.substr(0, m.find('\n')));
  }
}

}  // namespace anvil
