#pragma once
/// @file
/// The config system: command line, YAML files, `--help`, printing, hashing and validation,
/// all derived from `Param` fields by walking config structs with Boost.PFR.
///
/// Two steps, so that `parse_config(argc, argv)` needs no knowledge of the Trainer type:
///  1. `parse_config` reads the command line and any `--config FILE` into `Args`: an ordered
///     list of `key = value` settings, each remembering where it came from (file:line:column
///     or the command-line argument). Syntax errors (malformed YAML, duplicate keys, a stray
///     argument) are reported here.
///  2. `configure<Cfg>(args)` applies the settings to a typed config: unknown keys (with
///     "did you mean"), wrong types and values out of range are reported with the field and
///     the place they came from.
/// Every error is an `anvil::ConfigError`. Neither step prints, exits or restarts anything:
/// `anvil::start` (train/start.hpp), the one line a main calls first, answers `--help` and
/// `--print-config`, and turns a ConfigError into a one-line message and exit status 2.
///
/// Keys are `section.field` (`sac.batch_size`); a key without a section refers to the `run`
/// section (`--seed=3`, `--device=cuda`). Dashes in keys read as underscores (`--run-dir`).
///
/// Light header: no torch (yaml-cpp and Boost.PFR only).

#include <boost/pfr.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>

namespace anvil {

/// One `key = value` setting before it is applied to a typed config.
struct Setting {
  std::string key;                  ///< dotted key as written, dashes turned to underscores
  std::vector<std::string> values;  ///< one entry for a scalar, one per element for a list
  bool is_list = false;             ///< written as a YAML sequence
  bool bare_flag = false;           ///< `--flag` with no value: means true for a bool field
  std::string origin;               ///< "run.yaml:4:3" or "command line '--x=1'"
  /// A program's own default (a hyperparameter file's block, its default env), not the
  /// user's: `run.smoke`'s small run is applied over these and under the user's settings.
  bool program_default = false;
};

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

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

inline std::string normalize_key(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

/// Edit distance with transpositions (optimal string alignment), for "did you mean".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::size_t> d((n + 1) * (m + 1));
  auto at = [&](std::size_t i, std::size_t j) -> std::size_t& { return d[i * (m + 1) + j]; };
  for (std::size_t i = 0; i <= n; ++i) at(i, 0) = i;
  for (std::size_t j = 0; j <= m; ++j) at(0, j) = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
    }
  return at(n, m);
}

/// Shortest text that reads back as the same double.
inline std::string format_double(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general);
  std::string s(buf, end);
  // Keep a marker that this is a float, so YAML readers and humans see 1.0, not 1.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

inline std::string format_range(const Range& r) {
  if (!r.bounded()) return {};
  constexpr double inf = std::numeric_limits<double>::infinity();
  auto num = [](double v) {
    if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<long long>(v));
    return format_double(v);
  };
  if (r.hi == inf) return std::string(r.lo_open ? "> " : ">= ") + num(r.lo);
  if (r.lo == -inf) return std::string(r.hi_open ? "< " : "<= ") + num(r.hi);
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) + (r.hi_open ? ")" : "]");
}

template <class T> std::string type_name();
template <class T>
std::string type_name() {
  if constexpr (std::same_as<T, bool>) return "bool";
  else if constexpr (std::same_as<T, std::string>) return "string";
  else if constexpr (NamedEnum<T>) {
    std::string s;
    for (std::string_view n : enum_names(T{})) {
      if (!s.empty()) s += '|';
      s.append(n);
    }
    return s;
  } else if constexpr (std::integral<T>) return std::is_unsigned_v<T> ? "uint" : "int";
  else if constexpr (std::floating_point<T>) return "float";
  else return "list of " + type_name<typename T::value_type>();
}

template <class T>
std::string format_value(const T& v) {
  if constexpr (std::same_as<T, bool>) return v ? "true" : "false";
  else if constexpr (std::same_as<T, std::string>) return v;
  else if constexpr (NamedEnum<T>) return std::string(enum_names(v)[static_cast<std::size_t>(v)]);
  else if constexpr (std::integral<T>) return std::to_string(v);
  else if constexpr (std::floating_point<T>) return format_double(static_cast<double>(v));
  else {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_value(v[i]);
    return s + "]";
  }
}

/// A YAML scalar that reads back as the same string.
inline std::string yaml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <class T>
std::string format_yaml(const T& v) {
  if constexpr (std::same_as<T, std::string>) return yaml_quote(v);
  else if constexpr (is_vector<T>::value) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_yaml(v[i]);
    return s + "]";
  } else return format_value(v);
}

inline std::string strip_underscores(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_') out += c;
  return out;
}

/// Parses one scalar; on failure returns nullopt and sets `why` (no field name in it).
template <class T>
std::optional<T> parse_scalar(std::string_view text, std::string& why) {
  const std::string s = [&] {
    auto b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
    return b == std::string_view::npos ? std::string() : std::string(text.substr(b, e - b + 1));
  }();
  if constexpr (std::same_as<T, std::string>) {
    return std::string(text);
  } else if constexpr (std::same_as<T, bool>) {
    const std::string l = lower(s);
    if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
    if (l == "false" || l == "no" || l == "off" || l == "0") return false;
    why = "expected a bool (true or false), got '" + s + "'";
    return std::nullopt;
  } else if constexpr (NamedEnum<T>) {
    const auto names = enum_names(T{});
    std::string best;
    std::size_t best_d = SIZE_MAX;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (lower(names[i]) == lower(s)) return static_cast<T>(i);
      if (auto d = edit_distance(lower(s), lower(names[i])); d < best_d) best_d = d, best = names[i];
    }
    why = "expected one of " + type_name<T>() + ", got '" + s + "'";
    if (best_d <= 2) why += "; did you mean '" + best + "'?";
    return std::nullopt;
  } else if constexpr (std::integral<T>) {
    const std::string digits = strip_underscores(s);
    if (std::is_unsigned_v<T> && !digits.empty() && digits.front() == '-') {
      why = "expected a non-negative integer, got '" + s + "'";
      return std::nullopt;
    }
    T v{};
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec == std::errc() && p == digits.data() + digits.size() && !digits.empty()) return v;
    if (ec == std::errc::result_out_of_range) {
      why = "'" + s + "' does not fit in " + type_name<T>();
      return std::nullopt;
    }
    // 1e6 is a common way to write step counts: accept it when it is a whole number.
    double d{};
    auto [pd, ecd] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (ecd == std::errc() && pd == digits.data() + digits.size() && std::isfinite(d) &&
        d == std::floor(d)) {
      if (d >= static_cast<double>(std::numeric_limits<T>::min()) &&
          d <= static_cast<double>(std::numeric_limits<T>::max()))
        return static_cast<T>(d);
      why = "'" + s + "' does not fit in " + type_name<T>();
      return std::nullopt;
    }
    why = std::string("expected ") + (std::is_unsigned_v<T> ? "a non-negative integer" : "an integer") +
          ", got '" + s + "'";
    return std::nullopt;
  } else {
    static_assert(std::floating_point<T>);
    const std::string digits = strip_underscores(s);
    double v{};
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec == std::errc() && p == digits.data() + digits.size() && !digits.empty()) {
      if (!std::isfinite(v)) {
        why = "expected a finite number, got '" + s + "'";
        return std::nullopt;
      }
      return static_cast<T>(v);
    }
    why = "expected a number, got '" + s + "'";
    return std::nullopt;
  }
}

/// Empty when `v` satisfies `rule`, else why not (no field name in it).
template <class T>
std::string check_rule(const T& v, const Range& rule) {
  if constexpr (std::integral<T> || std::floating_point<T>) {
    if constexpr (std::floating_point<T>)
      if (!std::isfinite(v)) return "must be a finite number";
    if (!rule.contains(static_cast<double>(v))) return "must be " + format_range(rule);
    return {};
  } else if constexpr (is_vector<T>::value) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (auto e = check_rule(v[i], rule); !e.empty())
        return "element " + std::to_string(i) + " (" + format_value(v[i]) + ") " + e;
    return {};
  } else {
    return {};
  }
}

/// What can be done with a field's value, by value type: one set of functions per type
/// (int, double, string, ...), shared by every field of that type, so a config's walk
/// costs little to compile however many fields it has.
template <class T>
struct ValueOps {
  /// Sets `*value` from a setting; empty on success, else why not (no field name in it).
  static std::string assign(void* value, const Setting& s) {
    T& target = *static_cast<T*>(value);
    std::string why;
    if constexpr (is_vector<T>::value) {
      using E = typename T::value_type;
      std::vector<std::string> parts;
      if (s.is_list) {
        parts = s.values;
      } else {  // "256,256" or "[256, 256]" from the command line
        std::string_view v = s.values.empty() ? std::string_view() : s.values.front();
        while (!v.empty() && (v.front() == '[' || v.front() == ' ')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ']' || v.back() == ' ')) v.remove_suffix(1);
        while (!v.empty()) {
          auto comma = v.find(',');
          parts.emplace_back(v.substr(0, comma));
          if (comma == std::string_view::npos) break;
          v.remove_prefix(comma + 1);
        }
      }
      T out;
      for (std::size_t i = 0; i < parts.size(); ++i) {
        auto e = parse_scalar<E>(parts[i], why);
        if (!e) return "element " + std::to_string(i) + ": " + why;
        out.push_back(*e);
      }
      target = std::move(out);
      return {};
    } else {
      if (s.is_list) return "expected a single " + type_name<T>() + ", got a list";
      if (s.bare_flag) {
        if constexpr (std::same_as<T, bool>) {
          target = true;
          return {};
        } else {
          return "needs a value (" + type_name<T>() + ")";
        }
      }
      auto v = parse_scalar<T>(s.values.empty() ? std::string_view() : s.values.front(), why);
      if (!v) return why;
      target = std::move(*v);
      return {};
    }
  }
  static std::string format(const void* value) { return format_value(*static_cast<const T*>(value)); }
  static std::string yaml(const void* value) { return format_yaml(*static_cast<const T*>(value)); }
  static std::string check(const void* value, const Range& rule) { return check_rule(*static_cast<const T*>(value), rule); }
};

/// Type-erased view of one field of a config object, built by `fields()`.
struct FieldRef {
  std::string key;  ///< full dotted key
  std::string_view leaf;
  std::string_view help;
  std::string type;
  std::string rule;  ///< e.g. ">= 1", empty when unconstrained
  bool is_bool = false;

  /// Sets the field from `s`; empty string on success, else why not.
  [[nodiscard]] std::string assign(const Setting& s) const { return assign_(value_, s); }
  /// The value as text.
  [[nodiscard]] std::string format() const { return format_(value_); }
  /// The value as a YAML scalar.
  [[nodiscard]] std::string format_yaml() const { return yaml_(value_); }
  /// The rule's violation, or empty.
  [[nodiscard]] std::string check() const { return check_(value_, range_); }

  void* value_ = nullptr;  ///< the Param's value
  Range range_;
  std::string (*assign_)(void*, const Setting&) = nullptr;
  std::string (*format_)(const void*) = nullptr;
  std::string (*yaml_)(const void*) = nullptr;
  std::string (*check_)(const void*, const Range&) = nullptr;
};

template <class T> struct always_false : std::false_type {};

template <class Cfg>
void collect_fields(Cfg& cfg, const std::string& prefix, std::vector<FieldRef>& out) {
  static_assert(std::is_aggregate_v<Cfg>,
                "a config must be an aggregate struct of Param<...> and Section<...> fields");
  boost::pfr::for_each_field(cfg, [&](auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      collect_fields(field.value, prefix + std::string(F::name) + ".", out);
    } else if constexpr (IsParam<F>) {
      using T = typename F::value_type;
      FieldRef r;
      r.key = prefix + std::string(F::name);
      r.leaf = F::name;
      r.help = F::help;
      r.type = type_name<T>();
      r.rule = format_range(F::rule);
      r.is_bool = std::same_as<T, bool>;
      r.value_ = const_cast<std::remove_const_t<T>*>(&field.value);
      r.range_ = F::rule;
      r.assign_ = &ValueOps<T>::assign;
      r.format_ = &ValueOps<T>::format;
      r.yaml_ = &ValueOps<T>::yaml;
      r.check_ = &ValueOps<T>::check;
      out.push_back(std::move(r));
    } else {
      static_assert(always_false<F>::value,
                    "every field of a config must be a Param<T, \"name\", \"help\"> or a "
                    "Section<\"name\", Config>");
    }
  });
}

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

/// Every field of `cfg`, in declaration order, as type-erased references into `cfg`.
template <class Cfg>
std::vector<detail::FieldRef> fields(Cfg& cfg) {
  std::vector<detail::FieldRef> out;
  detail::collect_fields(cfg, "", out);
  return out;
}

/// Checks every field's rule, then the config's own `validate()` if it has one (for rules
/// across fields). Throws ConfigError naming the field.
template <class Cfg>
void validate(const Cfg& cfg) {
  auto fs = fields(const_cast<Cfg&>(cfg));
  for (const auto& f : fs)
    if (auto why = f.check(); !why.empty())
      throw ConfigError(f.key + " = " + f.format() + " is out of range: " + why);
  boost::pfr::for_each_field(cfg, [](const auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      if constexpr (requires { field.value.validate(); }) field.value.validate();
    }
  });
  if constexpr (requires { cfg.validate(); }) cfg.validate();
}

namespace detail {
/// `apply_settings` without the final `validate` (a layer of settings among others).
template <class Cfg>
void apply_each(Cfg& cfg, const std::vector<Setting>& settings) {
  auto fs = fields(cfg);
  std::map<std::string, detail::FieldRef*, std::less<>> by_key;
  for (auto& f : fs) by_key[f.key] = &f;
  for (const Setting& s : settings) {
    std::string key = s.key;
    // Keys without a section: run's first, then parallel's (--seed=3, --num-gpus=2).
    if (key.find('.') == std::string::npos)
      for (const char* section : {"run.", "parallel."})
        if (by_key.count(section + key)) {
          key = section + key;
          break;
        }
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      std::string msg = detail::origin_prefix(s) + "unknown key '" + s.key + "'";
      // A section named as a field, e.g. 'sac.batch_size.x'.
      for (const auto& f : fs)
        if (key.starts_with(f.key + ".")) {
          throw ConfigError(msg + "; '" + f.key + "' is a field, not a section");
        }
      const detail::FieldRef* best = nullptr;
      std::size_t best_d = SIZE_MAX;
      const bool qualified = key.find('.') != std::string::npos;
      for (const auto& f : fs) {
        std::size_t d = detail::edit_distance(key, f.key);
        if (!qualified) d = std::min(d, detail::edit_distance(key, f.leaf));
        if (d < best_d) best_d = d, best = &f;
      }
      if (best && best_d <= std::max<std::size_t>(2, key.size() / 4))
        msg += "; did you mean '" + best->key + "'?";
      else
        msg += "; run with --help to list the keys";
      throw ConfigError(msg);
    }
    detail::FieldRef& f = *it->second;
    if (auto why = f.assign(s); !why.empty())
      throw ConfigError(detail::origin_prefix(s) + f.key + ": " + why);
    if (auto why = f.check(); !why.empty())
      throw ConfigError(detail::origin_prefix(s) + f.key + " = " + f.format() +
                        " is out of range: " + why);
  }
}
}  // namespace detail

/// Applies settings to `cfg` in order and validates the result. Throws ConfigError naming
/// the key and where it came from: unknown key (with the nearest known key), wrong type,
/// value out of range.
template <class Cfg>
void apply_settings(Cfg& cfg, const std::vector<Setting>& settings) {
  detail::apply_each(cfg, settings);
  validate(cfg);
}

/// Help for every field of `Cfg`: key, type, default, help and allowed range.
template <class Cfg>
std::string help_text(std::string_view program, const Cfg& defaults = Cfg{}) {
  auto fs = fields(const_cast<Cfg&>(defaults));
  std::ostringstream o;
  o << "usage: " << program
    << " [--config FILE]... [KEY=VALUE | --KEY=VALUE]... [--print-config] [--help]\n\n"
       "Keys without a section refer to 'run' or 'parallel' (--seed=3 is run.seed=3). A YAML file nests\n"
       "keys by section; the command line overrides it.\n";
  std::size_t wk = 0, wt = 0, wd = 0;
  for (const auto& f : fs) {
    wk = std::max(wk, f.key.size());
    wt = std::max(wt, f.type.size());
    wd = std::max(wd, f.format().size());
  }
  wt = std::min<std::size_t>(wt, 14);
  wd = std::min<std::size_t>(wd, 16);
  std::string section;
  for (const auto& f : fs) {
    const auto dot = f.key.rfind('.');
    const std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (sec != section || &f == &fs.front()) {
      section = sec;
      o << "\n" << (sec.empty() ? "options" : sec) << ":\n";
    }
    std::string line = "  " + f.key;
    line.resize(2 + wk + 2, ' ');
    std::string t = f.type;
    t.resize(std::max(t.size(), wt) + 2, ' ');
    std::string d = f.format();
    d.resize(std::max(d.size(), wd) + 2, ' ');
    o << line << t << d << f.help;
    if (!f.rule.empty()) o << " (" << f.rule << ")";
    o << "\n";
  }
  return o.str();
}

/// The config as YAML, nested by section; `parse_yaml` reads it back to the same values.
template <class Cfg>
std::string to_yaml(const Cfg& cfg) {
  auto fs = fields(const_cast<Cfg&>(cfg));
  std::ostringstream o;
  std::vector<std::string> open;  // currently open sections
  for (const auto& f : fs) {
    std::vector<std::string> parts;
    for (std::size_t b = 0, e; b <= f.key.size(); b = e + 1) {
      e = f.key.find('.', b);
      if (e == std::string::npos) e = f.key.size();
      parts.push_back(f.key.substr(b, e - b));
    }
    const std::size_t depth = parts.size() - 1;
    std::size_t common = 0;
    while (common < open.size() && common < depth && open[common] == parts[common]) ++common;
    open.resize(common);
    for (std::size_t i = common; i < depth; ++i) {
      o << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    o << std::string(2 * depth, ' ') << parts.back() << ": " << f.format_yaml() << "\n";
  }
  return o.str();
}

/// `key=value` for every field, in declaration order: the canonical form that is hashed
/// and compared (e.g. when a checkpoint's config differs from the run's).
template <class Cfg>
std::vector<std::pair<std::string, std::string>> flatten(const Cfg& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : fields(const_cast<Cfg&>(cfg))) out.emplace_back(f.key, f.format());
  return out;
}

/// Stable 64-bit hash (FNV-1a) of the canonical `key=value` lines, then of the names of
/// the types a config says it covers (`Cfg::hashed_types()`, a Trainer's policy types): the
/// same config gives the same hash wherever it is computed (a run's files, `--print-config`,
/// checkpoints), on every machine and build by one compiler.
template <class Cfg>
std::uint64_t config_hash(const Cfg& cfg) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::string_view text) {
    for (char c : text) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ull;
    }
  };
  for (const auto& [k, v] : flatten(cfg)) mix(k + "=" + v + "\n");
  if constexpr (requires { Cfg::hashed_types(); })
    for (std::string_view t : Cfg::hashed_types()) mix(t);
  return h;
}

/// `config_hash` as 16 hex digits.
template <class Cfg>
std::string config_hash_hex(const Cfg& cfg) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(config_hash(cfg)));
  return buf;
}

/// Shrinks `cfg` for a run of seconds (`run.smoke`): every section whose config has a
/// `shrink()` shrinks itself. `configure` applies it as a layer of defaults; a config built
/// in code and handed to a Trainer directly calls it itself.
template <class Cfg>
void shrink_for_smoke(Cfg& cfg) {
  boost::pfr::for_each_field(cfg, [](auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      if constexpr (requires { field.value.shrink(); }) field.value.shrink();
    }
  });
}

/// Builds a `Cfg` from defaults and `args`, in layers, then validates it once: the
/// defaults, the program's own settings (`Setting::program_default`), the small run of
/// `run.smoke` when the settings ask for one, then the user's config files and command line
/// in order. So `--smoke --train.steps=900` runs 900 steps with smoke's short warm-up, and
/// `--print-config` prints what will run. Throws ConfigError on bad input; `--help` and
/// `--print-config` are left to the caller (`anvil::start` answers them).
template <class Cfg>
Cfg configure(const Args& args, Cfg cfg = Cfg{}) {
  std::vector<Setting> program, user;
  for (const auto& s : args.settings) (s.program_default ? program : user).push_back(s);
  detail::apply_each(cfg, program);
  if constexpr (requires { bool(*cfg.run->smoke); }) {
    Cfg asked = cfg;  // whether the user's settings, all applied, ask for a smoke run
    detail::apply_each(asked, user);
    if (*asked.run->smoke) shrink_for_smoke(cfg);
  }
  detail::apply_each(cfg, user);
  validate(cfg);
  return cfg;
}

/// Typed one-step form: `auto cfg = parse_config<MyConfig>(argc, argv);`.
template <class Cfg>
Cfg parse_config(int argc, char** argv) {
  return configure<Cfg>(parse_config(argc, argv));
}

}  // namespace anvil
