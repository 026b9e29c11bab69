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

/// Writes `t` (any device; copied to the host). A floating tensor holding a NaN or an
/// infinity is refused with an Error naming the file and `what`, before a byte of it is
/// written: the writer's file is then dropped and what was there before stays (no
/// checkpoint or policy file is ever written from non-finite weights).
inline void write_tensor(BinaryWriter& w, const at::Tensor& t, const char* what = "a tensor") {
  const auto host = t.detach().to(at::kCPU).contiguous();
  if (at::isFloatingType(host.scalar_type()) && host.numel() > 0 && !host.isfinite().all().item<bool>()) [[unlikely]]
    throw Error("not writing '" + w.target() + "': " + what + " holds " +
                (host.isnan().any().item<bool>() ? "nan" : "inf") + " values (" +
                std::to_string(host.numel() - host.isfinite().sum().item<std::int64_t>()) + " of " +
                std::to_string(host.numel()) + "); non-finite weights are never saved, and the file that was there is kept");
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
