#pragma once
/// @file
/// `anvil::compiled::Trainer<A, B[, P, X]>`: a Trainer whose code is compiled once, so that a
/// main using it compiles in seconds. It holds an `anvil::Trainer<A, B, P, X>` (built in
/// `train/compiled_trainer_impl.hpp`) and answers the calls a main makes; its `Config` is
/// that Trainer's, and `anvil::start<compiled::Trainer<...>>` reads the command line exactly
/// as `start<Trainer<...>>` does (same keys, `--help`, `--print-config`, `--multirun`, DDP).
///
/// It trains any env: the env comes through the one door (`envs::AnyEnv`,
/// envs/any_env.hpp), which wraps a program's own env type in the program's translation unit
/// without torch. A main that drives the loop itself has the step-by-step calls (`begin`,
/// `collect`, `update`, `evaluate`, `record_evaluation`, `log`, `save_checkpoint`, `finish`).
///
/// Two ways to build a program that uses it:
///  - link the CMake target `anvil::compiled`: a library of the common Trainers, prebuilt
///    (the list `ANVIL_PREBUILT_TRAINERS` in anvil's CMakeLists.txt, and any in the cache
///    variable `ANVIL_EXTRA_PREBUILT_TRAINERS`); the main includes
///    `<anvil/compiled.hpp>` and none of torch's ATen or `torch/` headers (only a few of c10's
///    small ones). Another combination is built in one translation unit of yours that
///    includes `train/compiled_trainer_impl.hpp` and says `ANVIL_COMPILED_TRAINER(...)`
///    (else the link fails naming the missing `compiled::Trainer` member);
///  - link only `anvil::anvil` (header-only): `<anvil/compiled.hpp>` then brings in the
///    implementation and the same main builds without the library, at a Trainer's full
///    compile cost.
///
/// For everything else a Trainer offers (hooks, the algorithm, the buffer), `full()` returns
/// the Trainer itself, usable where its header is included. Light header.

#include <filesystem>
#include <memory>
#include <string>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/sac_config.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/train/hooks/results.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/trainer_config.hpp>

namespace anvil {

template <class A, class B, class P, class X, class L>
class BasicTrainer;  // train/trainer.hpp

namespace compiled {

/// The loop an algorithm trains in, named without the algorithm's class (the built-in
/// algorithms the library prebuilds; `anvil::default_loop_t` in general).
template <class A>
struct loop_of;
template <bool kMultiTask>
struct loop_of<BasicSAC<nn::GaussianActor, nn::TwinQ, kMultiTask>> {
  using type = OffPolicyLoop;
};
template <>
struct loop_of<DiscreteSAC> {
  using type = OffPolicyLoop;
};
template <>
struct loop_of<PPO> {
  using type = OnPolicyLoop;
};
template <>
struct loop_of<RecurrentPPO> {
  using type = OnPolicyLoop;
};

/// A Trainer compiled once (see file comment).
template <class A, class B, class P = SingleDevice, class X = FP32, class L = typename loop_of<A>::type>
class Trainer {
 public:
  using Algorithm = A;
  using Buffer = B;
  using Parallelism = P;
  using Precision = X;
  using Loop = L;
  using Config = TrainerConfig<A, B, P, X, L>;
  /// The Trainer it holds (complete where train/trainer.hpp is included).
  using Full = BasicTrainer<A, B, P, X, L>;
  /// `anvil::start<compiled::Trainer<...>>` calls `start_config` (train/start.hpp).
  static constexpr bool prebuilt = true;

  /// `anvil::start<Full>(args, defaults)`, compiled once: the config from the command line
  /// over `defaults`; answers `--help`, `--print-config` and `--multirun`, reports bad input
  /// (exit 2) and starts the ranks of a DDP run.
  static Config start_config(const Args& args, Config defaults);
  /// The config from `args` over `defaults` for a caller that is not a main (the Python
  /// module): `start_config`'s reading, resume included, but bad input throws ConfigError
  /// (its message is the line a main prints) and nothing prints, exits or starts ranks.
  static Config configure(const Args& args, Config defaults);
  /// What `--help` prints for this Trainer's config over `defaults`.
  static std::string help(const std::string& program, const Config& defaults);

  /// Builds the run on `env` (any env: see file comment, and `BasicTrainer`).
  Trainer(const envs::AnyEnv& env, Config cfg, std::string program = {});
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  ~Trainer();

  /// Trains to the end (`BasicTrainer::fit`).
  FitResult fit();
  /// For a main that runs its own loop (`BasicTrainer`'s calls of the same names): opens
  /// the run (and resumes when asked); steps the envs until `n` more env steps are stored;
  /// makes `n` gradient updates; writes a row of metrics; ends the run.
  void begin();
  void collect(std::int64_t n);
  void update(int n);
  void log();
  FitResult finish();
  /// Mean return of `episodes` deterministic episodes (`BasicTrainer::evaluate`).
  EvalResult evaluate(int episodes);
  /// Makes `r` the run's latest evaluation (in the next log row, summary.json, the best).
  void record_evaluation(const EvalResult& r);
  /// The latest recorded evaluation.
  [[nodiscard]] const EvalResult& last_evaluation() const noexcept;
  /// The run's clock.
  [[nodiscard]] std::int64_t env_steps() const noexcept;
  [[nodiscard]] std::int64_t updates() const noexcept;
  /// Writes / restores everything a resumed run needs (atomic; all or nothing).
  void save_checkpoint(const std::filesystem::path& file);
  void load_checkpoint(const std::filesystem::path& file);
  /// Writes the policy alone (`anvil::load_policy` reads it); an algorithm that exports no
  /// policy file (not `ExportsPolicy`) throws.
  void save_policy(const std::filesystem::path& file) const;
  /// Writes the policy files into `dir` (policy.safetensors; policy.bin where the algorithm
  /// has one); an algorithm with no policy file throws.
  void export_policy(const std::filesystem::path& dir) const;
  /// Where the run's time went so far, by phase (act, env, update, ...; observe/timers.hpp).
  [[nodiscard]] const PhaseTimes& times() const noexcept;
  /// The device the run trains on, as torch names it ("cpu", "cuda:0").
  [[nodiscard]] std::string device() const;
  /// The resolved config the run uses.
  [[nodiscard]] const Config& config() const noexcept;
  /// Where the run writes its files.
  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept;

  /// The Trainer itself, for everything else.
  [[nodiscard]] Full& full() noexcept { return *impl_; }
  [[nodiscard]] const Full& full() const noexcept { return *impl_; }

 private:
  std::unique_ptr<Full> impl_;
};

}  // namespace compiled

}  // namespace anvil

#if defined(ANVIL_COMPILED) && __has_include(<anvil_compiled/trainers.hpp>)
// Generated by CMake from ANVIL_PREBUILT_TRAINERS: `extern template` of each Trainer the
// `anvil::compiled` library holds, so no translation unit of a program builds one again.
#include <anvil_compiled/trainers.hpp>
#endif
