#pragma once
/// @file
/// anvil: a header-only C++20 toolkit for training policies on LibTorch. This umbrella
/// header brings in every public header; include single ones to compile faster.
///
///     #include <anvil/anvil.hpp>
///     int main(int argc, char** argv) {
///       anvil::Trainer<anvil::SAC, anvil::UniformBuffer> t(anvil::envs::Pendulum{},
///                                                          anvil::parse_config(argc, argv));
///       t.fit();
///     }

#define ANVIL_VERSION_MAJOR 0
#define ANVIL_VERSION_MINOR 1
#define ANVIL_VERSION_PATCH 0

#include <anvil/core/batch.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/torch_compat.hpp>

#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/vec_env.hpp>

#include <anvil/nn/activation.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/nn/twin_q.hpp>

#include <anvil/algorithms/policy.hpp>
#include <anvil/algorithms/ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/rollout_buffer.hpp>
#include <anvil/buffers/sum_tree.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
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

#include <anvil/observe/progress.hpp>
#include <anvil/observe/run_files.hpp>
#include <anvil/observe/timers.hpp>

#include <anvil/train/flat_adam.hpp>
#include <anvil/train/run_config.hpp>
#include <anvil/train/step_context.hpp>
#include <anvil/train/trainer.hpp>
