#pragma once
/// @file
/// `TrainerConfig<A, B, P, X, L>`: every knob of a run, one section per policy, keys
/// `<section>.<field>`; a Trainer's `Config`. Its sections are named through
/// `policy_config` (core/policy_config.hpp), so a program can build it, set its defaults and
/// pass it to a prebuilt Trainer without the policies' classes or torch
/// (`anvil/compiled.hpp`). Light header.

#include <concepts>
#include <array>
#include <string>
#include <string_view>

#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>
#include <anvil/core/type_name.hpp>
#include <anvil/envs/env_config.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/init_config.hpp>
#include <anvil/train/run_config.hpp>

namespace anvil {

/// The config of a Trainer of algorithm A, buffer B, parallelism P, precision X and loop L.
template <class A, class B, class P, class X, class L>
struct TrainerConfig {
  Section<"run", RunConfig> run;
  Section<policy_config<L>::section, policy_config_t<L>> train;
  Section<"env", envs::VecEnvConfig> env;
  Section<"normalize", envs::NormalizeConfig> normalize;
  Section<policy_config<A>::section, policy_config_t<A>> algorithm;
  Section<policy_config<B>::section, policy_config_t<B>> buffer;
  Section<policy_config<P>::section, policy_config_t<P>> parallel;
  Section<policy_config<X>::section, policy_config_t<X>> precision;
  Section<"init", InitConfig> init;

  /// What the config hash covers beside the fields (`config_hash`): the policy types, since
  /// FP32 and TF32 runs, say, have the same fields. A run's config.yaml, `--print-config`,
  /// summary.json and checkpoints all show this one hash.
  static constexpr std::array<std::string_view, 5> hashed_types() {
    return {type_name<A>(), type_name<B>(), type_name<P>(), type_name<X>(), type_name<L>()};
  }

  /// Rules across sections (needs the loop's class: called where the config is read).
  void validate() const {
    const auto s = L::settings(*train);
    if (s.unit == ClockUnit::env_steps && s.eval_interval > 0 && s.eval_interval < env->num_envs)
      throw ConfigError("train.eval_interval (" + std::to_string(s.eval_interval) +
                        ") is shorter than one step of env.num_envs (" + std::to_string(*env->num_envs) + ") envs");
  }
};

/// Whether every policy's light `policy_config` specialisation names its own `Config` (the
/// Trainer checks it where the policies are complete types).
template <class A, class B, class P, class X, class L>
inline constexpr bool light_configs_match =
    std::same_as<policy_config_t<A>, typename A::Config> && std::same_as<policy_config_t<B>, typename B::Config> &&
    std::same_as<policy_config_t<P>, typename P::Config> && std::same_as<policy_config_t<X>, typename X::Config> &&
    std::same_as<policy_config_t<L>, typename L::Config>;

}  // namespace anvil
