// VecEnv: batched stepping, autoreset, distinct seeds, errors naming the env, sync = async.
#include <anvil/envs/vec_env.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <unistd.h>

#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/multi_agent/mapping.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/render/classic_views.hpp>
#include <anvil/train/run_envs.hpp>

using namespace anvil;

namespace {
envs::VecEnvConfig vcfg(int n, int threads = 1, envs::VecMode mode = envs::VecMode::sync) {
  envs::VecEnvConfig c;
  c.num_envs = n;
  c.threads = threads;
  c.mode = mode;
  return c;
}
}  // namespace

TEST_CASE("VecEnv: each env starts from its own seed and a seed repeats exactly") {
  envs::VecEnv<envs::Pendulum> a(envs::Pendulum{}, vcfg(4), 9), b(envs::Pendulum{}, vcfg(4), 9);
  auto oa = a.reset().clone(), ob = b.reset().clone();
  CHECK(torch::equal(oa, ob));
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) CHECK_FALSE(torch::equal(oa[i], oa[j]));
}

TEST_CASE("VecEnv: a step matches stepping each env alone, rows in env order") {
  envs::VecEnv<envs::Pendulum> v(envs::Pendulum{}, vcfg(3), 1);
  auto obs = v.reset().clone();
  auto act = torch::tensor({{0.5f}, {-1.0f}, {2.0f}});
  const auto& s = v.step(act);
  for (int i = 0; i < 3; ++i) {
    const float c = obs[i][0].item<float>(), sn = obs[i][1].item<float>(), w = obs[i][2].item<float>();
    envs::Pendulum q;
    q.set_state({std::atan2(static_cast<double>(sn), static_cast<double>(c)), static_cast<double>(w)});
    auto r = q.step(std::array<float, 1>{act[i][0].item<float>()});
    CHECK(s.reward[i].item<float>() == doctest::Approx(r.reward).epsilon(1e-4));
    CHECK(s.next_obs[i][2].item<float>() == doctest::Approx(r.observation[2]).epsilon(1e-4));
  }
  CHECK(s.terminated.sum().item<float>() == 0.0f);
}

TEST_CASE("VecEnv: autoreset keeps the last observation of an ended episode apart from the next first one") {
  envs::VecEnv<envs::Pendulum> v(envs::Pendulum{}, vcfg(2), 3);
  v.reset();
  auto zero = torch::zeros({2, 1});
  for (int t = 0; t < 199; ++t) CHECK(v.step(zero).ended.empty());
  const auto& s = v.step(zero);  // step 200: the time limit
  REQUIRE(s.ended.size() == 2);
  CHECK(s.ended[0].length == 200);
  CHECK_FALSE(s.ended[0].terminated);
  CHECK(s.truncated.sum().item<float>() == 2.0f);
  CHECK(s.terminated.sum().item<float>() == 0.0f);
  CHECK_FALSE(torch::equal(s.obs, s.next_obs));  // new episode vs. true final state
  CHECK(v.env(0).elapsed_steps() == 0);
}

TEST_CASE("VecEnv: env.max_episode_steps sets the training envs' time limit, env.eval_max_episode_steps the evaluation's") {
  // Steps until env 0's first episode ends (truncated, not terminated), from a reset.
  auto steps_to_end = [](envs::VecEnvBase& v) -> std::int64_t {
    v.reset();
    const auto zero = torch::zeros({v.num_envs(), 1});
    for (std::int64_t t = 1; t <= 300; ++t) {
      const auto& s = v.step(zero);
      if (s.ended.empty()) continue;
      CHECK_FALSE(s.ended[0].terminated);
      CHECK(s.ended[0].length == t);
      return t;
    }
    return -1;
  };
  auto c = vcfg(2);
  c.max_episode_steps = 7;
  c.eval_max_episode_steps = 12;
  auto run = make_run_envs(envs::Pendulum{}, c, envs::NormalizeConfig{}, 3, 0, 1);
  CHECK(steps_to_end(*run.training) == 7);
  CHECK(steps_to_end(*run.training) == 7);  // every episode, not the first alone
  CHECK(steps_to_end(*run.evaluation(1, 5, 0, 1)) == 12);
  c.eval_max_episode_steps = 0;  // the env's own: Pendulum-v1's 200, whatever training's is
  run = make_run_envs(envs::Pendulum{}, c, envs::NormalizeConfig{}, 3, 0, 1);
  CHECK(steps_to_end(*run.evaluation(1, 5, 0, 1)) == 200);
  // An env type that wraps another's episode passes the limit on (CartPoleNoVel's CartPole).
  envs::CartPoleNoVel nv;
  nv.set_max_episode_steps(3);
  nv.reset(1);
  CHECK_FALSE(nv.step(0).truncated);
  CHECK_FALSE(nv.step(1).truncated);
  CHECK(nv.step(0).truncated);
  // Refused, naming the field: a limit under 1 step, an env type without a settable limit,
  // envs that come batched by their own maker.
  envs::Pendulum p;
  CHECK_THROWS_WITH_AS(p.set_max_episode_steps(0), "Pendulum-v1: env.max_episode_steps=0: a time limit is at least 1 step",
                       ConfigError);
  CHECK_THROWS_WITH_AS(envs::VecEnv<envs::PixelPendulum>(envs::PixelPendulum{}, c, 1),
                       doctest::Contains("env.max_episode_steps=7: PixelPendulum-v1's time limit is its own"), ConfigError);
  const envs::AnyEnv batched("Pendula", [](const envs::VecEnvConfig& vc, std::uint64_t seed, std::int64_t, std::int64_t) {
    return std::unique_ptr<envs::VecEnvBase>(std::make_unique<envs::VecEnv<envs::Pendulum>>(envs::Pendulum{}, vc, seed));
  });
  CHECK_THROWS_WITH_AS(envs::make_vec_env(batched, c, 1),
                       doctest::Contains("env.max_episode_steps=7: Pendula comes batched by its own maker"), ConfigError);
  c.max_episode_steps = 0;
  c.eval_max_episode_steps = 9;
  CHECK_THROWS_WITH_AS(envs::make_vec_env(batched, c, 1), doctest::Contains("env.eval_max_episode_steps=9: Pendula"),
                       ConfigError);
}

TEST_CASE("VecEnv: a bad action names the env index and the step") {
  envs::VecEnv<envs::Pendulum> v(envs::Pendulum{}, vcfg(3), 3);
  v.reset();
  auto a = torch::zeros({3, 1});
  a[2][0] = std::numeric_limits<float>::quiet_NaN();
  try {
    v.step(a);
    FAIL("expected EnvError");
  } catch (const envs::EnvError& e) {
    CHECK(std::string(e.what()) == "env 2 of 3: step 1: Pendulum-v1: step 0: action[0] is nan");
  }
  try {
    v.step(torch::zeros({3, 2}));
    FAIL("expected EnvError");
  } catch (const envs::EnvError& e) {
    CHECK(std::string(e.what()).find("actions must be a float32 tensor of shape [3, 1], got float [3, 2]") !=
          std::string::npos);
  }
}

namespace {
// Pendulum with a fault from step `at` of env `bad` (counting every step of that env).
enum class Fault { nan_reward, inf_observation, long_observation, short_observation, throws, throws_on_reset };
struct FaultyPendulum : envs::Pendulum {
  static constexpr std::string_view name = "FaultyPendulum";
  Fault fault = Fault::nan_reward;
  int at = 3;
  int steps = 0;
  std::array<float, 8> wide{};
  std::span<const float> reset(std::uint64_t seed) {
    if (fault == Fault::throws_on_reset && steps >= at) throw std::runtime_error("the simulator lost its licence");
    return Pendulum::reset(seed);
  }
  envs::StepResult step(std::span<const float> a) {
    auto r = Pendulum::step(a);
    if (++steps < at) return r;
    switch (fault) {
      case Fault::nan_reward: r.reward = std::nan(""); break;
      case Fault::inf_observation:
        wide = {};
        std::copy(r.observation.begin(), r.observation.end(), wide.begin());
        wide[1] = -INFINITY;
        r.observation = std::span<const float>(wide.data(), 3);
        break;
      case Fault::long_observation:
        std::copy(r.observation.begin(), r.observation.end(), wide.begin());
        r.observation = std::span<const float>(wide.data(), 4);
        break;
      case Fault::short_observation: r.observation = r.observation.first(2); break;
      case Fault::throws: throw std::runtime_error("solver diverged");
      case Fault::throws_on_reset: r.truncated = true; break;
    }
    return r;
  }
};
std::string fault_message(Fault f, int n_envs, int bad, envs::VecMode mode = envs::VecMode::sync) {
  envs::VecEnvConfig c = vcfg(n_envs, 1, mode);
  FaultyPendulum p;
  p.fault = f;
  p.at = 1'000'000;
  envs::VecEnv<FaultyPendulum> v(p, c, 5);
  v.reset();
  const_cast<FaultyPendulum&>(v.env(bad)).at = 3;  // only env `bad` goes wrong
  try {
    for (int i = 0; i < 10; ++i) v.step(torch::zeros({n_envs, 1}));
  } catch (const envs::EnvError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("VecEnv: non-finite or wrong-length env data and env exceptions stop at that step, naming env, step and field") {
  CHECK(fault_message(Fault::nan_reward, 16, 3) == "FaultyPendulum: env 3 of 16: step 3 (step 3 of its episode): reward is nan");
  CHECK(fault_message(Fault::inf_observation, 4, 1) ==
        "FaultyPendulum: env 1 of 4: step 3 (step 3 of its episode): observation[1] is -inf");
  // A long observation would overflow the VecEnv's rows (heap-buffer-overflow before this check).
  CHECK(fault_message(Fault::long_observation, 4, 3) ==
        "FaultyPendulum: env 3 of 4: step 3 (step 3 of its episode): observation has 4 numbers; the observation space has 3");
  CHECK(fault_message(Fault::short_observation, 4, 0) ==
        "FaultyPendulum: env 0 of 4: step 3 (step 3 of its episode): observation has 2 numbers; the observation space has 3");
  CHECK(fault_message(Fault::throws, 4, 2) == "FaultyPendulum: env 2 of 4: step 3 (step 3 of its episode): solver diverged");
  CHECK(fault_message(Fault::throws_on_reset, 4, 2) == "FaultyPendulum: env 2 of 4: reset after step 3: the simulator lost its licence");
  // The same from the background stepper of async mode.
  CHECK(fault_message(Fault::nan_reward, 4, 2, envs::VecMode::async) ==
        "FaultyPendulum: env 2 of 4: step 3 (step 3 of its episode): reward is nan");
}

TEST_CASE("VecEnv: discrete envs take int64 indices and terminate with the published rule") {
  envs::VecEnv<envs::CartPole> v(envs::CartPole{}, vcfg(2), 5);
  v.reset();
  auto push_right = torch::ones({2}, torch::kLong);
  bool ended = false;
  for (int t = 0; t < 200 && !ended; ++t) {
    const auto& s = v.step(push_right);
    if (!s.ended.empty()) {
      ended = true;
      CHECK(s.ended[0].terminated);
      CHECK(s.terminated[s.ended[0].env].item<float>() == 1.0f);
    }
  }
  CHECK(ended);
}

TEST_CASE("VecEnv: threaded and async stepping give the same results as sync") {
  envs::VecEnv<envs::Pendulum> sync(envs::Pendulum{}, vcfg(16), 2);
  envs::VecEnv<envs::Pendulum> pool(envs::Pendulum{}, vcfg(16, 2), 2);
  envs::VecEnv<envs::Pendulum> async(envs::Pendulum{}, vcfg(16, 2, envs::VecMode::async), 2);
  auto first = sync.reset().clone();
  CHECK(torch::equal(first, pool.reset()));
  CHECK(torch::equal(first, async.reset()));
  torch::manual_seed(0);
  for (int t = 0; t < 450; ++t) {
    auto a = torch::rand({16, 1}) * 4 - 2;
    auto s1 = sync.step(a).next_obs.clone();
    auto s2 = pool.step(a).next_obs.clone();
    async.step_async(a);
    auto s3 = async.step_wait().next_obs.clone();
    REQUIRE(torch::equal(s1, s2));
    REQUIRE(torch::equal(s1, s3));
  }
}

TEST_CASE("VecEnv: a saved state restores exactly: the restored envs step on bitwise as the originals") {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_vec_env_state_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  envs::VecEnv<envs::Pendulum> a(envs::Pendulum{}, vcfg(3), 11);
  a.reset();
  torch::manual_seed(0);
  std::vector<at::Tensor> actions;
  for (int t = 0; t < 450; ++t) actions.push_back(torch::rand({3, 1}) * 4 - 2);  // crosses episode ends (200 steps)
  for (int t = 0; t < 150; ++t) a.step(actions[static_cast<std::size_t>(t)]);
  {
    BinaryWriter w(dir / "envs.bin", "anvil VecEnv test");
    a.save(w);
    w.commit();
  }
  envs::VecEnv<envs::Pendulum> b(envs::Pendulum{}, vcfg(3), 99);  // another seed: restored, not re-derived
  b.reset();
  {
    BinaryReader r(dir / "envs.bin", "anvil VecEnv test");
    auto apply = b.read(r);
    r.finish();
    apply();
  }
  CHECK(torch::equal(a.observations(), b.observations()));
  for (int t = 150; t < 450; ++t) {
    const auto& sa = a.step(actions[static_cast<std::size_t>(t)]);
    const auto& sb = b.step(actions[static_cast<std::size_t>(t)]);
    REQUIRE(torch::equal(sa.obs, sb.obs));
    REQUIRE(torch::equal(sa.next_obs, sb.next_obs));
    REQUIRE(torch::equal(sa.reward, sb.reward));
    REQUIRE(torch::equal(sa.truncated, sb.truncated));
    REQUIRE(sa.ended.size() == sb.ended.size());
    for (std::size_t k = 0; k < sa.ended.size(); ++k) {
      CHECK(sa.ended[k].env == sb.ended[k].env);
      CHECK(sa.ended[k].episode_return == sb.ended[k].episode_return);
      CHECK(sa.ended[k].length == sb.ended[k].length);
    }
  }

  // Another env count or another env: refused, naming the field.
  envs::VecEnv<envs::Pendulum> four(envs::Pendulum{}, vcfg(4), 1);
  {
    BinaryReader r(dir / "envs.bin", "anvil VecEnv test");
    CHECK_THROWS_WITH_AS((void)four.read(r), doctest::Contains("env.num_envs is 3 in the file but 4 here"), Error);
  }
  envs::VecEnv<envs::CartPole> cart(envs::CartPole{}, vcfg(3), 1);
  {
    BinaryReader r(dir / "envs.bin", "anvil VecEnv test");
    CHECK_THROWS_WITH_AS((void)cart.read(r), doctest::Contains("env name is 'Pendulum-v1' in the file but 'CartPole-v1' here"),
                         Error);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("VecEnv<Joint<MappingTask>>: on threads as in sync, missions restart with the first-step flag, state restores bitwise") {
  using Team = envs::Joint<envs::MappingTask>;
  const auto l = Team{}.agent_layout();
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_vec_team_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  envs::VecEnv<Team> sync(Team{}, vcfg(6), 5), pool(Team{}, vcfg(6, 2), 5);
  auto obs = sync.reset().clone();
  REQUIRE(torch::equal(obs, pool.reset()));
  CHECK(obs.select(1, l.first_offset()).eq(1).all().item<bool>());  // every row starts a mission
  // Random available actions for every agent of every env, from the rows' masks.
  Rng rng(3);
  auto actions = [&](const at::Tensor& rows) {
    auto a = torch::empty({rows.size(0)}, torch::kLong);
    for (std::int64_t e = 0; e < rows.size(0); ++e) {
      std::vector<std::int64_t> u(static_cast<std::size_t>(l.agents));
      for (std::int64_t i = 0; i < l.agents; ++i)
        do u[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(l.num_actions)));
        while (rows[e][l.avail_offset() + i * l.num_actions + u[static_cast<std::size_t>(i)]].item<float>() < 0.5f);
      a[e] = envs::encode_joint_action(u, l.num_actions);
    }
    return a;
  };
  std::vector<at::Tensor> taken;
  int ended = 0;
  for (int t = 0; t < 40; ++t) {  // across two mission ends (14 steps each)
    if (t == 20) {
      BinaryWriter w(dir / "envs.bin", "anvil VecEnv test");
      sync.save(w);
      w.commit();
    }
    const auto a = actions(obs);
    taken.push_back(a);
    const auto& s1 = sync.step(a);
    const auto& s2 = pool.step(a);
    REQUIRE(torch::equal(s1.next_obs, s2.next_obs));
    REQUIRE(torch::equal(s1.reward, s2.reward));
    const bool ends = (t + 1) % 14 == 0;
    CHECK(s1.terminated.eq(ends ? 1.0f : 0.0f).all().item<bool>());
    // After an end the next row is a new mission's first; the ended one's last row is not.
    CHECK(s1.obs.select(1, l.first_offset()).eq(ends ? 1.0f : 0.0f).all().item<bool>());
    CHECK(s1.next_obs.select(1, l.first_offset()).eq(0.0f).all().item<bool>());
    ended += static_cast<int>(s1.ended.size());
    obs = s1.obs.clone();
  }
  CHECK(ended == 2 * 6);
  // The saved envs (after 20 steps) step on as the originals did.
  envs::VecEnv<Team> back(Team{}, vcfg(6), 77);
  back.reset();
  {
    BinaryReader r(dir / "envs.bin", "anvil VecEnv test");
    auto apply = back.read(r);
    r.finish();
    apply();
  }
  envs::VecEnv<Team> again(Team{}, vcfg(6), 5);
  again.reset();
  for (int t = 0; t < 20; ++t) again.step(taken[static_cast<std::size_t>(t)]);
  CHECK(torch::equal(back.observations(), again.observations()));
  for (int t = 20; t < 40; ++t) {
    const auto& sa = again.step(taken[static_cast<std::size_t>(t)]);
    const auto& sb = back.step(taken[static_cast<std::size_t>(t)]);
    REQUIRE(torch::equal(sa.next_obs, sb.next_obs));
    REQUIRE(torch::equal(sa.reward, sb.reward));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("VecEnv of an env with images: rows of bytes out, and its state saves as those bytes and restores exactly") {
  using anvil::envs::PixelPendulum;
  anvil::envs::VecEnvConfig cfg;
  cfg.num_envs = 2;
  anvil::envs::LocalVecEnv v(std::make_unique<anvil::envs::EnvArray<PixelPendulum>>(PixelPendulum{}, cfg, 3), cfg);
  const auto row = v.spec().obs_dim();
  const auto first = v.reset();
  CHECK((first.scalar_type() == at::kByte));
  CHECK(first.size(1) == row);
  const auto actions = torch::full({2, 1}, 0.7f);
  v.step(actions);
  auto w = BinaryWriter::in_memory("anvil VecEnv test");
  v.save(w);
  const auto bytes = w.take_bytes();
  // the observations go in as bytes (two rows), beside two envs' states and frames
  CHECK(static_cast<std::int64_t>(bytes.size()) < 5 * row);
  const auto after = v.step(actions).next_obs.clone();
  v.step(actions);
  BinaryReader r(bytes, "saved envs", "anvil VecEnv test");
  v.restore(v.read(r));
  CHECK(torch::equal(v.step(actions).next_obs, after));
}
