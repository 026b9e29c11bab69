// One rank per node: the multi-node test starts this twice with NNODES=2 and NODE_RANK=0/1.
#include <anvil/anvil.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::DDP<1>, anvil::FP32>;
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
  trainer.fit();
}
