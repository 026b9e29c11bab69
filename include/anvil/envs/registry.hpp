#pragma once
/// @file
/// The built-in envs by name, for programs that choose the env at run time
/// (`--env.id=CartPole-v1`): `with_env(id, f)` calls `f` with a default-constructed env of
/// that name; `with_env(cfg.env, f)` also takes an env in Python (`python:MODULE:ATTR`,
/// envs/python_env.hpp), as the door (`AnyEnv`) a Trainer takes. A Trainer's type does not depend on its env's (the envs are type-erased
/// behind `VecEnvBase`), so one program trains any of them. Users' own envs stay types:
/// pass them to a Trainer directly. Light header.

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <anvil/core/error.hpp>
#include <anvil/envs/acrobot.hpp>
#include <anvil/envs/cart_pole.hpp>
#include <anvil/envs/mountain_car_continuous.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/python_env.hpp>
#include <anvil/envs/render/classic_views.hpp>

namespace anvil::envs {

/// The names `with_env` knows.
inline constexpr std::array<std::string_view, 6> kBuiltinEnvs{Pendulum::name,      CartPole::name,
                                                              CartPoleNoVel::name, Acrobot::name,
                                                              MountainCarContinuous::name, PixelPendulum::name};

/// Calls `f(env)` with the built-in env named `id`; a ConfigError naming `env.id` and the
/// known names otherwise.
template <class F>
decltype(auto) with_env(std::string_view id, F&& f) {
  if (id == Pendulum::name) return std::forward<F>(f)(Pendulum{});
  if (id == CartPole::name) return std::forward<F>(f)(CartPole{});
  if (id == CartPoleNoVel::name) return std::forward<F>(f)(CartPoleNoVel{});
  if (id == Acrobot::name) return std::forward<F>(f)(Acrobot{});
  if (id == MountainCarContinuous::name) return std::forward<F>(f)(MountainCarContinuous{});
  if (id == PixelPendulum::name) return std::forward<F>(f)(PixelPendulum{});
  std::string known;
  for (auto n : kBuiltinEnvs) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("env.id='" + std::string(id) + "' is not a built-in env; choose one of " + known +
                    ", or python:MODULE:ATTR for an env in Python (or pass your own env's type to the Trainer)");
}

/// The pixel task's settings in the env section (env.image_size, env.frame_stack,
/// env.action_repeat), each the task's own where 0.
[[nodiscard]] inline PixelOptions pixel_options(const VecEnvConfig& cfg) {
  PixelOptions o;
  o.size = cfg.image_size_or(o.size);
  if (*cfg.frame_stack > 0) o.frames = cfg.frame_stack;
  if (*cfg.action_repeat > 0) o.action_repeat = cfg.action_repeat;
  return o;
}

/// `with_env` for the env section of a run's config: `env.id` names a built-in env (a pixel
/// task drawn at env.image_size, env.frame_stack frames, env.action_repeat), or an env in
/// Python (`python:MODULE:ATTR`, with `env.kwargs`), which `f` gets as an `AnyEnv`.
/// Refuses env.image_size, env.frame_stack and env.action_repeat unless env.id is a pixel
/// task anvil draws; `env` says which env the run has ("env.id is Pendulum-v1").
inline void refuse_pixel_fields(const VecEnvConfig& cfg, const std::string& env) {
  if (cfg.pixel_settings() && *cfg.id != PixelPendulum::name)
    throw ConfigError("env.image_size, env.frame_stack and env.action_repeat apply to a pixel task anvil draws (" +
                      std::string(PixelPendulum::name) + "); " + env);
}

template <class F>
decltype(auto) with_env(const VecEnvConfig& cfg, F&& f) {
  const std::string id = cfg.id->empty() ? std::string("env.id is empty") : "env.id is " + *cfg.id;
  refuse_pixel_fields(cfg, id);
  if (python::is_python_id(*cfg.id)) return std::forward<F>(f)(python_env(*cfg.id, *cfg.kwargs, *cfg.workers));
  if (!cfg.kwargs->empty())
    throw ConfigError("env.kwargs: only an env in Python (env.id=python:MODULE:ATTR) takes keyword arguments; " + id);
  if (*cfg.id == PixelPendulum::name) return std::forward<F>(f)(PixelPendulum(pixel_options(cfg)));
  return with_env(*cfg.id, std::forward<F>(f));
}

/// The env the env section names (`with_env(cfg, f)`'s choice and checks) through the door a
/// Trainer takes: what a main on a prebuilt Trainer (`anvil/compiled.hpp`) passes it, so
/// one Trainer serves every env without being built per env.
[[nodiscard]] inline AnyEnv any_env(const VecEnvConfig& cfg) {
  return with_env(cfg, [](const auto& env) { return AnyEnv(env); });
}

}  // namespace anvil::envs
