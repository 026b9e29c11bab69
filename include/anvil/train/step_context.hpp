#pragma once
/// @file
/// `StepContext`: what an algorithm's `update` runs its losses through. It owns the parts
/// of a gradient step that belong to the precision and parallelism policies: the autocast
/// scope around forward passes and losses, backward, the gradient all-reduce across ranks,
/// gradient clipping, and the optimizer step. Algorithms never call autocast or c10d
/// themselves, so one algorithm serves every Trainer combination.

#include <torch/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <utility>
#include <vector>

#include <anvil/core/torch_compat.hpp>

namespace anvil {

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

/// The gradient-step services a Trainer gives its algorithm (see file comment).
class StepContext {
 public:
  struct Options {
    c10::Device device{c10::kCPU};
    bool autocast = false;                             ///< run forward passes under autocast
    c10::ScalarType autocast_dtype = c10::ScalarType::Float;
    /// Averages gradients across ranks in place; empty for one process.
    std::function<void(std::vector<at::Tensor>&)> all_reduce_mean;
  };

  StepContext() = default;
  explicit StepContext(Options o) : opt_(std::move(o)) {}

  /// The device the algorithm's tensors live on.
  [[nodiscard]] const c10::Device& device() const noexcept { return opt_.device; }

  /// Scope for forward passes and losses: autocast to the precision's dtype when it has one.
  /// Keep targets, losses' reductions and anything numerically delicate in float32 (cast
  /// with `.to(torch::kFloat)`); autocast already keeps reductions and softplus in float32.
  [[nodiscard]] AutocastGuard autocast() const {
    return AutocastGuard(opt_.device.type(), opt_.autocast, opt_.autocast_dtype);
  }

  /// One optimizer step on `loss` for the parameters `optimizer` holds. Gradients are
  /// computed for those parameters only (not for other networks the loss passes through,
  /// e.g. the critic inside the actor loss), averaged across ranks, clipped to
  /// `max_grad_norm` when it is positive, then applied. Returns whether the step was taken.
  bool minimize(const at::Tensor& loss, torch::optim::Optimizer& optimizer,
                double max_grad_norm = 0.0) {
    std::vector<at::Tensor> params;
    for (auto& group : optimizer.param_groups())
      for (auto& p : group.params()) params.push_back(p);
    auto grads = torch::autograd::grad({loss}, params, /*grad_outputs=*/{},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!grads[i].defined()) grads[i] = torch::zeros_like(params[i]);
    if (opt_.all_reduce_mean) opt_.all_reduce_mean(grads);
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
    if (max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, max_grad_norm);
    optimizer.step();
    ++steps_;
    return true;
  }

  /// Optimizer steps taken through this context.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

 private:
  Options opt_;
  std::int64_t steps_ = 0;
};

}  // namespace anvil
