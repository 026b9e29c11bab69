#pragma once
/// @file
/// Memory a run may still take, and the check made before a large allocation: storage that
/// cannot fit is refused with an error naming the field that sized it and both figures,
/// instead of the kernel's OOM killer ending the process without a word. Light header.
///
/// Available memory is the smallest of the machine's `MemAvailable` (/proc/meminfo) and the
/// room left under every cgroup memory limit above this process, which is what a container
/// or a SLURM job gets:
/// - cgroup v2: `memory.max` less `memory.current`, on the process's own cgroup and on each
///   parent up to the hierarchy's root (SLURM and systemd often set the limit on a parent
///   while the leaf says `max`);
/// - cgroup v1: `memory.limit_in_bytes` less `memory.usage_in_bytes`, walked up the same way.
/// Both are read where both exist: systemd's hybrid layout mounts an empty v2 hierarchy (no
/// memory controller) beside the v1 memory controller that holds the limit. Where each
/// hierarchy is mounted comes from /proc/self/mountinfo (the usual places under
/// /sys/fs/cgroup where it cannot be read).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil {

/// Bytes a process may still allocate and where the figure comes from.
struct AvailableMemory {
  std::int64_t bytes = INT64_MAX;
  std::string source = "unknown";  ///< e.g. "MemAvailable in /proc/meminfo"
};

namespace detail {
inline std::optional<std::int64_t> read_int_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// A cgroup hierarchy this process is in: where it is mounted and the process's path in it.
struct CgroupPlace {
  std::filesystem::path mount;  ///< the hierarchy's mount point (under the root read from)
  std::string path;             ///< this process's cgroup, relative to the mount
};

/// Undoes mountinfo's octal escapes ("\040" for a space).
inline std::string unescape_mountinfo(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto octal = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

/// The process's memory-limiting cgroups under `root` (which stands for "/"): the v2
/// hierarchy (if the process is in one) and the v1 memory controller's (if mounted).
struct OwnCgroups {
  std::optional<CgroupPlace> v2, v1_memory;
};

inline OwnCgroups own_cgroups(const std::filesystem::path& root) {
  std::optional<std::string> v2_path, v1_path;
  {
    std::ifstream in(root / "proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const auto controllers = line.substr(a + 1, b - a - 1);
      const auto path = line.substr(b + 1);
      if (line.compare(0, a, "0") == 0 && controllers.empty()) v2_path = path;
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');)
        if (c == "memory") v1_path = path;
    }
  }
  // Mount points and mounted roots of the two hierarchies (fields: id parent dev root
  // mountpoint options [optional...] - fstype source superoptions).
  struct Mount {
    std::string root, point;
  };
  std::optional<Mount> v2_mount, v1_mount;
  {
    std::ifstream in(root / "proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::vector<std::string> w;
      for (std::string x; f >> x;) w.push_back(x);
      const auto dash = std::find(w.begin(), w.end(), "-");
      if (w.size() < 5 || dash == w.end() || w.end() - dash < 2) continue;
      const std::string& fstype = *(dash + 1);
      const Mount m{unescape_mountinfo(w[3]), unescape_mountinfo(w[4])};
      if (fstype == "cgroup2" && !v2_mount) v2_mount = m;
      if (fstype == "cgroup" && !v1_mount && dash + 3 < w.end()) {
        std::stringstream opts(*(dash + 3));
        for (std::string o; std::getline(opts, o, ',');)
          if (o == "memory") v1_mount = m;
      }
    }
  }
  const auto place = [&](const std::string& path, const std::optional<Mount>& m,
                         const std::filesystem::path& usual) -> CgroupPlace {
    if (!m) return {usual, path};
    // Without a cgroup namespace a container may mount its own cgroup as the hierarchy's
    // root: /proc/self/cgroup then names the path the mount starts at.
    std::string rel = path;
    if (m->root != "/" && rel.compare(0, m->root.size(), m->root) == 0) rel = rel.substr(m->root.size());
    return {root / std::filesystem::path(m->point).relative_path(), rel};
  };
  OwnCgroups out;
  if (v2_path) {
    const auto usual = std::filesystem::exists(root / "sys/fs/cgroup/cgroup.controllers") ? root / "sys/fs/cgroup"
                                                                                          : root / "sys/fs/cgroup/unified";
    out.v2 = place(*v2_path, v2_mount, usual);
  }
  if (v1_path) out.v1_memory = place(*v1_path, v1_mount, root / "sys/fs/cgroup/memory");
  return out;
}

/// The least room under any limit from `place`'s cgroup up to its hierarchy's root, or
/// nothing where no level sets one. `limit_file` and `usage_file` are the hierarchy's names.
inline std::optional<AvailableMemory> cgroup_room(const CgroupPlace& place, const char* limit_file,
                                                  const char* usage_file) {
  // Levels from the hierarchy's root down to the process's cgroup; a path that is not
  // there (a container shown the host's path) leaves only the mount's own level.
  std::vector<std::filesystem::path> levels{place.mount};
  for (const auto& part : std::filesystem::path(place.path).lexically_normal().relative_path())
    if (!part.empty() && part != "." && part != "..") levels.push_back(levels.back() / part);
  std::error_code ec;
  if (!std::filesystem::is_directory(levels.back(), ec)) levels.resize(1);
  std::optional<AvailableMemory> best;
  for (const auto& dir : levels) {
    const auto limit = read_int_file(dir / limit_file);
    const auto used = read_int_file(dir / usage_file);
    // v1 says "no limit" with a figure near 2^63; v2 says "max".
    if (limit && used && *limit < (std::int64_t{1} << 60)) {
      const std::int64_t room = std::max<std::int64_t>(0, *limit - *used);
      if (!best || room < best->bytes)
        best = AvailableMemory{room, "the cgroup limit " + (dir / limit_file).string() + " less " + usage_file};
    }
  }
  return best;
}
}  // namespace detail

/// What this process may still allocate (see file comment). `root` stands for "/": the
/// files read are `root`/proc/meminfo, `root`/proc/self/cgroup, `root`/proc/self/mountinfo
/// and the cgroup trees they name (tests point it at a made-up tree).
[[nodiscard]] inline AvailableMemory available_memory(const std::filesystem::path& root = "/") {
  AvailableMemory m;
  {
    std::ifstream in(root / "proc/meminfo");
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
  const auto own = detail::own_cgroups(root);
  const auto take = [&](const std::optional<AvailableMemory>& room) {
    if (room && room->bytes < m.bytes) m = *room;
  };
  if (own.v2) take(detail::cgroup_room(*own.v2, "memory.max", "memory.current"));
  if (own.v1_memory) take(detail::cgroup_room(*own.v1_memory, "memory.limit_in_bytes", "memory.usage_in_bytes"));
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
