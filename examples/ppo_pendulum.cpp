// PPO swings up and balances Pendulum-v1, the harder, continuous case for an on-policy
// method: a Gaussian policy with a state-independent log std, observations normalised by
// their running mean and variance, rewards by the running spread of the return (both
// saved in checkpoints, observations frozen for evaluation). Reaches -400 or better within
// 1,000,000 env steps; benchmarks/RESULTS.md has a run's figures.
//
// Settings follow RL Baselines3 Zoo's PPO for Pendulum-v1 (Raffin 2020, hyperparams/ppo.yml:
// normalisation, gamma 0.9, lambda 0.95, 10 epochs, Adam 1e-3) without its state-dependent
// exploration, with 8 envs of 256 steps per rollout.
// Every field can be overridden: `ppo_pendulum --help` lists them.
// The Trainer is prebuilt (anvil::compiled): this file compiles in seconds.
#include <anvil/compiled.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::PPO, anvil::RolloutBuffer>;

  Trainer::Config defaults;
  defaults.train->steps = 1'000'000;
  defaults.train->eval_interval = 50'000;
  defaults.run->log_interval = 20'000;
  defaults.run->checkpoint_interval = 100'000;
  defaults.env->num_envs = 8;
  defaults.normalize->obs = true;
  defaults.normalize->reward = true;
  defaults.buffer->steps = 256;       // a rollout is 256 steps x 8 envs = 2048 rows
  defaults.buffer->gae_lambda = 0.95;
  defaults.algorithm->gamma = 0.9;
  defaults.algorithm->lr = 1e-3;      // annealed linearly to 0
  defaults.algorithm->epochs = 10;
  defaults.algorithm->minibatch_size = 64;

  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
}
