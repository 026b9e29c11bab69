// check_policy_in_python(policy, cases): anvil.load_policy in Python (python/anvil/policy.py)
// against the actions a C++ policy took. The C++ test writes its inputs and actions as
// safetensors beside the policy; tests/python/policy_check.py builds the torch module from
// policy.safetensors, acts on the same inputs and compares (1e-5; discrete actions exactly).
// Skipped visibly (ANVIL_SKIP) where the build has no Python module or its Python no torch.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/safetensors.hpp>

#include "skip.hpp"

namespace anvil::test {

/// The output of a shell command, prefixed "FAILED: " when it exits non-zero.
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return "FAILED: popen";
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  return ::pclose(f) == 0 ? out : "FAILED: " + out;
}

}  // namespace anvil::test

// A macro, so that its skip ends the calling test case.
#if defined(ANVIL_TEST_PYTHON) && defined(ANVIL_TEST_PYTHON_PACKAGE)
#define ANVIL_CHECK_POLICY_IN_PYTHON(policy, ...)                                                                  \
  do {                                                                                                            \
    const std::string py_ = ANVIL_TEST_PYTHON;                                                                    \
    if (anvil::test::run_command(py_ + " -c 'import torch' 2>&1").rfind("FAILED", 0) == 0)                       \
      ANVIL_SKIP(py_ << " has no torch (Debian: python3-torch)");                                                 \
    const std::filesystem::path policy_ = (policy);                                                               \
    const auto cases_ = policy_.parent_path() / "cases.safetensors";                                              \
    anvil::safetensors::write(cases_, __VA_ARGS__);                                                               \
    const auto out_ = anvil::test::run_command("PYTHONPATH=" ANVIL_TEST_PYTHON_PACKAGE " " + py_ + " " +         \
                                               ANVIL_TEST_POLICY_CHECK + std::string(" ") + policy_.string() +     \
                                               " " + cases_.string() + " 2>&1");                                   \
    REQUIRE_MESSAGE(out_.rfind("FAILED", 0) != 0, out_);                                                          \
    MESSAGE(out_);                                                                                                \
  } while (0)
#else
#define ANVIL_CHECK_POLICY_IN_PYTHON(policy, ...) ANVIL_SKIP("no Python module in this build (pybind11, python3-dev)")
#endif
