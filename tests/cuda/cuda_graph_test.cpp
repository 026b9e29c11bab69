// SAC's (and MultiTaskSAC's, a temperature per task; FP16's loss scaler), PPO's, COMA's,
// DiffusionPolicy's and CollectiveDistillation's updates, and one DDP rank's with its NCCL
// all-reduce, replayed from CUDA graphs against the same updates op by op, on a GPU.
// Built only with LibTorch's CUDA (ANVIL_WITH_CUDA; CMake's anvil_cuda_tests, or
// scripts/gpu-check.sh graph on a machine with PyTorch); on such a build without a GPU
// each case says so and checks nothing.
#include <doctest/doctest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <anvil/algorithms/collective_distillation.hpp>
#include <anvil/algorithms/coma.hpp>
#include <anvil/algorithms/diffusion_policy.hpp>
#include <anvil/algorithms/ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>
#include <anvil/envs/multi_agent/matrix_game.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/parallel/ddp.hpp>

#include "../captured_checks.hpp"
#include "../skip.hpp"

using namespace anvil;

namespace {

// A batch of Pendulum-shaped transitions on `d` (with tasks 0, 1, 2 in turn when `tasks`).
ReplayBatch random_batch(std::int64_t n, const c10::Device& d, bool weights, bool tasks = false) {
  const auto o = at::TensorOptions().device(d);
  ReplayBatch b;
  b.obs = torch::randn({n, 3}, o);
  b.action = torch::rand({n, 1}, o) * 2 - 1;
  b.reward = torch::randn({n}, o);
  b.next_obs = torch::randn({n, 3}, o);
  b.terminated = (torch::rand({n}, o) < 0.1).to(torch::kFloat);
  if (weights) b.weight = torch::rand({n}, o) + 0.5;
  if (tasks) b.task = torch::arange(n, o.dtype(torch::kLong)) % 3;
  return b;
}

bool close(const std::vector<at::Tensor>& x, const std::vector<at::Tensor>& y, double rtol, double atol) {
  bool ok = x.size() == y.size();
  for (std::size_t i = 0; ok && i < x.size(); ++i) ok = torch::allclose(x[i], y[i], rtol, atol);
  return ok;
}

// An A (SAC, MultiTaskSAC) from seed 0, with its update and acting as CUDA graphs or not.
template <class A>
A seeded(typename A::Config cfg, const EnvSpec& spec, const RunContext& run, bool graph) {
  cfg.cuda_graph = graph;
  torch::manual_seed(0);
  return A(spec, cfg, run);
}

// `updates` updates of two SACs (of type A: SAC, MultiTaskSAC) from one seed, one with
// cuda_graph and one without, on the same batches and noise; checks they agree and that the
// graph ran. `spec`: Pendulum's, or Pendulum's with three tasks (batches carry their tasks).
template <class A = SAC>
void compare(typename A::Config cfg, StepContext::Options so, int updates, bool weights, double tol,
             EnvSpec spec = envs::spec_of(envs::Pendulum{})) {
  const c10::Device d(c10::kCUDA, 0);
  RunContext run;
  run.device = d;
  so.device = d;
  const bool tasks = !spec.tasks.empty();
  A graphed = seeded<A>(cfg, spec, run, true);
  A eager = seeded<A>(cfg, spec, run, false);
  StepContext cg(so), ce(so);
  torch::manual_seed(5);
  for (int i = 0; i < updates; ++i) {
    const auto b = random_batch(cfg.batch_size, d, weights, tasks);
    typename A::UpdateNoise noise{torch::randn({cfg.batch_size, 1}, b.obs.options()),
                           torch::randn({cfg.batch_size, 1}, b.obs.options())};
    const auto x = eager.update(b, ce, noise);
    const auto y = graphed.update(b, cg, noise);
    REQUIRE(x.metrics.size() == y.metrics.size());
    for (std::size_t k = 0; k < x.metrics.size(); ++k) {
      CHECK(x.metrics[k].first == y.metrics[k].first);
      CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(tol));
    }
    CHECK(torch::allclose(x.td_error, y.td_error, tol, tol));
  }
  CHECK(graphed.graphed_updates() > 0);
  CHECK(eager.graphed_updates() == 0);
  CHECK(close(eager.actor()->parameters(), graphed.actor()->parameters(), tol, tol));
  CHECK(close(eager.critic()->parameters(), graphed.critic()->parameters(), tol, tol));
  CHECK(close(eager.critic_target()->parameters(), graphed.critic_target()->parameters(), tol, tol));
  CHECK(torch::allclose(graphed.alphas(), eager.alphas(), tol, tol));
  CHECK(graphed.updates() == eager.updates());
  CHECK(cg.steps() == ce.steps());
  for (auto opt : {&A::actor_optimizer, &A::critic_optimizer, &A::alpha_optimizer})
    CHECK((graphed.*opt)().steps() == (eager.*opt)().steps());
  test::check_same_scaler_decisions(ce, cg);  // FP16: the graphs' checks and skips decided alike
  if (ce.scaler()) {
    MESSAGE("steps skipped: " << ce.scaler()->skipped() << ", scale at the end: " << ce.scaler()->current_scale());
  }
}

SAC::Config small() {
  SAC::Config c;
  c.actor->hidden = {64, 64};
  c.critic->hidden = {64, 64};
  c.batch_size = 128;
  return c;
}

}  // namespace

// The doctest suite `gpu` (a ctest label): `ctest -L gpu` runs every case that needs CUDA.
TEST_SUITE_BEGIN("gpu");

TEST_CASE("SAC on CUDA: updates replayed from a CUDA graph match the same updates op by op (float32)") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  compare(small(), {}, 30, false, 1e-4);
}

TEST_CASE("SAC on CUDA: graphs per update shape (actor every 2nd, target every 3rd), clipping and importance weights") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  auto cfg = small();
  cfg.actor_update_freq = 2;
  cfg.target_update_freq = 3;
  cfg.max_grad_norm = 1.0;
  compare(cfg, {}, 40, true, 1e-4);
}

TEST_CASE("PPO on CUDA: minibatch updates replayed from a CUDA graph match op by op (50 updates, both action spaces, micro-batches, an annealed learning rate)") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  const c10::Device d(c10::kCUDA, 0);
  RunContext run;
  run.device = d;
  for (const bool discrete : {false, true})
    for (const int micro : {1, 4}) {
      CAPTURE(discrete);
      CAPTURE(micro);
      const auto spec = discrete ? EnvSpec{"test", envs::Box{std::vector<float>(5, -1), std::vector<float>(5, 1)}, envs::Discrete{4}, {}}
                                 : EnvSpec{"test", envs::Box{std::vector<float>(5, -1), std::vector<float>(5, 1)},
                                           envs::Box{{-1, -1, -1}, {1, 1, 1}}, {}};
      PPO::Config cfg;
      cfg.lr = 3e-3;
      cfg.clip_value = 0.1;
      cfg.ent_coef = 0.01;
      auto make = [&](bool graph) {
        cfg.cuda_graph = graph;
        torch::manual_seed(0);
        return PPO(spec, cfg, run);
      };
      PPO graphed = make(true), eager = make(false);
      StepContext::Options so;
      so.device = d;
      so.micro_batches = micro;
      StepContext cg(so), ce(so);
      torch::manual_seed(5);
      for (int i = 0; i < 50; ++i) {
        const auto obs = torch::randn({128, 5}, at::TensorOptions().device(d));
        const auto a = eager.act_for_rollout(obs);
        const RolloutBatch b{obs, a.action, a.log_prob + 0.3 * torch::randn_like(a.log_prob), 3 * torch::randn_like(a.log_prob),
                             torch::randn_like(a.log_prob), a.value + 0.2 * torch::randn_like(a.value)};
        if (i == 25)
          for (PPO* p : {&graphed, &eager}) p->set_progress(0.5);
        const auto x = eager.update(b, ce);
        const auto y = graphed.update(b, cg);
        REQUIRE(x.metrics.size() == y.metrics.size());
        for (std::size_t k = 0; k < x.metrics.size(); ++k) {
          CHECK(x.metrics[k].first == y.metrics[k].first);
          CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(1e-4));
        }
        CHECK(torch::allclose(eager.optimizer().parameters().flat(), graphed.optimizer().parameters().flat(), 1e-4, 1e-4));
      }
      CHECK(graphed.graphed_updates() == 50 - GraphedUpdate::kWarmups);  // every update after the warm-ups, the captured one too
      CHECK(eager.graphed_updates() == 0);
      CHECK(graphed.updates() == eager.updates());
      CHECK(graphed.optimizer().steps() == eager.optimizer().steps());
      CHECK(cg.steps() == ce.steps());
    }
}

TEST_CASE("COMA on CUDA: minibatch critic and actor steps replayed from a CUDA graph match op by op (every critic kind, epsilon annealing)") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  const c10::Device d(c10::kCUDA, 0);
  RunContext run;
  run.device = d;
  const auto spec = envs::spec_of(envs::Joint<envs::MatrixGame>(envs::MatrixGame::credit(3, 1.0, 10.0)));
  const auto& l = spec.agents;
  for (const auto critic : {ComaCritic::counterfactual, ComaCritic::central_v, ComaCritic::independent}) {
    CAPTURE(static_cast<int>(critic));
    COMA::Config cfg;
    cfg.critic = critic;
    cfg.batch_size = 64;
    cfg.batch_number = 2;
    cfg.data_passes = 2;
    cfg.target_update_interval = 3;
    cfg.epsilon_anneal_episodes = 200;
    auto make = [&](bool graph) {
      cfg.cuda_graph = graph;
      torch::manual_seed(0);
      return COMA(spec, cfg, run);
    };
    COMA graphed = make(true), eager = make(false);
    StepContext::Options so;
    so.device = d;
    StepContext cg(so), ce(so);
    for (int round = 0; round < 12; ++round) {
      torch::manual_seed(10 + round);
      const std::int64_t B = 32, T = 3;
      auto obs = torch::randn({B, T, l.row_size()});
      obs.narrow(-1, l.avail_offset(), l.agents * l.num_actions).fill_(1.0);
      obs.select(-1, l.first_offset()).fill_(0.0);
      obs.select(1, 0).select(-1, l.first_offset()).fill_(1.0);
      auto last = torch::randn({B, l.row_size()});
      last.narrow(-1, l.avail_offset(), l.agents * l.num_actions).fill_(1.0);
      const EpisodeBatch b{obs.to(d), torch::randint(0, l.joint_actions(), {B, T}, torch::kLong).to(d),
                           torch::randn({B, T}).to(d), torch::zeros({B, T}).to(d), torch::ones({B, T}).to(d),
                           torch::full({B}, T, torch::kLong).to(d), last.to(d)};
      torch::manual_seed(100 + round);  // the same minibatch order on both sides
      const auto x = eager.update(b, ce);
      torch::manual_seed(100 + round);
      const auto y = graphed.update(b, cg);
      REQUIRE(x.metrics.size() == y.metrics.size());
      for (std::size_t k = 0; k < x.metrics.size(); ++k) {
        CHECK(x.metrics[k].first == y.metrics[k].first);
        CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(1e-4));
      }
    }
    CHECK(graphed.graphed_updates() > 0);
    CHECK(eager.graphed_updates() == 0);
    CHECK(close(eager.actor()->parameters(), graphed.actor()->parameters(), 1e-4, 1e-4));
    CHECK(close(eager.critic()->parameters(), graphed.critic()->parameters(), 1e-4, 1e-4));
    CHECK(close(eager.critic_target()->parameters(), graphed.critic_target()->parameters(), 1e-4, 1e-4));
    CHECK(cg.steps() == ce.steps());
  }
}

TEST_CASE("MultiTaskSAC on CUDA: a temperature per task and the tasks' loss weights in the graph match op by op (50 updates)") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  MultiTaskSAC::Config cfg;
  cfg.actor->hidden = {64, 64};
  cfg.critic->hidden = {64, 64};
  cfg.batch_size = 128;
  cfg.alpha_lr = 0.05;  // temperatures that move apart
  cfg.tasks->target_entropy_scales = {-3.0, 1.0, 30.0};
  auto spec = envs::spec_of(envs::Pendulum{});
  spec.tasks = {"a", "b", "c"};
  compare<MultiTaskSAC>(cfg, {}, 50, false, 1e-4, spec);
  cfg.tasks->loss_weights = true;
  cfg.actor_update_freq = 2;
  compare<MultiTaskSAC>(cfg, {}, 50, true, 1e-4, spec);
}

TEST_CASE("SAC on CUDA: a graph under BF16 autocast matches the same updates op by op") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  StepContext::Options so;
  so.autocast = true;
  so.autocast_dtype = at::kBFloat16;
  compare(small(), so, 20, false, 2e-2);
}

TEST_CASE("SAC on CUDA: gradient accumulation (3 micro-batches) in the graph matches op by op") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  StepContext::Options so;
  so.micro_batches = 3;
  auto cfg = small();
  cfg.batch_size = 120;
  compare(cfg, so, 50, true, 1e-4);
}

TEST_CASE("SAC on CUDA: acting replayed from CUDA graphs matches op by op (explore and mean, 16 and 3 envs, 50 acts, the weights updated between)") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  const c10::Device d(c10::kCUDA, 0);
  RunContext run;
  run.device = d;
  StepContext::Options so;
  so.device = d;
  auto cfg = small();
  const auto spec = envs::spec_of(envs::Pendulum{});
  SAC graphed = seeded<SAC>(cfg, spec, run, true);
  SAC eager = seeded<SAC>(cfg, spec, run, false);
  StepContext cg(so), ce(so);
  double worst = 0.0;
  for (int i = 0; i < 50; ++i) {
    torch::manual_seed(100 + i);
    const auto b = random_batch(cfg.batch_size, d, false);
    SAC::UpdateNoise noise{torch::randn({cfg.batch_size, 1}, b.obs.options()),
                           torch::randn({cfg.batch_size, 1}, b.obs.options())};
    eager.update(b, ce, noise);
    graphed.update(b, cg, noise);
    for (const std::int64_t envs : {16, 3}) {
      // observations on the host, as envs give them; each act draws its noise after the same seed
      const auto obs = torch::randn({envs, 3});
      for (const auto mode : {ActMode::explore, ActMode::deterministic}) {
        torch::manual_seed(1000 + i);
        const auto x = eager.act(obs, mode);
        torch::manual_seed(1000 + i);
        const auto y = graphed.act(obs, mode);
        REQUIRE(x.sizes() == y.sizes());
        worst = std::max(worst, ((x - y).abs() / (x.abs() + 1e-6)).max().item<double>());
        CHECK(torch::allclose(x, y, 1e-4, 1e-5));
      }
    }
  }
  MESSAGE("largest relative difference of an action: " << worst);
  CHECK(graphed.graphed_acts() > 0);
  CHECK(eager.graphed_acts() == 0);
}

TEST_CASE("SAC on CUDA: FP16 graphs hold the loss scaler's check, skip and new scale, and match op by op over 50 updates") {
  // The scaler's state lives on the GPU: a replay checks the gradients, skips a step whose
  // gradients overflowed float16 and backs the scale off, or counts it towards growth, with
  // no host decision. Starting at 2^24 the first steps overflow; growth every 5 finite steps
  // overflows again.
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  StepContext::Options so;
  so.autocast = true;
  so.autocast_dtype = at::kHalf;
  so.loss_scaling = LossScaler::Options{.init_scale = std::ldexp(1.0, 24), .growth_factor = 2.0, .backoff_factor = 0.5,
                                        .growth_interval = 5};
  auto cfg = small();
  cfg.max_grad_norm = 1.0;
  compare(cfg, so, 50, false, 1e-3);
}

TEST_CASE("DiffusionPolicy on CUDA: updates replayed from a CUDA graph match op by op, also after a new normalisation") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  RunContext run;
  run.device = c10::Device(c10::kCUDA, 0);
  EnvSpec spec;
  spec.name = "chunked";
  spec.observation = Box{std::vector<float>(6, -10.0f), std::vector<float>(6, 10.0f)};
  spec.action = Box{std::vector<float>(8, -1.0f), std::vector<float>(8, 1.0f)};
  DiffusionPolicy::Config c;
  c.obs_horizon = 2, c.horizon = 8, c.action_horizon = 4, c.widths = {32, 64}, c.step_embed = 32, c.kernel = 3, c.groups = 8;
  c.lr_warmup = 5;  // the learning rate changes every update at first: the graph reads it from the device
  c.max_grad_norm = 1.0;
  c.cuda_graph = true;
  torch::manual_seed(0);
  DiffusionPolicy graphed(spec, c, run);
  c.cuda_graph = false;
  torch::manual_seed(0);
  DiffusionPolicy eager(spec, c, run);
  for (auto* p : {&graphed, &eager}) {
    p->fit_normalizer(torch::full({3}, -1.0), torch::full({3}, 1.0), torch::full({2}, -1.0), torch::full({2}, 1.0));
    p->plan_updates(40);
  }
  StepContext::Options so;
  so.device = run.device;
  StepContext cg(so), ce(so);
  torch::manual_seed(3);
  for (int i = 0; i < 24; ++i) {
    if (i == 12)  // new ranges: the captured graph read the old normalisation's tensors
      for (auto* p : {&graphed, &eager})
        p->fit_normalizer(torch::full({3}, -2.0), torch::full({3}, 3.0), torch::full({2}, -1.5), torch::full({2}, 1.0));
    ReplayBatch b;  // on the host, as the demonstration loader gives them
    b.obs = torch::rand({32, 6}) * 2 - 1;
    b.action = torch::rand({32, 16}) * 2 - 1;
    torch::manual_seed(100 + i);
    const auto x = eager.update(b, ce);
    torch::manual_seed(100 + i);
    const auto y = graphed.update(b, cg);
    REQUIRE(x.metrics.size() == y.metrics.size());
    for (std::size_t k = 0; k < x.metrics.size(); ++k) {
      CHECK(x.metrics[k].first == y.metrics[k].first);
      CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(1e-4));
    }
  }
  CHECK(graphed.graphed_updates() > 12);
  CHECK(eager.graphed_updates() == 0);
  CHECK(torch::allclose(graphed.optimizer().parameters().flat(), eager.optimizer().parameters().flat(), 1e-4, 1e-5));
  CHECK(graphed.optimizer().steps() == eager.optimizer().steps());
  CHECK(cg.steps() == ce.steps());
}

TEST_CASE("SAC on CUDA: a restore drops the captured graphs, and the updates after it start from the restored weights and step counts") {
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  // A case like this one crashed on a GPU before restores dropped the graphs: the phase
  // reached is printed with any failure or crash.
  std::string phase = "setup";
  INFO("phase: " << phase);
  const c10::Device d(c10::kCUDA, 0);
  RunContext run;
  run.device = d;
  StepContext::Options so;
  so.device = d;
  StepContext ctx(so);
  const auto spec = envs::spec_of(envs::Pendulum{});
  torch::manual_seed(0);
  SAC sac(spec, small(), run);
  torch::manual_seed(9);
  std::vector<ReplayBatch> batches;
  std::vector<SAC::UpdateNoise> noise;
  for (int i = 0; i < 20; ++i) {
    batches.push_back(random_batch(128, d, false));
    noise.push_back({torch::randn({128, 1}, batches.back().obs.options()), torch::randn({128, 1}, batches.back().obs.options())});
  }
  phase = "the first 10 updates";
  for (int i = 0; i < 10; ++i) (void)sac.update(batches[static_cast<std::size_t>(i)], ctx, noise[static_cast<std::size_t>(i)]);
  REQUIRE(sac.graphed_updates() > 0);  // the graph is captured before the save
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_cuda_graph_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  phase = "save";
  {
    BinaryWriter w(dir / "sac.bin", "anvil SAC CUDA graph test");
    sac.save(w);
    w.commit();
  }
  auto rest = [&] {
    for (int i = 10; i < 20; ++i) (void)sac.update(batches[static_cast<std::size_t>(i)], ctx, noise[static_cast<std::size_t>(i)]);
    std::vector<at::Tensor> w;
    for (const auto& p : sac.actor()->parameters()) w.push_back(p.detach().clone());
    for (const auto& p : sac.critic()->parameters()) w.push_back(p.detach().clone());
    return w;
  };
  phase = "10 updates after the save";
  const auto first = rest();
  const auto steps = sac.critic_optimizer().steps();
  phase = "restore";
  {
    BinaryReader r(dir / "sac.bin", "anvil SAC CUDA graph test");
    sac.restore(sac.read(r));
  }
  CHECK(sac.critic_optimizer().steps() == steps - 10);
  phase = "the 10 updates again";
  const auto second = rest();  // the same updates again: two op by op, then a new graph
  CHECK(close(first, second, 1e-4, 1e-5));
  CHECK(sac.critic_optimizer().steps() == steps);
  phase = "end";
  std::filesystem::remove_all(dir);
}

TEST_CASE("CollectiveDistillation on CUDA: updates replayed from a CUDA graph match op by op over 50 updates, micro-batches included") {
  // The loader's batches are on the host: a replay's copy moves them into the graph's inputs.
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  const int h = 8, od = 6, ad = 3;
  const auto spec = test::history_spec(h, od, ad);
  RunContext run;
  run.device = c10::Device(c10::kCUDA, 0);
  for (const int micro : {1, 4}) {
    CAPTURE(micro);
    CollectiveDistillation::Config c;
    c.history = h;
    c.batch_size = 256;
    c.weight_decay = 0.01;
    c.net->d_model = 64;
    c.net->heads = 4;
    c.net->layers = 2;
    c.net->feedforward = 128;
    c.net->hidden = {128, 128};
    c.cuda_graph = true;
    torch::manual_seed(0);
    CollectiveDistillation graphed(spec, c, run);
    c.cuda_graph = false;
    torch::manual_seed(0);
    CollectiveDistillation eager(spec, c, run);
    StepContext::Options so;
    so.device = run.device;
    so.micro_batches = micro;
    StepContext cg(so), ce(so);
    torch::manual_seed(5);
    for (int i = 0; i < 50; ++i) {
      const auto b = test::random_windows(256, h, od, ad);
      const auto x = eager.update(b, ce);
      const auto y = graphed.update(b, cg);
      REQUIRE(x.metrics.size() == y.metrics.size());
      for (std::size_t k = 0; k < x.metrics.size(); ++k)
        CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(1e-4));
    }
    CHECK(graphed.graphed_updates() > 0);
    CHECK(eager.graphed_updates() == 0);
    // Every weight within 1e-4 but the attention's key bias, whose gradient softmax makes zero
    // but for float noise that Adam scales up (tests/algorithms/collective_test.cpp).
    const auto theirs = eager.network()->named_parameters();
    for (const auto& p : graphed.network()->named_parameters()) {
      CAPTURE(p.key());
      if (p.key().ends_with("qkv.bias")) {
        const auto d = p.value().size(0) / 3;
        CHECK(torch::allclose(p.value().narrow(0, 0, d), theirs[p.key()].narrow(0, 0, d), 1e-4, 1e-4));
        CHECK(torch::allclose(p.value().narrow(0, 2 * d, d), theirs[p.key()].narrow(0, 2 * d, d), 1e-4, 1e-4));
      } else {
        CHECK(torch::allclose(p.value(), theirs[p.key()], 1e-4, 1e-4));
      }
    }
    CHECK(graphed.optimizer().steps() == eager.optimizer().steps());
    CHECK(cg.steps() == ce.steps());
  }
}

TEST_CASE("DDP on CUDA: one rank's SAC graph holds the NCCL all-reduce (parallel.capture_all_reduce) and matches op by op") {
  // NCCL cannot put two ranks on one GPU: a world of one rank with its NCCL group
  // (even_alone) puts the all-reduce inside the graph where a multi-GPU run has it; whether
  // that is faster than op by op across GPUs waits for a machine with several.
  if (!torch::cuda::is_available()) ANVIL_SKIP("no CUDA device on this machine");
  if (!compat::has_nccl) ANVIL_SKIP("this LibTorch has no NCCL");
  const c10::Device d(c10::kCUDA, 0);
  dist::World w;
  dist::Group group(w, c10::make_intrusive<c10d::HashStore>(), d, DistBackend::nccl, std::chrono::seconds(60), "", 25,
                    /*even_alone=*/true);
  REQUIRE(group.backend() == DistBackend::nccl);
  StepContext::Options so;
  so.all_reduce_mean = [&](std::vector<at::Tensor>& ts) { group.all_reduce_mean(ts); };
  so.all_reduce_in_graph = true;
  compare(small(), so, 50, false, 1e-4);
}

TEST_SUITE_END();
