#pragma once
/// @file
/// The one place, with core/autocast.hpp, that knows which LibTorch it is built against.
/// Debian's LibTorch 1.13 (CPU) and LibTorch 2.x (CUDA builds) differ in a few C++ APIs that
/// anvil uses: the autocast switches (core/autocast.hpp) and the c10d process-group classes
/// (here). Everything else in anvil calls these functions and never checks a Torch version.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <anvil/core/autocast.hpp>

#include <chrono>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace anvil::compat {

/// LibTorch version, e.g. 113 for 1.13 and 205 for 2.5.
inline constexpr int torch_version = TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR;
/// "1.13.0" and so on.
inline std::string torch_version_string() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Autocast switches: core/autocast.hpp (included above).

// ---- c10d ------------------------------------------------------------------------------
// The headers live under torch/csrc/distributed/c10d in both versions. 2.x splits a
// ProcessGroup (the front end) from its Backend (Gloo, NCCL); collectives on a backend
// object are the same calls with the same option structs in both.

/// Handle of an asynchronous collective (`wait()` blocks until it is done).
using Work = c10d::Work;
/// Key-value store used for rendezvous.
using Store = c10d::Store;

/// A Gloo process group over `store` (ranks find each other through it). `hostname` is the
/// address this rank's Gloo transport binds to.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo_group(
    const c10::intrusive_ptr<Store>& store, int rank, int world_size, const std::string& hostname,
    std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
}

/// A TCP store: rank 0 (`is_server`) listens on `port`, the others connect to `host:port`.
inline c10::intrusive_ptr<Store> make_tcp_store(const std::string& host, std::uint16_t port,
                                                int world_size, bool is_server,
                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.numWorkers = world_size;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

/// A store backed by a file all ranks can see (single machine or shared file system).
inline c10::intrusive_ptr<Store> make_file_store(const std::string& path, int world_size) {
  return c10::make_intrusive<c10d::FileStore>(path, world_size);
}

}  // namespace anvil::compat
