// Diffusion Policy (algorithms/diffusion_policy.hpp): the noise schedule against its formula,
// the training loss by hand, DDIM against DDPM, the EMA's warm-up, a bimodal demo set that a
// diffusion policy fits and MSE behaviour cloning averages, the env wrapper that acts in
// chunks, and (with HDF5) training through the offline loop from demonstrations on disk
// with exact resume.
#include <anvil/algorithms/diffusion_policy.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include <anvil/anvil.hpp>

#if ANVIL_WITH_HDF5
#include <anvil/buffers/demo_dataset.hpp>
#include <anvil/data/demonstrations.hpp>
#endif

#include "../python_policy_check.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

/// A spec of `to` stacked observations of `od` numbers and chunks of `ta` actions of `ad`
/// numbers in [-1, 1].
EnvSpec chunked_spec(int to, int od, int ta, int ad) {
  EnvSpec s;
  s.name = "chunked";
  s.observation = Box{std::vector<float>(static_cast<std::size_t>(to * od), -10.0f), std::vector<float>(static_cast<std::size_t>(to * od), 10.0f)};
  s.action = Box{std::vector<float>(static_cast<std::size_t>(ta * ad), -1.0f), std::vector<float>(static_cast<std::size_t>(ta * ad), 1.0f)};
  return s;
}

}  // namespace

TEST_CASE("Diffusion: the squared-cosine schedule's alpha-bar is its formula") {
  const diffusion::NoiseSchedule s(100);
  const auto f = &diffusion::NoiseSchedule::cosine_alpha_bar;
  // The betas telescope: alpha-bar_k = f((k + 1) / K) / f(0), until the cap of 0.999 binds.
  for (int k = 0; k < 99; ++k) CHECK(s.alpha_bar(k) == doctest::Approx(f((k + 1) / 100.0) / f(0.0)).epsilon(1e-12));
  CHECK(s.beta(99) == doctest::Approx(0.999));  // f(1) = 0: the last beta is the cap
  CHECK(s.alpha_bar(99) == doctest::Approx(s.alpha_bar(98) * 0.001).epsilon(1e-12));
  CHECK(s.alpha_bar(-1) == 1.0);
  // Linear (Ho et al.): beta from 1e-4 to 0.02.
  const diffusion::NoiseSchedule lin(1000, diffusion::NoiseSchedule::Kind::linear);
  CHECK(lin.beta(0) == doctest::Approx(1e-4));
  CHECK(lin.beta(999) == doctest::Approx(0.02));
  CHECK(lin.alpha_bar(1) == doctest::Approx((1 - 1e-4) * (1 - (1e-4 + (0.02 - 1e-4) / 999))));
  CHECK(diffusion::ddim_timesteps(100, 8) == std::vector<int>{84, 72, 60, 48, 36, 24, 12, 0});
  CHECK_THROWS_WITH_AS(diffusion::ddim_timesteps(100, 0), doctest::Contains("diffusion.inference_steps"), ConfigError);
}

TEST_CASE("Diffusion: one DDPM training loss by hand") {
  const diffusion::NoiseSchedule s(100);
  // A "network" that predicts 0.3 x_k: x0 = (0.5, -0.2), noise (1, -1), step 10.
  const auto x0 = torch::tensor({{0.5, -0.2}}, torch::kDouble);
  const auto noise = torch::tensor({{1.0, -1.0}}, torch::kDouble);
  const auto xk = diffusion::add_noise(s, x0, noise, torch::tensor({10}, torch::kLong));
  const double a = std::sqrt(s.alpha_bar(10)), b = std::sqrt(1 - s.alpha_bar(10));
  const double x1 = a * 0.5 + b * 1.0, x2 = a * -0.2 + b * -1.0;
  CHECK(xk[0][0].item<double>() == doctest::Approx(x1).epsilon(1e-12));
  CHECK(xk[0][1].item<double>() == doctest::Approx(x2).epsilon(1e-12));
  const double by_hand = ((0.3 * x1 - 1.0) * (0.3 * x1 - 1.0) + (0.3 * x2 + 1.0) * (0.3 * x2 + 1.0)) / 2;
  CHECK(((0.3 * xk - noise).square().mean()).item<double>() == doctest::Approx(by_hand).epsilon(1e-12));

  // The algorithm's loss is that, on its normalised data: redraw its noise and steps from the
  // same seed and recompute through its own network.
  DiffusionPolicy::Config c;
  c.obs_horizon = 2, c.horizon = 4, c.action_horizon = 2, c.widths = {8, 16}, c.step_embed = 8, c.kernel = 3, c.groups = 4;
  RunContext ctx;
  DiffusionPolicy dp(chunked_spec(2, 3, 2, 2), c, ctx);
  dp.fit_normalizer(torch::full({3}, -2.0), torch::full({3}, 2.0), torch::tensor({0.0f, -1.0f}), torch::tensor({4.0f, 1.0f}));
  torch::manual_seed(5);
  const auto obs = torch::randn({6, 6});
  const auto act = torch::rand({6, 8}) * torch::tensor({4.0f, 1.0f}).repeat({4}) - torch::tensor({0.0f, 0.5f}).repeat({4});
  StepContext sc;
  double value = 0;
  torch::manual_seed(11);
  const auto l = dp.loss(obs, act, sc, value);
  torch::manual_seed(11);
  const auto x0n = (act.view({6, 4, 2}) - torch::tensor({0.0f, -1.0f})) / torch::tensor({4.0f, 2.0f}) * 2 - 1;
  const auto eps = torch::randn_like(x0n);
  const auto k = torch::randint(100, {6}, torch::kLong);
  const auto ab = torch::tensor(dp.schedule().alpha_bars()).index_select(0, k).to(torch::kFloat).view({6, 1, 1});
  const auto xk2 = ab.sqrt() * x0n + (1 - ab).sqrt() * eps;
  const auto cond = (obs / 2.0);  // (x + 2) / 4 * 2 - 1
  torch::NoGradGuard ng;
  const auto manual = (dp.network()->forward(xk2, k, cond) - eps).square().mean();
  CHECK(l.item<double>() == doctest::Approx(manual.item<double>()).epsilon(1e-5));
  CHECK(value == doctest::Approx(manual.item<double>()).epsilon(1e-5));
}

TEST_CASE("Diffusion: DDIM with every step and eta 1 is DDPM, clipping included") {
  const diffusion::NoiseSchedule s(50);
  torch::manual_seed(3);
  for (int t : {49, 30, 7, 1, 0}) {
    const auto x = torch::randn({4, 8, 2}, torch::kDouble) * 1.5;
    const auto eps = torch::randn({4, 8, 2}, torch::kDouble);
    const auto z = torch::randn({4, 8, 2}, torch::kDouble);
    for (bool clip : {false, true}) {
      const auto ddpm = diffusion::ddpm_step(s, x, t, eps, clip, z);
      const auto ddim = diffusion::ddim_step(s, x, t, t - 1, eps, clip, 1.0, z);
      CHECK(torch::allclose(ddpm, ddim, 1e-9, 1e-9));
      // The mean path: without noise the two agree too.
      CHECK(torch::allclose(diffusion::ddpm_step(s, x, t, eps, clip, {}), diffusion::ddim_step(s, x, t, t - 1, eps, clip, 1.0, {}), 1e-9, 1e-9));
    }
  }
  // Whole chains with a fixed denoiser and the same noise draws end at the same sample.
  const auto denoise = [](const at::Tensor& x, int t) { return 0.2 * x + 0.01 * t; };
  auto a = torch::randn({3, 4, 1}, torch::kDouble), b = a.clone();
  for (int t = 49; t >= 0; --t) {
    const auto z = torch::randn_like(a);
    a = diffusion::ddpm_step(s, a, t, denoise(a, t), true, z);
    b = diffusion::ddim_step(s, b, t, t - 1, denoise(b, t), true, 1.0, z);
  }
  CHECK(torch::allclose(a, b, 1e-9, 1e-9));
  // eta 0 is deterministic: no noise is added.
  const auto x = torch::randn({2, 4, 1}, torch::kDouble);
  CHECK(torch::equal(diffusion::ddim_step(s, x, 20, 10, 0.1 * x, true, 0.0, torch::randn_like(x)),
                     diffusion::ddim_step(s, x, 20, 10, 0.1 * x, true, 0.0, {})));
}

TEST_CASE("Diffusion: the EMA's decay warms up as the paper's, once per optimizer step") {
  CHECK(diffusion::ema_warmup_decay(0, 0.75, 0.9999) == 0.0);
  CHECK(diffusion::ema_warmup_decay(1, 0.75, 0.9999) == 0.0);
  CHECK(diffusion::ema_warmup_decay(2, 0.75, 0.9999) == doctest::Approx(1 - std::pow(2.0, -0.75)));
  CHECK(diffusion::ema_warmup_decay(1001, 0.75, 0.9999) == doctest::Approx(1 - std::pow(1001.0, -0.75)));
  CHECK(diffusion::ema_warmup_decay(100'000'000, 0.75, 0.9999) == 0.9999);
  CHECK(diffusion::ema_warmup_decay(5, 0.0, 0.99) == 0.99);  // power 0: a constant decay
}

namespace {

/// A tiny policy: one observation of 1 number (always 0), action sequences of 4 steps of 1.
DiffusionPolicy tiny_policy(DiffusionObjective objective) {
  DiffusionPolicy::Config c;
  c.objective = objective;
  c.obs_horizon = 1, c.horizon = 4, c.action_horizon = 2;
  c.widths = {32, 64}, c.step_embed = 16, c.kernel = 3, c.groups = 8;
  c.train_steps = 50, c.inference_steps = 10;
  c.lr = 3e-3, c.lr_warmup = 20, c.batch_size = 128;
  DiffusionPolicy dp(chunked_spec(1, 1, 2, 1), c, RunContext{});
  dp.fit_normalizer(torch::zeros({1}), torch::zeros({1}), torch::full({1}, -1.0f), torch::full({1}, 1.0f));
  dp.plan_updates(600);
  return dp;
}

/// Fits `dp` to demonstrations that push all +1 or all -1, half and half, whatever they see,
/// then samples 400 sequences: {share near +1, share near -1, share in between}.
std::array<double, 3> bimodal(DiffusionPolicy& dp) {
  torch::manual_seed(1);
  StepContext sc;
  for (int i = 0; i < 600; ++i) {
    ReplayBatch b;
    b.obs = torch::zeros({128, 1});
    b.action = (torch::randint(2, {128, 1}).to(torch::kFloat) * 2 - 1).expand({128, 4}).contiguous();
    dp.update(b, sc);
  }
  const auto seq = dp.predict(torch::zeros({400, 1})).mean({1, 2});
  return {(seq > 0.7).to(torch::kFloat).mean().item<double>(), (seq < -0.7).to(torch::kFloat).mean().item<double>(),
          (seq.abs() < 0.5).to(torch::kFloat).mean().item<double>()};
}

}  // namespace

TEST_CASE("Diffusion: a tiny diffusion policy keeps both modes of a bimodal demo set, where MSE BC averages them") {
  auto diffusion = tiny_policy(DiffusionObjective::ddpm);
  const auto d = bimodal(diffusion);
  MESSAGE("diffusion: near +1 " << d[0] << ", near -1 " << d[1] << ", between " << d[2]);
  CHECK(d[0] > 0.3);
  CHECK(d[1] > 0.3);
  CHECK(d[2] < 0.1);
  auto mse = tiny_policy(DiffusionObjective::mse);
  const auto m = bimodal(mse);
  MESSAGE("mse: near +1 " << m[0] << ", near -1 " << m[1] << ", between " << m[2]);
  CHECK(m[2] > 0.99);  // the mean of the modes, 0
}

TEST_CASE("Diffusion: BF16 autocast trains the U-Net on the CPU, its loss close to FP32's, norms and activations in float32") {
  DiffusionPolicy::Config c;
  c.obs_horizon = 2, c.horizon = 8, c.action_horizon = 4, c.widths = {16, 32}, c.step_embed = 16, c.kernel = 3, c.groups = 8;
  c.lr = 3e-3, c.lr_warmup = 0, c.lr_cosine = false;
  torch::manual_seed(1);
  DiffusionPolicy dp(chunked_spec(2, 3, 4, 2), c, RunContext{});
  dp.fit_normalizer(torch::full({3}, -1.0), torch::full({3}, 1.0), torch::full({2}, -1.0), torch::full({2}, 1.0));
  StepContext::Options o;
  o.autocast = true;
  o.autocast_dtype = at::kBFloat16;
  StepContext bf16(o);
  StepContext fp32;
  torch::manual_seed(2);
  ReplayBatch b;
  b.obs = torch::rand({16, 6}) * 2 - 1;
  b.action = torch::rand({16, 16}) * 2 - 1;
  // One fixed draw of noise and steps: the loss on it, in either precision.
  const auto noise = torch::randn({16, 8, 2});
  const auto k = torch::randint(100, {16}, torch::kLong);
  const auto loss_in = [&](StepContext& ctx) {
    double v = 0;
    torch::NoGradGuard ng;
    (void)dp.loss(b.obs, b.action, ctx, v, noise, k);
    return v;
  };
  // BF16 computes the same loss as FP32, to BF16's precision.
  const double start32 = loss_in(fp32), start16 = loss_in(bf16);
  CHECK(start16 == doctest::Approx(start32).epsilon(0.05));
  CHECK(start16 != start32);  // and it did run in BF16
  // It trains: 200 BF16 updates bring the FP32 loss on the fixed draw well down.
  for (int i = 0; i < 200; ++i) {
    const auto info = dp.update(b, bf16);
    REQUIRE(std::isfinite(info.metrics[0].second));
  }
  const double end32 = loss_in(fp32);
  MESSAGE("loss on a fixed draw: " << start32 << " -> " << end32);
  CHECK(start32 > 0.5);  // a squared error of unit noise from an untrained network
  CHECK(end32 > 0);
  CHECK(end32 < 0.5 * start32);
  const bool float32 = dp.optimizer().parameters().flat().scalar_type() == at::kFloat;
  CHECK(float32);  // the weights stay float32
  // Under BF16 autocast a block's convolution runs in BF16, its GroupNorm and Mish in float32.
  nn::ConvBlock1d blk(4, 16, 3, 8);
  const auto x = torch::randn({2, 4, 8});
  AutocastGuard g(c10::DeviceType::CPU, true, at::kBFloat16);
  const auto h = blk->conv->forward(x);
  const bool conv_bf16 = h.scalar_type() == at::kBFloat16;
  CHECK(conv_bf16);
  const auto y = blk->forward(x);
  const bool out_float32 = y.scalar_type() == at::kFloat;
  CHECK(out_float32);
  CHECK(torch::equal(y, at::mish(blk->norm->forward(h.to(at::kFloat)))));
}

TEST_CASE("Diffusion: the policy's spec checks name the field") {
  DiffusionPolicy::Config c;
  c.widths = {8}, c.step_embed = 8, c.groups = 4;
  CHECK_THROWS_WITH_AS(DiffusionPolicy(chunked_spec(1, 5, 8, 2), [&] { auto x = c; x.obs_horizon = 2; return x; }(), RunContext{}),
                       doctest::Contains("diffusion.obs_horizon: chunked's observation has 5 numbers, not a multiple of 2"), ConfigError);
  CHECK_THROWS_WITH_AS(DiffusionPolicy(chunked_spec(2, 5, 3, 2), c, RunContext{}),
                       doctest::Contains("diffusion.action_horizon: chunked's action has 6 numbers, not a multiple of 8"), ConfigError);
  auto h = c;
  h.horizon = 8;
  CHECK_THROWS_WITH_AS(DiffusionPolicy(chunked_spec(2, 5, 8, 2), h, RunContext{}), doctest::Contains("diffusion.horizon: is 8"),
                       ConfigError);
  DiffusionPolicy dp(chunked_spec(2, 5, 8, 2), c, RunContext{});
  CHECK_THROWS_WITH_AS(dp.predict(torch::zeros({1, 10})), doctest::Contains("no normalisation yet"), Error);
}

TEST_CASE("MultiStep: a window of observations, chunks of actions, stopping at the episode's end") {
  envs::MultiStep<envs::Pendulum> env(envs::Pendulum{}, 2, 3);
  CHECK(env.observation_space().size() == 6u);
  CHECK(env.action_space().size() == 3u);
  CHECK(env.action_space().high[2] == 2.0f);
  const auto first = std::vector<float>(env.reset(4).begin(), env.reset(4).end());
  CHECK(std::equal(first.begin(), first.begin() + 3, first.begin() + 3));  // the first observation twice
  envs::Pendulum ref;
  ref.reset(4);
  double sum = 0;
  const std::array<float, 3> chunk{0.5f, -1.0f, 2.0f};
  std::vector<float> prev, last;
  for (float a : chunk) {
    const auto r = ref.step(std::array<float, 1>{a});
    sum += r.reward;
    prev = last;
    last.assign(r.observation.begin(), r.observation.end());
  }
  const auto r = env.step(chunk);
  CHECK(r.reward == doctest::Approx(sum));
  const std::vector<float> got(r.observation.begin(), r.observation.end());
  CHECK(std::vector<float>(got.begin(), got.begin() + 3) == prev);
  CHECK(std::vector<float>(got.begin() + 3, got.end()) == last);
  // 200 steps: the 67th chunk ends after 2 of its 3 actions, truncated.
  int chunks = 1;
  for (auto s = env.step(chunk); !s.truncated; s = env.step(chunk)) ++chunks;
  CHECK(chunks + 1 == 67);
  CHECK(env.env().elapsed_steps() == 200);
  CHECK_THROWS_WITH_AS(env.step(std::array<float, 2>{0, 0}), doctest::Contains("a chunk of 2 numbers; expected 3 actions of 1"),
                       envs::EnvError);
}

#if ANVIL_WITH_HDF5
namespace {

/// Demonstrations of Pendulum by an energy-shaping swing-up controller, written to a file.
std::filesystem::path pendulum_demos(const std::filesystem::path& dir, int episodes) {
  Demonstrations d;
  d.env_name = "Pendulum-v1";
  d.obs_dim = 3, d.act_dim = 1;
  envs::Pendulum env;
  for (int e = 0; e < episodes; ++e) {
    std::vector<float> o, a, r;
    std::vector<std::uint8_t> dn;
    auto obs = std::vector<float>(env.reset(100 + e).begin(), env.reset(100 + e).end());
    for (int t = 0; t < 60; ++t) {
      const auto s = env.state();
      const double energy = 0.5 * s.theta_dot * s.theta_dot / 3 + 5 * (std::cos(s.theta) - 1);
      const float u = static_cast<float>(std::clamp(-2.0 * s.theta_dot * energy - 0.5 * std::sin(s.theta), -2.0, 2.0));
      o.insert(o.end(), obs.begin(), obs.end());
      a.push_back(u);
      const auto res = env.step(std::array<float, 1>{u});
      r.push_back(static_cast<float>(res.reward));
      dn.push_back(t == 59);
      obs.assign(res.observation.begin(), res.observation.end());
    }
    d.add_episode(o, a, r, dn);
  }
  std::filesystem::create_directories(dir);
  const auto path = dir / "pendulum_demos.hdf5";
  write_demonstrations(path, d);
  return path;
}

using DpTrainer = Trainer<DiffusionPolicy, DemoDataset>;

DpTrainer::Config dp_config(const std::string& run, const std::filesystem::path& demos) {
  DpTrainer::Config c;
  c.run->device = "cpu";
  c.run->run_dir = temp_run_dir(run);
  c.run->progress = ProgressMode::off;
  c.run->tensorboard = false;
  c.algorithm->obs_horizon = 2, c.algorithm->horizon = 8, c.algorithm->action_horizon = 4;
  c.algorithm->widths = {16, 32}, c.algorithm->step_embed = 16, c.algorithm->kernel = 3;
  c.algorithm->batch_size = 32, c.algorithm->lr_warmup = 5;
  c.algorithm->train_steps = 20, c.algorithm->inference_steps = 4;
  c.train->dataset = demos.string();
  c.train->steps = 40;
  c.train->update->ema_decay = 0.999;
  c.train->update->grad_accumulation = 2;
  c.train->eval_interval = 20;
  c.train->eval_episodes = 2;
  c.run->checkpoint_interval = 20;
  c.run->seed = 9;
  return c;
}

// The run's actions for `obs` (the averaged weights, as it acts) and the noise its sampler drew
// from torch's generator, drawn again in that order (the start, then one draw per step of
// `steps`): the cases tests/python/policy_check.py replays.
std::vector<std::pair<std::string, at::Tensor>> sampled_cases(DpTrainer& t, const at::Tensor& obs, std::int64_t steps) {
  auto& dp = t.algorithm();
  const auto action = dp.with_ema_weights([&] {
    torch::manual_seed(5);
    return t.collector().to_env(dp.act(obs, ActMode::deterministic));
  });
  torch::manual_seed(5);
  const std::vector<std::int64_t> shape{obs.size(0), *dp.config().horizon, dp.act_dim()};
  const auto noise = torch::randn(shape);
  std::vector<at::Tensor> z;
  for (std::int64_t s = 0; s < steps; ++s) z.push_back(torch::randn(shape));
  return {{"obs", obs}, {"noise", noise}, {"step_noise", at::stack(z)}, {"action", action}};
}

}  // namespace

TEST_CASE("DiffusionPolicy: trains from demonstrations through the offline loop, EMA and loader position resumed exactly") {
  const auto dir = std::filesystem::path(temp_run_dir("dp_demos"));
  const auto demos = pendulum_demos(dir, 6);
  const envs::MultiStep<envs::Pendulum> env(envs::Pendulum{}, 2, 4);
  auto c = dp_config("dp_a", demos);
  DpTrainer a(env, c);
  CHECK(a.buffer().size() == 6 * (60 - 8 + 4 - 1 + 2));  // windows from -1 to length - horizon + action_horizon - 1
  const auto ra = a.fit();
  CHECK(ra.updates == 40);
  CHECK(ra.env_steps == 0);
  CHECK(a.algorithm().ema().updates() == 40);  // once per optimizer step, not per micro-batch
  CHECK(a.buffer().epoch() * a.buffer().share() + a.buffer().offset() == 40 * 32);
  CHECK(std::isfinite(a.last_evaluation().mean));

  auto rc = c;
  rc.run->run_dir = temp_run_dir("dp_b");
  rc.run->resume = (std::filesystem::path(*c.run->run_dir) / "checkpoint-000000000020.ckpt").string();
  DpTrainer b(env, rc);
  b.fit();
  CHECK(torch::equal(a.algorithm().optimizer().parameters().flat(), b.algorithm().optimizer().parameters().flat()));
  CHECK(torch::equal(a.algorithm().ema().weights(), b.algorithm().ema().weights()));
  CHECK(a.algorithm().ema().updates() == b.algorithm().ema().updates());
  CHECK(a.buffer().offset() == b.buffer().offset());

  // How the denoiser samples is acting only (FieldRole::acting): a resumed run may change it,
  // and learns the same (its evaluations sample otherwise); a field it learns by may not.
  auto ddpm = rc;
  ddpm.run->run_dir = temp_run_dir("dp_ddpm");
  ddpm.algorithm->sampler = DiffusionSampler::ddpm, ddpm.algorithm->ddim_eta = 0.5, ddpm.algorithm->clip_sample = false;
  ddpm.algorithm->inference_steps = 2;
  DpTrainer d(env, ddpm);
  d.fit();
  CHECK(torch::equal(a.algorithm().optimizer().parameters().flat(), d.algorithm().optimizer().parameters().flat()));
  CHECK(std::isfinite(d.last_evaluation().mean));
  auto longer = rc;
  longer.run->run_dir = temp_run_dir("dp_k");
  longer.algorithm->train_steps = 30;
  CHECK_THROWS_WITH_AS(DpTrainer(env, longer).fit(),
                       doctest::Contains("was written by a run with diffusion.train_steps = 20; this run has diffusion.train_steps = 30"), Error);

  // A checkpoint resumed on another dataset is refused: by its config when the path
  // differs, by the data when the file at the same path was replaced.
  auto other = rc;
  other.run->run_dir = temp_run_dir("dp_c");
  other.train->dataset = pendulum_demos(dir / "other", 5).string();
  CHECK_THROWS_WITH_AS(DpTrainer(env, other).fit(), doctest::Contains("this run has train.dataset"), Error);
  std::filesystem::copy_file(other.train->dataset.value, demos, std::filesystem::copy_options::overwrite_existing);
  other.train->dataset = demos.string();
  CHECK_THROWS_WITH_AS(DpTrainer(env, other).fit(), doctest::Contains("another dataset"), Error);
  // Demonstrations that do not fit the env are refused naming train.dataset.
  auto wide = c;
  wide.run->run_dir = temp_run_dir("dp_d");
  CHECK_THROWS_WITH_AS(DpTrainer(envs::MultiStep<envs::MountainCarContinuous>(envs::MountainCarContinuous{}, 2, 4), wide),
                       doctest::Contains(("train.dataset: '" + demos.string() + "' has observations of 3").c_str()), Error);
  for (const auto& p : {dir, std::filesystem::path(*c.run->run_dir), std::filesystem::path(*rc.run->run_dir),
                        std::filesystem::path(*ddpm.run->run_dir)})
    std::filesystem::remove_all(p);
}

TEST_CASE("DiffusionPolicy: policy.safetensors (the EMA network, normalisation, schedule) acts in PyTorch as the run's policy from the same noise") {
  const auto dir = std::filesystem::path(temp_run_dir("dp_export_demos"));
  const auto demos = pendulum_demos(dir, 4);
  const envs::MultiStep<envs::Pendulum> env(envs::Pendulum{}, 2, 4);
  for (const bool ddim : {true, false}) {
    CAPTURE(ddim);
    auto c = dp_config(ddim ? "dp_export_ddim" : "dp_export_ddpm", demos);
    c.train->steps = 20;
    c.train->update->grad_accumulation = 1;
    c.train->eval_interval = 0;
    c.run->checkpoint_interval = 0;
    c.algorithm->sampler = ddim ? DiffusionSampler::ddim : DiffusionSampler::ddpm;
    DpTrainer t(env, c);
    t.fit();
    const std::filesystem::path run = *c.run->run_dir;
    REQUIRE(std::filesystem::exists(run / "policy.safetensors"));
    const std::int64_t n = 1000, steps = ddim ? 4 : 20;
    torch::manual_seed(21);
    const auto obs = torch::rand({n, 6}) * torch::tensor({2.0f, 2.0f, 16.0f, 2.0f, 2.0f, 16.0f}) -
                     torch::tensor({1.0f, 1.0f, 8.0f, 1.0f, 1.0f, 8.0f});
    const auto cases = sampled_cases(t, obs, steps);
    CHECK((cases.back().second.abs() < 2.0 - 1e-3).to(at::kFloat).mean().item<double>() > 0.2);  // most inside the bounds
    ANVIL_CHECK_POLICY_IN_PYTHON(run / "policy.safetensors", cases, {});
    std::filesystem::remove_all(run);
  }
  std::filesystem::remove_all(dir);
}
#endif

#if ANVIL_WITH_HDF5 && ANVIL_WITH_CHIPMUNK
#include <anvil/envs/chipmunk/push_t_expert.hpp>
#include <anvil/envs/chipmunk/push_t_view.hpp>

TEST_CASE("DiffusionPolicy on images: Push-T's image variant learns from image demonstrations, resumes exactly, and acts in PyTorch as in C++") {
  using namespace anvil::envs::chipmunk;
  const auto dir = std::filesystem::path(temp_run_dir("dp_image_demos"));
  std::filesystem::create_directories(dir);
  // Two demonstrations of the expert, drawn at 24x24 beside agent_pos.
  Demonstrations d;
  d.env_name = "PushT";
  d.layout = push_t_image_layout(24);
  d.obs_dim = d.layout.row_bytes();
  d.act_dim = 2;
  auto canvas = push_t_canvas(24);
  PushT pusht;
  for (std::uint64_t seed = 0; d.episodes() < 2; ++seed) {
    std::vector<std::uint8_t> rows;
    std::vector<float> a;
    if (!PushTExpert{}.run(pusht, seed, [&](std::span<const float>, std::span<const float> act) {
          rows.resize(rows.size() + static_cast<std::size_t>(d.obs_dim));
          push_t_image_row(canvas, pusht, rows.data() + rows.size() - d.obs_dim);
          a.insert(a.end(), act.begin(), act.end());
        }))
      continue;
    std::vector<float> r(a.size() / 2, 0.0f);
    std::vector<std::uint8_t> dn(a.size() / 2, 0);
    dn.back() = 1;
    d.add_episode_rows(rows, a, r, dn);
  }
  const auto demos = dir / "images.hdf5";
  write_demonstrations(demos, d);

  const envs::MultiStep<PushTImage> env(PushTImage(24, PushT::Reward::best_gain), 2, 4);
  auto c = dp_config("dp_image_a", demos);
  c.algorithm->encoder->width = 8, c.algorithm->encoder->features = 8;
  c.train->steps = 20;
  c.run->checkpoint_interval = 10;
  DpTrainer a(env, c);
  auto& dp = a.algorithm();
  CHECK(dp.step_layout().describe() == "image uint8 [3,24,24], agent_pos float32 [2]");
  CHECK(dp.crop_layout().describe() == "image uint8 [3,21,21], agent_pos float32 [2]");  // 0.875 of 24
  const auto ranges = a.buffer().ranges();
  CHECK(ranges[0].numel() == 2);  // the float part alone: agent_pos
  CHECK(ranges[0].max().item<double>() >= 0.0);
  CHECK(ranges[1].max().item<double>() <= 512.0);
  const auto batch = a.buffer().sample(3);
  const bool bytes = batch.obs.scalar_type() == at::kByte;  // windows of rows of bytes
  CHECK(bytes);
  CHECK(batch.obs.size(1) == 2 * d.obs_dim);
  a.fit();
  CHECK(a.updates() == 20);
  CHECK(std::isfinite(a.last_evaluation().mean));  // acted on the image env (rows of bytes)

  auto rc = c;
  rc.run->run_dir = temp_run_dir("dp_image_b");
  rc.run->resume = (std::filesystem::path(*c.run->run_dir) / "checkpoint-000000000010.ckpt").string();
  DpTrainer b(env, rc);
  b.fit();
  CHECK(torch::equal(a.algorithm().optimizer().parameters().flat(), b.algorithm().optimizer().parameters().flat()));
  CHECK(torch::equal(a.algorithm().ema().weights(), b.algorithm().ema().weights()));

  // A state run on these files, and this run on state files, are refused naming the data.
  auto state_run = c;
  state_run.run->run_dir = temp_run_dir("dp_image_c");
  CHECK_THROWS_WITH_AS(DpTrainer(envs::MultiStep<PushT>(PushT{}, 2, 4), state_run).fit(), doctest::Contains("holds images (agent_pos float32 [2], image uint8 [3,24,24])"),
                       Error);

  // policy.safetensors: the EMA network and the encoder act in PyTorch as here, from the
  // same noise, on rows of the env (bytes) as it hands them out.
  const std::filesystem::path run = *c.run->run_dir;
  REQUIRE(std::filesystem::exists(run / "policy.safetensors"));
  const std::int64_t n = 6, steps = 4;
  auto probe = env;
  std::vector<std::uint8_t> rows;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto o = probe.reset(static_cast<std::uint64_t>(50 + i));
    rows.insert(rows.end(), o.begin(), o.end());
  }
  const auto obs = torch::from_blob(rows.data(), {n, 2 * d.obs_dim}, at::kByte).clone();
  ANVIL_CHECK_POLICY_IN_PYTHON(run / "policy.safetensors", sampled_cases(a, obs, steps), {});
  for (const auto& p : {dir, run, std::filesystem::path(*rc.run->run_dir), std::filesystem::path(*state_run.run->run_dir)})
    std::filesystem::remove_all(p);
}
#endif
