// SAC on Pendulum with data-parallel training: started plainly, this program launches 2
// ranks of itself on this machine (Gloo on the CPU, NCCL on GPUs) and supervises them
// (`anvil::DDPAuto` instead of DDP<2> takes the number from --nproc_per_node, --num-gpus
// or --gpu-ids at run time).
// Under torchrun or a SLURM wrapper (RANK, WORLD_SIZE, ... set) it joins that world
// instead; with NNODES and NODE_RANK set it is one node of several. Each rank steps its own
// envs into its own buffer; every update averages the ranks' gradients.
#include <anvil/anvil.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::DDP<2>>;

  Trainer::Config defaults;  // as train_sac_pendulum; steps count all ranks' env steps
  defaults.train->steps = 20'000;
  defaults.train->eval_interval = 2'000;
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  defaults.algorithm->alpha_lr = 1e-3;

  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
}
