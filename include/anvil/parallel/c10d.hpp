#pragma once
/// @file
/// The c10d classes anvil's parallelism uses, the same on LibTorch 1.13 and 2.x: 2.x splits
/// a ProcessGroup (the front end) from its Backend (Gloo, NCCL); collectives on a backend
/// object are the same calls with the same option structs in both. The one place in anvil
/// that knows this difference (with core/torch_compat.hpp for the version itself).

#include <c10/core/DeviceType.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

// LibTorch's c10d headers declare their classes only under these macros, which CMake's
// Torch package defines (its builds have c10d and Gloo); a plain compiler line must too.
#if !defined(USE_C10D_GLOO) || !defined(USE_DISTRIBUTED)
#error "anvil's parallelism needs LibTorch's c10d with Gloo: build with CMake's Torch package (find_package(Torch)), or add -DUSE_DISTRIBUTED -DUSE_C10D_GLOO to the compiler's flags"
#endif

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace anvil::compat {

/// Handle of an asynchronous collective (`wait()` blocks until it is done).
using Work = c10d::Work;
/// What runs collectives: a `ProcessGroup` in 1.13, a `Backend` (behind a ProcessGroup) in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif
/// Whether this LibTorch was built with NCCL (CUDA builds of 2.x; never Debian's 1.13).
#ifdef USE_C10D_NCCL
inline constexpr bool has_nccl = true;
#else
inline constexpr bool has_nccl = false;
#endif
/// Key-value store used for rendezvous.
using Store = c10d::Store;

/// The network device Gloo's transport uses: the interface named by `interface` (or by
/// GLOO_SOCKET_IFNAME, PyTorch's variable), else loopback when `master_addr` is a loopback
/// address (one machine), else the address this host's name resolves to.
inline std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& interface,
                                                              const std::string& master_addr) {
  std::string ifname = interface;
  if (ifname.empty())
    if (const char* e = std::getenv("GLOO_SOCKET_IFNAME")) ifname = e;
  if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0 || master_addr == "::1")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

/// A Gloo process group over `store` (ranks find each other through it), on the transport
/// `device` (see `gloo_device`); collectives that wait longer than `timeout` fail.
inline c10::intrusive_ptr<Collectives> make_gloo_group(const c10::intrusive_ptr<Store>& store, int rank,
                                                       int world_size,
                                                       std::shared_ptr<::gloo::transport::Device> device,
                                                       std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  opts->devices.push_back(std::move(device));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
}

/// An NCCL group (CUDA builds with NCCL only; the caller checks `has_nccl`). The current
/// CUDA device must be set before the first collective.
inline c10::intrusive_ptr<Collectives> make_nccl_group([[maybe_unused]] const c10::intrusive_ptr<Store>& store,
                                                       [[maybe_unused]] int rank,
                                                       [[maybe_unused]] int world_size,
                                                       [[maybe_unused]] std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
#else
  throw std::logic_error("make_nccl_group: this LibTorch has no NCCL");
#endif
}

/// The port a TCP store listens on or talks to (the one the system chose when asked for 0).
inline std::uint16_t store_port(const c10::intrusive_ptr<Store>& store) {
  return static_cast<const c10d::TCPStore&>(*store).getPort();
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
