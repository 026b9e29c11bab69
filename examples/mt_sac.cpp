// Multi-task SAC on the MuJoCo manipulation suite, MetaWorld's MT10 setting: one policy
// for ten tasks, a temperature per task, task-balanced batches, success rates per task.
// Tasks are chosen at run time (`--env.suite=mt10` or `--env.tasks=reach,push`), so one
// build serves single-task "worker" runs and multi-task runs. Start from a shipped config:
//
//   build/examples/mt_sac --config configs/mt10_cpu.yaml        (this machine class)
//   build/examples/mt_sac --config configs/reach_cpu.yaml       (one SAC worker on reach)
//   build/examples/mt_sac --env.id=python:my_module:make        (a multi-task env in Python, docs/python.md)
//
// For a multi-GPU server with DDP and BF16, examples/mt_sac_ddp.cpp with
// configs/mt10_server.yaml.
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/mujoco/manipulation.hpp>
#include <anvil/envs/python_env.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::MultiTaskSAC, anvil::UniformBuffer>;
  const auto cfg = anvil::start<Trainer>(argc, argv);
  if (anvil::envs::python::is_python_id(*cfg.env->id)) {  // a multi-task env in Python (docs/python.md)
    Trainer trainer(anvil::envs::python_env(*cfg.env->id, *cfg.env->kwargs, *cfg.env->workers), cfg);
    trainer.fit();
    return 0;
  }
  Trainer trainer(anvil::envs::mujoco::Manipulation{}, cfg);
  trainer.fit();
}
