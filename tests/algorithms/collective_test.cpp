// Collective distillation: the data loader (every row once an epoch, an order fixed by the
// seed, exact resume mid-epoch), the collective network's distillation loss on a tiny
// dataset, its update as a CUDA graph holds it (run op by op), and with HDF5: a SAC
// worker's copies labelled with the expert's own outputs in the dataset file, appends that
// keep the old rows, bad and truncated files refused by name, and a distillation run
// through the Trainer that resumes exactly.
#include <anvil/algorithms/collective_distillation.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <vector>

#include <anvil/anvil.hpp>
#include <anvil/algorithms/collective_student.hpp>
#include <anvil/data/loader.hpp>
#include <anvil/envs/history.hpp>

#if ANVIL_WITH_HDF5
#include <anvil/algorithms/collective_worker.hpp>
#include <anvil/buffers/collective_dataset.hpp>
#include <anvil/data/collective_file.hpp>
#endif

#include "../captured_checks.hpp"
#include "../skip.hpp"
#include "../python_policy_check.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

// A loader whose batches are their own row ids (as float).
DataLoader::ReadFn ids_reader() {
  return [](std::span<const std::int64_t> ids, std::vector<at::Tensor>& out, const at::TensorOptions& opts) {
    auto t = at::empty({static_cast<std::int64_t>(ids.size())}, opts);
    for (std::size_t i = 0; i < ids.size(); ++i) t.data_ptr<float>()[i] = static_cast<float>(ids[i]);
    out = {t};
  };
}
std::vector<std::int64_t> ids_of(const LoaderBatch& b) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < b.fields[0].numel(); ++i) v.push_back(static_cast<std::int64_t>(b.fields[0][i].item<float>()));
  return v;
}

using test::history_spec;

}  // namespace

TEST_CASE("Collective: the loader hands out every row once an epoch, in an order fixed by the seed") {
  DataLoader::Options o;
  o.batch = 64;
  o.workers = 2;
  o.drop_last = false;
  o.seed = 5;
  DataLoader a(1000, ids_reader(), o);
  CHECK(a.batches_per_epoch() == 16);
  std::vector<std::int64_t> first, second;
  for (int b = 0; b < 16; ++b) {
    const auto v = ids_of(a.next());
    CHECK(v.size() == (b < 15 ? 64u : 40u));
    first.insert(first.end(), v.begin(), v.end());
  }
  for (int b = 0; b < 16; ++b) {
    const auto v = ids_of(a.next());
    second.insert(second.end(), v.begin(), v.end());
  }
  auto sorted = first;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  CHECK(sorted == all);  // every row once
  CHECK(first != second);  // a new permutation each epoch
  std::sort(second.begin(), second.end());
  CHECK(second == all);
  // The same seed, read in the calling thread: the same order; another seed: another.
  o.workers = 0;
  DataLoader b(1000, ids_reader(), o);
  std::vector<std::int64_t> again;
  for (int k = 0; k < 16; ++k) {
    const auto v = ids_of(b.next());
    again.insert(again.end(), v.begin(), v.end());
  }
  CHECK(again == first);
  o.seed = 6;
  DataLoader c(1000, ids_reader(), o);
  CHECK(ids_of(c.next()) != std::vector<std::int64_t>(first.begin(), first.begin() + 64));
  // Two ranks: disjoint halves; drop_last leaves short batches out.
  o.world = 2;
  o.drop_last = true;
  std::set<std::int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    DataLoader d(1000, ids_reader(), o);
    CHECK(d.batches_per_epoch() == 7);  // 500 rows each: 7 full batches of 64
    for (int k = 0; k < 7; ++k)
      for (auto id : ids_of(d.next())) CHECK(seen.insert(id).second);
  }
  CHECK(seen.size() == 2u * 7u * 64u);
}

TEST_CASE("Collective: a resumed loader hands out the very batches, mid-epoch, whatever its threads") {
  DataLoader::Options o;
  o.batch = 32;
  o.sequence = 3;  // windows of 3 rows from the given starts
  o.workers = 3;
  o.prefetch = 5;
  o.seed = 11;
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s < 300; ++s) starts.push_back(s * 4);
  DataLoader a(starts, ids_reader(), o);
  CHECK(a.batches_per_epoch() == 9);
  std::vector<std::vector<std::int64_t>> seen;
  for (int b = 0; b < 20; ++b) seen.push_back(ids_of(a.next()));  // over two epoch boundaries
  for (const auto& v : seen) {
    REQUIRE(v.size() == 96u);
    for (std::size_t i = 0; i < v.size(); i += 3) {  // consecutive rows of one window
      CHECK(v[i] % 4 == 0);
      CHECK(v[i + 1] == v[i] + 1);
      CHECK(v[i + 2] == v[i] + 2);
    }
  }
  o.workers = 1;
  DataLoader b(starts, ids_reader(), o);
  b.seek(7);
  CHECK(b.position() == 7);
  for (int k = 7; k < 20; ++k) CHECK(ids_of(b.next()) == seen[static_cast<std::size_t>(k)]);
  CHECK(b.position() == 20);
  // Seeking back drops what was read ahead.
  b.seek(2);
  CHECK(ids_of(b.next()) == seen[2]);
}

TEST_CASE("Collective: distillation drives a tiny collective network's loss to near zero on a tiny dataset") {
  torch::manual_seed(3);
  const int h = 4, od = 3, ad = 2;
  CollectiveDistillation::Config c;
  c.history = h;
  c.batch_size = 64;
  c.lr = 3e-3;
  c.net->d_model = 16;
  c.net->heads = 2;
  c.net->layers = 1;
  c.net->feedforward = 32;
  c.net->hidden = {64, 64};
  RunContext ctx;
  CollectiveDistillation algo(history_spec(h, od, ad), c, ctx);
  CHECK(algo.obs_dim() == od);
  // 64 rows of two "tasks": the expert's labels depend on the state and on the task, which
  // only the history's rewards tell (task 1's rewards are 1, task 0's are -1).
  const std::int64_t n = 64;
  CollectiveBatch b;
  b.tokens = torch::randn({n, h, od + ad + 1});
  b.task = torch::arange(n) % 2;
  b.tokens.select(2, od + ad).copy_(b.task.to(torch::kFloat).mul(2).sub(1).unsqueeze(1).expand({n, h}));
  b.mask = torch::ones({n, h});
  b.obs = torch::randn({n, od});
  b.action = torch::rand({n, ad}) * 2 - 1;
  const auto sign = b.task.to(torch::kFloat).mul(2).sub(1).unsqueeze(1);
  b.mean = torch::tanh(b.obs.narrow(1, 0, ad)) * sign;
  b.log_std = torch::full({n, ad}, -1.0) + 0.5 * sign;
  b.q_target = b.obs.sum(1) * sign.squeeze(1) + b.action.sum(1);
  StepContext sc;
  double first = 0, last = 0;
  for (int i = 0; i < 600; ++i) {
    const auto info = algo.update(b, sc);
    (i == 0 ? first : last) = info.metrics[0].second;
  }
  MESSAGE("distillation loss " << first << " -> " << last);
  CHECK(last < 0.01 * first);
  CHECK(last < 0.02);
  // Acting reads the history layout of envs::History: the policy's mean, squashed.
  auto obs = torch::cat({b.tokens.reshape({n, -1}), b.mask, b.obs}, 1);
  const auto a = algo.act(obs, ActMode::deterministic);
  CHECK((a - b.mean.tanh()).abs().max().item<double>() < 0.15);
}

namespace {
using test::random_windows;

CollectiveDistillation::Config tiny_distill(int h) {
  CollectiveDistillation::Config c;
  c.history = h;
  c.batch_size = 48;
  c.lr = 3e-3;
  c.weight_decay = 0.01;
  c.max_grad_norm = 0.5;
  c.net->d_model = 16;
  c.net->heads = 2;
  c.net->layers = 1;
  c.net->feedforward = 32;
  c.net->hidden = {32, 32};
  return c;
}

// 12 updates of two collectives from one seed on the same batches, one op by op and one as a
// CUDA graph holds the update (`update_as_captured`, op by op on the CPU): the same losses,
// weights, step counts and (with a loss scaler) decisions of the scaler.
void check_distill_captured_matches(const CollectiveDistillation::Config& c, const StepContext::Options& options = {},
                                    const std::optional<StepContext::Options>& captured_options = {}) {
  const int h = 4, od = 3, ad = 2;
  torch::manual_seed(11);
  CollectiveDistillation eager(history_spec(h, od, ad), c, RunContext{});
  torch::manual_seed(11);
  CollectiveDistillation captured(history_spec(h, od, ad), c, RunContext{});
  StepContext ce(options), cc(captured_options.value_or(options));
  torch::manual_seed(12);
  for (int k = 0; k < 12; ++k) {
    CAPTURE(k);
    const auto b = random_windows(48, h, od, ad);
    const auto x = eager.update(b, ce);
    const auto y = captured.update_as_captured(b, cc);
    REQUIRE(x.metrics.size() == y.metrics.size());
    for (std::size_t i = 0; i < x.metrics.size(); ++i) {
      CHECK(x.metrics[i].first == y.metrics[i].first);
      CHECK(y.metrics[i].second == doctest::Approx(x.metrics[i].second).epsilon(1e-4));
    }
  }
  // Every weight within float rounding, but for the attention's key bias: adding one vector
  // to every key shifts each row of scores by a constant, which softmax ignores, so its
  // gradient is zero but for float noise, which Adam scales up to steps of up to lr (a few
  // 1e-4 apart after 12 steps; the outputs above agree).
  const auto theirs = captured.network()->named_parameters();
  for (const auto& p : eager.network()->named_parameters()) {
    CAPTURE(p.key());
    const auto& mine = p.value();
    const auto& other = theirs[p.key()];
    if (p.key().ends_with("qkv.bias")) {
      const auto d = mine.size(0) / 3;
      CHECK(torch::allclose(mine.narrow(0, 0, d), other.narrow(0, 0, d), 1e-4, 1e-5));          // queries
      CHECK(torch::allclose(mine.narrow(0, d, d), other.narrow(0, d, d), 0.0, 5e-3));           // keys
      CHECK(torch::allclose(mine.narrow(0, 2 * d, d), other.narrow(0, 2 * d, d), 1e-4, 1e-5));  // values
    } else {
      CHECK(torch::allclose(mine, other, 1e-4, 1e-5));
    }
  }
  CHECK(captured.optimizer().steps() == eager.optimizer().steps());
  CHECK(cc.steps() == ce.steps());
  CHECK(captured.updates() == eager.updates());
  CHECK(captured.graphed_updates() == 0);
  test::check_same_scaler_decisions(ce, cc);  // with a loss scaler: the same decisions on the device
}
}  // namespace

TEST_CASE("Collective: the distillation update as a CUDA graph holds it matches the op-by-op update, micro-batches and FP16's scaler included") {
  // On the CPU no graph runs, but the captured form of the update runs op by op
  // (update_as_captured): the transformer's passes, the losses kept as a tensor until the
  // end, the clipped AdamW step reading its step count and learning rate from tensors; then
  // gradient accumulation's micro-batches looped over inside, then a loss scaler checking
  // and skipping on the device (a scale near float32's limit overflows as float16 does).
  const auto c = tiny_distill(4);
  check_distill_captured_matches(c);
  StepContext::Options accumulating;
  accumulating.micro_batches = 3;
  check_distill_captured_matches(c, accumulating);
  StepContext::Options eager;
  eager.loss_scaling = LossScaler::Options{.init_scale = std::ldexp(1.0, 124), .growth_factor = 2.0,
                                           .backoff_factor = 0.5, .growth_interval = 3};
  auto captured = eager;
  captured.loss_scaler_on_device = true;
  check_distill_captured_matches(c, eager, captured);
}

TEST_CASE("Collective: a distillation update a CUDA graph cannot hold is refused by name, and the run header says why") {
  const int h = 4, od = 3, ad = 2;
  auto c = tiny_distill(h);
  CollectiveDistillation d(history_spec(h, od, ad), c, RunContext{});
  const auto b = random_windows(8, h, od, ad);
  StepContext::Options o;  // a loss scaler whose state is on the host (on CUDA it is on the device)
  o.loss_scaling = LossScaler::Options{};
  StepContext scaled(o);
  CHECK_THROWS_WITH_AS((void)d.update_as_captured(b, scaled),
                       "distill: this update cannot be captured: the loss scaler's state is on the host "
                       "(StepContext::Options::loss_scaler_on_device)",
                       Error);
  CHECK(d.updates() == 0);  // refused before anything changed
  StepContext::Options ddp;
  ddp.all_reduce_mean = [](std::vector<at::Tensor>&) {};
  CHECK(cuda_graph_note(d, StepContext(ddp)).find("distill's update runs op by op: DDP: the all-reduce") == 0);
  CHECK(cuda_graph_note(d, StepContext{}) ==
        "distill's update is captured (a graph per batch size, after 2 warm-ups op by op each); acting runs op by op");
  c.cuda_graph = false;
  CollectiveDistillation off(history_spec(h, od, ad), c, RunContext{});
  CHECK(cuda_graph_note(off, StepContext{}) == "distill's update runs op by op: off (distill.cuda_graph=false); acting runs op by op");
  StepContext plain;
  CHECK_THROWS_WITH_AS((void)off.update_as_captured(b, plain),
                       "distill: this update cannot be captured: off (distill.cuda_graph=false)", Error);
}

TEST_CASE("Collective: envs::History keeps the episode's last steps as tokens, in the policy's units") {
  envs::History<envs::Pendulum> env(envs::Pendulum{}, 2);
  const auto o0 = std::vector<float>(env.reset(1).begin(), env.reset(1).end());
  REQUIRE(o0.size() == 2u * 5u + 2u + 3u);
  CHECK(o0[10] == 0.0f);  // no history after a reset
  CHECK(o0[11] == 0.0f);
  const std::vector<float> state0(o0.end() - 3, o0.end());
  const float a = 1.0f;  // Pendulum's torque bound is 2: 1 is 0.5 in [-1, 1]
  const auto r = env.step(std::span<const float>(&a, 1));
  const std::vector<float> o1(r.observation.begin(), r.observation.end());
  CHECK(o1[10] == 0.0f);
  CHECK(o1[11] == 1.0f);  // the newest token is valid
  for (int j = 0; j < 3; ++j) CHECK(o1[5 + j] == state0[static_cast<std::size_t>(j)]);
  CHECK(o1[8] == doctest::Approx(0.5));
  CHECK(o1[9] == doctest::Approx(r.reward));
}

TEST_CASE("Collective: the student's reward is the env's plus the weighted, clipped log-likelihood of its action under the collective, at update or at store") {
  torch::manual_seed(5);
  const int h = 2, od = 3, ad = 1;
  CollectiveStudent::Config c;
  c.distill->history = h;
  c.distill->net->d_model = 8;
  c.distill->net->heads = 2;
  c.distill->net->layers = 1;
  c.distill->net->hidden = {16};
  c.sac->actor->hidden = {16};
  c.sac->critic->hidden = {16};
  c.shaping->weight = 0.5;
  c.shaping->warmup = 100;
  c.shaping->decay = 200;
  c.shaping->min_log_prob = -3.0;
  RunContext ctx;
  CollectiveStudent student(history_spec(h, od, ad), c, ctx);
  // Held, then falling linearly to 0.
  CHECK(student.weight(0) == 0.5);
  CHECK(student.weight(99) == 0.5);
  CHECK(student.weight(200) == doctest::Approx(0.25));
  CHECK(student.weight(300) == 0.0);
  CHECK(student.weight(10'000) == 0.0);
  const std::int64_t n = 6;
  StepBatch s;
  s.obs = torch::randn({n, h * (od + ad + 1) + h + od});
  s.action = torch::linspace(-0.99, 0.99, n).unsqueeze(1);
  s.reward = torch::arange(n).to(torch::kFloat);
  const auto lp = student.collective_log_prob(s.obs, s.action);
  // The log-likelihood by hand: the tanh-Gaussian density of the action under the head's output.
  {
    torch::NoGradGuard no_grad;
    auto& net = student.collective().network();
    const auto tokens = s.obs.narrow(1, 0, h * (od + ad + 1)).view({n, h, od + ad + 1});
    const auto mask = s.obs.narrow(1, h * (od + ad + 1), h);
    const auto state = s.obs.narrow(1, h * (od + ad + 1) + h, od);
    auto [mean, log_std] = net->policy(net->represent(tokens, mask), state);
    const auto u = torch::atanh(s.action);
    const auto sd = log_std.exp();
    const auto gauss = -0.5 * ((u - mean) / sd).square() - log_std - 0.5 * std::log(2 * M_PI);
    const auto expect = (gauss - torch::log(1 - s.action.square())).sum(1);
    CHECK(torch::allclose(lp, expect, 1e-4, 1e-4));
  }
  const auto shaped = s.reward + 0.25 * lp.clamp_min(-3.0);
  ReplayBatch b;
  b.obs = s.obs;
  b.action = s.action;
  b.reward = s.reward;
  SUBCASE("at update (the default): stored as the env gave it, each batch shaped with the weight of the last step stored") {
    CHECK(torch::equal(student.shaped_rewards(s, 200), s.reward));
    CHECK(torch::allclose(student.update_rewards(b), shaped, 1e-6, 1e-6));  // weight 0.25
    student.shaped_rewards(s, 250);
    CHECK(torch::allclose(student.update_rewards(b), s.reward + 0.125 * lp.clamp_min(-3.0), 1e-6, 1e-6));
    student.shaped_rewards(s, 400);  // after the decay the same batch learns from the env's own
    CHECK(torch::equal(student.update_rewards(b), s.reward));
  }
  SUBCASE("at store: each step shaped as it is stored, batches learn from what was stored") {
    CollectiveStudent::Config cs = c;
    cs.shaping->at = ShapeAt::store;
    CollectiveStudent stored(history_spec(h, od, ad), cs, ctx);
    stored.collective().set_weights(FlatParameters(student.collective().network()->parameters()).flat());
    CHECK(torch::allclose(stored.shaped_rewards(s, 200), shaped, 1e-6, 1e-6));  // weight 0.25
    CHECK(torch::equal(stored.update_rewards(b), b.reward));
    CHECK(torch::equal(stored.shaped_rewards(s, 400), s.reward));  // after the decay: the env's own
  }
  // The student's SAC reads the state part only; acting works on History observations.
  CHECK(student.act(s.obs, ActMode::deterministic).sizes() == at::IntArrayRef({n, ad}));
}

#if ANVIL_WITH_HDF5

namespace {

// A small valid dataset: 2 segments of 20 rows of task "a".
CollectiveRows small_rows(std::int64_t n, int od, int ad, float base) {
  CollectiveRows r;
  r.obs_dim = od;
  r.act_dim = ad;
  r.resize(n);
  for (std::size_t i = 0; i < r.obs.size(); ++i) r.obs[i] = base + 0.01f * static_cast<float>(i);
  r.next_obs = r.obs;
  for (std::size_t i = 0; i < r.action.size(); ++i) r.action[i] = 0.5f;
  r.mean = r.action;
  r.log_std = r.action;
  for (std::int64_t i = 0; i < n; ++i) {
    r.reward[static_cast<std::size_t>(i)] = base;
    r.q_target[static_cast<std::size_t>(i)] = base + static_cast<float>(i);
    r.terminated[static_cast<std::size_t>(i)] = 0;
    r.episode_start[static_cast<std::size_t>(i)] = i % 10 == 0;
  }
  return r;
}

}  // namespace

TEST_CASE("Collective: a worker's copies are each env's newest transitions, labelled with the expert's own outputs") {
  using Trainer = anvil::Trainer<SAC, CollectiveTap<>>;
  Trainer::Config c;
  c.run->run_dir = temp_run_dir("collective_worker");
  c.run->progress = ProgressMode::off;
  c.run->tensorboard = false;
  c.env->num_envs = 2;
  c.train->steps = 1200;
  c.train->learning_starts = 200;
  c.train->eval_interval = 0;
  c.algorithm->actor->hidden = {32, 32};
  c.algorithm->critic->hidden = {32, 32};
  c.buffer->start = 400;
  c.buffer->sampling_interval = 400;
  c.buffer->samples = 100;
  Trainer t(envs::Pendulum{}, c);
  t.fit();
  const auto& tap = t.buffer();
  CHECK(tap.segments() == std::vector<std::int64_t>(4, 50));  // copies at 800 and 1200 env steps (one interval after the warm-up of 400), a segment per env
  const auto& rows = tap.copied();
  REQUIRE(rows.rows() == 200);
  // Within a segment, each row's state is the state the previous step led to (Pendulum's
  // episodes are 200 steps: a step that starts one follows an autoreset).
  int chained = 0;
  for (std::int64_t i = 1; i < 50; ++i) {
    bool same = true;
    for (int j = 0; j < 3; ++j) same = same && rows.obs[static_cast<std::size_t>(i * 3 + j)] == rows.next_obs[static_cast<std::size_t>((i - 1) * 3 + j)];
    chained += same || rows.episode_start[static_cast<std::size_t>(i)];
  }
  CHECK(chained == 49);
  CHECK(rows.episode_start[0] == 1);  // a segment starts its history afresh

  const auto file = std::filesystem::path(temp_run_dir("collective_file")) / "collective.hdf5";
  auto& sac = t.algorithm();
  CHECK(finish_worker(sac, tap, file, "pendulum", 7) == 200);
  CollectiveFile f(file);
  REQUIRE(f.rows() == 200);
  CHECK(f.tasks() == std::vector<std::string>{"pendulum"});
  CHECK(f.mapped());
  std::vector<std::int64_t> ids(200);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> obs(600), next(600), mean(200), log_std(200), q(200), rew(200);
  std::vector<std::uint8_t> term(200);
  f.read(CollectiveFile::obs, ids, obs.data());
  f.read(CollectiveFile::next_obs, ids, next.data());
  f.read(CollectiveFile::mean, ids, mean.data());
  f.read(CollectiveFile::log_std, ids, log_std.data());
  f.read(CollectiveFile::q_target, ids, q.data());
  f.read(CollectiveFile::reward, ids, rew.data());
  f.read(CollectiveFile::terminated, ids, term.data());
  CHECK(obs == rows.obs);
  // The labels are the expert's outputs: its Gaussian at obs, its clipped double-Q target.
  {
  torch::NoGradGuard no_grad;
  const auto o = torch::from_blob(obs.data(), {200, 3}).clone(), nx = torch::from_blob(next.data(), {200, 3}).clone();
  auto [m, ls] = sac.actor()->forward(o);
  CHECK(torch::allclose(m.squeeze(1), torch::from_blob(mean.data(), {200}), 1e-5, 1e-5));
  CHECK(torch::allclose(ls.squeeze(1), torch::from_blob(log_std.data(), {200}), 1e-5, 1e-5));
  const auto s = sac.actor()->sample(nx, label_noise(7, 0, 200, 1));
  auto [q1, q2] = sac.critic_target()->forward(nx, s.action);
  const auto y = torch::from_blob(rew.data(), {200}) + 0.99 * (torch::min(q1, q2) - sac.alpha() * s.log_prob);
  CHECK(torch::allclose(y, torch::from_blob(q.data(), {200}), 1e-4, 1e-4));
  }
  CHECK(std::all_of(term.begin(), term.end(), [](auto v) { return v == 0; }));  // Pendulum never terminates

  // Another worker's rows appended: the old rows stay, the new task is listed.
  append_collective(file, "other", small_rows(40, 3, 1, 2.0f), {20, 20});
  CollectiveFile g(file);
  CHECK(g.rows() == 240);
  CHECK(g.tasks() == std::vector<std::string>{"pendulum", "other"});
  REQUIRE(g.segments().size() == 6u);
  CHECK(g.segments().back().begin == 220);
  CHECK(g.segments().back().task == 1);
  std::vector<float> again(600);
  g.read(CollectiveFile::obs, ids, again.data());
  CHECK(again == obs);

  // The dataset as an offline run's storage: distillation through the Trainer, resumed exactly.
  using Distill = anvil::Trainer<CollectiveDistillation, CollectiveDataset>;
  const auto distill_config = [&](const std::string& dir) {
    Distill::Config d;
    d.run->run_dir = dir;
    d.run->progress = ProgressMode::off;
    d.run->tensorboard = false;
    d.run->checkpoint_interval = 10;
    d.train->dataset = file.string();
    d.train->steps = 20;
    d.train->eval_interval = 0;
    d.train->update->grad_accumulation = 2;
    d.algorithm->batch_size = 32;
    d.algorithm->history = 4;
    d.algorithm->net->d_model = 16;
    d.algorithm->net->hidden = {32};
    return d;
  };
  const auto env = envs::History<envs::Pendulum>(envs::Pendulum{}, 4);
  Distill whole(env, distill_config(temp_run_dir("collective_distill_whole")));
  whole.fit();
  CHECK(whole.updates() == 20);
  auto cut = distill_config(temp_run_dir("collective_distill_cut"));
  cut.train->steps = 10;
  {
    Distill first(env, cut);
    first.fit();
  }
  auto resumed_cfg = distill_config(cut.run->run_dir);
  resumed_cfg.run->resume = "auto";
  Distill resumed(env, resumed_cfg);
  resumed.fit();
  CHECK(resumed.updates() == 20);
  CHECK(torch::equal(resumed.algorithm().optimizer().parameters().flat(), whole.algorithm().optimizer().parameters().flat()));
  // Its policy file is a collective the student can load.
  const auto policy = whole.run_dir() / "policy.bin";
  REQUIRE(std::filesystem::exists(policy));
  auto net = load_collective(policy);
  CHECK(net->history() == 4);
  CollectiveStudent::Config sc;
  sc.distill->history = 4;
  sc.distill->net->d_model = 16;
  sc.distill->net->hidden = {32};
  sc.shaping->collective = policy.string();
  const auto spec = envs::spec_of(env);
  CollectiveStudent student(spec, sc, RunContext{});
  CHECK(torch::equal(student.collective().optimizer().parameters().flat(), whole.algorithm().ema_weights().defined()
                                                                                 ? whole.algorithm().ema_weights()
                                                                                 : whole.algorithm().optimizer().parameters().flat()));
  sc.distill->net->d_model = 32;
  CHECK_THROWS_WITH_AS(CollectiveStudent(spec, sc, RunContext{}), doctest::Contains("student.shaping.collective"), ConfigError);

  // Its policy.safetensors acts in PyTorch as the collective does (anvil.load_policy): 1,000
  // observations of the History env's layout, histories of every length, some not begun.
  torch::manual_seed(8);
  const std::int64_t n = 1000;
  const auto tokens = torch::rand({n, 4, 5}) * 2.0 - 1.0;
  auto mask = (torch::rand({n, 4}) < 0.6).to(at::kFloat);
  mask.narrow(0, 0, 10).zero_();
  const auto rows_in = at::cat({tokens.reshape({n, -1}), mask, torch::rand({n, 3}) * 2.0 - 1.0}, 1);
  const auto action = whole.collector().to_env(whole.algorithm().act(rows_in, ActMode::deterministic));
  ANVIL_CHECK_POLICY_IN_PYTHON(whole.run_dir() / "policy.safetensors", {{"obs", rows_in}, {"action", action}}, {});
}

TEST_CASE("Collective: h5py reads the collective dataset as its layout says") {
  const std::string python = ANVIL_H5PY_PYTHON;
  if (python.empty()) ANVIL_SKIP("no Python with h5py was found when configuring (Debian: python3-h5py)");
  const auto dir = std::filesystem::path(temp_run_dir("collective_h5py"));
  const auto file = dir / "c.hdf5";
  append_collective(file, "a", small_rows(40, 3, 1, 1.0f), {20, 20});
  append_collective(file, "b", small_rows(10, 3, 1, 2.0f), {10});
  const auto script = dir / "check.py";
  std::ofstream(script) << "import sys, h5py\n"
                           "f = h5py.File(sys.argv[1], 'r')\n"
                           "assert f.attrs['format'] == 'anvil collective transitions' and f.attrs['version'] == 1\n"
                           "assert f.attrs['tasks'].split() == ['a', 'b']\n"
                           "assert f['obs'].shape == (50, 3) and f['action'].shape == (50, 1) and f['q_target'].shape == (50,)\n"
                           "assert f['segments'][:].tolist() == [[0, 20, 0], [20, 20, 0], [40, 10, 1]]\n"
                           "assert abs(f['q_target'][45] - 7.0) < 1e-6 and f['episode_start'][40] == 1\n"
                           "print('ok')\n";
  const std::string cmd = python + " " + script.string() + " " + file.string() + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512] = {0};
  std::string out;
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  CHECK(::pclose(p) == 0);
  CHECK(out == "ok\n");
}

TEST_CASE("Collective: bad or truncated dataset files are refused, naming the file and the field") {
  const auto dir = std::filesystem::path(temp_run_dir("collective_bad"));
  const auto good = dir / "good.hdf5";
  append_collective(good, "a", small_rows(40, 3, 1, 1.0f), {20, 20});
  CHECK(CollectiveFile(good).rows() == 40);
  const auto refused = [](const std::filesystem::path& p, const std::string& what) {
    CHECK_THROWS_WITH_AS(CollectiveFile{p}, doctest::Contains(p.string().c_str()), Error);
    CHECK_THROWS_WITH_AS(CollectiveFile{p}, doctest::Contains(what.c_str()), Error);
  };
  // Truncated: the last values are gone.
  const auto cut = dir / "cut.hdf5";
  std::filesystem::copy_file(good, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(good) - 200);
  CHECK_THROWS_WITH_AS(CollectiveFile{cut}, doctest::Contains(cut.string().c_str()), Error);
  // Not HDF5 at all.
  const auto text = dir / "text.hdf5";
  std::ofstream(text) << "not a dataset\n";
  refused(text, "not an HDF5 file");
  // A field missing, or of the wrong shape; segments that do not cover the rows.
  const auto write = [&](const std::string& name, bool drop_q, std::int64_t act_rows, std::vector<std::int64_t> seg) {
    const auto p = dir / name;
    h5::H5Writer w(p);
    w.attribute("/", "format", std::string(collective::kFormat));
    w.attribute("/", "version", collective::kVersion);
    w.attribute("/", "obs_dim", std::int64_t{3});
    w.attribute("/", "act_dim", std::int64_t{1});
    w.attribute("/", "tasks", std::string("a\n"));
    const auto z = [](std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(n), 0.0f); };
    w.dataset<float>("obs", {10, 3}, z(30));
    w.dataset<float>("next_obs", {10, 3}, z(30));
    w.dataset<float>("action", {act_rows, 1}, z(act_rows));
    w.dataset<float>("reward", {10}, z(10));
    w.dataset<std::uint8_t>("terminated", {10}, std::vector<std::uint8_t>(10, 0));
    w.dataset<std::uint8_t>("episode_start", {10}, std::vector<std::uint8_t>(10, 0));
    w.dataset<float>("mean", {10, 1}, z(10));
    w.dataset<float>("log_std", {10, 1}, z(10));
    if (!drop_q) w.dataset<float>("q_target", {10}, z(10));
    w.dataset<std::int64_t>("segments", {static_cast<std::int64_t>(seg.size() / 3), 3}, seg);
    w.commit();
    return p;
  };
  CHECK(CollectiveFile(write("ok.hdf5", false, 10, {0, 10, 0})).rows() == 10);
  refused(write("no_q.hdf5", true, 10, {0, 10, 0}), "q_target");
  refused(write("short_action.hdf5", false, 9, {0, 10, 0}), "action");
  refused(write("gap.hdf5", false, 10, {0, 4, 0, 5, 5, 0}), "segments");
  refused(write("task.hdf5", false, 10, {0, 10, 3}), "segments");
  // A non-finite value is refused when its row is read, naming the field and the row.
  auto nan_rows = small_rows(40, 3, 1, 1.0f);
  nan_rows.mean[17] = NAN;
  const auto nan_file = dir / "nan.hdf5";
  append_collective(nan_file, "a", nan_rows, {40});
  CollectiveFile nf(nan_file);
  std::vector<std::int64_t> ids{3, 17};
  std::vector<float> out(2);
  CHECK_THROWS_WITH_AS(nf.read(CollectiveFile::mean, ids, out.data()), doctest::Contains("mean: row 17 holds a non-finite value"), Error);
  // A dataset too small for one batch is refused by name when the run asks for a batch.
  {
    CollectiveDataset::Config dc;
    CollectiveDataset data(history_spec(4, 3, 1), dc, RunContext{});
    StoragePlan plan;
    plan.sequence_obs = 5;
    data.plan(plan);
    data.load(good);
    CHECK(data.windows() == 2 * (20 - 4));
    CHECK_THROWS_WITH_AS(data.sample(64), doctest::Contains("fewer than one batch of 64"), ConfigError);
    CHECK(data.sample(8).obs.sizes() == at::IntArrayRef({8, 3}));
  }
  // Appending rows of another shape is refused, and the file stays as it was.
  CHECK_THROWS_WITH_AS(append_collective(good, "b", small_rows(10, 4, 1, 0.0f), {10}), doctest::Contains("obs_dim 3"), Error);
  CHECK(CollectiveFile(good).rows() == 40);
}

#endif
