#pragma once
/// @file
/// Copies of a tensor's values kept between calls, and when they are stale.
///
/// LibTorch counts the in-place writes to a tensor: its version, which every in-place op
/// moves and which a view shares with the tensor it views (a network's parameters share the
/// count of the flat buffer they live in, optim/flat_adam.hpp). A copy made at one version
/// is current while the count stays there. Writes through raw pointers do not move it:
/// anvil's own (Adam's and Polyak's loops over floats, a collective's receive) call
/// `mark_written`, and so must any code that writes a parameter's memory itself.
///
/// `KeptTranspose` keeps a weight's transpose for acting (nn::MlpTape): PPO acts 1,024
/// times between two updates with the same weights, and the few-rows product is about twice
/// as fast from the transpose (core/blas.hpp, `own_rows_kernel_takes_copy`). SAC acts once
/// between two updates and pays the transpose each time (a few tenths of a microsecond at 64
/// x 64): measured, its run is no slower, and every product keeps the same bits.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include <anvil/core/simd.hpp>

namespace anvil {

/// Marks `t` (and every tensor that shares its version count: its views, the parameters of
/// a flat buffer) as written, after a write through its data pointer.
inline void mark_written(const at::Tensor& t) {
  if (t.defined() && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

/// A matrix's transpose, made again only when the matrix may have changed: when it is
/// another tensor, its data has moved, or its version count has. A product from it has the
/// same bits at every use (acting stays a function of the weights and the input alone).
class KeptTranspose {
 public:
  /// The transpose [cols, rows] of `w` (a contiguous float32 CPU matrix [rows, cols]), or
  /// null when `w` keeps no version count (an inference tensor: nothing tells a change).
  const float* of(const at::Tensor& w) {
    if (w.is_inference()) return nullptr;
    const std::int64_t version = w._version();
    if (!source_.defined() || source_.unsafeGetTensorImpl() != w.unsafeGetTensorImpl() ||
        data_ != w.data_ptr() || version_ != version || rows_ != w.size(0) || cols_ != w.size(1)) {
      rows_ = w.size(0);
      cols_ = w.size(1);
      t_.resize(static_cast<std::size_t>(rows_ * cols_));
      simd::transpose(t_.data(), w.data_ptr<float>(), rows_, cols_);
      source_ = w;  // held: its address is not reused by another tensor while kept
      data_ = w.data_ptr();
      version_ = version;
      ++copies_;
    }
    return t_.data();
  }
  /// Transposes made so far.
  [[nodiscard]] std::int64_t copies() const noexcept { return copies_; }

 private:
  at::Tensor source_;
  const void* data_ = nullptr;
  std::int64_t version_ = -1, rows_ = 0, cols_ = 0, copies_ = 0;
  std::vector<float> t_;
};

}  // namespace anvil
