// A fresh, empty run directory per test process and name, under the system's temp dir.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

inline std::string temp_run_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("anvil_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}
