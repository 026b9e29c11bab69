#pragma once
/// @file
/// Binary files that are replaced atomically and read back with checks: `BinaryWriter`
/// writes next to the target and renames over it only when everything is written and
/// flushed, so a crash or kill mid-save leaves the previous file intact; `BinaryReader`
/// names the file and the field when a file is short, foreign, from another shape or
/// damaged. Every file ends with a CRC-32C of all bytes before it, which the reader checks
/// in `finish`: a loader reads into temporaries, calls `finish`, and only then replaces
/// its state, so a corrupted file changes nothing. Light header.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <fcntl.h>

#include <anvil/core/detail/crc32c.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

class BinaryWriter {
 public:
  /// Starts writing `path` (into `path` + ".tmp" until `commit`), with a format tag.
  BinaryWriter(std::filesystem::path path, const std::string& format)
      : path_(std::move(path)), tmp_(path_.string() + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw Error("cannot write '" + tmp_ + "' (does its directory exist?)");
    string(format);
  }
  /// Writes into memory instead of a file (`take_bytes()` ends it): the same format, checksum
  /// included, e.g. to send state from one rank to the others.
  static BinaryWriter in_memory(const std::string& format) { return BinaryWriter(format); }
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;
  ~BinaryWriter() {
    if (f_) {  // not committed: drop the partial file, keep the old one
      std::fclose(f_);
      if (!memory_) std::remove(tmp_.c_str());
    }
    std::free(mem_);
  }

  /// Ends an `in_memory` writer: its bytes, checksum appended.
  [[nodiscard]] std::vector<std::uint8_t> take_bytes() {
    const std::uint32_t crc = crc_.value();
    raw(&crc, sizeof crc);
    std::fclose(f_);  // sets mem_ and mem_size_
    f_ = nullptr;
    return std::vector<std::uint8_t>(reinterpret_cast<std::uint8_t*>(mem_),
                                     reinterpret_cast<std::uint8_t*>(mem_) + mem_size_);
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  void value(const T& v) { bytes(&v, sizeof v); }
  void string(const std::string& s) {
    value<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void bytes(const void* p, std::size_t n) {
    raw(p, n);
    crc_.update(p, n);
  }

  /// Appends the checksum, flushes to disk and renames over the target; then syncs the
  /// directory, so the rename itself survives a power cut.
  void commit() {
    const std::uint32_t crc = crc_.value();
    raw(&crc, sizeof crc);
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) throw Error("writing '" + tmp_ + "' failed (disk full?)");
    std::fclose(f_);
    f_ = nullptr;
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) throw Error("cannot rename '" + tmp_ + "' to '" + path_.string() + "': " + ec.message());
    const auto dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
    if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
  }

 private:
  explicit BinaryWriter(const std::string& format) : tmp_("(memory)"), memory_(true) {
    f_ = ::open_memstream(&mem_, &mem_size_);
    if (!f_) throw Error("cannot open a memory stream");
    string(format);
  }
  void raw(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw Error("writing '" + tmp_ + "' failed (disk full?)");
  }

  std::filesystem::path path_;
  std::string tmp_;
  std::FILE* f_ = nullptr;
  detail::Crc32c crc_;
  bool memory_ = false;
  char* mem_ = nullptr;
  std::size_t mem_size_ = 0;
};

class BinaryReader {
 public:
  /// Opens `path` and checks its format tag.
  BinaryReader(std::filesystem::path path, const std::string& format) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "rb");
    if (!f_) throw Error("cannot read '" + path_.string() + "'");
    check_tag(format);
  }
  /// Reads what an `in_memory` writer wrote (`take_bytes`); `name` stands for the file in messages.
  BinaryReader(const std::vector<std::uint8_t>& bytes, std::string name, const std::string& format)
      : path_(std::move(name)) {
    if (bytes.empty()) throw Error("'" + path_.string() + "' is empty");
    f_ = ::fmemopen(const_cast<std::uint8_t*>(bytes.data()), bytes.size(), "rb");
    if (!f_) throw Error("cannot open a memory stream");
    check_tag(format);
  }
  BinaryReader(const BinaryReader&) = delete;
  BinaryReader& operator=(const BinaryReader&) = delete;
  ~BinaryReader() {
    if (f_) std::fclose(f_);
  }


  template <class T>
    requires std::is_trivially_copyable_v<T>
  T value(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string string(const char* what) {
    const auto n = value<std::uint64_t>(what);
    if (n > (1u << 20)) fail(what, "has an implausible length");
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  void bytes(void* p, std::size_t n, const char* what) {
    if (n && std::fread(p, 1, n, f_) != n) fail(what, "is cut short (truncated file?)");
    crc_.update(p, n);
  }
  /// Checks the checksum at the end of the file against the bytes read, and that nothing
  /// follows it. Call it after reading everything and before using what was read.
  void finish() {
    const std::uint32_t computed = crc_.value();
    std::uint32_t stored = 0;
    if (std::fread(&stored, 1, sizeof stored, f_) != sizeof stored) fail("checksum", "is missing (truncated file?)");
    if (stored != computed) fail("checksum", "does not match the contents (corrupted file?)");
    if (std::fgetc(f_) != EOF) fail("end", "is followed by unexpected bytes");
  }
  /// Reads a value and checks it equals `expected`.
  template <class T>
  void expect(const T& expected, const char* what) {
    const T v = value<T>(what);
    if (v != expected) fail(what, "is " + std::to_string(v) + " in the file but " + std::to_string(expected) + " here");
  }
  [[noreturn]] void fail(const char* what, const std::string& why) const {
    throw Error("'" + path_.string() + "': " + what + " " + why);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void check_tag(const std::string& format) {
    std::string tag;
    try {
      tag = string("format tag");
    } catch (const Error&) {
      tag.clear();
    }
    if (tag != format) {
      std::fclose(f_);
      f_ = nullptr;
      throw Error("'" + path_.string() + "' is not an " + format + " file");
    }
  }

  std::filesystem::path path_;
  std::FILE* f_ = nullptr;
  detail::Crc32c crc_;
};

}  // namespace anvil
