#pragma once
/// @file
/// safetensors, the weights format Hugging Face and PyTorch users exchange, written and read
/// by anvil: an 8-byte little-endian header length N, N bytes of JSON (`{"name": {"dtype":
/// "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {"key":
/// "value"}}`, padded with spaces), then the tensors' raw little-endian bytes, each
/// tensor's offsets relative to the start of that data. Written atomically (a temporary
/// file renamed over the target), the header padded so the data starts 8-byte aligned.
///
/// Reading checks everything before it trusts anything: the length against the file, the
/// JSON, every tensor's dtype, shape and offsets (its bytes must be exactly its shape's, and
/// the tensors must tile the data with no gap or overlap, as the format's own reader asks);
/// a fault is a `FormatError` naming the file and the tensor. A tensor whose bytes start off
/// its dtype's alignment (common in files other tools wrote) is read: its bytes are copied.
/// Light parsing (nlohmann-json); the tensors are ATen's.

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/atomic_file.hpp>
#include <anvil/core/error.hpp>

namespace anvil::safetensors {

/// A fault in a safetensors file, naming the file and, where one is at fault, the tensor.
class FormatError : public Error {
 public:
  using Error::Error;
};

/// Named tensors in file order, and the string-to-string metadata.
struct File {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  /// The tensor named `name`; a FormatError naming it (and the file `from`) when absent.
  [[nodiscard]] const at::Tensor& at(const std::string& name, const std::string& from = "") const {
    for (const auto& [n, t] : tensors)
      if (n == name) return t;
    throw FormatError((from.empty() ? "" : from + ": ") + "no tensor '" + name + "'");
  }
  [[nodiscard]] bool contains(const std::string& name) const {
    return std::any_of(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == name; });
  }
};

namespace detail {
struct DType {
  const char* name;
  at::ScalarType type;
  std::size_t size;
};
inline constexpr DType kDTypes[] = {
    {"F32", at::kFloat, 4}, {"F64", at::kDouble, 8}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},  {"I32", at::kInt, 4},    {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},   {"BOOL", at::kBool, 1},
};
inline const DType* dtype_named(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}
inline const DType& dtype_of(at::ScalarType t, const std::string& tensor) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d;
  throw FormatError("tensor '" + tensor + "': dtype " + std::string(c10::toString(t)) + " has no safetensors name here");
}
}  // namespace detail

/// Writes `tensors` (contiguous copies on the CPU are taken; names unique) and `metadata` to
/// `path` atomically.
inline void write(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") throw FormatError(path.string() + ": a tensor may not be named '" + name + "'");
    if (header.contains(name)) throw FormatError(path.string() + ": tensor '" + name + "' given twice");
    if (!t.defined()) throw FormatError(path.string() + ": tensor '" + name + "' is undefined");
    const auto& d = detail::dtype_of(t.scalar_type(), name);
    auto c = t.detach().to(at::kCPU).contiguous();
    const auto bytes = static_cast<std::uint64_t>(c.numel()) * d.size;
    header[name] = {{"dtype", d.name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - (text.size() + 8) % 8) % 8, ' ');  // the data 8-byte aligned
  std::string file(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) file[i] = static_cast<char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  file.reserve(8 + text.size() + offset);
  file += text;
  for (const auto& c : data) file.append(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel() * c.element_size()));
  write_file_atomic(path, file);
}

/// Reads `path` (see file comment): every check before any tensor is made.
inline File read(const std::filesystem::path& path) {
  const std::string where = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(where + ": cannot be opened");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) throw FormatError(where + ": truncated: " + std::to_string(bytes.size()) + " bytes, no header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])) << (8 * i);
  if (n > bytes.size() - 8)
    throw FormatError(where + ": the header length says " + std::to_string(n) + " bytes; the file has " +
                      std::to_string(bytes.size() - 8) + " after it (truncated, or not safetensors)");
  if (n > (std::uint64_t{100} << 20)) throw FormatError(where + ": a header of " + std::to_string(n) + " bytes (over 100 MB)");
  nlohmann::ordered_json header;  // the tensors in the header's order
  try {
    header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": the header is not JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw FormatError(where + ": the header is not a JSON object");
  const std::uint64_t size = bytes.size() - 8 - n;  // the data's bytes
  const char* base = bytes.data() + 8 + n;
  struct Entry {
    std::string name;
    const detail::DType* dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  File f;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw FormatError(where + ": __metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw FormatError(where + ": __metadata__['" + m.key() + "'] is not a string");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = where + ": tensor '" + name + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw FormatError(at + "needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) throw FormatError(at + "dtype is not a string");
    const auto* d = detail::dtype_named(v["dtype"].get<std::string>());
    if (!d) throw FormatError(at + "dtype " + v["dtype"].get<std::string>() + " is not one anvil reads");
    const auto& shape = v["shape"];
    const auto& offsets = v["data_offsets"];
    if (!shape.is_array()) throw FormatError(at + "shape is not a list");
    Entry e{name, d, {}, 0, 0};
    std::uint64_t numel = 1;
    for (const auto& s : shape) {
      if (!s.is_number_unsigned()) throw FormatError(at + "shape " + shape.dump() + " has a dimension that is not a non-negative integer");
      const auto k = s.get<std::uint64_t>();
      if (k > (std::uint64_t{1} << 40) || (k > 0 && numel > (std::uint64_t{1} << 40) / k))
        throw FormatError(at + "shape " + shape.dump() + " is implausibly large");
      numel *= k;
      e.shape.push_back(static_cast<std::int64_t>(k));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw FormatError(at + "data_offsets is not [begin, end]");
    e.begin = offsets[0].get<std::uint64_t>();
    e.end = offsets[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > size)
      throw FormatError(at + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                        "] lie outside the " + std::to_string(size) + " bytes of data");
    if (e.end - e.begin != numel * d->size)
      throw FormatError(at + "data_offsets span " + std::to_string(e.end - e.begin) + " bytes; shape " + shape.dump() +
                        " of " + d->name + " needs " + std::to_string(numel * d->size));
    entries.push_back(std::move(e));
  }
  // The tensors tile the data: no gap, no overlap, nothing after the last.
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at_byte = 0;
  for (const Entry* e : order) {
    if (e->begin != at_byte)
      throw FormatError(where + ": tensor '" + e->name + "': misaligned offsets: its data starts at byte " +
                        std::to_string(e->begin) + ", " +
                        (e->begin < at_byte ? "inside the tensor before it (overlap)" : "after a gap from byte " + std::to_string(at_byte)));
    at_byte = e->end;
  }
  if (at_byte != size)
    throw FormatError(where + ": " + std::to_string(size - at_byte) + " bytes of data after the last tensor's (a lying header, or trailing bytes)");
  for (const auto& e : entries) {
    auto t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), base + e.begin, e.end - e.begin);
    f.tensors.emplace_back(e.name, std::move(t));
  }
  return f;
}

}  // namespace anvil::safetensors
