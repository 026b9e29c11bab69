#pragma once
/// @file
/// What a run sets for the whole process, in one call when its Trainer is built
/// (`apply_process_settings`): Torch's intra-op threads, the precision policy's switches
/// (cuDNN benchmark, anomaly detection, TF32) and Torch's global generators, seeded for this
/// rank; and those generators as a section of the run's state (`TorchGenerators`). Not a
/// template.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/utils.h>

#include <cstdlib>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <anvil/core/binary_io.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Torch's global random generators (the CPU one, and the run's CUDA device's): the
/// `torch_rng` section of a run's state (this rank's own).
class TorchGenerators {
 public:
  TorchGenerators() = default;
  explicit TorchGenerators(c10::Device device) : device_(device) {}
  void save(BinaryWriter& w) const {
    write_tensor(w, at::detail::getDefaultCPUGenerator().get_state());
    w.value(device_.is_cuda());
    if (device_.is_cuda()) write_tensor(w, at::globalContext().defaultGenerator(device_).get_state());
  }
  struct Saved {
    at::Tensor cpu, cuda;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.cpu = read_tensor(r, "torch CPU generator state", at::detail::getDefaultCPUGenerator().get_state());
    const bool was_cuda = r.value<bool>("CUDA flag");
    if (was_cuda != device_.is_cuda())
      r.fail("CUDA flag", was_cuda ? "says the run was on CUDA; this one is on " + device_.str()
                                   : "says the run was on the CPU; this one is on " + device_.str());
    if (was_cuda)
      s.cuda = read_tensor(r, "torch CUDA generator state", at::globalContext().defaultGenerator(device_).get_state());
    return s;
  }
  void restore(const Saved& s) const {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(s.cpu);
    if (s.cuda.defined()) {
      at::Generator cuda = at::globalContext().defaultGenerator(device_);
      cuda.set_state(s.cuda);
    }
  }

 private:
  c10::Device device_{c10::kCPU};
};

/// Keeps the C library's heap from shrinking and growing again around every update (glibc):
/// an update's large temporaries (convolutions' activations: megabytes a tensor) are freed at
/// its end, and by default the top of the heap then goes back to the system, to be faulted in
/// page by page at the next update: with image encoders a quarter of a CPU run's time went to
/// those page faults (benchmarks/RESULTS.md, "The heap kept"). The heap keeps up to 1 GiB free
/// at its top instead, and blocks up to 32 MiB come from it rather than from mmap. A process
/// whose environment sets MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ keeps its own.
/// Returns whether it changed the settings.
inline bool keep_heap() noexcept {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("MALLOC_MMAP_THRESHOLD_")) return false;
  return mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
#else
  return false;
#endif
}

/// Applies a run's process-wide settings (see file comment): `threads` intra-op threads,
/// precision `p`'s switches, and Torch's generators seeded from `ctx` (its seed and rank),
/// the heap kept (`keep_heap`) and the fast paths' matrix products (`matmul`, `blas::set_matmul`).
/// Returns what the run should say about them and about the CPU's BLAS (with the
/// `update_threads` the step context uses).
inline std::vector<std::string> apply_process_settings(int threads, const PrecisionSettings& p, const RunContext& ctx,
                                                       int update_threads, Matmul matmul = Matmul::auto_) {
  keep_heap();
  blas::set_matmul(matmul);
  torch::set_num_threads(threads);
  seed_torch(ctx);
  const c10::Device& device = ctx.device;
  std::vector<std::string> notes;
  auto& g = at::globalContext();
  g.setBenchmarkCuDNN(p.cudnn_benchmark);
  torch::autograd::AnomalyMode::set_enabled(p.detect_anomaly);
  g.setAllowTF32CuBLAS(p.allow_tf32);
  g.setAllowTF32CuDNN(p.allow_tf32);
  if (p.allow_tf32 && !device.is_cuda())
    notes.push_back("precision: TF32 changes only CUDA matrix products; on the CPU this run is FP32");
  if (p.detect_anomaly) notes.push_back("precision: autograd anomaly detection is on (slow; for debugging NaNs)");
  if (device.is_cuda() && !cuda::kCudaGraphs)
    notes.push_back("cuda: this program was built without anvil's CUDA graphs (ANVIL_WITH_CUDA is not 1), so updates "
                    "run op by op, several times slower for small networks; build with CMake's anvil::anvil target, or "
                    "define ANVIL_WITH_CUDA=1 when LibTorch has CUDA");
  if (!device.is_cuda()) {
    const BlasInfo b = blas_info();
    if (b.reference)
      notes.push_back("cpu: Torch uses the reference BLAS (" + b.library +
                      "): matrix products are about 10x slower; run scripts/install-deps.sh");
    else if (b.openblas)
      notes.push_back("cpu: OpenBLAS" + (b.core.empty() ? std::string() : " (" + b.core + " kernels)") + ", " +
                      std::to_string(at::get_num_threads()) + " intra-op thread(s), " + std::to_string(update_threads) +
                      " update thread(s); fast paths' matrix products: " +
                      (blas::own_matmul() ? "anvil's AVX-512 product where faster (run.matmul)" : "the BLAS"));
  }
  return notes;
}

}  // namespace anvil
