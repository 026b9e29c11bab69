// PPO on any built-in env, chosen at run time: `train_ppo --env.id=CartPole-v1`, or an env in
// Python: `--env.id=python:my_module:make` (docs/python.md). Each built-in env's
// defaults come from examples/hyperparams/ppo.yaml (RL Baselines3 Zoo's, where anvil has
// the same knobs); `--hyperparams=FILE` reads another file, and `--config` files and the
// command line override both. Switching env needs no rebuild.
// The Trainer is prebuilt (anvil::compiled) and the env comes through its door
// (envs::any_env), so this file compiles in seconds and one build trains every env.
#include <anvil/compiled.hpp>
#include <anvil/core/hyperparams.hpp>
#include <anvil/envs/registry.hpp>

#ifndef ANVIL_HYPERPARAMS_DIR
#define ANVIL_HYPERPARAMS_DIR "examples/hyperparams"
#endif

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::PPO, anvil::RolloutBuffer>;
  const auto args = anvil::with_hyperparameters(anvil::start(argc, argv), ANVIL_HYPERPARAMS_DIR "/ppo.yaml", "CartPole-v1");
  const auto cfg = anvil::start<Trainer>(args);
  Trainer trainer(anvil::envs::any_env(*cfg.env), cfg, "train_ppo");
  trainer.fit();
}
