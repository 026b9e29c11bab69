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
#include <cstring>
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

  /// The file being written ("memory" for an in-memory writer), for messages.
  [[nodiscard]] std::string target() const { return memory_ ? std::string("memory") : path_.string(); }

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

  /// Bytes written so far (the format tag included).
  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }

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
    written_ += n;
  }

  std::filesystem::path path_;
  std::string tmp_;
  std::FILE* f_ = nullptr;
  detail::Crc32c crc_;
  bool memory_ = false;
  char* mem_ = nullptr;
  std::size_t mem_size_ = 0;
  std::uint64_t written_ = 0;
};

class BinaryReader {
 public:
  /// Opens `path` and checks its format tag.
  BinaryReader(std::filesystem::path path, const std::string& format) : path_(std::move(path)) {
    std::error_code ec;
    if (std::filesystem::is_directory(path_, ec)) throw Error("cannot read '" + path_.string() + "': it is a directory");
    f_ = std::fopen(path_.c_str(), "rb");
    if (!f_) throw Error("cannot read '" + path_.string() + "'");
    size_ = static_cast<std::int64_t>(std::filesystem::file_size(path_, ec));
    if (ec) size_ = INT64_MAX;
    check_tag(format);
  }
  /// Reads what an `in_memory` writer wrote (`take_bytes`); `name` stands for the file in messages.
  BinaryReader(const std::vector<std::uint8_t>& bytes, std::string name, const std::string& format)
      : path_(std::move(name)) {
    if (bytes.empty()) throw Error("'" + path_.string() + "' is empty");
    f_ = ::fmemopen(const_cast<std::uint8_t*>(bytes.data()), bytes.size(), "rb");
    if (!f_) throw Error("cannot open a memory stream");
    size_ = static_cast<std::int64_t>(bytes.size());
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
  /// Bytes left to read: a size field read from the file can be checked against it before
  /// anything of that size is allocated (a flipped bit must not ask for gigabytes).
  [[nodiscard]] std::int64_t remaining() const {
    const long at = std::ftell(f_);
    return at < 0 ? INT64_MAX : size_ - static_cast<std::int64_t>(at);
  }
  /// Fails naming `what` unless `n` more bytes are left in the file.
  void expect_available(std::int64_t n, const char* what) {
    if (n < 0 || n > remaining())
      fail(what, "ask for " + std::to_string(n) + " bytes, but the file has " + std::to_string(remaining()) +
                     " left (a corrupted size field, or a truncated file?)");
  }

  void bytes(void* p, std::size_t n, const char* what) {
    if (n && std::fread(p, 1, n, f_) != n) fail(what, "is cut short (truncated file?)");
    crc_.update(p, n);
    consumed_ += n;
  }
  /// Bytes read so far (the format tag included).
  [[nodiscard]] std::uint64_t consumed() const noexcept { return consumed_; }
  /// Names the part of the file being read in every message from here on (e.g. "section
  /// 'algorithm'"); empty for none.
  void set_context(std::string context) { context_ = std::move(context); }
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
  /// Throws naming the file, the part being read and `what` is wrong with it. When the
  /// bytes after this point do not match the file's checksum, the file is damaged and that
  /// is what the message says (a flipped bit in a size field would otherwise read as a
  /// misleading "wrong size").
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    const std::string where = "'" + path_.string() + "'" + (context_.empty() ? "" : " (" + context_ + ")") + ": ";
    if (!failing_ && f_) {
      failing_ = true;
      if (damaged()) throw Error("'" + path_.string() + "': checksum does not match the contents (corrupted file?); " +
                                 "reading it found: " + what + " " + why);
    }
    throw Error(where + what + " " + why);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  // Whether the rest of the file fails its checksum (the last 4 bytes). Unknown (false)
  // when the file ends too soon to tell: a "cut short" message says more.
  bool damaged() {
    detail::Crc32c crc = crc_;
    std::vector<unsigned char> held;  // the last 4 bytes read, which may be the checksum
    unsigned char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f_)) > 0;) {
      held.insert(held.end(), buf, buf + n);
      if (held.size() > 4) {
        crc.update(held.data(), held.size() - 4);
        held.erase(held.begin(), held.end() - 4);
      }
    }
    if (held.size() < 4) return false;
    std::uint32_t stored = 0;
    std::memcpy(&stored, held.data(), 4);
    return stored != crc.value();
  }

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
  std::int64_t size_ = INT64_MAX;  ///< bytes in the file
  detail::Crc32c crc_;
  std::uint64_t consumed_ = 0;
  std::string context_;
  bool failing_ = false;
};

}  // namespace anvil
