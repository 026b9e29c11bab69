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
static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, anvil::FP32,
                                     anvil::Staged<anvil::OfflineLoop, anvil::OffPolicyLoop>>>);
static_assert(accepted<anvil::Trainer<anvil::SAC, anvil::PrioritizedBuffer, anvil::SingleDevice, anvil::FP32, anvil::OfflineLoop>>);
// The four policies combine (a user's on-policy algorithm and rollout storage); that the
// on-policy loop cannot train them is bad_loop_needs_rollout_act.cpp's sentence.
static_assert(anvil::TrainerRules<user::Reinforce, user::Rollouts, anvil::SingleDevice, anvil::FP32>::ok);

int main() {}
