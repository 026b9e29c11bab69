#pragma once
/// @file
/// `Evaluation`: how well the policy does, measured on envs of its own. Each evaluation
/// runs a number of whole episodes with deterministic actions on fresh envs seeded apart
/// from the training envs (a new seed each time), split over the ranks, and reports the
/// returns' mean, spread and range and, for envs that say when they succeed
/// (`envs::ReportsSuccess`), the share of episodes that succeeded; where the env has tasks
/// (`envs::TaskTagged`) it runs the number of episodes asked for each task and breaks
/// both down by task. It keeps the latest result and the best mean so far, which every
/// rank holds alike. Not a template: it acts through a function it is given.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/train/hooks/results.hpp>

namespace anvil {

/// Evaluations of a run (see file comment).
class Evaluation {
 public:
  /// Envs to evaluate on: `n` copies seeded from `seed`, each to run one episode; `first`
  /// is the index of the first among all `count` of this evaluation (over the ranks), for
  /// envs that place themselves by it (one task each in turn).
  using MakeEnvs = std::function<std::unique_ptr<envs::VecEnvBase>(int n, std::uint64_t seed, int first, int count)>;
  /// Actions in the env's units for a batch of observations (deterministic).
  using Act = std::function<at::Tensor(const at::Tensor& obs)>;

  Evaluation() = default;
  /// Evaluates on envs from `make`, seeded from `seed` on (one seed per evaluation), with
  /// the episodes split over `ranks`; times itself as the eval phase when `times` is given.
  /// `tasks`: the env's tasks (`VecEnvBase::groups()`), each of which gets the episodes asked.
  /// `reports_success`: whether the env says when an episode succeeds (`envs::ReportsSuccess`).
  Evaluation(MakeEnvs make, std::uint64_t seed, Ranks ranks, PhaseTimes* times = nullptr,
             std::vector<std::string> tasks = {}, bool reports_success = false)
      : make_(std::move(make)), seed_(seed), ranks_(std::move(ranks)), times_(times), tasks_(std::move(tasks)),
        success_(reports_success) {}

  /// The tasks each evaluation covers (empty: the env has none).
  [[nodiscard]] const std::vector<std::string>& tasks() const noexcept { return tasks_; }
  /// Whether results have success rates.
  [[nodiscard]] bool reports_success() const noexcept { return success_; }

  /// Runs `episodes` episodes (of each task, when the env has tasks) acting with `act`;
  /// every rank runs its share and sees every return. All ranks must call it together.
  [[gnu::noinline]] EvalResult run(const Act& act, int per_task) {
    std::optional<ScopedPhase> ph;
    if (times_) ph.emplace(*times_, Phase::eval);
    const int episodes = per_task * std::max<int>(1, static_cast<int>(tasks_.size()));
    const int world = ranks_.world_size(), rank = ranks_.rank();
    const int mine = episodes / world + (rank < episodes % world ? 1 : 0);
    const int first = rank * (episodes / world) + std::min(rank, episodes % world);
    // Per episode: its return, its task + 1 (0: none) and its success + 2 (1: unknown),
    // summed over the ranks.
    std::vector<double> all(static_cast<std::size_t>(3 * episodes), 0.0);
    const std::uint64_t seed = seed_ + static_cast<std::uint64_t>(count_++);
    std::vector<std::string> names;
    if (mine > 0) {
      auto venv = make_(mine, seed, first, episodes);
      names = venv->groups();
      auto obs = venv->reset();
      std::vector<bool> ended(static_cast<std::size_t>(mine), false);
      int done = 0;
      while (done < mine) {
        const auto& s = venv->step(act(obs));
        for (const auto& e : s.ended)
          if (!ended[static_cast<std::size_t>(e.env)]) {
            ended[static_cast<std::size_t>(e.env)] = true;
            all[static_cast<std::size_t>(first + e.env)] = e.episode_return;
            all[static_cast<std::size_t>(episodes + first + e.env)] = e.group + 1;
            all[static_cast<std::size_t>(2 * episodes + first + e.env)] = e.success + 2;
            ++done;
          }
        obs = s.obs;
      }
    } else {
      names = tasks_;
    }
    ranks_.sum(all);
    return summarise(all, episodes, names);
  }

  /// Makes `r` the latest result, taken at clock value `at`.
  void record(const EvalResult& r, std::int64_t at) {
    last_ = r;
    at_ = at;
    if (std::isnan(best_) || r.mean > best_) best_ = r.mean;
  }

  [[nodiscard]] const EvalResult& last() const noexcept { return last_; }
  /// The best mean return so far (NaN before the first evaluation).
  [[nodiscard]] double best() const noexcept { return best_; }
  /// The clock value of the latest evaluation (-1: none yet).
  [[nodiscard]] std::int64_t last_at() const noexcept { return at_; }
  /// Evaluations run so far (each took the next seed).
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

  /// State protocol: the results and how many evaluations ran (the same on every rank).
  void save(BinaryWriter& w) const {
    w.value(count_);
    w.value(at_);
    w.value(best_);
    write_result(w, last_);
  }
  struct Saved {
    std::int64_t count = 0, at = -1;
    double best = NAN;
    EvalResult last;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.count = r.value<std::int64_t>("evaluations run");
    s.at = r.value<std::int64_t>("step of the last evaluation");
    s.best = r.value<double>("best evaluation return");
    if (s.count < 0) r.fail("evaluations run", "is negative");
    s.last = read_result(r);
    return s;
  }
  void restore(const Saved& s) {
    count_ = s.count;
    at_ = s.at;
    best_ = s.best;
    last_ = s.last;
  }

 private:
  [[gnu::cold, gnu::noinline]] static EvalResult summarise(const std::vector<double>& all, int episodes, const std::vector<std::string>& names) {
    EvalResult r;
    r.episodes = episodes;
    const auto b = all.begin(), e = all.begin() + episodes;
    r.mean = std::accumulate(b, e, 0.0) / episodes;
    double var = 0;
    for (auto it = b; it != e; ++it) var += (*it - r.mean) * (*it - r.mean);
    r.std = std::sqrt(var / episodes);
    r.min = *std::min_element(b, e);
    r.max = *std::max_element(b, e);
    // success + 2 per episode: 1 unknown, 2 failed, 3 succeeded
    auto success_of = [&](int i) { return all[static_cast<std::size_t>(2 * episodes + i)] - 2; };
    auto rate = [&](auto&& in) {
      int known = 0, won = 0;
      for (int i = 0; i < episodes; ++i)
        if (in(i) && success_of(i) >= 0) ++known, won += success_of(i) > 0.5 ? 1 : 0;
      return known > 0 ? static_cast<double>(won) / known : NAN;
    };
    r.success = rate([](int) { return true; });
    for (std::size_t g = 0; g < names.size(); ++g) {
      auto mine = [&](int i) { return static_cast<std::size_t>(all[static_cast<std::size_t>(episodes + i)]) == g + 1; };
      EvalResult::Group group{names[g], 0.0, 0, rate(mine)};
      for (int i = 0; i < episodes; ++i)
        if (mine(i)) {
          group.mean += all[static_cast<std::size_t>(i)];
          ++group.episodes;
        }
      group.mean = group.episodes > 0 ? group.mean / group.episodes : NAN;
      r.groups.push_back(group);
    }
    return r;
  }
  [[gnu::cold, gnu::noinline]] static void write_result(BinaryWriter& w, const EvalResult& r) {
    for (double x : {r.mean, r.std, r.min, r.max, r.success}) w.value(x);
    w.value(r.episodes);
    w.value(static_cast<std::uint64_t>(r.groups.size()));
    for (const auto& g : r.groups) {
      w.string(g.name);
      w.value(g.mean);
      w.value(g.episodes);
      w.value(g.success);
    }
  }
  [[gnu::cold, gnu::noinline]] static EvalResult read_result(BinaryReader& r) {
    EvalResult e;
    for (double* x : {&e.mean, &e.std, &e.min, &e.max, &e.success}) *x = r.value<double>("evaluation results");
    e.episodes = r.value<int>("evaluation episodes");
    const auto n = r.value<std::uint64_t>("evaluation groups");
    if (n > 100'000) r.fail("evaluation groups", "are implausibly many");
    for (std::uint64_t i = 0; i < n; ++i) {
      EvalResult::Group g;
      g.name = r.string("evaluation group name");
      g.mean = r.value<double>("evaluation group return");
      g.episodes = r.value<int>("evaluation group episodes");
      g.success = r.value<double>("evaluation group success");
      e.groups.push_back(g);
    }
    return e;
  }

  MakeEnvs make_;
  std::uint64_t seed_ = 0;
  Ranks ranks_;
  PhaseTimes* times_ = nullptr;
  std::vector<std::string> tasks_;
  bool success_ = false;
  std::int64_t count_ = 0;
  std::int64_t at_ = -1;
  double best_ = NAN;
  EvalResult last_;
};

}  // namespace anvil
