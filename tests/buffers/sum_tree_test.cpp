// PriorityTree: sums and minimums stay exact under batched updates, and `find` maps each
// prefix mass to the leaf whose interval holds it.
#include <anvil/buffers/sum_tree.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>


using anvil::detail::PriorityTree;

namespace {
// The leaf holding `mass`, by a linear scan over the priorities.
std::int64_t scan(const std::vector<double>& p, double mass) {
  double acc = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (mass < acc) return static_cast<std::int64_t>(i);
  }
  return -1;
}
}  // namespace

TEST_CASE("PriorityTree: find agrees with a linear scan, total and min follow every update") {
  for (std::int64_t capacity : {1, 7, 8, 9, 64, 1000, 4099}) {
    CAPTURE(capacity);
    PriorityTree tree(capacity);
    std::vector<double> p(static_cast<std::size_t>(capacity), 0.0);
    std::mt19937_64 gen(static_cast<std::uint64_t>(capacity));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int round = 0; round < 20; ++round) {
      std::vector<std::int64_t> idx;
      std::vector<double> val;
      for (int k = 0; k < 37; ++k) {
        idx.push_back(static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(capacity)));
        val.push_back(u(gen) < 0.1 ? 0.0 : u(gen) * 10);
      }
      for (std::size_t k = 0; k < idx.size(); ++k) p[static_cast<std::size_t>(idx[k])] = val[k];  // last write wins
      tree.set(idx, val);
      const double total = std::accumulate(p.begin(), p.end(), 0.0);
      CHECK(tree.total() == doctest::Approx(total).epsilon(1e-12));
      double lo = INFINITY;  // the smallest priority that can be sampled (zeros cannot)
      for (std::size_t i = 0; i < p.size(); ++i)
        if (p[i] > 0 && p[i] < lo) lo = p[i];
      CHECK(tree.min() == lo);
      if (total <= 0) continue;
      std::vector<double> mass;
      for (int k = 0; k < 50; ++k) mass.push_back(u(gen) * total);
      // In any order the batch descends from the root; ascending, the top levels are merged.
      for (bool sorted : {false, true}) {
        CAPTURE(sorted);
        if (sorted) std::sort(mass.begin(), mass.end());
        std::vector<std::int64_t> out(mass.size());
        tree.find(mass, out);
        for (std::size_t k = 0; k < mass.size(); ++k) {
          const auto expect = scan(p, mass[k]);
          // masses within round-off of an interval's edge may land on either side
          if (out[k] != expect) CHECK(std::abs(std::accumulate(p.begin(), p.begin() + std::max(out[k], expect), 0.0) - mass[k]) < 1e-9 * total);
          CHECK(p[static_cast<std::size_t>(out[k])] > 0.0);
        }
      }
    }
  }
}

TEST_CASE("PriorityTree: a million updates leave no drift in the total") {
  PriorityTree tree(100'000);
  std::vector<double> p(100'000, 0.0);
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int round = 0; round < 4000; ++round) {
    std::vector<std::int64_t> idx(256);
    std::vector<double> val(256);
    for (int k = 0; k < 256; ++k) {
      idx[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(gen() % 100'000);
      val[static_cast<std::size_t>(k)] = std::pow(u(gen), 4) * 1e3;
    }
    for (int k = 0; k < 256; ++k) p[static_cast<std::size_t>(idx[static_cast<std::size_t>(k)])] = val[static_cast<std::size_t>(k)];
    tree.set(idx, val);
  }
  CHECK(tree.total() == doctest::Approx(std::accumulate(p.begin(), p.end(), 0.0)).epsilon(1e-12));
}

TEST_CASE("PriorityTree: masses at the very top of the total still land on a non-empty leaf") {
  PriorityTree tree(20);
  std::vector<std::int64_t> idx{3, 17};
  std::vector<double> val{0.1, 0.2};
  tree.set(idx, val);
  std::vector<double> mass{0.0, 0.1, std::nextafter(0.3, 0.0), 0.30000000000000004};
  std::vector<std::int64_t> out(mass.size());
  tree.find(mass, out);
  CHECK(out[0] == 3);
  CHECK(out[1] == 17);
  CHECK(out[2] == 17);
  CHECK(out[3] == 17);
  // The same, ascending and enough of them for the merge through the top levels.
  PriorityTree big(5000);
  std::vector<std::int64_t> at{3, 4000, 4001};
  std::vector<double> pv{0.1, 0.2, 0.0};
  big.set(at, pv);
  std::vector<double> many(32, 0.0);
  for (std::size_t k = 0; k < many.size(); ++k) many[k] = k < 16 ? 0.05 : std::nextafter(0.3, 1.0);
  std::vector<std::int64_t> got(many.size());
  big.find(many, got);
  for (std::size_t k = 0; k < many.size(); ++k) CHECK(got[k] == (k < 16 ? 3 : 4000));
}

TEST_CASE("PriorityTree: the vector kernels pick the same leaves and store the same sums as the scalar ones") {
  // Where the CPU has no vector kernels both trees run the scalar ones and this passes
  // trivially; on x86-64 with AVX-512 it holds the two to the same arithmetic, bit for bit.
  for (std::int64_t capacity : {1, 9, 64, 1000, 5000, 70'000}) {
    CAPTURE(capacity);
    anvil::detail::sum_tree::force_scalar = true;
    PriorityTree scalar(capacity);
    anvil::detail::sum_tree::force_scalar = false;
    PriorityTree vector(capacity);
    std::mt19937_64 gen(static_cast<std::uint64_t>(capacity) + 11);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int round = 0; round < 30; ++round) {
      // Batches of every size (the large ones recompute whole levels), with repeats, and a
      // third of the leaves zero, in runs, so that empty children and nodes are common.
      const auto m = static_cast<std::size_t>(1 + gen() % (round % 5 == 0 ? 3000 : 300));
      std::vector<std::int64_t> idx(m);
      std::vector<double> val(m);
      for (std::size_t k = 0; k < m; ++k) {
        idx[k] = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(capacity));
        if (round % 3 == 0) idx[k] = std::min<std::int64_t>(capacity - 1, idx[k] / 16 * 16 + 15);
        val[k] = u(gen) < 0.33 ? 0.0 : std::pow(u(gen), 3) * 100;
      }
      scalar.set(idx, val);
      vector.set(idx, val);
      CHECK(scalar.total() == vector.total());
      CHECK(scalar.min() == vector.min());
      const double total = scalar.total();
      if (total <= 0) continue;
      // Random masses, stratified ones (ascending: the merge), and masses at and next to
      // the edges: 0, the total, and one ulp either side of it.
      std::vector<double> mass;
      for (int k = 0; k < 40; ++k) mass.push_back(u(gen) * total);
      for (double edge : {0.0, total, std::nextafter(total, 0.0), std::nextafter(total, INFINITY)})
        mass.push_back(edge);
      std::vector<double> strata(256);
      for (std::size_t k = 0; k < strata.size(); ++k)
        strata[k] = std::min((static_cast<double>(k) + u(gen)) * (total / 256), std::nextafter(total, 0.0));
      strata.back() = total;
      for (const auto* batch : {&mass, &strata}) {
        std::vector<std::int64_t> a(batch->size()), b(batch->size());
        scalar.find(*batch, a);
        vector.find(*batch, b);
        CHECK(a == b);
        for (auto leaf : b) CHECK(vector.get(leaf) > 0.0);
      }
    }
  }
}
