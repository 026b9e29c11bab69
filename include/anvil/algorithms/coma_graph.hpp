#pragma once
/// @file
/// COMA's minibatch steps in a CUDA graph (optim/graphed_update.hpp): a minibatch's critic
/// step and then its actor step (advantages from the stepped critic), each with its clipped
/// Adam step, as one graph per exploration setting (epsilon mixed in or not), their losses
/// and statistics kept on the device and read back once per training. The minibatch's rows
/// are gathered op by op and copied into the graph's inputs, with epsilon's mixing weights
/// (device scalars, so the annealing reaches every replay); the target critic's copies stay
/// op by op between minibatches. The same work op by op on any device is
/// `COMA::update_as_captured`, which the tests compare with the eager update on the CPU.
/// Static functions on a `COMA` (algorithms/coma.hpp), whose friend they are. A recurrent
/// actor unrolls every held episode in each step, so its steps stay op by op.

#include <string>
#include <vector>

#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/error.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil::detail {

/// A captured COMA minibatch leaves its losses and statistics (float64 [5]).
using ComaGraphs = GraphedUpdates<at::Tensor>;

/// COMA's captured minibatch steps (see file comment).
struct ComaGraphed {
  /// Why `s`'s minibatch steps cannot be captured through `ctx`, "" where they can
  /// (`cuda_graph` on, one process, an MLP actor); not whether CUDA graphs
  /// are built (`cuda::kCudaGraphs`).
  template <class S>
  static std::string why_not(const S& s, const StepContext& ctx) {
    const std::string why = why_not_captured(s.cfg_.cuda_graph, S::config_section.view(), ctx);
    if (why.empty() && s.recurrent())
      return std::string(S::config_section.view()) + ".actor.gru: a recurrent actor unrolls every held episode in each step";
    return why;
  }

  /// Whether graphs hold this training's minibatch steps: CUDA graphs built, the model on the
  /// GPU, and nothing in `why_not`.
  template <class S>
  static bool graphable(const S& s, const StepContext& ctx) {
    return cuda::kCudaGraphs && s.device_.is_cuda() && why_not(s, ctx).empty();
  }

  /// A minibatch's steps from a graph (one per minibatch size and exploration setting),
  /// warmed up op by op, captured, then replayed on the minibatch's rows and `mix`.
  template <class S, class Rows, class Mixing>
  static at::Tensor minibatch(S& s, const Rows& mb, StepContext& ctx, const Mixing& mix) {
    auto& g = s.graphs_.of(mb.u.size(0) * 2 + (mix.keep.defined() ? 1 : 0), s.device_);
    if (g.update.warming()) {
      at::Tensor m;
      g.update.warm_up([&] { m = s.minibatch(mb, ctx, mix); });
      return m;
    }
    s.actor_opt_.sync_device_state();
    s.critic_opt_.sync_device_state();
    const std::vector<at::Tensor> values{mb.actor_in, mb.critic_in, mb.avail, mb.u, mb.target, mix.keep, mix.eps};
    if (!g.update.captured()) {
      auto& u = g.update;
      const Rows in{u.input(mb.actor_in), u.input(mb.critic_in), u.input(mb.avail), u.input(mb.u), u.input(mb.target), {}};
      const Mixing in_mix{u.input(mix.keep), u.input(mix.eps)};
      u.capture(ctx, S::config_section.view(), [&] { g.out = s.minibatch(in, ctx, in_mix); });
    }
    s.graphs_.replay(g, values);
    finish(s, ctx);
    return g.out.clone();  // the next replay writes over the graph's own
  }

  /// The captured minibatch's work op by op (`COMA::update_as_captured`).
  template <class S, class Rows, class Mixing>
  static at::Tensor as_captured(S& s, const Rows& mb, StepContext& ctx, const Mixing& mix) {
    s.actor_opt_.sync_device_state();
    s.critic_opt_.sync_device_state();
    at::Tensor m;
    {
      const StepContext::Capture capture(ctx);
      m = s.minibatch(mb, ctx, mix);
    }
    finish(s, ctx);
    return m;
  }

 private:
  // The host's part after the device work: the two optimizer steps counted (the host's
  // counts, for checkpoints).
  template <class S>
  static void finish(S& s, StepContext& ctx) {
    s.critic_opt_.count_step();
    s.actor_opt_.count_step();
    ctx.count_steps(2);
  }
};

}  // namespace anvil::detail
