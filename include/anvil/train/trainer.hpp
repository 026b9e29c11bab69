#pragma once
/// @file
/// `anvil::Trainer<Algorithm, Buffer, Parallelism, Precision[, Loop]>`: the host whose policy
/// slots read as a sentence. It builds a run's parts from its config (the ranks and device,
/// the envs and their collector, the algorithm, the buffer, the step context, the loop its
/// algorithm's data regime calls for, the state sections) and hands them to a `Run`
/// (train/run.hpp), which drives the loop and fires the hooks on its clock. `fit()` runs it
/// all; a custom main may call the steps itself (`begin`, `collect`, `update`, `evaluate`,
/// `log`, `save_checkpoint`, `finish`).

#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/policy.hpp>
#include <anvil/core/agent_memory.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/state.hpp>
#include <anvil/core/type_name.hpp>
#include <anvil/data/step_collector.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/observe/update_metrics.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/hooks/evaluation.hpp>
#include <anvil/train/hooks/metrics.hpp>
#include <anvil/train/loops/episodic.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/off_policy.hpp>
#include <anvil/train/loops/offline.hpp>
#include <anvil/train/loops/on_policy.hpp>
#include <anvil/train/process_settings.hpp>
#include <anvil/train/run.hpp>
#include <anvil/train/run_envs.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer_config.hpp>
#include <anvil/train/trainer_parts.hpp>
#include <anvil/train/trainer_select.hpp>

namespace anvil {

/// The Trainer for a valid combination of policies (see `Trainer`).
/// @tparam A an `Algorithm` (SAC, PPO, ...)
/// @tparam B a `Buffer` the algorithm learns from (UniformBuffer, ...)
/// @tparam P a `Parallelism` policy (SingleDevice, DDP<N>)
/// @tparam X a `Precision` policy (FP32, TF32, BF16, FP16)
/// @tparam L a `Loop` (default: the one the algorithm's data regime calls for)
template <class A, class B, class P, class X, class L>
class BasicTrainer {
 public:
  using Algorithm = A;
  using Buffer = B;
  using Parallelism = P;
  using Precision = X;
  using Loop = L;
  using Runner = typename L::template Runner<A, B>;

  /// Every knob of a run, one section per policy; keys are `<section>.<field>`.
  using Config = TrainerConfig<A, B, P, X, L>;
  static_assert(light_configs_match<A, B, P, X, L>,
                "policy_config<T> names another config than T::Config: a light header's specialisation is stale");

  /// Builds the run on `env` (any `envs::Env` type, or envs that come batched: see
  /// envs/any_env.hpp) from a typed config (validated here; throws ConfigError). With DDP<N>
  /// the process must be a rank: `anvil::start` launches them.
  BasicTrainer(const envs::AnyEnv& env, Config cfg, std::string program = {}) : cfg_(validated(std::move(cfg))) {
    parallel_ = std::make_unique<P>(*cfg_.parallel);
    const auto device = resolve_device(cfg_.run->device, parallel_->device_index());
    parallel_->connect(device);
    const PrecisionSettings precision = X::settings(*cfg_.precision);
    ctx_ = run_context(device, cfg_.run->seed, parallel_->rank(), parallel_->world_size(), L::settings(*cfg_.train), precision);
    ranks_ = Ranks(*parallel_, ctx_.device);
    auto notes = apply_process_settings(cfg_.run->threads, precision, ctx_, threads(), cfg_.run->matmul);
    auto envs = make_run_envs(env, *cfg_.env, *cfg_.normalize, ctx_.seed_for(Stream::env), ctx_.rank, ctx_.world_size);
    norm_ = envs.normalizer;
    notes.insert(notes.end(), envs.notes.begin(), envs.notes.end());
    collector_ = std::make_unique<StepCollector>(std::move(envs.training), times_);
    collector_->count_steps_from(&clock_.env_steps);
    const auto images = image_note(collector_->spec(), ReadsImages<A>, A::config_section.view());
    algo_ = std::make_unique<A>(collector_->spec(), *cfg_.algorithm, ctx_);
    if (!cfg_.init->weights->empty() && !resumes_a_checkpoint(*cfg_.run)) notes.push_back(warm_start_actor());
    gradients_ = describe_gradients(gradient_paths(), A::config_section.view(), precision);
    notes.push_back("gradients: " + gradients_);
    if (images) notes.push_back(*images);
    buffer_ = std::make_unique<B>(collector_->spec(), *cfg_.buffer, ctx_);
    bool all_reduce_in_graph = false;
    if constexpr (requires { parallel_->all_reduce_in_graph(); }) all_reduce_in_graph = parallel_->all_reduce_in_graph();
    step_ctx_ = StepContext(step_options(ctx_, precision, threads(), *cfg_.run, times_,
                                         [p = parallel_.get()](std::vector<at::Tensor>& g) { p->all_reduce_mean(g); },
                                         all_reduce_in_graph));
    if (ctx_.device.is_cuda() && cuda::kCudaGraphs) notes.push_back("cuda graphs: " + cuda_graph_note(*algo_, step_ctx_));
    runner_ = std::make_unique<Runner>(
        *cfg_.train, LoopParts<A, B>{*algo_, *buffer_, step_ctx_, *collector_, clock_, ranks_, times_, metrics_});
    runner_->begin();
    control_ = std::make_unique<LoopControlOf<Runner>>(*runner_);
    evaluation_ = Evaluation(std::move(envs.evaluation), ctx_.seed_for(Stream::eval_env), ranks_, &times_,
                             collector_->groups(), collector_->envs().reports_success());
    torch_rng_ = TorchGenerators(ctx_.device);
    add_sections();
    run_ = std::make_unique<Run>(setup(std::move(program), std::move(notes)), parts());
    run_->sync_from_main();  // every rank starts from rank 0's networks and optimizer state
  }

  BasicTrainer(const BasicTrainer&) = delete;
  BasicTrainer& operator=(const BasicTrainer&) = delete;

  /// Trains until the loop is done (`train.steps`): iterations, with evaluations, log rows
  /// and checkpoints on the clock. The same as `begin()`, the loop, then `finish()`.
  FitResult fit() { return run_->fit(); }
  /// For a main that runs its own loop: opens the run directory, resumes when `run.resume`
  /// asks, and gives every rank rank 0's state. Call it once before collecting.
  void begin() { run_->begin(); }
  /// Ends a run begun with `begin()`: a last evaluation, log row and checkpoint, the timing
  /// verdict and summary.json.
  FitResult finish() { return run_->finish(); }
  /// A row of metrics now (with several ranks, every rank must call it).
  void log() { run_->log(); }
  /// Mean return of `episodes` deterministic episodes (of the average policy with `train.ema_decay`).
  EvalResult evaluate(int episodes) { return run_->evaluate(episodes); }
  /// The latest recorded evaluation (with each task's return and success rate where there are).
  [[nodiscard]] const EvalResult& last_evaluation() const noexcept { return evaluation_.last(); }
  /// Makes `r` the run's latest evaluation (in the next log row, summary.json, the best).
  void record_evaluation(const EvalResult& r) { run_->record_evaluation(r); }

  /// Steps the envs until at least `n` more env steps are stored (a step loop).
  void collect(std::int64_t n) requires StepwiseLoop<Runner> { runner_->collect(n); }
  /// `n` gradient updates, each on a fresh batch (a step loop).
  void update(int n) requires StepwiseLoop<Runner> { runner_->update(n); }

  /// Writes every state section a resumed run needs (and the buffer with `run.checkpoint_buffer`). Atomic.
  void save_checkpoint(const std::filesystem::path& file) { run_->save_checkpoint(file); }
  /// Restores what `save_checkpoint` wrote (all or nothing; the error names what differs).
  void load_checkpoint(const std::filesystem::path& file) { run_->load_checkpoint(file); }

  /// Writes the policy alone (`anvil::load_policy` reads it back without a trainer): the
  /// averaged weights when `train.ema_decay` is on, the env's action bounds, and the
  /// observation normaliser's statistics with `normalize.obs`. Atomic. A policy file named
  /// `*.bin` of a Gaussian actor gets `*.safetensors` beside it (`write_policy_safetensors`).
  void save_policy(const std::filesystem::path& file) const
    requires ExportsPolicy<A>
  {
    write_policy(file, policy_file_parts(*collector_, norm_.get(), *cfg_.normalize),
                 [this](BinaryWriter& w) { algo_->save_policy(w); });
    // and the same policy as safetensors beside it, for PyTorch (anvil.load_policy)
    if (file.extension() == ".bin" && loadable_policy_kind(policy_kind(file)))
      write_policy_safetensors(load_policy(file), std::filesystem::path(file).replace_extension(".safetensors"));
  }

  /// Writes the policy files into `dir`: policy.safetensors (for PyTorch: `anvil.load_policy`)
  /// and, for an algorithm with one, policy.bin (`anvil::load_policy`); the averaged weights
  /// when `train.ema_decay` is on (the directory is made if need be). A run writes them into
  /// its directory with each checkpoint and at its end; `run.export` writes those of any
  /// checkpoint.
  void export_policy(const std::filesystem::path& dir) const
    requires ExportsPolicy<A> || ExportsTensors<A>
  {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("export_policy: cannot create the directory " + dir.string() + ": " + ec.message());
    if constexpr (ExportsPolicy<A>) save_policy(dir / "policy.bin");  // a Gaussian actor's safetensors beside it
    if constexpr (ExportsTensors<A>) {
      auto tensors = [this] { return algo_->policy_tensors(); };
      PolicyTensors t;
      if constexpr (AveragesPolicy<A>) t = runner_->settings().ema_decay > 0 ? algo_->with_ema_weights(tensors) : tensors();
      else t = tensors();
      write_policy_tensors(dir / "policy.safetensors", std::move(t), policy_file_parts(*collector_, norm_.get(), *cfg_.normalize));
    }
  }

  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  /// The run's config hash: its fields and its policy types (FP32 and TF32 runs differ).
  [[nodiscard]] const std::string& config_hash() const noexcept { return run_->config_hash(); }
  [[nodiscard]] A& algorithm() noexcept { return *algo_; }
  [[nodiscard]] B& buffer() noexcept { return *buffer_; }
  [[nodiscard]] P& parallelism() noexcept { return *parallel_; }
  /// The loop's runner (e.g. `loop().collect_rollout()` for an on-policy custom main).
  [[nodiscard]] Runner& loop() noexcept { return *runner_; }
  [[nodiscard]] StepCollector& collector() noexcept { return *collector_; }
  [[nodiscard]] const RunContext& context() const noexcept { return ctx_; }
  /// The step context the algorithm's updates go through (its loss scaler under FP16).
  [[nodiscard]] StepContext& step_context() noexcept { return step_ctx_; }
  [[nodiscard]] const Clock& clock() const noexcept { return clock_; }
  [[nodiscard]] std::int64_t env_steps() const noexcept { return clock_.env_steps; }
  [[nodiscard]] std::int64_t updates() const noexcept { return clock_.updates; }
  [[nodiscard]] const PhaseTimes& times() const noexcept { return times_; }
  /// The names of the sections of this run's state (what a checkpoint holds).
  [[nodiscard]] std::vector<std::string> state_sections() const { return state_.names(); }
  /// The observations' and returns' running statistics (null when the run does not normalise).
  [[nodiscard]] const envs::NormalizeState* normalizer() const noexcept { return norm_.get(); }
  /// Returns of the most recent training episodes (up to 100).
  [[nodiscard]] const std::deque<double>& recent_returns() const noexcept { return collector_->episodes().recent(); }
  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_->run_dir(); }
  /// The phase timers' own share of the run so far (calls x cost of one / wall time).
  [[nodiscard]] double timer_overhead() const { return run_->timer_overhead(); }
  /// What the run says once when it starts (world, precision and BLAS settings), one line each.
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return run_->notes(); }
  /// The checkpoint this run continued from (empty when it started afresh).
  [[nodiscard]] const std::filesystem::path& resumed_from() const noexcept { return run_->resumed_from(); }
  /// What the run's timing verdict suggests for each kind of bound, in its config keys.
  [[nodiscard]] BottleneckAdvice advice() const { return run_->advice(); }

 private:
  // The actor's weights from `init.weights` (anvil::WarmStarts): the run's note on them.
  std::string warm_start_actor() {
    if constexpr (WarmStarts<A>)
      return warm_start(*cfg_.init->weights, algo_->policy_parameters(), "the " + std::string(A::config_section.view()) + " actor");
    else
      throw ConfigError("init.weights: " + std::string(A::config_section.view()) +
                        " has no acting network that starts from a file (anvil::WarmStarts)");
  }
  // The algorithm's hand-written gradient passes (anvil::DescribesGradients), else none.
  std::vector<std::pair<std::string, std::string>> gradient_paths() const {
    if constexpr (DescribesGradients<A>) return algo_->gradient_paths();
    else return {};
  }

  // Threads for an update's independent parts (`run.update_threads`; 0: by the cores this
  // rank's node gives each of its ranks).
  int threads() const {
    if constexpr (KnowsLocalWorld<P>) return update_threads(cfg_.run->update_threads, parallel_->world().local_world_size);
    else return update_threads(cfg_.run->update_threads, parallel_->world_size());
  }

  // The run's state, in named sections (core/state.hpp): checkpoints hold them all; the
  // shared ones go from rank 0 to the others; the checked ones must be bitwise the same.
  void add_sections() {
    state_.add("clock", clock_, Scope::shared);
    state_.add("loop", *runner_, Scope::shared);
    state_.add(std::string(A::config_section.view()), *algo_, Scope::checked);
    state_.add("step_context", step_ctx_, Scope::checked);
    state_.add("evaluation", evaluation_, Scope::shared);
    if (norm_) state_.add("normalizer", *norm_, Scope::shared);
    state_.add("envs", collector_->envs());
    state_.add("episodes", collector_->episodes());
    if constexpr (CarriesMemory<A>) state_.add("memory", collector_->memory());  // per rank, like the envs
    state_.add("metrics", metrics_);
    state_.add("torch_rng", torch_rng_);
    // Demonstrations are read again from their file: only the loader's position is state,
    // and it belongs in every checkpoint.
    if constexpr (ReadsDemonstrations<B>) state_.add(std::string(B::config_section.view()), *buffer_);
    else buffer_state_.add(std::string(B::config_section.view()), *buffer_);
  }

  Run::Setup setup(std::string program, std::vector<std::string> notes) const {
    // The config hash covers the policy types too (TrainerConfig::hashed_types).
    return run_setup(*cfg_.run, std::move(program), std::string(A::config_section.view()), std::string(X::name),
                     *collector_, ctx_.device, config_hash_hex(cfg_), to_yaml(cfg_), flatten(cfg_),
                     acting_keys(cfg_), "world: " + parallel_->describe(), std::move(notes),
                     {{"algorithm", std::string(type_name<A>())}, {"buffer", std::string(type_name<B>())},
                      {"parallelism", std::string(type_name<P>())}, {"precision", std::string(type_name<X>())},
                      {"loop", std::string(type_name<L>())}, {"gradients", gradients_}});
  }

  Run::Parts parts() {
    Run::Parts p{&clock_,  &ranks_,        &times_,        collector_.get(), &metrics_,
                 &state_, &buffer_state_, control_.get(), &evaluation_,     {}, {}, {}};
    p.evaluate = [this](int n) {
      // A recurrent policy acts from a memory of its own for the evaluation's envs, fresh
      // at each evaluation (each env's first episode is the one counted).
      auto memory = std::make_shared<AgentMemory>();
      auto act = [this, memory](const at::Tensor& obs) {
        if constexpr (CarriesMemory<A>) return collector_->to_env(algo_->act(obs, ActMode::deterministic, *memory));
        else return collector_->to_env(algo_->act(obs, ActMode::deterministic));
      };
      if constexpr (AveragesPolicy<A>)
        if (runner_->settings().ema_decay > 0)
          return algo_->with_ema_weights([&] { return evaluation_.run(act, n); });
      return evaluation_.run(act, n);
    };
    if constexpr (ExportsPolicy<A> || ExportsTensors<A>)
      p.export_policy = [this](const std::filesystem::path& dir) { export_policy(dir); };
    if constexpr (ReportsLearningRates<A>) p.log_sources.learning_rates = [this] { return algo_->learning_rates(); };
    if constexpr (ExposesWeights<A>) p.log_sources.weights = [this] { return algo_->flat_parameters(); };
    return p;
  }

  Config cfg_;
  std::unique_ptr<P> parallel_;
  RunContext ctx_;
  Ranks ranks_;
  PhaseTimes times_;
  Clock clock_;
  std::unique_ptr<StepCollector> collector_;
  std::shared_ptr<envs::NormalizeState> norm_;  ///< normalisation statistics (normalize.obs/reward)
  std::unique_ptr<A> algo_;
  std::string gradients_;  // how the networks take their gradients (the run's "gradients:" line)
  std::unique_ptr<B> buffer_;
  StepContext step_ctx_;
  UpdateMetrics metrics_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<LoopControl> control_;
  Evaluation evaluation_;
  TorchGenerators torch_rng_;
  StateSections state_, buffer_state_;
  std::unique_ptr<Run> run_;
};

}  // namespace anvil
