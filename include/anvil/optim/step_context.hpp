#pragma once
/// @file
/// `StepContext`: what an algorithm's `update` runs its losses through. It owns the parts
/// of a gradient step that belong to the precision and parallelism policies: the autocast
/// scope around forward passes and losses, backward, the gradient all-reduce across ranks,
/// gradient clipping, and the optimizer step. Algorithms never call autocast or c10d
/// themselves, so one algorithm serves every Trainer combination.

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/autograd.h>
#include <torch/types.h>  // before clip_grad.h, which names torch's `Tensor` without including it
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <anvil/core/autocast.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/kept_copy.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/observe/timers.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/micro_batches.hpp>
#include <anvil/precision/loss_scaler.hpp>

namespace anvil {

/// Adds micro-batch `part`'s gradient `g` to `sum`, weighed by its share
/// (optim/micro_batches.hpp): the batch's gradient once every part is in. A part that is the
/// whole batch is its gradient, not copied.
inline void accumulate(at::Tensor& sum, at::Tensor g, const MicroBatch& part) {
  if (part.share == 1.0) sum = std::move(g);
  else if (!sum.defined()) sum = g * part.share;
  else sum.add_(g, part.share);
}

/// The gradient-step services a Trainer gives its algorithm (see file comment).
class StepContext {
 public:
  struct Options {
    c10::Device device{c10::kCPU};
    bool autocast = false;                             ///< run forward passes under autocast
    c10::ScalarType autocast_dtype = c10::ScalarType::Float;
    /// Averages gradients across ranks in place; empty for one process.
    std::function<void(std::vector<at::Tensor>&)> all_reduce_mean;
    /// The all-reduce may be captured in a CUDA graph (NCCL, `parallel.capture_all_reduce`):
    /// an update through this context is then captured with the all-reduce inside it, where
    /// a multi-GPU run has it (after the gradients, before the loss scaler's check, clipping
    /// and the optimizer steps). Otherwise an update with an all-reduce runs op by op.
    bool all_reduce_in_graph = false;
    /// Dynamic loss scaling (float16); empty for no scaling.
    std::optional<LossScaler::Options> loss_scaling;
    /// Keep the loss scaler's state in tensors on `device` (`LossScaler::keep_on`), so its
    /// check and skip are device work a CUDA graph can hold. Always so on CUDA; set it on the
    /// CPU to run that arithmetic op by op (`update_as_captured`, as the tests do).
    bool loss_scaler_on_device = false;
    /// Threads that run an update's independent parts at once (`concurrently`); 1 runs
    /// them one after another. Only used on the CPU: CUDA work is already asynchronous.
    int threads = 1;
    /// Gradient accumulation: an update splits its batch into this many micro-batches and
    /// takes one optimizer step on their averaged gradient (`train.grad_accumulation`).
    int micro_batches = 1;
    /// When set, the all-reduce and the optimizer step are timed into it (taken out of the
    /// update phase, which keeps the forward and backward passes).
    PhaseTimes* times = nullptr;
  };

  StepContext() = default;
  explicit StepContext(Options o) : opt_(std::move(o)) {
    if (opt_.loss_scaling) {
      scaler_ = LossScaler(*opt_.loss_scaling);
      if (opt_.device.is_cuda() || opt_.loss_scaler_on_device) scaler_->keep_on(opt_.device);
    }
    if (opt_.threads > 1 && opt_.device.is_cpu())
      // A new thread starts with OpenMP's default thread count (all cores), not the one
      // torch was given, and OpenBLAS's GEMMs follow OpenMP's: give each worker torch's.
      pool_ = std::make_shared<detail::ThreadPool>(opt_.threads, [n = at::get_num_threads()] {
        at::init_num_threads();
        using set_fn = void (*)(int);
        if (auto f = reinterpret_cast<set_fn>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(n);
      });
  }

  /// The device the algorithm's tensors live on.
  [[nodiscard]] const c10::Device& device() const noexcept { return opt_.device; }

  /// Whether forward passes run under autocast (a lower-precision policy).
  [[nodiscard]] bool autocasts() const noexcept { return opt_.autocast; }
  /// Whether losses are scaled before their gradients are taken (a loss scaler: FP16). A
  /// hand-written backward pass, which differentiates the unscaled loss, is then not used.
  [[nodiscard]] bool scales_losses() const noexcept { return scaler_.has_value(); }

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
    auto grads = gradients(loss, params);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!grads[i].defined()) grads[i] = torch::zeros_like(params[i]);
    all_reduce(grads);
    ++attempts_;
    if (scaler_) {
      std::vector<at::Tensor> parts;
      for (auto& g : grads) parts.push_back(g.reshape(-1));
      auto flat = at::cat(parts);
      if (!scaler_->unscale_and_check(flat)) return skip();
      std::int64_t off = 0;
      for (auto& g : grads) {
        g = flat.narrow(0, off, g.numel()).view(g.sizes());
        off += g.numel();
      }
    }
    InnerPhase timer(opt_.times, Phase::optimizer);
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
    if (max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, max_grad_norm);
    optimizer.step();
    return true;
  }

  /// `minimize` for a `FlatAdam`: the same contract, with the gradient gathered into one
  /// flat tensor, so the all-reduce is one call and clipping one norm.
  bool minimize(const at::Tensor& loss, FlatAdam& optimizer, double max_grad_norm = 0.0) {
    return apply(optimizer, gradient(loss, optimizer), max_grad_norm);
  }

  /// The first half of `minimize`: the flat gradient of `loss` for `optimizer`'s parameters
  /// (scaled, if the precision scales losses). Changes nothing, so the gradients of an
  /// update's independent losses can be computed at once (`concurrently`).
  [[nodiscard]] at::Tensor gradient(const at::Tensor& loss, const FlatAdam& optimizer) const {
    return optimizer.parameters().gather(gradients(loss, optimizer.parameters().params()));
  }

  /// The second half of `minimize`: averages `flat_grad` across ranks, unscales it and skips
  /// the step if it is not finite, clips it, and steps `optimizer`. Returns whether it stepped.
  bool apply(FlatAdam& optimizer, at::Tensor flat_grad, double max_grad_norm = 0.0) {
    std::vector<at::Tensor> flat{std::move(flat_grad)};
    all_reduce(flat);
    return step_reduced(optimizer, flat[0], max_grad_norm);
  }

  /// Clips `grad` to `max_grad_norm` (0: not at all), as torch's clip_grad_norm_: scaled by
  /// max_grad_norm / (norm + 1e-6) where that is below 1. A float gradient on the host (once
  /// per update on the fast paths) is read in one pass of plain loops, its squares summed in
  /// double, and left alone when it is short enough; elsewhere LibTorch's ops, without a
  /// host sync (a captured step's arithmetic).
  static void clip(at::Tensor& grad, double max_grad_norm) {
    if (max_grad_norm <= 0) return;
    if (grad.is_cpu() && grad.scalar_type() == at::kFloat && grad.is_contiguous()) {
      double squares = 0.0;
      simd::sum_squares(grad.data_ptr<float>(), grad.numel(), &squares);
      const double factor = max_grad_norm / (std::sqrt(squares) + 1e-6);
      if (factor < 1.0) simd::scale(grad.data_ptr<float>(), grad.numel(), static_cast<float>(factor));
      else if (!std::isfinite(squares)) grad.fill_(std::numeric_limits<float>::quiet_NaN());  // as torch: NaN stays NaN
      return;
    }
    grad.mul_((max_grad_norm / (grad.norm() + 1e-6)).clamp_max(1.0));
  }

  /// One optimizer's part of a combined step (`apply(std::vector<Step>)`).
  struct Step {
    FlatAdam* optimizer;
    at::Tensor flat_grad;
    double max_grad_norm = 0.0;
    /// When defined, once the step is taken (or skipped): `polyak(then_polyak, parameters,
    /// tau)`, a target network's average. On the CPU with update threads it runs in the
    /// step's own pass over each range of elements, while they are in cache.
    at::Tensor then_polyak = {};
    double tau = 0.0;
  };

  /// `apply` for several optimizers at once: their gradients cross ranks in one all-reduce
  /// (one bucketed call instead of one per network), then each is unscaled, checked,
  /// clipped and stepped on its own, as `apply` does. Returns how many stepped.
  int apply(std::vector<Step> steps) {
    std::vector<at::Tensor> grads;
    grads.reserve(steps.size());
    for (auto& s : steps) grads.push_back(std::move(s.flat_grad));
    all_reduce(grads);
    // On the CPU with update threads and no loss scaler (whose state every step reads and
    // writes), the optimizers step at once: each touches its own parameters, moments and
    // gradient, so the results are those of the steps in turn. Where every step takes the
    // fast path, all their elements are cut into one even range per thread (a critic's
    // optimizer holds twice the actor's parameters: whole steps would leave a thread idle).
    if (pool_ && !scaler_ && !capturing_ && steps.size() > 1) {
      InnerPhase timer(opt_.times, Phase::optimizer);
      attempts_ += static_cast<std::int64_t>(steps.size());
      if (std::all_of(steps.begin(), steps.end(), [&](const Step& s) {
            const auto i = static_cast<std::size_t>(&s - steps.data());
            return s.optimizer->steps_in_ranges(grads[i]) &&
                   (!s.then_polyak.defined() || polyak_is_simd(s.then_polyak, s.optimizer->parameters().flat(), s.tau));
          })) {
        step_in_ranges(steps, grads);
        return static_cast<int>(steps.size());
      }
      std::vector<std::function<void()>> tasks;
      for (std::size_t i = 0; i < steps.size(); ++i)
        tasks.emplace_back([&, i] {
          at::NoGradGuard no_grad;  // grad mode is per thread: a worker's is on
          step_optimizer(*steps[i].optimizer, grads[i], steps[i].max_grad_norm);
          then_polyak(steps[i]);
        });
      concurrently(tasks);
      return static_cast<int>(steps.size());
    }
    int stepped = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      stepped += step_reduced(*steps[i].optimizer, grads[i], steps[i].max_grad_norm);
      then_polyak(steps[i]);
    }
    return stepped;
  }

  /// Scope in which several optimizer steps are one step of the loss scaler (see
  /// `LossScaler::begin_step`): open it around an update that steps two optimizers in turn.
  /// Nothing without a scaler.
  class ScalerStep {
   public:
    explicit ScalerStep(LossScaler* s) noexcept : s_(s) {
      if (s_) s_->begin_step();
    }
    ScalerStep(const ScalerStep&) = delete;
    ScalerStep& operator=(const ScalerStep&) = delete;
    // A scaler on the device ends its step with device work, which can fail: the failure is
    // thrown, unless another exception (e.g. a failed capture) is already on its way out.
    ~ScalerStep() noexcept(false) {
      if (!s_) return;
      if (std::uncaught_exceptions() == 0) {
        s_->end_step();
        return;
      }
      try {
        s_->end_step();
      } catch (...) {  // the exception in flight says what went wrong first
      }
    }

   private:
    LossScaler* s_;
  };
  [[nodiscard]] ScalerStep one_scaler_step() noexcept { return ScalerStep(scaler()); }

  /// Runs `tasks` at once on the context's threads (one after another when it has one
  /// thread or runs on CUDA) and returns when all are done. Each task must only read shared
  /// state: compute gradients with `gradient`, and `apply` them afterwards. Autocast and
  /// no-grad scopes are per thread, so each task opens its own.
  void concurrently(const std::vector<std::function<void()>>& tasks) {
    if (!pool_) {
      for (const auto& t : tasks) t();
      return;
    }
    pool_->parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) tasks[static_cast<std::size_t>(i)]();
    });
  }
  [[nodiscard]] int threads() const noexcept { return pool_ ? pool_->threads() : 1; }
  /// Micro-batches per optimizer step (gradient accumulation; 1: none). An algorithm
  /// computes the gradient of each, weighs it by its share of the batch, and `apply`s the
  /// sum once: so the all-reduce across ranks, the loss scaler's check and clipping run
  /// once per step, on the whole batch's gradient.
  [[nodiscard]] int micro_batches() const noexcept { return opt_.micro_batches; }
  /// Changes the micro-batches per optimizer step (a `Staged` run whose stages differ).
  void set_micro_batches(int k) noexcept { opt_.micro_batches = std::max(1, k); }
  /// The micro-batches of a batch of `rows` (optim/micro_batches.hpp).
  [[nodiscard]] std::vector<MicroBatch> micro_batches(std::int64_t rows) const {
    return anvil::micro_batches(rows, opt_.micro_batches);
  }

  /// The mean of `x` over the ranks (`x` itself in one process), for a decision every rank
  /// must take alike, e.g. PPO's stop once an epoch's mean KL over all ranks is too large.
  [[nodiscard]] double mean_over_ranks(double x) {
    if (!opt_.all_reduce_mean) return x;
    std::vector<at::Tensor> v{at::full({1}, x, at::TensorOptions().dtype(at::kDouble).device(opt_.device))};
    opt_.all_reduce_mean(v);
    return v[0].item<double>();
  }

  /// Whether an update through this context can be captured as a CUDA graph
  /// (core/cuda_graph.hpp): one process or an all-reduce a graph can hold
  /// (`all_reduce_in_graph`), no loss scaler or one on the device (its check, skip and new
  /// scale are then device work), and one micro-batch unless the algorithm's captured update
  /// loops over the micro-batches itself (`loops_micro_batches`: SAC's does; the split is
  /// fixed for a batch size, so a graph holds the loop).
  [[nodiscard]] bool graphable(bool loops_micro_batches = false) const noexcept {
    return (!opt_.all_reduce_mean || opt_.all_reduce_in_graph) && (!scaler_ || scaler_->on_device()) &&
           (loops_micro_batches || opt_.micro_batches == 1);
  }
  /// Why an update through this context cannot be captured (empty where it can: `graphable`),
  /// for the run header.
  [[nodiscard]] std::string why_not_graphable(bool loops_micro_batches = false) const {
    if (opt_.all_reduce_mean && !opt_.all_reduce_in_graph)
      return "DDP: the all-reduce of gradients across ranks is not captured (parallel.capture_all_reduce=true "
             "captures it with NCCL)";
    if (scaler_ && !scaler_->on_device())
      return "the loss scaler's state is on the host (StepContext::Options::loss_scaler_on_device)";
    if (!loops_micro_batches && opt_.micro_batches > 1) return "gradient accumulation's micro-batches";
    return {};
  }
  /// Scope of a CUDA graph's capture: optimizer steps take `FlatAdam::step_on_device` (with
  /// a loss scaler, gated on the device by its check: no host decision), and nothing is
  /// timed (a timer's device synchronisation would break the capture) or counted (the
  /// caller counts each replay's steps: `count_steps`).
  class Capture {
   public:
    explicit Capture(StepContext& c) noexcept : c_(c), times_(c.opt_.times) {
      c_.capturing_ = true;
      c_.opt_.times = nullptr;
    }
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;
    ~Capture() {
      c_.capturing_ = false;
      c_.opt_.times = times_;
    }

   private:
    StepContext& c_;
    PhaseTimes* times_;
  };
  /// Whether a `Capture` scope is open: the update's device work is being captured, so an
  /// algorithm reads no value back to the host (its metrics stay tensors).
  [[nodiscard]] bool capturing() const noexcept { return capturing_; }
  /// Counts `n` optimizer steps a replayed graph took (or, with a loss scaler, tried: the
  /// scaler counts those it skipped).
  void count_steps(int n) noexcept { attempts_ += n; }

  /// Optimizer steps taken through this context (skipped ones not counted; with a scaler on
  /// the device, read back from it).
  [[nodiscard]] std::int64_t steps() const { return attempts_ - (scaler_ ? scaler_->skipped() : 0); }
  /// The loss scaler, when the precision scales losses.
  [[nodiscard]] LossScaler* scaler() noexcept { return scaler_ ? &*scaler_ : nullptr; }

  /// For checkpoints: the step count and the loss scaler's state (scale, finite steps since
  /// the last change, skipped steps).
  struct Saved {
    std::int64_t steps = 0;
    double scale = 0;
    std::int64_t good_steps = 0, skipped = 0;
  };
  void save(BinaryWriter& w) const {
    w.value(steps());
    w.value(scaler_.has_value());
    if (scaler_) {
      w.value(scaler_->current_scale());
      w.value(scaler_->good_steps());
      w.value(scaler_->skipped());
    }
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.steps = r.value<std::int64_t>("optimizer step count");
    const bool scaled = r.value<bool>("loss scaler flag");
    if (scaled != scaler_.has_value())
      r.fail("loss scaler flag", scaled ? "says the run scaled losses (FP16) but this one does not"
                                         : "says the run did not scale losses but this one does (FP16)");
    if (scaled) {
      s.scale = r.value<double>("loss scale");
      s.good_steps = r.value<std::int64_t>("loss scaler finite steps");
      s.skipped = r.value<std::int64_t>("loss scaler skipped steps");
      if (!(s.scale > 0) || !std::isfinite(s.scale)) r.fail("loss scale", "is not a positive finite number");
    }
    return s;
  }
  void restore(const Saved& s) {
    attempts_ = s.steps + (scaler_ ? s.skipped : 0);
    if (scaler_) scaler_->restore(s.scale, s.good_steps, s.skipped);
  }

 private:
  // Gradients of `loss` (scaled when a scaler is on) for `params` only: autograd prunes
  // every branch that does not lead to them.
  std::vector<at::Tensor> gradients(const at::Tensor& loss,
                                    const std::vector<at::Tensor>& params) const {
    return torch::autograd::grad({scaler_ ? scaler_->scale(loss) : loss}, params,
                                 /*grad_outputs=*/{}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  }
  // The rest of `apply` once `grad` is averaged across ranks: unscale and check, clip, step.
  bool step_reduced(FlatAdam& optimizer, at::Tensor& grad, double max_grad_norm) {
    InnerPhase timer(opt_.times, Phase::optimizer);
    if (!capturing_) ++attempts_;  // a replay's are counted by `count_steps`
    at::Tensor finite;             // a captured step's check (a scaler on the device)
    if (scaler_) {
      if (capturing_) finite = scaler_->unscale_and_check_on_device(grad);
      else if (!scaler_->unscale_and_check(grad)) return skip();
    }
    if (capturing_) {
      clip(grad, max_grad_norm);
      if (finite.defined()) optimizer.step_on_device(grad, finite);
      else optimizer.step_on_device(grad);
      return true;
    }
    step_optimizer(optimizer, grad, max_grad_norm);
    return true;
  }
  // The host step after the scaler's check: clip, then the optimizer's step.
  static void step_optimizer(FlatAdam& optimizer, at::Tensor& grad, double max_grad_norm) {
    clip(grad, max_grad_norm);
    optimizer.step(grad);
  }
  // A step's Polyak average after it (Step::then_polyak), unless fused into the step.
  static void then_polyak(const Step& s) {
    if (!s.then_polyak.defined()) return;
    at::NoGradGuard no_grad;
    polyak(s.then_polyak, s.optimizer->parameters().flat(), s.tau);
  }
  // The steps' elements (every step on the fast path) in one even range per thread, each
  // range cut at a multiple of FlatAdam::RangeStep::kAlign from its optimizer's start: the
  // same arithmetic per element as the steps one after another. Clipping reads a whole
  // gradient, so it runs first.
  void step_in_ranges(std::vector<Step>& steps, std::vector<at::Tensor>& grads) {
    for (std::size_t i = 0; i < steps.size(); ++i) clip(grads[i], steps[i].max_grad_norm);
    std::vector<FlatAdam::RangeStep> ranges;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      ranges.push_back(steps[i].optimizer->begin_step(grads[i]));
      total += ranges.back().size();
    }
    struct Piece {
      std::size_t step;
      std::int64_t begin, end;
    };
    const int threads = this->threads();
    std::vector<std::vector<Piece>> work(static_cast<std::size_t>(threads));
    const std::int64_t share = (total + threads - 1) / threads;
    std::int64_t room = share;  // what the current thread still takes
    std::size_t t = 0;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const std::int64_t n = ranges[i].size();
      for (std::int64_t b = 0; b < n;) {
        std::int64_t e = n;
        if (n - b > room && t + 1 < work.size()) {
          constexpr std::int64_t a = FlatAdam::RangeStep::kAlign;
          e = std::min(n, (b + room + a / 2) / a * a);  // the nearest cut at a multiple of kAlign
          if (e <= b) e = std::min(n, b + a);
        }
        work[t].push_back({i, b, e});
        room -= e - b;
        b = e;
        if (room <= 0 && t + 1 < work.size()) ++t, room += share;
      }
    }
    std::vector<std::function<void()>> tasks;
    for (const auto& pieces : work)
      if (!pieces.empty())
        tasks.emplace_back([&, pieces] {
          for (const auto& p : pieces) {
            const auto& r = ranges[p.step];
            r.run(p.begin, p.end);
            if (const auto& target = steps[p.step].then_polyak; target.defined())
              r.then_polyak(target.data_ptr<float>(), p.begin, p.end, static_cast<float>(steps[p.step].tau));
          }
        });
    concurrently(tasks);
    for (const auto& s : steps) mark_written(s.then_polyak);  // written through its pointer
  }
  // Averages `grads` across ranks (timed as the all-reduce phase).
  void all_reduce(std::vector<at::Tensor>& grads) {
    if (!opt_.all_reduce_mean) return;
    InnerPhase timer(opt_.times, Phase::all_reduce);
    opt_.all_reduce_mean(grads);
  }
  // Times phase `p` inside the update phase, or nothing when the context is not timed.
  class InnerPhase {
   public:
    InnerPhase(PhaseTimes* t, Phase p) {
      if (t) s_.emplace(*t, p, Phase::update);
    }

   private:
    std::optional<ScopedPhase> s_;
  };
  // A step with non-finite gradients: parameters and optimizer state stay as they were.
  static bool skip() noexcept { return false; }

  Options opt_;
  std::optional<LossScaler> scaler_;
  std::shared_ptr<detail::ThreadPool> pool_;
  std::int64_t attempts_ = 0;  // optimizer steps tried: taken, or skipped by the scaler
  bool capturing_ = false;  // inside a Capture scope
};

}  // namespace anvil
