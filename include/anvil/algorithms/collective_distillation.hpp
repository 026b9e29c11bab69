#pragma once
/// @file
/// `CollectiveDistillation`: trains the collective network (nn/collective_transformer.hpp)
/// on a collective dataset of SAC worker experts' labelled transitions
/// (buffers/collective_dataset.hpp), offline; the clock counts gradient steps.
///
/// Losses, per target row (averaged over the batch):
///   actor  = |tanh(mean) - tanh(mean_expert)|^2 + log_std_weight |log_std - log_std_expert|^2
///   critic = critic_weight (|Q1 - q_target|^2 + |Q2 - q_target|^2) / 2
/// (squared errors summed over action dims). A regression on the Gaussian's parameters
/// rather than a KL: the KL from the expert's Gaussian weighs the mean's error by
/// 1 / sigma_expert^2, and converged SAC experts are near-deterministic (sigma down to
/// e^-5 at the bounds), so a few confident dimensions would dominate the loss and its
/// gradient scale; the regression is scale-stable, learns the mean (what the policy runs)
/// first, and still learns the spread the student's shaping reads (its likelihood). The
/// mean is compared after tanh, as the action it stands for (`squashed_mean`, default): a
/// quarter of the manipulation experts' pre-tanh means lie beyond +-2, where tanh is flat,
/// and a pre-tanh error there changes nothing the policy does yet dominates the squared error.
///
/// One AdamW over the whole network; BF16/FP16 through the precision policy, gradient
/// accumulation, `train.ema_decay` and `DDP<N>` as every algorithm. On a GPU the update is
/// captured as a CUDA graph (`distill.cuda_graph`): the transformer's forward and backward
/// passes, the losses, clipping and the AdamW step in one launch, the losses read back in one
/// copy (op by op too). Acting needs the env
/// seen through `envs::History<E>` (the history tokens, their mask, the state), as the
/// dataset's windows are: the collective infers the task from the history.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/collective_transformer.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/algorithms/policy.hpp>

namespace anvil {

struct OfflineLoop;  // train/loops/offline.hpp (a layer above; the Trainer includes it)

namespace collective {
/// Splits an observation of `envs::History` [N, H * (od + ad + 1) + H + sd] into tokens
/// [N, H, od + ad + 1], mask [N, H] and state [N, od] (the first od of the sd state numbers).
struct HistoryView {
  at::Tensor tokens, mask, state;
};
inline HistoryView split_history(const at::Tensor& obs, std::int64_t h, std::int64_t od, std::int64_t ad, const std::string& env) {
  const std::int64_t td = od + ad + 1, n = obs.size(0), width = obs.size(1);
  const std::int64_t sd = width - h * td - h;
  if (sd < od)
    throw ConfigError("collective: " + env + "'s observation has " + std::to_string(width) + " numbers; a history of " + std::to_string(h) +
                      " tokens of " + std::to_string(td) + " and a state of " + std::to_string(od) +
                      " need at least " + std::to_string(h * td + h + od) + " (wrap the env in envs::History with the dataset's state size)");
  return {obs.narrow(1, 0, h * td).view({n, h, td}), obs.narrow(1, h * td, h), obs.narrow(1, h * td + h, od)};
}
}  // namespace collective

class CollectiveDistillation {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "distill";
  static constexpr bool on_policy = false;
  using Batch = CollectiveBatch;
  using loop = OfflineLoop;

  struct Config {
    Param<std::int64_t, "batch_size", "target rows (windows) per gradient step, per rank", at_least(1)> batch_size{2048};
    Param<int, "history", "history tokens before each target row (H)", in_range(1, 256)> history{8};
    Param<std::int64_t, "obs_dim", "state size of the dataset (the first obs_dim numbers of the env's state; 0: all)", at_least(0)> obs_dim{0};
    Param<double, "lr", "AdamW learning rate", positive> lr{3e-4};
    Param<double, "weight_decay", "AdamW decoupled weight decay", at_least(0)> weight_decay{0.0};
    Param<bool, "squashed_mean", "regress tanh(mean), the mean action, rather than the pre-tanh mean (see the file comment)"> squashed_mean{true};
    Param<double, "log_std_weight", "weight of the log-std regression in the actor loss", at_least(0)> log_std_weight{0.1};
    Param<double, "critic_weight", "weight of the Q regression", at_least(0)> critic_weight{1.0};
    Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)> max_grad_norm{1.0};
    Param<bool, "cuda_graph",
          "on CUDA, capture the update as a CUDA graph and replay it: one launch instead of the transformer's "
          "hundreds of dispatched ops (one process, or DDP with parallel.capture_all_reduce; FP16's loss scaler and "
          "gradient accumulation's micro-batches included; false: op by op)">
        cuda_graph{true};
    Section<"net", nn::CollectiveTransformerImpl::Config> net;

    /// A run of seconds (`run.smoke`): small batches.
    void shrink() { batch_size = std::min<std::int64_t>(batch_size, 64); }
  };

  CollectiveDistillation(const EnvSpec& spec, const Config& cfg, const RunContext& ctx) : cfg_(cfg), device_(ctx.device), env_(spec.name) {
    if (spec.discrete()) throw ConfigError("CollectiveDistillation: " + spec.name + " has discrete actions; it needs a Box");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than distill.batch_size (" +
                        std::to_string(*cfg.batch_size) + "): micro-batches would be empty");
    ad_ = spec.action_dim();
    const std::int64_t h = cfg.history, width = spec.obs_dim();
    // The env's observation is [H tokens of (od + ad + 1) | H mask | sd state], sd >= od.
    od_ = cfg.obs_dim > 0 ? *cfg.obs_dim : (width - h - h * (ad_ + 1)) / (h + 1);
    if (od_ < 1 || (*cfg.obs_dim == 0 && h * (od_ + ad_ + 1) + h + od_ != width))
      throw ConfigError("distill.history: " + spec.name + "'s observation (" + std::to_string(width) + " numbers) is not a history of " +
                        std::to_string(h) + " tokens and a state (wrap the env in envs::History with distill.history tokens; with a state "
                        "longer than the dataset's, set distill.obs_dim)");
    net_ = nn::CollectiveTransformer(od_, ad_, h, *cfg.net);
    net_->to(device_);
    opt_ = FlatAdam(net_->parameters(), {.lr = cfg.lr * ctx.lr_scale(cfg.batch_size), .weight_decay = cfg.weight_decay});
    ema_.set_device(device_);
  }

  /// Maps the dataset's state ranges onto [-1, 1] for the network (a constant dimension is
  /// only shifted); the offline loop calls it once, before the first update, with the
  /// dataset's ranges (a restored run keeps its checkpoint's).
  void fit_normalizer(const at::Tensor& obs_min, const at::Tensor& obs_max, const at::Tensor& /*act_min*/, const at::Tensor& /*act_max*/) {
    if (obs_min.numel() != od_)
      throw ConfigError("distill: the dataset's states have " + std::to_string(obs_min.numel()) + " numbers; this collective reads " +
                        std::to_string(od_) + " (distill.obs_dim)");
    const auto lo = obs_min.to(at::kFloat), hi = obs_max.to(at::kFloat);
    const auto half = (hi - lo) * 0.5;
    net_->set_normalizer(((hi + lo) * 0.5).to(device_), at::where(half > 1e-6, 1.0 / half.clamp_min(1e-6), at::ones_like(half)).to(device_));
    normalised_ = true;
    graphs_.clear();  // they read the old normalisation's tensors
  }
  [[nodiscard]] bool has_normalizer() const noexcept { return normalised_; }

  /// Windows of H + 1 rows: H history tokens and the target.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> sequence() const noexcept { return {*cfg_.history + 1, 1}; }

  /// Actions in [-1, 1] for observations of `envs::History` (tanh of the mean, or sampled).
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    const auto v = collective::split_history(obs.to(device_, at::kFloat), cfg_.history, od_, ad_, env_);
    const auto rep = net_->represent(v.tokens, v.mask);
    auto [mean, log_std] = net_->policy(rep, v.state);
    if (mode == ActMode::deterministic) return mean.to(at::kFloat).tanh();
    return (mean.to(at::kFloat) + at::randn_like(mean, at::kFloat) * log_std.to(at::kFloat).exp()).tanh();
  }

  /// One optimizer step (micro-batches with gradient accumulation). On a GPU, with
  /// `cuda_graph` on and an update a graph can hold (one process), each batch size's update
  /// is replayed from a CUDA graph.
  UpdateInfo update(const CollectiveBatch& b, StepContext& ctx) {
    if (cuda::kCudaGraphs && cfg_.cuda_graph && device_.is_cuda() && ctx.graphable(/*loops_micro_batches=*/true))
      return graphed_update(b, ctx);
    return finish(device_update(b, ctx), /*replayed=*/false, ctx);
  }

  /// The update as a CUDA graph holds it, run op by op on any device (what a replay computes
  /// on CUDA, for tests on the CPU): the AdamW step reads its step count and learning rate
  /// from tensors, and nothing is read back until the losses at the end. Refused by name
  /// where a graph could not hold the update.
  UpdateInfo update_as_captured(const CollectiveBatch& b, StepContext& ctx) {
    if (const auto why = why_not_captured(cfg_.cuda_graph, config_section.view(), ctx); !why.empty())
      throw Error("distill: this update cannot be captured: " + why);
    opt_.sync_device_state();
    at::Tensor losses;
    {
      const StepContext::Capture capture(ctx);
      losses = device_update(b, ctx);
    }
    return finish(losses, /*replayed=*/true, ctx);
  }

  /// What the run header says of CUDA graphs (trainer_parts.hpp's `cuda_graph_note`).
  [[nodiscard]] std::string cuda_graph_note(const StepContext& ctx) const {
    const auto why = why_not_captured(cfg_.cuda_graph, config_section.view(), ctx);
    if (!why.empty()) return "distill's update runs op by op: " + why + "; acting runs op by op";
    return "distill's update is captured (a graph per batch size, after " + std::to_string(GraphedUpdate::kWarmups) +
           " warm-ups op by op each); acting runs op by op";
  }
  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }

  /// The loss of a batch (see file comment) and its parts as float64 [4] on the device (the
  /// loss, the mean's, the log-std's and the Q's squared errors), detached.
  std::pair<at::Tensor, at::Tensor> loss(const CollectiveBatch& b, StepContext& ctx) {
    const auto dev = [&](const at::Tensor& t) { return t.to(device_, at::kFloat); };
    const auto tokens = dev(b.tokens), mask = dev(b.mask), obs = dev(b.obs), action = dev(b.action);
    at::Tensor total, lm, ls, lq;
    {
      auto guard = ctx.autocast();
      const auto rep = net_->represent(tokens, mask);
      auto [mean, log_std] = net_->policy(rep, obs);
      auto [q1, q2] = net_->q(rep, obs, action);
      lm = cfg_.squashed_mean ? (mean.to(at::kFloat).tanh() - dev(b.mean).tanh()).square().sum(-1).mean()
                              : (mean.to(at::kFloat) - dev(b.mean)).square().sum(-1).mean();
      ls = (log_std.to(at::kFloat) - dev(b.log_std)).square().sum(-1).mean();
      const auto y = dev(b.q_target);
      lq = 0.5 * ((q1.to(at::kFloat) - y).square().mean() + (q2.to(at::kFloat) - y).square().mean());
      total = lm + *cfg_.log_std_weight * ls + *cfg_.critic_weight * lq;
    }
    torch::NoGradGuard no_grad;
    return {total, at::stack({total, lm, ls, lq}).detach().to(at::kDouble)};
  }

  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  /// Unused (the Q-targets are the experts'); the offline loop asks every algorithm for one.
  [[nodiscard]] double discount() const noexcept { return 0.99; }

  void ema_update(double decay) { ema_.update(opt_.parameters().flat(), decay); }
  /// The averaged weights (flat); undefined until the first `ema_update`.
  [[nodiscard]] const at::Tensor& ema_weights() const noexcept { return ema_.weights(); }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"collective", opt_.lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const { return {{"collective", opt_.parameters().flat()}}; }

  /// The collective alone (`load_collective` reads it back): its shape, config and weights
  /// (the averaged ones when there are any). The Trainer writes it as policy.bin.
  void save_policy(BinaryWriter& w) const {
    w.string("CollectiveTransformer");
    w.value(od_);
    w.value(ad_);
    w.value(static_cast<std::int64_t>(*cfg_.history));
    const auto& c = *cfg_.net;
    for (int v : {*c.d_model, *c.heads, *c.layers, *c.feedforward}) w.value(v);
    w.value(static_cast<std::uint64_t>(c.hidden->size()));
    for (int v : *c.hidden) w.value(v);
    w.value(static_cast<int>(*c.activation));
    w.value(*c.log_std_min);
    w.value(*c.log_std_max);
    write_tensor(w, ema_.defined() ? ema_.weights() : opt_.parameters().flat(), "the collective's weights");
    write_tensor(w, net_->obs_shift(), "the collective's state shift");
    write_tensor(w, net_->obs_scale(), "the collective's state scale");
  }

  /// The collective for policy.safetensors (`ExportsTensors`): the transformer as `net.*`
  /// (its policy and Q heads included) and its state normalisation (`norm.obs_shift`,
  /// `norm.obs_scale`); the metadata holds its shape.
  [[nodiscard]] PolicyTensors policy_tensors() const {
    PolicyTensors p{"CollectiveTransformer", {}, {}, false};
    add_module_tensors(p, "net.", *net_);
    if (net_->obs_shift().defined()) {  // the state normalisation, once fitted to the data
      p.tensors.emplace_back("norm.obs_shift", net_->obs_shift().detach().to(at::kCPU, at::kFloat).clone());
      p.tensors.emplace_back("norm.obs_scale", net_->obs_scale().detach().to(at::kCPU, at::kFloat).clone());
    }
    const auto& c = *cfg_.net;
    p.meta = {{"obs_dim", std::to_string(od_)},
              {"action_dim", std::to_string(ad_)},
              {"history", std::to_string(*cfg_.history)},
              {"d_model", std::to_string(*c.d_model)},
              {"heads", std::to_string(*c.heads)},
              {"layers", std::to_string(*c.layers)},
              {"feedforward", std::to_string(*c.feedforward)},
              {"hidden", comma_list(*c.hidden)},
              {"activation", enum_text(*c.activation)},
              {"log_std_min", exact_text(*c.log_std_min)},
              {"log_std_max", exact_text(*c.log_std_max)}};
    return p;
  }

  /// State protocol: the network with its AdamW state, the update count, the average.
  struct Saved {
    FlatAdam::Saved opt;
    std::int64_t updates = 0;
    Ema::Saved ema;
    bool normalised = false;
    at::Tensor shift, scale;
  };
  void save(BinaryWriter& w) const {
    opt_.save(w);
    w.value(updates_);
    ema_.save(w);
    w.value(normalised_);
    write_tensor(w, net_->obs_shift(), "the collective's state shift");
    write_tensor(w, net_->obs_scale(), "the collective's state scale");
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.opt = opt_.read(r, "collective network");
    s.updates = r.value<std::int64_t>("collective update count");
    s.ema = ema_.read(r, "collective averaged parameters", opt_.parameters().flat());
    s.normalised = r.value<bool>("collective normalisation flag");
    s.shift = read_tensor(r, "collective state shift", net_->obs_shift());
    s.scale = read_tensor(r, "collective state scale", net_->obs_scale());
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
    normalised_ = s.normalised;
    net_->set_normalizer(s.shift.to(device_), s.scale.to(device_));
    graphs_.clear();  // captured again from the restored state
  }

  /// Sets the network's weights (flat, in the order of its parameters), e.g. a saved collective's.
  void set_weights(const at::Tensor& flat) {
    torch::NoGradGuard no_grad;
    opt_.parameters().flat().copy_(flat.to(device_));
  }
  [[nodiscard]] nn::CollectiveTransformer& network() noexcept { return net_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return od_; }

 private:
  // The update's device work with no host read (what a graph captures): the batch in
  // micro-batches (a fixed split for a batch size), each part's gradient and losses weighed
  // by its share, one clipped AdamW step on their sum. Returns the losses (float64 [4]).
  at::Tensor device_update(const CollectiveBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    const bool whole = parts.size() == 1;
    at::Tensor grad, sum;
    for (const auto& part : parts) {
      CollectiveBatch rows;
      const CollectiveBatch& mb = whole ? b : (rows = rows_of(b, part.begin, part.rows));
      auto [total, losses] = loss(mb, ctx);
      accumulate(grad, ctx.gradient(total, opt_), part);
      sum = whole ? losses : (sum.defined() ? sum + losses * part.share : losses * part.share);
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    return sum;
  }

  // The host's part after the device work: the step counted where a graph took it (or its
  // arithmetic, `update_as_captured`), the update counted, the losses read back in one copy.
  UpdateInfo finish(const at::Tensor& losses, bool replayed, StepContext& ctx) {
    if (replayed) {
      opt_.count_step();
      ctx.count_steps(1);
    }
    ++updates_;
    const auto h = losses.to(at::kCPU).contiguous();
    const double* v = h.data_ptr<double>();
    UpdateInfo info;
    info.metrics = {{"loss", v[0]}, {"mean_mse", v[1]}, {"log_std_mse", v[2]}, {"q_mse", v[3]}};
    return info;
  }

  // The update from a CUDA graph (optim/graphed_update.hpp), one per batch size: warmed up
  // op by op, captured, then replayed. The batch may be on the host (the loader's): the
  // graph's fixed inputs are float32 on the device, and the replay's copy moves it there.
  UpdateInfo graphed_update(const CollectiveBatch& b, StepContext& ctx) {
    auto& g = graphs_.of(b.obs.size(0), device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = finish(device_update(b, ctx), /*replayed=*/false, ctx); });
      return info;
    }
    const std::vector<at::Tensor> values{b.tokens, b.mask, b.obs, b.action, b.mean, b.log_std, b.q_target};
    opt_.sync_device_state();
    if (!g.update.captured()) {
      auto& u = g.update;
      const auto on_device = at::TensorOptions().device(device_).dtype(at::kFloat);
      auto in = [&](const at::Tensor& t) { return u.input(t.sizes(), on_device); };
      const CollectiveBatch fixed{in(b.tokens), in(b.mask),    in(b.obs),      in(b.action),
                                  in(b.mean),   in(b.log_std), in(b.q_target), {}};
      u.capture(ctx, config_section.view(), [&] { g.out = device_update(fixed, ctx); });
    }
    graphs_.replay(g, values);
    return finish(g.out, /*replayed=*/true, ctx);
  }

  Config cfg_;
  c10::Device device_;
  std::string env_;
  std::int64_t od_ = 0, ad_ = 0;
  nn::CollectiveTransformer net_{nullptr};
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  Ema ema_;
  bool normalised_ = false;
  GraphedUpdates<at::Tensor> graphs_;  // CUDA graphs of the update by batch rows; their output is the losses
};

static_assert(Algorithm<CollectiveDistillation>);

/// Reads a collective written by `CollectiveDistillation::save_policy` (a distillation run's
/// policy.bin): the network, on `device`, with its weights. An Error naming the file when
/// it is not one.
inline nn::CollectiveTransformer load_collective(const std::filesystem::path& file, c10::Device device = c10::kCPU) {
  BinaryReader r(file, kPolicyFormat);
  (void)r.string("env name");
  if (const auto kind = r.string("policy kind"); kind != "CollectiveTransformer")
    r.fail("policy kind", "is '" + kind + "', not a collective (CollectiveTransformer) from a distillation run");
  const auto od = r.value<std::int64_t>("obs_dim"), ad = r.value<std::int64_t>("act_dim"), h = r.value<std::int64_t>("history");
  nn::CollectiveTransformerImpl::Config c;
  c.d_model = r.value<int>("d_model");
  c.heads = r.value<int>("heads");
  c.layers = r.value<int>("layers");
  c.feedforward = r.value<int>("feedforward");
  const auto n = r.value<std::uint64_t>("hidden layers");
  if (n > 64) r.fail("hidden layers", "is " + std::to_string(n));
  std::vector<int> hidden;
  for (std::uint64_t i = 0; i < n; ++i) hidden.push_back(r.value<int>("hidden width"));
  c.hidden = hidden;
  c.activation = static_cast<nn::Activation>(r.value<int>("activation"));
  c.log_std_min = r.value<double>("log_std_min");
  c.log_std_max = r.value<double>("log_std_max");
  nn::CollectiveTransformer net(od, ad, h, c);
  net->to(device);
  FlatParameters flat(net->parameters());
  const auto w = read_tensor(r, "the collective's weights", flat.flat());
  {
    torch::NoGradGuard no_grad;
    flat.flat().copy_(w.to(device));
  }
  const auto shift = read_tensor(r, "the collective's state shift", net->obs_shift());
  const auto scale = read_tensor(r, "the collective's state scale", net->obs_scale());
  net->set_normalizer(shift.to(device), scale.to(device));
  return net;
}

}  // namespace anvil
