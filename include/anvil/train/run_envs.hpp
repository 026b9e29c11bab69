#pragma once
/// @file
/// The envs of a run, made from the env a Trainer was given (`envs::AnyEnv`): this rank's
/// training envs, normalised when the config asks (`normalize.obs`, `normalize.reward`),
/// and the maker of evaluation envs, which normalise observations with the training
/// statistics, frozen. Not a template: compiled once, whatever the env.

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env_config.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/hooks/evaluation.hpp>

namespace anvil {

/// A run's envs (see file comment).
struct RunEnvs {
  std::unique_ptr<envs::VecEnvBase> training;
  std::shared_ptr<envs::NormalizeState> normalizer;  ///< null when the run does not normalise
  Evaluation::MakeEnvs evaluation;
  std::vector<std::string> notes;  ///< what the run should say about them
};

/// Rank `rank` of `world_size`'s envs: env i of rank r is env r * num_envs + i of the run
/// (envs with tasks are spread over them by it); seeds from `seed`.
inline RunEnvs make_run_envs(const envs::AnyEnv& env, const envs::VecEnvConfig& ecfg, const envs::NormalizeConfig& ncfg,
                             std::uint64_t seed, int rank, int world_size) {
  RunEnvs r;
  const std::int64_t n = ecfg.num_envs;
  r.training = envs::make_vec_env(env, ecfg, seed, rank * n, world_size * n);
  if (ncfg.obs && r.training->spec().agents.multi_agent())
    throw ConfigError("normalize.obs: " + r.training->spec().name +
                      " is a multi-agent env whose observation rows hold the agents' action masks and a first-step "
                      "flag, which normalising would break; normalise inside the env's observations instead "
                      "(normalize.reward is fine)");
  if (ncfg.obs || ncfg.reward) {
    // The return's discount is the algorithm's, which the loop gives the envs (or normalize.gamma).
    auto wrapped = std::make_unique<envs::NormalizedVecEnv>(std::move(r.training), ncfg, NAN);
    r.normalizer = wrapped->state();
    r.training = std::move(wrapped);
  }
  if (!env.note().empty()) r.notes.push_back(env.note());
  if (!r.training->saves_state())
    r.notes.push_back("checkpoints: " + r.training->spec().name +
                      "'s state cannot be saved (an env type neither trivially copyable nor with save_state, or an "
                      "env in Python), so checkpoints hold no env state (a resumed run starts new episodes)");
  r.evaluation = [env, norm = r.normalizer, ncfg, ecfg](int count_here, std::uint64_t s, int first, int count) {
    envs::VecEnvConfig c = ecfg;  // the same env (tasks included), count_here of them, stepped here
    c.num_envs = count_here;
    c.threads = 1;
    c.mode = envs::VecMode::sync;
    c.max_episode_steps = *ecfg.eval_max_episode_steps;  // the evaluation's horizon, not training's
    auto v = envs::make_vec_env(env, c, s, first, count);
    if (!norm) return v;
    return std::unique_ptr<envs::VecEnvBase>(
        std::make_unique<envs::NormalizedVecEnv>(std::move(v), ncfg, 0.99, norm, /*frozen=*/true));
  };
  return r;
}

}  // namespace anvil
