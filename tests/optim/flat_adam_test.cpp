// FlatParameters and FlatAdam: one contiguous buffer behind a module's parameters, and Adam
// over it matching torch's Adam step for step.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <anvil/nn/mlp.hpp>
#include <anvil/optim/flat_adam.hpp>

TEST_CASE("FlatParameters: every parameter becomes a view of one buffer, values kept") {
  torch::manual_seed(0);
  anvil::nn::Mlp net(3, std::vector<std::int64_t>{8, 8}, 2);
  std::vector<at::Tensor> before;
  for (auto& p : net->parameters()) before.push_back(p.detach().clone());
  auto x = torch::randn({5, 3});
  auto y0 = net->forward(x).detach();
  anvil::FlatParameters flat(net->parameters());
  auto params = net->parameters();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(torch::equal(params[i], before[i]));
    total += params[i].numel();
  }
  CHECK(flat.numel() == total);
  CHECK(torch::equal(net->forward(x), y0));
  // Writing the buffer writes the module's parameters.
  flat.flat().zero_();
  for (auto& p : net->parameters()) CHECK(p.abs().sum().item<float>() == 0.0f);
  CHECK(net->forward(x).abs().sum().item<float>() == 0.0f);
}

TEST_CASE("FlatAdam: matches torch::optim::Adam step for step") {
  torch::manual_seed(1);
  const std::vector<std::int64_t> h{16};
  anvil::nn::Mlp a(4, h, 3), b(4, h, 3);
  {
    torch::NoGradGuard g;
    auto pa = a->parameters(), pb = b->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  anvil::FlatAdam fa(a->parameters(), {.lr = 1e-2});
  torch::optim::Adam tb(b->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 50; ++step) {
    auto x = torch::randn({32, 4});
    auto la = a->forward(x).square().mean();
    auto grads = torch::autograd::grad({la}, fa.parameters().params());
    fa.step(fa.parameters().gather(grads));
    tb.zero_grad();
    b->forward(x).square().mean().backward();
    tb.step();
  }
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::allclose(pa[i], pb[i], 1e-5, 1e-6));
  CHECK(fa.steps() == 50);
}

TEST_CASE("FlatParameters: a parameter the loss does not reach gets a zero gradient") {
  torch::nn::Linear used(2, 1), unused(2, 1);
  std::vector<at::Tensor> ps = used->parameters();
  for (auto& p : unused->parameters()) ps.push_back(p);
  anvil::FlatParameters flat(ps);
  auto loss = used->forward(torch::ones({1, 2})).sum();
  auto g = flat.gather(torch::autograd::grad({loss}, flat.params(), {}, false, false, true));
  CHECK(g.numel() == flat.numel());
  CHECK(g.narrow(0, 3, 3).abs().sum().item<float>() == 0.0f);
  CHECK(g.narrow(0, 0, 3).abs().sum().item<float>() > 0.0f);
}
