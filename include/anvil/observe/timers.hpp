#pragma once
/// @file
/// Where the time goes: wall-clock totals for each phase of a trainer step, and what they
/// say about what bounds a run. Light header. A phase is timed with `ScopedPhase`: two clock
/// reads (about 50 ns), plus a device synchronisation before each when a sync function is
/// set (CUDA, where work is asynchronous and would otherwise be billed to whoever waits).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

/// The phases of a trainer step that are timed separately. `all_reduce` and `optimizer`
/// happen inside an update and are taken out of `update`, which keeps the forward and
/// backward passes (and the losses).
enum class Phase : std::size_t { env, act, buffer_add, sample, update, all_reduce, optimizer, eval, log, checkpoint, count };

/// Name of each phase as it appears in logs and summary.json.
inline constexpr std::array<std::string_view, static_cast<std::size_t>(Phase::count)> kPhaseNames{
    "env", "act", "buffer_add", "sample", "update", "all_reduce", "optimizer", "eval", "log", "checkpoint"};

/// Accumulated seconds per phase.
class PhaseTimes {
 public:
  using clock = std::chrono::steady_clock;
  void add(Phase p, clock::duration d) noexcept {
    total_[static_cast<std::size_t>(p)] += d;
    ++calls_;
  }
  /// Time spent in `inner` while `outer` was open: moved from `outer` to `inner`.
  void add_nested(Phase inner, Phase outer, clock::duration d) noexcept {
    total_[static_cast<std::size_t>(inner)] += d;
    total_[static_cast<std::size_t>(outer)] -= d;
    ++calls_;
  }
  [[nodiscard]] double seconds(Phase p) const noexcept {
    return std::chrono::duration<double>(total_[static_cast<std::size_t>(p)]).count();
  }
  [[nodiscard]] double total_seconds() const noexcept {
    double s = 0;
    for (std::size_t i = 0; i < total_.size(); ++i) s += seconds(static_cast<Phase>(i));
    return s;
  }
  /// Share of the timed total spent in `p` (0 when nothing was timed).
  [[nodiscard]] double share(Phase p) const noexcept {
    const double t = total_seconds();
    return t > 0 ? seconds(p) / t : 0.0;
  }
  /// Phases timed so far (for the timers' own cost: calls x cost of one).
  [[nodiscard]] std::int64_t calls() const noexcept { return calls_; }
  /// The times accumulated since `before` (a copy taken earlier).
  [[nodiscard]] PhaseTimes since(const PhaseTimes& before) const noexcept {
    PhaseTimes d;
    for (std::size_t i = 0; i < total_.size(); ++i) d.total_[i] = total_[i] - before.total_[i];
    d.calls_ = calls_ - before.calls_;
    return d;
  }

  /// Called before each clock read when set: a device synchronisation (CUDA).
  void (*sync)() = nullptr;
  /// Off: phases are not timed (ScopedPhase does nothing).
  bool enabled = true;

 private:
  std::array<clock::duration, static_cast<std::size_t>(Phase::count)> total_{};
  std::int64_t calls_ = 0;
};

/// Adds the time from construction to destruction to one phase (and, when `outer` is
/// given, takes it out of that enclosing phase).
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes& t, Phase p) noexcept : ScopedPhase(t, p, Phase::count) {}
  ScopedPhase(PhaseTimes& t, Phase p, Phase outer) noexcept : t_(t), p_(p), outer_(outer) {
    if (!t_.enabled) return;
    if (t_.sync) t_.sync();
    start_ = PhaseTimes::clock::now();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;
  ~ScopedPhase() {
    if (!t_.enabled) return;
    if (t_.sync) t_.sync();
    const auto d = PhaseTimes::clock::now() - start_;
    if (outer_ == Phase::count) t_.add(p_, d);
    else t_.add_nested(p_, outer_, d);
  }

 private:
  PhaseTimes& t_;
  Phase p_, outer_;
  PhaseTimes::clock::time_point start_{};
};

/// The cost of timing one phase without a sync (two clock reads and the bookkeeping),
/// measured on this machine, in seconds.
inline double phase_timer_cost() {
  PhaseTimes t;
  constexpr int kN = 20000;
  const auto t0 = PhaseTimes::clock::now();
  for (int i = 0; i < kN; ++i) ScopedPhase p(t, Phase::env);
  return std::chrono::duration<double>(PhaseTimes::clock::now() - t0).count() / kN;
}

/// What to change for each kind of bottleneck, in the run's own config keys: each loop
/// says it in its knobs and its algorithm's (train/loops/), and the run adds what pays on
/// its device. An empty entry names the bound alone. A test checks every key named here
/// against the config of each kind of Trainer.
struct BottleneckAdvice {
  std::string env, learn, comm, act, sample, store, side;
};

/// Whether advice to train in BF16 pays: on a CUDA device, for a run in FP32 or TF32. On the
/// CPU it is not given: BF16 measured 0.95x FP32's speed for the networks of the shipped
/// runs, and pays only for large products or convolutions on CPUs with bfloat16
/// instructions (benchmarks/RESULTS.md), which a user chooses knowingly.
[[nodiscard]] inline bool bf16_pays(std::string_view device, std::string_view precision) {
  return device.starts_with("cuda") && (precision == "fp32" || precision == "tf32");
}

/// What bounds a run, from its phase times: the largest share, named, with what to change.
/// Empty when nothing was timed.
inline std::string bottleneck(const PhaseTimes& t, const BottleneckAdvice& advice = {}) {
  const double total = t.total_seconds();
  if (total <= 0) return "";
  auto pct = [&](double share) {
    char b[16];
    std::snprintf(b, sizeof b, "%.0f%%", 100 * share);
    return std::string(b);
  };
  const double env = t.share(Phase::env), act = t.share(Phase::act), sample = t.share(Phase::sample);
  const double learn = t.share(Phase::update) + t.share(Phase::optimizer), comm = t.share(Phase::all_reduce);
  const double store = t.share(Phase::buffer_add), side = t.share(Phase::eval) + t.share(Phase::log) + t.share(Phase::checkpoint);
  struct Verdict {
    double share;
    std::string text;
  };
  const auto then = [](const std::string& what) { return what.empty() ? what : "; " + what; };
  const std::vector<Verdict> v{
      {env, "env-bound: " + pct(env) + " of the time stepping the envs" + then(advice.env)},
      {learn, "update-bound: " + pct(learn) + " of the time in updates (forward, backward, optimizer)" + then(advice.learn)},
      {comm, "communication-bound: " + pct(comm) + " of the time in the gradient all-reduce" + then(advice.comm)},
      {act, "action-bound: " + pct(act) + " of the time choosing actions" + then(advice.act)},
      {sample, "sampling-bound: " + pct(sample) + " of the time sampling the buffer" + then(advice.sample)},
      {store, "storage-bound: " + pct(store) + " of the time adding to the buffer" + then(advice.store)},
      {side, "bookkeeping-bound: " + pct(side) + " of the time in evaluation, logging and checkpoints" + then(advice.side)}};
  const Verdict* best = &v[0];
  for (const auto& x : v)
    if (x.share > best->share) best = &x;
  return best->text;
}

/// One line of shares: "env 41% | act 9% | ... ".
inline std::string shares_line(const PhaseTimes& t) {
  std::string s;
  for (std::size_t i = 0; i < kPhaseNames.size(); ++i) {
    char b[48];
    std::snprintf(b, sizeof b, "%s%.*s %.0f%%", s.empty() ? "" : " | ", static_cast<int>(kPhaseNames[i].size()),
                  kPhaseNames[i].data(), 100 * t.share(static_cast<Phase>(i)));
    s += b;
  }
  return s;
}

}  // namespace anvil
