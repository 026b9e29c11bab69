// SAC on Pendulum with data-parallel training: started plainly, this program launches 2
// ranks of itself on this machine (Gloo on the CPU, NCCL on GPUs) and supervises them;
// --nproc_per_node, --num-gpus or --gpu-ids change how many (DDPAuto is DDP<0>: the
// number of ranks is decided at run time, where DDP<4> would fix it at 4).
// Under torchrun or a SLURM wrapper (RANK, WORLD_SIZE, ... set) it joins that world
// instead; with NNODES and NODE_RANK set it is one node of several. Each rank steps its own
// envs into its own buffer; every update averages the ranks' gradients.
#include <anvil/anvil.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::DDPAuto>;

  Trainer::Config defaults;  // as train_sac_pendulum; steps count all ranks' env steps
  defaults.train->steps = 20'000;
  defaults.train->eval_interval = 2'000;
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  defaults.algorithm->alpha_lr = 1e-3;
  defaults.parallel->nproc_per_node = 2;

  Trainer trainer(anvil::envs::Pendulum{}, anvil::parse_config(argc, argv), defaults);
  trainer.fit();
}
