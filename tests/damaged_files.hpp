// Test helper: damaged copies of files, for the tests that check that checked binary files
// (buffers, checkpoints, policies, safetensors) refuse them, and a fresh folder to make them
// in. No torch.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace anvil::test {

/// An empty folder of this process's own under the system's temporary folder:
/// `<tmp>/<prefix>_<pid>_<name>`.
inline std::filesystem::path fresh_temp_dir(const std::string& prefix, const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

/// Copies `from` to `to` with one bit flipped in the byte at `offset` (a negative offset
/// counts from the end); returns `to`.
inline std::filesystem::path copy_with_flipped_bit(const std::filesystem::path& from,
                                                   const std::filesystem::path& to, std::int64_t offset) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  const auto size = static_cast<std::int64_t>(std::filesystem::file_size(to));
  const auto at = static_cast<std::streamoff>(offset < 0 ? size + offset : offset);
  std::fstream f(to, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x01));
  return to;
}

/// Copies `from` to `to` cut to `bytes`; returns `to`.
inline std::filesystem::path copy_truncated(const std::filesystem::path& from, const std::filesystem::path& to,
                                            std::uintmax_t bytes) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(to, bytes);
  return to;
}

}  // namespace anvil::test
