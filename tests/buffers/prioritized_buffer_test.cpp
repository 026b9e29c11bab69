// PrioritizedBuffer: sampling follows the priorities, importance weights follow the
// formula, the ring wraps, stale priority updates are skipped, and bad input is refused.
#include <anvil/buffers/prioritized_buffer.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>


#include <torch/types.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/pendulum.hpp>

#include "../damaged_files.hpp"
#include "steps.hpp"

using namespace anvil;

namespace {
using test::step_of;
PrioritizedBuffer make(std::int64_t capacity, double alpha = 0.6, double beta = 0.4) {
  PrioritizedBuffer::Config c;
  c.capacity = capacity;
  c.alpha = alpha;
  c.beta = beta;
  return PrioritizedBuffer(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 5});
}
}  // namespace

TEST_CASE("PrioritizedBuffer: sampling frequencies match the priorities (chi-square)") {
  auto b = make(100, 0.7);
  b.add(step_of(100, 0));
  // TD errors 0.1 .. 10: priorities (|td| + eps)^0.7 span a factor of about 25.
  auto td = torch::linspace(0.1, 10.0, 100).to(torch::kDouble);
  b.update_priorities(torch::arange(100, torch::kLong), td);
  std::vector<double> expect(100);
  double total = 0;
  for (int i = 0; i < 100; ++i) total += expect[i] = std::pow(td[i].item<double>() + 1e-6, 0.7);
  CHECK(b.total_priority() == doctest::Approx(total).epsilon(1e-12));
  std::vector<double> counts(100, 0);
  const int draws = 100'000, batch = 100;
  for (int r = 0; r < draws / batch; ++r) {
    auto s = b.sample(batch);
    const auto* id = s.index.data_ptr<std::int64_t>();
    for (int k = 0; k < batch; ++k) ++counts[static_cast<std::size_t>(id[k])];
  }
  double chi2 = 0;
  for (int i = 0; i < 100; ++i) {
    const double e = draws * expect[i] / total;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 99 degrees of freedom: the 99.9% point is 148.2 (stratified sampling makes it smaller).
  CHECK(chi2 < 148.2);
  // A wrong distribution fails the same test: uniform expectations give a huge statistic.
  double chi2_uniform = 0;
  for (int i = 0; i < 100; ++i) chi2_uniform += (counts[i] - 1000.0) * (counts[i] - 1000.0) / 1000.0;
  CHECK(chi2_uniform > 1000);
}

TEST_CASE("PrioritizedBuffer: importance weights are (p / p_min)^-beta, beta rising to 1") {
  PrioritizedBuffer::Config c;
  c.capacity = 50;
  c.beta = 0.4;
  c.beta_steps = 100;
  PrioritizedBuffer b(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 6});
  b.add(step_of(50, 0));
  CHECK(b.beta() == doctest::Approx(0.4 + 0.6 * 0.5));
  auto td = torch::rand({50}, torch::kDouble) * 5;
  b.update_priorities(torch::arange(50, torch::kLong), td);
  double p_min = INFINITY;
  for (int i = 0; i < 50; ++i) p_min = std::min(p_min, b.priority(i));
  auto s = b.sample(40);
  for (int k = 0; k < 40; ++k) {
    const auto id = s.index[k].item<std::int64_t>();
    const double p = std::pow(std::abs(td[id].item<double>()) + 1e-6, 0.6);
    CHECK(b.priority(id) == doctest::Approx(p));
    CHECK(s.weight[k].item<float>() == doctest::Approx(std::pow(p / p_min, -0.7)).epsilon(1e-6));
  }
  CHECK(s.weight.max().item<float>() <= 1.0f);
  b.add(step_of(50, 50));
  b.add(step_of(50, 100));
  CHECK(b.beta() == 1.0);
}

TEST_CASE("PrioritizedBuffer: new transitions enter at the largest priority so far") {
  auto b = make(10);
  b.add(step_of(4, 0));
  CHECK(b.priority(0) == 1.0);
  b.set_priorities(torch::tensor({0, 1}, torch::kLong), torch::tensor({7.0, 0.5}));
  b.add(step_of(2, 4));
  CHECK(b.priority(4) == 7.0);
  CHECK(b.priority(5) == 7.0);
  CHECK(b.priority(1) == 0.5);
}

TEST_CASE("PrioritizedBuffer: the ring overwrites the oldest, and their late updates are skipped") {
  auto b = make(5);
  b.add(step_of(4, 0));  // ids 0..3
  auto s = b.sample(4);
  b.add(step_of(3, 4));  // ids 4..6 overwrite slots of ids 0 and 1
  CHECK(b.size() == 5);
  CHECK(b.added() == 7);
  b.update_priorities(s.index, torch::full({4}, 3.0));
  std::int64_t stale = 0;
  for (int k = 0; k < 4; ++k) stale += s.index[k].item<std::int64_t>() < 2 ? 1 : 0;
  CHECK(b.stale_updates() == stale);
  double total = 0;
  for (int id = 2; id < 7; ++id) total += b.priority(id);
  CHECK(b.total_priority() == doctest::Approx(total));
  std::set<std::int64_t> seen;
  for (int r = 0; r < 50; ++r) {
    auto t = b.sample(5);
    for (int k = 0; k < 5; ++k) {
      seen.insert(t.index[k].item<std::int64_t>());
      CHECK(t.reward[k].item<float>() == static_cast<float>(t.index[k].item<std::int64_t>()));
    }
  }
  CHECK(seen == std::set<std::int64_t>{2, 3, 4, 5, 6});
  CHECK_THROWS_AS((void)b.priority(1), anvil::Error);
}

TEST_CASE("PrioritizedBuffer: bad priorities, ids and batch sizes are clear errors") {
  auto b = make(8);
  b.add(step_of(4, 0));
  CHECK_THROWS_WITH_AS(b.update_priorities(torch::tensor({0, 1}, torch::kLong), torch::tensor({1.0, std::nan("")})),
                       doctest::Contains("PrioritizedBuffer::update_priorities: TD error 1 (id 1) is nan"),
                       anvil::Error);
  CHECK_THROWS_WITH_AS(b.set_priorities(torch::tensor({2}, torch::kLong), torch::tensor({-1.0})),
                       doctest::Contains("PrioritizedBuffer::set_priorities: priority 0 (id 2) is -1"),
                       anvil::Error);
  CHECK_THROWS_WITH_AS(b.update_priorities(torch::tensor({9}, torch::kLong), torch::tensor({1.0})),
                       "PrioritizedBuffer::update_priorities: id 9 (entry 0) is out of range: 4 "
                       "transitions were added",
                       anvil::Error);
  CHECK_THROWS_WITH_AS(b.update_priorities(torch::tensor({1, 2}, torch::kLong), torch::tensor({1.0})),
                       "PrioritizedBuffer::update_priorities: 2 ids but 1 TD error values", anvil::Error);
  CHECK_THROWS_WITH_AS(b.sample(5),
                       "PrioritizedBuffer: sample(5) from a buffer holding 4 transitions; the batch "
                       "size must be between 1 and the size",
                       anvil::Error);
  // Nothing changed: the refused calls set no priority, counted nothing stale, and left the
  // largest priority (where new transitions enter) as it was, though the first call's entry
  // 0 was a good one.
  CHECK(b.total_priority() == 4.0);
  CHECK(b.stale_updates() == 0);
  b.add(step_of(1, 4));
  CHECK(b.priority(4) == 1.0);
}

TEST_CASE("PrioritizedBuffer: n-step transitions enter at the largest priority when their window completes") {
  PrioritizedBuffer::Config c;
  c.capacity = 10;
  c.n_step = 3;
  PrioritizedBuffer b(envs::spec_of(envs::Pendulum{}), c, RunContext{});
  b.set_discount(0.5);
  b.add(step_of(1, 0));
  b.add(step_of(1, 1));
  CHECK(b.size() == 0);
  b.add(step_of(1, 2));
  REQUIRE(b.size() == 1);
  auto s = b.sample(1);
  CHECK(s.reward[0].item<float>() == doctest::Approx(0 + 0.5 * 1 + 0.25 * 2));
  CHECK(s.discount[0].item<float>() == doctest::Approx(0.125));
  CHECK(s.obs[0][0].item<float>() == 0.0f);
  CHECK(s.next_obs[0][0].item<float>() == 2.5f);
  CHECK(b.priority(0) == 1.0);
}

TEST_CASE("PrioritizedBuffer: transitions that leave early get priority zero and are never sampled") {
  auto b = make(1000);
  for (int k = 0; k < 10; ++k) b.add(step_of(100, static_cast<float>(100 * k)));  // see the UniformBuffer case
  REQUIRE(b.dropped() == 247);
  double total = 0;
  for (int id = 247; id < 1000; ++id) total += b.priority(id);
  CHECK(b.total_priority() == doctest::Approx(total));
  CHECK_THROWS_AS((void)b.priority(0), anvil::Error);
  for (int r = 0; r < 20; ++r) CHECK(b.sample(256).index.min().item<std::int64_t>() >= 247);
  b.update_priorities(torch::arange(0, 300, torch::kLong), torch::ones({300}));
  CHECK(b.stale_updates() == 247);
}

TEST_CASE("Replay buffers: save and load round-trip exactly, and a bad file changes nothing") {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_buffer_io_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  PrioritizedBuffer::Config c;
  c.capacity = 50;
  c.n_step = 3;
  auto make_per = [&] { return PrioritizedBuffer(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 9}); };
  auto a = make_per();
  for (int t = 0; t < 30; ++t) a.add(test::chain_step(2, t, 7));  // wraps; windows still filling
  auto s = a.sample(16);
  a.update_priorities(s.index, torch::rand({16}) * 3);
  a.save(dir / "per.bin");

  auto b = make_per();
  b.load(dir / "per.bin");
  CHECK(b.size() == a.size());
  CHECK(b.added() == a.added());
  CHECK(b.total_priority() == a.total_priority());
  for (int t = 30; t < 33; ++t) {  // the same future: shared observations, samples, n-step windows
    a.add(test::chain_step(2, t, 7));
    b.add(test::chain_step(2, t, 7));
    auto x = a.sample(8), y = b.sample(8);
    CHECK(torch::equal(x.index, y.index));
    CHECK(torch::equal(x.obs, y.obs));
    CHECK(torch::equal(x.reward, y.reward));
    CHECK(torch::equal(x.weight, y.weight));
  }

  UniformBuffer::Config uc;
  uc.capacity = 20;
  UniformBuffer u(envs::spec_of(envs::Pendulum{}), uc, RunContext{.seed = 3});
  u.add(step_of(15, 0));
  u.add(step_of(10, 15));  // wraps
  u.save(dir / "uniform.bin");
  UniformBuffer v(envs::spec_of(envs::Pendulum{}), uc, RunContext{.seed = 4});
  v.load(dir / "uniform.bin");
  CHECK(torch::equal(u.sample(10).obs, v.sample(10).obs));

  // A truncated file, another buffer's file, another shape: clear errors, nothing changed.
  const auto bytes = std::filesystem::file_size(dir / "per.bin");
  test::copy_truncated(dir / "per.bin", dir / "cut.bin", bytes - 20);
  auto fresh = make_per();
  CHECK_THROWS_WITH_AS(fresh.load(dir / "cut.bin"), doctest::Contains("is cut short (truncated file?)"), anvil::Error);
  CHECK(fresh.size() == 0);
  // One flipped bit in the middle (stored transitions): the checksum refuses it.
  const auto flipped = test::copy_with_flipped_bit(dir / "per.bin", dir / "flipped.bin", static_cast<std::int64_t>(bytes / 2));
  CHECK_THROWS_WITH_AS(fresh.load(flipped),
                       doctest::Contains("checksum does not match the contents (corrupted file?)"), anvil::Error);
  CHECK(fresh.size() == 0);
  CHECK_THROWS_WITH_AS(fresh.load(dir / "uniform.bin"), doctest::Contains("is not an anvil PrioritizedBuffer v4 file"),
                       anvil::Error);
  UniformBuffer::Config other = uc;
  other.capacity = 21;
  UniformBuffer w(envs::spec_of(envs::Pendulum{}), other, RunContext{});
  CHECK_THROWS_WITH_AS(w.load(dir / "uniform.bin"),
                       doctest::Contains("buffer.capacity is 20 in the file but 21 here"), anvil::Error);
  CHECK(w.size() == 0);
  // A save into a missing directory fails before touching anything.
  CHECK_THROWS_WITH_AS(u.save(dir / "missing" / "x.bin"), doctest::Contains("does its directory exist?"), anvil::Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Replay storage that cannot fit is refused before it is allocated, naming the field and both sizes") {
  // The figure counts the priority tree with the transitions.
  const auto available = available_memory();
  CHECK(available.bytes > 0);
  const std::int64_t tree = anvil::detail::PriorityTree::bytes_for(1'000'000);
  CHECK(tree >= 1'000'000 * 8);
  CHECK(tree <= 1'000'000 * 8 * 13 / 10 + 4096);
  CHECK_THROWS_WITH_AS(make(1'500'000'000), doctest::Contains("buffer.capacity=1500000000: PrioritizedBuffer's storage needs"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(check_fits(3 << 20, "buffer.capacity=7", "a store", AvailableMemory{1 << 20, "a test"}),
                       "buffer.capacity=7: a store needs 3.0 MiB, but 1.0 MiB is available (a test); lower it or free memory",
                       ConfigError);
}

TEST_CASE("PrioritizedBuffer: with tasks, each task's share of a batch is drawn by its own priorities, weights included") {
  PrioritizedBuffer::Config c;
  c.capacity = 600;
  c.alpha = 1.0;
  c.beta = 1.0;
  PrioritizedBuffer b(test::tasked_spec(2), c, RunContext{.seed = 5});
  CHECK(b.balances_tasks());
  // Env 0: task 0, envs 1..3: task 1 (the data is 1:3).
  for (std::int64_t t = 0; t < 100; ++t) b.add(test::tasked_step(4, t, 50, [](std::int64_t i) { return i == 0 ? 0 : 1; }));
  // In task 1, env 1's transitions get priority 10, the others 1 (eps is tiny).
  const auto all = torch::arange(400, torch::kLong);
  auto td = torch::ones({400});
  for (std::int64_t k = 0; k < 400; ++k)
    if (k % 4 == 1) td[k] = 10.0;
  b.update_priorities(all, td);
  int task1 = 0, env1 = 0;
  for (int k = 0; k < 200; ++k) {
    const auto s = b.sample(20);
    CHECK((s.task == 0).sum().item<int>() == 10);
    for (std::int64_t j = 0; j < 20; ++j) {
      if (s.task[j].item<std::int64_t>() != 1) continue;
      ++task1;
      const bool high = s.index[j].item<std::int64_t>() % 4 == 1;
      env1 += high ? 1 : 0;
      // P(i) = 1/2 * p_i / total_1 with total_1 = 100 * 10 + 200 * 1; beta 1: the weight is
      // P_min / P(i), P_min the smallest probability of any transition (task 1's priority 1).
      const double w = s.weight[j].item<float>();
      CHECK(w == doctest::Approx(high ? 0.1 : 1.0).epsilon(1e-4));
    }
  }
  // Env 1 holds 10 of task 1's 12 parts of priority.
  CHECK(static_cast<double>(env1) / task1 == doctest::Approx(10.0 / 12.0).epsilon(0.05));
  // Task 0's transitions (priority 1, total 100, share 1/2): P = 1/200; P_min = 1/2 * 1/1200,
  // so the weight is (1/2400) / (1/200) = 1/12.
  const auto s = b.sample(20);
  for (std::int64_t j = 0; j < 20; ++j)
    if (s.task[j].item<std::int64_t>() == 0) CHECK(s.weight[j].item<float>() == doctest::Approx(1.0 / 12.0).epsilon(1e-4));
  // Saved and loaded: the same draws.
  const auto file = std::filesystem::temp_directory_path() / ("anvil_tasked_per_" + std::to_string(::getpid()) + ".bin");
  b.save(file);
  PrioritizedBuffer back(test::tasked_spec(2), c, RunContext{.seed = 1});
  back.load(file);
  std::filesystem::remove(file);
  const auto x = b.sample(20), y = back.sample(20);
  CHECK(torch::equal(x.index, y.index));
  CHECK(torch::equal(x.weight, y.weight));
  CHECK(back.total_priority() == doctest::Approx(b.total_priority()));
}

TEST_CASE("Replay buffers: a batch still held is never written again, and a dropped batch's tensors are reused") {
  // Drawing a batch on the host allocates nothing once the caller has let go of the last
  // one (detail::ReusedTensor): the same tensors are written again. A batch the caller
  // still holds, or a view of it, must keep its values.
  auto check = [](auto& buffer) {
    buffer.add(step_of(64, 0));
    auto first = buffer.sample(16);
    const auto obs = first.obs.clone(), reward = first.reward.clone(), index = first.index.clone();
    const bool weighted = first.weight.defined();  // (prioritized only)
    const auto weight = weighted ? first.weight.clone() : torch::Tensor();
    auto second = buffer.sample(16);  // `first` held: new tensors
    CHECK(second.obs.data_ptr() != first.obs.data_ptr());
    CHECK(second.index.data_ptr() != first.index.data_ptr());
    if (weighted) CHECK(second.weight.data_ptr() != first.weight.data_ptr());
    CHECK(torch::equal(first.obs, obs));
    CHECK(torch::equal(first.reward, reward));
    CHECK(torch::equal(first.index, index));
    if (weighted) CHECK(torch::equal(first.weight, weight));
    const void* reused = second.obs.data_ptr();
    const void* reused_index = second.index.data_ptr();
    second = {};
    auto third = buffer.sample(16);  // `second` dropped: its tensors again, every value rewritten
    CHECK(third.obs.data_ptr() == reused);
    CHECK(third.index.data_ptr() == reused_index);
    for (int k = 0; k < 16; ++k) {
      const auto id = third.index[k].template item<std::int64_t>();
      CHECK(third.reward[k].template item<float>() == static_cast<float>(id));
      CHECK(third.obs[k][0].template item<float>() == static_cast<float>(id));
      CHECK(third.next_obs[k][0].template item<float>() == static_cast<float>(id) + 0.5f);
    }
    const auto view = third.obs.narrow(0, 0, 4);  // a view keeps the storage held
    const auto seen = view.clone();
    third = {};
    auto fourth = buffer.sample(16);
    CHECK(fourth.obs.data_ptr() != view.data_ptr());
    CHECK(torch::equal(view, seen));
    auto fifth = buffer.sample(8);  // another batch size: tensors of its own shape
    CHECK(fifth.obs.size(0) == 8);
    CHECK(fifth.index.size(0) == 8);
  };
  auto prioritized = make(128);
  check(prioritized);
  UniformBuffer::Config c;
  c.capacity = 128;
  UniformBuffer uniform(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 5});
  check(uniform);
}
