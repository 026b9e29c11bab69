#pragma once
/// @file
/// `anvil::compiled::Trainer<A, B[, P, X]>`: a Trainer whose code is compiled once, so that a
/// main using it compiles in seconds. It holds an `anvil::Trainer<A, B, P, X>` (built in
/// `train/compiled_trainer_impl.hpp`) and answers the calls a main makes; its `Config` is
/// that Trainer's, and `anvil::start<compiled::Trainer<...>>` reads the command line exactly
/// as `start<Trainer<...>>` does (same keys, `--help`, `--print-config`, `--multirun`, DDP).
///
/// Two ways to build a program that uses it:
///  - link the CMake target `anvil::compiled`: a library of the common Trainers, prebuilt
///    (`ANVIL_COMPILED_TRAINERS` below, for each of `ANVIL_COMPILED_ENVS`: SAC refuses the
///    discrete ones when the run starts, as a Trainer does); the main includes
///    `<anvil/compiled.hpp>` and none of torch's ATen or `torch/` headers (only a few of c10's
///    small ones). Another combination, or an env
///    of your own, is built in one translation unit of yours that includes
///    `train/compiled_trainer_impl.hpp` and says `ANVIL_COMPILED_TRAINER(...)` (else the link
///    fails naming the missing `compiled::Trainer` member);
///  - link only `anvil::anvil` (header-only): `<anvil/compiled.hpp>` then brings in the
///    implementation and the same main builds without the library, at a Trainer's full
///    compile cost.
///
/// For everything else a Trainer offers (hooks, `collect`/`update` step by step, the
/// algorithm), `full()` returns the Trainer itself, usable where its header is included.
/// Light header.

#include <filesystem>
#include <memory>
#include <string>

#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/sac_config.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/config.hpp>
#include <anvil/envs/env.hpp>
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
struct loop_of<PPO> {
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

  /// Builds the run (see `BasicTrainer`), for an env of a prebuilt type (or one built in
  /// a translation unit of the program: see file comment).
  template <envs::Env E>
  Trainer(const E& env, Config cfg, std::string program = {});
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  ~Trainer();

  /// Trains to the end (`BasicTrainer::fit`).
  FitResult fit();
  /// Mean return of `episodes` deterministic episodes (`BasicTrainer::evaluate`).
  EvalResult evaluate(int episodes);
  /// The latest recorded evaluation.
  [[nodiscard]] const EvalResult& last_evaluation() const noexcept;
  /// Writes / restores everything a resumed run needs (atomic; all or nothing).
  void save_checkpoint(const std::filesystem::path& file);
  void load_checkpoint(const std::filesystem::path& file);
  /// Writes the policy alone (`anvil::load_policy` reads it); an algorithm that exports no
  /// policy file (not `ExportsPolicy`) throws.
  void save_policy(const std::filesystem::path& file) const;
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

/// The Trainer types and envs the `anvil::compiled` library prebuilds, as X-macro lists:
/// `ANVIL_COMPILED_TRAINERS(M)` calls `M(A, B, P, X)` for each Trainer.
#define ANVIL_COMPILED_TRAINERS(M)                                                    \
  M(::anvil::SAC, ::anvil::UniformBuffer, ::anvil::SingleDevice, ::anvil::FP32)     \
  M(::anvil::SAC, ::anvil::PrioritizedBuffer, ::anvil::SingleDevice, ::anvil::FP32) \
  M(::anvil::SAC, ::anvil::UniformBuffer, ::anvil::SingleDevice, ::anvil::BF16)     \
  M(::anvil::SAC, ::anvil::PrioritizedBuffer, ::anvil::SingleDevice, ::anvil::BF16) \
  M(::anvil::PPO, ::anvil::RolloutBuffer, ::anvil::SingleDevice, ::anvil::FP32)
/// `ANVIL_COMPILED_ENVS(M, A, B, P, X)` calls `M(A, B, P, X, E)` for each env type `E` the
/// prebuilt Trainers are built for.
#define ANVIL_COMPILED_ENVS(M, A, B, P, X)            \
  M(A, B, P, X, ::anvil::envs::Pendulum)              \
  M(A, B, P, X, ::anvil::envs::MountainCarContinuous) \
  M(A, B, P, X, ::anvil::envs::CartPole)              \
  M(A, B, P, X, ::anvil::envs::Acrobot)

#ifdef ANVIL_COMPILED
// The library holds these: no translation unit of the program instantiates them again.
#define ANVIL_DETAIL_EXTERN_TRAINER(A, B, P, X) extern template class ::anvil::compiled::Trainer<A, B, P, X>;
ANVIL_COMPILED_TRAINERS(ANVIL_DETAIL_EXTERN_TRAINER)
#undef ANVIL_DETAIL_EXTERN_TRAINER
#endif

}  // namespace anvil
