#pragma once
/// @file
/// `type_name<T>()`: a type's name as the compiler spells it, at compile time. Provenance
/// records the policy types by it and the config hash covers them. Light header.

#include <string_view>

namespace anvil_type_names {
// Outside namespace anvil, so that the compiler spells anvil's types in full.
template <class T>
constexpr std::string_view of() {
  std::string_view p = __PRETTY_FUNCTION__;  // "... of() [with T = anvil::BasicSAC<>; ...]"
  const auto b = p.find("T = ");
  if (b == std::string_view::npos) return p;
  p.remove_prefix(b + 4);
  return p.substr(0, p.find_first_of(";]"));
}
}  // namespace anvil_type_names

namespace anvil {

/// `T`'s name as the compiler spells it ("anvil::BasicSAC<>").
template <class T>
constexpr std::string_view type_name() {
  return anvil_type_names::of<T>();
}

}  // namespace anvil
