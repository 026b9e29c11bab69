// PPO on Pendulum-v1 as benchmarks/vs_rltools.sh times it, whole process included: the same
// Trainer and defaults as examples/ppo_pendulum.cpp (the benchmark passes RLtools' settings
// on the command line), linked in the fast-start library order and ended by
// anvil::exit_fast (see benchmarks/timed_sac_pendulum.cpp).
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
  defaults.buffer->steps = 256;
  defaults.buffer->gae_lambda = 0.95;
  defaults.algorithm->gamma = 0.9;
  defaults.algorithm->lr = 1e-3;
  defaults.algorithm->epochs = 10;
  defaults.algorithm->minibatch_size = 64;
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
  anvil::exit_fast();  // the run's files are flushed first (anvil's flush registry)
}
