// expect: Trainer<Algorithm, Buffer, ...>: an Algorithm and a Buffer are in each other's slot
#include "common.hpp"

int main() { anvil::Trainer<anvil::UniformBuffer, anvil::SAC> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
