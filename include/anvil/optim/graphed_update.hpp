#pragma once
/// @file
/// `GraphedUpdate`: an algorithm's update as a CUDA graph (core/cuda_graph.hpp). The first
/// `kWarmups` updates run op by op on the graph's stream; the next is captured through the
/// step context (optimizer steps read their step count and learning rate from the device,
/// nothing is timed) and then every update copies its inputs into fixed tensors and replays.
/// The algorithm keeps what is its own: which updates a graph can hold, its inputs and
/// outputs, and reading no host value while capturing. `GraphedUpdates` keeps an
/// algorithm's graphs, one per shape of update. Compiled in every build; without
/// `ANVIL_WITH_CUDA` nothing is ever captured (`cuda::kCudaGraphs` is false).

#include <ATen/autocast_mode.h>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/cuda_graph.hpp>
#include <anvil/core/error.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

/// Why an algorithm's update cannot be captured through `ctx`, "" where neither its switch
/// nor the context stands in the way: "off (<who>.cuda_graph=false)" with its switch `on`
/// off (`who`: its config section), else the context's reason (DDP, a loss scaler on the
/// host; gradient accumulation's micro-batches are looped over inside a graph).
inline std::string why_not_captured(bool on, std::string_view who, const StepContext& ctx) {
  if (!on) return "off (" + std::string(who) + ".cuda_graph=false)";
  return ctx.why_not_graphable(/*loops_micro_batches=*/true);
}

/// One captured form of an update (see file comment).
class GraphedUpdate {
 public:
  static constexpr int kWarmups = 2;

  explicit GraphedUpdate(c10::Device d) : graph_(d) {}

  /// Whether the next update is a warm-up (run it op by op through `warm_up`).
  [[nodiscard]] bool warming() const noexcept { return warmups_ < kWarmups; }
  [[nodiscard]] bool captured() const noexcept { return graph_.captured(); }

  /// Runs one update op by op on the graph's stream.
  template <class F>
  void warm_up(F&& f) {
    ++warmups_;
    graph_.warm_up(std::forward<F>(f));
  }

  /// A fixed tensor shaped like `t` (undefined for an undefined `t`): an input of the
  /// capture, filled by each `replay` from the value in its place.
  at::Tensor input(const at::Tensor& t) {
    inputs_.push_back(t.defined() ? at::empty(t.sizes(), t.options()) : t);
    return inputs_.back();
  }
  /// A fixed input of `sizes` with `options` (e.g. on the device for a value given on the
  /// host: the replay's copy moves and converts it).
  at::Tensor input(at::IntArrayRef sizes, const at::TensorOptions& options) {
    inputs_.push_back(at::empty(sizes, options));
    return inputs_.back();
  }

  /// Captures `f` (the update's device work, on the `input` tensors) through `ctx`, with
  /// autocast's cache off (cached casts would outlive the capture). A failure names `who`
  /// (the config section) and its `cuda_graph` switch.
  template <class F>
  void capture(StepContext& ctx, std::string_view who, F&& f) {
    const StepContext::Capture capturing(ctx);
    capture(who, "the update", std::forward<F>(f));
  }
  /// Captures `f`, device work that steps no optimizer (acting: `what` names it in a failure).
  template <class F>
  void capture(std::string_view who, std::string_view what, F&& f) {
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      graph_.capture(std::forward<F>(f));
    } catch (const std::exception& e) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw Error(std::string(who) + ": capturing " + std::string(what) + " as a CUDA graph failed (" + e.what() +
                  "); run with " + std::string(who) + ".cuda_graph=false");
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }

  /// Copies `values` (one per `input`, in the same order; undefined where the input is)
  /// into the fixed inputs, then replays the update on the current stream.
  void replay(const std::vector<at::Tensor>& values) {
    if (values.size() != inputs_.size())
      throw Error("GraphedUpdate::replay: " + std::to_string(values.size()) + " values for " +
                  std::to_string(inputs_.size()) + " inputs");
    for (std::size_t i = 0; i < values.size(); ++i)
      if (inputs_[i].defined()) inputs_[i].copy_(values[i], /*non_blocking=*/true);
    graph_.replay();
  }

 private:
  cuda::Graph graph_;
  int warmups_ = 0;
  std::vector<at::Tensor> inputs_;
};

/// An algorithm's captured updates, one per shape (a key the algorithm makes of what
/// changes the captured work: batch rows, which optimizers step, which inputs are given),
/// each with `Out`, the fixed output tensors its capture left (valid until its next replay).
template <class Out>
class GraphedUpdates {
 public:
  struct Graphed {
    explicit Graphed(c10::Device d) : update(d) {}
    GraphedUpdate update;
    Out out;
  };

  /// The graph for updates of shape `key` on `device` (made, uncaptured, on first use).
  Graphed& of(std::int64_t key, c10::Device device) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, std::make_unique<Graphed>(device)).first;
    return *it->second;
  }
  /// Replays `g` on `values` (see `GraphedUpdate::replay`) and counts it.
  void replay(Graphed& g, const std::vector<at::Tensor>& values) {
    g.update.replay(values);
    ++replays_;
  }
  /// Updates replayed so far (0 without CUDA graphs).
  [[nodiscard]] std::int64_t replays() const noexcept { return replays_; }
  /// Drops every graph (after a restore: captured again from the restored state, warm-ups
  /// first); the count stays.
  void clear() noexcept { graphs_.clear(); }

 private:
  std::map<std::int64_t, std::unique_ptr<Graphed>> graphs_;
  std::int64_t replays_ = 0;
};

}  // namespace anvil
