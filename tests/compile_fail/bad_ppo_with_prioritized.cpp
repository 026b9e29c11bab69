// expect: Trainer: the Algorithm is on-policy (it learns only from fresh rollouts of its current policy) but the Buffer replays old transitions; use RolloutBuffer
#include "common.hpp"

int main() { anvil::Trainer<anvil::PPO, anvil::PrioritizedBuffer> t(anvil::envs::CartPole{}, anvil::Args{}); t.fit(); }
