// The dynamic loss scaler inside StepContext: scale, unscale before clipping, skip and
// back off on inf/nan without touching parameters or optimizer state, grow after a run of
// finite steps. Runs on the CPU: the scaler's logic does not depend on float16.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <limits>

#include <anvil/precision/loss_scaler.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/step_context.hpp>

using anvil::FlatAdam;
using anvil::LossScaler;
using anvil::StepContext;

namespace {
StepContext scaled_context(LossScaler::Options o = {}) {
  StepContext::Options opt;
  opt.loss_scaling = o;
  return StepContext(opt);
}
}  // namespace

TEST_CASE("LossScaler: starts at 2^16 with the standard schedule") {
  LossScaler s(LossScaler::Options{});
  CHECK(s.current_scale() == 65536.0);
  CHECK(s.options().growth_factor == 2.0);
  CHECK(s.options().backoff_factor == 0.5);
  CHECK(s.options().growth_interval == 2000);
}

TEST_CASE("LossScaler: an inf gradient skips the step, leaves parameters and Adam state alone, halves the scale") {
  torch::manual_seed(0);
  torch::nn::Linear l(3, 1);
  FlatAdam opt(l->parameters(), {.lr = 0.1});
  auto ctx = scaled_context();
  // One good step first, so the optimizer has state to protect.
  REQUIRE(ctx.minimize(l->forward(torch::randn({4, 3})).sum(), opt));
  auto params = opt.parameters().flat().clone();
  auto m = opt.exp_avg().clone(), v = opt.exp_avg_sq().clone();
  const auto steps = opt.steps();
  const double inf = std::numeric_limits<double>::infinity();
  auto bad = (l->forward(torch::randn({4, 3})) * inf).sum();
  CHECK_FALSE(ctx.minimize(bad, opt));
  CHECK(torch::equal(opt.parameters().flat(), params));
  CHECK(torch::equal(opt.exp_avg(), m));
  CHECK(torch::equal(opt.exp_avg_sq(), v));
  CHECK(opt.steps() == steps);
  CHECK(ctx.scaler()->current_scale() == 32768.0);
  CHECK(ctx.scaler()->good_steps() == 0);
  CHECK(ctx.scaler()->skipped() == 1);
}

TEST_CASE("LossScaler: a NaN gradient is skipped and backs off the same way, torch optimizers too") {
  torch::manual_seed(1);
  torch::nn::Linear l(3, 1);
  torch::optim::Adam opt(l->parameters(), 0.1);
  auto ctx = scaled_context();
  REQUIRE(ctx.minimize(l->forward(torch::randn({4, 3})).sum(), opt));
  auto w = l->weight.clone();
  auto& state = opt.state();
  const auto state_size = state.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(ctx.minimize((l->forward(torch::randn({4, 3})) * nan).sum(), opt));
  CHECK(torch::equal(l->weight, w));
  CHECK(state.size() == state_size);
  CHECK(ctx.scaler()->current_scale() == 32768.0);
  // The next finite step goes through at the reduced scale.
  CHECK(ctx.minimize(l->forward(torch::randn({4, 3})).sum(), opt));
  CHECK_FALSE(torch::equal(l->weight, w));
}

TEST_CASE("LossScaler: the scale doubles after growth_interval consecutive finite steps") {
  torch::manual_seed(2);
  torch::nn::Linear l(2, 1);
  FlatAdam opt(l->parameters(), {.lr = 1e-4});
  auto ctx = scaled_context();
  auto x = torch::randn({8, 2});
  for (int i = 0; i < 1999; ++i) REQUIRE(ctx.minimize(l->forward(x).square().mean(), opt));
  CHECK(ctx.scaler()->current_scale() == 65536.0);
  REQUIRE(ctx.minimize(l->forward(x).square().mean(), opt));
  CHECK(ctx.scaler()->current_scale() == 131072.0);
  CHECK(ctx.scaler()->good_steps() == 0);
}

TEST_CASE("LossScaler: a finite scaled step equals the unscaled step, clipping included") {
  for (double clip : {0.0, 0.01}) {
    torch::manual_seed(3);
    torch::nn::Linear a(4, 2), b(4, 2);
    {
      torch::NoGradGuard g;
      b->weight.copy_(a->weight);
      b->bias.copy_(a->bias);
    }
    FlatAdam oa(a->parameters(), {.lr = 0.05}), ob(b->parameters(), {.lr = 0.05});
    auto scaled = scaled_context({.init_scale = 1024.0});
    StepContext plain;
    auto x = torch::randn({16, 4}) * 10;
    for (int i = 0; i < 5; ++i) {
      scaled.minimize(a->forward(x).square().mean(), oa, clip);
      plain.minimize(b->forward(x).square().mean(), ob, clip);
    }
    // Clipping saw the unscaled gradient: with scale 1024 and no unscaling the clipped
    // update would be the same but the unclipped one 1024x too large.
    CHECK(torch::allclose(oa.parameters().flat(), ob.parameters().flat(), 1e-5, 1e-6));
  }
}

TEST_CASE("LossScaler: its state restores for checkpoints") {
  LossScaler s(LossScaler::Options{});
  s.restore(512.0, 17, 3);
  CHECK(s.current_scale() == 512.0);
  CHECK(s.good_steps() == 17);
  CHECK(s.skipped() == 3);
}
