#pragma once
/// @file
/// `write_file_atomic`: a whole file written so that readers see the old one or the new one,
/// never a torn one (run files, safetensors). Light header.

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <anvil/core/error.hpp>

namespace anvil {

/// Writes `text` to `path` atomically: a temporary file beside it, flushed, then renamed
/// over the target, so readers see the old file or the new one, never a torn one.
inline void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) throw Error("writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
}

}  // namespace anvil
