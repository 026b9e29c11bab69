// The Trainer end to end: real training runs with fixed seeds on the CPU.
#include <anvil/train/trainer.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <filesystem>
#include <fstream>

#include <anvil/anvil.hpp>

#include "../damaged_files.hpp"
#include "../temp_run_dir.hpp"
#include "../observe/tfevents.hpp"

using namespace anvil;

namespace {
using SacTrainer = Trainer<SAC, UniformBuffer>;

/// A small, quick SAC setup for Pendulum: 64x64 networks, lr 1e-3.
template <class T = SacTrainer>
typename T::Config pendulum_config(std::int64_t steps, const std::string& run) {
  typename T::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(run);
  c.run->progress = ProgressMode::off;
  c.run->log_interval = 5000;
  c.train->steps = steps;
  c.train->learning_starts = std::min<std::int64_t>(1000, steps / 2);
  c.train->eval_interval = 0;
  c.algorithm->actor->hidden = {64, 64};
  c.algorithm->critic->hidden = {64, 64};
  c.algorithm->actor_lr = 1e-3;
  c.algorithm->critic_lr = 1e-3;
  c.algorithm->alpha_lr = 1e-3;
  return c;
}

/// `pendulum_config` shrunk for tests of mechanics, not of learning: 16x16 networks, few
/// random steps, short evaluations.
template <class T = SacTrainer>
typename T::Config tiny_config(std::int64_t steps, const std::string& run, std::int64_t learning_starts = 200,
                               int eval_episodes = 1) {
  auto c = pendulum_config<T>(steps, run);
  c.train->learning_starts = learning_starts;
  c.train->eval_episodes = eval_episodes;
  c.algorithm->actor->hidden = {16, 16};
  c.algorithm->critic->hidden = {16, 16};
  return c;
}
}  // namespace

TEST_CASE("Trainer: two runs with the same seed on the CPU give identical returns and weights") {
  auto run = [](const std::string& name) {
    auto c = tiny_config(1200, name, 400, 2);
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

TEST_CASE("compiled::Trainer: a Trainer's config type, command line and run, bit for bit") {
  using Compiled = compiled::Trainer<SAC, UniformBuffer>;
  static_assert(std::same_as<Compiled::Config, SacTrainer::Config>);
  static_assert(std::same_as<Compiled::Full, SacTrainer>);
  static_assert(std::same_as<compiled::Trainer<SAC, PrioritizedBuffer, SingleDevice, BF16>::Full,
                             Trainer<SAC, PrioritizedBuffer, SingleDevice, BF16>>);
  auto c = tiny_config(1200, "compiled_full", 400, 2);
  c.run->seed = 5;
  // The command line reads into the same config either way.
  const std::vector<std::string> argv{"prog", "--sac.batch_size=32", "train.steps=900", "--seed=7"};
  const auto args = parse_args(argv);
  const auto from_compiled = start<Compiled>(args, c);
  const auto from_full = start<SacTrainer>(args, c);
  CHECK(to_yaml(from_compiled) == to_yaml(from_full));
  CHECK(from_compiled.algorithm->batch_size == 32);
  CHECK(from_compiled.train->steps == 900);
  CHECK(from_compiled.run->seed == 7u);

  SacTrainer full(envs::Pendulum{}, from_full);
  const auto r1 = full.fit();
  auto c2 = from_compiled;
  c2.run->run_dir = temp_run_dir("compiled_facade");
  Compiled facade(envs::Pendulum{}, c2);
  const auto r2 = facade.fit();
  CHECK(std::isfinite(r1.final_eval_return));
  CHECK(r1.final_eval_return == r2.final_eval_return);
  CHECK(r1.updates == r2.updates);
  CHECK(facade.config().train->steps == 900);
  CHECK(facade.run_dir() == std::filesystem::path(*c2.run->run_dir));
  CHECK(std::filesystem::exists(facade.run_dir() / "summary.json"));
  const auto a = full.algorithm().actor()->parameters(), b = facade.full().algorithm().actor()->parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  // The facade moves like a value, and evaluates and saves through the Trainer it holds.
  Compiled moved = std::move(facade);
  CHECK(moved.evaluate(1).episodes == 1);
  moved.save_policy(moved.run_dir() / "again.bin");
  CHECK(std::filesystem::file_size(moved.run_dir() / "again.bin") > 0);
}

TEST_CASE("compiled::Trainer: PPO on its rollout buffer, and an algorithm without a policy file says so") {
  using Compiled = compiled::Trainer<PPO, RolloutBuffer>;
  static_assert(std::same_as<Compiled::Loop, OnPolicyLoop>);
  static_assert(std::same_as<Compiled::Config, Trainer<PPO, RolloutBuffer>::Config>);
  Compiled::Config c;
  c.run->run_dir = temp_run_dir("compiled_ppo");
  c.run->progress = ProgressMode::off;
  c.train->steps = 2048;
  c.train->eval_interval = 0;
  c.train->eval_episodes = 2;
  c.env->num_envs = 4;
  c.buffer->steps = 128;
  Compiled t(envs::CartPole{}, c);
  const auto r = t.fit();
  CHECK(r.env_steps == 2048);
  CHECK(r.updates > 0);
  CHECK(std::isfinite(r.final_eval_return));
  CHECK_THROWS_WITH_AS(t.save_policy(t.run_dir() / "policy_again.bin"),
                       doctest::Contains("ppo writes no policy file of its own"), Error);
  // its policy is written as safetensors alone, with each checkpoint and through export_policy
  CHECK(std::filesystem::exists(t.run_dir() / "policy.safetensors"));
  CHECK_FALSE(std::filesystem::exists(t.run_dir() / "policy.bin"));
  t.export_policy(t.run_dir() / "exported");
  CHECK(std::filesystem::exists(t.run_dir() / "exported" / "policy.safetensors"));
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
  c.train->update->lr_scaling = LrScaling::sqrt;
  c.train->update->base_batch = 64;
  c.algorithm->batch_size = 256;
  SacTrainer t(envs::Pendulum{}, c);
  CHECK(t.context().lr_scale(256) == doctest::Approx(2.0));
  CHECK(t.algorithm().actor_optimizer().lr() == doctest::Approx(2.0 * 1e-3));
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
  CHECK(rows == 3);  // at 200, 400 and 600 (the last with the final evaluation): one row per logged step
  std::ifstream summary(dir / "summary.json");
  std::string s((std::istreambuf_iterator<char>(summary)), {});
  CHECK(s.find("\"env_steps\": 600") != std::string::npos);
  CHECK(s.find("\"config_hash\": \"" + t.config_hash() + "\"") != std::string::npos);
  CHECK(s.find("\"sac.batch_size\": 256,") != std::string::npos);  // typed
  CHECK(s.find("\"sac.actor.hidden\": [\n      8\n    ]") != std::string::npos);
  // How the gradients were taken: said when the run starts, in summary.json and config.yaml.
  // The products named as run.matmul resolved on this CPU (auto: anvil's on Intel AVX-512 cores).
  const std::string fast = std::string("actor and critics by hand-written passes (float32, ") +
                           (blas::own_matmul() ? "anvil's AVX-512 and BLAS products" : "BLAS products") +
                           ", vectorised loops)";
  CHECK(std::count(t.notes().begin(), t.notes().end(), "gradients: " + fast) == 1);
  CHECK(s.find("\"gradients\": \"" + fast + "\"") != std::string::npos);
  std::ifstream yaml(dir / "config.yaml");
  std::string y((std::istreambuf_iterator<char>(yaml)), {});
  CHECK(y.find("# gradients: " + fast + "\n") != std::string::npos);
  SacTrainer::Config back;
  apply_settings(back, parse_yaml(y, "config.yaml"));
  CHECK(config_hash(back) == config_hash(t.config()));
  // One config, one hash: the run's files, the Trainer and the config read back agree.
  CHECK(config_hash_hex(back) == t.config_hash());
  CHECK(y.find("config hash " + t.config_hash()) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: SAC reaches a mean eval return of at least -250 on Pendulum within 15,000 steps" * doctest::test_suite("learning")) {
  auto c = pendulum_config(15000, "learn");
  c.run->seed = learning_seed(1);
  SacTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return << " after " << r.env_steps << " steps");
  CHECK(r.final_eval_return >= -250.0);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: Trainer<SAC, PrioritizedBuffer> learns Pendulum with no extra code" * doctest::test_suite("learning")) {
  using PerTrainer = Trainer<SAC, PrioritizedBuffer>;
  auto c = pendulum_config<PerTrainer>(15000, "learn_per");
  c.run->seed = learning_seed(1);  // the seed of the uniform-buffer test above
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

TEST_CASE("Trainer: Trainer<SAC, UniformBuffer, SingleDevice, BF16> learns Pendulum on the CPU to the FP32 bar" * doctest::test_suite("learning")) {
  using Bf16Trainer = Trainer<SAC, UniformBuffer, SingleDevice, BF16>;
  auto c = pendulum_config<Bf16Trainer>(15000, "learn_bf16");
  c.run->seed = learning_seed(1);  // the seed of the FP32 test above
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

TEST_CASE("Trainer: a run says why its networks take autograd instead of the hand-written passes") {
  auto says = [](const std::vector<std::string>& notes, const std::string& line) {
    return std::count(notes.begin(), notes.end(), "gradients: " + line) == 1;
  };
  {
    auto c = pendulum_config(100, "gradients_off");
    c.algorithm->manual_backward = false;
    SacTrainer t(envs::Pendulum{}, c);
    CHECK(says(t.notes(), "actor and critics by autograd (sac.manual_backward=false)"));
  }
  {
    auto c = pendulum_config(100, "gradients_gelu");
    c.algorithm->actor->activation = nn::Activation::gelu;
    SacTrainer t(envs::Pendulum{}, c);
    CHECK(says(t.notes(), "actor and critics by autograd (the actor's activation gelu has no hand-written derivative)"));
  }
  {
    using Bf16Trainer = Trainer<SAC, UniformBuffer, SingleDevice, BF16>;
    Bf16Trainer t(envs::Pendulum{}, pendulum_config<Bf16Trainer>(100, "gradients_bf16"));
    CHECK(says(t.notes(), "actor and critics by autograd (bf16 autocast; the hand-written passes are float32)"));
  }
}

TEST_CASE("Trainer: update_interval=10 with updates_per_interval=10 also learns Pendulum" * doctest::test_suite("learning")) {
  auto c = pendulum_config(15000, "learn10");
  c.run->seed = learning_seed(2);
  c.train->update_interval = 10;
  c.train->updates_per_interval = 10;
  SacTrainer t(envs::Pendulum{}, c);
  auto r = t.fit();
  MESSAGE("final eval return " << r.final_eval_return);
  CHECK(r.final_eval_return >= -250.0);
  std::filesystem::remove_all(*c.run->run_dir);
}

namespace {
template <class T>
std::vector<at::Tensor> weights_of(T& t) {
  std::vector<at::Tensor> w;
  for (auto& p : t.algorithm().actor()->parameters()) w.push_back(p.detach().clone());
  for (auto& p : t.algorithm().critic()->parameters()) w.push_back(p.detach().clone());
  for (auto& p : t.algorithm().critic_target()->parameters()) w.push_back(p.detach().clone());
  return w;
}
bool bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}
}  // namespace

TEST_CASE("Trainer: resuming from a checkpoint with its buffer continues bitwise like the uninterrupted run") {
  auto c = tiny_config(2400, "resume_a", 400, 2);
  c.run->seed = 5;
  c.run->checkpoint_interval = 1200;
  c.run->checkpoint_buffer = true;
  SacTrainer a(envs::Pendulum{}, c);
  a.fit();
  const auto ckpt = std::filesystem::path(*c.run->run_dir) / "checkpoint-000000001200.ckpt";
  REQUIRE(std::filesystem::exists(ckpt));
  CHECK(std::filesystem::exists(std::filesystem::path(*c.run->run_dir) / "checkpoint-000000001200.buffer"));
  CHECK(std::filesystem::exists(std::filesystem::path(*c.run->run_dir) / "checkpoint-000000002400.ckpt"));

  auto rc = c;
  rc.run->run_dir = temp_run_dir("resume_b");
  rc.run->resume = ckpt.string();
  SacTrainer b(envs::Pendulum{}, rc);
  b.fit();
  CHECK(b.resumed_from() == ckpt);
  CHECK(b.env_steps() == a.env_steps());
  CHECK(b.updates() == a.updates());
  CHECK(bitwise_equal(weights_of(a), weights_of(b)));
  CHECK(b.algorithm().alpha() == a.algorithm().alpha());

  // Without the resume, the same second half gives other weights: the test can tell.
  auto fresh = c;
  fresh.run->run_dir = temp_run_dir("resume_c");
  fresh.run->seed = 6;
  SacTrainer f(envs::Pendulum{}, fresh);
  f.fit();
  CHECK_FALSE(bitwise_equal(weights_of(a), weights_of(f)));
  for (const auto& d : {*c.run->run_dir, *rc.run->run_dir, *fresh.run->run_dir}) std::filesystem::remove_all(d);
}

TEST_CASE("Trainer: bad checkpoints are refused with the reason and change nothing") {
  auto c = tiny_config(600, "bad_ckpt");
  SacTrainer a(envs::Pendulum{}, c);
  a.fit();
  const auto dir = std::filesystem::path(*c.run->run_dir);
  const auto ckpt = dir / "checkpoint-000000000600.ckpt";
  REQUIRE(std::filesystem::exists(ckpt));

  // Another network shape: the error names the field and both values.
  auto wide = c;
  wide.algorithm->critic->hidden = {32, 16};
  SacTrainer w(envs::Pendulum{}, wide);
  const auto before = weights_of(w);
  CHECK_THROWS_WITH_AS(w.load_checkpoint(ckpt),
                       doctest::Contains("was written by a run with sac.critic.hidden = [16, 16]; this run has "
                                         "sac.critic.hidden = [32, 16]"),
                       Error);
  CHECK(bitwise_equal(before, weights_of(w)));
  CHECK(w.env_steps() == 0);

  // Another precision: named.
  using Bf16Trainer = Trainer<SAC, UniformBuffer, SingleDevice, BF16>;
  Bf16Trainer bf(envs::Pendulum{}, pendulum_config<Bf16Trainer>(600, "bad_ckpt_bf16"));
  CHECK_THROWS_WITH_AS(bf.load_checkpoint(ckpt), doctest::Contains("was written by a run in fp32 precision; this run is bf16"),
                       Error);
  CHECK(bf.env_steps() == 0);

  // A flipped byte: the checksum refuses it.
  SacTrainer b(envs::Pendulum{}, c);
  const auto b_before = weights_of(b);
  CHECK_THROWS_WITH_AS(b.load_checkpoint(test::copy_with_flipped_bit(ckpt, dir / "flipped.ckpt", -100)),
                       doctest::Contains("(corrupted file?)"), Error);
  CHECK(bitwise_equal(b_before, weights_of(b)));
  // Truncated, and missing.
  CHECK_THROWS_WITH_AS(b.load_checkpoint(test::copy_truncated(ckpt, dir / "cut.ckpt", std::filesystem::file_size(ckpt) / 2)), doctest::Contains("(truncated file?)"), Error);
  CHECK_THROWS_WITH_AS(b.load_checkpoint(dir / "none.ckpt"), doctest::Contains("run.resume: no checkpoint at"), Error);
  CHECK(b.env_steps() == 0);
  // A good one loads.
  b.load_checkpoint(ckpt);
  CHECK(b.env_steps() == 600);
  CHECK(bitwise_equal(weights_of(a), weights_of(b)));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: checkpoints every checkpoint_interval steps, keep_last of them, and resume=auto takes the latest") {
  auto c = tiny_config(1000, "keep_last");
  c.run->checkpoint_interval = 200;
  c.run->keep_last = 2;
  SacTrainer a(envs::Pendulum{}, c);
  a.fit();
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(*c.run->run_dir))
    if (e.path().extension() == ".ckpt") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"checkpoint-000000000800.ckpt", "checkpoint-000000001000.ckpt"});

  auto more = c;
  more.train->steps = 1200;
  more.run->resume = "auto";
  SacTrainer b(envs::Pendulum{}, more);
  b.fit();
  CHECK(b.resumed_from().filename() == "checkpoint-000000001000.ckpt");
  CHECK(b.env_steps() == 1200);
  // metrics.csv continues: one header, rows up to 1200 steps.
  std::ifstream csv(std::filesystem::path(*c.run->run_dir) / "metrics.csv");
  std::string line;
  int headers = 0;
  double last = 0;
  while (std::getline(csv, line)) {
    if (line.rfind("env_steps", 0) == 0) ++headers;
    else if (!line.empty()) last = std::stod(line.substr(0, line.find(',')));
  }
  CHECK(headers == 1);
  CHECK(last == 1200);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: ema_decay keeps an average of the policy, evaluates with it, and load_policy acts without a trainer") {
  auto c = tiny_config(1200, "ema", 400);
  c.train->update->ema_decay = 0.9;
  SacTrainer t(envs::Pendulum{}, c);
  // The average follows ema = d ema + (1 - d) w after each update, from the first weights.
  auto& sac = t.algorithm();
  const auto flat = [&] {
    std::vector<at::Tensor> parts;
    for (auto& p : sac.actor()->parameters()) parts.push_back(p.detach().reshape(-1));
    return torch::cat(parts);
  };
  t.collect(600);
  t.update(1);
  at::Tensor expected = flat();
  for (int i = 0; i < 5; ++i) {
    t.update(1);
    expected = 0.9 * expected + 0.1 * flat();
  }
  REQUIRE(sac.ema_weights().defined());
  CHECK(torch::allclose(sac.ema_weights(), expected, 1e-5, 1e-7));
  // Evaluation swaps the average in and the trained weights back.
  const auto trained = flat();
  const auto with_ema = sac.with_ema_weights([&] { return flat(); });
  CHECK(torch::equal(with_ema, sac.ema_weights()));
  CHECK(torch::equal(flat(), trained));

  t.fit();
  const auto file = std::filesystem::path(*c.run->run_dir) / "policy.bin";
  REQUIRE(std::filesystem::exists(file));
  const Policy p = load_policy(file);
  CHECK(p.env_name() == "Pendulum-v1");
  CHECK(p.obs_dim() == 3);
  const auto obs = torch::randn({5, 3});
  const auto ours = sac.with_ema_weights([&] { return sac.act(obs, ActMode::deterministic); }) * 2.0;  // bounds +-2
  CHECK(torch::allclose(p.act(obs), ours, 1e-6, 1e-6));
  CHECK(p.act(obs[0]).sizes() == std::vector<std::int64_t>{1});
  // A damaged policy file is refused.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  CHECK_THROWS_WITH_AS((void)load_policy(file), doctest::Contains("(truncated file?)"), Error);
  std::filesystem::remove_all(*c.run->run_dir);
}

namespace {
// An env whose type is not trivially copyable (a user env with a vector member).
struct LoggingPendulum : envs::Pendulum {
  std::vector<float> log;
};
}  // namespace

TEST_CASE("Trainer: an env that cannot be saved as bytes still checkpoints, a resumed run starts new episodes") {
  auto c = tiny_config(600, "untyped_env");
  SacTrainer a(LoggingPendulum{}, c);
  CHECK(std::count_if(a.notes().begin(), a.notes().end(),
                      [](const std::string& n) { return n.find("state cannot be saved") != std::string::npos; }) == 1);
  a.fit();
  auto more = c;
  more.train->steps = 800;
  more.run->resume = "auto";
  SacTrainer b(LoggingPendulum{}, more);
  b.fit();
  CHECK(b.resumed_from().filename() == "checkpoint-000000000600.ckpt");
  CHECK(b.env_steps() == 800);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Trainer: a run's TensorBoard events hold its metrics at its log steps, every record's CRC intact") {
  auto c = tiny_config(1200, "tensorboard_events", 400, 2);
  c.run->log_interval = 400;
  c.train->eval_interval = 600;
  c.run->tensorboard_histograms = true;
  SacTrainer t(envs::Pendulum{}, c);
  const auto r = t.fit();
  std::filesystem::path events;
  for (const auto& e : std::filesystem::directory_iterator(t.run_dir()))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path();
  REQUIRE_FALSE(events.empty());
  const auto all = test::scalars(events);  // checks both CRCs of every record
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> by_tag;
  for (const auto& s : all) by_tag[s.tag].emplace_back(s.step, s.value);
  for (const char* tag : {"return/eval", "return/recent", "sac/critic_loss", "sac/alpha", "lr/actor", "lr/critic",
                          "speed/env_steps_per_s", "speed/updates_per_s", "time/env", "time/update"})
    CHECK_MESSAGE(by_tag.count(tag) == 1, tag);
  // Rows at 400, 800 and 1200.
  REQUIRE(by_tag["return/recent"].size() == 3);
  CHECK(by_tag["return/recent"].back().first == 1200);
  // Evaluations at the steps they ran (600 and the end), with their spread: not at every row.
  REQUIRE(by_tag["return/eval"].size() == 2);
  CHECK(by_tag["return/eval"][0].first == 600);
  CHECK(by_tag["return/eval"][1].first == 1200);
  CHECK(by_tag["return/eval"].back().second == doctest::Approx(r.final_eval_return).epsilon(1e-6));
  for (const char* tag : {"return/eval_std", "return/eval_min", "return/eval_max"}) CHECK_MESSAGE(by_tag[tag].size() == 2, tag);
  CHECK(by_tag["return/eval_min"][1].second <= by_tag["return/eval"][1].second);
  CHECK(by_tag["return/eval_max"][1].second >= by_tag["return/eval"][1].second);
  // Each training episode (Pendulum's are 200 steps) at the env step it ended.
  REQUIRE(by_tag["episode/return"].size() == 6);
  REQUIRE(by_tag["episode/length"].size() == 6);
  for (int i = 0; i < 6; ++i) {
    CHECK(by_tag["episode/return"][static_cast<std::size_t>(i)].first == 200 * (i + 1));
    CHECK(by_tag["episode/length"][static_cast<std::size_t>(i)].second == 200);
  }
  CHECK(by_tag["lr/actor"].back().second == doctest::Approx(*c.algorithm->actor_lr));
  // The phase shares of a row add up to 1.
  double sum = 0;
  for (const auto& name : kPhaseNames) sum += by_tag["time/" + std::string(name)].back().second;
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-4));
  // And the histograms are there (2 records per row: actor, critic), beside the file's version
  // record and the two text summaries (the resolved config and the provenance).
  CHECK(test::records(events).size() == all.size() + 1 + 2 + 2 * 3);
}

namespace {
// Pendulum whose rewards become huge (finite, so the env check passes) after 700 steps:
// the critic's squared error overflows to inf.
struct ExplodingPendulum : envs::Pendulum {
  static constexpr std::string_view name = "ExplodingPendulum";
  int steps = 0;
  envs::StepResult step(std::span<const float> a) {
    auto r = Pendulum::step(a);
    if (++steps > 700) r.reward = 1e30;
    return r;
  }
};
}  // namespace

TEST_CASE("Trainer: a non-finite loss stops the run naming it, nothing is saved from its weights") {
  auto c = tiny_config(3000, "nonfinite_loss");
  c.run->checkpoint_interval = 600;
  SacTrainer t(ExplodingPendulum{}, c);
  CHECK_THROWS_WITH_AS(t.fit(), doctest::Contains("sac: critic_loss is inf at gradient update"), Error);
  const auto dir = t.run_dir();
  std::vector<std::string> ckpts;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".ckpt") ckpts.push_back(e.path().filename().string());
  CHECK(ckpts == std::vector<std::string>{"checkpoint-000000000600.ckpt"});
  // policy.bin is the one written at step 600: finite, and it loads.
  const auto policy = load_policy(dir / "policy.bin");
  const auto act = policy.act(torch::zeros({1, 3}));
  CHECK(torch::isfinite(act).all().item<bool>());
  // Resuming from the last checkpoint works.
  SacTrainer r(ExplodingPendulum{}, c);
  r.load_checkpoint(dir / "checkpoint-000000000600.ckpt");
  CHECK(r.env_steps() == 600);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: a program compiled without optimisation says so when the run starts") {
  auto c = tiny_config(600, "unoptimised");
  SacTrainer t(envs::Pendulum{}, c);
  bool warned = false;
  for (const auto& n : t.notes()) warned = warned || n.find("compiled without optimisation") != std::string::npos;
  CHECK(warned == !compiled_optimised());
#if defined(__OPTIMIZE__)
  CHECK(compiled_optimised());
#else
  CHECK_FALSE(compiled_optimised());
#endif
}

TEST_CASE("Trainer: FP32 and TF32 runs of the same config get different config hashes") {
  using Tf32Trainer = Trainer<SAC, UniformBuffer, SingleDevice, TF32>;
  auto hash_of = [](const std::filesystem::path& dir) {
    std::ifstream in(dir / "config.yaml");
    std::string first;
    std::getline(in, first);  // "# <program>, config hash <hash>"
    return first.substr(first.rfind(' ') + 1);
  };
  auto a = tiny_config(300, "hash_fp32");
  SacTrainer fp32(envs::Pendulum{}, a);
  fp32.fit();
  auto b = tiny_config<Tf32Trainer>(300, "hash_tf32");
  Tf32Trainer tf32(envs::Pendulum{}, b);
  tf32.fit();
  CHECK(hash_of(fp32.run_dir()).size() == 16);
  CHECK(hash_of(fp32.run_dir()) != hash_of(tf32.run_dir()));
  std::filesystem::remove_all(fp32.run_dir());
  std::filesystem::remove_all(tf32.run_dir());
}

TEST_CASE("Trainer: envs that come batched train through the same door as an Env type, to the same weights") {
  // A maker of batched envs (as a Python vector env will be) of the same Pendulum: the same
  // seeds, so the same run, bit for bit.
  auto c = tiny_config(900, "door_type", 300, 1);
  c.env->num_envs = 2;
  SacTrainer typed(envs::Pendulum{}, c);
  typed.fit();
  auto b = c;
  b.run->run_dir = temp_run_dir("door_batched");
  int made = 0;
  envs::AnyEnv batched("Pendulum-v1", [&made](const envs::VecEnvConfig& vc, std::uint64_t seed, std::int64_t first,
                                              std::int64_t count) {
    ++made;
    return envs::make_vec_env(envs::Pendulum{}, vc, seed, first, count);
  });
  SacTrainer fromvec(batched, b);
  fromvec.fit();
  CHECK(made >= 2);  // the training envs and the evaluation's
  CHECK(bitwise_equal(weights_of(typed), weights_of(fromvec)));
  // A maker that makes another number of envs than env.num_envs is refused, naming the field.
  envs::AnyEnv wrong("Pendulum-v1", [](const envs::VecEnvConfig& vc, std::uint64_t seed, std::int64_t, std::int64_t) {
    auto one = vc;
    one.num_envs = 1;
    return envs::make_vec_env(envs::Pendulum{}, one, seed);
  });
  auto w = c;
  w.run->run_dir = temp_run_dir("door_wrong");
  CHECK_THROWS_WITH_AS(SacTrainer(wrong, w), doctest::Contains("env.num_envs=2: Pendulum-v1's maker made 1"), ConfigError);
  for (const auto& d : {*c.run->run_dir, *b.run->run_dir, *w.run->run_dir}) std::filesystem::remove_all(d);
}

// Learning from pixels in ctest's time: PixelPendulum-v1 drawn at 32x32 (docs/pixels.md; the
// task's own 64x64 in benchmarks/RESULTS.md), the small encoder 8 wide, DrQ's random shift
// scaled to the image (2 pixels), learning rates 1e-3 (the state Pendulum's), one update
// thread so the seed fixes the run. About 60 s on one core of this machine class; seeds 1, 2
// and 3 were at -207, -330 and -153 after 4,000 agent steps and -184, -229, -174 after 6,000.
TEST_CASE("Trainer: SAC learns PixelPendulum-v1 from 32x32 images with random shift (eval above -600 within 5,000 agent steps)" * doctest::test_suite("learning")) {
  SacTrainer::Config c;
  learning_test_run(*c.run, "sac_pixels", 1000, 1);
  c.train->steps = 5000;
  c.train->eval_interval = 0;
  c.train->eval_episodes = 5;
  c.buffer->capacity = 20'000;
  c.algorithm->batch_size = 64;
  c.algorithm->actor_lr = 1e-3;
  c.algorithm->critic_lr = 1e-3;
  c.algorithm->alpha_lr = 1e-3;
  c.algorithm->encoder->width = 8;
  c.algorithm->encoder->shift = 2;
  SacTrainer t(envs::PixelPendulum(envs::PixelOptions{.size = 32}), c);
  const auto r = t.fit();
  MESSAGE("SAC from 32x32 pixels: final eval " << r.final_eval_return << " after " << r.env_steps << " agent steps, "
                                                << r.wall_seconds << " s");
  CHECK(r.env_steps == 5000);
  CHECK(r.final_eval_return >= -600.0);  // uniform random actions: -1,215 (RESULTS.md)
  std::filesystem::remove_all(*c.run->run_dir);
}
