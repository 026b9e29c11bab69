#pragma once
/// @file
/// Observation and reward normalisation as a vectorised-env wrapper, so any algorithm can
/// use it (`normalize.obs=true`, `normalize.reward=true`).
///
/// Observations are shifted and scaled by a running mean and variance of every
/// observation seen, then clipped. Rewards are divided by the running standard deviation
/// of the discounted return (not shifted, which would change the optimal policy), then
/// clipped: the scheme of the PPO reference implementation (OpenAI Baselines' VecNormalize;
/// Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients", sec. 3).
///
/// The statistics are shared with evaluation envs, which normalise observations with them
/// frozen (not updated) and see raw rewards; episode returns are always reported raw. They
/// are saved in checkpoints with the envs. With several ranks, each rank's new statistics
/// are merged over all ranks at `sync_statistics`, so every rank normalises alike.
///
/// Observations that are rows of parts (`EnvSpec::layout`: images, or images beside
/// numbers) pass through as they are: an image is scaled to [0, 1] by the encoder that reads
/// it (nn/observation_encoder.hpp), not normalised by running statistics; rewards are
/// normalised as for any env.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/envs/env_config.hpp>
#include <anvil/envs/vec_env.hpp>

namespace anvil::envs {

/// Running mean and variance of vectors (Chan, Golub, LeVeque 1979, parallel update), in
/// double precision. Holds the merged statistics of every rank (`base`) and this rank's
/// data since the last merge (`fresh`); their combination is what normalises.
class RunningMeanVar {
 public:
  struct Moments {
    double count = 0;
    std::vector<double> mean, m2;  ///< m2: sum of squared deviations from the mean
  };

  RunningMeanVar() = default;
  explicit RunningMeanVar(std::size_t dim) {
    for (auto* m : {&base_, &fresh_}) {
      m->mean.assign(dim, 0.0);
      m->m2.assign(dim, 0.0);
    }
    refresh();
  }

  /// Adds the rows of `x` [B, dim] (or a [B] batch of scalars when dim is 1).
  void update(const at::Tensor& x) {
    if (x.dim() > 0 && x.size(0) > 0 && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous())
      return add_rows(x.data_ptr<float>(), x.size(0), x.numel() / x.size(0));  // every step: no LibTorch op
    const auto c = x.to(at::kCPU, at::kDouble).reshape({x.size(0), -1}).contiguous();
    add_rows(c.data_ptr<double>(), c.size(0), c.size(1));
  }
  /// Adds `b` rows of this statistic's dimension at `rows` (no LibTorch op).
  void update(const double* rows, std::int64_t b) { add_rows(rows, b, static_cast<std::int64_t>(now_.mean.size())); }

  /// Merges every rank's fresh statistics into the shared ones: `sum` adds a double tensor
  /// over the ranks in place. Afterwards every rank holds the same statistics.
  void sync(const std::function<void(at::Tensor&)>& sum) {
    const auto d = static_cast<std::int64_t>(fresh_.mean.size());
    // (n, sum x, sum x^2 about zero) add up across ranks.
    auto t = at::empty({1 + 2 * d}, at::kDouble);
    double* p = t.data_ptr<double>();
    p[0] = fresh_.count;
    for (std::int64_t j = 0; j < d; ++j) {
      p[1 + j] = fresh_.count * fresh_.mean[j];
      p[1 + d + j] = fresh_.m2[j] + fresh_.count * fresh_.mean[j] * fresh_.mean[j];
    }
    sum(t);
    p = t.data_ptr<double>();
    Moments all{p[0], std::vector<double>(d, 0.0), std::vector<double>(d, 0.0)};
    if (all.count > 0)
      for (std::int64_t j = 0; j < d; ++j) {
        all.mean[j] = p[1 + j] / all.count;
        all.m2[j] = std::max(0.0, p[1 + d + j] - all.count * all.mean[j] * all.mean[j]);
      }
    fresh_ = all;  // every rank's, now the same on all
    refresh();
    consolidate();
  }

  /// Folds this rank's fresh statistics into the shared ones (without other ranks'): so a
  /// copy sent to other ranks counts nothing twice at the next `sync`.
  void consolidate() {
    base_ = now_;
    fresh_.count = 0;
    std::fill(fresh_.mean.begin(), fresh_.mean.end(), 0.0);
    std::fill(fresh_.m2.begin(), fresh_.m2.end(), 0.0);
  }

  [[nodiscard]] double count() const noexcept { return now_.count; }
  [[nodiscard]] const std::vector<double>& mean() const noexcept { return now_.mean; }
  /// Population variance of everything seen (1 before anything was).
  [[nodiscard]] std::vector<double> variance() const {
    std::vector<double> v;
    variance(v);
    return v;
  }
  /// Population variance of dimension `j` (1 before anything was seen).
  [[nodiscard]] double variance(std::size_t j) const { return now_.count > 0 ? now_.m2[j] / now_.count : 1.0; }
  /// The same for every dimension into `v` (its buffer reused).
  void variance(std::vector<double>& v) const {
    v.resize(now_.m2.size());
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = variance(j);
  }

  // The statistics in two parts, saved apart: the merged ones every rank holds alike (the
  // `normalizer` section of a run's state, sent from rank 0 to the others) and this rank's
  // fresh ones since the last merge (with the envs, which are this rank's own).

  /// Writes the merged part.
  void save_merged(BinaryWriter& w) const { save_moments(w, base_); }
  /// Writes this rank's fresh part.
  void save_fresh(BinaryWriter& w) const { save_moments(w, fresh_); }
  /// Reads a part written by `save_merged` or `save_fresh`, checking its dimension; `what`
  /// names it in messages. Changes nothing.
  [[nodiscard]] Moments read_moments(BinaryReader& r, const std::string& what) const {
    Moments m;
    m.count = r.value<double>((what + " count").c_str());
    if (!(m.count >= 0) || !std::isfinite(m.count)) r.fail(what + " count", "is not a finite count");
    r.expect(static_cast<std::uint64_t>(base_.mean.size()), (what + " dimension").c_str());
    m.mean.resize(base_.mean.size());
    m.m2.resize(base_.m2.size());
    r.bytes(m.mean.data(), m.mean.size() * sizeof(double), (what + " mean").c_str());
    r.bytes(m.m2.data(), m.m2.size() * sizeof(double), (what + " variance").c_str());
    return m;
  }
  void restore_merged(const Moments& m) {
    base_ = m;
    refresh();
  }
  void restore_fresh(const Moments& m) {
    fresh_ = m;
    refresh();
  }

 private:
  static void save_moments(BinaryWriter& w, const Moments& m) {
    w.value(m.count);
    w.value(static_cast<std::uint64_t>(m.mean.size()));
    w.bytes(m.mean.data(), m.mean.size() * sizeof(double));
    w.bytes(m.m2.data(), m.m2.size() * sizeof(double));
  }
  // Adds b rows of d values at p, in double precision (float rows are widened exactly).
  template <class T>
  void add_rows(const T* p, std::int64_t b, std::int64_t d) {
    if (b == 0) return;
    Moments& batch = batch_;  // reused: no allocation a step
    batch.count = static_cast<double>(b);
    batch.mean.assign(static_cast<std::size_t>(d), 0.0);
    batch.m2.assign(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t j = 0; j < d; ++j) batch.mean[j] += static_cast<double>(p[i * d + j]);
    for (auto& m : batch.mean) m /= static_cast<double>(b);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t j = 0; j < d; ++j) {
        const double e = static_cast<double>(p[i * d + j]) - batch.mean[j];
        batch.m2[j] += e * e;
      }
    merge(fresh_, batch);
    refresh();
  }
  static void merge(Moments& into, const Moments& b) {
    if (b.count == 0) return;
    const double n = into.count + b.count;
    for (std::size_t j = 0; j < into.mean.size(); ++j) {
      const double delta = b.mean[j] - into.mean[j];
      into.m2[j] += b.m2[j] + delta * delta * into.count * b.count / n;
      into.mean[j] += delta * b.count / n;
    }
    into.count = n;
  }
  void refresh() {
    now_ = base_;
    merge(now_, fresh_);
  }

  Moments base_, fresh_, now_;
  Moments batch_;  // the rows update() adds, kept for its buffers
};

/// What a `NormalizedVecEnv` shares with the evaluation envs built beside it. Its state
/// (the `normalizer` section) is the merged statistics, which every rank holds alike; each
/// rank's fresh statistics are saved with its envs (`NormalizedVecEnv::save`).
struct NormalizeState {
  RunningMeanVar obs, ret;

  void save(BinaryWriter& w) const {
    obs.save_merged(w);
    ret.save_merged(w);
  }
  struct Saved {
    RunningMeanVar::Moments obs, ret;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    return {obs.read_moments(r, "merged observation statistics"), ret.read_moments(r, "merged return statistics")};
  }
  void restore(const Saved& s) {
    obs.restore_merged(s.obs);
    ret.restore_merged(s.ret);
  }
};

/// A `VecEnvBase` that normalises another (see file comment). Training mode updates the
/// statistics and scales rewards; frozen mode (evaluation) only normalises observations.
class NormalizedVecEnv final : public VecEnvBase {
 public:
  /// Wraps `inner`. `state` is shared with other wrappers (a new one when null); `gamma`
  /// is the discount of the return whose spread scales rewards (NaN: given later by
  /// `set_discount`; `normalize.gamma` overrides both).
  NormalizedVecEnv(std::unique_ptr<VecEnvBase> inner, const NormalizeConfig& cfg, double gamma,
                   std::shared_ptr<NormalizeState> state = nullptr, bool frozen = false)
      : VecEnvBase(inner->spec(), inner->num_envs(), inner->groups()), inner_(std::move(inner)), cfg_(cfg),
        gamma_(cfg.gamma > 0 ? *cfg.gamma : gamma), frozen_(frozen), state_(std::move(state)) {
    if (!state_) {
      state_ = std::make_shared<NormalizeState>();
      state_->obs = RunningMeanVar(static_cast<std::size_t>(spec_.obs_dim()));
      state_->ret = RunningMeanVar(1);
    }
    const auto f = at::TensorOptions().dtype(at::kFloat);
    const auto of = f.dtype(spec_.byte_rows() ? at::kByte : at::kFloat);
    for (auto& o : obs_) o = at::zeros({n_, spec_.obs_dim()}, of);
    next_obs_ = at::zeros({n_, spec_.obs_dim()}, of);
    reward_ = at::zeros({n_}, f);
    running_return_.assign(static_cast<std::size_t>(n_), 0.0);
  }

  /// The statistics, for evaluation envs built to share them.
  [[nodiscard]] const std::shared_ptr<NormalizeState>& state() const noexcept { return state_; }
  [[nodiscard]] const VecEnvBase& inner() const noexcept { return *inner_; }

  at::Tensor reset() override {
    auto o = inner_->reset();
    if (obs_on() && !frozen_) state_->obs.update(o);
    std::fill(running_return_.begin(), running_return_.end(), 0.0);
    normalize_obs(o, obs_[cur_]);
    started_ = true;
    return obs_[cur_];
  }
  void step_async(const at::Tensor& actions) override { inner_->step_async(actions); }
  const VecStep& step_wait() override {
    const auto& s = inner_->step_wait();
    if (obs_on() && !frozen_) state_->obs.update(s.obs);
    cur_ = 1 - cur_;
    normalize_obs(s.obs, obs_[cur_]);
    normalize_obs(s.next_obs, next_obs_);
    out_ = s;
    out_.obs = obs_[cur_];
    out_.next_obs = next_obs_;
    if (cfg_.reward && !frozen_) {
      scale_rewards(s);
      out_.reward = reward_;
    }
    return out_;
  }
  at::Tensor observations() const override { return started_ ? obs_[cur_] : at::Tensor(); }
  bool saves_state() const noexcept override { return inner_->saves_state(); }
  bool reports_success() const noexcept override { return inner_->reports_success(); }
  VecMode mode() const noexcept override { return inner_->mode(); }

  /// The discount of the return whose spread scales rewards, unless `normalize.gamma` set it.
  void set_discount(double gamma) override {
    if (!(cfg_.gamma > 0)) gamma_ = gamma;
  }
  /// Merges every rank's new statistics (see RunningMeanVar::sync).
  void sync_statistics(const std::function<void(at::Tensor&)>& sum) override {
    if (frozen_) return;
    if (obs_on()) state_->obs.sync(sum);
    if (cfg_.reward) state_->ret.sync(sum);
  }

  /// This rank's part: the fresh statistics (the merged ones are the `normalizer` section,
  /// `NormalizeState`), the running discounted returns, the normalised observations, and the
  /// wrapped envs.
  void save(BinaryWriter& w) const override {
    state_->obs.save_fresh(w);
    state_->ret.save_fresh(w);
    w.bytes(running_return_.data(), running_return_.size() * sizeof(double));
    w.value(started_);
    w.bytes(obs_[cur_].data_ptr(), static_cast<std::size_t>(obs_[cur_].nbytes()));
    inner_->save(w);
  }
  std::function<void()> read(BinaryReader& r) override {
    auto obs = std::make_shared<RunningMeanVar::Moments>(state_->obs.read_moments(r, "fresh observation statistics"));
    auto ret = std::make_shared<RunningMeanVar::Moments>(state_->ret.read_moments(r, "fresh return statistics"));
    auto running = std::make_shared<std::vector<double>>(running_return_.size());
    r.bytes(running->data(), running->size() * sizeof(double), "running discounted returns");
    const bool started = r.value<bool>("normaliser started flag");
    auto current = at::empty_like(obs_[cur_]);
    r.bytes(current.data_ptr(), static_cast<std::size_t>(current.nbytes()), "normalised observations");
    auto inner = inner_->read(r);
    // Without env state the run starts new episodes, so only the statistics carry over.
    return [this, obs, ret, running, started, current, inner] {
      state_->obs.restore_fresh(*obs);
      state_->ret.restore_fresh(*ret);
      if (inner) {
        inner();
        running_return_ = *running;
        started_ = started;
        obs_[cur_].copy_(current);
      }
    };
  }

 private:
  // Whether observations are normalised: asked for, and float rows (see file comment).
  [[nodiscard]] bool obs_on() const noexcept { return cfg_.obs && !spec_.byte_rows(); }
  void normalize_obs(const at::Tensor& raw, at::Tensor& out) const {
    if (!obs_on()) {
      out.copy_(raw);
      return;
    }
    const auto& mean = state_->obs.mean();
    auto& var = var_;
    state_->obs.variance(var);
    const auto c = raw.contiguous();
    const float* x = c.data_ptr<float>();
    float* y = out.data_ptr<float>();
    const std::int64_t n = c.size(0), d = c.size(1);
    const double clip = cfg_.clip_obs, eps = cfg_.epsilon;
    for (std::int64_t j = 0; j < d; ++j) {
      const double m = mean[static_cast<std::size_t>(j)], inv = 1.0 / std::sqrt(var[static_cast<std::size_t>(j)] + eps);
      for (std::int64_t i = 0; i < n; ++i)
        y[i * d + j] = static_cast<float>(std::clamp((x[i * d + j] - m) * inv, -clip, clip));
    }
  }
  void scale_rewards(const VecStep& s) {
    if (std::isnan(gamma_))
      throw ConfigError("normalize.reward: the discount of the return is unknown (the algorithm has none); set "
                        "normalize.gamma");
    const float* r = s.reward.data_ptr<float>();
    const float *term = s.terminated.data_ptr<float>(), *trunc = s.truncated.data_ptr<float>();
    for (std::int64_t i = 0; i < n_; ++i) running_return_[i] = running_return_[i] * gamma_ + r[i];
    state_->ret.update(running_return_.data(), n_);  // every step: no LibTorch op
    const double scale = 1.0 / std::sqrt(state_->ret.variance(0) + cfg_.epsilon), clip = cfg_.clip_reward;
    float* out = reward_.data_ptr<float>();
    for (std::int64_t i = 0; i < n_; ++i) {
      out[i] = static_cast<float>(std::clamp(r[i] * scale, -clip, clip));
      if (term[i] > 0 || trunc[i] > 0) running_return_[i] = 0.0;
    }
  }

  std::unique_ptr<VecEnvBase> inner_;
  NormalizeConfig cfg_;
  double gamma_;
  bool frozen_;
  std::shared_ptr<NormalizeState> state_;
  std::array<at::Tensor, 2> obs_;
  int cur_ = 0;
  at::Tensor next_obs_, reward_;
  mutable std::vector<double> var_;  // normalize_obs's variances, its buffer reused
  std::vector<double> running_return_;
  VecStep out_;
  bool started_ = false;
};

}  // namespace anvil::envs
