// DDP's collectives on real c10d Gloo: two ranks as two threads of this process, meeting
// through an in-memory store and talking over loopback TCP.
#include <anvil/parallel/ddp.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <anvil/algorithms/discrete_sac.hpp>
#include <anvil/algorithms/recurrent_ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/parallel/collectives.hpp>

using namespace anvil;

namespace {

// Runs `body(rank, group)` on `world` threads, each a rank of one Gloo group.
void with_ranks(int world, const std::function<void(int, dist::Group&)>& body, double bucket_mb = 25) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::World w;
        w.rank = r;
        w.world_size = world;
        w.local_rank = r;
        w.local_world_size = world;
        dist::Group g(w, store, c10::Device(c10::kCPU), DistBackend::gloo, std::chrono::seconds(60), "", bucket_mb);
        body(r, g);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Gives rank `r` rank 0's state, as the Trainer does when a run starts: saved on rank 0,
// broadcast over `g`, read and restored on the others.
template <class A>
void take_rank0_state(A& me, int r, dist::Group& g) {
  std::vector<std::uint8_t> bytes;
  if (r == 0) {
    auto w = BinaryWriter::in_memory("state");
    me.save(w);
    bytes = w.take_bytes();
  }
  broadcast_bytes(g, bytes, c10::Device(c10::kCPU));
  if (r != 0) {
    BinaryReader rd(bytes, "rank 0's state", "state");
    auto s = me.read(rd);
    rd.finish();
    me.restore(s);
  }
}

SAC::Config small() {
  SAC::Config c;
  c.actor->hidden = {32, 32};
  c.critic->hidden = {32, 32};
  return c;
}

// `updates` fixed Pendulum batches of `rows` rows and the noise of each update, drawn from
// `seed`: shared by every run of a test.
struct FixedUpdates {
  std::vector<ReplayBatch> batches;
  std::vector<SAC::UpdateNoise> noise;
  // Rows [r * n, (r + 1) * n) of update i's batch and noise: rank r's part.
  [[nodiscard]] std::pair<ReplayBatch, SAC::UpdateNoise> part(int i, int r, std::int64_t n) const {
    const auto k = static_cast<std::size_t>(i);
    return {rows_of(batches[k], r * n, n), SAC::UpdateNoise{noise[k].next.narrow(0, r * n, n), noise[k].obs.narrow(0, r * n, n)}};
  }
};
FixedUpdates fixed_updates(int updates, std::int64_t rows, std::uint64_t seed) {
  torch::manual_seed(seed);
  FixedUpdates f;
  for (int i = 0; i < updates; ++i) {
    ReplayBatch b;
    b.obs = torch::randn({rows, 3});
    b.action = torch::rand({rows, 1}) * 2 - 1;
    b.reward = torch::randn({rows});
    b.next_obs = torch::randn({rows, 3});
    b.terminated = (torch::rand({rows}) < 0.1).to(torch::kFloat);
    f.batches.push_back(b);
    f.noise.push_back({torch::randn({rows, 1}), torch::randn({rows, 1})});
  }
  return f;
}

std::vector<at::Tensor> state_of(SAC& s) {
  std::vector<at::Tensor> v{s.actor_optimizer().parameters().flat(), s.critic_optimizer().parameters().flat(),
                            s.alpha_optimizer().parameters().flat(), s.actor_optimizer().exp_avg_sq(),
                            s.critic_optimizer().exp_avg_sq()};
  for (auto& p : s.critic_target()->parameters()) v.push_back(p);
  return v;
}

}  // namespace

TEST_CASE("DDP: all_reduce_mean averages several tensors across ranks, in one bucket or many") {
  for (double bucket_mb : {25.0, 0.001}) {  // 0.001 MB: 262 floats per bucket, so 4 buckets
    std::array<std::vector<at::Tensor>, 2> got;
    with_ranks(2, [&](int r, dist::Group& g) {
      std::vector<at::Tensor> ts{torch::full({500}, 1.0f + r), torch::full({3, 100}, 10.0f * (r + 1)),
                                 torch::arange(200, torch::kFloat) * (r + 1)};
      g.all_reduce_mean(ts);
      CHECK(g.collectives() == 1);
      got[static_cast<std::size_t>(r)] = ts;
    }, bucket_mb);
    for (const auto& ts : got) {
      CHECK(torch::equal(ts[0], torch::full({500}, 1.5f)));
      CHECK(torch::equal(ts[1], torch::full({3, 100}, 15.0f)));
      CHECK(torch::allclose(ts[2], torch::arange(200, torch::kFloat) * 1.5f));
    }
  }
}

TEST_CASE("DDP: broadcast_bytes over a Gloo group hands rank 0's bytes of any length to every rank") {
  std::array<std::vector<std::uint8_t>, 3> got;
  with_ranks(3, [&](int r, dist::Group& g) {
    std::vector<std::uint8_t> b;
    if (r == 0)
      for (int i = 0; i < 1001; ++i) b.push_back(static_cast<std::uint8_t>(i * 7));
    else
      b.assign(5, 0xff);
    broadcast_bytes(g, b, c10::Device(c10::kCPU));
    got[static_cast<std::size_t>(r)] = b;
  });
  CHECK(got[0].size() == 1001);
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);
}

TEST_CASE("DDP: 2 ranks taking half a batch each end, after 20 SAC updates, where one process taking the whole batch ends, op by op and captured") {
  // Then again with the update as a CUDA graph holds it (`update_as_captured`, run op by op
  // here) and the all-reduce inside it, where parallel.capture_all_reduce puts it on GPUs
  // (NCCL cannot put two ranks on one GPU, so the graphs themselves wait for a machine with
  // several): after the gradients, before clipping and the optimizer steps.
  torch::set_num_threads(1);
  const auto spec = envs::spec_of(envs::Pendulum{});
  auto cfg = small();
  cfg.max_grad_norm = 1.0;
  constexpr int kUpdates = 20;
  constexpr std::int64_t kBatch = 64, kHalf = kBatch / 2;
  // The fixed batches and the noise of each update, shared by every run.
  const auto fixed = fixed_updates(kUpdates, kBatch, 11);
  const auto& batches = fixed.batches;
  const auto& noise = fixed.noise;
  auto half = [&](int i, int r) { return fixed.part(i, r, kHalf); };

  // One process, whole batches.
  torch::manual_seed(0);
  SAC one(spec, cfg, RunContext{});
  StepContext whole;
  for (int i = 0; i < kUpdates; ++i) one.update(batches[static_cast<std::size_t>(i)], whole, noise[static_cast<std::size_t>(i)]);
  const auto s1 = state_of(one);

  for (const bool captured : {false, true}) {
    CAPTURE(captured);
    // Two ranks, built with different weights (as ranks seeded apart are); rank 0's state is
    // broadcast first, as the Trainer does.
    torch::manual_seed(0);
    SAC rank0(spec, cfg, RunContext{});
    torch::manual_seed(5);
    SAC rank1(spec, cfg, RunContext{});
    CHECK_FALSE(torch::equal(rank0.critic_optimizer().parameters().flat(), rank1.critic_optimizer().parameters().flat()));
    std::array<SAC*, 2> ranks{&rank0, &rank1};
    std::array<int, 2> reduces{};
    std::array<std::int64_t, 2> steps{};
    std::array<std::string, 2> why_not;  // doctest's checks stay on this thread
    with_ranks(2, [&](int r, dist::Group& g) {
      SAC& me = *ranks[static_cast<std::size_t>(r)];
      take_rank0_state(me, r, g);
      StepContext::Options o;
      o.all_reduce_mean = [&, r](std::vector<at::Tensor>& ts) {
        ++reduces[static_cast<std::size_t>(r)];
        g.all_reduce_mean(ts);
      };
      o.all_reduce_in_graph = captured;
      StepContext ctx(o);
      why_not[static_cast<std::size_t>(r)] = ctx.why_not_graphable(/*loops_micro_batches=*/true);
      for (int i = 0; i < kUpdates; ++i) {
        auto [b, n] = half(i, r);
        if (captured) me.update_as_captured(b, ctx, n);
        else me.update(b, ctx, n);
      }
      steps[static_cast<std::size_t>(r)] = ctx.steps();
    });
    CHECK(reduces[0] == kUpdates);  // one all-reduce per update: critic, actor and temperature together
    CHECK(reduces[1] == kUpdates);
    CHECK(steps[0] == whole.steps());
    CHECK(steps[1] == whole.steps());
    // Without parallel.capture_all_reduce the all-reduce keeps updates op by op, and the run
    // header says why.
    CHECK(why_not[0] == (captured ? "" : "DDP: the all-reduce of gradients across ranks is not captured "
                                        "(parallel.capture_all_reduce=true captures it with NCCL)"));
    const auto s0 = state_of(rank0), s2 = state_of(rank1);
    for (std::size_t i = 0; i < s1.size(); ++i) {
      CHECK(torch::allclose(s0[i], s1[i], 1e-4, 1e-6));  // float tolerance: sums in another order
      CHECK(torch::equal(s0[i], s2[i]));                  // the ranks: bitwise
    }
  }

  // The control: a rank that learns from its half alone, without the all-reduce, does not
  // end where the whole batch ends (so the checks above can fail).
  torch::manual_seed(0);
  SAC alone(spec, cfg, RunContext{});
  StepContext own;
  for (int i = 0; i < kUpdates; ++i) {
    auto [b, n] = half(i, 0);
    alone.update(b, own, n);
  }
  CHECK_FALSE(torch::allclose(state_of(alone)[1], s1[1], 1e-4, 1e-6));
}

TEST_CASE("DDP: 2 ranks taking half a batch each end, after 20 discrete SAC updates, where one process taking the whole batch ends") {
  torch::set_num_threads(1);
  const auto spec = envs::spec_of(envs::CartPole{});
  DiscreteSAC::Config cfg;
  cfg.actor->hidden = {32, 32};
  cfg.critic->hidden = {32, 32};
  constexpr int kUpdates = 20;
  constexpr std::int64_t kBatch = 64, kHalf = kBatch / 2;
  torch::manual_seed(12);
  std::vector<ReplayBatch> batches;
  for (int i = 0; i < kUpdates; ++i) {
    ReplayBatch b;
    b.obs = torch::randn({kBatch, 4});
    b.action = torch::randint(2, {kBatch}, torch::kLong);
    b.reward = torch::randn({kBatch});
    b.next_obs = torch::randn({kBatch, 4});
    b.terminated = (torch::rand({kBatch}) < 0.1).to(torch::kFloat);
    batches.push_back(b);
  }
  auto state = [](const DiscreteSAC& s) {
    return std::vector<at::Tensor>{s.actor_optimizer().parameters().flat(), s.critic_optimizer().parameters().flat(),
                                   at::tensor(s.alpha())};
  };
  // One process, whole batches (the update draws no noise: its expectations are exact).
  torch::manual_seed(0);
  DiscreteSAC one(spec, cfg, RunContext{});
  StepContext whole;
  for (const auto& b : batches) one.update(b, whole);
  // Two ranks built apart, rank 0's state broadcast first as the Trainer does.
  torch::manual_seed(0);
  DiscreteSAC rank0(spec, cfg, RunContext{});
  torch::manual_seed(5);
  DiscreteSAC rank1(spec, cfg, RunContext{});
  std::array<DiscreteSAC*, 2> ranks{&rank0, &rank1};
  std::array<int, 2> reduces{};
  with_ranks(2, [&](int r, dist::Group& g) {
    DiscreteSAC& me = *ranks[static_cast<std::size_t>(r)];
    take_rank0_state(me, r, g);
    StepContext::Options o;
    o.all_reduce_mean = [&, r](std::vector<at::Tensor>& ts) {
      ++reduces[static_cast<std::size_t>(r)];
      g.all_reduce_mean(ts);
    };
    StepContext ctx(o);
    for (int i = 0; i < kUpdates; ++i) me.update(rows_of(batches[static_cast<std::size_t>(i)], r * kHalf, kHalf), ctx);
  });
  CHECK(reduces[0] == kUpdates);
  CHECK(reduces[1] == kUpdates);
  const auto s1 = state(one), s0 = state(rank0), s2 = state(rank1);
  for (std::size_t i = 0; i < s1.size(); ++i) {
    CHECK(torch::allclose(s0[i], s1[i], 1e-4, 1e-6));
    CHECK(torch::equal(s0[i], s2[i]));
  }
  // The control: half the batch without the all-reduce ends elsewhere.
  torch::manual_seed(0);
  DiscreteSAC alone(spec, cfg, RunContext{});
  StepContext own;
  for (int i = 0; i < kUpdates; ++i) alone.update(rows_of(batches[static_cast<std::size_t>(i)], 0, kHalf), own);
  CHECK_FALSE(torch::allclose(state(alone)[1], s1[1], 1e-4, 1e-6));
}

TEST_CASE("DDP: 2 ranks taking half the sequences each end, after 10 recurrent PPO updates, where one process taking them all ends") {
  torch::set_num_threads(1);
  const auto spec = envs::spec_of(envs::CartPoleNoVel{});
  RecurrentPPO::Config cfg;
  cfg.memory = 8;
  constexpr int kUpdates = 10;
  constexpr std::int64_t kLen = 6, kSeq = 8, kHalf = kSeq / 2;
  const std::int64_t width = 2 * *cfg.memory;
  torch::manual_seed(21);
  // Minibatches of 8 sequences of 6 steps, time first, with stored memory and episode starts.
  std::vector<RolloutBatch> batches;
  for (int i = 0; i < kUpdates; ++i) {
    RolloutBatch b{torch::randn({kLen * kSeq, 2}),         torch::randint(2, {kLen * kSeq}, torch::kLong),
                   -torch::rand({kLen * kSeq}) - 0.3,       torch::randn({kLen * kSeq}),
                   torch::randn({kLen * kSeq}),             torch::randn({kLen * kSeq})};
    b.first = (torch::rand({kLen * kSeq}) < 0.15).to(torch::kFloat);
    b.memory = torch::randn({kSeq, width}) * 0.5;
    b.sequence_length = kLen;
    batches.push_back(b);
  }
  // Sequences [begin, begin + n) of a batch: columns of its [kLen, kSeq] rows.
  auto half = [](const RolloutBatch& b, std::int64_t begin, std::int64_t n) {
    auto cut = [&](const at::Tensor& t) {
      std::vector<std::int64_t> shape{kLen, kSeq};
      for (std::int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
      std::vector<std::int64_t> flat{kLen * n};
      flat.insert(flat.end(), shape.begin() + 2, shape.end());
      return t.view(shape).narrow(1, begin, n).reshape(flat);
    };
    RolloutBatch h{cut(b.obs), cut(b.action), cut(b.log_prob), cut(b.advantage), cut(b.returns), cut(b.value)};
    h.first = cut(b.first);
    h.memory = b.memory.narrow(0, begin, n);
    h.sequence_length = kLen;
    return h;
  };
  auto state = [](const RecurrentPPO& p) {
    return std::vector<at::Tensor>{p.optimizer().parameters().flat(), p.optimizer().exp_avg_sq()};
  };
  torch::manual_seed(0);
  RecurrentPPO one(spec, cfg, RunContext{});
  StepContext whole;
  for (const auto& b : batches) one.update(b, whole);
  torch::manual_seed(0);
  RecurrentPPO rank0(spec, cfg, RunContext{});
  torch::manual_seed(5);
  RecurrentPPO rank1(spec, cfg, RunContext{});
  std::array<RecurrentPPO*, 2> ranks{&rank0, &rank1};
  std::array<int, 2> reduces{};
  with_ranks(2, [&](int r, dist::Group& g) {
    RecurrentPPO& me = *ranks[static_cast<std::size_t>(r)];
    take_rank0_state(me, r, g);
    StepContext::Options o;
    o.all_reduce_mean = [&, r](std::vector<at::Tensor>& ts) {
      ++reduces[static_cast<std::size_t>(r)];
      g.all_reduce_mean(ts);
    };
    StepContext ctx(o);
    for (int i = 0; i < kUpdates; ++i) me.update(half(batches[static_cast<std::size_t>(i)], r * kHalf, kHalf), ctx);
  });
  CHECK(reduces[0] == kUpdates);
  CHECK(reduces[1] == kUpdates);
  const auto s1 = state(one), s0 = state(rank0), s2 = state(rank1);
  for (std::size_t i = 0; i < s1.size(); ++i) {
    CHECK(torch::allclose(s0[i], s1[i], 1e-4, 1e-6));
    CHECK(torch::equal(s0[i], s2[i]));
  }
  // The control: half the sequences without the all-reduce end elsewhere.
  torch::manual_seed(0);
  RecurrentPPO alone(spec, cfg, RunContext{});
  StepContext own;
  for (int i = 0; i < kUpdates; ++i) alone.update(half(batches[static_cast<std::size_t>(i)], 0, kHalf), own);
  CHECK_FALSE(torch::allclose(state(alone)[0], s1[0], 1e-4, 1e-6));
}
