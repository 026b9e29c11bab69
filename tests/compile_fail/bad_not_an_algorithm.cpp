// expect: Trainer's first argument is not an Algorithm
#include "common.hpp"

int main() { anvil::Trainer<int, anvil::UniformBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
