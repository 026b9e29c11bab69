#pragma once
/// @file
/// Provenance: what a run records about where it came from, in config.yaml (as comments, so
/// `--config config.yaml` still reads it back), summary.json and TensorBoard: the env, the
/// four policy types, anvil's and LibTorch's versions, the command line, the host, and the
/// git commit of the program when it was built from a git checkout (CMake's
/// `anvil_target_provenance(<target>)`, which every anvil program uses, compiles it in).
/// Light header.

#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include <anvil/core/type_name.hpp>
#include <anvil/core/version.hpp>
#include <anvil/observe/run_files.hpp>

// Defined by the file `anvil_target_provenance` compiles into a program; absent otherwise.
extern "C" const char* anvil_program_git_commit() __attribute__((weak));

namespace anvil {

/// The commit of the checkout the program was built from ("<sha>" or "<sha>-dirty"), or
/// "unknown" (not built from git, or without `anvil_target_provenance`).
[[nodiscard]] inline std::string program_git_commit() {
  const char* c = anvil_program_git_commit ? anvil_program_git_commit() : nullptr;
  return c && *c ? std::string(c) : std::string("unknown");
}

/// This process's command line, arguments separated by spaces (those with spaces quoted).
[[nodiscard]] inline std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out, arg;
  auto flush = [&] {
    if (!out.empty()) out += ' ';
    out += arg.find_first_of(" \t'\"") == std::string::npos && !arg.empty() ? arg : "'" + arg + "'";
    arg.clear();
  };
  for (char c : all) {
    if (c == '\0') flush();
    else arg += c;
  }
  if (!arg.empty()) flush();
  return out;
}

/// This machine's host name.
[[nodiscard]] inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

/// The time now in UTC, ISO 8601 ("2026-11-24T06:40:00Z").
[[nodiscard]] inline std::string utc_now() { return format_now("%Y-%m-%dT%H:%M:%SZ", true); }

}  // namespace anvil
