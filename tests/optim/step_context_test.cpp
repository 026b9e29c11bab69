// StepContext: gradients for the optimizer's parameters only, clipping, autocast scope.
#include <anvil/optim/step_context.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

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
