// The memory a run may take: MemAvailable and every cgroup limit above the process, read from
// made-up /proc and cgroup trees (available_memory's root stands for "/").
#include <anvil/core/memory.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>


#include "../temp_run_dir.hpp"

namespace {
namespace fs = std::filesystem;
constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// A machine with 20 GiB available and the given /proc/self/cgroup and mountinfo.
fs::path fake_root(const std::string& name, const std::string& cgroup, const std::string& mountinfo) {
  const fs::path root = temp_run_dir("memory_" + name);
  put(root / "proc/meminfo", "MemTotal:       32000000 kB\nMemFree:        1000 kB\nMemAvailable:   20971520 kB\n");
  put(root / "proc/self/cgroup", cgroup);
  if (!mountinfo.empty()) put(root / "proc/self/mountinfo", mountinfo);
  return root;
}

const std::string kHybridMounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
const std::string kV2Mounts = "30 23 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n";
}  // namespace

TEST_CASE("Memory: with no cgroup limit, what is available is MemAvailable") {
  const auto root = fake_root("none", "0::/user.slice/session-1.scope\n", kV2Mounts);
  put(root / "sys/fs/cgroup/user.slice/memory.max", "max\n");
  put(root / "sys/fs/cgroup/user.slice/memory.current", "1000\n");
  const auto m = anvil::available_memory(root);
  CHECK(m.bytes == 20 * kGiB);
  CHECK(m.source == "MemAvailable in /proc/meminfo");
  fs::remove_all(root);
}

TEST_CASE("Memory: on a hybrid cgroup host the v1 memory controller's limit counts, not the empty v2 hierarchy") {
  // systemd's hybrid layout: a "0::/" line for the unified hierarchy, which has no memory
  // controller, beside the v1 memory controller holding a 2 GiB job limit.
  const auto root = fake_root("hybrid",
                              "9:name=systemd:/\n8:pids:/\n4:memory:/slurm/uid_1000/job_7\n1:cpu:/\n0::/\n",
                              kHybridMounts);
  put(root / "sys/fs/cgroup/unified/cgroup.controllers", "\n");
  put(root / "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  put(root / "sys/fs/cgroup/memory/memory.usage_in_bytes", "5000000000\n");
  put(root / "sys/fs/cgroup/memory/slurm/uid_1000/job_7/memory.limit_in_bytes", std::to_string(2 * kGiB) + "\n");
  put(root / "sys/fs/cgroup/memory/slurm/uid_1000/job_7/memory.usage_in_bytes", std::to_string(100 * kMiB) + "\n");
  const auto m = anvil::available_memory(root);
  CHECK(m.bytes == 2 * kGiB - 100 * kMiB);
  CHECK(m.source.find("memory/slurm/uid_1000/job_7/memory.limit_in_bytes less memory.usage_in_bytes") !=
        std::string::npos);
  // A buffer sized past it is refused with the field named, not killed by the OOM killer.
  CHECK_THROWS_WITH_AS(anvil::check_fits(200'000'000LL * 100, "buffer.capacity=200000000", "UniformBuffer's storage", m),
                       doctest::Contains("buffer.capacity=200000000: UniformBuffer's storage needs 18.6 GiB, but 1.9 GiB"),
                       anvil::ConfigError);
  fs::remove_all(root);
}

TEST_CASE("Memory: on cgroup v2 a limit set on a parent counts though the leaf says max, and the least room wins") {
  const auto root = fake_root("v2_parent", "0::/system.slice/job.slice/step.scope\n", kV2Mounts);
  const fs::path cg = root / "sys/fs/cgroup";
  put(cg / "cgroup.controllers", "cpu io memory pids\n");
  put(cg / "system.slice/memory.max", std::to_string(8 * kGiB) + "\n");
  put(cg / "system.slice/memory.current", std::to_string(7 * kGiB) + "\n");  // 1 GiB of room
  put(cg / "system.slice/job.slice/memory.max", std::to_string(4 * kGiB) + "\n");
  put(cg / "system.slice/job.slice/memory.current", std::to_string(1 * kGiB) + "\n");  // 3 GiB of room
  put(cg / "system.slice/job.slice/step.scope/memory.max", "max\n");
  put(cg / "system.slice/job.slice/step.scope/memory.current", std::to_string(512 * kMiB) + "\n");
  const auto m = anvil::available_memory(root);
  CHECK(m.bytes == 1 * kGiB);
  CHECK(m.source.find("system.slice/memory.max less memory.current") != std::string::npos);
  // With the parent's room larger, the job's limit is the one that holds.
  put(cg / "system.slice/memory.current", "0\n");
  CHECK(anvil::available_memory(root).bytes == 3 * kGiB);
  fs::remove_all(root);
}

TEST_CASE("Memory: mount points come from mountinfo, and a container's mounted cgroup is found without the host's path") {
  // No cgroup namespace: /proc/self/cgroup names the host's path, and that cgroup is what is
  // mounted (mountinfo's root field) at a mount point with a space in it.
  const auto root = fake_root("container", "0::/docker/abc123\n",
                              "30 23 0:27 /docker/abc123 /srv/my\\040cgroups rw - cgroup2 cgroup2 rw\n");
  put(root / "srv/my cgroups/memory.max", std::to_string(512 * kMiB) + "\n");
  put(root / "srv/my cgroups/memory.current", std::to_string(12 * kMiB) + "\n");
  CHECK(anvil::available_memory(root).bytes == 500 * kMiB);
  fs::remove_all(root);
}

TEST_CASE("Memory: without mountinfo, the usual mount points are read") {
  const auto root = fake_root("usual", "4:memory:/job\n0::/\n", "");
  put(root / "sys/fs/cgroup/unified/cgroup.controllers", "\n");
  put(root / "sys/fs/cgroup/memory/job/memory.limit_in_bytes", std::to_string(kGiB) + "\n");
  put(root / "sys/fs/cgroup/memory/job/memory.usage_in_bytes", "0\n");
  CHECK(anvil::available_memory(root).bytes == kGiB);
  fs::remove_all(root);
}
