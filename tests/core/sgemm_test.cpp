// anvil's AVX-512 matrix product (core/sgemm.hpp) against a double-precision product, and
// the choice blas::gemm makes between it and the BLAS (run.matmul). Skipped, visibly, on a
// CPU without AVX-512.
#include <anvil/core/sgemm.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <anvil/core/blas.hpp>

#include "../skip.hpp"

namespace {

struct Product {
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.f, beta = 0.f;
  std::vector<float> a, b, c;
};

Product random_product(std::mt19937& g, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, int pad,
                       float alpha, float beta) {
  std::normal_distribution<float> normal;
  Product p;
  p.ta = ta, p.tb = tb, p.m = m, p.n = n, p.k = k, p.alpha = alpha, p.beta = beta;
  p.lda = (ta ? m : k) + pad, p.ldb = (tb ? k : n) + pad, p.ldc = n + pad;
  // Rows exactly as long as the layout needs (the last row without its padding): a read
  // past the matrix shows under a sanitizer, and past a page it would fault.
  p.a.resize(static_cast<std::size_t>(((ta ? k : m) - 1) * p.lda + (ta ? m : k) + 1) * (m > 0 && k > 0));
  p.b.resize(static_cast<std::size_t>(((tb ? n : k) - 1) * p.ldb + (tb ? k : n) + 1) * (n > 0 && k > 0));
  p.c.resize(static_cast<std::size_t>((m - 1) * p.ldc + n));
  for (float& x : p.a) x = normal(g);
  for (float& x : p.b) x = normal(g);
  for (float& x : p.c) x = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : normal(g);
  return p;
}

float at_a(const Product& p, std::int64_t i, std::int64_t q) { return p.ta ? p.a[q * p.lda + i] : p.a[i * p.lda + q]; }
float at_b(const Product& p, std::int64_t q, std::int64_t j) { return p.tb ? p.b[j * p.ldb + q] : p.b[q * p.ldb + j]; }

// Checks C (computed from `before`) against the product in double precision: each element
// within the bound of float rounding over its k terms ((k + 2) epsilon times the sum of the
// terms' magnitudes; one term missing or counted twice is far outside it), and C's padding
// between rows untouched.
void check(const Product& before, const std::vector<float>& c) {
  for (std::int64_t i = 0; i < before.m; ++i)
    for (std::int64_t j = 0; j < before.n; ++j) {
      double sum = 0, mag = 0;
      for (std::int64_t q = 0; q < before.k; ++q) {
        const double t = double(at_a(before, i, q)) * double(at_b(before, q, j));
        sum += t, mag += std::fabs(t);
      }
      const double old = before.beta == 0.f ? 0.0 : double(before.c[i * before.ldc + j]);
      const double want = before.alpha * sum + before.beta * old;
      const double got = c[i * before.ldc + j];
      const double tol = double(before.k + 2) * std::numeric_limits<float>::epsilon() *
                             (std::fabs(before.alpha) * mag + std::fabs(before.beta * old)) +
                         1e-30;
      INFO("m " << before.m << " n " << before.n << " k " << before.k << " trans_a " << before.ta << " trans_b "
                << before.tb << " beta " << before.beta << " at (" << i << ", " << j << ")");
      REQUIRE(std::fabs(got - want) <= tol);
    }
  for (std::int64_t i = 0; i + 1 < before.m; ++i)
    for (std::int64_t j = before.n; j < before.ldc; ++j) {
      const float was = before.c[i * before.ldc + j], now = c[i * before.ldc + j];
      REQUIRE(std::memcmp(&was, &now, sizeof was) == 0);
    }
}

// run.matmul=anvil for a test's scope, auto again after it (whatever way the test ends).
struct AnvilMatmul {
  AnvilMatmul() { anvil::blas::set_matmul(anvil::Matmul::anvil); }
  ~AnvilMatmul() { anvil::blas::set_matmul(anvil::Matmul::auto_); }
  AnvilMatmul(const AnvilMatmul&) = delete;
  AnvilMatmul& operator=(const AnvilMatmul&) = delete;
};

}  // namespace

TEST_CASE("sgemm_avx512: every layout, edge tile, stride and beta against a double-precision product") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
#if ANVIL_SIMD_X86
  std::mt19937 g(7);
  int cases = 0;
  // Shapes around the tile's 8 rows and 32 columns and the transpose's 16, the sizes of a
  // SAC update, an empty inner dimension, and random ones.
  const std::int64_t fixed[][3] = {{1, 1, 1},   {8, 32, 16},   {9, 33, 17},    {7, 31, 15},  {16, 64, 1},
                                   {5, 100, 0}, {256, 256, 4}, {256, 256, 256}, {100, 64, 3}, {13, 47, 300}};
  for (const auto& s : fixed)
    for (int t = 0; t < 4; ++t) {
      const float beta = t == 3 ? 0.5f : 0.f;
      Product p = random_product(g, t & 1, (t >> 1) & 1, s[0], s[1], s[2], t == 2 ? 3 : 0, t == 1 ? -0.5f : 1.f, beta);
      std::vector<float> c = p.c;
      anvil::simd::sgemm_avx512(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta,
                                c.data(), p.ldc);
      check(p, c);
      ++cases;
    }
  for (int t = 0; t < 150; ++t) {
    const bool ta = g() % 2, tb = g() % 2;
    const std::int64_t m = 1 + g() % 70, n = 1 + g() % 90, k = g() % 80;
    Product p = random_product(g, ta, tb, m, n, k, static_cast<int>(g() % 4), g() % 3 ? 1.f : 0.75f,
                               g() % 2 ? 0.f : -1.25f);
    std::vector<float> c = p.c;
    anvil::simd::sgemm_avx512(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta,
                              c.data(), p.ldc);
    check(p, c);
    ++cases;
  }
  CHECK(cases == 190);
#endif
}

TEST_CASE("sgemm_avx512: a row's result is the same bits whatever rows are computed beside it") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
#if ANVIL_SIMD_X86
  std::mt19937 g(3);
  for (int t = 0; t < 4; ++t) {
    Product p = random_product(g, t & 1, (t >> 1) & 1, 37, 70, 129, 0, 1.f, 0.f);
    std::vector<float> all(p.c.size());
    anvil::simd::sgemm_avx512(p.ta, p.tb, p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.f, all.data(),
                              p.ldc);
    for (std::int64_t i = 0; i < p.m; ++i) {
      std::vector<float> one(static_cast<std::size_t>(p.n));
      const float* a_row = p.ta ? p.a.data() + i : p.a.data() + i * p.lda;  // op(A)'s row i as a 1-row matrix
      anvil::simd::sgemm_avx512(p.ta, p.tb, 1, p.n, p.k, 1.f, a_row, p.lda, p.b.data(), p.ldb, 0.f, one.data(),
                                p.n);
      INFO("trans_a " << p.ta << " trans_b " << p.tb << " row " << i);
      REQUIRE(std::memcmp(one.data(), all.data() + i * p.ldc, sizeof(float) * static_cast<std::size_t>(p.n)) == 0);
    }
  }
#endif
}

TEST_CASE("blas::gemm: run.matmul picks anvil's product for the shapes it is faster at, the BLAS for the rest") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
  if (anvil::blas::sgemm() == nullptr) ANVIL_SKIP("no BLAS sgemm_ on this machine to compare with");
  const AnvilMatmul matmul;  // run.matmul=anvil until the test ends
  const float p_dummy[1] = {0.f};
  float row_sum_dummy = 0.f;
  CHECK(anvil::blas::own_matmul());
  CHECK(anvil::blas::own_kernel_takes(256, 256, 256));
  CHECK(anvil::blas::own_kernel_takes(8, 32, 4));
  CHECK_FALSE(anvil::blas::own_kernel_takes(256, 1, 256));   // a one-column head
  CHECK_FALSE(anvil::blas::own_kernel_takes(4, 256, 256));   // acting for a few envs
  CHECK_FALSE(anvil::blas::own_kernel_takes(256, 256, 1));   // an outer product
  // ... unless it has element-wise steps to fuse (a ReLU's backward through a one-output layer)
  CHECK(anvil::blas::own_kernel_takes(256, 256, 1, anvil::simd::Epilogue{.keep = p_dummy, .ldkeep = 256}));
  CHECK(anvil::blas::own_kernel_takes(256, 256, 3, anvil::simd::Epilogue{.relu = true}));
  CHECK_FALSE(anvil::blas::own_kernel_takes(256, 256, 1, anvil::simd::Epilogue{.row_sums = &row_sum_dummy}));
  CHECK_FALSE(anvil::blas::own_kernel_takes(256, 256, 1024));  // a panel past a core's L2
  CHECK_FALSE(anvil::blas::transposed_copy_pays(100, 64, 64));  // the product packs B^T itself
  // The same product both ways: equal to float rounding, and the BLAS's when chosen.
  std::mt19937 g(11);
  Product p = random_product(g, false, true, 64, 96, 48, 1, 1.f, 0.f);
  std::vector<float> own = p.c, theirs = p.c, direct = p.c;
  anvil::blas::gemm(false, true, p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.f, own.data(), p.ldc);
  check(p, own);
  anvil::simd::sgemm_avx512(false, true, p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.f, direct.data(),
                            p.ldc);
  CHECK(std::memcmp(own.data(), direct.data(), sizeof(float) * own.size()) == 0);  // it ran anvil's
  anvil::blas::set_matmul(anvil::Matmul::blas);
  CHECK_FALSE(anvil::blas::own_matmul());
  CHECK_FALSE(anvil::blas::own_kernel_takes(256, 256, 256));
  anvil::blas::gemm(false, true, p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.f, theirs.data(), p.ldc);
  check(p, theirs);
}

#if ANVIL_SIMD_X86  // cpu_family() reads CPUID; elsewhere own_matmul() is always false
TEST_CASE("blas: run.matmul=auto takes anvil's product on the CPUs with full-width AVX-512: Intel, AMD from Zen 5") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so auto always means the BLAS here");
  // The vendor and family as the kernel reads them, against the choice's own reading (CPUID).
  std::ifstream info("/proc/cpuinfo");
  std::string line, vendor;
  int family = -1;
  while (std::getline(info, line) && (vendor.empty() || family < 0)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    const std::string value = start == std::string::npos ? std::string() : line.substr(start);
    if (line.rfind("vendor_id", 0) == 0) vendor = value;
    if (line.rfind("cpu family", 0) == 0 && !value.empty()) family = std::stoi(value);
  }
  if (vendor.empty() || family < 0) ANVIL_SKIP("/proc/cpuinfo names no vendor_id and cpu family here");
  CHECK(anvil::blas::detail::cpu_family() == static_cast<unsigned>(family));
  const bool expected = vendor == "GenuineIntel" || (vendor == "AuthenticAMD" && family >= 0x1A);
  anvil::blas::set_matmul(anvil::Matmul::auto_);
  CHECK(anvil::blas::own_matmul() == expected);
  anvil::blas::set_matmul(anvil::Matmul::blas);
  CHECK_FALSE(anvil::blas::own_matmul());
  anvil::blas::set_matmul(anvil::Matmul::auto_);
}
#endif

TEST_CASE("sgemm_avx512's epilogue: fused, the same bits as the product followed by the element-wise passes") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
#if ANVIL_SIMD_X86
  std::mt19937 g(5);
  std::normal_distribution<float> normal;
  int cases = 0, zeroed = 0;
  const std::int64_t fixed[][3] = {{256, 256, 256}, {9, 33, 17}, {7, 31, 15}, {100, 64, 3}, {70, 90, 0}, {1, 16, 5}};
  for (int t = 0; t < 120; ++t) {
    const bool ta = t % 2, tb = (t / 2) % 2;
    const auto* s = t < 24 ? fixed[t / 4] : nullptr;
    const std::int64_t m = s ? s[0] : 1 + g() % 70, n = s ? s[1] : 1 + g() % 90, k = s ? s[2] : g() % 80;
    const int pad = static_cast<int>(g() % 3);
    Product p = random_product(g, ta, tb, m, n, k, pad, g() % 3 ? 1.f : 0.75f, g() % 4 ? 0.f : 0.5f);
    // Which steps: every subset in turn; ReLU's output `keep` has zeros, negatives and
    // positives, with its own row stride.
    const int steps = t % 16;
    std::vector<float> bias(static_cast<std::size_t>(n)), sums_fused(static_cast<std::size_t>(m), -1.f),
        sums_after(static_cast<std::size_t>(m), -2.f);
    for (float& x : bias) x = normal(g);
    const std::int64_t ldkeep = n + static_cast<std::int64_t>(g() % 3);
    std::vector<float> keep(static_cast<std::size_t>(m * ldkeep));
    for (float& x : keep) x = g() % 3 == 0 ? 0.f : normal(g);
    const auto epilogue = [&](std::vector<float>& sums) {
      anvil::simd::Epilogue e;
      if (steps & 1) e.bias = bias.data();
      if (steps & 2) e.relu = true;
      if (steps & 4) e.keep = keep.data(), e.ldkeep = ldkeep;
      if (steps & 8) e.row_sums = sums.data();
      return e;
    };
    std::vector<float> fused = p.c, after = p.c;
    anvil::simd::sgemm_avx512(p.ta, p.tb, m, n, k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta, fused.data(),
                              p.ldc, epilogue(sums_fused));
    anvil::simd::sgemm_avx512(p.ta, p.tb, m, n, k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta, after.data(),
                              p.ldc);
    if (steps == 0) check(p, after);
    anvil::simd::apply_epilogue(epilogue(sums_after), p.ta, m, n, k, p.a.data(), p.lda, after.data(), p.ldc);
    INFO("m " << m << " n " << n << " k " << k << " trans_a " << ta << " trans_b " << tb << " steps " << steps);
    REQUIRE(std::memcmp(fused.data(), after.data(), sizeof(float) * fused.size()) == 0);
    if (steps & 8) {
      REQUIRE(std::memcmp(sums_fused.data(), sums_after.data(), sizeof(float) * sums_fused.size()) == 0);
      for (std::int64_t i = 0; i < m; ++i) {  // and they are op(A)'s row sums
        double want = 0, mag = 0;
        for (std::int64_t q = 0; q < k; ++q) want += at_a(p, i, q), mag += std::fabs(at_a(p, i, q));
        REQUIRE(std::fabs(sums_fused[static_cast<std::size_t>(i)] - want) <=
                double(k + 1) * std::numeric_limits<float>::epsilon() * mag + 1e-30);
      }
    }
    if (steps & 6)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) zeroed += fused[static_cast<std::size_t>(i * p.ldc + j)] == 0.f;
    ++cases;
  }
  CHECK(cases == 120);
  CHECK(zeroed > 1000);  // ReLU and its backward did zero elements
#endif
}

// A few-rows product (`run`, called as sgemm_rows_b*_avx512 are) for rows 1-7 (taken 4, 2
// and 1 at a time), columns around the 4, 8 and 16 a pass of dot products takes and the 16
// and 64 a pass of broadcasts takes, inner dimensions around a register's 16 (a first
// layer's 3), strides with padding; B transposed (`tb`, B [n, k]) or as stored (B [k, n]).
// Each against a double-precision product, its fused bias and ReLU the same bits as the
// passes after it, and each row alone the same bits as in the group it fell in.
template <class Run>
void check_rows_kernel(bool tb, Run run) {
  std::mt19937 g(13);
  std::normal_distribution<float> normal;
  int cases = 0;
  const std::int64_t ns[] = {1, 3, 4, 5, 8, 9, 16, 17, 37, 48, 64, 65, 130};
  const std::int64_t ks[] = {1, 3, 15, 16, 17, 64, 70};
  for (std::int64_t m = 1; m < 8; ++m)
    for (const auto n : ns)
      for (const auto k : ks) {
        const int pad = static_cast<int>(g() % 3);
        const float alpha = g() % 4 ? 1.f : -0.5f;
        Product p = random_product(g, false, tb, m, n, k, pad, alpha, 0.f);
        std::vector<float> bare = p.c, fused = p.c, after = p.c;
        run(m, n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, bare.data(), p.ldc, anvil::simd::Epilogue{});
        check(p, bare);  // C's padding untouched too
        std::vector<float> bias(static_cast<std::size_t>(n));
        for (float& x : bias) x = normal(g);
        const anvil::simd::Epilogue e{.bias = bias.data(), .relu = (cases % 2) == 0};
        run(m, n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, fused.data(), p.ldc, e);
        after = bare;
        anvil::simd::apply_epilogue(e, false, m, n, k, p.a.data(), p.lda, after.data(), p.ldc);
        INFO("m " << m << " n " << n << " k " << k << " pad " << pad << " B transposed " << tb);
        REQUIRE(std::memcmp(fused.data(), after.data(), sizeof(float) * fused.size()) == 0);
        for (std::int64_t i = 0; i < m; ++i) {
          std::vector<float> one(static_cast<std::size_t>(n));
          run(1, n, k, alpha, p.a.data() + i * p.lda, p.lda, p.b.data(), p.ldb, one.data(), n, e);
          REQUIRE(std::memcmp(one.data(), fused.data() + i * p.ldc, sizeof(float) * static_cast<std::size_t>(n)) == 0);
        }
        ++cases;
      }
  CHECK(cases == 7 * 13 * 7);
}

TEST_CASE("sgemm_rows_bt_avx512: a few rows against a double-precision product, fused steps the same bits, each row alone the same") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
#if ANVIL_SIMD_X86
  check_rows_kernel(true, [](auto... x) { anvil::simd::sgemm_rows_bt_avx512(x...); });
#endif
}

TEST_CASE("sgemm_rows_b_avx512: a few rows from B^T as stored, the same checks") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
#if ANVIL_SIMD_X86
  check_rows_kernel(false, [](auto... x) { anvil::simd::sgemm_rows_b_avx512(x...); });
#endif
}

TEST_CASE("blas::gemm: a few rows through a layer take anvil's few-rows product where it is faster") {
  if (!anvil::simd::avx512()) ANVIL_SKIP("this CPU has no AVX-512, so anvil's AVX-512 product never runs here");
  const AnvilMatmul matmul;  // run.matmul=anvil until the test ends
  const float dummy[1] = {0.f};
  float row_sum_dummy = 0.f;
  using anvil::blas::own_rows_kernel_takes;
  CHECK(own_rows_kernel_takes(false, true, 4, 64, 64, 0.f));   // acting for 4 envs
  CHECK(own_rows_kernel_takes(false, true, 4, 64, 3, 0.f, anvil::simd::Epilogue{.bias = dummy, .relu = true}));
  CHECK(own_rows_kernel_takes(false, true, 7, 1, 64, 0.f));    // a one-output head
  CHECK(own_rows_kernel_takes(false, true, 1, 64, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes(false, true, 1, 256, 256, 0.f));  // one row through a wide layer: the BLAS
  CHECK(own_rows_kernel_takes(false, true, 2, 256, 256, 0.f));
  CHECK_FALSE(own_rows_kernel_takes(false, true, 8, 64, 64, 0.f));   // 8 rows: the tiles' product
  CHECK_FALSE(own_rows_kernel_takes(true, true, 4, 64, 64, 0.f));    // only A B^T
  CHECK_FALSE(own_rows_kernel_takes(false, false, 4, 64, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes(false, true, 4, 64, 64, 1.f));   // C read: not here
  CHECK_FALSE(own_rows_kernel_takes(false, true, 4, 64, 64, 0.f, anvil::simd::Epilogue{.keep = dummy, .ldkeep = 64}));
  CHECK_FALSE(own_rows_kernel_takes(false, true, 4, 64, 64, 0.f, anvil::simd::Epilogue{.row_sums = &row_sum_dummy}));
  CHECK_FALSE(own_rows_kernel_takes(false, true, 4, 0, 64, 0.f));
  // from a kept transpose: 16 columns or more (a one-output head stays with the dot products)
  using anvil::blas::own_rows_kernel_takes_copy;
  CHECK(own_rows_kernel_takes_copy(4, 64, 64, 0.f));
  CHECK(own_rows_kernel_takes_copy(4, 64, 3, 0.f, anvil::simd::Epilogue{.bias = dummy, .relu = true}));
  CHECK(own_rows_kernel_takes_copy(1, 16, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes_copy(4, 15, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes_copy(7, 1, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes_copy(8, 64, 64, 0.f));
  CHECK_FALSE(own_rows_kernel_takes_copy(1, 256, 256, 0.f));
#if ANVIL_SIMD_X86
  std::mt19937 g(17);
  Product p = random_product(g, false, true, 4, 64, 64, 2, 1.f, 0.f);
  std::vector<float> via_gemm = p.c, direct = p.c;
  anvil::blas::gemm(false, true, p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.f, via_gemm.data(), p.ldc);
  anvil::simd::sgemm_rows_bt_avx512(p.m, p.n, p.k, 1.f, p.a.data(), p.lda, p.b.data(), p.ldb, direct.data(), p.ldc);
  CHECK(std::memcmp(via_gemm.data(), direct.data(), sizeof(float) * via_gemm.size()) == 0);  // it ran the few-rows product
  anvil::blas::set_matmul(anvil::Matmul::blas);
  CHECK_FALSE(own_rows_kernel_takes(false, true, 4, 64, 64, 0.f));
#endif
}
