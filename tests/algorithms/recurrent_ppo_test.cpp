// Recurrent PPO: the rollout's sequences with their stored memory, the memory the policy
// acts with against the one its update unrolls, exact resume, refusals, and learning
// CartPole with its velocities hidden.
#include <anvil/algorithms/recurrent_ppo.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <filesystem>
#include <set>

#include <anvil/anvil.hpp>

#include "../python_policy_check.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {
using RecurrentTrainer = Trainer<RecurrentPPO, RolloutBuffer>;

RunContext cpu_context() {
  RunContext c;
  c.device = c10::Device(c10::kCPU);
  return c;
}

/// The settings of examples/hyperparams/ppo_recurrent.yaml for CartPoleNoVel-v1.
RecurrentTrainer::Config novel_config(std::int64_t steps, const std::string& run) {
  RecurrentTrainer::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(run);
  c.train->steps = steps;
  c.train->eval_interval = 0;
  c.train->eval_episodes = 20;
  c.env->num_envs = 8;
  c.normalize->obs = true;
  c.normalize->reward = true;
  c.buffer->steps = 32;
  c.buffer->gae_lambda = 0.8;
  c.algorithm->gamma = 0.98;
  c.algorithm->lr = 1e-3;
  c.algorithm->epochs = 20;
  c.algorithm->minibatch_size = 256;
  c.algorithm->target_kl = 0.02;
  return c;
}

std::vector<at::Tensor> state_of(const RecurrentPPO& p) {
  return {p.optimizer().parameters().flat().clone(), p.optimizer().exp_avg_sq().clone()};
}

// A rollout of `steps` steps of `n` random observation rows collected by `algo`, some
// episodes ending on the way (terminated or truncated), finished and ready to hand out.
void collect(RecurrentPPO& algo, RolloutBuffer& buffer, std::int64_t n, std::int64_t steps) {
  AgentMemory memory;
  memory.plan(n, algo.memory_width(), c10::Device(c10::kCPU));
  buffer.plan(StoragePlan{n, 0, 0.98, 1, 1, algo.memory_width()});
  auto obs = torch::randn({n, 2});
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto first = memory.first.clone();
    const auto act = algo.act_for_rollout(obs, memory);
    const auto terminated = (torch::rand({n}) < 0.1).to(torch::kFloat);
    const auto truncated = ((torch::rand({n}) < 0.05).to(torch::kFloat) * (1 - terminated)).contiguous();
    buffer.add(RolloutStep{obs, act.action, act.log_prob, act.value, torch::randn({n}), terminated, truncated,
                           torch::randn({n}), act.memory, first});
    memory.mark_starts(terminated, truncated);
    obs = torch::randn({n, 2});
  }
  buffer.finish(algo.value(obs, memory));
}

}  // namespace

TEST_CASE("RolloutBuffer: sequences hand out every env's runs once, time first, with the memory kept at their starts") {
  const auto spec = envs::spec_of(envs::CartPoleNoVel{});
  RolloutBuffer::Config rc;
  rc.steps = 6;
  rc.normalize_advantage = false;
  RolloutBuffer buffer(spec, rc, cpu_context());
  constexpr std::int64_t n = 3, width = 2;
  buffer.plan(StoragePlan{n, 0, 0.99, 1, 1, width});
  // Step t of env i: observation (t, i), memory (10 t + i, -(10 t + i)), first where t = 2.
  for (std::int64_t t = 0; t < 6; ++t) {
    auto obs = torch::empty({n, 2});
    auto mem = torch::empty({n, width});
    for (std::int64_t i = 0; i < n; ++i) {
      obs[i][0] = static_cast<float>(t);
      obs[i][1] = static_cast<float>(i);
      mem[i][0] = static_cast<float>(10 * t + i);
      mem[i][1] = -static_cast<float>(10 * t + i);
    }
    buffer.add(RolloutStep{obs, torch::zeros({n}, torch::kLong), torch::zeros({n}), torch::zeros({n}), torch::ones({n}),
                           torch::zeros({n}), torch::zeros({n}), {}, mem, torch::full({n}, t == 2 ? 1.0f : 0.0f)});
  }
  buffer.finish(torch::zeros({n}));
  // Runs of 3 steps, two per minibatch of 6 rows: 3 envs x 2 runs = 6 runs, 3 minibatches.
  std::set<std::pair<std::int64_t, std::int64_t>> seen;  // (env, first step)
  int batches = 0;
  for (const auto& b : buffer.sequences(6, 3)) {
    ++batches;
    REQUIRE(b.sequence_length == 3);
    REQUIRE(b.obs.size(0) == 6);
    REQUIRE(b.memory.sizes() == torch::IntArrayRef({2, width}));
    for (std::int64_t j = 0; j < 2; ++j) {
      const auto start = static_cast<std::int64_t>(b.obs[j][0].item<float>());
      const auto env = static_cast<std::int64_t>(b.obs[j][1].item<float>());
      CHECK((start == 0 || start == 3));
      seen.insert({env, start});
      for (std::int64_t u = 0; u < 3; ++u) {  // row u * 2 + j is step start + u of the same env
        CHECK(b.obs[u * 2 + j][0].item<float>() == static_cast<float>(start + u));
        CHECK(b.obs[u * 2 + j][1].item<float>() == static_cast<float>(env));
        CHECK(b.first[u * 2 + j].item<float>() == (start + u == 2 ? 1.0f : 0.0f));
      }
      CHECK(b.memory[j][0].item<float>() == static_cast<float>(10 * start + env));
      CHECK(b.memory[j][1].item<float>() == -static_cast<float>(10 * start + env));
    }
  }
  CHECK(batches == 3);
  CHECK(seen.size() == 6);
  // A length that does not divide the rollout is refused, naming both.
  CHECK_THROWS_WITH_AS((void)buffer.sequences(6, 4), doctest::Contains("do not divide rollout.steps (6)"), ConfigError);
}

TEST_CASE("RecurrentPPO: the memory it acts from is the one its update unrolls (ratios 1 before the first step), and without it they differ") {
  torch::manual_seed(3);
  const auto spec = envs::spec_of(envs::CartPoleNoVel{});
  RecurrentPPO::Config cfg;
  cfg.memory = 16;
  RecurrentPPO algo(spec, cfg, cpu_context());
  RolloutBuffer::Config rc;
  rc.steps = 12;
  RolloutBuffer buffer(spec, rc, cpu_context());
  collect(algo, buffer, 4, 12);
  // Runs of 4 steps start mid-rollout: they unroll from the stored memory, forgetting it
  // at the episode starts inside them.
  for (const auto& b : buffer.sequences(8, 4)) {
    torch::NoGradGuard no_grad;
    const auto u = algo.unroll(b);
    CHECK(torch::allclose(u.log_prob, b.log_prob, 1e-5, 1e-5));
    CHECK(torch::allclose(u.value, b.value, 1e-5, 1e-5));
    // (a run that starts the rollout, or an episode, starts from zero memory anyway)
    const auto k = b.memory.size(0);
    if ((b.memory.abs().sum(1) > 0).logical_and(b.first.narrow(0, 0, k) < 0.5).any().item<bool>()) {
      auto fresh = b;
      fresh.memory = torch::zeros_like(b.memory);
      CHECK_FALSE(torch::allclose(algo.unroll(fresh).value, b.value, 1e-5, 1e-5));
    }
    auto unmarked = b;
    unmarked.first = torch::zeros_like(b.first);
    if (b.first.narrow(0, 2, b.first.size(0) - 2).sum().item<float>() > 0)  // an episode starts after a run's first step
      CHECK_FALSE(torch::allclose(algo.unroll(unmarked).value, b.value, 1e-5, 1e-5));
  }
  // Its first update sees ratios of 1: no KL, nothing clipped.
  StepContext ctx;
  const auto info = algo.update(*buffer.sequences(8, 4).begin(), ctx);
  for (const auto& [name, v] : info.metrics) {
    if (name == "approx_kl") CHECK(std::abs(v) < 1e-6);
    if (name == "clip_fraction") CHECK(v == 0.0);
  }
  // Micro-batches of sequences give the whole minibatch's step.
  const auto batch = *buffer.sequences(8, 4).begin();
  torch::manual_seed(5);
  RecurrentPPO whole(spec, cfg, cpu_context());
  torch::manual_seed(5);
  RecurrentPPO split(spec, cfg, cpu_context());
  StepContext one;
  StepContext::Options o;
  o.micro_batches = 2;
  StepContext two(o);
  whole.update(batch, one);
  split.update(batch, two);
  CHECK(torch::allclose(state_of(whole)[0], state_of(split)[0], 1e-5, 1e-6));
  CHECK_FALSE(torch::equal(state_of(whole)[0], state_of(algo)[0]));
}

TEST_CASE("Trainer: recurrent PPO resumes from a checkpoint bitwise like the uninterrupted run (the envs' memory included)") {
  auto c = novel_config(2048, "ppo_recurrent_resume_a");
  c.run->seed = 7;
  c.run->checkpoint_interval = 1024;
  c.algorithm->epochs = 2;
  c.algorithm->sequence_length = 16;
  c.algorithm->minibatch_size = 64;
  RecurrentTrainer a(envs::CartPoleNoVel{}, c);
  a.fit();
  const auto ckpt = std::filesystem::path(*c.run->run_dir) / "checkpoint-000000001024.ckpt";
  REQUIRE(std::filesystem::exists(ckpt));
  auto rc = c;
  rc.run->run_dir = temp_run_dir("ppo_recurrent_resume_b");
  rc.run->resume = ckpt.string();
  RecurrentTrainer b(envs::CartPoleNoVel{}, rc);
  b.fit();
  CHECK(b.env_steps() == a.env_steps());
  CHECK(b.updates() == a.updates());
  const auto sa = state_of(a.algorithm()), sb = state_of(b.algorithm());
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(torch::equal(sa[i], sb[i]));
  // The control: another seed ends elsewhere.
  auto fc = c;
  fc.run->run_dir = temp_run_dir("ppo_recurrent_resume_c");
  fc.run->seed = 8;
  RecurrentTrainer f(envs::CartPoleNoVel{}, fc);
  f.fit();
  CHECK_FALSE(torch::equal(state_of(a.algorithm())[0], state_of(f.algorithm())[0]));
  for (const auto& d : {*c.run->run_dir, *rc.run->run_dir, *fc.run->run_dir}) std::filesystem::remove_all(d);
}

TEST_CASE("Trainer: recurrent PPO's sequences must divide the rollout, and the refusal names both fields") {
  auto c = novel_config(1000, "ppo_recurrent_bad");
  c.algorithm->sequence_length = 12;
  CHECK_THROWS_WITH_AS(RecurrentTrainer(envs::CartPoleNoVel{}, c),
                       doctest::Contains("ppo_recurrent.sequence_length (12) must divide rollout.steps (32)"), ConfigError);
  std::filesystem::remove_all(*c.run->run_dir);
}

namespace {
// 250 steps of the run's 8 training envs from new episodes (many end and start again: the
// memory restarts there), acting deterministically from a memory of its own as an
// evaluation does; anvil.load_policy's module must take the same actions, step by step.
template <class Env>
void check_in_python(const Env& env, const std::string& run) {
  auto c = novel_config(1024, run);
  c.normalize->obs = false;
  c.normalize->reward = false;
  RecurrentTrainer t(env, c);
  t.fit();
  const std::filesystem::path dir = *c.run->run_dir;
  REQUIRE(std::filesystem::exists(dir / "policy.safetensors"));
  {  // weights moved off the short run's, so that both actions occur (or means leave the bounds)
    torch::NoGradGuard no_grad;
    torch::manual_seed(9);
    for (auto& w : t.algorithm().actor()->parameters()) w.add_(torch::randn_like(w) * 0.7);
  }
  t.export_policy(dir / "export");
  auto& col = t.collector();
  col.restart();
  AgentMemory memory;
  std::vector<at::Tensor> obs, first, action;
  for (int s = 0; s < 250; ++s) {
    const auto rows = col.observations().clone();
    first.push_back(memory.planned() ? memory.first.clone() : torch::ones({8}));
    const auto a = t.algorithm().act(rows, ActMode::deterministic, memory);
    obs.push_back(rows);
    action.push_back(col.to_env(a));
    const auto& step = col.step(a, false);
    memory.mark_starts(step.terminated, step.truncated);
  }
  CHECK(at::stack(first).sum().item<double>() > 8);  // episodes restarted
  const auto actions = at::stack(action).to(at::kDouble);
  if (t.algorithm().discrete()) {  // both actions occur
    CHECK(actions.sum().item<double>() > 0);
    CHECK(actions.sum().item<double>() < static_cast<double>(actions.numel()));
  } else {  // some means clipped to the bounds, some not
    const auto clipped = (actions.abs() > 2.0 - 1e-6).to(at::kDouble).mean().item<double>();
    CHECK(clipped > 0.0);
    CHECK(clipped < 1.0);
  }
  ANVIL_CHECK_POLICY_IN_PYTHON(dir / "export" / "policy.safetensors",
                               {{"obs", at::stack(obs)}, {"first", at::stack(first)}, {"action", at::stack(action)}}, {});
  std::filesystem::remove_all(dir);
}
}  // namespace

TEST_CASE("Trainer: recurrent PPO writes policy.safetensors, which acts in PyTorch step by step with its memory as the run's policy") {
  SUBCASE("CartPoleNoVel-v1: the most likely of two actions") { check_in_python(envs::CartPoleNoVel{}, "ppo_recurrent_export_cp"); }
  SUBCASE("Pendulum-v1: the mean clipped and scaled to the bounds") { check_in_python(envs::Pendulum{}, "ppo_recurrent_export_pd"); }
}

TEST_CASE("Trainer: recurrent PPO learns CartPole with its velocities hidden (CartPoleNoVel-v1), evaluated with its own memory" * doctest::test_suite("learning")) {
  auto c = novel_config(30'720, "ppo_recurrent_learns");
  c.run->seed = learning_seed(1);
  RecurrentTrainer t(envs::CartPoleNoVel{}, c);
  const auto r = t.fit();
  MESSAGE("recurrent PPO CartPoleNoVel-v1: final eval " << r.final_eval_return << ", " << r.wall_seconds << " s");
  CHECK(r.final_eval_return >= 200);  // feed-forward PPO stays below 200 at 100k steps (docs/ppo.md)
  std::filesystem::remove_all(*c.run->run_dir);
}
