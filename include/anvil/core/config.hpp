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

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/command_line.hpp>
#include <anvil/core/config_values.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>

namespace anvil {


/// Every field of `cfg`, in declaration order, as type-erased references into `cfg`.
template <class Cfg>
std::vector<detail::FieldRef> fields(Cfg& cfg) {
  std::vector<detail::FieldRef> out;
  detail::collect_fields(cfg, "", out);
  return out;
}

namespace detail {
// Each section's own `validate()`, nested sections first (`sac.encoder` before `sac`).
template <class Cfg>
void validate_sections(const Cfg& cfg) {
  boost::pfr::for_each_field(cfg, [](const auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      validate_sections(field.value);
      if constexpr (requires { field.value.validate(); }) field.value.validate();
    }
  });
}
}  // namespace detail

/// Checks every field's rule, then each section's own `validate()` and the config's (for
/// rules across fields). Throws ConfigError naming the field.
template <class Cfg>
void validate(const Cfg& cfg) {
  auto fs = fields(const_cast<Cfg&>(cfg));
  for (const auto& f : fs)
    if (auto why = f.check(); !why.empty())
      throw ConfigError(f.key + " = " + f.format() + " is out of range: " + why);
  detail::validate_sections(cfg);
  if constexpr (requires { cfg.validate(); }) cfg.validate();
}

/// `cfg`, validated (for a member initialiser).
template <class Cfg>
Cfg validated(Cfg cfg) {
  validate(cfg);
  return cfg;
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
    Setting entry;  // `field.K=V` for a field of free keys
    if (it == by_key.end())
      for (auto& f : fs)
        if (f.takes_keys && key.starts_with(f.key + ".") && key.size() > f.key.size() + 1) {
          it = by_key.find(f.key);
          entry = s;
          entry.entry = key.substr(f.key.size() + 1);
          break;
        }
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
    if (auto why = f.assign(entry.entry.empty() ? s : entry); !why.empty())
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
    if (f.acting) o << " [acting: may change on resume]";
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

/// The keys of the fields that change only how a trained policy acts (`FieldRole::acting`):
/// a run resumed or evaluated from a checkpoint may set them anew.
template <class Cfg>
std::vector<std::string> acting_keys(const Cfg& cfg) {
  std::vector<std::string> out;
  for (const auto& f : fields(const_cast<Cfg&>(cfg)))
    if (f.acting) out.push_back(f.key);
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
