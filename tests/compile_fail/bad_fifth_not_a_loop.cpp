// expect: Trainer's fifth argument is not a Loop
#include "common.hpp"

int main() {
  anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, anvil::FP32, int> t(anvil::envs::Pendulum{},
                                                                                            anvil::Args{});
  t.fit();
}
