// Discrete SAC (Christodoulou 2019) on any built-in env with discrete actions, chosen at run
// time: `train_sac_discrete --env.id=Acrobot-v1`, or an env in Python:
// `--env.id=python:my_module:make` (docs/python.md). Each built-in env's defaults come from
// examples/hyperparams/sac_discrete.yaml; `--hyperparams=FILE` reads another file, and
// `--config` files and the command line override both. An env with continuous actions is
// refused with a message (use train_sac).
// The Trainer is prebuilt (anvil::compiled) and the env comes through its door
// (envs::any_env), so this file compiles in seconds and one build trains every env.
#include <anvil/compiled.hpp>
#include <anvil/core/hyperparams.hpp>
#include <anvil/envs/registry.hpp>

#ifndef ANVIL_HYPERPARAMS_DIR
#define ANVIL_HYPERPARAMS_DIR "examples/hyperparams"
#endif

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::DiscreteSAC, anvil::UniformBuffer>;
  const auto args = anvil::with_hyperparameters(anvil::start(argc, argv), ANVIL_HYPERPARAMS_DIR "/sac_discrete.yaml", "CartPole-v1");
  const auto cfg = anvil::start<Trainer>(args);
  Trainer trainer(anvil::envs::any_env(*cfg.env), cfg, "train_sac_discrete");
  trainer.fit();
}
