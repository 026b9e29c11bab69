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
// The Trainer is prebuilt (anvil::compiled): this file compiles in seconds.
#include <anvil/compiled.hpp>
#include <anvil/envs/mujoco/manipulation.hpp>
#include <anvil/envs/python_env.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::MultiTaskSAC, anvil::UniformBuffer>;
  const auto cfg = anvil::start<Trainer>(argc, argv);
  const auto& env = *cfg.env;
  Trainer trainer(anvil::envs::python::is_python_id(*env.id)  // a multi-task env in Python (docs/python.md)
                      ? anvil::envs::python_env(*env.id, *env.kwargs, *env.workers)
                      : anvil::envs::AnyEnv(anvil::envs::mujoco::Manipulation{}),
                  cfg);
  trainer.fit();
}
