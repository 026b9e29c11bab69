#pragma once
/// @file
/// Autocast scopes, the same on LibTorch 1.13 and 2.x: `AutocastGuard` turns autocast on
/// for one device type (the precision policy's scope, opened through `StepContext`), and
/// `Float32Scope` turns it off again inside such a scope, for the few computations that
/// reduced precision would hurt (see `Mlp::forward`). Both restore the previous state on exit.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace anvil {
namespace compat {

// ---- autocast --------------------------------------------------------------------------
// 2.3 introduced device-generic switches (set_autocast_enabled(device_type, on)); earlier
// versions have one switch per device (set_enabled for CUDA, set_cpu_enabled for CPU).

/// Whether autocast is on for `device`.
inline bool autocast_enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

/// Turns autocast on or off for `device`.
inline void set_autocast_enabled(c10::DeviceType device, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::DeviceType::CUDA) at::autocast::set_enabled(on);
  else at::autocast::set_cpu_enabled(on);
#endif
}

/// The reduced dtype autocast casts to on `device`.
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

/// Sets the reduced dtype autocast casts to on `device`.
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) at::autocast::set_autocast_gpu_dtype(dtype);
  else at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

/// Autocast keeps casted weights in a cache while nested scopes are open; the outermost
/// scope clears it on exit (the same protocol Python's torch.autocast follows).
inline int autocast_enter() { return at::autocast::increment_nesting(); }
inline void autocast_exit() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace compat

/// Turns autocast on for one device type while alive and restores the previous state after.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, bool enable, c10::ScalarType dtype) : device_(device) {
    if (!enable) return;
    active_ = true;
    prev_enabled_ = compat::autocast_enabled(device_);
    prev_dtype_ = compat::autocast_dtype(device_);
    compat::set_autocast_enabled(device_, true);
    compat::set_autocast_dtype(device_, dtype);
    compat::autocast_enter();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  ~AutocastGuard() {
    if (!active_) return;
    compat::autocast_exit();
    compat::set_autocast_enabled(device_, prev_enabled_);
    compat::set_autocast_dtype(device_, prev_dtype_);
  }

 private:
  c10::DeviceType device_;
  bool active_ = false;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Float;
};

/// Inside an autocast scope, turns autocast off for `device` while alive, so the ops run in
/// the dtype of their inputs (cast them to float32 first); a no-op outside one.
class Float32Scope {
 public:
  explicit Float32Scope(c10::DeviceType device) : device_(device), was_on_(compat::autocast_enabled(device)) {
    if (was_on_) compat::set_autocast_enabled(device_, false);
  }
  Float32Scope(const Float32Scope&) = delete;
  Float32Scope& operator=(const Float32Scope&) = delete;
  ~Float32Scope() {
    if (was_on_) compat::set_autocast_enabled(device_, true);
  }
  /// Whether autocast was on when the scope opened.
  [[nodiscard]] bool active() const noexcept { return was_on_; }

 private:
  c10::DeviceType device_;
  bool was_on_;
};

}  // namespace anvil
