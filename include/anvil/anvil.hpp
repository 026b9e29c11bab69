#pragma once
/// @file
/// anvil: a header-only C++20 toolkit for training policies on LibTorch. This umbrella
/// header brings in every public header; include single ones to compile faster.
///
///     #include <anvil/anvil.hpp>
///     int main(int argc, char** argv) {
///       using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
///       Trainer t(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
///       t.fit();
///     }

#include <anvil/core/agent_memory.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/hyperparams.hpp>
#include <anvil/core/lr_scaling.hpp>
#include <anvil/core/memory.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/policy_config.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/core/version.hpp>

#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/env_config.hpp>
#include <anvil/envs/history.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>
#include <anvil/envs/multi_agent/mapping.hpp>
#include <anvil/envs/multi_agent/matrix_game.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/envs/multi_agent/simple_spread.hpp>
#include <anvil/envs/multi_step.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/registry.hpp>
#include <anvil/envs/vec_env.hpp>

#include <anvil/nn/activation.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/gru_actor.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/network_config.hpp>
#include <anvil/nn/twin_q.hpp>
#include <anvil/nn/unet1d.hpp>

#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/micro_batches.hpp>
#include <anvil/optim/step_context.hpp>

#include <anvil/parallel/c10d.hpp>
#include <anvil/parallel/collectives.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/parallel/launch.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/parallel/world.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/precision/fp16.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/precision/loss_scaler.hpp>
#include <anvil/precision/tf32.hpp>

#include <anvil/observe/gpu_monitor.hpp>
#include <anvil/observe/progress.hpp>
#include <anvil/observe/provenance.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/observe/tensorboard.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/observe/update_metrics.hpp>

#include <anvil/buffers/episode_buffer.hpp>
#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/buffers/rollout_buffer.hpp>
#include <anvil/buffers/sum_tree.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/data/episode_stats.hpp>
#include <anvil/data/step_collector.hpp>

#include <anvil/algorithms/collective_distillation.hpp>
#include <anvil/algorithms/collective_student.hpp>
#include <anvil/algorithms/coma.hpp>
#include <anvil/algorithms/diffusion_policy.hpp>
#include <anvil/algorithms/discrete_sac.hpp>
#include <anvil/algorithms/policy.hpp>
#include <anvil/algorithms/ppo.hpp>
#include <anvil/algorithms/ppo_config.hpp>
#include <anvil/algorithms/recurrent_ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/algorithms/sac_config.hpp>

#include <anvil/train/clock.hpp>
#include <anvil/train/compiled_trainer.hpp>
#include <anvil/train/compiled_trainer_impl.hpp>
#include <anvil/train/hooks/checkpoint.hpp>
#include <anvil/train/hooks/evaluation.hpp>
#include <anvil/train/hooks/metrics.hpp>
#include <anvil/train/hooks/progress.hpp>
#include <anvil/train/hooks/results.hpp>
#include <anvil/train/loops/episodic.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/loops/off_policy.hpp>
#include <anvil/train/loops/offline.hpp>
#include <anvil/train/loops/on_policy.hpp>
#include <anvil/train/loops/staged.hpp>
#include <anvil/train/run.hpp>
#include <anvil/train/run_config.hpp>
#include <anvil/train/signals.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/sweep.hpp>
#include <anvil/train/trainer.hpp>
#include <anvil/train/trainer_config.hpp>
