#pragma once
/// @file
/// Tensors in anvil's binary files (see core/binary_io.hpp): dtype, element count, then
/// the raw elements of a contiguous host copy. Reading checks both against the tensor the
/// values are meant for and names the field when they differ, so a file from another
/// network shape is refused rather than loaded into the wrong places.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include <anvil/core/binary_io.hpp>

namespace anvil {

/// Writes `t` (any device; copied to the host).
inline void write_tensor(BinaryWriter& w, const at::Tensor& t) {
  const auto host = t.detach().to(at::kCPU).contiguous();
  w.value(static_cast<std::int8_t>(host.scalar_type()));
  w.value(static_cast<std::int64_t>(host.numel()));
  w.bytes(host.data_ptr(), static_cast<std::size_t>(host.numel()) * host.element_size());
}

/// Reads a tensor written by `write_tensor` into a new host tensor shaped like `like`,
/// which must have the same dtype and element count (else the error names `what`).
inline at::Tensor read_tensor(BinaryReader& r, const char* what, const at::Tensor& like) {
  const auto dtype = static_cast<at::ScalarType>(r.value<std::int8_t>(what));
  if (dtype != like.scalar_type())
    r.fail(what, std::string("are ") + c10::toString(dtype) + " in the file but " + c10::toString(like.scalar_type()) +
                     " here");
  const auto n = r.value<std::int64_t>(what);
  if (n != like.numel())
    r.fail(what, "have " + std::to_string(n) + " values in the file but " + std::to_string(like.numel()) +
                     " here (another network shape?)");
  auto t = at::empty(like.sizes(), like.options().device(at::kCPU));
  r.bytes(t.data_ptr(), static_cast<std::size_t>(n) * t.element_size(), what);
  return t;
}

}  // namespace anvil
