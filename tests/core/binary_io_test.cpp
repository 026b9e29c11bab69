// BinaryWriter / BinaryReader: atomic replacement, and damaged files refused with the
// file and the field named; CRC-32C against its published check value.
#include <anvil/core/binary_io.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <anvil/core/detail/crc32c.hpp>

#include "../damaged_files.hpp"

namespace fs = std::filesystem;
using anvil::BinaryReader;
using anvil::BinaryWriter;

namespace {
fs::path temp_dir(const std::string& name) { return anvil::test::fresh_temp_dir("anvil_binary_io", name); }

void write_file(const fs::path& p, std::int64_t value, std::size_t payload) {
  BinaryWriter w(p, "anvil Test v1");
  w.value(value);
  std::vector<unsigned char> data(payload, static_cast<unsigned char>(value));
  w.bytes(data.data(), data.size());
  w.commit();
}

// Reads what write_file wrote; returns the value.
std::int64_t read_file(const fs::path& p, std::size_t payload) {
  BinaryReader r(p, "anvil Test v1");
  const auto v = r.value<std::int64_t>("value");
  std::vector<unsigned char> data(payload);
  r.bytes(data.data(), data.size(), "payload");
  r.finish();
  return v;
}

}  // namespace

TEST_CASE("Crc32c: the published check value, and the hardware path agrees with the table in any split") {
  const std::string check = "123456789";
  anvil::detail::Crc32c c;
  c.update(check.data(), check.size());
  CHECK(c.value() == 0xE3069283u);  // CRC-32C check value (RFC 3720, iSCSI)

  std::mt19937 g(7);
  std::vector<unsigned char> data(10007);
  for (auto& b : data) b = static_cast<unsigned char>(g());
  const std::uint32_t table = ~anvil::detail::Crc32c::portable(0xFFFFFFFFu, data.data(), data.size());
  for (std::size_t split : {0u, 1u, 7u, 8u, 13u, 4096u, 10007u}) {
    anvil::detail::Crc32c s;
    s.update(data.data(), split);
    s.update(data.data() + split, data.size() - split);
    CHECK(s.value() == table);
  }
}

TEST_CASE("BinaryReader: a file round-trips, truncated, corrupted, extended and foreign files are refused") {
  const auto dir = temp_dir("refuse");
  const auto file = dir / "f.bin";
  write_file(file, 42, 1000);
  CHECK(read_file(file, 1000) == 42);
  const auto size = fs::file_size(file);

  CHECK_THROWS_WITH_AS(read_file(anvil::test::copy_truncated(file, dir / "cut.bin", size - 100), 1000), doctest::Contains("payload is cut short (truncated file?)"),
                       anvil::Error);
  CHECK_THROWS_WITH_AS(read_file(anvil::test::copy_truncated(file, dir / "nocrc.bin", size - 2), 1000), doctest::Contains("checksum is missing"), anvil::Error);

  CHECK_THROWS_WITH_AS(read_file(anvil::test::copy_with_flipped_bit(file, dir / "flipped.bin",
                                                                     static_cast<std::int64_t>(size / 2)),
                                 1000),
                       doctest::Contains("flipped.bin': checksum does not match the contents (corrupted file?)"),
                       anvil::Error);

  fs::copy_file(file, dir / "longer.bin");
  std::ofstream(dir / "longer.bin", std::ios::app | std::ios::binary) << "x";
  CHECK_THROWS_WITH_AS(read_file(dir / "longer.bin", 1000), doctest::Contains("is followed by unexpected bytes"),
                       anvil::Error);

  {
    BinaryWriter w(dir / "other.bin", "anvil Other v1");
    w.commit();
  }
  CHECK_THROWS_WITH_AS(read_file(dir / "other.bin", 1000), doctest::Contains("is not an anvil Test v1 file"),
                       anvil::Error);
  CHECK_THROWS_WITH_AS(read_file(dir / "missing.bin", 1000), doctest::Contains("cannot read"), anvil::Error);
  fs::remove_all(dir);
}

TEST_CASE("BinaryWriter: a process killed mid-save leaves the previous file intact and loadable") {
  const auto dir = temp_dir("kill");
  const auto file = dir / "f.bin";
  write_file(file, 1, 1 << 20);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // writes half of a new version, then dies without committing
    BinaryWriter w(file, "anvil Test v1");
    w.value(std::int64_t{2});
    std::vector<unsigned char> half(1 << 19, 2);
    w.bytes(half.data(), half.size());
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(read_file(file, 1 << 20) == 1);
  // A later save replaces it (and the stale temporary file with it).
  write_file(file, 3, 1 << 20);
  CHECK(read_file(file, 1 << 20) == 3);
  CHECK_FALSE(fs::exists(dir / "f.bin.tmp"));
  fs::remove_all(dir);
}
