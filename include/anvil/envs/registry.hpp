#pragma once
/// @file
/// The built-in envs by name, for programs that choose the env at run time
/// (`--env.id=CartPole-v1`): `with_env(id, f)` calls `f` with a default-constructed env of
/// that name. A Trainer's type does not depend on its env's (the envs are type-erased
/// behind `VecEnvBase`), so one program trains any of them. Users' own envs stay types:
/// pass them to a Trainer directly.

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <anvil/core/error.hpp>
#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>
#include <anvil/envs/pendulum.hpp>

namespace anvil::envs {

/// The names `with_env` knows.
inline constexpr std::array<std::string_view, 4> kBuiltinEnvs{Pendulum::name, CartPole::name, Acrobot::name,
                                                              MountainCarContinuous::name};

/// Calls `f(env)` with the built-in env named `id`; a ConfigError naming `env.id` and the
/// known names otherwise.
template <class F>
decltype(auto) with_env(std::string_view id, F&& f) {
  if (id == Pendulum::name) return std::forward<F>(f)(Pendulum{});
  if (id == CartPole::name) return std::forward<F>(f)(CartPole{});
  if (id == Acrobot::name) return std::forward<F>(f)(Acrobot{});
  if (id == MountainCarContinuous::name) return std::forward<F>(f)(MountainCarContinuous{});
  std::string known;
  for (auto n : kBuiltinEnvs) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("env.id='" + std::string(id) + "' is not a built-in env; choose one of " + known +
                    " (or pass your own env's type to the Trainer)");
}

}  // namespace anvil::envs
