// TensorBoard event files read back byte by byte: TFRecord framing with both masked CRCs,
// then the Event, Summary, Value and HistogramProto messages decoded field by field.
#include <anvil/observe/tensorboard.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>


#include "../damaged_files.hpp"
#include "tfevents.hpp"

using namespace anvil;

using namespace anvil::test;


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
