#pragma once
/// @file
/// `PolicyTensors`: an algorithm's acting network as named tensors, the form a run writes
/// as policy.safetensors (algorithms/policy.hpp `write_policy_tensors`) and `anvil.load_policy`
/// in Python rebuilds as a torch module (python/anvil/policy.py).

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

/// What an algorithm's `policy_tensors()` gives (the `ExportsTensors` concept).
struct PolicyTensors {
  /// The module anvil.load_policy builds ("GaussianActor", "PpoActor", "ComaActor", ...).
  std::string kind;
  /// Its parameters under the names that module gives them (`load_state_dict` takes them).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  /// Its sizes and settings, as strings (safetensors metadata).
  std::map<std::string, std::string> meta;
  /// Its continuous actions are unbounded (PPO's Gaussian mean): the env-unit transform
  /// clips them to [action_low, action_high] first, as the run's collector does.
  bool clips_actions = false;
};

/// The parameters of `module` as `prefix` + their names (the live tensors).
template <class Module>
std::vector<std::pair<std::string, at::Tensor>> named_parameters_of(const Module& module, const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(prefix + item.key(), item.value());
  return out;
}

/// The parameters of `module` as `prefix` + their names, detached float32 copies on the CPU.
template <class Module>
void add_module_tensors(PolicyTensors& p, const std::string& prefix, const Module& module) {
  for (auto& [name, t] : named_parameters_of(module, prefix))
    p.tensors.emplace_back(name, t.detach().to(at::kCPU, at::kFloat).clone());
}

/// `v` as "a,b,c" (metadata lists such as hidden widths).
inline std::string comma_list(const std::vector<int>& v) {
  std::string s;
  for (const int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

/// `v` with every digit a double has (metadata numbers).
inline std::string exact_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return std::string(buf);
}

/// The name a config reads for the value `e` of an enum with `enum_names` (core/param.hpp).
template <class E>
std::string enum_text(E e) {
  return std::string(enum_names(e)[static_cast<std::size_t>(e)]);
}

}  // namespace anvil
