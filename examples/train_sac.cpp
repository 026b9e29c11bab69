// SAC on any built-in env with continuous actions, chosen at run time:
// `train_sac --env.id=MountainCarContinuous-v0`, or an env in Python:
// `--env.id=python:my_module:make` (docs/python.md). Each built-in env's defaults come from
// examples/hyperparams/sac.yaml (RL Baselines3 Zoo's, where anvil has the same knobs);
// `--hyperparams=FILE` reads another file, and `--config` files and the command line
// override both. An env with discrete actions is refused with a message (use train_sac_discrete
// or train_ppo).
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/core/hyperparams.hpp>
#include <anvil/envs/registry.hpp>
#include <anvil/train/trainer.hpp>

#ifndef ANVIL_HYPERPARAMS_DIR
#define ANVIL_HYPERPARAMS_DIR "examples/hyperparams"
#endif

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
  auto args = anvil::with_hyperparameters(anvil::start(argc, argv), ANVIL_HYPERPARAMS_DIR "/sac.yaml", "Pendulum-v1");
  const auto cfg = anvil::start<Trainer>(args);
  anvil::envs::with_env(*cfg.env, [&](const auto& env) {
    Trainer trainer(env, cfg, "train_sac");
    trainer.fit();
  });
}
