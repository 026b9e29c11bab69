// The main job: SAC learns to swing up and balance Pendulum-v1 on the CPU in under 20,000
// env steps. Every field can be overridden: `train_sac_pendulum --help` lists them.
// The Trainer is prebuilt (anvil::compiled): this file compiles in seconds, without torch's
// headers. Linked with anvil::anvil alone, the same file builds header-only.
#include <anvil/compiled.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;

  Trainer::Config defaults;  // Pendulum needs little: a short run and a faster learning rate
  defaults.train->steps = 20'000;
  defaults.train->eval_interval = 2'000;
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  defaults.algorithm->alpha_lr = 1e-3;

  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
}
