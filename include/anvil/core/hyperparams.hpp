#pragma once
/// @file
/// Per-env default hyperparameters from a YAML file, like RL Baselines3 Zoo's
/// hyperparameter files: a mapping from env ids to config blocks,
///
///     CartPole-v1:
///       env: {num_envs: 8}
///       ppo: {gamma: 0.98, epochs: 20}
///
/// A program that chooses its env at run time (`--env.id=...`) applies the block of the
/// chosen env first, so `--config` files and the command line still override it, and
/// switching env needs no rebuild. Light header.

#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <anvil/core/config.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

/// The settings of `env_id`'s block in the hyperparameter file `file` (none when the file
/// has no block for it); a ConfigError naming the file when it cannot be read.
[[nodiscard]] inline std::vector<Setting> hyperparameters(const std::string& file, const std::string& env_id) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::BadFile&) {
    throw ConfigError("hyperparameter file '" + file + "' cannot be read");
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
  if (!root.IsMap()) throw ConfigError("hyperparameter file '" + file + "': expected a mapping from env ids to config blocks");
  const YAML::Node block = root[env_id];
  if (!block) return {};
  YAML::Emitter out;
  out << block;
  return parse_yaml(out.c_str(), file + " [" + env_id + "]");
}

/// `args` with the hyperparameters of its env applied first: the env is the last `env.id`
/// the command line or a `--config` file sets, else `default_env` (then added as
/// `env.id=<default_env>`), marked as the program's defaults (`run.smoke` goes over them).
/// The file is `--hyperparams=FILE` when given (taken out of the settings), else
/// `default_file`.
[[nodiscard]] inline Args with_hyperparameters(Args args, const std::string& default_file, const std::string& default_env) {
  std::string file = default_file, env = default_env;
  bool env_given = false;
  std::vector<Setting> kept;
  for (auto& s : args.settings) {
    if (s.key == "hyperparams") {
      if (s.values.size() != 1 || s.values[0].empty()) throw ConfigError(s.origin + ": --hyperparams needs a file name");
      file = s.values[0];
      continue;
    }
    if (s.key == "env.id" && s.values.size() == 1) env = s.values[0], env_given = true;
    kept.push_back(std::move(s));
  }
  auto settings = hyperparameters(file, env);
  if (!env_given) {
    Setting id;
    id.key = "env.id";
    id.values = {env};
    id.origin = "the program's default env";
    settings.push_back(std::move(id));
  }
  for (auto& s : settings) s.program_default = true;  // `--smoke` goes over them
  settings.insert(settings.end(), std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end()));
  args.settings = std::move(settings);
  return args;
}

}  // namespace anvil
