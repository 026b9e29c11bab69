// The Trainer end to end: real training runs with fixed seeds on the CPU.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <anvil/anvil.hpp>

using namespace anvil;

namespace {
using SacTrainer = Trainer<SAC, UniformBuffer>;

std::string temp_run_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("anvil_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

/// A small, quick SAC setup for Pendulum: 64x64 networks, lr 1e-3.
template <class T = SacTrainer>
typename T::Config pendulum_config(std::int64_t steps, const std::string& run) {
  typename T::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(run);
  c.run->progress = ProgressMode::off;
  c.run->log_interval = 5000;
  c.train->steps = steps;
  c.train->eval_interval = 0;
  c.algorithm->actor->hidden = {64, 64};
  c.algorithm->critic->hidden = {64, 64};
  c.algorithm->actor_lr = 1e-3;
  c.algorithm->critic_lr = 1e-3;
  c.algorithm->alpha_lr = 1e-3;
  return c;
}
}  // namespace

TEST_CASE("Trainer: two runs with the same seed on the CPU give identical returns and weights") {
  auto run = [](const std::string& name) {
    auto c = pendulum_config(1200, name);
    c.train->learning_starts = 400;
    c.train->eval_episodes = 2;
    c.algorithm->actor->hidden = {16, 16};
    c.algorithm->critic->hidden = {16, 16};
    c.run->seed = 11;
    SacTrainer t(envs::Pendulum{}, c);
    auto r = t.fit();
    std::vector<at::Tensor> w;
    for (auto& p : t.algorithm().actor()->parameters()) w.push_back(p.detach().clone());
    return std::make_tuple(r, std::vector<double>(t.recent_returns().begin(), t.recent_returns().end()), w);
  };
  auto [r1, ret1, w1] = run("det1");
  auto [r2, ret2, w2] = run("det2");
  CHECK(r1.final_eval_return == r2.final_eval_return);
  CHECK(ret1 == ret2);
  REQUIRE(w1.size() == w2.size());
  for (std::size_t i = 0; i < w1.size(); ++i) CHECK(torch::equal(w1[i], w2[i]));
}

TEST_CASE("Trainer: update_interval and updates_per_interval set the update-to-data ratio") {
  auto c = pendulum_config(1000, "utd");
  c.train->learning_starts = 200;
  c.train->update_interval = 10;
  c.train->updates_per_interval = 3;
  c.env->num_envs = 2;
  c.algorithm->actor->hidden = {8};
  c.algorithm->critic->hidden = {8};
  c.algorithm->batch_size = 64;  // updates wait for learning_starts and for one whole batch
  SacTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  // Updates start at 200 steps; each vector step adds 2 env steps: 800 steps / 10 * 3.
  CHECK(r.updates == 240);
  CHECK(r.env_steps == 1000);
}

TEST_CASE("Trainer: lr_scaling=sqrt scales every learning rate by sqrt(batch / base_batch)") {
  auto c = pendulum_config(10, "lr");
  c.train->lr_scaling = LrScaling::sqrt;
  c.train->base_batch = 64;
  c.algorithm->batch_size = 256;
  SacTrainer t(envs::Pendulum{}, c);
  CHECK(t.context().lr_scale == doctest::Approx(2.0));
}

TEST_CASE("Trainer: fit writes config.yaml, metrics.csv and summary.json in the run directory") {
  auto c = pendulum_config(600, "files");
  c.train->learning_starts = 300;
  c.run->log_interval = 200;
  c.train->eval_episodes = 2;
  c.algorithm->actor->hidden = {8};
  c.algorithm->critic->hidden = {8};
  SacTrainer t(envs::Pendulum{}, c);
  t.fit();
  const auto dir = std::filesystem::path(*c.run->run_dir);
  std::ifstream csv(dir / "metrics.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header.find("env_steps,updates,wall_s,env_steps_per_s") == 0);
  CHECK(header.find("critic_loss") != std::string::npos);
  CHECK(header.find("alpha") != std::string::npos);
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 4);  // at 200, 400, 600 and the final row
  std::ifstream summary(dir / "summary.json");
  std::string s((std::istreambuf_iterator<char>(summary)), {});
  CHECK(s.find("\"env_steps\": 600") != std::string::npos);
  CHECK(s.find("\"config_hash\": \"" + config_hash_hex(t.config()) + "\"") != std::string::npos);
  CHECK(s.find("\"sac.batch_size\": \"256\"") != std::string::npos);
  std::ifstream yaml(dir / "config.yaml");
  std::string y((std::istreambuf_iterator<char>(yaml)), {});
  SacTrainer::Config back;
  apply_settings(back, parse_yaml(y, "config.yaml"));
  CHECK(config_hash(back) == config_hash(t.config()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: SAC reaches a mean eval return of at least -250 on Pendulum within 15,000 steps") {
  auto c = pendulum_config(15000, "learn");
  c.run->seed = 1;
  SacTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return << " after " << r.env_steps << " steps");
  CHECK(r.final_eval_return >= -250.0);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: Trainer<SAC, PrioritizedBuffer> learns Pendulum with no extra code") {
  using PerTrainer = Trainer<SAC, PrioritizedBuffer>;
  auto c = pendulum_config<PerTrainer>(15000, "learn_per");
  c.run->seed = 1;  // the seed of the uniform-buffer test above
  PerTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return);
  CHECK(r.final_eval_return >= -250.0);
  // The Trainer fed TD errors back: priorities are no longer all the initial 1.0, and beta
  // reached 1 at the end of the run.
  CHECK(t.buffer().total_priority() != doctest::Approx(static_cast<double>(t.buffer().size())));
  CHECK(t.buffer().beta() == doctest::Approx(1.0));
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: Trainer<SAC, UniformBuffer, SingleDevice, BF16> learns Pendulum on the CPU to the FP32 bar") {
  using Bf16Trainer = Trainer<SAC, UniformBuffer, SingleDevice, BF16>;
  auto c = pendulum_config<Bf16Trainer>(15000, "learn_bf16");
  c.run->seed = 1;  // the seed of the FP32 test above
  Bf16Trainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return);
  CHECK(r.final_eval_return >= -250.0);
  // The master weights stayed float32.
  for (const auto& p : t.algorithm().critic()->parameters()) CHECK((p.scalar_type() == torch::kFloat));
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: precision settings are applied once at construction, and TF32 on the CPU says it is FP32") {
  using Tf32Trainer = Trainer<SAC, UniformBuffer, SingleDevice, TF32>;
  auto c = pendulum_config<Tf32Trainer>(100, "precision_settings");
  c.precision->detect_anomaly = true;
  c.precision->cudnn_benchmark = false;
  {
    Tf32Trainer t(envs::Pendulum{}, c);
    CHECK(torch::autograd::AnomalyMode::is_enabled());
    CHECK_FALSE(at::globalContext().benchmarkCuDNN());
    CHECK(std::count(t.notes().begin(), t.notes().end(),
                     "precision: TF32 changes only CUDA matrix products; on the CPU this run is FP32") == 1);
    CHECK(std::count(t.notes().begin(), t.notes().end(),
                     "precision: autograd anomaly detection is on (slow; for debugging NaNs)") == 1);
  }
  // The defaults: cuDNN benchmark mode on, anomaly detection off, nothing said about TF32.
  SacTrainer d(envs::Pendulum{}, pendulum_config(100, "precision_defaults"));
  CHECK_FALSE(torch::autograd::AnomalyMode::is_enabled());
  CHECK(at::globalContext().benchmarkCuDNN());
  for (const auto& n : d.notes()) CHECK(n.find("precision:") == std::string::npos);
}

TEST_CASE("Trainer: update_interval=10 with updates_per_interval=10 also learns Pendulum") {
  auto c = pendulum_config(15000, "learn10");
  c.run->seed = 2;
  c.train->update_interval = 10;
  c.train->updates_per_interval = 10;
  SacTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return);
  CHECK(r.final_eval_return >= -250.0);
  std::filesystem::remove_all(*c.run->run_dir);
}
