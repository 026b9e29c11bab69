// Multi-task SAC on the MuJoCo manipulation suite as our users run it on a multi-GPU
// server: one process per GPU (DDPAuto: as many ranks as --num-gpus, --gpu-ids or
// --nproc_per_node say; or under torchrun), BF16 autocast. Start from the shipped config:
//
//   build/examples/mt_sac_ddp --config configs/mt10_server.yaml --num-gpus 4
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/mujoco/manipulation.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::MultiTaskSAC, anvil::UniformBuffer, anvil::DDPAuto, anvil::BF16>;
  Trainer trainer(anvil::envs::mujoco::Manipulation{}, anvil::start<Trainer>(argc, argv));
  trainer.fit();
}
