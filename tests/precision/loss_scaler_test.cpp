// The dynamic loss scaler inside StepContext: scale, unscale before clipping, skip and
// back off on inf/nan without touching parameters or optimizer state, grow after a run of
// finite steps. Runs on the CPU: the scaler's logic does not depend on float16.
#include <anvil/precision/loss_scaler.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/types.h>

#include <cstdint>
#include <limits>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
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

namespace {
// One flat-Adam step through `ctx` as a CUDA graph holds it (the captured path, op by op):
// the optimizer's device state synced before, the step gated by the scaler's check on the
// device, and the host's counts after, as an algorithm's replay does.
void captured_step(StepContext& ctx, FlatAdam& opt, at::Tensor grad, double clip) {
  opt.sync_device_state();
  {
    const StepContext::Capture capture(ctx);
    ctx.apply(opt, std::move(grad), clip);
  }
  opt.count_step();
  ctx.count_steps(1);
}
}  // namespace

TEST_CASE("LossScaler on the device: the skip and the scale's update as device work match the host's decisions") {
  // A CUDA graph cannot hold a host decision, so with the scaler on the device the check, the
  // skip (parameters, moments and step count kept where the gradient is not finite) and the
  // schedule are tensor ops. Finite, inf and NaN gradients, growth after 3 finite steps,
  // clipping on and off: the device's scaler and optimizer agree with the host's after
  // every step.
  for (const double clip : {0.0, 0.5}) {
    CAPTURE(clip);
    torch::manual_seed(5);
    torch::nn::Linear a(4, 3), b(4, 3);
    {
      torch::NoGradGuard g;
      b->weight.copy_(a->weight);
      b->bias.copy_(a->bias);
    }
    FlatAdam host_opt(a->parameters(), {.lr = 0.05, .weight_decay = 0.01});
    FlatAdam device_opt(b->parameters(), {.lr = 0.05, .weight_decay = 0.01});
    const LossScaler::Options schedule{.init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3};
    StepContext host = scaled_context(schedule);
    StepContext::Options o;
    o.loss_scaling = schedule;
    o.loss_scaler_on_device = true;
    StepContext device(o);
    REQUIRE(device.scaler()->on_device());
    REQUIRE_FALSE(host.scaler()->on_device());
    CHECK(device.graphable());
    CHECK_FALSE(host.graphable());
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    // the gradient's one odd value, step by step (0: all finite)
    const std::vector<double> odd{0, 0, inf, 0, 0, 0, 0, nan, -inf, 0, 0, 0, 0, 0};
    const auto n = host_opt.parameters().numel();
    for (std::size_t k = 0; k < odd.size(); ++k) {
      CAPTURE(k);
      auto g = torch::randn({n}) * host.scaler()->current_scale();  // as if scaled
      if (odd[k] != 0) g[static_cast<std::int64_t>(k) % n] = odd[k];
      const bool stepped = host.apply(host_opt, g.clone(), clip);
      CHECK(stepped == (odd[k] == 0));
      captured_step(device, device_opt, g.clone(), clip);
      CHECK(torch::allclose(device_opt.parameters().flat(), host_opt.parameters().flat(), 1e-5, 1e-7));
      CHECK(torch::allclose(device_opt.exp_avg(), host_opt.exp_avg(), 1e-5, 1e-7));
      CHECK(torch::allclose(device_opt.exp_avg_sq(), host_opt.exp_avg_sq(), 1e-5, 1e-9));
      CHECK(device_opt.steps() == host_opt.steps());
      CHECK(device.steps() == host.steps());
      CHECK(device.scaler()->current_scale() == host.scaler()->current_scale());
      CHECK(device.scaler()->good_steps() == host.scaler()->good_steps());
      CHECK(device.scaler()->skipped() == host.scaler()->skipped());
    }
    CHECK(host.scaler()->skipped() == 3);
    CHECK(host.steps() == static_cast<std::int64_t>(odd.size()) - 3);
    CHECK(host.scaler()->current_scale() == 512.0);  // halved at steps 2, 7 and 8, doubled at 5 and 11
  }
}

TEST_CASE("LossScaler on the device: two optimizers' steps in one scaler step, a checkpoint's state, a host read of the count") {
  const LossScaler::Options schedule{.init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2};
  for (const bool on_device : {false, true}) {
    CAPTURE(on_device);
    LossScaler s(schedule);
    if (on_device) s.keep_on(c10::kCPU);
    auto check = [&](at::Tensor g) { return on_device ? s.unscale_and_check_on_device(g).item<bool>() : s.unscale_and_check(g); };
    for (int step = 0; step < 2; ++step) {
      s.begin_step();
      CHECK(check(torch::ones({3})));
      CHECK(check(torch::ones({3})));
      s.end_step();
    }
    CHECK(s.current_scale() == 2048.0);
    s.begin_step();
    CHECK(check(torch::ones({3})));
    CHECK_FALSE(check(torch::tensor({1.0f, INFINITY, 0.0f})));
    s.end_step();
    CHECK(s.current_scale() == 1024.0);
    CHECK(s.good_steps() == 0);
    CHECK(s.skipped() == 1);
    s.restore(512.0, 1, 4);
    CHECK(s.current_scale() == 512.0);
    CHECK(s.good_steps() == 1);
    CHECK(s.skipped() == 4);
    CHECK(check(torch::ones({2})));  // the second finite step in a row: the scale grows
    CHECK(s.current_scale() == 1024.0);
  }
  // A host scaler has no device state to check on.
  LossScaler host(schedule);
  auto g = torch::ones({2});
  CHECK_THROWS_AS((void)host.unscale_and_check_on_device(g), anvil::Error);
  // A step context on CUDA keeps its scaler there; elsewhere only when asked.
  StepContext::Options o;
  o.loss_scaling = schedule;
  CHECK_FALSE(StepContext(o).scaler()->on_device());
  CHECK(StepContext(o).why_not_graphable().find("the loss scaler's state is on the host") == 0);
  o.loss_scaler_on_device = true;
  CHECK(StepContext(o).why_not_graphable().empty());
}

TEST_CASE("LossScaler on the device: a checkpoint of the step context and the optimizer restores the counts skipped steps left") {
  torch::manual_seed(6);
  torch::nn::Linear l(3, 2);
  FlatAdam opt(l->parameters(), {.lr = 0.01});
  StepContext::Options o;
  o.loss_scaling = LossScaler::Options{.init_scale = 8.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 100};
  o.loss_scaler_on_device = true;
  StepContext ctx(o);
  const auto n = opt.parameters().numel();
  for (int k = 0; k < 5; ++k) {
    auto g = torch::randn({n});
    if (k == 1 || k == 3) g[0] = std::numeric_limits<float>::infinity();
    captured_step(ctx, opt, g, 0.0);
  }
  CHECK(opt.steps() == 3);
  CHECK(ctx.steps() == 3);
  auto w = anvil::BinaryWriter::in_memory("checkpoint");
  ctx.save(w);
  opt.save(w);
  const auto bytes = w.take_bytes();
  torch::nn::Linear l2(3, 2);
  FlatAdam restored_opt(l2->parameters(), {.lr = 0.01});
  StepContext restored(o);
  anvil::BinaryReader r(bytes, "checkpoint", "checkpoint");
  restored.restore(restored.read(r));
  restored_opt.restore(restored_opt.read(r, "optimizer"));
  CHECK(restored.steps() == 3);
  CHECK(restored.scaler()->skipped() == 2);
  CHECK(restored.scaler()->current_scale() == 2.0);
  CHECK(restored_opt.steps() == 3);
  CHECK(torch::equal(restored_opt.parameters().flat(), opt.parameters().flat()));
  // the next captured step continues the count from the restored one
  captured_step(restored, restored_opt, torch::randn({n}), 0.0);
  CHECK(restored_opt.steps() == 4);
  CHECK(restored.steps() == 4);
}
