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
    if (grouped_) {  // one update of the scale when the group ends (`end_step`)
      group_checked_ = true;
      if (!finite) {
        group_inf_ = true;
        ++skipped_;
      }
      return finite;
    }
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

  /// Several optimizer steps of one update (e.g. a critic's, then an actor's whose loss
  /// uses the stepped critic) count as one step of the schedule, as one `update()` of a
  /// standard scaler after several optimizers' steps: between `begin_step` and `end_step`
  /// each optimizer's gradient is unscaled and checked (a non-finite one skips that
  /// optimizer's step), and `end_step` backs the scale off once if any was non-finite, else
  /// counts one finite step towards growth.
  void begin_step() noexcept {
    grouped_ = true;
    group_inf_ = group_checked_ = false;
  }
  void end_step() noexcept {
    grouped_ = false;
    if (!group_checked_) return;
    if (group_inf_) {
      scale_ *= opt_.backoff_factor;
      good_steps_ = 0;
    } else if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
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
  bool grouped_ = false, group_inf_ = false, group_checked_ = false;  // inside begin_step/end_step
  std::int64_t skipped_ = 0;
};

}  // namespace anvil
