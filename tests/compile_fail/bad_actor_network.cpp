// expect: BasicSAC<Actor, ...>: Actor must be a torch module holder
#include "common.hpp"

int main() { anvil::BasicSAC<anvil::nn::TwinQ> sac(anvil::envs::spec_of(anvil::envs::Pendulum{}), {}, {}); }
