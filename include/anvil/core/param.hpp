#pragma once
/// @file
/// Typed, self-describing configuration fields.
///
/// A policy's `Config` is a plain aggregate whose fields are `Param`s. Each `Param` carries
/// its key, its help text and its validation rule in its type, so `config.hpp` can walk a
/// config with Boost.PFR and derive the command line, YAML files, `--help`, printing,
/// hashing and validation from the struct alone, with no hand-kept list of keys:
///
///     struct Config {
///       Param<int, "batch_size", "samples per gradient step", at_least(1)> batch_size{256};
///       Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
///     };
///     Config c{.batch_size = 512};    // designated initializers work
///     int b = c.batch_size;           // reads like the value
///
/// Light header: standard library only.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace anvil {

/// A string usable as a template argument (`Param<int, "batch_size", ...>`).
template <std::size_t N>
struct FixedString {
  char data[N]{};
  constexpr FixedString(const char (&s)[N]) noexcept { std::copy_n(s, N, data); }  // NOLINT
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {data, N - 1}; }
  constexpr operator std::string_view() const noexcept { return view(); }  // NOLINT
};

/// A validation rule for numbers: `lo <= x <= hi`, either end open or unbounded.
/// Written as a template argument, so the rule lives in the field's type.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  [[nodiscard]] constexpr bool contains(double x) const noexcept {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  [[nodiscard]] constexpr bool bounded() const noexcept {
    return lo != -std::numeric_limits<double>::infinity() ||
           hi != std::numeric_limits<double>::infinity();
  }
};

/// No constraint beyond the type.
inline constexpr Range any_value{};
/// `x >= lo`.
constexpr Range at_least(double lo) noexcept { return Range{.lo = lo}; }
/// `x > lo`.
constexpr Range greater_than(double lo) noexcept { return Range{.lo = lo, .lo_open = true}; }
/// `lo <= x <= hi`.
constexpr Range in_range(double lo, double hi) noexcept { return Range{.lo = lo, .hi = hi}; }
/// `lo < x <= hi`.
constexpr Range in_range_open_low(double lo, double hi) noexcept {
  return Range{.lo = lo, .hi = hi, .lo_open = true};
}
/// `x > 0`.
inline constexpr Range positive = greater_than(0.0);

/// Names of an enum's values, for configs: declare next to the enum
///     constexpr auto enum_names(LrScaling) { return std::array<std::string_view, 3>{...}; }
/// and found by argument-dependent lookup. Value i is named `enum_names(E{})[i]`.
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) };
  { enum_names(e)[0] } -> std::convertible_to<std::string_view>;
};

namespace detail {
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
}  // namespace detail

/// The value of a field of free keys (`env.kwargs.K=V`): strings by key, in key order.
using KeyValues = std::map<std::string, std::string>;

/// Value types a `Param` may hold.
template <class T>
concept ParamScalar = std::same_as<T, bool> || std::integral<T> || std::floating_point<T> ||
                      std::same_as<T, std::string> || NamedEnum<T>;
template <class T>
concept ParamValue = ParamScalar<T> || std::same_as<T, KeyValues> ||
                     (detail::is_vector<T>::value && ParamScalar<typename T::value_type> &&
                      !std::same_as<typename T::value_type, bool>);

/// What a field changes, in its type. `learning` (the default): what a run learns, holds or
/// collects, so a resumed run must keep it. `acting`: only how a trained policy picks its
/// actions when it is evaluated (a sampler, its number of steps), never its weights, its
/// state or the data it learns from, so a run resumed or evaluated from a checkpoint may set
/// it anew (`--diffusion.sampler=ddpm` on a run trained with DDIM).
enum class FieldRole { learning, acting };

/// One configuration field: a value of type `T` with its key, help, rule and role in its
/// type. For vectors the rule applies to each element.
template <ParamValue T, FixedString Name, FixedString Help, Range Rule = any_value, FieldRole Role = FieldRole::learning>
struct Param {
  using value_type = T;
  static constexpr std::string_view name = Name.view();
  static constexpr std::string_view help = Help.view();
  static constexpr Range rule = Rule;
  static constexpr FieldRole role = Role;

  T value{};

  constexpr Param() = default;
  constexpr Param(T v) : value(std::move(v)) {}  // NOLINT: implicit, so `.x = 3` works
  constexpr Param(const char* s)                 // NOLINT: `.device = "cpu"`
    requires std::same_as<T, std::string>
      : value(s) {}
  template <class U>
  constexpr Param(std::initializer_list<U> l)  // `.hidden = {256, 256}`
    requires detail::is_vector<T>::value && std::convertible_to<U, typename T::value_type>
      : value(l.begin(), l.end()) {}

  constexpr operator const T&() const noexcept { return value; }  // NOLINT
  constexpr const T& operator*() const noexcept { return value; }
  constexpr T& operator*() noexcept { return value; }
  constexpr const T* operator->() const noexcept { return &value; }
  constexpr Param& operator=(T v) {
    value = std::move(v);
    return *this;
  }
  template <class U>
  constexpr Param& operator=(std::initializer_list<U> l)
    requires detail::is_vector<T>::value && std::convertible_to<U, typename T::value_type>
  {
    value.assign(l.begin(), l.end());
    return *this;
  }
  constexpr Param& operator=(const char* s)
    requires std::same_as<T, std::string>
  {
    value = s;
    return *this;
  }
  friend constexpr bool operator==(const Param& a, const Param& b) { return a.value == b.value; }
};

/// A named group of fields inside a config: `Section<"actor", ActorConfig> actor;` gives keys
/// `actor.<field>`. The Trainer's config is a struct of sections, one per policy. A section
/// named "" is inline: its fields join the enclosing section's (`Section<"", UpdateFields>`
/// in a `train` section gives `train.ema_decay`), so field groups several configs share are
/// declared once.
template <FixedString Name, class Cfg>
struct Section {
  static constexpr std::string_view name = Name.view();
  using config_type = Cfg;
  Cfg value{};

  constexpr const Cfg* operator->() const noexcept { return &value; }
  constexpr Cfg* operator->() noexcept { return &value; }
  constexpr const Cfg& operator*() const noexcept { return value; }
  constexpr Cfg& operator*() noexcept { return value; }
};

namespace detail {
template <class T> struct is_param : std::false_type {};
template <class T, FixedString N, FixedString H, Range R, FieldRole F>
struct is_param<Param<T, N, H, R, F>> : std::true_type {};
template <class T> struct is_section : std::false_type {};
template <FixedString N, class C> struct is_section<Section<N, C>> : std::true_type {};
}  // namespace detail

/// `T` is a `Param<...>`.
template <class T>
concept IsParam = detail::is_param<std::remove_cvref_t<T>>::value;
/// `T` is a `Section<...>`.
template <class T>
concept IsSection = detail::is_section<std::remove_cvref_t<T>>::value;

}  // namespace anvil
