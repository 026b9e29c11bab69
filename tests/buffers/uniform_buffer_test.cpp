// UniformBuffer: batched add, wraparound, uniform sampling, terminated vs truncated.
#include <anvil/buffers/uniform_buffer.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <anvil/envs/pendulum.hpp>

#include "steps.hpp"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

using namespace anvil;

namespace {
using test::step_of;
UniformBuffer make(std::int64_t capacity) {
  UniformBuffer::Config c;
  c.capacity = capacity;
  return UniformBuffer(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 4});
}
}  // namespace

TEST_CASE("UniformBuffer: batched adds wrap around and overwrite the oldest transitions") {
  auto b = make(10);
  b.add(step_of(4, 0));  // ids 0..3
  b.add(step_of(4, 4));  // ids 4..7
  CHECK(b.size() == 8);
  b.add(step_of(4, 8));  // ids 8..11: 10 and 11 overwrite slots 0 and 1
  CHECK(b.size() == 10);
  CHECK(b.added() == 12);
  std::set<int> seen;
  for (int i = 0; i < 100; ++i) {
    auto s = b.sample(10);
    for (int j = 0; j < 10; ++j) seen.insert(static_cast<int>(s.reward[j].item<float>()));
    // Every field of a sampled row belongs to the same transition.
    CHECK(torch::equal(s.obs.select(1, 0), s.reward));
    CHECK(torch::allclose(s.next_obs.select(1, 0), s.reward + 0.5f));
    CHECK(torch::allclose(s.action.squeeze(1) * 1000.0f, s.reward));
    CHECK(torch::equal(s.index.to(torch::kFloat), s.reward));  // index holds the ids
    for (const auto* t : {&s.obs, &s.action, &s.reward, &s.next_obs, &s.terminated}) CHECK(t->is_contiguous());
  }
  CHECK(seen == std::set<int>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("UniformBuffer: sampling is uniform over what is stored") {
  auto b = make(100);
  b.add(step_of(50, 0));
  std::vector<int> counts(50, 0);
  for (int i = 0; i < 1000; ++i) {
    auto s = b.sample(50);
    auto* r = s.reward.data_ptr<float>();
    for (int j = 0; j < 50; ++j) ++counts[static_cast<int>(r[j])];
  }
  // 50,000 draws over 50 slots: expect 1000 each; chi-square with 49 dof below its 99.9% point.
  double chi2 = 0;
  for (int c : counts) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  CHECK(chi2 < 85.4);
}

TEST_CASE("UniformBuffer: too many transitions at once and a batch larger than the size are clear errors") {
  auto b = make(4);
  CHECK_THROWS_WITH_AS(b.sample(1),
                       "UniformBuffer: sample(1) from a buffer holding 0 transitions; the batch "
                       "size must be between 1 and the size",
                       anvil::Error);
  b.add(step_of(2, 0));
  CHECK_THROWS_WITH_AS(b.sample(3),
                       "UniformBuffer: sample(3) from a buffer holding 2 transitions; the batch "
                       "size must be between 1 and the size",
                       anvil::Error);
  CHECK_THROWS_WITH_AS(b.add(step_of(5, 0)),
                       "UniformBuffer: adding 5 transitions at once exceeds buffer.capacity=4",
                       anvil::Error);
}

TEST_CASE("UniformBuffer: reports its preallocated bytes") {
  auto b = make(1000);
  // Transition rows: action, reward, terminated (3 floats) and two int32 observation links.
  // Observation ring: 1000 * 5/4 + 256 rows of 3 floats, and an int32 owner each.
  CHECK(b.bytes() == 1000 * (3 * 4 + 2 * 4) + 1506 * (3 * 4 + 4));
}

TEST_CASE("Replay buffers: observations are stored once, and an episode's end keeps its last observation") {
  auto b = make(1000);
  // 2 envs, 700 steps, truncated every 10: 1400 transitions and 1540 observations, of
  // which the 1000 newest transitions need about 1100: the ring of 1506 holds them all.
  for (std::int64_t t = 0; t < 700; ++t) b.add(test::chain_step(2, t, 10));
  CHECK(b.size() == 1000);
  CHECK(b.dropped() == 0);
  std::set<int> starts;
  for (int r = 0; r < 20; ++r) {
    auto s = b.sample(500);
    for (int k = 0; k < 500; ++k) {
      const float t = s.obs[k][0].item<float>();
      CHECK(t >= 200);  // the 1000 newest: steps 200..699 of both envs
      CHECK(s.reward[k].item<float>() == t);
      CHECK(s.obs[k][1].item<float>() == s.action[k][0].item<float>());  // the right env's row
      CHECK(s.next_obs[k][0].item<float>() == t + 1);
      CHECK(s.next_obs[k][1].item<float>() == s.obs[k][1].item<float>());
      // The last transition of an episode leads to its final observation, not the reset one.
      CHECK(s.next_obs[k][2].item<float>() == 0.f);
      const bool first = static_cast<int>(t) % 10 == 0;
      CHECK(s.obs[k][2].item<float>() == (first ? 1.f : 0.f));
      if (first) starts.insert(static_cast<int>(t));
    }
  }
  CHECK(starts.size() == 50);
}

TEST_CASE("Replay buffers: when observations do not chain, the oldest transitions leave early, cleanly") {
  // 1000 transitions that share no observations need 2000 rows; the ring has 1506, so the
  // transitions whose observations were overwritten (ids 0..246: obs rows 0..493) leave.
  auto b = make(1000);
  for (int k = 0; k < 10; ++k) b.add(step_of(100, static_cast<float>(100 * k)));
  CHECK(b.dropped() == 247);
  CHECK(b.size() == 753);
  for (int r = 0; r < 20; ++r) {
    auto s = b.sample(500);
    CHECK(s.index.min().item<std::int64_t>() >= 247);
    CHECK(torch::equal(s.index.to(torch::kFloat), s.reward));
    CHECK(torch::equal(s.obs.select(1, 0), s.reward));
    CHECK(torch::allclose(s.next_obs.select(1, 0), s.reward + 0.5f));
  }
  // New transitions replace the dropped rows first: the size grows back to the capacity.
  for (std::int64_t t = 0; t < 1000; ++t) b.add(test::chain_step(1, t, 100));
  CHECK(b.size() == 1000);
}

namespace {
// One step of 2 envs: env i gets reward r[i]; ended episodes as flagged.
StepBatch two_env_step(float r0, float r1, float obs, bool term0 = false, bool trunc1 = false) {
  StepBatch s;
  s.obs = torch::tensor({{obs, 0.f, 0.f}, {obs, 1.f, 0.f}});
  s.action = torch::tensor({{0.5f}, {-0.5f}});
  s.reward = torch::tensor({r0, r1});
  s.next_obs = torch::tensor({{obs + 1, 0.f, 0.f}, {obs + 1, 1.f, 0.f}});
  s.terminated = torch::tensor({term0 ? 1.f : 0.f, 0.f});
  s.truncated = torch::tensor({0.f, trunc1 ? 1.f : 0.f});
  return s;
}
}  // namespace

TEST_CASE("UniformBuffer: n-step returns sum discounted rewards and stop at episode ends") {
  UniformBuffer::Config c;
  c.capacity = 100;
  c.n_step = 3;
  UniformBuffer b(envs::spec_of(envs::Pendulum{}), c, RunContext{});
  b.set_discount(0.5);
  b.add(two_env_step(1, 10, 0));
  b.add(two_env_step(2, 20, 1));
  CHECK(b.size() == 0);  // windows not full yet
  b.add(two_env_step(4, 40, 2, /*term0=*/true, /*trunc1=*/true));
  // env 0 terminated at its third step: windows of 3, 2 and 1 steps, all terminal;
  // env 1 was truncated: the same windows, bootstrapping from the last observation.
  REQUIRE(b.size() == 6);
  std::map<std::pair<int, int>, std::tuple<float, float, float, float>> seen;  // (env, start) -> r, term, disc, next
  for (int i = 0; i < 60; ++i) {
    auto s = b.sample(6);
    for (int k = 0; k < 6; ++k)
      seen[{static_cast<int>(s.obs[k][1].item<float>()), static_cast<int>(s.obs[k][0].item<float>())}] = {
          s.reward[k].item<float>(), s.terminated[k].item<float>(), s.discount[k].item<float>(),
          s.next_obs[k][0].item<float>()};
  }
  REQUIRE(seen.size() == 6);
  using T = std::tuple<float, float, float, float>;
  CHECK(seen[{0, 0}] == T{1 + 0.5f * 2 + 0.25f * 4, 1, 0.125f, 3});
  CHECK(seen[{0, 1}] == T{2 + 0.5f * 4, 1, 0.25f, 3});
  CHECK(seen[{0, 2}] == T{4, 1, 0.5f, 3});
  CHECK(seen[{1, 0}] == T{10 + 0.5f * 20 + 0.25f * 40, 0, 0.125f, 3});
  CHECK(seen[{1, 2}] == T{40, 0, 0.5f, 3});
}

TEST_CASE("UniformBuffer: n-step windows slide by one and survive the ring's wraparound") {
  UniformBuffer::Config c;
  c.capacity = 4;
  c.n_step = 2;
  UniformBuffer b(envs::spec_of(envs::Pendulum{}), c, RunContext{});
  b.set_discount(0.9);
  for (int t = 0; t < 9; ++t) b.add(two_env_step(static_cast<float>(t), 0, static_cast<float>(t)));
  // 8 complete 2-step windows per env (starts 0..7), 16 in all; the last 4 are kept.
  CHECK(b.added() == 16);
  for (int i = 0; i < 30; ++i) {
    auto s = b.sample(4);
    for (int k = 0; k < 4; ++k) {
      const float start = s.obs[k][0].item<float>();
      CHECK(start >= 6);
      const float expect = s.obs[k][1].item<float>() == 0 ? start + 0.9f * (start + 1) : 0.f;
      CHECK(s.reward[k].item<float>() == doctest::Approx(expect));
      CHECK(s.next_obs[k][0].item<float>() == start + 2);
      CHECK(s.discount[k].item<float>() == doctest::Approx(0.81f));
    }
  }
}

TEST_CASE("UniformBuffer: 16-bit observation storage halves its memory and gives float32 batches") {
  for (auto dtype : {ObsDtype::bfloat16, ObsDtype::float16}) {
    UniformBuffer::Config c;
    c.capacity = 1000;
    c.obs_dtype = dtype;
    UniformBuffer b(envs::spec_of(envs::Pendulum{}), c, RunContext{});
    // as the float32 layout (above), with observations of 3 half floats
    CHECK(b.bytes() == 1000 * (3 * 4 + 2 * 4) + 1506 * (3 * 2 + 4));
    b.add(step_of(100, 0));  // ids up to 99 and id + 0.5 are exact in both 16-bit types
    auto s = b.sample(100);
    CHECK((s.obs.scalar_type() == torch::kFloat));
    CHECK(torch::equal(s.obs.select(1, 0), s.reward));
    CHECK(torch::equal(s.next_obs.select(1, 2), s.reward + 0.5f));
    const auto file = std::filesystem::temp_directory_path() / ("anvil_obs16_" + std::to_string(::getpid()) + ".bin");
    b.save(file);
    UniformBuffer back(envs::spec_of(envs::Pendulum{}), c, RunContext{.seed = 99});
    back.load(file);
    std::filesystem::remove(file);
    CHECK(torch::equal(back.sample(50).obs, b.sample(50).obs));
    // a value that is not representable comes back rounded, not garbled
    StepBatch odd = step_of(1, 0);
    odd.obs.fill_(1.0f / 3.0f);
    UniformBuffer::Config one = c;
    one.capacity = 1;
    UniformBuffer u(envs::spec_of(envs::Pendulum{}), one, RunContext{});
    u.add(odd);
    CHECK(u.sample(1).obs[0][0].item<float>() == doctest::Approx(1.0 / 3.0).epsilon(dtype == ObsDtype::bfloat16 ? 4e-3 : 5e-4));
  }
}

TEST_CASE("Replay storage: the indexed gather (how a GPU-resident buffer samples) matches the CPU gather") {
  // The CPU gather reads chunks of 256 transitions in two passes: batches of several chunks
  // and a partial one, every observation storage, n-step discounts and task columns.
  for (auto dtype : {ObsDtype::float32, ObsDtype::bfloat16, ObsDtype::float16}) {
    for (const bool tasks : {false, true}) {
      CAPTURE(static_cast<int>(dtype));
      CAPTURE(tasks);
      const auto spec = tasks ? test::tasked_spec(3) : envs::spec_of(envs::Pendulum{});
      anvil::detail::TransitionStore store(spec, 1000, c10::Device(c10::kCPU), "test", 3, dtype);
      store.set_gamma(0.9);
      for (std::int64_t t = 0; t < 500; ++t)  // wraps; n-step windows flush
        store.add(tasks ? test::tasked_step(3, t, 25, [](std::int64_t i) { return i; }) : test::chain_step(3, t, 25));
      std::vector<std::int64_t> slots;
      for (std::int64_t s = 0; s < store.stored(); s += 2)
        if (store.valid(s)) slots.push_back(s);
      for (std::int64_t s = store.stored() - 1; s >= 0; s -= 5)  // out of order, with repeats
        if (store.valid(s)) slots.push_back(s);
      REQUIRE(slots.size() > 600);
      const auto a = store.gather(slots), b = store.gather_indexed(slots);
      CHECK(torch::equal(a.obs, b.obs));
      CHECK(torch::equal(a.next_obs, b.next_obs));
      CHECK(torch::equal(a.action, b.action));
      CHECK(torch::equal(a.reward, b.reward));
      CHECK(torch::equal(a.terminated, b.terminated));
      CHECK(torch::equal(a.discount, b.discount));
      CHECK(a.task.defined() == tasks);
      if (tasks) CHECK(torch::equal(a.task, b.task));
      CHECK(torch::equal(a.index, b.index));
    }
  }
}

TEST_CASE("UniformBuffer: with tasks, batches carry each transition's task and hold an equal share of every task") {
  UniformBuffer::Config c;
  c.capacity = 2000;
  UniformBuffer b(test::tasked_spec(3), c, RunContext{.seed = 4});
  CHECK(b.balances_tasks());
  // 8 envs: tasks 0, 1, 2, 0, 1, 2, 0, 1 (the data is 3:3:2), env i's action is i.
  for (std::int64_t t = 0; t < 100; ++t) b.add(test::tasked_step(8, t, 50, [](std::int64_t i) { return i % 3; }));
  std::map<std::int64_t, int> per_task;
  for (int k = 0; k < 50; ++k) {
    const auto s = b.sample(31);
    REQUIRE(s.task.defined());
    std::map<std::int64_t, int> in_batch;
    for (std::int64_t j = 0; j < 31; ++j) {
      const auto task = s.task[j].item<std::int64_t>();
      CHECK(task == static_cast<std::int64_t>(s.action[j][0].item<float>()) % 3);  // the task stored is the env's
      ++in_batch[task];
    }
    for (const auto& [task, n] : in_batch) {
      CHECK(n >= 10);  // 31 = 11 + 10 + 10: the remainder rotates over the tasks
      CHECK(n <= 11);
      per_task[task] += n;
    }
  }
  CHECK(per_task[2] >= 510);  // task 2 has a quarter of the data but a third of the batches
  // Unbalanced: batches follow the data (task 2 near a quarter), tasks still carried.
  c.balance_tasks = false;
  UniformBuffer u(test::tasked_spec(3), c, RunContext{.seed = 4});
  CHECK_FALSE(u.balances_tasks());
  for (std::int64_t t = 0; t < 100; ++t) u.add(test::tasked_step(8, t, 50, [](std::int64_t i) { return i % 3; }));
  int two = 0;
  for (int k = 0; k < 50; ++k) two += (u.sample(31).task == 2).sum().item<int>();
  CHECK(two < 450);
  // A task with no transitions yet gets none; the others share its part.
  UniformBuffer late(test::tasked_spec(3), c, RunContext{.seed = 4});
  for (std::int64_t t = 0; t < 10; ++t) late.add(test::tasked_step(2, t, 50, [](std::int64_t i) { return i; }));
  const auto s = late.sample(8);
  CHECK((s.task == 2).sum().item<int>() == 0);
  // The task is checked when stored.
  CHECK_THROWS_WITH_AS(late.add(test::tasked_step(2, 10, 50, [](std::int64_t) { return 5; })),
                       doctest::Contains("StepBatch.task[0] is 5; the env has tasks 0 to 2"), Error);
  auto untagged = test::chain_step(2, 11, 50);
  CHECK_THROWS_WITH_AS(late.add(untagged), doctest::Contains("StepBatch.task must give each of the 2 envs' task"), Error);
}

TEST_CASE("UniformBuffer: tasks and balanced sampling survive a save and load") {
  UniformBuffer::Config c;
  c.capacity = 300;
  UniformBuffer a(test::tasked_spec(2), c, RunContext{.seed = 9});
  for (std::int64_t t = 0; t < 200; ++t) a.add(test::tasked_step(3, t, 40, [](std::int64_t i) { return i == 2 ? 1 : 0; }));
  const auto file = std::filesystem::temp_directory_path() / ("anvil_tasked_" + std::to_string(::getpid()) + ".bin");
  a.save(file);
  UniformBuffer b(test::tasked_spec(2), c, RunContext{.seed = 1});
  b.load(file);
  std::filesystem::remove(file);
  for (int k = 0; k < 5; ++k) {
    const auto x = a.sample(16), y = b.sample(16);
    CHECK(torch::equal(x.index, y.index));
    CHECK(torch::equal(x.task, y.task));
    CHECK((x.task == 1).sum().item<int>() == 8);
  }
}

TEST_CASE("UniformBuffer: observations of images are stored as bytes, once, and come back as the bytes put in") {
  EnvSpec spec{"images", {}, envs::Box{{-1.f}, {1.f}}, {}};
  spec.layout.image("pixels", 3, 8, 8).vector("state", 1);
  const auto row = spec.layout.row_bytes();
  UniformBuffer::Config c;
  c.capacity = 64;
  UniformBuffer b(spec, c, RunContext{.seed = 5});
  // two envs, chained observations: step t's next_obs is step t+1's obs
  auto obs_at = [&](std::int64_t t) {
    auto o = at::zeros({2, row}, at::kByte);
    for (std::int64_t i = 0; i < 2; ++i) {
      o[i].narrow(0, 0, 192).fill_(static_cast<std::uint8_t>(10 * t + i));
      const float s = static_cast<float>(t) + 0.25f;
      std::memcpy(o.data_ptr<std::uint8_t>() + i * row + 192, &s, 4);
    }
    return o;
  };
  for (std::int64_t t = 0; t < 10; ++t)
    b.add(StepBatch{obs_at(t), at::full({2, 1}, 0.5f), at::full({2}, static_cast<float>(t)), obs_at(t + 1), at::zeros({2}),
                    at::zeros({2}), {}});
  CHECK(b.size() == 20);
  const auto s = b.sample(16);
  REQUIRE((s.obs.scalar_type() == at::kByte));
  REQUIRE(s.obs.size(0) == 16);
  REQUIRE(s.obs.size(1) == row);
  for (std::int64_t k = 0; k < 16; ++k) {
    const auto t = static_cast<std::int64_t>(s.reward[k].item<float>());
    const auto i = static_cast<std::int64_t>(s.obs[k][0].item<std::uint8_t>()) - 10 * t;
    REQUIRE((i == 0 || i == 1));
    CHECK(at::equal(s.obs[k], obs_at(t)[i]));
    CHECK(at::equal(s.next_obs[k], obs_at(t + 1)[i]));
  }
  UniformBuffer::Config half = c;
  half.obs_dtype = ObsDtype::bfloat16;
  CHECK_THROWS_WITH_AS(UniformBuffer(spec, half, RunContext{}), doctest::Contains("buffer.obs_dtype"), ConfigError);
}
