#pragma once
/// @file
/// The built-in multi-agent envs by name, for programs that choose one at run time
/// (`--env.id=Mapping`): `with_team_env(id, f)` calls `f` with the `Joint` env of that name.
/// Light header: no torch.

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <anvil/core/error.hpp>
#include <anvil/envs/multi_agent/mapping.hpp>
#include <anvil/envs/multi_agent/mapping_published.hpp>
#include <anvil/envs/multi_agent/matrix_game.hpp>
#include <anvil/envs/multi_agent/simple_spread.hpp>

namespace anvil::envs {

/// The names `with_team_env` knows: the mapping mission (this library's and the published
/// one, mapping_published.hpp), simple spread, and the climbing, penalty (k = -100) and
/// credit (7 agents, 1 and 50) matrix games.
inline constexpr std::array<std::string_view, 6> kBuiltinTeamEnvs{"Mapping",  "MappingWestheider", "SimpleSpread",
                                                                  "Climbing", "Penalty",           "Credit"};

/// Calls `f(env)` with the built-in multi-agent env named `id`, as a `Joint`; a ConfigError
/// naming `env.id` and the known names otherwise.
template <class F>
decltype(auto) with_team_env(std::string_view id, F&& f) {
  if (id == "Mapping") return std::forward<F>(f)(Joint<MappingTask>{});
  if (id == "MappingWestheider") return std::forward<F>(f)(Joint<PublishedMapping>{});
  if (id == "SimpleSpread") return std::forward<F>(f)(Joint<SimpleSpread>{});
  if (id == "Climbing") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::climbing()));
  if (id == "Penalty") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::penalty(-100)));
  if (id == "Credit") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::credit(7, 1.0, 50.0)));
  std::string known;
  for (auto n : kBuiltinTeamEnvs) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("env.id='" + std::string(id) + "' is not a built-in multi-agent env; choose one of " + known +
                    " (or pass your own MultiAgentEnv, wrapped in envs::Joint, to the Trainer)");
}

}  // namespace anvil::envs
