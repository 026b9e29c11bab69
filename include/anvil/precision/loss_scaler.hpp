#pragma once
/// @file
/// `LossScaler`: the dynamic loss scaling of mixed-precision training (Micikevicius et al.
/// 2018), with the schedule of the standard scaler: start at 2^16, double after
/// `growth_interval` consecutive finite steps, halve on a step whose gradients hold an inf
/// or a NaN and skip that step. It sees one flat gradient per optimizer step (the
/// StepContext gathers it), so the check for infs is one reduction. Its state lives on the
/// host, or (`keep_on`) in tensors on the device: then the check, the skip and the scale's
/// update are device work with no host read (`unscale_and_check_on_device`), which a CUDA
/// graph can hold, and the same arithmetic runs op by op on any device.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include <anvil/core/error.hpp>
#include <anvil/precision/detail/common.hpp>

namespace anvil {

/// Dynamic loss scale (see file comment). Counts optimizer steps.
class LossScaler {
 public:
  /// The scaler's schedule (precision/detail/common.hpp).
  using Options = LossScaling;

  LossScaler() = default;
  explicit LossScaler(Options o) : opt_(o), scale_(o.init_scale) {}

  /// Moves the state (scale, growth count, skipped steps) into float64 tensors on `device`,
  /// from where `unscale_and_check_on_device` reads and updates it.
  void keep_on(c10::Device device) {
    const auto o = at::TensorOptions().dtype(at::kDouble).device(device);
    scale_t_ = at::full({}, scale_, o);
    good_t_ = at::full({}, static_cast<double>(good_steps_), o);
    skipped_t_ = at::full({}, static_cast<double>(skipped_), o);
    group_inf_t_ = at::zeros({}, o.dtype(at::kBool));
  }
  /// Whether the state lives in device tensors (`keep_on`).
  [[nodiscard]] bool on_device() const noexcept { return scale_t_.defined(); }

  /// The loss to differentiate: `loss * scale`.
  [[nodiscard]] at::Tensor scale(const at::Tensor& loss) const {
    return on_device() ? loss * scale_t_.to(loss.scalar_type()) : loss * scale_;
  }

  /// `unscale_and_check` as device work, for a scaler `on_device`: divides the flat gradient
  /// by the scale in place, counts a skip and (outside `begin_step`/`end_step`) updates the
  /// scale, all in tensors, and returns whether the gradient is finite as a 0-dim bool tensor
  /// (`FlatAdam::step_on_device` takes the step only where it is true). The same values as
  /// the host's schedule: the reciprocal is taken in float64 and cast as the host's scalar is.
  [[nodiscard]] at::Tensor unscale_and_check_on_device(at::Tensor& flat_grad) {
    if (!on_device()) throw Error("LossScaler::unscale_and_check_on_device: the scale is on the host (keep_on)");
    flat_grad.mul_(scale_t_.reciprocal().to(flat_grad.scalar_type()));
    const auto finite = flat_grad.isfinite().all();
    const auto bad = finite.logical_not();
    skipped_t_.add_(bad);
    if (grouped_) {
      group_checked_ = true;
      group_inf_t_.logical_or_(bad);
    } else {
      advance(finite);
    }
    return finite;
  }

  /// Divides the flat gradient by the scale in place and reports whether it is finite. A
  /// non-finite gradient backs the scale off and resets the growth count: the caller must
  /// skip the step. A finite one counts towards growth. A scaler `on_device` does it as
  /// device work and reads the answer back.
  [[nodiscard]] bool unscale_and_check(at::Tensor& flat_grad) {
    if (on_device()) return unscale_and_check_on_device(flat_grad).item<bool>();
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
  void begin_step() {
    grouped_ = true;
    group_inf_ = group_checked_ = false;
    if (on_device()) group_inf_t_.fill_(false);
  }
  void end_step() {
    grouped_ = false;
    if (!group_checked_) return;
    if (on_device()) {
      advance(group_inf_t_.logical_not());
      return;
    }
    if (group_inf_) {
      scale_ *= opt_.backoff_factor;
      good_steps_ = 0;
    } else if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
  }

  /// The scale, the finite steps since its last change, and the steps skipped since
  /// construction (read back from the device for a scaler `on_device`: it waits for the
  /// device's work so far).
  [[nodiscard]] double current_scale() const { return on_device() ? scale_t_.item<double>() : scale_; }
  [[nodiscard]] std::int64_t good_steps() const {
    return on_device() ? std::llround(good_t_.item<double>()) : good_steps_;
  }
  [[nodiscard]] std::int64_t skipped() const {
    return on_device() ? std::llround(skipped_t_.item<double>()) : skipped_;
  }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  /// For checkpoints: the scale and the growth count are the whole state.
  void restore(double scale, std::int64_t good_steps, std::int64_t skipped = 0) {
    scale_ = scale;
    good_steps_ = good_steps;
    skipped_ = skipped;
    if (on_device()) {
      scale_t_.fill_(scale);
      good_t_.fill_(static_cast<double>(good_steps));
      skipped_t_.fill_(static_cast<double>(skipped));
    }
  }

 private:
  // One step of the schedule on the device, `finite` a 0-dim bool tensor: back off and reset
  // the count where it is false, else count it and grow after `growth_interval` in a row.
  void advance(const at::Tensor& finite) {
    const auto good = at::where(finite, good_t_ + 1.0, at::zeros_like(good_t_));
    const auto grow = finite.logical_and(good >= static_cast<double>(opt_.growth_interval));
    const auto kept_or_grown = at::where(grow, scale_t_ * opt_.growth_factor, scale_t_);
    scale_t_.copy_(at::where(finite, kept_or_grown, scale_t_ * opt_.backoff_factor));
    good_t_.copy_(at::where(grow, at::zeros_like(good), good));
  }

  Options opt_{};
  double scale_ = 65536.0;
  std::int64_t good_steps_ = 0;
  bool grouped_ = false, group_inf_ = false, group_checked_ = false;  // inside begin_step/end_step
  std::int64_t skipped_ = 0;
  at::Tensor scale_t_, good_t_, skipped_t_, group_inf_t_;  // the state on the device (`keep_on`)
};

}  // namespace anvil
