// Device policy, seeding, the LibTorch-version shim, and the cores a process may use.
#include <anvil/core/context.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/parallel/c10d.hpp>

#include "../skip.hpp"

TEST_CASE("Device: cpu and auto resolve, and CUDA asked for without CUDA is a clear error") {
  CHECK(anvil::resolve_device("cpu").is_cpu());
  const auto a = anvil::resolve_device("auto");
  CHECK((a.is_cpu() || a.is_cuda()));
  if (torch::cuda::is_available()) {
    CHECK(a.is_cuda());  // auto takes a GPU where there is one
  } else {
    CHECK(a.is_cpu());
    for (const char* spec : {"cuda", "cuda:0", "cuda:1"}) {
      try {
        anvil::resolve_device(spec);
        FAIL("expected DeviceError for " << spec);
      } catch (const anvil::DeviceError& e) {
        const std::string m = e.what();
        CHECK(m.find(std::string("run.device='") + spec + "'") == 0);
        CHECK(m.find("use --device=cpu") != std::string::npos);
      }
    }
  }
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "CPU"}) {
    try {
      anvil::resolve_device(bad);
      FAIL("expected DeviceError for " << bad);
    } catch (const anvil::DeviceError& e) {
      CHECK(std::string(e.what()).find("is not a device") != std::string::npos);
    }
  }
}

TEST_CASE("Seeding: one seed gives distinct, reproducible streams per purpose, index and rank") {
  anvil::RunContext c0{.seed = 7}, c1{.seed = 7, .rank = 1};
  CHECK(c0.seed_for(anvil::Stream::env, 0) == anvil::RunContext{.seed = 7}.seed_for(anvil::Stream::env, 0));
  CHECK(c0.seed_for(anvil::Stream::env, 0) != c0.seed_for(anvil::Stream::env, 1));
  CHECK(c0.seed_for(anvil::Stream::env, 0) != c0.seed_for(anvil::Stream::buffer, 0));
  CHECK(c0.seed_for(anvil::Stream::env, 0) != c1.seed_for(anvil::Stream::env, 0));
  anvil::seed_torch(c0);
  auto x = torch::rand({4});
  anvil::seed_torch(c0);
  CHECK(torch::equal(x, torch::rand({4})));
}

TEST_CASE("Compat: the autocast switches turn bfloat16 autocast on and off on the CPU") {
  using anvil::compat::set_autocast_enabled;
  CHECK_FALSE(anvil::compat::autocast_enabled(c10::DeviceType::CPU));
  set_autocast_enabled(c10::DeviceType::CPU, true);
  anvil::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
  anvil::compat::autocast_enter();
  auto y = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  anvil::compat::autocast_exit();
  set_autocast_enabled(c10::DeviceType::CPU, false);
  CHECK((y.scalar_type() == torch::kBFloat16));
  CHECK((torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kFloat));
}

TEST_CASE("Compat: a Gloo process group of one rank all-reduces through c10d") {
  const auto path = std::filesystem::temp_directory_path() /
                    ("anvil_gloo_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  auto store = anvil::compat::make_file_store(path.string(), 1);
  auto pg = anvil::compat::make_gloo_group(store, 0, 1, anvil::compat::gloo_device("", "127.0.0.1"), std::chrono::seconds(30));
  std::vector<at::Tensor> t{torch::full({3}, 2.5f)};
  pg->allreduce(t)->wait();
  CHECK(torch::allclose(t[0], torch::full({3}, 2.5f)));
  std::filesystem::remove(path);
}

TEST_CASE("available cores: a cgroup CPU quota caps them, v2 and v1, in the process's group or at the root") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("anvil-cgroup-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto write = [&](const fs::path& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  };
  auto quota = [&](const std::string& cgroup) {
    std::istringstream in(cgroup);
    return anvil::detail::cgroup_quota_cores(in, root.string());
  };
  CHECK(quota("0::/job\n") == 0);  // no files: no quota
  write("job/cpu.max", "150000 100000\n");  // 1.5 cores: 2 whole ones
  CHECK(quota("0::/job\n") == 2);
  write("job/cpu.max", "max 100000\n");
  CHECK(quota("0::/job\n") == 0);
  write("cpu.max", "100000 100000\n");  // a container: its own group shows as the root
  CHECK(quota("0::/elsewhere\n") == 1);
  // v1: the cpu controller's line, not the others'
  write("cpu,cpuacct/batch/cpu.cfs_quota_us", "300000\n");
  write("cpu,cpuacct/batch/cpu.cfs_period_us", "100000\n");
  CHECK(quota("4:memory:/batch\n3:cpu,cpuacct:/batch\n") == 3);
  write("cpu,cpuacct/batch/cpu.cfs_quota_us", "-1\n");
  CHECK(quota("3:cpu,cpuacct:/batch\n") == 0);
  fs::remove_all(root);
}

TEST_CASE("available cores: a process pinned to one core counts one, whatever the machine has") {
  // In a child, so that this process keeps its cores: pin it to the first core it may
  // use and count again.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof(mine), &mine) == 0);
  CHECK(anvil::detail::count_available_cores() <= CPU_COUNT(&mine));
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mine)) {
        CPU_SET(c, &one);
        break;
      }
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) ::_exit(2);  // not allowed here
    ::_exit(anvil::detail::count_available_cores() == 1 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) ANVIL_SKIP("this sandbox refuses sched_setaffinity: the pinned count is not checked");
  CHECK(WEXITSTATUS(status) == 0);
}
