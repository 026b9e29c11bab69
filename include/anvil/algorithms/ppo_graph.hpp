#pragma once
/// @file
/// PPO's minibatch update in a CUDA graph (optim/graphed_update.hpp): the update's device
/// work with no host synchronisation (the loss, its gradient, the clipped Adam step, the
/// loss's parts as a device tensor), one graph per minibatch size, and the host's part after
/// a replay (the step counted, the parts read back once, the epoch's KL). The same work op
/// by op on any device is `PPO::update_as_captured`, which the tests compare with the eager
/// update on the CPU. Static functions on a `PPO` (algorithms/ppo.hpp), whose friend they
/// are. Gradient accumulation is a loop over the micro-batches inside the graph, as op by
/// op; the learning rate's annealing reaches a replay through the optimizer's device state.

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/algorithms/ppo_objective.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/error.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil::detail {

/// A captured PPO update leaves the loss's parts (float64 [5], `PpoLosses::of` reads them).
using PpoGraphs = GraphedUpdates<at::Tensor>;

/// PPO's captured minibatch update (see file comment).
struct PpoGraphed {
  /// Why `s`'s update cannot be captured through `ctx` on its device, "" where it can
  /// (`cuda_graph` on, one process, no random image shifts inside the
  /// update); not whether CUDA graphs are built (`cuda::kCudaGraphs`).
  template <class S>
  static std::string why_not(const S& s, const StepContext& ctx) {
    const std::string why = why_not_captured(s.cfg_.cuda_graph, S::config_section.view(), ctx);
    if (why.empty() && s.encoder_ && *s.cfg_.encoder->shift > 0)
      return std::string(S::config_section.view()) +
             ".encoder.shift: the update draws random image shifts (set it to 0 to capture the update)";
    return why;
  }

  /// Whether a graph holds this update: CUDA graphs built, the model and the batch on the
  /// GPU, and nothing in `why_not`.
  template <class S>
  static bool graphable(const S& s, const RolloutBatch& b, const StepContext& ctx) {
    return cuda::kCudaGraphs && s.device_.is_cuda() && b.obs.is_cuda() && why_not(s, ctx).empty();
  }

  /// The update from a graph: one per minibatch size, warmed up op by op, captured, then
  /// replayed on the minibatch's rows.
  template <class S>
  static UpdateInfo update(S& s, const RolloutBatch& b, StepContext& ctx) {
    auto& g = s.graphs_.of(b.obs.size(0), s.device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = s.eager_update(b, ctx); });
      return info;
    }
    s.opt_.adam().sync_device_state();
    const std::vector<at::Tensor> values{b.obs, b.action, b.log_prob, b.advantage, b.returns, b.value};
    if (!g.update.captured()) {
      auto& u = g.update;
      const RolloutBatch in{u.input(b.obs),     u.input(b.action),  u.input(b.log_prob),
                            u.input(b.advantage), u.input(b.returns), u.input(b.value)};
      u.capture(ctx, S::config_section.view(), [&] { g.out = device_update(s, in, ctx); });
    }
    s.graphs_.replay(g, values);
    return finish(s, ctx, g.out);
  }

  /// The captured update's work op by op (`PPO::update_as_captured`).
  template <class S>
  static UpdateInfo as_captured(S& s, const RolloutBatch& b, StepContext& ctx) {
    const std::string why = why_not(s, ctx);
    if (!why.empty())
      throw Error(std::string(S::config_section.view()) + ": this update cannot be captured: " + why);
    s.opt_.adam().sync_device_state();
    at::Tensor parts;
    {
      const StepContext::Capture capture(ctx);
      parts = device_update(s, b, ctx);
    }
    return finish(s, ctx, parts);
  }

 private:
  // The update's device work with no host synchronisation: what a graph captures. The
  // minibatch in micro-batches (a fixed split for a minibatch size), each part's gradient
  // and loss parts weighed by its share, one clipped Adam step on their sum. Returns the
  // loss's parts (float64 [5]).
  template <class S>
  static at::Tensor device_update(S& s, const RolloutBatch& b, StepContext& ctx) {
    const auto micro = ctx.micro_batches(b.obs.size(0));
    const bool whole = micro.size() == 1;
    at::Tensor grad, sum;
    for (const auto& part : micro) {
      const RolloutBatch& mb = whole ? b : S::slice(b, part.begin, part.rows);
      auto [loss, parts] = s.loss_parts(mb, ctx);
      accumulate(grad, ctx.gradient(loss, s.opt_.adam()), part);
      sum = whole ? parts : (sum.defined() ? sum + parts * part.share : parts * part.share);
    }
    ctx.apply(s.opt_.adam(), grad, s.cfg_.max_grad_norm);
    return sum;
  }

  // The host's part after the device work: the optimizer step counted (the host's count, for
  // checkpoints), the loss's parts read back (one copy, which waits for the device), the
  // update counted with its KL for the epoch's early stop.
  template <class S>
  static UpdateInfo finish(S& s, StepContext& ctx, const at::Tensor& parts) {
    s.opt_.adam().count_step();
    ctx.count_steps(1);
    return s.opt_.counted(PpoLosses::of(parts), s.log_std_);
  }
};

}  // namespace anvil::detail
