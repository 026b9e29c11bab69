#pragma once
/// @file
/// `FlatAdam`: Adam (Kingma and Ba 2015) over parameters that live in one contiguous
/// buffer. RL networks are small, so per-tensor optimizers spend their time on per-op
/// overhead: torch's Adam issues about ten ops per parameter tensor (~150 for SAC's three
/// networks). Here each network's parameters are views into one flat tensor, so a step is
/// six ops whatever the number of layers, gradient clipping is one norm, an all-reduce
/// across ranks is one call, and Polyak averaging of a target network is one `lerp_`.

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/kept_copy.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/tensor_io.hpp>

namespace anvil {

/// A set of parameter tensors re-pointed into one contiguous buffer (`flat()`); each
/// parameter is a view of its slice, so modules keep using their tensors unchanged.
class FlatParameters {
 public:
  FlatParameters() = default;
  explicit FlatParameters(std::vector<at::Tensor> params) : params_(std::move(params)) {
    if (params_.empty()) throw Error("FlatParameters: no parameters given");
    const auto opts = params_.front().options();
    std::int64_t n = 0;
    for (const auto& p : params_) {
      if (p.device() != opts.device() || p.scalar_type() != opts.dtype().toScalarType())
        throw Error("FlatParameters: parameters must share one device and dtype");
      n += p.numel();
    }
    flat_ = at::empty({n}, opts.requires_grad(false));
    std::int64_t off = 0;
    for (auto& p : params_) {
      auto slice = flat_.narrow(0, off, p.numel()).view(p.sizes());
      slice.copy_(p.detach());
      p.set_data(slice);
      // (set_data keeps p's own count of in-place writes; a view shares its buffer's, and so
      // do these: a write to the buffer is a write to each, core/kept_copy.hpp)
      p.unsafeGetTensorImpl()->set_version_counter(flat_.unsafeGetTensorImpl()->version_counter());
      off += p.numel();
    }
  }

  /// The buffer every parameter views.
  [[nodiscard]] const at::Tensor& flat() const noexcept { return flat_; }
  /// The parameters, in the order they were given (same tensor objects as the module's).
  [[nodiscard]] const std::vector<at::Tensor>& params() const noexcept { return params_; }
  [[nodiscard]] std::int64_t numel() const noexcept { return flat_.numel(); }

  /// The part of `flat_like` (a tensor shaped like `flat()`, e.g. a flat gradient) that
  /// belongs to parameter `p` (one of `params()`), shaped like `p`.
  [[nodiscard]] at::Tensor slice_for(const at::Tensor& flat_like, const at::Tensor& p) const {
    if (!p.is_alias_of(flat_) || flat_like.numel() != flat_.numel())
      throw Error("FlatParameters::slice_for: the tensor is not one of these parameters, or the "
                  "flat tensor has the wrong size");
    return flat_like.narrow(0, p.storage_offset() - flat_.storage_offset(), p.numel()).view(p.sizes());
  }

  /// A gradient buffer shaped like `flat()` (uninitialised), and the views of it that belong
  /// to `params` (some of `params()`, in their order): where a hand-written backward pass
  /// writes each parameter's gradient, so the optimizer reads one tensor (the CPU fast paths').
  [[nodiscard]] at::Tensor new_gradient() const { return at::empty({numel()}, flat_.options()); }
  [[nodiscard]] std::vector<at::Tensor> views_of(const at::Tensor& flat_like, const std::vector<at::Tensor>& params) const {
    std::vector<at::Tensor> v;
    v.reserve(params.size());
    for (const auto& p : params) v.push_back(slice_for(flat_like, p));
    return v;
  }

  /// Concatenates per-parameter gradients into one flat gradient; an undefined gradient
  /// (a parameter the loss does not reach) counts as zeros.
  [[nodiscard]] at::Tensor gather(const std::vector<at::Tensor>& grads) const {
    std::vector<at::Tensor> parts;
    parts.reserve(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i)
      parts.push_back(grads[i].defined() ? grads[i].reshape(-1) : at::zeros({params_[i].numel()}, flat_.options()));
    return at::cat(parts);
  }

 private:
  std::vector<at::Tensor> params_;
  at::Tensor flat_;
};

/// `FlatAdam`'s settings.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Decoupled weight decay (AdamW, Loshchilov and Hutter 2019): the parameters shrink by
  /// lr * weight_decay before each step, as torch's AdamW does. 0: plain Adam.
  double weight_decay = 0.0;
};


/// Adam with torch's defaults and update rule (bias-corrected moments, eps outside the
/// square root), stepping a `FlatParameters` with a flat gradient; AdamW with a weight decay.
class FlatAdam {
 public:
  using Options = AdamOptions;

  FlatAdam() = default;
  FlatAdam(std::vector<at::Tensor> params, Options o) : params_(std::move(params)), opt_(o) {
    m_ = at::zeros_like(params_.flat());
    v_ = at::zeros_like(params_.flat());
    denom_ = at::empty_like(params_.flat());
  }

  /// One step of the CPU fast path cut into ranges of elements (`begin_step`): each range
  /// takes the same arithmetic as `step`, so ranges run on several threads, or each followed
  /// by a Polyak average of those elements (`then_polyak`), give `step`'s result.
  class RangeStep {
   public:
    /// Steps elements [begin, end) of the parameters. Start ranges at multiples of 16 from 0
    /// (`kAlign`): each element then takes the same vector lane as in one whole pass.
    void run(std::int64_t begin, std::int64_t end) const {
      if (end <= begin) return;
      simd::adam(w_ + begin, m_ + begin, v_ + begin, g_ + begin, end - begin, b1_, b2_, c1_, c2_, decay_, sqrt_bc2_,
                 eps_, step_);
    }
    /// Then target[i] += tau (w[i] - target[i]) over the same range, as `polyak` does.
    void then_polyak(float* target, std::int64_t begin, std::int64_t end, float tau) const {
      if (end > begin) simd::lerp(target + begin, w_ + begin, end - begin, tau);
    }
    [[nodiscard]] std::int64_t size() const noexcept { return n_; }
    [[nodiscard]] const float* weights() const noexcept { return w_; }
    static constexpr std::int64_t kAlign = 16;

   private:
    friend class FlatAdam;
    float *w_ = nullptr, *m_ = nullptr, *v_ = nullptr;
    const float* g_ = nullptr;
    std::int64_t n_ = 0;
    float b1_ = 0, b2_ = 0, c1_ = 0, c2_ = 0, decay_ = 1, sqrt_bc2_ = 1, eps_ = 0, step_ = 0;
  };

  /// Whether a step with gradient `g` takes the CPU fast path (`begin_step` can cut it).
  [[nodiscard]] bool steps_in_ranges(const at::Tensor& g) const {
    const auto& p = params_.flat();
    return !gated_ && p.device().is_cpu() && p.scalar_type() == at::kFloat && g.device().is_cpu() &&
           g.scalar_type() == at::kFloat && g.is_contiguous() && g.numel() == p.numel();
  }

  /// Counts a step with gradient `g` (where `steps_in_ranges(g)`) and returns it to run in
  /// ranges; `g` must outlive the ranges' runs.
  [[nodiscard]] RangeStep begin_step(const at::Tensor& g) {
    if (!steps_in_ranges(g)) throw Error("FlatAdam::begin_step: not a CPU float32 step with a contiguous gradient");
    ++steps_;
    steps_stale_ = true;
    mark_written(params_.flat());  // the ranges write the weights through their pointer
    const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
    const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(steps_));
    RangeStep r;
    r.w_ = params_.flat().data_ptr<float>();
    r.m_ = m_.data_ptr<float>();
    r.v_ = v_.data_ptr<float>();
    r.g_ = g.data_ptr<float>();
    r.n_ = params_.flat().numel();
    r.b1_ = static_cast<float>(opt_.beta1);
    r.b2_ = static_cast<float>(opt_.beta2);
    r.c1_ = static_cast<float>(1.0 - opt_.beta1);
    r.c2_ = static_cast<float>(1.0 - opt_.beta2);
    r.decay_ = opt_.weight_decay > 0 ? static_cast<float>(1.0 - opt_.lr * opt_.weight_decay) : 1.0f;
    r.sqrt_bc2_ = static_cast<float>(std::sqrt(bc2));
    r.eps_ = static_cast<float>(opt_.eps);
    r.step_ = static_cast<float>(-opt_.lr / bc1);
    return r;
  }

  /// One Adam step with flat gradient `g` (same size as the parameters).
  void step(const at::Tensor& g) {
    if (steps_in_ranges(g)) {
      // One pass over plain floats, the same arithmetic as `step_on_device`'s ops: at RL
      // sizes the seven ops' dispatch costs more than the arithmetic.
      const RangeStep r = begin_step(g);
      r.run(0, r.size());
      return;
    }
    // Elsewhere (CUDA, other dtypes) the tensor ops a CUDA graph replays: an update op by op
    // and its replay take the same step.
    sync_device_state();
    step_on_device(g);
    ++steps_;
  }

  /// `step` as a CUDA graph captures it (core/cuda_graph.hpp): the same update with the
  /// step count and the learning rate read from device tensors, so a replay does not reuse
  /// the host's values at capture. Call `sync_device_state` before each replay and
  /// `count_step` after it (the host's count, for checkpoints and `steps()`).
  void step_on_device(const at::Tensor& g) {
    const auto& p = params_.flat();
    step_t_.add_(1.0);
    const auto bc1 = 1.0 - at::pow(opt_.beta1, step_t_), bc2 = 1.0 - at::pow(opt_.beta2, step_t_);
    m_.mul_(opt_.beta1).add_(g, 1.0 - opt_.beta1);
    if (opt_.weight_decay > 0) p.mul_(1.0 - lr_t_ * opt_.weight_decay);
    v_.mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    at::sqrt_out(denom_, v_);
    denom_.div_(bc2.sqrt()).add_(opt_.eps);
    p.sub_(m_ / denom_ * (lr_t_ / bc1));
  }
  /// `step_on_device` for a step a loss scaler may skip (precision/loss_scaler.hpp): `ok`, a
  /// 0-dim bool tensor on the device, says whether the gradient was finite. Where it is
  /// false the parameters, both moments and the step count stay as they were, as when the
  /// host skips the step; no host read. From the first such step on, the device's step count
  /// is the optimizer's (`steps()` reads it back).
  void step_on_device(const at::Tensor& g, const at::Tensor& ok) {
    gated_ = true;
    const auto& p = params_.flat();
    step_t_.add_(ok);
    const auto bc1 = 1.0 - at::pow(opt_.beta1, step_t_), bc2 = 1.0 - at::pow(opt_.beta2, step_t_);
    const auto m = m_ * opt_.beta1 + g * (1.0 - opt_.beta1);
    const auto v = v_ * opt_.beta2 + g * g * (1.0 - opt_.beta2);
    const auto decayed = opt_.weight_decay > 0 ? p * (1.0 - lr_t_ * opt_.weight_decay) : p;
    const auto stepped = decayed - m / (v.sqrt() / bc2.sqrt() + opt_.eps) * (lr_t_ / bc1);
    m_.copy_(at::where(ok, m, m_));
    v_.copy_(at::where(ok, v, v_));
    p.copy_(at::where(ok, stepped, p));
  }
  /// Makes the device's step count and learning rate those of the host (a fill for each
  /// that changed: a step taken on the host, a new learning rate, a restore).
  void sync_device_state() {
    if (!step_t_.defined()) {
      const auto o = params_.flat().options().dtype(at::kDouble);
      step_t_ = at::zeros({}, o);
      lr_t_ = at::zeros({}, o);
      steps_stale_ = lr_stale_ = true;
    }
    if (steps_stale_) step_t_.fill_(static_cast<double>(steps_));
    if (lr_stale_) lr_t_.fill_(opt_.lr);
    steps_stale_ = lr_stale_ = false;
  }
  /// Counts a step `step_on_device` took in a replay.
  void count_step() noexcept { ++steps_; }

  [[nodiscard]] const FlatParameters& parameters() const noexcept { return params_; }
  [[nodiscard]] double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) noexcept {
    if (lr != opt_.lr) lr_stale_ = true;
    opt_.lr = lr;
  }
  /// Steps taken (skipped ones not counted). After a step a loss scaler could skip on the
  /// device, read back from it (waiting for the device's work so far).
  [[nodiscard]] std::int64_t steps() const { return gated_ ? std::llround(step_t_.item<double>()) : steps_; }
  /// First and second moment estimates, for checkpoints.
  [[nodiscard]] const at::Tensor& exp_avg() const noexcept { return m_; }
  [[nodiscard]] const at::Tensor& exp_avg_sq() const noexcept { return v_; }

  /// What a checkpoint holds of an optimizer: its parameters, both moments, the step
  /// count (for bias correction) and the learning rate.
  struct Saved {
    at::Tensor params, m, v;
    std::int64_t steps = 0;
    double lr = 0;
  };
  /// Writes the parameters and the optimizer state.
  void save(BinaryWriter& w) const {
    write_tensor(w, params_.flat(), "the parameters");
    write_tensor(w, m_, "Adam's first moments");
    write_tensor(w, v_, "Adam's second moments");
    w.value(steps());
    w.value(opt_.lr);
  }
  /// Reads what `save` wrote into host tensors, checking sizes; changes nothing here.
  [[nodiscard]] Saved read(BinaryReader& r, const std::string& what) const {
    Saved s;
    s.params = read_tensor(r, (what + " parameters").c_str(), params_.flat());
    s.m = read_tensor(r, (what + " first moments").c_str(), m_);
    s.v = read_tensor(r, (what + " second moments").c_str(), v_);
    s.steps = r.value<std::int64_t>((what + " step count").c_str());
    s.lr = r.value<double>((what + " learning rate").c_str());
    return s;
  }
  /// Copies a read state in place (the modules' parameter views stay valid).
  void restore(const Saved& s) {
    at::NoGradGuard no_grad;
    params_.flat().copy_(s.params);
    m_.copy_(s.m);
    v_.copy_(s.v);
    steps_ = s.steps;
    opt_.lr = s.lr;
    gated_ = false;
    steps_stale_ = lr_stale_ = true;
  }

 private:
  FlatParameters params_;
  Options opt_;
  at::Tensor m_, v_, denom_;
  std::int64_t steps_ = 0;
  at::Tensor step_t_, lr_t_;  // step_on_device's step count and learning rate (float64, 0-dim)
  bool steps_stale_ = true, lr_stale_ = true;  // they differ from steps_ and opt_.lr
  bool gated_ = false;  // a step a loss scaler could skip was taken on the device: step_t_ is the count
};

}  // namespace anvil
