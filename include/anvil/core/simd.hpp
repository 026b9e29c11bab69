#pragma once
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

/// *out = the sum of x[i]^2 over n floats, in double: eight running sums (element i goes to
/// sum i % 8), added at the end (a gradient's norm for clipping).
ANVIL_SIMD_KERNEL(sum_squares, (const float* __restrict x, std::int64_t n, double* __restrict out), (x, n, out), {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (; i < n; ++i) s[i % 8] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  *out = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
})

/// x *= f, n floats.
ANVIL_SIMD_KERNEL(scale, (float* __restrict x, std::int64_t n, float f), (x, n, f), {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= f;
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

/// While it lives, this thread's float arithmetic flushes denormal results to zero and reads
/// denormal inputs as zero (x86's FTZ and DAZ bits); the thread's own setting comes back
/// after. Adam's moments of a weight whose gradient has stopped (a dead unit) decay into the
/// denormal range, where every operation on them takes a microcode assist on Intel cores:
/// measured on an Intel Xeon, an Adam step over 200,000 such moments took 1,551 us against
/// 114 us (30% of the main job's time). The update of the weight is the same either way: a
/// denormal moment moves it by under 1e-33. A no-op elsewhere.
class FlushDenormals {
 public:
#if ANVIL_SIMD_X86
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
#else
  FlushDenormals() = default;
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
#if ANVIL_SIMD_X86
  static constexpr unsigned kFtzDaz = 0x8040;  // MXCSR: flush to zero (bit 15), denormals are zero (bit 6)
  unsigned saved_;
#endif
};

/// One Adam step over `n` floats (see ANVIL_ADAM_BODY), denormal moments flushed to zero
/// (FlushDenormals).
inline void adam(float* w, float* m, float* v, const float* g, std::int64_t n, float b1, float b2, float c1, float c2,
                 float decay, float sqrt_bc2, float eps, float step) {
  const FlushDenormals flush;
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
