#pragma once
/// @file
/// `policy_config<P>`: the config section of a policy (algorithm, buffer, loop, parallelism,
/// precision) without the policy's class: its type (`type`) and its name (`section`). A
/// policy declares them as `Config` and `config_section`, which is what the primary template
/// reads; the built-in policies that `anvil::compiled::Trainer` names also specialise it in
/// a light header next to their config, so a Trainer's config can be built in a translation
/// unit that never sees torch (`anvil/compiled.hpp`). Both ways give the same type: the
/// Trainer checks it. Light header.

#include <anvil/core/param.hpp>

namespace anvil {

/// A policy's config type and section name (see file comment).
template <class P>
struct policy_config {
  using type = typename P::Config;
  static constexpr auto section = P::config_section;
};

template <class P>
using policy_config_t = typename policy_config<P>::type;

}  // namespace anvil
