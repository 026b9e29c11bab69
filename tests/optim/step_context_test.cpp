// StepContext: gradients for the optimizer's parameters only, clipping, autocast scope.
#include <anvil/optim/step_context.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cmath>
#include <limits>

#include <anvil/nn/mlp.hpp>

TEST_CASE("StepContext: minimize differentiates only the optimizer's parameters") {
  torch::manual_seed(0);
  torch::nn::Linear first(4, 4), second(4, 1);
  auto second_before = second->weight.clone();
  torch::optim::SGD opt(first->parameters(), torch::optim::SGDOptions(0.1));
  anvil::StepContext ctx;
  auto loss = second->forward(first->forward(torch::randn({8, 4}))).square().mean();
  CHECK(ctx.minimize(loss, opt));
  CHECK(first->weight.grad().defined());
  CHECK_FALSE(second->weight.grad().defined());  // no gradient was computed for it
  CHECK(torch::equal(second->weight, second_before));
}

TEST_CASE("StepContext: minimize matches backward() plus step() for the same parameters") {
  torch::manual_seed(1);
  torch::nn::Linear a(3, 2), b(3, 2);
  b->weight.data().copy_(a->weight.data());
  b->bias.data().copy_(a->bias.data());
  torch::optim::Adam oa(a->parameters(), 1e-2), ob(b->parameters(), 1e-2);
  auto x = torch::randn({5, 3});
  anvil::StepContext ctx;
  ctx.minimize(a->forward(x).pow(2).sum(), oa);
  ob.zero_grad();
  b->forward(x).pow(2).sum().backward();
  ob.step();
  CHECK(torch::allclose(a->weight, b->weight));
  CHECK(torch::allclose(a->bias, b->bias));
}

TEST_CASE("StepContext: gradients are clipped to max_grad_norm before the step") {
  torch::nn::Linear l(2, 1);
  torch::optim::SGD opt(l->parameters(), torch::optim::SGDOptions(1.0));
  anvil::StepContext ctx;
  auto w0 = l->weight.clone(), b0 = l->bias.clone();
  ctx.minimize(l->forward(torch::full({1, 2}, 1000.0f)).sum(), opt, /*max_grad_norm=*/0.5);
  const double moved = std::sqrt((l->weight - w0).square().sum().item<double>() +
                                 (l->bias - b0).square().sum().item<double>());
  CHECK(moved == doctest::Approx(0.5).epsilon(1e-4));
}

TEST_CASE("StepContext: the autocast scope is bfloat16 inside and float32 after") {
  anvil::StepContext::Options o;
  o.autocast = true;
  o.autocast_dtype = torch::kBFloat16;
  anvil::StepContext ctx(o);
  torch::Tensor inside;
  {
    auto guard = ctx.autocast();
    inside = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  }
  CHECK((inside.scalar_type() == torch::kBFloat16));
  CHECK((torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kFloat));
}

TEST_CASE("StepContext: under BF16 an Mlp's hidden layers run in bfloat16, its output layer and gradients in float32") {
  anvil::StepContext::Options o;
  o.autocast = true;
  o.autocast_dtype = torch::kBFloat16;
  anvil::StepContext ctx(o);
  torch::manual_seed(3);
  anvil::nn::Mlp net(4, std::vector<std::int64_t>{8, 8}, 1);
  torch::Tensor hidden, out;
  {
    auto guard = ctx.autocast();
    auto first = net->layers()[0];
    hidden = first->forward(torch::randn({16, 4}));
    out = net->forward(torch::randn({16, 4}));
    // Float32Scope turned autocast off for the output layer only: it is back on here.
    CHECK((torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kBFloat16));
  }
  CHECK((hidden.scalar_type() == torch::kBFloat16));
  CHECK((out.scalar_type() == torch::kFloat));
  // Master weights stay float32, and so do their gradients.
  auto grads = torch::autograd::grad({out.square().mean()}, net->parameters());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    CHECK((net->parameters()[i].scalar_type() == torch::kFloat));
    CHECK((grads[i].scalar_type() == torch::kFloat));
  }
  // Outside an autocast scope, Float32Scope changes nothing.
  const anvil::Float32Scope none(c10::DeviceType::CPU);
  CHECK_FALSE(none.active());
}

TEST_CASE("StepContext: with update threads, the steps cut into ranges and the fused Polyak average are the same bits as one after another") {
  // Three optimizers of uneven sizes (as SAC's critics, actor and temperature), odd sizes so
  // that the ranges' cuts and the vector loops' tails both fall inside; clipping on one.
  const std::vector<std::int64_t> sizes{20011, 9973, 1};
  const auto make = [&](std::vector<anvil::FlatAdam>& opts, std::vector<at::Tensor>& params, at::Tensor& target) {
    torch::manual_seed(3);
    for (const auto n : sizes) {
      params.push_back(torch::randn({n}));
      opts.emplace_back(std::vector<at::Tensor>{params.back()}, anvil::FlatAdam::Options{.lr = 3e-3});
    }
    target = torch::randn({sizes[0]});
  };
  std::vector<anvil::FlatAdam> serial_opts, ranged_opts;
  std::vector<at::Tensor> serial_params, ranged_params;
  at::Tensor serial_target, ranged_target;
  make(serial_opts, serial_params, serial_target);
  make(ranged_opts, ranged_params, ranged_target);
  std::vector<at::Tensor> initial;
  for (const auto& p : serial_params) initial.push_back(p.clone());
  const auto initial_target = serial_target.clone();
  anvil::StepContext serial;  // one thread: each step whole, then the average
  anvil::StepContext::Options o;
  o.threads = 2;
  anvil::StepContext ranged(o);
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);
    std::vector<at::Tensor> grads;
    for (const auto n : sizes) grads.push_back(torch::randn({n}) * (step == 2 ? 1e-20 : 1.0));  // one step's denormal-ish moments
    const auto steps_for = [&](std::vector<anvil::FlatAdam>& opts, const at::Tensor& target) {
      std::vector<anvil::StepContext::Step> s;
      for (std::size_t i = 0; i < opts.size(); ++i) s.push_back({&opts[i], grads[i].clone(), i == 1 ? 0.5 : 0.0});
      if (step % 2 == 0) s[0].then_polyak = target, s[0].tau = 0.005;
      return s;
    };
    CHECK(serial.apply(steps_for(serial_opts, serial_target)) == 3);
    CHECK(ranged.apply(steps_for(ranged_opts, ranged_target)) == 3);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    INFO("optimizer " << i);
    CHECK(serial_opts[i].steps() == 5);
    CHECK(ranged_opts[i].steps() == 5);
    CHECK_FALSE(torch::equal(serial_params[i], initial[i]));  // they moved
    CHECK(torch::equal(serial_params[i], ranged_params[i]));
  }
  CHECK_FALSE(torch::equal(serial_target, initial_target));  // the average followed them
  CHECK(torch::equal(serial_target, ranged_target));
}

TEST_CASE("StepContext::clip: a float gradient on the host is clipped as LibTorch's ops clip it") {
  torch::manual_seed(5);
  const auto torch_clip = [](at::Tensor g, double max) {
    return g.mul((max / (g.norm() + 1e-6)).clamp_max(1.0));
  };
  // Too long: scaled to max_grad_norm, the direction kept (odd size: the loops' tails).
  auto g = torch::randn({8837}) * 3.0;
  const auto expected = torch_clip(g, 0.5);
  anvil::StepContext::clip(g, 0.5);
  CHECK(g.norm().item<double>() == doctest::Approx(0.5).epsilon(1e-5));
  CHECK(torch::allclose(g, expected, 1e-5, 1e-9));
  // Short enough: the same bits; 0: not clipped at all.
  auto s = torch::randn({33}) * 1e-3;
  const auto before = s.clone();
  anvil::StepContext::clip(s, 0.5);
  CHECK(torch::equal(s, before));
  auto l = torch::randn({33}) * 100.0;
  const auto long_before = l.clone();
  anvil::StepContext::clip(l, 0.0);
  CHECK(torch::equal(l, long_before));
  // A NaN anywhere makes the whole gradient NaN, as with LibTorch's ops (the step's weights
  // then fail the finite check instead of moving silently).
  auto n = torch::randn({100});
  n[17] = std::numeric_limits<float>::quiet_NaN();
  anvil::StepContext::clip(n, 0.5);
  CHECK(n.isnan().all().item<bool>());
  // Elsewhere (here a double gradient) LibTorch's ops run: the same figures.
  auto d = torch::randn({500}, torch::kDouble) * 3.0;
  const auto d_expected = torch_clip(d, 0.5);
  anvil::StepContext::clip(d, 0.5);
  CHECK(torch::allclose(d, d_expected));
}
