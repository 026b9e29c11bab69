// PPO balances CartPole-v1 (the maximum return is 500) in about 100,000 env steps with
// 8 envs, on the CPU in well under a minute. Discrete actions, a categorical policy.
// Hyperparameters: RL Baselines3 Zoo's for CartPole-v1 (Raffin 2020, hyperparams/ppo.yml).
// Every field can be overridden: `ppo_cartpole --help` lists them.
// The Trainer is prebuilt (anvil::compiled): this file compiles in seconds.
#include <anvil/compiled.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::PPO, anvil::RolloutBuffer>;

  Trainer::Config defaults;
  defaults.train->steps = 100'000;
  defaults.train->eval_interval = 10'000;
  defaults.env->num_envs = 8;
  defaults.buffer->steps = 32;        // a rollout is 32 steps x 8 envs = 256 rows
  defaults.buffer->gae_lambda = 0.8;
  defaults.algorithm->gamma = 0.98;
  defaults.algorithm->lr = 1e-3;      // annealed linearly to 0
  defaults.algorithm->epochs = 20;
  defaults.algorithm->minibatch_size = 256;

  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(anvil::envs::CartPole{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
}
