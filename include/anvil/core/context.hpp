#pragma once
/// @file
/// The device policy and the run context every algorithm and buffer is built with: which
/// device, which seed, which rank. `--device cpu|cuda|cuda:N|auto` is resolved here, with a
/// clear error when CUDA is asked for and absent.

#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

#include <anvil/core/error.hpp>
#include <anvil/core/lr_scaling.hpp>
#include <anvil/core/random.hpp>

namespace anvil {

/// Where this process runs, how its randomness is seeded and what the run asks of every
/// policy; passed to every policy's constructor so none of them reads global state.
struct RunContext {
  c10::Device device{c10::kCPU};
  std::uint64_t seed = 0;  ///< the run's seed; streams derive their own with derive_seed
  int rank = 0;
  int world_size = 1;
  LrScaling lr_scaling = LrScaling::none;  ///< train.lr_scaling
  std::int64_t base_batch = 256;           ///< train.base_batch: the batch learning rates were tuned for
  int micro_batches = 1;                   ///< train.grad_accumulation: micro-batches per optimizer step

  /// The factor on learning rates for an algorithm taking `batch` rows per gradient step
  /// (see core/lr_scaling.hpp).
  [[nodiscard]] double lr_scale(std::int64_t batch) const noexcept {
    return anvil::lr_scale(lr_scaling, batch, base_batch, world_size);
  }

  /// Seed for stream `s`, instance `index`, distinct across ranks.
  [[nodiscard]] std::uint64_t seed_for(Stream s, std::uint64_t index = 0) const noexcept {
    return derive_seed(seed + 0x1000003ull * static_cast<std::uint64_t>(rank), s, index);
  }
};

/// Turns a device string into a device. "auto" is CUDA device `local_rank` when CUDA is
/// present, else the CPU. Throws DeviceError, naming the field, when CUDA is asked for and
/// this build or machine has none, or the index is out of range.
inline c10::Device resolve_device(const std::string& spec, int local_rank = 0,
                                  const std::string& field = "run.device") {
  const bool cuda_built = at::hasCUDA();
  const long long count = cuda_built ? static_cast<long long>(torch::cuda::device_count()) : 0;
  if (spec == "auto")
    return count > 0 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count))
                     : c10::Device(c10::kCPU);
  if (spec == "cpu") return c10::Device(c10::kCPU);
  if (spec == "cuda" || spec.starts_with("cuda:")) {
    long long index = local_rank;
    if (spec != "cuda") {
      const std::string digits = spec.substr(5);
      if (digits.empty() || digits.size() > 3 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        throw DeviceError(field + "='" + spec + "' is not a device: use cpu, cuda, cuda:N or auto");
      index = std::stoll(digits);
    }
    if (!cuda_built)
      throw DeviceError(field + "='" + spec +
                        "' but this LibTorch is a CPU-only build (no CUDA support); use "
                        "--device=cpu, or build against a CUDA LibTorch");
    if (count == 0)
      throw DeviceError(field + "='" + spec +
                        "' but no CUDA device is visible (check the driver and "
                        "CUDA_VISIBLE_DEVICES); use --device=cpu");
    if (index >= count)
      throw DeviceError(field + "='" + spec + "' but only " + std::to_string(count) +
                        " CUDA device(s) are visible (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw DeviceError(field + "='" + spec + "' is not a device: use cpu, cuda, cuda:N or auto");
}

/// Seeds torch's global generators (CPU and CUDA) for this rank from the run's seed.
/// Envs, buffers and exploration take their own streams from `RunContext::seed_for`.
inline void seed_torch(const RunContext& ctx) { torch::manual_seed(ctx.seed_for(Stream::torch)); }

}  // namespace anvil
