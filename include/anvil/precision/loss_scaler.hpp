#pragma once
/// @file
/// `LossScaler`: the dynamic loss scaling of mixed-precision training (Micikevicius et al.
/// 2018), with the schedule of the standard scaler: start at 2^16, double after
/// `growth_interval` consecutive finite steps, halve on a step whose gradients hold an inf
/// or a NaN and skip that step. It sees one flat gradient per optimizer step (the
/// StepContext gathers it), so the check for infs is one reduction.

#include <ATen/ATen.h>

#include <cstdint>

#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Dynamic loss scale (see file comment). Counts optimizer steps.
class LossScaler {
 public:
  /// The scaler's schedule (precision/detail/common.hpp).
  using Options = LossScaling;

  LossScaler() = default;
  explicit LossScaler(Options o) : opt_(o), scale_(o.init_scale) {}

  /// The loss to differentiate: `loss * scale`.
  [[nodiscard]] at::Tensor scale(const at::Tensor& loss) const { return loss * scale_; }

  /// Divides the flat gradient by the scale in place and reports whether it is finite. A
  /// non-finite gradient backs the scale off and resets the growth count: the caller must
  /// skip the step. A finite one counts towards growth.
  [[nodiscard]] bool unscale_and_check(at::Tensor& flat_grad) {
    flat_grad.mul_(1.0 / scale_);
    const bool finite = flat_grad.isfinite().all().item<bool>();
    if (!finite) {
      scale_ *= opt_.backoff_factor;
      good_steps_ = 0;
      ++skipped_;
      return false;
    }
    if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
    return true;
  }

  [[nodiscard]] double current_scale() const noexcept { return scale_; }
  /// Finite steps since the last growth or backoff.
  [[nodiscard]] std::int64_t good_steps() const noexcept { return good_steps_; }
  /// Steps skipped for non-finite gradients since construction.
  [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  /// For checkpoints: the scale and the growth count are the whole state.
  void restore(double scale, std::int64_t good_steps, std::int64_t skipped = 0) noexcept {
    scale_ = scale;
    good_steps_ = good_steps;
    skipped_ = skipped;
  }

 private:
  Options opt_{};
  double scale_ = 65536.0;
  std::int64_t good_steps_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace anvil
