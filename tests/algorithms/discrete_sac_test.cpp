// Discrete SAC (Christodoulou 2019): its losses by hand, its refusals, its actions, the
// prioritized buffer with n-step returns and an exact resume through the Trainer, and a short
// learning test on CartPole.
#include <anvil/algorithms/discrete_sac.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <filesystem>

#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/train/trainer.hpp>

#include "../python_policy_check.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

DiscreteSAC::Config small() {
  DiscreteSAC::Config c;
  c.actor->hidden = {16, 16};
  c.critic->hidden = {16, 16};
  return c;
}

// A batch of CartPole-sized transitions (4 observations, 2 actions).
ReplayBatch random_batch(std::int64_t n) {
  ReplayBatch b;
  b.obs = torch::randn({n, 4});
  b.action = torch::randint(2, {n}, torch::kLong);
  b.reward = torch::randn({n});
  b.next_obs = torch::randn({n, 4});
  b.terminated = (torch::rand({n}) < 0.2).to(torch::kFloat);
  return b;
}

double metric(const UpdateInfo& info, const std::string& name) {
  for (const auto& [k, v] : info.metrics)
    if (k == name) return v;
  FAIL("no metric " << name);
  return 0;
}

}  // namespace

TEST_CASE("DiscreteSAC: one update's losses are the paper's expectations over actions, by hand") {
  torch::manual_seed(3);
  auto cfg = small();
  cfg.init_alpha = 0.3;
  cfg.gamma = 0.9;
  DiscreteSAC sac(envs::spec_of(envs::CartPole{}), cfg, RunContext{});
  const auto b = random_batch(32);
  const double alpha = 0.3, target_entropy = 0.98 * std::log(2.0);
  CHECK(sac.target_entropy() == doctest::Approx(target_entropy));
  // The losses from the networks as they are, each written out.
  double critic_loss = 0, actor_loss = 0, entropy = 0, alpha_loss = 0;
  {
    torch::NoGradGuard no_grad;
    auto [q1, q2] = sac.critics();
    auto [t1, t2] = sac.target_critics();
    const auto pi_next = at::softmax(sac.actor()->forward(b.next_obs), -1);
    const auto v = (pi_next * (at::min(t1->forward(b.next_obs), t2->forward(b.next_obs)) - alpha * pi_next.log())).sum(-1);
    const auto y = b.reward + 0.9 * (1 - b.terminated) * v;
    const auto a = b.action.view({-1, 1});
    const auto e1 = q1->forward(b.obs).gather(1, a).squeeze(1) - y, e2 = q2->forward(b.obs).gather(1, a).squeeze(1) - y;
    critic_loss = (0.5 * (e1.square() + e2.square())).mean().item<double>();
    const auto pi = at::softmax(sac.actor()->forward(b.obs), -1);
    const auto q = at::min(q1->forward(b.obs), q2->forward(b.obs));
    actor_loss = (pi * (alpha * pi.log() - q)).sum(-1).mean().item<double>();
    const auto h = -(pi * pi.log()).sum(-1);
    entropy = h.mean().item<double>();
    alpha_loss = -(std::log(alpha) * (-h + target_entropy)).mean().item<double>();
  }
  StepContext ctx;
  const auto info = sac.update(b, ctx);
  CHECK(metric(info, "critic_loss") == doctest::Approx(critic_loss).epsilon(1e-5));
  CHECK(metric(info, "actor_loss") == doctest::Approx(actor_loss).epsilon(1e-5));
  CHECK(metric(info, "entropy") == doctest::Approx(entropy).epsilon(1e-5));
  CHECK(metric(info, "alpha_loss") == doctest::Approx(alpha_loss).epsilon(1e-5));
  REQUIRE(info.td_error.defined());
  CHECK(info.td_error.numel() == 32);
  // A near-uniform policy on two actions has entropy above 0.98 log 2: the temperature falls.
  CHECK(entropy > target_entropy);
  CHECK(sac.alpha() < alpha);
}

TEST_CASE("DiscreteSAC: k micro-batches give the same update as one batch, and one thread the same as two") {
  const auto b = random_batch(48);
  auto run = [&](int micro, int threads) {
    torch::manual_seed(4);
    RunContext rc;
    rc.micro_batches = micro;
    DiscreteSAC sac(envs::spec_of(envs::CartPole{}), small(), rc);
    StepContext::Options o;
    o.micro_batches = micro;
    o.threads = threads;
    StepContext ctx(o);
    for (int i = 0; i < 3; ++i) sac.update(b, ctx);
    return std::pair{sac.actor_optimizer().parameters().flat().clone(), sac.critic_optimizer().parameters().flat().clone()};
  };
  const auto [a1, c1] = run(1, 1);
  const auto [a3, c3] = run(3, 1);
  const auto [a2t, c2t] = run(1, 2);
  CHECK(torch::allclose(a1, a3, 1e-5, 1e-6));
  CHECK(torch::allclose(c1, c3, 1e-5, 1e-6));
  CHECK(torch::equal(a1, a2t));
  CHECK(torch::equal(c1, c2t));
}

TEST_CASE("DiscreteSAC: it explores by sampling and acts by its most likely action") {
  torch::manual_seed(5);
  DiscreteSAC sac(envs::spec_of(envs::Acrobot{}), small(), RunContext{});
  const auto obs = torch::randn({256, 6});
  const auto greedy = sac.act(obs, ActMode::deterministic);
  CHECK((greedy.scalar_type() == at::kLong));
  CHECK(torch::equal(greedy, sac.act(obs, ActMode::deterministic)));
  CHECK(torch::equal(greedy, sac.actor()->forward(obs).argmax(-1)));
  const auto explore = sac.act(obs, ActMode::explore);
  CHECK(explore.min().item<std::int64_t>() >= 0);
  CHECK(explore.max().item<std::int64_t>() <= 2);
  CHECK_FALSE(torch::equal(explore, greedy));  // a fresh policy is near uniform over 3 actions
}

TEST_CASE("DiscreteSAC: a continuous env is refused with the reason, and settings that cannot apply name the field") {
  CHECK_THROWS_WITH_AS(DiscreteSAC(envs::spec_of(envs::Pendulum{}), small(), RunContext{}),
                       doctest::Contains("discrete SAC (sac_discrete) needs a discrete action space; Pendulum-v1 has "
                                         "continuous actions: use SAC"),
                       ConfigError);
  RunContext rc;
  rc.micro_batches = 128;
  CHECK_THROWS_WITH_AS(DiscreteSAC(envs::spec_of(envs::CartPole{}), small(), rc),
                       doctest::Contains("train.grad_accumulation (128) is larger than sac_discrete.batch_size (64)"),
                       ConfigError);
}

TEST_CASE("Trainer<DiscreteSAC, PrioritizedBuffer> with 3-step returns resumes from a checkpoint bitwise like the uninterrupted run") {
  using T = Trainer<DiscreteSAC, PrioritizedBuffer>;
  T::Config c;
  learning_test_run(*c.run, "dsac_per_a", 200, 4);
  c.run->checkpoint_interval = 300;
  c.train->steps = 600;
  c.train->learning_starts = 100;
  c.train->eval_interval = 0;
  c.buffer->n_step = 3;
  c.env->num_envs = 2;
  c.algorithm->actor->hidden = {16, 16};
  c.algorithm->critic->hidden = {16, 16};
  c.run->checkpoint_buffer = true;  // the replay and its priorities come back with the rest
  T a(envs::CartPole{}, c);
  a.fit();
  CHECK(a.updates() > 0);
  const auto ckpt = std::filesystem::path(*c.run->run_dir) / "checkpoint-000000000300.ckpt";
  REQUIRE(std::filesystem::exists(ckpt));
  auto rc = c;
  rc.run->run_dir = temp_run_dir("dsac_per_b");
  rc.run->resume = ckpt.string();
  T b(envs::CartPole{}, rc);
  b.fit();
  CHECK(b.updates() == a.updates());
  CHECK(torch::equal(a.algorithm().actor_optimizer().parameters().flat(), b.algorithm().actor_optimizer().parameters().flat()));
  CHECK(torch::equal(a.algorithm().critic_optimizer().parameters().flat(), b.algorithm().critic_optimizer().parameters().flat()));
  CHECK(a.algorithm().alpha() == b.algorithm().alpha());
  for (const auto& d : {*c.run->run_dir, *rc.run->run_dir}) std::filesystem::remove_all(d);
}

TEST_CASE("Trainer: discrete SAC learns CartPole-v1 (best evaluation of 10 episodes 200 or more within 12,000 steps)" * doctest::test_suite("learning")) {
  using T = Trainer<DiscreteSAC, UniformBuffer>;
  T::Config c;
  learning_test_run(*c.run, "dsac_cartpole", 4000, 1);
  c.train->steps = 12'000;
  c.train->learning_starts = 1000;
  c.train->eval_interval = 2000;
  c.train->eval_episodes = 10;
  c.buffer->capacity = 20'000;
  // examples/hyperparams/sac_discrete.yaml's CartPole-v1 entry
  c.buffer->n_step = 3;
  c.algorithm->critic_lr = 1e-3;
  c.algorithm->target_entropy_scale = 0.5;
  T t(envs::CartPole{}, c);
  const auto r = t.fit();
  MESSAGE("discrete SAC CartPole: best eval " << r.best_eval_return);
  CHECK(r.best_eval_return >= 200);  // random actions average about 22
  // policy.safetensors acts in PyTorch (anvil.load_policy) as the run's policy does.
  torch::manual_seed(4);
  const auto raw = torch::rand({1000, 4}) * 4.0 - 2.0;
  const auto action = t.collector().to_env(t.algorithm().act(raw, ActMode::deterministic));
  CHECK(action.sum().item<std::int64_t>() > 0);  // both actions occur
  CHECK(action.sum().item<std::int64_t>() < 1000);
  ANVIL_CHECK_POLICY_IN_PYTHON(std::filesystem::path(*c.run->run_dir) / "policy.safetensors", {{"obs", raw}, {"action", action}}, {});
  std::filesystem::remove_all(*c.run->run_dir);
}
