// SAC's parts: target networks are deep copies, Polyak averaging, actions in bounds,
// the temperature moves toward the target entropy, and a swapped-in network works.
#include <anvil/algorithms/sac.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <unistd.h>

#include <anvil/algorithms/policy.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/train/trainer_parts.hpp>

#include "../captured_checks.hpp"
#include "../python_policy_check.hpp"

using namespace anvil;

namespace {
SAC::Config small() {
  SAC::Config c;
  c.actor->hidden = {32, 32};
  c.critic->hidden = {32, 32};
  return c;
}
ReplayBatch random_batch(std::int64_t n) {
  ReplayBatch b;
  b.obs = torch::randn({n, 3});
  b.action = torch::rand({n, 1}) * 2 - 1;
  b.reward = torch::randn({n});
  b.next_obs = torch::randn({n, 3});
  b.terminated = (torch::rand({n}) < 0.1).to(torch::kFloat);
  return b;
}
}  // namespace

TEST_CASE("SAC: the target critic is a deep copy, not an alias of the critic") {
  torch::manual_seed(0);
  SAC sac(envs::spec_of(envs::Pendulum{}), small(), RunContext{});
  auto p = sac.critic()->parameters(), t = sac.critic_target()->parameters();
  REQUIRE(p.size() == t.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    CHECK(torch::equal(p[i], t[i]));
    CHECK(p[i].data_ptr() != t[i].data_ptr());
    CHECK_FALSE(t[i].requires_grad());
  }
}

TEST_CASE("SAC: one update moves the target critic by exactly tau towards the critic") {
  torch::manual_seed(1);
  auto cfg = small();
  cfg.tau = 0.25;
  SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  std::vector<at::Tensor> before_target;
  for (auto& t : sac.critic_target()->parameters()) before_target.push_back(t.clone());
  StepContext ctx;
  sac.update(random_batch(16), ctx);
  auto p = sac.critic()->parameters(), t = sac.critic_target()->parameters();
  for (std::size_t i = 0; i < p.size(); ++i)
    CHECK(torch::allclose(t[i], 0.75 * before_target[i] + 0.25 * p[i], 1e-6, 1e-7));
}

TEST_CASE("SAC: target_update_freq and actor_update_freq skip updates as configured") {
  torch::manual_seed(2);
  auto cfg = small();
  cfg.target_update_freq = 2;
  cfg.actor_update_freq = 3;
  SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  StepContext ctx;
  auto t0 = sac.critic_target()->parameters()[0].clone();
  auto a0 = sac.actor()->parameters()[0].clone();
  sac.update(random_batch(8), ctx);  // update 0: targets and actor move
  auto t1 = sac.critic_target()->parameters()[0].clone();
  auto a1 = sac.actor()->parameters()[0].clone();
  CHECK_FALSE(torch::equal(t0, t1));
  CHECK_FALSE(torch::equal(a0, a1));
  auto info = sac.update(random_batch(8), ctx);  // update 1: neither
  CHECK(torch::equal(t1, sac.critic_target()->parameters()[0]));
  CHECK(torch::equal(a1, sac.actor()->parameters()[0]));
  const bool has_actor_loss = std::any_of(info.metrics.begin(), info.metrics.end(),
                                          [](const auto& m) { return m.first == "actor_loss"; });
  CHECK_FALSE(has_actor_loss);
}

TEST_CASE("SAC: actions lie in [-1, 1] and the deterministic action is repeatable") {
  torch::manual_seed(4);
  SAC sac(envs::spec_of(envs::Pendulum{}), small(), RunContext{});
  auto obs = torch::randn({64, 3}) * 5;
  auto a = sac.act(obs, ActMode::explore);
  CHECK(a.sizes() == torch::IntArrayRef{64, 1});
  CHECK(a.abs().max().item<float>() <= 1.0f);
  CHECK(torch::equal(sac.act(obs, ActMode::deterministic), sac.act(obs, ActMode::deterministic)));
  CHECK_FALSE(torch::equal(sac.act(obs, ActMode::explore), sac.act(obs, ActMode::explore)));
}

TEST_CASE("SAC: acting is the actor's forward on noise drawn first (the arithmetic a CUDA graph of acting holds), with either backward") {
  // 1 and 4 rows: the hand-written path draws under 16 values itself (anvil::randn), as
  // at::randn would; 16 rows: torch's op
  for (const bool manual : {true, false})
    for (const std::int64_t rows : {1, 4, 16}) {
      CAPTURE(manual);
      CAPTURE(rows);
      auto cfg = small();
      cfg.manual_backward = manual;
      torch::manual_seed(4);
      SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
      const auto obs = torch::randn({rows, 3}) * 2;
      torch::manual_seed(9);
      const auto a = sac.act(obs, ActMode::explore);
      torch::manual_seed(9);
      const auto noise = torch::randn({rows, 1});
      torch::NoGradGuard no_grad;
      CHECK(torch::allclose(a, sac.actor()->sample(obs, noise).action, 1e-5, 1e-6));
      CHECK(torch::allclose(sac.act(obs, ActMode::deterministic), sac.actor()->mode(obs), 1e-5, 1e-6));
      CHECK(sac.graphed_acts() == 0);  // no graph on the CPU
    }
}

TEST_CASE("SAC: the temperature falls when entropy is above the target") {
  torch::manual_seed(5);
  auto cfg = small();
  cfg.alpha_lr = 0.05;
  SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  StepContext ctx;
  const double a0 = sac.alpha();
  // A fresh policy's entropy (std ~ 1 per dim) is far above the target -1.
  for (int i = 0; i < 10; ++i) sac.update(random_batch(32), ctx);
  CHECK(sac.alpha() < a0);
}

TEST_CASE("SAC: a discrete or unbounded action space is refused with the reason") {
  envs::EnvSpec discrete{"Grid", envs::Box{{0.f}, {1.f}}, envs::Discrete{4}, {}};
  CHECK_THROWS_WITH_AS(SAC(discrete, small(), RunContext{}),
                       "SAC needs a continuous (Box) action space; Grid has discrete actions: use DiscreteSAC (train_sac_discrete) or PPO",
                       ConfigError);
  const float inf = std::numeric_limits<float>::infinity();
  envs::EnvSpec unbounded{"Free", envs::Box{{0.f}, {1.f}}, envs::Box{{-inf}, {inf}}, {}};
  CHECK_THROWS_AS(SAC(unbounded, small(), RunContext{}), ConfigError);
}

namespace {
// A user's actor: a deterministic-looking policy with a fixed small noise, to show that
// BasicSAC takes any network that meets its contract.
class NarrowActorImpl : public torch::nn::Cloneable<NarrowActorImpl> {
 public:
  struct Config {
    Param<int, "width", "hidden width", at_least(1)> width{16};
  };
  NarrowActorImpl(std::int64_t obs, std::int64_t act, const Config& c) : obs_(obs), act_(act), c_(c) { reset(); }
  void reset() override { net_ = register_module("net", nn::Mlp(obs_, std::vector<std::int64_t>{*c_.width}, act_)); }
  nn::PolicySample sample(const at::Tensor& o, const at::Tensor& noise) {
    auto u = net_->forward(o) + 0.1 * noise;
    auto logp = torch::full({o.size(0)}, -1.0) - (1 - u.tanh().square() + 1e-6).log().sum(-1);
    return {u.tanh(), logp};
  }
  at::Tensor mode(const at::Tensor& o) { return net_->forward(o).tanh(); }

 private:
  std::int64_t obs_, act_;
  Config c_;
  nn::Mlp net_{nullptr};
};
TORCH_MODULE(NarrowActor);
}  // namespace

TEST_CASE("SAC: a user network plugs into BasicSAC and brings its own config section") {
  using MySAC = BasicSAC<NarrowActor, nn::TwinQ>;
  static_assert(Algorithm<MySAC>);
  MySAC::Config cfg;
  cfg.actor->width = 8;
  MySAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  StepContext ctx;
  auto info = sac.update(random_batch(8), ctx);
  CHECK_FALSE(info.metrics.empty());
  (void)sac.act(torch::randn({2, 3}), ActMode::explore);
  const auto keys = flatten(cfg);
  CHECK(std::any_of(keys.begin(), keys.end(), [](const auto& kv) { return kv.first == "actor.width"; }));
}

TEST_CASE("SAC: an update gives the same result with one thread and with two") {
  auto run = [](int threads) {
    torch::manual_seed(6);
    SAC sac(envs::spec_of(envs::Pendulum{}), small(), RunContext{});
    StepContext::Options o;
    o.threads = threads;
    StepContext ctx(o);
    torch::manual_seed(7);
    for (int i = 0; i < 5; ++i) sac.update(random_batch(16), ctx);
    std::vector<at::Tensor> w;
    for (auto& p : sac.actor()->parameters()) w.push_back(p.detach().clone());
    for (auto& p : sac.critic()->parameters()) w.push_back(p.detach().clone());
    w.push_back(torch::tensor(sac.alpha()));
    return w;
  };
  auto one = run(1), two = run(2);
  REQUIRE(one.size() == two.size());
  for (std::size_t i = 0; i < one.size(); ++i) CHECK(torch::equal(one[i], two[i]));
}

namespace {
// Parameters and temperature of a SAC after `updates` updates on fixed random batches.
std::vector<at::Tensor> train_briefly(SAC::Config cfg, bool manual, int updates, bool weighted,
                                      int threads = 1) {
  cfg.manual_backward = manual;
  torch::manual_seed(11);
  SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  CHECK(sac.manual_backward() == manual);
  StepContext::Options o;
  o.threads = threads;
  StepContext ctx(o);
  torch::manual_seed(12);
  std::vector<at::Tensor> td;
  for (int i = 0; i < updates; ++i) {
    auto b = random_batch(64);
    if (weighted) {
      b.weight = torch::rand({64}) + 0.5;
      b.discount = torch::full({64}, 0.9f) * (torch::rand({64}) < 0.5).to(torch::kFloat) + 0.05;
    }
    td.push_back(sac.update(b, ctx).td_error);
  }
  std::vector<at::Tensor> w;
  for (auto& p : sac.actor()->parameters()) w.push_back(p.detach().clone());
  for (auto& p : sac.critic()->parameters()) w.push_back(p.detach().clone());
  for (auto& p : sac.critic_target()->parameters()) w.push_back(p.detach().clone());
  w.push_back(torch::tensor(sac.alpha()));
  w.push_back(torch::stack(td));
  torch::manual_seed(13);
  w.push_back(sac.act(torch::randn({5, 3}), ActMode::explore));
  w.push_back(sac.act(torch::randn({5, 3}), ActMode::deterministic));
  return w;
}
void check_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i << ", max difference " << (a[i] - b[i]).abs().max().item<double>());
    CHECK(torch::allclose(a[i], b[i], 1e-4, 1e-5));
  }
}
}  // namespace

TEST_CASE("SAC: hand-written gradients match autograd's") {
  auto cfg = small();
  cfg.max_grad_norm = 5.0;
  SUBCASE("relu, uniform batches") { check_close(train_briefly(cfg, true, 10, false), train_briefly(cfg, false, 10, false)); }
  SUBCASE("importance weights and per-sample discounts") {
    check_close(train_briefly(cfg, true, 10, true), train_briefly(cfg, false, 10, true));
  }
  SUBCASE("tanh and elu networks, three layers") {
    cfg.actor->activation = nn::Activation::tanh;
    cfg.actor->hidden = {16, 24, 8};
    cfg.critic->activation = nn::Activation::elu;
    cfg.critic->hidden = {24, 16, 8};
    check_close(train_briefly(cfg, true, 10, false), train_briefly(cfg, false, 10, false));
  }
  SUBCASE("leaky_relu networks") {
    cfg.actor->activation = nn::Activation::leaky_relu;
    cfg.critic->activation = nn::Activation::leaky_relu;
    check_close(train_briefly(cfg, true, 10, false), train_briefly(cfg, false, 10, false));
  }
  SUBCASE("actor every second update, two threads") {
    cfg.actor_update_freq = 2;
    check_close(train_briefly(cfg, true, 10, false, 2), train_briefly(cfg, false, 10, false, 1));
  }
}

TEST_CASE("SAC: activations without a hand-written derivative use autograd") {
  auto cfg = small();
  cfg.critic->activation = nn::Activation::gelu;
  SAC sac(envs::spec_of(envs::Pendulum{}), cfg, RunContext{});
  CHECK_FALSE(sac.manual_backward());
  CHECK(sac.gradient_paths() == std::vector<std::pair<std::string, std::string>>{
                                   {"actor and critics", "the critics' activation gelu has no hand-written derivative"}});
  StepContext ctx;
  CHECK_FALSE(sac.update(random_batch(8), ctx).metrics.empty());
}

TEST_CASE("SAC: save and restore give the exact state: later updates are bitwise the same") {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_state_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto spec = envs::spec_of(envs::Pendulum{});
  auto cfg = small();
  cfg.actor_update_freq = 2;  // the update count schedules actor steps: it must come back too
  StepContext ctx;
  torch::manual_seed(0);
  SAC a(spec, cfg, RunContext{});
  std::vector<ReplayBatch> batches;
  for (int i = 0; i < 10; ++i) batches.push_back(random_batch(64));
  for (int i = 0; i < 5; ++i) a.update(batches[static_cast<std::size_t>(i)], ctx);
  {
    BinaryWriter w(dir / "sac.bin", "anvil SAC test");
    a.save(w);
    w.commit();
  }
  torch::manual_seed(1);  // different initial weights
  SAC b(spec, cfg, RunContext{});
  {
    BinaryReader r(dir / "sac.bin", "anvil SAC test");
    auto s = b.read(r);
    r.finish();
    b.restore(s);
  }
  CHECK(b.updates() == 5);
  CHECK(b.alpha() == a.alpha());
  for (int i = 5; i < 10; ++i) {
    torch::manual_seed(100 + i);  // the same update noise for both
    a.update(batches[static_cast<std::size_t>(i)], ctx);
    torch::manual_seed(100 + i);
    b.update(batches[static_cast<std::size_t>(i)], ctx);
  }
  auto same = [](const std::vector<at::Tensor>& x, const std::vector<at::Tensor>& y) {
    bool eq = x.size() == y.size();
    for (std::size_t i = 0; eq && i < x.size(); ++i) eq = torch::equal(x[i], y[i]);
    return eq;
  };
  CHECK(same(a.actor()->parameters(), b.actor()->parameters()));
  CHECK(same(a.critic()->parameters(), b.critic()->parameters()));
  CHECK(same(a.critic_target()->parameters(), b.critic_target()->parameters()));
  CHECK(a.alpha() == b.alpha());

  // Another network shape: refused, naming the part, and nothing changes.
  auto wide = small();
  wide.critic->hidden = {48, 32};
  torch::manual_seed(2);
  SAC c(spec, wide, RunContext{});
  const auto before = c.critic()->parameters()[0].clone();
  {
    BinaryReader r(dir / "sac.bin", "anvil SAC test");
    CHECK_THROWS_WITH_AS((void)c.read(r), doctest::Contains("sac critic parameters have"), Error);
  }
  CHECK(torch::equal(before, c.critic()->parameters()[0]));
  std::filesystem::remove_all(dir);
}

TEST_CASE("SAC: k micro-batches of B/k give the same update as one batch of B (gradient accumulation)") {
  const auto spec = envs::spec_of(envs::Pendulum{});
  for (bool manual : {true, false})
    for (int k : {2, 4, 3}) {  // 3 does not divide 64: parts of 21 and 22, weighed by size
      CAPTURE(manual);
      CAPTURE(k);
      auto cfg = small();
      cfg.manual_backward = manual;
      cfg.max_grad_norm = 1.0;  // clipping applies to the accumulated gradient, once
      torch::manual_seed(0);
      SAC one(spec, cfg, RunContext{});
      torch::manual_seed(0);
      SAC acc(spec, cfg, RunContext{});
      StepContext whole;
      StepContext::Options o;
      o.micro_batches = k;
      StepContext split(o);
      torch::manual_seed(3);
      std::vector<ReplayBatch> batches;
      for (int i = 0; i < 3; ++i) {
        batches.push_back(random_batch(64));
        batches.back().weight = torch::rand({64}) + 0.5;  // importance weights are split too
      }
      UpdateInfo a, b;
      for (int i = 0; i < 3; ++i) {
        torch::manual_seed(50 + i);
        a = one.update(batches[static_cast<std::size_t>(i)], whole);
        torch::manual_seed(50 + i);
        b = acc.update(batches[static_cast<std::size_t>(i)], split);
      }
      auto close = [](const std::vector<at::Tensor>& x, const std::vector<at::Tensor>& y) {
        bool ok = x.size() == y.size();
        for (std::size_t i = 0; ok && i < x.size(); ++i) ok = torch::allclose(x[i], y[i], 1e-5, 1e-6);
        return ok;
      };
      CHECK(close(one.actor()->parameters(), acc.actor()->parameters()));
      CHECK(close(one.critic()->parameters(), acc.critic()->parameters()));
      CHECK(close(one.critic_target()->parameters(), acc.critic_target()->parameters()));
      CHECK(one.alpha() == doctest::Approx(acc.alpha()).epsilon(1e-6));
      // Adam is nearly blind to the gradient's scale; its moments are not.
      for (auto opt : {&SAC::actor_optimizer, &SAC::critic_optimizer, &SAC::alpha_optimizer}) {
        CHECK(torch::allclose((one.*opt)().exp_avg(), (acc.*opt)().exp_avg(), 1e-4, 1e-7));
        CHECK(torch::allclose((one.*opt)().exp_avg_sq(), (acc.*opt)().exp_avg_sq(), 1e-4, 1e-10));
      }
      CHECK(torch::allclose(a.td_error, b.td_error, 1e-5, 1e-6));
      CHECK(a.td_error.size(0) == 64);
    }
}

TEST_CASE("SAC: with micro-batches, gradients cross ranks once per optimizer step, and the loss scaler sees their sum") {
  const auto spec = envs::spec_of(envs::Pendulum{});
  auto cfg = small();
  cfg.manual_backward = false;
  torch::manual_seed(0);
  SAC one(spec, cfg, RunContext{});
  torch::manual_seed(0);
  SAC acc(spec, cfg, RunContext{});
  int reduces = 0;
  StepContext::Options whole_opt, split_opt;
  whole_opt.loss_scaling = LossScaler::Options{};
  split_opt.loss_scaling = LossScaler::Options{};
  split_opt.micro_batches = 4;
  // Stands in for DDP's all-reduce: counts calls and leaves the gradients as they are.
  split_opt.all_reduce_mean = [&](std::vector<at::Tensor>&) { ++reduces; };
  StepContext whole(whole_opt), split(split_opt);
  torch::manual_seed(4);
  const auto batch = random_batch(64);
  torch::manual_seed(9);
  one.update(batch, whole);
  torch::manual_seed(9);
  acc.update(batch, split);
  CHECK(reduces == 1);  // critic, actor and temperature together, not one per micro-batch
  CHECK(split.steps() == whole.steps());
  CHECK(split.scaler()->current_scale() == whole.scaler()->current_scale());
  for (std::size_t i = 0; i < one.critic()->parameters().size(); ++i)
    CHECK(torch::allclose(one.critic()->parameters()[i], acc.critic()->parameters()[i], 1e-5, 1e-6));
  CHECK(torch::allclose(one.critic_optimizer().exp_avg_sq(), acc.critic_optimizer().exp_avg_sq(), 1e-4, 1e-10));
}

namespace {
// Pendulum's spec with three tasks, and batches whose transitions carry tasks 0, 1, 2.
EnvSpec three_tasks() {
  auto s = envs::spec_of(envs::Pendulum{});
  s.tasks = {"a", "b", "c"};
  return s;
}
ReplayBatch tasked_batch(std::int64_t n) {
  auto b = random_batch(n);
  b.task = torch::arange(n, torch::kLong) % 3;
  return b;
}
MultiTaskSAC::Config small_mt() {
  MultiTaskSAC::Config c;
  c.actor->hidden = {32, 32};
  c.critic->hidden = {32, 32};
  return c;
}
// Parameters and temperatures of a MultiTaskSAC after `updates` updates on fixed batches.
std::vector<at::Tensor> train_mt(MultiTaskSAC::Config cfg, bool manual, int updates, bool per) {
  cfg.manual_backward = manual;
  torch::manual_seed(21);
  MultiTaskSAC sac(three_tasks(), cfg, RunContext{});
  CHECK(sac.manual_backward() == manual);
  StepContext ctx;
  torch::manual_seed(22);
  for (int i = 0; i < updates; ++i) {
    auto b = tasked_batch(60);
    if (per) b.weight = torch::rand({60}) + 0.5;
    sac.update(b, ctx);
  }
  std::vector<at::Tensor> w;
  for (auto& p : sac.actor()->parameters()) w.push_back(p.detach().clone());
  for (auto& p : sac.critic()->parameters()) w.push_back(p.detach().clone());
  w.push_back(sac.alphas());
  return w;
}
}  // namespace

TEST_CASE("MultiTaskSAC: a temperature per task, moved by its own transitions towards its own target entropy") {
  auto cfg = small_mt();
  cfg.alpha_lr = 0.05;
  cfg.tasks->target_entropy_scales = {-3.0, 1.0, 30.0};  // targets 3, -1 and -30 nats
  torch::manual_seed(3);
  MultiTaskSAC sac(three_tasks(), cfg, RunContext{});
  CHECK(sac.temperatures() == 3);
  StepContext ctx;
  UpdateInfo info;
  for (int i = 0; i < 30; ++i) info = sac.update(tasked_batch(48), ctx);
  const auto a = sac.alphas();
  // The policy's entropy is about 1 nat: below task a's target (its temperature rises),
  // above b's and c's (theirs fall).
  CHECK(a[0].item<double>() > 1.2);
  CHECK(a[1].item<double>() < 0.8);
  CHECK(a[2].item<double>() < 0.8);
  // Each task's temperature is reported.
  std::map<std::string, double> m(info.metrics.begin(), info.metrics.end());
  CHECK(m.count("alpha/a") == 1);
  CHECK(m.at("alpha/c") == doctest::Approx(a[2].item<double>()));
  CHECK(m.at("alpha") == doctest::Approx(a.mean().item<double>()));
  // A temperature's gradient comes only from its task's transitions: a batch of task b
  // alone leaves a and c where they were (their Adam moments decay, but the step is 0).
  auto only_b = random_batch(30);
  only_b.task = torch::ones({30}, torch::kLong);
  const auto before = sac.alphas();
  MultiTaskSAC fresh(three_tasks(), cfg, RunContext{});
  const auto f0 = fresh.alphas();
  fresh.update(only_b, ctx);
  const auto f1 = fresh.alphas();
  CHECK(f1[0].item<double>() == f0[0].item<double>());
  CHECK(f1[2].item<double>() == f0[2].item<double>());
  CHECK(f1[1].item<double>() != f0[1].item<double>());
  (void)before;
}

TEST_CASE("MultiTaskSAC: hand-written gradients match autograd's with per-task temperatures and loss weights") {
  auto cfg = small_mt();
  SUBCASE("per-task temperatures") { check_close(train_mt(cfg, true, 8, false), train_mt(cfg, false, 8, false)); }
  SUBCASE("and loss weights by softmax(-log alpha), with importance weights") {
    cfg.tasks->loss_weights = true;
    cfg.alpha_lr = 0.05;  // the temperatures part, so the weights differ between tasks
    check_close(train_mt(cfg, true, 8, true), train_mt(cfg, false, 8, true));
  }
}

TEST_CASE("MultiTaskSAC: settings that cannot apply are refused naming the field") {
  auto cfg = small_mt();
  cfg.tasks->target_entropy_scales = {1.0, 1.0};
  CHECK_THROWS_WITH_AS(MultiTaskSAC(three_tasks(), cfg, RunContext{}),
                       doctest::Contains("mtsac.tasks.target_entropy_scales has 2 values; it needs one per temperature (3"),
                       ConfigError);
  auto w = small_mt();
  w.tasks->loss_weights = true;
  CHECK_THROWS_WITH_AS(MultiTaskSAC(envs::spec_of(envs::Pendulum{}), w, RunContext{}),
                       doctest::Contains("mtsac.tasks.loss_weights weighs tasks by their temperatures"), ConfigError);
  // Without tasks, MultiTaskSAC is SAC: one temperature.
  MultiTaskSAC single(envs::spec_of(envs::Pendulum{}), small_mt(), RunContext{});
  CHECK(single.temperatures() == 1);
  StepContext ctx;
  CHECK_FALSE(single.update(random_batch(8), ctx).metrics.empty());
  // A batch without task ids for a per-task SAC is an error, not a silent fallback.
  MultiTaskSAC mt(three_tasks(), small_mt(), RunContext{});
  CHECK_THROWS_WITH_AS(mt.update(random_batch(8), ctx), doctest::Contains("the batch has no task ids"), Error);
  // The config section is its own.
  CHECK(MultiTaskSAC::config_section.view() == "mtsac");
  CHECK(SAC::config_section.view() == "sac");
}

namespace {
// Three tasks whose observations end in the task's one-hot (3 numbers, then 3), as a
// multi-task suite's do, and batches of them.
EnvSpec three_tasks_one_hot() {
  auto s = three_tasks();
  s.observation = Box{std::vector<float>(6, -10.f), std::vector<float>(6, 10.f)};
  return s;
}
ReplayBatch one_hot_batch(std::int64_t n) {
  auto b = tasked_batch(n);
  const auto one_hot = at::one_hot(b.task, 3).to(at::kFloat);
  b.obs = at::cat({b.obs, one_hot}, 1);
  b.next_obs = at::cat({b.next_obs, one_hot}, 1);
  return b;
}
MultiTaskSAC::Config multi_head() {
  auto c = small_mt();
  c.actor->heads = 3;
  c.critic->heads = 3;
  return c;
}
}  // namespace

TEST_CASE("MultiTaskSAC with an output head per task (actor.heads, critic.heads): each row takes its task's head, the hand-written gradients match autograd's, and policy files keep the heads") {
  SUBCASE("a row's output is its task's head, on the tape and through autograd") {
    torch::manual_seed(5);
    nn::Mlp m(7, std::vector<std::int64_t>{16}, 2, nn::Activation::relu, nn::MlpHeads{.count = 3, .at = 2});
    auto x = torch::randn({9, 7});
    const auto task = torch::arange(9, torch::kLong) % 3;
    x.narrow(1, 2, 3).copy_(at::one_hot(task, 3).to(at::kFloat) * 2.5);  // a normalised one-hot: its one positive picks
    const auto y = m->forward(x);
    REQUIRE(y.sizes() == at::IntArrayRef{9, 2});
    // By hand: the hidden layer, then each row's head's rows of the output layer.
    auto hidden = m->layers()[0], output = m->layers()[1];
    const auto h = torch::relu(hidden->forward(x));
    const auto full = output->forward(h).view({9, 3, 2});
    for (int i = 0; i < 9; ++i) CHECK(torch::allclose(y[i], full[i][task[i].item<int>()]));
    torch::NoGradGuard no_grad;
    nn::MlpTape tape;
    CHECK(torch::allclose(tape.forward(*m, x), y, 1e-5, 1e-6));
    // Its backward: a head that no row takes gets no gradient.
    auto only0 = x.narrow(0, 0, 1).repeat({4, 1});
    tape.forward(*m, only0);
    std::vector<at::Tensor> grads;
    for (auto& p : m->parameters()) grads.push_back(torch::empty_like(p));
    tape.backward(*m, torch::ones({4, 2}), &grads, nullptr);
    CHECK(grads[2].narrow(0, 0, 2).abs().sum().item<float>() > 0);
    CHECK(grads[2].narrow(0, 2, 4).abs().sum().item<float>() == 0);
    CHECK(grads[3].narrow(0, 2, 4).abs().sum().item<float>() == 0);
    // A row that is not a one-hot is named, on either path.
    x[4][2] = 1.0;  // row 4 is task 1 (column 3): a second positive number
    CHECK_THROWS_WITH_AS(tape.forward(*m, x), doctest::Contains("input row 4's columns 2 to 4 are not a one-hot"), Error);
    CHECK_THROWS_WITH_AS(m->forward(x), doctest::Contains("columns 2 to 4 are not a one-hot in every row"), Error);
  }
  SUBCASE("hand-written gradients match autograd's") {
    auto train = [](bool manual) {
      auto cfg = multi_head();
      cfg.manual_backward = manual;
      torch::manual_seed(21);
      MultiTaskSAC sac(three_tasks_one_hot(), cfg, RunContext{});
      CHECK(sac.manual_backward() == manual);
      CHECK(sac.actor()->net()->layers().back()->weight.size(0) == 3 * 2);  // 3 heads of mean and log std
      CHECK(sac.critic()->q1()->layers().back()->weight.size(0) == 3);
      StepContext ctx;
      torch::manual_seed(22);
      for (int i = 0; i < 8; ++i) sac.update(one_hot_batch(60), ctx);
      std::vector<at::Tensor> w;
      for (auto& p : sac.actor()->parameters()) w.push_back(p.detach().clone());
      for (auto& p : sac.critic()->parameters()) w.push_back(p.detach().clone());
      w.push_back(sac.alphas());
      return w;
    };
    check_close(train(true), train(false));
  }
  SUBCASE("policy.bin and policy.safetensors keep the heads; anvil::load_policy and anvil.load_policy act as SAC does") {
    torch::manual_seed(4);
    MultiTaskSAC sac(three_tasks_one_hot(), multi_head(), RunContext{});
    StepContext ctx;
    for (int i = 0; i < 3; ++i) sac.update(one_hot_batch(30), ctx);
    const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_heads_policy_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const PolicyFileParts parts{"three tasks", torch::full({1}, 2.0f), torch::zeros({1}), {}, {}, {}, {}, 0};
    write_policy(dir / "policy.bin", parts, [&](BinaryWriter& w) { sac.save_policy(w); });
    CHECK(policy_kind(dir / "policy.bin") == "MultiHeadGaussianActor");
    const auto policy = load_policy(dir / "policy.bin");
    CHECK(policy.network()->config().heads == 3);
    const auto obs = one_hot_batch(12).obs;
    const auto expected = sac.act(obs, ActMode::deterministic) * 2.0;
    CHECK(torch::allclose(policy.act(obs), expected, 1e-5, 1e-5));
    // Each task's action is its own head's: the same state under another task acts otherwise.
    auto other = obs.clone();
    other.narrow(1, 3, 3).copy_(obs.narrow(1, 3, 3).roll(1, 1));
    CHECK_FALSE(torch::allclose(policy.act(other), expected, 1e-3, 1e-3));
    write_policy_safetensors(policy, dir / "policy.safetensors");
    ANVIL_CHECK_POLICY_IN_PYTHON(dir / "policy.safetensors", {{"obs", obs}, {"action", expected}}, {});
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("MultiTaskSAC: heads that do not match the env's tasks are refused naming the field") {
  auto cfg = small_mt();
  cfg.critic->heads = 2;
  CHECK_THROWS_WITH_AS(MultiTaskSAC(three_tasks_one_hot(), cfg, RunContext{}),
                       doctest::Contains("mtsac.critic.heads=2 gives each task its own output layer"), ConfigError);
  cfg.critic->heads = 3;
  CHECK_THROWS_WITH_AS(MultiTaskSAC(envs::spec_of(envs::Pendulum{}), cfg, RunContext{}),
                       doctest::Contains("needs an env with 3 tasks and float observations; Pendulum-v1 has 0 tasks"),
                       ConfigError);
}

namespace {
// Two copies of an algorithm from `make` (the same seed), one updated by `update`, one by
// `update_as_captured`, on the same 12 batches from `batch` and the same noise, each through a
// step context with `options` (micro-batches): their metrics, TD errors, networks,
// temperatures and step counts agree within float rounding.
template <class A>
void check_captured_matches(const std::function<A()>& make, const std::function<ReplayBatch()>& batch,
                            const StepContext::Options& options = {},
                            const std::optional<StepContext::Options>& captured_options = {}) {
  torch::manual_seed(0);
  A eager = make();
  torch::manual_seed(0);
  A captured = make();
  StepContext ce(options), cc(captured_options.value_or(options));
  torch::manual_seed(7);
  for (int i = 0; i < 12; ++i) {
    const auto b = batch();
    const auto n = b.obs.size(0);
    typename A::UpdateNoise noise{torch::randn({n, 1}), torch::randn({n, 1})};
    const auto x = eager.update(b, ce, noise);
    const auto y = captured.update_as_captured(b, cc, noise);
    REQUIRE(x.metrics.size() == y.metrics.size());
    for (std::size_t k = 0; k < x.metrics.size(); ++k) {
      CHECK(x.metrics[k].first == y.metrics[k].first);
      CHECK(y.metrics[k].second == doctest::Approx(x.metrics[k].second).epsilon(1e-4));
    }
    CHECK(torch::allclose(x.td_error, y.td_error, 1e-4, 1e-5));
  }
  auto close = [](const std::vector<at::Tensor>& x, const std::vector<at::Tensor>& y) {
    bool ok = x.size() == y.size();
    for (std::size_t i = 0; ok && i < x.size(); ++i) ok = torch::allclose(x[i], y[i], 1e-4, 1e-5);
    return ok;
  };
  CHECK(close(eager.actor()->parameters(), captured.actor()->parameters()));
  CHECK(close(eager.critic()->parameters(), captured.critic()->parameters()));
  CHECK(close(eager.critic_target()->parameters(), captured.critic_target()->parameters()));
  CHECK(torch::allclose(captured.alphas(), eager.alphas(), 1e-5, 1e-7));
  CHECK(captured.updates() == eager.updates());
  CHECK(cc.steps() == ce.steps());
  for (auto opt : {&A::actor_optimizer, &A::critic_optimizer, &A::alpha_optimizer})
    CHECK((captured.*opt)().steps() == (eager.*opt)().steps());
  CHECK(captured.graphed_updates() == 0);
  test::check_same_scaler_decisions(ce, cc);  // with a loss scaler: the same decisions on the device
}
}  // namespace

TEST_CASE("SAC: the update as a CUDA graph holds it (device work alone, then the host's bookkeeping) matches the op-by-op update, micro-batches included") {
  // On the CPU no graph runs, but the captured form of the update runs op by op
  // (update_as_captured): the same arithmetic a replay does on CUDA, with the temperature,
  // the step counts and the learning rates read from tensors.
  const auto spec = envs::spec_of(envs::Pendulum{});
  struct Case {
    int actor_freq, target_freq;
    double max_grad_norm;
    bool weights, auto_alpha;
    int micro_batches = 1;  // gradient accumulation: the captured update loops over them
  };
  for (const Case& c : {Case{1, 1, 0.0, false, true}, Case{2, 3, 1.0, true, true}, Case{1, 2, 0.5, false, false},
                        Case{1, 1, 1.0, true, true, 3}, Case{2, 1, 0.0, false, true, 2}}) {
    CAPTURE(c.actor_freq);
    CAPTURE(c.target_freq);
    CAPTURE(c.micro_batches);
    StepContext::Options options;
    options.micro_batches = c.micro_batches;
    auto cfg = small();
    cfg.manual_backward = false;
    cfg.actor_update_freq = c.actor_freq;
    cfg.target_update_freq = c.target_freq;
    cfg.max_grad_norm = c.max_grad_norm;
    cfg.auto_alpha = c.auto_alpha;
    check_captured_matches<SAC>(
        [&] { return SAC(spec, cfg, RunContext{}); },
        [&] {
          auto b = random_batch(48);
          if (c.weights) b.weight = torch::rand({48}) + 0.5;
          return b;
        },
        options);
  }
  // What a graph cannot hold is refused by name: a loss scaler whose state is on the host
  // (on CUDA it is always on the device).
  StepContext::Options o;
  o.loss_scaling = LossScaler::Options{};
  StepContext scaled(o);
  torch::manual_seed(0);
  SAC sac(spec, small(), RunContext{});
  CHECK_THROWS_WITH_AS((void)sac.update_as_captured(random_batch(8), scaled, {torch::randn({8, 1}), torch::randn({8, 1})}),
                       doctest::Contains("sac: this update cannot be captured: the loss scaler's state is on the host"), Error);
  // ... and the run header says why (trainer_parts.hpp's cuda_graph_note asks the algorithm).
  CHECK(cuda_graph_note(sac, scaled).find("sac's update runs op by op (the loss scaler's state is on the host") == 0);
  o.loss_scaler_on_device = true;
  CHECK(cuda_graph_note(sac, StepContext(o)).find("sac's update and acting are captured") == 0);
  CHECK(cuda_graph_note(sac, StepContext{}).find("sac's update and acting are captured") == 0);
  StepContext::Options ddp;
  ddp.all_reduce_mean = [](std::vector<at::Tensor>&) {};
  CHECK(cuda_graph_note(sac, StepContext(ddp)).find("(DDP: the all-reduce") != std::string::npos);
  StepContext::Options accumulating;
  accumulating.micro_batches = 4;
  CHECK(cuda_graph_note(sac, StepContext(accumulating)).find("are captured") != std::string::npos);
  auto off = small();
  off.cuda_graph = false;
  CHECK(cuda_graph_note(SAC(spec, off, RunContext{}), StepContext{}) ==
        "off (sac.cuda_graph=false): the update and acting run op by op");
}

TEST_CASE("SAC: with FP16's loss scaler on the device, the captured update skips, backs off and grows as op by op") {
  // A CUDA graph holds the scaler's check and the skip as device work. A scale near float32's
  // limit makes gradients overflow as float16's do at 2^16: steps are skipped and the scale
  // halves, then grows back after 3 finite steps. The eager update decides on the host.
  const auto spec = envs::spec_of(envs::Pendulum{});
  for (const int micro_batches : {1, 2}) {
    CAPTURE(micro_batches);
    StepContext::Options eager;
    eager.loss_scaling = LossScaler::Options{.init_scale = std::ldexp(1.0, 124), .growth_factor = 2.0,
                                             .backoff_factor = 0.5, .growth_interval = 3};
    eager.micro_batches = micro_batches;
    auto captured = eager;
    captured.loss_scaler_on_device = true;
    auto cfg = small();
    cfg.max_grad_norm = 1.0;
    check_captured_matches<SAC>([&] { return SAC(spec, cfg, RunContext{}); }, [] { return random_batch(48); }, eager,
                                captured);
  }
}

TEST_CASE("MultiTaskSAC: the captured update (a CUDA graph's arithmetic) matches the op-by-op update with a temperature per task") {
  // Each transition's temperature indexed by its task, the tasks' own target entropies and
  // (with loss_weights) their loss weights, all as device work: what a graph replays on CUDA.
  struct Case {
    int actor_freq;
    bool loss_weights, importance;
    int micro_batches = 1;
  };
  for (const Case& c : {Case{1, false, false}, Case{1, true, true}, Case{2, true, false}, Case{1, true, true, 2}}) {
    CAPTURE(c.actor_freq);
    CAPTURE(c.loss_weights);
    CAPTURE(c.micro_batches);
    StepContext::Options options;
    options.micro_batches = c.micro_batches;
    auto cfg = small_mt();
    cfg.manual_backward = false;
    cfg.alpha_lr = 0.05;  // temperatures that move apart within the 12 updates
    cfg.actor_update_freq = c.actor_freq;
    cfg.tasks->loss_weights = c.loss_weights;
    cfg.tasks->target_entropy_scales = {-3.0, 1.0, 30.0};
    check_captured_matches<MultiTaskSAC>(
        [&] { return MultiTaskSAC(three_tasks(), cfg, RunContext{}); },
        [&] {
          auto b = tasked_batch(48);
          if (c.importance) b.weight = torch::rand({48}) + 0.5;
          return b;
        },
        options);
  }
  // Without task ids the captured update refuses the batch as the op-by-op one does.
  MultiTaskSAC mt(three_tasks(), small_mt(), RunContext{});
  StepContext ctx;
  CHECK_THROWS_WITH_AS((void)mt.update_as_captured(random_batch(8), ctx, {torch::randn({8, 1}), torch::randn({8, 1})}),
                       doctest::Contains("the batch has no task ids"), Error);
}

// ---- SAC from images (rows of parts: an image beside numbers) ----

namespace {
EnvSpec image_spec() {
  EnvSpec s{"ImageTask", {}, envs::Box{{-1.f}, {1.f}}, {}};
  s.layout.image("pixels", 3, 16, 16).vector("state", 2);
  s.observation = envs::Box{{-10.f, -10.f}, {10.f, 10.f}};
  return s;
}
SAC::Config image_config() {
  auto c = small();
  c.batch_size = 8;
  c.encoder->width = 8;
  c.encoder->features = 8;
  return c;
}
ReplayBatch image_batch(const EnvSpec& spec, std::int64_t n) {
  ReplayBatch b;
  const auto row = spec.layout.row_bytes();
  auto rows = [&] {
    auto r = torch::randint(256, {n, row}, torch::TensorOptions().dtype(torch::kByte));
    auto state = torch::randn({n, 2});  // the float part: real numbers, not random bytes
    r.narrow(1, spec.layout.find("state")->offset, 8).copy_(state.view(torch::kByte));
    return r;
  };
  b.obs = rows();
  b.next_obs = rows();
  b.action = torch::rand({n, 1}) * 2 - 1;
  b.reward = torch::randn({n});
  b.terminated = torch::zeros({n});
  return b;
}
}  // namespace

TEST_CASE("SAC on images: the critic's encoder learns from the critic's loss alone, actions come from bytes, and the state round-trips") {
  torch::manual_seed(3);
  const auto spec = image_spec();
  SAC sac(spec, image_config(), RunContext{});
  REQUIRE(sac.critic()->encoder());
  CHECK(sac.actor()->encoder().get() == sac.critic()->encoder().get());  // one encoder, shared
  CHECK(sac.critic_target()->encoder().get() != sac.critic()->encoder().get());
  const auto paths = sac.gradient_paths();
  CHECK(paths.at(0).second.find("convolutional encoder") != std::string::npos);
  // acting reads rows of bytes; float rows are refused, naming what it expects
  const auto act = sac.act(image_batch(spec, 4).obs, ActMode::explore);
  CHECK(act.size(0) == 4);
  CHECK(act.abs().max().item<float>() <= 1.0f);
  CHECK_THROWS_WITH_AS(sac.act(torch::zeros({4, spec.obs_dim()}), ActMode::deterministic), doctest::Contains("uint8"), Error);
  // an update moves the critic's encoder (through the critic's optimizer), and the target's by tau
  const auto enc_before = sac.critic()->encoder()->parameters()[0].clone();
  const auto target_before = sac.critic_target()->encoder()->parameters()[0].clone();
  StepContext ctx;
  const auto info = sac.update(image_batch(spec, 8), ctx);
  CHECK(std::isfinite(info.metrics.at(0).second));
  CHECK(!torch::equal(enc_before, sac.critic()->encoder()->parameters()[0]));
  CHECK(!torch::equal(target_before, sac.critic_target()->encoder()->parameters()[0]));
  // no optimizer of the actor's holds the encoder's weights
  std::int64_t actor_numel = 0;
  for (const auto& p : sac.actor()->parameters()) actor_numel += p.numel();
  CHECK(sac.actor_optimizer().parameters().flat().numel() == actor_numel);
  // the state (encoders included) round-trips: the same next update on both
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_images_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    BinaryWriter w(dir / "sac.bin", "anvil SAC test");
    sac.save(w);
    w.commit();
  }
  torch::manual_seed(9);
  SAC other(spec, image_config(), RunContext{});
  {
    BinaryReader r(dir / "sac.bin", "anvil SAC test");
    auto s = other.read(r);
    r.finish();
    other.restore(s);
  }
  const auto batch = image_batch(spec, 8);
  torch::manual_seed(5);
  sac.update(batch, ctx);
  torch::manual_seed(5);
  other.update(batch, ctx);
  CHECK(torch::equal(sac.critic()->encoder()->parameters()[0], other.critic()->encoder()->parameters()[0]));
  CHECK(torch::equal(sac.actor()->parameters()[0], other.actor()->parameters()[0]));
  std::filesystem::remove_all(dir);
}

TEST_CASE("SAC on images: settings that cannot apply are refused naming the field") {
  auto c = image_config();
  c.encoder->width = 12;
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("encoder.width=12 is not a multiple of 8"), ConfigError);
  // a row of the wrong width: the layout it expects, in bytes
  const auto spec = image_spec();
  CHECK_THROWS_WITH_AS(SAC(spec, image_config(), RunContext{}).act(torch::zeros({2, 5}, torch::kByte), ActMode::explore),
                       doctest::Contains("uint8 [B, 776]"), Error);
}

TEST_CASE("SAC on images: policy.bin and policy.safetensors hold the encoder, and anvil::load_policy and anvil.load_policy act as SAC does") {
  for (const auto kind : {nn::EncoderKind::small, nn::EncoderKind::nature, nn::EncoderKind::resnet18}) {
    CAPTURE(static_cast<int>(kind));
    torch::manual_seed(4);
    auto spec = image_spec();
    auto cfg = image_config();
    cfg.encoder->kind = kind;
    if (kind != nn::EncoderKind::small) {  // DQN's encoder needs 36x36 at least, the ResNet 32x32
      spec.layout = ObsLayout{};
      spec.layout.image("pixels", 3, 36, 36).vector("state", 2);
    }
    SAC sac(spec, cfg, RunContext{});
    StepContext ctx;
    for (int i = 0; i < 3; ++i) sac.update(image_batch(spec, 8), ctx);  // weights away from their start
    const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_image_policy_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const PolicyFileParts parts{spec.name, torch::full({1}, 2.0f), torch::zeros({1}), {}, {}, {}, {}, 0};
    write_policy(dir / "policy.bin", parts, [&](BinaryWriter& w) { sac.save_policy(w); });
    CHECK(policy_kind(dir / "policy.bin") == "EncodedGaussianActor");
    const auto policy = load_policy(dir / "policy.bin");
    REQUIRE(policy.encoder());
    CHECK(policy.encoder()->layout().describe() == spec.layout.describe());
    torch::manual_seed(8);
    const auto rows = image_batch(spec, 64).obs;
    const auto expected = sac.act(rows, ActMode::deterministic) * 2.0;
    CHECK(torch::allclose(policy.act(rows), expected, 1e-5, 1e-5));
    CHECK(torch::allclose(policy.act(rows[0]), expected[0], 1e-5, 1e-5));
    const std::string expects = "uint8 [B, " + std::to_string(spec.obs_dim()) + "]";
    CHECK_THROWS_WITH_AS((void)policy.act(torch::zeros({2, spec.obs_dim()})), doctest::Contains(expects.c_str()), Error);
    write_policy_safetensors(policy, dir / "policy.safetensors");
    ANVIL_CHECK_POLICY_IN_PYTHON(dir / "policy.safetensors", {{"obs", rows}, {"action", expected}}, {});
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("SAC on images: init.weights starts the actor and the encoder (the critic's and its target's) from policy.safetensors") {
  torch::manual_seed(4);
  const auto spec = image_spec();
  const auto cfg = image_config();
  SAC trained(spec, cfg, RunContext{});
  StepContext ctx;
  for (int i = 0; i < 3; ++i) trained.update(image_batch(spec, 8), ctx);
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_sac_image_warm_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const PolicyFileParts parts{spec.name, torch::full({1}, 2.0f), torch::zeros({1}), {}, {}, {}, {}, 0};
  write_policy(dir / "policy.bin", parts, [&](BinaryWriter& w) { trained.save_policy(w); });
  write_policy_safetensors(load_policy(dir / "policy.bin"), dir / "policy.safetensors");
  SAC fresh(spec, cfg, RunContext{});
  const auto note = warm_start(dir / "policy.safetensors", fresh.policy_parameters(), "the sac actor");
  CHECK(note.find("starts from") != std::string::npos);
  // The actor and the critic's encoder as trained; the target's encoder as the critic's.
  const auto want = named_parameters_of(*trained.actor(), "");
  const auto got = named_parameters_of(*fresh.actor(), "");
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i].second, got[i].second));
  const auto enc = trained.critic()->encoder()->parameters();
  const auto fresh_enc = fresh.critic()->encoder()->parameters(), target_enc = fresh.critic_target()->encoder()->parameters();
  REQUIRE(enc.size() == fresh_enc.size());
  for (std::size_t i = 0; i < enc.size(); ++i) {
    CHECK(torch::equal(enc[i], fresh_enc[i]));
    CHECK(torch::equal(enc[i], target_enc[i]));
  }
  // A file of another encoder is refused naming the tensor.
  auto other = image_config();
  other.encoder->features = *cfg.encoder->features * 2;
  SAC wide(spec, other, RunContext{});
  CHECK_THROWS_WITH_AS(warm_start(dir / "policy.safetensors", wide.policy_parameters(), "the sac actor"), doctest::Contains("in the file"),
                       ConfigError);
  std::filesystem::remove_all(dir);
}
