#pragma once
/// @file
/// `Evaluation`: how well the policy does, measured on envs of its own. Each evaluation
/// runs a number of whole episodes with deterministic actions on fresh envs seeded apart
/// from the training envs (a new seed each time), split over the ranks, and reports the
/// returns' mean, spread and range, broken down by task where the env has tasks
/// (`envs::TaskTagged`). It keeps the latest result and the best mean so far, which every
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

namespace anvil {

/// Mean, spread and range of evaluation returns, and the mean of each task.
struct EvalResult {
  double mean = NAN, std = NAN, min = NAN, max = NAN;
  int episodes = 0;
  /// The returns of one task (or agent) of an env that has several.
  struct Group {
    std::string name;
    double mean = NAN;
    int episodes = 0;
  };
  std::vector<Group> groups;  ///< empty when the env has no tasks
};

/// Evaluations of a run (see file comment).
class Evaluation {
 public:
  /// Envs to evaluate on: `n` copies seeded from `seed`, each to run one episode.
  using MakeEnvs = std::function<std::unique_ptr<envs::VecEnvBase>(int n, std::uint64_t seed)>;
  /// Actions in the env's units for a batch of observations (deterministic).
  using Act = std::function<at::Tensor(const at::Tensor& obs)>;

  Evaluation() = default;
  /// Evaluates on envs from `make`, seeded from `seed` on (one seed per evaluation), with
  /// the episodes split over `ranks`; times itself as the eval phase when `times` is given.
  Evaluation(MakeEnvs make, std::uint64_t seed, Ranks ranks, PhaseTimes* times = nullptr)
      : make_(std::move(make)), seed_(seed), ranks_(std::move(ranks)), times_(times) {}

  /// Runs `episodes` episodes acting with `act`; every rank runs its share and sees every
  /// return. All ranks must call it together.
  [[gnu::noinline]] EvalResult run(const Act& act, int episodes) {
    std::optional<ScopedPhase> ph;
    if (times_) ph.emplace(*times_, Phase::eval);
    const int world = ranks_.world_size(), rank = ranks_.rank();
    const int mine = episodes / world + (rank < episodes % world ? 1 : 0);
    const int first = rank * (episodes / world) + std::min(rank, episodes % world);
    // Per episode: its return, and its task + 1 (0: none), summed over the ranks.
    std::vector<double> all(static_cast<std::size_t>(2 * episodes), 0.0);
    const std::uint64_t seed = seed_ + static_cast<std::uint64_t>(count_++);
    std::vector<std::string> names;
    if (mine > 0) {
      auto venv = make_(mine, seed);
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
            ++done;
          }
        obs = s.obs;
      }
    } else {
      names = make_(1, seed)->groups();
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
    for (std::size_t g = 0; g < names.size(); ++g) {
      EvalResult::Group group{names[g], 0.0, 0};
      for (int i = 0; i < episodes; ++i)
        if (static_cast<std::size_t>(all[static_cast<std::size_t>(episodes + i)]) == g + 1) {
          group.mean += all[static_cast<std::size_t>(i)];
          ++group.episodes;
        }
      group.mean = group.episodes > 0 ? group.mean / group.episodes : NAN;
      r.groups.push_back(group);
    }
    return r;
  }
  [[gnu::cold, gnu::noinline]] static void write_result(BinaryWriter& w, const EvalResult& r) {
    for (double x : {r.mean, r.std, r.min, r.max}) w.value(x);
    w.value(r.episodes);
    w.value(static_cast<std::uint64_t>(r.groups.size()));
    for (const auto& g : r.groups) {
      w.string(g.name);
      w.value(g.mean);
      w.value(g.episodes);
    }
  }
  [[gnu::cold, gnu::noinline]] static EvalResult read_result(BinaryReader& r) {
    EvalResult e;
    for (double* x : {&e.mean, &e.std, &e.min, &e.max}) *x = r.value<double>("evaluation results");
    e.episodes = r.value<int>("evaluation episodes");
    const auto n = r.value<std::uint64_t>("evaluation groups");
    if (n > 100'000) r.fail("evaluation groups", "are implausibly many");
    for (std::uint64_t i = 0; i < n; ++i) {
      EvalResult::Group g;
      g.name = r.string("evaluation group name");
      g.mean = r.value<double>("evaluation group return");
      g.episodes = r.value<int>("evaluation group episodes");
      e.groups.push_back(g);
    }
    return e;
  }

  MakeEnvs make_;
  std::uint64_t seed_ = 0;
  Ranks ranks_;
  PhaseTimes* times_ = nullptr;
  std::int64_t count_ = 0;
  std::int64_t at_ = -1;
  double best_ = NAN;
  EvalResult last_;
};

}  // namespace anvil
