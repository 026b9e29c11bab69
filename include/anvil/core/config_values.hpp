#pragma once
/// @file
/// The config system's values (core/config.hpp): a setting before it applies (`Setting`),
/// and per value type how a field reads, prints, quotes as YAML and checks its range,
/// behind a type-erased view of one field (`detail::FieldRef`), found by walking a config
/// struct with Boost.PFR. Light header: no torch.

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
  /// For a field of free keys (`KeyValues`): the key after the field's (`g` of
  /// `env.kwargs.g`); empty when the setting names the field itself.
  std::string entry{};
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

template <class T> struct is_key_values : std::false_type {};
template <> struct is_key_values<KeyValues> : std::true_type {};

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
  else if constexpr (is_key_values<T>::value) return "KEY=VALUE pairs";
  else return "list of " + type_name<typename T::value_type>();
}

template <class T>
std::string format_value(const T& v) {
  if constexpr (std::same_as<T, bool>) return v ? "true" : "false";
  else if constexpr (std::same_as<T, std::string>) return v;
  else if constexpr (NamedEnum<T>) return std::string(enum_names(v)[static_cast<std::size_t>(v)]);
  else if constexpr (std::integral<T>) return std::to_string(v);
  else if constexpr (std::floating_point<T>) return format_double(static_cast<double>(v));
  else if constexpr (is_key_values<T>::value) {
    std::string s = "{";
    for (const auto& [k, x] : v) s += (s.size() > 1 ? ", " : "") + k + ": " + x;
    return s + "}";
  } else {
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
  else if constexpr (is_key_values<T>::value) {  // a flow mapping, read back key by key
    std::string s = "{";
    for (const auto& [k, x] : v) s += (s.size() > 1 ? ", " : "") + k + ": " + yaml_quote(x);
    return s + "}";
  } else if constexpr (is_vector<T>::value) {
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
    if constexpr (is_key_values<T>::value) {
      if (s.is_list) return "expected KEY=VALUE pairs or keys of their own (" + s.key + ".KEY=VALUE), got a list";
      if (!s.entry.empty()) {  // one key: `env.kwargs.g=9.81`
        target[s.entry] = s.values.empty() ? std::string() : s.values.front();
        return {};
      }
      T out;  // the whole field: `env.kwargs=g=9.81,m=2` (empty: none)
      std::string_view v = s.values.empty() ? std::string_view() : s.values.front();
      while (!v.empty()) {
        const auto comma = v.find(',');
        const auto pair = v.substr(0, comma);
        const auto eq = pair.find('=');
        if (eq == std::string_view::npos || eq == 0) return "expected KEY=VALUE, got '" + std::string(pair) + "'";
        out[std::string(pair.substr(0, eq))] = std::string(pair.substr(eq + 1));
        if (comma == std::string_view::npos) break;
        v.remove_prefix(comma + 1);
      }
      target = std::move(out);
      return {};
    } else if constexpr (is_vector<T>::value) {
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
  bool takes_keys = false;  ///< a field of free keys (`KeyValues`): `key.K` sets one
  bool acting = false;      ///< only how a trained policy acts (`FieldRole::acting`)

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
      collect_fields(field.value, F::name.empty() ? prefix : prefix + std::string(F::name) + ".", out);
    } else if constexpr (IsParam<F>) {
      using T = typename F::value_type;
      FieldRef r;
      r.key = prefix + std::string(F::name);
      r.leaf = F::name;
      r.help = F::help;
      r.type = type_name<T>();
      r.rule = format_range(F::rule);
      r.is_bool = std::same_as<T, bool>;
      r.takes_keys = is_key_values<T>::value;
      r.acting = F::role == FieldRole::acting;
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
}  // namespace detail

}  // namespace anvil
