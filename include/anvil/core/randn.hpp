#pragma once
/// @file
/// `anvil::randn(rows, cols, options)`: `at::randn({rows, cols}, options)`, the same values
/// from the same generator, made cheap for the few values an algorithm draws to act once per
/// env step. Below 16 float values on the CPU, torch fills the tensor one value at a time from
/// the default generator's `normal_distribution<double>` (`normal_kernel` in
/// aten/src/ATen/native/cpu/DistributionTemplates.h, LibTorch 1.13 and 2.x); so does this,
/// without the op's dispatch and TensorIterator (about 0.6 us a call on the machines of
/// docs/benchmarks/peers.md). Anything else is torch's op.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <cstdint>
#include <mutex>

namespace anvil {

/// Standard normal draws [rows, cols] into `out` (a contiguous float tensor of that shape on
/// the host, e.g. one kept for the next call), as `at::randn` draws them (see file comment).
inline void randn_into(at::Tensor& out) {
  const std::int64_t count = out.numel();
  if (count >= 16) {
    out.normal_();  // torch's op: at::randn is empty then normal_
    return;
  }
  float* x = out.data_ptr<float>();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  for (std::int64_t i = 0; i < count; ++i) {
    at::normal_distribution<double> normal(0.0, 1.0);
    x[i] = static_cast<float>(normal(impl));
  }
}

/// Standard normal draws [rows, cols], as `at::randn` draws them (see file comment).
[[nodiscard]] inline at::Tensor randn(std::int64_t rows, std::int64_t cols, const at::TensorOptions& options) {
  const bool small = rows * cols < 16 && options.device().is_cpu() && options.dtype() == at::kFloat;
  if (!small) return at::randn({rows, cols}, options);
  auto out = at::empty({rows, cols}, options);
  randn_into(out);
  return out;
}

}  // namespace anvil
