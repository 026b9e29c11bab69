// anvil-doctor: checks that this machine trains fast and that a config file is valid.
//   anvil-doctor                      check the machine
//   anvil-doctor --config run.yaml    also validate run.yaml against anvil's Trainer configs
// Each check prints "ok", "warn" or "FAIL" with the reason; the exit status is 1 when any
// check failed (2 for a config file that does not validate).
#include <anvil/anvil.hpp>
#include <anvil/buffers/demo_dataset.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

namespace {

int failures = 0;

void report(const char* level, const std::string& what) {
  std::printf("%-4s  %s\n", level, what.c_str());
  std::fflush(stdout);
  if (std::string(level) == "FAIL") ++failures;
}
void ok(const std::string& s) { report("ok", s); }
void warn(const std::string& s) { report("warn", s); }
void fail(const std::string& s) { report("FAIL", s); }

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

// Matrix-product throughput on `device` in GFLOP/s (float32, n x n by n x n).
double matmul_gflops(c10::Device device, std::int64_t n, at::ScalarType dtype = at::kFloat) {
  auto opt = at::TensorOptions().device(device).dtype(dtype);
  auto a = torch::randn({n, n}, opt), b = torch::randn({n, n}, opt);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  (void)torch::mm(a, b);
  sync();
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double secs = 0;
  while (secs < 0.3) {
    (void)torch::mm(a, b);
    ++reps;
    sync();
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return 2.0 * static_cast<double>(n * n * n) * reps / secs / 1e9;
}

// One Gloo (or NCCL) collective in a world of one rank: the backend loads and runs.
void check_backend(anvil::DistBackend backend, c10::Device device, const std::string& name) {
  try {
    anvil::dist::Group g(anvil::dist::World{}, c10::make_intrusive<c10d::HashStore>(), device, backend,
                         std::chrono::seconds(30), "", 25, /*even_alone=*/true);
    std::vector<at::Tensor> t{torch::full({4}, 3.0f, at::TensorOptions().device(device))};
    g.all_reduce_mean(t);
    if (t[0].cpu().eq(3.0f).all().item<bool>()) ok(name + " works (one-rank all-reduce on " + device.str() + ")");
    else fail(name + " all-reduce gave a wrong result");
  } catch (const std::exception& e) {
    fail(name + " does not work: " + std::string(e.what()));
  }
}

// Validates `file` against the Trainer configs anvil ships; true when one accepts it.
template <class... Trainers>
bool validate_config(const std::string& file, const std::vector<std::string>& names) {
  anvil::Args args;
  try {
    std::string flag = "--config=" + file;
    char prog[] = "anvil-doctor";
    char* argv[] = {prog, flag.data(), nullptr};
    args = anvil::parse_config(2, argv);
  } catch (const anvil::ConfigError& e) {
    fail(std::string("config: ") + e.what());
    return false;
  }
  std::vector<std::string> accepted;
  // When none accepts it, the error reported is that of the trainer family the file is
  // written for: the one whose sections hold most of the file's keys (a PPO file with a
  // typo gets PPO's error, not SAC's).
  std::string best_error, best_name;
  int best_score = -1;
  std::size_t i = 0;
  auto try_one = [&]<class T>() {
    typename T::Config defaults;
    std::set<std::string> sections;
    for (const auto& f : anvil::fields(defaults)) sections.insert(f.key.substr(0, f.key.find('.')));
    int score = 0;
    for (const auto& s : args.settings)
      if (sections.count(s.key.substr(0, s.key.find('.')))) ++score;
    try {
      (void)anvil::configure<typename T::Config>(args);
      accepted.push_back(names[i]);
    } catch (const anvil::ConfigError& e) {
      if (score > best_score) best_score = score, best_error = e.what(), best_name = names[i];
    }
    ++i;
  };
  (try_one.template operator()<Trainers>(), ...);
  if (accepted.empty()) {
    fail("config: " + file + " is not valid (read as a " + best_name + " config): " + best_error);
    return false;
  }
  std::string list;
  for (const auto& a : accepted) list += (list.empty() ? "" : ", ") + a;
  ok("config: " + file + " is valid for " + list);
  return true;
}

}  // namespace

// Python envs: each door a `python:` env id takes (in this process, env.workers=0; in worker
// processes, env.workers > 0), tried by making two of anvil's own check envs through it
// (python:anvil_envs:Check, src/python_envs/anvil_envs.py) and stepping them through an
// episode: the library found and built from these headers, the interpreter started, its numpy
// imported, the rows back. A build without the library says so and passes.
void check_python_envs() {
  namespace python = anvil::envs::python;
  for (const int workers : {0, 1}) {
    const python::Library& lib = workers > 0 ? python::kWorkers : python::kBridge;
    const std::string door = workers > 0 ? "Python envs in worker processes (env.workers > 0)"
                                         : "Python envs in this process (env.workers=0)";
    const auto path = python::library_path(lib);
    if (path.empty()) {
      ok(door + ": not built (" + lib.file + "); python: env ids need " + lib.packages +
         " (scripts/install-deps.sh) and a rebuild");
      continue;
    }
    try {
      const auto env = anvil::envs::python_env("python:anvil_envs:Check", {}, workers);
      anvil::envs::VecEnvConfig cfg;
      cfg.num_envs = 2;
      cfg.workers = workers;
      const auto batch = env.batch_maker()(cfg, 1, 0, 0);
      constexpr int kLength = 8;  // Check's episode
      std::vector<float> obs(2), next(2), reward(2), terminated(2), truncated(2);
      std::vector<anvil::envs::EpisodeEnd> ended(2);
      batch->reset(obs.data(), 0);
      const float actions[2] = {0.25F, -0.25F};
      for (int t = 0; t < kLength; ++t)
        batch->step(0, 2, actions, {obs.data(), next.data(), reward.data(), terminated.data(), truncated.data(), nullptr,
                                    ended.data()}, t);
      if (ended[0].length != kLength || ended[1].length != kLength || truncated[0] != 1 || truncated[1] != 1)
        fail(door + ": " + path.string() + " made the check env, but its episodes did not end after " +
             std::to_string(kLength) + " steps (lengths " + std::to_string(ended[0].length) + ", " +
             std::to_string(ended[1].length) + ")");
      else
        ok(door + ": a numpy env made and stepped through " + path.filename().string() + "; " + env.note());
    } catch (const std::exception& e) {
      fail(door + ": " + e.what());
    }
  }
  // The programs that hold the interpreter (CMake's anvil_python_in_program: anvil's train_sac,
  // train_ppo, mt_sac, coma) step Python envs through the same bridge linked with no Python,
  // which this program, holding none, cannot load: where the build makes it, it is there.
  if (*python::kHostBridge.built) {
    const std::string door = "Python envs in the programs that hold the interpreter (train_sac, train_ppo, mt_sac, coma)";
    const auto host = python::library_path(python::kHostBridge);
    if (host.empty())
      warn(door + ": " + python::kHostBridge.file + " is not built yet (" + python::kHostBridge.built +
           "); building those programs builds it");
    else
      ok(door + ": " + host.string() + ", the same bridge linked with no Python");
  }
}

int main(int argc, char** argv) {
  std::string config;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a.rfind("--config=", 0) == 0) config = a.substr(9);
    else if (a == "--help" || a == "-h") {
      std::puts("usage: anvil-doctor [--config FILE]\nChecks BLAS, threads, LibTorch, CUDA devices, NCCL and Gloo, "
                "Python envs (each door, with a real env), matrix-product speed, the default networks, and (with "
                "--config) a config file.");
      return 0;
    } else {
      std::fprintf(stderr, "anvil-doctor: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);

  // LibTorch and devices.
  const bool cuda_build = at::hasCUDA();
  ok("LibTorch " + anvil::compat::torch_version_string() + (cuda_build ? " (CUDA build)" : " (CPU build)"));
  const auto gpus = cuda_build ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (cuda_build && gpus == 0) warn("this LibTorch has CUDA but no GPU is visible (driver? CUDA_VISIBLE_DEVICES?)");
  if (gpus > 0) ok(std::to_string(gpus) + " CUDA device(s) visible");
  anvil::GpuMonitor monitor;
  if (monitor.available()) ok(monitor.status() + ": " + anvil::GpuMonitor::describe(monitor.sample()));
  else if (gpus > 0) warn(monitor.status());
  else ok(monitor.status());

  // BLAS and threads.
  const auto blas = anvil::blas_info();
  if (blas.reference)
    fail("BLAS: Torch uses the REFERENCE BLAS (" + blas.library +
         "): matrix products are about 10x slower. Run scripts/install-deps.sh (installs libopenblas0-openmp)");
  else if (const char* forced = std::getenv("OPENBLAS_CORETYPE");
           blas.openblas && !blas.core.empty() && !anvil::is_avx512_core(blas.core) && anvil::cpu_has_avx512() && forced)
    warn("BLAS: OpenBLAS uses its " + blas.core + " kernels on an AVX-512 CPU because OPENBLAS_CORETYPE=" + forced +
         " is set in the environment: it is what chose these slower kernels; unset it (anvil programs then "
         "choose the AVX-512 kernels)");
  else if (const char* set = std::getenv("OPENBLAS_CORETYPE"); blas.openblas && set)
    ok("BLAS: OpenBLAS" + (blas.core.empty() ? std::string() : ", " + blas.core + " kernels") + " (OPENBLAS_CORETYPE=" + set +
       " is set in the environment)");
  else if (blas.openblas && !blas.core.empty() && !anvil::is_avx512_core(blas.core) && anvil::cpu_has_avx512())
    warn("BLAS: OpenBLAS uses its " + blas.core + " kernels on an AVX-512 CPU; OPENBLAS_CORETYPE=SkylakeX made a "
         "256-wide SAC update 46% faster here (anvil programs set it themselves when it is unset)");
  else if (blas.openblas)
    ok("BLAS: OpenBLAS" + (blas.core.empty() ? std::string() : ", " + blas.core + " kernels") + " (" + blas.library + ")");
  else
    warn("BLAS: could not tell which BLAS is loaded (" + (blas.library.empty() ? std::string("none found") : blas.library) + ")");
  const unsigned machine = std::thread::hardware_concurrency();
  const int cores = anvil::detail::available_cores();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  ok("threads: " + std::to_string(cores) + " core(s) for this process" +
     (static_cast<unsigned>(cores) != machine ? " (affinity or CPU quota; the machine has " + std::to_string(machine) + ")" : "") +
     "; anvil runs 1 intra-op thread per process by default (run.threads)" +
     "; OMP_NUM_THREADS=" + (omp ? omp : "unset") + ", OMP_WAIT_POLICY=" + (wait ? wait : "unset"));
  if (!wait) warn("threads: set OMP_WAIT_POLICY=PASSIVE if you raise run.threads, so idle OpenMP workers sleep");

  // Collectives.
  check_backend(anvil::DistBackend::gloo, c10::Device(c10::kCPU), "Gloo");
  if (anvil::compat::has_nccl && gpus > 0) check_backend(anvil::DistBackend::nccl, c10::Device(c10::kCUDA, 0), "NCCL");
  else if (gpus > 0) warn("NCCL: this LibTorch was built without it; DDP on GPUs falls back to Gloo");
  else ok("NCCL: not needed without GPUs");

  check_python_envs();

  // Matrix products on each device.
  try {
    const double cpu = matmul_gflops(c10::Device(c10::kCPU), 512);
    (cpu < 5 ? warn : ok)("CPU matrix product (512, float32, 1 thread): " + fmt("%.1f GFLOP/s", cpu) +
                          (cpu < 5 ? " (slow: reference BLAS or a busy machine?)" : ""));
    for (int g = 0; g < gpus; ++g) {
      const c10::Device d(c10::kCUDA, static_cast<c10::DeviceIndex>(g));
      ok("cuda:" + std::to_string(g) + " matrix product (4096): " + fmt("%.0f GFLOP/s float32", matmul_gflops(d, 4096)) +
         ", " + fmt("%.0f GFLOP/s bfloat16", matmul_gflops(d, 4096, at::kBFloat16)));
    }
  } catch (const std::exception& e) {
    fail(std::string("matrix product failed: ") + e.what());
  }

  // The default networks: one SAC update on each device.
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (gpus > 0) devices.emplace_back(c10::kCUDA, 0);
  for (const auto& d : devices) {
    try {
      anvil::RunContext ctx;
      ctx.device = d;
      const auto spec = anvil::envs::spec_of(anvil::envs::Pendulum{});
      anvil::SAC sac(spec, anvil::SAC::Config{}, ctx);
      anvil::ReplayBatch b;
      auto o = at::TensorOptions().device(d);
      b.obs = torch::randn({256, 3}, o);
      b.action = torch::rand({256, 1}, o) * 2 - 1;
      b.reward = torch::randn({256}, o);
      b.next_obs = torch::randn({256, 3}, o);
      b.terminated = torch::zeros({256}, o);
      anvil::StepContext::Options so;
      so.device = d;
      anvil::StepContext step(so);
      (void)sac.update(b, step);
      const int n = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) (void)sac.update(b, step);
      if (d.is_cuda()) torch::cuda::synchronize(d.index());
      const double per = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
      const bool finite = sac.critic_optimizer().parameters().flat().isfinite().all().item<bool>();
      if (!finite) fail("default networks on " + d.str() + ": the update produced non-finite parameters");
      else ok("default networks on " + d.str() + ": SAC forward/backward/step " + fmt("%.0f updates/s", 1.0 / per) +
              " (256x256, batch 256)");
    } catch (const std::exception& e) {
      fail("default networks on " + d.str() + " failed: " + e.what());
    }
  }

  if (!config.empty()) {
    using namespace anvil;
    const bool valid = validate_config<Trainer<SAC, UniformBuffer, DDPAuto, FP32>, Trainer<SAC, UniformBuffer, DDPAuto, BF16>,
                                       Trainer<SAC, PrioritizedBuffer, DDPAuto, FP32>,
                                       Trainer<SAC, PrioritizedBuffer, DDPAuto, BF16>, Trainer<SAC, UniformBuffer, DDPAuto, FP16>,
                                       Trainer<SAC, PrioritizedBuffer, DDPAuto, FP16>,
                                       Trainer<PPO, RolloutBuffer, DDPAuto, FP32>, Trainer<PPO, RolloutBuffer, DDPAuto, BF16>,
                                       Trainer<PPO, RolloutBuffer, DDPAuto, FP16>,
                                       Trainer<MultiTaskSAC, UniformBuffer, DDPAuto, FP32>,
                                       Trainer<MultiTaskSAC, UniformBuffer, DDPAuto, BF16>,
                                       Trainer<MultiTaskSAC, PrioritizedBuffer, DDPAuto, FP32>,
                                       Trainer<MultiTaskSAC, PrioritizedBuffer, DDPAuto, BF16>,
                                       Trainer<COMA, EpisodeBuffer, DDPAuto, FP32>, Trainer<COMA, EpisodeBuffer, DDPAuto, BF16>,
                                       Trainer<DiffusionPolicy, DemoDataset, DDPAuto, FP32>,
                                       Trainer<DiffusionPolicy, DemoDataset, DDPAuto, BF16>>(
        config, {"SAC+UniformBuffer (FP32/TF32)", "SAC+UniformBuffer+BF16", "SAC+PrioritizedBuffer (FP32/TF32)",
                 "SAC+PrioritizedBuffer+BF16", "SAC+UniformBuffer+FP16", "SAC+PrioritizedBuffer+FP16",
                 "PPO+RolloutBuffer (FP32/TF32)", "PPO+RolloutBuffer+BF16", "PPO+RolloutBuffer+FP16",
                 "MultiTaskSAC+UniformBuffer (FP32/TF32)", "MultiTaskSAC+UniformBuffer+BF16",
                 "MultiTaskSAC+PrioritizedBuffer (FP32/TF32)", "MultiTaskSAC+PrioritizedBuffer+BF16",
                 "COMA+EpisodeBuffer (FP32/TF32)", "COMA+EpisodeBuffer+BF16", "DiffusionPolicy+DemoDataset (FP32/TF32)",
                 "DiffusionPolicy+DemoDataset+BF16"});
    if (!valid) return 2;
  }
  std::printf("%s\n", failures ? "anvil-doctor: some checks FAILED (see above)" : "anvil-doctor: all checks passed");
  return failures ? 1 : 0;
}
