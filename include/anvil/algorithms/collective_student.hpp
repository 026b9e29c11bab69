#pragma once
/// @file
/// `CollectiveStudent`: the student of collective distillation, an online SAC whose reward
/// is shaped by the collective policy's likelihood of the student's own action:
///
///     r' = r + w(t) max(log pi_collective(a given history, s), shaping.min_log_prob)
///
/// with w(t) = shaping.weight for the run's first shaping.warmup env steps, then falling
/// linearly to 0 over the next shaping.decay env steps (and 0 after). Where the shaping is
/// added (`shaping.at`):
/// - `update` (the default): the replay holds the env's rewards and each update adds the
///   shaping to its batch with the weight of now, so every transition sampled carries the
///   same weight and none keeps a stale one once it has decayed (the log-likelihood is
///   recomputed from the stored History observation; the collective is frozen, so it is the
///   value it had when the step was stored). A forward pass of the collective per batch.
/// - `store`: the off-policy loop asks for the shaped rewards of every step before storing
///   it (`shaped_rewards`), so the replay holds each step's shaping at its own weight (the
///   pipeline our users run). With the weight decaying, the critic then learns from rewards
///   that disagree with each other (docs/benchmarks/learning.md, issue 23).
/// Episode returns and evaluations stay the env's own either way.
///
/// The env is seen through `envs::History<E>` (the collective needs the history); the SAC's
/// networks read only the state part of the observation. The collective comes from a
/// distillation run's policy.bin (`shaping.collective`), frozen; with `Staged<OfflineLoop,
/// OffPolicyLoop>` and `CollectiveReplay` it is distilled in the first stage
/// (`update(CollectiveBatch)`) and shapes the second.

#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <limits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/algorithms/collective_distillation.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>

namespace anvil {

/// Where the student's shaping enters (see the file comment).
enum class ShapeAt { update, store };
constexpr auto enum_names(ShapeAt) { return std::array<std::string_view, 2>{"update", "store"}; }

class CollectiveStudent {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "student";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;

  struct Shaping {
    Param<std::string, "collective", "the collective's policy.bin (a distillation run's; empty: the first stage of a staged run trains it)">
        collective{""};
    Param<double, "weight", "the shaping term's weight during the warm-up", at_least(0)> weight{0.2};
    Param<std::int64_t, "warmup", "env steps of the run at full weight", at_least(0)> warmup{10'000};
    Param<std::int64_t, "decay", "env steps over which the weight then falls linearly to 0", at_least(0)> decay{20'000};
    Param<double, "min_log_prob", "the log-likelihood is clipped from below at this", in_range(-1e6, 0)> min_log_prob{-10.0};
    Param<ShapeAt, "at", "update: each batch shaped with the weight of now; store: each step shaped as it is stored, at its weight then">
        at{ShapeAt::update};
  };
  struct Config {
    Section<"shaping", Shaping> shaping;
    Section<"sac", SAC::Config> sac;
    Section<"distill", CollectiveDistillation::Config> distill;

    /// A run of seconds (`run.smoke`): the collective's smoke size.
    void shrink() { distill->shrink(); }
  };

  CollectiveStudent(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), env_(spec.name), distill_(spec, *cfg.distill, ctx), sac_(state_spec(spec, distill_.obs_dim()), *cfg.sac, ctx) {
    od_ = distill_.obs_dim();
    ad_ = spec.action_dim();
    h_ = cfg.distill->history;
    if (!cfg.shaping->collective->empty()) load(*cfg.shaping->collective);
  }

  /// Replaces the collective with the one in `file` (a distillation run's policy.bin); its
  /// shape must be this config's (distill.history, distill.net).
  void load(const std::filesystem::path& file) {
    auto net = load_collective(file, device_);
    FlatParameters src(net->parameters());
    const auto& dst = distill_.optimizer().parameters().flat();
    if (net->history() != h_ || net->obs_dim() != od_ || net->act_dim() != ad_ || src.numel() != dst.numel())
      throw ConfigError("student.shaping.collective: " + file.string() + " holds a collective of history " + std::to_string(net->history()) +
                        ", state " + std::to_string(net->obs_dim()) + ", action " + std::to_string(net->act_dim()) + " and " +
                        std::to_string(src.numel()) + " weights; this student's (student.distill.*) has history " + std::to_string(h_) +
                        ", state " + std::to_string(od_) + ", action " + std::to_string(ad_) + " and " + std::to_string(dst.numel()));
    distill_.set_weights(src.flat());
    distill_.network()->set_normalizer(net->obs_shift(), net->obs_scale());
  }

  /// The shaping weight after `env_steps` env steps of the run.
  [[nodiscard]] double weight(std::int64_t env_steps) const noexcept {
    const auto& s = *cfg_.shaping;
    if (env_steps < s.warmup) return s.weight;
    if (*s.decay == 0) return 0.0;
    const double f = 1.0 - static_cast<double>(env_steps - s.warmup) / static_cast<double>(*s.decay);
    return s.weight * std::max(0.0, f);
  }

  /// The log-likelihood [N] of actions [N, ad] in [-1, 1] under the collective at
  /// observations of envs::History [N, ...].
  at::Tensor collective_log_prob(const at::Tensor& obs, const at::Tensor& action) {
    torch::NoGradGuard no_grad;
    auto& net = distill_.network();
    const auto v = collective::split_history(obs.to(device_, at::kFloat), h_, od_, ad_, env_);
    const auto rep = net->represent(v.tokens, v.mask);
    auto [mean, log_std] = net->policy(rep, v.state);
    return nn::CollectiveTransformerImpl::log_prob(mean, log_std, action.to(device_, at::kFloat));
  }

  /// The rewards to store for step `s` (the loop's hook; see file comment): shaped when
  /// shaping.at is `store`, the env's own when it is `update`. Either way it records the run's
  /// env steps, whose weight the next updates use.
  at::Tensor shaped_rewards(const StepBatch& s, std::int64_t env_steps) {
    const double w = weight(env_steps);
    last_weight_ = w;
    if (w == 0.0 || *cfg_.shaping->at == ShapeAt::update) return s.reward;
    return shape(s.reward, s.obs, s.action, w);
  }

  /// The rewards an update learns from for replay batch `b`: shaped with the weight of the
  /// last step stored when shaping.at is `update`, as stored when it is `store`. (With a
  /// buffer's n_step above 1 an update-time shaping shapes each return's first step only.)
  at::Tensor update_rewards(const ReplayBatch& b) {
    if (*cfg_.shaping->at == ShapeAt::store || last_weight_ == 0.0) return b.reward;
    return shape(b.reward, b.obs, b.action, last_weight_);
  }

  at::Tensor act(const at::Tensor& obs, ActMode mode) { return sac_.act(state_of(obs), mode); }

  /// A SAC update on the state part of a replay batch, its rewards shaped now with the
  /// current weight when shaping.at is `update` (already shaped when it is `store`).
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    ReplayBatch s = b;
    s.reward = update_rewards(b);
    s.obs = state_of(b.obs);
    s.next_obs = state_of(b.next_obs);
    auto info = sac_.update(s, ctx);
    info.metrics.emplace_back("shaping_weight", last_weight_);
    return info;
  }
  /// The collective's state normaliser (the distillation stage fits it to its dataset).
  void fit_normalizer(const at::Tensor& lo, const at::Tensor& hi, const at::Tensor& a, const at::Tensor& b) { distill_.fit_normalizer(lo, hi, a, b); }
  [[nodiscard]] bool has_normalizer() const noexcept { return distill_.has_normalizer() || !cfg_.shaping->collective->empty(); }
  /// A distillation update of the collective (the first stage of a staged run).
  UpdateInfo update(const CollectiveBatch& b, StepContext& ctx) { return distill_.update(b, ctx); }

  [[nodiscard]] std::int64_t batch_size() const noexcept { return sac_.batch_size(); }
  /// Windows for the distillation stage.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> sequence() const noexcept { return distill_.sequence(); }
  [[nodiscard]] std::int64_t dataset_batch_size() const noexcept { return distill_.batch_size(); }
  [[nodiscard]] double discount() const noexcept { return sac_.discount(); }
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    auto v = sac_.learning_rates();
    v.emplace_back("collective", distill_.optimizer().lr());
    return v;
  }

  /// State protocol: the SAC, the collective (and its optimizer), the last weight.
  struct Saved {
    SAC::Saved sac;
    CollectiveDistillation::Saved distill;
  };
  void save(BinaryWriter& w) const {
    sac_.save(w);
    distill_.save(w);
  }
  [[nodiscard]] Saved read(BinaryReader& r) const { return {sac_.read(r), distill_.read(r)}; }
  void restore(const Saved& s) {
    sac_.restore(s.sac);
    distill_.restore(s.distill);
  }

  [[nodiscard]] SAC& sac() noexcept { return sac_; }
  [[nodiscard]] CollectiveDistillation& collective() noexcept { return distill_; }

 private:
  // The SAC's spec: the state part of the History observation.
  static EnvSpec state_spec(const EnvSpec& spec, std::int64_t od) {
    EnvSpec s = spec;
    Box b;
    b.low.assign(static_cast<std::size_t>(od), -std::numeric_limits<float>::infinity());
    b.high.assign(static_cast<std::size_t>(od), std::numeric_limits<float>::infinity());
    s.observation = b;
    return s;
  }
  // `reward` + w * the clipped log-likelihood of `action` at History observations `obs`.
  at::Tensor shape(const at::Tensor& reward, const at::Tensor& obs, const at::Tensor& action, double w) {
    const auto lp = collective_log_prob(obs, action).clamp_min(*cfg_.shaping->min_log_prob).to(reward.device(), at::kFloat);
    return reward.to(at::kFloat) + w * lp;
  }
  [[nodiscard]] at::Tensor state_of(const at::Tensor& obs) const {
    return collective::split_history(obs, h_, od_, ad_, env_).state;
  }

  Config cfg_;
  c10::Device device_;
  std::string env_;
  CollectiveDistillation distill_;
  SAC sac_;
  std::int64_t od_ = 0, ad_ = 0, h_ = 0;
  double last_weight_ = 0.0;
};

static_assert(Algorithm<CollectiveStudent>);

}  // namespace anvil
