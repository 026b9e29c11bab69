// Device policy, seeding and the LibTorch-version shim.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <filesystem>

#include <anvil/core/context.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/parallel/c10d.hpp>

TEST_CASE("Device: cpu and auto resolve, and CUDA asked for without CUDA is a clear error") {
  CHECK(anvil::resolve_device("cpu").is_cpu());
  const auto a = anvil::resolve_device("auto");
  CHECK((a.is_cpu() || a.is_cuda()));
  if (!torch::cuda::is_available()) {
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
