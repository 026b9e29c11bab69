// Collective distillation's data path and training speed:
// - writes a collective dataset of bench.rows rows of the manipulation suite's shape (obs 39,
//   action 4; segments of 500 rows of 3 tasks) in blocks, as a worker's append does, and
//   reports its size, the time to write it and the memory the process holds;
// - reads batches of bench.batch windows (history bench.history + the target) through
//   CollectiveDataset, with bench.workers prefetching threads (0: read in the calling thread),
//   interleaved rounds: batches/s and the ratio to one thread;
// - distillation updates of the default collective network at that batch, FP32 and BF16:
//   samples/s.
//   build/benchmarks/bench_collective                  (5M rows: a 2.2 GB file in runs/)
#include <anvil/buffers/collective_dataset.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <fstream>

#include <anvil/algorithms/collective_distillation.hpp>
#include <anvil/data/collective_file.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp32.hpp>

struct BenchConfig {
  anvil::Param<std::int64_t, "rows", "rows of the dataset written", anvil::at_least(1000)> rows{5'000'000};
  anvil::Param<std::string, "file", "where the dataset is written (kept between runs when its rows match)"> file{
      "runs/bench_collective.hdf5"};
  anvil::Param<int, "batch", "windows per batch", anvil::at_least(1)> batch{2048};
  anvil::Param<int, "history", "history tokens per window", anvil::at_least(1)> history{4};
  anvil::Param<std::vector<int>, "workers", "loader threads to time (0: the calling thread)"> workers{0, 1, 2};
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{3.0};
  anvil::Param<int, "rounds", "interleaved rounds", anvil::at_least(1)> rounds{3};
  anvil::Param<bool, "distill", "time distillation updates too"> distill{true};
  anvil::Param<int, "threads", "torch intra-op threads (0: torch's default)", anvil::at_least(0)> threads{0};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

constexpr std::int64_t kObs = 39, kAct = 4;

// Kilobytes of a /proc/self/status field.
double status_kb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  return 0;
}

// Writes `rows` rows in blocks (memory: one block), as append_collective does.
void write_dataset(const std::filesystem::path& path, std::int64_t rows) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  anvil::h5::H5Writer w(path);
  w.attribute("/", "format", std::string(anvil::collective::kFormat));
  w.attribute("/", "version", anvil::collective::kVersion);
  w.attribute("/", "obs_dim", kObs);
  w.attribute("/", "act_dim", kAct);
  w.attribute("/", "tasks", std::string("reach\ndrawer-close\nwindow-open\n"));
  for (const char* f : {"obs", "next_obs"}) w.allocate<float>(f, {rows, kObs});
  for (const char* f : {"action", "mean", "log_std"}) w.allocate<float>(f, {rows, kAct});
  for (const char* f : {"reward", "q_target"}) w.allocate<float>(f, {rows});
  for (const char* f : {"terminated", "episode_start"}) w.allocate<std::uint8_t>(f, {rows});
  anvil::Rng rng(1);
  const std::int64_t block = 65536;
  std::vector<float> wide(static_cast<std::size_t>(block * kObs)), narrow(static_cast<std::size_t>(block * kAct)), one(static_cast<std::size_t>(block));
  std::vector<std::uint8_t> flags(static_cast<std::size_t>(block));
  for (std::int64_t b = 0; b < rows; b += block) {
    const std::int64_t n = std::min(block, rows - b);
    for (auto& v : wide) v = static_cast<float>(rng.uniform(-1, 1));
    for (auto& v : narrow) v = static_cast<float>(rng.uniform(-1, 1));
    for (auto& v : one) v = static_cast<float>(rng.uniform(0, 10));
    for (std::int64_t i = 0; i < n; ++i) flags[static_cast<std::size_t>(i)] = (b + i) % 150 == 0;
    for (const char* f : {"obs", "next_obs"}) w.write_rows(f, b, n, wide.data());
    for (const char* f : {"action", "mean", "log_std"}) w.write_rows(f, b, n, narrow.data());
    for (const char* f : {"reward", "q_target"}) w.write_rows(f, b, n, one.data());
    w.write_rows("episode_start", b, n, flags.data());
    std::fill(flags.begin(), flags.end(), 0);
    w.write_rows("terminated", b, n, flags.data());
  }
  std::vector<std::int64_t> seg;
  for (std::int64_t s = 0; s < rows; s += 500) seg.insert(seg.end(), {s, std::min<std::int64_t>(500, rows - s), (s / 500) % 3});
  w.dataset("segments", {static_cast<std::int64_t>(seg.size() / 3), 3}, seg);
  w.commit();
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const std::filesystem::path file(*b.file);
  bool fresh = true;
  if (std::filesystem::exists(file)) {
    try {
      fresh = anvil::CollectiveFile(file).rows() != *b.rows;
    } catch (const anvil::Error&) {
    }
  }
  if (fresh) {
    const auto t0 = std::chrono::steady_clock::now();
    write_dataset(file, b.rows);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bench::emit("collective_write_s", s, "s", {{"rows", static_cast<long long>(*b.rows)}});
  }
  const std::vector<std::pair<std::string, bench::Value>> base{{"rows", static_cast<long long>(*b.rows)}, {"batch", *b.batch}, {"history", *b.history}};
  bench::emit("collective_file_mb", static_cast<double>(std::filesystem::file_size(file)) / (1 << 20), "MiB", base);

  // Loading: batches/s with each thread count, interleaved.
  anvil::EnvSpec spec;
  spec.name = "bench";
  struct Reader {
    int workers;
    std::unique_ptr<anvil::CollectiveDataset> data;
    std::vector<double> rates;
  };
  std::vector<Reader> readers;
  for (int w : *b.workers) {
    anvil::CollectiveDataset::Config c;
    c.workers = w;
    anvil::RunContext ctx;
    auto d = std::make_unique<anvil::CollectiveDataset>(spec, c, ctx);
    anvil::StoragePlan plan;
    plan.sequence_obs = b.history + 1;
    d->plan(plan);
    d->load(file);
    readers.push_back({w, std::move(d), {}});
  }
  for (int round = 0; round < b.rounds; ++round)
    for (auto& r : readers) r.rates.push_back(bench::median_rate([&] { (void)r.data->sample(b.batch); }, b.seconds, 1, round ? 1 : 3));
  for (const auto& r : readers) {
    auto conf = base;
    conf.emplace_back("workers", r.workers);
    conf.emplace_back("rounds", *b.rounds);
    bench::emit("collective_loader_batches_per_s", bench::median(r.rates), "batches/s", conf);
    if (r.workers != readers.front().workers)
      bench::emit("collective_loader_vs_one_thread", bench::median_ratio(r.rates, readers.front().rates), "x", conf);
  }
  bench::emit("collective_rss_anon_mb", status_kb("RssAnon") / 1024, "MiB", base);
  bench::emit("collective_rss_file_mb", status_kb("RssFile") / 1024, "MiB", base);

  if (!b.distill) return 0;
  // Distillation updates of the default network on one batch of the dataset.
  anvil::EnvSpec hs;
  hs.name = "history";
  const auto width = static_cast<std::size_t>(b.history * (kObs + kAct + 1) + b.history + kObs);
  hs.observation = anvil::Box{std::vector<float>(width, -1e3f), std::vector<float>(width, 1e3f)};
  hs.action = anvil::Box{std::vector<float>(kAct, -1.0f), std::vector<float>(kAct, 1.0f)};
  const auto batch = readers.front().data->sample(b.batch);
  struct Setting {
    std::string precision;
    std::unique_ptr<anvil::CollectiveDistillation> algo;
    std::unique_ptr<anvil::StepContext> ctx;
    std::vector<double> rates;
  };
  std::vector<Setting> settings;
  const auto make = [&]<class X>(X) {
    anvil::CollectiveDistillation::Config c;
    c.history = b.history;
    c.batch_size = b.batch;
    anvil::RunContext run;
    settings.push_back({std::string(X::name), std::make_unique<anvil::CollectiveDistillation>(hs, c, run),
                        std::make_unique<anvil::StepContext>(bench::step_options<X>(run.device)), {}});
  };
  make(anvil::FP32{});
  make(anvil::BF16{});
  for (int round = 0; round < b.rounds; ++round)
    for (auto& s : settings)
      s.rates.push_back(static_cast<double>(*b.batch) * bench::median_rate([&] { s.algo->update(batch, *s.ctx); }, b.seconds, 1, round ? 1 : 2));
  for (const auto& s : settings) {
    auto conf = base;
    conf.emplace_back("precision", s.precision);
    conf.emplace_back("threads", at::get_num_threads());
    bench::emit("collective_distill_samples_per_s", bench::median(s.rates), "samples/s", conf);
    if (s.precision != "fp32") bench::emit("collective_distill_vs_fp32", bench::median_ratio(s.rates, settings.front().rates), "x", conf);
  }
}
