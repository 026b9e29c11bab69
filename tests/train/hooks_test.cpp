// The hooks on their own, without a training run: evaluation (with its per-task breakdown),
// checkpoints (files, keep_last, resume=auto, refusals), the metrics log (CSV, TensorBoard,
// training.log, summary.json) and the console; and the clock they fire on.
#include <anvil/train/hooks/checkpoint.hpp>  // first: the header under test compiles on its own here
#include <torch/types.h>  // before doctest: c10's glog logging defines a CHECK of its own
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>

#include <anvil/algorithms/policy.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/hooks/evaluation.hpp>
#include <anvil/train/hooks/metrics.hpp>
#include <anvil/train/hooks/progress.hpp>

#include "../damaged_files.hpp"
#include "../observe/tfevents.hpp"
#include "../temp_run_dir.hpp"

using namespace anvil;

namespace {

// Two tasks: an episode draws one from its seed and lasts 5 steps; "up" pays +1 a step,
// "down" -1, whatever the action. A task-tagged env: evaluations break returns down by task.
struct TwoTasks {
  static constexpr std::string_view name = "TwoTasks";
  Box observation_space() const { return {{-1.0f}, {1.0f}}; }
  Box action_space() const { return {{-1.0f}, {1.0f}}; }
  std::span<const float> reset(std::uint64_t seed) {
    task_ = static_cast<int>(seed % 2);
    t_ = 0;
    obs_[0] = task_ ? 1.0f : -1.0f;
    return obs_;
  }
  envs::StepResult step(std::span<const float>) {
    ++t_;
    return {obs_, task_ ? 1.0 : -1.0, false, t_ >= 5};
  }
  std::vector<std::string> task_names() const { return {"down", "up"}; }
  std::int64_t task_index() const { return task_; }

 private:
  int task_ = 0, t_ = 0;
  std::array<float, 1> obs_{};
};
static_assert(envs::TaskTagged<TwoTasks>);

// Three tasks placed by env index (env i runs task i mod 3), 4 steps an episode; task k pays
// k a step, and an episode succeeds when its action was positive at some step.
struct PlacedTasks {
  static constexpr std::string_view name = "PlacedTasks";
  Box observation_space() const { return {{0.0f}, {2.0f}}; }
  Box action_space() const { return {{-1.0f}, {1.0f}}; }
  void place(std::int64_t i, std::int64_t) { task_ = static_cast<int>(i % 3); }
  std::span<const float> reset(std::uint64_t) {
    t_ = 0;
    obs_[0] = static_cast<float>(task_);
    return obs_;
  }
  envs::StepResult step(std::span<const float> a) {
    ++t_;
    success_ = a[0] > 0;
    return {obs_, static_cast<double>(task_), false, t_ >= 4};
  }
  bool success() const { return success_; }
  std::vector<std::string> task_names() const { return {"zero", "one", "two"}; }
  std::int64_t task_index() const { return task_; }

 private:
  int task_ = 0, t_ = 0;
  bool success_ = false;
  std::array<float, 1> obs_{};
};
static_assert(envs::Placeable<PlacedTasks> && envs::ReportsSuccess<PlacedTasks>);

Evaluation::MakeEnvs envs_of(auto env) {
  return [env](int n, std::uint64_t seed, int first, int count) {
    envs::VecEnvConfig c;
    c.num_envs = n;
    return envs::make_vec_env(env, c, seed, first, count);
  };
}

// A part of a run's state for the checkpoint tests.
struct Counter {
  std::int64_t n = 0;
  void save(BinaryWriter& w) const { w.value(n); }
  std::int64_t read(BinaryReader& r) const { return r.value<std::int64_t>("count"); }
  void restore(std::int64_t v) { n = v; }
};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What `f` prints on stdout.
template <class F>
std::string stdout_of(F&& f) {
  std::fflush(stdout);
  const auto file = std::filesystem::temp_directory_path() / ("anvil_stdout_" + std::to_string(::getpid()));
  const int saved = ::dup(1);
  std::FILE* out = std::fopen(file.c_str(), "w");
  ::dup2(::fileno(out), 1);
  f();
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  std::fclose(out);
  auto text = read_text(file);
  std::filesystem::remove(file);
  return text;
}

}  // namespace

TEST_CASE("Clock and Every: hooks fire at multiples of their interval, from where a resumed run stands") {
  Clock c;
  c.env_steps = 2500;
  c.updates = 40;
  CHECK(c.now() == 2500);
  c.unit = ClockUnit::updates;
  CHECK(c.now() == 40);
  Every e(1000);
  e.start(2500);  // a run resumed at 2500 keeps the schedule 3000, 4000, ...
  CHECK(e.next() == 3000);
  CHECK_FALSE(e.due(2999));
  CHECK(e.due(3200));
  CHECK(e.next() == 4000);
  CHECK(e.due(6000));  // a long iteration: due once, then the next multiple after it
  CHECK(e.next() == 7000);
  Every never(0);
  never.start(0);
  CHECK_FALSE(never.due(1'000'000'000));
}

TEST_CASE("Evaluation: returns' mean, spread and range, broken down by task, a new seed each time, state round-trips") {
  Evaluation eval(envs_of(TwoTasks{}), /*seed=*/1, Ranks{});
  auto act = [](const at::Tensor& obs) { return at::zeros({obs.size(0), 1}); };
  const auto r = eval.run(act, 40);
  REQUIRE(r.groups.size() == 2);
  CHECK(r.groups[0].name == "down");
  CHECK(r.groups[1].name == "up");
  CHECK(r.groups[0].mean == doctest::Approx(-5.0));
  CHECK(r.groups[1].mean == doctest::Approx(5.0));
  CHECK(r.groups[0].episodes + r.groups[1].episodes == 40);
  CHECK(r.groups[0].episodes > 5);  // both tasks drawn
  CHECK(r.groups[1].episodes > 5);
  const double up = r.groups[1].episodes;
  CHECK(r.mean == doctest::Approx((5.0 * up - 5.0 * (40 - up)) / 40));
  CHECK(r.min == -5.0);
  CHECK(r.max == 5.0);
  CHECK(r.episodes == 40);
  // The next evaluation takes the next seed: other draws of tasks.
  const auto r2 = eval.run(act, 40);
  CHECK(eval.count() == 2);
  CHECK(r2.groups[1].episodes != r.groups[1].episodes);
  eval.record(r, 100);
  eval.record(r2, 200);
  CHECK(eval.best() == std::max(r.mean, r2.mean));
  CHECK(eval.last_at() == 200);
  // State: the count (so a resumed run continues with the next seed), the results.
  auto w = BinaryWriter::in_memory("eval");
  eval.save(w);
  const auto bytes = w.take_bytes();
  Evaluation back(envs_of(TwoTasks{}), 1, Ranks{});
  BinaryReader rd(bytes, "eval", "eval");
  back.restore(back.read(rd));
  rd.finish();
  CHECK(back.count() == 2);
  CHECK(back.last_at() == 200);
  CHECK(back.best() == eval.best());
  REQUIRE(back.last().groups.size() == 2);
  CHECK(back.last().groups[1].episodes == r2.groups[1].episodes);
  CHECK(back.run(act, 40).mean == eval.run(act, 40).mean);  // the same third seed
}

TEST_CASE("Evaluation: envs placed on tasks get the episodes asked for each task, with each task's success rate") {
  Evaluation eval(envs_of(PlacedTasks{}), 3, Ranks{}, nullptr, {"zero", "one", "two"});
  // Succeeds where the observation (the task) is 2: only task "two".
  auto act = [](const at::Tensor& obs) { return (obs > 1.5f).to(at::kFloat) * 2 - 1; };
  const auto r = eval.run(act, 5);
  CHECK(r.episodes == 15);
  REQUIRE(r.groups.size() == 3);
  for (int g = 0; g < 3; ++g) {
    CHECK(r.groups[static_cast<std::size_t>(g)].episodes == 5);
    CHECK(r.groups[static_cast<std::size_t>(g)].mean == doctest::Approx(4.0 * g));
    CHECK(r.groups[static_cast<std::size_t>(g)].success == (g == 2 ? 1.0 : 0.0));
  }
  CHECK(r.success == doctest::Approx(1.0 / 3));
  // The success rates round-trip through the state protocol.
  auto w = BinaryWriter::in_memory("eval");
  eval.record(r, 10);
  eval.save(w);
  const auto bytes = w.take_bytes();
  Evaluation back(envs_of(PlacedTasks{}), 3, Ranks{}, nullptr, {"zero", "one", "two"});
  BinaryReader rd(bytes, "eval", "eval");
  back.restore(back.read(rd));
  CHECK(back.last().success == doctest::Approx(1.0 / 3));
  CHECK(back.last().groups[2].success == 1.0);
  // An env that does not say when it succeeds has no success rate.
  Evaluation plain(envs_of(TwoTasks{}), 1, Ranks{});
  CHECK(std::isnan(plain.run([](const at::Tensor& obs) { return at::zeros({obs.size(0), 1}); }, 4).success));
}

TEST_CASE("Evaluation: an env without tasks has no breakdown, a deterministic policy on Pendulum gives its return") {
  Evaluation eval(envs_of(envs::Pendulum{}), 7, Ranks{});
  const auto r = eval.run([](const at::Tensor& obs) { return at::zeros({obs.size(0), 1}); }, 3);
  CHECK(r.groups.empty());
  CHECK(r.episodes == 3);
  CHECK(r.max < -100.0);  // doing nothing never balances the pendulum (200 steps of cost)
  CHECK(r.min <= r.mean);
}

TEST_CASE("Checkpoints: files every step asked, the oldest beyond keep_last deleted, auto finds the latest") {
  const auto dir = std::filesystem::path(temp_run_dir("hook_ckpt"));
  std::filesystem::create_directories(dir);
  Counter a{1}, buf{10};
  StateSections state, buffer;
  state.add("counter", a);
  buffer.add("buffer", buf);
  const Checkpoints::Identity id{"sac", "fp32", "h",
                                 {{"sac.batch_size", "256"}, {"train.steps", "100"}, {"run.seed", "1"}, {"diffusion.sampler", "ddim"}},
                                 {"diffusion.sampler"}};
  Checkpoints ckpt({dir, /*keep_last=*/2, /*with_buffer=*/true}, id, state, buffer);
  for (std::int64_t step : {100, 200, 300}) {
    a.n = step;
    buf.n = step * 10;
    ckpt.save_at(step);
  }
  const auto all = Checkpoints::in(dir);
  REQUIRE(all.size() == 2);
  CHECK(all[0].filename() == "checkpoint-000000000200.ckpt");
  CHECK(std::filesystem::exists(dir / "checkpoint-000000000300.buffer"));
  CHECK_FALSE(std::filesystem::exists(dir / "checkpoint-000000000100.buffer"));
  CHECK(ckpt.resolve("auto") == dir / "checkpoint-000000000300.ckpt");
  // Reading changes nothing until applied; then the state and the buffer come back.
  a.n = buf.n = 0;
  auto apply = ckpt.read(all[0]);
  CHECK(a.n == 0);
  apply();
  CHECK(a.n == 200);
  CHECK(buf.n == 2000);

  // Another run may change run.* (but run.seed) and a loop's steps, not the rest: the field is named.
  Checkpoints::Identity longer = id;
  longer.config = {{"sac.batch_size", "256"}, {"train.steps", "999"}, {"run.threads", "7"}};
  CHECK_NOTHROW((void)Checkpoints({dir, 2, true}, longer, state, buffer).read(all[1]));
  // A field that changes only how the policy acts (FieldRole::acting) may differ too.
  Checkpoints::Identity resampled = id;
  resampled.config = {{"sac.batch_size", "256"}, {"diffusion.sampler", "ddpm"}};
  CHECK_NOTHROW((void)Checkpoints({dir, 2, true}, resampled, state, buffer).read(all[1]));
  resampled.acting_keys.clear();
  CHECK_THROWS_WITH_AS((void)Checkpoints({dir, 2, true}, resampled, state, buffer).read(all[1]),
                       doctest::Contains("was written by a run with diffusion.sampler = ddim; this run has diffusion.sampler = ddpm"),
                       Error);
  Checkpoints::Identity reseeded = id;
  reseeded.config = {{"sac.batch_size", "256"}, {"run.seed", "7"}};
  CHECK_THROWS_WITH_AS((void)Checkpoints({dir, 2, true}, reseeded, state, buffer).read(all[1]),
                       doctest::Contains("was written by a run with run.seed = 1; this run has run.seed = 7"), Error);
  Checkpoints::Identity other = id;
  other.config = {{"sac.batch_size", "512"}};
  CHECK_THROWS_WITH_AS((void)Checkpoints({dir, 2, true}, other, state, buffer).read(all[1]),
                       doctest::Contains("was written by a run with sac.batch_size = 256; this run has sac.batch_size = 512"),
                       Error);
  Checkpoints::Identity bf16 = id;
  bf16.precision = "bf16";
  CHECK_THROWS_WITH_AS((void)Checkpoints({dir, 2, true}, bf16, state, buffer).read(all[1]),
                       doctest::Contains("was written by a run in fp32 precision; this run is bf16"), Error);
  // A run whose state has another section: the unknown one is named.
  Counter extra;
  StateSections more;
  more.add("counter", a);
  more.add("extra", extra);
  CHECK_THROWS_WITH_AS((void)Checkpoints({dir, 2, true}, id, more, buffer).read(all[1]),
                       doctest::Contains("section 'extra' is missing"), Error);
  // The buffer file gone: named.
  std::filesystem::remove(Checkpoints::buffer_file(all[1]));
  CHECK_THROWS_WITH_AS((void)ckpt.read(all[1]), doctest::Contains("checkpoint-000000000300.buffer' is missing"), Error);
  // Damaged and missing checkpoints.
  CHECK_THROWS_WITH_AS((void)ckpt.read(anvil::test::copy_with_flipped_bit(all[0], dir / "bad.ckpt", -9)),
                       doctest::Contains("(corrupted file?)"), Error);
  CHECK_THROWS_WITH_AS((void)ckpt.read(dir / "none.ckpt"), doctest::Contains("run.resume: no checkpoint at"), Error);
  CHECK(a.n == 200);
  std::filesystem::remove_all(dir);
}

TEST_CASE("MetricsLog: rows go to metrics.csv, TensorBoard and training.log, summary.json holds the run") {
  const auto dir = std::filesystem::path(temp_run_dir("hook_metrics"));
  std::filesystem::create_directories(dir);
  Clock clock;
  EpisodeStats episodes;
  UpdateMetrics metrics;
  Evaluation eval(envs_of(TwoTasks{}), 1, Ranks{});
  PhaseTimes times;
  Ranks ranks;
  MetricsLog::Sources src{&clock, &episodes, &metrics, &eval, &times, &ranks,
                          [] { return std::vector<std::pair<std::string, double>>{{"actor", 3e-4}}; }, {}};
  MetricsLog log({dir, "sac", true, false, ClockUnit::env_steps, {}}, src, "# header\n");
  // A first row before any update: held back until the metrics' columns are known.
  clock.env_steps = 100;
  episodes.record(-10.0);
  episodes.record(-20.0);
  { ScopedPhase p(times, Phase::env); }
  auto row = log.gather(1.0, 0, 0);
  REQUIRE(row.has_value());
  CHECK_FALSE(row->complete);
  log.write_csv(*row);
  log.write_rest(*row);
  CHECK(clock.episodes == 2);  // the ranks' episodes are folded into the clock at each row
  // A second row after updates.
  clock.env_steps = 200;
  clock.updates = 4;
  metrics.add("critic_loss", 2.0);
  metrics.add("critic_loss", 4.0);
  episodes.record(-30.0);
  eval.record(eval.run([](const at::Tensor& o) { return at::zeros({o.size(0), 1}); }, 4), 200);
  log.write_evaluation(eval.last(), 200);
  row = log.gather(2.0, 0, 0);
  REQUIRE(row.has_value());
  CHECK(row->complete);
  log.write_csv(*row);
  log.write_rest(*row);
  log.note("a message");
  log.flush();
  CHECK(metrics.sums().at("critic_loss").second == 0);  // the sums start again after a row

  const auto csv = read_text(dir / "metrics.csv");
  CHECK(csv.rfind("env_steps,updates,wall_s,env_steps_per_s,episodes,recent_return,eval_return,critic_loss\n", 0) == 0);
  CHECK(csv.find("\n100,0,1,100,2,-15,,\n") != std::string::npos);
  CHECK(csv.find("\n200,4,2,100,3,-20,") != std::string::npos);
  CHECK(csv.find(",3\n") != std::string::npos);  // critic_loss mean (2 + 4) / 2
  const auto text = read_text(dir / "training.log");
  CHECK(text.rfind("# header\n", 0) == 0);
  CHECK(text.find("step 200: env_steps=200 updates=4") != std::string::npos);
  CHECK(text.find("a message") != std::string::npos);
  std::filesystem::path events;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path();
  REQUIRE_FALSE(events.empty());
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> tags;
  for (const auto& s : anvil::test::scalars(events)) tags[s.tag].emplace_back(s.step, s.value);
  CHECK(tags["sac/critic_loss"].back() == std::pair<std::int64_t, float>{200, 3.0f});
  CHECK(tags["lr/actor"].size() == 2);
  CHECK(tags["return/recent"].front() == std::pair<std::int64_t, float>{100, -15.0f});
  CHECK(tags.count("return/eval") == 1);

  FitResult r{1.5, 2.5, 200, 4, 2.0, {}};
  log.write_summary(r, 0, 0, 0.01, "abc", {{"sac.batch_size", "256"}});
  const auto summary = read_text(dir / "summary.json");
  CHECK(summary.find("\"final_eval_return\": 1.5") != std::string::npos);
  CHECK(summary.find("\"env_steps_per_s\": 100") != std::string::npos);
  CHECK(summary.find("\"config_hash\": \"abc\"") != std::string::npos);
  CHECK(summary.find("\"sac.batch_size\": 256") != std::string::npos);

  // A resumed run keeps the rows up to its checkpoint's clock and writes on from there.
  Clock at;
  at.env_steps = 100;
  at.updates = 0;
  log.resume(at);
  const auto kept = read_text(dir / "metrics.csv");
  CHECK(kept.find("\n100,0,") != std::string::npos);
  CHECK(kept.find("\n200,4,") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("MetricsLog: an env with tasks and success gets each task's return and success rate in every file") {
  const auto dir = std::filesystem::path(temp_run_dir("hook_metrics_tasks"));
  std::filesystem::create_directories(dir);
  Clock clock;
  EpisodeStats episodes;
  UpdateMetrics metrics;
  Evaluation eval(envs_of(PlacedTasks{}), 1, Ranks{}, nullptr, {"zero", "one", "two"}, true);
  PhaseTimes times;
  Ranks ranks;
  MetricsLog::Sources src{&clock, &episodes, &metrics, &eval, &times, &ranks, {}, {}};
  MetricsLog log({dir, "sac", true, false, ClockUnit::env_steps, {}}, src, "# header\n");
  clock.env_steps = 100;
  clock.updates = 1;
  metrics.add("critic_loss", 1.0);
  auto row = log.gather(1.0, 0, 0);  // before any evaluation: the columns are there, empty
  log.write_csv(*row);
  clock.env_steps = 200;
  metrics.add("critic_loss", 1.0);
  eval.record(eval.run([](const at::Tensor& obs) { return (obs > 1.5f).to(at::kFloat) * 2 - 1; }, 2), 200);
  log.write_evaluation(eval.last(), 200);
  row = log.gather(2.0, 0, 0);
  log.write_csv(*row);
  log.write_rest(*row);
  log.flush();
  const auto csv = read_text(dir / "metrics.csv");
  CHECK(csv.rfind("env_steps,updates,wall_s,env_steps_per_s,episodes,recent_return,eval_return,eval_success,"
                  "eval_return/zero,eval_success/zero,eval_return/one,eval_success/one,eval_return/two,eval_success/two,"
                  "critic_loss\n",
                  0) == 0);
  CHECK(csv.find("\n100,1,1,100,0,,,,,,,,,,1\n") != std::string::npos);
  // env_steps .. episodes, no recent return, eval 4 (the mean of 0, 4 and 8), success 1/3,
  // then each task's return and success, then the critic loss.
  CHECK(csv.find("\n200,1,2,100,0,,4,0.333") != std::string::npos);
  CHECK(csv.find(",0,0,4,0,8,1,1\n") != std::string::npos);
  std::filesystem::path events;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path();
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> tags;
  for (const auto& s : anvil::test::scalars(events)) tags[s.tag].emplace_back(s.step, s.value);
  CHECK(tags["task/two/success"] == std::vector<std::pair<std::int64_t, float>>{{200, 1.0f}});
  CHECK(tags["task/one/success"] == std::vector<std::pair<std::int64_t, float>>{{200, 0.0f}});
  CHECK(tags["task/one/return"] == std::vector<std::pair<std::int64_t, float>>{{200, 4.0f}});
  CHECK(tags["success/eval"].size() == 1);
  CHECK(read_text(dir / "training.log").find("  task two: return 8, success 1 (2 episodes)") != std::string::npos);
  FitResult r{1.5, 2.5, 200, 4, 2.0, {}};
  log.write_summary(r, 0, 0, 0.01, "abc", {});
  const auto summary = read_text(dir / "summary.json");
  CHECK(summary.find("\"final_eval_success\": 0.3333") != std::string::npos);
  CHECK(summary.find("\"two\": {\n      \"return\": 8.0,\n      \"success\": 1.0,\n      \"episodes\": 2\n    }") !=
        std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ProgressHook: lines at log rows, a bar that redraws, messages in every style") {
  const ProgressState s{500, 1000, 10, 2.0, -150.0, NAN, ""};
  const auto lines = stdout_of([&] {
    ProgressHook p(ProgressMode::lines);
    p.iteration(s);  // lines mode: nothing per iteration
    p.row(s);
    p.echo("  time: env 50%");
    p.say("hello");
  });
  CHECK(lines.find("step 500/1000  250 steps/s  10 updates") == 0);
  CHECK(lines.find("\n  time: env 50%\nhello\n") != std::string::npos);
  const auto bar = stdout_of([&] {
    ProgressHook p(ProgressMode::bar);
    p.iteration(s);
    p.row(s);  // bar mode: rows print nothing of their own
    p.finish();
  });
  // The bar fits the terminal (80 columns when stdout is not one): never wider than 79.
  CHECK(bar.find("]  50% 500/1000 ETA 0:02 250/s ret -150.0") != std::string::npos);
  const auto drawn = bar.substr(bar.rfind('\r') + 1);
  CHECK(drawn.substr(0, drawn.find("\033[K")).size() <= 79);
  CHECK(bar.find("step 500/1000") == std::string::npos);
  const auto off = stdout_of([&] {
    ProgressHook p(ProgressMode::off);
    p.iteration(s);
    p.row(s);
    p.say("still said");
  });
  CHECK(off == "still said\n");
}

TEST_CASE("write_tensor: non-finite weights are never written, and the file that was there stays") {
  const auto dir = std::filesystem::path(temp_run_dir("nonfinite_write"));
  std::filesystem::create_directories(dir);
  const auto file = dir / "weights.bin";
  {
    BinaryWriter w(file, "test weights");
    write_tensor(w, torch::ones({4}), "the actor's weights");
    w.commit();
  }
  auto bytes = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto before = bytes();
  auto bad = torch::ones({4});
  bad[2] = NAN;
  {
    BinaryWriter w(file, "test weights");
    CHECK_THROWS_WITH_AS(write_tensor(w, bad, "the actor's weights"),
                         doctest::Contains(("not writing '" + file.string() + "': the actor's weights holds nan values (1 of 4)").c_str()),
                         Error);
  }
  CHECK(bytes() == before);
  CHECK_FALSE(std::filesystem::exists(file.string() + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("load_policy: a corrupted layer width is refused before anything of its size is allocated") {
  const auto dir = std::filesystem::path(temp_run_dir("corrupt_policy"));
  std::filesystem::create_directories(dir);
  const auto file = dir / "policy.bin";
  {
    // A well-formed file (its checksum holds) whose widths ask for 2^20 x 2^20 weights.
    BinaryWriter w(file, kPolicyFormat);
    w.string("Pendulum-v1");
    w.string("GaussianActor");
    w.value(std::int64_t{3});
    w.value(std::int64_t{1});
    w.value(std::uint64_t{2});
    w.value(1 << 20);
    w.value(1 << 20);
    w.value(0);
    w.value(-5.0);
    w.value(2.0);
    write_tensor(w, torch::zeros({10}));
    w.commit();
  }
  CHECK_THROWS_WITH_AS((void)load_policy(file), doctest::Contains("hidden layer widths ask for 4398063288320 bytes, but the file has"),
                       Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Progress: the bar fits a narrow terminal, and the ETA leaves out the random warm-up") {
  // A narrow terminal (COLUMNS when stdout is not a terminal): parts drop from the end, the
  // bar shrinks, and the line never wraps.
  ::setenv("COLUMNS", "40", 1);
  const ProgressState s{500, 1000, 10, 2.0, -150.0, -120.0, "gpu0 97%"};
  const auto narrow = stdout_of([&] {
    Progress p(Progress::Style::bar);
    p.show(s, true);
    p.finish();
  });
  ::unsetenv("COLUMNS");
  const auto drawn = narrow.substr(narrow.rfind('\r') + 1);
  const auto line = drawn.substr(0, drawn.find("\033[K"));
  CHECK(line.size() <= 39);
  CHECK(line.find(" 50% 500/1000") != std::string::npos);
  CHECK(line.find("gpu0") == std::string::npos);  // the last parts go first

  // 10,000 warm-up steps in 1 s (no updates), then 100 steps/s once updates run: the
  // ETA's speed is the training speed, not the run's average (which the warm-up inflates).
  Progress p(Progress::Style::off);
  ProgressState w{10'000, 100'000, 0, 1.0, NAN, NAN, ""};
  CHECK(p.rate(w) == doctest::Approx(10'000.0));
  double t = 1.0;
  std::int64_t step = 10'000, updates = 0;
  double r = 0;
  for (int i = 0; i < 60; ++i) {  // a minute of training
    t += 1.0;
    step += 100;
    updates += 100;
    r = p.rate({step, 100'000, updates, t, NAN, NAN, ""});
  }
  CHECK(r == doctest::Approx(100.0).epsilon(0.01));
  CHECK(static_cast<double>(step) / t > 250.0);  // the whole run's average would say 2.5x faster
  // The speed follows a change within about its time constant (20 s), smoothing noise.
  for (int i = 0; i < 60; ++i) {
    t += 1.0;
    step += 200;
    updates += 200;
    r = p.rate({step, 100'000, updates, t, NAN, NAN, ""});
  }
  CHECK(r == doctest::Approx(200.0).epsilon(0.1));
}
