// DDP's cost and gain: the all-reduce of one SAC update's gradients (critic, actor and
// temperature in one flat buffer, as the trainer sends them), and the env steps/s of a
// whole SAC run on Pendulum with bench.ranks ranks. With more than one rank this program
// launches its ranks like any DDP program; rank 0 prints the JSON lines.
//   bench_ddp bench.ranks=2            (Gloo on the CPU)
//   bench_ddp bench.ranks=1 bench.device=cuda   (NCCL on a GPU, one rank)
#include <anvil/parallel/collectives.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <filesystem>

#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/train/trainer.hpp>

struct BenchConfig {
  anvil::Param<int, "ranks", "ranks on this machine", anvil::in_range(1, 64)> ranks{2};
  anvil::Param<std::int64_t, "steps", "env steps of the timed run (all ranks together)", anvil::at_least(0)> steps{8000};
  anvil::Param<int, "reduces", "all-reduces timed per repeat", anvil::at_least(1)> reduces{200};
  anvil::Param<int, "rounds", "repeats of the all-reduce timing (the median is reported)", anvil::at_least(1)> rounds{5};
  anvil::Param<int, "hidden", "width of both hidden layers of the actor and the critics", anvil::at_least(1)> hidden{256};
  anvil::Param<std::string, "device", "cpu, cuda, cuda:N or auto"> device{"cpu"};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::DDPAuto>;
  Trainer::Config t;
  t.parallel->nproc_per_node = b.ranks;
  t.run->device = *b.device;
  t.run->progress = anvil::ProgressMode::off;
  t.run->checkpoint_interval = 0;
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_bench_ddp_" + std::to_string(::getppid()))).string();
  t.train->steps = std::max<std::int64_t>(*b.steps, 1);
  t.train->eval_interval = 0;
  t.train->eval_episodes = 1;
  t.train->learning_starts = std::min<std::int64_t>(1000, *b.steps / 2);
  t.algorithm->actor->hidden = {*b.hidden, *b.hidden};
  t.algorithm->critic->hidden = {*b.hidden, *b.hidden};
  Trainer::Parallelism::start_ranks(*t.parallel, *t.run->device);  // more than one rank: this process launches them
  Trainer trainer(anvil::envs::Pendulum{}, t, "bench_ddp");
  auto& par = trainer.parallelism();
  auto& sac = trainer.algorithm();
  const std::int64_t critic_floats = sac.critic_optimizer().parameters().numel();
  const std::int64_t actor_floats = sac.actor_optimizer().parameters().numel();
  const std::int64_t floats = critic_floats + actor_floats + 1;
  const auto device = trainer.context().device;
  const std::string dev = device.str();

  // One rank: a backend of its own over an in-memory store (NCCL on CUDA: its kernels
  // still run; Gloo on the CPU: copies only), to time it alone.
  anvil::dist::Group alone;
  if (par.world_size() == 1)
    alone = anvil::dist::Group(anvil::dist::World{}, c10::make_intrusive<c10d::HashStore>(), device,
                               anvil::DistBackend::auto_, std::chrono::seconds(60), "", 25, /*even_alone=*/true);
  auto all_reduce = [&](std::vector<at::Tensor>& g) {
    if (par.world_size() == 1) alone.all_reduce_mean(g);
    else par.all_reduce_mean(g);
  };
  const std::string backend = device.is_cuda() && anvil::compat::has_nccl ? "nccl" : "gloo";
  {
    // The update's three flat gradients, sent together as the trainer sends them.
    auto critic = torch::randn({critic_floats}, at::TensorOptions().device(device));
    auto actor = torch::randn({actor_floats}, at::TensorOptions().device(device));
    auto alpha = torch::randn({1}, at::TensorOptions().device(device));
    std::vector<at::Tensor> grads{critic, actor, alpha};
    for (int i = 0; i < 20; ++i) all_reduce(grads);  // warm-up: connections, buffers
    std::vector<double> per_call;
    for (int r = 0; r < b.rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < b.reduces; ++i) all_reduce(grads);
      if (device.is_cuda()) (void)grads[2].cpu();  // NCCL is asynchronous: wait for the last one
      per_call.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / b.reduces);
    }
    if (par.is_main())
      bench::emit("ddp_allreduce_per_update", bench::median(per_call) * 1e6, "us",
                  {{"ranks", par.world_size()}, {"floats", static_cast<long long>(floats)}, {"backend", backend},
                   {"hidden", *b.hidden}},
                  dev);
  }
  if (b.steps > 0) {
    const double comm_before = par.comm_seconds();
    const auto r = trainer.fit();
    if (par.is_main()) {
      const std::vector<std::pair<std::string, bench::Value>> c{
          {"ranks", par.world_size()}, {"env", "Pendulum-v1"}, {"steps", static_cast<long long>(r.env_steps)},
          {"hidden", *b.hidden}, {"backend", backend}};
      bench::emit("ddp_sac_env_steps_per_s", static_cast<double>(r.env_steps) / r.wall_seconds, "steps/s", c, dev);
      bench::emit("ddp_sac_updates_per_s_per_rank", static_cast<double>(r.updates) / r.wall_seconds, "updates/s", c, dev);
      bench::emit("ddp_comm_share_of_run", (par.comm_seconds() - comm_before) / r.wall_seconds, "fraction", c, dev);
    }
    std::error_code ec;
    if (par.is_main()) std::filesystem::remove_all(trainer.run_dir(), ec);
  }
}
