// anvil 0.1.0: single-header edition, generated from include/ by
// `python3 scripts/amalgamate.py`. Do not edit: change include/ and regenerate.
#pragma once
// ---- begin <anvil/anvil.hpp> ----
/// @file
/// anvil: a header-only C++20 toolkit for training policies on LibTorch. This umbrella
/// header brings in every public header; include single ones to compile faster.
///
///     #include <anvil/anvil.hpp>
///     int main(int argc, char** argv) {
///       using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
///       Trainer t(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
///       t.fit();
///     }

// ---- begin <anvil/core/batch.hpp> ----
/// @file
/// The data that passes between policies, as named structs of tensors.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

/// One step of N envs, as the trainer hands it to a buffer: row i is env i.
/// `next_obs` is the observation the step led to, before any autoreset, so a truncated
/// episode can bootstrap from its true last state.
struct StepBatch {
  at::Tensor obs;         ///< [N, obs_dim]
  at::Tensor action;      ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor reward;      ///< [N]
  at::Tensor next_obs;    ///< [N, obs_dim]
  at::Tensor terminated;  ///< [N] float 0/1: terminal state, do not bootstrap
  at::Tensor truncated;   ///< [N] float 0/1: cut by a time limit, bootstrap
  at::Tensor task;        ///< [N] int64: each env's task (envs with tasks; else undefined)
};

/// A batch sampled from a replay buffer.
struct ReplayBatch {
  at::Tensor obs;         ///< [B, obs_dim]
  at::Tensor action;      ///< [B, act_dim]
  at::Tensor reward;      ///< [B] (an n-step return when the buffer computes them)
  at::Tensor next_obs;    ///< [B, obs_dim]
  at::Tensor terminated;  ///< [B] float 0/1
  at::Tensor discount;    ///< [B] gamma^n for the bootstrap term (gamma for 1-step)
  at::Tensor weight;      ///< [B] importance weights (ones for uniform sampling)
  at::Tensor index;       ///< [B] int64 ids (the order transitions were added in), for priority updates
  at::Tensor task;        ///< [B] int64: each transition's task (envs with tasks; else undefined)
};

/// Rows [begin, begin + n) of every defined field of `b` (views, no copies): the micro-
/// batches of gradient accumulation.
inline ReplayBatch rows_of(const ReplayBatch& b, std::int64_t begin, std::int64_t n) {
  auto part = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
  return {part(b.obs),        part(b.action),   part(b.reward), part(b.next_obs), part(b.terminated),
          part(b.discount),   part(b.weight),   part(b.index),  part(b.task)};
}

/// A batch of collective distillation (buffers/collective_dataset.hpp): for each target
/// row, the history before it and the expert's labels at it.
struct CollectiveBatch {
  at::Tensor tokens;    ///< [B, H, obs_dim + act_dim + 1] the (state, action, reward) steps before, oldest first
  at::Tensor mask;      ///< [B, H] float 1 where the token is of the target row's episode
  at::Tensor obs;       ///< [B, obs_dim] the target row's state
  at::Tensor action;    ///< [B, act_dim] the action taken there (for the Q head)
  at::Tensor mean;      ///< [B, act_dim] the expert's pre-tanh mean
  at::Tensor log_std;   ///< [B, act_dim] the expert's log standard deviation
  at::Tensor q_target;  ///< [B] the expert's clipped double-Q target
  at::Tensor task;      ///< [B] int64 task ids (the dataset's task list)
};

/// Rows [begin, begin + n) of every field of `b` (views): micro-batches.
inline CollectiveBatch rows_of(const CollectiveBatch& b, std::int64_t begin, std::int64_t n) {
  auto part = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
  return {part(b.tokens), part(b.mask), part(b.obs), part(b.action), part(b.mean), part(b.log_std), part(b.q_target), part(b.task)};
}

/// A minibatch of an on-policy rollout, with advantages already computed.
struct RolloutBatch {
  at::Tensor obs;        ///< [B, obs_dim]
  at::Tensor action;     ///< [B, act_dim] or [B] (discrete)
  at::Tensor log_prob;   ///< [B] log-probability of `action` under the policy that acted
  at::Tensor advantage;  ///< [B]
  at::Tensor returns;    ///< [B] targets for the value function
  at::Tensor value;      ///< [B] value estimates at collection time
};

/// One step of N envs as an on-policy algorithm collects it: what the policy did and what
/// it expected, for a rollout buffer to compute advantages from.
struct RolloutStep {
  at::Tensor obs;             ///< [N, obs_dim] what the policy acted on
  at::Tensor action;          ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor log_prob;        ///< [N] log-probability of `action` under the acting policy
  at::Tensor value;           ///< [N] value estimate of `obs`
  at::Tensor reward;          ///< [N]
  at::Tensor terminated;      ///< [N] float 0/1: terminal state, the return ends here
  at::Tensor truncated;       ///< [N] float 0/1: cut by a time limit, bootstrap from the last state
  at::Tensor bootstrap_value; ///< [N] value of the last state where truncated (undefined: none truncated)
};

/// What an on-policy algorithm returns when it acts for a rollout.
struct RolloutAct {
  at::Tensor action;    ///< [N, act_dim] or [N] (discrete)
  at::Tensor log_prob;  ///< [N]
  at::Tensor value;     ///< [N]
};

/// One step of N envs as the episodic loop collects it: row i is env i. `live` is 1 for
/// the envs still in the episode this round collects (0 for those whose episode has ended
/// and which now run on into one that is not kept).
struct EpisodeStep {
  at::Tensor obs;         ///< [N, obs_dim] what the policy acted on
  at::Tensor action;      ///< [N, act_dim] (float) or [N] (int64, discrete)
  at::Tensor reward;      ///< [N]
  at::Tensor terminated;  ///< [N] float 0/1
  at::Tensor truncated;   ///< [N] float 0/1
  at::Tensor live;        ///< [N] float 0/1
  at::Tensor next_obs;    ///< [N, obs_dim] what the step led to (the last of an ended episode)
};

/// A round of whole episodes, one per env, padded to the longest: row i is env i's episode.
struct EpisodeBatch {
  at::Tensor obs;         ///< [N, T, obs_dim]
  at::Tensor action;      ///< [N, T, act_dim] or [N, T] (discrete)
  at::Tensor reward;      ///< [N, T]
  at::Tensor terminated;  ///< [N, T] 1 at a terminal step (the return ends there)
  at::Tensor mask;        ///< [N, T] 1 where the step belongs to the episode, 0 in the padding
  at::Tensor length;      ///< [N] int64: each episode's steps
  at::Tensor last_obs;    ///< [N, obs_dim] the observation after each episode's last step
};

/// What a buffer is told of the run before it starts, and again after a resume (`plan`).
struct StoragePlan {
  std::int64_t num_envs = 1;  ///< envs stepped together on this rank: the rows of each `add`
  std::int64_t horizon = 0;   ///< the run's length in env steps (schedules such as PER's beta)
  double discount = 0.99;     ///< the algorithm's discount (n-step returns, advantages)
  /// Windows of consecutive steps, for algorithms that learn from sequences (Diffusion
  /// Policy): observations and actions per sample (1, 1: single transitions).
  std::int64_t sequence_obs = 1;
  std::int64_t sequence_actions = 1;
};

/// What one call of an algorithm's `update` reports: scalar metrics for logging, and for
/// prioritized replay the new priorities of the batch's rows (|TD error|), else undefined.
struct UpdateInfo {
  std::vector<std::pair<std::string, double>> metrics;
  at::Tensor td_error;
};

}  // namespace anvil
// ---- end <anvil/core/batch.hpp> ----
// ---- begin <anvil/core/blas.hpp> ----
/// @file
/// Which BLAS does Torch's CPU matrix products, and making the fast one the default.
///
/// Two facts measured on the machines anvil is developed on (Debian bookworm, AVX-512
/// CPUs): Debian's reference BLAS makes Torch's matrix products about 10x slower than
/// OpenBLAS; and OpenBLAS's AVX-512 kernels (SkylakeX family) make a 256-wide SAC update about
/// 46% faster than its AVX2 (Haswell) ones. OpenBLAS 0.3.21 picks AVX-512 kernels for the CPUs
/// it knows; for one it does not know it may settle on AVX2 kernels. `prefer_fast_blas` then
/// restarts the program once with `OPENBLAS_CORETYPE=SkylakeX` (OpenBLAS reads the variable
/// only when it loads). It does nothing when the variable is already
/// set. A user who sets OPENBLAS_CORETYPE themselves keeps their choice.
///
/// `blas::gemm` is a row-major single-precision matrix product that calls the BLAS Torch
/// uses directly (found at run time, so nothing more is linked), for the hand-written fast
/// paths of small networks: at RL sizes a LibTorch op costs as much again as its arithmetic
/// (see nn/manual_mlp.hpp). Light header.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

// ---- begin <anvil/core/simd.hpp> ----
/// @file
/// Element-wise float kernels of the hand-written fast paths, compiled twice: for the
/// compiler's target (x86-64's baseline is SSE2, 4 floats at a time) and, on x86-64 with
/// GCC or Clang, for AVX-512 (16 at a time), picked once at run time from the CPU. A user's
/// program built with the default flags thus gets AVX-512 loops where the CPU has them,
/// as OpenBLAS does for the matrix products. Light header.
///
/// `ANVIL_SIMD_KERNEL(name, (params), (args), { body })` defines `name(params)`, which runs
/// `body` built for AVX-512 when the CPU has it and for the baseline otherwise; the body
/// is plain C++ the compiler vectorises.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ANVIL_SIMD_X86 1
#define ANVIL_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,popcnt")))
#else
#define ANVIL_SIMD_X86 0
#define ANVIL_TARGET_AVX512
#endif

namespace anvil::simd {

/// Whether this CPU runs the AVX-512 builds of the kernels (checked once): the one check of
/// the CPU for every AVX-512 kernel in anvil (these, the sum tree's, the BLAS advice).
inline bool avx512() noexcept {
#if ANVIL_SIMD_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("popcnt");
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace anvil::simd

#if ANVIL_SIMD_X86
#define ANVIL_SIMD_KERNEL(name, params, args, ...)             \
  ANVIL_TARGET_AVX512 inline void name##_avx512 params __VA_ARGS__ \
  inline void name##_baseline params __VA_ARGS__              \
  inline void name params {                                   \
    if (::anvil::simd::avx512()) name##_avx512 args;          \
    else name##_baseline args;                                \
  }
#else
#define ANVIL_SIMD_KERNEL(name, params, args, ...) inline void name params __VA_ARGS__
#endif

namespace anvil::simd {

/// y[r, j] += bias[j] for every row r of y [rows, cols]; with `relu`, then y = max(y, 0).
ANVIL_SIMD_KERNEL(add_bias, (float* __restrict y, const float* __restrict bias, std::int64_t rows, std::int64_t cols,
                             bool relu),
                  (y, bias, rows, cols, relu), {
                    if (cols == 1) {  // one column: a loop over the rows, not one per row
                      const float b = bias[0];
                      if (relu)
                        for (std::int64_t r = 0; r < rows; ++r) y[r] = y[r] + b > 0.f ? y[r] + b : 0.f;
                      else
                        for (std::int64_t r = 0; r < rows; ++r) y[r] += b;
                      return;
                    }
                    for (std::int64_t r = 0; r < rows; ++r) {
                      float* yr = y + r * cols;
                      if (relu)
                        for (std::int64_t j = 0; j < cols; ++j) yr[j] = yr[j] + bias[j] > 0.f ? yr[j] + bias[j] : 0.f;
                      else
                        for (std::int64_t j = 0; j < cols; ++j) yr[j] += bias[j];
                    }
                  })

/// s[j] = the sum over rows r of x[r, j], x [rows, cols].
ANVIL_SIMD_KERNEL(column_sums, (float* __restrict s, const float* __restrict x, std::int64_t rows, std::int64_t cols),
                  (s, x, rows, cols), {
                    if (cols == 1) {
                      float t = 0.f;
                      for (std::int64_t r = 0; r < rows; ++r) t += x[r];
                      s[0] = t;
                      return;
                    }
                    for (std::int64_t j = 0; j < cols; ++j) s[j] = 0.f;
                    for (std::int64_t r = 0; r < rows; ++r)
                      for (std::int64_t j = 0; j < cols; ++j) s[j] += x[r * cols + j];
                  })

/// x = max(x, 0), n floats.
ANVIL_SIMD_KERNEL(relu, (float* __restrict x, std::int64_t n), (x, n), {
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
})

/// g = y > 0 ? g : 0 (ReLU's backward from its output y), n floats.
ANVIL_SIMD_KERNEL(relu_backward, (float* __restrict g, const float* __restrict y, std::int64_t n), (g, y, n), {
  for (std::int64_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : 0.f;
})

/// Single-precision exp as plain arithmetic the compiler vectorises (Cody-Waite range
/// reduction and a degree-6 polynomial; within 2 ulp of std::exp on [-87, 88], clamped
/// outside). For the element-wise parts of the fast paths; not a general replacement.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (no rounding instruction needed)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

/// Natural log of a positive normal float as plain vectorisable arithmetic (the exponent
/// from the bits, a degree-8 polynomial of the mantissa in [sqrt(1/2), sqrt(2)); within 2 ulp).
inline float log_approx(float x) {
  std::int32_t bits = std::bit_cast<std::int32_t>(x);
  std::int32_t e = ((bits >> 23) & 0xff) - 126;  // x = m 2^e, m in [0.5, 1)
  float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f000000);
  const bool small = m < 0.70710678118654752f;  // move m into [sqrt(1/2), sqrt(2))
  e = small ? e - 1 : e;
  m = small ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  const float fe = static_cast<float>(e);
  float y = p * m * z;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  return m + y + 0.693359375f * fe;
}

/// tanh from `exp_approx`: sign(x) (1 - e) / (1 + e), e = exp(-2|x|); absolute error
/// below 2e-7.
inline float tanh_approx(float x) {
  const float ax = x < 0.f ? -x : x;
  const float e = exp_approx(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.f ? -t : t;
}

namespace detail {
// ln 2 in two parts: ln2_hi holds its leading 32 bits, so n * ln2_hi is exact for |n| < 2^21.
inline constexpr double ln2_hi = 0x1.62e42feep-1;
inline constexpr double ln2_lo = 0x1.a39ef35793c76p-33;

// exp(x) for x in [-708, 709] as plain vectorisable arithmetic: x = n ln 2 + r with
// |r| <= ln 2 / 2, e^r from its Taylor series to r^13 (the rest is below 1e-17 of it), times
// 2^n from the bits. Within 2 ulp of std::exp there; x outside is clamped into it.
inline double exp_f64(double x) {
  x = std::max(-708.0, std::min(709.0, x));  // (NaN becomes 709: no undefined conversion below)
  const double n = (x * 0x1.71547652b82fep+0 + 0x1.8p52) - 0x1.8p52;  // round(x / ln 2)
  const double r = (x - n * ln2_hi) - n * ln2_lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return p * std::bit_cast<double>((static_cast<std::int64_t>(n) + 1023) << 52);
}

// log(x) for a positive normal finite double as plain vectorisable arithmetic: x = m 2^e
// with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), s = f / (2 + f), and
// log(1 + f) = 2 atanh(s) = f - s (f - R), R = 2 s^2/3 + 2 s^4/5 + ... to s^22 (|s| < 0.172:
// the rest is below 1e-18). Within 2 ulp of std::log.
inline double log_f64(double x) {
  const auto bits = std::bit_cast<std::int64_t>(x);
  std::int64_t e = ((bits >> 52) & 0x7ff) - 1022;  // x = m 2^e, m in [0.5, 1)
  const double m = std::bit_cast<double>((bits & 0x000fffffffffffffLL) | 0x3fe0000000000000LL);
  const bool small = m < 0x1.6a09e667f3bcdp-1;  // sqrt(1/2)
  e = small ? e - 1 : e;
  const double f = small ? m + m - 1.0 : m - 1.0;
  const double s = f / (2.0 + f), z = s * s;
  double R = 2.0 / 23.0;
  R = R * z + 2.0 / 21.0;
  R = R * z + 2.0 / 19.0;
  R = R * z + 2.0 / 17.0;
  R = R * z + 2.0 / 15.0;
  R = R * z + 2.0 / 13.0;
  R = R * z + 2.0 / 11.0;
  R = R * z + 2.0 / 9.0;
  R = R * z + 2.0 / 7.0;
  R = R * z + 2.0 / 5.0;
  R = R * z + 2.0 / 3.0;
  R *= z;
  const auto de = static_cast<double>(e);
  return de * ln2_hi + ((f - s * (f - R)) + de * ln2_lo);
}
}  // namespace detail

ANVIL_SIMD_KERNEL(exp_f64_loop, (double* __restrict y, const double* __restrict x, std::int64_t n), (y, x, n), {
  for (std::int64_t i = 0; i < n; ++i) y[i] = detail::exp_f64(x[i]);
})
ANVIL_SIMD_KERNEL(log_f64_loop, (double* __restrict y, const double* __restrict x, std::int64_t n), (y, x, n), {
  for (std::int64_t i = 0; i < n; ++i) y[i] = detail::log_f64(x[i]);
})

/// y = exp(x), n doubles, within 2 ulp of std::exp (which takes the x outside [-708, 709]:
/// NaN, infinities, under- and overflow). x and y must not overlap.
inline void exp(double* __restrict y, const double* __restrict x, std::int64_t n) {
  exp_f64_loop(y, x, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (!(x[i] >= -708.0 && x[i] <= 709.0)) y[i] = std::exp(x[i]);
}

/// y = log(x), n doubles, within 2 ulp of std::log (which takes x <= 0, subnormal x, NaN and
/// infinity). x and y must not overlap.
inline void log(double* __restrict y, const double* __restrict x, std::int64_t n) {
  log_f64_loop(y, x, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (!(x[i] >= 0x1p-1022 && x[i] <= 0x1.fffffffffffffp+1023)) y[i] = std::log(x[i]);
}

/// x = tanh(x), n floats (`tanh_approx`: absolute error below 2e-7).
ANVIL_SIMD_KERNEL(tanh, (float* __restrict x, std::int64_t n), (x, n), {
  for (std::int64_t i = 0; i < n; ++i) x[i] = tanh_approx(x[i]);
})

/// t += w * (s - t), n floats: torch's `lerp_` for a weight below 0.5 (Polyak averaging).
ANVIL_SIMD_KERNEL(lerp, (float* __restrict t, const float* __restrict s, std::int64_t n, float w), (t, s, n, w), {
  for (std::int64_t i = 0; i < n; ++i) t[i] += w * (s[i] - t[i]);
})

/// Adam's update of n floats (torch's rule: bias-corrected moments, eps outside the square
/// root, decoupled weight decay as a factor `decay` on the weights; 1: none). c1 and c2 are
/// 1 - b1 and 1 - b2 rounded from double, as torch's ops take them. Written with
/// intrinsics: a plain loop is not vectorised (std::sqrt and -fmath-errno).
namespace detail {
#define ANVIL_ADAM_BODY(V, set1, load, store, add, mul, div, vsqrt, width)                              \
  std::int64_t i = 0;                                                                                 \
  const V vb1 = set1(b1), vb2 = set1(b2), vc1 = set1(c1), vc2 = set1(c2), vdecay = set1(decay);      \
  const V vs = set1(sqrt_bc2), veps = set1(eps), vstep = set1(step);                                  \
  for (; i + (width) <= n; i += (width)) {                                                            \
    const V gi = load(g + i);                                                                         \
    const V mi = add(mul(load(m + i), vb1), mul(gi, vc1));                                            \
    const V vi = add(mul(load(v + i), vb2), mul(mul(vc2, gi), gi));                                   \
    store(m + i, mi);                                                                                 \
    store(v + i, vi);                                                                                 \
    store(w + i, add(mul(load(w + i), vdecay), mul(vstep, div(mi, add(div(vsqrt(vi), vs), veps))))); \
  }                                                                                                   \
  for (; i < n; ++i) {                                                                                \
    const float gi = g[i];                                                                            \
    const float mi = m[i] * b1 + gi * c1;                                                             \
    const float vi = v[i] * b2 + c2 * gi * gi;                                                        \
    m[i] = mi;                                                                                        \
    v[i] = vi;                                                                                        \
    w[i] = w[i] * decay + step * (mi / (std::sqrt(vi) / sqrt_bc2 + eps));                             \
  }
#if ANVIL_SIMD_X86
// _mm512_sqrt_ps as a masked form: GCC 12 warns of an uninitialised value inside the plain one.
ANVIL_TARGET_AVX512 inline __m512 sqrt16(__m512 x) { return _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xFFFF), x); }
ANVIL_TARGET_AVX512 inline void adam_avx512(float* __restrict w, float* __restrict m, float* __restrict v,
                                            const float* __restrict g, std::int64_t n, float b1, float b2,
                                            float c1, float c2, float decay, float sqrt_bc2, float eps, float step) {
  ANVIL_ADAM_BODY(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_mul_ps,
                  _mm512_div_ps, sqrt16, 16)
}
inline void adam_baseline(float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict g,
                          std::int64_t n, float b1, float b2, float c1, float c2, float decay, float sqrt_bc2,
                          float eps, float step) {
  ANVIL_ADAM_BODY(__m128, _mm_set1_ps, _mm_loadu_ps, _mm_storeu_ps, _mm_add_ps, _mm_mul_ps, _mm_div_ps,
                  _mm_sqrt_ps, 4)
}
#else
inline void adam_baseline(float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict g,
                          std::int64_t n, float b1, float b2, float c1, float c2, float decay, float sqrt_bc2,
                          float eps, float step) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * b1 + gi * c1;
    const float vi = v[i] * b2 + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay + step * (mi / (std::sqrt(vi) / sqrt_bc2 + eps));
  }
}
#endif
#undef ANVIL_ADAM_BODY
}  // namespace detail

inline void adam(float* w, float* m, float* v, const float* g, std::int64_t n, float b1, float b2, float c1, float c2,
                 float decay, float sqrt_bc2, float eps, float step) {
#if ANVIL_SIMD_X86
  if (avx512()) return detail::adam_avx512(w, m, v, g, n, b1, b2, c1, c2, decay, sqrt_bc2, eps, step);
#endif
  detail::adam_baseline(w, m, v, g, n, b1, b2, c1, c2, decay, sqrt_bc2, eps, step);
}

namespace detail {
// dst [cols, rows] = src [rows, cols]^T over the block of rows [r0, r1) and columns [c0, c1).
inline void transpose_part(float* __restrict dst, const float* __restrict src, std::int64_t rows, std::int64_t cols,
                           std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t c = c0; c < c1; ++c)
    for (std::int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
}
inline void transpose_baseline(float* __restrict dst, const float* __restrict src, std::int64_t rows,
                               std::int64_t cols) {
  constexpr std::int64_t kB = 8;
  for (std::int64_t r = 0; r < rows; r += kB)
    for (std::int64_t c = 0; c < cols; c += kB)
      transpose_part(dst, src, rows, cols, r, std::min(r + kB, rows), c, std::min(c + kB, cols));
}
#if ANVIL_SIMD_X86
// 8x8 blocks in registers: eight rows in, two rounds of unpacks and shuffles, eight
// columns out (the usual AVX transpose); the ragged edges as in the baseline.
ANVIL_TARGET_AVX512 inline void transpose_avx512(float* __restrict dst, const float* __restrict src,
                                                 std::int64_t rows, std::int64_t cols) {
  const std::int64_t rf = rows / 8 * 8, cf = cols / 8 * 8;
  for (std::int64_t r = 0; r < rf; r += 8)
    for (std::int64_t c = 0; c < cf; c += 8) {
      const float* s = src + r * cols + c;
      const __m256 a0 = _mm256_loadu_ps(s), a1 = _mm256_loadu_ps(s + cols), a2 = _mm256_loadu_ps(s + 2 * cols),
                   a3 = _mm256_loadu_ps(s + 3 * cols), a4 = _mm256_loadu_ps(s + 4 * cols),
                   a5 = _mm256_loadu_ps(s + 5 * cols), a6 = _mm256_loadu_ps(s + 6 * cols),
                   a7 = _mm256_loadu_ps(s + 7 * cols);
      const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
      const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
      const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
      const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = dst + c * rows + r;
      _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(d + rows, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(d + 2 * rows, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(d + 3 * rows, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(d + 4 * rows, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(d + 5 * rows, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(d + 6 * rows, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(d + 7 * rows, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  if (cf < cols) transpose_part(dst, src, rows, cols, 0, rf, cf, cols);
  if (rf < rows) transpose_part(dst, src, rows, cols, rf, rows, 0, cols);
}
#endif
}  // namespace detail

/// dst [cols, rows] = src [rows, cols]^T (the buffers must not overlap).
inline void transpose(float* __restrict dst, const float* __restrict src, std::int64_t rows, std::int64_t cols) {
#if ANVIL_SIMD_X86
  if (avx512()) return detail::transpose_avx512(dst, src, rows, cols);
#endif
  detail::transpose_baseline(dst, src, rows, cols);
}

}  // namespace anvil::simd
// ---- end <anvil/core/simd.hpp> ----

namespace anvil {

/// What the running process uses for BLAS.
struct BlasInfo {
  std::string library;  ///< path of the libblas in use, from /proc/self/maps ("" if unknown)
  std::string core;     ///< OpenBLAS's kernel family ("Haswell", "SkylakeX", ...), "" otherwise
  bool openblas = false;
  bool reference = false;  ///< Netlib's reference BLAS: about 10x slower matrix products
};

/// Inspects the BLAS loaded into this process.
inline BlasInfo blas_info() {
  BlasInfo info;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libopenblas") != std::string::npos) info.openblas = true;
    if (path.find("libblas.so") != std::string::npos && info.library.empty()) info.library = path;
  }
  if (!info.library.empty() && info.library.find("openblas") == std::string::npos &&
      info.library.find("/blas/") != std::string::npos)
    info.reference = true;
  using corename_fn = char* (*)();
  if (auto fn = reinterpret_cast<corename_fn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    info.openblas = true;
    if (const char* c = fn()) info.core = c;
  }
  return info;
}

/// True when the CPU runs AVX-512 (the F, BW, DQ and VL subsets OpenBLAS's SkylakeX kernels use).
inline bool cpu_has_avx512() { return simd::avx512(); }

/// OpenBLAS kernel families that already use AVX-512.
inline bool is_avx512_core(const std::string& core) {
  for (const char* k : {"SkylakeX", "skylakex", "Cooperlake", "cooperlake", "SapphireRapids",
                        "sapphirerapids", "Zen4", "zen4"})
    if (core.find(k) != std::string::npos) return true;
  return false;
}

/// Restarts this program (same arguments) with OPENBLAS_CORETYPE=SkylakeX when OpenBLAS
/// chose non-AVX-512 kernels on an AVX-512 CPU; returns normally in every other case,
/// including when OPENBLAS_CORETYPE is already set. Call first thing in main (before any
/// threads start); `parse_config(argc, argv)` does.
inline void prefer_fast_blas(int argc, char** argv) {
  if (argc < 1 || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const BlasInfo b = blas_info();
  if (!b.openblas || b.core.empty() || is_avx512_core(b.core) || !cpu_has_avx512()) return;
  std::fprintf(stderr,
               "anvil: OpenBLAS chose its %s kernels on this AVX-512 CPU; restarting with "
               "OPENBLAS_CORETYPE=SkylakeX for faster matrix products (set OPENBLAS_CORETYPE "
               "yourself to choose)\n",
               b.core.c_str());
  std::fflush(stderr);
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  ::execv("/proc/self/exe", argv);
  // exec failed: carry on with the kernels we have.
}

namespace blas {

/// The Fortran BLAS single-precision matrix product (column-major).
using sgemm_fn = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                          const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                          const float* beta, float* c, const int* ldc);

/// The BLAS `sgemm_` of this process: the one Torch loaded (Debian's libtorch links
/// libblas.so.3), else OpenBLAS or the system BLAS opened here; null when there is none
/// (`gemm` then computes with plain loops).
inline sgemm_fn sgemm() {
  static const sgemm_fn fn = [] {
    if (void* f = ::dlsym(RTLD_DEFAULT, "sgemm_")) return reinterpret_cast<sgemm_fn>(f);
    for (const char* lib : {"libopenblas.so.0", "libblas.so.3"})
      if (void* h = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL))
        if (void* f = ::dlsym(h, "sgemm_")) return reinterpret_cast<sgemm_fn>(f);
    return sgemm_fn{nullptr};
  }();
  return fn;
}

/// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (`trans_a`,
/// `trans_b`); lda, ldb, ldc are the row strides of A, B and C as stored.
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (const sgemm_fn f = sgemm()) {
    // Row-major C is column-major C^T = op(B)^T op(A)^T: swap the operands.
    const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
    const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
    f(&tb, &ta, &M, &N, &K, &alpha, b, &lb, a, &la, &beta, c, &lc);
    return;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) ci[j] = beta == 0.f ? 0.f : beta * ci[j];
    for (std::int64_t p = 0; p < k; ++p) {
      const float aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
      if (trans_b)
        for (std::int64_t j = 0; j < n; ++j) ci[j] += aip * b[j * ldb + p];
      else
        for (std::int64_t j = 0; j < n; ++j) ci[j] += aip * b[p * ldb + j];
    }
  }
}

/// Whether row-major C [m, n] = A B^T (inner dimension k) runs faster as A (B^T) with B^T
/// copied out first. OpenBLAS's AVX-512 kernel families (0.3's `sgemm_small_kernel_permit`)
/// compute A B^T, column-major "TN", with their small-matrix kernel only when m n <= 1200
/// and k >= 32, else with the packed general kernel (a pass zeroing C, both operands
/// packed); A (B^T), "NN", takes the small-matrix kernel up to 1e6 multiply-adds. Between
/// the two the copy pays. Measured on a 64-wide layer with `simd::transpose` as the copy
/// (benchmarks/transposed_gemm.cpp): 9.3 -> 7.6 us at m = 100; 1.10 -> 0.66 us for a
/// first layer with k = 3; even at m = 256 (past 1e6). Below m = 8 the gain is mixed
/// (0.12 against 0.13 us at m = 1, k = 3), so the plain product stays. Never with another
/// BLAS or OpenBLAS's other kernels.
inline bool transposed_copy_pays(std::int64_t m, std::int64_t n, std::int64_t k) {
  static const bool small_kernels = [] {
    if (sgemm() == nullptr) return false;
    const BlasInfo b = blas_info();
    return b.openblas && is_avx512_core(b.core);
  }();
  const double mnk = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return small_kernels && m >= 8 && mnk <= 1e6 && (m * n > 1200 || k < 32);
}

}  // namespace blas

}  // namespace anvil
// ---- end <anvil/core/blas.hpp> ----
// ---- begin <anvil/core/concepts.hpp> ----
/// @file
/// The policy kinds as concepts, built from small named rungs so that a compiler
/// diagnostic names the missing piece, and the rules for combining them in a Trainer.
/// Besides the four kinds a Trainer is written with (Algorithm, Buffer, Parallelism,
/// Precision), a Trainer runs a Loop, chosen from the algorithm's data regime
/// (train/loops/); the rungs below named after a loop say what that loop uses.
///
/// Light header: no torch beyond the scalar types. Tensor-valued members are checked
/// through forward declarations, so including this costs almost nothing.

#include <c10/core/Device.h>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// ---- begin <anvil/core/param.hpp> ----
/// @file
/// Typed, self-describing configuration fields.
///
/// A policy's `Config` is a plain aggregate whose fields are `Param`s. Each `Param` carries
/// its key, its help text and its validation rule in its type, so `config.hpp` can walk a
/// config with Boost.PFR and derive the command line, YAML files, `--help`, printing,
/// hashing and validation from the struct alone, with no hand-kept list of keys:
///
///     struct Config {
///       Param<int, "batch_size", "samples per gradient step", at_least(1)> batch_size{256};
///       Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
///     };
///     Config c{.batch_size = 512};    // designated initializers work
///     int b = c.batch_size;           // reads like the value
///
/// Light header: standard library only.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace anvil {

/// A string usable as a template argument (`Param<int, "batch_size", ...>`).
template <std::size_t N>
struct FixedString {
  char data[N]{};
  constexpr FixedString(const char (&s)[N]) noexcept { std::copy_n(s, N, data); }  // NOLINT
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {data, N - 1}; }
  constexpr operator std::string_view() const noexcept { return view(); }  // NOLINT
};

/// A validation rule for numbers: `lo <= x <= hi`, either end open or unbounded.
/// Written as a template argument, so the rule lives in the field's type.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  [[nodiscard]] constexpr bool contains(double x) const noexcept {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  [[nodiscard]] constexpr bool bounded() const noexcept {
    return lo != -std::numeric_limits<double>::infinity() ||
           hi != std::numeric_limits<double>::infinity();
  }
};

/// No constraint beyond the type.
inline constexpr Range any_value{};
/// `x >= lo`.
constexpr Range at_least(double lo) noexcept { return Range{.lo = lo}; }
/// `x > lo`.
constexpr Range greater_than(double lo) noexcept { return Range{.lo = lo, .lo_open = true}; }
/// `lo <= x <= hi`.
constexpr Range in_range(double lo, double hi) noexcept { return Range{.lo = lo, .hi = hi}; }
/// `lo < x <= hi`.
constexpr Range in_range_open_low(double lo, double hi) noexcept {
  return Range{.lo = lo, .hi = hi, .lo_open = true};
}
/// `x > 0`.
inline constexpr Range positive = greater_than(0.0);

/// Names of an enum's values, for configs: declare next to the enum
///     constexpr auto enum_names(LrScaling) { return std::array<std::string_view, 3>{...}; }
/// and found by argument-dependent lookup. Value i is named `enum_names(E{})[i]`.
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) };
  { enum_names(e)[0] } -> std::convertible_to<std::string_view>;
};

namespace detail {
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
}  // namespace detail

/// Value types a `Param` may hold.
template <class T>
concept ParamScalar = std::same_as<T, bool> || std::integral<T> || std::floating_point<T> ||
                      std::same_as<T, std::string> || NamedEnum<T>;
template <class T>
concept ParamValue = ParamScalar<T> ||
                     (detail::is_vector<T>::value && ParamScalar<typename T::value_type> &&
                      !std::same_as<typename T::value_type, bool>);

/// One configuration field: a value of type `T` with its key, help and rule in its type.
/// For vectors the rule applies to each element.
template <ParamValue T, FixedString Name, FixedString Help, Range Rule = any_value>
struct Param {
  using value_type = T;
  static constexpr std::string_view name = Name.view();
  static constexpr std::string_view help = Help.view();
  static constexpr Range rule = Rule;

  T value{};

  constexpr Param() = default;
  constexpr Param(T v) : value(std::move(v)) {}  // NOLINT: implicit, so `.x = 3` works
  constexpr Param(const char* s)                 // NOLINT: `.device = "cpu"`
    requires std::same_as<T, std::string>
      : value(s) {}
  template <class U>
  constexpr Param(std::initializer_list<U> l)  // `.hidden = {256, 256}`
    requires detail::is_vector<T>::value && std::convertible_to<U, typename T::value_type>
      : value(l.begin(), l.end()) {}

  constexpr operator const T&() const noexcept { return value; }  // NOLINT
  constexpr const T& operator*() const noexcept { return value; }
  constexpr T& operator*() noexcept { return value; }
  constexpr const T* operator->() const noexcept { return &value; }
  constexpr Param& operator=(T v) {
    value = std::move(v);
    return *this;
  }
  template <class U>
  constexpr Param& operator=(std::initializer_list<U> l)
    requires detail::is_vector<T>::value && std::convertible_to<U, typename T::value_type>
  {
    value.assign(l.begin(), l.end());
    return *this;
  }
  constexpr Param& operator=(const char* s)
    requires std::same_as<T, std::string>
  {
    value = s;
    return *this;
  }
  friend constexpr bool operator==(const Param& a, const Param& b) { return a.value == b.value; }
};

/// A named group of fields inside a config: `Section<"actor", ActorConfig> actor;` gives keys
/// `actor.<field>`. The Trainer's config is a struct of sections, one per policy.
template <FixedString Name, class Cfg>
struct Section {
  static constexpr std::string_view name = Name.view();
  using config_type = Cfg;
  Cfg value{};

  constexpr const Cfg* operator->() const noexcept { return &value; }
  constexpr Cfg* operator->() noexcept { return &value; }
  constexpr const Cfg& operator*() const noexcept { return value; }
  constexpr Cfg& operator*() noexcept { return value; }
};

namespace detail {
template <class T> struct is_param : std::false_type {};
template <class T, FixedString N, FixedString H, Range R>
struct is_param<Param<T, N, H, R>> : std::true_type {};
template <class T> struct is_section : std::false_type {};
template <FixedString N, class C> struct is_section<Section<N, C>> : std::true_type {};
}  // namespace detail

/// `T` is a `Param<...>`.
template <class T>
concept IsParam = detail::is_param<std::remove_cvref_t<T>>::value;
/// `T` is a `Section<...>`.
template <class T>
concept IsSection = detail::is_section<std::remove_cvref_t<T>>::value;

}  // namespace anvil
// ---- end <anvil/core/param.hpp> ----
// ---- begin <anvil/core/state.hpp> ----
/// @file
/// The state protocol: how every part of a run that must survive a restart, or be the same
/// on every rank, writes and reads itself; and `StateSections`, the named list of those
/// parts that checkpoints, the replay buffer's file, DDP's start-up broadcast and the
/// ranks' in-sync check all walk. Light header.
///
/// A part is `Stateful` when it has three members:
///
///     void save(BinaryWriter& w) const;   // writes its state
///     Saved read(BinaryReader& r);        // reads what save wrote and checks it against
///                                         // this object (sizes, names); changes NOTHING
///     void restore(Saved s);              // applies what read returned; cannot fail
///
/// Splitting read from restore is what makes a load all-or-nothing: a checkpoint reads
/// every section, then checks the file's checksum, and only then restores any of them, so
/// a bad file leaves the run exactly as it was.
///
/// A file (or a message between ranks) holds sections as a table: their count, then for
/// each its name, its bytes and their length. Reading names the section that is unknown,
/// missing, given twice or of the wrong length, and every message from inside a section
/// says which section it was.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ---- begin <anvil/core/binary_io.hpp> ----
/// @file
/// Binary files that are replaced atomically and read back with checks: `BinaryWriter`
/// writes next to the target and renames over it only when everything is written and
/// flushed, so a crash or kill mid-save leaves the previous file intact; `BinaryReader`
/// names the file and the field when a file is short, foreign, from another shape or
/// damaged. Every file ends with a CRC-32C of all bytes before it, which the reader checks
/// in `finish`: a loader reads into temporaries, calls `finish`, and only then replaces
/// its state, so a corrupted file changes nothing. Light header.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <fcntl.h>

// ---- begin <anvil/core/detail/crc32c.hpp> ----
/// @file
/// CRC-32C (Castagnoli), the checksum anvil's binary files (buffers, checkpoints) end with,
/// so a file damaged on disk or in transit is refused instead of silently loaded. It is
/// computed as the bytes stream through, at memory speed where the CPU has SSE4.2's crc32
/// instruction (chosen at run time: the build stays baseline x86-64), and with a table
/// elsewhere. Light header.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANVIL_CRC32C_X86 1
#include <immintrin.h>
#endif

namespace anvil::detail {

/// A running CRC-32C: `update` with each piece, `value` at the end. Same result however
/// the bytes are split.
class Crc32c {
 public:
  void update(const void* data, std::size_t n) noexcept { crc_ = impl()(crc_, static_cast<const unsigned char*>(data), n); }
  /// The checksum of everything passed to `update` so far.
  [[nodiscard]] std::uint32_t value() const noexcept { return ~crc_; }

  /// The table-driven version, whatever the CPU (the tests compare both).
  static std::uint32_t portable(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
    static const auto table = [] {
      std::array<std::uint32_t, 256> t{};
      for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected polynomial
        t[i] = c;
      }
      return t;
    }();
    for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc;
  }

 private:
  using Fn = std::uint32_t (*)(std::uint32_t, const unsigned char*, std::size_t) noexcept;

#if defined(ANVIL_CRC32C_X86)
  __attribute__((target("sse4.2"))) static std::uint32_t hardware(std::uint32_t crc, const unsigned char* p,
                                                                  std::size_t n) noexcept {
    std::uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      c = _mm_crc32_u64(c, w);
    }
    auto c32 = static_cast<std::uint32_t>(c);
    for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
    return c32;
  }
#endif

  static Fn impl() noexcept {
#if defined(ANVIL_CRC32C_X86)
    static const Fn f = __builtin_cpu_supports("sse4.2") ? &hardware : &portable;
    return f;
#else
    return &portable;
#endif
  }

  std::uint32_t crc_ = 0xFFFFFFFFu;
};

}  // namespace anvil::detail
// ---- end <anvil/core/detail/crc32c.hpp> ----
// ---- begin <anvil/core/error.hpp> ----
/// @file
/// anvil's exception types. Light header.
///
/// Every error anvil raises derives from `anvil::Error` and names what is at fault (the
/// field, file, rank or env). `install_error_handler()` (called by `parse_config`) turns
/// an uncaught `anvil::Error` into a one-line message and a non-zero exit instead of an
/// abort, so bad input never looks like a crash.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

namespace anvil {

/// Base of every anvil error. `exit_code()` is what the process exits with when the
/// error is not caught.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  [[nodiscard]] virtual int exit_code() const noexcept { return 1; }
  /// The word before the message when the error ends the program ("error: ...").
  [[nodiscard]] virtual const char* label() const noexcept { return "error"; }
};

/// Bad configuration: an unknown key, a wrong type, a value out of range, a malformed
/// file. Exit status 2, as for any command-line usage error.
class ConfigError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 2; }
};

/// A requested device or feature that this build or machine does not have.
class DeviceError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 2; }
};

/// Whether the translation unit that calls this was compiled with optimisation (anvil is
/// header-only: the user's program decides). Runs warn when it was not.
[[nodiscard]] constexpr bool compiled_optimised() noexcept {
#if defined(__OPTIMIZE__)
  return true;
#else
  return false;
#endif
}

/// "nan", "inf" or "-inf": how an error names a non-finite value it found.
[[nodiscard]] inline const char* non_finite_name(double v) noexcept {
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

namespace detail {
[[noreturn]] inline void terminate_with_message() {
  std::fflush(stdout);
  if (auto p = std::current_exception()) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: %s\n", e.label(), e.what());
      std::fflush(stderr);
      std::_Exit(e.exit_code());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    } catch (...) {
    }
  }
  std::fputs("error: terminated by an unknown exception\n", stderr);
  std::abort();
}
}  // namespace detail

/// Make uncaught exceptions end the program with `error: <message>` on stderr and the
/// error's exit code (2 for configuration errors, 1 otherwise), not an abort and a core
/// dump. Idempotent.
inline void install_error_handler() { std::set_terminate(&detail::terminate_with_message); }

}  // namespace anvil
// ---- end <anvil/core/error.hpp> ----

namespace anvil {

class BinaryWriter {
 public:
  /// Starts writing `path` (into `path` + ".tmp" until `commit`), with a format tag.
  BinaryWriter(std::filesystem::path path, const std::string& format)
      : path_(std::move(path)), tmp_(path_.string() + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw Error("cannot write '" + tmp_ + "' (does its directory exist?)");
    string(format);
  }
  /// Writes into memory instead of a file (`take_bytes()` ends it): the same format, checksum
  /// included, e.g. to send state from one rank to the others.
  static BinaryWriter in_memory(const std::string& format) { return BinaryWriter(format); }
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;
  ~BinaryWriter() {
    if (f_) {  // not committed: drop the partial file, keep the old one
      std::fclose(f_);
      if (!memory_) std::remove(tmp_.c_str());
    }
    std::free(mem_);
  }

  /// The file being written ("memory" for an in-memory writer), for messages.
  [[nodiscard]] std::string target() const { return memory_ ? std::string("memory") : path_.string(); }

  /// Ends an `in_memory` writer: its bytes, checksum appended.
  [[nodiscard]] std::vector<std::uint8_t> take_bytes() {
    const std::uint32_t crc = crc_.value();
    raw(&crc, sizeof crc);
    std::fclose(f_);  // sets mem_ and mem_size_
    f_ = nullptr;
    return std::vector<std::uint8_t>(reinterpret_cast<std::uint8_t*>(mem_),
                                     reinterpret_cast<std::uint8_t*>(mem_) + mem_size_);
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  void value(const T& v) { bytes(&v, sizeof v); }
  void string(const std::string& s) {
    value<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void bytes(const void* p, std::size_t n) {
    raw(p, n);
    crc_.update(p, n);
  }

  /// Bytes written so far (the format tag included).
  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }

  /// Appends the checksum, flushes to disk and renames over the target; then syncs the
  /// directory, so the rename itself survives a power cut.
  void commit() {
    const std::uint32_t crc = crc_.value();
    raw(&crc, sizeof crc);
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) throw Error("writing '" + tmp_ + "' failed (disk full?)");
    std::fclose(f_);
    f_ = nullptr;
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) throw Error("cannot rename '" + tmp_ + "' to '" + path_.string() + "': " + ec.message());
    const auto dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
    if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
  }

 private:
  explicit BinaryWriter(const std::string& format) : tmp_("(memory)"), memory_(true) {
    f_ = ::open_memstream(&mem_, &mem_size_);
    if (!f_) throw Error("cannot open a memory stream");
    string(format);
  }
  void raw(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw Error("writing '" + tmp_ + "' failed (disk full?)");
    written_ += n;
  }

  std::filesystem::path path_;
  std::string tmp_;
  std::FILE* f_ = nullptr;
  detail::Crc32c crc_;
  bool memory_ = false;
  char* mem_ = nullptr;
  std::size_t mem_size_ = 0;
  std::uint64_t written_ = 0;
};

class BinaryReader {
 public:
  /// Opens `path` and checks its format tag.
  BinaryReader(std::filesystem::path path, const std::string& format) : path_(std::move(path)) {
    std::error_code ec;
    if (std::filesystem::is_directory(path_, ec)) throw Error("cannot read '" + path_.string() + "': it is a directory");
    f_ = std::fopen(path_.c_str(), "rb");
    if (!f_) throw Error("cannot read '" + path_.string() + "'");
    size_ = static_cast<std::int64_t>(std::filesystem::file_size(path_, ec));
    if (ec) size_ = INT64_MAX;
    check_tag(format);
  }
  /// Reads what an `in_memory` writer wrote (`take_bytes`); `name` stands for the file in messages.
  BinaryReader(const std::vector<std::uint8_t>& bytes, std::string name, const std::string& format)
      : path_(std::move(name)) {
    if (bytes.empty()) throw Error("'" + path_.string() + "' is empty");
    f_ = ::fmemopen(const_cast<std::uint8_t*>(bytes.data()), bytes.size(), "rb");
    if (!f_) throw Error("cannot open a memory stream");
    size_ = static_cast<std::int64_t>(bytes.size());
    check_tag(format);
  }
  BinaryReader(const BinaryReader&) = delete;
  BinaryReader& operator=(const BinaryReader&) = delete;
  ~BinaryReader() {
    if (f_) std::fclose(f_);
  }


  template <class T>
    requires std::is_trivially_copyable_v<T>
  T value(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string string(const char* what) {
    const auto n = value<std::uint64_t>(what);
    if (n > (1u << 20)) fail(what, "has an implausible length");
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  /// Bytes left to read: a size field read from the file can be checked against it before
  /// anything of that size is allocated (a flipped bit must not ask for gigabytes).
  [[nodiscard]] std::int64_t remaining() const {
    const long at = std::ftell(f_);
    return at < 0 ? INT64_MAX : size_ - static_cast<std::int64_t>(at);
  }
  /// Fails naming `what` unless `n` more bytes are left in the file.
  void expect_available(std::int64_t n, const char* what) {
    if (n < 0 || n > remaining())
      fail(what, "ask for " + std::to_string(n) + " bytes, but the file has " + std::to_string(remaining()) +
                     " left (a corrupted size field, or a truncated file?)");
  }

  void bytes(void* p, std::size_t n, const char* what) {
    if (n && std::fread(p, 1, n, f_) != n) fail(what, "is cut short (truncated file?)");
    crc_.update(p, n);
    consumed_ += n;
  }
  /// Bytes read so far (the format tag included).
  [[nodiscard]] std::uint64_t consumed() const noexcept { return consumed_; }
  /// Names the part of the file being read in every message from here on (e.g. "section
  /// 'algorithm'"); empty for none.
  void set_context(std::string context) { context_ = std::move(context); }
  /// Checks the checksum at the end of the file against the bytes read, and that nothing
  /// follows it. Call it after reading everything and before using what was read.
  void finish() {
    const std::uint32_t computed = crc_.value();
    std::uint32_t stored = 0;
    if (std::fread(&stored, 1, sizeof stored, f_) != sizeof stored) fail("checksum", "is missing (truncated file?)");
    if (stored != computed) fail("checksum", "does not match the contents (corrupted file?)");
    if (std::fgetc(f_) != EOF) fail("end", "is followed by unexpected bytes");
  }
  /// Reads a value and checks it equals `expected`.
  template <class T>
  void expect(const T& expected, const char* what) {
    const T v = value<T>(what);
    if (v != expected) fail(what, "is " + std::to_string(v) + " in the file but " + std::to_string(expected) + " here");
  }
  /// Throws naming the file, the part being read and `what` is wrong with it. When the
  /// bytes after this point do not match the file's checksum, the file is damaged and that
  /// is what the message says (a flipped bit in a size field would otherwise read as a
  /// misleading "wrong size").
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    const std::string where = "'" + path_.string() + "'" + (context_.empty() ? "" : " (" + context_ + ")") + ": ";
    if (!failing_ && f_) {
      failing_ = true;
      if (damaged()) throw Error("'" + path_.string() + "': checksum does not match the contents (corrupted file?); " +
                                 "reading it found: " + what + " " + why);
    }
    throw Error(where + what + " " + why);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  // Whether the rest of the file fails its checksum (the last 4 bytes). Unknown (false)
  // when the file ends too soon to tell: a "cut short" message says more.
  bool damaged() {
    detail::Crc32c crc = crc_;
    std::vector<unsigned char> held;  // the last 4 bytes read, which may be the checksum
    unsigned char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f_)) > 0;) {
      held.insert(held.end(), buf, buf + n);
      if (held.size() > 4) {
        crc.update(held.data(), held.size() - 4);
        held.erase(held.begin(), held.end() - 4);
      }
    }
    if (held.size() < 4) return false;
    std::uint32_t stored = 0;
    std::memcpy(&stored, held.data(), 4);
    return stored != crc.value();
  }

  void check_tag(const std::string& format) {
    std::string tag;
    try {
      tag = string("format tag");
    } catch (const Error&) {
      tag.clear();
    }
    if (tag != format) {
      std::fclose(f_);
      f_ = nullptr;
      throw Error("'" + path_.string() + "' is not an " + format + " file");
    }
  }

  std::filesystem::path path_;
  std::FILE* f_ = nullptr;
  std::int64_t size_ = INT64_MAX;  ///< bytes in the file
  detail::Crc32c crc_;
  std::uint64_t consumed_ = 0;
  std::string context_;
  bool failing_ = false;
};

}  // namespace anvil
// ---- end <anvil/core/binary_io.hpp> ----

namespace anvil {

/// The state protocol (see file comment): `save`, a `read` that changes nothing, `restore`.
template <class T>
concept Stateful = requires(const T& c, T& m, BinaryWriter& w, BinaryReader& r) {
  { c.save(w) };
  { m.restore(m.read(r)) };
};

/// Where a section goes besides checkpoints (which hold every section).
enum class Scope : unsigned {
  /// In checkpoints only: state of this rank (its envs, random streams, episode returns).
  checkpoint = 0,
  /// The same on every rank: rank 0's is sent to the others when a run starts and after it
  /// resumes (the networks, the optimizers, the clock, the schedule's position).
  shared = 1,
  /// Shared, and compared bitwise across ranks at each checkpoint and at the end: the
  /// learned state, which ranks that average the same gradients must hold identically.
  checked = 2,
};

/// The named parts of a run's state (see file comment).
class StateSections {
 public:
  /// What applies a section once every section of a file has been read and checked.
  using Apply = std::function<void()>;

  /// One section: how it writes itself and how it reads itself (changing nothing until the
  /// returned `Apply` runs).
  struct Section {
    std::string name;
    Scope scope = Scope::checkpoint;
    std::function<void(BinaryWriter&)> save;
    std::function<Apply(BinaryReader&)> read;
  };

  /// Adds `part` (which must outlive this list) as section `name`.
  template <Stateful T>
  void add(std::string name, T& part, Scope scope = Scope::checkpoint) {
    T* p = &part;
    add(Section{std::move(name), scope, [p](BinaryWriter& w) { p->save(w); },
                [p](BinaryReader& r) -> Apply {
                  using Saved = std::remove_cvref_t<decltype(p->read(r))>;
                  auto s = std::make_shared<Saved>(p->read(r));
                  return [p, s] { p->restore(std::move(*s)); };
                }});
  }
  /// Adds a section given by its functions.
  void add(Section s) {
    if (s.name.empty()) throw Error("StateSections: a section needs a name");
    for (const auto& x : sections_)
      if (x.name == s.name) throw Error("StateSections: section '" + s.name + "' is added twice");
    sections_.push_back(std::move(s));
  }

  /// The names of the sections that go where `scope` says, in the order they were added
  /// (`Scope::checkpoint`: all of them).
  [[nodiscard]] std::vector<std::string> names(Scope scope = Scope::checkpoint) const {
    std::vector<std::string> out;
    for (const auto& s : sections_)
      if (in(s, scope)) out.push_back(s.name);
    return out;
  }

  /// Writes the sections of `scope` as a table (see file comment).
  [[gnu::cold, gnu::noinline]] void write(BinaryWriter& w, Scope scope = Scope::checkpoint) const {
    w.value(static_cast<std::uint64_t>(names(scope).size()));
    for (const auto& s : sections_) {
      if (!in(s, scope)) continue;
      w.string(s.name);
      const auto start = w.written();
      s.save(w);
      w.value(static_cast<std::uint64_t>(w.written() - start));
    }
  }

  /// Reads a table written by `write(w, scope)`: every section of `scope` exactly once, no
  /// other. Changes nothing; the returned function applies them all. Throws naming the
  /// section at fault.
  [[gnu::cold, gnu::noinline]] [[nodiscard]] Apply read(BinaryReader& r, Scope scope = Scope::checkpoint) const {
    const auto count = r.value<std::uint64_t>("section count");
    if (count > 10'000) r.fail("section count", "is implausible (" + std::to_string(count) + ")");
    const auto expected = names(scope);
    std::vector<std::string> seen;  // in the file's order
    std::vector<Apply> applies;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto name = r.string("section name");
      const Section* s = find(name, scope);
      if (!s) r.fail("section '" + name + "'", "is not a section of this run (it has: " + list(expected) + ")");
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) r.fail("section '" + name + "'", "appears twice");
      seen.push_back(name);
      r.set_context("section '" + name + "'");
      const auto start = r.consumed();
      auto apply = s->read(r);
      const auto length = r.consumed() - start;
      const auto stored = r.value<std::uint64_t>("section length");
      if (stored != length)
        r.fail("its end", "was not where reading it ended (after " + std::to_string(length) +
                              " bytes): the section was written by another version of the program");
      r.set_context("");
      if (apply) applies.push_back(std::move(apply));
    }
    for (const auto& n : expected)
      if (std::find(seen.begin(), seen.end(), n) == seen.end())
        r.fail("section '" + n + "'", "is missing (the file holds: " + list(seen) + ")");
    return [applies = std::move(applies)] {
      for (const auto& a : applies) a();
    };
  }

  [[nodiscard]] bool empty() const noexcept { return sections_.empty(); }

 private:
  static bool in(const Section& s, Scope scope) { return static_cast<unsigned>(s.scope) >= static_cast<unsigned>(scope); }
  const Section* find(const std::string& name, Scope scope) const {
    for (const auto& s : sections_)
      if (s.name == name && in(s, scope)) return &s;
    return nullptr;
  }
  static std::string list(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? "none" : out;
  }

  std::vector<Section> sections_;
};

/// The format tag of a buffer file beside a checkpoint (`run.checkpoint_buffer`), which the
/// offline loop also reads as a dataset: a table (see file comment) holding one section
/// named after the buffer's config section ("buffer", "rollout").
inline constexpr const char* kBufferFileFormat = "anvil Buffer v1";

/// Writes `part` alone to `path` under the format tag `format`, atomically (a crash
/// mid-save leaves the previous file intact).
template <Stateful T>
void save_file(const T& part, const std::filesystem::path& path, const std::string& format) {
  BinaryWriter w(path, format);
  part.save(w);
  w.commit();
}

/// Reads a file `save_file` wrote into `part`'s state, checking all of it (the checksum
/// too); changes nothing until the returned function runs.
template <Stateful T>
[[nodiscard]] StateSections::Apply read_file(T& part, const std::filesystem::path& path, const std::string& format) {
  BinaryReader r(path, format);
  using Saved = std::remove_cvref_t<decltype(part.read(r))>;
  auto s = std::make_shared<Saved>(part.read(r));
  r.finish();
  return [p = &part, s] { p->restore(std::move(*s)); };
}

}  // namespace anvil
// ---- end <anvil/core/state.hpp> ----

namespace at {
class Tensor;
}

namespace anvil {

struct EnvSpec;
struct RunContext;
struct ReplayBatch;
struct RolloutBatch;
struct RolloutAct;
struct StepBatch;
struct RolloutStep;
struct StoragePlan;
struct EpisodicLoop;  // train/loops/episodic.hpp
struct UpdateInfo;
struct PrecisionSettings;
class StepContext;

/// Tags a policy declares with `using policy_kind = anvil::AlgorithmKind;` etc. The kind
/// is declared, not guessed from members, so a type in the wrong slot is named as such.
struct AlgorithmKind {};
struct BufferKind {};
struct ParallelismKind {};
struct PrecisionKind {};
struct LoopKind {};

/// How an action is chosen: sampled for exploration, or the deterministic mode for evaluation.
enum class ActMode { explore, deterministic };

// ---------------------------------------------------------------------------------------
// Rungs shared by all kinds.

/// `P` says it is a policy of kind `Kind`.
template <class P, class Kind>
concept DeclaresKind = requires { typename P::policy_kind; } &&
                       std::same_as<typename P::policy_kind, Kind>;

/// `P` has a nested `Config` aggregate (of `Param`s), default-constructible, whose fields
/// appear under the key prefix `P::config_section` (e.g. "sac").
template <class P>
concept HasConfig = requires {
  typename P::Config;
  { P::config_section } -> std::convertible_to<std::string_view>;
} && std::is_aggregate_v<typename P::Config> && std::default_initializable<typename P::Config>;

/// `P` says whether it learns only from data of its current policy.
template <class P>
concept DeclaresDataRegime = requires {
  { P::on_policy } -> std::convertible_to<bool>;
};

// ---------------------------------------------------------------------------------------
// Algorithm: owns networks, losses and optimizers. Built from the env's spaces, its
// config and the run's context (device, seed); acts on a batch of observations (one row
// per env) and updates from a batch its buffer produces. Its `update` runs the losses
// through a `StepContext`, which owns autocast, loss scaling, gradient all-reduce and the
// optimizer step, so one algorithm serves every precision and parallelism policy.

/// `A` acts on a batch of observations.
template <class A>
concept ActsOnBatches = requires(A& a, const at::Tensor& obs, ActMode mode) {
  { a.act(obs, mode) } -> std::same_as<at::Tensor>;
};

/// `A` names the batch type it learns from and updates from it through a StepContext.
template <class A>
concept UpdatesFromBatches = requires { typename A::Batch; } &&
                             requires(A& a, const typename A::Batch& b, StepContext& ctx) {
                               { a.update(b, ctx) } -> std::same_as<UpdateInfo>;
                             };

/// `P` (a policy of any kind) can be built from the env's spaces, its config and the run's context.
template <class P>
concept ConstructibleFromSpec =
    std::constructible_from<P, const EnvSpec&, const typename P::Config&, const RunContext&>;

/// `P` saves and restores its state through the state protocol (core/state.hpp), so that
/// checkpoints hold it and, for an algorithm, every rank starts from rank 0's.
template <class P>
concept SavesState = Stateful<P>;

/// An algorithm policy (SAC, TD3, PPO, ...).
template <class A>
concept Algorithm = DeclaresKind<A, AlgorithmKind> && HasConfig<A> && DeclaresDataRegime<A> &&
                    ActsOnBatches<A> && UpdatesFromBatches<A> && ConstructibleFromSpec<A> && SavesState<A>;

/// What the off-policy loop needs of its algorithm besides `act` and `update`: how many
/// transitions to sample per update, and the discount its buffer's n-step returns use.
template <class A>
concept OffPolicyAlgorithm = Algorithm<A> && !A::on_policy && requires(const A& a) {
  { a.batch_size() } -> std::convertible_to<std::int64_t>;
  { a.discount() } -> std::convertible_to<double>;
};

/// What the on-policy loop needs of its algorithm besides `act` and `update`: an action
/// with its log-probability and value for the rollout, values alone for bootstrapping, the
/// schedule of its epochs and whether to go on after each (PPO's KL early stop lives in
/// `end_epoch`, which may agree with the other ranks through the StepContext), where the
/// run is (for annealing), and its discount (for the rollout's advantages).
template <class A>
concept OnPolicyAlgorithm = Algorithm<A> && A::on_policy &&
                            requires(A& a, const A& ca, const at::Tensor& obs, double progress, StepContext& ctx) {
                              { a.act_for_rollout(obs) } -> std::same_as<RolloutAct>;
                              { a.value(obs) } -> std::same_as<at::Tensor>;
                              { ca.epochs() } -> std::convertible_to<int>;
                              { ca.minibatch_size() } -> std::convertible_to<std::int64_t>;
                              { a.end_epoch(ctx) } -> std::convertible_to<bool>;
                              { a.set_progress(progress) };
                              { ca.discount() } -> std::convertible_to<double>;
                            };

// Optional capabilities: a loop or hook uses them where an algorithm has them, and a
// config field that needs one is refused, naming the field, where it does not.

/// `A` keeps an exponential moving average of its policy's weights (`train.ema_decay`) and
/// can act with it (evaluation, policy.bin).
template <class A>
concept AveragesPolicy = requires(A& a, double decay) {
  { a.ema_update(decay) };
  { a.with_ema_weights([] { return 0; }) } -> std::same_as<int>;
};
/// `A` reports its learning rates by optimizer (TensorBoard `lr/<name>`).
template <class A>
concept ReportsLearningRates = requires(const A& a) {
  { a.learning_rates() } -> std::convertible_to<std::vector<std::pair<std::string, double>>>;
};
/// `A` shows each network's weights as one flat tensor (TensorBoard weight histograms).
template <class A>
concept ExposesWeights = requires(const A& a) {
  { a.flat_parameters() } -> std::convertible_to<std::vector<std::pair<std::string, at::Tensor>>>;
};
/// `A` writes its policy alone for `load_policy` (policy.bin beside each checkpoint).
template <class A>
concept ExportsPolicy = requires(const A& a, BinaryWriter& w) {
  { a.save_policy(w) };
};

// ---------------------------------------------------------------------------------------
// Buffer: preallocated storage of transitions. Takes one step of N envs in one call and
// produces the batch type its algorithms learn from. Replay buffers sample at random; a
// rollout buffer hands out its whole rollout in minibatches and is cleared each iteration.

/// `B` names the batch type it produces and reports its fill level.
template <class B>
concept ProducesBatches = requires(const B& b) {
  typename B::Batch;
  { b.size() } -> std::convertible_to<std::int64_t>;
  { b.capacity() } -> std::convertible_to<std::int64_t>;
};

/// `B` names the step type a loop hands it (`StepBatch` for replay buffers, `RolloutStep`
/// for rollouts) and stores one step of every env with `add`.
template <class B>
concept StoresSteps = requires { typename B::Step; } && requires(B& b, const typename B::Step& s) {
  { b.add(s) };
};

/// `B` is told the plan of the run before it starts (and again after a resume): envs per
/// rank, the run's length, the algorithm's discount (see `StoragePlan`).
template <class B>
concept PlansStorage = requires(B& b, const StoragePlan& plan) {
  { b.plan(plan) };
};

/// A buffer policy (UniformBuffer, PrioritizedBuffer, RolloutBuffer).
template <class B>
concept Buffer = DeclaresKind<B, BufferKind> && HasConfig<B> && DeclaresDataRegime<B> &&
                 ProducesBatches<B> && StoresSteps<B> && PlansStorage<B> && ConstructibleFromSpec<B> &&
                 SavesState<B>;

/// A replay buffer: samples a batch of `n` stored transitions at random.
template <class B>
concept ReplayBuffer = Buffer<B> && requires(B& b, std::int64_t n) {
  { b.sample(n) } -> std::same_as<typename B::Batch>;
};

/// A replay buffer that can be filled from a file `save(path)` wrote (the offline loop's
/// dataset).
template <class B>
concept LoadsDataset = ReplayBuffer<B> && requires(B& b, const std::filesystem::path& p) {
  { b.load(p) };
};

/// A buffer that reads demonstrations in their own format (HDF5), `load(train.dataset)`,
/// again at every start: only its position in them is run state, kept in every checkpoint.
template <class B>
concept ReadsDemonstrations = requires { requires B::reads_demonstrations; };

/// What the on-policy loop needs of its buffer: whether the rollout is full, the
/// advantages computed from the value after its last step, the rollout in minibatches for
/// each epoch, and clearing it for the next.
template <class B>
concept RolloutStorage = Buffer<B> && requires(B& b, const B& cb, const at::Tensor& last_value, std::int64_t n) {
  { cb.full() } -> std::convertible_to<bool>;
  { b.finish(last_value) };
  { b.minibatches(n) };
  { b.clear() };
};

/// A replay buffer that also takes back priorities (e.g. |TD error|) for the sampled rows.
template <class B>
concept PrioritizedReplay = ReplayBuffer<B> &&
                            requires(B& b, const at::Tensor& index, const at::Tensor& priority) {
                              { b.update_priorities(index, priority) };
                            };

// ---------------------------------------------------------------------------------------
// Parallelism: how many processes train together and how they agree. Knows its rank and
// world size, averages gradients (and any learned scalar) across ranks, broadcasts rank 0's
// state at start, and reduces metrics for logging.

/// `P` reports where this process stands in the world.
template <class P>
concept KnowsWorld = requires(const P& p) {
  { p.rank() } -> std::convertible_to<int>;
  { p.world_size() } -> std::convertible_to<int>;
  { p.is_main() } -> std::convertible_to<bool>;
  { P::can_use_cuda } -> std::convertible_to<bool>;
};

/// `P` averages tensors across ranks in place and broadcasts rank 0's tensors.
template <class P>
concept SynchronisesTensors = requires(P& p, std::vector<at::Tensor>& ts) {
  { p.all_reduce_mean(ts) };
  { p.broadcast(ts) };
};

/// `P` sets up its processes explicitly: `P::start_ranks(cfg, device)` (called by
/// `anvil::start` from main, never by a constructor, with the run's `run.device` setting)
/// may make this process the launcher of several ranks;
/// `connect(device)` joins the world once the run's device is known; `device_index()` is
/// the CUDA device this rank uses; `describe()` is one line for the log.
template <class P>
concept SetsUpRanks = requires(P& p, const P& cp, const typename P::Config& cfg, c10::Device device) {
  { P::start_ranks(cfg, std::string_view{}) };
  { p.connect(device) };
  { cp.device_index() } -> std::convertible_to<int>;
  { cp.describe() } -> std::convertible_to<std::string>;
};

/// A parallelism policy that knows how many of its ranks share this node
/// (`world().local_world_size`), so they can share its cores.
template <class P>
concept KnowsLocalWorld = requires(const P& p) {
  { p.world().local_world_size } -> std::convertible_to<int>;
};

/// A parallelism policy (SingleDevice, DDP<N>).
template <class P>
concept Parallelism = DeclaresKind<P, ParallelismKind> && HasConfig<P> && KnowsWorld<P> &&
                      SynchronisesTensors<P> && SetsUpRanks<P>;

// ---------------------------------------------------------------------------------------
// Precision: the numeric types of a step. A type-level description the StepContext turns
// into an autocast scope and, for float16, a dynamic loss scaler.

/// `X` states its compute dtype and whether it scales losses and needs CUDA.
template <class X>
concept DescribesNumerics = requires {
  { X::name } -> std::convertible_to<std::string_view>;
  { X::autocast } -> std::convertible_to<bool>;
  { X::loss_scaling } -> std::convertible_to<bool>;
  { X::needs_cuda } -> std::convertible_to<bool>;
};

/// `X` turns its config into the settings a run applies (autocast, loss scaling, TF32,
/// cuDNN, anomaly detection), so the code that applies them is not a template.
template <class X>
concept HasSettings = requires(const typename X::Config& cfg) {
  { X::settings(cfg) } -> std::same_as<PrecisionSettings>;
};

/// A precision policy (FP32, TF32, BF16, FP16).
template <class X>
concept Precision = DeclaresKind<X, PrecisionKind> && HasConfig<X> && DescribesNumerics<X> && HasSettings<X>;

// ---------------------------------------------------------------------------------------
// Loop: the order of collect, store and update for one data regime (train/loops/). A
// loop declares its kind, its config (the `train` section) and its name; its `Rules<A, B>`
// check, with one sentence each, that the algorithm and buffer have what it uses, and its
// `Runner<A, B>` runs it.

/// A loop policy (OffPolicyLoop, OnPolicyLoop, EpisodicLoop, OfflineLoop, Staged<...>).
template <class L>
concept Loop = DeclaresKind<L, LoopKind> && HasConfig<L> && requires {
  { L::name } -> std::convertible_to<std::string_view>;
};

/// An algorithm may name the loop it trains in (`using loop = anvil::EpisodicLoop;`);
/// otherwise its data regime chooses (train/trainer.hpp, `default_loop`).
template <class A>
concept NamesItsLoop = requires { typename A::loop; } && Loop<typename A::loop>;

// ---------------------------------------------------------------------------------------
// The rules for a Trainer. Each check is guarded by the ones before it, so a bad
// combination yields exactly one sentence: what is wrong; why; what to use instead.

namespace detail {

template <class T>
constexpr int declared_kind() {
  if constexpr (DeclaresKind<T, AlgorithmKind>) return 1;
  else if constexpr (DeclaresKind<T, BufferKind>) return 2;
  else if constexpr (DeclaresKind<T, ParallelismKind>) return 3;
  else if constexpr (DeclaresKind<T, PrecisionKind>) return 4;
  else return 0;
}

template <class T>
constexpr bool on_policy_of() {
  if constexpr (DeclaresDataRegime<T>) return T::on_policy;
  else return false;
}
template <class T>
constexpr bool needs_cuda_of() {
  if constexpr (DescribesNumerics<T>) return T::needs_cuda;
  else return false;
}
template <class T>
constexpr bool can_use_cuda_of() {
  if constexpr (requires { { T::can_use_cuda } -> std::convertible_to<bool>; }) return T::can_use_cuda;
  else return true;
}

/// Whether `T` names the episodic loop as its own (`using loop = anvil::EpisodicLoop;`).
template <class T>
constexpr bool names_episodic_loop() {
  if constexpr (NamesItsLoop<T>) return std::same_as<typename T::loop, EpisodicLoop>;
  else return false;
}

template <class A, class B>
constexpr bool batches_match() {
  if constexpr (requires { typename A::Batch; typename B::Batch; })
    return std::same_as<typename A::Batch, typename B::Batch>;
  else
    return false;
}

}  // namespace detail

/// Checks a Trainer's four policies. `ok` is true when they combine; otherwise exactly one
/// static_assert fires with a sentence that says what to change.
template <class A, class B, class P, class X>
struct TrainerRules {
  static constexpr int ka = detail::declared_kind<A>(), kb = detail::declared_kind<B>(),
                       kp = detail::declared_kind<P>(), kx = detail::declared_kind<X>();
  static constexpr bool slots_ok = ka == 1 && kb == 2 && kp == 3 && kx == 4;

  static constexpr bool swapped = ka == 2 || kb == 1;
  static_assert(!swapped,
                "Trainer<Algorithm, Buffer, ...>: an Algorithm and a Buffer are in each other's "
                "slot; the order is Trainer<Algorithm, Buffer, Parallelism, Precision>, e.g. "
                "Trainer<SAC, UniformBuffer>");
  static_assert(swapped || ka != 0,
                "Trainer's first argument is not an Algorithm: an algorithm declares "
                "`using policy_kind = anvil::AlgorithmKind;`; use SAC, TD3 or PPO");
  static_assert(swapped || (ka != 3 && ka != 4),
                "Trainer's first argument is a Parallelism or Precision policy: the order is "
                "Trainer<Algorithm, Buffer, Parallelism, Precision>");
  static_assert(swapped || ka != 1 || kb == 2,
                "Trainer's second argument is not a Buffer: a buffer declares "
                "`using policy_kind = anvil::BufferKind;`; use UniformBuffer, PrioritizedBuffer "
                "or RolloutBuffer");
  static_assert(!(ka == 1 && kb == 2) || kp == 3,
                "Trainer's third argument is not a Parallelism policy: use SingleDevice or DDP<N>");
  static_assert(!(ka == 1 && kb == 2 && kp == 3) || kx == 4,
                "Trainer's fourth argument is not a Precision policy: use FP32, TF32, BF16 or FP16");

  static constexpr bool a_ok = slots_ok && Algorithm<A>;
  static_assert(!slots_ok || Algorithm<A>,
                "Trainer: the Algorithm declares AlgorithmKind but does not satisfy "
                "anvil::Algorithm; the notes below name the missing member");
  static constexpr bool b_ok = a_ok && Buffer<B>;
  static_assert(!a_ok || Buffer<B>,
                "Trainer: the Buffer declares BufferKind but does not satisfy anvil::Buffer; the "
                "notes below name the missing member");
  static constexpr bool p_ok = b_ok && Parallelism<P>;
  static_assert(!b_ok || Parallelism<P>,
                "Trainer: the Parallelism policy does not satisfy anvil::Parallelism; the notes "
                "below name the missing member");
  static constexpr bool x_ok = p_ok && Precision<X>;
  static_assert(!p_ok || Precision<X>,
                "Trainer: the Precision policy does not satisfy anvil::Precision; the notes below "
                "name the missing member");

  static constexpr bool a_on = detail::on_policy_of<A>(), b_on = detail::on_policy_of<B>();
  static constexpr bool regime_ok = !x_ok || a_on == b_on;
  static constexpr bool a_episodic = detail::names_episodic_loop<A>();
  static_assert(!x_ok || !a_on || b_on || a_episodic,
                "Trainer: the Algorithm is on-policy (it learns only from fresh rollouts of its "
                "current policy) but the Buffer replays old transitions; use RolloutBuffer");
  static_assert(!x_ok || !a_on || b_on || !a_episodic,
                "Trainer: the Algorithm learns from whole episodes of its current policy (the episodic "
                "loop, e.g. COMA) but the Buffer replays old transitions; use EpisodeBuffer");
  static_assert(!x_ok || a_on || !b_on,
                "Trainer: the Algorithm is off-policy (it samples past transitions at random) but "
                "a RolloutBuffer keeps only the current rollout and clears it; use UniformBuffer "
                "or PrioritizedBuffer");

  static constexpr bool batch_ok = !(x_ok && regime_ok) || detail::batches_match<A, B>();
  static_assert(batch_ok,
                "Trainer: the Buffer's Batch type is not the Batch the Algorithm's update takes; "
                "pick a buffer whose batches the algorithm learns from");

  static constexpr bool device_ok = !(x_ok && regime_ok && batch_ok) ||
                                    !detail::needs_cuda_of<X>() || detail::can_use_cuda_of<P>();
  static_assert(device_ok,
                "Trainer: this Precision autocasts to float16, which needs CUDA, but the "
                "Parallelism policy keeps every tensor on the CPU; use BF16 on CPU");

  static constexpr bool ok = x_ok && regime_ok && batch_ok && device_ok;
};

}  // namespace anvil
// ---- end <anvil/core/concepts.hpp> ----
// ---- begin <anvil/core/config.hpp> ----
/// @file
/// The config system: command line, YAML files, `--help`, printing, hashing and validation,
/// all derived from `Param` fields by walking config structs with Boost.PFR.
///
/// Two steps, so that `parse_config(argc, argv)` needs no knowledge of the Trainer type:
///  1. `parse_config` reads the command line and any `--config FILE` into `Args`: an ordered
///     list of `key = value` settings, each remembering where it came from (file:line:column
///     or the command-line argument). Syntax errors (malformed YAML, duplicate keys, a stray
///     argument) are reported here.
///  2. `configure<Cfg>(args)` applies the settings to a typed config: unknown keys (with
///     "did you mean"), wrong types and values out of range are reported with the field and
///     the place they came from.
/// Every error is an `anvil::ConfigError`. Neither step prints, exits or restarts anything:
/// `anvil::start` (train/start.hpp), the one line a main calls first, answers `--help` and
/// `--print-config`, and turns a ConfigError into a one-line message and exit status 2.
///
/// Keys are `section.field` (`sac.batch_size`); a key without a section refers to the `run`
/// section (`--seed=3`, `--device=cuda`). Dashes in keys read as underscores (`--run-dir`).
///
/// Light header: no torch (yaml-cpp and Boost.PFR only).


#include <boost/pfr.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

// ---- begin <anvil/core/command_line.hpp> ----
/// @file
/// The config system's first step (core/config.hpp): the command line and `--config` YAML
/// files read into `Args`, an ordered list of settings that each remember where they came
/// from. Syntax errors (malformed YAML, a key given twice, a stray argument) are reported
/// here. Light header: no torch.

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

// ---- begin <anvil/core/config_values.hpp> ----
/// @file
/// The config system's values (core/config.hpp): a setting before it applies (`Setting`),
/// and per value type how a field reads, prints, quotes as YAML and checks its range,
/// behind a type-erased view of one field (`detail::FieldRef`), found by walking a config
/// struct with Boost.PFR. Light header: no torch.

#include <boost/pfr.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>


namespace anvil {

/// One `key = value` setting before it is applied to a typed config.
struct Setting {
  std::string key;                  ///< dotted key as written, dashes turned to underscores
  std::vector<std::string> values;  ///< one entry for a scalar, one per element for a list
  bool is_list = false;             ///< written as a YAML sequence
  bool bare_flag = false;           ///< `--flag` with no value: means true for a bool field
  std::string origin;               ///< "run.yaml:4:3" or "command line '--x=1'"
  /// A program's own default (a hyperparameter file's block, its default env), not the
  /// user's: `run.smoke`'s small run is applied over these and under the user's settings.
  bool program_default = false;
};

namespace detail {

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

inline std::string normalize_key(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

/// Edit distance with transpositions (optimal string alignment), for "did you mean".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::size_t> d((n + 1) * (m + 1));
  auto at = [&](std::size_t i, std::size_t j) -> std::size_t& { return d[i * (m + 1) + j]; };
  for (std::size_t i = 0; i <= n; ++i) at(i, 0) = i;
  for (std::size_t j = 0; j <= m; ++j) at(0, j) = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
    }
  return at(n, m);
}

/// Shortest text that reads back as the same double.
inline std::string format_double(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general);
  std::string s(buf, end);
  // Keep a marker that this is a float, so YAML readers and humans see 1.0, not 1.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

inline std::string format_range(const Range& r) {
  if (!r.bounded()) return {};
  constexpr double inf = std::numeric_limits<double>::infinity();
  auto num = [](double v) {
    if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<long long>(v));
    return format_double(v);
  };
  if (r.hi == inf) return std::string(r.lo_open ? "> " : ">= ") + num(r.lo);
  if (r.lo == -inf) return std::string(r.hi_open ? "< " : "<= ") + num(r.hi);
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) + (r.hi_open ? ")" : "]");
}

template <class T> std::string type_name();
template <class T>
std::string type_name() {
  if constexpr (std::same_as<T, bool>) return "bool";
  else if constexpr (std::same_as<T, std::string>) return "string";
  else if constexpr (NamedEnum<T>) {
    std::string s;
    for (std::string_view n : enum_names(T{})) {
      if (!s.empty()) s += '|';
      s.append(n);
    }
    return s;
  } else if constexpr (std::integral<T>) return std::is_unsigned_v<T> ? "uint" : "int";
  else if constexpr (std::floating_point<T>) return "float";
  else return "list of " + type_name<typename T::value_type>();
}

template <class T>
std::string format_value(const T& v) {
  if constexpr (std::same_as<T, bool>) return v ? "true" : "false";
  else if constexpr (std::same_as<T, std::string>) return v;
  else if constexpr (NamedEnum<T>) return std::string(enum_names(v)[static_cast<std::size_t>(v)]);
  else if constexpr (std::integral<T>) return std::to_string(v);
  else if constexpr (std::floating_point<T>) return format_double(static_cast<double>(v));
  else {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_value(v[i]);
    return s + "]";
  }
}

/// A YAML scalar that reads back as the same string.
inline std::string yaml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <class T>
std::string format_yaml(const T& v) {
  if constexpr (std::same_as<T, std::string>) return yaml_quote(v);
  else if constexpr (is_vector<T>::value) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_yaml(v[i]);
    return s + "]";
  } else return format_value(v);
}

inline std::string strip_underscores(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_') out += c;
  return out;
}

/// Parses one scalar; on failure returns nullopt and sets `why` (no field name in it).
template <class T>
std::optional<T> parse_scalar(std::string_view text, std::string& why) {
  const std::string s = [&] {
    auto b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
    return b == std::string_view::npos ? std::string() : std::string(text.substr(b, e - b + 1));
  }();
  if constexpr (std::same_as<T, std::string>) {
    return std::string(text);
  } else if constexpr (std::same_as<T, bool>) {
    const std::string l = lower(s);
    if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
    if (l == "false" || l == "no" || l == "off" || l == "0") return false;
    why = "expected a bool (true or false), got '" + s + "'";
    return std::nullopt;
  } else if constexpr (NamedEnum<T>) {
    const auto names = enum_names(T{});
    std::string best;
    std::size_t best_d = SIZE_MAX;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (lower(names[i]) == lower(s)) return static_cast<T>(i);
      if (auto d = edit_distance(lower(s), lower(names[i])); d < best_d) best_d = d, best = names[i];
    }
    why = "expected one of " + type_name<T>() + ", got '" + s + "'";
    if (best_d <= 2) why += "; did you mean '" + best + "'?";
    return std::nullopt;
  } else if constexpr (std::integral<T>) {
    const std::string digits = strip_underscores(s);
    if (std::is_unsigned_v<T> && !digits.empty() && digits.front() == '-') {
      why = "expected a non-negative integer, got '" + s + "'";
      return std::nullopt;
    }
    T v{};
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec == std::errc() && p == digits.data() + digits.size() && !digits.empty()) return v;
    if (ec == std::errc::result_out_of_range) {
      why = "'" + s + "' does not fit in " + type_name<T>();
      return std::nullopt;
    }
    // 1e6 is a common way to write step counts: accept it when it is a whole number.
    double d{};
    auto [pd, ecd] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (ecd == std::errc() && pd == digits.data() + digits.size() && std::isfinite(d) &&
        d == std::floor(d)) {
      if (d >= static_cast<double>(std::numeric_limits<T>::min()) &&
          d <= static_cast<double>(std::numeric_limits<T>::max()))
        return static_cast<T>(d);
      why = "'" + s + "' does not fit in " + type_name<T>();
      return std::nullopt;
    }
    why = std::string("expected ") + (std::is_unsigned_v<T> ? "a non-negative integer" : "an integer") +
          ", got '" + s + "'";
    return std::nullopt;
  } else {
    static_assert(std::floating_point<T>);
    const std::string digits = strip_underscores(s);
    double v{};
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec == std::errc() && p == digits.data() + digits.size() && !digits.empty()) {
      if (!std::isfinite(v)) {
        why = "expected a finite number, got '" + s + "'";
        return std::nullopt;
      }
      return static_cast<T>(v);
    }
    why = "expected a number, got '" + s + "'";
    return std::nullopt;
  }
}

/// Empty when `v` satisfies `rule`, else why not (no field name in it).
template <class T>
std::string check_rule(const T& v, const Range& rule) {
  if constexpr (std::integral<T> || std::floating_point<T>) {
    if constexpr (std::floating_point<T>)
      if (!std::isfinite(v)) return "must be a finite number";
    if (!rule.contains(static_cast<double>(v))) return "must be " + format_range(rule);
    return {};
  } else if constexpr (is_vector<T>::value) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (auto e = check_rule(v[i], rule); !e.empty())
        return "element " + std::to_string(i) + " (" + format_value(v[i]) + ") " + e;
    return {};
  } else {
    return {};
  }
}

/// What can be done with a field's value, by value type: one set of functions per type
/// (int, double, string, ...), shared by every field of that type, so a config's walk
/// costs little to compile however many fields it has.
template <class T>
struct ValueOps {
  /// Sets `*value` from a setting; empty on success, else why not (no field name in it).
  static std::string assign(void* value, const Setting& s) {
    T& target = *static_cast<T*>(value);
    std::string why;
    if constexpr (is_vector<T>::value) {
      using E = typename T::value_type;
      std::vector<std::string> parts;
      if (s.is_list) {
        parts = s.values;
      } else {  // "256,256" or "[256, 256]" from the command line
        std::string_view v = s.values.empty() ? std::string_view() : s.values.front();
        while (!v.empty() && (v.front() == '[' || v.front() == ' ')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ']' || v.back() == ' ')) v.remove_suffix(1);
        while (!v.empty()) {
          auto comma = v.find(',');
          parts.emplace_back(v.substr(0, comma));
          if (comma == std::string_view::npos) break;
          v.remove_prefix(comma + 1);
        }
      }
      T out;
      for (std::size_t i = 0; i < parts.size(); ++i) {
        auto e = parse_scalar<E>(parts[i], why);
        if (!e) return "element " + std::to_string(i) + ": " + why;
        out.push_back(*e);
      }
      target = std::move(out);
      return {};
    } else {
      if (s.is_list) return "expected a single " + type_name<T>() + ", got a list";
      if (s.bare_flag) {
        if constexpr (std::same_as<T, bool>) {
          target = true;
          return {};
        } else {
          return "needs a value (" + type_name<T>() + ")";
        }
      }
      auto v = parse_scalar<T>(s.values.empty() ? std::string_view() : s.values.front(), why);
      if (!v) return why;
      target = std::move(*v);
      return {};
    }
  }
  static std::string format(const void* value) { return format_value(*static_cast<const T*>(value)); }
  static std::string yaml(const void* value) { return format_yaml(*static_cast<const T*>(value)); }
  static std::string check(const void* value, const Range& rule) { return check_rule(*static_cast<const T*>(value), rule); }
};

/// Type-erased view of one field of a config object, built by `fields()`.
struct FieldRef {
  std::string key;  ///< full dotted key
  std::string_view leaf;
  std::string_view help;
  std::string type;
  std::string rule;  ///< e.g. ">= 1", empty when unconstrained
  bool is_bool = false;

  /// Sets the field from `s`; empty string on success, else why not.
  [[nodiscard]] std::string assign(const Setting& s) const { return assign_(value_, s); }
  /// The value as text.
  [[nodiscard]] std::string format() const { return format_(value_); }
  /// The value as a YAML scalar.
  [[nodiscard]] std::string format_yaml() const { return yaml_(value_); }
  /// The rule's violation, or empty.
  [[nodiscard]] std::string check() const { return check_(value_, range_); }

  void* value_ = nullptr;  ///< the Param's value
  Range range_;
  std::string (*assign_)(void*, const Setting&) = nullptr;
  std::string (*format_)(const void*) = nullptr;
  std::string (*yaml_)(const void*) = nullptr;
  std::string (*check_)(const void*, const Range&) = nullptr;
};

template <class T> struct always_false : std::false_type {};

template <class Cfg>
void collect_fields(Cfg& cfg, const std::string& prefix, std::vector<FieldRef>& out) {
  static_assert(std::is_aggregate_v<Cfg>,
                "a config must be an aggregate struct of Param<...> and Section<...> fields");
  boost::pfr::for_each_field(cfg, [&](auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      collect_fields(field.value, prefix + std::string(F::name) + ".", out);
    } else if constexpr (IsParam<F>) {
      using T = typename F::value_type;
      FieldRef r;
      r.key = prefix + std::string(F::name);
      r.leaf = F::name;
      r.help = F::help;
      r.type = type_name<T>();
      r.rule = format_range(F::rule);
      r.is_bool = std::same_as<T, bool>;
      r.value_ = const_cast<std::remove_const_t<T>*>(&field.value);
      r.range_ = F::rule;
      r.assign_ = &ValueOps<T>::assign;
      r.format_ = &ValueOps<T>::format;
      r.yaml_ = &ValueOps<T>::yaml;
      r.check_ = &ValueOps<T>::check;
      out.push_back(std::move(r));
    } else {
      static_assert(always_false<F>::value,
                    "every field of a config must be a Param<T, \"name\", \"help\"> or a "
                    "Section<\"name\", Config>");
    }
  });
}
}  // namespace detail

}  // namespace anvil
// ---- end <anvil/core/config_values.hpp> ----

namespace anvil {

/// The parsed command line: settings in the order they apply (files first, then the
/// command line, later ones override earlier ones), plus the informational flags.
struct Args {
  std::string program = "anvil";
  std::vector<Setting> settings;
  std::vector<std::string> config_files;
  bool help = false;          ///< `--help`: print every field with default and help, exit 0
  bool print_config = false;  ///< `--print-config`: print the resolved config as YAML, exit 0
  bool multirun = false;      ///< `--multirun` (or -m): a sweep over comma-separated values (train/sweep.hpp)
  std::vector<std::string> raw;  ///< the arguments after the program's name, as given
};

namespace detail {

inline std::string origin_prefix(const Setting& s) { return s.origin.empty() ? "" : s.origin + ": "; }

inline void flatten_yaml(const YAML::Node& node, const std::string& prefix, const std::string& file,
                         std::vector<Setting>& out) {
  auto where = [&](const YAML::Node& n) {
    const auto m = n.Mark();
    return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  };
  std::map<std::string, int> seen;  // key -> line where first seen
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary pair, so references into it
    // dangle (AddressSanitizer: stack-use-after-scope). A Node is a cheap handle.
    const YAML::Node k = it->first;
    const YAML::Node v = it->second;
    if (!k.IsScalar())
      throw ConfigError(where(k) + ": keys must be plain names, not lists or mappings");
    const std::string name = normalize_key(k.Scalar());
    if (auto [pos, fresh] = seen.emplace(name, k.Mark().line + 1); !fresh)
      throw ConfigError(where(k) + ": duplicate key '" + prefix + name + "' (first given at line " +
                        std::to_string(pos->second) + ")");
    const std::string key = prefix + name;
    if (v.IsMap()) {
      flatten_yaml(v, key + ".", file, out);
      continue;
    }
    Setting s;
    s.key = key;
    s.origin = where(k);
    if (v.IsNull() || !v.IsDefined()) {
      throw ConfigError(s.origin + ": '" + key + "' has no value");
    } else if (v.IsSequence()) {
      s.is_list = true;
      for (const auto& e : v) {
        if (!e.IsScalar())
          throw ConfigError(where(e) + ": '" + key + "' must be a list of plain values");
        s.values.push_back(e.Scalar());
      }
    } else {
      s.values.push_back(v.Scalar());
    }
    out.push_back(std::move(s));
  }
}

}  // namespace detail

/// Parses YAML text (nested mappings by section, scalars or lists at the leaves) into
/// settings. `name` is used in messages (usually the file name).
inline std::vector<Setting> parse_yaml(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg);
  }
  std::vector<Setting> out;
  if (root.IsNull()) return out;  // an empty file sets nothing
  if (!root.IsMap())
    throw ConfigError(name + ": expected a mapping of sections (e.g. 'sac:' then indented "
                             "'batch_size: 512'), got " +
                      (root.IsSequence() ? "a list" : "a single value"));
  detail::flatten_yaml(root, "", name, out);
  return out;
}

/// Reads a YAML config file into settings; a missing or unreadable file is a ConfigError.
inline std::vector<Setting> load_yaml_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("--config '" + path + "' is a directory; it must name a YAML file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw ConfigError("config file '" + path + "' cannot be opened: " + std::strerror(errno));
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw ConfigError("config file '" + path + "' cannot be read");
  return parse_yaml(text, path);
}

/// Parses a command line: `--config FILE` (repeatable), `--help`, `--print-config`, and
/// overrides as `--key=value`, `--key value`, `key=value` or a bare `--flag` (true).
/// Throws ConfigError on a stray argument or a key given twice.
inline Args parse_args(std::span<const std::string> argv) {
  Args a;
  if (!argv.empty()) {
    a.program = argv[0];
    if (auto slash = a.program.rfind('/'); slash != std::string::npos)
      a.program = a.program.substr(slash + 1);
  }
  std::vector<Setting> cli;
  if (argv.size() > 1) a.raw.assign(argv.begin() + 1, argv.end());
  for (const auto& arg : a.raw) a.multirun = a.multirun || arg == "--multirun" || arg == "-m";
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    const std::string origin = "command line '" + arg + "'";
    if (arg == "--multirun" || arg == "-m") continue;
    if (a.multirun && (arg == "--jobs" || arg.starts_with("--jobs="))) {  // the sweep's (train/sweep.hpp)
      if (arg == "--jobs") ++i;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      continue;
    }
    if (arg == "--print-config" || arg == "--print_config") {
      a.print_config = true;
      continue;
    }
    if (arg == "--config" || arg.starts_with("--config=")) {
      std::string path;
      if (arg == "--config") {
        if (i + 1 >= argv.size()) throw ConfigError(origin + ": --config needs a file name");
        path = argv[++i];
      } else {
        path = arg.substr(9);
      }
      if (path.empty()) throw ConfigError(origin + ": --config needs a file name");
      a.config_files.push_back(path);
      continue;
    }
    Setting s;
    s.origin = origin;
    std::string_view body = arg;
    const bool dashed = body.starts_with("--");
    if (dashed) body.remove_prefix(2);
    const auto eq = body.find('=');
    if (eq != std::string_view::npos) {
      s.key = detail::normalize_key(body.substr(0, eq));
      s.values.emplace_back(body.substr(eq + 1));
    } else if (dashed && !body.empty()) {
      s.key = detail::normalize_key(body);
      // `--key value` unless the next token is another option or override.
      const bool next_is_value =
          i + 1 < argv.size() && argv[i + 1].find('=') == std::string::npos &&
          (!argv[i + 1].starts_with("-") ||
           (argv[i + 1].size() > 1 && (std::isdigit(static_cast<unsigned char>(argv[i + 1][1])) ||
                                       argv[i + 1][1] == '.')));
      if (next_is_value) {
        s.values.push_back(argv[++i]);
        s.origin = "command line '" + arg + " " + argv[i] + "'";
      } else {
        s.bare_flag = true;
        s.values.emplace_back("true");
      }
    } else {
      throw ConfigError(origin + ": unexpected argument; overrides are written key=value or "
                                 "--key=value (run with --help for the keys)");
    }
    if (s.key.empty() || s.key.front() == '.' || s.key.back() == '.')
      throw ConfigError(origin + ": '" + s.key + "' is not a key");
    for (const auto& prev : cli)
      if (prev.key == s.key)
        throw ConfigError(origin + ": '" + s.key + "' is given twice on the command line (also " +
                          prev.origin + ")");
    cli.push_back(std::move(s));
  }
  for (const auto& f : a.config_files) {
    auto file_settings = load_yaml_file(f);
    a.settings.insert(a.settings.end(), file_settings.begin(), file_settings.end());
  }
  a.settings.insert(a.settings.end(), cli.begin(), cli.end());
  return a;
}

/// `parse_args` for `main`'s arguments (throws ConfigError; see `anvil::start` for the
/// line a main calls, which reports it).
inline Args parse_config(int argc, char** argv) {
  std::vector<std::string> v(argv, argv + argc);
  return parse_args(v);
}

}  // namespace anvil
// ---- end <anvil/core/command_line.hpp> ----

namespace anvil {


/// Every field of `cfg`, in declaration order, as type-erased references into `cfg`.
template <class Cfg>
std::vector<detail::FieldRef> fields(Cfg& cfg) {
  std::vector<detail::FieldRef> out;
  detail::collect_fields(cfg, "", out);
  return out;
}

/// Checks every field's rule, then the config's own `validate()` if it has one (for rules
/// across fields). Throws ConfigError naming the field.
template <class Cfg>
void validate(const Cfg& cfg) {
  auto fs = fields(const_cast<Cfg&>(cfg));
  for (const auto& f : fs)
    if (auto why = f.check(); !why.empty())
      throw ConfigError(f.key + " = " + f.format() + " is out of range: " + why);
  boost::pfr::for_each_field(cfg, [](const auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      if constexpr (requires { field.value.validate(); }) field.value.validate();
    }
  });
  if constexpr (requires { cfg.validate(); }) cfg.validate();
}

/// `cfg`, validated (for a member initialiser).
template <class Cfg>
Cfg validated(Cfg cfg) {
  validate(cfg);
  return cfg;
}

namespace detail {
/// `apply_settings` without the final `validate` (a layer of settings among others).
template <class Cfg>
void apply_each(Cfg& cfg, const std::vector<Setting>& settings) {
  auto fs = fields(cfg);
  std::map<std::string, detail::FieldRef*, std::less<>> by_key;
  for (auto& f : fs) by_key[f.key] = &f;
  for (const Setting& s : settings) {
    std::string key = s.key;
    // Keys without a section: run's first, then parallel's (--seed=3, --num-gpus=2).
    if (key.find('.') == std::string::npos)
      for (const char* section : {"run.", "parallel."})
        if (by_key.count(section + key)) {
          key = section + key;
          break;
        }
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      std::string msg = detail::origin_prefix(s) + "unknown key '" + s.key + "'";
      // A section named as a field, e.g. 'sac.batch_size.x'.
      for (const auto& f : fs)
        if (key.starts_with(f.key + ".")) {
          throw ConfigError(msg + "; '" + f.key + "' is a field, not a section");
        }
      const detail::FieldRef* best = nullptr;
      std::size_t best_d = SIZE_MAX;
      const bool qualified = key.find('.') != std::string::npos;
      for (const auto& f : fs) {
        std::size_t d = detail::edit_distance(key, f.key);
        if (!qualified) d = std::min(d, detail::edit_distance(key, f.leaf));
        if (d < best_d) best_d = d, best = &f;
      }
      if (best && best_d <= std::max<std::size_t>(2, key.size() / 4))
        msg += "; did you mean '" + best->key + "'?";
      else
        msg += "; run with --help to list the keys";
      throw ConfigError(msg);
    }
    detail::FieldRef& f = *it->second;
    if (auto why = f.assign(s); !why.empty())
      throw ConfigError(detail::origin_prefix(s) + f.key + ": " + why);
    if (auto why = f.check(); !why.empty())
      throw ConfigError(detail::origin_prefix(s) + f.key + " = " + f.format() +
                        " is out of range: " + why);
  }
}
}  // namespace detail

/// Applies settings to `cfg` in order and validates the result. Throws ConfigError naming
/// the key and where it came from: unknown key (with the nearest known key), wrong type,
/// value out of range.
template <class Cfg>
void apply_settings(Cfg& cfg, const std::vector<Setting>& settings) {
  detail::apply_each(cfg, settings);
  validate(cfg);
}

/// Help for every field of `Cfg`: key, type, default, help and allowed range.
template <class Cfg>
std::string help_text(std::string_view program, const Cfg& defaults = Cfg{}) {
  auto fs = fields(const_cast<Cfg&>(defaults));
  std::ostringstream o;
  o << "usage: " << program
    << " [--config FILE]... [KEY=VALUE | --KEY=VALUE]... [--print-config] [--help]\n\n"
       "Keys without a section refer to 'run' or 'parallel' (--seed=3 is run.seed=3). A YAML file nests\n"
       "keys by section; the command line overrides it.\n";
  std::size_t wk = 0, wt = 0, wd = 0;
  for (const auto& f : fs) {
    wk = std::max(wk, f.key.size());
    wt = std::max(wt, f.type.size());
    wd = std::max(wd, f.format().size());
  }
  wt = std::min<std::size_t>(wt, 14);
  wd = std::min<std::size_t>(wd, 16);
  std::string section;
  for (const auto& f : fs) {
    const auto dot = f.key.rfind('.');
    const std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (sec != section || &f == &fs.front()) {
      section = sec;
      o << "\n" << (sec.empty() ? "options" : sec) << ":\n";
    }
    std::string line = "  " + f.key;
    line.resize(2 + wk + 2, ' ');
    std::string t = f.type;
    t.resize(std::max(t.size(), wt) + 2, ' ');
    std::string d = f.format();
    d.resize(std::max(d.size(), wd) + 2, ' ');
    o << line << t << d << f.help;
    if (!f.rule.empty()) o << " (" << f.rule << ")";
    o << "\n";
  }
  return o.str();
}

/// The config as YAML, nested by section; `parse_yaml` reads it back to the same values.
template <class Cfg>
std::string to_yaml(const Cfg& cfg) {
  auto fs = fields(const_cast<Cfg&>(cfg));
  std::ostringstream o;
  std::vector<std::string> open;  // currently open sections
  for (const auto& f : fs) {
    std::vector<std::string> parts;
    for (std::size_t b = 0, e; b <= f.key.size(); b = e + 1) {
      e = f.key.find('.', b);
      if (e == std::string::npos) e = f.key.size();
      parts.push_back(f.key.substr(b, e - b));
    }
    const std::size_t depth = parts.size() - 1;
    std::size_t common = 0;
    while (common < open.size() && common < depth && open[common] == parts[common]) ++common;
    open.resize(common);
    for (std::size_t i = common; i < depth; ++i) {
      o << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    o << std::string(2 * depth, ' ') << parts.back() << ": " << f.format_yaml() << "\n";
  }
  return o.str();
}

/// `key=value` for every field, in declaration order: the canonical form that is hashed
/// and compared (e.g. when a checkpoint's config differs from the run's).
template <class Cfg>
std::vector<std::pair<std::string, std::string>> flatten(const Cfg& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : fields(const_cast<Cfg&>(cfg))) out.emplace_back(f.key, f.format());
  return out;
}

/// Stable 64-bit hash (FNV-1a) of the canonical `key=value` lines, then of the names of
/// the types a config says it covers (`Cfg::hashed_types()`, a Trainer's policy types): the
/// same config gives the same hash wherever it is computed (a run's files, `--print-config`,
/// checkpoints), on every machine and build by one compiler.
template <class Cfg>
std::uint64_t config_hash(const Cfg& cfg) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::string_view text) {
    for (char c : text) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ull;
    }
  };
  for (const auto& [k, v] : flatten(cfg)) mix(k + "=" + v + "\n");
  if constexpr (requires { Cfg::hashed_types(); })
    for (std::string_view t : Cfg::hashed_types()) mix(t);
  return h;
}

/// `config_hash` as 16 hex digits.
template <class Cfg>
std::string config_hash_hex(const Cfg& cfg) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(config_hash(cfg)));
  return buf;
}

/// Shrinks `cfg` for a run of seconds (`run.smoke`): every section whose config has a
/// `shrink()` shrinks itself. `configure` applies it as a layer of defaults; a config built
/// in code and handed to a Trainer directly calls it itself.
template <class Cfg>
void shrink_for_smoke(Cfg& cfg) {
  boost::pfr::for_each_field(cfg, [](auto& field) {
    using F = std::remove_cvref_t<decltype(field)>;
    if constexpr (IsSection<F>) {
      if constexpr (requires { field.value.shrink(); }) field.value.shrink();
    }
  });
}

/// Builds a `Cfg` from defaults and `args`, in layers, then validates it once: the
/// defaults, the program's own settings (`Setting::program_default`), the small run of
/// `run.smoke` when the settings ask for one, then the user's config files and command line
/// in order. So `--smoke --train.steps=900` runs 900 steps with smoke's short warm-up, and
/// `--print-config` prints what will run. Throws ConfigError on bad input; `--help` and
/// `--print-config` are left to the caller (`anvil::start` answers them).
template <class Cfg>
Cfg configure(const Args& args, Cfg cfg = Cfg{}) {
  std::vector<Setting> program, user;
  for (const auto& s : args.settings) (s.program_default ? program : user).push_back(s);
  detail::apply_each(cfg, program);
  if constexpr (requires { bool(*cfg.run->smoke); }) {
    Cfg asked = cfg;  // whether the user's settings, all applied, ask for a smoke run
    detail::apply_each(asked, user);
    if (*asked.run->smoke) shrink_for_smoke(cfg);
  }
  detail::apply_each(cfg, user);
  validate(cfg);
  return cfg;
}

/// Typed one-step form: `auto cfg = parse_config<MyConfig>(argc, argv);`.
template <class Cfg>
Cfg parse_config(int argc, char** argv) {
  return configure<Cfg>(parse_config(argc, argv));
}

}  // namespace anvil
// ---- end <anvil/core/config.hpp> ----
// ---- begin <anvil/core/context.hpp> ----
/// @file
/// The device policy and the run context every algorithm and buffer is built with: which
/// device, which seed, which rank. `--device cpu|cuda|cuda:N|auto` is resolved here, with a
/// clear error when CUDA is asked for and absent.

#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

// ---- begin <anvil/core/lr_scaling.hpp> ----
/// @file
/// How learning rates follow the batch size and the number of ranks (`train.lr_scaling`).
/// Each algorithm applies the rule to the batch its learning rates were tuned for (SAC's
/// batch, PPO's minibatch), through `RunContext::lr_scale`. Light header.

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace anvil {

/// none: as configured; sqrt: lr * sqrt(batch / base_batch) (Krizhevsky 2014, "One weird
/// trick"; the rule our users' multi-task SAC uses); linear: lr * number of ranks (Goyal et
/// al. 2017, for data-parallel runs whose global batch grows with the ranks).
enum class LrScaling { none, sqrt, linear };
constexpr auto enum_names(LrScaling) {
  return std::array<std::string_view, 3>{"none", "sqrt", "linear"};
}

/// The factor on learning rates tuned for `base_batch` rows per step, for a run taking
/// `batch` rows per step on `world_size` ranks.
[[nodiscard]] inline double lr_scale(LrScaling rule, std::int64_t batch, std::int64_t base_batch, int world_size) {
  switch (rule) {
    case LrScaling::none: return 1.0;
    case LrScaling::sqrt: return std::sqrt(static_cast<double>(batch) / static_cast<double>(base_batch));
    case LrScaling::linear: return static_cast<double>(world_size);
  }
  return 1.0;
}

}  // namespace anvil
// ---- end <anvil/core/lr_scaling.hpp> ----
// ---- begin <anvil/core/random.hpp> ----
/// @file
/// Seeding: one `seed` field gives every random stream of a run (torch, each env, the
/// buffer, exploration) its own independent seed. Light header: no torch.

#include <cstdint>
#include <limits>

namespace anvil {

/// One step of SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mixer. Used to
/// derive well-separated seeds from one user seed.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The random streams of a run. Each gets seeds no other stream gets.
enum class Stream : std::uint64_t { torch = 1, env = 2, eval_env = 3, buffer = 4, exploration = 5 };

/// Seed for stream `s`, instance `index` (env number, rank, ...), derived from `seed`.
[[nodiscard]] constexpr std::uint64_t derive_seed(std::uint64_t seed, Stream s,
                                                  std::uint64_t index = 0) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(s)) + index);
}

/// Small, fast, seedable generator (xoshiro256** by Blackman and Vigna) for envs and
/// buffers. Satisfies std::uniform_random_bit_generator; its state is four words, so it
/// is cheap to save in checkpoints.
class Rng {
 public:
  using result_type = std::uint64_t;
  constexpr explicit Rng(std::uint64_t seed = 0) noexcept { reseed(seed); }

  constexpr void reseed(std::uint64_t seed) noexcept {
    for (auto& w : s_) {
      seed = splitmix64(seed);
      w = seed;
    }
  }
  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }

  constexpr result_type operator()() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform double in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
  /// Uniform double in [lo, hi).
  constexpr double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-64 * n).
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>((*this)()) * n) >> 64);
  }

  /// The generator's state, for checkpoints.
  struct State {
    std::uint64_t s[4];
  };
  [[nodiscard]] constexpr State state() const noexcept { return {{s_[0], s_[1], s_[2], s_[3]}}; }
  constexpr void set_state(const State& st) noexcept {
    for (int i = 0; i < 4; ++i) s_[i] = st.s[i];
  }
  friend constexpr bool operator==(const Rng& a, const Rng& b) noexcept {
    return a.s_[0] == b.s_[0] && a.s_[1] == b.s_[1] && a.s_[2] == b.s_[2] && a.s_[3] == b.s_[3];
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }
  std::uint64_t s_[4]{};
};

}  // namespace anvil
// ---- end <anvil/core/random.hpp> ----

namespace anvil {

/// Where this process runs, how its randomness is seeded and what the run asks of every
/// policy; passed to every policy's constructor so none of them reads global state.
struct RunContext {
  c10::Device device{c10::kCPU};
  std::uint64_t seed = 0;  ///< the run's seed; streams derive their own with derive_seed
  int rank = 0;
  int world_size = 1;
  LrScaling lr_scaling = LrScaling::none;  ///< train.lr_scaling
  std::int64_t base_batch = 256;           ///< train.base_batch: the batch learning rates were tuned for
  int micro_batches = 1;                   ///< train.grad_accumulation: micro-batches per optimizer step

  /// The factor on learning rates for an algorithm taking `batch` rows per gradient step
  /// (see core/lr_scaling.hpp).
  [[nodiscard]] double lr_scale(std::int64_t batch) const noexcept {
    return anvil::lr_scale(lr_scaling, batch, base_batch, world_size);
  }

  /// Seed for stream `s`, instance `index`, distinct across ranks.
  [[nodiscard]] std::uint64_t seed_for(Stream s, std::uint64_t index = 0) const noexcept {
    return derive_seed(seed + 0x1000003ull * static_cast<std::uint64_t>(rank), s, index);
  }
};

/// Turns a device string into a device. "auto" is CUDA device `local_rank` when CUDA is
/// present, else the CPU. Throws DeviceError, naming the field, when CUDA is asked for and
/// this build or machine has none, or the index is out of range.
inline c10::Device resolve_device(const std::string& spec, int local_rank = 0,
                                  const std::string& field = "run.device") {
  const bool cuda_built = at::hasCUDA();
  const long long count = cuda_built ? static_cast<long long>(torch::cuda::device_count()) : 0;
  if (spec == "auto")
    return count > 0 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count))
                     : c10::Device(c10::kCPU);
  if (spec == "cpu") return c10::Device(c10::kCPU);
  if (spec == "cuda" || spec.starts_with("cuda:")) {
    long long index = local_rank;
    if (spec != "cuda") {
      const std::string digits = spec.substr(5);
      if (digits.empty() || digits.size() > 3 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        throw DeviceError(field + "='" + spec + "' is not a device: use cpu, cuda, cuda:N or auto");
      index = std::stoll(digits);
    }
    if (!cuda_built)
      throw DeviceError(field + "='" + spec +
                        "' but this LibTorch is a CPU-only build (no CUDA support); use "
                        "--device=cpu, or build against a CUDA LibTorch");
    if (count == 0)
      throw DeviceError(field + "='" + spec +
                        "' but no CUDA device is visible (check the driver and "
                        "CUDA_VISIBLE_DEVICES); use --device=cpu");
    if (index >= count)
      throw DeviceError(field + "='" + spec + "' but only " + std::to_string(count) +
                        " CUDA device(s) are visible (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw DeviceError(field + "='" + spec + "' is not a device: use cpu, cuda, cuda:N or auto");
}

/// Seeds torch's global generators (CPU and CUDA) for this rank from the run's seed.
/// Envs, buffers and exploration take their own streams from `RunContext::seed_for`.
inline void seed_torch(const RunContext& ctx) { torch::manual_seed(ctx.seed_for(Stream::torch)); }

}  // namespace anvil
// ---- end <anvil/core/context.hpp> ----
// ---- begin <anvil/core/hyperparams.hpp> ----
/// @file
/// Per-env default hyperparameters from a YAML file, like RL Baselines3 Zoo's
/// hyperparameter files: a mapping from env ids to config blocks,
///
///     CartPole-v1:
///       env: {num_envs: 8}
///       ppo: {gamma: 0.98, epochs: 20}
///
/// A program that chooses its env at run time (`--env.id=...`) applies the block of the
/// chosen env first, so `--config` files and the command line still override it, and
/// switching env needs no rebuild. Light header.

#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace anvil {

/// The settings of `env_id`'s block in the hyperparameter file `file` (none when the file
/// has no block for it); a ConfigError naming the file when it cannot be read.
[[nodiscard]] inline std::vector<Setting> hyperparameters(const std::string& file, const std::string& env_id) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::BadFile&) {
    throw ConfigError("hyperparameter file '" + file + "' cannot be read");
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
  if (!root.IsMap()) throw ConfigError("hyperparameter file '" + file + "': expected a mapping from env ids to config blocks");
  const YAML::Node block = root[env_id];
  if (!block) return {};
  YAML::Emitter out;
  out << block;
  return parse_yaml(out.c_str(), file + " [" + env_id + "]");
}

/// `args` with the hyperparameters of its env applied first: the env is the last `env.id`
/// the command line or a `--config` file sets, else `default_env` (then added as
/// `env.id=<default_env>`), marked as the program's defaults (`run.smoke` goes over them).
/// The file is `--hyperparams=FILE` when given (taken out of the settings), else
/// `default_file`.
[[nodiscard]] inline Args with_hyperparameters(Args args, const std::string& default_file, const std::string& default_env) {
  std::string file = default_file, env = default_env;
  bool env_given = false;
  std::vector<Setting> kept;
  for (auto& s : args.settings) {
    if (s.key == "hyperparams") {
      if (s.values.size() != 1 || s.values[0].empty()) throw ConfigError(s.origin + ": --hyperparams needs a file name");
      file = s.values[0];
      continue;
    }
    if (s.key == "env.id" && s.values.size() == 1) env = s.values[0], env_given = true;
    kept.push_back(std::move(s));
  }
  auto settings = hyperparameters(file, env);
  if (!env_given) {
    Setting id;
    id.key = "env.id";
    id.values = {env};
    id.origin = "the program's default env";
    settings.push_back(std::move(id));
  }
  for (auto& s : settings) s.program_default = true;  // `--smoke` goes over them
  settings.insert(settings.end(), std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end()));
  args.settings = std::move(settings);
  return args;
}

}  // namespace anvil
// ---- end <anvil/core/hyperparams.hpp> ----
// ---- begin <anvil/core/memory.hpp> ----
/// @file
/// Memory a run may still take, and the check made before a large allocation: storage that
/// cannot fit is refused with an error naming the field that sized it and both figures,
/// instead of the kernel's OOM killer ending the process without a word. Light header.
///
/// Available memory is the smallest of the machine's `MemAvailable` (/proc/meminfo) and the
/// room left under every cgroup memory limit above this process, which is what a container
/// or a SLURM job gets:
/// - cgroup v2: `memory.max` less `memory.current`, on the process's own cgroup and on each
///   parent up to the hierarchy's root (SLURM and systemd often set the limit on a parent
///   while the leaf says `max`);
/// - cgroup v1: `memory.limit_in_bytes` less `memory.usage_in_bytes`, walked up the same way.
/// Both are read where both exist: systemd's hybrid layout mounts an empty v2 hierarchy (no
/// memory controller) beside the v1 memory controller that holds the limit. Where each
/// hierarchy is mounted comes from /proc/self/mountinfo (the usual places under
/// /sys/fs/cgroup where it cannot be read).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// Bytes a process may still allocate and where the figure comes from.
struct AvailableMemory {
  std::int64_t bytes = INT64_MAX;
  std::string source = "unknown";  ///< e.g. "MemAvailable in /proc/meminfo"
};

namespace detail {
inline std::optional<std::int64_t> read_int_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// A cgroup hierarchy this process is in: where it is mounted and the process's path in it.
struct CgroupPlace {
  std::filesystem::path mount;  ///< the hierarchy's mount point (under the root read from)
  std::string path;             ///< this process's cgroup, relative to the mount
};

/// Undoes mountinfo's octal escapes ("\040" for a space).
inline std::string unescape_mountinfo(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto octal = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

/// The process's memory-limiting cgroups under `root` (which stands for "/"): the v2
/// hierarchy (if the process is in one) and the v1 memory controller's (if mounted).
struct OwnCgroups {
  std::optional<CgroupPlace> v2, v1_memory;
};

inline OwnCgroups own_cgroups(const std::filesystem::path& root) {
  std::optional<std::string> v2_path, v1_path;
  {
    std::ifstream in(root / "proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const auto controllers = line.substr(a + 1, b - a - 1);
      const auto path = line.substr(b + 1);
      if (line.compare(0, a, "0") == 0 && controllers.empty()) v2_path = path;
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');)
        if (c == "memory") v1_path = path;
    }
  }
  // Mount points and mounted roots of the two hierarchies (fields: id parent dev root
  // mountpoint options [optional...] - fstype source superoptions).
  struct Mount {
    std::string root, point;
  };
  std::optional<Mount> v2_mount, v1_mount;
  {
    std::ifstream in(root / "proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::vector<std::string> w;
      for (std::string x; f >> x;) w.push_back(x);
      const auto dash = std::find(w.begin(), w.end(), "-");
      if (w.size() < 5 || dash == w.end() || w.end() - dash < 2) continue;
      const std::string& fstype = *(dash + 1);
      const Mount m{unescape_mountinfo(w[3]), unescape_mountinfo(w[4])};
      if (fstype == "cgroup2" && !v2_mount) v2_mount = m;
      if (fstype == "cgroup" && !v1_mount && dash + 3 < w.end()) {
        std::stringstream opts(*(dash + 3));
        for (std::string o; std::getline(opts, o, ',');)
          if (o == "memory") v1_mount = m;
      }
    }
  }
  const auto place = [&](const std::string& path, const std::optional<Mount>& m,
                         const std::filesystem::path& usual) -> CgroupPlace {
    if (!m) return {usual, path};
    // Without a cgroup namespace a container may mount its own cgroup as the hierarchy's
    // root: /proc/self/cgroup then names the path the mount starts at.
    std::string rel = path;
    if (m->root != "/" && rel.compare(0, m->root.size(), m->root) == 0) rel = rel.substr(m->root.size());
    return {root / std::filesystem::path(m->point).relative_path(), rel};
  };
  OwnCgroups out;
  if (v2_path) {
    const auto usual = std::filesystem::exists(root / "sys/fs/cgroup/cgroup.controllers") ? root / "sys/fs/cgroup"
                                                                                          : root / "sys/fs/cgroup/unified";
    out.v2 = place(*v2_path, v2_mount, usual);
  }
  if (v1_path) out.v1_memory = place(*v1_path, v1_mount, root / "sys/fs/cgroup/memory");
  return out;
}

/// The least room under any limit from `place`'s cgroup up to its hierarchy's root, or
/// nothing where no level sets one. `limit_file` and `usage_file` are the hierarchy's names.
inline std::optional<AvailableMemory> cgroup_room(const CgroupPlace& place, const char* limit_file,
                                                  const char* usage_file) {
  // Levels from the hierarchy's root down to the process's cgroup; a path that is not
  // there (a container shown the host's path) leaves only the mount's own level.
  std::vector<std::filesystem::path> levels{place.mount};
  for (const auto& part : std::filesystem::path(place.path).lexically_normal().relative_path())
    if (!part.empty() && part != "." && part != "..") levels.push_back(levels.back() / part);
  std::error_code ec;
  if (!std::filesystem::is_directory(levels.back(), ec)) levels.resize(1);
  std::optional<AvailableMemory> best;
  for (const auto& dir : levels) {
    const auto limit = read_int_file(dir / limit_file);
    const auto used = read_int_file(dir / usage_file);
    // v1 says "no limit" with a figure near 2^63; v2 says "max".
    if (limit && used && *limit < (std::int64_t{1} << 60)) {
      const std::int64_t room = std::max<std::int64_t>(0, *limit - *used);
      if (!best || room < best->bytes)
        best = AvailableMemory{room, "the cgroup limit " + (dir / limit_file).string() + " less " + usage_file};
    }
  }
  return best;
}
}  // namespace detail

/// What this process may still allocate (see file comment). `root` stands for "/": the
/// files read are `root`/proc/meminfo, `root`/proc/self/cgroup, `root`/proc/self/mountinfo
/// and the cgroup trees they name (tests point it at a made-up tree).
[[nodiscard]] inline AvailableMemory available_memory(const std::filesystem::path& root = "/") {
  AvailableMemory m;
  {
    std::ifstream in(root / "proc/meminfo");
    std::string key;
    std::int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        m = {kb * 1024, "MemAvailable in /proc/meminfo"};
        break;
      }
    }
  }
  const auto own = detail::own_cgroups(root);
  const auto take = [&](const std::optional<AvailableMemory>& room) {
    if (room && room->bytes < m.bytes) m = *room;
  };
  if (own.v2) take(detail::cgroup_room(*own.v2, "memory.max", "memory.current"));
  if (own.v1_memory) take(detail::cgroup_room(*own.v1_memory, "memory.limit_in_bytes", "memory.usage_in_bytes"));
  return m;
}

/// `bytes` as "1.5 GiB", "200 MiB", ...
[[nodiscard]] inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

/// Refuses host storage of `bytes` that cannot fit in the memory available now: a
/// ConfigError naming `field` (what sized it, e.g. "buffer.capacity=200000000"), `what`
/// (e.g. "UniformBuffer's storage") and both figures.
inline void check_fits(std::int64_t bytes, const std::string& field, const std::string& what,
                       const AvailableMemory& available = available_memory()) {
  if (bytes <= available.bytes) return;
  throw ConfigError(field + ": " + what + " needs " + human_bytes(static_cast<double>(bytes)) + ", but " +
                    human_bytes(static_cast<double>(available.bytes)) + " is available (" + available.source +
                    "); lower it or free memory");
}

/// Runs `allocate()`; a failed allocation (std::bad_alloc, or a torch allocation error)
/// becomes an Error naming `what` was being allocated and how large it was.
template <class F>
decltype(auto) allocating(const std::string& what, std::int64_t bytes, F&& allocate) {
  try {
    return std::forward<F>(allocate)();
  } catch (const std::bad_alloc&) {
    throw Error("out of memory allocating " + what + " (" + human_bytes(static_cast<double>(bytes)) + ")");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string m = e.what();
    if (m.find("alloc") == std::string::npos && m.find("memory") == std::string::npos) throw;
    throw Error("out of memory allocating " + what + " (" + human_bytes(static_cast<double>(bytes)) +
                "): " + m.substr(0, m.find('\n')));
  }
}

}  // namespace anvil
// ---- end <anvil/core/memory.hpp> ----
// ---- begin <anvil/core/policy_config.hpp> ----
/// @file
/// `policy_config<P>`: the config section of a policy (algorithm, buffer, loop, parallelism,
/// precision) without the policy's class: its type (`type`) and its name (`section`). A
/// policy declares them as `Config` and `config_section`, which is what the primary template
/// reads; the built-in policies that `anvil::compiled::Trainer` names also specialise it in
/// a light header next to their config, so a Trainer's config can be built in a translation
/// unit that never sees torch (`anvil/compiled.hpp`). Both ways give the same type: the
/// Trainer checks it. Light header.


namespace anvil {

/// A policy's config type and section name (see file comment).
template <class P>
struct policy_config {
  using type = typename P::Config;
  static constexpr auto section = P::config_section;
};

template <class P>
using policy_config_t = typename policy_config<P>::type;

}  // namespace anvil
// ---- end <anvil/core/policy_config.hpp> ----
// ---- begin <anvil/core/spaces.hpp> ----
/// @file
/// Spaces and the env spec: what a policy needs to know about an environment to be built
/// (its observation and action spaces). They live in core, below every layer that builds
/// networks or storage from them; the env contract (envs/env.hpp) uses them. Light header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace anvil {

/// A box in R^n: `low[i] <= x[i] <= high[i]` (bounds may be +-infinity).
struct Box {
  std::vector<float> low;
  std::vector<float> high;

  /// Number of dimensions.
  [[nodiscard]] std::size_t size() const noexcept { return low.size(); }
  /// True when `x` has the right size and every element is finite and inside the bounds.
  [[nodiscard]] bool contains(std::span<const float> x) const noexcept {
    if (x.size() != low.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] >= low[i] && x[i] <= high[i])) return false;  // also false for NaN
    return true;
  }
};

/// `n` discrete choices, 0 .. n-1.
struct Discrete {
  std::int64_t n = 0;
  [[nodiscard]] bool contains(std::int64_t a) const noexcept { return a >= 0 && a < n; }
};

/// How a multi-agent env's step travels through the single-agent machinery (VecEnv,
/// buffers, loops): as one observation row and one joint action index
/// (envs/multi_agent/multi_agent_env.hpp). The row is
///
///     [ obs of agent 0 | ... | obs of agent k-1 | available actions of agent 0 | ... | of agent k-1 | state | first ]
///
/// with each agent's available actions as 1/0 and `first` 1 on an episode's first row
/// (0 after), so that a policy with memory (a recurrent actor) knows when to forget,
/// whichever loop or evaluation steps the env. The joint action's digits in base
/// `num_actions` are the agents' actions, agent 0's the least significant.
struct AgentLayout {
  std::int64_t agents = 0;       ///< 0: a single-agent env
  std::int64_t obs_dim = 0;      ///< one agent's observation
  std::int64_t num_actions = 0;  ///< one agent's discrete actions
  std::int64_t state_dim = 0;    ///< the global state (the centralised critic's input)

  [[nodiscard]] bool multi_agent() const noexcept { return agents > 0; }
  [[nodiscard]] std::int64_t avail_offset() const noexcept { return agents * obs_dim; }
  [[nodiscard]] std::int64_t state_offset() const noexcept { return agents * (obs_dim + num_actions); }
  [[nodiscard]] std::int64_t first_offset() const noexcept { return state_offset() + state_dim; }
  [[nodiscard]] std::int64_t row_size() const noexcept { return first_offset() + 1; }
  /// num_actions ^ agents, or 0 when it would not fit in an int64.
  [[nodiscard]] std::int64_t joint_actions() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t i = 0; i < agents; ++i) {
      if (num_actions > 0 && n > (std::int64_t{1} << 62) / num_actions) return 0;
      n *= num_actions;
    }
    return n;
  }
};

/// What a policy needs to know about an env to be built: its name and spaces.
struct EnvSpec {
  std::string name;
  Box observation;
  std::variant<Box, Discrete> action;
  /// The env's tasks, for envs that have several (a multi-task suite); empty otherwise.
  /// Replay buffers then store each transition's task and algorithms may condition on it.
  std::vector<std::string> tasks{};
  /// The agents of a multi-agent env (`agents.agents == 0` for a single-agent one).
  AgentLayout agents{};

  [[nodiscard]] bool discrete() const noexcept { return std::holds_alternative<Discrete>(action); }
  [[nodiscard]] std::int64_t obs_dim() const noexcept {
    return static_cast<std::int64_t>(observation.size());
  }
  /// Width of an action row: the Box's size, or 1 for a discrete index.
  [[nodiscard]] std::int64_t action_dim() const noexcept {
    return discrete() ? 1 : static_cast<std::int64_t>(std::get<Box>(action).size());
  }
  /// Number of discrete actions (0 for a Box).
  [[nodiscard]] std::int64_t num_actions() const noexcept {
    return discrete() ? std::get<Discrete>(action).n : 0;
  }
};

}  // namespace anvil
// ---- end <anvil/core/spaces.hpp> ----
// ---- begin <anvil/core/torch_compat.hpp> ----
/// @file
/// Which LibTorch anvil is built against. Debian's LibTorch 1.13 (CPU) and LibTorch 2.x
/// (CUDA builds) differ in a few C++ APIs that anvil uses; each difference sits behind one
/// small header: the autocast switches in core/autocast.hpp (included here) and the c10d
/// process-group classes in parallel/c10d.hpp. Everything else calls those functions and
/// never checks a Torch version.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

// ---- begin <anvil/core/autocast.hpp> ----
/// @file
/// Autocast scopes, the same on LibTorch 1.13 and 2.x: `AutocastGuard` turns autocast on
/// for one device type (the precision policy's scope, opened through `StepContext`), and
/// `Float32Scope` turns it off again inside such a scope, for the few computations that
/// reduced precision would hurt (see `Mlp::forward`). Both restore the previous state on exit.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace anvil {
namespace compat {

// ---- autocast --------------------------------------------------------------------------
// 2.3 introduced device-generic switches (set_autocast_enabled(device_type, on)); earlier
// versions have one switch per device (set_enabled for CUDA, set_cpu_enabled for CPU).

/// Whether autocast is on for `device`.
inline bool autocast_enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

/// Turns autocast on or off for `device`.
inline void set_autocast_enabled(c10::DeviceType device, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::DeviceType::CUDA) at::autocast::set_enabled(on);
  else at::autocast::set_cpu_enabled(on);
#endif
}

/// The reduced dtype autocast casts to on `device`.
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

/// Sets the reduced dtype autocast casts to on `device`.
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) at::autocast::set_autocast_gpu_dtype(dtype);
  else at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

/// Autocast keeps casted weights in a cache while nested scopes are open; the outermost
/// scope clears it on exit (the same protocol Python's torch.autocast follows).
inline int autocast_enter() { return at::autocast::increment_nesting(); }
inline void autocast_exit() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace compat

/// Turns autocast on for one device type while alive and restores the previous state after.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, bool enable, c10::ScalarType dtype) : device_(device) {
    if (!enable) return;
    active_ = true;
    prev_enabled_ = compat::autocast_enabled(device_);
    prev_dtype_ = compat::autocast_dtype(device_);
    compat::set_autocast_enabled(device_, true);
    compat::set_autocast_dtype(device_, dtype);
    compat::autocast_enter();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  ~AutocastGuard() {
    if (!active_) return;
    compat::autocast_exit();
    compat::set_autocast_enabled(device_, prev_enabled_);
    compat::set_autocast_dtype(device_, prev_dtype_);
  }

 private:
  c10::DeviceType device_;
  bool active_ = false;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Float;
};

/// Inside an autocast scope, turns autocast off for `device` while alive, so the ops run in
/// the dtype of their inputs (cast them to float32 first); a no-op outside one.
class Float32Scope {
 public:
  explicit Float32Scope(c10::DeviceType device) : device_(device), was_on_(compat::autocast_enabled(device)) {
    if (was_on_) compat::set_autocast_enabled(device_, false);
  }
  Float32Scope(const Float32Scope&) = delete;
  Float32Scope& operator=(const Float32Scope&) = delete;
  ~Float32Scope() {
    if (was_on_) compat::set_autocast_enabled(device_, true);
  }
  /// Whether autocast was on when the scope opened.
  [[nodiscard]] bool active() const noexcept { return was_on_; }

 private:
  c10::DeviceType device_;
  bool was_on_;
};

}  // namespace anvil
// ---- end <anvil/core/autocast.hpp> ----

#include <string>

namespace anvil::compat {

/// LibTorch version, e.g. 113 for 1.13 and 205 for 2.5.
inline constexpr int torch_version = TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR;
/// "1.13.0" and so on.
inline std::string torch_version_string() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Autocast switches: core/autocast.hpp (included above). c10d: parallel/c10d.hpp.

}  // namespace anvil::compat
// ---- end <anvil/core/torch_compat.hpp> ----
// ---- begin <anvil/core/version.hpp> ----
/// @file
/// anvil's version: the macros for preprocessor checks and `kVersion` for messages and
/// provenance. CMakeLists.txt reads its project version from here.

#include <string_view>

#define ANVIL_VERSION_MAJOR 0
#define ANVIL_VERSION_MINOR 1
#define ANVIL_VERSION_PATCH 0

#define ANVIL_DETAIL_STR2(x) #x
#define ANVIL_DETAIL_STR(x) ANVIL_DETAIL_STR2(x)

namespace anvil {
/// "MAJOR.MINOR.PATCH".
inline constexpr std::string_view kVersion =
    ANVIL_DETAIL_STR(ANVIL_VERSION_MAJOR) "." ANVIL_DETAIL_STR(ANVIL_VERSION_MINOR) "." ANVIL_DETAIL_STR(ANVIL_VERSION_PATCH);
}  // namespace anvil
// ---- end <anvil/core/version.hpp> ----

// ---- begin <anvil/envs/acrobot.hpp> ----
/// @file
/// The acrobot swing-up, the same MDP as Gymnasium's Acrobot-v1 so that returns can be
/// compared with published results. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>

// ---- begin <anvil/envs/detail/episode.hpp> ----
/// @file
/// The bookkeeping every built-in env shares: the episode's phase and step count, its
/// time limit, and the checks (and their error messages) that make bad input throw
/// `EnvError` before the env's state is touched. Light header: no torch.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

// ---- begin <anvil/envs/env.hpp> ----
/// @file
/// The environment contract: spaces, one step's result, and the `Env` concept.
///
/// Light header: no torch. Environments own their observation storage and hand out
/// views of it, so stepping allocates nothing; `VecEnv` copies those views into its
/// batched tensors.

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>


namespace anvil::envs {

// The spaces (core/spaces.hpp) under the names envs have always used.
using anvil::AgentLayout;
using anvil::Box;
using anvil::Discrete;
using anvil::EnvSpec;

/// What one step returns. `observation` views storage owned by the env and stays valid
/// until the env is stepped or reset again.
struct StepResult {
  std::span<const float> observation;
  double reward = 0.0;
  bool terminated = false;  ///< the MDP reached a terminal state: do not bootstrap
  bool truncated = false;   ///< stopped by a time limit: bootstrap from `observation`
};

/// Action type an env with action space `S` takes.
template <class S> struct action_for;
template <> struct action_for<Box> { using type = std::span<const float>; };
template <> struct action_for<Discrete> { using type = std::int64_t; };

template <class E>
using action_space_t = std::remove_cvref_t<decltype(std::declval<const E&>().action_space())>;
template <class E>
using action_t = typename action_for<action_space_t<E>>::type;

/// Bad input to an env (NaN or out-of-bounds action, step before reset). The message
/// names the env and the step; `VecEnv` adds the env index.
class EnvError : public Error {
 public:
  using Error::Error;
};

/// An environment: `reset(seed)` starts an episode and returns its first observation;
/// `step(action)` advances it by one step. The observation space is a `Box`; the action
/// space a `Box` (action is a span of floats) or a `Discrete` (action is an index).
/// Time limits are part of the env: `step` sets `truncated` when the episode's step
/// budget is used up. Envs are not thread-safe; `VecEnv` steps each from one thread at a time.
template <class E>
concept Env = std::movable<E> &&
    requires(E& e, const E& ce, std::uint64_t seed, action_t<E> a) {
      { E::name } -> std::convertible_to<std::string_view>;
      { ce.observation_space() } -> std::same_as<Box>;
      { e.reset(seed) } -> std::same_as<std::span<const float>>;
      { e.step(a) } -> std::same_as<StepResult>;
    };

/// An env that tells which of several tasks its current episode is (a multi-task env, or
/// one that draws a task per episode): `task_names()` lists them all, `task_index()` is the
/// current episode's. Evaluations report each task apart.
template <class E>
concept TaskTagged = Env<E> && requires(const E& e) {
  { e.task_names() } -> std::convertible_to<std::vector<std::string>>;
  { e.task_index() } -> std::convertible_to<std::int64_t>;
};

/// An env that is several agents acting as one (envs/multi_agent/): it describes how its
/// observation row and joint action are laid out.
template <class E>
concept DescribesAgents = Env<E> && requires(const E& e) {
  { e.agent_layout() } -> std::same_as<AgentLayout>;
};

/// An env type that stands for several envs, each with a name of its own (`id()`), e.g. the
/// matrix games, which are one type with different payoffs: `env.id` and logs use `id()`.
template <class E>
concept NamedAtRunTime = Env<E> && requires(const E& e) {
  { e.id() } -> std::convertible_to<std::string_view>;
};

/// The name of env `e`: its `id()` where it has one, else its type's `name`.
template <class E>
[[nodiscard]] std::string env_name(const E& e) {
  if constexpr (NamedAtRunTime<E>) return std::string(e.id());
  else return std::string(E::name);
}

/// The spec of env `e` (with its tasks, when it has several, and its agents).
template <class E>
EnvSpec spec_of(const E& e) {
  EnvSpec s{env_name(e), e.observation_space(), e.action_space(), {}};
  if constexpr (DescribesAgents<E>) s.agents = e.agent_layout();
  if constexpr (TaskTagged<E>) {
    auto names = e.task_names();
    if (names.size() > 1) s.tasks = std::move(names);
  }
  return s;
}

/// An env whose tasks are chosen at run time (`env.suite`, `env.tasks`): `select_tasks`
/// takes a suite name and a list of task names (either may be empty) and throws a
/// ConfigError naming the field at fault.
template <class E>
concept TaskSelectable = TaskTagged<E> && requires(E& e, const std::string& suite, const std::vector<std::string>& tasks) {
  e.select_tasks(suite, tasks);
};

/// An env that takes its place among several: a VecEnv calls `place(index, count)` on env
/// `index` of `count` (indices count over every rank's envs), e.g. to spread the envs over
/// tasks.
template <class E>
concept Placeable = Env<E> && requires(E& e, std::int64_t i) { e.place(i, i); };

/// An env that says whether the step it just took met its task's goal (`success()`); an
/// episode succeeds when any of its steps does. Evaluations report success rates.
template <class E>
concept ReportsSuccess = Env<E> && requires(const E& e) {
  { e.success() } -> std::convertible_to<bool>;
};

/// An env that is not trivially copyable but writes and reads its own state for
/// checkpoints: `save_state(BinaryWriter&) const` and `load_state(BinaryReader&)`, which
/// throws on a state that does not fit (a VecEnv loads into copies first, so a refused
/// checkpoint changes nothing). Trivially copyable envs are saved as bytes without this.
template <class E>
concept SavesOwnState = Env<E> && requires(const E& ce, E& e, BinaryWriter& w, BinaryReader& r) {
  ce.save_state(w);
  e.load_state(r);
};

/// An env whose actions are continuous (a `Box`).
template <class E>
concept ContinuousEnv = Env<E> && std::same_as<action_space_t<E>, Box>;
/// An env whose actions are discrete choices.
template <class E>
concept DiscreteEnv = Env<E> && std::same_as<action_space_t<E>, Discrete>;

}  // namespace anvil::envs
// ---- end <anvil/envs/env.hpp> ----

namespace anvil::envs::detail {

/// One env's episode, held by the env as a member so that the built-in envs word their
/// errors alike ("NAME: step k: ...", with k the steps completed) and apply their time
/// limits alike. The checks only read, so an env that calls them all before changing its
/// own state keeps its promise that a step which throws leaves it unchanged.
class Episode {
 public:
  /// One field of a start state, named so that the error for a bad one can say which.
  struct StateField {
    const char* name;  ///< as the field is spelled in the env's `State`
    double value;      ///< the value `set_state` was given
  };

  /// `env_name` must outlive the episode (the envs pass their static `name`);
  /// `max_steps` is the time limit after which a step reports `truncated`.
  Episode(std::string_view env_name, std::int64_t max_steps) noexcept
      : env_name_(env_name), max_steps_(max_steps) {}

  /// Begin a new episode (from `set_state`, which `reset` goes through) at the state made
  /// of `state`: the step count restarts at 0 and stepping is allowed again, whatever
  /// ended the last one. Throws, changing nothing, if a field is not finite: the dynamics
  /// would carry a NaN into every later observation.
  void start(std::initializer_list<StateField> state) {
    for (const StateField& f : state)
      if (!std::isfinite(f.value))
        throw EnvError(std::string(env_name_) + ": set_state: " + f.name + " is " +
                       non_finite_name(f.value));
    steps_ = 0;
    phase_ = Phase::kRunning;
  }

  /// Throw unless a step may run with this Box action: an episode is running and the
  /// action has `size` elements, all finite. Values outside the box are let through,
  /// because the published envs clip them; a NaN or infinity is a bug upstream that
  /// clipping would hide.
  void check_step(std::span<const float> action, std::size_t size) const {
    check_running();
    if (action.size() != size)
      fail("action has " + std::to_string(action.size()) + " elements, expected " +
           std::to_string(size));
    for (std::size_t i = 0; i < action.size(); ++i)
      if (!std::isfinite(action[i]))
        fail("action[" + std::to_string(i) + "] is " + non_finite_name(action[i]));
  }

  /// Throw unless a step may run with this discrete action: an episode is running and the
  /// action is one of `space`'s choices (there is nothing to clip an index to).
  void check_step(std::int64_t action, const Discrete& space) const {
    check_running();
    if (!space.contains(action))
      fail("action " + std::to_string(action) + " is not in Discrete(" +
           std::to_string(space.n) + ")");
  }

  /// Count the step the env has just applied and close the episode if it ended there,
  /// so the next step throws. A terminating step is never also truncated: terminal
  /// states must not be bootstrapped from, whatever the step count.
  StepResult finish_step(std::span<const float> observation, double reward, bool terminated) {
    ++steps_;
    const bool truncated = !terminated && steps_ >= max_steps_;
    if (terminated) phase_ = Phase::kTerminated;
    if (truncated) phase_ = Phase::kTruncated;
    return StepResult{observation, reward, terminated, truncated};
  }

  /// Continue an episode restored from a checkpoint, `steps` steps in (running, or ended
  /// at the time limit when it has reached it).
  void resume(std::int64_t steps) noexcept {
    steps_ = steps;
    phase_ = steps >= max_steps_ ? Phase::kTruncated : Phase::kRunning;
  }

  /// Steps completed in the current episode (0 before the first `start`).
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

 private:
  enum class Phase { kNotStarted, kRunning, kTerminated, kTruncated };

  // Stepping before `reset` or past the end of an episode is a bug in the caller's loop,
  // not something to step through silently.
  void check_running() const {
    if (phase_ == Phase::kNotStarted)
      throw EnvError(std::string(env_name_) + ": step() called before reset()");
    if (phase_ == Phase::kTerminated)
      fail("the episode has ended (terminated); call reset() first");
    if (phase_ == Phase::kTruncated)
      fail("the episode has ended (truncated at the time limit); call reset() first");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw EnvError(std::string(env_name_) + ": step " + std::to_string(steps_) + ": " + what);
  }

  std::string_view env_name_;
  std::int64_t max_steps_;
  std::int64_t steps_ = 0;
  Phase phase_ = Phase::kNotStarted;
};

}  // namespace anvil::envs::detail
// ---- end <anvil/envs/detail/episode.hpp> ----

namespace anvil::envs {

/// Swing the tip of a two-link pendulum, actuated only at the elbow, above a line one
/// link length over the shoulder. The acrobot of R. S. Sutton, "Generalization in
/// reinforcement learning: successful examples using sparse coarse coding" (NIPS 8,
/// 1996) and Sutton & Barto, "Reinforcement Learning: An Introduction" (sec. 11.3 of
/// the 1998 edition), with the constants, reward, start distribution and time limit of
/// Gymnasium's Acrobot-v1
/// (https://gymnasium.farama.org/environments/classic_control/acrobot/).
///
/// State (theta1, theta2, theta1_dot, theta2_dot): theta1 is the shoulder angle from
/// hanging straight down, theta2 the elbow angle relative to link 1; computed in double
/// as the published env computes in float64. Links of length 1 and mass 1, centres of
/// mass at 0.5, moments of inertia 1, g = 9.8, torque tau in {-1, 0, +1} for actions
/// {0, 1, 2}. The *book* equations of motion (Gymnasium's default; the NIPS paper
/// drops the theta1_dot^2 term of theta2_acc):
///
///     d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos theta2) + I1 + I2
///     d2 = m2 (lc2^2 + l1 lc2 cos theta2) + I2
///     phi2 = m2 lc2 g cos(theta1 + theta2 - pi/2)
///     phi1 = -m2 l1 lc2 theta2_dot^2 sin theta2 - 2 m2 l1 lc2 theta2_dot theta1_dot sin theta2
///            + (m1 lc1 + m2 l1) g cos(theta1 - pi/2) + phi2
///     theta2_acc = (tau + d2/d1 phi1 - m2 l1 lc2 theta1_dot^2 sin theta2 - phi2)
///                  / (m2 lc2^2 + I2 - d2^2/d1)
///     theta1_acc = -(d2 theta2_acc + phi1) / d1
///
/// integrated by one classical Runge-Kutta (RK4) step of dt = 0.2 s with the torque held
/// constant. Afterwards the angles are wrapped into [-pi, pi] (the published wrap adds
/// or subtracts 2 pi while outside, so exactly +-pi is kept) and the velocities clipped
/// to [-4 pi, 4 pi] and [-9 pi, 9 pi]. Terminated when the tip height
/// -cos(theta1) - cos(theta1 + theta2) exceeds 1.0; reward -1 per step and 0 on the
/// terminating step; truncated after 500 steps. Observation [cos theta1, sin theta1,
/// cos theta2, sin theta2, theta1_dot, theta2_dot] (float32), so angles have no seam.
/// Start: every state variable ~ U(-0.1, 0.1) rounded to float32 (the published env
/// casts its start state to float32), drawn from `Rng(seed)`.
///
/// Bad input throws `EnvError`: an action outside {0, 1, 2}, stepping before `reset` or
/// after the episode has ended. A step that throws leaves the env unchanged. Error
/// messages say "step k" with k = `elapsed_steps()`, the number of steps the episode had
/// completed.
struct Acrobot {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "Acrobot-v1";
  /// Gymnasium's time limit (max_episode_steps) for Acrobot-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 500;
  /// Integration time step in seconds: one RK4 step per env step.
  static constexpr double kDt = 0.2;
  /// Length of link 1 (shoulder to elbow); link 2's length only matters for drawing.
  static constexpr double kLinkLength1 = 1.0;
  /// Mass of link 1.
  static constexpr double kLinkMass1 = 1.0;
  /// Mass of link 2.
  static constexpr double kLinkMass2 = 1.0;
  /// Distance from the shoulder to link 1's centre of mass.
  static constexpr double kLinkComPos1 = 0.5;
  /// Distance from the elbow to link 2's centre of mass.
  static constexpr double kLinkComPos2 = 0.5;
  /// Moment of inertia of each link.
  static constexpr double kLinkMoi = 1.0;
  /// Gravity.
  static constexpr double kGravity = 9.8;
  /// Shoulder speed limit; velocities are clipped to it after each step.
  static constexpr double kMaxVel1 = 4 * std::numbers::pi;
  /// Elbow speed limit; velocities are clipped to it after each step.
  static constexpr double kMaxVel2 = 9 * std::numbers::pi;
  /// Tip height above the shoulder that ends the episode.
  static constexpr double kGoalHeight = 1.0;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double theta1 = 0.0;      ///< shoulder angle from hanging down, radians
    double theta2 = 0.0;      ///< elbow angle relative to link 1, radians
    double theta1_dot = 0.0;  ///< shoulder angular velocity
    double theta2_dot = 0.0;  ///< elbow angular velocity
  };

  /// As published: cosines and sines in [-1, 1], velocities within their limits.
  [[nodiscard]] Box observation_space() const {
    const auto v1 = static_cast<float>(kMaxVel1);
    const auto v2 = static_cast<float>(kMaxVel2);
    return Box{{-1.0f, -1.0f, -1.0f, -1.0f, -v1, -v2}, {1.0f, 1.0f, 1.0f, 1.0f, v1, v2}};
  }
  /// 0, 1, 2 apply torque -1, 0, +1 at the elbow.
  [[nodiscard]] Discrete action_space() const { return Discrete{3}; }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    const auto draw = [this] {
      return static_cast<double>(static_cast<float>(rng_.uniform(-0.1, 0.1)));
    };
    State s;
    s.theta1 = draw();
    s.theta2 = draw();
    s.theta1_dot = draw();
    s.theta2_dot = draw();
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"theta1", s.theta1},
                    {"theta2", s.theta2},
                    {"theta1_dot", s.theta1_dot},
                    {"theta2_dot", s.theta2_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Apply elbow torque `action - 1` for dt.
  StepResult step(std::int64_t action) {
    episode_.check_step(action, action_space());
    const double torque = static_cast<double>(action - 1);

    using Vec = std::array<double, 4>;
    const Vec y0{state_.theta1, state_.theta2, state_.theta1_dot, state_.theta2_dot};
    const auto along = [](const Vec& y, double h, const Vec& k) {
      return Vec{y[0] + h * k[0], y[1] + h * k[1], y[2] + h * k[2], y[3] + h * k[3]};
    };
    const Vec k1 = derivatives(y0, torque);
    const Vec k2 = derivatives(along(y0, kDt / 2, k1), torque);
    const Vec k3 = derivatives(along(y0, kDt / 2, k2), torque);
    const Vec k4 = derivatives(along(y0, kDt, k3), torque);
    Vec y;
    for (std::size_t i = 0; i < 4; ++i)
      y[i] = y0[i] + kDt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);

    state_.theta1 = wrap_angle(y[0]);
    state_.theta2 = wrap_angle(y[1]);
    state_.theta1_dot = std::clamp(y[2], -kMaxVel1, kMaxVel1);
    state_.theta2_dot = std::clamp(y[3], -kMaxVel2, kMaxVel2);
    write_observation();

    const bool terminated =
        -std::cos(state_.theta1) - std::cos(state_.theta2 + state_.theta1) > kGoalHeight;
    return episode_.finish_step(obs_, terminated ? 0.0 : -1.0, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// The physical state, in double, for tests and for logging what the observation's
  /// sines and cosines hide.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  /// The book equations of motion (see the struct comment): d/dt of the state. Locals
  /// are named as in the equations so the two can be read side by side.
  static std::array<double, 4> derivatives(const std::array<double, 4>& s, double torque) {
    constexpr double m1 = kLinkMass1, m2 = kLinkMass2, l1 = kLinkLength1;
    constexpr double lc1 = kLinkComPos1, lc2 = kLinkComPos2, i1 = kLinkMoi, i2 = kLinkMoi;
    constexpr double g = kGravity, pi = std::numbers::pi;
    const double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    const double d1 =
        m1 * lc1 * lc1 + m2 * (l1 * l1 + lc2 * lc2 + 2 * l1 * lc2 * std::cos(theta2)) + i1 + i2;
    const double d2 = m2 * (lc2 * lc2 + l1 * lc2 * std::cos(theta2)) + i2;
    const double phi2 = m2 * lc2 * g * std::cos(theta1 + theta2 - pi / 2);
    const double phi1 = -m2 * l1 * lc2 * dtheta2 * dtheta2 * std::sin(theta2) -
                        2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (m1 * lc1 + m2 * l1) * g * std::cos(theta1 - pi / 2) + phi2;
    const double ddtheta2 =
        (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 * dtheta1 * std::sin(theta2) - phi2) /
        (m2 * lc2 * lc2 + i2 - d2 * d2 / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    return {dtheta1, dtheta2, ddtheta1, ddtheta2};
  }

  /// The published wrap: add or subtract 2 pi until inside [-pi, pi]. Angles from a step
  /// are within a few turns; std::remainder first keeps a huge angle given to set_state
  /// from looping (almost) forever.
  static double wrap_angle(double x) noexcept {
    constexpr double kPi = std::numbers::pi;
    if (std::abs(x) > 8 * kPi) x = std::remainder(x, 2 * kPi);
    while (x > kPi) x -= 2 * kPi;
    while (x < -kPi) x += 2 * kPi;
    return x;
  }

  void write_observation() noexcept {
    obs_[0] = static_cast<float>(std::cos(state_.theta1));
    obs_[1] = static_cast<float>(std::sin(state_.theta1));
    obs_[2] = static_cast<float>(std::cos(state_.theta2));
    obs_[3] = static_cast<float>(std::sin(state_.theta2));
    obs_[4] = static_cast<float>(state_.theta1_dot);
    obs_[5] = static_cast<float>(state_.theta2_dot);
  }

  State state_{};
  std::array<float, 6> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<Acrobot>);
static_assert(DiscreteEnv<Acrobot>);

}  // namespace anvil::envs
// ---- end <anvil/envs/acrobot.hpp> ----
// ---- begin <anvil/envs/cart_pole.hpp> ----
/// @file
/// Cart-pole balancing, the same MDP as Gymnasium's CartPole-v1 so that returns can be
/// compared with published results. Light header: no torch.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string_view>


namespace anvil::envs {

/// Keep a pole balanced on a cart by pushing the cart left or right: the cart-pole of
/// Barto, Sutton and Anderson, "Neuronlike adaptive elements that can solve difficult
/// learning control problems" (IEEE Trans. SMC, 1983), with the constants, reward, start
/// distribution and time limit of Gymnasium's CartPole-v1
/// (https://gymnasium.farama.org/environments/classic_control/cart_pole/).
///
/// State (x, x_dot, theta, theta_dot), theta = 0 upright; computed in double as the
/// published env computes in float64. With F = +10 for action 1 and -10 for action 0,
/// g = 9.8, cart mass 1.0, pole mass m = 0.1, total mass M = 1.1, half pole length
/// l = 0.5:
///
///     temp      = (F + m l theta_dot^2 sin(theta)) / M
///     theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - m cos(theta)^2 / M))
///     x_acc     = temp - m l theta_acc cos(theta) / M
///
/// then one explicit Euler step of tau = 0.02 s (positions move with the *old*
/// velocities). Reward 1 on every step, the terminating one included (Gymnasium's
/// default, not the Sutton-Barto 0/-1 variant). Terminated when |x| > 2.4 or
/// |theta| > 12 degrees; truncated after 500 steps. Observation = the state (float32).
/// Start: every state variable ~ U(-0.05, 0.05), drawn from `Rng(seed)`.
///
/// Bad input throws `EnvError`: an action outside {0, 1}, stepping before `reset` or
/// after the episode has ended. A step that throws leaves the env unchanged. Error
/// messages say "step k" with k = `elapsed_steps()`, the number of steps the episode had
/// completed.
struct CartPole {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "CartPole-v1";
  /// Gymnasium's time limit (max_episode_steps) for CartPole-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 500;
  /// Gravity.
  static constexpr double kGravity = 9.8;
  /// Cart mass.
  static constexpr double kCartMass = 1.0;
  /// Pole mass.
  static constexpr double kPoleMass = 0.1;
  /// Half the pole's length (the published `length` is the half-length).
  static constexpr double kHalfPoleLength = 0.5;
  /// Magnitude of the push on the cart.
  static constexpr double kForce = 10.0;
  /// Integration time step in seconds.
  static constexpr double kTau = 0.02;
  /// Cart position beyond which the episode terminates.
  static constexpr double kXThreshold = 2.4;
  /// Pole angle beyond which the episode terminates: 12 degrees, in radians.
  static constexpr double kThetaThreshold = 12 * 2 * std::numbers::pi / 360;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double x = 0.0;          ///< cart position
    double x_dot = 0.0;      ///< cart velocity
    double theta = 0.0;      ///< pole angle from upright, radians
    double theta_dot = 0.0;  ///< pole angular velocity
  };

  /// As published: position within twice the termination threshold (so the observation
  /// that terminates an episode is still inside), angle within twice 12 degrees,
  /// velocities unbounded.
  [[nodiscard]] Box observation_space() const {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    const auto x = static_cast<float>(kXThreshold * 2);
    const auto th = static_cast<float>(kThetaThreshold * 2);
    return Box{{-x, -kInf, -th, -kInf}, {x, kInf, th, kInf}};
  }
  /// 0 pushes the cart left, 1 pushes it right.
  [[nodiscard]] Discrete action_space() const { return Discrete{2}; }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    State s;
    s.x = rng_.uniform(-0.05, 0.05);
    s.x_dot = rng_.uniform(-0.05, 0.05);
    s.theta = rng_.uniform(-0.05, 0.05);
    s.theta_dot = rng_.uniform(-0.05, 0.05);
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"x", s.x},
                    {"x_dot", s.x_dot},
                    {"theta", s.theta},
                    {"theta_dot", s.theta_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Push the cart left (0) or right (1) for one step of tau.
  StepResult step(std::int64_t action) {
    episode_.check_step(action, action_space());

    const double force = action == 1 ? kForce : -kForce;
    const double total_mass = kPoleMass + kCartMass;
    const double pole_mass_length = kPoleMass * kHalfPoleLength;
    const auto [x, x_dot, theta, theta_dot] = state_;
    const double cos_theta = std::cos(theta);
    const double sin_theta = std::sin(theta);
    const double temp = (force + pole_mass_length * theta_dot * theta_dot * sin_theta) / total_mass;
    const double theta_acc =
        (kGravity * sin_theta - cos_theta * temp) /
        (kHalfPoleLength * (4.0 / 3.0 - kPoleMass * cos_theta * cos_theta / total_mass));
    const double x_acc = temp - pole_mass_length * theta_acc * cos_theta / total_mass;

    state_.x = x + kTau * x_dot;
    state_.x_dot = x_dot + kTau * x_acc;
    state_.theta = theta + kTau * theta_dot;
    state_.theta_dot = theta_dot + kTau * theta_acc;
    write_observation();

    const bool terminated = state_.x < -kXThreshold || state_.x > kXThreshold ||
                            state_.theta < -kThetaThreshold || state_.theta > kThetaThreshold;
    return episode_.finish_step(obs_, /*reward=*/1.0, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// The physical state, in double, for tests and for logging what the float32
  /// observation rounds away.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(state_.x);
    obs_[1] = static_cast<float>(state_.x_dot);
    obs_[2] = static_cast<float>(state_.theta);
    obs_[3] = static_cast<float>(state_.theta_dot);
  }

  State state_{};
  std::array<float, 4> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<CartPole>);
static_assert(DiscreteEnv<CartPole>);

}  // namespace anvil::envs
// ---- end <anvil/envs/cart_pole.hpp> ----
// ---- begin <anvil/envs/env_config.hpp> ----
/// @file
/// The `env` and `normalize` sections of a run's config, apart from the classes that use
/// them, so a config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <string>
#include <string_view>
#include <vector>


namespace anvil::envs {

/// Sync: step inside `step()`; async: step on a background thread (see file comment).
enum class VecMode { sync, async };
constexpr auto enum_names(VecMode) { return std::array<std::string_view, 2>{"sync", "async"}; }

/// The `env` section of a run's config.
struct VecEnvConfig {
  Param<int, "num_envs", "environments stepped together (one batched action per step)",
        in_range(1, 1 << 20)>
      num_envs{1};
  Param<int, "threads", "threads stepping the envs (1: the calling thread only)", in_range(1, 1024)>
      threads{1};
  Param<VecMode, "mode", "sync: step in step(); async: step in the background during updates">
      mode{VecMode::sync};
  Param<std::string, "id",
        "the env by name, in programs that choose it at run time (Pendulum-v1, CartPole-v1, Acrobot-v1, "
        "MountainCarContinuous-v0; multi-agent: Mapping, SimpleSpread, Climbing, Penalty, Credit); elsewhere "
        "empty or the program's env">
      id{""};
  Param<std::string, "suite", "a suite of tasks for envs that have tasks (the manipulation suite: mt10)"> suite{""};
  Param<std::vector<std::string>, "tasks",
        "tasks for envs that have tasks, comma-separated (e.g. reach,push); envs are spread over them">
      tasks{};
};

/// The `normalize` section of a run's config.
struct NormalizeConfig {
  Param<bool, "obs", "normalise observations by their running mean and variance"> obs{false};
  Param<bool, "reward", "scale rewards by the running std of the discounted return"> reward{false};
  Param<double, "clip_obs", "clip normalised observations to [-clip, clip]", positive> clip_obs{10.0};
  Param<double, "clip_reward", "clip scaled rewards to [-clip, clip]", positive> clip_reward{10.0};
  Param<double, "gamma", "discount of the return whose std scales rewards (0: the algorithm's gamma)",
        in_range(0, 1)>
      gamma{0.0};
  Param<double, "epsilon", "added to variances before the square root", positive> epsilon{1e-8};
};

}  // namespace anvil::envs
// ---- end <anvil/envs/env_config.hpp> ----
// ---- begin <anvil/envs/history.hpp> ----
/// @file
/// `History<E>`: an env seen with its own recent past, for policies that infer the task from
/// it (the collective policy of collective distillation). The observation is
///
///     [ H tokens of (state, action, reward), oldest first | H mask numbers | state ]
///
/// where a state is the first `state_dim` numbers of the inner env's observation (a task
/// one-hot after them is left out), an action is in [-1, 1] (the policy's units: the env's
/// action mapped back from its bounds), and the mask is 1 for tokens of the current episode
/// (an episode starts with none). Everything else (tasks, success, placement, state for
/// checkpoints) is the inner env's. Light header: no torch.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace anvil::envs {

template <ContinuousEnv E>
class History {
 public:
  static constexpr std::string_view name = E::name;

  /// `history` tokens of the first `state_dim` observation numbers (0: all of them).
  History(E env, int history, std::int64_t state_dim = 0) : env_(std::move(env)), h_(history) {
    const auto full = static_cast<std::int64_t>(env_.observation_space().size());
    sd_ = state_dim == 0 ? full : state_dim;
    if (h_ < 1) throw ConfigError("History: history must be at least 1 token (is " + std::to_string(h_) + ")");
    if (sd_ < 1 || sd_ > full)
      throw ConfigError("History: state_dim " + std::to_string(sd_) + " is not within the env's " + std::to_string(full) + " observation numbers");
    const auto space = env_.action_space();
    ad_ = static_cast<std::int64_t>(space.size());
    low_ = space.low;
    high_ = space.high;
    obs_.assign(static_cast<std::size_t>(h_ * token() + h_ + sd_), 0.0f);
  }

  [[nodiscard]] Box observation_space() const {
    const auto inner = env_.observation_space();
    Box b;
    const auto n = static_cast<std::size_t>(h_ * token());
    b.low.assign(n, -std::numeric_limits<float>::infinity());
    b.high.assign(n, std::numeric_limits<float>::infinity());
    b.low.insert(b.low.end(), static_cast<std::size_t>(h_), 0.0f);
    b.high.insert(b.high.end(), static_cast<std::size_t>(h_), 1.0f);
    b.low.insert(b.low.end(), inner.low.begin(), inner.low.begin() + sd_);
    b.high.insert(b.high.end(), inner.high.begin(), inner.high.begin() + sd_);
    return b;
  }
  [[nodiscard]] Box action_space() const { return env_.action_space(); }

  std::span<const float> reset(std::uint64_t seed) {
    const auto o = env_.reset(seed);
    std::fill(obs_.begin(), obs_.end(), 0.0f);
    set_state(o);
    return obs_;
  }

  StepResult step(std::span<const float> action) {
    auto r = env_.step(action);
    // The oldest token leaves; (state, action, reward) of this step comes in last.
    const auto t = static_cast<std::size_t>(token());
    const auto tokens_end = obs_.begin() + static_cast<std::ptrdiff_t>(h_ * t);
    std::copy(obs_.begin() + static_cast<std::ptrdiff_t>(t), tokens_end, obs_.begin());
    float* last = obs_.data() + (h_ - 1) * token();
    std::copy_n(obs_.data() + h_ * token() + h_, sd_, last);  // the state the action was taken in
    for (std::int64_t j = 0; j < ad_; ++j) {
      const auto k = static_cast<std::size_t>(j);
      const float a = std::clamp(action[k], low_[k], high_[k]);
      last[sd_ + j] = high_[k] > low_[k] ? 2.0f * (a - low_[k]) / (high_[k] - low_[k]) - 1.0f : 0.0f;
    }
    last[sd_ + ad_] = static_cast<float>(r.reward);
    float* mask = obs_.data() + h_ * token();
    std::copy(mask + 1, mask + h_, mask);
    mask[h_ - 1] = 1.0f;
    set_state(r.observation);
    r.observation = obs_;
    return r;
  }

  [[nodiscard]] bool success() const noexcept
    requires ReportsSuccess<E>
  {
    return env_.success();
  }
  [[nodiscard]] std::vector<std::string> task_names() const
    requires TaskTagged<E>
  {
    return env_.task_names();
  }
  [[nodiscard]] std::int64_t task_index() const
    requires TaskTagged<E>
  {
    return env_.task_index();
  }
  void select_tasks(const std::string& suite, const std::vector<std::string>& tasks)
    requires TaskSelectable<E>
  {
    env_.select_tasks(suite, tasks);
    if (static_cast<std::int64_t>(env_.observation_space().size()) < sd_)
      throw ConfigError("History: the env's observation has " + std::to_string(env_.observation_space().size()) +
                        " numbers with these tasks, fewer than state_dim " + std::to_string(sd_));
  }
  void place(std::int64_t index, std::int64_t count)
    requires Placeable<E>
  {
    env_.place(index, count);
  }

  [[nodiscard]] int history() const noexcept { return h_; }
  [[nodiscard]] std::int64_t state_dim() const noexcept { return sd_; }
  [[nodiscard]] std::int64_t token() const noexcept { return sd_ + ad_ + 1; }
  [[nodiscard]] E& env() noexcept { return env_; }

  void save_state(BinaryWriter& w) const {
    if constexpr (SavesOwnState<E>) env_.save_state(w);
    else w.value(env_);
    w.bytes(obs_.data(), obs_.size() * sizeof(float));
  }
  void load_state(BinaryReader& r) {
    if constexpr (SavesOwnState<E>) env_.load_state(r);
    else env_ = r.value<E>("inner env");
    r.bytes(obs_.data(), obs_.size() * sizeof(float), "history");
  }

 private:
  void set_state(std::span<const float> o) { std::copy_n(o.begin(), sd_, obs_.begin() + h_ * token() + h_); }

  E env_;
  int h_;
  std::int64_t sd_ = 0, ad_ = 0;
  std::vector<float> low_, high_;
  std::vector<float> obs_;
};

}  // namespace anvil::envs
// ---- end <anvil/envs/history.hpp> ----
// ---- begin <anvil/envs/mountain_car_continuous.hpp> ----
/// @file
/// Mountain car with a continuous throttle, the same MDP as Gymnasium's
/// MountainCarContinuous-v0 so that returns can be compared with published results.
/// Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>


namespace anvil::envs {

/// Drive an under-powered car out of a valley: it must rock back and forth to build
/// momentum, so greedy throttle fails and exploration is the whole difficulty. The
/// mountain car of A. W. Moore, "Efficient memory-based learning for robot control"
/// (PhD thesis, Cambridge, 1990; tech. report UCAM-CL-TR-209), with the constants,
/// reward, start distribution and time limit of Gymnasium's MountainCarContinuous-v0
/// (https://gymnasium.farama.org/environments/classic_control/mountain_car_continuous/).
///
/// State (position, velocity). With force = clip(action, -1, 1) and power 0.0015:
///
///     velocity' = clip(velocity + force * 0.0015 - 0.0025 cos(3 position), -0.07, 0.07)
///     position' = clip(position + velocity', -1.2, 0.6)
///     velocity' = 0 if position' == -1.2 and velocity' < 0   (inelastic left wall)
///
/// Terminated when position' >= 0.45 and velocity' >= 0 (goal_velocity 0); truncated
/// after 999 steps. Reward -0.1 action^2 on every step, plus 100 on the terminating one.
/// Observation = the state (float32). Start: position ~ U(-0.6, -0.4), velocity 0,
/// drawn from `Rng(seed)`. Each step computes in double and then rounds the stored
/// state to float32, because the published env stores its state as a float32 array.
///
/// Out-of-range actions: the published env CLIPS the action to [-1, 1] for the force
/// only; its control cost uses the action as given (`-0.1 * action[0]^2`), so an action
/// of 3 pushes exactly as hard as 1 but costs 0.9, not 0.1. We do the same. A NaN or
/// infinite action is a bug upstream, not a throttle, so it throws `EnvError` instead;
/// so does a wrong action length, and stepping before `reset` or after the episode has
/// ended. A step that throws leaves the env unchanged. Error messages say "step k" with
/// k = `elapsed_steps()`, the number of steps the episode had completed.
struct MountainCarContinuous {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "MountainCarContinuous-v0";
  /// Gymnasium's time limit (max_episode_steps) for MountainCarContinuous-v0.
  static constexpr std::int64_t kMaxEpisodeSteps = 999;
  /// Smallest action that still changes the force; smaller ones are clipped to it.
  static constexpr double kMinAction = -1.0;
  /// Largest action that still changes the force; larger ones are clipped to it.
  static constexpr double kMaxAction = 1.0;
  /// Left wall.
  static constexpr double kMinPosition = -1.2;
  /// Right edge of the track.
  static constexpr double kMaxPosition = 0.6;
  /// Speed limit; velocities are clipped to it.
  static constexpr double kMaxSpeed = 0.07;
  /// Position at (or beyond) which the car has escaped.
  static constexpr double kGoalPosition = 0.45;
  /// Least velocity at the goal that counts (Gymnasium's default goal_velocity).
  static constexpr double kGoalVelocity = 0.0;
  /// Force per unit of clipped action.
  static constexpr double kPower = 0.0015;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double position = 0.0;  ///< along the track; the valley floor is at -pi/6
    double velocity = 0.0;  ///< position change per step
  };

  /// [position, velocity] in [-1.2, 0.6] x [-0.07, 0.07], as published.
  [[nodiscard]] Box observation_space() const {
    const auto v = static_cast<float>(kMaxSpeed);
    return Box{{static_cast<float>(kMinPosition), -v}, {static_cast<float>(kMaxPosition), v}};
  }
  /// One throttle value in [-1, 1], as published.
  [[nodiscard]] Box action_space() const {
    return Box{{static_cast<float>(kMinAction)}, {static_cast<float>(kMaxAction)}};
  }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    return set_state(State{.position = rng_.uniform(-0.6, -0.4), .velocity = 0.0});
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"position", s.position}, {"velocity", s.velocity}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Apply throttle `action[0]` (force clipped to [-1, 1], cost not, as published).
  StepResult step(std::span<const float> action) {
    episode_.check_step(action, /*size=*/1);
    const double a = static_cast<double>(action[0]);
    const double force = std::clamp(a, kMinAction, kMaxAction);

    double position = state_.position;
    double velocity = state_.velocity;
    velocity += force * kPower - 0.0025 * std::cos(3.0 * position);
    velocity = std::clamp(velocity, -kMaxSpeed, kMaxSpeed);
    position += velocity;
    position = std::clamp(position, kMinPosition, kMaxPosition);
    if (position == kMinPosition && velocity < 0.0) velocity = 0.0;

    const bool terminated = position >= kGoalPosition && velocity >= kGoalVelocity;
    const double reward = (terminated ? 100.0 : 0.0) - 0.1 * a * a;
    state_.position = static_cast<float>(position);
    state_.velocity = static_cast<float>(velocity);
    write_observation();
    return episode_.finish_step(obs_, reward, terminated);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// The physical state, for tests and for logging.
  [[nodiscard]] State state() const noexcept { return state_; }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(state_.position);
    obs_[1] = static_cast<float>(state_.velocity);
  }

  State state_{};
  std::array<float, 2> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<MountainCarContinuous>);
static_assert(ContinuousEnv<MountainCarContinuous>);

}  // namespace anvil::envs
// ---- end <anvil/envs/mountain_car_continuous.hpp> ----
// ---- begin <anvil/envs/multi_agent/mapping.hpp> ----
/// @file
/// A cooperative multi-UAV mapping mission: agents fly over a field at one of three
/// altitudes, each step measuring the cells under them with a sensor whose footprint grows
/// and whose accuracy falls with altitude, and a shared belief map of where the targets
/// (e.g. weeds) are is updated from the measurements. The mission has a budget of steps;
/// the team is rewarded for the reduction of the map's entropy. Written here after the
/// setting of Westheider, Rückin, Popović, "Multi-UAV Adaptive Path Planning Using Deep
/// Reinforcement Learning" (IROS 2023): 4 agents, a budget of 14 steps, 3 altitudes,
/// COMA. Reference policies (random, lawnmower) are here too. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>

// ---- begin <anvil/envs/multi_agent/multi_agent_env.hpp> ----
/// @file
/// Cooperative multi-agent envs: the `MultiAgentEnv` concept (k agents, each with its own
/// observation and a discrete action set with an availability mask, a global state for a
/// centralised critic, one team reward, terminated/truncated for the team) and `Joint<M>`,
/// which makes such an env an `Env` so that everything built for envs serves it unchanged:
/// `VecEnv` (N copies on the thread pool, batched tensors, autoreset, seeds, checkpoints),
/// the episodic loop, `EpisodeBuffer`, evaluation, DDP.
///
/// `Joint<M>` lays a step out as `AgentLayout` says (core/spaces.hpp): one observation row
/// `[obs_0 .. obs_k-1 | avail_0 .. avail_k-1 | state | first]` and one joint action index whose
/// base-`num_actions` digits are the agents' actions (agent 0 least significant). A joint
/// action that gives an agent an unavailable action is refused with an EnvError naming the
/// agent, the action and the step. Light header: no torch.

#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>


namespace anvil::envs {

/// What one step of a team returns.
struct TeamStep {
  double reward = 0.0;      ///< the team's reward
  bool terminated = false;  ///< the team reached a terminal state: do not bootstrap
  bool truncated = false;   ///< stopped by a time limit (a budget)
};

/// A cooperative multi-agent env (see file comment). `observe`, `available_actions` and
/// `write_state` write into spans of `agent_observation_size()`, `num_actions()` and
/// `state_size()` floats; `step` takes one action per agent and `reset(seed)` starts an
/// episode that depends on its seed alone.
template <class M>
concept MultiAgentEnv = std::movable<M> &&
    requires(M& m, const M& cm, std::uint64_t seed, std::span<const std::int64_t> actions, std::int64_t agent,
             std::span<float> out) {
      { M::name } -> std::convertible_to<std::string_view>;
      { cm.num_agents() } -> std::convertible_to<std::int64_t>;
      { cm.agent_observation_size() } -> std::convertible_to<std::int64_t>;
      { cm.num_actions() } -> std::convertible_to<std::int64_t>;
      { cm.state_size() } -> std::convertible_to<std::int64_t>;
      { m.reset(seed) };
      { m.step(actions) } -> std::same_as<TeamStep>;
      { cm.observe(agent, out) };
      { cm.available_actions(agent, out) };
      { cm.write_state(out) };
    };

/// A multi-agent env that writes and reads its own state for checkpoints (one that is
/// trivially copyable is saved as bytes without this).
template <class M>
concept MultiAgentSavesState = MultiAgentEnv<M> && requires(const M& cm, M& m, BinaryWriter& w, BinaryReader& r) {
  cm.save_state(w);
  m.load_state(r);
};

/// The joint action of `actions` (one per agent, each below `num_actions`).
[[nodiscard]] inline std::int64_t encode_joint_action(std::span<const std::int64_t> actions, std::int64_t num_actions) {
  std::int64_t joint = 0;
  for (std::size_t i = actions.size(); i-- > 0;) joint = joint * num_actions + actions[i];
  return joint;
}
/// The agents' actions in `joint` (written to `out`, one per agent).
inline void decode_joint_action(std::int64_t joint, std::int64_t num_actions, std::span<std::int64_t> out) {
  for (auto& a : out) {
    a = joint % num_actions;
    joint /= num_actions;
  }
}

/// A multi-agent env as one `Env` (see file comment).
template <MultiAgentEnv M>
class Joint {
 public:
  static constexpr std::string_view name = M::name;

  explicit Joint(M env = M{}) : env_(std::move(env)) { layout(); }

  /// Each agent's observation unbounded, the availability flags in [0, 1], the state
  /// unbounded, the first-step flag in [0, 1].
  [[nodiscard]] Box observation_space() const {
    const auto l = agent_layout();
    constexpr float kInf = std::numeric_limits<float>::infinity();
    Box b{std::vector<float>(static_cast<std::size_t>(l.row_size()), -kInf),
          std::vector<float>(static_cast<std::size_t>(l.row_size()), kInf)};
    for (std::int64_t i = l.avail_offset(); i < l.state_offset(); ++i) {
      b.low[static_cast<std::size_t>(i)] = 0.0f;
      b.high[static_cast<std::size_t>(i)] = 1.0f;
    }
    b.low[static_cast<std::size_t>(l.first_offset())] = 0.0f;
    b.high[static_cast<std::size_t>(l.first_offset())] = 1.0f;
    return b;
  }
  /// Every joint action: num_actions ^ agents.
  [[nodiscard]] Discrete action_space() const { return Discrete{agent_layout().joint_actions()}; }
  [[nodiscard]] AgentLayout agent_layout() const {
    return AgentLayout{static_cast<std::int64_t>(env_.num_agents()), static_cast<std::int64_t>(env_.agent_observation_size()),
                       static_cast<std::int64_t>(env_.num_actions()), static_cast<std::int64_t>(env_.state_size())};
  }

  std::span<const float> reset(std::uint64_t seed) {
    env_.reset(seed);
    started_ = true;
    steps_ = 0;
    pack();
    return row_;
  }

  /// Steps every agent with its digit of `joint`. Throws EnvError for a joint action out of
  /// range or one that gives an agent an action it may not take now (the env is unchanged).
  StepResult step(std::int64_t joint) {
    const auto l = agent_layout();
    if (!started_) throw EnvError(std::string(name) + ": step before reset");
    if (joint < 0 || joint >= l.joint_actions())
      throw EnvError(std::string(name) + ": step " + std::to_string(steps_) + ": joint action " + std::to_string(joint) +
                     " is outside [0, " + std::to_string(l.joint_actions()) + ")");
    decode_joint_action(joint, l.num_actions, actions_);
    for (std::int64_t i = 0; i < l.agents; ++i) {
      const auto a = actions_[static_cast<std::size_t>(i)];
      if (row_[static_cast<std::size_t>(l.avail_offset() + i * l.num_actions + a)] < 0.5f)
        throw EnvError(std::string(name) + ": step " + std::to_string(steps_) + ": agent " + std::to_string(i) +
                       " took action " + std::to_string(a) + ", which is not available to it now");
    }
    const TeamStep r = env_.step(actions_);
    ++steps_;
    pack();
    return StepResult{row_, r.reward, r.terminated, r.truncated};
  }

  /// The name of this env (the wrapped env's own where it has several, e.g. "Climbing").
  [[nodiscard]] std::string_view id() const noexcept {
    if constexpr (requires { { env_.id() } -> std::convertible_to<std::string_view>; }) return env_.id();
    else return M::name;
  }

  /// The wrapped env.
  [[nodiscard]] const M& env() const noexcept { return env_; }
  [[nodiscard]] M& env() noexcept { return env_; }
  /// The row the env showed last (after `reset` or `step`).
  [[nodiscard]] std::span<const float> observation() const noexcept { return row_; }
  /// The agents' actions of the last step.
  [[nodiscard]] std::span<const std::int64_t> last_actions() const noexcept { return actions_; }

  /// Checkpoints: the env (as bytes when trivially copyable, else its own save_state) and
  /// the row it last showed.
  void save_state(BinaryWriter& w) const
    requires(std::is_trivially_copyable_v<M> || MultiAgentSavesState<M>)
  {
    if constexpr (std::is_trivially_copyable_v<M>) w.value(env_);
    else env_.save_state(w);
    w.value(started_);
    w.value(steps_);
  }
  void load_state(BinaryReader& r)
    requires(std::is_trivially_copyable_v<M> || MultiAgentSavesState<M>)
  {
    if constexpr (std::is_trivially_copyable_v<M>) env_ = r.value<M>("multi-agent env state");
    else env_.load_state(r);
    started_ = r.value<bool>("multi-agent env started");
    steps_ = r.value<std::int64_t>("multi-agent env steps");
    layout();
    if (started_) pack();
  }

 private:
  void layout() {
    const auto l = agent_layout();
    if (l.agents < 1 || l.num_actions < 1 || l.obs_dim < 0 || l.state_dim < 0)
      throw Error(std::string(name) + ": a multi-agent env needs at least one agent and one action (it has " +
                  std::to_string(l.agents) + " agents, " + std::to_string(l.num_actions) + " actions)");
    if (l.joint_actions() == 0)
      throw Error(std::string(name) + ": " + std::to_string(l.num_actions) + " actions ^ " + std::to_string(l.agents) +
                  " agents joint actions do not fit in an int64");
    row_.assign(static_cast<std::size_t>(l.row_size()), 0.0f);
    actions_.assign(static_cast<std::size_t>(l.agents), 0);
  }
  void pack() {
    const auto l = agent_layout();
    std::span<float> row(row_);
    for (std::int64_t i = 0; i < l.agents; ++i) {
      env_.observe(i, row.subspan(static_cast<std::size_t>(i * l.obs_dim), static_cast<std::size_t>(l.obs_dim)));
      env_.available_actions(i, row.subspan(static_cast<std::size_t>(l.avail_offset() + i * l.num_actions),
                                            static_cast<std::size_t>(l.num_actions)));
    }
    env_.write_state(row.subspan(static_cast<std::size_t>(l.state_offset()), static_cast<std::size_t>(l.state_dim)));
    row[static_cast<std::size_t>(l.first_offset())] = steps_ == 0 ? 1.0f : 0.0f;
  }

  M env_;
  std::vector<float> row_;
  std::vector<std::int64_t> actions_;
  bool started_ = false;
  std::int64_t steps_ = 0;
};

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_agent/multi_agent_env.hpp> ----

namespace anvil::envs {

/// What the mapping mission rewards (see `MappingTask`).
enum class MappingReward : std::uint8_t {
  weighted_entropy,  ///< entropy removed, each cell weighted by its belief (targets count)
  entropy,           ///< entropy removed, every cell alike
};

/// The mapping mission (see file comment):
///
/// - the field is a 32 x 32 grid of cells; a target map is drawn per episode as 3-6 discs
///   of radius 2-5 cells at random centres (about 15% of the cells);
/// - agents stand over an 8 x 8 grid of positions (one per 4 x 4 block of cells) at
///   altitude 0, 1 or 2; actions: 0 stay, 1 north (+y), 2 south, 3 east (+x), 4 west,
///   5 up, 6 down; moves off the grid or beyond the altitudes are unavailable;
/// - each step every agent measures the square of cells centred under it, 4, 8 or 12 cells
///   wide at altitude 0, 1, 2; each measured cell reads its truth flipped with probability
///   0.05, 0.15, 0.25 (independently per cell and measurement);
/// - the belief map holds each cell's probability of being a target (prior 0.5), updated
///   by Bayes' rule in log-odds from every measurement;
/// - reward each step (`MappingReward::weighted_entropy`, the default): the *weighted*
///   entropy removed that step, as a fraction of the prior map's weighted entropy. A cell's
///   binary entropy (bits) is weighted by what the updated map believes of it: 1 where a
///   target is more likely than not, 0 where it is less likely, 1/2 where the belief is
///   even (the class weighting of Westheider et al.'s mapping mission, which cares about
///   the targets and not about confirming empty ground). So an episode's return is the
///   share of the map's target-relevant uncertainty the mission removed, and a team earns
///   more by measuring where targets are than by sweeping empty ground.
///   `MappingReward::entropy` weighs every cell 1 (plain entropy reduction);
/// - the episode ends (terminated: the mission is over) after the budget of 14 steps;
/// - start: agents at random positions at altitude 0, their first measurement taken;
/// - an agent observes its position (x, y in [0, 1]), its altitude (one-hot), the budget
///   left (fraction), every other agent's offset (dx, dy, d-altitude), and the belief map
///   summarised per block (8 x 8): the cells' mean entropy (what is still unknown) and
///   their mean probability of a target (where the reward's weight lies); the state is the
///   two block summaries, every agent's position and altitude, and the budget left.
///
/// Trivially copyable (checkpoints save it, the generator included, as bytes).
class MappingTask {
 public:
  static constexpr std::string_view name = "Mapping";
  static constexpr int kAgents = 4, kCells = 32, kPositions = 8, kBlock = kCells / kPositions, kAltitudes = 3;
  static constexpr int kActions = 7;
  static constexpr std::int64_t kBudget = 14;
  static constexpr std::array<int, kAltitudes> kFootprintHalf{2, 4, 6};   ///< cells each side of the centre
  static constexpr std::array<double, kAltitudes> kFlip{0.05, 0.15, 0.25};  ///< per-cell error probability
  enum Action : std::int64_t { stay = 0, north, south, east, west, up, down };

  explicit MappingTask(MappingReward reward = MappingReward::weighted_entropy) noexcept : reward_(reward) {}

  [[nodiscard]] std::int64_t num_agents() const noexcept { return kAgents; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept {
    return 2 + kAltitudes + 1 + 3 * (kAgents - 1) + 2 * kPositions * kPositions;
  }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return kActions; }
  [[nodiscard]] std::int64_t state_size() const noexcept {
    return 2 * kPositions * kPositions + kAgents * (2 + kAltitudes) + 1;
  }

  void reset(std::uint64_t seed) {
    rng_.reseed(seed);
    truth_.fill(0);
    const int discs = 3 + static_cast<int>(rng_.below(4));
    for (int d = 0; d < discs; ++d) {
      const double cx = rng_.uniform(0, kCells), cy = rng_.uniform(0, kCells), r = rng_.uniform(2, 5);
      for (int y = 0; y < kCells; ++y)
        for (int x = 0; x < kCells; ++x)
          if (std::hypot(x + 0.5 - cx, y + 0.5 - cy) <= r) truth_[index(x, y)] = 1;
    }
    log_odds_.fill(0.0);
    cell_h_.fill(1.0);
    for (auto& a : agents_) a = Pose{static_cast<int>(rng_.below(kPositions)), static_cast<int>(rng_.below(kPositions)), 0};
    sweep_north_.fill(true);
    steps_ = 0;
    started_ = true;
    for (const auto& a : agents_) measure(a);
    update_entropies();
  }

  TeamStep step(std::span<const std::int64_t> actions) {
    if (!started_) throw EnvError("Mapping: step before reset");
    if (steps_ >= kBudget) throw EnvError("Mapping: step after the budget of 14 steps is spent");
    for (int i = 0; i < kAgents; ++i) {
      const auto a = actions[static_cast<std::size_t>(i)];
      if (a < 0 || a >= kActions || !available(agents_[i], a))
        throw EnvError("Mapping: agent " + std::to_string(i) + " cannot take action " + std::to_string(a) + " now");
    }
    for (int i = 0; i < kAgents; ++i) agents_[i] = moved(agents_[i], actions[static_cast<std::size_t>(i)]);
    for (const auto& a : agents_) measure(a);
    const double removed = update_entropies();
    ++steps_;
    return TeamStep{removed / prior_entropy(reward_), steps_ >= kBudget, false};
  }

  void observe(std::int64_t agent, std::span<float> out) const noexcept {
    const auto& me = agents_[static_cast<std::size_t>(agent)];
    std::size_t k = 0;
    out[k++] = static_cast<float>(me.x) / (kPositions - 1);
    out[k++] = static_cast<float>(me.y) / (kPositions - 1);
    for (int h = 0; h < kAltitudes; ++h) out[k++] = me.alt == h ? 1.0f : 0.0f;
    out[k++] = budget_left();
    for (int j = 0; j < kAgents; ++j) {
      if (j == agent) continue;
      out[k++] = static_cast<float>(agents_[j].x - me.x) / (kPositions - 1);
      out[k++] = static_cast<float>(agents_[j].y - me.y) / (kPositions - 1);
      out[k++] = static_cast<float>(agents_[j].alt - me.alt) / (kAltitudes - 1);
    }
    block_summaries(out.subspan(k, 2 * kPositions * kPositions));
  }
  void available_actions(std::int64_t agent, std::span<float> out) const noexcept {
    for (int a = 0; a < kActions; ++a)
      out[static_cast<std::size_t>(a)] = available(agents_[static_cast<std::size_t>(agent)], a) ? 1.0f : 0.0f;
  }
  void write_state(std::span<float> out) const noexcept {
    block_summaries(out.subspan(0, 2 * kPositions * kPositions));
    std::size_t k = 2 * kPositions * kPositions;
    for (const auto& a : agents_) {
      out[k++] = static_cast<float>(a.x) / (kPositions - 1);
      out[k++] = static_cast<float>(a.y) / (kPositions - 1);
      for (int h = 0; h < kAltitudes; ++h) out[k++] = a.alt == h ? 1.0f : 0.0f;
    }
    out[k++] = budget_left();
  }

  // --- What a mission ends with, and the reference policies -------------------------

  /// The map's entropy left, as a fraction of the prior's (1 at the start of nothing known).
  [[nodiscard]] double entropy_fraction() const noexcept { return entropy_ / prior_entropy(MappingReward::entropy); }
  /// The map's weighted entropy left (see the reward), as a fraction of the prior's.
  [[nodiscard]] double weighted_entropy_fraction() const noexcept {
    double h = 0;
    for (int c = 0; c < kCells * kCells; ++c) h += weight(probability(c)) * cell_h_[static_cast<std::size_t>(c)];
    return h / prior_entropy(MappingReward::weighted_entropy);
  }
  [[nodiscard]] MappingReward reward_kind() const noexcept { return reward_; }
  /// Mean absolute error of the belief map against the targets (0.5 for the prior).
  [[nodiscard]] double map_error() const noexcept {
    double e = 0;
    for (int c = 0; c < kCells * kCells; ++c) e += std::abs(probability(c) - truth_[static_cast<std::size_t>(c)]);
    return e / (kCells * kCells);
  }
  /// Whether agent `i` may take action `a` now.
  [[nodiscard]] bool available(int i, std::int64_t a) const noexcept { return available(agents_[i], a); }
  /// Agent `i`'s position and altitude.
  [[nodiscard]] std::array<int, 3> pose(int i) const noexcept { return {agents_[i].x, agents_[i].y, agents_[i].alt}; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The belief that cell (x, y) holds a target, and whether it does.
  [[nodiscard]] double belief(int x, int y) const noexcept { return probability(static_cast<int>(index(x, y))); }
  [[nodiscard]] bool target(int x, int y) const noexcept { return truth_[index(x, y)] != 0; }

  /// A lawnmower sweep: agent i owns the strip of columns [2i, 2i + 2), climbs to altitude
  /// 1 (its footprint covers the strip), flies to the strip, then sweeps it north and south.
  [[nodiscard]] std::array<std::int64_t, kAgents> lawnmower() const noexcept {
    std::array<std::int64_t, kAgents> act{};
    constexpr int strip = kPositions / kAgents;
    for (int i = 0; i < kAgents; ++i) {
      const auto& a = agents_[i];
      const int target_x = i * strip + strip / 2;  // the footprint at altitude 1 spans the strip
      if (a.alt < 1) act[i] = up;
      else if (a.alt > 1) act[i] = down;
      else if (a.x < target_x) act[i] = east;
      else if (a.x > target_x) act[i] = west;
      else {
        // Sweep: north on even passes, south on odd ones, turning at the edges.
        const bool north_pass = sweep_north_[i];
        if (north_pass && a.y + 1 < kPositions) act[i] = north;
        else if (!north_pass && a.y > 0) act[i] = south;
        else act[i] = north_pass ? south : north;
      }
    }
    return act;
  }
  /// Call after stepping with `lawnmower()` actions: turns the sweeps at the edges.
  void lawnmower_turns() noexcept {
    for (int i = 0; i < kAgents; ++i) {
      if (agents_[i].y + 1 >= kPositions) sweep_north_[i] = false;
      if (agents_[i].y <= 0) sweep_north_[i] = true;
    }
  }

 private:
  struct Pose {
    int x = 0, y = 0, alt = 0;
  };
  // The prior map's (weighted) entropy: 1 bit per cell at p = 0.5, weighted 1/2 when weighted.
  static constexpr double prior_entropy(MappingReward r) noexcept {
    return (r == MappingReward::weighted_entropy ? 0.5 : 1.0) * kCells * kCells;
  }
  // The weight of a cell the map believes holds a target with probability p.
  static constexpr double weight(double p) noexcept { return p > 0.501 ? 1.0 : p < 0.499 ? 0.0 : 0.5; }

  static constexpr std::size_t index(int x, int y) noexcept { return static_cast<std::size_t>(y * kCells + x); }
  [[nodiscard]] double probability(int c) const noexcept { return 1.0 / (1.0 + std::exp(-log_odds_[static_cast<std::size_t>(c)])); }
  static double binary_entropy(double p) noexcept {
    if (p <= 0.0 || p >= 1.0) return 0.0;
    return -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
  }
  // Brings the cells' entropies, the blocks' means (for the observations) and the map's
  // entropy up to date with the belief map; returns the (weighted) entropy removed since
  // the last call, each cell weighted by the updated belief.
  double update_entropies() noexcept {
    double total = 0, removed = 0;
    for (int by = 0; by < kPositions; ++by)
      for (int bx = 0; bx < kPositions; ++bx) {
        double h = 0, ps = 0;
        for (int y = by * kBlock; y < (by + 1) * kBlock; ++y)
          for (int x = bx * kBlock; x < (bx + 1) * kBlock; ++x) {
            const auto c = index(x, y);
            const double p = probability(static_cast<int>(c));
            const double hc = binary_entropy(p);
            removed += (reward_ == MappingReward::weighted_entropy ? weight(p) : 1.0) * (cell_h_[c] - hc);
            cell_h_[c] = hc;
            h += hc;
            ps += p;
          }
        block_h_[static_cast<std::size_t>(by * kPositions + bx)] = static_cast<float>(h / (kBlock * kBlock));
        block_p_[static_cast<std::size_t>(by * kPositions + bx)] = static_cast<float>(ps / (kBlock * kBlock));
        total += h;
      }
    entropy_ = total;
    return removed;
  }
  // The blocks' mean entropies, then their mean target probabilities.
  void block_summaries(std::span<float> out) const noexcept {
    std::copy(block_h_.begin(), block_h_.end(), out.begin());
    std::copy(block_p_.begin(), block_p_.end(), out.begin() + kPositions * kPositions);
  }
  [[nodiscard]] float budget_left() const noexcept { return static_cast<float>(kBudget - steps_) / kBudget; }

  static bool available(const Pose& p, std::int64_t a) noexcept {
    switch (a) {
      case stay: return true;
      case north: return p.y + 1 < kPositions;
      case south: return p.y > 0;
      case east: return p.x + 1 < kPositions;
      case west: return p.x > 0;
      case up: return p.alt + 1 < kAltitudes;
      case down: return p.alt > 0;
      default: return false;
    }
  }
  static Pose moved(Pose p, std::int64_t a) noexcept {
    if (a == north) ++p.y;
    if (a == south) --p.y;
    if (a == east) ++p.x;
    if (a == west) --p.x;
    if (a == up) ++p.alt;
    if (a == down) --p.alt;
    return p;
  }
  // One noisy measurement of the footprint under `p`, folded into the belief map.
  void measure(const Pose& p) {
    const int half = kFootprintHalf[static_cast<std::size_t>(p.alt)];
    const double flip = kFlip[static_cast<std::size_t>(p.alt)];
    const double evidence = std::log((1 - flip) / flip);
    const int cx = p.x * kBlock + kBlock / 2, cy = p.y * kBlock + kBlock / 2;
    for (int y = std::max(0, cy - half); y < std::min(kCells, cy + half); ++y)
      for (int x = std::max(0, cx - half); x < std::min(kCells, cx + half); ++x) {
        const bool t = truth_[index(x, y)] != 0;
        const bool reading = rng_.uniform() < flip ? !t : t;
        log_odds_[index(x, y)] += reading ? evidence : -evidence;
      }
  }

  Rng rng_{0};
  std::array<std::uint8_t, kCells * kCells> truth_{};
  std::array<double, kCells * kCells> log_odds_{};
  std::array<double, kCells * kCells> cell_h_{};  // each cell's entropy (bits) at the last update
  std::array<Pose, kAgents> agents_{};
  std::array<bool, kAgents> sweep_north_{true, true, true, true};
  std::array<float, kPositions * kPositions> block_h_{}, block_p_{};
  double entropy_ = kCells * kCells;
  MappingReward reward_ = MappingReward::weighted_entropy;
  std::int64_t steps_ = 0;
  bool started_ = false;
};

static_assert(MultiAgentEnv<MappingTask>);

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_agent/mapping.hpp> ----
// ---- begin <anvil/envs/multi_agent/matrix_game.hpp> ----
/// @file
/// One-step cooperative matrix games: k agents each choose one of n actions once, and the
/// team gets the payoff of the joint action. The classic tests of coordination and credit
/// assignment. Light header: no torch.

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>


namespace anvil::envs {

/// A one-step cooperative game given by its payoff tensor (agent 0's action the fastest
/// index, as in a joint action). Every agent observes the constant 1 (there is one state),
/// every action is always available, and each episode is one step that terminates.
/// Trivially copyable (checkpoints save it as bytes).
class MatrixGame {
 public:
  static constexpr std::string_view name = "MatrixGame";
  static constexpr std::int64_t kMaxEntries = 1024;

  MatrixGame() : MatrixGame(climbing()) {}
  /// `payoff` holds n^k entries, indexed by the joint action; `id` names the game in logs
  /// and for `env.id` (at most 23 characters).
  MatrixGame(std::int64_t agents, std::int64_t actions, std::span<const double> payoff,
             std::string_view id = "MatrixGame")
      : k_(agents), n_(actions) {
    if (id.empty() || id.size() >= id_.size())
      throw Error("MatrixGame: a game's id has 1 to " + std::to_string(id_.size() - 1) + " characters, got '" +
                  std::string(id) + "'");
    std::copy(id.begin(), id.end(), id_.begin());
    std::int64_t entries = 1;
    for (std::int64_t i = 0; i < agents; ++i) entries *= actions;
    if (agents < 1 || actions < 1 || entries > kMaxEntries || static_cast<std::int64_t>(payoff.size()) != entries)
      throw Error("MatrixGame: " + std::to_string(agents) + " agents with " + std::to_string(actions) +
                  " actions need " + std::to_string(entries) + " payoffs (at most " + std::to_string(kMaxEntries) +
                  "), got " + std::to_string(payoff.size()));
    for (std::int64_t i = 0; i < entries; ++i) payoff_[static_cast<std::size_t>(i)] = payoff[static_cast<std::size_t>(i)];
  }

  /// The climbing game (Claus and Boutilier 1998, "The dynamics of reinforcement learning in
  /// cooperative multiagent systems", AAAI): optimum 11 at (0, 0), guarded by -30 penalties;
  /// independent learners settle on (2, 2) or (1, 1).
  static MatrixGame climbing() {
    // The published table has agent 0's action as its row and agent 1's as its column:
    //   {11, -30, 0}, {-30, 7, 6}, {0, 0, 5}; stored by joint action (payoff[a0 + 3 a1]).
    const std::array<double, 9> p{11, -30, 0, -30, 7, 0, 0, 6, 5};
    return MatrixGame(2, 3, p, "Climbing");
  }
  /// The penalty game (Claus and Boutilier 1998) with miscoordination penalty `k` <= 0:
  /// optima 10 at (0, 0) and (2, 2), a safe 2 at (1, 1), and k where the agents disagree
  /// between the optima.
  static MatrixGame penalty(double k) {
    const std::array<double, 9> p{10, 0, k, 0, 2, 0, k, 0, 10};
    return MatrixGame(2, 3, p, "Penalty");
  }
  /// A credit-assignment game: k agents with two actions. Agent 0's good action is 0,
  /// worth `small` to the team; agent i >= 1's good action is i mod 2, worth `large`. The
  /// optimum is every agent on its good action. While the others explore, their choices
  /// put noise of variance about (k - 1) large^2 / 4 into the team's reward, next to which
  /// agent 0's share is small: an advantage that does not condition on the others' actions
  /// (an independent critic's, a central V's) carries that noise, and agent 0 learns
  /// slowly; COMA's counterfactual advantage removes the others' share. The good actions
  /// alternate so that an actor shared by the agents gains nothing from learning one
  /// action for all of them: each agent's choice must come from its own credit.
  static MatrixGame credit(std::int64_t agents, double small, double large) {
    std::array<double, kMaxEntries> p{};
    const std::int64_t n = std::int64_t{1} << agents;
    if (agents < 2 || n > kMaxEntries) throw Error("MatrixGame::credit: 2 to 10 agents, got " + std::to_string(agents));
    for (std::int64_t j = 0; j < n; ++j) {
      double r = (j & 1) ? 0.0 : small;
      for (std::int64_t a = 1; a < agents; ++a)
        if (((j >> a) & 1) == (a & 1)) r += large;
      p[static_cast<std::size_t>(j)] = r;
    }
    return MatrixGame(agents, 2, std::span<const double>(p.data(), static_cast<std::size_t>(n)), "Credit");
  }
  /// The joint action of the credit game's optimum (agent 0 on 0, agent i on i mod 2).
  static std::int64_t credit_optimum(std::int64_t agents) noexcept {
    std::int64_t j = 0;
    for (std::int64_t a = 1; a < agents; ++a) j |= (a & 1) << a;
    return j;
  }

  /// The game's name ("Climbing", "Penalty", "Credit", or the one it was given).
  [[nodiscard]] std::string_view id() const noexcept { return std::string_view(id_.data()); }
  [[nodiscard]] std::int64_t num_agents() const noexcept { return k_; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept { return 1; }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return n_; }
  [[nodiscard]] std::int64_t state_size() const noexcept { return 1; }

  void reset(std::uint64_t /*seed*/) noexcept { done_ = false; }
  TeamStep step(std::span<const std::int64_t> actions) {
    if (done_) throw EnvError("MatrixGame: step after the one step of its episode");
    done_ = true;
    return TeamStep{payoff(actions), true, false};
  }
  void observe(std::int64_t /*agent*/, std::span<float> out) const noexcept { out[0] = 1.0f; }
  void available_actions(std::int64_t /*agent*/, std::span<float> out) const noexcept {
    for (auto& x : out) x = 1.0f;
  }
  void write_state(std::span<float> out) const noexcept { out[0] = 1.0f; }

  /// The payoff of a joint action (one action per agent).
  [[nodiscard]] double payoff(std::span<const std::int64_t> actions) const {
    return payoff_[static_cast<std::size_t>(encode_joint_action(actions, n_))];
  }
  /// The payoff of a joint action index.
  [[nodiscard]] double payoff(std::int64_t joint) const { return payoff_.at(static_cast<std::size_t>(joint)); }
  /// The best payoff.
  [[nodiscard]] double optimum() const noexcept {
    std::int64_t entries = 1;
    for (std::int64_t i = 0; i < k_; ++i) entries *= n_;
    double best = payoff_[0];
    for (std::int64_t i = 1; i < entries; ++i) best = std::max(best, payoff_[static_cast<std::size_t>(i)]);
    return best;
  }

 private:
  std::int64_t k_ = 2, n_ = 3;
  std::array<double, kMaxEntries> payoff_{};
  std::array<char, 24> id_{};
  bool done_ = false;
};

static_assert(MultiAgentEnv<MatrixGame>);

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_agent/matrix_game.hpp> ----
// ---- begin <anvil/envs/multi_agent/registry.hpp> ----
/// @file
/// The built-in multi-agent envs by name, for programs that choose one at run time
/// (`--env.id=Mapping`): `with_team_env(id, f)` calls `f` with the `Joint` env of that name.
/// Light header: no torch.

#include <array>
#include <string>
#include <string_view>
#include <utility>

// ---- begin <anvil/envs/multi_agent/simple_spread.hpp> ----
/// @file
/// "Simple spread" of the multi-agent particle environments (Lowe et al. 2017, "Multi-Agent
/// Actor-Critic for Mixed Cooperative-Competitive Environments"; Mordatch and Abbeel 2018):
/// three agents must cover three landmarks without colliding, in episodes of 25 steps.
/// Written here from the published description and constants. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>


namespace anvil::envs {

/// Simple spread with the particle world's published physics:
///
/// - a 2-D world stepped with dt = 0.1; each step a movable entity's velocity is damped
///   by 0.25, then gains force/mass * dt (mass 1), and its position moves by velocity * dt;
/// - agents are discs of radius 0.15; landmarks (radius 0.05) do not collide or move;
/// - an agent's action: 0 no force, 1 +x, 2 -x, 3 +y, 4 -y (the particle envs' one-hot
///   action order, which EPyMARL's integer actions go through); the force is the unit
///   direction times the sensitivity 5;
/// - overlapping agents push each other apart with the soft contact force
///   100 * softplus(-(d - d_min) / 0.001) * 0.001 along the line between them;
/// - start: agents and landmarks uniform in [-1, 1]^2, velocities 0;
/// - an agent observes [its velocity, its position, each landmark relative to it, each
///   other agent relative to it, the others' communication (always 0 here)]: 18 numbers;
///   the state is the agents' observations concatenated (54), as EPyMARL gives its critics;
/// - reward, shared by the team: the particle envs' per-agent rewards summed over the
///   agents, as EPyMARL's published MPE returns are (its logged returns divided by the
///   number of agents): each agent gets minus the sum over landmarks of the distance to
///   the nearest agent, minus 1 for each agent within 0.3 of it, itself included (the
///   published scenario counts an agent's distance 0 to itself as a collision, so every
///   step costs the team 3 however it moves). A team reward is therefore
///   -3 * coverage - 3 - 2 * (colliding pairs);
/// - episodes end (truncated) after 25 steps.
///
/// Trivially copyable (checkpoints save it as bytes).
class SimpleSpread {
 public:
  static constexpr std::string_view name = "SimpleSpread";
  static constexpr int kAgents = 3, kLandmarks = 3;
  static constexpr std::int64_t kEpisodeSteps = 25;
  static constexpr double kDt = 0.1, kDamping = 0.25, kSensitivity = 5.0, kAgentSize = 0.15;
  static constexpr double kContactForce = 100.0, kContactMargin = 1e-3;

  [[nodiscard]] std::int64_t num_agents() const noexcept { return kAgents; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept { return 4 + 2 * kLandmarks + 4 * (kAgents - 1); }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return 5; }
  [[nodiscard]] std::int64_t state_size() const noexcept { return kAgents * agent_observation_size(); }

  void reset(std::uint64_t seed) {
    Rng rng(seed);
    for (auto& a : agents_) a = Body{{rng.uniform(-1, 1), rng.uniform(-1, 1)}, {0, 0}};
    for (auto& l : landmarks_) l = {rng.uniform(-1, 1), rng.uniform(-1, 1)};
    steps_ = 0;
    started_ = true;
  }

  TeamStep step(std::span<const std::int64_t> actions) {
    if (!started_) throw EnvError("SimpleSpread: step before reset");
    if (steps_ >= kEpisodeSteps) throw EnvError("SimpleSpread: step after the episode's 25 steps");
    std::array<std::array<double, 2>, kAgents> force{};
    for (int i = 0; i < kAgents; ++i) {
      const auto a = actions[static_cast<std::size_t>(i)];
      if (a < 0 || a > 4) throw EnvError("SimpleSpread: agent " + std::to_string(i) + " action " + std::to_string(a) + " is outside [0, 5)");
      if (a == 1) force[i][0] = kSensitivity;
      if (a == 2) force[i][0] = -kSensitivity;
      if (a == 3) force[i][1] = kSensitivity;
      if (a == 4) force[i][1] = -kSensitivity;
    }
    for (int i = 0; i < kAgents; ++i)
      for (int j = i + 1; j < kAgents; ++j) {
        const double dx = agents_[i].pos[0] - agents_[j].pos[0], dy = agents_[i].pos[1] - agents_[j].pos[1];
        const double d = std::sqrt(dx * dx + dy * dy);
        if (d == 0.0) continue;  // coincident centres push along no direction
        const double x = -(d - 2 * kAgentSize) / kContactMargin;
        const double pen = (x > 30 ? x : std::log1p(std::exp(x))) * kContactMargin;  // softplus
        const double f = kContactForce * pen / d;
        force[i][0] += f * dx;
        force[i][1] += f * dy;
        force[j][0] -= f * dx;
        force[j][1] -= f * dy;
      }
    for (int i = 0; i < kAgents; ++i)
      for (int c = 0; c < 2; ++c) {
        auto& v = agents_[i].vel[c];
        v = v * (1 - kDamping) + force[i][c] * kDt;
        agents_[i].pos[c] += v * kDt;
      }
    ++steps_;
    return TeamStep{reward(), false, steps_ >= kEpisodeSteps};
  }

  /// The team's reward in the current positions (see class comment).
  [[nodiscard]] double reward() const noexcept {
    double r = -kAgents * coverage_distance();
    for (int i = 0; i < kAgents; ++i)
      for (int j = 0; j < kAgents; ++j)
        if (distance(agents_[i].pos, agents_[j].pos) < 2 * kAgentSize) r -= 1.0;  // i == j included, as published
    return r;
  }
  /// Sum over landmarks of the distance to the nearest agent.
  [[nodiscard]] double coverage_distance() const noexcept {
    double s = 0;
    for (const auto& l : landmarks_) {
      double best = 1e300;
      for (const auto& a : agents_) best = std::min(best, distance(a.pos, l));
      s += best;
    }
    return s;
  }

  void observe(std::int64_t agent, std::span<float> out) const noexcept {
    const auto& me = agents_[static_cast<std::size_t>(agent)];
    std::size_t k = 0;
    out[k++] = static_cast<float>(me.vel[0]);
    out[k++] = static_cast<float>(me.vel[1]);
    out[k++] = static_cast<float>(me.pos[0]);
    out[k++] = static_cast<float>(me.pos[1]);
    for (const auto& l : landmarks_) {
      out[k++] = static_cast<float>(l[0] - me.pos[0]);
      out[k++] = static_cast<float>(l[1] - me.pos[1]);
    }
    for (int j = 0; j < kAgents; ++j) {
      if (j == agent) continue;
      out[k++] = static_cast<float>(agents_[j].pos[0] - me.pos[0]);
      out[k++] = static_cast<float>(agents_[j].pos[1] - me.pos[1]);
    }
    while (k < out.size()) out[k++] = 0.0f;  // the others' communication: silent agents
  }
  void available_actions(std::int64_t /*agent*/, std::span<float> out) const noexcept {
    for (auto& x : out) x = 1.0f;
  }
  void write_state(std::span<float> out) const noexcept {
    const auto d = static_cast<std::size_t>(agent_observation_size());
    for (int i = 0; i < kAgents; ++i) observe(i, out.subspan(i * d, d));
  }

  /// Places the agents and landmarks (tests; velocities become 0, the step count 0).
  void place(const std::array<std::array<double, 2>, kAgents>& agents,
             const std::array<std::array<double, 2>, kLandmarks>& landmarks) noexcept {
    for (int i = 0; i < kAgents; ++i) agents_[i] = Body{agents[i], {0, 0}};
    landmarks_ = landmarks;
    steps_ = 0;
    started_ = true;
  }
  [[nodiscard]] std::array<double, 2> agent_position(int i) const noexcept { return agents_[i].pos; }
  [[nodiscard]] std::array<double, 2> agent_velocity(int i) const noexcept { return agents_[i].vel; }

 private:
  struct Body {
    std::array<double, 2> pos{}, vel{};
  };
  static double distance(const std::array<double, 2>& a, const std::array<double, 2>& b) noexcept {
    return std::hypot(a[0] - b[0], a[1] - b[1]);
  }

  std::array<Body, kAgents> agents_{};
  std::array<std::array<double, 2>, kLandmarks> landmarks_{};
  std::int64_t steps_ = 0;
  bool started_ = false;
};

static_assert(MultiAgentEnv<SimpleSpread>);

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_agent/simple_spread.hpp> ----

namespace anvil::envs {

/// The names `with_team_env` knows: the mapping mission, simple spread, and the climbing,
/// penalty (k = -100) and credit (7 agents, 1 and 50) matrix games.
inline constexpr std::array<std::string_view, 5> kBuiltinTeamEnvs{"Mapping", "SimpleSpread", "Climbing", "Penalty",
                                                                  "Credit"};

/// Calls `f(env)` with the built-in multi-agent env named `id`, as a `Joint`; a ConfigError
/// naming `env.id` and the known names otherwise.
template <class F>
decltype(auto) with_team_env(std::string_view id, F&& f) {
  if (id == "Mapping") return std::forward<F>(f)(Joint<MappingTask>{});
  if (id == "SimpleSpread") return std::forward<F>(f)(Joint<SimpleSpread>{});
  if (id == "Climbing") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::climbing()));
  if (id == "Penalty") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::penalty(-100)));
  if (id == "Credit") return std::forward<F>(f)(Joint<MatrixGame>(MatrixGame::credit(7, 1.0, 50.0)));
  std::string known;
  for (auto n : kBuiltinTeamEnvs) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("env.id='" + std::string(id) + "' is not a built-in multi-agent env; choose one of " + known +
                    " (or pass your own MultiAgentEnv, wrapped in envs::Joint, to the Trainer)");
}

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_agent/registry.hpp> ----
// ---- begin <anvil/envs/multi_step.hpp> ----
/// @file
/// `MultiStep<E>`: an env seen through a window of its last observations and acting in
/// chunks of actions, as policies that predict action sequences act (Diffusion Policy's
/// evaluation wraps its envs the same way). One step of the wrapper executes
/// `action_horizon` actions of the inner env in turn, stopping early when the episode ends;
/// its reward is their sum; its observation is the inner env's last `obs_horizon`
/// observations, oldest first (after a reset: the first one repeated). Light header: no torch.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace anvil::envs {

/// An env `E` with a Box action, observed over `obs_horizon` steps and driven by chunks of
/// `action_horizon` actions (see file comment).
template <ContinuousEnv E>
class MultiStep {
 public:
  static constexpr std::string_view name = E::name;

  MultiStep(E env, int obs_horizon, int action_horizon) : env_(std::move(env)), to_(obs_horizon), ta_(action_horizon) {
    if (obs_horizon < 1 || action_horizon < 1)
      throw ConfigError("MultiStep: obs_horizon and action_horizon must be at least 1 (are " + std::to_string(obs_horizon) + ", " +
                        std::to_string(action_horizon) + ")");
    inner_obs_ = env_.observation_space().size();
    inner_act_ = env_.action_space().size();
    obs_.assign(static_cast<std::size_t>(to_) * inner_obs_, 0.0f);
  }

  [[nodiscard]] Box observation_space() const { return repeat(env_.observation_space(), to_); }
  [[nodiscard]] Box action_space() const { return repeat(env_.action_space(), ta_); }

  std::span<const float> reset(std::uint64_t seed) {
    const auto o = env_.reset(seed);
    for (int i = 0; i < to_; ++i) std::copy(o.begin(), o.end(), obs_.begin() + static_cast<std::ptrdiff_t>(i * inner_obs_));
    success_ = false;
    return obs_;
  }

  /// Executes the chunk's actions in turn (see file comment).
  StepResult step(std::span<const float> actions) {
    if (actions.size() != static_cast<std::size_t>(ta_) * inner_act_)
      throw EnvError(std::string(name) + ": a chunk of " + std::to_string(actions.size()) + " numbers; expected " +
                     std::to_string(ta_) + " actions of " + std::to_string(inner_act_));
    StepResult out{obs_, 0.0, false, false};
    success_ = false;
    for (int i = 0; i < ta_; ++i) {
      const auto r = env_.step(actions.subspan(static_cast<std::size_t>(i) * inner_act_, inner_act_));
      out.reward += r.reward;
      if constexpr (ReportsSuccess<E>) success_ = success_ || env_.success();
      std::copy(obs_.begin() + static_cast<std::ptrdiff_t>(inner_obs_), obs_.end(), obs_.begin());
      std::copy(r.observation.begin(), r.observation.end(), obs_.end() - static_cast<std::ptrdiff_t>(inner_obs_));
      out.terminated = r.terminated;
      out.truncated = r.truncated;
      if (r.terminated || r.truncated) break;
    }
    out.observation = obs_;
    return out;
  }

  /// Whether any step of the last chunk met the task's goal (when the env says so).
  [[nodiscard]] bool success() const noexcept
    requires ReportsSuccess<E>
  {
    return success_;
  }

  [[nodiscard]] int obs_horizon() const noexcept { return to_; }
  [[nodiscard]] int action_horizon() const noexcept { return ta_; }
  [[nodiscard]] E& env() noexcept { return env_; }
  [[nodiscard]] const E& env() const noexcept { return env_; }

  void save_state(BinaryWriter& w) const {
    if constexpr (SavesOwnState<E>) env_.save_state(w);
    else w.value(env_);
    w.bytes(obs_.data(), obs_.size() * sizeof(float));
    w.value(success_);
  }
  void load_state(BinaryReader& r) {
    if constexpr (SavesOwnState<E>) env_.load_state(r);
    else env_ = r.value<E>("inner env");
    r.bytes(obs_.data(), obs_.size() * sizeof(float), "observation window");
    success_ = r.value<bool>("chunk success");
  }

 private:
  static Box repeat(const Box& b, int n) {
    Box out;
    for (int i = 0; i < n; ++i) {
      out.low.insert(out.low.end(), b.low.begin(), b.low.end());
      out.high.insert(out.high.end(), b.high.begin(), b.high.end());
    }
    return out;
  }

  E env_;
  int to_, ta_;
  std::size_t inner_obs_ = 0, inner_act_ = 0;
  std::vector<float> obs_;
  bool success_ = false;
};

}  // namespace anvil::envs
// ---- end <anvil/envs/multi_step.hpp> ----
// ---- begin <anvil/envs/normalize.hpp> ----
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

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

// ---- begin <anvil/envs/vec_env.hpp> ----
/// @file
/// `VecEnvBase`: N envs stepped together, with autoreset, distinct seeds, and batched tensors
/// out, behind a face that names no env type (so a Trainer's type does not depend on its
/// env's); `LocalVecEnv`, the one anvil steps itself, is compiled once whatever the env: the
/// envs come as an `EnvBatch` (envs/env_batch.hpp, where every step and reset is checked).
/// Storage is allocated once; a step copies each env's observation into preallocated rows
/// and allocates nothing.
///
/// Sync mode steps inside `step()`. Async mode steps on a background thread between
/// `step_async(actions)` and `step_wait()`, so a trainer can run gradient updates while
/// the envs step (the updates do not need the newest transition).

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// ---- begin <anvil/core/detail/thread_pool.hpp> ----
/// @file
/// A minimal fork-join pool, for stepping envs and for the independent gradients of an
/// update: `parallel_for` splits [0, n) into one contiguous chunk per thread, the caller
/// runs the first, and the first exception thrown is rethrown in the caller. Between calls
/// workers spin for a few tens of microseconds (a training loop calls again that soon, and
/// waking a sleeping thread costs about as long on a VM), then sleep on a condition
/// variable, so an idle pool takes no CPU from training. `available_cores` counts the cores
/// this process may run on. Light header.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <istream>
#include <sstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace anvil::detail {

/// The whole cores a cgroup CPU quota allows the process whose `/proc/<pid>/cgroup` text
/// is `cgroup` (rounded up; 0: no quota found), read from the cgroup file system mounted at
/// `root`: cgroup v2's `cpu.max` ("max" is none) or v1's `cpu.cfs_quota_us` over
/// `cpu.cfs_period_us` (-1 is none), in the process's own group or, inside a container
/// whose cgroup namespace hides the path, at the root.
inline int cgroup_quota_cores(std::istream& cgroup, const std::string& root) {
  auto cores = [](double quota, double period) {
    return quota > 0 && period > 0 ? static_cast<int>((quota + period - 1) / period) : 0;
  };
  for (std::string line; std::getline(cgroup, line);) {
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {  // v2: "0::/path"
      for (const std::string& dir : {root + path, root}) {
        std::ifstream f(dir + "/cpu.max");
        std::string quota;
        double period = 0, q = 0;
        if (f >> quota >> period) return std::istringstream(quota) >> q ? cores(q, period) : 0;  // "max": none
      }
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {  // v1: "N:cpu,cpuacct:/path"
      for (const std::string& dir : {root + "/cpu,cpuacct" + path, root + "/cpu" + path, root + "/cpu,cpuacct",
                                     root + "/cpu"}) {
        std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
        double quota = 0, period = 0;
        if (q >> quota && p >> period) return cores(quota, period);
      }
    }
  }
  return 0;
}

/// The cores this process may use now: its CPU affinity (taskset, a container's cpuset),
/// capped by a cgroup CPU quota (`docker --cpus`); `std::thread::hardware_concurrency()`
/// where neither is known. At least 1.
inline int count_available_cores() {
  int n = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
  std::ifstream cgroup("/proc/self/cgroup");
  if (const int quota = cgroup_quota_cores(cgroup, "/sys/fs/cgroup"); quota > 0) n = n > 0 ? std::min(n, quota) : quota;
#endif
  return std::max(1, n);
}

/// `count_available_cores()` at its first call. A thread that spins waiting for another on
/// the same core only delays it, so thread counts and spin-waits follow this, not the
/// machine's core count.
inline int available_cores() {
  static const int cores = count_available_cores();
  return cores;
}

/// Busy-waits up to 50 microseconds for `ready()`; returns whether it came true. Waking a
/// thread blocked on a condition variable takes tens of microseconds on a VM; a handoff
/// that is about to happen is cheaper to wait for this way.
template <class Pred>
inline bool spin_until(Pred ready) {
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

class ThreadPool {
 public:
  /// `threads` counts the caller: 1 means no worker threads at all. `on_start` runs first
  /// in each worker (e.g. to give it the caller's OpenMP thread count, which OpenMP keeps
  /// per thread).
  explicit ThreadPool(int threads, std::function<void()> on_start = {})
      : threads_(threads < 1 ? 1 : threads) {
    for (int w = 1; w < threads_; ++w)
      workers_.emplace_back([this, w, on_start] {
        if (on_start) on_start();
        work(w);
      });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  [[nodiscard]] int threads() const noexcept { return threads_; }

  /// Runs `fn(begin, end)` over contiguous chunks covering [0, n) and waits for all.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
    if (threads_ == 1 || n <= 1) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_.store(threads_ - 1);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      auto [b, e] = chunk(0);
      fn(b, e);
    } catch (...) {
      mine = std::current_exception();
    }
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_.load() == 0; });
    fn_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::pair<std::int64_t, std::int64_t> chunk(int w) const {
    const std::int64_t per = n_ / threads_, extra = n_ % threads_;
    const std::int64_t b = w * per + std::min<std::int64_t>(w, extra);
    return {b, b + per + (w < extra ? 1 : 0)};
  }

  void work(int w) {
    std::uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); });
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      auto [b, e] = chunk(w);
      const auto* fn = fn_;
      lock.unlock();
      std::exception_ptr err;
      try {
        if (b < e) (*fn)(b, e);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (pending_.fetch_sub(1) == 1) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t, std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
};

}  // namespace anvil::detail
// ---- end <anvil/core/detail/thread_pool.hpp> ----
// ---- begin <anvil/envs/any_env.hpp> ----
/// @file
/// `envs::AnyEnv`: the one door every env takes into a Trainer. A Trainer's type does not
/// depend on its env's, so the env is type-erased here, at the boundary, in the caller's
/// translation unit:
///  - an `Env` type `E` becomes a maker of `EnvArray<E>` (envs/env_batch.hpp: the part of a
///    VecEnv that knows the type, light), which anvil's VecEnv (compiled once, with the
///    Trainer) steps, checks and batches; a prebuilt Trainer (`anvil::compiled`) thus trains
///    any env, a program's own included, and the program's translation unit compiles no torch;
///  - envs that come batched already (Python vector envs, a simulator with its own batching)
///    come as a maker of a `VecEnvBase` (envs/vec_env.hpp).
/// Observations cross the door as rows of float32 numbers (`EnvSpec::observation`); how other
/// dtypes and dict observations will cross it is in DESIGN (docs/design.md, "The env door").
/// Light header.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

// ---- begin <anvil/envs/env_batch.hpp> ----
/// @file
/// `EnvBatch`: N envs of one type behind a face that does not name the type, stepped into
/// rows of floats that the caller owns; `EnvArray<E>` is it for an `Env` type `E`. This is
/// the part of a VecEnv that knows the env's type: autoreset, distinct seed streams, the
/// running episode returns, and the checks of every step and reset (an observation of the
/// wrong length, a non-finite observation or reward, or an exception from the env is an
/// EnvError naming the env, the step and the field: `Pendulum-v1: env 3 of 16: step 512:
/// reward is nan`). The VecEnv around it (envs/vec_env.hpp) owns the tensors, the threads and
/// the async stepping, and is compiled once, whatever the env.
///
/// Light header: a program's own env is wrapped here, in its own translation unit, without
/// torch (`envs::AnyEnv`, envs/any_env.hpp, is the door a Trainer takes it through).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>


namespace anvil::envs {

/// An episode that ended during a step.
struct EpisodeEnd {
  std::int64_t env = 0;
  double episode_return = 0.0;
  std::int64_t length = 0;
  bool terminated = false;  ///< false: truncated by the time limit
  std::int32_t group = -1;  ///< its task (index into `VecEnvBase::groups()`), -1 when the env has none
  std::int8_t success = -1;  ///< whether any step met the goal (`envs::ReportsSuccess`); -1: the env does not say
};

/// Where a batched step writes, one row (or number) per env, owned by the caller.
struct StepRows {
  float* obs = nullptr;          ///< [N, obs_dim] what to act on next (a new episode's first where one ended)
  float* next_obs = nullptr;     ///< [N, obs_dim] what the step led to (the last of an ended episode)
  float* reward = nullptr;       ///< [N]
  float* terminated = nullptr;   ///< [N] 0/1
  float* truncated = nullptr;    ///< [N] 0/1
  std::int64_t* task = nullptr;  ///< [N] each env's task during the step (null: the envs have no tasks)
  EpisodeEnd* ended = nullptr;   ///< [N] the episode env i ended in this step (length 0: none)
};

/// N envs behind a face that names no env type (see file comment). Env i's episodes are
/// seeded from its own stream, so no two envs, and no two episodes, share a seed. Not
/// thread-safe, but `step` over disjoint ranges of envs may run on several threads at once.
class EnvBatch {
 public:
  virtual ~EnvBatch() = default;
  EnvBatch(const EnvBatch&) = delete;
  EnvBatch& operator=(const EnvBatch&) = delete;

  [[nodiscard]] const EnvSpec& spec() const noexcept { return spec_; }
  [[nodiscard]] std::int64_t size() const noexcept { return n_; }
  /// The tasks of a task-tagged env (`envs::TaskTagged`), in its order; empty without tasks.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return groups_; }
  /// Whether the envs' state can be saved (trivially copyable envs, or `SavesOwnState`).
  [[nodiscard]] virtual bool saves_state() const noexcept = 0;
  /// Whether the env says when an episode succeeds (`envs::ReportsSuccess`).
  [[nodiscard]] virtual bool reports_success() const noexcept = 0;
  /// Whether the envs have tasks (then `StepRows::task` must be given).
  [[nodiscard]] bool has_tasks() const noexcept { return has_tasks_; }

  /// Starts a new episode in every env, its first observation into row i of `obs`; `steps`
  /// is how many batched steps were taken before (for errors).
  virtual void reset(float* obs, std::int64_t steps) = 0;
  /// Steps envs [begin, end) with their rows of `actions` (float [N, act_dim] for a Box,
  /// int64 [N] for Discrete) and writes their rows of `out`; an env whose episode ends is
  /// reset at once (its first observation in `out.obs`). `steps`: batched steps before this one.
  virtual void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) = 0;

  /// State protocol, in two parts around the caller's own: the envs and their seed streams;
  /// then the running episodes (returns, lengths, successes). Each read checks what it reads
  /// and returns what applies it, changing nothing before.
  virtual void save_envs(BinaryWriter& w) const = 0;
  [[nodiscard]] virtual std::function<void()> read_envs(BinaryReader& r) = 0;
  void save_episodes(BinaryWriter& w) const {
    w.bytes(returns_.data(), returns_.size() * sizeof(double));
    w.bytes(lengths_.data(), lengths_.size() * sizeof(std::int64_t));
    w.bytes(succeeded_.data(), succeeded_.size());
  }
  [[nodiscard]] std::function<void()> read_episodes(BinaryReader& r) {
    auto returns = std::make_shared<std::vector<double>>(returns_.size());
    r.bytes(returns->data(), returns->size() * sizeof(double), "episode returns");
    auto lengths = std::make_shared<std::vector<std::int64_t>>(lengths_.size());
    r.bytes(lengths->data(), lengths->size() * sizeof(std::int64_t), "episode lengths");
    auto succeeded = std::make_shared<std::vector<std::uint8_t>>(succeeded_.size());
    r.bytes(succeeded->data(), succeeded->size(), "episode successes");
    return [this, returns, lengths, succeeded] {
      returns_ = std::move(*returns);
      lengths_ = std::move(*lengths);
      succeeded_ = std::move(*succeeded);
    };
  }

 protected:
  EnvBatch(EnvSpec spec, std::int64_t n, std::vector<std::string> groups, bool has_tasks)
      : spec_(std::move(spec)), n_(n), groups_(std::move(groups)), has_tasks_(has_tasks) {
    returns_.assign(static_cast<std::size_t>(n_), 0.0);
    lengths_.assign(static_cast<std::size_t>(n_), 0);
    succeeded_.assign(static_cast<std::size_t>(n_), 0);
  }

  // "Pendulum-v1: env 3 of 16: step 512 (step 7 of its episode): ", where `when` is "step",
  // "reset" or "autoreset" (after an episode ended in the step under way).
  [[nodiscard]] std::string at_fault(std::int64_t i, std::string_view when, std::int64_t steps) const {
    std::string s = spec_.name + ": env " + std::to_string(i) + " of " + std::to_string(n_) + ": ";
    if (when == "step")
      return s + "step " + std::to_string(steps + 1) + " (step " + std::to_string(lengths_[static_cast<std::size_t>(i)] + 1) +
             " of its episode): ";
    return s + "reset after step " + std::to_string(steps + (when == "autoreset" ? 1 : 0)) + ": ";
  }
  // The observation env i returned has the space's length and only finite numbers (a NaN or
  // inf turns the sum of x * 0 into NaN: one multiply-add per number when all is well).
  void check_observation(std::int64_t i, std::span<const float> o, std::string_view when, std::int64_t steps) const {
    const auto d = spec_.obs_dim();
    if (static_cast<std::int64_t>(o.size()) != d)
      throw EnvError(at_fault(i, when, steps) + "observation has " + std::to_string(o.size()) +
                     " numbers; the observation space has " + std::to_string(d));
    float probe = 0.0f;
    for (float x : o) probe += x * 0.0f;
    if (probe == 0.0f) return;
    for (std::size_t k = 0; k < o.size(); ++k)
      if (!std::isfinite(o[k]))
        throw EnvError(at_fault(i, when, steps) + "observation[" + std::to_string(k) + "] is " + non_finite_name(o[k]));
  }

  EnvSpec spec_;
  std::int64_t n_;
  std::vector<std::string> groups_;
  bool has_tasks_;
  std::vector<double> returns_;
  std::vector<std::int64_t> lengths_;
  std::vector<std::uint8_t> succeeded_;  // per env: whether a step of its episode met the goal
};

/// N envs of type `E` (see `EnvBatch`).
template <Env E>
class EnvArray final : public EnvBatch {
 public:
  /// `cfg.num_envs` copies of `prototype` with the config's env.id, env.suite and env.tasks
  /// applied (or refused, naming the field). `first`: the index of env 0 among all envs of
  /// the run (every rank's), which `envs::Placeable` envs are told (`place(first + i,
  /// count)`); `count` (0: this batch's size) is how many there are in all.
  EnvArray(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first = 0, std::int64_t count = 0)
      : EnvArray(configured(prototype, cfg), cfg.num_envs, seed, first, count) {}

  [[nodiscard]] bool saves_state() const noexcept override { return kSavesState; }
  [[nodiscard]] bool reports_success() const noexcept override { return ReportsSuccess<E>; }

  /// Env `i`, e.g. to inspect its state in tests.
  [[nodiscard]] const E& env(std::int64_t i) const { return envs_.at(static_cast<std::size_t>(i)); }
  [[nodiscard]] E& env(std::int64_t i) { return envs_.at(static_cast<std::size_t>(i)); }

  void reset(float* obs, std::int64_t steps) override;

  void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) override;

  void save_envs(BinaryWriter& w) const override;

  [[nodiscard]] std::function<void()> read_envs(BinaryReader& r) override;

 private:
  static constexpr bool kSavesState = std::is_trivially_copyable_v<E> || SavesOwnState<E>;

  EnvArray(E prototype, std::int64_t n, std::uint64_t seed, std::int64_t first, std::int64_t count)
      : EnvBatch(spec_of(prototype), n, groups_of(prototype), TaskTagged<E>) {
    envs_.assign(static_cast<std::size_t>(n_), prototype);
    if constexpr (Placeable<E>)
      for (std::int64_t i = 0; i < n_; ++i) envs_[static_cast<std::size_t>(i)].place(first + i, count > 0 ? count : n_);
    for (std::int64_t i = 0; i < n_; ++i) seeds_.emplace_back(derive_seed(seed, Stream::env, static_cast<std::uint64_t>(i)));
  }

  // The prototype with the config's env.id, env.suite and env.tasks applied (or refused).
  static E configured(const E& prototype, const VecEnvConfig& cfg) {
    if (!cfg.id->empty() && *cfg.id != env_name(prototype))
      throw ConfigError("env.id=" + *cfg.id + ": this program trains " + env_name(prototype) +
                        " (env.id chooses the env only in programs that take it at run time, e.g. train_ppo)");
    E e = prototype;
    if (cfg.suite->empty() && cfg.tasks->empty()) return e;
    if constexpr (TaskSelectable<E>) e.select_tasks(*cfg.suite, *cfg.tasks);
    else
      throw ConfigError(std::string(cfg.suite->empty() ? "env.tasks" : "env.suite") + ": " + std::string(E::name) +
                        " has no tasks to choose");
    return e;
  }
  static std::vector<std::string> groups_of(const E& e) {
    if constexpr (TaskTagged<E>) return e.task_names();
    else return {};
  }
  static std::int32_t group_of(const E& e) {
    if constexpr (TaskTagged<E>) return static_cast<std::int32_t>(e.task_index());
    else return -1;
  }

  // Env i's first observation of a new episode (from its own seed stream), checked.
  std::span<const float> reset_env(std::int64_t i, std::string_view when, std::int64_t steps);

  std::vector<E> envs_;
  std::vector<Rng> seeds_;
};

template <Env E>
void EnvArray<E>::reset(float* obs, std::int64_t steps) {
  const auto d = spec_.obs_dim();
  for (std::int64_t i = 0; i < n_; ++i) {
    const auto first = reset_env(i, "reset", steps);
    std::copy(first.begin(), first.end(), obs + i * d);
    returns_[static_cast<std::size_t>(i)] = 0.0;
    lengths_[static_cast<std::size_t>(i)] = 0;
    succeeded_[static_cast<std::size_t>(i)] = 0;
  }
}

template <Env E>
void EnvArray<E>::step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) {
  const auto d = spec_.obs_dim();
  for (std::int64_t i = begin; i < end; ++i) {
    const auto k = static_cast<std::size_t>(i);
    E& env = envs_[k];
    if (out.task) out.task[i] = group_of(env);  // the task the step belongs to (before an autoreset)
    StepResult r;
    try {
      if constexpr (DiscreteEnv<E>) {
        r = env.step(static_cast<const std::int64_t*>(actions)[i]);
      } else {
        const auto ad = spec_.action_dim();
        r = env.step(std::span<const float>(static_cast<const float*>(actions) + i * ad, static_cast<std::size_t>(ad)));
      }
    } catch (const EnvError& err) {  // it names the env and its own step count
      throw EnvError("env " + std::to_string(i) + " of " + std::to_string(n_) + ": step " + std::to_string(steps + 1) + ": " +
                     err.what());
    } catch (const std::exception& err) {
      throw EnvError(at_fault(i, "step", steps) + err.what());
    }
    check_observation(i, r.observation, "step", steps);
    if (!std::isfinite(r.reward)) throw EnvError(at_fault(i, "step", steps) + "reward is " + non_finite_name(r.reward));
    std::copy(r.observation.begin(), r.observation.end(), out.next_obs + i * d);
    out.reward[i] = static_cast<float>(r.reward);
    out.terminated[i] = r.terminated ? 1.0f : 0.0f;
    out.truncated[i] = r.truncated ? 1.0f : 0.0f;
    returns_[k] += r.reward;
    ++lengths_[k];
    if constexpr (ReportsSuccess<E>) succeeded_[k] |= env.success() ? 1 : 0;
    out.ended[i] = EpisodeEnd{};
    if (r.terminated || r.truncated) {
      out.ended[i] = EpisodeEnd{i, returns_[k], lengths_[k], r.terminated, group_of(env),
                                static_cast<std::int8_t>(ReportsSuccess<E> ? succeeded_[k] : -1)};
      returns_[k] = 0.0;
      lengths_[k] = 0;
      succeeded_[k] = 0;
      const auto first = reset_env(i, "autoreset", steps);
      std::copy(first.begin(), first.end(), out.obs + i * d);
    } else {
      std::copy(r.observation.begin(), r.observation.end(), out.obs + i * d);
    }
  }
}

template <Env E>
void EnvArray<E>::save_envs(BinaryWriter& w) const {
  if constexpr (kSavesState) {
    if constexpr (std::is_trivially_copyable_v<E>) {
      w.value(static_cast<std::uint64_t>(sizeof(E)));
      w.bytes(envs_.data(), envs_.size() * sizeof(E));
    } else {
      w.value(std::uint64_t{0});  // each env writes its own state
      for (const auto& e : envs_) e.save_state(w);
    }
    for (const auto& g : seeds_) w.value(g.state());
  } else {
    throw Error(spec_.name + ": envs of this type cannot be saved (not trivially copyable, no save_state)");
  }
}

template <Env E>
std::function<void()> EnvArray<E>::read_envs(BinaryReader& r) {
  if constexpr (!kSavesState) {
    r.fail("env state flag", "says the envs were saved, but " + spec_.name + " cannot be restored here");
    return {};
  } else {
    auto envs = std::make_shared<std::vector<E>>(envs_);
    if constexpr (std::is_trivially_copyable_v<E>) {
      r.expect(static_cast<std::uint64_t>(sizeof(E)), "env state size");
      r.bytes(envs->data(), envs->size() * sizeof(E), "env states");
    } else {
      r.expect(std::uint64_t{0}, "env state size");
      for (auto& e : *envs) e.load_state(r);  // into copies: nothing changes until applied
    }
    auto seeds = std::make_shared<std::vector<Rng::State>>();
    for (std::int64_t i = 0; i < n_; ++i) seeds->push_back(r.value<Rng::State>("env seed streams"));
    return [this, envs, seeds] {
      envs_ = std::move(*envs);
      for (std::size_t i = 0; i < seeds_.size(); ++i) seeds_[i].set_state((*seeds)[i]);
    };
  }
}

template <Env E>
std::span<const float> EnvArray<E>::reset_env(std::int64_t i, std::string_view when, std::int64_t steps) {
  std::span<const float> first;
  try {
    first = envs_[static_cast<std::size_t>(i)].reset(seeds_[static_cast<std::size_t>(i)]());
  } catch (const std::exception& err) {
    throw EnvError(at_fault(i, when, steps) + err.what());
  }
  check_observation(i, first, when, steps);
  return first;
}

}  // namespace anvil::envs
// ---- end <anvil/envs/env_batch.hpp> ----

namespace anvil::envs {

class VecEnvBase;  // envs/vec_env.hpp

/// Any env, as a Trainer takes it (see file comment). Copyable; what it holds makes the
/// training envs and, as many times as asked, the evaluation envs.
class AnyEnv {
 public:
  /// Makes `cfg.num_envs` envs seeded from `seed`; `first` is the index of the first among
  /// all envs of the run (every rank's), `count` how many there are in all (0: these).
  using BatchMaker = std::function<std::unique_ptr<EnvBatch>(const VecEnvConfig& cfg, std::uint64_t seed,
                                                             std::int64_t first, std::int64_t count)>;
  /// The same for envs that come batched (a `VecEnvBase` of `cfg.num_envs` envs).
  using VecMaker = std::function<std::unique_ptr<VecEnvBase>(const VecEnvConfig& cfg, std::uint64_t seed,
                                                             std::int64_t first, std::int64_t count)>;

  /// Copies of `prototype`, stepped by anvil's VecEnv. Implicit, so a Trainer takes an env
  /// as it is: `Trainer t(MyEnv{}, cfg)`.
  /// (Defined below the class, not inline, so a library may hold it for an env type:
  /// `anvil::compiled` does for the built-in envs.)
  template <Env E>
  AnyEnv(const E& prototype);  // NOLINT(google-explicit-constructor): the door is meant to be walked through

  /// Envs that come batched: `make` builds them (`name` names them until they exist).
  AnyEnv(std::string name, VecMaker make) : name_(std::move(name)), vec_(std::move(make)) {
    if (!vec_) throw Error("AnyEnv '" + name_ + "': no maker of its envs");
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The maker of per-type envs (empty for envs that come batched).
  [[nodiscard]] const BatchMaker& batch_maker() const noexcept { return batch_; }
  /// The maker of batched envs (empty for an `Env` type).
  [[nodiscard]] const VecMaker& vec_maker() const noexcept { return vec_; }

 private:
  std::string name_;
  BatchMaker batch_;
  VecMaker vec_;
};

template <Env E>
AnyEnv::AnyEnv(const E& prototype)
    : name_(env_name(prototype)),
      batch_([prototype](const VecEnvConfig& c, std::uint64_t seed, std::int64_t first, std::int64_t count) {
        return std::unique_ptr<EnvBatch>(std::make_unique<EnvArray<E>>(prototype, c, seed, first, count));
      }) {}

}  // namespace anvil::envs
// ---- end <anvil/envs/any_env.hpp> ----

namespace anvil::envs {

/// One step of all envs. Tensors are views of the VecEnv's storage, valid until the step
/// after next (`obs` is double-buffered so the previous observation survives one step).
struct VecStep {
  at::Tensor obs;         ///< [N, obs_dim] what to act on next (the first of a new episode where one ended)
  at::Tensor next_obs;    ///< [N, obs_dim] what the step led to (the last of an ended episode)
  at::Tensor reward;      ///< [N] float
  at::Tensor terminated;  ///< [N] float 0/1
  at::Tensor truncated;   ///< [N] float 0/1
  at::Tensor task;        ///< [N] int64: each env's task during the step (envs with tasks; else undefined)
  std::vector<EpisodeEnd> ended;
};

/// The env-type-independent face of a VecEnv, so a Trainer's type does not depend on the
/// env's type. One virtual call per batched step.
class VecEnvBase {
 public:
  virtual ~VecEnvBase() = default;
  [[nodiscard]] const EnvSpec& spec() const noexcept { return spec_; }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return n_; }
  /// Whether steps run inside `step_wait` (sync) or in the background from `step_async` on.
  [[nodiscard]] virtual VecMode mode() const noexcept = 0;
  /// Resets every env (env i with its own seed stream) and returns the observations.
  virtual at::Tensor reset() = 0;
  /// Starts a step with `actions`: [N, act_dim] float for a Box, [N] int64 for Discrete.
  virtual void step_async(const at::Tensor& actions) = 0;
  /// Finishes the step started by step_async.
  virtual const VecStep& step_wait() = 0;
  /// step_async then step_wait.
  const VecStep& step(const at::Tensor& actions) {
    step_async(actions);
    return step_wait();
  }

  /// The observations the envs show now (the `obs` of the last step or reset); undefined
  /// before the first reset.
  [[nodiscard]] virtual at::Tensor observations() const = 0;
  /// Whether `save` records the envs' state: env types that are trivially copyable (all the
  /// built-in ones) are saved as bytes; others are not saved, and a resumed run starts
  /// their episodes afresh.
  [[nodiscard]] virtual bool saves_state() const noexcept = 0;
  /// Writes every env's state, its seed stream, the current observations and the running
  /// episode returns and lengths, so a resumed run steps on exactly as this one would (only
  /// a flag when `saves_state()` is false).
  virtual void save(BinaryWriter& w) const = 0;
  /// Reads what `save` wrote, checking the env and the env count; changes nothing until the
  /// returned function is called (after the whole file has been checked). Returns an empty
  /// function when the file holds no env state.
  [[nodiscard]] virtual std::function<void()> read(BinaryReader& r) = 0;
  /// Applies what `read` returned (the state protocol, core/state.hpp).
  void restore(const std::function<void()>& apply) {
    if (apply) apply();
  }
  /// The discount of the algorithm learning from these envs (a reward normaliser scales by
  /// the spread of the discounted return); the loop gives it before the run starts.
  virtual void set_discount(double gamma) { (void)gamma; }
  /// With several ranks: merges statistics the envs keep (a normalising wrapper's running
  /// means) over the ranks, `sum` adding a double tensor over them in place. Plain envs
  /// keep none.
  virtual void sync_statistics(const std::function<void(at::Tensor&)>& sum) { (void)sum; }

  /// The groups episodes fall into, for breakdowns in evaluations: the tasks of a
  /// task-tagged env (`envs::TaskTagged`), in the order the env names them; empty when the
  /// env has no tasks. `EpisodeEnd::group` indexes it.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return groups_; }
  /// Whether the env says when an episode succeeds (`envs::ReportsSuccess`): then
  /// `EpisodeEnd::success` is 0 or 1, else -1.
  [[nodiscard]] virtual bool reports_success() const noexcept { return false; }

 protected:
  VecEnvBase(EnvSpec spec, std::int64_t n, std::vector<std::string> groups = {})
      : spec_(std::move(spec)), n_(n), groups_(std::move(groups)) {}
  EnvSpec spec_;
  std::int64_t n_;
  std::vector<std::string> groups_;
};

/// The VecEnv anvil steps itself, in this process, for envs of any type (see file comment).
class LocalVecEnv : public VecEnvBase {
 public:
  LocalVecEnv(std::unique_ptr<EnvBatch> envs, const VecEnvConfig& cfg)
      : VecEnvBase(envs->spec(), envs->size(), envs->groups()), envs_(std::move(envs)), mode_(cfg.mode), pool_(cfg.threads) {
    const auto d = spec_.obs_dim();
    const auto f = at::TensorOptions().dtype(at::kFloat);
    for (auto& o : obs_) o = at::zeros({n_, d}, f);
    next_obs_ = at::zeros({n_, d}, f);
    reward_ = at::zeros({n_}, f);
    terminated_ = at::zeros({n_}, f);
    truncated_ = at::zeros({n_}, f);
    if (envs_->has_tasks()) task_ = at::zeros({n_}, f.dtype(at::kLong));
    ended_.resize(static_cast<std::size_t>(n_));
    if (mode_ == VecMode::async) stepper_ = std::thread([this] { run_stepper(); });
  }
  LocalVecEnv(const LocalVecEnv&) = delete;
  LocalVecEnv& operator=(const LocalVecEnv&) = delete;
  ~LocalVecEnv() override {
    if (stepper_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      stepper_.join();
    }
  }

  at::Tensor observations() const override { return started_ ? obs_[cur_] : at::Tensor(); }
  bool saves_state() const noexcept override { return envs_->saves_state(); }
  bool reports_success() const noexcept override { return envs_->reports_success(); }
  VecMode mode() const noexcept override { return mode_; }

  void save(BinaryWriter& w) const override {
    w.value(saves_state());
    if (!saves_state()) return;
    if (in_flight_) throw Error("VecEnv::save: a step is in flight; save between steps");
    w.string(spec_.name);
    w.value(n_);
    envs_->save_envs(w);
    w.value(started_);
    w.value(steps_);
    const auto o = obs_[cur_].contiguous();
    w.bytes(o.data_ptr(), static_cast<std::size_t>(o.numel()) * sizeof(float));
    envs_->save_episodes(w);
  }

  std::function<void()> read(BinaryReader& r) override {
    if (!r.value<bool>("env state flag")) return {};
    if (!saves_state()) r.fail("env state flag", "says the envs were saved, but " + spec_.name + " cannot be restored here");
    const auto name = r.string("env name");
    if (name != spec_.name) r.fail("env name", "is '" + name + "' in the file but '" + spec_.name + "' here");
    r.expect(n_, "env.num_envs");
    auto envs = envs_->read_envs(r);
    const bool started = r.value<bool>("env started flag");
    const auto steps = r.value<std::int64_t>("env step count");
    auto obs = at::empty_like(obs_[cur_]);
    r.bytes(obs.data_ptr(), static_cast<std::size_t>(obs.numel()) * sizeof(float), "env observations");
    auto episodes = envs_->read_episodes(r);
    return [this, envs = std::move(envs), started, steps, obs, episodes = std::move(episodes)] {
      wait_idle();
      envs();
      started_ = started;
      steps_ = steps;
      obs_[cur_].copy_(obs);
      episodes();
    };
  }

  at::Tensor reset() override {
    wait_idle();
    envs_->reset(obs_[cur_].data_ptr<float>(), steps_);
    started_ = true;
    return obs_[cur_];
  }

  void step_async(const at::Tensor& actions) override {
    if (!started_) throw EnvError(spec_.name + ": VecEnv stepped before reset()");
    if (in_flight_) throw EnvError(spec_.name + ": step_async called twice without step_wait");
    check_actions(actions);
    actions_ = actions;
    in_flight_ = true;
    if (mode_ == VecMode::sync) return;
    {
      std::lock_guard lock(mu_);
      requested_ = true;
    }
    cv_.notify_all();
  }

  const VecStep& step_wait() override {
    if (!in_flight_) throw EnvError(spec_.name + ": step_wait without step_async");
    if (mode_ == VecMode::sync) {
      do_step();
    } else {
      // Spin only when a core is free for it: the stepper and its pool are busy meanwhile.
      if (pool_.threads() + 1 <= anvil::detail::available_cores())
        anvil::detail::spin_until([this] { return !requested_.load(std::memory_order_acquire); });
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return !requested_.load(); });
    }
    in_flight_ = false;
    if (auto err = std::exchange(error_, nullptr)) std::rethrow_exception(err);
    out_.obs = obs_[cur_];
    out_.next_obs = next_obs_;
    out_.reward = reward_;
    out_.terminated = terminated_;
    out_.truncated = truncated_;
    out_.task = task_;
    out_.ended.clear();
    for (std::int64_t i = 0; i < n_; ++i)
      if (ended_[static_cast<std::size_t>(i)].length > 0) out_.ended.push_back(ended_[static_cast<std::size_t>(i)]);
    return out_;
  }

  /// Batched steps taken so far (saved in checkpoints): the step errors name.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The envs it steps.
  [[nodiscard]] const EnvBatch& batch() const noexcept { return *envs_; }

 private:
  void check_actions(const at::Tensor& a) const {
    const std::string who = spec_.name + " VecEnv: ";
    if (a.device().type() != at::kCPU) throw EnvError(who + "actions must be on the CPU");
    if (spec_.discrete()) {
      if (a.scalar_type() != at::kLong || a.numel() != n_)
        throw EnvError(who + "discrete actions must be an int64 tensor of " + std::to_string(n_) + " indices, got " +
                       std::string(a.dtype().name()) + " with " + std::to_string(a.numel()) + " elements");
    } else {
      const auto ad = spec_.action_dim();
      if (a.scalar_type() != at::kFloat || a.dim() != 2 || a.size(0) != n_ || a.size(1) != ad)
        throw EnvError(who + "actions must be a float32 tensor of shape [" + std::to_string(n_) + ", " + std::to_string(ad) +
                       "], got " + std::string(a.dtype().name()) + " " + shape(a));
    }
  }
  static std::string shape(const at::Tensor& t) {
    std::string s = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
  }

  void do_step() {
    const int next = 1 - cur_;
    const at::Tensor actions = actions_.contiguous();
    StepRows rows;
    rows.obs = obs_[next].data_ptr<float>();
    rows.next_obs = next_obs_.data_ptr<float>();
    rows.reward = reward_.data_ptr<float>();
    rows.terminated = terminated_.data_ptr<float>();
    rows.truncated = truncated_.data_ptr<float>();
    rows.task = task_.defined() ? task_.data_ptr<std::int64_t>() : nullptr;
    rows.ended = ended_.data();
    const void* a = actions.data_ptr();
    try {
      pool_.parallel_for(n_, [&](std::int64_t b, std::int64_t e) { envs_->step(b, e, a, rows, steps_); });
      cur_ = next;
      ++steps_;
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  void run_stepper() {
    for (;;) {
      anvil::detail::spin_until([this] { return requested_.load(std::memory_order_acquire) || stop_.load(); });
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_.load() || requested_.load(); });
        if (stop_) return;
      }
      do_step();
      {
        std::lock_guard lock(mu_);
        requested_.store(false, std::memory_order_release);
      }
      cv_.notify_all();
    }
  }

  void wait_idle() {
    if (in_flight_) step_wait();
  }

  std::unique_ptr<EnvBatch> envs_;
  VecMode mode_;
  anvil::detail::ThreadPool pool_;
  std::array<at::Tensor, 2> obs_;
  int cur_ = 0;
  at::Tensor next_obs_, reward_, terminated_, truncated_, task_, actions_;
  std::vector<EpisodeEnd> ended_;
  VecStep out_;
  std::int64_t steps_ = 0;
  bool started_ = false, in_flight_ = false;
  std::exception_ptr error_;
  std::thread stepper_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> requested_{false}, stop_{false};
};

/// `LocalVecEnv` of envs of type `E`, which knows their type (`env(i)`, e.g. for tests).
template <Env E>
class VecEnv final : public LocalVecEnv {
 public:
  /// `cfg.num_envs` copies of `prototype` (see `EnvArray` for `first` and `count`).
  VecEnv(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first = 0, std::int64_t count = 0)
      : VecEnv(std::make_unique<EnvArray<E>>(prototype, cfg, seed, first, count), cfg) {}
  /// Env `i`.
  [[nodiscard]] const E& env(std::int64_t i) const { return array_->env(i); }

 private:
  VecEnv(std::unique_ptr<EnvArray<E>> envs, const VecEnvConfig& cfg) : LocalVecEnv(std::move(envs), cfg) {
    array_ = static_cast<const EnvArray<E>*>(&batch());
  }
  const EnvArray<E>* array_ = nullptr;
};

/// The training (or evaluation) envs of `env`: `cfg.num_envs` of them, seeded from `seed`;
/// `first` and `count` place them among all of the run's (see `EnvArray`).
inline std::unique_ptr<VecEnvBase> make_vec_env(const AnyEnv& env, const VecEnvConfig& cfg, std::uint64_t seed,
                                                std::int64_t first = 0, std::int64_t count = 0) {
  if (env.vec_maker()) {
    auto v = env.vec_maker()(cfg, seed, first, count);
    if (!v) throw Error(env.name() + ": its maker made no envs");
    if (v->num_envs() != *cfg.num_envs)
      throw ConfigError("env.num_envs=" + std::to_string(*cfg.num_envs) + ": " + env.name() + "'s maker made " +
                        std::to_string(v->num_envs()));
    return v;
  }
  return std::make_unique<LocalVecEnv>(env.batch_maker()(cfg, seed, first, count), cfg);
}

}  // namespace anvil::envs
// ---- end <anvil/envs/vec_env.hpp> ----

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
    const auto c = x.to(at::kCPU, at::kDouble).reshape({x.size(0), -1}).contiguous();
    const std::int64_t b = c.size(0), d = c.size(1);
    if (b == 0) return;
    Moments batch{static_cast<double>(b), std::vector<double>(d, 0.0), std::vector<double>(d, 0.0)};
    const double* p = c.data_ptr<double>();
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t j = 0; j < d; ++j) batch.mean[j] += p[i * d + j];
    for (auto& m : batch.mean) m /= static_cast<double>(b);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t j = 0; j < d; ++j) {
        const double e = p[i * d + j] - batch.mean[j];
        batch.m2[j] += e * e;
      }
    merge(fresh_, batch);
    refresh();
  }

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
    std::vector<double> v(now_.m2.size(), 1.0);
    if (now_.count > 0)
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = now_.m2[j] / now_.count;
    return v;
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
    for (auto& o : obs_) o = at::zeros({n_, spec_.obs_dim()}, f);
    next_obs_ = at::zeros({n_, spec_.obs_dim()}, f);
    reward_ = at::zeros({n_}, f);
    running_return_.assign(static_cast<std::size_t>(n_), 0.0);
  }

  /// The statistics, for evaluation envs built to share them.
  [[nodiscard]] const std::shared_ptr<NormalizeState>& state() const noexcept { return state_; }
  [[nodiscard]] const VecEnvBase& inner() const noexcept { return *inner_; }

  at::Tensor reset() override {
    auto o = inner_->reset();
    if (cfg_.obs && !frozen_) state_->obs.update(o);
    std::fill(running_return_.begin(), running_return_.end(), 0.0);
    normalize_obs(o, obs_[cur_]);
    started_ = true;
    return obs_[cur_];
  }
  void step_async(const at::Tensor& actions) override { inner_->step_async(actions); }
  const VecStep& step_wait() override {
    const auto& s = inner_->step_wait();
    if (cfg_.obs && !frozen_) state_->obs.update(s.obs);
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
    if (cfg_.obs) state_->obs.sync(sum);
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
    w.bytes(obs_[cur_].data_ptr(), static_cast<std::size_t>(obs_[cur_].numel()) * sizeof(float));
    inner_->save(w);
  }
  std::function<void()> read(BinaryReader& r) override {
    auto obs = std::make_shared<RunningMeanVar::Moments>(state_->obs.read_moments(r, "fresh observation statistics"));
    auto ret = std::make_shared<RunningMeanVar::Moments>(state_->ret.read_moments(r, "fresh return statistics"));
    auto running = std::make_shared<std::vector<double>>(running_return_.size());
    r.bytes(running->data(), running->size() * sizeof(double), "running discounted returns");
    const bool started = r.value<bool>("normaliser started flag");
    auto current = at::empty_like(obs_[cur_]);
    r.bytes(current.data_ptr(), static_cast<std::size_t>(current.numel()) * sizeof(float), "normalised observations");
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
  void normalize_obs(const at::Tensor& raw, at::Tensor& out) const {
    if (!cfg_.obs) {
      out.copy_(raw);
      return;
    }
    const auto& mean = state_->obs.mean();
    const auto var = state_->obs.variance();
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
    auto rets = at::empty({n_}, at::kDouble);
    double* p = rets.data_ptr<double>();
    for (std::int64_t i = 0; i < n_; ++i) p[i] = running_return_[i] = running_return_[i] * gamma_ + r[i];
    state_->ret.update(rets);
    const double scale = 1.0 / std::sqrt(state_->ret.variance()[0] + cfg_.epsilon), clip = cfg_.clip_reward;
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
  std::vector<double> running_return_;
  VecStep out_;
  bool started_ = false;
};

}  // namespace anvil::envs
// ---- end <anvil/envs/normalize.hpp> ----
// ---- begin <anvil/envs/pendulum.hpp> ----
/// @file
/// Pendulum swing-up, the same MDP as Gymnasium's Pendulum-v1 so that returns can be
/// compared with published results. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>


namespace anvil::envs {

/// Swing a frictionless pendulum up and hold it upright with a bounded torque: the
/// classic under-actuated swing-up problem of control theory, with the constants,
/// reward, start distribution and time limit of Gymnasium's Pendulum-v1
/// (https://gymnasium.farama.org/environments/classic_control/pendulum/).
///
/// State (theta, theta_dot), theta = 0 upright, counter-clockwise positive; computed in
/// double as the published env computes in float64. With u the torque clipped to
/// [-2, 2], dt = 0.05, g = 10, m = 1, l = 1:
///
///     theta_dot' = clip(theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt, -8, 8)
///     theta'     = theta + theta_dot' dt        (semi-implicit Euler)
///     reward     = -(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)
///
/// where the reward uses the state *before* the step and normalize() maps to [-pi, pi).
/// The episode never terminates; it is truncated after 200 steps. Observation
/// [cos theta, sin theta, theta_dot] (float32), so the angle has no seam at +-pi.
/// Start: theta ~ U(-pi, pi), theta_dot ~ U(-1, 1), drawn from `Rng(seed)`.
///
/// Out-of-range actions: the published env CLIPS the torque to [-2, 2] before it enters
/// either the dynamics or the cost, so we do the same: an action of 5 is exactly an
/// action of 2, and it is not penalised beyond it. A NaN or infinite action is a bug
/// upstream, not a torque, so it throws `EnvError` instead; so does a wrong action
/// length, and stepping before `reset` or after the episode has ended. A step that
/// throws leaves the env unchanged. Error messages say "step k" with k =
/// `elapsed_steps()`, the number of steps the episode had completed.
struct Pendulum {
  /// The Gymnasium id, so logs and errors name the MDP they ran.
  static constexpr std::string_view name = "Pendulum-v1";
  /// Gymnasium's time limit (max_episode_steps) for Pendulum-v1.
  static constexpr std::int64_t kMaxEpisodeSteps = 200;
  /// Largest angular speed; the dynamics clip to it, which keeps observations bounded.
  static constexpr double kMaxSpeed = 8.0;
  /// Largest torque; larger actions are clipped to it, as published.
  static constexpr double kMaxTorque = 2.0;
  /// Integration time step in seconds.
  static constexpr double kDt = 0.05;
  /// Gravity; Gymnasium's default `g` (10, not 9.81).
  static constexpr double kGravity = 10.0;
  /// Pendulum mass.
  static constexpr double kMass = 1.0;
  /// Pendulum length.
  static constexpr double kLength = 1.0;

  /// The physical state, named so a custom start cannot swap its fields.
  struct State {
    double theta = 0.0;      ///< angle from upright, radians, not wrapped
    double theta_dot = 0.0;  ///< angular velocity, radians per second
  };

  /// [cos theta, sin theta, theta_dot] in [-1, 1] x [-1, 1] x [-8, 8], as published.
  [[nodiscard]] Box observation_space() const {
    const auto v = static_cast<float>(kMaxSpeed);
    return Box{{-1.0f, -1.0f, -v}, {1.0f, 1.0f, v}};
  }
  /// One torque in [-2, 2], as published.
  [[nodiscard]] Box action_space() const {
    const auto t = static_cast<float>(kMaxTorque);
    return Box{{-t}, {t}};
  }

  /// Start an episode from the published start distribution. The generator is reseeded
  /// from `seed` on every call, so an episode depends on its seed alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    State s;
    s.theta = rng_.uniform(-std::numbers::pi, std::numbers::pi);
    s.theta_dot = rng_.uniform(-1.0, 1.0);
    return set_state(s);
  }

  /// Start an episode from `s` instead of a random state: the step counter restarts at
  /// 0 and the generator is left alone. For tests and for custom starts (curricula,
  /// evaluation from fixed states). Throws `EnvError` if a field is not finite.
  std::span<const float> set_state(const State& s) {
    episode_.start({{"theta", s.theta}, {"theta_dot", s.theta_dot}});
    state_ = s;
    write_observation();
    return obs_;
  }

  /// Advance one step of dt with torque `action[0]` (clipped to [-2, 2], as published).
  StepResult step(std::span<const float> action) {
    episode_.check_step(action, /*size=*/1);
    const double u = std::clamp(static_cast<double>(action[0]), -kMaxTorque, kMaxTorque);
    const double th = state_.theta;
    const double thdot = state_.theta_dot;
    const double cost = normalize_angle(th) * normalize_angle(th) + 0.1 * thdot * thdot +
                        0.001 * u * u;
    double new_thdot =
        thdot + (3.0 * kGravity / (2.0 * kLength) * std::sin(th) +
                 3.0 / (kMass * kLength * kLength) * u) *
                    kDt;
    new_thdot = std::clamp(new_thdot, -kMaxSpeed, kMaxSpeed);
    state_.theta = th + new_thdot * kDt;
    state_.theta_dot = new_thdot;
    write_observation();
    return episode_.finish_step(obs_, -cost, /*terminated=*/false);
  }

  /// Steps taken in the current episode; the time limit and error messages count these.
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// The physical state, in double, for tests and for logging what the float32
  /// observation rounds away.
  [[nodiscard]] State state() const noexcept { return state_; }

  /// Map an angle to [-pi, pi), as the published reward does before squaring it, so a
  /// pendulum that has spun round n times is not penalised for it.
  [[nodiscard]] static double normalize_angle(double x) noexcept {
    constexpr double kTwoPi = 2.0 * std::numbers::pi;
    double r = std::fmod(x + std::numbers::pi, kTwoPi);  // sign of x + pi
    if (r < 0.0) r += kTwoPi;                            // floored modulo, as Python's %
    return r - std::numbers::pi;
  }

 private:
  void write_observation() noexcept {
    obs_[0] = static_cast<float>(std::cos(state_.theta));
    obs_[1] = static_cast<float>(std::sin(state_.theta));
    obs_[2] = static_cast<float>(state_.theta_dot);
  }

  State state_{};
  std::array<float, 3> obs_{};
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
};

static_assert(Env<Pendulum>);
static_assert(ContinuousEnv<Pendulum>);

}  // namespace anvil::envs
// ---- end <anvil/envs/pendulum.hpp> ----
// ---- begin <anvil/envs/registry.hpp> ----
/// @file
/// The built-in envs by name, for programs that choose the env at run time
/// (`--env.id=CartPole-v1`): `with_env(id, f)` calls `f` with a default-constructed env of
/// that name. A Trainer's type does not depend on its env's (the envs are type-erased
/// behind `VecEnvBase`), so one program trains any of them. Users' own envs stay types:
/// pass them to a Trainer directly.

#include <array>
#include <string>
#include <string_view>
#include <utility>


namespace anvil::envs {

/// The names `with_env` knows.
inline constexpr std::array<std::string_view, 4> kBuiltinEnvs{Pendulum::name, CartPole::name, Acrobot::name,
                                                              MountainCarContinuous::name};

/// Calls `f(env)` with the built-in env named `id`; a ConfigError naming `env.id` and the
/// known names otherwise.
template <class F>
decltype(auto) with_env(std::string_view id, F&& f) {
  if (id == Pendulum::name) return std::forward<F>(f)(Pendulum{});
  if (id == CartPole::name) return std::forward<F>(f)(CartPole{});
  if (id == Acrobot::name) return std::forward<F>(f)(Acrobot{});
  if (id == MountainCarContinuous::name) return std::forward<F>(f)(MountainCarContinuous{});
  std::string known;
  for (auto n : kBuiltinEnvs) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("env.id='" + std::string(id) + "' is not a built-in env; choose one of " + known +
                    " (or pass your own env's type to the Trainer)");
}

}  // namespace anvil::envs
// ---- end <anvil/envs/registry.hpp> ----

// ---- begin <anvil/nn/activation.hpp> ----
/// @file
/// Activation functions selectable from configs.

#include <array>
#include <string_view>

#include <ATen/core/Tensor.h>

// ---- begin <anvil/nn/network_config.hpp> ----
/// @file
/// The default networks' config sections and the activation choice, apart from the modules,
/// so a config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <string_view>
#include <vector>


namespace anvil::nn {

/// Hidden-layer activation.
enum class Activation { relu, tanh, elu, gelu, silu, leaky_relu };
/// Names for configs (`sac.actor.activation=tanh`).
constexpr auto enum_names(Activation) {
  return std::array<std::string_view, 6>{"relu", "tanh", "elu", "gelu", "silu", "leaky_relu"};
}

/// The tanh-Gaussian actor's shape (`GaussianActor`), under the algorithm's `actor`
/// section (`sac.actor.hidden=64,64`).
struct GaussianActorConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};
  Param<double, "log_std_min", "lower bound of the log standard deviation"> log_std_min{-5.0};
  Param<double, "log_std_max", "upper bound of the log standard deviation"> log_std_max{2.0};
};

/// The twin critics' shape (`TwinQ`), under the algorithm's `critic` section
/// (`sac.critic.hidden=256,256`).
struct TwinQConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{256, 256};
  Param<Activation, "activation", "hidden-layer activation"> activation{Activation::relu};
};

class GaussianActor;  // nn/gaussian_actor.hpp
class TwinQ;          // nn/twin_q.hpp

}  // namespace anvil::nn
// ---- end <anvil/nn/network_config.hpp> ----

namespace anvil::nn {


/// Applies `a` element-wise.
inline at::Tensor activate(const at::Tensor& x, Activation a) {
  switch (a) {
    case Activation::relu: return x.relu();
    case Activation::tanh: return x.tanh();
    case Activation::elu: return at::elu(x);
    case Activation::gelu: return at::gelu(x);
    case Activation::silu: return at::silu(x);
    case Activation::leaky_relu: return at::leaky_relu(x, 0.01);
  }
  return x;
}

}  // namespace anvil::nn
// ---- end <anvil/nn/activation.hpp> ----
// ---- begin <anvil/nn/gaussian_actor.hpp> ----
/// @file
/// `GaussianActor`: the tanh-squashed Gaussian policy of SAC (Haarnoja et al. 2018,
/// "Soft Actor-Critic: Off-Policy Maximum Entropy Deep RL with a Stochastic Actor", app. C).

#include <torch/nn/cloneable.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

// ---- begin <anvil/nn/manual_mlp.hpp> ----
/// @file
/// Forward and backward passes of an `Mlp` written out by hand, for float32 on the CPU.
///
/// RL networks are small: a 64-wide MLP layer on a batch of 256 is a 16-microsecond matrix
/// product, while autograd spends about as long again per op on bookkeeping (graph nodes,
/// saved tensors, a fresh output allocation). `MlpTape` runs the same arithmetic as
/// `Mlp::forward` plus autograd (one `addmm` per layer, the activation in place) into
/// buffers it keeps between calls (the products straight through BLAS, the rest as plain loops),
/// and its backward computes exactly the gradients asked
/// for: weight gradients straight into the caller's buffers (e.g. views of a `FlatAdam`'s
/// flat gradient), the input gradient only when wanted. Algorithms use it as a fast path
/// for their default networks and keep autograd for everything else.

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// ---- begin <anvil/nn/mlp.hpp> ----
/// @file
/// `Mlp`: a multilayer perceptron with configurable widths and activation.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>


namespace anvil::nn {

/// Fully connected network `in -> hidden... -> out`, activation after every hidden layer,
/// none after the output. Cloneable, so target networks are deep copies.
class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  MlpImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t out,
          Activation activation = Activation::relu)
      : in_(in), hidden_(std::move(hidden)), out_(out), activation_(activation) {
    reset();
  }

  /// (Re)creates the layers with fresh default initialisation (Cloneable's contract).
  void reset() override {
    layers_.clear();
    std::int64_t width = in_;
    for (std::size_t i = 0; i <= hidden_.size(); ++i) {
      const std::int64_t next = i < hidden_.size() ? hidden_[i] : out_;
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, next)));
      width = next;
    }
  }

  /// Under autocast (BF16, FP16) the hidden layers run in the reduced dtype and the output
  /// layer in float32: outputs such as Q-values of several hundred need float32's 24-bit
  /// significand, since bfloat16 keeps 8 bits (steps of 2 to 4 at |Q| = 500, larger than
  /// a typical reward), and the output layer is a small part of the network's work.
  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) x = activate(layers_[i]->forward(x), activation_);
    const Float32Scope float32(x.device().type());
    return layers_.back()->forward(float32.active() ? x.to(at::kFloat) : x);
  }

  /// The output layer, e.g. to rescale its initial weights.
  torch::nn::Linear& output_layer() { return layers_.back(); }
  /// All layers, input first.
  [[nodiscard]] const std::vector<torch::nn::Linear>& layers() const noexcept { return layers_; }
  [[nodiscard]] Activation activation() const noexcept { return activation_; }
  [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }

 private:
  std::int64_t in_;
  std::vector<std::int64_t> hidden_;
  std::int64_t out_;
  Activation activation_;
  std::vector<torch::nn::Linear> layers_;
};
TORCH_MODULE(Mlp);

/// Converts config widths (int) to the int64 layer sizes torch takes.
inline std::vector<std::int64_t> widths(const std::vector<int>& w) { return {w.begin(), w.end()}; }

}  // namespace anvil::nn
// ---- end <anvil/nn/mlp.hpp> ----

namespace anvil::nn {

/// Activations whose derivative `MlpTape` can take from the activation's output alone.
constexpr bool has_manual_backward(Activation a) noexcept {
  return a == Activation::relu || a == Activation::tanh || a == Activation::leaky_relu ||
         a == Activation::elu;
}

namespace detail {

// In-place activation of n floats (same definitions as `activate`).
inline void activate_inplace(float* x, std::int64_t n, Activation a) {
  switch (a) {
    case Activation::relu:
      return simd::relu(x, n);
    case Activation::leaky_relu:
      for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.01f * x[i];
      return;
    case Activation::tanh:
      return simd::tanh(x, n);
    case Activation::elu:
      for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : std::expm1(x[i]);
      return;
    default: return;  // not reached: callers check has_manual_backward
  }
}

// g *= activation'(pre-activation), with the derivative written in terms of the output y.
inline void activation_backward_inplace(float* g, const float* y, std::int64_t n, Activation a) {
  switch (a) {
    case Activation::relu:
      return simd::relu_backward(g, y, n);
    case Activation::leaky_relu:
      for (std::int64_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : 0.01f * g[i];
      return;
    case Activation::tanh:
      for (std::int64_t i = 0; i < n; ++i) g[i] *= 1.f - y[i] * y[i];
      return;
    case Activation::elu:
      for (std::int64_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : g[i] * (y[i] + 1.f);
      return;
    default: return;
  }
}

// Row-major C = alpha op(A) op(B) + beta C through LibTorch (`addmm_` on the buffers as
// they are): the products of a process where no BLAS library can be found (`blas::sgemm`
// is null, e.g. a LibTorch with its BLAS linked in privately).
inline void torch_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc) {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  const auto A = at::from_blob(const_cast<float*>(a), {trans_a ? k : m, trans_a ? m : k}, {lda, 1}, f);
  const auto B = at::from_blob(const_cast<float*>(b), {trans_b ? n : k, trans_b ? k : n}, {ldb, 1}, f);
  auto C = at::from_blob(c, {m, n}, {ldc, 1}, f);
  C.addmm_(trans_a ? A.t() : A, trans_b ? B.t() : B, beta, alpha);  // beta 0: C's old values ignored
}

// The tapes' matrix products: BLAS directly when the process has one, else LibTorch.
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  if (blas::sgemm()) return blas::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  torch_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail

/// One hand-written forward pass of an `Mlp` and what its backward needs (see file comment).
/// Inputs and gradients are contiguous float32 CPU tensors; run it under `torch::NoGradGuard`.
/// Matrix products call BLAS directly (`blas::gemm`) and everything else is a plain loop:
/// no LibTorch op runs in a forward or backward once the buffers exist.
/// A tape belongs to one pass at a time: use one per concurrent forward.
class MlpTape {
 public:
  /// Whether `m` can run on a tape: float32 CPU parameters and a supported activation.
  static bool supports(const MlpImpl& m) {
    if (!has_manual_backward(m.activation())) return false;
    for (const auto& l : m.layers())
      if (!l->weight.device().is_cpu() || l->weight.scalar_type() != at::kFloat) return false;
    return true;
  }

  /// m(x) for x [B, in]. The result is a buffer of this tape, valid until its next forward.
  const at::Tensor& forward(const MlpImpl& m, const at::Tensor& x) {
    const auto& layers = m.layers();
    const std::int64_t batch = x.size(0);
    if (h_.size() != layers.size() || h_.front().size(0) != batch) {
      h_.clear();
      g_.clear();
      for (const auto& l : layers) {
        h_.push_back(at::empty({batch, l->weight.size(0)}, x.options()));
        g_.push_back(at::empty({batch, l->weight.size(0)}, x.options()));
      }
    }
    x_ = x.contiguous();
    const float* in = x_.data_ptr<float>();
    std::int64_t in_dim = x_.size(1);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::int64_t out_dim = layers[i]->weight.size(0);
      float* h = h_[i].data_ptr<float>();
      const float* bias = layers[i]->bias.data_ptr<float>();
      const float* w = layers[i]->weight.data_ptr<float>();
      if (blas::transposed_copy_pays(batch, out_dim, in_dim)) {  // x (W^T) on a copy of W^T
        wt_.resize(static_cast<std::size_t>(out_dim * in_dim));
        simd::transpose(wt_.data(), w, out_dim, in_dim);
        detail::gemm(false, false, batch, out_dim, in_dim, 1.f, in, in_dim, wt_.data(), out_dim, 0.f, h, out_dim);
      } else {
        detail::gemm(false, true, batch, out_dim, in_dim, 1.f, in, in_dim, w, in_dim, 0.f, h, out_dim);
      }
      const bool hidden = i + 1 < layers.size();
      // the bias, and ReLU in the same pass; other activations after it
      simd::add_bias(h, bias, batch, out_dim, hidden && m.activation() == Activation::relu);
      if (hidden && m.activation() != Activation::relu) detail::activate_inplace(h, batch * out_dim, m.activation());
      in = h;
      in_dim = out_dim;
    }
    return h_.back();
  }

  /// Backpropagates `dy` [B, out] through the last `forward`. When `grads` is given it
  /// receives the parameter gradients, overwritten, in `MlpImpl::parameters()` order
  /// (fc0.weight, fc0.bias, fc1.weight, ...). When `dx` is given it receives the input
  /// gradient [B, in]. Nothing else is computed.
  void backward(const MlpImpl& m, const at::Tensor& dy, std::vector<at::Tensor>* grads,
                at::Tensor* dx) {
    const auto& layers = m.layers();
    const std::int64_t batch = x_.size(0);
    const float* d = dy.data_ptr<float>();
    for (std::size_t k = layers.size(); k-- > 0;) {
      const std::int64_t out_dim = layers[k]->weight.size(0), in_dim = layers[k]->weight.size(1);
      const float* in = k ? h_[k - 1].data_ptr<float>() : x_.data_ptr<float>();
      const float* w = layers[k]->weight.data_ptr<float>();
      if (grads) {
        // dW = d^T in; db = the column sums of d
        detail::gemm(true, false, out_dim, in_dim, batch, 1.f, d, out_dim, in, in_dim, 0.f,
                   (*grads)[2 * k].data_ptr<float>(), in_dim);
        simd::column_sums((*grads)[2 * k + 1].data_ptr<float>(), d, batch, out_dim);
      }
      if (k > 0) {
        float* g = g_[k - 1].data_ptr<float>();
        detail::gemm(false, false, batch, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, g, in_dim);
        detail::activation_backward_inplace(g, h_[k - 1].data_ptr<float>(), batch * in_dim, m.activation());
        d = g;
      } else if (dx) {
        detail::gemm(false, false, batch, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, dx->data_ptr<float>(),
                   in_dim);
      }
    }
  }

  /// Output of hidden layer `i` (after its activation) from the last forward.
  [[nodiscard]] const at::Tensor& hidden(std::size_t i) const { return h_.at(i); }

 private:
  at::Tensor x_;
  std::vector<at::Tensor> h_;  // each layer's output (activated for hidden layers)
  std::vector<at::Tensor> g_;  // gradient buffers, one per layer
  std::vector<float> wt_;      // a layer's weight transposed, when that is faster (blas::transposed_copy_pays)
};

}  // namespace anvil::nn
// ---- end <anvil/nn/manual_mlp.hpp> ----

namespace anvil::nn {

/// An action drawn from the policy with its log-density.
struct PolicySample {
  at::Tensor action;    ///< [B, act_dim] in [-1, 1]
  at::Tensor log_prob;  ///< [B], log-density of `action` (change of variables through tanh)
};

/// Maps observations to a diagonal Gaussian over pre-squash actions; actions are
/// tanh(u), so they lie in [-1, 1] (the Trainer rescales them to the env's bounds).
class GaussianActorImpl : public torch::nn::Cloneable<GaussianActorImpl> {
 public:
  using Config = GaussianActorConfig;

  GaussianActorImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }

  void reset() override {
    net_ = register_module("net", Mlp(obs_dim_, widths(cfg_.hidden), 2 * act_dim_, cfg_.activation));
  }

  /// Mean and log standard deviation of the pre-squash Gaussian. The log std is squashed
  /// smoothly into [log_std_min, log_std_max] (a hard clamp would zero its gradient).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs) {
    auto out = net_->forward(obs);
    auto mean = out.narrow(-1, 0, act_dim_);
    auto raw = out.narrow(-1, act_dim_, act_dim_).tanh();
    const double lo = cfg_.log_std_min, hi = cfg_.log_std_max;
    return {mean, raw.mul(0.5 * (hi - lo)).add(0.5 * (hi + lo))};
  }

  /// A reparameterised sample (gradients flow through it) and its log-density, from
  /// standard normal `noise` [B, act_dim]. Taking the noise as an argument keeps an update
  /// reproducible when its parts run on several threads.
  PolicySample sample(const at::Tensor& obs, const at::Tensor& noise) {
    auto [mean, log_std] = forward(obs);
    const auto& eps = noise;
    auto u = mean + eps * log_std.exp();
    // log N(u; mean, std) summed over dims, minus log|d tanh(u)/du|, written with
    // log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) for numerical stability.
    constexpr double kHalfLog2Pi = 0.91893853320467274178;
    auto gauss = (-0.5 * eps.square() - log_std - kHalfLog2Pi).sum(-1);
    auto correction = (2.0 * (std::log(2.0) - u - at::softplus(-2.0 * u))).sum(-1);
    return {u.tanh(), gauss - correction};
  }

  /// `sample` with fresh noise from torch's generator.
  PolicySample sample(const at::Tensor& obs) {
    return sample(obs, at::randn({obs.size(0), act_dim_}, obs.options()));
  }

  /// The deterministic action used for evaluation: tanh of the mean.
  at::Tensor mode(const at::Tensor& obs) { return forward(obs).first.tanh(); }

  [[nodiscard]] std::int64_t action_dim() const noexcept { return act_dim_; }
  /// The network from observations to [mean, raw log std].
  [[nodiscard]] const Mlp& net() const noexcept { return net_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp net_{nullptr};
};
TORCH_MODULE(GaussianActor);

namespace detail {

// The element-wise part of `GaussianActorTape::sample` for rows [mean | pre-log-std] of `o`
// [batch, 2 ad] and standard-normal `eps` [batch, ad]: t = tanh(pre-log-std), sd =
// exp(log_std), a = tanh(mean + eps sd) (also written to `action` with row stride
// `stride`), lp = each row's log-density. One loop per action column, over the rows, which
// the compiler vectorises (with the simd:: approximations of exp, tanh and log).
ANVIL_SIMD_KERNEL(squashed_gaussian,
                  (const float* __restrict o, const float* __restrict eps, float* __restrict t, float* __restrict sd,
                   float* __restrict a, float* __restrict lp, float* __restrict action, std::int64_t stride,
                   std::int64_t batch, std::int64_t ad, float k, float c),
                  (o, eps, t, sd, a, lp, action, stride, batch, ad, k, c), {
                    constexpr float kHalfLog2Pi = 0.91893853320467274178f, kLog2 = 0.69314718055994530942f;
                    for (std::int64_t i = 0; i < batch; ++i) lp[i] = 0.f;
                    for (std::int64_t j = 0; j < ad; ++j)
                      for (std::int64_t i = 0; i < batch; ++i) {
                        const std::int64_t ij = i * ad + j;
                        const float mean = o[i * 2 * ad + j];
                        const float th = simd::tanh_approx(o[i * 2 * ad + ad + j]);
                        const float log_std = k * th + c;
                        const float s = simd::exp_approx(log_std);
                        const float e = eps[ij];
                        const float u = mean + e * s;
                        const float act = simd::tanh_approx(u);
                        // softplus(-2u), stable for either sign of u
                        const float au = u < 0.f ? -u : u;
                        const float sp = (u < 0.f ? -2.f * u : 0.f) + simd::log_approx(1.0f + simd::exp_approx(-2.f * au));
                        lp[i] += -0.5f * e * e - log_std - kHalfLog2Pi - 2.f * (kLog2 - u - sp);
                        t[ij] = th;
                        sd[ij] = s;
                        a[ij] = act;
                        action[i * stride + j] = act;
                      }
                  })

}  // namespace detail

/// `GaussianActor::sample` and its backward written out by hand, for float32 on the CPU (see
/// nn/manual_mlp.hpp for why). The same arithmetic as `sample`; run under NoGradGuard.
class GaussianActorTape {
 public:
  static bool supports(const GaussianActorImpl& a) { return MlpTape::supports(*a.net()); }

  /// Draws actions like `sample(obs, noise)` and writes them into `action`, row i at
  /// `action + i * stride` (so they can land inside a critic's input rows). The
  /// log-densities are in `log_prob()` until the next call.
  void sample(const GaussianActorImpl& actor, const at::Tensor& obs, const at::Tensor& noise,
              float* action, std::int64_t stride) {
    const auto& out = net_.forward(*actor.net(), obs);
    const std::int64_t batch = obs.size(0), ad = actor.action_dim();
    if (log_prob_.numel() != batch || t_.size(1) != ad) {
      log_prob_ = at::empty({batch}, obs.options());
      t_ = at::empty({batch, ad}, obs.options());
      std_ = at::empty({batch, ad}, obs.options());
      a_ = at::empty({batch, ad}, obs.options());
      dout_ = at::empty({batch, 2 * ad}, obs.options());
    }
    noise_ = noise;
    const double lo = actor.config().log_std_min, hi = actor.config().log_std_max;
    const float k = static_cast<float>(0.5 * (hi - lo)), c = static_cast<float>(0.5 * (hi + lo));
    detail::squashed_gaussian(out.data_ptr<float>(), noise.data_ptr<float>(), t_.data_ptr<float>(),
                              std_.data_ptr<float>(), a_.data_ptr<float>(), log_prob_.data_ptr<float>(), action, stride,
                              batch, ad, k, c);
  }

  /// The deterministic action tanh(mean), written like `sample`'s.
  void mode(const GaussianActorImpl& actor, const at::Tensor& obs, float* action, std::int64_t stride) {
    const auto& out = net_.forward(*actor.net(), obs);
    const std::int64_t batch = obs.size(0), ad = actor.action_dim();
    const float* o = out.data_ptr<float>();
    for (std::int64_t i = 0; i < batch; ++i)
      for (std::int64_t j = 0; j < ad; ++j) action[i * stride + j] = simd::tanh_approx(o[i * 2 * ad + j]);
  }

  [[nodiscard]] const at::Tensor& log_prob() const noexcept { return log_prob_; }

  /// Backpropagates a loss through the last `sample`: `d_action` [B, act_dim] is dL/daction
  /// and every log-density has dL/dlog_prob = `d_log_prob` (or row i `d_log_prob_rows[i]`
  /// when given). Writes the network's parameter
  /// gradients into `grads` (as `MlpTape::backward`).
  void backward(const GaussianActorImpl& actor, const at::Tensor& d_action, float d_log_prob,
                std::vector<at::Tensor>& grads, const float* d_log_prob_rows = nullptr) {
    const std::int64_t batch = a_.size(0), ad = a_.size(1);
    const double lo = actor.config().log_std_min, hi = actor.config().log_std_max;
    const float k = static_cast<float>(0.5 * (hi - lo));
    const float *t = t_.data_ptr<float>(), *sd = std_.data_ptr<float>(), *a = a_.data_ptr<float>();
    const float *eps = noise_.data_ptr<float>(), *da = d_action.data_ptr<float>();
    float* d = dout_.data_ptr<float>();
    for (std::int64_t i = 0; i < batch; ++i)
      for (std::int64_t j = 0; j < ad; ++j) {
        const std::int64_t ij = i * ad + j;
        const float dlp = d_log_prob_rows ? d_log_prob_rows[i] : d_log_prob;
        // log_prob depends on u through the tanh correction: d/du = 2 tanh(u).
        const float du = da[ij] * (1.f - a[ij] * a[ij]) + dlp * 2.f * a[ij];
        // u = mean + eps * exp(log_std); log_prob has -log_std.
        const float dlog_std = du * eps[ij] * sd[ij] - dlp;
        d[i * 2 * ad + j] = du;
        d[i * 2 * ad + ad + j] = dlog_std * k * (1.f - t[ij] * t[ij]);
      }
    net_.backward(*actor.net(), dout_, &grads, nullptr);
  }

 private:
  MlpTape net_;
  at::Tensor noise_, log_prob_, t_, std_, a_, dout_;
};

}  // namespace anvil::nn
// ---- end <anvil/nn/gaussian_actor.hpp> ----
// ---- begin <anvil/nn/gru_actor.hpp> ----
/// @file
/// `GruActor`: a policy network with memory, for agents that see only part of the world:
/// hidden layers on each step's input, a GRU cell that carries a hidden state through the
/// episode, and a linear output (the recurrent agent of PyMARL's COMA, with hidden layers
/// of our choosing). The caller owns the hidden state: `step` takes and returns it, and
/// `unroll` runs whole sequences from a zero state, forgetting where a sequence says an
/// episode starts.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace anvil::nn {

/// `in -> hidden... (activation after each) -> GRU cell (memory) -> out`. Cloneable.
class GruActorImpl : public torch::nn::Cloneable<GruActorImpl> {
 public:
  GruActorImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t memory, std::int64_t out,
               Activation activation = Activation::relu)
      : in_(in), hidden_(std::move(hidden)), memory_(memory), out_(out), activation_(activation) {
    if (memory_ < 1) throw Error("GruActor: the memory (GRU width) must be at least 1, got " + std::to_string(memory_));
    reset();
  }
  /// (Re)creates the layers with fresh default initialisation (Cloneable's contract).
  void reset() override {
    layers_.clear();
    std::int64_t width = in_;
    for (std::size_t i = 0; i < hidden_.size(); ++i) {
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, hidden_[i])));
      width = hidden_[i];
    }
    cell_ = register_module("gru", torch::nn::GRUCell(width, memory_));
    head_ = register_module("head", torch::nn::Linear(memory_, out_));
  }

  /// One step: the outputs [R, out] and the next hidden state [R, memory] for inputs
  /// [R, in] and the hidden state `h` [R, memory]. Under autocast the hidden layers run in
  /// the reduced dtype; the cell and the output in float32 (the state is carried over many
  /// steps, where bfloat16's 8-bit significand would drift).
  std::pair<at::Tensor, at::Tensor> step(at::Tensor x, const at::Tensor& h) {
    for (auto& layer : layers_) x = activate(layer->forward(x), activation_);
    const Float32Scope float32(x.device().type());
    auto next = cell_->forward(x.to(at::kFloat), h.to(at::kFloat));
    return {head_->forward(next), next};
  }

  /// The outputs [T, R, out] of sequences [T, R, in] (time first), from a zero state that
  /// is zeroed again at every step t where `first[t]` ([T, R], 1/0) marks an episode start.
  at::Tensor unroll(const at::Tensor& x, const at::Tensor& first) {
    const auto T = x.size(0), R = x.size(1);
    auto h = at::zeros({R, memory_}, x.options().dtype(at::kFloat));
    std::vector<at::Tensor> out;
    out.reserve(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) {
      h = h * (1 - first[t].to(at::kFloat)).unsqueeze(-1);
      auto [y, next] = step(x[t], h);
      out.push_back(std::move(y));
      h = std::move(next);
    }
    return at::stack(out);
  }

  [[nodiscard]] std::int64_t memory() const noexcept { return memory_; }
  [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }

 private:
  std::int64_t in_;
  std::vector<std::int64_t> hidden_;
  std::int64_t memory_, out_;
  Activation activation_;
  std::vector<torch::nn::Linear> layers_;
  torch::nn::GRUCell cell_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(GruActor);

}  // namespace anvil::nn
// ---- end <anvil/nn/gru_actor.hpp> ----
// ---- begin <anvil/nn/twin_q.hpp> ----
/// @file
/// `TwinQ`: two independent Q-networks (clipped double Q, Fujimoto et al. 2018, as used by
/// SAC: Haarnoja et al. 2018).

#include <torch/nn/cloneable.h>

#include <cstdint>
#include <utility>


namespace anvil::nn {

/// Q(s, a) twice, from two networks with separate weights; the minimum of the two
/// counters the overestimation a single maximised Q-network suffers.
class TwinQImpl : public torch::nn::Cloneable<TwinQImpl> {
 public:
  using Config = TwinQConfig;

  TwinQImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }

  void reset() override {
    q1_ = register_module("q1", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation));
    q2_ = register_module("q2", Mlp(obs_dim_ + act_dim_, widths(cfg_.hidden), 1, cfg_.activation));
  }

  /// Both estimates, each [B].
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& obs, const at::Tensor& action) {
    auto x = at::cat({obs, action}, -1);
    return {q1_->forward(x).squeeze(-1), q2_->forward(x).squeeze(-1)};
  }

  /// The two Q-networks; each takes the observation and the action concatenated, in that order.
  [[nodiscard]] const Mlp& q1() const noexcept { return q1_; }
  [[nodiscard]] const Mlp& q2() const noexcept { return q2_; }

 private:
  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  Mlp q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(TwinQ);

}  // namespace anvil::nn
// ---- end <anvil/nn/twin_q.hpp> ----
// ---- begin <anvil/nn/unet1d.hpp> ----
/// @file
/// `Unet1d`: the 1-D temporal U-Net denoiser of Diffusion Policy (Chi et al. 2023, section
/// III-B and its appendix): an action sequence [B, T, A] is convolved along time; every
/// residual block is conditioned by FiLM (Perez et al. 2018) on the diffusion step's
/// sinusoidal embedding and the observations, a per-channel scale and bias predicted from
/// them. The structure follows the paper's description:
///
///  - step embedding: sinusoidal (dim d) -> Linear(d, 4d) -> Mish -> Linear(4d, d); the
///    condition is [embedding, observation features];
///  - a residual block: Conv1d(k) -> GroupNorm -> Mish, FiLM (scale * h + bias, from
///    Mish -> Linear(cond, 2 C)), Conv1d(k) -> GroupNorm -> Mish, plus the input through a 1x1
///    convolution when the widths differ;
///  - down path: per level two residual blocks, then a stride-2 convolution (not after the
///    last level); middle: two residual blocks at the last width; up path: per level the skip
///    concatenated, two residual blocks, then a stride-2 transposed convolution (not after
///    the last); out: Conv1d(k) block and a 1x1 convolution to A channels.
///
/// The sequence length must be divisible by 2^(levels - 1) (16 with three levels).

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>


namespace anvil::nn {

/// Sinusoidal embedding of (possibly fractional) steps `k` [B] into `dim` features (half
/// sines, half cosines, frequencies 10000^(-i / (dim/2 - 1))).
inline at::Tensor sinusoidal_embedding(const at::Tensor& k, std::int64_t dim) {
  const std::int64_t half = dim / 2;
  const double scale = std::log(10000.0) / static_cast<double>(std::max<std::int64_t>(half - 1, 1));
  const auto freq = at::exp(at::arange(half, k.options().dtype(at::kFloat)) * -scale);
  const auto arg = k.to(at::kFloat).unsqueeze(-1) * freq.unsqueeze(0);
  return at::cat({arg.sin(), arg.cos()}, -1);
}

/// Mish, x tanh(softplus(x)) (Misra 2019); in float32 on the CPU for reduced dtypes, which
/// LibTorch 1.13's CPU kernel does not take.
inline at::Tensor mish_activation(const at::Tensor& x) {
  if (x.is_cpu() && x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) return at::mish(x.to(at::kFloat)).to(x.scalar_type());
  return at::mish(x);
}

/// Conv1d(k, same padding) -> GroupNorm -> Mish.
class ConvBlock1dImpl : public torch::nn::Cloneable<ConvBlock1dImpl> {
 public:
  ConvBlock1dImpl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t groups)
      : in_(in), out_(out), kernel_(kernel), groups_(groups) {
    reset();
  }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_, out_, kernel_).padding(kernel_ / 2)));
    norm = register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups_, out_)));
  }
  /// Under autocast the convolution runs in the reduced dtype and the normalisation in
  /// float32 (its statistics need it, and LibTorch 1.13's CPU GroupNorm takes one dtype).
  at::Tensor forward(const at::Tensor& x) {
    const auto h = conv->forward(x);
    return mish_activation(norm->forward(h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble ? h : h.to(at::kFloat)));
  }
  torch::nn::Conv1d conv{nullptr};
  torch::nn::GroupNorm norm{nullptr};

 private:
  std::int64_t in_, out_, kernel_, groups_;
};
TORCH_MODULE(ConvBlock1d);

/// A residual block with FiLM conditioning (see file comment).
class FilmResBlockImpl : public torch::nn::Cloneable<FilmResBlockImpl> {
 public:
  FilmResBlockImpl(std::int64_t in, std::int64_t out, std::int64_t cond, std::int64_t kernel, std::int64_t groups)
      : in_(in), out_(out), cond_(cond), kernel_(kernel), groups_(groups) {
    reset();
  }
  void reset() override {
    block0 = register_module("block0", ConvBlock1d(in_, out_, kernel_, groups_));
    block1 = register_module("block1", ConvBlock1d(out_, out_, kernel_, groups_));
    film = register_module("film", torch::nn::Linear(cond_, 2 * out_));
    if (in_ != out_) residual = register_module("residual", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_, out_, 1)));
  }
  /// x [B, in, T], cond [B, cond] -> [B, out, T].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond) {
    auto h = block0->forward(x);
    const auto sb = film->forward(mish_activation(cond)).view({-1, 2, out_, 1});
    h = sb.select(1, 0) * h + sb.select(1, 1);
    h = block1->forward(h);
    return h + (residual ? residual->forward(x) : x);
  }
  ConvBlock1d block0{nullptr}, block1{nullptr};
  torch::nn::Linear film{nullptr};
  torch::nn::Conv1d residual{nullptr};

 private:
  std::int64_t in_, out_, cond_, kernel_, groups_;
};
TORCH_MODULE(FilmResBlock);

/// The U-Net denoiser (see file comment): `forward(x [B, T, A], k [B], obs_features [B, F])`
/// returns [B, T, A].
class Unet1dImpl : public torch::nn::Cloneable<Unet1dImpl> {
 public:
  struct Options {
    std::int64_t action_dim = 2;
    std::int64_t cond_dim = 0;            ///< observation features (obs horizon x obs dim)
    std::vector<std::int64_t> widths{256, 512, 1024};
    std::int64_t step_embed = 256;
    std::int64_t kernel = 5;
    std::int64_t groups = 8;
  };

  explicit Unet1dImpl(Options o) : o_(std::move(o)) {
    if (o_.widths.empty()) throw ConfigError("Unet1d: needs at least one level width");
    for (auto w : o_.widths)
      if (w % o_.groups != 0)
        throw ConfigError("Unet1d: width " + std::to_string(w) + " is not a multiple of the " + std::to_string(o_.groups) + " norm groups");
    reset();
  }

  void reset() override {
    const auto d = o_.step_embed;
    step0 = register_module("step0", torch::nn::Linear(d, 4 * d));
    step1 = register_module("step1", torch::nn::Linear(4 * d, d));
    const auto cond = d + o_.cond_dim;
    down = register_module("down", torch::nn::ModuleList());
    up = register_module("up", torch::nn::ModuleList());
    mid = register_module("mid", torch::nn::ModuleList());
    down_res.clear(), up_res.clear(), mid_res.clear(), downsample.clear(), upsample.clear();
    const auto& w = o_.widths;
    const std::size_t levels = w.size();
    std::int64_t in = o_.action_dim;
    for (std::size_t i = 0; i < levels; ++i) {
      down_res.push_back(FilmResBlock(in, w[i], cond, o_.kernel, o_.groups));
      down_res.push_back(FilmResBlock(w[i], w[i], cond, o_.kernel, o_.groups));
      down->push_back(down_res[down_res.size() - 2]);
      down->push_back(down_res.back());
      if (i + 1 < levels) {
        downsample.push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(w[i], w[i], 3).stride(2).padding(1)));
        down->push_back(downsample.back());
      }
      in = w[i];
    }
    for (int i = 0; i < 2; ++i) {
      mid_res.push_back(FilmResBlock(w.back(), w.back(), cond, o_.kernel, o_.groups));
      mid->push_back(mid_res.back());
    }
    for (std::size_t j = levels - 1; j >= 1; --j) {
      // From level j's width (with level j's skip) back to level j - 1's.
      up_res.push_back(FilmResBlock(2 * w[j], w[j - 1], cond, o_.kernel, o_.groups));
      up_res.push_back(FilmResBlock(w[j - 1], w[j - 1], cond, o_.kernel, o_.groups));
      up->push_back(up_res[up_res.size() - 2]);
      up->push_back(up_res.back());
      upsample.push_back(torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(w[j - 1], w[j - 1], 4).stride(2).padding(1)));
      up->push_back(upsample.back());
    }
    out_block = register_module("out_block", ConvBlock1d(w.front(), w.front(), o_.kernel, o_.groups));
    out_conv = register_module("out_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(w.front(), o_.action_dim, 1)));
  }

  /// Noise (or actions) predicted for the noisy sequence `x` [B, T, A] at steps `k` [B]
  /// given observation features `obs` [B, cond_dim] (undefined when cond_dim is 0).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& k, const at::Tensor& obs) {
    const std::int64_t t = x.size(1);
    const std::int64_t stride = std::int64_t{1} << (o_.widths.size() - 1);
    if (t % stride != 0)
      throw ConfigError("Unet1d: a sequence of " + std::to_string(t) + " steps; with " + std::to_string(o_.widths.size()) +
                        " levels it must be a multiple of " + std::to_string(stride));
    auto e = step1->forward(mish_activation(step0->forward(sinusoidal_embedding(k, o_.step_embed).to(x.dtype()))));
    const auto cond = o_.cond_dim > 0 ? at::cat({e, obs.to(e.dtype())}, -1) : e;
    auto h = x.transpose(1, 2);  // [B, A, T]
    std::vector<at::Tensor> skips;
    const std::size_t levels = o_.widths.size();
    for (std::size_t i = 0; i < levels; ++i) {
      h = down_res[2 * i]->forward(h, cond);
      h = down_res[2 * i + 1]->forward(h, cond);
      skips.push_back(h);
      if (i + 1 < levels) h = downsample[i]->forward(h);
    }
    for (auto& m : mid_res) h = m->forward(h, cond);
    for (std::size_t u = 0; u + 1 < levels; ++u) {
      h = at::cat({h, skips[levels - 1 - u]}, 1);
      h = up_res[2 * u]->forward(h, cond);
      h = up_res[2 * u + 1]->forward(h, cond);
      h = upsample[u]->forward(h);
    }
    h = out_conv->forward(out_block->forward(h));
    return h.transpose(1, 2);
  }

  [[nodiscard]] const Options& options() const noexcept { return o_; }

  torch::nn::Linear step0{nullptr}, step1{nullptr};
  torch::nn::ModuleList down{nullptr}, up{nullptr}, mid{nullptr};
  std::vector<FilmResBlock> down_res, up_res, mid_res;
  std::vector<torch::nn::Conv1d> downsample;
  std::vector<torch::nn::ConvTranspose1d> upsample;
  ConvBlock1d out_block{nullptr};
  torch::nn::Conv1d out_conv{nullptr};

 private:
  Options o_;
};
TORCH_MODULE(Unet1d);

}  // namespace anvil::nn
// ---- end <anvil/nn/unet1d.hpp> ----

// ---- begin <anvil/optim/ema.hpp> ----
/// @file
/// `Ema`: an exponential moving average of a set of weights (Polyak averaging of a policy),
/// kept as one flat tensor beside the flat weights it follows (optim/flat_adam.hpp), so an
/// update is one `polyak` pass whatever the network (also SAC's target critic). A run's `train.ema_decay` asks for one after
/// each update; evaluation and policy.bin then use the average (`with_weights`).

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cstdint>
#include <utility>

// ---- begin <anvil/core/tensor_io.hpp> ----
/// @file
/// Tensors in anvil's binary files (see core/binary_io.hpp): dtype, element count, then
/// the raw elements of a contiguous host copy. Reading checks both against the tensor the
/// values are meant for and names the field when they differ, so a file from another
/// network shape is refused rather than loaded into the wrong places.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>


namespace anvil {

/// Writes `t` (any device; copied to the host). A floating tensor holding a NaN or an
/// infinity is refused with an Error naming the file and `what`, before a byte of it is
/// written: the writer's file is then dropped and what was there before stays (no
/// checkpoint or policy file is ever written from non-finite weights).
inline void write_tensor(BinaryWriter& w, const at::Tensor& t, const char* what = "a tensor") {
  const auto host = t.detach().to(at::kCPU).contiguous();
  if (at::isFloatingType(host.scalar_type()) && host.numel() > 0 && !host.isfinite().all().item<bool>()) [[unlikely]]
    throw Error("not writing '" + w.target() + "': " + what + " holds " +
                (host.isnan().any().item<bool>() ? "nan" : "inf") + " values (" +
                std::to_string(host.numel() - host.isfinite().sum().item<std::int64_t>()) + " of " +
                std::to_string(host.numel()) + "); non-finite weights are never saved, and the file that was there is kept");
  w.value(static_cast<std::int8_t>(host.scalar_type()));
  w.value(static_cast<std::int64_t>(host.numel()));
  w.bytes(host.data_ptr(), static_cast<std::size_t>(host.numel()) * host.element_size());
}

/// Reads a tensor written by `write_tensor` into a new host tensor shaped like `like`,
/// which must have the same dtype and element count (else the error names `what`).
inline at::Tensor read_tensor(BinaryReader& r, const char* what, const at::Tensor& like) {
  const auto dtype = static_cast<at::ScalarType>(r.value<std::int8_t>(what));
  if (dtype != like.scalar_type())
    r.fail(what, std::string("are ") + c10::toString(dtype) + " in the file but " + c10::toString(like.scalar_type()) +
                     " here");
  const auto n = r.value<std::int64_t>(what);
  if (n != like.numel())
    r.fail(what, "have " + std::to_string(n) + " values in the file but " + std::to_string(like.numel()) +
                     " here (another network shape?)");
  auto t = at::empty(like.sizes(), like.options().device(at::kCPU));
  r.bytes(t.data_ptr(), static_cast<std::size_t>(n) * t.element_size(), what);
  return t;
}

}  // namespace anvil
// ---- end <anvil/core/tensor_io.hpp> ----

namespace anvil {

/// Polyak averaging: `target` moves a fraction `tau` towards `source` (same size), as
/// `target.lerp_(source, tau)`; one pass over plain floats on the CPU.
inline void polyak(const at::Tensor& target, const at::Tensor& source, double tau) {
  if (tau < 0.5 && target.device().is_cpu() && target.scalar_type() == at::kFloat && target.is_contiguous() &&
      source.device().is_cpu() && source.scalar_type() == at::kFloat && source.is_contiguous() &&
      source.numel() == target.numel())
    return simd::lerp(target.data_ptr<float>(), source.data_ptr<float>(), target.numel(), static_cast<float>(tau));
  at::NoGradGuard no_grad;
  target.lerp_(source, tau);
}

/// The average `ema = decay ema + (1 - decay) weights`, started at the weights by the first
/// update (see file comment).
class Ema {
 public:
  /// Moves the average towards `weights` (a flat tensor; the same one each time).
  void update(const at::Tensor& weights, double decay) {
    torch::NoGradGuard no_grad;
    if (!avg_.defined()) avg_ = weights.detach().clone();
    else polyak(avg_, weights.detach(), 1.0 - decay);
    ++updates_;
  }
  /// The average; undefined until the first update.
  [[nodiscard]] const at::Tensor& weights() const noexcept { return avg_; }
  [[nodiscard]] bool defined() const noexcept { return avg_.defined(); }
  /// Updates so far.
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }

  /// Runs `f` with the average copied into `live` (the flat weights it follows), then puts
  /// the trained weights back, whatever `f` does. Without an average, just runs `f`.
  template <class F>
  decltype(auto) with_weights(const at::Tensor& live, F&& f) const {
    if (!avg_.defined()) return std::forward<F>(f)();
    struct Swap {
      at::Tensor w, saved;
      Swap(const at::Tensor& weights, const at::Tensor& avg) : w(weights), saved(weights.detach().clone()) {
        torch::NoGradGuard no_grad;
        w.copy_(avg);
      }
      ~Swap() {
        torch::NoGradGuard no_grad;
        w.copy_(saved);
      }
    } swap(live, avg_);
    return std::forward<F>(f)();
  }

  /// State protocol (core/state.hpp); `read` checks the average against `like` (the
  /// weights it follows) and names it `what` in messages.
  void save(BinaryWriter& w) const {
    w.value(avg_.defined());
    w.value(updates_);
    if (avg_.defined()) write_tensor(w, avg_, "the averaged weights");
  }
  struct Saved {
    at::Tensor avg;
    std::int64_t updates = 0;
  };
  [[nodiscard]] Saved read(BinaryReader& r, const char* what, const at::Tensor& like) const {
    Saved s;
    const bool defined = r.value<bool>("policy average flag");
    s.updates = r.value<std::int64_t>("policy average updates");
    if (defined) s.avg = read_tensor(r, what, like);
    return s;
  }
  void restore(const Saved& s) {
    avg_ = s.avg.defined() ? s.avg.to(device_) : at::Tensor();
    updates_ = s.updates;
  }
  /// Where restored averages go (the device of the weights they follow).
  void set_device(c10::Device d) noexcept { device_ = d; }

 private:
  at::Tensor avg_;
  std::int64_t updates_ = 0;
  c10::Device device_{c10::kCPU};
};

}  // namespace anvil
// ---- end <anvil/optim/ema.hpp> ----
// ---- begin <anvil/optim/flat_adam.hpp> ----
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

  /// One Adam step with flat gradient `g` (same size as the parameters).
  void step(const at::Tensor& g) {
    const auto& p = params_.flat();
    if (p.device().is_cpu() && p.scalar_type() == at::kFloat && g.device().is_cpu() &&
        g.scalar_type() == at::kFloat && g.is_contiguous()) {
      // One pass over plain floats, the same arithmetic as `step_on_device`'s ops: at RL
      // sizes the seven ops' dispatch costs more than the arithmetic.
      ++steps_;
      device_state_stale_ = true;
      const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
      const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(steps_));
      simd::adam(p.data_ptr<float>(), m_.data_ptr<float>(), v_.data_ptr<float>(), g.data_ptr<float>(), p.numel(),
                 static_cast<float>(opt_.beta1), static_cast<float>(opt_.beta2), static_cast<float>(1.0 - opt_.beta1),
                 static_cast<float>(1.0 - opt_.beta2),
                 opt_.weight_decay > 0 ? static_cast<float>(1.0 - opt_.lr * opt_.weight_decay) : 1.0f,
                 static_cast<float>(std::sqrt(bc2)), static_cast<float>(opt_.eps), static_cast<float>(-opt_.lr / bc1));
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
  /// Makes the device's step count and learning rate those of the host (two fills when
  /// they changed: a step not taken on the device, a new learning rate, a restore).
  void sync_device_state() {
    if (!step_t_.defined()) {
      const auto o = params_.flat().options().dtype(at::kDouble);
      step_t_ = at::zeros({}, o);
      lr_t_ = at::zeros({}, o);
      device_state_stale_ = true;
    }
    if (!device_state_stale_) return;
    step_t_.fill_(static_cast<double>(steps_));
    lr_t_.fill_(opt_.lr);
    device_state_stale_ = false;
  }
  /// Counts a step `step_on_device` took in a replay.
  void count_step() noexcept { ++steps_; }

  [[nodiscard]] const FlatParameters& parameters() const noexcept { return params_; }
  [[nodiscard]] double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) noexcept {
    if (lr != opt_.lr) device_state_stale_ = true;
    opt_.lr = lr;
  }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
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
    w.value(steps_);
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
    device_state_stale_ = true;
  }

 private:
  FlatParameters params_;
  Options opt_;
  at::Tensor m_, v_, denom_;
  std::int64_t steps_ = 0;
  at::Tensor step_t_, lr_t_;         // step_on_device's step count and learning rate (float64, 0-dim)
  bool device_state_stale_ = true;  // they differ from steps_ and opt_.lr
};

}  // namespace anvil
// ---- end <anvil/optim/flat_adam.hpp> ----
// ---- begin <anvil/optim/micro_batches.hpp> ----
/// @file
/// The micro-batches of gradient accumulation: a batch of `rows` split into `parts` runs of
/// consecutive rows, each with its share of the batch. An algorithm computes the gradient of
/// each part's mean loss, weighs it by the share and sums: the whole batch's gradient (its
/// losses are means), so the optimizer, the all-reduce across ranks, the loss scaler's check
/// and clipping each run once per step. Light header.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace anvil {

/// Rows [begin, begin + rows) of a batch, `share` = rows / batch rows.
struct MicroBatch {
  std::int64_t begin = 0;
  std::int64_t rows = 0;
  double share = 1.0;
};

/// `parts` micro-batches of a batch of `rows` (at most one per row; sizes differ by at most
/// one). One part is the whole batch.
[[nodiscard]] inline std::vector<MicroBatch> micro_batches(std::int64_t rows, std::int64_t parts) {
  parts = std::clamp<std::int64_t>(parts, 1, std::max<std::int64_t>(rows, 1));
  std::vector<MicroBatch> out;
  out.reserve(static_cast<std::size_t>(parts));
  for (std::int64_t i = 0; i < parts; ++i) {
    const std::int64_t begin = rows * i / parts, n = rows * (i + 1) / parts - begin;
    out.push_back({begin, n, static_cast<double>(n) / static_cast<double>(rows)});
  }
  return out;
}

}  // namespace anvil
// ---- end <anvil/optim/micro_batches.hpp> ----
// ---- begin <anvil/optim/step_context.hpp> ----
/// @file
/// `StepContext`: what an algorithm's `update` runs its losses through. It owns the parts
/// of a gradient step that belong to the precision and parallelism policies: the autocast
/// scope around forward passes and losses, backward, the gradient all-reduce across ranks,
/// gradient clipping, and the optimizer step. Algorithms never call autocast or c10d
/// themselves, so one algorithm serves every Trainer combination.

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

// ---- begin <anvil/observe/timers.hpp> ----
/// @file
/// Where the time goes: wall-clock totals for each phase of a trainer step, and what they
/// say about what bounds a run. Light header. A phase is timed with `ScopedPhase`: two clock
/// reads (about 50 ns), plus a device synchronisation before each when a sync function is
/// set (CUDA, where work is asynchronous and would otherwise be billed to whoever waits).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

/// The phases of a trainer step that are timed separately. `all_reduce` and `optimizer`
/// happen inside an update and are taken out of `update`, which keeps the forward and
/// backward passes (and the losses).
enum class Phase : std::size_t { env, act, buffer_add, sample, update, all_reduce, optimizer, eval, log, checkpoint, count };

/// Name of each phase as it appears in logs and summary.json.
inline constexpr std::array<std::string_view, static_cast<std::size_t>(Phase::count)> kPhaseNames{
    "env", "act", "buffer_add", "sample", "update", "all_reduce", "optimizer", "eval", "log", "checkpoint"};

/// Accumulated seconds per phase.
class PhaseTimes {
 public:
  using clock = std::chrono::steady_clock;
  void add(Phase p, clock::duration d) noexcept {
    total_[static_cast<std::size_t>(p)] += d;
    ++calls_;
  }
  /// Time spent in `inner` while `outer` was open: moved from `outer` to `inner`.
  void add_nested(Phase inner, Phase outer, clock::duration d) noexcept {
    total_[static_cast<std::size_t>(inner)] += d;
    total_[static_cast<std::size_t>(outer)] -= d;
    ++calls_;
  }
  [[nodiscard]] double seconds(Phase p) const noexcept {
    return std::chrono::duration<double>(total_[static_cast<std::size_t>(p)]).count();
  }
  [[nodiscard]] double total_seconds() const noexcept {
    double s = 0;
    for (std::size_t i = 0; i < total_.size(); ++i) s += seconds(static_cast<Phase>(i));
    return s;
  }
  /// Share of the timed total spent in `p` (0 when nothing was timed).
  [[nodiscard]] double share(Phase p) const noexcept {
    const double t = total_seconds();
    return t > 0 ? seconds(p) / t : 0.0;
  }
  /// Phases timed so far (for the timers' own cost: calls x cost of one).
  [[nodiscard]] std::int64_t calls() const noexcept { return calls_; }
  /// The times accumulated since `before` (a copy taken earlier).
  [[nodiscard]] PhaseTimes since(const PhaseTimes& before) const noexcept {
    PhaseTimes d;
    for (std::size_t i = 0; i < total_.size(); ++i) d.total_[i] = total_[i] - before.total_[i];
    d.calls_ = calls_ - before.calls_;
    return d;
  }

  /// Called before each clock read when set: a device synchronisation (CUDA).
  void (*sync)() = nullptr;
  /// Off: phases are not timed (ScopedPhase does nothing).
  bool enabled = true;

 private:
  std::array<clock::duration, static_cast<std::size_t>(Phase::count)> total_{};
  std::int64_t calls_ = 0;
};

/// Adds the time from construction to destruction to one phase (and, when `outer` is
/// given, takes it out of that enclosing phase).
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes& t, Phase p) noexcept : ScopedPhase(t, p, Phase::count) {}
  ScopedPhase(PhaseTimes& t, Phase p, Phase outer) noexcept : t_(t), p_(p), outer_(outer) {
    if (!t_.enabled) return;
    if (t_.sync) t_.sync();
    start_ = PhaseTimes::clock::now();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;
  ~ScopedPhase() {
    if (!t_.enabled) return;
    if (t_.sync) t_.sync();
    const auto d = PhaseTimes::clock::now() - start_;
    if (outer_ == Phase::count) t_.add(p_, d);
    else t_.add_nested(p_, outer_, d);
  }

 private:
  PhaseTimes& t_;
  Phase p_, outer_;
  PhaseTimes::clock::time_point start_{};
};

/// The cost of timing one phase without a sync (two clock reads and the bookkeeping),
/// measured on this machine, in seconds.
inline double phase_timer_cost() {
  PhaseTimes t;
  constexpr int kN = 20000;
  const auto t0 = PhaseTimes::clock::now();
  for (int i = 0; i < kN; ++i) ScopedPhase p(t, Phase::env);
  return std::chrono::duration<double>(PhaseTimes::clock::now() - t0).count() / kN;
}

/// What to change for each kind of bottleneck, in the run's own config keys: each loop
/// says it in its knobs and its algorithm's (train/loops/), and the run adds what pays on
/// its device. An empty entry names the bound alone. A test checks every key named here
/// against the config of each kind of Trainer.
struct BottleneckAdvice {
  std::string env, learn, comm, act, sample, store, side;
};

/// Whether advice to train in BF16 pays: on a CUDA device, for a run in FP32 or TF32. On the
/// CPU it is not given: BF16 measured 0.95x FP32's speed for the networks of the shipped
/// runs, and pays only for large products or convolutions on CPUs with bfloat16
/// instructions (benchmarks/RESULTS.md), which a user chooses knowingly.
[[nodiscard]] inline bool bf16_pays(std::string_view device, std::string_view precision) {
  return device.starts_with("cuda") && (precision == "fp32" || precision == "tf32");
}

/// What bounds a run, from its phase times: the largest share, named, with what to change.
/// Empty when nothing was timed.
inline std::string bottleneck(const PhaseTimes& t, const BottleneckAdvice& advice = {}) {
  const double total = t.total_seconds();
  if (total <= 0) return "";
  auto pct = [&](double share) {
    char b[16];
    std::snprintf(b, sizeof b, "%.0f%%", 100 * share);
    return std::string(b);
  };
  const double env = t.share(Phase::env), act = t.share(Phase::act), sample = t.share(Phase::sample);
  const double learn = t.share(Phase::update) + t.share(Phase::optimizer), comm = t.share(Phase::all_reduce);
  const double store = t.share(Phase::buffer_add), side = t.share(Phase::eval) + t.share(Phase::log) + t.share(Phase::checkpoint);
  struct Verdict {
    double share;
    std::string text;
  };
  const auto then = [](const std::string& what) { return what.empty() ? what : "; " + what; };
  const std::vector<Verdict> v{
      {env, "env-bound: " + pct(env) + " of the time stepping the envs" + then(advice.env)},
      {learn, "update-bound: " + pct(learn) + " of the time in updates (forward, backward, optimizer)" + then(advice.learn)},
      {comm, "communication-bound: " + pct(comm) + " of the time in the gradient all-reduce" + then(advice.comm)},
      {act, "action-bound: " + pct(act) + " of the time choosing actions" + then(advice.act)},
      {sample, "sampling-bound: " + pct(sample) + " of the time sampling the buffer" + then(advice.sample)},
      {store, "storage-bound: " + pct(store) + " of the time adding to the buffer" + then(advice.store)},
      {side, "bookkeeping-bound: " + pct(side) + " of the time in evaluation, logging and checkpoints" + then(advice.side)}};
  const Verdict* best = &v[0];
  for (const auto& x : v)
    if (x.share > best->share) best = &x;
  return best->text;
}

/// One line of shares: "env 41% | act 9% | ... ".
inline std::string shares_line(const PhaseTimes& t) {
  std::string s;
  for (std::size_t i = 0; i < kPhaseNames.size(); ++i) {
    char b[48];
    std::snprintf(b, sizeof b, "%s%.*s %.0f%%", s.empty() ? "" : " | ", static_cast<int>(kPhaseNames[i].size()),
                  kPhaseNames[i].data(), 100 * t.share(static_cast<Phase>(i)));
    s += b;
  }
  return s;
}

}  // namespace anvil
// ---- end <anvil/observe/timers.hpp> ----
// ---- begin <anvil/precision/loss_scaler.hpp> ----
/// @file
/// `LossScaler`: the dynamic loss scaling of mixed-precision training (Micikevicius et al.
/// 2018), with the schedule of the standard scaler: start at 2^16, double after
/// `growth_interval` consecutive finite steps, halve on a step whose gradients hold an inf
/// or a NaN and skip that step. It sees one flat gradient per optimizer step (the
/// StepContext gathers it), so the check for infs is one reduction.

#include <ATen/ATen.h>

#include <cstdint>

// ---- begin <anvil/precision/detail/common.hpp> ----
/// @file
/// Pieces shared by the precision policies: the settings a run applies, and the config
/// every policy has. Light header.

#include <c10/core/ScalarType.h>

#include <optional>
#include <string_view>


namespace anvil {

/// The schedule of a dynamic loss scaler (precision/loss_scaler.hpp): start at
/// `init_scale`, multiply by `growth_factor` after `growth_interval` consecutive finite
/// steps, by `backoff_factor` after a step with inf/nan gradients (which is skipped).
struct LossScaling {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

/// What a precision policy asks of a run, as plain values (`X::settings(cfg)`), so that the
/// code applying them is compiled once, not once per Trainer type.
struct PrecisionSettings {
  std::string_view name;                                     ///< "fp32", "bf16", ...
  bool autocast = false;                                     ///< forward passes under autocast
  c10::ScalarType compute_dtype = c10::ScalarType::Float;    ///< the dtype autocast computes in
  bool needs_cuda = false;                                   ///< refused on other devices
  bool allow_tf32 = false;                                   ///< TF32 matrix products (CUDA)
  bool cudnn_benchmark = true;                               ///< cuDNN picks kernels by benchmark
  bool detect_anomaly = false;                               ///< autograd anomaly detection (slow)
  std::optional<LossScaling> loss_scaling;                   ///< dynamic loss scaling (float16)
};

}  // namespace anvil

namespace anvil::detail {

/// The settings of a precision policy `X` whose config has the common fields only.
template <class X, class Config>
PrecisionSettings settings_of(const Config& c) {
  return PrecisionSettings{X::name, X::autocast, X::compute_dtype, X::needs_cuda, X::allow_tf32,
                           c.cudnn_benchmark, c.detect_anomaly, std::nullopt};
}

/// Settings every precision policy has. cuDNN benchmark mode picks the fastest convolution
/// algorithms for fixed shapes (RL batches are fixed); anomaly detection finds the op that
/// made a NaN but slows every backward pass, so it is off unless asked for.
struct PrecisionConfig {
  Param<bool, "cudnn_benchmark", "let cuDNN benchmark and pick the fastest kernels (CUDA)">
      cudnn_benchmark{true};
  Param<bool, "detect_anomaly", "autograd anomaly detection: names the op that made a NaN (slow)">
      detect_anomaly{false};
};

}  // namespace anvil::detail
// ---- end <anvil/precision/detail/common.hpp> ----

namespace anvil {

/// Dynamic loss scale (see file comment). Counts optimizer steps.
class LossScaler {
 public:
  /// The scaler's schedule (precision/detail/common.hpp).
  using Options = LossScaling;

  LossScaler() = default;
  explicit LossScaler(Options o) : opt_(o), scale_(o.init_scale) {}

  /// The loss to differentiate: `loss * scale`.
  [[nodiscard]] at::Tensor scale(const at::Tensor& loss) const { return loss * scale_; }

  /// Divides the flat gradient by the scale in place and reports whether it is finite. A
  /// non-finite gradient backs the scale off and resets the growth count: the caller must
  /// skip the step. A finite one counts towards growth.
  [[nodiscard]] bool unscale_and_check(at::Tensor& flat_grad) {
    flat_grad.mul_(1.0 / scale_);
    const bool finite = flat_grad.isfinite().all().item<bool>();
    if (grouped_) {  // one update of the scale when the group ends (`end_step`)
      group_checked_ = true;
      if (!finite) {
        group_inf_ = true;
        ++skipped_;
      }
      return finite;
    }
    if (!finite) {
      scale_ *= opt_.backoff_factor;
      good_steps_ = 0;
      ++skipped_;
      return false;
    }
    if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
    return true;
  }

  /// Several optimizer steps of one update (e.g. a critic's, then an actor's whose loss
  /// uses the stepped critic) count as one step of the schedule, as one `update()` of a
  /// standard scaler after several optimizers' steps: between `begin_step` and `end_step`
  /// each optimizer's gradient is unscaled and checked (a non-finite one skips that
  /// optimizer's step), and `end_step` backs the scale off once if any was non-finite, else
  /// counts one finite step towards growth.
  void begin_step() noexcept {
    grouped_ = true;
    group_inf_ = group_checked_ = false;
  }
  void end_step() noexcept {
    grouped_ = false;
    if (!group_checked_) return;
    if (group_inf_) {
      scale_ *= opt_.backoff_factor;
      good_steps_ = 0;
    } else if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
  }

  [[nodiscard]] double current_scale() const noexcept { return scale_; }
  /// Finite steps since the last growth or backoff.
  [[nodiscard]] std::int64_t good_steps() const noexcept { return good_steps_; }
  /// Steps skipped for non-finite gradients since construction.
  [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  /// For checkpoints: the scale and the growth count are the whole state.
  void restore(double scale, std::int64_t good_steps, std::int64_t skipped = 0) noexcept {
    scale_ = scale;
    good_steps_ = good_steps;
    skipped_ = skipped;
  }

 private:
  Options opt_{};
  double scale_ = 65536.0;
  std::int64_t good_steps_ = 0;
  bool grouped_ = false, group_inf_ = false, group_checked_ = false;  // inside begin_step/end_step
  std::int64_t skipped_ = 0;
};

}  // namespace anvil
// ---- end <anvil/precision/loss_scaler.hpp> ----

namespace anvil {

/// The gradient-step services a Trainer gives its algorithm (see file comment).
class StepContext {
 public:
  struct Options {
    c10::Device device{c10::kCPU};
    bool autocast = false;                             ///< run forward passes under autocast
    c10::ScalarType autocast_dtype = c10::ScalarType::Float;
    /// Averages gradients across ranks in place; empty for one process.
    std::function<void(std::vector<at::Tensor>&)> all_reduce_mean;
    /// Dynamic loss scaling (float16); empty for no scaling.
    std::optional<LossScaler::Options> loss_scaling;
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
    if (opt_.loss_scaling) scaler_ = LossScaler(*opt_.loss_scaling);
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
    ++steps_;
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

  /// One optimizer's part of a combined step (`apply(std::vector<Step>)`).
  struct Step {
    FlatAdam* optimizer;
    at::Tensor flat_grad;
    double max_grad_norm = 0.0;
  };

  /// `apply` for several optimizers at once: their gradients cross ranks in one all-reduce
  /// (one bucketed call instead of one per network), then each is unscaled, checked,
  /// clipped and stepped on its own, as `apply` does. Returns how many stepped.
  int apply(std::vector<Step> steps) {
    std::vector<at::Tensor> grads;
    grads.reserve(steps.size());
    for (auto& s : steps) grads.push_back(std::move(s.flat_grad));
    all_reduce(grads);
    int stepped = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) stepped += step_reduced(*steps[i].optimizer, grads[i], steps[i].max_grad_norm);
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
    ~ScalerStep() {
      if (s_) s_->end_step();
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
  /// (core/cuda_graph.hpp): one process (no all-reduce), no loss scaler (its skip is a host
  /// decision), one micro-batch.
  [[nodiscard]] bool graphable() const noexcept {
    return !opt_.all_reduce_mean && !scaler_ && opt_.micro_batches == 1;
  }
  /// Scope of a CUDA graph's capture: optimizer steps take `FlatAdam::step_on_device`, and
  /// nothing is timed (a timer's device synchronisation would break the capture) or
  /// counted (the caller counts each replay's steps: `count_steps`).
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
  /// Counts `n` optimizer steps a replayed graph took.
  void count_steps(int n) noexcept { steps_ += n; }

  /// Optimizer steps taken through this context (skipped ones not counted).
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
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
    w.value(steps_);
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
  void restore(const Saved& s) noexcept {
    steps_ = s.steps;
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
    if (scaler_ && !scaler_->unscale_and_check(grad)) return skip();
    if (max_grad_norm > 0)  // as torch's clip_grad_norm_, without a host sync
      grad.mul_((max_grad_norm / (grad.norm() + 1e-6)).clamp_max(1.0));
    if (capturing_) {
      optimizer.step_on_device(grad);
      return true;
    }
    optimizer.step(grad);
    ++steps_;
    return true;
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
  std::int64_t steps_ = 0;
  bool capturing_ = false;  // inside a Capture scope
};

}  // namespace anvil
// ---- end <anvil/optim/step_context.hpp> ----

// ---- begin <anvil/parallel/c10d.hpp> ----
/// @file
/// The c10d classes anvil's parallelism uses, the same on LibTorch 1.13 and 2.x: 2.x splits
/// a ProcessGroup (the front end) from its Backend (Gloo, NCCL); collectives on a backend
/// object are the same calls with the same option structs in both. The one place in anvil
/// that knows this difference (with core/torch_compat.hpp for the version itself).

#include <c10/core/DeviceType.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

// LibTorch's c10d headers declare their classes only under these macros, which CMake's
// Torch package defines (its builds have c10d and Gloo); a plain compiler line must too.
#if !defined(USE_C10D_GLOO) || !defined(USE_DISTRIBUTED)
#error "anvil's parallelism needs LibTorch's c10d with Gloo: build with CMake's Torch package (find_package(Torch)), or add -DUSE_DISTRIBUTED -DUSE_C10D_GLOO to the compiler's flags"
#endif

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace anvil::compat {

/// Handle of an asynchronous collective (`wait()` blocks until it is done).
using Work = c10d::Work;
/// What runs collectives: a `ProcessGroup` in 1.13, a `Backend` (behind a ProcessGroup) in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif
/// Whether this LibTorch was built with NCCL (CUDA builds of 2.x; never Debian's 1.13).
#ifdef USE_C10D_NCCL
inline constexpr bool has_nccl = true;
#else
inline constexpr bool has_nccl = false;
#endif
/// Key-value store used for rendezvous.
using Store = c10d::Store;

/// The network device Gloo's transport uses: the interface named by `interface` (or by
/// GLOO_SOCKET_IFNAME, PyTorch's variable), else loopback when `master_addr` is a loopback
/// address (one machine), else the address this host's name resolves to.
inline std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& interface,
                                                              const std::string& master_addr) {
  std::string ifname = interface;
  if (ifname.empty())
    if (const char* e = std::getenv("GLOO_SOCKET_IFNAME")) ifname = e;
  if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0 || master_addr == "::1")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

/// A Gloo process group over `store` (ranks find each other through it), on the transport
/// `device` (see `gloo_device`); collectives that wait longer than `timeout` fail.
inline c10::intrusive_ptr<Collectives> make_gloo_group(const c10::intrusive_ptr<Store>& store, int rank,
                                                       int world_size,
                                                       std::shared_ptr<::gloo::transport::Device> device,
                                                       std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  opts->devices.push_back(std::move(device));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
}

/// An NCCL group (CUDA builds with NCCL only; the caller checks `has_nccl`). The current
/// CUDA device must be set before the first collective.
inline c10::intrusive_ptr<Collectives> make_nccl_group([[maybe_unused]] const c10::intrusive_ptr<Store>& store,
                                                       [[maybe_unused]] int rank,
                                                       [[maybe_unused]] int world_size,
                                                       [[maybe_unused]] std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
#else
  throw std::logic_error("make_nccl_group: this LibTorch has no NCCL");
#endif
}

/// The port a TCP store listens on or talks to (the one the system chose when asked for 0).
inline std::uint16_t store_port(const c10::intrusive_ptr<Store>& store) {
  return static_cast<const c10d::TCPStore&>(*store).getPort();
}

/// A TCP store: rank 0 (`is_server`) listens on `port`, the others connect to `host:port`.
inline c10::intrusive_ptr<Store> make_tcp_store(const std::string& host, std::uint16_t port,
                                                int world_size, bool is_server,
                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.numWorkers = world_size;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

/// A store backed by a file all ranks can see (single machine or shared file system).
inline c10::intrusive_ptr<Store> make_file_store(const std::string& path, int world_size) {
  return c10::make_intrusive<c10d::FileStore>(path, world_size);
}

}  // namespace anvil::compat
// ---- end <anvil/parallel/c10d.hpp> ----
// ---- begin <anvil/parallel/collectives.hpp> ----
/// @file
/// Collectives built from the two every `Parallelism` has (`all_reduce_mean`, `broadcast`),
/// so the Trainer, its loops and hooks, DDP's tests and user parallelisms share one
/// implementation: a sum over ranks, and rank 0's bytes on every rank. `Ranks` is a
/// Parallelism seen without its type, so that code which only needs these (hooks, loops'
/// agreement between ranks) is compiled once rather than once per Trainer type.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace anvil {

/// Sums `t` (a CPU tensor) over the ranks of `p` in place, through its all-reduce on `device`.
template <class P>
void sum_over_ranks(P& p, at::Tensor& t, c10::Device device) {
  const int world = p.world_size();
  if (world == 1) return;
  std::vector<at::Tensor> v{t.to(device)};
  p.all_reduce_mean(v);
  t.copy_(v[0].to(at::kCPU).mul_(world));
}

/// Rank 0's `bytes` (any length) on every rank of `p`, through its broadcast on `device`.
template <class P>
void broadcast_bytes(P& p, std::vector<std::uint8_t>& bytes, c10::Device device) {
  if (p.world_size() == 1) return;
  std::vector<at::Tensor> n{at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong).to(device)};
  p.broadcast(n);
  bytes.resize(static_cast<std::size_t>(n[0].item<std::int64_t>()));
  std::vector<at::Tensor> b{
      at::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, at::kByte).to(device)};
  p.broadcast(b);
  if (!b[0].is_cpu() || b[0].data_ptr() != bytes.data())
    std::memcpy(bytes.data(), b[0].cpu().data_ptr(), bytes.size());
}

/// The ranks of a run, whatever its Parallelism type: who this process is, and the
/// collectives on the run's device. Default-constructed: one process.
class Ranks {
 public:
  Ranks() = default;
  /// A view of `p` (which must outlive it) whose collectives run on `device`.
  template <class P>
  Ranks(P& p, c10::Device device)
      : rank_(p.rank()), world_(p.world_size()), device_(device),
        all_reduce_([&p](std::vector<at::Tensor>& t) { p.all_reduce_mean(t); }),
        broadcast_([&p](std::vector<at::Tensor>& t) { p.broadcast(t); }) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return world_; }
  [[nodiscard]] bool is_main() const noexcept { return rank_ == 0; }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }

  /// Averages `ts` across ranks in place (nothing for one process).
  void all_reduce_mean(std::vector<at::Tensor>& ts) {
    if (world_ > 1) all_reduce_(ts);
  }
  /// Rank 0's `ts` on every rank, in place.
  void broadcast(std::vector<at::Tensor>& ts) {
    if (world_ > 1) broadcast_(ts);
  }
  /// Sums the CPU tensor `t` over the ranks in place.
  void sum(at::Tensor& t) { sum_over_ranks(*this, t, device_); }
  /// The sum of `x` over the ranks.
  [[nodiscard]] double sum(double x) {
    if (world_ == 1) return x;
    auto t = at::full({1}, x, at::kDouble);
    sum(t);
    return t.item<double>();
  }
  /// Sums each element of `v` over the ranks (one collective for all of them).
  void sum(std::vector<double>& v) {
    if (world_ == 1 || v.empty()) return;
    auto t = at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, at::kDouble);
    sum(t);
  }
  /// Rank 0's bytes on every rank.
  void broadcast(std::vector<std::uint8_t>& bytes) { broadcast_bytes(*this, bytes, device_); }
  /// Rank 0's strings on every rank.
  void broadcast(std::vector<std::string>& strings) {
    if (world_ == 1) return;
    std::vector<std::uint8_t> bytes;
    if (is_main())
      for (const auto& s : strings) {
        bytes.insert(bytes.end(), s.begin(), s.end());
        bytes.push_back(0);
      }
    broadcast(bytes);
    strings.clear();
    std::string cur;
    for (auto b : bytes) {
      if (b == 0) {
        strings.push_back(cur);
        cur.clear();
      } else {
        cur += static_cast<char>(b);
      }
    }
  }

 private:
  int rank_ = 0, world_ = 1;
  c10::Device device_{c10::kCPU};
  std::function<void(std::vector<at::Tensor>&)> all_reduce_, broadcast_;
};

}  // namespace anvil
// ---- end <anvil/parallel/collectives.hpp> ----
// ---- begin <anvil/parallel/ddp.hpp> ----
/// @file
/// `DDP<N>`: data-parallel training on PyTorch's c10d (NCCL on CUDA devices, Gloo on the
/// CPU). One rank per device; each rank has its own envs (distinct seeds) and its own
/// buffer, and every optimizer step averages the ranks' gradients (one flat, bucketed
/// all-reduce) so that parameters stay bitwise identical across ranks.
///
/// Two ways in, one code path:
/// - under torchrun, SLURM wrappers or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK,
///   MASTER_ADDR and MASTER_PORT, the process joins that world (multi-node included);
/// - started plainly, it becomes the launcher of its node (parallel/launch.hpp): it starts N
///   ranks of the same executable and supervises them. With NNODES and NODE_RANK set, one
///   such launcher per node makes a multi-node world.
/// `DDP<0>` (`DDPAuto`) takes N from parallel.nproc_per_node, --gpu-ids or --num-gpus; with
/// none of them it runs one rank per visible GPU on CUDA (run.device auto or cuda) and one
/// rank otherwise, and says so in the run's world line.

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>
#include <cstdint>
#include <string>
#include <vector>

#include <unistd.h>

// ---- begin <anvil/parallel/launch.hpp> ----
/// @file
/// anvil's launcher: a program started plainly with `DDP<N>` becomes the launcher of its
/// node. It serves the rendezvous store (node 0), starts N ranks of the same executable
/// with the same arguments and the variables torchrun would set, and supervises them:
/// when a rank dies or fails, it names it, stops the others (SIGTERM, then SIGKILL after
/// `grace`) and exits non-zero. Ranks die with the launcher (PR_SET_PDEATHSIG), so nothing
/// is left behind. Signals sent to the launcher (Ctrl-C, SIGTERM, SIGUSR1) reach every
/// rank once: ranks run in their own process group, so a terminal's Ctrl-C reaches them
/// through the launcher only. After a SIGINT or SIGTERM the ranks stop together with a
/// checkpoint (train/signals.hpp) and exit 130 or 143: the launcher waits for them and
/// exits with that status, without treating it as a failure; a second signal is forwarded
/// too and ends them at once. Linux only.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

// ---- begin <anvil/parallel/world.hpp> ----
/// @file
/// Which ranks make up a run and how they meet: `World`, read from the variables that
/// torchrun, SLURM wrappers and anvil's own launcher set (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT, ...). Light header: no Torch.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>


namespace anvil {

/// A failure between ranks: a rank died or stopped answering, the rendezvous could not be
/// reached, ranks disagree. The message names the rank it comes from and, where it can
/// be told, the rank at fault. Exit status 3.
class DistributedError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 3; }
};

namespace dist {

/// This process's place among the ranks of a run, and where they meet.
struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        ///< rank among the ranks on this node: picks the GPU
  int local_world_size = 1;  ///< ranks on this node
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";  ///< host of the rendezvous store
  int master_port = 0;
  /// The store is served by a launcher (anvil's, or torchrun's agent): every rank is a
  /// client. Otherwise rank 0 serves it.
  bool agent_store = false;
  /// Key prefix in the store, so that a restarted attempt does not read stale keys.
  std::string store_prefix = "anvil";

  /// "127.0.0.1:29500": where the rendezvous is, for messages.
  [[nodiscard]] std::string rendezvous() const { return master_addr + ":" + std::to_string(master_port); }
};

namespace detail {

inline const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

/// The integer in environment variable `name`, or `fallback` when it is unset; an error
/// naming the variable when it is not a number in [lo, hi].
inline long env_int(const char* name, long fallback, long lo, long hi) {
  const char* v = getenv_nonempty(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end != '\0')
    throw ConfigError(std::string("environment variable ") + name + "='" + v + "' is not an integer");
  if (x < lo || x > hi)
    throw ConfigError(std::string("environment variable ") + name + "=" + v + " is out of range [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace detail

/// The world a launcher put this process in, when RANK is set (torchrun, SLURM wrappers,
/// anvil's launcher): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are
/// required, LOCAL_WORLD_SIZE, GROUP_RANK (or NODE_RANK) and NNODES are read when set.
/// Empty when RANK is not set (a plain start). Throws ConfigError naming the variable that
/// is missing or malformed.
inline std::optional<World> world_from_env() {
  if (!detail::getenv_nonempty("RANK")) return std::nullopt;
  for (const char* required : {"WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (!detail::getenv_nonempty(required))
      throw ConfigError(std::string("RANK is set (a launcher started this rank) but ") + required +
                        " is not: set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT together");
  World w;
  w.world_size = static_cast<int>(detail::env_int("WORLD_SIZE", 1, 1, 1 << 20));
  w.rank = static_cast<int>(detail::env_int("RANK", 0, 0, w.world_size - 1));
  w.local_world_size = static_cast<int>(detail::env_int("LOCAL_WORLD_SIZE", w.world_size, 1, w.world_size));
  w.local_rank = static_cast<int>(detail::env_int("LOCAL_RANK", 0, 0, w.world_size - 1));
  w.node_rank = static_cast<int>(detail::env_int("GROUP_RANK", detail::env_int("NODE_RANK", 0, 0, 1 << 20), 0, 1 << 20));
  w.nnodes = static_cast<int>(detail::env_int("NNODES", 1, 1, 1 << 20));
  w.master_addr = detail::getenv_nonempty("MASTER_ADDR");
  w.master_port = static_cast<int>(detail::env_int("MASTER_PORT", 0, 1, 65535));
  // torchrun's agent serves the store; workers of attempt k use keys under /worker/attempt_k.
  if (const char* a = detail::getenv_nonempty("TORCHELASTIC_USE_AGENT_STORE"); a && std::string(a) == "True") {
    w.agent_store = true;
    w.store_prefix = "/worker/attempt_" + std::to_string(detail::env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20));
  }
  if (const char* a = detail::getenv_nonempty("ANVIL_AGENT_STORE"); a && std::string(a) == "1") w.agent_store = true;
  return w;
}

}  // namespace dist
}  // namespace anvil
// ---- end <anvil/parallel/world.hpp> ----

extern char** environ;

namespace anvil::dist {

/// What a launcher starts on its node.
struct LaunchPlan {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: any free port (one node only)
  std::chrono::milliseconds timeout{120'000};  ///< how long the store waits for ranks
  std::chrono::milliseconds grace{5'000};      ///< SIGTERM to SIGKILL when stopping ranks
};

namespace detail {

// Ranks' pids, for the signal handler (only async-signal-safe calls there).
inline pid_t g_children[1024];
inline volatile std::sig_atomic_t g_child_count = 0;
inline volatile std::sig_atomic_t g_stop_signal = 0;  // the SIGINT/SIGTERM the launcher got first

inline void forward_signal(int sig) {
  for (int i = 0; i < g_child_count; ++i)
    if (g_children[i] > 0) ::kill(g_children[i], sig);
}
inline void on_signal(int sig) {
  if ((sig == SIGINT || sig == SIGTERM) && g_stop_signal == 0) g_stop_signal = sig;
  forward_signal(sig);
}

// This program's arguments, as it was started.
inline std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  return args;
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "stopped with status " + std::to_string(status);
}

inline bool env_is_ours(const char* kv) {
  static constexpr const char* kOurs[] = {"RANK=",        "WORLD_SIZE=",   "LOCAL_RANK=",        "LOCAL_WORLD_SIZE=",
                                          "GROUP_RANK=",  "NODE_RANK=",    "MASTER_ADDR=",       "MASTER_PORT=",
                                          "NNODES=",      "ANVIL_AGENT_STORE=", "TORCHELASTIC_USE_AGENT_STORE="};
  for (const char* p : kOurs)
    if (std::strncmp(kv, p, std::strlen(p)) == 0) return true;
  return false;
}

}  // namespace detail

/// Runs the ranks of this node and exits with their outcome: 0 when all succeed, else the
/// status of the first rank that failed (128 + signal for a rank that was killed). Never
/// returns. Prints one line when it starts and one naming the rank at fault.
[[noreturn]] inline void launch(const LaunchPlan& plan) {
  const int world = plan.nproc_per_node * plan.nnodes;
  if (plan.nproc_per_node > static_cast<int>(std::size(detail::g_children)))
    throw ConfigError("parallel: " + std::to_string(plan.nproc_per_node) + " ranks per node is more than the launcher supports");
  // Node 0's launcher serves the store, so it outlives any rank (and a survivor can still
  // ask it which rank died).
  c10::intrusive_ptr<compat::Store> store;
  int port = plan.master_port;
  if (plan.node_rank == 0) {
    try {
      store = compat::make_tcp_store(plan.master_addr, static_cast<std::uint16_t>(port), world, /*is_server=*/true,
                                     plan.timeout);
    } catch (const std::exception& e) {
      throw DistributedError("launcher: cannot serve the rendezvous store on port " + std::to_string(port) +
                             " (MASTER_PORT): " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
    }
    port = compat::store_port(store);
  }
  const auto args = detail::own_arguments();
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e)
    if (!detail::env_is_ours(*e)) base_env.emplace_back(*e);
  auto set = [](std::vector<std::string>& env, const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };

  std::fprintf(stderr, "launcher: starting %d rank(s) on node %d of %d (world of %d), rendezvous at %s:%d\n",
               plan.nproc_per_node, plan.node_rank, plan.nnodes, world, plan.master_addr.c_str(), port);
  std::fflush(stderr);
  struct sigaction sa {};
  sa.sa_handler = &detail::on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) ::sigaction(sig, &sa, nullptr);

  const pid_t me = ::getpid();
  std::vector<pid_t> pids(static_cast<std::size_t>(plan.nproc_per_node), -1);
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    const int rank = plan.node_rank * plan.nproc_per_node + local;
    auto env = base_env;
    set(env, "RANK", std::to_string(rank));
    set(env, "WORLD_SIZE", std::to_string(world));
    set(env, "LOCAL_RANK", std::to_string(local));
    set(env, "LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node));
    set(env, "GROUP_RANK", std::to_string(plan.node_rank));
    set(env, "NNODES", std::to_string(plan.nnodes));
    set(env, "MASTER_ADDR", plan.master_addr);
    set(env, "MASTER_PORT", std::to_string(port));
    set(env, "ANVIL_AGENT_STORE", "1");
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      detail::forward_signal(SIGKILL);
      throw DistributedError("launcher: cannot start rank " + std::to_string(rank) + ": fork failed");
    }
    if (pid == 0) {  // the rank: only async-signal-safe calls until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::setpgid(0, 0);  // a terminal's signals reach the rank through the launcher only, once
      if (::getppid() != me) ::_exit(1);  // the launcher died before the line above
      ::execve("/proc/self/exe", argv.data(), envp.data());
      static const char msg[] = "launcher: cannot run this program again (execve of /proc/self/exe failed)\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(local)] = pid;
    detail::g_children[local] = pid;
    detail::g_child_count = local + 1;
  }

  // Supervise: wait for every rank; the first failure stops the others.
  int exit_code = 0;
  int running = plan.nproc_per_node;
  auto rank_of = [&](pid_t pid) {
    for (std::size_t i = 0; i < pids.size(); ++i)
      if (pids[i] == pid) return plan.node_rank * plan.nproc_per_node + static_cast<int>(i);
    return -1;
  };
  auto forget = [&](pid_t pid) {
    for (int i = 0; i < plan.nproc_per_node; ++i)
      if (detail::g_children[i] == pid) detail::g_children[i] = -1;
  };
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // no children left
    }
    if (pid == 0) {  // stopping, none exited yet
      if (std::chrono::steady_clock::now() >= kill_at) detail::forward_signal(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const int rank = rank_of(pid);
    if (rank < 0) continue;
    forget(pid);
    --running;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const int asked = detail::g_stop_signal;
    if (asked != 0 && WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 128 + asked)) {
      if (WEXITSTATUS(status) != 0) exit_code = 128 + asked;  // stopped as asked, with its checkpoint: wait for the others
      continue;
    }
    if (!ok && !stopping) {
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::fprintf(stderr, "launcher: rank %d (pid %d) %s; stopping the other %d rank(s) on this node\n", rank,
                   static_cast<int>(pid), detail::describe_status(status).c_str(), running);
      std::fflush(stderr);
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + plan.grace;
      detail::forward_signal(SIGTERM);
    }
  }
  store.reset();
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

}  // namespace anvil::dist
// ---- end <anvil/parallel/launch.hpp> ----

namespace anvil {

/// Which c10d backend runs the collectives.
enum class DistBackend { auto_, gloo, nccl };
constexpr auto enum_names(DistBackend) { return std::array<std::string_view, 3>{"auto", "gloo", "nccl"}; }

/// Settings of `DDP<N>` (section `parallel`; its keys may be written without the section:
/// `--num-gpus 2`, `--gpu-ids 0,2`).
struct DDPConfig {
  Param<int, "nproc_per_node",
        "ranks this node starts when run plainly (0: DDP<N>'s N, else one per GPU chosen; DDPAuto with no "
        "count: one per visible GPU on CUDA, one on the CPU)",
        in_range(0, 1024)>
      nproc_per_node{0};
  Param<int, "num_gpus", "GPUs to use, one rank each: cuda:0 .. cuda:n-1 (0: as nproc_per_node says)",
        in_range(0, 1024)>
      num_gpus{0};
  Param<std::vector<int>, "gpu_ids", "the GPUs to use, one rank each (rank with LOCAL_RANK i uses the i-th)">
      gpu_ids{};
  Param<DistBackend, "backend", "auto: nccl on CUDA devices, gloo on the CPU"> backend{DistBackend::auto_};
  Param<double, "timeout_s",
        "how long a collective or the rendezvous waits for the other ranks before the run fails",
        Range{.lo = 0.1, .hi = 86'400}>
      timeout_s{300};
  Param<double, "stop_grace_s", "when a rank fails, seconds the launcher gives the others to stop before SIGKILL",
        Range{.lo = 0, .hi = 3600}>
      stop_grace_s{5};
  Param<int, "nnodes", "nodes in the run (0: NNODES from the environment, else 1)", in_range(0, 1 << 20)> nnodes{0};
  Param<int, "node_rank", "this node's index (-1: NODE_RANK from the environment, else 0)", in_range(-1, 1 << 20)>
      node_rank{-1};
  Param<std::string, "master_addr", "host of the rendezvous (empty: MASTER_ADDR, else 127.0.0.1)"> master_addr{""};
  Param<int, "master_port", "port of the rendezvous (0: MASTER_PORT, else a free port on one node)",
        in_range(0, 65535)>
      master_port{0};
  Param<std::string, "interface", "network interface Gloo uses (empty: GLOO_SOCKET_IFNAME, else by address)">
      interface{""};
  Param<double, "bucket_mb", "largest piece of the gradient all-reduced in one call", Range{.lo = 0.01, .hi = 4096}>
      bucket_mb{25};
};

namespace dist {

/// Collectives over c10d for one rank: the part of `DDP<N>` that does not depend on N
/// (tests and benchmarks build it directly on a store of their own).
class Group {
 public:
  Group() = default;
  /// Joins `world` through `store` with `backend` on `device`. Throws DistributedError
  /// naming this rank when the others do not arrive within `timeout`. A world of one rank
  /// has no backend (collectives do nothing) unless `even_alone` (to time a backend alone).
  Group(const World& world, c10::intrusive_ptr<compat::Store> store, c10::Device device, DistBackend backend,
        std::chrono::milliseconds timeout, const std::string& interface = "", double bucket_mb = 25,
        bool even_alone = false)
      : world_(world), store_(std::move(store)), device_(device), timeout_(timeout),
        bucket_elems_(std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_mb * (1 << 20) / 4))) {
    if (world_.world_size == 1 && !even_alone) return;
    if (backend == DistBackend::auto_)
      backend = device.is_cuda() && compat::has_nccl ? DistBackend::nccl : DistBackend::gloo;
    if (backend == DistBackend::nccl && !device.is_cuda())
      throw ConfigError("parallel.backend=nccl runs on CUDA devices; this run is on " + device.str() + " (use gloo)");
    if (backend == DistBackend::nccl && !compat::has_nccl)
      throw DeviceError("parallel.backend=nccl but this LibTorch was built without NCCL (use gloo)");
    backend_ = backend;
    try {
      // This rank's address, for survivors who need to name a rank that died.
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      host_ = host;
      const std::string me = host_ + " " + std::to_string(::getpid());
      store_->set(pid_key(world_.rank), std::vector<std::uint8_t>(me.begin(), me.end()));
      if (backend == DistBackend::nccl) {
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
        pg_ = compat::make_nccl_group(store_, world_.rank, world_.world_size, timeout_);
      } else {
        pg_ = compat::make_gloo_group(store_, world_.rank, world_.world_size,
                                      compat::gloo_device(interface, world_.master_addr), timeout_);
      }
      // Every rank is here once one collective has gone round.
      auto t = at::ones({1}, at::TensorOptions().device(device_));
      std::vector<at::Tensor> v{t};
      pg_->allreduce(v)->wait(timeout_);
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail("joining the world of " + std::to_string(world_.world_size) + " ranks at " + world_.rendezvous(), e);
    }
  }
  Group(Group&&) noexcept = default;
  Group& operator=(Group&&) noexcept = default;
  ~Group() {
    // After a failed collective the backend's threads may still wait on a dead peer;
    // destroying it would join them. Let the process end instead.
    if (failed_ && pg_) (void)pg_.release();
  }

  [[nodiscard]] const World& world() const noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return world_.rank; }
  [[nodiscard]] int world_size() const noexcept { return world_.world_size; }
  [[nodiscard]] DistBackend backend() const noexcept { return backend_; }
  /// Seconds spent in collectives so far (wall time, this rank).
  [[nodiscard]] double comm_seconds() const noexcept { return comm_seconds_; }
  [[nodiscard]] std::int64_t collectives() const noexcept { return calls_; }

  /// Averages `ts` across ranks in place: the tensors are packed into one flat buffer (each
  /// of the flat optimizers' gradients is one tensor already), reduced in pieces of at most
  /// `bucket_mb` that are all in flight at once, and unpacked.
  void all_reduce_mean(std::vector<at::Tensor>& ts) {
    if (!pg_ || ts.empty()) return;
    timed("all-reduce of the gradients", [&] {
      at::Tensor flat;
      const bool one = ts.size() == 1 && ts[0].is_contiguous() && ts[0].dim() == 1;
      if (one) {
        flat = ts[0];
      } else {
        std::vector<at::Tensor> parts;
        parts.reserve(ts.size());
        for (auto& t : ts) parts.push_back(t.reshape(-1));
        flat = at::cat(parts);
      }
      reduce_in_buckets(flat, c10d::ReduceOp::SUM);
      flat.div_(world_.world_size);
      if (!one) {
        std::int64_t off = 0;
        for (auto& t : ts) {
          t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
          off += t.numel();
        }
      }
    });
  }

  /// Rank 0's tensors on every rank, in place.
  void broadcast(std::vector<at::Tensor>& ts) {
    if (!pg_ || ts.empty()) return;
    timed("broadcast from rank 0", [&] {
      for (auto& t : ts) {
        auto d = t.is_contiguous() && t.device() == device_ ? t : t.to(device_).contiguous();
        std::vector<at::Tensor> v{d};
        c10d::BroadcastOptions o;
        o.rootRank = 0;
        pg_->broadcast(v, o)->wait(timeout_);
        if (!d.is_same(t)) t.copy_(d);
      }
    });
  }

  /// Throws DistributedError: `what` failed on this rank because of `e`, naming the rank at
  /// fault when it can be told (a rank on this host whose process is gone, or rank 0 when it
  /// served the store and the store is unreachable).
  [[noreturn]] void fail(const std::string& what, const std::exception& e) {
    failed_ = true;
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw DistributedError("rank " + std::to_string(world_.rank) + ": " + what + " failed: " + culprit() + " (" +
                           why + ")");
  }

 private:
  static std::string pid_key(int rank) { return "pid/" + std::to_string(rank); }

  template <class F>
  void timed(const char* what, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, e);
    }
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls_;
  }

  void reduce_in_buckets(at::Tensor& flat, c10d::ReduceOp op) {
    std::vector<c10::intrusive_ptr<compat::Work>> pending;
    std::vector<std::vector<at::Tensor>> pieces;
    const std::int64_t n = flat.numel();
    pieces.reserve(static_cast<std::size_t>((n + bucket_elems_ - 1) / bucket_elems_));
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    for (std::int64_t off = 0; off < n; off += bucket_elems_) {
      pieces.push_back({flat.narrow(0, off, std::min(bucket_elems_, n - off))});
      pending.push_back(pg_->allreduce(pieces.back(), o));
    }
    for (auto& w : pending) w->wait(timeout_);
  }

  // Whether process `pid` of this host has ended (gone, or a zombie not yet reaped).
  static bool has_ended(pid_t pid) {
    if (::kill(pid, 0) != 0) return errno == ESRCH;
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (!f) return true;
    char state = '?';
    // The state follows the command name in parentheses, which may itself hold spaces.
    char line[512] = {};
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    if (const char* p = got ? std::strrchr(line, ')') : nullptr; p && p[1] == ' ') state = p[2];
    return state == 'Z' || state == 'X';
  }

  // Which rank is at fault, as far as this rank can tell. A peer killed a moment ago may
  // still be tearing down when its socket closes, so look for up to a second.
  std::string culprit() {
    std::string dead;
    try {
      store_->setTimeout(std::chrono::seconds(2));
      std::vector<std::pair<int, pid_t>> local;  // the other ranks on this host
      for (int r = 0; r < world_.world_size; ++r) {
        if (r == world_.rank) continue;
        const auto v = store_->get(pid_key(r));
        const std::string s(v.begin(), v.end());
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.substr(0, sp) != host_) continue;  // another host: cannot tell
        local.emplace_back(r, static_cast<pid_t>(std::stol(s.substr(sp + 1))));
      }
      for (int attempt = 0; attempt < 20 && dead.empty() && !local.empty(); ++attempt) {
        if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (const auto& [r, pid] : local)
          if (has_ended(pid))
            dead += (dead.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (pid " +
                    std::to_string(pid) + ")";
      }
    } catch (const std::exception&) {
      if (!world_.agent_store && world_.rank != 0)
        return "rank 0, which serves the rendezvous store at " + world_.rendezvous() + ", is unreachable: it has died";
      return "the rendezvous store at " + world_.rendezvous() + " is unreachable (its launcher has stopped)";
    }
    if (!dead.empty()) return dead + (dead.find(',') == std::string::npos ? " has died" : " have died");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", static_cast<double>(timeout_.count()) / 1000.0);
    return std::string("a rank died or did not answer within parallel.timeout_s (") + secs + " s)";
  }

  World world_;
  c10::intrusive_ptr<compat::Store> store_;
  c10::intrusive_ptr<compat::Collectives> pg_;
  c10::Device device_{c10::kCPU};
  std::chrono::milliseconds timeout_{300'000};
  std::int64_t bucket_elems_ = 1 << 22;
  DistBackend backend_ = DistBackend::gloo;
  std::string host_;
  bool failed_ = false;
  double comm_seconds_ = 0;
  std::int64_t calls_ = 0;
};

/// The store a rank of `world` meets the others through: a client of the launcher's store,
/// or (without one) served by rank 0. Throws DistributedError naming the address tried.
inline c10::intrusive_ptr<compat::Store> connect_store(const World& world, std::chrono::milliseconds timeout) {
  const bool serve = world.rank == 0 && !world.agent_store;
  try {
    auto tcp = compat::make_tcp_store(world.master_addr, static_cast<std::uint16_t>(world.master_port),
                                      world.world_size, serve, timeout);
    return c10::make_intrusive<c10d::PrefixStore>(world.store_prefix, tcp);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw DistributedError("rank " + std::to_string(world.rank) + ": " +
                           (serve ? "cannot serve the rendezvous store at " + world.rendezvous()
                                  : "cannot reach the rendezvous at " + world.rendezvous() + " within " +
                                        std::to_string(timeout.count() / 1000) + " s") +
                           " (MASTER_ADDR:MASTER_PORT): " + why);
  }
}

}  // namespace dist

/// Parallelism policy: data-parallel over `N` ranks per node (see file comment). `DDP<0>`
/// decides N at run time.
template <int N>
class DDP {
  static_assert(N >= 0, "DDP<N>: N is the number of ranks per node (0: decided at run time)");

 public:
  using policy_kind = ParallelismKind;
  static constexpr FixedString config_section = "parallel";
  static constexpr bool can_use_cuda = true;
  using Config = DDPConfig;

  /// Started plainly (no RANK, WORLD_SIZE, ... in the environment) with several ranks per
  /// node or several nodes: makes this process the launcher of its node's ranks, which run
  /// the same program with the same arguments; never returns (the launcher exits with their
  /// outcome). Otherwise returns at once. `anvil::start` calls it from main; nothing else
  /// may (a constructor must not fork).
  /// `device` is the run's `run.device`: DDPAuto given no rank count runs one rank per
  /// visible GPU when it is auto or cuda (and GPUs are visible), else one.
  static void start_ranks(const Config& cfg, std::string_view device) {
    if (dist::world_from_env()) return;  // a rank already
    const auto plan = launch_plan(cfg, auto_ranks(device));
    if (plan.nproc_per_node == 1 && plan.nnodes == 1) return;  // one rank: this process
    if (!counted(cfg))
      std::fprintf(stderr, "DDPAuto: no rank count given (parallel.nproc_per_node, --num-gpus or --gpu-ids): %d ranks, "
                           "one per visible GPU\n", plan.nproc_per_node);
    dist::launch(plan);
  }

  /// Joins the world a launcher set up. A process started plainly is the only rank when the
  /// config asks for one; when it asks for more, the ranks must have been launched
  /// (`anvil::start` in main does it), else a ConfigError says so.
  explicit DDP(const Config& cfg) : cfg_(cfg) {
    if (auto w = dist::world_from_env()) {
      world_ = *w;
      joined_ = true;
      if (N > 0 && world_.local_world_size != N)
        note_ = "DDP<" + std::to_string(N) + "> joined a launcher's world of " + std::to_string(world_.local_world_size) +
                " rank(s) per node (LOCAL_WORLD_SIZE)";
      else if (N == 0 && !counted(cfg) && dist::detail::getenv_nonempty("ANVIL_AGENT_STORE"))
        note_ = "DDPAuto with no rank count: one rank per visible GPU";
    } else {
      // Started plainly: anvil::start launched the ranks if there were to be several.
      const auto plan = launch_plan(cfg, 1);
      if (N == 0 && !counted(cfg))
        note_ = "DDPAuto with no rank count: one rank (parallel.nproc_per_node, --num-gpus or --gpu-ids for more)";
      if (plan.nproc_per_node != 1 || plan.nnodes != 1)
        throw ConfigError("DDP<" + std::to_string(N) + ">: this process was started plainly and is not a rank of a world of " +
                          std::to_string(plan.nproc_per_node * plan.nnodes) +
                          " ranks; call anvil::start(argc, argv, ...) first in main (it launches them), or start it "
                          "under torchrun");
      world_ = dist::World{};  // one rank: nothing to launch or agree on
    }
    if (!cfg.gpu_ids->empty() && world_.local_rank >= static_cast<int>(cfg.gpu_ids->size()))
      throw ConfigError("parallel.gpu_ids lists " + std::to_string(cfg.gpu_ids->size()) + " GPU(s) but this rank has LOCAL_RANK=" +
                        std::to_string(world_.local_rank));
  }

  [[nodiscard]] int rank() const noexcept { return world_.rank; }
  [[nodiscard]] int local_rank() const noexcept { return world_.local_rank; }
  [[nodiscard]] int world_size() const noexcept { return world_.world_size; }
  [[nodiscard]] bool is_main() const noexcept { return world_.rank == 0; }
  [[nodiscard]] const dist::World& world() const noexcept { return world_; }
  /// The CUDA device this rank uses when the run is on CUDA: the LOCAL_RANK-th of
  /// parallel.gpu_ids, or cuda:LOCAL_RANK.
  [[nodiscard]] int device_index() const {
    return cfg_.gpu_ids->empty() ? world_.local_rank : (*cfg_.gpu_ids)[static_cast<std::size_t>(world_.local_rank)];
  }

  /// Builds the process group once the run's device is known (NCCL needs it).
  void connect(c10::Device device) {
    if (!device.is_cuda() && (*cfg_.num_gpus > 0 || !cfg_.gpu_ids->empty()))
      throw ConfigError(std::string(*cfg_.num_gpus > 0 ? "parallel.num_gpus" : "parallel.gpu_ids") +
                        " chooses GPUs but this run is on " + device.str() +
                        " (run.device); for ranks on the CPU use parallel.nproc_per_node");
    if (world_.world_size == 1) return;
    group_ = dist::Group(world_, dist::connect_store(world_, timeout()), device, cfg_.backend, timeout(),
                         cfg_.interface, cfg_.bucket_mb);
  }

  void all_reduce_mean(std::vector<at::Tensor>& ts) { group_.all_reduce_mean(ts); }
  void broadcast(std::vector<at::Tensor>& ts) { group_.broadcast(ts); }
  [[nodiscard]] double comm_seconds() const noexcept { return group_.comm_seconds(); }

  /// One line for the log: ranks, nodes, backend, how this process got here.
  [[nodiscard]] std::string describe() const {
    std::string s = std::to_string(world_.world_size) + " rank(s)";
    if (world_.nnodes > 1) s += " on " + std::to_string(world_.nnodes) + " nodes";
    if (world_.world_size > 1) s += std::string(", ") + (group_.backend() == DistBackend::nccl ? "nccl" : "gloo");
    s += joined_ ? (world_.agent_store ? ", started by a launcher" : ", joined via RANK/WORLD_SIZE") : ", one process";
    if (world_.world_size > 1) s += ", rendezvous " + world_.rendezvous();
    if (!note_.empty()) s += "; " + note_;
    return s;
  }

 private:
  static std::chrono::milliseconds timeout_of(const Config& cfg) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(*cfg.timeout_s * 1000));
  }
  std::chrono::milliseconds timeout() const { return timeout_of(cfg_); }

  // Whether the config gives a rank count (else DDPAuto chooses one).
  static bool counted(const Config& cfg) {
    return N > 0 || *cfg.nproc_per_node > 0 || !cfg.gpu_ids->empty() || *cfg.num_gpus > 0;
  }
  // DDPAuto's ranks per node with no count given: one per visible GPU for a run on CUDA
  // (run.device auto or cuda), else one.
  static int auto_ranks(std::string_view device) {
    if (device != "auto" && device != "cuda") return 1;
    const int gpus = at::hasCUDA() ? static_cast<int>(torch::cuda::device_count()) : 0;
    return std::max(1, gpus);
  }

  // What this node's launcher starts: ranks per node (`fallback` when the config and N
  // give no count), nodes, this node's index, the rendezvous (from the config, else the
  // environment); a ConfigError naming the fields that disagree.
  static dist::LaunchPlan launch_plan(const Config& cfg, int fallback) {
    dist::LaunchPlan plan;
    plan.nproc_per_node = ranks_per_node(cfg, fallback);
    plan.nnodes = *cfg.nnodes > 0 ? *cfg.nnodes : static_cast<int>(dist::detail::env_int("NNODES", 1, 1, 1 << 20));
    plan.node_rank = *cfg.node_rank >= 0 ? *cfg.node_rank
                                         : static_cast<int>(dist::detail::env_int("NODE_RANK", 0, 0, plan.nnodes - 1));
    if (plan.node_rank >= plan.nnodes)
      throw ConfigError("parallel.node_rank=" + std::to_string(plan.node_rank) + " is not below parallel.nnodes=" +
                        std::to_string(plan.nnodes));
    plan.master_addr = !cfg.master_addr->empty() ? *cfg.master_addr
                       : dist::detail::getenv_nonempty("MASTER_ADDR") ? std::string(std::getenv("MASTER_ADDR"))
                                                                     : std::string("127.0.0.1");
    plan.master_port = *cfg.master_port > 0 ? *cfg.master_port
                                            : static_cast<int>(dist::detail::env_int("MASTER_PORT", 0, 1, 65535));
    if (plan.nnodes > 1 && plan.master_port == 0)
      throw ConfigError("parallel.nnodes=" + std::to_string(plan.nnodes) +
                        ": every node must meet at the same port; set MASTER_PORT (or parallel.master_port)");
    plan.timeout = timeout_of(cfg);
    plan.grace = std::chrono::milliseconds(static_cast<std::int64_t>(*cfg.stop_grace_s * 1000));
    return plan;
  }

  // Ranks this node starts (see DDPConfig); a ConfigError naming the field when they disagree.
  static int ranks_per_node(const Config& cfg, int fallback) {
    const int by_ids = static_cast<int>(cfg.gpu_ids->size());
    auto agree = [&](int n, const std::string& source) {
      if (*cfg.nproc_per_node > 0 && *cfg.nproc_per_node != n)
        throw ConfigError("parallel.nproc_per_node=" + std::to_string(*cfg.nproc_per_node) + " but " + source);
      if (by_ids > 0 && by_ids != n)
        throw ConfigError("parallel.gpu_ids lists " + std::to_string(by_ids) + " GPU(s) but " + source);
      if (*cfg.num_gpus > 0 && *cfg.num_gpus != n)
        throw ConfigError("parallel.num_gpus=" + std::to_string(*cfg.num_gpus) + " but " + source);
      return n;
    };
    if constexpr (N > 0) return agree(N, "the program uses DDP<" + std::to_string(N) + ">");
    if (*cfg.nproc_per_node > 0) return agree(cfg.nproc_per_node, "parallel.nproc_per_node=" + std::to_string(*cfg.nproc_per_node));
    if (by_ids > 0) return agree(by_ids, "parallel.gpu_ids lists " + std::to_string(by_ids));
    if (*cfg.num_gpus > 0) return cfg.num_gpus;
    return fallback;
  }

  Config cfg_;
  dist::World world_;
  bool joined_ = false;
  std::string note_;
  dist::Group group_;
};

/// `DDP<0>`: the number of ranks comes from the command line or the launcher; with neither,
/// one per visible GPU on CUDA and one on the CPU.
using DDPAuto = DDP<0>;

static_assert(Parallelism<DDP<2>>);

}  // namespace anvil
// ---- end <anvil/parallel/ddp.hpp> ----
// ---- begin <anvil/parallel/single_device.hpp> ----
/// @file
/// `SingleDevice`: one process, one device. Light header.

#include <string>
#include <vector>

#include <c10/core/Device.h>


namespace anvil {

/// Parallelism policy for one process on one device (CPU or one GPU): nothing to agree on,
/// so every collective is a no-op and costs nothing.
struct SingleDevice {
  using policy_kind = ParallelismKind;
  static constexpr FixedString config_section = "parallel";
  /// Runs on CUDA when the run's device is CUDA.
  static constexpr bool can_use_cuda = true;
  /// No settings: one process has nothing to configure.
  struct Config {};

  SingleDevice() = default;
  explicit SingleDevice(const Config&) {}

  /// Nothing to start: this process is the run.
  static void start_ranks(const Config&, std::string_view /*device*/) noexcept {}
  /// Nothing to join.
  void connect(c10::Device) noexcept {}
  /// CUDA device 0 when the run is on CUDA (`run.device` may name another).
  [[nodiscard]] int device_index() const noexcept { return 0; }
  [[nodiscard]] std::string describe() const { return "1 rank, one process"; }

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int local_rank() const noexcept { return 0; }
  [[nodiscard]] int world_size() const noexcept { return 1; }
  [[nodiscard]] bool is_main() const noexcept { return true; }
  /// The mean over one rank is the tensor itself.
  void all_reduce_mean(std::vector<at::Tensor>&) noexcept {}
  /// Rank 0 is this process.
  void broadcast(std::vector<at::Tensor>&) noexcept {}
};

static_assert(Parallelism<SingleDevice>);

}  // namespace anvil
// ---- end <anvil/parallel/single_device.hpp> ----
// ---- begin <anvil/precision/bf16.hpp> ----
/// @file
/// `BF16`: autocast to bfloat16 (CPU and CUDA); float32 master weights, no loss scaling.
///
/// Numerics (the same for `FP16`, which adds loss scaling). Autocast computes the matrix
/// products of the hidden layers, and the activations after them, in bfloat16: that is
/// where the time goes and where 8 significant bits are enough. Everything whose error
/// would steer learning stays float32:
/// - master weights, their gradients and the Adam moments (autocast casts copies of the
///   weights for each product; gradients flow back to the float32 originals);
/// - every network's output layer (`nn::Mlp` runs it under `Float32Scope`): Q-values, and
///   the policy's mean and log standard deviation, hence log-probabilities and entropy;
/// - the Bellman target r + gamma (1 - done) (min Q' - alpha log pi), built from those
///   float32 outputs with float32 arithmetic;
/// - the losses (squared TD errors, importance weighting, the actor loss) and their means;
/// - the entropy temperature log alpha, its loss and its optimizer;
/// - Polyak averaging of the target networks (a float32 lerp over flat parameters, outside
///   autocast), gradient averaging across ranks, unscaling and clipping;
/// - the TD errors fed back to a prioritized buffer.
/// Light header.

#include <string_view>


namespace anvil {

/// Precision policy: autocast to bfloat16 (CPU and CUDA); float32 master weights, no loss scaling.
struct BF16 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "bf16";
  static constexpr FixedString config_section = "precision";
  /// Forward passes and losses run inside an autocast scope.
  static constexpr bool autocast = true;
  /// Losses are multiplied by a dynamic scale before backward (float16's narrow range).
  static constexpr bool loss_scaling = false;
  /// Only CUDA runs this precision.
  static constexpr bool needs_cuda = false;
  /// Matrix products may use TF32 tensor cores (CUDA, Ampere and later).
  static constexpr bool allow_tf32 = false;
  /// The dtype autocast computes in (float32 when there is no autocast).
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::BFloat16;
  using Config = detail::PrecisionConfig;
  /// What a run applies (see PrecisionSettings).
  static PrecisionSettings settings(const Config& c) { return detail::settings_of<BF16>(c); }
};

static_assert(Precision<BF16>);

}  // namespace anvil
// ---- end <anvil/precision/bf16.hpp> ----
// ---- begin <anvil/precision/fp16.hpp> ----
/// @file
/// `FP16`: autocast to float16 on CUDA with a dynamic loss scaler. What stays float32 is as
/// for `BF16` (see precision/bf16.hpp). Light header.

#include <string_view>


namespace anvil {

/// Precision policy: autocast to float16 on CUDA; float32 master weights; losses scaled by
/// a dynamic factor (Micikevicius et al. 2018, "Mixed Precision Training") so small
/// gradients survive float16's range; a step whose gradients overflow is skipped.
struct FP16 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "fp16";
  static constexpr FixedString config_section = "precision";
  static constexpr bool autocast = true;
  static constexpr bool loss_scaling = true;
  static constexpr bool needs_cuda = true;
  static constexpr bool allow_tf32 = false;
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Half;

  /// The loss scaler's schedule, as in the standard dynamic scaler.
  struct Config {
    Param<bool, "cudnn_benchmark", "let cuDNN benchmark and pick the fastest kernels (CUDA)">
        cudnn_benchmark{true};
    Param<bool, "detect_anomaly", "autograd anomaly detection: names the op that made a NaN (slow)">
        detect_anomaly{false};
    Param<double, "init_scale", "initial loss scale", positive> init_scale{65536.0};
    Param<double, "growth_factor", "scale multiplier after growth_interval finite steps",
          greater_than(1.0)>
        growth_factor{2.0};
    Param<double, "backoff_factor", "scale multiplier after a step with inf/nan gradients",
          Range{.lo = 0, .hi = 1, .lo_open = true, .hi_open = true}>
        backoff_factor{0.5};
    Param<int, "growth_interval", "consecutive finite steps before the scale grows", at_least(1)>
        growth_interval{2000};
  };
  /// What a run applies (see PrecisionSettings): the common settings and the scaler's schedule.
  static PrecisionSettings settings(const Config& c) {
    auto s = detail::settings_of<FP16>(c);
    s.loss_scaling = LossScaling{c.init_scale, c.growth_factor, c.backoff_factor, c.growth_interval};
    return s;
  }
};

static_assert(Precision<FP16>);

}  // namespace anvil
// ---- end <anvil/precision/fp16.hpp> ----
// ---- begin <anvil/precision/fp32.hpp> ----
/// @file
/// `FP32`: float32 everywhere; the reference for the others. Light header.

#include <string_view>


namespace anvil {

/// Precision policy: float32 everywhere; the reference for the others.
struct FP32 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "fp32";
  static constexpr FixedString config_section = "precision";
  /// Forward passes and losses run inside an autocast scope.
  static constexpr bool autocast = false;
  /// Losses are multiplied by a dynamic scale before backward (float16's narrow range).
  static constexpr bool loss_scaling = false;
  /// Only CUDA runs this precision.
  static constexpr bool needs_cuda = false;
  /// Matrix products may use TF32 tensor cores (CUDA, Ampere and later).
  static constexpr bool allow_tf32 = false;
  /// The dtype autocast computes in (float32 when there is no autocast).
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
  using Config = detail::PrecisionConfig;
  /// What a run applies (see PrecisionSettings).
  static PrecisionSettings settings(const Config& c) { return detail::settings_of<FP32>(c); }
};

static_assert(Precision<FP32>);

}  // namespace anvil
// ---- end <anvil/precision/fp32.hpp> ----
// ---- begin <anvil/precision/tf32.hpp> ----
/// @file
/// `TF32`: float32 storage with TF32 matrix products on CUDA (same as FP32 on CPU). Light header.

#include <string_view>


namespace anvil {

/// Precision policy: float32 storage with TF32 matrix products on CUDA (same as FP32 on CPU).
struct TF32 {
  using policy_kind = PrecisionKind;
  static constexpr std::string_view name = "tf32";
  static constexpr FixedString config_section = "precision";
  /// Forward passes and losses run inside an autocast scope.
  static constexpr bool autocast = false;
  /// Losses are multiplied by a dynamic scale before backward (float16's narrow range).
  static constexpr bool loss_scaling = false;
  /// Only CUDA runs this precision.
  static constexpr bool needs_cuda = false;
  /// Matrix products may use TF32 tensor cores (CUDA, Ampere and later).
  static constexpr bool allow_tf32 = true;
  /// The dtype autocast computes in (float32 when there is no autocast).
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
  using Config = detail::PrecisionConfig;
  /// What a run applies (see PrecisionSettings).
  static PrecisionSettings settings(const Config& c) { return detail::settings_of<TF32>(c); }
};

static_assert(Precision<TF32>);

}  // namespace anvil
// ---- end <anvil/precision/tf32.hpp> ----

// ---- begin <anvil/observe/gpu_monitor.hpp> ----
/// @file
/// `GpuMonitor`: utilisation, memory and power of each visible NVIDIA GPU, read through
/// NVML, which is loaded at run time (dlopen of libnvidia-ml.so.1, installed with the
/// driver): anvil neither links nor needs it. Without NVML or without a GPU the monitor is
/// off and says why once. Light header.

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

namespace anvil {

/// One GPU at one moment.
struct GpuSample {
  int index = 0;
  double utilization = 0;  ///< percent of the last sample period a kernel ran
  double memory_used_gb = 0, memory_total_gb = 0;
  double power_w = 0;  ///< 0 when the GPU does not report it
};

class GpuMonitor {
 public:
  /// Loads NVML and counts the GPUs; `available()` says whether it worked, `status()` why not.
  GpuMonitor() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      status_ = "GPU monitor off: NVML (libnvidia-ml.so.1) is not installed, so there is no NVIDIA driver here";
      return;
    }
    auto sym = [&](const char* name) { return ::dlsym(lib_, name); };
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
    count_ = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
    handle_ = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    util_ = reinterpret_cast<int (*)(void*, Utilization*)>(sym("nvmlDeviceGetUtilizationRates"));
    memory_ = reinterpret_cast<int (*)(void*, Memory*)>(sym("nvmlDeviceGetMemoryInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    if (!init_ || !shutdown_ || !count_ || !handle_ || !util_ || !memory_) {
      status_ = "GPU monitor off: this NVML lacks the functions anvil reads";
      return;
    }
    if (const int rc = init_(); rc != 0) {
      status_ = "GPU monitor off: NVML failed to start (error " + std::to_string(rc) + "; is the driver loaded?)";
      return;
    }
    started_ = true;
    unsigned n = 0;
    if (count_(&n) != 0 || n == 0) {
      status_ = "GPU monitor off: NVML sees no GPU";
      return;
    }
    for (unsigned i = 0; i < n; ++i) {
      void* h = nullptr;
      if (handle_(i, &h) == 0) devices_.push_back({static_cast<int>(i), h});
    }
    status_ = "GPU monitor: " + std::to_string(devices_.size()) + " GPU(s) through NVML";
  }
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;
  ~GpuMonitor() {
    if (started_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }

  [[nodiscard]] bool available() const noexcept { return !devices_.empty(); }
  /// One line: how many GPUs it watches, or why it is off.
  [[nodiscard]] const std::string& status() const noexcept { return status_; }

  /// Every GPU now (empty when off).
  [[nodiscard]] std::vector<GpuSample> sample() const {
    std::vector<GpuSample> out;
    for (const auto& d : devices_) {
      GpuSample s;
      s.index = d.index;
      Utilization u{};
      if (util_(d.handle, &u) == 0) s.utilization = u.gpu;
      Memory m{};
      if (memory_(d.handle, &m) == 0) {
        s.memory_used_gb = static_cast<double>(m.used) / 1e9;
        s.memory_total_gb = static_cast<double>(m.total) / 1e9;
      }
      unsigned mw = 0;
      if (power_ && power_(d.handle, &mw) == 0) s.power_w = mw / 1000.0;
      out.push_back(s);
    }
    return out;
  }

  /// "gpu0 97% 12.3/80.0 GB 301 W" for each GPU, for a progress line.
  [[nodiscard]] static std::string describe(const std::vector<GpuSample>& samples) {
    std::string s;
    for (const auto& g : samples) {
      char b[96];
      std::snprintf(b, sizeof b, "%sgpu%d %.0f%% %.1f/%.1f GB %.0f W", s.empty() ? "" : "  ", g.index, g.utilization,
                    g.memory_used_gb, g.memory_total_gb, g.power_w);
      s += b;
    }
    return s;
  }

 private:
  // NVML's structs, as its header declares them.
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  struct Device {
    int index;
    void* handle;
  };

  void* lib_ = nullptr;
  bool started_ = false;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*util_)(void*, Utilization*) = nullptr;
  int (*memory_)(void*, Memory*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  std::vector<Device> devices_;
  std::string status_;
};

}  // namespace anvil
// ---- end <anvil/observe/gpu_monitor.hpp> ----
// ---- begin <anvil/observe/progress.hpp> ----
/// @file
/// Progress on the console: a live bar on a terminal (steps, steps/s, ETA, recent return),
/// plain periodic lines when output goes to a file or a pipe. Light header.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace anvil {

/// A metric (a return, a score, a success rate) at its own scale: at least three significant
/// digits and one decimal ("0.0129", "0.172", "5.30", "-153.3"), "-" when it is not a number.
[[nodiscard]] inline std::string metric_text(double x) {
  if (std::isnan(x)) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  const int decimals = x == 0 ? 1 : std::clamp(2 - static_cast<int>(std::floor(std::log10(std::fabs(x)))), 1, 6);
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, x);
  return b;
}

/// What the progress display shows at one moment.
struct ProgressState {
  std::int64_t step = 0, total = 0, updates = 0;
  double elapsed_s = 0.0;
  double recent_return = NAN;  ///< mean return of recent training episodes
  double eval_return = NAN;    ///< latest evaluation
  std::string gpu;             ///< GPU utilisation at the last log row ("gpu0 97%"), if any
};

/// Renders `ProgressState` as a bar (`bar == true`) or as lines.
class Progress {
 public:
  enum class Style { bar, lines, off };

  explicit Progress(Style style = Style::lines) : style_(style) {}
  /// `bar` on a terminal, `lines` otherwise.
  static Style detect() { return ::isatty(::fileno(stdout)) ? Style::bar : Style::lines; }

  /// Redraws the bar (at most 10 times a second) or prints a line (callers decide when).
  /// The bar fits the terminal's width (never wraps); the ETA comes from a smoothed recent
  /// speed measured once updates have begun (`rate`).
  void show(const ProgressState& s, bool force = false) {
    if (style_ == Style::off) return;
    const auto now = std::chrono::steady_clock::now();
    if (style_ == Style::bar && !force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double sps = s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    const double speed = rate(s);
    const double eta = speed > 0 ? static_cast<double>(s.total - s.step) / speed : NAN;
    const std::string eta_s = std::isnan(eta) ? std::string("-:--") : clock(eta);
    std::string ret = metric_text(s.recent_return);
    std::string ev = std::isnan(s.eval_return) ? "" : "eval " + metric_text(s.eval_return);
    if (style_ == Style::bar) {
      const double frac = s.total > 0 ? std::min(1.0, static_cast<double>(s.step) / static_cast<double>(s.total)) : 0.0;
      // Parts by priority; the last ones go first when the terminal is narrow.
      std::vector<std::string> parts{fmt("%3.0f%%", 100 * frac), fmt("%lld/%lld", static_cast<long long>(s.step), static_cast<long long>(s.total)),
                                     "ETA " + eta_s, fmt("%.0f/s", speed > 0 ? speed : sps), "ret " + ret};
      if (!ev.empty()) parts.push_back(ev);
      if (!s.gpu.empty()) parts.push_back(s.gpu);
      const int width = terminal_width() - 1;  // the last column would wrap on some terminals
      auto length = [&](std::size_t n) {
        std::size_t l = 0;
        for (std::size_t i = 0; i < n; ++i) l += parts[i].size() + 1;
        return static_cast<int>(l);
      };
      std::size_t n = parts.size();
      while (n > 1 && length(n) + 2 + kMinBar > width) --n;
      const int bar_width = std::clamp(width - length(n) - 2, 0, kMaxBar);
      std::string line;
      if (bar_width >= kMinBar) {
        const int filled = static_cast<int>(frac * bar_width);
        std::string bar(static_cast<std::size_t>(filled), '=');
        if (filled < bar_width) bar += '>';
        bar.resize(static_cast<std::size_t>(bar_width), ' ');
        line = "[" + bar + "]";
      }
      for (std::size_t i = 0; i < n; ++i) line += (line.empty() ? "" : " ") + parts[i];
      if (static_cast<int>(line.size()) > width) line.resize(static_cast<std::size_t>(std::max(0, width)));
      std::printf("\r%s\033[K", line.c_str());
      drawn_ = true;
    } else {
      if (!s.gpu.empty()) ev += (ev.empty() ? "" : "  ") + s.gpu;
      std::printf("step %lld/%lld  %.0f steps/s  %lld updates  ETA %s  return %s%s%s\n",
                  static_cast<long long>(s.step), static_cast<long long>(s.total), sps,
                  static_cast<long long>(s.updates), eta_s.c_str(), ret.c_str(), ev.empty() ? "" : "  ", ev.c_str());
    }
    std::fflush(stdout);
  }

  /// Steps per second for the ETA: an exponential average (time constant 20 s) of the
  /// speed between calls at least half a second apart, counted from the first call after
  /// updates began (the random warm-up runs several times faster than training). Before
  /// updates begin, the whole run's speed so far.
  double rate(const ProgressState& s) {
    const bool updating = s.updates > 0;
    if (!updating || s.step < rate_step_) {  // warm-up (or a new stage): no smoothed figure yet
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
      rate_ = 0;
      rate_warm_ = updating;
      return s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    }
    if (!rate_warm_) {  // the first call with updates: measure from here
      rate_warm_ = true;
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
      return s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    }
    const double dt = s.elapsed_s - rate_time_;
    if (dt >= 0.5) {
      const double v = static_cast<double>(s.step - rate_step_) / dt;
      const double a = rate_ > 0 ? 1.0 - std::exp(-dt / 20.0) : 1.0;
      rate_ += a * (v - rate_);
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
    }
    return rate_ > 0 ? rate_ : (s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0);
  }

  /// Columns of the terminal on stdout (COLUMNS, then 80, when it cannot tell).
  static int terminal_width() {
    winsize w{};
    if (::ioctl(::fileno(stdout), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
    if (const char* c = std::getenv("COLUMNS")) {
      const int n = std::atoi(c);
      if (n > 0) return n;
    }
    return 80;
  }

  /// Ends the bar's line so later output starts on a fresh one.
  void finish() {
    if (drawn_) std::printf("\n");
    drawn_ = false;
    std::fflush(stdout);
  }
  /// Prints a message on its own line without breaking the bar.
  void message(const std::string& m) {
    if (drawn_) std::printf("\r\033[K");
    std::printf("%s\n", m.c_str());
    drawn_ = false;
    std::fflush(stdout);
  }
  [[nodiscard]] Style style() const noexcept { return style_; }

 private:
  template <class... T>
  static std::string fmt(const char* f, T... v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v...);
    return buf;
  }
  static std::string clock(double s) {
    const auto t = static_cast<long long>(std::max(0.0, s));
    return t >= 3600 ? fmt("%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60)
                     : fmt("%lld:%02lld", t / 60, t % 60);
  }

  static constexpr int kMinBar = 10, kMaxBar = 30;
  Style style_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
  std::int64_t rate_step_ = 0;
  double rate_time_ = 0, rate_ = 0;
  bool rate_warm_ = false;
};

}  // namespace anvil
// ---- end <anvil/observe/progress.hpp> ----
// ---- begin <anvil/observe/provenance.hpp> ----
/// @file
/// Provenance: what a run records about where it came from, in config.yaml (as comments, so
/// `--config config.yaml` still reads it back), summary.json and TensorBoard: the env, the
/// four policy types, anvil's and LibTorch's versions, the command line, the host, and the
/// git commit of the program when it was built from a git checkout (CMake's
/// `anvil_target_provenance(<target>)`, which every anvil program uses, compiles it in).
/// Light header.

#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

// ---- begin <anvil/core/type_name.hpp> ----
/// @file
/// `type_name<T>()`: a type's name as the compiler spells it, at compile time. Provenance
/// records the policy types by it and the config hash covers them. Light header.

#include <string_view>

namespace anvil_type_names {
// Outside namespace anvil, so that the compiler spells anvil's types in full.
template <class T>
constexpr std::string_view of() {
  std::string_view p = __PRETTY_FUNCTION__;  // "... of() [with T = anvil::BasicSAC<>; ...]"
  const auto b = p.find("T = ");
  if (b == std::string_view::npos) return p;
  p.remove_prefix(b + 4);
  return p.substr(0, p.find_first_of(";]"));
}
}  // namespace anvil_type_names

namespace anvil {

/// `T`'s name as the compiler spells it ("anvil::BasicSAC<>").
template <class T>
constexpr std::string_view type_name() {
  return anvil_type_names::of<T>();
}

}  // namespace anvil
// ---- end <anvil/core/type_name.hpp> ----
// ---- begin <anvil/observe/run_files.hpp> ----
/// @file
/// The files a run writes in its run directory: `config.yaml`, `metrics.csv` and
/// `summary.json`, each written so that a crash never leaves a half-written file in place
/// of a good one; the lock a run holds on its directory; fresh run directory names. Light
/// header.

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>


namespace anvil {

/// Writes `text` to `path` atomically: a temporary file beside it, flushed, then renamed
/// over the target, so readers see the old file or the new one, never a torn one.
inline void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) throw Error("writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
}

/// A JSON string literal for `s`.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

/// A JSON number for `x` (null for NaN and infinities, which JSON cannot hold).
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

/// A config value as written in config.yaml ("256", "true", "[64, 64]", "cpu") as a typed
/// JSON value: numbers as numbers, booleans as booleans, lists as arrays, the rest as strings.
[[nodiscard]] inline nlohmann::ordered_json typed_json(const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  if (v.size() >= 2 && v.front() == '[' && v.back() == ']') {
    auto out = nlohmann::ordered_json::array();
    std::string item;
    int depth = 0;
    for (std::size_t i = 1; i + 1 < v.size(); ++i) {
      const char c = v[i];
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (c == ',' && depth == 0) {
        out.push_back(typed_json(item.substr(item.find_first_not_of(' ') == std::string::npos ? 0 : item.find_first_not_of(' '))));
        item.clear();
      } else {
        item += c;
      }
    }
    const auto b = item.find_first_not_of(' ');
    if (b != std::string::npos) out.push_back(typed_json(item.substr(b)));
    return out;
  }
  if (!v.empty()) {
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (end && *end == '\0' && errno == 0) return i;
    const double d = std::strtod(v.c_str(), &end);
    if (end && *end == '\0' && std::isfinite(d)) return d;
  }
  return v;
}

/// A CSV file of metrics, one row per logged step. Columns are fixed by the first row
/// that has every metric the algorithm reports (its first update); rows logged before that
/// are held back and written then, with their missing cells empty. A row is keyed by its
/// first two columns (`env_steps`, `updates`): a row with the key of the last one amends
/// it (its finite cells replace the old ones) instead of adding a second row for the step.
class MetricsCsv {
 public:
  using Values = std::vector<std::pair<std::string, double>>;
  MetricsCsv() = default;
  explicit MetricsCsv(std::filesystem::path path) : path_(std::move(path)) {}

  /// Continues the file of a resumed run: keeps its header and the rows up to the
  /// checkpoint's clock (`env_steps` and `updates`, the first two columns; rows the
  /// interrupted run wrote after it are dropped, since the resumed run writes them again),
  /// and appends from there. Only whole rows are kept: the first row that is torn (a disk
  /// that filled mid-line), has the wrong number of cells or does not come after the one
  /// before ends what is kept. A missing or empty file starts afresh.
  static MetricsCsv resume(std::filesystem::path path, std::int64_t env_steps, std::int64_t updates) {
    MetricsCsv csv(path);
    std::string all;
    {
      std::ifstream in(path, std::ios::binary);
      if (!in) return csv;
      all.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const auto eol = all.find('\n');
    if (eol == std::string::npos || eol == 0) return csv;
    const std::string header = all.substr(0, eol);
    csv.columns_ = split(header);
    std::string text = header + "\n";
    for (std::size_t b = eol + 1, e; b < all.size(); b = e + 1) {
      e = all.find('\n', b);
      if (e == std::string::npos) break;  // no newline: torn
      const std::string line = all.substr(b, e - b);
      if (line.empty()) continue;
      auto cells = split(line);
      const auto key = key_of(cells);
      if (cells.size() != csv.columns_.size() || !key || (csv.last_.first >= 0 && !(*key > csv.last_))) break;
      if (key->first > env_steps || key->second > updates) break;
      text += line + "\n";
      csv.last_ = *key;
      csv.last_cells_ = std::move(cells);
    }
    write_file_atomic(path, text);
    csv.size_ = static_cast<std::int64_t>(text.size());
    csv.last_offset_ = csv.last_.first >= 0 ? static_cast<std::int64_t>(text.rfind('\n', text.size() - 2) + 1) : csv.size_;
    csv.out_.open(path, std::ios::app | std::ios::binary);
    if (!csv.out_) throw Error("cannot write '" + path.string() + "'");
    csv.header_written_ = true;
    csv.resumed_last_ = csv.last_;
    return csv;
  }

  /// Appends a row, or amends the last one when `values` has its key (see class comment);
  /// `complete` says the row's keys are all the columns there will be. A write that fails
  /// (a full disk) throws, naming the file.
  void row(const Values& values, bool complete) {
    if (path_.empty()) return;
    const auto key = key_of(values);
    if (!pending_.empty() && key && key_of(pending_.back()) == key) {
      merge(pending_.back(), values);
    } else if (header_written_ && pending_.empty() && key && *key == last_) {
      amend_last(values);
      return;
    } else {
      pending_.push_back(values);
    }
    if (!header_written_ && !complete) return;
    if (!header_written_) {
      for (const auto& [k, v] : pending_.back()) columns_.push_back(k);
      for (const auto& r : pending_)
        for (const auto& [k, v] : r)
          if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
      out_.open(path_, std::ios::trunc | std::ios::binary);
      if (!out_) throw Error("cannot write '" + path_.string() + "'");
      std::string head;
      for (std::size_t i = 0; i < columns_.size(); ++i) head += (i ? "," : "") + columns_[i];
      write(head + "\n");
      header_written_ = true;
    }
    for (const auto& r : pending_) {
      last_cells_ = cells_of(r);
      last_offset_ = size_;
      write(join(last_cells_) + "\n");
      if (const auto k = key_of(r)) last_ = *k;
    }
    pending_.clear();
    flush();
  }
  /// Writes held-back rows (with whatever columns they have) when the run ends early.
  void flush_pending() {
    if (!pending_.empty()) {
      auto last = pending_.back();
      pending_.pop_back();
      row(last, true);
    }
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The env steps and updates of the last row a resumed file kept ({-1, -1}: none).
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> last_kept() const noexcept { return resumed_last_; }

 private:
  using Key = std::pair<std::int64_t, std::int64_t>;
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    for (std::size_t b = 0, e;; b = e + 1) {
      e = line.find(',', b);
      out.push_back(line.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) return out;
    }
  }
  static std::string join(const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + cells[i];
    return out;
  }
  // A row's key: its first two cells, both whole numbers.
  static std::optional<Key> key_of(const std::vector<std::string>& cells) {
    if (cells.size() < 2) return std::nullopt;
    std::int64_t k[2];
    for (int i = 0; i < 2; ++i) {
      char* end = nullptr;
      const double v = std::strtod(cells[static_cast<std::size_t>(i)].c_str(), &end);
      if (cells[static_cast<std::size_t>(i)].empty() || !end || *end != '\0' || !std::isfinite(v)) return std::nullopt;
      k[i] = static_cast<std::int64_t>(v);
    }
    return Key{k[0], k[1]};
  }
  static std::optional<Key> key_of(const Values& values) {
    if (values.size() < 2 || values[0].first != "env_steps" || values[1].first != "updates") return std::nullopt;
    return Key{static_cast<std::int64_t>(values[0].second), static_cast<std::int64_t>(values[1].second)};
  }
  static void merge(Values& into, const Values& from) {
    for (const auto& [k, v] : from) {
      if (!std::isfinite(v)) continue;
      auto it = std::find_if(into.begin(), into.end(), [&](const auto& kv) { return kv.first == k; });
      if (it == into.end()) into.emplace_back(k, v);
      else it->second = v;
    }
  }
  std::vector<std::string> cells_of(const Values& r) const {
    std::vector<std::string> cells(columns_.size());
    for (const auto& [k, v] : r) {
      const auto it = std::find(columns_.begin(), columns_.end(), k);
      if (it == columns_.end() || !std::isfinite(v)) continue;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.8g", v);
      cells[static_cast<std::size_t>(it - columns_.begin())] = buf;
    }
    return cells;
  }
  // The last row again, its cells replaced by `values`' finite ones: the file is cut back
  // to where that row began and the row written anew.
  void amend_last(const Values& values) {
    const auto fresh = cells_of(values);
    for (std::size_t i = 0; i < fresh.size() && i < last_cells_.size(); ++i)
      if (!fresh[i].empty()) last_cells_[i] = fresh[i];
    out_.close();
    std::error_code ec;
    std::filesystem::resize_file(path_, static_cast<std::uintmax_t>(last_offset_), ec);
    if (ec) throw Error("cannot rewrite the last row of '" + path_.string() + "': " + ec.message());
    size_ = last_offset_;
    out_.open(path_, std::ios::app | std::ios::binary);
    if (!out_) throw Error("cannot write '" + path_.string() + "'");
    write(join(last_cells_) + "\n");
    flush();
  }
  void write(const std::string& text) {
    out_ << text;
    size_ += static_cast<std::int64_t>(text.size());
  }
  void flush() {
    out_.flush();
    if (!out_) throw Error("writing '" + path_.string() + "' failed (disk full?)");
  }

  std::filesystem::path path_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  std::vector<Values> pending_;
  bool header_written_ = false;
  Key last_{-1, -1};          ///< the key of the last row in the file
  Key resumed_last_{-1, -1};  ///< the key of the last row a resumed file kept
  std::vector<std::string> last_cells_;
  std::int64_t size_ = 0, last_offset_ = 0;  ///< the file's size, and where its last row begins
};

/// A run's hold on its directory: `.lock` in it, flock'ed for the lock's life, holding the
/// pid of the process that holds it. A second run in the same directory is refused, naming
/// the directory and the other pid. The kernel drops the lock when the process ends, however
/// it ends, so a killed run leaves nothing to clean up.
class RunDirLock {
 public:
  RunDirLock() = default;
  /// Locks `dir` (which must exist), or throws naming the run that holds it.
  explicit RunDirLock(const std::filesystem::path& dir) {
    const auto file = dir / ".lock";
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("run.run_dir: cannot create '" + file.string() + "'");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      const auto n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      fd_ = -1;
      const std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("unknown");
      throw Error("run.run_dir: '" + dir.string() + "' is in use by another run (pid " +
                  pid.substr(0, pid.find_first_of("\n ")) + "); wait for it to end or use another run directory");
    }
    const auto me = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      // the lock holds without the pid; a refused run then says "pid unknown"
    }
  }
  RunDirLock(RunDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  RunDirLock& operator=(RunDirLock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~RunDirLock() { release(); }
  [[nodiscard]] bool held() const noexcept { return fd_ >= 0; }

 private:
  void release() noexcept {
    if (fd_ >= 0) ::close(fd_);  // closing drops the flock
    fd_ = -1;
  }
  int fd_ = -1;
};

/// Whether `dir` holds anything but a `.lock` (a run was there).
[[nodiscard]] inline bool holds_a_run(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename() != ".lock") return true;
  return false;
}

/// The time now in strftime's `format`, local or UTC.
inline std::string format_now(const char* format, bool utc = false) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

/// Local time as `YYYYmmdd-HHMMSS`, for run directory names.
inline std::string timestamp_for_path() { return format_now("%Y%m%d-%H%M%S"); }

/// A new directory `<parent>/<stem>-<time>`, created here; when a run started in the same
/// second has that name, `-2`, `-3`, ... is added, so concurrent runs never share one.
[[nodiscard]] inline std::filesystem::path fresh_run_dir(const std::filesystem::path& parent, const std::string& stem) {
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw Error("run.run_dir: cannot create '" + parent.string() + "': " + ec.message());
  const auto base = stem + "-" + timestamp_for_path();
  for (int i = 1; i < 10'000; ++i) {
    auto dir = parent / (i == 1 ? base : base + "-" + std::to_string(i));
    if (std::filesystem::create_directory(dir, ec)) return dir;  // atomic: only one run creates it
    if (ec) throw Error("run.run_dir: cannot create '" + dir.string() + "': " + ec.message());
  }
  throw Error("run.run_dir: no free name for '" + (parent / base).string() + "'");
}

}  // namespace anvil
// ---- end <anvil/observe/run_files.hpp> ----

// Defined by the file `anvil_target_provenance` compiles into a program; absent otherwise.
extern "C" const char* anvil_program_git_commit() __attribute__((weak));

namespace anvil {

/// The commit of the checkout the program was built from ("<sha>" or "<sha>-dirty"), or
/// "unknown" (not built from git, or without `anvil_target_provenance`).
[[nodiscard]] inline std::string program_git_commit() {
  const char* c = anvil_program_git_commit ? anvil_program_git_commit() : nullptr;
  return c && *c ? std::string(c) : std::string("unknown");
}

/// This process's command line, arguments separated by spaces (those with spaces quoted).
[[nodiscard]] inline std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out, arg;
  auto flush = [&] {
    if (!out.empty()) out += ' ';
    out += arg.find_first_of(" \t'\"") == std::string::npos && !arg.empty() ? arg : "'" + arg + "'";
    arg.clear();
  };
  for (char c : all) {
    if (c == '\0') flush();
    else arg += c;
  }
  if (!arg.empty()) flush();
  return out;
}

/// This machine's host name.
[[nodiscard]] inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

/// The time now in UTC, ISO 8601 ("2026-11-24T06:40:00Z").
[[nodiscard]] inline std::string utc_now() { return format_now("%Y-%m-%dT%H:%M:%SZ", true); }

}  // namespace anvil
// ---- end <anvil/observe/provenance.hpp> ----
// ---- begin <anvil/observe/tensorboard.hpp> ----
/// @file
/// `TensorBoardWriter`: TensorBoard event files (`events.out.tfevents.<time>.<host>`)
/// written directly: each record is TFRecord-framed (length, masked CRC-32C of the length,
/// payload, masked CRC-32C of the payload) around a serialized `tensorflow.Event` protocol
/// buffer holding scalars (`Summary.Value.simple_value`) or histograms (`HistogramProto`).
/// The three messages are encoded by hand here (a few dozen lines) rather than with
/// libprotobuf: generated code would need protoc and TensorBoard's .proto files at build
/// time for three messages; the CRC-32C is the one checkpoints use. Light header.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

namespace tb {

/// TFRecord's masked CRC-32C (a rotation plus a constant, so that a CRC of data holding
/// CRCs stays well distributed).
inline std::uint32_t masked_crc(const void* data, std::size_t n) {
  detail::Crc32c c;
  c.update(data, n);
  const std::uint32_t crc = c.value();
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// Protocol-buffer encoding, the parts an Event needs.
class ProtoWriter {
 public:
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire) { varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire)); }
  void double_field(int field, double v) {
    key(field, 1);
    raw(&v, 8);
  }
  void float_field(int field, float v) {
    key(field, 5);
    raw(&v, 4);
  }
  void int_field(int field, std::int64_t v) {
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }
  void bytes_field(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    out_ += s;
  }
  /// A packed repeated double.
  void packed_doubles(int field, std::span<const double> v) {
    key(field, 2);
    varint(v.size() * 8);
    raw(v.data(), v.size() * 8);
  }
  [[nodiscard]] const std::string& str() const noexcept { return out_; }

 private:
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

/// A histogram in TensorBoard's layout: bucket i counts the values from limit[i-1] (or the
/// minimum) up to limit[i], the last bucket including the maximum.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;

  /// `bins` equal-width buckets over the values' range (NaNs and infinities skipped).
  static Histogram of(std::span<const float> values, int bins = 30) {
    Histogram h;
    h.min = std::numeric_limits<double>::infinity();
    h.max = -h.min;
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      const double x = f;
      h.min = std::min(h.min, x);
      h.max = std::max(h.max, x);
      h.num += 1;
      h.sum += x;
      h.sum_squares += x * x;
    }
    if (h.num == 0) return Histogram{};
    const double width = h.max > h.min ? (h.max - h.min) / bins : 1.0;
    h.bucket.assign(static_cast<std::size_t>(bins), 0.0);
    for (int i = 0; i < bins; ++i) h.bucket_limit.push_back(h.min + width * (i + 1));
    h.bucket_limit.back() = std::max(h.bucket_limit.back(), h.max);
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      auto i = static_cast<std::ptrdiff_t>((f - h.min) / width);
      i = std::clamp<std::ptrdiff_t>(i, 0, bins - 1);
      h.bucket[static_cast<std::size_t>(i)] += 1;
    }
    return h;
  }
};

}  // namespace tb

/// Appends events to one TensorBoard event file in `dir`. Each `scalar` or `histogram` is
/// one event; `flush` makes them visible to TensorBoard (also done every `flush_every`
/// events and on destruction).
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  explicit TensorBoardWriter(const std::filesystem::path& dir, int flush_every = 64) : flush_every_(flush_every) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    const auto secs = static_cast<long long>(now());
    path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(::getpid()));
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error("cannot write TensorBoard events to '" + path_.string() + "'");
    tb::ProtoWriter e;  // the first event names the format version
    e.double_field(1, now());
    e.bytes_field(3, "brain.Event:2");
    record(e.str());
    flush();
  }
  TensorBoardWriter(TensorBoardWriter&& o) noexcept { *this = std::move(o); }
  TensorBoardWriter& operator=(TensorBoardWriter&& o) noexcept {
    if (this != &o) {
      close();
      f_ = std::exchange(o.f_, nullptr);
      path_ = std::move(o.path_);
      flush_every_ = o.flush_every_;
      pending_ = o.pending_;
    }
    return *this;
  }
  ~TensorBoardWriter() { close(); }

  [[nodiscard]] bool is_open() const noexcept { return f_ != nullptr; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// A scalar `tag` = `value` at `step`.
  void scalar(const std::string& tag, double value, std::int64_t step) {
    if (!f_) return;
    tb::ProtoWriter v;
    v.bytes_field(1, tag);
    v.float_field(2, static_cast<float>(value));
    event(v.str(), step);
  }

  /// A text summary (TensorBoard's Text tab; Markdown) under `tag` at `step`, e.g. a run's
  /// resolved config.
  void text(const std::string& tag, const std::string& markdown, std::int64_t step) {
    if (!f_) return;
    tb::ProtoWriter plugin;  // SummaryMetadata.PluginData: plugin_name
    plugin.bytes_field(1, "text");
    tb::ProtoWriter meta;  // SummaryMetadata: plugin_data
    meta.bytes_field(1, plugin.str());
    tb::ProtoWriter tensor;  // TensorProto: dtype DT_STRING, a scalar shape, string_val
    tensor.int_field(1, 7);
    tensor.bytes_field(2, std::string());
    tensor.bytes_field(8, markdown);
    tb::ProtoWriter v;  // Summary.Value: tag, tensor, metadata
    v.bytes_field(1, tag);
    v.bytes_field(8, tensor.str());
    v.bytes_field(9, meta.str());
    event(v.str(), step);
  }

  /// A histogram of `values` (e.g. a layer's weights) under `tag` at `step`.
  void histogram(const std::string& tag, std::span<const float> values, std::int64_t step, int bins = 30) {
    if (!f_) return;
    const auto h = tb::Histogram::of(values, bins);
    tb::ProtoWriter hp;
    hp.double_field(1, h.min);
    hp.double_field(2, h.max);
    hp.double_field(3, h.num);
    hp.double_field(4, h.sum);
    hp.double_field(5, h.sum_squares);
    hp.packed_doubles(6, h.bucket_limit);
    hp.packed_doubles(7, h.bucket);
    tb::ProtoWriter v;
    v.bytes_field(1, tag);
    v.bytes_field(5, hp.str());
    event(v.str(), step);
  }

  void flush() {
    if (!f_) return;
    if (std::fflush(f_) != 0) throw Error("writing '" + path_.string() + "' failed (disk full?)");
    pending_ = 0;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  // An Event holding a Summary with one Value.
  void event(const std::string& value, std::int64_t step) {
    tb::ProtoWriter summary;
    summary.bytes_field(1, value);
    tb::ProtoWriter e;
    e.double_field(1, now());
    e.int_field(2, step);
    e.bytes_field(5, summary.str());
    record(e.str());
    if (++pending_ >= flush_every_) flush();
  }
  // TFRecord framing.
  void record(const std::string& data) {
    const std::uint64_t n = data.size();
    const std::uint32_t len_crc = tb::masked_crc(&n, sizeof n);
    const std::uint32_t data_crc = tb::masked_crc(data.data(), data.size());
    const bool ok = std::fwrite(&n, 8, 1, f_) == 1 && std::fwrite(&len_crc, 4, 1, f_) == 1 &&
                    (data.empty() || std::fwrite(data.data(), data.size(), 1, f_) == 1) &&
                    std::fwrite(&data_crc, 4, 1, f_) == 1;
    if (!ok) throw Error("writing '" + path_.string() + "' failed (disk full?)");
  }
  void close() noexcept {
    if (f_) {
      std::fflush(f_);
      std::fclose(f_);
      f_ = nullptr;
    }
  }

  std::FILE* f_ = nullptr;
  std::filesystem::path path_;
  int flush_every_ = 64;
  int pending_ = 0;
};

}  // namespace anvil
// ---- end <anvil/observe/tensorboard.hpp> ----
// ---- begin <anvil/observe/update_metrics.hpp> ----
/// @file
/// `UpdateMetrics`: the scalars algorithms report with each update (`UpdateInfo::metrics`:
/// losses, Q means, temperatures, KL, ...) and loops add (PPO's epochs), summed by name
/// until the next log row, which writes their means. Light header.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// Sums and counts of named metrics since the last log row (see file comment).
class UpdateMetrics {
 public:
  /// Adds one value of metric `name`.
  void add(const std::string& name, double v) {
    auto& m = sums_[name];
    m.first += v;
    m.second += 1;
  }
  /// Adds every `(name, value)` of one update.
  void add(const std::vector<std::pair<std::string, double>>& values) {
    for (const auto& [k, v] : values) add(k, v);
  }
  /// Sum and count of each metric, by name (alphabetical: the columns' order).
  [[nodiscard]] const std::map<std::string, std::pair<double, int>>& sums() const noexcept { return sums_; }
  /// Zeroes every sum, keeping the names (a log row's columns stay).
  void clear_values() {
    for (auto& [name, m] : sums_) m = {0.0, 0};
  }
  /// Makes sure every name in `names` is known (with nothing summed yet), so that ranks
  /// reduce the same list.
  void know(const std::vector<std::string>& names) {
    for (const auto& n : names) sums_.try_emplace(n, 0.0, 0);
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [k, m] : sums_) out.push_back(k);
    return out;
  }

  /// State protocol (core/state.hpp): the sums since the last log row.
  void save(BinaryWriter& w) const {
    w.value(static_cast<std::uint64_t>(sums_.size()));
    for (const auto& [k, m] : sums_) {
      w.string(k);
      w.value(m.first);
      w.value(m.second);
    }
  }
  using Saved = std::map<std::string, std::pair<double, int>>;
  [[nodiscard]] Saved read(BinaryReader& r) const {
    const auto n = r.value<std::uint64_t>("metrics");
    if (n > 10'000) r.fail("metrics", "has an implausible number of entries");
    Saved s;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("metric name");
      const auto sum = r.value<double>("metric sum");
      s[k] = {sum, r.value<int>("metric count")};
    }
    return s;
  }
  void restore(Saved s) { sums_ = std::move(s); }

 private:
  std::map<std::string, std::pair<double, int>> sums_;
};

}  // namespace anvil
// ---- end <anvil/observe/update_metrics.hpp> ----

// ---- begin <anvil/buffers/episode_buffer.hpp> ----
/// @file
/// `EpisodeBuffer`: the storage of the episodic loop. It holds one round of whole episodes,
/// one per env, in tensors allocated once ([max_steps, N] rows), and hands the round out as
/// one `EpisodeBatch` padded to the longest episode with a mask. It is cleared for the next
/// round: like a rollout, it is learned from by the policy that collected it.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>


namespace anvil {

/// Buffer policy for whole episodes (see file comment).
class EpisodeBuffer {
 public:
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = "episodes";
  static constexpr bool on_policy = true;
  using Batch = EpisodeBatch;
  using Step = EpisodeStep;

  struct Config {
    Param<std::int64_t, "max_steps", "the longest episode a round holds (longer ones are an error)",
          in_range(1, 1 << 24)>
        max_steps{1000};
  };

  EpisodeBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), obs_dim_(spec.obs_dim()), act_dim_(spec.action_dim()),
        discrete_(spec.discrete()) {}

  /// Storage for the run's envs (the loop calls it before the run and after a resume).
  void plan(const StoragePlan& p) {
    if (p.num_envs == envs_) return;
    envs_ = p.num_envs;
    const std::int64_t t = cfg_.max_steps, n = envs_;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    obs_ = at::zeros({t, n, obs_dim_}, f);
    action_ = discrete_ ? at::zeros({t, n}, f.dtype(at::kLong)) : at::zeros({t, n, act_dim_}, f);
    for (auto* x : {&reward_, &terminated_, &mask_}) *x = at::zeros({t, n}, f);
    length_ = at::zeros({n}, f.dtype(at::kLong));
    last_obs_ = at::zeros({n, obs_dim_}, f);
    clear();
  }

  /// Stores one step of every env; the rows of envs no longer live are kept out of the
  /// episodes. Throws when an episode outgrows `episodes.max_steps`.
  void add(const EpisodeStep& s) {
    if (envs_ == 0) throw Error("EpisodeBuffer::add: plan() was not called");
    if (steps_ >= *cfg_.max_steps)
      throw Error("EpisodeBuffer: an episode is longer than episodes.max_steps (" + std::to_string(*cfg_.max_steps) +
                  "); raise it");
    const std::int64_t t = steps_;
    const auto live = s.live.to(at::kFloat).reshape({envs_});
    obs_[t].copy_(s.obs);
    action_[t].copy_(discrete_ ? s.action.reshape({envs_}) : s.action);
    reward_[t].copy_(s.reward * live);
    terminated_[t].copy_(s.terminated * live);
    mask_[t].copy_(live);
    const auto on = live.to(at::kBool);
    length_.masked_fill_(on, t + 1);
    const auto rows = on.nonzero().reshape({-1});
    last_obs_.index_copy_(0, rows, s.next_obs.index_select(0, rows));
    ++steps_;
    live_ += static_cast<std::int64_t>(live.sum().item<float>());
  }

  /// The round's episodes, [N, T, ...] with T the longest (on the algorithm's device).
  [[nodiscard]] EpisodeBatch episodes() const {
    if (steps_ == 0) throw Error("EpisodeBuffer::episodes: the round holds no steps");
    auto rows = [&](const at::Tensor& x) { return x.narrow(0, 0, steps_).transpose(0, 1).contiguous().to(device_); };
    return EpisodeBatch{rows(obs_), rows(action_), rows(reward_), rows(terminated_), rows(mask_), length_.to(device_),
                        last_obs_.to(device_)};
  }

  /// Empties the buffer for the next round (storage is kept).
  void clear() {
    steps_ = 0;
    live_ = 0;
    if (envs_ > 0) {
      mask_.zero_();
      length_.zero_();
    }
  }

  /// Steps stored that belong to episodes, and the most a round holds.
  [[nodiscard]] std::int64_t size() const noexcept { return live_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return *cfg_.max_steps * envs_; }
  /// Steps of the longest episode so far this round.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  /// State protocol: nothing between rounds, where the episodic loop checkpoints; a round
  /// in progress is refused.
  void save(BinaryWriter& w) const {
    if (steps_ > 0) throw Error("EpisodeBuffer::save: a round is in progress; save between rounds");
    w.value(envs_);
  }
  [[nodiscard]] std::int64_t read(BinaryReader& r) const {
    r.expect(envs_, "env.num_envs");
    return 0;
  }
  void restore(std::int64_t) { clear(); }

 private:
  Config cfg_;
  c10::Device device_;
  std::int64_t obs_dim_, act_dim_;
  bool discrete_;
  std::int64_t envs_ = 0, steps_ = 0, live_ = 0;
  at::Tensor obs_, action_, reward_, terminated_, mask_, length_, last_obs_;
};

static_assert(Buffer<EpisodeBuffer>);

}  // namespace anvil
// ---- end <anvil/buffers/episode_buffer.hpp> ----
// ---- begin <anvil/buffers/prioritized_buffer.hpp> ----
/// @file
/// `PrioritizedBuffer`: proportional prioritized experience replay (Schaul, Quan,
/// Antonoglou, Silver 2016, "Prioritized Experience Replay", ICLR), on the cache-line sum
/// tree of buffers/sum_tree.hpp. Defaults are the paper's proportional variant: alpha 0.6,
/// beta annealed from 0.4 to 1.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

// ---- begin <anvil/buffers/detail/replay_core.hpp> ----
/// @file
/// `ReplayBase`: what every replay buffer shares, written once: its declarations as a buffer
/// policy, the transition store (with its n-step windows), the checks on a batch size, the
/// tasks' shares of a balanced batch, the buffer file (`save(path)`, `load(path)`) and the
/// counts. `UniformBuffer` and `PrioritizedBuffer` derive from it and add their sampling.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

// ---- begin <anvil/buffers/detail/transition_store.hpp> ----
/// @file
/// `TransitionStore`: the preallocated rings both replay buffers keep (transitions, and
/// observations stored once), and the ids that name a transition while it is stored.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// ---- begin <anvil/buffers/detail/n_step.hpp> ----
/// @file
/// `NStepWindow`: turns each env's stream of one-step transitions into n-step ones
/// (Sutton 1988; as used with replay by Hessel et al. 2018, "Rainbow"), before they are
/// stored. A stored transition is then self-contained: obs_t, action_t, the discounted sum
/// of up to n rewards, the observation it leads to, whether that one is terminal, and the
/// discount gamma^k of its bootstrap term. So sampling needs no look-ahead and the ring's
/// wraparound cannot split a window. Observations are named by their ids in the
/// buffer's observation ring (see transition_store.hpp), so a window holds no copies.

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>


namespace anvil::detail {

class NStepWindow {
 public:
  /// One env's step waiting in its window; `obs` and `next` are observation ids.
  struct Step {
    std::int64_t obs = -1, next = -1;
    std::vector<float> action;
    double reward = 0;
    bool terminated = false;
  };
  /// A completed k-step transition, k <= n.
  struct Done {
    std::int64_t obs = -1, next = -1;
    std::vector<float> action;
    double reward = 0, discount = 1;
    bool terminated = false;
  };

  NStepWindow() = default;
  NStepWindow(int n, double gamma) : n_(n), gamma_(gamma) {}

  [[nodiscard]] int n() const noexcept { return n_; }
  void set_gamma(double gamma) noexcept { gamma_ = gamma; }
  [[nodiscard]] double gamma() const noexcept { return gamma_; }

  /// Starts over with `envs` empty windows unless there are that many already.
  void resize(std::size_t envs) {
    if (pending_.size() != envs) pending_.assign(envs, {});
  }

  /// Takes env `env`'s next step and appends what it completes to `out`: the oldest
  /// pending step once n are pending, or every pending step when this one `ended` its
  /// episode (terminated or truncated).
  void push(std::size_t env, Step st, bool ended, std::vector<Done>& out) {
    auto& q = pending_[env];
    q.push_back(std::move(st));
    if (ended) {
      while (!q.empty()) emit(q, out);
    } else if (static_cast<int>(q.size()) == n_) {
      emit(q, out);
    }
  }

  /// Writes the windows still filling, so a restored buffer continues them.
  void save(BinaryWriter& w) const {
    w.value<std::int32_t>(n_);
    w.value(gamma_);
    w.value<std::uint64_t>(pending_.size());
    for (const auto& q : pending_) {
      w.value<std::uint64_t>(q.size());
      for (const auto& st : q) {
        w.value(st.obs);
        w.value(st.next);
        w.value<std::uint64_t>(st.action.size());
        w.bytes(st.action.data(), st.action.size() * sizeof(float));
        w.value(st.reward);
        w.value<std::uint8_t>(st.terminated);
      }
    }
  }
  /// What `save` wrote, checked and not yet applied.
  struct Saved {
    double gamma = 0;
    std::vector<std::deque<Step>> pending;
  };
  Saved read(BinaryReader& r) const {
    r.expect<std::int32_t>(n_, "buffer.n_step");
    Saved s;
    s.gamma = r.value<double>("n-step gamma");
    const auto envs = r.value<std::uint64_t>("n-step env count");
    if (envs > (1u << 20)) r.fail("n-step env count", "is implausibly large");
    s.pending.resize(envs);
    for (auto& q : s.pending) {
      const auto len = r.value<std::uint64_t>("n-step window length");
      if (len >= static_cast<std::uint64_t>(n_)) r.fail("n-step window length", "is not below buffer.n_step");
      for (std::uint64_t k = 0; k < len; ++k) {
        Step st;
        st.obs = r.value<std::int64_t>("n-step observation ids");
        st.next = r.value<std::int64_t>("n-step observation ids");
        const auto ad = r.value<std::uint64_t>("n-step action size");
        if (ad > (1u << 24)) r.fail("n-step action size", "is implausibly large");
        st.action.resize(ad);
        r.bytes(st.action.data(), st.action.size() * sizeof(float), "n-step actions");
        st.reward = r.value<double>("n-step rewards");
        st.terminated = r.value<std::uint8_t>("n-step terminal flags") != 0;
        q.push_back(std::move(st));
      }
    }
    return s;
  }
  void restore(Saved&& s) {
    gamma_ = s.gamma;
    pending_ = std::move(s.pending);
  }

  /// Steps waiting for their window to fill, over all envs.
  [[nodiscard]] std::int64_t pending() const noexcept {
    std::int64_t p = 0;
    for (const auto& q : pending_) p += static_cast<std::int64_t>(q.size());
    return p;
  }

 private:
  // Emits the oldest pending step of one env as a k-step transition over all k pending.
  void emit(std::deque<Step>& q, std::vector<Done>& out) const {
    double ret = 0, g = 1;
    for (const auto& st : q) {
      ret += g * st.reward;
      g *= gamma_;
    }
    out.push_back(Done{q.front().obs, q.back().next, std::move(q.front().action), ret, g, q.back().terminated});
    q.pop_front();
  }

  int n_ = 1;
  double gamma_ = 0.99;
  std::vector<std::deque<Step>> pending_;
};

}  // namespace anvil::detail
// ---- end <anvil/buffers/detail/n_step.hpp> ----
// ---- begin <anvil/buffers/replay_config.hpp> ----
/// @file
/// The replay buffers' `buffer` sections and their shared fields, and the rollout buffer's
/// `rollout` section, apart from the buffers, so a Trainer's config can be built without
/// torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <cstdint>
#include <string_view>


namespace anvil {

/// Where a replay buffer keeps its tensors: with the networks (no copy per sample; the
/// default) or in host memory (for buffers larger than the GPU's memory).
enum class Storage { compute, cpu };
constexpr auto enum_names(Storage) { return std::array<std::string_view, 2>{"compute", "cpu"}; }

/// How a replay buffer stores observations: full float32, or 16-bit floats to halve the
/// memory of observation-heavy buffers (batches always come out as float32).
enum class ObsDtype { float32, bfloat16, float16 };
constexpr auto enum_names(ObsDtype) {
  return std::array<std::string_view, 3>{"float32", "bfloat16", "float16"};
}

namespace detail {

// Config fields every replay buffer has (each buffer's Config lists them by these names).
using CapacityParam = Param<std::int64_t, "capacity", "transitions kept; the oldest are overwritten", at_least(1)>;
using StorageParam = Param<Storage, "storage", "compute: tensors on the training device; cpu: in host memory">;
using ObsDtypeParam = Param<ObsDtype, "obs_dtype",
                            "observation storage: float32, or bfloat16/float16 for half the memory">;
using NStepParam = Param<int, "n_step",
                         "store n-step returns: rewards summed over up to n steps, discounted by the "
                         "algorithm's gamma (1: one-step transitions)",
                         in_range(1, 1000)>;
using BalanceTasksParam = Param<bool, "balance_tasks",
                                "with an env that has tasks, give each task an equal share of every batch "
                                "(batch / tasks transitions each)">;

}  // namespace detail

/// The `buffer` section of `UniformBuffer`.
struct UniformBufferConfig {
  detail::CapacityParam capacity{1'000'000};
  detail::StorageParam storage{Storage::compute};
  detail::ObsDtypeParam obs_dtype{ObsDtype::float32};
  detail::NStepParam n_step{1};
  detail::BalanceTasksParam balance_tasks{true};
};

/// The `buffer` section of `PrioritizedBuffer`.
struct PrioritizedBufferConfig {
  detail::CapacityParam capacity{1'000'000};
  detail::StorageParam storage{Storage::compute};
  detail::ObsDtypeParam obs_dtype{ObsDtype::float32};
  detail::NStepParam n_step{1};
  Param<double, "alpha", "priority exponent: 0 samples uniformly, 1 in proportion to |TD error|",
        in_range(0, 1)>
      alpha{0.6};
  Param<double, "beta", "importance-weight exponent at the start; rises linearly to 1", in_range(0, 1)>
      beta{0.4};
  Param<std::int64_t, "beta_steps", "env steps over which beta reaches 1 (0: the whole run)",
        at_least(0)>
      beta_steps{0};
  Param<double, "eps", "added to |TD error| so no transition's priority is zero", positive> eps{1e-6};
  detail::BalanceTasksParam balance_tasks{true};
};

/// The `rollout` section of `RolloutBuffer`.
struct RolloutBufferConfig {
  Param<std::int64_t, "steps", "env steps per env in one rollout (the rollout is steps x num_envs)",
        in_range(1, 1 << 24)>
      steps{2048};
  Param<double, "gae_lambda", "GAE's lambda: 0 is the one-step TD error, 1 the Monte Carlo return",
        in_range(0, 1)>
      gae_lambda{0.95};
  Param<bool, "normalize_advantage", "scale each minibatch's advantages to mean 0, std 1">
      normalize_advantage{true};
};

class UniformBuffer;      // buffers/uniform_buffer.hpp
class PrioritizedBuffer;  // buffers/prioritized_buffer.hpp
class RolloutBuffer;      // buffers/rollout_buffer.hpp

template <>
struct policy_config<UniformBuffer> {
  using type = UniformBufferConfig;
  static constexpr FixedString section = "buffer";
};
template <>
struct policy_config<PrioritizedBuffer> {
  using type = PrioritizedBufferConfig;
  static constexpr FixedString section = "buffer";
};
template <>
struct policy_config<RolloutBuffer> {
  using type = RolloutBufferConfig;
  static constexpr FixedString section = "rollout";
};

}  // namespace anvil
// ---- end <anvil/buffers/replay_config.hpp> ----
// ---- begin <anvil/core/detail/huge_pages.hpp> ----
/// @file
/// Large arrays that are read at random (replay storage, priority trees) backed by 2 MiB
/// pages where the OS offers them, so a random access costs one cache miss and rarely a
/// TLB miss too: with 4 KiB pages, a 100 MB array spans 25,000 pages, far more than the TLB
/// holds. On Linux with transparent huge pages in "madvise" mode (Debian's default) this
/// needs an madvise(MADV_HUGEPAGE) before the memory is first touched. Light header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace anvil::detail {

inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

/// Starts fetching the cache line at `p` into the second-level cache, for a read soon.
///
/// The random reads of replay storage and priority trees fetch their lines ahead this way
/// rather than into the first-level cache (`__builtin_prefetch(p)`): on the machine class
/// of benchmarks/RESULTS.md, random lines of a 128 MiB array on 2 MiB pages arrive at 4.9
/// ns a line when each is fetched 32 lines ahead into the L2, 7.3 ns into the L1 (whose
/// few miss buffers bound how many are in flight) and 8.9 ns unfetched
/// (benchmarks/random_lines.c). Always inlined: GCC counts a prefetch as no side effect,
/// so a call to a function that only prefetches may be dropped as dead code.
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
inline void prefetch_l2(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 1);
#else
  (void)p;
#endif
}

/// Asks for huge pages over the whole pages inside [p, p + bytes), for regions of at least
/// two huge pages; a no-op elsewhere. Call it before the memory is first written.
inline void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p == nullptr || bytes < 2 * kHugePage) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
  const auto e = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
  if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// A fixed-size array of trivially copyable `T`, aligned to a cache line (to a huge page
/// when large, and advised to use huge pages), every element set to `fill`.
template <class T>
class HugeArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  HugeArray() = default;
  HugeArray(std::size_t n, const T& fill) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    const std::size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
    p_ = static_cast<T*>(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    if (p_ == nullptr) throw std::bad_alloc();
    advise_huge_pages(p_, bytes);
    std::fill(p_, p_ + n, fill);
  }
  HugeArray(const HugeArray& o) : HugeArray(o.n_, T{}) { std::copy(o.begin(), o.end(), p_); }
  HugeArray(HugeArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HugeArray& operator=(HugeArray o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~HugeArray() { std::free(p_); }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] const T* data() const noexcept { return p_; }
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }
  T* begin() noexcept { return p_; }
  T* end() noexcept { return p_ + n_; }
  const T* begin() const noexcept { return p_; }
  const T* end() const noexcept { return p_ + n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace anvil::detail
// ---- end <anvil/core/detail/huge_pages.hpp> ----

namespace anvil {

namespace detail {

/// `t`'s values as a contiguous host tensor of `dtype`, for reading its data: `t` itself when
/// it is one already, so the per-step calls of the buffers, which usually get such tensors,
/// run no LibTorch op; else a converted copy (no autograd history).
inline at::Tensor host_as(const at::Tensor& t, at::ScalarType dtype) {
  if (t.is_cpu() && t.scalar_type() == dtype && t.is_contiguous()) return t;
  return t.detach().to(at::kCPU, dtype).contiguous();
}

/// Replay storage in two preallocated rings.
///
/// Transitions: `capacity` rows of [action | reward | terminated (| discount)] floats,
/// plus, for each, the slots of its obs and next_obs in the observation ring. Transition
/// number k (counting every transition ever added, from 0) is its id; it lives in row
/// k % capacity until `capacity` more are added after it.
///
/// Observations are stored once. When env i's observation at this step is bitwise the one
/// its previous step led to (always, within an episode), the transition reuses that row,
/// so an episode of L steps costs L + 1 observations instead of 2L: about half the memory
/// of observation-heavy buffers. The observation ring has capacity * 5/4 + 256 rows, which
/// covers episodes of 4 steps or more. With shorter episodes, or transitions whose
/// observations do not chain, a transition whose observation is overwritten leaves
/// early; `size()` counts what is stored and `dropped()` what left early.
///
/// With an env that has tasks (`EnvSpec::tasks`), each row also holds its transition's
/// task, batches carry it (`ReplayBatch::task`), and the store counts the live
/// transitions of each task (`task_count`, `task_of`) for task-balanced sampling.
///
/// n-step returns (`n_step` > 1) are formed before storing by an `NStepWindow` per env.
/// Rows live with the networks (`device`); on the CPU a batch comes out as contiguous
/// float32 tensors gathered with prefetching; on a GPU by `index_select`, so transitions
/// never cross to the host. Discrete actions are stored as floats (exact below 2^24).
class TransitionStore {
 public:
  /// The observation rows of a transition's obs and next_obs; -1 when the row holds none.
  struct Link {
    std::int32_t obs = -1, next = -1;
  };

  /// `extra_host_bytes`: host memory the owner allocates beside the store (a priority
  /// tree), counted in the check that the whole fits before anything is allocated.
  TransitionStore(const EnvSpec& spec, std::int64_t capacity, c10::Device device, std::string owner,
                  int n_step = 1, ObsDtype obs_dtype = ObsDtype::float32, std::int64_t extra_host_bytes = 0)
      : capacity_(capacity),
        obs_capacity_(capacity + (capacity + 3) / 4 + 256),
        device_(device),
        owner_(std::move(owner)),
        od_(spec.obs_dim()),
        ad_(spec.action_dim()),
        discrete_(spec.discrete()),
        with_discount_(n_step > 1),
        obs_dtype_(obs_dtype),
        tasks_(static_cast<std::int64_t>(spec.tasks.size())),
        width_(ad_ + 2 + (n_step > 1 ? 1 : 0) + (tasks_ > 0 ? 1 : 0)),
        window_(n_step, 0.99) {
    if (obs_capacity_ > INT32_MAX)
      throw Error(owner_ + ": buffer.capacity=" + std::to_string(capacity) +
                  " is above the largest supported (1,700,000,000 transitions)");
    // Refused before a byte is allocated when it cannot fit (host memory; a GPU's own
    // allocator reports its out-of-memory errors, named below).
    const std::int64_t obs_size = obs_dtype_ == ObsDtype::float32 ? 4 : 2;
    const std::int64_t host = static_cast<std::int64_t>(capacity_ * sizeof(Link) + obs_capacity_ * sizeof(std::int32_t)) +
                              (tasks_ > 0 ? capacity_ * static_cast<std::int64_t>(sizeof(std::int32_t)) : 0) +
                              extra_host_bytes;
    const std::int64_t need = capacity_ * width_ * 4 + obs_capacity_ * od_ * obs_size + host;
    const std::string field = "buffer.capacity=" + std::to_string(capacity);
    check_fits(device_.is_cpu() ? need : host, field, owner_ + "'s storage");
    allocating(owner_ + "'s storage (" + field + ")", need, [&] {
      const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
      data_ = at::empty({capacity_, width_}, f);
      obs_ = at::empty({obs_capacity_, od_}, f.dtype(obs_dtype_ == ObsDtype::float32    ? at::kFloat
                                                     : obs_dtype_ == ObsDtype::bfloat16 ? at::kBFloat16
                                                                                        : at::kHalf));
      if (device_.is_cpu()) {  // read at random: huge pages spare most TLB misses
        advise_huge_pages(data_.data_ptr(), static_cast<std::size_t>(data_.nbytes()));
        advise_huge_pages(obs_.data_ptr(), static_cast<std::size_t>(obs_.nbytes()));
      }
      link_ = HugeArray<Link>(static_cast<std::size_t>(capacity_), Link{});
      owner_of_ = HugeArray<std::int32_t>(static_cast<std::size_t>(obs_capacity_), -1);
      if (tasks_ > 0) task_of_ = HugeArray<std::int32_t>(static_cast<std::size_t>(capacity_), -1);
    });
    task_count_.assign(static_cast<std::size_t>(tasks_), 0);
  }

  /// Stores one step of N envs (row i = env i; the ring wraps as needed), or with n-step
  /// returns the transitions it completes. Returns the id of the first stored transition
  /// and how many were stored; `killed()` then lists the rows of older transitions that
  /// left early because their observations were overwritten.
  std::pair<std::int64_t, std::int64_t> add(const StepBatch& s) {
    const std::int64_t n = s.obs.size(0);
    if (n > capacity_)
      throw Error(owner_ + ": adding " + std::to_string(n) +
                  " transitions at once exceeds buffer.capacity=" + std::to_string(capacity_));
    if (2 * n > obs_capacity_)
      throw Error(owner_ + ": adding " + std::to_string(n) + " transitions at once needs up to " +
                  std::to_string(2 * n) + " observation rows; this buffer has " + std::to_string(obs_capacity_) +
                  " (buffer.capacity=" + std::to_string(capacity_) + ")");
    const auto obs = host(s.obs, n, od_, "obs"), next = host(s.next_obs, n, od_, "next_obs");
    const auto act = host(s.action, n, ad_, "action"), rew = host(s.reward, n, 1, "reward");
    const auto term = host(s.terminated, n, 1, "terminated");
    const auto trunc = s.truncated.defined() ? host(s.truncated, n, 1, "truncated") : at::zeros({n});
    at::Tensor task;
    if (tasks_ > 0) {
      if (!s.task.defined() || s.task.numel() != n)
        throw Error(owner_ + ": StepBatch.task must give each of the " + std::to_string(n) + " envs' task (the env has " +
                    std::to_string(tasks_) + " tasks)");
      task = s.task.to(at::kCPU, at::kLong).contiguous();
      const auto* tk = task.data_ptr<std::int64_t>();
      for (std::int64_t i = 0; i < n; ++i)
        if (tk[i] < 0 || tk[i] >= tasks_)
          throw Error(owner_ + ": StepBatch.task[" + std::to_string(i) + "] is " + std::to_string(tk[i]) +
                      "; the env has tasks 0 to " + std::to_string(tasks_ - 1));
    }
    const std::int64_t* tk = task.defined() ? task.data_ptr<std::int64_t>() : nullptr;
    const float *o = obs.data_ptr<float>(), *no = next.data_ptr<float>(), *a = act.data_ptr<float>();
    const float *r = rew.data_ptr<float>(), *t = term.data_ptr<float>(), *tr = trunc.data_ptr<float>();

    killed_.clear();
    const std::int64_t first_obs = obs_added_, first_row = added_;  // this add's ids are consecutive
    obs_stage_.clear();
    row_stage_.clear();
    if (open_.size() != static_cast<std::size_t>(n)) {
      open_.assign(static_cast<std::size_t>(n), -1);
      open_obs_.assign(static_cast<std::size_t>(n * od_), 0.f);
      window_.resize(static_cast<std::size_t>(n));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const auto e = static_cast<std::size_t>(i);
      const float* oi = o + i * od_;
      float* open = open_obs_.data() + i * od_;
      std::int64_t oid = open_[e];
      if (!obs_live(oid) ||
          std::memcmp(oi, open, static_cast<std::size_t>(od_) * sizeof(float)) != 0)
        oid = append_obs(oi);
      const std::int64_t nid = append_obs(no + i * od_);
      open_[e] = nid;
      std::copy(no + i * od_, no + (i + 1) * od_, open);
      const std::int32_t ti = tk ? static_cast<std::int32_t>(tk[i]) : -1;
      if (window_.n() == 1) {
        put(oid, nid, a + i * ad_, r[i], t[i], 1.0, ti);
      } else {
        window_.push(e, {oid, nid, std::vector<float>(a + i * ad_, a + (i + 1) * ad_), r[i], t[i] > 0.5f},
                     t[i] > 0.5f || tr[i] > 0.5f, done_);
        for (const auto& d : done_) {
          if (obs_live(d.obs)) {
            put(d.obs, d.next, d.action.data(), static_cast<float>(d.reward), d.terminated ? 1.f : 0.f, d.discount, ti);
          } else {
            ++dropped_;  // its first observation was overwritten while the window filled
          }
        }
        done_.clear();
      }
    }
    flush(first_obs, first_row);
    return {first_row, added_ - first_row};
  }

  /// The transitions in rows `slots` (each must be `valid`) as a batch of contiguous
  /// tensors on the storage device, with their ids in `index`.
  ReplayBatch gather(std::span<const std::int64_t> slots) const {
    const auto n = static_cast<std::int64_t>(slots.size());
    ReplayBatch b;
    if (device_.is_cpu()) {
      const auto f = data_.options();
      b.obs = at::empty({n, od_}, f);
      b.next_obs = at::empty({n, od_}, f);
      at::Tensor action = at::empty({n, ad_}, f);
      b.reward = at::empty({n}, f);
      b.terminated = at::empty({n}, f);
      if (with_discount_) b.discount = at::empty({n}, f);
      const float* src = data_.data_ptr<float>();
      float *o = b.obs.data_ptr<float>(), *no = b.next_obs.data_ptr<float>(), *a = action.data_ptr<float>();
      float *r = b.reward.data_ptr<float>(), *t = b.terminated.data_ptr<float>();
      float* d = with_discount_ ? b.discount.data_ptr<float>() : nullptr;
      std::int64_t* tk = nullptr;
      if (tasks_ > 0) {
        b.task = at::empty({n}, at::TensorOptions().dtype(at::kLong));
        tk = b.task.data_ptr<std::int64_t>();
      }
      const std::int64_t task_col = ad_ + 2 + (with_discount_ ? 1 : 0);
      // Rows of random transitions miss every cache. They are read in two passes over each
      // chunk of the batch, each fetching its lines kAhead transitions ahead into the L2
      // (`prefetch_l2`): the links and action rows, then the two observation rows that the
      // links name. The prefetches are written out in the loops, not in helper lambdas:
      // GCC 12 counts a lambda that only reads and prefetches as free of side effects and
      // drops its calls, which left the observation rows unfetched before (a uniform sample
      // took 2.6x as long; benchmarks/RESULTS.md, "The gather in two passes").
      constexpr std::int64_t kChunk = 256, kAhead = 24;
      const Link* link = link_.data();
      auto run = [&](const auto* obs_src) {
        std::int32_t rows[2 * kChunk];  // the chunk's observation rows: obs, next_obs of each transition
        for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
          const std::int64_t m = std::min(kChunk, n - c0);
          const std::int64_t* sl = slots.data() + c0;
          // pass 1: the links and action rows
          for (std::int64_t i = 0; i < std::min(kAhead, m); ++i) {
            prefetch_l2(link + sl[i]);
            prefetch_l2(src + sl[i] * width_);
          }
          for (std::int64_t i = 0; i < m; ++i) {
            if (i + kAhead < m) {
              prefetch_l2(link + sl[i + kAhead]);
              prefetch_l2(src + sl[i + kAhead] * width_);
            }
            const Link l = link[sl[i]];
            rows[2 * i] = l.obs;
            rows[2 * i + 1] = l.next;
            const float* row = src + sl[i] * width_;
            const std::int64_t k = c0 + i;
            for (std::int64_t j = 0; j < ad_; ++j) a[k * ad_ + j] = row[j];
            r[k] = row[ad_];
            t[k] = row[ad_ + 1];
            if (d) d[k] = row[ad_ + 2];
            if (tk) tk[k] = static_cast<std::int64_t>(row[task_col]);
          }
          // pass 2: the observation rows, each fetched by its first and last elements (its
          // at most two lines), 2 * kAhead rows ahead
          const std::int64_t count = 2 * m, ahead = 2 * kAhead;
          for (std::int64_t e = 0; e < std::min(ahead, count); ++e) {
            prefetch_l2(obs_src + rows[e] * od_);
            prefetch_l2(obs_src + rows[e] * od_ + od_ - 1);
          }
          for (std::int64_t e = 0; e < count; e += 2) {  // a transition's obs and next_obs
            if (e + ahead < count) {
              prefetch_l2(obs_src + rows[e + ahead] * od_);
              prefetch_l2(obs_src + rows[e + ahead] * od_ + od_ - 1);
              prefetch_l2(obs_src + rows[e + ahead + 1] * od_);
              prefetch_l2(obs_src + rows[e + ahead + 1] * od_ + od_ - 1);
            }
            const auto* ro = obs_src + rows[e] * od_;
            const auto* rn = obs_src + rows[e + 1] * od_;
            float* oi = o + (c0 + e / 2) * od_;
            float* ni = no + (c0 + e / 2) * od_;
            for (std::int64_t j = 0; j < od_; ++j) oi[j] = static_cast<float>(ro[j]);
            for (std::int64_t j = 0; j < od_; ++j) ni[j] = static_cast<float>(rn[j]);
          }
        }
      };
      switch (obs_dtype_) {
        case ObsDtype::float32: run(obs_.data_ptr<float>()); break;
        case ObsDtype::bfloat16: run(obs_.data_ptr<c10::BFloat16>()); break;
        case ObsDtype::float16: run(obs_.data_ptr<c10::Half>()); break;
      }
      b.action = discrete_ ? action.view({n}).to(at::kLong) : action;
    } else {
      return gather_indexed(slots);
    }
    b.index = ids(slots);
    return b;
  }

  /// `gather` by tensor indexing on the storage device: how a batch is drawn from storage
  /// on a GPU, where the rows never cross to the host (one host-to-device copy of 3n
  /// indices). On the CPU, the same batch as `gather`, as columns of the gathered rows.
  ReplayBatch gather_indexed(std::span<const std::int64_t> slots) const {
    const auto n = static_cast<std::int64_t>(slots.size());
    ReplayBatch b;
    {
      auto idx = at::empty({3 * n}, at::TensorOptions().dtype(at::kLong));
      auto* ip = idx.data_ptr<std::int64_t>();
      for (std::int64_t i = 0; i < n; ++i) {
        const auto s = static_cast<std::size_t>(slots[static_cast<std::size_t>(i)]);
        ip[i] = slots[static_cast<std::size_t>(i)];
        ip[n + i] = link_[s].obs;
        ip[2 * n + i] = link_[s].next;
      }
      const auto di = idx.to(device_, /*non_blocking=*/true);
      const auto rows = data_.index_select(0, di.narrow(0, 0, n));
      const auto both = obs_.index_select(0, di.narrow(0, n, 2 * n)).to(at::kFloat);
      b.obs = both.narrow(0, 0, n);
      b.next_obs = both.narrow(0, n, n);
      b.action = discrete_ ? rows.select(1, 0).to(at::kLong) : rows.narrow(1, 0, ad_);
      b.reward = rows.select(1, ad_);
      b.terminated = rows.select(1, ad_ + 1);
      if (with_discount_) b.discount = rows.select(1, ad_ + 2);
      if (tasks_ > 0) b.task = rows.select(1, ad_ + 2 + (with_discount_ ? 1 : 0)).to(at::kLong);
    }
    b.index = ids(slots);
    return b;
  }

  /// Writes the stored rows, links, counters and n-step windows.
  void save(BinaryWriter& w) const {
    w.value(capacity_);
    w.value(obs_capacity_);
    w.value(width_);
    w.value(od_);
    w.value(ad_);
    w.value<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_));
    w.value(added_);
    w.value(obs_added_);
    w.value(live_);
    w.value(dropped_);
    const auto rows = data_.narrow(0, 0, stored()).to(at::kCPU).contiguous();
    w.bytes(rows.data_ptr<float>(), static_cast<std::size_t>(rows.numel()) * sizeof(float));
    const auto obs = obs_.narrow(0, 0, obs_stored()).to(at::kCPU).contiguous();
    w.bytes(obs.data_ptr(), static_cast<std::size_t>(obs.numel() * obs.element_size()));
    w.bytes(link_.data(), static_cast<std::size_t>(stored()) * sizeof(Link));
    w.bytes(owner_of_.data(), static_cast<std::size_t>(obs_stored()) * sizeof(std::int32_t));
    w.value<std::uint64_t>(open_.size());
    w.bytes(open_.data(), open_.size() * sizeof(std::int64_t));
    w.bytes(open_obs_.data(), open_obs_.size() * sizeof(float));
    window_.save(w);
  }
  /// What `save` wrote, read and checked against this store's shape, not yet applied.
  struct Saved {
    at::Tensor rows, obs;
    std::int64_t added = 0, obs_added = 0, live = 0, dropped = 0;
    std::vector<Link> links;
    std::vector<std::int32_t> owner_of;
    std::vector<std::int64_t> open;
    std::vector<float> open_obs;
    NStepWindow::Saved window;
  };
  Saved read(BinaryReader& r) const {
    r.expect(capacity_, "buffer.capacity");
    r.expect(obs_capacity_, "observation ring size");
    r.expect(width_, "row width");
    r.expect(od_, "observation size");
    r.expect(ad_, "action size");
    r.expect<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_), "buffer.obs_dtype (0 float32, 1 bfloat16, 2 float16)");
    Saved s;
    s.added = r.value<std::int64_t>("transitions added");
    s.obs_added = r.value<std::int64_t>("observations added");
    s.live = r.value<std::int64_t>("transitions stored");
    s.dropped = r.value<std::int64_t>("transitions dropped");
    if (s.added < 0 || s.obs_added < 0 || s.live < 0 || s.dropped < 0)
      r.fail("transition counters", "are negative");
    const std::int64_t n = std::min(s.added, capacity_), m = std::min(s.obs_added, obs_capacity_);
    s.rows = at::empty({n, width_}, at::kFloat);
    r.bytes(s.rows.data_ptr<float>(), static_cast<std::size_t>(n * width_) * sizeof(float), "transitions");
    s.obs = at::empty({m, od_}, obs_.options().device(at::kCPU));
    r.bytes(s.obs.data_ptr(), static_cast<std::size_t>(m * od_ * s.obs.element_size()), "observations");
    auto ints = [&](std::vector<std::int32_t>& v, std::int64_t k, const char* what) {
      v.resize(static_cast<std::size_t>(k));
      r.bytes(v.data(), v.size() * sizeof(std::int32_t), what);
    };
    s.links.resize(static_cast<std::size_t>(n));
    r.bytes(s.links.data(), s.links.size() * sizeof(Link), "observation links");
    ints(s.owner_of, m, "observation owners");
    std::int64_t live = 0;
    for (const auto& l : s.links) {
      const auto a = l.obs, b = l.next;
      if (a < -1 || a >= m || b < -1 || b >= m || (a >= 0) != (b >= 0))
        r.fail("observation links", "point outside the stored observations");
      live += a >= 0;
    }
    if (live != s.live) r.fail("transitions stored", "does not match the observation links");
    for (auto t : s.owner_of)
      if (t < -1 || t >= n) r.fail("observation owners", "point outside the stored transitions");
    const auto envs = r.value<std::uint64_t>("env count");
    if (envs > (1u << 20)) r.fail("env count", "is implausibly large");
    s.open.resize(envs);
    r.bytes(s.open.data(), s.open.size() * sizeof(std::int64_t), "current observation ids");
    s.open_obs.resize(envs * static_cast<std::size_t>(od_));
    r.bytes(s.open_obs.data(), s.open_obs.size() * sizeof(float), "current observations");
    s.window = window_.read(r);
    return s;
  }
  void restore(Saved&& s) {
    data_.narrow(0, 0, s.rows.size(0)).copy_(s.rows);
    obs_.narrow(0, 0, s.obs.size(0)).copy_(s.obs);
    std::fill(link_.begin(), link_.end(), Link{});
    std::fill(owner_of_.begin(), owner_of_.end(), -1);
    std::copy(s.links.begin(), s.links.end(), link_.begin());
    std::copy(s.owner_of.begin(), s.owner_of.end(), owner_of_.begin());
    added_ = s.added;
    obs_added_ = s.obs_added;
    live_ = s.live;
    dropped_ = s.dropped;
    open_ = std::move(s.open);
    open_obs_ = std::move(s.open_obs);
    window_.restore(std::move(s.window));
    window_.resize(open_.size());
    if (tasks_ > 0) {  // each row's task, from the task column
      std::fill(task_of_.begin(), task_of_.end(), -1);
      std::fill(task_count_.begin(), task_count_.end(), 0);
      const std::int64_t col = ad_ + 2 + (with_discount_ ? 1 : 0);
      const auto rows = s.rows.contiguous();
      const float* p = rows.data_ptr<float>();
      for (std::int64_t k = 0; k < rows.size(0); ++k) {
        const auto tk = static_cast<std::int32_t>(p[k * width_ + col]);
        task_of_[static_cast<std::size_t>(k)] = tk;
        if (valid(k) && tk >= 0 && tk < tasks_) ++task_count_[static_cast<std::size_t>(tk)];
      }
    }
  }

  /// The id of the transition now in `slot` (slot < stored()).
  [[nodiscard]] std::int64_t id_of(std::int64_t slot) const noexcept { return lap().id(slot); }
  /// Whether transition `id` is still stored.
  [[nodiscard]] bool live(std::int64_t id) const noexcept {
    return id >= 0 && id < added_ && id + capacity_ >= added_ && valid(slot_of(id));
  }
  /// Whether row `slot` holds a stored transition.
  [[nodiscard]] bool valid(std::int64_t slot) const noexcept { return link_[static_cast<std::size_t>(slot)].obs >= 0; }
  [[nodiscard]] std::int64_t slot_of(std::int64_t id) const noexcept { return id % capacity_; }
  /// Rows of the transition ring written so far: samples are drawn from [0, stored()).
  [[nodiscard]] std::int64_t stored() const noexcept { return std::min(added_, capacity_); }
  /// Rows of older transitions that the last `add` dropped (see the class comment).
  [[nodiscard]] std::span<const std::int64_t> killed() const noexcept { return killed_; }

  /// Transitions stored now.
  [[nodiscard]] std::int64_t size() const noexcept { return live_; }
  /// The env's tasks (0: it has none), and the stored transitions of task `t` now.
  [[nodiscard]] std::int64_t tasks() const noexcept { return tasks_; }
  [[nodiscard]] std::int64_t task_count(std::int64_t t) const noexcept { return task_count_[static_cast<std::size_t>(t)]; }
  /// The task of the transition in row `slot` (-1: none).
  [[nodiscard]] std::int32_t task_of(std::int64_t slot) const noexcept {
    return tasks_ > 0 ? task_of_[static_cast<std::size_t>(slot)] : -1;
  }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t obs_capacity() const noexcept { return obs_capacity_; }
  [[nodiscard]] std::int64_t added() const noexcept { return added_; }
  /// Transitions that left before `capacity` newer ones arrived (see the class comment).
  [[nodiscard]] std::int64_t dropped() const noexcept { return dropped_; }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] const std::string& owner() const noexcept { return owner_; }
  void set_gamma(double gamma) noexcept { window_.set_gamma(gamma); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    return data_.numel() * static_cast<std::int64_t>(data_.element_size()) +
           obs_.numel() * static_cast<std::int64_t>(obs_.element_size()) +
           static_cast<std::int64_t>(link_.size() * sizeof(Link) + owner_of_.size() * sizeof(std::int32_t));
  }

 private:
  // `t`'s n * w values on the host as contiguous float32, or a clear error naming the field.
  at::Tensor host(const at::Tensor& t, std::int64_t n, std::int64_t w, const char* field) const {
    if (!t.defined() || t.numel() != n * w)
      throw Error(owner_ + ": StepBatch." + field + " has " + (t.defined() ? std::to_string(t.numel()) : "no") +
                  " values; expected " + std::to_string(n) + " envs x " + std::to_string(w));
    return host_as(t, at::kFloat);  // (only its data is read)
  }
  // The ids of the transitions in rows `slots`, as a host int64 tensor.
  at::Tensor ids(std::span<const std::int64_t> slots) const {
    auto t = at::empty({static_cast<std::int64_t>(slots.size())}, at::TensorOptions().dtype(at::kLong));
    auto* id = t.data_ptr<std::int64_t>();
    const Lap now = lap();  // (its division once for the batch)
    for (std::size_t i = 0; i < slots.size(); ++i) id[i] = now.id(slots[i]);
    return t;
  }
  // Where the ring is: the newest row, and the id stored in row 0 of this lap; `id` maps a
  // row to the id of the transition in it.
  struct Lap {
    std::int64_t newest_slot, base, capacity;
    [[nodiscard]] std::int64_t id(std::int64_t slot) const noexcept {
      return slot <= newest_slot ? base + slot : base - capacity + slot;
    }
  };
  [[nodiscard]] Lap lap() const noexcept {
    const std::int64_t newest_slot = (added_ - 1) % capacity_;
    return {newest_slot, added_ - 1 - newest_slot, capacity_};
  }
  [[nodiscard]] std::int64_t obs_stored() const noexcept { return std::min(obs_added_, obs_capacity_); }
  [[nodiscard]] bool obs_live(std::int64_t id) const noexcept { return id >= 0 && id + obs_capacity_ >= obs_added_; }

  // Appends one observation; a stored transition that still uses the row it overwrites
  // is dropped.
  std::int64_t append_obs(const float* o) {
    const std::int64_t id = obs_added_++;
    const auto slot = static_cast<std::int32_t>(id % obs_capacity_);
    const std::int32_t t = owner_of_[static_cast<std::size_t>(slot)];
    if (t >= 0 && link_[static_cast<std::size_t>(t)].obs == slot) {
      link_[static_cast<std::size_t>(t)] = Link{};
      if (tasks_ > 0) --task_count_[static_cast<std::size_t>(task_of_[static_cast<std::size_t>(t)])];
      --live_;
      ++dropped_;
      killed_.push_back(t);
    }
    owner_of_[static_cast<std::size_t>(slot)] = -1;
    obs_stage_.insert(obs_stage_.end(), o, o + od_);
    return id;
  }

  // Stores one transition of task `task` (-1: none) from observation `oid` to `nid`.
  void put(std::int64_t oid, std::int64_t nid, const float* action, float reward, float terminated, double discount,
           std::int32_t task) {
    const auto slot = static_cast<std::size_t>(added_ % capacity_);
    if (link_[slot].obs >= 0) {
      --live_;
      if (tasks_ > 0) --task_count_[static_cast<std::size_t>(task_of_[slot])];
    }
    if (tasks_ > 0) {
      task_of_[slot] = task;
      ++task_count_[static_cast<std::size_t>(task)];
    }
    link_[slot] = Link{static_cast<std::int32_t>(oid % obs_capacity_), static_cast<std::int32_t>(nid % obs_capacity_)};
    owner_of_[static_cast<std::size_t>(link_[slot].obs)] = static_cast<std::int32_t>(slot);
    row_stage_.insert(row_stage_.end(), action, action + ad_);
    row_stage_.push_back(reward);
    row_stage_.push_back(terminated);
    if (with_discount_) row_stage_.push_back(static_cast<float>(discount));
    if (tasks_ > 0) row_stage_.push_back(static_cast<float>(task));
    ++live_;
    ++added_;
  }

  // Copies the rows staged by this add into the rings (at most two pieces each: the ids
  // of one add are consecutive).
  void flush(std::int64_t first_obs, std::int64_t first_row) {
    auto copy_in = [](at::Tensor& ring, std::int64_t first, std::vector<float>& stage, std::int64_t w) {
      const auto k = static_cast<std::int64_t>(stage.size()) / w;
      const std::int64_t cap = ring.size(0);
      if (k == 0) return;
      // Only the last `cap` rows survive when more than `cap` were staged.
      const std::int64_t skip = std::max<std::int64_t>(0, k - cap);
      // A float32 ring on the host (the usual case, once per env step) takes a memcpy per
      // piece; other dtypes and devices go through LibTorch's copy.
      const bool raw = ring.is_cpu() && ring.scalar_type() == at::kFloat && ring.is_contiguous();
      const auto src = raw ? at::Tensor() : at::from_blob(stage.data() + skip * w, {k - skip, w}, at::kFloat);
      std::int64_t done = 0;
      while (done < k - skip) {
        const std::int64_t slot = (first + skip + done) % cap;
        const std::int64_t len = std::min(k - skip - done, cap - slot);
        if (raw)
          std::memcpy(ring.data_ptr<float>() + slot * w, stage.data() + (skip + done) * w,
                      static_cast<std::size_t>(len * w) * sizeof(float));
        else
          ring.narrow(0, slot, len).copy_(src.narrow(0, done, len));
        done += len;
      }
    };
    copy_in(obs_, first_obs, obs_stage_, od_);
    copy_in(data_, first_row, row_stage_, width_);
  }

  std::int64_t capacity_, obs_capacity_;
  c10::Device device_;
  std::string owner_;
  std::int64_t od_, ad_;
  bool discrete_, with_discount_;
  ObsDtype obs_dtype_;
  std::int64_t tasks_;             // the env's tasks (0: none)
  std::int64_t width_;             // columns of data_
  at::Tensor data_;                // [capacity, width]: action, reward, terminated (, discount) (, task)
  at::Tensor obs_;                 // [obs_capacity, obs_dim] in the storage dtype
  HugeArray<Link> link_;           // per transition row
  HugeArray<std::int32_t> owner_of_;  // per observation row: the transition row using it as obs
  HugeArray<std::int32_t> task_of_;   // per transition row: its task (envs with tasks)
  std::vector<std::int64_t> task_count_;  // per task: live transitions
  std::int64_t added_ = 0, obs_added_ = 0, live_ = 0, dropped_ = 0;
  std::vector<std::int64_t> open_;  // per env: id of the observation its last step led to
  std::vector<float> open_obs_;     // ... and that observation, to recognise it
  NStepWindow window_;
  std::vector<NStepWindow::Done> done_;
  std::vector<std::int64_t> killed_;
  std::vector<float> obs_stage_, row_stage_;
};

}  // namespace detail
}  // namespace anvil
// ---- end <anvil/buffers/detail/transition_store.hpp> ----

namespace anvil::detail {

/// The shared part of a replay buffer `Buffer` (CRTP; see file comment). `Buffer` names its
/// `file_format` and has the state protocol (save/read/restore with a BinaryWriter/Reader).
template <class Buffer>
class ReplayBase {
 public:
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = "buffer";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;
  using Step = StepBatch;

  /// The discount of n-step returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { store_.set_gamma(gamma); }
  /// The run's plan (the loop calls it before the run and after a resume): the discount.
  void plan(const StoragePlan& p) noexcept { set_discount(p.discount); }

  /// Writes the buffer to `path`, atomically: a crash mid-save leaves the previous file intact.
  void save(const std::filesystem::path& path) const { save_file(self(), path, Buffer::file_format); }
  /// Restores what `save(path)` wrote; the buffer's config must match. On any error the
  /// buffer is unchanged.
  void load(const std::filesystem::path& path) { read_file(self(), path, Buffer::file_format)(); }

  [[nodiscard]] std::int64_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return store_.capacity(); }
  /// Transitions stored since construction (including overwritten ones).
  [[nodiscard]] std::int64_t added() const noexcept { return store_.added(); }
  /// Transitions that left before `capacity` newer ones arrived, because the observation
  /// ring ran out (episodes under 4 steps, or observations that do not chain).
  [[nodiscard]] std::int64_t dropped() const noexcept { return store_.dropped(); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept { return store_.bytes(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return store_.device(); }

 protected:
  /// The store for `cfg` (a replay buffer's config), named `owner` in errors; `extra_host_bytes`
  /// is what the buffer adds on the host (counted in the memory check).
  template <class Config>
  ReplayBase(const EnvSpec& spec, const Config& cfg, const RunContext& ctx, std::string owner,
             std::int64_t extra_host_bytes = 0)
      : store_(spec, cfg.capacity, *cfg.storage == Storage::cpu ? c10::Device(c10::kCPU) : ctx.device, std::move(owner),
               cfg.n_step, cfg.obs_dtype, extra_host_bytes) {}

  /// Throws unless 1 <= n <= size().
  void check_batch(std::int64_t n) const {
    if (n < 1 || n > size())
      throw Error(store_.owner() + ": sample(" + std::to_string(n) + ") from a buffer holding " +
                  std::to_string(size()) + " transitions; the batch size must be between 1 and the size");
  }

  /// How many of a batch of `n` each task gets when sampling is balanced over tasks: the
  /// tasks that have transitions share `n` equally; the remainder goes one each to the
  /// tasks from `start` on (callers rotate it, so no task is favoured over many batches).
  [[nodiscard]] std::vector<std::int64_t> task_quotas(std::int64_t n, std::int64_t start) const {
    const std::int64_t t = store_.tasks();
    std::vector<std::int64_t> q(static_cast<std::size_t>(t), 0);
    std::int64_t present = 0;
    for (std::int64_t k = 0; k < t; ++k) present += store_.task_count(k) > 0 ? 1 : 0;
    if (present == 0) return q;
    std::int64_t extra = n % present;
    for (std::int64_t j = 0; j < t; ++j) {
      const std::int64_t k = (start + j) % t;
      if (store_.task_count(k) == 0) continue;
      q[static_cast<std::size_t>(k)] = n / present + (extra > 0 ? 1 : 0);
      if (extra > 0) --extra;
    }
    return q;
  }

  TransitionStore store_;

 private:
  [[nodiscard]] const Buffer& self() const noexcept { return static_cast<const Buffer&>(*this); }
  [[nodiscard]] Buffer& self() noexcept { return static_cast<Buffer&>(*this); }
};

}  // namespace anvil::detail
// ---- end <anvil/buffers/detail/replay_core.hpp> ----
// ---- begin <anvil/buffers/sum_tree.hpp> ----
/// @file
/// `PriorityTree`: the sum tree and min tree behind prioritized replay, built for batches.
///
/// A binary sum tree over a million leaves costs about 20 dependent cache misses per
/// sample. Here every node has 8 children that fill one 64-byte cache line (doubles), so a
/// descent is 7 levels deep and the top levels stay in cache; and a batch descends level
/// by level, all of its samples at once, prefetching each next line into the L2
/// (`prefetch_l2`), so the misses of one batch overlap instead of queueing. Sums are
/// recomputed from the 8 children after each change, never adjusted by differences, so
/// they do not drift over millions of updates.
///
/// With the misses overlapped, what is left is arithmetic on lines: a prefix sum of 8
/// children per sample and level in `find`, a sum and a minimum of 8 children per touched
/// node in `set`. On x86-64 CPUs with AVX-512 one line is one register, and these run as a
/// few shuffles and masked adds instead of some 40 scalar instructions. The project builds
/// for baseline x86-64, so the AVX-512 kernels carry their own target attribute and are
/// chosen once at run time (`__builtin_cpu_supports`); elsewhere portable scalar kernels
/// run. Both do the same floating-point operations in the same order (the order of the
/// vector shuffles, written out in `sum8` and `prefix8`), so they pick the same leaves and
/// store the same sums, bit for bit; the tests hold them to that. The rest is bookkeeping
/// kept small: ascending masses pass the top levels by counting, against running prefix
/// sums, how many nodes each has passed (compares only, 8 at a time, in 4 interleaved runs
/// so that the walks overlap); `set` drops repeated parents as they come (sorted children
/// give sorted parents) and sweeps whole levels once a level has no more nodes than the
/// batch touched. Light header.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <vector>


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANVIL_SUM_TREE_X86 1
#include <immintrin.h>
#endif

namespace anvil::detail {

/// The per-line arithmetic of `PriorityTree`, one set of kernels per instruction set.
namespace sum_tree {

inline constexpr std::int64_t kFanout = 8;
inline constexpr double kInf = std::numeric_limits<double>::infinity();
/// How many touched nodes ahead `set` fetches the lines it will write.
inline constexpr std::size_t kWriteAhead = 16;

/// The sum of one line, pairwise: the order in which the vector kernels add (halves of
/// halves). The prefix sums of `prefix8` end in this same value, so the sum a parent stores
/// and the last prefix its children give in `find` agree exactly.
inline double sum8(const double* x) noexcept {
  return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

/// Inclusive prefix sums of one line in three rounds of additions (pairs, then pairs of
/// pairs, then halves), the order of the vector kernel's three masked adds.
inline void prefix8(const double* x, double* p) noexcept {
  const double s01 = x[0] + x[1], s23 = x[2] + x[3], s45 = x[4] + x[5], s67 = x[6] + x[7];
  p[0] = x[0];
  p[1] = s01;
  p[2] = x[2] + s01;
  p[3] = s23 + s01;
  const double s456 = x[6] + s45, s4567 = s67 + s45;
  p[4] = x[4] + p[3];
  p[5] = s45 + p[3];
  p[6] = s456 + p[3];
  p[7] = s4567 + p[3];
}

/// One level of descents: sample k sits at node `node[k]` of the level above `s` with
/// `rest[k]` of mass left; it moves to the child whose prefix interval holds the rest.
/// `next` (the level below `s`, or null) gets the chosen lines prefetched.
using DescendFn = void (*)(const double* s, const double* next, std::size_t n, double* rest,
                           std::int64_t* node);
/// Recomputes the parents of the sorted nodes `list[0, n)` of the level below (sums from
/// `s`, minimums from `m`, or from the positive values of `s` at the leaves, where `m` is
/// null) into `s_up` and `m_up`; leaves the distinct parents, sorted, in `list` and returns
/// how many.
using RecomputeListFn = std::size_t (*)(const double* s, const double* m, std::int64_t* list,
                                        std::size_t n, double* s_up, double* m_up);
/// Recomputes every node in [0, nodes) of a level (see `RecomputeListFn`).
using RecomputeAllFn = void (*)(const double* s, const double* m, std::int64_t nodes,
                                double* s_up, double* m_up);
/// Running prefix sums over the `lines` lines of `s` into `p`: line i's `prefix8` plus the
/// sum of the lines before it (which is the previous line's last prefix).
using LevelPrefixFn = void (*)(const double* s, std::int64_t lines, double* p);

/// For each of the ascending `mass[0, n)`, how many of the ascending `before[0, last)` it has
/// reached (is >= to), into `count`. `before` holds at least 16 entries of +inf from `last`
/// on. Counting compares and never adds, so every kernel gives the same counts.
using MergeFn = void (*)(const double* before, std::int64_t last, const double* mass, std::size_t n,
                         std::int64_t* count);

struct Kernels {
  DescendFn descend;
  RecomputeListFn recompute_list[2];  ///< [0]: above the leaves, [1]: leaves (min of positive values)
  RecomputeAllFn recompute_all[2];
  LevelPrefixFn level_prefix;
  MergeFn merge;
};

// ---- portable scalar kernels -------------------------------------------------------------

inline void descend_scalar(const double* s, const double* next, std::size_t n, double* rest,
                           std::int64_t* node) {
  for (std::size_t k = 0; k < n; ++k) {
    // Branch-free: the child is the number of prefix sums r has reached (empty children
    // have the same prefix as the one before them, so they are passed over). Without
    // branches to mispredict, the CPU overlaps the descents of many samples.
    const double* child = s + node[k] * kFanout;
    const double r = rest[k];
    double p[kFanout];
    prefix8(child, p);
    std::int64_t c = 0;
    for (std::int64_t j = 0; j < kFanout - 1; ++j) c += r >= p[j];
    // round-off can leave r past the last non-empty child: step back to it (rare)
    while (c > 0 && child[c] <= 0.0) --c;
    const double d = r - (c > 0 ? p[c - 1] : 0.0);
    rest[k] = d > 0.0 ? d : 0.0;  // (not std::max: +0 for -0, as the vector kernel's maxsd)
    node[k] = node[k] * kFanout + c;
    if (next != nullptr) prefetch_l2(next + node[k] * kFanout);
  }
}

template <bool kLeaves>
inline void node_scalar(const double* s, const double* m, std::int64_t p, double* s_up, double* m_up) {
  const double* x = s + p * kFanout;
  double lo = kInf;
  for (std::int64_t c = 0; c < kFanout; ++c) {
    // at the leaves, empty (zero) ones do not count towards the minimum
    if constexpr (kLeaves) lo = std::min(lo, x[c] > 0.0 ? x[c] : kInf);
    else lo = std::min(lo, m[p * kFanout + c]);
  }
  s_up[p] = sum8(x);
  m_up[p] = lo;
}

template <bool kLeaves>
inline std::size_t recompute_list_scalar(const double* s, const double* m, std::int64_t* list,
                                         std::size_t n, double* s_up, double* m_up) {
  std::size_t out = 0;
  std::int64_t last = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kWriteAhead < n) prefetch_l2(m_up + (list[i + kWriteAhead] >> 3));  // (as the vector kernel)
    const std::int64_t p = list[i] >> 3;  // indices are >= 0
    if (p == last) continue;
    node_scalar<kLeaves>(s, m, p, s_up, m_up);
    list[out++] = last = p;
  }
  return out;
}

template <bool kLeaves>
inline void recompute_all_scalar(const double* s, const double* m, std::int64_t nodes, double* s_up,
                                 double* m_up) {
  for (std::int64_t p = 0; p < nodes; ++p) node_scalar<kLeaves>(s, m, p, s_up, m_up);
}

inline void level_prefix_scalar(const double* s, std::int64_t lines, double* p) {
  double carry = 0;
  for (std::int64_t i = 0; i < lines; ++i) {
    double q[kFanout];
    prefix8(s + i * kFanout, q);
    for (std::int64_t j = 0; j < kFanout; ++j) p[i * kFanout + j] = carry + q[j];
    carry = p[i * kFanout + kFanout - 1];
  }
}

inline void merge_scalar(const double* before, std::int64_t last, const double* mass, std::size_t n,
                         std::int64_t* count) {
  std::int64_t j = 0;
  for (std::size_t k = 0; k < n; ++k) {
    while (j < last && before[j] <= mass[k]) ++j;
    count[k] = j;
  }
}

inline constexpr Kernels kScalar{&descend_scalar,
                                 {&recompute_list_scalar<false>, &recompute_list_scalar<true>},
                                 {&recompute_all_scalar<false>, &recompute_all_scalar<true>},
                                 &level_prefix_scalar, &merge_scalar};

// ---- AVX-512 kernels ----------------------------------------------------------------------

#if defined(ANVIL_SUM_TREE_X86)
#define ANVIL_SUM_TREE_AVX512 __attribute__((target("avx512f,popcnt")))
// GCC 12 flags the undefined pass-through operand inside its own AVX-512 intrinsics
// (GCC bug 105593, fixed in 13): not ours to fix, and noise in every file that includes this.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// `prefix8` of the line in `x`: pairs (lanes 1, 3, 5, 7 add their left neighbour), pairs
/// of pairs (lanes 2, 3 and 6, 7 add lanes 1 and 5), halves (lanes 4-7 add lane 3).
ANVIL_SUM_TREE_AVX512 inline __m512d prefix8_avx512(__m512d x) noexcept {
  x = _mm512_mask_add_pd(x, 0xAA, x, _mm512_movedup_pd(x));
  x = _mm512_mask_add_pd(x, 0xCC, x, _mm512_permutex_pd(x, 0x55));
  return _mm512_mask_add_pd(x, 0xF0, x, _mm512_permutexvar_pd(_mm512_set1_epi64(3), x));
}

/// `sum8` of the line in every lane: neighbours, then pairs, then halves (addition
/// commutes exactly, so each lane holds the same pairwise sum).
ANVIL_SUM_TREE_AVX512 inline __m512d sum8_avx512(__m512d x) noexcept {
  x = _mm512_add_pd(x, _mm512_permute_pd(x, 0x55));
  x = _mm512_add_pd(x, _mm512_permutex_pd(x, 0x4E));
  return _mm512_add_pd(x, _mm512_shuffle_f64x2(x, x, 0x4E));
}

ANVIL_SUM_TREE_AVX512 inline __m512d min8_avx512(__m512d x) noexcept {
  x = _mm512_min_pd(x, _mm512_permute_pd(x, 0x55));
  x = _mm512_min_pd(x, _mm512_permutex_pd(x, 0x4E));
  return _mm512_min_pd(x, _mm512_shuffle_f64x2(x, x, 0x4E));
}

template <bool kPrefetch>
ANVIL_SUM_TREE_AVX512 inline void descend_avx512_impl(const double* s, const double* next, std::size_t n,
                                                       double* rest, std::int64_t* node) {
  const __m512i zero = _mm512_setzero_si512();
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t at = node[k] * kFanout;
    const __m512d x = _mm512_load_pd(s + at);
    const double r = rest[k];
    // the prefix before each child: (0, p0, ..., p6)
    const __m512d before = _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(prefix8_avx512(x)), zero, 7));
    // The prefix sums ascend (the children are >= 0), so the children r has reached are the
    // low bits of this mask and the child is the highest; only non-empty ones count, which
    // steps back over trailing empty children (or to child 0).
    const __mmask8 full = _mm512_cmp_pd_mask(x, _mm512_castsi512_pd(zero), _CMP_GT_OQ);
    const unsigned reach = _mm512_mask_cmp_pd_mask(full, before, _mm512_set1_pd(r), _CMP_LE_OQ);
    const auto c = static_cast<unsigned>(31 ^ __builtin_clz(reach | 1u));
    const double d = r - _mm512_cvtsd_f64(_mm512_permutexvar_pd(_mm512_set1_epi64(c), before));
    rest[k] = d > 0.0 ? d : 0.0;
    node[k] = at + c;
    if constexpr (kPrefetch) prefetch_l2(next + node[k] * kFanout);
  }
}

ANVIL_SUM_TREE_AVX512 inline void descend_avx512(const double* s, const double* next, std::size_t n,
                                                  double* rest, std::int64_t* node) {
  if (next != nullptr) descend_avx512_impl<true>(s, next, n, rest, node);
  else descend_avx512_impl<false>(s, next, n, rest, node);
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline void node_avx512(const double* s, const double* m, std::int64_t p, double* s_up,
                                              double* m_up) noexcept {
  const __m512d x = _mm512_load_pd(s + p * kFanout);
  __m512d lo;
  if constexpr (kLeaves) {
    lo = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GT_OQ), _mm512_set1_pd(kInf), x);
  } else {
    lo = _mm512_load_pd(m + p * kFanout);
  }
  s_up[p] = _mm512_cvtsd_f64(sum8_avx512(x));
  m_up[p] = _mm512_cvtsd_f64(min8_avx512(lo));
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline std::size_t recompute_list_avx512(const double* s, const double* m,
                                                               std::int64_t* list, std::size_t n,
                                                               double* s_up, double* m_up) {
  std::size_t out = 0;
  std::int64_t last = -1;
  for (std::size_t i = 0; i < n; ++i) {
    // the minimums above a batch's leaves are not on `find`'s path: fetch them ahead
    if (i + kWriteAhead < n) prefetch_l2(m_up + (list[i + kWriteAhead] >> 3));
    const std::int64_t p = list[i] >> 3;  // indices are >= 0
    if (p == last) continue;
    node_avx512<kLeaves>(s, m, p, s_up, m_up);
    list[out++] = last = p;
  }
  return out;
}

template <bool kLeaves>
ANVIL_SUM_TREE_AVX512 inline void recompute_all_avx512(const double* s, const double* m, std::int64_t nodes,
                                                       double* s_up, double* m_up) {
  for (std::int64_t p = 0; p < nodes; ++p) node_avx512<kLeaves>(s, m, p, s_up, m_up);
}

ANVIL_SUM_TREE_AVX512 inline void level_prefix_avx512(const double* s, std::int64_t lines, double* p) {
  __m512d carry = _mm512_setzero_pd();
  for (std::int64_t i = 0; i < lines; ++i) {
    const __m512d q = _mm512_add_pd(carry, prefix8_avx512(_mm512_load_pd(s + i * kFanout)));
    _mm512_storeu_pd(p + i * kFanout, q);
    carry = _mm512_permutexvar_pd(_mm512_set1_epi64(7), q);
  }
}

/// `merge_scalar`, 8 entries a compare, and the samples in 4 runs advanced in turn: one
/// walk is a chain of dependent loads and compares, and 4 of them overlap.
ANVIL_SUM_TREE_AVX512 inline void merge_avx512(const double* before, std::int64_t last, const double* mass,
                                                std::size_t n, std::int64_t* count) {
  constexpr std::size_t kRuns = 4;
  std::size_t start[kRuns + 1];
  std::int64_t j[kRuns];
  for (std::size_t run = 0; run <= kRuns; ++run) start[run] = run * n / kRuns;
  for (std::size_t run = 0; run < kRuns; ++run)
    j[run] = start[run] < n ? std::upper_bound(before, before + last, mass[start[run]]) - before : 0;
  const std::size_t len = start[1] - start[0] + 1;  // the runs differ by at most one
  for (std::size_t i = 0; i < len; ++i) {
    for (std::size_t run = 0; run < kRuns; ++run) {
      const std::size_t k = start[run] + i;
      if (k >= start[run + 1]) continue;
      const __m512d r = _mm512_set1_pd(mass[k]);
      std::int64_t at = j[run];
      unsigned step;
      do {  // the entries ascend: those reached are the low bits of the mask
        step = static_cast<unsigned>(__builtin_popcount(_mm512_cmp_pd_mask(_mm512_loadu_pd(before + at), r, _CMP_LE_OQ)));
        at += step;
      } while (step == 8 && at < last);
      count[k] = j[run] = std::min(at, last);
    }
  }
}

inline constexpr Kernels kAvx512{&descend_avx512,
                                 {&recompute_list_avx512<false>, &recompute_list_avx512<true>},
                                 {&recompute_all_avx512<false>, &recompute_all_avx512<true>},
                                 &level_prefix_avx512, &merge_avx512};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef ANVIL_SUM_TREE_AVX512
#endif

/// Set, trees built afterwards use the scalar kernels (the tests compare the two).
inline bool force_scalar = false;

/// The kernels for this CPU: checked once, at the first tree built.
inline const Kernels& kernels() {
#if defined(ANVIL_SUM_TREE_X86)
  if (simd::avx512() && !force_scalar) return kAvx512;
#endif
  return kScalar;
}

}  // namespace sum_tree

/// Sums and minimums over `capacity` non-negative priorities (see file comment).
class PriorityTree {
 public:
  static constexpr std::int64_t kFanout = sum_tree::kFanout;  ///< children per node: one cache line of doubles

  PriorityTree() = default;
  explicit PriorityTree(std::int64_t capacity)
      : capacity_(capacity), kernels_(&sum_tree::kernels()), width_(level_widths(capacity)) {
    for (std::int64_t w : width_) {  // each level starts on a cache line (and huge pages)
      sum_.emplace_back(static_cast<std::size_t>(w), 0.0);
      // The min tree shares the sum tree's leaves: its level 0 stays empty.
      min_.emplace_back(min_.empty() ? 0 : static_cast<std::size_t>(w), sum_tree::kInf);
    }
  }

  /// The bytes a tree of `capacity` leaves holds (sums and minimums), before it is built.
  [[nodiscard]] static std::int64_t bytes_for(std::int64_t capacity) {
    std::int64_t n = 0;
    const auto w = level_widths(capacity);
    for (std::size_t l = 0; l < w.size(); ++l) n += w[l] * (l == 0 ? 1 : 2);
    return n * static_cast<std::int64_t>(sizeof(double));
  }

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] double total() const noexcept { return line(sum_, sum_.size() - 1)[0]; }
  /// The smallest positive priority (+inf when there is none): the one that gives the
  /// largest importance weight among transitions that can be sampled.
  [[nodiscard]] double min() const noexcept { return line(min_, min_.size() - 1)[0]; }
  [[nodiscard]] double get(std::int64_t i) const noexcept { return line(sum_, 0)[i]; }

  /// Sets leaf `idx[k]` to `value[k]` for every k, then recomputes the ancestors once per
  /// touched node. Indices must be in [0, capacity) and values finite and >= 0 (the caller
  /// checks: the buffer names the offending entry).
  void set(std::span<const std::int64_t> idx, std::span<const double> value) {
    double* leaf = line(sum_, 0);
    touched_.assign(idx.begin(), idx.end());
    for (std::size_t k = 0; k < idx.size(); ++k) leaf[idx[k]] = value[k];
    // Sorted, a level's touched nodes give their parents sorted too, and repeats side by
    // side, dropped as they come. Batches from `find` come sorted already (stratified masses
    // ascend), so the sort is usually skipped.
    if (!std::is_sorted(touched_.begin(), touched_.end())) std::sort(touched_.begin(), touched_.end());
    std::size_t n = touched_.size();
    for (std::size_t level = 1; level < sum_.size(); ++level) {
      const double* s = line(sum_, level - 1);
      const double* m = level > 1 ? line(min_, level - 1) : nullptr;
      const std::int64_t nodes = width_[level - 1] / kFanout;  // the level's nodes that have children
      // With at least as many touched children as the level has nodes (the top levels, or
      // large batches), a sweep over all of them costs less than the list, here and above.
      if (static_cast<std::int64_t>(n) >= nodes) {
        for (; level < sum_.size(); ++level) {
          kernels_->recompute_all[level == 1](line(sum_, level - 1), level > 1 ? line(min_, level - 1) : nullptr,
                                              width_[level - 1] / kFanout, line(sum_, level), line(min_, level));
        }
        break;
      }
      n = kernels_->recompute_list[level == 1](s, m, touched_.data(), n, line(sum_, level), line(min_, level));
    }
  }

  /// For each `mass[k]` in [0, total()), the leaf whose prefix-sum interval holds it, into
  /// `out[k]`. All the batch's descents advance one level at a time (see file comment).
  void find(std::span<const double> mass, std::span<std::int64_t> out) {
    const std::size_t n = mass.size();
    rest_.assign(mass.begin(), mass.end());
    std::fill(out.begin(), out.end(), 0);
    std::size_t top = sum_.size() - 1;  // the level the descents start from
    // Ascending masses (stratified sampling gives them) pass the top levels in one merge:
    // a walk along the deepest level no wider than 4 nodes per sample, against its running
    // prefix sums, costs less than that many levels of descents.
    if (n >= 16 && std::is_sorted(mass.begin(), mass.end())) {
      std::size_t level = top;
      while (level > 1 && width_[level - 1] <= static_cast<std::int64_t>(4 * n)) --level;
      if (level < top) {
        top = level;
        const double* s = line(sum_, level);
        const std::int64_t w = width_[level];  // whole lines: only the root level is not
        prefix_.resize(static_cast<std::size_t>(w) + 16);
        kernels_->level_prefix(s, w / kFanout, prefix_.data());
        // the last node is never passed (round-off may leave masses at or past the total)
        std::fill(prefix_.begin() + (w - 1), prefix_.end(), sum_tree::kInf);
        const double* before = prefix_.data();  // before[j]: the sum of nodes 0..j
        kernels_->merge(before, w - 1, mass.data(), n, out.data());
        const double* next = line(sum_, level - 1);
        for (std::size_t k = 0; k < n; ++k) {
          std::int64_t c = out[k];
          while (c > 0 && s[c] <= 0.0) --c;  // round-off past the last non-empty node
          rest_[k] = std::max(mass[k] - (c > 0 ? before[c - 1] : 0.0), 0.0);
          out[k] = c;
          prefetch_l2(next + c * kFanout);
        }
      }
    }
    for (std::size_t level = top; level-- > 0;)
      kernels_->descend(line(sum_, level), level > 0 ? line(sum_, level - 1) : nullptr, n, rest_.data(), out.data());
  }

  /// Bytes held by the two trees.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = 0;
    for (const auto* tree : {&sum_, &min_})
      for (const auto& l : *tree) b += static_cast<std::int64_t>(l.size() * sizeof(double));
    return b;
  }

 private:
  // Level `l` of `tree` (64-byte aligned).
  // Each level's width, leaves first: whole cache lines per level, down to the root.
  static std::vector<std::int64_t> level_widths(std::int64_t capacity) {
    std::vector<std::int64_t> w;
    std::int64_t n = capacity;
    do {
      n = (n + kFanout - 1) / kFanout * kFanout;
      w.push_back(n);
      n /= kFanout;
    } while (w.back() > kFanout);
    w.push_back(1);  // the root
    return w;
  }
  static double* line(std::vector<HugeArray<double>>& tree, std::size_t l) noexcept { return tree[l].data(); }
  static const double* line(const std::vector<HugeArray<double>>& tree, std::size_t l) noexcept {
    return tree[l].data();
  }

  std::int64_t capacity_ = 0;
  const sum_tree::Kernels* kernels_ = &sum_tree::kScalar;
  std::vector<std::int64_t> width_;           // nodes per level, leaves first
  std::vector<HugeArray<double>> sum_, min_;  // level 0 = leaves; last = root
  std::vector<std::int64_t> touched_;
  std::vector<double> rest_, prefix_;
};

}  // namespace anvil::detail
// ---- end <anvil/buffers/sum_tree.hpp> ----

namespace anvil {

/// Buffer policy: a ring of transitions like `UniformBuffer`, sampled in proportion to
/// priority p = (|TD error| + eps)^alpha. New transitions enter at the largest priority
/// seen so far, so each is replayed at least about once. A batch of n is drawn stratified:
/// one transition from each of n equal slices of the total priority. Each comes with the
/// importance weight (p / p_min)^-beta, i.e. (N P(i))^-beta divided by the largest weight
/// any stored transition could get, with beta rising linearly to 1 over the run. The
/// Trainer feeds each update's TD errors back through `update_priorities`.
class PrioritizedBuffer : public detail::ReplayBase<PrioritizedBuffer> {
 public:
  /// The format tag of the files `save(path)` writes.
  static constexpr const char* file_format = "anvil PrioritizedBuffer v4";

  using Config = PrioritizedBufferConfig;

  PrioritizedBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : ReplayBase(spec, cfg, ctx, "PrioritizedBuffer", tree_bytes(spec, cfg)),
        cfg_(cfg),
        balance_(cfg.balance_tasks && spec.tasks.size() > 1),
        horizon_(cfg.beta_steps),
        rng_(ctx.seed_for(Stream::buffer)) {
    const std::size_t count = balance_ ? spec.tasks.size() : 1;
    allocating("PrioritizedBuffer's priority " + std::string(count > 1 ? "trees (one per task)" : "tree") +
                   " (buffer.capacity=" + std::to_string(*cfg.capacity) + ")",
               tree_bytes(spec, cfg), [&] {
                 for (std::size_t k = 0; k < count; ++k) trees_.emplace_back(cfg.capacity);
                 if (balance_) leaf_tree_.assign(static_cast<std::size_t>(*cfg.capacity), -1);
               });
  }

  /// Adds one step of N envs (row i = env i) at the largest priority so far.
  void add(const StepBatch& step) {
    const auto [first, n] = store_.add(step);
    if (!balance_) {
      slots_.resize(static_cast<std::size_t>(n));
      values_.assign(static_cast<std::size_t>(n), max_priority_);
      for (std::int64_t i = 0; i < n; ++i) slots_[static_cast<std::size_t>(i)] = store_.slot_of(first + i);
      trees_[0].set(slots_, values_);
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t s = store_.slot_of(first + i);
        set_leaf(s, tree_of(s), max_priority_);
      }
    }
    // Transitions that left early (their observation was overwritten) can no longer be drawn.
    for (auto k : store_.killed())
      if (!store_.valid(k)) set_leaf(k, holder(k), 0.0);
  }

  /// `n` transitions, one from each of n equal slices of the total priority, with their
  /// importance weights in `weight` and ids in `index`. With an env that has tasks and
  /// `balance_tasks`, each task that has transitions gets an equal share of the batch,
  /// drawn the same way from its own priorities (a tree per task); the importance weights
  /// then correct for the probability of the draw: a task's share times the transition's
  /// priority over its task's total.
  ReplayBatch sample(std::int64_t n) {
    check_batch(n);
    mass_.resize(static_cast<std::size_t>(n));
    sampled_.resize(static_cast<std::size_t>(n));
    // (P / P_min)^-beta = exp(-beta (log P - log P_min)), P the probability of the draw.
    priority_.resize(static_cast<std::size_t>(n));
    log_p_.resize(static_cast<std::size_t>(n));
    double log_p_min = INFINITY;
    auto draw = [&](std::size_t k, std::int64_t begin, std::int64_t q, double share) {
      auto& tree = trees_[k];
      const double total = tree.total(), slice = total / static_cast<double>(q), top = std::nextafter(total, 0.0);
      for (std::int64_t j = 0; j < q; ++j)
        mass_[static_cast<std::size_t>(begin + j)] = std::min((static_cast<double>(j) + rng_.uniform()) * slice, top);
      tree.find(std::span<const double>(mass_).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(q)),
                std::span<std::int64_t>(sampled_).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(q)));
      for (std::int64_t j = begin; j < begin + q; ++j)
        priority_[static_cast<std::size_t>(j)] = tree.get(sampled_[static_cast<std::size_t>(j)]);
      simd::log(log_p_.data() + begin, priority_.data() + begin, q);
      const double base = balance_ ? std::log(share) - std::log(total) : 0.0;  // (one tree: P ~ p)
      if (balance_)
        for (std::int64_t j = begin; j < begin + q; ++j) log_p_[static_cast<std::size_t>(j)] += base;
      log_p_min = std::min(log_p_min, base + std::log(tree.min()));
    };
    if (!balance_) {
      draw(0, 0, n, 1.0);
    } else {
      const auto quota = task_quotas(n, calls_++);
      std::int64_t begin = 0;
      for (std::size_t k = 0; k < quota.size(); ++k) {
        if (quota[k] == 0) continue;
        draw(k, begin, quota[k], static_cast<double>(quota[k]) / static_cast<double>(n));
        begin += quota[k];
      }
    }
    auto w = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    const double b = beta();
    for (std::int64_t k = 0; k < n; ++k)
      log_p_[static_cast<std::size_t>(k)] = -b * (log_p_[static_cast<std::size_t>(k)] - log_p_min);
    simd::exp(priority_.data(), log_p_.data(), n);  // (the priorities are no longer needed)
    auto* wp = w.data_ptr<float>();
    for (std::int64_t k = 0; k < n; ++k) wp[k] = static_cast<float>(priority_[static_cast<std::size_t>(k)]);
    auto batch = store_.gather(sampled_);
    batch.weight = store_.device().is_cpu() ? w : w.to(store_.device(), /*non_blocking=*/true);
    return batch;
  }
  /// Whether batches are balanced over tasks.
  [[nodiscard]] bool balances_tasks() const noexcept { return balance_; }

  /// Sets the priorities of transitions `index` (ids from `sample`) to
  /// (|td_error| + eps)^alpha. Ids of transitions overwritten since they were sampled are
  /// skipped. `td_error` must be finite; ids must come from this buffer.
  void update_priorities(const at::Tensor& index, const at::Tensor& td_error) {
    const double a = cfg_.alpha, eps = cfg_.eps;
    assign("update_priorities", "TD error", index, td_error, [&](const double* td, double* p, std::int64_t n) {
      log_p_.resize(static_cast<std::size_t>(n));
      for (std::int64_t k = 0; k < n; ++k) p[k] = std::abs(td[k]) + eps;
      simd::log(log_p_.data(), p, n);
      for (std::int64_t k = 0; k < n; ++k) log_p_[static_cast<std::size_t>(k)] *= a;
      simd::exp(p, log_p_.data(), n);
    });
  }

  /// Sets the sampling priorities of transitions `index` directly (no eps, no exponent).
  /// Priorities must be finite and >= 0.
  void set_priorities(const at::Tensor& index, const at::Tensor& priority) {
    assign("set_priorities", "priority", index, priority,
           [](const double* v, double* p, std::int64_t n) { std::copy(v, v + n, p); });
  }

  /// The importance-weight exponent now: `beta` rising linearly to 1 over the horizon.
  [[nodiscard]] double beta() const noexcept {
    if (horizon_ <= 0) return cfg_.beta;
    const double f = std::min(1.0, static_cast<double>(store_.added()) / static_cast<double>(horizon_));
    return cfg_.beta + (1.0 - cfg_.beta) * f;
  }
  /// The run's length in env steps, for the beta schedule when `beta_steps` is 0 (the
  /// Trainer calls this with train.steps).
  void set_horizon(std::int64_t env_steps) noexcept {
    if (*cfg_.beta_steps == 0) horizon_ = env_steps;
  }

  /// The priority of stored transition `id`.
  [[nodiscard]] double priority(std::int64_t id) const {
    if (!store_.live(id)) throw Error("PrioritizedBuffer::priority: id " + std::to_string(id) + " is not stored");
    const auto s = store_.slot_of(id);
    return trees_[holder(s)].get(s);
  }
  /// Sum of all stored priorities.
  [[nodiscard]] double total_priority() const noexcept {
    double sum = 0;
    for (const auto& t : trees_) sum += t.total();
    return sum;
  }
  /// Priority updates skipped because their transition had been overwritten.
  [[nodiscard]] std::int64_t stale_updates() const noexcept { return stale_; }

  /// The run's plan (the loop calls it before the run and after a resume): the discount of
  /// n-step returns, and the run's length for the beta schedule.
  void plan(const StoragePlan& p) noexcept {
    set_discount(p.discount);
    set_horizon(p.horizon);
  }

  /// State protocol (core/state.hpp): transitions, priorities, n-step windows, sampling state.
  using ReplayBase::save, ReplayBase::load;  // (the buffer file)
  void save(BinaryWriter& w) const {
    store_.save(w);
    w.value(rng_.state());
    w.value(max_priority_);
    w.value(stale_);
    w.value(horizon_);
    w.value(calls_);
    for (std::int64_t i = 0; i < store_.stored(); ++i) w.value(trees_[holder(i)].get(i));
  }
  struct Saved {
    detail::TransitionStore::Saved core;
    Rng::State rng{};
    double max_priority = 1.0;
    std::int64_t stale = 0, horizon = 0, calls = 0;
    std::vector<double> priorities;
  };
  /// Reads what `save` wrote, checked against this buffer's config; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{store_.read(r), {}, 1.0, 0, 0, 0, {}};
    s.rng = r.value<Rng::State>("sampling state");
    s.max_priority = r.value<double>("largest priority");
    s.stale = r.value<std::int64_t>("stale update count");
    s.horizon = r.value<std::int64_t>("beta horizon");
    s.calls = r.value<std::int64_t>("balanced batches drawn");
    s.priorities.resize(static_cast<std::size_t>(std::min(s.core.added, capacity())));
    r.bytes(s.priorities.data(), s.priorities.size() * sizeof(double), "priorities");
    for (double v : s.priorities)
      if (!std::isfinite(v) || v < 0) r.fail("priorities", "contain a negative or non-finite value");
    return s;
  }
  void restore(Saved&& s) {
    store_.restore(std::move(s.core));
    rng_.set_state(s.rng);
    max_priority_ = s.max_priority;
    stale_ = s.stale;
    horizon_ = s.horizon;
    calls_ = s.calls;
    for (auto& tree : trees_) tree = detail::PriorityTree(capacity());
    if (!balance_) {
      std::vector<std::int64_t> idx(s.priorities.size());
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i);
      trees_[0].set(idx, s.priorities);
      return;
    }
    std::fill(leaf_tree_.begin(), leaf_tree_.end(), -1);
    for (std::size_t i = 0; i < s.priorities.size(); ++i) {  // each leaf in its task's tree
      const auto slot = static_cast<std::int64_t>(i);
      const std::int32_t k = store_.task_of(slot);
      if (k >= 0) set_leaf(slot, static_cast<std::size_t>(k), s.priorities[i]);
    }
  }

  /// Bytes of preallocated storage, trees included.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = store_.bytes() + static_cast<std::int64_t>(leaf_tree_.size() * sizeof(std::int32_t));
    for (const auto& t : trees_) b += t.bytes();
    return b;
  }

 private:
  // The host memory of the priority trees (one per task when balancing) and their index.
  static std::int64_t tree_bytes(const EnvSpec& spec, const Config& cfg) {
    const bool per_task = cfg.balance_tasks && spec.tasks.size() > 1;
    const auto count = static_cast<std::int64_t>(per_task ? spec.tasks.size() : 1);
    return count * detail::PriorityTree::bytes_for(cfg.capacity) + (per_task ? *cfg.capacity * 4 : 0);
  }
  // The tree row `slot`'s transition belongs in (its task's when balancing), and the one its
  // leaf is in now.
  [[nodiscard]] std::size_t tree_of(std::int64_t slot) const noexcept {
    return balance_ ? static_cast<std::size_t>(store_.task_of(slot)) : 0;
  }
  [[nodiscard]] std::size_t holder(std::int64_t slot) const noexcept {
    if (!balance_) return 0;
    const std::int32_t k = leaf_tree_[static_cast<std::size_t>(slot)];
    return k < 0 ? 0 : static_cast<std::size_t>(k);
  }
  // Sets row `slot`'s priority in tree `k`, clearing its leaf in the tree it was in before.
  void set_leaf(std::int64_t slot, std::size_t k, double value) {
    const std::int64_t one[1] = {slot};
    if (balance_) {
      const std::int32_t was = leaf_tree_[static_cast<std::size_t>(slot)];
      if (was >= 0 && static_cast<std::size_t>(was) != k) {
        const double zero[1] = {0.0};
        trees_[static_cast<std::size_t>(was)].set(one, zero);
      }
      leaf_tree_[static_cast<std::size_t>(slot)] = static_cast<std::int32_t>(k);
    }
    const double v[1] = {value};
    trees_[k].set(one, v);
  }

  // Checks ids and values, maps the values to priorities all at once with `to_priorities`
  // (given values, priorities out, count: one vectorised pass; a non-finite value's result
  // is ignored and the value itself reported), and sets the live ones.
  template <class F>
  void assign(const char* fn, const char* what, const at::Tensor& index, const at::Tensor& values,
              F to_priorities) {
    const std::string who = std::string("PrioritizedBuffer::") + fn + ": ";
    const auto idx = detail::host_as(index, at::kLong);
    const auto val = detail::host_as(values, values.scalar_type() == at::kFloat ? at::kFloat : at::kDouble);
    if (idx.numel() != val.numel())
      throw Error(who + std::to_string(idx.numel()) + " ids but " + std::to_string(val.numel()) + " " +
                  what + " values");
    const std::int64_t n = val.numel();
    given_.resize(static_cast<std::size_t>(n));
    if (val.scalar_type() == at::kFloat)
      std::copy(val.data_ptr<float>(), val.data_ptr<float>() + n, given_.begin());
    else
      std::copy(val.data_ptr<double>(), val.data_ptr<double>() + n, given_.begin());
    priority_.resize(static_cast<std::size_t>(n));
    to_priorities(given_.data(), priority_.data(), n);  // all at once (vectorised); checked below
    const auto* ip = idx.data_ptr<std::int64_t>();
    slots_.clear();
    values_.clear();
    for (std::int64_t k = 0; k < n; ++k) {
      const double v = given_[static_cast<std::size_t>(k)];
      const double p = std::isfinite(v) ? priority_[static_cast<std::size_t>(k)] : v;
      if (!std::isfinite(p) || p < 0)
        throw Error(who + what + " " + std::to_string(k) + " (id " + std::to_string(ip[k]) + ") is " +
                    std::to_string(v) + "; priorities must be finite and >= 0 (a NaN TD error "
                    "usually means the losses diverged)");
      if (ip[k] < 0 || ip[k] >= store_.added())
        throw Error(who + "id " + std::to_string(ip[k]) + " (entry " + std::to_string(k) +
                    ") is out of range: " + std::to_string(store_.added()) + " transitions were added");
      if (!store_.live(ip[k])) {  // overwritten since it was sampled
        ++stale_;
        continue;
      }
      slots_.push_back(store_.slot_of(ip[k]));
      values_.push_back(p);
      max_priority_ = std::max(max_priority_, p);
    }
    if (!balance_) {
      trees_[0].set(slots_, values_);
      return;
    }
    for (std::size_t k = 0; k < slots_.size(); ++k) set_leaf(slots_[k], tree_of(slots_[k]), values_[k]);
  }

  Config cfg_;
  bool balance_;
  std::vector<detail::PriorityTree> trees_;  // one, or one per task when balancing
  std::vector<std::int32_t> leaf_tree_;     // per row, when balancing: the tree its leaf is in (-1: none)
  std::int64_t horizon_;
  Rng rng_;
  std::int64_t calls_ = 0;  // balanced batches drawn (which task gets the remainder rotates)
  double max_priority_ = 1.0;
  std::int64_t stale_ = 0;
  std::vector<std::int64_t> slots_, sampled_;
  std::vector<double> values_, mass_;
  std::vector<double> priority_, log_p_, given_;  // scratch of sample and assign
};

static_assert(PrioritizedReplay<PrioritizedBuffer>);

}  // namespace anvil
// ---- end <anvil/buffers/prioritized_buffer.hpp> ----
// ---- begin <anvil/buffers/rollout_buffer.hpp> ----
/// @file
/// `RolloutBuffer`: the storage of an on-policy algorithm (PPO). It holds one rollout of
/// `rollout.steps` steps of N envs in tensors allocated once, computes generalised
/// advantage estimates (Schulman, Moritz, Levine, Jordan, Abbeel 2016, "High-Dimensional
/// Continuous Control Using Generalized Advantage Estimation") and the value targets, then
/// hands the rollout out in shuffled minibatches, once per epoch. It is cleared for the
/// next rollout, so no transition is learned from by a policy other than the one that
/// collected it (and the epochs right after).
///
/// Episode ends are told apart, as in the replay buffers: where an episode *terminated*
/// the return ends (no bootstrap); where it was *truncated* by a time limit the return
/// continues past the cut as the value of the episode's true last state, which the
/// collector passes as `bootstrap_value`. Either way the advantage does not run on into
/// the next episode, which the vectorised env has already started in that row.

#include <ATen/ATen.h>

#include <range/v3/view/chunk.hpp>
#include <range/v3/view/transform.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ranges>
#include <string>
#include <vector>


namespace anvil {

/// Buffer policy for on-policy algorithms (see file comment).
class RolloutBuffer {
 public:
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = "rollout";
  static constexpr bool on_policy = true;
  using Batch = RolloutBatch;
  using Step = RolloutStep;

  using Config = RolloutBufferConfig;

  RolloutBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), obs_dim_(spec.obs_dim()), act_dim_(spec.action_dim()),
        discrete_(spec.discrete()) {}

  /// Allocates storage for `n` envs (the Trainer calls it with env.num_envs).
  void set_num_envs(std::int64_t n) {
    if (n < 1) throw ConfigError("RolloutBuffer: needs at least one env, got " + std::to_string(n));
    envs_ = n;
    const std::int64_t t = cfg_.steps;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    // Refused before anything is allocated when it cannot fit (it is zeroed, so it is touched).
    const std::int64_t bytes = t * n * (obs_dim_ + (discrete_ ? 2 : act_dim_) + 8) * 4;
    const std::string field = "rollout.steps=" + std::to_string(t) + " x env.num_envs=" + std::to_string(n);
    check_fits(bytes, field, "RolloutBuffer's storage");
    allocating("RolloutBuffer's storage (" + field + ")", bytes, [&] {
      obs_ = at::zeros({t, n, obs_dim_}, f);
      action_ = discrete_ ? at::zeros({t, n}, f.dtype(at::kLong)) : at::zeros({t, n, act_dim_}, f);
      for (auto* x : {&log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_, &advantage_, &returns_})
        *x = at::zeros({t, n}, f);
    });
    clear();
  }
  /// The discount of the returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { gamma_ = gamma; }
  /// The run's plan (the loop calls it before the run and after a resume): storage for the
  /// envs (allocated when their number changes), the discount.
  void plan(const StoragePlan& p) {
    if (p.num_envs != envs_) set_num_envs(p.num_envs);
    set_discount(p.discount);
  }

  /// State protocol (core/state.hpp): the steps collected so far of the current rollout
  /// (none between rollouts, where the on-policy loop checkpoints).
  void save(BinaryWriter& w) const {
    w.value(envs_);
    w.value(steps_);
    for (const auto* t : {&obs_, &action_, &log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_})
      if (steps_ > 0) write_tensor(w, t->narrow(0, 0, steps_));
  }
  struct Saved {
    std::int64_t steps = 0;
    std::vector<at::Tensor> rows;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    r.expect(envs_, "env.num_envs");
    Saved s;
    s.steps = r.value<std::int64_t>("rollout steps");
    if (s.steps < 0 || s.steps > *cfg_.steps) r.fail("rollout steps", "are outside [0, rollout.steps]");
    if (s.steps > 0)
      for (const auto* t : {&obs_, &action_, &log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_})
        s.rows.push_back(read_tensor(r, "rollout rows", t->narrow(0, 0, s.steps)));
    return s;
  }
  void restore(const Saved& s) {
    clear();
    std::size_t i = 0;
    if (s.steps > 0)
      for (auto* t : {&obs_, &action_, &log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_})
        t->narrow(0, 0, s.steps).copy_(s.rows[i++]);
    steps_ = s.steps;
  }

  /// Stores one step of every env (row i = env i). Throws when the rollout is full.
  void add(const RolloutStep& s) {
    if (envs_ == 0) throw Error("RolloutBuffer::add: set_num_envs was not called");
    if (full()) throw Error("RolloutBuffer::add: the rollout holds " + std::to_string(*cfg_.steps) +
                            " steps already; learn from it and clear() it first");
    check_rows(s.obs, "obs");
    const std::int64_t t = steps_;
    obs_[t].copy_(s.obs);
    action_[t].copy_(discrete_ ? s.action.reshape({envs_}) : s.action);
    log_prob_[t].copy_(s.log_prob.reshape({envs_}));
    value_[t].copy_(s.value.reshape({envs_}));
    reward_[t].copy_(s.reward);
    terminated_[t].copy_(s.terminated);
    truncated_[t].copy_(s.truncated);
    if (s.bootstrap_value.defined()) bootstrap_[t].copy_(s.bootstrap_value.reshape({envs_}));
    else bootstrap_[t].zero_();
    ++steps_;
    ready_ = false;
  }

  /// Computes advantages and value targets once the rollout is full. `last_value` [N] is
  /// the value of the observations the envs show after the last step (the bootstrap of
  /// episodes still running).
  void finish(const at::Tensor& last_value) {
    if (!full()) throw Error("RolloutBuffer::finish: the rollout has " + std::to_string(steps_) + " of " +
                             std::to_string(*cfg_.steps) + " steps");
    const auto last = last_value.to(at::kCPU, at::kFloat).reshape({envs_}).contiguous();
    const float g = static_cast<float>(gamma_), gl = static_cast<float>(gamma_ * cfg_.gae_lambda);
    const std::int64_t n = envs_;
    const float *r = reward_.data_ptr<float>(), *v = value_.data_ptr<float>();
    const float *term = terminated_.data_ptr<float>(), *trunc = truncated_.data_ptr<float>();
    const float *boot = bootstrap_.data_ptr<float>(), *lv = last.data_ptr<float>();
    float *adv = advantage_.data_ptr<float>(), *ret = returns_.data_ptr<float>();
    // Backwards through time: A_t = delta_t + gamma lambda A_{t+1} within an episode.
    for (const std::int64_t t : std::views::iota(std::int64_t{0}, steps_) | std::views::reverse) {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t k = t * n + i;
        const float next_value = t + 1 < steps_ ? v[k + n] : lv[i];
        const float later = t + 1 < steps_ ? adv[k + n] : 0.0f;
        float a;
        if (term[k] > 0) a = r[k] - v[k];                             // the return ends here
        else if (trunc[k] > 0) a = r[k] + g * boot[k] - v[k];         // cut: bootstrap, stop
        else a = r[k] + g * next_value - v[k] + gl * later;           // the episode goes on
        adv[k] = a;
        ret[k] = a + v[k];
      }
    }
    // The learning rows, flattened to [steps * N] and on the algorithm's device once.
    const std::int64_t m = steps_ * n;
    flat_.obs = obs_.view({m, obs_dim_}).to(device_);
    flat_.action = (discrete_ ? action_.view({m}) : action_.view({m, act_dim_})).to(device_);
    flat_.log_prob = log_prob_.view({m}).to(device_);
    flat_.value = value_.view({m}).to(device_);
    flat_.advantage = advantage_.view({m}).to(device_);
    flat_.returns = returns_.view({m}).to(device_);
    ready_ = true;
  }

  /// One epoch of the finished rollout: its rows in a fresh random order (torch's
  /// generator, which checkpoints save), cut into minibatches of `size` rows (the last may
  /// be smaller). A lazy view: each minibatch is gathered when it is reached.
  [[nodiscard]] auto minibatches(std::int64_t size) const {
    if (!ready_) throw Error("RolloutBuffer::minibatches: call finish() on a full rollout first");
    if (size < 1) throw ConfigError("RolloutBuffer: minibatch size must be at least 1, got " + std::to_string(size));
    const std::int64_t m = flat_.obs.size(0);
    const auto perm = at::randperm(m, at::TensorOptions().dtype(at::kLong));
    auto order = std::make_shared<const std::vector<std::int64_t>>(perm.data_ptr<std::int64_t>(),
                                                                  perm.data_ptr<std::int64_t>() + m);
    // The shuffled row ids, in chunks of `size`, each gathered into a batch (the view keeps
    // the ids alive through the lambda's copy of `order`).
    return *order | ranges::views::chunk(size) | ranges::views::transform([this, order](const auto& ids) {
             auto index = at::from_blob(const_cast<std::int64_t*>(&*ranges::begin(ids)),
                                        {static_cast<std::int64_t>(ranges::distance(ids))}, at::kLong);
             return rows(index.to(device_));
           });
  }

  /// The rollout's rows `index` (int64 on the algorithm's device), advantages normalised
  /// when `rollout.normalize_advantage` is on and there are at least two rows.
  [[nodiscard]] RolloutBatch rows(const at::Tensor& index) const {
    RolloutBatch b{flat_.obs.index_select(0, index),      flat_.action.index_select(0, index),
                   flat_.log_prob.index_select(0, index), flat_.advantage.index_select(0, index),
                   flat_.returns.index_select(0, index),  flat_.value.index_select(0, index)};
    if (cfg_.normalize_advantage && index.numel() > 1)
      b.advantage = (b.advantage - b.advantage.mean()) / (b.advantage.std() + 1e-8);
    return b;
  }

  /// Empties the buffer for the next rollout (storage is kept).
  void clear() noexcept {
    steps_ = 0;
    ready_ = false;
  }

  /// Transitions held (steps x envs) and the most it holds.
  [[nodiscard]] std::int64_t size() const noexcept { return steps_ * envs_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return *cfg_.steps * envs_; }
  [[nodiscard]] bool full() const noexcept { return envs_ > 0 && steps_ == *cfg_.steps; }
  /// Whether `finish` has computed the advantages of the rollout held.
  [[nodiscard]] bool finished() const noexcept { return ready_; }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return envs_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

  /// [steps, N] advantages and value targets of the finished rollout (before any
  /// minibatch normalisation), and the values the policy estimated.
  [[nodiscard]] const at::Tensor& advantages() const noexcept { return advantage_; }
  [[nodiscard]] const at::Tensor& returns() const noexcept { return returns_; }
  [[nodiscard]] const at::Tensor& values() const noexcept { return value_; }

 private:
  void check_rows(const at::Tensor& t, const char* what) const {
    if (t.dim() < 1 || t.size(0) != envs_)
      throw Error(std::string("RolloutBuffer::add: ") + what + " has " + std::to_string(t.dim() ? t.size(0) : 0) +
                  " rows but the buffer was set up for " + std::to_string(envs_) + " envs");
  }

  Config cfg_;
  c10::Device device_;
  std::int64_t obs_dim_, act_dim_;
  bool discrete_;
  double gamma_ = 0.99;
  std::int64_t envs_ = 0, steps_ = 0;
  bool ready_ = false;
  at::Tensor obs_, action_, log_prob_, value_, reward_, terminated_, truncated_, bootstrap_, advantage_, returns_;
  RolloutBatch flat_;
};

static_assert(Buffer<RolloutBuffer>);

}  // namespace anvil
// ---- end <anvil/buffers/rollout_buffer.hpp> ----
// ---- begin <anvil/buffers/uniform_buffer.hpp> ----
/// @file
/// `UniformBuffer`: experience replay with uniform sampling (Lin 1992; Mnih et al. 2015).

#include <cstdint>
#include <utility>
#include <vector>


namespace anvil {

/// Buffer policy: a ring of `capacity` transitions in preallocated tensors, each
/// observation stored once (buffers/detail/transition_store.hpp). One call adds a whole
/// step of N envs; one call samples a batch; when full, new transitions overwrite the
/// oldest. Terminated and truncated are kept apart: only `terminated` stops bootstrapping.
class UniformBuffer : public detail::ReplayBase<UniformBuffer> {
 public:
  /// The format tag of the files `save(path)` writes.
  static constexpr const char* file_format = "anvil UniformBuffer v4";

  using Config = UniformBufferConfig;

  UniformBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : ReplayBase(spec, cfg, ctx, "UniformBuffer"),
        balance_(cfg.balance_tasks && spec.tasks.size() > 1),
        rng_(ctx.seed_for(Stream::buffer)) {}

  /// Adds one step of N envs (row i = env i). N may exceed the free space: the ring wraps.
  /// With n-step returns, what is stored is the transitions this step completes.
  void add(const StepBatch& s) { store_.add(s); }

  /// `n` transitions drawn uniformly with replacement; `index` holds their ids. With an env
  /// that has tasks and `balance_tasks`, each task that has transitions gets an equal share
  /// of the batch (see `ReplayCore::task_quotas`), drawn uniformly among its own; the batch
  /// lists them task by task.
  ReplayBatch sample(std::int64_t n) {
    check_batch(n);
    slots_.resize(static_cast<std::size_t>(n));
    const auto rows = static_cast<std::uint64_t>(store_.stored());
    const bool gaps = size() < store_.stored();  // rows of transitions that left early
    if (!balance_) {
      for (auto& s : slots_) {
        do s = static_cast<std::int64_t>(rng_.below(rows));
        while (gaps && !store_.valid(s));  // (rare) are drawn again
      }
      return store_.gather(slots_);
    }
    // Uniform draws kept while their task's quota is open: each task's share is a uniform
    // sample of its own transitions.
    const auto quota = task_quotas(n, calls_++);
    std::vector<std::int64_t> begin(quota.size() + 1, 0), filled(quota.size(), 0);
    for (std::size_t k = 0; k < quota.size(); ++k) begin[k + 1] = begin[k] + quota[k];
    for (std::int64_t got = 0; got < n;) {
      const auto s = static_cast<std::int64_t>(rng_.below(rows));
      if (gaps && !store_.valid(s)) continue;
      const auto k = static_cast<std::size_t>(store_.task_of(s));
      if (filled[k] == quota[k]) continue;
      slots_[static_cast<std::size_t>(begin[k] + filled[k]++)] = s;
      ++got;
    }
    return store_.gather(slots_);
  }
  /// Whether batches are balanced over tasks.
  [[nodiscard]] bool balances_tasks() const noexcept { return balance_; }

  /// State protocol (core/state.hpp): the transitions, n-step windows and sampling state.
  using ReplayBase::save, ReplayBase::load;  // (the buffer file)
  void save(BinaryWriter& w) const {
    store_.save(w);
    w.value(rng_.state());
    w.value(calls_);
  }
  struct Saved {
    detail::TransitionStore::Saved core;
    Rng::State rng{};
    std::int64_t calls = 0;
  };
  /// Reads what `save` wrote, checked against this buffer's config; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{store_.read(r), {}, 0};
    s.rng = r.value<Rng::State>("sampling state");
    s.calls = r.value<std::int64_t>("balanced batches drawn");
    return s;
  }
  void restore(Saved&& s) {
    store_.restore(std::move(s.core));
    rng_.set_state(s.rng);
    calls_ = s.calls;
  }

 private:
  bool balance_;
  Rng rng_;
  std::int64_t calls_ = 0;  // balanced batches drawn (which task gets the remainder rotates)
  std::vector<std::int64_t> slots_;
};

static_assert(ReplayBuffer<UniformBuffer>);

}  // namespace anvil
// ---- end <anvil/buffers/uniform_buffer.hpp> ----
// ---- begin <anvil/data/episode_stats.hpp> ----
/// @file
/// `EpisodeStats`: the returns of the episodes this rank's envs finished during training:
/// the most recent ones (for the running mean in logs and on the progress bar) and how many
/// finished since the ranks last added up their counts (`Clock::episodes`), and each
/// episode finished since the last log row (return, length, env step) for per-episode
/// logs. Light header.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <numeric>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// Training episodes' returns on this rank (see file comment).
class EpisodeStats {
 public:
  /// Returns kept for the running mean.
  static constexpr std::size_t kKept = 100;

  /// One finished episode, for per-episode logs.
  struct Episode {
    double episode_return = 0;
    std::int64_t length = 0;
    std::int64_t env_step = 0;  ///< the run's env steps when it ended
  };
  /// Episodes kept for per-episode logs between two log rows (the oldest go beyond it).
  static constexpr std::size_t kFreshKept = 10'000;

  /// Counts one finished episode of `length` steps that ended at env step `env_step`.
  void record(double episode_return, std::int64_t length = 0, std::int64_t env_step = 0) {
    recent_.push_back(episode_return);
    if (recent_.size() > kKept) recent_.pop_front();
    ++unfolded_;
    if (fresh_.size() < kFreshKept) fresh_.push_back({episode_return, length, env_step});
  }
  /// The episodes finished since the last call (per-episode logs), oldest first.
  std::vector<Episode> take_fresh() { return std::exchange(fresh_, {}); }

  /// The last (up to) `kKept` returns, oldest first.
  [[nodiscard]] const std::deque<double>& recent() const noexcept { return recent_; }
  /// How many of the last `k` returns there are, and their sum.
  [[nodiscard]] std::pair<std::size_t, double> last(std::size_t k) const {
    k = std::min(k, recent_.size());
    return {k, std::accumulate(recent_.end() - static_cast<std::ptrdiff_t>(k), recent_.end(), 0.0)};
  }
  /// Mean of the last `k` returns (NaN before the first episode ends).
  [[nodiscard]] double recent_mean(std::size_t k = 10) const {
    const auto [n, sum] = last(k);
    return n > 0 ? sum / static_cast<double>(n) : NAN;
  }
  /// Episodes finished since the last `take_unfolded`.
  [[nodiscard]] std::int64_t unfolded() const noexcept { return unfolded_; }
  /// Those episodes' count, and resets it (the caller adds it to the clock's total).
  std::int64_t take_unfolded() noexcept { return std::exchange(unfolded_, 0); }

  /// State protocol (core/state.hpp).
  void save(BinaryWriter& w) const {
    w.value(unfolded_);
    w.value(static_cast<std::uint64_t>(recent_.size()));
    for (double x : recent_) w.value(x);
  }
  struct Saved {
    std::int64_t unfolded = 0;
    std::deque<double> recent;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.unfolded = r.value<std::int64_t>("episodes since the last count");
    const auto n = r.value<std::uint64_t>("recent returns");
    if (n > kKept) r.fail("recent returns", "are more than the " + std::to_string(kKept) + " a run keeps");
    for (std::uint64_t i = 0; i < n; ++i) s.recent.push_back(r.value<double>("recent returns"));
    return s;
  }
  void restore(Saved s) {
    unfolded_ = s.unfolded;
    recent_ = std::move(s.recent);
  }

 private:
  std::deque<double> recent_;
  std::int64_t unfolded_ = 0;
  std::vector<Episode> fresh_;
};

}  // namespace anvil
// ---- end <anvil/data/episode_stats.hpp> ----
// ---- begin <anvil/data/step_collector.hpp> ----
/// @file
/// `StepCollector`: what stands between a loop and its envs. It owns the vectorised envs and
/// the observations they show now, maps the algorithm's actions to the env's units (and
/// draws the uniform random actions of the warm-up), steps the envs (at once, or started in
/// the background and landed later: `env.mode=async`), times the env phase, and keeps the
/// training episodes' returns. Not a template: one copy serves every Trainer type.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// The envs of one rank, as a loop collects from them (see file comment).
class StepCollector {
 public:
  /// Collects from `envs`, timing env steps into `times` (which must outlive it).
  StepCollector(std::unique_ptr<envs::VecEnvBase> envs, PhaseTimes& times)
      : envs_(std::move(envs)), times_(&times) {
    const auto& spec = envs_->spec();
    if (!spec.discrete()) {
      // Algorithms act in [-1, 1] per bounded dimension; unbounded ones pass through.
      const auto& box = std::get<Box>(spec.action);
      const auto d = spec.action_dim();
      scale_ = at::ones({d});
      offset_ = at::zeros({d});
      low_ = at::full({d}, -1.0);
      high_ = at::full({d}, 1.0);
      for (std::int64_t i = 0; i < d; ++i) {
        if (std::isfinite(box.low[static_cast<std::size_t>(i)]) && std::isfinite(box.high[static_cast<std::size_t>(i)])) {
          scale_[i] = 0.5 * (box.high[static_cast<std::size_t>(i)] - box.low[static_cast<std::size_t>(i)]);
          offset_[i] = 0.5 * (box.high[static_cast<std::size_t>(i)] + box.low[static_cast<std::size_t>(i)]);
        } else {
          low_[i] = -INFINITY;
          high_[i] = INFINITY;
        }
      }
    }
  }

  [[nodiscard]] const EnvSpec& spec() const noexcept { return envs_->spec(); }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return envs_->num_envs(); }
  [[nodiscard]] envs::VecEnvBase& envs() noexcept { return *envs_; }
  [[nodiscard]] const envs::VecEnvBase& envs() const noexcept { return *envs_; }
  /// The tasks of envs that have tasks (`VecEnvBase::groups()`); empty otherwise.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return envs_->groups(); }
  [[nodiscard]] EpisodeStats& episodes() noexcept { return stats_; }
  [[nodiscard]] const EpisodeStats& episodes() const noexcept { return stats_; }

  /// The observations to act on: those the last step left (the first of a new episode
  /// where one ended); the envs are reset the first time.
  [[nodiscard]] const at::Tensor& observations() {
    if (!obs_.defined()) obs_ = envs_->reset();
    return obs_;
  }

  /// The algorithm's actions as the env takes them: discrete indices as int64 on the CPU;
  /// continuous ones clipped to [-1, 1] and scaled to the bounds (unbounded dimensions as
  /// they are). The algorithm may keep the unclipped action.
  [[nodiscard]] at::Tensor to_env(const at::Tensor& a) const {
    if (spec().discrete()) return a.to(at::kCPU, at::kLong).reshape({-1});
    if (a.is_cpu() && a.scalar_type() == at::kFloat && a.is_contiguous() && a.dim() == 2 &&
        a.size(1) == scale_.size(0)) {
      // The usual case, once per env step: one allocation and a loop, no LibTorch ops.
      auto out = at::empty(a.sizes(), a.options());
      const float* in = a.data_ptr<float>();
      const float *lo = low_.data_ptr<float>(), *hi = high_.data_ptr<float>();
      const float *sc = scale_.data_ptr<float>(), *off = offset_.data_ptr<float>();
      float* o = out.data_ptr<float>();
      const std::int64_t n = a.size(0), d = a.size(1);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < d; ++j) {
          // max(min(x, high), low): NaN passes through, as with at::min and at::max
          const float x = in[i * d + j];
          const float c = std::isnan(x) ? x : std::max(std::min(x, hi[j]), lo[j]);
          o[i * d + j] = c * sc[j] + off[j];
        }
      return out;
    }
    const auto c = a.to(at::kCPU, at::kFloat);
    return at::max(at::min(c, high_), low_) * scale_ + offset_;
  }
  /// The env-unit scale and offset of continuous actions (for policy files); undefined
  /// for discrete ones.
  [[nodiscard]] const at::Tensor& action_scale() const noexcept { return scale_; }
  [[nodiscard]] const at::Tensor& action_offset() const noexcept { return offset_; }

  /// Actions drawn uniformly in the algorithm's units, one row per env (the warm-up before
  /// learning starts), from torch's generator.
  [[nodiscard]] at::Tensor random_actions() const {
    const auto n = num_envs();
    if (spec().discrete()) return at::randint(spec().num_actions(), {n}, at::kLong);
    return at::rand({n, spec().action_dim()}) * 2.0 - 1.0;
  }

  /// Steps every env with `actions` (the algorithm's units) and returns the step; the
  /// observations move on and finished episodes are counted (unless the caller counts them
  /// itself: `count_episodes` false). The step's tensors stay valid until the step after next.
  const envs::VecStep& step(const at::Tensor& actions, bool count_episodes = true) {
    launch(actions);
    return land(count_episodes);
  }

  /// Starts a step with `actions` without waiting for it: with `env.mode=async` the envs
  /// step in the background while the caller works (e.g. updates) until `land`.
  void launch(const at::Tensor& actions) {
    if (in_flight_) throw Error("StepCollector::launch: a step is already in flight; land() it first");
    ScopedPhase ph(*times_, Phase::env);
    if (!obs_.defined()) obs_ = envs_->reset();
    envs_->step_async(to_env(actions));
    in_flight_ = true;
  }
  /// Whether a launched step has not landed yet.
  [[nodiscard]] bool in_flight() const noexcept { return in_flight_; }
  /// Waits for the launched step and takes it in (as `step` does).
  const envs::VecStep& land(bool count_episodes = true) {
    if (!in_flight_) throw Error("StepCollector::land: no step in flight");
    const envs::VecStep* s = nullptr;
    {
      ScopedPhase ph(*times_, Phase::env);
      in_flight_ = false;
      s = &envs_->step_wait();
    }
    last_obs_ = obs_;
    obs_ = s->obs;
    if (count_episodes)
      for (const auto& e : s->ended) stats_.record(e.episode_return, e.length, env_step() + num_envs());
    return *s;
  }

  /// Every env starts a new episode now (the episodic loop's rounds); a step in flight
  /// lands first.
  void restart() {
    if (in_flight_) (void)land();
    obs_ = envs_->reset();
    last_obs_ = at::Tensor();
  }
  /// The observations the step that landed last was taken from (what a transition stores).
  [[nodiscard]] const at::Tensor& previous_observations() const noexcept { return last_obs_; }

  /// The run's env-step count (the clock's), which episodes are recorded with.
  void count_steps_from(const std::int64_t* env_steps) noexcept { env_steps_ = env_steps; }
  /// The run's env steps now (0 when no count was given).
  [[nodiscard]] std::int64_t env_step() const noexcept { return env_steps_ ? *env_steps_ : 0; }

  /// After the envs' state was restored (a resume): act on what they show now, or start
  /// new episodes when their state was not saved.
  void restored() {
    obs_ = envs_->observations();
    last_obs_ = at::Tensor();
  }

 private:
  std::unique_ptr<envs::VecEnvBase> envs_;
  PhaseTimes* times_;
  at::Tensor obs_, last_obs_;
  at::Tensor scale_, offset_, low_, high_;
  bool in_flight_ = false;
  EpisodeStats stats_;
  const std::int64_t* env_steps_ = nullptr;
};

}  // namespace anvil
// ---- end <anvil/data/step_collector.hpp> ----

// ---- begin <anvil/algorithms/collective_distillation.hpp> ----
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
/// accumulation, `train.ema_decay` and `DDP<N>` as every algorithm. Acting needs the env
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

// ---- begin <anvil/nn/collective_transformer.hpp> ----
/// @file
/// `CollectiveTransformer`: the collective network of collective distillation. A
/// Transformer encoder reads a short history of a task, H tokens of (state, action,
/// reward), and writes a task representation; a policy head (tanh-Gaussian, as SAC's actor)
/// and a twin Q head read [representation, state] (and the action, for Q).
///
/// The encoder is written here from linear layers and matrix products rather than with
/// LibTorch's `nn::TransformerEncoderLayer`, because in LibTorch 1.13's C++ API that layer
/// is post-norm only (no `norm_first`) and sequence-first, and under autocast its layer
/// norms and softmax would run in bfloat16 on the CPU; here the blocks are pre-norm (they
/// train without a learning-rate warm-up), batch-first, the norms and the softmax run in
/// float32 under autocast, and the same code runs on LibTorch 1.13 and 2.x.
///
/// A learned summary token is prepended to the history and the representation is its
/// output (a layer-normed [B, d_model]); it is always attended to, so an empty history
/// (the first step of an episode) gives the learned "no context yet" representation.
/// History tokens where `mask` is 0 (before the episode began) are not attended to.

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace anvil::nn {

class CollectiveTransformerImpl : public torch::nn::Cloneable<CollectiveTransformerImpl> {
 public:
  struct Config {
    Param<int, "d_model", "width of the tokens and the task representation", at_least(8)> d_model{64};
    Param<int, "heads", "attention heads (d_model must divide by it)", at_least(1)> heads{4};
    Param<int, "layers", "Transformer blocks", at_least(1)> layers{2};
    Param<int, "feedforward", "width of each block's feed-forward layer", at_least(1)> feedforward{128};
    Param<std::vector<int>, "hidden", "hidden widths of the policy and Q heads", at_least(1)> hidden{256, 256};
    Param<Activation, "activation", "hidden-layer activation of the heads"> activation{Activation::relu};
    Param<double, "log_std_min", "lower bound of the policy's log standard deviation"> log_std_min{-5.0};
    Param<double, "log_std_max", "upper bound of the policy's log standard deviation"> log_std_max{2.0};
  };

  /// For states of `obs_dim`, actions of `act_dim` and histories of `history` tokens.
  CollectiveTransformerImpl(std::int64_t obs_dim, std::int64_t act_dim, std::int64_t history, const Config& cfg)
      : od_(obs_dim), ad_(act_dim), h_(history), cfg_(cfg) {
    if (cfg.d_model % cfg.heads != 0)
      throw ConfigError("d_model (" + std::to_string(*cfg.d_model) + ") does not divide by heads (" + std::to_string(*cfg.heads) + ")");
    reset();
  }

  void reset() override {
    const std::int64_t d = cfg_.d_model;
    embed_ = register_module("embed", torch::nn::Linear(token_dim(), d));
    position_ = register_parameter("position", torch::randn({h_ + 1, d}) * 0.02);
    summary_ = register_parameter("summary", torch::randn({1, 1, d}) * 0.02);
    blocks_.clear();
    for (int l = 0; l < cfg_.layers; ++l) {
      Block b;
      const std::string p = "block" + std::to_string(l) + "_";
      b.norm1 = register_module(p + "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
      b.qkv = register_module(p + "qkv", torch::nn::Linear(d, 3 * d));
      b.out = register_module(p + "out", torch::nn::Linear(d, d));
      b.norm2 = register_module(p + "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
      b.ff1 = register_module(p + "ff1", torch::nn::Linear(d, cfg_.feedforward));
      b.ff2 = register_module(p + "ff2", torch::nn::Linear(cfg_.feedforward, d));
      blocks_.push_back(b);
    }
    final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    policy_ = register_module("policy", Mlp(d + od_, widths(cfg_.hidden), 2 * ad_, cfg_.activation));
    q1_ = register_module("q1", Mlp(d + od_ + ad_, widths(cfg_.hidden), 1, cfg_.activation));
    q2_ = register_module("q2", Mlp(d + od_ + ad_, widths(cfg_.hidden), 1, cfg_.activation));
    shift_ = register_buffer("obs_shift", torch::zeros({od_}));
    scale_ = register_buffer("obs_scale", torch::ones({od_}));
  }

  /// States are normalised as (s - shift) * scale before use (in the history tokens too):
  /// the dataset's ranges mapped onto [-1, 1] (see CollectiveDistillation::fit_normalizer).
  void set_normalizer(const at::Tensor& shift, const at::Tensor& scale) {
    torch::NoGradGuard no_grad;
    shift_.copy_(shift.reshape({od_}));
    scale_.copy_(scale.reshape({od_}));
  }
  [[nodiscard]] const at::Tensor& obs_shift() const noexcept { return shift_; }
  [[nodiscard]] const at::Tensor& obs_scale() const noexcept { return scale_; }

  /// The task representation [B, d_model] (float32) of histories `tokens` [B, H, od + ad + 1]
  /// with `mask` [B, H] (1: the token is part of the history).
  at::Tensor represent(const at::Tensor& tokens, const at::Tensor& mask) {
    const std::int64_t b = tokens.size(0), d = cfg_.d_model, heads = cfg_.heads, dh = d / heads;
    const auto t = at::cat({normalise(tokens.narrow(-1, 0, od_)), tokens.narrow(-1, od_, ad_ + 1)}, -1);
    auto x = at::cat({summary_.expand({b, 1, d}).to(t.scalar_type()), embed_->forward(t).to(t.scalar_type())}, 1);
    x = x + position_.to(x.scalar_type());
    // Keys that may be attended to: the summary and the history's valid tokens.
    const auto keep = at::cat({at::ones({b, 1}, mask.options()), mask}, 1).to(at::kFloat);
    const auto bias = ((1.0 - keep) * -1e9).view({b, 1, 1, h_ + 1});
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (auto& blk : blocks_) {
      auto qkv = blk.qkv->forward(norm(blk.norm1, x)).view({b, h_ + 1, 3, heads, dh}).permute({2, 0, 3, 1, 4});
      auto q = qkv[0], k = qkv[1], v = qkv[2];  // [B, heads, T, dh]
      auto att = (at::matmul(q, k.transpose(-2, -1)).to(at::kFloat) * scale + bias).softmax(-1);
      auto y = at::matmul(att.to(v.scalar_type()), v).permute({0, 2, 1, 3}).reshape({b, h_ + 1, d});
      x = x + blk.out->forward(y).to(x.scalar_type());
      x = x + blk.ff2->forward(at::gelu(blk.ff1->forward(norm(blk.norm2, x)))).to(x.scalar_type());
    }
    return norm(final_norm_, x.select(1, 0));
  }

  /// Mean and log standard deviation (squashed into [log_std_min, log_std_max]) of the
  /// pre-tanh Gaussian at `state` [B, od] for representation `rep`.
  std::pair<at::Tensor, at::Tensor> policy(const at::Tensor& rep, const at::Tensor& state) {
    auto out = policy_->forward(at::cat({rep.to(state.scalar_type()), normalise(state)}, -1));
    auto mean = out.narrow(-1, 0, ad_);
    auto raw = out.narrow(-1, ad_, ad_).tanh();
    const double lo = cfg_.log_std_min, hi = cfg_.log_std_max;
    return {mean, raw.mul(0.5 * (hi - lo)).add(0.5 * (hi + lo))};
  }
  /// Both Q estimates [B] of `action` at `state`.
  std::pair<at::Tensor, at::Tensor> q(const at::Tensor& rep, const at::Tensor& state, const at::Tensor& action) {
    auto in = at::cat({rep.to(state.scalar_type()), normalise(state), action.to(state.scalar_type())}, -1);
    return {q1_->forward(in).squeeze(-1), q2_->forward(in).squeeze(-1)};
  }

  /// The tanh-Gaussian log-density [B] of actions `action` in (-1, 1) under (mean, log_std).
  static at::Tensor log_prob(const at::Tensor& mean, const at::Tensor& log_std, const at::Tensor& action) {
    constexpr double kHalfLog2Pi = 0.91893853320467274178;
    const auto a = action.to(at::kFloat).clamp(-1.0 + 1e-6, 1.0 - 1e-6);
    const auto u = at::atanh(a);
    const auto m = mean.to(at::kFloat), ls = log_std.to(at::kFloat);
    const auto z = (u - m) * (-ls).exp();
    return (-0.5 * z.square() - ls - kHalfLog2Pi).sum(-1) - at::log1p(-a.square()).sum(-1);
  }

  [[nodiscard]] std::int64_t obs_dim() const noexcept { return od_; }
  [[nodiscard]] std::int64_t act_dim() const noexcept { return ad_; }
  [[nodiscard]] std::int64_t history() const noexcept { return h_; }
  [[nodiscard]] std::int64_t token_dim() const noexcept { return od_ + ad_ + 1; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  struct Block {
    torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
    torch::nn::Linear qkv{nullptr}, out{nullptr}, ff1{nullptr}, ff2{nullptr};
  };
  [[nodiscard]] at::Tensor normalise(const at::Tensor& s) const { return (s - shift_.to(s.scalar_type())) * scale_.to(s.scalar_type()); }
  // Layer norm in float32 (under autocast too); the result in float32.
  static at::Tensor norm(torch::nn::LayerNorm& ln, const at::Tensor& x) {
    const Float32Scope float32(x.device().type());
    return ln->forward(x.to(at::kFloat));
  }

  std::int64_t od_, ad_, h_;
  Config cfg_;
  torch::nn::Linear embed_{nullptr};
  at::Tensor position_, summary_, shift_, scale_;
  std::vector<Block> blocks_;
  torch::nn::LayerNorm final_norm_{nullptr};
  Mlp policy_{nullptr}, q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(CollectiveTransformer);

}  // namespace anvil::nn
// ---- end <anvil/nn/collective_transformer.hpp> ----
// ---- begin <anvil/algorithms/policy.hpp> ----
/// @file
/// `load_policy`: a trained policy without its trainer, for deployment. A run writes
/// `policy.bin` in its directory with every checkpoint: the actor's shape, its weights (the
/// averaged ones when `train.ema_decay` is on), the env's action bounds, and the observation
/// normaliser's statistics when the run normalised observations (`normalize.obs`). `load_policy`
/// rebuilds the actor from that file alone and acts deterministically in env units.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>


namespace anvil {

/// The format tag of policy files.
inline constexpr const char* kPolicyFormat = "anvil Policy v2";

/// A deterministic policy loaded from a policy file (see file comment).
class Policy {
 public:
  /// Actions for observations [B, obs_dim] (or [obs_dim]), in the env's units: the mean
  /// action squashed to [-1, 1], then scaled to the action bounds.
  [[nodiscard]] at::Tensor act(const at::Tensor& obs) const {
    torch::NoGradGuard no_grad;
    const bool single = obs.dim() == 1;
    auto o = obs.to(at::kFloat);
    if (single) o = o.unsqueeze(0);
    if (obs_mean_.defined()) o = ((o - obs_mean_) * obs_inv_std_).clamp(-obs_clip_, obs_clip_);
    nn::GaussianActor net = actor_;  // a handle to the same module (acting changes nothing)
    auto a = net->mode(o) * scale_ + offset_;
    return single ? a.squeeze(0) : a;
  }
  /// The network (for export or inspection).
  [[nodiscard]] const nn::GaussianActor& network() const noexcept { return actor_; }
  /// The env the policy was trained on.
  [[nodiscard]] const std::string& env_name() const noexcept { return env_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return obs_dim_; }
  [[nodiscard]] std::int64_t action_dim() const noexcept { return act_dim_; }

 private:
  friend Policy load_policy(const std::filesystem::path& path);
  nn::GaussianActor actor_{nullptr};
  at::Tensor scale_, offset_;
  at::Tensor obs_mean_, obs_inv_std_;  ///< the run's observation normaliser (undefined: none)
  double obs_clip_ = 0;
  std::string env_;
  std::int64_t obs_dim_ = 0, act_dim_ = 0;
};

/// What a policy file holds beside the network: the env's name and action bounds, and the
/// observation normaliser of a run that normalised observations.
struct PolicyFileParts {
  std::string env;
  at::Tensor action_scale, action_offset;  ///< [act_dim]: env units = squashed action * scale + offset
  at::Tensor obs_mean, obs_inv_std;        ///< [obs_dim] (undefined: the run did not normalise)
  double obs_clip = 0;
};

/// Writes a policy file (see file comment) atomically: `write_network` writes the network's
/// part (an algorithm's `save_policy`), which `load_policy` below reads back.
inline void write_policy(const std::filesystem::path& file, const PolicyFileParts& parts,
                         const std::function<void(BinaryWriter&)>& write_network) {
  BinaryWriter w(file, kPolicyFormat);
  w.string(parts.env);
  write_network(w);
  write_tensor(w, parts.action_scale);
  write_tensor(w, parts.action_offset);
  const bool normalised = parts.obs_mean.defined();
  w.value(normalised);  // the policy acts on observations normalised as in training
  if (normalised) {
    write_tensor(w, parts.obs_mean);
    write_tensor(w, parts.obs_inv_std);
    w.value(parts.obs_clip);
  }
  w.commit();
}

/// Reads a policy file written by a run (see file comment); a missing, truncated, corrupted
/// or foreign file gets an error naming it and the field at fault.
inline Policy load_policy(const std::filesystem::path& path) {
  BinaryReader r(path, kPolicyFormat);
  Policy p;
  p.env_ = r.string("env name");
  const auto kind = r.string("actor kind");
  if (kind != "GaussianActor") r.fail("actor kind", "'" + kind + "' is not one this build knows");
  p.obs_dim_ = r.value<std::int64_t>("observation size");
  p.act_dim_ = r.value<std::int64_t>("action size");
  if (p.obs_dim_ < 1 || p.act_dim_ < 1) r.fail("observation or action size", "is not positive");
  nn::GaussianActorImpl::Config cfg;
  const auto layers = r.value<std::uint64_t>("hidden layer count");
  if (layers < 1 || layers > 64) r.fail("hidden layer count", "is out of range");
  std::vector<int> hidden;
  for (std::uint64_t i = 0; i < layers; ++i) hidden.push_back(r.value<int>("hidden layer widths"));
  for (int h : hidden)
    if (h < 1 || h > (1 << 20)) r.fail("hidden layer widths", "contain a width out of range (1 to 1048576)");
  if (p.obs_dim_ > (1 << 24) || p.act_dim_ > (1 << 24)) r.fail("observation or action size", "is implausibly large");
  // The weights these sizes imply must be in the file before a network of them is built (a
  // flipped bit in a width must not allocate gigabytes).
  std::int64_t weights = 0, in = p.obs_dim_;
  for (int h : hidden) weights += in * h, in = h;
  weights += in * p.act_dim_;
  r.expect_available(weights * static_cast<std::int64_t>(sizeof(float)), "hidden layer widths");
  cfg.hidden = hidden;
  const int activation = r.value<int>("activation");
  if (activation < 0 || activation >= static_cast<int>(enum_names(nn::Activation{}).size()))
    r.fail("activation", "is not a known activation");
  cfg.activation = static_cast<nn::Activation>(activation);
  cfg.log_std_min = r.value<double>("log_std_min");
  cfg.log_std_max = r.value<double>("log_std_max");
  p.actor_ = nn::GaussianActor(p.obs_dim_, p.act_dim_, cfg);
  std::vector<at::Tensor> params = p.actor_->parameters();
  std::int64_t n = 0;
  for (const auto& t : params) n += t.numel();
  const auto flat = read_tensor(r, "actor parameters", at::empty({n}));
  const auto like = at::empty({p.act_dim_});
  p.scale_ = read_tensor(r, "action scale", like);
  p.offset_ = read_tensor(r, "action offset", like);
  if (r.value<bool>("observation normaliser flag")) {
    const auto obs_like = at::empty({p.obs_dim_});
    p.obs_mean_ = read_tensor(r, "observation mean", obs_like);
    p.obs_inv_std_ = read_tensor(r, "observation scale", obs_like);
    p.obs_clip_ = r.value<double>("observation clip");
    if (!(p.obs_clip_ > 0)) r.fail("observation clip", "is not positive");
  }
  r.finish();
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  for (auto& t : params) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
  p.actor_->eval();
  return p;
}

}  // namespace anvil
// ---- end <anvil/algorithms/policy.hpp> ----

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

  /// One optimizer step (micro-batches with gradient accumulation).
  UpdateInfo update(const CollectiveBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    Losses sum;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      CollectiveBatch rows;
      const CollectiveBatch& mb = whole ? b : (rows = rows_of(b, part.begin, part.rows));
      Losses l;
      auto g = ctx.gradient(loss(mb, ctx, l), opt_);
      if (whole) grad = std::move(g);
      else if (!grad.defined()) grad = g * part.share;
      else grad.add_(g, part.share);
      sum.total += part.share * l.total;
      sum.mean += part.share * l.mean;
      sum.log_std += part.share * l.log_std;
      sum.q += part.share * l.q;
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    ++updates_;
    UpdateInfo info;
    info.metrics = {{"loss", sum.total}, {"mean_mse", sum.mean}, {"log_std_mse", sum.log_std}, {"q_mse", sum.q}};
    return info;
  }

  /// The losses of a batch (see file comment); their floats in `out`.
  struct Losses {
    double total = 0, mean = 0, log_std = 0, q = 0;
  };
  at::Tensor loss(const CollectiveBatch& b, StepContext& ctx, Losses& out) {
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
    out = {total.item<double>(), lm.item<double>(), ls.item<double>(), lq.item<double>()};
    return total;
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
  Config cfg_;
  c10::Device device_;
  std::string env_;
  std::int64_t od_ = 0, ad_ = 0;
  nn::CollectiveTransformer net_{nullptr};
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  Ema ema_;
  bool normalised_ = false;
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
// ---- end <anvil/algorithms/collective_distillation.hpp> ----
// ---- begin <anvil/algorithms/collective_student.hpp> ----
/// @file
/// `CollectiveStudent`: the student of collective distillation, an online SAC whose reward
/// is shaped by the collective policy's likelihood of the student's own action:
///
///     r' = r + w(t) max(log pi_collective(a given history, s), shaping.min_log_prob)
///
/// with w(t) = shaping.weight for the run's first shaping.warmup env steps, then falling
/// linearly to 0 over the next shaping.decay env steps (and 0 after). The off-policy loop
/// asks for the shaped rewards of every step before storing it (`shaped_rewards`), so the
/// replay holds shaped rewards; episode returns and evaluations stay the env's own.
///
/// The env is seen through `envs::History<E>` (the collective needs the history); the SAC's
/// networks read only the state part of the observation. The collective comes from a
/// distillation run's policy.bin (`shaping.collective`), frozen; with `Staged<OfflineLoop,
/// OffPolicyLoop>` and `CollectiveReplay` it is distilled in the first stage
/// (`update(CollectiveBatch)`) and shapes the second.

#include <torch/utils.h>

#include <algorithm>
#include <limits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

// ---- begin <anvil/algorithms/sac.hpp> ----
/// @file
/// Soft Actor-Critic (Haarnoja, Zhou, Abbeel, Levine 2018, "Soft Actor-Critic: Off-Policy
/// Maximum Entropy Deep Reinforcement Learning with a Stochastic Actor"; with automatic
/// entropy tuning from Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and
/// Applications"). Defaults are the published hyperparameters: Adam at 3e-4, batch 256,
/// gamma 0.99, tau 0.005, 256x256 networks, target entropy -|A|.
///
/// With an env that has tasks (a multi-task suite; `EnvSpec::tasks`), the `tasks` section
/// gives each task its own learned temperature, picked by each transition's task in every
/// loss, with its own target entropy, and can weight each transition's losses by its
/// task's T * softmax(-log alpha) (Yang et al. 2020, "Multi-Task Reinforcement Learning with
/// Soft Modularization"; the Meta-World+ baselines' `use_task_weights`): the multi-task SAC
/// of Yu et al. 2019 (Meta-World) with disentangled temperatures. `MultiTaskSAC` is this
/// algorithm with those on by default, in its own config section (`mtsac`).

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

// ---- begin <anvil/algorithms/sac_config.hpp> ----
/// @file
/// SAC's config section (`sac`, or `mtsac` for multi-task SAC) and the names `SAC` and
/// `MultiTaskSAC`, apart from the algorithm (algorithms/sac.hpp), so a Trainer's config can
/// be built without torch (`anvil/compiled.hpp`). Light header.

#include <vector>


namespace anvil {

/// Soft Actor-Critic with swappable networks (algorithms/sac.hpp).
template <class Actor = nn::GaussianActor, class Critic = nn::TwinQ, bool kMultiTask = false>
class BasicSAC;

/// SAC with the default networks: tanh-Gaussian actor and twin-Q critic, 256x256 MLPs.
using SAC = BasicSAC<>;

/// Multi-task SAC with swappable networks: a temperature per task by default, in the
/// config section `mtsac` (see algorithms/sac.hpp).
template <class Actor = nn::GaussianActor, class Critic = nn::TwinQ>
using BasicMultiTaskSAC = BasicSAC<Actor, Critic, true>;
/// Multi-task SAC with the default networks.
using MultiTaskSAC = BasicMultiTaskSAC<>;

namespace detail {

template <bool kMultiTask>
inline constexpr auto sac_config_section = [] {
  if constexpr (kMultiTask) return FixedString("mtsac");
  else return FixedString("sac");
}();

/// SAC's settings for envs that have tasks (see algorithms/sac.hpp); `per_task` is the
/// default of `per_task_alpha` (on in MultiTaskSAC).
template <bool per_task>
struct SacTaskConfig {
  Param<bool, "per_task_alpha",
        "with an env that has tasks: a learned temperature per task, picked by each transition's task">
      per_task_alpha{per_task};
  Param<std::vector<double>, "target_entropy_scales",
        "one per task, in the env's task order: each task's target entropy is -scale * action_dim (empty: "
        "target_entropy_scale for every task; a negative scale asks for more entropy than a uniform action)">
      target_entropy_scales{};
  Param<bool, "loss_weights",
        "weight each transition's critic and actor losses by T * softmax(-log alpha) of its task (needs "
        "per_task_alpha): tasks whose temperature is still high weigh less">
      loss_weights{false};
};

}  // namespace detail

/// SAC's section: its hyperparameters and its networks' shapes (`ActorConfig`, `CriticConfig`).
template <class ActorConfig, class CriticConfig, bool kMultiTask>
struct SacConfig {
  Param<int, "batch_size", "transitions per gradient update", at_least(1)> batch_size{256};
  Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
  Param<double, "tau", "Polyak coefficient of the target networks", in_range(0, 1)> tau{0.005};
  Param<double, "actor_lr", "actor learning rate (Adam)", positive> actor_lr{3e-4};
  Param<double, "critic_lr", "critic learning rate (Adam)", positive> critic_lr{3e-4};
  Param<double, "alpha_lr", "entropy temperature learning rate (Adam)", positive> alpha_lr{3e-4};
  Param<double, "init_alpha", "initial entropy temperature", positive> init_alpha{1.0};
  Param<bool, "auto_alpha", "tune the temperature towards the target entropy"> auto_alpha{true};
  Param<double, "target_entropy_scale", "target entropy is -scale * action_dim", at_least(0)>
      target_entropy_scale{1.0};
  Param<int, "actor_update_freq", "update the actor and temperature every N updates", at_least(1)>
      actor_update_freq{1};
  Param<int, "target_update_freq", "Polyak-average the targets every N updates", at_least(1)>
      target_update_freq{1};
  Param<double, "max_grad_norm", "clip each gradient's global norm (0: off)", at_least(0)>
      max_grad_norm{0.0};
  Param<bool, "manual_backward",
        "hand-written gradients for the default networks in float32 on the CPU (false: "
        "autograd; same result, slower)">
      manual_backward{true};
  Param<bool, "cuda_graph",
        "on CUDA, capture the update as a CUDA graph and replay it: one launch instead of hundreds "
        "of dispatched ops (one process, one temperature, no loss scaling or gradient accumulation; "
        "false: op by op)">
      cuda_graph{true};
  Section<"actor", ActorConfig> actor;
  Section<"critic", CriticConfig> critic;
  Section<"tasks", detail::SacTaskConfig<kMultiTask>> tasks;
};

/// The default networks' SAC config, named without the algorithm's class.
template <bool kMultiTask>
struct policy_config<BasicSAC<nn::GaussianActor, nn::TwinQ, kMultiTask>> {
  using type = SacConfig<nn::GaussianActorConfig, nn::TwinQConfig, kMultiTask>;
  static constexpr auto section = detail::sac_config_section<kMultiTask>;
};

}  // namespace anvil
// ---- end <anvil/algorithms/sac_config.hpp> ----
// ---- begin <anvil/algorithms/sac_manual.hpp> ----
/// @file
/// SAC's CPU backend (`sac.manual_backward`): the critic part and the actor part of
/// algorithms/sac_parts.hpp with hand-written gradients over the default networks'
/// tapes (nn/manual_mlp.hpp, nn/gaussian_actor.hpp): the same arithmetic as autograd,
/// without its graph, into the flat gradients the optimizers read. Float32 on the CPU.

#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

// ---- begin <anvil/algorithms/sac_parts.hpp> ----
/// @file
/// SAC's update in parts, apart from the algorithm's class (algorithms/sac.hpp), the RLtools
/// way: the data each part gives back, and the generic operations (autograd, any networks,
/// any device): the critic part, the actor part and the temperature's gradient. The CPU
/// backend of the same parts is algorithms/sac_manual.hpp; the CUDA graph replays these
/// (optim/graphed_update.hpp). Each part reads the parameters as they were before the
/// update, so the critic's and the actor's parts are independent.

#include <torch/utils.h>

#include <concepts>
#include <cstdint>
#include <utility>


namespace anvil {

namespace detail {
template <class M>
using module_config_t = typename M::ContainedType::Config;
}  // namespace detail

/// What SAC needs of its actor: built from (obs_dim, act_dim, Config); `sample(obs, noise)`
/// gives a reparameterised action in [-1, 1] with its log-density from standard normal
/// noise [B, act_dim]; `mode(obs)` the deterministic action.
template <class Actor>
concept SquashedPolicyNetwork =
    requires { typename detail::module_config_t<Actor>; } &&
    std::constructible_from<Actor, std::int64_t, std::int64_t, const detail::module_config_t<Actor>&> &&
    requires(Actor& a, const at::Tensor& obs, const at::Tensor& noise) {
      { a->sample(obs, noise) } -> std::same_as<nn::PolicySample>;
      { a->mode(obs) } -> std::same_as<at::Tensor>;
      { a->clone() };
    };

/// What SAC needs of its critic: built from (obs_dim, act_dim, Config); `forward(obs, act)`
/// gives two independent Q estimates, each [B]; cloneable for its target copy.
template <class Critic>
concept TwinCriticNetwork =
    requires { typename detail::module_config_t<Critic>; } &&
    std::constructible_from<Critic, std::int64_t, std::int64_t, const detail::module_config_t<Critic>&> &&
    requires(Critic& c, const at::Tensor& obs, const at::Tensor& act) {
      { c->forward(obs, act) } -> std::same_as<std::pair<at::Tensor, at::Tensor>>;
      { c->clone() };
    };

namespace detail {

/// What the critic part gives back.
struct SacCriticResult {
  at::Tensor grad, td;  // flat critic gradient; per-sample |TD error| (mean of both Qs)
  double loss = 0, q_mean = 0;
  at::Tensor loss_t, q_mean_t;  // the same on the device (autograd path; a CUDA graph reads these)
};
/// What the actor part gives back (and the single temperature's gradient, when it learns).
struct SacActorResult {
  at::Tensor grad, alpha_grad;
  double loss = 0, entropy = 0, alpha_loss = 0;
  at::Tensor log_prob;  // per transition, when the caller computes the temperatures' gradient
  at::Tensor loss_t, entropy_t, alpha_loss_t;  // on the device (autograd path)
};

/// The temperature a part weighs log-densities by: one value, or a tensor (one per
/// transition, by its task; or a device scalar, which a CUDA graph reads at replay).
struct SacAlpha {
  double value = 0;
  at::Tensor row;
  [[nodiscard]] at::Tensor times(const at::Tensor& log_prob) const { return row.defined() ? row * log_prob : value * log_prob; }
};

/// The critic part by autograd: the soft Bellman target y = r + discount (1 - terminated)
/// (min target Q - alpha log pi), in float32 and without gradients; the critics' halved
/// squared errors, weighed by the batch's importance weights when it has them; their
/// gradient through `ctx` in `opt`'s flat layout. Host values only when not capturing.
template <class Actor, class Critic>
SacCriticResult autograd_critic(Actor& actor, Critic& critic, Critic& target_critic, const FlatAdam& opt, double gamma,
                                const ReplayBatch& b, const SacAlpha& alpha, const at::Tensor& noise_next,
                                StepContext& ctx) {
  at::Tensor target;
  {
    torch::NoGradGuard no_grad;
    auto guard = ctx.autocast();
    auto next = actor->sample(b.next_obs, noise_next);
    auto [tq1, tq2] = target_critic->forward(b.next_obs, next.action);
    const auto v = at::min(tq1, tq2).to(at::kFloat) - alpha.times(next.log_prob.to(at::kFloat));
    const auto discount = b.discount.defined() ? b.discount : at::full({}, gamma, v.options());
    target = b.reward + discount * (1.0 - b.terminated) * v;
  }
  auto guard = ctx.autocast();
  auto [q1, q2] = critic->forward(b.obs, b.action);
  auto e1 = q1.to(at::kFloat) - target, e2 = q2.to(at::kFloat) - target;
  auto per_sample = 0.5 * (e1.square() + e2.square());
  auto loss = b.weight.defined() ? (b.weight * per_sample).mean() : per_sample.mean();
  SacCriticResult r;
  r.grad = ctx.gradient(loss, opt);
  r.td = 0.5 * (e1.abs() + e2.abs()).detach();
  r.loss_t = loss.detach();
  r.q_mean_t = q1.detach().mean();
  if (!ctx.capturing()) {
    r.loss = r.loss_t.item().toDouble();
    r.q_mean = r.q_mean_t.item().toDouble();
  }
  return r;
}

/// The actor part by autograd: alpha log pi - min Q at reparameterised actions, weighed per
/// transition when `weight_row` is given; its gradient through `ctx` in `opt`'s layout. The
/// log-densities come back (detached, float32) for the temperature's gradient.
template <class Actor, class Critic>
SacActorResult autograd_actor(Actor& actor, Critic& critic, const FlatAdam& opt, const ReplayBatch& b,
                              const SacAlpha& alpha, const at::Tensor& noise, StepContext& ctx,
                              const at::Tensor& weight_row = {}) {
  auto guard = ctx.autocast();
  auto s = actor->sample(b.obs, noise);
  auto [q1, q2] = critic->forward(b.obs, s.action);
  auto log_prob = s.log_prob.to(at::kFloat);
  auto per_sample = alpha.times(log_prob) - at::min(q1, q2).to(at::kFloat);
  auto loss = weight_row.defined() ? (weight_row * per_sample).mean() : per_sample.mean();
  SacActorResult r;
  r.grad = ctx.gradient(loss, opt);
  r.loss_t = loss.detach();
  r.entropy_t = -log_prob.detach().mean();
  r.log_prob = log_prob.detach();
  if (!ctx.capturing()) {
    r.loss = r.loss_t.item().toDouble();
    r.entropy = r.entropy_t.item().toDouble();
  }
  return r;
}

/// The single temperature's part by autograd: the gradient of
/// -(log_alpha (log_prob + target_entropy)).mean() into `r`.
inline void autograd_temperature(SacActorResult& r, const at::Tensor& log_alpha, const FlatAdam& opt,
                                 double target_entropy, StepContext& ctx) {
  auto alpha_loss = -(log_alpha * (r.log_prob + target_entropy)).mean();
  r.alpha_grad = ctx.gradient(alpha_loss, opt);
  r.alpha_loss_t = alpha_loss.detach();
  if (!ctx.capturing()) r.alpha_loss = r.alpha_loss_t.item().toDouble();
}

/// Per task: the gradient of -(log_alpha[task_i] (log_prob_i + target_entropy[task_i])).mean()
/// with respect to each task's log_alpha, and that loss.
inline std::pair<at::Tensor, double> task_temperatures(const at::Tensor& log_alpha, const std::vector<double>& target_entropy,
                                                       const at::Tensor& log_prob, const at::Tensor& task) {
  torch::NoGradGuard no_grad;
  const auto dev = log_alpha.device();
  const auto lp = log_prob.to(dev, at::kFloat).reshape({-1});
  const auto tk = task.to(dev, at::kLong).reshape({-1});
  const auto ent = at::tensor(std::vector<float>(target_entropy.begin(), target_entropy.end()), at::TensorOptions().device(dev));
  const auto term = lp + ent.index_select(0, tk);  // log_prob_i + target_entropy[task_i]
  const double n = static_cast<double>(lp.numel());
  auto grad = at::zeros({log_alpha.numel()}, term.options()).index_add_(0, tk, -term) / n;
  const double loss = -(log_alpha.detach().index_select(0, tk) * term).sum().item<double>() / n;
  return {grad, loss};
}

}  // namespace detail
}  // namespace anvil
// ---- end <anvil/algorithms/sac_parts.hpp> ----

namespace anvil::detail {

/// Buffers of SAC's hand-written fast path (`manual_backward`): one set per part of the
/// update, so the critic part and the actor part can run at once (see nn/manual_mlp.hpp).
struct SacManual {
  SacManual(const FlatParameters& critic, const nn::TwinQ& q, const FlatParameters& actor,
            const nn::GaussianActor& pi)
      : critic_grad(critic.new_gradient()),
        q1_grads(critic.views_of(critic_grad, q->q1()->parameters())),
        q2_grads(critic.views_of(critic_grad, q->q2()->parameters())),
        actor_grad(actor.new_gradient()),
        actor_grads(actor.views_of(actor_grad, pi->net()->parameters())),
        alpha_grad(at::empty({1}, actor.flat().options())) {}
  at::Tensor critic_grad;
  std::vector<at::Tensor> q1_grads, q2_grads;
  at::Tensor actor_grad;
  std::vector<at::Tensor> actor_grads;
  at::Tensor alpha_grad;
  // critic part
  nn::GaussianActorTape next_tape;
  nn::MlpTape tq1, tq2, q1, q2;
  at::Tensor x_next, x, dq1, dq2;
  // actor part
  nn::GaussianActorTape actor_tape;
  nn::MlpTape aq1, aq2;
  at::Tensor xa, dqa1, dqa2, dx1, dx2, da, dlp;
  // act()
  nn::GaussianActorTape act_tape;
};

// Rows of [obs | action] for the critics: copies `obs` [B, od] into the first od columns of
// `x` [B, od + ad], (re)allocating x for the batch size.
inline void obs_into(at::Tensor& x, const at::Tensor& obs, std::int64_t ad) {
  const std::int64_t batch = obs.size(0), od = obs.size(1), w = od + ad;
  if (!x.defined() || x.size(0) != batch) x = at::empty({batch, w}, obs.options());
  const float* o = obs.data_ptr<float>();
  float* p = x.data_ptr<float>();
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t j = 0; j < od; ++j) p[i * w + j] = o[i * od + j];
}
inline void ensure(at::Tensor& t, std::initializer_list<std::int64_t> sizes, const at::Tensor& like) {
  if (!t.defined() || t.sizes() != at::IntArrayRef(sizes)) t = at::empty(sizes, like.options());
}
inline const float* opt_ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// SAC's critic part with hand-written gradients: the same arithmetic as autograd_critic.
inline SacCriticResult manual_critic(SacManual& m, const nn::GaussianActorImpl& actor,
                                   const nn::TwinQImpl& critic, const nn::TwinQImpl& target,
                                   const ReplayBatch& batch, double alpha, double gamma_,
                                   const at::Tensor& noise_next, const at::Tensor& alpha_row = {}) {
  torch::NoGradGuard no_grad;
  const auto obs = batch.obs.contiguous(), next_obs = batch.next_obs.contiguous();
  const auto action = batch.action.contiguous(), reward = batch.reward.contiguous();
  const auto terminated = batch.terminated.contiguous();
  const auto discount = batch.discount.defined() ? batch.discount.contiguous() : at::Tensor();
  const auto weight = batch.weight.defined() ? batch.weight.contiguous() : at::Tensor();
  const std::int64_t n = obs.size(0), od = obs.size(1), ad = actor.action_dim(), w = od + ad;

  obs_into(m.x_next, next_obs, ad);
  m.next_tape.sample(actor, next_obs, noise_next, m.x_next.data_ptr<float>() + od, w);
  const float* lp = m.next_tape.log_prob().data_ptr<float>();
  const float* tq1 = m.tq1.forward(*target.q1(), m.x_next).data_ptr<float>();
  const float* tq2 = m.tq2.forward(*target.q2(), m.x_next).data_ptr<float>();

  obs_into(m.x, obs, ad);
  {
    const float* a = action.data_ptr<float>();
    float* x = m.x.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < ad; ++j) x[i * w + od + j] = a[i * ad + j];
  }
  const float* q1 = m.q1.forward(*critic.q1(), m.x).data_ptr<float>();
  const float* q2 = m.q2.forward(*critic.q2(), m.x).data_ptr<float>();

  ensure(m.dq1, {n, 1}, obs);
  ensure(m.dq2, {n, 1}, obs);
  SacCriticResult r;
  r.td = at::empty({n}, obs.options());
  const float *rw = reward.data_ptr<float>(), *term = terminated.data_ptr<float>();
  const float *disc = opt_ptr(discount), *wt = opt_ptr(weight);
  const auto alpha_rows = alpha_row.defined() ? alpha_row.contiguous() : at::Tensor();
  const float* ar = opt_ptr(alpha_rows);  // per-transition temperatures (one per task), or none
  float *d1 = m.dq1.data_ptr<float>(), *d2 = m.dq2.data_ptr<float>(), *td = r.td.data_ptr<float>();
  const float gamma = static_cast<float>(gamma_), fa = static_cast<float>(alpha);
  const float inv_n = 1.0f / static_cast<float>(n);
  double loss = 0, q_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = std::min(tq1[i], tq2[i]) - (ar ? ar[i] : fa) * lp[i];
    const float y = rw[i] + (disc ? disc[i] : gamma) * (1.0f - term[i]) * v;
    const float e1 = q1[i] - y, e2 = q2[i] - y, wi = wt ? wt[i] : 1.0f;
    loss += static_cast<double>(wi * 0.5f * (e1 * e1 + e2 * e2));
    q_sum += q1[i];
    d1[i] = wi * e1 * inv_n;
    d2[i] = wi * e2 * inv_n;
    td[i] = 0.5f * (std::abs(e1) + std::abs(e2));
  }
  m.q1.backward(*critic.q1(), m.dq1, &m.q1_grads, nullptr);
  m.q2.backward(*critic.q2(), m.dq2, &m.q2_grads, nullptr);
  r.grad = m.critic_grad;
  r.loss = loss / static_cast<double>(n);
  r.q_mean = q_sum / static_cast<double>(n);
  return r;
}

// SAC's actor and temperature part with hand-written gradients (as autograd_actor). With
// `alpha_row` (per-transition temperatures) or `weight_row` (per-transition loss weights),
// the temperature's gradient is left to the caller (`log_prob` comes back).
inline SacActorResult manual_actor(SacManual& m, const nn::GaussianActorImpl& actor,
                                 const nn::TwinQImpl& critic, const ReplayBatch& batch,
                                 double alpha, bool auto_alpha, double target_entropy,
                                 const at::Tensor& noise, const at::Tensor& alpha_row = {},
                                 const at::Tensor& weight_row = {}) {
  torch::NoGradGuard no_grad;
  const auto obs = batch.obs.contiguous();
  const auto alpha_rows = alpha_row.defined() ? alpha_row.contiguous() : at::Tensor();
  const auto weight = weight_row.defined() ? weight_row.contiguous() : at::Tensor();
  const float *ar = opt_ptr(alpha_rows), *wt = opt_ptr(weight);
  const bool per_row = ar || wt;
  const std::int64_t n = obs.size(0), od = obs.size(1), ad = actor.action_dim(), w = od + ad;

  obs_into(m.xa, obs, ad);
  m.actor_tape.sample(actor, obs, noise, m.xa.data_ptr<float>() + od, w);
  const float* lp = m.actor_tape.log_prob().data_ptr<float>();
  const float* q1 = m.aq1.forward(*critic.q1(), m.xa).data_ptr<float>();
  const float* q2 = m.aq2.forward(*critic.q2(), m.xa).data_ptr<float>();

  ensure(m.dqa1, {n, 1}, obs);
  ensure(m.dqa2, {n, 1}, obs);
  float *d1 = m.dqa1.data_ptr<float>(), *d2 = m.dqa2.data_ptr<float>();
  const float fa = static_cast<float>(alpha), inv_n = 1.0f / static_cast<float>(n);
  if (per_row) ensure(m.dlp, {n}, obs);
  float* dlp = per_row ? m.dlp.data_ptr<float>() : nullptr;
  double loss = 0, lp_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    // d min(q1, q2) goes to the smaller one (ties: to both halves, as torch's minimum)
    const float qmin = std::min(q1[i], q2[i]);
    const float ai = ar ? ar[i] : fa, wi = wt ? wt[i] : 1.0f;
    loss += static_cast<double>(wi * (ai * lp[i] - qmin));
    lp_sum += lp[i];
    const float g1 = q1[i] < q2[i] ? 1.0f : q1[i] > q2[i] ? 0.0f : 0.5f;
    d1[i] = -g1 * wi * inv_n;
    d2[i] = -(1.0f - g1) * wi * inv_n;
    if (dlp) dlp[i] = ai * wi * inv_n;
  }
  ensure(m.dx1, {n, w}, obs);
  ensure(m.dx2, {n, w}, obs);
  m.aq1.backward(*critic.q1(), m.dqa1, nullptr, &m.dx1);
  m.aq2.backward(*critic.q2(), m.dqa2, nullptr, &m.dx2);
  ensure(m.da, {n, ad}, obs);
  {
    const float *x1 = m.dx1.data_ptr<float>(), *x2 = m.dx2.data_ptr<float>();
    float* da = m.da.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < ad; ++j) da[i * ad + j] = x1[i * w + od + j] + x2[i * w + od + j];
  }
  m.actor_tape.backward(actor, m.da, fa * inv_n, m.actor_grads, dlp);

  SacActorResult r;
  r.grad = m.actor_grad;
  const double mean_lp = lp_sum / static_cast<double>(n);
  r.loss = loss / static_cast<double>(n);
  r.entropy = -mean_lp;
  if (per_row) {
    r.log_prob = m.actor_tape.log_prob().clone();
  } else if (auto_alpha) {
    // d/dlog_alpha of -(log_alpha (log_prob + target_entropy)).mean()
    r.alpha_grad = m.alpha_grad;
    r.alpha_grad.data_ptr<float>()[0] = static_cast<float>(-(mean_lp + target_entropy));
    r.alpha_loss = -std::log(alpha) * (mean_lp + target_entropy);
  }
  return r;
}

}  // namespace anvil::detail
// ---- end <anvil/algorithms/sac_manual.hpp> ----
// ---- begin <anvil/optim/graphed_update.hpp> ----
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

// ---- begin <anvil/core/cuda_graph.hpp> ----
/// @file
/// `cuda::Graph`: a piece of device work captured once as a CUDA graph and replayed with one
/// launch. Small RL networks on a GPU are bound by the host: an autograd SAC update
/// dispatches about 1,100 ATen operators, each a few microseconds of host work and a kernel
/// launch of a few microseconds of GPU work, so the GPU idles (benchmarks/RESULTS.md, "On a
/// GPU"). A replay launches the same kernels from the GPU's side with no host work per
/// kernel.
///
/// What is captured must be device work alone: no host synchronisation (`item()`, a copy to
/// the host), no host value that changes between replays (read such values from device
/// tensors), and inputs and outputs in fixed tensors (copy new inputs in before a replay;
/// read or copy outputs before the next). Capture runs on a side stream after warm-ups on
/// that stream (cuBLAS workspaces, autograd's state and the caching allocator see the work
/// once first), with the capture mode local to the capturing thread, so other threads'
/// CUDA calls go on. Tensors made inside the capture live in the graph's private memory pool.
///
/// Captures only when `ANVIL_WITH_CUDA` is 1: CMake defines it when LibTorch has CUDA
/// (target torch_cuda), scripts/gpu-check.sh on its g++ line. Without it `kCudaGraphs` is
/// false and the class has the same interface but never captures (each call that would
/// says so), so callers compile one path and choose it at run time, with no `#if`.

#if defined(ANVIL_WITH_CUDA) && ANVIL_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <utility>
#endif

#include <c10/core/Device.h>


namespace anvil::cuda {

#if defined(ANVIL_WITH_CUDA) && ANVIL_WITH_CUDA
/// Whether this build can capture CUDA graphs.
inline constexpr bool kCudaGraphs = true;

/// One captured piece of device work (see file comment).
class Graph {
 public:
  /// A graph for work on CUDA device `device`, with a side stream of its own.
  explicit Graph(c10::Device device)
      : stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index() < 0
                                                                          ? c10::cuda::current_device()
                                                                          : device.index())) {}

  /// Runs `f` eagerly on the capture stream, the device idle before and after.
  template <class F>
  void warm_up(F&& f) {
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      std::forward<F>(f)();
    }
    c10::cuda::device_synchronize();
  }

  /// Captures the device work `f` enqueues (nothing runs: `replay` runs it). If `f` throws,
  /// the capture is ended and dropped, and the error passes on.
  template <class F>
  void capture(F&& f) {
    c10::cuda::device_synchronize();
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        std::forward<F>(f)();
      } catch (...) {
        try {
          graph_->capture_end();
        } catch (...) {  // the capture was already broken: the first error is the one to report
        }
        graph_.reset();
        throw;
      }
      graph_->capture_end();
    }
    c10::cuda::device_synchronize();
  }

  /// Runs the captured work on the current stream (after what is already queued there).
  void replay() { graph_->replay(); }
  [[nodiscard]] bool captured() const noexcept { return graph_ != nullptr; }

 private:
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
};
#else
inline constexpr bool kCudaGraphs = false;

/// Without CUDA: the interface above; callers check `kCudaGraphs` before using it.
class Graph {
 public:
  explicit Graph(c10::Device /*device*/) {}
  template <class F>
  void warm_up(F&& /*f*/) { unavailable(); }
  template <class F>
  void capture(F&& /*f*/) { unavailable(); }
  void replay() { unavailable(); }
  [[nodiscard]] bool captured() const noexcept { return false; }

 private:
  [[noreturn]] static void unavailable() {
    throw Error("CUDA graphs: this program was built without them (ANVIL_WITH_CUDA is not 1)");
  }
};
#endif

}  // namespace anvil::cuda
// ---- end <anvil/core/cuda_graph.hpp> ----

namespace anvil {

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
    const StepContext::Capture capture(ctx);
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      graph_.capture(std::forward<F>(f));
    } catch (const std::exception& e) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw Error(std::string(who) + ": capturing the update as a CUDA graph failed (" + e.what() + "); run with " +
                  std::string(who) + ".cuda_graph=false");
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
// ---- end <anvil/optim/graphed_update.hpp> ----

namespace anvil {

/// Algorithm policy: Soft Actor-Critic (see file comment) with swappable networks.
/// @tparam Actor  a `SquashedPolicyNetwork` (default: tanh-Gaussian MLP)
/// @tparam Critic a `TwinCriticNetwork` (default: two MLP Q-functions)
/// @tparam kMultiTask MultiTaskSAC: section `mtsac`, a temperature per task by default
template <class Actor, class Critic, bool kMultiTask>
class BasicSAC {
  static_assert(SquashedPolicyNetwork<Actor>,
                "BasicSAC<Actor, ...>: Actor must be a torch module holder built from "
                "(obs_dim, act_dim, Config) with sample(obs, noise) -> nn::PolicySample and "
                "mode(obs) -> Tensor; see nn::GaussianActor");
  static_assert(TwinCriticNetwork<Critic>,
                "BasicSAC<..., Critic>: Critic must be a torch module holder built from "
                "(obs_dim, act_dim, Config) with forward(obs, act) -> pair of Q tensors; see "
                "nn::TwinQ");

 public:
  using policy_kind = AlgorithmKind;
  static constexpr auto config_section = detail::sac_config_section<kMultiTask>;
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;

  using Config = SacConfig<detail::module_config_t<Actor>, detail::module_config_t<Critic>, kMultiTask>;

  BasicSAC(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device) {
    if (spec.discrete())
      throw ConfigError("SAC needs a continuous (Box) action space; " + spec.name +
                        " has discrete actions: use PPO");
    const auto& box = std::get<Box>(spec.action);
    for (std::size_t i = 0; i < box.size(); ++i)
      if (!std::isfinite(box.low[i]) || !std::isfinite(box.high[i]))
        throw ConfigError("SAC squashes actions into the action space's bounds, but " + spec.name +
                          "'s action " + std::to_string(i) + " is unbounded");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than " +
                        std::string(config_section.view()) + ".batch_size (" + std::to_string(*cfg.batch_size) +
                        "): micro-batches would be empty");
    const auto od = spec.obs_dim(), ad = spec.action_dim();
    act_dim_ = ad;
    actor_ = Actor(od, ad, *cfg.actor);
    critic_ = Critic(od, ad, *cfg.critic);
    critic_target_ = std::dynamic_pointer_cast<typename Critic::ContainedType>(critic_->clone());
    actor_->to(device_);
    critic_->to(device_);
    critic_target_->to(device_);
    for (auto& p : critic_target_->parameters()) p.set_requires_grad(false);
    // Temperatures: one, or one per task (tasks.per_task_alpha with an env that has tasks).
    const std::string sec(config_section.view());
    const auto& tc = *cfg.tasks;
    task_names_ = spec.tasks;
    const auto tasks = static_cast<std::int64_t>(task_names_.size());
    alphas_ = tc.per_task_alpha && tasks > 1 ? tasks : 1;
    if (tc.loss_weights && alphas_ == 1)
      throw ConfigError(sec + ".tasks.loss_weights weighs tasks by their temperatures: it needs " + sec +
                        ".tasks.per_task_alpha and an env with several tasks (" + spec.name + " has " +
                        std::to_string(std::max<std::int64_t>(tasks, 1)) + ")");
    task_weights_ = tc.loss_weights;
    const auto& scales = *tc.target_entropy_scales;
    if (!scales.empty() && static_cast<std::int64_t>(scales.size()) != alphas_)
      throw ConfigError(sec + ".tasks.target_entropy_scales has " + std::to_string(scales.size()) +
                        " values; it needs one per temperature (" + std::to_string(alphas_) +
                        (alphas_ > 1 ? ": one per task of " + spec.name + ")" : ")"));
    for (std::int64_t k = 0; k < alphas_; ++k)
      target_entropy_.push_back(-(scales.empty() ? *cfg.target_entropy_scale : scales[static_cast<std::size_t>(k)]) *
                                static_cast<double>(ad));
    log_alpha_ = torch::full({alphas_}, std::log(*cfg.init_alpha),
                             torch::TensorOptions().device(device_).requires_grad(true));
    // Each network's parameters move into one flat buffer: Adam, clipping, all-reduce and
    // the Polyak average become a handful of ops (see train/flat_adam.hpp).
    const double s = ctx.lr_scale(cfg.batch_size);
    actor_opt_ = FlatAdam(actor_->parameters(), {.lr = cfg.actor_lr * s});
    critic_opt_ = FlatAdam(critic_->parameters(), {.lr = cfg.critic_lr * s});
    alpha_opt_ = FlatAdam({log_alpha_}, {.lr = cfg.alpha_lr * s});
    target_ = FlatParameters(critic_target_->parameters());
    ema_.set_device(device_);
    if constexpr (kDefaultNetworks) {
      if (cfg.manual_backward && device_.is_cpu() && nn::GaussianActorTape::supports(*actor_) &&
          nn::MlpTape::supports(*critic_->q1()))
        manual_ = std::make_unique<detail::SacManual>(critic_opt_.parameters(), critic_,
                                                     actor_opt_.parameters(), actor_);
    }
  }

  /// Actions in [-1, 1] for a batch of observations: sampled to explore, or the mean.
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    auto o = obs.device() == device_ && obs.scalar_type() == at::kFloat ? obs : obs.to(device_, at::kFloat);
    if constexpr (kDefaultNetworks) {
      if (manual_) {
        o = o.contiguous();
        auto action = at::empty({o.size(0), act_dim_}, o.options());
        if (mode == ActMode::explore)
          manual_->act_tape.sample(*actor_, o, at::randn({o.size(0), act_dim_}, o.options()),
                                   action.data_ptr<float>(), act_dim_);
        else
          manual_->act_tape.mode(*actor_, o, action.data_ptr<float>(), act_dim_);
        return action;
      }
    }
    return mode == ActMode::explore
               ? actor_->sample(o, at::randn({o.size(0), act_dim_}, o.options())).action
               : actor_->mode(o);
  }

  /// One SAC update. The critic loss, the actor loss and the temperature loss are all
  /// computed from the parameters as they were before this update, as in the authors'
  /// reference implementation (which runs the three training ops in one session call); so
  /// the critic's and the actor's gradients are independent and `ctx` computes them at
  /// once when it has two threads, with the same result as one after another. Then the
  /// optimizers step, and (every target_update_freq updates) the target critic moves
  /// towards the critic by Polyak averaging. The actor and temperature update every
  /// actor_update_freq updates.
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    // Noise drawn here, in a fixed order, so the update is reproducible on any thread count.
    UpdateNoise noise;
    noise.next = at::randn({b.obs.size(0), act_dim_}, b.obs.options());
    if (updates_ % cfg_.actor_update_freq == 0) noise.obs = at::randn({b.obs.size(0), act_dim_}, b.obs.options());
    return update(b, ctx, noise);
  }

  /// The standard-normal draws of one update, one row per transition: for the actions
  /// at the next states and (on actor steps) at the current states.
  struct UpdateNoise {
    at::Tensor next, obs;
  };

  /// `update` with given noise: the same draws give the same update however the batch is
  /// split, e.g. across ranks (the data-parallel equivalence test uses this). On CUDA, with
  /// `cuda_graph` on and an update a graph can hold (one process, one temperature, no loss
  /// scaling or gradient accumulation), the update is replayed from a CUDA graph.
  UpdateInfo update(const ReplayBatch& batch, StepContext& ctx, const UpdateNoise& noise) {
    if (graphable(batch, ctx, noise)) return graphed_update(batch, ctx, noise);
    return eager_update(batch, ctx, noise);
  }

  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }

  /// The update as a CUDA graph holds it, run op by op on any device: device work alone
  /// (the temperature, the optimizers' step counts and learning rates read from tensors, no
  /// host read until the end), then the host's bookkeeping. The same update as `update`
  /// within float rounding; the tests check the two agree on the CPU, where no graph runs.
  UpdateInfo update_as_captured(const ReplayBatch& b, StepContext& ctx, const UpdateNoise& noise) {
    if (alphas_ != 1 || task_weights_ || !ctx.graphable())
      throw Error(std::string(config_section.view()) + ": a captured update holds one temperature, one process, no "
                  "loss scaling and no gradient accumulation");
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    const bool target_step = updates_ % cfg_.target_update_freq == 0;
    for (auto* o : {&actor_opt_, &critic_opt_, &alpha_opt_}) o->sync_device_state();
    at::Tensor td, metrics;
    {
      const StepContext::Capture capture(ctx);
      std::tie(td, metrics) = device_update(b, ctx, noise, actor_step, target_step);
    }
    return finish_device_update(actor_step, ctx, metric_names(actor_step), metrics, td);
  }

 private:
  // The update op by op (what `update` runs when no graph holds it).
  UpdateInfo eager_update(const ReplayBatch& batch, StepContext& ctx, const UpdateNoise& noise) {
    const bool per_task = alphas_ > 1;
    const double alpha = per_task ? 0.0 : alpha_values()[0];
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    const auto& noise_next = noise.next;
    const auto& noise_obs = noise.obs;
    // Per task: each transition's temperature, and its task's loss weight (the critic's
    // times PER's importance weight).
    at::Tensor alpha_row, task_w;
    ReplayBatch weighted;
    if (per_task) {
      if (!batch.task.defined())
        throw Error(std::string(config_section.view()) + ": the batch has no task ids, but the env has " +
                    std::to_string(alphas_) + " tasks (a replay buffer of this run stores them)");
      torch::NoGradGuard no_grad;
      const auto task = batch.task.to(log_alpha_.device(), at::kLong);
      const auto la = log_alpha_.detach();
      alpha_row = la.exp().index_select(0, task).to(batch.obs.device(), at::kFloat).contiguous();
      if (task_weights_) {
        weighted = batch;
        task_w = (at::softmax(-la, 0) * static_cast<double>(alphas_)).index_select(0, task).to(batch.obs.device(), at::kFloat);
        weighted.weight = batch.weight.defined() ? (batch.weight * task_w).contiguous() : task_w.contiguous();
      }
    }
    const ReplayBatch& b = task_weights_ ? weighted : batch;

    bool manual = false;
    if constexpr (kDefaultNetworks)
      manual = manual_ && !ctx.autocasts() && b.obs.device().is_cpu() && b.obs.scalar_type() == at::kFloat;

    detail::SacCriticResult critic;
    detail::SacActorResult actor;
    // Gradient accumulation: the batch in micro-batches, each gradient weighed by its share
    // of the batch, so the sum is the whole batch's gradient (losses are means).
    const auto parts = ctx.micro_batches(b.obs.size(0));
    std::vector<at::Tensor> td_parts;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      ReplayBatch rows;  // a micro-batch's rows; the whole batch is used as it is
      const ReplayBatch& mb = whole ? b : (rows = rows_of(b, part.begin, part.rows));
      const auto nn = whole ? noise_next : noise_next.narrow(0, part.begin, part.rows);
      const auto no = whole || !actor_step ? noise_obs : noise_obs.narrow(0, part.begin, part.rows);
      const auto ar = whole || !alpha_row.defined() ? alpha_row : alpha_row.narrow(0, part.begin, part.rows);
      const auto tw = whole || !task_w.defined() ? task_w : task_w.narrow(0, part.begin, part.rows);
      detail::SacCriticResult c;
      detail::SacActorResult a;
      auto critic_part = [&] {
        if constexpr (kDefaultNetworks)
          if (manual)
            return void(c = detail::manual_critic(*manual_, *actor_, *critic_, *critic_target_, mb, alpha,
                                                  *cfg_.gamma, nn, ar));
        c = detail::autograd_critic(actor_, critic_, critic_target_, critic_opt_, *cfg_.gamma, mb, {alpha, ar}, nn, ctx);
      };
      auto actor_part = [&] {
        if constexpr (kDefaultNetworks)
          if (manual)
            return void(a = detail::manual_actor(*manual_, *actor_, *critic_, mb, alpha, cfg_.auto_alpha,
                                                 target_entropy_[0], no, ar, tw));
        a = detail::autograd_actor(actor_, critic_, actor_opt_, mb, {alpha, ar}, no, ctx, tw);
        if (!per_task && cfg_.auto_alpha) detail::autograd_temperature(a, log_alpha_, alpha_opt_, target_entropy_[0], ctx);
      };
      // Per task, the temperatures' gradient from the transitions' log-densities.
      auto temperature_part = [&] {
        if (!per_task || !actor_step || !cfg_.auto_alpha) return;
        const auto task = (whole ? batch.task : batch.task.narrow(0, part.begin, part.rows)).to(at::kLong);
        std::tie(a.alpha_grad, a.alpha_loss) = detail::task_temperatures(log_alpha_, target_entropy_, a.log_prob, task);
      };
      if (actor_step) ctx.concurrently({critic_part, actor_part});
      else critic_part();
      temperature_part();
      if (whole) {
        critic = std::move(c);
        actor = std::move(a);
        break;
      }
      const double share = part.share;
      accumulate(critic.grad, c.grad, share);
      critic.loss += share * c.loss;
      critic.q_mean += share * c.q_mean;
      td_parts.push_back(c.td.clone());  // the fast path reuses its buffers
      if (actor_step) {
        accumulate(actor.grad, a.grad, share);
        if (a.alpha_grad.defined()) accumulate(actor.alpha_grad, a.alpha_grad, share);
        actor.loss += share * a.loss;
        actor.entropy += share * a.entropy;
        actor.alpha_loss += share * a.alpha_loss;
      }
    }
    if (parts.size() > 1) critic.td = at::cat(td_parts);

    UpdateInfo info;
    // One step for the three optimizers: their gradients cross ranks in one all-reduce.
    std::vector<StepContext::Step> steps{{&critic_opt_, critic.grad, cfg_.max_grad_norm}};
    info.metrics.emplace_back("critic_loss", critic.loss);
    info.metrics.emplace_back("q_mean", critic.q_mean);
    if (actor_step) {
      steps.push_back({&actor_opt_, actor.grad, cfg_.max_grad_norm});
      info.metrics.emplace_back("actor_loss", actor.loss);
      info.metrics.emplace_back("entropy", actor.entropy);
      if (cfg_.auto_alpha) {
        steps.push_back({&alpha_opt_, actor.alpha_grad, 0.0});
        info.metrics.emplace_back("alpha_loss", actor.alpha_loss);
      }
    }
    ctx.apply(std::move(steps));
    {
      info.metrics.emplace_back("alpha", this->alpha());
      if (per_task) {
        const auto alphas = alpha_values();
        for (std::size_t k = 0; k < alphas.size(); ++k) info.metrics.emplace_back("alpha/" + task_names_[k], alphas[k]);
      }
    }

    if (updates_ % cfg_.target_update_freq == 0) {
      torch::NoGradGuard no_grad;
      polyak(target_.flat(), critic_opt_.parameters().flat(), *cfg_.tau);
    }
    ++updates_;
    info.td_error = critic.td;
    return info;
  }

  // The update's device work with no host synchronisation: what a graph captures. Returns
  // the TD errors and the metrics (float64, in the order of `metric_names`).
  std::pair<at::Tensor, at::Tensor> device_update(const ReplayBatch& b, StepContext& ctx, const UpdateNoise& noise,
                                                  bool actor_step, bool target_step) {
    // The temperature before the update, as a tensor (a host value would be fixed at capture).
    const auto alpha_now = log_alpha_.detach().exp();
    auto c = detail::autograd_critic(actor_, critic_, critic_target_, critic_opt_, *cfg_.gamma, b, {0.0, alpha_now}, noise.next, ctx);
    std::vector<StepContext::Step> steps{{&critic_opt_, c.grad, cfg_.max_grad_norm}};
    std::vector<at::Tensor> m{c.loss_t, c.q_mean_t};
    if (actor_step) {
      auto a = detail::autograd_actor(actor_, critic_, actor_opt_, b, {0.0, alpha_now}, noise.obs, ctx);
      if (cfg_.auto_alpha) detail::autograd_temperature(a, log_alpha_, alpha_opt_, target_entropy_[0], ctx);
      steps.push_back({&actor_opt_, a.grad, cfg_.max_grad_norm});
      m.push_back(a.loss_t);
      m.push_back(a.entropy_t);
      if (cfg_.auto_alpha) {
        steps.push_back({&alpha_opt_, a.alpha_grad, 0.0});
        m.push_back(a.alpha_loss_t);
      }
    }
    ctx.apply(std::move(steps));
    m.push_back(log_alpha_.detach().exp().reshape({}));
    if (target_step) {
      torch::NoGradGuard no_grad;
      polyak(target_.flat(), critic_opt_.parameters().flat(), *cfg_.tau);
    }
    for (auto& t : m) t = t.detach().reshape({}).to(at::kDouble);
    return {c.td, at::stack(m)};
  }
  [[nodiscard]] std::vector<std::string> metric_names(bool actor_step) const {
    std::vector<std::string> n{"critic_loss", "q_mean"};
    if (actor_step) {
      n.insert(n.end(), {"actor_loss", "entropy"});
      if (cfg_.auto_alpha) n.emplace_back("alpha_loss");
    }
    n.emplace_back("alpha");
    return n;
  }

  // The host's part of a captured update, after its device work: counts the optimizer
  // steps it took and the update, and reads its metrics (one copy to the host, which waits
  // for the device) and TD errors.
  UpdateInfo finish_device_update(bool actor_step, StepContext& ctx, const std::vector<std::string>& names,
                                  const at::Tensor& metrics, const at::Tensor& td) {
    critic_opt_.count_step();
    int steps = 1;
    if (actor_step) {
      actor_opt_.count_step();
      ++steps;
      if (cfg_.auto_alpha) {
        alpha_opt_.count_step();
        ++steps;
      }
    }
    ctx.count_steps(steps);
    ++updates_;
    UpdateInfo info;
    const auto values = metrics.to(at::kCPU);
    const double* v = values.data_ptr<double>();
    for (std::size_t i = 0; i < names.size(); ++i) info.metrics.emplace_back(names[i], v[i]);
    info.td_error = td.clone();
    return info;
  }

  [[nodiscard]] bool graphable(const ReplayBatch& b, const StepContext& ctx, const UpdateNoise& noise) const {
    return cuda::kCudaGraphs && cfg_.cuda_graph && device_.is_cuda() && b.obs.is_cuda() && alphas_ == 1 &&
           !task_weights_ && ctx.graphable() && noise.next.defined() &&
           (noise.obs.defined() || updates_ % cfg_.actor_update_freq != 0);
  }

  // The update from a CUDA graph (optim/graphed_update.hpp): one per shape of update (batch
  // rows, actor and target steps or not, importance weights and discounts given or not).
  // The noise is drawn outside the graph, as op by op, so a run draws the same numbers with
  // the graph or without.
  UpdateInfo graphed_update(const ReplayBatch& b, StepContext& ctx, const UpdateNoise& noise) {
    const bool actor_step = updates_ % cfg_.actor_update_freq == 0;
    const bool target_step = updates_ % cfg_.target_update_freq == 0;
    const std::int64_t key = b.obs.size(0) * 16 + (actor_step ? 1 : 0) + (target_step ? 2 : 0) +
                             (b.weight.defined() ? 4 : 0) + (b.discount.defined() ? 8 : 0);
    auto& g = graphs_.of(key, device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = eager_update(b, ctx, noise); });
      return info;
    }
    for (auto* o : {&actor_opt_, &critic_opt_, &alpha_opt_}) o->sync_device_state();
    const std::vector<at::Tensor> values{b.obs,    b.action, b.reward,   b.next_obs,
                                         b.terminated, b.discount, b.weight, noise.next,
                                         actor_step ? noise.obs : at::Tensor()};
    if (!g.update.captured()) {
      auto& u = g.update;
      const ReplayBatch in{u.input(b.obs),        u.input(b.action),   u.input(b.reward), u.input(b.next_obs),
                           u.input(b.terminated), u.input(b.discount), u.input(b.weight), {}, {}};
      const UpdateNoise in_noise{u.input(noise.next), u.input(values.back())};
      g.out.names = metric_names(actor_step);
      u.capture(ctx, config_section.view(), [&] {
        std::tie(g.out.td, g.out.metrics) = device_update(in, ctx, in_noise, actor_step, target_step);
      });
    }
    graphs_.replay(g, values);
    return finish_device_update(actor_step, ctx, g.out.names, g.out.metrics, g.out.td);
  }
  // What a captured update leaves: its TD errors and metrics (and the metrics' names).
  struct GraphOutputs {
    at::Tensor td, metrics;
    std::vector<std::string> names;
  };
  GraphedUpdates<GraphOutputs> graphs_;

 public:

  /// The learning rates now, by optimizer (for logs).
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{"actor", actor_opt_.lr()}, {"critic", critic_opt_.lr()}, {"alpha", alpha_opt_.lr()}};
  }
  /// Each network's parameters as one flat tensor (for weight histograms).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor", actor_opt_.parameters().flat()}, {"critic", critic_opt_.parameters().flat()}};
  }

  /// Whether updates and actions take the hand-written fast path (`manual_backward`).
  [[nodiscard]] bool manual_backward() const noexcept { return manual_ != nullptr; }

  /// Moves the exponential moving average of the actor's weights towards the current ones:
  /// ema = decay ema + (1 - decay) weights (Polyak averaging of the policy, as a run's
  /// `train.ema_decay` asks for after each update). The first call starts it at the weights.
  void ema_update(double decay) { ema_.update(actor_opt_.parameters().flat(), decay); }
  /// The averaged actor weights (flat, in the order of `actor()->parameters()`); undefined
  /// until the first `ema_update`.
  [[nodiscard]] const at::Tensor& ema_weights() const noexcept { return ema_.weights(); }
  /// Runs `f` with the averaged weights in the actor (when there are any), then puts the
  /// trained weights back, whatever `f` does.
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(actor_opt_.parameters().flat(), std::forward<F>(f));
  }

  /// Writes the policy alone, for deployment (`anvil::load_policy`): the actor's shape and
  /// its weights (the averaged ones when there are any). Policy files hold the default
  /// GaussianActor only; with a user actor this does not exist and the Trainer writes no
  /// policy.bin (its checkpoints hold the actor).
  void save_policy(BinaryWriter& w) const
    requires std::same_as<Actor, nn::GaussianActor>
  {
    w.string("GaussianActor");
    w.value(static_cast<std::int64_t>(actor_->net()->in_features()));
    w.value(act_dim_);
    const auto& ac = *cfg_.actor;
    w.value(static_cast<std::uint64_t>(ac.hidden->size()));
    for (int h : *ac.hidden) w.value(h);
    w.value(static_cast<int>(*ac.activation));
    w.value(*ac.log_std_min);
    w.value(*ac.log_std_max);
    write_tensor(w, ema_.defined() ? ema_.weights() : actor_opt_.parameters().flat(), "the actor's weights");
  }

  /// Everything a checkpoint holds of SAC: the actor and the critic with their Adam
  /// states, the target critic, the learned temperature with its optimizer, and the update
  /// count (which schedules actor and target updates).
  struct Saved {
    FlatAdam::Saved actor, critic, alpha;
    at::Tensor target;
    Ema::Saved ema;
    std::int64_t updates = 0;
  };
  void save(BinaryWriter& w) const {
    actor_opt_.save(w);
    critic_opt_.save(w);
    alpha_opt_.save(w);
    write_tensor(w, target_.flat(), "the target critic's weights");
    w.value(updates_);
    ema_.save(w);
  }
  /// Reads what `save` wrote, checking every size against this SAC; changes nothing here,
  /// so a caller can check the whole file before `restore`.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.actor = actor_opt_.read(r, "sac actor");
    s.critic = critic_opt_.read(r, "sac critic");
    s.alpha = alpha_opt_.read(r, "sac temperature");
    s.target = read_tensor(r, "sac target critic parameters", target_.flat());
    s.updates = r.value<std::int64_t>("sac update count");
    s.ema = ema_.read(r, "sac averaged actor parameters", actor_opt_.parameters().flat());
    return s;
  }
  void restore(const Saved& s) {
    actor_opt_.restore(s.actor);
    critic_opt_.restore(s.critic);
    alpha_opt_.restore(s.alpha);
    torch::NoGradGuard no_grad;
    target_.flat().copy_(s.target);
    updates_ = s.updates;
    ema_.restore(s.ema);
    graphs_.clear();  // captured again from the restored state (warm-ups first)
  }

  [[nodiscard]] Actor& actor() noexcept { return actor_; }
  [[nodiscard]] Critic& critic() noexcept { return critic_; }
  [[nodiscard]] Critic& critic_target() noexcept { return critic_target_; }
  /// The optimizers (their moments show the gradients they were given).
  [[nodiscard]] const FlatAdam& actor_optimizer() const noexcept { return actor_opt_; }
  [[nodiscard]] const FlatAdam& critic_optimizer() const noexcept { return critic_opt_; }
  [[nodiscard]] const FlatAdam& alpha_optimizer() const noexcept { return alpha_opt_; }
  /// The temperature (the mean of the tasks' when there is one per task).
  [[nodiscard]] double alpha() const {
    const auto a = alpha_values();
    double mean = 0;
    for (const double x : a) mean += x / static_cast<double>(a.size());
    return mean;
  }
  /// Each temperature: one, or one per task.
  [[nodiscard]] at::Tensor alphas() const { return log_alpha_.detach().exp().to(at::kCPU); }
  /// How many temperatures: 1, or the env's tasks with `tasks.per_task_alpha`.
  [[nodiscard]] std::int64_t temperatures() const noexcept { return alphas_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Batch size the trainer samples for each update.
  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  /// The discount (n-step returns in the buffer, a reward normaliser's return).
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

 private:
  static constexpr bool kDefaultNetworks =
      std::same_as<Actor, nn::GaussianActor> && std::same_as<Critic, nn::TwinQ>;

  // sum += share * part (sum starts undefined).
  static void accumulate(at::Tensor& sum, const at::Tensor& part, double share) {
    if (!sum.defined()) sum = part * share;
    else sum.add_(part, share);
  }

  Config cfg_;
  c10::Device device_;
  Actor actor_{nullptr};
  Critic critic_{nullptr}, critic_target_{nullptr};
  at::Tensor log_alpha_;
  std::vector<double> target_entropy_;  // one per temperature
  std::int64_t alphas_ = 1;             // temperatures: 1, or one per task
  bool task_weights_ = false;           // tasks.loss_weights
  std::vector<std::string> task_names_;
  std::int64_t act_dim_ = 0;
  FlatAdam actor_opt_, critic_opt_, alpha_opt_;
  FlatParameters target_;
  std::int64_t updates_ = 0;
  std::unique_ptr<detail::SacManual> manual_;  // the fast path, when it applies

  // exp(log alpha) of each temperature, read straight from host memory when it is there
  // (two LibTorch ops and a copy per update otherwise).
  [[nodiscard]] std::vector<double> alpha_values() const {
    if (log_alpha_.device().is_cpu() && log_alpha_.scalar_type() == at::kFloat && log_alpha_.is_contiguous()) {
      const float* la = log_alpha_.data_ptr<float>();
      std::vector<double> a(static_cast<std::size_t>(alphas_));
      for (std::size_t k = 0; k < a.size(); ++k) a[k] = std::exp(static_cast<double>(la[k]));
      return a;
    }
    const auto t = log_alpha_.detach().exp().to(at::kCPU, at::kDouble).contiguous();
    return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
  }
  Ema ema_;                                     // averaged actor weights (train.ema_decay)
};


static_assert(Algorithm<SAC>);
static_assert(Algorithm<MultiTaskSAC>);

}  // namespace anvil
// ---- end <anvil/algorithms/sac.hpp> ----

namespace anvil {

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

  /// The rewards to store for step `s` (the loop's hook; see file comment).
  at::Tensor shaped_rewards(const StepBatch& s, std::int64_t env_steps) {
    const double w = weight(env_steps);
    last_weight_ = w;
    if (w == 0.0) return s.reward;
    const auto lp = collective_log_prob(s.obs, s.action).clamp_min(*cfg_.shaping->min_log_prob).to(s.reward.device(), at::kFloat);
    return s.reward.to(at::kFloat) + w * lp;
  }

  at::Tensor act(const at::Tensor& obs, ActMode mode) { return sac_.act(state_of(obs), mode); }

  /// A SAC update on the state part of a replay batch (rewards already shaped).
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    ReplayBatch s = b;
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
// ---- end <anvil/algorithms/collective_student.hpp> ----
// ---- begin <anvil/algorithms/coma.hpp> ----
/// @file
/// COMA, counterfactual multi-agent policy gradients (Foerster, Farquhar, Afouras, Nardelli,
/// Whiteson 2018, "Counterfactual Multi-Agent Policy Gradients", AAAI), with the two
/// baselines that isolate its counterfactual baseline: a centralised V critic (central-V)
/// and independent actor-critic (each agent's V from its own observation). All three share
/// the networks' shapes, the loop and the schedule, so `coma.critic` alone changes.
///
/// - **Actor**, shared by the agents: an MLP on [the agent's observation, its id one-hot]
///   giving logits over its actions, or with `coma.actor.gru` > 0 hidden layers, a GRU cell
///   that remembers the episode so far (each agent its own state, forgotten where a row's
///   first-step flag says an episode starts) and a linear output; trained on whole
///   episodes, unrolled from their start; unavailable actions get no probability; exploration
///   mixes the policy with a uniform choice over the available actions, epsilon annealed
///   linearly over episodes (`epsilon_start` -> `epsilon_finish` over `epsilon_anneal_episodes`).
/// - **Critic** (`counterfactual`): for agent a, Q of every action of a with the others'
///   actions fixed; input [global state, a's observation, a's id, the other agents'
///   actions one-hot (a's own block zero), the previous joint action one-hot]. The
///   advantage of a's action u_a is the counterfactual one:
///       A_a = Q(s, u)[u_a] - sum_u' pi_a(u' | o_a) Q(s, u)[u'].
///   `central_v`: V(state, a's observation, a's id), advantage G^lambda - V.
///   `independent`: V(a's observation, a's id), advantage G^lambda - V.
/// - **Targets**: TD(lambda) from a target critic copied from the critic every
///   `target_update_interval` critic steps (a hard update):
///       y_t = r_t + gamma (1 - d_t) [(1 - lambda) v_{t+1} + lambda y_{t+1}],
///   where v is the target critic's value of the taken (joint) action (Q) or of the state
///   (V), and y after an episode's last step is v there: 0 after a terminal step, after a
///   time limit the target critic's value of the last observation with actions sampled
///   from the policy (as PyMARL bootstraps). Targets and log-softmax are float32 under
///   any precision.
/// - **Schedule** (our users'): episodes are collected (one per env per round of the
///   episodic loop) until `batch_size x batch_number` agent-transitions are held; then
///   `data_passes` passes, each over a fresh permutation of them in `batch_number`
///   minibatches of `batch_size`, each minibatch a critic step then an actor step (whose
///   advantages use the stepped critic). Under FP16 the two steps are one step of the
///   loss scaler. With DDP every rank collects its own episodes; the decision to train
///   and the number of minibatches are the same on every rank, so gradients are averaged
///   step by step.
///
/// Multi-agent envs reach it through `envs::Joint` (envs/multi_agent/): the spec's
/// `AgentLayout` says how observation rows and joint actions are laid out.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// ---- begin <anvil/algorithms/coma_config.hpp> ----
/// @file
/// COMA's config section (`coma`), apart from the algorithm (algorithms/coma.hpp), as SAC's
/// and PPO's are. Light header.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>


namespace anvil {

/// Which critic and advantage COMA's actor learns from (see coma.hpp).
enum class ComaCritic { counterfactual, central_v, independent };
constexpr auto enum_names(ComaCritic) {
  return std::array<std::string_view, 3>{"counterfactual", "central_v", "independent"};
}

/// Shape of COMA's critic MLP (`coma.critic_net`).
struct ComaNetConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{128};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::relu};
};
/// Shape of COMA's actor (`coma.actor`): an MLP, or one with a GRU cell after it.
struct ComaActorConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{128};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::relu};
  Param<int, "gru",
        "width of a GRU cell after the hidden layers, whose state carries the episode so far (0: a plain MLP)",
        in_range(0, 1 << 16)>
      gru{0};
};

/// Defaults: PyMARL's COMA (lr 5e-4, gamma 0.99, TD lambda 0.8, target every 200
/// critic steps, gradient norm 10, epsilon 0.5 -> 0.01) and our users' schedule (128 x 5
/// x 5 passes).
struct ComaConfig {
  Param<ComaCritic, "critic",
        "counterfactual: COMA's Q critic and counterfactual baseline; central_v: a centralised V critic "
        "(advantage TD(lambda) return - V); independent: each agent's V from its own observation "
        "(independent actor-critic)">
      critic{ComaCritic::counterfactual};
  Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
  Param<double, "td_lambda", "lambda of the critic's TD(lambda) targets", in_range(0, 1)> td_lambda{0.8};
  Param<double, "actor_lr", "learning rate (Adam) of the actor", positive> actor_lr{5e-4};
  Param<double, "critic_lr", "learning rate (Adam) of the critic", positive> critic_lr{5e-4};
  Param<std::int64_t, "batch_size", "agent-transitions per minibatch (per rank)", at_least(1)> batch_size{128};
  Param<int, "batch_number",
        "minibatches per data pass; training waits until batch_size x batch_number agent-transitions are collected",
        at_least(1)>
      batch_number{5};
  Param<int, "data_passes", "passes over the collected transitions, each in a fresh order", at_least(1)> data_passes{5};
  Param<std::int64_t, "target_update_interval", "critic steps between copies of the critic into its target",
        at_least(1)>
      target_update_interval{200};
  Param<double, "epsilon_start", "exploration: probability of a uniform available action at the start",
        in_range(0, 1)>
      epsilon_start{0.5};
  Param<double, "epsilon_finish", "exploration after the anneal", in_range(0, 1)> epsilon_finish{0.01};
  Param<std::int64_t, "epsilon_anneal_episodes", "episodes (per rank) over which epsilon falls linearly",
        at_least(1)>
      epsilon_anneal_episodes{5000};
  Param<double, "ent_coef", "weight of the policy's entropy bonus", at_least(0)> ent_coef{0.0};
  Param<double, "max_grad_norm", "clip each network's gradient norm (0: off)", at_least(0)> max_grad_norm{10.0};
  Section<"actor", ComaActorConfig> actor;
  Section<"critic_net", ComaNetConfig> critic_net;
};

}  // namespace anvil
// ---- end <anvil/algorithms/coma_config.hpp> ----
// ---- begin <anvil/algorithms/td_lambda.hpp> ----
/// @file
/// TD(lambda) targets of whole episodes (Sutton and Barto 2018, section 12.1), as COMA's
/// critic learns from them.

#include <ATen/ATen.h>

#include <cstdint>

namespace anvil {

/// TD(lambda) targets of whole episodes, [B, T] or [B, T, k] (per agent):
///     y_t = r_t + gamma (1 - d_t) [(1 - lambda) v_{t+1} + lambda y'_{t+1}],
/// with y'_{t+1} = y_{t+1} inside the episode and v_{t+1} after its last step.
/// `reward`, `terminated`, `mask` are [B, T]; `next_value` is [B, T, ...]: the value of
/// the step after each step (after an episode's last step: its bootstrap value). Rows
/// outside an episode (mask 0) are 0. Float32 in, float32 out.
inline at::Tensor td_lambda_targets(const at::Tensor& reward, const at::Tensor& terminated, const at::Tensor& mask,
                                    const at::Tensor& next_value, double gamma, double lambda) {
  const std::int64_t T = reward.size(1);
  auto expand = [&](const at::Tensor& x) {
    at::Tensor y = x;
    while (y.dim() < next_value.dim()) y = y.unsqueeze(-1);
    return y;
  };
  const auto r = expand(reward), d = expand(terminated), m = expand(mask);
  auto y = at::zeros_like(next_value);
  at::Tensor later = next_value.select(1, T - 1);  // y' after the last column: its bootstrap value
  for (std::int64_t t = T - 1; t >= 0; --t) {
    const auto v = next_value.select(1, t);
    if (t + 1 < T) {
      const auto inside = m.select(1, t + 1);  // step t+1 belongs to the episode
      later = inside * y.select(1, t + 1) + (1 - inside) * v;
    } else {
      later = v;
    }
    y.select(1, t).copy_((r.select(1, t) + gamma * (1 - d.select(1, t)) * ((1 - lambda) * v + lambda * later)) *
                         m.select(1, t));
  }
  return y;
}

}  // namespace anvil
// ---- end <anvil/algorithms/td_lambda.hpp> ----

namespace anvil {

struct EpisodicLoop;  // train/loops/episodic.hpp (a layer above; the Trainer includes it)

/// Algorithm policy: COMA and its baselines (see file comment).
class COMA {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "coma";
  static constexpr bool on_policy = true;
  using Batch = EpisodeBatch;
  using loop = EpisodicLoop;

  /// Its config section (algorithms/coma_config.hpp).
  using Config = ComaConfig;
  using NetConfig = ComaNetConfig;
  using ActorConfig = ComaActorConfig;

  COMA(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), layout_(spec.agents) {
    if (!layout_.multi_agent())
      throw ConfigError("COMA: " + spec.name +
                        " is not a multi-agent env; wrap a MultiAgentEnv in envs::Joint (envs/multi_agent/)");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than coma.batch_size (" +
                        std::to_string(*cfg.batch_size) + "): micro-batches would be empty");
    k_ = layout_.agents;
    n_ = layout_.num_actions;
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    eye_ = at::eye(k_, f);
    powers_ = at::ones({k_}, f.dtype(at::kLong));
    for (std::int64_t i = 1; i < k_; ++i) powers_[i] = powers_[i - 1] * n_;
    // Row j of others_mask_ zeroes agent j's block of a joint one-hot.
    others_mask_ = (1 - eye_).repeat_interleave(n_, 1);  // [k, k*n]

    if (recurrent()) {
      gru_ = nn::GruActor(layout_.obs_dim + k_, nn::widths(cfg.actor->hidden), cfg.actor->gru, n_, cfg.actor->activation);
      gru_->to(device_);
    } else {
      actor_ = nn::Mlp(layout_.obs_dim + k_, nn::widths(cfg.actor->hidden), n_, cfg.actor->activation);
      actor_->to(device_);
    }
    critic_ = nn::Mlp(critic_input_size(), nn::widths(cfg.critic_net->hidden), q_critic() ? n_ : 1,
                      cfg.critic_net->activation);
    critic_->to(device_);
    actor_opt_ = FlatAdam(recurrent() ? gru_->parameters() : actor_->parameters(),
                          {.lr = cfg.actor_lr * ctx.lr_scale(cfg.batch_size)});
    critic_opt_ = FlatAdam(critic_->parameters(), {.lr = cfg.critic_lr * ctx.lr_scale(cfg.batch_size)});
    target_ = std::dynamic_pointer_cast<nn::MlpImpl>(critic_->clone());
    for (auto& p : target_->parameters()) p.set_requires_grad(false);
  }

  /// Joint actions [N] (int64) for observation rows [N, row]: each agent samples from its
  /// epsilon-mixed policy to explore, or takes its most likely available action. A
  /// recurrent actor steps its memory of each env's episode (rows are envs, in the same
  /// order from call to call; a row's first-step flag starts a new memory).
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    const auto rows = obs.to(device_, at::kFloat);
    const auto avail = split_avail(rows);
    const auto logits = mask(recurrent() ? step_memory(rows) : mlp_logits(split_obs(rows)), avail);
    const auto u = mode == ActMode::explore ? sample(mix(logits.softmax(-1), avail, epsilon())) : logits.argmax(-1);
    return encode(u);
  }

  /// Learns from a round of episodes: holds them until batch_size x batch_number
  /// agent-transitions are collected (on average over the ranks), then trains on them all
  /// (see file comment). Reports nothing for a round that is only held.
  UpdateInfo update(const EpisodeBatch& b, StepContext& ctx) {
    // Held past this round: copies, as a buffer's batch may view storage the next round reuses.
    pending_.push_back(EpisodeBatch{b.obs.clone(), b.action.clone(), b.reward.clone(), b.terminated.clone(),
                                    b.mask.clone(), b.length.clone(), b.last_obs.clone()});
    pending_rows_ += b.mask.sum().item<std::int64_t>() * k_;
    episodes_ += b.obs.size(0);
    const double wanted = static_cast<double>(*cfg_.batch_size) * cfg_.batch_number;
    if (ctx.mean_over_ranks(static_cast<double>(pending_rows_)) < wanted) return {};
    UpdateInfo info = train(ctx);
    pending_.clear();
    pending_rows_ = 0;
    ++updates_;
    return info;
  }

  /// The epsilon of the current episode count.
  [[nodiscard]] double epsilon() const noexcept {
    const double f = std::min(1.0, static_cast<double>(episodes_) / static_cast<double>(*cfg_.epsilon_anneal_episodes));
    return cfg_.epsilon_start + f * (cfg_.epsilon_finish - cfg_.epsilon_start);
  }

  // --- The pieces, public for tests and custom mains ------------------------------------

  /// Each agent's observation [..., k, obs_dim] of observation rows [..., row].
  [[nodiscard]] at::Tensor split_obs(const at::Tensor& rows) const {
    auto s = rows.sizes().vec();
    s.back() = k_;
    s.push_back(layout_.obs_dim);
    return rows.narrow(-1, 0, k_ * layout_.obs_dim).reshape(s);
  }
  /// Each agent's available actions [..., k, n] (1/0).
  [[nodiscard]] at::Tensor split_avail(const at::Tensor& rows) const {
    auto s = rows.sizes().vec();
    s.back() = k_;
    s.push_back(n_);
    return rows.narrow(-1, layout_.avail_offset(), k_ * n_).reshape(s);
  }
  /// The global state [..., state_dim].
  [[nodiscard]] at::Tensor split_state(const at::Tensor& rows) const {
    return rows.narrow(-1, layout_.state_offset(), layout_.state_dim);
  }
  /// The first-step flags [...] (1 on an episode's first row).
  [[nodiscard]] at::Tensor split_first(const at::Tensor& rows) const { return rows.select(-1, layout_.first_offset()); }
  /// The agents' actions [..., k] of joint actions [...].
  [[nodiscard]] at::Tensor decode(const at::Tensor& joint) const {
    return joint.to(device_).unsqueeze(-1).div(powers_, "floor").remainder(n_);
  }
  /// Joint actions [...] of agents' actions [..., k].
  [[nodiscard]] at::Tensor encode(const at::Tensor& u) const { return (u * powers_).sum(-1); }

  /// Whether the actor has memory (`coma.actor.gru` > 0).
  [[nodiscard]] bool recurrent() const noexcept { return cfg_.actor->gru > 0; }
  /// The actor's logits [..., k, n] (float32, unmasked) for observation rows: per row for
  /// an MLP; a recurrent actor reads rows [B, T, row] as B episodes of T steps from their
  /// start (and rows [N, row] as first steps).
  at::Tensor logits(const at::Tensor& rows) {
    if (!recurrent()) return mlp_logits(split_obs(rows));
    const auto seq = rows.dim() == 2 ? rows.unsqueeze(1) : rows;  // [B, T, row]
    const auto B = seq.size(0), T = seq.size(1);
    const auto x = actor_input(split_obs(seq)).transpose(0, 1).reshape({T, B * k_, -1});  // time first, rows b*k + a
    auto first = split_first(seq).transpose(0, 1).repeat_interleave(k_, 1);               // [T, B*k]
    first.select(0, 0).fill_(1.0);                                                          // every sequence starts afresh
    const auto out = gru_->unroll(x, first).reshape({T, B, k_, n_}).transpose(0, 1);       // [B, T, k, n]
    return rows.dim() == 2 ? out.squeeze(1) : out;
  }
  /// The policy [..., k, n] for observation rows (see `logits`): softmax over the
  /// available actions, mixed with epsilon of a uniform choice among them.
  at::Tensor policy(const at::Tensor& rows, double eps) {
    const auto avail = split_avail(rows);
    return mix(mask(logits(rows), avail).softmax(-1), avail, eps);
  }
  /// The counterfactual baseline of each row: sum_u' pi(u') Q[u'] ([R] from [R, n] twice).
  static at::Tensor counterfactual_baseline(const at::Tensor& pi, const at::Tensor& q) { return (pi * q).sum(-1); }

  /// The critic's input [B, T, k, d] for rows [B, T, row] with the agents' actions u and
  /// the previous step's u_prev one-hot ([B, T, k, n]; zeros before an episode's first step).
  [[nodiscard]] at::Tensor critic_input(const at::Tensor& rows, const at::Tensor& onehot,
                                        const at::Tensor& onehot_prev) const {
    const auto obs_k = split_obs(rows);
    auto lead = obs_k.sizes().vec();
    lead.pop_back();  // [..., k]
    auto ids = eye_;
    for (std::size_t i = 0; i + 2 < lead.size(); ++i) ids = ids.unsqueeze(0);
    ids = ids.expand(with_last(lead, k_));
    if (*cfg_.critic == ComaCritic::independent) return at::cat({obs_k, ids}, -1);
    const auto state = split_state(rows).unsqueeze(-2).expand(with_last(lead, layout_.state_dim));
    if (*cfg_.critic == ComaCritic::central_v) return at::cat({state, obs_k, ids}, -1);
    auto flat_lead = lead;
    flat_lead.pop_back();
    const auto joint = onehot.reshape(with_last(flat_lead, k_ * n_)).unsqueeze(-2);           // [..., 1, k*n]
    const auto others = joint * others_mask_;                                                  // [..., k, k*n]
    const auto prev = onehot_prev.reshape(with_last(flat_lead, k_ * n_)).unsqueeze(-2).expand(with_last(lead, k_ * n_));
    return at::cat({state, obs_k, ids, others, prev}, -1);
  }
  [[nodiscard]] std::int64_t critic_input_size() const noexcept {
    const auto base = layout_.obs_dim + k_;
    if (*cfg_.critic == ComaCritic::independent) return base;
    if (*cfg_.critic == ComaCritic::central_v) return layout_.state_dim + base;
    return layout_.state_dim + base + 2 * k_ * n_;
  }
  [[nodiscard]] bool q_critic() const noexcept { return *cfg_.critic == ComaCritic::counterfactual; }

  /// The TD(lambda) targets [B, T, k] of a round of episodes, from the target critic.
  at::Tensor targets(const EpisodeBatch& b) {
    torch::NoGradGuard no_grad;
    const auto ext = extended(b);
    auto v = target_->forward(critic_input(ext.rows, ext.onehot, ext.onehot_prev)).to(at::kFloat);  // [B, T+1, k, .]
    v = q_critic() ? v.gather(-1, ext.u.unsqueeze(-1)).squeeze(-1) : v.squeeze(-1);
    const auto next = v.narrow(1, 1, b.obs.size(1));  // value of the step after each step
    return td_lambda_targets(b.reward.to(device_, at::kFloat), b.terminated.to(device_, at::kFloat),
                             b.mask.to(device_, at::kFloat), next, cfg_.gamma, cfg_.td_lambda);
  }

  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{"actor", actor_opt_.lr()}, {"critic", critic_opt_.lr()}};
  }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor", actor_opt_.parameters().flat()}, {"critic", critic_opt_.parameters().flat()}};
  }

  /// State protocol: both networks with their Adam state, the target critic, the counts
  /// (episodes, for epsilon; critic steps, for the target's schedule) and the episodes held
  /// for the next training.
  struct Saved {
    FlatAdam::Saved actor, critic;
    std::vector<at::Tensor> target;
    std::int64_t episodes = 0, critic_steps = 0, updates = 0;
    std::vector<EpisodeBatch> pending;
  };
  void save(BinaryWriter& w) const {
    actor_opt_.save(w);
    critic_opt_.save(w);
    for (const auto& p : target_->parameters()) write_tensor(w, p, "coma target critic");
    w.value(episodes_);
    w.value(critic_steps_);
    w.value(updates_);
    w.value(static_cast<std::int64_t>(pending_.size()));
    for (const auto& b : pending_) {
      w.value(b.obs.size(0));
      w.value(b.obs.size(1));
      for (const auto* t : {&b.obs, &b.action, &b.reward, &b.terminated, &b.mask, &b.length, &b.last_obs})
        write_tensor(w, *t, "coma held episodes");
    }
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.actor = actor_opt_.read(r, "coma actor");
    s.critic = critic_opt_.read(r, "coma critic");
    for (const auto& p : target_->parameters()) s.target.push_back(read_tensor(r, "coma target critic", p));
    s.episodes = r.value<std::int64_t>("coma episode count");
    s.critic_steps = r.value<std::int64_t>("coma critic steps");
    s.updates = r.value<std::int64_t>("coma update count");
    const auto held = r.value<std::int64_t>("coma held rounds");
    if (held < 0 || held > 1 << 20) r.fail("coma held rounds", "is " + std::to_string(held));
    const auto f = at::TensorOptions().dtype(at::kFloat);
    for (std::int64_t i = 0; i < held; ++i) {
      const auto n = r.value<std::int64_t>("coma held episodes"), t = r.value<std::int64_t>("coma held steps");
      if (n < 1 || t < 1 || n * t > (std::int64_t{1} << 32)) r.fail("coma held episodes", "have an implausible shape");
      const auto row = layout_.row_size();
      EpisodeBatch b;
      b.obs = read_tensor(r, "coma held observations", at::empty({n, t, row}, f));
      b.action = read_tensor(r, "coma held actions", at::empty({n, t}, f.dtype(at::kLong)));
      b.reward = read_tensor(r, "coma held rewards", at::empty({n, t}, f));
      b.terminated = read_tensor(r, "coma held terminations", at::empty({n, t}, f));
      b.mask = read_tensor(r, "coma held masks", at::empty({n, t}, f));
      b.length = read_tensor(r, "coma held lengths", at::empty({n}, f.dtype(at::kLong)));
      b.last_obs = read_tensor(r, "coma held last observations", at::empty({n, row}, f));
      s.pending.push_back(std::move(b));
    }
    return s;
  }
  void restore(const Saved& s) {
    actor_opt_.restore(s.actor);
    critic_opt_.restore(s.critic);
    torch::NoGradGuard no_grad;
    const auto params = target_->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(s.target[i]);
    episodes_ = s.episodes;
    critic_steps_ = s.critic_steps;
    updates_ = s.updates;
    pending_.clear();
    pending_rows_ = 0;
    for (const auto& b : s.pending) {
      EpisodeBatch d{b.obs.to(device_), b.action.to(device_), b.reward.to(device_), b.terminated.to(device_),
                     b.mask.to(device_), b.length.to(device_), b.last_obs.to(device_)};
      pending_rows_ += d.mask.sum().item<std::int64_t>() * k_;
      pending_.push_back(std::move(d));
    }
  }

  /// The MLP actor (null when the actor is recurrent) and the recurrent one (null otherwise).
  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  [[nodiscard]] nn::GruActor& recurrent_actor() noexcept { return gru_; }
  [[nodiscard]] nn::Mlp& critic() noexcept { return critic_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] const AgentLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t episodes() const noexcept { return episodes_; }
  [[nodiscard]] std::int64_t critic_steps() const noexcept { return critic_steps_; }
  /// Trainings done (each of data_passes x batch_number minibatches).
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Agent-transitions held for the next training.
  [[nodiscard]] std::int64_t held_transitions() const noexcept { return pending_rows_; }

 private:
  // A round's rows with the step after each episode's last one appended (its bootstrap
  // observation, and actions sampled there), the agents' actions and their one-hots.
  struct Extended {
    at::Tensor rows, u, onehot, onehot_prev;  // [B, T+1, ...]
  };
  Extended extended(const EpisodeBatch& b) {
    const auto B = b.obs.size(0), T = b.obs.size(1);
    const auto obs = b.obs.to(device_, at::kFloat);
    const auto last = b.last_obs.to(device_, at::kFloat);
    const auto len = b.length.to(device_);
    const auto batch = at::arange(B, len.options());
    Extended e;
    e.rows = at::cat({obs, at::zeros({B, 1, obs.size(2)}, obs.options())}, 1);
    e.rows.index_put_({batch, len}, last);
    auto u = at::cat({decode(b.action), at::zeros({B, 1, k_}, powers_.options())}, 1);
    {
      torch::NoGradGuard no_grad;
      // A recurrent policy at the bootstrap step needs the episode before it.
      const auto pi_last = recurrent() ? policy(e.rows, epsilon()).index({batch, len}) : policy(last, epsilon());
      u.index_put_({batch, len}, sample(pi_last));
    }
    e.u = u;
    e.onehot = at::one_hot(u, n_).to(at::kFloat);
    e.onehot_prev = at::cat({at::zeros({B, 1, k_, n_}, e.onehot.options()), e.onehot.narrow(1, 0, T)}, 1);
    return e;
  }

  // The MLP actor's logits [..., k, n] (float32) for each agent's observation [..., k, obs_dim].
  at::Tensor mlp_logits(const at::Tensor& obs_k) { return actor_->forward(actor_input(obs_k)).to(at::kFloat); }
  // Logits with unavailable actions at -1e10.
  static at::Tensor mask(const at::Tensor& logits, const at::Tensor& avail) { return logits.masked_fill(avail < 0.5, -1e10); }
  // A policy mixed with epsilon of a uniform choice among the available actions.
  static at::Tensor mix(const at::Tensor& p, const at::Tensor& avail, double eps) {
    if (eps <= 0) return p;
    const auto a = avail.to(at::kFloat);
    return (1 - eps) * p + eps * a / a.sum(-1, true);
  }
  // One step of the recurrent actor for rows [N, row] (one per env), from and into the
  // memory of each env's agents; a row that starts an episode starts from zero.
  at::Tensor step_memory(const at::Tensor& rows) {
    const auto N = rows.size(0);
    if (!memory_.defined() || memory_.size(0) != N * k_)
      memory_ = at::zeros({N * k_, gru_->memory()}, rows.options().dtype(at::kFloat));
    const auto keep = (1 - split_first(rows)).repeat_interleave(k_).unsqueeze(-1);
    auto [out, next] = gru_->step(actor_input(split_obs(rows)).reshape({N * k_, -1}), memory_ * keep);
    memory_ = next;
    return out.reshape({N, k_, n_});
  }

  // The actor's input [..., k, obs_dim + k]: each agent's observation and id.
  [[nodiscard]] at::Tensor actor_input(const at::Tensor& obs_k) const {
    auto lead = obs_k.sizes().vec();
    lead.pop_back();
    auto ids = eye_;
    for (std::size_t i = 0; i + 2 < lead.size(); ++i) ids = ids.unsqueeze(0);
    return at::cat({obs_k, ids.expand(with_last(lead, k_))}, -1);
  }
  static std::vector<std::int64_t> with_last(std::vector<std::int64_t> s, std::int64_t last) {
    s.push_back(last);
    return s;
  }
  static at::Tensor sample(const at::Tensor& p) {
    auto s = p.sizes().vec();
    s.pop_back();
    return at::multinomial(p.reshape({-1, p.size(-1)}), 1).reshape(s);
  }

  // What one training draws its minibatches from: one row per agent-transition (a
  // minibatch's `index` says which; a recurrent actor's inputs are the held sequences).
  struct Rows {
    at::Tensor actor_in, critic_in, avail, u, target, index;
  };
  // The held episodes, for a recurrent actor: rows [B, T, row] and which of their
  // steps are real ([B*T], in flatten_rows' order).
  struct Sequences {
    at::Tensor rows, valid;
  };
  Rows flatten_rows() {
    std::vector<at::Tensor> ai, ci, av, uu, y;
    for (const auto& b : pending_) {
      const auto T = b.obs.size(1);
      const auto ext = extended(b);
      const auto rows = ext.rows.narrow(1, 0, T);
      const auto valid = (b.mask.to(device_) > 0.5).reshape({-1});
      auto pick = [&](const at::Tensor& x) {  // [B, T, k, ...] -> [V*k, ...]
        auto s = x.sizes().vec();
        std::vector<std::int64_t> flat{-1};
        flat.insert(flat.end(), s.begin() + 2, s.end());
        auto f = x.reshape(flat).index({valid});
        std::vector<std::int64_t> out{-1};
        out.insert(out.end(), s.begin() + 3, s.end());
        return f.reshape(out);
      };
      if (recurrent()) sequences_.push_back(Sequences{rows, valid});
      else ai.push_back(pick(actor_input(split_obs(rows))));
      ci.push_back(pick(critic_input(rows, ext.onehot.narrow(1, 0, T), ext.onehot_prev.narrow(1, 0, T))));
      av.push_back(pick(split_avail(rows)));
      uu.push_back(pick(ext.u.narrow(1, 0, T).unsqueeze(-1)).squeeze(-1));
      y.push_back(pick(targets(b).unsqueeze(-1)).squeeze(-1));
    }
    return Rows{recurrent() ? at::Tensor() : at::cat(ai), at::cat(ci), at::cat(av), at::cat(uu), at::cat(y), {}};
  }
  // The recurrent actor's logits [R, n] of every held agent-transition (in the order of
  // flatten_rows' rows), each episode unrolled from its start.
  at::Tensor sequence_logits() {
    std::vector<at::Tensor> out;
    for (const auto& s : sequences_) out.push_back(logits(s.rows).reshape({-1, k_, n_}).index({s.valid}).reshape({-1, n_}));
    return at::cat(out);
  }
  // Targets only (a pass after the first: the target critic may have been updated).
  at::Tensor flatten_targets() {
    std::vector<at::Tensor> y;
    for (const auto& b : pending_) {
      const auto valid = (b.mask.to(device_) > 0.5).reshape({-1});
      y.push_back(targets(b).reshape({-1, k_}).index({valid}).reshape({-1}));
    }
    return at::cat(y);
  }

  UpdateInfo train(StepContext& ctx) {
    sequences_.clear();
    Rows rows = flatten_rows();
    const std::int64_t R = rows.u.size(0), bs = cfg_.batch_size;
    double critic_loss = 0, actor_loss = 0, advantage = 0, entropy = 0, q_taken = 0;
    int steps = 0;
    const double eps = epsilon();
    for (int pass = 0; pass < cfg_.data_passes; ++pass) {
      if (pass > 0) rows.target = flatten_targets();
      const auto perm = at::randperm(R, at::TensorOptions().dtype(at::kLong)).to(device_);
      for (int j = 0; j < cfg_.batch_number; ++j) {
        // Every rank takes batch_number minibatches; a rank with fewer rows wraps around.
        const auto idx = perm.index({(at::arange(bs, perm.options()) + j * bs).remainder(R)});
        const Rows mb{recurrent() ? at::Tensor() : rows.actor_in.index({idx}), rows.critic_in.index({idx}),
                      rows.avail.index({idx}), rows.u.index({idx}), rows.target.index({idx}), idx};
        auto scaler_step = ctx.one_scaler_step();
        critic_loss += critic_step(mb, ctx, q_taken);
        actor_loss += actor_step(mb, ctx, eps, advantage, entropy);
        ++steps;
        if (++critic_steps_ % cfg_.target_update_interval == 0) update_target();
      }
    }
    UpdateInfo info;
    info.metrics = {{"critic_loss", critic_loss / steps}, {"actor_loss", actor_loss / steps},
                    {"advantage_abs", advantage / steps},  {"entropy", entropy / steps},
                    {"q_taken", q_taken / steps},          {"epsilon", eps},
                    {"transitions", static_cast<double>(R)}};
    return info;
  }

  // One critic step on a minibatch (micro-batches summed); returns its loss.
  double critic_step(const Rows& mb, StepContext& ctx, double& q_taken) {
    const auto parts = ctx.micro_batches(mb.u.size(0));
    at::Tensor grad;
    double loss_sum = 0, q_sum = 0;
    for (const auto& part : parts) {
      const auto ci = mb.critic_in.narrow(0, part.begin, part.rows);
      const auto u = mb.u.narrow(0, part.begin, part.rows);
      const auto y = mb.target.narrow(0, part.begin, part.rows);
      at::Tensor loss, taken;
      {
        auto guard = ctx.autocast();
        const auto out = critic_->forward(ci).to(at::kFloat);
        taken = q_critic() ? out.gather(-1, u.unsqueeze(-1)).squeeze(-1) : out.squeeze(-1);
        loss = (taken - y).square().mean();
      }
      auto g = ctx.gradient(loss, critic_opt_);
      if (!grad.defined()) grad = parts.size() == 1 ? g : g * part.share;
      else grad.add_(g, part.share);
      loss_sum += part.share * loss.item<double>();
      q_sum += part.share * taken.detach().mean().item<double>();
    }
    ctx.apply(critic_opt_, grad, cfg_.max_grad_norm);
    q_taken += q_sum;
    return loss_sum;
  }

  // One actor step on a minibatch with advantages from the (just stepped) critic.
  double actor_step(const Rows& mb, StepContext& ctx, double eps, double& adv_abs, double& ent) {
    const auto parts = ctx.micro_batches(mb.u.size(0));
    at::Tensor grad;
    double loss_sum = 0, adv_sum = 0, ent_sum = 0;
    for (const auto& part : parts) {
      const auto ci = mb.critic_in.narrow(0, part.begin, part.rows);
      const auto av = mb.avail.narrow(0, part.begin, part.rows);
      const auto u = mb.u.narrow(0, part.begin, part.rows);
      const auto y = mb.target.narrow(0, part.begin, part.rows);
      at::Tensor loss, adv, h;
      {
        auto guard = ctx.autocast();
        // A recurrent actor unrolls every held episode (the gradient runs through time) and
        // takes the minibatch's rows.
        auto logits = mask(recurrent() ? sequence_logits().index({mb.index.narrow(0, part.begin, part.rows)})
                                       : actor_->forward(mb.actor_in.narrow(0, part.begin, part.rows)).to(at::kFloat),
                           av);
        auto pi = logits.softmax(-1);
        if (eps > 0) pi = (1 - eps) * pi + eps * av / av.sum(-1, true);
        const auto log_pi = pi.gather(-1, u.unsqueeze(-1)).squeeze(-1).clamp_min(1e-10).log();
        {
          torch::NoGradGuard no_grad;
          const auto out = critic_->forward(ci).to(at::kFloat);
          if (q_critic()) adv = out.gather(-1, u.unsqueeze(-1)).squeeze(-1) - counterfactual_baseline(pi.detach(), out);
          else adv = y - out.squeeze(-1);
        }
        h = -(pi * pi.clamp_min(1e-10).log()).sum(-1).mean();
        loss = -(adv * log_pi).mean() - *cfg_.ent_coef * h;
      }
      auto g = ctx.gradient(loss, actor_opt_);
      if (!grad.defined()) grad = parts.size() == 1 ? g : g * part.share;
      else grad.add_(g, part.share);
      loss_sum += part.share * loss.item<double>();
      adv_sum += part.share * adv.abs().mean().item<double>();
      ent_sum += part.share * h.item<double>();
    }
    ctx.apply(actor_opt_, grad, cfg_.max_grad_norm);
    adv_abs += adv_sum;
    ent += ent_sum;
    return loss_sum;
  }

  void update_target() {
    torch::NoGradGuard no_grad;
    const auto src = critic_->parameters(), dst = target_->parameters();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }

  Config cfg_;
  c10::Device device_;
  AgentLayout layout_;
  std::int64_t k_ = 0, n_ = 0;
  at::Tensor eye_, powers_, others_mask_;
  nn::Mlp actor_{nullptr}, critic_{nullptr}, target_{nullptr};
  nn::GruActor gru_{nullptr};
  at::Tensor memory_;                 // the recurrent actor's state while acting, [envs * k, gru]
  std::vector<Sequences> sequences_;  // the held episodes while training a recurrent actor
  FlatAdam actor_opt_, critic_opt_;
  std::vector<EpisodeBatch> pending_;
  std::int64_t pending_rows_ = 0, episodes_ = 0, critic_steps_ = 0, updates_ = 0;
};

static_assert(Algorithm<COMA>);

}  // namespace anvil
// ---- end <anvil/algorithms/coma.hpp> ----
// ---- begin <anvil/algorithms/diffusion_policy.hpp> ----
/// @file
/// Diffusion Policy (Chi, Feng, Du, Xu, Cousineau, Burchfiel, Song 2023, "Diffusion Policy:
/// Visuomotor Policy Learning via Action Diffusion"): behaviour cloning in which the policy
/// is a conditional denoising diffusion model (Ho, Jain, Abbeel 2020, "DDPM") over a sequence
/// of future actions, so that it can represent several ways of acting where a regression
/// averages them.
///
/// What it learns from: windows of demonstrations (buffers/demo_dataset.hpp): the last
/// `obs_horizon` observations (2) and `horizon` actions (16) starting with the first of
/// those observations. It acts on envs wrapped in `envs::MultiStep` (envs/multi_step.hpp),
/// whose observation is the last `obs_horizon` observations and whose action is the
/// `action_horizon` (8) actions it executes before the policy is asked again: the actions
/// predicted for steps obs_horizon - 1 .. obs_horizon - 2 + action_horizon.
///
/// The paper's choices, each a config field: the temporal U-Net denoiser with FiLM
/// conditioning (nn/unet1d.hpp); 100 DDPM steps with the squared-cosine schedule (Nichol and
/// Dhariwal 2021), epsilon prediction and samples clipped to [-1, 1]; DDIM inference (Song,
/// Meng, Ermon 2021) with `inference_steps` steps, or DDPM with all of them; observations
/// and actions scaled to [-1, 1] by the demonstrations' minimum and maximum, kept in the
/// checkpoint; AdamW (lr 1e-4, betas 0.95 / 0.999, weight decay 1e-6) with a linear
/// warm-up of 500 steps and a cosine decay over the run; an average of the weights (EMA)
/// whose decay warms up as 1 - (1 + k)^-0.75 (k: updates so far minus one) up to
/// `train.ema_decay`, stepped once per optimizer step and with its count in the checkpoint.
///
/// `objective = mse` is the baseline: the same network and data, regressing the action
/// sequence directly (its input a zero sequence at step 0), trained on the squared error.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace anvil {

struct OfflineLoop;  // train/loops/offline.hpp (a layer above; the Trainer includes it)

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

/// What Diffusion Policy's network learns (see diffusion_policy.hpp).
enum class DiffusionObjective { ddpm, mse };
constexpr auto enum_names(DiffusionObjective) { return std::array<std::string_view, 2>{"ddpm", "mse"}; }
/// How actions are sampled at inference.
enum class DiffusionSampler { ddim, ddpm };
constexpr auto enum_names(DiffusionSampler) { return std::array<std::string_view, 2>{"ddim", "ddpm"}; }

/// Algorithm policy: Diffusion Policy, and MSE behaviour cloning on the same network (see
/// file comment).
class DiffusionPolicy {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "diffusion";
  static constexpr bool on_policy = false;
  using Batch = ReplayBatch;
  using loop = OfflineLoop;

  struct Config {
    Param<DiffusionObjective, "objective", "ddpm: denoise action sequences (Diffusion Policy); mse: regress them (BC baseline)">
        objective{DiffusionObjective::ddpm};
    Param<int, "obs_horizon", "observations the policy sees (the latest last)", in_range(1, 64)> obs_horizon{2};
    Param<int, "horizon", "actions predicted per sample", in_range(1, 1024)> horizon{16};
    Param<int, "action_horizon", "predicted actions executed before the policy is asked again", in_range(1, 1024)>
        action_horizon{8};
    Param<int, "train_steps", "diffusion steps of training (DDPM's K)", in_range(1, 10000)> train_steps{100};
    Param<int, "inference_steps", "DDIM steps at inference (diffusion.sampler=ddim)", in_range(1, 10000)> inference_steps{16};
    Param<DiffusionSampler, "sampler", "ddim: inference_steps steps; ddpm: all train_steps"> sampler{DiffusionSampler::ddim};
    Param<double, "ddim_eta", "DDIM's stochasticity (0: deterministic; 1 with all steps: DDPM)", in_range(0, 1)> ddim_eta{0.0};
    Param<bool, "clip_sample", "clip predicted clean samples to [-1, 1]"> clip_sample{true};
    Param<std::vector<int>, "widths", "the U-Net's channels per level", at_least(1)> widths{256, 512, 1024};
    Param<int, "kernel", "the U-Net's convolution width", in_range(1, 31)> kernel{5};
    Param<int, "groups", "GroupNorm groups", in_range(1, 1024)> groups{8};
    Param<int, "step_embed", "diffusion-step embedding width", in_range(2, 4096)> step_embed{256};
    Param<std::int64_t, "batch_size", "windows per gradient step (per rank)", at_least(1)> batch_size{256};
    Param<double, "lr", "AdamW learning rate", positive> lr{1e-4};
    Param<double, "beta1", "AdamW beta1", in_range(0, 1)> beta1{0.95};
    Param<double, "beta2", "AdamW beta2", in_range(0, 1)> beta2{0.999};
    Param<double, "weight_decay", "AdamW decoupled weight decay", at_least(0)> weight_decay{1e-6};
    Param<std::int64_t, "lr_warmup", "optimizer steps of linear learning-rate warm-up", at_least(0)> lr_warmup{500};
    Param<bool, "lr_cosine", "decay the learning rate to 0 along a cosine over the run's remaining updates"> lr_cosine{true};
    Param<double, "ema_power", "EMA warm-up power: decay 1 - (1 + k)^-power up to train.ema_decay (0: constant decay)",
          at_least(0)>
        ema_power{0.75};
    Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)> max_grad_norm{0.0};
    Param<bool, "cuda_graph",
          "on CUDA, capture the update as a CUDA graph and replay it (one process, no loss scaling or gradient "
          "accumulation; false: op by op)">
        cuda_graph{true};

    /// A run of seconds (`run.smoke`): a small U-Net on small batches, a short warm-up.
    void shrink() {
      if (widths->size() > 2 || widths->front() > 16) widths = {16, 32};
      step_embed = std::min(*step_embed, 16);
      batch_size = std::min<std::int64_t>(batch_size, 64);
      lr_warmup = std::min<std::int64_t>(lr_warmup, 20);
    }
  };

  DiffusionPolicy(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), schedule_(cfg.train_steps) {
    if (spec.discrete()) throw ConfigError("DiffusionPolicy: " + spec.name + " has discrete actions; it needs a Box");
    const auto od = spec.obs_dim(), ad = spec.action_dim();
    if (od % cfg.obs_horizon != 0)
      throw ConfigError("diffusion.obs_horizon: " + spec.name + "'s observation has " + std::to_string(od) +
                        " numbers, not a multiple of " + std::to_string(*cfg.obs_horizon) +
                        " (wrap the env in envs::MultiStep with the same horizons)");
    if (ad % cfg.action_horizon != 0)
      throw ConfigError("diffusion.action_horizon: " + spec.name + "'s action has " + std::to_string(ad) +
                        " numbers, not a multiple of " + std::to_string(*cfg.action_horizon) +
                        " (wrap the env in envs::MultiStep with the same horizons)");
    if (cfg.obs_horizon - 1 + cfg.action_horizon > cfg.horizon)
      throw ConfigError("diffusion.horizon: is " + std::to_string(*cfg.horizon) + "; it must hold obs_horizon - 1 + action_horizon = " +
                        std::to_string(cfg.obs_horizon - 1 + cfg.action_horizon) + " actions");
    if (cfg.inference_steps > cfg.train_steps)
      throw ConfigError("diffusion.inference_steps: is " + std::to_string(*cfg.inference_steps) + ", more than diffusion.train_steps (" +
                        std::to_string(*cfg.train_steps) + ")");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than diffusion.batch_size (" +
                        std::to_string(*cfg.batch_size) + "): micro-batches would be empty");
    obs_dim_ = od / cfg.obs_horizon;
    act_dim_ = ad / cfg.action_horizon;
    const auto& box = std::get<Box>(spec.action);
    act_low_ = at::tensor(std::vector<float>(box.low.begin(), box.low.begin() + act_dim_)).to(device_);
    act_high_ = at::tensor(std::vector<float>(box.high.begin(), box.high.begin() + act_dim_)).to(device_);
    nn::Unet1dImpl::Options o;
    o.action_dim = act_dim_;
    o.cond_dim = cfg.obs_horizon * obs_dim_;
    o.widths = std::vector<std::int64_t>(cfg.widths->begin(), cfg.widths->end());
    o.step_embed = cfg.step_embed;
    o.kernel = cfg.kernel;
    o.groups = cfg.groups;
    net_ = nn::Unet1d(o);
    net_->to(device_);
    base_lr_ = cfg.lr * ctx.lr_scale(cfg.batch_size);
    opt_ = FlatAdam(net_->parameters(), {.lr = base_lr_, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8, .weight_decay = cfg.weight_decay});
    set_lr();
    ema_.set_device(device_);
    alpha_bars_ = at::tensor(schedule_.alpha_bars(), at::TensorOptions().dtype(at::kDouble)).to(device_);
  }

  /// The dataset windows this algorithm learns from: observations and actions per sample.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> sequence() const noexcept { return {*cfg_.obs_horizon, *cfg_.horizon}; }

  /// Fits the min-max normalisation to the data's ranges (obs [obs_dim], actions
  /// [act_dim]); a run restored from a checkpoint keeps the checkpoint's.
  void fit_normalizer(const at::Tensor& obs_min, const at::Tensor& obs_max, const at::Tensor& act_min, const at::Tensor& act_max) {
    if (obs_min.numel() != obs_dim_ || act_min.numel() != act_dim_)
      throw ConfigError("DiffusionPolicy: the demonstrations have observations of " + std::to_string(obs_min.numel()) + " and actions of " +
                        std::to_string(act_min.numel()) + " numbers; the env has " + std::to_string(obs_dim_) + " and " +
                        std::to_string(act_dim_));
    obs_norm_ = diffusion::MinMax::fit(obs_min.to(device_), obs_max.to(device_));
    act_norm_ = diffusion::MinMax::fit(act_min.to(device_), act_max.to(device_));
    graphs_.clear();  // they read the old normalisation's tensors
  }
  [[nodiscard]] bool has_normalizer() const noexcept { return obs_norm_.defined(); }

  /// The run's length in updates (for the cosine decay of the learning rate).
  void plan_updates(std::int64_t total) {
    total_updates_ = total;
    set_lr();
  }

  /// Actions for observations [N, obs_horizon * obs_dim] (env units): [N, action_horizon *
  /// act_dim] in the Trainer's normalised units ([-1, 1] over the env's bounds). Sampling
  /// is stochastic in both modes, as the paper evaluates.
  at::Tensor act(const at::Tensor& obs, ActMode /*mode*/) {
    torch::NoGradGuard no_grad;
    const auto seq = predict(obs);  // [N, horizon, act_dim], env units
    const auto chunk = seq.narrow(1, cfg_.obs_horizon - 1, cfg_.action_horizon);
    const auto unit = (chunk - act_low_) / (act_high_ - act_low_) * 2.0 - 1.0;
    return unit.reshape({obs.size(0), -1});
  }

  /// The whole predicted action sequence [N, horizon, act_dim] in env units.
  at::Tensor predict(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    need_normalizer();
    const auto n = obs.size(0);
    const auto cond = obs_norm_.apply(obs.to(device_, at::kFloat).view({n, cfg_.obs_horizon, obs_dim_})).reshape({n, -1});
    at::Tensor x;
    if (*cfg_.objective == DiffusionObjective::mse) {
      x = net_->forward(at::zeros({n, cfg_.horizon, act_dim_}, cond.options()), at::zeros({n}, cond.options().dtype(at::kLong)), cond);
    } else {
      x = at::randn({n, cfg_.horizon, act_dim_}, cond.options());
      const auto steps = *cfg_.sampler == DiffusionSampler::ddpm ? ddpm_timesteps() : diffusion::ddim_timesteps(cfg_.train_steps, cfg_.inference_steps);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const int t = steps[i];
        const int prev = i + 1 < steps.size() ? steps[i + 1] : -1;
        const auto eps = net_->forward(x, at::full({n}, t, cond.options().dtype(at::kLong)), cond).to(at::kFloat);
        const auto z = at::randn_like(x);
        x = *cfg_.sampler == DiffusionSampler::ddpm ? diffusion::ddpm_step(schedule_, x, t, eps, cfg_.clip_sample, z)
                                                   : diffusion::ddim_step(schedule_, x, t, prev, eps, cfg_.clip_sample, cfg_.ddim_eta, z);
      }
    }
    return act_norm_.invert(x.to(at::kFloat));
  }

  /// One optimizer step on a batch of windows: obs [B, obs_horizon * obs_dim] and action
  /// [B, horizon * act_dim], in env units. With gradient accumulation the batch is split
  /// into the context's micro-batches, whose weighted gradients are summed before the step.
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    need_normalizer();
    if (cuda::kCudaGraphs && cfg_.cuda_graph && device_.is_cuda() && ctx.graphable()) return graphed_update(b, ctx);
    return eager_update(b, ctx);
  }

  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }

 private:
  // The update op by op (what `update` runs when no graph holds it).
  UpdateInfo eager_update(const ReplayBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    double loss_sum = 0;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      const auto obs = whole ? b.obs : b.obs.narrow(0, part.begin, part.rows);
      const auto act = whole ? b.action : b.action.narrow(0, part.begin, part.rows);
      double l = 0;
      auto g = ctx.gradient(loss(obs, act, ctx, l), opt_);
      if (whole) grad = std::move(g);
      else if (!grad.defined()) grad = g * part.share;
      else grad.add_(g, part.share);
      loss_sum += part.share * l;
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    ++updates_;
    set_lr();
    UpdateInfo info;
    info.metrics = {{"loss", loss_sum}, {"lr", opt_.lr()}};
    return info;
  }

 public:
  /// The training loss of (obs, action) windows in env units (DDPM: the noise's squared
  /// error at random steps; mse: the actions'); `value` gets its float. DDPM's noise
  /// [B, horizon, act_dim] and steps [B] are drawn here unless given.
  at::Tensor loss(const at::Tensor& obs, const at::Tensor& action, StepContext& ctx, double& value,
                  const at::Tensor& given_noise = {}, const at::Tensor& given_k = {}) {
    const auto n = obs.size(0);
    const auto cond = obs_norm_.apply(obs.to(device_, at::kFloat).view({n, cfg_.obs_horizon, obs_dim_})).reshape({n, -1});
    const auto x0 = act_norm_.apply(action.to(device_, at::kFloat).view({n, cfg_.horizon, act_dim_}));
    at::Tensor l;
    {
      auto guard = ctx.autocast();
      if (*cfg_.objective == DiffusionObjective::mse) {
        const auto pred = net_->forward(at::zeros_like(x0), at::zeros({n}, x0.options().dtype(at::kLong)), cond).to(at::kFloat);
        l = (pred - x0).square().mean();
      } else {
        const auto noise = given_noise.defined() ? given_noise : at::randn_like(x0);
        const auto k = given_k.defined() ? given_k : at::randint(cfg_.train_steps, {n}, x0.options().dtype(at::kLong));
        const auto xk = diffusion::add_noise(alpha_bars_, x0, noise, k);
        const auto pred = net_->forward(xk, k, cond).to(at::kFloat);
        l = (pred - noise).square().mean();
      }
    }
    if (!ctx.capturing()) value = l.item().toDouble();
    return l;
  }

  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  /// Unused (no bootstrapping); the offline loop asks every algorithm for one.
  [[nodiscard]] double discount() const noexcept { return 0.99; }

  /// Moves the average towards the weights, with the warm-up of the paper's EMA (see file
  /// comment); `decay` (train.ema_decay) is its ceiling.
  void ema_update(double decay) {
    ema_.update(opt_.parameters().flat(), diffusion::ema_warmup_decay(ema_.updates(), cfg_.ema_power, decay));
  }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"diffusion", opt_.lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const { return {{"denoiser", opt_.parameters().flat()}}; }

  /// State protocol: the network with its AdamW state, the update count, the average (with
  /// its update count, which sets the EMA's warm-up), the normalisation.
  struct Saved {
    FlatAdam::Saved opt;
    std::int64_t updates = 0;
    Ema::Saved ema;
    std::array<at::Tensor, 4> norm;
  };
  void save(BinaryWriter& w) const {
    opt_.save(w);
    w.value(updates_);
    ema_.save(w);
    w.value(obs_norm_.defined());
    if (obs_norm_.defined()) {
      write_tensor(w, obs_norm_.scale, "observation scale");
      write_tensor(w, obs_norm_.offset, "observation offset");
      write_tensor(w, act_norm_.scale, "action scale");
      write_tensor(w, act_norm_.offset, "action offset");
    }
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.opt = opt_.read(r, "diffusion denoiser");
    s.updates = r.value<std::int64_t>("diffusion update count");
    s.ema = ema_.read(r, "diffusion averaged parameters", opt_.parameters().flat());
    if (r.value<bool>("diffusion normalisation flag")) {
      const auto o = at::zeros({obs_dim_}), a = at::zeros({act_dim_});
      s.norm = {read_tensor(r, "diffusion observation scale", o), read_tensor(r, "diffusion observation offset", o),
                read_tensor(r, "diffusion action scale", a), read_tensor(r, "diffusion action offset", a)};
    }
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
    if (s.norm[0].defined()) {
      obs_norm_ = {s.norm[0].to(device_), s.norm[1].to(device_)};
      act_norm_ = {s.norm[2].to(device_), s.norm[3].to(device_)};
    }
    graphs_.clear();  // captured again from the restored state (they read the old normalisation's tensors)
    set_lr();
  }

  [[nodiscard]] nn::Unet1d& network() noexcept { return net_; }
  [[nodiscard]] const diffusion::NoiseSchedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] const Ema& ema() const noexcept { return ema_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return obs_dim_; }
  [[nodiscard]] std::int64_t act_dim() const noexcept { return act_dim_; }

 private:
  [[nodiscard]] std::vector<int> ddpm_timesteps() const {
    std::vector<int> ts;
    for (int t = cfg_.train_steps - 1; t >= 0; --t) ts.push_back(t);
    return ts;
  }
  void need_normalizer() const {
    if (!obs_norm_.defined())
      throw Error("DiffusionPolicy: no normalisation yet: train on demonstrations (buffers/demo_dataset.hpp) or load a checkpoint first");
  }
  // Linear warm-up, then (lr_cosine) a cosine decay to 0 at the run's last update.
  void set_lr() {
    const double k = static_cast<double>(updates_);
    const double w = static_cast<double>(*cfg_.lr_warmup);
    double f = 1.0;
    if (k < w) f = (k + 1.0) / (w + 1.0);
    else if (cfg_.lr_cosine && total_updates_ > 0) {
      const double span = std::max(1.0, static_cast<double>(total_updates_) - w);
      f = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, (k - w) / span)));
    }
    opt_.set_lr(base_lr_ * f);
  }

  // The update from a CUDA graph (optim/graphed_update.hpp), one per batch size. DDPM's
  // noise and steps are drawn outside the graph in the order `loss` draws them, so a run
  // draws the same numbers with the graph or without.
  UpdateInfo graphed_update(const ReplayBatch& b, StepContext& ctx) {
    const auto n = b.obs.size(0);
    auto& g = graphs_.of(n, device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = eager_update(b, ctx); });
      return info;
    }
    at::Tensor noise, k;
    if (*cfg_.objective == DiffusionObjective::ddpm) {
      const auto o = at::TensorOptions().device(device_);
      noise = at::randn({n, cfg_.horizon, act_dim_}, o);
      k = at::randint(cfg_.train_steps, {n}, o.dtype(at::kLong));
    }
    // The batch may be on the host (the demonstration loader's): its fixed inputs are float32
    // on the device, and the replay's copy moves it there (a copy from the host inside the
    // graph would be captured).
    const std::vector<at::Tensor> values{b.obs, b.action, noise, k};
    opt_.sync_device_state();
    if (!g.update.captured()) {
      auto& u = g.update;
      const auto on_device = at::TensorOptions().device(device_).dtype(at::kFloat);
      const auto obs = u.input(b.obs.sizes(), on_device), act = u.input(b.action.sizes(), on_device);
      const auto in_noise = u.input(noise), in_k = u.input(k);
      u.capture(ctx, "diffusion", [&] {
        double unused = 0;
        const auto l = loss(obs, act, ctx, unused, in_noise, in_k);
        ctx.apply(opt_, ctx.gradient(l, opt_), cfg_.max_grad_norm);
        g.out = l.detach().to(at::kDouble);
      });
    }
    graphs_.replay(g, values);
    opt_.count_step();
    ctx.count_steps(1);
    ++updates_;
    const double value = g.out.item<double>();
    set_lr();
    UpdateInfo info;
    info.metrics = {{"loss", value}, {"lr", opt_.lr()}};
    return info;
  }

  Config cfg_;
  c10::Device device_;
  diffusion::NoiseSchedule schedule_;
  std::int64_t obs_dim_ = 0, act_dim_ = 0;
  at::Tensor act_low_, act_high_;
  nn::Unet1d net_{nullptr};
  double base_lr_ = 0;
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  std::int64_t total_updates_ = 0;
  at::Tensor alpha_bars_;            // the schedule's alpha-bars on the device (float64)
  GraphedUpdates<at::Tensor> graphs_;  // CUDA graphs of the update by batch rows; their output is the loss
  Ema ema_;
  diffusion::MinMax obs_norm_, act_norm_;
};

}  // namespace anvil
// ---- end <anvil/algorithms/diffusion_policy.hpp> ----
// ---- begin <anvil/algorithms/ppo.hpp> ----
/// @file
/// Proximal Policy Optimization (Schulman, Wolski, Dhariwal, Radford, Klimov 2017,
/// "Proximal Policy Optimization Algorithms"): the clipped surrogate objective, a value
/// loss (optionally clipped), an entropy bonus, gradient-norm clipping, a learning rate
/// annealed linearly to zero, and an early stop of the epochs when the policy moves too far
/// from the one that collected the rollout (target KL).
///
/// A categorical policy for `Discrete` actions, a Gaussian with a state-independent log
/// standard deviation for `Box` actions, both on separate actor and critic MLPs.
/// Defaults are the paper's MuJoCo settings (Adam 3e-4, 10 epochs, minibatches of 64,
/// gamma 0.99, clip 0.2; lambda 0.95 and 2048 steps are the RolloutBuffer's) with the
/// details of its reference implementation: orthogonal initialisation (gain sqrt 2, 0.01
/// on the policy head, 1 on the value head), Adam's epsilon 1e-5, gradient norm 0.5, value
/// loss coefficient 0.5 (Huang et al. 2022, "The 37 Implementation Details of PPO").
///
/// Continuous actions are in the Trainer's normalised units: the Trainer clips them to
/// [-1, 1] and scales them to the env's bounds; the rollout keeps the unclipped sample,
/// whose probability the policy gave.

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

// ---- begin <anvil/algorithms/ppo_config.hpp> ----
/// @file
/// PPO's config section (`ppo`), apart from the algorithm (algorithms/ppo.hpp), so a
/// Trainer's config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <cstdint>
#include <vector>


namespace anvil {

/// Shape of PPO's actor and critic MLPs.
struct PpoNetConfig {
  Param<std::vector<int>, "hidden", "hidden layer widths", at_least(1)> hidden{64, 64};
  Param<nn::Activation, "activation", "hidden-layer activation"> activation{nn::Activation::tanh};
};

/// PPO's section (`ppo`).
struct PpoConfig {
  Param<double, "gamma", "discount factor", in_range(0, 1)> gamma{0.99};
  Param<double, "lr", "learning rate (Adam) of actor and critic", positive> lr{3e-4};
  Param<bool, "anneal_lr", "decay the learning rate linearly to 0 over train.steps"> anneal_lr{true};
  Param<int, "epochs", "passes over each rollout", in_range(1, 1000)> epochs{10};
  Param<std::int64_t, "minibatch_size", "rollout rows per gradient step (per rank)", at_least(1)>
      minibatch_size{64};
  Param<double, "clip", "clip range of the probability ratio", positive> clip{0.2};
  Param<double, "clip_value", "clip the value's change to +-this in the value loss (0: off)", at_least(0)>
      clip_value{0.0};
  Param<double, "vf_coef", "weight of the value loss", at_least(0)> vf_coef{0.5};
  Param<double, "ent_coef", "weight of the entropy bonus", at_least(0)> ent_coef{0.0};
  Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)> max_grad_norm{0.5};
  Param<double, "target_kl",
        "stop a rollout's epochs once the mean approximate KL of an epoch exceeds this (0: off)", at_least(0)>
      target_kl{0.0};
  Param<double, "adam_eps", "Adam's epsilon", positive> adam_eps{1e-5};
  Param<double, "init_log_std", "initial log standard deviation of continuous actions"> init_log_std{0.0};
  Param<bool, "ortho_init", "orthogonal initialisation of the layers (gain sqrt 2; heads 0.01 and 1)">
      ortho_init{true};
  Param<bool, "manual_backward",
        "hand-written passes for the default networks in float32 on the CPU: acting and updates without "
        "LibTorch ops (false: autograd; same result, slower)">
      manual_backward{true};
  Section<"actor", PpoNetConfig> actor;
  Section<"critic", PpoNetConfig> critic;
};

class PPO;  // algorithms/ppo.hpp

template <>
struct policy_config<PPO> {
  using type = PpoConfig;
  static constexpr FixedString section = "ppo";
};

}  // namespace anvil
// ---- end <anvil/algorithms/ppo_config.hpp> ----
// ---- begin <anvil/algorithms/ppo_manual.hpp> ----
/// @file
/// PPO's CPU backend (`ppo.manual_backward`): acting and the loss's gradient with
/// hand-written arithmetic over the MLPs' tapes (nn/manual_mlp.hpp), the same as autograd's
/// (ties of max and the bounds of clamp included), into the flat gradient the optimizer
/// reads. Gaussian (a log standard deviation given) or categorical policies; float32 on
/// the CPU.

#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>


namespace anvil::detail {

/// The parts of PPO's loss, for logs: means over a (micro-)batch.
struct PpoLosses {
  double policy = 0, value = 0, entropy = 0, approx_kl = 0, clip_fraction = 0;
  void add(const PpoLosses& o, double w) {
    policy += w * o.policy;
    value += w * o.value;
    entropy += w * o.entropy;
    approx_kl += w * o.approx_kl;
    clip_fraction += w * o.clip_fraction;
  }
};

/// PPO's hand-written path: tapes for acting and for updates (so a rollout can be
/// collected while an update runs), and the flat gradient with each parameter's view.
class PpoManual {
 public:
  PpoManual(const FlatParameters& fp, const nn::Mlp& actor, const at::Tensor& log_std, const nn::Mlp& critic)
      : grad(fp.new_gradient()),
        actor_grads(fp.views_of(grad, actor->parameters())),
        critic_grads(fp.views_of(grad, critic->parameters())) {
    if (log_std.defined()) log_std_grad = fp.slice_for(grad, log_std);
  }

  /// mean + exp(log_std) * noise, with the noise drawn as `randn_like(mean)` (the same draws
  /// as the autograd path), and when `log_prob` is given each row's log-density into it.
  at::Tensor sample(const at::Tensor& mean, const at::Tensor& log_std, at::Tensor* log_prob) const {
    const std::int64_t n = mean.size(0), ad = mean.size(1);
    auto action = at::randn({n, ad}, mean.options());
    const float *m = mean.data_ptr<float>(), *ls = log_std.data_ptr<float>();
    float* a = action.data_ptr<float>();
    float* lp = log_prob ? log_prob->data_ptr<float>() : nullptr;
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    std::vector<float> sd(static_cast<std::size_t>(ad)), inv_sd(sd.size());  // exp(+-log_std), per column
    for (std::size_t j = 0; j < sd.size(); ++j) {
      sd[j] = std::exp(ls[j]);
      inv_sd[j] = std::exp(-ls[j]);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      float sum = 0.f;
      for (std::int64_t j = 0; j < ad; ++j) {
        const auto c = static_cast<std::size_t>(j);
        const float eps = a[i * ad + j];
        const float x = m[i * ad + j] + sd[c] * eps;
        a[i * ad + j] = x;
        const float z = (x - m[i * ad + j]) * inv_sd[c];
        sum += -0.5f * z * z - ls[j] - kHalfLog2Pi;
      }
      if (lp) lp[i] = sum;
    }
    return action;
  }

  /// Actions drawn from the softmax of `logits` [N, K] by `multinomial` (the autograd path's
  /// draws), with each one's log-probability into `log_prob` when given.
  at::Tensor categorical(const at::Tensor& logits, at::Tensor* log_prob) const {
    const std::int64_t n = logits.size(0), k = logits.size(1);
    auto lsm = at::empty({n, k}, logits.options());
    log_softmax_rows(logits.data_ptr<float>(), lsm.data_ptr<float>(), n, k);
    auto action = at::multinomial(lsm.exp(), 1).view({n});
    if (log_prob) {
      const float* l = lsm.data_ptr<float>();
      const std::int64_t* a = action.data_ptr<std::int64_t>();
      float* lp = log_prob->data_ptr<float>();
      for (std::int64_t i = 0; i < n; ++i) lp[i] = l[i * k + a[i]];
    }
    return action;
  }
  static void log_softmax_rows(const float* x, float* y, std::int64_t n, std::int64_t k) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * k;
      float m = xi[0];
      for (std::int64_t j = 1; j < k; ++j) m = std::max(m, xi[j]);
      float sum = 0.f;
      for (std::int64_t j = 0; j < k; ++j) sum += std::exp(xi[j] - m);
      const float lse = m + std::log(sum);
      for (std::int64_t j = 0; j < k; ++j) y[i * k + j] = xi[j] - lse;
    }
  }

  /// The gradient of PPO's loss, written out by hand (the same arithmetic as autograd's, ties
  /// of max and the bounds of clamp included), into the flat gradient buffer; the loss's
  /// parts in `out`. Gaussian (`log_std` given) or categorical policies.
  at::Tensor gradient(const nn::MlpImpl& actor, const nn::MlpImpl& critic, const at::Tensor& log_std, const PpoConfig& cfg,
                      const RolloutBatch& batch, PpoLosses& out) {
    torch::NoGradGuard no_grad;
    PpoManual& mt = *this;
    const bool discrete = !log_std.defined();
    const auto obs = batch.obs.contiguous(), action = batch.action.contiguous();
    const auto old_lp = batch.log_prob.contiguous(), adv = batch.advantage.contiguous();
    const auto ret = batch.returns.contiguous(), old_v = batch.value.contiguous();
    const auto& mean_t = mt.update_actor.forward(actor, obs);  // Gaussian means or logits
    const std::int64_t n = obs.size(0), ad = mean_t.size(1);
    const float* mean = mean_t.data_ptr<float>();
    const float* v = mt.update_critic.forward(critic, obs).data_ptr<float>();
    if (!mt.dmean.defined() || mt.dmean.size(0) != n) {
      mt.dmean = at::empty({n, ad}, obs.options());
      mt.dv = at::empty({n, 1}, obs.options());
      if (discrete) mt.lsm = at::empty({n, ad}, obs.options());
    }
    float *dm = mt.dmean.data_ptr<float>(), *dv = mt.dv.data_ptr<float>();
    float* dls = discrete ? nullptr : mt.log_std_grad.data_ptr<float>();
    const float* ls = discrete ? nullptr : log_std.data_ptr<float>();
    const float* a = discrete ? nullptr : action.data_ptr<float>();
    const std::int64_t* ai = discrete ? action.data_ptr<std::int64_t>() : nullptr;
    float* lsm = discrete ? mt.lsm.data_ptr<float>() : nullptr;
    if (discrete) log_softmax_rows(mean, lsm, n, ad);
    const float *olp = old_lp.data_ptr<float>(), *A = adv.data_ptr<float>();
    const float *R = ret.data_ptr<float>(), *V = old_v.data_ptr<float>();
    const float c = static_cast<float>(*cfg.clip), lo = 1.0f - c, hi = 1.0f + c;
    const float cv = static_cast<float>(*cfg.clip_value), vf = static_cast<float>(*cfg.vf_coef);
    const float ent = static_cast<float>(*cfg.ent_coef);
    const float inv_n = 1.0f / static_cast<float>(n);
    constexpr float kHalfLog2Pi = 0.91893853320467274178f;
    std::vector<float> inv_s(discrete ? 0 : static_cast<std::size_t>(ad));
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(inv_s.size()); ++j) {
      inv_s[static_cast<std::size_t>(j)] = std::exp(-ls[j]);
      dls[j] = 0.f;
    }
    std::vector<float> pr(discrete ? static_cast<std::size_t>(ad) : 0);  // a row's probabilities
    double policy = 0, value = 0, kl = 0, clipped = 0, entropy = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float lp = 0.f, h = 0.f;
      if (discrete) {
        lp = lsm[i * ad + ai[i]];
        for (std::int64_t j = 0; j < ad; ++j) {
          pr[static_cast<std::size_t>(j)] = std::exp(lsm[i * ad + j]);
          h -= pr[static_cast<std::size_t>(j)] * lsm[i * ad + j];
        }
        entropy += h;
      } else {
        for (std::int64_t j = 0; j < ad; ++j) {
          const float z = (a[i * ad + j] - mean[i * ad + j]) * inv_s[static_cast<std::size_t>(j)];
          lp += -0.5f * z * z - ls[j] - kHalfLog2Pi;
        }
      }
      const float log_ratio = lp - olp[i], r = std::exp(log_ratio);
      const float rc = std::min(std::max(r, lo), hi);
      const float u = -A[i] * r, w = -A[i] * rc;
      policy += std::max(u, w);
      const float pass = r >= lo && r <= hi ? 1.0f : 0.0f;  // clamp's gradient
      const float g_r = (u > w ? -A[i] : u < w ? -A[i] * pass : 0.5f * (-A[i]) + 0.5f * (-A[i] * pass)) * inv_n;
      const float g_lp = g_r * r;
      if (discrete) {
        // d log p_a / d z_j = [j = a] - p_j; d H / d z_j = -p_j (log p_j + H), weighed by -ent / n
        for (std::int64_t j = 0; j < ad; ++j) {
          const float p = pr[static_cast<std::size_t>(j)];
          dm[i * ad + j] = g_lp * ((j == ai[i] ? 1.0f : 0.0f) - p) + ent * inv_n * p * (lsm[i * ad + j] + h);
        }
      } else {
        for (std::int64_t j = 0; j < ad; ++j) {
          const float is = inv_s[static_cast<std::size_t>(j)];
          const float z = (a[i * ad + j] - mean[i * ad + j]) * is;
          dm[i * ad + j] = g_lp * z * is;
          dls[j] += g_lp * (z * z - 1.0f);
        }
      }
      kl += static_cast<double>((r - 1.0f) - log_ratio);
      clipped += std::abs(r - 1.0f) > c ? 1.0 : 0.0;
      const float e = v[i] - R[i];
      if (cv > 0) {
        const float d = v[i] - V[i], dc = std::min(std::max(d, -cv), cv);
        const float e2 = V[i] + dc - R[i];
        const float s1 = e * e, s2 = e2 * e2;
        value += 0.5 * std::max(s1, s2);
        const float pass_v = d >= -cv && d <= cv ? 1.0f : 0.0f;
        const float g1 = e, g2 = e2 * pass_v;
        dv[i] = vf * inv_n * (s1 > s2 ? g1 : s1 < s2 ? g2 : 0.5f * (g1 + g2));
      } else {
        value += 0.5 * static_cast<double>(e * e);
        dv[i] = vf * inv_n * e;
      }
    }
    if (!discrete) {
      for (std::int64_t j = 0; j < ad; ++j) {
        entropy += static_cast<double>(ls[j]) + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi));
        dls[j] -= ent;
      }
      entropy *= static_cast<double>(n);  // the same for every row
    }
    mt.update_actor.backward(actor, mt.dmean, &mt.actor_grads, nullptr);
    mt.update_critic.backward(critic, mt.dv, &mt.critic_grads, nullptr);
    const double dn = static_cast<double>(n);
    out.policy = policy / dn;
    out.value = value / dn;
    out.entropy = entropy / dn;
    out.approx_kl = kl / dn;
    out.clip_fraction = clipped / dn;
    return mt.grad;
  }

  nn::MlpTape act_actor, act_critic;  ///< acting (rollouts, evaluation)

 private:
  nn::MlpTape update_actor, update_critic;
  at::Tensor grad, log_std_grad, dmean, dv, lsm;
  std::vector<at::Tensor> actor_grads, critic_grads;
};

}  // namespace anvil::detail
// ---- end <anvil/algorithms/ppo_manual.hpp> ----

namespace anvil {

/// Algorithm policy: PPO (see file comment).
class PPO {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "ppo";
  static constexpr bool on_policy = true;
  using Batch = RolloutBatch;

  /// Its config section (algorithms/ppo_config.hpp) and its networks' shape.
  using Config = PpoConfig;
  using NetConfig = PpoNetConfig;

  PPO(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), discrete_(spec.discrete()),
        act_dim_(spec.discrete() ? spec.num_actions() : spec.action_dim()) {
    if (discrete_ && act_dim_ < 2)
      throw ConfigError("PPO: " + spec.name + " has " + std::to_string(act_dim_) + " discrete action(s); needs 2 or more");
    if (ctx.micro_batches > cfg.minibatch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than " +
                        std::string(config_section.view()) + ".minibatch_size (" + std::to_string(*cfg.minibatch_size) +
                        "): micro-batches would be empty");
    const auto od = spec.obs_dim();
    actor_ = nn::Mlp(od, nn::widths(cfg.actor->hidden), act_dim_, cfg.actor->activation);
    critic_ = nn::Mlp(od, nn::widths(cfg.critic->hidden), 1, cfg.critic->activation);
    if (cfg.ortho_init) {
      init_orthogonal(actor_, 0.01);
      init_orthogonal(critic_, 1.0);
    }
    actor_->to(device_);
    critic_->to(device_);
    std::vector<at::Tensor> params = actor_->parameters();
    if (!discrete_) {
      log_std_ = torch::full({act_dim_}, *cfg.init_log_std, at::TensorOptions().device(device_).requires_grad(true));
      params.push_back(log_std_);
    }
    for (const auto& p : critic_->parameters()) params.push_back(p);
    base_lr_ = cfg.lr * ctx.lr_scale(cfg.minibatch_size);
    opt_ = FlatAdam(std::move(params), {.lr = base_lr_, .eps = cfg.adam_eps});
    ema_.set_device(device_);
    if (cfg.manual_backward && device_.is_cpu() && nn::MlpTape::supports(*actor_) &&
        nn::MlpTape::supports(*critic_))
      manual_ = std::make_unique<detail::PpoManual>(opt_.parameters(), actor_, log_std_, critic_);
  }

  /// Actions for a batch of observations: sampled to explore, the mode (argmax or mean)
  /// when deterministic. Discrete: int64 [N]; continuous: float [N, act_dim].
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      const auto& out = manual_->act_actor.forward(*actor_, o);
      if (discrete_) return mode == ActMode::explore ? manual_->categorical(out, nullptr) : out.argmax(-1);
      if (mode != ActMode::explore) return out.clone();
      return manual_->sample(out, log_std_, nullptr);
    }
    const auto out = actor_->forward(obs.to(device_, at::kFloat));
    if (discrete_) return mode == ActMode::explore ? sample_categorical(out) : out.argmax(-1);
    return mode == ActMode::explore ? out + log_std_.exp() * at::randn_like(out) : out;
  }

  /// A sampled action with its log-probability and the value of `obs`, for the rollout.
  RolloutAct act_for_rollout(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      RolloutAct r;
      r.log_prob = at::empty({o.size(0)}, o.options());
      const auto& out = manual_->act_actor.forward(*actor_, o);
      r.action = discrete_ ? manual_->categorical(out, &r.log_prob) : manual_->sample(out, log_std_, &r.log_prob);
      r.value = manual_->act_critic.forward(*critic_, o).view({o.size(0)}).clone();
      return r;
    }
    const auto o = obs.to(device_, at::kFloat);
    const auto out = actor_->forward(o);
    RolloutAct r;
    if (discrete_) {
      r.action = sample_categorical(out);
      r.log_prob = out.log_softmax(-1).gather(-1, r.action.unsqueeze(-1)).squeeze(-1);
    } else {
      r.action = out + log_std_.exp() * at::randn_like(out);
      r.log_prob = gaussian_log_prob(out, r.action);
    }
    r.value = critic_->forward(o).squeeze(-1);
    return r;
  }

  /// Value estimates [N] of observations (no gradients).
  at::Tensor value(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    if (manual_) {
      const auto o = obs.to(device_, at::kFloat).contiguous();
      return manual_->act_critic.forward(*critic_, o).view({o.size(0)}).clone();
    }
    return critic_->forward(obs.to(device_, at::kFloat)).squeeze(-1);
  }

  /// One gradient step on a minibatch: clipped surrogate + vf_coef * value loss -
  /// ent_coef * entropy. With gradient accumulation the minibatch is split into the
  /// context's micro-batches and their weighted gradients summed before one step.
  UpdateInfo update(const RolloutBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    Losses sum;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      Losses l;
      const RolloutBatch& mb = whole ? b : slice(b, part.begin, part.rows);
      auto g = manual_ && !ctx.autocasts() ? manual_->gradient(*actor_, *critic_, log_std_, cfg_, mb, l)
                                            : ctx.gradient(losses(mb, ctx, l), opt_);
      if (whole) grad = std::move(g);
      else if (!grad.defined()) grad = g * part.share;
      else grad.add_(g, part.share);
      sum.add(l, part.share);
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    ++updates_;
    epoch_kl_ += sum.approx_kl;
    ++epoch_minibatches_;
    UpdateInfo info;
    info.metrics = {{"policy_loss", sum.policy},       {"value_loss", sum.value},
                    {"entropy", sum.entropy},          {"approx_kl", sum.approx_kl},
                    {"clip_fraction", sum.clip_fraction}};
    if (!discrete_) {  // the mean standard deviation of the actions
      double std_mean = 0;
      if (log_std_.device().is_cpu() && log_std_.scalar_type() == at::kFloat) {  // no ops for a host value
        const float* ls = log_std_.data_ptr<float>();
        for (std::int64_t j = 0; j < act_dim_; ++j) std_mean += std::exp(static_cast<double>(ls[j])) / static_cast<double>(act_dim_);
      } else {
        std_mean = log_std_.detach().exp().mean().item().toDouble();
      }
      info.metrics.emplace_back("action_std", std_mean);
    }
    return info;
  }

  /// Ends an epoch over the rollout: whether to run another. With `target_kl` set, the
  /// epochs stop once the epoch's mean approximate KL between the policy that collected the
  /// rollout and the current one, averaged over the ranks (so every rank stops at the same
  /// epoch), exceeds it.
  bool end_epoch(StepContext& ctx) {
    const double kl = epoch_minibatches_ > 0 ? epoch_kl_ / epoch_minibatches_ : 0.0;
    const bool any = epoch_minibatches_ > 0;
    epoch_kl_ = 0;
    epoch_minibatches_ = 0;
    if (!(cfg_.target_kl > 0) || !any) return true;
    return ctx.mean_over_ranks(kl) <= cfg_.target_kl;
  }

  /// Where the run is, as the fraction of train.steps done: anneals the learning rate.
  void set_progress(double done) {
    if (cfg_.anneal_lr) opt_.set_lr(base_lr_ * std::clamp(1.0 - done, 0.0, 1.0));
  }
  [[nodiscard]] int epochs() const noexcept { return cfg_.epochs; }
  [[nodiscard]] std::int64_t minibatch_size() const noexcept { return cfg_.minibatch_size; }
  [[nodiscard]] double target_kl() const noexcept { return cfg_.target_kl; }
  /// The discount (the rollout's advantages, a reward normaliser's return).
  [[nodiscard]] double discount() const noexcept { return cfg_.gamma; }

  /// Moves the average of the actor-critic's weights towards the current ones
  /// (`train.ema_decay`; see optim/ema.hpp); evaluation and checkpoints use it.
  void ema_update(double decay) { ema_.update(opt_.parameters().flat(), decay); }
  /// Runs `f` with the averaged weights in place (when there are any), then restores them.
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }

  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"ppo", opt_.lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor_critic", opt_.parameters().flat()}};
  }

  /// State protocol (core/state.hpp): the actor-critic with its Adam state, the update
  /// count, the averaged weights.
  struct Saved {
    FlatAdam::Saved opt;
    std::int64_t updates = 0;
    Ema::Saved ema;
  };
  void save(BinaryWriter& w) const {
    opt_.save(w);
    w.value(updates_);
    ema_.save(w);
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.opt = opt_.read(r, "ppo actor-critic");
    s.updates = r.value<std::int64_t>("ppo update count");
    s.ema = ema_.read(r, "ppo averaged parameters", opt_.parameters().flat());
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
  }

  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  [[nodiscard]] nn::Mlp& critic() noexcept { return critic_; }
  /// Log standard deviation of continuous actions (undefined for discrete ones).
  [[nodiscard]] const at::Tensor& log_std() const noexcept { return log_std_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] bool discrete() const noexcept { return discrete_; }
  /// Whether acting and updates take the hand-written fast path (`manual_backward`).
  [[nodiscard]] bool manual_backward() const noexcept { return manual_ != nullptr; }

 private:
  using Losses = detail::PpoLosses;

  // The loss of a (micro-)batch; its parts reported in `out`.
  at::Tensor losses(const RolloutBatch& b, StepContext& ctx, Losses& out) {
    auto guard = ctx.autocast();
    const auto logits = actor_->forward(b.obs).to(at::kFloat);
    at::Tensor log_prob, entropy;
    if (discrete_) {
      const auto lp = logits.log_softmax(-1);
      log_prob = lp.gather(-1, b.action.unsqueeze(-1)).squeeze(-1);
      entropy = -(lp.exp() * lp).sum(-1);
    } else {
      log_prob = gaussian_log_prob(logits, b.action);
      entropy = (log_std_ + 0.5 * (1.0 + std::log(2.0 * std::numbers::pi))).sum().expand({b.obs.size(0)});
    }
    const auto log_ratio = log_prob - b.log_prob;
    const auto ratio = log_ratio.exp();
    const double c = cfg_.clip;
    const auto policy_loss = at::max(-b.advantage * ratio, -b.advantage * ratio.clamp(1.0 - c, 1.0 + c)).mean();
    const auto v = critic_->forward(b.obs).squeeze(-1).to(at::kFloat);
    at::Tensor value_loss;
    if (cfg_.clip_value > 0) {
      const auto clipped = b.value + (v - b.value).clamp(-*cfg_.clip_value, *cfg_.clip_value);
      value_loss = 0.5 * at::max((v - b.returns).square(), (clipped - b.returns).square()).mean();
    } else {
      value_loss = 0.5 * (v - b.returns).square().mean();
    }
    const auto ent = entropy.mean();
    auto loss = policy_loss + *cfg_.vf_coef * value_loss - *cfg_.ent_coef * ent;
    {
      torch::NoGradGuard no_grad;
      // KL(old || new) estimated as E[(r - 1) - log r], unbiased and never negative.
      out.approx_kl = ((ratio - 1.0) - log_ratio).mean().item().toDouble();
      out.clip_fraction = ((ratio - 1.0).abs() > c).to(at::kFloat).mean().item().toDouble();
      out.policy = policy_loss.item().toDouble();
      out.value = value_loss.item().toDouble();
      out.entropy = ent.item().toDouble();
    }
    return loss;
  }

  at::Tensor gaussian_log_prob(const at::Tensor& mean, const at::Tensor& action) const {
    const auto z = (action - mean) * (-log_std_).exp();
    return (-0.5 * z.square() - log_std_ - 0.5 * std::log(2.0 * std::numbers::pi)).sum(-1);
  }
  static at::Tensor sample_categorical(const at::Tensor& logits) {
    return at::multinomial(logits.softmax(-1), 1).squeeze(-1);
  }
  static RolloutBatch slice(const RolloutBatch& b, std::int64_t begin, std::int64_t n) {
    return {b.obs.narrow(0, begin, n),       b.action.narrow(0, begin, n),  b.log_prob.narrow(0, begin, n),
            b.advantage.narrow(0, begin, n), b.returns.narrow(0, begin, n), b.value.narrow(0, begin, n)};
  }
  // Orthogonal weights with gain sqrt(2) in hidden layers and `head_gain` in the output
  // layer, zero biases.
  static void init_orthogonal(nn::Mlp& net, double head_gain) {
    torch::NoGradGuard no_grad;
    const auto& layers = net->layers();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      torch::nn::init::orthogonal_(layers[i]->weight, i + 1 < layers.size() ? std::sqrt(2.0) : head_gain);
      layers[i]->bias.zero_();
    }
  }

  Config cfg_;
  c10::Device device_;
  bool discrete_;
  std::int64_t act_dim_;  ///< action dimensions, or the number of discrete actions
  nn::Mlp actor_{nullptr}, critic_{nullptr};
  at::Tensor log_std_;
  double base_lr_ = 0;
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  double epoch_kl_ = 0;              ///< approximate KL summed over this epoch's minibatches
  std::int64_t epoch_minibatches_ = 0;
  Ema ema_;                          ///< averaged weights (train.ema_decay)
  std::unique_ptr<detail::PpoManual> manual_;  ///< the hand-written path, when it applies
};

static_assert(OnPolicyAlgorithm<PPO>);

}  // namespace anvil
// ---- end <anvil/algorithms/ppo.hpp> ----

// ---- begin <anvil/train/clock.hpp> ----
/// @file
/// `Clock`: where a run is. Loops advance it; hooks (evaluation, logging, checkpoints,
/// progress) fire on it. It is the same on every rank. Light header.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>


namespace anvil {

/// What a loop's schedule counts: env steps (online loops) or gradient updates (offline
/// loops, which take no env steps while they learn).
enum class ClockUnit { env_steps, updates };
constexpr std::string_view unit_name(ClockUnit u) { return u == ClockUnit::env_steps ? "env steps" : "gradient updates"; }
/// One of `u`, for messages ("at env step 1200").
constexpr std::string_view step_name(ClockUnit u) { return u == ClockUnit::env_steps ? "env step" : "gradient update"; }

/// Where a run is (see file comment).
struct Clock {
  /// Env steps of every rank's envs together (what `train.steps` counts in online loops).
  std::int64_t env_steps = 0;
  /// Gradient updates (each a step of the algorithm's optimizers), the same on every rank.
  std::int64_t updates = 0;
  /// Finished training episodes of every rank's envs, as of the last time the ranks added up
  /// their counts (each log row); episodes since then are in the collector's count.
  std::int64_t episodes = 0;
  /// What `now()` counts: the unit of the loop's schedule and of the hooks' intervals.
  ClockUnit unit = ClockUnit::env_steps;

  /// The count in the loop's unit.
  [[nodiscard]] std::int64_t now() const noexcept { return unit == ClockUnit::env_steps ? env_steps : updates; }
  /// The count in `u`.
  [[nodiscard]] std::int64_t in(ClockUnit u) const noexcept { return u == ClockUnit::env_steps ? env_steps : updates; }

  void save(BinaryWriter& w) const {
    w.value(env_steps);
    w.value(updates);
    w.value(episodes);
  }
  struct Saved {
    std::int64_t env_steps = 0, updates = 0, episodes = 0;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{r.value<std::int64_t>("env steps"), r.value<std::int64_t>("updates"), r.value<std::int64_t>("episodes")};
    if (s.env_steps < 0 || s.updates < 0 || s.episodes < 0) r.fail("clock", "holds a negative count");
    return s;
  }
  void restore(const Saved& s) noexcept {
    env_steps = s.env_steps;
    updates = s.updates;
    episodes = s.episodes;
  }
};

/// When a hook fires: every `every` units of the clock (0: never, except where the hook
/// says, e.g. at the end). Keeps the schedule of a resumed run: the next time is the next
/// multiple of `every` after where the run stands.
class Every {
 public:
  Every() = default;
  explicit Every(std::int64_t every) : every_(every) {}

  /// Starts (or restarts, after a resume) at clock value `now`.
  void start(std::int64_t now) noexcept { next_ = every_ > 0 ? (now / every_ + 1) * every_ : INT64_MAX; }
  /// Whether the hook is due at `now`; when it is, the next time moves past `now`.
  [[nodiscard]] bool due(std::int64_t now) noexcept {
    if (now < next_) return false;
    while (next_ <= now) next_ += every_;
    return true;
  }
  /// The next clock value at which it is due (INT64_MAX: never).
  [[nodiscard]] std::int64_t next() const noexcept { return next_; }
  [[nodiscard]] std::int64_t every() const noexcept { return every_; }

 private:
  std::int64_t every_ = 0;
  std::int64_t next_ = INT64_MAX;
};

}  // namespace anvil
// ---- end <anvil/train/clock.hpp> ----
// ---- begin <anvil/train/compiled_trainer.hpp> ----
/// @file
/// `anvil::compiled::Trainer<A, B[, P, X]>`: a Trainer whose code is compiled once, so that a
/// main using it compiles in seconds. It holds an `anvil::Trainer<A, B, P, X>` (built in
/// `train/compiled_trainer_impl.hpp`) and answers the calls a main makes; its `Config` is
/// that Trainer's, and `anvil::start<compiled::Trainer<...>>` reads the command line exactly
/// as `start<Trainer<...>>` does (same keys, `--help`, `--print-config`, `--multirun`, DDP).
///
/// It trains any env: the env comes through the one door (`envs::AnyEnv`,
/// envs/any_env.hpp), which wraps a program's own env type in the program's translation unit
/// without torch. A main that drives the loop itself has the step-by-step calls (`begin`,
/// `collect`, `update`, `evaluate`, `record_evaluation`, `log`, `save_checkpoint`, `finish`).
///
/// Two ways to build a program that uses it:
///  - link the CMake target `anvil::compiled`: a library of the common Trainers, prebuilt
///    (the list `ANVIL_PREBUILT_TRAINERS` in anvil's CMakeLists.txt); the main includes
///    `<anvil/compiled.hpp>` and none of torch's ATen or `torch/` headers (only a few of c10's
///    small ones). Another combination is built in one translation unit of yours that
///    includes `train/compiled_trainer_impl.hpp` and says `ANVIL_COMPILED_TRAINER(...)`
///    (else the link fails naming the missing `compiled::Trainer` member);
///  - link only `anvil::anvil` (header-only): `<anvil/compiled.hpp>` then brings in the
///    implementation and the same main builds without the library, at a Trainer's full
///    compile cost.
///
/// For everything else a Trainer offers (hooks, the algorithm, the buffer), `full()` returns
/// the Trainer itself, usable where its header is included. Light header.

#include <filesystem>
#include <memory>
#include <string>

// ---- begin <anvil/train/hooks/results.hpp> ----
/// @file
/// What a run reports: an evaluation's returns (`EvalResult`) and a finished run's outcome
/// (`FitResult`). Light header.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace anvil {

/// Mean, spread and range of evaluation returns, the success rate, and each task's.
struct EvalResult {
  double mean = NAN, std = NAN, min = NAN, max = NAN;
  double success = NAN;  ///< the share of episodes that succeeded (NaN: the env does not say)
  int episodes = 0;
  /// The returns and success rate of one task (or agent) of an env that has several.
  struct Group {
    std::string name;
    double mean = NAN;
    int episodes = 0;
    double success = NAN;
  };
  std::vector<Group> groups;  ///< empty when the env has no tasks
};

/// What `fit()` achieved; also written to `summary.json`.
struct FitResult {
  double final_eval_return = NAN;
  double best_eval_return = NAN;
  std::int64_t env_steps = 0;
  std::int64_t updates = 0;
  double wall_seconds = 0.0;
  std::string stopped_by;  ///< empty: the run finished; else e.g. "stopped by SIGTERM"
};

}  // namespace anvil
// ---- end <anvil/train/hooks/results.hpp> ----
// ---- begin <anvil/train/loops/loop_config.hpp> ----
/// @file
/// Loop config fields several loops have, declared once, and the off- and on-policy loops'
/// `train` sections, apart from the loops, so a Trainer's config can be built without torch
/// (`anvil/compiled.hpp`). Light header.

#include <algorithm>
#include <cstdint>
#include <string>


namespace anvil {

/// Config fields several loops have, declared once (each loop's Config lists the ones it has).
namespace loops {
using EnvStepsParam = Param<std::int64_t, "steps", "env steps to train for (all envs together)", at_least(1)>;
using UpdateStepsParam = Param<std::int64_t, "steps", "gradient updates to train for", at_least(1)>;
using LearningStartsParam =
    Param<std::int64_t, "learning_starts", "env steps of uniform random actions before learning", at_least(0)>;
using GradAccumulationParam =
    Param<int, "grad_accumulation", "micro-batches per optimizer step: the batch's gradient is accumulated over k parts (memory)",
          at_least(1)>;
using EmaDecayParam = Param<double, "ema_decay",
                            "exponential moving average of the policy's weights after each update, used to evaluate "
                            "and in policy.bin (0: off; e.g. 0.995)",
                            Range{.lo = 0, .hi = 1, .hi_open = true}>;
using LrScalingParam =
    Param<LrScaling, "lr_scaling", "none; sqrt: lr*sqrt(batch/base_batch); linear: lr*world_size">;
using BaseBatchParam =
    Param<int, "base_batch", "batch size the learning rates were tuned for (sqrt scaling)", at_least(1)>;
using EvalIntervalParam =
    Param<std::int64_t, "eval_interval", "env steps between evaluations (0: only at the end)", at_least(0)>;
using EvalUpdatesParam =
    Param<std::int64_t, "eval_interval", "gradient updates between evaluations (0: only at the end)", at_least(0)>;
using EvalEpisodesParam = Param<int, "eval_episodes", "episodes per evaluation, deterministic actions", at_least(1)>;

/// What every loop's `shrink` (`run.smoke`, a run of seconds) does to its stage: at most
/// `steps` of it, no evaluation before its end, and two episodes in that one.
template <class C>
void shrink_stage(C& c, std::int64_t steps) {
  c.steps = std::min<std::int64_t>(c.steps, steps);
  c.eval_interval = 0;
  c.eval_episodes = std::min(*c.eval_episodes, 2);
}

/// The `train` section of an off-policy run.
struct OffPolicyConfig {
  loops::EnvStepsParam steps{100'000};
  loops::LearningStartsParam learning_starts{1000};
  Param<int, "update_interval", "env steps (of this rank) between rounds of updates", at_least(1)> update_interval{1};
  Param<int, "updates_per_interval", "gradient updates per round (update-to-data ratio)", at_least(1)>
      updates_per_interval{1};
  loops::GradAccumulationParam grad_accumulation{1};
  loops::EmaDecayParam ema_decay{0.0};
  loops::LrScalingParam lr_scaling{LrScaling::none};
  loops::BaseBatchParam base_batch{256};
  loops::EvalIntervalParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run that could never update is refused.
  void validate() const {
    if (learning_starts >= steps)
      throw ConfigError("train.learning_starts (" + std::to_string(*learning_starts) + ") is not below train.steps (" +
                        std::to_string(*steps) + "): the run would end before its first update");
  }

  /// A run of seconds (`run.smoke`): enough steps to pass the warm-up and update a little.
  void shrink() {
    shrink_stage(*this, 600);
    learning_starts = std::min<std::int64_t>(learning_starts, 200);
  }
};

/// The `train` section of an on-policy run (and of an episodic one): no warm-up and no
/// update schedule, since the algorithm learns once per rollout (or round of episodes) from
/// its own actions.
struct OnPolicyConfig {
  loops::EnvStepsParam steps{100'000};
  loops::GradAccumulationParam grad_accumulation{1};
  loops::EmaDecayParam ema_decay{0.0};
  loops::LrScalingParam lr_scaling{LrScaling::none};
  loops::BaseBatchParam base_batch{256};
  loops::EvalIntervalParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run of seconds (`run.smoke`).
  void shrink() { shrink_stage(*this, 600); }
};

/// The `train` section of an offline run; its counts are gradient updates.
struct OfflineConfig {
  loops::UpdateStepsParam steps{100'000};
  Param<std::string, "dataset",
        "buffer file to learn from (a run's checkpoint-*.buffer; empty: the buffer as the stages before left it)">
      dataset{""};
  loops::GradAccumulationParam grad_accumulation{1};
  loops::EmaDecayParam ema_decay{0.0};
  loops::LrScalingParam lr_scaling{LrScaling::none};
  loops::BaseBatchParam base_batch{256};
  loops::EvalUpdatesParam eval_interval{5000};
  loops::EvalEpisodesParam eval_episodes{10};

  /// A run of seconds (`run.smoke`).
  void shrink() { shrink_stage(*this, 200); }
};

}  // namespace loops

struct OffPolicyLoop;  // train/loops/off_policy.hpp
struct OnPolicyLoop;   // train/loops/on_policy.hpp

template <>
struct policy_config<OffPolicyLoop> {
  using type = loops::OffPolicyConfig;
  static constexpr FixedString section = "train";
};
template <>
struct policy_config<OnPolicyLoop> {
  using type = loops::OnPolicyConfig;
  static constexpr FixedString section = "train";
};

}  // namespace anvil
// ---- end <anvil/train/loops/loop_config.hpp> ----
// ---- begin <anvil/train/trainer_config.hpp> ----
/// @file
/// `TrainerConfig<A, B, P, X, L>`: every knob of a run, one section per policy, keys
/// `<section>.<field>`; a Trainer's `Config`. Its sections are named through
/// `policy_config` (core/policy_config.hpp), so a program can build it, set its defaults and
/// pass it to a prebuilt Trainer without the policies' classes or torch
/// (`anvil/compiled.hpp`). Light header.

#include <concepts>
#include <array>
#include <string>
#include <string_view>

// ---- begin <anvil/train/run_config.hpp> ----
/// @file
/// The `run` section: where and how a run executes, what it writes and when. The `train`
/// section belongs to the run's loop (train/loops/). Light header.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>


namespace anvil {

/// How progress is shown: a live bar on a terminal, periodic lines otherwise.
enum class ProgressMode { auto_, bar, lines, off };
constexpr auto enum_names(ProgressMode) {
  return std::array<std::string_view, 4>{"auto", "bar", "lines", "off"};
}

/// The `run` section; its keys may be written without the section (`--seed=3`).
struct RunConfig {
  Param<std::uint64_t, "seed", "seed of torch, every env, the buffer and exploration"> seed{0};
  Param<std::string, "device", "cpu, cuda, cuda:N, or auto (CUDA when present)"> device{"auto"};
  Param<std::string, "run_dir", "where logs go (empty: runs/<algorithm>-<env>-<time>)"> run_dir{""};
  Param<int, "threads", "intra-op threads of torch (1 is fastest for small nets on CPU)",
        in_range(1, 1024)>
      threads{1};
  Param<int, "update_threads",
        "threads computing an update's independent gradients at once (CPU; SAC: critic and "
        "actor; 0: 2 when each process may use 2 cores: its affinity and CPU quota)",
        in_range(0, 64)>
      update_threads{0};
  Param<std::int64_t, "log_interval",
        "env steps between log lines and CSV rows (gradient updates in an offline loop)", at_least(1)>
      log_interval{1000};
  Param<ProgressMode, "progress", "auto: a bar on a terminal, lines otherwise"> progress{
      ProgressMode::auto_};
  Param<bool, "smoke", "a run of seconds that checks everything works"> smoke{false};
  Param<std::int64_t, "checkpoint_interval",
        "env steps between checkpoints in the run directory (gradient updates in an offline loop; 0: only "
        "at the end)",
        at_least(0)>
      checkpoint_interval{10'000};
  Param<int, "keep_last", "checkpoints kept; older ones are deleted", at_least(1)> keep_last{3};
  Param<bool, "checkpoint_buffer", "also save the replay buffer with each checkpoint (exact resume)">
      checkpoint_buffer{false};
  Param<bool, "tensorboard", "write TensorBoard event files in the run directory"> tensorboard{true};
  Param<bool, "tensorboard_histograms", "also histograms of the networks' weights at each log row">
      tensorboard_histograms{false};
  Param<bool, "timings", "time each phase of a step (env, act, sample, update, all-reduce, ...)"> timings{true};
  Param<bool, "sync_timings", "on CUDA, synchronise the device around each timed phase (true times)">
      sync_timings{true};
  Param<std::string, "resume",
        "a checkpoint to continue from, or auto: the latest in run_dir (none there: start afresh)">
      resume{""};

  /// A run of seconds (`run.smoke`): log rows every 200 steps at most.
  void shrink() { log_interval = std::min<std::int64_t>(log_interval, 200); }
};

}  // namespace anvil
// ---- end <anvil/train/run_config.hpp> ----

namespace anvil {

/// The config of a Trainer of algorithm A, buffer B, parallelism P, precision X and loop L.
template <class A, class B, class P, class X, class L>
struct TrainerConfig {
  Section<"run", RunConfig> run;
  Section<policy_config<L>::section, policy_config_t<L>> train;
  Section<"env", envs::VecEnvConfig> env;
  Section<"normalize", envs::NormalizeConfig> normalize;
  Section<policy_config<A>::section, policy_config_t<A>> algorithm;
  Section<policy_config<B>::section, policy_config_t<B>> buffer;
  Section<policy_config<P>::section, policy_config_t<P>> parallel;
  Section<policy_config<X>::section, policy_config_t<X>> precision;

  /// What the config hash covers beside the fields (`config_hash`): the policy types, since
  /// FP32 and TF32 runs, say, have the same fields. A run's config.yaml, `--print-config`,
  /// summary.json and checkpoints all show this one hash.
  static constexpr std::array<std::string_view, 5> hashed_types() {
    return {type_name<A>(), type_name<B>(), type_name<P>(), type_name<X>(), type_name<L>()};
  }

  /// Rules across sections (needs the loop's class: called where the config is read).
  void validate() const {
    const auto s = L::settings(*train);
    if (s.unit == ClockUnit::env_steps && s.eval_interval > 0 && s.eval_interval < env->num_envs)
      throw ConfigError("train.eval_interval (" + std::to_string(s.eval_interval) +
                        ") is shorter than one step of env.num_envs (" + std::to_string(*env->num_envs) + ") envs");
  }
};

/// Whether every policy's light `policy_config` specialisation names its own `Config` (the
/// Trainer checks it where the policies are complete types).
template <class A, class B, class P, class X, class L>
inline constexpr bool light_configs_match =
    std::same_as<policy_config_t<A>, typename A::Config> && std::same_as<policy_config_t<B>, typename B::Config> &&
    std::same_as<policy_config_t<P>, typename P::Config> && std::same_as<policy_config_t<X>, typename X::Config> &&
    std::same_as<policy_config_t<L>, typename L::Config>;

}  // namespace anvil
// ---- end <anvil/train/trainer_config.hpp> ----

namespace anvil {

template <class A, class B, class P, class X, class L>
class BasicTrainer;  // train/trainer.hpp

namespace compiled {

/// The loop an algorithm trains in, named without the algorithm's class (the built-in
/// algorithms the library prebuilds; `anvil::default_loop_t` in general).
template <class A>
struct loop_of;
template <bool kMultiTask>
struct loop_of<BasicSAC<nn::GaussianActor, nn::TwinQ, kMultiTask>> {
  using type = OffPolicyLoop;
};
template <>
struct loop_of<PPO> {
  using type = OnPolicyLoop;
};

/// A Trainer compiled once (see file comment).
template <class A, class B, class P = SingleDevice, class X = FP32, class L = typename loop_of<A>::type>
class Trainer {
 public:
  using Algorithm = A;
  using Buffer = B;
  using Parallelism = P;
  using Precision = X;
  using Loop = L;
  using Config = TrainerConfig<A, B, P, X, L>;
  /// The Trainer it holds (complete where train/trainer.hpp is included).
  using Full = BasicTrainer<A, B, P, X, L>;
  /// `anvil::start<compiled::Trainer<...>>` calls `start_config` (train/start.hpp).
  static constexpr bool prebuilt = true;

  /// `anvil::start<Full>(args, defaults)`, compiled once: the config from the command line
  /// over `defaults`; answers `--help`, `--print-config` and `--multirun`, reports bad input
  /// (exit 2) and starts the ranks of a DDP run.
  static Config start_config(const Args& args, Config defaults);

  /// Builds the run on `env` (any env: see file comment, and `BasicTrainer`).
  Trainer(const envs::AnyEnv& env, Config cfg, std::string program = {});
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  ~Trainer();

  /// Trains to the end (`BasicTrainer::fit`).
  FitResult fit();
  /// For a main that runs its own loop (`BasicTrainer`'s calls of the same names): opens
  /// the run (and resumes when asked); steps the envs until `n` more env steps are stored;
  /// makes `n` gradient updates; writes a row of metrics; ends the run.
  void begin();
  void collect(std::int64_t n);
  void update(int n);
  void log();
  FitResult finish();
  /// Mean return of `episodes` deterministic episodes (`BasicTrainer::evaluate`).
  EvalResult evaluate(int episodes);
  /// Makes `r` the run's latest evaluation (in the next log row, summary.json, the best).
  void record_evaluation(const EvalResult& r);
  /// The latest recorded evaluation.
  [[nodiscard]] const EvalResult& last_evaluation() const noexcept;
  /// The run's clock.
  [[nodiscard]] std::int64_t env_steps() const noexcept;
  [[nodiscard]] std::int64_t updates() const noexcept;
  /// Writes / restores everything a resumed run needs (atomic; all or nothing).
  void save_checkpoint(const std::filesystem::path& file);
  void load_checkpoint(const std::filesystem::path& file);
  /// Writes the policy alone (`anvil::load_policy` reads it); an algorithm that exports no
  /// policy file (not `ExportsPolicy`) throws.
  void save_policy(const std::filesystem::path& file) const;
  /// The resolved config the run uses.
  [[nodiscard]] const Config& config() const noexcept;
  /// Where the run writes its files.
  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept;

  /// The Trainer itself, for everything else.
  [[nodiscard]] Full& full() noexcept { return *impl_; }
  [[nodiscard]] const Full& full() const noexcept { return *impl_; }

 private:
  std::unique_ptr<Full> impl_;
};

}  // namespace compiled

}  // namespace anvil

#if defined(ANVIL_COMPILED) && __has_include(<anvil_compiled/trainers.hpp>)
// Generated by CMake from ANVIL_PREBUILT_TRAINERS: `extern template` of each Trainer the
// `anvil::compiled` library holds, so no translation unit of a program builds one again.
#include <anvil_compiled/trainers.hpp>
#endif
// ---- end <anvil/train/compiled_trainer.hpp> ----
// ---- begin <anvil/train/compiled_trainer_impl.hpp> ----
/// @file
/// The definitions of `anvil::compiled::Trainer` (train/compiled_trainer.hpp): included by
/// the `anvil::compiled` library's sources, by `<anvil/compiled.hpp>` in a header-only
/// build, and by a program's own translation unit that builds a combination the library
/// does not hold (any env goes through `envs::AnyEnv`: nothing is built per env):
///
///     #include <anvil/train/compiled_trainer_impl.hpp>
///     ANVIL_COMPILED_TRAINER(anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, anvil::TF32)
///
/// It includes the classes of the policies `compiled.hpp` names (SAC, PPO, their buffers);
/// a combination with other policies includes theirs too.

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

// ---- begin <anvil/train/loops/off_policy.hpp> ----
/// @file
/// `OffPolicyLoop`: the loop of off-policy algorithms (SAC, TD3, ...) with a replay buffer.
/// Each iteration steps every env once (uniform random actions until
/// `train.learning_starts`, then the algorithm's exploration), stores the step, and once
/// the buffer holds a batch runs `train.updates_per_interval` updates every
/// `train.update_interval` env steps of this rank, each on a fresh batch; prioritized
/// buffers get each batch's TD errors back. An algorithm with `shaped_rewards(step, env_steps)`
/// (reward shaping) gives the rewards each step is stored with.
///
/// With `env.mode=async` the envs step in the background while the updates run: after a
/// step lands and is stored, the next actions are chosen and the next step started, then
/// the updates run. So the policy that acts is one round of updates behind the one a sync
/// run would act with; the data the updates see is the same (the newest step included).
/// An env whose step costs about as much as the updates takes about half the time.

#include <cstdint>
#include <string>

// ---- begin <anvil/train/loops/loop.hpp> ----
/// @file
/// What every loop shares: the parts of a run a loop orders (`LoopParts`), the settings a
/// loop gives the Trainer (`LoopSettings`: its unit, length, evaluation schedule and the
/// optimizer-step settings), and the config fields several loops have, declared once.
///
/// A loop is a policy of kind `LoopKind` (core/concepts.hpp): a tag type with a `name`, a
/// `Config` (the `train` section), `Rules<A, B>` (one static_assert sentence for each thing
/// the loop needs of the algorithm A or the buffer B that is missing; `ok` when all hold)
/// and `Runner<A, B>`, which runs it. A runner has:
///
///     Runner(const Config&, LoopParts<A, B>);
///     LoopSettings settings() const;   // the current stage's settings
///     void begin();                    // its stage starts: sets the clock's unit, plans the buffer
///     bool done() const;               // the stage's length is reached
///     void iterate(std::int64_t quiet_until);  // one iteration; see below
///     void at_log_row();               // its part of a log row (e.g. merge normalisers over ranks)
///     void resumed();                  // after a resume restored the run's state
///     int stage() const;               // which stage runs (0 but for Staged)
///     BottleneckAdvice advice(const AdviceKeys&) const;  // what the timing verdict suggests, in its knobs
///     save / read / restore            // its state (section "loop"), the same on every rank
///
/// A stage counts its length from where the clock stood when it began (`origin`), so a
/// loop can follow another in a `Staged` run.
///
/// `quiet_until` is the next clock value at which a hook (evaluation, log row, checkpoint)
/// fires: a loop that overlaps work (the off-policy loop's async env steps) leaves nothing
/// in flight when it reaches it, so hooks see the run at rest.

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>


namespace anvil {

/// The parts of a run a loop orders; the Trainer owns them all.
template <class A, class B>
struct LoopParts {
  A& algorithm;
  B& buffer;
  StepContext& step;           ///< autocast, loss scaling, all-reduce, optimizer steps
  StepCollector& collector;    ///< the training envs
  Clock& clock;
  Ranks& ranks;
  PhaseTimes& times;
  UpdateMetrics& metrics;      ///< update metrics until the next log row
};

/// What a loop's config says that the Trainer and its hooks use.
struct LoopSettings {
  ClockUnit unit = ClockUnit::env_steps;    ///< what `steps` and the hooks' intervals count
  ClockUnit record_unit = ClockUnit::env_steps;  ///< the step of TensorBoard records and the progress bar
  std::int64_t steps = 0;                   ///< the stage's length, in `unit`
  std::int64_t origin = 0;                  ///< the clock (in `unit`) when the stage began
  std::int64_t eval_interval = 0;           ///< in `unit`; 0: only at the end
  int eval_episodes = 10;
  int grad_accumulation = 1;                ///< micro-batches per optimizer step
  double ema_decay = 0;                     ///< policy average after each update (0: off)
  LrScaling lr_scaling = LrScaling::none;
  std::int64_t base_batch = 256;
};

/// The config keys a loop's timing advice may name (`BottleneckAdvice`): the loop's own
/// section, and its algorithm's fields, found by their last part, so that advice names
/// only keys the run's config has.
struct AdviceKeys {
  std::string train = "train";         ///< the loop's section ("train.offline" in a Staged run)
  std::vector<std::string> algorithm;  ///< every key of the algorithm's section, in order
  /// The algorithm's first key whose last part is `leaf` ("sac.batch_size"), or "".
  [[nodiscard]] std::string find(std::string_view leaf) const {
    for (const auto& k : algorithm)
      if (k.size() > leaf.size() && k.ends_with(leaf) && k[k.size() - leaf.size() - 1] == '.') return k;
    return "";
  }
};

/// A loop a custom main can drive a step at a time (`collect(n)` env steps, `update(k)`
/// updates): the off-policy loop.
template <class R>
concept StepwiseLoop = requires(R& r, std::int64_t n, int k) {
  { r.collect(n) };
  { r.update(k) };
};

namespace loops {

/// `first` and `second` joined by `sep`, leaving out an empty one.
inline std::string either(const std::string& first, const std::string& sep, const std::string& second) {
  return first.empty() ? second : second.empty() ? first : first + sep + second;
}
/// The advice every loop gives when evaluations, log rows and checkpoints take the time.
inline std::string side_advice(const AdviceKeys& k) {
  return "raise " + k.train + ".eval_interval, run.log_interval or run.checkpoint_interval";
}
/// The advice every loop that acts in envs gives when choosing actions takes the time.
inline std::string act_advice() { return "raise env.num_envs so each forward pass serves more envs"; }

/// The settings every loop's config gives in the same fields.
template <class Config>
LoopSettings common_settings(const Config& c, ClockUnit unit) {
  LoopSettings s;
  s.unit = s.record_unit = unit;
  s.steps = c.steps;
  s.eval_interval = c.eval_interval;
  s.eval_episodes = c.eval_episodes;
  s.grad_accumulation = c.grad_accumulation;
  s.ema_decay = c.ema_decay;
  s.lr_scaling = c.lr_scaling;
  s.base_batch = c.base_batch;
  return s;
}

/// Stops the run at an update whose reported loss or statistic is not finite: without a
/// loss scaler (FP32, TF32, BF16) nothing skips that step, so the weights it moved are lost.
/// The error names the metric, the update and the env step; nothing is written after it, so
/// the last checkpoint and policy.bin stay as they were. Not a template.
[[gnu::cold, gnu::noinline]] inline void fail_non_finite(std::string_view algorithm, const std::string& metric, double v,
                                                         const Clock& clock) {
  throw Error(std::string(algorithm) + ": " + metric + " is " + non_finite_name(v) + " at gradient update " +
              std::to_string(clock.updates) + " (env step " + std::to_string(clock.env_steps) +
              "); the run stops without saving these weights (the last checkpoint is intact). Lower the learning "
              "rates, clip gradients (max_grad_norm), or look for extreme rewards or observations");
}

/// One update from `batch` through the parts' step context, timed as the update phase;
/// its metrics are kept for the next log row, the clock counts it, and the policy average
/// moves when `ema_decay` is on; a non-finite metric stops the run unless a loss scaler
/// skips such steps (`fail_non_finite`). Returns what the algorithm reported.
template <class A, class B, class Batch = typename A::Batch>
UpdateInfo update_once(LoopParts<A, B>& p, const Batch& batch, double ema_decay) {
  UpdateInfo info;
  {
    ScopedPhase ph(p.times, Phase::update);
    info = p.algorithm.update(batch, p.step);
  }
  p.metrics.add(info.metrics);
  ++p.clock.updates;
  if (!p.step.scaler())
    for (const auto& [name, v] : info.metrics)
      if (!std::isfinite(v)) [[unlikely]]
        fail_non_finite(A::config_section.view(), name, v, p.clock);
  if constexpr (AveragesPolicy<A>)
    if (ema_decay > 0) p.algorithm.ema_update(ema_decay);
  return info;
}

/// Refuses `train.ema_decay` for an algorithm that keeps no average of its policy.
template <class A>
void check_ema(double ema_decay) {
  if constexpr (!AveragesPolicy<A>)
    if (ema_decay > 0)
      throw ConfigError("train.ema_decay: " + std::string(A::config_section.view()) +
                        " keeps no average of its policy's weights (see anvil::AveragesPolicy)");
}

}  // namespace loops

}  // namespace anvil
// ---- end <anvil/train/loops/loop.hpp> ----
// ---- begin <anvil/train/loops/stage.hpp> ----
/// @file
/// The skeleton every loop shares, written once: `loops::LoopTag` declares a loop policy
/// (its kind, name, `train` section and clock unit), and `loops::Stage` is the part of a
/// runner that is the same in every loop: its config and parts, where its stage began on
/// the clock, the stage's settings and end, its start and resume (`begin`, `resumed`: the
/// origin, the clock's unit, then the runner's own `prepare()`), the normalisers merged
/// over ranks at a log row, and the origin as the loop's state. A runner derives from `Stage<Runner, Loop, A, B>` and adds
/// what is its own: `prepare()` (at the stage's start and after a resume), `iterate()`,
/// `advice()`, and any other state (then it hides `save`, `read` and `restore`).

#include <cstdint>
#include <string_view>


namespace anvil::loops {

/// A loop policy's declaration: `struct OnPolicyLoop : loops::LoopTag<"on-policy",
/// "on_policy", loops::OnPolicyConfig, ClockUnit::env_steps> { ... Rules, Runner ... };`.
template <FixedString Name, FixedString StageName, class Cfg, ClockUnit Unit>
struct LoopTag {
  using policy_kind = LoopKind;
  static constexpr std::string_view name = Name.view();
  static constexpr FixedString config_section = "train";
  /// The stage's name in a `Staged` run's sections (`train.<stage_name>`).
  static constexpr FixedString stage_name = StageName;
  /// What the stage's length and the hooks' intervals count.
  static constexpr ClockUnit unit = Unit;
  using Config = Cfg;

  [[nodiscard]] static LoopSettings settings(const Config& c) { return common_settings(c, Unit); }
};

/// The runner's shared part (see file comment); `Runner` is the derived runner (CRTP).
template <class Runner, class Loop, class A, class B>
class Stage {
 public:
  using Config = typename Loop::Config;

  Stage(const Config& cfg, LoopParts<A, B> parts) : cfg_(cfg), p_(parts) { check_ema<A>(cfg.ema_decay); }

  /// The stage's settings, with where it began.
  [[nodiscard]] LoopSettings settings() const {
    auto s = Loop::settings(cfg_);
    s.origin = origin_;
    return s;
  }
  [[nodiscard]] int stage() const noexcept { return 0; }

  /// The stage starts: its length counts from the clock as it stands; then it is set up as
  /// after a resume.
  void begin() {
    origin_ = p_.clock.in(Loop::unit);
    resumed();
  }
  /// At the stage's start and after a resume restored the run (this loop's state included):
  /// the clock counts in the loop's unit, and the runner does its own `prepare()` (the
  /// buffer's plan, ...).
  void resumed() {
    p_.clock.unit = Loop::unit;
    static_cast<Runner&>(*this).prepare();
  }
  [[nodiscard]] bool done() const noexcept { return elapsed() >= cfg_.steps; }

  /// At a log row with several ranks: every rank's new normaliser statistics are merged.
  void at_log_row() {
    if (p_.ranks.world_size() > 1) p_.collector.envs().sync_statistics([this](at::Tensor& t) { p_.ranks.sum(t); });
  }

  /// State protocol: where the stage began.
  void save(BinaryWriter& w) const { w.value(origin_); }
  [[nodiscard]] std::int64_t read(BinaryReader& r) const { return r.value<std::int64_t>("stage origin"); }
  void restore(std::int64_t origin) noexcept { origin_ = origin; }

 protected:
  /// The stage's progress, in the loop's unit.
  [[nodiscard]] std::int64_t elapsed() const noexcept { return p_.clock.in(Loop::unit) - origin_; }

  Config cfg_;
  LoopParts<A, B> p_;
  std::int64_t origin_ = 0;  ///< the clock, in the loop's unit, when the stage began
};

}  // namespace anvil::loops
// ---- end <anvil/train/loops/stage.hpp> ----

namespace anvil {

/// An algorithm that shapes the rewards it learns from (CollectiveStudent): the loop stores
/// `shaped_rewards(step, env steps of the stage)` in place of the env's.
template <class A>
concept ShapesRewards = requires(A& a, const StepBatch& step) {
  { a.shaped_rewards(step, std::int64_t{}) } -> std::same_as<at::Tensor>;
};

/// Loop policy for off-policy algorithms (see file comment).
struct OffPolicyLoop : loops::LoopTag<"off-policy", "off_policy", loops::OffPolicyConfig, ClockUnit::env_steps> {
  /// What this loop needs of the algorithm and the buffer, one sentence each.
  template <class A, class B>
  struct Rules {
    static constexpr bool algorithm_ok = OffPolicyAlgorithm<A>;
    static_assert(algorithm_ok,
                  "Trainer: the off-policy loop samples batch_size() transitions per update and stores "
                  "n-step returns with discount(); the Algorithm lacks one (see anvil::OffPolicyAlgorithm)");
    static constexpr bool buffer_ok = !algorithm_ok || ReplayBuffer<B>;
    static_assert(buffer_ok,
                  "Trainer: the off-policy loop samples random batches, but the Buffer has no sample(n) "
                  "(see anvil::ReplayBuffer); use UniformBuffer or PrioritizedBuffer");
    static constexpr bool step_ok = !(algorithm_ok && buffer_ok) || std::same_as<typename B::Step, StepBatch>;
    static_assert(step_ok,
                  "Trainer: the off-policy loop stores each env step as a StepBatch, but the Buffer's Step "
                  "is another type");
    static constexpr bool ok = algorithm_ok && buffer_ok && step_ok;
  };

  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OffPolicyLoop, A, B> {
    using Base = loops::Stage<Runner, OffPolicyLoop, A, B>;
    using Base::cfg_, Base::p_, Base::origin_;

   public:
    Runner(const Config& cfg, LoopParts<A, B> parts) : Base(cfg, parts) {
      if (p_.algorithm.batch_size() > p_.buffer.capacity())
        throw ConfigError(std::string(A::config_section.view()) + ".batch_size (" +
                          std::to_string(p_.algorithm.batch_size()) + ") is larger than " +
                          std::string(B::config_section.view()) + ".capacity (" + std::to_string(p_.buffer.capacity()) +
                          "): the buffer could never hold a batch, so the run would never update");
    }

    /// At the stage's start and after a resume: the buffer learns the plan.
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      p_.buffer.plan(StoragePlan{p_.collector.num_envs(), cfg_.steps, p_.algorithm.discount()});
    }

    /// One iteration: a step of every env, stored, then the updates due.
    void iterate(std::int64_t quiet_until = INT64_MAX) {
      if (async()) {
        if (!p_.collector.in_flight()) launch();
        store(p_.collector.land());
        // The envs take their next step while this iteration's updates run, unless a hook
        // is due (it must see the run at rest) or the run is over.
        if (!this->done() && p_.clock.now() < quiet_until) launch();
      } else {
        act_now();
        store(p_.collector.step(actions_));
      }
      update_when_due();
    }

    /// Steps the envs until at least `n` more env steps are stored (a custom main's own
    /// schedule; no updates).
    void collect(std::int64_t n) {
      const std::int64_t target = p_.clock.env_steps + n;
      while (p_.clock.env_steps < target) {
        if (p_.collector.in_flight()) {
          store(p_.collector.land());
        } else {
          act_now();
          store(p_.collector.step(actions_));
        }
      }
    }

    /// `n` gradient updates, each on a fresh batch from the buffer.
    void update(int n) {
      for (int i = 0; i < n; ++i) {
        ReplayBatch batch;
        {
          ScopedPhase ph(p_.times, Phase::sample);
          batch = p_.buffer.sample(p_.algorithm.batch_size());
        }
        const auto info = loops::update_once(p_, batch, cfg_.ema_decay);
        if constexpr (PrioritizedReplay<B>)
          if (info.td_error.defined()) p_.buffer.update_priorities(batch.index, info.td_error);
      }
    }

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string batch = k.find("batch_size"), interval = k.train + ".update_interval";
      BottleneckAdvice a;
      a.env = "raise env.num_envs, step the envs during updates (env.mode=async), or raise " + interval;
      a.learn = "raise " + interval + " (fewer updates per env step), or add ranks";
      a.comm = "fewer, larger updates (" + loops::either(batch, ", ", interval) + ") or fewer ranks";
      a.act = loops::act_advice();
      a.sample = "raise " + loops::either(batch, " or ", interval);
      a.side = loops::side_advice(k);
      return a;
    }

    /// State protocol: where the stage began and where the update schedule stands (the
    /// same on every rank).
    void save(BinaryWriter& w) const {
      w.value(origin_);
      w.value(since_update_);
    }
    struct Saved {
      std::int64_t origin = 0, since_update = 0;
    };
    [[nodiscard]] Saved read(BinaryReader& r) const {
      Saved s{r.value<std::int64_t>("stage origin"), r.value<std::int64_t>("env steps since the last updates")};
      if (s.origin < 0 || s.since_update < 0) r.fail("update schedule", "holds a negative count");
      return s;
    }
    void restore(const Saved& s) noexcept {
      origin_ = s.origin;
      since_update_ = s.since_update;
    }

   private:
    [[nodiscard]] bool async() const { return p_.collector.envs().mode() == envs::VecMode::async; }

    // Actions for the observations the envs show (random until learning starts), timed.
    void act_now() {
      const auto& obs = p_.collector.observations();
      ScopedPhase ph(p_.times, Phase::act);
      if (this->elapsed() < cfg_.learning_starts) {
        actions_ = p_.collector.random_actions();
      } else {
        actions_ = p_.algorithm.act(obs, ActMode::explore);
        if (!actions_.is_cpu()) actions_ = actions_.to(at::kCPU);
      }
    }
    void launch() {
      act_now();
      p_.collector.launch(actions_);
    }

    // The step that landed, into the buffer; the clock counts every rank's envs (they step
    // in lockstep).
    void store(const envs::VecStep& s) {
      {
        ScopedPhase ph(p_.times, Phase::buffer_add);
        StepBatch step{p_.collector.previous_observations(), actions_, s.reward, s.next_obs, s.terminated, s.truncated, s.task};
        // An algorithm that shapes its rewards (CollectiveStudent) gives the ones to store.
        if constexpr (ShapesRewards<A>)
          step.reward = p_.algorithm.shaped_rewards(step, this->elapsed());
        p_.buffer.add(step);
      }
      p_.clock.env_steps += p_.collector.num_envs() * p_.ranks.world_size();
    }

    void update_when_due() {
      if (this->elapsed() < cfg_.learning_starts || !can_update()) return;
      since_update_ += p_.collector.num_envs();
      while (since_update_ >= cfg_.update_interval) {
        update(cfg_.updates_per_interval);
        since_update_ -= cfg_.update_interval;
      }
    }

    // Whether the buffer can give a batch. Ranks must update in lockstep (each update is a
    // collective), so with several ranks all must be able to: their buffers can differ
    // after a resume (only rank 0 restores one). Asked each step until the answer is yes,
    // which stays yes: buffers only grow.
    bool can_update() {
      if (ready_) return true;
      const double short_of = p_.buffer.size() >= p_.algorithm.batch_size() ? 0.0 : 1.0;
      return ready_ = p_.ranks.sum(short_of) == 0.0;
    }

    at::Tensor actions_;            ///< the actions of the step in flight or last taken
    std::int64_t since_update_ = 0;  ///< this rank's env steps since the last round of updates
    bool ready_ = false;            ///< every rank's buffer can give a batch
  };
};

}  // namespace anvil
// ---- end <anvil/train/loops/off_policy.hpp> ----
// ---- begin <anvil/train/loops/on_policy.hpp> ----
/// @file
/// `OnPolicyLoop`: the loop of on-policy algorithms (PPO, ...) with a rollout buffer. Each
/// iteration collects a rollout (`rollout.steps` steps of every env with the current
/// policy, the value of a truncated episode's last state kept to bootstrap from), computes
/// its advantages, and learns from it: the algorithm's `epochs()` passes in shuffled
/// minibatches of `minibatch_size()` rows, after each of which the algorithm's
/// `end_epoch` says whether to go on (PPO stops early once the policy has moved too far:
/// `ppo.target_kl`). Then the rollout is cleared: no step is learned from by a policy other
/// than the one that collected it and the epochs right after.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>


namespace anvil {

/// Loop policy for on-policy algorithms (see file comment).
struct OnPolicyLoop : loops::LoopTag<"on-policy", "on_policy", loops::OnPolicyConfig, ClockUnit::env_steps> {
  /// What this loop needs of the algorithm and the buffer, one sentence each.
  template <class A, class B>
  struct Rules {
    static constexpr bool algorithm_ok = OnPolicyAlgorithm<A>;
    static_assert(algorithm_ok,
                  "Trainer: the on-policy loop needs act_for_rollout, value, epochs, minibatch_size, end_epoch, "
                  "set_progress and discount of the Algorithm; one is missing (see anvil::OnPolicyAlgorithm)");
    static constexpr bool buffer_ok = !algorithm_ok || RolloutStorage<B>;
    static_assert(buffer_ok,
                  "Trainer: the on-policy loop fills a rollout, computes its advantages and hands it out in "
                  "minibatches; the Buffer lacks full, finish, minibatches or clear (see anvil::RolloutStorage)");
    static constexpr bool step_ok = !(algorithm_ok && buffer_ok) || std::same_as<typename B::Step, RolloutStep>;
    static_assert(step_ok,
                  "Trainer: the on-policy loop stores each env step as a RolloutStep, but the Buffer's Step "
                  "is another type");
    static constexpr bool ok = algorithm_ok && buffer_ok && step_ok;
  };

  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OnPolicyLoop, A, B> {
    using Base = loops::Stage<Runner, OnPolicyLoop, A, B>;
    using Base::cfg_, Base::p_;

   public:
    using Base::Base;

    /// At the stage's start and after a resume: the rollout is sized for the envs. A
    /// minibatch larger than a rollout is refused, naming both.
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      p_.buffer.plan(StoragePlan{p_.collector.num_envs(), cfg_.steps, p_.algorithm.discount()});
      const std::int64_t rows = p_.buffer.capacity(), envs = p_.collector.num_envs();
      if (p_.algorithm.minibatch_size() > rows)
        throw ConfigError(std::string(A::config_section.view()) + ".minibatch_size (" +
                          std::to_string(p_.algorithm.minibatch_size()) + ") is larger than a rollout: " +
                          std::string(B::config_section.view()) + ".steps (" + std::to_string(rows / envs) +
                          ") x env.num_envs (" + std::to_string(envs) + ") = " + std::to_string(rows) + " rows");
    }

    /// One iteration: collect a rollout, learn from it.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      collect_rollout();
      learn_rollout();
    }

    /// Fills the rollout buffer with `rollout.steps` steps of every env, acting with the
    /// current policy, and computes its advantages.
    void collect_rollout() {
      p_.buffer.clear();
      while (!p_.buffer.full()) step();
      ScopedPhase ph(p_.times, Phase::buffer_add);
      p_.buffer.finish(p_.algorithm.value(p_.collector.observations()));
    }

    /// Learns from the collected rollout (see file comment), then clears it.
    void learn_rollout() {
      // Every rank normalises with the same statistics from here on.
      if (p_.ranks.world_size() > 1) p_.collector.envs().sync_statistics([this](at::Tensor& t) { p_.ranks.sum(t); });
      p_.algorithm.set_progress(static_cast<double>(this->elapsed()) / static_cast<double>(*cfg_.steps));
      int epochs = 0;
      for (int e = 0; e < p_.algorithm.epochs(); ++e) {
        std::optional<ScopedPhase> sampling(std::in_place, p_.times, Phase::sample);
        for (const auto& batch : p_.buffer.minibatches(p_.algorithm.minibatch_size())) {
          sampling.reset();
          loops::update_once(p_, batch, cfg_.ema_decay);
          sampling.emplace(p_.times, Phase::sample);
        }
        sampling.reset();
        ++epochs;
        if (!p_.algorithm.end_epoch(p_.step)) break;
      }
      p_.metrics.add("epochs", epochs);
      p_.buffer.clear();
    }

    void at_log_row() {}  // the normalisers were merged before the rollout's updates

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string epochs = k.find("epochs"), minibatch = k.find("minibatch_size");
      BottleneckAdvice a;
      a.env = "raise env.num_envs or env.threads";
      a.learn = loops::either(loops::either(epochs.empty() ? "" : "fewer " + epochs, " or ",
                                            minibatch.empty() ? "" : "a larger " + minibatch),
                              ", or ", "add ranks");
      a.comm = loops::either(minibatch.empty() ? "" : "a larger " + minibatch + " (fewer all-reduces per rollout)", " or ",
                             "fewer ranks");
      a.act = loops::act_advice();
      a.sample = minibatch.empty() ? "" : "a larger " + minibatch;
      a.side = loops::side_advice(k);
      return a;
    }

   private:
    // One step of every env for the rollout: act, step, and for rows cut by the time limit
    // the value of their true last state (the bootstrap; see RolloutBuffer).
    void step() {
      RolloutAct act;
      {
        const auto& obs = p_.collector.observations();
        ScopedPhase ph(p_.times, Phase::act);
        act = p_.algorithm.act_for_rollout(obs);
      }
      const envs::VecStep& s = p_.collector.step(act.action);
      at::Tensor bootstrap;
      if (std::any_of(s.ended.begin(), s.ended.end(), [](const envs::EpisodeEnd& e) { return !e.terminated; })) {
        ScopedPhase ph(p_.times, Phase::act);
        bootstrap = p_.algorithm.value(s.next_obs);
      }
      {
        ScopedPhase ph(p_.times, Phase::buffer_add);
        p_.buffer.add(RolloutStep{p_.collector.previous_observations(), act.action, act.log_prob, act.value, s.reward,
                                  s.terminated, s.truncated, bootstrap});
      }
      p_.clock.env_steps += p_.collector.num_envs() * p_.ranks.world_size();
    }
  };
};

}  // namespace anvil
// ---- end <anvil/train/loops/on_policy.hpp> ----
// ---- begin <anvil/train/start.hpp> ----
/// @file
/// `anvil::start`: the one line a main calls first, and the only place where anvil controls
/// the process. Constructors and parsers never print, exit, fork or restart anything; this
/// call does what a training program must do before it builds a Trainer:
///  - installs the handler that turns an uncaught anvil error into `error: <message>` and
///    its exit status (2 for bad input, 3 for a failure between ranks, 1 otherwise);
///  - makes sure OpenBLAS uses its fast kernels (`prefer_fast_blas`: on an AVX-512 CPU whose
///    kernels OpenBLAS did not recognise, the program restarts itself once with
///    OPENBLAS_CORETYPE set);
///  - reads the command line and `--config` files into the Trainer's config: `--help` prints
///    every field and exits 0, `--print-config` prints the resolved config and exits 0, a bad
///    key or value prints one line naming it and exits 2; a resume (`run.resume`) takes the
///    run's own settings from its run directory's config.yaml, under those the user gives;
///  - starts the ranks: a program with `DDP<N>` started plainly becomes the launcher of its
///    node's N ranks (parallel/launch.hpp) and exits with their outcome; a rank (or a run
///    with one process) returns.
///
///     int main(int argc, char** argv) {
///       using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
///       Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
///       trainer.fit();
///     }
///
/// Its counterpart at the other end, `exit_fast`, ends a single-process main whose run is
/// over without the teardown of the libraries it loaded.

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// ---- begin <anvil/core/detail/flush_registry.hpp> ----
/// @file
/// The buffers anvil writes files through that the C library does not know (C++ streams,
/// rows held back), registered while they are open, so that `anvil::exit_fast` can flush
/// them before it ends the process without the libraries' teardown. Light header.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace anvil::detail {

/// Every registered flush (see file comment). One per process; thread-safe.
class FlushRegistry {
 public:
  static FlushRegistry& instance() {
    static FlushRegistry* r = new FlushRegistry;  // never destroyed: usable until the very end
    return *r;
  }
  std::uint64_t add(std::function<void()> flush) {
    std::lock_guard lock(mu_);
    flushes_.emplace(++next_, std::move(flush));
    return next_;
  }
  void remove(std::uint64_t id) {
    std::lock_guard lock(mu_);
    flushes_.erase(id);
  }
  /// Runs every registered flush, oldest first; one that throws does not stop the others.
  void flush_all() noexcept {
    std::lock_guard lock(mu_);
    for (auto& [id, f] : flushes_) {
      try {
        f();
      } catch (...) {
      }
    }
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::function<void()>> flushes_;
  std::uint64_t next_ = 0;
};

/// Registers `flush` for its own life (held by an object that does not move, e.g. a Run).
class FlushAtExit {
 public:
  explicit FlushAtExit(std::function<void()> flush) : id_(FlushRegistry::instance().add(std::move(flush))) {}
  FlushAtExit(const FlushAtExit&) = delete;
  FlushAtExit& operator=(const FlushAtExit&) = delete;
  ~FlushAtExit() { FlushRegistry::instance().remove(id_); }

 private:
  std::uint64_t id_;
};

}  // namespace anvil::detail
// ---- end <anvil/core/detail/flush_registry.hpp> ----
// ---- begin <anvil/train/sweep.hpp> ----
/// @file
/// Sweeps, in Hydra's syntax: `--multirun seed=1,2,3 sac.batch_size=256,512` runs the cross
/// product of the comma-separated values (here 6 runs) one after the other, or N at a time
/// with `--jobs N`. Each run is this program started again with one value per key and its
/// own run directory under the sweep's (`--run_dir`, default `runs/sweep-<program>-<time>`),
/// its output in `<run>.log` beside it. At the end a table of each run's final and best
/// evaluation returns is printed and written to `sweep.csv` (and `sweep.json`) in the sweep
/// directory; the sweep exits 0 when every run did. A list value (`sac.actor.hidden=[64,64]`)
/// is one value, not a sweep. SIGINT/SIGTERM reach every running run once (each stops with
/// a checkpoint, train/signals.hpp) and no new run starts. Linux/POSIX. `anvil::start`
/// drives a sweep; this file is the part that does not depend on the Trainer's type.

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>


extern char** environ;

namespace anvil {

/// What a sweep runs (see file comment).
struct SweepPlan {
  std::string program;                 ///< the program's name, for the default directory
  std::vector<std::string> base;       ///< arguments every run gets (no --multirun, --jobs, --run_dir or swept keys)
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;  ///< swept keys as written, with their values
  int jobs = 1;
  std::filesystem::path dir;           ///< the sweep's directory (empty: the default)

  /// Every run's overrides (`key=value`, one per axis), the last axis changing fastest.
  [[nodiscard]] std::vector<std::vector<std::string>> runs() const {
    std::vector<std::vector<std::string>> out{{}};
    for (const auto& [key, values] : axes) {
      std::vector<std::vector<std::string>> next;
      for (const auto& prefix : out)
        for (const auto& v : values) {
          auto r = prefix;
          r.push_back(key + "=" + v);
          next.push_back(std::move(r));
        }
      out = std::move(next);
    }
    return out;
  }
  /// The full arguments (after the program name) of run `overrides`, in directory `run_dir`.
  [[nodiscard]] std::vector<std::string> arguments(const std::vector<std::string>& overrides,
                                                   const std::filesystem::path& run_dir) const {
    auto a = base;
    a.insert(a.end(), overrides.begin(), overrides.end());
    a.push_back("--run_dir=" + run_dir.string());
    return a;
  }
};

namespace detail {
// Splits `v` at commas outside brackets ("1,2,[3,4]" -> "1", "2", "[3,4]").
inline std::vector<std::string> split_top_level(const std::string& v) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char c : v) {
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) out.emplace_back();
    else out.back() += c;
  }
  return out;
}
}  // namespace detail

/// The sweep a command line asks for (`raw`: the arguments after the program name), or
/// throws ConfigError naming what is wrong.
[[nodiscard]] inline SweepPlan plan_sweep(const std::string& program, const std::vector<std::string>& raw) {
  SweepPlan p;
  p.program = program;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const std::string& a = raw[i];
    if (a == "--multirun" || a == "-m") continue;
    if (a == "--jobs" || a.rfind("--jobs=", 0) == 0) {
      std::string v = a == "--jobs" ? (i + 1 < raw.size() ? raw[++i] : "") : a.substr(7);
      try {
        p.jobs = std::stoi(v);
      } catch (const std::exception&) {
        p.jobs = 0;
      }
      if (p.jobs < 1 || p.jobs > 1024) throw ConfigError("--jobs=" + v + ": must be a number of runs from 1 to 1024");
      continue;
    }
    const std::string body = a.rfind("--", 0) == 0 ? a.substr(2) : a;
    const auto eq = body.find('=');
    if (eq != std::string::npos) {
      const std::string key = body.substr(0, eq), value = body.substr(eq + 1);
      if (key == "run_dir" || key == "run.run_dir" || key == "run-dir") {
        p.dir = value;
        continue;
      }
      auto values = detail::split_top_level(value);
      if (values.size() > 1) {
        for (const auto& v : values)
          if (v.empty()) throw ConfigError("--multirun: '" + a + "' has an empty value");
        if (key == "resume" || key == "run.resume")
          throw ConfigError("--multirun: run.resume cannot be swept; a sweep's runs each start afresh");
        p.axes.emplace_back(key, std::move(values));
        continue;
      }
    } else if (a == "--run_dir" && i + 1 < raw.size()) {
      p.dir = raw[++i];
      continue;
    }
    p.base.push_back(a);
  }
  if (p.axes.empty())
    throw ConfigError("--multirun: no key has several values; write them comma-separated, e.g. seed=1,2,3");
  return p;
}

/// One run of a sweep, as it ended.
struct SweepRun {
  std::string name;
  std::vector<std::string> overrides;
  int status = -1;  ///< exit status (128 + signal when killed)
  double final_eval = NAN, best_eval = NAN, wall = NAN;
  std::int64_t env_steps = 0;
};

namespace detail {
inline volatile std::sig_atomic_t g_sweep_stop = 0;
inline pid_t g_sweep_children[1024];
inline volatile std::sig_atomic_t g_sweep_child_count = 0;
inline void sweep_forward(int sig) {
  g_sweep_stop = sig;
  for (int i = 0; i < g_sweep_child_count; ++i)
    if (g_sweep_children[i] > 0) ::kill(g_sweep_children[i], sig);
}
inline std::string sweep_run_name(std::size_t index, const std::vector<std::string>& overrides) {
  std::string n = std::to_string(index);
  for (const auto& o : overrides) {
    n += "_";
    for (char c : o) n += (c == '/' || c == ' ' || c == '[' || c == ']' || c == ',') ? '-' : c;
  }
  return n;
}
}  // namespace detail

/// Runs `plan` (see file comment) and returns the exit status for the sweep: 0 when every
/// run succeeded, 1 when one failed, 128 + signal when it was stopped.
inline int run_sweep(const SweepPlan& plan) {
  namespace fs = std::filesystem;
  const fs::path dir = plan.dir.empty() ? fresh_run_dir("runs", "sweep-" + plan.program) : plan.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("--run_dir: cannot create the sweep directory '" + dir.string() + "': " + ec.message());
  const auto all = plan.runs();
  if (all.size() > 100'000) throw ConfigError("--multirun: " + std::to_string(all.size()) + " runs is too many");
  std::vector<SweepRun> runs(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    runs[i].overrides = all[i];
    runs[i].name = detail::sweep_run_name(i, all[i]);
  }
  std::printf("sweep: %zu runs, %d at a time, in %s\n", runs.size(), plan.jobs, dir.string().c_str());
  std::fflush(stdout);

  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = &detail::sweep_forward;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  detail::g_sweep_stop = 0;

  std::map<pid_t, std::size_t> running;
  std::size_t next = 0, finished = 0;
  auto start = [&](std::size_t i) {
    const auto run_dir = dir / runs[i].name;
    const auto log = dir / (runs[i].name + ".log");
    std::vector<std::string> args{plan.program};  // argv[0]: the program's name; the file is /proc/self/exe
    for (auto& a : plan.arguments(runs[i].overrides, run_dir)) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("--multirun: cannot start run " + runs[i].name + ": fork failed");
    if (pid == 0) {  // only async-signal-safe calls until exec
      ::setpgid(0, 0);  // a terminal's Ctrl-C reaches it through the sweep, once
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execve("/proc/self/exe", argv.data(), environ);
      ::_exit(127);
    }
    running[pid] = i;
    int slot = 0;
    while (slot < detail::g_sweep_child_count && detail::g_sweep_children[slot] > 0) ++slot;
    detail::g_sweep_children[slot] = pid;
    if (slot == detail::g_sweep_child_count) detail::g_sweep_child_count = slot + 1;
    std::string what;
    for (const auto& o : runs[i].overrides) what += (what.empty() ? "" : " ") + o;
    std::printf("[%zu/%zu] started: %s (log: %s)\n", i + 1, runs.size(), what.c_str(), log.string().c_str());
    std::fflush(stdout);
  };
  while (finished < runs.size()) {
    while (!detail::g_sweep_stop && next < runs.size() && static_cast<int>(running.size()) < plan.jobs) start(next++);
    if (running.empty()) break;  // stopped before the rest started
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    for (int s = 0; s < detail::g_sweep_child_count; ++s)
      if (detail::g_sweep_children[s] == pid) detail::g_sweep_children[s] = -1;
    auto& r = runs[it->second];
    running.erase(it);
    ++finished;
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream in(dir / r.name / "summary.json");
    if (in) {
      try {
        const auto j = nlohmann::json::parse(in);
        auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; };
        r.final_eval = num("final_eval_return");
        r.best_eval = num("best_eval_return");
        r.wall = num("wall_seconds");
        r.env_steps = j.contains("env_steps") && j["env_steps"].is_number() ? j["env_steps"].get<std::int64_t>() : 0;
      } catch (const std::exception&) {
      }
    }
    std::printf("[%zu/%zu] %s: %s, final eval %s (best %s)\n", finished, runs.size(), r.name.c_str(),
                r.status == 0 ? "done" : ("exit status " + std::to_string(r.status)).c_str(), metric_text(r.final_eval).c_str(),
                metric_text(r.best_eval).c_str());
    std::fflush(stdout);
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  // The table, on the console and in sweep.csv / sweep.json.
  std::vector<std::string> keys;
  for (const auto& [k, v] : plan.axes) keys.push_back(k);
  std::string csv = "run";
  for (const auto& k : keys) csv += "," + k;
  csv += ",exit_status,final_eval_return,best_eval_return,env_steps,wall_seconds\n";
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  std::printf("\n%-6s", "run");
  for (const auto& k : keys) std::printf(" %-16s", k.c_str());
  std::printf(" %6s %12s %12s\n", "status", "final eval", "best eval");
  int failed = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    nlohmann::ordered_json row;
    row["run"] = r.name;
    csv += std::to_string(i);
    std::printf("%-6zu", i);
    for (std::size_t a = 0; a < keys.size(); ++a) {
      const auto v = r.overrides[a].substr(r.overrides[a].find('=') + 1);
      csv += "," + v;
      row[keys[a]] = v;
      std::printf(" %-16s", v.c_str());
    }
    auto cell = [](double x) { return std::isfinite(x) ? json_number(x) : std::string(); };
    csv += "," + (r.status < 0 ? std::string() : std::to_string(r.status)) + "," + cell(r.final_eval) + "," +
           cell(r.best_eval) + "," + std::to_string(r.env_steps) + "," + cell(r.wall) + "\n";
    row["exit_status"] = r.status < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(r.status);
    row["final_eval_return"] = std::isfinite(r.final_eval) ? nlohmann::ordered_json(r.final_eval) : nlohmann::ordered_json();
    row["best_eval_return"] = std::isfinite(r.best_eval) ? nlohmann::ordered_json(r.best_eval) : nlohmann::ordered_json();
    row["env_steps"] = r.env_steps;
    table.push_back(row);
    std::printf(" %6s %12s %12s\n", r.status < 0 ? "-" : std::to_string(r.status).c_str(), metric_text(r.final_eval).c_str(),
                metric_text(r.best_eval).c_str());
    if (r.status != 0) ++failed;
  }
  write_file_atomic(dir / "sweep.csv", csv);
  write_file_atomic(dir / "sweep.json", table.dump(2) + "\n");
  std::printf("sweep: %zu of %zu runs succeeded; table in %s\n", runs.size() - static_cast<std::size_t>(failed),
              runs.size(), (dir / "sweep.csv").string().c_str());
  std::fflush(stdout);
  if (detail::g_sweep_stop) return 128 + detail::g_sweep_stop;
  return failed ? 1 : 0;
}

}  // namespace anvil
// ---- end <anvil/train/sweep.hpp> ----

namespace anvil {

namespace detail {
[[noreturn]] inline void exit_with(const Error& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", e.label(), e.what());
  std::fflush(stderr);
  std::exit(e.exit_code());
}
}  // namespace detail

/// The process's part of `start` (see file comment) for a main that builds its configs
/// itself (e.g. several Trainer types from one command line): error handler, BLAS kernels,
/// the parsed command line. A malformed command line exits 2.
inline Args start(int argc, char** argv) {
  install_error_handler();
  prefer_fast_blas(argc, argv);
  try {
    return parse_config(argc, argv);
  } catch (const ConfigError& e) {
    detail::exit_with(e);
  }
}

/// A config of type `Config` from `args` over `defaults`: answers `--help` and
/// `--print-config` (exit 0) and reports bad input (exit 2). For programs whose config is
/// not a Trainer's (benchmarks, tools); a Trainer's main calls `start<Trainer>`.
template <class Config>
Config start_config(const Args& args, Config defaults = {}) {
  if (args.help) {
    std::fputs(help_text<Config>(args.program, defaults).c_str(), stdout);
    std::fflush(stdout);
    std::exit(0);
  }
  Config cfg;
  try {
    cfg = configure<Config>(args, std::move(defaults));
  } catch (const ConfigError& e) {
    detail::exit_with(e);
  }
  if (args.print_config) {
    std::printf("# %s config, hash %s\n%s", args.program.c_str(), config_hash_hex(cfg).c_str(), to_yaml(cfg).c_str());
    std::fflush(stdout);
    std::exit(0);
  }
  return cfg;
}

/// `start(argc, argv)` then `start_config(args, defaults)`.
template <class Config>
Config start_config(int argc, char** argv, Config defaults = {}) {
  return start_config<Config>(start(argc, argv), std::move(defaults));
}

/// For a program with a config section of its own beside a Trainer's (a program with modes:
/// `--experiment.mode=...`): the arguments of section `section` (`--<section>.*`,
/// `<section>.*`) parsed into `Own` (a config holding that section; its defaults under
/// `--help`), and `start(argc, argv)` of the others, for the Trainer's `start<Trainer>`.
/// `--help` goes to both.
template <class Own>
std::pair<Args, Own> start_with_section(int argc, char** argv, std::string_view section) {
  std::vector<char*> mine{argv[0]}, theirs{argv[0]};
  const std::string dashed = "--" + std::string(section) + ".", plain = std::string(section) + ".";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    (a.starts_with(dashed) || a.starts_with(plain) ? mine : theirs).push_back(argv[i]);
    if (a == "--help") mine.push_back(argv[i]);
  }
  auto args = start(static_cast<int>(theirs.size()), theirs.data());
  Own own{};
  if (!args.help) own = start_config<Own>(static_cast<int>(mine.size()), mine.data());
  return {std::move(args), std::move(own)};
}

namespace detail {
struct SmokeField {
  Param<bool, "smoke", "a run of seconds"> smoke{false};
};
struct SmokeProbe {
  Section<"run", SmokeField> run;
};
}  // namespace detail

/// Whether `args` ask for a run of seconds (`--smoke`, or `run.smoke` in a config file), as a
/// Trainer's config reads them: for a program that chooses what to run by it (an example's
/// stages in order).
template <class Probe = detail::SmokeProbe>  // a template: compiled only where it is used
[[nodiscard]] bool asks_smoke(const Args& args) {
  std::vector<Setting> smoke;
  for (const auto& s : args.settings)
    if (s.key == "smoke" || s.key == "run.smoke") smoke.push_back(s);
  Probe p;
  try {
    apply_settings(p, smoke);
  } catch (const ConfigError&) {
    return false;  // the Trainer's own reading reports it
  }
  return p.run->smoke;
}

namespace detail {
/// `args` with the settings of the run a resume continues (its run directory's config.yaml)
/// placed under the user's own: a resume takes the run's networks, envs and schedule from
/// the run unless a config file or the command line says otherwise, so the only conflict
/// left to refuse is one the user gave. What belongs to this process rather than the run
/// (`run.resume`, `run.run_dir`, `parallel.*`) is not taken. Unchanged when the settings
/// ask for no resume or the run directory has no config.yaml.
template <class Config>
Args with_resumed_run(Args args, const Config& defaults);
}  // namespace detail

/// The run directory a resume asked for by `args` continues (`run.resume=auto`: `run.run_dir`;
/// a checkpoint: its directory), or empty when they ask for none. The settings are read over
/// `defaults` but not validated: the run's own settings may be what makes them valid.
template <class Config>
[[nodiscard]] std::filesystem::path resumed_run_dir(const Args& args, const Config& defaults = {}) {
  Config probe = defaults;
  try {
    detail::apply_each(probe, args.settings);
  } catch (const ConfigError&) {
    return {};  // the real reading reports it
  }
  const std::string& resume = probe.run->resume;
  if (resume.empty()) return {};
  return resume == "auto" ? std::filesystem::path(*probe.run->run_dir) : std::filesystem::path(resume).parent_path();
}

namespace detail {
template <class Config>
Args with_resumed_run(Args args, const Config& defaults) {
  const auto dir = resumed_run_dir(args, defaults);
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_regular_file(dir / "config.yaml", ec)) return args;
  auto run = load_yaml_file((dir / "config.yaml").string());
  std::erase_if(run, [](const Setting& s) {
    return s.key == "run.resume" || s.key == "run.run_dir" || s.key.starts_with("parallel.");
  });
  // After the program's own defaults, before the user's files and command line.
  const auto at = std::find_if(args.settings.begin(), args.settings.end(), [](const Setting& s) { return !s.program_default; });
  args.settings.insert(at, run.begin(), run.end());
  if (!dist::world_from_env())  // said once, by the process the user started
    std::fprintf(stderr, "resume: the run's settings from %s, under those given here\n", (dir / "config.yaml").c_str());
  return args;
}

template <class Trainer>
typename Trainer::Config start_trainer(const Args& given, typename Trainer::Config defaults) {
  const Args args = given.help ? given : with_resumed_run(given, defaults);
  if (args.multirun && !args.help && !args.print_config) {
    // A sweep (train/sweep.hpp): every run's config is checked before the first starts.
    try {
      const auto plan = plan_sweep(args.program, args.raw);
      for (const auto& overrides : plan.runs()) {
        std::vector<std::string> argv{args.program};
        for (const auto& a : plan.arguments(overrides, "sweep-check")) argv.push_back(a);
        try {
          (void)configure<typename Trainer::Config>(parse_args(argv), defaults);
        } catch (const ConfigError& e) {
          std::string which;
          for (const auto& o : overrides) which += (which.empty() ? "" : " ") + o;
          throw ConfigError("--multirun: the run with " + which + ": " + e.what());
        }
      }
      std::exit(run_sweep(plan));
    } catch (const Error& e) {
      detail::exit_with(e);
    }
  }
  auto cfg = start_config<typename Trainer::Config>(args, std::move(defaults));
  try {
    Trainer::Parallelism::start_ranks(*cfg.parallel, *cfg.run->device);  // a launcher does not return
  } catch (const Error& e) {
    detail::exit_with(e);
  }
  return cfg;
}
}  // namespace detail

/// A Trainer compiled once (`compiled::Trainer`, train/compiled_trainer.hpp), whose
/// `start_config` holds `start`'s work, compiled with it.
template <class T>
concept PrebuiltTrainer = requires(const Args& args, typename T::Config defaults) {
  requires T::prebuilt;
  { T::start_config(args, defaults) } -> std::same_as<typename T::Config>;
};

/// The config of a `Trainer` from `args` over `defaults` (see file comment): answers
/// `--help` and `--print-config` (exit 0), reports bad input (exit 2), and starts the ranks
/// the Trainer's parallelism needs.
template <class Trainer>
typename Trainer::Config start(const Args& args, typename Trainer::Config defaults = {}) {
  if constexpr (PrebuiltTrainer<Trainer>) {
    return Trainer::start_config(args, std::move(defaults));  // compiled::Trainer: this, compiled once
  } else {
    return detail::start_trainer<Trainer>(args, std::move(defaults));
  }
}

/// `start(argc, argv)` then `start<Trainer>(args, defaults)`: the usual first line of a main.
template <class Trainer>
typename Trainer::Config start(int argc, char** argv, typename Trainer::Config defaults = {}) {
  return start<Trainer>(start(argc, argv), std::move(defaults));
}

/// Ends the process with `code` now, once a main's work is done: flushes every file anvil
/// has open (its runs' training.log, metrics.csv and TensorBoard events: one registry,
/// core/detail/flush_registry.hpp), stdout, stderr and every C stream, then exits without
/// the static destructors of the loaded libraries and without destroying the main's objects.
/// Opt-in, for programs whose start and exit are timed (benchmarks/): a 0.1 s gain. Debian's LibTorch loads 288 libraries whose
/// destructors take about 50 ms at exit freeing memory the exit returns anyway (the
/// dispatcher's tables, DICOM dictionaries of an image library). Call it after `fit()`,
/// which completes the run's files (checkpoints, summary.json, metrics, events, training.log)
/// and releases its directory, and only where no object of yours still has something to
/// write. A rank a launcher started (RANK set: parallel/world.hpp) exits normally: the ranks'
/// process group tears down together.
[[noreturn]] inline void exit_fast(int code = 0) {
  detail::FlushRegistry::instance().flush_all();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (dist::detail::getenv_nonempty("RANK")) std::exit(code);
  std::_Exit(code);
}

}  // namespace anvil
// ---- end <anvil/train/start.hpp> ----
// ---- begin <anvil/train/trainer.hpp> ----
/// @file
/// `anvil::Trainer<Algorithm, Buffer, Parallelism, Precision[, Loop]>`: the host whose policy
/// slots read as a sentence. It builds a run's parts from its config (the ranks and device,
/// the envs and their collector, the algorithm, the buffer, the step context, the loop its
/// algorithm's data regime calls for, the state sections) and hands them to a `Run`
/// (train/run.hpp), which drives the loop and fires the hooks on its clock. `fit()` runs it
/// all; a custom main may call the steps itself (`begin`, `collect`, `update`, `evaluate`,
/// `log`, `save_checkpoint`, `finish`).

#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// ---- begin <anvil/train/hooks/evaluation.hpp> ----
/// @file
/// `Evaluation`: how well the policy does, measured on envs of its own. Each evaluation
/// runs a number of whole episodes with deterministic actions on fresh envs seeded apart
/// from the training envs (a new seed each time), split over the ranks, and reports the
/// returns' mean, spread and range and, for envs that say when they succeed
/// (`envs::ReportsSuccess`), the share of episodes that succeeded; where the env has tasks
/// (`envs::TaskTagged`) it runs the number of episodes asked for each task and breaks
/// both down by task. It keeps the latest result and the best mean so far, which every
/// rank holds alike. Not a template: it acts through a function it is given.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>


namespace anvil {

/// Evaluations of a run (see file comment).
class Evaluation {
 public:
  /// Envs to evaluate on: `n` copies seeded from `seed`, each to run one episode; `first`
  /// is the index of the first among all `count` of this evaluation (over the ranks), for
  /// envs that place themselves by it (one task each in turn).
  using MakeEnvs = std::function<std::unique_ptr<envs::VecEnvBase>(int n, std::uint64_t seed, int first, int count)>;
  /// Actions in the env's units for a batch of observations (deterministic).
  using Act = std::function<at::Tensor(const at::Tensor& obs)>;

  Evaluation() = default;
  /// Evaluates on envs from `make`, seeded from `seed` on (one seed per evaluation), with
  /// the episodes split over `ranks`; times itself as the eval phase when `times` is given.
  /// `tasks`: the env's tasks (`VecEnvBase::groups()`), each of which gets the episodes asked.
  /// `reports_success`: whether the env says when an episode succeeds (`envs::ReportsSuccess`).
  Evaluation(MakeEnvs make, std::uint64_t seed, Ranks ranks, PhaseTimes* times = nullptr,
             std::vector<std::string> tasks = {}, bool reports_success = false)
      : make_(std::move(make)), seed_(seed), ranks_(std::move(ranks)), times_(times), tasks_(std::move(tasks)),
        success_(reports_success) {}

  /// The tasks each evaluation covers (empty: the env has none).
  [[nodiscard]] const std::vector<std::string>& tasks() const noexcept { return tasks_; }
  /// Whether results have success rates.
  [[nodiscard]] bool reports_success() const noexcept { return success_; }

  /// Runs `episodes` episodes (of each task, when the env has tasks) acting with `act`;
  /// every rank runs its share and sees every return. All ranks must call it together.
  [[gnu::noinline]] EvalResult run(const Act& act, int per_task) {
    std::optional<ScopedPhase> ph;
    if (times_) ph.emplace(*times_, Phase::eval);
    const int episodes = per_task * std::max<int>(1, static_cast<int>(tasks_.size()));
    const int world = ranks_.world_size(), rank = ranks_.rank();
    const int mine = episodes / world + (rank < episodes % world ? 1 : 0);
    const int first = rank * (episodes / world) + std::min(rank, episodes % world);
    // Per episode: its return, its task + 1 (0: none) and its success + 2 (1: unknown),
    // summed over the ranks.
    std::vector<double> all(static_cast<std::size_t>(3 * episodes), 0.0);
    const std::uint64_t seed = seed_ + static_cast<std::uint64_t>(count_++);
    std::vector<std::string> names;
    if (mine > 0) {
      auto venv = make_(mine, seed, first, episodes);
      names = venv->groups();
      auto obs = venv->reset();
      std::vector<bool> ended(static_cast<std::size_t>(mine), false);
      int done = 0;
      while (done < mine) {
        const auto& s = venv->step(act(obs));
        for (const auto& e : s.ended)
          if (!ended[static_cast<std::size_t>(e.env)]) {
            ended[static_cast<std::size_t>(e.env)] = true;
            all[static_cast<std::size_t>(first + e.env)] = e.episode_return;
            all[static_cast<std::size_t>(episodes + first + e.env)] = e.group + 1;
            all[static_cast<std::size_t>(2 * episodes + first + e.env)] = e.success + 2;
            ++done;
          }
        obs = s.obs;
      }
    } else {
      names = tasks_;
    }
    ranks_.sum(all);
    return summarise(all, episodes, names);
  }

  /// Makes `r` the latest result, taken at clock value `at`.
  void record(const EvalResult& r, std::int64_t at) {
    last_ = r;
    at_ = at;
    if (std::isnan(best_) || r.mean > best_) best_ = r.mean;
  }

  [[nodiscard]] const EvalResult& last() const noexcept { return last_; }
  /// The best mean return so far (NaN before the first evaluation).
  [[nodiscard]] double best() const noexcept { return best_; }
  /// The clock value of the latest evaluation (-1: none yet).
  [[nodiscard]] std::int64_t last_at() const noexcept { return at_; }
  /// Evaluations run so far (each took the next seed).
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

  /// State protocol: the results and how many evaluations ran (the same on every rank).
  void save(BinaryWriter& w) const {
    w.value(count_);
    w.value(at_);
    w.value(best_);
    write_result(w, last_);
  }
  struct Saved {
    std::int64_t count = 0, at = -1;
    double best = NAN;
    EvalResult last;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.count = r.value<std::int64_t>("evaluations run");
    s.at = r.value<std::int64_t>("step of the last evaluation");
    s.best = r.value<double>("best evaluation return");
    if (s.count < 0) r.fail("evaluations run", "is negative");
    s.last = read_result(r);
    return s;
  }
  void restore(const Saved& s) {
    count_ = s.count;
    at_ = s.at;
    best_ = s.best;
    last_ = s.last;
  }

 private:
  [[gnu::cold, gnu::noinline]] static EvalResult summarise(const std::vector<double>& all, int episodes, const std::vector<std::string>& names) {
    EvalResult r;
    r.episodes = episodes;
    const auto b = all.begin(), e = all.begin() + episodes;
    r.mean = std::accumulate(b, e, 0.0) / episodes;
    double var = 0;
    for (auto it = b; it != e; ++it) var += (*it - r.mean) * (*it - r.mean);
    r.std = std::sqrt(var / episodes);
    r.min = *std::min_element(b, e);
    r.max = *std::max_element(b, e);
    // success + 2 per episode: 1 unknown, 2 failed, 3 succeeded
    auto success_of = [&](int i) { return all[static_cast<std::size_t>(2 * episodes + i)] - 2; };
    auto rate = [&](auto&& in) {
      int known = 0, won = 0;
      for (int i = 0; i < episodes; ++i)
        if (in(i) && success_of(i) >= 0) ++known, won += success_of(i) > 0.5 ? 1 : 0;
      return known > 0 ? static_cast<double>(won) / known : NAN;
    };
    r.success = rate([](int) { return true; });
    for (std::size_t g = 0; g < names.size(); ++g) {
      auto mine = [&](int i) { return static_cast<std::size_t>(all[static_cast<std::size_t>(episodes + i)]) == g + 1; };
      EvalResult::Group group{names[g], 0.0, 0, rate(mine)};
      for (int i = 0; i < episodes; ++i)
        if (mine(i)) {
          group.mean += all[static_cast<std::size_t>(i)];
          ++group.episodes;
        }
      group.mean = group.episodes > 0 ? group.mean / group.episodes : NAN;
      r.groups.push_back(group);
    }
    return r;
  }
  [[gnu::cold, gnu::noinline]] static void write_result(BinaryWriter& w, const EvalResult& r) {
    for (double x : {r.mean, r.std, r.min, r.max, r.success}) w.value(x);
    w.value(r.episodes);
    w.value(static_cast<std::uint64_t>(r.groups.size()));
    for (const auto& g : r.groups) {
      w.string(g.name);
      w.value(g.mean);
      w.value(g.episodes);
      w.value(g.success);
    }
  }
  [[gnu::cold, gnu::noinline]] static EvalResult read_result(BinaryReader& r) {
    EvalResult e;
    for (double* x : {&e.mean, &e.std, &e.min, &e.max, &e.success}) *x = r.value<double>("evaluation results");
    e.episodes = r.value<int>("evaluation episodes");
    const auto n = r.value<std::uint64_t>("evaluation groups");
    if (n > 100'000) r.fail("evaluation groups", "are implausibly many");
    for (std::uint64_t i = 0; i < n; ++i) {
      EvalResult::Group g;
      g.name = r.string("evaluation group name");
      g.mean = r.value<double>("evaluation group return");
      g.episodes = r.value<int>("evaluation group episodes");
      g.success = r.value<double>("evaluation group success");
      e.groups.push_back(g);
    }
    return e;
  }

  MakeEnvs make_;
  std::uint64_t seed_ = 0;
  Ranks ranks_;
  PhaseTimes* times_ = nullptr;
  std::vector<std::string> tasks_;
  bool success_ = false;
  std::int64_t count_ = 0;
  std::int64_t at_ = -1;
  double best_ = NAN;
  EvalResult last_;
};

}  // namespace anvil
// ---- end <anvil/train/hooks/evaluation.hpp> ----
// ---- begin <anvil/train/hooks/metrics.hpp> ----
/// @file
/// `MetricsLog`: what a run writes about itself in its run directory, on rank 0:
/// `metrics.csv` (one row per log interval), TensorBoard event files, `training.log` (the
/// resolved config, every row, the timing split with its verdict, GPU use, messages) and,
/// at the end, `summary.json`. A row takes the means of the metrics accumulated since the
/// last row and the training episodes' returns over every rank (every rank takes part in
/// a row; rank 0 writes it). Not a template.

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// One row of metrics, as rank 0 writes it.
struct LogRow {
  std::vector<std::pair<std::string, double>> values;  ///< the CSV columns, in order
  std::int64_t step = 0;                                ///< TensorBoard's step
  double wall = 0;                                      ///< seconds since the run began
  double updates_per_s = 0;
  bool complete = false;  ///< the row has every metric the algorithm reports (it has updated)
  std::vector<EpisodeStats::Episode> episodes;  ///< rank 0's training episodes since the last row
};

/// The run's files (see file comment).
class MetricsLog {
 public:
  /// Where a row's numbers come from (all owned by the Trainer, which outlives the log).
  struct Sources {
    Clock* clock = nullptr;
    EpisodeStats* episodes = nullptr;
    UpdateMetrics* metrics = nullptr;
    const Evaluation* evaluation = nullptr;
    PhaseTimes* times = nullptr;
    Ranks* ranks = nullptr;
    /// The algorithm's learning rates by optimizer (TensorBoard `lr/<name>`); may be empty.
    std::function<std::vector<std::pair<std::string, double>>()> learning_rates;
    /// Each network's weights, flat (TensorBoard histograms); may be empty.
    std::function<std::vector<std::pair<std::string, at::Tensor>>()> weights;
  };
  struct Options {
    std::filesystem::path dir;  ///< the run directory
    std::string algorithm;      ///< TensorBoard's prefix for the algorithm's metrics ("sac")
    bool tensorboard = true;
    bool histograms = false;
    ClockUnit record_unit = ClockUnit::env_steps;  ///< TensorBoard's step
    BottleneckAdvice advice;
  };

  MetricsLog() = default;
  /// A log of the run whose numbers come from `src`. Rank 0 opens its files in `dir`:
  /// metrics.csv, training.log (appended to, `header` first) and, when asked, TensorBoard
  /// events; other ranks open nothing.
  [[gnu::cold, gnu::noinline]] MetricsLog(Options o, Sources src, const std::string& header) : opt_(std::move(o)), src_(std::move(src)) {
    if (!src_.ranks->is_main()) return;
    csv_ = MetricsCsv(opt_.dir / "metrics.csv");
    log_.open(opt_.dir / "training.log", std::ios::app);
    if (!log_) throw Error("run.run_dir: cannot write '" + (opt_.dir / "training.log").string() + "'");
    log_ << header;
    log_.flush();
    if (opt_.tensorboard) tb_ = TensorBoardWriter(opt_.dir);
    gpu_ = std::make_unique<GpuMonitor>();
  }

  /// Continues the metrics.csv of a resumed run from the clock it resumed at (rows the
  /// interrupted run wrote later are dropped: the resumed run writes them again).
  /// Returns whether metrics.csv already has the row of this step (a run resumed from its
  /// last checkpoint, written after that row): the run then does not write it again.
  [[gnu::cold, gnu::noinline]] bool resume(const Clock& at) {
    if (!src_.ranks->is_main()) return false;
    csv_ = MetricsCsv::resume(opt_.dir / "metrics.csv", at.env_steps, at.updates);
    return csv_.last_kept() == std::pair{at.env_steps, at.updates};
  }

  /// Gathers a row: the metrics' means since the last row and the recent returns, over
  /// every rank; folds the ranks' finished episodes into the clock. Every rank must call
  /// it; rank 0 gets the row, the others nothing.
  [[gnu::cold, gnu::noinline]] std::optional<LogRow> gather(double wall, std::int64_t first_step, std::int64_t first_update) {
    auto& ranks = *src_.ranks;
    auto& metrics = *src_.metrics;
    if (ranks.world_size() > 1) {
      // Every rank reduces the same list: rank 0 may know more names (it resumed with some).
      auto names = metrics.names();
      ranks.broadcast(names);
      metrics.know(names);
    }
    const auto [k, recent_sum] = src_.episodes->last(10);
    auto fresh = src_.episodes->take_fresh();
    std::vector<double> sums{static_cast<double>(src_.episodes->take_unfolded()), static_cast<double>(k), recent_sum};
    for (const auto& [name, m] : metrics.sums()) {
      sums.push_back(m.first);
      sums.push_back(m.second);
    }
    metrics.clear_values();
    ranks.sum(sums);
    auto& clock = *src_.clock;
    clock.episodes += static_cast<std::int64_t>(sums[0]);
    if (!ranks.is_main()) return std::nullopt;
    LogRow row;
    row.wall = wall;
    row.step = clock.in(opt_.record_unit);
    row.updates_per_s = wall > 0 ? static_cast<double>(clock.updates - first_update) / wall : 0.0;
    row.values = {{"env_steps", static_cast<double>(clock.env_steps)},
                  {"updates", static_cast<double>(clock.updates)},
                  {"wall_s", wall},
                  {"env_steps_per_s", wall > 0 ? static_cast<double>(clock.env_steps - first_step) / wall : 0.0},
                  {"episodes", static_cast<double>(clock.episodes)},
                  {"recent_return", sums[1] > 0 ? sums[2] / sums[1] : NAN},
                  {"eval_return", src_.evaluation->last().mean}};
    add_task_columns(row.values, src_.evaluation->last());
    std::size_t i = 3;
    for (const auto& [name, m] : metrics.sums()) {
      row.values.emplace_back(name, sums[i + 1] > 0 ? sums[i] / sums[i + 1] : NAN);
      i += 2;
    }
    row.complete = clock.updates > 0;
    row.episodes = std::move(fresh);
    return row;
  }

  /// The evaluation's success rate and each task's return and success rate, as columns
  /// (NaN until the first evaluation): `eval_success`, `eval_return/<task>`,
  /// `eval_success/<task>`. Only what the env has: no columns for an env without tasks
  /// that does not say when it succeeds.
  void add_task_columns(std::vector<std::pair<std::string, double>>& v, const EvalResult& last) const {
    const bool success = src_.evaluation->reports_success();
    if (success) v.emplace_back("eval_success", last.success);
    const auto& tasks = src_.evaluation->tasks();
    for (std::size_t g = 0; g < tasks.size(); ++g) {
      const bool have = g < last.groups.size();
      v.emplace_back("eval_return/" + tasks[g], have ? last.groups[g].mean : NAN);
      if (success) v.emplace_back("eval_success/" + tasks[g], have ? last.groups[g].success : NAN);
    }
  }

  /// What the timing verdicts of later rows suggest (a Staged run's next stage has its own).
  void set_advice(BottleneckAdvice a) { opt_.advice = std::move(a); }

  /// Writes `row` to metrics.csv (rank 0).
  [[gnu::cold, gnu::noinline]] void write_csv(const LogRow& row) { csv_.row(row.values, row.complete); }

  /// Puts the latest evaluation into the row of the step `clock` is at, which metrics.csv
  /// already has (a run resumed where its row was written, evaluated as it ends): the file
  /// keeps one row per logged step (rank 0).
  [[gnu::cold, gnu::noinline]] void amend_evaluation(const Clock& clock) {
    if (!src_.ranks->is_main()) return;
    std::vector<std::pair<std::string, double>> v{{"env_steps", static_cast<double>(clock.env_steps)},
                                                  {"updates", static_cast<double>(clock.updates)},
                                                  {"eval_return", src_.evaluation->last().mean}};
    add_task_columns(v, src_.evaluation->last());
    csv_.row(v, true);
  }

  /// Writes `row` to TensorBoard and training.log, with the timing split since the last
  /// row and the GPUs' use; `echo` gets the lines a console shows under the row (may be
  /// empty). Rank 0.
  [[gnu::cold, gnu::noinline]] void write_rest(const LogRow& row, const std::function<void(const std::string&)>& echo = {}) {
    const std::int64_t step = row.step;
    for (const auto& [k, v] : row.values) {
      // evaluations go to TensorBoard when they happen (write_evaluation)
      if (k == "env_steps" || k == "wall_s" || k.rfind("eval_", 0) == 0 || std::isnan(v)) continue;
      const std::string tag = k == "recent_return"     ? "return/recent"
                              : k == "eval_return"     ? "return/eval"
                              : k == "env_steps_per_s" ? "speed/env_steps_per_s"
                              : k == "updates" || k == "episodes" ? "progress/" + k
                                                                  : opt_.algorithm + "/" + k;
      tb_.scalar(tag, v, step);
    }
    if (row.wall > 0) tb_.scalar("speed/updates_per_s", row.updates_per_s, step);
    for (const auto& e : row.episodes) {  // each training episode at the env step it ended
      tb_.scalar("episode/return", e.episode_return, e.env_step);
      tb_.scalar("episode/length", static_cast<double>(e.length), e.env_step);
    }
    if (src_.learning_rates)
      for (const auto& [name, lr] : src_.learning_rates()) tb_.scalar("lr/" + name, lr, step);
    if (src_.weights && opt_.histograms && tb_.is_open())
      for (const auto& [name, w] : src_.weights()) {
        const at::Tensor c = w.detach().to(at::kCPU, at::kFloat).contiguous();
        const auto* data = static_cast<const float*>(c.data_ptr());
        tb_.histogram("weights/" + name, std::span<const float>(data, static_cast<std::size_t>(c.numel())), step);
      }
    std::string line = "step " + std::to_string(step) + ":";
    for (const auto& [k, v] : row.values) {
      char b[64];
      std::snprintf(b, sizeof b, " %s=%.6g", k.c_str(), v);
      line += b;
    }
    log_ << line << "\n";
    std::vector<std::string> extra;
    auto& times = *src_.times;
    if (times.enabled) {
      const auto d = times.since(last_row_times_);
      last_row_times_ = times;
      for (std::size_t p = 0; p < kPhaseNames.size(); ++p)
        tb_.scalar("time/" + std::string(kPhaseNames[p]), d.share(static_cast<Phase>(p)), step);
      if (d.total_seconds() > 0) extra.push_back("time: " + shares_line(d) + "\n  " + bottleneck(d, opt_.advice));
    }
    if (gpu_ && gpu_->available()) {
      const auto g = gpu_->sample();
      for (const auto& s : g) {
        const std::string p = "gpu" + std::to_string(s.index) + "/";
        tb_.scalar(p + "utilization_pct", s.utilization, step);
        tb_.scalar(p + "memory_used_gb", s.memory_used_gb, step);
        tb_.scalar(p + "memory_total_gb", s.memory_total_gb, step);
        tb_.scalar(p + "power_w", s.power_w, step);
      }
      extra.push_back(GpuMonitor::describe(g));
      gpu_line_.clear();
      for (const auto& x : g)
        gpu_line_ += (gpu_line_.empty() ? "" : " ") + ("gpu" + std::to_string(x.index) + " " +
                                                       std::to_string(static_cast<int>(x.utilization)) + "%");
    }
    for (const auto& e : extra) {
      log_ << "  " << e << "\n";
      if (echo) echo("  " + e);
    }
    log_.flush();
  }

  /// An evaluation, to TensorBoard at the step it ran (`step`, in the record unit): its
  /// mean, std, min and max return, its success rate (`success/eval`) and each task's return
  /// and success rate (`task/<name>/return`, `task/<name>/success`) (rank 0), and lines in
  /// training.log.
  [[gnu::cold, gnu::noinline]] void write_evaluation(const EvalResult& r, std::int64_t step) {
    if (!src_.ranks || !src_.ranks->is_main()) return;
    tb_.scalar("return/eval", r.mean, step);
    tb_.scalar("return/eval_std", r.std, step);
    tb_.scalar("return/eval_min", r.min, step);
    tb_.scalar("return/eval_max", r.max, step);
    if (!std::isnan(r.success)) tb_.scalar("success/eval", r.success, step);
    for (const auto& g : r.groups) {
      tb_.scalar("task/" + g.name + "/return", g.mean, step);
      if (!std::isnan(g.success)) tb_.scalar("task/" + g.name + "/success", g.success, step);
    }
    if (log_.is_open()) {
      char b[200];
      std::snprintf(b, sizeof b, "eval at step %lld: return %.6g (std %.6g, min %.6g, max %.6g, %d episodes)",
                    static_cast<long long>(step), r.mean, r.std, r.min, r.max, r.episodes);
      log_ << b;
      if (!std::isnan(r.success)) log_ << ", success " << r.success;
      log_ << "\n";
      for (const auto& g : r.groups) {
        std::snprintf(b, sizeof b, "  task %s: return %.6g, success %.3g (%d episodes)", g.name.c_str(), g.mean, g.success,
                      g.episodes);
        log_ << b << "\n";
      }
    }
  }

  /// A line in training.log (rank 0; nothing elsewhere).
  [[gnu::cold, gnu::noinline]] void note(const std::string& m) {
    if (!log_.is_open()) return;
    log_ << m << "\n";
    log_.flush();
  }

  /// Writes `summary.json` (rank 0): what the run achieved, where its time went, its config.
  [[gnu::cold, gnu::noinline]] void write_summary(const FitResult& r, std::int64_t first_step, std::int64_t first_update,
                                                   double timer_overhead, const std::string& config_hash,
                                                   const std::vector<std::pair<std::string, std::string>>& config,
                                                   const std::vector<std::pair<std::string, std::string>>& provenance = {}) const {
    if (!src_.ranks->is_main()) return;
    using json = nlohmann::ordered_json;
    auto number = [](double x) { return std::isfinite(x) ? json(x) : json(); };  // JSON has no NaN
    const double wall = r.wall_seconds;
    const auto& times = *src_.times;
    json j;
    j["final_eval_return"] = number(r.final_eval_return);
    j["best_eval_return"] = number(r.best_eval_return);
    if (src_.evaluation) {  // the last evaluation's success rate and each task's results
      const auto& last = src_.evaluation->last();
      if (src_.evaluation->reports_success()) j["final_eval_success"] = number(last.success);
      if (!last.groups.empty()) {
        json tasks = json::object();
        for (const auto& g : last.groups) {
          json e = json::object();
          e["return"] = number(g.mean);
          if (src_.evaluation->reports_success()) e["success"] = number(g.success);
          e["episodes"] = g.episodes;
          tasks[g.name] = e;
        }
        j["final_eval_tasks"] = tasks;
      }
    }
    j["env_steps"] = r.env_steps;
    j["updates"] = r.updates;
    j["wall_seconds"] = number(wall);
    j["env_steps_per_s"] = number(static_cast<double>(r.env_steps - first_step) / wall);
    j["updates_per_s"] = number(static_cast<double>(r.updates - first_update) / wall);
    json shares = json::object(), seconds = json::object();
    for (std::size_t i = 0; i < kPhaseNames.size(); ++i) {
      const std::string name(kPhaseNames[i]);
      shares[name] = number(times.share(static_cast<Phase>(i)));
      seconds[name] = number(times.seconds(static_cast<Phase>(i)));
    }
    j["phase_share"] = shares;
    j["phase_seconds"] = seconds;
    j["bottleneck"] = bottleneck(times, opt_.advice);
    j["timer_overhead"] = number(timer_overhead);
    j["status"] = r.stopped_by.empty() ? std::string("finished") : r.stopped_by;
    j["world_size"] = src_.ranks->world_size();
    j["config_hash"] = config_hash;
    json p = json::object();
    for (const auto& [k, v] : provenance) p[k] = v;
    j["provenance"] = p;
    json c = json::object();
    for (const auto& [k, v] : config) c[k] = typed_json(v);
    j["config"] = c;
    write_file_atomic(opt_.dir / "summary.json", j.dump(2) + "\n");
  }

  /// The resolved config and the run's provenance as a TensorBoard text summary (the Text
  /// tab), at `step` (rank 0).
  [[gnu::cold, gnu::noinline]] void write_config_text(const std::string& config_yaml,
                                                      const std::vector<std::pair<std::string, std::string>>& provenance,
                                                      std::int64_t step) {
    if (!src_.ranks || !src_.ranks->is_main()) return;
    std::string md = "| | |\n|---|---|\n";
    for (const auto& [k, v] : provenance) md += "| " + k + " | `" + v + "` |\n";
    tb_.text("run/provenance", md, step);
    tb_.text("run/config", "```yaml\n" + config_yaml + "```\n", step);
  }

  /// Writes the rows metrics.csv held back (the run ended before its algorithm reported
  /// every metric) and flushes TensorBoard and training.log.
  [[gnu::cold, gnu::noinline]] void flush() {
    csv_.flush_pending();
    tb_.flush();
    if (log_.is_open()) log_.flush();
  }

  /// The GPUs' use at the last row ("gpu0 97%"), for the progress bar; empty without GPUs.
  [[nodiscard]] const std::string& gpu_line() const noexcept { return gpu_line_; }
  /// What the GPU monitor found, once (rank 0; empty elsewhere).
  [[nodiscard]] std::string gpu_status() const { return gpu_ ? gpu_->status() : std::string(); }
  [[nodiscard]] const std::filesystem::path& dir() const noexcept { return opt_.dir; }

 private:
  Options opt_;
  Sources src_;
  MetricsCsv csv_;
  TensorBoardWriter tb_;
  std::ofstream log_;
  std::unique_ptr<GpuMonitor> gpu_;
  PhaseTimes last_row_times_;  ///< phase times at the last row
  std::string gpu_line_;       ///< GPU use for the progress bar
};

}  // namespace anvil
// ---- end <anvil/train/hooks/metrics.hpp> ----
// ---- begin <anvil/train/loops/episodic.hpp> ----
/// @file
/// `EpisodicLoop`: the loop of algorithms that learn from whole episodes (Monte-Carlo
/// policy gradients; COMA's rounds of episodes). Each iteration is a round: every env starts
/// a new episode, the envs step together with the algorithm's exploration until each has
/// finished its episode (an env whose episode ended runs on, but those steps are not kept),
/// the round's episodes go to the buffer as one padded batch, and the algorithm updates from
/// it (as many passes as it likes, inside its `update`). The clock counts the kept steps of
/// every rank (one sum over the ranks per round) and, every rank running as many episodes
/// per round, the ranks stay in lockstep.
///
/// An algorithm chooses this loop by naming it: `using loop = anvil::EpisodicLoop;`.

#include <cstdint>
#include <string>
#include <vector>


namespace anvil {

/// What the episodic loop needs of its buffer: episode steps in, a round of episodes out.
template <class B>
concept EpisodeStorage = Buffer<B> && std::same_as<typename B::Step, EpisodeStep> &&
                         requires(B& b, const B& cb) {
                           { cb.episodes() } -> std::same_as<typename B::Batch>;
                           { b.clear() };
                         };

/// Loop policy for learning from whole episodes (see file comment); its `train` section is
/// the on-policy loop's.
struct EpisodicLoop : loops::LoopTag<"episodic", "episodic", loops::OnPolicyConfig, ClockUnit::env_steps> {
  /// What this loop needs of the algorithm and the buffer, one sentence each.
  template <class A, class B>
  struct Rules {
    static constexpr bool buffer_ok = EpisodeStorage<B>;
    static_assert(buffer_ok,
                  "Trainer: the episodic loop stores rounds of EpisodeSteps and learns from their episodes(); the "
                  "Buffer cannot (see anvil::EpisodeStorage); use EpisodeBuffer");
    static constexpr bool batch_ok = !buffer_ok || std::same_as<typename A::Batch, typename B::Batch>;
    static_assert(batch_ok, "Trainer: the episodic loop hands the Algorithm the Buffer's episodes, which are not its Batch");
    static constexpr bool ok = buffer_ok && batch_ok;
  };

  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, EpisodicLoop, A, B> {
    using Base = loops::Stage<Runner, EpisodicLoop, A, B>;
    using Base::cfg_, Base::p_;

   public:
    using Base::Base;

    /// At the stage's start and after a resume: the buffer learns the plan.
    void prepare() {
      p_.buffer.plan(StoragePlan{p_.collector.num_envs(), cfg_.steps, 0.0});
    }

    /// One round: an episode of every env, then an update from them.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      collect_round();
      loops::update_once(p_, p_.buffer.episodes(), cfg_.ema_decay);
    }

    /// Collects one episode of every env into the buffer (cleared first).
    void collect_round() {
      p_.buffer.clear();
      p_.collector.restart();
      const std::int64_t n = p_.collector.num_envs();
      std::vector<bool> live(static_cast<std::size_t>(n), true);
      at::Tensor live_t = at::ones({n});
      std::int64_t running = n, kept = 0;
      while (running > 0) {
        at::Tensor action;
        {
          const auto& obs = p_.collector.observations();
          ScopedPhase ph(p_.times, Phase::act);
          action = p_.algorithm.act(obs, ActMode::explore).to(at::kCPU);
        }
        const envs::VecStep& s = p_.collector.step(action, /*count_episodes=*/false);
        {
          ScopedPhase ph(p_.times, Phase::buffer_add);
          p_.buffer.add(EpisodeStep{p_.collector.previous_observations(), action, s.reward, s.terminated, s.truncated,
                                    live_t.clone(), s.next_obs});
        }
        kept += running;
        for (const auto& e : s.ended) {
          const auto i = static_cast<std::size_t>(e.env);
          if (!live[i]) continue;
          live[i] = false;
          live_t[e.env] = 0.0f;
          --running;
          p_.collector.episodes().record(e.episode_return, e.length, p_.collector.env_step());
        }
      }
      p_.clock.env_steps += static_cast<std::int64_t>(p_.ranks.sum(static_cast<double>(kept)));
    }

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string passes = k.find("data_passes"), batch = k.find("batch_size");
      BottleneckAdvice a;
      a.env = "raise env.num_envs or env.threads";
      a.learn = loops::either(passes.empty() ? "" : "fewer " + passes, ", or ", "add ranks");
      a.comm = loops::either(batch.empty() ? "" : "a larger " + batch + " (fewer all-reduces per round)", " or ", "fewer ranks");
      a.act = loops::act_advice();
      a.side = loops::side_advice(k);
      return a;
    }

  };
};

}  // namespace anvil
// ---- end <anvil/train/loops/episodic.hpp> ----
// ---- begin <anvil/train/loops/offline.hpp> ----
/// @file
/// `OfflineLoop`: learning from data already stored, without stepping the envs: each
/// iteration is one gradient update on a batch sampled from the buffer, and the clock
/// counts gradient updates (`train.steps`, `train.eval_interval`, `run.log_interval` and
/// `run.checkpoint_interval` are in updates). The data is a buffer file
/// (`train.dataset`: the `checkpoint-*.buffer` a run with `run.checkpoint_buffer` writes
/// beside each checkpoint) or, in a `Staged` run, what the stages before left in the
/// buffer. Evaluations still run episodes on the envs.
///
/// A resumed offline run continues its sampling exactly where it stopped only when the
/// checkpoint saved the buffer too (`run.checkpoint_buffer`), since the sampling state
/// lives in the buffer; otherwise it samples the dataset afresh. A buffer that reads
/// demonstrations (`DemoDataset`: `train.dataset` is an HDF5 file) keeps only its position
/// in checkpoints, so such runs always resume exactly. Algorithms that learn from windows of
/// steps (`sequence()`), normalise by the data's ranges (`fit_normalizer`) or schedule their
/// learning rate over the run (`plan_updates`) are told so before the first update. A
/// buffer that also replays online steps (`CollectiveReplay`) hands out its dataset's
/// batches here (`sample_dataset`), with the algorithm's `dataset_batch_size()` rows.

#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>


namespace anvil {

/// A buffer that keeps its dataset apart from what it replays online (CollectiveReplay in a
/// staged run): the offline loop samples the dataset alone (`sample_dataset`, `dataset_size`).
template <class B>
concept KeepsDatasetApart = requires(B& b, const B& cb, std::int64_t n) {
  b.sample_dataset(n);
  { cb.dataset_size() } -> std::convertible_to<std::int64_t>;
};
/// An algorithm whose dataset batches count other rows than `batch_size()` does.
template <class A>
concept NamesDatasetBatch = requires(const A& a) {
  { a.dataset_batch_size() } -> std::convertible_to<std::int64_t>;
};
/// An algorithm that learns from windows of consecutive steps: `sequence()` gives the
/// observations and actions each window holds, which the buffer plans for.
template <class A>
concept LearnsFromSequences = requires(const A& a) {
  { a.sequence() } -> std::convertible_to<std::pair<std::int64_t, std::int64_t>>;
};
/// An algorithm that scales its inputs by the data's ranges (`fit_normalizer`), learned once
/// from the buffer's `ranges()` before its first update unless a checkpoint restored them.
template <class A, class B>
concept FitsDataNormalizer = requires(A& a, B& b) {
  a.fit_normalizer(b.ranges()[0], b.ranges()[1], b.ranges()[2], b.ranges()[3]);
  { a.has_normalizer() } -> std::convertible_to<bool>;
};
/// An algorithm that schedules by the run's length (e.g. a cosine learning rate): told the
/// update the stage ends at.
template <class A>
concept PlansUpdates = requires(A& a) { a.plan_updates(std::int64_t{0}); };

/// Loop policy for learning from stored data (see file comment).
struct OfflineLoop : loops::LoopTag<"offline", "offline", loops::OfflineConfig, ClockUnit::updates> {
  /// A batch of the dataset: `sample_dataset(n)` where the buffer also replays online
  /// steps (CollectiveReplay, for a staged run), else `sample(n)`.
  template <class B>
  static auto dataset_batch(B& b, std::int64_t n) {
    if constexpr (KeepsDatasetApart<B>) return b.sample_dataset(n);
    else return b.sample(n);
  }
  template <class B>
  static std::int64_t dataset_size(const B& b) {
    if constexpr (KeepsDatasetApart<B>) return b.dataset_size();
    else return b.size();
  }
  template <class A>
  static std::int64_t batch_rows(const A& a) {
    if constexpr (NamesDatasetBatch<A>) return a.dataset_batch_size();
    else return a.batch_size();
  }

  /// What this loop needs of the algorithm and the buffer, one sentence each.
  template <class A, class B>
  struct Rules {
    static constexpr bool algorithm_ok = OffPolicyAlgorithm<A>;
    static_assert(algorithm_ok,
                  "Trainer: the offline loop samples batch_size() stored transitions per update; the Algorithm "
                  "lacks batch_size() or discount() (see anvil::OffPolicyAlgorithm)");
    static constexpr bool buffer_ok = !algorithm_ok || LoadsDataset<B>;
    static_assert(buffer_ok,
                  "Trainer: the offline loop samples random batches from data it loads from a file; the Buffer "
                  "lacks sample(n) or load(path) (see anvil::LoadsDataset)");
    static constexpr bool batch_ok = !(algorithm_ok && buffer_ok) || requires(A& a, B& b, StepContext& c) { a.update(dataset_batch(b, 1), c); };
    static_assert(batch_ok, "Trainer: the offline loop hands the Algorithm the Buffer's batches (sample_dataset(n) where the Buffer "
                            "also replays, else sample(n)), but the Algorithm has no update for them");
    static constexpr bool ok = algorithm_ok && buffer_ok && batch_ok;
  };

  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OfflineLoop, A, B> {
    using Base = loops::Stage<Runner, OfflineLoop, A, B>;
    using Base::cfg_, Base::p_, Base::origin_;

   public:
    using Base::Base;

    /// At the stage's start and after a resume: the buffer learns the plan, and the dataset
    /// is read (once, when the run is built; a resume that restores a saved buffer replaces it).
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      StoragePlan plan{p_.collector.num_envs(), 0, p_.algorithm.discount()};
      if constexpr (LearnsFromSequences<A>) std::tie(plan.sequence_obs, plan.sequence_actions) = p_.algorithm.sequence();
      p_.buffer.plan(plan);
      if (!loaded_ && !cfg_.dataset->empty()) {
        if (!std::filesystem::exists(*cfg_.dataset))
          throw ConfigError("train.dataset: no file at '" + *cfg_.dataset + "'");
        if constexpr (ReadsDemonstrations<B>) {
          p_.buffer.load(*cfg_.dataset);  // demonstrations in their own format (HDF5)
        } else {
          StateSections data;
          data.add(std::string(B::config_section.view()), p_.buffer);
          BinaryReader r(*cfg_.dataset, kBufferFileFormat);
          auto apply = data.read(r);
          r.finish();
          apply();
        }
      }
      loaded_ = true;
      // An algorithm that scales its inputs by the data's ranges learns them once, before its
      // first update (a restored one keeps its checkpoint's).
      if constexpr (FitsDataNormalizer<A, B>)
        if (!p_.algorithm.has_normalizer() && dataset_size(p_.buffer) > 0) {
          const auto r = p_.buffer.ranges();
          p_.algorithm.fit_normalizer(r[0], r[1], r[2], r[3]);
        }
      if constexpr (PlansUpdates<A>) p_.algorithm.plan_updates(origin_ + cfg_.steps);
    }

    /// One iteration: one update on a batch sampled from the buffer.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      const std::int64_t n = batch_rows(p_.algorithm);
      if (dataset_size(p_.buffer) < n)
        throw ConfigError("train.dataset: the buffer holds " + std::to_string(dataset_size(p_.buffer)) +
                          " transitions, fewer than one batch (" + std::string(A::config_section.view()) +
                          ".batch_size = " + std::to_string(n) + "); give a buffer file with more");
      decltype(dataset_batch(p_.buffer, n)) batch;
      {
        ScopedPhase ph(p_.times, Phase::sample);
        batch = dataset_batch(p_.buffer, n);
      }
      const auto info = loops::update_once(p_, batch, cfg_.ema_decay);
      if constexpr (PrioritizedReplay<B>)
        if (info.td_error.defined()) p_.buffer.update_priorities(batch.index, info.td_error);
    }

    void at_log_row() {}  // no env steps: no new normaliser statistics

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's: an offline
    /// run is meant to spend its time in updates.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string batch = k.find("batch_size");
      BottleneckAdvice a;
      a.learn = "as an offline run should; add ranks to go faster";
      a.comm = loops::either(batch.empty() ? "" : "a larger " + batch + " (fewer all-reduces per sample)", " or ", "fewer ranks");
      a.sample = batch.empty() ? "" : "a larger " + batch + " (fewer, larger draws from the dataset)";
      a.side = loops::side_advice(k);
      return a;
    }

   private:
    bool loaded_ = false;
  };
};

}  // namespace anvil
// ---- end <anvil/train/loops/offline.hpp> ----
// ---- begin <anvil/train/process_settings.hpp> ----
/// @file
/// What a run sets for the whole process, in one call when its Trainer is built
/// (`apply_process_settings`): Torch's intra-op threads, the precision policy's switches
/// (cuDNN benchmark, anomaly detection, TF32) and Torch's global generators, seeded for this
/// rank; and those generators as a section of the run's state (`TorchGenerators`). Not a
/// template.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/utils.h>

#include <string>
#include <vector>


namespace anvil {

/// Torch's global random generators (the CPU one, and the run's CUDA device's): the
/// `torch_rng` section of a run's state (this rank's own).
class TorchGenerators {
 public:
  TorchGenerators() = default;
  explicit TorchGenerators(c10::Device device) : device_(device) {}
  void save(BinaryWriter& w) const {
    write_tensor(w, at::detail::getDefaultCPUGenerator().get_state());
    w.value(device_.is_cuda());
    if (device_.is_cuda()) write_tensor(w, at::globalContext().defaultGenerator(device_).get_state());
  }
  struct Saved {
    at::Tensor cpu, cuda;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.cpu = read_tensor(r, "torch CPU generator state", at::detail::getDefaultCPUGenerator().get_state());
    const bool was_cuda = r.value<bool>("CUDA flag");
    if (was_cuda != device_.is_cuda())
      r.fail("CUDA flag", was_cuda ? "says the run was on CUDA; this one is on " + device_.str()
                                   : "says the run was on the CPU; this one is on " + device_.str());
    if (was_cuda)
      s.cuda = read_tensor(r, "torch CUDA generator state", at::globalContext().defaultGenerator(device_).get_state());
    return s;
  }
  void restore(const Saved& s) const {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(s.cpu);
    if (s.cuda.defined()) {
      at::Generator cuda = at::globalContext().defaultGenerator(device_);
      cuda.set_state(s.cuda);
    }
  }

 private:
  c10::Device device_{c10::kCPU};
};

/// Applies a run's process-wide settings (see file comment): `threads` intra-op threads,
/// precision `p`'s switches, and Torch's generators seeded from `ctx` (its seed and rank).
/// Returns what the run should say about them and about the CPU's BLAS (with the
/// `update_threads` the step context uses).
inline std::vector<std::string> apply_process_settings(int threads, const PrecisionSettings& p, const RunContext& ctx,
                                                       int update_threads) {
  torch::set_num_threads(threads);
  seed_torch(ctx);
  const c10::Device& device = ctx.device;
  std::vector<std::string> notes;
  auto& g = at::globalContext();
  g.setBenchmarkCuDNN(p.cudnn_benchmark);
  torch::autograd::AnomalyMode::set_enabled(p.detect_anomaly);
  g.setAllowTF32CuBLAS(p.allow_tf32);
  g.setAllowTF32CuDNN(p.allow_tf32);
  if (p.allow_tf32 && !device.is_cuda())
    notes.push_back("precision: TF32 changes only CUDA matrix products; on the CPU this run is FP32");
  if (p.detect_anomaly) notes.push_back("precision: autograd anomaly detection is on (slow; for debugging NaNs)");
  if (device.is_cuda() && !cuda::kCudaGraphs)
    notes.push_back("cuda: this program was built without anvil's CUDA graphs (ANVIL_WITH_CUDA is not 1), so updates "
                    "run op by op, several times slower for small networks; build with CMake's anvil::anvil target, or "
                    "define ANVIL_WITH_CUDA=1 when LibTorch has CUDA");
  if (!device.is_cuda()) {
    const BlasInfo b = blas_info();
    if (b.reference)
      notes.push_back("cpu: Torch uses the reference BLAS (" + b.library +
                      "): matrix products are about 10x slower; run scripts/install-deps.sh");
    else if (b.openblas)
      notes.push_back("cpu: OpenBLAS" + (b.core.empty() ? std::string() : " (" + b.core + " kernels)") + ", " +
                      std::to_string(at::get_num_threads()) + " intra-op thread(s), " + std::to_string(update_threads) +
                      " update thread(s)");
  }
  return notes;
}

}  // namespace anvil
// ---- end <anvil/train/process_settings.hpp> ----
// ---- begin <anvil/train/run.hpp> ----
/// @file
/// `Run`: the life of a training run that does not depend on its policy types, compiled
/// once whatever the Trainer: the run directory, the loop's iterations and the hooks that
/// fire on its clock (evaluation, log rows, checkpoints, progress), resuming, giving every
/// rank rank 0's state and checking that the ranks agree, and the end of the run. The
/// Trainer (train/trainer.hpp) builds the parts and hands them to a Run; a custom main can
/// call the same steps through the Trainer (`begin`, `evaluate`, `log`, `finish`, ...).

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// ---- begin <anvil/train/hooks/checkpoint.hpp> ----
/// @file
/// `Checkpoints`: a run's state on disk. A checkpoint is `checkpoint-<step, 12 digits>.ckpt`
/// in the run directory (names sort by step): a header naming the run that wrote it (its
/// algorithm, precision and every config field), then every section of the run's state
/// (core/state.hpp), then a checksum. With `run.checkpoint_buffer` the buffer goes beside it
/// in `checkpoint-<step>.buffer`, written first, so a checkpoint never names a buffer file
/// that is not there. Both are replaced atomically: a crash or a kill mid-save leaves the
/// previous checkpoint intact. The oldest beyond `run.keep_last` are deleted.
///
/// Reading checks the header against this run (the error names the first config field that
/// differs; `run.*` but `run.seed`, `parallel.*` and a loop's `steps`, `eval_interval` and
/// `eval_episodes` may differ), then reads every section and the buffer file, then the
/// checksums, and changes nothing until all of it has passed. Not a template.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// A run's checkpoints (see file comment).
class Checkpoints {
 public:
  /// The format tag of checkpoint files.
  static constexpr const char* kFormat = "anvil Checkpoint v2";

  /// What a checkpoint says about the run that wrote it.
  struct Identity {
    std::string algorithm;  ///< the algorithm's config section, e.g. "sac"
    std::string precision;  ///< e.g. "fp32"
    std::string config_hash;
    std::vector<std::pair<std::string, std::string>> config;  ///< every field, `key = value`
  };
  struct Options {
    std::filesystem::path dir;  ///< where `save_at` writes (the run directory)
    int keep_last = 3;          ///< checkpoints kept by `save_at`
    bool with_buffer = false;   ///< also write the buffer beside each checkpoint
  };

  Checkpoints() = default;
  /// Checkpoints of the run `id` whose state is `state` and whose buffer is `buffer` (both
  /// must outlive this object).
  Checkpoints(Options o, Identity id, const StateSections& state, const StateSections& buffer)
      : opt_(std::move(o)), id_(std::move(id)), state_(&state), buffer_(&buffer) {}

  /// Writes a checkpoint to `file` (and the buffer beside it with `with_buffer`).
  [[gnu::cold, gnu::noinline]] void save(const std::filesystem::path& file) const {
    if (opt_.with_buffer) {
      BinaryWriter b(buffer_file(file), kBufferFileFormat);
      buffer_->write(b);
      b.commit();
    }
    BinaryWriter w(file, kFormat);
    w.string(id_.algorithm);
    w.string(id_.precision);
    w.string(id_.config_hash);
    w.value(static_cast<std::uint64_t>(id_.config.size()));
    for (const auto& [k, v] : id_.config) {
      w.string(k);
      w.string(v);
    }
    w.value(opt_.with_buffer);
    state_->write(w);
    w.commit();
  }

  /// A checkpoint at clock value `step` in the run directory; then the oldest beyond
  /// `keep_last` (and their buffers) are deleted. Returns its path.
  [[gnu::cold, gnu::noinline]] std::filesystem::path save_at(std::int64_t step) const {
    const auto file = file_for(step);
    save(file);
    auto all = in(opt_.dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(opt_.keep_last) < all.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove(all[i], ec);
      std::filesystem::remove(buffer_file(all[i]), ec);
    }
    return file;
  }

  /// Reads and checks `file` (and its buffer file when it has one) against this run (see
  /// file comment); the returned function applies it.
  [[gnu::cold, gnu::noinline]] [[nodiscard]] StateSections::Apply read(const std::filesystem::path& file) const {
    if (!std::filesystem::exists(file)) throw Error("run.resume: no checkpoint at '" + file.string() + "'");
    BinaryReader r(file, kFormat);
    const auto algorithm = r.string("algorithm");
    if (algorithm != id_.algorithm)
      throw Error("'" + file.string() + "' was written by a " + algorithm + " run; this run is " + id_.algorithm);
    const auto precision = r.string("precision");
    if (precision != id_.precision)
      throw Error("'" + file.string() + "' was written by a run in " + precision + " precision; this run is " +
                  id_.precision + " (resume needs the same precision)");
    (void)r.string("config hash");  // for people and tools reading the file; the fields are compared below
    const auto n = r.value<std::uint64_t>("config");
    if (n > 100'000) r.fail("config", "has an implausible number of fields");
    std::map<std::string, std::string> saved;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("config key");
      saved[k] = r.string("config value");
    }
    for (const auto& [k, v] : id_.config) {
      if (may_differ(k)) continue;
      if (auto it = saved.find(k); it != saved.end() && it->second != v)
        throw Error("'" + file.string() + "' was written by a run with " + k + " = " + it->second + "; this run has " +
                    k + " = " + v +
                    " (a resumed run needs the same algorithm, networks, buffer, envs and precision)");
    }
    const bool with_buffer = r.value<bool>("buffer flag");
    auto apply = state_->read(r);
    r.finish();
    StateSections::Apply apply_buffer;
    if (with_buffer) {
      const auto bfile = buffer_file(file);
      if (!std::filesystem::exists(bfile))
        throw Error("'" + file.string() + "' was saved with its buffer, but '" + bfile.string() + "' is missing");
      BinaryReader b(bfile, kBufferFileFormat);
      apply_buffer = buffer_->read(b);
      b.finish();
    }
    return [apply = std::move(apply), apply_buffer = std::move(apply_buffer)] {
      apply();
      if (apply_buffer) apply_buffer();
    };
  }

  /// What `file` says of the run that wrote it, from its header alone (e.g. the precision an
  /// evaluation of the run must use); an Error naming the file when it is not a checkpoint.
  [[nodiscard]] static Identity identity(const std::filesystem::path& file) {
    if (!std::filesystem::exists(file)) throw Error("no checkpoint at '" + file.string() + "'");
    BinaryReader r(file, kFormat);
    Identity id;
    id.algorithm = r.string("algorithm");
    id.precision = r.string("precision");
    id.config_hash = r.string("config hash");
    const auto n = r.value<std::uint64_t>("config");
    if (n > 100'000) r.fail("config", "has an implausible number of fields");
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("config key");
      id.config.emplace_back(std::move(k), r.string("config value"));
    }
    return id;
  }
  /// The latest checkpoint in `dir` (empty when it holds none).
  [[nodiscard]] static std::filesystem::path latest(const std::filesystem::path& dir) {
    const auto all = in(dir);
    return all.empty() ? std::filesystem::path() : all.back();
  }

  /// The checkpoint `run.resume` names: a path as it is, or "auto": the latest in the run
  /// directory (empty when there is none).
  [[nodiscard]] std::filesystem::path resolve(const std::string& resume) const {
    return resume == "auto" ? latest(opt_.dir) : std::filesystem::path(resume);
  }

  /// The checkpoint file for clock value `step` in the run directory.
  [[nodiscard]] std::filesystem::path file_for(std::int64_t step) const {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoint-%012lld.ckpt", static_cast<long long>(step));
    return opt_.dir / name;
  }
  /// The checkpoints in `dir`, oldest first.
  [[nodiscard]] static std::vector<std::filesystem::path> in(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      if (name.rfind("checkpoint-", 0) == 0 && e.path().extension() == ".ckpt") found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  /// The buffer file beside `checkpoint`.
  [[nodiscard]] static std::filesystem::path buffer_file(std::filesystem::path checkpoint) {
    return checkpoint.replace_extension(".buffer");
  }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }
  /// Where `save_at` writes and `resolve("auto")` looks (the run directory, once known).
  void set_dir(std::filesystem::path dir) { opt_.dir = std::move(dir); }

 private:
  // Fields a resumed run may change: where and how it runs, and how long and how often it
  // evaluates (a loop's own `steps`, `eval_interval`, `eval_episodes`, at any depth).
  static bool may_differ(const std::string& key) {
    if (key == "run.seed") return false;  // another seed is another run
    if (key.rfind("run.", 0) == 0 || key.rfind("parallel.", 0) == 0) return true;
    if (key.rfind("train.", 0) != 0) return false;
    const auto leaf = key.substr(key.rfind('.') + 1);
    return leaf == "steps" || leaf == "eval_interval" || leaf == "eval_episodes";
  }

  Options opt_;
  Identity id_;
  const StateSections* state_ = nullptr;
  const StateSections* buffer_ = nullptr;
};

}  // namespace anvil
// ---- end <anvil/train/hooks/checkpoint.hpp> ----
// ---- begin <anvil/train/hooks/progress.hpp> ----
/// @file
/// `ProgressHook`: the console of a run (rank 0): a live bar on a terminal, redrawn as the
/// run goes (at most ten times a second), or one line per log row when the output is a file
/// or a pipe; messages on lines of their own without breaking the bar (`run.progress`).
/// Not a template.

#include <string>


namespace anvil {

/// The console of a run (see file comment).
class ProgressHook {
 public:
  /// No progress shown (ranks other than 0, which also say nothing).
  ProgressHook() : p_(Progress::Style::off) {}
  /// Shows progress as `mode` says (`auto`: a bar on a terminal, lines otherwise).
  explicit ProgressHook(ProgressMode mode)
      : p_(mode == ProgressMode::auto_ ? Progress::detect()
           : mode == ProgressMode::bar ? Progress::Style::bar
           : mode == ProgressMode::lines ? Progress::Style::lines
                                         : Progress::Style::off) {}

  /// After each iteration: redraws the bar.
  void iteration(const ProgressState& s) {
    if (p_.style() == Progress::Style::bar) p_.show(s);
  }
  /// At each log row: a line (lines mode).
  void row(const ProgressState& s) {
    if (p_.style() == Progress::Style::lines) p_.show(s, true);
  }
  /// A line under a log row (lines mode), e.g. the timing split.
  void echo(const std::string& line) {
    if (p_.style() == Progress::Style::lines) p_.message(line);
  }
  /// A message on its own line (whatever the style: `off` silences only the progress).
  void say(const std::string& m) { p_.message(m); }
  /// Ends the bar's line.
  void finish() { p_.finish(); }
  [[nodiscard]] Progress::Style style() const noexcept { return p_.style(); }

 private:
  Progress p_;
};

}  // namespace anvil
// ---- end <anvil/train/hooks/progress.hpp> ----
// ---- begin <anvil/train/signals.hpp> ----
/// @file
/// Signals a training run answers (the run's side; parallel/launch.hpp forwards them to
/// the ranks):
///  - the first SIGINT (Ctrl-C) or SIGTERM (a cluster's preemption: SLURM sends SIGTERM,
///    then SIGKILL after a grace period) asks the run to stop: it finishes the current
///    iteration, writes a log row, a checkpoint and summary.json, and `fit` throws
///    `Interrupted`, which exits 130 (SIGINT) or 143 (SIGTERM). `--resume=auto` in the
///    same run directory continues it, e.g. in a requeued job;
///  - a second SIGINT or SIGTERM ends the process at once (exit 130 or 143). The same signal
///    delivered twice within half a second (by the terminal to a whole process group and
///    by a launcher forwarding it) counts once;
///  - SIGUSR1 asks for a checkpoint at the end of the current iteration; the run goes on.
///
/// The handlers only set flags (async-signal-safe); a `Run` installs them for the run's
/// life (`Handlers`) and reads the flags between iterations. Linux/POSIX.

#include <array>
#include <csignal>
#include <ctime>
#include <string>

#include <unistd.h>


namespace anvil {

/// What `fit` throws after a run stopped on SIGINT or SIGTERM had saved what it had
/// (checkpoint, summary): its exit code is 128 + the signal, and an uncaught one prints
/// `stopped: <message>`.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& message) : Error(message), signal_(signal) {}
  [[nodiscard]] int exit_code() const noexcept override { return 128 + signal_; }
  [[nodiscard]] const char* label() const noexcept override { return "stopped"; }
  [[nodiscard]] int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

namespace signals {

namespace detail {
inline volatile std::sig_atomic_t g_stop = 0;        // SIGINT or SIGTERM, once asked
inline volatile std::sig_atomic_t g_checkpoint = 0;  // SIGUSR1 since the last take
inline std::timespec g_first{};                      // when the stop signal came

inline void on_signal(int sig) {
  if (sig == SIGUSR1) {
    g_checkpoint = 1;
    return;
  }
  std::timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  if (g_stop == 0) {
    g_stop = sig;
    g_first = now;
    return;
  }
  const double since = static_cast<double>(now.tv_sec - g_first.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - g_first.tv_nsec);
  if (sig == g_stop && since < 0.5) return;  // one signal, delivered twice
  static const char msg[] = "\nstopped: a second signal; exiting at once (the last checkpoint is intact)\n";
  (void)!::write(2, msg, sizeof msg - 1);
  ::_exit(128 + sig);
}
}  // namespace detail

/// The handlers, installed for an object's life (a `Run` holds one from `begin` to the
/// end of the run); the actions there were before come back after. Flags from an earlier
/// run are forgotten on install.
class Handlers {
 public:
  Handlers() = default;
  Handlers(const Handlers&) = delete;
  Handlers& operator=(const Handlers&) = delete;
  ~Handlers() { restore(); }
  void install() {
    if (installed_) return;
    detail::g_stop = 0;
    detail::g_checkpoint = 0;
    struct sigaction sa {};
    sa.sa_handler = &detail::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    installed_ = true;
  }
  void restore() {
    if (!installed_) return;
    for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    installed_ = false;
  }

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGUSR1};
  std::array<struct sigaction, 3> old_{};
  bool installed_ = false;
};

/// The stop signal received (SIGINT or SIGTERM), or 0.
[[nodiscard]] inline int stop_requested() noexcept { return detail::g_stop; }
/// Whether SIGUSR1 came since the last call (and forgets it).
[[nodiscard]] inline bool take_checkpoint_request() noexcept {
  if (!detail::g_checkpoint) return false;
  detail::g_checkpoint = 0;
  return true;
}
/// "SIGINT", "SIGTERM", ... for messages.
[[nodiscard]] inline std::string name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace signals

}  // namespace anvil
// ---- end <anvil/train/signals.hpp> ----

namespace anvil {

/// What a Run needs of the loop that drives it, whatever the loop's type.
class LoopControl {
 public:
  virtual ~LoopControl() = default;
  [[nodiscard]] virtual LoopSettings settings() const = 0;
  [[nodiscard]] virtual int stage() const = 0;
  [[nodiscard]] virtual bool done() const = 0;
  virtual void iterate(std::int64_t quiet_until) = 0;
  virtual void at_log_row() = 0;
  virtual void resumed() = 0;
  [[nodiscard]] virtual BottleneckAdvice advice(const AdviceKeys& keys) const = 0;
};

/// `LoopControl` of a loop runner `R` (train/loops/loop.hpp).
template <class R>
class LoopControlOf final : public LoopControl {
 public:
  explicit LoopControlOf(R& r) : r_(r) {}
  [[nodiscard]] LoopSettings settings() const override { return r_.settings(); }
  [[nodiscard]] int stage() const override { return r_.stage(); }
  [[nodiscard]] bool done() const override { return r_.done(); }
  void iterate(std::int64_t quiet_until) override { r_.iterate(quiet_until); }
  void at_log_row() override { r_.at_log_row(); }
  void resumed() override { r_.resumed(); }
  [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& keys) const override { return r_.advice(keys); }

 private:
  R& r_;
};

/// The life of a run (see file comment).
class Run {
 public:
  /// What the Trainer tells a run about itself.
  struct Setup {
    RunConfig run;                 ///< the `run` section
    std::string program;           ///< the program's name, for logs
    std::string algorithm;         ///< the algorithm's config section ("sac"): names, TensorBoard prefix
    std::string precision;         ///< "fp32", ...
    std::string env_name;
    std::int64_t num_envs = 1;     ///< envs of this rank
    std::string device;
    std::string config_hash, config_yaml;
    std::vector<std::pair<std::string, std::string>> config;  ///< every field, flattened
    std::vector<std::string> notes;  ///< said once when the run starts
    /// Where the run comes from (observe/provenance.hpp): env, policy types, versions,
    /// command line, host, git commit. In config.yaml, summary.json and TensorBoard.
    std::vector<std::pair<std::string, std::string>> provenance;
  };
  /// The parts the Trainer owns and the run uses; they outlive it.
  struct Parts {
    Clock* clock = nullptr;
    Ranks* ranks = nullptr;
    PhaseTimes* times = nullptr;
    StepCollector* collector = nullptr;
    UpdateMetrics* metrics = nullptr;
    const StateSections* state = nullptr;         ///< the run's state (checkpoints, rank sync)
    const StateSections* buffer_state = nullptr;  ///< the buffer's (its file beside a checkpoint)
    LoopControl* loop = nullptr;
    Evaluation* evaluation = nullptr;
    /// Runs an evaluation of `n` episodes with the policy (its average when one is kept).
    std::function<EvalResult(int n)> evaluate;
    /// Writes the policy alone (policy.bin); empty when the algorithm has no policy file.
    std::function<void(const std::filesystem::path&)> save_policy;
    MetricsLog::Sources log_sources;  ///< filled in by the run but for the algorithm's functions
  };

  /// The format tag of the state rank 0 sends the others.
  static constexpr const char* kRankStateFormat = "anvil Rank State v2";

  Run(Setup s, Parts p) : s_(std::move(s)), p_(std::move(p)) {
    checkpoints_ = Checkpoints(Checkpoints::Options{s_.run.run_dir.value, s_.run.keep_last, s_.run.checkpoint_buffer},
                               Checkpoints::Identity{s_.algorithm, s_.precision, s_.config_hash, s_.config},
                               *p_.state, *p_.buffer_state);
    if (!s_.run.run_dir->empty()) run_dir_ = *s_.run.run_dir;
    restart_schedules();
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Trains until the loop is done: iterations, with evaluations, log rows and checkpoints
  /// on the clock; then `finish`. A SIGINT or SIGTERM stops it after the iteration under
  /// way with a checkpoint, and it throws `Interrupted`; SIGUSR1 writes a checkpoint
  /// (train/signals.hpp). The last iteration's evaluation and row are `finish`'s, so a run
  /// writes one row per logged step.
  FitResult fit() {
    begin();
    auto& loop = *p_.loop;
    while (!loop.done()) {
      loop.iterate(quiet_until());
      if (loop.stage() != stage_) next_stage();
      const auto now = p_.clock->now();
      const bool last = loop.done();
      if (eval_every_.due(now) && !last) record_evaluation(evaluate(settings_.eval_episodes));
      if (log_every_.due(now) && !last) log();
      if (checkpoint_every_.due(now) && !last) checkpoint();
      if (const auto sig = signalled(); sig.any()) [[unlikely]] {
        if (sig.stop) stop(sig.stop);
        if (!last) checkpoint();
      }
      show_progress();
    }
    return finish();
  }

  /// Opens the run directory (config.yaml, training.log, metrics.csv, TensorBoard events),
  /// resumes when `run.resume` asks, and gives every rank rank 0's state.
  [[gnu::cold, gnu::noinline]] void begin() {
    handlers_.install();
    open_run_dir();
    resume_if_asked();
    sync_from_main();  // a resumed rank 0 hands its state to the others
    if (p_.ranks->world_size() > 1) {  // and whether its last row is written (log rows are collective)
      std::vector<double> v{p_.ranks->is_main() ? static_cast<double>(log_at_) : 0.0,
                            p_.ranks->is_main() ? static_cast<double>(logged_eval_at_) : 0.0};
      p_.ranks->sum(v);
      log_at_ = static_cast<std::int64_t>(v[0]);
      logged_eval_at_ = static_cast<std::int64_t>(v[1]);
    }
    first_step_ = p_.clock->env_steps;  // rates count what this process did
    first_update_ = p_.clock->updates;
    restart_schedules();
  }

  /// Ends the run: a last evaluation (unless one was recorded at this step), a last log row,
  /// a checkpoint, the timing verdict and summary.json.
  [[gnu::cold, gnu::noinline]] FitResult finish() {
    const auto now = p_.clock->now();
    // The time split and its verdict are about training: taken before the last evaluation,
    // and only when this process trained (not for a finished run resumed).
    const bool trained = p_.clock->env_steps > first_step_ || p_.clock->updates > first_update_;
    std::vector<std::string> lines;
    if (trained && p_.times->enabled) {
      lines.push_back("time: " + shares_line(*p_.times));
      if (auto v = bottleneck(*p_.times, advice()); !v.empty()) lines.push_back(std::move(v));
    }
    if (p_.evaluation->last_at() != now) record_evaluation(evaluate(settings_.eval_episodes));
    const FitResult r = close({}, lines);
    say(summary_line(r));
    say("logs: " + run_dir_.string() + " (training.log, metrics.csv, TensorBoard events, summary.json, config.yaml)");
    return r;
  }

  /// What the timing verdict suggests now (observe/timers.hpp): the loop's advice in this
  /// run's config keys, and, on a GPU where the run is in FP32 or TF32, BF16 precision
  /// (it pays there; on the CPU it measured 0.95x FP32's speed for these networks).
  [[nodiscard]] BottleneckAdvice advice() const {
    AdviceKeys keys;
    for (const auto& [key, value] : s_.config)
      if (key.starts_with(s_.algorithm + ".")) keys.algorithm.push_back(key);
    auto a = p_.loop->advice(keys);
    if (bf16_pays(s_.device, s_.precision))
      a.learn = loops::either(a.learn, "; ", "on a GPU, BF16 precision (Trainer<..., BF16>) speeds updates too");
    return a;
  }

  /// An evaluation of `episodes` episodes (all ranks together), not yet recorded.
  EvalResult evaluate(int episodes) { return p_.evaluate(episodes); }
  /// Makes `r` the latest evaluation (in the next log row, summary.json and the best so far).
  void record_evaluation(const EvalResult& r) {
    p_.evaluation->record(r, p_.clock->now());
    log_.write_evaluation(r, p_.clock->in(settings_.record_unit));
  }

  /// A row of metrics now (every rank must call it).
  [[gnu::cold, gnu::noinline]] void log() {
    ScopedPhase ph(*p_.times, Phase::log);
    p_.loop->at_log_row();
    log_at_ = p_.clock->now();
    logged_eval_at_ = p_.evaluation->last_at();
    auto row = log_.gather(elapsed(), first_step_, first_update_);
    if (!row) return;
    log_.write_csv(*row);
    progress_.row(progress_state());
    log_.write_rest(*row, [this](const std::string& line) { progress_.echo(line); });
  }

  /// A checkpoint at the current step (rank 0 writes it, after the ranks are found in sync),
  /// with policy.bin beside it; the oldest beyond `run.keep_last` go.
  [[gnu::cold, gnu::noinline]] void checkpoint() {
    check_in_sync();
    if (!p_.ranks->is_main()) return;
    ScopedPhase ph(*p_.times, Phase::checkpoint);
    try {
      checkpoints_.save_at(p_.clock->now());
      if (p_.save_policy) p_.save_policy(run_dir_ / "policy.bin");
    } catch (...) {
      // Caught to unwind the writers here (an uncaught error ends the program without
      // unwinding): a failed write (a full disk) leaves no partial .tmp file behind.
      throw;
    }
  }

  /// Writes everything a resumed run needs to continue exactly as this one would (every
  /// section of the run's state; with `run.checkpoint_buffer` the buffer beside it).
  [[gnu::cold, gnu::noinline]] void save_checkpoint(const std::filesystem::path& file) { checkpoints_.save(file); }

  /// Restores what `save_checkpoint` wrote; the checkpoint must come from the same
  /// algorithm, networks, buffer, envs and precision (the error names the first field that
  /// differs). Everything is read and checked before anything changes.
  [[gnu::cold, gnu::noinline]] void load_checkpoint(const std::filesystem::path& file) {
    apply_checkpoint(checkpoints_.read(file), file);
  }

  /// Rank 0's shared state on every rank: at construction (ranks seed their networks apart)
  /// and after rank 0 resumed.
  [[gnu::cold, gnu::noinline]] void sync_from_main() {
    auto& ranks = *p_.ranks;
    if (ranks.world_size() == 1) return;
    std::vector<std::uint8_t> bytes;
    if (ranks.is_main()) {
      auto w = BinaryWriter::in_memory(kRankStateFormat);
      p_.state->write(w, Scope::shared);
      bytes = w.take_bytes();
    }
    ranks.broadcast(bytes);
    if (ranks.is_main()) return;
    BinaryReader r(bytes, "rank 0's state", kRankStateFormat);
    auto apply = p_.state->read(r, Scope::shared);
    r.finish();
    apply();
    p_.loop->resumed();
  }

  /// Checks that every rank holds bitwise the same learned state as rank 0 (they apply the
  /// same averaged gradients, so they must); a DistributedError naming the ranks that differ.
  [[gnu::cold, gnu::noinline]] void check_in_sync() {
    auto& ranks = *p_.ranks;
    const int world = ranks.world_size();
    if (world == 1) return;
    auto w = BinaryWriter::in_memory(kRankStateFormat);
    p_.state->write(w, Scope::checked);
    const auto bytes = w.take_bytes();
    detail::Crc32c crc;
    crc.update(bytes.data(), bytes.size());
    std::vector<at::Tensor> mine{at::full({1}, static_cast<std::int64_t>(crc.value()), at::kLong).to(ranks.device())};
    ranks.broadcast(mine);
    const auto main_crc = static_cast<std::uint32_t>(mine[0].item<std::int64_t>());
    std::vector<double> differs(static_cast<std::size_t>(world), 0.0);
    if (main_crc != crc.value()) differs[static_cast<std::size_t>(ranks.rank())] = 1.0;
    ranks.sum(differs);
    std::string bad;
    for (int r = 0; r < world; ++r)
      if (differs[static_cast<std::size_t>(r)] > 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    if (!bad.empty())
      throw DistributedError("rank " + std::to_string(ranks.rank()) + ": ranks out of sync at " +
                             std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now()) +
                             ": the learned state of rank(s) " + bad + " differs from rank 0's");
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", main_crc);
    sync_line_ = "ranks in sync: all " + std::to_string(world) +
                 " ranks hold bitwise-identical parameters and optimizer state (crc32c " + hex + ", " +
                 std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now()) + ")";
  }

  /// A message for the user: on the terminal and in training.log (rank 0).
  [[gnu::cold, gnu::noinline]] void say(const std::string& m) {
    if (!p_.ranks->is_main()) return;
    progress_.say(m);
    log_.note(m);
  }

  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_dir_; }
  [[nodiscard]] const std::filesystem::path& resumed_from() const noexcept { return resumed_from_; }
  /// The run's config hash (its fields and its policy types), as config.yaml and summary.json give it.
  [[nodiscard]] const std::string& config_hash() const noexcept { return s_.config_hash; }
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return s_.notes; }
  /// The phase timers' own share of the run so far (see `Trainer::timer_overhead`).
  [[nodiscard]] double timer_overhead() const {
    const double wall = elapsed();
    return wall > 0 ? timer_cost_ * static_cast<double>(p_.times->calls()) / wall : 0.0;
  }
  /// Seconds since the run began (`begin`).
  [[nodiscard]] double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  FitResult result(std::string stopped_by = {}) const {
    FitResult r;
    r.env_steps = p_.clock->env_steps;
    r.updates = p_.clock->updates;
    r.wall_seconds = elapsed();
    r.final_eval_return = p_.evaluation->last().mean;
    r.best_eval_return = p_.evaluation->best();
    r.stopped_by = std::move(stopped_by);
    return r;
  }

  // The signals every rank has agreed on (train/signals.hpp). One process reads its flags
  // after each iteration; ranks add theirs up every `poll_every_` iterations, which rank 0
  // sets to about 50 ms of iterations, so they all stop at the same step.
  struct Signalled {
    int stop = 0;             // SIGINT or SIGTERM
    bool checkpoint = false;  // SIGUSR1
    [[nodiscard]] bool any() const noexcept { return stop != 0 || checkpoint; }
  };
  Signalled signalled() {
    auto& ranks = *p_.ranks;
    if (ranks.world_size() == 1) return {signals::stop_requested(), signals::take_checkpoint_request()};
    if (++since_poll_ < poll_every_) return {};
    const int mine = signals::stop_requested();
    std::vector<double> v{mine == SIGINT ? 1.0 : 0.0, mine == SIGTERM ? 1.0 : 0.0,
                          signals::take_checkpoint_request() ? 1.0 : 0.0, 0.0};
    if (ranks.is_main()) {  // the next poll's distance: about 50 ms of iterations
      const double now = elapsed(), per = (now - polled_at_) / static_cast<double>(since_poll_);
      v[3] = per > 0 ? std::clamp(0.05 / per, 1.0, 10'000.0) : 1.0;
      polled_at_ = now;
    }
    since_poll_ = 0;
    ranks.sum(v);
    poll_every_ = std::max<std::int64_t>(1, static_cast<std::int64_t>(v[3]));
    return {v[1] > 0 ? SIGTERM : v[0] > 0 ? SIGINT : 0, v[2] > 0};
  }

  // Stops on `sig` after the iteration under way: the step in flight lands (async envs), a
  // log row, a checkpoint (with the buffer when run.checkpoint_buffer) and summary.json are
  // written, and `Interrupted` is thrown (exit 128 + sig). Every rank comes here at the
  // same step; rank 0 writes.
  [[gnu::cold, gnu::noinline, noreturn]] void stop(int sig) {
    if (p_.collector->in_flight()) p_.loop->iterate(p_.clock->now());  // lands it, launches none
    const auto name = signals::name(sig);
    const std::string at = std::string(step_name(p_.clock->unit)) + " " + std::to_string(p_.clock->now());
    say("stopping on " + name + " at " + at + ": writing a checkpoint (a second " + name + " exits at once)");
    close("stopped by " + name);
    throw Interrupted(sig, "by " + name + " at " + at + "; checkpoint written in " + run_dir_.string() +
                               " (continue with --run_dir=" + run_dir_.string() + " --resume=auto)");
  }

  // The one end of a run, finished or stopped (`stopped_by`, empty when finished): the row
  // of this step (never a second one: an evaluation made as the run ends goes into the row
  // already there), a checkpoint (with the ranks' in-sync check, said), `lines` said, the
  // files flushed, summary.json, and the run directory released.
  [[gnu::cold, gnu::noinline]] FitResult close(std::string stopped_by, const std::vector<std::string>& lines = {}) {
    const auto now = p_.clock->now();
    if (log_at_ != now) {
      log();
    } else if (logged_eval_at_ != p_.evaluation->last_at()) {
      log_.amend_evaluation(*p_.clock);
      logged_eval_at_ = p_.evaluation->last_at();
    }
    checkpoint();
    if (p_.ranks->world_size() > 1) say(sync_line_);  // what the checkpoint's in-sync check found
    for (const auto& l : lines) say(l);
    log_.flush();
    progress_.finish();
    handlers_.restore();
    const FitResult r = result(std::move(stopped_by));
    log_.write_summary(r, first_step_, first_update_, timer_overhead(), s_.config_hash, s_.config, s_.provenance);
    lock_ = RunDirLock();  // the run is over: another may use the directory (with --resume)
    return r;
  }

  // The clock value before which no hook fires (a loop leaves nothing in flight there).
  std::int64_t quiet_until() const {
    return std::min({eval_every_.next(), log_every_.next(), checkpoint_every_.next()});
  }

  // The hooks' schedules from where the clock stands, in the current stage's unit.
  [[gnu::cold, gnu::noinline]] void restart_schedules() {
    settings_ = p_.loop->settings();
    stage_ = p_.loop->stage();
    const auto now = p_.clock->now();
    eval_every_ = Every(settings_.eval_interval);
    log_every_ = Every(s_.run.log_interval);
    checkpoint_every_ = Every(s_.run.checkpoint_interval);
    for (auto* e : {&eval_every_, &log_every_, &checkpoint_every_}) e->start(now);
  }

  // A stage of a Staged loop has ended: an evaluation, a row and a checkpoint mark its end,
  // then the hooks follow the next stage's schedule and unit.
  [[gnu::cold, gnu::noinline]] void next_stage() {
    const auto ended = settings_;
    record_evaluation(evaluate(ended.eval_episodes));
    log();
    checkpoint();
    restart_schedules();
    log_.set_advice(advice());
    say("stage " + std::to_string(stage_) + " begins: " + std::to_string(settings_.steps) + " " +
        std::string(unit_name(settings_.unit)));
  }

  ProgressState progress_state() const {
    return ProgressState{p_.clock->in(settings_.unit) - settings_.origin,
                         settings_.steps,
                         p_.clock->updates,
                         elapsed(),
                         p_.collector->episodes().recent_mean(10),
                         p_.evaluation->last().mean,
                         log_.gpu_line()};
  }
  void show_progress() {
    if (p_.ranks->is_main()) progress_.iteration(progress_state());
  }

  // Rank 0 takes the run directory: a fresh one (runs/<algorithm>-<env>-seed<N>-<time>), or
  // run.run_dir, locked for the run's life (a second run there is refused) and refused when
  // it holds a run and run.resume is not set. A checkpoint to resume from is read and
  // checked here, before a file of the directory is written: a refused resume changes
  // nothing. Then config.yaml, training.log, metrics.csv and TensorBoard's file.
  [[gnu::cold, gnu::noinline]] void open_run_dir() {
    start_ = std::chrono::steady_clock::now();
    const bool main = p_.ranks->is_main();
    if (main) {
      const std::string& resume = s_.run.resume;
      if (resume == "auto" && s_.run.run_dir->empty())
        throw ConfigError("run.resume=auto looks for the latest checkpoint in run.run_dir, which is not set");
      // A resumed run without run.run_dir continues in its checkpoint's directory.
      if (!s_.run.run_dir->empty() || !resume.empty()) {
        run_dir_ = !s_.run.run_dir->empty() ? std::filesystem::path(*s_.run.run_dir)
                                            : std::filesystem::absolute(resume).parent_path();
        std::error_code ec;
        std::filesystem::create_directories(run_dir_, ec);
        if (ec) throw Error("run.run_dir: cannot create '" + run_dir_.string() + "': " + ec.message());
      } else {
        run_dir_ = fresh_run_dir("runs", s_.algorithm + "-" + s_.env_name + "-seed" + std::to_string(*s_.run.seed));
      }
      lock_ = RunDirLock(run_dir_);
      checkpoints_.set_dir(run_dir_);
      if (resume.empty() && holds_a_run(run_dir_))
        throw ConfigError("run.run_dir: '" + run_dir_.string() +
                          "' already holds a run; use --resume=auto to continue it, or another directory");
      if (!resume.empty()) {
        resume_file_ = checkpoints_.resolve(resume);
        if (!resume_file_.empty()) resume_apply_ = checkpoints_.read(resume_file_);  // all checks, nothing changed
      }
      std::string header = "# " + s_.program + ", config hash " + s_.config_hash + "\n";
      for (const auto& [k, v] : s_.provenance) header += "# " + k + ": " + v + "\n";
      write_file_atomic(run_dir_ / "config.yaml", header + s_.config_yaml);
    }
    // Every rank takes part in log rows; rank 0 writes them.
    auto sources = p_.log_sources;
    sources.clock = p_.clock;
    sources.episodes = &p_.collector->episodes();
    sources.metrics = p_.metrics;
    sources.evaluation = p_.evaluation;
    sources.times = p_.times;
    sources.ranks = p_.ranks;
    log_ = MetricsLog(MetricsLog::Options{run_dir_, s_.algorithm, s_.run.tensorboard, s_.run.tensorboard_histograms,
                                          settings_.record_unit, advice()},
                      std::move(sources),
                      "==== " + timestamp_for_path() + " " + s_.program + ", config hash " + s_.config_hash +
                          "\n# resolved config\n" + s_.config_yaml + "# end of config\n");
    if (!main) return;
    log_.write_config_text(s_.config_yaml, s_.provenance, p_.clock->in(settings_.record_unit));
    s_.notes.push_back(log_.gpu_status());  // once, whether it found GPUs or not
    timer_cost_ = phase_timer_cost();
    progress_ = ProgressHook(s_.run.progress);
    say(s_.program + ": " + s_.algorithm + " on " + s_.env_name + ", " + std::to_string(s_.num_envs) + " env(s), device " +
        s_.device + ", " + std::to_string(settings_.steps) + " " +
        (settings_.unit == ClockUnit::env_steps ? "steps" : "gradient updates") + ", config hash " + s_.config_hash);
    for (const auto& n : s_.notes) say(n);
  }

  // run.resume: a path, or auto (the latest checkpoint in the run directory, if any). Rank
  // 0 reads it; the others take its state in `sync_from_main`.
  [[gnu::cold, gnu::noinline]] void resume_if_asked() {
    const std::string& what = s_.run.resume;
    if (what.empty() || !p_.ranks->is_main()) return;
    const auto file = resume_file_;
    if (file.empty()) {
      say("resume: no checkpoint in " + run_dir_.string() + "; starting afresh");
      return;
    }
    apply_checkpoint(std::exchange(resume_apply_, {}), file);
    if (log_.resume(*p_.clock)) {  // its row is written: not again (one row per logged step)
      log_at_ = p_.clock->now();
      logged_eval_at_ = p_.evaluation->last_at();
    }
    say("resumed from " + file.string() + " at " + std::string(step_name(p_.clock->unit)) + " " +
        std::to_string(p_.clock->now()));
  }

  void apply_checkpoint(const StateSections::Apply& apply, const std::filesystem::path& file) {
    apply();
    p_.collector->restored();
    p_.loop->resumed();
    resumed_from_ = file;
  }

  [[gnu::cold, gnu::noinline]] std::string summary_line(const FitResult& r) const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "done: %lld env steps, %lld updates in %.1f s (%.0f steps/s); eval return ",
                  static_cast<long long>(r.env_steps), static_cast<long long>(r.updates), r.wall_seconds,
                  static_cast<double>(r.env_steps - first_step_) / r.wall_seconds);
    return buf + metric_text(r.final_eval_return) + " (best " + metric_text(r.best_eval_return) + ")";
  }

  Setup s_;
  Parts p_;
  LoopSettings settings_;
  int stage_ = 0;
  Every eval_every_, log_every_, checkpoint_every_;
  Checkpoints checkpoints_;
  MetricsLog log_;
  ProgressHook progress_;
  std::filesystem::path run_dir_, resumed_from_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::int64_t first_step_ = 0, first_update_ = 0;  ///< the clock when this process began
  std::int64_t log_at_ = -1, logged_eval_at_ = -1;  ///< clock at the last log row, and of the eval in it
  std::string sync_line_;                           ///< what the last in-sync check found
  double timer_cost_ = 0;                           ///< seconds one ScopedPhase costs here
  std::int64_t since_poll_ = 0, poll_every_ = 16;   ///< iterations between the ranks' signal polls
  double polled_at_ = 0;                            ///< elapsed() at rank 0's last poll
  signals::Handlers handlers_;                      ///< SIGINT, SIGTERM, SIGUSR1 during the run
  RunDirLock lock_;                                 ///< rank 0's hold on the run directory
  std::filesystem::path resume_file_;               ///< the checkpoint run.resume names, read and checked
  StateSections::Apply resume_apply_;               ///< applies it
  detail::FlushAtExit flush_at_exit_{[this] { log_.flush(); }};  ///< exit_fast flushes the run's files
};

}  // namespace anvil
// ---- end <anvil/train/run.hpp> ----
// ---- begin <anvil/train/run_envs.hpp> ----
/// @file
/// The envs of a run, made from the env a Trainer was given (`envs::AnyEnv`): this rank's
/// training envs, normalised when the config asks (`normalize.obs`, `normalize.reward`),
/// and the maker of evaluation envs, which normalise observations with the training
/// statistics, frozen. Not a template: compiled once, whatever the env.

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>


namespace anvil {

/// A run's envs (see file comment).
struct RunEnvs {
  std::unique_ptr<envs::VecEnvBase> training;
  std::shared_ptr<envs::NormalizeState> normalizer;  ///< null when the run does not normalise
  Evaluation::MakeEnvs evaluation;
  std::vector<std::string> notes;  ///< what the run should say about them
};

/// Rank `rank` of `world_size`'s envs: env i of rank r is env r * num_envs + i of the run
/// (envs with tasks are spread over them by it); seeds from `seed`.
inline RunEnvs make_run_envs(const envs::AnyEnv& env, const envs::VecEnvConfig& ecfg, const envs::NormalizeConfig& ncfg,
                             std::uint64_t seed, int rank, int world_size) {
  RunEnvs r;
  const std::int64_t n = ecfg.num_envs;
  r.training = envs::make_vec_env(env, ecfg, seed, rank * n, world_size * n);
  if (ncfg.obs && r.training->spec().agents.multi_agent())
    throw ConfigError("normalize.obs: " + r.training->spec().name +
                      " is a multi-agent env whose observation rows hold the agents' action masks and a first-step "
                      "flag, which normalising would break; normalise inside the env's observations instead "
                      "(normalize.reward is fine)");
  if (ncfg.obs || ncfg.reward) {
    // The return's discount is the algorithm's, which the loop gives the envs (or normalize.gamma).
    auto wrapped = std::make_unique<envs::NormalizedVecEnv>(std::move(r.training), ncfg, NAN);
    r.normalizer = wrapped->state();
    r.training = std::move(wrapped);
  }
  if (!r.training->saves_state())
    r.notes.push_back("checkpoints: " + r.training->spec().name +
                      " is not trivially copyable, so checkpoints hold no env state (a resumed run starts new episodes)");
  r.evaluation = [env, norm = r.normalizer, ncfg, ecfg](int count_here, std::uint64_t s, int first, int count) {
    envs::VecEnvConfig c = ecfg;  // the same env (tasks included), count_here of them, stepped here
    c.num_envs = count_here;
    c.threads = 1;
    c.mode = envs::VecMode::sync;
    auto v = envs::make_vec_env(env, c, s, first, count);
    if (!norm) return v;
    return std::unique_ptr<envs::VecEnvBase>(
        std::make_unique<envs::NormalizedVecEnv>(std::move(v), ncfg, 0.99, norm, /*frozen=*/true));
  };
  return r;
}

}  // namespace anvil
// ---- end <anvil/train/run_envs.hpp> ----
// ---- begin <anvil/train/trainer_parts.hpp> ----
/// @file
/// What the Trainer (train/trainer.hpp) builds from its config that does not depend on its
/// policy types, so the host itself stays short and these are compiled once: the run's
/// context, the step context's options, the update threads, the policy file's parts from
/// the envs and the normaliser, and the run's description (`Run::Setup`) with its
/// provenance. Not templates, but for the provenance's list of policy types.

#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace anvil {

/// The run's context on `device` for this rank of `world_size`: the seed, and the loop's
/// learning-rate scaling and micro-batches. Refuses a precision that needs a GPU without one.
inline RunContext run_context(c10::Device device, std::uint64_t seed, int rank, int world_size,
                              const LoopSettings& loop, const PrecisionSettings& precision) {
  if (precision.needs_cuda && !device.is_cuda()) {
    std::string name(precision.name);
    for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    throw DeviceError(name + " autocast needs a CUDA device; use BF16 on CPU (run.device is " + device.str() + ")");
  }
  RunContext ctx;
  ctx.device = device;
  ctx.seed = seed;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.lr_scaling = loop.lr_scaling;
  ctx.base_batch = loop.base_batch;
  ctx.micro_batches = loop.grad_accumulation;
  return ctx;
}

/// `run.update_threads`, with 0 resolved: SAC's update has two independent parts, so two
/// threads when this process has two cores to itself (measured 1.2-1.5x faster updates).
/// Cores it may use, not the machine's (on one core a second thread only spins), shared by
/// the `ranks_here` ranks on this node (LOCAL_WORLD_SIZE), not by the whole world.
inline int update_threads(int configured, int ranks_here) {
  if (configured > 0) return configured;
  return std::clamp(detail::available_cores() / std::max(1, ranks_here), 1, 2);
}

/// The step context's options for the run: autocast and loss scaling by the precision,
/// `threads` for an update's parts, micro-batches, the phase timers (on with `run.timings`,
/// waiting for the GPU with `run.sync_timings`), and the ranks' gradient all-reduce.
inline StepContext::Options step_options(const RunContext& ctx, const PrecisionSettings& precision, int threads,
                                         const RunConfig& run, PhaseTimes& times,
                                         std::function<void(std::vector<at::Tensor>&)> all_reduce_mean) {
  StepContext::Options so;
  so.device = ctx.device;
  so.autocast = precision.autocast;
  so.autocast_dtype = precision.compute_dtype;
  so.threads = threads;
  so.micro_batches = ctx.micro_batches;
  so.times = &times;
  so.loss_scaling = precision.loss_scaling;
  times.enabled = run.timings;
  if (ctx.device.is_cuda() && run.sync_timings) times.sync = [] { torch::cuda::synchronize(); };
  if (ctx.world_size > 1) so.all_reduce_mean = std::move(all_reduce_mean);
  return so;
}

/// What a policy file holds besides the network: the env's name and action bounds, and with
/// `normalize.obs` the observation normaliser's mean and inverse standard deviation (the
/// policy acts on observations normalised as in training) and its clip.
inline PolicyFileParts policy_file_parts(const StepCollector& collector, const envs::NormalizeState* norm,
                                         const envs::NormalizeConfig& ncfg) {
  PolicyFileParts parts{collector.spec().name, collector.action_scale(), collector.action_offset(), {}, {}, 0};
  if (norm && ncfg.obs) {
    const auto& mean = norm->obs.mean();
    const auto var = norm->obs.variance();
    const auto d = collector.spec().obs_dim();
    parts.obs_mean = at::empty({d});
    parts.obs_inv_std = at::empty({d});
    for (std::int64_t j = 0; j < d; ++j) {
      parts.obs_mean[j] = mean[static_cast<std::size_t>(j)];
      parts.obs_inv_std[j] = 1.0 / std::sqrt(var[static_cast<std::size_t>(j)] + ncfg.epsilon);
    }
    parts.obs_clip = ncfg.clip_obs;
  }
  return parts;
}

/// The run's description for `Run`: its `run` section, names, config (hash, YAML, every
/// field), what it says when it starts (`world` first, after a warning when built without
/// optimisation, then `notes`) and the provenance: the env, `policy_types` (slot and type
/// name), versions, command line, host and start time. `program` empty: the executable's name.
inline Run::Setup run_setup(const RunConfig& run, std::string program, std::string algorithm, std::string precision,
                            const StepCollector& collector, c10::Device device, std::string config_hash,
                            std::string config_yaml, std::vector<std::pair<std::string, std::string>> config,
                            std::string world, std::vector<std::string> notes,
                            const std::vector<std::pair<std::string, std::string>>& policy_types) {
  Run::Setup s;
  s.run = run;
  s.program = program.empty() ? std::string(program_invocation_short_name) : std::move(program);
  s.algorithm = std::move(algorithm);
  s.precision = std::move(precision);
  s.env_name = collector.spec().name;
  s.num_envs = collector.num_envs();
  s.device = device.str();
  s.config_hash = std::move(config_hash);
  s.config_yaml = std::move(config_yaml);
  s.config = std::move(config);
  s.notes = std::move(notes);
  s.notes.insert(s.notes.begin(), std::move(world));
  if (!compiled_optimised())
    s.notes.insert(s.notes.begin(), "warning: this program was compiled without optimisation, so it trains about 2x "
                                    "slower; build it with -DCMAKE_BUILD_TYPE=Release (or -O2)");
  s.provenance = {{"env", collector.spec().name}};
  s.provenance.insert(s.provenance.end(), policy_types.begin(), policy_types.end());
  s.provenance.insert(s.provenance.end(), {{"anvil", std::string(kVersion)},
                                           {"libtorch", compat::torch_version_string()},
                                           {"git_commit", program_git_commit()},
                                           {"command", command_line()},
                                           {"host", host_name()},
                                           {"started", utc_now()}});
  return s;
}

}  // namespace anvil
// ---- end <anvil/train/trainer_parts.hpp> ----
// ---- begin <anvil/train/trainer_select.hpp> ----
/// @file
/// `anvil::Trainer<A, B, P, X[, L]>`, the name users write: the `BasicTrainer` (train/trainer.hpp)
/// of a valid combination of policies, or, for one that cannot work, a stand-in that leaves
/// the compiler one sentence to say (the rules' `static_assert`s, core/concepts.hpp); and the
/// loop an algorithm trains in by default.

#include <concepts>
#include <type_traits>


namespace anvil {

/// The loop an algorithm trains in: the one it names (`using loop = ...`), else the one its
/// data regime calls for (on-policy: `OnPolicyLoop`; off-policy: `OffPolicyLoop`).
template <class A>
struct default_loop {
  using type = std::conditional_t<detail::on_policy_of<A>(), OnPolicyLoop, OffPolicyLoop>;
};
template <NamesItsLoop A>
struct default_loop<A> {
  using type = typename A::loop;
};
template <class A>
using default_loop_t = typename default_loop<A>::type;

template <class A, class B, class P, class X, class L = default_loop_t<A>>
class BasicTrainer;  // train/trainer.hpp

namespace detail {

/// Stands in for the Trainer of a rejected combination, so that after the one sentence
/// from the rules the compiler has nothing else to complain about.
struct RejectedTrainer {
  struct Config {};
  using Parallelism = SingleDevice;
  template <class... T>
  explicit RejectedTrainer(T&&...) {}
  template <class... T>
  FitResult fit(T&&...) {
    return {};
  }
  template <class... T>
  void collect(T&&...) {}
  template <class... T>
  void update(T&&...) {}
  template <class... T>
  EvalResult evaluate(T&&...) {
    return {};
  }
};

template <class A, class B, class P, class X, class L>
struct TrainerSelect {
  static constexpr bool rules_ok = TrainerRules<A, B, P, X>::ok;
  static constexpr bool loop_ok() {
    if constexpr (rules_ok) {
      static_assert(Loop<L>,
                    "Trainer's fifth argument is not a Loop: a loop declares `using policy_kind = anvil::LoopKind;`; "
                    "use OffPolicyLoop, OnPolicyLoop, OfflineLoop or Staged<...>");
      if constexpr (Loop<L>) return L::template Rules<A, B>::ok;
      else return false;
    } else {
      return false;
    }
  }
  using type = std::conditional_t<loop_ok(), BasicTrainer<A, B, P, X, L>, RejectedTrainer>;
};

}  // namespace detail

/// The Trainer for Algorithm `A` learning from Buffer `B`, run by Parallelism `P` in
/// Precision `X`, in loop `L` (by default the one the algorithm's data regime calls for):
/// `Trainer<SAC, UniformBuffer>`, `Trainer<SAC, PrioritizedBuffer, DDP<4>, BF16>`,
/// `Trainer<SAC, UniformBuffer, SingleDevice, FP32, Staged<OfflineLoop, OffPolicyLoop>>`
/// (the loops beyond the default two have headers of their own: train/loops/).
/// A combination that cannot work fails to compile with one sentence saying what to use.
template <class A, class B, class P = SingleDevice, class X = FP32, class L = default_loop_t<A>>
using Trainer = typename detail::TrainerSelect<A, B, P, X, L>::type;

}  // namespace anvil
// ---- end <anvil/train/trainer_select.hpp> ----

namespace anvil {

/// The Trainer for a valid combination of policies (see `Trainer`).
/// @tparam A an `Algorithm` (SAC, PPO, ...)
/// @tparam B a `Buffer` the algorithm learns from (UniformBuffer, ...)
/// @tparam P a `Parallelism` policy (SingleDevice, DDP<N>)
/// @tparam X a `Precision` policy (FP32, TF32, BF16, FP16)
/// @tparam L a `Loop` (default: the one the algorithm's data regime calls for)
template <class A, class B, class P, class X, class L>
class BasicTrainer {
 public:
  using Algorithm = A;
  using Buffer = B;
  using Parallelism = P;
  using Precision = X;
  using Loop = L;
  using Runner = typename L::template Runner<A, B>;

  /// Every knob of a run, one section per policy; keys are `<section>.<field>`.
  using Config = TrainerConfig<A, B, P, X, L>;
  static_assert(light_configs_match<A, B, P, X, L>,
                "policy_config<T> names another config than T::Config: a light header's specialisation is stale");

  /// Builds the run on `env` (any `envs::Env` type, or envs that come batched: see
  /// envs/any_env.hpp) from a typed config (validated here; throws ConfigError). With DDP<N>
  /// the process must be a rank: `anvil::start` launches them.
  BasicTrainer(const envs::AnyEnv& env, Config cfg, std::string program = {}) : cfg_(validated(std::move(cfg))) {
    parallel_ = std::make_unique<P>(*cfg_.parallel);
    const auto device = resolve_device(cfg_.run->device, parallel_->device_index());
    parallel_->connect(device);
    const PrecisionSettings precision = X::settings(*cfg_.precision);
    ctx_ = run_context(device, cfg_.run->seed, parallel_->rank(), parallel_->world_size(), L::settings(*cfg_.train), precision);
    ranks_ = Ranks(*parallel_, ctx_.device);
    auto notes = apply_process_settings(cfg_.run->threads, precision, ctx_, threads());
    auto envs = make_run_envs(env, *cfg_.env, *cfg_.normalize, ctx_.seed_for(Stream::env), ctx_.rank, ctx_.world_size);
    norm_ = envs.normalizer;
    notes.insert(notes.end(), envs.notes.begin(), envs.notes.end());
    collector_ = std::make_unique<StepCollector>(std::move(envs.training), times_);
    collector_->count_steps_from(&clock_.env_steps);
    algo_ = std::make_unique<A>(collector_->spec(), *cfg_.algorithm, ctx_);
    buffer_ = std::make_unique<B>(collector_->spec(), *cfg_.buffer, ctx_);
    step_ctx_ = StepContext(step_options(ctx_, precision, threads(), *cfg_.run, times_,
                                         [p = parallel_.get()](std::vector<at::Tensor>& g) { p->all_reduce_mean(g); }));
    runner_ = std::make_unique<Runner>(
        *cfg_.train, LoopParts<A, B>{*algo_, *buffer_, step_ctx_, *collector_, clock_, ranks_, times_, metrics_});
    runner_->begin();
    control_ = std::make_unique<LoopControlOf<Runner>>(*runner_);
    evaluation_ = Evaluation(std::move(envs.evaluation), ctx_.seed_for(Stream::eval_env), ranks_, &times_,
                             collector_->groups(), collector_->envs().reports_success());
    torch_rng_ = TorchGenerators(ctx_.device);
    add_sections();
    run_ = std::make_unique<Run>(setup(std::move(program), std::move(notes)), parts());
    run_->sync_from_main();  // every rank starts from rank 0's networks and optimizer state
  }

  BasicTrainer(const BasicTrainer&) = delete;
  BasicTrainer& operator=(const BasicTrainer&) = delete;

  /// Trains until the loop is done (`train.steps`): iterations, with evaluations, log rows
  /// and checkpoints on the clock. The same as `begin()`, the loop, then `finish()`.
  FitResult fit() { return run_->fit(); }
  /// For a main that runs its own loop: opens the run directory, resumes when `run.resume`
  /// asks, and gives every rank rank 0's state. Call it once before collecting.
  void begin() { run_->begin(); }
  /// Ends a run begun with `begin()`: a last evaluation, log row and checkpoint, the timing
  /// verdict and summary.json.
  FitResult finish() { return run_->finish(); }
  /// A row of metrics now (with several ranks, every rank must call it).
  void log() { run_->log(); }
  /// Mean return of `episodes` deterministic episodes (of the average policy with `train.ema_decay`).
  EvalResult evaluate(int episodes) { return run_->evaluate(episodes); }
  /// The latest recorded evaluation (with each task's return and success rate where there are).
  [[nodiscard]] const EvalResult& last_evaluation() const noexcept { return evaluation_.last(); }
  /// Makes `r` the run's latest evaluation (in the next log row, summary.json, the best).
  void record_evaluation(const EvalResult& r) { run_->record_evaluation(r); }

  /// Steps the envs until at least `n` more env steps are stored (a step loop).
  void collect(std::int64_t n) requires StepwiseLoop<Runner> { runner_->collect(n); }
  /// `n` gradient updates, each on a fresh batch (a step loop).
  void update(int n) requires StepwiseLoop<Runner> { runner_->update(n); }

  /// Writes every state section a resumed run needs (and the buffer with `run.checkpoint_buffer`). Atomic.
  void save_checkpoint(const std::filesystem::path& file) { run_->save_checkpoint(file); }
  /// Restores what `save_checkpoint` wrote (all or nothing; the error names what differs).
  void load_checkpoint(const std::filesystem::path& file) { run_->load_checkpoint(file); }

  /// Writes the policy alone (`anvil::load_policy` reads it back without a trainer): the
  /// averaged weights when `train.ema_decay` is on, the env's action bounds, and the
  /// observation normaliser's statistics with `normalize.obs`. Atomic.
  void save_policy(const std::filesystem::path& file) const
    requires ExportsPolicy<A>
  {
    write_policy(file, policy_file_parts(*collector_, norm_.get(), *cfg_.normalize),
                 [this](BinaryWriter& w) { algo_->save_policy(w); });
  }

  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  /// The run's config hash: its fields and its policy types (FP32 and TF32 runs differ).
  [[nodiscard]] const std::string& config_hash() const noexcept { return run_->config_hash(); }
  [[nodiscard]] A& algorithm() noexcept { return *algo_; }
  [[nodiscard]] B& buffer() noexcept { return *buffer_; }
  [[nodiscard]] P& parallelism() noexcept { return *parallel_; }
  /// The loop's runner (e.g. `loop().collect_rollout()` for an on-policy custom main).
  [[nodiscard]] Runner& loop() noexcept { return *runner_; }
  [[nodiscard]] StepCollector& collector() noexcept { return *collector_; }
  [[nodiscard]] const RunContext& context() const noexcept { return ctx_; }
  /// The step context the algorithm's updates go through (its loss scaler under FP16).
  [[nodiscard]] StepContext& step_context() noexcept { return step_ctx_; }
  [[nodiscard]] const Clock& clock() const noexcept { return clock_; }
  [[nodiscard]] std::int64_t env_steps() const noexcept { return clock_.env_steps; }
  [[nodiscard]] std::int64_t updates() const noexcept { return clock_.updates; }
  [[nodiscard]] const PhaseTimes& times() const noexcept { return times_; }
  /// The names of the sections of this run's state (what a checkpoint holds).
  [[nodiscard]] std::vector<std::string> state_sections() const { return state_.names(); }
  /// The observations' and returns' running statistics (null when the run does not normalise).
  [[nodiscard]] const envs::NormalizeState* normalizer() const noexcept { return norm_.get(); }
  /// Returns of the most recent training episodes (up to 100).
  [[nodiscard]] const std::deque<double>& recent_returns() const noexcept { return collector_->episodes().recent(); }
  [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_->run_dir(); }
  /// The phase timers' own share of the run so far (calls x cost of one / wall time).
  [[nodiscard]] double timer_overhead() const { return run_->timer_overhead(); }
  /// What the run says once when it starts (world, precision and BLAS settings), one line each.
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return run_->notes(); }
  /// The checkpoint this run continued from (empty when it started afresh).
  [[nodiscard]] const std::filesystem::path& resumed_from() const noexcept { return run_->resumed_from(); }
  /// What the run's timing verdict suggests for each kind of bound, in its config keys.
  [[nodiscard]] BottleneckAdvice advice() const { return run_->advice(); }

 private:
  // Threads for an update's independent parts (`run.update_threads`; 0: by the cores this
  // rank's node gives each of its ranks).
  int threads() const {
    if constexpr (KnowsLocalWorld<P>) return update_threads(cfg_.run->update_threads, parallel_->world().local_world_size);
    else return update_threads(cfg_.run->update_threads, parallel_->world_size());
  }

  // The run's state, in named sections (core/state.hpp): checkpoints hold them all; the
  // shared ones go from rank 0 to the others; the checked ones must be bitwise the same.
  void add_sections() {
    state_.add("clock", clock_, Scope::shared);
    state_.add("loop", *runner_, Scope::shared);
    state_.add(std::string(A::config_section.view()), *algo_, Scope::checked);
    state_.add("step_context", step_ctx_, Scope::checked);
    state_.add("evaluation", evaluation_, Scope::shared);
    if (norm_) state_.add("normalizer", *norm_, Scope::shared);
    state_.add("envs", collector_->envs());
    state_.add("episodes", collector_->episodes());
    state_.add("metrics", metrics_);
    state_.add("torch_rng", torch_rng_);
    // Demonstrations are read again from their file: only the loader's position is state,
    // and it belongs in every checkpoint.
    if constexpr (ReadsDemonstrations<B>) state_.add(std::string(B::config_section.view()), *buffer_);
    else buffer_state_.add(std::string(B::config_section.view()), *buffer_);
  }

  Run::Setup setup(std::string program, std::vector<std::string> notes) const {
    // The config hash covers the policy types too (TrainerConfig::hashed_types).
    return run_setup(*cfg_.run, std::move(program), std::string(A::config_section.view()), std::string(X::name),
                     *collector_, ctx_.device, config_hash_hex(cfg_), to_yaml(cfg_), flatten(cfg_),
                     "world: " + parallel_->describe(), std::move(notes),
                     {{"algorithm", std::string(type_name<A>())}, {"buffer", std::string(type_name<B>())},
                      {"parallelism", std::string(type_name<P>())}, {"precision", std::string(type_name<X>())},
                      {"loop", std::string(type_name<L>())}});
  }

  Run::Parts parts() {
    Run::Parts p{&clock_,  &ranks_,        &times_,        collector_.get(), &metrics_,
                 &state_, &buffer_state_, control_.get(), &evaluation_,     {}, {}, {}};
    p.evaluate = [this](int n) {
      auto act = [this](const at::Tensor& obs) { return collector_->to_env(algo_->act(obs, ActMode::deterministic)); };
      if constexpr (AveragesPolicy<A>)
        if (runner_->settings().ema_decay > 0)
          return algo_->with_ema_weights([&] { return evaluation_.run(act, n); });
      return evaluation_.run(act, n);
    };
    if constexpr (ExportsPolicy<A>) p.save_policy = [this](const std::filesystem::path& f) { save_policy(f); };
    if constexpr (ReportsLearningRates<A>) p.log_sources.learning_rates = [this] { return algo_->learning_rates(); };
    if constexpr (ExposesWeights<A>) p.log_sources.weights = [this] { return algo_->flat_parameters(); };
    return p;
  }

  Config cfg_;
  std::unique_ptr<P> parallel_;
  RunContext ctx_;
  Ranks ranks_;
  PhaseTimes times_;
  Clock clock_;
  std::unique_ptr<StepCollector> collector_;
  std::shared_ptr<envs::NormalizeState> norm_;  ///< normalisation statistics (normalize.obs/reward)
  std::unique_ptr<A> algo_;
  std::unique_ptr<B> buffer_;
  StepContext step_ctx_;
  UpdateMetrics metrics_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<LoopControl> control_;
  Evaluation evaluation_;
  TorchGenerators torch_rng_;
  StateSections state_, buffer_state_;
  std::unique_ptr<Run> run_;
};

}  // namespace anvil
// ---- end <anvil/train/trainer.hpp> ----

namespace anvil::compiled {

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::start_config(const Args& args, Config defaults) -> Config {
  return anvil::start<Full>(args, std::move(defaults));
}

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::Trainer(const envs::AnyEnv& env, Config cfg, std::string program)
    : impl_(std::make_unique<Full>(env, std::move(cfg), std::move(program))) {}

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::Trainer(Trainer&&) noexcept = default;

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::operator=(Trainer&&) noexcept -> Trainer& = default;

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::~Trainer() = default;

template <class A, class B, class P, class X, class L>
FitResult Trainer<A, B, P, X, L>::fit() {
  return impl_->fit();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::begin() {
  impl_->begin();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::collect(std::int64_t n) {
  if constexpr (StepwiseLoop<typename Full::Runner>) {
    impl_->collect(n);
  } else {
    (void)n;
    throw Error("collect: the " + std::string(L::name) + " loop does not step a given number of env steps; use fit()");
  }
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::update(int n) {
  if constexpr (StepwiseLoop<typename Full::Runner>) {
    impl_->update(n);
  } else {
    (void)n;
    throw Error("update: the " + std::string(L::name) + " loop does not take a given number of updates; use fit()");
  }
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::log() {
  impl_->log();
}

template <class A, class B, class P, class X, class L>
FitResult Trainer<A, B, P, X, L>::finish() {
  return impl_->finish();
}

template <class A, class B, class P, class X, class L>
EvalResult Trainer<A, B, P, X, L>::evaluate(int episodes) {
  return impl_->evaluate(episodes);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::record_evaluation(const EvalResult& r) {
  impl_->record_evaluation(r);
}

template <class A, class B, class P, class X, class L>
std::int64_t Trainer<A, B, P, X, L>::env_steps() const noexcept {
  return impl_->env_steps();
}

template <class A, class B, class P, class X, class L>
std::int64_t Trainer<A, B, P, X, L>::updates() const noexcept {
  return impl_->updates();
}

template <class A, class B, class P, class X, class L>
const EvalResult& Trainer<A, B, P, X, L>::last_evaluation() const noexcept {
  return impl_->last_evaluation();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::save_checkpoint(const std::filesystem::path& file) {
  impl_->save_checkpoint(file);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::load_checkpoint(const std::filesystem::path& file) {
  impl_->load_checkpoint(file);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::save_policy(const std::filesystem::path& file) const {
  if constexpr (ExportsPolicy<A>) {
    impl_->save_policy(file);
  } else {
    throw Error("save_policy: " + std::string(A::config_section.view()) +
                " writes no policy file of its own (anvil::ExportsPolicy); its checkpoints hold it");
  }
}

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::config() const noexcept -> const Config& {
  return impl_->config();
}

template <class A, class B, class P, class X, class L>
const std::filesystem::path& Trainer<A, B, P, X, L>::run_dir() const noexcept {
  return impl_->run_dir();
}

}  // namespace anvil::compiled

/// Builds `compiled::Trainer<A, B, P, X>` in this translation unit (every env goes through
/// `envs::AnyEnv`, so nothing is built per env).
#define ANVIL_COMPILED_TRAINER(A, B, P, X) template class ::anvil::compiled::Trainer<A, B, P, X>;
// ---- end <anvil/train/compiled_trainer_impl.hpp> ----
// ---- begin <anvil/train/loops/staged.hpp> ----
/// @file
/// `Staged<First, Second>`: one loop, then another, on the same algorithm and buffer, e.g.
/// `Staged<OfflineLoop, OffPolicyLoop>` learns from a dataset first and then goes on
/// online with what it learned (and with the dataset in its replay buffer). Each stage has
/// its own section under `train` (`train.offline.steps`, `train.off_policy.learning_starts`)
/// and its own unit: the clock counts updates in an offline stage and env steps in an
/// online one, and the hooks' intervals follow the stage that runs. TensorBoard records a
/// staged run by gradient updates, the one count that grows through every stage.
///
/// Checkpoints record the stage (the `loop` section), so a resumed run continues in the
/// stage it stopped in and does not run the first one again. Learning rates are scaled
/// once, when the algorithm is built, so both stages must agree on `lr_scaling` and
/// `base_batch`; micro-batches and the policy average follow each stage's settings.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>


namespace anvil {

/// Loop policy: `First`'s loop until its `steps`, then `Second`'s (see file comment).
template <Loop First, Loop Second>
struct Staged {
  static_assert(First::stage_name.view() != Second::stage_name.view(),
                "Staged<First, Second>: both stages are the same loop, whose config sections would clash; "
                "run one loop with more steps instead");

  using policy_kind = LoopKind;
  static constexpr std::string_view name = "staged";
  static constexpr FixedString config_section = "train";

  /// One section per stage, named after its loop (`train.offline`, `train.off_policy`, ...).
  struct Config {
    Section<First::stage_name, typename First::Config> first;
    Section<Second::stage_name, typename Second::Config> second;

    void validate() const {
      const auto a = First::settings(*first), b = Second::settings(*second);
      const std::string f(First::stage_name.view()), s(Second::stage_name.view());
      if (a.lr_scaling != b.lr_scaling)
        throw ConfigError("train." + s + ".lr_scaling differs from train." + f +
                          ".lr_scaling: learning rates are scaled once, when the algorithm is built");
      if (a.base_batch != b.base_batch)
        throw ConfigError("train." + s + ".base_batch differs from train." + f +
                          ".base_batch: learning rates are scaled once, when the algorithm is built");
    }
    void shrink() {
      first->shrink();
      second->shrink();
    }
  };

  /// The settings the run is built with: the first stage's.
  [[nodiscard]] static LoopSettings settings(const Config& c) {
    auto s = First::settings(*c.first);
    s.record_unit = ClockUnit::updates;
    return s;
  }

  /// Both stages' rules (the second's only once the first's hold: one sentence).
  template <class A, class B>
  struct Rules {
    static constexpr bool first_ok = First::template Rules<A, B>::ok;
    template <bool Check>
    static constexpr bool second_ok() {
      if constexpr (Check) return Second::template Rules<A, B>::ok;
      else return true;
    }
    static constexpr bool ok = first_ok && second_ok<first_ok>();
  };

  /// Runs the stages in turn (see file comment).
  template <class A, class B>
  class Runner {
    using FirstRunner = typename First::template Runner<A, B>;
    using SecondRunner = typename Second::template Runner<A, B>;

   public:
    Runner(const Config& cfg, LoopParts<A, B> parts)
        : first_(*cfg.first, parts), second_(*cfg.second, parts), step_(parts.step) {}

    [[nodiscard]] LoopSettings settings() const {
      auto s = stage_ == 0 ? first_.settings() : second_.settings();
      s.record_unit = ClockUnit::updates;
      return s;
    }
    [[nodiscard]] int stage() const noexcept { return stage_; }

    void begin() {
      stage_ == 0 ? first_.begin() : second_.begin();
      step_.set_micro_batches(settings().grad_accumulation);
    }
    void resumed() {
      stage_ == 0 ? first_.resumed() : second_.resumed();
      step_.set_micro_batches(settings().grad_accumulation);
    }
    [[nodiscard]] bool done() const noexcept { return stage_ == 1 && second_.done(); }

    /// An iteration of the stage that runs; when the first stage ends, the second begins.
    void iterate(std::int64_t quiet_until = INT64_MAX) {
      if (stage_ == 1) return second_.iterate(quiet_until);
      if (!first_.done()) first_.iterate(quiet_until);
      if (first_.done()) {
        stage_ = 1;
        begin();
      }
    }
    void at_log_row() { stage_ == 0 ? first_.at_log_row() : second_.at_log_row(); }
    /// The advice of the stage that runs, in its section's keys (`train.<stage>.*`).
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      AdviceKeys in = k;
      in.train = k.train + "." + std::string(stage_ == 0 ? First::stage_name.view() : Second::stage_name.view());
      return stage_ == 0 ? first_.advice(in) : second_.advice(in);
    }

    /// The stages' runners (e.g. for a custom main).
    [[nodiscard]] auto& first() noexcept { return first_; }
    [[nodiscard]] auto& second() noexcept { return second_; }

    /// State protocol: the stage, and each stage's own state.
    void save(BinaryWriter& w) const {
      w.value(stage_);
      first_.save(w);
      second_.save(w);
    }
    struct Saved {
      int stage = 0;
      decltype(std::declval<const FirstRunner&>().read(std::declval<BinaryReader&>())) first;
      decltype(std::declval<const SecondRunner&>().read(std::declval<BinaryReader&>())) second;
    };
    [[nodiscard]] Saved read(BinaryReader& r) const {
      const int stage = r.value<int>("stage");
      if (stage < 0 || stage > 1) r.fail("stage", "is " + std::to_string(stage) + "; a Staged run has stages 0 and 1");
      auto a = first_.read(r);
      auto b = second_.read(r);
      return Saved{stage, std::move(a), std::move(b)};
    }
    void restore(const Saved& s) {
      stage_ = s.stage;
      first_.restore(s.first);
      second_.restore(s.second);
    }

   private:
    FirstRunner first_;
    SecondRunner second_;
    StepContext& step_;
    int stage_ = 0;
  };
};

}  // namespace anvil
// ---- end <anvil/train/loops/staged.hpp> ----
// ---- end <anvil/anvil.hpp> ----
