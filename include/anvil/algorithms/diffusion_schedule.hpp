#pragma once
/// @file
/// Diffusion Policy's schedule and samplers (algorithms/diffusion_policy.hpp): DDPM's noise
/// schedule (Ho, Jain, Abbeel 2020; the squared cosine of Nichol and Dhariwal 2021), the
/// forward noising, DDPM's and DDIM's (Song, Meng, Ermon 2021) reverse steps, the EMA's
/// warm-up, and the min-max scaling of observations and actions to [-1, 1]. Free functions
/// on tensors, on any device.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil {

namespace diffusion {

/// DDPM's variances beta_1..beta_K and the products alpha-bar_k of (1 - beta).
struct NoiseSchedule {
  enum class Kind { squared_cosine, linear };

  NoiseSchedule() = default;
  /// `steps` diffusion steps; squared cosine (Nichol and Dhariwal 2021, eq. 17, s = 0.008,
  /// betas capped at 0.999) or linear from `beta_start` to `beta_end` (Ho et al. 2020).
  explicit NoiseSchedule(int steps, Kind kind = Kind::squared_cosine, double beta_start = 1e-4, double beta_end = 0.02)
      : steps_(steps) {
    if (steps < 1) throw ConfigError("diffusion.train_steps: is " + std::to_string(steps) + "; needs at least 1");
    for (int i = 0; i < steps; ++i) {
      double b = 0;
      if (kind == Kind::squared_cosine) {
        b = std::min(1.0 - cosine_alpha_bar(static_cast<double>(i + 1) / steps) / cosine_alpha_bar(static_cast<double>(i) / steps), 0.999);
      } else {
        b = steps == 1 ? beta_start : beta_start + (beta_end - beta_start) * i / (steps - 1);
      }
      beta_.push_back(b);
      alpha_bar_.push_back((alpha_bar_.empty() ? 1.0 : alpha_bar_.back()) * (1.0 - b));
    }
  }

  /// The squared-cosine alpha-bar at t in [0, 1] (before normalising by its value at 0).
  [[nodiscard]] static double cosine_alpha_bar(double t) {
    const double c = std::cos((t + 0.008) / 1.008 * std::numbers::pi / 2);
    return c * c;
  }

  [[nodiscard]] int steps() const noexcept { return steps_; }
  [[nodiscard]] double beta(int k) const { return beta_.at(static_cast<std::size_t>(k)); }
  /// alpha-bar of step k; of step -1 (before any noise) 1.
  [[nodiscard]] double alpha_bar(int k) const { return k < 0 ? 1.0 : alpha_bar_.at(static_cast<std::size_t>(k)); }
  [[nodiscard]] const std::vector<double>& alpha_bars() const noexcept { return alpha_bar_; }

 private:
  int steps_ = 0;
  std::vector<double> beta_, alpha_bar_;
};

/// The forward process: sqrt(ab_k) x0 + sqrt(1 - ab_k) noise, per row's step `k` [B], with
/// the schedule's alpha-bars in a tensor on x0's device (`alpha_bars`, float64 [K]).
inline at::Tensor add_noise(const at::Tensor& alpha_bars, const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& k) {
  const auto ab = alpha_bars.index_select(0, k.to(x0.device())).to(x0.scalar_type());
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x0.dim()), 1);
  shape[0] = x0.size(0);
  const auto a = ab.view(shape);
  return a.sqrt() * x0 + (1.0 - a).sqrt() * noise;
}
/// `add_noise` from the schedule itself (its alpha-bars copied to x0's device first).
inline at::Tensor add_noise(const NoiseSchedule& s, const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& k) {
  return add_noise(at::tensor(s.alpha_bars(), at::TensorOptions().dtype(at::kDouble)).to(x0.device()), x0, noise, k);
}

/// The x0 that `eps` implies at step t, clipped to [-1, 1] when `clip`.
inline at::Tensor predicted_x0(const NoiseSchedule& s, const at::Tensor& x, int t, const at::Tensor& eps, bool clip) {
  const double ab = s.alpha_bar(t);
  auto x0 = (x - std::sqrt(1.0 - ab) * eps) / std::sqrt(ab);
  return clip ? x0.clamp(-1.0, 1.0) : x0;
}

/// One DDPM reverse step from t to t - 1 with the posterior's mean and variance ("fixed
/// small", Ho et al. eq. 7): mean c0 x0 + ct x_t, plus sqrt(variance) z when t > 0 (`z`
/// standard normal, or undefined for the mean alone).
inline at::Tensor ddpm_step(const NoiseSchedule& s, const at::Tensor& x, int t, const at::Tensor& eps, bool clip, const at::Tensor& z) {
  const double ab = s.alpha_bar(t), ab_prev = s.alpha_bar(t - 1);
  const double a_t = ab / ab_prev, b_t = 1.0 - a_t;
  const auto x0 = predicted_x0(s, x, t, eps, clip);
  const double c0 = std::sqrt(ab_prev) * b_t / (1.0 - ab);
  const double ct = std::sqrt(a_t) * (1.0 - ab_prev) / (1.0 - ab);
  auto mean = c0 * x0 + ct * x;
  if (t > 0 && z.defined()) {
    const double var = std::max((1.0 - ab_prev) / (1.0 - ab) * b_t, 1e-20);
    mean = mean + std::sqrt(var) * z;
  }
  return mean;
}

/// One DDIM step from t to t_prev (-1: the end) with stochasticity `eta` (0: deterministic).
/// The direction term uses the noise implied by the clipped x0, so that with eta = 1 and
/// every step this is DDPM's step exactly, clipping included.
inline at::Tensor ddim_step(const NoiseSchedule& s, const at::Tensor& x, int t, int t_prev, const at::Tensor& eps, bool clip,
                            double eta, const at::Tensor& z) {
  const double ab = s.alpha_bar(t), ab_prev = s.alpha_bar(t_prev);
  const auto x0 = predicted_x0(s, x, t, eps, clip);
  const auto e = clip ? (x - std::sqrt(ab) * x0) / std::sqrt(1.0 - ab) : eps;
  const double var = eta * eta * (1.0 - ab_prev) / (1.0 - ab) * (1.0 - ab / ab_prev);
  auto out = std::sqrt(ab_prev) * x0 + std::sqrt(std::max(1.0 - ab_prev - var, 0.0)) * e;
  if (var > 0 && z.defined()) out = out + std::sqrt(var) * z;
  return out;
}

/// The steps DDIM visits with `k` of a schedule of `train_steps`: (k-1) c, ..., c, 0 with
/// c = train_steps / k (as diffusers' "leading" spacing).
inline std::vector<int> ddim_timesteps(int train_steps, int k) {
  if (k < 1 || k > train_steps)
    throw ConfigError("diffusion.inference_steps: is " + std::to_string(k) + "; must be 1 .. diffusion.train_steps (" +
                      std::to_string(train_steps) + ")");
  const int c = train_steps / k;
  std::vector<int> ts;
  for (int i = k - 1; i >= 0; --i) ts.push_back(i * c);
  return ts;
}

/// The EMA decay of Diffusion Policy's average before update `k` (k = 0 is the first):
/// 0 for the first two, then 1 - (1 + (k - 1))^-power, at most `max_decay`.
inline double ema_warmup_decay(std::int64_t k, double power, double max_decay) {
  if (power <= 0) return max_decay;
  const double step = static_cast<double>(k - 1);
  if (step <= 0) return 0.0;
  return std::clamp(1.0 - std::pow(1.0 + step, -power), 0.0, max_decay);
}

/// Per-dimension affine maps to [-1, 1] from a minimum and a maximum (a dimension that
/// hardly varies, range below 1e-4, is centred instead of stretched).
struct MinMax {
  at::Tensor scale, offset;  ///< y = scale x + offset
  [[nodiscard]] bool defined() const noexcept { return scale.defined(); }
  static MinMax fit(const at::Tensor& lo, const at::Tensor& hi) {
    const auto range = (hi - lo).to(at::kFloat);
    const auto tiny = range < 1e-4;
    MinMax m;
    m.scale = at::where(tiny, at::ones_like(range), 2.0 / range);
    m.offset = at::where(tiny, -(hi + lo).to(at::kFloat) / 2, -1.0 - m.scale * lo.to(at::kFloat));
    return m;
  }
  [[nodiscard]] at::Tensor apply(const at::Tensor& x) const { return x * scale + offset; }
  [[nodiscard]] at::Tensor invert(const at::Tensor& y) const { return (y - offset) / scale; }
};

}  // namespace diffusion

}  // namespace anvil
