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
#include <anvil/train/compiled_trainer.hpp>
#include <anvil/train/start.hpp>

#ifndef ANVIL_COMPILED
#include <anvil/train/compiled_trainer_impl.hpp>
#endif
