#pragma once
/// @file
/// `SingleDevice`: one process, one device. Light header.

#include <string>
#include <vector>

#include <c10/core/Device.h>

#include <anvil/core/concepts.hpp>

namespace anvil {

/// Parallelism policy for one process on one device (CPU or one GPU): nothing to agree on,
/// so every collective is a no-op and costs nothing.
struct SingleDevice {
  using policy_kind = ParallelismKind;
  static constexpr FixedString config_section = "parallel";
  /// Runs on CUDA when the run's device is CUDA.
  static constexpr bool can_use_cuda = true;
  /// No settings: one process has nothing to configure.
  struct Config {};

  SingleDevice() = default;
  explicit SingleDevice(const Config&) {}

  /// Nothing to start: this process is the run.
  static void start_ranks(const Config&, std::string_view /*device*/) noexcept {}
  /// Nothing to join.
  void connect(c10::Device) noexcept {}
  /// CUDA device 0 when the run is on CUDA (`run.device` may name another).
  [[nodiscard]] int device_index() const noexcept { return 0; }
  [[nodiscard]] std::string describe() const { return "1 rank, one process"; }

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int local_rank() const noexcept { return 0; }
  [[nodiscard]] int world_size() const noexcept { return 1; }
  [[nodiscard]] bool is_main() const noexcept { return true; }
  /// The mean over one rank is the tensor itself.
  void all_reduce_mean(std::vector<at::Tensor>&) noexcept {}
  /// Rank 0 is this process.
  void broadcast(std::vector<at::Tensor>&) noexcept {}
};

static_assert(Parallelism<SingleDevice>);

}  // namespace anvil
