#pragma once
/// @file
/// The header of a main that trains with a prebuilt Trainer (`anvil::compiled::Trainer`,
/// train/compiled_trainer.hpp): the Trainer, `anvil::start`, and the built-in envs that need
/// no optional component. Any env of the program's own trains too (envs::AnyEnv). Linked with the CMake target `anvil::compiled`, such a main
/// includes none of torch's ATen or `torch/` headers and compiles in seconds; linked with `anvil::anvil` alone it is
/// header-only (this header then brings in the implementation).
///
///     #include <anvil/compiled.hpp>
///     int main(int argc, char** argv) {
///       using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;
///       Trainer t(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
///       t.fit();
///     }

#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/render/classic_views.hpp>
#include <anvil/train/compiled_trainer.hpp>
#include <anvil/train/start.hpp>

/// The built-in envs whose door (`envs::AnyEnv`'s constructor) and `EnvArray` (the typed part
/// of their VecEnv, envs/env_batch.hpp) the `anvil::compiled` library holds, so a main that
/// trains one compiles none of it.
#define ANVIL_BUILTIN_ENVS(M)             \
  M(::anvil::envs::Pendulum)              \
  M(::anvil::envs::MountainCarContinuous) \
  M(::anvil::envs::CartPole)              \
  M(::anvil::envs::CartPoleNoVel)         \
  M(::anvil::envs::Acrobot)               \
  M(::anvil::envs::PixelPendulum)

#ifdef ANVIL_COMPILED
#define ANVIL_DETAIL_EXTERN_ENV(E)                        \
  extern template class ::anvil::envs::EnvArray<E>; \
  extern template ::anvil::envs::AnyEnv::AnyEnv(const E&);
ANVIL_BUILTIN_ENVS(ANVIL_DETAIL_EXTERN_ENV)
#undef ANVIL_DETAIL_EXTERN_ENV
#else
#include <anvil/train/compiled_trainer_impl.hpp>
#endif
