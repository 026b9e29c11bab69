// COMA on a cooperative multi-agent task chosen at run time, and its baselines on the same
// networks and schedule (--coma.critic=central_v or independent):
//
//   build/examples/coma --config configs/coma_mapping.yaml        (4 UAVs mapping a field, budget 14)
//   build/examples/coma --config configs/coma_spread.yaml         (simple spread, 3 agents, 25 steps)
//   build/examples/coma --env.id=Climbing --nproc_per_node=1      (a one-step matrix game)
//   build/examples/coma --env.id=python:my_module:make            (a PettingZoo parallel env, docs/python.md)
//
// --nproc_per_node=N trains N ranks with DDP (episodes collected
// per rank, gradients averaged).
#include <anvil/algorithms/coma.hpp>
#include <anvil/buffers/episode_buffer.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/envs/python_env.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::Trainer<anvil::COMA, anvil::EpisodeBuffer, anvil::DDPAuto>;
  auto cfg = anvil::start<Trainer>(argc, argv);
  if (cfg.env->id->empty()) cfg.env->id = "Mapping";
  if (anvil::envs::python::is_python_id(*cfg.env->id)) {  // a PettingZoo-style env in Python (docs/python.md)
    Trainer trainer(anvil::envs::python_env(*cfg.env->id, *cfg.env->kwargs, *cfg.env->workers), cfg, "coma");
    trainer.fit();
    return 0;
  }
  anvil::envs::with_team_env(*cfg.env->id, [&](const auto& env) {
    Trainer trainer(env, cfg, "coma");
    trainer.fit();
  });
}
