// TensorBoard event files read back byte by byte: TFRecord framing with both masked CRCs,
// then the Event, Summary, Value and HistogramProto messages decoded field by field.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <anvil/observe/tensorboard.hpp>

#include "../damaged_files.hpp"

using namespace anvil;

namespace {

// A decoded protocol buffer: field number -> the values seen (varints and fixed as raw
// 64-bit, length-delimited as bytes).
struct Message {
  std::multimap<int, std::uint64_t> numbers;
  std::multimap<int, std::string> bytes;
  double dbl(int f) const {
    double d;
    const auto v = numbers.find(f)->second;
    std::memcpy(&d, &v, 8);
    return d;
  }
  float flt(int f) const {
    float x;
    const auto v = static_cast<std::uint32_t>(numbers.find(f)->second);
    std::memcpy(&x, &v, 4);
    return x;
  }
  std::vector<double> doubles(int f) const {
    const auto& s = bytes.find(f)->second;
    std::vector<double> out(s.size() / 8);
    std::memcpy(out.data(), s.data(), s.size());
    return out;
  }
};

Message decode(const std::string& s) {
  Message m;
  std::size_t i = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(i < s.size());
      const auto b = static_cast<unsigned char>(s[i++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < s.size()) {
    const auto key = varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 0) {
      m.numbers.emplace(field, varint());
    } else if (wire == 1 || wire == 5) {
      std::uint64_t v = 0;
      const std::size_t n = wire == 1 ? 8 : 4;
      REQUIRE(i + n <= s.size());
      std::memcpy(&v, s.data() + i, n);
      i += n;
      m.numbers.emplace(field, v);
    } else {
      REQUIRE(wire == 2);
      const auto n = varint();
      REQUIRE(i + n <= s.size());
      m.bytes.emplace(field, s.substr(i, n));
      i += n;
    }
  }
  return m;
}

// Every record of an event file, each CRC checked.
std::vector<std::string> records(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < all.size()) {
    REQUIRE(i + 12 <= all.size());
    std::uint64_t n;
    std::uint32_t len_crc, data_crc;
    std::memcpy(&n, all.data() + i, 8);
    std::memcpy(&len_crc, all.data() + i + 8, 4);
    CHECK(len_crc == tb::masked_crc(&n, 8));
    REQUIRE(i + 12 + n + 4 <= all.size());
    const std::string data = all.substr(i + 12, n);
    std::memcpy(&data_crc, all.data() + i + 12 + n, 4);
    CHECK(data_crc == tb::masked_crc(data.data(), data.size()));
    out.push_back(data);
    i += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("TensorBoard: the masked CRC-32C matches TFRecord's definition on a known value") {
  // CRC-32C("123456789") = 0xe3069283; masked: rotate right by 15, add 0xa282ead8.
  const std::uint32_t crc = 0xe3069283u;
  CHECK(tb::masked_crc("123456789", 9) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("TensorBoard: scalars and a histogram read back with every CRC and value") {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_tb_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::path file;
  {
    TensorBoardWriter w(dir);
    file = w.path();
    CHECK(file.filename().string().rfind("events.out.tfevents.", 0) == 0);
    w.scalar("eval/return", -123.5, 1000);
    w.scalar("train/critic_loss", 0.25, 2000);
    const std::vector<float> weights{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.0f, NAN};
    w.histogram("weights/actor", weights, 2000, 4);
  }
  const auto recs = records(file);
  REQUIRE(recs.size() == 4);
  const auto first = decode(recs[0]);
  CHECK(first.bytes.find(3)->second == "brain.Event:2");
  CHECK(first.dbl(1) > 1.7e9);  // wall time in seconds since 1970

  const auto e1 = decode(recs[1]);
  CHECK(e1.numbers.find(2)->second == 1000);
  const auto v1 = decode(decode(e1.bytes.find(5)->second).bytes.find(1)->second);
  CHECK(v1.bytes.find(1)->second == "eval/return");
  CHECK(v1.flt(2) == -123.5f);

  const auto e2 = decode(recs[2]);
  CHECK(e2.numbers.find(2)->second == 2000);
  const auto v2 = decode(decode(e2.bytes.find(5)->second).bytes.find(1)->second);
  CHECK(v2.bytes.find(1)->second == "train/critic_loss");
  CHECK(v2.flt(2) == 0.25f);

  const auto v3 = decode(decode(decode(recs[3]).bytes.find(5)->second).bytes.find(1)->second);
  CHECK(v3.bytes.find(1)->second == "weights/actor");
  const auto h = decode(v3.bytes.find(5)->second);
  CHECK(h.dbl(1) == -1.0);
  CHECK(h.dbl(2) == 1.0);
  CHECK(h.dbl(3) == 6.0);  // the NaN is left out
  CHECK(h.dbl(4) == doctest::Approx(1.0));
  CHECK(h.dbl(5) == doctest::Approx(3.5));
  CHECK(h.doubles(6) == std::vector<double>{-0.5, 0.0, 0.5, 1.0});
  CHECK(h.doubles(7) == std::vector<double>{1, 1, 1, 3});
  std::filesystem::remove_all(dir);
}

TEST_CASE("TensorBoard: a flipped bit is caught by the record's CRC") {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_tb_bad_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::path file;
  {
    TensorBoardWriter w(dir);
    file = w.path();
    w.scalar("x", 1.0, 1);
  }
  const auto bad = dir / "flipped";
  test::copy_with_flipped_bit(file, bad, std::filesystem::file_size(file) - 10);
  std::ifstream in(bad, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The second record: after the first (8 + 4 + n + 4 bytes).
  std::uint64_t n0;
  std::memcpy(&n0, all.data(), 8);
  const std::size_t at = 16 + n0;
  std::uint64_t n;
  std::memcpy(&n, all.data() + at, 8);
  std::uint32_t stored;
  std::memcpy(&stored, all.data() + at + 12 + n, 4);
  CHECK(stored != tb::masked_crc(all.data() + at + 12, n));
  std::filesystem::remove_all(dir);
}
