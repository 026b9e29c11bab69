// expect: Trainer's fourth argument is not a Precision policy: use FP32, TF32, BF16 or FP16
#include "common.hpp"

int main() { anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, float> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
