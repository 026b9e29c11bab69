// Trainer<PPO, RolloutBuffer, DDP<2>> on CartPole, for tests/parallel/ddp_faults.sh: two
// ranks of 4 envs each (8 in all, as the single-process test), their gradients averaged,
// their observation statistics merged before each update, the KL early stop agreed on.
#include <anvil/algorithms/ppo.hpp>
#include <anvil/buffers/rollout_buffer.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/train/trainer.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::PPO, anvil::RolloutBuffer, anvil::DDP<2>>;
  Trainer::Config d;
  d.train->steps = 100'000;
  d.train->eval_interval = 20'000;
  d.env->num_envs = 4;
  d.normalize->obs = true;
  d.buffer->steps = 32;
  d.buffer->gae_lambda = 0.8;
  d.algorithm->gamma = 0.98;
  d.algorithm->lr = 1e-3;
  d.algorithm->epochs = 20;
  d.algorithm->minibatch_size = 128;
  d.algorithm->target_kl = 0.05;
  Trainer trainer(anvil::envs::CartPole{}, anvil::start<Trainer>(argc, argv, d));
  trainer.fit();
}
