#pragma once
/// @file
/// `cuda::Graph`: a piece of device work captured once as a CUDA graph and replayed with one
/// launch. Small RL networks on a GPU are bound by the host: an autograd SAC update
/// dispatches about 1,100 ATen operators, each a few microseconds of host work and a kernel
/// launch of a few microseconds of GPU work, so the GPU idles (benchmarks/RESULTS.md, "On a
/// GPU"). A replay launches the same kernels from the GPU's side with no host work per
/// kernel.
///
/// What is captured must be device work alone: no host synchronisation (`item()`, a copy to
/// the host), no host value that changes between replays (read such values from device
/// tensors), and inputs and outputs in fixed tensors (copy new inputs in before a replay;
/// read or copy outputs before the next). Capture runs on a side stream after warm-ups on
/// that stream (cuBLAS workspaces, autograd's state and the caching allocator see the work
/// once first), with the capture mode local to the capturing thread, so other threads'
/// CUDA calls go on. Tensors made inside the capture live in the graph's private memory pool.
///
/// Captures only when `ANVIL_WITH_CUDA` is 1: CMake defines it when LibTorch has CUDA
/// (target torch_cuda), scripts/gpu-check.sh on its g++ line. Without it `kCudaGraphs` is
/// false and the class has the same interface but never captures (each call that would
/// says so), so callers compile one path and choose it at run time, with no `#if`.

#if defined(ANVIL_WITH_CUDA) && ANVIL_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <utility>
#endif

#include <c10/core/Device.h>

#include <anvil/core/error.hpp>

namespace anvil::cuda {

#if defined(ANVIL_WITH_CUDA) && ANVIL_WITH_CUDA
/// Whether this build can capture CUDA graphs.
inline constexpr bool kCudaGraphs = true;

/// One captured piece of device work (see file comment).
class Graph {
 public:
  /// A graph for work on CUDA device `device`, with a side stream of its own.
  explicit Graph(c10::Device device)
      : stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index() < 0
                                                                          ? c10::cuda::current_device()
                                                                          : device.index())) {}

  /// Runs `f` eagerly on the capture stream, the device idle before and after.
  template <class F>
  void warm_up(F&& f) {
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      std::forward<F>(f)();
    }
    c10::cuda::device_synchronize();
  }

  /// Captures the device work `f` enqueues (nothing runs: `replay` runs it). If `f` throws,
  /// the capture is ended and dropped, and the error passes on.
  template <class F>
  void capture(F&& f) {
    c10::cuda::device_synchronize();
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        std::forward<F>(f)();
      } catch (...) {
        try {
          graph_->capture_end();
        } catch (...) {  // the capture was already broken: the first error is the one to report
        }
        graph_.reset();
        throw;
      }
      graph_->capture_end();
    }
    c10::cuda::device_synchronize();
  }

  /// Runs the captured work on the current stream (after what is already queued there).
  void replay() { graph_->replay(); }
  [[nodiscard]] bool captured() const noexcept { return graph_ != nullptr; }

 private:
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
};
#else
inline constexpr bool kCudaGraphs = false;

/// Without CUDA: the interface above; callers check `kCudaGraphs` before using it.
class Graph {
 public:
  explicit Graph(c10::Device /*device*/) {}
  template <class F>
  void warm_up(F&& /*f*/) { unavailable(); }
  template <class F>
  void capture(F&& /*f*/) { unavailable(); }
  void replay() { unavailable(); }
  [[nodiscard]] bool captured() const noexcept { return false; }

 private:
  [[noreturn]] static void unavailable() {
    throw Error("CUDA graphs: this program was built without them (ANVIL_WITH_CUDA is not 1)");
  }
};
#endif

}  // namespace anvil::cuda
