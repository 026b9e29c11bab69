#pragma once
/// @file
/// `anvil::Trainer<Algorithm, Buffer, Parallelism, Precision>`: the host class whose four
/// policy slots read as a sentence. It owns the loop: collect with a VecEnv, store in the
/// buffer, update on the schedule, evaluate, log. A custom main may call the phases itself
/// (`collect`, `update`, `evaluate`); `fit()` runs them all.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <span>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <anvil/algorithms/policy.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/detail/crc32c.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/observe/gpu_monitor.hpp>
#include <anvil/observe/progress.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/observe/tensorboard.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/parallel/world.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/train/run_config.hpp>
#include <anvil/train/step_context.hpp>

namespace anvil {

/// Mean, spread and range of evaluation returns.
struct EvalResult {
  double mean = NAN, std = NAN, min = NAN, max = NAN;
  int episodes = 0;
};

/// What `fit()` achieved; also written to `summary.json`.
struct FitResult {
  double final_eval_return = NAN;
  double best_eval_return = NAN;
  std::int64_t env_steps = 0;
  std::int64_t updates = 0;
  double wall_seconds = 0.0;
};

/// The Trainer for a valid combination of policies (see `Trainer`).
/// @tparam A an `Algorithm` (SAC, ...)
/// @tparam B a `Buffer` the algorithm learns from (UniformBuffer, ...)
/// @tparam P a `Parallelism` policy (SingleDevice, DDP<N>)
/// @tparam X a `Precision` policy (FP32, TF32, BF16, FP16)
template <class A, class B, class P, class X>
class BasicTrainer {
 public:
  /// Every knob of a run, one section per policy; keys are `<section>.<field>`.
  struct Config {
    Section<"run", RunConfig> run;
    Section<"train", TrainConfig> train = default_schedule();
    Section<"env", envs::VecEnvConfig> env;
    Section<"normalize", envs::NormalizeConfig> normalize;
    Section<A::config_section, typename A::Config> algorithm;
    Section<B::config_section, typename B::Config> buffer;
    Section<P::config_section, typename P::Config> parallel;
    Section<X::config_section, typename X::Config> precision;

    /// Rules across sections.
    void validate() const {
      if (train->eval_interval > 0 && train->eval_interval < env->num_envs)
        throw ConfigError("train.eval_interval (" + std::to_string(*train->eval_interval) +
                          ") is shorter than one step of env.num_envs (" +
                          std::to_string(*env->num_envs) + ") envs");
      if constexpr (!requires(A& a) { a.ema_update(0.0); })
        if (train->ema_decay > 0)
          throw ConfigError("train.ema_decay: " + std::string(A::config_section.view()) +
                            " keeps no average of its policy's weights");
      const std::string algo(A::config_section.view());
      if constexpr (requires { algorithm->batch_size; })
        if (train->grad_accumulation > algorithm->batch_size)
          throw ConfigError("train.grad_accumulation (" + std::to_string(*train->grad_accumulation) +
                            ") is larger than " + algo + ".batch_size (" +
                            std::to_string(*algorithm->batch_size) + "): micro-batches would be empty");
      if constexpr (A::on_policy) {
        // An on-policy algorithm learns once per rollout, from its own actions only.
        if (train->learning_starts > 0)
          throw ConfigError("train.learning_starts (" + std::to_string(*train->learning_starts) + "): " + algo +
                            " is on-policy and learns from its own actions from the first rollout; set 0");
        if (*train->update_interval != 1 || *train->updates_per_interval != 1)
          throw ConfigError(std::string(*train->update_interval != 1 ? "train.update_interval" : "train.updates_per_interval") +
                            ": " + algo + " updates once per rollout (" + std::string(B::config_section.view()) +
                            ".steps x env.num_envs env steps), " + algo + ".epochs passes in minibatches of " + algo +
                            ".minibatch_size; leave it at 1");
        if constexpr (requires { algorithm->minibatch_size; buffer->steps; }) {
          const std::int64_t rollout = *buffer->steps * *env->num_envs;
          if (algorithm->minibatch_size > rollout)
            throw ConfigError(algo + ".minibatch_size (" + std::to_string(*algorithm->minibatch_size) +
                              ") is larger than a rollout: " + std::string(B::config_section.view()) + ".steps (" +
                              std::to_string(*buffer->steps) + ") x env.num_envs (" + std::to_string(*env->num_envs) +
                              ") = " + std::to_string(rollout) + " rows");
          if (train->grad_accumulation > algorithm->minibatch_size)
            throw ConfigError("train.grad_accumulation (" + std::to_string(*train->grad_accumulation) +
                              ") is larger than " + algo + ".minibatch_size (" +
                              std::to_string(*algorithm->minibatch_size) + "): micro-batches would be empty");
        }
      }
    }
  };

  /// The `train` section's defaults for this algorithm: on-policy ones start learning at
  /// once (no steps of random actions).
  static Section<"train", TrainConfig> default_schedule() {
    Section<"train", TrainConfig> t;
    if constexpr (A::on_policy) t->learning_starts = 0;
    return t;
  }

  /// Builds the run from the command line: `args` (from `parse_config`) is applied over
  /// `defaults`. Answers `--help` and `--print-config`; a bad key or value ends the program
  /// with a message naming it (exit status 2).
  template <envs::Env E>
  BasicTrainer(const E& env, const Args& args, Config defaults = {})
      : BasicTrainer(env, configure<Config>(args, std::move(defaults)), args.program) {}

  /// Builds the run from a typed config (validated here; throws ConfigError).
  template <envs::Env E>
  BasicTrainer(const E& env, Config cfg, std::string program = "anvil")
      : cfg_(prepare(std::move(cfg))), program_(std::move(program)) {
    torch::set_num_threads(cfg_.run->threads);
    parallel_ = std::make_unique<P>(*cfg_.parallel);  // DDP started plainly: launches its ranks here
    ctx_.device = resolve_device(cfg_.run->device, device_index());
    if constexpr (requires { parallel_->connect(ctx_.device); }) parallel_->connect(ctx_.device);
    ctx_.seed = cfg_.run->seed;
    ctx_.rank = parallel_->rank();
    ctx_.world_size = parallel_->world_size();
    if constexpr (X::needs_cuda) {
      if (!ctx_.device.is_cuda())
        throw DeviceError("FP16 autocast needs a CUDA device; use BF16 on CPU (run.device is " +
                          ctx_.device.str() + ")");
    }
    apply_precision_settings();
    if constexpr (!std::is_trivially_copyable_v<E>)
      notes_.push_back(std::string("checkpoints: ") + std::string(E::name) +
                       " is not trivially copyable, so checkpoints hold no env state (a resumed run starts "
                       "new episodes)");
    ctx_.lr_scale = lr_scale();
    seed_torch(ctx_);

    venv_ = envs::make_vec_env(env, *cfg_.env, ctx_.seed_for(Stream::env));
    std::shared_ptr<envs::NormalizeState> norm;
    if (cfg_.normalize->obs || cfg_.normalize->reward) {
      auto wrapped = std::make_unique<envs::NormalizedVecEnv>(std::move(venv_), *cfg_.normalize, discount());
      norm = norm_ = wrapped->state();
      venv_ = std::move(wrapped);
    }
    // Evaluation envs normalise observations with the training statistics, frozen.
    make_eval_env_ = [env, norm, ncfg = *cfg_.normalize](int episodes, std::uint64_t seed) {
      envs::VecEnvConfig c;
      c.num_envs = episodes;
      auto v = envs::make_vec_env(env, c, seed);
      if (!norm) return v;
      return std::unique_ptr<envs::VecEnvBase>(
          std::make_unique<envs::NormalizedVecEnv>(std::move(v), ncfg, 0.99, norm, /*frozen=*/true));
    };
    spec_ = venv_->spec();
    if (!spec_.discrete()) {
      // Algorithms act in [-1, 1] per bounded dimension; unbounded ones pass through.
      const auto& box = std::get<envs::Box>(spec_.action);
      const auto d = spec_.action_dim();
      action_scale_ = torch::ones({d});
      action_offset_ = torch::zeros({d});
      action_low_ = torch::full({d}, -1.0);
      action_high_ = torch::full({d}, 1.0);
      for (std::int64_t i = 0; i < d; ++i) {
        if (std::isfinite(box.low[i]) && std::isfinite(box.high[i])) {
          action_scale_[i] = 0.5 * (box.high[i] - box.low[i]);
          action_offset_[i] = 0.5 * (box.high[i] + box.low[i]);
        } else {
          action_low_[i] = -INFINITY;
          action_high_[i] = INFINITY;
        }
      }
    }

    algo_ = std::make_unique<A>(spec_, *cfg_.algorithm, ctx_);
    buffer_ = std::make_unique<B>(spec_, *cfg_.buffer, ctx_);
    if constexpr (requires { buffer_->set_num_envs(std::int64_t{}); }) buffer_->set_num_envs(venv_->num_envs());
    if constexpr (requires { buffer_->set_horizon(std::int64_t{}); }) buffer_->set_horizon(cfg_.train->steps);
    if constexpr (requires { buffer_->set_discount(0.0); }) buffer_->set_discount(discount());
    StepContext::Options so;
    so.device = ctx_.device;
    so.autocast = X::autocast;
    so.autocast_dtype = X::compute_dtype;
    so.threads = update_threads();
    so.micro_batches = cfg_.train->grad_accumulation;
    so.times = &times_;
    times_.enabled = cfg_.run->timings;
    if (ctx_.device.is_cuda() && cfg_.run->sync_timings) times_.sync = [] { torch::cuda::synchronize(); };
    if constexpr (X::loss_scaling)
      so.loss_scaling = LossScaler::Options{cfg_.precision->init_scale, cfg_.precision->growth_factor,
                                            cfg_.precision->backoff_factor, cfg_.precision->growth_interval};
    if (parallel_->world_size() > 1)
      so.all_reduce_mean = [p = parallel_.get()](std::vector<at::Tensor>& g) { p->all_reduce_mean(g); };
    step_ctx_ = StepContext(std::move(so));
    rng_ = Rng(ctx_.seed_for(Stream::exploration));
    eval_seed_ = ctx_.seed_for(Stream::eval_env);
    if constexpr (requires { parallel_->describe(); })
      notes_.insert(notes_.begin(), "world: " + parallel_->describe());
    sync_from_main();  // every rank starts from rank 0's networks and optimizer state
  }

  BasicTrainer(const BasicTrainer&) = delete;
  BasicTrainer& operator=(const BasicTrainer&) = delete;

  /// Trains for `train.steps` env steps: collect, update on the schedule, evaluate every
  /// `train.eval_interval` steps and at the end, log every `run.log_interval` steps.
  /// The same as `begin()`, the loop, then `finish()`.
  FitResult fit() {
    begin();
    const auto& t = *cfg_.train;
    // The next multiple of `every` after the current step (so a resumed run keeps the
    // schedule of the run it continues); `none` when `every` is 0.
    auto next_after = [&](std::int64_t every, std::int64_t none) {
      return every > 0 ? (env_steps_ / every + 1) * every : none;
    };
    std::int64_t next_eval = next_after(t.eval_interval, INT64_MAX);
    std::int64_t next_log = next_after(cfg_.run->log_interval, INT64_MAX);
    std::int64_t next_checkpoint = next_after(cfg_.run->checkpoint_interval, INT64_MAX);
    while (env_steps_ < t.steps) {
      if constexpr (A::on_policy) {
        collect_rollout();
        learn_rollout();
      } else {
        collect_one();
        if (env_steps_ >= t.learning_starts && can_update()) {
          since_update_ += venv_->num_envs();
          while (since_update_ >= t.update_interval) {
            update(t.updates_per_interval);
            since_update_ -= t.update_interval;
          }
        }
      }
      if (env_steps_ >= next_eval) {
        record_eval(evaluate(t.eval_episodes));
        while (next_eval <= env_steps_) next_eval += t.eval_interval;
      }
      if (env_steps_ >= next_log) {
        log_row();
        while (next_log <= env_steps_) next_log += cfg_.run->log_interval;
      }
      if (env_steps_ >= next_checkpoint && env_steps_ < t.steps) {
        checkpoint();
        while (next_checkpoint <= env_steps_) next_checkpoint += cfg_.run->checkpoint_interval;
      }
      show_progress();
    }
    return finish();
  }

  /// For a main that runs its own loop: opens the run directory (config.yaml, training.log,
  /// metrics.csv, TensorBoard events), resumes when run.resume asks, and gives every rank
  /// rank 0's state. Call it once before collecting.
  void begin() {
    open_run_dir();
    resume_if_asked();
    sync_from_main();  // a resumed rank 0 hands its state to the others
    first_step_ = env_steps_;  // rates count what this process did (a resumed run started here)
    first_update_ = updates_;
  }

  /// Ends a run begun with `begin()`: a last evaluation (unless one was recorded at this
  /// step), a last log row, a checkpoint, the timing verdict and summary.json.
  FitResult finish() {
    const auto& t = *cfg_.train;
    if (eval_step_ != env_steps_) record_eval(evaluate(t.eval_episodes));  // not twice at one step
    if (log_step_ != env_steps_ || logged_eval_step_ != eval_step_) log_row();  // not the same row twice
    checkpoint();
    if (parallel_->world_size() > 1 && parallel_->is_main()) say(sync_line_);
    if (parallel_->is_main() && times_.enabled) {
      say("time: " + shares_line(times_));
      say(bottleneck(times_, advice()));
    }
    csv_.flush_pending();
    progress_.finish();
    result_.env_steps = env_steps_;
    result_.updates = updates_;
    result_.wall_seconds = elapsed();
    write_summary();
    if (parallel_->is_main()) {
      say(summary_line());
      say("logs: " + run_dir_.string() + " (training.log, metrics.csv, TensorBoard events, summary.json, config.yaml)");
      tb_.flush();
    }
    return result_;
  }

  /// Writes a row of metrics (metrics.csv, training.log, TensorBoard) now: the metrics
  /// accumulated since the last row. With several ranks, every rank must call it.
  void log() { log_row(); }

  /// Makes `r` the run's latest evaluation (in the next log row, summary.json and the best
  /// return so far), as `fit()` does with its own evaluations.
  void record_evaluation(const EvalResult& r) { record_eval(r); }

  /// Steps the envs until at least `n` more env steps are stored (random actions until
  /// `train.learning_starts`, then the algorithm's exploration).
  void collect(std::int64_t n)
    requires(!A::on_policy)
  {
    const std::int64_t target = env_steps_ + n;
    while (env_steps_ < target) collect_one();
  }

  /// On-policy: fills the rollout buffer with `rollout.steps` steps of every env, acting
  /// with the current policy, and computes its advantages.
  void collect_rollout()
    requires(A::on_policy)
  {
    static_assert(OnPolicyAlgorithm<A>,
                  "Trainer: an on-policy Algorithm needs act_for_rollout, value, epochs, minibatch_size, "
                  "target_kl and set_progress (see anvil::OnPolicyAlgorithm)");
    buffer_->clear();
    if (!obs_.defined()) obs_ = venv_->reset();
    while (!buffer_->full()) collect_rollout_step();
    ScopedPhase ph(times_, Phase::buffer_add);
    buffer_->finish(algo_->value(obs_));
  }

  /// On-policy: learns from the rollout collected: `epochs` passes over it in shuffled
  /// minibatches, stopping early once an epoch's mean approximate KL (averaged over the
  /// ranks) exceeds `target_kl`. Then the buffer is cleared.
  void learn_rollout()
    requires(A::on_policy)
  {
    // Every rank normalises with the same statistics from here on.
    if (parallel_->world_size() > 1)
      venv_->sync_statistics([this](at::Tensor& t) { sum_over_ranks(*parallel_, t, ctx_.device); });
    algo_->set_progress(static_cast<double>(env_steps_) / static_cast<double>(*cfg_.train->steps));
    const double target_kl = algo_->target_kl();
    int epochs = 0;
    for (int e = 0; e < algo_->epochs(); ++e) {
      double kl = 0;
      int n = 0;
      std::optional<ScopedPhase> sampling(std::in_place, times_, Phase::sample);
      for (const auto& batch : buffer_->minibatches(algo_->minibatch_size())) {
        sampling.reset();
        UpdateInfo info;
        {
          ScopedPhase ph(times_, Phase::update);
          info = algo_->update(batch, step_ctx_);
        }
        for (const auto& [k, v] : info.metrics)
          if (k == "approx_kl") {
            kl += v;
            ++n;
          }
        record_update(info);
        sampling.emplace(times_, Phase::sample);
      }
      sampling.reset();
      ++epochs;
      if (target_kl > 0 && n > 0) {
        auto t = torch::full({1}, kl / n, at::kDouble);
        if (parallel_->world_size() > 1) sum_over_ranks(*parallel_, t, ctx_.device);
        if (t.item<double>() / parallel_->world_size() > target_kl) break;
      }
    }
    add_metric("epochs", epochs);
    buffer_->clear();
  }

  /// `n` gradient updates, each on a fresh batch from the buffer.
  void update(int n)
    requires(!A::on_policy)
  {
    for (int i = 0; i < n; ++i) {
      ReplayBatch batch;
      {
        ScopedPhase ph(times_, Phase::sample);
        batch = buffer_->sample(algo_->batch_size());
      }
      UpdateInfo info;
      {
        ScopedPhase ph(times_, Phase::update);
        info = algo_->update(batch, step_ctx_);
      }
      if constexpr (PrioritizedReplay<B>) {
        if (info.td_error.defined()) buffer_->update_priorities(batch.index, info.td_error);
      }
      record_update(info);
      if constexpr (requires { algo_->ema_update(0.0); })
        if (cfg_.train->ema_decay > 0) algo_->ema_update(cfg_.train->ema_decay);
    }
  }

  /// Mean return of `episodes` episodes with deterministic actions, on envs seeded apart
  /// from the training envs.
  EvalResult evaluate(int episodes) {
    if constexpr (requires { algo_->with_ema_weights([] {}); }) {
      if (cfg_.train->ema_decay > 0) return algo_->with_ema_weights([&] { return evaluate_now(episodes); });
    }
    return evaluate_now(episodes);
  }

  /// Writes the policy alone (`anvil::load_policy` reads it back without a trainer): the
  /// averaged weights when `train.ema_decay` is on, the env's action bounds, and the
  /// observation normaliser's statistics with `normalize.obs`. Atomic.
  void save_policy(const std::filesystem::path& file) const {
    BinaryWriter w(file, kPolicyFormat);
    w.string(spec_.name);
    algo_->save_policy(w);
    write_tensor(w, action_scale_);
    write_tensor(w, action_offset_);
    const bool normalised = norm_ && cfg_.normalize->obs;
    w.value(normalised);  // the policy acts on observations normalised as in training
    if (normalised) {
      const auto& mean = norm_->obs.mean();
      const auto var = norm_->obs.variance();
      auto m = torch::empty({spec_.obs_dim()}), inv = torch::empty({spec_.obs_dim()});
      for (std::int64_t j = 0; j < spec_.obs_dim(); ++j) {
        m[j] = mean[static_cast<std::size_t>(j)];
        inv[j] = 1.0 / std::sqrt(var[static_cast<std::size_t>(j)] + cfg_.normalize->epsilon);
      }
      write_tensor(w, m);
      write_tensor(w, inv);
      w.value(*cfg_.normalize->clip_obs);
    }
    w.commit();
  }

 private:
  // One evaluation with the actor's current weights (see `evaluate`).
  // With several ranks, each runs its share of the episodes and all see every return.
  EvalResult evaluate_now(int episodes) {
    ScopedPhase ph(times_, Phase::eval);
    const int world = parallel_->world_size(), rank = parallel_->rank();
    const int mine = episodes / world + (rank < episodes % world ? 1 : 0);
    const int first = rank * (episodes / world) + std::min(rank, episodes % world);
    std::vector<double> returns(static_cast<std::size_t>(episodes), 0.0);
    const std::uint64_t seed = eval_seed_++;
    if (mine > 0) {
      auto venv = make_eval_env_(mine, seed);
      auto obs = venv->reset();
      std::vector<bool> ended(static_cast<std::size_t>(mine), false);
      int done = 0;
      while (done < mine) {
        const auto& s = venv->step(to_env_action(algo_->act(obs, ActMode::deterministic)));
        for (const auto& e : s.ended)
          if (!ended[static_cast<std::size_t>(e.env)]) {
            ended[static_cast<std::size_t>(e.env)] = true;
            returns[static_cast<std::size_t>(first + e.env)] = e.episode_return;
            ++done;
          }
        obs = s.obs;
      }
    }
    if (world > 1) {
      auto all = torch::from_blob(returns.data(), {episodes}, at::kDouble);
      sum_over_ranks(*parallel_, all, ctx_.device);
    }
    EvalResult r;
    r.episodes = episodes;
    r.mean = std::accumulate(returns.begin(), returns.end(), 0.0) / episodes;
    double var = 0;
    for (double x : returns) var += (x - r.mean) * (x - r.mean);
    r.std = std::sqrt(var / episodes);
    r.min = *std::min_element(returns.begin(), returns.end());
    r.max = *std::max_element(returns.begin(), returns.end());
    return r;
  }


 public:
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] A& algorithm() noexcept { return *algo_; }
  [[nodiscard]] B& buffer() noexcept { return *buffer_; }
  [[nodiscard]] P& parallelism() noexcept { return *parallel_; }
  [[nodiscard]] const RunContext& context() const noexcept { return ctx_; }
  [[nodiscard]] std::int64_t env_steps() const noexcept { return env_steps_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] const PhaseTimes& times() const noexcept { return times_; }
  /// The running statistics of observations and returns (`normalize.obs`, `normalize.reward`);
  /// null when the run does not normalise.
  [[nodiscard]] const envs::NormalizeState* normalizer() const noexcept { return norm_.get(); }
  /// Returns of the most recent training episodes (up to 100).
  [[nodiscard]] const std::deque<double>& recent_returns() const noexcept { return recent_; }
  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_dir_; }
  /// The phase timers' own share of the run so far: calls times the cost of one, as
  /// measured on this machine when the run started, over the wall time.
  [[nodiscard]] double timer_overhead() const {
    const double wall = elapsed();
    return wall > 0 ? timer_cost_ * static_cast<double>(times_.calls()) / wall : 0.0;
  }
  /// What the run says once when it starts (precision and BLAS settings), one line each.
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return notes_; }

  /// Writes everything a resumed run needs to continue exactly as this one would: the
  /// algorithm (networks, targets, optimizers, temperature), the step context (loss
  /// scaler), the envs, every random stream (torch's generators, the envs' seed streams,
  /// exploration; the buffer's with the buffer), the counters and the schedule, and the
  /// config with its hash; with `run.checkpoint_buffer`, the replay buffer too, in a file
  /// beside it (`<name>.buffer`, written first). Atomic: a crash mid-save leaves the
  /// previous checkpoint intact.
  void save_checkpoint(const std::filesystem::path& file) {
    static_assert(requires(const A& a, BinaryWriter& w) { a.save(w); },
                  "Trainer: this Algorithm has no save(BinaryWriter&) for checkpoints");
    const bool with_buffer = cfg_.run->checkpoint_buffer;
    if constexpr (requires { buffer_->save(file); }) {
      if (with_buffer) buffer_->save(buffer_file(file));
    } else if (with_buffer) {
      throw ConfigError("run.checkpoint_buffer: " + std::string(B::config_section.view()) + " cannot be saved");
    }
    BinaryWriter w(file, "anvil Checkpoint v1");
    w.string(std::string(A::config_section.view()));
    w.string(std::string(X::name));
    w.string(config_hash_hex(cfg_));
    const auto flat = flatten(cfg_);
    w.value(static_cast<std::uint64_t>(flat.size()));
    for (const auto& [k, v] : flat) {
      w.string(k);
      w.string(v);
    }
    w.value(with_buffer);
    for (std::int64_t c : {env_steps_, updates_, episodes_, since_update_, eval_step_}) w.value(c);
    w.value(eval_seed_);
    w.value(rng_.state());
    for (double x : {result_.final_eval_return, result_.best_eval_return, last_eval_.mean, last_eval_.std,
                     last_eval_.min, last_eval_.max})
      w.value(x);
    w.value(last_eval_.episodes);
    w.value(static_cast<std::uint64_t>(recent_.size()));
    for (double x : recent_) w.value(x);
    w.value(static_cast<std::uint64_t>(metrics_.size()));
    for (const auto& [k, m] : metrics_) {
      w.string(k);
      w.value(m.first);
      w.value(m.second);
    }
    write_tensor(w, at::detail::getDefaultCPUGenerator().get_state());
    w.value(ctx_.device.is_cuda());
    if (ctx_.device.is_cuda()) write_tensor(w, at::globalContext().defaultGenerator(ctx_.device).get_state());
    venv_->save(w);
    algo_->save(w);
    step_ctx_.save(w);
    w.commit();
  }

  /// Restores what `save_checkpoint` wrote. The checkpoint must come from the same
  /// algorithm, networks, buffer, envs and precision: the error names the first config field
  /// that differs (`run.*` and `train.steps`, `train.eval_interval`, `train.eval_episodes`
  /// may differ). Everything is read and checked (the checksum too) before anything
  /// changes: on any error the trainer is as it was.
  void load_checkpoint(const std::filesystem::path& file) {
    if (!std::filesystem::exists(file)) throw Error("run.resume: no checkpoint at '" + file.string() + "'");
    BinaryReader r(file, "anvil Checkpoint v1");
    const auto algorithm = r.string("algorithm");
    if (algorithm != A::config_section.view())
      throw Error("'" + file.string() + "' was written by a " + algorithm + " run; this run is " +
                  std::string(A::config_section.view()));
    const auto precision = r.string("precision");
    if (precision != X::name)
      throw Error("'" + file.string() + "' was written by a run in " + precision + " precision; this run is " +
                  std::string(X::name) + " (resume needs the same precision)");
    (void)r.string("config hash");  // for people and tools reading the file; the fields are compared below
    const auto n = r.value<std::uint64_t>("config");
    if (n > 100'000) r.fail("config", "has an implausible number of fields");
    std::map<std::string, std::string> saved;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("config key");
      saved[k] = r.string("config value");
    }
    for (const auto& [k, v] : flatten(cfg_)) {
      if (k.rfind("run.", 0) == 0 || k.rfind("parallel.", 0) == 0 || k == "train.steps" || k == "train.eval_interval" || k == "train.eval_episodes")
        continue;
      if (auto it = saved.find(k); it != saved.end() && it->second != v)
        throw Error("'" + file.string() + "' was written by a run with " + k + " = " + it->second +
                    "; this run has " + k + " = " + v + " (a resumed run needs the same algorithm, networks, "
                    "buffer, envs and precision)");
    }
    const bool with_buffer = r.value<bool>("buffer flag");
    std::array<std::int64_t, 5> counters{};
    for (auto& c : counters) c = r.value<std::int64_t>("counters");
    const auto eval_seed = r.value<std::uint64_t>("eval seed");
    const auto rng = r.value<Rng::State>("exploration stream");
    std::array<double, 6> evals{};
    for (auto& x : evals) x = r.value<double>("evaluation results");
    const int eval_episodes = r.value<int>("evaluation episodes");
    const auto n_recent = r.value<std::uint64_t>("recent returns");
    if (n_recent > 100) r.fail("recent returns", "are more than the 100 a run keeps");
    std::deque<double> recent;
    for (std::uint64_t i = 0; i < n_recent; ++i) recent.push_back(r.value<double>("recent returns"));
    const auto n_metrics = r.value<std::uint64_t>("metrics");
    if (n_metrics > 10'000) r.fail("metrics", "has an implausible number of entries");
    std::map<std::string, std::pair<double, int>> metrics;
    for (std::uint64_t i = 0; i < n_metrics; ++i) {
      auto k = r.string("metric name");
      const auto sum = r.value<double>("metric sum");
      metrics[k] = {sum, r.value<int>("metric count")};
    }
    const auto& cpu_gen = at::detail::getDefaultCPUGenerator();
    const auto cpu_state = read_tensor(r, "torch CPU generator state", cpu_gen.get_state());
    const bool was_cuda = r.value<bool>("CUDA flag");
    if (was_cuda != ctx_.device.is_cuda())
      r.fail("CUDA flag", was_cuda ? "says the run was on CUDA; this one is on " + ctx_.device.str()
                                   : "says the run was on the CPU; this one is on " + ctx_.device.str());
    at::Tensor cuda_state;
    if (was_cuda)
      cuda_state = read_tensor(r, "torch CUDA generator state", at::globalContext().defaultGenerator(ctx_.device).get_state());
    auto apply_envs = venv_->read(r);
    const auto algo = algo_->read(r);
    const auto step = step_ctx_.read(r);
    r.finish();
    if constexpr (requires { buffer_->load(file); }) {
      if (with_buffer) buffer_->load(buffer_file(file));  // checks its whole file before changing
    }
    // Nothing can fail from here on.
    if (apply_envs) apply_envs();
    algo_->restore(algo);
    step_ctx_.restore(step);
    env_steps_ = counters[0];
    updates_ = counters[1];
    episodes_ = counters[2];
    since_update_ = counters[3];
    eval_step_ = counters[4];
    eval_seed_ = eval_seed;
    rng_.set_state(rng);
    result_.final_eval_return = evals[0];
    result_.best_eval_return = evals[1];
    last_eval_ = EvalResult{evals[2], evals[3], evals[4], evals[5], eval_episodes};
    recent_ = std::move(recent);
    metrics_ = std::move(metrics);
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(cpu_state);
    if (was_cuda) {
      at::Generator cuda = at::globalContext().defaultGenerator(ctx_.device);
      cuda.set_state(cuda_state);
    }
    // What the envs show now (undefined without saved env state: the run starts new episodes).
    obs_ = apply_envs ? venv_->observations() : at::Tensor();
    resumed_from_ = file;
  }

  /// The checkpoint this run continued from (empty when it started afresh).
  [[nodiscard]] const std::filesystem::path& resumed_from() const noexcept { return resumed_from_; }

 private:
  static Config prepare(Config c) {
    if (c.run->smoke) {
      // Seconds, not minutes: enough steps to pass learning_starts and update a little.
      c.train->steps = std::min<std::int64_t>(c.train->steps, 600);
      c.train->learning_starts = std::min<std::int64_t>(c.train->learning_starts, 200);
      c.train->eval_interval = 0;
      c.train->eval_episodes = std::min(*c.train->eval_episodes, 2);
      c.run->log_interval = std::min<std::int64_t>(c.run->log_interval, 200);
      if constexpr (requires { c.buffer->steps; c.algorithm->minibatch_size; }) {
        c.buffer->steps = std::min<std::int64_t>(c.buffer->steps, 32);
        c.algorithm->minibatch_size =
            std::min<std::int64_t>(c.algorithm->minibatch_size, *c.buffer->steps * *c.env->num_envs);
      }
    }
    validate(c);
    return c;
  }

  // Process-wide switches of the precision policy, set once here.
  void apply_precision_settings() {
    auto& g = at::globalContext();
    g.setBenchmarkCuDNN(cfg_.precision->cudnn_benchmark);
    torch::autograd::AnomalyMode::set_enabled(cfg_.precision->detect_anomaly);
    g.setAllowTF32CuBLAS(X::allow_tf32);
    g.setAllowTF32CuDNN(X::allow_tf32);
    if (X::allow_tf32 && !ctx_.device.is_cuda())
      notes_.push_back("precision: TF32 changes only CUDA matrix products; on the CPU this run is FP32");
    if (cfg_.precision->detect_anomaly)
      notes_.push_back("precision: autograd anomaly detection is on (slow; for debugging NaNs)");
    if (!ctx_.device.is_cuda()) {
      const BlasInfo b = blas_info();
      if (b.reference)
        notes_.push_back("cpu: Torch uses the reference BLAS (" + b.library +
                         "): matrix products are about 10x slower; run scripts/install-deps.sh");
      else if (b.openblas)
        notes_.push_back("cpu: OpenBLAS" + (b.core.empty() ? std::string() : " (" + b.core + " kernels)") +
                         ", " + std::to_string(at::get_num_threads()) + " intra-op thread(s), " +
                         std::to_string(update_threads()) + " update thread(s)");
    }
  }

  // The CUDA device index of this rank: the parallelism's choice (--gpu-ids) or its local rank.
  int device_index() const {
    if constexpr (requires { parallel_->cuda_index(); }) return parallel_->cuda_index();
    else if constexpr (requires { parallel_->local_rank(); }) return parallel_->local_rank();
    return 0;
  }

  // Whether the buffer can give a batch. Ranks must update in lockstep (each update is a
  // collective), so with several ranks all must be able to: their buffers can differ after
  // a resume (only rank 0 restores one). Asked each step until the answer is yes, which
  // stays yes: buffers only grow.
  bool can_update() {
    if (ready_) return true;
    double short_of = buffer_->size() >= first_batch() ? 0.0 : 1.0;
    if (parallel_->world_size() > 1) {
      auto t = torch::full({1}, short_of, at::kDouble);
      sum_over_ranks(*parallel_, t, ctx_.device);
      short_of = t.item<double>();
    }
    return ready_ = short_of == 0.0;
  }

  // What every rank must hold identically: the algorithm (networks, targets, optimizers,
  // temperature, averaged weights) and the step context (loss scaler).
  void write_learned_state(BinaryWriter& w) const {
    algo_->save(w);
    step_ctx_.save(w);
  }

  // Rank 0's learned state and schedule on every rank: at construction (ranks seed their
  // networks apart) and after rank 0 resumed from a checkpoint.
  void sync_from_main() {
    if (parallel_->world_size() == 1) return;
    static_assert(requires(const A& a, BinaryWriter& w) { a.save(w); },
                  "Trainer: with several ranks, the Algorithm needs save(BinaryWriter&) and read/restore to share rank 0's state");
    std::vector<std::uint8_t> bytes;
    if (parallel_->is_main()) {
      auto w = BinaryWriter::in_memory(kRankStateFormat);
      write_learned_state(w);
      for (std::int64_t c : {env_steps_, updates_, since_update_, eval_step_}) w.value(c);
      for (double x : {result_.final_eval_return, result_.best_eval_return, last_eval_.mean, last_eval_.std,
                       last_eval_.min, last_eval_.max})
        w.value(x);
      w.value(last_eval_.episodes);
      // The names of the metrics being accumulated (a resumed rank 0 has some), so that
      // every rank reduces the same list in log_row.
      w.value(static_cast<std::uint64_t>(metrics_.size()));
      for (const auto& [k, m] : metrics_) w.string(k);
      if (norm_) {  // every rank normalises with rank 0's statistics
        norm_->obs.consolidate();
        norm_->ret.consolidate();
        norm_->obs.save(w);
        norm_->ret.save(w);
      }
      bytes = w.take_bytes();
    }
    broadcast_bytes(*parallel_, bytes, ctx_.device);
    if (parallel_->is_main()) return;
    BinaryReader r(bytes, "rank 0's state", kRankStateFormat);
    const auto algo = algo_->read(r);
    const auto step = step_ctx_.read(r);
    std::array<std::int64_t, 4> counters{};
    for (auto& c : counters) c = r.value<std::int64_t>("counters");
    std::array<double, 6> evals{};
    for (auto& x : evals) x = r.value<double>("evaluation results");
    const int eval_episodes = r.value<int>("evaluation episodes");
    const auto n_metrics = r.value<std::uint64_t>("metrics");
    if (n_metrics > 10'000) r.fail("metrics", "has an implausible number of entries");
    std::vector<std::string> metric_names(n_metrics);
    for (auto& k : metric_names) k = r.string("metric name");
    std::optional<envs::RunningMeanVar> obs_stats, ret_stats;
    if (norm_) {
      obs_stats = norm_->obs.read(r, "rank 0's observation statistics");
      ret_stats = norm_->ret.read(r, "rank 0's return statistics");
    }
    r.finish();
    if (norm_) {
      norm_->obs = *obs_stats;
      norm_->ret = *ret_stats;
    }
    for (const auto& k : metric_names) metrics_.try_emplace(k, 0.0, 0);
    algo_->restore(algo);
    step_ctx_.restore(step);
    env_steps_ = counters[0];
    updates_ = counters[1];
    since_update_ = counters[2];
    eval_step_ = counters[3];
    result_.final_eval_return = evals[0];
    result_.best_eval_return = evals[1];
    last_eval_ = EvalResult{evals[2], evals[3], evals[4], evals[5], eval_episodes};
  }

  // Checks that every rank holds bitwise the same learned state as rank 0 (they apply the
  // same averaged gradients, so they must); a DistributedError naming the ranks that differ.
  void check_in_sync() {
    const int world = parallel_->world_size();
    if (world == 1) return;
    auto w = BinaryWriter::in_memory(kRankStateFormat);
    write_learned_state(w);
    const auto bytes = w.take_bytes();
    detail::Crc32c crc;
    crc.update(bytes.data(), bytes.size());
    std::vector<at::Tensor> mine{torch::full({1}, static_cast<std::int64_t>(crc.value()), at::kLong).to(ctx_.device)};
    parallel_->broadcast(mine);
    const auto main_crc = static_cast<std::uint32_t>(mine[0].item<std::int64_t>());
    auto differs = torch::zeros({world}, at::kDouble);
    if (main_crc != crc.value()) differs[parallel_->rank()] = 1.0;
    sum_over_ranks(*parallel_, differs, ctx_.device);
    std::string bad;
    for (int r = 0; r < world; ++r)
      if (differs[r].item<double>() > 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    if (!bad.empty())
      throw DistributedError("rank " + std::to_string(parallel_->rank()) + ": ranks out of sync at env step " +
                             std::to_string(env_steps_) + ": the learned state of rank(s) " + bad +
                             " differs from rank 0's");
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", main_crc);
    sync_line_ = "ranks in sync: all " + std::to_string(world) +
                 " ranks hold bitwise-identical parameters and optimizer state (crc32c " + hex + ", env step " +
                 std::to_string(env_steps_) + ")";
  }

  // Transitions the buffer must hold before the first update: one batch for replay
  // buffers, which refuse to sample more than they hold.
  std::int64_t first_batch() const {
    if constexpr (requires { algo_->batch_size(); }) return algo_->batch_size();
    return 0;
  }

  // run.update_threads, with 0 resolved: SAC's update has two independent parts, so two
  // threads when this process has two cores to itself (measured 1.2-1.5x faster updates).
  int update_threads() const {
    if (*cfg_.run->update_threads > 0) return cfg_.run->update_threads;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    return std::clamp(cores / std::max(1, parallel_->world_size()), 1, 2);
  }

  double lr_scale() const {
    switch (*cfg_.train->lr_scaling) {
      case LrScaling::none: return 1.0;
      case LrScaling::sqrt: {
        if constexpr (requires { cfg_.algorithm->batch_size; })
          return std::sqrt(static_cast<double>(cfg_.algorithm->batch_size) / cfg_.train->base_batch);
        else if constexpr (requires { cfg_.algorithm->minibatch_size; })
          return std::sqrt(static_cast<double>(cfg_.algorithm->minibatch_size) / cfg_.train->base_batch);
        return 1.0;
      }
      case LrScaling::linear: return static_cast<double>(parallel_->world_size());
    }
    return 1.0;
  }

  // The algorithm's actions as the env takes them: discrete indices as int64 on the CPU;
  // continuous ones clipped to [-1, 1] and scaled to the bounds (unbounded dimensions as
  // they are). The algorithm may keep the unclipped action.
  at::Tensor to_env_action(const at::Tensor& a) const {
    if (spec_.discrete()) return a.to(at::kCPU, at::kLong).reshape({-1});
    const auto c = a.to(at::kCPU, at::kFloat);
    return at::max(at::min(c, action_high_), action_low_) * action_scale_ + action_offset_;
  }

  // Actions drawn uniformly (before train.learning_starts), in the algorithm's units.
  at::Tensor random_actions(std::int64_t n) const {
    if (spec_.discrete()) return torch::randint(spec_.num_actions(), {n}, at::kLong);
    return torch::rand({n, spec_.action_dim()}) * 2.0 - 1.0;
  }

  void collect_one() {
    if (!obs_.defined()) obs_ = venv_->reset();
    const auto n = venv_->num_envs();
    at::Tensor a;
    {
      ScopedPhase ph(times_, Phase::act);
      if (env_steps_ < cfg_.train->learning_starts)
        a = random_actions(n);
      else
        a = algo_->act(obs_, ActMode::explore).to(at::kCPU);
    }
    const envs::VecStep* s = nullptr;
    {
      ScopedPhase ph(times_, Phase::env);
      s = &venv_->step(to_env_action(a));
    }
    {
      ScopedPhase ph(times_, Phase::buffer_add);
      buffer_->add(StepBatch{obs_, a, s->reward, s->next_obs, s->terminated, s->truncated});
    }
    obs_ = s->obs;
    count_step(*s);
  }

  // One step of every env for the rollout: act, step, and for rows cut by the time limit
  // the value of their true last state (the bootstrap; see RolloutBuffer).
  void collect_rollout_step() {
    RolloutAct act;
    {
      ScopedPhase ph(times_, Phase::act);
      act = algo_->act_for_rollout(obs_);
    }
    const envs::VecStep* s = nullptr;
    {
      ScopedPhase ph(times_, Phase::env);
      s = &venv_->step(to_env_action(act.action));
    }
    at::Tensor bootstrap;
    if (std::any_of(s->ended.begin(), s->ended.end(), [](const envs::EpisodeEnd& e) { return !e.terminated; })) {
      ScopedPhase ph(times_, Phase::act);
      bootstrap = algo_->value(s->next_obs);
    }
    {
      ScopedPhase ph(times_, Phase::buffer_add);
      buffer_->add(RolloutStep{obs_, act.action, act.log_prob, act.value, s->reward, s->terminated, s->truncated,
                               bootstrap});
    }
    obs_ = s->obs;
    count_step(*s);
  }

  void count_step(const envs::VecStep& s) {
    env_steps_ += venv_->num_envs() * parallel_->world_size();  // every rank steps as many envs at once
    for (const auto& e : s.ended) {
      recent_.push_back(e.episode_return);
      if (recent_.size() > 100) recent_.pop_front();
      ++episodes_;
    }
  }

  // One update done: its metrics join the means of the next log row.
  void record_update(const UpdateInfo& info) {
    for (const auto& [k, v] : info.metrics) add_metric(k, v);
    ++updates_;
  }
  void add_metric(const std::string& name, double v) {
    auto& m = metrics_[name];
    m.first += v;
    m.second += 1;
  }

  // What the timing verdict suggests, in this algorithm's knobs.
  static BottleneckAdvice advice() {
    BottleneckAdvice a;
    if constexpr (A::on_policy) {
      const std::string algo(A::config_section.view());
      a.env = "raise env.num_envs or env.threads";
      a.learn = "fewer " + algo + ".epochs or larger " + algo + ".minibatch_size, BF16, or more ranks";
      a.comm = "larger " + algo + ".minibatch_size (fewer all-reduces per rollout) or fewer ranks";
      a.sample = "larger " + algo + ".minibatch_size";
    }
    return a;
  }

  // The algorithm's discount (the buffer's n-step returns, the reward normaliser).
  double discount() const {
    if constexpr (requires { cfg_.algorithm->gamma; }) return cfg_.algorithm->gamma;
    return 0.99;
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // Checkpoints are `checkpoint-<env steps, 12 digits>.ckpt` in the run directory, so that
  // names sort by step; the buffer, when saved, is the same name with `.buffer`.
  static std::filesystem::path buffer_file(std::filesystem::path checkpoint) {
    return checkpoint.replace_extension(".buffer");
  }
  std::filesystem::path checkpoint_file(std::int64_t step) const {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoint-%012lld.ckpt", static_cast<long long>(step));
    return run_dir_ / name;
  }
  // The checkpoints in `dir`, oldest first.
  static std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      if (name.rfind("checkpoint-", 0) == 0 && e.path().extension() == ".ckpt") found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    return found;
  }

  // A checkpoint at the current step (rank 0 only), then the oldest beyond run.keep_last go.
  void checkpoint() {
    check_in_sync();
    if (!parallel_->is_main()) return;
    ScopedPhase ph(times_, Phase::checkpoint);
    save_checkpoint(checkpoint_file(env_steps_));
    if constexpr (requires(BinaryWriter& w) { algo_->save_policy(w); }) save_policy(run_dir_ / "policy.bin");
    auto all = checkpoints_in(run_dir_);
    for (std::size_t i = 0; i + static_cast<std::size_t>(*cfg_.run->keep_last) < all.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove(all[i], ec);
      std::filesystem::remove(buffer_file(all[i]), ec);
    }
  }

  // run.resume: a path, or auto (the latest checkpoint in the run directory, if any).
  void resume_if_asked() {
    const std::string& what = cfg_.run->resume;
    if (what.empty() || !parallel_->is_main()) return;  // other ranks get rank 0's state from sync_from_main
    std::filesystem::path file = what;
    if (what == "auto") {
      const auto all = checkpoints_in(run_dir_);
      if (all.empty()) {
        if (parallel_->is_main()) say("resume: no checkpoint in " + run_dir_.string() + "; starting afresh");
        return;
      }
      file = all.back();
    }
    load_checkpoint(file);
    // A longer (or shorter) run than the checkpoint's anneals over its own length.
    if constexpr (requires { buffer_->set_horizon(std::int64_t{}); }) buffer_->set_horizon(cfg_.train->steps);
    csv_ = parallel_->is_main() ? MetricsCsv::resume(run_dir_ / "metrics.csv", env_steps_) : MetricsCsv();
    if (parallel_->is_main())
      say("resumed from " + file.string() + " at env step " + std::to_string(env_steps_));
  }

  double recent_return() const {
    if (recent_.empty()) return NAN;
    const std::size_t k = std::min<std::size_t>(recent_.size(), 10);
    return std::accumulate(recent_.end() - static_cast<std::ptrdiff_t>(k), recent_.end(), 0.0) /
           static_cast<double>(k);
  }

  void record_eval(const EvalResult& r) {
    last_eval_ = r;
    eval_step_ = env_steps_;
    result_.final_eval_return = r.mean;
    if (std::isnan(result_.best_eval_return) || r.mean > result_.best_eval_return)
      result_.best_eval_return = r.mean;
  }

  void open_run_dir() {
    start_ = std::chrono::steady_clock::now();
    if (!parallel_->is_main()) return;
    const std::string& resume = cfg_.run->resume;
    if (resume == "auto" && cfg_.run->run_dir->empty())
      throw ConfigError("run.resume=auto looks for the latest checkpoint in run.run_dir, which is not set");
    // A resumed run without run.run_dir continues in its checkpoint's directory.
    run_dir_ = !cfg_.run->run_dir->empty() ? std::filesystem::path(*cfg_.run->run_dir)
               : !resume.empty()           ? std::filesystem::absolute(resume).parent_path()
                                           : std::filesystem::path("runs") /
                                       (std::string(A::config_section.view()) + "-" + spec_.name + "-" +
                                        timestamp_for_path());
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    if (ec) throw Error("run.run_dir: cannot create '" + run_dir_.string() + "': " + ec.message());
    write_file_atomic(run_dir_ / "config.yaml", "# " + program_ + ", config hash " +
                                                    config_hash_hex(cfg_) + "\n" + to_yaml(cfg_));
    csv_ = MetricsCsv(run_dir_ / "metrics.csv");
    log_file_.open(run_dir_ / "training.log", std::ios::app);
    if (!log_file_) throw Error("run.run_dir: cannot write '" + (run_dir_ / "training.log").string() + "'");
    log_file_ << "==== " << timestamp_for_path() << " " << program_ << ", config hash " << config_hash_hex(cfg_)
              << "\n# resolved config\n" << to_yaml(cfg_) << "# end of config\n";
    if (cfg_.run->tensorboard) tb_ = TensorBoardWriter(run_dir_);
    gpu_ = std::make_unique<GpuMonitor>();
    notes_.push_back(gpu_->status());  // once, whether it found GPUs or not
    timer_cost_ = phase_timer_cost();
    auto style = *cfg_.run->progress;
    progress_ = Progress(style == ProgressMode::auto_ ? Progress::detect()
                         : style == ProgressMode::bar ? Progress::Style::bar
                         : style == ProgressMode::lines ? Progress::Style::lines
                                                        : Progress::Style::off);
    say(program_ + ": " + std::string(A::config_section.view()) + " on " + spec_.name +
                      ", " + std::to_string(*cfg_.env->num_envs) + " env(s), device " +
                      ctx_.device.str() + ", " + std::to_string(*cfg_.train->steps) +
                      " steps, config hash " + config_hash_hex(cfg_));
    for (const auto& n : notes_) say(n);
  }

  // A row of metrics.csv. With several ranks every rank takes part: episodes, recent
  // returns and the algorithm's metrics are reduced over the ranks, then rank 0 writes.
  void log_row() {
    ScopedPhase ph(times_, Phase::log);
    if (!A::on_policy && parallel_->world_size() > 1)  // on-policy runs merge them before each update
      venv_->sync_statistics([this](at::Tensor& t) { sum_over_ranks(*parallel_, t, ctx_.device); });
    log_step_ = env_steps_;
    logged_eval_step_ = eval_step_;
    const double wall = elapsed();
    const std::size_t k = std::min<std::size_t>(recent_.size(), 10);
    std::vector<double> sums{static_cast<double>(episodes_), static_cast<double>(k),
                             std::accumulate(recent_.end() - static_cast<std::ptrdiff_t>(k), recent_.end(), 0.0)};
    for (auto& [name, m] : metrics_) {
      sums.push_back(m.first);
      sums.push_back(m.second);
    }
    for (auto& [name, m] : metrics_) m = {0.0, 0};
    if (parallel_->world_size() > 1) {
      auto t = torch::from_blob(sums.data(), {static_cast<std::int64_t>(sums.size())}, at::kDouble);
      sum_over_ranks(*parallel_, t, ctx_.device);
    }
    if (!parallel_->is_main()) return;
    std::vector<std::pair<std::string, double>> row{
        {"env_steps", static_cast<double>(env_steps_)},
        {"updates", static_cast<double>(updates_)},
        {"wall_s", wall},
        {"env_steps_per_s", wall > 0 ? static_cast<double>(env_steps_ - first_step_) / wall : 0.0},
        {"episodes", sums[0]},
        {"recent_return", sums[1] > 0 ? sums[2] / sums[1] : NAN},
        {"eval_return", last_eval_.mean}};
    std::size_t i = 3;
    for (auto& [name, m] : metrics_) {
      row.emplace_back(name, sums[i + 1] > 0 ? sums[i] / sums[i + 1] : NAN);
      i += 2;
    }
    csv_.row(row, updates_ > 0);
    if (progress_.style() == Progress::Style::lines) show_progress(true);
    observe_row(row, wall);
  }

  // The TensorBoard scalars, training.log lines and timing table of one log row.
  void observe_row(const std::vector<std::pair<std::string, double>>& row, double wall) {
    const std::int64_t step = env_steps_;
    const std::string algo(A::config_section.view());
    for (const auto& [k, v] : row) {
      if (k == "env_steps" || k == "wall_s" || std::isnan(v)) continue;
      const std::string tag = k == "recent_return"     ? "return/recent"
                              : k == "eval_return"     ? "return/eval"
                              : k == "env_steps_per_s" ? "speed/env_steps_per_s"
                              : k == "updates" || k == "episodes" ? "progress/" + k
                                                                  : algo + "/" + k;
      tb_.scalar(tag, v, step);
    }
    if (wall > 0) tb_.scalar("speed/updates_per_s", static_cast<double>(updates_ - first_update_) / wall, step);
    if constexpr (requires { algo_->learning_rates(); })
      for (const auto& [name, lr] : algo_->learning_rates()) tb_.scalar("lr/" + name, lr, step);
    if constexpr (requires { algo_->flat_parameters(); })
      if (cfg_.run->tensorboard_histograms && tb_.is_open())
        for (const auto& [name, w] : algo_->flat_parameters()) {
          const at::Tensor c = w.detach().to(at::kCPU, at::kFloat).contiguous();
          const auto* data = static_cast<const float*>(c.data_ptr());
          tb_.histogram("weights/" + name, std::span<const float>(data, static_cast<std::size_t>(c.numel())), step);
        }
    std::string line = "step " + std::to_string(step) + ":";
    for (const auto& [k, v] : row) {
      char b[64];
      std::snprintf(b, sizeof b, " %s=%.6g", k.c_str(), v);
      line += b;
    }
    log_file_ << line << "\n";
    std::vector<std::string> extra;
    if (times_.enabled) {
      const auto d = times_.since(last_row_times_);
      last_row_times_ = times_;
      for (std::size_t p = 0; p < kPhaseNames.size(); ++p)
        tb_.scalar("time/" + std::string(kPhaseNames[p]), d.share(static_cast<Phase>(p)), step);
      if (d.total_seconds() > 0) extra.push_back("time: " + shares_line(d) + "\n  " + bottleneck(d, advice()));
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
      log_file_ << "  " << e << "\n";
      if (progress_.style() == Progress::Style::lines) std::printf("  %s\n", e.c_str());
    }
    log_file_.flush();
  }

  // A message for the user: on the terminal and in training.log (rank 0).
  void say(const std::string& m) {
    progress_.message(m);
    if (log_file_.is_open()) {
      log_file_ << m << "\n";
      log_file_.flush();
    }
  }

  void show_progress(bool force = false) {
    if (!parallel_->is_main() || progress_.style() != Progress::Style::bar) {
      if (!force) return;
    }
    progress_.show(ProgressState{env_steps_, *cfg_.train->steps, updates_, elapsed(), recent_return(),
                                 last_eval_.mean, gpu_line_},
                   force);
  }

  std::string summary_line() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "done: %lld env steps, %lld updates in %.1f s (%.0f steps/s); eval return %.1f "
                  "(best %.1f)",
                  static_cast<long long>(env_steps_), static_cast<long long>(updates_),
                  result_.wall_seconds, static_cast<double>(env_steps_ - first_step_) / result_.wall_seconds,
                  result_.final_eval_return, result_.best_eval_return);
    return buf;
  }

  void write_summary() {
    if (!parallel_->is_main()) return;
    const double wall = result_.wall_seconds;
    std::string j = "{\n";
    j += "  \"final_eval_return\": " + json_number(result_.final_eval_return) + ",\n";
    j += "  \"best_eval_return\": " + json_number(result_.best_eval_return) + ",\n";
    j += "  \"env_steps\": " + std::to_string(env_steps_) + ",\n";
    j += "  \"updates\": " + std::to_string(updates_) + ",\n";
    j += "  \"wall_seconds\": " + json_number(wall) + ",\n";
    j += "  \"env_steps_per_s\": " + json_number(static_cast<double>(env_steps_ - first_step_) / wall) + ",\n";
    j += "  \"updates_per_s\": " + json_number(static_cast<double>(updates_ - first_update_) / wall) + ",\n";
    j += "  \"phase_share\": {";
    for (std::size_t i = 0; i < kPhaseNames.size(); ++i)
      j += std::string(i ? ", " : "") + json_string(std::string(kPhaseNames[i])) + ": " +
           json_number(times_.share(static_cast<Phase>(i)));
    j += "},\n  \"phase_seconds\": {";
    for (std::size_t i = 0; i < kPhaseNames.size(); ++i)
      j += std::string(i ? ", " : "") + json_string(std::string(kPhaseNames[i])) + ": " +
           json_number(times_.seconds(static_cast<Phase>(i)));
    j += "},\n  \"bottleneck\": " + json_string(bottleneck(times_, advice())) + ",\n";
    j += "  \"timer_overhead\": " + json_number(timer_overhead()) + ",\n";
    j += "  \"world_size\": " + std::to_string(parallel_->world_size()) + ",\n";
    j += "  \"config_hash\": " + json_string(config_hash_hex(cfg_)) + ",\n";
    j += "  \"config\": {";
    bool first = true;
    for (const auto& [k, v] : flatten(cfg_)) {
      j += std::string(first ? "\n" : ",\n") + "    " + json_string(k) + ": " + json_string(v);
      first = false;
    }
    j += "\n  }\n}\n";
    write_file_atomic(run_dir_ / "summary.json", j);
  }

  Config cfg_;
  std::string program_;
  std::int64_t eval_step_ = -1;  ///< env steps at the last evaluation
  std::vector<std::string> notes_;  ///< said once when the run starts
  std::unique_ptr<P> parallel_;
  RunContext ctx_;
  std::unique_ptr<envs::VecEnvBase> venv_;
  std::shared_ptr<envs::NormalizeState> norm_;  ///< normalisation statistics (normalize.obs/reward)
  std::function<std::unique_ptr<envs::VecEnvBase>(int, std::uint64_t)> make_eval_env_;
  envs::EnvSpec spec_;
  at::Tensor action_scale_, action_offset_, action_low_, action_high_, obs_;
  std::unique_ptr<A> algo_;
  std::unique_ptr<B> buffer_;
  StepContext step_ctx_;
  Rng rng_;
  std::uint64_t eval_seed_ = 0;
  std::int64_t env_steps_ = 0, updates_ = 0, episodes_ = 0, since_update_ = 0;
  std::int64_t first_step_ = 0, first_update_ = 0;  ///< counters when this fit() began
  std::map<std::string, std::pair<double, int>> metrics_;
  std::deque<double> recent_;
  EvalResult last_eval_;
  FitResult result_;
  PhaseTimes times_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::filesystem::path run_dir_;
  std::filesystem::path resumed_from_;
  bool ready_ = false;     ///< every rank's buffer can give a batch (can_update)
  std::int64_t log_step_ = -1, logged_eval_step_ = -1;  ///< env steps at the last log row, and of the eval in it
  std::string sync_line_;  ///< what the last in-sync check found (several ranks)
  static constexpr const char* kRankStateFormat = "anvil Rank State v1";
  MetricsCsv csv_;
  Progress progress_;
  TensorBoardWriter tb_;
  std::ofstream log_file_;
  std::unique_ptr<GpuMonitor> gpu_;
  PhaseTimes last_row_times_;  ///< phase times at the last log row
  double timer_cost_ = 0;      ///< seconds one ScopedPhase costs here
  std::string gpu_line_;       ///< GPU utilisation for the progress bar
};

namespace detail {

/// Stands in for the Trainer of a rejected combination, so that after the one sentence
/// from `TrainerRules` the compiler has nothing else to complain about.
struct RejectedTrainer {
  struct Config {};
  template <class... T>
  explicit RejectedTrainer(T&&...) {}
  template <class... T>
  FitResult fit(T&&...) {
    return {};
  }
  template <class... T>
  void collect(T&&...) {}
  template <class... T>
  void update(T&&...) {}
  template <class... T>
  EvalResult evaluate(T&&...) {
    return {};
  }
};

template <class A, class B, class P, class X>
struct TrainerSelect {
  using type = std::conditional_t<TrainerRules<A, B, P, X>::ok, BasicTrainer<A, B, P, X>,
                                  RejectedTrainer>;
};

}  // namespace detail

/// The Trainer for Algorithm `A` learning from Buffer `B`, run by Parallelism `P` in
/// Precision `X`: `Trainer<SAC, UniformBuffer>`, `Trainer<SAC, PrioritizedBuffer, DDP<4>, BF16>`.
/// A combination that cannot work fails to compile with one sentence saying what to use.
template <class A, class B, class P = SingleDevice, class X = FP32>
using Trainer = typename detail::TrainerSelect<A, B, P, X>::type;

}  // namespace anvil
