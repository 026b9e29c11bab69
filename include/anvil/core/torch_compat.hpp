#pragma once
/// @file
/// Which LibTorch anvil is built against. Debian's LibTorch 1.13 (CPU) and LibTorch 2.x
/// (CUDA builds) differ in a few C++ APIs that anvil uses; each difference sits behind one
/// small header: the autocast switches in core/autocast.hpp (included here) and the c10d
/// process-group classes in parallel/c10d.hpp. Everything else calls those functions and
/// never checks a Torch version.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <anvil/core/autocast.hpp>

#include <string>

namespace anvil::compat {

/// LibTorch version, e.g. 113 for 1.13 and 205 for 2.5.
inline constexpr int torch_version = TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR;
/// "1.13.0" and so on.
inline std::string torch_version_string() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Autocast switches: core/autocast.hpp (included above). c10d: parallel/c10d.hpp.

}  // namespace anvil::compat
