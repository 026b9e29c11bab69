// Test helper: reads TensorBoard event files back: TFRecord framing with both masked CRCs
// checked, and protocol-buffer messages decoded field by field. No torch.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <anvil/observe/tensorboard.hpp>

namespace anvil::test {

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

inline Message decode(const std::string& s) {
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
inline std::vector<std::string> records(const std::filesystem::path& file) {
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


/// Every scalar in an event file, as (tag, step, value), in file order.
struct ScalarEvent {
  std::string tag;
  std::int64_t step;
  float value;
};
inline std::vector<ScalarEvent> scalars(const std::filesystem::path& file) {
  std::vector<ScalarEvent> out;
  for (const auto& r : records(file)) {
    const auto e = decode(r);
    const auto summary = e.bytes.find(5);
    if (summary == e.bytes.end()) continue;
    const auto v = decode(decode(summary->second).bytes.find(1)->second);
    if (v.numbers.find(2) == v.numbers.end()) continue;  // a histogram
    out.push_back({v.bytes.find(1)->second, static_cast<std::int64_t>(e.numbers.find(2)->second), v.flt(2)});
  }
  return out;
}

}  // namespace anvil::test
