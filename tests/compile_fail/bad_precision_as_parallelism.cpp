// expect: Trainer's third argument is not a Parallelism policy: use SingleDevice or DDP<N>
#include "common.hpp"

int main() { anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::BF16> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
