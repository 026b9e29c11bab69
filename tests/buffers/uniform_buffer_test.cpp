// UniformBuffer: batched add, wraparound, uniform sampling, terminated vs truncated.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/pendulum.hpp>

using namespace anvil;

namespace {
StepBatch step_of(std::int64_t n, float base) {
  auto ids = torch::arange(n, torch::kFloat) + base;  // row value = transition id
  return StepBatch{ids.unsqueeze(1).repeat({1, 3}), ids.unsqueeze(1) / 1000.0f, ids,
                   ids.unsqueeze(1).repeat({1, 3}) + 0.5f, torch::zeros({n}), torch::zeros({n})};
}
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
  // obs and next_obs 3 floats each, action 1, reward and terminated 1 each: 9 floats a row.
  CHECK(b.bytes() == 1000 * 9 * 4);
}
