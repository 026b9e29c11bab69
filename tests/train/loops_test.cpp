// The loops beyond the two the shipped algorithms use by default: async collection in the
// off-policy loop, the offline loop over a dataset on disk, Staged (offline, then online,
// the stage kept in checkpoints), and the episodic loop with a policy-gradient algorithm
// written here. Real training runs with fixed seeds on the CPU.
#include <anvil/train/loops/on_policy.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <anvil/anvil.hpp>

#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

using SacTrainer = Trainer<SAC, UniformBuffer>;

/// A quick SAC setup for Pendulum: 32x32 networks, lr 1e-3.
template <class T = SacTrainer>
typename T::Config sac_config(const std::string& run) {
  typename T::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(run);
  c.run->progress = ProgressMode::off;
  c.algorithm->actor->hidden = {32, 32};
  c.algorithm->critic->hidden = {32, 32};
  c.algorithm->actor_lr = 1e-3;
  c.algorithm->critic_lr = 1e-3;
  c.algorithm->alpha_lr = 1e-3;
  c.algorithm->batch_size = 64;
  c.buffer->capacity = 10'000;
  return c;
}

std::vector<at::Tensor> weights_of(SAC& s) {
  return {s.actor_optimizer().parameters().flat().clone(), s.critic_optimizer().parameters().flat().clone(),
          s.critic_optimizer().exp_avg_sq().clone()};
}
bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return a.size() == b.size();
}

// A buffer file (what run.checkpoint_buffer writes beside a checkpoint) of 2,000 Pendulum
// transitions collected by a short SAC run: the dataset of the offline tests.
std::filesystem::path pendulum_dataset() {
  static const std::filesystem::path file = [] {
    auto c = sac_config("dataset");
    c.train->steps = 2000;
    c.train->learning_starts = 500;
    c.train->eval_interval = 0;
    c.train->eval_episodes = 1;
    c.run->checkpoint_interval = 0;
    c.run->checkpoint_buffer = true;
    SacTrainer t(envs::Pendulum{}, c);
    t.fit();
    return std::filesystem::path(*c.run->run_dir) / "checkpoint-000000002000.buffer";
  }();
  return file;
}

}  // namespace

TEST_CASE("OffPolicyLoop: env.mode=async takes the same steps and updates, leaves nothing in flight at hooks, and resumes bitwise") {
  auto c = sac_config("async_a");
  c.env->mode = envs::VecMode::async;
  c.env->num_envs = 2;
  c.train->steps = 1600;
  c.train->learning_starts = 400;
  c.train->eval_interval = 400;
  c.train->eval_episodes = 1;
  c.run->log_interval = 200;
  c.run->checkpoint_interval = 800;
  c.run->checkpoint_buffer = true;
  c.run->seed = 3;
  SacTrainer a(envs::Pendulum{}, c);
  const auto ra = a.fit();
  CHECK(ra.env_steps == 1600);
  CHECK(ra.updates == 2 * 601);  // two per iteration (one per env) from 400 to 1600 env steps
  CHECK(std::filesystem::exists(std::filesystem::path(*c.run->run_dir) / "checkpoint-000000000800.ckpt"));

  // A run resumed from the checkpoint at 800 (taken between steps, none in flight)
  // continues exactly as the uninterrupted one.
  auto rc = c;
  rc.run->run_dir = temp_run_dir("async_b");
  rc.run->resume = (std::filesystem::path(*c.run->run_dir) / "checkpoint-000000000800.ckpt").string();
  SacTrainer b(envs::Pendulum{}, rc);
  b.fit();
  CHECK(b.updates() == a.updates());
  CHECK(same(weights_of(a.algorithm()), weights_of(b.algorithm())));

  // Sync and async take the same data but act with different policies (async one round of
  // updates behind): the runs differ.
  auto sc = c;
  sc.env->mode = envs::VecMode::sync;
  sc.run->run_dir = temp_run_dir("async_sync");
  sc.run->checkpoint_interval = 0;
  SacTrainer s(envs::Pendulum{}, sc);
  const auto rs = s.fit();
  CHECK(rs.updates == ra.updates);
  CHECK_FALSE(same(weights_of(a.algorithm()), weights_of(s.algorithm())));
  for (const auto& d : {*c.run->run_dir, *rc.run->run_dir, *sc.run->run_dir}) std::filesystem::remove_all(d);
}

TEST_CASE("OfflineLoop: learns values from a buffer file without stepping the envs, its clock counts gradient updates") {
  using Offline = Trainer<SAC, UniformBuffer, SingleDevice, FP32, OfflineLoop>;
  auto c = sac_config<Offline>("offline");
  c.train->dataset = pendulum_dataset().string();
  c.train->steps = 300;
  c.train->eval_interval = 100;
  c.train->eval_episodes = 1;
  c.run->log_interval = 100;
  c.run->checkpoint_interval = 200;
  Offline t(envs::Pendulum{}, c);
  CHECK(t.buffer().size() == 2000);  // the dataset, read when the run was built
  const auto untrained = weights_of(t.algorithm());
  const auto r = t.fit();
  CHECK(r.updates == 300);
  CHECK(r.env_steps == 0);
  CHECK(t.buffer().size() == 2000);  // nothing stepped went into it
  CHECK_FALSE(same(untrained, weights_of(t.algorithm())));
  const auto dir = std::filesystem::path(*c.run->run_dir);
  CHECK(std::filesystem::exists(dir / "checkpoint-000000000200.ckpt"));  // named by updates
  CHECK(std::filesystem::exists(dir / "checkpoint-000000000300.ckpt"));
  std::ifstream csv(dir / "metrics.csv");
  std::string line;
  std::getline(csv, line);
  std::vector<std::string> columns;
  for (std::size_t b = 0, e; b <= line.size(); b = e + 1) {
    e = std::min(line.find(',', b), line.size());
    columns.push_back(line.substr(b, e - b));
  }
  const auto q_col = std::find(columns.begin(), columns.end(), "q_mean") - columns.begin();
  REQUIRE(q_col < static_cast<std::ptrdiff_t>(columns.size()));
  std::vector<std::string> updates;
  std::vector<double> q;
  while (std::getline(csv, line)) {
    std::vector<std::string> cells;
    for (std::size_t b = 0, e; b <= line.size(); b = e + 1) {
      e = std::min(line.find(',', b), line.size());
      cells.push_back(line.substr(b, e - b));
    }
    updates.push_back(cells[1]);
    q.push_back(std::stod(cells[static_cast<std::size_t>(q_col)]));
  }
  CHECK(updates == std::vector<std::string>{"100", "200", "300"});  // a row every 100 updates
  // It learns from the data alone: the critic's values, 0 at the start, take on the
  // negative returns of Pendulum's transitions (every reward is at most 0).
  MESSAGE("q_mean by row: " << q[0] << ", " << q[1] << ", " << q[2]);
  CHECK(q[2] < q[0]);
  CHECK(q[2] < -2.0);

  // A dataset from a buffer of another size is refused naming the field.
  auto bad = c;
  bad.buffer->capacity = 5000;
  bad.run->run_dir = temp_run_dir("offline_bad");
  CHECK_THROWS_WITH_AS(Offline(envs::Pendulum{}, bad), doctest::Contains("buffer.capacity is 10000 in the file but 5000 here"),
                       Error);
  auto none = c;
  none.train->dataset = (dir / "missing.buffer").string();
  CHECK_THROWS_WITH_AS(Offline(envs::Pendulum{}, none), doctest::Contains("train.dataset: no file at"), ConfigError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Staged<OfflineLoop, OffPolicyLoop>: the dataset first, then online, the stage is kept in checkpoints") {
  using StagedSac = Trainer<SAC, UniformBuffer, SingleDevice, FP32, Staged<OfflineLoop, OffPolicyLoop>>;
  auto c = sac_config<StagedSac>("staged_a");
  c.train->first->dataset = pendulum_dataset().string();
  c.train->first->steps = 200;
  c.train->first->eval_interval = 0;
  c.train->first->eval_episodes = 1;
  c.train->second->steps = 800;
  c.train->second->learning_starts = 0;  // the buffer holds the dataset: learn from the first step
  c.train->second->eval_interval = 0;
  c.train->second->eval_episodes = 1;
  c.run->log_interval = 400;
  c.run->checkpoint_interval = 400;
  c.run->checkpoint_buffer = true;
  c.run->seed = 4;
  StagedSac a(envs::Pendulum{}, c);
  CHECK(a.clock().unit == ClockUnit::updates);
  const auto r = a.fit();
  CHECK(a.loop().stage() == 1);
  CHECK(a.clock().unit == ClockUnit::env_steps);
  CHECK(r.env_steps == 800);
  CHECK(r.updates == 200 + 800);  // the offline updates, then one per online env step
  CHECK(a.buffer().size() == 2800);  // the dataset and what the online stage added

  // Resumed from a checkpoint of the second stage, the run goes on in it (the first stage
  // is not run again) and ends as the uninterrupted run did.
  const auto dir = std::filesystem::path(*c.run->run_dir);
  auto ckpts = Checkpoints::in(dir);
  REQUIRE(ckpts.size() >= 2);
  const auto mid = ckpts[ckpts.size() - 2];  // the one before the end, taken in stage 2
  auto rc = c;
  rc.run->run_dir = temp_run_dir("staged_b");
  rc.run->resume = mid.string();
  StagedSac b(envs::Pendulum{}, rc);
  b.fit();
  CHECK(b.loop().stage() == 1);
  CHECK(b.updates() == a.updates());
  CHECK(b.env_steps() == 800);
  CHECK(same(weights_of(a.algorithm()), weights_of(b.algorithm())));

  // Both stages must scale learning rates alike.
  auto bad = c;
  bad.train->second->update->lr_scaling = LrScaling::sqrt;
  CHECK_THROWS_WITH_AS(StagedSac(envs::Pendulum{}, bad), doctest::Contains("train.off_policy.lr_scaling differs from train.offline.lr_scaling"),
                       ConfigError);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(*rc.run->run_dir);
}

namespace {

/// REINFORCE with normalised returns-to-go (Williams 1992, "Simple statistical
/// gradient-following algorithms for connectionist reinforcement learning"): a user's
/// episodic algorithm, which names the loop it trains in.
struct Reinforce {
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "reinforce";
  static constexpr bool on_policy = true;
  using Batch = EpisodeBatch;
  using loop = EpisodicLoop;
  struct Config {
    Param<double, "lr", "Adam learning rate", positive> lr{1e-2};
    Param<double, "gamma", "discount", in_range(0, 1)> gamma{0.99};
    Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{32};
  };

  Reinforce(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), net_(spec.obs_dim(), nn::widths(cfg.hidden), spec.num_actions(), nn::Activation::tanh),
        opt_(net_->parameters(), {.lr = cfg.lr * ctx.lr_scale(1)}) {}

  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    const auto logits = net_->forward(obs.to(at::kFloat));
    return mode == ActMode::explore ? at::multinomial(logits.softmax(-1), 1).squeeze(-1) : logits.argmax(-1);
  }

  UpdateInfo update(const EpisodeBatch& b, StepContext& ctx) {
    at::Tensor g;
    {
      torch::NoGradGuard no_grad;  // returns-to-go; padding holds no reward
      g = at::zeros_like(b.reward);
      auto running = at::zeros({b.reward.size(0)});
      for (std::int64_t t = b.reward.size(1) - 1; t >= 0; --t) {
        running = b.reward.select(1, t) + *cfg_.gamma * running;
        g.select(1, t).copy_(running);
      }
      const auto valid = b.mask > 0;
      const auto mean = g.masked_select(valid).mean(), std = g.masked_select(valid).std() + 1e-8;
      g = (g - mean) / std;
    }
    const auto logp = net_->forward(b.obs).log_softmax(-1).gather(-1, b.action.unsqueeze(-1)).squeeze(-1);
    const auto loss = -(logp * g * b.mask).sum() / b.mask.sum();
    ctx.minimize(loss, opt_);
    return {{{"loss", loss.item<double>()}, {"episode_length", b.length.to(at::kFloat).mean().item<double>()}}, {}};
  }

  void save(BinaryWriter& w) const { opt_.save(w); }
  FlatAdam::Saved read(BinaryReader& r) const { return opt_.read(r, "reinforce policy"); }
  void restore(const FlatAdam::Saved& s) { opt_.restore(s); }

 private:
  Config cfg_;
  nn::Mlp net_;
  FlatAdam opt_;
};
static_assert(Algorithm<Reinforce> && NamesItsLoop<Reinforce>);

}  // namespace

TEST_CASE("EpisodicLoop: a user's REINFORCE learns CartPole from rounds of whole episodes" * doctest::test_suite("learning")) {
  using T = Trainer<Reinforce, EpisodeBuffer>;
  static_assert(std::same_as<T::Loop, EpisodicLoop>);  // the algorithm named its loop
  T::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir("reinforce");
  c.run->progress = ProgressMode::off;
  c.run->seed = learning_seed(1);
  c.run->log_interval = 20'000;
  c.env->num_envs = 8;
  c.buffer->max_steps = 500;
  c.train->steps = 120'000;
  c.train->eval_interval = 20'000;
  c.train->eval_episodes = 8;
  T t(envs::CartPole{}, c);
  const auto r = t.fit();
  MESSAGE("REINFORCE CartPole: best eval " << r.best_eval_return << ", final " << r.final_eval_return << ", "
                                           << r.env_steps << " env steps, " << r.updates << " rounds, "
                                           << r.wall_seconds << " s");
  CHECK(r.best_eval_return >= 195.0);  // CartPole-v0's bar; random actions average about 22
  // Every round is one episode of each env, and the clock counts the steps kept.
  CHECK(t.clock().episodes == r.updates * 8);
  CHECK(r.env_steps >= 120'000);
  std::filesystem::remove_all(*c.run->run_dir);
}

TEST_CASE("Loops: what a loop needs is checked at construction, naming the fields") {
  auto c = sac_config("loop_checks");
  c.algorithm->batch_size = 32;
  c.train->update->grad_accumulation = 64;
  CHECK_THROWS_WITH_AS(SacTrainer(envs::Pendulum{}, c),
                       doctest::Contains("train.grad_accumulation (64) is larger than sac.batch_size (32)"), ConfigError);
  auto d = sac_config("loop_checks2");
  d.train->eval_interval = 3;
  d.env->num_envs = 4;
  CHECK_THROWS_WITH_AS(SacTrainer(envs::Pendulum{}, d),
                       doctest::Contains("train.eval_interval (3) is shorter than one step of env.num_envs (4) envs"),
                       ConfigError);
  // Each loop's keys are its own: an on-policy run has no warm-up or update schedule.
  using Ppo = Trainer<PPO, RolloutBuffer>;
  const auto keys = flatten(Ppo::Config{});
  for (const auto& [k, v] : keys) {
    CHECK(k != "train.learning_starts");
    CHECK(k != "train.update_interval");
  }
  CHECK_THROWS_WITH_AS(configure<Ppo::Config>(parse_args(std::vector<std::string>{"p", "train.learning_starts=10"})),
                       doctest::Contains("unknown key 'train.learning_starts'"), ConfigError);
}

namespace {
// Every config key the advice names is one of `c`'s, and every `key=value` it suggests is a
// value `c` takes; on the CPU it suggests no BF16 (0.95x FP32's speed for these networks).
template <class T, class Env>
void check_advice(const Env& env, typename T::Config c, const std::vector<std::string>& must_name) {
  T t(env, c);
  const auto a = t.advice();
  auto copy = c;
  std::set<std::string> keys;
  for (const auto& f : fields(copy)) keys.insert(f.key);
  const std::regex token(R"(([a-z_]+(\.[a-z_0-9]+)+)(=([a-z_0-9]+))?)");
  std::string all;
  for (const auto* text : {&a.env, &a.learn, &a.comm, &a.act, &a.sample, &a.store, &a.side}) {
    all += *text + "\n";
    for (std::sregex_iterator m(text->begin(), text->end(), token), end; m != end; ++m) {
      const std::string key = (*m)[1], value = (*m)[4];
      CHECK_MESSAGE(keys.count(key) == 1, "the advice '" << *text << "' names '" << key << "', not a key of this config");
      if (!value.empty()) {
        auto applied = c;
        Setting s{.key = key, .values = {value}, .origin = "advice"};
        CHECK_NOTHROW(apply_settings(applied, {s}));
      }
    }
  }
  CHECK_MESSAGE(all.find("BF16") == std::string::npos, all);
  for (const auto& k : must_name) CHECK_MESSAGE(all.find(k) != std::string::npos, all << " lacks " << k);
  std::filesystem::remove_all(t.run_dir());
}
}  // namespace

TEST_CASE("Timing advice names only keys the run's config has, for every loop, and BF16 only where it pays") {
  check_advice<SacTrainer>(envs::Pendulum{}, sac_config("advice_sac"),
                           {"env.mode=async", "train.update_interval", "sac.batch_size", "run.log_interval"});
  using PpoTrainer = Trainer<PPO, RolloutBuffer>;
  PpoTrainer::Config p;
  p.run->device = "cpu";
  p.run->run_dir = temp_run_dir("advice_ppo");
  p.run->progress = ProgressMode::off;
  check_advice<PpoTrainer>(envs::Pendulum{}, p, {"ppo.epochs", "ppo.minibatch_size", "env.threads"});
  using ComaTrainer = Trainer<COMA, EpisodeBuffer>;
  ComaTrainer::Config m;
  m.run->device = "cpu";
  m.run->run_dir = temp_run_dir("advice_coma");
  m.run->progress = ProgressMode::off;
  check_advice<ComaTrainer>(envs::Joint<envs::MappingTask>{}, m, {"coma.data_passes", "coma.batch_size"});
  using StagedSac = Trainer<SAC, UniformBuffer, SingleDevice, FP32, Staged<OfflineLoop, OffPolicyLoop>>;
  auto st = sac_config<StagedSac>("advice_staged");
  check_advice<StagedSac>(envs::Pendulum{}, st, {"train.offline.eval_interval", "sac.batch_size"});
  // BF16 is suggested on a GPU for FP32 and TF32 runs only.
  CHECK(bf16_pays("cuda:0", "fp32"));
  CHECK(bf16_pays("cuda", "tf32"));
  CHECK_FALSE(bf16_pays("cuda:1", "bf16"));
  CHECK_FALSE(bf16_pays("cpu", "fp32"));
}
