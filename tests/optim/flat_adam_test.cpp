// FlatParameters and FlatAdam: one contiguous buffer behind a module's parameters, and Adam
// over it matching torch's Adam step for step. Also the kernels of the hand-written fast
// paths: BLAS called directly (and LibTorch's products where no BLAS is found), and both
// builds of the element-wise kernels (the baseline one runs on CPUs without AVX-512).
#include <anvil/optim/flat_adam.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/optim/adam.h>
#include <torch/types.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/optim/ema.hpp>

#include "../skip.hpp"

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

TEST_CASE("FlatAdam: step_on_device (step count and learning rate read from tensors) follows step, through learning-rate changes and a restore") {
  torch::manual_seed(0);
  auto make = [] {
    std::vector<at::Tensor> p{torch::randn({7, 5}), torch::randn({5})};
    return p;
  };
  auto pa = make();
  std::vector<at::Tensor> pb;
  for (auto& t : pa) pb.push_back(t.clone());
  anvil::FlatAdam a(pa, {.lr = 1e-2, .weight_decay = 0.01});
  anvil::FlatAdam b(pb, {.lr = 1e-2, .weight_decay = 0.01});
  const auto close = [&] { return torch::allclose(a.parameters().flat(), b.parameters().flat(), 1e-6, 1e-7); };
  for (int i = 0; i < 30; ++i) {
    if (i == 10) {  // a schedule changes the rate: the device copy follows at the next sync
      a.set_lr(3e-3);
      b.set_lr(3e-3);
    }
    if (i == 20) {  // a restore (e.g. from a checkpoint) resets the count the device reads
      const anvil::FlatAdam::Saved s{a.parameters().flat().clone(), a.exp_avg().clone(), a.exp_avg_sq().clone(), 5, 2e-3};
      a.restore(s);
      b.restore(s);
    }
    const auto g = torch::randn({a.parameters().numel()});
    a.step(g);
    if (i % 7 == 3) {
      b.step(g);  // an op-by-op step between replays (a warm-up): the device count is stale after it
    } else {
      b.sync_device_state();
      b.step_on_device(g);
      b.count_step();
    }
    CHECK(a.steps() == b.steps());
    REQUIRE(close());
  }
  CHECK(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-6, 1e-8));
  CHECK(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-6, 1e-10));
  // Without the sync after an op-by-op step the device would use a wrong count: the check
  // above can fail.
  a.step(torch::ones({a.parameters().numel()}));
  b.step(torch::ones({b.parameters().numel()}));
  const auto g = torch::ones({a.parameters().numel()});
  a.step(g);
  b.step_on_device(g);  // no sync: bias correction from the count of the last sync
  CHECK_FALSE(close());
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

TEST_CASE("blas::gemm and the LibTorch fallback compute op(A) op(B) for every transpose, strided rows included") {
  // blas::gemm uses the BLAS of this process when it finds one (Debian's libtorch: the
  // libblas.so.3 it links), else its own loops; both must give the product.
  MESSAGE("BLAS sgemm_ found in this process: " << (anvil::blas::sgemm() ? "yes" : "no (loops)"));
  torch::manual_seed(3);
  const std::int64_t m = 7, n = 5, k = 9, pad = 3;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      // stored with longer rows than they use (lda, ldb, ldc > columns)
      const auto a_full = torch::randn({ta ? k : m, (ta ? m : k) + pad});
      const auto b_full = torch::randn({tb ? n : k, (tb ? k : n) + pad});
      const auto a = a_full.narrow(1, 0, ta ? m : k), b = b_full.narrow(1, 0, tb ? k : n);
      const auto c0 = torch::randn({m, n + pad});
      const auto want = 0.5 * c0.narrow(1, 0, n) + 2.0 * torch::mm(ta ? a.t() : a, tb ? b.t() : b);
      for (const bool fallback : {false, true}) {
        CAPTURE(fallback);
        auto c = c0.clone();
        const auto product = [&](auto gemm) {
          gemm(ta, tb, m, n, k, 2.f, a_full.data_ptr<float>(), a_full.size(1), b_full.data_ptr<float>(),
               b_full.size(1), 0.5f, c.data_ptr<float>(), c.size(1));
        };
        if (fallback) product([](auto... x) { anvil::nn::detail::torch_gemm(x...); });
        else product([](auto... x) { anvil::blas::gemm(x...); });
        CHECK(torch::allclose(c.narrow(1, 0, n), want, 1e-5, 1e-5));
        CHECK(torch::equal(c.narrow(1, n, pad), c0.narrow(1, n, pad)));  // padding untouched
      }
    }
}

TEST_CASE("simd kernels: every build this CPU runs gives LibTorch's results (the baseline one on every CPU)") {
  torch::manual_seed(4);
  const std::int64_t rows = 37, cols = 21, n = rows * cols;
  const auto x = torch::randn({rows, cols}) * 3, y = torch::randn({rows, cols});
  const auto bias = torch::randn({cols});
  auto close = [](const at::Tensor& a, const at::Tensor& b, double atol = 1e-6) {
    return torch::allclose(a, b, 1e-5, atol);
  };
  // Each kernel's builds: the baseline, and the AVX-512 one where the CPU has it.
  struct Build {
    const char* name;
    void (*add_bias)(float*, const float*, std::int64_t, std::int64_t, bool);
    void (*tanh)(float*, std::int64_t);
    void (*relu_backward)(float*, const float*, std::int64_t);
    void (*column_sums)(float*, const float*, std::int64_t, std::int64_t);
    void (*lerp)(float*, const float*, std::int64_t, float);
    void (*adam)(float*, float*, float*, const float*, std::int64_t, float, float, float, float, float, float, float,
                 float);
    void (*transpose)(float*, const float*, std::int64_t, std::int64_t);
  };
  std::vector<Build> builds;
#if ANVIL_SIMD_X86
  builds.push_back({"baseline", anvil::simd::add_bias_baseline, anvil::simd::tanh_baseline,
                    anvil::simd::relu_backward_baseline, anvil::simd::column_sums_baseline, anvil::simd::lerp_baseline,
                    anvil::simd::detail::adam_baseline, anvil::simd::detail::transpose_baseline});
  if (anvil::simd::avx512())
    builds.push_back({"avx512", anvil::simd::add_bias_avx512, anvil::simd::tanh_avx512,
                      anvil::simd::relu_backward_avx512, anvil::simd::column_sums_avx512, anvil::simd::lerp_avx512,
                      anvil::simd::detail::adam_avx512, anvil::simd::detail::transpose_avx512});
#else
  builds.push_back({"portable", anvil::simd::add_bias, anvil::simd::tanh, anvil::simd::relu_backward,
                    anvil::simd::column_sums, anvil::simd::lerp, anvil::simd::adam, anvil::simd::transpose});
#endif
  for (const auto& b : builds) {
    CAPTURE(b.name);
    for (const bool relu : {false, true}) {
      auto a = x.clone();
      b.add_bias(a.data_ptr<float>(), bias.data_ptr<float>(), rows, cols, relu);
      CHECK(close(a, relu ? (x + bias).clamp_min(0) : x + bias));
    }
    {
      auto a = x.clone();
      b.tanh(a.data_ptr<float>(), n);
      CHECK(torch::allclose(a, x.tanh(), 0, 3e-7));
    }
    {
      auto a = y.clone();
      b.relu_backward(a.data_ptr<float>(), x.data_ptr<float>(), n);
      CHECK(torch::equal(a, y * (x > 0).to(torch::kFloat)));
    }
    {
      auto a = torch::empty({cols});
      b.column_sums(a.data_ptr<float>(), x.data_ptr<float>(), rows, cols);
      CHECK(close(a, x.sum(0), 1e-5));
    }
    {
      auto a = x.clone();
      b.lerp(a.data_ptr<float>(), y.data_ptr<float>(), n, 0.005f);
      CHECK(close(a, x.lerp(y, 0.005)));
    }
    // whole 8x8 blocks, ragged edges, and shapes smaller than a block
    for (const auto& [r, c] : std::vector<std::pair<std::int64_t, std::int64_t>>{{rows, cols}, {64, 64}, {64, 3}, {5, 7}}) {
      const auto src = torch::randn({r, c});
      auto dst = torch::full({c, r}, std::nanf(""));
      b.transpose(dst.data_ptr<float>(), src.data_ptr<float>(), r, c);
      CHECK(torch::equal(dst, src.t().contiguous()));
    }
    {
      // one Adam step against its formula in LibTorch ops (FlatAdam's test covers many steps)
      auto w = x.clone(), m = y.clone() * 0.1, v = y.square() * 0.01;
      const auto g = torch::randn({rows, cols});
      const float b1 = 0.9f, b2 = 0.999f, c1 = 0.1f, c2 = 0.001f, sqrt_bc2 = 0.3f, eps = 1e-8f, step = -1e-3f;
      const auto m1 = m * b1 + g * c1, v1 = v * b2 + c2 * g * g;
      const auto w1 = w * 0.9999 + step * (m1 / (v1.sqrt() / sqrt_bc2 + eps));
      b.adam(w.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(), n, b1, b2, c1, c2,
             0.9999f, sqrt_bc2, eps, step);
      CHECK(close(m, m1));
      CHECK(close(v, v1));
      CHECK(close(w, w1));
    }
  }
}

TEST_CASE("simd::adam: moments that decay into the denormal range become zero, the weights move as without the flush, and the thread's float mode is left as it was") {
  const std::int64_t n = 1000;
  const float tiny = std::numeric_limits<float>::min();  // the smallest normal float
  // Half the weights have stopped learning (zero gradients: a dead unit), their moments just
  // above the smallest normal; the other half learn.
  std::vector<float> w(n), m(n), v(n), g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool dead = i % 2 == 0;
    w[i] = 0.01f * static_cast<float>(i % 17 + 1);
    m[i] = dead ? 1.05f * tiny : 1e-3f;    // times b1: below the smallest normal
    v[i] = dead ? 1.0005f * tiny : 1e-6f;  // times b2: the same
    g[i] = dead ? 0.0f : 1e-3f * static_cast<float>(i % 5 + 1);
  }
  auto w_plain = w, m_plain = m, v_plain = v;
  const float b1 = 0.9f, b2 = 0.999f, c1 = 0.1f, c2 = 0.001f, sqrt_bc2 = 0.3f, eps = 1e-8f, step = -1e-3f;
  // The same step without the flush (the formula written out, in float).
  for (std::int64_t i = 0; i < n; ++i) {
    m_plain[i] = m_plain[i] * b1 + g[i] * c1;
    v_plain[i] = v_plain[i] * b2 + c2 * g[i] * g[i];
    w_plain[i] = w_plain[i] + step * (m_plain[i] / (std::sqrt(v_plain[i]) / sqrt_bc2 + eps));
  }
#if ANVIL_SIMD_X86
  const unsigned before = _mm_getcsr();
#endif
  anvil::simd::adam(w.data(), m.data(), v.data(), g.data(), n, b1, b2, c1, c2, 1.0f, sqrt_bc2, eps, step);
  for (std::int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(w[i] == w_plain[i]);  // bitwise: a denormal moment moves no weight
    if (i % 2 == 0) {
      CHECK(std::fpclassify(m_plain[i]) == FP_SUBNORMAL);  // the plain step made denormals
      CHECK(std::fpclassify(v_plain[i]) == FP_SUBNORMAL);
      CHECK(m[i] == 0.0f);
      CHECK(v[i] == 0.0f);
    } else {
      CHECK(m[i] == doctest::Approx(m_plain[i]).epsilon(1e-6));
      CHECK(v[i] == doctest::Approx(v_plain[i]).epsilon(1e-6));
    }
  }
  for (int k = 0; k < 2; ++k)
    anvil::simd::adam(w.data(), m.data(), v.data(), g.data(), n, b1, b2, c1, c2, 1.0f, sqrt_bc2, eps, step);
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(std::fpclassify(m[i]) != FP_SUBNORMAL);
    CHECK(std::fpclassify(v[i]) != FP_SUBNORMAL);
  }
#if ANVIL_SIMD_X86
  CHECK(_mm_getcsr() == before);
  volatile float x = tiny;  // denormals still come out of this thread's own arithmetic
  CHECK(std::fpclassify(x * 0.5f) == FP_SUBNORMAL);
#endif
}

TEST_CASE("simd::exp and simd::log: within 2 ulp of std::exp and std::log in both builds, special values as std") {
  // distance in units in the last place of the reference (a difference of 0 counts 0)
  auto ulps = [](double got, double want) {
    if (got == want) return 0.0;
    int e = 0;
    std::frexp(want, &e);
    return std::abs(got - want) / std::ldexp(1.0, e - 53);
  };
  using Loop = void (*)(double*, const double*, std::int64_t);
  std::vector<std::pair<Loop, Loop>> builds;  // (exp, log)
#if ANVIL_SIMD_X86
  builds.emplace_back(anvil::simd::exp_f64_loop_baseline, anvil::simd::log_f64_loop_baseline);
  if (anvil::simd::avx512()) builds.emplace_back(anvil::simd::exp_f64_loop_avx512, anvil::simd::log_f64_loop_avx512);
#else
  builds.emplace_back(anvil::simd::exp_f64_loop, anvil::simd::log_f64_loop);
#endif
  std::mt19937_64 gen(5);
  const std::int64_t n = 200000;
  std::vector<double> xe(n), xl(n), y(n);
  std::uniform_real_distribution<double> ue(-708.0, 709.0), um(0.5, 2.0), ud(-1e-6, 1e-6);
  std::uniform_int_distribution<int> uexp(-1020, 1020);
  for (std::int64_t i = 0; i < n; ++i) {
    xe[i] = i % 4 == 0 ? ud(gen) : ue(gen);  // a quarter near 0, where exp is near 1
    xl[i] = i % 4 == 0 ? 1.0 + ud(gen) : std::ldexp(um(gen), uexp(gen));  // a quarter near 1, where log is near 0
  }
  for (const auto& [ex, lg] : builds) {
    double worst_exp = 0, worst_log = 0;
    ex(y.data(), xe.data(), n);
    for (std::int64_t i = 0; i < n; ++i) worst_exp = std::max(worst_exp, ulps(y[i], std::exp(xe[i])));
    lg(y.data(), xl.data(), n);
    for (std::int64_t i = 0; i < n; ++i) worst_log = std::max(worst_log, ulps(y[i], std::log(xl[i])));
    CHECK(worst_exp <= 2.0);
    CHECK(worst_log <= 2.0);
  }
  // the entry points send what the loops do not cover to the standard functions
  const double inf = INFINITY;
  const std::vector<double> odd{0.0, -0.0, -1.0, 4.9e-324, 1e-310, inf, -inf, NAN, 709.5, -708.5, -800.0, 800.0, 1e300};
  std::vector<double> got(odd.size());
  anvil::simd::exp(got.data(), odd.data(), static_cast<std::int64_t>(odd.size()));
  for (std::size_t i = 0; i < odd.size(); ++i) {
    CAPTURE(odd[i]);
    const double want = std::exp(odd[i]);
    CHECK(((std::isnan(want) && std::isnan(got[i])) || got[i] == want || ulps(got[i], want) <= 2.0));
  }
  anvil::simd::log(got.data(), odd.data(), static_cast<std::int64_t>(odd.size()));
  for (std::size_t i = 0; i < odd.size(); ++i) {
    CAPTURE(odd[i]);
    const double want = std::log(odd[i]);
    CHECK(((std::isnan(want) && std::isnan(got[i])) || got[i] == want || ulps(got[i], want) <= 2.0));
  }
}

TEST_CASE("MlpTape: forward and backward match autograd for every activation it takes, with and without the transposed-weight products, and for chosen rows alone") {
  torch::manual_seed(7);
  using anvil::nn::Activation;
  struct RestoreMatmul {
    ~RestoreMatmul() { anvil::blas::set_matmul(anvil::Matmul::auto_); }
  } restore;
  // The products by the BLAS (with its transposed copies) and by anvil's AVX-512 product
  // where the CPU has it (run.matmul; on other CPUs both rounds take the BLAS).
  for (const auto matmul : {anvil::Matmul::blas, anvil::Matmul::anvil}) {
  CAPTURE(static_cast<int>(matmul));
  anvil::blas::set_matmul(matmul);
  // Every activation: those with a hand-written derivative are checked against autograd,
  // the others must be refused (the algorithms then keep autograd).
  for (const auto act : {Activation::relu, Activation::tanh, Activation::elu, Activation::leaky_relu,
                         Activation::gelu, Activation::silu}) {
    CAPTURE(static_cast<int>(act));
    if (!anvil::nn::has_manual_backward(act)) {
      CHECK_FALSE(anvil::nn::MlpTape::supports(*anvil::nn::Mlp(3, std::vector<std::int64_t>{8}, 2, act)));
      continue;
    }
  // (batch, in, hidden): the first two take the transposed copy of their weights under
  // OpenBLAS's AVX-512 kernels (blas::transposed_copy_pays), the others the plain X W^T.
  for (const auto& [batch, in, hidden] : std::vector<std::array<std::int64_t, 3>>{
           {100, 3, 64}, {100, 64, 64}, {1, 3, 64}, {4, 3, 64}, {256, 17, 256}}) {
    CAPTURE(batch);
    CAPTURE(in);
    CAPTURE(hidden);
    anvil::nn::Mlp m(in, std::vector<std::int64_t>{hidden, hidden}, 2, act);
    REQUIRE(anvil::nn::MlpTape::supports(*m));
    const auto x = torch::randn({batch, in});
    const auto dy = torch::randn({batch, 2});
    anvil::nn::MlpTape tape;
    std::vector<at::Tensor> grads;
    for (const auto& p : m->parameters()) grads.push_back(torch::empty_like(p));
    auto dx = torch::empty({batch, in});
    {
      torch::NoGradGuard no_grad;
      const auto y = tape.forward(*m, x);
      CHECK(torch::allclose(y, m->forward(x), 1e-5, 1e-5));
      tape.backward(*m, dy, &grads, &dx);
      // backward_input_rows: every other row (and the last) and the columns after the first
      // alone give what backward gives them
      std::vector<std::int64_t> rows;
      for (std::int64_t i = 0; i < batch; i += 2) rows.push_back(i);
      if (rows.back() != batch - 1) rows.push_back(batch - 1);
      const auto idx = torch::tensor(rows, torch::kLong);
      const auto dy_rows = dy.index_select(0, idx).contiguous();
      const std::int64_t first = in > 1 ? 1 : 0, cols = in - first;
      auto dx_rows = torch::empty({static_cast<std::int64_t>(rows.size()), cols});
      tape.backward_input_rows(*m, dy_rows.data_ptr<float>(), rows, dx_rows.data_ptr<float>(), first, cols);
      CHECK(torch::allclose(dx_rows, dx.index_select(0, idx).slice(1, first, in), 1e-5, 1e-5));
      CHECK_THROWS_WITH_AS(tape.backward_input_rows(*m, dy_rows.data_ptr<float>(), {batch}, dx_rows.data_ptr<float>(), 0, 1),
                           doctest::Contains("is not one of the last forward's"), anvil::Error);
      CHECK_THROWS_WITH_AS(tape.backward_input_rows(*m, dy_rows.data_ptr<float>(), rows, dx_rows.data_ptr<float>(), first, in),
                           doctest::Contains("are not inside the input's"), anvil::Error);
    }
    const auto xr = x.clone().requires_grad_(true);
    (m->forward(xr) * dy).sum().backward();
    const auto params = m->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(torch::allclose(grads[i], params[i].grad(), 1e-4, 1e-4));
    CHECK(torch::allclose(dx, xr.grad(), 1e-4, 1e-4));
  }
  }
  }
  anvil::blas::set_matmul(anvil::Matmul::blas);
  const auto blas = anvil::blas_info();
  if (blas.openblas && anvil::is_avx512_core(blas.core) && anvil::blas::sgemm()) {
    CHECK(anvil::blas::transposed_copy_pays(100, 64, 64));
    CHECK(anvil::blas::transposed_copy_pays(100, 64, 3));
  }
  CHECK_FALSE(anvil::blas::transposed_copy_pays(1, 64, 3));     // the copy costs more than the product
  CHECK_FALSE(anvil::blas::transposed_copy_pays(256, 256, 256));  // past the small-matrix kernel
}

TEST_CASE("FlatParameters: the parameters share the buffer's count of in-place writes, and Adam's step moves it") {
  torch::manual_seed(3);
  anvil::nn::Mlp net(3, std::vector<std::int64_t>{8}, 2);
  anvil::FlatAdam adam(net->parameters(), anvil::AdamOptions{});
  const auto& flat = adam.parameters().flat();
  const auto w = net->parameters().front();
  torch::NoGradGuard no_grad;
  auto v = w._version();
  flat.add_(0.0);  // a write to the buffer is a write to each parameter
  CHECK(w._version() > v);
  v = flat._version();
  w.add_(0.0);  // and a write to a parameter is one to the buffer
  CHECK(flat._version() > v);
  v = w._version();
  REQUIRE(adam.steps_in_ranges(torch::ones_like(flat)));  // Adam's pass over plain floats
  adam.step(torch::ones_like(flat));
  CHECK(w._version() > v);
  v = w._version();
  anvil::polyak(flat, torch::zeros_like(flat), 0.1);  // Polyak's pass over plain floats
  CHECK(w._version() > v);
}

TEST_CASE("MlpTape: a few rows act from a kept transpose of each weight, made again after every kind of write") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so the few-rows products never run here");
  struct RestoreMatmul {
    ~RestoreMatmul() { anvil::blas::set_matmul(anvil::Matmul::auto_); }
  } restore;
  anvil::blas::set_matmul(anvil::Matmul::anvil);
  REQUIRE(anvil::blas::own_rows_kernel_takes_copy(4, 64, 3, 0.f));
  torch::manual_seed(11);
  anvil::nn::Mlp m(3, std::vector<std::int64_t>{64, 64}, 1);
  anvil::FlatAdam adam(m->parameters(), anvil::AdamOptions{});
  const auto& flat = adam.parameters().flat();
  const auto x = torch::randn({4, 3});
  torch::NoGradGuard no_grad;
  anvil::nn::MlpTape kept;  // lives through every write below
  at::Tensor last;          // its output before the write
  // After each write: the two hidden layers' transposes made again (the one-output head
  // reads its weight where it lies), the bits of a fresh tape, and not the output before the
  // write (the write changed the weights).
  const auto follows = [&](const char* write) {
    CAPTURE(write);
    anvil::nn::MlpTape fresh;
    const auto made = kept.kept_transposes();
    const auto now = kept.forward(*m, x).clone();
    CHECK(kept.kept_transposes() == made + 2);
    CHECK(torch::equal(now, fresh.forward(*m, x)));
    CHECK(torch::allclose(now, m->forward(x), 1e-5, 1e-5));
    if (last.defined()) CHECK_FALSE(torch::equal(now, last));
    last = now;
  };
  follows("none yet (a new tape)");
  adam.step(torch::randn_like(flat));
  follows("Adam's step");
  flat.copy_(flat * 0.5);
  follows("a copy into the buffer (a checkpoint's restore)");
  m->parameters()[2].add_(0.25);  // the second layer's weight
  follows("an in-place op on one parameter");
  anvil::polyak(flat, torch::randn_like(flat), 0.2);
  follows("Polyak's average into the buffer");
  anvil::Ema ema;
  ema.update(flat, 0.0);
  flat.mul_(0.5);
  follows("a multiplication of the buffer");
  ema.with_weights(flat, [&] { follows("the averaged weights swapped in"); });  // (and back on return)
  follows("the trained weights swapped back");
  float* raw = flat.data_ptr<float>();
  for (std::int64_t i = 0; i < flat.numel(); ++i) raw[i] *= -1.f;
  anvil::mark_written(flat);
  follows("a write through the pointer, marked");
  // No write, no new transpose.
  const auto made = kept.kept_transposes();
  CHECK(torch::equal(kept.forward(*m, x), last));
  CHECK(kept.kept_transposes() == made);
  // A weight written between every two uses (an update per env step): a transpose each
  // time, the same bits as a fresh tape's.
  for (int i = 0; i < 3; ++i) {
    adam.step(torch::randn_like(flat));
    anvil::nn::MlpTape fresh;
    CHECK(torch::equal(kept.forward(*m, x), fresh.forward(*m, x)));
  }
  CHECK(kept.kept_transposes() == made + 6);
}

