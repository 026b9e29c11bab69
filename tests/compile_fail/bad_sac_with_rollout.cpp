// expect: Trainer: the Algorithm is off-policy (it samples past transitions at random) but a RolloutBuffer keeps only the current rollout and clears it; use UniformBuffer or PrioritizedBuffer
#include "common.hpp"

int main() { anvil::Trainer<anvil::SAC, anvil::RolloutBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
