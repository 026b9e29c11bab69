// The control for the compile-fail programs: the same headers and user types in good
// combinations compile, so each failure above is due to its combination alone.
#include "common.hpp"

template <class T>
constexpr bool accepted = !std::is_same_v<T, anvil::detail::RejectedTrainer>;

static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::UniformBuffer>>);
static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, anvil::BF16>>);
static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::UniformBuffer, user::CpuCluster, anvil::BF16>>);
static_assert(accepted<anvil::Trainer<anvil::PPO, anvil::RolloutBuffer>>);
static_assert(accepted<anvil::Trainer<anvil::PPO, anvil::RolloutBuffer, anvil::SingleDevice, anvil::BF16>>);
static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::PrioritizedBuffer>>);
static_assert(anvil::TrainerRules<user::Reinforce, user::Rollouts, anvil::SingleDevice, anvil::FP32>::ok);

int main() {}
