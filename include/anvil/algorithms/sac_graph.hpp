#pragma once
/// @file
/// SAC's update in a CUDA graph (optim/graphed_update.hpp): the update's device work with no
/// host synchronisation (what a graph captures), one graph per shape of update, and the
/// host's part after a replay; and the same work op by op on any device
/// (`BasicSAC::update_as_captured`, which the tests compare with the eager update on the
/// CPU). Static functions on a `BasicSAC` (algorithms/sac.hpp), whose friend they are; the
/// noise is drawn outside the graph, as op by op, so a run draws the same numbers with the
/// graph or without. Gradient accumulation is a loop over the micro-batches inside the
/// graph, as op by op. MultiTaskSAC's temperature per task (and its tasks' loss weights) is
/// device work like the rest: each transition's temperature indexed by its task on the
/// device, the tasks' target entropies a device tensor. Acting is captured too: the actor's
/// forward for a batch of envs.

#include <torch/utils.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <anvil/algorithms/sac_parts.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/error.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil::detail {

/// What a captured SAC update leaves: its TD errors and metrics (and the metrics' names).
struct SacGraphOutputs {
  at::Tensor td, metrics;
  std::vector<std::string> names;
};
using SacGraphs = GraphedUpdates<SacGraphOutputs>;
/// Acting's captured forward leaves the actions (valid until the graph's next replay).
using SacActGraphs = GraphedUpdates<at::Tensor>;

/// SAC's captured update (see file comment).
struct SacGraphed {
  /// Whether a graph can hold this update: CUDA graphs built and on (`cuda_graph`), the
  /// batch on the GPU (with its task ids when there is a temperature per task), one
  /// process or an all-reduce a graph holds, no loss scaler on the host (micro-batches of
  /// gradient accumulation are looped over in the graph).
  template <class S, class Noise>
  static bool graphable(const S& s, const ReplayBatch& b, const StepContext& ctx, const Noise& noise) {
    return cuda::kCudaGraphs && s.cfg_.cuda_graph && s.device_.is_cuda() && b.obs.is_cuda() &&
           (s.alphas_ == 1 || (b.task.defined() && b.task.is_cuda())) && ctx.graphable(/*loops_micro_batches=*/true) &&
           noise.next.defined() &&
           (noise.obs.defined() || s.updates_ % s.cfg_.actor_update_freq != 0);
  }

  /// Whether a graph can hold acting: CUDA graphs built and on (`cuda_graph`), the
  /// observations on the GPU.
  template <class S>
  static bool act_graphable(const S& s, const at::Tensor& obs) {
    return cuda::kCudaGraphs && s.cfg_.cuda_graph && s.device_.is_cuda() && obs.is_cuda();
  }

  /// Acting from a graph: `forward(obs, noise)` (the actor's sample for the noise, or its
  /// mode where the noise is undefined) for a batch of observations, one graph per batch size
  /// and mode, warmed up op by op, captured, then replayed. The actor's weights are read
  /// where they live, so a replay acts with the weights of the last update. The actions are
  /// a copy (the next replay writes over the graph's own).
  template <class S, class F>
  static at::Tensor act(S& s, const at::Tensor& obs, const at::Tensor& noise, F&& forward) {
    auto& g = s.act_graphs_.of(obs.size(0) * 2 + (noise.defined() ? 1 : 0), s.device_);
    if (g.update.warming()) {
      at::Tensor action;
      g.update.warm_up([&] { action = forward(obs, noise); });
      return action;
    }
    if (!g.update.captured()) {
      auto& u = g.update;
      const at::Tensor in_obs = u.input(obs), in_noise = u.input(noise);
      u.capture(S::config_section.view(), "acting", [&] { g.out = forward(in_obs, in_noise); });
    }
    s.act_graphs_.replay(g, {obs, noise});
    return g.out.clone();
  }

  /// The update from a graph: one per shape of update (batch rows, actor and target steps or
  /// not, importance weights and discounts given or not), warmed up op by op, captured, then
  /// replayed.
  template <class S, class Noise>
  static UpdateInfo update(S& s, const ReplayBatch& b, StepContext& ctx, const Noise& noise) {
    const bool actor_step = s.updates_ % s.cfg_.actor_update_freq == 0;
    const bool target_step = s.updates_ % s.cfg_.target_update_freq == 0;
    const std::int64_t key = b.obs.size(0) * 16 + (actor_step ? 1 : 0) + (target_step ? 2 : 0) +
                             (b.weight.defined() ? 4 : 0) + (b.discount.defined() ? 8 : 0);
    auto& g = s.graphs_.of(key, s.device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = s.eager_update(b, ctx, noise); });
      return info;
    }
    for (auto* o : {&s.actor_opt_, &s.critic_opt_, &s.alpha_opt_}) o->sync_device_state();
    const at::Tensor task = s.alphas_ > 1 ? b.task : at::Tensor();
    const std::vector<at::Tensor> values{b.obs,      b.action, b.reward,   b.next_obs,
                                         b.terminated, b.discount, b.weight, task,
                                         noise.next, actor_step ? noise.obs : at::Tensor()};
    if (!g.update.captured()) {
      auto& u = g.update;
      const ReplayBatch in{u.input(b.obs),        u.input(b.action),   u.input(b.reward), u.input(b.next_obs),
                           u.input(b.terminated), u.input(b.discount), u.input(b.weight), {}, u.input(task)};
      const Noise in_noise{u.input(noise.next), u.input(values.back())};
      g.out.names = metric_names(s, actor_step);
      u.capture(ctx, S::config_section.view(), [&] {
        std::tie(g.out.td, g.out.metrics) = device_update(s, in, ctx, in_noise, actor_step, target_step);
      });
    }
    s.graphs_.replay(g, values);
    return finish(s, actor_step, ctx, g.out.names, g.out.metrics, g.out.td);
  }

  /// The captured update's work op by op (`BasicSAC::update_as_captured`).
  template <class S, class Noise>
  static UpdateInfo as_captured(S& s, const ReplayBatch& b, StepContext& ctx, const Noise& noise) {
    if (!ctx.graphable(/*loops_micro_batches=*/true))
      throw Error(std::string(S::config_section.view()) + ": this update cannot be captured: " +
                  ctx.why_not_graphable(/*loops_micro_batches=*/true));
    if (s.alphas_ > 1 && !b.task.defined())
      throw Error(std::string(S::config_section.view()) + ": the batch has no task ids, but the env has " +
                  std::to_string(s.alphas_) + " tasks (a replay buffer of this run stores them)");
    const bool actor_step = s.updates_ % s.cfg_.actor_update_freq == 0;
    const bool target_step = s.updates_ % s.cfg_.target_update_freq == 0;
    for (auto* o : {&s.actor_opt_, &s.critic_opt_, &s.alpha_opt_}) o->sync_device_state();
    at::Tensor td, metrics;
    {
      const StepContext::Capture capture(ctx);
      std::tie(td, metrics) = device_update(s, b, ctx, noise, actor_step, target_step);
    }
    return finish(s, actor_step, ctx, metric_names(s, actor_step), metrics, td);
  }

 private:
  // The update's device work with no host synchronisation: what a graph captures. Returns
  // the TD errors and the metrics (float64, in the order of `metric_names`).
  template <class S, class Noise>
  static std::pair<at::Tensor, at::Tensor> device_update(S& s, const ReplayBatch& batch, StepContext& ctx, const Noise& noise,
                                                         bool actor_step, bool target_step) {
    const auto& cfg = s.cfg_;
    const bool per_task = s.alphas_ > 1;
    // The temperatures before the update, as a tensor (a host value would be fixed at
    // capture): one, or each transition's task's, with its task's loss weight (the critic's
    // times the importance weight), as the op-by-op update has them.
    const TaskRows rows = per_task ? task_rows(s.log_alpha_, batch, s.task_weights_) : TaskRows{};
    const SacAlpha alpha{0.0, per_task ? rows.alpha_row : s.log_alpha_.detach().exp()};
    const ReplayBatch& b = s.task_weights_ ? rows.weighted : batch;
    // Gradient accumulation as op by op: the batch in micro-batches (a fixed split, so a graph
    // holds the loop), each part's gradients and metrics weighed by its share of the batch,
    // one optimizer step on their sum.
    const auto parts = ctx.micro_batches(b.obs.size(0));
    const bool whole = parts.size() == 1;
    at::Tensor critic_grad, actor_grad, alpha_grad;
    std::vector<at::Tensor> m, td_parts;  // the metrics' share-weighted sums
    auto add = [&](std::size_t k, const at::Tensor& value, const MicroBatch& part) {
      if (m.size() <= k) m.push_back(whole ? value : value * part.share);
      else m[k] = m[k] + value * part.share;
    };
    for (const auto& part : parts) {
      auto rows_of_part = [&](const at::Tensor& t) { return whole || !t.defined() ? t : t.narrow(0, part.begin, part.rows); };
      ReplayBatch split;
      const ReplayBatch& mb = whole ? b : (split = rows_of(b, part.begin, part.rows));
      const SacAlpha part_alpha{0.0, per_task ? rows_of_part(alpha.row) : alpha.row};
      auto c = autograd_critic(s.actor_, s.critic_, s.critic_target_, s.critic_opt_, *cfg.gamma, mb, part_alpha,
                               rows_of_part(noise.next), ctx);
      accumulate(critic_grad, c.grad, part);
      add(0, c.loss_t, part);
      add(1, c.q_mean_t, part);
      td_parts.push_back(whole ? c.td : c.td.clone());
      if (!actor_step) continue;
      auto a = autograd_actor(s.actor_, s.critic_, s.actor_opt_, mb, part_alpha, rows_of_part(noise.obs), ctx,
                              rows_of_part(rows.task_w));
      if (cfg.auto_alpha) {
        if (per_task) {
          const auto task = rows_of_part(batch.task);
          const auto t = task_temperatures(s.log_alpha_, s.target_entropy_t_, a.log_prob, task);
          a.alpha_grad = t.grad;
          a.alpha_loss_t = t.loss_sum / static_cast<double>(task.size(0));
        } else {
          autograd_temperature(a, s.log_alpha_, s.alpha_opt_, s.target_entropy_[0], ctx);
        }
        accumulate(alpha_grad, a.alpha_grad, part);
      }
      accumulate(actor_grad, a.grad, part);
      add(2, a.loss_t, part);
      add(3, a.entropy_t, part);
      if (cfg.auto_alpha) add(4, a.alpha_loss_t, part);
    }
    std::vector<StepContext::Step> steps{{&s.critic_opt_, critic_grad, cfg.max_grad_norm}};
    if (actor_step) {
      steps.push_back({&s.actor_opt_, actor_grad, cfg.max_grad_norm});
      if (cfg.auto_alpha) steps.push_back({&s.alpha_opt_, alpha_grad, 0.0});
    }
    ctx.apply(std::move(steps));
    // The temperatures after the update: their mean ("alpha"), then each task's.
    const auto alphas = s.log_alpha_.detach().exp();
    m.push_back(alphas.mean());
    if (per_task)
      for (std::int64_t k = 0; k < s.alphas_; ++k) m.push_back(alphas[k]);
    if (target_step) {
      torch::NoGradGuard no_grad;
      polyak(s.target_.flat(), s.critic_opt_.parameters().flat(), *cfg.tau);
    }
    for (auto& t : m) t = t.detach().reshape({}).to(at::kDouble);
    return {whole ? td_parts[0] : at::cat(td_parts), at::stack(m)};
  }

  template <class S>
  static std::vector<std::string> metric_names(const S& s, bool actor_step) {
    std::vector<std::string> n{"critic_loss", "q_mean"};
    if (actor_step) {
      n.insert(n.end(), {"actor_loss", "entropy"});
      if (s.cfg_.auto_alpha) n.emplace_back("alpha_loss");
    }
    n.emplace_back("alpha");
    if (s.alphas_ > 1)
      for (const auto& task : s.task_names_) n.push_back("alpha/" + task);
    return n;
  }

  // The host's part of a captured update, after its device work: counts the optimizer
  // steps it took and the update, and reads its metrics (one copy to the host, which waits
  // for the device) and TD errors.
  template <class S>
  static UpdateInfo finish(S& s, bool actor_step, StepContext& ctx, const std::vector<std::string>& names,
                           const at::Tensor& metrics, const at::Tensor& td) {
    s.critic_opt_.count_step();
    int steps = 1;
    if (actor_step) {
      s.actor_opt_.count_step();
      ++steps;
      if (s.cfg_.auto_alpha) {
        s.alpha_opt_.count_step();
        ++steps;
      }
    }
    ctx.count_steps(steps);
    ++s.updates_;
    UpdateInfo info;
    const auto values = metrics.to(at::kCPU);
    const double* v = values.data_ptr<double>();
    for (std::size_t i = 0; i < names.size(); ++i) info.metrics.emplace_back(names[i], v[i]);
    info.td_error = td.clone();
    return info;
  }
};

}  // namespace anvil::detail
