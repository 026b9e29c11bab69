// safetensors (core/safetensors.hpp): round trips of every dtype anvil reads, files written
// and read by a numpy reader and writer written independently in the test
// (tests/python/safetensors_numpy.py), and damaged files refused, naming the tensor.
#include <anvil/core/safetensors.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>


#include "../damaged_files.hpp"
#include "../python_policy_check.hpp"

namespace fs = std::filesystem;
namespace st = anvil::safetensors;

namespace {
fs::path temp_dir(const std::string& name) { return anvil::test::fresh_temp_dir("anvil_safetensors", name); }

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void put(const fs::path& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << b;
}
// A file of one header (given as JSON text, unpadded) and `data` bytes.
std::string file_with(const std::string& header, const std::string& data) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  return f + header + data;
}

std::string refusal(const fs::path& p) {
  try {
    (void)st::read(p);
  } catch (const st::FormatError& e) {
    return e.what();
  }
  return "";
}

using anvil::test::run_command;
}  // namespace

TEST_CASE("safetensors: every dtype round-trips with its shape and metadata, the data 8-byte aligned") {
  const auto dir = temp_dir("round");
  std::vector<std::pair<std::string, at::Tensor>> ts{
      {"f32", at::arange(12, at::kFloat).reshape({3, 4}) * 0.5},
      {"f64", at::tensor({1.5, -2.25}, at::kDouble)},
      {"f16", at::tensor({0.5f, 4.0f}).to(at::kHalf)},
      {"bf16", at::tensor({1.0f, -3.0f}).to(at::kBFloat16)},
      {"i64", at::tensor({std::int64_t{1} << 40, std::int64_t{-7}})},
      {"i32", at::tensor({3, 4, 5}, at::kInt)},
      {"u8", at::tensor({255, 0}).to(at::kByte)},
      {"bool", at::tensor({1, 0, 1}).to(at::kBool)},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"empty", at::empty({0, 3}, at::kFloat)},
      {"strided", at::arange(6, at::kFloat).reshape({2, 3}).t()}};  // written contiguous
  st::write(dir / "a.safetensors", ts, {{"format", "anvil test"}, {"hidden", "256,256"}});
  const auto b = bytes_of(dir / "a.safetensors");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[static_cast<std::size_t>(i)])) << (8 * i);
  CHECK((8 + n) % 8 == 0);
  const auto f = st::read(dir / "a.safetensors");
  REQUIRE(f.tensors.size() == ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    CHECK(f.tensors[i].first == ts[i].first);
    CHECK((f.tensors[i].second.scalar_type() == ts[i].second.scalar_type()));
    CHECK((f.tensors[i].second.sizes() == ts[i].second.sizes()));
    CHECK(at::equal(f.tensors[i].second, ts[i].second.contiguous()));
  }
  CHECK(f.metadata.at("hidden") == "256,256");
  CHECK(at::equal(f.at("i64"), ts[4].second));
  CHECK_THROWS_WITH_AS((void)f.at("nope", "a.safetensors"), doctest::Contains("no tensor 'nope'"), st::FormatError);
  CHECK_THROWS_WITH_AS(st::write(dir / "b.safetensors", {{"x", at::ones({1})}, {"x", at::ones({1})}}),
                       doctest::Contains("tensor 'x' given twice"), st::FormatError);
  CHECK_THROWS_WITH_AS(st::write(dir / "b.safetensors", {{"c", at::ones({1}, at::kComplexFloat)}}),
                       doctest::Contains("tensor 'c'"), st::FormatError);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: a numpy reader written in the test reads anvil's files, and anvil reads the numpy writer's") {
#ifndef ANVIL_TEST_PYTHON
  MESSAGE("ANVIL-SKIPPED: no Python with numpy in this build");
#else
  const std::string py = ANVIL_TEST_PYTHON, script = ANVIL_TEST_SAFETENSORS_NUMPY;
  if (run_command(py + " -c 'import numpy' 2>&1").rfind("FAILED", 0) == 0) {
    const std::string why = "ANVIL-SKIPPED: " + py + " has no numpy";
    MESSAGE(why);
    return;
  }
  const auto dir = temp_dir("numpy");
  st::write(dir / "anvil.safetensors",
            {{"weights", at::arange(12, at::kFloat).reshape({3, 4}) * 0.5 - 1.0},
             {"half", at::tensor({0.5f, 4.0f}).to(at::kBFloat16)},
             {"steps", at::tensor({std::int64_t{1}, std::int64_t{-2}, std::int64_t{1} << 40})},
             {"flags", at::tensor({1, 0, 1}).to(at::kBool)}},
            {{"written_by", "anvil"}});
  const auto out = run_command(py + " " + script + " read " + (dir / "anvil.safetensors").string());
  REQUIRE_MESSAGE(out.rfind("FAILED", 0) != 0, out);
  const auto j = nlohmann::json::parse(out);
  CHECK(j["__metadata__"]["written_by"] == "anvil");
  CHECK(j["weights"][0] == "F32");
  CHECK(j["weights"][1] == nlohmann::json({3, 4}));
  CHECK(j["weights"][2].get<double>() == doctest::Approx(21.0));
  CHECK(j["weights"][3].get<double>() == doctest::Approx(-1.0));
  CHECK(j["half"][2].get<double>() == doctest::Approx(4.5));
  CHECK(j["steps"][2].get<double>() == doctest::Approx(1099511627775.0));
  CHECK(j["flags"][2].get<double>() == doctest::Approx(2.0));

  REQUIRE(run_command(py + " " + script + " write " + (dir / "numpy.safetensors").string()).empty());
  const auto f = st::read(dir / "numpy.safetensors");
  CHECK(f.metadata.at("written_by") == "numpy");
  CHECK(at::allclose(f.at("weights"), at::arange(12, at::kFloat).reshape({3, 4}) * 0.5 - 1.0));
  CHECK(f.at("steps")[2].item<std::int64_t>() == (std::int64_t{1} << 40));
  CHECK(f.at("scalar").dim() == 0);
  CHECK(f.at("scalar").item<double>() == 2.25);
  CHECK((f.at("flags").scalar_type() == at::kBool));
  CHECK((f.at("empty").sizes() == at::IntArrayRef({0, 3})));
  fs::remove_all(dir);
#endif
}

TEST_CASE("safetensors: truncated files and lying or misaligned offsets are refused, naming the tensor") {
  const auto dir = temp_dir("bad");
  const auto p = dir / "bad.safetensors";
  st::write(p, {{"a", at::ones({4})}, {"b", at::ones({2}, at::kDouble)}});
  const auto good = bytes_of(p);

  put(p, good.substr(0, 5));
  CHECK(refusal(p).find("truncated: 5 bytes, no header length") != std::string::npos);
  put(p, good.substr(0, good.size() - 3));  // the data cut short
  CHECK(refusal(p).find("outside the") != std::string::npos);
  put(p, good.substr(0, 20));  // inside the header
  CHECK(refusal(p).find("the header length says") != std::string::npos);

  // Lying headers: a span that is not the shape's bytes, offsets past the data, a gap, an
  // overlap (misaligned offsets), bytes after the last tensor.
  const std::string data(16 + 16, '\0');
  auto check = [&](const std::string& header, const std::string& d, const std::string& expect) {
    put(p, file_with(header, d));
    const auto why = refusal(p);
    CHECK_MESSAGE(why.find(expect) != std::string::npos, why);
    CHECK_MESSAGE(why.find(p.string()) != std::string::npos, why);
  };
  check(R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", std::string(16, '\0'),
        "tensor 'w': data_offsets span 16 bytes; shape [5] of F32 needs 20");
  check(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", std::string(16, '\0'),
        "tensor 'w': data_offsets [16, 32] lie outside the 16 bytes of data");
  check(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
        std::string(20, '\0'), "tensor 'v': misaligned offsets: its data starts at byte 12, after a gap from byte 8");
  check(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        std::string(12, '\0'), "inside the tensor before it (overlap)");
  check(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(12, '\0'),
        "4 bytes of data after the last tensor's");
  // A float starting off its alignment (after a byte tensor), as other tools write them: read.
  const float x = 1.5f;
  put(p, file_with(R"({"u":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                   std::string("\x07\x09") + std::string(reinterpret_cast<const char*>(&x), 4)));
  CHECK(st::read(p).at("w").item<float>() == 1.5f);
  check(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'), "tensor 'w': dtype Q7 is not one anvil reads");
  check(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'),
        "tensor 'w': shape [-1] has a dimension that is not a non-negative integer");
  check(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'), "tensor 'w': needs dtype, shape and data_offsets");
  check(R"({"w":)", data, "the header is not JSON");
  check(R"({"__metadata__":{"k":1}})", "", "__metadata__['k'] is not a string");
  fs::remove_all(dir);
}
