#pragma once
/// @file
/// `envs::AnyEnv`: the one door every env takes into a Trainer. A Trainer's type does not
/// depend on its env's, so the env is type-erased here, at the boundary, in the caller's
/// translation unit:
///  - an `Env` type `E` becomes a maker of `EnvArray<E>` (envs/env_batch.hpp: the part of a
///    VecEnv that knows the type, light), which anvil's VecEnv (compiled once, with the
///    Trainer) steps, checks and batches; a prebuilt Trainer (`anvil::compiled`) thus trains
///    any env, a program's own included, and the program's translation unit compiles no torch;
///  - envs that come batched already (Python vector envs, a simulator with its own batching)
///    come as a maker of a `VecEnvBase` (envs/vec_env.hpp).
/// Observations cross the door as rows of float32 numbers (`EnvSpec::observation`); how other
/// dtypes and dict observations will cross it is in DESIGN (docs/design.md, "The env door").
/// Light header.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/env_config.hpp>

namespace anvil::envs {

class VecEnvBase;  // envs/vec_env.hpp

/// Any env, as a Trainer takes it (see file comment). Copyable; what it holds makes the
/// training envs and, as many times as asked, the evaluation envs.
class AnyEnv {
 public:
  /// Makes `cfg.num_envs` envs seeded from `seed`; `first` is the index of the first among
  /// all envs of the run (every rank's), `count` how many there are in all (0: these).
  using BatchMaker = std::function<std::unique_ptr<EnvBatch>(const VecEnvConfig& cfg, std::uint64_t seed,
                                                             std::int64_t first, std::int64_t count)>;
  /// The same for envs that come batched (a `VecEnvBase` of `cfg.num_envs` envs).
  using VecMaker = std::function<std::unique_ptr<VecEnvBase>(const VecEnvConfig& cfg, std::uint64_t seed,
                                                             std::int64_t first, std::int64_t count)>;

  /// Copies of `prototype`, stepped by anvil's VecEnv. Implicit, so a Trainer takes an env
  /// as it is: `Trainer t(MyEnv{}, cfg)`.
  /// (Defined below the class, not inline, so a library may hold it for an env type:
  /// `anvil::compiled` does for the built-in envs.)
  template <Env E>
  AnyEnv(const E& prototype);  // NOLINT(google-explicit-constructor): the door is meant to be walked through

  /// Envs that come batched: `make` builds them (`name` names them until they exist).
  AnyEnv(std::string name, VecMaker make) : name_(std::move(name)), vec_(std::move(make)) {
    if (!vec_) throw Error("AnyEnv '" + name_ + "': no maker of its envs");
  }

  /// Envs of a type anvil does not know (envs in Python, envs/python_env.hpp) behind the
  /// `EnvBatch` face, stepped, checked and batched by anvil's VecEnv like an `Env` type's.
  [[nodiscard]] static AnyEnv batched(std::string name, BatchMaker make) {
    if (!make) throw Error("AnyEnv '" + name + "': no maker of its envs");
    AnyEnv e;
    e.name_ = std::move(name);
    e.batch_ = std::move(make);
    return e;
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// What a run says of these envs when it starts (e.g. which Python steps them); may be empty.
  [[nodiscard]] const std::string& note() const noexcept { return note_; }
  AnyEnv& with_note(std::string note) {
    note_ = std::move(note);
    return *this;
  }
  /// The maker of per-type envs (empty for envs that come batched).
  [[nodiscard]] const BatchMaker& batch_maker() const noexcept { return batch_; }
  /// The maker of batched envs (empty for an `Env` type).
  [[nodiscard]] const VecMaker& vec_maker() const noexcept { return vec_; }

 private:
  AnyEnv() = default;
  std::string name_, note_;
  BatchMaker batch_;
  VecMaker vec_;
};

template <Env E>
AnyEnv::AnyEnv(const E& prototype)
    : name_(env_name(prototype)),
      batch_([prototype](const VecEnvConfig& c, std::uint64_t seed, std::int64_t first, std::int64_t count) {
        return std::unique_ptr<EnvBatch>(std::make_unique<EnvArray<E>>(prototype, c, seed, first, count));
      }) {}

}  // namespace anvil::envs
