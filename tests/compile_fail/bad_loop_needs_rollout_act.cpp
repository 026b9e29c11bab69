// expect: Trainer: the on-policy loop needs act_for_rollout, value, epochs, minibatch_size, end_epoch, set_progress and discount of the Algorithm
#include "common.hpp"

// TrainerRules accept the combination (an on-policy algorithm with rollout storage), but
// the on-policy loop cannot train an algorithm that cannot act for a rollout.
int main() { anvil::Trainer<user::Reinforce, anvil::RolloutBuffer> t(anvil::envs::Pendulum{}, anvil::Args{}); t.fit(); }
