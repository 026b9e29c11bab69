// expect: Trainer: this Precision autocasts to float16, which needs CUDA, but the Parallelism policy keeps every tensor on the CPU; use BF16 on CPU
#include "common.hpp"

int main() { anvil::Trainer<anvil::SAC, anvil::UniformBuffer, user::CpuCluster, anvil::FP16> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
