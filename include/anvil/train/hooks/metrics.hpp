#pragma once
/// @file
/// `MetricsLog`: what a run writes about itself in its run directory, on rank 0:
/// `metrics.csv` (one row per log interval), TensorBoard event files, `training.log` (the
/// resolved config, every row, the timing split with its verdict, GPU use, messages) and,
/// at the end, `summary.json`. A row takes the means of the metrics accumulated since the
/// last row and the training episodes' returns over every rank (every rank takes part in
/// a row; rank 0 writes it). Not a template.

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/data/episode_stats.hpp>
#include <anvil/observe/gpu_monitor.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/observe/tensorboard.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/observe/update_metrics.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/hooks/evaluation.hpp>
#include <anvil/train/hooks/results.hpp>

namespace anvil {

/// One row of metrics, as rank 0 writes it.
struct LogRow {
  std::vector<std::pair<std::string, double>> values;  ///< the CSV columns, in order
  std::int64_t step = 0;                                ///< TensorBoard's step
  double wall = 0;                                      ///< seconds since the run began
  double updates_per_s = 0;
  bool complete = false;  ///< the row has every metric the algorithm reports (it has updated)
  std::vector<EpisodeStats::Episode> episodes;  ///< rank 0's training episodes since the last row
};

/// The run's files (see file comment).
class MetricsLog {
 public:
  /// Where a row's numbers come from (all owned by the Trainer, which outlives the log).
  struct Sources {
    Clock* clock = nullptr;
    EpisodeStats* episodes = nullptr;
    UpdateMetrics* metrics = nullptr;
    const Evaluation* evaluation = nullptr;
    PhaseTimes* times = nullptr;
    Ranks* ranks = nullptr;
    /// The algorithm's learning rates by optimizer (TensorBoard `lr/<name>`); may be empty.
    std::function<std::vector<std::pair<std::string, double>>()> learning_rates;
    /// Each network's weights, flat (TensorBoard histograms); may be empty.
    std::function<std::vector<std::pair<std::string, at::Tensor>>()> weights;
  };
  struct Options {
    std::filesystem::path dir;  ///< the run directory
    std::string algorithm;      ///< TensorBoard's prefix for the algorithm's metrics ("sac")
    bool tensorboard = true;
    bool histograms = false;
    ClockUnit record_unit = ClockUnit::env_steps;  ///< TensorBoard's step
    BottleneckAdvice advice;
  };

  MetricsLog() = default;
  /// A log of the run whose numbers come from `src`. Rank 0 opens its files in `dir`:
  /// metrics.csv, training.log (appended to, `header` first) and, when asked, TensorBoard
  /// events; other ranks open nothing.
  [[gnu::cold, gnu::noinline]] MetricsLog(Options o, Sources src, const std::string& header) : opt_(std::move(o)), src_(std::move(src)) {
    if (!src_.ranks->is_main()) return;
    csv_ = MetricsCsv(opt_.dir / "metrics.csv");
    log_.open(opt_.dir / "training.log", std::ios::app);
    if (!log_) throw Error("run.run_dir: cannot write '" + (opt_.dir / "training.log").string() + "'");
    log_ << header;
    log_.flush();
    if (opt_.tensorboard) tb_ = TensorBoardWriter(opt_.dir);
    gpu_ = std::make_unique<GpuMonitor>();
  }

  /// Continues the metrics.csv of a resumed run from the clock it resumed at (rows the
  /// interrupted run wrote later are dropped: the resumed run writes them again).
  /// Returns whether metrics.csv already has the row of this step (a run resumed from its
  /// last checkpoint, written after that row): the run then does not write it again.
  [[gnu::cold, gnu::noinline]] bool resume(const Clock& at) {
    if (!src_.ranks->is_main()) return false;
    csv_ = MetricsCsv::resume(opt_.dir / "metrics.csv", at.env_steps, at.updates);
    return csv_.last_kept() == std::pair{at.env_steps, at.updates};
  }

  /// Gathers a row: the metrics' means since the last row and the recent returns, over
  /// every rank; folds the ranks' finished episodes into the clock. Every rank must call
  /// it; rank 0 gets the row, the others nothing.
  [[gnu::cold, gnu::noinline]] std::optional<LogRow> gather(double wall, std::int64_t first_step, std::int64_t first_update) {
    auto& ranks = *src_.ranks;
    auto& metrics = *src_.metrics;
    if (ranks.world_size() > 1) {
      // Every rank reduces the same list: rank 0 may know more names (it resumed with some).
      auto names = metrics.names();
      ranks.broadcast(names);
      metrics.know(names);
    }
    const auto [k, recent_sum] = src_.episodes->last(10);
    auto fresh = src_.episodes->take_fresh();
    std::vector<double> sums{static_cast<double>(src_.episodes->take_unfolded()), static_cast<double>(k), recent_sum};
    for (const auto& [name, m] : metrics.sums()) {
      sums.push_back(m.first);
      sums.push_back(m.second);
    }
    metrics.clear_values();
    ranks.sum(sums);
    auto& clock = *src_.clock;
    clock.episodes += static_cast<std::int64_t>(sums[0]);
    if (!ranks.is_main()) return std::nullopt;
    LogRow row;
    row.wall = wall;
    row.step = clock.in(opt_.record_unit);
    row.updates_per_s = wall > 0 ? static_cast<double>(clock.updates - first_update) / wall : 0.0;
    row.values = {{"env_steps", static_cast<double>(clock.env_steps)},
                  {"updates", static_cast<double>(clock.updates)},
                  {"wall_s", wall},
                  {"env_steps_per_s", wall > 0 ? static_cast<double>(clock.env_steps - first_step) / wall : 0.0},
                  {"episodes", static_cast<double>(clock.episodes)},
                  {"recent_return", sums[1] > 0 ? sums[2] / sums[1] : NAN},
                  {"eval_return", src_.evaluation->last().mean}};
    add_task_columns(row.values, src_.evaluation->last());
    std::size_t i = 3;
    for (const auto& [name, m] : metrics.sums()) {
      row.values.emplace_back(name, sums[i + 1] > 0 ? sums[i] / sums[i + 1] : NAN);
      i += 2;
    }
    row.complete = clock.updates > 0;
    row.episodes = std::move(fresh);
    return row;
  }

  /// The evaluation's success rate and each task's return and success rate, as columns
  /// (NaN until the first evaluation): `eval_success`, `eval_return/<task>`,
  /// `eval_success/<task>`. Only what the env has: no columns for an env without tasks
  /// that does not say when it succeeds.
  void add_task_columns(std::vector<std::pair<std::string, double>>& v, const EvalResult& last) const {
    const bool success = src_.evaluation->reports_success();
    if (success) v.emplace_back("eval_success", last.success);
    const auto& tasks = src_.evaluation->tasks();
    for (std::size_t g = 0; g < tasks.size(); ++g) {
      const bool have = g < last.groups.size();
      v.emplace_back("eval_return/" + tasks[g], have ? last.groups[g].mean : NAN);
      if (success) v.emplace_back("eval_success/" + tasks[g], have ? last.groups[g].success : NAN);
    }
  }

  /// What the timing verdicts of later rows suggest (a Staged run's next stage has its own).
  void set_advice(BottleneckAdvice a) { opt_.advice = std::move(a); }

  /// Writes `row` to metrics.csv (rank 0).
  [[gnu::cold, gnu::noinline]] void write_csv(const LogRow& row) { csv_.row(row.values, row.complete); }

  /// Puts the latest evaluation into the row of the step `clock` is at, which metrics.csv
  /// already has (a run resumed where its row was written, evaluated as it ends): the file
  /// keeps one row per logged step (rank 0).
  [[gnu::cold, gnu::noinline]] void amend_evaluation(const Clock& clock) {
    if (!src_.ranks->is_main()) return;
    std::vector<std::pair<std::string, double>> v{{"env_steps", static_cast<double>(clock.env_steps)},
                                                  {"updates", static_cast<double>(clock.updates)},
                                                  {"eval_return", src_.evaluation->last().mean}};
    add_task_columns(v, src_.evaluation->last());
    csv_.row(v, true);
  }

  /// Writes `row` to TensorBoard and training.log, with the timing split since the last
  /// row and the GPUs' use; `echo` gets the lines a console shows under the row (may be
  /// empty). Rank 0.
  [[gnu::cold, gnu::noinline]] void write_rest(const LogRow& row, const std::function<void(const std::string&)>& echo = {}) {
    const std::int64_t step = row.step;
    for (const auto& [k, v] : row.values) {
      // evaluations go to TensorBoard when they happen (write_evaluation)
      if (k == "env_steps" || k == "wall_s" || k.rfind("eval_", 0) == 0 || std::isnan(v)) continue;
      const std::string tag = k == "recent_return"     ? "return/recent"
                              : k == "eval_return"     ? "return/eval"
                              : k == "env_steps_per_s" ? "speed/env_steps_per_s"
                              : k == "updates" || k == "episodes" ? "progress/" + k
                                                                  : opt_.algorithm + "/" + k;
      tb_.scalar(tag, v, step);
    }
    if (row.wall > 0) tb_.scalar("speed/updates_per_s", row.updates_per_s, step);
    for (const auto& e : row.episodes) {  // each training episode at the env step it ended
      tb_.scalar("episode/return", e.episode_return, e.env_step);
      tb_.scalar("episode/length", static_cast<double>(e.length), e.env_step);
    }
    if (src_.learning_rates)
      for (const auto& [name, lr] : src_.learning_rates()) tb_.scalar("lr/" + name, lr, step);
    if (src_.weights && opt_.histograms && tb_.is_open())
      for (const auto& [name, w] : src_.weights()) {
        const at::Tensor c = w.detach().to(at::kCPU, at::kFloat).contiguous();
        const auto* data = static_cast<const float*>(c.data_ptr());
        tb_.histogram("weights/" + name, std::span<const float>(data, static_cast<std::size_t>(c.numel())), step);
      }
    std::string line = "step " + std::to_string(step) + ":";
    for (const auto& [k, v] : row.values) {
      char b[64];
      std::snprintf(b, sizeof b, " %s=%.6g", k.c_str(), v);
      line += b;
    }
    log_ << line << "\n";
    std::vector<std::string> extra;
    auto& times = *src_.times;
    if (times.enabled) {
      const auto d = times.since(last_row_times_);
      last_row_times_ = times;
      for (std::size_t p = 0; p < kPhaseNames.size(); ++p)
        tb_.scalar("time/" + std::string(kPhaseNames[p]), d.share(static_cast<Phase>(p)), step);
      if (d.total_seconds() > 0) extra.push_back("time: " + shares_line(d) + "\n  " + bottleneck(d, opt_.advice));
    }
    if (gpu_ && gpu_->available()) {
      const auto g = gpu_->sample();
      for (const auto& s : g) {
        const std::string p = "gpu" + std::to_string(s.index) + "/";
        tb_.scalar(p + "utilization_pct", s.utilization, step);
        tb_.scalar(p + "memory_used_gb", s.memory_used_gb, step);
        tb_.scalar(p + "memory_total_gb", s.memory_total_gb, step);
        tb_.scalar(p + "power_w", s.power_w, step);
      }
      extra.push_back(GpuMonitor::describe(g));
      gpu_line_.clear();
      for (const auto& x : g)
        gpu_line_ += (gpu_line_.empty() ? "" : " ") + ("gpu" + std::to_string(x.index) + " " +
                                                       std::to_string(static_cast<int>(x.utilization)) + "%");
    }
    for (const auto& e : extra) {
      log_ << "  " << e << "\n";
      if (echo) echo("  " + e);
    }
    log_.flush();
  }

  /// An evaluation, to TensorBoard at the step it ran (`step`, in the record unit): its
  /// mean, std, min and max return, its success rate (`success/eval`) and each task's return
  /// and success rate (`task/<name>/return`, `task/<name>/success`) (rank 0), and lines in
  /// training.log.
  [[gnu::cold, gnu::noinline]] void write_evaluation(const EvalResult& r, std::int64_t step) {
    if (!src_.ranks || !src_.ranks->is_main()) return;
    tb_.scalar("return/eval", r.mean, step);
    tb_.scalar("return/eval_std", r.std, step);
    tb_.scalar("return/eval_min", r.min, step);
    tb_.scalar("return/eval_max", r.max, step);
    if (!std::isnan(r.success)) tb_.scalar("success/eval", r.success, step);
    for (const auto& g : r.groups) {
      tb_.scalar("task/" + g.name + "/return", g.mean, step);
      if (!std::isnan(g.success)) tb_.scalar("task/" + g.name + "/success", g.success, step);
    }
    if (log_.is_open()) {
      char b[200];
      std::snprintf(b, sizeof b, "eval at step %lld: return %.6g (std %.6g, min %.6g, max %.6g, %d episodes)",
                    static_cast<long long>(step), r.mean, r.std, r.min, r.max, r.episodes);
      log_ << b;
      if (!std::isnan(r.success)) log_ << ", success " << r.success;
      log_ << "\n";
      for (const auto& g : r.groups) {
        std::snprintf(b, sizeof b, "  task %s: return %.6g, success %.3g (%d episodes)", g.name.c_str(), g.mean, g.success,
                      g.episodes);
        log_ << b << "\n";
      }
    }
  }

  /// A line in training.log (rank 0; nothing elsewhere).
  [[gnu::cold, gnu::noinline]] void note(const std::string& m) {
    if (!log_.is_open()) return;
    log_ << m << "\n";
    log_.flush();
  }

  /// Writes `summary.json` (rank 0): what the run achieved, where its time went, its config.
  [[gnu::cold, gnu::noinline]] void write_summary(const FitResult& r, std::int64_t first_step, std::int64_t first_update,
                                                   double timer_overhead, const std::string& config_hash,
                                                   const std::vector<std::pair<std::string, std::string>>& config,
                                                   const std::vector<std::pair<std::string, std::string>>& provenance = {}) const {
    if (!src_.ranks->is_main()) return;
    using json = nlohmann::ordered_json;
    auto number = [](double x) { return std::isfinite(x) ? json(x) : json(); };  // JSON has no NaN
    const double wall = r.wall_seconds;
    const auto& times = *src_.times;
    json j;
    j["final_eval_return"] = number(r.final_eval_return);
    j["best_eval_return"] = number(r.best_eval_return);
    if (src_.evaluation) {  // the last evaluation's success rate and each task's results
      const auto& last = src_.evaluation->last();
      if (src_.evaluation->reports_success()) j["final_eval_success"] = number(last.success);
      if (!last.groups.empty()) {
        json tasks = json::object();
        for (const auto& g : last.groups) {
          json e = json::object();
          e["return"] = number(g.mean);
          if (src_.evaluation->reports_success()) e["success"] = number(g.success);
          e["episodes"] = g.episodes;
          tasks[g.name] = e;
        }
        j["final_eval_tasks"] = tasks;
      }
    }
    j["env_steps"] = r.env_steps;
    j["updates"] = r.updates;
    j["wall_seconds"] = number(wall);
    j["env_steps_per_s"] = number(static_cast<double>(r.env_steps - first_step) / wall);
    j["updates_per_s"] = number(static_cast<double>(r.updates - first_update) / wall);
    json shares = json::object(), seconds = json::object();
    for (std::size_t i = 0; i < kPhaseNames.size(); ++i) {
      const std::string name(kPhaseNames[i]);
      shares[name] = number(times.share(static_cast<Phase>(i)));
      seconds[name] = number(times.seconds(static_cast<Phase>(i)));
    }
    j["phase_share"] = shares;
    j["phase_seconds"] = seconds;
    j["bottleneck"] = bottleneck(times, opt_.advice);
    j["timer_overhead"] = number(timer_overhead);
    j["status"] = r.stopped_by.empty() ? std::string("finished") : r.stopped_by;
    j["world_size"] = src_.ranks->world_size();
    j["config_hash"] = config_hash;
    json p = json::object();
    for (const auto& [k, v] : provenance) p[k] = v;
    j["provenance"] = p;
    json c = json::object();
    for (const auto& [k, v] : config) c[k] = typed_json(v);
    j["config"] = c;
    write_file_atomic(opt_.dir / "summary.json", j.dump(2) + "\n");
  }

  /// The resolved config and the run's provenance as a TensorBoard text summary (the Text
  /// tab), at `step` (rank 0).
  [[gnu::cold, gnu::noinline]] void write_config_text(const std::string& config_yaml,
                                                      const std::vector<std::pair<std::string, std::string>>& provenance,
                                                      std::int64_t step) {
    if (!src_.ranks || !src_.ranks->is_main()) return;
    std::string md = "| | |\n|---|---|\n";
    for (const auto& [k, v] : provenance) md += "| " + k + " | `" + v + "` |\n";
    tb_.text("run/provenance", md, step);
    tb_.text("run/config", "```yaml\n" + config_yaml + "```\n", step);
  }

  /// Writes the rows metrics.csv held back (the run ended before its algorithm reported
  /// every metric) and flushes TensorBoard and training.log.
  [[gnu::cold, gnu::noinline]] void flush() {
    csv_.flush_pending();
    tb_.flush();
    if (log_.is_open()) log_.flush();
  }

  /// The GPUs' use at the last row ("gpu0 97%"), for the progress bar; empty without GPUs.
  [[nodiscard]] const std::string& gpu_line() const noexcept { return gpu_line_; }
  /// What the GPU monitor found, once (rank 0; empty elsewhere).
  [[nodiscard]] std::string gpu_status() const { return gpu_ ? gpu_->status() : std::string(); }
  [[nodiscard]] const std::filesystem::path& dir() const noexcept { return opt_.dir; }

 private:
  Options opt_;
  Sources src_;
  MetricsCsv csv_;
  TensorBoardWriter tb_;
  std::ofstream log_;
  std::unique_ptr<GpuMonitor> gpu_;
  PhaseTimes last_row_times_;  ///< phase times at the last row
  std::string gpu_line_;       ///< GPU use for the progress bar
};

}  // namespace anvil
