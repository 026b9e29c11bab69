// Replay buffer throughput at capacity 1,000,000 (observations 17, actions 6): adds of
// 16 transitions (one step of 16 envs), and sample + priority update of batches of 256,
// for UniformBuffer and PrioritizedBuffer. The prioritized figure is timed in interleaved
// rounds with a vectorised numpy sum tree (benchmarks/reference/sum_tree_numpy.py), as
// bench_sac_update does with its reference. `bench.memory_transitions` > 0 instead fills
// one buffer of that many transitions (observations 39, actions 4) and reports its bytes
// and the process's peak resident memory. Transitions come from chained envs (next_obs is
// the next step's obs), so the buffers store each observation once, as in training. One
// JSON line per figure.
#include <anvil/buffers/detail/replay_core.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <sys/resource.h>

#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/sum_tree.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/random.hpp>

#ifndef ANVIL_BENCH_SUM_TREE_REFERENCE
#define ANVIL_BENCH_SUM_TREE_REFERENCE ""
#endif

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{2.0};
  anvil::Param<int, "rounds", "interleaved rounds of anvil and numpy timings", anvil::at_least(1)> rounds{3};
  anvil::Param<std::int64_t, "capacity", "buffer capacity", anvil::at_least(1)> capacity{1'000'000};
  anvil::Param<int, "add_batch", "transitions per add (envs stepped together)", anvil::at_least(1)> add_batch{16};
  anvil::Param<int, "batch", "transitions per sample", anvil::at_least(1)> batch{256};
  anvil::Param<std::string, "python", "interpreter of the numpy reference (empty: skip it)"> python{"/usr/bin/python3"};
  anvil::Param<std::string, "reference", "the numpy sum-tree reference"> reference{ANVIL_BENCH_SUM_TREE_REFERENCE};
  anvil::Param<std::int64_t, "memory_transitions", "fill one buffer this large and report memory (0: throughput)",
               anvil::at_least(0)> memory_transitions{0};
  anvil::Param<std::string, "memory_buffer", "uniform or prioritized, for the memory figure"> memory_buffer{"uniform"};
  anvil::Param<anvil::ObsDtype, "obs_dtype", "observation storage of the memory figure"> obs_dtype{anvil::ObsDtype::float32};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

anvil::EnvSpec spec(int obs, int act) {
  return {"bench", anvil::Box{std::vector<float>(obs, -1e9f), std::vector<float>(obs, 1e9f)},
          anvil::Box{std::vector<float>(act, -1.f), std::vector<float>(act, 1.f)}, {}};
}

double peak_rss_bytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

// The numpy reference: the tree alone, or (`whole`) the whole buffer call as the
// PrioritizedBuffer does it (min tree, gather of the transitions, importance weights).
double numpy_rate(const BenchConfig& b, bool whole, int obs, int act) {
  return bench::run_reference(*b.python + " " + *b.reference + " --capacity " + std::to_string(*b.capacity) +
                              " --batch " + std::to_string(*b.batch) + " --seconds " +
                              std::to_string(*b.seconds) + " --repeats 1" +
                              (whole ? " --whole --obs " + std::to_string(obs) + " --act " + std::to_string(act) : ""));
}

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);

  if (b.memory_transitions > 0) {
    const int obs = 39, act = 4;
    const double before = peak_rss_bytes();
    double bytes = 0, size = 0;
    auto measure = [&](auto& buffer) {
      bench::fill(buffer, b.memory_transitions, obs, act, 64, 500);  // 64 envs, 500-step episodes
      bytes = static_cast<double>(buffer.bytes());
      size = static_cast<double>(buffer.size());
    };
    if (*b.memory_buffer == "prioritized") {
      anvil::PrioritizedBuffer::Config c;
      c.capacity = b.memory_transitions;
      c.obs_dtype = b.obs_dtype;
      anvil::PrioritizedBuffer buffer(spec(obs, act), c, anvil::RunContext{});
      measure(buffer);
    } else {
      anvil::UniformBuffer::Config c;
      c.capacity = b.memory_transitions;
      c.obs_dtype = b.obs_dtype;
      anvil::UniformBuffer buffer(spec(obs, act), c, anvil::RunContext{});
      measure(buffer);
    }
    const std::vector<std::pair<std::string, bench::Value>> conf{
        {"buffer", *b.memory_buffer}, {"transitions", static_cast<long long>(*b.memory_transitions)},
        {"obs_dim", obs}, {"act_dim", act},
        {"obs_storage", std::string(enum_names(anvil::ObsDtype{})[static_cast<std::size_t>(*b.obs_dtype)])}};
    bench::emit("buffer_bytes", bytes, "bytes", conf);
    bench::emit("buffer_transitions_stored", size, "transitions", conf);
    bench::emit("buffer_peak_rss", peak_rss_bytes(), "bytes", conf);
    bench::emit("process_rss_before_buffer", before, "bytes", conf);
    return 0;
  }

  const int obs = 17, act = 6;
  const auto sp = spec(obs, act);
  anvil::UniformBuffer::Config uc;
  uc.capacity = b.capacity;
  anvil::UniformBuffer uniform(sp, uc, anvil::RunContext{});
  anvil::PrioritizedBuffer::Config pc;
  pc.capacity = b.capacity;
  anvil::PrioritizedBuffer prioritized(sp, pc, anvil::RunContext{});
  bench::fill(uniform, b.capacity, obs, act, 1024, 200);
  bench::fill(prioritized, b.capacity, obs, act, 1024, 200);

  // The sum tree alone, doing what the numpy reference does per batch: stratified masses,
  // descend, new priorities (|td| + eps)^alpha, update.
  anvil::detail::PriorityTree tree(b.capacity);
  {
    std::vector<std::int64_t> idx(4096);
    std::vector<double> val(4096);
    anvil::Rng g(1);
    for (std::int64_t start = 0; start < b.capacity; start += 4096) {
      const auto m = static_cast<std::size_t>(std::min<std::int64_t>(4096, b.capacity - start));
      idx.resize(m);
      val.resize(m);
      for (std::size_t i = 0; i < m; ++i) {
        idx[i] = start + static_cast<std::int64_t>(i);
        val[i] = g.uniform() + 0.01;
      }
      tree.set(idx, val);
    }
  }
  anvil::Rng tree_rng(2);
  std::vector<double> mass(static_cast<std::size_t>(*b.batch)), prio(mass.size());
  std::vector<std::int64_t> found(mass.size());
  auto tree_once = [&] {
    const double slice = tree.total() / static_cast<double>(mass.size());
    for (std::size_t k = 0; k < mass.size(); ++k) mass[k] = (static_cast<double>(k) + tree_rng.uniform()) * slice;
    tree.find(mass, found);
    for (auto& p : prio) p = std::exp(0.6 * std::log(tree_rng.uniform() * 2 + 1e-6));
    tree.set(found, prio);
  };

  // Adds cycle through 64 chained steps of add_batch envs (one episode end per cycle).
  std::vector<anvil::StepBatch> cycle;
  bench::ChainedSteps chain(b.add_batch, obs, act, 64);
  for (int k = 0; k < 64; ++k) cycle.push_back(chain.next());
  std::size_t at = 0;
  auto step = [&]() -> const anvil::StepBatch& { return cycle[at++ % cycle.size()]; };
  const auto td = torch::rand({*b.batch}) * 2;
  const bool with_numpy = !b.python->empty() && !b.reference->empty();
  std::vector<double> add_u, add_p, su_u, su_p, tr, ref, ref_whole;
  for (int r = 0; r < b.rounds; ++r) {
    add_u.push_back(bench::median_rate([&] { uniform.add(step()); }, b.seconds, 1));
    add_p.push_back(bench::median_rate([&] { prioritized.add(step()); }, b.seconds, 1));
    su_u.push_back(bench::median_rate([&] { (void)uniform.sample(b.batch); }, b.seconds, 1));
    su_p.push_back(bench::median_rate([&] {
      auto s = prioritized.sample(b.batch);
      prioritized.update_priorities(s.index, td);
    }, b.seconds, 1));
    tr.push_back(bench::median_rate(tree_once, b.seconds, 1));
    if (with_numpy) {
      ref.push_back(numpy_rate(b, false, obs, act));
      ref_whole.push_back(numpy_rate(b, true, obs, act));
    }
  }
  const auto base = [&](const char* buffer) {
    return std::vector<std::pair<std::string, bench::Value>>{
        {"buffer", buffer}, {"capacity", static_cast<long long>(*b.capacity)}, {"obs_dim", obs},
        {"act_dim", act}, {"rounds", *b.rounds}};
  };
  auto with = [](auto v, const char* k, bench::Value x) { v.emplace_back(k, x); return v; };
  bench::emit("buffer_add", median(add_u) * b.add_batch, "transitions/s", with(base("uniform"), "add_batch", *b.add_batch));
  bench::emit("buffer_add", median(add_p) * b.add_batch, "transitions/s", with(base("prioritized"), "add_batch", *b.add_batch));
  bench::emit("buffer_sample", median(su_u) * b.batch, "transitions/s", with(base("uniform"), "batch", *b.batch));
  bench::emit("buffer_sample_update", median(su_p) * b.batch, "transitions/s", with(base("prioritized"), "batch", *b.batch));
  bench::emit("buffer_sample_update_batches", median(su_p), "batches/s", with(base("prioritized"), "batch", *b.batch));
  bench::emit("sum_tree_sample_update_batches", median(tr), "batches/s", with(base("sum_tree"), "batch", *b.batch));
  if (with_numpy && median(ref) > 0) {
    bench::emit("numpy_sum_tree_sample_update_batches", median(ref), "batches/s", with(base("numpy"), "batch", *b.batch));
    bench::emit("numpy_prioritized_buffer_sample_update_batches", median(ref_whole), "batches/s",
                with(base("numpy"), "batch", *b.batch));
    // like for like: the tree against the numpy tree
    bench::emit("sum_tree_speedup_vs_numpy", bench::median_ratio(tr, ref), "x", with(base("sum_tree"), "batch", *b.batch));
    // the whole buffer call (also gathers the transitions and computes importance weights)
    // against the numpy reference doing the same (--whole)
    bench::emit("prioritized_buffer_speedup_vs_numpy", bench::median_ratio(su_p, ref_whole), "x",
                with(base("prioritized"), "batch", *b.batch));
  }
}
