#pragma once
/// @file
/// `Ema`: an exponential moving average of a set of weights (Polyak averaging of a policy),
/// kept as one flat tensor beside the flat weights it follows (optim/flat_adam.hpp), so an
/// update is one `polyak` pass whatever the network (also SAC's target critic). A run's `train.ema_decay` asks for one after
/// each update; evaluation and policy.bin then use the average (`with_weights`).

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cstdint>
#include <utility>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/kept_copy.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/core/tensor_io.hpp>

namespace anvil {

/// Polyak averaging: `target` moves a fraction `tau` towards `source` (same size), as
/// `target.lerp_(source, tau)`; one pass over plain floats on the CPU.
/// Whether `polyak(target, source, tau)` takes the plain loop over floats (`simd::lerp`), which
/// a caller may also run in pieces (StepContext fuses it into an optimizer's step); torch's
/// `lerp_` otherwise (it switches formula at tau 0.5).
inline bool polyak_is_simd(const at::Tensor& target, const at::Tensor& source, double tau) {
  return tau < 0.5 && target.device().is_cpu() && target.scalar_type() == at::kFloat && target.is_contiguous() &&
         source.device().is_cpu() && source.scalar_type() == at::kFloat && source.is_contiguous() &&
         source.numel() == target.numel();
}

inline void polyak(const at::Tensor& target, const at::Tensor& source, double tau) {
  if (polyak_is_simd(target, source, tau)) {
    simd::lerp(target.data_ptr<float>(), source.data_ptr<float>(), target.numel(), static_cast<float>(tau));
    return mark_written(target);
  }
  at::NoGradGuard no_grad;
  target.lerp_(source, tau);
}

/// The average `ema = decay ema + (1 - decay) weights`, started at the weights by the first
/// update (see file comment).
class Ema {
 public:
  /// Moves the average towards `weights` (a flat tensor; the same one each time).
  void update(const at::Tensor& weights, double decay) {
    torch::NoGradGuard no_grad;
    if (!avg_.defined()) avg_ = weights.detach().clone();
    else polyak(avg_, weights.detach(), 1.0 - decay);
    ++updates_;
  }
  /// The average; undefined until the first update.
  [[nodiscard]] const at::Tensor& weights() const noexcept { return avg_; }
  [[nodiscard]] bool defined() const noexcept { return avg_.defined(); }
  /// Updates so far.
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }

  /// Runs `f` with the average copied into `live` (the flat weights it follows), then puts
  /// the trained weights back, whatever `f` does. Without an average, just runs `f`.
  template <class F>
  decltype(auto) with_weights(const at::Tensor& live, F&& f) const {
    if (!avg_.defined()) return std::forward<F>(f)();
    struct Swap {
      at::Tensor w, saved;
      Swap(const at::Tensor& weights, const at::Tensor& avg) : w(weights), saved(weights.detach().clone()) {
        torch::NoGradGuard no_grad;
        w.copy_(avg);
      }
      ~Swap() {
        torch::NoGradGuard no_grad;
        w.copy_(saved);
      }
    } swap(live, avg_);
    return std::forward<F>(f)();
  }

  /// State protocol (core/state.hpp); `read` checks the average against `like` (the
  /// weights it follows) and names it `what` in messages.
  void save(BinaryWriter& w) const {
    w.value(avg_.defined());
    w.value(updates_);
    if (avg_.defined()) write_tensor(w, avg_, "the averaged weights");
  }
  struct Saved {
    at::Tensor avg;
    std::int64_t updates = 0;
  };
  [[nodiscard]] Saved read(BinaryReader& r, const char* what, const at::Tensor& like) const {
    Saved s;
    const bool defined = r.value<bool>("policy average flag");
    s.updates = r.value<std::int64_t>("policy average updates");
    if (defined) s.avg = read_tensor(r, what, like);
    return s;
  }
  void restore(const Saved& s) {
    avg_ = s.avg.defined() ? s.avg.to(device_) : at::Tensor();
    updates_ = s.updates;
  }
  /// Where restored averages go (the device of the weights they follow).
  void set_device(c10::Device d) noexcept { device_ = d; }

 private:
  at::Tensor avg_;
  std::int64_t updates_ = 0;
  c10::Device device_{c10::kCPU};
};

}  // namespace anvil
