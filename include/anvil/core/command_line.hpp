#pragma once
/// @file
/// The config system's first step (core/config.hpp): the command line and `--config` YAML
/// files read into `Args`, an ordered list of settings that each remember where they came
/// from. Syntax errors (malformed YAML, a key given twice, a stray argument) are reported
/// here. Light header: no torch.

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <anvil/core/config_values.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

/// The parsed command line: settings in the order they apply (files first, then the
/// command line, later ones override earlier ones), plus the informational flags.
struct Args {
  std::string program = "anvil";
  std::vector<Setting> settings;
  std::vector<std::string> config_files;
  bool help = false;          ///< `--help`: print every field with default and help, exit 0
  bool print_config = false;  ///< `--print-config`: print the resolved config as YAML, exit 0
  bool multirun = false;      ///< `--multirun` (or -m): a sweep over comma-separated values (train/sweep.hpp)
  std::vector<std::string> raw;  ///< the arguments after the program's name, as given
};

namespace detail {

inline std::string origin_prefix(const Setting& s) { return s.origin.empty() ? "" : s.origin + ": "; }

inline void flatten_yaml(const YAML::Node& node, const std::string& prefix, const std::string& file,
                         std::vector<Setting>& out) {
  auto where = [&](const YAML::Node& n) {
    const auto m = n.Mark();
    return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  };
  std::map<std::string, int> seen;  // key -> line where first seen
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary pair, so references into it
    // dangle (AddressSanitizer: stack-use-after-scope). A Node is a cheap handle.
    const YAML::Node k = it->first;
    const YAML::Node v = it->second;
    if (!k.IsScalar())
      throw ConfigError(where(k) + ": keys must be plain names, not lists or mappings");
    const std::string name = normalize_key(k.Scalar());
    if (auto [pos, fresh] = seen.emplace(name, k.Mark().line + 1); !fresh)
      throw ConfigError(where(k) + ": duplicate key '" + prefix + name + "' (first given at line " +
                        std::to_string(pos->second) + ")");
    const std::string key = prefix + name;
    if (v.IsMap()) {
      flatten_yaml(v, key + ".", file, out);
      continue;
    }
    Setting s;
    s.key = key;
    s.origin = where(k);
    if (v.IsNull() || !v.IsDefined()) {
      throw ConfigError(s.origin + ": '" + key + "' has no value");
    } else if (v.IsSequence()) {
      s.is_list = true;
      for (const auto& e : v) {
        if (!e.IsScalar())
          throw ConfigError(where(e) + ": '" + key + "' must be a list of plain values");
        s.values.push_back(e.Scalar());
      }
    } else {
      s.values.push_back(v.Scalar());
    }
    out.push_back(std::move(s));
  }
}

}  // namespace detail

/// Parses YAML text (nested mappings by section, scalars or lists at the leaves) into
/// settings. `name` is used in messages (usually the file name).
inline std::vector<Setting> parse_yaml(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg);
  }
  std::vector<Setting> out;
  if (root.IsNull()) return out;  // an empty file sets nothing
  if (!root.IsMap())
    throw ConfigError(name + ": expected a mapping of sections (e.g. 'sac:' then indented "
                             "'batch_size: 512'), got " +
                      (root.IsSequence() ? "a list" : "a single value"));
  detail::flatten_yaml(root, "", name, out);
  return out;
}

/// Reads a YAML config file into settings; a missing or unreadable file is a ConfigError.
inline std::vector<Setting> load_yaml_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("--config '" + path + "' is a directory; it must name a YAML file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw ConfigError("config file '" + path + "' cannot be opened: " + std::strerror(errno));
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw ConfigError("config file '" + path + "' cannot be read");
  return parse_yaml(text, path);
}

/// Parses a command line: `--config FILE` (repeatable), `--help`, `--print-config`, and
/// overrides as `--key=value`, `--key value`, `key=value` or a bare `--flag` (true).
/// Throws ConfigError on a stray argument or a key given twice.
inline Args parse_args(std::span<const std::string> argv) {
  Args a;
  if (!argv.empty()) {
    a.program = argv[0];
    if (auto slash = a.program.rfind('/'); slash != std::string::npos)
      a.program = a.program.substr(slash + 1);
  }
  std::vector<Setting> cli;
  if (argv.size() > 1) a.raw.assign(argv.begin() + 1, argv.end());
  for (const auto& arg : a.raw) a.multirun = a.multirun || arg == "--multirun" || arg == "-m";
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    const std::string origin = "command line '" + arg + "'";
    if (arg == "--multirun" || arg == "-m") continue;
    if (a.multirun && (arg == "--jobs" || arg.starts_with("--jobs="))) {  // the sweep's (train/sweep.hpp)
      if (arg == "--jobs") ++i;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      continue;
    }
    if (arg == "--print-config" || arg == "--print_config") {
      a.print_config = true;
      continue;
    }
    if (arg == "--config" || arg.starts_with("--config=")) {
      std::string path;
      if (arg == "--config") {
        if (i + 1 >= argv.size()) throw ConfigError(origin + ": --config needs a file name");
        path = argv[++i];
      } else {
        path = arg.substr(9);
      }
      if (path.empty()) throw ConfigError(origin + ": --config needs a file name");
      a.config_files.push_back(path);
      continue;
    }
    Setting s;
    s.origin = origin;
    std::string_view body = arg;
    const bool dashed = body.starts_with("--");
    if (dashed) body.remove_prefix(2);
    const auto eq = body.find('=');
    if (eq != std::string_view::npos) {
      s.key = detail::normalize_key(body.substr(0, eq));
      s.values.emplace_back(body.substr(eq + 1));
    } else if (dashed && !body.empty()) {
      s.key = detail::normalize_key(body);
      // `--key value` unless the next token is another option or override.
      const bool next_is_value =
          i + 1 < argv.size() && argv[i + 1].find('=') == std::string::npos &&
          (!argv[i + 1].starts_with("-") ||
           (argv[i + 1].size() > 1 && (std::isdigit(static_cast<unsigned char>(argv[i + 1][1])) ||
                                       argv[i + 1][1] == '.')));
      if (next_is_value) {
        s.values.push_back(argv[++i]);
        s.origin = "command line '" + arg + " " + argv[i] + "'";
      } else {
        s.bare_flag = true;
        s.values.emplace_back("true");
      }
    } else {
      throw ConfigError(origin + ": unexpected argument; overrides are written key=value or "
                                 "--key=value (run with --help for the keys)");
    }
    if (s.key.empty() || s.key.front() == '.' || s.key.back() == '.')
      throw ConfigError(origin + ": '" + s.key + "' is not a key");
    for (const auto& prev : cli)
      if (prev.key == s.key)
        throw ConfigError(origin + ": '" + s.key + "' is given twice on the command line (also " +
                          prev.origin + ")");
    cli.push_back(std::move(s));
  }
  for (const auto& f : a.config_files) {
    auto file_settings = load_yaml_file(f);
    a.settings.insert(a.settings.end(), file_settings.begin(), file_settings.end());
  }
  a.settings.insert(a.settings.end(), cli.begin(), cli.end());
  return a;
}

/// `parse_args` for `main`'s arguments (throws ConfigError; see `anvil::start` for the
/// line a main calls, which reports it).
inline Args parse_config(int argc, char** argv) {
  std::vector<std::string> v(argv, argv + argc);
  return parse_args(v);
}

}  // namespace anvil
