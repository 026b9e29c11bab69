#pragma once
/// @file
/// `Run`: the life of a training run that does not depend on its policy types, compiled
/// once whatever the Trainer: the run directory, the loop's iterations and the hooks that
/// fire on its clock (evaluation, log rows, checkpoints, progress), resuming, giving every
/// rank rank 0's state and checking that the ranks agree, and the end of the run. The
/// Trainer (train/trainer.hpp) builds the parts and hands them to a Run; a custom main can
/// call the same steps through the Trainer (`begin`, `evaluate`, `log`, `finish`, ...).

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/detail/crc32c.hpp>
#include <anvil/core/detail/flush_registry.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/state.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/data/step_collector.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/observe/update_metrics.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/parallel/world.hpp>
#include <anvil/precision/detail/common.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/hooks/checkpoint.hpp>
#include <anvil/train/hooks/evaluation.hpp>
#include <anvil/train/hooks/metrics.hpp>
#include <anvil/train/hooks/progress.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/run_config.hpp>
#include <anvil/train/signals.hpp>

namespace anvil {

/// Whether `run.resume` restores a checkpoint (a path, or auto with one in run.run_dir): the
/// run's networks then come from it, and `init.weights` is not applied.
[[nodiscard]] inline bool resumes_a_checkpoint(const RunConfig& run) {
  if (run.resume->empty()) return false;
  if (*run.resume != "auto") return true;
  return !run.run_dir->empty() && !Checkpoints::latest(*run.run_dir).empty();
}

/// The life of a run (see file comment).
class Run {
 public:
  /// What the Trainer tells a run about itself.
  struct Setup {
    RunConfig run;                 ///< the `run` section
    std::string program;           ///< the program's name, for logs
    std::string algorithm;         ///< the algorithm's config section ("sac"): names, TensorBoard prefix
    std::string precision;         ///< "fp32", ...
    std::string env_name;
    std::int64_t num_envs = 1;     ///< envs of this rank
    std::string device;
    std::string config_hash, config_yaml;
    std::vector<std::pair<std::string, std::string>> config;  ///< every field, flattened
    std::vector<std::string> acting_keys;  ///< fields a resumed run may set anew (`FieldRole::acting`)
    std::vector<std::string> notes;  ///< said once when the run starts
    /// Where the run comes from (observe/provenance.hpp): env, policy types, versions,
    /// command line, host, git commit. In config.yaml, summary.json and TensorBoard.
    std::vector<std::pair<std::string, std::string>> provenance;
  };
  /// The parts the Trainer owns and the run uses; they outlive it.
  struct Parts {
    Clock* clock = nullptr;
    Ranks* ranks = nullptr;
    PhaseTimes* times = nullptr;
    StepCollector* collector = nullptr;
    UpdateMetrics* metrics = nullptr;
    const StateSections* state = nullptr;         ///< the run's state (checkpoints, rank sync)
    const StateSections* buffer_state = nullptr;  ///< the buffer's (its file beside a checkpoint)
    LoopControl* loop = nullptr;
    Evaluation* evaluation = nullptr;
    /// Runs an evaluation of `n` episodes with the policy (its average when one is kept).
    std::function<EvalResult(int n)> evaluate;
    /// Writes the policy files into a directory (policy.safetensors, and policy.bin where the
    /// algorithm has one); empty when the algorithm has no policy file.
    std::function<void(const std::filesystem::path&)> export_policy;
    MetricsLog::Sources log_sources;  ///< filled in by the run but for the algorithm's functions
  };

  /// The format tag of the state rank 0 sends the others.
  static constexpr const char* kRankStateFormat = "anvil Rank State v2";

  Run(Setup s, Parts p) : s_(std::move(s)), p_(std::move(p)) {
    checkpoints_ = Checkpoints(Checkpoints::Options{s_.run.run_dir.value, s_.run.keep_last, s_.run.checkpoint_buffer},
                               Checkpoints::Identity{s_.algorithm, s_.precision, s_.config_hash, s_.config, s_.acting_keys},
                               *p_.state, *p_.buffer_state);
    if (!s_.run.run_dir->empty()) run_dir_ = *s_.run.run_dir;
    restart_schedules();
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Trains until the loop is done: iterations, with evaluations, log rows and checkpoints
  /// on the clock; then `finish`. A SIGINT or SIGTERM stops it after the iteration under
  /// way with a checkpoint, and it throws `Interrupted`; SIGUSR1 writes a checkpoint
  /// (train/signals.hpp). The last iteration's evaluation and row are `finish`'s, so a run
  /// writes one row per logged step.
  FitResult fit() {
    if (!s_.run.export_dir->empty()) return export_checkpoint_policy();
    begin();
    auto& loop = *p_.loop;
    while (!loop.done()) {
      loop.iterate(quiet_until());
      if (loop.stage() != stage_) next_stage();
      const auto now = p_.clock->now();
      const bool last = loop.done();
      if (eval_every_.due(now) && !last) record_evaluation(evaluate(settings_.eval_episodes));
      if (log_every_.due(now) && !last) log();
      if (checkpoint_every_.due(now) && !last) checkpoint();
      if (const auto sig = signalled(); sig.any()) [[unlikely]] {
        if (sig.stop) stop(sig.stop);
        if (!last) checkpoint();
      }
      show_progress();
    }
    return finish();
  }

  /// Opens the run directory (config.yaml, training.log, metrics.csv, TensorBoard events),
  /// resumes when `run.resume` asks, and gives every rank rank 0's state.
  [[gnu::cold, gnu::noinline]] void begin() {
    handlers_.install();
    open_run_dir();
    resume_if_asked();
    sync_from_main();  // a resumed rank 0 hands its state to the others
    if (p_.ranks->world_size() > 1) {  // and whether its last row is written (log rows are collective)
      std::vector<double> v{p_.ranks->is_main() ? static_cast<double>(log_at_) : 0.0,
                            p_.ranks->is_main() ? static_cast<double>(logged_eval_at_) : 0.0};
      p_.ranks->sum(v);
      log_at_ = static_cast<std::int64_t>(v[0]);
      logged_eval_at_ = static_cast<std::int64_t>(v[1]);
    }
    first_step_ = p_.clock->env_steps;  // rates count what this process did
    first_update_ = p_.clock->updates;
    restart_schedules();
  }

  /// Ends the run: a last evaluation (unless one was recorded at this step), a last log row,
  /// a checkpoint, the timing verdict and summary.json.
  [[gnu::cold, gnu::noinline]] FitResult finish() {
    const auto now = p_.clock->now();
    // The time split and its verdict are about training: taken before the last evaluation,
    // and only when this process trained (not for a finished run resumed).
    const bool trained = p_.clock->env_steps > first_step_ || p_.clock->updates > first_update_;
    std::vector<std::string> lines;
    if (trained && p_.times->enabled) {
      lines.push_back("time: " + shares_line(*p_.times));
      if (auto v = bottleneck(*p_.times, advice()); !v.empty()) lines.push_back(std::move(v));
    }
    if (p_.evaluation->last_at() != now) record_evaluation(evaluate(settings_.eval_episodes));
    const FitResult r = close({}, lines);
    say(summary_line(r));
    say("logs: " + run_dir_.string() + " (training.log, metrics.csv, TensorBoard events, summary.json, config.yaml)");
    return r;
  }

  /// What the timing verdict suggests now (observe/timers.hpp): the loop's advice in this
  /// run's config keys, and, on a GPU where the run is in FP32 or TF32, BF16 precision
  /// (it pays there; on the CPU it measured 0.95x FP32's speed for these networks).
  [[nodiscard]] BottleneckAdvice advice() const {
    AdviceKeys keys;
    for (const auto& [key, value] : s_.config)
      if (key.starts_with(s_.algorithm + ".")) keys.algorithm.push_back(key);
    auto a = p_.loop->advice(keys);
    if (bf16_pays(s_.device, s_.precision))
      a.learn = loops::either(a.learn, "; ", "on a GPU, BF16 precision (Trainer<..., BF16>) speeds updates too");
    return a;
  }

  /// An evaluation of `episodes` episodes (all ranks together), not yet recorded.
  EvalResult evaluate(int episodes) { return p_.evaluate(episodes); }
  /// Makes `r` the latest evaluation (in the next log row, summary.json and the best so far).
  void record_evaluation(const EvalResult& r) {
    p_.evaluation->record(r, p_.clock->now());
    log_.write_evaluation(r, p_.clock->in(settings_.record_unit));
  }

  /// A row of metrics now (every rank must call it).
  [[gnu::cold, gnu::noinline]] void log() {
    ScopedPhase ph(*p_.times, Phase::log);
    p_.loop->at_log_row();
    log_at_ = p_.clock->now();
    logged_eval_at_ = p_.evaluation->last_at();
    auto row = log_.gather(elapsed(), first_step_, first_update_);
    if (!row) return;
    log_.write_csv(*row);
    progress_.row(progress_state());
    log_.write_rest(*row, [this](const std::string& line) { progress_.echo(line); });
  }

  /// A checkpoint at the current step (rank 0 writes it, after the ranks are found in sync),
  /// with the policy files beside it (policy.safetensors, policy.bin); the oldest beyond `run.keep_last` go.
  [[gnu::cold, gnu::noinline]] void checkpoint() {
    check_in_sync();
    if (!p_.ranks->is_main()) return;
    ScopedPhase ph(*p_.times, Phase::checkpoint);
    try {
      checkpoints_.save_at(p_.clock->now());
      if (p_.export_policy) p_.export_policy(run_dir_);
    } catch (...) {
      // Caught to unwind the writers here (an uncaught error ends the program without
      // unwinding): a failed write (a full disk) leaves no partial .tmp file behind.
      throw;
    }
  }

  /// Writes everything a resumed run needs to continue exactly as this one would (every
  /// section of the run's state; with `run.checkpoint_buffer` the buffer beside it).
  [[gnu::cold, gnu::noinline]] void save_checkpoint(const std::filesystem::path& file) { checkpoints_.save(file); }

  /// Restores what `save_checkpoint` wrote; the checkpoint must come from the same
  /// algorithm, networks, buffer, envs and precision (the error names the first field that
  /// differs). Everything is read and checked before anything changes.
  [[gnu::cold, gnu::noinline]] void load_checkpoint(const std::filesystem::path& file) {
    apply_checkpoint(checkpoints_.read(file), file);
  }

  /// Rank 0's shared state on every rank: at construction (ranks seed their networks apart)
  /// and after rank 0 resumed.
  [[gnu::cold, gnu::noinline]] void sync_from_main() {
    auto& ranks = *p_.ranks;
    if (ranks.world_size() == 1) return;
    std::vector<std::uint8_t> bytes;
    if (ranks.is_main()) {
      auto w = BinaryWriter::in_memory(kRankStateFormat);
      p_.state->write(w, Scope::shared);
      bytes = w.take_bytes();
    }
    ranks.broadcast(bytes);
    if (ranks.is_main()) return;
    BinaryReader r(bytes, "rank 0's state", kRankStateFormat);
    auto apply = p_.state->read(r, Scope::shared);
    r.finish();
    apply();
    p_.loop->resumed();
  }

  /// Checks that every rank holds bitwise the same learned state as rank 0 (they apply the
  /// same averaged gradients, so they must); a DistributedError naming the ranks that differ.
  [[gnu::cold, gnu::noinline]] void check_in_sync() {
    auto& ranks = *p_.ranks;
    const int world = ranks.world_size();
    if (world == 1) return;
    auto w = BinaryWriter::in_memory(kRankStateFormat);
    p_.state->write(w, Scope::checked);
    const auto bytes = w.take_bytes();
    detail::Crc32c crc;
    crc.update(bytes.data(), bytes.size());
    std::vector<at::Tensor> mine{at::full({1}, static_cast<std::int64_t>(crc.value()), at::kLong).to(ranks.device())};
    ranks.broadcast(mine);
    const auto main_crc = static_cast<std::uint32_t>(mine[0].item<std::int64_t>());
    std::vector<double> differs(static_cast<std::size_t>(world), 0.0);
    if (main_crc != crc.value()) differs[static_cast<std::size_t>(ranks.rank())] = 1.0;
    ranks.sum(differs);
    std::string bad;
    for (int r = 0; r < world; ++r)
      if (differs[static_cast<std::size_t>(r)] > 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    if (!bad.empty())
      throw DistributedError("rank " + std::to_string(ranks.rank()) + ": ranks out of sync at " +
                             std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now()) +
                             ": the learned state of rank(s) " + bad + " differs from rank 0's");
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", main_crc);
    sync_line_ = "ranks in sync: all " + std::to_string(world) +
                 " ranks hold bitwise-identical parameters and optimizer state (crc32c " + hex + ", " +
                 std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now()) + ")";
  }

  /// A message for the user: on the terminal and in training.log (rank 0).
  [[gnu::cold, gnu::noinline]] void say(const std::string& m) {
    if (!p_.ranks->is_main()) return;
    progress_.say(m);
    log_.note(m);
  }

  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_dir_; }
  [[nodiscard]] const std::filesystem::path& resumed_from() const noexcept { return resumed_from_; }
  /// The run's config hash (its fields and its policy types), as config.yaml and summary.json give it.
  [[nodiscard]] const std::string& config_hash() const noexcept { return s_.config_hash; }
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return s_.notes; }
  /// The phase timers' own share of the run so far (see `Trainer::timer_overhead`).
  [[nodiscard]] double timer_overhead() const {
    const double wall = elapsed();
    return wall > 0 ? timer_cost_ * static_cast<double>(p_.times->calls()) / wall : 0.0;
  }
  /// Seconds since the run began (`begin`).
  [[nodiscard]] double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  FitResult result(std::string stopped_by = {}) const {
    FitResult r;
    r.env_steps = p_.clock->env_steps;
    r.updates = p_.clock->updates;
    r.wall_seconds = elapsed();
    r.final_eval_return = p_.evaluation->last().mean;
    r.best_eval_return = p_.evaluation->best();
    r.stopped_by = std::move(stopped_by);
    return r;
  }

  // The signals every rank has agreed on (train/signals.hpp). One process reads its flags
  // after each iteration; ranks add theirs up every `poll_every_` iterations, which rank 0
  // sets to about 50 ms of iterations, so they all stop at the same step.
  struct Signalled {
    int stop = 0;             // SIGINT or SIGTERM
    bool checkpoint = false;  // SIGUSR1
    [[nodiscard]] bool any() const noexcept { return stop != 0 || checkpoint; }
  };
  Signalled signalled() {
    auto& ranks = *p_.ranks;
    if (ranks.world_size() == 1) return {signals::stop_requested(), signals::take_checkpoint_request()};
    if (++since_poll_ < poll_every_) return {};
    const int mine = signals::stop_requested();
    std::vector<double> v{mine == SIGINT ? 1.0 : 0.0, mine == SIGTERM ? 1.0 : 0.0,
                          signals::take_checkpoint_request() ? 1.0 : 0.0, 0.0};
    if (ranks.is_main()) {  // the next poll's distance: about 50 ms of iterations
      const double now = elapsed(), per = (now - polled_at_) / static_cast<double>(since_poll_);
      v[3] = per > 0 ? std::clamp(0.05 / per, 1.0, 10'000.0) : 1.0;
      polled_at_ = now;
    }
    since_poll_ = 0;
    ranks.sum(v);
    poll_every_ = std::max<std::int64_t>(1, static_cast<std::int64_t>(v[3]));
    return {v[1] > 0 ? SIGTERM : v[0] > 0 ? SIGINT : 0, v[2] > 0};
  }

  // Stops on `sig` after the iteration under way: the step in flight lands (async envs), a
  // log row, a checkpoint (with the buffer when run.checkpoint_buffer) and summary.json are
  // written, and `Interrupted` is thrown (exit 128 + sig). Every rank comes here at the
  // same step; rank 0 writes.
  [[gnu::cold, gnu::noinline, noreturn]] void stop(int sig) {
    if (p_.collector->in_flight()) p_.loop->iterate(p_.clock->now());  // lands it, launches none
    const auto name = signals::name(sig);
    const std::string at = std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now());
    say("stopping on " + name + " at " + at + ": writing a checkpoint (a second " + name + " exits at once)");
    close("stopped by " + name);
    throw Interrupted(sig, "by " + name + " at " + at + "; checkpoint written in " + run_dir_.string() +
                               " (continue with --run_dir=" + run_dir_.string() + " --resume=auto)");
  }

  // The one end of a run, finished or stopped (`stopped_by`, empty when finished): the row
  // of this step (never a second one: an evaluation made as the run ends goes into the row
  // already there), a checkpoint (with the ranks' in-sync check, said), `lines` said, the
  // files flushed, summary.json, and the run directory released.
  [[gnu::cold, gnu::noinline]] FitResult close(std::string stopped_by, const std::vector<std::string>& lines = {}) {
    const auto now = p_.clock->now();
    if (log_at_ != now) {
      log();
    } else if (logged_eval_at_ != p_.evaluation->last_at()) {
      log_.amend_evaluation(*p_.clock);
      logged_eval_at_ = p_.evaluation->last_at();
    }
    checkpoint();
    if (p_.ranks->world_size() > 1) say(sync_line_);  // what the checkpoint's in-sync check found
    for (const auto& l : lines) say(l);
    log_.flush();
    progress_.finish();
    handlers_.restore();
    const FitResult r = result(std::move(stopped_by));
    log_.write_summary(r, first_step_, first_update_, timer_overhead(), s_.config_hash, s_.config, s_.provenance);
    lock_ = RunDirLock();  // the run is over: another may use the directory (with --resume)
    return r;
  }

  // The clock value before which no hook fires (a loop leaves nothing in flight there).
  std::int64_t quiet_until() const {
    return std::min({eval_every_.next(), log_every_.next(), checkpoint_every_.next()});
  }

  // The hooks' schedules from where the clock stands, in the current stage's unit.
  [[gnu::cold, gnu::noinline]] void restart_schedules() {
    settings_ = p_.loop->settings();
    stage_ = p_.loop->stage();
    const auto now = p_.clock->now();
    eval_every_ = Every(settings_.eval_interval);
    log_every_ = Every(s_.run.log_interval);
    checkpoint_every_ = Every(s_.run.checkpoint_interval);
    for (auto* e : {&eval_every_, &log_every_, &checkpoint_every_}) e->start(now);
  }

  // A stage of a Staged loop has ended: an evaluation, a row and a checkpoint mark its end,
  // then the hooks follow the next stage's schedule and unit.
  [[gnu::cold, gnu::noinline]] void next_stage() {
    const auto ended = settings_;
    record_evaluation(evaluate(ended.eval_episodes));
    log();
    checkpoint();
    restart_schedules();
    log_.set_advice(advice());
    say("stage " + std::to_string(stage_) + " begins: " + std::to_string(settings_.steps) + " " +
        std::string(unit_name(settings_.unit)));
  }

  ProgressState progress_state() const {
    return ProgressState{p_.clock->in(settings_.unit) - settings_.origin,
                         settings_.steps,
                         p_.clock->updates,
                         elapsed(),
                         p_.collector->episodes().recent_mean(10),
                         p_.evaluation->last().mean,
                         log_.gpu_line()};
  }
  void show_progress() {
    if (p_.ranks->is_main()) progress_.iteration(progress_state());
  }

  // Rank 0 takes the run directory: a fresh one (runs/<algorithm>-<env>-seed<N>-<time>), or
  // run.run_dir, locked for the run's life (a second run there is refused) and refused when
  // it holds a run and run.resume is not set. A checkpoint to resume from is read and
  // checked here, before a file of the directory is written: a refused resume changes
  // nothing. Then config.yaml, training.log, metrics.csv and TensorBoard's file.
  [[gnu::cold, gnu::noinline]] void open_run_dir() {
    start_ = std::chrono::steady_clock::now();
    const bool main = p_.ranks->is_main();
    if (main) {
      const std::string& resume = s_.run.resume;
      if (resume == "auto" && s_.run.run_dir->empty())
        throw ConfigError("run.resume=auto looks for the latest checkpoint in run.run_dir, which is not set");
      // A resumed run without run.run_dir continues in its checkpoint's directory.
      if (!s_.run.run_dir->empty() || !resume.empty()) {
        run_dir_ = !s_.run.run_dir->empty() ? std::filesystem::path(*s_.run.run_dir)
                                            : std::filesystem::absolute(resume).parent_path();
        std::error_code ec;
        std::filesystem::create_directories(run_dir_, ec);
        if (ec) throw Error("run.run_dir: cannot create '" + run_dir_.string() + "': " + ec.message());
      } else {
        run_dir_ = fresh_run_dir("runs", s_.algorithm + "-" + s_.env_name + "-seed" + std::to_string(*s_.run.seed));
      }
      lock_ = RunDirLock(run_dir_);
      checkpoints_.set_dir(run_dir_);
      if (resume.empty() && holds_a_run(run_dir_))
        throw ConfigError("run.run_dir: '" + run_dir_.string() +
                          "' already holds a run; use --resume=auto to continue it, or another directory");
      if (!resume.empty()) {
        resume_file_ = checkpoints_.resolve(resume);
        if (!resume_file_.empty()) resume_apply_ = checkpoints_.read(resume_file_);  // all checks, nothing changed
      }
      std::string header = "# " + s_.program + ", config hash " + s_.config_hash + "\n";
      for (const auto& [k, v] : s_.provenance) {  // a value's own line breaks (a `python -c` script) stay comments
        header += "# " + k + ": ";
        for (char c : v) header += c == '\n' ? std::string("\n#   ") : std::string(1, c);
        header += "\n";
      }
      write_file_atomic(run_dir_ / "config.yaml", header + s_.config_yaml);
    }
    // Every rank takes part in log rows; rank 0 writes them.
    auto sources = p_.log_sources;
    sources.clock = p_.clock;
    sources.episodes = &p_.collector->episodes();
    sources.metrics = p_.metrics;
    sources.evaluation = p_.evaluation;
    sources.times = p_.times;
    sources.ranks = p_.ranks;
    log_ = MetricsLog(MetricsLog::Options{run_dir_, s_.algorithm, s_.run.tensorboard, s_.run.tensorboard_histograms,
                                          settings_.record_unit, advice()},
                      std::move(sources),
                      "==== " + timestamp_for_path() + " " + s_.program + ", config hash " + s_.config_hash +
                          "\n# resolved config\n" + s_.config_yaml + "# end of config\n");
    if (!main) return;
    log_.write_config_text(s_.config_yaml, s_.provenance, p_.clock->in(settings_.record_unit));
    s_.notes.push_back(log_.gpu_status());  // once, whether it found GPUs or not
    timer_cost_ = phase_timer_cost();
    progress_ = ProgressHook(s_.run.progress);
    say(s_.program + ": " + s_.algorithm + " on " + s_.env_name + ", " + std::to_string(s_.num_envs) + " env(s), device " +
        s_.device + ", " + std::to_string(settings_.steps) + " " +
        (settings_.unit == ClockUnit::env_steps ? "steps" : "gradient updates") + ", config hash " + s_.config_hash);
    for (const auto& n : s_.notes) say(n);
  }

  // run.resume: a path, or auto (the latest checkpoint in the run directory, if any). Rank
  // 0 reads it; the others take its state in `sync_from_main`.
  [[gnu::cold, gnu::noinline]] void resume_if_asked() {
    const std::string& what = s_.run.resume;
    if (what.empty() || !p_.ranks->is_main()) return;
    const auto file = resume_file_;
    if (file.empty()) {
      say("resume: no checkpoint in " + run_dir_.string() + "; starting afresh");
      return;
    }
    apply_checkpoint(std::exchange(resume_apply_, {}), file);
    if (log_.resume(*p_.clock)) {  // its row is written: not again (one row per logged step)
      log_at_ = p_.clock->now();
      logged_eval_at_ = p_.evaluation->last_at();
    }
    say("resumed from " + file.string() + " at " + std::string(step_name(p_.clock->unit)) + " " +
        std::to_string(p_.clock->now()));
  }

  // run.export: the policy files of the checkpoint run.resume names, written into the
  // directory run.export names; nothing is trained and the run directory is not opened.
  [[gnu::cold, gnu::noinline]] FitResult export_checkpoint_policy() {
    const std::string& resume = s_.run.resume;
    if (!p_.export_policy)
      throw ConfigError("run.export: " + s_.algorithm + " runs write no policy file, so there is nothing to export");
    if (resume.empty())
      throw ConfigError("run.export needs run.resume: the checkpoint whose policy to write (a checkpoint file, or "
                        "auto with run.run_dir for the latest in that run)");
    if (p_.ranks->world_size() > 1) throw ConfigError("run.export runs in one process, not in " +
                                                      std::to_string(p_.ranks->world_size()) + " ranks");
    if (resume == "auto" && s_.run.run_dir->empty())
      throw ConfigError("run.resume=auto looks for the latest checkpoint in run.run_dir, which is not set");
    const auto file = checkpoints_.resolve(resume);
    if (file.empty()) throw ConfigError("run.export: no checkpoint in " + std::string(*s_.run.run_dir) + " (run.resume=auto)");
    apply_checkpoint(checkpoints_.read(file), file);
    const std::filesystem::path dir = *s_.run.export_dir;
    p_.export_policy(dir);
    if (p_.ranks->is_main())
      std::printf("export: the policy of %s (%s %lld) written to %s\n", file.string().c_str(),
                  std::string(step_name(p_.clock->unit)).c_str(), static_cast<long long>(p_.clock->now()),
                  dir.string().c_str());
    FitResult r;
    r.env_steps = p_.clock->env_steps;
    r.updates = p_.clock->updates;
    r.stopped_by = "exported the policy of " + file.string();
    return r;
  }

  void apply_checkpoint(const StateSections::Apply& apply, const std::filesystem::path& file) {
    apply();
    p_.collector->restored();
    p_.loop->resumed();
    resumed_from_ = file;
  }

  [[gnu::cold, gnu::noinline]] std::string summary_line(const FitResult& r) const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "done: %lld env steps, %lld updates in %.1f s (%.0f steps/s); eval return ",
                  static_cast<long long>(r.env_steps), static_cast<long long>(r.updates), r.wall_seconds,
                  static_cast<double>(r.env_steps - first_step_) / r.wall_seconds);
    return buf + metric_text(r.final_eval_return) + " (best " + metric_text(r.best_eval_return) + ")";
  }

  Setup s_;
  Parts p_;
  LoopSettings settings_;
  int stage_ = 0;
  Every eval_every_, log_every_, checkpoint_every_;
  Checkpoints checkpoints_;
  MetricsLog log_;
  ProgressHook progress_;
  std::filesystem::path run_dir_, resumed_from_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::int64_t first_step_ = 0, first_update_ = 0;  ///< the clock when this process began
  std::int64_t log_at_ = -1, logged_eval_at_ = -1;  ///< clock at the last log row, and of the eval in it
  std::string sync_line_;                           ///< what the last in-sync check found
  double timer_cost_ = 0;                           ///< seconds one ScopedPhase costs here
  std::int64_t since_poll_ = 0, poll_every_ = 16;   ///< iterations between the ranks' signal polls
  double polled_at_ = 0;                            ///< elapsed() at rank 0's last poll
  signals::Handlers handlers_;                      ///< SIGINT, SIGTERM, SIGUSR1 during the run
  RunDirLock lock_;                                 ///< rank 0's hold on the run directory
  std::filesystem::path resume_file_;               ///< the checkpoint run.resume names, read and checked
  StateSections::Apply resume_apply_;               ///< applies it
  detail::FlushAtExit flush_at_exit_{[this] { log_.flush(); }};  ///< exit_fast flushes the run's files
};

}  // namespace anvil
